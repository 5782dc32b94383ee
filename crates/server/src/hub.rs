//! Live fan-out of job events to SSE clients. The database is the record;
//! the hub only saves clients of a running job from polling it. A client
//! subscribes first and reads the database second, then skips what it has
//! seen, so nothing falls between the two.

use std::collections::HashMap;
use std::sync::Mutex;

use tokio::sync::broadcast;

use crate::store::StoredEvent;

/// Events buffered per job for slow clients; one that falls further behind
/// re-reads the database.
const BUFFER: usize = 1024;

#[derive(Default)]
pub struct Hub {
    jobs: Mutex<HashMap<String, broadcast::Sender<StoredEvent>>>,
    /// Woken whenever a job opens, for streams waiting on a queued job.
    opened: tokio::sync::Notify,
}

impl Hub {
    /// Starts fan-out for a job about to run.
    pub fn open(&self, id: &str) {
        self.lock()
            .entry(id.to_string())
            .or_insert_with(|| broadcast::channel(BUFFER).0);
        self.opened.notify_waiters();
    }

    /// Subscribes to `id`, waiting up to `patience` for it to open; `None`
    /// if it did not (it is queued, or runs in another process).
    pub async fn subscribe_within(
        &self,
        id: &str,
        patience: std::time::Duration,
    ) -> Option<broadcast::Receiver<StoredEvent>> {
        let deadline = tokio::time::Instant::now() + patience;
        loop {
            let opened = self.opened.notified();
            tokio::pin!(opened);
            // Registered before looking, so an open in between is not missed.
            opened.as_mut().enable();
            if let Some(rx) = self.subscribe(id) {
                return Some(rx);
            }
            // Another job's opening wakes us too: look again until the end.
            if tokio::time::timeout_at(deadline, opened).await.is_err() {
                return self.subscribe(id);
            }
        }
    }

    /// Live events of `id`, if it is running here.
    pub fn subscribe(&self, id: &str) -> Option<broadcast::Receiver<StoredEvent>> {
        self.lock().get(id).map(broadcast::Sender::subscribe)
    }

    pub fn publish(&self, id: &str, events: &[StoredEvent]) {
        if let Some(tx) = self.lock().get(id) {
            for e in events {
                // No receivers is fine: nobody is watching.
                let _ = tx.send(e.clone());
            }
        }
    }

    /// Ends fan-out; receivers see the channel close after the last event.
    pub fn close(&self, id: &str) {
        self.lock().remove(id);
    }

    /// Another process stored events (PostgreSQL's NOTIFY): streams of
    /// jobs not running here read the database again now rather than at
    /// their next poll.
    pub fn poke(&self) {
        self.opened.notify_waiters();
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<StoredEvent>>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }
}
