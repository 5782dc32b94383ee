//! The disk budget: a host-side watcher that measures what the workspace
//! (and the writable binds) take on the host's disk and stops the sandbox
//! once they have grown by more than the budget.
//!
//! The workspace is hostile, so the walk is descriptor-relative: every
//! directory is opened with `openat(O_NOFOLLOW | O_DIRECTORY)` from its
//! parent's descriptor, entries are looked at with `fstatat` without
//! following links, nothing on another device (a mount point) is counted or
//! entered, and nothing read from there is printed. Sizes are allocated
//! bytes (`st_blocks` x 512), each inode once, so sparse files count what
//! they hold and hard links count once.
//!
//! It is a watcher, not a quota: between two looks a sandbox can write at
//! full speed. The pause between looks follows the CPU time a look takes
//! (a tenth of a core on walking at most; not its wall time, which a busy
//! host stretches, and which once made a stalled look's pause long enough
//! for a writer to get 290 MiB past a 64 MiB budget) and shortens while the
//! workspace grows towards the budget, and an exec's end waits for one more
//! look, so a command that overran the budget is reported as such.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::Weak;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::config::SandboxConfig;
use crate::error::{DiskStop, Error, Result};
use crate::session::{DiskWatch, Inner, LookRequest, Sandbox};

/// The shortest pause between two looks.
const MIN_PAUSE: Duration = Duration::from_millis(10);
/// The shortest while the workspace grows towards the budget.
const MIN_FAST_PAUSE: Duration = Duration::from_millis(2);
/// The longest: a walk that slow is of an enormous workspace.
const MAX_PAUSE: Duration = Duration::from_secs(10);
/// Pause for this many times the CPU time a walk took, so that the
/// watcher takes at most about a tenth of a core.
const PAUSE_FACTOR: u32 = 9;
/// Directory levels held open during a walk; deeper ones are reopened by
/// name from the deepest open one, so a tree of any depth costs a bounded
/// number of descriptors.
const OPEN_LEVELS: usize = 64;

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

/// What the budget's roots took before the sandbox could write, being
/// measured while the sandbox starts.
pub(crate) struct Baseline {
    budget: u64,
    roots: Vec<PathBuf>,
    base: tokio::task::JoinHandle<std::io::Result<u64>>,
}

impl Baseline {
    /// Starts measuring, when `config` has a budget.
    pub(crate) fn start(config: &SandboxConfig) -> Result<Option<Baseline>> {
        let Some(budget) = config.disk else {
            return Ok(None);
        };
        if budget == 0 {
            return Err(Error::Config(
                "the disk budget must be greater than zero".into(),
            ));
        }
        let roots = roots(config).map_err(Error::Config)?;
        let r = roots.clone();
        let base = tokio::task::spawn_blocking(move || {
            // A volume's free space is set first: the budget's bound for
            // what the watcher cannot see.
            crate::volume::fit(&r[0], crate::volume::room(budget))
                .map_err(std::io::Error::other)?;
            measure(&r, None)
        });
        Ok(Some(Baseline {
            budget,
            roots,
            base,
        }))
    }

    /// Starts `sandbox`'s watcher once the baseline is known; closes the
    /// sandbox if it cannot be.
    pub(crate) async fn watch(self, sandbox: &Sandbox) -> Result<()> {
        let why = match self.base.await {
            Ok(Ok(base)) => {
                let mut roots = self.roots;
                // Empty when the sandbox starts: nothing to add to the base.
                roots.extend(sandbox.inner.lifecycle.writable_layer());
                sandbox.watch_disk(roots, self.budget, base);
                return Ok(());
            }
            Ok(Err(e)) => format!("cannot measure the workspace for the disk budget: {e}"),
            Err(e) => format!("disk budget: {e}"),
        };
        sandbox.close().await;
        Err(Error::Config(why))
    }
}

impl Sandbox {
    /// Set once the sandbox was stopped for outgrowing its disk budget.
    pub fn disk_stopped(&self) -> Option<DiskStop> {
        self.inner.disk_stop.get().copied()
    }

