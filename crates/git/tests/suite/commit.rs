//! `git_commit` against a work tree the sandbox wrote: what is committed,
//! and what is never run, read or followed.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::{Path, PathBuf};

use cordon_git::{Ident, commit};
use cordon_testkit::git_remote::git;

use crate::support;
use support::{Swapper, objects_hold};

fn author() -> Ident {
    Ident {
        name: "Ada Host".into(),
        email: "ada@host.example".into(),
    }
}

/// A clone of a small repository on the session's branch `cordon/s1`.
fn workspace(tmp: &Path) -> PathBuf {
    let src = tmp.join("src");
    std::fs::create_dir(&src).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    std::fs::write(src.join("README"), "one\n").unwrap();
    std::fs::write(src.join("old.txt"), "old\n").unwrap();
    std::fs::write(src.join(".gitignore"), "/build/\n").unwrap();
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "one"]);
    let ws = tmp.join("ws");
    git(tmp, &["clone", "-q", "src", "ws"]);
    git(&ws, &["checkout", "-q", "-b", "cordon/s1"]);
    ws
}

#[test]
fn the_changes_are_committed_to_the_sessions_branch_links_as_links() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = workspace(tmp.path());
    let before = git(&ws, &["rev-parse", "HEAD"]);
    std::fs::write(ws.join("README"), "two\n").unwrap();
    std::fs::remove_file(ws.join("old.txt")).unwrap();
    std::fs::create_dir_all(ws.join("src")).unwrap();
    std::fs::write(ws.join("src/new.rs"), "fn main() {}\n").unwrap();
    std::fs::write(ws.join("run.sh"), "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(ws.join("run.sh"), PermissionsExt::from_mode(0o755)).unwrap();
    symlink("/etc/passwd", ws.join("passwd-link")).unwrap();
    std::fs::create_dir_all(ws.join("build")).unwrap();
    std::fs::write(ws.join("build/out.o"), "object").unwrap();

    let c = commit(&ws, "cordon/s1", "Change things\n\nBecause.", &author())
        .unwrap()
        .expect("a commit");
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), c.commit);
    assert_eq!(git(&ws, &["rev-parse", "HEAD^"]), before);
    assert_eq!(
        git(&ws, &["rev-parse", "main"]),
        before,
        "only the session's branch moves"
    );
    let mut changes = c.changes.clone();
    changes.sort();
    assert_eq!(
        changes,
        [
            "A passwd-link",
            "A run.sh",
            "A src/new.rs",
            "D old.txt",
            "M README"
        ]
    );
    // The link is a link, its target text; the executable bit is kept.
    assert_eq!(
        git(&ws, &["cat-file", "-p", "HEAD:passwd-link"]),
        "/etc/passwd"
    );
    let tree = git(&ws, &["ls-tree", "HEAD"]);
    assert!(
        tree.contains("120000 blob") && tree.contains("100755 blob"),
        "{tree}"
    );
    assert_eq!(
        git(&ws, &["log", "-1", "--format=%an <%ae>|%cn <%ce>|%B"]),
        "Ada Host <ada@host.example>|Ada Host <ada@host.example>|Change things\n\nBecause."
    );
    // The index matches: nothing staged or changed but what is ignored.
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    // Again with nothing changed: no commit.
    assert_eq!(commit(&ws, "cordon/s1", "again", &author()).unwrap(), None);
}

#[test]
fn hooks_and_attributes_the_sandbox_planted_never_run() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = workspace(tmp.path());
    let marker = tmp.path().join("ran");
    let evil = format!("#!/bin/sh\necho \"$0\" >> {}\ncat\n", marker.display());
    for hook in [
        "pre-commit",
        "commit-msg",
        "post-commit",
        "reference-transaction",
        "post-index-change",
    ] {
        let h = ws.join(".git/hooks").join(hook);
        std::fs::write(&h, &evil).unwrap();
        std::fs::set_permissions(&h, PermissionsExt::from_mode(0o755)).unwrap();
    }
    std::fs::write(ws.join(".gitattributes"), "* filter=lfs diff=x merge=x\n").unwrap();
    std::fs::write(ws.join("README"), "changed\n").unwrap();
    commit(&ws, "cordon/s1", "With hooks planted", &author())
        .unwrap()
        .expect("a commit");
    assert!(
        !marker.exists(),
        "{}",
        std::fs::read_to_string(&marker).unwrap()
    );

    // A configuration naming a program: refused before git runs, the key
    // named.
    git(
        &ws,
        &[
            "config",
            "core.fsmonitor",
            &ws.join(".git/hooks/pre-commit").display().to_string(),
        ],
    );
    std::fs::write(ws.join("README"), "changed again\n").unwrap();
    let err = commit(&ws, "cordon/s1", "x", &author())
        .unwrap_err()
        .to_string();
    assert!(err.contains("core.fsmonitor"), "{err}");
    assert!(!marker.exists());
}

