//! What every owner of a sandbox (a job, an API session, an API sandbox)
//! serves the same way: its workspace's files, its network policy, its desktop's live view,
//! its JupyterLab and its ports' previews. Each is written once over an [`Owner`], with one set
//! of answers for what is missing; where a kind differs (a job's archived
//! files, a session woken from idle, a sandbox's record) one exhaustive `match` says how. The
//! routes of each kind are thin, so that the OpenAPI document describes
//! every path as it is.

mod desktop;
mod files;
mod lab;
mod network;
pub(crate) mod ports;

pub(crate) use desktop::*;
pub(crate) use files::*;
pub(crate) use lab::*;
pub(crate) use network::*;
pub(crate) use ports::*;

use std::time::{Duration, Instant};

use crate::http::ApiResult;
use crate::job::JobState;
use crate::owner::Owner;
use crate::state::Shared;
use crate::store::{JobRow, SandboxRow, SessionRow};

/// How long a running job's sandbox may take to be listed (under TCG a
/// microVM takes this long to boot).
const LISTING: Duration = Duration::from_secs(120);

/// An owner of the tenant's, as the store has it. Another tenant's is as
/// absent as a missing one.
pub(crate) enum Found {
    Job(Box<JobRow>),
    Session(SessionRow),
    Sandbox(SandboxRow),
}

pub(crate) async fn find(shared: &Shared, tenant: &str, owner: &Owner) -> ApiResult<Found> {
    Ok(match owner {
        Owner::Job(id) => Found::Job(Box::new(crate::jobs::find(shared, tenant, id).await?)),
        Owner::Session(id) => Found::Session(crate::sessions::find(shared, tenant, id).await?),
        Owner::Sandbox(id) => Found::Sandbox(crate::sandbox_api::find(shared, tenant, id).await?),
    })
}

/// Waits for a running job's sandbox to be listed here (a job is running a
/// moment before its sandbox is made), and says why there is none if it
/// is not (or is gone by the time it is used).
async fn listed(shared: &Shared, tenant: &str, mut job: JobRow) -> ApiResult<String> {
    let id = job.id.clone();
    let owner = Owner::Job(id.clone());
    let deadline = Instant::now() + LISTING;
    while job.state == JobState::Running
        && shared.sandboxes.get(&owner).is_none()
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        job = crate::jobs::find(shared, tenant, &id).await?;
    }
    Ok(match job.state {
        JobState::Queued => "it has not started yet".to_string(),
        JobState::Running => "its sandbox is being made or closed; try again".to_string(),
        _ => format!(
            "it has finished, and its sandbox with it; its files stay at /v1/jobs/{id}/files"
        ),
    })
}

/// How often a Lab or preview served here for a job on another worker
/// looks whether the job still runs there.
const WATCH: Duration = Duration::from_secs(5);

/// Closes this process's Lab and previews of job `id` once the job no
/// longer runs on `worker` (or this process stops).
fn watch_elsewhere(shared: &std::sync::Arc<Shared>, tenant: &str, id: &str, worker: String) {
    let shared = std::sync::Arc::downgrade(shared);
    let (tenant, id) = (tenant.to_string(), id.to_string());
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(WATCH).await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            match shared.store.job(&tenant, &id).await {
                Ok(Some(job))
                    if job.state == JobState::Running
                        && job.worker.as_deref() == Some(worker.as_str()) => {}
                Ok(_) => {
                    shared.remote_labs.close(&id);
                    shared.remote_previews.close(&id);
                    return;
                }
                Err(e) => tracing::warn!(job = %id, "cannot look at a job served here: {e}"),
            }
        }
    });
}
