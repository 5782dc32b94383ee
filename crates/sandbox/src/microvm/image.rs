//! Guest images for the microVM backend: the kernel, as an uncompressed
//! PVH-bootable `vmlinux`, and the initramfs holding the guest init and the
//! few kernel modules it loads.
//!
//! The kernel comes from the distribution's package ([`setup`], which needs
//! no root: `apt-get download` plus `dpkg-deb -x`) or from explicit paths
//! ([`find_kernel`]). Both are prepared once and cached, so starting a
//! sandbox only stats a few files. Every file in the cache is written under
//! a temporary name and renamed into place, under a lock, so concurrent
//! sandboxes never see a half-written one.

use std::collections::{HashMap, HashSet};
use std::ffi::OsString;
use std::fs::{self, File};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::io::{self, Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, SystemTime};

/// Where guest images are cached: `$CORDON_VM_DIR`, else
/// `/var/cache/cordon/vm` when running as root, else
/// `$XDG_CACHE_HOME/cordon/vm` (`~/.cache/cordon/vm`).
pub fn cache_dir() -> PathBuf {
    cache_dir_from(
        std::env::var_os("CORDON_VM_DIR"),
        rustix::process::geteuid().is_root(),
        std::env::var_os("XDG_CACHE_HOME"),
        std::env::var_os("HOME"),
    )
}

fn cache_dir_from(
    vm_dir: Option<OsString>,
    root: bool,
    xdg: Option<OsString>,
    home: Option<OsString>,
) -> PathBuf {
    if let Some(dir) = vm_dir.filter(|d| !d.is_empty()) {
        return dir.into();
    }
    if root {
        return PathBuf::from("/var/cache/cordon/vm");
    }
    // The XDG spec says to ignore relative paths in these variables.
    let absolute = |v: Option<OsString>| v.map(PathBuf::from).filter(|p| p.is_absolute());
    match absolute(xdg).or_else(|| absolute(home).map(|h| h.join(".cache"))) {
        Some(base) => base.join("cordon/vm"),
        // A service account without a home: per user, and still kept
        // between runs.
        None => {
            std::env::temp_dir().join(format!("cordon-vm-{}", rustix::process::getuid().as_raw()))
        }
    }
}

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

/// Why a guest image cannot be provided.
#[derive(Debug, thiserror::Error)]
pub enum ImageError {
    #[error(
        "no guest kernel in {cache}: run `cordon vm setup`, or set the `kernel` and `modules` settings"
    )]
    NoKernel { cache: PathBuf },
    /// `setup` cannot fetch the kernel on this host.
    #[error(
        "cannot fetch the guest kernel: {reason}. Set the `kernel` and `modules` settings to a kernel image (vmlinuz or vmlinux) and its modules directory instead"
    )]
    Unsupported { reason: String },
    #[error("`{tool}` is needed to {purpose} but was not found: install the {package} package")]
    MissingTool {
        tool: &'static str,
        package: &'static str,
        purpose: &'static str,
    },
    #[error("`{command}` failed: {detail}")]
    Command { command: String, detail: String },
    #[error("{path}: not a usable guest kernel: {message}")]
    BadKernel { path: PathBuf, message: String },
    #[error(
        "no modules for kernel {version} (looked for {looked}): set the `modules` setting to its lib/modules/{version} directory"
    )]
    NoModules { version: String, looked: String },
    #[error("kernel module {name} is not in {dir}, nor built into the kernel")]
    ModuleNotFound { name: String, dir: PathBuf },
    #[error("{path}: not a usable kernel module: {message}")]
    BadModule { path: PathBuf, message: String },
    #[error("invalid initramfs content: {0}")]
    Spec(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
}

/// Attaches the path an I/O error is about.
trait At<T> {
    fn at(self, path: &Path) -> Result<T, ImageError>;
}

impl<T> At<T> for io::Result<T> {
    fn at(self, path: &Path) -> Result<T, ImageError> {
        self.map_err(|source| ImageError::Io {
            path: path.to_owned(),
            source,
        })
    }
}

// ---------------------------------------------------------------------------
// The kernel

/// The kernel prepared in `cache` by [`setup`], or from an explicit path:
/// `kernel` may be a vmlinuz (an x86 bzImage, whatever its compression) or
/// an ELF vmlinux. `modules` defaults to `lib/modules/<version>` next to the
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

