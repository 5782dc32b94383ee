//! HTTP and WebSocket to a server inside a sandbox: its JupyterLab, or
//! whatever listens on a port of its loopback (a preview).
//!
//! Each upstream connection to Jupyter is one relay exec (see
//! [`cordon_sandbox::Sandbox::connect_unix`]) speaking HTTP/1.1 to its
//! socket; one to a port is a stream the sandbox's supervisor connects from
//! inside ([`cordon_sandbox::Sandbox::connect_tcp`]). Idle ones are kept for
//! the next request, because a page load is dozens of requests. A
//! WebSocket (kernels, terminals) gets a connection of its own, upgraded
//! on both sides, and bytes are copied until either end closes.
//!
//! What answers is the sandbox's to shape, so both directions are
//! filtered: cordon's credentials (the `Authorization` header, a token
//! offered as a WebSocket subprotocol, cordon's own cookies) never reach
//! the sandbox, and the sandbox cannot set cordon's cookies.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use axum::body::Body;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use cordon_net::{is_websocket_upgrade, keep_list_items, mark_websocket_upgrade, strip_hop_by_hop};
use cordon_sandbox::{ExecEvent, Sandbox};

use crate::jupyter::SOCKET;
use crate::site::{COOKIE_PREFIX, Forward, Forwarding};

/// The prefix of a bearer token offered as a WebSocket subprotocol.
const BEARER_PROTOCOL: &str = "cordon.bearer.";

/// Idle connections kept per Lab.
const IDLE_MAX: usize = 8;

/// Bytes buffered between hyper and a relay, each way.
const PIPE: usize = 64 * 1024;

/// What in the sandbox answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Target {
    /// JupyterLab, on its Unix socket.
    Jupyter,
    /// Whatever listens on this port of the sandbox's loopback.
    Port(u16),
}

/// A server in a sandbox, as the host reaches it.
pub struct Upstream {
    sandbox: Sandbox,
    target: Target,
    idle: Mutex<Vec<SendRequest<Body>>>,
    /// When a request last came.
    used: Mutex<Instant>,
    /// The WebSockets' copies, stopped when this is dropped.
    sockets: Mutex<tokio::task::JoinSet<()>>,
}

impl Upstream {
    /// The sandbox's JupyterLab.
    pub fn new(sandbox: Sandbox) -> Upstream {
        Upstream::to(sandbox, Target::Jupyter)
    }

    /// What listens on `port` of the sandbox's loopback. It is asked as
    /// `localhost:PORT`, the name a dev server expects (and checks), with
    /// the name the browser used in `X-Forwarded-Host`.
    pub fn port(sandbox: Sandbox, port: u16) -> Upstream {
        Upstream::to(sandbox, Target::Port(port))
    }

