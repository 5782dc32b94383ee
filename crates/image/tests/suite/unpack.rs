//! Layers as an attacker writes them: each hostile entry is refused or
//! neutralised, and nothing lands outside the layer's directory.

use std::io::Write;
use std::os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt};
use std::path::Path;

use cordon_image::{Digest, Limits, Owners, UnpackError, unpack};

/// A tar written entry by entry, names and all as given: no tool's
/// checks stand between the attack and the unpacker.
#[derive(Default)]
struct Tar(Vec<u8>);

impl Tar {
    fn entry(
        mut self,
        name: &[u8],
        kind: tar::EntryType,
        data: &[u8],
        link: &[u8],
        mode: u32,
    ) -> Tar {
        let mut h = tar::Header::new_gnu();
        {
            let gnu = h.as_gnu_mut().unwrap();
            gnu.name[..name.len()].copy_from_slice(name);
            gnu.linkname[..link.len()].copy_from_slice(link);
        }
        h.set_entry_type(kind);
        h.set_size(data.len() as u64);
        h.set_mode(mode);
        h.set_uid(0);
        h.set_gid(0);
        h.set_mtime(1_700_000_000);
        h.set_cksum();
        self.0.extend_from_slice(h.as_bytes());
        self.0.extend_from_slice(data);
        let pad = (512 - data.len() % 512) % 512;
        self.0.extend(std::iter::repeat_n(0, pad));
        self
    }
    fn file(self, name: &str, data: &str) -> Tar {
        self.entry(
            name.as_bytes(),
            tar::EntryType::Regular,
            data.as_bytes(),
            b"",
            0o644,
        )
    }
    fn dir(self, name: &str, mode: u32) -> Tar {
        self.entry(name.as_bytes(), tar::EntryType::Directory, b"", b"", mode)
    }
    fn symlink(self, name: &str, target: &str) -> Tar {
        self.entry(
            name.as_bytes(),
            tar::EntryType::Symlink,
            b"",
            target.as_bytes(),
            0o777,
        )
    }
    fn hardlink(self, name: &str, target: &str) -> Tar {
        self.entry(
            name.as_bytes(),
            tar::EntryType::Link,
            b"",
            target.as_bytes(),
            0o644,
        )
    }
    fn done(mut self) -> Vec<u8> {
        self.0.extend(std::iter::repeat_n(0, 1024));
        self.0
    }
}

/// Unpacks into a fresh `layer/` beside an `outside/` holding one file.
struct Case {
    dir: tempfile::TempDir,
}

impl Case {
    fn new() -> Case {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir(dir.path().join("layer")).unwrap();
        std::fs::create_dir(dir.path().join("outside")).unwrap();
        std::fs::write(dir.path().join("outside/secret"), "host secret\n").unwrap();
        Case { dir }
    }
    fn layer(&self) -> std::path::PathBuf {
        self.dir.path().join("layer")
    }
    fn outside(&self) -> std::path::PathBuf {
        self.dir.path().join("outside")
    }
    fn unpack(&self, tar: &[u8]) -> Result<cordon_image::Report, UnpackError> {
        unpack(tar, &self.layer(), Limits::default(), Owners::Caller)
    }
    /// The outside directory still holds its one file, as it was.
    fn outside_untouched(&self) {
        let names: Vec<_> = std::fs::read_dir(self.outside())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["secret"]);
        let s = std::fs::symlink_metadata(self.outside().join("secret")).unwrap();
        assert_eq!(s.nlink(), 1, "no hard link to the host file was made");
        assert_eq!(
            std::fs::read_to_string(self.outside().join("secret")).unwrap(),
            "host secret\n"
        );
        assert!(!self.dir.path().join("escape").exists());
    }
}

fn refused(r: Result<cordon_image::Report, UnpackError>, says: &str) {
    match r {
        Err(e @ UnpackError::Refused { .. }) => {
            assert!(e.to_string().contains(says), "{e}")
        }
        other => panic!("expected a refusal saying {says:?}, got {other:?}"),
    }
}

#[test]
fn a_name_with_dot_dot_is_refused() {
    let c = Case::new();
    refused(
        c.unpack(&Tar::default().file("../escape", "x").done()),
        "climbs out",
    );
    refused(
        c.unpack(&Tar::default().file("a/../../escape", "x").done()),
        "climbs out",
    );
    c.outside_untouched();
}

#[test]
fn an_absolute_name_lands_inside_the_layer() {
    let c = Case::new();
    let outside = c.outside().join("planted");
    let tar = Tar::default().file(outside.to_str().unwrap(), "x").done();
    c.unpack(&tar).unwrap();
    assert!(c.layer().join(outside.strip_prefix("/").unwrap()).is_file());
    c.outside_untouched();
}