fn find_kernel_with(
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
fn modules_candidates(root: &Path, version: &str) -> Vec<PathBuf> {
    ["lib/modules", "usr/lib/modules"]
        .iter()
        .map(|m| root.join(m).join(version))
        .collect()
}

const ELF_MAGIC: &[u8] = b"\x7fELF";

/// Makes `dir/vmlinux` from the kernel image `src`, unless `dir/vmlinux.key`
/// says it was made from this very file. An ELF `src` is used in place.
/// Returns the vmlinux and the kernel's version.
fn prepare_vmlinux(
    src: &Path,
    dir: &Path,
    progress: &mut dyn FnMut(&str),
) -> Result<(PathBuf, String), ImageError> {
    let meta = fs::metadata(src).at(src)?;
    // Identity and ctime too, not only size and mtime: a package upgrade
    // may put a same-sized file with a preserved mtime at the same path.
    let stamp = format!(
        "{} {} {} {}.{:09} {}.{:09}",
        meta.dev(),
        meta.ino(),
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec(),
        meta.ctime(),
        meta.ctime_nsec()
    );
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

fn find(haystack: &[u8], needle: &[u8]) -> Option<usize> {
    let first = *needle.first()?;
    let mut at = 0;
    while let Some(i) = haystack.get(at..)?.iter().position(|&b| b == first) {
        let pos = at + i;
        if haystack.get(pos..pos + needle.len())? == needle {
            return Some(pos);
        }
        at = pos + 1;
    }
    None
}

fn u16_at(data: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(data.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(data: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(data.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(data: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(data.get(at..at + 8)?.try_into().ok()?))
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

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Compression {
    Gzip,
    Xz,
    Lzma,
    Zstd,
    Lz4,
    Bzip2,
    Lzo,
}

impl Compression {
    fn sniff(data: &[u8]) -> Option<Compression> {
        const MAGICS: &[(&[u8], Compression)] = &[
            (b"\x1f\x8b", Compression::Gzip),
            (b"\xfd7zXZ\x00", Compression::Xz),
            (b"\x5d\x00\x00", Compression::Lzma),
            (b"\x28\xb5\x2f\xfd", Compression::Zstd),
            // The kernel uses lz4's legacy frame.
            (b"\x02\x21\x4c\x18", Compression::Lz4),
            (b"BZh", Compression::Bzip2),
            (b"\x89LZO", Compression::Lzo),
        ];
        MAGICS
            .iter()
            .find(|(magic, _)| data.starts_with(magic))
            .map(|&(_, c)| c)
    }

    /// The command that decompresses stdin to stdout, and its package.
    fn tool(self) -> (&'static str, &'static [&'static str], &'static str) {
        match self {
            Compression::Gzip => ("gzip", &["-dc"], "gzip"),
            // Stop at the stream's end, whatever follows it.
            Compression::Xz => ("xz", &["-dc", "--single-stream"], "xz-utils"),
            Compression::Lzma => ("xz", &["-dc", "--format=lzma"], "xz-utils"),
            Compression::Zstd => ("zstd", &["-dcq"], "zstd"),
            Compression::Lz4 => ("lz4", &["-dc"], "lz4"),
            Compression::Bzip2 => ("bzip2", &["-dc"], "bzip2"),
            Compression::Lzo => ("lzop", &["-dc"], "lzop"),
        }
    }
}

/// Decompresses through the format's command-line tool, which every
/// distribution has, rather than a crate per format.
fn decompress(
    format: Compression,
    input: &[u8],
    purpose: &'static str,
) -> Result<Vec<u8>, ImageError> {
    let (tool, args, package) = format.tool();
    let mut command = Command::new(tool);
    command.args(args);
    let output = run_with_input(&mut command, input).map_err(|e| {
        if e.kind() == io::ErrorKind::NotFound {
            ImageError::MissingTool {
                tool,
                package,
                purpose,
            }
        } else {
            ImageError::Command {
                command: tool.into(),
                detail: e.to_string(),
            }
        }
    })?;
    check_output(&format!("{tool} {}", args.join(" ")), output).map(|o| o.stdout)
}

/// Runs `command` with `input` on its stdin, collecting stdout and stderr.
fn run_with_input(command: &mut Command, input: &[u8]) -> io::Result<Output> {
    let mut child = command
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    let mut stdin = child.stdin.take().expect("stdin is piped");
    // Feed stdin from a thread while this one drains stdout, or both
    // sides would block on full pipes.
    std::thread::scope(|s| {
        s.spawn(move || {
            // A tool that exits early closes the pipe (EPIPE); its exit
            // status tells what went wrong.
            let _ = stdin.write_all(input);
        });
        child.wait_with_output()
    })
}

fn check_output(command: &str, output: Output) -> Result<Output, ImageError> {
    if output.status.success() {
        return Ok(output);
    }
    let stderr = String::from_utf8_lossy(&output.stderr);
    let tail: Vec<&str> = stderr.trim().lines().rev().take(5).collect();
    let detail = if tail.is_empty() {
        output.status.to_string()
    } else {
        tail.into_iter().rev().collect::<Vec<_>>().join("; ")
    };
    Err(ImageError::Command {
        command: command.to_owned(),
        detail,
    })
}

// ---------------------------------------------------------------------------
// Setup: the distribution's kernel, fetched without installing it

/// Marks a complete kernel tree in the cache, written last.
const MARKER: &str = ".cordon-kernel";
/// The meta package that always depends on the current kernel ABI package.
const META_PACKAGE: &str = "linux-image-amd64";

/// Fetches the distribution kernel through the package manager without
/// installing it on the host: resolves the ABI package behind
/// `linux-image-amd64`, `apt-get download`s it (no root needed), extracts
/// it into `cache/<version>/`, uncompresses the kernel, and records that
/// version as the current one. What is already there is reused, so running
/// it again is quick. `progress` gets one line per step.
pub fn setup(cache: &Path, progress: &mut dyn FnMut(&str)) -> Result<Kernel, ImageError> {
    if std::env::consts::ARCH != "x86_64" {
        return Err(ImageError::Unsupported {
            reason: "the microVM guest kernel is only fetched for x86-64 hosts".into(),
        });
    }
    fs::create_dir_all(cache).at(cache)?;
    let _lock = lock(&cache.join("setup.lock"))?;
    // Left by an interrupted run; the lock says none is running now.
    remove_matching(cache, |name, _| name.starts_with(".setup-"));

    let meta = apt_show(META_PACKAGE)?;
    let (package, pinned) = abi_package(&meta).ok_or_else(|| ImageError::Unsupported {
        reason: format!("{META_PACKAGE} depends on no linux-image package"),
    })?;
    // The meta package pins the exact version, which saves a second
    // apt-cache run (half a second) when the kernel is already here.
    let mut record = None;
    let pkg_version = match pinned {
        Some(v) => v.to_owned(),
        None => {
            let r = apt_show(package)?;
            let v = field(&r, "Version").ok_or_else(|| ImageError::Unsupported {
                reason: format!("apt-cache shows no version of {package}"),
            })?;
            let v = v.to_owned();
            record = Some(r);
            v
        }
    };
    let stamp = format!("{package} {pkg_version}");
    let guess = package.strip_prefix("linux-image-").unwrap_or(package);

    // A rebuild of the package may keep its name (and the kernel's
    // version): the marker says which build a tree came from.
    let have = fs::read_to_string(cache.join(guess).join(MARKER)).is_ok_and(|m| m.trim() == stamp);
    let version = if have {
        guess.to_owned()
    } else {
        let record = match record {
            Some(r) => r,
            None => apt_show(package)?,
        };
        let size = field(&record, "Size")
            .and_then(|s| s.parse::<u64>().ok())
            .map(|b| format!(", {:.1} MiB", b as f64 / (1024.0 * 1024.0)))
            .unwrap_or_default();
        progress(&format!("downloading {package} ({pkg_version}{size})"));
        fetch(cache, package, &pkg_version, &stamp, progress)?
    };

    write_atomic(&cache.join("current"), |f| writeln!(f, "{version}"))?;
    let kernel = find_kernel_with(cache, None, None, progress)?;
    // Each kernel tree is some 400 MB. Sandboxes already running keep
    // theirs: QEMU holds the vmlinux, and the modules are in the initramfs.
    remove_matching(cache, |name, path| {
        let old = name != version && path.join(MARKER).is_file();
        if old {
            progress(&format!("removing the previous kernel {name}"));
        }
        old
    });
    progress(&format!(
        "ready: Linux {} ({}, modules in {})",
        kernel.version,
        kernel.vmlinux.display(),
        kernel.modules.display()
    ));
    Ok(kernel)
}

/// Downloads and extracts `package` into `cache/<version>`; returns the
/// version found in it.
fn fetch(
    cache: &Path,
    package: &str,
    pkg_version: &str,
    stamp: &str,
    progress: &mut dyn FnMut(&str),
) -> Result<String, ImageError> {
    let work = cache.join(format!(".setup-{}", std::process::id()));
    let download = work.join("download");
    fs::create_dir_all(&download).at(&download)?;
    let result = (|| {
        let mut get = Command::new("apt-get");
        get.args(["download", "-q", &format!("{package}={pkg_version}")])
            .current_dir(&download);
        run_tool(&mut get, "apt-get", "apt")?;
        let deb = fs::read_dir(&download)
            .at(&download)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .find(|p| p.extension().is_some_and(|e| e == "deb"))
            .ok_or_else(|| ImageError::Command {
                command: format!("apt-get download {package}"),
                detail: "no .deb file came out".into(),
            })?;

        progress("extracting");
        let tree = work.join("tree");
        let mut extract = Command::new("dpkg-deb");
        extract.arg("-x").arg(&deb).arg(&tree);
        run_tool(&mut extract, "dpkg-deb", "dpkg")?;
        // The package's own name for its kernel is the authority.
        let boot = tree.join("boot");
        let version = fs::read_dir(&boot)
            .at(&boot)?
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .find_map(|n| n.strip_prefix("vmlinuz-").map(str::to_owned))
            .ok_or_else(|| ImageError::BadKernel {
                path: deb.clone(),
                message: "the package holds no boot/vmlinuz-*".into(),
            })?;
        if !modules_candidates(&tree, &version)
            .iter()
            .any(|m| m.is_dir())
        {
            return Err(ImageError::BadKernel {
                path: deb,
                message: format!("the package holds no lib/modules/{version}"),
            });
        }
        fs::write(tree.join(MARKER), format!("{stamp}\n")).at(&tree.join(MARKER))?;
        let dest = cache.join(&version);
        if dest.exists() {
            // An incomplete copy (no marker) or another build of the
            // package. Sandboxes running on it are unaffected (see
            // `setup`).
            fs::remove_dir_all(&dest).at(&dest)?;
        }
        fs::rename(&tree, &dest).at(&dest)?;
        Ok(version)
    })();
    let _ = fs::remove_dir_all(&work);
    result
}

/// `apt-cache show` of the candidate version of `package`.
fn apt_show(package: &str) -> Result<String, ImageError> {
    let mut show = Command::new("apt-cache");
    show.args(["show", "--no-all-versions", package]);
    match run_tool(&mut show, "apt-cache", "apt") {
        Ok(out) => Ok(String::from_utf8_lossy(&out.stdout).into_owned()),
        Err(ImageError::MissingTool { .. }) => Err(ImageError::Unsupported {
            reason: "apt-cache was not found: `cordon vm setup` fetches Debian's kernel package with apt".into(),
        }),
        Err(ImageError::Command { detail, .. }) => Err(ImageError::Unsupported {
            reason: format!(
                "the package lists have no {package} ({detail}); on Debian, run `apt-get update` as root first"
            ),
        }),
        Err(e) => Err(e),
    }
}

fn run_tool(
    command: &mut Command,
    tool: &'static str,
    package: &'static str,
) -> Result<Output, ImageError> {
    let line = std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(|s| s.to_string_lossy())
        .collect::<Vec<_>>()
        .join(" ");
    let output = command
        .stdin(Stdio::null())
        .output()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => ImageError::MissingTool {
                tool,
                package,
                purpose: "fetch the guest kernel",
            },
            _ => ImageError::Command {
                command: line.clone(),
                detail: e.to_string(),
            },
        })?;
    check_output(&line, output)
}

/// A field of a Debian control record (single-line fields only).
fn field<'a>(record: &'a str, name: &str) -> Option<&'a str> {
    record.lines().find_map(|line| {
        let (key, value) = line.split_once(':')?;
        (key == name).then(|| value.trim())
    })
}

/// The first `linux-image-*` package in a record's Depends, and the
/// version it must have if pinned with `=`: from
/// `linux-image-6.1.0-56-amd64 (= 6.1.192-2)`.
fn abi_package(record: &str) -> Option<(&str, Option<&str>)> {
    field(record, "Depends")?.split([',', '|']).find_map(|dep| {
        let dep = dep.trim();
        let end = dep.find([' ', '(', ':']).unwrap_or(dep.len());
        let name = &dep[..end];
        let pinned = dep[end..]
            .split_once("(=")
            .and_then(|(_, v)| v.split_once(')'))
            .map(|(v, _)| v.trim());
        name.starts_with("linux-image-").then_some((name, pinned))
    })
}

/// The version `setup` made current, if any.
fn current_version(cache: &Path) -> Result<Option<String>, ImageError> {
    let path = cache.join("current");
    match fs::read_to_string(&path) {
        Ok(text) => Ok(Some(text.trim().to_owned()).filter(|v| !v.is_empty() && !v.contains('/'))),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e).at(&path),
    }
}

/// Removes the entries of `dir` that `pred(name, path)` picks, ignoring
/// failures: this only reclaims space.
fn remove_matching(dir: &Path, mut pred: impl FnMut(&str, &Path) -> bool) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        let Some(name) = entry.file_name().to_str().map(str::to_owned) else {
            continue;
        };
        if pred(&name, &path) {
            let _ = match entry.file_type() {
                Ok(t) if t.is_dir() => fs::remove_dir_all(&path),
                _ => fs::remove_file(&path),
            };
        }
    }
}

