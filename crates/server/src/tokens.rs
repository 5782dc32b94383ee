//! `/v1/tokens`: the operator's view of every tenant's bearer tokens, as
//! `cordon token create|list|revoke` is on the server's own machine. Only
//! a token made with the operator role may use these routes; a new token
//! is shown once, in the answer that makes it, and only its hash is kept.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{delete, get};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::{ApiError, ApiResult, Operator, Timestamp, read_json};
use crate::state::Shared;
use crate::store::{NewToken, Role, TokenRow, check_tenant};

/// A tenant's name: 1 to 64 letters, digits, `-`, `_` or `.`.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(try_from = "String")]
#[schema(value_type = String, pattern = "^[A-Za-z0-9._-]{1,64}$", example = "team-a")]
pub struct TenantName(String);

impl TryFrom<String> for TenantName {
    type Error = String;
    fn try_from(s: String) -> Result<Self, String> {
        check_tenant(&s)?;
        Ok(TenantName(s))
    }
}

/// A token to make.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewTokenRequest {
    pub tenant: TenantName,
    /// `tenant` (the default) or `operator`.
    #[serde(default)]
    pub role: Role,
}

/// A token as lists show it: its id, never the token.
#[derive(Debug, Serialize, ToSchema)]
pub struct TokenView {
    /// The start of the token's hash; what revoking takes.
    #[schema(example = "3f9a0c12b7e4")]
    pub id: String,
    pub tenant: String,
    pub role: Role,
    pub created_at: Timestamp,
}

impl From<TokenRow> for TokenView {
    fn from(t: TokenRow) -> TokenView {
        TokenView {
            id: t.id,
            tenant: t.tenant,
            role: t.role,
            created_at: Timestamp::at(t.created_ms),
        }
    }
}

/// A token just made: the only answer that holds the token itself.
#[derive(Debug, Serialize, ToSchema)]
pub struct CreatedToken {
    /// The bearer token. It is shown this once; keep it.
    #[schema(example = "cdn_0123456789abcdef0123456789abcdef0123456789abcdef")]
    pub token: String,
    #[serde(flatten)]
    pub view: TokenView,
}

#[derive(Debug, Serialize, ToSchema)]
pub struct TokenList {
    pub tokens: Vec<TokenView>,
}

#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub struct TokenFilter {
    /// Only this tenant's tokens.
    pub tenant: Option<TenantName>,
}

pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/tokens", get(list_tokens).post(create_token))
        .route("/v1/tokens/{id}", delete(revoke_token))
}

#[utoipa::path(get, path = "/v1/tokens", tag = "tokens", summary = "List tokens (operator)",
    description = "Every tenant's tokens, oldest first, by id: the tokens themselves are never stored.",
    params(TokenFilter),
    responses((status = 200, body = TokenList),
              (status = 400, description = "A bad filter", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Not an operator's token", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_tokens(
    State(shared): State<Arc<Shared>>,
    _: Operator,
    filter: Result<Query<TokenFilter>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<TokenList>> {
    let Query(filter) = filter.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let rows = shared
        .store
        .tokens(filter.tenant.as_ref().map(|t| t.0.as_str()))
        .await?;
    Ok(Json(TokenList {
        tokens: rows.into_iter().map(TokenView::from).collect(),
    }))
}

#[utoipa::path(post, path = "/v1/tokens", tag = "tokens", summary = "Make a token (operator)",
    description = "The answer holds the token, once; only its hash is kept.",
    request_body(content = NewTokenRequest, examples(
        ("tenant" = (value = json!({"tenant": "team-a"}))),
        ("operator" = (value = json!({"tenant": "ops", "role": "operator"}))))),
    responses((status = 201, body = CreatedToken),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Not an operator's token", body = crate::http::ErrorResponse)))]
pub(crate) async fn create_token(
    State(shared): State<Arc<Shared>>,
    Operator(by): Operator,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<(StatusCode, Json<CreatedToken>)> {
    let body = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let asked: NewTokenRequest = read_json(&body)?;
    let NewToken { token, row } = shared
        .store
        .create_token(&asked.tenant.0, asked.role)
        .await?;
    tracing::info!(by = %by, tenant = %row.tenant, role = ?row.role, id = %row.id, "token created");
    Ok((
        StatusCode::CREATED,
        Json(CreatedToken {
            token,
            view: row.into(),
        }),
    ))
}

#[utoipa::path(delete, path = "/v1/tokens/{id}", tag = "tokens", summary = "Revoke a token (operator)",
    description = "By its id, or at least its first 8 hex digits; its next request is refused.",
    params(("id" = String, Path, description = "The token's id, as the list shows it")),
    responses((status = 200, description = "The token revoked", body = TokenView),
              (status = 400, description = "Not an id, or the start of several", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Not an operator's token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such token", body = crate::http::ErrorResponse)))]
pub(crate) async fn revoke_token(
    State(shared): State<Arc<Shared>>,
    Operator(by): Operator,
    Path(id): Path<String>,
) -> ApiResult<Json<TokenView>> {
    let row = shared
        .store
        .revoke_token(&id)
        .await?
        .ok_or_else(|| ApiError::not_found("token with that id"))?;
    tracing::info!(by = %by, tenant = %row.tenant, id = %row.id, "token revoked");
    Ok(Json(row.into()))
}
