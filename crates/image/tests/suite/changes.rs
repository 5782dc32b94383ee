//! A sandbox's upper directory written as a layer, as an attacker would
//! leave it: links aimed at host files, whiteouts, opaque directories,
//! hard links, names no terminal should see, and files owned by ids the
//! sandbox could not have given. Each is read back through the store's
//! own unpack.

use std::ffi::OsStr;
use std::fs;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{MetadataExt, symlink};
use std::path::Path;

use cordon_image::changes::{ChangesError, write_changes};
use cordon_image::{Limits, Owners, unpack};
use rustix::fs::{FileType, Mode};

fn as_root(u: u32, g: u32) -> Option<(u32, u32)> {
    Some((u, g))
}

/// The layer of `upper`, unpacked into a fresh directory.
fn round_trip(
    upper: &Path,
    skip: &dyn Fn(&[u8], FileType) -> bool,
) -> (tempfile::TempDir, Vec<u8>) {
    let mut tar = Vec::new();
    write_changes(upper, &as_root, skip, &mut tar).expect("written");
    let out = tempfile::tempdir().unwrap();
    unpack(&tar[..], out.path(), Limits::default(), Owners::Keep).expect("unpacked");
    (out, tar)
}

fn entries(tar: &[u8]) -> Vec<String> {
    tar::Archive::new(tar)
        .entries()
        .unwrap()
        .map(|e| String::from_utf8_lossy(&e.unwrap().path_bytes()).into_owned())
        .collect()
}

#[test]
fn links_stay_links_and_no_host_file_is_read() {
    let upper = tempfile::tempdir().unwrap();
    let secret = tempfile::NamedTempFile::new().unwrap();
    fs::write(secret.path(), "host-secret-canary").unwrap();
    symlink(secret.path(), upper.path().join("to-secret")).unwrap();
    fs::create_dir(upper.path().join("dir")).unwrap();
    symlink("/etc", upper.path().join("dir/etc")).unwrap();
    let (out, tar) = round_trip(upper.path(), &|_, _| false);
    assert!(!String::from_utf8_lossy(&tar).contains("host-secret-canary"));
    assert_eq!(
        fs::read_link(out.path().join("to-secret")).unwrap(),
        secret.path()
    );
    assert_eq!(
        fs::read_link(out.path().join("dir/etc")).unwrap(),
        Path::new("/etc")
    );
}

#[test]
fn whiteouts_opaque_directories_and_hard_links() {
    let upper = tempfile::tempdir().unwrap();
    rustix::fs::mknodat(
        rustix::fs::CWD,
        upper.path().join("deleted").as_path(),
        FileType::CharacterDevice,
        Mode::empty(),
        0,
    )
    .unwrap();
    fs::create_dir(upper.path().join("replaced")).unwrap();
    rustix::fs::setxattr(
        upper.path().join("replaced").as_path(),
        "user.overlay.opaque",
        b"y",
        rustix::fs::XattrFlags::empty(),
    )
    .unwrap();
    fs::write(upper.path().join("replaced/new"), "new").unwrap();
    fs::write(upper.path().join("a"), "shared").unwrap();
    fs::hard_link(upper.path().join("a"), upper.path().join("b")).unwrap();
    let (out, tar) = round_trip(upper.path(), &|_, _| false);
    let names = entries(&tar);
    assert!(names.contains(&".wh.deleted".to_string()), "{names:?}");
    assert!(
        names.iter().any(|n| n.ends_with("replaced/.wh..wh..opq")),
        "{names:?}"
    );
    let dev = fs::symlink_metadata(out.path().join("deleted")).unwrap();
    assert_eq!(dev.rdev(), 0);
    let mut v = [0u8; 1];
    rustix::fs::getxattr(
        out.path().join("replaced").as_path(),
        "user.overlay.opaque",
        &mut v,
    )
    .unwrap();
    assert_eq!(&v, b"y");
    let (a, b) = (
        fs::metadata(out.path().join("a")).unwrap(),
        fs::metadata(out.path().join("b")).unwrap(),
    );
    assert_eq!(a.ino(), b.ino(), "the hard link became two files");
}

#[test]
fn hostile_names_and_skipped_paths() {
    let upper = tempfile::tempdir().unwrap();
    let odd = OsStr::from_bytes(b"esc\x1b[31mape\nline");
    fs::write(upper.path().join(odd), "x").unwrap();
    fs::create_dir_all(upper.path().join("etc")).unwrap();
    fs::write(upper.path().join("etc/hosts"), "cordon's").unwrap();
    fs::write(upper.path().join("etc/app.conf"), "the step's").unwrap();
    let long = "d".repeat(200);
    fs::create_dir_all(upper.path().join(&long)).unwrap();
    fs::write(upper.path().join(&long).join("f".repeat(200)), "deep").unwrap();
    let skip = |p: &[u8], _| p == b"etc/hosts";
    let (out, _) = round_trip(upper.path(), &skip);
    assert!(out.path().join(odd).exists());
    assert!(!out.path().join("etc/hosts").exists());
    assert!(out.path().join("etc/app.conf").exists());
    assert_eq!(
        fs::read_to_string(out.path().join(&long).join("f".repeat(200))).unwrap(),
        "deep"
    );
}

#[test]
fn a_file_of_an_id_the_sandbox_could_not_give_stops_the_write() {
    let upper = tempfile::tempdir().unwrap();
    fs::write(upper.path().join("f"), "x").unwrap();
    let none = |_: u32, _: u32| None;
    let err = write_changes(upper.path(), &none, &|_, _| false, &mut Vec::new()).unwrap_err();
    assert!(matches!(err, ChangesError::Owner { .. }), "{err}");
}

#[test]
fn owners_are_translated_to_the_images() {
    if !rustix::process::geteuid().is_root() {
        eprintln!("notice: skipping: chown needs root");
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "CI=true: this fails rather than skips"
        );
        return;
    }
    let upper = tempfile::tempdir().unwrap();
    let f = upper.path().join("f");
    fs::write(&f, "x").unwrap();
    std::os::unix::fs::chown(&f, Some(100_042), Some(100_042)).unwrap();
    let shift = |u: u32, g: u32| Some((u.checked_sub(100_000)?, g.checked_sub(100_000)?));
    let mut tar = Vec::new();
    write_changes(upper.path(), &shift, &|_, _| false, &mut tar).unwrap();
    let mut archive = tar::Archive::new(&tar[..]);
    let e = archive.entries().unwrap().next().unwrap().unwrap();
    assert_eq!(
        (e.header().uid().unwrap(), e.header().gid().unwrap()),
        (42, 42)
    );
}
