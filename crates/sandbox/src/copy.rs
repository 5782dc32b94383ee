//! Copying a hostile tree on the host: a stopped sandbox's workspace into
//! its fork's, the two taken at one instant (the fork of a microVM from
//! its memory must see the files its memory saw).
//!
//! The rules:
//!
//! - Descriptor-relative on both sides: every source directory is opened
//!   with `openat(O_NOFOLLOW | O_DIRECTORY)` from its parent's descriptor,
//!   every entry of the copy made with an `*at` call in a directory the
//!   copy made (`mkdirat`, `O_CREAT | O_EXCL`), so that no name is ever
//!   resolved through a link, on either side.
//! - A symbolic link is made again with the same target text, never
//!   followed; devices, FIFOs and sockets are left out (and counted); no
//!   other file system (a mount point) is entered; hard links become
//!   separate files.
//! - A file's data is cloned where the file system can (`FICLONE`),
//!   else copied by the kernel, its holes kept; its permission bits come
//!   along but set-user-ID and set-group-ID, and so do its modification
//!   time and, when cordon is root, its owner.
//! - The source must not change meanwhile (its sandbox is stopped); if it
//!   does, a file may be copied torn, but nothing lands outside the copy.
//! - Depth is bounded: a deeper tree is refused, not walked. So is size:
//!   the copy stops once it takes more than its budget (hard links, which
//!   count once in a sandbox's budget, are copied once each, and would
//!   otherwise multiply what one fork costs the host's disk).

use std::ffi::CString;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, Timestamps};

/// Directory levels copied at most: each holds two descriptors open.
pub const MAX_DEPTH: usize = 256;

/// What a copy left out.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Copied {
    pub files: u64,
    pub dirs: u64,
    pub links: u64,
    /// Devices, FIFOs and sockets, which are not copied.
    pub skipped: u64,
}

/// Copies what is in the directory `from` (hostile) into `to`, an empty
/// directory of the caller's (a fork's new workspace), which then takes
/// `from`'s bits, owner and times; at most `budget` bytes of files (as
/// allocated on disk), if given. On failure the partial copy is the
/// caller's to remove.
pub fn copy_tree(from: &Path, to: &Path, budget: Option<u64>) -> std::io::Result<Copied> {
    let src = rustix::fs::open(from, dir_flags(), Mode::empty())?;
    let st = rustix::fs::fstat(&src)?;
    let dst = rustix::fs::open(to, dir_flags(), Mode::empty())?;
    let mut listing = rustix::fs::Dir::read_from(&dst)?;
    while let Some(entry) = listing.read() {
        if !matches!(entry?.file_name().to_bytes(), b"." | b"..") {
            return Err(std::io::Error::new(
                std::io::ErrorKind::AlreadyExists,
                format!("{} is not empty", to.display()),
            ));
        }
    }
    let mut c = Copier {
        dev: st.st_dev,
        root: rustix::process::geteuid().is_root(),
        done: Copied::default(),
        left: budget.unwrap_or(u64::MAX),
    };
    c.dir(&src, &dst, 0)?;
    c.finish_dir(&st, &dst)?;
    Ok(c.done)
}

fn dir_flags() -> OFlags {
    OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY
}

struct Copier {
    /// The source's file system: nothing on another is entered.
    dev: u64,
    /// Whether owners can be given back.
    root: bool,
    done: Copied,
    /// Bytes the copy may still take.
    left: u64,
}

