//! An owner's ports: which listen in its sandbox, and a preview of one on
//! an origin of its own (see [`crate::preview`]).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use cordon_lab::{Bearer, BearerCheck};

use super::{Found, find};
use crate::http::{ApiError, ApiResult, Tenant};
use crate::owner::Owner;
use crate::preview::{OpenPorts, Place, Preview, PreviewRequest};
use crate::sandboxes::Opened;
use crate::state::Shared;

/// Finds `owner` with its sandbox listed here, waiting for a job that has
/// just started; refuses a job that runs on another machine of the
/// deployment.
pub(crate) async fn live(shared: &Shared, tenant: &str, owner: &Owner) -> ApiResult<()> {
    match find(shared, tenant, owner).await? {
        Found::Job(job) if shared.elsewhere(&job).is_some() => Err(ApiError::new(
            StatusCode::CONFLICT,
            "elsewhere",
            format!("{owner} runs on another machine of the deployment, which serves its ports"),
        )),
        Found::Job(job) => {
            let why = super::listed(shared, tenant, *job).await?;
            if shared.sandboxes.get(owner).is_none() {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "not_running",
                    format!("{owner} has no live sandbox: {why}"),
                ));
            }
            Ok(())
        }
        Found::Session(_) => Ok(()),
        Found::Sandbox(row) => match shared.sandboxes.get(owner) {
            Some(_) => Ok(()),
            None => Err(crate::sandbox_api::gone(&row)),
        },
    }
}

/// Refuses a preview when the operator turned them off.
fn previews_on(shared: &Shared) -> ApiResult<()> {
    if shared.config.previews {
        return Ok(());
    }
    Err(ApiError::new(
        StatusCode::FORBIDDEN,
        "previews_off",
        "this server's operator has turned previews off",
    ))
}

/// A program's bearer token lets it in if it is the owner's tenant's;
/// another tenant's finds nothing there.
pub(crate) fn bearer(shared: &Arc<Shared>, tenant: &str) -> BearerCheck {
    let shared = Arc::downgrade(shared);
    let tenant = tenant.to_string();
    Arc::new(move |token: String| {
        let (shared, tenant) = (shared.clone(), tenant.clone());
        Box::pin(async move {
            let Some(shared) = shared.upgrade() else {
                return Bearer::Unknown;
            };
            match shared.store.caller(&token).await {
                Ok(Some(c)) if c.tenant == tenant => Bearer::Allowed,
                Ok(Some(_)) => Bearer::Stranger,
                Ok(None) | Err(_) => Bearer::Unknown,
            }
        })
    })
}

async fn ports(shared: &Shared, tenant: &str, owner: &Owner) -> ApiResult<Json<OpenPorts>> {
    live(shared, tenant, owner).await?;
    let ports = crate::preview::open_ports(&shared.sandboxes, owner).await?;
    Ok(Json(OpenPorts {
        ports,
        previews: shared.config.previews,
    }))
}

async fn preview(
    shared: &Arc<Shared>,
    tenant: &str,
    owner: &Owner,
    port: &str,
    headers: &HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Preview>> {
    live(shared, tenant, owner).await?;
    previews_on(shared)?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| ApiError::bad_request(format!("{port:?} is no port: 1 to 65535")))?;
    let body = crate::http::within(body, shared.config.body_limit)?;
    let req: PreviewRequest = if body.iter().all(u8::is_ascii_whitespace) {
        PreviewRequest::default()
    } else {
        crate::http::read_json(&body)?
    };
    let ttl = crate::preview::ttl(&req)?;
    let config = &shared.config;
    let at = match &config.sandbox_domain {
        Some(d) => Place::Name {
            secure: d.scheme(config.served()) == "https",
        },
        None => Place::Port {
            ip: config.listen.ip(),
            tls: config.tls.as_ref(),
        },
    };
    let opened =
        crate::preview::open(&shared.sandboxes, owner, port, at, bearer(shared, tenant)).await?;
    let origin = match (&config.sandbox_domain, &opened) {
        (Some(d), _) => d.origin(owner, port, config.served()),
        (None, Opened::Port(site)) => site.origin(&crate::lab::browser_host(site, headers)),
        (None, Opened::Name(_)) => unreachable!("a preview by name is opened with a domain"),
    };
    Ok(Json(crate::preview::link(&opened, port, origin, ttl)))
}

