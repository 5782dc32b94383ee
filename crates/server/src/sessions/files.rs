//! An API session's files: the files API over its workspace.

use super::*;

/// A session's workspace, for the files API.
async fn workspace(
    shared: &Shared,
    tenant: &str,
    id: &str,
) -> Result<cordon_tools::Workspace, ApiError> {
    find(shared, tenant, id).await?;
    shared
        .config
        .sandboxes()
        .open_workspace(dir(shared, id).join("workspace"))
        .await
        .map_err(crate::files::error)
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files", tag = "sessions", summary = "The session's workspace's top directory",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::files::Listing), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_files(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<crate::files::Listing>, ApiError> {
    let ws = workspace(&shared, &tenant, &id).await?;
    Ok(Json(crate::files::list(&ws, ".")?))
}

#[utoipa::path(get, path = "/v1/sessions/{id}/files/{path}", tag = "sessions", summary = "A session's workspace file's bytes, or a directory's listing",
    params(("id" = String, Path), ("path" = String, Path, description = "Relative to the workspace; `..`, absolute paths and symlinks out are refused")),
    responses((status = 200, response = crate::files::FileAnswer),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session or file", body = crate::http::ErrorResponse),
              (status = 413, description = "Larger than the files API serves", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_file(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, path)): Path<(String, String)>,
) -> Result<Response, ApiError> {
    let ws = workspace(&shared, &tenant, &id).await?;
    crate::files::read(&ws, &path, shared.config.file_limit)
}

#[utoipa::path(put, path = "/v1/sessions/{id}/files/{path}", tag = "sessions", summary = "Write a file in a session's workspace (parents are created)",
    params(("id" = String, Path), ("path" = String, Path)),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", example = json!("print('hello')\n")),
    responses((status = 201, description = "Created", body = crate::files::Written), (status = 200, description = "Replaced", body = crate::files::Written),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse), (status = 413, description = "Too large", body = crate::http::ErrorResponse)))]
pub(crate) async fn put_file(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path((id, path)): Path<(String, String)>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = crate::http::within(body, shared.config.file_limit)?;
    let ws = workspace(&shared, &tenant, &id).await?;
    crate::files::write(ws, path, body).await
}
