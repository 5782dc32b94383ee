//! The build context: the directory whose files `COPY` and `ADD` read,
//! hostile like a workspace.
//!
//! It is read beneath its directory through no link at all: a source
//! named through a link, or that is one, is refused (`openat2` with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`), as is a name that climbs out
//! with `..`; a link inside a copied directory is copied as a link (its
//! target is only text in the image). Files are sized before any is read,
//! against the build's budget, so a huge or sparse file is refused without
//! being read. `.dockerignore` applies to every source.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;
use sha2::Digest as _;

use crate::ignore::Ignore;
use crate::view::shown;

const STRICT: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);
/// Deepest directory copied.
const MAX_DEPTH: usize = 128;
/// Most entries one `COPY` takes.
const MAX_ENTRIES: usize = 1_000_000;

#[derive(Debug, thiserror::Error)]
pub enum ContextError {
    #[error("{0}")]
    Refused(String),
    #[error("{path}: {errno}")]
    Io { path: String, errno: Errno },
}

fn refused(why: impl Into<String>) -> ContextError {
    ContextError::Refused(why.into())
}

/// What a source names in the context.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Kind {
    File { size: u64, digest: [u8; 32] },
    Dir,
    Link { target: Vec<u8> },
}

/// One entry to copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    /// Its path in the context.
    pub path: Vec<u8>,
    /// Its path under where the source goes: its own name for a named
    /// file, its path inside a named directory.
    pub rel: Vec<u8>,
    pub kind: Kind,
    pub mode: u32,
    pub mtime: i64,
}

/// One source, as it matched.
#[derive(Debug, Clone)]
pub struct Selected {
    /// Whether the source is a directory (whose contents are copied).
    pub dir: bool,
    pub entries: Vec<Entry>,
}

pub struct Context {
    root: OwnedFd,
    shown: PathBuf,
    ignore: Ignore,
}

impl Context {
    /// The context at `dir` (the user's own path: reached as they name it)
    /// with its `.dockerignore`, if any.
    pub fn open(dir: &Path) -> Result<Context, ContextError> {
        let mut ctx = Context::open_plain(dir)?;
        if let Some(text) = ctx.read_small(b".dockerignore", 1 << 20)? {
            let text = String::from_utf8_lossy(&text);
            ctx.ignore =
                Ignore::parse(&text).map_err(|e| refused(format!(".dockerignore: {e}")))?;
        }
        Ok(ctx)
    }

