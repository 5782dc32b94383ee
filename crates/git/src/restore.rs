//! Writing a snapshot's files back into a workspace the sandbox may still
//! be changing.
//!
//! Every name is opened relative to its parent's descriptor, beneath the
//! workspace root and never through a link (`RESOLVE_NO_SYMLINKS`), so a
//! directory swapped for a link to `/` while cordon writes cannot take a
//! write outside. Files are written under a temporary name and renamed
//! over the old one, so a link at that name is replaced, not followed.
//!
//! Nothing that the snapshot taken just before (`current`) does not hold
//! is removed or overwritten: ignored files, files too large to keep, and
//! anything that appeared since, are left as they are and reported.

use std::collections::{BTreeMap, BTreeSet};
use std::ffi::OsStr;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::process::Stdio;

use cordon_tools::walk::{STRICT, open_at};
use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use serde::{Deserialize, Serialize};

use crate::command::{Git, GitError, shown_stderr};
use crate::snapshot::{Meta, is_control};

/// One entry of a tree: its mode and object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Blob {
    pub mode: u32,
    pub oid: String,
}

/// A tree's files, all levels, by path.
pub(crate) type Files = BTreeMap<Vec<u8>, Blob>;

/// The files of `commit`.
pub(crate) fn files(git: &Git, commit: &str) -> Result<Files, GitError> {
    let out = git.run(["ls-tree", "-r", "-z", "--full-tree", commit])?;
    let mut files = Files::new();
    for rec in out.split(|b| *b == 0).filter(|r| !r.is_empty()) {
        let bad = || GitError::Unexpected {
            command: "ls-tree".into(),
            what: cordon_tools::printable(&String::from_utf8_lossy(rec)),
        };
        let tab = rec.iter().position(|b| *b == b'\t').ok_or_else(bad)?;
        let (meta, path) = (&rec[..tab], &rec[tab + 1..]);
        let meta = std::str::from_utf8(meta).map_err(|_| bad())?;
        let mut parts = meta.split(' ');
        let (Some(mode), Some(kind), Some(oid)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        // Submodules (commits) are never in cordon's snapshots.
        if kind != "blob" {
            continue;
        }
        let mode = u32::from_str_radix(mode, 8).map_err(|_| bad())?;
        files.insert(
            path.to_vec(),
            Blob {
                mode,
                oid: oid.to_string(),
            },
        );
    }
    Ok(files)
}

/// Why a file was not put back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Kept {
    /// Relative to the workspace root, made printable.
    pub path: String,
    pub why: String,
}

/// What a restore did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Restored {
    pub written: usize,
    pub removed: usize,
    /// Paths left as they were, each with the reason.
    pub kept: Vec<Kept>,
}

