//! This process as a worker: it claims jobs with leases, runs each in its
//! runner, keeps the leases alive, stops a job whose lease it lost or that
//! an API process cancelled, and settles the jobs of workers that died
//! (see [`crate::store`]'s leases for the rules).
//!
//! A worker's id is kept in its data directory, so that a worker that
//! restarts settles at once what it held before it stopped, rather than
//! after its leases lapse. One process per data directory.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_agent::Cancel;

use crate::job::JobState;
use crate::state::Shared;
use crate::store::StoreError;

/// What a job lost with its worker is told.
const LOST: &str = "its worker stopped answering (lease expired)";
/// What a job its worker held but did not run is told.
const STRAY: &str = "its worker lost track of it";
/// What a job running when its worker stopped is told, once it is back.
pub(crate) const RESTARTED: &str = "server restarted";

/// How often a worker looks for cancels asked through another process.
const CANCEL_POLL: Duration = Duration::from_secs(1);

/// How often a worker looks for finished jobs of its own still to archive
/// (an upload that failed, or a restart before one).
const ARCHIVE_POLL: Duration = Duration::from_secs(30);

/// This process's worker id: `w-` and 12 hex digits, made once per data
/// directory and kept in `<data_dir>/worker-id`.
pub(crate) fn worker_id(data_dir: &std::path::Path) -> std::io::Result<String> {
    let path = data_dir.join("worker-id");
    let valid = |s: &str| {
        s.len() == 14 && s.starts_with("w-") && s[2..].bytes().all(|b| b.is_ascii_hexdigit())
    };
    match std::fs::read_to_string(&path) {
        Ok(s) if valid(s.trim()) => return Ok(s.trim().to_string()),
        Ok(_) => tracing::warn!("{} is not a worker id; making a new one", path.display()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    std::fs::create_dir_all(data_dir)?;
    let id = format!("w-{}", crate::store::random_hex(6));
    let tmp = data_dir.join(format!(".worker-id.{}", std::process::id()));
    std::fs::write(&tmp, format!("{id}\n"))?;
    std::fs::rename(&tmp, &path)?;
    Ok(id)
}

/// Settles at once what this worker held when it last stopped: those
/// jobs' sandboxes died with it.
pub(crate) async fn recover(shared: &Shared) -> Result<usize, StoreError> {
    let ids = shared.store.held_by(&shared.worker).await?;
    let mut n = 0;
    for id in &ids {
        if let Some((state, event)) = shared
            .store
            .settle_lost(id, Some(&shared.worker), RESTARTED)
            .await?
        {
            shared.hub.publish(id, &[event]);
            n += 1;
            tracing::warn!(job = %id, "was running when this worker stopped: now {}", state.as_str());
        }
    }
    Ok(n)
}

/// Starts this process's job workers, its heartbeat and its sweeper of
/// lapsed leases. With no workers (an API-only process) the sweeper runs
/// alone: any process may settle a dead worker's jobs.
pub(crate) fn start(shared: &Arc<Shared>) {
    for _ in 0..shared.config.workers {
        tokio::spawn(run_jobs(shared.clone()));
    }
    if shared.config.workers > 0 {
        tokio::spawn(heartbeat(Arc::downgrade(shared)));
        tokio::spawn(cancels(Arc::downgrade(shared)));
        if shared.archive.is_some() {
            tokio::spawn(archive_backlog(Arc::downgrade(shared)));
        }
    }
    tokio::spawn(sweep(Arc::downgrade(shared)));
    if shared.store.backend() == crate::store::Backend::Postgres {
        tokio::spawn(listen(shared.config.db.clone(), Arc::downgrade(shared)));
    }
}

/// PostgreSQL's LISTEN: a job queued or a slot freed by any process wakes
/// this one's idle workers at once, and new events of a job running
/// elsewhere wake that job's streams here (the payload is its id). The polls stay, for what is missed
/// while the connection is down.
async fn listen(url: String, weak: std::sync::Weak<Shared>) {
    loop {
        match sqlx::postgres::PgListener::connect(&url).await {
            Ok(mut l) => match l.listen_all(["cordon_jobs", "cordon_events"]).await {
                Ok(()) => loop {
                    let n = match l.recv().await {
                        Ok(n) => n,
                        Err(e) => {
                            tracing::warn!("listening for other processes' jobs: {e}");
                            break;
                        }
                    };
                    let Some(shared) = weak.upgrade() else { return };
                    if n.channel() == "cordon_jobs" {
                        shared.wake.notify_one();
                    } else {
                        shared.hub.poke(n.payload());
                    }
                },
                Err(e) => tracing::warn!("LISTEN: {e}"),
            },
            Err(e) => tracing::warn!("cannot listen for other processes' jobs: {e}"),
        }
        if weak.strong_count() == 0 {
            return;
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
}

/// Takes queued jobs in order and runs them, one at a time per worker.
async fn run_jobs(shared: Arc<Shared>) {
    while !shared.stopping.is_cancelled() {
        // Registered before looking at the queue, so a job queued between
        // the look and the wait still wakes this worker.
        let mut notified = Box::pin(shared.wake.notified());
        notified.as_mut().enable();
        // A job started as it was posted holds a slot of its own.
        let Ok(slot) = shared.slots.clone().acquire_owned().await else {
            return;
        };
        let claimed = {
            let _turn = shared.claim.lock().await;
            shared
                .store
                .claim(&shared.worker, shared.claim_terms())
                .await
        };
        match claimed {
            Ok(Some(claimed)) => {
                // Out of the waiters before running: notify_one wakes the
                // oldest, and a busy slot's registration would take a wake
                // meant for an idle one until its job ends (dropping passes
                // on a wake it already took).
                drop(notified);
                // There may be more: the next idle slot looks, and wakes
                // the next if it finds one too. One wake per job queued
                // would race every idle slot for the claim lock instead.
                shared.wake.notify_one();
                let cancel = crate::slot::register(&shared, &claimed.job);
                crate::slot::run(&shared, claimed, cancel).await;
                drop(slot);
                // A slot freed: this one looks again at once, and takes a
                // job its tenant's limit held back if one may go now.
            }
            Ok(None) => {
                drop(slot);
                // Woken by a new job, or polling for jobs queued by another
                // process sharing the database.
                tokio::select! {
                    _ = tokio::time::timeout(Duration::from_secs(1), notified) => {}
                    () = shared.stopping.cancelled() => {}
                }
            }
            Err(e) => {
                drop(slot);
                // Not waiting for a wake: leave it to the idle slots.
                drop(notified);
                tracing::error!("cannot take a job from the queue: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// The jobs this process runs now: id, cancel handle, claim.
fn running(shared: &Shared) -> Vec<(String, Cancel, i64)> {
    shared
        .running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .iter()
        .map(|(id, (c, a))| (id.clone(), c.clone(), *a))
        .collect()
}

/// Extends this worker's leases every sixth of a lease. A job it runs that
/// the database no longer gives it was settled by another process: it is
/// stopped. If the database cannot be reached for most of a lease, every
/// job is stopped before another process may take it over.
async fn heartbeat(weak: std::sync::Weak<Shared>) {
    let mut last_held = Instant::now();
    // Held here at the last heartbeat but run by no slot.
    let mut strays = std::collections::HashSet::new();
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let lease = shared.config.lease;
        let every = (lease / 6).max(Duration::from_millis(50));
        let sent = Instant::now();
        match shared.store.heartbeat(&shared.worker, lease).await {
            Ok(held) => {
                last_held = sent;
                strays = settle_strays(&shared, &held, &strays).await;
                for (id, cancel, attempt) in running(&shared) {
                    match held.iter().find(|h| h.id == id && h.attempt == attempt) {
                        Some(h) if h.cancel => cancel.cancel(),
                        Some(_) => {}
                        // Missing: finished here a moment ago, or lost.
                        None => {
                            if !still_ours(&shared, &id, attempt).await {
                                tracing::warn!(job = %id, "its lease was taken: stopping it");
                                shared.metrics.lease_lost();
                                cancel.cancel();
                            }
                        }
                    }
                }
            }
            Err(e) => {
                tracing::warn!("heartbeat: {e}");
                // Stop before the lease can lapse (another process then
                // runs the job), with a margin for the database's clock.
                if last_held.elapsed() >= lease.mul_f32(0.8) {
                    for (id, cancel, _) in running(&shared) {
                        tracing::error!(job = %id, "the database is out of reach: stopping it");
                        shared.metrics.lease_lost();
                        cancel.cancel();
                    }
                }
            }
        }
        drop(shared);
        tokio::time::sleep(every).await;
    }
}

/// The jobs this worker holds (`held`, just renewed) that none of its slots
/// runs: a job is registered with its slot as it is claimed, so one missing
/// at two heartbeats running (`before`) was lost here, and would otherwise
/// be renewed for ever. It is settled as a lost one is: queued again, or
/// failed past its attempts. The strays seen now.
async fn settle_strays(
    shared: &Shared,
    held: &[crate::store::Held],
    before: &HashSet<(String, i64)>,
) -> HashSet<(String, i64)> {
    let running = running(shared);
    let now: HashSet<(String, i64)> = held
        .iter()
        .filter(|h| {
            !running
                .iter()
                .any(|(id, _, a)| *id == h.id && *a == h.attempt)
        })
        .map(|h| (h.id.clone(), h.attempt))
        .collect();
    for (id, _) in now.intersection(before) {
        match shared
            .store
            .settle_lost(id, Some(&shared.worker), STRAY)
            .await
        {
            Ok(Some((state, event))) => {
                shared.hub.publish(id, &[event]);
                if state == JobState::Queued {
                    shared.wake.notify_one();
                }
                tracing::error!(job = %id, "held here but run by no slot: now {}", state.as_str());
            }
            Ok(None) => {}
            Err(e) => tracing::warn!(job = %id, "cannot settle: {e}"),
        }
    }
    now
}

/// Whether this worker's claim `attempt` on job `id` still holds: running
/// on it, or finished by it (its runner records the end before it lets
/// go). A job settled by another process has no worker; one claimed again
/// has another claim, even if by this worker.
async fn still_ours(shared: &Shared, id: &str, attempt: i64) -> bool {
    match shared.store.holder(id).await {
        Ok(Some((_, Some(l)))) => l.worker == shared.worker && l.attempt == attempt,
        Ok(_) => false,
        // Unknown: the lease deadline above decides.
        Err(_) => true,
    }
}

/// Cancels asked through another process reach the job here within a
/// second.
async fn cancels(weak: std::sync::Weak<Shared>) {
    loop {
        tokio::time::sleep(CANCEL_POLL).await;
        let Some(shared) = weak.upgrade() else { return };
        match shared.store.cancels_for(&shared.worker).await {
            Ok(ids) => {
                let running = running(&shared);
                for id in ids {
                    if let Some((_, c, _)) = running.iter().find(|(r, _, _)| *r == id) {
                        c.cancel();
                    }
                }
            }
            Err(e) => tracing::debug!("cancels: {e}"),
        }
    }
}

/// Settles the jobs of workers whose leases lapsed, every half lease.
async fn sweep(weak: std::sync::Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else { return };
        let every = (shared.config.lease / 2).max(Duration::from_millis(50));
        match shared.store.lapsed(100).await {
            Ok(ids) => {
                for id in ids {
                    match shared.store.settle_lost(&id, None, LOST).await {
                        Ok(Some((state, event))) => {
                            shared.hub.publish(&id, &[event]);
                            if state == JobState::Queued {
                                shared.wake.notify_one();
                            }
                            tracing::warn!(job = %id, "its worker stopped answering: now {}", state.as_str());
                        }
                        Ok(None) => {}
                        Err(e) => tracing::warn!(job = %id, "cannot settle: {e}"),
                    }
                }
            }
            Err(e) => tracing::warn!("cannot look for lapsed leases: {e}"),
        }
        drop(shared);
        tokio::time::sleep(every).await;
    }
}

/// Archives this worker's finished jobs that are not yet: at start, then
/// every [`ARCHIVE_POLL`].
async fn archive_backlog(weak: std::sync::Weak<Shared>) {
    loop {
        let Some(shared) = weak.upgrade() else { return };
        match shared.store.unarchived(&shared.worker, 50).await {
            Ok(ids) => {
                for id in ids {
                    crate::slot::archive(&shared, &id, Duration::ZERO).await;
                }
            }
            Err(e) => tracing::warn!("cannot list the jobs to archive: {e}"),
        }
        drop(shared);
        tokio::time::sleep(ARCHIVE_POLL).await;
    }
}