// ---------------------------------------------------------------------------
// Kernel modules

/// A module's canonical name: the kernel treats '-' and '_' alike.
fn normalise(name: &str) -> String {
    name.replace('-', "_")
}

const MODULE_SUFFIXES: [(&str, Option<Compression>); 4] = [
    (".ko", None),
    (".ko.xz", Some(Compression::Xz)),
    (".ko.zst", Some(Compression::Zstd)),
    (".ko.gz", Some(Compression::Gzip)),
];

/// The module name of a file such as `kernel/drivers/char/hw_random/virtio-rng.ko.xz`.
fn module_name(path: &str) -> Option<String> {
    let file = path.rsplit('/').next()?;
    MODULE_SUFFIXES
        .iter()
        .find_map(|(suffix, _)| file.strip_suffix(suffix))
        .filter(|n| !n.is_empty())
        .map(normalise)
}

/// A module's dependencies, or `None` for one built into the kernel.
type Deps<E> = Result<Option<Vec<String>>, E>;

/// Orders `wanted` and everything they need so that each module comes after
/// its dependencies, each once. Built-in modules are left out.
fn load_order<E>(
    wanted: &[&str],
    mut deps_of: impl FnMut(&str) -> Deps<E>,
) -> Result<Vec<String>, E> {
    fn visit<E>(
        name: &str,
        seen: &mut HashSet<String>,
        order: &mut Vec<String>,
        deps_of: &mut dyn FnMut(&str) -> Deps<E>,
    ) -> Result<(), E> {
        let name = normalise(name);
        // Also stops a dependency cycle, which the kernel would refuse to
        // load anyway.
        if !seen.insert(name.clone()) {
            return Ok(());
        }
        if let Some(deps) = deps_of(&name)? {
            for dep in deps {
                visit(&dep, seen, order, deps_of)?;
            }
            order.push(name);
        }
        Ok(())
    }
    let (mut seen, mut order) = (HashSet::new(), Vec::new());
    for name in wanted {
        visit(name, &mut seen, &mut order, &mut deps_of)?;
    }
    Ok(order)
}

/// A kernel's modules directory.
struct ModuleTree {
    dir: PathBuf,
    /// Module name to file.
    files: HashMap<String, PathBuf>,
    /// From modules.dep, when depmod has run (an installed kernel); an
    /// extracted package has none, and each module's .modinfo says instead.
    deps: Option<HashMap<String, Vec<String>>>,
    builtin: HashSet<String>,
}

