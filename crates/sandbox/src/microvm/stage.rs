//! What a microVM is given of the host, staged in the cache: a copy of the
//! allowed part of /etc, the supervisor binary, the layout of the host's
//! system directories, and the per-sandbox run directory.

use std::path::{Path, PathBuf};

use crate::backend::left_by_dead_process;
use crate::error::{Error, Result};
use crate::layout::{ETC_ALLOW, SYSTEM_DIRS};

/// Copies the allowed entries of the host's /etc into `dest`: the guest's
/// /etc is this copy, shared read-only, never the host's directory, which
/// holds secrets (shadow files, private keys) that QEMU could read.
pub(super) fn stage_etc(dest: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dest)?;
    for name in ETC_ALLOW {
        let src = Path::new("/etc").join(name);
        if std::fs::symlink_metadata(&src).is_ok() {
            copy_tree(&src, &dest.join(name))?;
        }
    }
    // The sandbox's own identity, as the native backend has: root, and
    // nobody for programs that want an unprivileged user.
    std::fs::write(
        dest.join("passwd"),
        "root:x:0:0:root:/tmp:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    )?;
    std::fs::write(dest.join("group"), "root:x:0:\nnogroup:x:65534:\n")?;
    std::fs::write(
        dest.join("hosts"),
        "127.0.0.1\tlocalhost cordon\n::1\tlocalhost\n",
    )?;
    Ok(())
}

/// Copies files, directories and symlinks (as links) below `src`; skips
/// what cannot be read rather than failing the sandbox.
fn copy_tree(src: &Path, dest: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(src)?;
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(src)?;
        std::os::unix::fs::symlink(target, dest)?;
    } else if meta.is_dir() {
        std::fs::create_dir_all(dest)?;
        for e in std::fs::read_dir(src)?.flatten() {
            let _ = copy_tree(&e.path(), &dest.join(e.file_name()));
        }
    } else if meta.is_file() {
        std::fs::copy(src, dest)?;
    }
    Ok(())
}

/// A copy of the supervisor binary in the cache, shared with the guest
/// read-only: sharing its directory would expose whatever lies beside it.
/// Hard-linked when the cache is on the same file system.
pub(super) fn stage_supervisor(cache: &Path, supervisor: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(supervisor).map_err(|e| Error::Spawn {
        path: supervisor.to_path_buf(),
        source: e,
    })?;
    let key = format!(
        "{:x}-{:x}-{:x}-{:x}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime()
    );
    let dir = cache.join("bin").join(key);
    let name = supervisor
        .file_name()
        .ok_or_else(|| Error::Config(format!("supervisor {}", supervisor.display())))?;
    let staged = dir.join(name);
    if !staged.is_file() {
        std::fs::create_dir_all(&dir)?;
        // A name of its own per attempt: sandboxes start concurrently.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(
            ".{}.{}-{n}",
            name.to_string_lossy(),
            std::process::id()
        ));
        if std::fs::hard_link(supervisor, &tmp).is_err() {
            std::fs::copy(supervisor, &tmp)?;
        }
        std::fs::rename(&tmp, &staged)?;
    }
    // Marked used now; copies of binaries unused for a while go (each
    // rebuild or upgrade of cordon stages a new one, and a hard link keeps
    // a replaced binary's blocks: 127 of them filled 11 GiB).
    let _ = std::fs::File::open(&dir).and_then(|d| d.set_modified(std::time::SystemTime::now()));
    prune_staged(&cache.join("bin"), &dir, STAGED_UNUSED);
    Ok(dir)
}

/// How long a staged supervisor may go unused before it is removed: a
/// microVM started from it long ago still runs from its open files.
const STAGED_UNUSED: std::time::Duration = std::time::Duration::from_secs(2 * 24 * 3600);

/// Removes the staged copies in `bin` other than `keep` not used for `unused`.
fn prune_staged(bin: &Path, keep: &Path, unused: std::time::Duration) {
    let Ok(entries) = std::fs::read_dir(bin) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let old = e
            .metadata()
            .ok()
            .filter(|m| m.is_dir())
            .and_then(|m| m.modified().ok())
            .and_then(|t| t.elapsed().ok())
            .is_some_and(|age| age > unused);
        if old && path != keep {
            // The cache is cordon's own; remove_dir_all does not follow links.
            if let Err(err) = std::fs::remove_dir_all(&path) {
                tracing::debug!("cannot remove {}: {err}", path.display());
            }
        }
    }
}

/// Host top-level system entries: merged-/usr symlinks go into the
/// initramfs, real directories become read-only shares.
pub(super) fn system_layout() -> (Vec<(String, String)>, Vec<String>) {
    let mut links = Vec::new();
    let mut shares = Vec::new();
    for name in SYSTEM_DIRS {
        let path = Path::new("/").join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(t) = std::fs::read_link(&path) {
                    links.push((name.to_string(), t.to_string_lossy().into_owned()));
                }
            }
            Ok(m) if m.is_dir() => shares.push(name.to_string()),
            _ => {}
        }
    }
    (links, shares)
}

/// A run directory not yet handed to a [`VmLifecycle`](super::VmLifecycle): removed on drop.
pub(super) struct RunDir(pub(super) Option<PathBuf>);

impl RunDir {
    pub(super) fn keep(mut self) -> PathBuf {
        self.0.take().expect("kept once")
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A new per-sandbox directory, `<cache>/run/<pid>-<n>`. The first call
/// in a process also removes those of cordon processes that died without
/// removing their own (SIGKILL leaves them).
pub(super) fn run_dir(cache: &Path) -> Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let runs = cache.join("run");
    SWEPT.call_once(|| sweep_run_dirs(&runs));
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = runs.join(format!("{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Removes the run directories of processes that no longer exist (see
/// [`left_by_dead_process`]).
fn sweep_run_dirs(runs: &Path) {
    let Ok(entries) = std::fs::read_dir(runs) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if name.to_str().is_some_and(left_by_dead_process) {
            tracing::debug!(
                "removing {}, left by a cordon that died",
                e.path().display()
            );
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn staged_copies_unused_for_long_are_removed() {
        let cache = tempfile::tempdir().unwrap();
        let bin = cache.path().join("bin");
        let (old, recent) = (bin.join("old"), bin.join("recent"));
        for d in [&old, &recent] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("cordon"), "x").unwrap();
        }
        let long_ago = std::time::SystemTime::now() - STAGED_UNUSED * 2;
        std::fs::File::open(&old)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        let supervisor = cache.path().join("cordon-supervisor");
        std::fs::write(&supervisor, "binary").unwrap();
        let kept = stage_supervisor(cache.path(), &supervisor).unwrap();
        assert!(kept.join("cordon-supervisor").is_file());
        assert!(!old.exists(), "an old copy stayed");
        assert!(recent.exists(), "a recent copy went");
    }
}
