//! The new mount API where rustix does not wrap it yet: mount attributes
//! set with `mount_setattr`, on a path or on a detached tree, and trees
//! attached with `move_mount`; and the `O_PATH` handles that mounts are
//! made from, opened without following links.

use std::ffi::CString;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use super::error::{Result, SetupError};

/// An `O_PATH` handle on `path`, refusing a symbolic link on any part of it.
pub(crate) fn open_no_links(path: &str) -> rustix::io::Result<OwnedFd> {
    use rustix::fs::ResolveFlags;
    rustix::fs::openat2(
        rustix::fs::CWD,
        path,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
}

/// Mounts the detached tree `tree` (from `open_tree`) on the file or
/// directory `target` refers to, with the mount attributes `attrs`.
pub(super) fn attach(tree: &OwnedFd, target: &OwnedFd, attrs: u64) -> rustix::io::Result<()> {
    use rustix::mount::MoveMountFlags;
    set_attrs_fd(tree, attrs).map_err(|e| Errno::from_raw_os_error(e.errno))?;
    rustix::mount::move_mount(
        tree,
        "",
        target,
        "",
        MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH | MoveMountFlags::MOVE_MOUNT_T_EMPTY_PATH,
    )
}

// Not yet wrapped by rustix; stable ABI since Linux 5.12.
pub(crate) const MOUNT_ATTR_RDONLY: u64 = 0x1;
pub(crate) const MOUNT_ATTR_NOSUID: u64 = 0x2;
pub(crate) const MOUNT_ATTR_NODEV: u64 = 0x4;
const AT_RECURSIVE: libc::c_uint = 0x8000;

#[repr(C)]
pub(crate) struct MountAttr {
    pub attr_set: u64,
    pub attr_clr: u64,
    pub propagation: u64,
    pub userns_fd: u64,
}

/// Attributes for [`set_attrs`].
pub(super) const RW: u64 = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
pub(super) const RO: u64 = RW | MOUNT_ATTR_RDONLY;

/// Read-only for device-node binds: writing to a device still works, but
/// its inode (mode, owner, times), which is the host's, cannot change.
pub(super) const RO_DEVICE: u64 = MOUNT_ATTR_NOSUID | MOUNT_ATTR_RDONLY;

/// Sets mount attributes on the mount at `target` (and, if `recursive`,
/// every mount beneath it). `mount_setattr` keeps flags the kernel locked
/// on mounts inherited from the host, which a classic remount would have to
/// repeat by hand or fail with EPERM.
pub(super) fn set_attrs(target: &Path, recursive: bool, set: u64) -> Result<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let path = CString::new(target.as_os_str().as_encoded_bytes())
        .map_err(|_| SetupError::new("path with NUL", Errno::INVAL))?;
    let flags = if recursive { AT_RECURSIVE } else { 0 };
    // SAFETY: valid NUL-terminated path and a properly sized, initialised struct.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            path.as_ptr(),
            flags,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        let errno =
            Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        return Err(SetupError::new(
            format!("set mount attributes on {}", target.display()),
            errno,
        ));
    }
    Ok(())
}

/// [`set_attrs`] on a detached mount (from `open_tree`).
fn set_attrs_fd(fd: &OwnedFd, set: u64) -> Result<()> {
    let attr = MountAttr {
        attr_set: set,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: a valid descriptor, an empty NUL-terminated path and a
    // properly sized, initialised struct.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    };
    if rc != 0 {
        let errno =
            Errno::from_raw_os_error(std::io::Error::last_os_error().raw_os_error().unwrap_or(0));
        return Err(SetupError::new("set mount attributes on a cover", errno));
    }
    Ok(())
}
