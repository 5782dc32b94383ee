//! New layers written through the store's writer: the blob is a gzip file
//! of exactly the tar written, named by its digest; the tree is the tar
//! unpacked by the rules for any layer; a refused tar leaves nothing.

use std::io::{Read, Write};
use std::path::Path;

use cordon_image::Digest;
use cordon_image::store::Store;
use cordon_testkit::oci::Entry;

/// A tar of `files` (name, content), as a build step's would be.
fn tar_of(files: &[(&str, Vec<u8>)]) -> Vec<u8> {
    let entries: Vec<Entry<'_>> = files
        .iter()
        .map(|(path, body)| Entry::File {
            path,
            body: body.clone(),
            mode: 0o644,
        })
        .collect();
    cordon_testkit::oci::tar_of(&entries)
}

/// Bytes that compress a little, like a program's: a few MiB, so that the
/// tar spans many chunks and every thread has some.
fn program_like(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed | 1;
    (0..len)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if i % 3 == 0 {
                (x & 0xff) as u8
            } else {
                b'a' + (i % 7) as u8
            }
        })
        .collect()
}

fn tmp_is_empty(root: &Path) {
    let left: Vec<_> = std::fs::read_dir(root.join("tmp"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert!(left.is_empty(), "left in tmp/: {left:?}");
}

#[test]
fn a_written_layer_is_its_tar_gzipped_and_unpacked() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let big = program_like(5 << 20, 7);
    let tar = tar_of(&[
        ("etc/hostname", b"built\n".to_vec()),
        ("opt/big.bin", big.clone()),
    ]);
    let mut w = store.layer_writer().unwrap();
    // Odd-sized writes, as a tar builder makes them.
    for piece in tar.chunks(12_345) {
        w.write_all(piece).unwrap();
    }
    let layer = w.finish().unwrap();

    assert_eq!(layer.diff_id, Digest::of(&tar));
    assert_eq!(
        layer.media_type,
        "application/vnd.oci.image.layer.v1.tar+gzip"
    );
    let blob = std::fs::read(root.path().join("blobs/sha256").join(layer.digest.hex())).unwrap();
    assert_eq!(Digest::of(&blob), layer.digest);
    assert_eq!(blob.len() as u64, layer.size);
    assert!(blob.len() < tar.len(), "the blob is compressed");
    // Any gzip reader that reads a file's members reads the tar back.
    let mut back = Vec::new();
    flate2::read::MultiGzDecoder::new(&blob[..])
        .read_to_end(&mut back)
        .unwrap();
    assert!(back == tar, "the blob holds the tar written, in order");

    let dir = store.layer_dir(&layer.diff_id);
    assert_eq!(std::fs::read(dir.join("etc/hostname")).unwrap(), b"built\n");
    assert!(std::fs::read(dir.join("opt/big.bin")).unwrap() == big);
    tmp_is_empty(root.path());

    // The same tar again is the same blob: a layer's digest does not
    // depend on which thread compressed which chunk.
    let mut again = store.layer_writer().unwrap();
    again.write_all(&tar).unwrap();
    assert_eq!(again.finish().unwrap(), layer);
    tmp_is_empty(root.path());
}

#[test]
fn an_empty_layer_is_a_gzip_file_too() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let tar = tar_of(&[]);
    let mut w = store.layer_writer().unwrap();
    w.write_all(&tar).unwrap();
    let layer = w.finish().unwrap();
    let blob = std::fs::read(root.path().join("blobs/sha256").join(layer.digest.hex())).unwrap();
    let mut back = Vec::new();
    flate2::read::GzDecoder::new(&blob[..])
        .read_to_end(&mut back)
        .unwrap();
    assert_eq!(back, tar);
    assert!(store.layer_dir(&layer.diff_id).is_dir());
}

#[test]
fn a_tar_the_unpack_refuses_is_not_stored_and_says_why() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    // A name that climbs out, written by hand as a hostile tar would be,
    // after enough content to be past the first chunks.
    let mut tar = tar_of(&[("opt/filler", program_like(3 << 20, 3))]);
    tar.truncate(tar.len() - 1024);
    let mut h = tar::Header::new_old();
    h.as_old_mut().name[..9].copy_from_slice(b"../escape");
    h.set_size(0);
    h.set_mode(0o644);
    h.set_entry_type(tar::EntryType::Regular);
    h.set_cksum();
    tar.extend_from_slice(h.as_bytes());
    tar.extend_from_slice(&[0; 1024]);

    let mut w = store.layer_writer().unwrap();
    let written = w.write_all(&tar);
    let err = match written {
        Err(e) => e.to_string(),
        Ok(()) => w.finish().unwrap_err().to_string(),
    };
    assert!(err.contains("escape"), "{err}");
    assert!(!root.path().parent().unwrap().join("escape").exists());
    assert_eq!(
        std::fs::read_dir(root.path().join("layers"))
            .unwrap()
            .count(),
        0,
        "no layer is kept"
    );
    let blobs = std::fs::read_dir(root.path().join("blobs/sha256"))
        .unwrap()
        .count();
    assert_eq!(blobs, 0, "no blob is kept");
    tmp_is_empty(root.path());
}

#[test]
fn a_writer_dropped_unfinished_leaves_nothing() {
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let tar = tar_of(&[("opt/big.bin", program_like(3 << 20, 5))]);
    let mut w = store.layer_writer().unwrap();
    w.write_all(&tar[..tar.len() / 2]).unwrap();
    drop(w);
    // Its threads end when their queues close; give them a moment.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while std::fs::read_dir(root.path().join("tmp")).unwrap().count() > 0 {
        assert!(std::time::Instant::now() < deadline, "tmp/ was not cleared");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    assert_eq!(
        std::fs::read_dir(root.path().join("layers"))
            .unwrap()
            .count(),
        0
    );
}
