//! Idmapped copies of the host paths a root-made sandbox binds.
//!
//! As root, a sandbox's processes run as a host uid and gid of their own
//! (see `counts`): what the kernel counts per host user (epoll watches, pipe
//! buffers, descriptors in flight) is then the sandbox's alone, and a
//! process that got out of every namespace would own nothing on the host.
//! Its files must still be the caller's: the workspace and the other binds
//! are mounted idmapped, so that the sandbox's root writes and reads them as
//! uid and gid 0 on disk.
//!
//! Making an idmapped mount takes `CAP_SYS_ADMIN` over the file system's
//! own user namespace (the host's), so this runs in the supervisor before it
//! leaves that namespace, with a throwaway user namespace holding the same
//! maps as the sandbox's will.

use std::collections::HashMap;
use std::io::Read;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::error::SetupError;
use super::ids::{IdMaps, write_maps};

type Result<T> = std::result::Result<T, SetupError>;

const OPEN_TREE_CLONE: libc::c_uint = 1;
const AT_RECURSIVE: libc::c_uint = 0x8000;
const MOUNT_ATTR_IDMAP: u64 = 0x0010_0000;

/// Detached, idmapped mounts of host paths, by path, waiting to be attached
/// where the sandbox's tree needs them; and plain handles on paths that
/// only the host's root may reach, opened before the supervisor left it.
#[derive(Default)]
pub struct Prepared {
    mounts: HashMap<String, (OwnedFd, bool)>,
}

impl Prepared {
    /// The handle prepared for `path`, if any, and whether it is a detached
    /// mount (else a plain `O_PATH` handle); each is used once.
    pub fn take(&mut self, path: &str) -> Option<(OwnedFd, bool)> {
        self.mounts.remove(path)
    }

    /// Takes the mounts `other` prepared as well.
    pub fn merge(&mut self, other: Prepared) {
        self.mounts.extend(other.mounts);
    }

    /// Keeps a detached copy of the tree at `path`, not idmapped (its files
    /// keep the host ids they have), for a path only the host's root may
    /// reach: a mount in the host's namespace cannot be bound from the
    /// sandbox's, a detached one can be attached there.
    pub fn clone_plain(&mut self, path: &str) -> Result<()> {
        let fd = detached(path).map_err(|e| SetupError::io(format!("open {path}"), e))?;
        self.mounts.insert(path.to_string(), (fd, true));
        Ok(())
    }
}

/// A host path to prepare; `required` ones (the workspace and writable
/// binds) must all succeed, or the sandbox keeps root's ids instead.
pub struct Wanted {
    pub path: String,
    pub required: bool,
}

/// Idmapped mounts of `wanted` for a sandbox whose ids are `ids` (0 inside
/// is a host uid and gid of its own); `None` when a required path's file
/// system cannot be idmapped (9p, NFS, FUSE and older kernels), and nothing
/// was changed.
pub fn prepare(ids: &IdMaps, wanted: &[Wanted]) -> Result<Option<Prepared>> {
    // A host where the ids cannot be mapped (cordon in a container's user
    // namespace) keeps root's ids, as on file systems without idmapping.
    let Ok(userns) = throwaway_userns(ids) else {
        return Ok(None);
    };
    let mut prepared = Prepared::default();
    // Most binds of a host-rooted sandbox are entries of /etc: they are
    // cloned from one idmapped copy of it (the clone keeps the idmap), one
    // `mount_setattr` in all rather than one each. Without that copy (a
    // link on the way, a file system under /etc that cannot be idmapped),
    // each is made on its own, as every other path is.
    let mut etc: Option<Option<OwnedFd>> = None;
    for w in wanted {
        let from_etc = w.path.strip_prefix("/etc/").and_then(|entry| {
            let copy = etc.get_or_insert_with(|| idmapped("/etc", &userns).ok());
            from_copy(copy, entry)
        });
        let made = from_etc.map_or_else(|| idmapped(&w.path, &userns), Ok);
        match made {
            Ok(fd) => {
                prepared.mounts.insert(w.path.clone(), (fd, true));
            }
            Err(_) if !w.required => {}
            Err(_) => return Ok(None),
        }
    }
    Ok(Some(prepared))
}