impl ModuleTree {
    fn open(dir: &Path) -> Result<ModuleTree, ImageError> {
        let names = |text: &str| -> Vec<String> {
            text.split_whitespace().filter_map(module_name).collect()
        };
        let mut files = HashMap::new();
        let dep_path = dir.join("modules.dep");
        let deps = match fs::read_to_string(&dep_path) {
            Ok(text) => {
                let mut deps = HashMap::new();
                for line in text.lines() {
                    let Some((file, needs)) = line.split_once(':') else {
                        continue;
                    };
                    let Some(name) = module_name(file) else {
                        continue;
                    };
                    files
                        .entry(name.clone())
                        .or_insert_with(|| dir.join(file.trim()));
                    deps.insert(name, names(needs));
                }
                Some(deps)
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                if !dir.is_dir() {
                    return Err(e).at(dir);
                }
                scan_modules(dir, &mut files)?;
                None
            }
            Err(e) => return Err(e).at(&dep_path),
        };
        let builtin = fs::read_to_string(dir.join("modules.builtin"))
            .map(|t| names(&t).into_iter().collect())
            .unwrap_or_default();
        Ok(ModuleTree {
            dir: dir.to_owned(),
            files,
            deps,
            builtin,
        })
    }

    /// The modules `wanted` needs, dependencies first, with their contents
    /// uncompressed (this kernel cannot load compressed modules).
    fn resolve(
        &self,
        wanted: &[&str],
        version: &str,
    ) -> Result<Vec<(String, Vec<u8>)>, ImageError> {
        let mut contents = HashMap::new();
        let order = load_order(wanted, |name| {
            let Some(path) = self.files.get(name) else {
                return if self.builtin.contains(name) {
                    Ok(None)
                } else {
                    Err(ImageError::ModuleNotFound {
                        name: name.to_owned(),
                        dir: self.dir.clone(),
                    })
                };
            };
            let data = read_module(path)?;
            let bad = |message: String| ImageError::BadModule {
                path: path.clone(),
                message,
            };
            let info = modinfo(&data).map_err(bad)?;
            let get = |key: &str| info.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
            // A module built for another kernel would only fail in the
            // guest, with a terse message; say it here.
            if let Some(built_for) = get("vermagic").and_then(|v| v.split_whitespace().next())
                && built_for != version
            {
                return Err(bad(format!(
                    "built for kernel {built_for}, not {version}: the `modules` setting must match the kernel"
                )));
            }
            let deps = match &self.deps {
                Some(map) => map.get(name).cloned().unwrap_or_default(),
                None => get("depends")
                    .unwrap_or("")
                    .split(',')
                    .filter(|d| !d.is_empty())
                    .map(normalise)
                    .collect(),
            };
            contents.insert(name.to_owned(), data);
            Ok(Some(deps))
        })?;
        Ok(order
            .into_iter()
            .map(|name| {
                let data = contents.remove(&name).expect("read while ordering");
                (name, data)
            })
            .collect())
    }
}

/// Indexes every module file under `dir`. Symlinks are not followed: an
/// installed kernel's `build` and `source` point at its headers.
fn scan_modules(dir: &Path, files: &mut HashMap<String, PathBuf>) -> Result<(), ImageError> {
    let mut entries: Vec<_> = fs::read_dir(dir)
        .at(dir)?
        .collect::<io::Result<_>>()
        .at(dir)?;
    // Sorted, so that of two files with one name the same one always wins.
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        let kind = entry.file_type().at(&path)?;
        if kind.is_dir() {
            scan_modules(&path, files)?;
        } else if kind.is_file()
            && let Some(name) = entry.file_name().to_str().and_then(module_name)
        {
            files.entry(name).or_insert(path);
        }
    }
    Ok(())
}

fn read_module(path: &Path) -> Result<Vec<u8>, ImageError> {
    let data = fs::read(path).at(path)?;
    let name = path.to_string_lossy();
    match MODULE_SUFFIXES
        .iter()
        .find(|(suffix, _)| name.ends_with(suffix))
        .and_then(|(_, c)| *c)
    {
        Some(format) => decompress(format, &data, "uncompress kernel modules"),
        None => Ok(data),
    }
}

/// The `key=value` pairs of a module's `.modinfo` section.
fn modinfo(data: &[u8]) -> Result<Vec<(String, String)>, String> {
    let section = elf_section(data, ".modinfo")?.ok_or("it has no .modinfo section")?;
    Ok(section
        .split(|&b| b == 0)
        .filter_map(|entry| {
            let (k, v) = std::str::from_utf8(entry).ok()?.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect())
}

/// The contents of the section called `wanted` in a 64-bit little-endian
/// ELF file (what x86-64 modules are).
fn elf_section<'a>(data: &'a [u8], wanted: &str) -> Result<Option<&'a [u8]>, String> {
    if !data.starts_with(ELF_MAGIC) {
        return Err("not an ELF file".into());
    }
    if data.get(4..6) != Some(&[2u8, 1][..]) {
        return Err("not a 64-bit little-endian ELF file".into());
    }
    let truncated = || "truncated ELF file".to_string();
    let shoff = u64_at(data, 0x28).ok_or_else(truncated)? as usize;
    let shentsize = usize::from(u16_at(data, 0x3a).ok_or_else(truncated)?);
    let shnum = usize::from(u16_at(data, 0x3c).ok_or_else(truncated)?);
    let shstrndx = usize::from(u16_at(data, 0x3e).ok_or_else(truncated)?);
    if shentsize < 64 {
        return Err(format!("odd section header size {shentsize}"));
    }
    // (name offset, file offset, size) of section i.
    let header = |i: usize| -> Option<(usize, &'a [u8])> {
        let base = shoff.checked_add(i.checked_mul(shentsize)?)?;
        let name = u32_at(data, base)? as usize;
        let offset = u64_at(data, base + 24)? as usize;
        let size = u64_at(data, base + 32)? as usize;
        Some((name, data.get(offset..offset.checked_add(size)?)?))
    };
    let (_, names) = header(shstrndx).ok_or_else(truncated)?;
    for i in 0..shnum {
        let (name_at, contents) = header(i).ok_or_else(truncated)?;
        let name = names.get(name_at..).unwrap_or_default();
        let name = &name[..name.iter().position(|&b| b == 0).unwrap_or(name.len())];
        if name == wanted.as_bytes() {
            return Ok(Some(contents));
        }
    }
    Ok(None)
}

// ---------------------------------------------------------------------------
// The initramfs

/// What goes into the initramfs besides the fixed layout.
pub struct InitramfsSpec<'a> {
    /// The guest init binary, which becomes `/init` (mode 0755).
    pub init: &'a [u8],
    /// Module names wanted (e.g. `virtio_mmio`, `virtio_console`,
    /// `9pnet_virtio`, `9p`); their dependencies are added, all in load
    /// order.
    pub modules: &'a [&'a str],
    /// `(path, target)` symlinks created in the image, e.g. `("bin", "usr/bin")`.
    pub symlinks: &'a [(String, String)],
}

