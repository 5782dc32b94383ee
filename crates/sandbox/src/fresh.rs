//! Fresh ext4 images kept in memory, so that the next image of the same
//! kind is a copy rather than made again.
//!
//! A workspace's volume is `mkfs.ext4`, the file system's first mount and
//! its balloon's allocation (~35 ms); a writable layer's disk is `mke2fs`
//! (~6-10 ms). What either writes is a few hundred KiB in a sparse image of
//! GiBs. So the first image of a kind (its [`Key`]: size and label) is made
//! that way and, before any user could write to it, its data is read (the
//! ranges `SEEK_DATA` finds, [`crate::sparse::extents`]); the next is that
//! data written at the same offsets of a new sparse file of the same size.
//! Once mounted, a copy gets a UUID of its own ([`set_uuid`]): the file
//! systems are made with their checksums seeded apart from the UUID
//! (`metadata_csum_seed`), so changing it rewrites nothing else.
//!
//! Rules: a template is read only of an image this process made, before
//! anything but cordon wrote to it; a few are kept, and none holding more
//! than [`MAX_DATA`].

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use rustix::ioctl::{Opcode, Setter};

/// The most data a template may hold: a fresh volume holds well under a
/// MiB; more means something unexpected was written, so it is not kept.
const MAX_DATA: u64 = 16 << 20;
/// The most templates kept (one per kind; budgets past 2 GiB make larger
/// volumes, and each budget a layer's disk of its size).
const MAX_KEPT: usize = 8;

/// What a template is a fresh image of: its size, and the label that
/// names how it was made (a volume, a layer's disk).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Key {
    pub len: u64,
    pub label: &'static str,
}

/// A fresh image: what it is, and the ranges that hold data.
#[cfg_attr(test, derive(PartialEq))]
pub(crate) struct Template {
    key: Key,
    data: Vec<(u64, Vec<u8>)>,
}

impl Template {
    /// Reads `image`, a fresh `label` file system, unmounted; `None` if
    /// it holds more than [`MAX_DATA`].
    pub(crate) fn read(image: &File, label: &'static str) -> io::Result<Option<Template>> {
        let len = image.metadata()?.len();
        let extents = crate::sparse::extents(image, len)?;
        if extents.iter().map(|(start, end)| end - start).sum::<u64>() > MAX_DATA {
            return Ok(None);
        }
        let mut data = Vec::with_capacity(extents.len());
        for (start, end) in extents {
            let mut bytes = vec![0; (end - start) as usize];
            image.read_exact_at(&mut bytes, start)?;
            data.push((start, bytes));
        }
        Ok(Some(Template {
            key: Key { len, label },
            data,
        }))
    }

    /// Writes the template into `image`, a new empty file of its length.
    pub(crate) fn write_to(&self, image: &File) -> io::Result<()> {
        for (at, bytes) in &self.data {
            image.write_all_at(bytes, *at)?;
        }
        Ok(())
    }
}

/// The templates kept, the most recently made last.
#[derive(Default)]
pub(crate) struct Templates(Vec<Template>);

impl Templates {
    pub(crate) const fn new() -> Templates {
        Templates(Vec::new())
    }

    /// The template of `key`, if one is kept.
    pub(crate) fn of(&self, key: &Key) -> Option<&Template> {
        self.0.iter().find(|t| t.key == *key)
    }

    pub(crate) fn keep(&mut self, template: Template) {
        self.0.retain(|t| t.key != template.key);
        if self.0.len() == MAX_KEPT {
            self.0.remove(0);
        }
        self.0.push(template);
    }
}

/// `EXT4_IOC_SETFSUUID` (linux/ext4.h): `_IOW('f', 44, struct fsuuid)`,
/// whose size leaves out the UUID that follows it.
const EXT4_IOC_SETFSUUID: Opcode = rustix::ioctl::opcode::write::<[u32; 2]>(b'f', 44);

/// `struct fsuuid` with the UUID it carries.
#[repr(C)]
struct FsUuid {
    len: u32,
    flags: u32,
    uuid: [u8; 16],
}

/// Gives the mounted ext4 file system that `on` (a directory on it) is on
/// a new random UUID, so that copies of one template are told apart.
pub(crate) fn set_uuid(on: impl AsFd) -> io::Result<()> {
    let mut uuid = [0; 16];
    rustix::rand::getrandom(&mut uuid, rustix::rand::GetRandomFlags::empty())?;
    // Version 4, variant 1 (RFC 9562).
    uuid[6] = (uuid[6] & 0x0f) | 0x40;
    uuid[8] = (uuid[8] & 0x3f) | 0x80;
    let arg = FsUuid {
        len: 16,
        flags: 0,
        uuid,
    };
    // SAFETY: EXT4_IOC_SETFSUUID reads a `struct fsuuid` followed by
    // `len` bytes of UUID, which `FsUuid` lays out.
    unsafe { rustix::ioctl::ioctl(on.as_fd(), Setter::<EXT4_IOC_SETFSUUID, FsUuid>::new(arg)) }
        .map_err(Into::into)
}

/// Asserts that the unmounted ext4 `image` is sound: `e2fsck -f -n` finds
/// nothing to mend (and, with `-n`, changes nothing).
#[cfg(test)]
pub(crate) fn assert_sound(image: &std::path::Path) {
    let fsck = std::process::Command::new("e2fsck")
        .args(["-f", "-n"])
        .arg(image)
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output()
        .unwrap();
    assert!(
        fsck.status.success(),
        "{}: {}{}",
        image.display(),
        String::from_utf8_lossy(&fsck.stdout),
        String::from_utf8_lossy(&fsck.stderr)
    );
}
