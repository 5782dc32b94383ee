//! File system operations in a sandbox (see [`crate::protocol::FsOp`]),
//! done by its supervisor as a user of the sandbox's: the host asks, the
//! supervisor answers; the host opens no path of the sandbox's.

use std::sync::atomic::Ordering;

use tokio::sync::{mpsc, oneshot};

use super::Sandbox;
use crate::error::{Error, Result};
use crate::protocol::{FsAnswer, FsChange, FsFailure, FsOp, GuestUsage, HostMsg, SupMsg};

/// What a file system operation comes to: the supervisor's answer, or
/// its failure (a missing path, a refusal, …).
pub type FsResult = std::result::Result<FsAnswer, FsFailure>;

/// What the supervisor answers a question with.
pub(super) enum Answer {
    Fs(FsResult),
    Usage(GuestUsage),
    LayerFrozen(std::result::Result<(), String>),
}

/// An answer to another question than the one asked.
fn mismatched() -> Error {
    Error::Io(std::io::Error::other(
        "the supervisor answered another question",
    ))
}

/// How much of the machine a sandbox uses now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Usage {
    /// CPU time of every process it ran, living or ended.
    pub cpu_ns: u64,
    pub processes: u32,
    /// Bytes of memory in use: its cgroup's charge natively, its guest's
    /// (total less available) in a microVM.
    pub memory_used: u64,
    /// Its memory limit, or the guest's memory, when there is one.
    pub memory_limit: Option<u64>,
    /// What its files have grown by (the workspace, the image's writable
    /// layer), at the disk watcher's last look; with a budget only.
    pub disk_used: Option<u64>,
    pub disk_limit: Option<u64>,
}

impl Sandbox {
    /// Asks the supervisor `build(id)` and waits for its answer.
    async fn ask(&self, build: impl FnOnce(u64) -> HostMsg) -> Result<Answer> {
        let inner = &self.inner;
        if inner.gone.load(Ordering::SeqCst) {
            return Err(Error::Gone);
        }
        inner.check_adopted()?;
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        inner.asked().insert(id, tx);
        // Gone since: nothing would answer, and nothing took the waiter.
        if inner.gone.load(Ordering::SeqCst) {
            inner.asked().remove(&id);
            return Err(Error::Gone);
        }
        if let Err(e) = inner.send(&build(id)) {
            inner.asked().remove(&id);
            return Err(e);
        }
        rx.await.map_err(|_| Error::Gone)
    }

    /// Does `op` in the sandbox as `user` (uid, gid; none: the commands'
    /// default user). [`Error::Gone`] when the sandbox has ended.
    pub async fn fs(&self, op: FsOp, user: Option<(u32, u32)>) -> Result<FsResult> {
        match self.ask(|id| HostMsg::Fs { id, op, user }).await? {
            Answer::Fs(r) => Ok(r),
            _ => Err(mismatched()),
        }
    }

    /// How much of the machine the sandbox uses now.
    pub async fn usage(&self) -> Result<Usage> {
        let guest = match self.ask(|id| HostMsg::Usage { id }).await? {
            Answer::Usage(u) => u,
            _ => return Err(mismatched()),
        };
        let inner = &self.inner;
        // The cgroup's charge where there is one; a microVM's kernel is
        // its own; else (no cgroup to read) what its processes hold.
        let (memory_used, memory_limit) = match inner.lifecycle.memory() {
            Some(m) => m,
            None if self.info().backend == "microvm" => (
                guest.memory_used,
                Some(guest.memory_total).filter(|&t| t > 0),
            ),
            None => (guest.resident, None),
        };
        let disk = inner.disk.get();
        Ok(Usage {
            cpu_ns: guest.cpu_ns,
            processes: guest.processes,
            memory_used,
            memory_limit,
            disk_used: disk.map(|d| d.used.load(Ordering::Relaxed)),
            disk_limit: disk.map(|d| d.budget),
        })
    }
}

/// How long a guest may take to freeze or thaw its writable layer (a
/// freeze writes out what is not on the disk yet).
const FREEZE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

/// Characters of a guest's reason kept.
const WHY_KEPT: usize = 300;

impl Sandbox {
    /// Freezes or thaws the sandbox's writable layer (see
    /// `HostMsg::FreezeLayer`), within [`FREEZE_TIMEOUT`].
    async fn freeze_layer(&self, frozen: bool) -> Result<()> {
        let asked = self.ask(|id| HostMsg::FreezeLayer { id, frozen });
        let answer = tokio::time::timeout(FREEZE_TIMEOUT, asked)
            .await
            .map_err(|_| {
                Error::Io(std::io::Error::new(
                    std::io::ErrorKind::TimedOut,
                    format!(
                        "the sandbox did not {} its writable layer in {} s",
                        if frozen { "freeze" } else { "thaw" },
                        FREEZE_TIMEOUT.as_secs()
                    ),
                ))
            })??;
        match answer {
            Answer::LayerFrozen(Ok(())) => Ok(()),
            Answer::LayerFrozen(Err(why)) => Err(refused(&why)),
            _ => Err(mismatched()),
        }
    }
}

/// The guest's refusal: its words escaped and cut short here, whoever
/// shows them (its root may have taken over its supervisor).
fn refused(why: &str) -> Error {
    Error::Io(std::io::Error::other(format!(
        "the guest said: {}",
        why.chars()
            .take(WHY_KEPT)
            .collect::<String>()
            .escape_debug()
    )))
}

