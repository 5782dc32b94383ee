//! A sandbox's whole file system, as its own user sees it: stat, list,
//! make a directory, move, remove and watch, done by the sandbox's
//! supervisor ([`cordon_sandbox::Sandbox::fs`]), never on the host. A
//! relative path is beneath the user's home (the workspace on the host's
//! root). The workspace's files are also read and written by the `files`
//! routes.

use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use cordon_sandbox::protocol::{FileKind, FsAnswer, FsEntry, FsErrorKind, FsOp};
use cordon_sandbox::{WatchEvent, Watcher};
use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::{live, start_error};
use crate::boxes::LiveBox;
use crate::http::{ApiError, ApiResult, Tenant, Timestamp, read_json};
use crate::state::Shared;

/// `path` as the sandbox's user means it (and E2B's envd reads it) for a user whose home is `home`: `~` is the
/// home, a relative path is beneath it; `.` and `..` are folded.
pub fn resolve(home: &str, path: &str) -> String {
    let joined = if path == "~" {
        home.to_string()
    } else if let Some(rest) = path.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if path.starts_with('/') {
        path.to_string()
    } else {
        format!("{home}/{path}")
    };
    let mut parts: Vec<&str> = Vec::new();
    for part in joined.split('/') {
        match part {
            "" | "." => {}
            ".." => {
                parts.pop();
            }
            p => parts.push(p),
        }
    }
    format!("/{}", parts.join("/"))
}

/// An entry of a sandbox's file system.
#[derive(Debug, Serialize, ToSchema)]
pub struct EntryView {
    /// Absolute.
    pub path: String,
    pub name: String,
    /// `file`, `directory`, `symlink` or `other`.
    pub kind: &'static str,
    pub size: u64,
    /// Permission bits, octal (`"0644"`).
    pub mode: String,
    pub uid: u32,
    pub gid: u32,
    pub modified_at: Option<Timestamp>,
    /// A link's target, resolved (none when it leads nowhere).
    pub link_target: Option<String>,
}

impl EntryView {
    fn of(e: FsEntry, path: String) -> EntryView {
        EntryView {
            name: path.rsplit('/').next().unwrap_or("").to_string(),
            path,
            kind: match e.kind {
                FileKind::File => "file",
                FileKind::Directory => "directory",
                FileKind::Symlink => "symlink",
                FileKind::Other => "other",
            },
            size: e.size,
            mode: format!("{:04o}", e.mode & 0o7777),
            uid: e.uid,
            gid: e.gid,
            modified_at: Timestamp::from_ms(e.mtime_ns / 1_000_000),
            link_target: e.link.map(|l| l.path),
        }
    }
}

/// `GET …/fs/list`.
#[derive(Debug, Serialize, ToSchema)]
pub struct EntryList {
    pub entries: Vec<EntryView>,
}

/// A path's query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct PathQuery {
    /// Absolute, or beneath the sandbox's user's home.
    path: String,
}

/// `GET …/fs/list`'s query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    path: String,
    /// Levels below it (default 1).
    #[serde(default)]
    depth: Option<u32>,
}

/// `GET …/fs/watch`'s query.
#[derive(Debug, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct WatchQuery {
    path: String,
    /// The directories below it too, made later included.
    #[serde(default)]
    recursive: bool,
}

/// `POST …/fs/mkdir`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MakeDir {
    pub path: String,
}

/// `POST …/fs/move`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct MoveRequest {
    pub from: String,
    pub to: String,
}

fn at(b: &LiveBox, path: &str) -> ApiResult<String> {
    if path.is_empty() || path.contains('\0') {
        return Err(ApiError::bad_request(
            "`path` names a path of the sandbox, without NUL bytes",
        ));
    }
    Ok(resolve(&b.account.home, path))
}

fn refused(f: cordon_sandbox::protocol::FsFailure) -> ApiError {
    let (status, code) = match f.kind {
        FsErrorKind::NotFound => (StatusCode::NOT_FOUND, "not_found"),
        FsErrorKind::AlreadyExists => (StatusCode::CONFLICT, "exists"),
        FsErrorKind::NotADirectory => (StatusCode::BAD_REQUEST, "not_a_directory"),
        FsErrorKind::PermissionDenied => (StatusCode::FORBIDDEN, "forbidden"),
        FsErrorKind::Refused => (StatusCode::UNPROCESSABLE_ENTITY, "refused"),
        FsErrorKind::Other => (StatusCode::UNPROCESSABLE_ENTITY, "failed"),
    };
    ApiError::new(status, code, f.message)
}

