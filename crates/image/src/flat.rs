//! A flat root for virtual machines: an image's layers merged into one
//! read-only ext4 file system, made once per set of layers and shared by
//! every microVM that runs them (each guest mounts it under a writable
//! layer of its own).
//!
//! Why a block image rather than the layers over 9p: a guest reads a block
//! device through its own page cache, where every 9p lookup is a round
//! trip to QEMU; and the image's owners (ids 0 to 65535) are the guest
//! kernel's own, with no mapping. Why ext4 from `mke2fs -d`: it is in every
//! Debian (e2fsprogs), the guest kernel has it, and it copies a tree as it
//! is: links stay links, hard links stay one inode.
//!
//! The layers are hostile content and this process opens none of their
//! files: a child merges them with overlayfs (in a private mount namespace,
//! read-only, with `userxattr`, so the store's whiteouts and opaque markers
//! read as the image meant them; in a user namespace when the caller is
//! not root, whose store holds only its own files) and runs `mke2fs` on
//! the merged view. What `mke2fs` prints may quote the image's file names:
//! it is shown escaped and cut short.

use std::collections::BTreeSet;
use std::ffi::CString;
use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::fs::{FlockOperation, Mode, OFlags};

use crate::digest::Digest;

/// What names the format: a change to how the file is made changes every
/// key, so no guest boots a file made the old way.
const FORMAT: &str = "cordon flat root: ext4, mke2fs -d, the tree in /image, v1";
/// The directory of the file system that holds the image's tree.
pub const IMAGE_DIR: &str = "image";
/// The suffix of a flat root's file in its directory.
const SUFFIX: &str = ".ext4";
/// ext4's block size here, and what each file, directory and long link
/// takes at least.
const BLOCK: u64 = 4096;
/// Bytes of an inode in the table (mke2fs's default for ext4).
const INODE: u64 = 256;
/// Room beyond the estimate: group descriptors, bitmaps, directories that
/// grow, the estimate's own errors. The file is sparse: unused room costs
/// nothing on the host.
const SLACK: u64 = 128 << 20;
/// Deepest directory the size estimate walks into (as deep as an unpack
/// goes).
const MAX_DEPTH: usize = 128;
/// How much of what `mke2fs` printed an error quotes.
const MAX_QUOTED: usize = 2000;

