//! Reading the workspace's entries: by descriptor, beneath the root,
//! never through a link; a regular file is measured first and opened only
//! when the stat cache cannot vouch for it.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;

use cordon_tools::walk::open_file_at;
use rustix::fs::{AtFlags, FileType};

use super::stream::{EXECUTABLE, FILE, SYMLINK};

/// What reading one entry found.
pub(super) struct FileStat {
    pub size: u64,
    pub mtime: (i64, i64),
    pub ctime: (i64, i64),
    pub ino: u64,
    pub mode: u32,
    /// The open file, to read if the cache misses.
    file: Option<std::fs::File>,
}

impl FileStat {
    fn of(st: &rustix::fs::Stat, size: u64, file: Option<std::fs::File>) -> FileStat {
        FileStat {
            size,
            mtime: (st.st_mtime, st.st_mtime_nsec as i64),
            ctime: (st.st_ctime, st.st_ctime_nsec as i64),
            ino: st.st_ino,
            mode: st.st_mode,
            file,
        }
    }

    pub fn read(&mut self) -> Result<Vec<u8>, ()> {
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

/// A file measured, or why it is not taken.
pub(super) enum Entry {
    TooLarge(u64),
    /// Stat, and the content when it had to be read already (a link).
    Ready(FileStat, Option<Vec<u8>>),
}

/// A tracked path's mode and content, if it is still a regular file or a
/// link: opened relative to `root`, beneath it, through no link on the way
/// (a link at the end is read as a link).
pub(super) fn read_tracked(
    root: &std::os::fd::OwnedFd,
    path: &[u8],
    max: u64,
) -> Option<(u32, Vec<u8>)> {
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
pub(super) fn stat_file(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &OsStr,
    max: u64,
) -> Result<Entry, ()> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|_| ())?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(());
    }
    let size = st.st_size as u64;
    if size > max {
        return Ok(Entry::TooLarge(size));
    }
    Ok(Entry::Ready(FileStat::of(&st, size, None), None))
}

/// Opens a regular file (beneath, never through a link) and stats what
/// was opened: the stat kept is that of the bytes read.
pub(super) fn read_file(
    dir: std::os::fd::BorrowedFd<'_>,
    name: &OsStr,
    max: u64,
) -> Result<Entry, ()> {
    let (file, size) = open_file_at(dir, name).map_err(|_| ())?;
    if size > max {
        return Ok(Entry::TooLarge(size));
    }
    let st = rustix::fs::fstat(&file).map_err(|_| ())?;
    Ok(Entry::Ready(FileStat::of(&st, size, Some(file)), None))
}

pub(super) fn read_link(dir: std::os::fd::BorrowedFd<'_>, name: &OsStr) -> Result<Entry, ()> {
    let st = rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW).map_err(|_| ())?;
    if FileType::from_raw_mode(st.st_mode) != FileType::Symlink {
        return Err(());
    }
    let target = rustix::fs::readlinkat(dir, name, Vec::new()).map_err(|_| ())?;
    let target = target.into_bytes();
    Ok(Entry::Ready(
        FileStat::of(&st, target.len() as u64, None),
        Some(target),
    ))
}
