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
//! A stat cache (size, times, inode, blob id) spares reading files
//! unchanged since the last snapshot, as git's index does; a file changed
//! within the last two seconds is read again next time, since a write in
//! the same tick as the read would leave its times unchanged. With the
//! cache, a snapshot sends git only what changed, and none at all (no git
//! process) when nothing did.

mod cache;
mod meta;
mod read;
mod stream;

use std::ffi::OsStr;
use std::ops::ControlFlow;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use cordon_tools::walk::{Kind, Walk};
use cordon_tools::{Workspace, WsPath};
use serde::{Deserialize, Serialize};

use crate::command::{Git, GitError};
use cache::{Cache, Stat, blob_oid};
pub(crate) use meta::Meta;
use read::Entry;
pub(crate) use stream::SCRATCH;
use stream::{EXECUTABLE, FILE, Header, Import, Item, Listing, SYMLINK, Source};

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
    /// The commit holding the files: a new one at the target ref, or the
    /// parent when a cached listing showed nothing changed (none made).
    pub commit: String,
    /// Whether the files differ from the parent's (always, without one).
    pub changed: bool,
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
    /// The ref fast-import leaves the new commit at.
    pub target: &'a str,
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
/// child of `parent`, at `target` (the caller moves any other ref). With
/// a cache, the repository must be SHA-1 (blob ids are computed here).
pub(crate) fn snapshot(
    git: &Git,
    workspace: &Path,
    opts: &Options<'_>,
) -> Result<Snapshot, SnapshotError> {
    let (parent, rules) = (opts.parent, opts.rules);
    let cache_path = opts.cache.map(|c| git.git_dir().join(c));
    let old = cache_path.as_deref().map(Cache::load).unwrap_or_default();
    // The cache lists the parent's tree whole: only changes need sending.
    let incremental = old.lists(parent);
    let hashing = cache_path.is_some();
    let started = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();

    let ws = Workspace::open(workspace).map_err(|e| SnapshotError::Workspace(e.to_string()))?;
    let mut walk = Walk::beneath(&ws, &WsPath::parse(".").expect("the root parses"))
        .map_err(|e| SnapshotError::Workspace(e.to_string()))?;
    walk.gitignore_only();
    if opts.checkpoint {
        walk.skip_top_level(cordon_sandbox::CONTROL_FILES);
    }

    let mut import = Import::new(git);
    let mut failed: Option<SnapshotError> = None;
    let mut items: Vec<Item> = Vec::new();
    let mut skipped = Vec::new();
    let mut skipped_raw: Vec<Vec<u8>> = Vec::new();
    let mut read_bytes = 0u64;
    let mut bytes = 0u64;
    let mut over_limit = false;
    let fresh_after = started.as_secs() as i64 - 2;
    walk.run(|e| {
        let path = e.rel.as_os_str().as_bytes().to_vec();
        let mut skip = |skip: Skip| {
            skipped.push(Skipped {
                path: cordon_tools::printable(&String::from_utf8_lossy(&path)),
                skip,
            });
            skipped_raw.push(path.clone());
            ControlFlow::Continue(())
        };
        if !matches!(e.kind, Kind::File | Kind::Symlink) {
            if e.kind == Kind::Other {
                return skip(Skip::NotAFile);
            }
            return ControlFlow::Continue(());
        }
        if items.len() >= rules.max_files {
            over_limit = true;
            return skip(Skip::OverLimit);
        }
        let read = match e.kind {
            Kind::File => read::stat_file(e.dir, e.name, rules.max_file_bytes),
            _ => read::read_link(e.dir, e.name),
        };
        let (mut st, content) = match read {
            Ok(Entry::TooLarge(size)) => return skip(Skip::TooLarge { bytes: size }),
            Ok(Entry::Ready(st, content)) => (st, content),
            Err(()) => return skip(Skip::Unreadable),
        };
        let mode = match e.kind {
            Kind::Symlink => SYMLINK,
            _ if st.mode & 0o111 != 0 => EXECUTABLE,
            _ => FILE,
        };
        bytes += st.size;
        let key = String::from_utf8_lossy(&path).into_owned();
        let cached = old.files.get(&key);
        if let Some(c) = cached
            && c.vouches_for(&st, mode)
        {
            items.push(Item {
                path,
                mode,
                source: Source::Oid(c.oid.clone()),
                stat: Some(c.clone()),
            });
            return ControlFlow::Continue(());
        }
        // A miss: open it now, and keep the stat of what was opened.
        if e.kind == Kind::File {
            match read::read_file(e.dir, e.name, rules.max_file_bytes) {
                Ok(Entry::Ready(opened, _)) => st = opened,
                Ok(Entry::TooLarge(size)) => return skip(Skip::TooLarge { bytes: size }),
                Err(()) => return skip(Skip::Unreadable),
            }
        }
        let Ok(content) = content.map(Ok).unwrap_or_else(|| st.read()) else {
            return skip(Skip::Unreadable);
        };
        if read_bytes + content.len() as u64 > rules.max_read_bytes {
            over_limit = true;
            return skip(Skip::OverLimit);
        }
        read_bytes += content.len() as u64;
        let oid = if hashing {
            blob_oid(&content)
        } else {
            String::new()
        };
        // Content the parent holds at this path (a file touched, or read
        // again while its times were too fresh to trust) is not sent.
        let source = match cached {
            // (Only with a cache, so `oid` is the computed one.)
            Some(c) if incremental && c.oid == oid => Source::Oid(oid.clone()),
            _ => match import.blob(&content) {
                Ok(mark) => Source::Mark(mark),
                Err(err) => {
                    failed = Some(err);
                    return ControlFlow::Break(());
                }
            },
        };
        if import.is_broken() {
            return ControlFlow::Break(());
        }
        let racy = st.mtime.0 >= fresh_after || st.ctime.0 >= fresh_after;
        items.push(Item {
            path,
            mode,
            source,
            stat: Some(Stat {
                size: st.size,
                mtime: st.mtime,
                ctime: st.ctime,
                ino: st.ino,
                mode,
                oid,
                racy,
            }),
        });
        ControlFlow::Continue(())
    });
    if let Some(err) = failed {
        return Err(err);
    }
    // Tracked files the ignore rules hid from the walk, read beneath the
    // root without following any link.
    if !import.is_broken() && !opts.tracked.is_empty() {
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
                let Some((mode, content)) = read::read_tracked(&root, path, rules.max_file_bytes)
                else {
                    continue;
                };
                let mark = import.blob(&content)?;
                if import.is_broken() {
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
    let files = items.len();
    let listing = match incremental {
        true => Listing::changes(&items, &old.files),
        false => Listing::Whole(&items),
    };

    let (commit, changed, marks) = match parent {
        // Nothing differs from the parent: no commit, no git at all.
        Some(p) if listing.is_empty() && !import.is_broken() => {
            drop(import);
            (p.to_string(), false, Default::default())
        }
        _ => {
            let message = if opts.checkpoint {
                Meta {
                    skipped: skipped_raw,
                    incomplete,
                }
                .message(opts.message)
            } else {
                opts.message.to_string()
            };
            let made = import.commit(
                &Header {
                    target: opts.target,
                    parent,
                    message: &message,
                    when: started.as_secs(),
                    author: &opts.author,
                },
                &listing,
            )?;
            let changed = match (parent, incremental) {
                (None, _) => true,
                // The listing held changes (an empty one made no commit).
                (Some(_), true) => true,
                (Some(p), false) => {
                    rev_parse(git, &format!("{p}^{{tree}}"))?
                        != rev_parse(git, &format!("{}^{{tree}}", made.commit))?
                }
            };
            (made.commit, changed, made.marks)
        }
    };
    drop(listing);

    if let Some(path) = &cache_path {
        // The listing is that of the parent's tree too when nothing changed.
        let mut cache = Cache::of(commit.clone(), items.len());
        if !changed && let Some(p) = parent {
            cache.commit = Some(p.to_string());
        }
        for item in items {
            let Some(mut stat) = item.stat else {
                cache.lossless = false;
                continue;
            };
            if let Source::Mark(m) = item.source {
                match marks.get(&m) {
                    // Git's id is the one computed, in a SHA-1 repository.
                    Some(oid) if hashing && *oid != stat.oid => {
                        return Err(SnapshotError::Git(GitError::Unexpected {
                            command: "fast-import".into(),
                            what: format!(
                                "blob {oid}, where {} was expected: not a SHA-1 repository",
                                stat.oid
                            ),
                        }));
                    }
                    Some(oid) => stat.oid = oid.clone(),
                    None => {
                        cache.lossless = false;
                        continue;
                    }
                }
            }
            match String::from_utf8(item.path) {
                Ok(key) => {
                    cache.files.insert(key, stat);
                }
                Err(_) => cache.lossless = false,
            }
        }
        cache.save(path)?;
    }

    Ok(Snapshot {
        commit,
        changed,
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

/// The top-level names a snapshot never holds (nor a rewind writes).
pub(crate) fn is_control(name: &OsStr) -> bool {
    name == ".git" || cordon_sandbox::CONTROL_FILES.iter().any(|c| name == *c)
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
