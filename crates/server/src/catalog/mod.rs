//! The images tenants' jobs and sessions may run in: the operator's
//! catalog, what each tenant may name from it, and a name made a
//! sandbox's root by the process that runs it.
//!
//! A tenant names an image; only the operator says where it comes from.
//! A name is one the catalog lists (`--image NAME=SOURCE`, where SOURCE may
//! be a registry reference, or a layout or archive on the server's disk),
//! the default image, or a registry reference under a repository the
//! operator opened (`--image HOST/PATH/*`), pulled on first use with the
//! server's credentials. So a tenant never makes the server read a file of
//! its own disk (`oci:` and `docker-archive:` are the operator's to write)
//! nor fetch from a registry the operator did not list: a pull is a
//! request the server makes on the tenant's behalf.
//!
//! A tenant also names its own images (pulled, built, snapshotted through
//! the images resource), by name or digest, after the catalog's names: a row
//! of the database each, and a record of the store under
//! [`own_record`], which no reference spells and which names the tenant.
//! Their bytes count against the operator's quota, and a collection
//! removes what no image names once a grace period has passed.

use std::collections::BTreeMap;

use cordon_image::ImageRef;
use cordon_image::store::{Image, Store};
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::ApiError;
use crate::job::ImageName;

mod own;
pub use own::{ForkRoot, Hold, own_record, parse_own_record, pending_record};

/// One entry of the operator's catalog, as `--image` takes it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CatalogEntry {
    /// `NAME=SOURCE`, or a reference offered as its own name.
    Named { name: String, source: String },
    /// `HOST/PATH/*`: any image of a repository under this path of a
    /// registry, named by its reference. Held normalised (`HOST/PATH`).
    Under { prefix: String },
}

impl CatalogEntry {
    /// `NAME=SOURCE`, `HOST/PATH/*` or `REFERENCE`.
    pub fn parse(s: &str) -> Result<CatalogEntry, String> {
        let s = s.trim();
        if let Some((name, source)) = s.split_once('=') {
            let name = ImageName::try_from(name.trim().to_string())?;
            let source = source.trim();
            source
                .parse::<ImageRef>()
                .map_err(|e| format!("{}: {e}", name.as_str()))?;
            return Ok(CatalogEntry::Named {
                name: name.into(),
                source: source.to_string(),
            });
        }
        if let Some(prefix) = s.strip_suffix("/*") {
            return Ok(CatalogEntry::Under {
                prefix: normalised_prefix(prefix)?,
            });
        }
        let name = ImageName::try_from(s.to_string())?;
        s.parse::<ImageRef>().map_err(|e| e.to_string())?;
        Ok(CatalogEntry::Named {
            name: name.into(),
            source: s.to_string(),
        })
    }

    /// How a tenant's list names this entry.
    fn key(&self) -> String {
        match self {
            CatalogEntry::Named { name, .. } => name.clone(),
            CatalogEntry::Under { prefix } => format!("{prefix}/*"),
        }
    }
}

/// `HOST/PATH` as references under it are written, so `library/*` and
/// `docker.io/library/*` are one prefix.
fn normalised_prefix(prefix: &str) -> Result<String, String> {
    const PROBE: &str = "cordon-probe";
    let bad = || {
        format!(
            "{prefix}/*: expected a registry and a repository path before /*, such as \
             registry.example:5000/team/*"
        )
    };
    if prefix.is_empty() || prefix.contains(['@', '*']) {
        return Err(bad());
    }
    match format!("{prefix}/{PROBE}").parse::<ImageRef>() {
        Ok(ImageRef::Registry(r)) => {
            let whole = format!("{}/{}", r.registry(), r.repository());
            whole
                .strip_suffix(&format!("/{PROBE}"))
                .map(str::to_string)
                .ok_or_else(bad)
        }
        _ => Err(bad()),
    }
}

/// The operator's catalog, as configured.
#[derive(Debug, Clone, Default)]
pub struct ImageCatalog {
    pub entries: Vec<CatalogEntry>,
    /// Tenants offered only some entries (by name, or `HOST/PATH/*`)
    /// instead of all; an empty list offers none but the default.
    pub tenants: BTreeMap<String, Vec<String>>,
    /// The image (a SOURCE) of every job and session that names none, and
    /// offered to every tenant under that name. None: the host's root.
    pub default: Option<String>,
    /// Bytes a tenant's own images (pulled, built, snapshotted) may come
    /// to; none: no limit.
    pub quota: Option<u64>,
    /// How long what no image names any more is kept before a collection
    /// removes it; none: [`DEFAULT_GRACE`].
    pub grace: Option<std::time::Duration>,
}

