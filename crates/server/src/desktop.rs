//! Live views of job and session desktops: a WebSocket carrying one RFB
//! (VNC) connection to the x11vnc inside the sandbox, for noVNC in the web
//! UI or any WebSocket-capable VNC client.
//!
//! The VNC server never listens anywhere the host can reach; the bridge
//! runs a relay inside the sandbox (see `Sandbox::vnc`) and copies bytes
//! between it and the WebSocket. Access is view-only unless the viewer asks
//! for `?access=control`, and x11vnc itself drops a view-only viewer's
//! input, so a page that ignores its own switch still cannot type.

use axum::extract::ws::{CloseFrame, Message, WebSocket, WebSocketUpgrade};

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cordon_sandbox::{ExecEvent, Execution, Sandbox, VncAccess};
use futures_util::{SinkExt, StreamExt};
use serde::Deserialize;

use crate::http::ApiError;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct VncParams {
    /// `view` (the default) or `control`.
    access: Option<String>,
}

pub(crate) fn access_of(p: &VncParams) -> Result<VncAccess, ApiError> {
    match p.access.as_deref() {
        None | Some("view") => Ok(VncAccess::ViewOnly),
        Some("control") => Ok(VncAccess::Control),
        Some(other) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_request",
            format!("`access` must be `view` or `control`, not {other:?}"),
        )),
    }
}

pub(crate) type Upgrade =
    Result<WebSocketUpgrade, axum::extract::ws::rejection::WebSocketUpgradeRejection>;

/// `GET /v1/jobs/{id}/vnc`: the desktop of a running job with a display.
pub(crate) fn bad_query(e: axum::extract::rejection::QueryRejection) -> ApiError {
    ApiError::new(StatusCode::BAD_REQUEST, "invalid_request", e.body_text())
}

pub(crate) fn no_desktop(message: String) -> ApiError {
    ApiError::new(StatusCode::CONFLICT, "no_desktop", message)
}

/// Starts the in-sandbox side, then upgrades: a VNC server that cannot
/// start is a plain HTTP error the client can read.
pub(crate) async fn bridge(
    sandbox: Sandbox,
    access: VncAccess,
    upgrade: Upgrade,
) -> Result<Response, ApiError> {
    let upgrade = upgrade.map_err(|e| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "not_websocket",
            format!("this route is a WebSocket: {}", e.body_text()),
        )
    })?;
    let exec = sandbox.vnc(access).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "desktop_unavailable",
            e.to_string(),
        )
    })?;
    Ok(upgrade
        .protocols(["binary"])
        .on_upgrade(move |socket| relay(socket, exec))
        .into_response())
}

/// Copies viewer input to the relay's stdin and its stdout to the viewer.
/// The two directions run apart: waiting for stdin credit must never stop
/// output from being drained, or the relay and x11vnc could block on each
/// other.
async fn relay(socket: WebSocket, mut exec: Execution) {
    let (mut to_viewer, mut from_viewer) = socket.split();
    let stdin = exec.stdin();
    let upstream = tokio::spawn(async move {
        while let Some(Ok(msg)) = from_viewer.next().await {
            let data = match msg {
                Message::Binary(b) => b,
                // noVNC sends only binary; text is not part of RFB.
                Message::Text(_) => continue,
                Message::Close(_) => break,
                Message::Ping(_) | Message::Pong(_) => continue,
            };
            if stdin.write(&data).await.is_err() {
                break;
            }
        }
        let _ = stdin.close();
    });
    let reason = loop {
        match exec.next().await {
            Some(Ok(ExecEvent::Stdout(d))) => {
                if to_viewer.send(Message::Binary(d.into())).await.is_err() {
                    break None;
                }
            }
            Some(Ok(ExecEvent::Stderr(d))) => {
                tracing::debug!("vnc relay: {}", String::from_utf8_lossy(&d).trim());
            }
            Some(Ok(ExecEvent::Exit(_))) => break Some("the desktop closed the connection"),
            Some(Err(_)) | None => break Some("the desktop is gone"),
        }
    };
    if let Some(reason) = reason {
        let _ = to_viewer
            .send(Message::Close(Some(CloseFrame {
                code: 1000,
                reason: reason.into(),
            })))
            .await;
    }
    upstream.abort();
}