/// Directories of the fixed layout, parents first.
const DIRS: [&str; 11] = [
    "dev",
    "proc",
    "sys",
    "tmp",
    "run",
    "usr",
    "etc",
    "workspace",
    ".cordon",
    ".cordon/bin",
    ".cordon/modules",
];
/// Part of the cache key: bump it whenever the layout changes, so that
/// images cached by an older build are not reused.
const LAYOUT: u32 = 1;

/// Builds the initramfs, an uncompressed newc archive, or reuses the cached
/// one with the same content (kernel build, init, modules and symlinks). It holds
/// the fixed directories, `dev/console` and `dev/null`, `/init`,
/// `.cordon/modules/<name>.ko` for each module (decompressed if the kernel
/// ships them compressed) and `.cordon/modules/order`, the file names in
/// load order, one per line.
pub fn initramfs(
    cache: &Path,
    kernel: &Kernel,
    spec: &InitramfsSpec,
) -> Result<PathBuf, ImageError> {
    // Which files, and which build of them: a rebuilt kernel package may
    // keep its version, and its tree is then replaced (see `setup`).
    let identity = |p: &Path| {
        fs::metadata(p)
            .ok()
            .map(|m| (m.dev(), m.ino(), m.mtime(), m.mtime_nsec()))
    };
    let key = hash_hex(|h| {
        LAYOUT.hash(h);
        kernel.version.hash(h);
        kernel.modules.hash(h);
        identity(&kernel.modules).hash(h);
        identity(&kernel.vmlinux).hash(h);
        spec.init.hash(h);
        spec.modules.hash(h);
        spec.symlinks.hash(h);
    });
    let version: String = kernel
        .version
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || ".+-_".contains(c) {
                c
            } else {
                '_'
            }
        })
        .collect();
    let dir = cache.join("initramfs");
    let path = dir.join(format!("{version}-{key}.cpio"));
    if reuse(&path) {
        return Ok(path);
    }
    fs::create_dir_all(&dir).at(&dir)?;
    let _lock = lock(&dir.join("lock"))?;
    if reuse(&path) {
        return Ok(path);
    }
    let modules = ModuleTree::open(&kernel.modules)?.resolve(spec.modules, &kernel.version)?;
    let archive = build_archive(spec, &modules)?;
    write_atomic(&path, |f| f.write_all(&archive))?;
    // Images of other inits or kernels pile up over upgrades; one unused
    // for days is not coming back (and would be rebuilt if it did).
    // Recently used ones stay: another sandbox may be about to boot one.
    let now = SystemTime::now();
    let idle = |p: &Path, limit: Duration| {
        fs::metadata(p)
            .and_then(|m| m.modified())
            .is_ok_and(|t| now.duration_since(t).unwrap_or_default() > limit)
    };
    remove_matching(&dir, |name, p| {
        (name.ends_with(".cpio") && p != path && idle(p, Duration::from_secs(2 * 86400)))
            || (name.contains(".tmp") && idle(p, Duration::from_secs(3600)))
    });
    Ok(path)
}

/// Whether a cached image is there and complete, marking it as recently
/// used if so.
fn reuse(path: &Path) -> bool {
    let Ok(mut file) = File::options().read(true).open(path) else {
        return false;
    };
    let mut tail = [0u8; 16];
    let complete = file.seek(SeekFrom::End(-16)).is_ok()
        && file.read_exact(&mut tail).is_ok()
        && find(&tail, b"TRAILER!!!\0").is_some();
    if complete {
        // The mtime says when it was last used (see the pruning above).
        // A read-only cache still works, so failing here is fine.
        let _ = File::options()
            .write(true)
            .open(path)
            .and_then(|f| f.set_modified(SystemTime::now()));
    }
    complete
}

fn build_archive(
    spec: &InitramfsSpec,
    modules: &[(String, Vec<u8>)],
) -> Result<Vec<u8>, ImageError> {
    let mut cpio = Newc::default();
    for dir in DIRS {
        cpio.dir(dir)?;
    }
    // The kernel opens /dev/console for init's stdin/out/err before
    // devtmpfs is mounted. Without /dev/null, a Rust init whose fds 0-2
    // are closed aborts before main.
    cpio.char_device("dev/console", 0o600, 5, 1)?;
    cpio.char_device("dev/null", 0o666, 1, 3)?;
    cpio.file("init", 0o755, spec.init)?;
    let mut order = String::new();
    for (name, data) in modules {
        cpio.file(&format!(".cordon/modules/{name}.ko"), 0o644, data)?;
        order.push_str(&format!("{name}.ko\n"));
    }
    cpio.file(".cordon/modules/order", 0o644, order.as_bytes())?;
    for (path, target) in spec.symlinks {
        let name = path.trim_start_matches('/');
        if target.is_empty() || target.contains('\0') {
            return Err(ImageError::Spec(format!(
                "symlink {path}: bad target {target:?}"
            )));
        }
        cpio.symlink(name, target)?;
    }
    Ok(cpio.finish())
}

const S_IFDIR: u32 = 0o040000;
const S_IFCHR: u32 = 0o020000;
const S_IFREG: u32 = 0o100000;
const S_IFLNK: u32 = 0o120000;

/// A newc ("070701") cpio archive, the format the kernel unpacks as its
/// initramfs. Missing parent directories are added before an entry: the
/// kernel does not create them.
#[derive(Default)]
struct Newc {
    buf: Vec<u8>,
    names: HashSet<String>,
    ino: u32,
}

impl Newc {
    fn dir(&mut self, name: &str) -> Result<(), ImageError> {
        self.entry(name, S_IFDIR | 0o755, (0, 0), &[])
    }

    fn file(&mut self, name: &str, perm: u32, data: &[u8]) -> Result<(), ImageError> {
        self.entry(name, S_IFREG | perm, (0, 0), data)
    }

    fn char_device(
        &mut self,
        name: &str,
        perm: u32,
        major: u32,
        minor: u32,
    ) -> Result<(), ImageError> {
        self.entry(name, S_IFCHR | perm, (major, minor), &[])
    }

    fn symlink(&mut self, name: &str, target: &str) -> Result<(), ImageError> {
        self.entry(name, S_IFLNK | 0o777, (0, 0), target.as_bytes())
    }

