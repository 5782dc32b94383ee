//! Memory and process-count limits for a sandbox, through whichever
//! mechanism this host lets us use: a delegated cgroup v2 subtree, the
//! cgroup v1 memory and pids controllers, or, failing both, rlimits applied
//! inside the sandbox (per process rather than per sandbox).
//!
//! Moving a process into a cgroup takes the kernel's threadgroup lock for
//! writing, which by default waits for an RCU grace period (~7 ms on an
//! idle host) unless another move happened within one: a start spaced from
//! the last pays it, back-to-back starts share it. The kernel's answer is
//! `favordynmods`, which [`favor_dynmods`] turns on as root (v1).

use std::fs;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

/// How limits are enforced for new sandboxes on this host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LimitMechanism {
    /// A cgroup v2 directory we may create children in.
    V2 { parent: PathBuf },
    /// cgroup v1 memory and pids hierarchies, and the freezer's when it
    /// is writable too (pausing needs it).
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        freezer: Option<PathBuf>,
    },
    /// Neither is writable: setrlimit inside the sandbox.
    Rlimit { why: String },
}

impl std::fmt::Display for LimitMechanism {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitMechanism::V2 { parent } => write!(f, "cgroup v2 (under {})", parent.display()),
            LimitMechanism::V1 { memory, pids, .. } => write!(
                f,
                "cgroup v1 (memory under {}, pids under {})",
                memory.display(),
                pids.display()
            ),
            LimitMechanism::Rlimit { why } => {
                write!(f, "rlimits, per process (no writable cgroup: {why})")
            }
        }
    }
}

/// This process's cgroup in the hierarchy of `controller` (`None`: v2's),
/// from the text of `/proc/self/cgroup`.
fn own_cgroup_path(text: &str, controller: Option<&str>) -> Option<String> {
    text.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
        let hit = match controller {
            None => ctrls.is_empty(),
            Some(c) => ctrls.split(',').any(|x| x == c),
        };
        hit.then(|| path.to_string())
    })
}

/// Mount points of cgroup filesystems: (fstype, super options, mount point).
fn cgroup_mounts() -> Vec<(String, String, PathBuf)> {
    fs::read_to_string("/proc/self/mountinfo")
        .map(|text| parse_cgroup_mounts(&text))
        .unwrap_or_default()
}

/// [`cgroup_mounts`] of the text of a `mountinfo` file.
fn parse_cgroup_mounts(text: &str) -> Vec<(String, String, PathBuf)> {
    text.lines()
        // Most lines are not cgroups': skip them before splitting.
        .filter(|line| line.contains(" - cgroup"))
        .filter_map(|line| {
            let (pre, post) = line.split_once(" - ")?;
            let mount_point = pre.split(' ').nth(4)?;
            let mut post = post.split(' ');
            let fstype = post.next()?;
            let _source = post.next()?;
            let opts = post.next().unwrap_or("");
            fstype.starts_with("cgroup").then(|| {
                (
                    fstype.to_string(),
                    opts.to_string(),
                    PathBuf::from(mount_point),
                )
            })
        })
        .collect()
}

/// Where cordon mounts a cgroup v1 hierarchy of no controller with the
/// `favordynmods` option (see [`favor_dynmods`]). Under /run, which only
/// root writes to and which a reboot empties, as it does the kernel state.
const FAVOR_DYNMODS_MOUNT: &str = "/run/cordon/cgroup-favordynmods";
/// The hierarchy's name, as `/proc/<pid>/cgroup` lists it.
const FAVOR_DYNMODS_NAME: &str = "cordon-favordynmods";

/// Whether [`detect`] has seen a hierarchy mounted with `favordynmods`,
/// so that [`favor_dynmods`] need not read the mount table again.
static FAVOURED_SEEN: AtomicBool = AtomicBool::new(false);

/// The mount point of a cgroup file system mounted with `favordynmods`:
/// then the kernel favours cgroup changes for every hierarchy.
fn favoured(mounts: &[(String, String, PathBuf)]) -> Option<&Path> {
    mounts
        .iter()
        .find(|(_, opts, _)| opts.split(',').any(|o| o == "favordynmods"))
        .map(|(_, _, mnt)| mnt.as_path())
}

