//! Walking a directory of the workspace, one descriptor at a time.
//!
//! The sandbox can rename anything in the workspace while the host walks
//! it: a directory read a moment ago may be a symbolic link to `/` by the
//! time the walk descends into it. So nothing here is opened by a path
//! name longer than one component: the walk root is opened beneath the
//! workspace root with `openat2(RESOLVE_BENEATH)`, and every directory
//! below it, every ignore file and every file searched is opened relative
//! to its parent's descriptor with `O_NOFOLLOW` and
//! `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`. A
//! directory that has become a link (or vanished) between reading its
//! parent and opening it is skipped and counted, so callers can say the
//! listing is incomplete and worth repeating.
//!
//! `.gitignore` and `.ignore` rules come from the `ignore` crate's
//! matchers, fed with files read through those same opens. Rules are
//! matched against made-up absolute paths (`/ws/<path in the workspace>`)
//! so that no host path is ever involved. Files above the walk root (up to
//! the workspace root) count too, as `git` would count them.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Read;
use std::ops::ControlFlow;
use std::os::fd::{BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Component, Path, PathBuf};

use ignore::Match;
use ignore::gitignore::{Gitignore, GitignoreBuilder};
use ignore::overrides::{Override, OverrideBuilder};
use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags};
use rustix::io::Errno;

use crate::ToolContext;
use crate::workspace::{Workspace, WorkspaceError, WsPath};

/// A made-up absolute root under which paths are matched against rules.
const VIRTUAL_ROOT: &str = "/ws";
/// Deepest a walk goes: each level holds a descriptor open, and a sandbox
/// can nest directories far deeper than any real project.
pub const MAX_WALK_DEPTH: usize = 64;
/// Largest ignore file read; the rest of a bigger one is not used.
const MAX_IGNORE_FILE: u64 = 1 << 20;
/// How often an open is retried when the kernel reports a racing rename.
const RETRIES: usize = 64;

/// Beneath the directory, through no link at all.
pub const STRICT: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);

/// Opens `name` in `dir`, beneath it and never through a link, retrying
/// when the kernel reports a racing rename.
pub fn open_at(dir: BorrowedFd<'_>, name: &OsStr, flags: OFlags) -> Result<OwnedFd, Errno> {
    let flags = flags | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    for _ in 0..RETRIES {
        match rustix::fs::openat2(dir, name, flags, Mode::empty(), STRICT) {
            Err(Errno::AGAIN) | Err(Errno::INTR) => continue,
            r => return r,
        }
    }
    Err(Errno::AGAIN)
}

/// Opens the regular file `name` in `dir` for reading: not a link, not a
/// FIFO that would block, not a device.
pub fn open_file_at(dir: BorrowedFd<'_>, name: &OsStr) -> Result<(File, u64), Errno> {
    let fd = open_at(
        dir,
        name,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
    )?;
    let st = rustix::fs::fstat(&fd)?;
    if FileType::from_raw_mode(st.st_mode) != FileType::RegularFile {
        return Err(Errno::INVAL);
    }
    Ok((File::from(fd), st.st_size as u64))
}

/// The target of the link `name` in `dir`, as text for the model.
pub fn read_link_at(dir: BorrowedFd<'_>, name: &OsStr) -> Option<String> {
    let t = rustix::fs::readlinkat(dir, name, Vec::new()).ok()?;
    Some(String::from_utf8_lossy(t.as_bytes()).into_owned())
}

/// What an entry is, as the walk saw it (never through a link).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Dir,
    File,
    Symlink,
    Other,
}

/// One entry met by the walk.
pub struct Entry<'a> {
    /// 1 for the walk root's own entries.
    pub depth: usize,
    /// Relative to the walk root.
    pub rel: &'a Path,
    pub name: &'a OsStr,
    pub kind: Kind,
    /// The directory holding it, to open it relative to.
    pub dir: BorrowedFd<'a>,
}

/// The ignore rules of one directory on the way down.
struct Level {
    ignore: Option<Gitignore>,
    gitignore: Option<Gitignore>,
    /// Holds `.git`: `.gitignore` files above it do not apply below it.
    has_git: bool,
}

pub struct Walk {
    root: OwnedFd,
    /// The walk root relative to the workspace root (`.` for the root).
    root_rel: PathBuf,
    /// `.gitignore` rules of directories above the walk root.
    above: Vec<Gitignore>,
    overrides: Option<Override>,
    max_depth: usize,
    /// Whether `.ignore` files count besides `.gitignore` (ripgrep's
    /// rules; git reads only the latter).
    dot_ignore: bool,
    /// Names at the walk root neither reported nor descended into.
    skip_top: &'static [&'static str],
    /// Whether ignore files count at all.
    ignore_rules: bool,
    /// Directories that changed under the walk (became a link, a file, or
    /// vanished) and were not descended into.
    pub changed: usize,
    /// Directories deeper than [`MAX_WALK_DEPTH`], not descended into.
    pub too_deep: usize,
}

