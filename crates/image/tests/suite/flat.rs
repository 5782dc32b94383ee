//! Flat roots for microVMs: an image's layers merged as overlayfs reads
//! them, made once, kept while a guest holds them, pruned with the image.
//! What is in the file is read back with e2fsprogs' `debugfs`, which
//! mounts nothing.

use std::path::Path;
use std::process::Command;

use cordon_image::flat::flat_root;
use cordon_image::root::SandboxRoot;
use cordon_image::store::Store;
use cordon_testkit::oci::{Entry, Layer, gzipped, layer_of};

use super::store::write_layout;

/// A layer with a file owned by 1000:1000, a hard link to it and a
/// symbolic link out of the image.
fn owned_layer() -> Layer {
    let mut b = tar::Builder::new(Vec::new());
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Directory);
    h.set_mode(0o755);
    h.set_size(0);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    b.append_data(&mut h, "home/app", &[][..]).unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_mode(0o600);
    h.set_uid(1000);
    h.set_gid(1000);
    h.set_size(6);
    h.set_mtime(1_700_000_000);
    h.set_cksum();
    b.append_data(&mut h, "home/app/notes", &b"notes\n"[..])
        .unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Link);
    h.set_mode(0o600);
    h.set_size(0);
    h.set_mtime(1_700_000_000);
    b.append_link(&mut h, "home/app/same", "home/app/notes")
        .unwrap();
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(tar::EntryType::Symlink);
    h.set_mode(0o777);
    h.set_size(0);
    h.set_mtime(1_700_000_000);
    b.append_link(&mut h, "shadow", "/etc/shadow").unwrap();
    gzipped(b.into_inner().unwrap())
}

/// Three layers: a base with `/etc` and a directory `d`; a whiteout of a
/// file of the base and an opaque `d` with one new file; owned files and
/// links.
fn layers() -> Vec<Layer> {
    vec![
        layer_of(&[
            Entry::Dir {
                path: "etc",
                mode: 0o755,
            },
            Entry::File {
                path: "etc/os-release",
                body: b"ID=flat\n".to_vec(),
                mode: 0o644,
            },
            Entry::File {
                path: "etc/motd",
                body: b"hello\n".to_vec(),
                mode: 0o644,
            },
            Entry::Dir {
                path: "d",
                mode: 0o755,
            },
            Entry::File {
                path: "d/old",
                body: b"old\n".to_vec(),
                mode: 0o644,
            },
        ]),
        layer_of(&[
            Entry::File {
                path: "etc/.wh.motd",
                body: Vec::new(),
                mode: 0o644,
            },
            Entry::Dir {
                path: "d",
                mode: 0o755,
            },
            Entry::File {
                path: "d/.wh..wh..opq",
                body: Vec::new(),
                mode: 0o644,
            },
            Entry::File {
                path: "d/new",
                body: b"new\n".to_vec(),
                mode: 0o644,
            },
        ]),
        owned_layer(),
    ]
}

/// A store with [`layers`] imported as `flat:v1`, and its sandbox root
/// (as root inside); the directories go when the first part is dropped.
fn imported() -> ([tempfile::TempDir; 2], Store, SandboxRoot) {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    write_layout(src.path(), "v1", &layers());
    let store = Store::open(root.path()).unwrap();
    let image = store.import_layout(src.path(), None, "flat:v1").unwrap();
    let sr = store.sandbox_root(&image, Some("0")).unwrap();
    ([src, root], store, sr)
}

