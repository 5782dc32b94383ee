//! The router: every resource's routes under one tree, with the body
//! limits, the JSON fallbacks for unknown routes and methods, and
//! `/health`. The top of the crate: it knows every resource, none knows it.

use std::sync::Arc;

use axum::Router;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::middleware;
use axum::routing::{any, get, post};

use crate::http::ApiError;
use crate::state::Shared;
use crate::{jobs, owned};

pub fn router(shared: Arc<Shared>) -> Router {
    let file_limit = shared.config.file_limit;
    let body_limit = shared.config.body_limit;
    let mut relayed = job_on_its_worker(file_limit);
    if shared.config.cluster.is_some() {
        relayed = relayed.route_layer(middleware::from_fn_with_state(
            shared.clone(),
            crate::relay::to_worker,
        ));
    }
    let mut api = Router::new()
        .route("/health", get(crate::health::health))
        .route("/v1/jobs", post(jobs::create_job).get(jobs::list_jobs))
        .route("/v1/jobs/{id}", get(jobs::get_job).delete(jobs::delete_job))
        .route("/v1/jobs/{id}/cancel", post(jobs::cancel_job))
        .route("/v1/jobs/{id}/events", get(jobs::job_events))
        .route(
            "/v1/jobs/{id}/network",
            get(owned::get_job_network).put(owned::put_job_network),
        )
        .route("/v1/jobs/{id}/lab", post(owned::open_job_lab))
        .route(
            "/v1/jobs/{id}/ports/{port}/preview",
            post(owned::job_preview),
        )
        .merge(relayed)
        .merge(sessions_own(file_limit))
        .merge(crate::sandbox_api::routes())
        .merge(sandboxes_own(file_limit))
        .merge(crate::e2b::routes())
        .route("/schedule", post(jobs::schedule))
        .route("/status", get(jobs::status_by_query))
        .route("/status/{id}", get(jobs::status))
        .merge(crate::sessions::routes())
        .merge(crate::tokens::routes())
        .merge(crate::credentials::routes())
        .merge(crate::tenants::routes())
        .merge(crate::images::routes())
        .merge(crate::mcp::routes(&shared))
        .merge(crate::openapi::routes())
        .merge(crate::docs::routes())
        .merge(crate::ui::routes())
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed);
    if shared.config.cluster.is_some() {
        // A process that runs jobs too serves the API processes' relays.
        api = api.merge(port_relay(&shared));
    }
    let api = api
        .layer(DefaultBodyLimit::max(body_limit))
        .with_state(shared.clone());
    // Around the whole router, not its routes: a sandbox's name answers
    // before any route is chosen (and may choose another).
    Router::new()
        .fallback_service(api)
        .layer(middleware::from_fn_with_state(shared, crate::hosts::route))
}

/// What of a job is served by the process that runs it: its files, its
/// live view and its Lab's bearer route. An API process relays them to
/// the job's worker (see [`crate::relay`]).
fn job_on_its_worker(file_limit: usize) -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/jobs/{id}/ports", get(owned::job_ports))
        .route("/v1/jobs/{id}/vnc", get(owned::job_vnc))
        .route("/v1/jobs/{id}/lab/", any(owned::job_lab))
        .route("/v1/jobs/{id}/lab/{*path}", any(owned::job_lab))
        .route("/v1/jobs/{id}/files", get(owned::list_job_root))
        .route(
            "/v1/jobs/{id}/files/{*path}",
            get(owned::get_job_file)
                .put(owned::put_job_file)
                .layer(DefaultBodyLimit::max(file_limit)),
        )
}

/// A worker's relay of a port of a job's sandbox, for a preview an API
/// process serves: signed requests only ([`crate::relay::admit`]), never
/// a client's, so no sandbox's page is served on the API's origin.
fn port_relay(shared: &Arc<Shared>) -> Router<Arc<Shared>> {
    Router::new()
        .route(
            "/v1/jobs/{id}/ports/{port}/relay/",
            any(owned::job_port_relay),
        )
        .route(
            "/v1/jobs/{id}/ports/{port}/relay/{*path}",
            any(owned::job_port_relay),
        )
        .route_layer(middleware::from_fn_with_state(
            shared.clone(),
            crate::relay::admit,
        ))
}

/// What a session owns: its files, desktop, Lab and network.
fn sessions_own(file_limit: usize) -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/sessions/{id}/files", get(owned::list_session_root))
        .route(
            "/v1/sessions/{id}/files/{*path}",
            get(owned::get_session_file)
                .put(owned::put_session_file)
                .layer(DefaultBodyLimit::max(file_limit)),
        )
        .route("/v1/sessions/{id}/vnc", get(owned::session_vnc))
        .route("/v1/sessions/{id}/lab", post(owned::open_session_lab))
        .route("/v1/sessions/{id}/ports", get(owned::session_ports))
        .route(
            "/v1/sessions/{id}/ports/{port}/preview",
            post(owned::session_preview),
        )
        .route("/v1/sessions/{id}/lab/", any(owned::session_lab))
        .route("/v1/sessions/{id}/lab/{*path}", any(owned::session_lab))
        .route(
            "/v1/sessions/{id}/network",
            get(owned::get_session_network).put(owned::put_session_network),
        )
}

/// What an API sandbox owns: its files, network and ports.
fn sandboxes_own(file_limit: usize) -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/sandboxes/{id}/files", get(owned::list_sandbox_root))
        .route(
            "/v1/sandboxes/{id}/files/{*path}",
            get(owned::get_sandbox_file)
                .put(owned::put_sandbox_file)
                .layer(DefaultBodyLimit::max(file_limit)),
        )
        .route(
            "/v1/sandboxes/{id}/network",
            get(owned::get_sandbox_network).put(owned::put_sandbox_network),
        )
        .route("/v1/sandboxes/{id}/ports", get(owned::sandbox_ports))
        .route(
            "/v1/sandboxes/{id}/ports/{port}/preview",
            post(owned::sandbox_preview),
        )
}

/// A worker's listener: `/health`, and in a deployment with a cluster key
/// the job routes, for requests the API processes relay and sign.
pub fn worker_router(shared: Arc<Shared>) -> Router {
    let mut app = Router::new();
    if shared.config.cluster.is_some() {
        app = job_on_its_worker(shared.config.file_limit)
            .route_layer(middleware::from_fn_with_state(
                shared.clone(),
                crate::relay::admit,
            ))
            .merge(port_relay(&shared));
    }
    app.route("/health", get(crate::health::health))
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(DefaultBodyLimit::max(shared.config.body_limit))
        .with_state(shared)
}

async fn not_found() -> ApiError {
    ApiError::not_found("such route (see /openapi.json)")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "this route does not take that method",
    )
}
