//! Checkpoints of a workspace, taken and restored as a session would, and
//! against a workspace that fights back.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use cordon_git::{Checkpoints, Skip};

fn write(root: &Path, rel: &str, data: &[u8]) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, data).unwrap();
}

fn read(root: &Path, rel: &str) -> Vec<u8> {
    std::fs::read(root.join(rel)).unwrap()
}

struct Fixture {
    _tmp: tempfile::TempDir,
    ws: std::path::PathBuf,
    store: Checkpoints,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let store = Checkpoints::open(&tmp.path().join("session.checkpoints")).unwrap();
    Fixture {
        _tmp: tmp,
        ws,
        store,
    }
}

#[test]
fn edit_edit_rewind_gives_back_each_turns_bytes() {
    let f = fixture();
    write(&f.ws, "src/main.rs", b"fn main() {}\n");
    write(&f.ws, "run.sh", b"#!/bin/sh\necho hi\n");
    std::fs::set_permissions(f.ws.join("run.sh"), PermissionsExt::from_mode(0o755)).unwrap();
    symlink("src/main.rs", f.ws.join("main-link")).unwrap();
    let t0 = f.store.record(&f.ws, "turn 0").unwrap();
    assert!(t0.changed);
    assert_eq!(t0.files, 3);

    // Turn 1: an edit, a new file, a removal.
    write(&f.ws, "src/main.rs", b"fn main() { println!(\"1\"); }\n");
    write(&f.ws, "src/lib.rs", b"pub fn one() {}\n");
    std::fs::remove_file(f.ws.join("run.sh")).unwrap();
    let t1 = f.store.record(&f.ws, "turn 1").unwrap();
    assert!(t1.changed);
    assert_ne!(t1.id, t0.id);

    // A turn that changes nothing adds nothing.
    let same = f.store.record(&f.ws, "turn 1b").unwrap();
    assert!(!same.changed);
    assert_eq!(same.id, t1.id);

    // Turn 2: more edits, a directory replaced by a file.
    write(&f.ws, "src/main.rs", b"fn main() { println!(\"2\"); }\n");
    std::fs::remove_dir_all(f.ws.join("src")).unwrap();
    write(&f.ws, "src", b"now a file\n");
    let t2 = f.store.record(&f.ws, "turn 2").unwrap();
    assert!(t2.changed);

    // Back to the end of turn 1.
    let r = f.store.restore(&f.ws, &t1.id).unwrap();
    assert!(r.restored.kept.is_empty(), "{:?}", r.restored.kept);
    assert_eq!(
        r.before.id, t2.id,
        "the files before the rewind were checkpoint 2"
    );
    assert_eq!(
        read(&f.ws, "src/main.rs"),
        b"fn main() { println!(\"1\"); }\n"
    );
    assert_eq!(read(&f.ws, "src/lib.rs"), b"pub fn one() {}\n");
    assert!(!f.ws.join("run.sh").exists());

    // Back to the start: the executable bit and the link come back.
    f.store.restore(&f.ws, &t0.id).unwrap();
    assert_eq!(read(&f.ws, "src/main.rs"), b"fn main() {}\n");
    assert!(!f.ws.join("src/lib.rs").exists());
    let mode = std::fs::metadata(f.ws.join("run.sh"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755);
    let link = std::fs::symlink_metadata(f.ws.join("main-link")).unwrap();
    assert!(link.file_type().is_symlink());
    assert_eq!(
        std::fs::read_link(f.ws.join("main-link")).unwrap(),
        Path::new("src/main.rs")
    );

    // And forward again, to turn 2: the rewind itself was undoable.
    f.store.restore(&f.ws, &t2.id).unwrap();
    assert_eq!(read(&f.ws, "src"), b"now a file\n");
}

#[test]
fn ignored_and_huge_files_are_left_as_they_are() {
    let f = fixture();
    write(&f.ws, ".gitignore", b"target/\n");
    write(&f.ws, "target/debug/app", b"build output 1");
    write(&f.ws, "keep.txt", b"v1");
    // 100 MB: over the 32 MiB a checkpoint keeps.
    let big = f.ws.join("data.bin");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(100 << 20)
        .unwrap();
    let t0 = f.store.record(&f.ws, "turn 0").unwrap();
    assert_eq!(t0.files, 2, "only .gitignore and keep.txt");
    assert_eq!(
        t0.skipped
            .iter()
            .map(|s| (s.path.as_str(), &s.skip))
            .collect::<Vec<_>>(),
        vec![("data.bin", &Skip::TooLarge { bytes: 100 << 20 })]
    );

    write(&f.ws, "keep.txt", b"v2");
    write(&f.ws, "target/debug/app", b"build output 2");
    std::fs::File::create(&big)
        .unwrap()
        .set_len(1 << 20)
        .unwrap();
    f.store.record(&f.ws, "turn 1").unwrap();

    let r = f.store.restore(&f.ws, &t0.id).unwrap();
    assert_eq!(read(&f.ws, "keep.txt"), b"v1");
    // Neither recorded nor restored: as the turn left them.
    assert_eq!(read(&f.ws, "target/debug/app"), b"build output 2");
    assert_eq!(std::fs::metadata(&big).unwrap().len(), 1 << 20);
    assert_eq!(r.restored.written, 1);
    assert_eq!(r.restored.kept.len(), 1, "{:?}", r.restored.kept);
    assert_eq!(r.restored.kept[0].path, "data.bin");
}

#[test]
fn a_fifo_or_socket_is_skipped_not_waited_on() {
    let f = fixture();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        f.ws.join("pipe"),
        rustix::fs::FileType::Fifo,
        rustix::fs::Mode::from_raw_mode(0o644),
        0,
    )
    .unwrap();
    write(&f.ws, "a", b"a");
    let t = f.store.record(&f.ws, "turn").unwrap();
    assert_eq!(t.files, 1);
    assert_eq!(t.skipped[0].skip, Skip::NotAFile);
}

