//! `/mcp`: cordon's sandbox tools over MCP's Streamable HTTP transport,
//! behind the API's bearer tokens. Each MCP session gets its own sandbox
//! over a fresh workspace, made on its first tool call and ended (with the
//! workspace) when the session is deleted or idles out. A session belongs
//! to the tenant that opened it: any request on it from another tenant
//! (a call, a notification, an event stream, a DELETE) is answered 404
//! here, before the transport sees it. Opening one takes a slot under the
//! live-session caps, held until the session ends.

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::{Method, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use cordon_mcp::{HttpSessions, McpTenant, SessionHold};

use crate::http::Tenant;
use crate::state::Shared;
use crate::store::random_hex;

pub(crate) fn routes(shared: &Arc<Shared>) -> Router<Arc<Shared>> {
    let dir = shared.config.data_dir.join("mcp");
    let config = shared.config.clone();
    let (service, sessions) = cordon_mcp::http_service(
        move || config.sandbox(dir.join(format!("mcp_{}", random_hex(12))), None),
        shared.config.session_idle,
        cordon_mcp::Exposure::Authenticated,
    );
    // Made once per process, with its router.
    let _ = shared.mcp_sessions.set(sessions.clone());
    Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(
            (shared.clone(), sessions),
            authenticate,
        ))
}

/// Ends the live MCP sessions `tenant` opened here, with their sandboxes
/// and workspaces; how many.
pub(crate) async fn close_tenant(shared: &Shared, tenant: &str) -> usize {
    match shared.mcp_sessions.get() {
        Some(sessions) => sessions.close_tenant(&McpTenant(tenant.into())).await,
        None => 0,
    }
}

/// The API's own authentication, then the session's owner and the caps;
/// the tenant (and a new session's slot) ride along to the transport.
async fn authenticate(
    State((shared, sessions)): State<(Arc<Shared>, Arc<HttpSessions>)>,
    request: Request,
    next: Next,
) -> Response {
    let (mut parts, body) = request.into_parts();
    let tenant = match Tenant::from_request_parts(&mut parts, &shared).await {
        Ok(Tenant(t)) => t,
        Err(e) => return e.into_response(),
    };
    // As the transport reads it: a header that is not text is no session.
    let session = parts
        .headers
        .get("mcp-session-id")
        .and_then(|v| v.to_str().ok());
    let caller = McpTenant(tenant.clone());
    match session {
        // Indistinguishable from a session that does not exist.
        Some(id) if sessions.owners().belongs_to_another(id, Some(&caller)) => {
            return (StatusCode::NOT_FOUND, "Not Found: Session not found").into_response();
        }
        Some(_) => {}
        // Opening a session (or a request served without one): a slot,
        // which the session keeps until it ends.
        None if parts.method == Method::POST => match shared.caps.acquire(&tenant) {
            Ok(slot) => {
                parts.extensions.insert(SessionHold::new(slot));
            }
            Err(e) => return e.into_response(),
        },
        None => {}
    }
    parts.extensions.insert(caller);
    next.run(Request::from_parts(parts, body)).await
}
