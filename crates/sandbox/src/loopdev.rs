//! Loop devices through their ioctls (linux/loop.h): mounting an ext4
//! image file (a workspace's volume, a native image sandbox's writable
//! layer) through one, and finding the one it is attached to.

use std::ffi::CStr;
use std::fs::File;
use std::io::{Error, Result};
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use rustix::fs::OFlags;
use rustix::ioctl::{Ioctl, IoctlOutput, Opcode};
use rustix::mount::MountFlags;

/// `e` with what was being done.
fn ctx(what: impl Into<String>) -> impl FnOnce(Error) -> Error {
    let what = what.into();
    move |e| Error::new(e.kind(), format!("{what}: {e}"))
}

/// Mounts the ext4 `image` on `target`, through the loop device it is
/// attached to if it is one (a volume unmounted while a sandbox still held
/// it), else a free one that detaches itself once unmounted. Never two:
/// two file systems over one image, each with its own cache, would corrupt
/// it.
pub(crate) fn mount_ext4(
    image: &File,
    target: &Path,
    flags: MountFlags,
    data: &CStr,
) -> Result<()> {
    let attached = match attached(image)? {
        Some(found) => found,
        None => attach_free(image)?,
    };
    mount_through(attached, target, flags, data)
}

/// Mounts the ext4 `image` on `target` through a free loop device that
/// detaches itself once unmounted. For an image this process has just
/// made, which no device can be attached to: looking for one costs a
/// look at every loop device on the host.
pub(crate) fn mount_new_ext4(
    image: &File,
    target: &Path,
    flags: MountFlags,
    data: &CStr,
) -> Result<()> {
    mount_through(attach_free(image)?, target, flags, data)
}

fn mount_through(
    (device, path): (rustix::fd::OwnedFd, String),
    target: &Path,
    flags: MountFlags,
    data: &CStr,
) -> Result<()> {
    // The device stays attached while `device` is open; the mount holds
    // it from then on, and it detaches itself when unmounted.
    rustix::mount::mount(path.as_str(), target, "ext4", flags, Some(data))
        .map_err(|e| ctx(format!("mount {path}"))(e.into()))?;
    drop(device);
    Ok(())
}

/// Whether `image` is attached to a loop device: its file system, if one
/// was mounted from it, is still alive somewhere (a loop device cordon
/// attaches detaches itself once the file system lets go of it).
pub(crate) fn is_attached(image: &File) -> Result<bool> {
    attached(image).map(|found| found.is_some())
}

/// The loop device `image` is attached to, open, and its path.
fn attached(image: &File) -> Result<Option<(rustix::fd::OwnedFd, String)>> {
    let meta = image.metadata().map_err(ctx("stat the image"))?;
    let entries = std::fs::read_dir("/sys/block").map_err(ctx("list the block devices"))?;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(n) = name
            .to_str()
            .and_then(|n| n.strip_prefix("loop"))
            .filter(|n| n.bytes().all(|b| b.is_ascii_digit()))
        else {
            continue;
        };
        let path = format!("/dev/loop{n}");
        let Ok(device) = rustix::fs::open(
            path.as_str(),
            OFlags::RDWR | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        ) else {
            continue;
        };
        // SAFETY: LOOP_GET_STATUS64 writes a `struct loop_info64`.
        let status = unsafe {
            rustix::ioctl::ioctl(
                &device,
                rustix::ioctl::Getter::<LOOP_GET_STATUS64, LoopInfo64>::new(),
            )
        };
        // ENXIO: no file attached.
        if let Ok(info) = status
            && info.lo_inode == meta.ino()
            && info.lo_device == meta.dev()
        {
            return Ok(Some((device, path)));
        }
    }
    Ok(None)
}

