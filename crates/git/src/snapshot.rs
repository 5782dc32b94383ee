//! A workspace's files as a commit in a repository cordon owns.
//!
//! Cordon reads the files itself, through the workspace walk (every open
//! beneath the root, relative to its parent's descriptor, never through a
//! link), and hands their bytes to `git fast-import`. Git is never pointed
//! at the workspace: a file swapped for a link to `/etc/shadow` between a
//! check and a read cannot be read, because nothing is read by name.
//!
//! What is kept, and what is not (the rules the user is told):
//! - regular files (with their executable bit) and symbolic links (as
//!   links: their target is text, never followed);
//! - not what `.gitignore` files leave out, no `.git` at any depth (the
//!   user's repositories are theirs), and not the top-level control files
//!   the sandbox may not write (`.vscode`, `.idea`, `.claude`, `.mcp.json`);
//! - not files over [`Rules::max_file_bytes`], nor devices, FIFOs and
//!   sockets: each is listed in [`Snapshot::skipped`];
//! - empty directories are not kept (git keeps none).
//!
//! A stat cache (size, times, inode) spares reading files unchanged since
//! the last snapshot, as git's index does; a file changed within the last
//! two seconds is read again next time, since a write in the same tick as
//! the read would leave its times unchanged.

use std::collections::HashMap;
use std::ffi::OsStr;
use std::io::{BufWriter, Read, Write};
use std::ops::ControlFlow;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use cordon_tools::walk::{Kind, Walk, open_file_at};
use cordon_tools::{Workspace, WsPath};
use rustix::fs::{AtFlags, FileType};
use serde::{Deserialize, Serialize};

use crate::command::{Git, GitError, shown_stderr};

/// Bounds of one snapshot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rules {
    /// Larger files are not kept (and a rewind leaves them as they are).
    pub max_file_bytes: u64,
    /// Files kept at most; the rest are left out and the snapshot marked
    /// incomplete.
    pub max_files: usize,
    /// Bytes read at most in one snapshot (unchanged files cost nothing).
    pub max_read_bytes: u64,
}

impl Default for Rules {
    fn default() -> Rules {
        Rules {
            max_file_bytes: 32 << 20,
            max_files: 200_000,
            max_read_bytes: 2 << 30,
        }
    }
}

/// Why a file was left out of a snapshot.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "why", rename_all = "snake_case")]
pub enum Skip {
    /// Over [`Rules::max_file_bytes`].
    TooLarge { bytes: u64 },
    /// A device, FIFO or socket.
    NotAFile,
    /// Unreadable, or changed into something else while being read.
    Unreadable,
    /// Past [`Rules::max_files`] or [`Rules::max_read_bytes`].
    OverLimit,
}

/// A file left out, and why.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Skipped {
    /// Relative to the workspace root, made printable.
    pub path: String,
    #[serde(flatten)]
    pub skip: Skip,
}

/// What one snapshot recorded.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Snapshot {
    /// The commit holding the files.
    pub commit: String,
    /// Its tree.
    pub tree: String,
    /// The parent's tree, when there is a parent: the files changed iff
    /// it differs from `tree`.
    pub parent_tree: Option<String>,
    /// Files (and links) kept.
    pub files: usize,
    /// Their bytes.
    pub bytes: u64,
    /// Bytes read from the workspace for this snapshot.
    pub read_bytes: u64,
    pub skipped: Vec<Skipped>,
    /// Directories that changed while being walked were not looked into,
    /// or a limit was reached: some files may be missing.
    pub incomplete: bool,
}

/// The stat cache's record of one file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Stat {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
    mode: u32,
    oid: String,
    /// Changed too recently to trust its times: read again next time.
    racy: bool,
}

/// Bumped when [`Cache`] changes: an old cache is then read as empty. It
/// is postcard (not self-describing): no field may be skipped or defaulted.
const CACHE_VERSION: u32 = 3;

