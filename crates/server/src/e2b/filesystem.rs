//! envd's `filesystem.Filesystem` service over a sandbox of the API:
//! Stat, ListDir, MakeDir, Move and Remove, done by the sandbox's
//! supervisor as the request's user ([`cordon_sandbox::Sandbox::fs`]), on
//! paths relative to that user's home.
//!
//! Entries are shown as envd shows them: a link's type and mode are its
//! target's, its permissions its own (Go's `FileMode` string); owners by
//! the names the image gives them.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use cordon_sandbox::WatchEvent;
use cordon_sandbox::protocol::{
    ChangeKind, FileKind, FsAnswer, FsChange, FsEntry, FsErrorKind, FsOp,
};
use serde::{Deserialize, Serialize};

use super::connect::{self, Code, RpcError};
use super::envd::{Envd, User};
use crate::boxes::{LiveBox, Watched};
use crate::sandbox_api::resolve;
use crate::state::Shared;

/// `POST /filesystem.Filesystem/{method}`.
pub async fn rpc(
    State(shared): State<Arc<Shared>>,
    Envd(b): Envd,
    Path(method): Path<String>,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let peer = super::envd::peer(&extensions);
    let body = match body {
        Ok(b) => b,
        Err(e) => return RpcError::invalid(e.body_text()).into_response(),
    };
    let user = match super::envd::user(&b, &headers).await {
        Ok(u) => u,
        Err(e) => return RpcError::new(Code::Unauthenticated, e).into_response(),
    };
    let fs = Fs { b: &b, user: &user };
    match method.as_str() {
        "Stat" => connect::unary(match connect::request::<PathRequest>(&headers, &body) {
            Ok(r) => fs.stat(&r.path).await.map(|entry| EntryResponse { entry }),
            Err(e) => Err(e),
        }),
        "ListDir" => connect::unary(match connect::request::<ListRequest>(&headers, &body) {
            Ok(r) => fs.list(&r.path, r.depth).await,
            Err(e) => Err(e),
        }),
        "MakeDir" => connect::unary(match connect::request::<PathRequest>(&headers, &body) {
            Ok(r) => fs
                .make_dir(&r.path)
                .await
                .map(|entry| EntryResponse { entry }),
            Err(e) => Err(e),
        }),
        "Move" => connect::unary(match connect::request::<MoveRequest>(&headers, &body) {
            Ok(r) => fs
                .rename(&r.source, &r.destination)
                .await
                .map(|entry| EntryResponse { entry }),
            Err(e) => Err(e),
        }),
        "Remove" => connect::unary(match connect::request::<PathRequest>(&headers, &body) {
            Ok(r) => fs.remove(&r.path).await,
            Err(e) => Err(e),
        }),
        "WatchDir" => match connect::stream_request::<WatchRequest>(&headers, &body) {
            Ok(r) => match fs.watch(&r).await {
                Ok(w) => watch_stream(shared, b.clone(), user.clone(), w, peer, &headers),
                Err(e) => connect::stream_error(e),
            },
            Err(e) => connect::stream_error(e),
        },
        "CreateWatcher" => {
            connect::unary(match connect::request::<WatchRequest>(&headers, &body) {
                Ok(r) => fs.create_watcher(&r).await,
                Err(e) => Err(e),
            })
        }
        "GetWatcherEvents" => {
            connect::unary(match connect::request::<WatcherRequest>(&headers, &body) {
                Ok(r) => fs.watcher_events(&r.watcher_id).await,
                Err(e) => Err(e),
            })
        }
        "RemoveWatcher" => {
            connect::unary(match connect::request::<WatcherRequest>(&headers, &body) {
                Ok(r) => match b.watchers.lock().await.remove(&r.watcher_id) {
                    Some(_) => Ok(Empty {}),
                    None => Err(RpcError::not_found(format!(
                        "watcher {} not found",
                        cordon_tools::printable(&r.watcher_id)
                    ))),
                },
                Err(e) => Err(e),
            })
        }
        other => RpcError::new(
            Code::Unimplemented,
            format!(
                "filesystem.Filesystem has no method {} here",
                cordon_tools::printable(other)
            ),
        )
        .into_response(),
    }
}

