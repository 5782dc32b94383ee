//! What the isolation backends share, below them: the [`Backend`] trait
//! each implements, and the pieces of launching a sandbox that do not
//! depend on how it is isolated. Which backend a configuration names is
//! decided above them, in `create.rs`.

use std::future::Future;
use std::path::{Path, PathBuf};
use std::pin::Pin;

use crate::config::{RootImage, SandboxConfig};
use crate::error::{Error, Result};
use crate::fresh::{Key, Template, Templates};
use crate::session::Sandbox;

/// Creates sandbox sessions: `native` (Linux namespaces) and `microvm`
/// (QEMU) plug in behind it. [`crate::BackendKind::backend`] gives the one
/// a configuration names; [`Sandbox::create`] goes through it.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    fn create<'a>(
        &'a self,
        config: &'a SandboxConfig,
    ) -> Pin<Box<dyn Future<Output = Result<Sandbox>> + Send + 'a>>;
}

/// Waits, blocking, until `done` says so, for at most `limit` (then
/// `TimedOut` with `what`). Freezing or stopping a sandbox usually takes
/// the kernel a fraction of a millisecond and sometimes far longer: it
/// looks again after 50 µs, then twice as long each time, up to 2 ms.
pub(crate) fn wait_until(
    limit: std::time::Duration,
    what: &str,
    mut done: impl FnMut() -> std::io::Result<bool>,
) -> std::io::Result<()> {
    let deadline = std::time::Instant::now() + limit;
    let mut wait = std::time::Duration::from_micros(50);
    while !done()? {
        if std::time::Instant::now() >= deadline {
            return Err(std::io::Error::new(std::io::ErrorKind::TimedOut, what));
        }
        std::thread::sleep(wait);
        wait = (wait * 2).min(std::time::Duration::from_millis(2));
    }
    Ok(())
}