/// Makes the files of the workspace at `root` those of `target`, given
/// that they are now `current`.
pub(crate) fn restore(
    git: &Git,
    root: &Path,
    current: &Files,
    target: &Files,
    meta: &Meta,
) -> Result<Restored, RestoreError> {
    let root = rustix::fs::open(
        root,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RestoreError::Root(e.into()))?;
    let mut done = Restored::default();
    let keep = |done: &mut Restored, path: &[u8], why: &str| {
        done.kept.push(Kept {
            path: shown(path),
            why: why.to_string(),
        })
    };

    // 1. What the target does not hold goes.
    let target_dirs: BTreeSet<&[u8]> = target.keys().flat_map(|p| parents(p)).collect();
    let mut emptied: BTreeSet<Vec<u8>> = BTreeSet::new();
    let left_out: BTreeSet<&[u8]> = meta.skipped.iter().map(Vec::as_slice).collect();
    for path in current.keys().filter(|p| !target.contains_key(*p)) {
        if !allowed(path) {
            continue;
        }
        // The target did not keep it (too large, say): as it is now.
        if left_out.contains(path.as_slice()) {
            keep(
                &mut done,
                path,
                "too large or unreadable when that checkpoint was taken, so it is left as it is",
            );
            continue;
        }
        // The target's walk did not see everything: nothing is removed
        // on its word.
        if meta.incomplete {
            keep(
                &mut done,
                path,
                "that checkpoint is incomplete, so nothing is removed",
            );
            continue;
        }
        match remove(&root, path) {
            Ok(()) => {
                done.removed += 1;
                emptied.extend(
                    parents(path)
                        .filter(|d| !target_dirs.contains(d))
                        .map(<[u8]>::to_vec),
                );
            }
            Err(Errno::NOENT) => {}
            Err(Errno::ISDIR) => keep(&mut done, path, "became a directory since"),
            Err(_) => keep(&mut done, path, "could not be removed"),
        }
    }
    // Deepest first, so a directory's emptied children go before it.
    let mut emptied: Vec<Vec<u8>> = emptied.into_iter().collect();
    emptied.sort_by_key(|d| std::cmp::Reverse(d.iter().filter(|b| **b == b'/').count()));
    for dir in &emptied {
        if let Ok((parent, name)) = parent_of(&root, dir, false) {
            // Not empty: it holds what no snapshot recorded; it stays.
            let _ = rustix::fs::unlinkat(&parent, name, AtFlags::REMOVEDIR);
        }
    }

    // 2. What differs is written.
    let changed: Vec<(&Vec<u8>, &Blob)> = target
        .iter()
        .filter(|(p, b)| current.get(*p) != Some(*b) && allowed(p))
        .collect();
    if changed.is_empty() {
        return Ok(done);
    }
    let mut cat = CatFile::start(git)?;
    for (path, blob) in changed {
        let content = cat.get(&blob.oid)?;
        match write(&root, path, blob.mode, &content, current.contains_key(path)) {
            Ok(()) => done.written += 1,
            Err(why) => keep(&mut done, path, why),
        }
    }
    cat.finish()?;
    Ok(done)
}

/// Whether a restore may touch `path`: no `.git` at any depth, no control
/// file at the top, no empty or dot component.
fn allowed(path: &[u8]) -> bool {
    let mut parts = path.split(|b| *b == b'/');
    let Some(first) = parts.next() else {
        return false;
    };
    if is_control(OsStr::from_bytes(first)) {
        return false;
    }
    std::iter::once(first)
        .chain(parts)
        .all(|c| !c.is_empty() && c != b"." && c != b".." && c != b".git")
}

fn shown(path: &[u8]) -> String {
    cordon_tools::printable(&String::from_utf8_lossy(path))
}

/// Every directory above `path`: `a`, `a/b` for `a/b/c`.
fn parents(path: &[u8]) -> impl Iterator<Item = &[u8]> {
    path.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'/')
        .map(move |(i, _)| &path[..i])
}

fn open_dir(dir: BorrowedFd<'_>, name: &OsStr) -> Result<OwnedFd, Errno> {
    open_at(dir, name, OFlags::RDONLY | OFlags::DIRECTORY)
}

/// The directory holding `path`, opened one component at a time (made
/// when `create`), and the last component's name.
fn parent_of<'p>(
    root: &OwnedFd,
    path: &'p [u8],
    create: bool,
) -> Result<(OwnedFd, &'p OsStr), Errno> {
    let mut parts: Vec<&[u8]> = path.split(|b| *b == b'/').collect();
    let name = parts.pop().ok_or(Errno::INVAL)?;
    let mut dir = open_dir(root.as_fd(), OsStr::new("."))?;
    for part in parts {
        let part = OsStr::from_bytes(part);
        dir = match open_dir(dir.as_fd(), part) {
            Err(Errno::NOENT) if create => {
                match rustix::fs::mkdirat(&dir, part, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(e) => return Err(e),
                }
                open_dir(dir.as_fd(), part)?
            }
            r => r?,
        };
    }
    Ok((dir, OsStr::from_bytes(name)))
}

fn remove(root: &OwnedFd, path: &[u8]) -> Result<(), Errno> {
    let (dir, name) = parent_of(root, path, false)?;
    rustix::fs::unlinkat(&dir, name, AtFlags::empty())
}

