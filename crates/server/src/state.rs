//! The state handlers and workers share, and the configuration it is
//! built from. It holds each part by the type its own module defines
//! (store, hub, caps, desktops, network ceilings and policies, live
//! sessions) and knows no handler.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_agent::{AgentConfig, Cancel};
use tokio::sync::Notify;

use crate::hub::Hub;
use crate::job::Bounds;
use crate::store::Store;

/// Everything `cordon serve` can be told.
#[derive(Clone)]
pub struct ServerConfig {
    pub listen: SocketAddr,
    /// `postgres://…`, `sqlite://PATH` or a path.
    pub db: String,
    /// Job workspaces live in `<data_dir>/jobs/<id>/`.
    pub data_dir: PathBuf,
    /// Jobs run at once, in all.
    pub workers: usize,
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
    pub mcp_servers: std::collections::BTreeMap<String, cordon_mcp::ServerSpec>,
    /// A session's sandbox is closed after this long without a message.
    pub session_idle: Duration,
    /// Live sessions (API and MCP) at once, in all.
    pub sessions: usize,
    /// Live sessions (API and MCP) at once per tenant.
    pub sessions_per_tenant: usize,
    /// The isolation backend of every sandbox, unless a job asks for one.
    pub backend: cordon_sandbox::BackendKind,
    /// Processes per sandbox (`sandbox.pids`; default 256).
    pub pids: Option<u64>,
    /// Git's, editors' and agents' control files read-only in every sandbox
    /// (`sandbox.protect_control_files`, see `cordon_sandbox::control_files`).
    pub protect_control_files: bool,
    /// microVM settings, for the microvm backend.
    pub cpus: Option<u32>,
    pub vm: cordon_sandbox::VmOptions,
    /// How long a finished job's workspace is kept; `None`: for ever. Its
    /// output, events, result and agent log are kept regardless.
    pub keep_workspaces: Option<Duration>,
    /// What jobs and sessions may reach through the broker, at most.
    pub network: crate::network::NetworkCeilings,
}

/// [`ServerConfig::keep_workspaces`] by default.
pub const KEEP_WORKSPACES: Duration = Duration::from_secs(24 * 3600);

impl ServerConfig {
    pub fn new(db: impl Into<String>, data_dir: impl Into<PathBuf>) -> Self {
        ServerConfig {
            listen: SocketAddr::from(([127, 0, 0, 1], 8080)),
            db: db.into(),
            data_dir: data_dir.into(),
            workers: std::thread::available_parallelism().map_or(2, |n| n.get()),
            per_tenant: 4,
            output_cap: 1024 * 1024,
            body_limit: 1024 * 1024,
            file_limit: 16 * 1024 * 1024,
            bounds: Bounds::default(),
            supervisor: None,
            agent: None,
            mcp_servers: Default::default(),
            pids: None,
            protect_control_files: true,
            session_idle: Duration::from_secs(15 * 60),
            sessions: 64,
            sessions_per_tenant: 8,
            backend: cordon_sandbox::BackendKind::Native,
            cpus: None,
            vm: cordon_sandbox::VmOptions::default(),
            keep_workspaces: Some(KEEP_WORKSPACES),
            network: Default::default(),
        }
    }

    /// A sandbox over `workspace` with the server's defaults: the default
    /// memory, the supervisor, the backend and its settings.
    pub fn sandbox(&self, workspace: impl Into<PathBuf>) -> cordon_sandbox::SandboxConfig {
        let mut c = cordon_sandbox::SandboxConfig::new(workspace);
        c.memory = Some(self.bounds.default_memory);
        c.disk = Some(self.bounds.default_disk);
        if self.pids.is_some() {
            c.pids = self.pids;
        }
        if self.protect_control_files {
            c.read_only = cordon_sandbox::control_files(&c.workspace);
        }
        c.supervisor = self.supervisor.clone();
        c.backend = self.backend;
        c.cpus = self.cpus;
        c.vm = self.vm.clone();
        c
    }
}

/// State shared by handlers and workers.
pub struct Shared {
    pub store: Store,
    pub hub: Hub,
    pub config: ServerConfig,
    /// Cancel handles of the jobs running in this process.
    pub running: Mutex<HashMap<String, Cancel>>,
    /// Agent sessions in use.
    pub sessions: crate::live::LiveSessions,
    /// Live sessions' counts under their caps (API and MCP sessions).
    pub caps: Arc<crate::caps::SessionCaps>,
    /// Desktops of the running jobs and live sessions that have a display.
    pub desktops: crate::desktop::Desktops,
    /// Wakes idle workers when a job is queued.
    pub wake: Notify,
    /// The operator's network ceilings, expanded.
    pub ceilings: crate::network::Ceilings,
    /// The brokers' policies of running jobs and live sessions.
    pub policies: crate::network::LivePolicies,
    /// Claims are made one at a time in this process, so two workers never
    /// race for the same job or past a tenant's limit.
    pub(crate) claim: tokio::sync::Mutex<()>,
}

impl AsRef<Store> for Shared {
    fn as_ref(&self) -> &Store {
        &self.store
    }
}

/// What agent jobs need from the server's configuration.
#[derive(Clone)]
pub struct AgentDefaults {
    pub provider: cordon_agent::ProviderConfig,
    pub agent: AgentConfig,
}
