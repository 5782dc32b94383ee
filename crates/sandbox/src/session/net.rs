//! The host's end of a microVM guest's proxy connections: each `NetOpen`
//! from the guest's relay (`supervisor::relay`) becomes an in-memory
//! stream handed to the sandbox's broker, which checks and carries it like
//! any other. Bytes go both ways under the protocol's credit window, per
//! connection and direction, so one slow download cannot stall the
//! control channel and a guest that ignores the window is cut off, not
//! buffered without end: the guest's supervisor is the guest root's to
//! replace, so nothing it sends is trusted.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use cordon_net::Broker;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{Notify, mpsc};

use crate::protocol::{self, CHUNK, HostMsg, SupMsg, WINDOW};

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
    broker: Broker,
    max: usize,
    tx: OnceLock<mpsc::UnboundedSender<Vec<u8>>>,
    conns: Mutex<HashMap<u64, Conn>>,
}

impl NetRelay {
    pub(crate) fn new(broker: Broker, max: usize) -> NetRelay {
        NetRelay {
            broker,
            max,
            tx: OnceLock::new(),
            conns: Mutex::new(HashMap::new()),
        }
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
            SupMsg::NetOpen { conn } => self.open(conn, tx.clone()),
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
            }
            _ => {}
        }
    }

    fn open(self: &Arc<Self>, conn: u64, tx: mpsc::UnboundedSender<Vec<u8>>) {
        let mut conns = self.conns();
        if conns.contains_key(&conn) || conns.len() >= self.max {
            drop(conns);
            send(&tx, &HostMsg::NetClose { conn });
            return;
        }
        let (ours, theirs) = tokio::io::duplex(WINDOW as usize);
        let (mut rd, mut wr) = tokio::io::split(ours);
        let (to_broker, mut from_guest) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicU64::new(0));
        let unacked = Arc::new(AtomicU64::new(0));
        let acked = Arc::new(Notify::new());
        let broker = self.broker.clone();
        let serve = tokio::spawn(async move { broker.serve_connection(theirs).await });
        // Guest to broker: write what arrives, acknowledge what is written.
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
                tasks: vec![serve, both],
            },
        );
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
        let relay = Arc::new(NetRelay::new(broker, max));
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
