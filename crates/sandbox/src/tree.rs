//! What a workspace takes on the host's disk, and opening up what a
//! killed sandbox left unremovable: walks of a hostile tree.
//!
//! The workspace is hostile, so a walk is descriptor-relative: every
//! directory is opened with `openat(O_NOFOLLOW | O_DIRECTORY)` from its
//! parent's descriptor, entries are looked at with `fstatat` without
//! following links, nothing on another device (a mount point) is counted or
//! entered, and nothing read from there is printed. Sizes are allocated
//! bytes (`st_blocks` x 512), each inode once, so sparse files count what
//! they hold and hard links count once.

use std::collections::HashSet;
use std::ffi::{CStr, CString};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Stat};
use rustix::io::Errno;

use crate::config::SandboxConfig;

/// Directory levels held open during a walk; deeper ones are reopened by
/// name from the deepest open one, so a tree of any depth costs a bounded
/// number of descriptors.
const OPEN_LEVELS: usize = 64;

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

/// Bytes allocated on disk beneath `roots`, each inode once; also those
/// of files on the roots' file systems that were deleted but are held
/// open by one of `holders` or their descendants (a sandbox's processes,
/// or the QEMU and share servers that serve a guest's files): they take
/// space until closed, and no directory shows them.
pub(crate) fn measure(roots: &[PathBuf], holders: &[i32]) -> std::io::Result<u64> {
    let mut walk = Walk::new(0o500);
    for root in roots {
        walk.root(root)?;
    }
    for &pid in holders {
        walk.deleted_held_files(pid);
    }
    Ok(walk.total)
}

/// Bytes allocated on disk beneath the directory `root`, as the budget
/// counts them: each inode once, no link followed, nothing on another
/// file system.
pub fn allocated(root: &Path) -> std::io::Result<u64> {
    measure(&[root.to_path_buf()], &[])
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
        measure(&[d.to_path_buf()], &[]).unwrap()
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
                "tree::tests::removal_helper",
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
