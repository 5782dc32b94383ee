//! The Connect protocol as the E2B SDKs speak it to a sandbox: JSON only
//! (no protobuf), over HTTP/1.1.
//!
//! - Unary: the request body is the bare JSON message; the answer is 200
//!   with the JSON message, or the error's HTTP status with
//!   `{"code": "<code>", "message": "…"}`.
//! - Server streaming: the request is one envelope (a flags byte, a
//!   big-endian `u32` length, the JSON); the answer is 200 and a sequence
//!   of envelopes, the last flagged [`END_STREAM`] with `{}` or
//!   `{"error": {…}}`. Errors, even before the first message, go there.
//!
//! A client's bytes are bounded by [`MAX_MESSAGE`]; compressed envelopes
//! are refused (neither SDK sends them).

use axum::body::Bytes;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The flag of the envelope that ends a stream.
pub const END_STREAM: u8 = 0x02;

/// The flag of a compressed envelope (refused).
const COMPRESSED: u8 = 0x01;

/// Largest message a client may send, in bytes: the biggest is a write of
/// stdin, which the SDKs send whole.
pub const MAX_MESSAGE: usize = 8 << 20;

/// The content type of a streaming call's envelopes.
pub const STREAM_JSON: &str = "application/connect+json";

/// A Connect error code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Code {
    InvalidArgument,
    DeadlineExceeded,
    NotFound,
    ResourceExhausted,
    FailedPrecondition,
    Unimplemented,
    Internal,
    Unavailable,
    DataLoss,
    Unauthenticated,
    AlreadyExists,
    PermissionDenied,
}

impl Code {
    pub fn as_str(self) -> &'static str {
        match self {
            Code::InvalidArgument => "invalid_argument",
            Code::DeadlineExceeded => "deadline_exceeded",
            Code::NotFound => "not_found",
            Code::ResourceExhausted => "resource_exhausted",
            Code::FailedPrecondition => "failed_precondition",
            Code::Unimplemented => "unimplemented",
            Code::Internal => "internal",
            Code::Unavailable => "unavailable",
            Code::DataLoss => "data_loss",
            Code::Unauthenticated => "unauthenticated",
            Code::AlreadyExists => "already_exists",
            Code::PermissionDenied => "permission_denied",
        }
    }

    /// The HTTP status of a unary answer with this code, as the protocol
    /// maps it.
    fn status(self) -> StatusCode {
        match self {
            Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
            Code::InvalidArgument | Code::FailedPrecondition => StatusCode::BAD_REQUEST,
            Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
            Code::NotFound => StatusCode::NOT_FOUND,
            Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
            Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
            Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
            Code::Unauthenticated => StatusCode::UNAUTHORIZED,
            Code::AlreadyExists => StatusCode::CONFLICT,
            Code::PermissionDenied => StatusCode::FORBIDDEN,
        }
    }
}

/// An RPC's failure: a code and a message for a person.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: Code,
    pub message: String,
}

impl RpcError {
    pub fn new(code: Code, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid(message: impl Into<String>) -> RpcError {
        RpcError::new(Code::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> RpcError {
        RpcError::new(Code::NotFound, message)
    }

    fn body(&self) -> serde_json::Value {
        serde_json::json!({ "code": self.code.as_str(), "message": self.message })
    }
}

/// A unary call's error answer.
impl IntoResponse for RpcError {
    fn into_response(self) -> Response {
        (
            self.code.status(),
            [(header::CONTENT_TYPE, "application/json")],
            self.body().to_string(),
        )
            .into_response()
    }
}

/// A unary call's answer.
pub fn unary<T: Serialize>(result: Result<T, RpcError>) -> Response {
    match result {
        Ok(message) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/json")],
            serde_json::to_vec(&message).unwrap_or_else(|_| b"{}".to_vec()),
        )
            .into_response(),
        Err(e) => e.into_response(),
    }
}

/// A unary call's request: JSON, within [`MAX_MESSAGE`].
pub fn request<T: DeserializeOwned>(headers: &HeaderMap, body: &[u8]) -> Result<T, RpcError> {
    let kind = content_type(headers);
    if !kind.is_empty() && kind != "application/json" {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!("this server speaks JSON only, not {kind}"),
        ));
    }
    parse(body)
}

