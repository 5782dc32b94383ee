//! The accept loop: TCP connections, and TLS handshakes each in a task of
//! its own, handed on once they are ready.

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_rustls::server::TlsStream;

use crate::Tls;

/// How long a client has to finish its TLS handshake.
const HANDSHAKE: Duration = Duration::from_secs(10);
/// Handshakes in flight at once; connections past it are closed at once
/// rather than queued behind clients that may never finish.
const MAX_HANDSHAKES: usize = 512;
/// Ready connections not yet taken by the server.
const READY: usize = 64;

/// An accepted connection, plain or TLS.
pub enum Conn {
    Plain(TcpStream),
    Tls(Box<TlsStream<TcpStream>>),
}

/// A connection as its requests see it (axum's `ConnectInfo`, with
/// `into_make_service_with_connect_info::<Peer>`): who is at the other
/// end, and a way to cut the connection off.
#[derive(Debug, Clone)]
pub struct Peer {
    pub addr: SocketAddr,
    /// The connection's socket, a second descriptor of it: held by the
    /// connection's service, so it closes with the connection.
    socket: Option<Arc<OwnedFd>>,
}

impl Peer {
    /// Ends the connection with a TCP reset instead of a close once the
    /// server lets go of it. A response cut short over HTTP/1.1 otherwise
    /// reads as the server's protocol error; a reset reads as the
    /// connection lost, which is what a client must see when what it was
    /// following is gone (HTTP/2 would reset the stream).
    pub fn reset_on_close(&self) {
        if let Some(s) = &self.socket
            && let Err(e) = rustix::net::sockopt::set_socket_linger(s, Some(Duration::ZERO))
        {
            tracing::debug!("{}: SO_LINGER: {e}", self.addr);
        }
    }
}

impl axum::extract::connect_info::Connected<axum::serve::IncomingStream<'_, Listener>> for Peer {
    fn connect_info(stream: axum::serve::IncomingStream<'_, Listener>) -> Peer {
        let fd = match stream.io() {
            Conn::Plain(s) => s.as_fd(),
            Conn::Tls(s) => s.get_ref().0.as_fd(),
        };
        Peer {
            addr: *stream.remote_addr(),
            socket: fd.try_clone_to_owned().ok().map(Arc::new),
        }
    }
}

