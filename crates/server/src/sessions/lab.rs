//! A session's JupyterLab: see [`crate::lab`]. A session whose sandbox was
//! closed while idle is woken, as for a message.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::Response;
use serde::Deserialize;

use crate::http::{ApiError, Tenant};
use crate::lab::{LabOpened, base, forward, open, opened};
use crate::live::sandbox_key;
use crate::state::Shared;

/// The path of a request under a session's Lab.
#[derive(Deserialize)]
pub(crate) struct LabPath {
    id: String,
}

async fn site(shared: &Shared, tenant: &str, id: &str) -> Result<Arc<cordon_lab::Site>, ApiError> {
    let row = super::find(shared, tenant, id).await?;
    let key = sandbox_key(id);
    if shared.sandboxes.get(&key).is_none() {
        // Not listed, so no turn runs in it, but it may be closing after
        // idling out: waited for, woken, listed, and given back at once
        // (the Lab keeps it from idling while it is used).
        drop(super::wake::take_waiting(shared, &row, Duration::from_secs(30)).await?);
    }
    let gone = || {
        ApiError::new(
            StatusCode::CONFLICT,
            "not_live",
            format!("session {id} closed while its Lab opened: try again"),
        )
    };
    open(
        &shared.sandboxes,
        &key,
        &base(&format!("sessions/{id}")),
        shared.config.listen.ip(),
        shared.config.tls.as_ref(),
        gone,
    )
    .await
}

#[utoipa::path(post, path = "/v1/sessions/{id}/lab", tag = "sessions",
    summary = "Open a session's JupyterLab in a browser",
    description = "Wakes the session if its sandbox idled out, starts JupyterLab inside it if it is not running yet, and answers a URL on the Lab's own origin with a one-time ticket (see `POST /v1/jobs/{id}/lab`). A Lab in use keeps its session from idling out.",
    params(("id" = String, Path)),
    responses((status = 200, body = LabOpened),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "A turn is waking the session", body = crate::http::ErrorResponse),
              (status = 429, description = "The tenant's live sessions are at their cap", body = crate::http::ErrorResponse),
              (status = 503, description = "JupyterLab is not installed or did not start (the message says which)", body = crate::http::ErrorResponse)))]
pub(crate) async fn open_lab(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<LabOpened>, ApiError> {
    let site = site(&shared, &tenant, &id).await?;
    Ok(Json(opened(&site, &headers)))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/lab/{path}", tag = "sessions",
    summary = "A session's JupyterLab, for programs (any method, and WebSockets)",
    description = "As `/v1/jobs/{id}/lab/{path}`, for a session's sandbox.",
    params(("id" = String, Path), ("path" = String, Path, description = "Jupyter's path, e.g. `api/contents`")),
    responses((status = 200, description = "Jupyter's answer"),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 502, description = "JupyterLab did not answer"),
              (status = 503, description = "JupyterLab is not installed or did not start", body = crate::http::ErrorResponse)))]
pub(crate) async fn lab(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(LabPath { id }): Path<LabPath>,
    req: Request<Body>,
) -> Result<Response, ApiError> {
    let site = site(&shared, &tenant, &id).await?;
    Ok(forward(&site, req).await)
}
