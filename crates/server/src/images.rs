//! `/v1/images`: the images a tenant may run jobs and sessions in (the
//! operator's catalog, see [`crate::catalog`]) and the tenant's own, which
//! it pulls, builds and snapshots here and no other tenant sees.
//!
//! A tenant's own image is a row of the database (its name, digest, size
//! and origin) and a record of the image store under a name no reference
//! can spell ([`crate::catalog::own_record`]). What it may pull is what the
//! catalog offers it from a registry; what it builds starts from what it
//! may name; what it snapshots is a sandbox of its own. Its images together
//! may take at most the operator's quota.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{delete, get, post};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::catalog::{OfferedImage, own_record};
use crate::http::{ApiError, ApiResult, Tenant, read_json};
use crate::job::ImageName;
use crate::owner::Owner;
use crate::state::Shared;
use crate::store::{ImageOrigin, OwnImage};

/// The images offered to the tenant, the default first, and its own.
#[derive(Debug, Serialize, ToSchema)]
pub struct ImageList {
    /// The operator's catalog as offered to this tenant.
    pub images: Vec<OfferedImage>,
    /// The tenant's own images, by name.
    pub own: Vec<OwnImage>,
    pub quota: Quota,
}

/// What the tenant's own images take.
#[derive(Debug, Serialize, ToSchema)]
pub struct Quota {
    /// Bytes of the tenant's images (each image's layers counted).
    pub used: u64,
    /// Bytes they may come to; absent: no limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub limit: Option<u64>,
}

/// A new image of the tenant's own: exactly one of `pull`, `session`, `job`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewImage {
    /// What jobs and sessions will name it by; an image of that name is
    /// replaced.
    pub name: ImageName,
    /// A registry reference the catalog offers this tenant, pulled now.
    #[serde(default)]
    pub pull: Option<ImageName>,
    /// A snapshot of this session's running sandbox: its root's changes on
    /// top of its image (not its workspace).
    #[serde(default)]
    pub session: Option<String>,
    /// A snapshot of this running job's sandbox, as for `session`.
    #[serde(default)]
    pub job: Option<String>,
}

/// `POST /v1/sessions/{id}/snapshot`'s body.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SnapshotRequest {
    /// What jobs and sessions will name the image by.
    pub name: ImageName,
}

#[utoipa::path(get, path = "/v1/images", tag = "images", summary = "The images jobs and sessions may name",
    description = "What a job's or session's `image` may be: the operator's catalog as offered to this tenant, the default (if any) first, with what this server's store holds of each; and the tenant's own images (pulled, built or snapshotted), which it may name by name or by digest. A name ending in `/*` stands for any image under that registry path, pulled on first use.",
    responses((status = 200, body = ImageList), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_images(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
) -> ApiResult<Json<ImageList>> {
    let own = shared.store.own_images(&tenant).await?;
    let used = own.iter().map(|i| i.size).sum();
    let images = shared.images.clone();
    // Reads the store's records: off the async runtime.
    let offered = tokio::task::spawn_blocking(move || images.list(&tenant))
        .await
        .unwrap_or_default();
    Ok(Json(ImageList {
        images: offered,
        own,
        quota: Quota {
            used,
            limit: shared.images.catalog().quota,
        },
    }))
}

#[utoipa::path(post, path = "/v1/images", tag = "images", summary = "Pull an image, or snapshot a sandbox, as one of the tenant's own",
    description = "`pull`: a registry reference the catalog offers this tenant (`GET /v1/images`), pulled now and kept under `name`. `session` or `job`: the root changes of that running sandbox of the tenant's (what its commands installed; not its workspace) as a new image on top of the one it runs in. To build one from a Dockerfile, post a job of kind `build` (`POST /v1/jobs`). The tenant's images together may take at most the operator's quota.",
    request_body(content = NewImage, example = json!({"name": "base", "pull": "registry.example:5000/team/base:1"})),
    responses((status = 201, body = OwnImage),
              (status = 400, description = "Not exactly one of pull, session and job; a bad name; a sandbox that is not on an image", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "A reference the catalog does not offer", body = crate::http::ErrorResponse),
              (status = 404, description = "No such session or job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The name is the catalog's; the sandbox is not running here", body = crate::http::ErrorResponse),
              (status = 413, description = "Past the tenant's quota", body = crate::http::ErrorResponse),
              (status = 502, description = "The pull failed", body = crate::http::ErrorResponse)))]
pub(crate) async fn create_image(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let new: NewImage = read_json(&body?)?;
    shared.images.check_own_name(&tenant, &new.name)?;
    let image = match (new.pull, new.session, new.job) {
        (Some(reference), None, None) => pull(&shared, &tenant, &new.name, &reference).await?,
        (None, Some(session), None) => {
            snapshot(&shared, &tenant, &new.name, Owner::Session(session)).await?
        }
        (None, None, Some(job)) => snapshot(&shared, &tenant, &new.name, Owner::Job(job)).await?,
        _ => {
            return Err(ApiError::bad_request(
                "give exactly one of `pull` (a reference), `session` or `job` (a running \
                 sandbox to snapshot); to build an image, post a job of kind `build`",
            ));
        }
    };
    Ok((StatusCode::CREATED, Json(image)).into_response())
}

