//! The workspace's own repository, checked before cordon's git touches it.
//!
//! The sandbox may have written every byte of `.git` (it is read-only in
//! the sandbox, but it came from somewhere: an earlier run without that
//! protection, a repository unpacked from an archive the model fetched).
//! Git takes commands from a repository's configuration under names no
//! override can foresee (`filter.<any>.clean`, `diff.<any>.command`), from
//! files beside it (`info/attributes`, `commondir`, alternates), and from
//! a `.git` that is a file or a link naming a repository elsewhere. So
//! cordon reads `.git` itself, beneath the workspace and never through a
//! link, and refuses a repository that holds any of these, saying which
//! and how to remove it. The settings [`crate::Git`] always passes are the
//! second guard.

use std::ffi::OsStr;
use std::io::Read;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use cordon_tools::walk::open_at;
use rustix::fs::{Mode, OFlags};
use rustix::io::Errno;

use crate::command::{Git, GitError};

/// Largest configuration file read; a real one is a few hundred bytes.
const MAX_CONFIG: u64 = 256 << 10;

/// Files in `.git` that make git read or run what lies elsewhere.
const REFUSED_FILES: &[(&str, &str)] = &[
    (
        "commondir",
        "moves where git reads the configuration and hooks from",
    ),
    (
        "objects/info/alternates",
        "makes git read objects from other directories on the host",
    ),
    (
        "objects/info/http-alternates",
        "makes git read objects from other places",
    ),
    (
        "info/attributes",
        "can name filter and diff drivers for every file",
    ),
    ("config.worktree", "adds configuration git would read"),
    ("info/grafts", "rewrites the history git reads"),
];

/// Why a repository is refused.
#[derive(Debug, thiserror::Error)]
pub enum RepoError {
    #[error("{workspace} holds no git repository (.git)")]
    NoRepository { workspace: PathBuf },
    #[error(
        "{workspace}/.git is {what}, which cordon's git on the host does not follow: a sandbox could point it at any repository on the host; make .git a plain directory"
    )]
    NotADirectory {
        workspace: PathBuf,
        what: &'static str,
    },
    #[error(
        "{workspace}/.git/{file} exists: it {why}, and cordon's git on the host does not take that from a workspace the sandbox could write; remove it and try again"
    )]
    RefusedFile {
        workspace: PathBuf,
        file: &'static str,
        why: &'static str,
    },
    #[error(
        "{workspace}/.git/config sets {key}, which cordon's git on the host does not take from a workspace the sandbox could write (it can name a program to run, a place to read, or where a push goes); remove it (git config --unset-all {key}) and try again"
    )]
    RefusedSetting { workspace: PathBuf, key: String },
    #[error("{workspace}/.git: {source}")]
    Io {
        workspace: PathBuf,
        source: std::io::Error,
    },
    #[error("{workspace}/.git/config: git cannot read it: {source}")]
    Config {
        workspace: PathBuf,
        source: GitError,
    },
}

