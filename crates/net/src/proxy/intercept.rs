//! A tunnel to a secret's host: TLS terminated with the sandbox's CA, each
//! request's head filled in, and sent on over verified TLS to the checked
//! address ([`crate::secrets`] says what is and is not substituted).

use std::pin::Pin;
use std::task::{Context, Poll};

use hyper::body::Frame;
use rustls::pki_types::ServerName;
use tokio::io::ReadBuf;

use super::forward::strip_hop_by_hop;
use super::*;
use crate::secrets::{self, Secret};

/// A stream whose first bytes were already read (the ClientHello) and are
/// replayed before the rest.
pub(super) struct Prefixed<S> {
    buf: Vec<u8>,
    pos: usize,
    inner: S,
}

impl<S> Prefixed<S> {
    pub(super) fn new(buf: Vec<u8>, inner: S) -> Prefixed<S> {
        Prefixed { buf, pos: 0, inner }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        if self.pos < self.buf.len() {
            let n = (self.buf.len() - self.pos).min(buf.remaining());
            let start = self.pos;
            buf.put_slice(&self.buf[start..start + n]);
            self.pos += n;
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }
    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }
    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Inner {
    /// Serves an intercepted tunnel until either side ends it.
    pub(super) async fn intercepted<C, U>(
        &self,
        icpt: &Intercept,
        secrets: Vec<Secret>,
        client: C,
        upstream: U,
        name: &str,
        port: u16,
    ) -> Reason
    where
        C: AsyncRead + AsyncWrite + Unpin + Send + 'static,
        U: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        // The real host first: if it cannot be verified there is no point
        // in answering the sandbox's handshake.
        let Ok(server_name) = ServerName::try_from(name.to_string()) else {
            return Reason::BadRequest;
        };
        let connector = tokio_rustls::TlsConnector::from(icpt.upstream());
        let tls_out = match tokio::time::timeout(
            self.config.connect_timeout,
            connector.connect(server_name, upstream),
        )
        .await
        {
            Ok(Ok(s)) => s,
            Ok(Err(e)) => {
                tracing::debug!("broker: {name}:{port}: upstream TLS: {e}");
                return Reason::UpstreamUnverified;
            }
            Err(_) => return Reason::Timeout,
        };
        let Ok(server_config) = icpt.server_config(name) else {
            return Reason::Broken;
        };
        let acceptor = tokio_rustls::TlsAcceptor::from(server_config);
        let tls_in =
            match tokio::time::timeout(self.config.hello_timeout, acceptor.accept(client)).await {
                Ok(Ok(s)) => s,
                _ => return Reason::Broken,
            };
        let (sender, conn) =
            match hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(tls_out)).await
            {
                Ok(x) => x,
                Err(_) => return Reason::Broken,
            };
        let upstream_task = tokio::spawn(conn);
        let sender = Arc::new(tokio::sync::Mutex::new(sender));
        let host_header = if port == 443 {
            name.to_string()
        } else {
            format!("{name}:{port}")
        };
        let Ok(host_value) = HeaderValue::from_str(&host_header) else {
            return Reason::BadRequest;
        };
        let secrets = Arc::new(secrets);
        let svc = service_fn(move |req: Request<Incoming>| {
            let (sender, secrets, host_value) =
                (sender.clone(), secrets.clone(), host_value.clone());
            async move {
                let (mut parts, body) = req.into_parts();
                strip_hop_by_hop(&mut parts.headers);
                if parts.uri.scheme().is_some() {
                    let pq = parts
                        .uri
                        .path_and_query()
                        .map(|pq| pq.as_str())
                        .unwrap_or("/");
                    parts.uri = pq.parse().unwrap_or_else(|_| Uri::from_static("/"));
                }
                secrets::fill(&mut parts.headers, &mut parts.uri, &secrets);
                parts.headers.insert(header::HOST, host_value);
                let mut sender = sender.lock().await;
                if sender.ready().await.is_err() {
                    return Ok::<_, Infallible>(text(
                        StatusCode::BAD_GATEWAY,
                        "network: the upstream connection closed; retry",
                    ));
                }
                Ok(
                    match sender.send_request(Request::from_parts(parts, body)).await {
                        Ok(resp) => {
                            let (mut parts, body) = resp.into_parts();
                            strip_hop_by_hop(&mut parts.headers);
                            secrets::scrub_head(&mut parts, &secrets);
                            // Trailers are headers too. None reach the
                            // sandbox while the Trailer header is stripped,
                            // but that is no guard to rely on.
                            let body = body.map_frame(move |f| match f.into_trailers() {
                                Ok(mut t) => {
                                    secrets::scrub(&mut t, &secrets);
                                    Frame::trailers(t)
                                }
                                Err(f) => f,
                            });
                            Response::from_parts(parts, body.boxed())
                        }
                        Err(e) => text(
                            StatusCode::BAD_GATEWAY,
                            &format!("network: upstream failed: {e}"),
                        ),
                    },
                )
            }
        });
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(TokioTimer::new())
            .header_read_timeout(self.config.header_timeout)
            .max_buf_size(self.config.max_header_bytes.max(8192))
            .max_headers(128);
        let r = builder.serve_connection(TokioIo::new(tls_in), svc).await;
        upstream_task.abort();
        if r.is_ok() {
            Reason::Listed
        } else {
            Reason::Broken
        }
    }
}
