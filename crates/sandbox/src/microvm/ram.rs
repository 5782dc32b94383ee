//! A guest's memory as a file QEMU maps, so that a snapshot's memory is
//! mapped at a start instead of read through QEMU's migration stream.
//!
//! The rules:
//!
//! - A guest booted to be saved runs on a fresh memfd QEMU maps shared
//!   ([`fresh`]): what the guest writes is in the memfd, and QEMU saves
//!   only its devices (`x-ignore-shared`). cordon copies the memfd to the
//!   snapshot's `ram` file while the guest is stopped, skipping the pages
//!   that hold only zeros.
//! - A start from the snapshot maps a sealed memfd with the file's bytes
//!   privately ([`Sealed`]): each guest's writes go to pages of its own,
//!   and the pages it only reads are the same pages for every guest.
//! - The sealed memfd is what QEMU is given, never the file: QEMU 7.2 opens
//!   a memory file read-write even to map it privately, and a QEMU taken
//!   over by its guest could then write the next tenants' memory. Sealed
//!   (`F_SEAL_WRITE`, `F_SEAL_SHRINK`, `F_SEAL_GROW`, `F_SEAL_SEAL`), a
//!   memfd refuses every write, resize and shared writable mapping, to its
//!   creator too; a private mapping's writes never reach it.
//! - One process keeps the last [`CACHED`] sealed memfds it made, so
//!   that a server starting many guests of one shape reads the file once.
//! - A guest whose share servers map its memory runs on a copy of its own
//!   ([`Sealed::copy_for_sharing`]). A process that has started a shape
//!   twice makes the next one's copy ahead, once the current one is done:
//!   one spare, of the shape started last, so a server pays the copy off
//!   its starts' path and a one-shot `cordon run` never pays for a spare.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::{Arc, Mutex};

use rustix::fs::{MemfdFlags, SealFlags};

/// Sealed memfds kept per process, those used last: each holds the
/// non-zero part of one snapshot's memory (tens of MiB).
const CACHED: usize = 4;

/// Pages compared with zero to leave them out of a copy.
const PAGE: usize = 4096;

/// How much is copied at a time.
const CHUNK: usize = 1 << 20;

/// A memfd of `size` bytes, all zero, for a guest to run on.
pub(super) fn fresh(size: u64) -> std::io::Result<OwnedFd> {
    let fd = rustix::fs::memfd_create("cordon-guest-ram", MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, size)?;
    Ok(fd)
}

/// Copies the first `size` bytes of `from` to `to`, leaving out the
/// holes and the pages that hold only zeros (`to` reads zero there, as a
/// new file or memfd does): a guest's memory, to a snapshot.
pub(super) fn copy_nonzero(from: &File, to: &File, size: u64) -> std::io::Result<()> {
    let mut buf = vec![0u8; CHUNK];
    for (mut at, end) in crate::sparse::extents(from, size)? {
        while at < end {
            let want = ((end - at) as usize).min(CHUNK);
            let chunk = &mut buf[..want];
            from.read_exact_at(chunk, at)?;
            for (i, page) in chunk.chunks(PAGE).enumerate() {
                if page.iter().any(|&b| b != 0) {
                    to.write_all_at(page, at + (i * PAGE) as u64)?;
                }
            }
            at += want as u64;
        }
    }
    Ok(())
}

/// A snapshot's memory in a sealed memfd, to be mapped privately.
#[derive(Clone)]
pub(super) struct Sealed {
    fd: Arc<OwnedFd>,
    key: Key,
    /// Guests started from it by this process.
    uses: Arc<std::sync::atomic::AtomicUsize>,
}

impl Sealed {
    /// A descriptor of it for a QEMU.
    pub(super) fn for_qemu(&self) -> std::io::Result<OwnedFd> {
        self.fd.as_fd().try_clone_to_owned()
    }

    /// The memory in the snapshot file `path`, which must be `size` bytes
    /// long: from this process's cache if it read that same file before.
    pub(super) fn load(path: &Path, size: u64) -> std::io::Result<Sealed> {
        let file = File::open(path)?;
        let meta = file.metadata()?;
        if meta.len() != size {
            return Err(std::io::Error::other(format!(
                "{}: {} bytes of memory, not the {size} the guest has",
                path.display(),
                meta.len()
            )));
        }
        // The file as it is: a snapshot removed and taken again under the
        // same name is another file.
        let key = (
            meta.dev(),
            meta.ino(),
            meta.ctime(),
            meta.ctime_nsec(),
            size,
        );
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = cache.iter().position(|(k, _)| *k == key) {
            let hit = cache.remove(i);
            let sealed = hit.1.clone();
            cache.push(hit);
            return Ok(sealed);
        }
        drop(cache);
        let fd = rustix::fs::memfd_create(
            "cordon-snapshot-ram",
            MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING,
        )?;
        rustix::fs::ftruncate(&fd, size)?;
        let memfd = File::from(fd);
        crate::sparse::copy(&file, &memfd, size)?;
        rustix::fs::fcntl_add_seals(
            &memfd,
            SealFlags::WRITE | SealFlags::SHRINK | SealFlags::GROW | SealFlags::SEAL,
        )?;
        let sealed = Sealed {
            fd: Arc::new(memfd.into()),
            key,
            uses: Arc::default(),
        };
        let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
        cache.retain(|(k, _)| *k != key);
        cache.push((key, sealed.clone()));
        if cache.len() > CACHED {
            cache.remove(0);
        }
        Ok(sealed)
    }

