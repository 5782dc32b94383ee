//! An owner's ports: which listen in its sandbox, and a preview of one on
//! an origin of its own (see [`crate::preview`]).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use cordon_lab::{Bearer, BearerCheck};

use serde::Deserialize;

use super::{Found, find};
use crate::http::{ApiError, ApiResult, Tenant};
use crate::job::JobState;
use crate::owner::Owner;
use crate::preview::{OpenPorts, Place, Preview, PreviewRequest};
use crate::relay::SiteRelay;
use crate::sandboxes::Opened;
use crate::state::Shared;
use crate::store::JobRow;

/// Where `owner`'s sandbox runs.
pub(crate) enum Whereabouts {
    /// Listed in this process.
    Here,
    /// A job running on another worker of the deployment: its row, and
    /// the worker.
    Worker(Box<JobRow>, String),
}

/// Finds `owner` with its sandbox listed here (waiting for a job that has
/// just started) or running on another worker.
pub(crate) async fn whereabouts(
    shared: &Shared,
    tenant: &str,
    owner: &Owner,
) -> ApiResult<Whereabouts> {
    match find(shared, tenant, owner).await? {
        Found::Job(job) => {
            if let Some(worker) = shared.elsewhere(&job).map(str::to_string) {
                return Ok(Whereabouts::Worker(job, worker));
            }
            let why = super::listed(shared, tenant, *job).await?;
            if shared.sandboxes.get(owner).is_none() {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "not_running",
                    format!("{owner} has no live sandbox: {why}"),
                ));
            }
            Ok(Whereabouts::Here)
        }
        Found::Session(row) => {
            // A paused session is used again: resumed, as a message would.
            if shared.sandboxes.get(owner).is_some_and(|s| s.is_paused()) {
                let wait = std::time::Duration::from_secs(30);
                drop(crate::sessions::take_waiting(shared, &row, wait).await?);
            }
            Ok(Whereabouts::Here)
        }
        Found::Sandbox(row) => match shared.sandboxes.get(owner) {
            Some(_) => Ok(Whereabouts::Here),
            None => Err(crate::sandbox_api::gone(&row)),
        },
    }
}

/// Finds `owner` with its sandbox listed here; refuses a job that runs on
/// another machine (whose ports that machine's relay route reaches).
async fn live(shared: &Shared, tenant: &str, owner: &Owner) -> ApiResult<()> {
    match whereabouts(shared, tenant, owner).await? {
        Whereabouts::Here => Ok(()),
        Whereabouts::Worker(..) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "elsewhere",
            format!("{owner} runs on another machine of the deployment, which serves its ports"),
        )),
    }
}

/// Where this server opens previews: by name under its sandbox domain,
/// else on ports of its own address.
fn place(config: &crate::config::ServerConfig) -> Place<'_> {
    match &config.sandbox_domain {
        Some(d) => Place::Name {
            secure: d.scheme(config.served()) == "https",
        },
        None => Place::Port {
            ip: config.listen.ip(),
            tls: config.tls.as_ref(),
        },
    }
}

/// `owner`'s preview of `port` if it is open, here or relayed.
pub(crate) fn existing(shared: &Shared, owner: &Owner, port: u16) -> Option<Opened> {
    shared
        .sandboxes
        .opened(owner, port)
        .or_else(|| match owner {
            Owner::Job(id) => shared.remote_previews.get(id, port),
            Owner::Session(_) | Owner::Sandbox(_) => None,
        })
}

/// `owner`'s preview of `port`, opened now if it is not yet: over its
/// sandbox here, or, for a job on another worker, relayed to it.
pub(crate) async fn opened(
    shared: &Arc<Shared>,
    tenant: &str,
    owner: &Owner,
    port: u16,
    whereabouts: Whereabouts,
) -> ApiResult<Opened> {
    previews_on(shared)?;
    let at = place(&shared.config);
    let bearer = bearer(shared, tenant);
    let (job, worker) = match whereabouts {
        Whereabouts::Here => {
            return crate::preview::open(&shared.sandboxes, owner, port, at, bearer).await;
        }
        Whereabouts::Worker(job, worker) => (job, worker),
    };
    let id = &job.id;
    if job.state != JobState::Running {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_running",
            format!("{owner} has no live sandbox: its sandbox is being closed"),
        ));
    }
    if let Some(opened) = shared.remote_previews.get(id, port) {
        return Ok(opened);
    }
    let Some(cluster) = shared.config.cluster.clone() else {
        unreachable!("only a deployment of many runs jobs elsewhere");
    };
    let url = shared
        .store
        .worker_url(&worker)
        .await?
        .ok_or_else(|| crate::relay::unreachable(id))?;
    let relay = Arc::new(SiteRelay::port(cluster, tenant, url, id, port));
    let (opened, new) = shared
        .remote_previews
        .open(id, port, at, relay, bearer)
        .await?;
    if new {
        super::watch_elsewhere(shared, tenant, id, worker);
    }
    Ok(opened)
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
    // A job elsewhere: its worker answers this route, relayed.
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
    let whereabouts = whereabouts(shared, tenant, owner).await?;
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
    let opened = opened(shared, tenant, owner, port, whereabouts).await?;
    let config = &shared.config;
    let origin = match (&config.sandbox_domain, &opened) {
        (Some(d), _) => d.origin(owner, port, config.served()),
        (None, Opened::Port(site)) => site.origin(&crate::lab::browser_host(site, headers)),
        (None, Opened::Name(_)) => unreachable!("a preview by name is opened with a domain"),
    };
    Ok(Json(crate::preview::link(&opened, port, origin, ttl)))
}

/// The path of a relayed request for a port.
#[derive(Deserialize)]
pub(crate) struct RelayPath {
    id: String,
    port: String,
}

/// A worker's side of a preview served by an API process for a job that
/// runs here: a request the deployment signed ([`crate::relay::admit`]),
/// sent on to the port in the job's sandbox. Never for a client: the
/// sandbox's pages are not served on the API's origin.
pub(crate) async fn job_port_relay(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(p): Path<RelayPath>,
    mut req: axum::extract::Request,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    if req.extensions().get::<crate::http::Relayed>().is_none() {
        return ApiError::not_found("such route (see /openapi.json)").into_response();
    }
    let Some(port) = p.port.parse::<u16>().ok().filter(|p| *p > 0) else {
        return ApiError::bad_request(format!("{:?} is no port: 1 to 65535", p.port))
            .into_response();
    };
    let owner = Owner::Job(p.id);
    if let Err(e) = live(&shared, &tenant, &owner).await {
        return e.into_response();
    }
    // A gate of its own on this worker, for its upstream alone: the API
    // process checked the browser, the deployment signed the request.
    let opened = crate::preview::open(
        &shared.sandboxes,
        &owner,
        port,
        Place::Name { secure: false },
        bearer(&shared, &tenant),
    )
    .await;
    let opened = match opened {
        Ok(o) => o,
        Err(e) => return e.into_response(),
    };
    let prefix = crate::relay::port_relay_path(owner.id(), port);
    let rest = req
        .uri()
        .path_and_query()
        .map_or("", |pq| pq.as_str())
        .strip_prefix(prefix.as_str())
        .unwrap_or("/")
        .to_string();
    let rest = if rest.starts_with('/') {
        rest
    } else {
        format!("/{rest}")
    };
    match rest.parse::<axum::http::Uri>() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(_) => return ApiError::bad_request("no such path").into_response(),
    }
    opened.gate().upstream().forward(req).await
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
              (status = 409, description = "It has ended, or is paused", body = crate::http::ErrorResponse)))]
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
