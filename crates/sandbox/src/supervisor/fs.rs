//! File system operations for the host (`HostMsg::Fs`): stat, list, make
//! a directory, move, remove, on paths as the sandbox sees them.
//!
//! They run on a thread of their own, so that a long one (removing a large
//! tree) holds up no command's output. The thread takes on the file system
//! ids of the user it acts for (`setfsuid`/`setfsgid`, which are per
//! thread): the kernel checks its access, and owns what it makes, as that
//! user's. It answers through a channel and wakes the serve loop with a
//! byte on a pipe.
//!
//! The supervisor is not the sandbox: what its own process shows in
//! `/proc` (its descriptors, its memory's layout) is not the sandbox's to
//! see, so no operation reaches into `/proc`; a command can.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::fs::{DirBuilderExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::mpsc;

use crate::protocol::{
    FS_LIST_MAX, FS_XATTRS_MAX, FileKind, FsAnswer, FsEntry, FsErrorKind, FsFailure, FsOp,
    LinkTarget, SupMsg,
};

/// The prefix of the extended attributes shown as an entry's metadata.
const METADATA_PREFIX: &str = "user.e2b.";

type Job = (u64, FsOp, Option<(u32, u32)>);

/// The thread and its two ends.
pub(super) struct FsWorker {
    jobs: mpsc::Sender<Job>,
    answers: mpsc::Receiver<SupMsg>,
    /// Readable when answers are waiting.
    wake: OwnedFd,
}

impl FsWorker {
    /// Starts the thread; `default` are the ids of a job that names none
    /// (the commands' own; none: the supervisor's).
    pub(super) fn start(default: Option<(u32, u32)>) -> io::Result<FsWorker> {
        let (wake, poke) = rustix::pipe::pipe_with(
            rustix::pipe::PipeFlags::CLOEXEC | rustix::pipe::PipeFlags::NONBLOCK,
        )?;
        let (jobs, todo) = mpsc::channel::<Job>();
        let (done, answers) = mpsc::channel();
        let default = default.unwrap_or_else(|| {
            (
                rustix::process::geteuid().as_raw(),
                rustix::process::getegid().as_raw(),
            )
        });
        std::thread::Builder::new()
            .name("fs".into())
            .spawn(move || {
                for (id, op, user) in todo {
                    let result = as_user(user.unwrap_or(default), || run(op));
                    if done.send(SupMsg::Fs { id, result }).is_err() {
                        return;
                    }
                    // Full means a wake is pending already.
                    let _ = rustix::io::write(&poke, &[1]);
                }
            })?;
        Ok(FsWorker {
            jobs,
            answers,
            wake,
        })
    }

    pub(super) fn submit(&self, id: u64, op: FsOp, user: Option<(u32, u32)>) {
        let _ = self.jobs.send((id, op, user));
    }

    pub(super) fn fd(&self) -> i32 {
        self.wake.as_raw_fd()
    }

    /// The answers ready, the wake-ups taken.
    pub(super) fn ready(&self) -> Vec<SupMsg> {
        let mut sink = [0u8; 64];
        while matches!(rustix::io::read(&self.wake, &mut sink), Ok(n) if n > 0) {}
        self.answers.try_iter().collect()
    }
}

/// Runs `f` with the thread's file system ids set to `(uid, gid)`, then
/// back to the process's.
fn as_user<T>(ids: (u32, u32), f: impl FnOnce() -> T) -> T {
    let own = (
        rustix::process::geteuid().as_raw(),
        rustix::process::getegid().as_raw(),
    );
    // SAFETY: plain syscalls on this thread's credentials.
    unsafe {
        libc::setfsgid(ids.1);
        libc::setfsuid(ids.0);
    }
    let out = f();
    // SAFETY: as above; back to what the process is.
    unsafe {
        libc::setfsuid(own.0);
        libc::setfsgid(own.1);
    }
    out
}

