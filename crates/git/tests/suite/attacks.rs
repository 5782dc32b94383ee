//! The sandbox owns the workspace while cordon checkpoints and rewinds it:
//! links planted where files were, directories swapped for links in a loop
//! while cordon writes, a repository configured to run programs.

use std::os::unix::fs::symlink;
use std::path::Path;

use cordon_git::{Checkpoints, Git};

use crate::support;
use support::{Swapper, objects_hold};

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

/// A host secret outside the workspace.
fn secret(dir: &Path) -> std::path::PathBuf {
    let s = dir.join("secret");
    std::fs::write(&s, "HOST SECRET").unwrap();
    s
}

#[test]
fn a_link_to_a_host_file_is_recorded_as_a_link_never_read() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let secret = secret(tmp.path());
    symlink(&secret, ws.join("notes.txt")).unwrap();
    symlink(tmp.path(), ws.join("up")).unwrap();
    let store = Checkpoints::open(&tmp.path().join("cp")).unwrap();
    let t0 = store.record(&ws, "turn 0").unwrap();
    assert_eq!(t0.files, 2);
    // No object in the store holds the secret's bytes.
    assert!(
        !objects_hold(&tmp.path().join("cp"), "HOST SECRET"),
        "the checkpoint read through a link"
    );
}

#[test]
fn a_checkpoint_racing_a_file_swapped_for_a_link_never_reads_the_host() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let secret = secret(tmp.path());
    write(&ws, ".gitignore", b"/n.link\n");
    write(&ws, "notes.txt", b"notes");
    symlink(&secret, ws.join("n.link")).unwrap();
    let store = Checkpoints::open(&tmp.path().join("cp")).unwrap();
    let swapper = Swapper::start(ws.join("notes.txt"), ws.join("n.link"));
    for i in 0..30 {
        // A change each time, so that every record reads the file.
        write(&ws, "turn", format!("{i}").as_bytes());
        let _ = store.record(&ws, "turn");
    }
    swapper.stop();
    assert!(
        !objects_hold(&tmp.path().join("cp"), "HOST SECRET"),
        "a checkpoint read through a link"
    );
}

#[test]
fn a_rewind_never_writes_through_a_planted_link() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir(&ws).unwrap();
    write(&ws, "d/file", b"mine");
    write(&ws, "f", b"mine");
    let store = Checkpoints::open(&tmp.path().join("cp")).unwrap();
    let t0 = store.record(&ws, "turn 0").unwrap();

    // The sandbox replaces the directory and the file with links out.
    std::fs::remove_dir_all(ws.join("d")).unwrap();
    symlink(&outside, ws.join("d")).unwrap();
    std::fs::remove_file(ws.join("f")).unwrap();
    symlink(outside.join("f"), ws.join("f")).unwrap();
    store.record(&ws, "turn 1").unwrap();

    let r = store.restore(&ws, &t0.id).unwrap();
    assert!(r.restored.kept.is_empty(), "{:?}", r.restored.kept);
    assert_eq!(std::fs::read(ws.join("d/file")).unwrap(), b"mine");
    assert_eq!(std::fs::read(ws.join("f")).unwrap(), b"mine");
    assert!(
        !std::fs::symlink_metadata(ws.join("d"))
            .unwrap()
            .is_symlink()
    );
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "written outside"
    );
}

