//! Jobs: queue one, list, show, cancel and delete them, follow their
//! events; and the compatibility routes `/schedule` and `/status`, the
//! first API's views of the same jobs. Another tenant's job is as absent as a missing one. What a job
//! owns (files, network, desktop, Lab) is served by the `owned` module.

mod events;
mod view;

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;

pub(crate) use events::{__path_job_events, job_events};
pub use view::{JobList, JobSummary, JobView, Scheduled};

use crate::http::{ApiError, ApiResult, Tenant, plausible_id, read_json};
use crate::job::{JobEvent, JobKind, JobRequest, JobSpec, JobState, ShellJob, Text};
use crate::state::Shared;
use crate::store::{JobRow, ListQuery, NewEvent, Outcome};

/// A job as shown alone, with whether its desktop is live now. One that
/// runs on another worker is taken at its word: running, with a display.
fn full_view(shared: &Shared, job: &JobRow) -> JobView {
    let live = if shared.elsewhere(job).is_some() {
        job.state == JobState::Running && job.request.as_ref().is_ok_and(JobRequest::has_display)
    } else {
        shared
            .sandboxes
            .desktop(&crate::owner::Owner::Job(job.id.clone()))
            .is_some()
    };
    JobView::of(job, live)
}

/// Checks, stores and queues a job (or starts it here, when a worker slot
/// is free and nothing waits); its workspace exists from now on, so
/// files can be uploaded before it runs.
async fn submit(shared: &Arc<Shared>, tenant: &str, request: JobRequest) -> ApiResult<JobRow> {
    let mut req = request
        .check(&shared.config.bounds)
        .map_err(ApiError::bad_request)?;
    if let Some(asked) = &req.options.egress {
        let policy = shared
            .ceilings
            .settle(tenant, asked, crate::network::Empty::Ceiling)?;
        req.options.egress = Some(policy.into());
    }
    if let Some(repo) = &req.options.repo {
        crate::repos::admit(&shared.ceilings.of(tenant), repo).await?;
    }
    if let JobSpec::Build(b) = &req.spec {
        // Its base is its FROM; its name must be one the tenant may take.
        shared.images.store()?;
        shared.images.check_own_name(tenant, &b.name)?;
    } else {
        // Stored with the default filled in: a later default does not
        // change it.
        req.options.image = shared
            .images
            .choose(&shared.store, tenant, req.options.image.as_ref())
            .await?;
    }
    if matches!(req.spec, JobSpec::Agent { .. }) && shared.config.agent.is_none() {
        return Err(ApiError::bad_request(
            "this server has no model configured for agent jobs (set ANTHROPIC_API_KEY or OPENAI_BASE_URL where `cordon serve` runs)",
        ));
    }
    // A ready sandbox of the job's shape comes with its id and workspace.
    let shape = crate::pool::Shape::of(
        crate::pool::Kind::Job,
        &req.options,
        req.spec.display(),
        shared.config.backend,
    );
    let pooled = match (&req.spec, shape) {
        (JobSpec::Build(_), _) | (_, None) => None,
        (_, Some(shape)) => shared.pool.take(&shape),
    };
    let id = match &pooled {
        Some(id) => id.clone(),
        // Split across machines, the workspace is made by the worker that
        // takes the job (see `owned::files`).
        None if shared.config.cluster.is_some() => crate::pool::Kind::Job.new_id(),
        // Made ahead, or made now.
        None => match shared
            .pool
            .workspace(crate::pool::Kind::Job, req.options.disk)
        {
            (id, true) => id,
            (id, false) => {
                if let Err(e) = make_workspace(shared, &id, req.options.disk).await {
                    shared.pool.ended(&id);
                    return Err(e);
                }
                id
            }
        },
    };
    // It starts here, without a wake and a claim, when a slot of this
    // process is free and the claim would take it next anyway.
    if let Some(slot) = shared.free_slot() {
        let started = {
            let (shared, id, tenant, request) = (
                shared.clone(),
                id.clone(),
                tenant.to_string(),
                req.request(),
            );
            // A task of its own, so that a client gone mid-request cannot
            // leave the job stored as started with nothing to run it (its
            // lease would be renewed by this worker's heartbeat for ever).
            tokio::spawn(async move {
                let claimed = {
                    let _turn = shared.claim.lock().await;
                    shared
                        .store
                        .start_job(&id, &tenant, &request, &shared.worker, shared.claim_terms())
                        .await?
                };
                let Some(claimed) = claimed else {
                    return Ok(None);
                };
                let job = claimed.job.clone();
                let cancel = crate::slot::register(&shared, &job);
                tokio::spawn(async move {
                    crate::slot::run(&shared, claimed, cancel).await;
                    drop(slot);
                });
                Ok::<_, crate::store::StoreError>(Some(job))
            })
            .await
        };
        match started {
            Ok(Ok(Some(job))) => return Ok(job),
            // Queued below, as any other.
            Ok(Ok(None)) => {}
            Ok(Err(e)) => {
                if pooled.is_some() {
                    shared.pool.forget(&id).await;
                }
                return Err(e.into());
            }
            Err(e) => {
                tracing::error!(job = %id, "starting the job: {e}");
                return Err(ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    "cannot start the job",
                ));
            }
        }
    }
    let job = match shared.store.insert_job(&id, tenant, &req.request()).await {
        Ok(job) => job,
        Err(e) => {
            if pooled.is_some() {
                shared.pool.forget(&id).await;
            }
            return Err(e.into());
        }
    };
    shared.wake.notify_one();
    Ok(job)
}