fn failure(kind: FsErrorKind, message: impl Into<String>) -> FsFailure {
    FsFailure {
        kind,
        message: message.into(),
    }
}

fn io_failure(path: &Path, e: &io::Error) -> FsFailure {
    let kind = match e.kind() {
        io::ErrorKind::NotFound => FsErrorKind::NotFound,
        io::ErrorKind::AlreadyExists => FsErrorKind::AlreadyExists,
        io::ErrorKind::PermissionDenied => FsErrorKind::PermissionDenied,
        io::ErrorKind::NotADirectory => FsErrorKind::NotADirectory,
        _ => FsErrorKind::Other,
    };
    failure(kind, format!("{}: {e}", path.display()))
}

/// `path` as an absolute path, refused when it is anything else.
fn absolute(path: &str) -> Result<PathBuf, FsFailure> {
    if !path.starts_with('/') || path.contains('\0') {
        return Err(failure(
            FsErrorKind::Other,
            format!("{path:?} is not an absolute path"),
        ));
    }
    Ok(PathBuf::from(path))
}

fn in_proc(path: &Path) -> bool {
    path.starts_with("/proc")
}

fn refuse_proc(path: &Path) -> Result<(), FsFailure> {
    if in_proc(path) {
        return Err(failure(
            FsErrorKind::Refused,
            format!(
                "{}: /proc is not served here; use a command",
                path.display()
            ),
        ));
    }
    Ok(())
}

fn run(op: FsOp) -> Result<FsAnswer, FsFailure> {
    match op {
        FsOp::Stat { path } => {
            let path = absolute(&path)?;
            refuse_proc(&path)?;
            stat(&path, path.to_string_lossy().into_owned()).map(FsAnswer::Entry)
        }
        FsOp::List { path, depth } => list(&absolute(&path)?, depth.max(1)).map(FsAnswer::Entries),
        FsOp::MakeDir { path } => {
            let path = absolute(&path)?;
            match std::fs::symlink_metadata(&path) {
                Ok(md) if md.is_dir() => {
                    return Err(failure(
                        FsErrorKind::AlreadyExists,
                        format!("{}: directory already exists", path.display()),
                    ));
                }
                Ok(_) => {
                    return Err(failure(
                        FsErrorKind::NotADirectory,
                        format!("{}: exists and is not a directory", path.display()),
                    ));
                }
                Err(_) => {}
            }
            make_dirs(&path)?;
            stat(&path, path.to_string_lossy().into_owned()).map(FsAnswer::Entry)
        }
        FsOp::MakeParents { path, owner } => {
            let path = absolute(&path)?;
            let mut missing = Vec::new();
            let mut at = path.parent();
            while let Some(dir) = at {
                if std::fs::symlink_metadata(dir).is_ok() {
                    break;
                }
                missing.push(dir.to_path_buf());
                at = dir.parent();
            }
            for dir in missing.iter().rev() {
                match std::fs::DirBuilder::new().mode(0o755).create(dir) {
                    Ok(()) => {}
                    Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                    Err(e) => return Err(io_failure(dir, &e)),
                }
                std::os::unix::fs::lchown(dir, Some(owner.0), Some(owner.1))
                    .map_err(|e| io_failure(dir, &e))?;
            }
            Ok(FsAnswer::Done)
        }
        FsOp::Move { from, to } => {
            let (from, to) = (absolute(&from)?, absolute(&to)?);
            std::fs::symlink_metadata(&from).map_err(|e| io_failure(&from, &e))?;
            if let Some(parent) = to.parent() {
                make_dirs(parent)?;
            }
            match std::fs::rename(&from, &to) {
                // Another file system (/tmp and /workspace are): copied,
                // then removed, as mv does.
                Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                    copy_tree(&from, &to)?;
                    let md = std::fs::symlink_metadata(&from).map_err(|e| io_failure(&from, &e))?;
                    if md.is_dir() {
                        std::fs::remove_dir_all(&from)
                    } else {
                        std::fs::remove_file(&from)
                    }
                    .map_err(|e| io_failure(&from, &e))?;
                }
                r => r.map_err(|e| io_failure(&to, &e))?,
            }
            stat(&to, to.to_string_lossy().into_owned()).map(FsAnswer::Entry)
        }
        FsOp::SetMetadata { path, entries } => {
            let path = absolute(&path)?;
            set_metadata(&path, &entries)?;
            Ok(FsAnswer::Done)
        }
        FsOp::Remove { path } => {
            let path = absolute(&path)?;
            let removed = match std::fs::symlink_metadata(&path) {
                Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(()),
                Err(e) => Err(e),
                Ok(md) if md.is_dir() => std::fs::remove_dir_all(&path),
                Ok(_) => std::fs::remove_file(&path),
            };
            removed.map_err(|e| io_failure(&path, &e))?;
            Ok(FsAnswer::Done)
        }
    }
}

