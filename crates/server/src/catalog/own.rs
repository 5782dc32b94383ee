//! A tenant's own images in the store: the records they are kept under,
//! the quota they are kept within, their way to other processes through
//! the archive, and the collection of what no image names any more.

use cordon_image::store::{Image, Store};

use super::{DEFAULT_GRACE, Images};
use crate::http::ApiError;
use crate::job::ImageName;

/// The record a tenant's own image is kept under in the image store. It
/// starts with `@`, which no reference has, so no name a tenant gives (nor
/// any of the catalog's sources) reaches another tenant's record.
pub fn own_record(tenant: &str, name: &str) -> String {
    format!("@{tenant}/{name}")
}

/// Whether `record` is a tenant's own image's (see [`own_record`]): the
/// tenant and the name.
pub fn parse_own_record(record: &str) -> Option<(&str, &str)> {
    record.strip_prefix('@')?.split_once('/')
}

/// Where an image is made before the tenant's quota takes it: a record
/// of its own, so that a refused image replaces nothing.
pub fn pending_record(tenant: &str, name: &ImageName) -> String {
    own_record(
        tenant,
        &format!("{name}#pending-{}", crate::store::random_hex(8)),
    )
}

/// The root a sandbox's forks are made on: its image with the sandbox's
/// root changes as one more layer, kept in the store under a record of
/// its own while a fork lives (a fork's own snapshot builds on it), and
/// removed after the last.
pub struct ForkRoot {
    pub ready: super::Ready,
    _record: HeldRecord,
}

/// A fork root's record, which collections leave alone until dropped.
struct HeldRecord {
    record: String,
    store: Store,
    forks: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

impl Drop for HeldRecord {
    fn drop(&mut self) {
        self.forks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&self.record);
        // Its layers stay while a sandbox runs on them (the store's run
        // directories name them), and go at a collection after.
        if let Err(e) = self.store.remove(&self.record) {
            tracing::warn!("a fork's root {}: {e}", self.record);
        }
    }
}

/// A build under way (see [`Images::hold`]).
pub struct Hold(std::sync::Arc<std::sync::atomic::AtomicUsize>);

impl Drop for Hold {
    fn drop(&mut self) {
        self.0.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
    }
}

impl Images {
    /// Whether `tenant` may give one of its own images the name `name`:
    /// not a name the catalog already gives it, nor a digest's form.
    pub fn check_own_name(&self, tenant: &str, name: &ImageName) -> Result<(), ApiError> {
        let conflict =
            |why: String| ApiError::new(axum::http::StatusCode::CONFLICT, "name_taken", why);
        if name.as_str().starts_with("sha256:") {
            return Err(ApiError::bad_request(
                "an image's name may not be a digest: jobs name an image by its digest anyway",
            ));
        }
        // `#` marks the store's records of images being made.
        if name.as_str().contains('#') {
            return Err(ApiError::bad_request("an image's name may not contain `#`"));
        }
        if self.catalog.source(tenant, name.as_str()).is_ok() {
            return Err(conflict(format!(
                "{} is a name this server's catalog offers you: choose another",
                cordon_tools::printable(name.as_str())
            )));
        }
        Ok(())
    }

    /// Records `image`, just made under a [`pending_record`], as the
    /// tenant's `name` if its quota allows, and moves it to the name's
    /// record; the pending record goes either way.
    pub async fn keep(
        &self,
        db: &crate::store::Store,
        tenant: &str,
        name: &ImageName,
        image: Image,
        origin: crate::store::ImageOrigin,
    ) -> Result<crate::store::OwnImage, ApiError> {
        let put = db
            .put_own_image(
                tenant,
                name.as_str(),
                &image.manifest.to_string(),
                image.size,
                &origin,
                self.catalog.quota,
            )
            .await;
        let store = self.store()?.clone();
        let record = own_record(tenant, name.as_str());
        let kept = put.is_ok();
        let image_manifest = image.manifest;
        let moved = tokio::task::spawn_blocking(move || {
            let moved = if kept {
                store.import_blobs(&image.manifest, &record).map(|_| ())
            } else {
                Ok(())
            };
            let _ = store.remove(&image.name);
            moved
        })
        .await;
        match put {
            Ok(own) => {
                moved
                    .map_err(ApiError::internal)?
                    .map_err(ApiError::internal)?;
                if let Some(archive) = &self.archive {
                    // The other processes' way to it; this one has it.
                    let store = self.store()?;
                    if let Err(e) = archive.put_image(store, &image_manifest).await {
                        tracing::warn!(image = %own.name, "not shared through the archive: {e}");
                    }
                }
                Ok(own)
            }
            Err(crate::store::StoreError::Refused(why)) => Err(ApiError::new(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "quota_exceeded",
                why,
            )),
            Err(e) => Err(e.into()),
        }
    }

