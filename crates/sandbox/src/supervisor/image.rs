//! An image's root file system: its layers, read-only and shared by every
//! sandbox of every image that has them, under a writable layer of this
//! sandbox's own (overlayfs, mounted in the sandbox's user namespace with
//! `userxattr`, so the whiteouts and opaque markers the store wrote are
//! read as the image meant them, and `volatile`, as the layer is scratch).
//!
//! Everything in an image is hostile, and this runs before the pivot, where
//! an absolute link would reach the host's tree: every mount point and
//! generated file is placed by [`ensure`], which walks by descriptor,
//! follows no link, and replaces whatever of the image's stands in the way.

use std::os::fd::OwnedFd;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, FileType, Mode, OFlags};
use rustix::io::Errno;
use rustix::mount::MountFlags;

use super::error::{Context, Result, SetupError};
use super::idmap::Prepared;
use super::mount::{RO, set_attrs};
use super::setup::{Root, STAGE, Source, bind, generated_etc, mkdir, tmpfs, write_file};
use crate::protocol::{ImageRoot, SetupSpec};

/// Under the stage: the layers' mount points, the scratch directory's, and
/// the new root.
const LAYERS: &str = "l";
const SCRATCH: &str = "s";
const NEW_ROOT: &str = "root";
/// In the scratch directory: overlay's upper and work directories.
pub(super) const UPPER: &str = "upper";
pub(super) const WORK: &str = "work";

/// Mounts the image's root at `STAGE/root` and writes cordon's files into
/// its `/etc`.
pub(super) fn image_root(
    spec: &SetupSpec,
    image: &ImageRoot,
    prepared: &mut Prepared,
) -> Result<Root> {
    let mut layers = Vec::with_capacity(image.layers.len());
    for l in &image.layers {
        layers.push(Source::open_resolved(l, prepared)?);
    }
    let scratch = Source::open_resolved(&image.scratch, prepared)?;

    let stage = Path::new(STAGE);
    tmpfs(
        stage,
        "mode=0700,size=1m,nr_inodes=4096",
        MountFlags::NOSUID | MountFlags::NODEV,
    )?;
    let dir = stage.join(LAYERS);
    mkdir(&dir, 0o700)?;
    let mut lower = Vec::with_capacity(layers.len());
    for (i, src) in layers.iter().enumerate() {
        let at = dir.join(i.to_string());
        mkdir(&at, 0o755)?;
        bind(src, &at)?;
        set_attrs(&at, true, RO)?;
        lower.push(at.display().to_string());
    }
    let s = stage.join(SCRATCH);
    mkdir(&s, 0o700)?;
    bind(&scratch, &s)?;
    let root = stage.join(NEW_ROOT);
    mkdir(&root, 0o755)?;
    // `volatile`: overlay skips the sandbox's fsyncs and syncfs. The
    // writable layer is scratch, gone when the sandbox ends (a build
    // step's survives as the tar written from it), so syncing it keeps
    // nothing; and dpkg syncs every file it unpacks, which made
    // `apt-get install` a third slower than under buildah, whose build
    // containers are volatile too. The workspace is a bind, not
    // overlay: its fsyncs still reach the disk.
    let data = format!(
        "lowerdir={},upperdir={}/{UPPER},workdir={}/{WORK},userxattr,volatile",
        lower.join(":"),
        s.display(),
        s.display()
    );
    let data = std::ffi::CString::new(data)
        .map_err(|_| SetupError::new("overlay options", Errno::INVAL))?;
    rustix::mount::mount(
        "overlay",
        &root,
        "overlay",
        MountFlags::NOSUID | MountFlags::NODEV,
        data.as_c_str(),
    )
    .ctx(|| format!("mount the image's {} layers (overlayfs)", layers.len()))?;
    drop((layers, scratch));

    write_etc(&root, spec)?;
    Ok(Root {
        path: root,
        image: true,
    })
}

/// cordon's files in the image's `/etc`: `hosts`, `hostname` and
/// `resolv.conf` always; `passwd` and `group` only where the image has
/// none (its users are its own); the broker's trust where it has one.
pub(super) fn write_etc(root: &Path, spec: &SetupSpec) -> Result<()> {
    let etc = ensure(root, "etc", Some(0o755))?;
    let etc_fd = rustix::fs::open(
        &etc,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ctx(|| "open the image's /etc".into())?;
    for (name, body) in generated_etc(spec) {
        if matches!(name, "passwd" | "group") && is_file(&etc_fd, name) {
            continue;
        }
        write_file(&ensure(root, &format!("etc/{name}"), None)?, &body)?;
    }
    if let Some((ca, bundle)) = &spec.trust {
        ensure(root, "etc/cordon", Some(0o755))?;
        for (name, body) in [("ca.pem", ca), ("bundle.pem", bundle)] {
            write_file(&ensure(root, &format!("etc/cordon/{name}"), None)?, body)?;
        }
    }
    Ok(())
}

fn is_file(dir: &impl rustix::fd::AsFd, name: &str) -> bool {
    rustix::fs::statat(dir, name, AtFlags::SYMLINK_NOFOLLOW)
        .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile)
}

