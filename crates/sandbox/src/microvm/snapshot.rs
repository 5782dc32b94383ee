//! Starting a microVM from a memory snapshot of a guest booted once.
//!
//! Under TCG most of a microVM's start is its kernel booting; a snapshot
//! is that boot done once. The rules:
//!
//! - What is saved is a guest held by its supervisor, which init started
//!   from cordon's own read-only disk (see stage.rs) once the drivers
//!   loaded: no share mounted, no disk of the sandbox's probed, no setup
//!   sent. So a snapshot holds nothing of any tenant's, 9p (whose mounted
//!   exports QEMU refuses to migrate) is no obstacle, and a start skips
//!   both the boot and the supervisor's own start (its exec and dynamic
//!   linking: a third of a second under TCG).
//! - It is keyed by everything the restored machine must share with the
//!   saved one ([`Shape`]): QEMU, the kernel and the initramfs by identity
//!   on disk, every option and device with the per-sandbox paths left out.
//!   A change to any of them is a new key, so a restore never meets a
//!   state of another machine.
//! - A snapshot is a directory: the devices' state, which QEMU writes
//!   through a descriptor, and the guest's memory (`ram`), which cordon
//!   copies from the memfd the saved guest ran on and later starts map
//!   (see `ram`). Both are written in a temporary directory renamed into
//!   place: a reader sees one whole snapshot or none. It lives in cordon's
//!   cache, where neither the guest nor QEMU can name it, and at most
//!   [`KEEP`] of them are kept.
//! - Each start sends its own entropy with the go, mixed into the kernel's
//!   pool before anything else runs: guests restored from one snapshot
//!   would otherwise draw the same random numbers. (Their kernel's address
//!   layout and boot id are the snapshot's, shared.)
//! - A restored guest that does not acknowledge its go in time is ended,
//!   its snapshot removed, and the sandbox booted cold instead.

use std::hash::Hash;
use std::io::{Read, Write};
use std::os::fd::AsFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::image::{file_stamp, hash_hex};
use super::qmp::{
    Capability, CapabilityState, Command, MigrationInfo, MigrationStatus, Qmp, StatusInfo,
};
use super::ram::{Sealed, copy_nonzero};
use crate::error::{Error, Result};

use crate::layout::{
    HOLD_ACK as ACK, HOLD_GO as GO, HOLD_READY as READY, HOLD_SEED_LEN as SEED_LEN,
};

/// Part of every key: raised when what a held guest expects changes in a
/// way the initramfs's identity would not show (3: the supervisor holds,
/// started from cordon's disk, rather than init).
const FORMAT: u32 = 3;

/// Snapshots kept in the cache; those used longest ago go first. Every
/// distinct size of machine (which a tenant of `serve` picks) has its own.
const KEEP: usize = 16;

/// How long QEMU may take to write a snapshot of a held guest (its
/// devices: the memory is copied by cordon).
const SAVE_TIMEOUT: Duration = Duration::from_secs(60);

/// The monitor's name for the descriptor the snapshot is written to.
const FD_NAME: &str = "cordon-snapshot";

/// A snapshot directory's files: the devices' state, as QEMU's migration
/// stream, and the guest's memory.
const STATE: &str = "state";
const RAM: &str = "ram";

/// A snapshot opened to start a guest from.
pub(super) struct Saved {
    pub state: std::fs::File,
    pub ram: Sealed,
}

/// What a restored machine must share with the saved one, as a key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Shape(String);

impl Shape {
    /// The shape of QEMU started as `qemu args` with `kernel`, `initrd`
    /// and cordon's disk `bin` (see stage.rs): QEMU, the kernel and the
    /// disk by identity on disk (a package upgrade replaces the first two;
    /// a held guest runs the supervisor it was saved with and has cached
    /// blocks of that very file, which a disk made again would lay out
    /// otherwise), the initramfs by its path (named by its content, and
    /// touched on each use), `args` with each share's and each disk's path
    /// left out (they differ per sandbox, and a held guest has not opened
    /// them), and the identities of the host files a guest on virtio-fs
    /// holds in its page cache (`warm`: `GUEST_WARM`).
    pub(super) fn new(
        qemu: &Path,
        kernel: &Path,
        initrd: &Path,
        bin: &Path,
        warm: &[&str],
        args: &[String],
    ) -> Result<Shape> {
        let stamp = |file: &Path| {
            std::fs::metadata(file)
                .map(|m| file_stamp(&m))
                .map_err(|e| {
                    Error::Io(std::io::Error::new(
                        e.kind(),
                        format!("{}: {e}", file.display()),
                    ))
                })
        };
        let files = [
            (qemu, stamp(qemu)?),
            (kernel, stamp(kernel)?),
            (bin, stamp(bin)?),
        ];
        // What a guest on virtio-fs has in its page cache when saved.
        let warm: Vec<_> = warm
            .iter()
            .map(|f| std::fs::metadata(f).ok().map(|m| file_stamp(&m)))
            .collect();
        Ok(Shape(hash_hex(|h| {
            FORMAT.hash(h);
            files.hash(h);
            warm.hash(h);
            initrd.hash(h);
            for arg in args {
                without_paths(arg).hash(h);
            }
        })))
    }
}

