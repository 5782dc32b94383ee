//! Live fan-out of job events to SSE clients. The database is the record;
//! the hub only saves clients of a running job from polling it. A client
//! subscribes first and reads the database second, then skips what it has
//! seen, so nothing falls between the two.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::broadcast;

use crate::store::StoredEvent;

/// Events buffered per job for slow clients; one that falls further behind
/// re-reads the database.
const BUFFER: usize = 1024;

/// Pokes buffered per stream; one that falls further behind reads the
/// database again, as on a poke.
const POKES: usize = 256;

pub struct Hub {
    jobs: Mutex<HashMap<String, broadcast::Sender<StoredEvent>>>,
    /// Woken whenever a job opens, for streams waiting on a queued job.
    opened: tokio::sync::Notify,
    /// The ids of jobs another process stored events of.
    pokes: broadcast::Sender<Arc<str>>,
}

impl Default for Hub {
    fn default() -> Hub {
        Hub {
            jobs: Mutex::default(),
            opened: tokio::sync::Notify::new(),
            pokes: broadcast::channel(POKES).0,
        }
    }
}

impl Hub {
    /// Starts fan-out for a job about to run.
    pub fn open(&self, id: &str) {
        self.lock()
            .entry(id.to_string())
            .or_insert_with(|| broadcast::channel(BUFFER).0);
        self.opened.notify_waiters();
    }

    /// Pokes from now on: taken before a stream reads the database, so
    /// that a poke while it reads is not missed.
    pub fn pokes(&self) -> broadcast::Receiver<Arc<str>> {
        self.pokes.subscribe()
    }

    /// Subscribes to `id`, waiting up to `patience` for it to open; `None`
    /// if it did not (it is queued, or runs in another process), or if
    /// another process stored events of it (read them from the database).
    pub async fn subscribe_within(
        &self,
        id: &str,
        patience: std::time::Duration,
        pokes: &mut broadcast::Receiver<Arc<str>>,
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
            tokio::select! {
                // Another job's opening wakes us too: look again.
                _ = &mut opened => {}
                poke = pokes.recv() => match poke {
                    Ok(job) if *job == *id => return None,
                    Ok(_) => {}
                    Err(broadcast::error::RecvError::Lagged(_)) => return None,
                    Err(broadcast::error::RecvError::Closed) => {
                        tokio::time::sleep_until(deadline).await;
                        return self.subscribe(id);
                    }
                },
                _ = tokio::time::sleep_until(deadline) => return self.subscribe(id),
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

    /// Another process stored events of job `id` (PostgreSQL's NOTIFY):
    /// its streams here read the database again now rather than at their
    /// next poll.
    pub fn poke(&self, id: &str) {
        // No receivers is fine: nobody is watching.
        let _ = self.pokes.send(Arc::from(id));
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, broadcast::Sender<StoredEvent>>> {
        self.jobs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn a_poke_for_its_job_ends_the_wait_and_others_do_not() {
        let hub = Arc::new(Hub::default());
        let mut pokes = hub.pokes();
        let poker = hub.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            poker.poke("job_other");
            tokio::time::sleep(Duration::from_millis(20)).await;
            poker.poke("job_mine");
        });
        let t = tokio::time::Instant::now();
        let got = hub
            .subscribe_within("job_mine", Duration::from_secs(10), &mut pokes)
            .await;
        assert!(got.is_none());
        let waited = t.elapsed();
        assert!(
            waited >= Duration::from_millis(40) && waited < Duration::from_secs(5),
            "{waited:?}"
        );
        // A poke while the stream read the database is kept for its wait.
        hub.poke("job_mine");
        let t = tokio::time::Instant::now();
        hub.subscribe_within("job_mine", Duration::from_secs(10), &mut pokes)
            .await;
        assert!(t.elapsed() < Duration::from_secs(5));
    }
}
