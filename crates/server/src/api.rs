//! The HTTP API: `/v1/jobs` and its events, files and cancellation, the
//! seeds' `/schedule` and `/status` routes, and `/health`. Every route but
//! `/health` needs a bearer token; every error is JSON saying what is
//! wrong, and another tenant's job is as absent as a missing one.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{DefaultBodyLimit, FromRequestParts, Path, Query, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use cordon_tools::Workspace;
use futures_util::Stream;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::job::{JobRequest, JobSpec, JobState};
use crate::runner::workspace_dir;
use crate::server::Shared;
use crate::store::{JobRow, ListQuery, NewEvent, Outcome, StoreError, StoredEvent, random_hex};

/// An error answered as `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Sent as `Retry-After` (seconds): a refused client's hint when to
    /// try again.
    retry_after: Option<std::time::Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn retry_after(mut self, after: std::time::Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    fn not_found(what: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", format!("no {what}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let mut r = (
            self.status,
            Json(json!({"error": {"code": self.code, "message": self.message}})),
        )
            .into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(after) = self.retry_after {
            // Whole seconds, at least one: RFC 9110's delay-seconds.
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        tracing::error!("store: {e}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the job store is unavailable; try again",
        )
    }
}

impl From<BytesRejection> for ApiError {
    fn from(e: BytesRejection) -> Self {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                "too_large",
                "the request body is larger than this server accepts",
            )
        } else {
            ApiError::new(status, "invalid_request", e.body_text())
        }
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// The tenant a request's bearer token belongs to.
pub struct Tenant(pub String);

impl FromRequestParts<Arc<Shared>> for Tenant {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, shared: &Arc<Shared>) -> ApiResult<Tenant> {
        let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
        let token = match parts.headers.get(header::AUTHORIZATION) {
            Some(value) => value
                .to_str()
                .ok()
                .and_then(|v| v.strip_prefix("Bearer "))
                .map(str::trim)
                .filter(|t| !t.is_empty())
                .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?,
            // A browser cannot set headers on a WebSocket, only the
            // subprotocols it offers: the token may come as one of those.
            None => websocket_token(&parts.headers).ok_or_else(|| unauthorized("send `Authorization: Bearer <token>` (create one with `cordon token create --tenant NAME`)"))?,
        };
        match shared.store.tenant_of(token).await? {
            Some(t) => Ok(Tenant(t)),
            None => Err(unauthorized("unknown token")),
        }
    }
}

/// The subprotocol that carries a token on a WebSocket upgrade.
pub(crate) const WS_TOKEN_PROTOCOL: &str = "cordon.bearer.";

/// The token offered as a `cordon.bearer.<token>` subprotocol of a
/// WebSocket upgrade, if any.
fn websocket_token(headers: &HeaderMap) -> Option<&str> {
    let upgrade = headers.get(header::UPGRADE)?.to_str().ok()?;
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return None;
    }
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(WS_TOKEN_PROTOCOL))
        .filter(|t| !t.is_empty())
}

pub fn router(shared: Arc<Shared>) -> Router {
    let file_limit = shared.config.file_limit;
    let body_limit = shared.config.body_limit;
    Router::new()
        .route("/health", get(health))
        .route("/v1/jobs", post(create_job).get(list_jobs))
        .route("/v1/jobs/{id}", get(get_job).delete(delete_job))
        .route("/v1/jobs/{id}/cancel", post(cancel_job))
        .route("/v1/jobs/{id}/events", get(job_events))
        .route(
            "/v1/jobs/{id}/network",
            get(crate::network::get_job_network).put(crate::network::put_job_network),
        )
        .route("/v1/jobs/{id}/vnc", get(crate::desktop::job_vnc))
        .route("/v1/jobs/{id}/files", get(list_root))
        .route(
            "/v1/jobs/{id}/files/{*path}",
            get(get_file)
                .put(put_file)
                .layer(DefaultBodyLimit::max(file_limit)),
        )
        .route("/schedule", post(schedule))
        .route("/status", get(status_by_query))
        .route("/status/{id}", get(status))
        .merge(crate::sessions::routes(file_limit))
        .merge(crate::mcp::routes(&shared))
        .merge(crate::openapi::routes())
        .merge(crate::docs::routes())
        .merge(crate::ui::routes())
        .fallback(|| async { ApiError::not_found("such route (see /openapi.json)") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "method_not_allowed",
                "this route does not take that method",
            )
        })
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(shared)
}

