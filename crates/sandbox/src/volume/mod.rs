//! Volumes: a workspace that is a file system of its own, so that what a
//! sandbox can make the host's disk hold has a real bound.
//!
//! The disk budget's watcher (`disk`) sees what a directory walk and
//! `/proc` show; a file deleted while a descriptor to it is in flight on a
//! Unix socket shows nowhere and still holds its blocks. A volume bounds
//! them all: the workspace `W` is a bind of `W.volume/w`, where `W.volume`
//! is an ext4 file system on a loop device over the sparse image
//! `W.volume.img`, and the file system's free space is kept at the room
//! the sandbox may fill by a balloon, `W.volume/.balloon`, a preallocated
//! file the sandbox cannot see. Preallocated blocks are unwritten, so the
//! balloon takes nothing on the host, and the file system is mounted with
//! `discard`, so what the sandbox deletes is given back to the host: the
//! image never holds more than the file system uses.
//!
//! Rules:
//! - Only cordon mounts a volume, and only an image it made (in a
//!   directory of its own); nothing found in a workspace decides what is
//!   mounted, and the sandbox cannot reach the image or the balloon.
//! - Mounting needs root in the host's namespaces; without it, or without
//!   `mkfs.ext4`, [`Volumes::make_workspace`] makes a plain directory (the watcher
//!   alone then holds the budget).
//! - A volume is mounted while it is in use: whoever reads or writes a
//!   workspace (a sandbox, the files API, an archiver) first [enters](Volumes::enter)
//!   it and holds the [`InUse`] it gets. Unused volumes stay mounted, the
//!   least recently used unmounted past the number [`Volumes`] keeps, so a host
//!   holds any number of workspaces in a bounded number of mounts.
//! - While unmounted, `W` and `W.volume` are immutable empty directories:
//!   a writer that forgot to enter fails loudly instead of writing past
//!   the volume, onto the host's disk. [`release`] undoes all of it
//!   before the workspace is removed.
//! - The first volume of a size in a process is made with `mkfs.ext4`;
//!   the next are copies of its fresh image, each with a UUID of its own
//!   ([`crate::fresh`]).

use std::ffi::OsString;
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use rustix::fs::{FallocateFlags, OFlags};
use rustix::mount::{MountFlags, UnmountFlags};

use crate::fresh::{Key, Template, Templates};

/// The image's size: the most the file system can ever hold, not what it
/// takes (the image is sparse and the balloon unwritten). Large enough
/// for a long session's workspace.
const MIN_CAPACITY: u64 = 16 << 30;
/// Mount flags of the volume and so of the workspace bound from it.
const MOUNT_FLAGS: MountFlags = MountFlags::NOSUID.union(MountFlags::NODEV);
/// `noinit_itable`: the kernel would otherwise zero the inode tables in
/// the background, making the host hold them. `discard`: deleted blocks
/// are punched out of the image.
const MOUNT_DATA: &std::ffi::CStr = c"noinit_itable,discard";
/// The balloon's name at the file system's root.
const BALLOON: &str = ".balloon";
/// The file system's label, which also keys its template ([`crate::fresh`]).
const LABEL: &str = "cordon";
/// The workspace's directory at the file system's root.
const TREE: &str = "w";
/// Where `mkfs.ext4` is looked for: the host's, never the caller's `PATH`.
const TOOL_PATH: &str = "/usr/sbin:/sbin:/usr/bin:/bin";

/// Why a volume cannot be made or mounted.
#[derive(Debug, thiserror::Error)]
pub enum VolumeError {
    #[error("volumes need root in the host's namespaces, loop devices and mkfs.ext4")]
    Unsupported,
    #[error("{0} is not an empty directory")]
    NotEmpty(PathBuf),
    #[error("mkfs.ext4 failed: {0}")]
    Mkfs(String),
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: std::io::Error,
    },
}

impl VolumeError {
    fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> VolumeError {
        let what = what.into();
        move |source| VolumeError::Io { what, source }
    }
}

type Result<T, E = VolumeError> = std::result::Result<T, E>;

/// The paths of workspace `W`'s volume.
struct Paths {
    workspace: PathBuf,
    root: PathBuf,
    image: PathBuf,
}

impl Paths {
    fn of(workspace: &Path) -> Paths {
        let with = |suffix: &str| {
            let mut name = workspace
                .file_name()
                .map(OsString::from)
                .unwrap_or_default();
            name.push(suffix);
            workspace.with_file_name(name)
        };
        Paths {
            workspace: workspace.to_path_buf(),
            root: with(".volume"),
            image: with(".volume.img"),
        }
    }
}

