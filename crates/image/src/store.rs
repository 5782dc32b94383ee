//! The store: verified blobs, layers unpacked once and shared, and the
//! images that name them.
//!
//! ```text
//! ROOT/blobs/sha256/HEX     manifests, configs and layers, as fetched, digest verified
//! ROOT/layers/HEX/          a layer unpacked, named by its diff_id (complete, or absent)
//! ROOT/images/HEX.json      an image: its name, manifest, config and layers (HEX of the name)
//! ROOT/locks/HEX           held while an image (HEX of its name) is pulled
//! ROOT/tmp/                 work in progress, renamed into place when done
//! ```
//!
//! Everything is written under `tmp/` and renamed into place once whole
//! and verified, so a failed or interrupted import leaves nothing a later
//! run would use, and two imports of one layer both end with one copy.
//! The sources are hostile: an OCI layout's files are opened beneath its
//! directory through no link, read up to their declared size, and taken
//! only if their digest is the one the manifest names.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
use std::path::{Path, PathBuf};

use oci_spec::image::{
    ANNOTATION_REF_NAME, Descriptor, ImageConfiguration, ImageIndex, ImageManifest, MediaType,
};
use rustix::fs::{Mode, OFlags, ResolveFlags};
use serde::{Deserialize, Serialize};

use crate::digest::{Digest, Hashing};
use crate::unpack::{self, Limits, Owners};

/// Largest manifest, index or config read: real ones are kilobytes.
pub const MAX_JSON: u64 = 4 << 20;
/// Most layers an image may have: overlayfs stacks at most 500, and no
/// real image comes near this.
pub const MAX_LAYERS: usize = 128;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("{what}: {source}")]
    Io {
        what: String,
        #[source]
        source: io::Error,
    },
    #[error("{0}")]
    Invalid(String),
    #[error(transparent)]
    Unpack(#[from] unpack::UnpackError),
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Io { what, source }
}

/// Sets `path`'s modification time to now, through no link; whether it
/// exists.
fn touch(path: &Path) -> bool {
    let Ok(fd) = rustix::fs::open(
        path,
        OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return false;
    };
    let now = rustix::fs::Timespec {
        tv_sec: 0,
        tv_nsec: rustix::fs::UTIME_NOW,
    };
    let omit = rustix::fs::Timespec {
        tv_sec: 0,
        tv_nsec: rustix::fs::UTIME_OMIT,
    };
    // Best effort: a file of another owner's stays as it is.
    let _ = rustix::fs::futimens(
        &fd,
        &rustix::fs::Timestamps {
            last_access: omit,
            last_modification: now,
        },
    );
    true
}

pub(crate) fn invalid(why: impl Into<String>) -> StoreError {
    StoreError::Invalid(why.into())
}

/// An image in the store, as a sandbox needs it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Image {
    /// What it was imported or pulled as.
    pub name: String,
    pub manifest: Digest,
    pub config: Digest,
    /// Its layers' diff_ids, bottom first: `layers/HEX` each.
    pub layers: Vec<Digest>,
    /// The config's `Env`, `WorkingDir` and `User`.
    pub env: Vec<String>,
    pub working_dir: Option<String>,
    pub user: Option<String>,
    /// Bytes of its layers' files, unpacked.
    pub size: u64,
}

/// How old a sandbox's writable layer under `run/` must be before a prune
/// may take it for a dead sandbox's: its maker makes the directory, then
/// locks it, and a prune between the two must not remove it under a
/// sandbox that is starting.
pub const SANDBOX_SETTLING: std::time::Duration = std::time::Duration::from_secs(60);

/// A file in a sandbox's writable layer under `run/` that says the
/// sandbox is saved to disk (a paused microVM), to be taken up again by a
/// process that holds nothing of it now: a prune keeps the layer, and the
/// layers it runs on, until the sandbox is taken up or deleted.
pub const SANDBOX_SAVED: &str = "saved";

#[derive(Debug, Clone)]
pub struct Store {
    root: PathBuf,
    owners: Owners,
}

