//! What `cordon serve` is told when it starts, and the parts of it that
//! others take alone: the sandbox defaults and the jobs' directories.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use cordon_agent::AgentConfig;

use crate::job::Bounds;

/// Everything `cordon serve` can be told.
#[derive(Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// The certificate and key the API, web UI, live view, `/mcp` and
    /// every Lab's origin are served with; none: plain HTTP.
    pub tls: Option<cordon_listen::Tls>,
    /// Where `GET /metrics` (Prometheus) is served, without a token: an
    /// address on the cluster's own network. None: not served.
    pub metrics_listen: Option<SocketAddr>,
    /// `postgres://…`, `sqlite://PATH` or a path.
    pub db: String,
    /// Job workspaces live in `<data_dir>/jobs/<id>/`.
    pub data_dir: PathBuf,
    /// Where finished jobs' workspaces and logs go, for every process to
    /// serve (see [`crate::archive`]). None: they stay where they ran.
    pub archive: Option<crate::archive::ArchiveUrl>,
    /// What tenants' git tokens are sealed with in the database
    /// (`CORDON_SECRETS_KEY`). None: one derived from the cluster key, or
    /// else `<data_dir>/secrets.key`, made at the first start.
    pub secrets_key: Option<crate::store::SecretsKey>,
    /// Earlier keys (`CORDON_SECRETS_KEY_PREVIOUS`): what they sealed is
    /// still opened, and sealed again with the current key when read.
    pub previous_secrets_keys: Vec<crate::store::SecretsKey>,
    /// Whether this process serves the API (`cordon serve`); a worker
    /// alone (`cordon worker`) answers `/health` only.
    pub api: bool,
    /// This process's place in a deployment of many processes: the key
    /// they share and, for a worker, where API processes reach it. None:
    /// a job's files, live view and Lab are served only where it runs.
    pub cluster: Option<crate::cluster::Cluster>,
    /// Jobs run at once, in all; 0: none (an API-only process).
    pub workers: usize,
    /// How long a worker's claim on a job lasts unless renewed (it renews
    /// every sixth of it); a worker silent this long loses its jobs.
    pub lease: Duration,
    /// Times a job may be started: one whose worker died is queued again
    /// until it has been started this often, then failed.
    pub max_attempts: i64,
    /// Jobs run at once per tenant.
    pub per_tenant: i64,
    /// Bytes of stdout (and of stderr) kept per job.
    pub output_cap: usize,
    /// Largest request body accepted, but for file uploads.
    pub body_limit: usize,
    /// Largest file uploaded or downloaded through the files API.
    pub file_limit: usize,
    pub bounds: Bounds,
    /// The sandbox supervisor binary (default: the running executable).
    pub supervisor: Option<PathBuf>,
    /// The model for agent jobs and sessions; none refuses them.
    pub agent: Option<AgentDefaults>,
    /// MCP servers whose tools agent jobs and sessions get too (the
    /// operator's configuration): each job or session starts its own.
    pub mcp_servers: BTreeMap<String, cordon_mcp::ServerSpec>,
    /// A session's sandbox is closed after this long without a message.
    pub session_idle: Duration,
    /// How long a shutdown lets running jobs finish before cancelling
    /// them (`--grace`; 30 s by default).
    pub grace: Duration,
    /// Live sessions (API and MCP) at once, in all.
    pub sessions: usize,
    /// Live sessions (API and MCP) at once per tenant.
    pub sessions_per_tenant: usize,
    /// The isolation backend of every sandbox, unless a job asks for one.
    pub backend: cordon_sandbox::BackendKind,
    /// Git's, editors' and agents' control files read-only in every sandbox
    /// (`sandbox.protect_control_files`, see `cordon_sandbox::control_files`).
    pub protect_control_files: bool,
    /// `sandbox.cgroup_favordynmods` (see
    /// `cordon_sandbox::SandboxConfig::favor_cgroup_changes`).
    pub favor_cgroup_changes: bool,
    /// Workspace volumes kept mounted while unused (see
    /// `cordon_sandbox::volume`); past it, the least recently used are
    /// unmounted until next used. Volumes in use are not counted.
    pub idle_volumes: usize,
    /// Warm pools: sandboxes made ahead for the jobs of their shape.
    pub pool: Vec<PoolSpec>,
    /// microVM settings, for the microvm backend (its CPUs are in
    /// `bounds.defaults`).
    pub vm: cordon_sandbox::VmOptions,
    /// How long a finished job's workspace is kept; `None`: for ever. Its
    /// output, events, result and agent log are kept regardless.
    pub keep_workspaces: Option<Duration>,
    /// A job directory whose job is gone from the database is removed once
    /// it is this old: a job deleted through another process of a
    /// deployment leaves its files on the worker that ran it.
    pub orphans_after: Duration,
    /// What jobs and sessions may reach through the broker, at most.
    pub network: crate::network::NetworkCeilings,
    /// The images jobs and sessions may run in, and the default.
    pub images: crate::catalog::ImageCatalog,
    /// Where images are kept; `None`: the user's store (see
    /// `cordon_image::store::default_root`), where `cordon image pull` puts them.
    pub image_store: Option<PathBuf>,
    /// The environment presets are expanded with (`None`: this process's);
    /// nothing under `data_dir` is ever used.
    pub preset_env: Option<cordon_net::PresetEnv>,
    /// How often the host tools' configuration files are looked at (their
    /// metadata only); presets are expanded again when they changed.
    pub preset_check: Duration,
    /// Whether tenants may open previews of their sandboxes' ports (see
    /// the `preview` module); with them, a sandbox whose network is off has
    /// its loopback up for them (nothing leaves it).
    pub previews: bool,
    /// A wildcard domain whose names `{port}-{label}.{domain}` reach a
    /// port of a job's, session's or API sandbox's sandbox (the `hosts`
    /// module); none: previews are ports of this server's address.
    pub sandbox_domain: Option<crate::owner::SandboxDomain>,
}