/// The free space a volume is given for a disk budget: the budget and the
/// watcher's stated precision past it (96 MiB, or an eighth of a budget
/// over 768 MiB), so that a sandbox growing in plain sight meets the
/// watcher, as it would without a volume, and whatever it hides meets the
/// file system's end.
pub fn room(budget: u64) -> u64 {
    budget.saturating_add((budget / 8).max(96 << 20))
}

/// Whether this process can make volumes: root in the host's user
/// namespace, with the loop devices' control and `mkfs.ext4`.
pub fn supported() -> bool {
    rustix::process::geteuid().is_root()
        && crate::native::in_initial_user_namespace()
        && Path::new("/dev/loop-control").exists()
        && std::env::split_paths(TOOL_PATH).any(|d| d.join("mkfs.ext4").is_file())
}

/// The most unused volumes kept mounted by default (each is two mounts,
/// and a host has room for a bounded number: `fs.mount-max`).
pub const KEEP_IDLE: usize = 64;

/// How a process uses volumes: how many unused ones it keeps mounted, so
/// that the next user of a recent one need not mount it again. Past that,
/// the least recently used are unmounted as they are left.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Volumes {
    keep_idle: usize,
}

impl Default for Volumes {
    fn default() -> Self {
        Volumes::keeping(KEEP_IDLE)
    }
}

impl Volumes {
    pub const fn keeping(idle: usize) -> Volumes {
        Volumes { keep_idle: idle }
    }

    /// Makes a workspace cordon owns (a job's, a session's) and enters
    /// it: a volume with room for `budget` where this process can make
    /// one, else a plain directory. One that exists is entered as it is.
    pub fn make_workspace(&self, workspace: &Path, budget: Option<u64>) -> Result<InUse> {
        if workspace.exists() {
            return self.enter(workspace);
        }
        if let Some(parent) = workspace.parent() {
            std::fs::create_dir_all(parent)
                .map_err(VolumeError::io(format!("create {}", parent.display())))?;
        }
        match budget {
            Some(budget) if supported() => {
                // Another thread's `enter` waits until it is made: the
                // image exists, unmounted, while mkfs writes it, and must
                // not be mounted half-made.
                let making = Making::start(workspace);
                let made = make(workspace, room(budget));
                // Done and entered under one lock: a user in between could
                // leave it and unmount it.
                let mut reg = IN_USE.lock();
                making.finish(&mut reg);
                made?;
                // Made mounted: in use from now, by the caller.
                Ok(reg.enter_mounted(workspace, self.keep_idle))
            }
            _ => std::fs::create_dir_all(workspace)
                .map(|()| InUse::plain())
                .map_err(VolumeError::io(format!("create {}", workspace.display()))),
        }
    }

    /// Enters `workspace`: if it is a volume, mounts it unless it is
    /// mounted, and keeps it mounted while the answer lives. A plain
    /// directory (or none) is entered as it is. Blocks while another
    /// volume is mounted or unmounted: call it off an async runtime.
    pub fn enter(&self, workspace: &Path) -> Result<InUse> {
        let p = Paths::of(workspace);
        let mut reg = IN_USE.lock();
        while reg.making.contains(workspace) {
            reg = MADE.wait(reg).unwrap_or_else(|p| p.into_inner());
        }
        match std::fs::symlink_metadata(&p.image) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(InUse::plain()),
            _ => {}
        }
        // Checked even when in use: a shutdown (or an operator) may have
        // unmounted it under its users.
        if !is_volume(&p) {
            mount(&p)?;
        }
        Ok(reg.enter_mounted(workspace, self.keep_idle))
    }
}

/// A workspace in use: while it lives, a volume stays mounted.
#[derive(Debug)]
#[must_use = "a volume may be unmounted once this is dropped"]
pub struct InUse {
    workspace: Option<PathBuf>,
    /// Unused volumes kept mounted when this one is left.
    keep_idle: usize,
}

impl InUse {
    fn plain() -> InUse {
        InUse {
            workspace: None,
            keep_idle: KEEP_IDLE,
        }
    }

    /// Whether the workspace is a volume.
    pub fn is_volume(&self) -> bool {
        self.workspace.is_some()
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        if let Some(ws) = self.workspace.take() {
            IN_USE.lock().leave(&ws, self.keep_idle);
        }
    }
}

/// The volumes this process has entered: how many users each has, and
/// when the unused ones were last left.
struct Registry {
    users: std::collections::BTreeMap<PathBuf, Users>,
    /// Workspaces whose volume is being made: entering one waits on
    /// [`MADE`].
    making: std::collections::BTreeSet<PathBuf>,
    /// Counts leavings, to order the unused by when they were left.
    clock: u64,
}

#[derive(Default)]
struct Users {
    count: usize,
    left_at: u64,
}

struct Locked(std::sync::Mutex<Registry>);

