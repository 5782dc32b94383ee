//! Finding QEMU and starting it, confined, from a thread that lives as
//! long as the process.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};

use super::cover;
use crate::config::SandboxConfig;
use crate::error::{Error, Result};
use crate::layout::CONTROL_FD;

/// QEMU's binary: `vm.qemu`, else `qemu-system-x86_64` on `PATH`, with
/// an error that says how to install it.
pub fn qemu_path(config: &SandboxConfig) -> Result<PathBuf> {
    if let Some(q) = &config.vm.qemu {
        return Ok(q.clone());
    }
    let name = "qemu-system-x86_64";
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Config(format!(
                "the microvm backend needs {name} (Debian: apt-get install qemu-system-x86)"
            ))
        })
}

/// Runs `start` on a thread that lives as long as the process. QEMU is
/// started with PR_SET_PDEATHSIG, which fires when the *thread* that forked
/// it exits, not the process: a sandbox created from a short-lived thread
/// (`Handle::block_on` on a caller's thread) would otherwise lose its VM
/// when that thread ends.
pub(super) fn launch<T: Send + 'static>(
    start: impl FnOnce() -> Result<T> + Send + 'static,
) -> Result<T> {
    type Job = Box<dyn FnOnce() + Send>;
    static LAUNCHER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let gone = || Error::Io(std::io::Error::other("cordon's VM launcher thread is gone"));
    let launcher = LAUNCHER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("cordon-vm-launcher".into())
            .spawn(move || {
                for job in rx {
                    // A panicking job must not take the launcher with it;
                    // its caller sees its result channel close.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })
            .ok()
            .map(|_| tx)
    });
    let launcher = launcher.as_ref().ok_or_else(gone)?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    launcher
        .send(Box::new(move || {
            let _ = tx.send(start());
        }))
        .map_err(|_| gone())?;
    rx.recv().map_err(|_| gone())?
}

/// Host files QEMU reads besides its program, libraries and the guest's
/// files (found with strace): the loader's cache, the time zone, and the
/// CPU and NUMA layout.
pub(super) const QEMU_HOST_FILES: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/sys/devices/system/cpu",
    "/sys/devices/system/node",
];

/// QEMU's descriptor for the guest's serial console (the control
/// channel's is [`CONTROL_FD`]).
pub(super) const CONSOLE_FD: i32 = CONTROL_FD + 1;

/// QEMU's descriptor for its monitor's socket (QMP).
pub(super) const MONITOR_FD: i32 = CONTROL_FD + 2;

/// QEMU's descriptor for the snapshot it starts from, if any.
pub(super) const INCOMING_FD: i32 = CONTROL_FD + 3;

/// QEMU's descriptor for the guest's memory, if a file (see `ram`).
pub(super) const RAM_FD: i32 = CONTROL_FD + 4;

/// QEMU's descriptor for the socket of share `i`'s virtio-fs server
/// (see `virtiofs`): this plus `i`.
pub(super) const SHARE_FD: i32 = CONTROL_FD + 5;

/// The descriptors QEMU starts with, as the numbers its options name.
pub(super) struct QemuFds {
    pub control: OwnedFd,
    pub console: OwnedFd,
    pub monitor: OwnedFd,
    pub incoming: Option<OwnedFd>,
    pub ram: Option<OwnedFd>,
    /// Each virtio-fs share's socket, in order.
    pub shares: Vec<OwnedFd>,
}