    /// A fresh memfd of `size` bytes (the snapshot's), for QEMU to map
    /// shared, and the thread that copies the snapshot's memory into it: a
    /// guest whose memory another process maps too (a virtio-fs server
    /// reads and writes its requests there) cannot run on a private
    /// mapping, whose pages that process would never see. QEMU may map the
    /// memfd while the copy runs (it reads none of the guest's memory
    /// until it loads the devices), so the copy, tens of milliseconds,
    /// overlaps QEMU's own start; the thread must be joined before that.
    /// The spare made ahead, when there is one of this snapshot.
    pub(super) fn copy_for_sharing(&self, size: u64) -> std::io::Result<Filling> {
        let again = self.uses.fetch_add(1, std::sync::atomic::Ordering::Relaxed) > 0;
        let spare = {
            let mut slot = SPARE.lock().unwrap_or_else(|p| p.into_inner());
            match slot.take() {
                Some((key, f)) if key == self.key && f.size == size => Some(f),
                other => {
                    *slot = other;
                    None
                }
            }
        };
        let mut filling = match spare {
            Some(f) => f,
            None => self.fill(size)?,
        };
        filling.then_spare = again.then(|| self.clone());
        Ok(filling)
    }

    fn fill(&self, size: u64) -> std::io::Result<Filling> {
        let fd = fresh(size)?;
        let from = File::from(self.fd.as_fd().try_clone_to_owned()?);
        let to = File::from(fd.try_clone()?);
        let copy = std::thread::Builder::new()
            .name("cordon-guest-ram".into())
            .spawn(move || crate::sparse::copy(&from, &to, size))?;
        Ok(Filling {
            fd,
            size,
            copy,
            then_spare: None,
        })
    }

    /// Drops what this process keeps of the snapshot file `path` (one a
    /// guest could not start from).
    pub(super) fn forget(path: &Path) {
        if let Ok(meta) = std::fs::metadata(path) {
            let mut cache = CACHE.lock().unwrap_or_else(|p| p.into_inner());
            cache.retain(|(k, _)| (k.0, k.1) != (meta.dev(), meta.ino()));
            let mut spare = SPARE.lock().unwrap_or_else(|p| p.into_inner());
            if spare
                .as_ref()
                .is_some_and(|(k, _)| (k.0, k.1) == (meta.dev(), meta.ino()))
            {
                *spare = None;
            }
        }
    }
}

/// A memfd being filled with a snapshot's memory ([`Sealed::copy_for_sharing`]).
pub(super) struct Filling {
    pub(super) fd: OwnedFd,
    size: u64,
    copy: std::thread::JoinHandle<std::io::Result<()>>,
    /// The snapshot to make the next start's copy of once this one is done.
    then_spare: Option<Sealed>,
}

impl Filling {
    /// Waits for the copy to end; then starts the spare's, if one is due.
    pub(super) fn done(self) -> std::io::Result<()> {
        let copied = self.copy.join().unwrap_or_else(|_| {
            Err(std::io::Error::other(
                "the copy of the guest's memory panicked",
            ))
        });
        if copied.is_ok()
            && let Some(sealed) = self.then_spare
            && let Ok(next) = sealed.fill(self.size)
        {
            *SPARE.lock().unwrap_or_else(|p| p.into_inner()) = Some((sealed.key, next));
        }
        copied
    }
}

/// The spare copy ([`Sealed::copy_for_sharing`]): at most one per process.
static SPARE: Mutex<Option<(Key, Filling)>> = Mutex::new(None);

type Key = (u64, u64, i64, i64, u64);