/// [`ServerConfig::preset_check`] by default.
pub const PRESET_CHECK: Duration = Duration::from_secs(30);

/// [`ServerConfig::keep_workspaces`] by default.
pub const KEEP_WORKSPACES: Duration = Duration::from_secs(24 * 3600);

/// [`ServerConfig::orphans_after`] by default: far longer than a job's
/// directory is made before its record.
pub const ORPHANS_AFTER: Duration = Duration::from_secs(10 * 60);

impl ServerConfig {
    pub fn new(db: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            tls: None,
            metrics_listen: None,
            db: db.into(),
            data_dir: data_dir.into(),
            archive: None,
            secrets_key: None,
            previous_secrets_keys: Vec::new(),
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            api: true,
            cluster: None,
            per_tenant: 4,
            lease: Duration::from_secs(30),
            max_attempts: 1,
            output_cap: 1024 * 1024,
            body_limit: 1024 * 1024,
            file_limit: 16 * 1024 * 1024,
            bounds: Bounds::default(),
            supervisor: None,
            agent: None,
            mcp_servers: Default::default(),
            protect_control_files: true,
            favor_cgroup_changes: true,
            idle_volumes: cordon_sandbox::volume::KEEP_IDLE,
            pool: Vec::new(),
            session_idle: Duration::from_secs(15 * 60),
            grace: Duration::from_secs(30),
            sessions: 64,
            sessions_per_tenant: 8,
            backend: cordon_sandbox::BackendKind::Native,
            vm: cordon_sandbox::VmOptions::default(),
            keep_workspaces: Some(KEEP_WORKSPACES),
            orphans_after: ORPHANS_AFTER,
            network: Default::default(),
            images: Default::default(),
            image_store: None,
            preset_env: None,
            preset_check: PRESET_CHECK,
            previews: true,
            sandbox_domain: None,
        }
    }

    /// How this server is served: what a [`crate::owner::SandboxDomain`]
    /// assumes unless told.
    pub fn served(&self) -> crate::owner::Served {
        crate::owner::Served {
            scheme: if self.tls.is_some() { "https" } else { "http" },
            port: self.listen.port(),
        }
    }

    /// A sandbox over `workspace` with the server's defaults, its root
    /// made from `image` or else the host's.
    pub fn sandbox(
        &self,
        workspace: impl Into<PathBuf>,
        image: Option<cordon_sandbox::RootImage>,
    ) -> cordon_sandbox::SandboxConfig {
        self.sandboxes().sandbox(workspace, image)
    }

    /// What every sandbox gets unless its job or session says otherwise.
    pub fn sandboxes(&self) -> SandboxDefaults {
        SandboxDefaults {
            limits: cordon_sandbox::Limits {
                disk: Some(self.bounds.default_disk()),
                ..self.bounds.defaults
            },
            protect_control_files: self.protect_control_files,
            favor_cgroup_changes: self.favor_cgroup_changes,
            volumes: self.volumes(),
            supervisor: self.supervisor.clone(),
            backend: self.backend,
            vm: self.vm.clone(),
            previews: self.previews,
            domain: self.sandbox_domain.clone().map(|d| (d, self.served())),
        }
    }

    /// How this server's workspaces' volumes are used.
    pub fn volumes(&self) -> cordon_sandbox::volume::Volumes {
        cordon_sandbox::volume::Volumes::keeping(self.idle_volumes)
    }

    /// Enters the workspace at `root` (see `Volumes::enter`) off the async
    /// runtime; why not, as a message for the log.
    pub async fn enter_workspace(
        &self,
        root: &std::path::Path,
    ) -> Result<cordon_sandbox::volume::InUse, String> {
        let (root, volumes) = (root.to_path_buf(), self.volumes());
        tokio::task::spawn_blocking(move || volumes.enter(&root))
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r.map_err(|e| e.to_string()))
    }

    /// Where jobs' directories are.
    pub fn job_dirs(&self) -> JobDirs {
        JobDirs(self.data_dir.join("jobs"))
    }

    /// Where the sessions' directories are: `<data>/sessions/<id>`, with
    /// the workspace in `workspace` and the log in `session.jsonl`.
    pub fn session_dirs(&self) -> PathBuf {
        self.data_dir.join("sessions")
    }

    /// Where the sandbox API's sandboxes' directories are:
    /// `<data>/sandboxes/<id>`, with the workspace in `workspace` and a
    /// microVM's state in [`SANDBOX_VM_STATE`].
    pub fn sandbox_dirs(&self) -> PathBuf {
        self.data_dir.join("sandboxes")
    }
}