#[test]
fn a_file_written_through_a_link_the_layer_planted_is_refused() {
    let c = Case::new();
    let tar = Tar::default()
        .symlink("etc", c.outside().to_str().unwrap())
        .file("etc/secret", "overwritten")
        .done();
    refused(c.unpack(&tar), "link or a file");
    // Relative, and one level down.
    let c = Case::new();
    let tar = Tar::default()
        .dir("a", 0o755)
        .symlink("a/up", "../../outside")
        .file("a/up/new", "x")
        .done();
    refused(c.unpack(&tar), "link or a file");
    c.outside_untouched();
    // The link itself is kept, as data.
    assert_eq!(
        std::fs::read_link(c.layer().join("a/up")).unwrap(),
        Path::new("../../outside")
    );
}

#[test]
fn hard_links_reach_only_files_of_the_layer() {
    let c = Case::new();
    let secret = c.outside().join("secret");
    refused(
        c.unpack(
            &Tar::default()
                .hardlink("h", secret.to_str().unwrap())
                .done(),
        ),
        "does not hold",
    );
    refused(
        c.unpack(&Tar::default().hardlink("h", "../outside/secret").done()),
        "climbs out",
    );
    let tar = Tar::default()
        .symlink("l", c.outside().to_str().unwrap())
        .hardlink("h", "l/secret")
        .done();
    refused(c.unpack(&tar), "does not hold");
    c.outside_untouched();

    let c = Case::new();
    let tar = Tar::default()
        .file("bin/real", "#!/bin/sh\n")
        .hardlink("bin/alias", "bin/real")
        .done();
    c.unpack(&tar).unwrap();
    let (a, b) = (
        std::fs::metadata(c.layer().join("bin/real")).unwrap(),
        std::fs::metadata(c.layer().join("bin/alias")).unwrap(),
    );
    assert_eq!((a.ino(), a.nlink()), (b.ino(), 2));
}

#[test]
fn devices_setid_bits_and_xattrs_are_neutralised() {
    let c = Case::new();
    let tar = Tar::default()
        .entry(b"dev/sda", tar::EntryType::Block, b"", b"", 0o660)
        .entry(b"dev/mem", tar::EntryType::Char, b"", b"", 0o660)
        .entry(b"usr/bin/su", tar::EntryType::Regular, b"elf", b"", 0o4755)
        .entry(
            b"usr/bin/wall",
            tar::EntryType::Regular,
            b"elf",
            b"",
            0o2755,
        )
        .entry(b"tmp", tar::EntryType::Directory, b"", b"", 0o1777)
        .entry(b"run/fifo", tar::EntryType::Fifo, b"", b"", 0o600)
        .done();
    let r = c.unpack(&tar).unwrap();
    assert_eq!((r.devices_skipped, r.setid_dropped), (2, 2));
    assert!(!c.layer().join("dev/sda").exists() && !c.layer().join("dev/mem").exists());
    let mode = |p: &str| {
        std::fs::symlink_metadata(c.layer().join(p))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("usr/bin/su"), 0o755);
    assert_eq!(mode("usr/bin/wall"), 0o755);
    assert_eq!(mode("tmp"), 0o1777, "the sticky bit stays");
    assert!(
        std::fs::symlink_metadata(c.layer().join("run/fifo"))
            .unwrap()
            .file_type()
            .is_fifo()
    );
}

#[test]
fn whiteouts_become_overlayfs_markers_and_aim_nowhere_else() {
    let c = Case::new();
    let tar = Tar::default()
        .dir("etc", 0o755)
        .file("etc/.wh.motd", "")
        .dir("var/cache", 0o755)
        .file("var/cache/.wh..wh..opq", "")
        .done();
    c.unpack(&tar).unwrap();
    let wh = std::fs::symlink_metadata(c.layer().join("etc/motd")).unwrap();
    assert!(wh.file_type().is_char_device() && wh.rdev() == 0, "{wh:?}");
    let attr = rustix::fs::getxattr(
        c.layer().join("var/cache"),
        "user.overlay.opaque",
        &mut [0u8; 4][..],
    )
    .unwrap();
    assert_eq!(attr, 1);
    for bad in ["etc/.wh..", "etc/.wh."] {
        let c = Case::new();
        refused(c.unpack(&Tar::default().file(bad, "").done()), "no name");
    }
    let c = Case::new();
    let tar = Tar::default()
        .symlink("etc", c.outside().to_str().unwrap())
        .file("etc/.wh.secret", "")
        .done();
    refused(c.unpack(&tar), "link or a file");
    c.outside_untouched();
}