impl Locked {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A volume being made, in [`Registry::making`] until finished, or
/// dropped by a panic (which must not leave its enterers waiting).
struct Making<'a>(Option<&'a Path>);

impl<'a> Making<'a> {
    fn start(workspace: &'a Path) -> Making<'a> {
        IN_USE.lock().making.insert(workspace.to_path_buf());
        Making(Some(workspace))
    }

    fn finish(mut self, reg: &mut Registry) {
        if let Some(w) = self.0.take() {
            reg.made(w);
        }
    }
}

impl Drop for Making<'_> {
    fn drop(&mut self) {
        if let Some(w) = self.0.take() {
            IN_USE.lock().made(w);
        }
    }
}

/// Signalled when a volume has been made (or failed to be).
static MADE: std::sync::Condvar = std::sync::Condvar::new();

/// One per process, as the mount table it mirrors. Mounting happens
/// under its lock, so that two users of one volume never both mount it.
static IN_USE: Locked = Locked(std::sync::Mutex::new(Registry {
    users: std::collections::BTreeMap::new(),
    making: std::collections::BTreeSet::new(),
    clock: 0,
}));

impl Registry {
    /// `workspace` is no longer being made: its waiters go on.
    fn made(&mut self, workspace: &Path) {
        self.making.remove(workspace);
        MADE.notify_all();
    }

    fn enter_mounted(&mut self, workspace: &Path, keep_idle: usize) -> InUse {
        self.users.entry(workspace.to_path_buf()).or_default().count += 1;
        InUse {
            workspace: Some(workspace.to_path_buf()),
            keep_idle,
        }
    }

    fn leave(&mut self, workspace: &Path, keep_idle: usize) {
        self.clock += 1;
        if let Some(u) = self.users.get_mut(workspace) {
            u.count = u.count.saturating_sub(1);
            u.left_at = self.clock;
        }
        self.trim(keep_idle);
    }

    /// Unmounts the least recently used unused volumes past `keep`.
    fn trim(&mut self, keep: usize) {
        let mut unused: Vec<(u64, PathBuf)> = self
            .users
            .iter()
            .filter(|(_, u)| u.count == 0)
            .map(|(w, u)| (u.left_at, w.clone()))
            .collect();
        if unused.len() <= keep {
            return;
        }
        unused.sort();
        for (_, ws) in &unused[..unused.len() - keep] {
            self.users.remove(ws);
            if let Err(e) = unmount(&Paths::of(ws)) {
                tracing::warn!("cannot unmount the volume of {}: {e}", ws.display());
            }
        }
    }
}

/// Detaches the mounts at or beneath `dir` and, if `dir` is a volume's
/// workspace, the volume, and removes its image; clears the immutable
/// flag of the volumes' directories beneath it. `dir` is then plain files
/// for the caller to remove. A user still in it keeps what it opened.
pub fn release(dir: &Path) -> std::io::Result<()> {
    let p = Paths::of(dir);
    let mut reg = IN_USE.lock();
    unmount_beneath(dir)?;
    reg.users.retain(|w, _| !w.starts_with(dir));
    mutable_beneath(dir)?;
    if p.root.exists() || p.image.exists() {
        unmount_beneath(&p.root)?;
        immutable(&p.root, false)?;
        for r in [std::fs::remove_dir(&p.root), std::fs::remove_file(&p.image)] {
            match r {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
                _ => {}
            }
        }
    }
    Ok(())
}

/// How deep beneath a released directory volumes are looked for:
/// `data/jobs/ID/workspace` is three levels below a data directory, which
/// may itself be a few below the directory released (a test's home).
const RELEASE_DEPTH: usize = 8;

/// Clears the immutable flag of `dir` and of the directories beneath it,
/// a few levels down (only cordon sets one: a sandbox has no
/// `CAP_LINUX_IMMUTABLE`). Each is opened beneath its parent, never
/// through a link; nothing is mounted beneath `dir` any more.
fn mutable_beneath(dir: &Path) -> std::io::Result<()> {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let top = match rustix::fs::open(dir, flags, rustix::fs::Mode::empty()) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP) => {
            return Ok(());
        }
        Err(e) => return Err(e.into()),
    };
    fn walk(fd: rustix::fd::OwnedFd, depth: usize, flags: OFlags) -> std::io::Result<()> {
        set_immutable(&fd, false)?;
        if depth == 0 {
            return Ok(());
        }
        let mut names = Vec::new();
        for entry in rustix::fs::Dir::read_from(&fd)? {
            let entry = entry?;
            let name = entry.file_name();
            if entry.file_type() == rustix::fs::FileType::Directory && name != c"." && name != c".."
            {
                names.push(name.to_owned());
            }
        }
        for name in names {
            match rustix::fs::openat(&fd, name.as_c_str(), flags, rustix::fs::Mode::empty()) {
                Ok(child) => walk(child, depth - 1, flags)?,
                Err(
                    rustix::io::Errno::NOENT | rustix::io::Errno::NOTDIR | rustix::io::Errno::LOOP,
                ) => {}
                Err(e) => return Err(e.into()),
            }
        }
        Ok(())
    }
    walk(top, RELEASE_DEPTH, flags)
}

