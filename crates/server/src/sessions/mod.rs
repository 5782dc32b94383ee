//! Conversations with the agent over HTTP: create one, post a message and
//! receive the turn as SSE (the events of `cordon exec --json`), list and
//! resume them, compact them.
//!
//! A session's sandbox and agent live in memory while it is used and are
//! closed after it idles; its log (`<data>/sessions/<id>/session.jsonl`)
//! and workspace stay on disk, so the next message, even after a restart,
//! continues the conversation where it was.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::Instant;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::{Json, Router, routing::get, routing::post};
use cordon_agent::checkpoints::RewindError;
use cordon_agent::events::{BoxFuture, EventSink, pump};
use cordon_agent::sessions::SessionStarted;
use cordon_agent::{AgentEvent, Cancel, SessionLog, SessionRecord};
use futures_util::Stream;
use tokio::sync::mpsc;

use crate::http::{ApiError, Tenant, plausible_id, read_json};
use crate::job::NetworkMode;
use crate::state::Shared;
use crate::store::SessionRow;

mod network;
mod view;
mod wake;

pub use view::{
    Cancelled, Compaction, KeptPath, NewMessage, NewSession, RewindTo, Rewound, SessionList,
    SessionSummary, SessionView,
};

pub(crate) use network::{logged_network, read_log};
pub(crate) use wake::{take, take_waiting};

use crate::owner::Owner;

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/sessions", post(create).get(list))
        .route("/v1/sessions/{id}", get(show).delete(delete))
        .route("/v1/sessions/{id}/messages", post(message))
        .route("/v1/sessions/{id}/cancel", post(cancel))
        .route("/v1/sessions/{id}/pause", post(pause))
        .route("/v1/sessions/{id}/resume", post(resume))
        .route("/v1/sessions/{id}/compact", post(compact))
        .route("/v1/sessions/{id}/rewind", post(rewind))
}

/// A session's `session_started` record, if its log has one.
fn started<'a>(mut records: impl Iterator<Item = &'a SessionRecord>) -> Option<&'a SessionStarted> {
    records.find_map(SessionRecord::started)
}

/// The display a session was created with, from its `session_started`.
fn started_display<'a>(
    records: impl Iterator<Item = &'a SessionRecord>,
) -> Option<cordon_sandbox::Display> {
    started(records)?.display
}

/// Whether session `id` was created with a display.
pub(crate) fn has_display(shared: &Shared, id: &str) -> bool {
    let log = dir(shared, id).join("session.jsonl");
    cordon_agent::log::load::<SessionRecord>(&log)
        .ok()
        .and_then(|(records, _)| started_display(records.iter().map(|r| &r.data)))
        .is_some()
}

/// Where session `id`'s log and workspace are.
pub(crate) fn dir(shared: &Shared, id: &str) -> std::path::PathBuf {
    shared.config.session_dirs().join(id)
}

/// How long opening a session's log waits for its lock. Every process
/// the server forks (a sandbox's supervisor, `git`, a pool's next
/// sandbox) holds a copy of each descriptor open at that moment, a log's
/// lock among them, until it execs: milliseconds, more under load.
const LOG_LOCK_PATIENCE: std::time::Duration = std::time::Duration::from_secs(2);

/// Runs `open` (of a session's log) again while `busy` says its lock is
/// held, for up to [`LOG_LOCK_PATIENCE`]. Within this server a session's
/// slot admits one writer, so a held lock is a forked child's passing copy.
pub(crate) async fn open_log<T, E, F: Future<Output = Result<T, E>>>(
    mut open: impl FnMut() -> F,
    busy: impl Fn(&E) -> bool,
) -> Result<T, E> {
    let until = Instant::now() + LOG_LOCK_PATIENCE;
    loop {
        match open().await {
            Err(e) if busy(&e) && Instant::now() < until => {
                tokio::time::sleep(std::time::Duration::from_millis(10)).await;
            }
            done => return done,
        }
    }
}

