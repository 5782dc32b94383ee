//! Importing OCI layouts: what a tool wrote imports whole, and what an
//! attacker wrote leaves nothing behind that a later run would use.

use std::path::Path;

use cordon_image::Digest;
use cordon_image::store::{Store, StoreError};

pub use cordon_testkit::oci::{Layer, layer, two_layers};

/// The layout, and its manifest's digest as the store's type.
pub fn write_layout(dir: &Path, tag: &str, layers: &[Layer]) -> Digest {
    Digest::parse(&cordon_testkit::oci::write_layout(dir, tag, layers)).unwrap()
}

/// A layer's diff_id as the store's type.
pub fn diff_id(l: &Layer) -> Digest {
    Digest::parse(&l.diff_id).unwrap()
}

#[test]
fn a_layout_imports_with_its_layers_unpacked_once() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let layers = two_layers();
    let manifest = write_layout(src.path(), "v1", &layers);
    let store = Store::open(root.path()).unwrap();
    let image = store
        .import_layout(src.path(), Some("v1"), "test:v1")
        .unwrap();
    assert_eq!(image.manifest, manifest);
    assert_eq!(image.layers, [diff_id(&layers[0]), diff_id(&layers[1])]);
    assert_eq!(image.working_dir.as_deref(), Some("/srv"));
    assert_eq!(image.user.as_deref(), Some("app"));
    assert!(image.env.contains(&"LANG=C.UTF-8".to_string()));
    let bottom = store.layer_dir(&image.layers[0]);
    assert_eq!(
        std::fs::read_to_string(bottom.join("etc/os-release")).unwrap(),
        "ID=test\n"
    );
    assert_eq!(store.get("test:v1"), Some(image.clone()));
    assert_eq!(store.list(), std::slice::from_ref(&image));
    // The same image under another name shares every layer.
    let again = store.import_layout(src.path(), None, "other").unwrap();
    assert_eq!(again.layers, image.layers);
    assert_eq!(
        std::fs::read_dir(root.path().join("layers"))
            .unwrap()
            .count(),
        2
    );
    assert_eq!(
        std::fs::read_dir(root.path().join("tmp")).unwrap().count(),
        0
    );
}

#[test]
fn a_new_store_is_private_and_an_existing_directory_keeps_its_mode() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let new = dir.path().join("a/b/store");
    Store::open(&new).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&new), 0o700);
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    Store::open(dir.path()).unwrap();
    assert_eq!(
        mode(dir.path()),
        0o755,
        "the user's own directory is left as it was"
    );
}

/// Nothing of a failed import is left for a later run: no record, no
/// layer directory, no work files.
fn nothing_left(root: &Path) {
    for sub in ["images", "layers", "tmp"] {
        let n = std::fs::read_dir(root.join(sub)).unwrap().count();
        assert_eq!(n, 0, "{sub} holds {n} entries");
    }
}

fn invalid(r: Result<cordon_image::store::Image, StoreError>, says: &str) {
    match r {
        Err(e) => assert!(e.to_string().contains(says), "{e}"),
        Ok(i) => panic!("imported {i:?}; expected an error saying {says:?}"),
    }
}

#[test]
fn a_blob_whose_digest_or_size_lies_is_refused() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let layers = two_layers();
    write_layout(src.path(), "v1", &layers);
    // The top layer's bytes changed after the manifest named them.
    let blob = src
        .path()
        .join("blobs/sha256")
        .join(Digest::of(&layers[1].blob).hex());
    let mut bytes = std::fs::read(&blob).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0xff;
    std::fs::write(&blob, &bytes).unwrap();
    let store = Store::open(root.path()).unwrap();
    invalid(store.import_layout(src.path(), None, "x"), "has the digest");
    assert!(store.get("x").is_none());
    // Longer than its descriptor says.
    bytes.extend_from_slice(&[0; 10]);
    std::fs::write(&blob, &bytes).unwrap();
    invalid(store.import_layout(src.path(), None, "x"), "or more bytes");
    assert!(store.get("x").is_none());
    assert_eq!(
        std::fs::read_dir(root.path().join("tmp")).unwrap().count(),
        0
    );
}

