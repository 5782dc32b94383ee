//! A sandbox's changes to its root, as an OCI layer: overlayfs's upper
//! directory written as a tar.
//!
//! The upper directory is what the sandbox wrote, so hostile: it is walked
//! by descriptors beneath its root, nothing in it is followed (a link is
//! only its target's text), a file is read through a descriptor opened
//! without following, and every name is taken as bytes. Overlay's markers
//! become the OCI ones: a character device 0:0 is a `.wh.NAME` whiteout, a
//! directory marked `user.overlay.opaque` gets a `.wh..wh..opq` entry. The
//! owners are the image's ids, translated from the host ids the sandbox
//! wrote as; a file owned by an id the sandbox could not have given stops
//! the write. The entries are in name order, so the same tree makes the
//! same tar. Extended attributes are not carried (the store drops them),
//! nor sockets or device nodes (a sandbox gets its own `/dev`).

use std::collections::HashMap;
use std::ffi::{CStr, OsStr};
use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;

use crate::text::shown;

/// The marker overlayfs (mounted with `userxattr`) sets on a directory
/// that hides the ones below it.
const OPAQUE_XATTR: &CStr = c"user.overlay.opaque";
/// Deepest directory walked: as deep as an unpack goes.
const MAX_DEPTH: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum ChangesError {
    #[error("{path}: {source}")]
    Io {
        path: String,
        #[source]
        source: io::Error,
    },
    #[error("{path}: owned by host ids {uid}:{gid}, which the sandbox could not have given")]
    Owner { path: String, uid: u32, gid: u32 },
    #[error("{path}: nested deeper than {MAX_DEPTH} directories")]
    TooDeep { path: String },
}

/// What a write of changes held.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Summary {
    pub entries: u64,
    /// Bytes of file content.
    pub bytes: u64,
    pub whiteouts: u64,
    /// Sockets and device nodes left out.
    pub skipped: u64,
}

/// Which paths (relative, `/`-separated bytes) of the upper directory are
/// not the sandbox's changes: what cordon itself put there to run it.
pub type Skip<'a> = &'a dyn Fn(&[u8], FileType) -> bool;
/// The image's uid and gid of a file owned by host ids `uid` and `gid`.
pub type Ids<'a> = &'a dyn Fn(u32, u32) -> Option<(u32, u32)>;

/// Writes the changes in `upper` as a layer tar to `out`.
pub fn write_changes(
    upper: &Path,
    ids: Ids<'_>,
    skip: Skip<'_>,
    out: impl Write,
) -> Result<Summary, ChangesError> {
    let root = rustix::fs::open(
        upper,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| err(upper.as_os_str().as_bytes(), e))?;
    write_changes_at(&root, ids, skip, out)
}

/// [`write_changes`] of the upper directory open as `root`.
pub fn write_changes_at(
    root: &OwnedFd,
    ids: Ids<'_>,
    skip: Skip<'_>,
    out: impl Write,
) -> Result<Summary, ChangesError> {
    let mut w = Writer {
        tar: tar::Builder::new(out),
        ids,
        skip,
        links: HashMap::new(),
        summary: Summary::default(),
    };
    w.dir(root, &mut Vec::new(), 0)?;
    let summary = w.summary.clone();
    w.tar
        .into_inner()
        .and_then(|mut o| o.flush())
        .map_err(|e| ChangesError::Io {
            path: "the layer".into(),
            source: e,
        })?;
    Ok(summary)
}

fn err(path: &[u8], e: impl Into<io::Error>) -> ChangesError {
    ChangesError::Io {
        path: shown(path),
        source: e.into(),
    }
}

struct Writer<'a, W: Write> {
    tar: tar::Builder<W>,
    ids: Ids<'a>,
    skip: Skip<'a>,
    /// Files with more than one link already written, by inode, and the
    /// path they were written as.
    links: HashMap<(u64, u64), Vec<u8>>,
    summary: Summary,
}