#[derive(Debug, thiserror::Error)]
pub enum FlatError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("making the image's root file system failed: {0}")]
    Tool(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> FlatError {
    let what = what.into();
    move |source| FlatError::Io { what, source }
}

/// A flat root in use: its file stays (a prune leaves it) until this is
/// dropped.
#[derive(Debug)]
pub struct Flat {
    path: PathBuf,
    _lock: OwnedFd,
}

impl Flat {
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The name of the flat root of the layers named `layers` (their directory
/// names, the diff_ids' hex, top first), without its suffix.
pub fn key<'a>(layers: impl IntoIterator<Item = &'a str>) -> String {
    let mut text = String::from(FORMAT);
    for l in layers {
        text.push('\n');
        text.push_str(l);
    }
    Digest::of(text.as_bytes()).hex()
}

/// The flat root of the unpacked layers `layers` (top first) in `dir`:
/// the one there, or made now (once, however many ask at the same time).
pub fn flat_root(dir: &Path, layers: &[PathBuf]) -> Result<Flat, FlatError> {
    let names = layers
        .iter()
        .map(|l| {
            l.file_name()
                .and_then(|n| n.to_str())
                .filter(|n| n.len() == 64 && n.bytes().all(|b| b.is_ascii_hexdigit()))
                .ok_or_else(|| {
                    FlatError::Tool(format!("{} is not a layer of a store", l.display()))
                })
        })
        .collect::<Result<Vec<_>, _>>()?;
    if names.is_empty() {
        return Err(FlatError::Tool("the image has no layers".into()));
    }
    let key = key(names.iter().copied());
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(io(format!("making {}", dir.display())))?;
    let path = dir.join(format!("{key}{SUFFIX}"));
    loop {
        if let Some(flat) = open_shared(&path)? {
            return Ok(flat);
        }
        // One maker at a time; the others wait, then find its file.
        let _making = lock(
            &dir.join(format!("{key}.lock")),
            FlockOperation::LockExclusive,
        )?;
        if let Some(flat) = open_shared(&path)? {
            return Ok(flat);
        }
        make(dir, layers, &path)?;
    }
}

/// The file at `path` with a shared lock on it, or `None` when there is
/// none (or a prune removed it before the lock was had).
fn open_shared(path: &Path) -> Result<Option<Flat>, FlatError> {
    let fd = match rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(None),
        Err(e) => return Err(io(format!("opening {}", path.display()))(e.into())),
    };
    rustix::fs::flock(&fd, FlockOperation::LockShared)
        .map_err(|e| io(format!("locking {}", path.display()))(e.into()))?;
    let st = rustix::fs::fstat(&fd).map_err(|e| io("fstat")(e.into()))?;
    if st.st_nlink == 0 {
        return Ok(None);
    }
    Ok(Some(Flat {
        path: path.to_path_buf(),
        _lock: fd,
    }))
}

fn lock(path: &Path, how: FlockOperation) -> Result<OwnedFd, FlatError> {
    let fd = rustix::fs::open(
        path,
        OFlags::CREATE | OFlags::RDWR | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::from_raw_mode(0o600),
    )
    .map_err(|e| io(format!("opening {}", path.display()))(e.into()))?;
    rustix::fs::flock(&fd, how).map_err(|e| io(format!("locking {}", path.display()))(e.into()))?;
    Ok(fd)
}

/// Makes the flat root of `layers` at `target`, through a work directory
/// in `dir` that goes whatever happens.
fn make(dir: &Path, layers: &[PathBuf], target: &Path) -> Result<(), FlatError> {
    let started = std::time::Instant::now();
    let work = tempfile::Builder::new()
        .prefix(".make-")
        .tempdir_in(dir)
        .map_err(io(format!("making a work directory in {}", dir.display())))?;
    // The file system's root holds mke2fs's lost+found and the image's
    // tree as IMAGE_DIR, where the overlay is mounted: the image's own
    // root, with its owner and mode, and nothing of mke2fs's in it.
    let top = work.path().join("top");
    let merged = top.join(IMAGE_DIR);
    let empty = work.path().join("empty");
    for d in [&top, &merged, &empty] {
        std::fs::create_dir(d).map_err(io(format!("making {}", d.display())))?;
    }
    let out = work.path().join("root.ext4");

    let mut lower = Vec::with_capacity(layers.len() + 1);
    for l in layers {
        lower.push(option_path(l)?);
    }
    // Overlayfs wants two lower layers when it has no upper one.
    if layers.len() == 1 {
        lower.push(option_path(&empty)?);
    }
    let options = format!("lowerdir={},userxattr", lower.join(":"));

    let estimate = layers.iter().fold(Estimate::default(), |mut e, l| {
        e.walk(l, 0);
        e
    });
    let inodes = estimate.entries + 1024;
    let bytes = estimate.bytes + estimate.bytes / 8 + inodes * INODE + SLACK;
    let kib = bytes.div_ceil(BLOCK) * (BLOCK / 1024);

    let enter = Enter::new(&merged, &options)?;
    let mut cmd = mke2fs_command(&top, &out, "cordon-image", inodes, kib)?;
    // SAFETY: `enter` makes only system calls, with strings made before
    // the fork: nothing that allocates or takes a lock.
    unsafe { cmd.pre_exec(move || enter.enter()) };
    run_mke2fs(cmd)?;
    std::fs::rename(&out, target).map_err(io(format!("placing {}", target.display())))?;
    tracing::info!(
        file = %target.display(),
        layers = layers.len(),
        seconds = started.elapsed().as_secs_f64(),
        "made a flat root"
    );
    Ok(())
}

/// `mke2fs` making an ext4 file system of `kib` KiB with `inodes` inodes
/// in `out`, holding a copy of the tree `top`: no journal (nothing writes
/// it), owned by root whoever runs it.
fn mke2fs_command(
    top: &Path,
    out: &Path,
    label: &str,
    inodes: u64,
    kib: u64,
) -> Result<Command, FlatError> {
    let mut cmd = Command::new(mke2fs()?);
    cmd.args(["-q", "-F", "-t", "ext4", "-b"])
        .arg(BLOCK.to_string())
        .args(["-m", "0", "-N"])
        .arg(inodes.to_string())
        .args(["-L", label, "-O", "^has_journal,^resize_inode"])
        .args(["-E", "root_owner=0:0,lazy_itable_init=1,nodiscard", "-d"])
        .arg(top)
        .arg(out)
        .arg(format!("{kib}k"))
        // Nothing of the caller's: mke2fs reads MKE2FS_CONFIG and the like.
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    Ok(cmd)
}

fn run_mke2fs(mut cmd: Command) -> Result<(), FlatError> {
    let output = cmd
        .output()
        .map_err(io("running mke2fs (Debian's e2fsprogs)"))?;
    if !output.status.success() {
        return Err(FlatError::Tool(format!(
            "mke2fs: {}",
            quoted(&output.stderr).trim()
        )));
    }
    Ok(())
}

/// Makes `out`, a read-only ext4 file system holding a copy of `tree`, a
/// directory of cordon's own (not an image's: this process walks it).
/// Written beside `out` and linked into place unless another maker was
/// first: a file once placed is never replaced under its readers.
pub fn ext4_of_dir(tree: &Path, out: &Path, label: &str) -> Result<(), FlatError> {
    let mut estimate = Estimate::default();
    estimate.walk(tree, 0);
    let inodes = estimate.entries + 64;
    // Small trees: a fixed margin rather than the image's.
    let bytes = estimate.bytes + estimate.bytes / 8 + inodes * INODE + (8 << 20);
    let kib = bytes.div_ceil(BLOCK) * (BLOCK / 1024);
    let dir = out.parent().unwrap_or(Path::new("."));
    let tmp = tempfile::Builder::new()
        .prefix(".ext4-")
        .tempfile_in(dir)
        .map_err(io(format!("making a file in {}", dir.display())))?;
    run_mke2fs(mke2fs_command(tree, tmp.path(), label, inodes, kib)?)?;
    match tmp.persist_noclobber(out) {
        Ok(_) => Ok(()),
        Err(e) if e.error.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(io(format!("placing {}", out.display()))(e.error)),
    }
}

/// A store path as overlayfs takes it in an option: no separator in it.
fn option_path(p: &Path) -> Result<String, FlatError> {
    p.to_str()
        .filter(|s| !s.contains([':', ',', '\\']))
        .map(str::to_string)
        .ok_or_else(|| {
            FlatError::Tool(format!(
                "{}: a layer's path must be UTF-8 without ':', ',' or '\\'",
                p.display()
            ))
        })
}

/// The `mke2fs` of e2fsprogs.
fn mke2fs() -> Result<&'static str, FlatError> {
    ["/usr/sbin/mke2fs", "/sbin/mke2fs"]
        .into_iter()
        .find(|p| Path::new(p).is_file())
        .ok_or_else(|| {
            FlatError::Tool("mke2fs is not installed (Debian's e2fsprogs provides it)".into())
        })
}

