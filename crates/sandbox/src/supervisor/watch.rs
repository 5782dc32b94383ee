//! Watches of directories for the host (`HostMsg::Watch`), with inotify,
//! read by the serve loop: each change is sent as it is read, and every
//! watch is read to its end before an exec's end or a file system answer
//! is reported, so that a client that wrote a file and then asks what
//! changed finds it there.
//!
//! inotify's watches count against a limit of the host user's, so a
//! sandbox holds at most [`WATCHES_MAX`] watches over at most
//! [`WATCH_DIRS_MAX`] directories in all.

use std::collections::{BTreeMap, HashMap};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use crate::protocol::{
    ChangeKind, FsChange, FsErrorKind, FsFailure, SupMsg, WATCH_DIRS_MAX, WATCHES_MAX,
};

/// What each directory is watched for.
const MASK: u32 = libc::IN_CREATE
    | libc::IN_MODIFY
    | libc::IN_ATTRIB
    | libc::IN_MOVED_FROM
    | libc::IN_MOVED_TO
    | libc::IN_DELETE
    | libc::IN_DELETE_SELF
    | libc::IN_MOVE_SELF
    | libc::IN_ONLYDIR
    | libc::IN_DONT_FOLLOW;

/// Changes sent in one message at most.
const CHANGES_PER_MESSAGE: usize = 256;

struct Watch {
    fd: OwnedFd,
    root: PathBuf,
    recursive: bool,
    /// Watch descriptors and their directories, relative to the root.
    dirs: HashMap<i32, String>,
}

#[derive(Default)]
pub(super) struct Watches {
    by_id: BTreeMap<u64, Watch>,
}

fn failure(kind: FsErrorKind, message: impl Into<String>) -> FsFailure {
    FsFailure {
        kind,
        message: message.into(),
    }
}

impl Watches {
    fn dirs(&self) -> usize {
        self.by_id.values().map(|w| w.dirs.len()).sum()
    }

    /// Starts watch `id` of directory `path`.
    pub(super) fn add(&mut self, id: u64, path: &str, recursive: bool) -> Result<(), FsFailure> {
        if self.by_id.len() >= WATCHES_MAX {
            return Err(failure(
                FsErrorKind::Refused,
                format!("a sandbox watches at most {WATCHES_MAX} directories at once"),
            ));
        }
        if !path.starts_with('/') || path.contains('\0') {
            return Err(failure(
                FsErrorKind::Other,
                format!("{path:?} is not an absolute path"),
            ));
        }
        let root = std::fs::canonicalize(path).map_err(|e| {
            let kind = if e.kind() == std::io::ErrorKind::NotFound {
                FsErrorKind::NotFound
            } else {
                FsErrorKind::Other
            };
            failure(kind, format!("{path}: {e}"))
        })?;
        if root.starts_with("/proc") {
            return Err(failure(
                FsErrorKind::Refused,
                format!("{path}: /proc is not watched here"),
            ));
        }
        if !root.is_dir() {
            return Err(failure(
                FsErrorKind::NotADirectory,
                format!("{path}: not a directory"),
            ));
        }
        // SAFETY: plain syscall; the descriptor is owned at once.
        let raw = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if raw < 0 {
            return Err(failure(
                FsErrorKind::Other,
                format!("inotify: {}", std::io::Error::last_os_error()),
            ));
        }
        // SAFETY: just made, ours alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut w = Watch {
            fd,
            root,
            recursive,
            dirs: HashMap::new(),
        };
        let room = WATCH_DIRS_MAX.saturating_sub(self.dirs());
        w.add_tree("", room, None)?;
        self.by_id.insert(id, w);
        Ok(())
    }

    pub(super) fn remove(&mut self, id: u64) {
        self.by_id.remove(&id);
    }

    /// Each watch's descriptor, to poll.
    pub(super) fn fds(&self) -> Vec<(i32, u64)> {
        self.by_id
            .iter()
            .map(|(&id, w)| (w.fd.as_raw_fd(), id))
            .collect()
    }

    /// Reads what watch `id` has, sending it.
    pub(super) fn read(&mut self, id: u64, send: &mut impl FnMut(&SupMsg)) {
        let room = WATCH_DIRS_MAX.saturating_sub(self.dirs());
        let Some(w) = self.by_id.get_mut(&id) else {
            return;
        };
        let (changes, overflowed) = w.read(room);
        for chunk in changes.chunks(CHANGES_PER_MESSAGE) {
            send(&SupMsg::Changes {
                id,
                changes: chunk.to_vec(),
                overflowed: false,
            });
        }
        if overflowed {
            send(&SupMsg::Changes {
                id,
                changes: Vec::new(),
                overflowed: true,
            });
            self.by_id.remove(&id);
        }
    }

    /// Reads every watch to its end.
    pub(super) fn drain(&mut self, send: &mut impl FnMut(&SupMsg)) {
        let ids: Vec<u64> = self.by_id.keys().copied().collect();
        for id in ids {
            self.read(id, send);
        }
    }
}