/// Where the store is: `$CORDON_IMAGE_STORE`; for root
/// `/var/lib/cordon/images`; for anyone else their data directory's
/// (`$XDG_DATA_HOME`, `~/.local/share`) `cordon/images`. Each user has
/// their own: a store's files keep the owners and modes of its images.
pub fn default_root() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(root) = var("CORDON_IMAGE_STORE") {
        return Some(root);
    }
    if rustix::process::geteuid().is_root() {
        return Some(PathBuf::from("/var/lib/cordon/images"));
    }
    var("XDG_DATA_HOME")
        .or_else(|| var("HOME").map(|h| h.join(".local/share")))
        .map(|d| d.join("cordon/images"))
}

impl Store {
    /// The store at `root`, made if need be, readable by its owner only
    /// (its files keep the image's owners and modes).
    pub fn open(root: &Path) -> Result<Store, StoreError> {
        // Made private; a directory that exists keeps its mode (the user
        // may have pointed CORDON_IMAGE_STORE at one of their own).
        if !root.exists() {
            if let Some(parent) = root.parent() {
                std::fs::create_dir_all(parent)
                    .map_err(io_err(format!("making {}", parent.display())))?;
            }
            std::fs::DirBuilder::new()
                .mode(0o700)
                .create(root)
                .or_else(|e| if root.is_dir() { Ok(()) } else { Err(e) })
                .map_err(io_err(format!("making {}", root.display())))?;
        }
        for sub in [
            "blobs/sha256",
            "layers",
            "images",
            "locks",
            "tmp",
            "run",
            "flat",
        ] {
            std::fs::create_dir_all(root.join(sub))
                .map_err(io_err(format!("making {}", root.join(sub).display())))?;
        }
        let owners = if rustix::process::geteuid().is_root() {
            Owners::Keep
        } else {
            Owners::Caller
        };
        Ok(Store {
            root: root.to_path_buf(),
            owners,
        })
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The directory of an unpacked layer.
    pub fn layer_dir(&self, diff_id: &Digest) -> PathBuf {
        self.root.join("layers").join(diff_id.hex())
    }

    /// Where microVMs' flat roots of the store's images are (see
    /// [`crate::flat`]).
    pub fn flat_dir(&self) -> PathBuf {
        self.root.join("flat")
    }

    fn blob_path(&self, d: &Digest) -> PathBuf {
        self.root.join("blobs/sha256").join(d.hex())
    }

    fn record_path(&self, name: &str) -> PathBuf {
        self.root
            .join("images")
            .join(format!("{}.json", Digest::of(name.as_bytes()).hex()))
    }

    /// The image stored as `name`, if any.
    pub fn get(&self, name: &str) -> Option<Image> {
        let text = std::fs::read(self.record_path(name)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Every image, by name.
    pub fn list(&self) -> Vec<Image> {
        let Ok(dir) = std::fs::read_dir(self.root.join("images")) else {
            return Vec::new();
        };
        let mut out: Vec<Image> = dir
            .flatten()
            .filter_map(|e| serde_json::from_slice(&std::fs::read(e.path()).ok()?).ok())
            .collect();
        out.sort_by(|a, b| a.name.cmp(&b.name));
        out
    }

    /// A fresh directory under `tmp/`.
    fn scratch(&self) -> Result<tempfile::TempDir, StoreError> {
        tempfile::Builder::new()
            .prefix("work-")
            .tempdir_in(self.root.join("tmp"))
            .map_err(io_err("making a work directory in the store"))
    }

    /// Imports the image of the OCI layout `dir` tagged `tag` (none: the
    /// only one it holds) as `name`.
    pub fn import_layout(
        &self,
        dir: &Path,
        tag: Option<&str>,
        name: &str,
    ) -> Result<Image, StoreError> {
        let layout = Layout::open(dir)?;
        let index: ImageIndex = layout.json("index.json")?;
        let chosen = choose_tagged(&index, tag, dir)?;
        let manifest_desc = self.resolve_index(&layout, chosen)?;
        let manifest_bytes = self.copy_blob(&layout, &manifest_desc, MAX_JSON)?;
        let manifest: ImageManifest = parse(&manifest_bytes, "the manifest")?;
        check_layer_count(manifest.layers().len())?;
        self.copy_blob(&layout, manifest.config(), MAX_JSON)?;
        for layer in manifest.layers() {
            self.copy_blob(&layout, layer, 0)?;
        }
        self.import_blobs(&digest_of(&manifest_desc)?, name)
    }

    /// Imports the image of a `docker save` archive as `name`: one in
    /// the OCI layout newer Dockers write, or in the older form (a
    /// `manifest.json` naming a config and uncompressed layer tars).
    /// The archive is unpacked like any layer first, by the same rules.
    pub fn import_archive(&self, file: &Path, name: &str) -> Result<Image, StoreError> {
        let archive = File::open(file).map_err(io_err(format!("opening {}", file.display())))?;
        let scratch = self.scratch()?;
        unpack::unpack(
            io::BufReader::new(archive),
            scratch.path(),
            Limits::default(),
            Owners::Caller,
        )?;
        let layout = Layout::open(scratch.path())?;
        if layout.file("index.json").is_ok() {
            return self.import_layout(scratch.path(), None, name);
        }
        #[derive(Deserialize)]
        #[serde(rename_all = "PascalCase")]
        struct Saved {
            config: String,
            layers: Vec<String>,
        }
        let saved: Vec<Saved> = layout.json("manifest.json")?;
        let [saved] = <[Saved; 1]>::try_from(saved).map_err(|all| {
            invalid(format!(
                "{} holds {} images; cordon imports archives of one",
                file.display(),
                all.len()
            ))
        })?;
        check_layer_count(saved.layers.len())?;
        let put = |rel: &str, media_type: &str| -> Result<serde_json::Value, StoreError> {
            let mut w = Hashing::new(self.blob_file()?);
            io::copy(&mut layout.file(rel)?, &mut w).map_err(io_err(format!("reading {rel}")))?;
            let size = w.written;
            let (digest, tmp) = w.finish();
            self.persist_blob(tmp, &digest)?;
            Ok(
                serde_json::json!({"mediaType": media_type, "digest": digest.to_string(), "size": size}),
            )
        };
        let config = put(&saved.config, "application/vnd.oci.image.config.v1+json")?;
        let layers = saved
            .layers
            .iter()
            .map(|l| put(l, "application/vnd.oci.image.layer.v1.tar"))
            .collect::<Result<Vec<_>, _>>()?;
        let manifest = serde_json::to_vec(&serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config,
            "layers": layers,
        }))
        .expect("a manifest serialises");
        let digest = Digest::of(&manifest);
        self.put_blob(&digest, &manifest)?;
        self.import_blobs(&digest, name)
    }

    /// Whether the store holds the blob.
    /// Whether the store has the blob `d`; one it has is marked used now,
    /// so that a collection's grace counts from its last use.
    pub fn has_blob(&self, d: &Digest) -> bool {
        touch(&self.blob_path(d)) && self.blob_path(d).is_file()
    }

    /// Stores `bytes` as a blob, which must have the digest `expected`.
    pub fn put_blob(&self, expected: &Digest, bytes: &[u8]) -> Result<(), StoreError> {
        let got = Digest::of(bytes);
        if got != *expected {
            return Err(invalid(format!("blob {expected} has the digest {got}")));
        }
        let tmp = tempfile::NamedTempFile::new_in(self.root.join("tmp"))
            .map_err(io_err("making a blob file in the store"))?;
        std::fs::write(tmp.path(), bytes).map_err(io_err(format!("writing blob {got}")))?;
        self.persist_blob(tmp, &got)
    }

    /// A file under `tmp/` to fetch a blob into, then [`Store::persist_blob`].
    pub fn blob_file(&self) -> Result<tempfile::NamedTempFile, StoreError> {
        tempfile::NamedTempFile::new_in(self.root.join("tmp"))
            .map_err(io_err("making a blob file in the store"))
    }

    /// Moves a fetched and verified blob into place.
    pub fn persist_blob(
        &self,
        file: tempfile::NamedTempFile,
        digest: &Digest,
    ) -> Result<(), StoreError> {
        file.persist(self.blob_path(digest))
            .map_err(|e| StoreError::Io {
                what: format!("storing blob {digest}"),
                source: e.error,
            })?;
        Ok(())
    }

    /// A stored blob, for reading whole (a layer, for a save or a push).
    pub fn blob_reader(&self, d: &Digest) -> Result<File, StoreError> {
        File::open(self.blob_path(d)).map_err(io_err(format!("opening blob {d}")))
    }

    /// Reads a stored manifest or config.
    pub fn read_blob(&self, d: &Digest) -> Result<Vec<u8>, StoreError> {
        let mut bytes = Vec::new();
        File::open(self.blob_path(d))
            .map_err(io_err(format!("opening blob {d}")))?
            .take(MAX_JSON + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err(format!("reading blob {d}")))?;
        if bytes.len() as u64 > MAX_JSON {
            return Err(invalid(format!("blob {d} is larger than {MAX_JSON} bytes")));
        }
        Ok(bytes)
    }

    /// Holds the store's lock for `name` until the descriptor is dropped:
    /// two pulls of one image take turns, so the second finds the first's
    /// blobs and layers and downloads nothing.
    pub fn lock(&self, name: &str) -> Result<rustix::fd::OwnedFd, StoreError> {
        let path = self
            .root
            .join("locks")
            .join(Digest::of(name.as_bytes()).hex());
        let fd = rustix::fs::open(
            &path,
            OFlags::CREATE | OFlags::RDWR | OFlags::CLOEXEC | OFlags::NOFOLLOW,
            Mode::from_raw_mode(0o600),
        )
        .map_err(|e| invalid(format!("locking {}: {e}", path.display())))?;
        rustix::fs::flock(&fd, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| invalid(format!("locking {}: {e}", path.display())))?;
        Ok(fd)
    }

    /// Forgets the image stored as `name`; whether there was one. Its
    /// blobs and layers stay until [`Store::prune`].
    pub fn remove(&self, name: &str) -> Result<bool, StoreError> {
        match std::fs::remove_file(self.record_path(name)) {
            Ok(()) => Ok(true),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(false),
            Err(e) => Err(io_err(format!("removing {name}"))(e)),
        }
    }

    /// Removes the blobs and layers no image uses, and work left by
    /// pulls that died; what it freed, in bytes of files.
    pub fn prune(&self) -> Result<u64, StoreError> {
        self.prune_older_than(std::time::Duration::ZERO)
    }

    /// How long ago the record of `name` was written, if there is one.
    pub fn record_age(&self, name: &str) -> Option<std::time::Duration> {
        let modified = std::fs::metadata(self.record_path(name))
            .ok()?
            .modified()
            .ok()?;
        modified.elapsed().ok()
    }

    /// As [`Store::prune`], but keeps what was written less than `grace`
    /// ago: a server's collection runs beside pulls and builds that have
    /// written blobs and layers and not yet the record that names them.
    pub fn prune_older_than(&self, grace: std::time::Duration) -> Result<u64, StoreError> {
        let young = |p: &Path| {
            !grace.is_zero()
                && std::fs::symlink_metadata(p)
                    .and_then(|m| m.modified())
                    .ok()
                    .and_then(|t| t.elapsed().ok())
                    .is_none_or(|age| age < grace)
        };
        let mut blobs = std::collections::BTreeSet::new();
        let mut layers = std::collections::BTreeSet::new();
        let mut flats = std::collections::BTreeSet::new();
        for image in self.list() {
            let tops: Vec<String> = image.layers.iter().rev().map(Digest::hex).collect();
            flats.insert(crate::flat::key(tops.iter().map(String::as_str)));
            blobs.insert(image.manifest.hex());
            blobs.insert(image.config.hex());
            layers.extend(image.layers.iter().map(Digest::hex));
            if let Ok(bytes) = self.read_blob(&image.manifest)
                && let Ok(m) = parse::<ImageManifest>(&bytes, "the manifest")
            {
                blobs.extend(
                    m.layers()
                        .iter()
                        .filter_map(|l| digest_of(l).ok())
                        .map(|d| d.hex()),
                );
            }
        }
        let mut freed = self.prune_sandboxes(&mut layers);
        freed += crate::flat::prune(&self.flat_dir(), &flats);
        for (dir, keep) in [("blobs/sha256", &blobs), ("layers", &layers)] {
            let Ok(entries) = std::fs::read_dir(self.root.join(dir)) else {
                continue;
            };
            for e in entries.flatten() {
                if keep.contains(&*e.file_name().to_string_lossy()) || young(&e.path()) {
                    continue;
                }
                freed += remove_all(&e.path());
            }
        }
        Ok(freed)
    }

    /// Removes the writable layers under `run/` that no live sandbox
    /// holds (a sandbox killed before it could remove its own; none younger
    /// than [`SANDBOX_SETTLING`], none [`SANDBOX_SAVED`]) and adds the
    /// layers the live ones run on to `layers`, which are kept even if
    /// their image is gone; returns the bytes freed.
    fn prune_sandboxes(&self, layers: &mut std::collections::BTreeSet<String>) -> u64 {
        use rustix::fs::{FlockOperation, Mode, OFlags};
        let Ok(entries) = std::fs::read_dir(self.root.join("run")) else {
            return 0;
        };
        let mut freed = 0;
        for e in entries.flatten() {
            let path = e.path();
            let Ok(dir) = rustix::fs::open(
                &path,
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) else {
                continue;
            };
            // One just made may be between its making and its locking.
            let settled = std::fs::symlink_metadata(&path)
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= SANDBOX_SETTLING);
            let saved =
                rustix::fs::statat(&dir, SANDBOX_SAVED, rustix::fs::AtFlags::SYMLINK_NOFOLLOW)
                    .is_ok();
            if settled
                && !saved
                && rustix::fs::flock(&dir, FlockOperation::NonBlockingLockExclusive).is_ok()
            {
                freed += remove_all(&path);
                continue;
            }
            // Written by cordon when the sandbox started: names of layer
            // directories, each checked to be a digest's hex.
            let text = std::fs::read_to_string(path.join("layers")).unwrap_or_default();
            layers.extend(
                text.lines()
                    .filter(|l| l.len() == 64 && l.bytes().all(|b| b.is_ascii_hexdigit()))
                    .map(str::to_string),
            );
        }
        freed
    }

