use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::symlink;

use super::*;

fn ws(p: &str) -> WsPath {
    WsPath::parse(p).unwrap()
}

/// An archive in a directory, and a workspace a hostile sandbox left.
fn hostile_workspace() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("workspace");
    std::fs::create_dir_all(root.join("src/deep")).unwrap();
    std::fs::write(root.join("README.md"), "hello\n").unwrap();
    std::fs::write(root.join("src/deep/big.bin"), vec![7u8; 70_000]).unwrap();
    std::fs::write(root.join("empty"), "").unwrap();
    std::fs::write(root.join("x".repeat(150)), "a long name").unwrap();
    std::fs::write(
        root.join(std::ffi::OsStr::from_bytes(b"bad\xffname")),
        "bytes",
    )
    .unwrap();
    let suid = root.join("suid");
    std::fs::write(&suid, "#!/bin/sh\n").unwrap();
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    // Links: within, out by climbing, out by an absolute name, a loop.
    symlink("src/deep", root.join("inside")).unwrap();
    symlink("../../../../etc", root.join("climb")).unwrap();
    symlink("/etc/passwd", root.join("absolute")).unwrap();
    symlink("../../..", root.join("src/deep/up")).unwrap();
    symlink("loop-b", root.join("loop-a")).unwrap();
    symlink("loop-a", root.join("loop-b")).unwrap();
    let fifo = std::ffi::CString::new(root.join("fifo").as_os_str().as_bytes()).unwrap();
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    (dir, root)
}

fn archive_in(dir: &Path) -> Archive {
    let url: ArchiveUrl = format!("file://{}", dir.join("store").display())
        .parse()
        .unwrap();
    Archive::open(&url).unwrap()
}

async fn read_all(a: &Archive, id: &str, kind: &Kind) -> Vec<u8> {
    let Kind::File { size, offset } = kind else {
        panic!("not a file: {kind:?}")
    };
    let mut s = a.range(id, *offset..offset + size).await.unwrap();
    let mut out = Vec::new();
    while let Some(b) = s.next().await {
        out.extend_from_slice(&b.unwrap());
    }
    out
}

#[tokio::test]
async fn a_hostile_workspace_is_kept_as_data_and_read_back_within_itself() {
    let (dir, root) = hostile_workspace();
    let log = dir.path().join("session.jsonl");
    std::fs::write(&log, "{\"line\":1}\n").unwrap();
    let a = archive_in(dir.path());
    assert!(a.keep("job_1", &root, Some(&log)).await.unwrap());
    let tree = a.index("job_1").await.unwrap();
    assert!(tree.complete);

    let found = tree.resolve(&ws("README.md")).unwrap();
    assert_eq!(read_all(&a, "job_1", found.kind).await, b"hello\n");
    let big = tree.resolve(&ws("/workspace/inside/big.bin")).unwrap();
    assert_eq!(
        big.path, "src/deep/big.bin",
        "followed within the workspace"
    );
    assert_eq!(read_all(&a, "job_1", big.kind).await, vec![7u8; 70_000]);
    let long = tree.resolve(&ws(&"x".repeat(150))).unwrap();
    assert_eq!(read_all(&a, "job_1", long.kind).await, b"a long name");
    assert_eq!(
        read_all(&a, "job_1", tree.resolve(&ws("empty")).unwrap().kind).await,
        b""
    );

    // Links that lead out are refused, not followed; a loop is a loop.
    for (p, why) in [
        ("climb/passwd", "Escapes"),
        ("absolute", "Escapes"),
        ("loop-a", "Loop"),
        ("inside/up/etc", "Escapes"),
        ("README.md/x", "NotDirectory"),
        ("fifo", "NotFound"),
        ("nothing", "NotFound"),
    ] {
        let e = tree.resolve(&ws(p)).unwrap_err();
        assert!(format!("{e:?}").starts_with(why), "{p}: {e:?}");
    }
    // They are kept as links, with their targets as text.
    assert_eq!(
        tree.resolve(&ws("src")).unwrap().kind,
        &Kind::Directory,
        "a directory"
    );
    let names: Vec<_> = tree.children("").map(|(n, _)| n.to_string()).collect();
    assert!(names.contains(&"climb".to_string()), "{names:?}");
    assert!(names.contains(&"bad\u{fffd}name".to_string()), "{names:?}");
    assert!(!names.contains(&"fifo".to_string()), "{names:?}");
    let deep: Vec<_> = tree.children("src/deep").collect();
    assert_eq!(deep.len(), 2, "{deep:?}");

    // The tar is a tar: links as links, no set-id bit, no owner, the
    // non-UTF-8 name as its bytes.
    let tar_path = dir.path().join("store/jobs/job_1/workspace.tar");
    let mut tar = tar::Archive::new(std::fs::File::open(&tar_path).unwrap());
    let mut seen = 0;
    for e in tar.entries().unwrap() {
        let e = e.unwrap();
        let h = e.header();
        assert_eq!(h.mode().unwrap() & 0o7000, 0);
        assert_eq!(h.uid().unwrap(), 0);
        let path = e.path().unwrap().into_owned();
        if path == Path::new("climb") {
            assert_eq!(h.entry_type(), tar::EntryType::Symlink);
            assert_eq!(
                e.link_name().unwrap().unwrap(),
                Path::new("../../../../etc")
            );
        }
        if path.as_os_str().as_bytes() == b"bad\xffname" {
            seen += 1;
        }
    }
    assert_eq!(seen, 1);
    let kept_log = std::fs::read(dir.path().join("store/jobs/job_1/session.jsonl")).unwrap();
    assert_eq!(kept_log, b"{\"line\":1}\n");

    a.forget("job_1").await.unwrap();
    assert!(a.index("job_1").await.is_err());
    assert!(!tar_path.exists());
    a.forget("job_1").await.unwrap();
}

#[tokio::test]
async fn one_job_is_archived_once_at_a_time_and_a_missing_one_fails_cleanly() {
    let dir = tempfile::tempdir().unwrap();
    let a = archive_in(dir.path());
    let held = Busy::take(&a.busy, "job_2").unwrap();
    assert!(!a.keep("job_2", dir.path(), None).await.unwrap());
    drop(held);
    let e = a
        .keep("job_2", &dir.path().join("none"), None)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("job_2"), "{e}");
    assert!(a.index("job_2").await.is_err(), "nothing half-written");
}

#[test]
fn archive_urls_are_a_bucket_or_a_directory_and_never_hold_credentials() {
    for ok in [
        "s3://bucket",
        "s3://bucket/some/prefix/",
        "file:///srv/cordon",
    ] {
        assert!(ok.parse::<ArchiveUrl>().is_ok(), "{ok}");
    }
    for (bad, says) in [
        ("s3://key:secret@bucket", "credentials"),
        ("s3:///prefix", "bucket"),
        ("file:///", "directory"),
        ("file://host/dir", "directory"),
        ("http://bucket", "s3://"),
        ("s3://bucket?region=x", "query"),
        ("bucket", "not a URL"),
    ] {
        let e = bad.parse::<ArchiveUrl>().unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
        assert!(!e.contains("secret"), "{e}");
    }
}
