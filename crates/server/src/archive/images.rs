//! Tenants' own images in the archive, for a deployment of many
//! processes: the process that makes an image (a build, a pull, a
//! snapshot) uploads its blobs, `images/blobs/sha256/<hex>`, each once;
//! a worker that runs a job in it and lacks it downloads them into its
//! own store, verifying each against its digest as a registry pull does.
//! The keys are content addresses: nothing of a tenant's names them, and
//! what one reads back is only ever taken if its digest is the one asked.

use std::io::Write as _;

use cordon_image::digest::{Digest, Hashing};
use cordon_image::store::{MAX_JSON, Store};
use futures_util::StreamExt;
use object_store::ObjectStoreExt;
use object_store::path::Path as Key;
use tokio::io::AsyncWriteExt;

use super::{Archive, ArchiveError};

fn blob_key(d: &Digest) -> Key {
    Key::from(format!("images/blobs/sha256/{}", d.hex()))
}

fn image_err(why: impl std::fmt::Display) -> ArchiveError {
    ArchiveError::Staging(format!("an image in the archive: {why}"))
}

impl Archive {
    /// Uploads the blobs of the image whose manifest is `manifest` (the
    /// manifest, its config, its layers) that the archive lacks.
    pub async fn put_image(&self, store: &Store, manifest: &Digest) -> Result<(), ArchiveError> {
        let blobs = {
            let (store, manifest) = (store.clone(), *manifest);
            tokio::task::spawn_blocking(move || store.blobs_of_manifest(&manifest))
                .await
                .map_err(image_err)?
                .map_err(image_err)?
        };
        let all = std::iter::once(*manifest).chain(blobs.into_iter().map(|(d, _)| d));
        for d in all {
            let key = blob_key(&d);
            if self.store.head(&key).await.is_ok() {
                continue;
            }
            let file = store.blob_reader(&d).map_err(image_err)?;
            let mut file = tokio::fs::File::from_std(file);
            let mut up = object_store::buffered::BufWriter::new(self.store.clone(), key);
            if let Err(e) = tokio::io::copy(&mut file, &mut up).await {
                let _ = up.abort().await;
                return Err(image_err(e));
            }
            up.shutdown().await.map_err(image_err)?;
        }
        Ok(())
    }

    /// Downloads into `store` the blobs of the image `manifest` that it
    /// lacks, each verified, and records the image as `record`.
    pub async fn get_image(
        &self,
        store: &Store,
        manifest: &Digest,
        record: &str,
    ) -> Result<cordon_image::store::Image, ArchiveError> {
        self.get_blob(store, manifest, MAX_JSON).await?;
        let blobs = store.blobs_of_manifest(manifest).map_err(image_err)?;
        for (d, size) in blobs {
            self.get_blob(store, &d, size).await?;
        }
        let (store, manifest, record) = (store.clone(), *manifest, record.to_string());
        tokio::task::spawn_blocking(move || store.import_blobs(&manifest, &record))
            .await
            .map_err(image_err)?
            .map_err(image_err)
    }

    /// One blob, unless the store has it: at most `size` bytes, taken only
    /// if its digest is `d`.
    async fn get_blob(&self, store: &Store, d: &Digest, size: u64) -> Result<(), ArchiveError> {
        if store.has_blob(d) {
            return Ok(());
        }
        let got = self
            .store
            .get(&blob_key(d))
            .await
            .map_err(|e| self.err(e))?;
        let mut body = got.into_stream();
        let mut w = Hashing::new(store.blob_file().map_err(image_err)?);
        while let Some(chunk) = body.next().await {
            let chunk = chunk.map_err(|e| self.err(e))?;
            if w.written + chunk.len() as u64 > size {
                return Err(image_err(format!("blob {d} is larger than {size} bytes")));
            }
            w.write_all(&chunk).map_err(image_err)?;
        }
        let (digest, file) = w.finish();
        if digest != *d {
            return Err(image_err(format!("blob {d} came back as {digest}")));
        }
        store.persist_blob(file, d).map_err(image_err)
    }
}
