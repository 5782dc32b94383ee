//! Walking a directory of the workspace with the `ignore` crate.
//!
//! The walk starts at `/proc/self/fd/N` of a directory opened beneath the
//! workspace root, so its root cannot be redirected by a symbolic link, and
//! it never follows links below that. `.gitignore` files of the directories
//! between the workspace root and the walk root are added by hand, since
//! the walker cannot see above its `/proc` root (and must not look above
//! the workspace): their rules are matched against the entry's path
//! relative to the directory that holds each file.
//!
//! Only the walk root is pinned by a descriptor; a directory below it that
//! the sandbox swaps for a symbolic link mid-walk could redirect a listing.
//! `search_files` therefore opens every file it reads beneath the
//! workspace root again with `openat2`, so contents never leave it.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Component, Path, PathBuf};

use ignore::gitignore::{Gitignore, GitignoreBuilder};

use ignore::WalkBuilder;

use crate::ToolContext;
use crate::workspace::{Workspace, WsPath};

/// A made-up absolute root for matching paths against `.gitignore` rules
/// of directories above the walk, which are not on the walk's own paths.
const VIRTUAL_ROOT: &str = "/ws";

pub(crate) struct Walk {
    /// Keeps the directory open while the walker uses its `/proc` path.
    _dir: OwnedFd,
    pub root: PathBuf,
    pub builder: WalkBuilder,
    pub workspace: Workspace,
}

pub(crate) fn walker(ctx: &ToolContext, dir: &WsPath) -> Result<Walk, String> {
    let ws = ctx.open_workspace().map_err(|e| e.to_string())?;
    let (fd, root) = ws.open_dir(dir).map_err(|e| e.to_string())?;
    // Rules of the `.gitignore` files above the walk root, each with the
    // walk root's path relative to the directory that holds it.
    let mut above: Vec<(Gitignore, PathBuf)> = Vec::new();
    let mut ancestor = PathBuf::new();
    let comps: Vec<_> = dir
        .rel
        .components()
        .filter(|c| !matches!(c, Component::CurDir))
        .collect();
    for (i, c) in comps.iter().enumerate() {
        let gitignore = WsPath {
            rel: Path::new(".").join(&ancestor).join(".gitignore"),
        };
        if let Ok((mut f, _)) = ws.open_read(&gitignore) {
            let mut text = String::new();
            if f.read_to_string(&mut text).is_ok() {
                let mut gb = GitignoreBuilder::new(VIRTUAL_ROOT);
                for line in text.lines() {
                    let _ = gb.add_line(None, line);
                }
                if let Ok(gi) = gb.build() {
                    let below: PathBuf = comps[i..].iter().collect();
                    above.push((gi, below));
                }
            }
        }
        ancestor.push(c);
    }
    let mut b = WalkBuilder::new(&root);
    let walk_root = root.clone();
    b.hidden(false)
        .parents(false)
        .git_ignore(true)
        .git_exclude(false)
        .git_global(false)
        .ignore(true)
        // A workspace need not be a git repository for .gitignore to count.
        .require_git(false)
        .follow_links(false)
        .sort_by_file_name(|a, b| a.cmp(b))
        .filter_entry(move |e| {
            if e.file_name() == ".git" {
                return false;
            }
            let Ok(rel) = e.path().strip_prefix(&walk_root) else {
                return true;
            };
            let is_dir = e.file_type().is_some_and(|t| t.is_dir());
            !above.iter().any(|(gi, below)| {
                let p = Path::new(VIRTUAL_ROOT).join(below).join(rel);
                gi.matched_path_or_any_parents(&p, is_dir).is_ignore()
            })
        });
    Ok(Walk {
        _dir: fd,
        root,
        builder: b,
        workspace: ws,
    })
}