/// Starts QEMU with `fds` as [`CONTROL_FD`], [`CONSOLE_FD`],
/// [`MONITOR_FD`], [`INCOMING_FD`], [`RAM_FD`] and from [`SHARE_FD`] on,
/// confined as the module says (Landlock with `ruleset`, then seccomp), in
/// its own process group (the terminal's Ctrl-C belongs to the front end),
/// dying with this process. Returns its pid and the read end of its
/// stderr.
pub(super) fn spawn_qemu(
    qemu: &Path,
    args: &[String],
    fds: QemuFds,
    ruleset: Option<OwnedFd>,
    covers: Option<cover::Covers>,
) -> Result<(i32, OwnedFd)> {
    let filters = crate::supervisor::confine::host_file_guard()?;
    let mut moves = vec![
        (fds.control.as_raw_fd(), CONTROL_FD),
        (fds.console.as_raw_fd(), CONSOLE_FD),
        (fds.monitor.as_raw_fd(), MONITOR_FD),
        (
            fds.incoming.as_ref().map_or(-1, |f| f.as_raw_fd()),
            INCOMING_FD,
        ),
        (fds.ram.as_ref().map_or(-1, |f| f.as_raw_fd()), RAM_FD),
    ];
    for (i, share) in fds.shares.iter().enumerate() {
        moves.push((share.as_raw_fd(), SHARE_FD + i as i32));
    }
    let above = SHARE_FD + fds.shares.len() as i32;
    let mut copies = vec![-1; moves.len()];
    let ruleset_raw = ruleset.as_ref().map(|f| f.as_raw_fd());
    let mut cmd = std::process::Command::new(qemu);
    cmd.args(args)
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
            // Mounts before Landlock, which forbids them.
            if let Some(c) = &covers {
                c.apply()?;
            }
            // Landlock first: the ruleset's descriptor may be one of the
            // targets, which the dup2s below replace.
            if let Some(fd) = ruleset_raw
                && (libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            // Copies above every target first, so that no dup2 can
            // overwrite another's source; dup2 clears close-on-exec. (Both
            // vectors were allocated before the fork.)
            for (copy, (source, _)) in copies.iter_mut().zip(&moves) {
                if *source < 0 {
                    continue;
                }
                *copy = libc::fcntl(*source, libc::F_DUPFD, above);
                if *copy < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (copy, (_, target)) in copies.iter().zip(&moves) {
                if *copy < 0 {
                    continue;
                }
                if libc::dup2(*copy, *target) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                libc::close(*copy);
            }
            for f in &filters {
                seccompiler::apply_filter(f).map_err(std::io::Error::other)?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| Error::Spawn {
        path: qemu.to_path_buf(),
        source: e,
    })?;
    drop((fds, ruleset));
    let stderr = child.stderr.take().expect("stderr was piped");
    Ok((child.id() as i32, stderr.into()))
}

/// QEMU's version as (major, minor), from `qemu -version`: asked once per
/// binary per process, and kept on disk in `cache` by the binary's
/// identity (a one-shot `cordon run` would otherwise pay for a second
/// QEMU start). None if it does not say.
pub(super) fn version(qemu: &Path, cache: &Path) -> Option<(u32, u32)> {
    use std::collections::HashMap;
    use std::sync::Mutex;
    type Versions = HashMap<String, Option<(u32, u32)>>;
    static ASKED: Mutex<Option<Versions>> = Mutex::new(None);
    let stamp = super::image::file_stamp(&std::fs::metadata(qemu).ok()?);
    let key = super::image::hash_hex(|h| {
        use std::hash::Hash;
        (qemu, &stamp).hash(h)
    });
    let mut asked = ASKED.lock().unwrap_or_else(|e| e.into_inner());
    let asked = asked.get_or_insert_with(HashMap::new);
    if let Some(v) = asked.get(&key) {
        return *v;
    }
    let file = cache.join("qemu-version").join(&key);
    let v = match std::fs::read_to_string(&file) {
        Ok(text) => parse_version(&text),
        Err(_) => {
            let out = std::process::Command::new(qemu)
                .arg("-version")
                .env_clear()
                .stdin(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .output()
                .ok()?;
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            let v = parse_version(&text);
            if v.is_some() {
                let _ = std::fs::create_dir_all(file.parent().expect("has a parent"));
                let _ = std::fs::write(&file, &text);
            }
            v
        }
    };
    asked.insert(key, v);
    v
}

/// (major, minor) from "QEMU emulator version 10.0.2 (Debian …)".
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let rest = text.split("version ").nth(1)?;
    let mut parts = rest.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_read_from_what_qemu_prints() {
        assert_eq!(
            parse_version(
                "QEMU emulator version 10.0.2 (Debian 1:10.0.2+ds-2+deb13u1~bpo12+1)\nCopyright"
            ),
            Some((10, 0))
        );
        assert_eq!(
            parse_version("QEMU emulator version 7.2.22 (Debian 1:7.2+dfsg-7)"),
            Some((7, 2))
        );
        assert_eq!(parse_version("not qemu"), None);
    }
}
