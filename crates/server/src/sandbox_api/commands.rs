//! Commands in an API sandbox: run one and wait for it (its output as
//! JSON, or live as SSE), or start it in the background and attach to it
//! later, as often as wanted; list them; write to one's stdin; signal it.
//!
//! Output is the sandbox's to shape: it is carried as text (invalid UTF-8
//! replaced), never interpreted.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::sse::{Event, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use futures_util::Stream;
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast::error::RecvError;
use utoipa::ToSchema;

use super::live;
use crate::boxes::{Ended, ProcEvent, Process};
use crate::http::{ApiError, ApiResult, Tenant, Timestamp, read_json};
use crate::state::Shared;

/// `POST /v1/sandboxes/{id}/commands`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct RunCommand {
    /// A command line, run by bash (by sh in an image without bash).
    #[schema(example = "python3 -c 'print(6 * 7)'")]
    pub cmd: String,
    /// Variables for this command, over the sandbox's own.
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Its working directory (default `/workspace`).
    #[serde(default)]
    pub cwd: Option<String>,
    /// Written to its stdin, which is then closed unless `stdin_open`.
    #[serde(default)]
    pub stdin: Option<String>,
    /// Leave stdin open for `POST …/commands/{pid}/stdin`.
    #[serde(default)]
    pub stdin_open: bool,
    /// Seconds before it is killed (exit code 124), 1 up to the server's
    /// maximum; none by default but the sandbox's own end.
    #[serde(default)]
    #[schema(minimum = 1)]
    pub timeout_secs: Option<u64>,
    /// Answer at once with its pid (202), and let it run: follow it with
    /// `GET …/commands/{pid}/events`.
    #[serde(default)]
    pub background: bool,
}

/// A process started through the API.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessView {
    /// Its pid inside the sandbox.
    pub pid: i32,
    pub cmd: String,
    pub started_at: Timestamp,
    /// `running` or `exited`.
    pub state: &'static str,
    pub exit_code: Option<i32>,
}

impl ProcessView {
    fn of(p: &Process) -> ProcessView {
        let ended = p.ended();
        ProcessView {
            pid: p.pid,
            cmd: p.started.cmd.clone(),
            started_at: Timestamp::at(p.started_ms),
            state: if ended.is_some() { "exited" } else { "running" },
            exit_code: ended.map(|e| e.exit_code),
        }
    }
}

/// `GET …/commands`.
#[derive(Debug, Serialize, ToSchema)]
pub struct ProcessList {
    pub processes: Vec<ProcessView>,
}

/// A command's end, with its output (the newest MiB of each stream).
#[derive(Debug, Serialize, ToSchema)]
pub struct CommandResult {
    pub pid: i32,
    /// Its exit status (128 + N for signal N), or cordon's: 122 out of
    /// memory, 124 past its timeout.
    pub exit_code: i32,
    pub stdout: String,
    pub stderr: String,
    /// Output bytes dropped from the front to keep within the bound.
    pub dropped: u64,
    pub timed_out: bool,
    pub oom_killed: bool,
}

/// `POST …/commands/{pid}/signal`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct SignalRequest {
    /// A name (`SIGTERM`, `TERM`, `SIGKILL`, `SIGINT`, `SIGHUP`, `SIGQUIT`,
    /// `SIGUSR1`, `SIGUSR2`, `SIGSTOP`, `SIGCONT`) or a number.
    #[schema(value_type = String, example = "SIGTERM")]
    pub signal: serde_json::Value,
}

/// `POST …/commands/{pid}/stdin`'s query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct StdinQuery {
    /// Close stdin after the body is written.
    #[serde(default)]
    close: bool,
}

/// The path of one process.
#[derive(Deserialize)]
pub(crate) struct ProcPath {
    id: String,
    pid: String,
}

fn process(b: &crate::boxes::LiveBox, pid: &str) -> ApiResult<Arc<Process>> {
    pid.parse::<i32>()
        .ok()
        .and_then(|pid| b.process(pid))
        .ok_or_else(|| ApiError::not_found(&format!("process {pid} started through the API")))
}