/// The supervisor's executable: the configured one, `CORDON_SUPERVISOR`,
/// or this process's own.
pub(crate) fn resolve_supervisor(config: &SandboxConfig) -> Result<PathBuf> {
    if let Some(p) = &config.supervisor {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("CORDON_SUPERVISOR") {
        return Ok(PathBuf::from(p));
    }
    std::env::current_exe().map_err(|e| Error::Spawn {
        path: PathBuf::from("/proc/self/exe"),
        source: e,
    })
}

/// Whether `name`, of the form `<pid>-<n>` that cordon gives the host
/// directories a process makes for its sandboxes (cgroups, microVM run
/// directories), was left by a process that no longer exists. A live pid
/// counts as alive even if it was reused: a directory left a little longer
/// costs nothing, one removed under a running sandbox breaks it.
pub(crate) fn left_by_dead_process(name: &str) -> bool {
    name.split_once('-')
        .and_then(|(pid, _)| pid.parse::<u32>().ok())
        .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
}

/// The directory of an image sandbox's writable layer (overlay's upper and
/// work directories natively, a microVM's disk file), in the store's
/// `run/`: removed when this is dropped, and locked until then, so that
/// `cordon image prune` removes only the unlocked ones (a sandbox killed
/// before it could) and keeps the layers the locked ones name in their
/// `layers` file.
pub(crate) struct WritableLayer {
    dir: PathBuf,
    _lock: std::os::fd::OwnedFd,
    /// Left for another process (see [`WritableLayer::set_kept`]).
    kept: bool,
}

impl WritableLayer {
    pub(crate) fn new(image: &RootImage) -> Result<WritableLayer> {
        std::fs::create_dir_all(&image.scratch).map_err(|e| {
            Error::Config(format!(
                "cannot make the directory for writable layers {}: {e}",
                image.scratch.display()
            ))
        })?;
        let dir = tempfile::Builder::new()
            .prefix("sandbox-")
            .tempdir_in(&image.scratch)
            .map_err(|e| {
                Error::Config(format!(
                    "cannot make a writable layer in {}: {e}",
                    image.scratch.display()
                ))
            })?;
        let lock = lock_layer(dir.path())?;
        // Removed by this type's Drop from now on.
        let dir = dir.keep();
        let names = layer_names(image);
        let layer = WritableLayer {
            dir,
            _lock: lock,
            kept: false,
        };
        std::fs::write(layer.dir.join("layers"), names)?;
        if let Some(m) = &image.manifest {
            std::fs::write(layer.dir.join(IMAGE_FILE), m)?;
        }
        if let Some(l) = &image.label {
            std::fs::write(layer.dir.join(LABEL_FILE), l)?;
        }
        Ok(layer)
    }

    /// The layer another process left at `dir` (see
    /// [`WritableLayer::keep`]), locked again; it must be in `image`'s
    /// scratch directory.
    pub(crate) fn adopt(image: &RootImage, dir: &Path) -> Result<WritableLayer> {
        let missing = || {
            Error::Config(format!(
                "the sandbox's writable layer {} is gone (`cordon image prune` removes a \
                 paused sandbox's while no process holds it)",
                dir.display()
            ))
        };
        if dir.parent() != Some(image.scratch.as_path()) {
            return Err(missing());
        }
        let lock = lock_layer(dir).map_err(|_| missing())?;
        // Its files are changes to those layers and no others: an image
        // whose name now means other layers would show them garbled.
        let recorded = std::fs::read_to_string(dir.join("layers")).map_err(|_| missing())?;
        if recorded != layer_names(image) {
            return Err(Error::Config(format!(
                "the sandbox's writable layer {} was made on other layers than its image has now",
                dir.display()
            )));
        }
        Ok(WritableLayer {
            dir: dir.to_path_buf(),
            _lock: lock,
            kept: false,
        })
    }

    /// Whether the layer stays where it is when this is dropped, for
    /// another process to [`WritableLayer::adopt`]. Its lock goes with
    /// this.
    pub(crate) fn set_kept(&mut self, kept: bool) {
        self.kept = kept;
    }

    /// Marks the layer as a saved sandbox's (a microVM paused to disk, to
    /// be taken up again), which `cordon image prune` keeps though no
    /// process holds it (see [`cordon_image::store::SANDBOX_SAVED`]).
    pub(crate) fn mark_saved(&self, saved: bool) -> std::io::Result<()> {
        let marker = self.dir.join(cordon_image::store::SANDBOX_SAVED);
        if saved {
            std::fs::write(marker, "")
        } else {
            match std::fs::remove_file(marker) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(e),
                _ => Ok(()),
            }
        }
    }

    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes the layer a disk: an empty ext4 file system of `size` bytes
    /// in the directory, labelled `label`, sparse (no journal, as the
    /// layer goes with the sandbox; no reserved blocks; inode tables left
    /// unwritten). Its size is a hard bound on what the layer holds. The
    /// first of a size and label is made by `mke2fs`, the next are copies
    /// of it as made ([`crate::fresh`]).
    pub(crate) fn make_disk(&self, size: u64, label: &'static str) -> Result<PathBuf> {
        // Held only to look a template up or keep one: disks of sizes not
        // seen yet are made side by side, as before there were templates.
        static TEMPLATES: std::sync::Mutex<Templates> = std::sync::Mutex::new(Templates::new());
        let templates = || TEMPLATES.lock().unwrap_or_else(|p| p.into_inner());
        let path = self.dir().join(DISK_FILE);
        let file = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&path)?;
        file.set_len(size)?;
        let kind = Key { len: size, label };
        if let Some(template) = templates().of(&kind) {
            template.write_to(&file)?;
            return Ok(path);
        }
        let out = std::process::Command::new("mke2fs")
            .args([
                "-q", "-F", "-t", "ext4", "-b", "4096", "-m", "0", "-L", label,
            ])
            // The checksums seeded apart from the UUID, so that a copy's can
            // be changed alone (`fresh`).
            .args(["-O", "^has_journal,^resize_inode,metadata_csum_seed"])
            .args(["-E", "lazy_itable_init=1,nodiscard"])
            .arg(&path)
            .env_clear()
            .env("PATH", TOOL_PATH)
            .stdin(std::process::Stdio::null())
            .output()
            .map_err(|e| {
                Error::Config(format!(
                    "cannot run mke2fs for the writable layer (Debian's e2fsprogs): {e}"
                ))
            })?;
        if !out.status.success() {
            return Err(Error::Config(format!(
                "mke2fs for the writable layer failed: {}",
                String::from_utf8_lossy(&out.stderr).trim()
            )));
        }
        // Fresh: only mke2fs has written to it.
        match Template::read(&file, label) {
            Ok(Some(t)) => templates().keep(t),
            Ok(None) => tracing::debug!("a fresh layer's disk holds too much to copy"),
            Err(e) => tracing::warn!("cannot keep a fresh layer's disk to copy: {e}"),
        }
        Ok(path)
    }

    /// The layer's disk as a sparse copy of `from` (a copy of another
    /// microVM's disk, see [`Sandbox::copy_layer_disk`]), at its size.
    pub(crate) fn copy_disk(&self, from: &Path) -> Result<PathBuf> {
        let path = self.dir().join(DISK_FILE);
        crate::sparse::copy_file(from, &path)?;
        Ok(path)
    }
}

