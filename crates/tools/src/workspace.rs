//! Host-side file access strictly beneath the workspace root.
//!
//! The model names files as it sees them inside the sandbox: relative to
//! `/workspace` or as absolute `/workspace/...` paths. Every open goes
//! through `openat2(RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS)` relative to a
//! descriptor of the workspace root, so the kernel itself refuses `..` and
//! symbolic links (absolute or relative) that would resolve outside, even
//! when the sandbox changes the tree between our checks. Parent directories
//! are created one component at a time relative to an already-checked
//! directory descriptor for the same reason.

use std::fs::File;
use std::io::Write;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Component, Path, PathBuf};

use rustix::fs::{FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

/// The sandbox's name for the workspace root.
pub const SANDBOX_ROOT: &str = "/workspace";

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error(
        "{path}: only files inside the workspace can be used; give a path relative to /workspace or one starting with /workspace/"
    )]
    Outside { path: String },
    #[error("{path}: `..` here would leave the workspace; use a path inside /workspace")]
    DotDot { path: String },
    #[error(
        "{path}: resolves outside the workspace (through a symbolic link that points out of it); only files beneath /workspace can be used"
    )]
    Escapes { path: String },
    #[error("{path}: no such file or directory")]
    NotFound { path: String },
    #[error("{path}: {why}; give a shorter or plain name")]
    BadName { path: String, why: &'static str },
    #[error("{path}: a loop of symbolic links, or a link that cannot be followed safely")]
    Loop { path: String },
    #[error("{path}: is a directory; use list_dir to see what it holds")]
    IsDirectory { path: String },
    #[error("{path}: not a directory")]
    NotDirectory { path: String },
    #[error("{path}: not a regular file (a device, pipe or socket), which file tools do not touch")]
    NotRegular { path: String },
    #[error("{path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "{path}: read-only: {why}, so cordon keeps it out of the sandbox's reach (the user can lift this with the setting sandbox.protect_control_files = false); work in the rest of the workspace, and leave this configuration to the user"
    )]
    ReadOnly { path: String, why: &'static str },
    #[error(
        "{path}: changed while being opened (something in the sandbox keeps renaming it); try again once it is left alone"
    )]
    Raced { path: String },
    #[error("cannot open the workspace directory {}: {source}", root.display())]
    Root {
        root: PathBuf,
        source: std::io::Error,
    },
}

/// A path the model gave, checked to stay inside the workspace and made
/// relative to its root.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WsPath {
    /// Relative to the root; `.` for the root itself.
    pub rel: PathBuf,
}

impl WsPath {
    /// Parses a model-supplied path. Lexical checks only: absolute paths
    /// elsewhere and `..` above the root are refused here with a clear
    /// message; symbolic links are left to `openat2`.
    pub fn parse(path: &str) -> Result<WsPath, WorkspaceError> {
        let given = path.trim();
        let rest = if let Some(abs) = given.strip_prefix('/') {
            match abs.strip_prefix(&SANDBOX_ROOT[1..]) {
                Some(r) if r.is_empty() || r.starts_with('/') => r.trim_start_matches('/'),
                _ => {
                    return Err(WorkspaceError::Outside {
                        path: given.to_string(),
                    });
                }
            }
        } else {
            given
        };
        let mut rel = PathBuf::new();
        for c in Path::new(rest).components() {
            match c {
                Component::Normal(n) => rel.push(n),
                Component::CurDir => {}
                Component::ParentDir => {
                    if !rel.pop() {
                        return Err(WorkspaceError::DotDot {
                            path: given.to_string(),
                        });
                    }
                }
                Component::RootDir | Component::Prefix(_) => {
                    return Err(WorkspaceError::Outside {
                        path: given.to_string(),
                    });
                }
            }
        }
        if rel.as_os_str().is_empty() {
            rel.push(".");
        }
        Ok(WsPath { rel })
    }

