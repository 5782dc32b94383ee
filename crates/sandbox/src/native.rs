//! The `native` backend: Linux namespaces, set up by the supervisor.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::pin::Pin;
use std::sync::Mutex;
use std::time::Duration;

use crate::backend::{Backend, WritableLayer, resolve_supervisor, utf8};
use crate::cgroup::{self, Cgroup, LimitMechanism};
use crate::config::{Network, SandboxConfig, in_workspace};
use crate::error::{Error, Result};
use crate::layout::{CONTROL_FD, SERVICES_FD};
use crate::protocol::{self, HostMsg, SetupSpec};
use crate::services::{Channel, Services};
use crate::session::{ConnectParams, Lifecycle, Sandbox};
use crate::supervisor::SUPERVISOR_ARG;

/// Linux namespaces, seccomp, Landlock and cgroups, no daemon.
#[derive(Debug, Default, Clone, Copy)]
pub struct NativeBackend;

impl Backend for NativeBackend {
    fn name(&self) -> &'static str {
        "native"
    }

    fn create<'a>(
        &'a self,
        config: &'a SandboxConfig,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<Sandbox>> + Send + 'a>> {
        Box::pin(create(config))
    }
}

struct NativeLifecycle {
    /// The outer supervisor, our child; reaped exactly once.
    pid: i32,
    reaped: Mutex<bool>,
    cgroup: Mutex<Option<Cgroup>>,
    /// An image root's writable layer, removed once the sandbox is gone.
    scratch: Mutex<Option<WritableLayer>>,
}

impl NativeLifecycle {
    /// Waits up to `grace` for the outer supervisor to exit, then kills it;
    /// either way it is reaped before this returns.
    fn wait(&self, grace: Duration) {
        let mut reaped = self.reaped.lock().unwrap();
        if *reaped {
            return;
        }
        let pid = rustix::process::Pid::from_raw(self.pid).expect("a child pid is positive");
        // A pidfd lets us sleep until the exit instead of polling for it.
        let exited = match rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) {
            Ok(fd) => {
                let mut fds = [rustix::event::PollFd::new(
                    &fd,
                    rustix::event::PollFlags::IN,
                )];
                let ts = rustix::event::Timespec {
                    tv_sec: grace.as_secs() as i64,
                    tv_nsec: grace.subsec_nanos() as i64,
                };
                matches!(rustix::event::poll(&mut fds, Some(&ts)), Ok(n) if n > 0)
            }
            Err(_) => false,
        };
        if !exited {
            // SAFETY: signalling our own unreaped child.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            }
        }
        let mut status = 0;
        // SAFETY: reaping our own child.
        while unsafe { libc::waitpid(self.pid, &mut status, 0) } < 0
            && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
        {}
        *reaped = true;
    }
}

impl Lifecycle for NativeLifecycle {
    fn oom_kills(&self) -> Option<u64> {
        self.cgroup.lock().unwrap().as_ref()?.oom_kills()
    }

    fn memory(&self) -> Option<(u64, Option<u64>)> {
        self.cgroup.lock().unwrap().as_ref()?.memory()
    }

    fn freeze(&self, frozen: bool, _to_disk: bool) -> std::io::Result<()> {
        match self.cgroup.lock().unwrap().as_ref() {
            Some(cg) => cg.freeze(frozen),
            None => Err(std::io::Error::new(
                std::io::ErrorKind::Unsupported,
                "no cgroup: pausing needs cgroup v2 delegated, or v1's freezer writable (root)",
            )),
        }
    }

