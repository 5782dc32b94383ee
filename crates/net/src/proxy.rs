//! The HTTP/1.1 proxy itself (the rules are in the crate docs).

use std::convert::Infallible;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Method, Request, Response, StatusCode, Uri};
use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::time::Instant;

use crate::addr;
use crate::events::{Decision, EventSink, NetEvent, Reason};
use crate::io::{Counted, Meter};
use crate::policy::{Host, Policy, PolicyHandle, Refusal};
use crate::resolve::Resolve;
use crate::secrets::Intercept;
use crate::sni::{Hello, HelloReader};

mod forward;

pub use forward::{
    is_websocket_upgrade, keep_list_items, mark_websocket_upgrade, strip_hop_by_hop,
};
mod intercept;
mod tunnel;

type Body = BoxBody<Bytes, hyper::Error>;

/// Limits and timeouts.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Streams served at once; more are answered `503` and closed.
    pub max_connections: usize,
    /// Largest request head (request line and headers), at least 8 KiB.
    pub max_header_bytes: usize,
    /// Time to receive a request head, and keep-alive idle time between
    /// requests.
    pub header_timeout: Duration,
    /// Time for resolving a name, and again for each address's connect.
    pub connect_timeout: Duration,
    /// Time for the TLS ClientHello to arrive after CONNECT.
    pub hello_timeout: Duration,
    /// Largest ClientHello read before giving up.
    pub max_hello_bytes: usize,
    /// An upstream connection with no bytes either way for this long is
    /// closed.
    pub idle_timeout: Duration,
    /// TLS interception for secrets ([`crate::secrets`]): tunnels to a
    /// secret's hosts are terminated and their requests filled in.
    pub intercept: Option<Arc<Intercept>>,
}

impl Default for BrokerConfig {
    fn default() -> BrokerConfig {
        BrokerConfig {
            max_connections: 128,
            max_header_bytes: 64 * 1024,
            header_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(10),
            max_hello_bytes: 64 * 1024,
            idle_timeout: Duration::from_secs(300),
            intercept: None,
        }
    }
}

/// One sandbox's broker. Cheap to clone; clones share the policy, the
/// event sink and the connection cap.
#[derive(Clone)]
pub struct Broker {
    inner: Arc<Inner>,
}

struct Inner {
    policy: PolicyHandle,
    resolver: Arc<dyn Resolve>,
    events: Arc<dyn EventSink>,
    config: BrokerConfig,
    permits: Arc<Semaphore>,
    /// Set once by [`Broker::close`].
    closed: watch::Sender<bool>,
}

/// An upstream connection opened for an allowed request.
struct Opened {
    stream: TcpStream,
    addr: SocketAddr,
    host: Host,
    port: u16,
    method: String,
    started: Instant,
}

/// A CONNECT answered 200, waiting for hyper to hand over the stream.
struct Tunnel {
    upgrade: hyper::upgrade::OnUpgrade,
    opened: Opened,
}

impl Broker {
    pub fn new(
        policy: PolicyHandle,
        resolver: Arc<dyn Resolve>,
        events: Arc<dyn EventSink>,
        config: BrokerConfig,
    ) -> Broker {
        let permits = Arc::new(Semaphore::new(config.max_connections));
        Broker {
            inner: Arc::new(Inner {
                policy,
                resolver,
                events,
                config,
                permits,
                closed: watch::Sender::new(false),
            }),
        }
    }

    /// The live policy; [`PolicyHandle::set`] changes it for this broker.
    pub fn policy(&self) -> &PolicyHandle {
        &self.inner.policy
    }

    /// Streams being served now.
    pub fn active_connections(&self) -> usize {
        self.inner.config.max_connections - self.inner.permits.available_permits()
    }

    /// Ends everything: the [`Broker::serve`] loop returns, open streams
    /// and tunnels are closed (tunnels report [`Reason::BrokerClosed`]), and
    /// streams served later are closed at once. For the sandbox's end.
    pub fn close(&self) {
        self.inner.closed.send_replace(true);
    }

