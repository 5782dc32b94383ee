//! The supervisor as a microVM guest's pid 1.
//!
//! The guest init (guest/init.rs) has loaded the drivers and exec'd this
//! binary from cordon's disk, with the control port on fd 3. First the
//! supervisor holds: it tells the host it is ready and waits for its go
//! (the host may save the machine there, see microvm/snapshot.rs, so
//! nothing before the go may draw randomness or touch anything of a
//! sandbox's). After the go it mixes the host's entropy into the kernel's
//! pool, loads the drivers of the sandbox's own disks, mounts the host's
//! system directories read-only over 9p (with a QEMU that cannot save
//! virtio-fs: `cordon.fs=` on the kernel's command line says which; over
//! virtio-fs they are mounted before the hold), and finishes the sandbox's layout
//! from the setup message, as the native supervisor builds its root:
//! `/etc` from the host's allow-list, the workspace and extra binds, a
//! private `/tmp`. The virtual machine is the isolation boundary; nothing
//! else is confined.

use std::fs::File;
use std::os::fd::{FromRawFd, OwnedFd};

use rustix::io::Errno;
use rustix::mount::MountFlags;

use super::error::SetupError;
use super::image::{UPPER, WORK, write_etc};
use super::setup::Root;
use super::{IN_GUEST, fail, read_setup, send};
use crate::layout::{
    CONTROL_FD, GUEST_LATE_MODULES, GUEST_MODULES, GUEST_WARM, HOLD_ACK, HOLD_GO, HOLD_READY,
    HOLD_SEED_LEN, IMAGE_DISK, UPPER_DISK, bind_tag,
};
use crate::protocol::{ReadyInfo, SetupSpec, SupMsg};

/// 9p options for shares the guest writes (the workspace, writable binds):
/// no page cache, so the host's edits show at once, but shared writable
/// mappings still work.
const RW_9P: &str = "trans=virtio,version=9p2000.L,cache=mmap,msize=512000";
/// For read-only shares, the page cache: they do not change under a guest.
const RO_9P: &str = "trans=virtio,version=9p2000.L,cache=loose,msize=512000";

/// How the shares are mounted: (file system, options when read-only,
/// options when writable). Over virtio-fs the host's server sets the
/// caching (microvm/virtiofs.rs).
fn share_fs() -> (&'static str, &'static str, &'static str) {
    static VIRTIOFS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    let virtiofs = *VIRTIOFS.get_or_init(|| {
        std::fs::read_to_string("/proc/cmdline")
            .is_ok_and(|c| c.split_whitespace().any(|w| w == "cordon.fs=virtiofs"))
    });
    if virtiofs {
        ("virtiofs", "", "")
    } else {
        ("9p", RO_9P, RW_9P)
    }
}

pub(super) fn guest_main() -> ! {
    IN_GUEST.store(true, std::sync::atomic::Ordering::Relaxed);
    // SAFETY: the guest init leaves the control port on fd 3 for us.
    let fd = unsafe { OwnedFd::from_raw_fd(CONTROL_FD) };
    // The commands this supervisor starts must never hold the port: with
    // it they could forge protocol frames to the host.
    // SAFETY: fcntl on a descriptor we own.
    unsafe { libc::fcntl(CONTROL_FD, libc::F_SETFD, libc::FD_CLOEXEC) };
    let mut ctl = File::from(fd);
    // The host's system directories are the same for every guest of a
    // snapshot: over virtio-fs, whose server's state is saved with the
    // guest, they are mounted before the hold, and a start from the
    // snapshot finds them mounted. A mounted 9p share would keep QEMU
    // from saving the guest.
    let virtiofs = share_fs().0 == "virtiofs";
    let held = if virtiofs {
        mount_system()
            .map_err(|e| std::io::Error::other(e.message()))
            .map(|()| warm_page_cache())
    } else {
        Ok(())
    };
    if let Err(e) = held.and_then(|()| hold(&mut ctl)) {
        // Before the go the host reads no frame: the console has the word.
        eprintln!("cordon-supervisor: {e}");
        super::end_sandbox_with(1);
    }
    let mounted = load_late_modules().and_then(|()| if virtiofs { Ok(()) } else { mount_system() });
    if let Err(e) = mounted {
        fail(&mut ctl, e)
    }
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
            let ready = ReadyInfo {
                landlock: "not used: the sandbox is a virtual machine".into(),
                landlock_abi: 0,
                seccomp_filters: 0,
                next_id: 0,
            };
            send(&mut ctl, &SupMsg::Ready(ready.clone()));
            super::serve::serve(ctl.into(), relay, ready)
        }
        Err(e) => fail(&mut ctl, e),
    }
}

/// Reads [`GUEST_WARM`]'s files, those this root has, into the page cache:
/// in a snapshot, a guest started from it runs its first command without
/// reading them over its share (~25 ms under TCG). The snapshot's shape
/// holds their identities on the host (microvm/snapshot.rs), so a guest
/// never starts with a stale copy.
fn warm_page_cache() {
    for path in GUEST_WARM {
        if let Ok(mut f) = File::open(path) {
            let _ = std::io::copy(&mut f, &mut std::io::sink());
        }
    }
}

/// `RNDADDENTROPY` and `RNDRESEEDCRNG` (linux/random.h).
const RNDADDENTROPY: libc::c_ulong = 0x4008_5203;
const RNDRESEEDCRNG: libc::c_ulong = 0x5207;