    /// With a disk budget, waits for a fresh look at the workspace (which
    /// stops the sandbox if it has outgrown the budget), up to a second:
    /// a workspace too large to walk in that time is judged at the
    /// watcher's next look, which still stops it. Then as
    /// [`Sandbox::disk_stopped`].
    pub async fn check_disk(&self) -> Option<DiskStop> {
        if let Some(watch) = self.inner.disk.get()
            && self.inner.disk_stop.get().is_none()
        {
            let _ = tokio::time::timeout(Duration::from_secs(1), watch.look()).await;
        }
        self.disk_stopped()
    }

    /// Starts the disk budget's watcher: `base` is what `roots` took
    /// before the sandbox could write.
    pub(crate) fn watch_disk(&self, roots: Vec<std::path::PathBuf>, budget: u64, base: u64) {
        let (tx, rx) = std::sync::mpsc::channel();
        let watch = DiskWatch {
            budget,
            used: Default::default(),
            looks: std::sync::Mutex::new(tx),
        };
        if self.inner.disk.set(watch).is_err() {
            return;
        }
        let weak = std::sync::Arc::downgrade(&self.inner);
        let holder = self.inner.host_pid();
        let spawned = std::thread::Builder::new()
            .name("cordon-disk".into())
            .spawn(move || self::watch(weak, roots, budget, base, holder, rx));
        if let Err(e) = spawned {
            // Without its watcher the budget would not hold.
            tracing::error!("cannot start the disk watcher: {e}; stopping the sandbox");
            self.inner.lifecycle.kill();
            self.inner.mark_gone();
        }
    }
}

/// The host directories a budget covers: the workspace and the writable
/// binds, each resolved once by the host (their paths are the host's).
pub(crate) fn roots(config: &SandboxConfig) -> std::result::Result<Vec<PathBuf>, String> {
    std::iter::once(&config.workspace)
        .chain(
            config
                .binds
                .iter()
                .filter(|b| b.writable)
                .map(|b| &b.source),
        )
        .map(|p| {
            p.canonicalize()
                .map_err(|e| format!("{}: {e}", p.display()))
        })
        .collect()
}

/// Bytes allocated on disk beneath `roots`, each inode once; with
/// `holder`, also those of files on the roots' file systems that were
/// deleted but are held open by `holder` or its descendants (a sandbox's
/// processes, or the QEMU that serves a guest's files): they take space
/// until closed, and no directory shows them.
pub(crate) fn measure(roots: &[PathBuf], holder: Option<i32>) -> std::io::Result<u64> {
    let mut walk = Walk::new(0o500);
    for root in roots {
        walk.root(root)?;
    }
    if let Some(pid) = holder {
        walk.deleted_held_files(pid);
    }
    Ok(walk.total)
}

/// Bytes allocated on disk beneath the directory `root`, as the budget
/// counts them: each inode once, no link followed, nothing on another
/// file system.
pub fn allocated(root: &Path) -> std::io::Result<u64> {
    measure(&[root.to_path_buf()], None)
}

/// Most processes looked at for open files: more than a sandbox may have.
const MAX_HOLDERS: usize = 8192;
/// Most bytes of one process's `/proc/PID/maps` read: about 10,000
/// mappings.
const MAX_MAPS: u64 = 1 << 20;

/// A line of `/proc/PID/maps` for a file that was deleted.
struct DeletedMapping<'a> {
    /// `start-end`, as `map_files` names it.
    range: &'a str,
    dev: u64,
    ino: u64,
    len: u64,
}

