//! A freshly made volume's image, kept in memory so that the next volume
//! of its size is a copy rather than made again.
//!
//! Making a volume is `mkfs.ext4`, the file system's first mount and the
//! balloon's allocation: ~35 ms, most of a job's start without a pool.
//! What that writes is a few hundred KiB of metadata in a sparse image of
//! 16 GiB. So the first volume of a size is made that way and, before any
//! user could write to it, unmounted and its data read (the ranges
//! `SEEK_DATA` finds, [`crate::sparse::extents`]); the next is that data written at the same offsets
//! of a new sparse file of the same size. Each copy then gets a UUID of
//! its own ([`set_uuid`]): the file system's checksums are seeded apart
//! from its UUID (`metadata_csum_seed`), so changing it rewrites nothing
//! else.
//!
//! Rules: a template is read only of an image this process made, unmounted,
//! before anything but cordon wrote to it; a few are kept, one per size, and
//! none holding more than [`MAX_DATA`].

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;

use rustix::ioctl::{Opcode, Setter};

/// The most data a template may hold: a fresh volume holds well under a
/// MiB; more means something unexpected was written, so it is not kept.
const MAX_DATA: u64 = 16 << 20;
/// The most templates kept (one per image size; budgets past 2 GiB make
/// larger images).
const MAX_KEPT: usize = 4;

/// A fresh volume's image: its length and the ranges that hold data.
pub(super) struct Template {
    len: u64,
    data: Vec<(u64, Vec<u8>)>,
}

impl Template {
    /// Reads `image`, whose file system is made and unmounted; `None` if
    /// it holds more than [`MAX_DATA`].
    pub(super) fn read(image: &File) -> io::Result<Option<Template>> {
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
        Ok(Some(Template { len, data }))
    }

    /// The length of the image it copies.
    pub(super) fn len(&self) -> u64 {
        self.len
    }

    /// Writes the template into `image`, a new empty file of its length.
    pub(super) fn write_to(&self, image: &File) -> io::Result<()> {
        for (at, bytes) in &self.data {
            image.write_all_at(bytes, *at)?;
        }
        Ok(())
    }
}

/// The templates kept, the most recently made last.
#[derive(Default)]
pub(super) struct Templates(Vec<Template>);

impl Templates {
    pub(super) const fn new() -> Templates {
        Templates(Vec::new())
    }

    /// The template of an image of `len` bytes, if one is kept.
    pub(super) fn of(&self, len: u64) -> Option<&Template> {
        self.0.iter().find(|t| t.len == len)
    }

    pub(super) fn keep(&mut self, template: Template) {
        self.0.retain(|t| t.len != template.len);
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
pub(super) fn set_uuid(on: &File) -> io::Result<()> {
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