#[test]
fn hostile_names_round_trip() {
    let f = fixture();
    let names: &[&[u8]] = &[
        b"new\nline",
        b"\"quoted\"",
        b"back\\slash",
        b"tab\there",
        b"\xff\xfe not utf-8",
        b"M 100644 :1 injected",
        b" leading space",
    ];
    use std::os::unix::ffi::OsStrExt;
    for (i, n) in names.iter().enumerate() {
        std::fs::write(
            f.ws.join(std::ffi::OsStr::from_bytes(n)),
            format!("content {i}"),
        )
        .unwrap();
    }
    let t0 = f.store.record(&f.ws, "turn 0").unwrap();
    assert_eq!(t0.files, names.len());
    for n in names {
        std::fs::remove_file(f.ws.join(std::ffi::OsStr::from_bytes(n))).unwrap();
    }
    f.store.record(&f.ws, "turn 1").unwrap();
    f.store.restore(&f.ws, &t0.id).unwrap();
    for (i, n) in names.iter().enumerate() {
        assert_eq!(
            std::fs::read(f.ws.join(std::ffi::OsStr::from_bytes(n))).unwrap(),
            format!("content {i}").as_bytes()
        );
    }
}

#[test]
fn the_users_repository_and_control_files_are_never_touched() {
    let f = fixture();
    write(&f.ws, ".git/config", b"[core]\n");
    write(&f.ws, ".vscode/tasks.json", b"{}");
    write(&f.ws, "sub/.git/HEAD", b"ref: refs/heads/main\n");
    write(&f.ws, "sub/file", b"x");
    let t0 = f.store.record(&f.ws, "turn 0").unwrap();
    assert_eq!(t0.files, 1, "only sub/file");
    std::fs::remove_dir_all(f.ws.join(".git")).unwrap();
    write(&f.ws, ".vscode/tasks.json", b"{\"changed\": true}");
    f.store.record(&f.ws, "turn 1").unwrap();
    f.store.restore(&f.ws, &t0.id).unwrap();
    assert!(!f.ws.join(".git").exists(), "a rewind does not write .git");
    assert_eq!(read(&f.ws, ".vscode/tasks.json"), b"{\"changed\": true}");
}

#[test]
fn a_fork_gets_its_own_copy() {
    let f = fixture();
    write(&f.ws, "a/b/c.txt", b"c");
    symlink("/etc/passwd", f.ws.join("outward")).unwrap();
    let t0 = f.store.record(&f.ws, "turn 0").unwrap();
    let fork = f._tmp.path().join("fork");
    std::fs::create_dir(&fork).unwrap();
    let r = f.store.materialize(&t0.id, &fork).unwrap();
    assert_eq!(r.written, 2);
    assert_eq!(read(&fork, "a/b/c.txt"), b"c");
    // The link is a link, made, never followed.
    assert_eq!(
        std::fs::read_link(fork.join("outward")).unwrap(),
        Path::new("/etc/passwd")
    );
}

#[test]
fn only_this_sessions_checkpoints_can_be_restored() {
    let f = fixture();
    write(&f.ws, "a", b"a");
    f.store.record(&f.ws, "turn 0").unwrap();
    for bad in [
        "",
        "HEAD",
        "--output=/tmp/x",
        "0000000",
        "refs/cordon/checkpoints",
    ] {
        let err = f.store.restore(&f.ws, bad).unwrap_err().to_string();
        assert!(err.contains("is not a checkpoint"), "{bad}: {err}");
    }
    let other = fixture();
    write(&other.ws, "b", b"b");
    let theirs = other.store.record(&other.ws, "turn 0").unwrap();
    assert!(f.store.restore(&f.ws, &theirs.id).is_err());
}

