//! What the network broker refused (or could not reach) while a tool ran,
//! added to the tool's result so the model can ask for the host or work
//! around it. The lines are the broker's own (`network: HOST:PORT refused
//! by policy (allowed: ...)`), each host and port once, in order.

use cordon_sandbox::{Refusals, Sandbox};

/// Most lines added to one result: a loop that retries forever should not
/// fill the model's context.
const MAX_LINES: usize = 20;

/// Watches a sandbox's broker from before a tool runs.
pub(crate) struct NetWatch(Refusals);

impl NetWatch {
    /// `None` when the sandbox has no broker (network off or loopback).
    pub(crate) fn start(sandbox: &Sandbox) -> Option<NetWatch> {
        sandbox.network().map(|n| NetWatch(n.refusals(MAX_LINES)))
    }

    /// The lines for the connections refused or failed since the start.
    pub(crate) fn lines(&mut self) -> Vec<String> {
        let mut lines: Vec<String> = self
            .0
            .ready()
            .iter()
            .map(|e| crate::output::printable(&e.message))
            .collect();
        if self.0.skipped > 0 {
            lines.push(format!(
                "network: {} more connections refused or failed",
                self.0.skipped
            ));
        }
        lines
    }

    /// `text` with the lines appended, when there are any.
    pub(crate) fn append_to(mut self, text: &mut String) {
        let lines = self.lines();
        if lines.is_empty() {
            return;
        }
        if !text.is_empty() && !text.ends_with('\n') {
            text.push('\n');
        }
        for l in lines {
            text.push_str(&l);
            text.push('\n');
        }
    }
}
