//! HTTP plumbing every resource shares: the error answer, the tenant a
//! bearer token names, typed request bodies, ids and times. It knows the
//! store (to look tokens up) and nothing above it.

use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};

use axum::Json;
use axum::body::Bytes;
use axum::extract::FromRequestParts;
use axum::extract::rejection::BytesRejection;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header, request::Parts};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;
use sha2::{Digest, Sha256};
use utoipa::openapi::schema::{KnownFormat, ObjectBuilder, SchemaFormat, Type};
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use crate::store::{Caller, Role, Store, StoreError};

/// An error answered as `{"error": {"code", "message"}}`.
#[derive(Debug)]
pub struct ApiError {
    status: StatusCode,
    code: &'static str,
    message: String,
    /// Sent as `Retry-After` (seconds): a refused client's hint when to
    /// try again.
    retry_after: Option<std::time::Duration>,
}

impl ApiError {
    pub fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            code,
            message: message.into(),
            retry_after: None,
        }
    }

    pub fn retry_after(mut self, after: std::time::Duration) -> Self {
        self.retry_after = Some(after);
        self
    }

    pub(crate) fn bad_request(message: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, "invalid_request", message)
    }

    /// A fault of the server's own (its store, its disk): 500.
    pub(crate) fn internal(e: impl std::fmt::Display) -> Self {
        Self::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
    }

    pub(crate) fn not_found(what: &str) -> Self {
        Self::new(StatusCode::NOT_FOUND, "not_found", format!("no {what}"))
    }

    pub fn status(&self) -> StatusCode {
        self.status
    }

    /// What is wrong, for a person.
    pub fn message(&self) -> &str {
        &self.message
    }
}

/// Every error answer.
#[derive(Serialize, ToSchema)]
pub struct ErrorResponse {
    pub error: ErrorBody,
}

#[derive(Serialize, ToSchema)]
pub struct ErrorBody {
    /// A stable, machine-readable code such as `invalid_request`.
    #[schema(example = "invalid_request")]
    pub code: &'static str,
    /// What is wrong, for a person.
    pub message: String,
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = ErrorResponse {
            error: ErrorBody {
                code: self.code,
                message: self.message,
            },
        };
        let mut r = (self.status, Json(body)).into_response();
        if self.status == StatusCode::UNAUTHORIZED {
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        if let Some(after) = self.retry_after {
            // Whole seconds, at least one: RFC 9110's delay-seconds.
            let secs = after.as_secs_f64().ceil().max(1.0) as u64;
            r.headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from(secs));
        }
        r
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        if let StoreError::Refused(m) = e {
            return ApiError::bad_request(m);
        }
        tracing::error!("store: {e}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the job store is unavailable; try again",
        )
    }
}

impl From<BytesRejection> for ApiError {
    fn from(e: BytesRejection) -> Self {
        let status = e.status();
        if status == StatusCode::PAYLOAD_TOO_LARGE {
            ApiError::new(
                status,
                "too_large",
                "the request body is larger than this server accepts",
            )
        } else {
            ApiError::new(status, "invalid_request", e.body_text())
        }
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// A request's body, or why not, saying the limit `limit` it was read
/// under when it is too large.
pub(crate) fn within(body: Result<Bytes, BytesRejection>, limit: usize) -> ApiResult<Bytes> {
    body.map_err(|e| {
        if e.status() == StatusCode::PAYLOAD_TOO_LARGE {
            let shown = if limit.is_multiple_of(1 << 20) {
                format!("{} MiB", limit >> 20)
            } else if limit.is_multiple_of(1 << 10) {
                format!("{} KiB", limit >> 10)
            } else {
                format!("{limit} bytes")
            };
            ApiError::new(
                e.status(),
                "too_large",
                format!("the request body is larger than the {shown} this server accepts here"),
            )
        } else {
            e.into()
        }
    })
}

/// The tenant a request's bearer token belongs to.
pub struct Tenant(pub String);

/// A request whose token is the operator's: the token's own tenant.
pub struct Operator(pub String);

/// The tenant of a request another process of the deployment relayed and
/// signed: set only by a worker's listener once the signature checks
/// (the relay module), never from anything a request carries.
#[derive(Clone)]
pub(crate) struct Relayed(pub String);

/// The token of `Authorization: Bearer <token>`, trimmed.
pub(crate) fn bearer(headers: &HeaderMap) -> Option<&str> {
    headers
        .get(header::AUTHORIZATION)?
        .to_str()
        .ok()?
        .strip_prefix("Bearer ")
        .map(str::trim)
}

/// A pause or resume a sandbox refused: 501 where this host cannot
/// freeze one (no freezer cgroup), else what `other` says.
pub(crate) fn pause_refused(
    e: cordon_sandbox::Error,
    other: impl FnOnce(cordon_sandbox::Error) -> ApiError,
) -> ApiError {
    match e {
        cordon_sandbox::Error::Io(io) if io.kind() == std::io::ErrorKind::Unsupported => {
            ApiError::new(StatusCode::NOT_IMPLEMENTED, "cannot_pause", io.to_string())
        }
        e => other(e),
    }
}

/// Whom the request's bearer token speaks for.
async fn caller(parts: &Parts, store: &Store) -> ApiResult<Caller> {
    let unauthorized = |m: &str| ApiError::new(StatusCode::UNAUTHORIZED, "unauthorized", m);
    let token = match parts.headers.get(header::AUTHORIZATION) {
        Some(value) => value
            .to_str()
            .ok()
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::trim)
            .filter(|t| !t.is_empty())
            .ok_or_else(|| unauthorized("the Authorization header must be `Bearer <token>`"))?,
        // A browser cannot set headers on a WebSocket, only the
        // subprotocols it offers: the token may come as one of those.
        None => websocket_token(&parts.headers).ok_or_else(|| {
            unauthorized(
                "send `Authorization: Bearer <token>` (create one with `cordon token create --tenant NAME`)",
            )
        })?,
    };
    store
        .caller(token)
        .await?
        .ok_or_else(|| unauthorized("unknown token"))
}

impl<S> FromRequestParts<Arc<S>> for Tenant
where
    S: AsRef<Store> + Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<S>) -> ApiResult<Tenant> {
        if let Some(Relayed(tenant)) = parts.extensions.get::<Relayed>() {
            return Ok(Tenant(tenant.clone()));
        }
        Ok(Tenant(caller(parts, (**state).as_ref()).await?.tenant))
    }
}

