//! Checkpoints of a workspace, taken and restored as a session would, and
//! against a workspace that fights back.

use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;

use cordon_git::{Checkpoints, Retention, Skip};

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

/// Bytes no compressor or delta can shrink: xorshift, seeded per file.
fn noise(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut out = Vec::with_capacity(len + 8);
    while out.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        out.extend_from_slice(&x.to_le_bytes());
    }
    out.truncate(len);
    out
}

/// The bytes a directory takes on disk: blocks allocated to everything
/// beneath it, links not followed.
fn allocated(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::symlink_metadata(dir).unwrap();
    let mut total = meta.blocks() * 512;
    if meta.is_dir() {
        for e in std::fs::read_dir(dir).unwrap() {
            total += allocated(&e.unwrap().path());
        }
    }
    total
}

const MIB: u64 = 1 << 20;

/// A tenant's turns that each replace ~30 MiB of files, against a 40 MiB
/// budget: the store stays within it after every record (2 MiB allowed
/// for git's own files, the stat cache and the directories' blocks), the
/// newest checkpoint comes back byte for byte under the id recorded
/// before the prune that followed it, and one pruned says so and why.
#[test]
fn turns_that_replace_their_files_keep_the_store_within_its_budget() {
    let tmp = tempfile::tempdir().unwrap();
    let ws = tmp.path().join("ws");
    std::fs::create_dir(&ws).unwrap();
    let dir = tmp.path().join("session.checkpoints");
    let budget = 40 * MIB;
    let slack = 2 * MIB;
    let store = Checkpoints::open(&dir)
        .unwrap()
        .with_retention(Retention::new(100, budget).unwrap());
    let turn_files = |turn: u64| -> Vec<(String, Vec<u8>)> {
        (0..3)
            .map(|i| (format!("data/{i}.bin"), noise(turn * 10 + i, 10 << 20)))
            .collect()
    };
    let mut ids = Vec::new();
    for turn in 0..4u64 {
        let _ = std::fs::remove_dir_all(ws.join("data"));
        for (rel, data) in turn_files(turn) {
            write(&ws, &rel, &data);
        }
        let c = store.record(&ws, &format!("turn {turn}")).unwrap();
        assert!(c.changed);
        ids.push(c.id);
        let size = allocated(&dir);
        assert!(
            size <= budget + slack,
            "after turn {turn} the store takes {} MiB, over its {} MiB budget",
            size / MIB,
            budget / MIB
        );
    }
    // Each turn's 30 MiB fits once, not twice: only the newest is kept,
    // under the id the log has for it.
    let newest = ids.last().unwrap();
    assert_eq!(store.latest().as_ref(), Some(newest));
    std::fs::remove_dir_all(ws.join("data")).unwrap();
    store.restore(&ws, newest).unwrap();
    for (rel, data) in turn_files(3) {
        assert!(read(&ws, &rel) == data, "{rel} differs");
    }
    for old in &ids[..3] {
        let err = store.restore(&ws, old).unwrap_err().to_string();
        assert!(
            err.contains("was pruned") && err.contains("may take 40 MiB on disk"),
            "{err}"
        );
    }
    // An abbreviation, as a person types it, says the same.
    let err = store.restore(&ws, &ids[0][..10]).unwrap_err().to_string();
    assert!(err.contains("was pruned"), "{err}");
    // What was never a checkpoint here is still just unknown.
    let err = store
        .restore(&ws, "0123456789abcdef")
        .unwrap_err()
        .to_string();
    assert!(err.contains("is not a checkpoint"), "{err}");
}

/// Five turns kept two at a time: exactly the last two restore, under the
/// ids recorded for them (one of them before the last prune), and each
/// older one is refused as pruned, saying how many are kept.
#[test]
fn only_the_newest_turns_are_kept() {
    let f = fixture();
    let dir = f._tmp.path().join("kept.checkpoints");
    let store = Checkpoints::open(&dir)
        .unwrap()
        .with_retention(Retention::new(2, 1 << 30).unwrap());
    let mut ids = Vec::new();
    for turn in 0..5 {
        if turn == 3 {
            // The count kept beside the chain lost: git counts again.
            std::fs::remove_file(dir.join("cordon-count")).unwrap();
        }
        write(&f.ws, "notes.txt", format!("turn {turn}").as_bytes());
        write(&f.ws, &format!("t{turn}"), b"x");
        ids.push(store.record(&f.ws, &format!("turn {turn}")).unwrap().id);
    }
    for (turn, id) in ids.iter().enumerate().skip(3) {
        let dir = f._tmp.path().join(format!("fork{turn}"));
        std::fs::create_dir(&dir).unwrap();
        store.materialize(id, &dir).unwrap();
        assert_eq!(read(&dir, "notes.txt"), format!("turn {turn}").as_bytes());
        assert_eq!(read(&dir, "t0"), b"x", "the oldest file of the newest");
    }
    for id in &ids[..3] {
        let err = store.restore(&f.ws, id).unwrap_err().to_string();
        assert!(
            err.contains("was pruned") && err.contains("newest 2 checkpoints"),
            "{err}"
        );
    }
    // A rewind to the older kept one, and back: no turn lost by either.
    store.restore(&f.ws, &ids[3]).unwrap();
    assert_eq!(read(&f.ws, "notes.txt"), b"turn 3");
    assert!(!f.ws.join("t4").exists());
    let back = store.restore(&f.ws, &ids[4]).unwrap();
    assert_eq!(read(&f.ws, "notes.txt"), b"turn 4");
    // That rewind recorded turn 3's files again (its `before`): now the
    // two newest are it and turn 4.
    assert!(back.before.changed);
    let err = store.restore(&f.ws, &ids[3]).unwrap_err().to_string();
    assert!(err.contains("was pruned"), "{err}");
    store.restore(&f.ws, &back.before.id).unwrap();
    assert_eq!(read(&f.ws, "notes.txt"), b"turn 3");
}