/// How a move into a cgroup goes on this host, for `cordon doctor`.
pub fn attach_report() -> String {
    match favoured(&cgroup_mounts()) {
        Some(mnt) => format!("without waiting (favordynmods, at {})", mnt.display()),
        None => match detect() {
            LimitMechanism::V1 { .. } if rustix::process::geteuid().is_root() => format!(
                "waits for an RCU grace period until the first sandbox mounts {FAVOR_DYNMODS_MOUNT} \
                 (sandbox.cgroup_favordynmods)"
            ),
            LimitMechanism::Rlimit { .. } => "no cgroup".into(),
            _ => "may wait for an RCU grace period (no cgroup mounted with favordynmods)".into(),
        },
    }
}

/// Makes the kernel favour cgroup changes (`favordynmods`), once per
/// process, so that a sandbox's start does not wait for an RCU grace period
/// when it moves its supervisor into its cgroups. A controller-less v1
/// hierarchy mounted with the option does it for every hierarchy, and it
/// stays mounted: the kernel cannot turn the option off again anyway (6.18
/// refuses to), and the mount shows the host's operator what was done.
/// The cost the kernel documents, slower forks and exits, did not show in
/// a fork-and-exit loop here. Failure only costs the wait, so it is logged.
pub fn favor_dynmods() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    // `detect` saw it on: the kernel cannot turn it off again.
    if FAVOURED_SEEN.load(Ordering::Relaxed) {
        return;
    }
    ONCE.call_once(|| match mount_favor_dynmods() {
        Ok(at) => tracing::debug!(at = %at.display(), "cgroup changes are favoured"),
        Err(e) => tracing::debug!(
            error = %e,
            "cannot mount a cgroup hierarchy with favordynmods: a sandbox's start waits for the kernel"
        ),
    });
}

fn mount_favor_dynmods() -> io::Result<PathBuf> {
    use rustix::mount::MountFlags;
    if let Some(at) = favoured(&cgroup_mounts()) {
        return Ok(at.to_path_buf());
    }
    let dir = Path::new(FAVOR_DYNMODS_MOUNT);
    fs::create_dir_all(dir)?;
    // Two cordon processes starting at once would stack two mounts: the
    // second looks again under the lock.
    let lock = fs::File::create(dir.with_extension("lock"))?;
    rustix::fs::flock(&lock, rustix::fs::FlockOperation::LockExclusive)?;
    if let Some(at) = favoured(&cgroup_mounts()) {
        return Ok(at.to_path_buf());
    }
    let data = std::ffi::CString::new(format!("none,favordynmods,name={FAVOR_DYNMODS_NAME}"))
        .expect("no NUL in a constant");
    rustix::mount::mount(
        "cgroup",
        dir,
        "cgroup",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        Some(data.as_c_str()),
    )?;
    Ok(dir.to_path_buf())
}

fn writable_dir(p: &Path) -> bool {
    rustix::fs::access(
        p,
        rustix::fs::Access::WRITE_OK | rustix::fs::Access::EXEC_OK,
    )
    .is_ok()
}

/// Decides, once per call, which mechanism new sandboxes will use.
pub fn detect() -> LimitMechanism {
    let mounts = cgroup_mounts();
    if favoured(&mounts).is_some() {
        FAVOURED_SEEN.store(true, Ordering::Relaxed);
    }
    let own_text = fs::read_to_string("/proc/self/cgroup").unwrap_or_default();
    if let Some((_, _, mnt)) = mounts.iter().find(|(t, _, _)| t == "cgroup2")
        && let Some(own) = own_cgroup_path(&own_text, None)
    {
        let parent = mnt.join(own.trim_start_matches('/'));
        let ctl = fs::read_to_string(parent.join("cgroup.subtree_control")).unwrap_or_default();
        let has = |c: &str| ctl.split_whitespace().any(|x| x == c);
        if has("memory") && has("pids") && writable_dir(&parent) {
            return LimitMechanism::V2 { parent };
        }
    }
    let v1 = |name: &str| {
        let (_, _, mnt) = mounts
            .iter()
            .find(|(t, opts, _)| t == "cgroup" && opts.split(',').any(|o| o == name))?;
        let own = own_cgroup_path(&own_text, Some(name))?;
        let dir = mnt.join(own.trim_start_matches('/'));
        writable_dir(&dir).then_some(dir)
    };
    match (v1("memory"), v1("pids")) {
        (Some(memory), Some(pids)) => LimitMechanism::V1 {
            memory,
            pids,
            freezer: v1("freezer"),
        },
        _ => LimitMechanism::Rlimit {
            why: if mounts.is_empty() {
                "no cgroup filesystem is mounted".into()
            } else {
                "no delegated cgroup v2 subtree with memory and pids, and cgroup v1 memory/pids are not writable by this user".into()
            },
        },
    }
}