    /// Whether the layer with this diff_id is unpacked; one that is is
    /// marked used now (see [`Store::has_blob`]).
    pub fn has_layer(&self, diff_id: &Digest) -> bool {
        touch(&self.layer_dir(diff_id)) && self.layer_dir(diff_id).is_dir()
    }

    /// The blobs the manifest `manifest` (a blob the store holds) names:
    /// its config and its layers, each with the size its descriptor says.
    pub fn blobs_of_manifest(&self, manifest: &Digest) -> Result<Vec<(Digest, u64)>, StoreError> {
        let m: ImageManifest = parse(&self.read_blob(manifest)?, "the manifest")?;
        check_layer_count(m.layers().len())?;
        std::iter::once(m.config())
            .chain(m.layers())
            .map(|d| Ok((digest_of(d)?, d.size())))
            .collect()
    }

    /// Makes an image of blobs the store holds: the manifest `manifest`,
    /// its config and its layers (each unpacked unless it is already),
    /// recorded as `name` last.
    pub fn import_blobs(&self, manifest: &Digest, name: &str) -> Result<Image, StoreError> {
        // Imported before, and whole: a layout read again each run costs
        // no walk of its layers.
        if let Some(image) = self.get(name)
            && image.manifest == *manifest
            && image.layers.iter().all(|l| self.has_layer(l))
        {
            return Ok(image);
        }
        let m: ImageManifest = parse(&self.read_blob(manifest)?, "the manifest")?;
        check_layer_count(m.layers().len())?;
        let config_digest = digest_of(m.config())?;
        let config: ImageConfiguration =
            parse(&self.read_blob(&config_digest)?, "the image config")?;
        let diff_ids = diff_ids(&m, &config)?;
        let mut size = 0;
        for (layer, diff_id) in m.layers().iter().zip(&diff_ids) {
            size += self.layer(&digest_of(layer)?, diff_id)?;
        }
        let settings = config.config().as_ref();
        let image = Image {
            name: name.to_string(),
            manifest: *manifest,
            config: config_digest,
            layers: diff_ids,
            env: settings.and_then(|c| c.env().clone()).unwrap_or_default(),
            working_dir: settings.and_then(|c| c.working_dir().clone()),
            user: settings.and_then(|c| c.user().clone()),
            size,
        };
        self.record(&image)?;
        Ok(image)
    }