    fn entry(
        &mut self,
        name: &str,
        mode: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> Result<(), ImageError> {
        if name
            .split('/')
            .any(|c| c.is_empty() || c == "." || c == "..")
            || name.contains('\0')
        {
            return Err(ImageError::Spec(format!("bad path {name:?} in the image")));
        }
        if self.names.contains(name) {
            return Err(ImageError::Spec(format!("{name} is in the image twice")));
        }
        for (slash, _) in name.match_indices('/') {
            let parent = &name[..slash];
            if self.names.insert(parent.to_owned()) {
                self.raw(parent, S_IFDIR | 0o755, (0, 0), &[])?;
            }
        }
        self.names.insert(name.to_owned());
        self.raw(name, mode, rdev, data)
    }

    fn raw(
        &mut self,
        name: &str,
        mode: u32,
        rdev: (u32, u32),
        data: &[u8],
    ) -> Result<(), ImageError> {
        let size = u32::try_from(data.len())
            .map_err(|_| ImageError::Spec(format!("{name} is too large for a cpio archive")))?;
        self.ino += 1;
        let nlink = if mode & 0o170000 == S_IFDIR { 2 } else { 1 };
        let name_size = name.len() as u32 + 1;
        // ino mode uid gid nlink mtime filesize devmajor devminor rdevmajor
        // rdevminor namesize check. mtime 0 keeps the image reproducible.
        let fields = [
            self.ino, mode, 0, 0, nlink, 0, size, 0, 0, rdev.0, rdev.1, name_size, 0,
        ];
        self.buf.extend_from_slice(b"070701");
        for value in fields {
            self.buf
                .extend_from_slice(format!("{value:08X}").as_bytes());
        }
        self.buf.extend_from_slice(name.as_bytes());
        self.buf.push(0);
        self.pad();
        self.buf.extend_from_slice(data);
        self.pad();
        Ok(())
    }

    /// Header-plus-name and data each end on a 4-byte boundary.
    fn pad(&mut self) {
        let len = self.buf.len().next_multiple_of(4);
        self.buf.resize(len, 0);
    }

    fn finish(mut self) -> Vec<u8> {
        self.raw("TRAILER!!!", 0, (0, 0), &[])
            .expect("the trailer is small");
        self.buf
    }
}

// ---------------------------------------------------------------------------
// Cache files

/// A 64-bit key for cache file names. SipHash with fixed keys is stable for
/// a given build of std; a new Rust release may change it, which costs one
/// rebuild of the cached images.
fn hash_hex(feed: impl FnOnce(&mut DefaultHasher)) -> String {
    let mut h = DefaultHasher::new();
    feed(&mut h);
    format!("{:016x}", h.finish())
}

/// Takes an exclusive lock on `path` (created if needed), held until the
/// returned file is dropped, so that only one process builds a cache entry
/// while the others wait and then reuse it.
fn lock(path: &Path) -> Result<File, ImageError> {
    let file = File::options()
        .create(true)
        .truncate(false)
        .write(true)
        .open(path)
        .at(path)?;
    rustix::fs::flock(&file, rustix::fs::FlockOperation::LockExclusive)
        .map_err(io::Error::from)
        .at(path)?;
    Ok(file)
}

/// Writes `path` through a temporary file in the same directory and a
/// rename, so readers see either the old file or the whole new one.
fn write_atomic(
    path: &Path,
    write: impl FnOnce(&mut File) -> io::Result<()>,
) -> Result<(), ImageError> {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let mut tmp_name = OsString::from(".");
    tmp_name.push(path.file_name().unwrap_or_default());
    tmp_name.push(format!(
        ".tmp{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    let tmp = path.with_file_name(tmp_name);
    let result = (|| {
        let mut file = File::create(&tmp)?;
        write(&mut file)?;
        // Durable before it is visible, so a crash cannot leave an empty
        // file under the final name.
        file.sync_all()?;
        fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result.at(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One entry read back from a newc archive.
    #[derive(Debug)]
    struct Entry {
        name: String,
        ino: u32,
        mode: u32,
        nlink: u32,
        rdev: (u32, u32),
        data: Vec<u8>,
    }

    /// A strict newc reader: checks the magic, the padding (zeros, to 4
    /// bytes) and that the trailer ends the archive.
    fn parse_newc(buf: &[u8]) -> Vec<Entry> {
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

    fn find_entry<'a>(entries: &'a [Entry], name: &str) -> &'a Entry {
        entries
            .iter()
            .find(|e| e.name == name)
            .unwrap_or_else(|| panic!("{name} is not in the archive"))
    }

    /// A minimal ELF64 file whose only contents are a section name table
    /// and a `.modinfo` section holding `info`.
    fn fake_ko(info: &[(&str, &str)]) -> Vec<u8> {
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

    fn compress(tool: &str, args: &[&str], data: &[u8]) -> Vec<u8> {
        let out = run_with_input(Command::new(tool).args(args), data).expect(tool);
        assert!(out.status.success(), "{tool} failed");
        out.stdout
    }

    const VERSION: &str = "6.1.0-99-test";

    /// A modules tree as an extracted package has it (no modules.dep):
    /// virtio_ring <- virtio <- virtio_mmio; 9p needs 9pnet and netfs;
    /// virtio-rng (a '-' in its file name) is xz-compressed; crc32c is
    /// built in.
    fn fake_modules(dir: &Path) {
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

    #[test]
    fn newc_round_trip() {
        let modules = vec![
            ("virtio".to_string(), b"first module".to_vec()),
            ("9p".to_string(), vec![7u8; 5]),
        ];
        let symlinks = vec![
            ("bin".to_string(), "usr/bin".to_string()),
            ("/opt/tools/cc".to_string(), "/usr/bin/gcc".to_string()),
        ];
        let spec = InitramfsSpec {
            init: b"\x7fELF init binary",
            modules: &[],
            symlinks: &symlinks,
        };
        let archive = build_archive(&spec, &modules).unwrap();
        assert_eq!(archive.len() % 4, 0);
        let entries = parse_newc(&archive);

        // Parents first, each name once, distinct inodes.
        let mut seen = HashSet::new();
        for e in &entries {
            for (slash, _) in e.name.match_indices('/') {
                assert!(
                    seen.contains(&e.name[..slash]),
                    "{} before its parent",
                    e.name
                );
            }
            assert!(seen.insert(e.name.as_str()), "{} twice", e.name);
        }
        let inodes: HashSet<u32> = entries.iter().map(|e| e.ino).collect();
        assert_eq!(inodes.len(), entries.len());

        for dir in DIRS.iter().chain(&["opt", "opt/tools"]) {
            let e = find_entry(&entries, dir);
            assert_eq!((e.mode, e.nlink, e.data.len()), (0o040755, 2, 0), "{dir}");
        }
        let console = find_entry(&entries, "dev/console");
        assert_eq!((console.mode, console.rdev), (0o020600, (5, 1)));
        let null = find_entry(&entries, "dev/null");
        assert_eq!((null.mode, null.rdev), (0o020666, (1, 3)));
        let init = find_entry(&entries, "init");
        assert_eq!((init.mode, init.data.as_slice()), (0o100755, spec.init));
        assert_eq!(
            find_entry(&entries, ".cordon/modules/virtio.ko").data,
            b"first module"
        );
        assert_eq!(
            find_entry(&entries, ".cordon/modules/9p.ko").data,
            vec![7u8; 5]
        );
        let order = find_entry(&entries, ".cordon/modules/order");
        assert_eq!(order.data, b"virtio.ko\n9p.ko\n");
        let bin = find_entry(&entries, "bin");
        assert_eq!((bin.mode, bin.data.as_slice()), (0o120777, &b"usr/bin"[..]));
        assert_eq!(find_entry(&entries, "opt/tools/cc").data, b"/usr/bin/gcc");

        // Names clashing with the layout, or escaping it, are refused.
        for bad in ["dev", "../x", "a//b", "."] {
            let symlinks = vec![(bad.to_string(), "x".to_string())];
            let spec = InitramfsSpec {
                symlinks: &symlinks,
                ..spec
            };
            assert!(
                matches!(build_archive(&spec, &[]), Err(ImageError::Spec(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn load_order_puts_dependencies_first_once() {
        let graph: HashMap<&str, Vec<&str>> = HashMap::from([
            ("9p", vec!["9pnet", "netfs"]),
            ("9pnet_virtio", vec!["9pnet", "virtio", "virtio_ring"]),
            ("9pnet", vec![]),
            ("netfs", vec!["fscache"]),
            ("fscache", vec![]),
            ("virtio", vec!["virtio_ring"]),
            ("virtio_ring", vec![]),
            ("virtio_mmio", vec!["virtio", "virtio_ring"]),
            ("a", vec!["b", "builtin"]),
            ("b", vec!["a"]),
        ]);
        let deps = |name: &str| -> Deps<String> {
            if name == "builtin" {
                return Ok(None);
            }
            let deps = graph.get(name).ok_or(format!("no {name}"))?;
            Ok(Some(deps.iter().map(|d| d.to_string()).collect()))
        };
        let order = load_order(&["virtio-mmio", "9pnet_virtio", "9p", "virtio"], deps).unwrap();
        assert_eq!(
            order,
            [
                "virtio_ring",
                "virtio",
                "virtio_mmio",
                "9pnet",
                "9pnet_virtio",
                "fscache",
                "netfs",
                "9p"
            ]
        );
        // A cycle ends, built-in modules are left out, unknown ones fail.
        assert_eq!(load_order(&["a"], deps).unwrap(), ["b", "a"]);
        assert_eq!(
            load_order(&["builtin"], deps).unwrap(),
            Vec::<String>::new()
        );
        assert_eq!(load_order(&["nope"], deps).unwrap_err(), "no nope");
    }

    #[test]
    fn modules_resolve_from_modinfo_or_modules_dep() {
        let tmp = tempfile::tempdir().unwrap();
        fake_modules(tmp.path());
        let tree = ModuleTree::open(tmp.path()).unwrap();
        assert!(tree.deps.is_none());
        let got = tree
            .resolve(
                &[
                    "virtio_mmio",
                    "virtio_console",
                    "9pnet_virtio",
                    "9p",
                    "virtio_rng",
                ],
                VERSION,
            )
            .unwrap();
        let names: Vec<&str> = got.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "virtio_ring",
                "virtio",
                "virtio_mmio",
                "virtio_console",
                "9pnet",
                "9pnet_virtio",
                "netfs",
                "9p",
                "virtio_rng"
            ]
        );
        // Compressed files are stored uncompressed.
        for (name, data) in &got {
            assert!(data.starts_with(ELF_MAGIC), "{name}");
        }

        // modules.dep, when there, is what counts.
        fs::write(
            tmp.path().join("modules.dep"),
            "kernel/fs/9p/9p.ko: kernel/net/9p/9pnet.ko\nkernel/net/9p/9pnet.ko:\n",
        )
        .unwrap();
        let tree = ModuleTree::open(tmp.path()).unwrap();
        let got = tree.resolve(&["9p"], VERSION).unwrap();
        assert_eq!(
            got.iter().map(|(n, _)| n.as_str()).collect::<Vec<_>>(),
            ["9pnet", "9p"]
        );
        fs::remove_file(tmp.path().join("modules.dep")).unwrap();

        let tree = ModuleTree::open(tmp.path()).unwrap();
        assert!(matches!(
            tree.resolve(&["virtio_gpu"], VERSION),
            Err(ImageError::ModuleNotFound { name, .. }) if name == "virtio_gpu"
        ));
        let err = tree.resolve(&["virtio"], "6.1.0-1-other").unwrap_err();
        assert!(
            err.to_string().contains("built for kernel 6.1.0-99-test"),
            "{err}"
        );
    }

    fn fake_kernel(dir: &Path) -> Kernel {
        let modules = dir.join("lib/modules").join(VERSION);
        fake_modules(&modules);
        Kernel {
            version: VERSION.into(),
            vmlinux: dir.join("vmlinux"),
            modules,
        }
    }

    fn cpio_files(dir: &Path) -> Vec<String> {
        let mut names: Vec<String> = fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|n| n != "lock")
            .collect();
        names.sort();
        names
    }

    #[test]
    fn initramfs_is_cached_and_replaced_atomically() {
        let tmp = tempfile::tempdir().unwrap();
        let kernel = fake_kernel(tmp.path());
        let cache = tmp.path().join("cache");
        let symlinks = vec![("bin".to_string(), "usr/bin".to_string())];
        let spec = InitramfsSpec {
            init: b"init v1",
            modules: &["9p", "virtio_mmio"],
            symlinks: &symlinks,
        };
        let path = initramfs(&cache, &kernel, &spec).unwrap();
        let entries = parse_newc(&fs::read(&path).unwrap());
        assert_eq!(
            find_entry(&entries, ".cordon/modules/order").data,
            b"9pnet.ko\nnetfs.ko\n9p.ko\nvirtio_ring.ko\nvirtio.ko\nvirtio_mmio.ko\n"
        );
        assert_eq!(find_entry(&entries, "init").data, b"init v1");

        // Same content: the same file, not rewritten.
        let ino = fs::metadata(&path).unwrap().ino();
        let again = initramfs(&cache, &kernel, &spec).unwrap();
        assert_eq!(
            (again.clone(), fs::metadata(&again).unwrap().ino()),
            (path.clone(), ino)
        );

        // Different content: another file.
        let other = initramfs(
            &cache,
            &kernel,
            &InitramfsSpec {
                init: b"init v2",
                ..spec
            },
        )
        .unwrap();
        assert_ne!(other, path);
        let fewer = initramfs(
            &cache,
            &kernel,
            &InitramfsSpec {
                modules: &["9p"],
                ..spec
            },
        )
        .unwrap();
        assert_ne!(fewer, path);

        // A damaged file is replaced by rename: a reader that had it open
        // keeps the old contents, and no temporary file is left behind.
        fs::write(&path, b"half-written junk").unwrap();
        let mut reader = File::open(&path).unwrap();
        let rebuilt = initramfs(&cache, &kernel, &spec).unwrap();
        assert_eq!(rebuilt, path);
        assert_ne!(fs::metadata(&path).unwrap().ino(), ino);
        let mut old = String::new();
        reader.read_to_string(&mut old).unwrap();
        assert_eq!(old, "half-written junk");
        assert_eq!(parse_newc(&fs::read(&path).unwrap()).len(), entries.len());
        assert!(
            cpio_files(&cache.join("initramfs"))
                .iter()
                .all(|n| n.ends_with(".cpio"))
        );

        // Another build of the same kernel version: another image.
        let t = SystemTime::now() - Duration::from_secs(3600);
        File::open(&kernel.modules)
            .unwrap()
            .set_modified(t)
            .unwrap();
        assert_ne!(initramfs(&cache, &kernel, &spec).unwrap(), path);

        // A missing module names itself.
        let err = initramfs(
            &cache,
            &kernel,
            &InitramfsSpec {
                modules: &["vsock"],
                ..spec
            },
        )
        .unwrap_err();
        assert!(err.to_string().contains("vsock"), "{err}");
    }

    #[test]
    fn concurrent_builds_agree() {
        let tmp = tempfile::tempdir().unwrap();
        let kernel = fake_kernel(tmp.path());
        let cache = tmp.path().join("cache");
        let spec = InitramfsSpec {
            init: b"init",
            modules: &["9p"],
            symlinks: &[],
        };
        let paths: Vec<PathBuf> = std::thread::scope(|s| {
            let builders: Vec<_> = (0..4)
                .map(|_| s.spawn(|| initramfs(&cache, &kernel, &spec).unwrap()))
                .collect();
            builders.into_iter().map(|b| b.join().unwrap()).collect()
        });
        assert!(paths.iter().all(|p| *p == paths[0]));
        parse_newc(&fs::read(&paths[0]).unwrap());
        assert_eq!(cpio_files(&cache.join("initramfs")).len(), 1);
    }

    #[test]
    fn stale_images_are_pruned_when_another_is_built() {
        let tmp = tempfile::tempdir().unwrap();
        let kernel = fake_kernel(tmp.path());
        let cache = tmp.path().join("cache");
        let spec = InitramfsSpec {
            init: b"one",
            modules: &[],
            symlinks: &[],
        };
        let one = initramfs(&cache, &kernel, &spec).unwrap();
        let old = SystemTime::now() - Duration::from_secs(3 * 86400);
        File::options()
            .write(true)
            .open(&one)
            .unwrap()
            .set_modified(old)
            .unwrap();
        let two = initramfs(
            &cache,
            &kernel,
            &InitramfsSpec {
                init: b"two",
                ..spec
            },
        )
        .unwrap();
        assert!(!one.exists());
        assert!(two.exists());
        // Reusing an image marks it as used.
        File::options()
            .write(true)
            .open(&two)
            .unwrap()
            .set_modified(old)
            .unwrap();
        initramfs(
            &cache,
            &kernel,
            &InitramfsSpec {
                init: b"two",
                ..spec
            },
        )
        .unwrap();
        let age = fs::metadata(&two)
            .unwrap()
            .modified()
            .unwrap()
            .elapsed()
            .unwrap();
        assert!(age < Duration::from_secs(60));
    }

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

    #[test]
    fn apt_records_parse() {
        let record = "Package: linux-image-amd64\nSource: linux-signed-amd64 (6.1.192+2)\nVersion: 6.1.192-2\n\
                      Depends: linux-image-6.1.0-56-amd64 (= 6.1.192-2)\nSize: 1480\n";
        assert_eq!(
            abi_package(record),
            Some(("linux-image-6.1.0-56-amd64", Some("6.1.192-2")))
        );
        assert_eq!(field(record, "Version"), Some("6.1.192-2"));
        assert_eq!(
            abi_package(
                "Depends: initramfs-tools | linux-initramfs-tool, linux-image-6.12.1-amd64-unsigned:any (= 1:2)\n"
            ),
            Some(("linux-image-6.12.1-amd64-unsigned", Some("1:2")))
        );
        assert_eq!(
            abi_package("Depends: linux-image-6.1.0-9-amd64 (>= 6.1)\n"),
            Some(("linux-image-6.1.0-9-amd64", None))
        );
        assert_eq!(abi_package("Package: x\n"), None);
    }

    #[test]
    fn cache_dir_follows_the_environment() {
        let s = |v: &str| Some(OsString::from(v));
        assert_eq!(
            cache_dir_from(s("/x/vm"), true, None, None),
            PathBuf::from("/x/vm")
        );
        assert_eq!(
            cache_dir_from(s(""), true, None, None),
            PathBuf::from("/var/cache/cordon/vm")
        );
        assert_eq!(
            cache_dir_from(None, false, s("/xdg"), s("/home/u")),
            PathBuf::from("/xdg/cordon/vm")
        );
        assert_eq!(
            cache_dir_from(None, false, s("relative"), s("/home/u")),
            PathBuf::from("/home/u/.cache/cordon/vm")
        );
    }

    /// Against the real kernel: the one in the cache if there is one; under
    /// CI it is fetched, so this never skips there.
    #[test]
    fn real_kernel_and_initramfs() {
        let cache = cache_dir();
        let kernel = if std::env::var("CI").is_ok_and(|v| v == "true") {
            setup(&cache, &mut |line| eprintln!("setup: {line}")).expect("setup")
        } else {
            match find_kernel(&cache, None, None) {
                Ok(kernel) => kernel,
                Err(ImageError::NoKernel { .. }) => {
                    eprintln!(
                        "skipped: no guest kernel in {} (run setup, or CI=true)",
                        cache.display()
                    );
                    return;
                }
                Err(e) => panic!("{e}"),
            }
        };
        let mut head = [0u8; 4];
        File::open(&kernel.vmlinux)
            .unwrap()
            .read_exact(&mut head)
            .unwrap();
        assert_eq!(&head, ELF_MAGIC);

        let tmp = tempfile::tempdir().unwrap();
        let wanted = ["virtio_mmio", "virtio_console", "9pnet_virtio", "9p"];
        let spec = InitramfsSpec {
            init: b"not really an init",
            modules: &wanted,
            symlinks: &[],
        };
        let path = initramfs(tmp.path(), &kernel, &spec).unwrap();
        let entries = parse_newc(&fs::read(&path).unwrap());
        let order =
            String::from_utf8(find_entry(&entries, ".cordon/modules/order").data.clone()).unwrap();
        let order: Vec<&str> = order.lines().collect();
        eprintln!("modules: {order:?}");
        let at = |m: &str| order.iter().position(|o| *o == format!("{m}.ko"));
        for m in wanted {
            assert!(at(m).is_some(), "{m} missing from {order:?}");
        }
        for (before, after) in [
            ("virtio", "virtio_mmio"),
            ("virtio_ring", "virtio"),
            ("9pnet", "9pnet_virtio"),
            ("9pnet", "9p"),
        ] {
            assert!(
                at(before) < at(after),
                "{before} after {after} in {order:?}"
            );
        }
        for name in &order {
            let module = find_entry(&entries, &format!(".cordon/modules/{name}"));
            assert!(module.data.starts_with(ELF_MAGIC), "{name}");
            let info = modinfo(&module.data).unwrap();
            assert!(info.iter().any(|(k, v)| k == "vermagic" && v.starts_with(&format!("{} ", kernel.version))));
        }
    }
}