    /// What a build of `tenant`'s may start `FROM`: a name the catalog
    /// offers it, or one of its own images (`own`, as listed when the
    /// build began) by name or digest; the source each is obtained from.
    pub fn bases(
        &self,
        tenant: &str,
        own: Vec<crate::store::OwnImage>,
    ) -> impl Fn(&str) -> Result<String, String> + Send + Sync + use<> {
        let (catalog, tenant) = (self.catalog.clone(), tenant.to_string());
        move |name: &str| {
            if let Ok(source) = catalog.source(&tenant, name) {
                return Ok(source);
            }
            let mine = own
                .iter()
                .find(|o| o.name == name || (name.starts_with("sha256:") && o.digest == name));
            match mine {
                Some(o) => Ok(own_record(&tenant, &o.name)),
                None => Err(format!(
                    "not an image you may build from: {} (GET /v1/images lists them)",
                    catalog.offered(&tenant).join(", ")
                )),
            }
        }
    }

    /// A tenant's image as this process's store has it, brought from the
    /// archive first if it lacks it (one download however many jobs wait:
    /// they take the store's lock for it in turn).
    pub(super) async fn own_here(
        &self,
        store: &Store,
        record: &str,
        digest: &str,
    ) -> Result<Image, String> {
        let here = |s: &Store| {
            s.get(record)
                .filter(|i| i.name == record && i.manifest.to_string() == digest)
        };
        if let Some(image) = here(store) {
            return Ok(image);
        }
        let Some(archive) = &self.archive else {
            return Err(
                "it was made by another of this server's processes, and the \
                        deployment has no archive to share it through"
                    .into(),
            );
        };
        let manifest: cordon_image::Digest = digest
            .parse()
            .map_err(|e| format!("its digest {digest}: {e}"))?;
        let _lock = {
            let (store, record) = (store.clone(), record.to_string());
            tokio::task::spawn_blocking(move || store.lock(&record))
                .await
                .map_err(|e| e.to_string())?
                .map_err(|e| e.to_string())?
        };
        if let Some(image) = here(store) {
            return Ok(image);
        }
        archive
            .get_image(store, &manifest, record)
            .await
            .map_err(|e| e.to_string())
    }

    /// The root for forks of `tenant`'s sandbox `parent`: the changes in
    /// its writable layer (`dir`, `upper`: hostile, read as a commit
    /// reads them) on the image it started from, and its user.
    pub async fn fork_root(
        &self,
        tenant: &str,
        parent: &str,
        dir: std::path::PathBuf,
        upper: std::path::PathBuf,
        account: cordon_image::root::Account,
    ) -> Result<ForkRoot, String> {
        let store = self.store().map_err(|e| e.message().to_string())?.clone();
        // `#` marks a record no tenant can name; a killed server's is
        // collected as a pending one is.
        let record = own_record(
            tenant,
            &format!("#fork-{parent}-{}", crate::store::random_hex(8)),
        );
        self.forks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(record.clone());
        // From here on, a failure lets go of the record with the guard.
        let held = HeldRecord {
            record: record.clone(),
            store: store.clone(),
            forks: self.forks.clone(),
        };
        let (image, root) = tokio::task::spawn_blocking(move || {
            let image = cordon_build::commit::commit_upper(&store, &dir, &upper, &record)
                .map_err(|e| e.to_string())?;
            let root = store
                .sandbox_root(&image, None)
                .map_err(|e| e.to_string())?;
            Ok::<_, String>((image, root))
        })
        .await
        .map_err(|e| e.to_string())??;
        Ok(ForkRoot {
            ready: super::Ready {
                image,
                root: root.into(),
                account,
            },
            _record: held,
        })
    }

    /// Keeps collections from removing unnamed layers until dropped: held
    /// by a build while it runs.
    pub fn hold(&self) -> Hold {
        self.building
            .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        Hold(self.building.clone())
    }

    /// One garbage collection of the store: the records of tenants' images
    /// the database no longer names (deleted, or replaced, through another
    /// process) are forgotten, then the blobs and layers no record names
    /// are removed, but for those used within the grace period and the
    /// layers a running sandbox is on. Bytes freed.
    pub async fn collect(&self, db: &crate::store::Store) -> Result<u64, String> {
        let Some(store) = self.store.clone() else {
            return Ok(0);
        };
        let named: std::collections::BTreeSet<(String, String)> = db
            .all_own_images()
            .await
            .map_err(|e| e.to_string())?
            .into_iter()
            .map(|(tenant, name, digest)| (own_record(&tenant, &name), digest))
            .collect();
        let grace = self.catalog.grace.unwrap_or(DEFAULT_GRACE);
        let building = self.building.clone();
        let forks = self.forks.clone();
        tokio::task::spawn_blocking(move || {
            for image in store.list() {
                if parse_own_record(&image.name).is_none()
                    || named.contains(&(image.name.clone(), image.manifest.to_string()))
                    || forks
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .contains(&image.name)
                {
                    continue;
                }
                // A pending record (an image being made) is young.
                if store
                    .record_age(&image.name)
                    .is_some_and(|age| age >= grace)
                {
                    store.remove(&image.name).map_err(|e| e.to_string())?;
                }
            }
            if building.load(std::sync::atomic::Ordering::SeqCst) > 0 {
                return Ok(0);
            }
            store.prune_older_than(grace).map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| e.to_string())?
    }
}
