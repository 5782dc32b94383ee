//! A GET made on the host for a sandbox (the model's `web_fetch`), through
//! the same door as the sandbox's own connections: its [`Broker`], spoken
//! to over an in-process stream, so the policy, the resolver's checks of
//! non-public addresses, the events and the secrets' interception are
//! exactly the sandbox's. `https` goes through `CONNECT` and TLS checked
//! against the host's roots (and the sandbox's secrets CA, whose leaves
//! the broker presents for a secret's hosts); `http` in absolute form.
//! Only a sandbox whose network is the host's own ([`Route::Direct`])
//! connects without a broker, as its programs do.
//!
//! Everything from the server is bounded: the head (hyper's limits), the
//! body ([`FetchLimits::max_body`], the rest not read), redirects and the
//! whole exchange's time. Bodies are asked for without compression, so
//! what is counted is what is read.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, header};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{CertificateDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite};
use url::Url;

use crate::Broker;

/// How a fetch leaves the host.
#[derive(Clone)]
pub enum Route {
    /// Through a sandbox's broker, under its policy.
    Broker(Broker),
    /// Straight out, for a sandbox on the host's network (`full`).
    Direct,
}

/// Bounds of one fetch.
#[derive(Debug, Clone, Copy)]
pub struct FetchLimits {
    /// Body bytes read at most; the rest is left unread.
    pub max_body: usize,
    /// Redirects followed at most.
    pub max_redirects: usize,
    /// The whole exchange, redirects included.
    pub timeout: Duration,
}

impl Default for FetchLimits {
    fn default() -> Self {
        FetchLimits {
            max_body: 4 << 20,
            max_redirects: 5,
            timeout: Duration::from_secs(30),
        }
    }
}

/// A response, its body read up to the limit.
#[derive(Debug, Clone)]
pub struct Fetched {
    /// Where the body came from: the last URL after redirects.
    pub url: Url,
    pub status: StatusCode,
    /// `Content-Type`, if the server sent a readable one.
    pub content_type: Option<String>,
    pub body: Bytes,
    /// The body was longer than [`FetchLimits::max_body`].
    pub truncated: bool,
}

/// Why a fetch did not get a response.
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0}")]
    Url(String),
    /// The broker refused or could not make the connection: its line
    /// (`network: HOST:PORT refused by policy (allowed: ...)`).
    #[error("{0}")]
    Network(String),
    #[error("TLS with {host} failed: {why}")]
    Tls { host: String, why: String },
    #[error("HTTP exchange with {host} failed: {why}")]
    Http { host: String, why: String },
    #[error("more than {0} redirects")]
    Redirects(usize),
    #[error("no answer within {0:?}")]
    Timeout(Duration),
}

/// Makes GET requests along one route.
#[derive(Clone)]
pub struct Fetcher {
    route: Route,
    tls: Arc<ClientConfig>,
    limits: FetchLimits,
}

/// The host's certificate store, read once per process.
fn native_roots() -> &'static RootCertStore {
    static ROOTS: OnceLock<RootCertStore> = OnceLock::new();
    ROOTS.get_or_init(|| {
        let mut roots = RootCertStore::empty();
        for c in rustls_native_certs::load_native_certs().certs {
            let _ = roots.add(c);
        }
        roots
    })
}

impl Fetcher {
    /// A fetcher along `route` trusting the host's roots, and `extra` (the
    /// sandbox's secrets CA) beside them.
    pub fn new(route: Route, extra: Option<&CertificateDer<'static>>) -> Fetcher {
        let mut roots = native_roots().clone();
        if let Some(ca) = extra {
            let _ = roots.add(ca.clone());
        }
        Fetcher::with_roots(route, roots)
    }

