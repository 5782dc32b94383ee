//! The cordon agent: the loop that streams a model's answer and runs the
//! tools it asks for in one sandbox session per conversation, and the
//! session log that keeps every conversation on disk.
//!
//! So far this crate holds the session log; the providers, the loop and
//! context management follow (issue 3).

pub mod log;

pub use log::{LoadReport, LogError, Record, SessionLog};
