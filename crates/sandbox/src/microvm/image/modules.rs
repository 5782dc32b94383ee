//! The kernel modules the guest loads: a modules tree indexed (from
//! modules.dep, or by scanning it), each module's dependencies from its
//! `.modinfo`, and the load order.

use std::collections::{HashMap, HashSet};
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use super::bytes::elf_section;
use super::tools::{Compression, decompress};
use super::{At, ImageError};

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
pub(super) fn module_name(path: &str) -> Option<String> {
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
pub(super) struct ModuleTree {
    dir: PathBuf,
    /// Module name to file.
    files: HashMap<String, PathBuf>,
    /// From modules.dep, when depmod has run (an installed kernel); an
    /// extracted package has none, and each module's .modinfo says instead.
    deps: Option<HashMap<String, Vec<String>>>,
    builtin: HashSet<String>,
}

impl ModuleTree {
    pub(super) fn open(dir: &Path) -> Result<ModuleTree, ImageError> {
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
    pub(super) fn resolve(
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
pub(super) fn modinfo(data: &[u8]) -> Result<Vec<(String, String)>, String> {
    let section = elf_section(data, ".modinfo")?.ok_or("it has no .modinfo section")?;
    Ok(section
        .split(|&b| b == 0)
        .filter_map(|entry| {
            let (k, v) = std::str::from_utf8(entry).ok()?.split_once('=')?;
            Some((k.to_owned(), v.to_owned()))
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::super::bytes::ELF_MAGIC;
    use super::super::testutil::{VERSION, fake_modules};
    use super::*;

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
}