fn no_model() -> ApiError {
    ApiError::new(
        StatusCode::BAD_REQUEST,
        "invalid_request",
        "this server has no model configured for sessions (set ANTHROPIC_API_KEY or OPENAI_BASE_URL where `cordon serve` runs)",
    )
}

#[utoipa::path(post, path = "/v1/sessions", tag = "sessions", summary = "Start a conversation",
    request_body(content = NewSession, examples(
        ("plain" = (summary = "The server's model, no network", value = json!({}))),
        ("desktop" = (summary = "With a virtual screen", value = json!({"display": "1024x768"}))))),
    responses((status = 201, body = SessionSummary), (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 403, description = "A network beyond this tenant's ceiling", body = crate::http::ErrorResponse), (status = 429, description = "Too many clones under way (a session's `repo`); `Retry-After` says when to try again", body = crate::http::ErrorResponse)))]
pub(crate) async fn create(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    body: Result<Bytes, BytesRejection>,
) -> Result<Response, ApiError> {
    let body = crate::http::within(body, shared.config.body_limit)?;
    let asked: NewSession = if body.is_empty() {
        NewSession::default()
    } else {
        read_json(&body)?
    };
    let display = asked.display.map(|s| s.0);
    let (network, egress) =
        crate::job::network_choice(asked.network, asked.allow.as_deref(), asked.allow_private)
            .map_err(ApiError::bad_request)?;
    let policy = match &egress {
        Some(asked) => Some(shared.ceilings.settle(
            &tenant,
            asked,
            crate::network::Empty::Ceiling,
        )?),
        None => None,
    };
    let defaults = shared.config.agent.as_ref().ok_or_else(no_model)?;
    // Obtained now, so a name the registry lacks fails here and not at
    // the first message; waking finds it in the store.
    let image = shared
        .images
        .choose(&shared.store, &tenant, asked.image.as_ref())
        .await?;
    if let Some(name) = &image {
        shared
            .images
            .ready(&shared.store, &tenant, name)
            .await
            .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, "image_unavailable", e))?;
    }
    let allow_push = asked.allow_push.unwrap_or(false);
    match &asked.repo {
        Some(repo) => crate::repos::admit(&shared.ceilings.of(&tenant), repo).await?,
        None if allow_push => {
            return Err(ApiError::bad_request(
                "`allow_push` is for a session with `repo`: there is nothing to push",
            ));
        }
        None => {}
    }
    // Held until the clone is made: a tenant's concurrent requests do not
    // each start one.
    let _cloning = match &asked.repo {
        Some(_) => Some(shared.clones.acquire(&tenant)?),
        None => None,
    };
    let model = asked
        .model
        .map_or_else(|| defaults.agent.model.clone(), String::from);
    // A ready sandbox of the session's shape comes with its id and
    // workspace; it waits for the first message (see `wake`).
    let shape = crate::pool::Shape::session(
        image.clone(),
        network,
        policy.is_some(),
        display,
        &shared.config.sandboxes(),
    );
    let pooled = shape.and_then(|s| shared.pool.take(&s));
    let id = pooled
        .clone()
        .unwrap_or_else(|| crate::pool::Kind::Session.new_id());
    let made: Result<Response, ApiError> = async {
        let d = dir(&shared, &id);
        let unavailable = |e: std::io::Error| {
            tracing::error!("session {id}: {e}");
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "cannot create the session's files",
            )
        };
        // In use until the clone below is in it; the pool's made already.
        let _in_use = if pooled.is_some() {
            shared
                .config
                .enter_workspace(&d.join("workspace"))
                .await
                .map_err(|e| unavailable(std::io::Error::other(e)))?
        } else {
            let (d, sandboxes) = (d.clone(), shared.config.sandboxes());
            tokio::task::spawn_blocking(move || {
                sandboxes
                    .make_workspace(&d.join("workspace"), None)
                    .map_err(std::io::Error::other)
            })
            .await
            .unwrap_or_else(|e| Err(std::io::Error::other(e)))
            .map_err(unavailable)?
        };
        let mut log = SessionLog::create(d.join("session.jsonl"))
            .map_err(|e| unavailable(std::io::Error::other(e.to_string())))?;
        let spec = policy.clone().map(cordon_net::PolicySpec::from);
        let started = cordon_agent::sessions::SessionStarted {
            session_id: id.clone(),
            model: model.clone(),
            provider: defaults.provider.kind.to_string(),
            workspace: "/workspace".into(),
            title: String::new(),
            resumed: false,
            display,
            network: Some(network.into()),
            allow: spec.as_ref().map(|s| s.allow.clone()),
            allow_private: spec.map(|s| s.allow_private),
            forked_from: None,
            image: image.map(String::from),
            instructions: Vec::new(),
        }
        .record();
        log.append(&started)
            .map_err(|e| unavailable(std::io::Error::other(e.to_string())))?;
        if let Some(repo) = &asked.repo {
            match clone_for(&shared, &tenant, &id, repo, allow_push).await {
                Ok(record) => log
                    .append(&SessionRecord::Repository(record))
                    .map_err(|e| unavailable(std::io::Error::other(e.to_string())))?,
                Err(e) => {
                    // Nothing of the session is kept: its files are the
                    // clone's. A pooled sandbox over them goes first.
                    drop((log, _in_use));
                    shared.pool.forget(&id).await;
                    let d = d.clone();
                    match tokio::task::spawn_blocking(move || crate::files::remove_tree(&d)).await {
                        Ok(Ok(())) => {}
                        Ok(Err(err)) => tracing::warn!("session {id}: {err}"),
                        Err(err) => tracing::warn!("session {id}: {err}"),
                    }
                    return Err(e);
                }
            };
        }
        let row = shared.store.insert_session(&id, &tenant, &model).await?;
        Ok((StatusCode::CREATED, Json(SessionSummary::of(&row))).into_response())
    }
    .await;
    // Its start is done: the pool may make the next.
    shared.pool.ended(&id);
    if made.is_err() && pooled.is_some() {
        // The pool's files are no one's: its sandbox closed, they go.
        shared.pool.forget(&id).await;
        crate::files::remove_files(dir(&shared, &id), "a session not made").await;
    }
    made
}

