//! Sandbox options and settings shared by every front end: the flags of
//! `run`, `shell` and `mcp`, and the one way settings become a sandbox.

use std::path::{Path, PathBuf};

use crate::settings::{Layers, Settings};
use clap::Args;
use cordon_sandbox::{BindMount, Network, SandboxConfig, parse_size};

/// The sandbox's flags. Each one that is also a setting (`sandbox.*`,
/// `vm.*`, `workspace`) only overrides it: unset, the configuration
/// decides, as it does for `exec` and `chat`.
#[derive(Args, Debug, Clone)]
pub struct SandboxOpts {
    /// Host directory mounted read-write at /workspace [default: the current directory]
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Memory limit for the whole sandbox (K, M, G suffixes) [default: `sandbox.memory`, 512M]
    #[arg(long, value_name = "SIZE", value_parser = parse_size)]
    pub memory: Option<u64>,
    /// Maximum number of processes in the sandbox [default: `sandbox.pids`, 256]
    #[arg(long, value_name = "N")]
    pub pids: Option<u64>,
    /// Size of the /tmp tmpfs (K, M, G suffixes)
    #[arg(long, default_value = "256M", value_parser = parse_size)]
    pub tmp_size: u64,
    /// How much the workspace and writable binds may grow on disk (K, M, G
    /// suffixes, or `none`); past it the sandbox is stopped [default: `sandbox.disk`, none]
    #[arg(long, value_name = "SIZE", value_parser = parse_disk)]
    pub disk: Option<String>,
    /// Network access: off (no interface up), loopback, allow (the hosts of --allow, through cordon's broker), or full (the host's network, with a warning) [default: `sandbox.network`, off]
    #[arg(long, value_name = "MODE")]
    pub network: Option<Network>,
    /// Let the sandbox reach HOST[:PORT] through cordon's broker (repeatable; *.DOMAIN, IP/CIDR, or a preset: @python @node @rust @debian @git-hosting); implies --network allow (overrides `network.allow`)
    #[arg(long = "allow", value_name = "HOST")]
    pub allow: Vec<String>,
    /// Serve the sandbox's PORT on this machine's loopback: PORT, HOSTPORT:PORT (0: any free one) or [ADDR:]HOSTPORT:PORT (repeatable); raises --network off to loopback, never giving the sandbox a route out
    #[arg(long = "publish", short = 'p', value_name = "[HOSTPORT:]PORT")]
    pub publish: Vec<cordon_sandbox::PortForward>,
    /// Set an environment variable in the sandbox (repeatable)
    #[arg(long = "env", short = 'e', value_name = "K=V", value_parser = parse_env)]
    pub env: Vec<(String, String)>,
    /// Bind a host path read-only: PATH or HOST_PATH:SANDBOX_PATH (repeatable)
    #[arg(long = "ro", value_name = "PATH")]
    pub ro: Vec<String>,
    /// Bind a host path read-write: PATH or HOST_PATH:SANDBOX_PATH (repeatable)
    #[arg(long = "rw", value_name = "PATH")]
    pub rw: Vec<String>,
    /// Working directory inside the sandbox [default: /workspace, or an image's WorkingDir]
    #[arg(long, value_name = "DIR")]
    pub workdir: Option<String>,
    /// Run in this image's file system, as root inside, instead of the host's (read-only):
    /// NAME[:TAG] or NAME@DIGEST from a registry, oci:DIR[:TAG], or docker-archive:FILE;
    /// pulled if the store lacks it (docs/images.md) [default: `sandbox.image` (CORDON_IMAGE), none]
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// In an image, the user commands run as: NAME, UID, NAME:GROUP or UID:GID [default: the image's, else root]
    #[arg(long, value_name = "USER")]
    pub user: Option<String>,
    /// In an image, trust this host's certificate authorities too (for a
    /// network whose proxy re-signs TLS with an authority only the host has)
    #[arg(long)]
    pub host_certs: bool,
    /// In an image, what `cordon image commit NAME` calls this sandbox
    #[arg(long, value_name = "NAME")]
    pub name: Option<String>,
    /// Start a virtual X display of this size inside the sandbox (Xvfb and a
    /// window manager; DISPLAY is set for the command)
    #[arg(long, value_name = "WxH")]
    pub display: Option<cordon_sandbox::Display>,
    /// Isolation backend: native (namespaces on this kernel) or microvm (a
    /// QEMU virtual machine with its own kernel; see `cordon vm setup`)
    /// [default: `sandbox.backend` (CORDON_BACKEND), native]
    #[arg(long, value_name = "NAME")]
    pub backend: Option<cordon_sandbox::BackendKind>,
    /// Virtual CPUs of a microVM [default: `sandbox.cpus` (CORDON_CPUS), 1]
    #[arg(long, value_name = "N")]
    pub cpus: Option<u32>,
    /// microvm: QEMU's accelerator, kvm or tcg [default: kvm where a probe guest boots on it, else tcg]
    #[arg(long, value_name = "ACCEL", hide = true)]
    pub vm_accel: Option<cordon_sandbox::Accel>,
    /// microvm: the guest kernel (vmlinuz or vmlinux) [default: `cordon vm setup`'s]
    #[arg(long, value_name = "PATH", hide = true)]
    pub vm_kernel: Option<PathBuf>,
    /// microvm: the guest kernel's modules directory
    #[arg(long, value_name = "DIR", hide = true)]
    pub vm_modules: Option<PathBuf>,
    /// microvm: the QEMU binary
    #[arg(long, value_name = "PATH", hide = true)]
    pub vm_qemu: Option<PathBuf>,
}

