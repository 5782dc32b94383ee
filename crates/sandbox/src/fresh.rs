//! Fresh ext4 images kept in memory, so that the next image of the same
//! kind is a copy rather than made again.
//!
//! A workspace's volume is `mkfs.ext4`, the file system's first mount and
//! its balloon's allocation (~35 ms); a writable layer's disk is `mke2fs`
//! (~6-10 ms). What either writes is a few hundred KiB in a sparse image of
//! GiBs. So the first image of a kind (its [`Key`]: size and label) is made
//! that way and, before any user could write to it, its data is read (the
//! ranges `SEEK_DATA` finds, [`crate::sparse::extents`]); the next is that
//! data written at the same offsets of a new sparse file of the same size,
//! its superblocks (the primary and each backup) given a UUID of its own
//! as they are written: the file systems are made with their checksums
//! seeded apart from the UUID (`metadata_csum_seed`), so a superblock's own
//! checksum is all else that changes, as with `EXT4_IOC_SETFSUUID` on a
//! mounted one.
//!
//! Rules: a template is read only of an image this process made, before
//! anything but cordon wrote to it; a few are kept, and none holding more
//! than [`MAX_DATA`].

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;

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

    /// Writes the template into `image`, a new empty file of its length,
    /// as a file system of its own: a new random UUID in every superblock.
    pub(crate) fn write_to(&self, image: &File) -> io::Result<()> {
        let uuid = random_uuid()?;
        for (at, bytes) in &self.data {
            image.write_all_at(bytes, *at)?;
        }
        for (at, superblock) in self.superblocks()? {
            image.write_all_at(&superblock::with_uuid(superblock, &uuid), at)?;
        }
        Ok(())
    }

    /// The template's ext4 superblocks with their offsets: the primary
    /// (at 1 KiB) and the backups at the start of block groups, each found
    /// where its group says it is (its magic and group number).
    fn superblocks(&self) -> io::Result<Vec<(u64, &[u8])>> {
        let at = |offset: u64| {
            self.data.iter().find_map(|(start, bytes)| {
                let i = usize::try_from(offset.checked_sub(*start)?).ok()?;
                bytes.get(i..i + superblock::LEN)
            })
        };
        let primary = at(superblock::PRIMARY)
            .filter(|sb| superblock::is_one(sb, 0))
            .ok_or_else(|| io::Error::other("the template has no ext4 superblock"))?;
        let group = superblock::group_bytes(primary)
            .ok_or_else(|| io::Error::other("the template's superblock is not one cordon makes"))?;
        let mut found = vec![(superblock::PRIMARY, primary)];
        for g in 1..self.key.len.div_ceil(group) {
            if let Some(sb) = at(g * group).filter(|sb| superblock::is_one(sb, g)) {
                found.push((g * group, sb));
            }
        }
        Ok(found)
    }
}

#[cfg(test)]
impl Template {
    /// Whether `other` holds the same bytes as this but for the UUID and
    /// checksum of each superblock.
    pub(crate) fn same_but_uuids(&self, other: &Template) -> bool {
        let blank = |t: &Template| {
            let mut data = t.data.clone();
            for (at, _) in t.superblocks().unwrap() {
                let (start, bytes) = data
                    .iter_mut()
                    .find(|(start, b)| (*start..*start + b.len() as u64).contains(&at))
                    .unwrap();
                let i = (at - *start) as usize;
                let blank = superblock::with_uuid(&bytes[i..i + superblock::LEN], &[0; 16]);
                bytes[i..i + superblock::LEN].copy_from_slice(&blank);
            }
            data
        };
        self.key == other.key && blank(self) == blank(other)
    }
}

/// A new random UUID (version 4, variant 1: RFC 9562).
fn random_uuid() -> io::Result<[u8; 16]> {
    let mut uuid = [0; 16];
    rustix::rand::getrandom(&mut uuid, rustix::rand::GetRandomFlags::empty())?;
    uuid[6] = (uuid[6] & 0x0f) | 0x40;
    uuid[8] = (uuid[8] & 0x3f) | 0x80;
    Ok(uuid)
}

/// The few fields of ext4's `struct ext4_super_block` a copy changes or
/// reads to find the backups (offsets from linux/fs/ext4/ext4.h).
mod superblock {
    /// Where the primary superblock is in the image.
    pub(super) const PRIMARY: u64 = 1024;
    /// A superblock's size.
    pub(super) const LEN: usize = 1024;
    const LOG_BLOCK_SIZE: usize = 0x18;
    const BLOCKS_PER_GROUP: usize = 0x20;
    const MAGIC: usize = 0x38;
    const BLOCK_GROUP_NR: usize = 0x5A;
    const FEATURE_INCOMPAT: usize = 0x60;
    const FEATURE_RO_COMPAT: usize = 0x64;
    const UUID: usize = 0x68;
    const CHECKSUM: usize = 0x3FC;
    const EXT4_MAGIC: u16 = 0xEF53;
    const RO_COMPAT_METADATA_CSUM: u32 = 0x400;
    const INCOMPAT_CSUM_SEED: u32 = 0x2000;

    fn u16_at(sb: &[u8], at: usize) -> u16 {
        u16::from_le_bytes([sb[at], sb[at + 1]])
    }

    fn u32_at(sb: &[u8], at: usize) -> u32 {
        u32::from_le_bytes([sb[at], sb[at + 1], sb[at + 2], sb[at + 3]])
    }

    /// Whether `sb` is group `group`'s superblock.
    pub(super) fn is_one(sb: &[u8], group: u64) -> bool {
        u16_at(sb, MAGIC) == EXT4_MAGIC && u64::from(u16_at(sb, BLOCK_GROUP_NR)) == group
    }

    /// Bytes per block group; `None` unless the checksums are seeded
    /// apart from the UUID (what makes a new UUID change nothing else)
    /// and the sizes are sane.
    pub(super) fn group_bytes(sb: &[u8]) -> Option<u64> {
        let csum = u32_at(sb, FEATURE_RO_COMPAT) & RO_COMPAT_METADATA_CSUM != 0;
        let seeded = u32_at(sb, FEATURE_INCOMPAT) & INCOMPAT_CSUM_SEED != 0;
        if csum && !seeded {
            return None;
        }
        let block = 1024u64
            .checked_shl(u32_at(sb, LOG_BLOCK_SIZE))
            .filter(|b| *b <= 65536)?;
        let blocks = u64::from(u32_at(sb, BLOCKS_PER_GROUP));
        (blocks > 0 && block > 1024).then_some(block * blocks)
    }

    /// `sb` with `uuid`, and its checksum made again (crc32c of what
    /// precedes it, ext4's way: seed !0, no final inversion).
    pub(super) fn with_uuid(sb: &[u8], uuid: &[u8; 16]) -> Vec<u8> {
        let mut out = sb.to_vec();
        out[UUID..UUID + 16].copy_from_slice(uuid);
        if u32_at(&out, FEATURE_RO_COMPAT) & RO_COMPAT_METADATA_CSUM != 0 {
            let crc32c = crc::Crc::<u32>::new(&crc::CRC_32_ISCSI);
            let sum = !crc32c.checksum(&out[..CHECKSUM]);
            out[CHECKSUM..CHECKSUM + 4].copy_from_slice(&sum.to_le_bytes());
        }
        out
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