/// Clones `repo` into new session `id`'s workspace with `tenant`'s login;
/// the record its log keeps of it.
async fn clone_for(
    shared: &Shared,
    tenant: &str,
    id: &str,
    repo: &crate::job::RepoUrl,
    allow_push: bool,
) -> Result<cordon_git::RepositoryRecord, ApiError> {
    let refused = |e: String| ApiError::new(StatusCode::BAD_REQUEST, "clone_failed", e);
    // As a job's: within the default disk budget and timeout.
    let bounds = &shared.config.bounds;
    let target = crate::repos::Target {
        workspace: dir(shared, id).join("workspace"),
        branch: format!("cordon/{id}"),
        existing: cordon_git::Existing::Refuse,
        limits: cordon_git::Limits {
            max_bytes: Some(bounds.default_disk()),
            deadline: Some(
                std::time::Instant::now()
                    + std::time::Duration::from_secs(bounds.default_timeout_secs),
            ),
            cancelled: None,
        },
    };
    let ceiling = &shared.ceilings.of(tenant);
    Ok(
        crate::repos::clone(&shared.store, ceiling, tenant, repo, target, allow_push)
            .await
            .map_err(refused)?
            .record(),
    )
}

#[utoipa::path(get, path = "/v1/sessions", tag = "sessions", summary = "List conversations, newest first",
    responses((status = 200, body = SessionList), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse)))]
pub(crate) async fn list(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
) -> Result<Json<SessionList>, ApiError> {
    let rows = shared.store.sessions(&tenant, 200).await?;
    Ok(Json(SessionList {
        sessions: rows.iter().map(SessionSummary::of).collect(),
    }))
}

pub(crate) async fn find(shared: &Shared, tenant: &str, id: &str) -> Result<SessionRow, ApiError> {
    if !plausible_id(id) {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            "no such session",
        ));
    }
    shared.store.session(tenant, id).await?.ok_or_else(|| {
        ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no session {id}"),
        )
    })
}

