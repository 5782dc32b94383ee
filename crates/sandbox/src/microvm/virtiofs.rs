//! A microVM's shares over virtio-fs: one `virtiofsd` per share, each
//! serving one host directory to one guest.
//!
//! Why: QEMU refuses to save a guest with a 9p share mounted, and a
//! microVM paused to disk is saved with all of its shares mounted. QEMU 8.2
//! and newer save a virtio-fs device, with the open files' state that its
//! `virtiofsd` hands over (see `docs/microvm.md`).
//!
//! The rules:
//!
//! - `virtiofsd` is a host process that reads and writes what the guest
//!   asks: it is confined as QEMU is. Landlock lets it read only its
//!   program's directory, the host's libraries, `/proc` (it reopens its own descriptors
//!   there) and its share, and write only a writable share; cordon's file
//!   guard (no chown, no set-id bits, no device nodes, no open by handle)
//!   and its own seccomp filter stack on that; it runs with no new
//!   privileges, in its own process group, and dies with cordon. Its own
//!   sandbox (a mount namespace it pivots into) is off: cordon's Landlock
//!   is the boundary, and it needs no mount rights.
//! - Every guest uid and gid is squashed to cordon's own on the host, as
//!   QEMU's 9p server wrote every file with QEMU's identity: what the guest
//!   makes in the workspace belongs to the workspace's user.
//! - The hidden and read-only workspace files are covered in the
//!   workspace server's own mount namespace (see `cover`), before Landlock.
//! - QEMU and a `virtiofsd` meet on a socket bound in the sandbox's run
//!   directory, connected by cordon before either starts and then
//!   unlinked: no other process can reach either end.
//! - Writable shares are served uncached (the host edits the workspace
//!   under a running guest, and the guest must see it at once), but still
//!   mappable, so programs in the workspace run; read-only ones are cached.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::cover::Covers;
use super::tail::Tail;
use crate::error::{Error, Result};

/// The descriptor a `virtiofsd` finds its listening socket on.
const LISTEN_FD: i32 = 3;

/// The program's name on `PATH`, and where Debian installs it.
const PROGRAM: &str = "virtiofsd";
const LIBEXEC: &str = "/usr/libexec/virtiofsd";

/// One host directory shared with the guest under `tag`.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct Share {
    pub tag: String,
    pub path: PathBuf,
    pub writable: bool,
}

/// `virtiofsd`: the configured one, else on `PATH`, else Debian's.
pub(super) fn find(configured: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = configured {
        return Some(p.to_path_buf());
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(PROGRAM))
        .chain([PathBuf::from(LIBEXEC)])
        .find(|p| p.is_file())
}

/// The running servers of one guest's shares: killed and reaped when
/// dropped (each also ends by itself once QEMU hangs up).
pub(super) struct Servers {
    pids: Vec<i32>,
    logs: Vec<Arc<Tail>>,
}

impl Servers {
    pub(super) fn pids(&self) -> &[i32] {
        &self.pids
    }

    /// What the servers last said on stderr, for an error message.
    pub(super) fn explain(&self) -> String {
        self.logs
            .iter()
            .map(|l| l.explain(3))
            .filter(|t| !t.trim().is_empty())
            .collect::<Vec<_>>()
            .join("\n")
    }
}

impl Drop for Servers {
    fn drop(&mut self) {
        for &pid in &self.pids {
            // SAFETY: killing and reaping our own children, which no one
            // else reaps.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// Starts a server for each of `shares` (the one whose path is
/// `workspace` with `covers`), with its socket in `run`. Returns them and,
/// in the same order, the connected ends QEMU's `-chardev`s take.
pub(super) fn start(
    program: &Path,
    shares: &[Share],
    workspace: &Path,
    covers: Option<&Covers>,
    run: &Path,
) -> Result<(Servers, Vec<OwnedFd>)> {
    let mut servers = Servers {
        pids: Vec::new(),
        logs: Vec::new(),
    };
    let mut ends = Vec::new();
    for (i, share) in shares.iter().enumerate() {
        let path = run.join(format!("fs{i}.sock"));
        let listener = std::os::unix::net::UnixListener::bind(&path).map_err(|e| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("{}: {e}", path.display()),
            ))
        })?;
        let end = std::os::unix::net::UnixStream::connect(&path);
        let _ = std::fs::remove_file(&path);
        let end = end?;
        let covers = (share.path == workspace).then(|| covers.cloned()).flatten();
        let (pid, stderr) = spawn(program, share, listener.into(), covers)?;
        servers.pids.push(pid);
        servers.logs.push(Tail::drain(stderr, "virtiofsd")?);
        ends.push(end.into());
    }
    Ok((servers, ends))
}

