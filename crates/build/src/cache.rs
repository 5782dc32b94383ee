//! The build cache: a step's layer by the key of what made it, in the
//! store's `build-cache/`. A record whose layer the store no longer holds
//! (a prune removed it) is a miss, never an error.

use cordon_image::compose::Layer;
use cordon_image::store::Store;

/// Where a build's cache records are, in the store.
const CACHE_DIR: &str = "build-cache";

/// The layer the cache keeps for `key`, when the store still has it.
pub fn get(store: &Store, key: &[u8; 32]) -> Option<Layer> {
    let path = store.root().join(CACHE_DIR).join(hex::encode(key));
    let layer: Layer = serde_json::from_slice(&std::fs::read(path).ok()?).ok()?;
    (store.has_layer(&layer.diff_id) && store.has_blob(&layer.digest)).then_some(layer)
}

pub fn put(store: &Store, key: &[u8; 32], layer: &Layer) {
    let dir = store.root().join(CACHE_DIR);
    let write = || -> std::io::Result<()> {
        std::fs::create_dir_all(&dir)?;
        let tmp = tempfile::NamedTempFile::new_in(&dir)?;
        std::fs::write(tmp.path(), serde_json::to_vec(layer)?)?;
        tmp.persist(dir.join(hex::encode(key)))?;
        Ok(())
    };
    // A cache that cannot be written costs the next build time, not this one.
    if let Err(e) = write() {
        tracing::warn!("cannot record a build step in the cache: {e}");
    }
}