/// Attaches `image` to a free loop device that detaches itself once
/// unmounted: the device, open, and its path.
fn attach_free(image: &File) -> Result<(rustix::fd::OwnedFd, String)> {
    let control = rustix::fs::open(
        "/dev/loop-control",
        OFlags::RDWR | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )
    .map_err(|e| ctx("open /dev/loop-control")(e.into()))?;
    // Another process may take the device between asking and configuring.
    let mut tries = 0;
    loop {
        tries += 1;
        // SAFETY: LOOP_CTL_GET_FREE takes no argument and returns a number.
        let n = unsafe { rustix::ioctl::ioctl(&control, GetFree) }
            .map_err(|e| ctx("find a free loop device")(e.into()))?;
        let path = format!("/dev/loop{n}");
        let device = rustix::fs::open(
            path.as_str(),
            OFlags::RDWR | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )
        .map_err(|e| ctx(format!("open {path}"))(e.into()))?;
        let config = LoopConfig {
            fd: image.as_raw_fd() as u32,
            info: LoopInfo64 {
                lo_flags: LO_FLAGS_AUTOCLEAR,
                ..LoopInfo64::default()
            },
            ..LoopConfig::default()
        };
        // SAFETY: LOOP_CONFIGURE reads a `struct loop_config`, which
        // `LoopConfig` lays out.
        match unsafe {
            rustix::ioctl::ioctl(
                &device,
                rustix::ioctl::Setter::<LOOP_CONFIGURE, LoopConfig>::new(config),
            )
        } {
            Ok(()) => return Ok((device, path)),
            Err(rustix::io::Errno::BUSY) if tries < 16 => continue,
            Err(e) => return Err(ctx(format!("configure {path}"))(e.into())),
        }
    }
}

/// `LOOP_CONFIGURE` (linux/loop.h): attach a file, set flags, at once.
const LOOP_CONFIGURE: Opcode = 0x4C0A;
/// `LOOP_GET_STATUS64`: what a loop device is attached to.
const LOOP_GET_STATUS64: Opcode = 0x4C05;
/// `LOOP_CTL_GET_FREE`: the number of a free loop device.
const LOOP_CTL_GET_FREE: Opcode = 0x4C82;
/// `LO_FLAGS_AUTOCLEAR`: detach on last close.
const LO_FLAGS_AUTOCLEAR: u32 = 4;

/// `struct loop_info64`.
#[repr(C)]
#[derive(Clone, Copy)]
struct LoopInfo64 {
    lo_device: u64,
    lo_inode: u64,
    lo_rdevice: u64,
    lo_offset: u64,
    lo_sizelimit: u64,
    lo_number: u32,
    lo_encrypt_type: u32,
    lo_encrypt_key_size: u32,
    lo_flags: u32,
    lo_file_name: [u8; 64],
    lo_crypt_name: [u8; 64],
    lo_encrypt_key: [u8; 32],
    lo_init: [u64; 2],
}

impl Default for LoopInfo64 {
    fn default() -> Self {
        LoopInfo64 {
            lo_device: 0,
            lo_inode: 0,
            lo_rdevice: 0,
            lo_offset: 0,
            lo_sizelimit: 0,
            lo_number: 0,
            lo_encrypt_type: 0,
            lo_encrypt_key_size: 0,
            lo_flags: 0,
            lo_file_name: [0; 64],
            lo_crypt_name: [0; 64],
            lo_encrypt_key: [0; 32],
            lo_init: [0; 2],
        }
    }
}

/// `struct loop_config`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct LoopConfig {
    fd: u32,
    block_size: u32,
    info: LoopInfo64,
    reserved: [u64; 8],
}

const _: () = assert!(std::mem::size_of::<LoopInfo64>() == 232);
const _: () = assert!(std::mem::size_of::<LoopConfig>() == 304);

/// `LOOP_CTL_GET_FREE`, whose answer is the ioctl's return value.
struct GetFree;

// SAFETY: the ioctl takes no argument and its output is the return value.
unsafe impl Ioctl for GetFree {
    type Output = u32;
    const IS_MUTATING: bool = false;

    fn opcode(&self) -> Opcode {
        LOOP_CTL_GET_FREE
    }

    fn as_ptr(&mut self) -> *mut std::ffi::c_void {
        std::ptr::null_mut()
    }

    unsafe fn output_from_ptr(
        out: IoctlOutput,
        _: *mut std::ffi::c_void,
    ) -> rustix::io::Result<u32> {
        Ok(out as u32)
    }
}
