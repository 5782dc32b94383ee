//! The guest's initramfs: the fixed layout, the init, the modules in load
//! order and the system symlinks, built once per content and cached.

use std::fs::{self, File};
use std::hash::Hash;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use super::bytes::find;
use super::cache::{hash_hex, lock, remove_matching, write_atomic};
use super::cpio::Newc;
use super::kernel::Kernel;
use super::modules::ModuleTree;
use super::{At, ImageError};

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

#[cfg(test)]
mod tests {
    use super::super::bytes::ELF_MAGIC;
    use super::super::cache::cache_dir;
    use super::super::fetch::setup;
    use super::super::kernel::find_kernel;
    use super::super::modules::modinfo;
    use super::super::testutil::{VERSION, fake_modules, find_entry, parse_newc};
    use super::*;
    use std::collections::HashSet;

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
        // Built into the kernel (6.12 builds virtio_console in): nothing to
        // load.
        let builtin =
            fs::read_to_string(kernel.modules.join("modules.builtin")).unwrap_or_default();
        let built_in = |m: &str| builtin.lines().any(|l| l.ends_with(&format!("/{m}.ko")));
        for m in wanted {
            assert!(
                at(m).is_some() != built_in(m),
                "{m} missing from {order:?}, or loaded though built in"
            );
        }
        for (before, after) in [
            ("virtio", "virtio_mmio"),
            ("virtio_ring", "virtio"),
            ("9pnet", "9pnet_virtio"),
            ("9pnet", "9p"),
        ] {
            if built_in(before) || built_in(after) {
                continue;
            }
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
