//! How to build a sandbox: the configuration types, and their validation,
//! done once before any backend starts anything.

use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::error::{Error, Result};
use crate::protocol::Bind;

/// Network access inside the sandbox; in records and configuration, its
/// name (`off`, `loopback`, `allow`, `full`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum Network {
    /// A network namespace whose only interface, loopback, is down.
    #[default]
    Off,
    /// Loopback is up: processes in the sandbox can talk to each other.
    Loopback,
    /// Loopback, and an HTTP proxy on it through which cordon's broker
    /// reaches what [`SandboxConfig::egress`]'s policy allows.
    Allow,
    /// The host's own network namespace: every address the host reaches,
    /// its loopback services included. For trusted work only (native).
    Full,
}

impl std::fmt::Display for Network {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Network::Off => "off",
            Network::Loopback => "loopback",
            Network::Allow => "allow",
            Network::Full => "full",
        })
    }
}

impl std::str::FromStr for Network {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "off" | "none" => Ok(Network::Off),
            "loopback" | "lo" => Ok(Network::Loopback),
            "allow" => Ok(Network::Allow),
            "full" => Ok(Network::Full),
            other => Err(format!(
                "unknown network mode {other:?} (expected off, loopback, allow or full)"
            )),
        }
    }
}

impl From<Network> for String {
    fn from(n: Network) -> String {
        n.to_string()
    }
}

impl TryFrom<String> for Network {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

/// An extra bind mount.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindMount {
    pub source: PathBuf,
    pub target: String,
    pub writable: bool,
}

/// How to build a sandbox. Defaults are the documented `cordon run` ones.
#[derive(Debug, Clone)]
pub struct SandboxConfig {
    /// Host directory mounted read-write at `/workspace`.
    pub workspace: PathBuf,
    /// Memory limit in bytes for the whole sandbox (default 512 MiB).
    pub memory: Option<u64>,
    /// Maximum number of processes (default 256).
    pub pids: Option<u64>,
    /// Size of the `/tmp` tmpfs in bytes (default 256 MiB).
    pub tmp_size: u64,
    /// How much the workspace and the writable binds may grow on the
    /// host's disk, in bytes (default: no budget). A host-side watcher
    /// stops the whole sandbox past it; natively, no file may be larger.
    pub disk: Option<u64>,
    pub network: Network,
    /// Ports of the sandbox's loopback served on the host's (`cordon run
    /// -p`), from creation until it ends. Any network but `off`.
    pub ports: Vec<PortForward>,
    /// The broker of [`Network::Allow`]; required by it, refused without it.
    pub egress: Option<crate::egress::Egress>,
    pub binds: Vec<BindMount>,
    /// Files in the workspace the sandbox must not read (a `.env` holding
    /// the user's API key): each appears empty and read-only inside. Paths
    /// on the host, beneath `workspace`; one that is missing is skipped.
    pub hidden: Vec<PathBuf>,
    /// Paths in the workspace the sandbox may read but not change, nor
    /// rename away (their directories below the workspace are pinned):
    /// see [`control_files`]. Missing ones are skipped.
    pub read_only: Vec<PathBuf>,
    /// Whether the workspace's and the binds' paths may lead through
    /// symbolic links. A caller that resolved them itself (cordon's front
    /// ends, which refuse links a sandbox could have planted) sets it false:
    /// a link that appears on them later was planted since, and is refused.
    pub follow_links: bool,
    /// Environment added to every exec, over the built-in minimum.
    pub env: Vec<(String, String)>,
    /// Default working directory of execs.
    pub workdir: String,
    pub hostname: String,
    /// The executable to run as the supervisor; defaults to the current one.
    pub supervisor: Option<PathBuf>,
    /// How long setup may take before it is abandoned.
    pub setup_timeout: Duration,
    /// Start the supervisor by forking this process, without exec, when it
    /// is single-threaded. Saves an exec of the binary (about half of
    /// `cordon run`'s start-up), but the supervisor then begins as a copy of
    /// this process's memory: set it only where that memory holds nothing
    /// the sandbox must not have, even behind its non-dumpable supervisor.
    pub fork_supervisor: bool,
    /// A virtual X display inside the sandbox, started with it.
    pub display: Option<Display>,
    /// Which isolation backend builds the sandbox.
    pub backend: BackendKind,
    /// Virtual CPUs of a microVM (default 1); the native backend ignores it.
    pub cpus: Option<u32>,
    /// Settings of the microvm backend.
    pub vm: VmOptions,
    /// The root file system from an image instead of the host's: its
    /// layers under an overlay natively, its flat root under a writable
    /// disk in a microVM.
    pub image: Option<RootImage>,
    /// In an image, trust the host's certificate authorities as well as
    /// the image's own (`/etc/cordon/bundle.pem`, and the variables that
    /// point programs at it): for a network whose proxy re-signs TLS with
    /// an authority only the host has. The host root has them anyway.
    pub host_certs: bool,
    /// As root with cgroup v1 limits, have the kernel favour cgroup changes
    /// (`favordynmods`, for the whole host until it reboots), so that a
    /// start does not wait ~7 ms for an RCU grace period to move its
    /// supervisor into its cgroups (the cgroup module's `favor_dynmods`).
    pub favor_cgroup_changes: bool,
}

