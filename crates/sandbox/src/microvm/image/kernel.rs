//! Finding the guest kernel, in the cache or at an explicit path, and
//! turning a bzImage (vmlinuz) into the ELF vmlinux QEMU boots, cached.

use std::fs;
use std::hash::Hash;
use std::io::Write;
use std::path::{Path, PathBuf};

use super::bytes::{ELF_MAGIC, find, u16_at, u32_at};
use super::cache::{MARKER, current_version, file_stamp, hash_hex, lock, write_atomic};
use super::tools::{Compression, decompress};
use super::{At, ImageError};

/// A guest kernel ready to boot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kernel {
    /// The release, as `uname -r` will say in the guest: `6.1.0-56-amd64`.
    pub version: String,
    /// The uncompressed ELF kernel, which QEMU boots through its PVH entry
    /// (much faster under TCG than letting a bzImage decompress itself).
    pub vmlinux: PathBuf,
    /// The modules tree: `.../lib/modules/<version>`.
    pub modules: PathBuf,
}

/// The kernel prepared in `cache` by [`setup`](super::setup), or from an
/// explicit path: `kernel` may be a vmlinuz (an x86 bzImage, whatever its
/// compression) or an ELF vmlinux. `modules` defaults to `lib/modules/<version>` next to the
/// kernel's `boot` directory, then to the host's `/lib/modules/<version>`.
/// A vmlinuz is uncompressed once and cached, keyed by the source file's
/// identity, size and times.
pub fn find_kernel(
    cache: &Path,
    kernel: Option<&Path>,
    modules: Option<&Path>,
) -> Result<Kernel, ImageError> {
    find_kernel_with(cache, kernel, modules, &mut |_| {})
}

pub(super) fn find_kernel_with(
    cache: &Path,
    kernel: Option<&Path>,
    modules: Option<&Path>,
    progress: &mut dyn FnMut(&str),
) -> Result<Kernel, ImageError> {
    let (vmlinux, version, candidates) = match kernel {
        None => {
            let no_kernel = || ImageError::NoKernel {
                cache: cache.to_owned(),
            };
            let current = current_version(cache)?.ok_or_else(no_kernel)?;
            let root = cache.join(&current);
            let src = root.join("boot").join(format!("vmlinuz-{current}"));
            if !root.join(MARKER).is_file() || !src.is_file() {
                return Err(no_kernel());
            }
            let (vmlinux, version) = prepare_vmlinux(&src, &root, progress)?;
            (vmlinux, version, modules_candidates(&root, &current))
        }
        Some(path) => {
            let src = fs::canonicalize(path).at(path)?;
            let dir = cache.join("kernels").join(hash_hex(|h| src.hash(h)));
            let (vmlinux, version) = prepare_vmlinux(&src, &dir, progress)?;
            // A kernel at ROOT/boot/vmlinuz-V has its modules at
            // ROOT/lib/modules/V: an extracted package or the host itself.
            let mut candidates: Vec<PathBuf> = Vec::new();
            let roots = [path, src.as_path()]
                .into_iter()
                .filter_map(|p| p.parent()?.parent())
                .chain([Path::new("/")]);
            for candidate in roots.flat_map(|root| modules_candidates(root, &version)) {
                if !candidates.contains(&candidate) {
                    candidates.push(candidate);
                }
            }
            (vmlinux, version, candidates)
        }
    };
    let modules = match modules {
        Some(m) if m.is_dir() => m.to_owned(),
        Some(m) => {
            return Err(ImageError::NoModules {
                version,
                looked: m.display().to_string(),
            });
        }
        None => candidates
            .iter()
            .find(|c| c.is_dir())
            .cloned()
            .ok_or_else(|| ImageError::NoModules {
                version: version.clone(),
                looked: candidates
                    .iter()
                    .map(|c| c.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", "),
            })?,
    };
    Ok(Kernel {
        version,
        vmlinux,
        modules,
    })
}

/// Where a root holds the modules of `version`: Debian moves them from
/// /lib to /usr/lib with the /usr merge.
pub(super) fn modules_candidates(root: &Path, version: &str) -> Vec<PathBuf> {
    ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| root.join(m).join(version))
        .collect()
}

