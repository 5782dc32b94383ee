//! A job in one of this process's worker slots: registered where cancels,
//! heartbeats and a shutdown find it, run by the runner, then archived
//! where the deployment keeps finished jobs. A worker's claim and a pooled
//! job started as it is posted (`jobs`) both come here.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_agent::Cancel;

use crate::state::Shared;
use crate::store::{Claimed, JobRow};

/// How long a just-archived workspace stays on disk, for the reads that
/// looked at the job before it was archived.
const ARCHIVE_GRACE: Duration = Duration::from_secs(2);

/// Lists job `job`, just claimed by this process, as running here; its
/// cancel handle.
pub(crate) fn register(shared: &Shared, job: &JobRow) -> Cancel {
    let cancel = Cancel::new();
    shared
        .running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(job.id.clone(), (cancel.clone(), job.attempts));
    cancel
}

/// Runs a job [`register`]ed here to its end, then lets it go.
pub(crate) async fn run(shared: &Arc<Shared>, claimed: Claimed, cancel: Cancel) {
    let id = claimed.job.id.clone();
    shared.metrics.lease_taken();
    shared.runner.run(claimed, cancel).await;
    shared.metrics.lease_ended();
    shared
        .running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(&id);
    if shared.archive.is_some() {
        // Off the slot: the next job need not wait for an upload.
        let shared = shared.clone();
        tokio::spawn(async move { archive(&shared, &id, ARCHIVE_GRACE).await });
    }
}

/// Sends finished job `id`'s workspace and log up to the archive, records
/// that, and removes the local copy (after `grace`): from then on every
/// process serves its files. A failure is logged and left to
/// the worker's backlog; uploading again is harmless.
pub(crate) async fn archive(shared: &Shared, id: &str, grace: Duration) {
    let Some(archive) = &shared.archive else {
        return;
    };
    // Ids are the server's own; anything else is not a path to join.
    if !crate::http::plausible_id(id) {
        return;
    }
    let dirs = shared.config.job_dirs();
    let workspace = dirs.workspace(id);
    if let Err(e) = std::fs::symlink_metadata(&workspace) {
        if e.kind() == std::io::ErrorKind::NotFound {
            // Nothing to keep (it never had one, or it went by hand).
            if let Err(e) = shared.store.workspace_removed(id).await {
                tracing::warn!(job = %id, "cannot record a missing workspace: {e}");
            }
        }
        return;
    }
    let started = Instant::now();
    // Mounted (if a volume) while it is packed.
    let _in_use = match shared.config.enter_workspace(&workspace).await {
        Ok(in_use) => in_use,
        Err(e) => {
            tracing::warn!(job = %id, "cannot archive the job (tried again later): {e}");
            return;
        }
    };
    match archive
        .keep(id, &workspace, Some(&dirs.session_log(id)))
        .await
    {
        Ok(true) => {}
        Ok(false) => return,
        Err(e) => {
            tracing::warn!(job = %id, "cannot archive the job (tried again later): {e}");
            return;
        }
    }
    match shared.store.archived(id).await {
        Ok(true) => {
            tracing::debug!(job = %id, "archived in {:?}", started.elapsed());
        }
        Ok(false) => {
            // Archived before (by an earlier try), or its workspace was
            // removed meanwhile: then the copy just made is not wanted.
            match shared.store.is_archived(id).await {
                Ok(true) => {}
                Ok(false) => {
                    if let Err(e) = archive.forget(id).await {
                        tracing::warn!(job = %id, "cannot remove an unwanted archive: {e}");
                    }
                }
                Err(e) => tracing::warn!(job = %id, "cannot look at the job: {e}"),
            }
            return;
        }
        Err(e) => {
            tracing::warn!(job = %id, "cannot record the archive (tried again later): {e}");
            return;
        }
    }
    tokio::time::sleep(grace).await;
    crate::files::remove_files(dirs.checkpoints(id), &format!("job {id}")).await;
    crate::files::remove_files(workspace, &format!("job {id}")).await;
}