/// Forwards `ports` (`-p`): a sandbox without a network gets its loopback
/// up for them, nothing more.
pub fn publish(c: &mut SandboxConfig, ports: &[cordon_sandbox::PortForward]) {
    c.ports = ports.to_vec();
    if !ports.is_empty() && c.network == Network::Off {
        c.network = Network::Loopback;
    }
}

/// A `--disk` value: a size, or `none` for no budget; kept as the
/// setting's text, which the settings check.
pub fn parse_disk(s: &str) -> Result<String, String> {
    crate::settings::parse_disk(s)?;
    Ok(s.trim().to_string())
}

pub fn parse_env(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("expected K=V, got {s:?}"))?;
    if k.is_empty() || k.contains('\0') || v.contains('\0') {
        return Err(format!("invalid variable name in {s:?}"));
    }
    Ok((k.to_string(), v.to_string()))
}

/// Parses a `--set KEY=VALUE` override of a setting.
pub fn parse_setting(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.trim().to_string(), v.to_string()))
        .filter(|(k, _)| !k.is_empty())
        .ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

fn parse_bind(spec: &str, writable: bool) -> Result<BindMount, String> {
    let (src, dst) = match spec.split_once(':') {
        Some((s, d)) => (s, d.to_string()),
        None => (spec, String::new()),
    };
    let source = PathBuf::from(src);
    let target = if dst.is_empty() {
        std::path::absolute(&source)
            .map_err(|e| format!("{src}: {e}"))?
            .to_string_lossy()
            .into_owned()
    } else {
        dst
    };
    Ok(BindMount {
        source,
        target,
        writable,
    })
}

impl SandboxOpts {
    /// The flags that override settings, by setting name.
    pub fn overrides(&self) -> Vec<(String, String)> {
        let mut v: Vec<(String, String)> = Vec::new();
        let mut put = |k: &str, val: Option<String>| {
            if let Some(val) = val {
                v.push((k.into(), val));
            }
        };
        put(
            "workspace",
            self.workspace.as_ref().map(|p| p.display().to_string()),
        );
        put("sandbox.memory", self.memory.map(|n| n.to_string()));
        put("sandbox.pids", self.pids.map(|n| n.to_string()));
        put("sandbox.disk", self.disk.clone());
        put("sandbox.network", self.network.map(|n| n.to_string()));
        put(
            "network.allow",
            (!self.allow.is_empty()).then(|| self.allow.join(",")),
        );
        put("sandbox.display", self.display.map(|d| d.to_string()));
        put("sandbox.backend", self.backend.map(|b| b.to_string()));
        put("sandbox.cpus", self.cpus.map(|n| n.to_string()));
        put("sandbox.image", self.image.clone());
        put("vm.accel", self.vm_accel.map(|a| a.to_string()));
        let path = |p: &Option<PathBuf>| p.as_ref().map(|p| p.display().to_string());
        put("vm.kernel", path(&self.vm_kernel));
        put("vm.modules", path(&self.vm_modules));
        put("vm.qemu", path(&self.vm_qemu));
        v
    }