/// How the host ids of a writable layer's files map back to the image's.
/// Root's sandbox writes image id `n` as host id `base + n` (the range it
/// held, which its outer supervisor gave the layer's `work` directory
/// before any process of the sandbox ran, and which none can reach); an
/// unprivileged caller's writes 0 as itself and `n` as its `n`th
/// subordinate id (recorded in [`IDS_FILE`]).
#[derive(Debug, Clone, Copy)]
pub struct ImageIds {
    uid: IdRange,
    gid: IdRange,
}

/// Host ids `0 -> first` and `1.. -> rest..`, for `count` ids in all.
#[derive(Debug, Clone, Copy)]
struct IdRange {
    first: u32,
    rest: u32,
    count: u32,
}

impl IdRange {
    fn image_id(&self, host: u32) -> Option<u32> {
        if host == self.first {
            return Some(0);
        }
        let n = host.checked_sub(self.rest)?;
        (n + 1 < self.count).then_some(n + 1)
    }
}

impl ImageIds {
    /// The map of the writable layer in `dir` (one of the store's `run/`).
    pub fn read(dir: &Path) -> Result<ImageIds> {
        Self::read_with_work(dir, &dir.join("work"))
    }

    /// As [`ImageIds::read`], with the layer's `work` directory at `work`
    /// (where a layer on a disk has it: see `Sandbox::writable_upper`).
    pub fn read_with_work(dir: &Path, work: &Path) -> Result<ImageIds> {
        use std::os::unix::fs::MetadataExt;
        let work = std::fs::symlink_metadata(work)?;
        let sub = std::fs::read_to_string(dir.join(IDS_FILE))
            .ok()
            .and_then(|t| {
                let n: Vec<u32> = t
                    .split_whitespace()
                    .filter_map(|w| w.parse().ok())
                    .collect();
                match n[..] {
                    [uid, gid, count] => Some((uid, gid, count)),
                    _ => None,
                }
            });
        Ok(match sub {
            Some((uid, gid, count)) => ImageIds {
                uid: IdRange {
                    first: work.uid(),
                    rest: uid,
                    count: count + 1,
                },
                gid: IdRange {
                    first: work.gid(),
                    rest: gid,
                    count: count + 1,
                },
            },
            None => {
                let range = |base: u32| IdRange {
                    first: base,
                    rest: base + 1,
                    count: crate::protocol::IMAGE_IDS,
                };
                ImageIds {
                    uid: range(work.uid()),
                    gid: range(work.gid()),
                }
            }
        })
    }

    /// The image's uid and gid of a file owned by host ids `uid`, `gid`.
    pub fn image_ids(&self, uid: u32, gid: u32) -> Option<(u32, u32)> {
        Some((self.uid.image_id(uid)?, self.gid.image_id(gid)?))
    }
}