/// How long an unused layer is kept by default: longer than any pull or
/// build that has written it and not yet the record that names it.
pub const DEFAULT_GRACE: std::time::Duration = std::time::Duration::from_secs(3600);

/// Why a tenant may not use a name.
fn refused(name: &str, offered: &[String]) -> ApiError {
    let list = if offered.is_empty() {
        "none".to_string()
    } else {
        offered.join(", ")
    };
    ApiError::new(
        axum::http::StatusCode::FORBIDDEN,
        "forbidden",
        format!(
            "image {} is not one this server offers you; it offers: {list} (GET /v1/images)",
            cordon_tools::printable(name)
        ),
    )
}

impl ImageCatalog {
    /// Checks every entry and the tenants' lists against them.
    pub fn validate(&self) -> Result<(), String> {
        if let Some(d) = &self.default {
            // It is also the name jobs record: a name's form, too.
            ImageName::try_from(d.clone()).map_err(|e| format!("the default image: {e}"))?;
            d.parse::<ImageRef>()
                .map_err(|e| format!("the default image: {e}"))?;
        }
        let keys: Vec<String> = self.entries.iter().map(CatalogEntry::key).collect();
        for (tenant, names) in &self.tenants {
            for n in names {
                if !keys.contains(n) {
                    return Err(format!(
                        "tenant {tenant}'s image {n} is not in the catalog (give it with --image)"
                    ));
                }
            }
        }
        Ok(())
    }

    /// Whether any image can be asked for: if not, no store is opened.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty() && self.default.is_none()
    }

    fn offered_to<'a>(&'a self, tenant: &str) -> impl Iterator<Item = &'a CatalogEntry> {
        let only = self.tenants.get(tenant);
        self.entries
            .iter()
            .filter(move |e| only.is_none_or(|o| o.contains(&e.key())))
    }

    /// What `tenant` may name, as a list shows it, the default first;
    /// with each name's source (none for `HOST/PATH/*`).
    fn offered_sources(&self, tenant: &str) -> Vec<(String, Option<&str>)> {
        let mut out: Vec<(String, Option<&str>)> = self
            .default
            .iter()
            .map(|d| (d.clone(), Some(d.as_str())))
            .collect();
        for e in self.offered_to(tenant) {
            let k = e.key();
            if !out.iter().any(|(n, _)| *n == k) {
                let source = match e {
                    CatalogEntry::Named { source, .. } => Some(source.as_str()),
                    CatalogEntry::Under { .. } => None,
                };
                out.push((k, source));
            }
        }
        out
    }

    /// What `tenant` may name, as a list shows it: the default first.
    pub fn offered(&self, tenant: &str) -> Vec<String> {
        self.offered_sources(tenant)
            .into_iter()
            .map(|(name, _)| name)
            .collect()
    }

    /// The source of `name` as a pool of the operator's names it: the
    /// default, or a named entry (whichever tenants it is offered to).
    pub fn pooled_source(&self, name: &str) -> Result<String, String> {
        if self.default.as_deref() == Some(name) {
            return Ok(name.to_string());
        }
        self.entries
            .iter()
            .find_map(|e| match e {
                CatalogEntry::Named { name: n, source } if n == name => Some(source.clone()),
                _ => None,
            })
            .ok_or_else(|| {
                "a pool's image must be the default image or one named by `--image NAME=SOURCE`"
                    .to_string()
            })
    }

    /// The source `name` stands for, if `tenant` may use it: the
    /// reference or path the server obtains it from.
    pub fn source(&self, tenant: &str, name: &str) -> Result<String, ApiError> {
        if self.default.as_deref() == Some(name) {
            return Ok(name.to_string());
        }
        let mut under = Vec::new();
        for e in self.offered_to(tenant) {
            match e {
                CatalogEntry::Named { name: n, source } if n == name => {
                    return Ok(source.clone());
                }
                CatalogEntry::Named { .. } => {}
                CatalogEntry::Under { prefix } => under.push(prefix),
            }
        }
        // Only a registry's reference may fall under a prefix: never a
        // path on the server's disk (`oci:`, `docker-archive:`).
        if !under.is_empty()
            && let Ok(ImageRef::Registry(r)) = name.parse::<ImageRef>()
        {
            let repo = format!("{}/{}", r.registry(), r.repository());
            if under.iter().any(|p| {
                repo.strip_prefix(p.as_str())
                    .is_some_and(|rest| rest.starts_with('/'))
            }) {
                return Ok(r.whole());
            }
        }
        Err(refused(name, &self.offered(tenant)))
    }
}

