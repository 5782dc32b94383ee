//! File system operations in a sandbox (see [`crate::protocol::FsOp`]),
//! done by its supervisor as a user of the sandbox's: the host asks, the
//! supervisor answers; the host opens no path of the sandbox's.

use std::sync::atomic::Ordering;

use tokio::sync::oneshot;

use super::Sandbox;
use crate::error::{Error, Result};
use crate::protocol::{FsAnswer, FsFailure, FsOp, HostMsg};

/// What a file system operation comes to: the supervisor's answer, or
/// its failure (a missing path, a refusal, …).
pub type FsResult = std::result::Result<FsAnswer, FsFailure>;

impl Sandbox {
    /// Does `op` in the sandbox as `user` (uid, gid; none: the commands'
    /// default user). [`Error::Gone`] when the sandbox has ended.
    pub async fn fs(&self, op: FsOp, user: Option<(u32, u32)>) -> Result<FsResult> {
        let inner = &self.inner;
        if inner.gone.load(Ordering::SeqCst) {
            return Err(Error::Gone);
        }
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        inner.fs_waiting().insert(id, tx);
        // Gone since: nothing would answer, and nothing took the waiter.
        if inner.gone.load(Ordering::SeqCst) {
            inner.fs_waiting().remove(&id);
            return Err(Error::Gone);
        }
        if let Err(e) = inner.send(&HostMsg::Fs { id, op, user }) {
            inner.fs_waiting().remove(&id);
            return Err(e);
        }
        rx.await.map_err(|_| Error::Gone)
    }
}
