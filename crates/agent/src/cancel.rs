//! Cancelling a running turn.

use std::sync::Arc;

use tokio::sync::watch;

/// A handle that cancels a running turn; cheap to clone.
#[derive(Clone)]
pub struct Cancel {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Cancel {
    fn default() -> Self {
        Cancel {
            tx: Arc::new(watch::channel(false).0),
        }
    }
}

impl Cancel {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_cancelled(&self) -> bool {
        *self.tx.borrow()
    }

    /// Completes once cancelled.
    pub async fn cancelled(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in self, so the channel cannot close under us.
        let _ = rx.wait_for(|c| *c).await;
    }

    /// A fresh handle for the next turn.
    pub fn reset(&self) {
        self.tx.send_replace(false);
    }
}