/// Copies `from` to `to`: a file with its permissions, a link as a link,
/// a directory with everything in it.
fn copy_tree(from: &Path, to: &Path) -> Result<(), FsFailure> {
    let md = std::fs::symlink_metadata(from).map_err(|e| io_failure(from, &e))?;
    if md.file_type().is_symlink() {
        let target = std::fs::read_link(from).map_err(|e| io_failure(from, &e))?;
        return std::os::unix::fs::symlink(target, to).map_err(|e| io_failure(to, &e));
    }
    if !md.is_dir() {
        return std::fs::copy(from, to)
            .map(|_| ())
            .map_err(|e| io_failure(to, &e));
    }
    std::fs::DirBuilder::new()
        .mode(md.mode() & 0o7777)
        .create(to)
        .map_err(|e| io_failure(to, &e))?;
    for e in std::fs::read_dir(from).map_err(|e| io_failure(from, &e))? {
        let e = e.map_err(|e| io_failure(from, &e))?;
        copy_tree(&e.path(), &to.join(e.file_name()))?;
    }
    Ok(())
}

fn make_dirs(path: &Path) -> Result<(), FsFailure> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(path)
        .map_err(|e| io_failure(path, &e))
}

fn kind_of(ft: std::fs::FileType) -> FileKind {
    if ft.is_symlink() {
        FileKind::Symlink
    } else if ft.is_dir() {
        FileKind::Directory
    } else if ft.is_file() {
        FileKind::File
    } else {
        FileKind::Other
    }
}

/// The entry at `path`, named `shown`.
fn stat(path: &Path, shown: String) -> Result<FsEntry, FsFailure> {
    let md = std::fs::symlink_metadata(path).map_err(|e| io_failure(path, &e))?;
    Ok(entry(path, shown, &md))
}

fn entry(path: &Path, shown: String, md: &std::fs::Metadata) -> FsEntry {
    let kind = kind_of(md.file_type());
    let link = (kind == FileKind::Symlink)
        .then(|| {
            let target = std::fs::canonicalize(path).ok()?;
            let to = std::fs::metadata(&target).ok()?;
            Some(LinkTarget {
                path: target.to_string_lossy().into_owned(),
                kind: kind_of(to.file_type()),
                mode: to.mode(),
            })
        })
        .flatten();
    FsEntry {
        path: shown,
        kind,
        mode: md.mode(),
        size: md.size(),
        uid: md.uid(),
        gid: md.gid(),
        mtime_ns: md.mtime() * 1_000_000_000 + md.mtime_nsec(),
        link,
        metadata: metadata(path),
    }
}

/// `path`'s `user.e2b.*` attributes, up to [`FS_XATTRS_MAX`] bytes.
fn metadata(path: &Path) -> Vec<(String, String)> {
    let mut names = vec![0u8; FS_XATTRS_MAX];
    let Ok(n) = rustix::fs::llistxattr(path, &mut names) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    let mut budget = FS_XATTRS_MAX;
    for name in names[..n].split(|&b| b == 0) {
        let Ok(name) = std::str::from_utf8(name) else {
            continue;
        };
        let Some(key) = name.strip_prefix(METADATA_PREFIX) else {
            continue;
        };
        let mut value = vec![0u8; budget.min(FS_XATTRS_MAX)];
        let Ok(len) = rustix::fs::lgetxattr(path, name, &mut value) else {
            continue;
        };
        if key.len() + len > budget {
            break;
        }
        budget -= key.len() + len;
        out.push((
            key.to_string(),
            String::from_utf8_lossy(&value[..len]).into_owned(),
        ));
    }
    out
}

