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
    gzipped(b.into_inner().unwrap())
}

/// The layer whose uncompressed tar is `tar`.
pub fn gzipped(tar: Vec<u8>) -> Layer {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    Layer {
        blob: gz.finish().unwrap(),
        diff_id: digest(&tar),
    }
}

/// One entry of a layer made by [`layer_of`].
pub enum Entry<'a> {
    File {
        path: &'a str,
        body: Vec<u8>,
        mode: u32,
    },
    Dir {
        path: &'a str,
        mode: u32,
    },
    Link {
        path: &'a str,
        target: &'a str,
    },
}

/// A layer of `entries`, owned by root.
pub fn layer_of(entries: &[Entry<'_>]) -> Layer {
    gzipped(tar_of(entries))
}

/// The uncompressed tar of [`layer_of`].
pub fn tar_of(entries: &[Entry<'_>]) -> Vec<u8> {
    let mut b = tar::Builder::new(Vec::new());
    for e in entries {
        let mut h = tar::Header::new_gnu();
        h.set_mtime(1_700_000_000);
        h.set_uid(0);
        h.set_gid(0);
        match e {
            Entry::File { path, body, mode } => {
                h.set_size(body.len() as u64);
                h.set_mode(*mode);
                h.set_cksum();
                b.append_data(&mut h, path, &body[..]).unwrap();
            }
            Entry::Dir { path, mode } => {
                h.set_entry_type(tar::EntryType::Directory);
                h.set_size(0);
                h.set_mode(*mode);
                h.set_cksum();
                b.append_data(&mut h, path, &[][..]).unwrap();
            }
            Entry::Link { path, target } => {
                h.set_entry_type(tar::EntryType::Symlink);
                h.set_size(0);
                h.set_mode(0o777);
                b.append_link(&mut h, path, target).unwrap();
            }
        }
    }
    b.into_inner().unwrap()
}

/// Debian's statically linked busybox (package busybox-static).
pub const BUSYBOX: &str = "/bin/busybox";

/// The applets [`busybox_layer`] links in `/bin`.
pub const APPLETS: &[&str] = &[
    "sh", "ls", "cat", "echo", "id", "whoami", "mkdir", "touch", "rm", "chown", "chmod", "stat",
    "env", "pwd", "true", "false", "sleep", "head", "tail", "wc", "grep", "sed", "su", "test",
    "ln", "mv", "cp", "find", "dd", "mknod", "hostname", "ps", "kill", "readlink", "chgrp",
    "unshare", "mount", "chroot", "nsenter", "tar",
];

/// A tiny image's one layer: busybox at `/bin/busybox` with [`APPLETS`]
/// as links to it, an `/etc` with root, nobody and `app` (1000), and the
/// usual empty directories.
pub fn busybox_layer() -> Layer {
    let body = std::fs::read(BUSYBOX).expect("busybox-static is installed (scripts/packages.txt)");
    let links: Vec<String> = APPLETS.iter().map(|a| format!("bin/{a}")).collect();
    let mut entries = vec![
        Entry::Dir { path: "bin", mode: 0o755 },
        Entry::File { path: "bin/busybox", body, mode: 0o755 },
        Entry::Dir { path: "etc", mode: 0o755 },
        Entry::File {
            path: "etc/passwd",
            body: b"root:x:0:0:root:/root:/bin/sh\napp:x:1000:1000:app:/home/app:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n".to_vec(),
            mode: 0o644,
        },
        Entry::File {
            path: "etc/group",
            body: b"root:x:0:\napp:x:1000:\nnogroup:x:65534:\n".to_vec(),
            mode: 0o644,
        },
        Entry::File { path: "etc/os-release", body: b"ID=cordon-busybox\n".to_vec(), mode: 0o644 },
        Entry::Dir { path: "root", mode: 0o700 },
        Entry::Dir { path: "home", mode: 0o755 },
        Entry::Dir { path: "tmp", mode: 0o1777 },
        Entry::Dir { path: "var", mode: 0o755 },
    ];
    for l in &links {
        entries.push(Entry::Link {
            path: l,
            target: "busybox",
        });
    }
    layer_of(&entries)
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
    write_image(
        dir,
        tag,
        layers,
        json!({"Env": ["PATH=/usr/bin:/bin", "LANG=C.UTF-8"], "WorkingDir": "/srv", "User": "app"}),
    )
}

/// Writes an OCI layout at `dir` of one image tagged `tag` with `layers`
/// and the config's `config` section; returns the manifest's digest.
pub fn write_image(dir: &Path, tag: &str, layers: &[Layer], config: serde_json::Value) -> String {
    let blobs = dir.join("blobs/sha256");
    std::fs::create_dir_all(&blobs).unwrap();
    let put = |bytes: &[u8]| {
        let d = digest(bytes);
        std::fs::write(blobs.join(&d["sha256:".len()..]), bytes).unwrap();
        (d, bytes.len())
    };
    let config = serde_json::to_vec(&json!({
        "architecture": "amd64", "os": "linux",
        "config": config,
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