    /// Serves one stream from the sandbox until it closes: its requests,
    /// and the tunnel if one is a CONNECT. Never panics on what the stream
    /// sends; errors end the stream and are reported as events.
    pub async fn serve_connection<S>(&self, stream: S)
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let inner = &self.inner;
        if *inner.closed.borrow() {
            return;
        }
        let Ok(permit) = inner.permits.clone().try_acquire_owned() else {
            inner.too_many(stream).await;
            return;
        };
        let slot: Arc<Mutex<Option<Tunnel>>> = Arc::default();
        // The upstream connection of this stream's last plain request,
        // for its next one to the same host and port.
        let kept: Arc<Mutex<Option<forward::Kept>>> = Arc::default();
        let svc = {
            let inner = inner.clone();
            let slot = slot.clone();
            service_fn(move |req| {
                let inner = inner.clone();
                let slot = slot.clone();
                let kept = kept.clone();
                async move { Ok::<_, Infallible>(inner.handle(req, &slot, &kept).await) }
            })
        };
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(inner.config.header_timeout)
            .max_buf_size(inner.config.max_header_bytes.max(8192))
            .max_headers(128);
        let conn = builder
            .serve_connection(TokioIo::new(stream), svc)
            .with_upgrades();
        tokio::select! {
            r = conn => if let Err(e) = r {
                tracing::debug!("broker: client connection: {e}");
            },
            _ = inner.closed() => return,
        }
        let tunnel = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(t) = tunnel {
            inner.tunnel(t).await;
        }
        drop(permit);
    }

    /// Accepts connections from `listener` and serves each on its own task,
    /// under the connection cap, until accepting fails for good.
    pub async fn serve(&self, listener: TcpListener) -> io::Result<()> {
        loop {
            let accepted = tokio::select! {
                a = listener.accept() => a,
                _ = self.inner.closed() => return Ok(()),
            };
            match accepted {
                Ok((stream, _)) => {
                    let _ = stream.set_nodelay(true);
                    let me = self.clone();
                    tokio::spawn(async move { me.serve_connection(stream).await });
                }
                // Out of descriptors or a connection that died in the
                // queue: wait a little rather than spin.
                Err(e) if is_transient(&e) => tokio::time::sleep(Duration::from_millis(50)).await,
                Err(e) => return Err(e),
            }
        }
    }
}

fn is_transient(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::ConnectionAborted
            | io::ErrorKind::ConnectionReset
            | io::ErrorKind::Interrupted
            | io::ErrorKind::WouldBlock
    ) || matches!(e.raw_os_error(), Some(12 | 23 | 24 | 105)) // ENOMEM, ENFILE, EMFILE, ENOBUFS
}

/// Marks the broker's own answers (a refusal, a failure), so a client
/// can tell them from an origin's: removed from every upstream response.
pub const BROKER_HEADER: &str = "x-cordon-broker";

fn text(status: StatusCode, line: &str) -> Response<Body> {
    let mut resp = Response::new(
        Full::new(Bytes::from(format!("{line}\n")))
            .map_err(|n: Infallible| match n {})
            .boxed(),
    );
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp.headers_mut()
        .insert(BROKER_HEADER, HeaderValue::from_static("1"));
    resp
}

/// The fields of one event that are known before it ends.
struct Subject<'a> {
    host: &'a str,
    port: u16,
    method: &'a str,
    started: Instant,
}

impl Inner {
    /// Resolves once the broker is closed.
    async fn closed(&self) {
        let mut rx = self.closed.subscribe();
        // The sender lives in `self`: waiting cannot fail.
        let _ = rx.wait_for(|c| *c).await;
    }

    #[allow(clippy::too_many_arguments)]
    fn event(
        &self,
        s: &Subject<'_>,
        decision: Decision,
        reason: Reason,
        addr: Option<SocketAddr>,
        meter: Option<&Meter>,
        message: String,
        intercepted: bool,
    ) -> NetEvent {
        let (up, down) = meter.map(Meter::totals).unwrap_or((0, 0));
        NetEvent {
            host: s.host.to_string(),
            port: s.port,
            method: s.method.to_string(),
            decision,
            reason,
            addr,
            bytes_up: up,
            bytes_down: down,
            duration_ms: s.started.elapsed().as_millis() as u64,
            message,
            intercepted,
        }
    }

    fn emit(
        &self,
        s: &Subject<'_>,
        decision: Decision,
        reason: Reason,
        addr: Option<SocketAddr>,
        meter: Option<&Meter>,
        message: String,
    ) {
        let ev = self.event(s, decision, reason, addr, meter, message, false);
        self.send(ev);
    }

    fn send(&self, ev: NetEvent) {
        tracing::debug!("{}", ev.message);
        self.events.emit(ev);
    }

    async fn too_many<S: AsyncWrite + Unpin>(&self, mut stream: S) {
        let line = format!(
            "network: too many connections open through the broker (limit {}); close some and retry",
            self.config.max_connections
        );
        let resp = format!(
            "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain; charset=utf-8\r\n{BROKER_HEADER}: 1\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{line}\n",
            line.len() + 1
        );
        let subject = Subject {
            host: "",
            port: 0,
            method: "",
            started: Instant::now(),
        };
        self.emit(
            &subject,
            Decision::Failed,
            Reason::TooManyConnections,
            None,
            None,
            line,
        );
        let _ = tokio::time::timeout(Duration::from_secs(2), async {
            stream.write_all(resp.as_bytes()).await?;
            stream.shutdown().await
        })
        .await;
    }

    fn bad_request(&self, method: &str, why: &str) -> Response<Body> {
        let line = format!("network: bad proxy request: {why}");
        self.emit(
            &Subject {
                host: "",
                port: 0,
                method,
                started: Instant::now(),
            },
            Decision::Failed,
            Reason::BadRequest,
            None,
            None,
            line.clone(),
        );
        text(StatusCode::BAD_REQUEST, &line)
    }