    /// How the sandbox names it, for messages.
    pub fn display(&self) -> String {
        if self.rel == Path::new(".") {
            SANDBOX_ROOT.to_string()
        } else {
            format!("{SANDBOX_ROOT}/{}", self.rel.display())
        }
    }
}

/// An open workspace root.
pub struct Workspace {
    root: OwnedFd,
    /// Host paths (resolved) a write must not reach: the sandbox's
    /// read-only paths, which host-side writers honour too.
    read_only: Vec<PathBuf>,
    /// Refuse every write into a `.git` and into the top-level control
    /// files, whether they exist yet or not (see
    /// [`Workspace::protecting_control_files`]).
    control_files: bool,
}

const RESOLVE: ResolveFlags = ResolveFlags::BENEATH.union(ResolveFlags::NO_MAGICLINKS);
/// How often an open is retried when the kernel reports a racing rename.
const RETRIES: usize = 64;

/// Where a host `path` (absolute) lies beneath the host directory
/// `root`, judged by name: `.` and `..` resolved lexically and no link
/// followed, so that a link the sandbox planted cannot take the path out of
/// the workspace before it is checked. `None`: the path is elsewhere, the
/// user's own. For host code that opens a path the user named (`exec -o`,
/// `--attach`): one beneath the workspace must then be opened through
/// [`Workspace`].
pub fn beneath(root: &Path, path: &Path) -> Option<PathBuf> {
    let path = lexical(path);
    [
        std::path::absolute(root).ok().map(|r| lexical(&r)),
        root.canonicalize().ok(),
    ]
    .into_iter()
    .flatten()
    .find_map(|r| path.strip_prefix(&r).ok().map(Path::to_path_buf))
}

/// `p` with `.` and `..` resolved by name.
fn lexical(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            c => out.push(c),
        }
    }
    out
}

impl Workspace {
    pub fn open(host_root: &Path) -> Result<Workspace, WorkspaceError> {
        let root = rustix::fs::open(
            host_root,
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| WorkspaceError::Root {
            root: host_root.to_path_buf(),
            source: e.into(),
        })?;
        Ok(Workspace {
            root,
            read_only: Vec::new(),
            control_files: false,
        })
    }

    /// Refuses writes into any repository's `.git` (at any depth) and into
    /// the editors' and agents' settings at the top
    /// ([`cordon_sandbox::CONTROL_FILES`]), existing or not, however they
    /// are reached: the resolved directory is checked, so a link named
    /// `notes` that points at `.git` is no way in. For writers that act on
    /// a tenant's or client's behalf (the server's files API, a `steps`
    /// job's `write_file`): git on the host would otherwise take commands
    /// or a push's destination from what they wrote.
    pub fn protecting_control_files(mut self) -> Self {
        self.control_files = true;
        self
    }

    /// Refuses writes that reach any of `paths` (or beneath them), however
    /// they are named: through a link, or a directory link on the way.
    pub fn with_read_only(mut self, paths: &[PathBuf]) -> Self {
        self.read_only = paths.iter().filter_map(|p| p.canonicalize().ok()).collect();
        self
    }

