//! envd's `/files`: read a file of the sandbox (`GET`), write one or many
//! (`POST`, multipart or a raw body), anywhere in its root, as a user of
//! it, relative to that user's home.
//!
//! Both run inside the sandbox as that user, with the image's own shell
//! and `cat`, so what is made is the user's and what the user may not
//! read is refused by the kernel, exactly as envd's. Bytes are carried,
//! never interpreted; the host never opens a path of the sandbox's.
//!
//! A request proves its right to the sandbox with its access token, or,
//! for a link the SDK signed (`download_url`, `upload_url`), with the
//! signature E2B defines: `v1_` and the unpadded base64 of the SHA-256 of
//! `path:operation:user:token[:expiration]`.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Json;
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Multipart, Query, Request, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use futures_util::StreamExt;
use serde::Deserialize;
use sha2::Digest;

use super::envd::{self, User};
use crate::boxes::LiveBox;
use crate::sandbox_api::resolve;
use crate::state::Shared;

/// Exit codes of the read script, for what is not a file to read.
const MISSING: i32 = 44;
const DIRECTORY: i32 = 45;

/// Bytes of a failed command's stderr kept for its error message.
const ERROR_KEPT: usize = 512;

/// `/files`'s query.
#[derive(Debug, Default, Deserialize)]
pub struct FileQuery {
    path: Option<String>,
    username: Option<String>,
    signature: Option<String>,
    signature_expiration: Option<i64>,
}

/// Why a request is refused, answered as envd does.
#[derive(Debug)]
pub enum Refusal {
    Error(StatusCode, String),
    /// The sandbox (named so) is not running.
    NotRunning(String),
}

impl IntoResponse for Refusal {
    fn into_response(self) -> Response {
        match self {
            Refusal::Error(status, message) => {
                let body = serde_json::json!({ "code": status.as_u16(), "message": message });
                (status, Json(body)).into_response()
            }
            Refusal::NotRunning(id) => envd::not_running(&id),
        }
    }
}

fn error(status: StatusCode, message: impl Into<String>) -> Refusal {
    Refusal::Error(status, message.into())
}

fn gone(id: &str) -> Refusal {
    Refusal::NotRunning(id.to_string())
}

/// The sandbox a `/files` request is for, its right to it checked: the
/// access token, or a signature of `operation` on the path.
fn admitted(
    shared: &Shared,
    headers: &HeaderMap,
    q: &FileQuery,
    operation: &str,
) -> Result<Arc<LiveBox>, Refusal> {
    let id = headers
        .get("e2b-sandbox-id")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let path = q.path.as_deref().unwrap_or("");
    let user = q.username.as_deref().unwrap_or("");
    let sign = |b: &LiveBox| {
        signature_of(
            path,
            operation,
            user,
            &b.access_token,
            q.signature_expiration,
        )
    };
    let found = if id.is_empty() {
        // A signed link carries no sandbox id (the SDKs make it on the
        // server's root): the signature names its sandbox, being made
        // with its token.
        q.signature.as_ref().and_then(|s| {
            shared
                .boxes
                .all()
                .into_iter()
                .find(|b| envd::same(s.as_bytes(), sign(b).as_bytes()))
        })
    } else {
        super::cordon_id(id).and_then(|cid| shared.boxes.by_id(&cid))
    };
    let Some(b) = found else {
        if id.is_empty() {
            return Err(error(StatusCode::UNAUTHORIZED, "invalid signature"));
        }
        return Err(gone(id));
    };
    if let Some(token) = headers.get("x-access-token") {
        if envd::same(token.as_bytes(), b.access_token.as_bytes()) {
            return Ok(b);
        }
        return Err(error(StatusCode::UNAUTHORIZED, "invalid access token"));
    }
    let Some(signature) = &q.signature else {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "send the sandbox's access token, or a signed link",
        ));
    };
    if !envd::same(signature.as_bytes(), sign(&b).as_bytes()) {
        return Err(error(StatusCode::UNAUTHORIZED, "invalid signature"));
    }
    if q.signature_expiration
        .is_some_and(|e| e < crate::store::now_ms() / 1000)
    {
        return Err(error(
            StatusCode::UNAUTHORIZED,
            "signature is already expired",
        ));
    }
    Ok(b)
}

