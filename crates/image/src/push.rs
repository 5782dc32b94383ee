//! Pushing a stored image to a registry: its layers and config as blobs
//! (each only if the registry lacks it), then its manifest, byte for byte
//! as stored, so the digest there is the digest here.

use futures_util::StreamExt;
use oci_client::RegistryOperation;
use serde::Deserialize;

use crate::auth::Credentials;
use crate::digest::Digest;
use crate::reference::ImageRef;
use crate::registry::client;
use crate::store::{Image, Store, StoreError, invalid, parse};

/// What a push reports as it goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PushProgress {
    /// A blob is being sent (`size` bytes).
    Sending { digest: Digest, size: u64 },
    /// A blob the registry already has.
    Present { digest: Digest },
}

/// Pushes `image` to `target` (a registry reference) with `credentials`;
/// the manifest's digest.
pub async fn push(
    store: &Store,
    image: &Image,
    target: &ImageRef,
    credentials: Credentials,
    progress: &(dyn Fn(PushProgress) + Send + Sync),
) -> Result<Digest, StoreError> {
    let ImageRef::Registry(r) = target else {
        return Err(invalid(format!(
            "{target} is not in a registry; `cordon image save` writes archives"
        )));
    };
    let (client, auth) = client(target, r, credentials);
    let fail = |what: String, e: oci_client::errors::OciDistributionError| {
        invalid(format!("{what} to {}: {e}", r.registry()))
    };
    client
        .auth(r, &auth, RegistryOperation::Push)
        .await
        .map_err(|e| fail("logging in".into(), e))?;
    let mut blobs: Vec<(Digest, u64)> = store
        .layers_of(image)?
        .into_iter()
        .map(|l| (l.digest, l.size))
        .collect();
    let config = store.read_blob(&image.config)?;
    blobs.push((image.config, config.len() as u64));
    for (digest, size) in blobs {
        let text = digest.to_string();
        if client.blob_exists(r, &text).await.unwrap_or(false) {
            progress(PushProgress::Present { digest });
            continue;
        }
        progress(PushProgress::Sending { digest, size });
        let file = tokio::fs::File::from_std(store.blob_reader(&digest)?);
        let stream = tokio_util::io::ReaderStream::with_capacity(file, 1 << 20).map(|chunk| {
            chunk.map_err(|e| {
                oci_client::errors::OciDistributionError::GenericError(Some(e.to_string()))
            })
        });
        client
            .push_blob_stream(r, stream, &text, Some(size))
            .await
            .map_err(|e| fail(format!("sending blob {digest}"), e))?;
    }
    let manifest = store.read_blob(&image.manifest)?;
    #[derive(Deserialize)]
    struct Kind {
        #[serde(default, rename = "mediaType")]
        media_type: Option<String>,
    }
    let kind: Kind = parse(&manifest, "the manifest")?;
    let media_type = kind
        .media_type
        .unwrap_or_else(|| "application/vnd.oci.image.manifest.v1+json".into());
    let header = http::HeaderValue::from_str(&media_type)
        .map_err(|_| invalid(format!("the manifest's media type {media_type:?}")))?;
    client
        .push_manifest_raw(r, manifest, header)
        .await
        .map_err(|e| fail("sending the manifest".into(), e))?;
    Ok(image.manifest)
}