/// Files old enough for the stat cache to trust: later checkpoints send
/// fast-import only what changed, and every checkpoint still holds every
/// file.
#[test]
fn unchanged_files_are_not_read_again_and_every_checkpoint_is_whole() {
    let f = fixture();
    for i in 0..50 {
        write(
            &f.ws,
            &format!("d{}/f{i}", i % 5),
            format!("v0 {i}").as_bytes(),
        );
    }
    // The cache trusts no file changed in the last two seconds (its ctime
    // too, which cannot be set back).
    std::thread::sleep(std::time::Duration::from_millis(2100));
    let t0 = f.store.record(&f.ws, "turn 0").unwrap();
    assert_eq!(t0.files, 50);
    std::fs::write(f.ws.join("d0/f0"), "v1 0").unwrap();
    std::fs::remove_file(f.ws.join("d1/f1")).unwrap();
    std::fs::remove_dir_all(f.ws.join("d2")).unwrap();
    write(&f.ws, "d2", b"now a file");
    write(&f.ws, "new/n", b"new");
    let t1 = f.store.record(&f.ws, "turn 1").unwrap();
    assert!(t1.changed);
    assert_eq!(t1.files, 50 - 1 - 10 + 1 + 1);
    // Each checkpoint is whole: back to t0, then to t1, byte for byte.
    f.store.restore(&f.ws, &t0.id).unwrap();
    for i in 0..50 {
        assert_eq!(
            read(&f.ws, &format!("d{}/f{i}", i % 5)),
            format!("v0 {i}").as_bytes(),
            "f{i}"
        );
    }
    assert!(!f.ws.join("new").exists());
    f.store.restore(&f.ws, &t1.id).unwrap();
    assert_eq!(read(&f.ws, "d0/f0"), b"v1 0");
    assert_eq!(read(&f.ws, "d2"), b"now a file");
    assert!(!f.ws.join("d1/f1").exists());
    assert_eq!(read(&f.ws, "d3/f3"), b"v0 3");
}

/// A turn that changed nothing costs no commit and no git process: the
/// cache vouches for every file, or (a file rewritten with the same bytes,
/// or one read again while its times were too fresh) its content hashes to
/// what the parent holds. Without the cache the files are sent whole, and
/// a commit with the same tree is not added to the chain.
#[test]
fn a_turn_that_changed_nothing_adds_nothing() {
    let f = fixture();
    let repo = f._tmp.path().join("session.checkpoints");
    let packs = || {
        std::fs::read_dir(repo.join("objects/pack"))
            .map(|d| d.count())
            .unwrap_or(0)
    };
    for i in 0..20 {
        write(
            &f.ws,
            &format!("d{}/f{i}", i % 4),
            format!("v {i}").as_bytes(),
        );
    }
    let t0 = f.store.record(&f.ws, "turn 0").unwrap();
    assert!(t0.changed);
    let before = packs();

    // Fresh files are read again, and found the same.
    let again = f.store.record(&f.ws, "turn 1").unwrap();
    assert_eq!((again.changed, again.id.as_str()), (false, t0.id.as_str()));
    // A file rewritten with the same bytes.
    write(&f.ws, "d1/f1", b"v 1");
    let again = f.store.record(&f.ws, "turn 2").unwrap();
    assert_eq!((again.changed, again.id.as_str()), (false, t0.id.as_str()));
    assert_eq!(packs(), before, "git wrote objects for an unchanged turn");

    // Without the cache: everything is sent, and the chain stays.
    std::fs::remove_file(repo.join("cordon-stat-cache.json")).unwrap();
    let again = f.store.record(&f.ws, "turn 3").unwrap();
    assert_eq!((again.changed, again.id.as_str()), (false, t0.id.as_str()));
    assert_eq!(f.store.latest().as_deref(), Some(t0.id.as_str()));

    // And a real change after all that is one.
    write(&f.ws, "d1/f1", b"v 1 changed");
    let t1 = f.store.record(&f.ws, "turn 4").unwrap();
    assert!(t1.changed);
    assert_ne!(t1.id, t0.id);
    assert_eq!(f.store.latest().as_deref(), Some(t1.id.as_str()));
    f.store.restore(&f.ws, &t0.id).unwrap();
    assert_eq!(read(&f.ws, "d1/f1"), b"v 1");
}