#[utoipa::path(get, path = "/health", tag = "jobs", security(()),
    responses((status = 200, description = "The server and its database answer"),
              (status = 503, description = "The database does not answer", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn health(State(shared): State<Arc<Shared>>) -> ApiResult<Json<Value>> {
    shared.store.ping().await?;
    Ok(Json(json!({"status": "ok"})))
}

pub(crate) fn rfc3339(ms: Option<i64>) -> Value {
    match ms {
        Some(ms) if ms >= 0 => json!(
            humantime::format_rfc3339_millis(UNIX_EPOCH + Duration::from_millis(ms as u64))
                .to_string()
        ),
        _ => Value::Null,
    }
}

/// A job as `GET /v1/jobs/{id}` shows it; `full` adds its output.
fn job_view(job: &JobRow, full: bool) -> Value {
    let mut v = json!({
        "id": job.id,
        "kind": job.kind,
        "state": job.state,
        "created_at": rfc3339(Some(job.created_ms)),
        "started_at": rfc3339(job.started_ms),
        "finished_at": rfc3339(job.finished_ms),
        "exit_code": job.exit_code,
        "error": job.error,
        "workspace_removed_at": rfc3339(job.workspace_removed_ms),
        "preview": crate::job::preview(&job.spec),
    });
    if full {
        v["stdout"] = json!(job.stdout);
        v["stderr"] = json!(job.stderr);
        v["stdout_truncated"] = json!(job.stdout_truncated);
        v["stderr_truncated"] = json!(job.stderr_truncated);
        v["result"] = job.result.clone().unwrap_or(Value::Null);
        v["request"] = job.spec.clone();
    }
    v
}

pub(crate) fn parse_json(body: &Bytes) -> ApiResult<Value> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))
}

/// Checks, stores and queues a job; its workspace exists from now on, so
/// files can be uploaded before it runs.
async fn submit(shared: &Shared, tenant: &str, body: &Value) -> ApiResult<JobRow> {
    let mut req =
        JobRequest::from_json(body, &shared.config.bounds).map_err(ApiError::bad_request)?;
    if let Some(asked) = &req.options.egress {
        let policy =
            crate::network::settle(shared, tenant, asked, crate::network::Empty::Ceiling).await?;
        req.options.egress = Some(policy.into());
    }
    if matches!(req.spec, JobSpec::Agent { .. }) && shared.config.agent.is_none() {
        return Err(ApiError::bad_request(
            "this server has no model configured for agent jobs (set ANTHROPIC_API_KEY or OPENAI_BASE_URL where `cordon serve` runs)",
        ));
    }
    let id = format!("job_{}", random_hex(12));
    std::fs::create_dir_all(workspace_dir(shared, &id)).map_err(|e| {
        tracing::error!("cannot create a job workspace: {e}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "cannot create the job's workspace",
        )
    })?;
    let job = shared
        .store
        .insert_job(&id, tenant, req.spec.kind(), &crate::job::spec_json(&req))
        .await?;
    shared.wake.notify_waiters();
    Ok(job)
}