#[derive(Debug, Default, Serialize, Deserialize)]
struct Cache {
    version: u32,
    /// The tree `files` lists whole: a snapshot whose parent has this tree
    /// sends fast-import only what changed.
    tree: Option<String>,
    /// Every file of that tree. Keys are the paths as text; a name that is
    /// not UTF-8 is stored lossily, so it never hits, and the whole
    /// listing is then sent instead (see `lossless`).
    files: HashMap<String, Stat>,
    /// Every key is a path exactly.
    lossless: bool,
}

/// Where a file's content comes from in the fast-import stream.
enum Source {
    /// An object the repository holds (from the cache).
    Oid(String),
    /// A blob sent in this stream, by mark.
    Mark(u64),
}

struct Item {
    path: Vec<u8>,
    mode: u32,
    source: Source,
    /// What the cache keeps of it once its object is known.
    stat: Option<Stat>,
}

/// The ref fast-import leaves at each snapshot; nothing reads it.
pub(crate) const SCRATCH: &str = "refs/cordon/snapshot";

const FILE: u32 = 0o100644;
const EXECUTABLE: u32 = 0o100755;
const SYMLINK: u32 = 0o120000;

/// Who a commit is by, as git writes it: `Name <email>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ident {
    pub name: String,
    pub email: String,
}

impl Ident {
    /// cordon's own, for its checkpoints.
    pub fn cordon() -> Ident {
        Ident {
            name: "cordon".into(),
            email: "cordon@localhost".into(),
        }
    }

    /// As fast-import reads it: no `<`, `>` or newline in either part.
    fn line(&self) -> String {
        let clean = |s: &str| {
            s.chars()
                .filter(|c| !matches!(c, '<' | '>' | '\n' | '\r' | '\0'))
                .collect::<String>()
        };
        format!(
            "{} <{}>",
            clean(&self.name).trim(),
            clean(&self.email).trim()
        )
    }
}

/// How a snapshot is taken.
#[derive(Debug, Clone)]
pub(crate) struct Options<'a> {
    pub parent: Option<&'a str>,
    pub message: &'a str,
    pub rules: Rules,
    /// The stat cache's file in the repository, if one is kept.
    pub cache: Option<&'a str>,
    /// Leave out the top-level control files and note what was left out
    /// in the message (a checkpoint, which a rewind reads back), or keep
    /// them and the message as it is (a commit of the user's repository).
    pub checkpoint: bool,
    pub author: Ident,
    /// Paths the repository tracks: one that `.gitignore` leaves out but
    /// that is still there is kept, as `git add -A` keeps it.
    pub tracked: &'a [Vec<u8>],
}

