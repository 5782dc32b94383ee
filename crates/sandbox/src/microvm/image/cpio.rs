//! A writer of newc ("070701") cpio archives, the format the kernel
//! unpacks as its initramfs.

use std::collections::HashSet;

use super::ImageError;

const S_IFDIR: u32 = 0o040000;
const S_IFCHR: u32 = 0o020000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

/// A newc ("070701") cpio archive, the format the kernel unpacks as its
/// initramfs. Missing parent directories are added before an entry: the
/// kernel does not create them.
#[derive(Default)]
pub(super) struct Newc {
    buf: Vec<u8>,
    names: HashSet<String>,
    ino: u32,
}

impl Newc {
    pub(super) fn dir(&mut self, name: &str) -> Result<(), ImageError> {
        self.entry(name, S_IFDIR | 0o755, (0, 0), &[])
    }

    pub(super) fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> Result<(), ImageError> {
        self.entry(name, S_IFREG | perm, (0, 0), data)
    }

    pub(super) fn char_device(
        &mut self,
        name: &str,
        perm: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), ImageError> {
        self.entry(name, S_IFCHR | perm, (major, minor), &[])
    }

    pub(super) fn symlink(&mut self, name: &str, target: &str) -> Result<(), ImageError> {
        self.entry(name, S_IFLNK | 0o777, (0, 0), target.as_bytes())
    }

    pub(super) fn entry(
        &mut self,
        name: &str,
        mode: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> Result<(), ImageError> {
        if name
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
            || name.contains('\0')
        {
            return Err(ImageError::Spec(format!("bad path {name:?} in the image")));
        }
        if self.names.contains(name) {
            return Err(ImageError::Spec(format!("{name} is in the image twice")));
        }
        for (slash, _) in name.match_indices('/') {
            let parent = &name[..slash];
            if self.names.insert(parent.to_owned()) {
                self.raw(parent, S_IFDIR | 0o755, (0, 0), &[])?;
            }
        }
        self.names.insert(name.to_owned());
        self.raw(name, mode, rdev, data)
    }

    pub(super) fn raw(
        &mut self,
        name: &str,
        mode: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> Result<(), ImageError> {
        let size = u32::try_from(data.len())
            .map_err(|_| ImageError::Spec(format!("{name} is too large for a cpio archive")))?;
        self.ino += 1;
        let nlink = if mode & 0o170000 == S_IFDIR { 2 } else { 1 };
        let name_size = name.len() as u32 + 1;
        // ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor
        // rdevminor namesize check. mtime 0 keeps the image reproducible.
        let fields = [
            self.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, name_size, 0,
        ];
        self.buf.extend_from_slice(b"070701");
        for value in fields {
            self.buf
                .extend_from_slice(format!("{value:08X}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
        Ok(())
    }

    /// Header-plus-name and data each end on a 4-byte boundary.
    pub(super) fn pad(&mut self) {
        let len = self.buf.len().next_multiple_of(4);
        self.buf.resize(len, 0);
    }

    pub(super) fn finish(mut self) -> Vec<u8> {
        self.raw("TRAILER!!!", 0, (0, 0), &[])
            .expect("the trailer is small");
        self.buf
    }
}
