//! The files API over an owner's workspace: a running or finished job's on
//! the worker that ran it (or in the archive every process reads), a
//! session's under its directory.

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cordon_tools::Workspace;

use super::{Found, find};
use crate::archive::Archive;
use crate::files::Listing;
use crate::http::{ApiError, ApiResult, Tenant};
use crate::job::JobState;
use crate::owner::Owner;
use crate::state::Shared;
use crate::store::JobRow;

/// Where an owner's files are: its workspace on this machine, or (a
/// finished job's) the archive every process reads.
enum Files<'s> {
    Here(Workspace),
    Archived(&'s Archive),
}

async fn files<'s>(shared: &'s Shared, found: &Found) -> ApiResult<Files<'s>> {
    let dir = match found {
        Found::Job(job) => {
            if let Some(gone) = removed(job) {
                return Err(gone);
            }
            if let Some(archive) = shared.archived(job) {
                return Ok(Files::Archived(archive));
            }
            served_here(shared, job)?;
            let dir = shared.config.job_dirs().workspace(&job.id);
            // A worker makes a job's workspace after claiming it: between
            // the two, the job runs here and has no files yet.
            if job.state == JobState::Running && tokio::fs::symlink_metadata(&dir).await.is_err() {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "starting",
                    format!(
                        "job {} is starting: its workspace is being made; try again",
                        job.id
                    ),
                ));
            }
            dir
        }
        Found::Session(row) => crate::sessions::dir(shared, &row.id).join("workspace"),
        Found::Sandbox(row) => {
            if row.ended_ms.is_some() {
                return Err(ApiError::new(
                    StatusCode::GONE,
                    "gone",
                    format!("sandbox {} has ended, and its files with it", row.id),
                ));
            }
            crate::sandbox_api::dir(shared, &row.id).join("workspace")
        }
    };
    shared
        .config
        .sandboxes()
        .open_workspace(dir)
        .await
        .map(Files::Here)
        .map_err(crate::files::error)
}

fn removed(job: &JobRow) -> Option<ApiError> {
    let id = &job.id;
    job.workspace_removed_ms.is_some().then(|| {
        ApiError::new(
            StatusCode::GONE,
            "gone",
            format!(
                "job {id}'s workspace was removed after the job finished (the server keeps \
                 workspaces for `--keep-workspaces`); its output, events and result are kept \
                 at /v1/jobs/{id}"
            ),
        )
    })
}

/// In a deployment of many processes, whether job's files are this
/// process's to serve: only a worker's, for the jobs it runs or ran.
fn served_here(shared: &Shared, job: &JobRow) -> ApiResult<()> {
    if shared.config.cluster.is_none() {
        return Ok(());
    }
    let id = &job.id;
    match &job.worker {
        Some(w) if *w == shared.worker => Ok(()),
        // Relayed here by an API process whose look at the job is older
        // than the job's move to another worker.
        Some(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "moved",
            format!("job {id} has moved to another worker; try again"),
        )),
        None => Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_started",
            match job.state {
                JobState::Queued if shared.archive.is_some() => format!(
                    "job {id} is queued, and its workspace is made on the worker that runs it: \
                     files written now wait for it in the archive, and can be read once it runs"
                ),
                JobState::Queued => format!(
                    "job {id} is queued, and its workspace is made on the worker that runs it: \
                     its files can be read and written once it runs"
                ),
                _ => format!("job {id} ended without running on a worker: it has no workspace"),
            },
        )),
    }
}

async fn list(shared: &Shared, tenant: &str, owner: &Owner) -> ApiResult<Json<Listing>> {
    let found = find(shared, tenant, owner).await?;
    Ok(Json(match files(shared, &found).await? {
        Files::Here(ws) => crate::files::list(&ws, ".")?,
        Files::Archived(a) => crate::files::list_archived(a, owner.id(), ".").await?,
    }))
}