/// Reads `workspace` and commits its files to `git`'s repository as a
/// child of `parent` (no ref but a scratch one is moved: the caller
/// decides).
pub(crate) fn snapshot(
    git: &Git,
    workspace: &Path,
    opts: &Options<'_>,
) -> Result<Snapshot, SnapshotError> {
    let (parent, message, rules) = (opts.parent, opts.message, opts.rules);
    let cache_path = opts.cache.map(|c| git.git_dir().join(c));
    let old = cache_path.as_deref().map(load_cache).unwrap_or_default();
    // The cache lists the parent's tree whole: only changes need sending.
    let parent_tree = match parent {
        Some(p) => Some(rev_parse(git, &format!("{p}^{{tree}}"))?),
        None => None,
    };
    let incremental = old.lossless && old.tree.is_some() && old.tree == parent_tree;
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();

    let marks = tempfile_in(git.git_dir(), "marks")?;
    let mut cmd = git.command([
        OsStr::new("fast-import"),
        OsStr::new("--quiet"),
        OsStr::new("--done"),
        OsStr::new("--date-format=raw"),
        OsStr::new("--force"),
    ]);
    let mut export = std::ffi::OsString::from("--export-marks=");
    export.push(&marks);
    cmd.arg(export);
    cmd.stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = git.spawn(&mut cmd)?;
    let stdin = child.stdin.take().expect("piped");
    let stderr = child.stderr.take().expect("piped");
    // Git's complaints, read as they come so that it never blocks on them.
    let stderr = std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = stderr.take(64 << 10).read_to_end(&mut buf);
        buf
    });
    let mut out = BufWriter::with_capacity(1 << 16, stdin);

    let ws = Workspace::open(workspace).map_err(|e| SnapshotError::Workspace(e.to_string()))?;
    let mut walk = Walk::beneath(&ws, &WsPath::parse(".").expect("the root parses"))
        .map_err(|e| SnapshotError::Workspace(e.to_string()))?;
    walk.gitignore_only();
    if opts.checkpoint {
        walk.skip_top_level(cordon_sandbox::CONTROL_FILES);
    }

    let mut items: Vec<Item> = Vec::new();
    let mut skipped = Vec::new();
    let mut skipped_raw: Vec<Vec<u8>> = Vec::new();
    let mut next_mark = 1u64;
    let mut read_bytes = 0u64;
    let mut bytes = 0u64;
    let mut over_limit = false;
    let mut write_error: Option<std::io::Error> = None;
    let fresh_after = started.as_secs() as i64 - 2;
    walk.run(|e| {
        let path = e.rel.as_os_str().as_bytes().to_vec();
        let mut shown = || {
            skipped_raw.push(path.clone());
            cordon_tools::printable(&String::from_utf8_lossy(&path))
        };
        if !matches!(e.kind, Kind::File | Kind::Symlink) {
            if e.kind == Kind::Other {
                skipped.push(Skipped {
                    path: shown(),
                    skip: Skip::NotAFile,
                });
            }
            return ControlFlow::Continue(());
        }
        if items.len() >= rules.max_files {
            over_limit = true;
            skipped.push(Skipped {
                path: shown(),
                skip: Skip::OverLimit,
            });
            return ControlFlow::Continue(());
        }
        let read = match e.kind {
            Kind::File => stat_file(e.dir, e.name, rules.max_file_bytes),
            _ => read_link(e.dir, e.name),
        };
        let (mut st, content) = match read {
            Ok(Read_::TooLarge(size)) => {
                skipped.push(Skipped {
                    path: shown(),
                    skip: Skip::TooLarge { bytes: size },
                });
                return ControlFlow::Continue(());
            }
            Ok(Read_::Ready(st, content)) => (st, content),
            Err(()) => {
                skipped.push(Skipped {
                    path: shown(),
                    skip: Skip::Unreadable,
                });
                return ControlFlow::Continue(());
            }
        };
        let mode = match e.kind {
            Kind::Symlink => SYMLINK,
            _ if st.mode & 0o111 != 0 => EXECUTABLE,
            _ => FILE,
        };
        bytes += st.size;
        let key = String::from_utf8_lossy(&path).into_owned();
        if let Some(cached) = old.files.get(&key)
            && !cached.racy
            && same_file(cached, &st, mode)
        {
            items.push(Item {
                path,
                mode,
                source: Source::Oid(cached.oid.clone()),
                stat: Some(cached.clone()),
            });
            return ControlFlow::Continue(());
        }
        // A miss: open it now, and keep the stat of what was opened.
        if e.kind == Kind::File {
            match read_file(e.dir, e.name, rules.max_file_bytes) {
                Ok(Read_::Ready(opened, _)) => st = opened,
                Ok(Read_::TooLarge(size)) => {
                    skipped.push(Skipped {
                        path: shown(),
                        skip: Skip::TooLarge { bytes: size },
                    });
                    return ControlFlow::Continue(());
                }
                Err(()) => {
                    skipped.push(Skipped {
                        path: shown(),
                        skip: Skip::Unreadable,
                    });
                    return ControlFlow::Continue(());
                }
            }
        }
        let content = match content.map(Ok).unwrap_or_else(|| st.read()) {
            Ok(c) => c,
            Err(()) => {
                skipped.push(Skipped {
                    path: shown(),
                    skip: Skip::Unreadable,
                });
                return ControlFlow::Continue(());
            }
        };
        if read_bytes + content.len() as u64 > rules.max_read_bytes {
            over_limit = true;
            skipped.push(Skipped {
                path: shown(),
                skip: Skip::OverLimit,
            });
            return ControlFlow::Continue(());
        }
        read_bytes += content.len() as u64;
        let mark = next_mark;
        next_mark += 1;
        if let Err(err) = write_blob(&mut out, mark, &content) {
            write_error = Some(err);
            return ControlFlow::Break(());
        }
        let racy = st.mtime.0 >= fresh_after || st.ctime.0 >= fresh_after;
        items.push(Item {
            path,
            mode,
            source: Source::Mark(mark),
            stat: Some(Stat {
                size: st.size,
                mtime: st.mtime,
                ctime: st.ctime,
                ino: st.ino,
                mode,
                oid: String::new(),
                racy,
            }),
        });
        ControlFlow::Continue(())
    });
    // Tracked files the ignore rules hid from the walk, read beneath the
    // root without following any link.
    if write_error.is_none() && !opts.tracked.is_empty() {
        let seen: std::collections::HashSet<&[u8]> =
            items.iter().map(|i| i.path.as_slice()).collect();
        let hidden: Vec<&Vec<u8>> = opts
            .tracked
            .iter()
            .filter(|p| !seen.contains(p.as_slice()))
            .collect();
        if let Ok(root) = rustix::fs::open(
            workspace,
            rustix::fs::OFlags::RDONLY
                | rustix::fs::OFlags::DIRECTORY
                | rustix::fs::OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) {
            for path in hidden {
                let Some((mode, content)) = read_tracked(&root, path, rules.max_file_bytes) else {
                    continue;
                };
                let mark = next_mark;
                next_mark += 1;
                if let Err(err) = write_blob(&mut out, mark, &content) {
                    write_error = Some(err);
                    break;
                }
                bytes += content.len() as u64;
                read_bytes += content.len() as u64;
                items.push(Item {
                    path: path.clone(),
                    mode,
                    source: Source::Mark(mark),
                    stat: None,
                });
            }
        }
    }
    let incomplete = over_limit || walk.changed > 0 || walk.too_deep > 0;

    let commit_mark = next_mark;
    let message = if opts.checkpoint {
        Meta {
            skipped: skipped_raw,
            incomplete,
        }
        .message(message)
    } else {
        message.to_string()
    };
    let written = write_error.map(Err).unwrap_or(Ok(())).and_then(|()| {
        write_commit(
            &mut out,
            &Header {
                mark: commit_mark,
                parent,
                message: &message,
                when: started.as_secs(),
                author: &opts.author,
            },
            &items,
            incremental.then_some(&old.files),
        )
    });
    let flushed = written.and_then(|()| out.flush());
    drop(out);
    let status = child.wait();
    let stderr = stderr.join().unwrap_or_default();
    match status {
        Ok(s) if s.success() && flushed.is_ok() => {}
        Ok(_) => {
            return Err(SnapshotError::Git(GitError::Failed {
                command: "fast-import".into(),
                stderr: shown_stderr(&stderr),
            }));
        }
        Err(source) => {
            return Err(SnapshotError::Git(GitError::Io {
                command: "fast-import".into(),
                source,
            }));
        }
    }

    let marks_text = std::fs::read_to_string(&marks).map_err(SnapshotError::State)?;
    let _ = std::fs::remove_file(&marks);
    let mut by_mark: HashMap<u64, String> = HashMap::new();
    for line in marks_text.lines() {
        if let Some((m, oid)) = line.strip_prefix(':').and_then(|l| l.split_once(' '))
            && let Ok(m) = m.parse()
        {
            by_mark.insert(m, oid.to_string());
        }
    }
    let commit = by_mark
        .get(&commit_mark)
        .cloned()
        .ok_or_else(|| unexpected("no mark for the commit"))?;

    let files = items.len();
    let tree = rev_parse(git, &format!("{commit}^{{tree}}"))?;
    if let Some(path) = &cache_path {
        let mut cache = Cache {
            version: CACHE_VERSION,
            tree: Some(tree.clone()),
            files: HashMap::with_capacity(items.len()),
            lossless: true,
        };
        for item in items {
            let Some(mut stat) = item.stat else {
                cache.lossless = false;
                continue;
            };
            if let Source::Mark(m) = item.source {
                let Some(oid) = by_mark.get(&m) else {
                    cache.lossless = false;
                    continue;
                };
                stat.oid = oid.clone();
            }
            match String::from_utf8(item.path) {
                Ok(key) => {
                    cache.files.insert(key, stat);
                }
                Err(_) => cache.lossless = false,
            }
        }
        save_cache(path, &cache)?;
    }

    Ok(Snapshot {
        commit,
        tree,
        parent_tree,
        files,
        bytes,
        read_bytes,
        skipped,
        incomplete,
    })
}