/// What a child does before it execs `mke2fs`: a mount namespace of its
/// own (and a user namespace, mapping the caller to root, when the caller
/// is not root), and the layers merged, read-only, at `merged`.
struct Enter {
    merged: CString,
    options: CString,
    /// `uid_map` and `gid_map` lines for a user namespace.
    maps: Option<(CString, CString)>,
}

impl Enter {
    fn new(merged: &Path, options: &str) -> Result<Enter, FlatError> {
        let c = |s: &str| CString::new(s).map_err(|_| FlatError::Tool(format!("{s:?}: a NUL")));
        let maps = if rustix::process::geteuid().is_root() {
            None
        } else {
            let uid = rustix::process::geteuid().as_raw();
            let gid = rustix::process::getegid().as_raw();
            Some((c(&format!("0 {uid} 1"))?, c(&format!("0 {gid} 1"))?))
        };
        Ok(Enter {
            merged: c(&option_path(merged)?)?,
            options: c(options)?,
            maps,
        })
    }

    fn enter(&self) -> std::io::Result<()> {
        use rustix::mount::{MountFlags, MountPropagationFlags};
        use rustix::thread::UnshareFlags;
        let mut flags = UnshareFlags::NEWNS;
        if self.maps.is_some() {
            flags |= UnshareFlags::NEWUSER;
        }
        // SAFETY: a child between fork and exec, with one thread and no
        // state that new namespaces could invalidate.
        unsafe { rustix::thread::unshare_unsafe(flags)? };
        if let Some((uid_map, gid_map)) = &self.maps {
            write(c"/proc/self/setgroups", b"deny")?;
            write(c"/proc/self/uid_map", uid_map.as_bytes())?;
            write(c"/proc/self/gid_map", gid_map.as_bytes())?;
        }
        rustix::mount::mount_change(
            c"/",
            MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
        )?;
        rustix::mount::mount(
            c"overlay",
            self.merged.as_c_str(),
            c"overlay",
            MountFlags::RDONLY | MountFlags::NOSUID | MountFlags::NODEV,
            self.options.as_c_str(),
        )?;
        Ok(())
    }
}