/// Tells the host the guest holds, waits for its go and mixes the seed that
/// comes with it into the kernel's pool, reseeding at once: every guest
/// started from one snapshot would otherwise draw the same random numbers.
fn hold(port: &mut File) -> std::io::Result<()> {
    use std::io::{Read, Write};
    port.write_all(HOLD_READY)?;
    let mut go = [0u8; 8 + HOLD_SEED_LEN];
    port.read_exact(&mut go)?;
    if &go[..8] != HOLD_GO {
        return Err(std::io::Error::other("the host did not say go"));
    }
    mix_entropy(&go[8..])?;
    port.write_all(HOLD_ACK)
}

/// Mixes the host's `seed` into the kernel's pool and reseeds at once:
/// guests started from one saved memory would otherwise draw the same
/// random numbers.
pub(super) fn mix_entropy(seed: &[u8]) -> std::io::Result<()> {
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let words = seed.len() / 4;
    let mut info = Vec::with_capacity(8 + words * 4);
    info.extend_from_slice(&((words * 32) as i32).to_ne_bytes());
    info.extend_from_slice(&((words * 4) as i32).to_ne_bytes());
    info.extend_from_slice(&seed[..words * 4]);
    let random = File::open("/dev/urandom")?;
    use std::os::fd::AsRawFd;
    // SAFETY: the request's argument is the rand_pool_info built above.
    let rc = unsafe {
        let rc = libc::ioctl(random.as_raw_fd(), RNDADDENTROPY, info.as_ptr());
        if rc == 0 {
            libc::ioctl(random.as_raw_fd(), RNDRESEEDCRNG)
        } else {
            rc
        }
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Loads the modules init left for after the hold, in init's order.
fn load_late_modules() -> Result<(), SetupError> {
    let errno = |e: &std::io::Error| Errno::from_io_error(e).unwrap_or(Errno::IO);
    let order = std::fs::read_to_string(format!("{GUEST_MODULES}/order"))
        .map_err(|e| SetupError::new("read the guest's module order", errno(&e)))?;
    let late = order
        .lines()
        .map(str::trim)
        .filter(|n| GUEST_LATE_MODULES.contains(n));
    for name in late {
        let file = File::open(format!("{GUEST_MODULES}/{name}"))
            .map_err(|e| SetupError::new(format!("open {name}"), errno(&e)))?;
        match rustix::system::finit_module(&file, c"", 0) {
            Ok(()) | Err(Errno::EXIST) => {}
            Err(e) => return Err(SetupError::new(format!("load {name}"), e)),
        }
    }
    Ok(())
}

/// Mounts the host's system directories the kernel command line names
/// (`cordon.ro=TAG,TAG`), read-only at `/TAG`.
fn mount_system() -> Result<(), SetupError> {
    let cmdline = std::fs::read_to_string("/proc/cmdline").map_err(|e| {
        SetupError::new(
            "read /proc/cmdline",
            Errno::from_io_error(&e).unwrap_or(Errno::IO),
        )
    })?;
    let tags = cmdline
        .split_whitespace()
        .find_map(|w| w.strip_prefix("cordon.ro="))
        .unwrap_or_default();
    let (fs, ro, _) = share_fs();
    for tag in tags.split(',').filter(|t| !t.is_empty()) {
        mount(
            tag,
            &format!("/{tag}"),
            fs,
            MountFlags::RDONLY | MountFlags::NODEV,
            ro,
        )?;
    }
    Ok(())
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
    let (fs, ro, _) = share_fs();
    mount("etc", "/etc", fs, nodev | MountFlags::RDONLY, ro)?;
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
    let (fs, ro, rw) = share_fs();
    mount("workspace", &at("workspace", 0o755)?, fs, nodev, rw)?;
    for (i, b) in spec.binds.iter().enumerate() {
        let (flags, opts) = if b.writable {
            (nodev, rw)
        } else {
            (nodev | MountFlags::RDONLY, ro)
        };
        // A bind's source kind is the host's: the guest sees a directory
        // share either way.
        mount(&bind_tag(i), &at(&b.target, 0o755)?, fs, flags, opts)?;
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
    // Kept for freezing the layer (see `freeze_layer`): once the image
    // is the root, no path of the supervisor's reaches it.
    let layer = File::open(IMAGE_RW).map_err(|e| {
        SetupError::new(
            "open the writable layer",
            Errno::from_io_error(&e).unwrap_or(Errno::IO),
        )
    })?;
    let _ = LAYER.set(layer);
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

/// The root of a microVM's writable layer, on its own disk (an image's
/// guest only).
static LAYER: std::sync::OnceLock<File> = std::sync::OnceLock::new();

/// `FIFREEZE` and `FITHAW` (linux/fs.h: `_IOWR('X', 119, int)` and 120).
const FIFREEZE: libc::c_ulong = 0xC004_5877;
const FITHAW: libc::c_ulong = 0xC004_5878;

/// Freezes or thaws the writable layer's file system (see
/// `HostMsg::FreezeLayer`): frozen, everything written is on the disk and
/// writers wait, so the host's copy of the disk is whole.
pub(super) fn freeze_layer(frozen: bool) -> Result<(), String> {
    use std::os::fd::AsRawFd;
    let layer = LAYER.get().ok_or_else(|| {
        "this sandbox's root has no disk of its own (only a microVM on an image has one)"
            .to_string()
    })?;
    let request = if frozen { FIFREEZE } else { FITHAW };
    // SAFETY: an ioctl without argument on a descriptor we own.
    if unsafe { libc::ioctl(layer.as_raw_fd(), request, 0) } != 0 {
        let e = std::io::Error::last_os_error();
        return Err(format!(
            "cannot {} the writable layer: {e}",
            if frozen { "freeze" } else { "thaw" }
        ));
    }
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