/// E2B's signature of `operation` on `path` as `user`.
pub fn signature_of(
    path: &str,
    operation: &str,
    user: &str,
    token: &str,
    expiration: Option<i64>,
) -> String {
    let mut signed = format!("{path}:{operation}:{user}:{token}");
    if let Some(e) = expiration {
        signed.push_str(&format!(":{e}"));
    }
    let digest = sha2::Sha256::digest(signed.as_bytes());
    format!(
        "v1_{}",
        base64::engine::general_purpose::STANDARD_NO_PAD.encode(digest)
    )
}

async fn user_of(b: &LiveBox, headers: &HeaderMap, q: &FileQuery) -> Result<User, Refusal> {
    let found = match q.username.as_deref() {
        Some(name) => envd::named(b, name).await,
        None => envd::user(b, headers).await,
    };
    found.map_err(|e| error(StatusCode::UNAUTHORIZED, e))
}

/// `sh -c script sh path` as `user`, in the sandbox, started; `stdin`
/// kept open for the caller with `stream_stdin`. `what` names it in an
/// error.
async fn script_as(
    b: &LiveBox,
    user: &User,
    script: String,
    path: &str,
    stdin: bool,
    what: &str,
) -> Result<cordon_sandbox::Execution, Refusal> {
    let argv = ["/bin/sh", "-c", &script, "sh", path];
    let mut req = cordon_sandbox::ExecRequest::argv(argv).cwd("/");
    if let Some((uid, gid)) = user.ids {
        req = req.user(uid, gid).env("HOME", user.account.home.clone());
    }
    if stdin {
        req = req.stream_stdin();
    }
    match b.sandbox.exec_stream(req).await {
        Ok(e) => Ok(e),
        Err(cordon_sandbox::Error::Gone) => Err(gone(&b.id)),
        Err(e) => Err(error(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("cannot {what}: {e}"),
        )),
    }
}

/// A file system operation for a write, as `ids`: its failure refuses
/// the write of `path`.
async fn fs_for(
    b: &LiveBox,
    op: cordon_sandbox::protocol::FsOp,
    ids: Option<(u32, u32)>,
    path: &str,
) -> Result<(), Refusal> {
    match b.sandbox.fs(op, ids).await {
        Ok(Ok(_)) => Ok(()),
        Ok(Err(f)) => Err(error(
            StatusCode::BAD_REQUEST,
            format!(
                "cannot write '{}': {}",
                cordon_tools::printable(path),
                f.message
            ),
        )),
        Err(_) => Err(gone(&b.id)),
    }
}

fn printable_tail(stderr: &[u8]) -> String {
    let text = String::from_utf8_lossy(&stderr[..stderr.len().min(ERROR_KEPT)]);
    cordon_tools::printable(text.trim()).to_string()
}

