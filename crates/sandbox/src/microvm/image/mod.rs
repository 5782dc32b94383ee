//! Guest images for the microVM backend: the kernel, as an uncompressed
//! PVH-bootable `vmlinux`, and the initramfs holding the guest init and the
//! few kernel modules it loads.
//!
//! The kernel comes from the distribution's package ([`setup`], which needs
//! no root: `apt-get download` plus `dpkg-deb -x`) or from explicit paths
//! ([`find_kernel`]). Both are prepared once and cached, so starting a
//! sandbox only stats a few files. Every file in the cache is written under
//! a temporary name and renamed into place, under a lock, so concurrent
//! sandboxes never see a half-written one.

mod bytes;
mod cache;
mod cpio;
mod fetch;
mod initramfs;
mod kernel;
mod modules;
#[cfg(test)]
mod testutil;
mod tools;

use std::io;
use std::path::{Path, PathBuf};

pub use cache::cache_dir;
pub(crate) use cache::{file_stamp, hash_hex};
pub use fetch::setup;
pub use initramfs::{InitramfsSpec, initramfs};
pub use kernel::{Kernel, find_kernel};

/// Why a guest image cannot be provided.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(
        "no guest kernel in {cache}: run `cordon vm setup`, or set the `kernel` and `modules` settings"
    )]
    NoKernel { cache: PathBuf },
    /// `setup` cannot fetch the kernel on this host.
    #[error(
        "cannot fetch the guest kernel: {reason}. Set the `kernel` and `modules` settings to a kernel image (vmlinuz or vmlinux) and its modules directory instead"
    )]
    Unsupported { reason: String },
    #[error("`{tool}` is needed to {purpose} but was not found: install the {package} package")]
    MissingTool {
        tool: &'static str,
        package: &'static str,
        purpose: &'static str,
    },
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("{path}: not a usable guest kernel: {message}")]
    BadKernel { path: PathBuf, message: String },
    #[error(
        "no modules for kernel {version} (looked for {looked}): set the `modules` setting to its lib/modules/{version} directory"
    )]
    NoModules { version: String, looked: String },
    #[error("kernel module {name} is not in {dir}, nor built into the kernel")]
    ModuleNotFound { name: String, dir: PathBuf },
    #[error("{path}: not a usable kernel module: {message}")]
    BadModule { path: PathBuf, message: String },
    #[error("invalid initramfs content: {0}")]
    Spec(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Attaches the path an I/O error is about.
trait At<T> {
    fn at(self, path: &Path) -> Result<T, ImageError>;
}

impl<T> At<T> for io::Result<T> {
    fn at(self, path: &Path) -> Result<T, ImageError> {
        self.map_err(|source| ImageError::Io {
            path: path.to_owned(),
            source,
        })
    }
}
