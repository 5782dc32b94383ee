//! The `git fast-import` stream a snapshot is written as: blobs as the
//! walk finds them, then one commit listing the tree, whole or as the
//! changes from its parent. Git starts only when there is something to
//! send.

use std::collections::{HashMap, HashSet};
use std::ffi::OsStr;
use std::io::{BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Stdio};

use super::cache::Stat;
use super::{Ident, SnapshotError};
use crate::command::{Git, GitError, shown_stderr};

/// The ref a snapshot of the user's repository leaves its commit at; the
/// caller moves the branch and deletes it.
pub(crate) const SCRATCH: &str = "refs/cordon/snapshot";

pub(super) const FILE: u32 = 0o100644;
pub(super) const EXECUTABLE: u32 = 0o100755;
pub(super) const SYMLINK: u32 = 0o120000;

/// Where a file's content comes from in the stream.
pub(super) enum Source {
    /// An object the repository holds.
    Oid(String),
    /// A blob sent in this stream, by mark.
    Mark(u64),
}

pub(super) struct Item {
    pub path: Vec<u8>,
    pub mode: u32,
    pub source: Source,
    /// What the cache keeps of it once its object is known.
    pub stat: Option<Stat>,
}

/// How the commit lists its tree.
pub(super) enum Listing<'a> {
    /// Every file (`deleteall`, then each).
    Whole(&'a [Item]),
    /// What differs from the parent, which the cache listed whole.
    Changes {
        gone: Vec<&'a str>,
        set: Vec<&'a Item>,
    },
}

impl<'a> Listing<'a> {
    /// What `items` change in the tree `prev` lists; empty when nothing.
    pub fn changes(items: &'a [Item], prev: &'a HashMap<String, Stat>) -> Listing<'a> {
        let now: HashSet<&[u8]> = items.iter().map(|i| i.path.as_slice()).collect();
        let gone = prev
            .keys()
            .filter(|k| !now.contains(k.as_bytes()))
            .map(String::as_str)
            .collect();
        let set = items
            .iter()
            .filter(|item| {
                let known = std::str::from_utf8(&item.path)
                    .ok()
                    .and_then(|k| prev.get(k));
                !known.is_some_and(|p| {
                    p.mode == item.mode && matches!(&item.source, Source::Oid(o) if *o == p.oid)
                })
            })
            .collect();
        Listing::Changes { gone, set }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Listing::Changes { gone, set } if gone.is_empty() && set.is_empty())
    }
}

/// A commit's own lines in the stream.
pub(super) struct Header<'a> {
    /// The ref fast-import leaves the commit at.
    pub target: &'a str,
    pub parent: Option<&'a str>,
    pub message: &'a str,
    pub when: u64,
    pub author: &'a Ident,
}

/// One fast-import, started at the first thing sent.
pub(super) struct Import<'g> {
    git: &'g Git,
    running: Option<Running>,
    next_mark: u64,
    /// A write that failed: the stream is abandoned and git says why.
    broken: Option<std::io::Error>,
}

struct Running {
    child: Child,
    out: BufWriter<ChildStdin>,
    stderr: std::thread::JoinHandle<Vec<u8>>,
    marks: PathBuf,
}

/// What fast-import made: the commit, and each mark's object.
pub(super) struct Imported {
    pub commit: String,
    pub marks: HashMap<u64, String>,
}