/// A user namespace with the maps `ids`, held by descriptor only.
fn throwaway_userns(ids: &IdMaps) -> Result<OwnedFd> {
    super::counts::with_light_helper(
        "start the idmap namespace's helper",
        |done, ready| {
            // SAFETY: a system call in the helper, which is its own thread
            // group and shares no file system information.
            if unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWUSER) }
                .is_ok()
            {
                let _ = rustix::io::write(ready, &[1]);
                // Until the parent holds the namespace (EOF).
                let _ = rustix::io::read(done, &mut [0u8]);
            }
        },
        |_done, mut ready, pid| {
            let mut b = [0u8];
            if !matches!(ready.read(&mut b), Ok(1)) {
                return Err(SetupError {
                    what: "the idmap namespace's helper could not unshare".into(),
                    errno: 0,
                });
            }
            let dir = format!("/proc/{pid}");
            write_maps(&dir, ids)?;
            rustix::fs::open(
                format!("{dir}/ns/user"),
                rustix::fs::OFlags::RDONLY | rustix::fs::OFlags::CLOEXEC,
                rustix::fs::Mode::empty(),
            )
            .map_err(|e| SetupError::new("open the idmap namespace", e))
        },
    )
}

/// A detached copy of the tree at `path`, idmapped through `userns`. A
/// path with a link on it is refused: the host resolved the workspace's and
/// binds' (see `mount::open_no_links`), and a system path with one is bound
/// as it is, by its plain open.
fn idmapped(path: &str, userns: &OwnedFd) -> std::io::Result<OwnedFd> {
    let fd = detached(path)?;
    let attr = super::mount::MountAttr {
        attr_set: MOUNT_ATTR_IDMAP,
        attr_clr: 0,
        propagation: 0,
        userns_fd: userns.as_raw_fd() as u64,
    };
    // SAFETY: mount_setattr on our detached tree with a valid attr struct.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            fd.as_raw_fd(),
            c"".as_ptr(),
            libc::AT_EMPTY_PATH as libc::c_uint | AT_RECURSIVE,
            &attr as *const super::mount::MountAttr,
            std::mem::size_of::<super::mount::MountAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// `entry` cloned out of the idmapped copy of /etc, if there is one and it
/// can be: `None` sends the caller to the entry's own copy.
fn from_copy(copy: &mut Option<OwnedFd>, entry: &str) -> Option<OwnedFd> {
    match beneath(copy.as_ref()?, entry) {
        Ok(fd) => Some(fd),
        Err(e) => {
            // A kernel that clones no tree out of a detached one refuses
            // every entry alike: stop asking it.
            if e.raw_os_error() == Some(libc::EINVAL) {
                *copy = None;
            }
            None
        }
    }
}

/// A detached copy of the tree at `entry` beneath the detached tree `dir`,
/// with `dir`'s idmap; a link on the way is refused, as [`detached`] does.
fn beneath(dir: &OwnedFd, entry: &str) -> std::io::Result<OwnedFd> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let at = rustix::fs::openat2(
        dir,
        entry,
        OFlags::PATH | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    clone_tree(&at)
}

/// A detached copy of the tree at `path` (`open_tree` with
/// `OPEN_TREE_CLONE`), refusing a link on the path.
fn detached(path: &str) -> std::io::Result<OwnedFd> {
    clone_tree(&super::mount::open_no_links(path)?)
}

/// A detached copy of the tree `at` refers to.
fn clone_tree(at: &OwnedFd) -> std::io::Result<OwnedFd> {
    // SAFETY: open_tree on our descriptor; the result is a new descriptor.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_open_tree,
            at.as_raw_fd(),
            c"".as_ptr(),
            OPEN_TREE_CLONE
                | libc::O_CLOEXEC as libc::c_uint
                | AT_RECURSIVE
                | libc::AT_EMPTY_PATH as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a descriptor we now own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}