/// A session with its conversation as last sent to the model.
#[utoipa::path(get, path = "/v1/sessions/{id}", tag = "sessions", summary = "A conversation and its messages",
    params(("id" = String, Path)),
    responses((status = 200, body = SessionView), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn show(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<SessionView>, ApiError> {
    let row = find(&shared, &tenant, &id).await?;
    let path = dir(&shared, &id).join("session.jsonl");
    let records = load_log(&path, &id)?;
    let display = started_display(records.iter().map(|r| &r.data));
    let (network, policy) = logged_network(records.iter().map(|r| &r.data));
    let summary = cordon_agent::sessions::summarize(&path, &records);
    let messages = cordon_agent::sessions::replay(&records);
    let labels = cordon_agent::sessions::labels(&records);
    Ok(Json(SessionView {
        labels,
        summary: SessionSummary::of(&row),
        turns: summary.as_ref().map_or(0, |s| s.turns),
        usage: summary.map(|s| s.usage).unwrap_or_default(),
        messages,
        display: display.map(crate::job::Screen),
        network: NetworkMode::try_from(network).unwrap_or(NetworkMode::Off),
        allow: policy
            .map(|p| p.rules().iter().map(ToString::to_string).collect())
            .unwrap_or_default(),
        live_desktop: shared
            .sandboxes
            .desktop(&Owner::Session(id.clone()))
            .is_some(),
    }))
}

/// An API session's rendering of its events: each one a Server-Sent Event
/// named by its type, on the response that streams the turn. A client
/// gone away does not stop the turn.
struct SseSink(mpsc::UnboundedSender<Event>);

impl EventSink for SseSink {
    fn event(&mut self, ev: AgentEvent) -> BoxFuture<'_, ()> {
        let (kind, data) = ev.to_json();
        let _ = self
            .0
            .send(Event::default().event(kind).data(data.to_string()));
        Box::pin(async {})
    }
}

/// Posts a message; the answer streams back as SSE, one event per agent
/// event, and the stream ends with the turn. A client that goes away does
/// not stop the turn: it runs to its end and is in the log.
#[utoipa::path(post, path = "/v1/sessions/{id}/messages", tag = "sessions", summary = "Send a message; the turn streams back",
    description = "Server-Sent Events, one per agent event, named by its `type` (the events of `cordon exec --json`); the stream ends with the turn.",
    params(("id" = String, Path)),
    request_body(content = NewMessage, examples(
        ("a task" = (summary = "A task", value = json!({"text": "List the files in the workspace"}))))),
    responses((status = 200, description = "An event stream", content_type = "text/event-stream"), (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "A turn is already running", body = crate::http::ErrorResponse)))]
pub(crate) async fn message(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Sse<impl Stream<Item = Result<Event, Infallible>>>, ApiError> {
    let message = read_json::<NewMessage>(&crate::http::within(body, shared.config.body_limit)?)?;
    if message.images.len() > view::MAX_IMAGES {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("a message carries at most {} images", view::MAX_IMAGES),
        ));
    }
    let images: Vec<cordon_tools::Image> = message.images.into_iter().map(Into::into).collect();
    let text = String::from(message.text);
    let row = find(&shared, &tenant, &id).await?;
    let mut guard = take(&shared, &row).await?;
    if row.title.is_empty() {
        let title: String = text.lines().next().unwrap_or("").chars().take(72).collect();
        shared.store.title_session(&id, &title).await?;
    }
    let (tx, mut rx) = mpsc::unbounded_channel::<AgentEvent>();
    let (sse, events) = mpsc::unbounded_channel::<Event>();
    let cancel = Cancel::new();
    shared
        .sessions
        .turns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .insert(id.clone(), cancel.clone());
    let turn_shared = shared.clone();
    tokio::spawn(async move {
        if let Some(live) = guard.as_mut() {
            let turn = live
                .talk
                .agent()
                .send_with_images(&text, images, &tx, &cancel);
            let _ = pump(turn, &mut rx, &mut SseSink(sse)).await;
            live.last_used = Instant::now();
        }
        turn_shared
            .sessions
            .turns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&id);
        drop(guard);
    });
    let stream = futures_util::stream::unfold(events, |mut events| async move {
        let ev = events.recv().await?;
        Some((Ok(ev), events))
    });
    Ok(Sse::new(stream).keep_alive(KeepAlive::default()))
}