#[utoipa::path(get, path = "/v1/jobs/{id}/ports", tag = "jobs",
    summary = "The ports something listens on in a running job's sandbox",
    description = "Read from the sandbox's `/proc/net/tcp`: each listening port, its address, and whether a preview reaches it (one listening on 127.0.0.1 or every address).",
    params(("id" = String, Path)),
    responses((status = 200, body = OpenPorts),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The job is not running", body = crate::http::ErrorResponse)))]
pub(crate) async fn job_ports(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<OpenPorts>> {
    ports(&shared, &tenant, &Owner::Job(id)).await
}

#[utoipa::path(post, path = "/v1/jobs/{id}/ports/{port}/preview", tag = "jobs",
    summary = "A link to what a running job's sandbox serves on a port",
    description = "Opens the port on an origin of its own (a port of this server, so that the page, which the sandbox shapes, can read nothing of cordon's or of another preview's) and answers a signed link that lets any browser in until it expires; a program may send this tenant's bearer token to the preview's origin instead. HTTP and WebSockets both; the sandbox gets no route for it. The preview ends with the sandbox.",
    params(("id" = String, Path), ("port" = u16, Path, description = "The port inside the sandbox")),
    request_body(content = Option<PreviewRequest>, description = "May be empty", example = json!({"expires_in": 3600})),
    responses((status = 200, body = Preview),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Previews are turned off on this server", body = crate::http::ErrorResponse),
              (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The job is not running here, or has as many previews as it may", body = crate::http::ErrorResponse)))]
pub(crate) async fn job_preview(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, port)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Preview>> {
    preview(&shared, &tenant, &Owner::Job(id), &port, &headers, body).await
}

#[utoipa::path(get, path = "/v1/sessions/{id}/ports", tag = "sessions",
    summary = "The ports something listens on in a live session's sandbox",
    description = "As `GET /v1/jobs/{id}/ports`, for a session whose sandbox is live.",
    params(("id" = String, Path)),
    responses((status = 200, body = OpenPorts),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The session's sandbox is not live", body = crate::http::ErrorResponse)))]
pub(crate) async fn session_ports(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<OpenPorts>> {
    ports(&shared, &tenant, &Owner::Session(id)).await
}

#[utoipa::path(post, path = "/v1/sessions/{id}/ports/{port}/preview", tag = "sessions",
    summary = "A link to what a live session's sandbox serves on a port",
    description = "As `POST /v1/jobs/{id}/ports/{port}/preview`, for a session whose sandbox is live (a server the agent started ends when the session idles out).",
    params(("id" = String, Path), ("port" = u16, Path, description = "The port inside the sandbox")),
    request_body(content = Option<PreviewRequest>, description = "May be empty", example = json!({"expires_in": 3600})),
    responses((status = 200, body = Preview),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Previews are turned off on this server", body = crate::http::ErrorResponse),
              (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The session's sandbox is not live, or has as many previews as it may", body = crate::http::ErrorResponse)))]
pub(crate) async fn session_preview(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, port)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Preview>> {
    preview(&shared, &tenant, &Owner::Session(id), &port, &headers, body).await
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/ports", tag = "sandboxes",
    summary = "The ports something listens on in a sandbox",
    description = "As `GET /v1/jobs/{id}/ports`, for a running sandbox.",
    params(("id" = String, Path)),
    responses((status = 200, body = OpenPorts),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse)))]
pub(crate) async fn sandbox_ports(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<OpenPorts>> {
    ports(&shared, &tenant, &Owner::Sandbox(id)).await
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/ports/{port}/preview", tag = "sandboxes",
    summary = "A link to what a sandbox serves on a port",
    description = "As `POST /v1/jobs/{id}/ports/{port}/preview`, for a running sandbox.",
    params(("id" = String, Path), ("port" = u16, Path, description = "The port inside the sandbox")),
    request_body(content = Option<PreviewRequest>, description = "May be empty", example = json!({"expires_in": 3600})),
    responses((status = 200, body = Preview),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Previews are turned off on this server", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended, or has as many previews as it may", body = crate::http::ErrorResponse)))]
pub(crate) async fn sandbox_preview(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, port)): Path<(String, String)>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<Preview>> {
    preview(&shared, &tenant, &Owner::Sandbox(id), &port, &headers, body).await
}
