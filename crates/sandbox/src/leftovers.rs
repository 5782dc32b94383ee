//! What a sandbox may have left for the user's own tools: git repositories
//! and editors' and agents' settings that did not exist when it started,
//! and so could not be made read-only ([`crate::config::control_files`] protects
//! those that did). A sandbox may `git init` and set `core.fsmonitor`, or
//! plant a repository in a subdirectory; nothing stops that without
//! planting mount points in the user's tree, so cordon looks once the
//! sandbox has ended and says what it found.
//!
//! Only what would run something is reported: a repository whose
//! configuration holds anything but a short list of harmless settings, a
//! `commondir` (git reads configuration and hooks from where it points), a
//! hook that is not one of git's samples, or a `.git` file naming a
//! directory elsewhere; and any editor or agent settings that appeared.
//! Everything is read beneath the workspace, one name at a time, never
//! through a link, and bounded; what is reported is printable text.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};

use rustix::fs::{Dir, FileType, Mode, OFlags, ResolveFlags};

use crate::config::CONTROL_FILES;

/// Most bytes of a configuration or `.git` file read.
const MAX_FILE: u64 = 1 << 20;

/// Settings git takes no command from: what `git init`, `git clone` and
/// ordinary work write. `*` is any subsection.
const HARMLESS: &[&str] = &[
    "core.repositoryformatversion",
    "core.filemode",
    "core.bare",
    "core.logallrefupdates",
    "core.ignorecase",
    "core.precomposeunicode",
    "core.symlinks",
    "core.autocrlf",
    "core.eol",
    "remote.*.url",
    "remote.*.fetch",
    "remote.*.pushurl",
    "branch.*.remote",
    "branch.*.merge",
    "branch.*.rebase",
    "user.name",
    "user.email",
    "init.defaultbranch",
    "extensions.objectformat",
    "submodule.*.url",
    "submodule.*.active",
    "pull.rebase",
    "color.ui",
];

/// One thing left in the workspace that a host program would act on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Leftover {
    /// Relative to the workspace.
    pub path: PathBuf,
    /// Why it matters, for a person.
    pub why: String,
}

/// Repositories and settings in `workspace` that were not among
/// `protected` (the sandbox's read-only paths) and that a host program
/// would take commands from.
pub fn leftovers(workspace: &Path, protected: &[PathBuf]) -> Vec<Leftover> {
    let mut out = Vec::new();
    let Ok(root) = rustix::fs::open(
        workspace,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return out;
    };
    let is_protected = |rel: &Path| protected.iter().any(|p| p == &workspace.join(rel));
    for name in CONTROL_FILES {
        let rel = Path::new(name);
        if !is_protected(rel) && open_beneath(&root, rel, OFlags::PATH).is_some() {
            out.push(Leftover {
                path: rel.to_path_buf(),
                why: "editor or coding-agent settings that appeared while the sandbox ran \
                      (tasks, hooks, servers they start)"
                    .into(),
            });
        }
    }
    let found = crate::repos::find_git(workspace, true);
    for git in found.git {
        let Ok(rel) = git.strip_prefix(workspace) else {
            continue;
        };
        if is_protected(rel) {
            continue;
        }
        if let Some(why) = inspect(&root, rel) {
            out.push(Leftover {
                path: rel.to_path_buf(),
                why,
            });
        }
    }
    out
}

/// Why git would run something from the `.git` at `rel`, if it would.
fn inspect(root: &OwnedFd, rel: &Path) -> Option<String> {
    let fd = open_beneath(root, rel, OFlags::PATH)?;
    let kind = FileType::from_raw_mode(rustix::fs::fstat(&fd).ok()?.st_mode);
    if kind == FileType::RegularFile {
        let text = read_beneath(root, rel)?;
        let first = text.lines().next().unwrap_or("");
        return Some(format!(
            "a .git file pointing git at another repository ({})",
            printable(first)
        ));
    }
    let mut why = Vec::new();
    if open_beneath(root, &rel.join("commondir"), OFlags::PATH).is_some() {
        why.push("a commondir (git reads configuration and hooks from where it points)".into());
    }
    if let Some(config) = read_beneath(root, &rel.join("config")) {
        let keys = unusual_settings(&config);
        if !keys.is_empty() {
            why.push(format!(
                "configuration git may run commands from: {}",
                keys.join(", ")
            ));
        }
    }
    let hooks = hooks(root, &rel.join("hooks"));
    if !hooks.is_empty() {
        why.push(format!("hooks: {}", hooks.join(", ")));
    }
    (!why.is_empty()).then(|| why.join("; "))
}

/// The settings in `config` that are not [`HARMLESS`], as `section.key`;
/// anything that does not read as a plain setting counts as unusual.
fn unusual_settings(config: &str) -> Vec<String> {
    let mut section = String::new();
    let mut unusual = Vec::new();
    let mut add = |s: String| {
        if !unusual.contains(&s) && unusual.len() < 10 {
            unusual.push(s);
        }
    };
    for line in config.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if line.ends_with('\\') {
            add("(a continued line)".into());
            continue;
        }
        if let Some(header) = line.strip_prefix('[') {
            let Some(header) = header.strip_suffix(']') else {
                add("(an unusual section header)".into());
                section.clear();
                continue;
            };
            section = match header.split_once(' ') {
                None => header.to_ascii_lowercase(),
                // A remote named like a URL: `git push <that URL>` goes
                // wherever its `url` says.
                Some((name, sub))
                    if name.eq_ignore_ascii_case("remote") && sub.contains([':', '/', '\\']) =>
                {
                    add("(a remote named like a URL or a path)".into());
                    String::new()
                }
                Some((name, sub)) if sub.starts_with('"') && sub.ends_with('"') => {
                    format!("{}.*", name.to_ascii_lowercase())
                }
                Some(_) => {
                    add("(an unusual section header)".into());
                    String::new()
                }
            };
            continue;
        }
        let (key, value) = line.split_once('=').unwrap_or((line, ""));
        let name = format!("{section}.{}", key.trim().to_ascii_lowercase());
        let transport = value.trim().trim_matches('"');
        let harmless = HARMLESS.contains(&name.as_str())
            && !(name.ends_with("url")
                && (transport.starts_with("ext::") || transport.starts_with("fd::")));
        if !harmless {
            add(printable(&name));
        }
    }
    unusual
}