/// A microVM sandbox's state directory (the sandbox crate's), in its
/// directory: where it is saved when paused to disk, so that it may
/// outlive the server.
pub const SANDBOX_VM_STATE: &str = "vm";

/// What agent jobs need from the server's configuration.
#[derive(Clone)]
pub struct AgentDefaults {
    pub provider: cordon_agent::ProviderConfig,
    pub agent: AgentConfig,
}

/// The sandbox settings every job and session starts from.
#[derive(Clone)]
pub struct SandboxDefaults {
    /// Its disk budget is always set.
    limits: cordon_sandbox::Limits,
    protect_control_files: bool,
    favor_cgroup_changes: bool,
    volumes: cordon_sandbox::volume::Volumes,
    supervisor: Option<PathBuf>,
    backend: cordon_sandbox::BackendKind,
    vm: cordon_sandbox::VmOptions,
    previews: bool,
    /// Where ports are reached by name, and how this server is served.
    domain: Option<(crate::owner::SandboxDomain, crate::owner::Served)>,
}

impl SandboxDefaults {
    /// The backend a sandbox gets unless its job or session says.
    pub fn backend(&self) -> cordon_sandbox::BackendKind {
        self.backend
    }

    /// The limits a sandbox gets unless its job says otherwise (a
    /// session's always), its disk budget set.
    pub fn limits(&self) -> cordon_sandbox::Limits {
        self.limits
    }

    /// Whether tenants may preview their sandboxes' ports.
    pub fn previews(&self) -> bool {
        self.previews
    }

    /// What `owner`'s agent is told of its servers' previews.
    pub fn agent_previews(&self, owner: &crate::owner::Owner) -> cordon_agent::Previews {
        match &self.domain {
            _ if !self.previews => cordon_agent::Previews::Off,
            Some((d, served)) => cordon_agent::Previews::At(d.origin(owner, "{port}", *served)),
            None => cordon_agent::Previews::Asked,
        }
    }