    fn to(sandbox: Sandbox, target: Target) -> Upstream {
        Upstream {
            sandbox,
            target,
            idle: Mutex::new(Vec::new()),
            used: Mutex::new(Instant::now()),
            sockets: Mutex::new(tokio::task::JoinSet::new()),
        }
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    async fn send(&self, mut req: Request<Body>) -> Response<Body> {
        *lock(&self.used) = Instant::now();
        if self.sandbox.is_paused() {
            // Its processes answer nothing until it is resumed: said at
            // once rather than left to wait.
            return self.bad_gateway("the sandbox is paused (resume it first)");
        }
        let websocket = is_websocket_upgrade(req.headers());
        let downstream = websocket.then(|| hyper::upgrade::on(&mut req));
        clean_request(req.headers_mut(), websocket);
        if let Target::Port(port) = self.target {
            let h = req.headers_mut();
            if let Some(host) = h.remove(header::HOST) {
                h.insert("x-forwarded-host", host);
            }
            if let Ok(v) = HeaderValue::from_str(&format!("localhost:{port}")) {
                h.insert(header::HOST, v);
            }
        }
        let mut sender = match self.sender(websocket).await {
            Ok(s) => s,
            Err(e) => return self.bad_gateway(&e),
        };
        let mut resp = match sender.send_request(req).await {
            Ok(r) => r,
            Err(e) => return self.bad_gateway(&format!("the connection failed: {e}")),
        };
        if !websocket {
            self.keep(sender);
        }
        let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        let upstream = (websocket && switching).then(|| hyper::upgrade::on(&mut resp));
        let (mut parts, body) = resp.into_parts();
        clean_response(&mut parts.headers, websocket && switching);
        if let (Some(up), Some(down)) = (upstream, downstream) {
            let mut sockets = lock(&self.sockets);
            // Reap the finished ones as new ones come.
            while sockets.try_join_next().is_some() {}
            sockets.spawn(async move {
                let (Ok(up), Ok(down)) = tokio::join!(up, down) else {
                    return;
                };
                let mut up = TokioIo::new(up);
                let mut down = TokioIo::new(down);
                let _ = tokio::io::copy_bidirectional(&mut down, &mut up).await;
            });
        }
        Response::from_parts(parts, Body::new(body))
    }

    /// An idle connection ready for a request, else a new one. A WebSocket
    /// always gets a new one: it is never given back.
    async fn sender(&self, websocket: bool) -> Result<SendRequest<Body>, String> {
        if !websocket {
            let mut idle = lock(&self.idle);
            idle.retain(|s| !s.is_closed());
            if let Some(i) = idle.iter().position(SendRequest::is_ready) {
                return Ok(idle.swap_remove(i));
            }
        }
        self.open().await
    }

    fn keep(&self, sender: SendRequest<Body>) {
        let mut idle = lock(&self.idle);
        if idle.len() < IDLE_MAX {
            idle.push(sender);
        }
    }

    /// A new HTTP/1.1 connection.
    async fn open(&self) -> Result<SendRequest<Body>, String> {
        let io = match self.target {
            Target::Jupyter => self.relay().await?,
            Target::Port(port) => self
                .sandbox
                .connect_tcp(port)
                .await
                .map_err(|e| format!("cannot reach port {port} in the sandbox: {e}"))?,
        };
        let (sender, conn) = http1::Builder::new()
            .handshake(TokioIo::new(io))
            .await
            .map_err(|e| format!("cannot speak HTTP to the sandbox: {e}"))?;
        tokio::spawn(async move {
            if let Err(e) = conn.with_upgrades().await {
                tracing::debug!("upstream connection: {e}");
            }
        });
        Ok(sender)
    }

    /// A stream to Jupyter's socket through a relay exec.
    async fn relay(&self) -> Result<tokio::io::DuplexStream, String> {
        let mut exec = self
            .sandbox
            .connect_unix(SOCKET)
            .await
            .map_err(|e| format!("cannot reach the sandbox: {e}"))?;
        let (ours, theirs) = tokio::io::duplex(PIPE);
        let (mut from_hyper, mut to_hyper) = tokio::io::split(theirs);
        let stdin = exec.stdin();
        tokio::spawn(async move {
            let mut buf = vec![0; PIPE];
            while let Ok(n) = from_hyper.read(&mut buf).await {
                if n == 0 || stdin.write(&buf[..n]).await.is_err() {
                    break;
                }
            }
            let _ = stdin.close();
        });
        tokio::spawn(async move {
            while let Some(Ok(event)) = exec.next().await {
                match event {
                    ExecEvent::Stdout(d) => {
                        if to_hyper.write_all(&d).await.is_err() {
                            break;
                        }
                    }
                    // The relay's own complaint (nothing listens): the
                    // sandbox's bytes, logged escaped.
                    ExecEvent::Stderr(d) => {
                        tracing::debug!("lab relay: {:?}", String::from_utf8_lossy(&d));
                    }
                    ExecEvent::Exit(_) => break,
                }
            }
            let _ = to_hyper.shutdown().await;
        });
        Ok(ours)
    }

    fn bad_gateway(&self, why: &str) -> Response<Body> {
        let what = match self.target {
            Target::Jupyter => "JupyterLab in the sandbox".to_string(),
            Target::Port(port) => format!("Nothing in the sandbox on port {port}"),
        };
        let mut resp = Response::new(Body::from(format!("{what} did not answer: {why}\n")));
        *resp.status_mut() = StatusCode::BAD_GATEWAY;
        resp.headers_mut().insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("text/plain; charset=utf-8"),
        );
        resp
    }
}