/// Hooks git would run: regular files that are not its `.sample`s.
fn hooks(root: &OwnedFd, rel: &Path) -> Vec<String> {
    let Some(fd) = open_beneath(root, rel, OFlags::RDONLY | OFlags::DIRECTORY) else {
        return Vec::new();
    };
    let Ok(mut dir) = Dir::read_from(&fd) else {
        return Vec::new();
    };
    let mut names = Vec::new();
    while let Some(Ok(e)) = dir.read() {
        let name = String::from_utf8_lossy(e.file_name().to_bytes()).into_owned();
        if name == "." || name == ".." || name.ends_with(".sample") {
            continue;
        }
        if names.len() < 10 {
            names.push(printable(&name));
        }
    }
    names
}

fn open_beneath(root: &OwnedFd, rel: &Path, flags: OFlags) -> Option<OwnedFd> {
    rustix::fs::openat2(
        root,
        rel,
        flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )
    .ok()
}

/// A regular file beneath the workspace, at most [`MAX_FILE`] of it.
fn read_beneath(root: &OwnedFd, rel: &Path) -> Option<String> {
    let fd = open_beneath(
        root,
        rel,
        OFlags::RDONLY | OFlags::NONBLOCK | OFlags::NOCTTY,
    )?;
    if FileType::from_raw_mode(rustix::fs::fstat(&fd).ok()?.st_mode) != FileType::RegularFile {
        return None;
    }
    let mut bytes = Vec::new();
    std::fs::File::from(fd)
        .take(MAX_FILE)
        .read_to_end(&mut bytes)
        .ok()?;
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// Text from the workspace, at most 200 characters and nothing a terminal
/// would act on: it is printed to the user's terminal.
fn printable(s: &str) -> String {
    cordon_image::text::shown(s.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn git(dir: &Path, args: &[&str]) {
        let ok = std::process::Command::new("git")
            .args(args)
            .current_dir(dir)
            .env("GIT_CONFIG_NOSYSTEM", "1")
            .env("HOME", dir)
            .output()
            .unwrap()
            .status
            .success();
        assert!(ok, "git {args:?}");
    }

    #[test]
    fn a_plain_repository_is_not_reported_a_planted_one_is() {
        let t = tempfile::tempdir().unwrap();
        let ws = t.path();
        git(ws, &["init", "-q"]);
        git(ws, &["init", "-q", "plain"]);
        git(ws, &["init", "-q", "planted"]);
        git(
            &ws.join("planted"),
            &["config", "core.fsmonitor", "touch /tmp/x"],
        );
        git(ws, &["init", "-q", "hooked"]);
        std::fs::write(ws.join("hooked/.git/hooks/post-checkout"), "#!/bin/sh\n").unwrap();
        git(ws, &["init", "-q", "common"]);
        std::fs::write(ws.join("common/.git/commondir"), "../../evil\n").unwrap();
        std::fs::create_dir(ws.join("file")).unwrap();
        std::fs::write(ws.join("file/.git"), "gitdir: /elsewhere\x1b[2J\n").unwrap();
        std::fs::create_dir(ws.join(".vscode")).unwrap();
        // The top level's .git was protected; .vscode was not.
        let found = leftovers(ws, &[ws.join(".git")]);
        let paths: Vec<_> = found.iter().map(|l| l.path.to_str().unwrap()).collect();
        let mut sorted = paths.clone();
        sorted.sort();
        assert_eq!(
            sorted,
            [
                ".vscode",
                "common/.git",
                "file/.git",
                "hooked/.git",
                "planted/.git"
            ],
            "{found:?}"
        );
        let why = |p: &str| &found.iter().find(|l| l.path == Path::new(p)).unwrap().why;
        assert!(why("planted/.git").contains("core.fsmonitor"));
        assert!(why("hooked/.git").contains("post-checkout"));
        assert!(why("common/.git").contains("commondir"));
        assert!(why("file/.git").contains("gitdir: /elsewhere?[2J"));
    }

    #[test]
    fn odd_configuration_counts_as_unusual() {
        assert!(unusual_settings("[core]\n\tbare = false\n[remote \"o\"]\n\turl = x\n").is_empty());
        assert_eq!(
            unusual_settings("[core]\nfsmonitor = x\n"),
            ["core.fsmonitor"]
        );
        assert_eq!(
            unusual_settings("[Core]\n\tFSMonitor = x\n"),
            ["core.fsmonitor"]
        );
        assert!(
            unusual_settings(
                "[remote \"https://forge.test/p.git\"]\n\turl = https://evil.test/p\n"
            )
            .contains(&"(a remote named like a URL or a path)".to_string())
        );
        assert!(!unusual_settings("[core]\n\tbare = \\\n").is_empty());
        assert!(!unusual_settings("[include]\n\tpath = ../x\n").is_empty());
    }
}
