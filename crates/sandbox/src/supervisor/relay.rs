//! Connections carried over the control channel as `Net*` frames, under
//! the same credit window as an exec's streams ([`WINDOW`] unacknowledged
//! bytes per connection and direction), both ways:
//!
//! - out: a microVM guest's way to the egress broker. The supervisor
//!   listens on 127.0.0.1 at the proxy port inside the guest and carries
//!   each accepted connection to the host, which hands it to its broker;
//!   nothing here decides what is allowed. (Natively the host accepts on
//!   the listening socket itself; see `setup::hand_over_proxy_listener`.)
//! - in: the host's forwarded ports, on both backends. The host asks for a
//!   connection to a port on the sandbox's own loopback (`NetDial`, its id
//!   marked with [`DIAL`]); the supervisor connects from inside, so what
//!   the sandbox serves is reached without the sandbox gaining a route.
//!
//! Part of the supervisor's single-threaded `poll` loop: [`Relay::poll_fds`]
//! says what to wait for, the `on_*` methods act on what `poll` reported,
//! and frames for the host go out through the caller's `send`.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};

use crate::protocol::{CHUNK, SupMsg, WINDOW};

/// Connections open at once; one more is accepted and closed at once.
const MAX_CONNS: usize = 256;

pub(super) use crate::protocol::DIAL;

/// What the loop waits for on one descriptor of the relay.
#[derive(Clone, Copy)]
pub(super) enum NetTag {
    Listen,
    Read(u64),
    Write(u64),
}

struct Conn {
    sock: OwnedFd,
    /// A dial whose connect has not finished yet.
    connecting: bool,
    /// From the broker, not yet written to the program.
    pending: Vec<u8>,
    /// The broker finished writing: shut our write side once `pending` is.
    eof_in: bool,
    /// The program finished writing (or its side failed).
    eof_out: bool,
    /// Sent to the host and not yet acknowledged.
    unacked: u64,
}

pub(super) struct Relay {
    /// The guest's proxy listener, with a microVM's egress.
    listener: Option<OwnedFd>,
    conns: BTreeMap<u64, Conn>,
    next: u64,
}

impl Relay {
    /// Relays the host's dials, and the connections `listener`
    /// (non-blocking, listening) accepts.
    pub(super) fn new(listener: Option<OwnedFd>) -> Relay {
        Relay {
            listener,
            conns: BTreeMap::new(),
            next: 1,
        }
    }

    /// The descriptors to poll and what for; `backlog`: the control
    /// channel is full, so read nothing more from programs.
    pub(super) fn poll_fds(&self, backlog: bool, out: &mut Vec<(RawFd, i16, NetTag)>) {
        if let Some(l) = &self.listener {
            out.push((l.as_raw_fd(), libc::POLLIN, NetTag::Listen));
        }
        for (&id, c) in &self.conns {
            if c.connecting {
                out.push((c.sock.as_raw_fd(), libc::POLLOUT, NetTag::Write(id)));
                continue;
            }
            if !c.eof_out && !backlog && c.unacked < WINDOW {
                out.push((c.sock.as_raw_fd(), libc::POLLIN, NetTag::Read(id)));
            }
            if !c.pending.is_empty() {
                out.push((c.sock.as_raw_fd(), libc::POLLOUT, NetTag::Write(id)));
            }
        }
    }

    pub(super) fn on_listen(&mut self, send: &mut impl FnMut(&SupMsg)) {
        let Some(listener) = &self.listener else {
            return;
        };
        loop {
            let sock = match rustix::net::accept_with(
                listener,
                rustix::net::SocketFlags::NONBLOCK | rustix::net::SocketFlags::CLOEXEC,
            ) {
                Ok(s) => s,
                Err(_) => return,
            };
            if self.conns.len() >= MAX_CONNS {
                continue; // dropped: the program sees the connection close
            }
            let id = self.next;
            self.next += 1;
            self.conns.insert(
                id,
                Conn {
                    sock,
                    connecting: false,
                    pending: Vec::new(),
                    eof_in: false,
                    eof_out: false,
                    unacked: 0,
                },
            );
            send(&SupMsg::NetOpen { conn: id });
        }
    }