/// Sets or clears a directory's immutable flag, where its file system
/// has one; a missing directory is fine.
fn immutable(dir: &Path, on: bool) -> std::io::Result<()> {
    let fd = match rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(rustix::io::Errno::NOENT) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    set_immutable(&fd, on)
}

fn set_immutable(fd: &rustix::fd::OwnedFd, on: bool) -> std::io::Result<()> {
    use rustix::fs::IFlags;
    let flags = match rustix::fs::ioctl_getflags(fd) {
        Ok(f) => f,
        // No such flags here (tmpfs before 6.0, some network file
        // systems): nothing to set, or to clear.
        Err(rustix::io::Errno::NOTTY | rustix::io::Errno::OPNOTSUPP) => return Ok(()),
        Err(e) => return Err(e.into()),
    };
    let want = if on {
        flags | IFlags::IMMUTABLE
    } else {
        flags - IFlags::IMMUTABLE
    };
    if want == flags {
        return Ok(());
    }
    match rustix::fs::ioctl_setflags(fd, want) {
        Err(rustix::io::Errno::NOTTY | rustix::io::Errno::OPNOTSUPP) => Ok(()),
        r => r.map_err(Into::into),
    }
}

/// Makes the workspace `workspace` (absent, or an empty directory) a
/// volume with `room` bytes free. Its directory keeps its owner and mode.
/// On failure nothing of the volume is left.
fn make(workspace: &Path, room: u64) -> Result<()> {
    if !supported() {
        return Err(VolumeError::Unsupported);
    }
    // One at a time: each may run mkfs, and requests (a tenant's new
    // sessions) must not make the host start them by the hundred. The
    // lock also guards the templates of fresh volumes.
    static MAKING: std::sync::Mutex<Templates> = std::sync::Mutex::new(Templates::new());
    let mut templates = MAKING.lock().unwrap_or_else(|p| p.into_inner());
    let p = Paths::of(workspace);
    match std::fs::create_dir(workspace) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
            let mut entries = std::fs::read_dir(workspace)
                .map_err(VolumeError::io(format!("read {}", workspace.display())))?;
            if entries.next().is_some() {
                return Err(VolumeError::NotEmpty(workspace.to_path_buf()));
            }
        }
        Err(e) => {
            return Err(VolumeError::io(format!("create {}", workspace.display()))(
                e,
            ));
        }
    }
    let began = std::time::Instant::now();
    let made = (|| {
        let meta = std::fs::symlink_metadata(workspace)
            .map_err(VolumeError::io(format!("stat {}", workspace.display())))?;
        let image = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create_new(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&p.image)
            .map_err(VolumeError::io(format!("create {}", p.image.display())))?;
        let capacity = MIN_CAPACITY.max(room.saturating_mul(8));
        image
            .set_len(capacity)
            .map_err(VolumeError::io("size the image"))?;
        std::fs::create_dir(&p.root)
            .map_err(VolumeError::io(format!("create {}", p.root.display())))?;
        // Unmounted, neither takes a file (see the module's rules).
        for dir in [&p.root, &p.workspace] {
            immutable(dir, true)
                .map_err(VolumeError::io(format!("make {} immutable", dir.display())))?;
        }
        let kind = Key {
            len: capacity,
            label: LABEL,
        };
        match templates.of(&kind) {
            Some(template) => {
                template
                    .write_to(&image)
                    .map_err(VolumeError::io("copy a fresh volume"))?;
                mount_new(&image, &p)?;
            }
            None => {
                format(&image, &p, room)?;
                match take_template(&image, &p) {
                    Ok(Some(t)) => templates.keep(t),
                    // Tried again with the next volume.
                    Ok(None) => {}
                    Err(e) => tracing::warn!("cannot keep a fresh volume to copy: {e}"),
                }
                if !mount_root(&p.root) {
                    mount(&p)?;
                }
            }
        }
        drop(templates);
        // The tree the sandbox sees, as the directory it replaces was.
        let tree = p.root.join(TREE);
        std::os::unix::fs::lchown(&tree, Some(meta.uid()), Some(meta.gid()))
            .map_err(VolumeError::io("own the volume's tree"))?;
        std::fs::set_permissions(&tree, std::fs::Permissions::from_mode(meta.mode() & 0o7777))
            .map_err(VolumeError::io("set the volume's tree's mode"))?;
        if !mount_root(&p.workspace) {
            rustix::mount::mount_bind(&tree, workspace)
                .map_err(|e| VolumeError::io("bind the volume onto the workspace")(e.into()))?;
        }
        fit_paths(&p, room)
    })();
    if made.is_err() {
        let _ = unmount_beneath(workspace);
        let _ = unmount_beneath(&p.root);
        let _ = immutable(&p.workspace, false);
        let _ = immutable(&p.root, false);
        let _ = std::fs::remove_dir(&p.root);
        let _ = std::fs::remove_file(&p.image);
    }
    tracing::debug!(workspace = %workspace.display(), took = ?began.elapsed(), ok = made.is_ok(), "made a volume");
    made
}

