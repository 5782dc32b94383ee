//! The disk budget: a host-side watcher that measures what the workspace
//! (and the writable binds) take on the host's disk and stops the sandbox
//! once they have grown by more than the budget.
//!
//! The walk itself is `tree`'s: descriptor-relative, no link followed, no
//! other file system entered, nothing read from there printed.
//!
//! It is a watcher, not a quota: between two looks a sandbox can write at
//! full speed. The pause between looks follows the CPU time a look takes
//! (a tenth of a core on walking at most; not its wall time, which a busy
//! host stretches, and which once made a stalled look's pause long enough
//! for a writer to get 290 MiB past a 64 MiB budget) and shortens while the
//! workspace grows towards the budget, and an exec's end waits for one more
//! look, so a command that overran the budget is reported as such.

use std::path::PathBuf;
use std::sync::Weak;
use std::sync::mpsc::{Receiver, RecvTimeoutError};
use std::time::{Duration, Instant};

use crate::config::SandboxConfig;
use crate::error::{DiskStop, Error, Result};
use crate::session::{DiskWatch, Inner, LookRequest, Sandbox};
use crate::tree::{measure, roots};

/// The shortest pause between two looks.
const MIN_PAUSE: Duration = Duration::from_millis(10);
/// The shortest while the workspace grows towards the budget.
const MIN_FAST_PAUSE: Duration = Duration::from_millis(2);
/// The longest: a walk that slow is of an enormous workspace.
const MAX_PAUSE: Duration = Duration::from_secs(10);
/// Pause for this many times the CPU time a walk took, so that the
/// watcher takes at most about a tenth of a core.
const PAUSE_FACTOR: u32 = 9;

/// How the watcher measures the budget's roots: a volume by its file
/// system's own count (one `fstatvfs`: it sees the files a walk cannot,
/// those deleted but held open or in flight on a socket, and costs the
/// same however large the tree), any other root by a walk of it and a
/// look at the files its holders keep open.
pub(crate) struct Gauge {
    volume: Option<crate::volume::Mounted>,
    walked: Vec<PathBuf>,
}

impl Gauge {
    /// What `roots` take, and the deleted files `holders` keep on the
    /// walked ones.
    fn measure(&self, holders: &[i32]) -> std::io::Result<u64> {
        let volume = match &self.volume {
            Some(v) => v.used()?,
            None => 0,
        };
        if self.walked.is_empty() {
            return Ok(volume);
        }
        Ok(volume + measure(&self.walked, holders)?)
    }
}

/// What the budget's roots took before the sandbox could write, being
/// measured while the sandbox starts.
pub(crate) struct Baseline {
    budget: u64,
    base: tokio::task::JoinHandle<std::io::Result<(Gauge, u64)>>,
}

impl Baseline {
    /// Starts measuring, when `config` has a budget.
    pub(crate) fn start(config: &SandboxConfig) -> Result<Option<Baseline>> {
        let Some(budget) = config.disk else {
            return Ok(None);
        };
        if budget == 0 {
            return Err(Error::Config(
                "the disk budget must be greater than zero".into(),
            ));
        }
        let mut walked = roots(config).map_err(Error::Config)?;
        let base = tokio::task::spawn_blocking(move || {
            // A volume's free space is set first: the budget's bound for
            // what the watcher does not see in time.
            let volume = crate::volume::fit(&walked[0], crate::volume::room(budget))
                .map_err(std::io::Error::other)?;
            // What is on the volume, the workspace and any bind from it,
            // its count has.
            if let Some(v) = &volume {
                walked.retain(|r| rustix::fs::stat(r).map_or(true, |st| st.st_dev != v.dev()));
            }
            let gauge = Gauge { volume, walked };
            let base = gauge.measure(&[])?;
            Ok((gauge, base))
        });
        Ok(Some(Baseline { budget, base }))
    }

    /// Starts `sandbox`'s watcher once the baseline is known; closes the
    /// sandbox if it cannot be.
    pub(crate) async fn watch(self, sandbox: &Sandbox) -> Result<()> {
        let why = match self.base.await {
            Ok(Ok((mut gauge, base))) => {
                // Empty when the sandbox starts: nothing to add to the base.
                gauge
                    .walked
                    .extend(sandbox.inner.lifecycle.writable_layer());
                sandbox.watch_disk(gauge, self.budget, base);
                return Ok(());
            }
            Ok(Err(e)) => format!("cannot measure the workspace for the disk budget: {e}"),
            Err(e) => format!("disk budget: {e}"),
        };
        sandbox.close().await;
        Err(Error::Config(why))
    }
}