#[test]
fn only_the_sessions_branch_and_a_real_message() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = workspace(tmp.path());
    std::fs::write(ws.join("README"), "changed\n").unwrap();
    for bad in ["", "   \n", "a\0b"] {
        assert!(commit(&ws, "cordon/s1", bad, &author()).is_err(), "{bad:?}");
    }
    git(&ws, &["checkout", "-q", "main"]);
    let err = commit(&ws, "cordon/s1", "x", &author())
        .unwrap_err()
        .to_string();
    assert!(err.contains("not on this session's branch"), "{err}");
    assert_eq!(git(&ws, &["log", "-1", "--format=%s", "main"]), "one");
}

#[test]
fn a_file_swapped_for_a_link_to_a_host_secret_is_never_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = workspace(tmp.path());
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "HOST SECRET").unwrap();
    std::fs::write(ws.join(".gitignore"), "/build/\n/n.link\n").unwrap();
    symlink(&secret, ws.join("n.link")).unwrap();
    let swapper = Swapper::start(ws.join("README"), ws.join("n.link"));
    for i in 0..20 {
        std::fs::write(ws.join("counter"), i.to_string()).unwrap();
        let _ = commit(&ws, "cordon/s1", &format!("turn {i}"), &author());
    }
    swapper.stop();
    assert!(
        !objects_hold(&ws.join(".git"), "HOST SECRET"),
        "a commit read through a link"
    );
}

/// Files the repository tracks stay in the commit when `.gitignore` now
/// leaves them out, as `git add -A` has it; read beneath the workspace,
/// never through a link.
#[test]
fn tracked_files_that_gitignore_leaves_out_stay_committed() {
    let tmp = tempfile::tempdir().unwrap();
    let src = tmp.path().join("src");
    std::fs::create_dir(&src).unwrap();
    git(&src, &["init", "-q", "-b", "main"]);
    std::fs::write(src.join("keep.log"), "tracked log\n").unwrap();
    std::fs::create_dir(src.join("vendor")).unwrap();
    std::fs::write(src.join("vendor/lib.c"), "int x;\n").unwrap();
    std::fs::write(src.join("link.log"), "to become a link\n").unwrap();
    git(&src, &["add", "-A"]);
    git(&src, &["commit", "-q", "-m", "one"]);
    let ws = tmp.path().join("ws");
    git(tmp.path(), &["clone", "-q", "src", "ws"]);
    git(&ws, &["checkout", "-q", "-b", "cordon/s1"]);
    let secret = tmp.path().join("secret");
    std::fs::write(&secret, "HOST SECRET").unwrap();

    std::fs::write(ws.join(".gitignore"), "*.log\n/vendor/\n").unwrap();
    std::fs::write(ws.join("keep.log"), "changed log\n").unwrap();
    std::fs::remove_file(ws.join("link.log")).unwrap();
    symlink(&secret, ws.join("link.log")).unwrap();
    std::fs::write(ws.join("untracked.log"), "never\n").unwrap();
    commit(&ws, "cordon/s1", "Ignore logs", &author())
        .unwrap()
        .expect("a commit");
    let files = git(&ws, &["ls-tree", "-r", "--name-only", "HEAD"]);
    let files: Vec<&str> = files.lines().collect();
    assert_eq!(
        files,
        [".gitignore", "keep.log", "link.log", "vendor/lib.c"]
    );
    assert_eq!(git(&ws, &["show", "HEAD:keep.log"]), "changed log");
    // The link is committed as a link, its target's bytes never read.
    assert_eq!(
        git(&ws, &["cat-file", "-p", "HEAD:link.log"]),
        secret.display().to_string()
    );
    assert!(!objects_hold(&ws.join(".git"), "HOST SECRET"));
}