async fn op(id: &str, b: &LiveBox, op: FsOp) -> ApiResult<FsAnswer> {
    b.sandbox
        .fs(op, None)
        .await
        .map_err(|e| start_error(id, e))?
        .map_err(refused)
}

fn entry(answer: FsAnswer) -> ApiResult<EntryView> {
    match answer {
        FsAnswer::Entry(e) => {
            let path = e.path.clone();
            Ok(EntryView::of(e, path))
        }
        _ => Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "sandbox_error",
            "the sandbox answered something else",
        )),
    }
}

fn query<T>(q: Result<Query<T>, QueryRejection>) -> ApiResult<T> {
    q.map(|Query(q)| q)
        .map_err(|e| ApiError::bad_request(e.body_text()))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/fs/stat", tag = "sandboxes", summary = "An entry of a sandbox's file system",
    params(("id" = String, Path), PathQuery),
    responses((status = 200, body = EntryView),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "The sandbox's user may not (the kernel's reason)", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox, or nothing there", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse),
              (status = 422, description = "The file system refused it (the kernel's reason, e.g. a name too long)", body = crate::http::ErrorResponse)))]
pub(crate) async fn fs_stat(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, QueryRejection>,
) -> ApiResult<Json<EntryView>> {
    let q = query(q)?;
    let b = live(&shared, &tenant, &id).await?;
    let path = at(&b, &q.path)?;
    Ok(Json(entry(op(&id, &b, FsOp::Stat { path }).await?)?))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/fs/list", tag = "sandboxes", summary = "What is in a directory of a sandbox",
    description = "`depth` levels down (1 by default), in lexical order, each directory before what it holds; links are not followed. At most 4096 entries: past that, 422 (list less deep).",
    params(("id" = String, Path), ListQuery),
    responses((status = 200, body = EntryList),
              (status = 400, description = "Not a directory, or the request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "The sandbox's user may not (the kernel's reason)", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox or directory", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse),
              (status = 422, description = "Too many entries, or the file system refused it (the kernel's reason)", body = crate::http::ErrorResponse)))]
pub(crate) async fn fs_list(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<ListQuery>, QueryRejection>,
) -> ApiResult<Json<EntryList>> {
    let q = query(q)?;
    let b = live(&shared, &tenant, &id).await?;
    let root = at(&b, &q.path)?;
    let depth = q.depth.unwrap_or(1).clamp(1, 64);
    let FsAnswer::Entries(found) = op(
        &id,
        &b,
        FsOp::List {
            path: root.clone(),
            depth,
        },
    )
    .await?
    else {
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "sandbox_error",
            "the sandbox answered something else",
        ));
    };
    let base = root.trim_end_matches('/');
    let entries = found
        .into_iter()
        .map(|e| {
            let path = format!("{base}/{}", e.path);
            EntryView::of(e, path)
        })
        .collect();
    Ok(Json(EntryList { entries }))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/fs/mkdir", tag = "sandboxes", summary = "Make a directory in a sandbox",
    description = "With its missing parents, mode 0755, owned by the sandbox's user.",
    params(("id" = String, Path)),
    request_body(content = MakeDir, example = json!({"path": "src/app"})),
    responses((status = 201, body = EntryView),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "The sandbox's user may not (the kernel's reason)", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It exists already, or the sandbox has ended", body = crate::http::ErrorResponse),
              (status = 422, description = "The file system refused it (the kernel's reason, e.g. a name too long)", body = crate::http::ErrorResponse)))]
pub(crate) async fn fs_mkdir(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = crate::http::within(body, shared.config.body_limit)?;
    let asked: MakeDir = read_json(&body)?;
    let b = live(&shared, &tenant, &id).await?;
    let path = at(&b, &asked.path)?;
    let made = entry(op(&id, &b, FsOp::MakeDir { path }).await?)?;
    Ok((StatusCode::CREATED, Json(made)).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/fs/move", tag = "sandboxes", summary = "Move or rename in a sandbox",
    description = "Makes the destination's missing parents; across file systems (`/tmp` to the workspace), copies then removes.",
    params(("id" = String, Path)),
    request_body(content = MoveRequest, example = json!({"from": "draft.txt", "to": "docs/final.txt"})),
    responses((status = 200, body = EntryView),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "The sandbox's user may not (the kernel's reason)", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox, or nothing to move", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse),
              (status = 422, description = "The file system refused it (the kernel's reason, e.g. a name too long)", body = crate::http::ErrorResponse)))]