fn write(path: &std::ffi::CStr, bytes: &[u8]) -> std::io::Result<()> {
    let fd = rustix::fs::open(path, OFlags::WRONLY | OFlags::CLOEXEC, Mode::empty())?;
    rustix::io::write(&fd, bytes)?;
    Ok(())
}

/// An upper bound on what the merged layers take in ext4: every layer's
/// files whole (a file a higher layer hides counts too), each rounded up
/// to a block.
#[derive(Default)]
struct Estimate {
    bytes: u64,
    entries: u64,
}

impl Estimate {
    fn walk(&mut self, dir: &Path, depth: usize) {
        let Ok(rd) = std::fs::read_dir(dir) else {
            return;
        };
        for e in rd.flatten() {
            self.entries += 1;
            let Ok(meta) = e.path().symlink_metadata() else {
                continue;
            };
            let t = meta.file_type();
            if t.is_dir() {
                self.bytes += BLOCK;
                if depth < MAX_DEPTH {
                    self.walk(&e.path(), depth + 1);
                }
            } else if t.is_file() || (t.is_symlink() && meta.len() >= 60) {
                self.bytes += meta.len().div_ceil(BLOCK) * BLOCK;
            }
        }
    }
}

/// What a tool printed, safe to show: printable, cut short.
fn quoted(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes)
        .chars()
        .flat_map(|c| {
            if c == '\n' || !crate::text::unprintable(c) {
                vec![c]
            } else {
                c.escape_default().collect()
            }
        })
        .take(MAX_QUOTED)
        .collect()
}

/// Removes the flat roots in `dir` whose key is not in `keep` and that no
/// guest holds, and what makers that died left; the bytes freed.
pub fn prune(dir: &Path, keep: &BTreeSet<String>) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    let mut freed = 0;
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let path = e.path();
        let unused = |suffix| name.strip_suffix(suffix).is_some_and(|k| !keep.contains(k));
        if unused(SUFFIX) || unused(".lock") {
            let Ok(fd) = rustix::fs::open(
                &path,
                OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                continue;
            };
            // Held: a guest runs on it, or a maker is making it.
            if rustix::fs::flock(&fd, FlockOperation::NonBlockingLockExclusive).is_ok() {
                // Allocated bytes: the file is sparse.
                freed += rustix::fs::fstat(&fd).map_or(0, |st| st.st_blocks as u64 * 512);
                let _ = std::fs::remove_file(&path);
            }
        } else if name.starts_with(".make-") {
            // A maker's work directory: its maker holds the key's lock, and
            // one that died holds none.
            let stale = std::fs::metadata(&path)
                .and_then(|m| m.modified())
                .is_ok_and(|t| t.elapsed().is_ok_and(|d| d.as_secs() > 24 * 3600));
            if stale {
                let _ = std::fs::remove_dir_all(&path);
            }
        }
    }
    freed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_the_layers_in_order() {
        let (a, b) = ("a".repeat(64), "b".repeat(64));
        assert_eq!(key([a.as_str(), b.as_str()]), key([a.as_str(), b.as_str()]));
        assert_ne!(key([a.as_str(), b.as_str()]), key([b.as_str(), a.as_str()]));
        assert_ne!(key([a.as_str()]), key([a.as_str(), b.as_str()]));
    }

    #[test]
    fn what_a_tool_prints_is_shown_escaped() {
        assert_eq!(quoted(b"bad \x1b[31mname\n"), "bad \\u{1b}[31mname\n");
        assert_eq!(quoted(&[b'x'; 5000]).len(), MAX_QUOTED);
    }

    #[test]
    fn a_path_that_is_not_a_layer_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let err = flat_root(dir.path(), &[PathBuf::from("/etc")]).unwrap_err();
        assert!(err.to_string().contains("not a layer"), "{err}");
    }
}