    /// The manifest a descriptor leads to: itself, or this machine's
    /// platform's from an index.
    fn resolve_index(&self, layout: &Layout, desc: &Descriptor) -> Result<Descriptor, StoreError> {
        if !is_index(desc.media_type()) {
            return Ok(desc.clone());
        }
        let bytes = self.copy_blob(layout, desc, MAX_JSON)?;
        let index: ImageIndex = parse(&bytes, "the image index")?;
        platform_manifest(&index).cloned().ok_or_else(|| {
            invalid(format!(
                "the image index has no image for linux/{}",
                platform_arch()
            ))
        })
    }

    /// Copies a blob of the layout into the store, verified; returns its
    /// bytes when it is at most `keep` long (manifests, configs).
    fn copy_blob(
        &self,
        layout: &Layout,
        desc: &Descriptor,
        keep: u64,
    ) -> Result<Vec<u8>, StoreError> {
        let digest = digest_of(desc)?;
        let size = desc.size();
        let dest = self.blob_path(&digest);
        if !dest.exists() {
            let mut src = layout.blob(&digest)?;
            let mut w = Hashing::new(self.blob_file()?);
            // One byte past the declared size shows a lie.
            io::copy(&mut (&mut src).take(size + 1), &mut w)
                .map_err(io_err(format!("copying blob {digest}")))?;
            if w.written != size {
                return Err(invalid(format!(
                    "blob {digest} holds {}{} bytes, not the {size} its descriptor says",
                    w.written,
                    if w.written > size { " or more" } else { "" }
                )));
            }
            let (got, file) = w.finish();
            if got != digest {
                return Err(invalid(format!("blob {digest} has the digest {got}")));
            }
            file.persist(&dest).map_err(|e| StoreError::Io {
                what: format!("storing blob {digest}"),
                source: e.error,
            })?;
        }
        if size > keep {
            return Ok(Vec::new());
        }
        std::fs::read(&dest).map_err(io_err(format!("reading blob {digest}")))
    }