/// Makes `dir/vmlinux` from the kernel image `src`, unless `dir/vmlinux.key`
/// says it was made from this very file. An ELF `src` is used in place.
/// Returns the vmlinux and the kernel's version.
fn prepare_vmlinux(
    src: &Path,
    dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(PathBuf, String), ImageError> {
    let stamp = file_stamp(&fs::metadata(src).at(src)?);
    let key_path = dir.join("vmlinux.key");
    let extracted = dir.join("vmlinux");
    let cached = || -> Option<(PathBuf, String)> {
        let text = fs::read_to_string(&key_path).ok()?;
        let mut lines = text.lines();
        if lines.next()? != stamp {
            return None;
        }
        let version = lines.next()?.to_owned();
        match lines.next()? {
            "elf" => Some((src.to_owned(), version)),
            "extracted" if extracted.is_file() => Some((extracted.clone(), version)),
            _ => None,
        }
    };
    if let Some(hit) = cached() {
        return Ok(hit);
    }
    fs::create_dir_all(dir).at(dir)?;
    let _lock = lock(&dir.join("lock"))?;
    if let Some(hit) = cached() {
        return Ok(hit);
    }

    let data = fs::read(src).at(src)?;
    let bad = |message: String| ImageError::BadKernel {
        path: src.to_owned(),
        message,
    };
    let (vmlinux, version, kind) = if data.starts_with(ELF_MAGIC) {
        let version = banner_version(&data)
            .ok_or_else(|| bad("no \"Linux version\" banner in this ELF file".into()))?;
        (src.to_owned(), version, "elf")
    } else {
        progress("uncompressing the kernel");
        let bz = BzImage::parse(&data).map_err(bad)?;
        let elf = bz.uncompress().map_err(|e| match e {
            UncompressError::Tool(e) => e,
            UncompressError::Bad(m) => bad(m),
        })?;
        let version = bz
            .version
            .or_else(|| banner_version(&elf))
            .ok_or_else(|| bad("cannot tell the kernel's version".into()))?;
        write_atomic(&extracted, |f| f.write_all(&elf))?;
        (extracted, version, "extracted")
    };
    if version.contains(['/', '\n']) || version.is_empty() {
        return Err(bad(format!("odd kernel version {version:?}")));
    }
    write_atomic(&key_path, |f| writeln!(f, "{stamp}\n{version}\n{kind}"))?;
    Ok((vmlinux, version))
}

/// The release from the kernel's `Linux version 6.1.0-56-amd64 (...` banner.
fn banner_version(elf: &[u8]) -> Option<String> {
    const NEEDLE: &[u8] = b"Linux version ";
    let mut from = 0;
    while let Some(i) = find(&elf[from..], NEEDLE) {
        let start = from + i + NEEDLE.len();
        let rest = &elf[start..elf.len().min(start + 256)];
        let end = rest.iter().position(|&b| b == b' ' || b == 0)?;
        // The banner's release is followed by " (builder@host)"; format
        // strings and other mentions are not.
        if rest[..end].first().is_some_and(u8::is_ascii_digit) && rest[end..].starts_with(b" (") {
            return std::str::from_utf8(&rest[..end]).ok().map(str::to_owned);
        }
        from = start;
    }
    None
}

/// An x86 bzImage, read through its boot protocol header
/// (Documentation/arch/x86/boot.rst).
struct BzImage<'a> {
    version: Option<String>,
    payload: &'a [u8],
}

enum UncompressError {
    Tool(ImageError),
    Bad(String),
}

