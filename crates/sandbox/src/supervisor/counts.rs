//! The sandbox's share of the kernel's per-user counts.
//!
//! Inotify instances and watches, fanotify groups and marks, pending
//! signals, POSIX message queue bytes and locked shared memory are counted
//! per user, and a process in a user namespace is charged at every level of
//! the chain: to its uid in its own namespace and to the namespace owner's
//! uid in the parent. Left alone, a sandbox made by root holds root's
//! counts: 128 inotify instances in the sandbox, and systemd, file watchers
//! and other tenants' sandboxes get `EMFILE`.
//!
//! Three things bound that:
//! - when the supervisor is root, the namespace is created under a host uid
//!   of this sandbox's own, so what it is charged at the host's level is
//!   that uid's, not root's (a short-lived child still in the host's
//!   namespace writes the id maps, which the new namespace cannot);
//! - `/proc/sys/user/max_*` written in the sandbox's namespace, which its
//!   commands, without `CAP_SYS_RESOURCE`, cannot raise;
//! - the rlimit-style counts (signals, message queues, locked memory) set as
//!   rlimits inside (see `confine`), not before the namespace exists: the
//!   kernel would take those as the namespace's ceiling on its owner's
//!   *total*, and one sandbox of an unprivileged user would then starve the
//!   next.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, BorrowedFd, RawFd};
use std::path::Path;

use rustix::io::Errno;
use rustix::thread::UnshareFlags;

use super::error::SetupError;
use super::ids::{IdMaps, MapWrites};
use crate::protocol::{SetupSpec, UserCounts};

type Result<T> = std::result::Result<T, SetupError>;

/// Enters the sandbox's namespaces with the user namespace owned by `owner`
/// and maps the spec's ids, as [`super::ids::write_id_maps`] does for a
/// namespace owned by the caller. Returns `Ok(false)`, having changed
/// nothing that matters, when this host cannot switch to `owner` (the uid
/// is not mapped where the supervisor runs, as in a container's user
/// namespace, or the supervisor is itself inside a sandbox).
pub fn unshare_owned_by(
    owner: u32,
    flags: UnshareFlags,
    spec: &SetupSpec,
    idmapped: Option<&IdMaps>,
) -> Result<bool> {
    // The host's supplementary groups (root's) would stay with the sandbox:
    // once inside, setgroups is denied. Refused only where this "root" is
    // itself in a user namespace, which keeps the caller's ids anyway.
    // SAFETY: plain syscall with an empty list.
    if unsafe { libc::setgroups(0, std::ptr::null()) } != 0 {
        return Ok(false);
    }
    // Idmapped mounts show the sandbox its files as uid 0; its processes
    // can then be the owner uid (or range) on the host rather than root.
    let ids = match idmapped {
        Some(ids) => ids.clone(),
        None => IdMaps::of(spec),
    };
    // The mapper must stay in the host's user namespace: only a process
    // there may map ids into a namespace that is not its own creator's uid.
    let parent = rustix::process::getpid().as_raw_nonzero().get();
    let writes = MapWrites::new(&format!("/proc/{parent}"), &ids);
    with_light_helper(
        "start the id mapper",
        |go, done| {
            let mut b = [0u8];
            let code = match rustix::io::read(go, &mut b) {
                Ok(1) => match writes.write() {
                    Ok(()) => 0u8,
                    Err((_, e)) => e.raw_os_error() as u8,
                },
                // The supervisor gave up before unsharing.
                _ => libc::ECANCELED as u8,
            };
            let _ = rustix::io::write(done, &[code]);
        },
        |mut go, mut done, _| switch_and_unshare(owner, flags, &mut go, &mut done),
    )
}