/// Ends a session for good: its sandbox (if live), its log and its
/// workspace; its slot under the live-session caps is free again.
#[utoipa::path(delete, path = "/v1/sessions/{id}", tag = "sessions", summary = "Delete a conversation, its log and its workspace",
    params(("id" = String, Path)),
    responses((status = 204, description = "Deleted"), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "A turn is running", body = crate::http::ErrorResponse)))]
pub(crate) async fn delete(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<StatusCode, ApiError> {
    let row = find(&shared, &tenant, &id).await?;
    let slot = shared.sessions.slot(&id);
    let guard = slot.try_lock_owned().map_err(|_| {
        ApiError::new(
            StatusCode::CONFLICT,
            "busy",
            "a turn is running in this session; cancel it (POST /v1/sessions/{id}/cancel) and delete again",
        )
    })?;
    if !remove(&shared, &row, guard).await? {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no session {id}"),
        ));
    }
    Ok(StatusCode::NO_CONTENT)
}

/// Ends `row`'s session for good, holding its slot (`guard`): closes its
/// sandbox if live, deletes its record, log and workspace. `false` when
/// it was deleted meanwhile.
pub(crate) async fn remove(
    shared: &Shared,
    row: &SessionRow,
    mut guard: tokio::sync::OwnedMutexGuard<Option<crate::live::Live>>,
) -> Result<bool, ApiError> {
    let id = row.id.as_str();
    if let Some(live) = guard.take() {
        shared.sandboxes.unlist(&Owner::Session(id.to_string()));
        live.close().await;
    }
    if !shared.store.delete_session(&row.tenant, id).await? {
        return Ok(false);
    }
    // Deleted before its first message: the pooled sandbox it took.
    shared.pool.forget(id).await;
    // The sandbox is gone, so nothing writes here any more; remove_dir_all
    // unlinks symlinks rather than following them. Removed while the slot
    // is held, so no message that raced the delete wakes it on its files.
    crate::files::remove_files(dir(shared, id), &format!("session {id}")).await;
    shared
        .sessions
        .slots
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .remove(id);
    drop(guard);
    Ok(true)
}

#[utoipa::path(post, path = "/v1/sessions/{id}/cancel", tag = "sessions", summary = "Cancel the running turn",
    params(("id" = String, Path)),
    responses((status = 200, description = "Cancelled", body = Cancelled), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "No turn is running", body = crate::http::ErrorResponse)))]
pub(crate) async fn cancel(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<Cancelled>, ApiError> {
    find(&shared, &tenant, &id).await?;
    if cancel_turn(&shared, &id) {
        Ok(Json(Cancelled { cancelled: true }))
    } else {
        Err(ApiError::new(
            StatusCode::CONFLICT,
            "idle",
            "no turn is running in this session",
        ))
    }
}

/// `POST /v1/sessions/{id}/pause`'s answer.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
pub struct Paused {
    /// Whether its sandbox was live, and is now paused; a session whose
    /// sandbox has idled out has nothing to pause.
    pub paused: bool,
}

#[utoipa::path(post, path = "/v1/sessions/{id}/pause", tag = "sessions", summary = "Pause a session's sandbox",
    description = "Every process in the session's live sandbox stops where it is, its memory kept, until the session is next used (a message, its Lab, its files or a preview through the API), which resumes it. A paused session still idles out (`cordon serve --session-idle`), which closes its sandbox as for any session.",
    params(("id" = String, Path)),
    responses((status = 200, description = "Paused, or nothing to pause", body = Paused), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "A turn is running", body = crate::http::ErrorResponse),
              (status = 501, description = "This server cannot freeze a sandbox (no freezer cgroup)", body = crate::http::ErrorResponse)))]