/// One sandbox's cgroup directories. Removed on drop (best effort).
#[derive(Debug)]
pub struct Cgroup {
    dirs: Vec<PathBuf>,
    /// File and key that count OOM kills ("memory.events" / "oom_kill").
    oom_file: PathBuf,
    /// Where its processes are frozen, when they can be.
    freezer: Option<Freezer>,
}

/// A cgroup's freezer: v2's `cgroup.freeze` in its own directory, or a
/// directory of v1's freezer hierarchy.
#[derive(Debug)]
enum Freezer {
    V2(PathBuf),
    V1(PathBuf),
}

/// How long the kernel may take to freeze or thaw every process.
const FREEZING: std::time::Duration = std::time::Duration::from_secs(10);

static COUNTER: AtomicU64 = AtomicU64::new(0);
/// Parents already swept by this process.
static SWEPT: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());

fn write(dir: &Path, file: &str, value: &str) -> io::Result<()> {
    fs::write(dir.join(file), value).map_err(|e| {
        io::Error::new(
            e.kind(),
            format!("write {} to {}: {e}", value, dir.join(file).display()),
        )
    })
}

/// Removes cgroups left behind by cordon processes that died without
/// cleaning up. Names carry the creating process's pid: a live creator may
/// have made the directory but not yet moved a process in, so its
/// directories are left alone. A populated directory refuses `rmdir`.
fn sweep(parent: &Path) {
    let Ok(entries) = fs::read_dir(parent) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if name
            .to_str()
            .and_then(|n| n.strip_prefix("cordon-"))
            .is_some_and(crate::backend::left_by_dead_process)
        {
            let _ = fs::remove_dir(e.path());
        }
    }
}

impl Cgroup {
    /// Creates the cgroup(s) for a new sandbox with the given limits.
    pub fn create(
        mech: &LimitMechanism,
        memory: Option<u64>,
        pids: Option<u64>,
    ) -> io::Result<Cgroup> {
        let name = format!(
            "cordon-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let mkdir = |parent: &Path| -> io::Result<PathBuf> {
            {
                let mut swept = SWEPT.lock().unwrap_or_else(|e| e.into_inner());
                if !swept.iter().any(|p| p == parent) {
                    sweep(parent);
                    swept.push(parent.to_path_buf());
                }
            }
            let dir = parent.join(&name);
            fs::create_dir(&dir)?;
            Ok(dir)
        };
        match mech {
            LimitMechanism::V2 { parent } => {
                let dir = mkdir(parent)?;
                let cg = Cgroup {
                    dirs: vec![dir.clone()],
                    oom_file: dir.join("memory.events"),
                    freezer: Some(Freezer::V2(dir.clone())),
                };
                if let Some(m) = memory {
                    write(&dir, "memory.max", &m.to_string())?;
                    let _ = write(&dir, "memory.swap.max", "0");
                }
                if let Some(p) = pids {
                    write(&dir, "pids.max", &p.to_string())?;
                }
                Ok(cg)
            }
            LimitMechanism::V1 {
                memory: mparent,
                pids: pparent,
                freezer,
            } => {
                let mdir = mkdir(mparent)?;
                let mut cg = Cgroup {
                    dirs: vec![mdir.clone()],
                    oom_file: mdir.join("memory.oom_control"),
                    freezer: None,
                };
                let pdir = mkdir(pparent)?;
                cg.dirs.push(pdir.clone());
                if let Some(fparent) = freezer {
                    let fdir = mkdir(fparent)?;
                    cg.dirs.push(fdir.clone());
                    cg.freezer = Some(Freezer::V1(fdir));
                }
                if let Some(m) = memory {
                    write(&mdir, "memory.limit_in_bytes", &m.to_string())?;
                    // Without this a swapping host would let usage exceed the limit.
                    if mdir.join("memory.memsw.limit_in_bytes").exists() {
                        write(&mdir, "memory.memsw.limit_in_bytes", &m.to_string())?;
                    }
                }
                if let Some(p) = pids {
                    write(&pdir, "pids.max", &p.to_string())?;
                }
                Ok(cg)
            }
            LimitMechanism::Rlimit { .. } => Err(io::Error::other("rlimits need no cgroup")),
        }
    }

