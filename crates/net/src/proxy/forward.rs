//! Plain HTTP: absolute-form requests forwarded in origin form. The
//! upstream connection of a sandbox stream's request is kept for that
//! stream's next request to the same host and port (a package manager's
//! hundreds of small downloads would each pay a new connection otherwise),
//! after the policy is checked again for it; hyper frames every response,
//! so one cannot run into the next.

use hyper::body::Body as _;
use hyper::client::conn::http1::SendRequest;

use super::*;

/// How long a kept upstream connection may take to show it is idle.
const REUSE_WAIT: Duration = Duration::from_secs(1);

/// An upstream connection kept for the next plain request.
pub(super) struct Kept {
    host: Host,
    port: u16,
    addr: SocketAddr,
    sender: SendRequest<Incoming>,
    /// The connection's bytes, of which each request reports its own.
    meter: Arc<Meter>,
}

/// A forwarded response's body, which reports its request when it ends:
/// read whole (`Listed`), or cut short (`Broken`, `BrokerClosed`).
struct Reported {
    body: Incoming,
    report: Option<Report>,
}

/// What a request's event says, known when its response began.
struct Report {
    inner: Arc<Inner>,
    host: String,
    port: u16,
    method: String,
    started: Instant,
    addr: SocketAddr,
    meter: Arc<Meter>,
    /// The connection's totals when the request began.
    base: (u64, u64),
}

impl Reported {
    fn finish(&mut self, whole: bool) {
        let Some(r) = self.report.take() else {
            return;
        };
        let closed = *r.inner.closed.borrow();
        let reason = match (whole, closed) {
            (true, _) => Reason::Listed,
            (false, true) => Reason::BrokerClosed,
            (false, false) => Reason::Broken,
        };
        let (up, down) = r.meter.totals();
        let (up, down) = (up.saturating_sub(r.base.0), down.saturating_sub(r.base.1));
        let line = if whole {
            format!(
                "network: {}:{} allowed ({up} bytes up, {down} down)",
                r.host, r.port
            )
        } else {
            format!(
                "network: {}:{} allowed, connection broken ({up} bytes up, {down} down)",
                r.host, r.port
            )
        };
        let s = Subject {
            host: &r.host,
            port: r.port,
            method: &r.method,
            started: r.started,
        };
        let mut ev = r.inner.event(
            &s,
            Decision::Allowed,
            reason,
            Some(r.addr),
            None,
            line,
            false,
        );
        (ev.bytes_up, ev.bytes_down) = (up, down);
        r.inner.send(ev);
    }
}

impl hyper::body::Body for Reported {
    type Data = Bytes;
    type Error = hyper::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<hyper::body::Frame<Bytes>, hyper::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        match &polled {
            std::task::Poll::Ready(None) => self.finish(true),
            std::task::Poll::Ready(Some(Err(_))) => self.finish(false),
            _ => {}
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> hyper::body::SizeHint {
        self.body.size_hint()
    }
}

impl Drop for Reported {
    fn drop(&mut self) {
        // A body the server never polled to its end because it had none
        // (204, HEAD) was whole all the same.
        let whole = self.body.is_end_stream();
        self.finish(whole);
    }
}

/// Headers that belong to one hop and are never forwarded.
const HOP_BY_HOP: [&str; 9] = [
    "connection",
    "proxy-connection",
    "keep-alive",
    "proxy-authorization",
    "proxy-authenticate",
    "te",
    "trailer",
    "transfer-encoding",
    "upgrade",
];

/// Removes the headers that belong to one hop (RFC 9110, 7.6.1): the
/// fixed ones and those the `Connection` header names. For any proxy.
pub fn strip_hop_by_hop(headers: &mut HeaderMap) {
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for h in named {
        headers.remove(h);
    }
    for h in HOP_BY_HOP {
        headers.remove(h);
    }
}

/// Whether a request asks to become a WebSocket (`Connection: upgrade`
/// and `Upgrade: websocket`, any case, in any list).
pub fn is_websocket_upgrade(headers: &HeaderMap) -> bool {
    let has = |name, token: &str| {
        headers.get_all(name).iter().any(|v| {
            v.to_str()
                .is_ok_and(|v| v.split(',').any(|t| t.trim().eq_ignore_ascii_case(token)))
        })
    };
    has(header::CONNECTION, "upgrade") && has(header::UPGRADE, "websocket")
}

/// Rewrites the list header `name` (items split at `sep`, in any number of
/// lines) to the items `keep` accepts, joined by `join`; a line that is
/// not text goes, and so does the header if nothing is kept.
pub fn keep_list_items(
    headers: &mut HeaderMap,
    name: HeaderName,
    sep: char,
    join: &str,
    keep: impl Fn(&str) -> bool,
) {
    let kept: Vec<&str> = headers
        .get_all(&name)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(sep))
        .map(str::trim)
        .filter(|item| !item.is_empty() && keep(item))
        .collect();
    let value = (!kept.is_empty())
        .then(|| HeaderValue::from_str(&kept.join(join)).ok())
        .flatten();
    headers.remove(&name);
    if let Some(v) = value {
        headers.insert(name, v);
    }
}

/// Puts back the hop-by-hop pair a WebSocket upgrade needs.
pub fn mark_websocket_upgrade(headers: &mut HeaderMap) {
    headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    headers.insert(header::UPGRADE, HeaderValue::from_static("websocket"));
}