    /// Makes sure the layer is unpacked; its size in bytes.
    pub(crate) fn layer(&self, digest: &Digest, diff_id: &Digest) -> Result<u64, StoreError> {
        let dir = self.layer_dir(diff_id);
        if dir.is_dir() {
            return Ok(dir_size(&dir));
        }
        let blob =
            File::open(self.blob_path(digest)).map_err(io_err(format!("opening blob {digest}")))?;
        let scratch = self.scratch()?;
        let report = unpack::unpack(
            io::BufReader::new(blob),
            scratch.path(),
            Limits::default(),
            self.owners,
        )?;
        if report.diff_id.as_ref() != Some(diff_id) {
            return Err(invalid(format!(
                "layer {digest} unpacks to {}, not the {diff_id} the config names",
                report.diff_id.map_or("nothing".into(), |d| d.to_string())
            )));
        }
        self.keep_layer(scratch, diff_id, &report)?;
        Ok(report.bytes)
    }

    /// A work directory for an unpack, and the limits and owners the
    /// store's unpacks take: what [`Store::keep_layer`] is given back.
    pub(crate) fn unpack_site(&self) -> Result<(tempfile::TempDir, Limits, Owners), StoreError> {
        Ok((self.scratch()?, Limits::default(), self.owners))
    }