    /// The sandbox the settings with these flags on top describe, plus the
    /// flags that are not settings (binds, environment, /tmp). An error is
    /// printed here; the exit code is returned.
    pub async fn config(&self) -> Result<(SandboxConfig, Aftercheck), i32> {
        let settings = load_settings(self.overrides())?;
        let mut c = sandbox_config(&settings).map_err(config_error)?;
        c.tmp_size = self.tmp_size;
        c.host_certs = self.host_certs;
        publish(&mut c, &self.publish);
        c.env.extend(self.env.iter().cloned());
        let image_dir = crate::environment::apply(&mut c, &settings, self.user.as_deref())
            .await
            .map_err(config_error)?;
        if let Some(name) = &self.name {
            let Some(image) = c.image.as_mut() else {
                return Err(config_error(
                    "--name names a sandbox on an image for `cordon image commit`: give --image",
                ));
            };
            image.label = Some(name.clone());
        }
        c.workdir = self
            .workdir
            .clone()
            .or(image_dir)
            .unwrap_or_else(|| "/workspace".into());
        // The CLI holds nothing secret when it creates the sandbox.
        c.fork_supervisor = true;
        for b in &self.ro {
            c.binds.push(parse_bind(b, false).map_err(sandbox_error)?);
        }
        for b in &self.rw {
            c.binds.push(parse_bind(b, true).map_err(sandbox_error)?);
        }
        // The kernel behind run_code, when `cordon lab setup` installed it,
        // unless a bind of the user's takes its place.
        cordon_lab::offer(&mut c);
        guard_cordon_dirs(&mut c).map_err(config_error)?;
        let after = Aftercheck::new(&c, &settings);
        Ok((c, after))
    }
}

/// The look cordon takes once a sandbox on the workspace has ended, for
/// repositories and settings it may have left for the user's own tools
/// (see `cordon_sandbox::leftovers`); only when control files are
/// protected, since otherwise the user chose to let the sandbox write them.
pub struct Aftercheck {
    workspace: PathBuf,
    protected: Vec<PathBuf>,
    enabled: bool,
}

impl Aftercheck {
    pub fn new(c: &SandboxConfig, settings: &Settings) -> Aftercheck {
        Aftercheck {
            workspace: c.workspace.clone(),
            protected: c.read_only.clone(),
            enabled: settings.resolved().sandbox.protect_control_files,
        }
    }

    /// Says on stderr what was left, one line each.
    pub fn report(&self) {
        if !self.enabled {
            return;
        }
        for l in cordon_sandbox::leftovers(&self.workspace, &self.protected) {
            eprintln!(
                "cordon: warning: the sandbox left {} in the workspace: {}; read it before you run git or open an editor there",
                cordon_tools::printable(&l.path.to_string_lossy()),
                l.why
            );
        }
    }
}

/// Prints a configuration error; its exit code (78).
pub fn config_error(msg: impl std::fmt::Display) -> i32 {
    eprintln!("cordon: {msg}");
    crate::exit::CONFIG
}

fn sandbox_error(msg: impl std::fmt::Display) -> i32 {
    eprintln!("cordon: {msg}");
    crate::exit::SANDBOX
}

/// Every layer of settings with `cli` on top; what untrusted files set
/// and cordon ignored is said on stderr.
pub fn load_settings(cli: Vec<(String, String)>) -> Result<Settings, i32> {
    let settings = quiet_settings(cli)?;
    for line in ignored_notice(&settings) {
        eprintln!("cordon: {line}");
    }
    Ok(settings)
}

/// [`load_settings`] for a front end that shows the notice itself.
pub fn quiet_settings(cli: Vec<(String, String)>) -> Result<Settings, i32> {
    Settings::load(&Layers::from_process(cli)).map_err(config_error)
}

/// What the user is told about settings cordon did not take, one line each.
pub fn ignored_notice(settings: &Settings) -> Vec<String> {
    let mut lines: Vec<String> = settings.ignored().iter().map(|i| i.to_string()).collect();
    let from_project = settings.ignored().iter().any(|i| {
        i.file.ends_with(crate::settings::PROJECT_FILE)
            || i.file.ends_with(crate::settings::DOTENV_FILE)
    });
    if from_project {
        lines.push(
            "a sandbox may have written these files; `cordon trust` trusts them as they are now \
             (after you have read them)"
                .into(),
        );
    }
    lines
}

