//! OCI images for cordon's sandboxes: what a reference names, the digests
//! blobs are known by, and layers unpacked as the hostile input they are.
//!
//! Everything here comes from outside (a registry, an archive, a layout a
//! tool wrote) and is treated so: digests are parsed into a closed type
//! before they name a file, and a layer is unpacked beneath its directory
//! by descriptors, never through a link ([`unpack`]); the [`store`] keeps
//! verified blobs and unpacked layers, and takes an image only whole.
//! Nothing here runs a sandbox: the `sandbox` crate mounts what this one
//! hands it.

pub mod auth;
pub mod changes;
pub mod compose;
pub mod digest;
pub mod export;
pub mod flat;
pub mod obtain;
pub mod push;
pub mod reference;
pub mod registry;
pub mod root;
pub mod store;
pub mod text;
pub mod unpack;

pub use digest::Digest;
pub use reference::{BadReference, ImageRef};
pub use unpack::{Limits, Owners, Report, UnpackError, unpack};

/// The modules from the bottom up: each may use only those before it
/// (checked by `layout.rs`).
pub const LAYERS: &[&str] = &[
    "text",
    "digest",
    "changes",
    "flat",
    "auth",
    "reference",
    "unpack",
    "store",
    "compose",
    "export",
    "root",
    "registry",
    "obtain",
    "push",
];

#[cfg(test)]
mod layout;
