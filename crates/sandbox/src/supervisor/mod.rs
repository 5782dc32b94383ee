//! The in-sandbox supervisor.
//!
//! The host starts the current executable (normally `cordon`) with
//! [`SUPERVISOR_ARG`] and the control socket on fd 3. That process (the
//! *outer* supervisor) reads the [`SetupSpec`], enters new user, mount, pid,
//! net, ipc, uts and cgroup namespaces, and forks the *inner* supervisor,
//! which is pid 1 of the sandbox: it builds the root filesystem, confines
//! itself, reports `Ready` and then serves exec requests until the host says
//! `Shutdown` or goes away. When pid 1 exits the kernel kills every process
//! left in the namespace, so nothing outlives the session.

pub(crate) mod confine;
mod counts;
mod error;
mod fs;
mod guest;
mod idmap;
mod ids;
mod image;
pub(crate) mod mount;
pub(crate) mod protect;
mod relay;
mod serve;
pub(crate) mod setid;
mod setup;
mod watch;

use std::io::{Read, Write};
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::io::Errno;
use rustix::thread::UnshareFlags;

use crate::layout::{CONTROL_FD, SERVICES_FD};
use crate::protocol::{self, HostMsg, ReadyInfo, SetupSpec, SupMsg};
use error::SetupError;

pub use confine::landlock_abi_version;

/// The hidden first argument that turns a binary into the supervisor.
pub const SUPERVISOR_ARG: &str = "__cordon-supervisor";

/// The same for the supervisor as a microVM guest's pid 1 (see guest.rs).
pub const SUPERVISOR_GUEST_ARG: &str = "__cordon-guest";

/// Runs the supervisor and never returns if the process was started as one;
/// returns immediately otherwise. Call it first thing in `main`, before any
/// thread is spawned: namespaces can only be entered by a single-threaded
/// process.
pub fn run_if_supervisor() {
    let mut args = std::env::args_os();
    let _ = args.next();
    match args.next() {
        Some(a) if a == SUPERVISOR_ARG => {
            // Exec'd, it keeps what its host ignored (a server started with
            // `nohup … &` ignores SIGHUP, SIGINT and SIGQUIT): its commands
            // must not, or a trap on SIGINT could never fire.
            default_signals();
            outer_main()
        }
        // Only as a guest's init: anywhere else its mounts would land on
        // the host.
        Some(a) if a == SUPERVISOR_GUEST_ARG && std::process::id() == 1 => guest::guest_main(),
        _ => {}
    }
}

/// Ends the process without running exit handlers: when the supervisor was
/// forked from a host process rather than exec'd, those belong to the host
/// (its buffered output, for one, must not be flushed twice).
pub(crate) fn exit_now(code: i32) -> ! {
    // SAFETY: _exit is always safe to call.
    unsafe { libc::_exit(code) }
}