async fn read(shared: &Shared, tenant: &str, owner: &Owner, path: &str) -> ApiResult<Response> {
    let limit = shared.config.file_limit;
    let found = find(shared, tenant, owner).await?;
    match files(shared, &found).await? {
        Files::Here(ws) => crate::files::read(&ws, path, limit),
        Files::Archived(a) => crate::files::read_archived(a, owner.id(), path, limit).await,
    }
}

async fn write(
    shared: &Shared,
    tenant: &str,
    owner: &Owner,
    path: String,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = crate::http::within(body, shared.config.file_limit)?;
    let found = find(shared, tenant, owner).await?;
    if let Found::Job(job) = &found
        && let Some(archive) = staging(shared, job)
    {
        return stage(shared, archive, tenant, &job.id, path, body).await;
    }
    match files(shared, &found).await? {
        Files::Here(ws) => crate::files::write(ws, path, body).await,
        Files::Archived(_) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "archived",
            format!(
                "{owner} has finished and its workspace is archived: its files can be read, \
                 not written"
            ),
        )),
    }
}

/// Where a file written to a queued job goes in a deployment of many
/// machines with an archive: no worker has its workspace yet, so the
/// archive keeps the file until one takes the job.
fn staging<'s>(shared: &'s Shared, job: &JobRow) -> Option<&'s Archive> {
    shared.config.cluster.as_ref()?;
    if job.state != JobState::Queued || job.worker.is_some() {
        return None;
    }
    shared.archive.as_deref()
}

/// Stages `body` as `path` of queued job `id` (see [`staging`]).
async fn stage(
    shared: &Shared,
    archive: &Archive,
    tenant: &str,
    id: &str,
    path: String,
    body: Bytes,
) -> ApiResult<Response> {
    let p = cordon_tools::WsPath::parse(&path).map_err(crate::files::error)?;
    let created = archive.stage(id, &p, body).await.map_err(|e| match e {
        crate::archive::ArchiveError::Staging(why) => ApiError::bad_request(why),
        e => {
            tracing::error!(job = %id, "staging a file: {e}");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "cannot keep the file in the archive; try again",
            )
        }
    })?;
    // A worker that took the job meanwhile may have looked before the
    // file came: then it goes, and the client writes it to the worker.
    let now = crate::jobs::find(shared, tenant, id).await?;
    if staging(shared, &now).is_none() {
        if let Err(e) = archive.unstage_path(id, &p).await {
            tracing::warn!(job = %id, "cannot remove a late staged file: {e}");
        }
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "started",
            format!("job {id} started while {path} was being written; write it again"),
        ));
    }
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(crate::files::Written { path, created })).into_response())
}

