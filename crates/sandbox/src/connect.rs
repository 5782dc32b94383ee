//! A byte stream to a Unix socket inside the sandbox, for the host.
//!
//! Servers that run in a sandbox for the host to reach (the live view's
//! x11vnc, JupyterLab) listen on Unix sockets in the sandbox's own /tmp,
//! never on a network port the host shares. One connection is one exec: a
//! small relay inside the sandbox copies the exec's stdin to the socket and
//! the socket to its stdout until either side closes, so the host only
//! moves bytes and whatever answers stays confined like everything else the
//! sandbox runs. What comes back is the sandbox's to shape: callers treat
//! it as hostile input.

use crate::error::Result;
use crate::session::{ExecRequest, Execution, Sandbox};

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