/// Set in a microVM guest, where the supervisor is the kernel's init and
/// ending the sandbox means powering the machine off.
static IN_GUEST: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Ends the sandbox from its init: exits (native: the kernel then kills
/// the pid namespace) or powers the guest off (microvm).
pub(crate) fn end_sandbox() -> ! {
    end_sandbox_with(0)
}

fn end_sandbox_with(code: i32) -> ! {
    if IN_GUEST.load(std::sync::atomic::Ordering::Relaxed) {
        rustix::fs::sync();
        // SAFETY: reboot(2) with a valid command; as init we may.
        unsafe { libc::reboot(libc::RB_POWER_OFF) };
    }
    exit_now(code)
}

fn send(ctl: &mut impl Write, msg: &SupMsg) {
    let mut buf = Vec::new();
    protocol::encode(msg, &mut buf);
    // If the host is gone there is nobody to tell.
    let _ = ctl.write_all(&buf);
}

fn fail(ctl: &mut impl Write, err: SetupError) -> ! {
    send(
        ctl,
        &SupMsg::SetupFailed {
            message: err.message(),
            errno: err.errno,
        },
    );
    end_sandbox_with(1);
}

/// Reads the setup message, which must come first and speak our version.
fn read_setup(ctl: &mut impl Read) -> Result<SetupSpec, SetupError> {
    let spec = read_setup_message(ctl)?;
    if spec.version != protocol::VERSION {
        return Err(SetupError {
            what: format!(
                "protocol version mismatch: host {}, supervisor {}",
                spec.version,
                protocol::VERSION
            ),
            errno: 0,
        });
    }
    Ok(spec)
}

fn read_setup_message(ctl: &mut impl Read) -> Result<SetupSpec, SetupError> {
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    loop {
        match protocol::decode::<HostMsg>(&buf) {
            Ok(Some((HostMsg::Setup(spec), _))) => return Ok(*spec),
            Ok(Some(_)) => {
                return Err(SetupError {
                    what: "protocol error: expected the setup message first".into(),
                    errno: 0,
                });
            }
            Ok(None) => {}
            Err(e) => {
                return Err(SetupError {
                    what: format!("protocol error: {e}"),
                    errno: 0,
                });
            }
        }
        let n = ctl.read(&mut chunk).map_err(|e| {
            SetupError::new("read setup", Errno::from_io_error(&e).unwrap_or(Errno::IO))
        })?;
        if n == 0 {
            end_sandbox_with(1);
        }
        buf.extend_from_slice(&chunk[..n]);
    }
}

/// Entry point in a child forked (not exec'd) by a single-threaded host,
/// with the control socket already on fd 3. Inherited signal handlers and
/// masks belong to the host and are reset first.
pub(crate) fn forked_main() -> ! {
    default_signals();
    // SAFETY: naming this fresh child.
    unsafe {
        libc::prctl(libc::PR_SET_NAME, c"cordon-sandbox".as_ptr());
    }
    scrub_args_and_environment();
    outer_main()
}

/// Every signal's disposition back to the default, and none blocked: what
/// the host ignored or blocked is not the sandbox's.
fn default_signals() {
    // SAFETY: resetting dispositions and the mask of this single-threaded
    // process, before it runs anything else.
    unsafe {
        for sig in 1..libc::SIGRTMIN() {
            if sig != libc::SIGKILL && sig != libc::SIGSTOP {
                libc::signal(sig, libc::SIG_DFL);
            }
        }
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
}

/// Overwrites the host's command line and environment strings, which a
/// forked supervisor still carries and `/proc/1/cmdline` would show.
fn scrub_args_and_environment() {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return;
    };
    let Some((_, rest)) = stat.rsplit_once(')') else {
        return;
    };
    // After comm, fields 3.. ; arg_start..env_end are fields 48..51.
    let f: Vec<usize> = rest
        .split_whitespace()
        .skip(45)
        .take(4)
        .filter_map(|x| x.parse().ok())
        .collect();
    let [arg_start, arg_end, env_start, env_end] = f[..] else {
        return;
    };
    for (start, end) in [(arg_start, arg_end), (env_start, env_end)] {
        if start == 0 || end <= start || end - start > (1 << 20) {
            continue;
        }
        // SAFETY: the kernel reports these ranges as this process's own
        // argument and environment strings, which live in its writable
        // initial stack; nothing reads them after this point.
        unsafe { std::ptr::write_bytes(start as *mut u8, 0, end - start) };
    }
    let name = b"cordon-sandbox";
    if arg_end - arg_start > name.len() {
        // SAFETY: as above, within the argument area.
        unsafe { std::ptr::copy_nonoverlapping(name.as_ptr(), arg_start as *mut u8, name.len()) };
    }
}

fn outer_main() -> ! {
    // SAFETY: the host passes the control socket as fd 3 and nothing else
    // in this process owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    let mut ctl = UnixStream::from(fd);
    // Nothing but the control socket (and the services channel, when the
    // setup asks for a service) may cross into the sandbox, and even those
    // must not reach the commands it runs.
    // SAFETY: plain syscalls on descriptor numbers.
    unsafe {
        libc::syscall(libc::SYS_close_range, SERVICES_FD + 1, u32::MAX, 0);
        libc::fcntl(CONTROL_FD, libc::F_SETFD, libc::FD_CLOEXEC);
        libc::fcntl(SERVICES_FD, libc::F_SETFD, libc::FD_CLOEXEC);
    }
    let spec = match read_setup(&mut ctl) {
        Ok(s) => s,
        Err(e) => fail(&mut ctl, e),
    };
    // Without a service, whatever is at the services number is not ours
    // (a forked supervisor inherits the host's descriptors).
    let services = if spec.proxy_port.is_some() {
        // SAFETY: the host put the services channel there for this setup.
        Some(unsafe { OwnedFd::from_raw_fd(SERVICES_FD) })
    } else {
        // SAFETY: closing a descriptor number nothing here uses.
        unsafe { libc::close(SERVICES_FD) };
        None
    };
    let mut flags = UnshareFlags::NEWUSER
        | UnshareFlags::NEWNS
        | UnshareFlags::NEWPID
        | UnshareFlags::NEWNET
        | UnshareFlags::NEWIPC
        | UnshareFlags::NEWUTS
        | UnshareFlags::NEWCGROUP;
    if spec.host_network {
        flags.remove(UnshareFlags::NEWNET);
    }
    let (prepared, mut held) = match enter_namespaces(&spec, flags) {
        Ok(done) => done,
        Err(e) => fail(&mut ctl, e),
    };
    // SAFETY: this process is single-threaded, so the child may do anything.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        fail(
            &mut ctl,
            SetupError::new(
                "fork the sandbox init",
                Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::IO),
            ),
        );
    }
    if pid == 0 {
        // The outer supervisor's to hold; the lock stays with its copy.
        drop(held);
        inner_main(ctl, services, spec, prepared);
    }
    drop(ctl);
    drop(services);
    let mut status = 0;
    loop {
        // SAFETY: waiting on our own child.
        let r = unsafe { libc::waitpid(pid, &mut status, 0) };
        if r == pid
            || (r < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
        {
            break;
        }
    }
    if let Some(scratch) = &held.scratch {
        if let Some(step) = held.step.take() {
            image::write_step(scratch, step);
        }
        image::remove_scratch(scratch);
    }
    drop(held);
    exit_now(if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else {
        1
    });
}

