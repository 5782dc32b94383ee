//! An owner's JupyterLab: see [`crate::lab`]. A running job's, here or on
//! the worker that runs it; a session's, woken if it idled out.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, Request, StatusCode};
use axum::response::{IntoResponse, Response};
use cordon_lab::Forward;
use serde::Deserialize;

use super::{Found, find};
use crate::http::{ApiError, Tenant};
use crate::job::JobState;
use crate::lab::{LabOpened, base, forward, open, opened};
use crate::owner::Owner;
use crate::relay::SiteRelay;
use crate::state::Shared;
use crate::store::JobRow;

/// How long a Lab's request waits for a session's turn to give its
/// sandbox back before it wakes it.
const WAKING: Duration = Duration::from_secs(30);

/// The path of a request under an owner's Lab.
#[derive(Deserialize)]
pub(crate) struct LabPath {
    id: String,
}

async fn site(
    shared: &Arc<Shared>,
    tenant: &str,
    owner: &Owner,
) -> Result<Arc<cordon_lab::Site>, Response> {
    let found = find(shared, tenant, owner)
        .await
        .map_err(IntoResponse::into_response)?;
    // What to answer if the sandbox is gone by the time its Lab starts.
    let (code, why) = match found {
        Found::Job(job) => {
            if let Some(worker) = shared.elsewhere(&job) {
                return remote(shared, tenant, &job, worker.to_string()).await;
            }
            let why = super::listed(shared, tenant, *job)
                .await
                .map_err(IntoResponse::into_response)?;
            (
                "not_running",
                format!("{owner} has no live sandbox for a Lab: {why}"),
            )
        }
        Found::Session(row) => {
            // Not listed, so no turn runs in it, but it may be closing
            // after idling out: waited for, woken, listed, and given back
            // at once (the Lab keeps it from idling while it is used).
            // Paused, it is resumed the same way.
            if shared.sandboxes.get(owner).is_none_or(|s| s.is_paused()) {
                let woken = crate::sessions::take_waiting(shared, &row, WAKING).await;
                drop(woken.map_err(IntoResponse::into_response)?);
            }
            (
                "not_live",
                format!("{owner} closed while its Lab opened: try again"),
            )
        }
        Found::Sandbox(_) => (
            "not_running",
            format!("{owner} has no live sandbox for a Lab: it has ended"),
        ),
    };
    let gone = || ApiError::new(StatusCode::CONFLICT, code, why.clone());
    let ip = shared.config.listen.ip();
    open(
        &shared.sandboxes,
        owner,
        ip,
        shared.config.tls.as_ref(),
        gone,
    )
    .await
    .map_err(IntoResponse::into_response)
}

fn not_running(id: &str, why: &str) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "not_running",
        format!("job {id} has no live sandbox for a Lab: {why}"),
    )
}

/// The Lab of a job that runs on `worker`, another process of this
/// deployment: served on a port of this process, each request relayed to
/// the worker's bearer route. The worker starts Jupyter on the first
/// request, and answers what stops it (not installed, the job ended) as it
/// would answer its own client.
async fn remote(
    shared: &Arc<Shared>,
    tenant: &str,
    job: &JobRow,
    worker: String,
) -> Result<Arc<cordon_lab::Site>, Response> {
    let id = &job.id;
    if job.state != JobState::Running {
        return Err(not_running(id, "its sandbox is being closed").into_response());
    }
    let Some(cluster) = shared.config.cluster.clone() else {
        unreachable!("only a deployment of many runs jobs elsewhere");
    };
    let base = base(&Owner::Job(id.clone()));
    let upstream = || async {
        let url = match shared.store.worker_url(&worker).await {
            Ok(Some(url)) => url,
            Ok(None) => return Err(crate::relay::unreachable(id).into_response()),
            Err(e) => return Err(ApiError::from(e).into_response()),
        };
        let relay = SiteRelay::lab(cluster, tenant, url, id);
        let probe = Request::get(format!("{base}api/status"))
            .body(Body::empty())
            .expect("a GET of a path is a request");
        let answer = relay.forward(probe).await;
        if !answer.status().is_success() {
            return Err(answer);
        }
        super::watch_elsewhere(shared, tenant, id, worker.clone());
        Ok(Arc::new(relay) as Arc<dyn Forward>)
    };
    shared
        .remote_labs
        .open(
            id,
            shared.config.listen.ip(),
            shared.config.tls.as_ref(),
            upstream,
        )
        .await
}

#[utoipa::path(post, path = "/v1/jobs/{id}/lab", tag = "jobs",
    summary = "Open a running job's JupyterLab in a browser",
    description = "Starts JupyterLab inside the job's sandbox if it is not running yet (a few seconds), and answers a URL on the Lab's own origin (a port of its own, so that the Lab's pages, which the sandbox can shape, never run in this server's origin) with a one-time ticket. In a deployment of many, the port is one of the API process asked, which relays the Lab's requests to the worker that runs the job. The browser that opens it gets an HttpOnly cookie for that Lab alone, and the ticket is spent. Programs may use `/v1/jobs/{id}/lab/{path}` with the bearer token instead.",
    params(("id" = String, Path)),
    responses((status = 200, body = LabOpened),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The job is not running", body = crate::http::ErrorResponse),
              (status = 502, description = "The job runs on another machine of the deployment, which did not answer", body = crate::http::ErrorResponse),
              (status = 503, description = "JupyterLab is not installed or did not start (the message says which)", body = crate::http::ErrorResponse)))]
pub(crate) async fn open_job_lab(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<LabOpened>, Response> {
    let site = site(&shared, &tenant, &Owner::Job(id)).await?;
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
) -> Result<Response, Response> {
    let site = site(&shared, &tenant, &Owner::Job(id)).await?;
    Ok(forward(&site, req).await)
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
pub(crate) async fn open_session_lab(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
) -> Result<Json<LabOpened>, Response> {
    let site = site(&shared, &tenant, &Owner::Session(id)).await?;
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
pub(crate) async fn session_lab(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(LabPath { id }): Path<LabPath>,
    req: Request<Body>,
) -> Result<Response, Response> {
    let site = site(&shared, &tenant, &Owner::Session(id)).await?;
    Ok(forward(&site, req).await)
}
