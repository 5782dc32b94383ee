//! A terminal in an API sandbox, over a WebSocket: a shell (or `cmd`) on a
//! pseudo-terminal. Binary messages from the client are its keyboard; text
//! messages are JSON controls (`{"resize": {"rows": R, "cols": C}}`);
//! binary messages to the client are the terminal's output, and a last
//! text message `{"exit_code": N}` comes before the close. The terminal is
//! a process of the sandbox's like any other: listed, followed again,
//! signalled through the commands routes.

use std::sync::Arc;

use axum::extract::ws::{CloseFrame, Message, WebSocket};
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;
use tokio::sync::broadcast::error::RecvError;

use super::live;
use crate::boxes::{ProcEvent, Process};
use crate::desktop::Upgrade;
use crate::http::{ApiError, ApiResult, Tenant};
use crate::state::Shared;

/// The largest terminal, in rows and in columns.
const MAX_SIDE: u16 = 1000;

/// `GET /v1/sandboxes/{id}/pty`'s query.
#[derive(Debug, Default, Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct PtyQuery {
    /// Rows (24 unless given).
    rows: Option<u16>,
    /// Columns (80 unless given).
    cols: Option<u16>,
    /// A command line to run on it instead of a login shell.
    cmd: Option<String>,
    /// Its working directory (default `/workspace`).
    cwd: Option<String>,
}

/// A text message from the client.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Control {
    resize: Size,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Size {
    rows: u16,
    cols: u16,
}

fn side(v: Option<u16>, default: u16, what: &str) -> ApiResult<u16> {
    let v = v.unwrap_or(default);
    if (1..=MAX_SIDE).contains(&v) {
        Ok(v)
    } else {
        Err(ApiError::bad_request(format!(
            "`{what}` must be from 1 to {MAX_SIDE}"
        )))
    }
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/pty", tag = "sandboxes",
    summary = "A terminal in a sandbox (WebSocket)",
    description = "A login shell (or `cmd`) on a pseudo-terminal. Binary messages from the client are typed in; text messages are JSON controls, `{\"resize\": {\"rows\": R, \"cols\": C}}`. Binary messages from the server are the terminal's output, and a text message `{\"exit_code\": N}` comes before the close. Browsers may send the token as the subprotocol `cordon.bearer.<token>`. The terminal is a process like any other (`GET …/commands`).",
    params(("id" = String, Path), PtyQuery),
    responses((status = 101, description = "Switching to the WebSocket"),
              (status = 400, description = "Bad size, or not a WebSocket request", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse),
              (status = 422, description = "The command could not start", body = crate::http::ErrorResponse)))]
pub(crate) async fn open_pty(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    query: Result<Query<PtyQuery>, axum::extract::rejection::QueryRejection>,
    upgrade: Upgrade,
) -> ApiResult<Response> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let rows = side(q.rows, 24, "rows")?;
    let cols = side(q.cols, 80, "cols")?;
    if q.cmd
        .as_deref()
        .is_some_and(|c| c.trim().is_empty() || c.contains('\0'))
    {
        return Err(ApiError::bad_request(
            "`cmd` must be a command line, without NUL bytes",
        ));
    }
    let upgrade = upgrade.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "not_websocket",
            format!("this route is a WebSocket: {}", e.body_text()),
        )
    })?;
    let b = live(&shared, &tenant, &id).await?;
    let (label, req) = match &q.cmd {
        Some(cmd) => (cmd.clone(), cordon_sandbox::ExecRequest::bash(cmd)),
        None => (
            "(terminal)".to_string(),
            cordon_sandbox::ExecRequest::argv([
                "/bin/sh",
                "-c",
                "if command -v bash >/dev/null 2>&1; then exec bash -il; fi; exec sh -i",
            ]),
        ),
    };
    let req = req
        .cwd(q.cwd.clone().unwrap_or_else(|| "/workspace".into()))
        .env("TERM", "xterm-256color")
        .pty(rows, cols)
        .stream_stdin();
    let exec = b
        .sandbox
        .exec_stream(req)
        .await
        .map_err(|e| super::commands::start_error(&id, e))?;
    let started = crate::boxes::Started {
        cmd: label,
        cwd: q.cwd.clone(),
        pty: true,
        ..Default::default()
    };
    let p = Process::follow(started, exec);
    b.add(p.clone());
    Ok(upgrade
        .protocols(["binary"])
        .on_upgrade(move |socket| relay(socket, p))
        .into_response())
}

/// Keys and controls in, output out, until the terminal's process ends or
/// the client goes (which hangs the terminal up).
async fn relay(socket: WebSocket, p: Arc<Process>) {
    let (mut to_client, mut from_client) = socket.split();
    let control = p.control().clone();
    let upstream = tokio::spawn(async move {
        while let Some(Ok(msg)) = from_client.next().await {
            match msg {
                Message::Binary(b) => {
                    if control.write(&b).await.is_err() {
                        return;
                    }
                }
                Message::Text(t) => {
                    // A control the server does not know is dropped: the
                    // terminal is the client's, not this relay's.
                    if let Ok(c) = serde_json::from_str::<Control>(&t) {
                        let rows = c.resize.rows.clamp(1, MAX_SIDE);
                        let cols = c.resize.cols.clamp(1, MAX_SIDE);
                        let _ = control.resize(rows, cols);
                    }
                }
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => {}
            }
        }
        // The client went: the terminal is hung up, as a closed window's.
        let _ = control.signal(1);
    });
    let (kept, _, mut rx) = p.attach();
    let mut pending = kept.into_iter();
    let reason = loop {
        let next = match pending.next() {
            Some(e) => Ok(e),
            None => rx.recv().await,
        };
        match next {
            Ok((_, ProcEvent::Stdout(d) | ProcEvent::Stderr(d))) => {
                if to_client.send(Message::Binary(d.into())).await.is_err() {
                    break None;
                }
            }
            Ok((_, ProcEvent::Exit(end))) => {
                let done = serde_json::json!({ "exit_code": end.exit_code }).to_string();
                let _ = to_client.send(Message::Text(done.into())).await;
                break Some("the terminal's process ended");
            }
            Err(RecvError::Lagged(_)) => break Some("the client fell behind the terminal"),
            Err(RecvError::Closed) => break Some("the sandbox ended"),
        }
    };
    if let Some(reason) = reason {
        let _ = to_client
            .send(Message::Close(Some(CloseFrame {
                code: 1000,
                reason: reason.into(),
            })))
            .await;
    }
    upstream.abort();
}
