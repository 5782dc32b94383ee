//! Shared pieces for the broker's socket tests: upstream servers on
//! loopback (raw echo, TLS echo, plain HTTP), a broker, and clients.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use cordon_net::{Broker, BrokerConfig, NetEvent, Policy, PolicyHandle, StaticResolver};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio_rustls::rustls::pki_types::{
    CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer, ServerName,
};
use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, ServerConfig};

pub const LOOPBACK: IpAddr = IpAddr::V4(std::net::Ipv4Addr::LOCALHOST);

/// The names the test resolver knows; all point at loopback.
pub const NAMES: [&str; 5] = [
    "upstream.test",
    "evil.test",
    "other.test",
    "a.wild.test",
    "wild.test",
];

pub fn resolver() -> StaticResolver {
    let mut r = StaticResolver::new();
    for n in NAMES {
        r = r.with(n, &[LOOPBACK]);
    }
    r.with("mapped.test", &["::ffff:127.0.0.1".parse().unwrap()])
        .with("two.test", &["127.0.0.2".parse().unwrap(), LOOPBACK])
        .with("mixed.test", &["10.0.0.1".parse().unwrap(), LOOPBACK])
}

pub fn policy(entries: &[String], allow_private: bool) -> Policy {
    Policy::parse(entries, allow_private).unwrap()
}

pub struct TestBroker {
    pub addr: SocketAddr,
    pub broker: Broker,
    pub events: mpsc::UnboundedReceiver<NetEvent>,
}

impl TestBroker {
    pub async fn start(policy: Policy, config: BrokerConfig) -> TestBroker {
        let (tx, events) = mpsc::unbounded_channel();
        let broker = Broker::new(
            PolicyHandle::new(policy),
            Arc::new(resolver()),
            Arc::new(tx),
            config,
        );
        let listener = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let b = broker.clone();
        tokio::spawn(async move { b.serve(listener).await });
        TestBroker {
            addr,
            broker,
            events,
        }
    }

    pub async fn event(&mut self) -> NetEvent {
        tokio::time::timeout(Duration::from_secs(10), self.events.recv())
            .await
            .expect("an event in time")
            .expect("sink open")
    }

    pub fn no_event_pending(&mut self) -> bool {
        self.events.try_recv().is_err()
    }
}

/// A TCP server that echoes every byte.
pub async fn echo_server() -> u16 {
    let l = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            tokio::spawn(async move {
                let (mut r, mut w) = s.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    port
}

/// A certificate for every test name, and the root store that trusts it.
pub struct Tls {
    pub server: Arc<ServerConfig>,
    pub client: Arc<ClientConfig>,
    pub root: CertificateDer<'static>,
}

pub fn tls() -> Tls {
    let names: Vec<String> = NAMES.iter().map(|s| s.to_string()).collect();
    let ck = rcgen::generate_simple_self_signed(names).unwrap();
    let cert: CertificateDer<'static> = ck.cert.der().clone();
    let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(ck.signing_key.serialize_der()));
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let server = ServerConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert.clone()], key)
        .unwrap();
    let mut roots = RootCertStore::empty();
    roots.add(cert.clone()).unwrap();
    let client = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    Tls {
        server: Arc::new(server),
        client: Arc::new(client),
        root: cert,
    }
}

/// A TLS server that echoes what it decrypts.
pub async fn tls_echo_server(config: Arc<ServerConfig>) -> u16 {
    let l = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(tls) = acceptor.accept(s).await {
                    let (mut r, mut w) = tokio::io::split(tls);
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                    let _ = w.shutdown().await;
                }
            });
        }
    });
    port
}

/// A plain HTTP server answering `METHOD PATH host=HOST proxy-auth=BOOL
/// body=BODY`.
pub async fn http_server() -> u16 {
    http_server_counted().await.0
}