#[test]
fn a_rewind_racing_a_directory_swapped_for_a_link_stays_inside() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    let outside = tmp.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::create_dir(&ws).unwrap();
    for i in 0..200 {
        write(&ws, &format!("d/f{i}"), format!("v0 {i}").as_bytes());
    }
    // Where the sandbox keeps its link between swaps: ignored, so no
    // checkpoint holds it and no rewind removes it.
    write(&ws, ".gitignore", b"/d.link\n");
    let store = Checkpoints::open(&tmp.path().join("cp")).unwrap();
    let t0 = store.record(&ws, "turn 0").unwrap();
    for i in 0..200 {
        write(&ws, &format!("d/f{i}"), format!("v1 {i}").as_bytes());
    }
    let t1 = store.record(&ws, "turn 1").unwrap();

    // The "sandbox": swaps d for a link to outside and back, as fast as
    // it can; `d` is always there, a directory one moment and a link out
    // the next.
    symlink(&outside, ws.join("d.link")).unwrap();
    let swapper = Swapper::start(ws.join("d"), ws.join("d.link"));
    // Back and forth, so that every rewind has files to write.
    let mut written = 0;
    for i in 0..20 {
        let to = if i % 2 == 0 { &t0.id } else { &t1.id };
        if let Ok(r) = store.restore(&ws, to) {
            written += r.restored.written;
        }
    }
    swapper.stop();
    assert!(
        written > 0,
        "no rewind wrote anything: the race was not run"
    );
    assert_eq!(
        std::fs::read_dir(&outside).unwrap().count(),
        0,
        "a rewind wrote through the link"
    );
}

fn git(dir: &Path, args: &[&str]) {
    let s = std::process::Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .status()
        .unwrap();
    assert!(s.success(), "{args:?}");
}