/// `GET /files?path=…`: the file's bytes, streamed.
pub async fn read(
    State(shared): State<Arc<Shared>>,
    headers: HeaderMap,
    Query(q): Query<FileQuery>,
) -> Result<Response, Refusal> {
    let b = admitted(&shared, &headers, &q, "read")?;
    let user = user_of(&b, &headers, &q).await?;
    let Some(asked) = q
        .path
        .as_deref()
        .filter(|p| !p.is_empty() && !p.contains('\0'))
    else {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "`path` names the file to read",
        ));
    };
    let path = resolve(&user.account.home, asked);
    let script = format!(
        "[ -e \"$1\" ] || exit {MISSING}; [ -d \"$1\" ] && exit {DIRECTORY}; exec cat -- \"$1\""
    );
    let mut exec = script_as(&b, &user, script, &path, false, "read").await?;
    // Until the first bytes or the end, the answer may still be an error.
    let mut stderr = Vec::new();
    let first = loop {
        match exec.next().await {
            Some(Ok(cordon_sandbox::ExecEvent::Stdout(d))) if !d.is_empty() => break Some(d),
            Some(Ok(cordon_sandbox::ExecEvent::Stdout(_))) => {}
            Some(Ok(cordon_sandbox::ExecEvent::Stderr(d))) => {
                if stderr.len() < ERROR_KEPT {
                    stderr.extend_from_slice(&d);
                }
            }
            Some(Ok(cordon_sandbox::ExecEvent::Exit(r))) => match r.status {
                cordon_sandbox::ExitStatus::Code(0) => break None,
                cordon_sandbox::ExitStatus::Code(MISSING) => {
                    return Err(error(
                        StatusCode::NOT_FOUND,
                        format!("path '{}' does not exist", cordon_tools::printable(&path)),
                    ));
                }
                cordon_sandbox::ExitStatus::Code(DIRECTORY) => {
                    return Err(error(
                        StatusCode::BAD_REQUEST,
                        format!("path '{}' is a directory", cordon_tools::printable(&path)),
                    ));
                }
                _ => {
                    return Err(error(
                        StatusCode::FORBIDDEN,
                        format!(
                            "cannot read '{}': {}",
                            cordon_tools::printable(&path),
                            printable_tail(&stderr)
                        ),
                    ));
                }
            },
            Some(Err(_)) | None => return Err(gone(&b.id)),
        }
    };
    let name = path.rsplit('/').next().unwrap_or("").to_string();
    // Ended already (an empty file): nothing more to wait for.
    let ended = first.is_none();
    let head = futures_util::stream::iter(first.map(|d| Ok::<_, std::io::Error>(Bytes::from(d))));
    let tail = futures_util::stream::unfold((!ended).then_some(exec), |exec| async move {
        let mut exec = exec?;
        loop {
            match exec.next().await {
                Some(Ok(cordon_sandbox::ExecEvent::Stdout(d))) => {
                    return Some((Ok(Bytes::from(d)), Some(exec)));
                }
                Some(Ok(cordon_sandbox::ExecEvent::Stderr(_))) => {}
                Some(Ok(cordon_sandbox::ExecEvent::Exit(r))) if r.status.success() => return None,
                // A read that failed half-way is no whole file: cut it.
                _ => return Some((Err(std::io::Error::other("the read failed")), None)),
            }
        }
    });
    let body = head.chain(tail);
    let gzip = accepts_gzip(&headers);
    let body = if gzip {
        Body::from_stream(gzipped(body))
    } else {
        Body::from_stream(body)
    };
    let disposition = format!(
        "inline; filename=\"{}\"",
        name.replace(
            |c: char| !c.is_ascii_graphic() || c == '"' || c == '\\',
            "_"
        )
    );
    let mut r = (
        StatusCode::OK,
        [
            (header::CONTENT_TYPE, "application/octet-stream".to_string()),
            (header::CONTENT_DISPOSITION, disposition),
            (header::VARY, "Accept-Encoding".to_string()),
        ],
        body,
    )
        .into_response();
    if gzip {
        r.headers_mut().insert(
            header::CONTENT_ENCODING,
            header::HeaderValue::from_static("gzip"),
        );
    }
    Ok(r)
}

/// Whether the client takes a gzipped answer.
fn accepts_gzip(headers: &HeaderMap) -> bool {
    headers
        .get_all(header::ACCEPT_ENCODING)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|e| {
            let mut parts = e.split(';');
            let name = parts.next().unwrap_or("").trim();
            let refused = parts.any(|p| p.trim().replace(' ', "") == "q=0");
            name.eq_ignore_ascii_case("gzip") && !refused
        })
}

enum Encoding {
    Identity,
    Gzip,
}

fn content_encoding(headers: &HeaderMap) -> Result<Encoding, Refusal> {
    match headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(|v| v.trim().to_ascii_lowercase())
        .as_deref()
    {
        None | Some("") | Some("identity") => Ok(Encoding::Identity),
        Some("gzip") => Ok(Encoding::Gzip),
        Some(other) => Err(error(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!(
                "Content-Encoding {}: gzip or none",
                cordon_tools::printable(other)
            ),
        )),
    }
}

