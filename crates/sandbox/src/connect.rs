//! Byte streams into the sandbox, for the host: to a TCP port on its own
//! loopback, and to a Unix socket in it.
//!
//! A port the sandbox's programs listen on (a dev server the agent
//! started) is reached by [`Sandbox::connect_tcp`]: the supervisor
//! connects from inside and carries the bytes over the control channel,
//! so the sandbox gains no route and the host shares no network with it.
//! [`Sandbox::forward`] serves such a port on a loopback port of the host
//! (`cordon run -p`).
//!
//! Servers of cordon's own that run in a sandbox for the host to reach
//! (the live view's x11vnc, JupyterLab) listen on Unix sockets in the
//! sandbox's own /tmp, never on a network port. One connection is one exec: a
//! small relay inside the sandbox copies the exec's stdin to the socket and
//! the socket to its stdout until either side closes, so the host only
//! moves bytes and whatever answers stays confined like everything else the
//! sandbox runs. What comes back is the sandbox's to shape: callers treat
//! it as hostile input.

use std::net::SocketAddr;

use tokio::io::DuplexStream;
use tokio::net::TcpListener;

use crate::config::Network;
use crate::error::{Error, Result};
use crate::session::{ExecRequest, Execution, Forward, Sandbox};

/// The relay: `argv[1]` is the socket. Python because it is in every
/// sandbox that runs code, and the relay must run inside the sandbox.
const RELAY: &str = r#"
import os, socket, sys, threading
s = socket.socket(socket.AF_UNIX)
s.connect(sys.argv[1])
def upstream():
    try:
        while True:
            d = os.read(0, 65536)
            if not d:
                break
            s.sendall(d)
    except OSError:
        pass
    try:
        s.shutdown(socket.SHUT_WR)
    except OSError:
        pass
threading.Thread(target=upstream, daemon=True).start()
try:
    while True:
        d = s.recv(65536)
        if not d:
            break
        v = memoryview(d)
        while v:
            v = v[os.write(1, v):]
except OSError:
    pass
"#;

impl Sandbox {
    /// Connects to the Unix socket at `socket` inside the sandbox. The
    /// execution's stdin goes to the socket and its stdout carries what
    /// the socket sends; it exits when the socket closes, at once (status
    /// 1, with Python's error on stderr) when nothing listens there.
    pub async fn connect_unix(&self, socket: &str) -> Result<Execution> {
        self.exec_stream(
            ExecRequest::argv(["python3", "-I", "-S", "-c", RELAY, socket]).stream_stdin(),
        )
        .await
    }
}

impl Sandbox {
    /// A connection to `port` on the sandbox's own loopback (127.0.0.1),
    /// made from inside. Refused (`Error::Io` of kind `ConnectionRefused`)
    /// when nothing listens there; a sandbox whose network is `off` has
    /// its loopback down, and nothing to connect to.
    pub async fn connect_tcp(&self, port: u16) -> Result<DuplexStream> {
        if self.network_kind() == Network::Off {
            return Err(Error::Config(
                "the sandbox's network is off, its loopback down: a port is reached with \
                 any other network (loopback at least)"
                    .into(),
            ));
        }
        Ok(self.inner.services.relay().dial(port).await?)
    }

    /// Serves `port` of the sandbox's loopback on `host`, an address of the
    /// host's loopback (port 0: any free one): each connection accepted
    /// there is carried to a new connection to `port` inside. Until the
    /// [`Forward`] is dropped or the sandbox ends.
    pub async fn forward(&self, host: SocketAddr, port: u16) -> Result<Forward> {
        if !host.ip().is_loopback() {
            return Err(Error::Config(format!(
                "a forwarded port listens on the host's loopback only, not {}",
                host.ip()
            )));
        }
        let listener = TcpListener::bind(host).await.map_err(|e| {
            Error::Config(format!(
                "cannot listen on {host} to forward port {port}: {e}"
            ))
        })?;
        let local = listener.local_addr()?;
        // Weak: a forward the sandbox holds must not keep it alive.
        let weak = std::sync::Arc::downgrade(&self.inner);
        let task = tokio::spawn(async move {
            loop {
                let Ok((mut client, _)) = listener.accept().await else {
                    continue;
                };
                let Some(inner) = weak.upgrade() else {
                    return;
                };
                let sandbox = Sandbox { inner };
                tokio::spawn(async move {
                    match sandbox.connect_tcp(port).await {
                        Ok(mut inside) => {
                            let _ = tokio::io::copy_bidirectional(&mut client, &mut inside).await;
                        }
                        // The client sees the connection close, as if
                        // nothing listened; the sandbox ended, the same.
                        Err(e) => tracing::debug!("forwarded port {port}: {e}"),
                    }
                });
            }
        });
        Ok(Forward { local, port, task })
    }
}

/// How every front end says where a forwarded port is: `port 3000 of the
/// sandbox: http://127.0.0.1:8080`.
pub fn forwarded(host: SocketAddr, port: u16) -> String {
    format!("port {port} of the sandbox: http://{host}")
}

impl Sandbox {
    /// The ports of its configuration forwarded from the host: where each
    /// listens, and the port inside it reaches.
    pub fn forwards(&self) -> Vec<(SocketAddr, u16)> {
        let f = self
            .inner
            .forwards
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        f.iter().map(|f| (f.local, f.port)).collect()
    }
}

impl Forward {
    /// Where it listens on the host.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }

    /// The port inside the sandbox it reaches.
    pub fn port(&self) -> u16 {
        self.port
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.task.abort();
    }
}
