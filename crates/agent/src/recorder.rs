//! The session log an agent writes to, shared by the tasks of one turn.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::log::SessionLog;
use crate::record::SessionRecord;

/// The session log the agent writes to, shared by the tasks of one turn.
/// A write that fails is reported once and the session goes on: losing the
/// record is better than losing the work.
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) log: Mutex<Option<SessionLog<SessionRecord>>>,
    warned: AtomicBool,
    /// A task records the network policy's changes in this log.
    pub(crate) watching_policy: AtomicBool,
}

impl Recorder {
    pub(crate) fn append(&self, record: &SessionRecord) {
        let mut guard = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let Some(log) = guard.as_mut() else { return };
        if let Err(e) = log.append(record)
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!("session log: {e}; later records may be missing");
        }
    }

    pub(crate) fn sync(&self) {
        let guard = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Err(e)) = guard.as_ref().map(SessionLog::sync) {
            tracing::warn!("session log: {e}");
        }
    }
}