/// The sandbox the settings describe; the settings' secret-bearing project
/// files are hidden from it.
pub fn sandbox_config(settings: &Settings) -> Result<SandboxConfig, String> {
    let r = settings.resolved();
    let workspace = match &r.workspace {
        Some(w) => w.clone(),
        None => std::env::current_dir().map_err(|e| format!("current directory: {e}"))?,
    };
    let mut c = SandboxConfig::new(&workspace);
    let sb = &r.sandbox;
    c.set_limits(
        cordon_sandbox::Limits::new(sb.memory, sb.pids, sb.disk, sb.cpus.unwrap_or(1))
            .map_err(|e| e.to_string())?,
    );
    c.network = sb.network;
    if sb.network == Network::Full {
        eprintln!(
            "cordon: WARNING: --network full: the sandbox shares this machine's network. It can \
             reach every service here (databases and admin ports on localhost included) and on \
             your networks, and send anything it can read anywhere. Use --allow HOST instead \
             unless you trust everything this session will run."
        );
    }
    if sb.network == Network::Allow {
        // A secret's hosts are reachable: scoping it to them says so.
        let mut allow = sb.allow.clone();
        for secret in &sb.secrets {
            allow.extend(secret.hosts.iter().cloned());
        }
        let mut egress = cordon_sandbox::Egress::new(cordon_net::PolicySpec {
            allow,
            allow_private: sb.allow_private,
        });
        if !sb.secrets.is_empty() {
            let mut secrets = Vec::new();
            for s in &sb.secrets {
                // The value is read from the host's environment now, and
                // goes nowhere but the broker.
                let value = std::env::var(&s.from_env).map_err(|_| {
                    format!(
                        "network.secrets: {} takes its value from ${}, which is not set",
                        s.name, s.from_env
                    )
                })?;
                let secret = cordon_net::Secret::new(&s.name, &value, &s.hosts)
                    .map_err(|e| format!("network.secrets: {e}"))?;
                c.env.push((
                    s.env.clone().unwrap_or_else(|| s.name.clone()),
                    secret.placeholder().to_string(),
                ));
                secrets.push(secret);
            }
            let intercept =
                cordon_net::Intercept::new(secrets).map_err(|e| format!("network.secrets: {e}"))?;
            egress.broker.intercept = Some(std::sync::Arc::new(intercept));
        }
        c.egress = Some(egress);
    }
    c.display = sb.display;
    c.backend = sb.backend;
    c.vm = sb.vm.clone();
    c.favor_cgroup_changes = sb.cgroup_favordynmods;
    if sb.protect_control_files {
        c.read_only = cordon_sandbox::control_files(&workspace);
    }
    c.hidden = settings.secret_files().to_vec();
    Ok(c)
}

/// cordon's own directories, which no sandbox may hold: its configuration
/// (settings, MCP servers, the trusted files) and its data (sessions,
/// whose recorded workspace a resume would mount).
fn cordon_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(h) = crate::settings::config_home() {
        dirs.push(h.join("cordon"));
    }
    if let Some(d) = cordon_agent::sessions::sessions_dir().parent() {
        dirs.push(d.to_path_buf());
    }
    dirs
}

/// `path` made absolute with its existing part resolved, so that a
/// directory not created yet compares by where it would be.
fn resolved(path: &Path) -> PathBuf {
    let mut existing = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    let mut rest = Vec::new();
    loop {
        if let Ok(c) = existing.canonicalize() {
            return rest
                .iter()
                .rev()
                .fold(c, |p, n: &std::ffi::OsString| p.join(n));
        }
        match (existing.file_name(), existing.parent()) {
            (Some(n), Some(p)) => {
                rest.push(n.to_os_string());
                existing = p.to_path_buf();
            }
            _ => return existing,
        }
    }
}