/// `arg` with the value of each `path=` and `file=` option left out.
/// Paths hold no comma (the backend refuses them), so options split on
/// commas exactly.
fn without_paths(arg: &str) -> String {
    arg.split(',')
        .map(|o| match o.split_once('=') {
            Some((k @ ("path" | "file"), _)) => format!("{k}="),
            _ => o.to_string(),
        })
        .collect::<Vec<_>>()
        .join(",")
}

/// The snapshots in a cache directory.
pub(super) struct Snapshots {
    dir: PathBuf,
}

impl Snapshots {
    pub(super) fn new(cache: &Path) -> Snapshots {
        Snapshots {
            dir: cache.join("snapshots"),
        }
    }

    fn path(&self, shape: &Shape) -> PathBuf {
        self.dir.join(&shape.0)
    }

    /// The snapshot of `shape` for a guest of `memory` bytes, opened, if
    /// one was taken; marked used, so that pruning keeps the ones in use.
    /// One whose memory cannot be read is removed.
    pub(super) fn open(&self, shape: &Shape, memory: u64) -> Option<Saved> {
        let dir = self.path(shape);
        let state = std::fs::File::open(dir.join(STATE)).ok()?;
        let _ = state.set_modified(std::time::SystemTime::now());
        match Sealed::load(&dir.join(RAM), memory) {
            Ok(ram) => Some(Saved { state, ram }),
            Err(e) => {
                tracing::warn!(error = %e, "the microVM's snapshot has no memory to start from");
                self.forget(shape);
                None
            }
        }
    }

    /// Removes the snapshot of `shape`, one a restore could not start.
    pub(super) fn forget(&self, shape: &Shape) {
        let dir = self.path(shape);
        Sealed::forget(&dir.join(RAM));
        let _ = std::fs::remove_dir_all(dir);
    }

    /// Saves the guest behind `qmp`, held by its supervisor and running on the
    /// memfd `ram` of `memory` bytes, as the snapshot of `shape`, and lets
    /// it go on. The guest is stopped meanwhile; it is continued whatever
    /// happens.
    pub(super) fn take(
        &self,
        shape: &Shape,
        qmp: &mut Qmp,
        ram: &std::os::fd::OwnedFd,
        memory: u64,
    ) -> Result<()> {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&self.dir)?;
        let taking = tempfile::Builder::new()
            .prefix(".taking-")
            .tempdir_in(&self.dir)?;
        let state = std::fs::File::create(taking.path().join(STATE))?;
        let copy = std::fs::File::create(taking.path().join(RAM))?;
        copy.set_len(memory)?;
        let saved = save_stopped(qmp, &state, ram, &copy, memory);
        let continued = cont(qmp);
        saved?;
        continued?;
        match std::fs::rename(taking.path(), self.path(shape)) {
            Ok(()) => {}
            // Another start of the same shape took it first: it serves.
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOTEMPTY | libc::EEXIST)) => {}
            Err(e) => return Err(e.into()),
        }
        self.prune();
        Ok(())
    }

    /// Keeps the [`KEEP`] snapshots used last, and no leftover of a
    /// taking that died.
    fn prune(&self) {
        let Ok(entries) = std::fs::read_dir(&self.dir) else {
            return;
        };
        let mut found: Vec<(std::time::SystemTime, PathBuf)> = Vec::new();
        for e in entries.flatten() {
            let Ok(m) = e.metadata() else { continue };
            let name = e.file_name();
            let name = name.to_string_lossy();
            let old = m.modified().ok().and_then(|t| t.elapsed().ok());
            if name.starts_with(".taking-") {
                if old.is_some_and(|age| age > SAVE_TIMEOUT * 2) {
                    let _ = std::fs::remove_dir_all(e.path());
                }
            } else if m.is_dir() {
                // Last used: its state is marked on each use.
                let used = std::fs::metadata(e.path().join(STATE))
                    .and_then(|m| m.modified())
                    .unwrap_or(std::time::UNIX_EPOCH);
                found.push((used, e.path()));
            } else if name.ends_with(".vmstate") {
                // A snapshot of the first format, one file with the memory
                // in it: no start reads it any more.
                let _ = std::fs::remove_file(e.path());
            }
        }
        found.sort_by_key(|f| std::cmp::Reverse(f.0));
        for (_, path) in found.into_iter().skip(KEEP) {
            let _ = std::fs::remove_dir_all(path);
        }
    }
}

