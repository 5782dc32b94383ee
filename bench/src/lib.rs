//! What the benchmark binaries share: the command line, statistics and
//! JSON, and /proc readings.

pub mod cli;
pub mod procfs;
pub mod stats;
