//! Copying a file's data and not its holes: a guest's memory into a
//! memfd, a microVM's writable disk (sparse, as big as its disk budget)
//! into its forks'. Only bytes move: nothing of what they hold is read.

use std::fs::File;
use std::path::Path;

use rustix::fs::SeekFrom;
use rustix::io::Errno;

/// How much is copied by one call.
const CHUNK: usize = 16 << 20;

/// The ranges of `file`'s first `size` bytes that hold data (not holes),
/// in order.
pub(crate) fn extents(file: &File, size: u64) -> std::io::Result<Vec<(u64, u64)>> {
    let mut found = Vec::new();
    let mut pos = 0;
    while pos < size {
        let data = match rustix::fs::seek(file, SeekFrom::Data(pos)) {
            Ok(at) => at,
            // No data after `pos`: the rest is a hole.
            Err(Errno::NXIO) => break,
            Err(e) => return Err(e.into()),
        };
        let end = rustix::fs::seek(file, SeekFrom::Hole(data))?.min(size);
        if data >= end {
            break;
        }
        found.push((data, end));
        pos = end;
    }
    Ok(found)
}

/// Copies the data of `from`'s first `size` bytes to the same offsets of
/// `to`, which reads zero elsewhere (a new file or memfd of that size):
/// the holes stay holes.
pub(crate) fn copy(from: &File, to: &File, size: u64) -> std::io::Result<()> {
    for (mut at, end) in extents(from, size)? {
        rustix::fs::seek(to, SeekFrom::Start(at))?;
        while at < end {
            let want = ((end - at) as usize).min(CHUNK);
            let n = rustix::fs::sendfile(to, from, Some(&mut at), want)?;
            if n == 0 {
                return Err(std::io::ErrorKind::UnexpectedEof.into());
            }
        }
    }
    Ok(())
}

/// A sparse copy of the file `from` as the new file `to` (mode 0600), on
/// the disk when this returns. `from` is cordon's own file (a microVM's
/// disk, in the store): a guest wrote its content, not its name, and a
/// link there is refused.
pub(crate) fn copy_file(from: &Path, to: &Path) -> std::io::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    let from = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(from)?;
    let size = from.metadata()?.len();
    let out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(to)?;
    out.set_len(size)?;
    copy(&from, &out, size)?;
    out.sync_all()
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::{FileExt, MetadataExt};

    use super::*;

    #[test]
    fn a_copy_keeps_the_data_and_the_holes() {
        let dir = tempfile::tempdir().unwrap();
        let size = 64 << 20;
        let from = File::create_new(dir.path().join("from")).unwrap();
        from.set_len(size).unwrap();
        from.write_all_at(b"first", 0).unwrap();
        from.write_all_at(&vec![7u8; 3 << 20], 20 << 20).unwrap();
        from.write_all_at(b"last", size - 4).unwrap();
        let to = File::create_new(dir.path().join("to")).unwrap();
        to.set_len(size).unwrap();
        copy(&from, &to, size).unwrap();
        let (mut a, mut b) = (vec![0u8; size as usize], vec![0u8; size as usize]);
        from.read_exact_at(&mut a, 0).unwrap();
        to.read_exact_at(&mut b, 0).unwrap();
        assert!(a == b, "the copy differs");
        // A few MiB of blocks, not 64.
        let blocks = to.metadata().unwrap().blocks() * 512;
        assert!(blocks < 8 << 20, "the holes were filled: {blocks} bytes");
    }
}
