//! cordon's terminal UI: a full-screen agent session on ratatui.
//!
//! [`app`] holds the state and reacts to keys and the agent's events,
//! [`view`] draws it, [`transcript`] (with [`markdown`] and [`wrap`]) turns
//! the conversation into lines, [`worker`] owns the sandbox and the agent,
//! and [`run`] drives the terminal. [`complete`] finds the workspace
//! paths `@` completes, and [`approved`] keeps the commands the user
//! approved for good.

pub mod app;
pub mod approved;
pub mod complete;
pub mod markdown;
pub mod run;
pub mod theme;
pub mod transcript;
pub mod view;
pub mod worker;
pub mod wrap;

pub use app::{App, SandboxState, Status};
pub use run::{Outcome, run};
pub use worker::{ApprovalMode, Repository, Worker};

#[cfg(test)]
mod test_util;

/// The modules from the bottom up: each may use only those before it
/// (checked by `layout.rs`).
pub const LAYERS: &[&str] = &[
    "test_util",
    "approved",
    "complete",
    "theme",
    "wrap",
    "markdown",
    "transcript",
    "app",
    "view",
    "worker",
    "run",
];

#[cfg(test)]
mod layout;