fn signal_number(v: &serde_json::Value) -> ApiResult<i32> {
    const NAMES: [(&str, i32); 10] = [
        ("HUP", 1),
        ("INT", 2),
        ("QUIT", 3),
        ("KILL", 9),
        ("USR1", 10),
        ("USR2", 12),
        ("TERM", 15),
        ("CONT", 18),
        ("STOP", 19),
        ("WINCH", 28),
    ];
    let n = match v {
        serde_json::Value::Number(n) => n.as_i64().and_then(|n| i32::try_from(n).ok()),
        serde_json::Value::String(s) => {
            let name = s.strip_prefix("SIG").unwrap_or(s);
            NAMES.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
        }
        _ => None,
    };
    n.filter(|n| (1..=64).contains(n))
        .ok_or_else(|| ApiError::bad_request(format!("{v} is no signal: SIGTERM, 15, …")))
}

fn text(d: &[u8]) -> String {
    String::from_utf8_lossy(d).into_owned()
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands", tag = "sandboxes", summary = "Run a command in a sandbox",
    description = "Runs `cmd` by bash in the sandbox. By default answers when it ends, with its exit code and output (JSON); with `Accept: text/event-stream`, streams `start` (its pid), `stdout`, `stderr` and `exit` events as it runs; with `background`, answers 202 at once with its pid. A process started here can be listed, followed again, written to and signalled until the sandbox ends.",
    params(("id" = String, Path)),
    request_body(content = RunCommand, example = json!({"cmd": "echo hello from the sandbox && uname -a"})),
    responses((status = 200, body = CommandResult, description = "It ended (JSON), or its events (SSE)"),
              (status = 202, body = ProcessView, description = "Started in the background"),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse),
              (status = 422, description = "The command could not start (no such directory, …)", body = crate::http::ErrorResponse)))]
pub(crate) async fn run_command(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = crate::http::within(body, shared.config.body_limit)?;
    let asked: RunCommand = read_json(&body)?;
    if asked.cmd.trim().is_empty() || asked.cmd.contains('\0') {
        return Err(ApiError::bad_request(
            "`cmd` must be a command line, without NUL bytes",
        ));
    }
    super::view::check_env(&asked.env)?;
    let max = shared.config.bounds.max_timeout_secs;
    if asked.timeout_secs.is_some_and(|t| !(1..=max).contains(&t)) {
        return Err(ApiError::bad_request(format!(
            "`timeout_secs` must be a whole number of seconds from 1 to {max}"
        )));
    }
    let b = live(&shared, &tenant, &id).await?;
    let mut req = cordon_sandbox::ExecRequest::bash(&asked.cmd)
        .cwd(asked.cwd.clone().unwrap_or_else(|| "/workspace".into()))
        .stream_stdin();
    for (k, v) in &asked.env {
        req = req.env(k.clone(), v.clone());
    }
    if let Some(t) = asked.timeout_secs {
        req = req.timeout(std::time::Duration::from_secs(t));
    }
    let exec = b
        .sandbox
        .exec_stream(req)
        .await
        .map_err(|e| start_error(&id, e))?;
    let started = crate::boxes::Started {
        cmd: asked.cmd.clone(),
        env: asked.env.clone(),
        cwd: asked.cwd.clone(),
        ..Default::default()
    };
    let p = Process::follow(started, exec);
    b.add(p.clone());
    // Written by a task of its own: a command that reads slowly holds
    // its writer, not this answer.
    let control = p.control().clone();
    let (input, keep) = (asked.stdin.clone(), asked.stdin_open);
    tokio::spawn(async move {
        if let Some(input) = input {
            let _ = control.write(input.as_bytes()).await;
        }
        if !keep {
            let _ = control.close();
        }
    });
    if asked.background {
        return Ok((StatusCode::ACCEPTED, Json(ProcessView::of(&p))).into_response());
    }
    if wants_events(&headers) {
        return Ok(events(p, None).into_response());
    }
    Ok(Json(wait(&p).await).into_response())
}