/// `body`, gzipped as it goes.
fn gzipped<S>(body: S) -> impl futures_util::Stream<Item = Result<Bytes, std::io::Error>>
where
    S: futures_util::Stream<Item = Result<Bytes, std::io::Error>> + Send + 'static,
{
    use std::io::Write;
    let encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
    futures_util::stream::unfold(
        (Box::pin(body), Some(encoder)),
        |(mut body, encoder)| async move {
            let mut encoder = encoder?;
            loop {
                match body.next().await {
                    Some(Ok(chunk)) => {
                        if let Err(e) = encoder.write_all(&chunk) {
                            return Some((Err(e), (body, None)));
                        }
                        let out = std::mem::take(encoder.get_mut());
                        if !out.is_empty() {
                            return Some((Ok(Bytes::from(out)), (body, Some(encoder))));
                        }
                    }
                    Some(Err(e)) => return Some((Err(e), (body, None))),
                    None => {
                        let end = encoder.finish().map(Bytes::from);
                        return Some((end, (body, None)));
                    }
                }
            }
        },
    )
}

/// Bytes of compressed input inflated at a time: what one step may
/// produce is bounded by it (deflate's ratio is at most about 1000).
const INFLATE_STEP: usize = 1024;

/// A gzipped upload, inflated as it comes, in bounded steps.
fn gunzipped<S, E>(body: S) -> impl futures_util::Stream<Item = Result<Bytes, String>> + Unpin
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin + Send + 'static,
    E: std::fmt::Display,
{
    use std::io::Write;
    let decoder = flate2::write::GzDecoder::new(Vec::new());
    let queue: std::collections::VecDeque<Bytes> = Default::default();
    Box::pin(futures_util::stream::unfold(
        (body, Some(decoder), queue),
        |(mut body, decoder, mut queue)| async move {
            let mut decoder = decoder?;
            loop {
                if let Some(mut chunk) = queue.pop_front() {
                    let step = chunk.split_to(chunk.len().min(INFLATE_STEP));
                    if !chunk.is_empty() {
                        queue.push_front(chunk);
                    }
                    if let Err(e) = decoder.write_all(&step) {
                        return Some((Err(format!("not gzip: {e}")), (body, None, queue)));
                    }
                    let out = std::mem::take(decoder.get_mut());
                    if !out.is_empty() {
                        return Some((Ok(Bytes::from(out)), (body, Some(decoder), queue)));
                    }
                    continue;
                }
                match body.next().await {
                    Some(Ok(chunk)) => queue.push_back(chunk),
                    Some(Err(e)) => return Some((Err(e.to_string()), (body, None, queue))),
                    None => {
                        return match decoder.try_finish() {
                            Ok(()) => {
                                let out = std::mem::take(decoder.get_mut());
                                (!out.is_empty())
                                    .then(|| (Ok(Bytes::from(out)), (body, None, queue)))
                            }
                            Err(e) => Some((Err(format!("not gzip: {e}")), (body, None, queue))),
                        };
                    }
                }
            }
        },
    ))
}

/// The prefix of the headers that set a written file's metadata.
const METADATA_HEADER: &str = "x-metadata-";

/// Bytes of one metadata key, and of all keys and values together, at
/// most (what extended attributes of the `user.e2b.` namespace can take).
const METADATA_KEY_MAX: usize = 246;
const METADATA_MAX: usize = 4096;

/// The metadata a write sets (`X-Metadata-<key>: <value>`), checked
/// before anything is written.
fn metadata_of(headers: &HeaderMap) -> Result<Vec<(String, String)>, Refusal> {
    let mut out = Vec::new();
    let mut total = 0;
    for (name, value) in headers {
        let Some(key) = name.as_str().strip_prefix(METADATA_HEADER) else {
            continue;
        };
        let value = value.to_str().map_err(|_| {
            error(
                StatusCode::BAD_REQUEST,
                format!("metadata {key}: the value must be printable ASCII"),
            )
        })?;
        if key.is_empty() || key.len() > METADATA_KEY_MAX {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("metadata keys are 1 to {METADATA_KEY_MAX} bytes"),
            ));
        }
        total += key.len() + value.len();
        if total > METADATA_MAX {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("metadata comes to more than {METADATA_MAX} bytes"),
            ));
        }
        out.push((key.to_string(), value.to_string()));
    }
    Ok(out)
}

/// One written file, as the answer lists it.
#[derive(Debug, serde::Serialize)]
struct Written {
    name: String,
    path: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    metadata: Option<BTreeMap<String, String>>,
}