/// Replaces `path`'s `user.e2b.*` attributes with `entries`.
fn set_metadata(path: &Path, entries: &[(String, String)]) -> Result<(), FsFailure> {
    let fail = |e: rustix::io::Errno| {
        failure(
            FsErrorKind::Other,
            format!("{}: extended attributes: {e}", path.display()),
        )
    };
    let mut names = vec![0u8; 64 * 1024];
    let n = match rustix::fs::llistxattr(path, &mut names) {
        Ok(n) => n,
        // No extended attributes here: nothing to keep or replace.
        Err(rustix::io::Errno::OPNOTSUPP) => return Ok(()),
        Err(rustix::io::Errno::NOENT) => {
            return Err(failure(
                FsErrorKind::NotFound,
                format!("{}: no such file", path.display()),
            ));
        }
        Err(e) => return Err(fail(e)),
    };
    for name in names[..n].split(|&b| b == 0) {
        if name.starts_with(METADATA_PREFIX.as_bytes()) {
            rustix::fs::lremovexattr(path, name).map_err(fail)?;
        }
    }
    for (key, value) in entries {
        let name = format!("{METADATA_PREFIX}{key}");
        match rustix::fs::lsetxattr(
            path,
            &name,
            value.as_bytes(),
            rustix::fs::XattrFlags::empty(),
        ) {
            Ok(()) | Err(rustix::io::Errno::OPNOTSUPP) => {}
            Err(e) => return Err(fail(e)),
        }
    }
    Ok(())
}

/// The entries below directory `path`, `depth` levels down.
fn list(path: &Path, depth: u32) -> Result<Vec<FsEntry>, FsFailure> {
    let root = std::fs::canonicalize(path).map_err(|e| io_failure(path, &e))?;
    refuse_proc(&root)?;
    let md = std::fs::metadata(&root).map_err(|e| io_failure(path, &e))?;
    if !md.is_dir() {
        return Err(failure(
            FsErrorKind::NotADirectory,
            format!("{}: not a directory", path.display()),
        ));
    }
    let mut out = Vec::new();
    walk(&root, "", 1, depth, &mut out)?;
    Ok(out)
}

fn walk(
    dir: &Path,
    prefix: &str,
    level: u32,
    depth: u32,
    out: &mut Vec<FsEntry>,
) -> Result<(), FsFailure> {
    let Ok(read) = std::fs::read_dir(dir) else {
        // A directory below the listed one that this user may not read:
        // listed, not entered.
        return if level == 1 {
            std::fs::read_dir(dir)
                .map(|_| ())
                .map_err(|e| io_failure(dir, &e))
        } else {
            Ok(())
        };
    };
    let mut names: Vec<std::ffi::OsString> =
        read.filter_map(|e| Some(e.ok()?.file_name())).collect();
    names.sort();
    for name in names {
        let at = dir.join(&name);
        let Ok(md) = std::fs::symlink_metadata(&at) else {
            continue;
        };
        let rel = format!("{prefix}{}", name.to_string_lossy());
        if out.len() >= FS_LIST_MAX {
            return Err(failure(
                FsErrorKind::Refused,
                format!(
                    "{}: more than {FS_LIST_MAX} entries; list less deep",
                    dir.display()
                ),
            ));
        }
        out.push(entry(&at, rel.clone(), &md));
        if md.is_dir() && level < depth {
            walk(&at, &format!("{rel}/"), level + 1, depth, out)?;
        }
    }
    Ok(())
}
