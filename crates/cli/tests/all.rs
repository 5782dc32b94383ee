//! The cordon-cli integration tests, in one binary: what they use is linked once
//! rather than once per file. `suite` has a module per subject;
//! `cargo test -p cordon-cli --test all <subject>::` runs one of them.

#[path = "../../server/tests/common/pgtest.rs"]
mod pgtest;
#[macro_use]
mod common;
mod suite;
mod support;
