//! What the `task` tool's helpers share with the agent that called them.

use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use crate::message::Usage;

/// Helpers one turn of the caller may start.
pub const MAX_PER_TURN: u32 = 8;

/// What the helpers of one conversation share with its agent: how many
/// the current turn started, and the tokens they used, which the agent
/// adds to the turn's.
#[derive(Debug, Default)]
pub struct Helpers {
    started: AtomicU32,
    usage: Mutex<Usage>,
    /// The caller's model in its current turn (it may change by `/model`).
    model: Mutex<String>,
}

impl Helpers {
    /// A new turn of the caller: its count starts again, with its model.
    pub(crate) fn begin_turn(&self, model: &str) {
        self.started.store(0, Ordering::SeqCst);
        *self.model.lock().unwrap_or_else(|p| p.into_inner()) = model.to_string();
    }

    /// Counts a helper starting in this turn, or says why it may not.
    pub(crate) fn claim(&self) -> Result<(), String> {
        if self.started.fetch_add(1, Ordering::SeqCst) >= MAX_PER_TURN {
            return Err(format!(
                "This turn has started {MAX_PER_TURN} helpers already, the most it may. Do the rest yourself."
            ));
        }
        Ok(())
    }

    /// The caller's model in its current turn.
    pub(crate) fn model(&self) -> String {
        self.model.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The helpers' tokens since the last call.
    pub(crate) fn take_usage(&self) -> Usage {
        std::mem::take(&mut *self.usage.lock().unwrap_or_else(|p| p.into_inner()))
    }

    pub(crate) fn add_usage(&self, u: Usage) {
        *self.usage.lock().unwrap_or_else(|p| p.into_inner()) += u;
    }
}
