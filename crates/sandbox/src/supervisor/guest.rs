//! The supervisor as a microVM guest's pid 1.
//!
//! The guest init (guest/init.rs) has loaded the virtio drivers, mounted the
//! host's system directories read-only over 9p and exec'd this binary with
//! the control port on fd 3. Here the sandbox's own layout is finished from
//! the setup message, as the native supervisor builds its root: `/etc` from
//! the host's allow-list, the workspace and extra binds, a private `/tmp`.
//! The virtual machine is the isolation boundary; nothing else is confined.

use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};

use rustix::io::Errno;
use rustix::mount::MountFlags;

use super::error::SetupError;
use super::image::{UPPER, WORK, write_etc};
use super::setup::Root;
use super::{IN_GUEST, fail, read_setup, send};
use crate::layout::{CONTROL_FD, IMAGE_DISK, UPPER_DISK, bind_tag};
use crate::protocol::{ReadyInfo, SetupSpec, SupMsg};

/// 9p options for shares the guest writes (the workspace, writable binds):
/// no page cache, so the host's edits show at once, but shared writable
/// mappings still work.
const RW_9P: &str = "trans=virtio,version=9p2000.L,cache=mmap,msize=512000";
/// For read-only shares, the page cache: they do not change under a guest.
const RO_9P: &str = "trans=virtio,version=9p2000.L,cache=loose,msize=512000";