static CACHE: Mutex<Vec<(Key, Sealed)>> = Mutex::new(Vec::new());

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsRawFd;

    #[test]
    fn a_copy_leaves_out_holes_and_zero_pages() {
        let dir = tempfile::tempdir().unwrap();
        let from = File::from(fresh(64 << 20).unwrap());
        from.write_all_at(b"start", 0).unwrap();
        // A page of zeros written: data to SEEK_DATA, not to the copy.
        from.write_all_at(&[0u8; PAGE], 8 << 20).unwrap();
        from.write_all_at(b"middle", (32 << 20) + 7).unwrap();
        from.write_all_at(b"end", (64 << 20) - 3).unwrap();
        let path = dir.path().join("ram");
        let to = File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)
            .unwrap();
        to.set_len(64 << 20).unwrap();
        copy_nonzero(&from, &to, 64 << 20).unwrap();
        let on_disk = to.metadata().unwrap().blocks() * 512;
        assert!(on_disk <= 64 << 10, "{on_disk} bytes on disk");
        let mut got = [0u8; 6];
        to.read_exact_at(&mut got[..5], 0).unwrap();
        assert_eq!(&got[..5], b"start");
        to.read_exact_at(&mut got, (32 << 20) + 7).unwrap();
        assert_eq!(&got, b"middle");
        to.read_exact_at(&mut got[..3], (64 << 20) - 3).unwrap();
        assert_eq!(&got[..3], b"end");
    }

    /// A process's first start of a snapshot makes no spare; from the
    /// second on, the next copy is made ahead, used once, and holds the
    /// snapshot's memory like a copy made at the start.
    #[test]
    fn the_second_start_makes_the_third_one_s_copy_ahead() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram");
        let file = File::create(&path).unwrap();
        file.set_len(1 << 20).unwrap();
        file.write_all_at(b"kernel", 8192).unwrap();
        let sealed = Sealed::load(&path, 1 << 20).unwrap();
        let ours = || {
            SPARE
                .lock()
                .unwrap()
                .as_ref()
                .is_some_and(|(k, _)| *k == sealed.key)
        };
        let copy = || {
            let f = sealed.copy_for_sharing(1 << 20).unwrap();
            let fd = File::from(f.fd.try_clone().unwrap());
            f.done().unwrap();
            let mut got = [0u8; 6];
            fd.read_exact_at(&mut got, 8192).unwrap();
            assert_eq!(&got, b"kernel");
            // A shared copy: the guest's writes are its own.
            fd.write_all_at(b"tenant", 8192).unwrap();
        };
        copy();
        assert!(!ours(), "a spare after the first start");
        copy();
        assert!(ours(), "no spare after the second start");
        let spare = SPARE
            .lock()
            .unwrap()
            .as_ref()
            .map(|(_, f)| f.fd.as_raw_fd());
        let third = sealed.copy_for_sharing(1 << 20).unwrap();
        assert_eq!(Some(third.fd.as_raw_fd()), spare, "the spare was not used");
        assert!(!ours(), "the spare is still there to be used again");
        third.done().unwrap();
        // The tenant's write went to its own copy, not to the next one.
        let next = SPARE.lock().unwrap().take().unwrap().1;
        let fd = File::from(next.fd.try_clone().unwrap());
        next.done().unwrap();
        let mut got = [0u8; 6];
        fd.read_exact_at(&mut got, 8192).unwrap();
        assert_eq!(&got, b"kernel");
    }

    /// What a QEMU taken over by its guest could try on the memory every
    /// guest of a snapshot starts from: every write is refused, and a
    /// private mapping's writes stay its own.
    #[test]
    fn a_sealed_snapshot_cannot_be_written_through_its_descriptor() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ram");
        let file = File::create(&path).unwrap();
        file.set_len(1 << 20).unwrap();
        file.write_all_at(b"kernel", 4096).unwrap();
        let sealed = Sealed::load(&path, 1 << 20).unwrap();
        let fd = File::from(sealed.for_qemu().unwrap());
        assert!(fd.write_all_at(b"evil", 4096).is_err());
        assert!(fd.set_len(0).is_err());
        assert!(fd.set_len(2 << 20).is_err());
        // Reopened read-write by its /proc name, as QEMU opens a memory
        // file: the seals hold there too.
        let again = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
            .unwrap();
        assert!(again.write_all_at(b"evil", 4096).is_err());
        let map = |flags| {
            // SAFETY: a new mapping of 1 MiB of a descriptor we hold.
            let p = unsafe {
                libc::mmap(
                    std::ptr::null_mut(),
                    1 << 20,
                    libc::PROT_READ | libc::PROT_WRITE,
                    flags,
                    again.as_raw_fd(),
                    0,
                )
            };
            (p != libc::MAP_FAILED).then_some(p.cast::<u8>())
        };
        assert!(map(libc::MAP_SHARED).is_none(), "a shared writable mapping");
        let p = map(libc::MAP_PRIVATE).expect("a private mapping");
        // SAFETY: within the 1 MiB mapped above, unmapped after.
        unsafe {
            let page = std::slice::from_raw_parts_mut(p.add(4096), 6);
            assert_eq!(page, b"kernel");
            page.copy_from_slice(b"mine!!");
            libc::munmap(p.cast(), 1 << 20);
        }
        let mut got = [0u8; 6];
        fd.read_exact_at(&mut got, 4096).unwrap();
        assert_eq!(&got, b"kernel");
        // The same file again is the same memfd; another file is read anew.
        let twice = Sealed::load(&path, 1 << 20).unwrap();
        assert!(Arc::ptr_eq(&sealed.fd, &twice.fd));
        std::fs::remove_file(&path).unwrap();
        let file = File::create(&path).unwrap();
        file.set_len(1 << 20).unwrap();
        let other = Sealed::load(&path, 1 << 20).unwrap();
        assert!(!Arc::ptr_eq(&sealed.fd, &other.fd));
        // A file of another size is refused.
        let e = Sealed::load(&path, 2 << 20).err().unwrap();
        assert!(e.to_string().contains("not the 2097152"), "{e}");
    }
}
