//! A reference as the front ends take it, made a stored image: what the
//! CLI's `--image` and the server's jobs and sessions share.
//!
//! A registry's tag is what was pulled until it is pulled again (as every
//! OCI tool keeps it); a layout or archive on disk is read again each time,
//! as it may have changed, and only what the store lacks is unpacked.
//! Concurrent callers of one name wait on the store's lock for it, so an
//! image is downloaded once.

use crate::auth::Sources;
use crate::reference::ImageRef;
use crate::registry::{self, Progress};
use crate::store::{Image, Store, StoreError, invalid};

/// What obtaining an image reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The store lacks this registry image: it is being pulled.
    Pulling { name: String },
    /// Of the pull under way.
    Pull(Progress),
}

/// The stored image `reference` names, pulled or imported first when the
/// store lacks it (or, for a layout or archive, always, keeping what it
/// has); registry credentials from `credentials`.
pub async fn obtain(
    store: &Store,
    reference: &str,
    credentials: &Sources,
    step: &(dyn Fn(Step) + Send + Sync),
) -> Result<Image, StoreError> {
    if !ImageRef::names_a_file(reference)
        && let Some(image) = stored(store, reference)
    {
        return Ok(image);
    }
    let parsed: ImageRef = reference.parse().map_err(|e| invalid(format!("{e}")))?;
    fetch(store, &parsed, credentials, step).await
}

/// What the store holds for `reference` now, fetching nothing: the image
/// stored under the very name given (found without a parse, which takes
/// longer than the rest of a sandbox's start), or else under the name the
/// reference parses to (`debian` is `docker.io/library/debian:latest`).
pub fn stored(store: &Store, reference: &str) -> Option<Image> {
    store
        .get(reference)
        .filter(|i| i.name == reference)
        .or_else(|| store.get(&reference.parse::<ImageRef>().ok()?.to_string()))
}

/// Fetches `reference` into the store whether or not it has it: a pull
/// from its registry, or an import of its layout or archive.
pub async fn fetch(
    store: &Store,
    reference: &ImageRef,
    credentials: &Sources,
    step: &(dyn Fn(Step) + Send + Sync),
) -> Result<Image, StoreError> {
    let name = reference.to_string();
    let blocking = |f: Box<dyn FnOnce(Store) -> Result<Image, StoreError> + Send>| {
        let store = store.clone();
        async move {
            tokio::task::spawn_blocking(move || f(store))
                .await
                .map_err(|e| invalid(e.to_string()))?
        }
    };
    match reference {
        ImageRef::Registry(r) => {
            step(Step::Pulling { name: name.clone() });
            let creds = credentials.for_registry(r.registry(), r.repository());
            registry::pull(store, reference, creds, &|p| step(Step::Pull(p)))
                .await
                .map_err(|e| match e {
                    StoreError::Invalid(why) if why.contains("Not authorized") => invalid(format!(
                        "{why}\n  log in with `podman login`, `skopeo login` or `docker login`: \
                         cordon reads the credentials they save (docs/images.md)"
                    )),
                    e => e,
                })
        }
        ImageRef::Layout { dir, tag } => {
            let (dir, tag) = (dir.clone(), tag.clone());
            blocking(Box::new(move |s| {
                s.import_layout(&dir, tag.as_deref(), &name)
            }))
            .await
        }
        ImageRef::DockerArchive(file) => {
            let file = file.clone();
            blocking(Box::new(move |s| s.import_archive(&file, &name))).await
        }
    }
}