/// Why a command did not start, as the API answers it.
pub(crate) fn start_error(id: &str, e: cordon_sandbox::Error) -> ApiError {
    match e {
        cordon_sandbox::Error::Exec { .. } => ApiError::new(
            StatusCode::UNPROCESSABLE_ENTITY,
            "cannot_start",
            e.to_string(),
        ),
        cordon_sandbox::Error::Gone => ApiError::new(
            StatusCode::CONFLICT,
            "not_running",
            format!("sandbox {id} has ended"),
        ),
        e => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "sandbox_error",
            e.to_string(),
        ),
    }
}

fn wants_events(headers: &HeaderMap) -> bool {
    headers
        .get(header::ACCEPT)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.contains("text/event-stream"))
}

/// Waits for `p` to end, with what it wrote.
async fn wait(p: &Process) -> CommandResult {
    let (kept, dropped, mut rx) = p.attach();
    let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
    let mut take = |e: ProcEvent| -> Option<Ended> {
        match e {
            ProcEvent::Stdout(d) => stdout.extend(d),
            ProcEvent::Stderr(d) => stderr.extend(d),
            ProcEvent::Exit(end) => return Some(end),
        }
        None
    };
    let mut ended = kept.into_iter().find_map(|(_, e)| take(e));
    let mut lost = 0u64;
    while ended.is_none() {
        match rx.recv().await {
            Ok((_, e)) => ended = take(e),
            // Fell behind: what was missed is counted, the end awaited.
            Err(RecvError::Lagged(n)) => lost += n,
            Err(RecvError::Closed) => break,
        }
    }
    let end = ended.or_else(|| p.ended()).unwrap_or_else(Ended::lost);
    CommandResult {
        pid: p.pid,
        exit_code: end.exit_code,
        stdout: text(&stdout),
        stderr: text(&stderr),
        dropped: dropped + lost,
        timed_out: end.timed_out,
        oom_killed: end.oom_killed,
    }
}

fn event((n, e): &(u64, ProcEvent)) -> Event {
    let (name, data) = match e {
        ProcEvent::Stdout(d) => ("stdout", serde_json::json!({ "text": text(d) })),
        ProcEvent::Stderr(d) => ("stderr", serde_json::json!({ "text": text(d) })),
        ProcEvent::Exit(end) => (
            "exit",
            serde_json::json!({
                "exit_code": end.exit_code,
                "timed_out": end.timed_out,
                "oom_killed": end.oom_killed,
            }),
        ),
    };
    Event::default()
        .id(n.to_string())
        .event(name)
        .data(data.to_string())
}