/// A sandbox's writable layer frozen: thawed by [`Frozen::thaw`], or when
/// dropped (a caller that gave up), by a message nobody waits on.
pub(crate) struct Frozen<'a> {
    sandbox: &'a Sandbox,
    thawed: bool,
}

impl<'a> Frozen<'a> {
    pub(crate) async fn new(sandbox: &'a Sandbox) -> Result<Frozen<'a>> {
        let mut frozen = Frozen {
            sandbox,
            thawed: false,
        };
        if let Err(e) = sandbox.freeze_layer(true).await {
            // It may have frozen without saying so in time.
            frozen.thawed = true;
            let _ = sandbox.freeze_layer(false).await;
            return Err(e);
        }
        Ok(frozen)
    }

    pub(crate) async fn thaw(mut self) -> Result<()> {
        self.thawed = true;
        self.sandbox.freeze_layer(false).await
    }
}

impl Drop for Frozen<'_> {
    fn drop(&mut self) {
        if !self.thawed {
            let inner = &self.sandbox.inner;
            let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
            let _ = inner.send(&HostMsg::FreezeLayer { id, frozen: false });
        }
    }
}

/// Messages a watch may hold unread before it is ended as overflowed.
const WATCH_BACKLOG: usize = 1024;

/// What a watch reports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchEvent {
    Changes(Vec<FsChange>),
    /// Changes were lost (the kernel's queue, or this watch's reader, fell
    /// behind); the watch has ended.
    Overflowed,
}

/// A watch's entry among the session's.
pub(super) struct WatchSlot {
    started: Option<oneshot::Sender<std::result::Result<(), FsFailure>>>,
    events: mpsc::Sender<WatchEvent>,
}

impl WatchSlot {
    /// Takes `msg` for this watch; false once the watch is over.
    pub(super) fn take(&mut self, msg: SupMsg) -> bool {
        match msg {
            SupMsg::Watching { result, .. } => {
                let ok = result.is_ok();
                if let Some(s) = self.started.take() {
                    let _ = s.send(result);
                }
                ok
            }
            SupMsg::Changes {
                changes,
                overflowed,
                ..
            } => {
                let full = self.events.capacity() <= 1;
                if overflowed || full {
                    let _ = self.events.try_send(WatchEvent::Overflowed);
                    return false;
                }
                let _ = self.events.try_send(WatchEvent::Changes(changes));
                true
            }
            _ => true,
        }
    }
}

/// A directory of a sandbox watched for changes: dropped, it stops.
pub struct Watcher {
    id: u64,
    inner: std::sync::Arc<super::Inner>,
    events: mpsc::Receiver<WatchEvent>,
}

impl Watcher {
    /// The next changes; `None` once the watch or the sandbox has ended.
    pub async fn next(&mut self) -> Option<WatchEvent> {
        self.events.recv().await
    }

    /// What has come and was not taken yet, without waiting.
    pub fn ready(&mut self) -> Vec<WatchEvent> {
        let mut out = Vec::new();
        while let Ok(e) = self.events.try_recv() {
            out.push(e);
        }
        out
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.inner.watching().remove(&self.id);
        let _ = self.inner.send(&HostMsg::Unwatch { id: self.id });
    }
}

impl Sandbox {
    /// Watches directory `path` of the sandbox (and with `recursive` the
    /// directories below it) for changes. The changes a command or a file
    /// system operation made come before its end or answer is reported.
    pub async fn watch(
        &self,
        path: &str,
        recursive: bool,
    ) -> Result<std::result::Result<Watcher, FsFailure>> {
        let inner = &self.inner;
        if inner.gone.load(Ordering::SeqCst) {
            return Err(Error::Gone);
        }
        inner.check_adopted()?;
        let id = inner.next_id.fetch_add(1, Ordering::Relaxed);
        let (started, answer) = oneshot::channel();
        let (tx, events) = mpsc::channel(WATCH_BACKLOG);
        inner.watching().insert(
            id,
            WatchSlot {
                started: Some(started),
                events: tx,
            },
        );
        let watcher = Watcher {
            id,
            inner: inner.clone(),
            events,
        };
        if inner.gone.load(Ordering::SeqCst) {
            return Err(Error::Gone);
        }
        inner.send(&HostMsg::Watch {
            id,
            path: path.to_string(),
            recursive,
        })?;
        match answer.await {
            Ok(Ok(())) => Ok(Ok(watcher)),
            Ok(Err(f)) => Ok(Err(f)),
            Err(_) => Err(Error::Gone),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest's refusal to freeze reaches no terminal as it was sent:
    /// no escape sequence, no line break, no bidirectional override, and
    /// not a megabyte of it.
    #[test]
    fn a_guests_refusal_is_shown_escaped_and_short() {
        let hostile = format!(
            "\x1b]52;c;cm0gLXJmIH4=\x07\r\n\u{202e}{}",
            "x".repeat(1 << 20)
        );
        let shown = refused(&hostile).to_string();
        assert!(shown.contains("the guest said: "), "{shown}");
        assert!(
            !shown.chars().any(|c| c.is_control() || c == '\u{202e}'),
            "{shown:?}"
        );
        assert!(shown.len() < 2 * WHY_KEPT, "{} bytes", shown.len());
    }
}