pub(crate) async fn pause(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<Paused>, ApiError> {
    find(&shared, &tenant, &id).await?;
    let slot = shared.sessions.slot(&id);
    let guard = slot.try_lock_owned().map_err(|_| {
        ApiError::new(
            StatusCode::CONFLICT,
            "busy",
            "a turn is running in this session; wait for it or cancel it",
        )
    })?;
    let Some(live) = guard.as_ref() else {
        return Ok(Json(Paused { paused: false }));
    };
    live.talk.sandbox().pause().await.map_err(|e| {
        crate::http::pause_refused(e, |e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!("session {id}: cannot pause its sandbox: {e}"),
            )
        })
    })?;
    tracing::info!("session {id}: paused");
    Ok(Json(Paused { paused: true }))
}

#[utoipa::path(post, path = "/v1/sessions/{id}/resume", tag = "sessions", summary = "Resume a paused session's sandbox",
    description = "Its processes go on from where they were. Any use of the session does the same; this does it alone. A session whose sandbox idled out is woken (a new sandbox over its workspace), as a message would.",
    params(("id" = String, Path)),
    responses((status = 200, description = "Running", body = Paused), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The session is busy", body = crate::http::ErrorResponse),
              (status = 429, description = "The tenant has as many live sessions as it may", body = crate::http::ErrorResponse)))]
pub(crate) async fn resume(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<Paused>, ApiError> {
    let row = find(&shared, &tenant, &id).await?;
    drop(take_waiting(&shared, &row, std::time::Duration::from_secs(30)).await?);
    Ok(Json(Paused { paused: false }))
}

/// Cancels the session's running turn; false when none runs.
pub(crate) fn cancel_turn(shared: &Shared, id: &str) -> bool {
    let turn = shared
        .sessions
        .turns
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get(id)
        .cloned();
    match turn {
        Some(c) => {
            c.cancel();
            true
        }
        None => false,
    }
}

/// Whether the session was made by another API process of a deployment
/// of many, which keeps its log and workspace.
pub(crate) fn lives_elsewhere(shared: &Shared, id: &str) -> bool {
    shared.config.cluster.is_some() && !dir(shared, id).join("session.jsonl").exists()
}

#[utoipa::path(post, path = "/v1/sessions/{id}/compact", tag = "sessions", summary = "Summarise the conversation so far",
    params(("id" = String, Path)),
    responses((status = 200, body = Compaction), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "Busy, or nothing to compact", body = crate::http::ErrorResponse)))]
pub(crate) async fn compact(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> Result<Json<Compaction>, ApiError> {
    let row = find(&shared, &tenant, &id).await?;
    let mut guard = take(&shared, &row).await?;
    let Some(live) = guard.as_mut() else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "the session is not live",
        ));
    };
    let (tx, _rx) = mpsc::unbounded_channel();
    let result = live.talk.agent().compact(&tx, &Cancel::new()).await;
    live.last_used = Instant::now();
    match result {
        Ok(c) => Ok(Json(Compaction {
            replaced_messages: c.replaced_messages as u64,
            tokens_before: c.tokens_before,
            tokens_after: c.tokens_after,
            summary: c.summary,
        })),
        Err(e) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "cannot_compact",
            e.to_string(),
        )),
    }
}

/// Takes the session's files and conversation back to the end of a turn.
/// Its sandbox is closed first (the next message starts it again, on the
/// files as they now are).
#[utoipa::path(post, path = "/v1/sessions/{id}/rewind", tag = "sessions", summary = "Go back to the end of a turn: files and conversation",
    description = "Restores the workspace's files as the turn left them (ignored files, files over 32 MiB, `.git` and editor settings are left as they are, and listed) and continues the conversation from there. The log keeps everything, the rewind included; the files as they were are kept as a checkpoint, and `{\"undo\": true}` puts them and the conversation back.",
    params(("id" = String, Path)),
    request_body(content = RewindTo, examples(
        ("the start" = (summary = "Back to before the first message", value = json!({"turn": 0}))),
        ("undo" = (summary = "Take back the last rewind", value = json!({"undo": true}))))),
    responses((status = 200, description = "Rewound", body = Rewound), (status = 400, description = "The request says what is wrong, or the turn has no checkpoint", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "A turn is running, or the session lives on another API process", body = crate::http::ErrorResponse),
              (status = 410, description = "The turn's checkpoint was pruned: the server keeps a session's newest checkpoints within a budget (`pruned`)", body = crate::http::ErrorResponse)))]