impl<W: Write> Writer<'_, W> {
    /// Writes what the directory `dir` (at `path`, empty for the root)
    /// holds, in name order.
    fn dir(&mut self, dir: &OwnedFd, path: &mut Vec<u8>, depth: usize) -> Result<(), ChangesError> {
        if depth > MAX_DEPTH {
            return Err(ChangesError::TooDeep { path: shown(path) });
        }
        let mut names = Vec::new();
        for e in rustix::fs::Dir::read_from(dir).map_err(|e| err(path, e))? {
            let e = e.map_err(|e| err(path, e))?;
            let n = e.file_name().to_bytes();
            if n != b"." && n != b".." {
                names.push(n.to_vec());
            }
        }
        names.sort();
        for name in names {
            let len = path.len();
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(&name);
            let r = self.entry(dir, OsStr::from_bytes(&name), path, depth);
            path.truncate(len);
            r?;
        }
        Ok(())
    }

    fn entry(
        &mut self,
        dir: &OwnedFd,
        name: &OsStr,
        path: &mut Vec<u8>,
        depth: usize,
    ) -> Result<(), ChangesError> {
        let st = match rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => st,
            // Gone since the listing (a live sandbox's snapshot).
            Err(Errno::NOENT) => return Ok(()),
            Err(e) => return Err(err(path, e)),
        };
        let kind = FileType::from_raw_mode(st.st_mode);
        if (self.skip)(path, kind) {
            return Ok(());
        }
        if kind == FileType::CharacterDevice && st.st_rdev == 0 {
            let mut wh = path.clone();
            let at = wh.len() - name.len();
            wh.splice(at..at, b".wh.".iter().copied());
            let mut h = self.header(tar::EntryType::Regular, &st, path)?;
            h.set_mode(0o644);
            h.set_size(0);
            self.append(&mut h, &wh, io::empty())?;
            self.summary.whiteouts += 1;
            return Ok(());
        }
        match kind {
            FileType::Directory => {
                let sub = rustix::fs::openat(
                    dir,
                    name,
                    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|e| err(path, e))?;
                let mut h = self.header(tar::EntryType::Directory, &st, path)?;
                h.set_size(0);
                let mut as_dir = path.clone();
                as_dir.push(b'/');
                self.append(&mut h, &as_dir, io::empty())?;
                let mut v = [0u8; 1];
                if rustix::fs::fgetxattr(&sub, OPAQUE_XATTR, &mut v).is_ok() && v[0] == b'y' {
                    let mut opq = as_dir.clone();
                    opq.extend_from_slice(b".wh..wh..opq");
                    let mut h = self.header(tar::EntryType::Regular, &st, path)?;
                    h.set_mode(0o644);
                    h.set_size(0);
                    self.append(&mut h, &opq, io::empty())?;
                    self.summary.whiteouts += 1;
                }
                self.dir(&sub, path, depth + 1)?;
            }
            FileType::RegularFile => {
                let inode = (st.st_dev, st.st_ino);
                if st.st_nlink > 1 {
                    if let Some(first) = self.links.get(&inode).cloned() {
                        let mut h = self.header(tar::EntryType::Link, &st, path)?;
                        h.set_size(0);
                        self.tar
                            .append_link(&mut h, OsStr::from_bytes(path), OsStr::from_bytes(&first))
                            .map_err(|e| err(path, e))?;
                        self.summary.entries += 1;
                        return Ok(());
                    }
                    self.links.insert(inode, path.clone());
                }
                let fd = rustix::fs::openat(
                    dir,
                    name,
                    OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY,
                    Mode::empty(),
                )
                .map_err(|e| err(path, e))?;
                let size = st.st_size as u64;
                let mut h = self.header(tar::EntryType::Regular, &st, path)?;
                h.set_size(size);
                // Exactly the size the header says, even if the file
                // changed since (a live sandbox's): cut, or padded with
                // zeros.
                let body = std::fs::File::from(fd)
                    .take(size)
                    .chain(io::repeat(0))
                    .take(size);
                self.append(&mut h, path, body)?;
                self.summary.bytes += size;
            }
            FileType::Symlink => {
                let target =
                    rustix::fs::readlinkat(dir, name, Vec::new()).map_err(|e| err(path, e))?;
                let mut h = self.header(tar::EntryType::Symlink, &st, path)?;
                h.set_size(0);
                self.tar
                    .append_link(
                        &mut h,
                        OsStr::from_bytes(path),
                        OsStr::from_bytes(target.as_bytes()),
                    )
                    .map_err(|e| err(path, e))?;
                self.summary.entries += 1;
            }
            FileType::Fifo => {
                let mut h = self.header(tar::EntryType::Fifo, &st, path)?;
                h.set_size(0);
                self.append(&mut h, path, io::empty())?;
            }
            _ => self.summary.skipped += 1,
        }
        Ok(())
    }

    /// A header with the entry's image owners, mode and time.
    fn header(
        &self,
        kind: tar::EntryType,
        st: &rustix::fs::Stat,
        path: &[u8],
    ) -> Result<tar::Header, ChangesError> {
        let (uid, gid) = (self.ids)(st.st_uid, st.st_gid).ok_or(ChangesError::Owner {
            path: shown(path),
            uid: st.st_uid,
            gid: st.st_gid,
        })?;
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(kind);
        h.set_uid(uid.into());
        h.set_gid(gid.into());
        h.set_mode(st.st_mode & 0o7777);
        h.set_mtime(st.st_mtime.max(0) as u64);
        Ok(h)
    }

    fn append(
        &mut self,
        h: &mut tar::Header,
        path: &[u8],
        body: impl Read,
    ) -> Result<(), ChangesError> {
        self.tar
            .append_data(h, OsStr::from_bytes(path), body)
            .map_err(|e| err(path, e))?;
        self.summary.entries += 1;
        Ok(())
    }
}