/// Stops the guest behind `qmp`, running on the memfd `ram` of `memory`
/// bytes, and saves its devices into `state` and its memory into `copy`
/// (its non-zero pages). The guest stays stopped.
pub(super) fn save_stopped(
    qmp: &mut Qmp,
    state: &std::fs::File,
    ram: &std::os::fd::OwnedFd,
    copy: &std::fs::File,
    memory: u64,
) -> Result<()> {
    let running = std::fs::File::from(ram.try_clone()?);
    qmp.execute::<serde::de::IgnoredAny>(&Command::Stop, None)?;
    save(qmp, state)?;
    copy_nonzero(&running, copy, memory)?;
    Ok(())
}

/// Leaves the guest's memory, a file of its own, out of the stream.
fn ignore_shared(qmp: &mut Qmp) -> Result<()> {
    qmp.execute::<serde::de::IgnoredAny>(
        &Command::MigrateSetCapabilities {
            capabilities: &[CapabilityState {
                capability: Capability::XIgnoreShared,
                state: true,
            }],
        },
        None,
    )?;
    Ok(())
}

/// Migrates the stopped guest's devices into `file` and waits for QEMU to
/// finish.
fn save(qmp: &mut Qmp, file: &std::fs::File) -> Result<()> {
    ignore_shared(qmp)?;
    qmp.execute::<serde::de::IgnoredAny>(&Command::Getfd { fdname: FD_NAME }, Some(file.as_fd()))?;
    let uri = format!("fd:{FD_NAME}");
    qmp.execute::<serde::de::IgnoredAny>(&Command::Migrate { uri: &uri }, None)?;
    migrated(qmp, "save")
}

/// Has QEMU, started with `-incoming defer`, load the snapshot's devices
/// from its descriptor `fd` (the memory it maps already), and continues
/// the guest once loaded: it was saved stopped, and QEMU keeps it so until
/// told (a `cont` while it loads would be overruled by the state saved).
pub(super) fn resume(qmp: &mut Qmp, fd: i32) -> Result<()> {
    ignore_shared(qmp)?;
    let uri = format!("fd:{fd}");
    qmp.execute::<serde::de::IgnoredAny>(&Command::MigrateIncoming { uri: &uri }, None)?;
    migrated(qmp, "load")?;
    cont(qmp)
}

/// Lets the guest go on. A migration QEMU calls completed may still be
/// finishing (the run state `finish-migrate`), and QEMU refuses a `cont`
/// until it has: the CI met that once, and the guest stayed stopped.
pub(super) fn cont(qmp: &mut Qmp) -> Result<()> {
    let deadline = Instant::now() + SAVE_TIMEOUT;
    loop {
        let state: StatusInfo = qmp.execute(&Command::QueryStatus, None)?;
        if state.status != "finish-migrate" || Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    qmp.execute::<serde::de::IgnoredAny>(&Command::Cont, None)?;
    Ok(())
}

/// Waits for QEMU's migration (out to a snapshot or in from one) to end.
fn migrated(qmp: &mut Qmp, verb: &str) -> Result<()> {
    let deadline = Instant::now() + SAVE_TIMEOUT;
    loop {
        let info: MigrationInfo = qmp.execute(&Command::QueryMigrate, None)?;
        match info.status {
            Some(MigrationStatus::Completed) => return Ok(()),
            Some(MigrationStatus::Failed | MigrationStatus::Cancelled) => {
                return Err(Error::Io(std::io::Error::other(format!(
                    "QEMU could not {verb} the guest: {}",
                    info.error_desc.as_deref().unwrap_or("no reason given")
                ))));
            }
            Some(MigrationStatus::Running) | None => {}
        }
        if Instant::now() > deadline {
            return Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("QEMU did not {verb} the guest in time"),
            )));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Reads exactly `want` from the guest's control port within `timeout`.
fn expect(port: &mut UnixStream, want: &[u8; 8], timeout: Duration, what: &str) -> Result<()> {
    port.set_read_timeout(Some(timeout))?;
    let mut got = [0u8; 8];
    let read = port.read_exact(&mut got);
    port.set_read_timeout(None)?;
    match read {
        Ok(()) if &got == want => Ok(()),
        Ok(()) => Err(Error::Io(std::io::Error::other(format!(
            "the guest sent something other than {what}"
        )))),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Error::Io(
            std::io::Error::new(e.kind(), format!("the microVM exited before {what}")),
        )),
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            Err(Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("the guest sent no {what} in {} s", timeout.as_secs()),
            )))
        }
        Err(e) => Err(e.into()),
    }
}