/// Where rules see `rel` (relative to the workspace root).
fn virtual_path(rel: &Path) -> PathBuf {
    let mut p = PathBuf::from(VIRTUAL_ROOT);
    p.extend(
        rel.components()
            .filter(|c| matches!(c, Component::Normal(_))),
    );
    p
}

/// Rules of an ignore file of the directory `rel`, if there is a usable one.
fn rules(text: &[u8], rel: &Path) -> Option<Gitignore> {
    let mut gb = GitignoreBuilder::new(virtual_path(rel));
    for line in String::from_utf8_lossy(text).lines() {
        let _ = gb.add_line(None, line);
    }
    gb.build().ok().filter(|g| !g.is_empty())
}

fn read_capped(mut f: File) -> Vec<u8> {
    let mut buf = Vec::new();
    let _ = f.by_ref().take(MAX_IGNORE_FILE).read_to_end(&mut buf);
    buf
}

fn ignore_file_at(dir: BorrowedFd<'_>, name: &str, rel: &Path) -> Option<Gitignore> {
    let (f, _) = open_file_at(dir, OsStr::new(name)).ok()?;
    rules(&read_capped(f), rel)
}

impl Walk {
    pub(crate) fn new(ctx: &ToolContext, dir: &WsPath) -> Result<Walk, String> {
        let ws = ctx.open_workspace().map_err(|e| e.to_string())?;
        Walk::beneath(&ws, dir).map_err(|e| e.to_string())
    }

    /// A walk of `dir` in `ws`, with ripgrep's ignore rules.
    pub fn beneath(ws: &Workspace, dir: &WsPath) -> Result<Walk, WorkspaceError> {
        let (root, _) = ws.open_dir(dir)?;
        // The `.gitignore` files of the directories above, each read beneath
        // the workspace root.
        let mut above = Vec::new();
        let mut ancestor = PathBuf::from(".");
        for c in dir
            .rel
            .components()
            .filter(|c| !matches!(c, Component::CurDir))
        {
            let gitignore = WsPath {
                rel: ancestor.join(".gitignore"),
            };
            if let Ok((f, _)) = ws.open_read(&gitignore)
                && let Some(gi) = rules(&read_capped(f), &ancestor)
            {
                above.push(gi);
            }
            ancestor.push(c);
        }
        Ok(Walk {
            root,
            root_rel: dir.rel.clone(),
            above,
            overrides: None,
            max_depth: MAX_WALK_DEPTH,
            dot_ignore: true,
            skip_top: &[],
            ignore_rules: true,
            changed: 0,
            too_deep: 0,
        })
    }

    /// Only `.gitignore` files leave entries out, as git has it.
    pub fn gitignore_only(&mut self) {
        self.dot_ignore = false;
    }

    /// Every entry, ignore files or not (`.git` is still left out).
    pub fn every_entry(&mut self) {
        self.ignore_rules = false;
        self.above.clear();
    }