pub(super) fn guest_main() -> ! {
    IN_GUEST.store(true, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the guest init leaves the control port on fd 3 for us.
    let fd = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    // The commands this supervisor starts must never hold the port: with
    // it they could forge protocol frames to the host.
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(CONTROL_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
    let mut ctl = File::from(fd);
    let spec = match read_setup(&mut ctl) {
        Ok(s) => s,
        Err(e) => fail(&mut ctl, e),
    };
    // The broker's port, before any command runs (see `relay`).
    let built = build(&spec).and_then(|()| {
        spec.proxy_port
            .map(|port| {
                super::relay::listen(port).map_err(|e| {
                    SetupError::new(
                        "listen for the network broker",
                        Errno::from_io_error(&e).unwrap_or(Errno::IO),
                    )
                })
            })
            .transpose()
    });
    match built {
        Ok(relay) => {
            send(
                &mut ctl,
                &SupMsg::Ready(ReadyInfo {
                    landlock: "not used: the sandbox is a virtual machine".into(),
                    landlock_abi: 0,
                    seccomp_filters: 0,
                }),
            );
            super::serve::serve(ctl.into(), relay)
        }
        Err(e) => fail(&mut ctl, e),
    }
}

fn mount(
    source: &str,
    target: &str,
    fstype: &str,
    flags: MountFlags,
    data: &str,
) -> Result<(), SetupError> {
    std::fs::create_dir_all(target).map_err(|e| {
        SetupError::new(
            format!("create {target}"),
            Errno::from_io_error(&e).unwrap_or(Errno::IO),
        )
    })?;
    let data = std::ffi::CString::new(data).expect("mount options have no NUL");
    rustix::mount::mount(source, target, fstype, flags, data.as_c_str())
        .map_err(|e| SetupError::new(format!("mount {fstype} {source} on {target}"), e))
}

fn build(spec: &SetupSpec) -> Result<(), SetupError> {
    if spec.guest_image {
        return build_image(spec);
    }
    let nodev = MountFlags::NODEV | MountFlags::NOSUID;
    mount("etc", "/etc", "9p", nodev | MountFlags::RDONLY, RO_9P)?;
    mount_sandbox(spec, |rel, _| {
        Ok(format!("/{}", rel.trim_start_matches('/')))
    })?;
    mount("tmpfs", "/run", "tmpfs", nodev, "mode=0755,size=16m")?;
    if let Some(max) = spec.rlimit_nproc {
        limit_pids(max)?;
    }
    rustix::system::sethostname(spec.hostname.as_bytes())
        .map_err(|e| SetupError::new("set hostname", e))?;
    if spec.loopback {
        super::setup::loopback_up()?;
    }
    std::env::set_current_dir("/workspace").map_err(|e| {
        SetupError::new(
            "enter /workspace",
            Errno::from_io_error(&e).unwrap_or(Errno::IO),
        )
    })?;
    Ok(())
}

/// The sandbox's own mounts, at `at(rel, mode)` for each path `rel` of
/// the root being built (made with `mode` if absent): the workspace and
/// binds over 9p, a private `/tmp`, and `/dev`'s `pts` and `shm`.
fn mount_sandbox(
    spec: &SetupSpec,
    at: impl Fn(&str, u32) -> Result<String, SetupError>,
) -> Result<(), SetupError> {
    let nodev = MountFlags::NODEV | MountFlags::NOSUID;
    mount("workspace", &at("workspace", 0o755)?, "9p", nodev, RW_9P)?;
    for (i, b) in spec.binds.iter().enumerate() {
        let (flags, opts) = if b.writable {
            (nodev, RW_9P)
        } else {
            (nodev | MountFlags::RDONLY, RO_9P)
        };
        // A bind's source kind is the host's: the guest sees a directory
        // share either way.
        mount(&bind_tag(i), &at(&b.target, 0o755)?, "9p", flags, opts)?;
    }
    let tmp_opts = format!("mode=1777,size={}", spec.tmp_size);
    mount("tmpfs", &at("tmp", 0o1777)?, "tmpfs", nodev, &tmp_opts)?;
    mount(
        "devpts",
        &at("dev/pts", 0o755)?,
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        "ptmxmode=0666,mode=0620",
    )?;
    mount("tmpfs", &at("dev/shm", 0o1777)?, "tmpfs", nodev, &tmp_opts)
}

/// Where the image root is assembled, on the initramfs: the image's disk,
/// the writable layer's disk, and the overlay of the two that becomes `/`.
const IMAGE_DISK_MOUNT: &str = "/.cordon/image/disk";
const IMAGE_RW: &str = "/.cordon/image/rw";
const IMAGE_ROOT: &str = "/.cordon/image/root";

/// The root from an image: its flat root, read-only, under a writable
/// layer on a disk of the guest's own (as big as the disk budget, so the
/// layer cannot outgrow it), then the sandbox's mounts in it as natively
/// (the workspace and binds over 9p, a private `/tmp`, `/dev`, `/proc`),
/// cordon's files in its `/etc`, and the switch into it. The image is the
/// guest's: its entries are placed through [`Root`], which follows no
/// link the image holds.
fn build_image(spec: &SetupSpec) -> Result<(), SetupError> {
    let nodev = MountFlags::NODEV | MountFlags::NOSUID;
    let image = find_disk(IMAGE_DISK)?;
    let upper = find_disk(UPPER_DISK)?;
    mount(
        &image,
        IMAGE_DISK_MOUNT,
        "ext4",
        nodev | MountFlags::RDONLY,
        "noload",
    )?;
    // Discard: what the guest deletes is freed in the host's sparse file.
    // Inode tables stay unwritten until used: the host's file stays sparse.
    mount(&upper, IMAGE_RW, "ext4", nodev, "discard,noinit_itable")?;
    for d in [UPPER, WORK] {
        std::fs::create_dir_all(format!("{IMAGE_RW}/{d}")).map_err(|e| {
            SetupError::new(
                format!("create the writable layer's {d}"),
                Errno::from_io_error(&e).unwrap_or(Errno::IO),
            )
        })?;
    }
    let lower = format!("{IMAGE_DISK_MOUNT}/{}", cordon_image::flat::IMAGE_DIR);
    mount(
        "overlay",
        IMAGE_ROOT,
        "overlay",
        nodev,
        &format!("lowerdir={lower},upperdir={IMAGE_RW}/{UPPER},workdir={IMAGE_RW}/{WORK}"),
    )?;
    let root = Root {
        path: IMAGE_ROOT.into(),
        image: true,
    };
    write_etc(&root.path, spec)?;

    // Before /sys moves: the cgroup is made under the init's /sys.
    if let Some(max) = spec.rlimit_nproc {
        limit_pids(max)?;
    }
    // The kernel's own trees, moved in whole (with what is mounted on
    // them): the init mounted them on the initramfs.
    for (name, mode) in [("dev", 0o755), ("proc", 0o555), ("sys", 0o555)] {
        let target = root.dir(name, mode)?;
        rustix::mount::mount_move(format!("/{name}").as_str(), &target)
            .map_err(|e| SetupError::new(format!("move /{name} into the image"), e))?;
    }
    mount_sandbox(spec, |rel, mode| {
        Ok(root.dir(rel, mode)?.to_string_lossy().into_owned())
    })?;
    rustix::system::sethostname(spec.hostname.as_bytes())
        .map_err(|e| SetupError::new("set hostname", e))?;
    if spec.loopback {
        super::setup::loopback_up()?;
    }
    // The initramfs cannot be pivoted away from: move the new root over
    // it and enter it, as switch_root does. What stays beneath (the host's
    // system shares the supervisor was started from) is out of reach of
    // every path from the new root.
    rustix::process::chdir(IMAGE_ROOT).map_err(|e| SetupError::new("enter the image", e))?;
    rustix::mount::mount_move(".", "/").map_err(|e| SetupError::new("move the image to /", e))?;
    rustix::process::chroot(".").map_err(|e| SetupError::new("chroot into the image", e))?;
    rustix::process::chdir("/workspace").map_err(|e| SetupError::new("enter /workspace", e))?;
    super::serve::run_commands_as(spec.inner_uid, spec.inner_gid);
    Ok(())
}

/// The block device whose serial is `serial`, which appears as its driver
/// probes it.
fn find_disk(serial: &str) -> Result<String, SetupError> {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/block") {
            for e in entries.flatten() {
                let found = std::fs::read_to_string(e.path().join("serial"))
                    .is_ok_and(|s| s.trim() == serial);
                let dev = format!("/dev/{}", e.file_name().to_string_lossy());
                if found && std::path::Path::new(&dev).exists() {
                    return Ok(dev);
                }
            }
        }
        if std::time::Instant::now() > deadline {
            return Err(SetupError {
                what: format!("the guest has no disk {serial:?}"),
                errno: 0,
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// Caps the number of processes: the guest's root ignores RLIMIT_NPROC, so
/// the supervisor (and so everything it starts) moves into a cgroup with
/// `pids.max`, as a native sandbox's cgroup does.
fn limit_pids(max: u64) -> Result<(), SetupError> {
    let io = |what: &str| {
        let what = what.to_string();
        move |e: std::io::Error| {
            SetupError::new(what, Errno::from_io_error(&e).unwrap_or(Errno::IO))
        }
    };
    mount(
        "cgroup2",
        "/sys/fs/cgroup",
        "cgroup2",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        "",
    )?;
    std::fs::write("/sys/fs/cgroup/cgroup.subtree_control", "+pids")
        .map_err(io("enable the pids controller"))?;
    std::fs::create_dir_all("/sys/fs/cgroup/sandbox").map_err(io("create the sandbox cgroup"))?;
    std::fs::write("/sys/fs/cgroup/sandbox/pids.max", max.to_string())
        .map_err(io("set pids.max"))?;
    std::fs::write("/sys/fs/cgroup/sandbox/cgroup.procs", "0")
        .map_err(io("enter the sandbox cgroup"))?;
    Ok(())
}
