//! Importing OCI layouts: what a tool wrote imports whole, and what an
//! attacker wrote leaves nothing behind that a later run would use.

use std::io::Write;
use std::path::Path;

use cordon_image::Digest;
use cordon_image::store::{Store, StoreError};
use serde_json::json;

/// A layer tar from `(name, content)` files, gzip-compressed; and its
/// uncompressed digest.
pub fn layer(files: &[(&str, &str)]) -> (Vec<u8>, Digest) {
    let mut b = tar::Builder::new(Vec::new());
    for (name, content) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        b.append_data(&mut h, name, content.as_bytes()).unwrap();
    }
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    (gz.finish().unwrap(), Digest::of(&tar))
}

/// Writes an OCI layout of one image (tagged `tag`) with `layers`, the
/// way skopeo or umoci would; returns the manifest's digest.
pub fn write_layout(dir: &Path, tag: &str, layers: &[(Vec<u8>, Digest)]) -> Digest {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = Digest::of(bytes);
        std::fs::write(blobs.join(d.hex()), bytes).unwrap();
        (d, bytes.len())
    };
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"], "WorkingDir": "/srv", "User": "app"},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.1.to_string()).collect::<Vec<_>>()},
    }))
    .unwrap();
    let (cd, cn) = put(&config);
    let layer_descs: Vec<_> = layers
        .iter()
        .map(|(bytes, _)| {
            let (d, n) = put(bytes);
            json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d.to_string(), "size": n})
        })
        .collect();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd.to_string(), "size": cn},
        "layers": layer_descs,
    }))
    .unwrap();
    let (md, mn) = put(&manifest);
    std::fs::write(dir.join("oci-layout"), r#"{"imageLayoutVersion":"1.0.0"}"#).unwrap();
    std::fs::write(
        dir.join("index.json"),
        serde_json::to_vec(&json!({
            "schemaVersion": 2,
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": md.to_string(), "size": mn,
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }],
        }))
        .unwrap(),
    )
    .unwrap();
    md
}

pub fn two_layers() -> Vec<(Vec<u8>, Digest)> {
    vec![
        layer(&[("etc/os-release", "ID=test\n"), ("etc/motd", "hello\n")]),
        layer(&[("etc/.wh.motd", ""), ("srv/app.py", "print('hi')\n")]),
    ]
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
    assert_eq!(image.layers, [layers[0].1, layers[1].1]);
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
        .join(Digest::of(&layers[1].0).hex());
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
    let (bytes, _) = layer(&[("a", "real")]);
    let (_, other) = layer(&[("a", "claimed")]);
    write_layout(src.path(), "v1", &[(bytes, other)]);
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
        .join(Digest::of(&layers[0].0).hex());
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