    /// The network a sandbox gets for the one it asked: with previews on,
    /// `off` still has its loopback up, where a preview reaches its
    /// servers; nothing goes out either way.
    pub fn network(&self, asked: cordon_sandbox::Network) -> cordon_sandbox::Network {
        match asked {
            cordon_sandbox::Network::Off if self.previews => cordon_sandbox::Network::Loopback,
            n => n,
        }
    }

    /// A sandbox over `workspace` as a job's or an API sandbox's checked
    /// options ask: its memory and disk within the server's bounds, its
    /// network and broker policy, its backend.
    pub fn for_options(
        &self,
        workspace: impl Into<PathBuf>,
        image: Option<cordon_sandbox::RootImage>,
        options: &crate::job::RunOptions,
    ) -> cordon_sandbox::SandboxConfig {
        let mut c = self.sandbox(workspace, image);
        c.set_limits(cordon_sandbox::Limits {
            memory: options.memory,
            disk: Some(options.disk),
            ..c.limits()
        });
        c.network = self.network(options.network.into());
        c.egress = options.egress.clone().map(cordon_sandbox::Egress::new);
        if let Some(b) = options.backend {
            c.backend = b;
        }
        c
    }

    /// The workspace at `root` as the server's own writers open it (the
    /// files API, a `steps` job's `write_file`): beneath its root, and
    /// refusing the control files the sandbox's tools refuse unless the
    /// operator lifted that (`sandbox.protect_control_files = false`).
    /// Its volume is mounted for the opening; what is open keeps it.
    /// Blocks: call it off the async runtime.
    pub fn workspace(
        &self,
        root: &std::path::Path,
    ) -> Result<cordon_tools::Workspace, cordon_tools::WorkspaceError> {
        let _in_use = self
            .volumes
            .enter(root)
            .map_err(|e| cordon_tools::WorkspaceError::Root {
                root: root.to_path_buf(),
                source: std::io::Error::other(e),
            })?;
        let ws = cordon_tools::Workspace::open(root)?;
        Ok(if self.protect_control_files {
            ws.protecting_control_files()
        } else {
            ws
        })
    }

    /// Makes a workspace the server owns (a job's, a session's) with
    /// room for `disk`, or the default budget, and enters it: a file
    /// system of its own where the server can make one (see
    /// `cordon_sandbox::volume`).
    pub fn make_workspace(
        &self,
        root: &std::path::Path,
        disk: Option<u64>,
    ) -> Result<cordon_sandbox::volume::InUse, cordon_sandbox::volume::VolumeError> {
        self.volumes.make_workspace(root, disk.or(self.limits.disk))
    }

    /// [`SandboxDefaults::workspace`] off the async runtime.
    pub async fn open_workspace(
        &self,
        root: PathBuf,
    ) -> Result<cordon_tools::Workspace, cordon_tools::WorkspaceError> {
        let this = self.clone();
        tokio::task::spawn_blocking(move || this.workspace(&root))
            .await
            .unwrap_or_else(|e| {
                Err(cordon_tools::WorkspaceError::Root {
                    root: PathBuf::new(),
                    source: std::io::Error::other(e),
                })
            })
    }

    /// A sandbox over `workspace` with these defaults, its root made from
    /// `image` or else the host's.
    pub fn sandbox(
        &self,
        workspace: impl Into<PathBuf>,
        image: Option<cordon_sandbox::RootImage>,
    ) -> cordon_sandbox::SandboxConfig {
        let mut c = cordon_sandbox::SandboxConfig::new(workspace);
        c.image = image;
        c.set_limits(self.limits);
        if self.protect_control_files {
            c.read_only = cordon_sandbox::control_files(&c.workspace);
        }
        c.supervisor = self.supervisor.clone();
        c.backend = self.backend;
        c.vm = self.vm.clone();
        c.favor_cgroup_changes = self.favor_cgroup_changes;
        // The kernel behind run_code, when `cordon lab setup` installed it
        // (on the host's Python: not in an image).
        cordon_lab::offer(&mut c);
        c
    }
}

