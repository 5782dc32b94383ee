//! Project instructions: the `AGENTS.md` files (the convention Codex,
//! Claude Code and others read) that go into the model's instructions
//! after cordon's own prompt.
//!
//! The rules:
//! - The user's own file (`~/.config/cordon/AGENTS.md`) comes first, then
//!   the workspace's from its root down to the sandbox's working
//!   directory: the most general first, so that where they disagree the
//!   more specific, later one is read last.
//! - The workspace's files are the sandbox's to write, so they are read
//!   the way the file tools read: beneath the workspace (`openat2`), no
//!   link out of it followed, regular files only (a FIFO cannot make the
//!   host wait). Their text is for the model; the host runs nothing of
//!   it and prints only the paths it chose itself.
//! - Each file is cut at [`PER_FILE`] bytes and all of them at [`TOTAL`],
//!   and the cut is said where it is made, so that the model knows it has
//!   not seen the rest.

use std::io::Read;
use std::path::Path;

use cordon_tools::{Workspace, WsPath};
use serde::{Deserialize, Serialize};

/// The file's name, in every directory.
pub const FILE_NAME: &str = "AGENTS.md";
/// The most of one file the model is given.
pub const PER_FILE: usize = 32 * 1024;
/// The most of all of them together.
pub const TOTAL: usize = 64 * 1024;
/// Where the sandbox sees the workspace.
const SANDBOX_ROOT: &str = "/workspace";

/// One file read, as front ends show it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Source {
    /// Where it is: `~/.config/cordon/AGENTS.md` or a path in the sandbox
    /// (`/workspace/AGENTS.md`).
    pub path: String,
    /// Its size.
    pub bytes: u64,
    /// How much of it the model was given, when not all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cut_at: Option<u64>,
}

/// The instructions read for a conversation.
#[derive(Debug, Clone, Default)]
pub struct Instructions {
    sources: Vec<Source>,
    texts: Vec<String>,
}

impl Instructions {
    /// Reads the user's file `user` (a host path of the user's own, if
    /// any), then the workspace's `AGENTS.md` files from its root down to
    /// `workdir`, the sandbox's working directory. A file that cannot be
    /// read is left out, said in the log.
    pub fn read(user: Option<&Path>, workspace: &Path, workdir: &str) -> Instructions {
        let mut found = Instructions::default();
        let mut room = TOTAL;
        if let Some(path) = user {
            match std::fs::File::open(path) {
                Ok(file) => {
                    let size = file.metadata().map(|m| m.len()).unwrap_or(0);
                    found.add("~/.config/cordon/AGENTS.md", file, size, &mut room);
                }
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                Err(e) => tracing::warn!("{}: {e}", path.display()),
            }
        }
        let ws = match Workspace::open(workspace) {
            Ok(ws) => ws,
            Err(e) => {
                tracing::warn!("project instructions: {e}");
                return found;
            }
        };
        for dir in dirs_down_to(workdir) {
            let shown = if dir.is_empty() {
                format!("{SANDBOX_ROOT}/{FILE_NAME}")
            } else {
                format!("{SANDBOX_ROOT}/{dir}/{FILE_NAME}")
            };
            let Ok(path) = WsPath::parse(&shown) else {
                continue;
            };
            match ws.open_read(&path) {
                Ok((file, size)) => found.add(&shown, file, size, &mut room),
                Err(cordon_tools::WorkspaceError::NotFound { .. }) => {}
                Err(e) => tracing::info!("{shown} is not read: {e}"),
            }
        }
        found
    }

    fn add(&mut self, shown: &str, file: impl Read, size: u64, room: &mut usize) {
        let want = PER_FILE.min(*room);
        let mut bytes = Vec::new();
        if let Err(e) = file.take(want as u64 + 1).read_to_end(&mut bytes) {
            tracing::warn!("{shown}: {e}");
            return;
        }
        let cut = bytes.len() > want;
        bytes.truncate(want);
        let mut text = String::from_utf8_lossy(&bytes).into_owned();
        if cut {
            // Whole characters only: a cut one would read as garbage.
            while text.ends_with('\u{fffd}') {
                text.pop();
            }
        }
        *room -= bytes.len();
        let cut_at = cut.then_some(bytes.len() as u64);
        if cut {
            text.push_str(&format!(
                "\n[cordon: {shown} is cut here: only its first {} of {size} bytes are shown]",
                bytes.len()
            ));
        }
        self.sources.push(Source {
            path: shown.to_string(),
            bytes: size,
            cut_at,
        });
        self.texts.push(text);
    }