/// The repository at `workspace/.git`, checked, with git set to work on
/// it (and on `workspace` as its work tree).
pub fn checked_repository(workspace: &Path) -> Result<Git, RepoError> {
    let ws = workspace.to_path_buf();
    let io = |e: Errno| RepoError::Io {
        workspace: ws.clone(),
        source: e.into(),
    };
    let root = rustix::fs::open(
        workspace,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(io)?;
    let git_dir = match open(root.as_fd(), ".git", OFlags::DIRECTORY) {
        Ok(fd) => fd,
        Err(Errno::NOENT) => return Err(RepoError::NoRepository { workspace: ws }),
        Err(Errno::NOTDIR | Errno::LOOP | Errno::XDEV) => {
            let link = rustix::fs::statat(&root, ".git", rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                .map(|st| rustix::fs::FileType::from_raw_mode(st.st_mode))
                .map_or(true, |t| t == rustix::fs::FileType::Symlink);
            return Err(RepoError::NotADirectory {
                workspace: ws,
                what: if link {
                    "a symbolic link"
                } else {
                    "a file (one that names a repository elsewhere)"
                },
            });
        }
        Err(e) => return Err(io(e)),
    };
    for (file, why) in REFUSED_FILES {
        match open(git_dir.as_fd(), file, OFlags::empty()) {
            Err(Errno::NOENT) => {}
            // Present, as anything: a file, a link, a directory, a
            // component on the way that is a link.
            _ => {
                return Err(RepoError::RefusedFile {
                    workspace: ws,
                    file,
                    why,
                });
            }
        }
    }
    for dir in REMOTE_DIRS {
        let holds_any = match open(git_dir.as_fd(), dir, OFlags::DIRECTORY) {
            Ok(fd) => rustix::fs::Dir::read_from(&fd)
                .map_err(io)?
                .filter_map(Result::ok)
                .any(|e| !matches!(e.file_name().to_bytes(), b"." | b"..")),
            Err(Errno::NOENT) => false,
            // A file or a link where the directory would be.
            Err(_) => true,
        };
        if holds_any {
            return Err(RepoError::RefusedFile {
                workspace: ws,
                file: dir,
                why: "names remotes by file, which git takes for the URL cordon pushes to",
            });
        }
    }
    let config = match open(git_dir.as_fd(), "config", OFlags::empty()) {
        Ok(fd) => {
            let mut buf = Vec::new();
            std::fs::File::from(fd)
                .take(MAX_CONFIG)
                .read_to_end(&mut buf)
                .map_err(|source| RepoError::Io {
                    workspace: ws.clone(),
                    source,
                })?;
            buf
        }
        Err(Errno::NOENT) => Vec::new(),
        Err(Errno::LOOP | Errno::XDEV) => {
            return Err(RepoError::RefusedFile {
                workspace: ws,
                file: "config",
                why: "is a symbolic link, which could name any file on the host,",
            });
        }
        Err(e) => return Err(io(e)),
    };
    let settings = parse_config(&config).map_err(|source| RepoError::Config {
        workspace: ws.clone(),
        source,
    })?;
    if let Some((key, _)) = settings.iter().find(|(k, v)| !allowed(k, v)) {
        return Err(RepoError::RefusedSetting {
            workspace: ws,
            key: cordon_tools::printable(key),
        });
    }
    Ok(Git::new(workspace.join(".git")).work_tree(workspace))
}

fn open(dir: BorrowedFd<'_>, name: &str, flags: OFlags) -> Result<OwnedFd, Errno> {
    open_at(
        dir,
        OsStr::new(name),
        flags | OFlags::RDONLY | OFlags::NONBLOCK,
    )
}

/// A configuration file's settings, as git reads them (`include.path`
/// not followed: it is refused like any other key outside the list).
fn parse_config(text: &[u8]) -> Result<Vec<(String, String)>, GitError> {
    let out = Git::new("/").run_with(["config", "--file", "-", "--null", "--list"], Some(text))?;
    Ok(out
        .split(|b| *b == 0)
        .filter(|r| !r.is_empty())
        .map(|r| {
            let r = String::from_utf8_lossy(r);
            match r.split_once('\n') {
                Some((k, v)) => (k.to_string(), v.to_string()),
                None => (r.to_string(), String::new()),
            }
        })
        .collect())
}

/// Settings a clone or `git init` writes, and ones a person sets that run
/// nothing and read nothing elsewhere.
fn allowed(key: &str, value: &str) -> bool {
    let key = key.to_ascii_lowercase();
    let (section, rest) = key.split_once('.').unwrap_or((&key, ""));
    // Keys with a subsection: `remote.<name>.url`; the name is free.
    let last = rest.rsplit('.').next().unwrap_or("");
    match section {
        "core" => match rest {
            "repositoryformatversion" => matches!(value, "0" | "1"),
            "bare" => value == "false",
            "filemode" | "logallrefupdates" | "ignorecase" | "precomposeunicode" | "symlinks" => {
                true
            }
            _ => false,
        },
        "extensions" => rest == "objectformat" && matches!(value, "sha1" | "sha256"),
        "remote" => {
            matches!(last, "url" | "fetch" | "tagopt")
                && rest
                    .rsplit_once('.')
                    .is_some_and(|(name, _)| plain_remote_name(name))
        }
        "branch" => rest.contains('.') && matches!(last, "remote" | "merge" | "rebase"),
        "user" => matches!(rest, "name" | "email"),
        "init" => rest == "defaultbranch",
        "pull" => matches!(rest, "rebase" | "ff"),
        _ => false,
    }
}

/// A remote's name that git can never take for a URL or a path. git
/// resolves `git push <url>` to the remote *named* `<url>` when there is
/// one, so a configuration with `[remote "https://the.clone/url"]` sends
/// cordon's push wherever its `url` says: a name must be a plain word.
fn plain_remote_name(name: &str) -> bool {
    !name.is_empty()
        && !name.starts_with(['.', '-'])
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
}

/// Legacy places git reads a remote from by its name (for a name without
/// a slash, which an scp-like `host:path` URL is).
const REMOTE_DIRS: &[&str] = &["remotes", "branches"];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn what_a_clone_writes_is_allowed() {
        for (k, v) in [
            ("core.repositoryformatversion", "0"),
            ("core.filemode", "true"),
            ("core.bare", "false"),
            ("core.logallrefupdates", "true"),
            ("remote.origin.url", "https://example.com/x.git"),
            ("remote.origin.fetch", "+refs/heads/*:refs/remotes/origin/*"),
            ("branch.main.remote", "origin"),
            ("branch.main.merge", "refs/heads/main"),
            ("remote.upstream-2.url", "https://example.com/y.git"),
            ("branch.feature/x.remote", "upstream-2"),
        ] {
            assert!(allowed(k, v), "{k}");
        }
    }

    #[test]
    fn settings_that_run_or_read_elsewhere_are_refused() {
        for (k, v) in [
            ("core.fsmonitor", "x"),
            ("core.hooksPath", "x"),
            ("core.sshCommand", "x"),
            ("core.bare", "true"),
            ("core.worktree", "/"),
            ("filter.lfs.clean", "x"),
            ("diff.x.textconv", "x"),
            ("merge.x.driver", "x"),
            ("include.path", "/etc/x"),
            ("includeIf.gitdir:/.path", "x"),
            ("url.https://evil/.insteadOf", "https://example.com/"),
            ("remote.origin.pushurl", "x"),
            ("remote.origin.uploadpack", "x"),
            ("remote.origin.receivepack", "x"),
            ("remote.origin.proxy", "x"),
            ("remote.origin.promisor", "true"),
            ("credential.helper", "x"),
            ("http.proxy", "x"),
            ("extensions.worktreeconfig", "true"),
            ("gpg.program", "x"),
            ("remote.url", "x"),
            ("remote.https://forge.example/team/proj.git.url", "x"),
            ("remote.git@forge.example:team/proj.git.url", "x"),
            ("remote./srv/proj.git.url", "x"),
            ("remote...url", "x"),
            ("remote.-x.url", "x"),
        ] {
            assert!(!allowed(k, v), "{k}");
        }
    }
}
