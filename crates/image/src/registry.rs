//! Pulling an image from a registry into the store.
//!
//! The transport is `oci-client`'s; what it fetches is checked here as
//! well: a blob is written under the store's `tmp/` through a writer that
//! stops past the size its descriptor declares and hashes what it writes,
//! must have its digest, and is moved into place only then. Blobs are asked for by
//! digest alone, so a descriptor's foreign `urls` are never fetched.
//! Layers already unpacked are not fetched again, and two pulls of one
//! image take turns on the store's lock, so the second downloads nothing.

use std::pin::Pin;
use std::task::{Context, Poll};

use oci_client::client::{ClientConfig, ClientProtocol};
use oci_client::secrets::RegistryAuth;
use oci_client::{Client, Reference};
use oci_spec::image::{ImageConfiguration, ImageIndex, ImageManifest};
use serde::Deserialize;
use tokio::io::AsyncWrite;

use crate::auth::Credentials;
use crate::digest::{Digest, Hasher};
use crate::reference::ImageRef;
use crate::store::{
    self, Image, MAX_JSON, Store, StoreError, digest_of, invalid, parse, platform_arch,
    platform_manifest,
};

/// What a pull reports as it goes, for a terminal's progress lines.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// A layer is being downloaded (`size` bytes).
    Fetching {
        digest: Digest,
        size: u64,
    },
    Fetched {
        digest: Digest,
    },
    /// A layer the store already holds.
    Present {
        digest: Digest,
    },
    /// Every blob is in; the layers are being unpacked.
    Unpacking,
}

/// The manifest kinds asked for: OCI's and Docker's, single and lists.
const ACCEPT: &[&str] = &[
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.docker.distribution.manifest.v2+json",
];

/// Enough of a manifest to tell an index from an image manifest.
#[derive(Deserialize)]
struct Peek {
    #[serde(default, rename = "mediaType")]
    media_type: Option<String>,
    #[serde(default)]
    manifests: Option<serde::de::IgnoredAny>,
}

/// Pulls `reference` (a registry reference) into `store`, as its own
/// name, with `credentials`; `progress` hears of each layer.
pub async fn pull(
    store: &Store,
    reference: &ImageRef,
    credentials: Credentials,
    progress: &(dyn Fn(Progress) + Send + Sync),
) -> Result<Image, StoreError> {
    let ImageRef::Registry(r) = reference else {
        return Err(invalid(format!("{reference} is not in a registry")));
    };
    let name = reference.to_string();
    let lock = {
        let (store, name) = (store.clone(), name.clone());
        tokio::task::spawn_blocking(move || store.lock(&name))
            .await
            .map_err(|e| invalid(e.to_string()))??
    };
    let (client, auth) = client(reference, r, credentials);
    let fail = |what: &str, e: oci_client::errors::OciDistributionError| {
        invalid(format!("{what} from {}: {e}", r.registry()))
    };

    let (mut bytes, _) = client
        .pull_manifest_raw(r, &auth, ACCEPT)
        .await
        .map_err(|e| fail("fetching the manifest", e))?;
    check_json_size(&bytes)?;
    let mut manifest_digest = Digest::of(&bytes);
    if let Some(wanted) = r.digest() {
        let wanted = Digest::parse(wanted).map_err(|e| invalid(e.to_string()))?;
        if wanted != manifest_digest {
            return Err(invalid(format!(
                "the registry sent a manifest of digest {manifest_digest} for {wanted}"
            )));
        }
    }
    let peek: Peek = parse(&bytes, "the manifest")?;
    if peek.manifests.is_some()
        || peek
            .media_type
            .as_deref()
            .is_some_and(|m| m.contains("index") || m.contains("list"))
    {
        let index: ImageIndex = parse(&bytes, "the image index")?;
        let entry = platform_manifest(&index)
            .ok_or_else(|| invalid(format!("{name} has no image for linux/{}", platform_arch())))?;
        let digest = digest_of(entry)?;
        let by_digest = r.clone_with_digest(digest.to_string());
        let (child, _) = client
            .pull_manifest_raw(&by_digest, &auth, ACCEPT)
            .await
            .map_err(|e| fail("fetching the platform's manifest", e))?;
        check_json_size(&child)?;
        if Digest::of(&child) != digest {
            return Err(invalid(format!(
                "the registry sent another manifest for {digest}"
            )));
        }
        bytes = child;
        manifest_digest = digest;
    }
    store.put_blob(&manifest_digest, &bytes)?;
    let manifest: ImageManifest = parse(&bytes, "the manifest")?;
    store::check_layer_count(manifest.layers().len())?;

    let config_digest = digest_of(manifest.config())?;
    if !store.has_blob(&config_digest) {
        fetch(
            store,
            &client,
            r,
            &config_digest,
            manifest.config().size().min(MAX_JSON),
        )
        .await?;
    }
    let config: ImageConfiguration = parse(&store.read_blob(&config_digest)?, "the image config")?;
    let diff_ids = config.rootfs().diff_ids();
    for (i, layer) in manifest.layers().iter().enumerate() {
        let digest = digest_of(layer)?;
        let unpacked = diff_ids
            .get(i)
            .and_then(|d| Digest::parse(d).ok())
            .is_some_and(|d| store.has_layer(&d));
        if unpacked || store.has_blob(&digest) {
            progress(Progress::Present { digest });
            continue;
        }
        progress(Progress::Fetching {
            digest,
            size: layer.size(),
        });
        fetch(store, &client, r, &digest, layer.size()).await?;
        progress(Progress::Fetched { digest });
    }
    progress(Progress::Unpacking);
    let store = store.clone();
    let image = tokio::task::spawn_blocking(move || {
        let image = store.import_blobs(&manifest_digest, &name);
        drop(lock);
        image
    })
    .await
    .map_err(|e| invalid(e.to_string()))??;
    Ok(image)
}

