//! `/v1/git-credentials`: a tenant's logins for git hosts, which the
//! workers use to clone a job's `repo`, push its branch and open its pull
//! request. A login is written and removed here, never read back: lists
//! show the host, the user name and the forge, not the secret.

use std::sync::Arc;

use axum::Json;
use axum::Router;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::routing::get;
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::{ApiError, ApiResult, Tenant, Timestamp, read_json};
use crate::state::Shared;
use crate::store::{ForgeApi, GitCredential, GitSecret};

/// The user name a login has unless it names one: GitHub takes any with a
/// token as the password, and so do Gitea and Forgejo.
const DEFAULT_USERNAME: &str = "x-access-token";

/// A printable, one-line value of at most `max` bytes: what goes to git's
/// credential protocol (line based) and to a forge's header.
fn one_line(s: &str, what: &str, max: usize) -> Result<(), String> {
    if s.trim().is_empty() {
        return Err(format!("{what} must not be empty"));
    }
    if s.len() > max || s.chars().any(|c| c.is_control()) {
        return Err(format!(
            "{what} is one line of printable characters, at most {max} bytes"
        ));
    }
    Ok(())
}

/// A secret: printable ASCII, no spaces, at most 4 KiB.
#[derive(Clone, Deserialize)]
#[serde(try_from = "String")]
pub struct Secret(String);

impl TryFrom<String> for Secret {
    type Error = String;
    fn try_from(s: String) -> Result<Secret, String> {
        if s.is_empty() || s.len() > 4096 || !s.bytes().all(|b| b.is_ascii_graphic()) {
            return Err("a token is 1 to 4096 printable ASCII characters, no spaces".into());
        }
        Ok(Secret(s))
    }
}

impl utoipa::PartialSchema for Secret {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .schema_type(utoipa::openapi::schema::Type::String)
            .min_length(Some(1))
            .max_length(Some(4096))
            .description(Some(
                "The password or access token; write-only: never shown again.",
            ))
            .into()
    }
}
impl ToSchema for Secret {}

/// Who the job's commits are by.
#[derive(Debug, Clone, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct Author {
    #[schema(example = "Acme Bot")]
    pub name: String,
    #[schema(example = "bot@acme.example")]
    pub email: String,
}

/// A login to store for a host.
#[derive(Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewCredential {
    /// Default `x-access-token`, which GitHub, Gitea and Forgejo accept
    /// with a token as the password.
    #[serde(default)]
    pub username: Option<String>,
    pub token: Secret,
    /// The forge's API, for pull requests: `github` (the default for
    /// github.com) or `gitea` (Gitea and Forgejo; the default elsewhere).
    #[serde(default)]
    pub forge: Option<ForgeApi>,
    /// The API's base URL when it is not the usual one
    /// (`https://api.github.com`, or `https://HOST/api/v1`).
    #[serde(default)]
    #[schema(example = "https://git.acme.example/api/v1")]
    pub forge_api: Option<String>,
    /// Who the commits are by; default `cordon <cordon@localhost>`.
    #[serde(default)]
    pub author: Option<Author>,
}

/// A stored login, without its secret.
#[derive(Debug, Serialize, ToSchema)]
pub struct CredentialView {
    /// `host` or `host:port`, as repository URLs name it.
    #[schema(example = "github.com")]
    pub host: String,
    pub username: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forge: Option<ForgeApi>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub forge_api: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub author: Option<Author>,
    pub updated_at: Timestamp,
}

impl From<GitCredential> for CredentialView {
    fn from(c: GitCredential) -> CredentialView {
        let author = match (c.author_name, c.author_email) {
            (Some(name), Some(email)) => Some(Author { name, email }),
            _ => None,
        };
        CredentialView {
            host: c.host,
            username: c.username,
            forge: c.forge,
            forge_api: c.forge_api,
            author,
            updated_at: Timestamp::at(c.updated_ms),
        }
    }
}

#[derive(Debug, Serialize, ToSchema)]
pub struct CredentialList {
    pub credentials: Vec<CredentialView>,
}