    /// Why the file `name` in the open directory `dir` is read-only, if it
    /// is.
    fn read_only_reason(&self, dir: &OwnedFd, name: &Path) -> Option<&'static str> {
        if self.read_only.is_empty() && !self.control_files {
            return None;
        }
        // Where the kernel says the directory is: no name can hide it.
        let Some(at) = fd_path(dir) else {
            return Some("cordon cannot tell where this directory is");
        };
        let target = at.join(name);
        if self.control_files {
            let Some(rel) = fd_path(&self.root).and_then(|r| target.strip_prefix(r).ok()) else {
                return Some("cordon cannot tell where this directory is");
            };
            if let Some(top) = control_file(rel) {
                return Some(reason(top));
            }
        }
        let ro = self
            .read_only
            .iter()
            .find(|ro| at.starts_with(ro) || target.starts_with(ro))?;
        let top = if ro.components().any(|c| c.as_os_str() == ".git") {
            ".git"
        } else {
            ro.file_name().and_then(|n| n.to_str()).unwrap_or("")
        };
        Some(reason(top))
    }

    fn map(path: &WsPath, e: Errno) -> WorkspaceError {
        let path = path.display();
        match e {
            Errno::XDEV => WorkspaceError::Escapes { path },
            Errno::NOENT => WorkspaceError::NotFound { path },
            Errno::ISDIR => WorkspaceError::IsDirectory { path },
            Errno::NOTDIR => WorkspaceError::NotDirectory { path },
            // A loop, or a magic link (such as /proc/self/root).
            Errno::LOOP => WorkspaceError::Loop { path },
            Errno::NAMETOOLONG => WorkspaceError::BadName {
                path,
                why: "the name or the path is too long",
            },
            // A NUL byte in the path is the only way rustix reaches EINVAL here.
            Errno::INVAL => WorkspaceError::BadName {
                path,
                why: "the path holds a NUL byte",
            },
            e => WorkspaceError::Io {
                path,
                source: e.into(),
            },
        }
    }

    fn openat(
        &self,
        dir: impl AsFd,
        rel: &Path,
        shown: &WsPath,
        flags: OFlags,
        mode: Mode,
    ) -> Result<OwnedFd, WorkspaceError> {
        // openat2 asks callers to retry when a rename raced a `..` in the
        // path; a sandbox renaming in a loop must not keep the host here.
        for _ in 0..RETRIES {
            match rustix::fs::openat2(&dir, rel, flags | OFlags::CLOEXEC, mode, RESOLVE) {
                Err(Errno::AGAIN) | Err(Errno::INTR) => continue,
                r => return r.map_err(|e| Self::map(shown, e)),
            }
        }
        Err(WorkspaceError::Raced {
            path: shown.display(),
        })
    }

    /// Opens a regular file for reading. Non-blocking so that a FIFO
    /// planted in the workspace cannot hang the agent; it is refused.
    pub fn open_read(&self, path: &WsPath) -> Result<(File, u64), WorkspaceError> {
        let fd = self.openat(
            &self.root,
            &path.rel,
            path,
            OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
            Mode::empty(),
        )?;
        let st = rustix::fs::fstat(&fd).map_err(|e| Self::map(path, e))?;
        match FileType::from_raw_mode(st.st_mode) {
            FileType::RegularFile => Ok((File::from(fd), st.st_size as u64)),
            FileType::Directory => Err(WorkspaceError::IsDirectory {
                path: path.display(),
            }),
            _ => Err(WorkspaceError::NotRegular {
                path: path.display(),
            }),
        }
    }

    /// Opens a directory for walking; the returned descriptor must stay
    /// open while its `/proc/self/fd` path is used.
    pub fn open_dir(&self, path: &WsPath) -> Result<(OwnedFd, PathBuf), WorkspaceError> {
        let fd = self.openat(
            &self.root,
            &path.rel,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )?;
        let proc = PathBuf::from(format!("/proc/self/fd/{}", fd.as_raw_fd()));
        Ok((fd, proc))
    }

    /// Opens (creating as needed) each directory of `dir` in turn, each
    /// relative to the one before and each beneath the root.
    fn make_dirs(&self, dir: &Path, shown: &WsPath) -> Result<OwnedFd, WorkspaceError> {
        let mut cur = self.openat(
            &self.root,
            Path::new("."),
            shown,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )?;
        for c in dir.components() {
            let Component::Normal(name) = c else { continue };
            let name = Path::new(name);
            let next = match self.openat(
                &cur,
                name,
                shown,
                OFlags::RDONLY | OFlags::DIRECTORY,
                Mode::empty(),
            ) {
                Err(WorkspaceError::NotFound { .. }) => {
                    // Not even an empty directory inside a control file.
                    if self.control_files
                        && let Some(why) = self.read_only_reason(&cur, name)
                    {
                        return Err(WorkspaceError::ReadOnly {
                            path: shown.display(),
                            why,
                        });
                    }
                    match rustix::fs::mkdirat(&cur, name, Mode::from_raw_mode(0o755)) {
                        Ok(()) | Err(Errno::EXIST) => {}
                        Err(e) => return Err(Self::map(shown, e)),
                    }
                    let fd = self.openat(
                        &cur,
                        name,
                        shown,
                        OFlags::RDONLY | OFlags::DIRECTORY,
                        Mode::empty(),
                    )?;
                    clear_set_id(&fd, shown)?;
                    fd
                }
                r => r?,
            };
            cur = next;
        }
        Ok(cur)
    }

    /// Writes `data` to `path`, creating parent directories. Returns whether
    /// the file was created (rather than overwritten).
    pub fn write(&self, path: &WsPath, data: &[u8]) -> Result<bool, WorkspaceError> {
        // The path as given, before anything is made; then as resolved.
        let (parent, name) = self.changeable(path)?;
        let dir = self.make_dirs(&parent, path)?;
        if let Some(why) = self.read_only_reason(&dir, &name) {
            return Err(WorkspaceError::ReadOnly {
                path: path.display(),
                why,
            });
        }
        let base = OFlags::WRONLY | OFlags::NONBLOCK | OFlags::NOCTTY;
        let (fd, created) = match self.openat(&dir, &name, path, base, Mode::empty()) {
            Ok(fd) => (fd, false),
            Err(WorkspaceError::NotFound { .. }) => (
                self.openat(
                    &dir,
                    &name,
                    path,
                    base | OFlags::CREATE | OFlags::EXCL,
                    Mode::from_raw_mode(0o644),
                )?,
                true,
            ),
            Err(e) => return Err(e),
        };
        let st = rustix::fs::fstat(&fd).map_err(|e| Self::map(path, e))?;
        if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
            return Err(WorkspaceError::NotRegular {
                path: path.display(),
            });
        }
        // Truncate only after checking the type, so a FIFO is never opened
        // for truncation and a directory is reported as such.
        rustix::fs::ftruncate(&fd, 0).map_err(|e| Self::map(path, e))?;
        clear_set_id(&fd, path)?;
        let mut f = File::from(fd);
        f.write_all(data).map_err(|e| WorkspaceError::Io {
            path: path.display(),
            source: e,
        })?;
        Ok(created)
    }
}