/// A streaming call's request: one envelope.
pub fn stream_request<T: DeserializeOwned>(
    headers: &HeaderMap,
    body: &[u8],
) -> Result<T, RpcError> {
    let kind = content_type(headers);
    if kind != STREAM_JSON {
        return Err(RpcError::new(
            Code::Unimplemented,
            format!("a streaming call takes {STREAM_JSON}, not {kind}"),
        ));
    }
    let Some((&flags, rest)) = body.split_first() else {
        return Err(RpcError::invalid("the request has no envelope"));
    };
    if flags & COMPRESSED != 0 {
        return Err(RpcError::new(
            Code::Unimplemented,
            "compressed messages are not accepted",
        ));
    }
    let len = rest
        .get(..4)
        .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]) as usize)
        .ok_or_else(|| RpcError::invalid("the request's envelope is cut short"))?;
    let message = rest
        .get(4..)
        .filter(|m| m.len() == len)
        .ok_or_else(|| RpcError::invalid("the request's envelope does not hold one message"))?;
    parse(message)
}

fn content_type(headers: &HeaderMap) -> &str {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.split(';').next().unwrap_or("").trim())
        .unwrap_or("")
}

fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, RpcError> {
    if body.len() > MAX_MESSAGE {
        return Err(RpcError::new(
            Code::ResourceExhausted,
            format!("a message is at most {MAX_MESSAGE} bytes"),
        ));
    }
    // An empty body is the empty message.
    let body = if body.is_empty() {
        b"{}" as &[u8]
    } else {
        body
    };
    serde_json::from_slice(body).map_err(|e| RpcError::invalid(format!("the message: {e}")))
}

/// One message of a stream, enveloped.
pub fn envelope<T: Serialize>(message: &T) -> Bytes {
    frame(
        0,
        &serde_json::to_vec(message).unwrap_or_else(|_| b"{}".to_vec()),
    )
}

/// The envelope that ends a stream, with its error if it failed.
pub fn end_stream(error: Option<&RpcError>) -> Bytes {
    let body = match error {
        None => serde_json::json!({}),
        Some(e) => serde_json::json!({ "error": e.body() }),
    };
    frame(END_STREAM, body.to_string().as_bytes())
}

fn frame(flags: u8, json: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + json.len());
    out.push(flags);
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend_from_slice(json);
    out.into()
}

/// A streaming call's answer: 200, and `body`'s envelopes. A body that
/// yields an error is cut off, which a client reads as the connection
/// lost (what it must see when the sandbox is gone).
pub fn stream_response<S>(body: S) -> Response
where
    S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    (
        StatusCode::OK,
        [(header::CONTENT_TYPE, STREAM_JSON)],
        axum::body::Body::from_stream(body),
    )
        .into_response()
}

/// A stream that failed before its first message.
pub fn stream_error(e: RpcError) -> Response {
    let end = end_stream(Some(&e));
    stream_response(futures_util::stream::iter([Ok(end)]))
}

/// The deadline a client set (`Connect-Timeout-Ms`); none for 0 or a
/// value that is no number.
pub fn deadline(headers: &HeaderMap) -> Option<std::time::Duration> {
    headers
        .get("connect-timeout-ms")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .filter(|&ms| ms > 0)
        .map(std::time::Duration::from_millis)
}

/// How often a stream with nothing to say sends a keepalive
/// (`Keepalive-Ping-Interval`, seconds; 90 by default, 1 at least).
pub fn keepalive(headers: &HeaderMap) -> std::time::Duration {
    let secs = headers
        .get("keepalive-ping-interval")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok())
        .unwrap_or(90);
    std::time::Duration::from_secs(secs.clamp(1, 3600))
}