/// Accepts on a TCP listener, with TLS when given. Dropping it stops
/// accepting and ends the handshakes in flight; connections already handed
/// on are their owner's.
pub struct Listener {
    addr: SocketAddr,
    tls: bool,
    ready: mpsc::Receiver<(Conn, SocketAddr)>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Listener {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Listener {
    /// Starts accepting on `tcp`; must be called within a Tokio runtime.
    pub fn new(tcp: TcpListener, tls: Option<Tls>) -> io::Result<Listener> {
        let addr = tcp.local_addr()?;
        let (tx, ready) = mpsc::channel(READY);
        let is_tls = tls.is_some();
        let task = tokio::spawn(run(tcp, tls.map(|t| t.acceptor()), tx));
        Ok(Listener {
            addr,
            tls: is_tls,
            ready,
            task,
        })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// `https` with TLS, else `http`.
    pub fn scheme(&self) -> &'static str {
        if self.tls { "https" } else { "http" }
    }

    /// The next connection ready to serve.
    pub async fn accept(&mut self) -> (Conn, SocketAddr) {
        match self.ready.recv().await {
            Some(c) => c,
            // The loop never ends on its own; dropped, nothing comes.
            None => std::future::pending().await,
        }
    }
}

impl axum::serve::Listener for Listener {
    type Io = Conn;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Conn, SocketAddr) {
        Listener::accept(self).await
    }

    fn local_addr(&self) -> io::Result<SocketAddr> {
        Ok(self.addr)
    }
}

async fn run(
    tcp: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    ready: mpsc::Sender<(Conn, SocketAddr)>,
) {
    let mut handshakes = JoinSet::new();
    loop {
        tokio::select! {
            accepted = tcp.accept() => {
                let (stream, peer) = match accepted {
                    Ok(a) => a,
                    Err(e) => {
                        // Out of descriptors, say: wait rather than spin.
                        tracing::warn!("accept on {:?}: {e}", tcp.local_addr());
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue;
                    }
                };
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!("TCP_NODELAY: {e}");
                }
                let Some(acceptor) = &tls else {
                    if ready.send((Conn::Plain(stream), peer)).await.is_err() {
                        return;
                    }
                    continue;
                };
                if handshakes.len() >= MAX_HANDSHAKES {
                    tracing::debug!("{peer}: too many TLS handshakes in flight; closed");
                    continue;
                }
                let handshake = acceptor.accept(stream);
                let ready = ready.clone();
                handshakes.spawn(async move {
                    match tokio::time::timeout(HANDSHAKE, handshake).await {
                        Ok(Ok(s)) => {
                            let _ = ready.send((Conn::Tls(Box::new(s)), peer)).await;
                        }
                        Ok(Err(e)) => tracing::debug!("{peer}: TLS handshake: {e}"),
                        Err(_) => tracing::debug!("{peer}: TLS handshake timed out"),
                    }
                });
            }
            Some(_) = handshakes.join_next() => {}
            () = ready.closed() => return,
        }
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    fn tls() -> (Tls, tempfile::TempDir, Vec<u8>) {
        let dir = tempfile::tempdir().unwrap();
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.path().join("c.pem"), c.cert.pem()).unwrap();
        std::fs::write(dir.path().join("k.pem"), c.signing_key.serialize_pem()).unwrap();
        let tls = Tls::load(&dir.path().join("c.pem"), &dir.path().join("k.pem")).unwrap();
        (tls, dir, c.cert.der().to_vec())
    }

    async fn client(addr: SocketAddr, der: &[u8]) -> tokio_rustls::client::TlsStream<TcpStream> {
        let mut roots = rustls::RootCertStore::empty();
        roots.add(der.to_vec().into()).unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(config));
        let tcp = TcpStream::connect(addr).await.unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        connector.connect(name, tcp).await.unwrap()
    }

    /// Clients that connect and never speak hold up no one else: the next
    /// connection served is the one that finished its handshake.
    #[tokio::test]
    async fn silent_clients_do_not_stall_a_tls_listener() {
        let (tls, _dir, der) = tls();
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut listener = Listener::new(tcp, Some(tls)).unwrap();
        assert_eq!(listener.scheme(), "https");
        let addr = listener.local_addr();
        let mut silent = Vec::new();
        for _ in 0..8 {
            silent.push(TcpStream::connect(addr).await.unwrap());
        }
        let server = tokio::spawn(async move {
            let (mut conn, _) = listener.accept().await;
            assert!(matches!(conn, Conn::Tls(_)));
            let mut b = [0u8; 5];
            conn.read_exact(&mut b).await.unwrap();
            conn.write_all(&b).await.unwrap();
            conn.flush().await.unwrap();
            listener
        });
        let mut c = tokio::time::timeout(Duration::from_secs(5), client(addr, &der))
            .await
            .expect("the handshake waited behind silent clients");
        c.write_all(b"hello").await.unwrap();
        let mut b = [0u8; 5];
        c.read_exact(&mut b).await.unwrap();
        assert_eq!(&b, b"hello");
        server.await.unwrap();
    }

    #[tokio::test]
    async fn a_plain_listener_hands_on_connections_without_nagle() {
        let tcp = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut listener = Listener::new(tcp, None).unwrap();
        assert_eq!(listener.scheme(), "http");
        let _c = TcpStream::connect(listener.local_addr()).await.unwrap();
        let (conn, _) = listener.accept().await;
        let Conn::Plain(s) = conn else {
            panic!("not plain")
        };
        assert!(s.nodelay().unwrap());
    }
}