    /// Moves a layer unpacked into `scratch` into place as `diff_id`.
    pub(crate) fn keep_layer(
        &self,
        scratch: tempfile::TempDir,
        diff_id: &Digest,
        report: &unpack::Report,
    ) -> Result<(), StoreError> {
        if report.setid_dropped + report.devices_skipped + report.xattrs_dropped > 0 {
            tracing::info!(
                "layer {diff_id}: set-id bits dropped on {}, device nodes left out {}, extended attributes dropped {}",
                report.setid_dropped,
                report.devices_skipped,
                report.xattrs_dropped
            );
        }
        let dir = self.layer_dir(diff_id);
        // The directory itself takes the layer root's usual mode.
        std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755))
            .map_err(io_err("finishing a layer"))?;
        let work = scratch.keep();
        match std::fs::rename(&work, &dir) {
            Ok(()) => {}
            // Another import finished the same layer first: keep theirs.
            Err(_) if dir.is_dir() => {
                let _ = std::fs::remove_dir_all(&work);
            }
            Err(e) => return Err(io_err(format!("storing layer {diff_id}"))(e)),
        }
        Ok(())
    }

    /// Writes the image's record, last, atomically.
    fn record(&self, image: &Image) -> Result<(), StoreError> {
        let text = serde_json::to_vec_pretty(image).expect("an image serialises");
        let tmp = tempfile::NamedTempFile::new_in(self.root.join("tmp"))
            .map_err(io_err("making a record in the store"))?;
        std::fs::write(tmp.path(), text).map_err(io_err("writing an image record"))?;
        tmp.persist(self.record_path(&image.name))
            .map_err(|e| StoreError::Io {
                what: "storing an image record".into(),
                source: e.error,
            })?;
        Ok(())
    }
}