/// Makes the file system of a fresh volume in `image`, mounted at its
/// root: the tree (root's, for now) and the balloon leaving `room`.
fn format(image: &std::fs::File, p: &Paths, room: u64) -> Result<()> {
    mkfs(&p.image)?;
    mount_new(image, p)?;
    std::fs::create_dir(p.root.join(TREE)).map_err(VolumeError::io("create the volume's tree"))?;
    let _ = std::fs::remove_dir(p.root.join("lost+found"));
    std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(p.root.join(BALLOON))
        .map_err(VolumeError::io("create the balloon"))?;
    fit_paths(p, room)
}

/// Mounts `image`, made just now, at the volume's root.
fn mount_new(image: &std::fs::File, p: &Paths) -> Result<()> {
    crate::loopdev::mount_new_ext4(image, &p.root, MOUNT_FLAGS, MOUNT_DATA)
        .map_err(|e| VolumeError::io("mount the volume")(e))
}

/// Unmounts the volume just formatted in `image` and reads it as the
/// template of the next ones, if its file system is gone. Nothing but
/// cordon has written to it: its workspace is not bound yet, and the
/// making lock is held.
fn take_template(image: &std::fs::File, p: &Paths) -> std::io::Result<Option<Template>> {
    // Not detached: the file system must be written out and gone before
    // its image is read. Busy: a copy of the mount propagated into another
    // namespace (a sandbox being built) is in use, and the unmount, which
    // would reach it, is refused; the volume stays mounted here.
    match rustix::mount::unmount(&p.root, UnmountFlags::NOFOLLOW) {
        Ok(()) => {}
        Err(rustix::io::Errno::BUSY) => {
            tracing::debug!("a fresh volume is busy elsewhere: not copied this time");
            return Ok(None);
        }
        Err(e) => return Err(e.into()),
    }
    // Gone from this mount namespace is not gone: a sandbox starting
    // meanwhile (this server's, another's) copied the host's mounts into
    // a namespace of its own, and the copy keeps the file system alive,
    // its last writes not yet in the image, until dropped. Read then, the
    // copies would lack them (seen: the tree missing). Only once it is
    // shut down has its loop device detached itself.
    if crate::loopdev::is_attached(image)? {
        tracing::debug!("a fresh volume is still mounted elsewhere: not copied this time");
        return Ok(None);
    }
    let template = Template::read(image, LABEL)?;
    if template.is_none() {
        tracing::debug!("a fresh volume holds too much to copy");
    }
    Ok(template)
}

/// Mounts the volume at `p`, one cordon made, whose mounts are gone.
fn mount(p: &Paths) -> Result<()> {
    if !supported() {
        return Err(VolumeError::Unsupported);
    }
    let image = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&p.image)
        .map_err(VolumeError::io(format!("open {}", p.image.display())))?;
    // Only an image cordon made: a root-owned regular file, not linked.
    let meta = image
        .metadata()
        .map_err(VolumeError::io("stat the image"))?;
    if !meta.is_file() || meta.uid() != 0 || meta.nlink() != 1 {
        return Err(VolumeError::io(format!("{}", p.image.display()))(
            std::io::Error::other("not an image cordon made"),
        ));
    }
    if !mount_root(&p.root) {
        crate::loopdev::mount_ext4(&image, &p.root, MOUNT_FLAGS, MOUNT_DATA)
            .map_err(|e| VolumeError::io("mount the volume")(e))?;
    }
    if !mount_root(&p.workspace) {
        rustix::mount::mount_bind(p.root.join(TREE), &p.workspace)
            .map_err(|e| VolumeError::io("bind the volume onto the workspace")(e.into()))?;
    }
    Ok(())
}

