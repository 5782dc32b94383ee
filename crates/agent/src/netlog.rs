//! The network broker's refusals while the agent's tools ran, read off the
//! sandbox's event broadcast: each host and port once, allowed connections
//! left out, a bounded number (a retry loop must not flood the log).

use cordon_net::{Decision, NetEvent};
use tokio::sync::broadcast::{self, error::TryRecvError};

/// Records per tool batch at most.
const MAX: usize = 20;

/// What `rx` holds now that was refused or failed.
pub(crate) fn refusals(rx: &mut broadcast::Receiver<NetEvent>) -> Vec<NetEvent> {
    let mut out: Vec<NetEvent> = Vec::new();
    loop {
        match rx.try_recv() {
            Ok(e) => {
                if e.decision != Decision::Allowed
                    && out.len() < MAX
                    && !out.iter().any(|o| o.host == e.host && o.port == e.port)
                {
                    out.push(e);
                }
            }
            Err(TryRecvError::Lagged(_)) => continue,
            Err(_) => break,
        }
    }
    out
}
