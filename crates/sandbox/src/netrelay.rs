//! The host's end of the connections carried over the control channel
//! (`supervisor::relay`): a microVM guest's proxy connections, each
//! `NetOpen` an in-memory stream handed to the sandbox's broker, which
//! checks and carries it like any other; and the host's own dials to a
//! port inside the sandbox (`NetDial`), each a stream for its caller. Bytes
//! go both ways under the protocol's credit window, per
//! connection and direction, so one slow download cannot stall the
//! control channel and a guest that ignores the window is cut off, not
//! buffered without end: the guest's supervisor is the guest root's to
//! replace, so nothing it sends is trusted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use cordon_net::Broker;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{Notify, mpsc, oneshot};

use crate::protocol::{self, CHUNK, DIAL, HostMsg, SupMsg, WINDOW};

/// How long a dial may wait for the sandbox to connect: a port on its own
/// loopback answers at once, unless its listener's backlog is full.
const DIAL_TIMEOUT: Duration = Duration::from_secs(10);

/// What the relay hands its writer task.
enum ToBroker {
    Data(Vec<u8>),
    Eof,
}

struct Conn {
    to_broker: mpsc::UnboundedSender<ToBroker>,
    /// Bytes from the guest queued for the broker, not yet written.
    queued: Arc<AtomicU64>,
    /// Bytes sent to the guest, not yet acknowledged.
    unacked: Arc<AtomicU64>,
    acked: Arc<Notify>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Conn {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The connections of one sandbox.
pub(crate) struct NetRelay {
    /// Where a guest's own connections go (a microVM with egress); without
    /// one they are refused.
    broker: Option<Broker>,
    max: usize,
    tx: OnceLock<mpsc::UnboundedSender<Vec<u8>>>,
    conns: Mutex<HashMap<u64, Conn>>,
    /// Dials sent and not answered yet, by id: the caller waits for its
    /// stream (none: refused).
    dialing: Mutex<HashMap<u64, oneshot::Sender<Option<DuplexStream>>>>,
    dials: AtomicU64,
}

impl NetRelay {
    pub(crate) fn new(broker: Option<Broker>, max: usize) -> NetRelay {
        NetRelay {
            broker,
            max,
            tx: OnceLock::new(),
            conns: Mutex::new(HashMap::new()),
            dialing: Mutex::new(HashMap::new()),
            dials: AtomicU64::new(0),
        }
    }

    /// A stream to 127.0.0.1:`port` inside the sandbox, connected from
    /// inside by its supervisor.
    pub(crate) async fn dial(&self, port: u16) -> std::io::Result<DuplexStream> {
        use std::io::{Error, ErrorKind};
        let tx = self
            .tx
            .get()
            .ok_or_else(|| Error::new(ErrorKind::NotConnected, "the sandbox is not running"))?;
        let conn = DIAL | self.dials.fetch_add(1, Ordering::Relaxed);
        let (done, answer) = oneshot::channel();
        self.dialing().insert(conn, done);
        send(tx, &HostMsg::NetDial { conn, port });
        let refused = || {
            Error::new(
                ErrorKind::ConnectionRefused,
                format!("nothing accepts connections on port {port} inside the sandbox"),
            )
        };
        match tokio::time::timeout(DIAL_TIMEOUT, answer).await {
            Ok(Ok(Some(stream))) => Ok(stream),
            Ok(Ok(None)) => Err(refused()),
            // The session ended: its relay dropped every dial.
            Ok(Err(_)) => Err(Error::new(ErrorKind::NotConnected, "the sandbox ended")),
            Err(_) => {
                self.dialing().remove(&conn);
                send(tx, &HostMsg::NetClose { conn });
                Err(Error::new(
                    ErrorKind::TimedOut,
                    format!("port {port} inside the sandbox did not accept in time"),
                ))
            }
        }
    }

    /// The sandbox ended: every connection ends with it (its far end
    /// reads the end) and every dial waiting fails.
    pub(crate) fn end(&self) {
        let conns = std::mem::take(&mut *self.conns());
        drop(conns);
        self.dialing().clear();
    }

    fn dialing(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, oneshot::Sender<Option<DuplexStream>>>> {
        self.dialing.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where frames for the guest go: the session's writer.
    pub(crate) fn bind(&self, tx: mpsc::UnboundedSender<Vec<u8>>) {
        let _ = self.tx.set(tx);
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Conn>> {
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A `Net*` frame from the guest.
    pub(crate) fn on_frame(self: &Arc<Self>, msg: SupMsg) {
        let Some(tx) = self.tx.get() else {
            return;
        };
        match msg {
            SupMsg::NetOpen { conn } if conn & DIAL != 0 => {
                // The guest connected a dial: its caller gets the stream,
                // unless it stopped waiting.
                let waiting = self.dialing().remove(&conn);
                let stream = waiting.and_then(|w| Some((w, self.attach(conn, tx.clone())?)));
                match stream {
                    Some((w, stream)) => {
                        if w.send(Some(stream)).is_err() {
                            self.conns().remove(&conn);
                            send(tx, &HostMsg::NetClose { conn });
                        }
                    }
                    None => send(tx, &HostMsg::NetClose { conn }),
                }
            }
            SupMsg::NetOpen { conn } => match (&self.broker, self.attach(conn, tx.clone())) {
                (Some(broker), Some(stream)) => {
                    let broker = broker.clone();
                    let serve = tokio::spawn(async move { broker.serve_connection(stream).await });
                    if let Some(c) = self.conns().get_mut(&conn) {
                        c.tasks.push(serve);
                    }
                }
                (None, Some(_)) => {
                    self.conns().remove(&conn);
                    send(tx, &HostMsg::NetClose { conn });
                }
                (_, None) => {}
            },
            SupMsg::NetData { conn, data } => {
                let mut conns = self.conns();
                let Some(c) = conns.get(&conn) else {
                    return;
                };
                let queued = c.queued.fetch_add(data.len() as u64, Ordering::SeqCst);
                if queued + data.len() as u64 > WINDOW
                    || c.to_broker.send(ToBroker::Data(data)).is_err()
                {
                    conns.remove(&conn);
                    send(tx, &HostMsg::NetClose { conn });
                }
            }
            SupMsg::NetEof { conn } => {
                if let Some(c) = self.conns().get(&conn) {
                    let _ = c.to_broker.send(ToBroker::Eof);
                }
            }
            SupMsg::NetAck { conn, bytes } => {
                if let Some(c) = self.conns().get(&conn) {
                    let _ = c
                        .unacked
                        .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |u| {
                            Some(u.saturating_sub(bytes))
                        });
                    c.acked.notify_one();
                }
            }
            SupMsg::NetClose { conn } => {
                self.conns().remove(&conn);
                if let Some(w) = self.dialing().remove(&conn) {
                    let _ = w.send(None);
                }
            }
            _ => {}
        }
    }

    /// Carries connection `conn`: the stream returned is its far end (none,
    /// and the guest told, past the cap or for an id in use).
    fn attach(
        self: &Arc<Self>,
        conn: u64,
        tx: mpsc::UnboundedSender<Vec<u8>>,
    ) -> Option<DuplexStream> {
        let mut conns = self.conns();
        if conns.contains_key(&conn) || conns.len() >= self.max {
            drop(conns);
            send(&tx, &HostMsg::NetClose { conn });
            return None;
        }
        let (ours, theirs) = tokio::io::duplex(WINDOW as usize);
        let (mut rd, mut wr) = tokio::io::split(ours);
        let (to_broker, mut from_guest) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicU64::new(0));
        let unacked = Arc::new(AtomicU64::new(0));
        let acked = Arc::new(Notify::new());
        // Guest to the far end: write what arrives, acknowledge what is written.
        let writer = {
            let (tx, queued) = (tx.clone(), queued.clone());
            async move {
                while let Some(m) = from_guest.recv().await {
                    match m {
                        ToBroker::Data(d) => {
                            if wr.write_all(&d).await.is_err() {
                                break;
                            }
                            queued.fetch_sub(d.len() as u64, Ordering::SeqCst);
                            send(
                                &tx,
                                &HostMsg::NetAck {
                                    conn,
                                    bytes: d.len() as u64,
                                },
                            );
                        }
                        ToBroker::Eof => {
                            let _ = wr.shutdown().await;
                            break;
                        }
                    }
                }
            }
        };
        // Broker to guest, within the guest's window.
        let reader = {
            let (tx, unacked, acked) = (tx.clone(), unacked.clone(), acked.clone());
            async move {
                let mut buf = vec![0u8; CHUNK];
                loop {
                    while unacked.load(Ordering::SeqCst) >= WINDOW {
                        acked.notified().await;
                    }
                    let room = (WINDOW - unacked.load(Ordering::SeqCst)) as usize;
                    let n = rd.read(&mut buf[..room.min(CHUNK)]).await.unwrap_or(0);
                    if n == 0 {
                        send(&tx, &HostMsg::NetEof { conn });
                        break;
                    }
                    unacked.fetch_add(n as u64, Ordering::SeqCst);
                    send(
                        &tx,
                        &HostMsg::NetData {
                            conn,
                            data: buf[..n].to_vec(),
                        },
                    );
                }
            }
        };
        // Both ways done: the connection is forgotten (the guest forgets
        // its side the same way, without a frame).
        let relay = Arc::downgrade(self);
        let both = tokio::spawn(async move {
            tokio::join!(writer, reader);
            if let Some(r) = relay.upgrade() {
                r.conns().remove(&conn);
            }
        });
        conns.insert(
            conn,
            Conn {
                to_broker,
                queued,
                unacked,
                acked,
                tasks: vec![both],
            },
        );
        Some(theirs)
    }
}

fn send(tx: &mpsc::UnboundedSender<Vec<u8>>, msg: &HostMsg) {
    let mut buf = Vec::new();
    protocol::encode(msg, &mut buf);
    let _ = tx.send(buf);
}

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_net::{BrokerConfig, Policy, PolicyHandle, StaticResolver};

    fn relay(max: usize) -> (Arc<NetRelay>, mpsc::UnboundedReceiver<Vec<u8>>) {
        let broker = Broker::new(
            PolicyHandle::new(Policy::deny_all()),
            Arc::new(StaticResolver::new()),
            Arc::new(|_: cordon_net::NetEvent| {}),
            BrokerConfig::default(),
        );
        let relay = Arc::new(NetRelay::new(Some(broker), max));
        let (tx, rx) = mpsc::unbounded_channel();
        relay.bind(tx);
        (relay, rx)
    }

    async fn next(rx: &mut mpsc::UnboundedReceiver<Vec<u8>>) -> HostMsg {
        let buf = tokio::time::timeout(std::time::Duration::from_secs(5), rx.recv())
            .await
            .expect("a frame in time")
            .expect("the channel open");
        protocol::decode::<HostMsg>(&buf).unwrap().unwrap().0
    }

    /// A guest that answers a dial the host never made, or opens a
    /// connection of its own with no broker to take it, is refused.
    #[tokio::test]
    async fn unasked_answers_and_unbrokered_connections_are_refused() {
        let relay = Arc::new(NetRelay::new(None, 8));
        let (tx, mut rx) = mpsc::unbounded_channel();
        relay.bind(tx);
        relay.on_frame(SupMsg::NetOpen { conn: DIAL | 5 });
        assert!(matches!(next(&mut rx).await, HostMsg::NetClose { conn } if conn == DIAL | 5));
        relay.on_frame(SupMsg::NetOpen { conn: 3 });
        assert!(matches!(next(&mut rx).await, HostMsg::NetClose { conn: 3 }));
        assert!(relay.conns().is_empty());
    }

    /// A dial the guest refuses fails at once; one it connects carries
    /// bytes both ways.
    #[tokio::test]
    async fn a_dial_is_refused_or_carried() {
        let relay = Arc::new(NetRelay::new(None, 8));
        let (tx, mut rx) = mpsc::unbounded_channel();
        relay.bind(tx);
        let dial = tokio::spawn({
            let relay = relay.clone();
            async move { relay.dial(80).await }
        });
        let HostMsg::NetDial { conn, port: 80 } = next(&mut rx).await else {
            panic!("no dial");
        };
        assert_ne!(conn & DIAL, 0);
        relay.on_frame(SupMsg::NetClose { conn });
        let err = dial.await.unwrap().err().unwrap();
        assert_eq!(err.kind(), std::io::ErrorKind::ConnectionRefused);

        let dial = tokio::spawn({
            let relay = relay.clone();
            async move { relay.dial(81).await }
        });
        let HostMsg::NetDial { conn, port: 81 } = next(&mut rx).await else {
            panic!("no dial");
        };
        relay.on_frame(SupMsg::NetOpen { conn });
        let mut stream = dial.await.unwrap().unwrap();
        stream.write_all(b"hi").await.unwrap();
        loop {
            if let HostMsg::NetData { conn: c, data } = next(&mut rx).await {
                assert_eq!((c, data.as_slice()), (conn, &b"hi"[..]));
                break;
            }
        }
        relay.on_frame(SupMsg::NetData {
            conn,
            data: b"yo".to_vec(),
        });
        let mut got = [0u8; 2];
        stream.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"yo");
    }

    /// A guest that sends past the window is cut off, not buffered.
    #[tokio::test]
    async fn a_guest_past_its_window_is_cut_off() {
        let (relay, mut rx) = relay(8);
        relay.on_frame(SupMsg::NetOpen { conn: 1 });
        relay.on_frame(SupMsg::NetData {
            conn: 1,
            data: vec![0; WINDOW as usize + 1],
        });
        assert!(matches!(next(&mut rx).await, HostMsg::NetClose { conn: 1 }));
        assert!(relay.conns().is_empty());
    }

    /// Connections past the cap, and a reused id, are refused at once.
    #[tokio::test]
    async fn connections_past_the_cap_are_refused() {
        let (relay, mut rx) = relay(2);
        for conn in 1..=2 {
            relay.on_frame(SupMsg::NetOpen { conn });
        }
        relay.on_frame(SupMsg::NetOpen { conn: 3 });
        relay.on_frame(SupMsg::NetOpen { conn: 1 });
        let mut closed = Vec::new();
        while closed.len() < 2 {
            if let HostMsg::NetClose { conn } = next(&mut rx).await {
                closed.push(conn);
            }
        }
        assert_eq!(closed, [3, 1]);
        assert_eq!(relay.conns().len(), 2);
    }

    /// A request through the relay reaches the broker, whose refusal comes
    /// back, and the connection is forgotten once both sides are done.
    #[tokio::test]
    async fn a_request_is_answered_and_forgotten() {
        let (relay, mut rx) = relay(8);
        relay.on_frame(SupMsg::NetOpen { conn: 7 });
        relay.on_frame(SupMsg::NetData {
            conn: 7,
            data: b"CONNECT evil.example:443 HTTP/1.1\r\nHost: evil.example:443\r\n\r\n".to_vec(),
        });
        let mut answer = String::new();
        while !answer.ends_with("refused by policy (allowed: nothing)\n") {
            if let HostMsg::NetData { conn: 7, data } = next(&mut rx).await {
                answer.push_str(&String::from_utf8_lossy(&data));
            }
        }
        assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
        // The program is done; the broker ends the connection in turn.
        relay.on_frame(SupMsg::NetEof { conn: 7 });
        while !matches!(next(&mut rx).await, HostMsg::NetEof { conn: 7 }) {}
        for _ in 0..100 {
            if relay.conns().is_empty() {
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(10)).await;
        }
        panic!("the connection was not forgotten");
    }
}
