//! The cordon-net integration tests, in one binary: what they use is linked once
//! rather than once per file. `suite` has a module per subject;
//! `cargo test -p cordon-net --test all <subject>::` runs one of them.

mod common;
mod suite;