/// The object `what` names.
pub(crate) fn rev_parse(git: &Git, what: &str) -> Result<String, GitError> {
    let out = git.run(["rev-parse", "--verify", "--quiet", "--end-of-options", what])?;
    let oid = String::from_utf8_lossy(&out).trim().to_string();
    if oid.is_empty() || !oid.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(GitError::Unexpected {
            command: "rev-parse".into(),
            what: format!("no object for {what}"),
        });
    }
    Ok(oid)
}

fn unexpected(what: &str) -> SnapshotError {
    SnapshotError::Git(GitError::Unexpected {
        command: "fast-import".into(),
        what: what.into(),
    })
}

/// The top-level names a snapshot never holds (nor a rewind writes).
pub(crate) fn is_control(name: &OsStr) -> bool {
    name == ".git" || cordon_sandbox::CONTROL_FILES.iter().any(|c| name == *c)
}

/// What reading one entry found.
struct FileStat {
    size: u64,
    mtime: (i64, i64),
    ctime: (i64, i64),
    ino: u64,
    mode: u32,
    /// The open file, to read if the cache misses.
    file: Option<std::fs::File>,
}

impl FileStat {
    fn read(&mut self) -> Result<Vec<u8>, ()> {
        let Some(f) = self.file.take() else {
            return Err(());
        };
        let mut buf = Vec::with_capacity(self.size as usize);
        // Never more than was there when it was measured: a file growing
        // under the read must not take the snapshot past its limits.
        f.take(self.size)
            .read_to_end(&mut buf)
            .map_err(|_| ())
            .map(|_| buf)
    }
}