impl Watch {
    /// Watches directory `rel` (below the root), and with `recursive` the
    /// directories below it, within `room` more directories. With `found`,
    /// what is in them already is reported made: a directory made while
    /// its parent was watched may have been filled before it was watched.
    fn add_tree(
        &mut self,
        rel: &str,
        room: usize,
        mut found: Option<&mut Vec<FsChange>>,
    ) -> Result<(), FsFailure> {
        let mut todo = vec![rel.to_string()];
        let mut added = 0;
        while let Some(rel) = todo.pop() {
            if added >= room {
                return Err(failure(
                    FsErrorKind::Refused,
                    format!("more than {WATCH_DIRS_MAX} directories would be watched; watch less"),
                ));
            }
            let dir = self.root.join(&rel);
            let Some(wd) = add_watch(&self.fd, &dir) else {
                // Gone or unreadable since it was seen: not watched.
                if rel.is_empty() {
                    return Err(failure(
                        FsErrorKind::Other,
                        format!("{}: {}", dir.display(), std::io::Error::last_os_error()),
                    ));
                }
                continue;
            };
            self.dirs.insert(wd, rel.clone());
            added += 1;
            if !self.recursive {
                break;
            }
            let Ok(entries) = std::fs::read_dir(&dir) else {
                continue;
            };
            let mut names: Vec<_> = entries.flatten().collect();
            names.sort_by_key(|e| e.file_name());
            for e in names {
                let child = join(&rel, &e.file_name().to_string_lossy());
                if let Some(found) = found.as_deref_mut() {
                    found.push(FsChange {
                        path: child.clone(),
                        kind: ChangeKind::Create,
                    });
                }
                if e.file_type().is_ok_and(|t| t.is_dir()) {
                    todo.push(child);
                }
            }
        }
        Ok(())
    }

    /// What was read, and whether the kernel's queue overflowed.
    fn read(&mut self, room: usize) -> (Vec<FsChange>, bool) {
        let mut out = Vec::new();
        let mut buf = vec![0u8; 64 * 1024];
        let mut room = room;
        loop {
            // SAFETY: reading into our buffer.
            let n = unsafe { libc::read(self.fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len()) };
            if n <= 0 {
                return (out, false);
            }
            let mut at = 0;
            let n = n as usize;
            while at + 16 <= n {
                let word = |i: usize| {
                    [
                        buf[at + i],
                        buf[at + i + 1],
                        buf[at + i + 2],
                        buf[at + i + 3],
                    ]
                };
                let wd = i32::from_ne_bytes(word(0));
                let mask = u32::from_ne_bytes(word(4));
                let len = u32::from_ne_bytes(word(12)) as usize;
                let name_end = (at + 16 + len).min(n);
                let name_bytes = &buf[at + 16..name_end];
                let name = String::from_utf8_lossy(
                    &name_bytes[..name_bytes
                        .iter()
                        .position(|&b| b == 0)
                        .unwrap_or(name_bytes.len())],
                )
                .into_owned();
                at = name_end;
                if mask & libc::IN_Q_OVERFLOW != 0 {
                    return (out, true);
                }
                if mask & libc::IN_IGNORED != 0 {
                    self.dirs.remove(&wd);
                    continue;
                }
                let Some(dir) = self.dirs.get(&wd).cloned() else {
                    continue;
                };
                let path = if name.is_empty() {
                    dir.clone()
                } else {
                    join(&dir, &name)
                };
                for kind in kinds(mask) {
                    out.push(FsChange {
                        path: path.clone(),
                        kind,
                    });
                }
                let new_dir =
                    mask & libc::IN_ISDIR != 0 && mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0;
                if self.recursive && new_dir && room > 0 {
                    let before = self.dirs.len();
                    // Past the bound, the rest goes unwatched.
                    let _ = self.add_tree(&path, room, Some(&mut out));
                    room = room.saturating_sub(self.dirs.len() - before);
                }
            }
        }
    }
}

fn add_watch(fd: &OwnedFd, dir: &Path) -> Option<i32> {
    let c = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok()?;
    // SAFETY: a valid descriptor and a NUL-terminated path.
    let wd = unsafe { libc::inotify_add_watch(fd.as_raw_fd(), c.as_ptr(), MASK) };
    (wd >= 0).then_some(wd)
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

/// The changes one event says, in the order fsnotify gives them.
fn kinds(mask: u32) -> Vec<ChangeKind> {
    let mut out = Vec::new();
    if mask & (libc::IN_CREATE | libc::IN_MOVED_TO) != 0 {
        out.push(ChangeKind::Create);
    }
    if mask & (libc::IN_MOVED_FROM | libc::IN_MOVE_SELF) != 0 {
        out.push(ChangeKind::Rename);
    }
    if mask & libc::IN_ATTRIB != 0 {
        out.push(ChangeKind::Chmod);
    }
    if mask & libc::IN_MODIFY != 0 {
        out.push(ChangeKind::Write);
    }
    if mask & (libc::IN_DELETE | libc::IN_DELETE_SELF) != 0 {
        out.push(ChangeKind::Remove);
    }
    out
}