    pub(super) fn on_read(&mut self, id: u64, buf: &mut [u8], send: &mut impl FnMut(&SupMsg)) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        let room = (WINDOW - c.unacked.min(WINDOW)) as usize;
        let want = buf.len().min(CHUNK).min(room);
        if want == 0 {
            return;
        }
        match rustix::io::read(&c.sock, &mut buf[..want]) {
            Ok(0) => {
                c.eof_out = true;
                send(&SupMsg::NetEof { conn: id });
                self.maybe_shut(id);
            }
            Ok(n) => {
                c.unacked += n as u64;
                send(&SupMsg::NetData {
                    conn: id,
                    data: buf[..n].to_vec(),
                });
            }
            Err(rustix::io::Errno::AGAIN) | Err(rustix::io::Errno::INTR) => {}
            Err(_) => self.close(id, send),
        }
    }

    /// The host's `NetDial`: a connection to 127.0.0.1:`port` here. It is
    /// `NetOpen` once connected, `NetClose` if it cannot be.
    pub(super) fn on_dial(&mut self, id: u64, port: u16, send: &mut impl FnMut(&SupMsg)) {
        // The host's ids are marked, so that they never meet the guest's
        // own; a reused or unmarked one is refused.
        if id & DIAL == 0 || self.conns.contains_key(&id) || self.conns.len() >= MAX_CONNS {
            send(&SupMsg::NetClose { conn: id });
            return;
        }
        match dial(port) {
            Ok((sock, connecting)) => {
                self.conns.insert(
                    id,
                    Conn {
                        sock,
                        connecting,
                        pending: Vec::new(),
                        eof_in: false,
                        eof_out: false,
                        unacked: 0,
                    },
                );
                if !connecting {
                    send(&SupMsg::NetOpen { conn: id });
                }
            }
            Err(_) => send(&SupMsg::NetClose { conn: id }),
        }
    }

    pub(super) fn on_write(&mut self, id: u64, send: &mut impl FnMut(&SupMsg)) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        if c.connecting {
            match rustix::net::sockopt::socket_error(&c.sock) {
                Ok(Ok(())) => {
                    c.connecting = false;
                    send(&SupMsg::NetOpen { conn: id });
                }
                _ => self.close(id, send),
            }
            return;
        }
        let mut wrote = 0usize;
        while wrote < c.pending.len() {
            // A program that closed its socket must not kill the supervisor
            // with SIGPIPE.
            match rustix::net::send(
                &c.sock,
                &c.pending[wrote..],
                rustix::net::SendFlags::NOSIGNAL,
            ) {
                Ok(n) => wrote += n,
                Err(rustix::io::Errno::AGAIN) => break,
                Err(rustix::io::Errno::INTR) => continue,
                Err(_) => {
                    self.close(id, send);
                    return;
                }
            }
        }
        c.pending.drain(..wrote);
        if wrote > 0 {
            send(&SupMsg::NetAck {
                conn: id,
                bytes: wrote as u64,
            });
        }
        self.maybe_shut(id);
    }

    /// A frame from the host about a connection.
    pub(super) fn on_host_data(&mut self, id: u64, data: Vec<u8>, send: &mut impl FnMut(&SupMsg)) {
        let Some(c) = self.conns.get_mut(&id) else {
            return;
        };
        // The host keeps to the window; one that does not is cut off here
        // rather than filling the guest's memory.
        if c.pending.len() as u64 + data.len() as u64 > WINDOW {
            self.close(id, send);
            return;
        }
        c.pending.extend_from_slice(&data);
        self.on_write(id, send);
    }

    pub(super) fn on_host_eof(&mut self, id: u64) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.eof_in = true;
        }
        self.maybe_shut(id);
    }

    pub(super) fn on_host_ack(&mut self, id: u64, bytes: u64) {
        if let Some(c) = self.conns.get_mut(&id) {
            c.unacked = c.unacked.saturating_sub(bytes);
        }
    }

    pub(super) fn on_host_close(&mut self, id: u64) {
        self.conns.remove(&id);
    }

    /// Shuts the program's read side once the broker is done and every byte
    /// is written; forgets the connection once both sides are done.
    fn maybe_shut(&mut self, id: u64) {
        let Some(c) = self.conns.get(&id) else {
            return;
        };
        if c.eof_in && c.pending.is_empty() {
            let _ = rustix::net::shutdown(&c.sock, rustix::net::Shutdown::Write);
            if c.eof_out {
                self.conns.remove(&id);
            }
        }
    }

    /// Ends every connection, telling no one: their host has gone (see
    /// `HostMsg::Reattach`). The listener stays.
    pub(super) fn drop_all(&mut self) {
        self.conns.clear();
    }

    fn close(&mut self, id: u64, send: &mut impl FnMut(&SupMsg)) {
        if self.conns.remove(&id).is_some() {
            send(&SupMsg::NetClose { conn: id });
        }
    }
}

/// A non-blocking connection to 127.0.0.1:`port`, and whether it is still
/// being made.
fn dial(port: u16) -> io::Result<(OwnedFd, bool)> {
    use rustix::net::{AddressFamily, SocketAddrV4, SocketFlags, SocketType};
    let sock = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    let to = SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port);
    match rustix::net::connect(&sock, &to) {
        Ok(()) => Ok((sock, false)),
        Err(rustix::io::Errno::INPROGRESS) => Ok((sock, true)),
        Err(e) => Err(e.into()),
    }
}

/// The guest's listener on 127.0.0.1:`port`, non-blocking.
pub(super) fn listen(port: u16) -> io::Result<OwnedFd> {
    use rustix::net::{AddressFamily, SocketAddrV4, SocketFlags, SocketType};
    let sock = rustix::net::socket_with(
        AddressFamily::INET,
        SocketType::STREAM,
        SocketFlags::CLOEXEC | SocketFlags::NONBLOCK,
        None,
    )?;
    rustix::net::bind(
        &sock,
        &SocketAddrV4::new(std::net::Ipv4Addr::LOCALHOST, port),
    )?;
    rustix::net::listen(&sock, 128)?;
    Ok(sock)
}