fn debugfs(file: &Path, request: &str) -> String {
    let out = Command::new("debugfs")
        .args(["-R", request])
        .arg(file)
        .env("PATH", "/usr/sbin:/sbin:/usr/bin:/bin")
        .output()
        .expect("debugfs (e2fsprogs) runs");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The names in a directory of the file system.
fn names(file: &Path, dir: &str) -> Vec<String> {
    let mut v: Vec<String> = debugfs(file, &format!("ls -p {dir}"))
        .lines()
        .filter_map(|l| l.split('/').nth(5).map(str::to_string))
        .filter(|n| !n.is_empty() && n != "." && n != "..")
        .collect();
    v.sort();
    v
}

/// A field of `debugfs stat`, such as `User:` or `Inode:`.
fn field(stat: &str, name: &str) -> String {
    let at = stat
        .find(name)
        .unwrap_or_else(|| panic!("no {name} in {stat}"));
    stat[at + name.len()..]
        .split_whitespace()
        .next()
        .unwrap()
        .to_string()
}

#[test]
fn layers_merge_as_overlayfs_reads_them_and_owners_and_links_stay() {
    let (_dirs, _store, sr) = imported();
    let flat = flat_root(&sr.flat, &sr.layers).unwrap();
    let file = flat.path();

    assert_eq!(debugfs(file, "cat /image/etc/os-release"), "ID=flat\n");
    assert_eq!(
        names(file, "/image/etc"),
        ["os-release"],
        "the whiteout hides motd"
    );
    assert_eq!(
        names(file, "/image/d"),
        ["new"],
        "the opaque directory hides the base's"
    );
    let shadow = debugfs(file, "stat /image/shadow");
    assert!(shadow.contains("Type: symlink"), "{shadow}");
    assert!(shadow.contains("\"/etc/shadow\""), "{shadow}");
    let notes = debugfs(file, "stat /image/home/app/notes");
    let same = debugfs(file, "stat /image/home/app/same");
    assert_eq!(field(&notes, "Inode:"), field(&same, "Inode:"), "one inode");
    if rustix::process::geteuid().is_root() {
        // Root's store keeps the image's owners; anyone else's are theirs,
        // root inside.
        assert_eq!(field(&notes, "User:"), "1000", "{notes}");
        assert_eq!(field(&notes, "Group:"), "1000", "{notes}");
    }
    // The image's tree, and nothing of mke2fs's in it.
    assert_eq!(names(file, "/"), ["image", "lost+found"]);
    assert_eq!(names(file, "/image"), ["d", "etc", "home", "shadow"]);
    // No marker of the store's own reaches the guest.
    assert!(!debugfs(file, "ea_list /image/d").contains("overlay"));
}

#[test]
fn a_flat_root_is_made_once_and_pruned_only_when_unused() {
    let (_dirs, store, sr) = imported();

    // Two at once: one makes it, the other waits and finds it.
    let (a, b) = std::thread::scope(|s| {
        let a = s.spawn(|| flat_root(&sr.flat, &sr.layers).unwrap());
        let b = s.spawn(|| flat_root(&sr.flat, &sr.layers).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(a.path(), b.path());
    let made = std::fs::metadata(a.path()).unwrap().modified().unwrap();
    drop((a, b));
    let again = flat_root(&sr.flat, &sr.layers).unwrap();
    assert_eq!(
        std::fs::metadata(again.path()).unwrap().modified().unwrap(),
        made
    );

    // The image's: kept by a prune.
    store.prune().unwrap();
    assert!(again.path().exists());
    // No image's, but a guest runs on it: kept.
    assert!(store.remove("flat:v1").unwrap());
    store.prune().unwrap();
    assert!(again.path().exists());
    // Unused: gone, with nothing else left in the directory. A process
    // another test forks holds every lock of this one's for a moment (a
    // child has its parent's descriptors until it execs), and a prune
    // then keeps what looks in use: the next one removes it.
    let path = again.path().to_path_buf();
    drop(again);
    for _ in 0..100 {
        store.prune().unwrap();
        if !path.exists() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert!(!path.exists());
    assert_eq!(std::fs::read_dir(&sr.flat).unwrap().count(), 0);
}

/// The tests above again as the user nobody (uid 65534), whose store
/// holds only its own files: the flat root is then made in a user
/// namespace of the maker's own, mapping it to root.
#[test]
fn an_unprivileged_user_makes_flat_roots_too() {
    use std::os::unix::process::CommandExt;
    if !rustix::process::geteuid().is_root() {
        // Already unprivileged: the tests above ran as such.
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "suite::flat::layers_merge_as_overlayfs_reads_them_and_owners_and_links_stay",
            "suite::flat::a_flat_root_is_made_once_and_pruned_only_when_unused",
        ])
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .current_dir("/")
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && stdout.contains("2 passed"),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
