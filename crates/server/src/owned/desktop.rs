//! An owner's desktop, live: the WebSocket bridge of [`crate::desktop`].
//! A running job's, or a session's, woken if it idled out.

use std::sync::Arc;
use std::time::Instant;

use axum::extract::rejection::QueryRejection;
use axum::extract::{Path, Query, State};
use axum::response::Response;
use cordon_sandbox::Sandbox;

use super::{Found, find};
use crate::desktop::{Upgrade, VncParams, access_of, bad_query, bridge, no_desktop};
use crate::http::{ApiResult, Tenant};
use crate::job::JobState;
use crate::owner::Owner;
use crate::state::Shared;

async fn desktop(shared: &Shared, tenant: &str, owner: &Owner) -> ApiResult<Sandbox> {
    let found = find(shared, tenant, owner).await?;
    if let Some(sandbox) = shared.sandboxes.desktop(owner) {
        return Ok(sandbox);
    }
    match found {
        Found::Job(job) => {
            let why = match job.state {
                JobState::Queued => "it has not started yet",
                JobState::Running => "it runs without a display (kind `gui`, or set `display`)",
                _ => "it has finished, and its desktop with it",
            };
            Err(no_desktop(format!("{owner} has no live desktop: {why}")))
        }
        Found::Session(row) => {
            if !crate::sessions::has_display(shared, &row.id) {
                return Err(no_desktop(format!(
                    "{owner} has no display: create it with `display`"
                )));
            }
            let mut guard = crate::sessions::take(shared, &row).await?;
            let live = guard.as_mut().expect("take wakes the session");
            live.last_used = Instant::now();
            Ok(live.talk.sandbox().clone())
        }
        Found::Sandbox(_) => Err(no_desktop(format!(
            "{owner} has no display: the sandbox API makes none yet"
        ))),
    }
}

async fn vnc(
    shared: &Shared,
    tenant: &str,
    owner: &Owner,
    params: Result<Query<VncParams>, QueryRejection>,
    upgrade: Upgrade,
) -> ApiResult<Response> {
    let access = access_of(&params.map_err(bad_query)?.0)?;
    let sandbox = desktop(shared, tenant, owner).await?;
    bridge(sandbox, access, upgrade).await
}

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
    params: Result<Query<VncParams>, QueryRejection>,
    upgrade: Upgrade,
) -> ApiResult<Response> {
    vnc(&shared, &tenant, &Owner::Job(id), params, upgrade).await
}

#[utoipa::path(get, path = "/v1/sessions/{id}/vnc", tag = "sessions",
    summary = "Live view of a session's desktop (WebSocket carrying RFB)",
    description = "As `/v1/jobs/{id}/vnc`, for a session created with `display`; an idle session is woken.",
    params(("id" = String, Path), ("access" = Option<String>, Query, description = "view (default) or control")),
    responses((status = 101, description = "Switching to the WebSocket"),
              (status = 400, description = "Bad `access`, or not a WebSocket request", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The session has no display, or a turn is waking it", body = crate::http::ErrorResponse)))]
pub(crate) async fn session_vnc(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    params: Result<Query<VncParams>, QueryRejection>,
    upgrade: Upgrade,
) -> ApiResult<Response> {
    vnc(&shared, &tenant, &Owner::Session(id), params, upgrade).await
}
