//! Which sandbox a request to a sandbox's own API is for, and whether it
//! may: `E2b-Sandbox-Id` names it, `X-Access-Token` proves the right to
//! it. A sandbox that is not running answers 502, as E2B's edge does: that
//! is how the SDKs tell a dead sandbox from a failed call.

use std::sync::Arc;

use axum::Json;
use axum::extract::FromRequestParts;
use axum::http::request::Parts;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};

use super::cordon_id;
use crate::boxes::LiveBox;
use crate::state::Shared;

/// The header naming the sandbox a request is for.
const SANDBOX_ID: &str = "e2b-sandbox-id";

/// The header carrying a sandbox's access token.
const ACCESS_TOKEN: &str = "x-access-token";

/// A request's sandbox, running, its token checked.
pub struct Envd(pub Arc<LiveBox>);

/// The answer for a sandbox that is not running (or never was).
pub fn not_running(id: &str) -> Response {
    // E2B's edge names the sandbox by the part before any dash-suffix;
    // a client gave the id, so only a printable, bounded echo of it.
    let shown: String = id
        .chars()
        .filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_')
        .take(64)
        .collect();
    let body = serde_json::json!({
        "message": "The sandbox was not found",
        "sandboxId": shown,
        "code": 502,
    });
    (StatusCode::BAD_GATEWAY, Json(body)).into_response()
}

fn sandbox_id(headers: &HeaderMap) -> Option<&str> {
    headers.get(SANDBOX_ID).and_then(|v| v.to_str().ok())
}

/// Equal, in a time that does not depend on where they differ.
pub fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

impl FromRequestParts<Arc<Shared>> for Envd {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, shared: &Arc<Shared>) -> Result<Envd, Response> {
        let id = sandbox_id(&parts.headers).unwrap_or("");
        let Some(b) = cordon_id(id).and_then(|cid| shared.boxes.by_id(&cid)) else {
            return Err(not_running(id));
        };
        let token = parts
            .headers
            .get(ACCESS_TOKEN)
            .map(|v| v.as_bytes())
            .unwrap_or_default();
        if !same(token, b.access_token.as_bytes()) {
            let body = serde_json::json!({
                "code": 401,
                "message": "unauthorized access, please provide a valid access token",
            });
            return Err((StatusCode::UNAUTHORIZED, Json(body)).into_response());
        }
        if !crate::sandbox_api::awake(shared, &b).await {
            // E2B's answer for a paused sandbox without auto-resume: a
            // request would wait for a resume that nothing asked for.
            let body = serde_json::json!({
                "code": 502,
                "message": format!("The sandbox {} is paused: connect to it to resume it", crate::e2b::e2b_id(&b.id)),
                "sandboxId": crate::e2b::e2b_id(&b.id),
            });
            return Err((StatusCode::BAD_GATEWAY, Json(body)).into_response());
        }
        Ok(Envd(b))
    }
}

/// The connection a request came on, to cut off when its sandbox ends.
pub fn peer(extensions: &axum::http::Extensions) -> Option<cordon_listen::Peer> {
    extensions
        .get::<axum::extract::ConnectInfo<cordon_listen::Peer>>()
        .map(|axum::extract::ConnectInfo(p)| p.clone())
}

/// Whom a request acts as in its sandbox.
#[derive(Debug, Clone)]
pub struct User {
    pub account: cordon_image::root::Account,
    /// Ids to run as, when not the sandbox's default user.
    pub ids: Option<(u32, u32)>,
}

/// The user a request names (`Authorization: Basic`, E2B's `username`:
/// any user of the sandbox's image; none: the image's own).
pub async fn user(b: &LiveBox, headers: &HeaderMap) -> Result<User, String> {
    let name = headers
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Basic "))
        .and_then(|v| {
            base64::Engine::decode(&base64::engine::general_purpose::STANDARD, v.trim()).ok()
        })
        .and_then(|v| String::from_utf8(v).ok())
        .map(|v| v.split_once(':').map_or(v.clone(), |(u, _)| u.to_string()))
        .unwrap_or_default();
    named(b, &name).await
}

/// The user called `name` in `b` (empty: its default).
pub async fn named(b: &LiveBox, name: &str) -> Result<User, String> {
    if name.is_empty() || name == b.account.name {
        return Ok(User {
            account: b.account.clone(),
            ids: None,
        });
    }
    let shown = cordon_tools::printable(name);
    if b.layers.is_empty() {
        return Err(format!(
            "user {shown}: this sandbox runs on the host's root, as {} only",
            b.account.name
        ));
    }
    let (layers, wanted) = (b.layers.clone(), name.to_string());
    let found =
        tokio::task::spawn_blocking(move || cordon_image::root::account_named(&layers, &wanted))
            .await
            .ok()
            .flatten();
    match found {
        Some(account) => Ok(User {
            ids: Some((account.uid, account.gid)),
            account,
        }),
        None => Err(format!(
            "user {shown} does not exist in the sandbox's image"
        )),
    }
}

/// `GET /health`: a sandbox's (with `E2b-Sandbox-Id`: 204 while it runs,
/// 502 when paused or after), else the control API's.
pub async fn health(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
    headers: HeaderMap,
) -> Response {
    match sandbox_id(&headers) {
        None => (StatusCode::OK, "Health check successful").into_response(),
        Some(id) => match cordon_id(id).and_then(|cid| shared.boxes.by_id(&cid)) {
            // Asking is not a request for it: a paused one stays paused.
            Some(b) if !b.sandbox.is_paused() => StatusCode::NO_CONTENT.into_response(),
            _ => not_running(id),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_compare_whole() {
        assert!(same(b"abc", b"abc"));
        assert!(!same(b"abc", b"abd"));
        assert!(!same(b"abc", b"ab"));
        assert!(!same(b"", b"a"));
    }
}