/// The options of one share's server.
fn args(share: &Share) -> Vec<String> {
    let uid = rustix::process::geteuid().as_raw();
    let gid = rustix::process::getegid().as_raw();
    let mut args = vec![
        format!("--fd={LISTEN_FD}"),
        format!("--shared-dir={}", share.path.display()),
        "--sandbox=none".into(),
        "--seccomp=kill".into(),
        "--inode-file-handles=never".into(),
        format!("--translate-uid=squash-guest:0:{uid}:4294967295"),
        format!("--translate-gid=squash-guest:0:{gid}:4294967295"),
        // A restored guest whose file went meanwhile gets an error on it,
        // not a failed restore.
        "--migration-on-error=guest-error".into(),
        "--log-level=error".into(),
    ];
    if share.writable {
        args.extend(["--cache=never".into(), "--allow-mmap".into()]);
    } else {
        args.extend(["--cache=always".into(), "--readonly".into()]);
    }
    args
}

/// Starts one server, confined as the module says, with `listener` as
/// [`LISTEN_FD`]. Returns its pid and the read end of its stderr.
fn spawn(
    program: &Path,
    share: &Share,
    listener: OwnedFd,
    covers: Option<Covers>,
) -> Result<(i32, OwnedFd)> {
    let mut read: Vec<PathBuf> = ["/usr", "/lib", "/lib64", "/etc/ld.so.cache", "/proc"]
        .iter()
        .map(PathBuf::from)
        .collect();
    // Its directory, not only the file: a wrapper there may exec the
    // program it wraps.
    read.push(program.parent().unwrap_or(program).to_path_buf());
    let mut write = vec![PathBuf::from("/dev/null")];
    if share.writable {
        write.push(share.path.clone());
    } else {
        read.push(share.path.clone());
    }
    let ruleset = crate::supervisor::confine::vmm_ruleset(&read, &write)?;
    let filters = crate::supervisor::confine::host_file_guard()?;
    let source = listener.as_raw_fd();
    let ruleset_raw = ruleset.as_ref().map(|f| f.as_raw_fd());
    let mut cmd = std::process::Command::new(program);
    cmd.args(args(share))
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0);
    // SAFETY: only async-signal-safe calls (prctl, unshare, mount calls,
    // landlock, seccomp, dup2, fcntl, close) on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            if let Some(c) = &covers {
                c.apply()?;
            }
            if let Some(fd) = ruleset_raw
                && (libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            if source != LISTEN_FD {
                if libc::dup2(source, LISTEN_FD) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            } else if libc::fcntl(source, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            for f in &filters {
                seccompiler::apply_filter(f).map_err(std::io::Error::other)?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| Error::Spawn {
        path: program.to_path_buf(),
        source: e,
    })?;
    drop((listener, ruleset));
    let stderr = child.stderr.take().expect("stderr was piped");
    Ok((child.id() as i32, stderr.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_only_shares_are_cached_and_writable_ones_are_not() {
        let ro = args(&Share {
            tag: "usr".into(),
            path: "/usr".into(),
            writable: false,
        });
        assert!(ro.contains(&"--readonly".to_string()), "{ro:?}");
        assert!(ro.contains(&"--cache=always".to_string()), "{ro:?}");
        let rw = args(&Share {
            tag: "workspace".into(),
            path: "/w".into(),
            writable: true,
        });
        assert!(!rw.contains(&"--readonly".to_string()), "{rw:?}");
        assert!(rw.contains(&"--cache=never".to_string()), "{rw:?}");
        assert!(rw.contains(&"--allow-mmap".to_string()), "{rw:?}");
        for a in [&ro, &rw] {
            assert!(a.contains(&"--sandbox=none".to_string()));
            assert!(
                a.iter()
                    .any(|o| o.starts_with("--translate-uid=squash-guest:0:"))
            );
        }
    }
}