#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", summary = "Queue a job",
    request_body = crate::openapi::JobRequestDoc,
    responses((status = 202, description = "Queued; `Location` names it", body = crate::openapi::JobSummaryDoc),
              (status = 400, description = "The request says what is wrong", body = crate::openapi::ErrorDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc),
              (status = 413, description = "The body is too large", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn create_job(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = parse_json(&body?)?;
    let job = submit(&shared, &tenant, &body).await?;
    let mut r = (StatusCode::ACCEPTED, Json(job_view(&job, false))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/jobs/{}", job.id)) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
}

/// Whether `id` could be one of the ids this server makes (`job_` or
/// `ses_` and hex): anything else is no such thing, answered without
/// asking the store, which may refuse the bytes (PostgreSQL refuses a NUL
/// in text, and that was a 503).
pub(crate) fn plausible_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

pub(crate) async fn find(shared: &Shared, tenant: &str, id: &str) -> ApiResult<JobRow> {
    if !plausible_id(id) {
        return Err(ApiError::not_found("such job"));
    }
    shared
        .store
        .job(tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found(&format!("job {id}")))
}

#[utoipa::path(get, path = "/v1/jobs/{id}", tag = "jobs", summary = "A job: state, output, result",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::openapi::JobDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc), (status = 404, description = "No such job (or another tenant's)", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn get_job(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let mut v = job_view(&find(&shared, &tenant, &id).await?, true);
    v["live_desktop"] = json!(shared.desktops.get(&format!("job/{id}")).is_some());
    Ok(Json(v))
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListParams {
    state: Option<String>,
    kind: Option<String>,
    since: Option<String>,
    limit: Option<String>,
    cursor: Option<String>,
}

#[utoipa::path(get, path = "/v1/jobs", tag = "jobs", summary = "List jobs, newest first",
    params(("state" = Option<String>, Query, description = "queued, running, succeeded, failed, cancelled or timed_out"),
           ("kind" = Option<String>, Query, description = "shell, python, javascript, typescript, steps, gui or agent"),
           ("since" = Option<String>, Query, description = "Only jobs created at or after this RFC 3339 time, e.g. 2026-11-24T09:00:00Z"),
           ("limit" = Option<u32>, Query, description = "1 to 200 (default 50)"),
           ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page")),
    responses((status = 200, body = crate::openapi::JobListDoc), (status = 400, description = "The request says what is wrong", body = crate::openapi::ErrorDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn list_jobs(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    params: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(p) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let state = match p.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(JobState::parse(s).ok_or_else(|| {
            ApiError::bad_request(format!(
                "unknown state {s:?} (expected queued, running, succeeded, failed, cancelled or timed_out)"
            ))
        })?),
    };
    let limit = match p.limit.as_deref() {
        None | Some("") => 50,
        Some(l) => match l.parse::<i64>() {
            Ok(n @ 1..=200) => n,
            _ => {
                return Err(ApiError::bad_request(
                    "`limit` must be a number from 1 to 200",
                ));
            }
        },
    };
    let before = match p.cursor.as_deref() {
        None | Some("") => None,
        Some(c) => Some(c.parse::<i64>().ok().filter(|n| *n > 0).ok_or_else(|| {
            ApiError::bad_request("`cursor` must be a `next_cursor` from an earlier page")
        })?),
    };
    let since_ms = match p.since.as_deref() {
        None | Some("") => None,
        Some(t) => Some(
            humantime::parse_rfc3339_weak(t)
                .ok()
                .and_then(|t| t.duration_since(UNIX_EPOCH).ok())
                .map(|d| d.as_millis() as i64)
                .ok_or_else(|| {
                    ApiError::bad_request(format!(
                        "`since` must be an RFC 3339 time such as 2026-11-24T09:00:00Z, not {t:?}"
                    ))
                })?,
        ),
    };
    let q = ListQuery {
        state,
        kind: p.kind.filter(|k| !k.is_empty()),
        since_ms,
        before,
        limit: limit + 1,
    };
    let mut jobs = shared.store.list(&tenant, &q).await?;
    let more = jobs.len() as i64 > limit;
    jobs.truncate(limit as usize);
    let next = if more {
        jobs.last().map(|j| j.seq.to_string())
    } else {
        None
    };
    Ok(Json(json!({
        "jobs": jobs.iter().map(|j| job_view(j, false)).collect::<Vec<_>>(),
        "next_cursor": next,
    })))
}

#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs", summary = "Cancel a queued or running job",
    params(("id" = String, Path)),
    responses((status = 200, description = "The job, cancelled", body = crate::openapi::JobDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc), (status = 404, description = "No such job (or another tenant's)", body = crate::openapi::ErrorDoc),
              (status = 409, description = "It has already finished", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn cancel_job(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let job = find(&shared, &tenant, &id).await?;
    cancel(&shared, &job).await?;
    let mut v = job_view(&find(&shared, &tenant, &id).await?, true);
    v["live_desktop"] = json!(shared.desktops.get(&format!("job/{id}")).is_some());
    Ok(Json(v))
}

#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "jobs", summary = "Delete a job",
    description = "Cancels it if it is queued or running, then removes it: its record, events, output, workspace and log. Removal follows no link the job left in its workspace.",
    params(("id" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc), (status = 404, description = "No such job (or another tenant's)", body = crate::openapi::ErrorDoc),
              (status = 409, description = "It is still stopping; try again", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn delete_job(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let job = find(&shared, &tenant, &id).await?;
    if matches!(job.state, JobState::Queued | JobState::Running) {
        cancel(&shared, &job).await?;
    }
    if !shared.store.delete_job(&tenant, &id).await? {
        // Deleted meanwhile, or its runner has not recorded the end yet.
        find(&shared, &tenant, &id).await?;
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "still_running",
            format!("job {id} is still stopping; delete it again in a moment"),
        ));
    }
    // Gone from the store first: nothing serves its files any more, and a
    // removal that fails leaves files, not a job that cannot be opened.
    crate::server::remove_files(crate::runner::job_dir(&shared, &id), &format!("job {id}")).await;
    Ok(StatusCode::NO_CONTENT)
}

/// Cancels a queued or running job; 409 if it has finished.
async fn cancel(shared: &Shared, job: &JobRow) -> ApiResult<()> {
    let id = job.id.as_str();
    match job.state {
        JobState::Queued => {
            let outcome = Outcome {
                state: JobState::Cancelled,
                exit_code: None,
                error: Some("cancelled before it ran".into()),
                result: None,
            };
            let event = NewEvent::new(
                "finished",
                json!({"state": JobState::Cancelled, "exit_code": null, "error": outcome.error}),
            );
            // A worker may have claimed it meanwhile: then cancel the run.
            if shared
                .store
                .finish(id, &[JobState::Queued], &outcome, &event)
                .await?
                .is_none()
            {
                cancel_running(shared, id).await;
            }
        }
        JobState::Running => cancel_running(shared, id).await,
        s => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "already_finished",
                format!("job {id} has already finished ({})", s.as_str()),
            ));
        }
    }
    Ok(())
}

/// Signals a running job and waits (a few seconds at most) for its runner
/// to record the end.
async fn cancel_running(shared: &Shared, id: &str) {
    let handle = shared
        .running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(id)
        .cloned();
    let Some(cancel) = handle else { return };
    cancel.cancel();
    for _ in 0..100 {
        let still = shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .contains_key(id);
        if !still {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Where an event stream resumes: after `Last-Event-ID`, as browsers send
/// on reconnecting, or `?after=N`.
#[derive(Deserialize)]
pub(crate) struct EventParams {
    after: Option<i64>,
}

#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", summary = "The job's events as Server-Sent Events",
    description = "Each event has an `id` (its sequence number), a name (`state`, `stdout`, `stderr`, `step_started`, `step_finished`, `output_truncated`, the agent's event types, and last `finished`) and JSON data. Reconnecting with `Last-Event-ID` (or `?after=`) resumes after that event: nothing is missed or repeated.",
    params(("id" = String, Path), ("after" = Option<i64>, Query, description = "Resume after this event id"),
           ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id")),
    responses((status = 200, description = "An event stream", content_type = "text/event-stream"), (status = 400, description = "The request says what is wrong", body = crate::openapi::ErrorDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc), (status = 404, description = "No such job (or another tenant's)", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn job_events(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
    params: Result<Query<EventParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    find(&shared, &tenant, &id).await?;
    let Query(p) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let after = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| ApiError::bad_request("Last-Event-ID must be an event id"))?,
        None => p.after.unwrap_or(0),
    };
    Ok(Sse::new(event_stream(shared, tenant, id, after)).keep_alive(KeepAlive::default()))
}

struct Follow {
    shared: Arc<Shared>,
    tenant: String,
    id: String,
    last: i64,
    live: Option<tokio::sync::broadcast::Receiver<StoredEvent>>,
    queue: VecDeque<StoredEvent>,
    done: bool,
}

/// A job's events after `after`: what is stored, then what happens, each
/// exactly once, until its `finished` event.
fn event_stream(
    shared: Arc<Shared>,
    tenant: String,
    id: String,
    after: i64,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let live = shared.hub.subscribe(&id);
    let state = Follow {
        shared,
        tenant,
        id,
        last: after,
        live,
        queue: VecDeque::new(),
        done: false,
    };
    futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.queue.pop_front() {
                if e.seq <= s.last {
                    continue;
                }
                s.last = e.seq;
                if e.kind == "finished" {
                    s.done = true;
                }
                let event = Event::default()
                    .id(e.seq.to_string())
                    .event(e.kind.clone())
                    .data(e.data.to_string());
                return Some((Ok(event), s));
            }
            if s.done {
                return None;
            }
            // Not followed live here: has the job ended? Asked before the
            // events are read, since a job's end and its `finished` event
            // are stored in one transaction: if it has ended, the read
            // below sees every event it will ever have.
            let ended = s.live.is_none()
                && matches!(
                    s.shared.store.job(&s.tenant, &s.id).await,
                    Ok(Some(job)) if job.state.is_terminal()
                );
            // Stored events first: they include everything published
            // before we subscribed.
            match s.shared.store.events_after(&s.id, s.last, 500).await {
                Ok(page) if !page.is_empty() => {
                    s.queue.extend(page);
                    continue;
                }
                // Resumed at or past the end (`after` beyond the last
                // event): nothing more will come.
                Ok(_) if ended => return None,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("events of {}: {e}", s.id);
                    return None;
                }
            }
            if s.live.is_none() {
                // Queued: follow it as soon as a worker opens it; running
                // in another process: the timeout makes this a poll.
                let shared = s.shared.clone();
                s.live = shared
                    .hub
                    .subscribe_within(&s.id, Duration::from_millis(250))
                    .await;
                continue;
            }
            if let Some(rx) = s.live.as_mut() {
                match rx.recv().await {
                    Ok(e) => s.queue.push_back(e),
                    // Fell behind or the job ended: the store has it all.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => s.live = None,
                }
            }
        }
    })
}

async fn workspace_of(shared: &Shared, tenant: &str, id: &str) -> ApiResult<Workspace> {
    let job = find(shared, tenant, id).await?;
    if job.workspace_removed_ms.is_some() {
        return Err(ApiError::new(
            StatusCode::GONE,
            "gone",
            format!(
                "job {id}'s workspace was removed after the job finished (the server keeps \
                 workspaces for `--keep-workspaces`); its output, events and result are kept \
                 at /v1/jobs/{id}"
            ),
        ));
    }
    Workspace::open(&workspace_dir(shared, id)).map_err(crate::files::error)
}

#[utoipa::path(get, path = "/v1/jobs/{id}/files", tag = "jobs", summary = "The workspace's top directory",
    params(("id" = String, Path)),
    responses((status = 410, description = "The finished job's workspace was removed (`--keep-workspaces`)", body = crate::openapi::ErrorDoc), (status = 200, body = crate::openapi::ListingDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc), (status = 404, description = "No such job (or another tenant's)", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn list_root(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let ws = workspace_of(&shared, &tenant, &id).await?;
    Ok(Json(crate::files::list(&ws, ".")?))
}

/// A file's bytes, or a directory's listing as JSON.
#[utoipa::path(get, path = "/v1/jobs/{id}/files/{path}", tag = "jobs", summary = "A workspace file's bytes, or a directory's listing",
    params(("id" = String, Path), ("path" = String, Path, description = "Relative to the workspace; `..`, absolute paths and symlinks out are refused")),
    responses((status = 410, description = "The finished job's workspace was removed (`--keep-workspaces`)", body = crate::openapi::ErrorDoc), (status = 200, description = "The file (application/octet-stream) or a listing (JSON)", body = crate::openapi::ListingDoc),
              (status = 400, description = "The request says what is wrong", body = crate::openapi::ErrorDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc), (status = 404, description = "No such job or file", body = crate::openapi::ErrorDoc),
              (status = 413, description = "Larger than the files API serves", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn get_file(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, path)): Path<(String, String)>,
) -> ApiResult<Response> {
    let ws = workspace_of(&shared, &tenant, &id).await?;
    crate::files::read(&ws, &path, shared.config.file_limit)
}

#[utoipa::path(put, path = "/v1/jobs/{id}/files/{path}", tag = "jobs", summary = "Write a workspace file (parents are created)",
    params(("id" = String, Path), ("path" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream"),
    responses((status = 410, description = "The finished job's workspace was removed (`--keep-workspaces`)", body = crate::openapi::ErrorDoc), (status = 201, description = "Created", body = crate::openapi::PutFileDoc),
              (status = 200, description = "Replaced", body = crate::openapi::PutFileDoc),
              (status = 400, description = "The request says what is wrong", body = crate::openapi::ErrorDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc), (status = 404, description = "No such job (or another tenant's)", body = crate::openapi::ErrorDoc), (status = 413, description = "Too large", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn put_file(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, path)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = body?;
    let ws = workspace_of(&shared, &tenant, &id).await?;
    crate::files::write(ws, path, body).await
}

/// The seeds' `POST /schedule`: `{kind, code}` or `{steps: [...]}`.
#[utoipa::path(post, path = "/schedule", tag = "seed", summary = "Queue a job, the seeds' way",
    description = "Takes `{kind, code}` (kind python, shell, javascript or typescript) or `{steps: [{tool, command|code}]}`.",
    request_body = crate::openapi::JobRequestDoc,
    responses((status = 202, body = crate::openapi::ScheduledDoc), (status = 400, description = "The request says what is wrong", body = crate::openapi::ErrorDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn schedule(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let mut body = parse_json(&body?)?;
    // The seeds send shell jobs as `code`.
    if body["kind"] == "shell"
        && body.get("command").is_none()
        && let Some(obj) = body.as_object_mut()
        && let Some(code) = obj.remove("code")
    {
        obj.insert("command".into(), code);
    }
    let job = submit(&shared, &tenant, &body).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(json!({"job_id": job.id, "task_id": job.id, "state": job.state})),
    )
        .into_response())
}

#[derive(Deserialize)]
pub(crate) struct StatusParams {
    task_id: Option<String>,
    job_id: Option<String>,
}

#[utoipa::path(get, path = "/status/{id}", tag = "seed", summary = "A job's state and output",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::openapi::JobDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc), (status = 404, description = "No such job (or another tenant's)", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn status(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Value>> {
    let mut v = job_view(&find(&shared, &tenant, &id).await?, true);
    v["live_desktop"] = json!(shared.desktops.get(&format!("job/{id}")).is_some());
    Ok(Json(v))
}

#[utoipa::path(get, path = "/status", tag = "seed", summary = "A job's state and output, by `task_id`",
    params(("task_id" = Option<String>, Query), ("job_id" = Option<String>, Query)),
    responses((status = 200, body = crate::openapi::JobDoc), (status = 400, description = "The request says what is wrong", body = crate::openapi::ErrorDoc), (status = 401, description = "No or unknown token", body = crate::openapi::ErrorDoc), (status = 404, description = "No such job (or another tenant's)", body = crate::openapi::ErrorDoc)))]
pub(crate) async fn status_by_query(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    params: Result<Query<StatusParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<Value>> {
    let Query(p) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let id = p
        .task_id
        .or(p.job_id)
        .ok_or_else(|| ApiError::bad_request("give `task_id`"))?;
    let mut v = job_view(&find(&shared, &tenant, &id).await?, true);
    v["live_desktop"] = json!(shared.desktops.get(&format!("job/{id}")).is_some());
    Ok(Json(v))
}
