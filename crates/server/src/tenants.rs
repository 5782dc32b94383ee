//! `DELETE /v1/tenants/{tenant}`: the operator forgets a tenant. Its
//! tokens go first, so nothing new arrives while the rest goes: its git
//! logins, its live MCP sessions (with their workspaces), its jobs
//! (cancelled if they run; record, events, output, workspace and archive
//! copy) and its API sessions (sandbox, record, log, workspace). Nothing of another tenant is touched: every step is keyed
//! by the tenant's exact name.
//!
//! What cannot go yet is answered as such (202, with each leftover and
//! why): a job still stopping, a session whose turn did not end in time,
//! or one that lives on another API process of the deployment. The same
//! DELETE again finishes the work; on a tenant with nothing left it
//! answers 200 with zero counts.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::delete;
use futures_util::StreamExt;
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::{ApiError, ApiResult, Operator};
use crate::state::Shared;
use crate::store::check_tenant;

/// How long a session's running turn has, once cancelled, to let go.
const TURN_GRACE: Duration = Duration::from_secs(10);
/// Jobs cancelled and removed at once: each cancel waits for its run.
const JOBS_AT_ONCE: usize = 8;

/// What forgetting a tenant removed, and what it could not yet.
#[derive(Debug, Default, Serialize, ToSchema)]
pub struct Forgotten {
    pub tenant: String,
    /// Bearer tokens revoked.
    pub tokens: u64,
    /// Logins for git hosts deleted.
    pub git_logins: u64,
    /// Jobs deleted (those queued or running were cancelled first).
    pub jobs: u64,
    /// API sessions deleted.
    pub sessions: u64,
    /// Live MCP sessions ended, with their workspaces.
    pub mcp_sessions: u64,
    /// What is still there: send the DELETE again once it has stopped, or
    /// to the API process that holds it.
    pub remaining: Vec<Leftover>,
}

/// Something of the tenant's that is not gone yet.
#[derive(Debug, Serialize, ToSchema)]
pub struct Leftover {
    pub kind: LeftoverKind,
    pub id: String,
    #[schema(example = "still stopping")]
    pub reason: String,
}

#[derive(Debug, Clone, Copy, Serialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum LeftoverKind {
    Job,
    Session,
}

pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new().route("/v1/tenants/{tenant}", delete(forget_tenant))
}

#[utoipa::path(delete, path = "/v1/tenants/{tenant}", tag = "tokens", summary = "Forget a tenant (operator)",
    description = "Revokes the tenant's tokens, then deletes its git logins, ends its live MCP sessions, and deletes its jobs (cancelling those queued or running) and its API sessions, with their files. 200 when all is gone; 202 with `remaining` when some of it is still stopping or lives on another API process: send the same DELETE again (there).",
    params(("tenant" = String, Path, description = "The tenant's name")),
    responses((status = 200, description = "Everything of the tenant's is gone", body = Forgotten),
              (status = 202, description = "Some of it is not gone yet: see `remaining`", body = Forgotten),
              (status = 400, description = "Not a tenant's name", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Not an operator's token", body = crate::http::ErrorResponse),
              (status = 409, description = "The tenant of the token making the request", body = crate::http::ErrorResponse)))]
pub(crate) async fn forget_tenant(
    State(shared): State<Arc<Shared>>,
    Operator(by): Operator,
    Path(tenant): Path<String>,
) -> ApiResult<(StatusCode, Json<Forgotten>)> {
    check_tenant(&tenant).map_err(|e| ApiError::bad_request(&e))?;
    if tenant == by {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "own_tenant",
            "this token's own tenant cannot be forgotten with it: use another operator's token",
        ));
    }
    let mut done = Forgotten {
        tenant: tenant.clone(),
        tokens: shared.store.revoke_tenant(&tenant).await?,
        git_logins: shared.store.delete_git_credentials(&tenant).await?,
        ..Forgotten::default()
    };
    done.mcp_sessions = crate::mcp::close_tenant(&shared, &tenant).await as u64;
    forget_jobs(&shared, &tenant, &mut done).await?;
    forget_sessions(&shared, &tenant, &mut done).await?;
    tracing::info!(
        by = %by, tenant = %tenant, tokens = done.tokens, git_logins = done.git_logins,
        jobs = done.jobs, sessions = done.sessions, mcp_sessions = done.mcp_sessions,
        remaining = done.remaining.len(),
        "tenant forgotten"
    );
    let status = if done.remaining.is_empty() {
        StatusCode::OK
    } else {
        StatusCode::ACCEPTED
    };
    Ok((status, Json(done)))
}

async fn forget_jobs(shared: &Shared, tenant: &str, done: &mut Forgotten) -> ApiResult<()> {
    let ids = shared.store.job_ids(tenant).await?;
    let mut removals = futures_util::stream::iter(ids)
        .map(|id| async move {
            // Read again: it may have ended, or gone, since the listing.
            let removed = match shared.store.job(tenant, &id).await? {
                Some(job) => Some(crate::jobs::remove(shared, &job).await?),
                None => None,
            };
            Ok::<_, ApiError>((id, removed))
        })
        .buffer_unordered(JOBS_AT_ONCE);
    while let Some(result) = removals.next().await {
        match result? {
            (_, Some(true)) => done.jobs += 1,
            (id, Some(false)) => done.remaining.push(Leftover {
                kind: LeftoverKind::Job,
                id,
                reason: "still stopping".into(),
            }),
            (_, None) => {}
        }
    }
    Ok(())
}

async fn forget_sessions(shared: &Shared, tenant: &str, done: &mut Forgotten) -> ApiResult<()> {
    for row in shared.store.sessions(tenant, i64::MAX).await? {
        if crate::sessions::lives_elsewhere(shared, &row.id) {
            done.remaining.push(Leftover {
                kind: LeftoverKind::Session,
                id: row.id,
                reason:
                    "it lives on another API process of this deployment: send this DELETE there"
                        .into(),
            });
            continue;
        }
        crate::sessions::cancel_turn(shared, &row.id);
        let slot = shared.sessions.slot(&row.id);
        let Ok(guard) = tokio::time::timeout(TURN_GRACE, slot.lock_owned()).await else {
            done.remaining.push(Leftover {
                kind: LeftoverKind::Session,
                id: row.id,
                reason: "its turn did not end in time".into(),
            });
            continue;
        };
        if crate::sessions::remove(shared, &row, guard).await? {
            done.sessions += 1;
        }
    }
    Ok(())
}