#[derive(Debug, Deserialize)]
struct PathRequest {
    #[serde(default)]
    path: String,
}

#[derive(Debug, Deserialize)]
struct ListRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    depth: u32,
}

#[derive(Debug, Deserialize)]
struct WatchRequest {
    #[serde(default)]
    path: String,
    #[serde(default)]
    recursive: bool,
    #[serde(default, rename = "includeEntry", alias = "include_entry")]
    include_entry: bool,
}

#[derive(Debug, Deserialize)]
struct WatcherRequest {
    #[serde(default, rename = "watcherId", alias = "watcher_id")]
    watcher_id: String,
}

#[derive(Debug, Deserialize)]
struct MoveRequest {
    #[serde(default)]
    source: String,
    #[serde(default)]
    destination: String,
}

/// envd's `EntryInfo`.
#[derive(Debug, Serialize, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct EntryInfo {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    path: String,
    /// int64: a string in proto3's JSON.
    size: String,
    mode: u32,
    permissions: String,
    owner: String,
    group: String,
    modified_time: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    symlink_target: Option<String>,
    #[serde(skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    metadata: std::collections::BTreeMap<String, String>,
}

#[derive(Debug, Serialize)]
struct EntryResponse {
    entry: EntryInfo,
}

#[derive(Debug, Serialize)]
struct ListResponse {
    entries: Vec<EntryInfo>,
}

#[derive(Debug, Serialize)]
struct Empty {}

/// envd's `FilesystemEvent`.
#[derive(Debug, Serialize)]
struct FilesystemEvent {
    name: String,
    #[serde(rename = "type")]
    kind: &'static str,
    #[serde(skip_serializing_if = "Option::is_none")]
    entry: Option<EntryInfo>,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct CreateWatcherResponse {
    watcher_id: String,
}

#[derive(Debug, Serialize)]
struct WatcherEventsResponse {
    events: Vec<FilesystemEvent>,
}

/// A `WatchDir` stream's message (the oneof is the message itself).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum WatchDirEvent {
    Start {},
    Filesystem(Box<FilesystemEvent>),
    Keepalive {},
}

fn event_type(k: ChangeKind) -> &'static str {
    match k {
        ChangeKind::Create => "EVENT_TYPE_CREATE",
        ChangeKind::Write => "EVENT_TYPE_WRITE",
        ChangeKind::Remove => "EVENT_TYPE_REMOVE",
        ChangeKind::Rename => "EVENT_TYPE_RENAME",
        ChangeKind::Chmod => "EVENT_TYPE_CHMOD",
    }
}

/// A watcher's id: random, in a UUID's shape, as envd's are.
fn watcher_id() -> String {
    let h = crate::store::random_hex(16);
    format!(
        "{}-{}-{}-{}-{}",
        &h[..8],
        &h[8..12],
        &h[12..16],
        &h[16..20],
        &h[20..]
    )
}

fn lost() -> RpcError {
    RpcError::new(
        Code::DataLoss,
        "changes came faster than they were read, and some were lost: watch again",
    )
}