#[allow(non_camel_case_types)]
enum Read_ {
    TooLarge(u64),
    /// Stat, and the content when it had to be read already (a link).
    Ready(FileStat, Option<Vec<u8>>),
}

/// A tracked path's mode and content, if it is still a regular file or a
/// link: opened relative to `root`, beneath it, through no link on the way
/// (a link at the end is read as a link).
fn read_tracked(root: &std::os::fd::OwnedFd, path: &[u8], max: u64) -> Option<(u32, Vec<u8>)> {
    use rustix::fs::OFlags;
    let name = OsStr::from_bytes(path);
    let fd = cordon_tools::walk::open_at(root.as_fd(), name, OFlags::PATH).ok()?;
    let st = rustix::fs::fstat(&fd).ok()?;
    match FileType::from_raw_mode(st.st_mode) {
        FileType::Symlink => {
            let target = rustix::fs::readlinkat(&fd, "", Vec::new()).ok()?;
            Some((SYMLINK, target.into_bytes()))
        }
        FileType::RegularFile if (st.st_size as u64) <= max => {
            let file =
                cordon_tools::walk::open_at(root.as_fd(), name, OFlags::RDONLY | OFlags::NONBLOCK)
                    .ok()?;
            let st = rustix::fs::fstat(&file).ok()?;
            if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                return None;
            }
            let mut buf = Vec::new();
            std::fs::File::from(file)
                .take(st.st_size as u64)
                .read_to_end(&mut buf)
                .ok()?;
            let mode = if st.st_mode & 0o111 != 0 {
                EXECUTABLE
            } else {
                FILE
            };
            Some((mode, buf))
        }
        _ => None,
    }
}

