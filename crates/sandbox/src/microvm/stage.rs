//! What a microVM is given of the host, staged in the cache: a copy of the
//! allowed part of /etc, cordon's disk (the supervisor and what it links),
//! the layout of the host's system directories, and the per-sandbox run
//! directory.

use std::path::{Path, PathBuf};

use crate::backend::left_by_dead_process;
use crate::error::{Error, Result};
#[cfg(doc)]
use crate::layout::GUEST_BIN;
use crate::layout::{ETC_ALLOW, GUEST_LIBS, GUEST_LOADER, GUEST_SUPERVISOR, SYSTEM_DIRS};

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

/// The guest's /etc for a sandbox that adds nothing of its own to it: one
/// copy ([`stage_etc`]) in the cache per state of the host's allowed
/// entries, shared read-only by every guest, instead of a copy per
/// sandbox (about 100 ms of a start: hundreds of small files). The state
/// is every entry's identity on disk (a package that changes one makes a
/// new copy); copies unused for [`STAGED_UNUSED`] are removed.
pub(super) fn shared_etc(cache: &Path) -> Result<PathBuf> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for name in ETC_ALLOW {
        name.hash(&mut h);
        stamp_tree(&Path::new("/etc").join(name), &mut h, 0);
    }
    let all = cache.join("etc");
    let dir = all.join(format!("{:016x}", h.finish()));
    if !dir.is_dir() {
        std::fs::create_dir_all(&all)?;
        let tmp = tempfile::Builder::new()
            .prefix(".staging-")
            .tempdir_in(&all)?;
        stage_etc(tmp.path())?;
        // Another start may have placed the same copy meanwhile: either
        // one will do.
        if std::fs::rename(tmp.path(), &dir).is_ok() {
            std::mem::forget(tmp);
        }
    }
    let _ = std::fs::File::open(&dir).and_then(|d| d.set_modified(std::time::SystemTime::now()));
    prune_staged(&all, &dir, STAGED_UNUSED);
    Ok(dir)
}

/// Hashes the identity of `path` and of what is below it, as [`copy_tree`]
/// walks it.
fn stamp_tree(path: &Path, h: &mut impl std::hash::Hasher, depth: usize) {
    use std::hash::Hash;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return;
    };
    super::image::file_stamp(&meta).hash(h);
    if meta.is_dir() && depth < 32 {
        let Ok(entries) = std::fs::read_dir(path) else {
            return;
        };
        let mut names: Vec<_> = entries.flatten().map(|e| e.file_name()).collect();
        names.sort();
        for name in names {
            name.hash(h);
            stamp_tree(&path.join(&name), h, depth + 1);
        }
    }
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

/// cordon's disk for a guest: a read-only ext4 file in the cache holding
/// the supervisor, the dynamic loader and the libraries it links, named
/// as [`GUEST_BIN`]'s files (see layout.rs), made once per supervisor
/// binary. The guest starts its supervisor from it before any share is
/// mounted, so that a snapshot can hold the supervisor running.
/// Returns the disk's path, which names the supervisor it holds.
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
    let disk = dir.join(DISK);
    if !disk.is_file() {
        std::fs::create_dir_all(&dir)?;
        let tree = tempfile::Builder::new().prefix(".tree-").tempdir_in(&dir)?;
        fill_tree(tree.path(), supervisor)?;
        cordon_image::flat::ext4_of_dir(tree.path(), &disk, "cordon-bin")
            .map_err(|e| Error::Config(format!("cordon's disk for a microVM: {e}")))?;
    }
    // Marked used now; disks unused for a while go (each rebuild or
    // upgrade of cordon makes a new one: 127 copies filled 11 GiB).
    let _ = std::fs::File::open(&dir).and_then(|d| d.set_modified(std::time::SystemTime::now()));
    prune_staged(&cache.join("bin"), &dir, STAGED_UNUSED);
    Ok(disk)
}

/// The disk's file name in its directory.
const DISK: &str = "bin.ext4";

/// The loader of x86-64 programs linked with glibc, which every such
/// program names, and which lists what a program links.
const LOADER: &str = "/lib64/ld-linux-x86-64.so.2";

/// Puts into `tree` what [`GUEST_BIN`] holds: `supervisor`, the loader and
/// the libraries it links, as the host's loader finds them. All of them
/// are the host's own files, never a workspace's.
fn fill_tree(tree: &Path, supervisor: &Path) -> Result<()> {
    let copy = |from: &Path, to: &Path| -> Result<()> {
        std::fs::copy(from, to).map_err(|e| {
            Error::Io(std::io::Error::new(
                e.kind(),
                format!("copying {} for a microVM: {e}", from.display()),
            ))
        })?;
        Ok(())
    };
    // Linked where it can be: mke2fs copies it again, and a release
    // cordon is hundreds of MB with its debug information.
    if std::fs::hard_link(supervisor, tree.join(GUEST_SUPERVISOR)).is_err() {
        copy(supervisor, &tree.join(GUEST_SUPERVISOR))?;
    }
    copy(Path::new(LOADER), &tree.join(GUEST_LOADER))?;
    let libs = tree.join(GUEST_LIBS);
    std::fs::create_dir(&libs)?;
    for (name, path) in linked_libraries(supervisor)? {
        copy(&path, &libs.join(name))?;
    }
    Ok(())
}