    /// A fetcher trusting exactly `roots` (tests bring their own CA).
    pub fn with_roots(route: Route, roots: RootCertStore) -> Fetcher {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let mut tls = ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .expect("the default provider supports the default versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        tls.alpn_protocols = vec![b"http/1.1".to_vec()];
        Fetcher {
            route,
            tls: Arc::new(tls),
            limits: FetchLimits::default(),
        }
    }

    pub fn limits(mut self, limits: FetchLimits) -> Fetcher {
        self.limits = limits;
        self
    }

    /// GETs `url`, following redirects (each through the route again, so
    /// each is checked), within the limits.
    pub async fn get(&self, url: &str) -> Result<Fetched, FetchError> {
        let url = parse(url)?;
        let timeout = self.limits.timeout;
        tokio::time::timeout(timeout, self.follow(url))
            .await
            .unwrap_or(Err(FetchError::Timeout(timeout)))
    }

    async fn follow(&self, mut url: Url) -> Result<Fetched, FetchError> {
        for _ in 0..=self.limits.max_redirects {
            let fetched = self.once(&url).await?;
            let status = fetched.done.status;
            let redirect = status.is_redirection()
                && status != StatusCode::NOT_MODIFIED
                && status != StatusCode::MULTIPLE_CHOICES;
            let Some(next) = redirect.then(|| fetched.location.clone()).flatten() else {
                return Ok(fetched.done);
            };
            url = url
                .join(&next)
                .map_err(|e| FetchError::Url(format!("redirect to {next:?}: {e}")))
                .and_then(checked)?;
        }
        Err(FetchError::Redirects(self.limits.max_redirects))
    }

    /// One request, no redirect followed.
    async fn once(&self, url: &Url) -> Result<Hop, FetchError> {
        let host = url.host_str().unwrap_or_default().to_string();
        let port = url.port_or_known_default().unwrap_or(80);
        // Brackets stay on an IPv6 literal: that is how the broker and a
        // Host header read it.
        let authority = format!("{host}:{port}");
        let https = url.scheme() == "https";
        let http = |why: String| FetchError::Http {
            host: host.clone(),
            why,
        };
        let (io, absolute) = match (&self.route, https) {
            (Route::Broker(b), false) => (Io::boxed(broker_stream(b)), true),
            (Route::Broker(b), true) => {
                let tunnel = connect_tunnel(broker_stream(b), &authority).await?;
                (self.tls(TokioIo::new(tunnel), &host).await?, false)
            }
            (Route::Direct, tls) => {
                let tcp = tokio::net::TcpStream::connect(&authority)
                    .await
                    .map_err(|e| {
                        FetchError::Network(format!("network: {authority} failed: {e}"))
                    })?;
                if tls {
                    (self.tls(tcp, &host).await?, false)
                } else {
                    (Io::boxed(tcp), false)
                }
            }
        };
        let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
            .await
            .map_err(|e| http(e.to_string()))?;
        let conn = tokio::spawn(conn);
        // Absolute form for the broker's plain HTTP; origin form to a server.
        let target = if absolute {
            url.as_str().to_string()
        } else {
            let mut t = url.path().to_string();
            if let Some(q) = url.query() {
                t.push('?');
                t.push_str(q);
            }
            t
        };
        let host_header = match url.port() {
            Some(p) => format!("{host}:{p}"),
            None => host.clone(),
        };
        let req = Request::builder()
            .method(Method::GET)
            .uri(target)
            .header(header::HOST, host_header)
            .header(header::USER_AGENT, USER_AGENT)
            .header(header::ACCEPT, ACCEPT)
            .header(header::ACCEPT_ENCODING, "identity")
            .body(Empty::<Bytes>::new())
            .map_err(|e| http(e.to_string()))?;
        let resp = send
            .send_request(req)
            .await
            .map_err(|e| http(e.to_string()))?;
        let (parts, mut body) = resp.into_parts();
        if absolute && parts.headers.contains_key(crate::BROKER_HEADER) {
            // The broker refused or failed: its line, not a page.
            let body = body
                .collect()
                .await
                .map(|b| b.to_bytes())
                .unwrap_or_default();
            conn.abort();
            return Err(FetchError::Network(line_of(&body)));
        }
        let header = |name: header::HeaderName| {
            parts
                .headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        let mut read = Vec::new();
        let mut truncated = false;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(|e| http(e.to_string()))?;
            if let Ok(data) = frame.into_data() {
                let room = self.limits.max_body - read.len();
                if data.len() > room {
                    read.extend_from_slice(&data[..room]);
                    truncated = true;
                    break;
                }
                read.extend_from_slice(&data);
            }
        }
        conn.abort();
        Ok(Hop {
            location: header(header::LOCATION),
            done: Fetched {
                url: url.clone(),
                status: parts.status,
                content_type: header(header::CONTENT_TYPE),
                body: Bytes::from(read),
                truncated,
            },
        })
    }

    async fn tls<S>(&self, io: S, host: &str) -> Result<Io, FetchError>
    where
        S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let tls_err = |why: String| FetchError::Tls {
            host: host.to_string(),
            why,
        };
        // An IPv6 literal is named without its brackets.
        let bare = host.trim_start_matches('[').trim_end_matches(']');
        let name = ServerName::try_from(bare.to_string()).map_err(|e| tls_err(e.to_string()))?;
        let stream = tokio_rustls::TlsConnector::from(self.tls.clone())
            .connect(name, io)
            .await
            .map_err(|e| tls_err(e.to_string()))?;
        Ok(Io::boxed(stream))
    }
}