    fn kill(&self) {
        // SIGKILL to the outer supervisor; the inner one (pid 1 of the
        // sandbox) has it as its parent-death signal, and its death takes
        // the whole pid namespace with it.
        if !*self.reaped.lock().unwrap() {
            // SAFETY: signalling our own child, which we have not reaped.
            unsafe {
                libc::kill(self.pid, libc::SIGKILL);
            }
        }
        let pid = self.pid;
        let cgroup = self.cgroup.lock().unwrap().take();
        if let Some(cg) = &cgroup {
            cg.kill_all();
            cg.thaw();
        }
        let needs_reap = !std::mem::replace(&mut *self.reaped.lock().unwrap(), true);
        // An image's writable layer stays for `reap`, or goes with this
        // handle: a thread here may not outlive a process about to exit.
        if needs_reap || cgroup.is_some() {
            // Reaping and cgroup removal wait on the kernel: not on the
            // caller's thread, which may be an async runtime's.
            std::thread::spawn(move || {
                if needs_reap {
                    let mut status = 0;
                    // SAFETY: reaping our own child.
                    unsafe { libc::waitpid(pid, &mut status, 0) };
                }
                drop(cgroup);
            });
        }
    }

    fn host_pid(&self) -> i32 {
        self.pid
    }

    fn reap(&self, grace: Duration) {
        // A paused sandbox ends as any other: thawed, it hears the end.
        if let Some(cg) = self.cgroup.lock().unwrap().as_ref() {
            cg.thaw();
        }
        self.wait(grace);
        if let Some(mut cg) = self.cgroup.lock().unwrap().take() {
            cg.remove();
        }
        drop(self.scratch.lock().unwrap().take());
    }

    fn writable_layer(&self) -> Option<std::path::PathBuf> {
        // Its upper and work directories, or its disk.
        let scratch = self.scratch.lock().unwrap();
        Some(scratch.as_ref()?.dir().to_path_buf())
    }
}

/// True when this process has exactly one thread, read from the kernel.
fn single_threaded() -> bool {
    std::fs::read_to_string("/proc/self/stat")
        .ok()
        .and_then(|s| {
            // Field 20 (num_threads) counts from after the ")" of comm.
            let rest = s.rsplit_once(')')?.1;
            rest.split_whitespace().nth(17)?.parse::<u32>().ok()
        })
        == Some(1)
}

