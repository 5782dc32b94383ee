//! What every owner of a sandbox (a job, an API session) serves the same
//! way: its workspace's files, its network policy, its desktop's live view
//! and its JupyterLab. Each is written once over an [`Owner`], with one set
//! of answers for what is missing; where a kind differs (a job's archived
//! files, a session woken from idle) one exhaustive `match` says how. The
//! routes of each kind are thin, so that the OpenAPI document describes
//! every path as it is.

mod desktop;
mod files;
mod lab;
mod network;

pub(crate) use desktop::*;
pub(crate) use files::*;
pub(crate) use lab::*;
pub(crate) use network::*;

use crate::http::ApiResult;
use crate::owner::Owner;
use crate::state::Shared;
use crate::store::{JobRow, SessionRow};

/// An owner of the tenant's, as the store has it. Another tenant's is as
/// absent as a missing one.
pub(crate) enum Found {
    Job(Box<JobRow>),
    Session(SessionRow),
}

pub(crate) async fn find(shared: &Shared, tenant: &str, owner: &Owner) -> ApiResult<Found> {
    Ok(match owner {
        Owner::Job(id) => Found::Job(Box::new(crate::jobs::find(shared, tenant, id).await?)),
        Owner::Session(id) => Found::Session(crate::sessions::find(shared, tenant, id).await?),
    })
}