pub(crate) async fn fs_move(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<EntryView>> {
    let body = crate::http::within(body, shared.config.body_limit)?;
    let asked: MoveRequest = read_json(&body)?;
    let b = live(&shared, &tenant, &id).await?;
    let (from, to) = (at(&b, &asked.from)?, at(&b, &asked.to)?);
    Ok(Json(entry(op(&id, &b, FsOp::Move { from, to }).await?)?))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}/fs", tag = "sandboxes", summary = "Remove a file or a directory with what it holds",
    description = "Nothing there is no error.",
    params(("id" = String, Path), PathQuery),
    responses((status = 204, description = "Removed"),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "The sandbox's user may not (the kernel's reason)", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse),
              (status = 422, description = "The file system refused it (the kernel's reason, e.g. a name too long)", body = crate::http::ErrorResponse)))]
pub(crate) async fn fs_remove(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, QueryRejection>,
) -> ApiResult<StatusCode> {
    let q = query(q)?;
    let b = live(&shared, &tenant, &id).await?;
    let path = at(&b, &q.path)?;
    op(&id, &b, FsOp::Remove { path }).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// One change, as a watch's stream shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct ChangeView {
    /// Relative to the watched directory.
    pub path: String,
    /// `create`, `write`, `remove`, `rename` or `chmod`.
    pub kind: &'static str,
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/fs/watch", tag = "sandboxes", summary = "Watch a directory of a sandbox (SSE)",
    description = "A `change` event per change (`{\"path\", \"kind\"}`), from now until the client leaves or the sandbox ends; what a command or file call changed comes before that call is answered. `overflowed`, then the end, when changes came faster than they were read.",
    params(("id" = String, Path), WatchQuery),
    responses((status = 200, description = "Its changes", content_type = "text/event-stream"),
              (status = 400, description = "Not a directory, or the request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "The sandbox's user may not (the kernel's reason)", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox or directory", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse),
              (status = 422, description = "Too many directories or watches, or the file system refused it (the kernel's reason)", body = crate::http::ErrorResponse)))]
pub(crate) async fn fs_watch(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<WatchQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    let b = live(&shared, &tenant, &id).await?;
    let path = at(&b, &q.path)?;
    let watcher: Watcher = b
        .sandbox
        .watch(&path, q.recursive)
        .await
        .map_err(|e| start_error(&id, e))?
        .map_err(refused)?;
    let events = futures_util::stream::unfold(Some(watcher), |w| async move {
        let mut w = w?;
        match w.next().await {
            Some(WatchEvent::Changes(changes)) => {
                let events: Vec<Result<Event, Infallible>> = changes
                    .into_iter()
                    .map(|c| {
                        let view = ChangeView {
                            path: c.path,
                            kind: match c.kind {
                                cordon_sandbox::protocol::ChangeKind::Create => "create",
                                cordon_sandbox::protocol::ChangeKind::Write => "write",
                                cordon_sandbox::protocol::ChangeKind::Remove => "remove",
                                cordon_sandbox::protocol::ChangeKind::Rename => "rename",
                                cordon_sandbox::protocol::ChangeKind::Chmod => "chmod",
                            },
                        };
                        Ok(Event::default()
                            .event("change")
                            .data(serde_json::to_string(&view).unwrap_or_default()))
                    })
                    .collect();
                Some((futures_util::stream::iter(events), Some(w)))
            }
            Some(WatchEvent::Overflowed) => {
                let e = Ok(Event::default().event("overflowed").data("{}"));
                Some((futures_util::stream::iter(vec![e]), None))
            }
            None => None,
        }
    });
    let flat = futures_util::StreamExt::flatten(events);
    Ok(Sse::new(flat)
        .keep_alive(KeepAlive::default())
        .into_response())
}

/// Bytes of a failed `tar`'s stderr kept for the answer.
const TAR_ERROR_KEPT: usize = 512;

async fn tar_in_sandbox(
    id: &str,
    b: &LiveBox,
    args: &[&str],
    stdin: bool,
) -> ApiResult<cordon_sandbox::Execution> {
    let mut argv = vec!["tar"];
    argv.extend_from_slice(args);
    let mut req = cordon_sandbox::ExecRequest::argv(argv).cwd("/");
    if stdin {
        req = req.stream_stdin();
    }
    b.sandbox
        .exec_stream(req)
        .await
        .map_err(|e| start_error(id, e))
}

/// A directory, as the `fs/archive` routes take it: there, and one.
async fn directory(id: &str, b: &LiveBox, path: &str) -> ApiResult<String> {
    let dir = at(b, path)?;
    let e = entry(op(id, b, FsOp::Stat { path: dir.clone() }).await?)?;
    if e.kind != "directory" {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "not_a_directory",
            format!("{} is not a directory", cordon_tools::printable(&dir)),
        ));
    }
    Ok(dir)
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/fs/archive", tag = "sandboxes", summary = "Download a directory of a sandbox, as a tar",
    description = "Made by the image's `tar` inside the sandbox, as its user, streamed as it is made: many files in one request.",
    params(("id" = String, Path), PathQuery),
    responses((status = 200, description = "The tar", content_type = "application/x-tar"),
              (status = 400, description = "Not a directory, or the request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "The sandbox's user may not (the kernel's reason)", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox or directory", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse),
              (status = 422, description = "The file system refused it (the kernel's reason, e.g. a name too long)", body = crate::http::ErrorResponse)))]