/// Refuses a workspace or bind source reached through a symbolic link a
/// sandbox could have planted: the path itself, or any directory on the
/// way below the current directory (an earlier workspace, perhaps).
/// `--workspace ./frontend`, with `frontend` a link to `/etc` left by a
/// sandbox, would mount `/etc` read-write. Links above the current
/// directory (`/home` -> `/var/home`) are the system's and are followed.
///
/// Returns the path with those links resolved, as found by a walk that
/// holds each directory open: a sandbox swapping a directory for a link
/// meanwhile cannot slip it past the check. A path that does not open is
/// returned as given, for the sandbox to report.
fn resolve_refusing_planted_links(path: &Path, what: &str) -> Result<PathBuf, String> {
    use rustix::fs::{FileType, Mode, OFlags};
    use std::path::Component;
    let abs = std::path::absolute(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let cwd = std::env::current_dir()
        .ok()
        .and_then(|d| std::path::absolute(d).ok());
    let comps: Vec<Component> = abs.components().collect();
    let open = |at: &std::os::fd::OwnedFd, name: &std::ffi::OsStr, follow: bool| {
        let mut flags = OFlags::PATH | OFlags::CLOEXEC;
        if !follow {
            flags |= OFlags::NOFOLLOW;
        }
        rustix::fs::openat(at, name, flags, Mode::empty())
    };
    let Ok(mut fd) = rustix::fs::open("/", OFlags::PATH | OFlags::CLOEXEC, Mode::empty()) else {
        return Ok(path.to_path_buf());
    };
    let mut at = PathBuf::new();
    for (i, c) in comps.iter().enumerate() {
        at.push(c);
        let name = match c {
            Component::RootDir | Component::Prefix(_) | Component::CurDir => continue,
            Component::ParentDir => std::ffi::OsStr::new(".."),
            Component::Normal(n) => n,
        };
        let below_cwd = cwd.as_ref().is_some_and(|d| at.starts_with(d) && at != *d);
        let guarded = below_cwd || i + 1 == comps.len();
        let Ok(next) = open(&fd, name, !guarded) else {
            return Ok(path.to_path_buf());
        };
        let is_link = rustix::fs::fstat(&next)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Symlink);
        if is_link {
            let to = rustix::fs::readlinkat(&fd, name, Vec::new())
                .map(|t| t.to_string_lossy().into_owned())
                .unwrap_or_default();
            return Err(format!(
                "{what} {} is reached through the symbolic link {} (to {to}), which a sandbox \
                 could have planted; cordon follows none: give the real path",
                path.display(),
                at.display()
            ));
        }
        fd = next;
    }
    Ok(std::fs::read_link(format!(
        "/proc/self/fd/{}",
        std::os::fd::AsRawFd::as_raw_fd(&fd)
    ))
    .unwrap_or_else(|_| path.to_path_buf()))
}

/// Refuses a workspace or bind that holds cordon's own directories or the
/// user's home: a sandbox there could rewrite the configuration that
/// starts host programs, or read the keys in it.
pub fn guard_cordon_dirs(c: &mut SandboxConfig) -> Result<(), String> {
    c.workspace = resolve_refusing_planted_links(&c.workspace, "the workspace")?;
    for b in &mut c.binds {
        b.source = resolve_refusing_planted_links(&b.source, "the bind source")?;
    }
    // Resolved here: a link on these paths from now on was planted since.
    c.follow_links = false;
    let own = cordon_dirs();
    let shared = std::iter::once((&c.workspace, "the workspace"))
        .chain(c.binds.iter().map(|b| (&b.source, "a bind")));
    for (path, what) in shared {
        let p = resolved(path);
        for d in &own {
            if resolved(d).starts_with(&p) {
                return Err(format!(
                    "{what} {} holds cordon's own {}: a sandbox could rewrite cordon's \
                     configuration or sessions there; choose a narrower directory",
                    path.display(),
                    d.display()
                ));
            }
        }
        // Shell start-up files, SSH keys, every tool's configuration: what
        // the user's own programs read and run from without asking.
        if let Some(home) = std::env::var_os("HOME").map(PathBuf::from)
            && home.is_absolute()
            && resolved(&home).starts_with(&p)
        {
            return Err(format!(
                "{what} {} holds your home directory {}: a sandbox could rewrite what \
                 your shell and tools run from there (~/.bashrc, ~/.ssh); choose a \
                 narrower directory",
                path.display(),
                home.display()
            ));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_and_binds_parse() {
        assert_eq!(parse_env("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(parse_env("novalue").is_err());
        assert!(parse_env("=x").is_err());
        let b = parse_bind("/opt/data:/data", false).unwrap();
        assert_eq!(
            (b.source, b.target.as_str(), b.writable),
            (PathBuf::from("/opt/data"), "/data", false)
        );
        let b = parse_bind("/srv", true).unwrap();
        assert_eq!(b.target, "/srv");
    }
}