/// A program that records that it ran, and passes its input through.
fn evil(dir: &Path) -> (String, std::path::PathBuf) {
    let marker = dir.join("ran");
    let evil = dir.join("evil.sh");
    std::fs::write(
        &evil,
        format!("#!/bin/sh\necho \"$0 $*\" >> {}\ncat\n", marker.display()),
    )
    .unwrap();
    std::fs::set_permissions(&evil, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    (evil.display().to_string(), marker)
}

/// Hooks, and the settings that name one program each, as a sandbox that
/// could write `.git` would plant them: git as cordon runs it runs none,
/// even on a repository it did not check.
#[test]
fn git_run_by_cordon_runs_no_hook_and_no_program_a_setting_names() {
    let tmp = tempfile::tempdir().unwrap();
    let repo = tmp.path().join("repo");
    let (e, marker) = evil(tmp.path());
    std::fs::create_dir(&repo).unwrap();
    git(&repo, &["init", "-q"]);
    for (k, v) in [
        ("core.fsmonitor", e.as_str()),
        ("core.sshCommand", e.as_str()),
        ("core.pager", e.as_str()),
        ("core.editor", e.as_str()),
        ("core.askPass", e.as_str()),
        ("diff.external", e.as_str()),
        ("credential.helper", e.as_str()),
        ("core.hooksPath", ".git/hooks"),
    ] {
        git(&repo, &["config", k, v]);
    }
    for hook in [
        "pre-commit",
        "commit-msg",
        "post-commit",
        "post-checkout",
        "pre-push",
        "reference-transaction",
        "post-index-change",
    ] {
        std::fs::copy(
            tmp.path().join("evil.sh"),
            repo.join(".git/hooks").join(hook),
        )
        .unwrap();
    }
    // Drivers named by the work tree's attributes but defined nowhere git
    // reads (a repository that defines them is refused: see below).
    std::fs::write(repo.join(".gitattributes"), "* filter=x diff=x merge=x\n").unwrap();
    std::fs::write(repo.join("a.txt"), "one\n").unwrap();

    let git = Git::new(repo.join(".git"))
        .work_tree(&repo)
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t");
    git.run(["add", "-A"]).unwrap();
    git.run(["commit", "-q", "-m", "one"]).unwrap();
    std::fs::write(repo.join("a.txt"), "two\n").unwrap();
    git.run(["status", "--porcelain"]).unwrap();
    git.run(["diff"]).unwrap();
    git.run(["diff", "HEAD", "--stat"]).unwrap();
    git.run(["checkout", "--", "a.txt"]).unwrap();
    git.run(["log", "-p"]).unwrap();
    // Over ssh, git would start core.sshCommand.
    let _ = git.run(["push", "ssh://example.invalid/x", "HEAD:refs/heads/x"]);
    // ext:: runs a command; it is refused whatever the repository says.
    let err = git
        .run(["push", &format!("ext::{e} %S"), "HEAD:refs/heads/x"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("transport 'ext' not allowed"), "{err}");
    assert!(
        !marker.exists(),
        "git ran a program the repository named: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
}

/// Settings no override can foresee (drivers under any name), and files
/// that point git elsewhere: the repository is refused before git runs,
/// with the key or file named.
#[test]
fn a_repository_that_names_programs_or_places_is_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let (e, marker) = evil(tmp.path());
    let fresh = |name: &str| {
        let repo = tmp.path().join(name);
        std::fs::create_dir(&repo).unwrap();
        git(&repo, &["init", "-q"]);
        git(
            &repo,
            &["remote", "add", "origin", "https://example.com/x.git"],
        );
        std::fs::write(repo.join(".gitattributes"), "* filter=x diff=x\n").unwrap();
        std::fs::write(repo.join("a.txt"), "one\n").unwrap();
        repo
    };
    let ok = fresh("ok");
    cordon_git::checked_repository(&ok).expect("a plain repository is taken");

    for (i, (k, v)) in [
        ("filter.x.clean", e.as_str()),
        ("filter.x.process", e.as_str()),
        ("diff.x.textconv", e.as_str()),
        ("diff.x.command", e.as_str()),
        ("merge.x.driver", e.as_str()),
        ("include.path", "/etc/gitconfig"),
        (
            "url.https://evil.example/.insteadOf",
            "https://example.com/",
        ),
        ("core.worktree", "/"),
        ("uploadpack.packObjectsHook", e.as_str()),
    ]
    .into_iter()
    .enumerate()
    {
        let repo = fresh(&format!("r{i}"));
        git(&repo, &["config", k, v]);
        let err = cordon_git::checked_repository(&repo)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(&format!("sets {}", k.to_ascii_lowercase()))
                || err.contains(&format!("sets {k}")),
            "{k}: {err}"
        );
    }

    let repo = fresh("alternates");
    std::fs::write(
        repo.join(".git/objects/info/alternates"),
        "/home/user/.git/objects\n",
    )
    .unwrap();
    let err = cordon_git::checked_repository(&repo)
        .unwrap_err()
        .to_string();
    assert!(err.contains("objects/info/alternates"), "{err}");

    let repo = fresh("commondir");
    std::fs::write(repo.join(".git/commondir"), "../../elsewhere\n").unwrap();
    assert!(
        cordon_git::checked_repository(&repo)
            .unwrap_err()
            .to_string()
            .contains("commondir")
    );

    let repo = fresh("attributes");
    std::fs::write(repo.join(".git/info/attributes"), "* filter=x\n").unwrap();
    assert!(
        cordon_git::checked_repository(&repo)
            .unwrap_err()
            .to_string()
            .contains("info/attributes")
    );

    // `.git` as a file naming a repository elsewhere, or as a link.
    let gitfile = tmp.path().join("gitfile");
    std::fs::create_dir(&gitfile).unwrap();
    std::fs::write(
        gitfile.join(".git"),
        format!("gitdir: {}\n", ok.join(".git").display()),
    )
    .unwrap();
    let err = cordon_git::checked_repository(&gitfile)
        .unwrap_err()
        .to_string();
    assert!(err.contains("is a file"), "{err}");
    let linked = tmp.path().join("linked");
    std::fs::create_dir(&linked).unwrap();
    symlink(ok.join(".git"), linked.join(".git")).unwrap();
    let err = cordon_git::checked_repository(&linked)
        .unwrap_err()
        .to_string();
    assert!(err.contains("symbolic link"), "{err}");
    // The configuration as a link to a file elsewhere.
    let repo = fresh("config-link");
    std::fs::remove_file(repo.join(".git/config")).unwrap();
    symlink(ok.join(".git/config"), repo.join(".git/config")).unwrap();
    assert!(cordon_git::checked_repository(&repo).is_err());
    assert!(!marker.exists());
}