/// As [`with_helper`], but the helper shares this process's memory (`clone`
/// with `CLONE_VM`) instead of getting a copy of it: a fork of the
/// supervisor copies the page tables of all the front end had mapped, and
/// as root a sandbox's start made two such helpers. The helper runs beside
/// this process on the same heap, so `child` may only make system calls on
/// data made before it starts, through rustix (which sets no `errno`): no
/// allocation, no lock, no `std` I/O, nothing that can panic. It gets the
/// read end of a pipe from this process and the write end of one back.
pub(super) fn with_light_helper<T>(
    what: &str,
    child: impl Fn(BorrowedFd<'_>, BorrowedFd<'_>),
    parent: impl FnOnce(File, File, i32) -> Result<T>,
) -> Result<T> {
    /// What the helper runs: the closure and the descriptors it keeps and
    /// closes, read from the parent's memory.
    struct Job<'a> {
        run: &'a dyn Fn(BorrowedFd<'_>, BorrowedFd<'_>),
        keep: (RawFd, RawFd),
        close: (RawFd, RawFd),
    }
    extern "C" fn start(arg: *mut libc::c_void) -> libc::c_int {
        // SAFETY: `arg` is the Job below, which outlives the helper: the
        // parent reaps it before the Job's frame ends.
        let job = unsafe { &*(arg as *const Job<'_>) };
        // The helper's copies of the parent's ends (its descriptor table is
        // its own); closed so that each side sees the other's end.
        // SAFETY: numbers in this helper's own table, closed once.
        unsafe {
            rustix::io::close(job.close.0);
            rustix::io::close(job.close.1);
        }
        // SAFETY: open for as long as the helper runs (its own table).
        let (rx, tx) = unsafe {
            (
                BorrowedFd::borrow_raw(job.keep.0),
                BorrowedFd::borrow_raw(job.keep.1),
            )
        };
        (job.run)(rx, tx);
        0
    }

    let (to_child_rx, to_child_tx) = pipe()?;
    let (to_parent_rx, to_parent_tx) = pipe()?;
    let job = Job {
        run: &child,
        keep: (to_child_rx.as_raw_fd(), to_parent_tx.as_raw_fd()),
        close: (to_child_tx.as_raw_fd(), to_parent_rx.as_raw_fd()),
    };
    let stack = Stack::new().map_err(|e| SetupError::io(what, e))?;
    // SAFETY: `start` only reads `job` and makes system calls on its own
    // stack; both outlive the helper (reaped below before they drop).
    let pid = unsafe {
        libc::clone(
            start,
            stack.top(),
            libc::CLONE_VM | libc::SIGCHLD,
            &job as *const Job<'_> as *mut libc::c_void,
        )
    };
    if pid < 0 {
        return Err(SetupError::io(what, std::io::Error::last_os_error()));
    }
    drop((to_child_rx, to_parent_tx));
    let result = parent(to_child_tx, to_parent_rx, pid);
    reap(pid);
    drop(stack);
    result
}

/// Waits for the helper `pid` to end.
fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: reaping our own child.
    while unsafe { libc::waitpid(pid, &mut status, 0) } < 0
        && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR)
    {}
}

/// A light helper's stack: mapped, with a page below it that faults.
struct Stack {
    base: *mut libc::c_void,
}

impl Stack {
    /// Ample for a few system calls; the guard page ends an overflow.
    const SIZE: usize = 64 * 1024;
    const GUARD: usize = 4096;

    fn new() -> std::io::Result<Stack> {
        let len = Self::SIZE + Self::GUARD;
        // SAFETY: a fresh anonymous mapping, ours alone.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_STACK,
                -1,
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let stack = Stack { base };
        // SAFETY: the lowest page of the mapping just made.
        if unsafe { libc::mprotect(base, Self::GUARD, libc::PROT_NONE) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(stack)
    }

    /// The stack's top (it grows down), 16-byte aligned as mapped.
    fn top(&self) -> *mut libc::c_void {
        // SAFETY: one past the mapping's end, which `clone` starts below.
        unsafe { self.base.cast::<u8>().add(Self::SIZE + Self::GUARD).cast() }
    }
}

impl Drop for Stack {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, no longer used (its helper reaped).
        unsafe {
            libc::munmap(self.base, Self::SIZE + Self::GUARD);
        }
    }
}