impl<'a> DeletedMapping<'a> {
    /// `start-end perms offset major:minor inode path (deleted)`; only a
    /// line whose path ends so. A name made to end in " (deleted)" is
    /// only counted twice, to the sandbox's own cost.
    fn parse(line: &'a str) -> Option<DeletedMapping<'a>> {
        if !line.ends_with(" (deleted)") {
            return None;
        }
        let mut f = line.split_ascii_whitespace();
        let range = f.next()?;
        let (_perms, _offset) = (f.next()?, f.next()?);
        let (major, minor) = f.next()?.split_once(':')?;
        let ino = f.next()?.parse().ok()?;
        let (start, end) = range.split_once('-')?;
        let len = u64::from_str_radix(end, 16)
            .ok()?
            .checked_sub(u64::from_str_radix(start, 16).ok()?)?;
        let dev = rustix::fs::makedev(
            u32::from_str_radix(major, 16).ok()?,
            u32::from_str_radix(minor, 16).ok()?,
        );
        Some(DeletedMapping {
            range,
            dev,
            ino,
            len,
        })
    }
}

/// `pid` and its descendants, through `/proc/PID/task/TID/children`.
fn descendants(pid: i32) -> Vec<i32> {
    let mut out = vec![pid];
    let mut i = 0;
    while i < out.len() && out.len() < MAX_HOLDERS {
        let p = out[i];
        i += 1;
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let path = t.path().join("children");
            if let Ok(list) = std::fs::read_to_string(path) {
                out.extend(
                    list.split_whitespace()
                        .filter_map(|c| c.parse::<i32>().ok()),
                );
            }
        }
    }
    out
}

/// Gives every directory beneath `root` (a sandbox's workspace) that its
/// owner cannot read, search or write its owner's bits back, so that
/// `std::fs::remove_dir_all` can remove it. Walked as the disk budget's
/// watcher walks: no link is followed, no other file system entered.
pub fn make_removable(root: &Path) -> std::io::Result<()> {
    let mut walk = Walk::new(0o700);
    let st = rustix::fs::lstat(root)?;
    if FileType::from_raw_mode(st.st_mode) == FileType::Directory && st.st_mode & 0o700 != 0o700 {
        let _ = rustix::fs::chmod(root, Mode::from_raw_mode((st.st_mode & 0o7777) | 0o700));
    }
    walk.root(root)
}

struct Walk {
    /// Directories, and files with more than one link, already counted.
    seen: HashSet<(u64, u64)>,
    total: u64,
    /// The device of the root being walked: nothing on another is counted.
    dev: u64,
    own_uid: u32,
    /// The owner's bits every directory must have: read and search to be
    /// measured, and write to be emptied.
    need: u32,
    /// The devices of the roots walked.
    devs: Vec<u64>,
}

/// A directory on the way down.
struct Frame {
    /// Held for the top [`OPEN_LEVELS`] levels only.
    fd: Option<OwnedFd>,
    /// Its name in its parent, to reopen it when `fd` is `None`.
    name: CString,
    id: (u64, u64),
    /// Subdirectories still to walk, with their identities.
    pending: Vec<(CString, (u64, u64))>,
}

fn id(st: &Stat) -> (u64, u64) {
    (st.st_dev, st.st_ino)
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY
}

impl Walk {
    fn new(need: u32) -> Walk {
        Walk {
            seen: HashSet::new(),
            total: 0,
            dev: 0,
            own_uid: rustix::process::geteuid().as_raw(),
            need,
            devs: Vec::new(),
        }
    }

    /// Counts the deleted files on the roots' devices that `holder` and
    /// its descendants hold open or mapped: they take space until let go,
    /// and no directory shows them. The descriptors and mappings are only
    /// looked at (`stat` of `/proc/PID/fd/N` or `/proc/PID/map_files/R`
    /// gives the file's inode and size), never opened; what a process hides
    /// from us (a non-dumpable supervisor) holds no workspace file.
    fn deleted_held_files(&mut self, holder: i32) {
        for pid in descendants(holder) {
            self.deleted_open_files(pid);
            self.deleted_mapped_files(pid);
        }
    }

    fn deleted_open_files(&mut self, pid: i32) {
        let Ok(fds) = std::fs::read_dir(format!("/proc/{pid}/fd")) else {
            return;
        };
        for fd in fds.flatten() {
            if let Ok(st) = rustix::fs::stat(fd.path()) {
                self.count_deleted(&st);
            }
        }
    }

