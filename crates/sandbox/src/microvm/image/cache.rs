//! The image cache: where it is, the files that name its current kernel,
//! and how entries are written into it (under a lock, through a temporary
//! file and a rename) and pruned.

use std::ffi::OsString;
use std::fs::{self, File};
use std::hash::{DefaultHasher, Hasher};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU32, Ordering};

use super::{At, ImageError};

/// Where guest images are cached: `$CORDON_VM_DIR`, else
/// `/var/cache/cordon/vm` when running as root, else
/// `$XDG_CACHE_HOME/cordon/vm` (`~/.cache/cordon/vm`).
pub fn cache_dir() -> PathBuf {
    crate::cache::cache_dir("vm", "CORDON_VM_DIR")
}

/// Marks a complete kernel tree in the cache, written last.
pub(super) const MARKER: &str = ".cordon-kernel";

/// The version `setup` made current, if any.
pub(super) fn current_version(cache: &Path) -> Result<Option<String>, ImageError> {
    let path = cache.join("current");
    match fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text.trim().to_owned()).filter(|v| !v.is_empty() && !v.contains('/'))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).at(&path),
    }
}

/// Removes the entries of `dir` that `pred(name, path)` picks, ignoring
/// failures: this only reclaims space.
pub(super) fn remove_matching(dir: &Path, mut pred: impl FnMut(&str, &Path) -> bool) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if pred(&name, &path) {
            let _ = match entry.file_type() {
                Ok(t) if t.is_dir() => fs::remove_dir_all(&path),
                _ => fs::remove_file(&path),
            };
        }
    }
}

/// A 64-bit key for cache file names. SipHash with fixed keys is stable for
/// a given build of std; a new Rust release may change it, which costs one
/// rebuild of the cached images.
pub(crate) fn hash_hex(feed: impl FnOnce(&mut DefaultHasher)) -> String {
    let mut h = DefaultHasher::new();
    feed(&mut h);
    format!("{:016x}", h.finish())
}

/// What tells one file from another at the same path: its identity and
/// ctime too, not only size and mtime, as a package upgrade may put a
/// same-sized file with a preserved mtime at the same path.
pub(crate) fn file_stamp(meta: &fs::Metadata) -> String {
    use std::os::unix::fs::MetadataExt;
    format!(
        "{} {} {} {}.{:09} {}.{:09}",
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    )
}

/// Takes an exclusive lock on `path` (created if needed), held until the
/// returned file is dropped, so that only one process builds a cache entry
/// while the others wait and then reuse it.
pub(super) fn lock(path: &Path) -> Result<File, ImageError> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .at(path)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(io::Error::from)
        .at(path)?;
    Ok(file)
}

/// Writes `path` through a temporary file in the same directory and a
/// rename, so readers see either the old file or the whole new one.
pub(super) fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), ImageError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut tmp_name = OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or_default());
    tmp_name.push(format!(
        ".tmp{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut file = File::create(&tmp)?;
        write(&mut file)?;
        // Durable before it is visible, so a crash cannot leave an empty
        // file under the final name.
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.at(path)
}