/// Waits for a booting guest to hold (its supervisor, started).
pub(super) fn ready(port: &mut UnixStream, timeout: Duration) -> Result<()> {
    expect(port, READY, timeout, "word that it is ready")
}

/// Lets a held guest go on, with fresh entropy, and waits for it to
/// say the entropy is in.
pub(super) fn go(port: &mut UnixStream, timeout: Duration) -> Result<()> {
    let mut msg = [0u8; 8 + SEED_LEN];
    msg[..8].copy_from_slice(GO);
    rustix::rand::getrandom(&mut msg[8..], rustix::rand::GetRandomFlags::empty())
        .map_err(std::io::Error::from)?;
    port.set_write_timeout(Some(timeout))?;
    let written = port.write_all(&msg);
    port.set_write_timeout(None)?;
    written?;
    expect(port, ACK, timeout, "acknowledgement of its go")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shapes_leave_out_per_sandbox_paths_only() {
        assert_eq!(
            without_paths("local,id=workspace,path=/tmp/a b,security_model=none"),
            "local,id=workspace,path=,security_model=none"
        );
        assert_eq!(
            without_paths("file=/x/upper.img,if=none,id=upper,format=raw"),
            "file=,if=none,id=upper,format=raw"
        );
        assert_eq!(without_paths("512M"), "512M");
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let bin = dir.path().join("bin.ext4");
        std::fs::write(&bin, b"disk").unwrap();
        let shape = |args: &[&str]| {
            let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
            Shape::new(&f, &f, Path::new("/initrd-1234"), &bin, &[], &args).unwrap()
        };
        let a = shape(&["-m", "512M", "-fsdev", "local,id=w,path=/one"]);
        assert_eq!(a, shape(&["-m", "512M", "-fsdev", "local,id=w,path=/two"]));
        assert_ne!(a, shape(&["-m", "256M", "-fsdev", "local,id=w,path=/one"]));
        assert_ne!(a, shape(&["-m", "512M", "-fsdev", "local,id=v,path=/one"]));
        // cordon's disk made again (another supervisor, or the same one
        // after a prune) is another shape.
        let again = dir.path().join("again");
        std::fs::write(&again, b"disk").unwrap();
        std::fs::rename(&again, &bin).unwrap();
        assert_ne!(a, shape(&["-m", "512M", "-fsdev", "local,id=w,path=/one"]));
        let a = shape(&["-m", "512M", "-fsdev", "local,id=w,path=/one"]);
        // Another file at the same path (QEMU upgraded) is another shape.
        std::fs::remove_file(&f).unwrap();
        std::fs::write(&f, b"xy").unwrap();
        assert_ne!(a, shape(&["-m", "512M", "-fsdev", "local,id=w,path=/one"]));
    }

    /// A host file a guest holds in its page cache, replaced (a package
    /// upgrade renames a new one over it), is another shape: no guest
    /// starts with the old one's pages. One that appears is too.
    #[test]
    fn a_warmed_file_replaced_is_another_shape() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("f");
        std::fs::write(&f, b"x").unwrap();
        let libc = dir.path().join("libc.so.6");
        std::fs::write(&libc, b"old").unwrap();
        let absent = dir.path().join("absent");
        let warm = [libc.to_str().unwrap(), absent.to_str().unwrap()];
        let shape =
            || Shape::new(&f, &f, Path::new("/initrd-1"), &f, &warm, &["-m".into()]).unwrap();
        let a = shape();
        assert_eq!(a, shape());
        let new = dir.path().join("libc.new");
        std::fs::write(&new, b"new").unwrap();
        std::fs::rename(&new, &libc).unwrap();
        let b = shape();
        assert_ne!(a, b);
        std::fs::write(&absent, b"").unwrap();
        assert_ne!(b, shape());
    }

    /// Pruning keeps the snapshots used last, not those taken last, and
    /// removes what a taking that died left.
    #[test]
    fn pruning_keeps_the_snapshots_in_use() {
        let cache = tempfile::tempdir().unwrap();
        let store = Snapshots::new(cache.path());
        std::fs::create_dir_all(&store.dir).unwrap();
        let day = Duration::from_secs(86_400);
        let age = |path: &Path, days: u32| {
            let t = std::time::SystemTime::now() - day * days;
            std::fs::File::open(path).unwrap().set_modified(t).unwrap();
        };
        let shapes: Vec<Shape> = (0..KEEP + 2).map(|i| Shape(format!("{i:064x}"))).collect();
        for (i, shape) in shapes.iter().enumerate() {
            let dir = store.path(shape);
            std::fs::create_dir(&dir).unwrap();
            std::fs::write(dir.join(STATE), b"state").unwrap();
            std::fs::File::create(dir.join(RAM))
                .unwrap()
                .set_len(1 << 20)
                .unwrap();
            // Shape 0 was taken longest ago.
            age(&dir.join(STATE), (KEEP + 2 - i) as u32);
        }
        let dead = store.dir.join(".taking-dead");
        std::fs::create_dir(&dead).unwrap();
        std::fs::write(dead.join(STATE), b"half").unwrap();
        age(&dead, 1);
        let legacy = store.dir.join(format!("{:064x}.vmstate", 1));
        std::fs::write(&legacy, b"state and memory").unwrap();
        assert!(store.open(&shapes[0], 1 << 20).is_some());
        store.prune();
        assert!(store.path(&shapes[0]).exists(), "the one just used went");
        assert!(!store.path(&shapes[1]).exists());
        assert!(!store.path(&shapes[2]).exists());
        assert!(store.path(&shapes[3]).exists());
        assert!(!dead.exists());
        assert!(!legacy.exists());
        assert_eq!(std::fs::read_dir(&store.dir).unwrap().count(), KEEP);
        // One whose memory is not the guest's size is no snapshot.
        assert!(store.open(&shapes[3], 2 << 20).is_none());
        assert!(!store.path(&shapes[3]).exists());
    }

    /// guest/init.rs is built alone, without this crate: the names of
    /// cordon's disk are spelled twice and must agree.
    #[test]
    fn the_guest_init_names_the_disk_as_the_host_makes_it() {
        use crate::layout::{
            CONTROL_FD, GUEST_BIN, GUEST_LATE_MODULES, GUEST_LIBS, GUEST_LOADER, GUEST_MODULES,
            GUEST_SUPERVISOR,
        };
        let init = include_str!("../../guest/init.rs");
        for line in [
            format!("const GUEST_BIN: &str = \"{GUEST_BIN}\";"),
            format!("const GUEST_SUPERVISOR: &str = \"{GUEST_SUPERVISOR}\";"),
            format!("const GUEST_LOADER: &str = \"{GUEST_LOADER}\";"),
            format!("const GUEST_LIBS: &str = \"{GUEST_LIBS}\";"),
            format!("const CONTROL_FD: c_int = {CONTROL_FD};"),
            format!("const GUEST_LATE_MODULES: &[&str] = &{GUEST_LATE_MODULES:?};"),
            format!("let dir = \"{GUEST_MODULES}\";"),
        ] {
            assert!(init.contains(&line), "guest/init.rs lacks {line}");
        }
    }

    #[test]
    fn a_guest_that_says_otherwise_or_nothing_is_refused() {
        let (mut host, mut guest) = UnixStream::pair().unwrap();
        guest.write_all(b"cordon:X").unwrap();
        let e = ready(&mut host, Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("something other"), "{e}");
        let e = ready(&mut host, Duration::from_millis(50)).unwrap_err();
        assert!(e.to_string().contains("sent no word"), "{e}");
        drop(guest);
        let e = ready(&mut host, Duration::from_secs(1)).unwrap_err();
        assert!(e.to_string().contains("exited"), "{e}");
    }
}