/// `host` or `host:port` as a URL's authority has it, lower-cased: the key
/// a login is filed under.
fn host_key(host: &str) -> ApiResult<String> {
    cordon_git::Endpoint::of_url(&format!("https://{host}/"))
        .filter(|e| {
            let k = e.key();
            k.eq_ignore_ascii_case(host)
        })
        .map(|e| e.key())
        .ok_or_else(|| {
            ApiError::bad_request(format!(
                "{}: a host is a name or an address, with :PORT if the repository URLs name one \
                 (github.com, git.acme.example:3000, [2001:db8::1]:3000)",
                cordon_tools::printable(host)
            ))
        })
}

pub(crate) fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/git-credentials", get(list_credentials))
        .route(
            "/v1/git-credentials/{host}",
            axum::routing::put(put_credential).delete(delete_credential),
        )
}

#[utoipa::path(get, path = "/v1/git-credentials", tag = "git", summary = "List your git logins",
    description = "The tenant's logins by host, without their secrets.",
    responses((status = 200, body = CredentialList),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_credentials(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
) -> ApiResult<Json<CredentialList>> {
    let rows = shared.store.git_credentials(&tenant).await?;
    Ok(Json(CredentialList {
        credentials: rows.into_iter().map(CredentialView::from).collect(),
    }))
}

#[utoipa::path(put, path = "/v1/git-credentials/{host}", tag = "git", summary = "Store a git login",
    description = "The login a worker clones, pushes and opens pull requests with for the tenant's jobs whose `repo` is on this host; it replaces the one there was. The token never reaches a sandbox, a job's record or an answer.",
    params(("host" = String, Path, description = "`host` or `host:port`, as the repository URLs name it")),
    request_body(content = NewCredential, examples(
        ("github" = (value = json!({"token": "github_pat_..."}))),
        ("gitea" = (value = json!({"username": "bot", "token": "...", "forge": "gitea",
            "author": {"name": "Acme Bot", "email": "bot@acme.example"}}))))),
    responses((status = 200, body = CredentialView),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse)))]
pub(crate) async fn put_credential(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(host): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<CredentialView>> {
    let host = host_key(&host)?;
    let body = body.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let asked: NewCredential = read_json(&body)?;
    let username = asked
        .username
        .unwrap_or_else(|| DEFAULT_USERNAME.to_string());
    one_line(&username, "`username`", 256).map_err(ApiError::bad_request)?;
    if let Some(api) = &asked.forge_api
        && cordon_git::Endpoint::of_url(api).is_none()
    {
        return Err(ApiError::bad_request(format!(
            "`forge_api`: {}: an https:// or http:// URL",
            cordon_tools::printable(api)
        )));
    }
    if let Some(a) = &asked.author {
        one_line(&a.name, "`author.name`", 256).map_err(ApiError::bad_request)?;
        one_line(&a.email, "`author.email`", 256).map_err(ApiError::bad_request)?;
        if a.name.contains(['<', '>']) || a.email.contains(['<', '>']) {
            return Err(ApiError::bad_request(
                "`author`: a name and an e-mail address hold no < or >",
            ));
        }
    }
    let c = GitCredential {
        host,
        username,
        forge: asked.forge,
        forge_api: asked.forge_api,
        author_name: asked.author.as_ref().map(|a| a.name.clone()),
        author_email: asked.author.as_ref().map(|a| a.email.clone()),
        updated_ms: 0,
    };
    shared
        .store
        .put_git_credential(&tenant, &c, &GitSecret(asked.token.0))
        .await?;
    tracing::info!(tenant = %tenant, host = %c.host, "git login stored");
    let stored = shared
        .store
        .git_credential(&tenant, &c.host)
        .await?
        .ok_or_else(|| ApiError::not_found("git login for that host"))?;
    Ok(Json(stored.into()))
}

#[utoipa::path(delete, path = "/v1/git-credentials/{host}", tag = "git", summary = "Remove a git login",
    params(("host" = String, Path, description = "`host` or `host:port`")),
    responses((status = 200, description = "The login removed", body = CredentialView),
              (status = 400, description = "Not a host", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No login for that host", body = crate::http::ErrorResponse)))]
pub(crate) async fn delete_credential(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(host): Path<String>,
) -> ApiResult<Json<CredentialView>> {
    let host = host_key(&host)?;
    let gone = shared
        .store
        .delete_git_credential(&tenant, &host)
        .await?
        .ok_or_else(|| ApiError::not_found("git login for that host"))?;
    tracing::info!(tenant = %tenant, host = %host, "git login removed");
    Ok(Json(gone.into()))
}