/// [`http_server`], with the count of connections it accepted.
pub async fn http_server_counted() -> (u16, Arc<std::sync::atomic::AtomicUsize>) {
    let l = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counter = accepted.clone();
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            counter.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|req: hyper::Request<Incoming>| async move {
                    let line = format!(
                        "{} {} host={} proxy-auth={} ",
                        req.method(),
                        req.uri(),
                        req.headers()
                            .get("host")
                            .and_then(|h| h.to_str().ok())
                            .unwrap_or("-"),
                        req.headers().contains_key("proxy-authorization"),
                    );
                    let body = req
                        .into_body()
                        .collect()
                        .await
                        .map(|b| b.to_bytes())
                        .unwrap_or_default();
                    let out = format!("{line}body={}", String::from_utf8_lossy(&body));
                    Ok::<_, std::convert::Infallible>(hyper::Response::new(Full::new(Bytes::from(
                        out,
                    ))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(s), svc)
                    .await;
            });
        }
    });
    (port, accepted)
}

/// Sends `CONNECT authority` and reads the response head; returns the
/// status, the body of a refusal (when it has a Content-Length), and the
/// stream.
pub async fn connect(proxy: SocketAddr, authority: &str) -> (u16, String, TcpStream) {
    let mut s = TcpStream::connect(proxy).await.unwrap();
    s.set_nodelay(true).unwrap();
    s.write_all(format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let (status, body) = read_response(&mut s).await;
    (status, body, s)
}

/// Reads one HTTP response (head and a Content-Length body) byte by byte,
/// so nothing after it is consumed.
pub async fn read_response<S: AsyncRead + Unpin>(s: &mut S) -> (u16, String) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        let n = tokio::time::timeout(Duration::from_secs(10), s.read(&mut b))
            .await
            .expect("response in time")
            .unwrap();
        assert!(
            n == 1,
            "connection closed mid-head: {:?}",
            String::from_utf8_lossy(&head)
        );
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let status: u16 = head.split(' ').nth(1).unwrap().parse().unwrap();
    let len = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse::<usize>().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0u8; len];
    s.read_exact(&mut body).await.unwrap();
    (status, String::from_utf8(body).unwrap())
}

/// TLS over `s` to `name`; panics if the handshake fails.
pub async fn tls_client<S: AsyncRead + AsyncWrite + Unpin>(
    tls: &Tls,
    s: S,
    name: &str,
) -> std::io::Result<tokio_rustls::client::TlsStream<S>> {
    let connector = tokio_rustls::TlsConnector::from(tls.client.clone());
    connector
        .connect(ServerName::try_from(name.to_string()).unwrap(), s)
        .await
}

/// Writes one byte per write call, so a ClientHello crosses many segments.
pub struct OneByte<S>(pub S);

impl<S: AsyncRead + Unpin> AsyncRead for OneByte<S> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for OneByte<S> {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let n = buf.len().min(1);
        std::pin::Pin::new(&mut self.0).poll_write(cx, &buf[..n])
    }
    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_flush(cx)
    }
    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.0).poll_shutdown(cx)
    }
}

/// Sends one plain HTTP request through the proxy on a fresh hyper client
/// connection and returns status and body.
pub async fn http_get(proxy: SocketAddr, url: &str) -> (u16, String) {
    let s = TcpStream::connect(proxy).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    let req = hyper::Request::get(url)
        .header("proxy-authorization", "Basic eDp5")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    (status, String::from_utf8_lossy(&body).into_owned())
}

/// A TLS HTTP server that answers with what it received, and repeats the
/// Authorization header in a response header.
pub async fn tls_http_server(config: Arc<rustls::ServerConfig>) -> u16 {
    tls_server(config, |req| {
        let h = |k: &str| {
            req.headers()
                .get(k)
                .and_then(|v| v.to_str().ok())
                .unwrap_or("-")
                .to_string()
        };
        let line = format!(
            "{} host={} auth={} key={}",
            req.uri(),
            h("host"),
            h("authorization"),
            h("x-api-key")
        );
        hyper::Response::builder()
            .header("x-echo-auth", h("authorization"))
            .body(Full::new(Bytes::from(line)))
            .unwrap()
    })
    .await
}

/// A TLS HTTP/1.1 server on loopback giving each request `answer`'s
/// response; its port.
pub async fn tls_server(
    config: Arc<rustls::ServerConfig>,
    answer: fn(&hyper::Request<Incoming>) -> hyper::Response<Full<Bytes>>,
) -> u16 {
    let l = TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(s).await else {
                    return;
                };
                let svc =
                    hyper::service::service_fn(move |req: hyper::Request<Incoming>| async move {
                        Ok::<_, std::convert::Infallible>(answer(&req))
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), svc)
                    .await;
            });
        }
    });
    port
}
