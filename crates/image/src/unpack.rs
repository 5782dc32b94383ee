//! Unpacking a layer: an attacker's tar (plain, gzip or zstd), written
//! beneath a fresh directory.
//!
//! Every entry is placed by descriptors, never by a path the kernel would
//! resolve through a link: each parent directory is opened (or made) one
//! component at a time beneath the layer's root with
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS`, and the entry is made relative
//! to it without following anything. So a symbolic link an earlier entry
//! planted (`etc -> /etc`) is only ever data: an entry written through it
//! is refused, as is a name with `..`, a hard link to a path the layer
//! does not hold, and a hard link through a link. Absolute names are taken
//! as relative to the layer, as every tar tool does.
//!
//! Neutralised, and counted in the [`Report`]: setuid and setgid bits
//! (a stored file must not grant a host identity to whoever can reach
//! it), device nodes (a sandbox gets its own `/dev`), and extended
//! attributes (an image must not plant overlay markers or capabilities).
//! A layer bigger than its budget, with too many entries or a path too
//! deep, stops the unpack with an error; the caller removes the directory,
//! so no half layer is ever used.
//!
//! Whiteouts become what overlayfs reads in a lower layer: `.wh.NAME` a
//! character device 0:0 named NAME (which an unprivileged process may
//! make since Linux 5.8), `.wh..wh..opq` the `user.overlay.opaque`
//! attribute on its directory (read by an overlay mounted with
//! `userxattr`, as one in a user namespace is).

use std::ffi::{CString, OsStr};
use std::io::{self, Read};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Timespec, Timestamps};
use rustix::io::Errno;

use crate::digest::{Digest, HashingReader};
use crate::text::shown;

/// Beneath the directory, through no link at all.
const STRICT: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);
/// The prefix of a whiteout's name, and the name of an opaque marker.
const WHITEOUT: &[u8] = b".wh.";
const OPAQUE: &[u8] = b".wh..wh..opq";
/// What marks a directory opaque for an overlay mounted with `userxattr`.
const OPAQUE_XATTR: &str = "user.overlay.opaque";
/// Deepest path accepted: each level holds a descriptor while the entry
/// is made, and no real image nests this far.
const MAX_DEPTH: usize = 128;
/// Largest id an entry may be owned by: what a sandbox's namespace maps.
pub const MAX_ID: u64 = 65_535;
/// Bytes after the tar's end that still count towards its digest (the
/// zero blocks a writer pads with); more is not a layer.
const MAX_TRAILER: u64 = 1 << 20;

/// How much one layer may hold.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes of file content.
    pub max_bytes: u64,
    pub max_entries: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_bytes: 32 << 30,
            max_entries: 2_000_000,
        }
    }
}

/// Whose files the unpacked ones are.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owners {
    /// The entries' own ids (up to [`MAX_ID`]): root unpacking into a
    /// store of its own, or a process in a namespace that maps them.
    Keep,
    /// The unpacking process's, whatever the entries say.
    Caller,
}

/// What an unpack did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Report {
    pub entries: u64,
    pub bytes: u64,
    /// The digest of the uncompressed tar: the layer's `diff_id`.
    pub diff_id: Option<Digest>,
    pub setid_dropped: u64,
    pub devices_skipped: u64,
    pub xattrs_dropped: u64,
}

#[derive(Debug, thiserror::Error)]
pub enum UnpackError {
    #[error("layer entry {path:?} refused: {why}")]
    Refused { path: String, why: String },
    #[error("the layer holds more than {0}")]
    TooBig(String),
    #[error("reading the layer: {0}")]
    Read(#[source] io::Error),
    #[error("writing {path:?}: {errno}")]
    Write { path: String, errno: Errno },
}

fn refused(path: &[u8], why: impl Into<String>) -> UnpackError {
    UnpackError::Refused {
        path: shown(path),
        why: why.into(),
    }
}

/// The components of an entry's name, or why it is refused.
fn components(path: &[u8]) -> Result<Vec<&[u8]>, UnpackError> {
    let mut out = Vec::new();
    for c in path.split(|&b| b == b'/') {
        match c {
            b"" | b"." => {}
            b".." => return Err(refused(path, "its name climbs out with `..`")),
            c => out.push(c),
        }
    }
    if out.len() > MAX_DEPTH {
        return Err(refused(
            path,
            format!("it is nested deeper than {MAX_DEPTH}"),
        ));
    }
    Ok(out)
}

/// Unpacks the tar (gzip-compressed or plain, told by its first bytes)
/// read from `layer` into `dest`, an empty directory.
pub fn unpack(
    layer: impl Read,
    dest: &Path,
    limits: Limits,
    owners: Owners,
) -> Result<Report, UnpackError> {
    let mut layer = io::BufReader::new(layer);
    let head = {
        use io::BufRead;
        let head = layer.fill_buf().map_err(UnpackError::Read)?;
        [GZIP_MAGIC, ZSTD_MAGIC]
            .into_iter()
            .find(|m| head.starts_with(m))
    };
    match head {
        Some(GZIP_MAGIC) => unpack_tar(
            flate2::read::MultiGzDecoder::new(layer),
            dest,
            limits,
            owners,
        ),
        Some(_) => unpack_tar(Zstd::new(layer), dest, limits, owners),
        None => unpack_tar(layer, dest, limits, owners),
    }
}

/// [`unpack`] of a tar known to be uncompressed (one cordon wrote), whose
/// first bytes are a file name and so may look like any magic number.
pub(crate) fn unpack_plain(
    tar: impl Read,
    dest: &Path,
    limits: Limits,
    owners: Owners,
) -> Result<Report, UnpackError> {
    unpack_tar(tar, dest, limits, owners)
}

/// The first bytes of a gzip member and of a zstd frame.
const GZIP_MAGIC: &[u8] = &[0x1f, 0x8b];
const ZSTD_MAGIC: &[u8] = &[0x28, 0xb5, 0x2f, 0xfd];

/// A zstd stream of any number of frames (skippable ones skipped), each
/// decoded with the decoder's default window limit, so that a frame cannot
/// make the host allocate more than that.
struct Zstd<R> {
    source: R,
    decoder: ruzstd::decoding::FrameDecoder,
    in_frame: bool,
}

impl<R: io::BufRead> Zstd<R> {
    fn new(source: R) -> Zstd<R> {
        Zstd {
            source,
            decoder: ruzstd::decoding::FrameDecoder::new(),
            in_frame: false,
        }
    }
}

impl<R: io::BufRead> Read for Zstd<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        use ruzstd::decoding::BlockDecodingStrategy;
        use ruzstd::decoding::errors::{FrameDecoderError, ReadFrameHeaderError};
        loop {
            if !self.in_frame {
                if self.source.fill_buf()?.is_empty() {
                    return Ok(0);
                }
                match self.decoder.reset(&mut self.source) {
                    Ok(()) => self.in_frame = true,
                    Err(FrameDecoderError::ReadFrameHeaderError(
                        ReadFrameHeaderError::SkipFrame { length, .. },
                    )) => {
                        io::copy(&mut (&mut self.source).take(length.into()), &mut io::sink())?;
                        continue;
                    }
                    Err(e) => return Err(io::Error::other(e)),
                }
            }
            while self.decoder.can_collect() == 0 && !self.decoder.is_finished() {
                self.decoder
                    .decode_blocks(&mut self.source, BlockDecodingStrategy::UptoBlocks(1))
                    .map_err(io::Error::other)?;
            }
            let n = self.decoder.read(buf)?;
            if n > 0 || buf.is_empty() {
                return Ok(n);
            }
            if self.decoder.is_finished() {
                self.in_frame = false;
            }
        }
    }
}

/// A directory whose mode, owner and time are set once all it holds is
/// in place (a read-only directory would refuse its own entries).
struct Fixup {
    path: Vec<u8>,
    mode: u32,
    ids: Option<(u32, u32)>,
    mtime: i64,
}

fn unpack_tar(
    tar: impl Read,
    dest: &Path,
    limits: Limits,
    owners: Owners,
) -> Result<Report, UnpackError> {
    let root = rustix::fs::open(
        dest,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|errno| UnpackError::Write {
        path: dest.display().to_string(),
        errno,
    })?;
    let mut hashing = HashingReader::new(tar);
    let mut report = Report::default();
    let mut fixups = Vec::new();
    {
        let mut archive = tar::Archive::new(&mut hashing);
        for entry in archive.entries().map_err(UnpackError::Read)? {
            let mut entry = entry.map_err(UnpackError::Read)?;
            report.entries += 1;
            if report.entries > limits.max_entries {
                return Err(UnpackError::TooBig(format!(
                    "{} entries",
                    limits.max_entries
                )));
            }
            place(&root, &mut entry, limits, owners, &mut report, &mut fixups)?;
        }
    }
    // The digest covers the whole stream, padding included.
    let trailer = io::copy(&mut (&mut hashing).take(MAX_TRAILER + 1), &mut io::sink())
        .map_err(UnpackError::Read)?;
    if trailer > MAX_TRAILER {
        return Err(refused(b"", "data goes on past the end of the archive"));
    }
    // Deepest first, so that a directory is closed after what it holds.
    fixups
        .sort_by_key(|f: &Fixup| std::cmp::Reverse(f.path.iter().filter(|&&b| b == b'/').count()));
    for f in fixups {
        fix_dir(&root, &f)?;
    }
    report.diff_id = Some(hashing.digest());
    Ok(report)
}

/// Places one entry beneath `root`.
fn place<R: Read>(
    root: &OwnedFd,
    entry: &mut tar::Entry<'_, R>,
    limits: Limits,
    owners: Owners,
    report: &mut Report,
    fixups: &mut Vec<Fixup>,
) -> Result<(), UnpackError> {
    let raw = entry.path_bytes().into_owned();
    let parts = components(&raw)?;
    let header = entry.header();
    let kind = header.entry_type();
    let mode = header.mode().map_err(UnpackError::Read)?;
    let mtime = header.mtime().unwrap_or(0).min(i64::MAX as u64) as i64;
    let ids = match owners {
        Owners::Caller => None,
        Owners::Keep => {
            // An empty owner field (some writers leave it) is root's.
            let (uid, gid) = (header.uid().unwrap_or(0), header.gid().unwrap_or(0));
            if uid > MAX_ID || gid > MAX_ID {
                return Err(refused(
                    &raw,
                    format!("it is owned by {uid}:{gid}, past the {MAX_ID} a sandbox maps"),
                ));
            }
            Some((uid as u32, gid as u32))
        }
    };
    if let Ok(Some(pax)) = entry.pax_extensions() {
        report.xattrs_dropped += pax
            .flatten()
            .filter(|e| e.key_bytes().starts_with(b"SCHILY.xattr."))
            .count() as u64;
    }
    // A pax global header (what `git archive` starts with) describes the
    // archive, not a file.
    if kind == tar::EntryType::XGlobalHeader {
        return Ok(());
    }
    let Some((name, dirs)) = parts.split_last() else {
        // The layer's root itself (`./`): its metadata stays the store's.
        return Ok(());
    };
    let name = OsStr::from_bytes(name);
    let w = |errno| UnpackError::Write {
        path: shown(&raw),
        errno,
    };
    let parent = open_parent(root, dirs, &raw)?;

    // Whiteouts, in overlayfs's form.
    if name.as_bytes() == OPAQUE {
        let attr = CString::new(OPAQUE_XATTR).expect("no NUL");
        rustix::fs::fsetxattr(&parent, &attr, b"y", rustix::fs::XattrFlags::empty()).map_err(w)?;
        return Ok(());
    }
    if let Some(hidden) = name.as_bytes().strip_prefix(WHITEOUT) {
        if matches!(hidden, b"" | b"." | b"..") || hidden.contains(&b'/') {
            return Err(refused(&raw, "a whiteout of no name"));
        }
        let hidden = OsStr::from_bytes(hidden);
        remove_at(&parent, hidden, &raw)?;
        rustix::fs::mknodat(&parent, hidden, FileType::CharacterDevice, Mode::empty(), 0)
            .map_err(w)?;
        return Ok(());
    }

    let (perm, setid) = (mode & 0o1777, mode & 0o6000 != 0);
    if setid {
        report.setid_dropped += 1;
    }
    use tar::EntryType as T;
    match kind {
        T::Directory => {
            match rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o700)) {
                Ok(()) => {}
                Err(Errno::EXIST) if is_dir_at(&parent, name) => {}
                Err(Errno::EXIST) => {
                    remove_at(&parent, name, &raw)?;
                    rustix::fs::mkdirat(&parent, name, Mode::from_raw_mode(0o700)).map_err(w)?;
                }
                Err(e) => return Err(w(e)),
            }
            fixups.push(Fixup {
                path: parts.join(&b'/'),
                mode: perm,
                ids,
                mtime,
            });
        }
        T::Regular | T::Continuous => {
            remove_at(&parent, name, &raw)?;
            let fd = rustix::fs::openat(
                &parent,
                name,
                OFlags::CREATE | OFlags::EXCL | OFlags::WRONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::from_raw_mode(0o600),
            )
            .map_err(w)?;
            let mut file = std::fs::File::from(fd);
            let left = limits.max_bytes.saturating_sub(report.bytes);
            let n = io::copy(&mut entry.take(left + 1), &mut file).map_err(UnpackError::Read)?;
            report.bytes += n;
            if report.bytes > limits.max_bytes {
                return Err(UnpackError::TooBig(format!(
                    "{} bytes of files",
                    limits.max_bytes
                )));
            }
            finish(file.as_fd(), perm, ids, mtime).map_err(w)?;
        }
        T::Symlink => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| refused(&raw, "a symbolic link with no target"))?;
            remove_at(&parent, name, &raw)?;
            // The target is only data: nothing here ever follows it.
            rustix::fs::symlinkat(OsStr::from_bytes(&target), &parent, name).map_err(w)?;
            if let Some((uid, gid)) = ids {
                chown_at(&parent, name, uid, gid).map_err(w)?;
            }
            let _ = rustix::fs::utimensat(&parent, name, &times(mtime), AtFlags::SYMLINK_NOFOLLOW);
        }
        T::Link => {
            let target = entry
                .link_name_bytes()
                .ok_or_else(|| refused(&raw, "a hard link with no target"))?;
            let target_parts = components(&target)?;
            if target_parts.is_empty() {
                return Err(refused(&raw, "a hard link to the layer's root"));
            }
            let joined = target_parts.join(&b'/');
            let source = rustix::fs::openat2(
                root,
                OsStr::from_bytes(&joined),
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                STRICT,
            )
            .map_err(|e| {
                refused(
                    &raw,
                    format!(
                        "a hard link to {}, which this layer does not hold beneath it ({e})",
                        shown(&target)
                    ),
                )
            })?;
            let st = rustix::fs::fstat(&source).map_err(w)?;
            if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
                return Err(refused(&raw, "a hard link to something not a regular file"));
            }
            remove_at(&parent, name, &raw)?;
            // By the descriptor, so that no path is resolved again.
            let proc = format!("/proc/self/fd/{}", source.as_raw_fd());
            rustix::fs::linkat(
                rustix::fs::CWD,
                proc.as_str(),
                &parent,
                name,
                AtFlags::SYMLINK_FOLLOW,
            )
            .map_err(w)?;
        }
        T::Fifo => {
            remove_at(&parent, name, &raw)?;
            rustix::fs::mknodat(&parent, name, FileType::Fifo, Mode::from_raw_mode(perm), 0)
                .map_err(w)?;
            if let Some((uid, gid)) = ids {
                chown_at(&parent, name, uid, gid).map_err(w)?;
            }
        }
        T::Char | T::Block => report.devices_skipped += 1,
        other => {
            return Err(refused(
                &raw,
                format!("entries of type {other:?} are not supported"),
            ));
        }
    }
    Ok(())
}

fn times(mtime: i64) -> Timestamps {
    let t = Timespec {
        tv_sec: mtime,
        tv_nsec: 0,
    };
    Timestamps {
        last_access: t,
        last_modification: t,
    }
}

fn chown_at(dir: &OwnedFd, name: &OsStr, uid: u32, gid: u32) -> rustix::io::Result<()> {
    rustix::fs::chownat(
        dir,
        name,
        Some(rustix::fs::Uid::from_raw(uid)),
        Some(rustix::fs::Gid::from_raw(gid)),
        AtFlags::SYMLINK_NOFOLLOW,
    )
}

/// Owner first (a chown clears set-id bits, and there are none left to
/// clear), then mode and time, on an open file or directory.
fn finish(
    fd: BorrowedFd<'_>,
    perm: u32,
    ids: Option<(u32, u32)>,
    mtime: i64,
) -> rustix::io::Result<()> {
    if let Some((uid, gid)) = ids {
        rustix::fs::fchown(
            fd,
            Some(rustix::fs::Uid::from_raw(uid)),
            Some(rustix::fs::Gid::from_raw(gid)),
        )?;
    }
    rustix::fs::fchmod(fd, Mode::from_raw_mode(perm))?;
    rustix::fs::futimens(fd, &times(mtime))
}

fn fix_dir(root: &OwnedFd, f: &Fixup) -> Result<(), UnpackError> {
    let w = |errno| UnpackError::Write {
        path: shown(&f.path),
        errno,
    };
    let dir = rustix::fs::openat2(
        root,
        OsStr::from_bytes(&f.path),
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        STRICT,
    );
    match dir {
        Ok(dir) => finish(dir.as_fd(), f.mode, f.ids, f.mtime).map_err(w),
        // Replaced by a later entry (a file, a whiteout): nothing to fix.
        Err(Errno::NOENT | Errno::NOTDIR | Errno::LOOP) => Ok(()),
        Err(e) => Err(w(e)),
    }
}

/// Opens (making as needed) each directory of `dirs` beneath `root`,
/// refusing a link or a file on the way.
fn open_parent(root: &OwnedFd, dirs: &[&[u8]], raw: &[u8]) -> Result<OwnedFd, UnpackError> {
    let open = |at: &OwnedFd, name: &OsStr| {
        rustix::fs::openat2(
            at,
            name,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            STRICT,
        )
    };
    let mut cur = open(root, OsStr::new(".")).map_err(|errno| UnpackError::Write {
        path: shown(raw),
        errno,
    })?;
    for d in dirs {
        let name = OsStr::from_bytes(d);
        let next = match open(&cur, name) {
            Err(Errno::NOENT) => {
                match rustix::fs::mkdirat(&cur, name, Mode::from_raw_mode(0o755)) {
                    Ok(()) | Err(Errno::EXIST) => {}
                    Err(errno) => {
                        return Err(UnpackError::Write {
                            path: shown(raw),
                            errno,
                        });
                    }
                }
                open(&cur, name)
            }
            r => r,
        };
        cur = next.map_err(|e| match e {
            Errno::LOOP | Errno::NOTDIR | Errno::XDEV => refused(
                raw,
                format!(
                    "it is written through {}, which is a link or a file in this layer, not a directory",
                    shown(d)
                ),
            ),
            errno => UnpackError::Write {
                path: shown(raw),
                errno,
            },
        })?;
    }
    Ok(cur)
}

fn is_dir_at(dir: &OwnedFd, name: &OsStr) -> bool {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
}

/// Removes whatever is at `name` in `dir` (a later entry replaces an
/// earlier one), a directory with all it holds, never through a link.
fn remove_at(dir: &OwnedFd, name: &OsStr, raw: &[u8]) -> Result<(), UnpackError> {
    let w = |errno| UnpackError::Write {
        path: shown(raw),
        errno,
    };
    match rustix::fs::unlinkat(dir, name, AtFlags::empty()) {
        Ok(()) | Err(Errno::NOENT) => Ok(()),
        Err(Errno::ISDIR) => {
            remove_tree(dir, name, 0).map_err(w)?;
            Ok(())
        }
        Err(e) => Err(w(e)),
    }
}

fn remove_tree(parent: &OwnedFd, name: &OsStr, depth: usize) -> rustix::io::Result<()> {
    if depth > MAX_DEPTH {
        return Err(Errno::LOOP);
    }
    let dir = rustix::fs::openat2(
        parent,
        name,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        STRICT,
    )?;
    let mut names = Vec::new();
    for e in rustix::fs::Dir::read_from(&dir)? {
        let e = e?;
        let n = e.file_name().to_bytes();
        if n != b"." && n != b".." {
            names.push((n.to_vec(), e.file_type()));
        }
    }
    for (n, t) in names {
        let n = OsStr::from_bytes(&n);
        if t == FileType::Directory {
            remove_tree(&dir, n, depth + 1)?;
        } else {
            rustix::fs::unlinkat(&dir, n, AtFlags::empty())?;
        }
    }
    rustix::fs::unlinkat(parent, name, AtFlags::REMOVEDIR)
}
