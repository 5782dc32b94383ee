//! Building the sandbox: namespaces, identity maps and the root filesystem.
//!
//! Runs in the freshly exec'd, single-threaded supervisor, before any
//! untrusted code exists. Every step either succeeds or reports what failed
//! and the errno, which the host turns into a one-line message.

use std::ffi::CString;
use std::fs;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::{MountFlags, MountPropagationFlags, UnmountFlags};

use super::error::{Context, Result, SetupError};
use super::idmap::{Prepared, Wanted};
use super::mount::{RO, RO_DEVICE, RW, open_no_links, set_attrs};
use super::protect::{hide, protect};
use crate::layout::{ETC_ALLOW, FONT_CACHE, SYSTEM_DIRS};
use crate::protocol::SetupSpec;

/// Device nodes bound from the host's `/dev` (a user namespace cannot mknod).
const DEV_NODES: &[&str] = &["null", "zero", "full", "random", "urandom", "tty"];

/// Files under `/proc` hidden behind `/dev/null`, and directories made
/// read-only, because they expose host-wide kernel state (`cmdline`: the
/// host's boot parameters, which can name devices, hosts or secrets).
const PROC_MASKED: &[&str] = &[
    "cmdline",
    "kcore",
    "keys",
    "key-users",
    "timer_list",
    "latency_stats",
    "sched_debug",
    "kallsyms",
    "kpagecount",
    "kpageflags",
    "kpagecgroup",
];
const PROC_READONLY: &[&str] = &["sys", "sysrq-trigger", "irq", "bus", "fs"];

/// Where the new root is assembled, in our private mount namespace.
pub(super) const STAGE: &str = "/tmp";

/// An O_PATH handle on a host path, opened before the stage hides anything,
/// or a detached idmapped copy of it made for this sandbox (`idmap`).
pub(super) struct Source {
    fd: OwnedFd,
    is_dir: bool,
    detached: bool,
}

impl Source {
    fn open(path: &str, prepared: &mut Prepared) -> Result<Source> {
        let (fd, detached) = match prepared.take(path) {
            Some(taken) => taken,
            None => (
                rustix::fs::open(path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())
                    .ctx(|| format!("open {path}"))?,
                false,
            ),
        };
        Source::from_fd(path, fd, detached)
    }

    /// The workspace or a bind source: a path the host resolved, so a link
    /// anywhere on it now was planted since (a sandbox working in a
    /// directory above can swap one in) and is refused, not followed.
    pub(super) fn open_resolved(path: &str, prepared: &mut Prepared) -> Result<Source> {
        if let Some((fd, detached)) = prepared.take(path) {
            return Source::from_fd(path, fd, detached);
        }
        let fd = open_no_links(path).map_err(|e| planted(path, e))?;
        Source::from_fd(path, fd, false)
    }

    fn from_fd(path: &str, fd: OwnedFd, detached: bool) -> Result<Source> {
        let st = rustix::fs::fstat(&fd).ctx(|| format!("stat {path}"))?;
        let is_dir = rustix::fs::FileType::from_raw_mode(st.st_mode).is_dir();
        Ok(Source {
            fd,
            is_dir,
            detached,
        })
    }

    /// A path through which `mount` reaches this handle.
    fn proc_path(&self) -> String {
        format!("/proc/self/fd/{}", self.fd.as_raw_fd())
    }
}

/// The error for a resolved path that no longer opens without a link.
fn planted(path: &str, e: Errno) -> SetupError {
    if e == Errno::LOOP {
        SetupError {
            what: format!(
                "{path}: a symbolic link appeared on this path after cordon resolved it \
                 (a sandbox working in a directory above may have planted it); cordon \
                 follows none"
            ),
            errno: 0,
        }
    } else {
        SetupError::new(format!("open {path}"), e)
    }
}

enum SysEntry {
    Link(PathBuf),
    Bind(Source),
}