impl<'g> Import<'g> {
    pub fn new(git: &'g Git) -> Import<'g> {
        Import {
            git,
            running: None,
            next_mark: 1,
            broken: None,
        }
    }

    /// Whether a write failed (the walk stops).
    pub fn is_broken(&self) -> bool {
        self.broken.is_some()
    }

    /// Sends `content` as a blob; its mark.
    pub fn blob(&mut self, content: &[u8]) -> Result<u64, SnapshotError> {
        let mark = self.next_mark;
        self.next_mark += 1;
        let out = &mut self.start()?.out;
        let written = write!(out, "blob\nmark :{mark}\ndata {}\n", content.len())
            .and_then(|()| out.write_all(content))
            .and_then(|()| out.write_all(b"\n"));
        if let Err(e) = written {
            self.broken = Some(e);
        }
        Ok(mark)
    }

    /// Writes the commit, waits for git, and says what it made.
    pub fn commit(
        mut self,
        h: &Header<'_>,
        listing: &Listing<'_>,
    ) -> Result<Imported, SnapshotError> {
        let mark = self.next_mark;
        let broken = self.broken.take();
        let running = self.start()?;
        let written = match broken {
            Some(e) => Err(e),
            None => write_commit(&mut running.out, mark, h, listing),
        };
        let flushed = written.and_then(|()| running.out.flush());
        let Running {
            mut child,
            out,
            stderr,
            marks,
        } = self.running.take().expect("started");
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
        let text = std::fs::read_to_string(&marks).map_err(SnapshotError::State)?;
        let _ = std::fs::remove_file(&marks);
        let mut by_mark = HashMap::new();
        for line in text.lines() {
            if let Some((m, oid)) = line.strip_prefix(':').and_then(|l| l.split_once(' '))
                && let Ok(m) = m.parse::<u64>()
            {
                by_mark.insert(m, oid.to_string());
            }
        }
        let commit = by_mark.remove(&mark).ok_or_else(|| {
            SnapshotError::Git(GitError::Unexpected {
                command: "fast-import".into(),
                what: "no mark for the commit".into(),
            })
        })?;
        Ok(Imported {
            commit,
            marks: by_mark,
        })
    }

    fn start(&mut self) -> Result<&mut Running, SnapshotError> {
        if self.running.is_none() {
            self.running = Some(spawn(self.git)?);
        }
        Ok(self.running.as_mut().expect("just started"))
    }
}

impl Drop for Import<'_> {
    // A stream abandoned (the walk failed): git is told nothing more and
    // reaped, and its marks file removed.
    fn drop(&mut self) {
        if let Some(r) = self.running.take() {
            drop(r.out);
            let mut child = r.child;
            let _ = child.kill();
            let _ = child.wait();
            let _ = std::fs::remove_file(&r.marks);
        }
    }
}

fn spawn(git: &Git) -> Result<Running, SnapshotError> {
    let marks = tempfile_in(git.git_dir(), "marks");
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
    Ok(Running {
        child,
        out: BufWriter::with_capacity(1 << 16, stdin),
        stderr,
        marks,
    })
}

fn write_commit(
    out: &mut impl Write,
    mark: u64,
    h: &Header<'_>,
    listing: &Listing<'_>,
) -> std::io::Result<()> {
    let Header {
        target,
        parent,
        message,
        when,
        author,
    } = *h;
    // A reset first: whatever an earlier run left at the ref must not
    // become the parent.
    let who = author.line();
    write!(
        out,
        "reset {target}\ncommit {target}\nmark :{mark}\nauthor {who} {when} +0000\ncommitter {who} {when} +0000\ndata {}\n{message}\n",
        message.len()
    )?;
    if let Some(p) = parent {
        writeln!(out, "from {p}")?;
    }
    let set: Vec<&Item> = match listing {
        Listing::Whole(items) => {
            out.write_all(b"deleteall\n")?;
            items.iter().collect()
        }
        Listing::Changes { gone, set } => {
            // Deletions first: a file that became a directory (or the
            // other way) must be gone before its new self is set.
            for path in gone {
                out.write_all(b"D ")?;
                out.write_all(&quote(path.as_bytes()))?;
                out.write_all(b"\n")?;
            }
            set.clone()
        }
    };
    for item in set {
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
fn quote(path: &[u8]) -> Vec<u8> {
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

fn tempfile_in(dir: &Path, what: &str) -> PathBuf {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .subsec_nanos();
    dir.join(format!("cordon-{what}-{}-{n}", std::process::id()))
}