/// Gives the file written at `w` exactly `metadata` (a write replaces
/// what it had).
async fn set_metadata(
    b: &LiveBox,
    user: &User,
    mut w: Written,
    metadata: &[(String, String)],
) -> Result<Written, Refusal> {
    let op = cordon_sandbox::protocol::FsOp::SetMetadata {
        path: w.path.clone(),
        entries: metadata.to_vec(),
    };
    let path = w.path.clone();
    fs_for(b, op, user.ids, &path).await?;
    if !metadata.is_empty() {
        w.metadata = Some(metadata.iter().cloned().collect());
    }
    Ok(w)
}

/// Writes what `chunks` yields to `path` as `user` (its directories made,
/// the file made or truncated), and waits for it to be written.
async fn write_one<S, E>(
    b: &LiveBox,
    user: &User,
    path: &str,
    mut chunks: S,
) -> Result<Written, Refusal>
where
    S: futures_util::Stream<Item = Result<Bytes, E>> + Unpin,
    E: std::fmt::Display,
{
    // Its missing directories made by root and given to the user, as
    // envd does: a user may write to a new /data as well as to its home.
    let owner = user.ids.unwrap_or((user.account.uid, user.account.gid));
    let parents = cordon_sandbox::protocol::FsOp::MakeParents {
        path: path.to_string(),
        owner,
    };
    fs_for(b, parents, Some((0, 0)), path).await?;
    // Made (or truncated), owned, written: what a watch sees is envd's
    // create, chmod and write.
    let script = "d=$(dirname -- \"$1\") && mkdir -p -- \"$d\" && exec 3>\"$1\" && \
                  chown -- \"$(id -u):$(id -g)\" \"$1\" && exec cat >&3"
        .to_string();
    let mut exec = script_as(b, user, script, path, true, "write").await?;
    let stdin = exec.stdin();
    // The body goes in as it comes, while the command's output is read:
    // a command that fails early must not hold the writer up.
    let feed = async move {
        while let Some(chunk) = chunks.next().await {
            let chunk =
                chunk.map_err(|e| error(StatusCode::BAD_REQUEST, format!("the upload: {e}")))?;
            if stdin.write(&chunk).await.is_err() {
                break;
            }
        }
        let _ = stdin.close();
        Ok::<(), Refusal>(())
    };
    let wait = async {
        let mut stderr = Vec::new();
        loop {
            match exec.next().await {
                Some(Ok(cordon_sandbox::ExecEvent::Stderr(d))) if stderr.len() < ERROR_KEPT => {
                    stderr.extend_from_slice(&d)
                }
                Some(Ok(cordon_sandbox::ExecEvent::Exit(r))) => break Ok((r, stderr)),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => break Err(gone(&b.id)),
            }
        }
    };
    let (fed, waited) = tokio::join!(feed, wait);
    let (result, stderr) = waited?;
    fed?;
    if result.disk_exceeded {
        return Err(error(
            StatusCode::INSUFFICIENT_STORAGE,
            "the sandbox's disk is full",
        ));
    }
    if !result.status.success() {
        let why = printable_tail(&stderr);
        let status = if why.contains("space") {
            StatusCode::INSUFFICIENT_STORAGE
        } else {
            StatusCode::BAD_REQUEST
        };
        return Err(error(
            status,
            format!("cannot write '{}': {why}", cordon_tools::printable(path)),
        ));
    }
    Ok(Written {
        name: path.rsplit('/').next().unwrap_or("").to_string(),
        path: path.to_string(),
        kind: "file",
        metadata: None,
    })
}