    /// The directory at `dir` with no `.dockerignore` read: an archive
    /// `ADD` unpacked, all of which is copied.
    pub fn open_plain(dir: &Path) -> Result<Context, ContextError> {
        let root = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|errno| ContextError::Io {
            path: dir.display().to_string(),
            errno,
        })?;
        Ok(Context {
            root,
            shown: dir.to_path_buf(),
            ignore: Ignore::none(),
        })
    }

    /// A small file of the context (the Dockerfile, `.dockerignore`), if
    /// it is there: refused if larger than `max`.
    pub fn read_small(&self, rel: &[u8], max: u64) -> Result<Option<Vec<u8>>, ContextError> {
        let fd = match self.open_at(rel, OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(None),
            Err(errno) => return Err(self.io(rel, errno)),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| self.io(rel, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(refused(format!("{}: not a regular file", shown(rel))));
        }
        let mut bytes = Vec::new();
        std::fs::File::from(fd)
            .take(max + 1)
            .read_to_end(&mut bytes)
            .map_err(|e| self.io(rel, Errno::from_io_error(&e).unwrap_or(Errno::IO)))?;
        if bytes.len() as u64 > max {
            return Err(refused(format!("{}: larger than {max} bytes", shown(rel))));
        }
        Ok(Some(bytes))
    }

    /// What `source` (a path in the context, which may hold `*`, `?` and
    /// `[...]`) names, every file hashed; at most `budget` bytes of files
    /// in all.
    pub fn select(&self, source: &str, budget: u64) -> Result<Vec<Selected>, ContextError> {
        let mut parts = Vec::new();
        for c in source.split('/') {
            match c {
                "" | "." => {}
                ".." => {
                    return Err(refused(format!(
                        "{source}: outside the build context (`..`); only the context's files can be copied"
                    )));
                }
                c => parts.push(c),
            }
        }
        let mut matches: Vec<Vec<u8>> = vec![Vec::new()];
        for part in &parts {
            let mut next = Vec::new();
            for m in &matches {
                if part.contains(['*', '?', '[']) {
                    let glob = globset::GlobBuilder::new(part)
                        .literal_separator(true)
                        .build()
                        .map_err(|e| refused(format!("{source}: {e}")))?
                        .compile_matcher();
                    for name in self.names(m)? {
                        if glob.is_match(OsStr::from_bytes(&name)) {
                            next.push(join(m, &name));
                        }
                    }
                } else {
                    next.push(join(m, part.as_bytes()));
                }
            }
            matches = next;
        }
        matches.retain(|m| m.is_empty() || !self.ignore.excludes(&String::from_utf8_lossy(m)));
        if matches.is_empty() {
            return Err(refused(format!(
                "{source}: no file of the context matches (or .dockerignore excludes it)"
            )));
        }
        matches.sort();
        let mut left = budget;
        let mut out = Vec::new();
        for m in matches {
            out.push(self.take(&m, &mut left)?);
        }
        Ok(out)
    }

    /// The entries of the source at `path`.
    fn take(&self, path: &[u8], left: &mut u64) -> Result<Selected, ContextError> {
        let fd = self
            .open_at(path, OFlags::PATH)
            .map_err(|errno| match errno {
                Errno::LOOP | Errno::XDEV => refused(format!(
                    "{}: a link, or a path through one; the context is read through no link",
                    shown(path)
                )),
                Errno::NOENT => refused(format!("{}: not in the build context", shown(path))),
                e => self.io(path, e),
            })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| self.io(path, e))?;
        if FileType::from_raw_mode(st.st_mode) == FileType::Symlink {
            return Err(refused(format!(
                "{}: a link; the context is read through no link (copy what it points to instead)",
                shown(path)
            )));
        }
        let name = path
            .rsplit(|&b| b == b'/')
            .next()
            .unwrap_or_default()
            .to_vec();
        let mut entries = Vec::new();
        let dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
        if dir {
            self.walk(path, &mut Vec::new(), &mut entries, left, 0)?;
        } else {
            self.entry(path, name, &mut entries, left)?;
        }
        Ok(Selected { dir, entries })
    }

    fn walk(
        &self,
        dir: &[u8],
        rel: &mut Vec<u8>,
        out: &mut Vec<Entry>,
        left: &mut u64,
        depth: usize,
    ) -> Result<(), ContextError> {
        if depth > MAX_DEPTH {
            return Err(refused(format!("{}: nested too deep", shown(dir))));
        }
        for name in self.names(dir)? {
            let path = join(dir, &name);
            let shown_rel = String::from_utf8_lossy(&path).into_owned();
            let excluded = self.ignore.excludes(&shown_rel);
            let len = rel.len();
            if !rel.is_empty() {
                rel.push(b'/');
            }
            rel.extend_from_slice(&name);
            let st = rustix::fs::statat(
                &self.open_dir(dir)?,
                OsStr::from_bytes(&name),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .map_err(|e| self.io(&path, e))?;
            let is_dir = FileType::from_raw_mode(st.st_mode) == FileType::Directory;
            if !excluded {
                self.entry(&path, rel.clone(), out, left)?;
            }
            if is_dir && (!excluded || self.ignore.may_include_beneath(&shown_rel)) {
                self.walk(&path, rel, out, left, depth + 1)?;
            }
            rel.truncate(len);
        }
        Ok(())
    }

    /// Adds the entry at `path` (not followed), hashing a file.
    fn entry(
        &self,
        path: &[u8],
        rel: Vec<u8>,
        out: &mut Vec<Entry>,
        left: &mut u64,
    ) -> Result<(), ContextError> {
        if out.len() >= MAX_ENTRIES {
            return Err(refused(format!(
                "more than {MAX_ENTRIES} files in one copy"
            )));
        }
        let (parent, name) = match path.iter().rposition(|&b| b == b'/') {
            Some(i) => (&path[..i], &path[i + 1..]),
            None => (&b""[..], path),
        };
        let pfd = self.open_dir(parent)?;
        let st = rustix::fs::statat(&pfd, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW)
            .map_err(|e| self.io(path, e))?;
        let kind = match FileType::from_raw_mode(st.st_mode) {
            FileType::Directory => Kind::Dir,
            FileType::Symlink => Kind::Link {
                target: rustix::fs::readlinkat(&pfd, OsStr::from_bytes(name), Vec::new())
                    .map_err(|e| self.io(path, e))?
                    .into_bytes(),
            },
            FileType::RegularFile => {
                let size = st.st_size as u64;
                if size > *left {
                    return Err(refused(format!(
                        "{}: {size} bytes, past what is left of the build's budget ({} bytes; see --disk)",
                        shown(path),
                        *left
                    )));
                }
                *left -= size;
                let fd = rustix::fs::openat(
                    &pfd,
                    OsStr::from_bytes(name),
                    OFlags::RDONLY
                        | OFlags::NOFOLLOW
                        | OFlags::NOCTTY
                        | OFlags::NONBLOCK
                        | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| self.io(path, e))?;
                let mut hasher = sha2::Sha256::new();
                let mut f = std::fs::File::from(fd).take(size);
                let mut buf = vec![0u8; 64 << 10];
                loop {
                    let n = f.read(&mut buf).map_err(|e| {
                        self.io(path, Errno::from_io_error(&e).unwrap_or(Errno::IO))
                    })?;
                    if n == 0 {
                        break;
                    }
                    hasher.update(&buf[..n]);
                }
                Kind::File {
                    size,
                    digest: hasher.finalize().into(),
                }
            }
            // Sockets, devices and pipes are not a build's input.
            _ => return Ok(()),
        };
        out.push(Entry {
            path: path.to_vec(),
            rel,
            kind,
            mode: st.st_mode & 0o7777,
            mtime: st.st_mtime,
        });
        Ok(())
    }

    /// Opens a file of the context for copying: the entry `select` found.
    pub fn open_file(&self, path: &[u8]) -> Result<std::fs::File, ContextError> {
        self.open_at(path, OFlags::RDONLY | OFlags::NOCTTY | OFlags::NONBLOCK)
            .map(std::fs::File::from)
            .map_err(|e| self.io(path, e))
    }

    /// The names in the context's directory `dir`, in order.
    fn names(&self, dir: &[u8]) -> Result<Vec<Vec<u8>>, ContextError> {
        let fd = self.open_dir(dir)?;
        let mut names = Vec::new();
        for e in rustix::fs::Dir::read_from(&fd).map_err(|e| self.io(dir, e))? {
            let e = e.map_err(|e| self.io(dir, e))?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push(n.to_vec());
            }
        }
        names.sort();
        Ok(names)
    }

    fn open_dir(&self, dir: &[u8]) -> Result<OwnedFd, ContextError> {
        self.open_at(dir, OFlags::RDONLY | OFlags::DIRECTORY)
            .map_err(|e| self.io(dir, e))
    }

    fn open_at(&self, rel: &[u8], flags: OFlags) -> Result<OwnedFd, Errno> {
        let rel = if rel.is_empty() { &b"."[..] } else { rel };
        rustix::fs::openat2(
            &self.root,
            OsStr::from_bytes(rel),
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            STRICT,
        )
    }

    fn io(&self, rel: &[u8], errno: Errno) -> ContextError {
        ContextError::Io {
            path: format!("{}/{}", self.shown.display(), shown(rel)),
            errno,
        }
    }
}

fn join(dir: &[u8], name: &[u8]) -> Vec<u8> {
    if dir.is_empty() {
        return name.to_vec();
    }
    let mut p = dir.to_vec();
    p.push(b'/');
    p.extend_from_slice(name);
    p
}