    /// The files read, in order.
    pub fn sources(&self) -> &[Source] {
        &self.sources
    }

    /// The text that follows cordon's prompt: empty without files.
    pub fn prompt(&self) -> String {
        if self.texts.is_empty() {
            return String::new();
        }
        let mut out = String::from(
            "\n\n# Instructions from the user and the project\n\nThe files below \
             (AGENTS.md) are the user's and the project's instructions for working here, \
             from the most general to the most specific: where they disagree, the later \
             one wins. Follow them as you would the user, within what the sandbox allows; \
             they cannot change what it allows.",
        );
        for (s, text) in self.sources.iter().zip(&self.texts) {
            out.push_str(&format!("\n\n## {}\n\n{}", s.path, text.trim_end()));
        }
        out
    }
}

/// The workspace's directories from its root down to `workdir`, as paths
/// relative to the root (`""`, `"a"`, `"a/b"`); only the root when
/// `workdir` is not beneath /workspace.
fn dirs_down_to(workdir: &str) -> Vec<String> {
    let mut dirs = vec![String::new()];
    let Ok(rel) = WsPath::parse(workdir) else {
        return dirs;
    };
    let mut at = String::new();
    for part in rel.rel.components() {
        let std::path::Component::Normal(name) = part else {
            continue;
        };
        let Some(name) = name.to_str() else {
            return dirs;
        };
        if !at.is_empty() {
            at.push('/');
        }
        at.push_str(name);
        dirs.push(at.clone());
    }
    dirs
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn directories_from_the_root_down() {
        assert_eq!(dirs_down_to("/workspace"), vec![""]);
        assert_eq!(dirs_down_to("/workspace/a/b"), vec!["", "a", "a/b"]);
        assert_eq!(dirs_down_to("/elsewhere"), vec![""]);
    }

    #[test]
    fn files_are_read_in_order_and_cut_where_said() {
        let ws = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(ws.path().join("sub")).unwrap();
        std::fs::write(ws.path().join("AGENTS.md"), "root rules\n").unwrap();
        std::fs::write(ws.path().join("sub/AGENTS.md"), "é".repeat(PER_FILE)).unwrap();
        let user = home.path().join("AGENTS.md");
        std::fs::write(&user, "mine\n").unwrap();
        let found = Instructions::read(Some(&user), ws.path(), "/workspace/sub");
        let paths: Vec<&str> = found.sources().iter().map(|s| s.path.as_str()).collect();
        assert_eq!(
            paths,
            [
                "~/.config/cordon/AGENTS.md",
                "/workspace/AGENTS.md",
                "/workspace/sub/AGENTS.md"
            ]
        );
        let big = &found.sources()[2];
        assert_eq!(big.bytes, 2 * PER_FILE as u64);
        assert_eq!(big.cut_at, Some(PER_FILE as u64));
        let prompt = found.prompt();
        let (mine, root, sub) = (
            prompt.find("mine").unwrap(),
            prompt.find("root rules").unwrap(),
            prompt.find("## /workspace/sub/AGENTS.md").unwrap(),
        );
        assert!(mine < root && root < sub, "{prompt}");
        assert!(prompt.contains("only its first 32768 of 65536 bytes are shown"));
        assert!(!prompt.contains('\u{fffd}'), "no character is cut in two");
    }

    #[test]
    fn links_out_and_fifos_are_not_read() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("secret"), "host secret").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), ws.path().join("AGENTS.md"))
            .unwrap();
        std::fs::create_dir(ws.path().join("d")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            ws.path().join("d/AGENTS.md"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o644),
            0,
        )
        .unwrap();
        let found = Instructions::read(None, ws.path(), "/workspace/d");
        assert!(found.sources().is_empty(), "{:?}", found.sources());
        assert!(!found.prompt().contains("host secret"));
    }
}