/// `POST /files?path=…`: one file from a raw body, or one per multipart
/// part named `file` (its target the part's file name, unless one `path`
/// names it).
pub async fn write(
    State(shared): State<Arc<Shared>>,
    Query(q): Query<FileQuery>,
    request: Request,
) -> Result<Response, Refusal> {
    let headers = request.headers().clone();
    let b = admitted(&shared, &headers, &q, "write")?;
    let user = user_of(&b, &headers, &q).await?;
    let metadata = metadata_of(&headers)?;
    let asked = q.path.as_deref().filter(|p| !p.is_empty());
    if asked.is_some_and(|p| p.contains('\0')) {
        return Err(error(StatusCode::BAD_REQUEST, "`path` holds a NUL byte"));
    }
    let kind = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_ascii_lowercase();
    if kind.starts_with("application/octet-stream") {
        let Some(asked) = asked else {
            return Err(error(StatusCode::BAD_REQUEST, "a raw upload needs `path`"));
        };
        let path = resolve(&user.account.home, asked);
        let body = request.into_body().into_data_stream();
        let w = match content_encoding(&headers)? {
            Encoding::Identity => write_one(&b, &user, &path, body).await?,
            Encoding::Gzip => write_one(&b, &user, &path, gunzipped(body)).await?,
        };
        let w = set_metadata(&b, &user, w, &metadata).await?;
        return Ok(Json(vec![w]).into_response());
    }
    if !kind.starts_with("multipart/form-data") {
        return Err(error(
            StatusCode::BAD_REQUEST,
            "send multipart/form-data or application/octet-stream",
        ));
    }
    let mut form = match Multipart::from_request(request, &()).await {
        Ok(m) => m,
        Err(e) => return Err(error(StatusCode::BAD_REQUEST, e.body_text())),
    };
    let mut written = Vec::new();
    let mut seen = BTreeMap::new();
    loop {
        let field = match form.next_field().await {
            Ok(Some(f)) => f,
            Ok(None) => break,
            Err(e) => return Err(error(StatusCode::BAD_REQUEST, e.body_text())),
        };
        if field.name() != Some("file") {
            continue;
        }
        let target = match (asked, field.file_name()) {
            (Some(p), _) => p.to_string(),
            (None, Some(name)) if !name.is_empty() && !name.contains('\0') => name.to_string(),
            _ => {
                return Err(error(
                    StatusCode::BAD_REQUEST,
                    "a part names no file: give `path` or a file name",
                ));
            }
        };
        let path = resolve(&user.account.home, &target);
        if seen.insert(path.clone(), ()).is_some() {
            return Err(error(
                StatusCode::BAD_REQUEST,
                format!("'{}' is written twice", cordon_tools::printable(&path)),
            ));
        }
        let w = write_one(&b, &user, &path, field).await?;
        written.push(set_metadata(&b, &user, w, &metadata).await?);
    }
    Ok(Json(written).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn gzip_goes_both_ways_in_bounded_steps() {
        let data: Vec<u8> = (0..300_000u32).flat_map(|i| i.to_le_bytes()).collect();
        let chunks: Vec<Result<Bytes, std::io::Error>> = data
            .chunks(7000)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let zipped: Vec<u8> = gzipped(futures_util::stream::iter(chunks))
            .map(|c| c.unwrap().to_vec())
            .concat()
            .await;
        let parts: Vec<Result<Bytes, String>> = zipped
            .chunks(999)
            .map(|c| Ok(Bytes::copy_from_slice(c)))
            .collect();
        let mut largest = 0;
        let mut back = Vec::new();
        let mut s = gunzipped(futures_util::stream::iter(parts));
        while let Some(c) = s.next().await {
            let c = c.unwrap();
            largest = largest.max(c.len());
            back.extend_from_slice(&c);
        }
        assert_eq!(back, data);
        // A bomb: a megabyte of zeros squeezed small comes out in steps.
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        std::io::Write::write_all(&mut e, &vec![0u8; 8 << 20]).unwrap();
        let bomb = e.finish().unwrap();
        let mut s = gunzipped(futures_util::stream::iter([Ok::<_, String>(Bytes::from(
            bomb,
        ))]));
        let mut total = 0;
        while let Some(c) = s.next().await {
            let c = c.unwrap();
            assert!(c.len() <= 2 << 20, "{} bytes at once", c.len());
            total += c.len();
        }
        assert_eq!(total, 8 << 20);
        let mut s = gunzipped(futures_util::stream::iter([Ok::<_, String>(
            Bytes::from_static(b"plain"),
        )]));
        assert!(s.next().await.unwrap().is_err());
    }

    #[test]
    fn signatures_are_e2bs() {
        // sha256("a.txt:read:user:tok"), base64 without padding.
        let s = signature_of("a.txt", "read", "user", "tok", None);
        assert!(s.starts_with("v1_") && !s.ends_with('='), "{s}");
        assert_eq!(s.len(), 3 + 43);
        assert_ne!(s, signature_of("a.txt", "write", "user", "tok", None));
        assert_ne!(s, signature_of("a.txt", "read", "user", "tok", Some(1)));
    }
}