/// Starts the outer supervisor with `child_end` as its fd 3, returning its pid.
///
/// With [`SandboxConfig::fork_supervisor`], a single-threaded host (such as
/// `cordon run` before it starts reading stdin) forks and runs the
/// supervisor in the child directly, saving a second exec of this binary,
/// which costs more than the rest of the sandbox's start-up. Otherwise it
/// execs: after `fork` in a multi-threaded process only async-signal-safe
/// calls are allowed, and an exec leaves the host's memory behind.
fn spawn_supervisor(
    config: &SandboxConfig,
    child_end: OwnedFd,
    services: Option<BorrowedFd<'_>>,
) -> Result<i32> {
    // Above the numbers they are moved to, so that moving one cannot
    // overwrite the other.
    let high = |fd: BorrowedFd<'_>| rustix::io::fcntl_dupfd_cloexec(fd, SERVICES_FD + 1);
    let child_end = high(child_end.as_fd()).map_err(|e| Error::Io(e.into()))?;
    let services = services
        .map(high)
        .transpose()
        .map_err(|e| Error::Io(e.into()))?;
    let raw = child_end.as_raw_fd();
    let svc = services.as_ref().map(|fd| fd.as_raw_fd());
    let debug = std::env::var_os("CORDON_DEBUG_SUPERVISOR").is_some();
    let explicit = config.supervisor.is_some() || std::env::var_os("CORDON_SUPERVISOR").is_some();
    if config.fork_supervisor && !explicit && single_threaded() {
        let devnull = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open("/dev/null")?;
        let null = devnull.as_raw_fd();
        // SAFETY: the process is single-threaded, so the child may run
        // ordinary code; it never returns into the host's code.
        let pid = unsafe { libc::fork() };
        if pid < 0 {
            return Err(Error::Io(std::io::Error::last_os_error()));
        }
        if pid == 0 {
            // SAFETY: rearranging descriptors in the fresh child.
            unsafe {
                libc::setpgid(0, 0);
                libc::dup2(null, 0);
                libc::dup2(null, 1);
                if !debug {
                    libc::dup2(null, 2);
                }
                libc::dup2(raw, CONTROL_FD);
                if let Some(svc) = svc {
                    libc::dup2(svc, SERVICES_FD);
                }
            }
            crate::supervisor::forked_main();
        }
        return Ok(pid);
    }

    let supervisor = resolve_supervisor(config)?;
    let mut cmd = std::process::Command::new(&supervisor);
    cmd.arg(SUPERVISOR_ARG)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        // Keep the terminal's Ctrl-C away from the sandbox: the front end
        // decides what an interrupt means.
        .process_group(0);
    if !debug {
        cmd.stderr(std::process::Stdio::null());
    }
    // SAFETY: dup2 and fcntl are async-signal-safe; `raw` stays open until
    // spawn returns.
    unsafe {
        cmd.pre_exec(move || {
            // Both sources are above both targets (see `high`), and dup2's
            // copies do not close on exec.
            if libc::dup2(raw, CONTROL_FD) < 0
                || svc.is_some_and(|svc| libc::dup2(svc, SERVICES_FD) < 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = cmd.spawn().map_err(|e| Error::Spawn {
        path: supervisor.clone(),
        source: e,
    })?;
    // Reaped by NativeLifecycle through its pid; std's handle does not reap
    // on drop.
    Ok(child.id() as i32)
}

async fn create(config: &SandboxConfig) -> Result<Sandbox> {
    // Each phase's end, logged at debug (`CORDON_LOG=cordon_sandbox::native=debug`).
    let began = std::time::Instant::now();
    let (workspace, binds) = config.validate()?;
    let mech = cgroup::detect();
    if config.favor_cgroup_changes
        && matches!(mech, LimitMechanism::V1 { .. })
        && rustix::process::geteuid().is_root()
    {
        cgroup::favor_dynmods();
    }
    let cgroup = match &mech {
        LimitMechanism::Rlimit { .. } => None,
        m => Some(Cgroup::create(m, config.memory, config.pids).map_err(Error::Limits)?),
    };

    let (image, scratch) = match &config.image {
        Some(image) => {
            let (root, dir) = image_root(image, config.disk)?;
            (Some(root), Some(dir))
        }
        None => (None, None),
    };
    let prepared = began.elapsed();
    let services = Services::start(config, &workspace, Channel::Socket).await?;
    let (host, child_end) = std::os::unix::net::UnixStream::pair()?;
    let pid = services.with_sandbox_end(|svc| spawn_supervisor(config, child_end.into(), svc))?;
    services.launched();
    if let Some(layer) = &scratch {
        // Where `cordon image commit` from another process finds the
        // layer's disk (see `live_upper`).
        std::fs::write(
            layer.dir().join(crate::backend::SUPERVISOR_FILE),
            pid.to_string(),
        )?;
    }
    let lifecycle = NativeLifecycle {
        pid,
        reaped: Mutex::new(false),
        cgroup: Mutex::new(None),
        scratch: Mutex::new(scratch),
    };
    if let Some(cg) = cgroup {
        // Before the supervisor reads its setup message, so that every
        // process of the sandbox is born inside the cgroup.
        if let Err(e) = cg.add(pid as u32) {
            lifecycle.kill();
            drop(cg);
            return Err(Error::Limits(e));
        }
        *lifecycle.cgroup.lock().unwrap() = Some(cg);
    }
    let spawned = began.elapsed();
    let rlimits = matches!(mech, LimitMechanism::Rlimit { .. });
    let spec = SetupSpec {
        version: protocol::VERSION,
        hidden: in_workspace(&config.hidden, &workspace),
        read_only: in_workspace(&config.read_only, &workspace),
        workspace,
        binds,
        tmp_size: config.tmp_size,
        loopback: matches!(config.network, Network::Loopback | Network::Allow),
        hostname: config.hostname.clone(),
        outer_uid: rustix::process::geteuid().as_raw(),
        outer_gid: rustix::process::getegid().as_raw(),
        inner_uid: config
            .image
            .as_ref()
            .map_or(rustix::process::geteuid().as_raw(), |i| i.uid),
        inner_gid: config
            .image
            .as_ref()
            .map_or(rustix::process::getegid().as_raw(), |i| i.gid),
        rlimit_memory: if rlimits { config.memory } else { None },
        rlimit_nproc: if rlimits { config.pids } else { None },
        user_counts: Some(user_counts(pid)),
        // One byte over: a file that reaches the limit has passed the
        // budget, and the watcher reports it.
        rlimit_fsize: config.disk.map(|d| d.saturating_add(1)),
        nice: config.disk.map(|_| crate::config::budgeted_nice()),
        proxy_port: services.proxy_port(),
        host_network: config.network == Network::Full,
        trust: crate::egress::trust(config),
        image,
        guest_image: false,
    };
    host.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(host)?;
    let made = Sandbox::connect(
        stream,
        ConnectParams::new(
            config,
            crate::config::BackendKind::Native,
            HostMsg::Setup(Box::new(spec)),
            Box::new(lifecycle),
            mech.to_string(),
            services,
        ),
    )
    .await;
    tracing::debug!(?prepared, ?spawned, ready = ?began.elapsed(), ok = made.is_ok(), "native start");
    made
}

/// An image root's setup: its layers, a writable layer's directory of this
/// sandbox's own, and where its ids come from.
fn image_root(
    image: &crate::config::RootImage,
    budget: Option<u64>,
) -> Result<(protocol::ImageRoot, WritableLayer)> {
    let root = rustix::process::geteuid().is_root() && in_initial_user_namespace();
    let ids = if root {
        protocol::IdSource::Allocated
    } else {
        crate::subids::subordinate(rustix::process::geteuid().as_raw())?
    };
    if !root {
        // Root's sandboxes show the workspace as the image user's through
        // an idmapped mount, which only root may make.
        image.warn_workspace_unwritable(
            "when cordon runs unprivileged (it is yours, root's inside)",
            "cordon as root",
        );
    }
    if image.upper_from.is_some() {
        return Err(Error::Config(
            "a writable layer copied from a disk is for the microvm backend: a native \
             sandbox's root changes are a directory"
                .into(),
        ));
    }
    let layer = WritableLayer::new(image)?;
    if let protocol::IdSource::Subordinate { uid, gid, count } = ids {
        std::fs::write(
            layer.dir().join(crate::backend::IDS_FILE),
            format!("{uid} {gid} {count}\n"),
        )?;
    }
    // Root can mount it: with a budget, the layer is a disk that size, a
    // hard bound (without root, the disk watcher alone holds it).
    let disk = match budget {
        Some(size) if root && image.step.is_none() => {
            Some(utf8(&layer.make_disk(size, "cordon-layer")?, "disk")?)
        }
        _ => None,
    };
    let layers = image
        .layers
        .iter()
        .map(|l| utf8(l, "layer"))
        .collect::<Result<Vec<_>>>()?;
    let root = protocol::ImageRoot {
        layers,
        scratch: utf8(layer.dir(), "writable layer")?,
        ids,
        disk,
        step: match &image.step {
            None => None,
            Some(s) => {
                let status = s.status();
                std::fs::File::create(&status)?;
                Some(protocol::StepOutput {
                    tar: utf8(&s.changes, "a build step's changes")?,
                    status: utf8(&status, "a build step's status")?,
                    skip: s.skip.clone(),
                })
            }
        },
    };
    Ok((root, layer))
}

/// A sandbox may take this fraction of each per-user count of its host uid,
/// so that the host's own processes keep most of theirs even while several
/// sandboxes of the same uid (an unprivileged user's) hold all they may.
const USER_COUNT_SHARE: u64 = 8;

/// Host uids `OWNER_UID_BASE + pid` own root's sandboxes' user namespaces:
/// far above any real account's uid, distinct for each live supervisor.
const OWNER_UID_BASE: u32 = 0xB000_0000;

/// The sandbox whose outer supervisor is `pid`: its share of the per-user
/// counts (see `supervisor::counts`), from this host's limits.
fn user_counts(pid: i32) -> protocol::UserCounts {
    use rustix::process::{Resource, getrlimit};
    let share = |v: u64| (v / USER_COUNT_SHARE).max(1);
    let namespace_max = protocol::UserCount::ALL
        .into_iter()
        .filter_map(|c| {
            let host = std::fs::read_to_string(format!("/proc/sys/user/{}", c.sysctl())).ok()?;
            Some((c, share(host.trim().parse().ok()?)))
        })
        .collect();
    // An unlimited host limit still leaves the sandbox the kernel's usual
    // default for an ordinary user.
    let rlimit = |r, usual: u64| share(getrlimit(r).current.unwrap_or(usual));
    let owner_uid = (rustix::process::geteuid().is_root() && in_initial_user_namespace())
        .then(|| OWNER_UID_BASE + pid as u32);
    protocol::UserCounts {
        namespace_max,
        sigpending: rlimit(Resource::Sigpending, 63_000),
        msgqueue: rlimit(Resource::Msgqueue, 819_200),
        memlock: rlimit(Resource::Memlock, 8 << 20),
        owner_uid,
    }
}

/// Whether this process's ids are the host's own: root in a container's
/// user namespace has no other uid to give a sandbox.
pub(crate) fn in_initial_user_namespace() -> bool {
    std::fs::read_to_string("/proc/self/uid_map")
        .is_ok_and(|m| m.split_whitespace().collect::<Vec<_>>() == ["0", "0", "4294967295"])
}

/// Host facts that decide whether and how sandboxes work here, for
/// `cordon doctor`: (check, value) pairs.
pub fn host_report() -> Vec<(String, String)> {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .map(|s| s.trim().to_string())
            .unwrap_or_else(|_| "absent".into())
    };
    let uid = rustix::process::geteuid().as_raw();
    vec![
        (
            "user".into(),
            if uid == 0 {
                "root (uid 0)".into()
            } else {
                format!("unprivileged (uid {uid})")
            },
        ),
        ("kernel".into(), read("/proc/sys/kernel/osrelease")),
        (
            "kernel.unprivileged_userns_clone".into(),
            read("/proc/sys/kernel/unprivileged_userns_clone"),
        ),
        (
            "user.max_user_namespaces".into(),
            read("/proc/sys/user/max_user_namespaces"),
        ),
        (
            "kernel.apparmor_restrict_unprivileged_userns".into(),
            read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns"),
        ),
        (
            "landlock ABI".into(),
            crate::supervisor::landlock_abi_version().to_string(),
        ),
        ("limits mechanism".into(), cgroup::detect().to_string()),
        ("cgroup attach".into(), cgroup::attach_report()),
        ("image ids".into(), image_ids_report()),
    ]
}

/// Where an image sandbox's ids would come from here, for `cordon doctor`.
fn image_ids_report() -> String {
    if rustix::process::geteuid().is_root() && in_initial_user_namespace() {
        return "a range of 65536 host ids per sandbox (root)".into();
    }
    match crate::subids::subordinate(rustix::process::geteuid().as_raw()) {
        Ok(protocol::IdSource::Subordinate { uid, count, .. }) => {
            format!(
                "subordinate ids {uid} to {} (/etc/subuid)",
                u64::from(uid) + u64::from(count) - 1
            )
        }
        Ok(protocol::IdSource::Allocated) => "a range per sandbox".into(),
        Err(e) => format!("none: {e}"),
    }
}