/// Looks up `names` under the host directory `base`: symlinks are kept as
/// their targets, anything else (directories only, if `dirs_only`) is
/// opened for binding; missing entries are skipped.
fn host_entries(
    base: &str,
    names: &[&'static str],
    dirs_only: bool,
    prepared: &mut Prepared,
) -> Result<Vec<(&'static str, SysEntry)>> {
    let mut entries = Vec::new();
    for (name, host, kind) in host_listing(base, names, dirs_only) {
        let entry = match kind {
            HostKind::Link => {
                SysEntry::Link(fs::read_link(&host).ctx(|| format!("readlink {host}"))?)
            }
            HostKind::Bind => SysEntry::Bind(Source::open(&host, prepared)?),
        };
        entries.push((name, entry));
    }
    Ok(entries)
}

/// How [`host_entries`] places a host path in the sandbox.
#[derive(PartialEq)]
enum HostKind {
    /// Recreated as the same symbolic link.
    Link,
    /// Bound.
    Bind,
}

/// `names` under `base` that exist on the host (directories only, if
/// `dirs_only`, but for links), with their full paths and kinds.
fn host_listing(
    base: &str,
    names: &[&'static str],
    dirs_only: bool,
) -> Vec<(&'static str, String, HostKind)> {
    names
        .iter()
        .filter_map(|name| {
            let host = format!("{base}{name}");
            let kind = match fs::symlink_metadata(&host) {
                Ok(m) if m.file_type().is_symlink() => HostKind::Link,
                Ok(m) if m.is_dir() || !dirs_only => HostKind::Bind,
                _ => return None,
            };
            Some((*name, host, kind))
        })
        .collect()
}

/// The host paths [`build_root`] binds that an idmapped copy can stand
/// for: every one but the device nodes (whose file system cannot be
/// idmapped, and whose owner does not matter).
pub fn idmap_wanted(spec: &SetupSpec) -> Vec<Wanted> {
    let mut wanted = vec![Wanted {
        path: spec.workspace.clone(),
        required: true,
    }];
    for b in &spec.binds {
        wanted.push(Wanted {
            path: b.source.clone(),
            required: b.writable,
        });
    }
    if spec.image.is_some() {
        // An image's layers are its root (see `image_layers_wanted`);
        // nothing of the host's.
        return wanted;
    }
    let system = host_listing("/", SYSTEM_DIRS, true);
    let etc = host_listing("/etc/", ETC_ALLOW, false);
    for (_, path, kind) in system.into_iter().chain(etc) {
        if kind == HostKind::Bind {
            wanted.push(Wanted {
                path,
                required: false,
            });
        }
    }
    if fs::metadata(FONT_CACHE).is_ok_and(|m| m.is_dir()) {
        wanted.push(Wanted {
            path: FONT_CACHE.into(),
            required: false,
        });
    }
    wanted
}

/// An image's layers, to be idmapped as they are on disk (their owners are
/// the image's ids 0 to 65535).
pub fn image_layers_wanted(spec: &SetupSpec) -> Vec<Wanted> {
    spec.image
        .iter()
        .flat_map(|i| &i.layers)
        .map(|l| Wanted {
            path: l.clone(),
            required: true,
        })
        .collect()
}

/// Assembles the root filesystem and pivots into it. On return the process
/// sees only the sandbox's tree, with the working directory `/workspace`.
pub fn build_root(spec: &SetupSpec, prepared: &mut Prepared) -> Result<()> {
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .ctx(|| "make mounts private".into())?;

    // Open every source first: the workspace or a bind may live under STAGE.
    let mut dev = Vec::new();
    for node in DEV_NODES {
        let host = format!("/dev/{node}");
        if fs::symlink_metadata(&host).is_ok() {
            dev.push((*node, Source::open(&host, &mut Prepared::default())?));
        }
    }
    let workspace = Source::open_resolved(&spec.workspace, prepared)?;
    if !workspace.is_dir {
        return Err(SetupError {
            what: format!("workspace {} is not a directory", spec.workspace),
            errno: 0,
        });
    }
    let mut binds = Vec::new();
    for b in &spec.binds {
        binds.push((b, Source::open_resolved(&b.source, prepared)?));
    }

    let root = match &spec.image {
        None => host_root(spec, prepared)?,
        Some(image) => super::image::image_root(spec, image, prepared)?,
    };
    let stage = root.path.as_path();
    let image = spec.image.is_some();
    // A build step's changes become a layer: its /tmp is the image's, as
    // in every builder, and it has no workspace to leave a mount point.
    let step = spec.image.as_ref().is_some_and(|i| i.step.is_some());

    build_dev(&root.dir("dev", 0o755)?, &dev, spec.tmp_size)?;

    if !step {
        let tmp = root.dir("tmp", 0o1777)?;
        tmpfs(
            &tmp,
            &format!("mode=1777,size={}", spec.tmp_size),
            MountFlags::NOSUID | MountFlags::NODEV,
        )?;
        let ws = root.dir("workspace", 0o755)?;
        bind(&workspace, &ws)?;
        set_attrs(&ws, true, RW)?;
        // The covers live on the stage's tmpfs, outside an image's tree.
        hide(Path::new(STAGE), &ws, &spec.hidden)?;
        protect(&ws, &spec.read_only)?;
    }

    for (b, src) in &binds {
        let target = if src.is_dir {
            root.dir(&b.target, 0o755)?
        } else {
            root.file(&b.target)?
        };
        bind(src, &target)?;
        set_attrs(&target, true, if b.writable { RW } else { RO })?;
    }

    // Before the old root goes: the kernel lets a user namespace mount
    // procfs only while a fully visible one exists in its mount namespace.
    let proc_dir = root.dir("proc", 0o555)?;
    mount_proc(&proc_dir, &stage.join("dev/null"))?;
    if let Some(counts) = &spec.user_counts {
        super::counts::write_namespace_max(&proc_dir, counts)?;
    }
    // Read-only as a whole: procfs keeps one mode per entry for every mount
    // on the host, and Landlock does not cover chmod, so a sandbox whose uid
    // maps to root could otherwise change host-wide entries' permissions.
    set_attrs(&proc_dir, true, RO)?;

    // Drop the binds' O_PATH handles before they could leak anywhere.
    drop((dev, binds, workspace));

    rustix::process::chdir(stage).ctx(|| "chdir to new root".into())?;
    rustix::process::pivot_root(".", ".").ctx(|| "pivot_root".into())?;
    // The old root is now stacked under the new one; detach it entirely.
    rustix::mount::unmount(".", UnmountFlags::DETACH).ctx(|| "detach old root".into())?;
    rustix::process::chdir("/").ctx(|| "chdir /".into())?;

    if !image {
        // The root itself holds only mount points and generated files. An
        // image's root is the sandbox's own to change (its writable layer).
        set_attrs(Path::new("/"), false, RO)?;
    }
    if !step {
        rustix::process::chdir("/workspace").ctx(|| "chdir /workspace".into())?;
    }
    Ok(())
}

/// A new root being assembled: where it is, and how mount points are made
/// in it.
pub(super) struct Root {
    pub path: PathBuf,
    /// The image's, whose entries are hostile (see `image::ensure`); the
    /// host root's stage is a fresh tmpfs of ours.
    pub image: bool,
}

impl Root {
    /// The directory `rel` under the root, made with `mode` if absent.
    pub fn dir(&self, rel: &str, mode: u32) -> Result<PathBuf> {
        if self.image {
            return super::image::ensure(&self.path, rel, Some(mode));
        }
        let path = self.under(rel)?;
        if !path.exists() {
            mkdir(&path, mode)?;
        }
        Ok(path)
    }

    /// The plain file `rel` under the root, made empty if absent.
    pub fn file(&self, rel: &str) -> Result<PathBuf> {
        if self.image {
            return super::image::ensure(&self.path, rel, None);
        }
        let path = self.under(rel)?;
        make_mount_point(&path, false)?;
        Ok(path)
    }

    /// `rel` under the host root's stage, its parent directories made.
    fn under(&self, rel: &str) -> Result<PathBuf> {
        let path = self.path.join(rel.trim_start_matches('/'));
        if let Some(parent) = path.parent() {
            fs::DirBuilder::new()
                .recursive(true)
                .mode(0o755)
                .create(parent)
                .ctx(|| format!("create the mount point {rel}"))?;
        }
        Ok(path)
    }
}

/// The host's system directories, read-only, under a tmpfs of ours, with
/// an `/etc` of allowed host files and generated ones.
fn host_root(spec: &SetupSpec, prepared: &mut Prepared) -> Result<Root> {
    let system = host_entries("/", SYSTEM_DIRS, true, prepared)?;
    let etc = host_entries("/etc/", ETC_ALLOW, false, prepared)?;
    // The system's font cache, read-only: without it every program that
    // draws text builds its own first (a second of CPU for a window
    // manager), and holds nothing private.
    let font_cache = match fs::metadata(FONT_CACHE) {
        Ok(m) if m.is_dir() => Some(Source::open(FONT_CACHE, prepared)?),
        _ => None,
    };

    let stage = Path::new(STAGE);
    tmpfs(
        stage,
        "mode=0755,size=1m,nr_inodes=4096",
        MountFlags::NOSUID | MountFlags::NODEV,
    )?;

    for (name, entry) in &system {
        place(stage, name, entry, false)?;
    }

    let etc_dir = stage.join("etc");
    mkdir(&etc_dir, 0o755)?;
    for (name, entry) in &etc {
        place(&etc_dir, name, entry, false)?;
    }
    write_generated_etc(&etc_dir, spec)?;

    let var = stage.join("var");
    mkdir(&var, 0o755)?;
    symlink("/tmp", var.join("tmp")).ctx(|| "symlink /var/tmp".into())?;
    if let Some(src) = &font_cache {
        let target = var.join("cache/fontconfig");
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(&target)
            .ctx(|| "create /var/cache/fontconfig".into())?;
        bind(src, &target)?;
        set_attrs(&target, true, RO)?;
    }
    mkdir(&stage.join("home"), 0o755)?;
    mkdir(&stage.join("run"), 0o755)?;
    drop((system, etc, font_cache));
    Ok(Root {
        path: stage.to_path_buf(),
        image: false,
    })
}

pub(super) fn mkdir(path: &Path, mode: u32) -> Result<()> {
    fs::DirBuilder::new()
        .mode(mode)
        .create(path)
        .ctx(|| format!("mkdir {}", path.display()))?;
    // The umask may have narrowed the mode (1777 for /tmp matters).
    fs::set_permissions(path, fs::Permissions::from_mode(mode))
        .ctx(|| format!("chmod {}", path.display()))
}

fn make_mount_point(path: &Path, dir: bool) -> Result<()> {
    if path.exists() {
        return Ok(());
    }
    if dir {
        mkdir(path, 0o755)
    } else {
        fs::File::create(path)
            .map(drop)
            .ctx(|| format!("create {}", path.display()))
    }
}

fn place(parent: &Path, name: &str, entry: &SysEntry, writable: bool) -> Result<()> {
    let path = parent.join(name);
    if let Some(dir) = path.parent()
        && !dir.exists()
    {
        fs::DirBuilder::new()
            .recursive(true)
            .mode(0o755)
            .create(dir)
            .ctx(|| format!("mkdir {}", dir.display()))?;
    }
    match entry {
        SysEntry::Link(target) => symlink(target, &path).ctx(|| format!("symlink {name}")),
        SysEntry::Bind(src) => {
            make_mount_point(&path, src.is_dir)?;
            bind(src, &path)?;
            set_attrs(&path, true, if writable { RW } else { RO })
        }
    }
}

pub(super) fn tmpfs(target: &Path, data: &str, flags: MountFlags) -> Result<()> {
    let data = CString::new(data).map_err(|_| SetupError::new("tmpfs options", Errno::INVAL))?;
    rustix::mount::mount("tmpfs", target, "tmpfs", flags, data.as_c_str())
        .ctx(|| format!("mount tmpfs on {}", target.display()))
}

pub(super) fn bind(src: &Source, target: &Path) -> Result<()> {
    if src.detached {
        return rustix::mount::move_mount(
            &src.fd,
            "",
            rustix::fs::CWD,
            target,
            rustix::mount::MoveMountFlags::MOVE_MOUNT_F_EMPTY_PATH,
        )
        .ctx(|| format!("attach an idmapped mount onto {}", target.display()));
    }
    rustix::mount::mount_bind_recursive(src.proc_path().as_str(), target)
        .ctx(|| format!("bind mount onto {}", target.display()))
}

pub(super) fn build_dev(dev: &Path, nodes: &[(&str, Source)], shm_size: u64) -> Result<()> {
    tmpfs(
        dev,
        "mode=0755,size=64k,nr_inodes=64",
        MountFlags::NOSUID | MountFlags::NOEXEC,
    )?;
    for (name, src) in nodes {
        let path = dev.join(name);
        make_mount_point(&path, false)?;
        bind(src, &path)?;
        set_attrs(&path, false, RO_DEVICE)?;
    }
    let pts = dev.join("pts");
    mkdir(&pts, 0o755)?;
    rustix::mount::mount(
        "devpts",
        &pts,
        "devpts",
        MountFlags::NOSUID | MountFlags::NOEXEC,
        c"newinstance,ptmxmode=0666,mode=0620",
    )
    .ctx(|| "mount devpts".into())?;
    symlink("pts/ptmx", dev.join("ptmx")).ctx(|| "symlink /dev/ptmx".into())?;
    let shm = dev.join("shm");
    mkdir(&shm, 0o1777)?;
    tmpfs(
        &shm,
        &format!("mode=1777,size={shm_size}"),
        MountFlags::NOSUID | MountFlags::NODEV,
    )?;
    for (name, target) in [
        ("fd", "/proc/self/fd"),
        ("stdin", "/proc/self/fd/0"),
        ("stdout", "/proc/self/fd/1"),
        ("stderr", "/proc/self/fd/2"),
    ] {
        symlink(target, dev.join(name)).ctx(|| format!("symlink /dev/{name}"))?;
    }
    // Nothing may create files in /dev itself; pts and shm stay writable.
    set_attrs(dev, false, RO)
}

/// The files cordon writes in the sandbox's `/etc`, by name: an image root
/// keeps its own `passwd` and `group` (the first two) where it has them.
pub(super) fn generated_etc(spec: &SetupSpec) -> [(&'static str, String); 5] {
    let (uid, gid) = (spec.inner_uid, spec.inner_gid);
    let mut passwd = String::from("root:x:0:0:root:/root:/bin/bash\n");
    let mut group = String::from("root:x:0:\n");
    if uid != 0 {
        passwd.push_str(&format!("sandbox:x:{uid}:{gid}:sandbox:/tmp:/bin/bash\n"));
    }
    if gid != 0 {
        group.push_str(&format!("sandbox:x:{gid}:\n"));
    }
    if uid != 65534 {
        passwd.push_str("nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n");
    }
    if gid != 65534 {
        group.push_str("nogroup:x:65534:\n");
    }
    [
        ("passwd", passwd),
        ("group", group),
        ("hostname", format!("{}\n", spec.hostname)),
        (
            "hosts",
            format!(
                "127.0.0.1\tlocalhost {h}\n::1\tlocalhost ip6-localhost {h}\n",
                h = spec.hostname
            ),
        ),
        // The host's resolvers only where the host's network is the
        // sandbox's; read here, before the pivot, never bound.
        (
            "resolv.conf",
            if spec.host_network {
                fs::read_to_string("/etc/resolv.conf").unwrap_or_default()
            } else {
                String::new()
            },
        ),
    ]
}

/// Writes `body` to `path` (a plain file or nothing; never a link) with
/// mode 0644.
pub(super) fn write_file(path: &Path, body: &str) -> Result<()> {
    fs::write(path, body).ctx(|| format!("write {}", path.display()))?;
    fs::set_permissions(path, fs::Permissions::from_mode(0o644))
        .ctx(|| format!("chmod {}", path.display()))
}

fn write_generated_etc(etc: &Path, spec: &SetupSpec) -> Result<()> {
    if let Some((ca, bundle)) = &spec.trust {
        let dir = etc.join("cordon");
        mkdir(&dir, 0o755)?;
        for (name, body) in [("ca.pem", ca), ("bundle.pem", bundle)] {
            write_file(&dir.join(name), body)?;
        }
    }
    for (name, body) in generated_etc(spec) {
        write_file(&etc.join(name), &body)?;
    }
    Ok(())
}

fn mount_proc(proc_dir: &Path, devnull: &Path) -> Result<()> {
    rustix::mount::mount(
        "proc",
        proc_dir,
        "proc",
        MountFlags::NOSUID | MountFlags::NODEV | MountFlags::NOEXEC,
        None::<&std::ffi::CStr>,
    )
    .ctx(|| "mount /proc".into())?;
    for name in PROC_MASKED {
        let path = proc_dir.join(name);
        if path.exists() {
            rustix::mount::mount_bind(devnull, &path).ctx(|| format!("mask /proc/{name}"))?;
        }
    }
    for name in PROC_READONLY {
        let path = proc_dir.join(name);
        if path.exists() {
            rustix::mount::mount_bind_recursive(&path, &path)
                .ctx(|| format!("bind /proc/{name}"))?;
        }
    }
    Ok(())
}

/// Listens on 127.0.0.1:`port` in the sandbox's network namespace and
/// sends the listening socket to the host over `channel` (`SCM_RIGHTS`),
/// keeping no copy: the host's broker accepts on it directly. Done before
/// any command runs, so nothing in the sandbox can hold the port first.
pub fn hand_over_proxy_listener(port: u16, channel: &OwnedFd) -> Result<()> {
    use rustix::net::{
        AddressFamily, SendAncillaryBuffer, SendAncillaryMessage, SendFlags, SocketAddrV4,
        SocketFlags, SocketType,
    };
    let sock = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC,
        None,
    )
    .ctx(|| "socket for the network broker".into())?;
    rustix::net::bind(
        &sock,
        &SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port),
    )
    .ctx(|| format!("bind 127.0.0.1:{port} for the network broker"))?;
    rustix::net::listen(&sock, 128).ctx(|| "listen for the network broker".into())?;
    let fds = [sock.as_fd()];
    let mut space = [std::mem::MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(1))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if !control.push(SendAncillaryMessage::ScmRights(&fds)) {
        return Err(SetupError::new(
            "hand the network broker its listener",
            Errno::NOSPC,
        ));
    }
    rustix::net::sendmsg(
        channel,
        &[std::io::IoSlice::new(&[0])],
        &mut control,
        SendFlags::NOSIGNAL,
    )
    .ctx(|| "hand the network broker its listener".into())?;
    Ok(())
}

/// Brings the loopback interface up (it starts down in a new net namespace).
pub fn loopback_up() -> Result<()> {
    let sock = rustix::net::socket(
        rustix::net::AddressFamily::INET,
        rustix::net::SocketType::DGRAM,
        None,
    )
    .ctx(|| "socket for loopback".into())?;
    // SAFETY: ifreq is plain old data; the name is NUL-terminated ("lo").
    unsafe {
        let mut req: libc::ifreq = std::mem::zeroed();
        req.ifr_name[0] = b'l' as libc::c_char;
        req.ifr_name[1] = b'o' as libc::c_char;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCGIFFLAGS, &mut req) != 0 {
            return Err(SetupError::io(
                "read lo flags",
                std::io::Error::last_os_error(),
            ));
        }
        req.ifr_ifru.ifru_flags |= (libc::IFF_UP | libc::IFF_RUNNING) as libc::c_short;
        if libc::ioctl(sock.as_raw_fd(), libc::SIOCSIFFLAGS, &req) != 0 {
            return Err(SetupError::io(
                "bring lo up",
                std::io::Error::last_os_error(),
            ));
        }
    }
    Ok(())
}