    /// A file mapped and then closed and unlinked is held by the mapping
    /// alone. `/proc/PID/maps` names such mappings (device, inode, and
    /// " (deleted)"); the size comes from `map_files`, which the kernel
    /// lets only a privileged watcher follow. Without that, the mapping's
    /// length is counted: a lower bound (docs/sandbox.md, "Disk budget").
    fn deleted_mapped_files(&mut self, pid: i32) {
        let Ok(maps) = std::fs::File::open(format!("/proc/{pid}/maps")) else {
            return;
        };
        let mut text = String::new();
        if std::io::Read::read_to_string(&mut std::io::Read::take(maps, MAX_MAPS), &mut text)
            .is_err()
        {
            return;
        }
        for line in text.lines() {
            let Some(m) = DeletedMapping::parse(line) else {
                continue;
            };
            if !self.devs.contains(&m.dev) {
                continue;
            }
            match rustix::fs::stat(format!("/proc/{pid}/map_files/{}", m.range).as_str()) {
                Ok(st) => self.count_deleted(&st),
                Err(_) => {
                    if self.seen.insert((m.dev, m.ino)) {
                        self.total += m.len;
                    }
                }
            }
        }
    }

    /// Adds a regular file with no name left on a root's device, once.
    fn count_deleted(&mut self, st: &Stat) {
        if FileType::from_raw_mode(st.st_mode) == FileType::RegularFile
            && st.st_nlink == 0
            && self.devs.contains(&st.st_dev)
            && self.seen.insert(id(st))
        {
            self.total += st.st_blocks as u64 * 512;
        }
    }

    fn root(&mut self, root: &Path) -> std::io::Result<()> {
        let fd = rustix::fs::open(root, dir_flags(), Mode::empty())?;
        let st = rustix::fs::fstat(&fd)?;
        self.dev = st.st_dev;
        self.devs.push(st.st_dev);
        if !self.seen.insert(id(&st)) {
            return Ok(());
        }
        self.total += st.st_blocks as u64 * 512;
        let pending = self.list(fd.as_fd());
        let mut stack = vec![Frame {
            fd: Some(fd),
            name: CString::from(c"."),
            id: id(&st),
            pending,
        }];
        while let Some(top) = stack.last_mut() {
            let Some((name, want)) = top.pending.pop() else {
                stack.pop();
                continue;
            };
            let reopened;
            let parent = match &stack[stack.len() - 1].fd {
                Some(fd) => fd.as_fd(),
                None => match reopen(&stack) {
                    Some(fd) => {
                        reopened = fd;
                        reopened.as_fd()
                    }
                    None => {
                        // The tree changed under the walk; what is left
                        // of this directory is counted at the next look.
                        stack.pop();
                        continue;
                    }
                },
            };
            let Some(fd) = self.open_dir(parent, &name, want) else {
                continue;
            };
            let pending = self.list(fd.as_fd());
            let keep = stack.len() < OPEN_LEVELS;
            stack.push(Frame {
                fd: keep.then_some(fd),
                name,
                id: want,
                pending,
            });
        }
        Ok(())
    }