impl<'a> BzImage<'a> {
    fn parse(data: &'a [u8]) -> Result<BzImage<'a>, String> {
        if data.get(0x202..0x206) != Some(b"HdrS") {
            return Err("neither an ELF vmlinux nor an x86 bzImage".into());
        }
        let protocol = u16_at(data, 0x206).unwrap_or(0);
        // 2.08 (Linux 2.6.26) added the payload's offset and length.
        if protocol < 0x208 {
            return Err(format!(
                "boot protocol {}.{:02} is too old (2.08 or later is needed)",
                protocol >> 8,
                protocol & 0xff
            ));
        }
        let setup_sects = match data[0x1f1] {
            0 => 4,
            n => usize::from(n),
        };
        let header = |at| u32_at(data, at).map(|v| v as usize);
        let (Some(offset), Some(length)) = (header(0x248), header(0x24c)) else {
            return Err("truncated boot header".into());
        };
        // The payload offset counts from the protected-mode code, which
        // follows the boot sector and the setup sectors.
        let start = (setup_sects + 1) * 512 + offset;
        let payload = data
            .get(start..start.saturating_add(length))
            .filter(|p| p.len() > 4)
            .ok_or("the compressed kernel lies outside the file")?;
        let version = match u16_at(data, 0x20e) {
            Some(0) | None => None,
            Some(ptr) => data.get(0x200 + usize::from(ptr)..).and_then(|s| {
                let s = &s[..s.iter().position(|&b| b == 0)?];
                let word = std::str::from_utf8(s).ok()?.split_whitespace().next()?;
                Some(word.to_owned())
            }),
        };
        Ok(BzImage { version, payload })
    }

    fn uncompress(&self) -> Result<Vec<u8>, UncompressError> {
        let format = Compression::sniff(self.payload).ok_or_else(|| {
            UncompressError::Bad(format!(
                "unknown compression of the kernel (payload starts with {:02x?})",
                &self.payload[..4]
            ))
        })?;
        // The kernel build appends the uncompressed size (le32) to every
        // payload; gzip's own trailer happens to end with the same number.
        let (body, size) = self.payload.split_at(self.payload.len() - 4);
        let expected = u32::from_le_bytes(size.try_into().expect("4 bytes")) as usize;
        let input = if format == Compression::Gzip {
            self.payload
        } else {
            body
        };
        let elf =
            decompress(format, input, "uncompress the kernel").map_err(UncompressError::Tool)?;
        if !elf.starts_with(ELF_MAGIC) {
            return Err(UncompressError::Bad(
                "the compressed kernel is not an ELF file".into(),
            ));
        }
        if elf.len() != expected {
            return Err(UncompressError::Bad(format!(
                "uncompressed to {} bytes instead of {expected}",
                elf.len()
            )));
        }
        Ok(elf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::testutil::{VERSION, compress, fake_modules};
    use std::fs::File;
    use std::os::unix::fs::MetadataExt;
    use std::process::Command;
    use std::time::{Duration, SystemTime};

    /// A bzImage as far as the boot header goes: one setup sector, then the
    /// payload, `payload` compressed with `tool`.
    fn fake_bzimage(payload: &[u8], append_size: Option<usize>, version: &str) -> Vec<u8> {
        let mut img = vec![0u8; 1024];
        img[0x1f1] = 1;
        img[0x202..0x206].copy_from_slice(b"HdrS");
        img[0x206..0x208].copy_from_slice(&0x020fu16.to_le_bytes());
        // The version string sits in the setup sector.
        let text = format!("{version} (someone@somewhere) #1 SMP\0");
        img[0x300..0x300 + text.len()].copy_from_slice(text.as_bytes());
        img[0x20e..0x210].copy_from_slice(&0x100u16.to_le_bytes());
        let offset = 0x40u32;
        let mut body = payload.to_vec();
        if let Some(size) = append_size {
            body.extend_from_slice(&(size as u32).to_le_bytes());
        }
        img[0x248..0x24c].copy_from_slice(&offset.to_le_bytes());
        img[0x24c..0x250].copy_from_slice(&(body.len() as u32).to_le_bytes());
        img.resize(1024 + offset as usize, 0xcc);
        img.extend_from_slice(&body);
        // Whatever follows the payload in a real image.
        img.extend_from_slice(&[0xee; 100]);
        img
    }

    fn fake_vmlinux(version: &str) -> Vec<u8> {
        let mut elf = b"\x7fELF\x02\x01\x01".to_vec();
        elf.resize(4096, 0x90);
        elf.extend_from_slice(
            format!("Linux version %s\0Linux version {version} (builder@host) (gcc) #1\0")
                .as_bytes(),
        );
        elf.resize(9000, 0);
        elf
    }

    #[test]
    fn kernels_are_uncompressed_once_and_found_with_their_modules() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path().join("root");
        fake_modules(&root.join("lib/modules").join(VERSION));
        fs::create_dir_all(root.join("boot")).unwrap();
        let cache = tmp.path().join("cache");
        let elf = fake_vmlinux(VERSION);

        let formats = [
            ("gzip", &["-c", "-9"][..], None),
            ("xz", &["-c", "--check=crc32"][..], Some(elf.len())),
            // Optional tools: checked where installed.
            ("zstd", &["-c", "-q"][..], Some(elf.len())),
            ("lz4", &["-l", "-c"][..], Some(elf.len())),
        ];
        for (i, (tool, args, size)) in formats.into_iter().enumerate() {
            if i >= 2 && Command::new(tool).arg("--version").output().is_err() {
                eprintln!("{tool} is not installed: not tested");
                continue;
            }
            let vmlinuz = root.join("boot").join(format!("vmlinuz-{VERSION}"));
            fs::write(
                &vmlinuz,
                fake_bzimage(&compress(tool, args, &elf), size, VERSION),
            )
            .unwrap();
            // A fresh mtime, as a new kernel would have.
            let mtime = SystemTime::now() + Duration::from_secs(10 * (i as u64 + 1));
            File::options()
                .write(true)
                .open(&vmlinuz)
                .unwrap()
                .set_modified(mtime)
                .unwrap();

            let mut steps = Vec::new();
            let kernel = find_kernel_with(&cache, Some(&vmlinuz), None, &mut |s| {
                steps.push(s.to_owned())
            })
            .unwrap();
            assert_eq!(steps, ["uncompressing the kernel"], "{tool}");
            assert_eq!(kernel.version, VERSION);
            assert_eq!(kernel.modules, root.join("lib/modules").join(VERSION));
            assert_eq!(fs::read(&kernel.vmlinux).unwrap(), elf, "{tool}");
            // The second time, nothing is uncompressed.
            let ino = fs::metadata(&kernel.vmlinux).unwrap().ino();
            let mut steps = Vec::new();
            let again = find_kernel_with(&cache, Some(&vmlinuz), None, &mut |s| {
                steps.push(s.to_owned())
            })
            .unwrap();
            assert!(steps.is_empty());
            assert_eq!(again, kernel);
            assert_eq!(fs::metadata(&again.vmlinux).unwrap().ino(), ino);
        }

        // An ELF kernel is used where it is; its banner gives the version.
        let vmlinux = root.join("boot/vmlinux");
        fs::write(&vmlinux, &elf).unwrap();
        let modules = tmp.path().join("elsewhere");
        fs::create_dir(&modules).unwrap();
        let kernel = find_kernel(&cache, Some(&vmlinux), Some(&modules)).unwrap();
        assert_eq!(kernel.vmlinux, vmlinux.canonicalize().unwrap());
        assert_eq!(
            (kernel.version.as_str(), kernel.modules),
            (VERSION, modules)
        );

        // Wrong files say what is wrong.
        let junk = root.join("boot/junk");
        fs::write(&junk, vec![1u8; 4096]).unwrap();
        let err = find_kernel(&cache, Some(&junk), None).unwrap_err();
        assert!(matches!(err, ImageError::BadKernel { .. }), "{err}");
        let other = fake_vmlinux("6.1.0-1-nomodules");
        fs::write(&vmlinux, other).unwrap();
        // Same size, same inode: only the times tell it changed, and
        // two writes may fall within one tick of the file system's clock.
        let later = SystemTime::now() + Duration::from_secs(30);
        File::options()
            .write(true)
            .open(&vmlinux)
            .unwrap()
            .set_modified(later)
            .unwrap();
        let err = find_kernel(&cache, Some(&vmlinux), None).unwrap_err();
        assert!(matches!(err, ImageError::NoModules { .. }), "{err}");
        assert!(err.to_string().contains("`modules` setting"), "{err}");

        // Nothing set up and no kernel given.
        let err = find_kernel(&tmp.path().join("empty"), None, None).unwrap_err();
        assert!(matches!(err, ImageError::NoKernel { .. }));
        assert!(err.to_string().contains("cordon vm setup"), "{err}");
    }

    #[test]
    fn a_set_up_tree_is_found_through_current() {
        let tmp = tempfile::tempdir().unwrap();
        let cache = tmp.path();
        let tree = cache.join(VERSION);
        fake_modules(&tree.join("lib/modules").join(VERSION));
        fs::create_dir_all(tree.join("boot")).unwrap();
        let elf = fake_vmlinux(VERSION);
        let bz = fake_bzimage(&compress("gzip", &["-c"], &elf), None, VERSION);
        fs::write(tree.join("boot").join(format!("vmlinuz-{VERSION}")), bz).unwrap();
        fs::write(cache.join("current"), format!("{VERSION}\n")).unwrap();
        // Not complete without the marker.
        assert!(matches!(
            find_kernel(cache, None, None),
            Err(ImageError::NoKernel { .. })
        ));
        fs::write(tree.join(MARKER), "linux-image-test 1\n").unwrap();
        let kernel = find_kernel(cache, None, None).unwrap();
        assert_eq!(
            kernel,
            Kernel {
                version: VERSION.into(),
                vmlinux: tree.join("vmlinux"),
                modules: tree.join("lib/modules").join(VERSION),
            }
        );
    }
}
