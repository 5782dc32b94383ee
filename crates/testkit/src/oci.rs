//! OCI image layouts made in a test, as `skopeo` or `umoci` would write
//! them, from files given by name and content: the input of the image
//! store's tests and of `cordon image` end to end.

use std::io::Write;
use std::path::Path;

use serde_json::json;
use sha2::{Digest as _, Sha256};

/// `sha256:HEX` of `bytes`.
pub fn digest(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// A gzip-compressed layer and the digest of its uncompressed tar.
#[derive(Debug, Clone)]
pub struct Layer {
    pub blob: Vec<u8>,
    pub diff_id: String,
}

/// A layer of `(name, content)` files.
pub fn layer(files: &[(&str, &str)]) -> Layer {
    let mut b = tar::Builder::new(Vec::new());
    for (name, content) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(content.len() as u64);
        h.set_mode(0o644);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        b.append_data(&mut h, name, content.as_bytes()).unwrap();
    }
    let tar = b.into_inner().unwrap();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    Layer {
        blob: gz.finish().unwrap(),
        diff_id: digest(&tar),
    }
}

/// Two layers: an `/etc`, then a whiteout of its `motd` and an app in
/// `/srv`.
pub fn two_layers() -> Vec<Layer> {
    vec![
        layer(&[("etc/os-release", "ID=test\n"), ("etc/motd", "hello\n")]),
        layer(&[("etc/.wh.motd", ""), ("srv/app.py", "print('hi')\n")]),
    ]
}

/// Writes an OCI layout at `dir` of one image tagged `tag` with
/// `layers` (its config: `Env`, `WorkingDir` `/srv`, `User` `app`);
/// returns the manifest's digest.
pub fn write_layout(dir: &Path, tag: &str, layers: &[Layer]) -> String {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = digest(bytes);
        std::fs::write(blobs.join(&d["sha256:".len()..]), bytes).unwrap();
        (d, bytes.len())
    };
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": {"Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"], "WorkingDir": "/srv", "User": "app"},
        "rootfs": {"type": "layers", "diff_ids": layers.iter().map(|l| l.diff_id.clone()).collect::<Vec<_>>()},
    }))
    .unwrap();
    let (cd, cn) = put(&config);
    let layer_descs: Vec<_> = layers
        .iter()
        .map(|l| {
            let (d, n) = put(&l.blob);
            json!({"mediaType": "application/vnd.oci.image.layer.v1.tar+gzip", "digest": d, "size": n})
        })
        .collect();
    let manifest = serde_json::to_vec(&json!({
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": {"mediaType": "application/vnd.oci.image.config.v1+json", "digest": cd, "size": cn},
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
                "digest": md, "size": mn,
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }],
        }))
        .unwrap(),
    )
    .unwrap();
    md
}