/// `WatchDir`: `start`, then each change as it comes, to the client's
/// leaving (or deadline); a sandbox that ends cuts the stream.
fn watch_stream(
    shared: Arc<Shared>,
    b: Arc<LiveBox>,
    user: User,
    w: Watched,
    peer: Option<cordon_listen::Peer>,
    headers: &HeaderMap,
) -> Response {
    let keepalive = connect::keepalive(headers);
    let deadline = connect::deadline(headers).map(|d| tokio::time::Instant::now() + d);
    let start = connect::envelope(&WatchDirEvent::Start {});
    struct State {
        shared: Arc<Shared>,
        b: Arc<LiveBox>,
        user: User,
        w: Watched,
        peer: Option<cordon_listen::Peer>,
        queue: std::collections::VecDeque<Result<Bytes, std::io::Error>>,
        done: bool,
    }
    let state = State {
        shared,
        b,
        user,
        w,
        peer,
        queue: std::collections::VecDeque::from([Ok(start)]),
        done: false,
    };
    let body = futures_util::stream::unfold(state, move |mut st| async move {
        loop {
            if let Some(item) = st.queue.pop_front() {
                return Some((item, st));
            }
            if st.done {
                return None;
            }
            let wait = tokio::time::Instant::now() + keepalive;
            let until = deadline.map_or(wait, |d| d.min(wait));
            match tokio::time::timeout_at(until, st.w.watcher.next()).await {
                Ok(Some(WatchEvent::Changes(changes))) => {
                    let fs = Fs {
                        b: &st.b,
                        user: &st.user,
                    };
                    for c in changes {
                        let e = fs.event(&st.w.root, st.w.include_entry, c).await;
                        st.queue
                            .push_back(Ok(connect::envelope(&WatchDirEvent::Filesystem(
                                Box::new(e),
                            ))));
                    }
                }
                Ok(Some(WatchEvent::Overflowed)) => {
                    st.queue.push_back(Ok(connect::end_stream(Some(&lost()))));
                    st.done = true;
                }
                Ok(None) => {
                    if st.shared.boxes.by_id(&st.b.id).is_none() {
                        if let Some(p) = &st.peer {
                            p.reset_on_close();
                        }
                        st.queue
                            .push_back(Err(std::io::Error::other("the sandbox ended")));
                    } else {
                        st.queue.push_back(Ok(connect::end_stream(None)));
                    }
                    st.done = true;
                }
                Err(_) if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) => {
                    let e = RpcError::new(Code::DeadlineExceeded, "the stream's deadline passed");
                    st.queue.push_back(Ok(connect::end_stream(Some(&e))));
                    st.done = true;
                }
                Err(_) => st
                    .queue
                    .push_back(Ok(connect::envelope(&WatchDirEvent::Keepalive {}))),
            }
        }
    });
    connect::stream_response(body)
}

fn kind_name(k: FileKind) -> &'static str {
    match k {
        FileKind::File => "FILE_TYPE_FILE",
        FileKind::Directory => "FILE_TYPE_DIRECTORY",
        FileKind::Symlink => "FILE_TYPE_SYMLINK",
        FileKind::Other => "FILE_TYPE_UNSPECIFIED",
    }
}

/// `st_mode` as Go's `FileMode.String()` writes it: type letters (`-` for
/// a plain file), then `rwxrwxrwx`.
pub fn mode_string(st_mode: u32) -> String {
    let mut out = String::new();
    let kind = st_mode & libc::S_IFMT;
    if kind == libc::S_IFDIR {
        out.push('d');
    }
    if kind == libc::S_IFLNK {
        out.push('L');
    }
    if kind == libc::S_IFBLK || kind == libc::S_IFCHR {
        out.push('D');
    }
    if kind == libc::S_IFIFO {
        out.push('p');
    }
    if kind == libc::S_IFSOCK {
        out.push('S');
    }
    if st_mode & libc::S_ISUID != 0 {
        out.push('u');
    }
    if st_mode & libc::S_ISGID != 0 {
        out.push('g');
    }
    if kind == libc::S_IFCHR {
        out.push('c');
    }
    if st_mode & libc::S_ISVTX != 0 {
        out.push('t');
    }
    if out.is_empty() {
        out.push('-');
    }
    for (i, c) in "rwxrwxrwx".chars().enumerate() {
        out.push(if st_mode & (1 << (8 - i)) != 0 {
            c
        } else {
            '-'
        });
    }
    out
}

/// Nanoseconds since the epoch as proto3's JSON writes a timestamp.
fn timestamp(ns: i64) -> String {
    let secs = ns.div_euclid(1_000_000_000);
    let nanos = ns.rem_euclid(1_000_000_000) as u32;
    chrono::DateTime::from_timestamp(secs, nanos)
        .unwrap_or_default()
        .to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true)
}

/// One request's view of a sandbox's files: as whom, from where.
struct Fs<'a> {
    b: &'a LiveBox,
    user: &'a User,
}