/// A sandbox's root from an image: its layers, read-only, under a writable
/// layer of the sandbox's own that goes with it. The `cordon-image` store
/// unpacks the layers; commands start as root inside unless `uid` says
/// otherwise, with ids 0 to 65535 (see [`crate::protocol::IdSource`]).
#[derive(Debug, Clone)]
pub struct RootImage {
    /// The unpacked layers' directories, the top layer first.
    pub layers: Vec<PathBuf>,
    /// Where each sandbox makes its writable layer (a directory of its own
    /// in here, removed with the sandbox): a file system with user extended
    /// attributes, such as the store's own.
    pub scratch: PathBuf,
    /// Where the microvm backend makes and finds the image's flat root (a
    /// file system image of its layers merged, made once; see
    /// `cordon_image::flat`): the store's own.
    pub flat: PathBuf,
    /// The user and group commands run as inside (the image's `User`).
    pub uid: u32,
    pub gid: u32,
    /// The image's environment (its `Env`): over cordon's defaults, under
    /// the network's settings and [`SandboxConfig::env`].
    pub env: Vec<(String, String)>,
    /// The stored image's manifest digest, recorded beside the writable
    /// layer: what a commit of the sandbox's changes builds on.
    pub manifest: Option<String>,
    /// What the front end calls the sandbox (a session's id, a name the
    /// user gave), recorded beside the writable layer for `cordon image
    /// commit`; [`crate::Sandbox::set_label`] records one later.
    pub label: Option<String>,
    /// A build step's root (see [`crate::Sandbox::close_step`]): nothing is
    /// mounted over the image's paths but `/dev` and `/proc`, and when the
    /// sandbox closes its root's changes are written as a layer tar.
    /// Native backend only.
    pub step: Option<BuildStep>,
    /// A disk to start the writable layer from instead of an empty one: a
    /// copy of another microVM's ([`crate::Sandbox::copy_layer_disk`],
    /// its root's changes), which this sandbox copies again as its own.
    /// The microvm backend only.
    pub upper_from: Option<PathBuf>,
}

/// Where a build step's changes go, and what of its root is not its own.
#[derive(Debug, Clone)]
pub struct BuildStep {
    /// The file the layer tar is written to (the caller's, made empty).
    pub changes: PathBuf,
    /// Paths of the root (relative, as `etc/hosts`) left out with what is
    /// beneath them: what cordon put there to run the step.
    pub skip: Vec<String>,
}

impl BuildStep {
    /// Where the step's outer supervisor says whether the layer is whole:
    /// `ok`, or why not (beside [`BuildStep::changes`]).
    pub fn status(&self) -> PathBuf {
        let mut name = self.changes.clone().into_os_string();
        name.push(".status");
        PathBuf::from(name)
    }
}

