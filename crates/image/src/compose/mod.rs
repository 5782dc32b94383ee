//! New images of the store's own: a layer written as a tar, and an image
//! of a config over layers the store holds (what a build or a snapshot
//! makes).
//!
//! A new layer is written once, streamed ([`LayerWriter`]): compressed
//! into a blob and unpacked into `layers/` as it comes, by the same rules
//! as a pulled one.

mod writer;

use oci_spec::image::{
    Descriptor, DescriptorBuilder, ImageConfiguration, ImageManifest, ImageManifestBuilder,
    MediaType, RootFsBuilder, SCHEMA_VERSION,
};
use serde::{Deserialize, Serialize};

use crate::digest::Digest;
use crate::store::{Image, Store, StoreError, digest_of, invalid, parse};
pub use writer::LayerWriter;

/// A layer of the store: unpacked, and its compressed blob kept.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Layer {
    /// The digest of its tar, uncompressed.
    pub diff_id: Digest,
    /// The digest of its blob, as a manifest names it.
    pub digest: Digest,
    /// Bytes of its blob.
    pub size: u64,
    /// The blob's OCI media type.
    pub media_type: String,
}

/// The media type of the layers cordon writes.
const GZIP_LAYER: &str = "application/vnd.oci.image.layer.v1.tar+gzip";

impl Store {
    /// The image's manifest, read from the store.
    pub fn manifest_of(&self, image: &Image) -> Result<ImageManifest, StoreError> {
        parse(&self.read_blob(&image.manifest)?, "the manifest")
    }

    /// The image's config, read from the store.
    pub fn config_of(&self, image: &Image) -> Result<ImageConfiguration, StoreError> {
        parse(&self.read_blob(&image.config)?, "the image config")
    }

    /// The image's layers, bottom first, with their blobs.
    pub fn layers_of(&self, image: &Image) -> Result<Vec<Layer>, StoreError> {
        let manifest = self.manifest_of(image)?;
        if manifest.layers().len() != image.layers.len() {
            return Err(invalid(format!(
                "{}: its manifest and record disagree on its layers",
                image.name
            )));
        }
        manifest
            .layers()
            .iter()
            .zip(&image.layers)
            .map(|(d, diff_id)| {
                Ok(Layer {
                    diff_id: *diff_id,
                    digest: digest_of(d)?,
                    size: d.size(),
                    media_type: oci_layer_type(d.media_type().as_ref()),
                })
            })
            .collect()
    }

    /// Records an image named `name` of `config` over `layers` (bottom
    /// first, all in the store): its config's `rootfs` is set to them.
    pub fn put_image(
        &self,
        name: &str,
        mut config: ImageConfiguration,
        layers: &[Layer],
    ) -> Result<Image, StoreError> {
        crate::store::check_layer_count(layers.len())?;
        let rootfs = RootFsBuilder::default()
            .typ("layers")
            .diff_ids(
                layers
                    .iter()
                    .map(|l| l.diff_id.to_string())
                    .collect::<Vec<_>>(),
            )
            .build()
            .map_err(|e| invalid(e.to_string()))?;
        config.set_rootfs(rootfs);
        let config_bytes = serde_json::to_vec(&config).map_err(|e| invalid(e.to_string()))?;
        let config_digest = Digest::of(&config_bytes);
        self.put_blob(&config_digest, &config_bytes)?;
        let descriptors = layers
            .iter()
            .map(|l| descriptor(MediaType::from(l.media_type.as_str()), &l.digest, l.size))
            .collect::<Result<Vec<_>, _>>()?;
        let manifest = ImageManifestBuilder::default()
            .schema_version(SCHEMA_VERSION)
            .media_type(MediaType::ImageManifest)
            .config(descriptor(
                MediaType::ImageConfig,
                &config_digest,
                config_bytes.len() as u64,
            )?)
            .layers(descriptors)
            .build()
            .map_err(|e| invalid(e.to_string()))?;
        let bytes = serde_json::to_vec(&manifest).map_err(|e| invalid(e.to_string()))?;
        let digest = Digest::of(&bytes);
        self.put_blob(&digest, &bytes)?;
        self.import_blobs(&digest, name)
    }
}

fn descriptor(media_type: MediaType, digest: &Digest, size: u64) -> Result<Descriptor, StoreError> {
    let d: oci_spec::image::Digest = digest
        .to_string()
        .parse()
        .map_err(|e: oci_spec::OciSpecError| invalid(e.to_string()))?;
    DescriptorBuilder::default()
        .media_type(media_type)
        .digest(d)
        .size(size)
        .build()
        .map_err(|e| invalid(e.to_string()))
}

/// A layer's media type as OCI names it: Docker's are the same bytes
/// under other names.
fn oci_layer_type(media_type: &str) -> String {
    match media_type {
        "application/vnd.docker.image.rootfs.diff.tar.gzip" => GZIP_LAYER.into(),
        "application/vnd.docker.image.rootfs.diff.tar" => {
            "application/vnd.oci.image.layer.v1.tar".into()
        }
        other => other.into(),
    }
}
