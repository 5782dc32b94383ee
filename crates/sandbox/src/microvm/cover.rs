//! Hidden and read-only workspace files for a microVM
//! ([`crate::config::SandboxConfig::hidden`], [`crate::config::SandboxConfig::read_only`]).
//!
//! The guest's root could unmount anything its supervisor mounted, so the
//! files are hidden where the guest cannot reach: QEMU starts in a mount
//! namespace of its own (inside a user namespace of its own when cordon is
//! not root) in which an empty read-only file is mounted over each of them.
//! Its 9p server then serves the cover, never the file. The mounts are made
//! in the forked child, after it entered its namespace (a descriptor opened
//! before would name the host's mount, where the cover must not go), with
//! `openat2` refusing any symbolic link on the way, and before Landlock
//! (which forbids mounting) and the seccomp filter (which forbids
//! unmounting).

use std::ffi::CString;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use crate::error::{Error, Result};
use crate::supervisor::mount::{MOUNT_ATTR_NODEV, MOUNT_ATTR_NOSUID, MOUNT_ATTR_RDONLY, MountAttr};

/// What the child needs to cover the hidden files, prepared before fork.
#[derive(Clone)]
pub(super) struct Covers {
    /// The empty read-only file mounted over each target.
    cover: CString,
    /// The files to hide, by absolute path under the canonical workspace.
    targets: Vec<CString>,
    /// Paths mounted on themselves, in order: pinned directories
    /// (read-write), then the read-only paths, with their attributes.
    self_mounts: Vec<(CString, u64)>,
    /// Identity maps for the child's own user namespace, or None when
    /// cordon is root and a mount namespace alone will do.
    maps: Option<(CString, CString)>,
}

// Stable kernel ABI (Linux 5.2 and 5.12); libc has no constants for them.
const OPEN_TREE_CLONE: libc::c_uint = 1;
const MOVE_MOUNT_F_EMPTY_PATH: libc::c_uint = 0x4;
const MOVE_MOUNT_T_EMPTY_PATH: libc::c_uint = 0x40;

const RESOLVE_NO_MAGICLINKS: u64 = 0x02;
const RESOLVE_NO_SYMLINKS: u64 = 0x04;

#[repr(C)]
struct OpenHow {
    flags: u64,
    mode: u64,
    resolve: u64,
}

impl Covers {
    /// Opens `hidden` (relative to the canonical `workspace`) and creates
    /// the cover in `run_dir`; None when there is nothing to hide.
    pub(super) fn prepare(
        workspace: &str,
        hidden: &[String],
        read_only: &[String],
        run_dir: &Path,
    ) -> Result<Option<Covers>> {
        if hidden.is_empty() && read_only.is_empty() {
            return Ok(None);
        }
        let cpath = |rel: &Path| {
            CString::new(
                Path::new(workspace)
                    .join(rel)
                    .as_os_str()
                    .as_encoded_bytes(),
            )
            .map_err(|_| Error::Config(format!("{}: a NUL in its path", rel.display())))
        };
        // As the native supervisor does (supervisor/protect.rs): directories
        // leading to a read-only path are pinned first.
        let rw = MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV;
        let mut self_mounts = Vec::new();
        for p in &crate::supervisor::protect::pins(read_only) {
            self_mounts.push((cpath(p)?, rw));
        }
        for rel in read_only {
            self_mounts.push((cpath(Path::new(rel))?, rw | MOUNT_ATTR_RDONLY));
        }
        let mut targets = Vec::new();
        for rel in hidden {
            let path = Path::new(workspace).join(rel);
            match std::fs::symlink_metadata(&path) {
                Ok(m) if m.is_file() => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Ok(_) => {
                    return Err(Error::Config(format!(
                        "cannot hide {rel}: not a regular file"
                    )));
                }
                Err(e) => return Err(Error::Config(format!("cannot hide {rel}: {e}"))),
            }
            targets.push(
                CString::new(path.as_os_str().as_encoded_bytes())
                    .map_err(|_| Error::Config(format!("cannot hide {rel}: a NUL in its path")))?,
            );
        }
        if targets.is_empty() && self_mounts.is_empty() {
            return Ok(None);
        }
        let cover = run_dir.join("hidden-cover");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o444)
            .open(&cover)?;
        let cover = CString::new(cover.as_os_str().as_encoded_bytes())
            .map_err(|_| Error::Config("run directory path with NUL".into()))?;
        let uid = rustix::process::geteuid().as_raw();
        let gid = rustix::process::getegid().as_raw();
        let maps = (uid != 0).then(|| {
            (
                CString::new(format!("{uid} {uid} 1\n")).expect("no NUL"),
                CString::new(format!("{gid} {gid} 1\n")).expect("no NUL"),
            )
        });
        Ok(Some(Covers {
            cover,
            targets,
            self_mounts,
            maps,
        }))
    }

    /// In the forked child, before exec: a mount namespace of its own with
    /// the covers in place.
    ///
    /// # Safety
    /// Only async-signal-safe system calls on data prepared before fork.
    pub(super) unsafe fn apply(&self) -> std::io::Result<()> {
        let check = |rc: libc::c_long| {
            if rc < 0 {
                Err(std::io::Error::last_os_error())
            } else {
                Ok(rc)
            }
        };
        unsafe {
            match &self.maps {
                None => check(libc::unshare(libc::CLONE_NEWNS).into())?,
                Some((uid_map, gid_map)) => {
                    check(libc::unshare(libc::CLONE_NEWUSER | libc::CLONE_NEWNS).into())?;
                    write_file(c"/proc/self/setgroups", c"deny")?;
                    write_file(c"/proc/self/uid_map", uid_map)?;
                    write_file(c"/proc/self/gid_map", gid_map)?;
                    0
                }
            };
            // Nothing of this namespace may propagate back to the host's.
            check(
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
                .into(),
            )?;
            for path in &self.targets {
                let Some(target) = open_no_links(path)? else {
                    // Gone since the parent looked: nothing left to see.
                    continue;
                };
                let mut st: libc::stat = std::mem::zeroed();
                if libc::fstat(target, &mut st) != 0 || st.st_mode & libc::S_IFMT != libc::S_IFREG {
                    libc::close(target);
                    return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
                }
                let tree = libc::syscall(
                    libc::SYS_open_tree,
                    libc::AT_FDCWD,
                    self.cover.as_ptr(),
                    OPEN_TREE_CLONE | libc::O_CLOEXEC as libc::c_uint,
                );
                attach(
                    tree,
                    target,
                    MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
                )?;
            }
            for (path, attrs) in &self.self_mounts {
                let Some(target) = open_no_links(path)? else {
                    continue;
                };
                let tree = libc::syscall(
                    libc::SYS_open_tree,
                    target,
                    c"".as_ptr(),
                    OPEN_TREE_CLONE
                        | libc::O_CLOEXEC as libc::c_uint
                        | libc::AT_EMPTY_PATH as libc::c_uint,
                );
                attach(tree, target, *attrs)?;
            }
        }
        Ok(())
    }
}