#[utoipa::path(get, path = "/v1/jobs/{id}/files", tag = "jobs", summary = "The workspace's top directory",
    params(("id" = String, Path)),
    responses((status = 410, description = "The finished job's workspace was removed (`--keep-workspaces`)", body = crate::http::ErrorResponse), (status = 200, body = crate::files::Listing), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse), (status = 409, description = "In a deployment of many machines: the job has not started on a worker yet, or has just moved", body = crate::http::ErrorResponse), (status = 503, description = "The workspace or the archive cannot be read now; try again", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_job_root(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Listing>> {
    list(&shared, &tenant, &Owner::Job(id)).await
}

/// A file's bytes, or a directory's listing as JSON.
#[utoipa::path(get, path = "/v1/jobs/{id}/files/{path}", tag = "jobs", summary = "A workspace file's bytes, or a directory's listing",
    params(("id" = String, Path), ("path" = String, Path, description = "Relative to the workspace; `..`, absolute paths and symlinks out are refused")),
    responses((status = 410, description = "The finished job's workspace was removed (`--keep-workspaces`)", body = crate::http::ErrorResponse), (status = 200, response = crate::files::FileAnswer),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job or file", body = crate::http::ErrorResponse),
              (status = 409, description = "In a deployment of many machines: the job has not started on a worker yet, or has just moved", body = crate::http::ErrorResponse),
              (status = 413, description = "Larger than the files API serves", body = crate::http::ErrorResponse),
              (status = 503, description = "The workspace or the archive cannot be read now; try again", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_job_file(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, path)): Path<(String, String)>,
) -> ApiResult<Response> {
    read(&shared, &tenant, &Owner::Job(id), &path).await
}

#[utoipa::path(put, path = "/v1/jobs/{id}/files/{path}", tag = "jobs", summary = "Write a workspace file (parents are created)",
    params(("id" = String, Path), ("path" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", example = json!("print('hello')\n")),
    responses((status = 410, description = "The finished job's workspace was removed (`--keep-workspaces`)", body = crate::http::ErrorResponse), (status = 201, description = "Created", body = crate::files::Written),
              (status = 200, description = "Replaced", body = crate::files::Written),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse), (status = 409, description = "The job's workspace is archived (read-only), or in a deployment of many machines not made yet", body = crate::http::ErrorResponse), (status = 413, description = "Too large", body = crate::http::ErrorResponse)))]
pub(crate) async fn put_job_file(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, path)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    write(&shared, &tenant, &Owner::Job(id), path, body).await
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", tag = "sessions", summary = "The session's workspace's top directory",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::files::Listing), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_session_root(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Listing>> {
    list(&shared, &tenant, &Owner::Session(id)).await
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", tag = "sessions", summary = "A session's workspace file's bytes, or a directory's listing",
    params(("id" = String, Path), ("path" = String, Path, description = "Relative to the workspace; `..`, absolute paths and symlinks out are refused")),
    responses((status = 200, response = crate::files::FileAnswer),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session or file", body = crate::http::ErrorResponse),
              (status = 413, description = "Larger than the files API serves", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_session_file(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, path)): Path<(String, String)>,
) -> ApiResult<Response> {
    read(&shared, &tenant, &Owner::Session(id), &path).await
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/{path}", tag = "sessions", summary = "Write a file in a session's workspace (parents are created)",
    params(("id" = String, Path), ("path" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", example = json!("print('hello')\n")),
    responses((status = 201, description = "Created", body = crate::files::Written), (status = 200, description = "Replaced", body = crate::files::Written),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse), (status = 413, description = "Too large", body = crate::http::ErrorResponse)))]
pub(crate) async fn put_session_file(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, path)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    write(&shared, &tenant, &Owner::Session(id), path, body).await
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files", tag = "sandboxes", summary = "A sandbox's workspace's top directory",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::files::Listing), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse), (status = 410, description = "It has ended, and its files with it", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_sandbox_root(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<Listing>> {
    list(&shared, &tenant, &Owner::Sandbox(id)).await
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/files/{path}", tag = "sandboxes", summary = "A sandbox's workspace file's bytes, or a directory's listing",
    params(("id" = String, Path), ("path" = String, Path, description = "Relative to the workspace (`/workspace`); `..`, absolute paths and symlinks out are refused")),
    responses((status = 200, response = crate::files::FileAnswer),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such sandbox or file", body = crate::http::ErrorResponse),
              (status = 410, description = "It has ended, and its files with it", body = crate::http::ErrorResponse),
              (status = 413, description = "Larger than the files API serves", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_sandbox_file(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, path)): Path<(String, String)>,
) -> ApiResult<Response> {
    read(&shared, &tenant, &Owner::Sandbox(id), &path).await
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/files/{path}", tag = "sandboxes", summary = "Write a file in a sandbox's workspace (parents are created)",
    params(("id" = String, Path), ("path" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", example = json!("print('hello')\n")),
    responses((status = 201, description = "Created", body = crate::files::Written), (status = 200, description = "Replaced", body = crate::files::Written),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse), (status = 410, description = "It has ended", body = crate::http::ErrorResponse), (status = 413, description = "Too large", body = crate::http::ErrorResponse)))]
pub(crate) async fn put_sandbox_file(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, path)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    write(&shared, &tenant, &Owner::Sandbox(id), path, body).await
}