impl Workspace {
    /// Removes the file (or link) `path`, beneath the workspace; a
    /// directory is refused.
    pub fn remove_file(&self, path: &WsPath) -> Result<(), WorkspaceError> {
        let (parent, name) = self.changeable(path)?;
        let parent = if parent.as_os_str().is_empty() {
            PathBuf::from(".")
        } else {
            parent
        };
        let dir = self.openat(
            &self.root,
            &parent,
            path,
            OFlags::RDONLY | OFlags::DIRECTORY,
            Mode::empty(),
        )?;
        if let Some(why) = self.read_only_reason(&dir, &name) {
            return Err(WorkspaceError::ReadOnly {
                path: path.display(),
                why,
            });
        }
        match rustix::fs::unlinkat(&dir, &name, rustix::fs::AtFlags::empty()) {
            // unlink(2) says EISDIR on Linux for a directory.
            Err(Errno::ISDIR) | Err(Errno::PERM) if self.is_dir_at(&dir, &name) => {
                Err(WorkspaceError::IsDirectory {
                    path: path.display(),
                })
            }
            r => r.map_err(|e| Self::map(path, e)),
        }
    }

    /// `path`'s parent directory and name, when a file there may be
    /// changed as the path is written (not the root, not in a control
    /// file); where it resolves is checked once it is open.
    fn changeable(&self, path: &WsPath) -> Result<(PathBuf, PathBuf), WorkspaceError> {
        let (parent, name) = match (path.rel.parent(), path.rel.file_name()) {
            (Some(p), Some(n)) => (p.to_path_buf(), PathBuf::from(n)),
            _ => {
                return Err(WorkspaceError::IsDirectory {
                    path: path.display(),
                });
            }
        };
        if self.control_files
            && let Some(top) = control_file(&path.rel)
        {
            return Err(WorkspaceError::ReadOnly {
                path: path.display(),
                why: reason(top),
            });
        }
        Ok((parent, name))
    }