#[test]
fn a_layer_that_is_not_what_the_config_names_is_refused() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let real = layer(&[("a", "real")]);
    let claimed = layer(&[("a", "claimed")]);
    write_layout(
        src.path(),
        "v1",
        &[Layer {
            blob: real.blob,
            diff_id: claimed.diff_id,
        }],
    );
    let store = Store::open(root.path()).unwrap();
    invalid(
        store.import_layout(src.path(), None, "x"),
        "not the sha256:",
    );
    nothing_left(root.path());
}

#[test]
fn a_layout_s_links_are_not_followed() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let layers = two_layers();
    write_layout(src.path(), "v1", &layers);
    // index.json swapped for a link to a host file.
    std::fs::rename(src.path().join("index.json"), src.path().join("real-index")).unwrap();
    std::os::unix::fs::symlink("/etc/passwd", src.path().join("index.json")).unwrap();
    let store = Store::open(root.path()).unwrap();
    invalid(store.import_layout(src.path(), None, "x"), "not links");
    // A blob swapped for a link.
    std::fs::remove_file(src.path().join("index.json")).unwrap();
    std::fs::rename(src.path().join("real-index"), src.path().join("index.json")).unwrap();
    let blob = src
        .path()
        .join("blobs/sha256")
        .join(Digest::of(&layers[0].blob).hex());
    let moved = src.path().join("moved");
    std::fs::rename(&blob, &moved).unwrap();
    std::os::unix::fs::symlink(&moved, &blob).unwrap();
    invalid(store.import_layout(src.path(), None, "x"), "not links");
    nothing_left(root.path());
}

#[test]
fn a_config_naming_ten_thousand_layers_is_refused_before_any_is_read() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let one = layer(&[("a", "")]);
    let many: Vec<_> = (0..10_000).map(|_| one.clone()).collect();
    write_layout(src.path(), "v1", &many);
    let store = Store::open(root.path()).unwrap();
    invalid(store.import_layout(src.path(), None, "x"), "at most 128");
    nothing_left(root.path());
}

#[test]
fn a_tag_is_needed_where_a_layout_holds_several_and_must_exist() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    write_layout(src.path(), "v1", &two_layers());
    let store = Store::open(root.path()).unwrap();
    invalid(
        store.import_layout(src.path(), Some("v2"), "x"),
        "no image tagged v2",
    );
    let index = src.path().join("index.json");
    let mut v: serde_json::Value = serde_json::from_slice(&std::fs::read(&index).unwrap()).unwrap();
    let first = v["manifests"][0].clone();
    v["manifests"].as_array_mut().unwrap().push(first);
    std::fs::write(&index, serde_json::to_vec(&v).unwrap()).unwrap();
    invalid(store.import_layout(src.path(), None, "x"), "oci:DIR:TAG");
}

/// What `docker save` writes, made by `skopeo` (the older form: a
/// `manifest.json`, the config, uncompressed layer tars), and the OCI
/// layout newer Dockers put in the tar, both import.
#[test]
fn docker_archives_import_in_both_forms() {
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let layers = two_layers();
    write_layout(src.path(), "v1", &layers);
    let archive = root.path().join("saved.tar");
    let out = std::process::Command::new("skopeo")
        .args(["copy", "--quiet"])
        .arg(format!("oci:{}:v1", src.path().display()))
        .arg(format!(
            "docker-archive:{}:team/tools:v1",
            archive.display()
        ))
        .output()
        .expect("skopeo is missing: scripts/packages.txt installs it");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let store = Store::open(&root.path().join("store")).unwrap();
    let image = store.import_archive(&archive, "saved").unwrap();
    assert_eq!(image.layers, [diff_id(&layers[0]), diff_id(&layers[1])]);
    assert_eq!(image.working_dir.as_deref(), Some("/srv"));
    assert!(
        store
            .layer_dir(&image.layers[1])
            .join("srv/app.py")
            .is_file()
    );

    // The OCI layout in a tar.
    let mut b = tar::Builder::new(Vec::new());
    b.append_dir_all(".", src.path()).unwrap();
    let oci = root.path().join("oci.tar");
    std::fs::write(&oci, b.into_inner().unwrap()).unwrap();
    let image = store.import_archive(&oci, "new-docker").unwrap();
    assert_eq!(image.layers, [diff_id(&layers[0]), diff_id(&layers[1])]);
    assert_eq!(store.list().len(), 2);

    // Forgotten, then pruned: what no image uses goes, the rest stays.
    assert!(store.remove("saved").unwrap());
    assert!(!store.remove("saved").unwrap());
    store.prune().unwrap();
    assert!(store.layer_dir(&image.layers[0]).is_dir(), "still used");
    assert!(store.remove("new-docker").unwrap());
    assert!(store.prune().unwrap() > 0);
    for sub in ["layers", "blobs/sha256", "images"] {
        let n = std::fs::read_dir(root.path().join("store").join(sub))
            .unwrap()
            .count();
        assert_eq!(n, 0, "{sub}");
    }
}