impl Copier {
    fn dir(&mut self, src: &OwnedFd, dst: &OwnedFd, depth: usize) -> std::io::Result<()> {
        if depth >= MAX_DEPTH {
            return Err(std::io::Error::other(format!(
                "deeper than {MAX_DEPTH} directories"
            )));
        }
        let mut names: Vec<CString> = Vec::new();
        let mut dir = rustix::fs::Dir::read_from(src)?;
        while let Some(entry) = dir.read() {
            let entry = entry?;
            let name = entry.file_name();
            if name.to_bytes() == b"." || name.to_bytes() == b".." {
                continue;
            }
            names.push(name.to_owned());
        }
        for name in names {
            let st = match rustix::fs::statat(src, &name, AtFlags::SYMLINK_NOFOLLOW) {
                Ok(st) => st,
                // Gone since it was listed: nothing to copy.
                Err(rustix::io::Errno::NOENT) => continue,
                Err(e) => return Err(e.into()),
            };
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory if st.st_dev == self.dev => {
                    let from = rustix::fs::openat(src, &name, dir_flags(), Mode::empty())?;
                    rustix::fs::mkdirat(dst, &name, Mode::from_raw_mode(0o700))?;
                    let to = rustix::fs::openat(dst, &name, dir_flags(), Mode::empty())?;
                    self.dir(&from, &to, depth + 1)?;
                    self.finish_dir(&st, &to)?;
                    self.done.dirs += 1;
                }
                FileType::RegularFile if st.st_dev == self.dev => {
                    self.file(src, dst, &name)?;
                    self.done.files += 1;
                }
                FileType::Symlink => {
                    let target = rustix::fs::readlinkat(src, &name, Vec::new())?;
                    rustix::fs::symlinkat(&target, dst, &name)?;
                    self.done.links += 1;
                }
                // A mount point, a device, a FIFO, a socket.
                _ => self.done.skipped += 1,
            }
        }
        Ok(())
    }

    /// A directory's bits, owner and time, once its entries are in.
    fn finish_dir(&self, st: &rustix::fs::Stat, dst: &OwnedFd) -> std::io::Result<()> {
        self.own(st, dst)?;
        rustix::fs::fchmod(dst, Mode::from_raw_mode(st.st_mode & 0o1777))?;
        times(st, dst)
    }

    fn file(&mut self, src: &OwnedFd, dst: &OwnedFd, name: &CString) -> std::io::Result<()> {
        let from = rustix::fs::openat(
            src,
            name,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
            Mode::empty(),
        )?;
        // Swapped for something else since it was looked at: left out.
        let now = rustix::fs::fstat(&from)?;
        if FileType::from_raw_mode(now.st_mode) != FileType::RegularFile {
            self.done.skipped += 1;
            return Ok(());
        }
        let takes = (now.st_blocks as u64).saturating_mul(512);
        self.left = self.left.checked_sub(takes).ok_or_else(|| {
            std::io::Error::new(
                std::io::ErrorKind::StorageFull,
                "the copy takes more than its disk budget",
            )
        })?;
        let to = rustix::fs::openat(
            dst,
            name,
            OFlags::WRONLY | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(0o600),
        )?;
        if rustix::fs::ioctl_ficlone(&to, &from).is_err() {
            let size = now.st_size.max(0) as u64;
            let (from, to) = (File::from(from), File::from(to));
            to.set_len(size)?;
            crate::sparse::copy(&from, &to, size)?;
            return self.finish_file(&now, to.into());
        }
        self.finish_file(&now, to)
    }

    fn finish_file(&self, st: &rustix::fs::Stat, to: OwnedFd) -> std::io::Result<()> {
        self.own(st, &to)?;
        // Never a set-id bit: the copy is the host's file too.
        rustix::fs::fchmod(&to, Mode::from_raw_mode(st.st_mode & 0o1777))?;
        times(st, &to)
    }

    fn own(&self, st: &rustix::fs::Stat, fd: &impl AsFd) -> std::io::Result<()> {
        if self.root {
            rustix::fs::fchown(
                fd,
                Some(rustix::fs::Uid::from_raw(st.st_uid)),
                Some(rustix::fs::Gid::from_raw(st.st_gid)),
            )?;
        }
        Ok(())
    }
}