pub(crate) async fn fs_archive_get(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, QueryRejection>,
) -> ApiResult<Response> {
    let q = query(q)?;
    let b = live(&shared, &tenant, &id).await?;
    let dir = directory(&id, &b, &q.path).await?;
    let exec = tar_in_sandbox(&id, &b, &["-C", &dir, "-cf", "-", "."], false).await?;
    // Bytes are the sandbox's, carried as they come; a tar that fails
    // half-way is cut, never ended as if whole.
    let body = futures_util::stream::unfold(Some(exec), |exec| async move {
        let mut exec = exec?;
        loop {
            match exec.next().await {
                Some(Ok(cordon_sandbox::ExecEvent::Stdout(d))) => {
                    return Some((Ok(axum::body::Bytes::from(d)), Some(exec)));
                }
                Some(Ok(cordon_sandbox::ExecEvent::Stderr(_))) => {}
                Some(Ok(cordon_sandbox::ExecEvent::Exit(r))) if r.status.success() => return None,
                _ => return Some((Err(std::io::Error::other("tar failed")), None)),
            }
        }
    });
    Ok((
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/x-tar")],
        axum::body::Body::from_stream(body),
    )
        .into_response())
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/fs/archive", tag = "sandboxes", summary = "Upload many files to a sandbox, as a tar",
    description = "Unpacked into the directory by the image's `tar` inside the sandbox, as its user (owners not kept), as the body comes: many files in one request, bounded by the sandbox's disk budget.",
    params(("id" = String, Path), PathQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", description = "A tar (any content type is taken)", example = json!("(the bytes of a tar)")),
    responses((status = 204, description = "Unpacked"),
              (status = 400, description = "Not a directory, not a tar, or the request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "The sandbox's user may not (the kernel's reason)", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox or directory", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse),
              (status = 422, description = "The file system refused it (the kernel's reason, e.g. a name too long)", body = crate::http::ErrorResponse)))]
pub(crate) async fn fs_archive_put(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<PathQuery>, QueryRejection>,
    body: axum::body::Body,
) -> ApiResult<StatusCode> {
    let q = query(q)?;
    let b = live(&shared, &tenant, &id).await?;
    let dir = directory(&id, &b, &q.path).await?;
    let mut exec =
        tar_in_sandbox(&id, &b, &["-C", &dir, "--no-same-owner", "-xf", "-"], true).await?;
    let stdin = exec.stdin();
    let feed = async move {
        let mut chunks = body.into_data_stream();
        while let Some(chunk) = futures_util::StreamExt::next(&mut chunks).await {
            let Ok(chunk) = chunk else { break };
            if stdin.write(&chunk).await.is_err() {
                break;
            }
        }
        let _ = stdin.close();
    };
    let wait = async {
        let mut stderr = Vec::new();
        loop {
            match exec.next().await {
                Some(Ok(cordon_sandbox::ExecEvent::Stderr(d))) if stderr.len() < TAR_ERROR_KEPT => {
                    stderr.extend_from_slice(&d)
                }
                Some(Ok(cordon_sandbox::ExecEvent::Exit(r))) => break Ok((r, stderr)),
                Some(Ok(_)) => {}
                Some(Err(e)) => break Err(start_error(&id, e)),
                None => break Err(start_error(&id, cordon_sandbox::Error::Gone)),
            }
        }
    };
    let ((), waited) = tokio::join!(feed, wait);
    let (result, stderr) = waited?;
    if !result.status.success() {
        let why = String::from_utf8_lossy(&stderr[..stderr.len().min(TAR_ERROR_KEPT)]);
        return Err(ApiError::bad_request(format!(
            "tar could not unpack it: {}",
            cordon_tools::printable(why.trim())
        )));
    }
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_resolve_as_envd_resolves_them() {
        let r = |p| resolve("/home/user", p);
        assert_eq!(r("~"), "/home/user");
        assert_eq!(r("~/a/b"), "/home/user/a/b");
        assert_eq!(r("a/./b/"), "/home/user/a/b");
        assert_eq!(r("/etc/../tmp"), "/tmp");
        assert_eq!(r("../../../.."), "/");
        assert_eq!(r("/"), "/");
    }
}
