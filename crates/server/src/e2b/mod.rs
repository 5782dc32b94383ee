//! E2B compatibility: the stock `e2b` SDKs (PyPI and npm) drive the
//! sandbox API, with `E2B_API_URL` and `E2B_SANDBOX_URL` set to
//! `BASE/e2b` and a key from `cordon token create --e2b`.
//!
//! Two APIs live under `/e2b`, told apart as E2B's own edge does:
//!
//! - the control API ([`control`]: create, list, connect, time out,
//!   kill), authenticated by `X-API-KEY`, a tenant's token;
//! - a sandbox's own API ("envd": [`process`] over Connect, `/health`),
//!   for requests naming a sandbox in `E2b-Sandbox-Id` and proving the
//!   right to it with its access token (`X-Access-Token`), minted with it
//!   and handed to its tenant only.
//!
//! Both call the sandbox API's internals, never its routes. This layer
//! follows E2B's published protocol (its OpenAPI document, envd's
//! protobufs) with its own code; what cordon does not do it refuses with
//! a message that says so.

mod connect;
mod control;
mod envd;

pub use envd::{not_running, same};
mod files;
mod filesystem;
mod process;

use std::sync::Arc;

use axum::extract::DefaultBodyLimit;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};

use crate::http::ApiError;
use crate::state::Shared;

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/e2b/health", get(envd::health))
        .route(
            "/e2b/sandboxes",
            post(control::create).get(control::list_v1),
        )
        .route("/e2b/v2/sandboxes", get(control::list))
        .route(
            "/e2b/sandboxes/{id}",
            get(control::info).delete(control::kill),
        )
        .route("/e2b/sandboxes/{id}/timeout", post(control::set_timeout))
        .route("/e2b/sandboxes/{id}/connect", post(control::connect))
        .route("/e2b/sandboxes/{id}/resume", post(control::resume))
        .route("/e2b/sandboxes/{id}/refreshes", post(control::refresh))
        .route("/e2b/sandboxes/{id}/pause", post(control::pause))
        .route("/e2b/sandboxes/{id}/fork", post(control::fork))
        .route("/e2b/sandboxes/{id}/metrics", get(control::metrics))
        .route("/e2b/process.Process/{method}", post(process::rpc))
        .route("/e2b/filesystem.Filesystem/{method}", post(filesystem::rpc))
        // Signed links lose the path's prefix: the SDKs make them on the
        // server's root.
        .route(
            "/e2b/files",
            get(files::read)
                .post(files::write)
                .layer(DefaultBodyLimit::disable()),
        )
        .route(
            "/files",
            get(files::read)
                .post(files::write)
                .layer(DefaultBodyLimit::disable()),
        )
}

/// The prefix E2B's sandbox ids have, which cordon's share.
const ID_PREFIX: &str = "sbx";

/// A cordon sandbox id as E2B clients see it: `sbx-<hex>`, since the id
/// is a label of host names (`{port}-{id}.{domain}`) and `_` has no place
/// there.
pub fn e2b_id(id: &str) -> String {
    id.replacen('_', "-", 1)
}

/// The cordon id of an id a client gives, in either spelling.
pub fn cordon_id(id: &str) -> Option<String> {
    let rest = id.strip_prefix(ID_PREFIX)?.strip_prefix(['-', '_'])?;
    (!rest.is_empty() && rest.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| format!("{ID_PREFIX}_{rest}"))
}

/// An error as E2B's APIs answer: `{"code": <status>, "message": "…"}`.
#[derive(Debug)]
pub struct E2bError {
    status: StatusCode,
    message: String,
}

impl E2bError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> E2bError {
        E2bError {
            status,
            message: message.into(),
        }
    }

    pub fn not_found(id: &str) -> E2bError {
        E2bError::new(StatusCode::NOT_FOUND, format!("sandbox {id} not found"))
    }
}

impl From<ApiError> for E2bError {
    fn from(e: ApiError) -> E2bError {
        E2bError::new(e.status(), e.message().to_string())
    }
}

impl From<crate::store::StoreError> for E2bError {
    fn from(e: crate::store::StoreError) -> E2bError {
        ApiError::from(e).into()
    }
}

impl IntoResponse for E2bError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "code": self.status.as_u16(), "message": self.message });
        (self.status, Json(body)).into_response()
    }
}

pub type E2bResult<T> = Result<T, E2bError>;

/// The tenant whose key a control request carries: `X-API-KEY` (a token
/// in E2B's spelling, `e2b_<hex>` for cordon's `cdn_<hex>`, or cordon's),
/// or cordon's own `Authorization: Bearer`.
pub struct ApiKey(pub String);

impl axum::extract::FromRequestParts<Arc<Shared>> for ApiKey {
    type Rejection = E2bError;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        shared: &Arc<Shared>,
    ) -> E2bResult<ApiKey> {
        let unauthorized = |m: &str| E2bError::new(StatusCode::UNAUTHORIZED, m);
        let token = key(&parts.headers).ok_or_else(|| {
            unauthorized(
                "send X-API-KEY: e2b_… (make one with `cordon token create --tenant NAME --e2b`)",
            )
        })?;
        let caller = shared
            .store
            .caller(&token)
            .await?
            .ok_or_else(|| unauthorized("unknown API key"))?;
        Ok(ApiKey(caller.tenant))
    }
}

/// The token a request's key is (the store reads either spelling).
fn key(headers: &HeaderMap) -> Option<String> {
    if let Some(k) = headers.get("x-api-key").and_then(|v| v.to_str().ok()) {
        return Some(k.trim().to_string());
    }
    headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(|t| t.trim().to_string())
}

/// A key as the E2B SDKs want it (`e2b_` and hex) for cordon token
/// `token`.
pub fn e2b_key(token: &str) -> Option<String> {
    token
        .strip_prefix(crate::store::TOKEN_PREFIX)
        .map(|body| format!("{}{body}", crate::store::E2B_PREFIX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_spelt_for_host_names_and_read_either_way() {
        assert_eq!(e2b_id("sbx_00ff"), "sbx-00ff");
        assert_eq!(cordon_id("sbx-00ff").as_deref(), Some("sbx_00ff"));
        assert_eq!(cordon_id("sbx_00ff").as_deref(), Some("sbx_00ff"));
        for bad in [
            "sbx-",
            "sbx",
            "job_00ff",
            "sbx-00ff/..",
            "sbx-0g",
            "nonexistingsandbox",
        ] {
            assert_eq!(cordon_id(bad), None, "{bad}");
        }
    }

    #[test]
    fn keys_come_in_e2bs_header_or_cordons() {
        let mut h = HeaderMap::new();
        h.insert("x-api-key", "e2b_0123".parse().unwrap());
        assert_eq!(key(&h).as_deref(), Some("e2b_0123"));
        h.insert("x-api-key", "cdn_0123".parse().unwrap());
        assert_eq!(key(&h).as_deref(), Some("cdn_0123"));
        let mut h = HeaderMap::new();
        h.insert(header::AUTHORIZATION, "Bearer cdn_9".parse().unwrap());
        assert_eq!(key(&h).as_deref(), Some("cdn_9"));
        assert_eq!(key(&HeaderMap::new()), None);
        assert_eq!(e2b_key("cdn_abc").as_deref(), Some("e2b_abc"));
        assert_eq!(e2b_key("other"), None);
    }
}