impl RootImage {
    /// Warns, for an image whose user is not root, that this user cannot
    /// write `/workspace` on this backend: `why` it cannot map ids for it,
    /// `instead` what would do.
    pub(crate) fn warn_workspace_unwritable(&self, why: &str, instead: &str) {
        if self.uid != 0 && self.step.is_none() {
            tracing::warn!(
                "the image runs as uid {}, which cannot write /workspace {why}: run as \
                 `--user 0`, or {instead}",
                self.uid
            );
        }
    }
}

impl From<cordon_image::root::SandboxRoot> for RootImage {
    /// What the store hands over; the working directory is the front
    /// end's to use.
    fn from(r: cordon_image::root::SandboxRoot) -> Self {
        RootImage {
            layers: r.layers,
            scratch: r.scratch,
            flat: r.flat,
            uid: r.uid,
            gid: r.gid,
            env: r.env,
            manifest: Some(r.manifest.to_string()),
            label: None,
            step: None,
            upper_from: None,
        }
    }
}

/// The isolation backend of a sandbox.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum BackendKind {
    /// Linux namespaces, seccomp, Landlock and cgroups on the host's kernel.
    #[default]
    Native,
    /// A QEMU microVM with its own kernel.
    Microvm,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "native" => Ok(BackendKind::Native),
            "microvm" | "vm" => Ok(BackendKind::Microvm),
            other => Err(format!(
                "unknown backend {other:?} (expected native or microvm)"
            )),
        }
    }
}

impl BackendKind {
    /// Its name, as settings spell it.
    pub fn as_str(self) -> &'static str {
        match self {
            BackendKind::Native => "native",
            BackendKind::Microvm => "microvm",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// How the microvm backend finds and runs its virtual machine.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VmOptions {
    /// The QEMU binary (default: `qemu-system-x86_64` on `PATH`).
    pub qemu: Option<PathBuf>,
    /// The guest kernel, a vmlinuz or vmlinux (default: the one
    /// `cordon vm setup` fetched).
    pub kernel: Option<PathBuf>,
    /// Its modules directory (`lib/modules/VERSION`).
    pub modules: Option<PathBuf>,
    /// `kvm`, `tcg`, or `None` to decide.
    pub accel: Option<Accel>,
    /// Boot every guest from its kernel: neither take nor use the memory
    /// snapshot of a booted guest (microvm/snapshot.rs).
    pub cold_boot: bool,
    /// How the host's directories reach the guest.
    pub shares: VmShares,
    /// The virtio-fs server (default: `virtiofsd` on `PATH`, else
    /// `/usr/libexec/virtiofsd`).
    pub virtiofsd: Option<PathBuf>,
    /// A directory of this sandbox's own, which only cordon can reach,
    /// where its run files and, once it is paused to disk, its memory and
    /// devices are kept: another process can then resume it
    /// ([`crate::MicrovmBackend::reattach`] with the same configuration).
    /// None: a directory of the process's own, which goes with it.
    pub state_dir: Option<PathBuf>,
}

/// How a microVM's shares (the workspace, binds, the host's `/usr`) reach
/// its guest.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum VmShares {
    /// virtio-fs where QEMU can save it (8.2 and newer), the guest's
    /// kernel maps its files shared (6.6 and newer) and `virtiofsd` is
    /// found, else 9p.
    #[default]
    Auto,
    /// virtio-fs, one `virtiofsd` per share: a guest with its shares
    /// mounted can be saved (paused to disk). On a guest kernel before
    /// 6.6, a shared mapping of a workspace file fails (ENODEV).
    VirtioFs,
    /// QEMU's own 9p server: no other program, but a guest with a share
    /// mounted cannot be saved.
    NineP,
}