    fn is_dir_at(&self, dir: &OwnedFd, name: &Path) -> bool {
        rustix::fs::statat(dir, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::Directory)
    }
}

/// Where the kernel says an open file or directory is.
fn fd_path(fd: &OwnedFd) -> Option<PathBuf> {
    std::fs::read_link(format!("/proc/self/fd/{}", fd.as_raw_fd())).ok()
}

/// The control file `rel` (relative to the workspace root) lies in, if
/// any: a `.git` at any depth, or one of the top-level settings.
fn control_file(rel: &Path) -> Option<&'static str> {
    let mut parts = rel.components().filter_map(|c| match c {
        Component::Normal(n) => Some(n),
        _ => None,
    });
    let first = parts.next()?;
    if let Some(top) = cordon_sandbox::CONTROL_FILES
        .iter()
        .find(|c| first == std::ffi::OsStr::new(c))
    {
        return Some(top);
    }
    std::iter::once(first)
        .chain(parts)
        .any(|n| n == ".git")
        .then_some(".git")
}

/// Why a control file is out of reach, for the model or the client.
fn reason(top: &str) -> &'static str {
    match top {
        ".git" => {
            "git on the host runs what a repository's configuration and hooks name (core.fsmonitor on the next `git status`, hooks on a commit) and pushes where its remotes say, and a writable .git can point git at planted ones; read history and diffs freely, and leave commits to the user"
        }
        ".vscode" | ".idea" => {
            "editors on the host run the tasks and tools their project settings name (a task run on opening the folder, an interpreter path)"
        }
        ".claude" | ".mcp.json" => {
            "coding agents on the host run the hooks and MCP servers these settings name"
        }
        _ => "programs on the host take commands from it",
    }
}

/// Drops setuid/setgid bits: a file the model writes must never become a
/// way to gain another identity (a setgid parent directory would otherwise
/// hand its bit to new directories).
fn clear_set_id(fd: &OwnedFd, path: &WsPath) -> Result<(), WorkspaceError> {
    let st = rustix::fs::fstat(fd).map_err(|e| Workspace::map(path, e))?;
    let mode = st.st_mode & 0o7777;
    if mode & 0o6000 != 0 {
        rustix::fs::fchmod(fd, Mode::from_raw_mode(mode & !0o6000))
            .map_err(|e| Workspace::map(path, e))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_made_relative_to_the_workspace() {
        assert_eq!(WsPath::parse("a/b").unwrap().rel, Path::new("a/b"));
        assert_eq!(WsPath::parse("/workspace/a").unwrap().rel, Path::new("a"));
        assert_eq!(WsPath::parse("/workspace").unwrap().rel, Path::new("."));
        assert_eq!(WsPath::parse("./a/../b").unwrap().rel, Path::new("b"));
        assert_eq!(WsPath::parse("").unwrap().rel, Path::new("."));
    }

    #[test]
    fn paths_outside_are_refused() {
        assert!(matches!(
            WsPath::parse("/etc/passwd"),
            Err(WorkspaceError::Outside { .. })
        ));
        assert!(matches!(
            WsPath::parse("/workspacex/a"),
            Err(WorkspaceError::Outside { .. })
        ));
        assert!(matches!(
            WsPath::parse("../x"),
            Err(WorkspaceError::DotDot { .. })
        ));
        assert!(matches!(
            WsPath::parse("/workspace/../etc"),
            Err(WorkspaceError::DotDot { .. })
        ));
    }
}