/// An image in the catalog as `GET /v1/images` lists it.
#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct OfferedImage {
    /// What a job or session names it by (`HOST/PATH/*`: any reference
    /// under that path).
    pub name: String,
    /// Whether jobs and sessions that name none get it.
    pub default: bool,
    /// What this server's store holds for it now; none: pulled or
    /// imported when first used.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub stored: Option<StoredImage>,
}

#[derive(Debug, Clone, Serialize, ToSchema)]
pub struct StoredImage {
    /// The manifest's digest.
    pub digest: String,
    /// Bytes of its layers, unpacked.
    pub size: u64,
    pub layers: usize,
}

/// The catalog with the store it is obtained into: what the runner and
/// the sessions make roots with.
#[derive(Debug, Clone)]
pub struct Images {
    catalog: ImageCatalog,
    /// None when the server keeps no images: no store is opened.
    store: Option<Store>,
    /// Where tenants' images go for the other processes of a deployment,
    /// and come from when this one lacks them.
    archive: Option<std::sync::Arc<crate::archive::Archive>>,
    /// Builds running in this process: their finished steps' layers are
    /// named by no record until the build ends, so no collection removes
    /// unnamed layers meanwhile, however long the build takes.
    building: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    /// The records of forks' roots whose sandboxes live (see
    /// [`Images::fork_root`]): no collection removes them.
    forks: std::sync::Arc<std::sync::Mutex<std::collections::HashSet<String>>>,
}

/// A name made ready to be a sandbox's root.
#[derive(Debug)]
pub struct Ready {
    pub image: Image,
    pub root: cordon_sandbox::RootImage,
    /// Whom commands run as: the image's `User`, named by its passwd.
    pub account: cordon_image::root::Account,
}

/// What a name a tenant gives stands for.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Resolved {
    /// A source of the catalog's (a reference or an operator's path).
    Catalog(String),
    /// The tenant's own image: its store record and manifest digest.
    Own { record: String, digest: String },
}

impl Images {
    /// The catalog over the store at `root` (made if need be). `None`
    /// keeps no images at all: every job and session runs on the host's
    /// root, and tenants can make no images of their own.
    pub fn open(catalog: ImageCatalog, root: Option<&std::path::Path>) -> Result<Images, String> {
        catalog.validate()?;
        let store = match root {
            None if catalog.is_empty() => None,
            None => {
                return Err(
                    "the image catalog needs a store: set CORDON_IMAGE_STORE or HOME".into(),
                );
            }
            Some(r) => Some(Store::open(r).map_err(|e| e.to_string())?),
        };
        Ok(Images {
            catalog,
            store,
            archive: None,
            building: Default::default(),
            forks: Default::default(),
        })
    }

    /// Shares tenants' images through `archive` (see
    /// `crate::archive::Archive::put_image`).
    pub fn with_archive(
        mut self,
        archive: Option<std::sync::Arc<crate::archive::Archive>>,
    ) -> Self {
        self.archive = archive;
        self
    }

    pub fn catalog(&self) -> &ImageCatalog {
        &self.catalog
    }

    /// The image store, if this server keeps images.
    pub fn store(&self) -> Result<&Store, ApiError> {
        self.store.as_ref().ok_or_else(|| {
            ApiError::new(
                axum::http::StatusCode::CONFLICT,
                "no_image_store",
                "this server keeps no images (its operator set no image store)",
            )
        })
    }

