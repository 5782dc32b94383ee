//! The API sessions live in this process: each one's agent and sandbox
//! while it is in use, and the turn running in it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_agent::{Cancel, Conversation};

use crate::owner::Owner;

/// A session in use: its conversation (the agent with its log, the
/// operator's MCP servers, the sandbox).
pub(crate) struct Live {
    pub(crate) talk: Conversation,
    pub(crate) last_used: Instant,
    /// Its broker's policy, listed for the API while it lives.
    pub(crate) _policy: Option<crate::network::Listed>,
    /// Its place under the live-session caps, given back with it.
    pub(crate) _slot: crate::caps::Slot,
    /// Its workspace's volume, mounted while it lives: dropped last.
    pub(crate) _in_use: cordon_sandbox::volume::InUse,
}

impl Live {
    pub(crate) async fn close(self) {
        // The last turn's checkpoint is still being recorded by a task
        // that holds the log (and its lock): a process started next over
        // the same data, or the session woken again, must find it free.
        self.talk.close().await;
    }
}

pub(crate) type Slot = Arc<tokio::sync::Mutex<Option<Live>>>;

/// The sessions live in this process.
#[derive(Default)]
pub struct LiveSessions {
    pub(crate) slots: Mutex<HashMap<String, Slot>>,
    /// Cancels the turn running in a session.
    pub(crate) turns: Mutex<HashMap<String, Cancel>>,
}

impl LiveSessions {
    pub(crate) fn slot(&self, id: &str) -> Slot {
        self.slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(id.to_string())
            .or_default()
            .clone()
    }

    /// Closes every live session: turns cancelled, then each agent (and the
    /// lock on its log), MCP servers and sandbox, so a process started next
    /// over the same data directory can open them. A turn that does not
    /// give its session back within `wait` is left to the runtime.
    pub async fn close_all(&self, wait: Duration, sandboxes: &crate::sandboxes::Sandboxes) {
        for cancel in self
            .turns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .values()
        {
            cancel.cancel();
        }
        let slots: Vec<(String, Slot)> = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .drain()
            .collect();
        let deadline = tokio::time::Instant::now() + wait;
        for (id, slot) in slots {
            let Ok(mut guard) = tokio::time::timeout_at(deadline, slot.lock()).await else {
                tracing::warn!("session {id}: its turn did not end in time; left open");
                continue;
            };
            if let Some(live) = guard.take() {
                sandboxes.unlist(&Owner::Session(id.clone()));
                live.close().await;
            }
        }
    }

    /// Closes the sandboxes of sessions idle longer than `idle`.
    pub async fn reap(&self, idle: Duration, sandboxes: &crate::sandboxes::Sandboxes) {
        let slots: Vec<(String, Slot)> = self
            .slots
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        for (id, slot) in slots {
            // A session in a turn is busy, not idle.
            let Ok(mut guard) = slot.try_lock() else {
                continue;
            };
            // A Lab in use keeps its session's sandbox.
            let lab_idle = sandboxes
                .lab_idle(&Owner::Session(id.clone()))
                .unwrap_or(Duration::MAX);
            if guard
                .as_ref()
                .is_some_and(|l| l.last_used.elapsed() > idle && lab_idle > idle)
                && let Some(live) = guard.take()
            {
                tracing::debug!("closing idle session {id}");
                sandboxes.unlist(&Owner::Session(id.clone()));
                live.close().await;
            }
        }
    }
}
