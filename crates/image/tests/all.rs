//! The image crate's tests, one binary.

mod suite;
