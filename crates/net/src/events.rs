//! What the broker reports: one [`NetEvent`] per connection or request,
//! allowed or not, on an [`EventSink`].

use std::sync::Arc;

use serde::{Deserialize, Serialize};

/// How the broker decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Decision {
    /// Allowed and carried.
    Allowed,
    /// Refused by the policy.
    Refused,
    /// Allowed by the policy but it did not work (resolution, connection,
    /// a malformed request, a timeout, too many connections).
    Failed,
}

/// Why, as a closed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Listed, carried to the end.
    Listed,
    /// No rule names the host.
    NotListed,
    /// A rule names the host, not on this port.
    PortNotListed,
    /// The name resolved only to restricted addresses (loopback, private,
    /// link-local, metadata...) that the policy does not allow.
    RestrictedAddress,
    /// The TLS ClientHello named another host than the CONNECT.
    SniMismatch,
    /// The TLS ClientHello named no host.
    NoSni,
    /// A tunnel to a host name did not start with a TLS ClientHello.
    NotTls,
    /// The policy changed and no longer allows this open tunnel.
    PolicyChanged,
    /// The name did not resolve.
    ResolveFailed,
    /// No address accepted the connection in time.
    ConnectFailed,
    /// The request was not one the proxy carries.
    BadRequest,
    /// Nothing moved for the idle timeout, or the ClientHello was too slow.
    Timeout,
    /// The sandbox had too many connections open.
    TooManyConnections,
    /// The upstream or the client broke the connection.
    Broken,
    /// The broker was closed (the sandbox ended) while this was open.
    BrokerClosed,
    /// An intercepted host's certificate did not verify.
    UpstreamUnverified,
}

/// One connection (CONNECT) or one request (plain HTTP) through the broker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NetEvent {
    /// The host as the request named it, normalised ("" when the request
    /// never got that far).
    pub host: String,
    pub port: u16,
    /// `CONNECT`, `GET`, ...
    pub method: String,
    pub decision: Decision,
    pub reason: Reason,
    /// The address connected to, if any.
    pub addr: Option<std::net::SocketAddr>,
    /// Bytes from the sandbox to the upstream.
    pub bytes_up: u64,
    /// Bytes from the upstream to the sandbox.
    pub bytes_down: u64,
    pub duration_ms: u64,
    /// One line for people and the model, e.g.
    /// `network: HOST:PORT refused by policy (allowed: ...)`.
    pub message: String,
    /// The tunnel's TLS was terminated to fill in secrets.
    #[serde(default)]
    pub intercepted: bool,
}

/// Where events go. Implemented for tokio's unbounded sender and for
/// closures; a sink must not block.
pub trait EventSink: Send + Sync + 'static {
    fn emit(&self, event: NetEvent);
}

impl EventSink for tokio::sync::mpsc::UnboundedSender<NetEvent> {
    fn emit(&self, event: NetEvent) {
        // The receiver gone means nobody is listening any more.
        let _ = self.send(event);
    }
}

impl<F: Fn(NetEvent) + Send + Sync + 'static> EventSink for F {
    fn emit(&self, event: NetEvent) {
        self(event)
    }
}

/// A sink that drops everything.
pub fn discard() -> Arc<dyn EventSink> {
    Arc::new(|_: NetEvent| {})
}
