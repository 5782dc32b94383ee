//! What the network broker refused (or could not reach) while a tool ran,
//! added to the tool's result so the model can ask for the host or work
//! around it. The lines are the broker's own (`network: HOST:PORT refused
//! by policy (allowed: ...)`), each host and port once, in order.

use cordon_net::{Decision, NetEvent};
use cordon_sandbox::Sandbox;
use tokio::sync::broadcast::{self, error::TryRecvError};

/// Most lines added to one result: a loop that retries forever should not
/// fill the model's context.
const MAX_LINES: usize = 20;

/// Watches a sandbox's broker from before a tool runs.
pub(crate) struct NetWatch(broadcast::Receiver<NetEvent>);

impl NetWatch {
    /// `None` when the sandbox has no broker (network off or loopback).
    pub(crate) fn start(sandbox: &Sandbox) -> Option<NetWatch> {
        sandbox.network().map(|n| NetWatch(n.subscribe()))
    }

    /// The lines for the connections refused or failed since the start.
    pub(crate) fn lines(&mut self) -> Vec<String> {
        let mut seen = Vec::<(String, u16)>::new();
        let mut lines = Vec::new();
        let mut more = 0usize;
        loop {
            let e = match self.0.try_recv() {
                Ok(e) => e,
                Err(TryRecvError::Lagged(n)) => {
                    more += n as usize;
                    continue;
                }
                Err(_) => break,
            };
            if e.decision == Decision::Allowed || seen.contains(&(e.host.clone(), e.port)) {
                continue;
            }
            seen.push((e.host.clone(), e.port));
            if lines.len() < MAX_LINES {
                lines.push(crate::printable(&e.message));
            } else {
                more += 1;
            }
        }
        if more > 0 {
            lines.push(format!(
                "network: {more} more connections refused or failed"
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