/// Writes one file or link at `path`. `recorded`: the snapshot just taken
/// holds what is there now, so it may be replaced.
fn write(
    root: &OwnedFd,
    path: &[u8],
    mode: u32,
    content: &[u8],
    recorded: bool,
) -> Result<(), &'static str> {
    let (dir, name) = parent_of(root, path, true).map_err(|e| match e {
        Errno::NOTDIR | Errno::LOOP | Errno::XDEV => {
            "a file or link that no snapshot recorded stands where its directory was"
        }
        _ => "its directory could not be made",
    })?;
    match rustix::fs::statat(&dir, name, AtFlags::SYMLINK_NOFOLLOW) {
        Err(Errno::NOENT) => {}
        Err(_) => return Err("what is there could not be examined"),
        Ok(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
            rustix::fs::unlinkat(&dir, name, AtFlags::REMOVEDIR)
                .map_err(|_| "a directory holding files no snapshot recorded stands there")?;
        }
        Ok(_) if !recorded => {
            return Err(
                "what is there now is in no snapshot (ignored, too large, or new), so cordon does not overwrite it",
            );
        }
        Ok(_) => {}
    }
    let tmp = format!(".cordon-rewind.{}.{}", std::process::id(), rand_tail());
    let tmp = OsStr::new(&tmp);
    if mode == 0o120000 {
        rustix::fs::symlinkat(OsStr::from_bytes(content), &dir, tmp)
            .map_err(|_| "the link could not be made")?;
    } else {
        let perm = if mode & 0o111 != 0 { 0o755 } else { 0o644 };
        let fd = rustix::fs::openat2(
            &dir,
            tmp,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(perm),
            STRICT,
        )
        .map_err(|_| "the file could not be made")?;
        // The mode asked for, whatever the umask.
        let _ = rustix::fs::fchmod(&fd, Mode::from_raw_mode(perm));
        let mut f = std::fs::File::from(fd);
        if f.write_all(content).is_err() {
            let _ = rustix::fs::unlinkat(&dir, tmp, AtFlags::empty());
            return Err("the file could not be written");
        }
    }
    rustix::fs::renameat(&dir, tmp, &dir, name).map_err(|_| {
        let _ = rustix::fs::unlinkat(&dir, tmp, AtFlags::empty());
        "the file could not be put in place"
    })
}

fn rand_tail() -> u32 {
    use std::sync::atomic::{AtomicU32, Ordering};
    static N: AtomicU32 = AtomicU32::new(0);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    t ^ N.fetch_add(1, Ordering::Relaxed).wrapping_mul(0x9e37_79b9)
}

/// `git cat-file --batch`: objects by id, one process for a whole restore.
struct CatFile {
    child: std::process::Child,
    input: std::process::ChildStdin,
    output: BufReader<std::process::ChildStdout>,
}

impl CatFile {
    fn start(git: &Git) -> Result<CatFile, GitError> {
        let mut cmd = git.command(["cat-file", "--batch"]);
        cmd.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let mut child = git.spawn(&mut cmd)?;
        let input = child.stdin.take().expect("piped");
        let output = BufReader::new(child.stdout.take().expect("piped"));
        Ok(CatFile {
            child,
            input,
            output,
        })
    }

    fn get(&mut self, oid: &str) -> Result<Vec<u8>, GitError> {
        let io = |source| GitError::Io {
            command: "cat-file".into(),
            source,
        };
        writeln!(self.input, "{oid}").map_err(io)?;
        self.input.flush().map_err(io)?;
        let mut header = String::new();
        self.output.read_line(&mut header).map_err(io)?;
        let size = header
            .trim_end()
            .strip_prefix(oid)
            .and_then(|rest| rest.trim_start().split(' ').nth(1))
            .and_then(|s| s.parse::<usize>().ok())
            .ok_or_else(|| GitError::Unexpected {
                command: "cat-file".into(),
                what: cordon_tools::printable(header.trim_end()),
            })?;
        let mut content = vec![0; size + 1];
        self.output.read_exact(&mut content).map_err(io)?;
        content.pop();
        Ok(content)
    }

    fn finish(self) -> Result<(), GitError> {
        drop(self.input);
        let out = self
            .child
            .wait_with_output()
            .map_err(|source| GitError::Io {
                command: "cat-file".into(),
                source,
            })?;
        if !out.status.success() {
            return Err(GitError::Failed {
                command: "cat-file".into(),
                stderr: shown_stderr(&out.stderr),
            });
        }
        Ok(())
    }
}

/// What went wrong restoring.
#[derive(Debug, thiserror::Error)]
pub enum RestoreError {
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("cannot open the workspace: {0}")]
    Root(std::io::Error),
}
