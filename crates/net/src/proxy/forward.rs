//! Plain HTTP: one absolute-form request forwarded per upstream connection.

use super::*;

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
    /// Forwards one absolute-form plain HTTP request.
    pub(super) async fn forward(self: &Arc<Self>, req: Request<Incoming>) -> Response<Body> {
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
        let opened = match self.open(host, port, &method).await {
            Ok(o) => o,
            Err(resp) => return resp,
        };
        let (mut parts, body) = req.into_parts();
        strip_hop_by_hop(&mut parts.headers);
        let host_s = opened.host.to_string();
        let host_header = if port == 80 {
            host_s.clone()
        } else {
            format!("{host_s}:{port}")
        };
        let Ok(host_value) = HeaderValue::from_str(&host_header) else {
            return self.bad_request(&method, "unusable host");
        };
        parts.headers.insert(header::HOST, host_value);
        parts
            .headers
            .insert(header::CONNECTION, HeaderValue::from_static("close"));
        parts.uri = uri
            .path_and_query()
            .map(|pq| pq.as_str())
            .unwrap_or("/")
            .parse::<Uri>()
            .unwrap_or_else(|_| Uri::from_static("/"));
        let meter = Meter::new();
        let io = TokioIo::new(Counted::new(opened.stream, meter.clone()));
        let (addr, started) = (opened.addr, opened.started);
        let (mut sender, conn) =
            match hyper::client::conn::http1::handshake::<_, Incoming>(io).await {
                Ok(x) => x,
                Err(e) => {
                    let s = Subject {
                        host: &host_s,
                        port,
                        method: &method,
                        started,
                    };
                    let line = format!("network: {host_s}:{port} failed: {e}");
                    self.emit(
                        &s,
                        Decision::Failed,
                        Reason::Broken,
                        Some(addr),
                        Some(&meter),
                        line.clone(),
                    );
                    return text(StatusCode::BAD_GATEWAY, &line);
                }
            };
        // The upstream connection is driven on its own task so the
        // response body can stream; its end is the request's end.
        {
            let inner = self.clone();
            let meter = meter.clone();
            let (host_s, method) = (host_s.clone(), method.clone());
            tokio::spawn(async move {
                let reason = tokio::select! {
                    r = conn => if r.is_ok() { Reason::Listed } else { Reason::Broken },
                    _ = meter.idle(inner.config.idle_timeout) => Reason::Timeout,
                    _ = inner.closed() => Reason::BrokerClosed,
                };
                let (up, down) = meter.totals();
                let line = match reason {
                    Reason::Listed => {
                        format!("network: {host_s}:{port} allowed ({up} bytes up, {down} down)")
                    }
                    Reason::Timeout => format!(
                        "network: {host_s}:{port} closed after {}s idle",
                        inner.config.idle_timeout.as_secs()
                    ),
                    _ => format!(
                        "network: {host_s}:{port} allowed, connection broken ({up} bytes up, {down} down)"
                    ),
                };
                let s = Subject {
                    host: &host_s,
                    port,
                    method: &method,
                    started,
                };
                inner.emit(
                    &s,
                    Decision::Allowed,
                    reason,
                    Some(addr),
                    Some(&meter),
                    line,
                );
            });
        }
        match sender.send_request(Request::from_parts(parts, body)).await {
            Ok(resp) => {
                let (mut parts, body) = resp.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                Response::from_parts(parts, body.boxed())
            }
            Err(e) => text(
                StatusCode::BAD_GATEWAY,
                &format!("network: {host_s}:{port} failed: {e}"),
            ),
        }
    }
}