/// `st`'s modification time (and access time) on `fd`.
fn times(st: &rustix::fs::Stat, fd: &impl AsFd) -> std::io::Result<()> {
    let at = |s: i64, ns: u64| rustix::fs::Timespec {
        tv_sec: s,
        tv_nsec: ns as _,
    };
    rustix::fs::futimens(
        fd,
        &Timestamps {
            last_access: at(st.st_atime, st.st_atime_nsec),
            last_modification: at(st.st_mtime, st.st_mtime_nsec),
        },
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::{MetadataExt, PermissionsExt};

    /// What a hostile workspace holds reaches the copy as what it is:
    /// files and directories with their bits and times, links as links
    /// (one out of the tree, one to a directory out of it, neither
    /// followed), no set-id bit, no FIFO (which would block a reader), a
    /// tree too deep refused.
    #[test]
    fn a_hostile_tree_is_copied_as_it_is_and_nothing_is_followed() {
        let tmp = tempfile::tempdir().unwrap();
        let (from, to) = (tmp.path().join("from"), tmp.path().join("to"));
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(from.join("a/b")).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::write(outside.join("secret"), "host's").unwrap();
        std::fs::write(from.join("a/b/f"), "data").unwrap();
        std::fs::set_permissions(from.join("a/b/f"), std::fs::Permissions::from_mode(0o4755))
            .unwrap();
        let sparse = std::fs::File::create(from.join("sparse")).unwrap();
        sparse.set_len(64 << 20).unwrap();
        std::os::unix::fs::symlink(outside.join("secret"), from.join("to-secret")).unwrap();
        std::os::unix::fs::symlink(&outside, from.join("a/to-dir")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            from.join("fifo"),
            FileType::Fifo,
            Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        let old = std::time::SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_000_000);
        std::fs::File::options()
            .write(true)
            .open(from.join("a/b/f"))
            .unwrap()
            .set_modified(old)
            .unwrap();

        std::fs::create_dir(&to).unwrap();
        let done = copy_tree(&from, &to, None).unwrap();
        assert_eq!(
            (done.files, done.dirs, done.links, done.skipped),
            (2, 2, 2, 1),
            "{done:?}"
        );
        assert_eq!(std::fs::read_to_string(to.join("a/b/f")).unwrap(), "data");
        let f = std::fs::metadata(to.join("a/b/f")).unwrap();
        assert_eq!(f.mode() & 0o7777, 0o755, "a set-id bit came along");
        assert_eq!(f.modified().unwrap(), old);
        assert_eq!(
            std::fs::read_link(to.join("to-secret")).unwrap(),
            outside.join("secret")
        );
        assert!(
            std::fs::symlink_metadata(to.join("a/to-dir"))
                .unwrap()
                .file_type()
                .is_symlink()
        );
        assert!(!to.join("fifo").exists());
        let s = std::fs::metadata(to.join("sparse")).unwrap();
        assert_eq!(
            (s.len(), s.blocks()),
            (64 << 20, 0),
            "its holes were filled"
        );
        assert_eq!(
            std::fs::read_to_string(outside.join("secret")).unwrap(),
            "host's"
        );

        // A target with anything in it is refused, not merged into.
        assert!(copy_tree(&from, &to, None).is_err());

        // A file linked a hundred times counts a hundred times.
        let links = tmp.path().join("links");
        std::fs::create_dir(&links).unwrap();
        std::fs::write(links.join("big"), vec![7u8; 1 << 20]).unwrap();
        for i in 0..100 {
            std::fs::hard_link(links.join("big"), links.join(format!("l{i}"))).unwrap();
        }
        let into = tmp.path().join("links-copy");
        std::fs::create_dir(&into).unwrap();
        let err = copy_tree(&links, &into, Some(10 << 20)).unwrap_err();
        assert_eq!(err.kind(), std::io::ErrorKind::StorageFull, "{err}");

        let deep = tmp.path().join("deep");
        let mut p = deep.clone();
        for _ in 0..=MAX_DEPTH {
            p.push("d");
        }
        std::fs::create_dir_all(&p).unwrap();
        std::fs::create_dir(tmp.path().join("deep-copy")).unwrap();
        let err = copy_tree(&deep, &tmp.path().join("deep-copy"), None).unwrap_err();
        assert!(err.to_string().contains("deeper than"), "{err}");
    }
}