async fn make_workspace(shared: &Shared, id: &str, disk: u64) -> ApiResult<()> {
    let ws = shared.config.job_dirs().workspace(id);
    let defaults = shared.config.sandboxes();
    // Left unused at once: the job enters it again when it runs.
    let made = tokio::task::spawn_blocking(move || {
        defaults
            .make_workspace(&ws, Some(disk))
            .map(drop)
            .map_err(|e| e.to_string())
    })
    .await
    .unwrap_or_else(|e| Err(e.to_string()));
    made.map_err(|e| {
        tracing::error!("cannot create a job workspace: {e}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "cannot create the job's workspace",
        )
    })
}

#[utoipa::path(post, path = "/v1/jobs", tag = "jobs", summary = "Queue a job",
    request_body(content = crate::job::JobRequest, description = "The job; `kind` decides its fields (an example per kind: `JobKind::example`)"),
    responses((status = 202, description = "Queued; `Location` names it", body = crate::jobs::JobSummary),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 403, description = "A network beyond this tenant's ceiling", body = crate::http::ErrorResponse),
              (status = 413, description = "The body is too large", body = crate::http::ErrorResponse)))]
pub(crate) async fn create_job(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let request = read_json(&crate::http::within(body, shared.config.body_limit)?)?;
    let job = submit(&shared, &tenant, request).await?;
    let mut r = (StatusCode::ACCEPTED, Json(JobSummary::of(&job))).into_response();
    if let Ok(v) = HeaderValue::from_str(&format!("/v1/jobs/{}", job.id)) {
        r.headers_mut().insert(header::LOCATION, v);
    }
    Ok(r)
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
    responses((status = 200, body = crate::jobs::JobView), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_job(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    Ok(Json(full_view(
        &shared,
        &find(&shared, &tenant, &id).await?,
    )))
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
           ("kind" = Option<crate::job::JobKind>, Query, description = "Only jobs of this kind"),
           ("since" = Option<String>, Query, description = "Only jobs created at or after this RFC 3339 time, e.g. 2026-11-24T09:00:00Z"),
           ("limit" = Option<u32>, Query, description = "1 to 200 (default 50)"),
           ("cursor" = Option<String>, Query, description = "`next_cursor` of the previous page")),
    responses((status = 200, body = crate::jobs::JobList), (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_jobs(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    params: Result<Query<ListParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<JobList>> {
    let Query(p) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let state = match p.state.as_deref() {
        None | Some("") => None,
        Some(s) => Some(JobState::parse(s).ok_or_else(|| {
            ApiError::bad_request(format!(
                "unknown state {s:?} (expected queued, running, succeeded, failed, cancelled or timed_out)"
            ))
        })?),
    };
    let kind = match p.kind.as_deref() {
        None | Some("") => None,
        Some(k) => Some(JobKind::parse(k).ok_or_else(|| {
            ApiError::bad_request(format!(
                "unknown kind {k:?} (expected {})",
                JobKind::listed()
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
        kind,
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
    Ok(Json(JobList {
        jobs: jobs.iter().map(JobSummary::of).collect(),
        next_cursor: next,
    }))
}

#[utoipa::path(post, path = "/v1/jobs/{id}/cancel", tag = "jobs", summary = "Cancel a queued or running job",
    params(("id" = String, Path)),
    responses((status = 200, description = "The job, cancelled", body = crate::jobs::JobView), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has already finished", body = crate::http::ErrorResponse)))]
pub(crate) async fn cancel_job(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<JobView>> {
    let job = find(&shared, &tenant, &id).await?;
    cancel(&shared, &job).await?;
    Ok(Json(full_view(
        &shared,
        &find(&shared, &tenant, &id).await?,
    )))
}

#[utoipa::path(delete, path = "/v1/jobs/{id}", tag = "jobs", summary = "Delete a job",
    description = "Cancels it if it is queued or running, then removes it: its record, events, output, workspace and log. Removal follows no link the job left in its workspace.",
    params(("id" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It is still stopping; try again", body = crate::http::ErrorResponse)))]
pub(crate) async fn delete_job(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    let job = find(&shared, &tenant, &id).await?;
    if !remove(&shared, &job).await? {
        // Deleted meanwhile, or its runner has not recorded the end yet.
        find(&shared, &tenant, &id).await?;
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "still_running",
            format!("job {id} is still stopping; delete it again in a moment"),
        ));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Cancels `job` if it has not ended, then deletes it: its record and
/// events, its files here and its copy in the archive. `false` while it is
/// still stopping (or already gone).
pub(crate) async fn remove(shared: &Shared, job: &JobRow) -> ApiResult<bool> {
    let id = job.id.as_str();
    if matches!(job.state, JobState::Queued | JobState::Running) {
        cancel(shared, job).await?;
    }
    if !shared.store.delete_job(&job.tenant, id).await? {
        return Ok(false);
    }
    // Gone from the store first: nothing serves its files any more, and a
    // removal that fails leaves files, not a job that cannot be opened.
    crate::files::remove_files(shared.config.job_dirs().job(id), &format!("job {id}")).await;
    if let Some(archive) = &shared.archive
        && let Err(e) = archive.forget(id).await
    {
        tracing::warn!(job = %id, "cannot remove the job from the archive: {e}");
    }
    Ok(true)
}

/// Cancels a queued or running job; 409 if it has finished.
async fn cancel(shared: &Shared, job: &JobRow) -> ApiResult<()> {
    let id = job.id.as_str();
    match job.state {
        JobState::Queued => {
            let outcome = Outcome::cancelled("cancelled before it ran");
            let event = NewEvent::from(JobEvent::Finished {
                state: JobState::Cancelled,
                exit_code: None,
                error: outcome.error.clone(),
            });
            // A worker may have claimed it meanwhile: then cancel the run.
            if shared
                .store
                .finish(id, &[JobState::Queued], None, &outcome, &event)
                .await?
                .is_none()
            {
                cancel_running(shared, id).await;
            } else {
                // It will never run: its pooled sandbox, if it took one,
                // is closed now rather than when it expires.
                shared.pool.forget(id).await;
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
/// to record the end. A job running in another process is asked through
/// the database; its worker sees the request within a second.
async fn cancel_running(shared: &Shared, id: &str) {
    let handle = shared
        .running
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(id)
        .map(|(c, _)| c.clone());
    let Some(cancel) = handle else {
        match shared.store.request_cancel(id).await {
            Ok(true) => {
                for _ in 0..100 {
                    match shared.store.holder(id).await {
                        Ok(Some((state, _))) if state.is_terminal() => break,
                        Ok(Some(_)) => tokio::time::sleep(Duration::from_millis(50)).await,
                        _ => break,
                    }
                }
            }
            Ok(false) => {}
            Err(e) => tracing::warn!(job = %id, "cannot ask for a cancel: {e}"),
        }
        return;
    };
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

/// A compatibility shell job: `{"kind": "shell", "code": ...}`, nothing else.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CodeShell {
    #[allow(dead_code)]
    kind: CodeShellKind,
    code: Text,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase")]
enum CodeShellKind {
    Shell,
}

/// The compatibility `POST /schedule`: `{kind, code}` or `{steps: [...]}`.
#[utoipa::path(post, path = "/schedule", tag = "compatibility", summary = "Queue a job as `{kind, code}` or `{steps}`",
    description = "Takes `{kind, code}` (kind python, shell, javascript or typescript) or `{steps: [{tool, command|code}]}`.",
    request_body(content = crate::job::JobRequest, description = "`{kind, code}`, or a job as `POST /v1/jobs` takes it", examples(
        ("python" = (summary = "Python code", value = json!({"kind": "python", "code": "print('hello from the sandbox')"}))),
        ("shell" = (summary = "A shell command, as `code`", value = json!({"kind": "shell", "code": "echo hello && uname -a"}))))),
    responses((status = 202, body = crate::jobs::Scheduled), (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 403, description = "A network beyond this tenant's ceiling", body = crate::http::ErrorResponse)))]
pub(crate) async fn schedule(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = crate::http::within(body, shared.config.body_limit)?;
    // Its clients send shell jobs as `code`: the one shape `/v1/jobs`
    // does not take.
    let request = match serde_json::from_slice::<CodeShell>(&body) {
        Ok(shell) => JobRequest::Shell(ShellJob::new(shell.code)),
        Err(_) => read_json(&body)?,
    };
    let job = submit(&shared, &tenant, request).await?;
    Ok((
        StatusCode::ACCEPTED,
        Json(Scheduled {
            job_id: job.id.clone(),
            task_id: job.id,
            state: job.state,
        }),
    )
        .into_response())
}

#[derive(Deserialize)]
pub(crate) struct StatusParams {
    task_id: Option<String>,
    job_id: Option<String>,
}

#[utoipa::path(get, path = "/status/{id}", tag = "compatibility", summary = "A job's state and output",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::jobs::JobView), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn status(
    shared: State<Arc<Shared>>,
    tenant: Tenant,
    id: Path<String>,
) -> ApiResult<Json<JobView>> {
    get_job(shared, tenant, id).await
}

#[utoipa::path(get, path = "/status", tag = "compatibility", summary = "A job's state and output, by `task_id`",
    params(("task_id" = Option<String>, Query), ("job_id" = Option<String>, Query)),
    responses((status = 200, body = crate::jobs::JobView), (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn status_by_query(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    params: Result<Query<StatusParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<JobView>> {
    let Query(p) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let id = p
        .task_id
        .or(p.job_id)
        .ok_or_else(|| ApiError::bad_request("give `task_id`"))?;
    Ok(Json(full_view(
        &shared,
        &find(&shared, &tenant, &id).await?,
    )))
}