impl std::str::FromStr for VmShares {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(VmShares::Auto),
            "virtiofs" => Ok(VmShares::VirtioFs),
            "9p" => Ok(VmShares::NineP),
            other => Err(format!(
                "unknown share kind {other:?} (expected auto, virtiofs or 9p)"
            )),
        }
    }
}

/// How QEMU runs the guest's code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    /// Hardware virtualisation through /dev/kvm.
    Kvm,
    /// QEMU's own translator: slow, but needs nothing from the host.
    Tcg,
}

impl std::fmt::Display for Accel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Accel::Kvm => "kvm",
            Accel::Tcg => "tcg",
        })
    }
}

impl std::str::FromStr for Accel {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "kvm" => Ok(Accel::Kvm),
            "tcg" => Ok(Accel::Tcg),
            other => Err(format!(
                "unknown accelerator {other:?} (expected kvm or tcg)"
            )),
        }
    }
}

/// A virtual screen: Xvfb inside the sandbox (its socket in the sandbox's
/// own /tmp, no TCP), with a window manager when one is installed, and
/// `DISPLAY` set for every exec. In records, `WxH`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(into = "String", try_from = "String")]
pub struct Display {
    pub width: u32,
    pub height: u32,
}

/// The display's name inside every sandbox: each has its own /tmp.
pub const DISPLAY: &str = ":0";

impl std::fmt::Display for Display {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}x{}", self.width, self.height)
    }
}

impl std::str::FromStr for Display {
    type Err = String;

    /// `1280x800`.
    fn from_str(s: &str) -> std::result::Result<Display, String> {
        let bad = || format!("expected WIDTHxHEIGHT such as 1280x800, got {s:?}");
        let (w, h) = s.trim().split_once(['x', 'X']).ok_or_else(bad)?;
        let (width, height): (u32, u32) =
            (w.parse().map_err(|_| bad())?, h.parse().map_err(|_| bad())?);
        if !(64..=8192).contains(&width) || !(64..=8192).contains(&height) {
            return Err(format!("{s}: width and height must be between 64 and 8192"));
        }
        Ok(Display { width, height })
    }
}

impl From<Display> for String {
    fn from(d: Display) -> String {
        d.to_string()
    }
}

impl TryFrom<String> for Display {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        s.parse()
    }
}

pub const MIB: u64 = 1024 * 1024;

/// The resources one sandbox may use, in one type that every front end
/// takes: `cordon run`'s flags and the settings, the server's defaults
/// and each job's own. Made by [`Limits::new`], which checks them once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bytes of memory for the whole sandbox.
    pub memory: u64,
    /// Processes at once.
    pub pids: u64,
    /// How much the workspace and writable binds may grow on disk, in
    /// bytes; `None`: no budget.
    pub disk: Option<u64>,
    /// Virtual CPUs of a microVM (the native backend shares the host's).
    pub cpus: u32,
}

/// Why limits cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LimitsError {
    #[error("memory {0} is below the least a sandbox runs in (16M)")]
    Memory(u64),
    #[error("a sandbox needs at least one process")]
    Pids,
    #[error("a disk budget of 0 stops the sandbox before it starts")]
    Disk,
    #[error("cpus must be 1 to {MAX_CPUS}, not {0}")]
    Cpus(u32),
}

/// The most virtual CPUs a microVM is given.
pub const MAX_CPUS: u32 = 64;

impl Limits {
    /// The least memory a sandbox runs in.
    pub const MIN_MEMORY: u64 = 16 * MIB;

    pub fn new(
        memory: u64,
        pids: u64,
        disk: Option<u64>,
        cpus: u32,
    ) -> Result<Limits, LimitsError> {
        if memory < Self::MIN_MEMORY {
            return Err(LimitsError::Memory(memory));
        }
        if pids == 0 {
            return Err(LimitsError::Pids);
        }
        if disk == Some(0) {
            return Err(LimitsError::Disk);
        }
        if !(1..=MAX_CPUS).contains(&cpus) {
            return Err(LimitsError::Cpus(cpus));
        }
        Ok(Limits {
            memory,
            pids,
            disk,
            cpus,
        })
    }
}

