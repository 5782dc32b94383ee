//! Sandboxes' ports by name: with `cordon serve --sandbox-domain D`, a
//! request for host `{port}-{label}.D` is answered by what listens on that
//! port of the sandbox of job, session or API sandbox `label`
//! (`job-<hex>`, `ses-<hex>`, `sbx-<hex>`), reached from inside as every
//! preview is: each port on a name of its own, never the API's origin.
//!
//! Who may: a browser with the preview's signed link (exchanged at once
//! for a cookie of that name alone) or its cookie; a program with the
//! owner's tenant's token (`Authorization: Bearer`); for an API sandbox,
//! also anyone if it was made `public` (E2B's default), or its traffic
//! token (`X-Traffic-Token`, or E2B's `e2b-traffic-access-token`). No
//! credential reaches the sandbox. Another tenant's token finds nothing
//! (404), as does a name of nothing running here.
//!
//! Port 49983 of an API sandbox is E2B's envd: such a request goes to the
//! E2B layer's sandbox API, for the SDKs that reach a sandbox by name
//! (`E2B_DOMAIN` without `E2B_SANDBOX_URL`).

use std::sync::Arc;

use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, Uri, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cordon_lab::Forward;

use crate::boxes::LiveBox;
use crate::owner::Owner;
use crate::state::Shared;

/// envd's port: its requests go to the E2B layer.
const ENVD_PORT: u16 = 49983;

/// The headers that carry a sandbox's traffic token.
const TRAFFIC_HEADERS: [&str; 2] = ["x-traffic-token", "e2b-traffic-access-token"];

/// The layer in front of every route.
pub async fn route(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    let Some(domain) = shared.config.sandbox_domain.as_ref() else {
        return next.run(req).await;
    };
    let host = req
        .headers()
        .get(header::HOST)
        .and_then(|v| v.to_str().ok())
        .or_else(|| req.uri().host())
        .unwrap_or("");
    let Some((port, owner)) = domain.parse_host(host) else {
        if domain.covers(host) {
            // A name under the domain is a sandbox's or nothing: cordon's
            // own pages never run among the previews' origins.
            return text(StatusCode::NOT_FOUND, "no sandbox's port has this name");
        }
        return next.run(req).await;
    };
    if let Owner::Sandbox(id) = &owner {
        let shown = crate::e2b::e2b_id(id);
        let Some(b) = shared.boxes.by_id(id) else {
            return crate::e2b::not_running(&shown);
        };
        if port == ENVD_PORT {
            return envd(req, next, &shown).await;
        }
        if !shared.config.previews {
            return off();
        }
        if b.public || traffic(&b, req.headers()) || tenants(&shared, &b, req.headers()).await {
            // Let in, it may wake it; nothing unauthorized ever does.
            if !crate::sandbox_api::awake(&shared, &b).await {
                // Nothing answers in a paused sandbox until it is resumed.
                return crate::e2b::not_running(&shown);
            }
            return direct(&b, port, req).await;
        }
        if !cordons(&req) {
            // E2B's answer to a private sandbox's port without its token.
            let body = serde_json::json!({
                "code": 403,
                "message": format!("sandbox {shown} is private: send its traffic access token"),
            });
            return (StatusCode::FORBIDDEN, axum::Json(body)).into_response();
        }
    } else if !shared.config.previews {
        return off();
    }
    gated(&shared, &owner, port, req).await
}

/// A port by name is a preview: an operator who turned previews off
/// turned these off too.
fn off() -> Response {
    let body = serde_json::json!({
        "code": 403,
        "message": "this server serves no sandbox's ports (cordon serve --no-previews)",
    });
    (StatusCode::FORBIDDEN, axum::Json(body)).into_response()
}

/// Whether `req` carries a credential of cordon's own: a token, a
/// preview's cookie or its link.
fn cordons(req: &Request) -> bool {
    let h = req.headers();
    h.contains_key(header::AUTHORIZATION)
        || h.get_all(header::COOKIE)
            .iter()
            .any(|c| c.as_bytes().windows(11).any(|w| w == b"cordon_lab="))
        || req
            .uri()
            .query()
            .is_some_and(|q| q.contains(cordon_lab::site::LINK_PARAM))
}

/// Whether `headers` carry a bearer token of `b`'s tenant.
async fn tenants(shared: &Shared, b: &LiveBox, headers: &HeaderMap) -> bool {
    let Some(token) = crate::http::bearer(headers) else {
        return false;
    };
    matches!(shared.store.caller(token).await, Ok(Some(c)) if c.tenant == b.tenant)
}

/// Whether `headers` carry `b`'s traffic token.
fn traffic(b: &LiveBox, headers: &HeaderMap) -> bool {
    TRAFFIC_HEADERS
        .iter()
        .filter_map(|h| headers.get(*h))
        .any(|v| crate::e2b::same(v.as_bytes(), b.traffic_token.as_bytes()))
}

/// A public sandbox's port, or one its traffic token opens: straight on.
async fn direct(b: &LiveBox, port: u16, mut req: Request) -> Response {
    let upstream = {
        let mut ups = b.upstreams.lock().unwrap_or_else(|p| p.into_inner());
        ups.entry(port)
            .or_insert_with(|| Arc::new(cordon_lab::Upstream::port(b.sandbox.clone(), port)))
            .clone()
    };
    for h in TRAFFIC_HEADERS {
        req.headers_mut().remove(h);
    }
    upstream.forward(req).await
}

/// A preview's port by name, through its gate: opened already by a link
/// the API gave, or now for a program with the owner's tenant's token.
async fn gated(shared: &Arc<Shared>, owner: &Owner, port: u16, req: Request) -> Response {
    if let Some(opened) = crate::owned::ports::existing(shared, owner, port) {
        return opened.gate().handle(req).await;
    }
    let token = crate::http::bearer(req.headers()).map(str::to_string);
    let Some(token) = token else {
        // In a deployment, a job not here may run on another worker.
        let maybe = shared.sandboxes.get(owner).is_some()
            || (shared.config.cluster.is_some() && matches!(owner, Owner::Job(_)));
        if !maybe {
            return text(
                StatusCode::NOT_FOUND,
                "nothing runs at this address now: its sandbox has ended or is elsewhere",
            );
        }
        return text(
            StatusCode::UNAUTHORIZED,
            "open it from cordon (a preview's link, in the web UI or from the API) to use this preview",
        );
    };
    let tenant = match shared.store.caller(&token).await {
        Ok(Some(c)) => c.tenant,
        Ok(None) => return text(StatusCode::UNAUTHORIZED, "unknown token for this preview"),
        Err(e) => return crate::http::ApiError::from(e).into_response(),
    };
    let opened = match crate::owned::ports::whereabouts(shared, &tenant, owner).await {
        Ok(w) => crate::owned::ports::opened(shared, &tenant, owner, port, w).await,
        Err(e) => Err(e),
    };
    match opened {
        Ok(opened) => opened.gate().handle(req).await,
        Err(e) => e.into_response(),
    }
}

fn text(status: StatusCode, message: &str) -> Response {
    let mut resp = (status, format!("{message}\n")).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
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
