//! A running job's desktop, live: the WebSocket bridge of [`crate::desktop`].

use std::sync::Arc;

use axum::extract::{Path, Query, State};
use axum::response::Response;

use crate::desktop::{Upgrade, VncParams, access_of, bad_query, bridge, no_desktop};
use crate::http::{ApiError, Tenant};
use crate::job::JobState;
use crate::state::Shared;

#[utoipa::path(get, path = "/v1/jobs/{id}/vnc", tag = "jobs",
    summary = "Live view of a running job's desktop (WebSocket carrying RFB)",
    description = "A WebSocket upgrade; each binary message carries RFB (VNC) bytes. View-only unless `access=control`. Browsers, which cannot set headers on a WebSocket, may send the token as the subprotocol `cordon.bearer.<token>` next to `binary`.",
    params(("id" = String, Path), ("access" = Option<String>, Query, description = "view (default) or control")),
    responses((status = 101, description = "Switching to the WebSocket"),
              (status = 400, description = "Bad `access`, or not a WebSocket request", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The job has no live desktop", body = crate::http::ErrorResponse)))]
pub(crate) async fn job_vnc(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    params: Result<Query<VncParams>, axum::extract::rejection::QueryRejection>,
    upgrade: Upgrade,
) -> Result<Response, ApiError> {
    let access = access_of(&params.map_err(bad_query)?.0)?;
    let job = super::find(&shared, &tenant, &id).await?;
    let sandbox = shared
        .sandboxes
        .desktop(&format!("job/{id}"))
        .ok_or_else(|| {
            let why = match job.state {
                JobState::Queued => "it has not started yet",
                JobState::Running => "it runs without a display (kind `gui`, or set `display`)",
                _ => "it has finished, and its desktop with it",
            };
            no_desktop(format!("job {id} has no live desktop: {why}"))
        })?;
    bridge(sandbox, access, upgrade).await
}
