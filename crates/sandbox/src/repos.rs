//! Git repositories below the workspace's top level: a clone inside the
//! project, a submodule's `.git` file, every repository of a workspace
//! that is a directory of projects. Git on the host reads each one's
//! configuration and hooks when the user runs it there (and `git status`
//! at the top reads each submodule's), so `control_files`
//! protects them like the top-level `.git`.
//!
//! The walk runs on the host before the sandbox starts, but the workspace
//! may still change under it (another sandbox on the same directory), so
//! it goes one descriptor at a time: every directory is opened relative to
//! its parent, beneath it and never through a link. It is bounded in
//! entries, depth and repositories found; what it leaves unvisited is
//! said in the log, not guessed at.

use std::ffi::OsStr;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use rustix::fs::{Dir, FileType, Mode, OFlags, ResolveFlags};

/// Entries read before the walk gives up: about a quarter of a second on
/// a warm cache, paid at every start.
const MAX_ENTRIES: usize = 100_000;
/// Deepest directory looked into.
const MAX_DEPTH: usize = 24;
/// Repositories protected at most: each is a mount (and its directories
/// pinned), set up at every start.
const MAX_REPOS: usize = 256;

/// What the walk found, and whether it saw everything.
#[derive(Debug, Default)]
pub(crate) struct Nested {
    /// Host paths of `.git` directories and files below the top level.
    pub git: Vec<PathBuf>,
    /// The walk stopped at one of its bounds.
    pub incomplete: bool,
}

/// Every `.git` below `workspace`'s top level, not descending into them.
pub(crate) fn nested_git(workspace: &Path) -> Nested {
    find_git(workspace, false)
}

/// Every `.git` in `workspace`, the top level's too when `top`.
pub(crate) fn find_git(workspace: &Path, top: bool) -> Nested {
    let mut found = Nested::default();
    let Ok(root) = rustix::fs::open(
        workspace,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return found;
    };
    let mut walk = Walk {
        entries: 0,
        stopped: false,
        top,
        found: &mut found,
    };
    walk.dir(&root, workspace, 0);
    found
}

struct Walk<'a> {
    entries: usize,
    /// A bound on entries or repositories was reached: nothing more is read.
    stopped: bool,
    /// The top level's `.git` counts too.
    top: bool,
    found: &'a mut Nested,
}

impl Walk<'_> {
    fn stop(&mut self) {
        self.stopped = true;
        self.found.incomplete = true;
    }

    fn dir(&mut self, fd: &OwnedFd, at: &Path, depth: usize) {
        let Ok(mut dir) = Dir::read_from(fd) else {
            return;
        };
        let mut subdirs = Vec::new();
        while let Some(Ok(entry)) = dir.read() {
            let name = OsStr::from_bytes(entry.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            self.entries += 1;
            if self.entries > MAX_ENTRIES {
                self.stop();
                return;
            }
            let kind = match entry.file_type() {
                FileType::Unknown => {
                    rustix::fs::statat(fd, name, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                        .map(|st| FileType::from_raw_mode(st.st_mode))
                        .unwrap_or(FileType::Unknown)
                }
                k => k,
            };
            if name == ".git" {
                // The top level's own is protected by name already.
                if (depth > 0 || self.top)
                    && matches!(kind, FileType::Directory | FileType::RegularFile)
                {
                    if self.found.git.len() == MAX_REPOS {
                        self.stop();
                        return;
                    }
                    self.found.git.push(at.join(name));
                }
                continue;
            }
            if kind == FileType::Directory {
                subdirs.push(name.to_os_string());
            }
        }
        if depth + 1 >= MAX_DEPTH {
            self.found.incomplete |= !subdirs.is_empty();
            return;
        }
        for name in subdirs {
            let Ok(child) = rustix::fs::openat2(
                fd.as_fd(),
                &name,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
                ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
            ) else {
                // Gone, replaced by a link, or unreadable: not a repository
                // git would find through this path either.
                continue;
            };
            self.dir(&child, &at.join(&name), depth + 1);
            if self.stopped {
                return;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_nested_repositories_and_submodule_files_not_through_links() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path().join("ws");
        let outside = t.path().join("outside");
        for d in [
            "ws/.git/modules/sub",
            "ws/a/b/clone/.git/hooks",
            "ws/vendor/sub",
            "outside/repo/.git",
        ] {
            std::fs::create_dir_all(t.path().join(d)).unwrap();
        }
        std::fs::write(
            ws.join("vendor/sub/.git"),
            "gitdir: ../../.git/modules/sub\n",
        )
        .unwrap();
        std::os::unix::fs::symlink(&outside, ws.join("link")).unwrap();
        let found = nested_git(&ws);
        let mut got: Vec<_> = found
            .git
            .iter()
            .map(|p| p.strip_prefix(&ws).unwrap().to_path_buf())
            .collect();
        got.sort();
        assert_eq!(
            got,
            [
                PathBuf::from("a/b/clone/.git"),
                PathBuf::from("vendor/sub/.git")
            ]
        );
        assert!(!found.incomplete);
    }

    #[test]
    fn stops_at_its_depth_and_says_so() {
        let t = tempfile::tempdir().unwrap();
        let mut deep = t.path().to_path_buf();
        for _ in 0..MAX_DEPTH + 2 {
            deep.push("d");
        }
        std::fs::create_dir_all(deep.join(".git")).unwrap();
        let found = nested_git(t.path());
        assert!(found.git.is_empty());
        assert!(found.incomplete);
    }
}