impl Sandbox {
    /// Set once the sandbox was stopped for outgrowing its disk budget.
    pub fn disk_stopped(&self) -> Option<DiskStop> {
        self.inner.disk_stop.get().copied()
    }

    /// With a disk budget, waits for a fresh look at the workspace (which
    /// stops the sandbox if it has outgrown the budget), up to a second:
    /// a workspace too large to walk in that time is judged at the
    /// watcher's next look, which still stops it. Then as
    /// [`Sandbox::disk_stopped`].
    pub async fn check_disk(&self) -> Option<DiskStop> {
        if let Some(watch) = self.inner.disk.get()
            && self.inner.disk_stop.get().is_none()
        {
            let _ = tokio::time::timeout(Duration::from_secs(1), watch.look()).await;
        }
        self.disk_stopped()
    }

    /// Starts the disk budget's watcher: `base` is what `gauge` measured
    /// before the sandbox could write.
    pub(crate) fn watch_disk(&self, gauge: Gauge, budget: u64, base: u64) {
        let (tx, rx) = std::sync::mpsc::channel();
        let watch = DiskWatch {
            budget,
            used: Default::default(),
            looks: std::sync::Mutex::new(tx),
        };
        if self.inner.disk.set(watch).is_err() {
            return;
        }
        let weak = std::sync::Arc::downgrade(&self.inner);
        let spawned = std::thread::Builder::new()
            .name("cordon-disk".into())
            .spawn(move || self::watch(weak, gauge, budget, base, rx));
        if let Err(e) = spawned {
            // Without its watcher the budget would not hold.
            tracing::error!("cannot start the disk watcher: {e}; stopping the sandbox");
            self.inner.lifecycle.kill();
            self.inner.mark_gone();
        }
    }
}

/// Runs the watcher until the sandbox ends or overruns its budget, which
/// then stops it. `base` is what the roots took when the sandbox started.
pub(crate) fn watch(
    weak: Weak<Inner>,
    gauge: Gauge,
    budget: u64,
    base: u64,
    requests: Receiver<LookRequest>,
) {
    // Ahead of the sandbox's writers on a busy host, where it can (root):
    // a look that waits for a CPU lets them write on. Linux gives each
    // thread its own nice value.
    // SAFETY: setpriority on this thread's own id.
    unsafe {
        libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, -10);
    }
    let mut waiting: Vec<LookRequest> = Vec::new();
    let mut last: Option<(Instant, u64)> = None;
    loop {
        let started = Instant::now();
        let cpu = thread_cpu_time();
        // Asked each time: a microVM resumed from disk has a new QEMU.
        let Some(holders) = weak.upgrade().map(|i| i.lifecycle.holders()) else {
            return;
        };
        let used = gauge.measure(&holders);
        let took = started.elapsed();
        let mut pause = ((thread_cpu_time() - cpu) * PAUSE_FACTOR).clamp(MIN_PAUSE, MAX_PAUSE);
        let Some(inner) = weak.upgrade() else { return };
        if inner.is_gone() {
            return;
        }
        match used {
            Ok(used) if used.saturating_sub(base) > budget => {
                inner.disk_exceeded(used - base);
                return;
            }
            Ok(used) => {
                if let Some(w) = inner.disk.get() {
                    w.used.store(
                        used.saturating_sub(base),
                        std::sync::atomic::Ordering::Relaxed,
                    );
                }
                // Growing fast: have the next look done before half the
                // headroom left could be written at the rate just seen; it
                // is written during the pause and during that look.
                if let Some((at, before)) = last
                    && used > before
                {
                    let rate = (used - before) as f64 / at.elapsed().as_secs_f64().max(1e-3);
                    let headroom = budget.saturating_sub(used.saturating_sub(base));
                    let soon =
                        Duration::from_secs_f64(headroom as f64 / rate / 2.0).saturating_sub(took);
                    pause = pause.min(soon.max(MIN_FAST_PAUSE));
                }
                last = Some((started, used));
            }
            Err(e) => tracing::warn!("cannot measure the sandbox's workspace: {e}"),
        }
        drop(inner);
        for w in waiting.drain(..) {
            let _ = w.send(());
        }
        tracing::trace!(?took, ?pause, "disk look");
        match requests.recv_timeout(pause) {
            Ok(r) => {
                waiting.push(r);
                waiting.extend(requests.try_iter());
            }
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => return,
        }
    }
}

/// CPU time this thread has used: what a look costs the host, whatever
/// the wait for a CPU or a lock made of its wall time.
fn thread_cpu_time() -> Duration {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    Duration::new(t.tv_sec as u64, t.tv_nsec as u32)
}