#[utoipa::path(post, path = "/v1/sessions/{id}/snapshot", tag = "images", summary = "Save a session's sandbox as an image",
    description = "The root changes of the session's running sandbox (what the agent installed; not its workspace, which stays the session's) as a new image of the tenant's on top of the session's image, under `name`. The same as `POST /v1/images` with `session`.",
    params(("id" = String, Path)),
    request_body(content = SnapshotRequest, example = json!({"name": "after-setup"})),
    responses((status = 201, body = OwnImage),
              (status = 400, description = "A bad name, or a session on the host's root", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The name is the catalog's, or the session's sandbox is not running", body = crate::http::ErrorResponse),
              (status = 413, description = "Past the tenant's quota", body = crate::http::ErrorResponse)))]
pub(crate) async fn snapshot_session(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let req: SnapshotRequest = read_json(&body?)?;
    shared.images.check_own_name(&tenant, &req.name)?;
    let image = snapshot(&shared, &tenant, &req.name, Owner::Session(id)).await?;
    Ok((StatusCode::CREATED, Json(image)).into_response())
}

#[utoipa::path(delete, path = "/v1/images/{name}", tag = "images", summary = "Delete one of the tenant's images",
    description = "Forgets the image; jobs and sessions running in it go on, and its layers are removed once nothing uses them and the operator's grace period has passed. The catalog's images are the operator's and cannot be deleted here.",
    params(("name" = String, Path, description = "The image's name (it may contain `/` and `:`)")),
    responses((status = 204, description = "Deleted"),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such image of the tenant's", body = crate::http::ErrorResponse)))]
pub(crate) async fn delete_image(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(name): Path<String>,
) -> ApiResult<StatusCode> {
    if !shared.store.delete_own_image(&tenant, &name).await? {
        return Err(ApiError::not_found("such image of yours"));
    }
    // This process's record goes now; other processes' at their next
    // collection (see `crate::catalog::collect`).
    if let Ok(store) = shared.images.store() {
        let (store, record) = (store.clone(), own_record(&tenant, &name));
        let _ = tokio::task::spawn_blocking(move || store.remove(&record)).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

async fn pull(
    shared: &Shared,
    tenant: &str,
    name: &ImageName,
    reference: &ImageName,
) -> ApiResult<OwnImage> {
    let source = shared.images.pullable(tenant, reference.as_str())?;
    let store = shared.images.store()?.clone();
    let shown = cordon_tools::printable(reference.as_str()).to_string();
    let pulled = cordon_image::obtain::obtain(
        &store,
        &source,
        &cordon_image::auth::Sources::from_env(),
        &|_| {},
    )
    .await
    .map_err(|e| {
        ApiError::new(
            StatusCode::BAD_GATEWAY,
            "pull_failed",
            format!("pulling {shown}: {e}"),
        )
    })?;
    let record = crate::catalog::pending_record(tenant, name);
    let manifest = pulled.manifest;
    let image = tokio::task::spawn_blocking(move || store.import_blobs(&manifest, &record))
        .await
        .map_err(ApiError::internal)?
        .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, "pull_failed", e.to_string()))?;
    shared
        .images
        .keep(
            &shared.store,
            tenant,
            name,
            image,
            ImageOrigin::Pulled(source),
        )
        .await
}

async fn snapshot(
    shared: &Shared,
    tenant: &str,
    name: &ImageName,
    owner: Owner,
) -> ApiResult<OwnImage> {
    let what = owner.noun();
    crate::owned::find(shared, tenant, &owner).await?;
    let sandbox = shared.sandboxes.get(&owner).ok_or_else(|| {
        ApiError::new(
            StatusCode::CONFLICT,
            "not_running",
            format!(
                "the {what}'s sandbox is not running in this process (a session's closes after \
                 it idles, taking its root's changes; send it a message and snapshot it then)"
            ),
        )
    })?;
    let (Some(dir), Some(upper)) = (sandbox.writable_layer_dir(), sandbox.writable_upper()) else {
        return Err(ApiError::bad_request(format!(
            "the {what} runs on the host's root or in a microVM, which have nothing to \
             snapshot: run it natively in an image"
        )));
    };
    let store = shared.images.store()?.clone();
    let record = crate::catalog::pending_record(tenant, name);
    let image = tokio::task::spawn_blocking(move || {
        cordon_build::commit::commit_upper(&store, &dir, &upper, &record)
    })
    .await
    .map_err(ApiError::internal)?
    .map_err(|e| ApiError::bad_request(format!("cannot snapshot the {what}: {e}")))?;
    let origin = ImageOrigin::Snapshot(owner.id().to_string());
    shared
        .images
        .keep(&shared.store, tenant, name, image, origin)
        .await
}

pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/images", get(list_images).post(create_image))
        .route("/v1/images/{*name}", delete(delete_image))
        .route("/v1/sessions/{id}/snapshot", post(snapshot_session))
}
