//! `@path` completion: the workspace's entries that start with what the
//! user typed after `@`.
//!
//! The workspace is the sandbox's to write, so its names are hostile: the
//! directory is read beneath the workspace root and never through a link
//! (`cordon_tools::walk`), and a name that could not be typed back as one
//! word of the prompt (a control character, white space, bytes that are
//! not UTF-8) is left out rather than put in the input box.

use std::ops::ControlFlow;
use std::path::Path;

use cordon_tools::walk::{Kind, Walk};
use cordon_tools::{Workspace, WsPath};

/// Most names offered at once: enough for a list on one screen.
pub const MAX_MATCHES: usize = 200;

/// The completions of `typed` (the text after `@`): each the whole path
/// from the workspace root as typed, a directory with a `/` after it.
/// Files `.gitignore` leaves out are not offered; names starting with a
/// dot only when the typed name does.
pub fn paths(workspace: &Path, typed: &str) -> Vec<String> {
    let (dir, start) = match typed.rfind('/') {
        Some(i) => typed.split_at(i + 1),
        None => ("", typed),
    };
    let Ok(ws) = Workspace::open(workspace) else {
        return Vec::new();
    };
    let Ok(at) = WsPath::parse(if dir.is_empty() { "." } else { dir }) else {
        return Vec::new();
    };
    let Ok(mut walk) = Walk::beneath(&ws, &at) else {
        return Vec::new();
    };
    walk.max_depth(1);
    let mut found = Vec::new();
    walk.run(|entry| {
        if entry.depth != 1 {
            return ControlFlow::Continue(());
        }
        let Some(name) = entry.name.to_str() else {
            return ControlFlow::Continue(());
        };
        let hidden = name.starts_with('.') && !start.starts_with('.');
        if name.starts_with(start) && !hidden && typable(name) {
            let slash = if entry.kind == Kind::Dir { "/" } else { "" };
            found.push(format!("{dir}{name}{slash}"));
        }
        if found.len() >= MAX_MATCHES {
            ControlFlow::Break(())
        } else {
            ControlFlow::Continue(())
        }
    });
    found
}

/// Whether `name` can go into the prompt as (part of) one word.
fn typable(name: &str) -> bool {
    !name.is_empty()
        && !name
            .chars()
            .any(|c| c.is_whitespace() || cordon_tools::unprintable(c))
}

#[cfg(test)]
mod tests {
    use super::paths;

    #[test]
    fn entries_are_offered_from_beneath_the_workspace_only() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let w = ws.path();
        std::fs::create_dir_all(w.join("src/bin")).unwrap();
        std::fs::write(w.join("src/main.rs"), "").unwrap();
        std::fs::write(w.join("src/match.rs"), "").unwrap();
        std::fs::write(w.join("README.md"), "").unwrap();
        std::fs::write(w.join(".env"), "").unwrap();
        std::fs::write(w.join(".gitignore"), "target/\n").unwrap();
        std::fs::create_dir(w.join("target")).unwrap();
        std::fs::write(w.join("src/ma\x1b[2Jin.rs"), "").unwrap();
        std::fs::write(w.join("src/main copy.rs"), "").unwrap();
        std::fs::write(outside.path().join("host-secret"), "").unwrap();
        std::os::unix::fs::symlink(outside.path(), w.join("out")).unwrap();

        assert_eq!(paths(w, "src/ma"), ["src/main.rs", "src/match.rs"]);
        assert_eq!(paths(w, "src/b"), ["src/bin/"]);
        assert_eq!(paths(w, "R"), ["README.md"]);
        // Ignored and hidden entries are left out unless asked for.
        assert!(paths(w, "").iter().all(|p| p != "target/" && p != ".env"));
        assert_eq!(paths(w, ".e"), [".env"]);
        // A link is offered as a name, and never listed through.
        assert_eq!(paths(w, "ou"), ["out"]);
        assert!(paths(w, "out/").is_empty());
        assert!(paths(w, "../").is_empty());
        assert!(paths(w, "/etc/").is_empty());
        assert!(paths(w, "nothing/here").is_empty());
    }
}