/// The shared libraries `program` links, as (name, host path): what the
/// host's loader lists for it (it maps them without running the program).
/// A static program links none.
fn linked_libraries(program: &Path) -> Result<Vec<(String, PathBuf)>> {
    let out = std::process::Command::new(LOADER)
        .arg("--list")
        .arg(program)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .output()
        .map_err(|e| Error::Spawn {
            path: LOADER.into(),
            source: e,
        })?;
    if !out.status.success() {
        // The loader refuses a static program; the guest runs it as it is.
        return Ok(Vec::new());
    }
    Ok(parse_list(&String::from_utf8_lossy(&out.stdout)))
}

/// The `name => /path (address)` lines of the loader's list; the loader's
/// own line and the kernel's vDSO have no `=>`.
fn parse_list(list: &str) -> Vec<(String, PathBuf)> {
    list.lines()
        .filter_map(|l| {
            let (name, rest) = l.trim().split_once(" => ")?;
            let path = rest.split(" (").next()?.trim();
            let name = Path::new(name).file_name()?.to_str()?;
            path.starts_with('/')
                .then(|| (name.to_string(), PathBuf::from(path)))
        })
        .collect()
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
    fn staged_disks_unused_for_long_are_removed() {
        let cache = tempfile::tempdir().unwrap();
        let bin = cache.path().join("bin");
        let (old, recent) = (bin.join("old"), bin.join("recent"));
        for d in [&old, &recent] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join(DISK), "x").unwrap();
        }
        let long_ago = std::time::SystemTime::now() - STAGED_UNUSED * 2;
        std::fs::File::open(&old)
            .unwrap()
            .set_modified(long_ago)
            .unwrap();
        // A static program links nothing; the disk holds it alone.
        let supervisor = cache.path().join("cordon-supervisor");
        std::fs::write(&supervisor, "not a program the loader takes").unwrap();
        let disk = stage_supervisor(cache.path(), &supervisor).unwrap();
        assert!(disk.is_file());
        assert!(!old.exists(), "an old disk stayed");
        assert!(recent.exists(), "a recent disk went");
        // Made once: a second start finds it.
        let made = std::fs::metadata(&disk).unwrap().modified().unwrap();
        assert_eq!(stage_supervisor(cache.path(), &supervisor).unwrap(), disk);
        assert_eq!(std::fs::metadata(&disk).unwrap().modified().unwrap(), made);
    }

    /// The shared /etc is made once and found again; a change to an
    /// allowed entry (a package upgrade) makes another.
    #[test]
    fn the_shared_etc_is_made_once_per_state_of_the_hosts() {
        let cache = tempfile::tempdir().unwrap();
        let first = shared_etc(cache.path()).unwrap();
        assert!(first.join("passwd").is_file());
        assert!(first.join("hosts").is_file());
        assert_eq!(shared_etc(cache.path()).unwrap(), first);
        let stamp = |root: &Path| {
            use std::hash::Hasher;
            let mut h = std::collections::hash_map::DefaultHasher::new();
            stamp_tree(root, &mut h, 0);
            h.finish()
        };
        let tree = tempfile::tempdir().unwrap();
        std::fs::create_dir(tree.path().join("certs")).unwrap();
        std::fs::write(tree.path().join("certs/a.pem"), "one").unwrap();
        let before = stamp(tree.path());
        assert_eq!(stamp(tree.path()), before);
        std::fs::write(tree.path().join("certs/a.pem"), "two!").unwrap();
        assert_ne!(stamp(tree.path()), before, "a changed file kept the stamp");
        let changed = stamp(tree.path());
        std::fs::write(tree.path().join("certs/b.pem"), "new").unwrap();
        assert_ne!(stamp(tree.path()), changed, "a new file kept the stamp");
    }

    #[test]
    fn the_disk_holds_what_the_supervisor_links() {
        let tree = tempfile::tempdir().unwrap();
        // This test's own binary links glibc as cordon does.
        fill_tree(tree.path(), &std::env::current_exe().unwrap()).unwrap();
        assert!(tree.path().join(GUEST_SUPERVISOR).is_file());
        assert!(tree.path().join(GUEST_LOADER).is_file());
        assert!(tree.path().join(GUEST_LIBS).join("libc.so.6").is_file());
    }

    #[test]
    fn the_loaders_list_is_read_by_name() {
        let list = "\tlinux-vdso.so.1 (0x00007ffd)\n\
                    \tlibgcc_s.so.1 => /lib/x86_64-linux-gnu/libgcc_s.so.1 (0x00007f01)\n\
                    \tlibc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x00007f02)\n\
                    \tlibmissing.so.1 => not found\n\
                    \t/lib64/ld-linux-x86-64.so.2 (0x00007f03)\n";
        assert_eq!(
            parse_list(list),
            vec![
                (
                    "libgcc_s.so.1".to_string(),
                    PathBuf::from("/lib/x86_64-linux-gnu/libgcc_s.so.1")
                ),
                (
                    "libc.so.6".to_string(),
                    PathBuf::from("/lib/x86_64-linux-gnu/libc.so.6")
                ),
            ]
        );
    }
}