    /// Leaves out `names` at the walk root, and all they hold.
    pub fn skip_top_level(&mut self, names: &'static [&'static str]) {
        self.skip_top = names;
    }

    pub fn max_depth(&mut self, depth: usize) {
        self.max_depth = depth.min(MAX_WALK_DEPTH);
    }

    /// Only files matching `glob` (relative to the walk root; `!` to
    /// exclude), as ripgrep's `--glob`.
    pub fn glob(&mut self, glob: &str) -> Result<(), ignore::Error> {
        let mut ob = OverrideBuilder::new(virtual_path(&self.root_rel));
        ob.add(glob)?;
        self.overrides = Some(ob.build()?);
        Ok(())
    }

    /// Calls `f` for every entry not ignored, depth first, each directory's
    /// entries sorted by name, a directory before what it holds.
    pub fn run(&mut self, mut f: impl FnMut(&Entry<'_>) -> ControlFlow<()>) {
        // A descriptor of its own, so that reading it starts at the top
        // whatever reads of the root came before.
        let Ok(root) = rustix::fs::openat(
            &self.root,
            ".",
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        ) else {
            return;
        };
        let mut levels = Vec::new();
        let mut counts = (0, 0);
        let _ = self.visit(root, Path::new(""), 1, &mut levels, &mut f, &mut counts);
        self.changed += counts.0;
        self.too_deep += counts.1;
    }

    fn visit(
        &self,
        fd: OwnedFd,
        rel: &Path,
        depth: usize,
        levels: &mut Vec<Level>,
        f: &mut impl FnMut(&Entry<'_>) -> ControlFlow<()>,
        counts: &mut (usize, usize),
    ) -> ControlFlow<()> {
        let Ok(mut dir) = rustix::fs::Dir::new(fd) else {
            return ControlFlow::Continue(());
        };
        let mut names: Vec<(OsString, FileType)> = Vec::new();
        for e in dir.by_ref() {
            let Ok(e) = e else { break };
            let name = OsStr::from_bytes(e.file_name().to_bytes());
            if name == "." || name == ".." {
                continue;
            }
            names.push((name.to_os_string(), e.file_type()));
        }
        names.sort_by(|a, b| a.0.cmp(&b.0));
        let Ok(dfd) = dir.fd() else {
            return ControlFlow::Continue(());
        };
        let ws_rel = self.root_rel.join(rel);
        levels.push(Level {
            ignore: if self.dot_ignore && self.ignore_rules {
                ignore_file_at(dfd, ".ignore", &ws_rel)
            } else {
                None
            },
            gitignore: if self.ignore_rules {
                ignore_file_at(dfd, ".gitignore", &ws_rel)
            } else {
                None
            },
            has_git: names.iter().any(|(n, _)| n == ".git"),
        });
        let flow = self.entries(dfd, rel, depth, &names, levels, f, counts);
        levels.pop();
        flow
    }

    #[allow(clippy::too_many_arguments)]
    fn entries(
        &self,
        dfd: BorrowedFd<'_>,
        rel: &Path,
        depth: usize,
        names: &[(OsString, FileType)],
        levels: &mut Vec<Level>,
        f: &mut impl FnMut(&Entry<'_>) -> ControlFlow<()>,
        counts: &mut (usize, usize),
    ) -> ControlFlow<()> {
        for (name, ft) in names {
            if name == ".git" || (depth == 1 && self.skip_top.iter().any(|n| name == *n)) {
                continue;
            }
            let ft = match ft {
                FileType::Unknown => rustix::fs::statat(dfd, name, AtFlags::SYMLINK_NOFOLLOW)
                    .map(|st| FileType::from_raw_mode(st.st_mode))
                    .unwrap_or(FileType::Unknown),
                t => *t,
            };
            let kind = match ft {
                FileType::Directory => Kind::Dir,
                FileType::RegularFile => Kind::File,
                FileType::Symlink => Kind::Symlink,
                _ => Kind::Other,
            };
            let child = rel.join(name);
            if self.ignored(&child, kind == Kind::Dir, levels) {
                continue;
            }
            f(&Entry {
                depth,
                rel: &child,
                name,
                kind,
                dir: dfd,
            })?;
            if kind != Kind::Dir || depth >= self.max_depth {
                if kind == Kind::Dir && depth >= MAX_WALK_DEPTH {
                    counts.1 += 1;
                }
                continue;
            }
            match open_at(dfd, name, OFlags::RDONLY | OFlags::DIRECTORY) {
                Ok(sub) => self.visit(sub, &child, depth + 1, levels, f, counts)?,
                // Replaced by a link or a file, or gone, since it was read.
                Err(Errno::LOOP | Errno::NOTDIR | Errno::NOENT | Errno::XDEV | Errno::AGAIN) => {
                    counts.0 += 1
                }
                // Unreadable (permissions, descriptors): left out, as ripgrep does.
                Err(e) => tracing::debug!(path = %child.display(), error = %e, "walk skipped"),
            }
        }
        ControlFlow::Continue(())
    }

    /// Whether `rel` (relative to the walk root) is left out by the glob or
    /// by ignore rules, with the `ignore` crate's precedence: the glob
    /// first, then `.ignore` files (deepest first), then `.gitignore` files
    /// up to the nearest repository root, then those above the walk.
    fn ignored(&self, rel: &Path, is_dir: bool, levels: &[Level]) -> bool {
        let path = virtual_path(&self.root_rel.join(rel));
        if let Some(o) = &self.overrides {
            match o.matched(&path, is_dir) {
                Match::Ignore(_) => return true,
                Match::Whitelist(_) => return false,
                Match::None => {}
            }
        }
        for level in levels.iter().rev() {
            if let Some(gi) = &level.ignore {
                match gi.matched(&path, is_dir) {
                    Match::None => {}
                    m => return m.is_ignore(),
                }
            }
        }
        for level in levels.iter().rev() {
            if let Some(gi) = &level.gitignore {
                match gi.matched(&path, is_dir) {
                    Match::None => {}
                    m => return m.is_ignore(),
                }
            }
            if level.has_git {
                return false;
            }
        }
        self.above
            .iter()
            .any(|gi| gi.matched_path_or_any_parents(&path, is_dir).is_ignore())
    }
}
