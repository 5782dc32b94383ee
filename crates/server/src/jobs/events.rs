//! A job's events as Server-Sent Events: what is stored, then what
//! happens, each exactly once, resumable with `Last-Event-ID`.

use std::collections::VecDeque;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Path, Query, State};
use axum::http::HeaderMap;
use axum::response::sse::{Event, KeepAlive, Sse};
use futures_util::Stream;
use serde::Deserialize;

use crate::http::{ApiError, ApiResult, Tenant};
use crate::state::Shared;
use crate::store::StoredEvent;

use super::find;

/// Where an event stream resumes: after `Last-Event-ID`, as browsers send
/// on reconnecting, or `?after=N`.
#[derive(Deserialize)]
pub(crate) struct EventParams {
    after: Option<i64>,
}

#[utoipa::path(get, path = "/v1/jobs/{id}/events", tag = "jobs", summary = "The job's events as Server-Sent Events",
    description = "Each event has an `id` (its sequence number), a name and JSON data: the schema `JobEvent` lists each name (its `event`) with its data (`state`, `stdout`, `stderr`, `output_truncated`, `step_started`, `step_finished`, `network_refused`, `network_policy`, `error`, last `finished`); an agent job adds the agent's own events (those of `cordon exec --json`). Reconnecting with `Last-Event-ID` (or `?after=`) resumes after that event: nothing is missed or repeated.",
    params(("id" = String, Path), ("after" = Option<i64>, Query, description = "Resume after this event id"),
           ("Last-Event-ID" = Option<String>, Header, description = "Resume after this event id")),
    responses((status = 200, description = "An event stream", content_type = "text/event-stream"), (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn job_events(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
    params: Result<Query<EventParams>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Sse<impl Stream<Item = Result<Event, Infallible>>>> {
    find(&shared, &tenant, &id).await?;
    let Query(p) = params.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let after = match headers.get("last-event-id") {
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|s| s.trim().parse::<i64>().ok())
            .ok_or_else(|| ApiError::bad_request("Last-Event-ID must be an event id"))?,
        None => p.after.unwrap_or(0),
    };
    Ok(Sse::new(event_stream(shared, tenant, id, after)).keep_alive(KeepAlive::default()))
}

struct Follow {
    shared: Arc<Shared>,
    tenant: String,
    id: String,
    last: i64,
    live: Option<tokio::sync::broadcast::Receiver<StoredEvent>>,
    /// Other processes' word that a job has new events.
    pokes: tokio::sync::broadcast::Receiver<std::sync::Arc<str>>,
    queue: VecDeque<StoredEvent>,
    done: bool,
}

/// A job's events after `after`: what is stored, then what happens, each
/// exactly once, until its `finished` event.
fn event_stream(
    shared: Arc<Shared>,
    tenant: String,
    id: String,
    after: i64,
) -> impl Stream<Item = Result<Event, Infallible>> {
    let live = shared.hub.subscribe(&id);
    let pokes = shared.hub.pokes();
    let state = Follow {
        shared,
        tenant,
        id,
        last: after,
        live,
        pokes,
        queue: VecDeque::new(),
        done: false,
    };
    futures_util::stream::unfold(state, |mut s| async move {
        loop {
            if let Some(e) = s.queue.pop_front() {
                if e.seq <= s.last {
                    continue;
                }
                s.last = e.seq;
                if e.kind == "finished" {
                    s.done = true;
                }
                let event = Event::default()
                    .id(e.seq.to_string())
                    .event(e.kind.clone())
                    .data(e.data.to_string());
                return Some((Ok(event), s));
            }
            if s.done {
                return None;
            }
            // Not followed live here: has the job ended? Asked before the
            // events are read, since a job's end and its `finished` event
            // are stored in one transaction: if it has ended, the read
            // below sees every event it will ever have.
            let ended = s.live.is_none()
                && matches!(
                    s.shared.store.job(&s.tenant, &s.id).await,
                    Ok(Some(job)) if job.state.is_terminal()
                );
            // Stored events first: they include everything published
            // before we subscribed.
            match s.shared.store.events_after(&s.id, s.last, 500).await {
                Ok(page) if !page.is_empty() => {
                    s.queue.extend(page);
                    continue;
                }
                // Resumed at or past the end (`after` beyond the last
                // event): nothing more will come.
                Ok(_) if ended => return None,
                Ok(_) => {}
                Err(e) => {
                    tracing::warn!("events of {}: {e}", s.id);
                    return None;
                }
            }
            if s.live.is_none() {
                // Queued: follow it as soon as a worker opens it; running
                // in another process: the timeout makes this a poll.
                let shared = s.shared.clone();
                s.live = shared
                    .hub
                    .subscribe_within(&s.id, Duration::from_millis(250), &mut s.pokes)
                    .await;
                continue;
            }
            if let Some(rx) = s.live.as_mut() {
                match rx.recv().await {
                    Ok(e) => s.queue.push_back(e),
                    // Fell behind or the job ended: the store has it all.
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {}
                    Err(tokio::sync::broadcast::error::RecvError::Closed) => s.live = None,
                }
            }
        }
    })
}