impl Fs<'_> {
    fn at(&self, path: &str) -> String {
        resolve(
            &self.user.account.home,
            if path.is_empty() { "~" } else { path },
        )
    }

    async fn op(&self, op: FsOp) -> Result<FsAnswer, RpcError> {
        let answer = self
            .b
            .sandbox
            .fs(op, self.user.ids)
            .await
            .map_err(|e| RpcError::new(Code::Unavailable, format!("the sandbox: {e}")))?;
        answer.map_err(|f| {
            let code = match f.kind {
                FsErrorKind::NotFound => Code::NotFound,
                FsErrorKind::AlreadyExists => Code::AlreadyExists,
                FsErrorKind::NotADirectory | FsErrorKind::Refused => Code::InvalidArgument,
                FsErrorKind::PermissionDenied => Code::PermissionDenied,
                FsErrorKind::Other => Code::Internal,
            };
            RpcError::new(code, f.message)
        })
    }

    async fn names(&self) -> cordon_image::root::Names {
        let layers = self.b.layers.clone();
        tokio::task::spawn_blocking(move || cordon_image::root::names(&layers))
            .await
            .unwrap_or_default()
    }

    fn info(&self, e: FsEntry, path: String, names: &cordon_image::root::Names) -> EntryInfo {
        let (kind, mode) = match &e.link {
            Some(t) => (t.kind, t.mode),
            None => (e.kind, e.mode),
        };
        EntryInfo {
            name: path.rsplit('/').next().unwrap_or("").to_string(),
            kind: kind_name(kind),
            path,
            size: e.size.to_string(),
            mode: mode & 0o777,
            permissions: mode_string(e.mode),
            owner: names.user(e.uid),
            group: names.group(e.gid),
            modified_time: timestamp(e.mtime_ns),
            symlink_target: e.link.map(|t| t.path),
            metadata: e.metadata.into_iter().collect(),
        }
    }

    async fn entry(&self, answer: FsAnswer) -> Result<EntryInfo, RpcError> {
        match answer {
            FsAnswer::Entry(e) => {
                let path = e.path.clone();
                Ok(self.info(e, path, &self.names().await))
            }
            other => Err(RpcError::new(
                Code::Internal,
                format!("the sandbox answered {other:?}"),
            )),
        }
    }

    async fn stat(&self, path: &str) -> Result<EntryInfo, RpcError> {
        let answer = self
            .op(FsOp::Stat {
                path: self.at(path),
            })
            .await?;
        self.entry(answer).await
    }

    async fn list(&self, path: &str, depth: u32) -> Result<ListResponse, RpcError> {
        let root = self.at(path);
        let FsAnswer::Entries(found) = self
            .op(FsOp::List {
                path: root.clone(),
                depth: depth.max(1),
            })
            .await?
        else {
            return Err(RpcError::new(
                Code::Internal,
                "the sandbox answered no list",
            ));
        };
        let names = self.names().await;
        let base = root.trim_end_matches('/');
        let entries = found
            .into_iter()
            .map(|e| {
                let path = format!("{base}/{}", e.path);
                self.info(e, path, &names)
            })
            .collect();
        Ok(ListResponse { entries })
    }

    async fn make_dir(&self, path: &str) -> Result<EntryInfo, RpcError> {
        let answer = self
            .op(FsOp::MakeDir {
                path: self.at(path),
            })
            .await?;
        self.entry(answer).await
    }

    async fn rename(&self, from: &str, to: &str) -> Result<EntryInfo, RpcError> {
        let answer = self
            .op(FsOp::Move {
                from: self.at(from),
                to: self.at(to),
            })
            .await?;
        self.entry(answer).await
    }

    async fn watch(&self, r: &WatchRequest) -> Result<Watched, RpcError> {
        let root = self.at(&r.path);
        let watched = self
            .b
            .sandbox
            .watch(&root, r.recursive)
            .await
            .map_err(|e| RpcError::new(Code::Unavailable, format!("the sandbox: {e}")))?;
        match watched {
            Ok(watcher) => Ok(Watched {
                watcher,
                root,
                include_entry: r.include_entry,
            }),
            Err(f) => Err(RpcError::new(
                match f.kind {
                    FsErrorKind::NotFound => Code::NotFound,
                    FsErrorKind::Refused => Code::ResourceExhausted,
                    _ => Code::InvalidArgument,
                },
                f.message,
            )),
        }
    }

    async fn create_watcher(&self, r: &WatchRequest) -> Result<CreateWatcherResponse, RpcError> {
        let watched = self.watch(r).await?;
        let id = watcher_id();
        self.b.watchers.lock().await.insert(id.clone(), watched);
        Ok(CreateWatcherResponse { watcher_id: id })
    }

    /// What watcher `id` saw since it was last asked.
    async fn watcher_events(&self, id: &str) -> Result<WatcherEventsResponse, RpcError> {
        let mut watchers = self.b.watchers.lock().await;
        let Some(w) = watchers.get_mut(id) else {
            return Err(RpcError::not_found(format!(
                "watcher {} not found",
                cordon_tools::printable(id)
            )));
        };
        let mut events = Vec::new();
        for e in w.watcher.ready() {
            match e {
                WatchEvent::Changes(changes) => {
                    for c in changes {
                        events.push(self.event(&w.root, w.include_entry, c).await);
                    }
                }
                WatchEvent::Overflowed => {
                    watchers.remove(id);
                    return Err(lost());
                }
            }
        }
        Ok(WatcherEventsResponse { events })
    }

    /// A change as envd reports it: named relative to the watched
    /// directory, with the entry as it is now when asked (and it is).
    async fn event(&self, root: &str, include_entry: bool, c: FsChange) -> FilesystemEvent {
        let with_entry = include_entry
            && matches!(
                c.kind,
                ChangeKind::Create | ChangeKind::Write | ChangeKind::Chmod
            );
        let entry = if with_entry {
            self.stat(&format!("{}/{}", root.trim_end_matches('/'), c.path))
                .await
                .ok()
        } else {
            None
        };
        FilesystemEvent {
            name: c.path,
            kind: event_type(c.kind),
            entry,
        }
    }

    async fn remove(&self, path: &str) -> Result<Empty, RpcError> {
        self.op(FsOp::Remove {
            path: self.at(path),
        })
        .await?;
        Ok(Empty {})
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_read_as_go_writes_them() {
        assert_eq!(mode_string(libc::S_IFREG | 0o644), "-rw-r--r--");
        assert_eq!(mode_string(libc::S_IFDIR | 0o755), "drwxr-xr-x");
        assert_eq!(mode_string(libc::S_IFLNK | 0o777), "Lrwxrwxrwx");
        assert_eq!(
            mode_string(libc::S_IFDIR | libc::S_ISVTX | 0o777),
            "dtrwxrwxrwx"
        );
        assert_eq!(
            mode_string(libc::S_IFREG | libc::S_ISUID | 0o755),
            "urwxr-xr-x"
        );
        assert_eq!(mode_string(libc::S_IFCHR | 0o666), "Dcrw-rw-rw-");
    }

    #[test]
    fn watch_messages_are_the_oneof_itself() {
        let j = |e: WatchDirEvent| serde_json::to_string(&e).unwrap();
        assert_eq!(j(WatchDirEvent::Start {}), r#"{"start":{}}"#);
        assert_eq!(j(WatchDirEvent::Keepalive {}), r#"{"keepalive":{}}"#);
        let e = FilesystemEvent {
            name: "a/b".into(),
            kind: event_type(ChangeKind::Chmod),
            entry: None,
        };
        assert_eq!(
            j(WatchDirEvent::Filesystem(Box::new(e))),
            r#"{"filesystem":{"name":"a/b","type":"EVENT_TYPE_CHMOD"}}"#
        );
        let r: WatchRequest =
            serde_json::from_str(r#"{"path":"d","recursive":true,"includeEntry":true}"#).unwrap();
        assert!(r.recursive && r.include_entry);
    }

    #[test]
    fn times_are_rfc3339_in_utc() {
        assert_eq!(timestamp(0), "1970-01-01T00:00:00Z");
        assert_eq!(
            timestamp(1_500_000_000_123_456_789),
            "2017-07-14T02:40:00.123456789Z"
        );
    }
}