    /// Counts the entries of `dir` and returns its subdirectories on the
    /// same device that were not counted before.
    fn list(&mut self, dir: BorrowedFd<'_>) -> Vec<(CString, (u64, u64))> {
        let mut subdirs = Vec::new();
        let Ok(entries) = rustix::fs::Dir::read_from(dir) else {
            return subdirs;
        };
        for entry in entries {
            let Ok(entry) = entry else { break };
            let name = entry.file_name();
            if name == c"." || name == c".." {
                continue;
            }
            let Ok(st) = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) else {
                // Gone since it was listed, or not ours to look at.
                continue;
            };
            if st.st_dev != self.dev {
                continue;
            }
            let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
            if (is_dir || st.st_nlink > 1) && !self.seen.insert(id(&st)) {
                continue;
            }
            self.total += st.st_blocks as u64 * 512;
            if is_dir {
                subdirs.push((name.to_owned(), id(&st)));
            }
        }
        subdirs
    }

    /// Opens the subdirectory `name` of `parent`, which must still be the
    /// directory `want` that was listed. A directory the sandbox made
    /// unreadable to its owner (mode 000, under which it could hide what
    /// it writes) is given back its owner's read and search bits.
    fn open_dir(&self, parent: BorrowedFd<'_>, name: &CStr, want: (u64, u64)) -> Option<OwnedFd> {
        let fd = match rustix::fs::openat(parent, name, dir_flags(), Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ACCESS) => {
                self.unlock(parent, name, want)?;
                rustix::fs::openat(parent, name, dir_flags(), Mode::empty()).ok()?
            }
            Err(_) => return None,
        };
        let st = rustix::fs::fstat(&fd).ok()?;
        if id(&st) != want {
            return None;
        }
        if st.st_mode & self.need != self.need && st.st_uid == self.own_uid && self.own_uid != 0 {
            // Readable but not searchable (or not writable, to remove).
            self.unlock(parent, name, want)?;
        }
        Some(fd)
    }

    /// Adds `u+rx` to the directory `name` of `parent`, identified by
    /// `want`, through a descriptor that refers to it and nothing else.
    fn unlock(&self, parent: BorrowedFd<'_>, name: &CStr, want: (u64, u64)) -> Option<()> {
        let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
        let p = rustix::fs::openat(parent, name, flags, Mode::empty()).ok()?;
        let st = rustix::fs::fstat(&p).ok()?;
        if id(&st) != want || st.st_uid != self.own_uid {
            return None;
        }
        // chmod through the descriptor's /proc link changes exactly the
        // inode it was opened on (fchmod refuses O_PATH descriptors).
        let link = format!("/proc/self/fd/{}", p.as_raw_fd());
        let mode = Mode::from_raw_mode((st.st_mode & 0o7777) | self.need);
        rustix::fs::chmod(link.as_str(), mode).ok()
    }
}

/// A descriptor of the top frame's directory: its own, or one reopened by
/// name from the deepest open level, each step checked to be the
/// directory that was walked through. `None` if the tree changed.
fn reopen(stack: &[Frame]) -> Option<OwnedFd> {
    let top = stack.len().checked_sub(1)?;
    let base = (0..=top).rev().find(|&i| stack[i].fd.is_some())?;
    let mut fd = rustix::io::dup(stack[base].fd.as_ref()?).ok()?;
    for frame in &stack[base + 1..=top] {
        let next = rustix::fs::openat(&fd, &frame.name, dir_flags(), Mode::empty()).ok()?;
        if rustix::fs::fstat(&next).ok().map(|st| id(&st)) != Some(frame.id) {
            return None;
        }
        fd = next;
    }
    Some(fd)
}