/// The jobs' directories: `<data>/jobs/<id>/workspace` (mounted at
/// /workspace) and, for agent jobs, `<data>/jobs/<id>/session.jsonl`. Ids
/// are the server's own, never a client's path.
#[derive(Clone, Debug)]
pub struct JobDirs(PathBuf);

impl JobDirs {
    /// Where every job's directory is.
    pub fn root(&self) -> &std::path::Path {
        &self.0
    }

    pub fn job(&self, id: &str) -> PathBuf {
        self.0.join(id)
    }

    pub fn workspace(&self, id: &str) -> PathBuf {
        self.job(id).join("workspace")
    }

    pub fn session_log(&self, id: &str) -> PathBuf {
        self.job(id).join("session.jsonl")
    }

    /// An agent job's checkpoints: copies of its workspace's files, which
    /// go when the workspace goes.
    pub fn checkpoints(&self, id: &str) -> PathBuf {
        cordon_agent::checkpoints::store_dir(&self.session_log(id))
    }
}

/// One pool as the operator asks for it: `N` sandboxes of the default
/// image and size for jobs, or
/// `N,for=sandboxes,image=NAME,memory=SIZE,disk=SIZE,network=loopback,backend=B`
/// (`for=sessions`: image and network only).
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSpec {
    pub size: usize,
    /// Whose sandboxes they are to be: jobs' (the default), agent
    /// sessions', or the sandbox API's (and so the E2B SDK's).
    pub owner: crate::owner::Kind,
    /// What differs from a job's defaults.
    pub limits: crate::job::Limits,
}

/// The most sandboxes one pool may keep ready.
pub const MAX_POOL: usize = 64;

impl std::str::FromStr for PoolSpec {
    type Err = String;

    fn from_str(s: &str) -> Result<PoolSpec, String> {
        let mut parts = s.split(',');
        let size = parts.next().unwrap_or_default().trim();
        let size: usize = size
            .parse()
            .ok()
            .filter(|n| (1..=MAX_POOL).contains(n))
            .ok_or_else(|| {
                format!("a pool starts with its size, a number from 1 to {MAX_POOL} (got `{size}`)")
            })?;
        let mut limits = crate::job::Limits::default();
        let mut owner = crate::owner::Kind::Job;
        for part in parts {
            let (key, value) = part
                .split_once('=')
                .map(|(k, v)| (k.trim(), v.trim()))
                .ok_or_else(|| {
                    format!("`{part}`: expected KEY=VALUE (for, image, memory, disk, network or backend)")
                })?;
            let size = |v: &str| {
                cordon_sandbox::parse_size(v)
                    .map(crate::job::Size)
                    .map_err(|e| format!("{key}: {e}"))
            };
            match key {
                "for" => {
                    owner = crate::owner::Kind::ALL
                        .into_iter()
                        .find(|k| k.collection() == value)
                        .ok_or_else(|| {
                            format!("for: expected jobs, sessions or sandboxes, not `{value}`")
                        })?
                }
                "image" => limits.image = Some(crate::job::ImageName::try_from(value.to_string())?),
                // Not `allow`: a broker's policy is each owner's own.
                "network" => {
                    limits.network = Some(match value {
                        "off" => crate::job::NetworkMode::Off,
                        "loopback" => crate::job::NetworkMode::Loopback,
                        _ => {
                            return Err(format!(
                                "network: a pool's is off or loopback, not `{value}`"
                            ));
                        }
                    })
                }
                "memory" => limits.memory = Some(size(value)?),
                "disk" => limits.disk = Some(size(value)?),
                "backend" => {
                    limits.backend = Some(match value {
                        "native" => crate::job::Backend::Native,
                        "microvm" => crate::job::Backend::Microvm,
                        _ => {
                            return Err(format!(
                                "backend: expected native or microvm, not `{value}`"
                            ));
                        }
                    })
                }
                _ => {
                    return Err(format!(
                        "`{key}`: a pool is set by for, image, memory, disk, network and backend"
                    ));
                }
            }
        }
        Ok(PoolSpec {
            size,
            owner,
            limits,
        })
    }
}