/// `p`'s events after number `after`: `start` (number 0), then what was
/// kept, then what comes, to its end.
fn events(
    p: Arc<Process>,
    after: Option<u64>,
) -> Sse<impl Stream<Item = Result<Event, Infallible>>> {
    let (kept, dropped, rx) = p.attach();
    let mut first = Vec::new();
    if after.is_none() {
        first.push(
            Event::default()
                .id("0")
                .event("start")
                .data(serde_json::json!({ "pid": p.pid, "dropped": dropped }).to_string()),
        );
    }
    let after = after.unwrap_or(0);
    let ended = kept.iter().any(|(_, e)| matches!(e, ProcEvent::Exit(_)));
    first.extend(kept.iter().filter(|(n, _)| *n > after).map(event));
    let head = futures_util::stream::iter(first.into_iter().map(Ok));
    let tail = futures_util::stream::unfold((rx, ended), |(mut rx, done)| async move {
        if done {
            return None;
        }
        match rx.recv().await {
            Ok(e) => {
                let done = matches!(e.1, ProcEvent::Exit(_));
                Some((Ok(event(&e)), (rx, done)))
            }
            Err(RecvError::Lagged(n)) => {
                let e = Event::default()
                    .event("error")
                    .data(serde_json::json!({ "message": format!("fell behind by {n} events; attach again") }).to_string());
                Some((Ok(e), (rx, true)))
            }
            Err(RecvError::Closed) => None,
        }
    });
    Sse::new(futures_util::StreamExt::chain(head, tail)).keep_alive(KeepAlive::default())
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands", tag = "sandboxes", summary = "The processes started in a sandbox through the API",
    description = "Those running, and the last 64 that ended.",
    params(("id" = String, Path)),
    responses((status = 200, body = ProcessList),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_processes(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<ProcessList>> {
    let b = live(&shared, &tenant, &id).await?;
    let processes = b.processes().iter().map(|p| ProcessView::of(p)).collect();
    Ok(Json(ProcessList { processes }))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/commands/{pid}/events", tag = "sandboxes", summary = "Follow a process (SSE)",
    description = "`start` (with how many bytes of its output were dropped before what follows), then its output kept so far (the newest MiB), then what comes, to `exit`. Each event has an id: with `Last-Event-ID`, only those after it come (and no `start`). As often as wanted, by as many clients.",
    params(("id" = String, Path), ("pid" = i32, Path)),
    responses((status = 200, description = "Its events", content_type = "text/event-stream"),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox or process", body = crate::http::ErrorResponse),
              (status = 409, description = "The sandbox has ended", body = crate::http::ErrorResponse)))]
pub(crate) async fn follow_process(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(ProcPath { id, pid }): Path<ProcPath>,
    headers: HeaderMap,
) -> ApiResult<Response> {
    let after = headers
        .get("last-event-id")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    let b = live(&shared, &tenant, &id).await?;
    Ok(events(process(&b, &pid)?, after).into_response())
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{pid}/stdin", tag = "sandboxes", summary = "Write to a process's stdin",
    description = "The body's bytes, in order with earlier writes; `?close=true` closes stdin after them. Only a process started with `stdin_open` takes them.",
    params(("id" = String, Path), ("pid" = i32, Path), StdinQuery),
    request_body(content = Vec<u8>, content_type = "application/octet-stream", example = json!("2 + 2\n")),
    responses((status = 204, description = "Written"),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox or process", body = crate::http::ErrorResponse),
              (status = 409, description = "The process or sandbox has ended", body = crate::http::ErrorResponse)))]
pub(crate) async fn write_stdin(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(ProcPath { id, pid }): Path<ProcPath>,
    query: Result<Query<StdinQuery>, axum::extract::rejection::QueryRejection>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StatusCode> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let body = crate::http::within(body, shared.config.file_limit)?;
    let b = live(&shared, &tenant, &id).await?;
    let p = process(&b, &pid)?;
    let ended = || {
        ApiError::new(
            StatusCode::CONFLICT,
            "exited",
            format!("process {pid} has exited"),
        )
    };
    if p.ended().is_some() {
        return Err(ended());
    }
    p.control().write(&body).await.map_err(|_| ended())?;
    if q.close {
        p.control().close().map_err(|_| ended())?;
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/commands/{pid}/signal", tag = "sandboxes", summary = "Signal a process (and its group)",
    params(("id" = String, Path), ("pid" = i32, Path)),
    request_body(content = SignalRequest, example = json!({"signal": "SIGTERM"})),
    responses((status = 204, description = "Sent"),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox or process", body = crate::http::ErrorResponse),
              (status = 409, description = "The process or sandbox has ended", body = crate::http::ErrorResponse)))]
pub(crate) async fn signal_process(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(ProcPath { id, pid }): Path<ProcPath>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<StatusCode> {
    let body = crate::http::within(body, shared.config.body_limit)?;
    let asked: SignalRequest = read_json(&body)?;
    let n = signal_number(&asked.signal)?;
    let b = live(&shared, &tenant, &id).await?;
    let p = process(&b, &pid)?;
    if p.ended().is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "exited",
            format!("process {pid} has exited"),
        ));
    }
    p.control()
        .signal(n)
        .map_err(|e| ApiError::new(StatusCode::CONFLICT, "not_running", e.to_string()))?;
    Ok(StatusCode::NO_CONTENT)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_are_named_or_numbered_and_checked() {
        let n = |v: serde_json::Value| signal_number(&v).ok();
        assert_eq!(n(serde_json::json!("SIGTERM")), Some(15));
        assert_eq!(n(serde_json::json!("KILL")), Some(9));
        assert_eq!(n(serde_json::json!(2)), Some(2));
        for bad in [
            serde_json::json!("SIGBOGUS"),
            serde_json::json!(0),
            serde_json::json!(65),
            serde_json::json!(-9),
            serde_json::json!(null),
        ] {
            assert_eq!(n(bad.clone()), None, "{bad}");
        }
    }
}
