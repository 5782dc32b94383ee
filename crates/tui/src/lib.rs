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
mod test_util {
    use ratatui::text::Line;

    /// The text of each line, styles dropped.
    pub fn plain(lines: &[Line<'_>]) -> Vec<String> {
        lines
            .iter()
            .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
            .collect()
    }
}