/// Detaches the volume at `p`: its workspace's bind, then its root. What
/// a user opened stays usable until closed.
fn unmount(p: &Paths) -> std::io::Result<()> {
    for point in [&p.workspace, &p.root] {
        while mount_root(point) {
            match rustix::mount::unmount(point, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
                Ok(()) => {}
                Err(rustix::io::Errno::INVAL) => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// If `workspace` is a mounted volume, sets its free space to `room` and
/// gives the volume to measure its file system by (see [`Mounted::used`]).
/// Called as a sandbox starts with a disk budget.
pub(crate) fn fit(workspace: &Path, room: u64) -> Result<Option<Mounted>> {
    let p = Paths::of(workspace);
    let Some(dev) = volume_dev(&p) else {
        return Ok(None);
    };
    fit_paths(&p, room)?;
    Ok(Some(Mounted {
        workspace: p.workspace,
        dev,
    }))
}

/// A volume mounted at a workspace, as [`fit`] found it.
#[derive(Debug)]
pub(crate) struct Mounted {
    workspace: PathBuf,
    dev: (u32, u32),
}

impl Mounted {
    /// The device of its file system.
    pub(crate) fn dev(&self) -> u64 {
        rustix::fs::makedev(self.dev.0, self.dev.1)
    }

    /// Bytes its file system holds, by its own count (`fstatvfs`): every
    /// file on it, those deleted but still open or in flight on a socket
    /// (which no walk finds) among them, and its constant metadata and
    /// balloon. Opened for each count and checked to be the same file
    /// system: nothing is held open between two (which would keep an
    /// unmounted volume's loop device), and a volume unmounted meanwhile
    /// is an error, not the count of the directory beneath it.
    pub(crate) fn used(&self) -> std::io::Result<u64> {
        let fd = rustix::fs::open(
            &self.workspace,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            rustix::fs::Mode::empty(),
        )?;
        if rustix::fs::fstat(&fd)?.st_dev != self.dev() {
            return Err(std::io::Error::other("the volume is no longer mounted"));
        }
        let v = rustix::fs::fstatvfs(&fd)?;
        Ok(v.f_blocks
            .saturating_sub(v.f_bfree)
            .saturating_mul(v.f_frsize))
    }
}

/// Sizes the balloon so that the file system has `room` bytes free.
fn fit_paths(p: &Paths, room: u64) -> Result<()> {
    let balloon = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(p.root.join(BALLOON))
        .map_err(VolumeError::io("open the balloon"))?;
    let vfs = rustix::fs::fstatvfs(balloon.as_fd())
        .map_err(|e| VolumeError::io("statvfs the volume")(e.into()))?;
    let free = vfs.f_bavail.saturating_mul(vfs.f_frsize);
    let held = balloon
        .metadata()
        .map_err(VolumeError::io("stat the balloon"))?
        .len();
    let want = (held + free).saturating_sub(room) & !4095;
    if held + free < room {
        tracing::warn!(
            "the volume of {} can hold {} MiB more, less than the {} MiB asked",
            p.workspace.display(),
            (held + free) >> 20,
            room >> 20
        );
    }
    if want < held {
        balloon
            .set_len(want)
            .map_err(VolumeError::io("shrink the balloon"))?;
    } else if want > held {
        rustix::fs::fallocate(balloon.as_fd(), FallocateFlags::empty(), 0, want)
            .map_err(|e| VolumeError::io("grow the balloon")(e.into()))?;
    }
    Ok(())
}

/// Whether `p` is a mounted volume: the workspace and the volume's root
/// are both mount roots of the same file system.
fn is_volume(p: &Paths) -> bool {
    volume_dev(p).is_some()
}

/// The device of `p`'s file system if it is a mounted volume.
fn volume_dev(p: &Paths) -> Option<(u32, u32)> {
    match (mount_of(&p.workspace), mount_of(&p.root)) {
        (Some(a), Some(b)) if a == b => Some(a),
        _ => None,
    }
}

/// Whether `path` is the root of a mount.
fn mount_root(path: &Path) -> bool {
    mount_of(path).is_some()
}

/// The device of the file system mounted at `path`, if `path` is the root
/// of a mount (not following a link).
fn mount_of(path: &Path) -> Option<(u32, u32)> {
    rustix::fs::statx(
        rustix::fs::CWD,
        path,
        rustix::fs::AtFlags::SYMLINK_NOFOLLOW,
        rustix::fs::StatxFlags::BASIC_STATS,
    )
    .ok()
    .filter(|s| {
        s.stx_attributes
            .contains(rustix::fs::StatxAttributes::MOUNT_ROOT)
    })
    .map(|s| (s.stx_dev_major, s.stx_dev_minor))
}

/// Makes an ext4 file system in `image`: no reserved blocks, inode tables
/// and journal left unwritten (the image stays sparse), no discard of a
/// file that is all holes.
fn mkfs(image: &Path) -> Result<()> {
    let out = Command::new("mkfs.ext4")
        .args([
            "-q", "-F", "-b", "4096", "-m", "0", "-J", "size=32", "-L", LABEL,
        ])
        .args(["-E", "lazy_itable_init=1,lazy_journal_init=1,nodiscard"])
        // No blocks kept for growing it (4 MiB of the host's disk per
        // volume): it is never grown; its balloon shrinks instead. The
        // checksums seeded apart from the UUID, so that a copy's can be
        // changed alone (`fresh`).
        .args(["-O", "^resize_inode,metadata_csum_seed"])
        .arg(image)
        .env_clear()
        .env("PATH", TOOL_PATH)
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                VolumeError::Mkfs("not found; install e2fsprogs".into())
            }
            _ => VolumeError::Mkfs(e.to_string()),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        let err = String::from_utf8_lossy(&out.stderr);
        Err(VolumeError::Mkfs(format!("{}: {}", out.status, err.trim())))
    }
}

/// Detaches every mount at or beneath `dir` (deepest first), so that
/// removing `dir` removes files, not a volume's contents one by one, and
/// leaves no mount behind. A sandbox still using one keeps it until it
/// ends; then its loop device detaches and the image's space is freed.
pub fn unmount_beneath(dir: &Path) -> std::io::Result<()> {
    let Ok(dir) = dir.canonicalize() else {
        return Ok(());
    };
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut points: Vec<PathBuf> = info
        .lines()
        .filter_map(|line| line.split(' ').nth(4))
        .map(unescape)
        .filter(|p| p.starts_with(&dir))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
    points.dedup();
    for point in points {
        // Stacked mounts on one point come off one at a time.
        while mount_root(&point) && point != Path::new("/") {
            match rustix::mount::unmount(&point, UnmountFlags::DETACH | UnmountFlags::NOFOLLOW) {
                Ok(()) => {}
                Err(rustix::io::Errno::INVAL) => break,
                Err(e) => return Err(e.into()),
            }
        }
    }
    Ok(())
}

/// A mount point as `/proc/self/mountinfo` escapes it (`\040` for a
/// space, and so on).
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'\\'
            && i + 3 < b.len()
            && b[i + 1..=i + 3].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            out.push((b[i + 1] - b'0') * 64 + (b[i + 2] - b'0') * 8 + (b[i + 3] - b'0'));
            i += 4;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    PathBuf::from(OsString::from_vec(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mount_points_are_unescaped() {
        assert_eq!(unescape(r"/a\040b/c\134d"), PathBuf::from("/a b/c\\d"));
        assert_eq!(unescape(r"/plain\04"), PathBuf::from(r"/plain\04"));
    }

    /// Taken by each test here that mounts: one test's namespace holding
    /// copies of the host's mounts must not keep another's alive.
    static MOUNTING: std::sync::Mutex<()> = std::sync::Mutex::new(());

    /// This test's turn to mount, if this process can make volumes (under
    /// CI, as root, it must); `None`: the test is skipped.
    fn mounting() -> Option<std::sync::MutexGuard<'static, ()>> {
        if !supported() {
            assert!(
                std::env::var("CI").is_err(),
                "volumes need root, and CI runs as root"
            );
            eprintln!("skipped: volumes need root");
            return None;
        }
        Some(MOUNTING.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Entered while it is being made (a worker's file request racing the
    /// job it just claimed), a volume is never mounted half-made: every
    /// enter sees no workspace yet or the made volume, and the make
    /// succeeds.
    #[test]
    fn a_volume_being_made_is_entered_only_once_made() {
        let Some(_one) = mounting() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("workspace");
        let volumes = Volumes::keeping(0);
        let mut enters = 0;
        std::thread::scope(|s| {
            let maker = s.spawn(|| volumes.make_workspace(&ws, Some(16 << 20)));
            while !maker.is_finished() {
                match volumes.enter(&ws) {
                    Ok(_in_use) => enters += 1,
                    Err(e) => panic!("entered while it was being made: {e}"),
                }
            }
            let made = maker.join().unwrap().expect("the volume is made");
            assert!(made.is_volume());
        });
        assert!(enters > 0);
        release(&ws).unwrap();
    }

    /// After the first volume of a size, the next are copies of its fresh
    /// image: each must still be a file system of its own, sound, empty
    /// whatever the others hold, with its own UUID, its directory's owner
    /// and mode, and the room its budget gives.
    #[test]
    fn a_volume_copied_from_a_fresh_one_is_a_file_system_of_its_own() {
        use std::os::unix::fs::{DirBuilderExt, FileExt};
        let Some(_one) = mounting() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let volumes = Volumes::keeping(0);
        // (name, owner, mode, budget): the third has another budget, but
        // an image of the same size, so it is a copy too.
        let specs = [
            ("a", 0, 0o755, 16u64 << 20),
            ("b", 1234, 0o700, 16 << 20),
            ("c", 4321, 0o750, 200 << 20),
        ];
        let mut made = Vec::new();
        for (name, owner, mode, budget) in specs {
            let ws = dir.path().join(name);
            std::fs::DirBuilder::new().mode(mode).create(&ws).unwrap();
            std::fs::set_permissions(&ws, std::fs::Permissions::from_mode(mode)).unwrap();
            std::os::unix::fs::chown(&ws, Some(owner), Some(owner)).unwrap();
            // (`make_workspace` enters a directory that exists as it is.)
            make(&ws, room(budget)).unwrap();
            let in_use = volumes.enter(&ws).unwrap();
            assert!(in_use.is_volume());
            // What one holds, the next must not.
            assert_eq!(
                std::fs::read_dir(&ws).unwrap().count(),
                0,
                "{name} is not empty"
            );
            std::fs::write(ws.join(format!("from-{name}")), name).unwrap();
            let meta = std::fs::metadata(&ws).unwrap();
            assert_eq!((meta.uid(), meta.gid()), (owner, owner), "{name}");
            assert_eq!(meta.mode() & 0o7777, mode, "{name}");
            let vfs = rustix::fs::statvfs(&ws).unwrap();
            let free = vfs.f_bavail * vfs.f_frsize;
            let want = room(budget);
            assert!(
                free.abs_diff(want) < 8 << 20,
                "{name}: {} MiB free, {} MiB asked",
                free >> 20,
                want >> 20
            );
            made.push((ws, in_use));
        }
        let images: Vec<PathBuf> = made.iter().map(|(ws, _)| Paths::of(ws).image).collect();
        drop(made);
        unmount_beneath(dir.path()).unwrap();
        let mut uuids = Vec::new();
        for image in &images {
            crate::fresh::assert_sound(image);
            // The superblock is 1 KiB in; its UUID at 0x68.
            let mut uuid = [0; 16];
            std::fs::File::open(image)
                .unwrap()
                .read_exact_at(&mut uuid, 1024 + 0x68)
                .unwrap();
            uuids.push(uuid);
        }
        uuids.sort();
        uuids.dedup();
        assert_eq!(uuids.len(), 3, "the volumes share a UUID");
        // Mounted again, each holds what it was given, and only that.
        for (name, ..) in specs {
            let ws = dir.path().join(name);
            let _in_use = volumes.enter(&ws).unwrap();
            let names: Vec<_> = std::fs::read_dir(&ws)
                .unwrap()
                .map(|e| e.unwrap().file_name().into_string().unwrap())
                .collect();
            assert_eq!(names, [format!("from-{name}")], "{name}");
        }
        for (name, ..) in specs {
            release(&dir.path().join(name)).unwrap();
        }
    }

    /// A fresh volume whose file system a copy of its mount in another
    /// namespace keeps alive (a sandbox starting meanwhile) has not all
    /// reached its image: it is not read as a template then. Without the
    /// check, copies lacked the workspace's tree.
    #[test]
    fn a_fresh_volume_mounted_elsewhere_is_not_copied() {
        use std::io::BufRead;
        let Some(_one) = mounting() else {
            return;
        };
        let dir = tempfile::tempdir().unwrap();
        let p = Paths::of(&dir.path().join("workspace"));
        std::fs::create_dir(&p.root).unwrap();
        let image = std::fs::File::options()
            .read(true)
            .write(true)
            .create_new(true)
            .open(&p.image)
            .unwrap();
        image.set_len(MIN_CAPACITY).unwrap();
        format(&image, &p, room(16 << 20)).unwrap();
        // A namespace with a copy of the host's mounts, as a sandbox's
        // supervisor has while it builds its root.
        let mut holder = Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg("echo ready; exec sleep 60")
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let mut ready = String::new();
        std::io::BufReader::new(holder.stdout.take().unwrap())
            .read_line(&mut ready)
            .unwrap();
        assert_eq!(ready, "ready\n");
        let taken = take_template(&image, &p);
        let _ = holder.kill();
        let _ = holder.wait();
        assert!(
            taken.unwrap().is_none(),
            "read while its file system lived on in another namespace"
        );
        // The copy gone, the file system shuts down and its image is whole.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while crate::loopdev::is_attached(&image).unwrap() {
            assert!(
                std::time::Instant::now() < deadline,
                "the loop device stays"
            );
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        crate::fresh::assert_sound(&p.image);
    }

    #[test]
    fn a_volume_s_paths_are_beside_its_workspace() {
        let p = Paths::of(Path::new("/srv/jobs/job_1/workspace"));
        assert_eq!(p.root, Path::new("/srv/jobs/job_1/workspace.volume"));
        assert_eq!(p.image, Path::new("/srv/jobs/job_1/workspace.volume.img"));
    }
}