/// Forks a short-lived helper that runs `child` with a pipe from this
/// process and one back to it, runs `parent` with the other ends and the
/// helper's pid, and reaps the helper. The supervisor is single-threaded,
/// so the helper may run ordinary code; it exits when `child` returns.
pub(super) fn with_helper<T>(
    what: &str,
    child: impl FnOnce(File, File),
    parent: impl FnOnce(File, File, i32) -> Result<T>,
) -> Result<T> {
    let (to_child_rx, to_child_tx) = pipe()?;
    let (to_parent_rx, to_parent_tx) = pipe()?;
    // SAFETY: the supervisor is single-threaded.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(SetupError::io(what, std::io::Error::last_os_error()));
    }
    if pid == 0 {
        drop((to_child_tx, to_parent_rx));
        child(to_child_rx, to_parent_tx);
        super::exit_now(0);
    }
    drop((to_child_rx, to_parent_tx));
    // The parent's ends close when `parent` returns, before the wait, so a
    // helper still reading sees the end.
    let result = parent(to_child_tx, to_parent_rx, pid);
    reap(pid);
    result
}

fn switch_and_unshare(
    owner: u32,
    flags: UnshareFlags,
    go: &mut File,
    done: &mut File,
) -> Result<bool> {
    use rustix::thread::{CapabilitiesSecureBits, set_capabilities_secure_bits};
    // Keep the capabilities across the uid change, so that unsharing is
    // allowed exactly as it is for root (an LSM may restrict user
    // namespaces to capable callers).
    // Either refused (the securebits locked, `owner` not mapped where the
    // supervisor runs): nothing has changed, and the caller's ids are kept.
    if set_capabilities_secure_bits(CapabilitiesSecureBits::NO_SETUID_FIXUP).is_err() {
        return Ok(false);
    }
    // SAFETY: plain syscall; -1 leaves the real and saved uids alone.
    if unsafe { libc::syscall(libc::SYS_setresuid, -1i32, owner, -1i32) } != 0 {
        return Ok(false);
    }
    // SAFETY: single-threaded, as the caller's unshare requires.
    if let Err(e) = unsafe { rustix::thread::unshare_unsafe(flags) } {
        return Err(SetupError {
            what: super::userns_diagnosis(e),
            errno: 0,
        });
    }
    go.write_all(&[1])
        .map_err(|e| SetupError::io("start the id mapper", e))?;
    let mut code = [0u8];
    done.read_exact(&mut code)
        .map_err(|e| SetupError::io("hear from the id mapper", e))?;
    if code[0] != 0 {
        return Err(SetupError::new(
            "write the sandbox's id maps",
            Errno::from_raw_os_error(code[0].into()),
        ));
    }
    // Root in the new namespace: whatever host ids the maps gave it.
    // SAFETY: plain syscalls.
    if unsafe { libc::syscall(libc::SYS_setresgid, 0, 0, 0) } != 0
        || unsafe { libc::syscall(libc::SYS_setresuid, 0, 0, 0) } != 0
    {
        return Err(SetupError::io(
            "become root in the sandbox",
            std::io::Error::last_os_error(),
        ));
    }
    Ok(true)
}

fn pipe() -> Result<(File, File)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)
        .map_err(|e| SetupError::new("pipe", e))?;
    Ok((r.into(), w.into()))
}

/// Writes the namespace's own ceilings through the sandbox's fresh procfs,
/// which is still writable here; the sandbox's commands cannot change them.
pub fn write_namespace_max(proc_dir: &Path, counts: &UserCounts) -> Result<()> {
    for (count, max) in &counts.namespace_max {
        let path = proc_dir.join("sys/user").join(count.sysctl());
        if !path.exists() {
            // An older kernel without this count.
            continue;
        }
        std::fs::write(&path, max.to_string())
            .map_err(|e| SetupError::io(format!("write /proc/sys/user/{}", count.sysctl()), e))?;
    }
    Ok(())
}
