//! A stage's root as its layers stack it, read on the host without a
//! mount: what `COPY` needs to know of the image it writes into (where a
//! destination really is, through the image's own links, and the
//! directories on the way) and reads from another stage.
//!
//! Every layer is hostile content. Paths are resolved here, one component
//! at a time, with the image's links followed as the image would (inside
//! its own root, never the host's); each layer is then asked only for a
//! path with no link in it, opened beneath the layer with
//! `RESOLVE_NO_SYMLINKS`. Overlay's rules apply: a character device 0:0
//! hides what is below it, a directory marked `user.overlay.opaque` hides
//! the directories below it.

use std::ffi::{CStr, OsStr};
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;

use rustix::fs::{AtFlags, FileType, Mode, OFlags, ResolveFlags, Stat};
use rustix::io::Errno;

pub use cordon_image::text::shown;

const STRICT: ResolveFlags = ResolveFlags::BENEATH
    .union(ResolveFlags::NO_SYMLINKS)
    .union(ResolveFlags::NO_MAGICLINKS);
const OPAQUE_XATTR: &CStr = c"user.overlay.opaque";
/// Links followed in one resolution, as the kernel allows.
const MAX_HOPS: usize = 40;

#[derive(Debug, thiserror::Error)]
pub enum ViewError {
    #[error("{path}: more than {MAX_HOPS} links to follow")]
    Loop { path: String },
    #[error("{path}: {errno}")]
    Io { path: String, errno: Errno },
}

/// A path of the image, as components with no link among them.
pub type Real = Vec<Vec<u8>>;

/// What the view holds at a path: the layer it comes from and its metadata.
#[derive(Debug, Clone)]
pub struct Found {
    pub layer: usize,
    pub stat: Stat,
}

impl Found {
    pub fn kind(&self) -> FileType {
        FileType::from_raw_mode(self.stat.st_mode)
    }
}

/// The stacked layers of one image.
pub struct View {
    /// Top first.
    layers: Vec<OwnedFd>,
}

impl View {
    /// The view of `layers`, the unpacked layers' directories, top first.
    pub fn open(layers: &[PathBuf]) -> Result<View, ViewError> {
        let layers = layers
            .iter()
            .map(|l| {
                rustix::fs::open(
                    l,
                    OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
                    Mode::empty(),
                )
                .map_err(|errno| ViewError::Io {
                    path: l.display().to_string(),
                    errno,
                })
            })
            .collect::<Result<_, _>>()?;
        Ok(View { layers })
    }

    /// `path` (absolute, or taken as such) with the image's links on the
    /// way followed, and the last one too when `follow_last`.
    pub fn resolve(&self, path: &[u8], follow_last: bool) -> Result<Real, ViewError> {
        let mut todo: Vec<Vec<u8>> = components(path).rev().map(<[u8]>::to_vec).collect();
        let mut out: Real = Vec::new();
        let mut hops = 0;
        while let Some(c) = todo.pop() {
            if c == b".." {
                out.pop();
                continue;
            }
            out.push(c);
            if todo.is_empty() && !follow_last {
                break;
            }
            let Some(found) = self.find(&out) else {
                continue;
            };
            if found.kind() != FileType::Symlink {
                continue;
            }
            hops += 1;
            if hops > MAX_HOPS {
                return Err(ViewError::Loop { path: shown(path) });
            }
            let target = self.read_link(&out, found.layer)?;
            out.pop();
            if target.first() == Some(&b'/') {
                out.clear();
            }
            todo.extend(components(&target).rev().map(<[u8]>::to_vec));
        }
        Ok(out)
    }