pub(crate) async fn rewind(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<Rewound>, ApiError> {
    let to = read_json::<RewindTo>(&crate::http::within(body, shared.config.body_limit)?)?;
    let turn = match (to.turn, to.undo) {
        (Some(turn), false) => Some(turn),
        (None, true) => None,
        _ => {
            return Err(ApiError::bad_request(
                "give either `turn` (the turn to go back to) or `\"undo\": true`",
            ));
        }
    };
    let row = find(&shared, &tenant, &id).await?;
    let slot = shared.sessions.slot(&row.id);
    let mut guard = slot.try_lock_owned().map_err(|_| {
        ApiError::new(
            StatusCode::CONFLICT,
            "busy",
            "a turn is running in this session; wait for it or cancel it, then rewind",
        )
    })?;
    let d = dir(&shared, &row.id);
    let log = d.join("session.jsonl");
    if shared.config.cluster.is_some() && !log.exists() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "elsewhere",
            "this session lives on the API process of this deployment that made it: send its requests there",
        ));
    }
    if let Some(live) = guard.take() {
        // Its last checkpoint lands, and its log is closed, first.
        shared.sandboxes.unlist(&Owner::Session(row.id.clone()));
        live.close().await;
    }
    let ws = d.join("workspace");
    // The operator's retention, as the session's turns keep it.
    let retention = shared
        .config
        .agent
        .as_ref()
        .map(|a| a.agent.checkpoints)
        .unwrap_or_default();
    let volumes = shared.config.volumes();
    // A rewind opens the log before it changes anything: one that finds
    // its lock held (by a child forked a moment ago) is tried again.
    let done = open_log(
        || {
            let (log, ws) = (log.clone(), ws.clone());
            let attempt = tokio::task::spawn_blocking(move || {
                let _in_use = volumes
                    .enter(&ws)
                    .map_err(|e| RewindError::Workspace(format!("{}: {e}", ws.display())))?;
                match turn {
                    Some(turn) => cordon_agent::checkpoints::rewind(&log, &ws, turn, retention),
                    None => cordon_agent::checkpoints::undo(&log, &ws, retention),
                }
            });
            async {
                attempt.await.unwrap_or_else(|e| {
                    Err(RewindError::Workspace(format!("the rewind failed: {e}")))
                })
            }
        },
        |e| matches!(e, RewindError::Log(cordon_agent::log::LogError::Busy(_))),
    )
    .await;
    drop(guard);
    match done {
        Ok(r) => Ok(Json(Rewound {
            turn: r.to_turn,
            written: r.written as u64,
            removed: r.removed as u64,
            kept: r
                .kept
                .into_iter()
                .map(|k| KeptPath {
                    path: k.path,
                    why: k.why,
                })
                .collect(),
            checkpoint: r.checkpoint,
            before: r.before,
        })),
        Err(e @ RewindError::NoCheckpoint { .. }) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "no_checkpoint",
            e.to_string(),
        )),
        Err(e @ RewindError::NothingToUndo) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "nothing_to_undo",
            e.to_string(),
        )),
        // The operator's settings decide what is kept, not the tenant.
        Err(e @ RewindError::Pruned(_)) => {
            Err(ApiError::new(StatusCode::GONE, "pruned", e.to_string()))
        }
        Err(e) => {
            tracing::error!("session {id}: rewind: {e}");
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "the rewind failed (the server's log says why)",
            ))
        }
    }
}

/// A session's log records; 503 if it cannot be read.
fn load_log(
    path: &std::path::Path,
    id: &str,
) -> Result<Vec<cordon_agent::Record<SessionRecord>>, ApiError> {
    let (records, _) = cordon_agent::log::load::<SessionRecord>(path).map_err(|e| {
        tracing::error!("session {id}: {e}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "cannot read the session's log",
        )
    })?;
    Ok(records)
}
