//! What the two benchmark binaries share: the command line, statistics and
//! JSON, and /proc readings.
//!
//! `cordon-bench` measures the sandbox and `cordon-bench-agent` the agent.
//! They are two binaries because a benchmark binary is also the supervisor
//! of every sandbox it opens: linking the agent's HTTP and TLS stack into
//! `cordon-bench` would double each supervisor's relocated (dirty) pages
//! and with them what `density` reports.

pub mod cli;
pub mod procfs;
pub mod stats;

/// This root's modules from the bottom up: each may use only those
/// before it. The binaries beside it list theirs.
pub const LAYERS: &[&str] = &["stats", "procfs", "cli"];

#[cfg(test)]
mod layering {
    cordon_testkit::layering_test!(root "src/lib.rs", crate::LAYERS);
}