impl Default for Limits {
    /// `cordon run`'s documented defaults: 512 MiB, 256 processes, no
    /// disk budget, one CPU.
    fn default() -> Limits {
        Limits {
            memory: 512 * MIB,
            pids: 256,
            disk: None,
            cpus: 1,
        }
    }
}

impl SandboxConfig {
    /// The limits this configuration sets.
    pub fn limits(&self) -> Limits {
        let d = Limits::default();
        Limits {
            memory: self.memory.unwrap_or(d.memory),
            pids: self.pids.unwrap_or(d.pids),
            disk: self.disk,
            cpus: self.cpus.unwrap_or(d.cpus),
        }
    }

    /// Sets every limit at once.
    pub fn set_limits(&mut self, l: Limits) {
        self.memory = Some(l.memory);
        self.pids = Some(l.pids);
        self.disk = l.disk;
        self.cpus = Some(l.cpus);
    }

    pub fn new(workspace: impl Into<PathBuf>) -> Self {
        let limits = Limits::default();
        SandboxConfig {
            workspace: workspace.into(),
            memory: Some(limits.memory),
            pids: Some(limits.pids),
            tmp_size: 256 * MIB,
            disk: None,
            network: Network::Off,
            ports: Vec::new(),
            egress: None,
            binds: Vec::new(),
            hidden: Vec::new(),
            read_only: Vec::new(),
            follow_links: true,
            env: Vec::new(),
            workdir: "/workspace".into(),
            hostname: "cordon".into(),
            supervisor: None,
            setup_timeout: Duration::from_secs(20),
            fork_supervisor: false,
            display: None,
            backend: BackendKind::Native,
            cpus: None,
            vm: VmOptions::default(),
            image: None,
            host_certs: false,
            favor_cgroup_changes: true,
        }
    }
}

/// `paths` ([`SandboxConfig::hidden`], [`SandboxConfig::read_only`]) as
/// paths relative to the canonical workspace `ws`: each one's directory is
/// resolved, its own name is not (a link there is taken as the link);
/// paths outside the workspace are dropped, since the sandbox cannot see
/// them anyway.
pub(crate) fn in_workspace(paths: &[PathBuf], ws: &str) -> Vec<String> {
    let ws = Path::new(ws);
    paths
        .iter()
        .filter_map(|h| {
            let dir = h.parent()?.canonicalize().ok()?;
            let rel = dir.join(h.file_name()?);
            let rel = rel.strip_prefix(ws).ok()?;
            rel.components()
                .all(|c| matches!(c, std::path::Component::Normal(_)))
                .then(|| rel.to_str().map(str::to_string))
                .flatten()
        })
        .collect()
}

/// Files in the workspace that programs the user runs on the host take
/// commands from without asking, made read-only in the sandbox (and
/// pinned, so they cannot be moved aside for planted ones):
/// - git's: the whole of `.git` (or `.git` itself when it is a file naming
///   the repository elsewhere). Its configuration (`core.fsmonitor`,
///   `core.hooksPath`, filter and diff drivers), hooks and `info/` name
///   commands, and protecting only those is not enough: git also follows
///   files a writable `.git` may gain (`commondir` moves where the
///   configuration and hooks are read from, `modules/*/` holds each
///   submodule's own, `worktrees/*/` the linked worktrees'). Git cannot
///   commit without creating files in `.git` itself, so the repository is
///   the user's to change, as Codex has it;
/// - editors': `.vscode` (tasks run on opening the folder, interpreter
///   paths) and `.idea`;
/// - coding agents': `.claude` (hooks) and `.mcp.json` (servers to start).
///
/// Those that exist, as files or directories (not links), at the top
/// level, and every `.git` below it (other repositories and submodules,
/// found by a bounded walk: see `repos.rs`).
pub fn control_files(workspace: &Path) -> Vec<PathBuf> {
    let exists = |p: &PathBuf| std::fs::symlink_metadata(p).is_ok_and(|m| !m.is_symlink());
    let git = workspace.join(".git");
    let mut paths: Vec<PathBuf> = match std::fs::symlink_metadata(&git) {
        Ok(m) if m.is_dir() || m.is_file() => vec![git],
        _ => Vec::new(),
    };
    paths.extend(
        CONTROL_FILES
            .iter()
            .map(|n| workspace.join(n))
            .filter(exists),
    );
    let nested = crate::repos::nested_git(workspace);
    if nested.incomplete {
        tracing::warn!(
            "the workspace is too large to look through for git repositories below its top \
             level: {} were found and protected, others may not be",
            nested.git.len()
        );
    }
    paths.extend(nested.git);
    paths
}