    async fn handle(
        self: &Arc<Self>,
        req: Request<Incoming>,
        slot: &Mutex<Option<Tunnel>>,
        kept: &Mutex<Option<forward::Kept>>,
    ) -> Response<Body> {
        if req.method() == Method::CONNECT {
            let Some(auth) = req.uri().authority().cloned() else {
                return self.bad_request("CONNECT", "CONNECT needs HOST:PORT");
            };
            let Some(port) = auth.port_u16() else {
                return self.bad_request("CONNECT", "CONNECT needs HOST:PORT");
            };
            let host = match Host::parse(auth.host()) {
                Ok(h) => h,
                Err(why) => {
                    return self.bad_request("CONNECT", &format!("host {:?}: {why}", auth.host()));
                }
            };
            let mut req = req;
            match self.open(host, port, "CONNECT").await {
                Ok(opened) => {
                    let upgrade = hyper::upgrade::on(&mut req);
                    *slot.lock().unwrap_or_else(|e| e.into_inner()) =
                        Some(Tunnel { upgrade, opened });
                    Response::new(
                        Full::new(Bytes::new())
                            .map_err(|n: Infallible| match n {})
                            .boxed(),
                    )
                }
                Err(resp) => resp,
            }
        } else {
            self.forward(req, kept).await
        }
    }

    /// Checks the policy, resolves, and connects; a refusal or failure is
    /// reported and answered.
    async fn open(&self, host: Host, port: u16, method: &str) -> Result<Opened, Response<Body>> {
        let started = Instant::now();
        let host_s = host.to_string();
        let subject = Subject {
            host: &host_s,
            port,
            method,
            started,
        };
        let policy = self.policy.load();
        if let Err(r) = policy.check(&host, port) {
            let reason = match r {
                Refusal::NotListed => Reason::NotListed,
                Refusal::PortNotListed => Reason::PortNotListed,
            };
            let line = format!(
                "network: {host_s}:{port} refused by policy (allowed: {})",
                policy.summary()
            );
            self.emit(
                &subject,
                Decision::Refused,
                reason,
                None,
                None,
                line.clone(),
            );
            return Err(text(StatusCode::FORBIDDEN, &line));
        }
        let addrs: Vec<IpAddr> = match &host {
            Host::Ip(ip) => vec![*ip],
            Host::Name(name) => {
                match tokio::time::timeout(self.config.connect_timeout, self.resolver.resolve(name))
                    .await
                {
                    Ok(Ok(a)) if !a.is_empty() => a.into_iter().map(addr::canonical).collect(),
                    Ok(Ok(_)) => {
                        return Err(self.failed(
                            &subject,
                            Reason::ResolveFailed,
                            "the name has no addresses",
                        ));
                    }
                    Ok(Err(e)) => {
                        return Err(self.failed(
                            &subject,
                            Reason::ResolveFailed,
                            &format!("the name does not resolve ({e})"),
                        ));
                    }
                    Err(_) => {
                        return Err(self.failed(
                            &subject,
                            Reason::ResolveFailed,
                            "resolving the name timed out",
                        ));
                    }
                }
            }
        };
        // A name's restricted addresses need an IP rule or allow_private;
        // an IP literal got here through an IP rule already.
        let permitted: Vec<IpAddr> = match host {
            Host::Ip(_) => addrs.clone(),
            Host::Name(_) => addrs
                .iter()
                .copied()
                .filter(|ip| policy.address_permitted(*ip, port))
                .collect(),
        };
        if permitted.is_empty() {
            let shown = addrs
                .iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(", ");
            let line = format!(
                "network: {host_s}:{port} refused by policy: it resolves only to non-public addresses ({shown}) (allowed: {})",
                policy.summary()
            );
            self.emit(
                &subject,
                Decision::Refused,
                Reason::RestrictedAddress,
                None,
                None,
                line.clone(),
            );
            return Err(text(StatusCode::FORBIDDEN, &line));
        }
        let mut last_err = String::from("no address");
        for ip in permitted {
            let sa = SocketAddr::new(ip, port);
            match tokio::time::timeout(self.config.connect_timeout, TcpStream::connect(sa)).await {
                Ok(Ok(stream)) => {
                    let _ = stream.set_nodelay(true);
                    return Ok(Opened {
                        stream,
                        addr: sa,
                        host,
                        port,
                        method: method.to_string(),
                        started,
                    });
                }
                Ok(Err(e)) => last_err = format!("{sa}: {e}"),
                Err(_) => last_err = format!("{sa}: timed out"),
            }
        }
        Err(self.failed(
            &subject,
            Reason::ConnectFailed,
            &format!("could not connect ({last_err})"),
        ))
    }

    fn failed(&self, s: &Subject<'_>, reason: Reason, why: &str) -> Response<Body> {
        let line = format!("network: {}:{} failed: {why}", s.host, s.port);
        self.emit(s, Decision::Failed, reason, None, None, line.clone());
        text(StatusCode::BAD_GATEWAY, &line)
    }
}
