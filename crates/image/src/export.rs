//! A stored image written out for other tools: an OCI archive (an image
//! layout in a tar, what `skopeo copy … oci-archive:` and `podman save
//! --format oci-archive` write) or a Docker archive (what `docker save`
//! writes and `docker load` reads).
//!
//! The blobs are the store's, verified when they came in; the archive is
//! written to a temporary file beside the target and renamed into place
//! once whole, so a failed save leaves no half archive under the name.

use std::io::{self, Read, Write};
use std::path::Path;

use serde::Serialize;

use crate::compose::Layer;
use crate::digest::Digest;
use crate::store::{Image, Store, StoreError, invalid};

/// What an archive holds its image as.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// An OCI image layout in a tar.
    Oci,
    /// `docker save`'s: a `manifest.json`, the config, and each layer as
    /// an uncompressed tar.
    DockerArchive,
}

impl std::str::FromStr for Format {
    type Err = String;
    fn from_str(s: &str) -> Result<Format, String> {
        match s {
            "oci" | "oci-archive" => Ok(Format::Oci),
            "docker-archive" | "docker" => Ok(Format::DockerArchive),
            other => Err(format!(
                "{other}: not an archive format (oci or docker-archive)"
            )),
        }
    }
}

fn io_err(what: impl Into<String>) -> impl FnOnce(io::Error) -> StoreError {
    let what = what.into();
    move |source| StoreError::Io { what, source }
}

impl Store {
    /// Writes `image` to `file` in `format`, tagged `tag` (a name other
    /// tools show: `NAME:TAG`).
    pub fn save(
        &self,
        image: &Image,
        format: Format,
        tag: &str,
        file: &Path,
    ) -> Result<(), StoreError> {
        let dir = file
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let tmp = tempfile::NamedTempFile::new_in(dir)
            .map_err(io_err(format!("making a file in {}", dir.display())))?;
        let mut tar = tar::Builder::new(io::BufWriter::new(tmp.as_file()));
        let layers = self.layers_of(image)?;
        match format {
            Format::Oci => self.write_oci(&mut tar, image, &layers, tag)?,
            Format::DockerArchive => self.write_docker(&mut tar, image, &layers, tag)?,
        }
        tar.into_inner()
            .and_then(|mut w| w.flush())
            .map_err(io_err(format!("writing {}", file.display())))?;
        tmp.persist(file).map_err(|e| StoreError::Io {
            what: format!("placing {}", file.display()),
            source: e.error,
        })?;
        Ok(())
    }

    fn write_oci<W: Write>(
        &self,
        tar: &mut tar::Builder<W>,
        image: &Image,
        layers: &[Layer],
        tag: &str,
    ) -> Result<(), StoreError> {
        let manifest = self.read_blob(&image.manifest)?;
        let config = self.read_blob(&image.config)?;
        add(tar, "oci-layout", br#"{"imageLayoutVersion":"1.0.0"}"#)?;
        let index = serde_json::json!({
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.index.v1+json",
            "manifests": [{
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                "digest": image.manifest.to_string(),
                "size": manifest.len(),
                "annotations": {"org.opencontainers.image.ref.name": tag},
            }],
        });
        add(
            tar,
            "index.json",
            &serde_json::to_vec(&index).expect("json"),
        )?;
        add(tar, &blob_name(&image.manifest), &manifest)?;
        add(tar, &blob_name(&image.config), &config)?;
        for l in layers {
            let file = self.blob_reader(&l.digest)?;
            add_file(tar, &blob_name(&l.digest), file, l.size)?;
        }
        Ok(())
    }

    fn write_docker<W: Write>(
        &self,
        tar: &mut tar::Builder<W>,
        image: &Image,
        layers: &[Layer],
        tag: &str,
    ) -> Result<(), StoreError> {
        #[derive(Serialize)]
        #[serde(rename_all = "PascalCase")]
        struct Saved<'a> {
            config: String,
            repo_tags: [&'a str; 1],
            layers: Vec<String>,
        }
        let config = self.read_blob(&image.config)?;
        let config_name = format!("{}.json", image.config.hex());
        add(tar, &config_name, &config)?;
        let mut names = Vec::new();
        for l in layers {
            // Uncompressed, named by its diff_id, as `docker save` has it.
            let name = format!("{}/layer.tar", l.diff_id.hex());
            let tmp = self.blob_file()?;
            let mut w = crate::digest::Hashing::new(tmp);
            let mut raw = self.blob_reader(&l.digest)?;
            let mut head = [0u8; 4];
            let n = raw.read(&mut head).map_err(io_err("reading a layer"))?;
            let whole = io::Cursor::new(head[..n].to_vec()).chain(raw);
            if head[..n].starts_with(&[0x1f, 0x8b]) {
                io::copy(&mut flate2::read::MultiGzDecoder::new(whole), &mut w)
            } else if n == 4 && head == [0x28, 0xb5, 0x2f, 0xfd] {
                return Err(invalid(
                    "a zstd layer: save it with --format oci, which keeps layers as they are",
                ));
            } else {
                io::copy(&mut { whole }, &mut w)
            }
            .map_err(io_err("decompressing a layer"))?;
            let size = w.written;
            let (digest, file) = w.finish();
            if digest != l.diff_id {
                return Err(invalid(format!(
                    "layer {} decompresses to {digest}, not its diff_id {}",
                    l.digest, l.diff_id
                )));
            }
            let reader = file.reopen().map_err(io_err("reading a layer"))?;
            add_file(tar, &name, reader, size)?;
            names.push(name);
        }
        let saved = [Saved {
            config: config_name,
            repo_tags: [tag],
            layers: names,
        }];
        add(
            tar,
            "manifest.json",
            &serde_json::to_vec(&saved).expect("json"),
        )?;
        Ok(())
    }
}

fn blob_name(d: &Digest) -> String {
    format!("blobs/sha256/{}", d.hex())
}

fn add<W: Write>(tar: &mut tar::Builder<W>, name: &str, bytes: &[u8]) -> Result<(), StoreError> {
    add_file(tar, name, bytes, bytes.len() as u64)
}

fn add_file<W: Write>(
    tar: &mut tar::Builder<W>,
    name: &str,
    body: impl Read,
    size: u64,
) -> Result<(), StoreError> {
    let mut h = tar::Header::new_ustar();
    h.set_entry_type(tar::EntryType::Regular);
    h.set_mode(0o644);
    h.set_size(size);
    h.set_mtime(0);
    tar.append_data(&mut h, name, body.take(size))
        .map_err(io_err(format!("writing {name}")))
}