/// What the outer supervisor holds for an image sandbox until it ends.
#[derive(Default)]
struct Held {
    /// The lock on root's range of ids.
    _range: Option<OwnedFd>,
    /// The writable layer's directory, emptied once the sandbox is gone.
    scratch: Option<OwnedFd>,
    /// A build step's output, written before the layer is emptied.
    step: Option<image::Step>,
}

/// Enters the sandbox's namespaces with its id maps, and prepares what must
/// be opened while the supervisor still has the host's view: idmapped
/// mounts and an image's writable layer.
fn enter_namespaces(
    spec: &SetupSpec,
    flags: UnshareFlags,
) -> Result<(idmap::Prepared, Held), SetupError> {
    use protocol::IdSource;
    let owner = spec.user_counts.as_ref().and_then(|c| c.owner_uid);
    match spec.image.as_ref().map(|i| (i, i.ids)) {
        Some((image, IdSource::Allocated)) => {
            let Some(_) = owner else {
                return Err(SetupError {
                    what: "an image's ids need root in the host's user namespace".into(),
                    errno: 0,
                });
            };
            let (base, lock) = ids::allocate_range()?;
            let maps = ids::IdMaps::allocated(base);
            if let Some(disk) = &image.disk {
                image::mount_disk(image, disk)?;
            }
            let scratch = image::make_scratch(image, Some(base))?;
            let step = image::Step::open(image)?;
            // Made while this process still holds root's capabilities.
            let cannot = || SetupError {
                what: "the image store's or the workspace's file system cannot be idmapped \
                       (cordon needs that to run an image as root)"
                    .into(),
                errno: 0,
            };
            let mut prepared =
                idmap::prepare(&maps, &setup::image_layers_wanted(spec))?.ok_or_else(cannot)?;
            let workspace = ids::IdMaps::workspace(base, spec.inner_uid, spec.inner_gid);
            prepared
                .merge(idmap::prepare(&workspace, &setup::idmap_wanted(spec))?.ok_or_else(cannot)?);
            // Reached again only after the switch, as a uid the store's
            // directories do not admit.
            prepared.clone_plain(&image.scratch)?;
            if !counts::unshare_owned_by(base, flags, spec, Some(&maps))? {
                return Err(SetupError {
                    what: "could not switch to the image sandbox's own host ids".into(),
                    errno: 0,
                });
            }
            Ok((
                prepared,
                Held {
                    _range: Some(lock),
                    scratch: Some(scratch),
                    step,
                },
            ))
        }
        Some((image, IdSource::Subordinate { uid, gid, count })) => {
            let scratch = image::make_scratch(image, None)?;
            let step = image::Step::open(image)?;
            ids::unshare_subordinate(flags, spec, (uid, gid, count))?;
            Ok((
                idmap::Prepared::default(),
                Held {
                    _range: None,
                    scratch: Some(scratch),
                    step,
                },
            ))
        }
        None => {
            // Made while this process still holds root's capabilities.
            let mut prepared = match owner {
                Some(o) => idmap::prepare(
                    &ids::IdMaps::single((0, o), (0, o)),
                    &setup::idmap_wanted(spec),
                )?,
                None => None,
            };
            let owned = match owner {
                Some(owner) => {
                    let maps = ids::IdMaps::single((0, owner), (0, owner));
                    counts::unshare_owned_by(
                        owner,
                        flags,
                        spec,
                        prepared.is_some().then_some(&maps),
                    )?
                }
                None => false,
            };
            if !owned {
                // The uid switch was refused: the sandbox keeps the caller's ids.
                prepared = None;
                // SAFETY: single-threaded; we fork before relying on the new pid ns.
                if let Err(e) = unsafe { rustix::thread::unshare_unsafe(flags) } {
                    return Err(SetupError {
                        what: userns_diagnosis(e),
                        errno: 0,
                    });
                }
                ids::write_id_maps(spec)?;
            }
            Ok((prepared.unwrap_or_default(), Held::default()))
        }
    }
}

