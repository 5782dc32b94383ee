//! The cordon-server integration tests, in one binary: what they use is linked once
//! rather than once per file. `suite` has a module per subject;
//! `cargo test -p cordon-server --test all <subject>::` runs one of them.

#[macro_use]
mod common;
mod suite;