    /// What `name` stands for to `tenant`: the catalog's names first, then
    /// the tenant's own images by name or digest, then a digest of an
    /// image the catalog offers.
    async fn resolve(
        &self,
        db: &crate::store::Store,
        tenant: &str,
        name: &str,
    ) -> Result<Resolved, ApiError> {
        let refused = match self.catalog.source(tenant, name) {
            Ok(source) => return Ok(Resolved::Catalog(source)),
            Err(e) => e,
        };
        if self.store.is_some()
            && let Some(own) = db.own_image(tenant, name).await?
        {
            return Ok(Resolved::Own {
                record: own_record(tenant, &own.name),
                digest: own.digest,
            });
        }
        if name.starts_with("sha256:")
            && let Some(store) = &self.store
        {
            let offered: Vec<String> = self
                .catalog
                .offered_sources(tenant)
                .into_iter()
                .filter_map(|(_, source)| source.map(str::to_string))
                .collect();
            let (store, digest) = (store.clone(), name.to_string());
            let found = tokio::task::spawn_blocking(move || {
                offered.into_iter().find(|source| {
                    cordon_image::obtain::stored(&store, source)
                        .is_some_and(|image| image.manifest.to_string() == digest)
                })
            })
            .await
            .ok()
            .flatten();
            if let Some(source) = found {
                return Ok(Resolved::Catalog(source));
            }
        }
        Err(refused)
    }

    /// What a job or session of `tenant` runs in when it asked for
    /// `asked`: the name, checked, or the default; `None`: the host root.
    pub async fn choose(
        &self,
        db: &crate::store::Store,
        tenant: &str,
        asked: Option<&ImageName>,
    ) -> Result<Option<ImageName>, ApiError> {
        match asked {
            Some(n) => {
                self.resolve(db, tenant, n.as_str()).await?;
                Ok(Some(n.clone()))
            }
            None => Ok(self
                .catalog
                .default
                .clone()
                .and_then(|d| ImageName::try_from(d).ok())),
        }
    }

    /// The registry reference `tenant` may pull as its own image: one the
    /// catalog offers it, from a registry (never a file of the server's).
    pub fn pullable(&self, tenant: &str, reference: &str) -> Result<String, ApiError> {
        let source = self.catalog.source(tenant, reference)?;
        match source.parse::<cordon_image::ImageRef>() {
            Ok(cordon_image::ImageRef::Registry(r)) => Ok(r.whole()),
            _ => Err(ApiError::bad_request(format!(
                "{} is not in a registry: it is already one of this server's images, name it \
                 in a job as it is",
                cordon_tools::printable(reference)
            ))),
        }
    }

    /// The catalog as `tenant` sees it, with what the store holds.
    pub fn list(&self, tenant: &str) -> Vec<OfferedImage> {
        self.catalog
            .offered_sources(tenant)
            .into_iter()
            .map(|(name, source)| {
                let stored = self.store.as_ref().zip(source).and_then(|(s, source)| {
                    let image = cordon_image::obtain::stored(s, source)?;
                    Some(StoredImage {
                        digest: image.manifest.to_string(),
                        size: image.size,
                        layers: image.layers.len(),
                    })
                });
                OfferedImage {
                    default: self.catalog.default.as_deref() == Some(name.as_str()),
                    name,
                    stored,
                }
            })
            .collect()
    }

    /// The server's default image, if it has one.
    pub fn default_image(&self) -> Option<ImageName> {
        self.catalog
            .default
            .clone()
            .and_then(|d| ImageName::try_from(d).ok())
    }

    /// The source a pool of `name` is made from (see
    /// [`ImageCatalog::pooled_source`]); an error if no pool can be.
    pub fn pooled_source(&self, name: &ImageName) -> Result<String, String> {
        self.store.as_ref().ok_or("this server keeps no images")?;
        self.catalog.pooled_source(name.as_str())
    }

    /// `name` made ready for a pooled sandbox: no tenant's yet, so only
    /// what [`Images::pooled_source`] allows. A job that takes it is
    /// checked as its own when it runs ([`Images::ready`]), and runs in
    /// it only if the digests agree.
    pub async fn ready_pooled(&self, name: &ImageName) -> Result<Ready, String> {
        let source = self.pooled_source(name)?;
        self.ready_resolved(Resolved::Catalog(source), name).await
    }

    /// `name` made ready for a sandbox of `tenant`: checked against the
    /// catalog and the tenant's images as they are now, obtained (pulled or
    /// imported if the store lacks it; concurrent callers download it
    /// once), and its root with the image's own user.
    pub async fn ready(
        &self,
        db: &crate::store::Store,
        tenant: &str,
        name: &ImageName,
    ) -> Result<Ready, String> {
        let resolved = self
            .resolve(db, tenant, name.as_str())
            .await
            .map_err(|e| e.message().to_string())?;
        self.ready_resolved(resolved, name).await
    }

