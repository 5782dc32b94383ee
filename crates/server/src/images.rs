//! `GET /v1/images`: the images this tenant may run jobs and sessions
//! in, as the operator's catalog offers them (see [`crate::catalog`]).

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::extract::State;
use axum::routing::get;
use serde::Serialize;
use utoipa::ToSchema;

use crate::catalog::OfferedImage;
use crate::http::{ApiResult, Tenant};
use crate::state::Shared;

/// The images offered to the tenant, the default first.
#[derive(Debug, Serialize, ToSchema)]
pub struct ImageList {
    pub images: Vec<OfferedImage>,
}

#[utoipa::path(get, path = "/v1/images", tag = "images", summary = "The images jobs and sessions may name",
    description = "What a job's or session's `image` may be: the operator's catalog as offered to this tenant, the default (if any) first, with what this server's store holds of each. A name ending in `/*` stands for any image under that registry path, pulled on first use.",
    responses((status = 200, body = ImageList), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_images(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
) -> ApiResult<Json<ImageList>> {
    let images = shared.images.clone();
    // Reads the store's records: off the async runtime.
    let images = tokio::task::spawn_blocking(move || images.list(&tenant))
        .await
        .unwrap_or_default();
    Ok(Json(ImageList { images }))
}

pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new().route("/v1/images", get(list_images))
}
