//! The workspace's protected paths: hidden files covered with an empty
//! read-only file, read-only paths remounted read-only, and the
//! directories that hold them pinned so that they cannot be renamed away.

use std::fs;
use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use super::error::{Context, Result, SetupError};
use super::mount::{RO, RW, attach};

/// Covers each of `hidden` (relative to the workspace mounted at `ws`)
/// with an empty read-only file. The targets are opened beneath the
/// workspace without following links, and the cover is attached to that
/// descriptor, so a concurrent sandbox on the same workspace cannot
/// redirect it; the commands have no capability to unmount it.
pub(super) fn hide(stage: &Path, ws: &Path, hidden: &[String]) -> Result<()> {
    use rustix::fs::ResolveFlags;
    use rustix::mount::OpenTreeFlags;
    if hidden.is_empty() {
        return Ok(());
    }
    let empty = stage.join(".cordon-hidden");
    fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o444)
        .open(&empty)
        .ctx(|| "create the cover for hidden files".into())?;
    let ws_fd = rustix::fs::open(
        ws,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ctx(|| "open the workspace".into())?;
    for rel in hidden {
        let target = match rustix::fs::openat2(
            &ws_fd,
            rel.as_str(),
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_XDEV,
        ) {
            Ok(fd) => fd,
            // Gone since the host looked, or not a plain path: nothing
            // of the file is reachable under that name.
            Err(Errno::NOENT) => continue,
            Err(e) => return Err(SetupError::new(format!("open {rel} to hide it"), e)),
        };
        let st = rustix::fs::fstat(&target).ctx(|| format!("stat {rel}"))?;
        if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() {
            return Err(SetupError {
                what: format!("cannot hide {rel}: not a regular file"),
                errno: 0,
            });
        }
        let cover = rustix::mount::open_tree(
            rustix::fs::CWD,
            &empty,
            OpenTreeFlags::OPEN_TREE_CLONE | OpenTreeFlags::OPEN_TREE_CLOEXEC,
        )
        .ctx(|| "clone the cover for hidden files".into())?;
        attach(&cover, &target, RO).ctx(|| format!("hide {rel}"))?;
    }
    // The covers keep the inode; its name must not show at the root.
    fs::remove_file(&empty).ctx(|| "remove the cover's name".into())?;
    Ok(())
}

/// Makes each of `read_only` (relative to the workspace mounted at `ws`)
/// read-only, by mounting it on itself, after pinning the directories that
/// lead to it below the workspace the same way (read-write): a mount point
/// cannot be renamed or removed, so `.git` cannot be moved aside and a new
/// one with a planted configuration put in its place. Paths are opened
/// beneath the workspace without following links.
pub(super) fn protect(ws: &Path, read_only: &[String]) -> Result<()> {
    if read_only.is_empty() {
        return Ok(());
    }
    let ws_fd = rustix::fs::open(
        ws,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ctx(|| "open the workspace".into())?;
    for pin in &pins(read_only) {
        mount_on_itself(&ws_fd, pin, RW)?;
    }
    for rel in read_only {
        mount_on_itself(&ws_fd, Path::new(rel), RO)?;
    }
    Ok(())
}

/// The directories leading to each of `read_only` below the workspace,
/// each once, shallow first (a pin's own path must resolve before deeper
/// ones): what [`protect`], and a microVM's QEMU, mount on themselves.
pub(crate) fn pins(read_only: &[String]) -> Vec<PathBuf> {
    let mut pins = std::collections::BTreeSet::new();
    for rel in read_only {
        let mut dir = Path::new(rel).parent();
        while let Some(d) = dir.filter(|d| !d.as_os_str().is_empty()) {
            pins.insert(d.to_path_buf());
            dir = d.parent();
        }
    }
    let mut pins: Vec<PathBuf> = pins.into_iter().collect();
    pins.sort_by_key(|p| p.components().count());
    pins
}

/// Mounts `rel` (beneath `ws_fd`) on itself with `attrs`; missing: skipped.
fn mount_on_itself(ws_fd: &OwnedFd, rel: &Path, attrs: u64) -> Result<()> {
    use rustix::fs::ResolveFlags;
    use rustix::mount::OpenTreeFlags;
    let what = || rel.display().to_string();
    let fd = match rustix::fs::openat2(
        ws_fd,
        rel,
        OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS,
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Ok(()),
        Err(e) => return Err(SetupError::new(format!("open {} to protect it", what()), e)),
    };
    let tree = rustix::mount::open_tree(
        &fd,
        "",
        OpenTreeFlags::OPEN_TREE_CLONE
            | OpenTreeFlags::OPEN_TREE_CLOEXEC
            | OpenTreeFlags::AT_EMPTY_PATH,
    )
    .ctx(|| format!("clone {}", what()))?;
    attach(&tree, &fd, attrs).ctx(|| format!("protect {}", what()))
}