/// Removes a file or a layer's tree (whose directories may be read-only,
/// and whose names came from an image: nothing is followed); the bytes of
/// files removed.
fn remove_all(path: &Path) -> u64 {
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return 0;
    };
    if !meta.is_dir() {
        let _ = std::fs::remove_file(path);
        return if meta.is_file() { meta.len() } else { 0 };
    }
    let _ = std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o700));
    let freed = std::fs::read_dir(path)
        .map(|rd| rd.flatten().map(|e| remove_all(&e.path())).sum())
        .unwrap_or(0);
    let _ = std::fs::remove_dir(path);
    freed
}

/// The sum of the sizes of a layer's regular files, for listings.
fn dir_size(dir: &Path) -> u64 {
    fn walk(p: &Path, depth: usize) -> u64 {
        let Ok(rd) = std::fs::read_dir(p) else {
            return 0;
        };
        rd.flatten()
            .map(|e| match e.file_type() {
                Ok(t) if t.is_dir() && depth < 128 => walk(&e.path(), depth + 1),
                Ok(t) if t.is_file() => e.metadata().map_or(0, |m| m.len()),
                _ => 0,
            })
            .sum()
    }
    walk(dir, 0)
}

/// This machine's architecture as OCI names it.
pub fn platform_arch() -> &'static str {
    match std::env::consts::ARCH {
        "x86_64" => "amd64",
        "aarch64" => "arm64",
        other => other,
    }
}

/// The image of `index` for this machine's platform: a manifest (not a
/// nested index) for linux on this architecture.
pub(crate) fn platform_manifest(index: &ImageIndex) -> Option<&Descriptor> {
    let arch = platform_arch();
    index.manifests().iter().find(|m| {
        !is_index(m.media_type())
            && m.platform().as_ref().is_some_and(|p| {
                p.os().to_string() == "linux" && p.architecture().to_string() == arch
            })
    })
}

pub(crate) fn is_index(m: &MediaType) -> bool {
    matches!(m, MediaType::ImageIndex)
        || m.to_string() == "application/vnd.docker.distribution.manifest.list.v2+json"
}

pub(crate) fn digest_of(desc: &Descriptor) -> Result<Digest, StoreError> {
    Digest::parse(desc.digest().as_ref()).map_err(|e| invalid(e.to_string()))
}