/// `path` opened as O_PATH with no symbolic link followed anywhere on it;
/// None when it does not exist. Async-signal-safe.
unsafe fn open_no_links(path: &std::ffi::CStr) -> std::io::Result<Option<libc::c_int>> {
    let how = OpenHow {
        flags: (libc::O_PATH | libc::O_NOFOLLOW | libc::O_CLOEXEC) as u64,
        mode: 0,
        resolve: RESOLVE_NO_MAGICLINKS | RESOLVE_NO_SYMLINKS,
    };
    let fd = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            libc::AT_FDCWD,
            path.as_ptr(),
            &how as *const OpenHow,
            std::mem::size_of::<OpenHow>(),
        )
    };
    if fd >= 0 {
        return Ok(Some(fd as libc::c_int));
    }
    let err = std::io::Error::last_os_error();
    if err.raw_os_error() == Some(libc::ENOENT) {
        Ok(None)
    } else {
        Err(err)
    }
}

/// Mounts the detached tree `tree` (open_tree's result, negative if it
/// failed) on `target` with `attrs`, then closes both. Async-signal-safe.
unsafe fn attach(tree: libc::c_long, target: libc::c_int, attrs: u64) -> std::io::Result<()> {
    let fail = || std::io::Error::last_os_error();
    if tree < 0 {
        let err = fail();
        unsafe { libc::close(target) };
        return Err(err);
    }
    let tree = tree as libc::c_int;
    let attr = MountAttr {
        attr_set: attrs,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    let done = unsafe {
        if libc::syscall(
            libc::SYS_mount_setattr,
            tree,
            c"".as_ptr(),
            libc::AT_EMPTY_PATH,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        ) < 0
            || libc::syscall(
                libc::SYS_move_mount,
                tree,
                c"".as_ptr(),
                target,
                c"".as_ptr(),
                MOVE_MOUNT_F_EMPTY_PATH | MOVE_MOUNT_T_EMPTY_PATH,
            ) < 0
        {
            Err(fail())
        } else {
            Ok(())
        }
    };
    unsafe {
        libc::close(tree);
        libc::close(target);
    }
    done
}

/// open, write, close: async-signal-safe.
unsafe fn write_file(path: &std::ffi::CStr, content: &std::ffi::CStr) -> std::io::Result<()> {
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let bytes = content.to_bytes();
        let n = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let err = std::io::Error::last_os_error();
        libc::close(fd);
        if n != bytes.len() as isize {
            return Err(err);
        }
    }
    Ok(())
}