/// Runs the watcher until the sandbox ends or overruns its budget, which
/// then stops it. `base` is what the roots took when the sandbox started.
pub(crate) fn watch(
    weak: Weak<Inner>,
    roots: Vec<PathBuf>,
    budget: u64,
    base: u64,
    holder: i32,
    requests: Receiver<LookRequest>,
) {
    // Ahead of the sandbox's writers on a busy host, where it can (root):
    // a look that waits for a CPU lets them write on. Linux gives each
    // thread its own nice value.
    // SAFETY: setpriority on this thread's own id.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -10);
    }
    let mut waiting: Vec<LookRequest> = Vec::new();
    let mut last: Option<(Instant, u64)> = None;
    loop {
        let started = Instant::now();
        let cpu = thread_cpu_time();
        let used = measure(&roots, Some(holder));
        let took = started.elapsed();
        let mut pause = ((thread_cpu_time() - cpu) * PAUSE_FACTOR).clamp(MIN_PAUSE, MAX_PAUSE);
        let Some(inner) = weak.upgrade() else { return };
        if inner.is_gone() {
            return;
        }
        match used {
            Ok(used) if used.saturating_sub(base) > budget => {
                inner.disk_exceeded(used - base);
                return;
            }
            Ok(used) => {
                if let Some(w) = inner.disk.get() {
                    w.used.store(
                        used.saturating_sub(base),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
                // Growing fast: have the next look done before half the
                // headroom left could be written at the rate just seen; it
                // is written during the pause and during that look.
                if let Some((at, before)) = last
                    && used > before
                {
                    let rate = (used - before) as f64 / at.elapsed().as_secs_f64().max(1e-3);
                    let headroom = budget.saturating_sub(used.saturating_sub(base));
                    let soon =
                        Duration::from_secs_f64(headroom as f64 / rate / 2.0).saturating_sub(took);
                    pause = pause.min(soon.max(MIN_FAST_PAUSE));
                }
                last = Some((started, used));
            }
            Err(e) => tracing::warn!("cannot measure the sandbox's workspace: {e}"),
        }
        drop(inner);
        for w in waiting.drain(..) {
            let _ = w.send(());
        }
        tracing::trace!(?took, ?pause, "disk look");
        match requests.recv_timeout(pause) {
            Ok(r) => {
                waiting.push(r);
                waiting.extend(requests.try_iter());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// CPU time this thread has used: what a look costs the host, whatever
/// the wait for a CPU or a lock made of its wall time.
fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}

#[cfg(test)]
mod tests {
    use super::DeletedMapping;

    #[test]
    fn a_deleted_mapping_is_read_from_its_maps_line() {
        let m = DeletedMapping::parse(
            "7f0000001000-7f0000003000 r--s 00000000 fd:01 1234 /workspace/x (deleted)",
        )
        .unwrap();
        assert_eq!(
            (m.range, m.dev, m.ino, m.len),
            (
                "7f0000001000-7f0000003000",
                rustix::fs::makedev(0xfd, 1),
                1234,
                0x2000
            )
        );
        for line in [
            "7f0000001000-7f0000003000 r--s 00000000 fd:01 1234 /workspace/x",
            "7f0000003000-7f0000001000 r--s 00000000 fd:01 1234 /x (deleted)",
            "garbage (deleted)",
        ] {
            assert!(DeletedMapping::parse(line).is_none(), "{line}");
        }
    }

    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn measure_dir(d: &Path) -> u64 {
        measure(&[d.to_path_buf()], None).unwrap()
    }

    #[test]
    fn counts_allocated_bytes_once_per_inode() {
        let d = tempfile::tempdir().unwrap();
        let empty = measure_dir(d.path());
        std::fs::write(d.path().join("a"), vec![1u8; 1 << 20]).unwrap();
        let one = measure_dir(d.path()) - empty;
        assert!((1 << 20..(1 << 20) + 65536).contains(&one), "{one}");
        std::fs::hard_link(d.path().join("a"), d.path().join("b")).unwrap();
        std::fs::create_dir(d.path().join("sub")).unwrap();
        std::fs::hard_link(d.path().join("a"), d.path().join("sub/c")).unwrap();
        let linked = measure_dir(d.path()) - empty;
        assert!(linked < one + 65536, "hard links counted twice: {linked}");
        let f = std::fs::File::create(d.path().join("sparse")).unwrap();
        f.set_len(1 << 30).unwrap();
        assert!(measure_dir(d.path()) - empty < one + 65536 * 2);
    }

    #[test]
    fn does_not_follow_symlinks_and_sees_into_locked_directories() {
        let d = tempfile::tempdir().unwrap();
        let big = tempfile::tempdir().unwrap();
        std::fs::write(big.path().join("x"), vec![1u8; 4 << 20]).unwrap();
        std::os::unix::fs::symlink(big.path(), d.path().join("link")).unwrap();
        std::os::unix::fs::symlink("/", d.path().join("root")).unwrap();
        assert!(measure_dir(d.path()) < 1 << 20);
        let locked = d.path().join("locked");
        std::fs::create_dir(&locked).unwrap();
        std::fs::write(locked.join("x"), vec![1u8; 4 << 20]).unwrap();
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
        assert!(measure_dir(d.path()) >= 4 << 20);
        std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o700)).unwrap();
    }

    /// Run by [`locked_trees_become_removable_for_their_owner`] as the
    /// tree's unprivileged owner; does nothing otherwise.
    #[test]
    fn removal_helper() {
        if let Some(dir) = std::env::var_os("CORDON_TEST_REMOVE") {
            let dir = PathBuf::from(dir);
            assert!(
                std::fs::remove_dir_all(&dir).is_err(),
                "locked, yet removed"
            );
            make_removable(&dir).unwrap();
            std::fs::remove_dir_all(&dir).unwrap();
        }
    }

    /// A workspace whose sandbox locked directories (000, 555) against
    /// their owner can still be removed by that owner (an unprivileged
    /// `cordon serve` removing a finished job's workspace).
    #[test]
    fn locked_trees_become_removable_for_their_owner() {
        use std::os::unix::process::CommandExt;
        if rustix::process::geteuid().as_raw() != 0 {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "needs root to act as another user; CI=true, so it fails rather than skips"
            );
            eprintln!("notice: needs root to act as another user; skipped");
            return;
        }
        let top = tempfile::tempdir().unwrap();
        std::fs::set_permissions(top.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        let ws = top.path().join("ws");
        for d in ["a/b", "ro/x", "link-target-kept"] {
            std::fs::create_dir_all(ws.join(d)).unwrap();
        }
        std::fs::write(ws.join("a/b/f"), "x").unwrap();
        std::fs::write(ws.join("ro/x/f"), "x").unwrap();
        // Outside: must survive and keep its mode.
        let outside = top.path().join("outside");
        std::fs::create_dir(&outside).unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("out")).unwrap();
        let nobody = 65534;
        for e in walk_paths(&ws) {
            std::os::unix::fs::lchown(&e, Some(nobody), Some(nobody)).unwrap();
        }
        std::os::unix::fs::chown(&outside, Some(nobody), Some(nobody)).unwrap();
        // The job directory holding the workspace is the server's.
        std::os::unix::fs::chown(top.path(), Some(nobody), Some(nobody)).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o500)).unwrap();
        std::fs::set_permissions(ws.join("a/b"), std::fs::Permissions::from_mode(0o000)).unwrap();
        std::fs::set_permissions(ws.join("a"), std::fs::Permissions::from_mode(0o000)).unwrap();
        std::fs::set_permissions(ws.join("ro"), std::fs::Permissions::from_mode(0o555)).unwrap();
        let status = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "disk::tests::removal_helper",
                "--test-threads",
                "1",
            ])
            .env("CORDON_TEST_REMOVE", &ws)
            .uid(nobody)
            .gid(nobody)
            .status()
            .unwrap();
        assert!(status.success());
        assert!(!ws.exists());
        let mode = std::fs::metadata(&outside).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o500, "a directory outside was changed");
    }

    fn walk_paths(root: &Path) -> Vec<PathBuf> {
        let mut out = vec![root.to_path_buf()];
        let mut i = 0;
        while i < out.len() {
            let p = out[i].clone();
            if std::fs::symlink_metadata(&p).unwrap().is_dir() {
                for e in std::fs::read_dir(&p).unwrap() {
                    out.push(e.unwrap().path());
                }
            }
            i += 1;
        }
        out
    }

    #[test]
    fn walks_trees_deeper_than_the_open_levels() {
        let d = tempfile::tempdir().unwrap();
        let mut p = d.path().to_path_buf();
        for _ in 0..OPEN_LEVELS * 2 + 5 {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        std::fs::write(p.join("x"), vec![1u8; 2 << 20]).unwrap();
        assert!(measure_dir(d.path()) >= 2 << 20);
    }
}
