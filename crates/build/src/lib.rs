//! Images built from Dockerfiles: every `RUN` in a cordon sandbox of its
//! own, every step cached by what it reads.
//!
//! A Dockerfile and its context are hostile input like any image: the
//! context is read beneath its directory through no link, and nothing in
//! either runs on the host.

mod build;
mod cache;
pub mod commit;
pub mod context;
pub mod copy;
pub mod dockerfile;
pub mod expand;
pub mod ignore;
pub mod view;

pub use build::{Bases, BuildError, Builder, Built, Event, Options};

/// The modules from the bottom up: each may use only those before it
/// (checked by `layout.rs`).
pub const LAYERS: &[&str] = &[
    "expand",
    "dockerfile",
    "ignore",
    "view",
    "context",
    "copy",
    "cache",
    "commit",
    "build",
];

#[cfg(test)]
mod layout;