    /// Moves a process (and so its future children) into this cgroup.
    pub fn add(&self, pid: u32) -> io::Result<()> {
        for d in &self.dirs {
            write(d, "cgroup.procs", &pid.to_string())?;
        }
        Ok(())
    }

    /// SIGKILLs every process in the cgroup at once, rather than through
    /// the supervisor's death, which takes a few scheduling rounds on a
    /// busy host: a sandbox stopped for its disk budget writes no more
    /// meanwhile. cgroup v2's `cgroup.kill`; on v1 each listed process,
    /// through a pidfd checked to be still in this cgroup (so a reused pid
    /// is never signalled).
    pub fn kill_all(&self) {
        use rustix::process::{Pid, PidfdFlags, Signal, pidfd_open, pidfd_send_signal};
        for d in &self.dirs {
            if fs::write(d.join("cgroup.kill"), "1").is_ok() {
                return;
            }
        }
        let Some(dir) = self.dirs.first() else { return };
        let Some(name) = dir.file_name().and_then(|n| n.to_str()) else {
            return;
        };
        let Ok(procs) = fs::read_to_string(dir.join("cgroup.procs")) else {
            return;
        };
        for pid in procs.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
            let Some(p) = Pid::from_raw(pid) else {
                continue;
            };
            let Ok(fd) = pidfd_open(p, PidfdFlags::empty()) else {
                continue;
            };
            let ours = fs::read_to_string(format!("/proc/{pid}/cgroup"))
                .is_ok_and(|c| c.lines().any(|l| l.ends_with(&format!("/{name}"))));
            if ours {
                let _ = pidfd_send_signal(&fd, Signal::KILL);
            }
        }
    }

    /// Bytes of memory the cgroup's processes use now (the kernel's
    /// charge: their pages and the page cache they brought in).
    /// And its limit, when it has one.
    pub fn memory(&self) -> Option<(u64, Option<u64>)> {
        let dir = self.dirs.first()?;
        let read = |files: [&str; 2]| {
            files
                .iter()
                .find_map(|f| fs::read_to_string(dir.join(f)).ok())
        };
        let used = read(["memory.current", "memory.usage_in_bytes"])?
            .trim()
            .parse()
            .ok()?;
        // "max" (v2), or v1's page-rounded largest number: no limit.
        let limit = read(["memory.max", "memory.limit_in_bytes"])
            .and_then(|t| t.trim().parse::<u64>().ok())
            .filter(|&l| l < 1 << 60);
        Some((used, limit))
    }

    /// Whether its processes can be frozen.
    pub fn can_freeze(&self) -> bool {
        self.freezer.is_some()
    }

    /// Freezes every process in the cgroup (or thaws them), and waits
    /// until the kernel says it is done. Blocking: the kernel takes a few
    /// milliseconds, longer for a process in an uninterruptible sleep.
    pub fn freeze(&self, frozen: bool) -> io::Result<()> {
        let done = || -> io::Result<bool> {
            Ok(match &self.freezer {
                Some(Freezer::V2(dir)) => {
                    let events = fs::read_to_string(dir.join("cgroup.events"))?;
                    let want = if frozen { "frozen 1" } else { "frozen 0" };
                    events.lines().any(|l| l.trim() == want)
                }
                Some(Freezer::V1(dir)) => {
                    let state = fs::read_to_string(dir.join("freezer.state"))?;
                    state.trim() == if frozen { "FROZEN" } else { "THAWED" }
                }
                None => false,
            })
        };
        match &self.freezer {
            Some(Freezer::V2(dir)) => write(dir, "cgroup.freeze", if frozen { "1" } else { "0" })?,
            Some(Freezer::V1(dir)) => write(
                dir,
                "freezer.state",
                if frozen { "FROZEN" } else { "THAWED" },
            )?,
            None => {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    "no freezer cgroup: pausing needs cgroup v2 delegated, or v1's freezer writable (root)",
                ));
            }
        }
        crate::backend::wait_until(
            FREEZING,
            &format!("the kernel did not finish in {FREEZING:?}"),
            done,
        )
    }

    /// Thaws its processes without waiting: what killing a paused sandbox
    /// needs first, as a frozen v1 process dies only once thawed.
    pub fn thaw(&self) {
        let _ = match &self.freezer {
            Some(Freezer::V2(dir)) => fs::write(dir.join("cgroup.freeze"), "0"),
            Some(Freezer::V1(dir)) => fs::write(dir.join("freezer.state"), "THAWED"),
            None => Ok(()),
        };
    }

    /// Out-of-memory kills so far in this cgroup.
    pub fn oom_kills(&self) -> Option<u64> {
        let text = fs::read_to_string(&self.oom_file).ok()?;
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == "oom_kill").then(|| v.trim().parse().ok()).flatten()
        })
    }

    /// Removes the directories once their processes are gone, retrying for
    /// up to a second since the kernel tears a pid namespace down lazily:
    /// first after 50 µs, then backing off to 2 ms: the last process is
    /// usually gone within a fraction of a millisecond, and every close
    /// waits for this.
    pub fn remove(&mut self) {
        let _ = crate::backend::wait_until(
            std::time::Duration::from_secs(1),
            "cgroup still populated",
            || {
                self.dirs.retain(|d| match fs::remove_dir(d) {
                    Ok(()) => false,
                    Err(e) => e.kind() != io::ErrorKind::NotFound,
                });
                Ok(self.dirs.is_empty())
            },
        );
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        if !self.dirs.is_empty() {
            self.remove();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(fstype: &str, opts: &str, at: &str) -> (String, String, PathBuf) {
        (fstype.into(), opts.into(), PathBuf::from(at))
    }

    #[test]
    fn cgroup_mounts_and_own_paths_are_read_from_the_kernels_text() {
        let mountinfo = "\
22 1 0:21 / / rw,relatime - overlay overlay rw,lowerdir=/a\n\
30 22 0:26 / /sys/fs/cgroup rw - tmpfs tmpfs rw,mode=755\n\
31 30 0:27 / /sys/fs/cgroup/memory rw,nosuid - cgroup cgroup rw,memory\n\
32 30 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw,nsdelegate\n\
33 22 0:29 / /srv/not\\040-\\040cgroup rw - ext4 /dev/vda rw\n";
        assert_eq!(
            parse_cgroup_mounts(mountinfo),
            vec![
                mount("cgroup", "rw,memory", "/sys/fs/cgroup/memory"),
                mount("cgroup2", "rw,nsdelegate", "/sys/fs/cgroup/unified"),
            ]
        );
        let own = "12:pids:/a\n4:memory,hugetlb:/b/c\n0::/d\n";
        assert_eq!(
            own_cgroup_path(own, Some("memory")).as_deref(),
            Some("/b/c")
        );
        assert_eq!(own_cgroup_path(own, Some("pids")).as_deref(), Some("/a"));
        assert_eq!(own_cgroup_path(own, None).as_deref(), Some("/d"));
        assert_eq!(own_cgroup_path(own, Some("freezer")), None);
    }

    #[test]
    fn a_mount_with_favordynmods_is_found_among_others() {
        let mut mounts = vec![
            mount("cgroup", "rw,memory", "/sys/fs/cgroup/memory"),
            mount("cgroup2", "rw,nsdelegate", "/sys/fs/cgroup/unified"),
        ];
        assert_eq!(favoured(&mounts), None);
        // Only the option itself, not a name that contains it.
        mounts.push(mount("cgroup", "rw,name=favordynmods-not", "/x"));
        assert_eq!(favoured(&mounts), None);
        mounts.push(mount(
            "cgroup",
            "rw,favordynmods,name=cordon-favordynmods",
            FAVOR_DYNMODS_MOUNT,
        ));
        assert_eq!(favoured(&mounts), Some(Path::new(FAVOR_DYNMODS_MOUNT)));
    }
}
