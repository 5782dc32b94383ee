//! Fixtures the image tests share: a strict newc reader, fake kernel
//! modules and a fake modules tree.

use std::fs;
use std::path::Path;
use std::process::Command;

use super::modules::module_name;
use super::tools::run_with_input;

/// One entry read back from a newc archive.
#[derive(Debug)]
pub(super) struct Entry {
    pub(super) name: String,
    pub(super) ino: u32,
    pub(super) mode: u32,
    pub(super) nlink: u32,
    pub(super) rdev: (u32, u32),
    pub(super) data: Vec<u8>,
}

/// A strict newc reader: checks the magic, the padding (zeros, to 4
/// bytes) and that the trailer ends the archive.
pub(super) fn parse_newc(buf: &[u8]) -> Vec<Entry> {
    let mut entries = Vec::new();
    let mut at = 0;
    let padding = |at: usize| {
        let end = at.next_multiple_of(4);
        assert!(
            buf[at..end].iter().all(|&b| b == 0),
            "padding at {at} is not zero"
        );
        end
    };
    loop {
        let header = std::str::from_utf8(&buf[at..at + 110]).expect("ASCII header");
        assert_eq!(&header[..6], "070701", "magic at {at}");
        let field = |i: usize| u32::from_str_radix(&header[6 + 8 * i..14 + 8 * i], 16).unwrap();
        let (size, name_size) = (field(6) as usize, field(11) as usize);
        assert_eq!(field(12), 0, "check field");
        let name_start = at + 110;
        let name = &buf[name_start..name_start + name_size];
        assert_eq!(name.last(), Some(&0), "name is NUL-terminated");
        let name = String::from_utf8(name[..name_size - 1].to_vec()).unwrap();
        let data_start = padding(name_start + name_size);
        let data = buf[data_start..data_start + size].to_vec();
        at = padding(data_start + size);
        if name == "TRAILER!!!" {
            assert_eq!(at, buf.len(), "nothing after the trailer");
            return entries;
        }
        entries.push(Entry {
            name,
            ino: field(0),
            mode: field(1),
            nlink: field(4),
            rdev: (field(9), field(10)),
            data,
        });
    }
}

pub(super) fn find_entry<'a>(entries: &'a [Entry], name: &str) -> &'a Entry {
    entries
        .iter()
        .find(|e| e.name == name)
        .unwrap_or_else(|| panic!("{name} is not in the archive"))
}

/// A minimal ELF64 file whose only contents are a section name table
/// and a `.modinfo` section holding `info`.
pub(super) fn fake_ko(info: &[(&str, &str)]) -> Vec<u8> {
    let names = b"\0.shstrtab\0.modinfo\0";
    let mut modinfo = Vec::new();
    for (k, v) in info {
        modinfo.extend_from_slice(format!("{k}={v}\0").as_bytes());
    }
    let names_at = 64;
    let modinfo_at = names_at + names.len();
    let shoff = (modinfo_at + modinfo.len()).next_multiple_of(8);
    let mut elf = vec![0u8; shoff + 3 * 64];
    elf[..6].copy_from_slice(b"\x7fELF\x02\x01");
    elf[0x28..0x30].copy_from_slice(&(shoff as u64).to_le_bytes());
    elf[0x3a..0x3c].copy_from_slice(&64u16.to_le_bytes());
    elf[0x3c..0x3e].copy_from_slice(&3u16.to_le_bytes());
    elf[0x3e..0x40].copy_from_slice(&1u16.to_le_bytes());
    elf[names_at..modinfo_at].copy_from_slice(names);
    elf[modinfo_at..modinfo_at + modinfo.len()].copy_from_slice(&modinfo);
    // Section 0 is the null section; 1 the names; 2 .modinfo.
    for (i, (name, offset, size)) in [
        (1u32, names_at, names.len()),
        (11, modinfo_at, modinfo.len()),
    ]
    .into_iter()
    .enumerate()
    {
        let base = shoff + (i + 1) * 64;
        elf[base..base + 4].copy_from_slice(&name.to_le_bytes());
        elf[base + 24..base + 32].copy_from_slice(&(offset as u64).to_le_bytes());
        elf[base + 32..base + 40].copy_from_slice(&(size as u64).to_le_bytes());
    }
    elf
}

pub(super) fn compress(tool: &str, args: &[&str], data: &[u8]) -> Vec<u8> {
    let out = run_with_input(Command::new(tool).args(args), data).expect(tool);
    assert!(out.status.success(), "{tool} failed");
    out.stdout
}

pub(super) const VERSION: &str = "6.1.0-99-test";

/// A modules tree as an extracted package has it (no modules.dep):
/// virtio_ring <- virtio <- virtio_mmio; 9p needs 9pnet and netfs;
/// virtio-rng (a '-' in its file name) is xz-compressed; crc32c is
/// built in.
pub(super) fn fake_modules(dir: &Path) {
    let ko = |rel: &str, depends: &str| {
        let path = dir.join(rel);
        fs::create_dir_all(path.parent().unwrap()).unwrap();
        let name = module_name(rel).unwrap();
        let data = fake_ko(&[
            ("name", &name),
            ("depends", depends),
            ("vermagic", &format!("{VERSION} SMP mod_unload")),
        ]);
        let data = if rel.ends_with(".xz") {
            compress("xz", &["-c", "--check=crc32"], &data)
        } else if rel.ends_with(".gz") {
            compress("gzip", &["-c"], &data)
        } else {
            data
        };
        fs::write(path, data).unwrap();
    };
    ko("kernel/drivers/virtio/virtio_ring.ko", "");
    ko("kernel/drivers/virtio/virtio.ko", "virtio_ring");
    ko("kernel/drivers/virtio/virtio_mmio.ko", "virtio,virtio_ring");
    ko(
        "kernel/drivers/char/virtio_console.ko",
        "virtio,virtio_ring",
    );
    ko(
        "kernel/drivers/char/hw_random/virtio-rng.ko.xz",
        "virtio_ring,virtio",
    );
    ko("kernel/fs/netfs/netfs.ko.gz", "");
    ko("kernel/net/9p/9pnet.ko", "");
    ko("kernel/net/9p/9pnet_virtio.ko", "9pnet,virtio,virtio_ring");
    ko("kernel/fs/9p/9p.ko", "9pnet,netfs,crc32c");
    fs::write(
        dir.join("modules.builtin"),
        "kernel/crypto/crc32c_generic.ko\nkernel/crypto/crc32c.ko\n",
    )
    .unwrap();
}