/// A regular file's stat, without opening it (the cache may spare that).
fn stat_file(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr, max: u64) -> Result<Read_, ()> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|_| ())?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(());
    }
    let size = st.st_size as u64;
    if size > max {
        return Ok(Read_::TooLarge(size));
    }
    Ok(Read_::Ready(
        FileStat {
            size,
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
            ino: st.st_ino,
            mode: st.st_mode,
            file: None,
        },
        None,
    ))
}

/// Opens a regular file (beneath, never through a link) and stats what
/// was opened: the stat kept is that of the bytes read.
fn read_file(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr, max: u64) -> Result<Read_, ()> {
    let (file, size) = open_file_at(dir, name).map_err(|_| ())?;
    if size > max {
        return Ok(Read_::TooLarge(size));
    }
    let st = rustix::fs::fstat(&file).map_err(|_| ())?;
    Ok(Read_::Ready(
        FileStat {
            size,
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
            ino: st.st_ino,
            mode: st.st_mode,
            file: Some(file),
        },
        None,
    ))
}

fn read_link(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr) -> Result<Read_, ()> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|_| ())?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
        return Err(());
    }
    let target = rustix::fs::readlinkat(dir, name, Vec::new()).map_err(|_| ())?;
    let target = target.into_bytes();
    Ok(Read_::Ready(
        FileStat {
            size: target.len() as u64,
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
            ino: st.st_ino,
            mode: st.st_mode,
            file: None,
        },
        Some(target),
    ))
}

fn same_file(cached: &Stat, st: &FileStat, mode: u32) -> bool {
    cached.size == st.size
        && cached.mtime == st.mtime
        && cached.ctime == st.ctime
        && cached.ino == st.ino
        && cached.mode == mode
        && !cached.oid.is_empty()
}

fn write_blob(out: &mut impl Write, mark: u64, content: &[u8]) -> std::io::Result<()> {
    write!(out, "blob\nmark :{mark}\ndata {}\n", content.len())?;
    out.write_all(content)?;
    out.write_all(b"\n")
}

/// A commit's own lines in the fast-import stream.
struct Header<'a> {
    mark: u64,
    parent: Option<&'a str>,
    message: &'a str,
    when: u64,
    author: &'a Ident,
}

fn write_commit(
    out: &mut impl Write,
    h: &Header<'_>,
    items: &[Item],
    // The parent's whole listing: then only what differs from it is sent.
    prev: Option<&HashMap<String, Stat>>,
) -> std::io::Result<()> {
    let Header {
        mark,
        parent,
        message,
        when,
        author,
    } = *h;
    // A reset first: whatever an earlier run left at the scratch ref must
    // not become the parent.
    let who = author.line();
    write!(
        out,
        "reset {SCRATCH}\ncommit {SCRATCH}\nmark :{mark}\nauthor {who} {when} +0000\ncommitter {who} {when} +0000\ndata {}\n{message}\n",
        message.len()
    )?;
    if let Some(p) = parent {
        writeln!(out, "from {p}")?;
    }
    if prev.is_none() {
        out.write_all(b"deleteall\n")?;
    }
    if let Some(prev) = prev {
        // Deletions first: a file that became a directory (or the other
        // way) must be gone before its new self is set.
        let now: std::collections::HashSet<&[u8]> =
            items.iter().map(|i| i.path.as_slice()).collect();
        for gone in prev.keys().filter(|k| !now.contains(k.as_bytes())) {
            out.write_all(b"D ")?;
            out.write_all(&quote(gone.as_bytes()))?;
            out.write_all(b"\n")?;
        }
    }
    for item in items {
        if let Some(prev) = prev {
            let key = std::str::from_utf8(&item.path).ok();
            let same = key.and_then(|k| prev.get(k)).is_some_and(|p| {
                p.mode == item.mode && matches!(&item.source, Source::Oid(o) if *o == p.oid)
            });
            if same {
                continue;
            }
        }
        match &item.source {
            Source::Oid(oid) => write!(out, "M {:o} {oid} ", item.mode)?,
            Source::Mark(m) => write!(out, "M {:o} :{m} ", item.mode)?,
        }
        out.write_all(&quote(&item.path))?;
        out.write_all(b"\n")?;
    }
    out.write_all(b"\ndone\n")
}

