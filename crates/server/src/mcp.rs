//! `/mcp`: cordon's sandbox tools over MCP's Streamable HTTP transport,
//! behind the API's bearer tokens. Each MCP session gets its own sandbox
//! over a fresh workspace, made on its first tool call and ended (with the
//! workspace) when the session is deleted or idles out; a session belongs
//! to the tenant that opened it.

use std::sync::Arc;

use axum::Router;
use axum::extract::{FromRequestParts, Request, State};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use cordon_mcp::McpTenant;

use crate::api::Tenant;
use crate::server::Shared;
use crate::store::random_hex;

pub(crate) fn routes(shared: &Arc<Shared>) -> Router<Arc<Shared>> {
    let dir = shared.config.data_dir.join("mcp");
    let config = shared.config.clone();
    let service = cordon_mcp::http_service(
        move || config.sandbox(dir.join(format!("mcp_{}", random_hex(12)))),
        shared.config.session_idle,
        cordon_mcp::Exposure::Authenticated,
    );
    Router::new()
        .nest_service("/mcp", service)
        .layer(middleware::from_fn_with_state(shared.clone(), authenticate))
}

/// The API's own authentication; the tenant rides along to the handler.
async fn authenticate(State(shared): State<Arc<Shared>>, request: Request, next: Next) -> Response {
    let (mut parts, body) = request.into_parts();
    match Tenant::from_request_parts(&mut parts, &shared).await {
        Ok(Tenant(t)) => {
            parts.extensions.insert(McpTenant(t));
            next.run(Request::from_parts(parts, body)).await
        }
        Err(e) => e.into_response(),
    }
}