/// The names [`control_files`] protects besides git's, at the workspace's
/// top level.
pub const CONTROL_FILES: &[&str] = &[".vscode", ".idea", ".claude", ".mcp.json"];

/// Parses sizes such as `512M`, `2G`, `64k` or `1048576` into bytes.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let s = s.trim();
    let split = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
    let (num, unit) = s.split_at(split);
    let n: u64 = num.parse().map_err(|_| {
        format!("invalid size {s:?}: expected a number with an optional K, M or G suffix")
    })?;
    let mult = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 1,
        "k" | "kb" | "kib" => 1024,
        "m" | "mb" | "mib" => MIB,
        "g" | "gb" | "gib" => 1024 * MIB,
        other => {
            return Err(format!(
                "invalid size unit {other:?} in {s:?} (use K, M or G)"
            ));
        }
    };
    n.checked_mul(mult)
        .ok_or_else(|| format!("size {s:?} is too large"))
}

/// `path` with every link resolved; unless `config` lets paths lead
/// through links, it must have had none (see [`SandboxConfig::follow_links`]).
fn resolve(config: &SandboxConfig, path: &Path, what: &str) -> Result<PathBuf> {
    let real = path
        .canonicalize()
        .map_err(|e| Error::Config(format!("{what} {}: {e}", path.display())))?;
    if !config.follow_links && real != path {
        return Err(Error::Config(format!(
            "{what} {}: a symbolic link appeared on this path after cordon resolved it \
             (a sandbox working in a directory above may have planted it); cordon follows none",
            path.display()
        )));
    }
    Ok(real)
}

impl SandboxConfig {
    /// Checks the configuration every backend builds from, and resolves
    /// its host paths: the workspace's, and the extra binds as the
    /// supervisor mounts them.
    pub(crate) fn validate(&self) -> Result<(String, Vec<Bind>)> {
        let ws = resolve(self, &self.workspace, "workspace")?;
        if !ws.is_dir() {
            return Err(Error::Config(format!(
                "workspace {} is not a directory",
                ws.display()
            )));
        }
        let ws = ws
            .to_str()
            .ok_or_else(|| Error::Config("workspace path is not valid UTF-8".into()))?
            .to_string();
        let mut binds = Vec::new();
        for b in &self.binds {
            let src = resolve(self, &b.source, "bind source")?;
            let target = b.target.clone();
            if !target.starts_with('/') || target.split('/').any(|c| c == "..") {
                return Err(Error::Config(format!(
                    "bind target {target:?} must be an absolute path without '..'"
                )));
            }
            let reserved = [
                "/",
                "/proc",
                "/dev",
                "/workspace",
                "/tmp",
                "/etc/passwd",
                "/etc/group",
            ];
            if reserved.contains(&target.trim_end_matches('/'))
                || ["/proc/", "/dev/", "/workspace/"]
                    .iter()
                    .any(|p| target.starts_with(p))
            {
                return Err(Error::Config(format!(
                    "bind target {target} is reserved by the sandbox"
                )));
            }
            binds.push(Bind {
                source: src
                    .to_str()
                    .ok_or_else(|| Error::Config("bind source path is not valid UTF-8".into()))?
                    .to_string(),
                target,
                writable: b.writable,
            });
        }
        if self.tmp_size == 0 {
            return Err(Error::Config("tmp size must be greater than zero".into()));
        }
        if !self.ports.is_empty() && self.network == Network::Off {
            return Err(Error::Config(
                "a forwarded port needs the sandbox's loopback: give it a network (loopback at \
                 least)"
                    .into(),
            ));
        }
        if let Some(image) = &self.image {
            if image.layers.is_empty() {
                return Err(Error::Config("the image has no layers".into()));
            }
            if image.layers.len() > crate::protocol::MAX_IMAGE_LAYERS {
                return Err(Error::Config(format!(
                    "the image has {} layers; cordon mounts at most {}",
                    image.layers.len(),
                    crate::protocol::MAX_IMAGE_LAYERS
                )));
            }
        }
        if self.memory == Some(0) || self.pids == Some(0) {
            return Err(Error::Config(
                "memory and pids limits must be greater than zero".into(),
            ));
        }
        match (self.network, &self.egress) {
            (Network::Allow, None) => {
                return Err(Error::Config(
                    "network mode allow needs a policy (SandboxConfig::egress)".into(),
                ));
            }
            (Network::Off | Network::Loopback | Network::Full, Some(_)) => {
                return Err(Error::Config(format!(
                    "an egress policy was given, but the network mode is {}: use allow",
                    self.network
                )));
            }
            _ => {}
        }
        Ok((ws, binds))
    }

