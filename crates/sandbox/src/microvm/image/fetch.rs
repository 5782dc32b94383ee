//! `cordon vm setup`: the distribution's kernel package, fetched with
//! `apt-get download` and extracted into the cache without installing it.

use std::fs;
use std::io::{self, Write};
use std::path::Path;
use std::process::{Command, Output, Stdio};

use super::cache::{MARKER, lock, remove_matching, write_atomic};
use super::kernel::{Kernel, find_kernel_with, modules_candidates};
use super::tools::check_output;
use super::{At, ImageError};

/// The meta package that always depends on the current kernel ABI package.
const META_PACKAGE: &str = "linux-image-amd64";

/// Fetches the distribution kernel through the package manager without
/// installing it on the host: resolves the ABI package behind the newest
/// `linux-image-amd64` apt's lists know (a release's backports, where apt
/// has them: a guest kernel of 6.6 or newer maps virtio-fs files shared,
/// see microvm/virtiofs.rs), `apt-get download`s it (no root needed), extracts
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

    let all = apt_show_all(META_PACKAGE)?;
    let meta = newest(&all).ok_or_else(|| ImageError::Unsupported {
        reason: format!("apt-cache shows no version of {META_PACKAGE}"),
    })?;
    let (package, pinned) = abi_package(meta).ok_or_else(|| ImageError::Unsupported {
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
    apt_cache_show(package, true)
}

/// `apt-cache show` of every version of `package` apt's lists know.
fn apt_show_all(package: &str) -> Result<String, ImageError> {
    apt_cache_show(package, false)
}

/// The record of the highest version among `records` (blank-line
/// separated), by dpkg's ordering.
fn newest(records: &str) -> Option<&str> {
    let mut best: Option<(&str, &str)> = None;
    for record in records.split("\n\n") {
        let Some(v) = field(record, "Version") else {
            continue;
        };
        if best.is_none_or(|(b, _)| version_greater(v, b)) {
            best = Some((v, record));
        }
    }
    best.map(|(_, record)| record)
}

/// `a` > `b` as Debian versions (`dpkg --compare-versions`).
fn version_greater(a: &str, b: &str) -> bool {
    Command::new("dpkg")
        .args(["--compare-versions", a, "gt", b])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn apt_cache_show(package: &str, candidate_only: bool) -> Result<String, ImageError> {
    let mut show = Command::new("apt-cache");
    show.arg("show");
    if candidate_only {
        show.arg("--no-all-versions");
    }
    show.arg(package);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_newest_kernel_is_taken_whatever_the_order() {
        let all = "Package: linux-image-amd64\nVersion: 6.1.192-3\nDepends: linux-image-6.1.0-57-amd64 (= 6.1.192-3)\n\n\
                   Package: linux-image-amd64\nVersion: 6.12.95-1~bpo12+1\nDepends: linux-image-6.12.95+deb12-amd64 (= 6.12.95-1~bpo12+1)\n\n\
                   Package: linux-image-amd64\nVersion: 6.1.176-1\nDepends: linux-image-6.1.0-50-amd64 (= 6.1.176-1)\n";
        let record = newest(all).unwrap();
        assert_eq!(
            abi_package(record),
            Some(("linux-image-6.12.95+deb12-amd64", Some("6.12.95-1~bpo12+1")))
        );
        // As dpkg orders versions, not as strings sort.
        assert!(version_greater("6.10.1-1", "6.9.2-1"));
        assert!(version_greater("6.12.95-1~bpo12+1", "6.1.192-3"));
        assert!(!version_greater("6.1.192-3", "6.1.192-3"));
        assert_eq!(newest(""), None);
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
}