/// A response and where it points, before redirects are decided.
struct Hop {
    location: Option<String>,
    done: Fetched,
}

const USER_AGENT: &str = concat!("cordon/", env!("CARGO_PKG_VERSION"), " (web_fetch)");
const ACCEPT: &str = "text/html, text/markdown, text/plain, application/json, */*;q=0.5";

/// `url` read, and only http(s) with a host accepted.
fn parse(url: &str) -> Result<Url, FetchError> {
    let u = Url::parse(url.trim())
        .map_err(|e| FetchError::Url(format!("{url:?} is not a URL: {e}")))?;
    checked(u)
}

fn checked(u: Url) -> Result<Url, FetchError> {
    if !matches!(u.scheme(), "http" | "https") {
        return Err(FetchError::Url(format!(
            "{} URLs cannot be fetched: only http and https",
            u.scheme()
        )));
    }
    if u.host_str().is_none_or(str::is_empty) {
        return Err(FetchError::Url(format!("{u} has no host")));
    }
    if !u.username().is_empty() || u.password().is_some() {
        return Err(FetchError::Url(
            "URLs with a user name or password are not fetched".into(),
        ));
    }
    Ok(u)
}

/// One end of an in-process stream whose other end the broker serves as
/// it serves a connection from the sandbox.
fn broker_stream(broker: &Broker) -> tokio::io::DuplexStream {
    // Large enough that a page moves in few wakeups.
    let (ours, theirs) = tokio::io::duplex(256 * 1024);
    let broker = broker.clone();
    tokio::spawn(async move { broker.serve_connection(theirs).await });
    ours
}

/// `CONNECT authority` over `io`; the tunnel once the broker answers 200,
/// else its refusal line.
async fn connect_tunnel(
    io: tokio::io::DuplexStream,
    authority: &str,
) -> Result<hyper::upgrade::Upgraded, FetchError> {
    let http = |why: String| FetchError::Http {
        host: authority.to_string(),
        why,
    };
    let (mut send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(|e| http(e.to_string()))?;
    tokio::spawn(conn.with_upgrades());
    let req = Request::builder()
        .method(Method::CONNECT)
        .uri(authority)
        .header(header::HOST, authority)
        .body(Empty::<Bytes>::new())
        .map_err(|e| http(e.to_string()))?;
    let resp = send
        .send_request(req)
        .await
        .map_err(|e| http(e.to_string()))?;
    if resp.status() != StatusCode::OK {
        // The broker's own answer: one line saying why.
        let body = resp
            .into_body()
            .collect()
            .await
            .map(|b| b.to_bytes())
            .unwrap_or_default();
        return Err(FetchError::Network(line_of(&body)));
    }
    hyper::upgrade::on(resp)
        .await
        .map_err(|e| http(e.to_string()))
}

/// The broker's answer: one line.
fn line_of(body: &[u8]) -> String {
    let text = String::from_utf8_lossy(&body[..body.len().min(4096)]);
    text.lines().next().unwrap_or_default().trim().to_string()
}

/// Any of the streams a request can run over.
struct Io(Box<dyn AsyncReadWrite>);

trait AsyncReadWrite: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> AsyncReadWrite for T {}

impl Io {
    fn boxed(s: impl AsyncRead + AsyncWrite + Unpin + Send + 'static) -> Io {
        Io(Box::new(s))
    }
}

impl AsyncRead for Io {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_read(cx, buf)
    }
}

impl AsyncWrite for Io {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut *self.0).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut *self.0).poll_shutdown(cx)
    }
}