/// Makes `rel` under the image's `root` a real directory (made with
/// `dir_mode`) or, without a mode, a plain file, and returns its path.
///
/// The walk is by descriptor and follows no link: a link, or an entry of
/// the wrong type, on the way is removed from the sandbox's writable layer
/// and replaced, so the path returned is all real directories that nothing
/// can change before the pivot (no process of the sandbox exists yet). An
/// image that puts a non-empty directory where cordon needs a file is
/// refused.
pub(super) fn ensure(root: &Path, rel: &str, dir_mode: Option<u32>) -> Result<PathBuf> {
    let names: Vec<&str> = rel.split('/').filter(|c| !c.is_empty()).collect();
    if names.is_empty() || names.iter().any(|c| *c == "." || *c == "..") {
        return Err(SetupError {
            what: format!("{rel}: not a plain path inside the sandbox"),
            errno: 0,
        });
    }
    let mut dir = rustix::fs::open(
        root,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ctx(|| "open the image's root".into())?;
    for (i, name) in names.iter().enumerate() {
        let last = i + 1 == names.len();
        let want_dir = !last || dir_mode.is_some();
        let found = match rustix::fs::statat(&dir, *name, AtFlags::SYMLINK_NOFOLLOW) {
            Ok(st) => Some(FileType::from_raw_mode(st.st_mode)),
            Err(Errno::NOENT) => None,
            Err(e) => return Err(SetupError::new(format!("look at /{rel} in the image"), e)),
        };
        let fits = match found {
            Some(FileType::Directory) => want_dir,
            Some(FileType::RegularFile) => !want_dir,
            _ => false,
        };
        if !fits {
            if let Some(kind) = found {
                let flags = if kind == FileType::Directory {
                    AtFlags::REMOVEDIR
                } else {
                    AtFlags::empty()
                };
                rustix::fs::unlinkat(&dir, *name, flags).map_err(|e| SetupError {
                    what: format!(
                        "the image has {} at /{} where cordon needs {}: {}",
                        describe(kind),
                        names[..=i].join("/"),
                        if want_dir { "a directory" } else { "a file" },
                        std::io::Error::from(e)
                    ),
                    errno: 0,
                })?;
            }
            if want_dir {
                let mode = if last {
                    dir_mode.unwrap_or(0o755)
                } else {
                    0o755
                };
                rustix::fs::mkdirat(&dir, *name, Mode::from_raw_mode(mode))
                    .ctx(|| format!("mkdir /{}", names[..=i].join("/")))?;
                // The umask may have narrowed it.
                rustix::fs::chmodat(&dir, *name, Mode::from_raw_mode(mode), AtFlags::empty())
                    .ctx(|| format!("chmod /{}", names[..=i].join("/")))?;
            } else {
                rustix::fs::openat(
                    &dir,
                    *name,
                    OFlags::CREATE
                        | OFlags::EXCL
                        | OFlags::WRONLY
                        | OFlags::NOFOLLOW
                        | OFlags::CLOEXEC,
                    Mode::from_raw_mode(0o644),
                )
                .ctx(|| format!("create /{rel}"))?;
            }
        }
        if !last {
            dir = rustix::fs::openat(
                &dir,
                *name,
                OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .ctx(|| format!("open /{}", names[..=i].join("/")))?;
        }
    }
    Ok(root.join(names.join("/")))
}

fn describe(kind: FileType) -> &'static str {
    match kind {
        FileType::Directory => "a directory",
        FileType::Symlink => "a symbolic link",
        FileType::RegularFile => "a file",
        _ => "a special file",
    }
}

/// A build step's output files, opened while the outer supervisor still
/// has the host's view (the host made them; the sandbox cannot reach them).
pub(super) struct Step {
    tar: std::fs::File,
    status: std::fs::File,
    skip: Vec<String>,
}

impl Step {
    pub(super) fn open(image: &ImageRoot) -> Result<Option<Step>> {
        let Some(out) = &image.step else {
            return Ok(None);
        };
        let open = |path: &str| {
            std::fs::OpenOptions::new()
                .write(true)
                .truncate(true)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(path)
                .ctx(|| format!("open the build step's output {path}"))
        };
        Ok(Some(Step {
            tar: open(&out.tar)?,
            status: open(&out.status)?,
            skip: out.skip.clone(),
        }))
    }
}

/// Writes the build step's changes (the writable layer's `upper`, under
/// `scratch`) as a layer tar, then `ok` or why not to its status file.
/// Run in the sandbox's user namespace once its last process is gone: the
/// files have the image's ids here, and every one is readable.
pub(super) fn write_step(scratch: &OwnedFd, step: Step) {
    use std::io::Write;
    let Step {
        tar,
        mut status,
        skip,
    } = step;
    let written = rustix::fs::openat(
        scratch,
        UPPER,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| format!("open the writable layer: {e}"))
    .and_then(|upper| {
        let ids = |u: u32, g: u32| {
            let max = crate::protocol::IMAGE_IDS;
            (u < max && g < max).then_some((u, g))
        };
        let skip = |path: &[u8], _| skip.iter().any(|s| s.as_bytes() == path);
        cordon_image::changes::write_changes_at(&upper, &ids, &skip, std::io::BufWriter::new(tar))
            .map_err(|e| e.to_string())
    });
    let _ = match written {
        Ok(_) => status.write_all(b"ok"),
        Err(e) => status.write_all(e.as_bytes()),
    };
}

/// Removes the sandbox's writable layer once its last process is gone,
/// through `scratch`, the handle [`make_scratch`] returned: the outer
/// supervisor's root is the sandbox's since the pivot (they share a mount
/// namespace), so no host path would reach it. Being root in the sandbox's
/// user namespace, it may remove what any of the sandbox's ids made.
pub(super) fn remove_scratch(scratch: &OwnedFd) {
    for name in [UPPER, WORK] {
        remove_tree_at(scratch, name, 0);
    }
}

/// Directory levels [`remove_tree_at`] descends; deeper ones are left to
/// the host's removal of the scratch directory.
const MAX_DEPTH: usize = 256;

/// Removes `name` under `dir` and everything beneath it, by descriptor,
/// following no link; best effort.
fn remove_tree_at(dir: &OwnedFd, name: &str, depth: usize) {
    let flags = OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    if let Ok(sub) = rustix::fs::openat(dir, name, flags, Mode::empty())
        && depth < MAX_DEPTH
    {
        // Overlay leaves its work directory mode 000.
        let _ = rustix::fs::fchmod(&sub, Mode::from_raw_mode(0o700));
        let mut names = Vec::new();
        if let Ok(mut entries) = rustix::fs::Dir::read_from(&sub) {
            while let Some(Ok(e)) = entries.next() {
                let n = e.file_name().to_string_lossy().into_owned();
                if n != "." && n != ".." {
                    names.push((n, e.file_type() == FileType::Directory));
                }
            }
        }
        for (n, is_dir) in names {
            if is_dir {
                remove_tree_at(&sub, &n, depth + 1);
            } else {
                let _ = rustix::fs::unlinkat(&sub, n.as_str(), AtFlags::empty());
            }
        }
        let _ = rustix::fs::unlinkat(dir, name, AtFlags::REMOVEDIR);
        return;
    }
    let _ = rustix::fs::unlinkat(dir, name, AtFlags::empty());
}

/// Mounts the writable layer's disk over its directory, in a mount
/// namespace of this supervisor's own (made here, before the sandbox's
/// other namespaces): no host process sees the mount, and it goes, with
/// its loop device, when the sandbox's last process does.
pub(super) fn mount_disk(image: &ImageRoot, disk: &str) -> Result<()> {
    use rustix::mount::MountPropagationFlags;
    // SAFETY: the outer supervisor has one thread.
    unsafe { rustix::thread::unshare_unsafe(rustix::thread::UnshareFlags::NEWNS) }
        .ctx(|| "a mount namespace for the writable layer's disk".into())?;
    rustix::mount::mount_change(
        "/",
        MountPropagationFlags::REC | MountPropagationFlags::PRIVATE,
    )
    .ctx(|| "make mounts private".into())?;
    // Made by cordon in the store's directory, beside the mount point.
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(disk)
        .ctx(|| format!("open the writable layer's disk {disk}"))?;
    crate::loopdev::mount_ext4(
        &file,
        Path::new(&image.scratch),
        MountFlags::NOSUID | MountFlags::NODEV,
        c"discard,noinit_itable",
    )
    .map_err(|e| SetupError {
        what: format!("mount the writable layer's disk: {e}"),
        errno: e.raw_os_error().unwrap_or(0),
    })?;
    Ok(())
}

/// Makes the writable layer's two directories, owned by the sandbox's root
/// (host uid and gid `owner`, when the supervisor is root and not yet in
/// the sandbox's namespace); returns a handle on the scratch directory for
/// [`remove_scratch`].
pub(super) fn make_scratch(image: &ImageRoot, owner: Option<u32>) -> Result<OwnedFd> {
    let base = super::mount::open_no_links(&image.scratch)
        .map_err(|e| SetupError::new(format!("open {}", image.scratch), e))?;
    let dir = rustix::fs::openat(
        &base,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .ctx(|| format!("open {}", image.scratch))?;
    for name in [UPPER, WORK] {
        rustix::fs::mkdirat(&dir, name, Mode::from_raw_mode(0o755))
            .ctx(|| format!("create the writable layer's {name} directory"))?;
        if let Some(owner) = owner {
            rustix::fs::chownat(
                &dir,
                name,
                Some(rustix::fs::Uid::from_raw(owner)),
                Some(rustix::fs::Gid::from_raw(owner)),
                AtFlags::SYMLINK_NOFOLLOW,
            )
            .ctx(|| format!("hand the writable layer's {name} directory to the sandbox"))?;
        }
    }
    Ok(dir)
}
