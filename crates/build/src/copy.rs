//! `COPY` and `ADD`: their sources, from the context or another stage, as
//! a layer written into the stage's image at the destination the image's
//! own links lead to.
//!
//! New files are the image's root's (or `--chown`'s) and keep their mode
//! (or take `--chmod`'s); the directories on the way keep the owner and
//! mode the image gives them, and the ones made are `0755`.

use std::collections::BTreeSet;
use std::ffi::OsStr;
use std::io::{self, Read, Write};
use std::os::unix::ffi::OsStrExt;

use rustix::fs::FileType;

use crate::context::{Context, Entry, Kind, Selected};
use crate::view::{Found, Real, View, components, shown};

#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Context(#[from] crate::context::ContextError),
    #[error(transparent)]
    View(#[from] crate::view::ViewError),
    #[error("writing the layer: {0}")]
    Write(#[source] io::Error),
}

/// Where the sources are read from.
pub enum Origin<'a> {
    Context(&'a Context),
    /// Another stage's (or image's) root.
    Stage(&'a View),
}

/// What the image's entries are owned by on disk, as its ids: the store
/// keeps them as they are for root, and as the caller's for anyone else.
fn image_ids(st: &rustix::fs::Stat) -> (u32, u32) {
    if rustix::process::geteuid().is_root() {
        (st.st_uid, st.st_gid)
    } else {
        (0, 0)
    }
}

/// The sources `source` names in a stage's root: its entries, links on
/// the way followed inside that root.
pub fn select_in_stage(view: &View, source: &str) -> Result<Selected, CopyError> {
    let real = view.resolve(source.as_bytes(), true)?;
    let found = view.find(&real).ok_or_else(|| {
        CopyError::Refused(format!("{source}: not in the stage it is copied from"))
    })?;
    let name = real.last().cloned().unwrap_or_default();
    let mut entries = Vec::new();
    let dir = found.kind() == FileType::Directory;
    if dir {
        walk_stage(view, &real, &mut Vec::new(), &mut entries, 0)?;
    } else {
        entries.push(stage_entry(view, &real, name, &found)?);
    }
    Ok(Selected { dir, entries })
}

fn walk_stage(
    view: &View,
    dir: &Real,
    rel: &mut Vec<u8>,
    out: &mut Vec<Entry>,
    depth: usize,
) -> Result<(), CopyError> {
    if depth > 128 {
        return Err(CopyError::Refused(format!(
            "{}: nested too deep",
            shown(&dir.join(&b'/'))
        )));
    }
    for name in view.list(dir) {
        let mut path = dir.clone();
        path.push(name.clone());
        let Some(found) = view.find(&path) else {
            continue;
        };
        let len = rel.len();
        if !rel.is_empty() {
            rel.push(b'/');
        }
        rel.extend_from_slice(&name);
        out.push(stage_entry(view, &path, rel.clone(), &found)?);
        if found.kind() == FileType::Directory {
            walk_stage(view, &path, rel, out, depth + 1)?;
        }
        rel.truncate(len);
    }
    Ok(())
}

fn stage_entry(view: &View, real: &Real, rel: Vec<u8>, found: &Found) -> Result<Entry, CopyError> {
    let kind = match found.kind() {
        FileType::Directory => Kind::Dir,
        FileType::Symlink => Kind::Link {
            target: view.read_link(real, found.layer)?,
        },
        FileType::RegularFile => Kind::File {
            size: found.stat.st_size as u64,
            // Another stage's content is named by that stage's cache key.
            digest: [0; 32],
        },
        _ => Kind::Dir,
    };
    Ok(Entry {
        path: real.join(&b'/'),
        rel,
        kind,
        mode: found.stat.st_mode & 0o7777,
        mtime: found.stat.st_mtime,
    })
}

/// How the copied entries are owned and moded.
pub struct Owner {
    pub ids: Option<(u32, u32)>,
    pub chmod: Option<u32>,
}

/// Writes the layer of a copy of `sources` (each as selected from its
/// origin) to `dest` (absolute) in the image `view`.
pub fn write_copy(
    out: impl Write,
    view: &View,
    sources: &[(&Origin<'_>, &Selected)],
    dest: &str,
    owner: &Owner,
) -> Result<(), CopyError> {
    let many = sources.len() > 1 || sources.iter().any(|(_, s)| s.dir);
    let dest_real = view.resolve(dest.as_bytes(), true)?;
    let dest_is_dir = dest.ends_with('/')
        || many
        || view
            .find(&dest_real)
            .is_some_and(|f| f.kind() == FileType::Directory);
    let mut tar = tar::Builder::new(out);
    let mut made = BTreeSet::new();
    let (dir, file_name): (Real, Option<Vec<u8>>) = if dest_is_dir {
        (dest_real, None)
    } else {
        let parent = view.resolve(parent_of(dest).as_bytes(), true)?;
        let name = components(dest.as_bytes()).last().map(<[u8]>::to_vec);
        (parent, name)
    };
    // The directories on the way, as the image has them.
    for i in 1..=dir.len() {
        let prefix = &dir[..i];
        let found = view.find(prefix);
        let mut h = tar::Header::new_gnu();
        h.set_entry_type(tar::EntryType::Directory);
        h.set_size(0);
        match found {
            Some(f) if f.kind() == FileType::Directory => {
                let (uid, gid) = image_ids(&f.stat);
                h.set_uid(uid.into());
                h.set_gid(gid.into());
                h.set_mode(f.stat.st_mode & 0o7777);
                h.set_mtime(f.stat.st_mtime.max(0) as u64);
            }
            Some(_) => {
                return Err(CopyError::Refused(format!(
                    "{dest}: /{} is a file in the image, not a directory",
                    shown(&prefix.join(&b'/'))
                )));
            }
            None => {
                let (uid, gid) = owner.ids.unwrap_or((0, 0));
                h.set_uid(uid.into());
                h.set_gid(gid.into());
                h.set_mode(0o755);
                h.set_mtime(now());
            }
        }
        let path = prefix.join(&b'/');
        append(&mut tar, &mut h, &path, io::empty())?;
        made.insert(path);
    }
    let base = dir.join(&b'/');
    for (origin, source) in sources {
        for e in &source.entries {
            let mut path = base.clone();
            let name = match (&file_name, source.dir) {
                (Some(name), false) => name.as_slice(),
                _ => e.rel.as_slice(),
            };
            if !path.is_empty() {
                path.push(b'/');
            }
            path.extend_from_slice(name);
            if !made.insert(path.clone()) && matches!(e.kind, Kind::Dir) {
                continue;
            }
            let mut h = tar::Header::new_gnu();
            let (uid, gid) = owner.ids.unwrap_or((0, 0));
            h.set_uid(uid.into());
            h.set_gid(gid.into());
            h.set_mode(owner.chmod.unwrap_or(e.mode));
            h.set_mtime(e.mtime.max(0) as u64);
            match &e.kind {
                Kind::Dir => {
                    h.set_entry_type(tar::EntryType::Directory);
                    h.set_size(0);
                    append(&mut tar, &mut h, &path, io::empty())?;
                }
                Kind::Link { target } => {
                    h.set_entry_type(tar::EntryType::Symlink);
                    h.set_size(0);
                    h.set_mode(e.mode);
                    tar.append_link(&mut h, OsStr::from_bytes(&path), OsStr::from_bytes(target))
                        .map_err(CopyError::Write)?;
                }
                Kind::File { size, .. } => {
                    h.set_entry_type(tar::EntryType::Regular);
                    h.set_size(*size);
                    let file = match *origin {
                        Origin::Context(ctx) => ctx.open_file(&e.path)?,
                        Origin::Stage(from) => {
                            let real: Real = components(&e.path).map(<[u8]>::to_vec).collect();
                            let found = from.find(&real).ok_or_else(|| {
                                CopyError::Refused(format!("{}: gone", shown(&e.path)))
                            })?;
                            from.open_file(&real, &found)?
                        }
                    };
                    // Exactly the size measured, whatever the file is now.
                    let body = file.take(*size).chain(io::repeat(0)).take(*size);
                    append(&mut tar, &mut h, &path, body)?;
                }
            }
        }
    }
    tar.into_inner()
        .and_then(|mut w| w.flush())
        .map_err(CopyError::Write)?;
    Ok(())
}

fn append<W: Write>(
    tar: &mut tar::Builder<W>,
    h: &mut tar::Header,
    path: &[u8],
    body: impl Read,
) -> Result<(), CopyError> {
    tar.append_data(h, OsStr::from_bytes(path), body)
        .map_err(CopyError::Write)
}

/// What an `ADD` of a local file unpacks rather than copies: a tar, plain
/// or compressed as the store's layers may be; `Err` for an archive of a
/// compression cordon does not read.
pub fn is_archive(head: &[u8]) -> Result<bool, CopyError> {
    if head.starts_with(&[0x1f, 0x8b]) || head.starts_with(&[0x28, 0xb5, 0x2f, 0xfd]) {
        return Ok(true);
    }
    if head.starts_with(b"BZh") || head.starts_with(&[0xfd, b'7', b'z', b'X', b'Z', 0]) {
        return Err(CopyError::Refused(
            "ADD of a bzip2 or xz archive is not supported (gzip, zstd and plain tars are): \
             COPY it and unpack it in a RUN"
                .into(),
        ));
    }
    Ok(head.len() >= 262 && &head[257..262] == b"ustar")
}

/// The build's time, for the directories it makes.
fn now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn parent_of(path: &str) -> String {
    let trimmed = path.trim_end_matches('/');
    match trimmed.rfind('/') {
        Some(0) | None => "/".into(),
        Some(i) => trimmed[..i].into(),
    }
}