/// Beside a writable layer, written by cordon: the base image's manifest
/// digest, what the front end calls the sandbox (a session's id), and an
/// unprivileged caller's subordinate ids (`UID GID COUNT`).
pub const IMAGE_FILE: &str = "image";
pub const LABEL_FILE: &str = "label";
pub const IDS_FILE: &str = "ids";

/// A writable layer's disk in its directory (root's, under a budget).
pub const DISK_FILE: &str = "layer.ext4";
/// In a writable layer's directory: the host pid of the sandbox's outer
/// supervisor, which holds a descriptor on the layer's disk.
pub const SUPERVISOR_FILE: &str = "supervisor";

/// The overlay `upper` directory of the writable layer in `dir`, where the
/// host can read it while the sandbox runs: in `dir`, or, when root gave
/// the layer a disk (mounted in a mount namespace no host process sees),
/// through the descriptor the sandbox's outer supervisor `supervisor`
/// holds on the disk's root (`/proc/PID/fd/N`: a process of cordon's,
/// which the sandbox cannot reach).
pub fn live_upper(dir: &Path, supervisor: Option<i32>) -> Option<std::path::PathBuf> {
    let plain = dir.join("upper");
    if plain.is_dir() {
        return Some(plain);
    }
    let fds = Path::new("/proc").join(supervisor?.to_string()).join("fd");
    std::fs::read_dir(fds).ok()?.flatten().find_map(|e| {
        let at = e.path();
        let upper = at.join("upper");
        (upper.is_dir() && at.join("work").is_dir()).then_some(upper)
    })
}
/// Where e2fsprogs is looked for: the host's, never the caller's `PATH`.
const TOOL_PATH: &str = "/usr/sbin:/sbin:/usr/bin:/bin";

/// The names of `image`'s layers, one a line, top first: what a writable
/// layer records of what it was made on.
fn layer_names(image: &RootImage) -> String {
    image
        .layers
        .iter()
        .filter_map(|l| Some(format!("{}\n", l.file_name()?.to_str()?)))
        .collect()
}

/// `dir` opened and locked exclusively: a writable layer in use (see
/// [`WritableLayer`]).
fn lock_layer(dir: &Path) -> Result<std::os::fd::OwnedFd> {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC | OFlags::NOFOLLOW,
        Mode::empty(),
    )
    .and_then(|fd| {
        rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive)?;
        Ok(fd)
    })
    .map_err(|e| Error::Io(e.into()))
}