#[test]
fn sizes_that_lie_and_bombs_stop_the_unpack() {
    // A header that claims more than the archive holds.
    let c = Case::new();
    let mut tar = Tar::default().file("big", &"x".repeat(4096)).done();
    tar.truncate(512 + 1000);
    assert!(matches!(c.unpack(&tar), Err(UnpackError::Read(_))));

    // 64 MiB of zeros in a gzip of some 64 KiB, with 8 MiB allowed.
    let c = Case::new();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
    let mut h = tar::Header::new_gnu();
    h.set_path("bomb").unwrap();
    h.set_size(64 << 20);
    h.set_mode(0o644);
    h.set_cksum();
    gz.write_all(h.as_bytes()).unwrap();
    let zeros = vec![0u8; 1 << 20];
    for _ in 0..64 {
        gz.write_all(&zeros).unwrap();
    }
    let bomb = gz.finish().unwrap();
    assert!(bomb.len() < 1 << 20, "{}", bomb.len());
    let limits = Limits {
        max_bytes: 8 << 20,
        ..Limits::default()
    };
    let started = std::time::Instant::now();
    let r = unpack(&bomb[..], &c.layer(), limits, Owners::Caller);
    assert!(matches!(r, Err(UnpackError::TooBig(_))), "{r:?}");
    assert!(started.elapsed() < std::time::Duration::from_secs(5));

    // Ten thousand entries where a hundred are allowed.
    let c = Case::new();
    let mut t = Tar::default();
    for i in 0..10_000 {
        t = t.file(&format!("f{i}"), "");
    }
    let limits = Limits {
        max_entries: 100,
        ..Limits::default()
    };
    let r = unpack(&t.done()[..], &c.layer(), limits, Owners::Caller);
    assert!(matches!(r, Err(UnpackError::TooBig(_))), "{r:?}");
}

#[test]
fn zstd_layers_of_several_frames_unpack() {
    let c = Case::new();
    let tar = Tar::default().file("a", "hello").file("b", "world").done();
    // Two frames with a skippable frame between, as zstd:chunked has.
    let (one, two) = tar.split_at(1024);
    let mut z = Vec::new();
    ruzstd::encoding::compress(one, &mut z, ruzstd::encoding::CompressionLevel::Fastest);
    z.extend([0x50, 0x2a, 0x4d, 0x18, 3, 0, 0, 0, 1, 2, 3]);
    ruzstd::encoding::compress(two, &mut z, ruzstd::encoding::CompressionLevel::Fastest);
    let r = c.unpack(&z).unwrap();
    assert_eq!(r.diff_id, Some(Digest::of(&tar)));
    assert_eq!(
        std::fs::read_to_string(c.layer().join("b")).unwrap(),
        "world"
    );
}

#[test]
fn a_pax_global_header_is_no_file() {
    let c = Case::new();
    let tar = Tar::default()
        .entry(
            b"pax_global_header",
            tar::EntryType::XGlobalHeader,
            b"52 comment=0123456789abcdef0123456789abcdef01234567\n",
            b"",
            0o666,
        )
        .file("a", "x")
        .done();
    c.unpack(&tar).unwrap();
    assert!(!c.layer().join("pax_global_header").exists());
    assert!(c.layer().join("a").is_file());
}

#[test]
fn the_diff_id_is_the_digest_of_the_uncompressed_tar() {
    let c = Case::new();
    let tar = Tar::default().file("a", "hello").done();
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    gz.write_all(&tar).unwrap();
    let r = unpack(
        &gz.finish().unwrap()[..],
        &c.layer(),
        Limits::default(),
        Owners::Caller,
    )
    .unwrap();
    assert_eq!(r.diff_id, Some(Digest::of(&tar)));
    assert_eq!(
        std::fs::read_to_string(c.layer().join("a")).unwrap(),
        "hello"
    );
}

#[test]
fn later_entries_replace_earlier_ones_and_read_only_directories_fill() {
    let c = Case::new();
    let tar = Tar::default()
        .dir("ro", 0o555)
        .file("ro/inside", "ok")
        .file("x", "first")
        .dir("x", 0o755)
        .file("x/in", "")
        .dir("y", 0o755)
        .file("y/deep", "")
        .file("y", "now a file")
        .done();
    c.unpack(&tar).unwrap();
    let l = c.layer();
    assert_eq!(std::fs::read_to_string(l.join("ro/inside")).unwrap(), "ok");
    assert_eq!(
        std::fs::metadata(l.join("ro"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o555
    );
    assert!(l.join("x/in").is_file());
    assert_eq!(std::fs::read_to_string(l.join("y")).unwrap(), "now a file");
}

/// As root, the entries' owners are kept, up to what a sandbox maps.
#[test]
fn owners_are_kept_as_root_up_to_what_a_sandbox_maps() {
    if !rustix::process::geteuid().is_root() {
        assert!(std::env::var_os("CI").is_none(), "CI runs this as root");
        return;
    }
    let owned = |uid: u64| {
        let mut h = tar::Header::new_gnu();
        h.set_path("f").unwrap();
        h.set_size(0);
        h.set_mode(0o644);
        h.set_uid(uid);
        h.set_gid(uid);
        h.set_cksum();
        let mut v = h.as_bytes().to_vec();
        v.extend(std::iter::repeat_n(0, 1024));
        v
    };
    let c = Case::new();
    unpack(
        &owned(1234)[..],
        &c.layer(),
        Limits::default(),
        Owners::Keep,
    )
    .unwrap();
    let m = std::fs::metadata(c.layer().join("f")).unwrap();
    assert_eq!((m.uid(), m.gid()), (1234, 1234));
    let c = Case::new();
    let r = unpack(
        &owned(70_000)[..],
        &c.layer(),
        Limits::default(),
        Owners::Keep,
    );
    refused(r, "past the 65535");
}