/// Makes `dir` look as old as a dead sandbox's layer: past the time a
/// sandbox takes to lock the directory it made.
fn age(dir: &std::path::Path) {
    let then = std::time::SystemTime::now()
        - cordon_image::store::SANDBOX_SETTLING
        - std::time::Duration::from_secs(1);
    std::fs::File::open(dir)
        .unwrap()
        .set_modified(then)
        .unwrap();
}

#[test]
fn prune_keeps_what_live_sandboxes_run_on_and_removes_what_dead_ones_left() {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let src = tempfile::tempdir().unwrap();
    let root = tempfile::tempdir().unwrap();
    let layers = two_layers();
    write_layout(src.path(), "v1", &layers);
    let store = Store::open(root.path()).unwrap();
    let image = store.import_layout(src.path(), None, "app").unwrap();
    let run = root.path().join("run");
    // A live sandbox (its directory locked) on the image's top layer, and
    // one whose cordon was killed (unlocked), with a file in its layer.
    let live = run.join("sandbox-live");
    std::fs::create_dir_all(live.join("upper")).unwrap();
    std::fs::write(
        live.join("layers"),
        format!("{}\n../../etc\n", image.layers[1].hex()),
    )
    .unwrap();
    // Close-on-exec: a tool another test runs meanwhile must not inherit
    // the lock and hold it past its drop.
    let lock = rustix::fs::open(
        &live,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .unwrap();
    rustix::fs::flock(&lock, FlockOperation::LockExclusive).unwrap();
    let dead = run.join("sandbox-dead");
    std::fs::create_dir_all(dead.join("upper/etc")).unwrap();
    std::fs::write(dead.join("upper/etc/big"), vec![7u8; 1 << 16]).unwrap();
    age(&dead);
    // One made this moment, not yet locked by the sandbox making it.
    let starting = run.join("sandbox-starting");
    std::fs::create_dir_all(&starting).unwrap();
    // One of a microVM saved to disk, whose process ended: unlocked, but
    // another process will take it up.
    let saved = run.join("sandbox-saved");
    std::fs::create_dir_all(&saved).unwrap();
    std::fs::write(saved.join("layers"), format!("{}\n", image.layers[1].hex())).unwrap();
    std::fs::write(saved.join(cordon_image::store::SANDBOX_SAVED), "").unwrap();
    age(&saved);

    assert!(store.remove("app").unwrap());
    assert!(store.prune().unwrap() > 0);
    assert!(!dead.exists(), "a dead sandbox's layer stays");
    assert!(live.exists(), "a live sandbox's layer went");
    assert!(
        starting.exists(),
        "a starting sandbox's layer went before it was locked"
    );
    assert!(saved.exists(), "a saved sandbox's layer went");
    assert!(
        store.layer_dir(&image.layers[1]).is_dir(),
        "a layer in use went"
    );
    assert!(!store.layer_dir(&image.layers[0]).exists());
    drop(lock);
    age(&live);
    store.prune().unwrap();
    assert!(!live.exists());
    assert!(
        store.layer_dir(&image.layers[1]).is_dir(),
        "a layer a saved sandbox runs on went"
    );
    // Taken up and resumed (no longer saved), then its process killed:
    // it goes as any dead sandbox's, and so does its layer.
    std::fs::remove_file(saved.join(cordon_image::store::SANDBOX_SAVED)).unwrap();
    age(&saved);
    store.prune().unwrap();
    assert!(!saved.exists());
    assert!(!store.layer_dir(&image.layers[1]).exists());
}