impl Drop for WritableLayer {
    fn drop(&mut self) {
        if self.kept {
            return;
        }
        // A sandbox that was killed left overlay's mode-000 work directory
        // (and any it made unreadable): opened up for the removal, as far
        // as the caller owns them.
        let _ = crate::tree::make_removable(&self.dir);
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `p` as a string for the supervisor's setup, which is UTF-8.
pub(crate) fn utf8(p: &Path, what: &str) -> Result<String> {
    p.to_str()
        .map(str::to_string)
        .ok_or_else(|| Error::Config(format!("{what} {} is not valid UTF-8", p.display())))
}

impl Sandbox {
    /// A native image sandbox's overlay `upper` directory, where the host
    /// can read it while the sandbox runs (see [`live_upper`]).
    /// None for a microVM, or a sandbox on the host's root.
    pub fn writable_upper(&self) -> Option<std::path::PathBuf> {
        if self.info().backend != "native" {
            return None;
        }
        let dir = self.writable_layer_dir()?;
        live_upper(&dir, Some(self.inner.lifecycle.host_pid()))
    }

    /// Copies this microVM's writable layer, its disk, to `to` (a new
    /// file, sparse as the disk is), with the layer's file system frozen
    /// meanwhile so that the copy is a whole file system: what forks of it
    /// start from (see [`crate::RootImage::upper_from`]). The sandbox's
    /// writers wait for the copy; a file being written may be copied
    /// half-written, as a snapshot would take it. Only a microVM on an
    /// image has such a disk. The copy is only bytes: the host reads
    /// nothing of the file system in it.
    pub async fn copy_layer_disk(&self, to: &std::path::Path) -> Result<()> {
        let dir = self
            .writable_layer_dir()
            .filter(|_| self.info().backend == "microvm")
            .ok_or_else(|| {
                Error::Config("only a microVM on an image has its root's changes on a disk".into())
            })?;
        let disk = dir.join(DISK_FILE);
        let frozen = crate::session::Frozen::new(self).await?;
        let to = to.to_path_buf();
        let copied = tokio::task::spawn_blocking(move || crate::sparse::copy_file(&disk, &to))
            .await
            .map_err(|e| Error::Io(std::io::Error::other(e)))?;
        frozen.thaw().await?;
        Ok(copied?)
    }

    /// Records what the front end calls this sandbox (a session's id)
    /// beside its writable layer, where `cordon image commit` finds it.
    pub fn set_label(&self, label: &str) -> Result<()> {
        if let Some(dir) = self.writable_layer_dir() {
            std::fs::write(dir.join(LABEL_FILE), label)?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The first disk of a size and label is made by `mke2fs`, the next are
    /// copies of it as made: each must be a sound, empty file system of its
    /// size and label, and a copy the same bytes as the first was.
    #[test]
    fn a_layer_s_disk_is_a_fresh_file_system_each_time() {
        let tmp = tempfile::tempdir().unwrap();
        // A label of this test's own: no other test's template is used.
        const LABEL: &str = "cordon-test";
        let make = |name: &str, size: u64| {
            let dir = tmp.path().join(name);
            std::fs::create_dir(&dir).unwrap();
            let layer = WritableLayer {
                _lock: lock_layer(&dir).unwrap(),
                dir,
                kept: false,
            };
            let disk = layer.make_disk(size, LABEL).unwrap();
            (layer, disk)
        };
        let read = |disk: &Path| {
            Template::read(&std::fs::File::open(disk).unwrap(), LABEL)
                .unwrap()
                .expect("a fresh disk holds little")
        };
        // dumpe2fs -h of a superblock: the primary, or a backup's.
        let head = |disk: &Path, backup: Option<u32>| {
            let mut c = std::process::Command::new("dumpe2fs");
            if let Some(block) = backup {
                c.args(["-o", &format!("superblock={block}"), "-o", "blocksize=4096"]);
            }
            let out = c
                .arg("-h")
                .arg(disk)
                .env("PATH", TOOL_PATH)
                .output()
                .unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            String::from_utf8_lossy(&out.stdout).into_owned()
        };
        let uuid = |head: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix("Filesystem UUID:"))
                .map(|u| u.trim().to_string())
                .unwrap()
        };
        let first = make("a", 1 << 30);
        let copy = make("b", 1 << 30);
        let other = make("c", 2 << 30);
        // The same file system but for the UUID its superblocks carry.
        assert!(
            read(&first.1).same_but_uuids(&read(&copy.1)),
            "a copy differs from the disk it copies"
        );
        let mut uuids = Vec::new();
        for (_, disk) in [&first, &copy, &other] {
            crate::fresh::assert_sound(disk);
            let primary = head(disk, None);
            assert!(
                primary.contains(&format!("Filesystem volume name:   {LABEL}")),
                "{primary}"
            );
            assert!(primary.contains("metadata_csum_seed"), "{primary}");
            // The first and the last backups (groups 1 and 7 of 8) carry it too.
            for block in [32768, 7 * 32768] {
                assert_eq!(uuid(&head(disk, Some(block))), uuid(&primary), "{block}");
            }
            uuids.push(uuid(&primary));
        }
        uuids.sort();
        uuids.dedup();
        assert_eq!(uuids.len(), 3, "the disks share a UUID");
        let len = |disk: &Path| std::fs::metadata(disk).unwrap().len();
        assert_eq!(len(&copy.1), 1 << 30);
        assert_eq!(len(&other.1), 2 << 30);
    }
}