impl Forward for Upstream {
    fn forward(&self, req: Request<Body>) -> Forwarding<'_> {
        Box::pin(self.send(req))
    }

    fn idle(&self) -> Duration {
        lock(&self.used).elapsed()
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Drops what concerns only the hop to cordon, and cordon's credentials:
/// what any hop from a Lab's listener on must do.
pub fn clean_request(headers: &mut HeaderMap, websocket: bool) {
    strip_hop_by_hop(headers);
    headers.remove(header::AUTHORIZATION);
    keep_list_items(headers, header::COOKIE, ';', "; ", |c| {
        !cookie_name(c).starts_with(COOKIE_PREFIX)
    });
    keep_list_items(headers, header::SEC_WEBSOCKET_PROTOCOL, ',', ", ", |p| {
        !p.starts_with(BEARER_PROTOCOL)
    });
    if websocket {
        mark_websocket_upgrade(headers);
    }
}

/// Drops the hop's headers and any cookie of cordon's the sandbox sets.
pub fn clean_response(headers: &mut HeaderMap, switching: bool) {
    strip_hop_by_hop(headers);
    let kept: Vec<HeaderValue> = headers
        .get_all(header::SET_COOKIE)
        .iter()
        .filter(|v| {
            v.to_str().is_ok_and(|v| {
                !cookie_name(v)
                    .to_ascii_lowercase()
                    .starts_with(COOKIE_PREFIX)
            })
        })
        .cloned()
        .collect();
    headers.remove(header::SET_COOKIE);
    for v in kept {
        headers.append(header::SET_COOKIE, v);
    }
    if switching {
        mark_websocket_upgrade(headers);
    }
}

/// A cookie's name, from `name=value` or a `Set-Cookie` line; browsers
/// trim the whitespace around it.
fn cookie_name(cookie: &str) -> &str {
    cookie.split('=').next().unwrap_or("").trim()
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderName;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.append(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn cordons_credentials_never_go_upstream() {
        let mut h = headers(&[
            ("authorization", "Bearer secret"),
            ("cookie", "_xsrf=abc; cordon_lab_4242=secret"),
            ("cookie", " cordon_lab=x;username-1=u"),
            (
                "sec-websocket-protocol",
                "cordon.bearer.secret, v1.kernel.websocket.jupyter.org",
            ),
            ("connection", "keep-alive, x-private"),
            ("x-private", "hop"),
            ("host", "127.0.0.1:9000"),
        ]);
        clean_request(&mut h, false);
        let all = format!("{h:?}");
        assert!(!all.contains("secret"), "{all}");
        assert_eq!(h["cookie"], "_xsrf=abc; username-1=u");
        assert_eq!(
            h["sec-websocket-protocol"],
            "v1.kernel.websocket.jupyter.org"
        );
        assert!(h.get("x-private").is_none() && h.get("connection").is_none());
        assert_eq!(h["host"], "127.0.0.1:9000");
    }

    #[test]
    fn the_sandbox_cannot_set_cordons_cookies() {
        let mut h = headers(&[
            ("set-cookie", "_xsrf=1; Path=/"),
            ("set-cookie", " Cordon_Lab_9=stolen; Path=/"),
            ("set-cookie", "cordon_lab=x"),
            ("transfer-encoding", "chunked"),
        ]);
        clean_response(&mut h, false);
        let kept: Vec<_> = h.get_all("set-cookie").iter().collect();
        assert_eq!(kept, ["_xsrf=1; Path=/"]);
        assert!(h.get("transfer-encoding").is_none());
    }

    #[test]
    fn only_a_websocket_upgrade_is_one() {
        assert!(is_websocket_upgrade(&headers(&[
            ("connection", "keep-alive, Upgrade"),
            ("upgrade", "websocket")
        ])));
        assert!(!is_websocket_upgrade(&headers(&[("upgrade", "websocket")])));
        assert!(!is_websocket_upgrade(&headers(&[
            ("connection", "upgrade"),
            ("upgrade", "h2c")
        ])));
    }
}