pub(crate) fn parse<T: serde::de::DeserializeOwned>(
    bytes: &[u8],
    what: &str,
) -> Result<T, StoreError> {
    serde_json::from_slice(bytes).map_err(|e| invalid(format!("{what} is not valid: {e}")))
}

/// The descriptor of `index` tagged `tag`, or its only one.
fn choose_tagged<'a>(
    index: &'a ImageIndex,
    tag: Option<&str>,
    dir: &Path,
) -> Result<&'a Descriptor, StoreError> {
    let manifests = index.manifests();
    match tag {
        Some(tag) => manifests
            .iter()
            .find(|m| {
                m.annotations()
                    .as_ref()
                    .and_then(|a| a.get(ANNOTATION_REF_NAME))
                    .is_some_and(|t| t == tag)
            })
            .ok_or_else(|| invalid(format!("{} holds no image tagged {tag}", dir.display()))),
        None => match manifests.as_slice() {
            [one] => Ok(one),
            [] => Err(invalid(format!("{} holds no image", dir.display()))),
            _ => Err(invalid(format!(
                "{} holds {} images: name one with oci:DIR:TAG",
                dir.display(),
                manifests.len()
            ))),
        },
    }
}

/// Refuses an image of more layers than a sandbox stacks, before any is
/// read.
pub fn check_layer_count(n: usize) -> Result<(), StoreError> {
    if n > MAX_LAYERS {
        return Err(invalid(format!(
            "the image has {n} layers; cordon takes at most {MAX_LAYERS}"
        )));
    }
    Ok(())
}

/// The config's diff_ids, checked against the manifest's layers.
fn diff_ids(
    manifest: &ImageManifest,
    config: &ImageConfiguration,
) -> Result<Vec<Digest>, StoreError> {
    let ids = config.rootfs().diff_ids();
    check_layer_count(ids.len())?;
    if ids.len() != manifest.layers().len() {
        return Err(invalid(format!(
            "the manifest has {} layers and the config {}",
            manifest.layers().len(),
            ids.len()
        )));
    }
    ids.iter()
        .map(|d| Digest::parse(d).map_err(|e| invalid(e.to_string())))
        .collect()
}

/// An OCI image layout on disk, read beneath its directory through no
/// link.
struct Layout {
    dir: rustix::fd::OwnedFd,
    shown: PathBuf,
}

impl Layout {
    fn open(dir: &Path) -> Result<Layout, StoreError> {
        // The directory the user named may be reached through their own
        // links; what is in it may not.
        let fd = rustix::fs::open(
            dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(|e| invalid(format!("cannot open {}: {e}", dir.display())))?;
        Ok(Layout {
            dir: fd,
            shown: dir.to_path_buf(),
        })
    }

    /// Opens a regular file beneath the layout.
    fn file(&self, rel: &str) -> Result<File, StoreError> {
        let fd = rustix::fs::openat2(
            &self.dir,
            rel,
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::BENEATH | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
        )
        .map_err(|e| {
            invalid(format!(
                "{}/{rel}: {e} (a layout's files must be plain files beneath it, not links)",
                self.shown.display()
            ))
        })?;
        let st = rustix::fs::fstat(&fd).map_err(|e| invalid(e.to_string()))?;
        if rustix::fs::FileType::from_raw_mode(st.st_mode) != rustix::fs::FileType::RegularFile {
            return Err(invalid(format!(
                "{}/{rel} is not a regular file",
                self.shown.display()
            )));
        }
        Ok(File::from(fd))
    }

    fn blob(&self, d: &Digest) -> Result<File, StoreError> {
        self.file(&format!("blobs/sha256/{}", d.hex()))
    }

    fn json<T: serde::de::DeserializeOwned>(&self, rel: &str) -> Result<T, StoreError> {
        let mut bytes = Vec::new();
        self.file(rel)?
            .take(MAX_JSON + 1)
            .read_to_end(&mut bytes)
            .map_err(io_err(format!("reading {rel}")))?;
        if bytes.len() as u64 > MAX_JSON {
            return Err(invalid(format!("{rel} is larger than {MAX_JSON} bytes")));
        }
        parse(&bytes, rel)
    }
}