/// A path as fast-import reads it: C-style quoted, every byte that is not
/// printable ASCII as an octal escape, so no name can break the stream.
pub(crate) fn quote(path: &[u8]) -> Vec<u8> {
    let mut q = Vec::with_capacity(path.len() + 2);
    q.push(b'"');
    for &b in path {
        match b {
            b'"' => q.extend_from_slice(b"\\\""),
            b'\\' => q.extend_from_slice(b"\\\\"),
            0x20..=0x7e => q.push(b),
            _ => q.extend_from_slice(format!("\\{b:03o}").as_bytes()),
        }
    }
    q.push(b'"');
    q
}

fn load_cache(path: &Path) -> Cache {
    let Ok(text) = std::fs::read(path) else {
        return Cache::default();
    };
    // The version first, on its own: any other layout reads as empty.
    match postcard::from_bytes::<u32>(&text) {
        Ok(CACHE_VERSION) => {}
        _ => return Cache::default(),
    }
    match postcard::from_bytes::<Cache>(&text) {
        Ok(c) if c.version == CACHE_VERSION => c,
        _ => Cache::default(),
    }
}

fn save_cache(path: &Path, cache: &Cache) -> Result<(), SnapshotError> {
    let tmp = path.with_extension("tmp");
    let text = postcard::to_stdvec(cache).expect("a cache of strings and numbers serializes");
    std::fs::write(&tmp, text)
        .and_then(|()| std::fs::rename(&tmp, path))
        .map_err(SnapshotError::State)
}

fn tempfile_in(dir: &Path, what: &str) -> Result<PathBuf, SnapshotError> {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    Ok(dir.join(format!("cordon-{what}-{}-{n}", std::process::id())))
}

/// What went wrong taking a snapshot.
#[derive(Debug, thiserror::Error)]
pub enum SnapshotError {
    #[error(transparent)]
    Git(#[from] GitError),
    #[error("cannot read the workspace: {0}")]
    Workspace(String),
    #[error("cannot keep the snapshot's state: {0}")]
    State(std::io::Error),
}

/// What a snapshot's commit says of itself besides its files, in its
/// message: the paths it left out (which a restore to it must not remove)
/// and whether its walk saw everything.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Meta {
    pub skipped: Vec<Vec<u8>>,
    pub incomplete: bool,
}

const SKIPPED_TRAILER: &str = "Cordon-Skipped: ";
const INCOMPLETE_TRAILER: &str = "Cordon-Incomplete: true";

impl Meta {
    /// `label`, then the trailers (paths hex-encoded: any bytes, one line).
    fn message(&self, label: &str) -> String {
        let mut m = label.replace('\n', " ");
        if !self.skipped.is_empty() || self.incomplete {
            m.push('\n');
        }
        for p in &self.skipped {
            m.push('\n');
            m.push_str(SKIPPED_TRAILER);
            for b in p {
                m.push_str(&format!("{b:02x}"));
            }
        }
        if self.incomplete {
            m.push('\n');
            m.push_str(INCOMPLETE_TRAILER);
        }
        m
    }

    /// Reads what [`Meta::message`] wrote.
    pub(crate) fn of(git: &Git, commit: &str) -> Result<Meta, GitError> {
        let out = git.run(["log", "-1", "--format=%B", commit])?;
        let mut meta = Meta::default();
        for line in String::from_utf8_lossy(&out).lines() {
            if let Some(hex) = line.strip_prefix(SKIPPED_TRAILER) {
                let bytes: Option<Vec<u8>> = (0..hex.len())
                    .step_by(2)
                    .map(|i| {
                        hex.get(i..i + 2)
                            .and_then(|h| u8::from_str_radix(h, 16).ok())
                    })
                    .collect();
                if let Some(b) = bytes {
                    meta.skipped.push(b);
                }
            } else if line == INCOMPLETE_TRAILER {
                meta.incomplete = true;
            }
        }
        Ok(meta)
    }
}