    async fn ready_resolved(&self, resolved: Resolved, name: &ImageName) -> Result<Ready, String> {
        let store = self.store.as_ref().ok_or("this server keeps no images")?;
        let shown = cordon_tools::printable(name.as_str()).to_string();
        let image = match resolved {
            Resolved::Catalog(source) => cordon_image::obtain::obtain(
                store,
                &source,
                &cordon_image::auth::Sources::from_env(),
                &|step| tracing::debug!(image = %shown, "{step:?}"),
            )
            .await
            .map_err(|e| format!("image {shown}: {e}"))?,
            Resolved::Own { record, digest } => self
                .own_here(store, &record, &digest)
                .await
                .map_err(|e| format!("image {shown}: {e}"))?,
        };
        let (store, for_root) = (store.clone(), image.clone());
        let root = tokio::task::spawn_blocking(move || {
            let root = store.sandbox_root(&for_root, None)?;
            let account = cordon_image::root::account(&root.layers, root.uid, root.gid);
            Ok::<_, cordon_image::store::StoreError>((root, account))
        })
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| format!("image {shown}: {e}"))?;
        let (root, account) = root;
        Ok(Ready {
            image,
            root: root.into(),
            account,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog(entries: &[&str]) -> ImageCatalog {
        ImageCatalog {
            entries: entries
                .iter()
                .map(|e| CatalogEntry::parse(e).unwrap())
                .collect(),
            ..Default::default()
        }
    }

    #[test]
    fn a_tenant_names_only_what_the_operator_offers() {
        let mut c = catalog(&[
            "seeds=oci:/var/cache/cordon/environments/seeds",
            "debian:bookworm",
            "127.0.0.1:5000/team/*",
        ]);
        assert_eq!(
            c.source("t", "seeds").unwrap(),
            "oci:/var/cache/cordon/environments/seeds"
        );
        assert_eq!(c.source("t", "debian:bookworm").unwrap(), "debian:bookworm");
        assert_eq!(
            c.source("t", "127.0.0.1:5000/team/app:1").unwrap(),
            "127.0.0.1:5000/team/app:1"
        );
        assert_eq!(
            c.source("t", "127.0.0.1:5000/team/deep/app@sha256:0000000000000000000000000000000000000000000000000000000000000000")
                .unwrap(),
            "127.0.0.1:5000/team/deep/app@sha256:0000000000000000000000000000000000000000000000000000000000000000"
        );
        for denied in [
            // A file of the server's, however spelled.
            "oci:/var/cache/cordon/environments/seeds",
            "oci:/etc",
            "docker-archive:/etc/shadow",
            // Not listed, or beside the opened path.
            "debian:trixie",
            "127.0.0.1:5000/teammate/app",
            "127.0.0.1:5000/team",
            "127.0.0.1:5001/team/app",
            "169.254.169.254/team/app",
            "127.0.0.1:5000/team/../x/app",
        ] {
            let e = c.source("t", denied).unwrap_err();
            assert_eq!(e.status(), axum::http::StatusCode::FORBIDDEN, "{denied}");
            assert!(e.message().contains("GET /v1/images"), "{denied}");
        }
        // A tenant's own list replaces the catalog; the default is everyone's.
        c.tenants.insert("narrow".into(), vec!["seeds".into()]);
        c.default = Some("debian:bookworm".into());
        assert!(c.source("narrow", "seeds").is_ok());
        assert!(c.source("narrow", "debian:bookworm").is_ok());
        assert!(c.source("narrow", "127.0.0.1:5000/team/app").is_err());
        assert_eq!(c.offered("narrow"), ["debian:bookworm", "seeds"]);
        assert_eq!(
            c.offered("t"),
            ["debian:bookworm", "seeds", "127.0.0.1:5000/team/*"]
        );
        c.validate().unwrap();
        c.tenants.insert("typo".into(), vec!["sedes".into()]);
        assert!(c.validate().unwrap_err().contains("sedes"));
        c.tenants.remove("typo");
        // A default no job could record is refused, not dropped for the
        // host's root.
        c.default = Some("oci:/srv/my image".into());
        assert!(c.validate().unwrap_err().contains("the default image"));
    }

    #[test]
    fn entries_are_checked_when_given() {
        assert_eq!(
            CatalogEntry::parse("library/*").unwrap(),
            CatalogEntry::parse("docker.io/library/*").unwrap()
        );
        for bad in [
            "",
            "a b=debian",
            "x=",
            "*/*",
            "/*",
            "oci:/x/*",
            "x=not a ref",
        ] {
            assert!(CatalogEntry::parse(bad).is_err(), "{bad:?}");
        }
    }
}
