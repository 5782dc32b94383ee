//! A sandbox's ports by name: with `cordon serve --sandbox-domain D`, a
//! request for host `{port}-{id}.D` is answered by what listens on that
//! port of API sandbox `id` (reached from inside, as previews are), each
//! sandbox on names of its own, never the API's origin.
//!
//! Port 49983 is E2B's envd: such a request goes to the E2B layer's
//! sandbox API, for the SDKs that reach a sandbox by name
//! (`E2B_DOMAIN` without `E2B_SANDBOX_URL`).
//!
//! Who may: anyone, for a sandbox made `public` (E2B's default); else the
//! tenant's token (`Authorization: Bearer`) or the sandbox's traffic token
//! (`X-Traffic-Token`, or E2B's `e2b-traffic-access-token`). Neither
//! reaches the sandbox. A sandbox not running answers 502, E2B's way.

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cordon_lab::Forward;

use crate::boxes::LiveBox;
use crate::state::Shared;

/// envd's port: its requests go to the E2B layer.
const ENVD_PORT: u16 = 49983;

/// The headers that carry a sandbox's traffic token.
const TRAFFIC_HEADERS: [&str; 2] = ["x-traffic-token", "e2b-traffic-access-token"];

/// The port and sandbox id a host name under `domain` names.
pub fn parse(host: &str, domain: &str) -> Option<(u16, String)> {
    let host = host.rsplit_once(':').map_or(host, |(h, p)| {
        if p.bytes().all(|b| b.is_ascii_digit()) {
            h
        } else {
            host
        }
    });
    let host = host.trim_end_matches('.').to_ascii_lowercase();
    let label = host.strip_suffix(domain)?.strip_suffix('.')?;
    if label.contains('.') {
        return None;
    }
    let (port, id) = label.split_once('-')?;
    let port: u16 = port.parse().ok().filter(|&p| p > 0)?;
    Some((port, crate::e2b::cordon_id(id)?))
}

/// The layer in front of every route.
pub async fn route(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let Some(domain) = shared.config.sandbox_domain.as_deref() else {
        return next.run(req).await;
    };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().host())
        .unwrap_or("");
    let Some((port, id)) = parse(host, domain) else {
        return next.run(req).await;
    };
    let shown = crate::e2b::e2b_id(&id);
    let Some(b) = shared.boxes.by_id(&id) else {
        return crate::e2b::not_running(&shown);
    };
    if port == ENVD_PORT {
        return envd(req, next, &shown).await;
    }
    // A port by name is a preview: an operator who turned previews off
    // turned these off too.
    if !shared.config.previews {
        let body = serde_json::json!({
            "code": 403,
            "message": "this server serves no sandbox's ports (cordon serve --no-previews)",
        });
        return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
    }
    if !allowed(&shared, &b, req.headers()).await {
        // Another tenant's sandbox is as absent as a missing one.
        return crate::e2b::not_running(&shown);
    }
    let upstream = {
        let mut ups = b.upstreams.lock().unwrap_or_else(|p| p.into_inner());
        ups.entry(port)
            .or_insert_with(|| Arc::new(cordon_lab::Upstream::port(b.sandbox.clone(), port)))
            .clone()
    };
    let mut req = req;
    for h in TRAFFIC_HEADERS {
        req.headers_mut().remove(h);
    }
    upstream.forward(req).await
}

/// Whether `req` may reach `b`'s ports.
async fn allowed(shared: &Shared, b: &LiveBox, headers: &axum::http::HeaderMap) -> bool {
    if b.public {
        return true;
    }
    let traffic = TRAFFIC_HEADERS
        .iter()
        .filter_map(|h| headers.get(*h))
        .any(|v| crate::e2b::same(v.as_bytes(), b.traffic_token.as_bytes()));
    if traffic {
        return true;
    }
    let Some(token) = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
    else {
        return false;
    };
    matches!(shared.store.caller(token.trim()).await, Ok(Some(c)) if c.tenant == b.tenant)
}

/// A request for envd by name: the E2B layer's route of the same path,
/// for the sandbox the name gives.
async fn envd(mut req: Request, next: Next, id: &str) -> Response {
    let path = req.uri().path_and_query().map_or("/", |p| p.as_str());
    let Ok(uri) = format!("/e2b{path}").parse::<Uri>() else {
        return StatusCode::BAD_REQUEST.into_response();
    };
    *req.uri_mut() = uri;
    if let Ok(v) = HeaderValue::from_str(id) {
        req.headers_mut().insert("e2b-sandbox-id", v);
    }
    next.run(req).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_give_a_port_and_a_sandbox() {
        let d = "sb.example.com";
        assert_eq!(
            parse("3000-sbx-00ff.sb.example.com", d),
            Some((3000, "sbx_00ff".into()))
        );
        assert_eq!(
            parse("49983-SBX-00FF.SB.example.com.:443", d),
            Some((49983, "sbx_00ff".into()))
        );
        for no in [
            "sb.example.com",
            "api.sb.example.com",
            "3000-sbx-00ff.other.com",
            "a.3000-sbx-00ff.sb.example.com",
            "0-sbx-00ff.sb.example.com",
            "99999-sbx-00ff.sb.example.com",
            "3000-job_00ff.sb.example.com",
            "3000-sbx-00ff.xsb.example.com",
        ] {
            assert_eq!(parse(no, d), None, "{no}");
        }
    }
}