/// Names the host setting that forbids user namespaces, when one does.
fn userns_diagnosis(e: Errno) -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let base = format!(
        "cannot create user namespaces ({})",
        std::io::Error::from(e)
    );
    if let Some("0") = read("/proc/sys/kernel/unprivileged_userns_clone").as_deref() {
        return format!(
            "{base}: unprivileged user namespaces are disabled; run `sysctl -w kernel.unprivileged_userns_clone=1`"
        );
    }
    if let Some("1") = read("/proc/sys/kernel/apparmor_restrict_unprivileged_userns").as_deref() {
        return format!(
            "{base}: AppArmor restricts unprivileged user namespaces; run `sysctl -w kernel.apparmor_restrict_unprivileged_userns=0` or give cordon an AppArmor profile that allows them"
        );
    }
    if let Some("0") = read("/proc/sys/user/max_user_namespaces").as_deref() {
        return format!(
            "{base}: user.max_user_namespaces is 0; run `sysctl -w user.max_user_namespaces=15000`"
        );
    }
    if e == Errno::NOSPC {
        return format!(
            "{base}: the user namespace limit is reached; raise `user.max_user_namespaces`"
        );
    }
    format!(
        "{base}: blocked by the host (a seccomp policy, a security module, or a container that forbids them)"
    )
}

fn inner_main(
    mut ctl: UnixStream,
    services: Option<OwnedFd>,
    spec: SetupSpec,
    mut prepared: idmap::Prepared,
) -> ! {
    // If the outer supervisor is killed, take the whole sandbox down.
    let _ = rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::KILL));
    let result = (|| -> Result<ReadyInfo, SetupError> {
        rustix::system::sethostname(spec.hostname.as_bytes())
            .map_err(|e| SetupError::new("set hostname", e))?;
        setup::build_root(&spec, &mut prepared)?;
        if spec.loopback {
            setup::loopback_up()?;
        }
        if let (Some(port), Some(channel)) = (spec.proxy_port, &services) {
            setup::hand_over_proxy_listener(port, channel)?;
        }
        drop(services);
        let mut writable = vec!["/workspace".to_string(), "/tmp".into(), "/dev".into()];
        if spec.image.is_some() {
            // The image's root is the sandbox's own to change: its writes
            // land in its writable layer. Read-only mounts stay read-only.
            writable.push("/".into());
            serve::run_commands_as(spec.inner_uid, spec.inner_gid);
        }
        writable.extend(
            spec.binds
                .iter()
                .filter(|b| b.writable)
                .map(|b| b.target.clone()),
        );
        let c = confine::apply(&spec, &writable)?;
        if let Some(gate) = c.setid {
            serve::gate_setid(gate);
        }
        Ok(ReadyInfo {
            landlock: c.landlock,
            landlock_abi: c.landlock_abi,
            seccomp_filters: c.seccomp_filters,
            next_id: 0,
        })
    })();
    match result {
        Ok(info) => {
            send(&mut ctl, &SupMsg::Ready(info.clone()));
            serve::serve(ctl.into(), None, info)
        }
        Err(e) => fail(&mut ctl, e),
    }
}