    /// What the view holds at `real` (a resolved path), if anything.
    pub fn find(&self, real: &[Vec<u8>]) -> Option<Found> {
        if real.is_empty() {
            let stat = rustix::fs::fstat(self.layers.first()?).ok()?;
            return Some(Found { layer: 0, stat });
        }
        // The layers that hold the directory walked so far, top first.
        let mut holding: Vec<usize> = (0..self.layers.len()).collect();
        let mut found = None;
        for i in 0..real.len() {
            let prefix = &real[..=i];
            let mut next = Vec::new();
            found = None;
            for &l in &holding {
                let Some(stat) = self.stat_in(l, prefix) else {
                    continue;
                };
                let kind = FileType::from_raw_mode(stat.st_mode);
                if kind == FileType::CharacterDevice && stat.st_rdev == 0 {
                    break;
                }
                if kind != FileType::Directory {
                    if found.is_none() {
                        found = Some(Found { layer: l, stat });
                    }
                    break;
                }
                if found.is_none() {
                    found = Some(Found { layer: l, stat });
                } else if found
                    .as_ref()
                    .is_some_and(|f| f.kind() != FileType::Directory)
                {
                    break;
                }
                next.push(l);
                if self.opaque(l, prefix) {
                    break;
                }
            }
            let f = found.as_ref()?;
            if i + 1 < real.len() && f.kind() != FileType::Directory {
                return None;
            }
            holding = next;
        }
        found
    }

    /// The names in the directory at `real`, each once, in name order.
    pub fn list(&self, real: &[Vec<u8>]) -> Vec<Vec<u8>> {
        let mut names = std::collections::BTreeSet::new();
        let mut hidden = std::collections::BTreeSet::new();
        for l in self.holding(real) {
            let Ok(dir) = self.open_in(l, real, OFlags::RDONLY | OFlags::DIRECTORY) else {
                continue;
            };
            let Ok(entries) = rustix::fs::Dir::read_from(&dir) else {
                continue;
            };
            for e in entries.flatten() {
                let n = e.file_name().to_bytes().to_vec();
                if n == b"." || n == b".." || hidden.contains(&n) {
                    continue;
                }
                let whiteout = e.file_type() == FileType::CharacterDevice
                    && rustix::fs::statat(&dir, OsStr::from_bytes(&n), AtFlags::SYMLINK_NOFOLLOW)
                        .is_ok_and(|st| st.st_rdev == 0);
                if whiteout {
                    hidden.insert(n);
                } else {
                    names.insert(n);
                }
            }
        }
        names.into_iter().collect()
    }

    /// Opens the regular file at `real` for reading, from the layer it
    /// comes from.
    pub fn open_file(&self, real: &[Vec<u8>], found: &Found) -> Result<std::fs::File, ViewError> {
        self.open_in(found.layer, real, OFlags::RDONLY | OFlags::NOCTTY)
            .map(std::fs::File::from)
            .map_err(|errno| ViewError::Io {
                path: shown(&real.join(&b'/')),
                errno,
            })
    }

    /// The target of the link at `real` in layer `l`.
    pub fn read_link(&self, real: &[Vec<u8>], l: usize) -> Result<Vec<u8>, ViewError> {
        let io = |errno| ViewError::Io {
            path: shown(&real.join(&b'/')),
            errno,
        };
        let (name, dirs) = real.split_last().ok_or(io(Errno::INVAL))?;
        let parent = self
            .open_in(l, dirs, OFlags::PATH | OFlags::DIRECTORY)
            .map_err(io)?;
        let target =
            rustix::fs::readlinkat(&parent, OsStr::from_bytes(name), Vec::new()).map_err(io)?;
        Ok(target.into_bytes())
    }

    /// The layers that hold the directory at `real`, top first.
    fn holding(&self, real: &[Vec<u8>]) -> Vec<usize> {
        let mut holding: Vec<usize> = (0..self.layers.len()).collect();
        for i in 0..real.len() {
            let prefix = &real[..=i];
            let mut next = Vec::new();
            for &l in &holding {
                match self.stat_in(l, prefix) {
                    None => continue,
                    Some(st) if FileType::from_raw_mode(st.st_mode) == FileType::Directory => {
                        next.push(l);
                        if self.opaque(l, prefix) {
                            break;
                        }
                    }
                    Some(_) => break,
                }
            }
            holding = next;
        }
        holding
    }

    fn stat_in(&self, l: usize, real: &[Vec<u8>]) -> Option<Stat> {
        let (name, dirs) = real.split_last()?;
        let parent = self
            .open_in(l, dirs, OFlags::PATH | OFlags::DIRECTORY)
            .ok()?;
        rustix::fs::statat(&parent, OsStr::from_bytes(name), AtFlags::SYMLINK_NOFOLLOW).ok()
    }

