//! A live sandbox's root changes as a new image on top of its base: what
//! the agent installed, kept. Not its workspace, which is the user's and
//! stays where it is.
//!
//! The changes are the writable layer's upper directory, read on the host
//! by the same writer as a build step's (by descriptors, nothing followed,
//! owners mapped back to the image's). What cordon mounted or wrote to run
//! the sandbox is left out: `/dev`, `/proc`, `/tmp` and `/workspace` (its
//! own file systems), and cordon's files in `/etc`. A sandbox that is busy
//! may change a file while it is read: the file is taken at the size it had
//! when the walk reached it.

use std::path::{Path, PathBuf};

use cordon_image::store::{Image, Store};
use cordon_sandbox::{IMAGE_FILE, ImageIds, LABEL_FILE};
use rustix::fs::FileType;

use crate::view::View;

#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error("{0}")]
    Refused(String),
    #[error(transparent)]
    Store(#[from] cordon_image::store::StoreError),
}

fn refused(why: impl Into<String>) -> CommitError {
    CommitError::Refused(why.into())
}

/// The writable layer of the live sandbox labelled `label` (a session's
/// id, or a prefix of one that names one sandbox) in the store.
pub fn find_live(store: &Store, label: &str) -> Result<PathBuf, CommitError> {
    use rustix::fs::{FlockOperation, Mode, OFlags};
    let run = store.root().join("run");
    let mut found = Vec::new();
    for e in std::fs::read_dir(&run).into_iter().flatten().flatten() {
        let dir = e.path();
        let Ok(text) = std::fs::read_to_string(dir.join(LABEL_FILE)) else {
            continue;
        };
        if !(text == label || (label.len() >= 4 && text.starts_with(label))) {
            continue;
        }
        // A layer no process holds is one a killed sandbox left.
        let live = rustix::fs::open(
            &dir,
            OFlags::RDONLY | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .is_ok_and(|fd| rustix::fs::flock(&fd, FlockOperation::NonBlockingLockShared).is_err());
        if live {
            found.push((text, dir));
        }
    }
    match found.len() {
        1 => Ok(found.remove(0).1),
        0 => Err(refused(format!(
            "no running sandbox of session {label} on an image in this store \
             (a session on the host's root has nothing to commit; start it with --image)"
        ))),
        _ => Err(refused(format!(
            "{label} names {} sessions: give more of its id",
            found.len()
        ))),
    }
}

/// Commits the changes in the writable layer `dir` (of a live sandbox)
/// as the image `name`, on top of the image it started from.
pub fn commit(store: &Store, dir: &Path, name: &str) -> Result<Image, CommitError> {
    commit_upper(store, dir, &dir.join("upper"), name)
}

/// As [`commit`], with the layer's changes read from `upper` (see
/// `cordon_sandbox::Sandbox::writable_upper`): a layer on a disk is
/// mounted where only the sandbox's supervisor sees it.
pub fn commit_upper(
    store: &Store,
    dir: &Path,
    upper: &Path,
    name: &str,
) -> Result<Image, CommitError> {
    if !upper.is_dir() {
        return Err(refused(
            "the sandbox's changes are on a microVM's disk: commit is for native sandboxes",
        ));
    }
    let manifest = std::fs::read_to_string(dir.join(IMAGE_FILE))
        .map_err(|_| refused("the sandbox does not say which image it started from"))?;
    let base = store
        .list()
        .into_iter()
        .find(|i| i.manifest.to_string() == manifest.trim())
        .ok_or_else(|| {
            refused(format!(
                "the image the sandbox started from ({}) is no longer in the store",
                manifest.trim()
            ))
        })?;
    let work = upper.with_file_name("work");
    let ids = ImageIds::read_with_work(dir, &work)
        .map_err(|e| refused(format!("reading the sandbox's ids: {e}")))?;
    let mut layers = store.layers_of(&base)?;
    let config = store.config_of(&base)?;
    let view = View::open(
        &layers
            .iter()
            .rev()
            .map(|l| store.layer_dir(&l.diff_id))
            .collect::<Vec<_>>(),
    )
    .map_err(|e| refused(e.to_string()))?;
    let mut w = store.layer_writer()?;
    let generated = generated_paths(&view);
    let skip = |path: &[u8], _kind: FileType| {
        mounted(path) || generated.iter().any(|g| g.as_bytes() == path)
    };
    let map = |u, g| ids.image_ids(u, g);
    cordon_image::changes::write_changes(upper, &map, &skip, &mut w)
        .map_err(|e| refused(format!("reading the sandbox's changes: {e}")))?;
    layers.push(w.finish()?);
    Ok(store.put_image(name, config, &layers)?)
}

/// The sandbox's own file systems, mounted over the image's paths: their
/// mount points are all the writable layer has of them.
fn mounted(path: &[u8]) -> bool {
    let top = path.split(|&b| b == b'/').next().unwrap_or_default();
    matches!(top, b"dev" | b"proc" | b"tmp" | b"workspace")
}

/// What cordon writes into any image sandbox's root to run it, which is
/// not a change of the sandbox's: the mount points of `/dev` and `/proc`,
/// `/etc/hosts`, `hostname`, `resolv.conf`, its own `/etc/cordon`, and
/// `passwd` and `group` when the image (seen as `view`) had none.
pub fn generated_paths(view: &View) -> Vec<String> {
    let mut paths: Vec<String> = [
        "dev",
        "proc",
        "etc/hosts",
        "etc/hostname",
        "etc/resolv.conf",
        "etc/cordon",
    ]
    .map(String::from)
    .to_vec();
    for db in ["passwd", "group"] {
        if view
            .find(&[b"etc".to_vec(), db.as_bytes().to_vec()])
            .is_none()
        {
            paths.push(format!("etc/{db}"));
        }
    }
    paths
}