impl<S> FromRequestParts<Arc<S>> for Operator
where
    S: AsRef<Store> + Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &Arc<S>) -> ApiResult<Operator> {
        let c = caller(parts, (**state).as_ref()).await?;
        match c.role {
            Role::Operator => Ok(Operator(c.tenant)),
            Role::Tenant => Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "forbidden",
                "only an operator's token may do this (`cordon token create --tenant NAME --operator`)",
            )),
        }
    }
}

/// The subprotocol that carries a token on a WebSocket upgrade.
pub(crate) const WS_TOKEN_PROTOCOL: &str = "cordon.bearer.";

/// The token offered as a `cordon.bearer.<token>` subprotocol of a
/// WebSocket upgrade, if any.
fn websocket_token(headers: &HeaderMap) -> Option<&str> {
    let upgrade = headers.get(header::UPGRADE)?.to_str().ok()?;
    if !upgrade.eq_ignore_ascii_case("websocket") {
        return None;
    }
    headers
        .get_all(header::SEC_WEBSOCKET_PROTOCOL)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .find_map(|p| p.trim().strip_prefix(WS_TOKEN_PROTOCOL))
        .filter(|t| !t.is_empty())
}

/// A moment, as RFC 3339 in UTC with milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Timestamp(String);

impl Timestamp {
    /// From milliseconds since the epoch; none before it.
    pub fn from_ms(ms: i64) -> Option<Timestamp> {
        u64::try_from(ms).ok().map(Timestamp::since_epoch)
    }

    /// From milliseconds since the epoch; a time before it (which the
    /// store never writes) as the epoch itself.
    pub fn at(ms: i64) -> Timestamp {
        Timestamp::since_epoch(u64::try_from(ms).unwrap_or(0))
    }

    fn since_epoch(ms: u64) -> Timestamp {
        let t = UNIX_EPOCH + Duration::from_millis(ms);
        Timestamp(humantime::format_rfc3339_millis(t).to_string())
    }
}

impl PartialSchema for Timestamp {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::DateTime)))
            .examples([serde_json::Value::String("2026-11-24T09:00:00.000Z".into())])
            .into()
    }
}
impl ToSchema for Timestamp {}

/// Reads a JSON body as a `T`; a 400 names the field at fault.
pub(crate) fn read_json<T: DeserializeOwned>(body: &Bytes) -> ApiResult<T> {
    let value: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the body is not valid JSON: {e}")))?;
    if !value.is_object() {
        return Err(ApiError::bad_request(format!(
            "the body must be a JSON object, not {}",
            crate::job::type_name(&value)
        )));
    }
    crate::job::read(value).map_err(ApiError::bad_request)
}

/// Whether `id` could be one of the ids this server makes (`job_` or
/// `ses_` and hex): anything else is no such thing, answered without
/// asking the store, which may refuse the bytes (PostgreSQL refuses a NUL
/// in text, and that was a 503).
pub(crate) fn plausible_id(id: &str) -> bool {
    (1..=64).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// A file the server serves from its own binary (the web UI's, /docs'):
/// its path, type, body and strong validator, made once.
pub(crate) struct Asset {
    pub path: String,
    pub content_type: &'static str,
    pub body: &'static [u8],
    etag: HeaderValue,
}

impl Asset {
    pub fn new(path: String, content_type: &'static str, body: &'static [u8]) -> Asset {
        let digest = Sha256::digest(body);
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        Asset {
            path,
            content_type,
            body,
            etag: HeaderValue::from_str(&format!("\"{hex}\"")).expect("hex is a valid header"),
        }
    }

    /// The file under `csp`, never sniffed, framed or sent a referrer. A
    /// browser revalidates it on every load (`no-cache`), so a new binary's
    /// files are used at once; an unchanged one costs a 304 and no body.
    pub fn serve(&self, request: &HeaderMap, csp: &'static str) -> Response {
        let fresh = request
            .get(header::IF_NONE_MATCH)
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.split(',').any(|t| t.trim() == self.etag));
        let mut r = if fresh {
            StatusCode::NOT_MODIFIED.into_response()
        } else {
            (
                [(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static(self.content_type),
                )],
                self.body,
            )
                .into_response()
        };
        let h = r.headers_mut();
        h.insert(header::ETAG, self.etag.clone());
        h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        h.insert(
            header::CONTENT_SECURITY_POLICY,
            HeaderValue::from_static(csp),
        );
        h.insert(
            header::X_CONTENT_TYPE_OPTIONS,
            HeaderValue::from_static("nosniff"),
        );
        h.insert(
            header::REFERRER_POLICY,
            HeaderValue::from_static("no-referrer"),
        );
        // For browsers that predate `frame-ancestors`.
        h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
        r
    }
}