/// Bytes in a message (proto3 JSON's `bytes`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Base64(pub Vec<u8>);

impl Serialize for Base64 {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        b64::serialize(&self.0, s)
    }
}

impl<'de> serde::Deserialize<'de> for Base64 {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Base64, D::Error> {
        b64::deserialize(d).map(Base64)
    }
}

/// Bytes as proto3's JSON writes them: standard base64 with padding.
pub mod b64 {
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, URL_SAFE};
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(bytes: &[u8], s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&STANDARD.encode(bytes))
    }

    /// Either alphabet, padded or not, as protojson reads them.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
        let text = String::deserialize(d)?;
        let trimmed = text.trim_end_matches('=');
        let engine = if trimmed.contains(['-', '_']) {
            URL_SAFE
        } else {
            STANDARD
        };
        let padded = format!("{trimmed}{}", "=".repeat((4 - trimmed.len() % 4) % 4));
        engine
            .decode(padded)
            .map_err(|e| serde::de::Error::custom(format!("bytes: {e}")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(kind: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, kind.parse().unwrap());
        h
    }

    #[test]
    fn envelopes_are_byte_exact() {
        assert_eq!(
            &envelope(&serde_json::json!({"a": 1}))[..],
            b"\x00\x00\x00\x00\x07{\"a\":1}"
        );
        assert_eq!(&end_stream(None)[..], b"\x02\x00\x00\x00\x02{}");
        let e = RpcError::not_found("no");
        assert_eq!(
            &end_stream(Some(&e))[..],
            b"\x02\x00\x00\x00\x2d{\"error\":{\"code\":\"not_found\",\"message\":\"no\"}}"
        );
    }

    #[test]
    fn a_stream_request_is_one_whole_envelope() {
        let h = headers("application/connect+json");
        let ok = b"\x00\x00\x00\x00\x07{\"a\":1}";
        let v: serde_json::Value = stream_request(&h, ok).unwrap();
        assert_eq!(v["a"], 1);
        for bad in [
            &b""[..],
            b"\x00\x00\x00",
            b"\x00\x00\x00\x00\x08{\"a\":1}",
            b"\x00\x00\x00\x00\x06{\"a\":1}",
            b"\x01\x00\x00\x00\x07{\"a\":1}",
        ] {
            assert!(
                stream_request::<serde_json::Value>(&h, bad).is_err(),
                "{bad:?}"
            );
        }
        assert_eq!(
            stream_request::<serde_json::Value>(&headers("application/json"), ok)
                .unwrap_err()
                .code,
            Code::Unimplemented
        );
    }

    #[test]
    fn unary_errors_carry_the_protocols_status() {
        let r = RpcError::new(Code::NotFound, "x").into_response();
        assert_eq!(r.status(), StatusCode::NOT_FOUND);
        let r = RpcError::new(Code::DeadlineExceeded, "x").into_response();
        assert_eq!(r.status(), StatusCode::GATEWAY_TIMEOUT);
        let empty: serde_json::Value = request(&headers("application/json"), b"").unwrap();
        assert_eq!(empty, serde_json::json!({}));
        assert!(request::<serde_json::Value>(&headers("application/proto"), b"").is_err());
    }

    #[test]
    fn bytes_read_in_either_alphabet() {
        #[derive(serde::Deserialize)]
        struct B {
            #[serde(with = "b64")]
            b: Vec<u8>,
        }
        let read = |s: &str| serde_json::from_str::<B>(s).map(|b| b.b);
        assert_eq!(read(r#"{"b":"aGk="}"#).unwrap(), b"hi");
        assert_eq!(read(r#"{"b":"aGk"}"#).unwrap(), b"hi");
        assert_eq!(read(r#"{"b":"-_8="}"#).unwrap(), vec![0xfb, 0xff]);
        assert_eq!(read(r#"{"b":""}"#).unwrap(), b"");
        assert!(read(r#"{"b":"!!"}"#).is_err());
    }
}
