//! `/health`: whether the server and its database answer.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use serde::Serialize;
use utoipa::ToSchema;

use crate::http::ApiResult;
use crate::state::Shared;

/// What `/health` answers.
#[derive(Serialize, ToSchema)]
pub struct Health {
    #[schema(example = "ok")]
    pub status: &'static str,
}

#[utoipa::path(get, path = "/health", tag = "server", security(()),
    responses((status = 200, description = "The server and its database answer", body = Health),
              (status = 503, description = "The database does not answer", body = crate::http::ErrorResponse)))]
pub(crate) async fn health(State(shared): State<Arc<Shared>>) -> ApiResult<Json<Health>> {
    shared.store.ping().await?;
    Ok(Json(Health { status: "ok" }))
}