/// A client for the registry of `r` (plain HTTP only to a loopback one),
/// and how it logs in.
pub(crate) fn client(
    reference: &ImageRef,
    r: &Reference,
    credentials: Credentials,
) -> (Client, RegistryAuth) {
    let protocol = if reference.plain_http() {
        ClientProtocol::HttpsExcept(vec![r.registry().to_string()])
    } else {
        ClientProtocol::Https
    };
    let client = Client::new(ClientConfig {
        protocol,
        // Indexes are resolved here, by the store's own rule.
        platform_resolver: None,
        ..Default::default()
    });
    let auth = match credentials {
        Credentials::Anonymous => RegistryAuth::Anonymous,
        Credentials::Basic { user, password } => RegistryAuth::Basic(user, password),
    };
    (client, auth)
}

fn check_json_size(bytes: &[u8]) -> Result<(), StoreError> {
    if bytes.len() as u64 > MAX_JSON {
        return Err(invalid(format!(
            "the registry sent a manifest of {} bytes; cordon reads at most {MAX_JSON}",
            bytes.len()
        )));
    }
    Ok(())
}

/// Fetches one blob into the store: at most `size` bytes, of `digest`.
async fn fetch(
    store: &Store,
    client: &Client,
    r: &Reference,
    digest: &Digest,
    size: u64,
) -> Result<(), StoreError> {
    let file = store.blob_file()?;
    let out = tokio::fs::File::from_std(file.reopen().map_err(|e| invalid(e.to_string()))?);
    let mut capped = Capped {
        inner: out,
        left: size,
        written: 0,
        hasher: Hasher::default(),
    };
    // By digest alone: a descriptor's `urls` are never followed.
    let digest_text = digest.to_string();
    client
        .pull_blob(r, digest_text.as_str(), &mut capped)
        .await
        .map_err(|e| invalid(format!("fetching blob {digest} from {}: {e}", r.registry())))?;
    if capped.written != size {
        return Err(invalid(format!(
            "the registry sent {} bytes for blob {digest}, whose descriptor says {size}",
            capped.written
        )));
    }
    // Checked here too, on what was written.
    let got = capped.hasher.finish();
    if got != *digest {
        return Err(invalid(format!("blob {digest} has the digest {got}")));
    }
    store.persist_blob(file, digest)
}

/// A writer that refuses to go past the size a descriptor declared, and
/// hashes what it writes.
struct Capped<W> {
    inner: W,
    left: u64,
    written: u64,
    hasher: Hasher,
}

impl<W: AsyncWrite + Unpin> AsyncWrite for Capped<W> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        if buf.len() as u64 > self.left {
            return Poll::Ready(Err(std::io::Error::other(
                "the blob is larger than its descriptor says",
            )));
        }
        let n = std::task::ready!(Pin::new(&mut self.inner).poll_write(cx, buf))?;
        self.hasher.update(&buf[..n]);
        self.left -= n as u64;
        self.written += n as u64;
        Poll::Ready(Ok(n))
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