    /// The environment every exec starts from: nothing of the host's.
    pub(crate) fn base_env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            (
                "PATH".to_string(),
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin".to_string(),
            ),
            ("HOME".into(), "/tmp".into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("TERM".into(), "dumb".into()),
        ];
        if let Some(image) = &self.image {
            if image.uid == 0 {
                put_env(&mut env, "HOME", "/root");
            }
            for (k, v) in &image.env {
                put_env(&mut env, k, v);
            }
        }
        if self.network == Network::Allow {
            env.extend(crate::egress::proxy_env());
        }
        if crate::egress::trust(self).is_some() {
            env.extend(crate::egress::trust_env());
        }
        for (k, v) in &self.env {
            put_env(&mut env, k, v);
        }
        env
    }
}

/// Sets `key` to `value` in `env`, over what it held: the later of two
/// settings wins, and the variable is set once.
pub(crate) fn put_env(env: &mut Vec<(String, String)>, key: &str, value: &str) {
    env.retain(|(k, _)| k != key);
    env.push((key.to_string(), value.to_string()));
}

/// Refuses a variable no process can be given: a name that is empty or
/// holds `=` or NUL, or a value with NUL.
pub(crate) fn check_env_var(key: &str, value: &str) -> Result<()> {
    if key.is_empty() || key.contains(['=', '\0']) || value.contains('\0') {
        return Err(Error::Config(format!(
            "invalid environment variable {key:?}"
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn limits_are_checked_once_and_set_together() {
        assert!(matches!(
            Limits::new(MIB, 1, None, 1),
            Err(LimitsError::Memory(_))
        ));
        assert_eq!(Limits::new(64 * MIB, 0, None, 1), Err(LimitsError::Pids));
        assert_eq!(Limits::new(64 * MIB, 1, Some(0), 1), Err(LimitsError::Disk));
        assert_eq!(Limits::new(64 * MIB, 1, None, 0), Err(LimitsError::Cpus(0)));
        let l = Limits::new(64 * MIB, 32, Some(MIB), 2).unwrap();
        let mut c = SandboxConfig::new("/w");
        assert_eq!(c.limits(), Limits::default());
        c.set_limits(l);
        assert_eq!(
            (c.memory, c.pids, c.disk, c.cpus),
            (Some(64 * MIB), Some(32), Some(MIB), Some(2))
        );
        assert_eq!(c.limits(), l);
    }

    use super::*;

    #[test]
    fn sizes_parse_with_units() {
        assert_eq!(parse_size("512M").unwrap(), 512 * MIB);
        assert_eq!(parse_size("2g").unwrap(), 2048 * MIB);
        assert_eq!(parse_size("64k").unwrap(), 65536);
        assert_eq!(parse_size("100").unwrap(), 100);
        assert!(parse_size("12X").is_err());
        assert!(parse_size("M").is_err());
        assert!(parse_size("99999999999999999999G").is_err());
    }

    #[test]
    fn forwarded_ports_are_loopback_only() {
        use super::PortForward;
        let p = |s: &str| s.parse::<PortForward>().map(|p| p.to_string());
        assert_eq!(p("3000").unwrap(), "127.0.0.1:3000:3000");
        assert_eq!(p("8080:3000").unwrap(), "127.0.0.1:8080:3000");
        assert_eq!(p("0:3000").unwrap(), "127.0.0.1:0:3000");
        assert_eq!(p("[::1]:8080:80").unwrap(), "[::1]:8080:80");
        assert_eq!(p("127.0.0.2:9:9").unwrap(), "127.0.0.2:9:9");
        for bad in [
            "",
            "0",
            "70000",
            "x:80",
            "0.0.0.0:8080:80",
            "192.0.2.1:1:1",
            "8080:",
        ] {
            assert!(p(bad).is_err(), "{bad} was taken");
        }
        assert!(p("0.0.0.0:8080:80").unwrap_err().contains("loopback"));
    }

    #[test]
    fn network_modes_parse() {
        assert_eq!("off".parse::<Network>().unwrap(), Network::Off);
        assert_eq!("loopback".parse::<Network>().unwrap(), Network::Loopback);
        assert!("host".parse::<Network>().is_err());
    }
}

/// A port of the sandbox's loopback served on the host's: `PORT` (the same
/// number on 127.0.0.1), `HOSTPORT:PORT` (0: any free one), or
/// `ADDR:HOSTPORT:PORT` with a loopback ADDR (`[::1]:8080:3000`). Never an
/// address other hosts reach: what the sandbox serves is the sandbox's
/// to shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PortForward {
    /// Where it listens on the host.
    pub host: std::net::SocketAddr,
    /// The port inside.
    pub port: u16,
}

impl std::str::FromStr for PortForward {
    type Err = String;

    fn from_str(s: &str) -> std::result::Result<Self, String> {
        use std::net::{Ipv4Addr, SocketAddr};
        let port_of = |p: &str| {
            p.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("{p:?} is not a port (1 to 65535)"))
        };
        let (host, port) = match s.rsplit_once(':') {
            None => {
                let port = port_of(s)?;
                (SocketAddr::from((Ipv4Addr::LOCALHOST, port)), port)
            }
            Some((host, port)) => {
                let port = port_of(port)?;
                let host = match host.parse::<u16>() {
                    Ok(h) => SocketAddr::from((Ipv4Addr::LOCALHOST, h)),
                    Err(_) => host.parse::<SocketAddr>().map_err(|_| {
                        format!("{host:?} is neither a port nor a loopback ADDR:PORT")
                    })?,
                };
                (host, port)
            }
        };
        if !host.ip().is_loopback() {
            return Err(format!(
                "{} is not a loopback address: a forwarded port is for this machine only",
                host.ip()
            ));
        }
        Ok(PortForward { host, port })
    }
}

impl std::fmt::Display for PortForward {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.host, self.port)
    }
}

/// The nice value of a sandbox with a disk budget. The watcher is a host
/// thread; as root it runs at nice -10, and the sandbox at 5. Anyone else
/// cannot raise the watcher above 0, so the sandbox goes to 15 instead:
/// the same distance, so that a writer at full speed on a busy host (two
/// cores, a build, a microVM under emulation) still yields to the look
/// that stops it. On an idle host nice changes nothing.
pub(crate) fn budgeted_nice() -> i32 {
    if rustix::process::geteuid().is_root() {
        5
    } else {
        15
    }
}
