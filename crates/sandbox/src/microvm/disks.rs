//! A microVM's disks when its root is an image: the image's flat root
//! (made once per image by `cordon_image::flat`, shared read-only by every
//! guest that runs it) and a writable layer of the guest's own, an empty
//! ext4 file in the store's `run/` as big as the disk budget. The file's
//! size is a hard bound on what the guest can write there; its allocated
//! blocks are what the host's disk watcher counts, and the guest's
//! discards free them.

use std::path::{Path, PathBuf};

use cordon_image::flat::Flat;

use crate::backend::{WritableLayer, utf8};
use crate::config::RootImage;
use crate::error::{Error, Result};
use crate::layout::{IMAGE_DISK, UPPER_DISK};

/// Without a disk budget the writable layer may fill what the store's file
/// system has free, between these bounds. The file is sparse: its size
/// costs nothing until the guest writes.
const MIN_UPPER: u64 = 1 << 30;
const MAX_UPPER: u64 = 1 << 40;

pub(super) struct ImageDisks {
    flat: Flat,
    layer: WritableLayer,
    upper: PathBuf,
}

impl ImageDisks {
    /// The flat root of `image` (made now if the store has none: seconds
    /// for a large image, once) and a fresh writable layer of `budget`
    /// bytes (none: what the store's file system has free), or a copy of
    /// the image's `upper_from` (a fork's: its parent's size).
    pub(super) async fn prepare(image: &RootImage, budget: Option<u64>) -> Result<ImageDisks> {
        let image = image.clone();
        tokio::task::spawn_blocking(move || {
            let flat = cordon_image::flat::flat_root(&image.flat, &image.layers)?;
            let layer = WritableLayer::new(&image)?;
            let upper = match &image.upper_from {
                Some(from) => layer.copy_disk(from)?,
                None => {
                    let size = budget.unwrap_or_else(|| free_space(layer.dir()));
                    layer.make_disk(size, UPPER_DISK)?
                }
            };
            Ok(ImageDisks { flat, layer, upper })
        })
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?
    }

    /// The disks another process left for a guest saved to disk (see
    /// `Record`), taken up again: the flat root of `image` (made again if
    /// it was pruned meanwhile) and the writable layer at `layer`.
    pub(super) async fn adopt(image: &RootImage, layer: &Path) -> Result<ImageDisks> {
        let image = image.clone();
        let layer = layer.to_path_buf();
        tokio::task::spawn_blocking(move || {
            let flat = cordon_image::flat::flat_root(&image.flat, &image.layers)?;
            let layer = WritableLayer::adopt(&image, &layer)?;
            let upper = layer.dir().join(crate::backend::DISK_FILE);
            if !upper.is_file() {
                return Err(Error::Config(format!(
                    "the sandbox's writable disk {} is gone",
                    upper.display()
                )));
            }
            Ok(ImageDisks { flat, layer, upper })
        })
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))?
    }

    /// Whether the writable layer stays for another process (see
    /// [`WritableLayer::set_kept`]).
    pub(super) fn set_kept(&mut self, kept: bool) {
        self.layer.set_kept(kept);
    }

    /// Marks the writable layer as a saved guest's (see
    /// [`WritableLayer::mark_saved`]).
    pub(super) fn mark_saved(&self, saved: bool) -> std::io::Result<()> {
        self.layer.mark_saved(saved)
    }

    /// The directory the disk watcher counts with the workspace.
    pub(super) fn writable_layer(&self) -> &Path {
        self.layer.dir()
    }

    /// The files QEMU reads and the one it writes.
    pub(super) fn host_files(&self) -> (PathBuf, PathBuf) {
        (self.flat.path().to_path_buf(), self.upper.clone())
    }

    /// QEMU's arguments for the two disks, each known to the guest by its
    /// serial.
    pub(super) fn qemu_args(&self) -> Result<Vec<String>> {
        let flat = drive_path(self.flat.path())?;
        let upper = drive_path(&self.upper)?;
        Ok(vec![
            "-drive".into(),
            format!("file={flat},if=none,id=image,format=raw,readonly=on"),
            "-device".into(),
            format!("virtio-blk-device,drive=image,serial={IMAGE_DISK}"),
            "-drive".into(),
            format!("file={upper},if=none,id=upper,format=raw,discard=unmap,detect-zeroes=unmap"),
            "-device".into(),
            format!("virtio-blk-device,drive=upper,serial={UPPER_DISK}"),
        ])
    }
}

/// A path as QEMU's option syntax takes it: a comma would end the value.
pub(super) fn drive_path(p: &Path) -> Result<String> {
    let s = utf8(p, "disk")?;
    if s.contains(',') {
        return Err(Error::Config(format!(
            "the microvm backend cannot use the disk {s}: a comma in the path (move the image \
             store, CORDON_IMAGE_STORE)"
        )));
    }
    Ok(s)
}

/// What the file system holding `dir` has free for this user, within
/// [`MIN_UPPER`] and [`MAX_UPPER`].
fn free_space(dir: &Path) -> u64 {
    rustix::fs::statvfs(dir)
        .map(|s| s.f_bavail.saturating_mul(s.f_frsize))
        .unwrap_or(MIN_UPPER)
        .clamp(MIN_UPPER, MAX_UPPER)
}