    fn opaque(&self, l: usize, real: &[Vec<u8>]) -> bool {
        let Ok(dir) = self.open_in(l, real, OFlags::RDONLY | OFlags::DIRECTORY) else {
            return false;
        };
        let mut v = [0u8; 1];
        rustix::fs::fgetxattr(&dir, OPAQUE_XATTR, &mut v).is_ok() && v[0] == b'y'
    }

    fn open_in(&self, l: usize, real: &[Vec<u8>], flags: OFlags) -> Result<OwnedFd, Errno> {
        let path = if real.is_empty() {
            b".".to_vec()
        } else {
            real.join(&b'/')
        };
        rustix::fs::openat2(
            &self.layers[l],
            OsStr::from_bytes(&path),
            flags | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            STRICT,
        )
    }
}

/// The components of a path, `.` and empty ones dropped.
pub fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    path.split(|&b| b == b'/')
        .filter(|c| !c.is_empty() && *c != b".")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn layer() -> tempfile::TempDir {
        tempfile::tempdir().unwrap()
    }

    fn view(layers: &[&tempfile::TempDir]) -> View {
        View::open(
            &layers
                .iter()
                .map(|l| l.path().to_path_buf())
                .collect::<Vec<_>>(),
        )
        .unwrap()
    }

    fn real(p: &str) -> Real {
        components(p.as_bytes()).map(<[u8]>::to_vec).collect()
    }

    #[test]
    fn links_resolve_inside_the_image() {
        let base = layer();
        std::fs::create_dir_all(base.path().join("usr/bin")).unwrap();
        symlink("usr/bin", base.path().join("bin")).unwrap();
        symlink("/etc", base.path().join("usr/escape")).unwrap();
        let v = view(&[&base]);
        assert_eq!(v.resolve(b"/bin/x", true).unwrap(), real("usr/bin/x"));
        // An absolute link is the image's root, never the host's.
        assert_eq!(
            v.resolve(b"/usr/escape/passwd", true).unwrap(),
            real("etc/passwd")
        );
        assert_eq!(v.resolve(b"/../../bin", false).unwrap(), real("bin"));
        symlink("loop", base.path().join("loop")).unwrap();
        assert!(matches!(
            v.resolve(b"/loop/x", true),
            Err(ViewError::Loop { .. })
        ));
    }

    #[test]
    fn whiteouts_and_opaque_directories_hide_what_is_below() {
        let base = layer();
        std::fs::create_dir_all(base.path().join("a/old")).unwrap();
        std::fs::write(base.path().join("a/f"), "base").unwrap();
        std::fs::write(base.path().join("gone"), "x").unwrap();
        let top = layer();
        std::fs::create_dir_all(top.path().join("a")).unwrap();
        std::fs::write(top.path().join("a/new"), "top").unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            top.path().join("gone").as_path(),
            FileType::CharacterDevice,
            Mode::empty(),
            0,
        )
        .unwrap();
        let v = view(&[&top, &base]);
        assert!(v.find(&real("gone")).is_none());
        assert_eq!(
            v.list(&real("a")),
            vec![b"f".to_vec(), b"new".to_vec(), b"old".to_vec()]
        );
        assert_eq!(v.find(&real("a/f")).unwrap().layer, 1);
        rustix::fs::setxattr(
            top.path().join("a").as_path(),
            OPAQUE_XATTR,
            b"y",
            rustix::fs::XattrFlags::empty(),
        )
        .unwrap();
        assert_eq!(v.list(&real("a")), vec![b"new".to_vec()]);
        assert!(v.find(&real("a/f")).is_none());
    }

    #[test]
    fn a_file_above_hides_a_directory_below() {
        let base = layer();
        std::fs::create_dir_all(base.path().join("d")).unwrap();
        std::fs::write(base.path().join("d/x"), "x").unwrap();
        let top = layer();
        std::fs::write(top.path().join("d"), "file").unwrap();
        let v = view(&[&top, &base]);
        assert_eq!(v.find(&real("d")).unwrap().kind(), FileType::RegularFile);
        assert!(v.find(&real("d/x")).is_none());
    }
}