impl Inner {
    /// The kept upstream connection, if it goes to `host:port`, the policy
    /// still allows that (and its address, for a name), and it is idle.
    /// Any other is dropped, which ends it.
    async fn reuse(&self, kept: &Mutex<Option<Kept>>, host: &Host, port: u16) -> Option<Kept> {
        let mut k = kept.lock().unwrap_or_else(|e| e.into_inner()).take()?;
        if k.host != *host || k.port != port {
            return None;
        }
        let policy = self.policy.load();
        let permitted = policy.check(host, port).is_ok()
            && (matches!(host, Host::Ip(_)) || policy.address_permitted(k.addr.ip(), port));
        if !permitted {
            return None;
        }
        match tokio::time::timeout(REUSE_WAIT, k.sender.ready()).await {
            Ok(Ok(())) => Some(k),
            _ => None,
        }
    }

    /// Forwards one absolute-form plain HTTP request.
    pub(super) async fn forward(
        self: &Arc<Self>,
        req: Request<Incoming>,
        kept: &Mutex<Option<Kept>>,
    ) -> Response<Body> {
        let method = req.method().to_string();
        let uri = req.uri().clone();
        match uri.scheme_str() {
            Some("http") => {}
            Some("https") => {
                return self.bad_request(
                    &method,
                    "https:// URLs go through CONNECT (set HTTPS_PROXY); retry that way",
                );
            }
            _ => {
                return self.bad_request(
                    &method,
                    "this is a proxy: send absolute-form http:// URLs or CONNECT",
                );
            }
        }
        let Some(auth) = uri.authority() else {
            return self.bad_request(&method, "the URL has no host");
        };
        if req.headers().contains_key(header::UPGRADE) {
            return self.bad_request(
                &method,
                "Upgrade is not carried over plain HTTP; use CONNECT",
            );
        }
        let port = auth.port_u16().unwrap_or(80);
        let host = match Host::parse(auth.host()) {
            Ok(h) => h,
            Err(why) => {
                return self.bad_request(&method, &format!("host {:?}: {why}", auth.host()));
            }
        };
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let host_s = host.to_string();
        let host_header = if port == 80 {
            host_s.clone()
        } else {
            format!("{host_s}:{port}")
        };
        let Ok(host_value) = HeaderValue::from_str(&host_header) else {
            return self.bad_request(&method, "unusable host");
        };
        parts.headers.insert(header::HOST, host_value);
        parts.uri = uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/")
            .parse::<Uri>()
            .unwrap_or_else(|_| Uri::from_static("/"));
        let mut upstream = match self.reuse(kept, &host, port).await {
            Some(k) => k,
            None => match self.connect_upstream(host, port, &method).await {
                Ok(k) => k,
                Err(resp) => return resp,
            },
        };
        let started = Instant::now();
        let base = upstream.meter.totals();
        match upstream
            .sender
            .send_request(Request::from_parts(parts, body))
            .await
        {
            Ok(resp) => {
                let report = Report {
                    inner: self.clone(),
                    host: host_s,
                    port,
                    method,
                    started,
                    addr: upstream.addr,
                    meter: upstream.meter.clone(),
                    base,
                };
                *kept.lock().unwrap_or_else(|e| e.into_inner()) = Some(upstream);
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                // Only the broker speaks as the broker.
                parts.headers.remove(super::BROKER_HEADER);
                let body = Reported {
                    body,
                    report: Some(report),
                };
                Response::from_parts(parts, body.boxed())
            }
            Err(e) => {
                let s = Subject {
                    host: &host_s,
                    port,
                    method: &method,
                    started,
                };
                self.broken(&s, upstream.addr, None, &e)
            }
        }
    }

    /// Reports and answers an upstream connection that broke before a
    /// response.
    fn broken(
        &self,
        s: &Subject<'_>,
        addr: SocketAddr,
        meter: Option<&Meter>,
        e: &dyn std::fmt::Display,
    ) -> Response<Body> {
        let line = format!("network: {}:{} failed: {e}", s.host, s.port);
        self.emit(
            s,
            Decision::Failed,
            Reason::Broken,
            Some(addr),
            meter,
            line.clone(),
        );
        text(StatusCode::BAD_GATEWAY, &line)
    }

    /// Opens an upstream connection for a plain request (the policy
    /// checked, the name resolved), driven on its own task; its requests
    /// report themselves (see `Reported`).
    async fn connect_upstream(
        self: &Arc<Self>,
        host: Host,
        port: u16,
        method: &str,
    ) -> Result<Kept, Response<Body>> {
        let opened = self.open(host, port, method).await?;
        let host_s = opened.host.to_string();
        let method = method.to_string();
        let meter = Meter::new();
        let io = TokioIo::new(Counted::new(opened.stream, meter.clone()));
        let (addr, started) = (opened.addr, opened.started);
        let (sender, conn) = match hyper::client::conn::http1::handshake::<_, Incoming>(io).await {
            Ok(x) => x,
            Err(e) => {
                let s = Subject {
                    host: &host_s,
                    port,
                    method: &method,
                    started,
                };
                return Err(self.broken(&s, addr, Some(&meter), &e));
            }
        };
        // The upstream connection is driven on its own task so the
        // response body can stream; each request reports itself (see
        // `Reported`). An idle connection ends after the idle timeout.
        {
            let inner = self.clone();
            let meter = meter.clone();
            tokio::spawn(async move {
                tokio::select! {
                    _ = conn => {}
                    _ = meter.idle(inner.config.idle_timeout) => {}
                    _ = inner.closed() => {}
                }
            });
        }
        Ok(Kept {
            host: opened.host,
            port,
            addr,
            sender,
            meter,
        })
    }
}
