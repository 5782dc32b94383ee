//! A running job's JupyterLab: see [`crate::lab`].

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Request};
use axum::response::Response;
use serde::Deserialize;

use crate::http::{ApiError, Tenant};
use crate::job::JobState;
use crate::lab::{LabOpened, base, forward, open, opened};
use crate::state::Shared;

/// How long a running job's sandbox may take to be listed (under TCG a
/// microVM takes this long to boot).
const LISTING: Duration = Duration::from_secs(120);

/// The path of a request under a job's Lab.
#[derive(Deserialize)]
pub(crate) struct LabPath {
    id: String,
}

async fn site(shared: &Shared, tenant: &str, id: &str) -> Result<Arc<cordon_lab::Site>, ApiError> {
    let key = format!("job/{id}");
    let mut job = super::find(shared, tenant, id).await?;
    if shared.elsewhere(&job).is_some() {
        // The Lab's own origin is a port of the process that runs the job;
        // API processes do not open one for another's sandbox (yet).
        return Err(ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "elsewhere",
            format!(
                "job {id} runs on another machine of this deployment, where its Lab opens \
                 only for programs: use /v1/jobs/{id}/lab/ with your token"
            ),
        ));
    }
    // A job is running a moment before its sandbox is made and listed.
    let deadline = Instant::now() + LISTING;
    while job.state == JobState::Running
        && shared.sandboxes.get(&key).is_none()
        && Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
        job = super::find(shared, tenant, id).await?;
    }
    let gone = || {
        let why = match job.state {
            JobState::Queued => "it has not started yet".to_string(),
            JobState::Running => "its sandbox is being made or closed; try again".to_string(),
            _ => format!(
                "it has finished, and its sandbox with it; its files stay at /v1/jobs/{id}/files"
            ),
        };
        ApiError::new(
            axum::http::StatusCode::CONFLICT,
            "not_running",
            format!("job {id} has no live sandbox for a Lab: {why}"),
        )
    };
    open(
        &shared.sandboxes,
        &key,
        &base(&format!("jobs/{id}")),
        shared.config.listen.ip(),
        shared.config.tls.as_ref(),
        gone,
    )
    .await
}

#[utoipa::path(post, path = "/v1/jobs/{id}/lab", tag = "jobs",
    summary = "Open a running job's JupyterLab in a browser",
    description = "Starts JupyterLab inside the job's sandbox if it is not running yet (a few seconds), and answers a URL on the Lab's own origin (a port of its own, so that the Lab's pages, which the sandbox can shape, never run in this server's origin) with a one-time ticket. The browser that opens it gets an HttpOnly cookie for that Lab alone, and the ticket is spent. Programs may use `/v1/jobs/{id}/lab/{path}` with the bearer token instead.",
    params(("id" = String, Path)),
    responses((status = 200, body = LabOpened),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The job is not running", body = crate::http::ErrorResponse),
              (status = 503, description = "JupyterLab is not installed or did not start (the message says which)", body = crate::http::ErrorResponse)))]
pub(crate) async fn open_job_lab(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<LabOpened>, ApiError> {
    let site = site(&shared, &tenant, &id).await?;
    Ok(Json(opened(&site, &headers)))
}

#[utoipa::path(get, path = "/v1/jobs/{id}/lab/{path}", tag = "jobs",
    summary = "A running job's JupyterLab, for programs (any method, and WebSockets)",
    description = "JupyterLab's own HTTP API and WebSockets (kernels, terminals, contents) under the Lab's base path, with the bearer token as a header (or, on a WebSocket, as the subprotocol `cordon.bearer.<token>`). The token never reaches the sandbox. Jupyter's XSRF rule holds: a POST carries the `_xsrf` cookie a GET set and the same value in `X-XSRFToken`. Answers carry `Content-Security-Policy: sandbox`; browsers should use `POST /v1/jobs/{id}/lab`.",
    params(("id" = String, Path), ("path" = String, Path, description = "Jupyter's path, e.g. `api/contents`")),
    responses((status = 200, description = "Jupyter's answer"),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The job is not running", body = crate::http::ErrorResponse),
              (status = 502, description = "JupyterLab did not answer"),
              (status = 503, description = "JupyterLab is not installed or did not start", body = crate::http::ErrorResponse)))]
pub(crate) async fn job_lab(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(LabPath { id }): Path<LabPath>,
    req: Request<Body>,
) -> Result<Response, ApiError> {
    let site = site(&shared, &tenant, &id).await?;
    Ok(forward(&site, req).await)
}
