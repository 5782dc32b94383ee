//! The egress broker: the only way out of a sandbox whose network is
//! `allow`. An HTTP/1.1 proxy on the host, fed one stream per sandbox
//! connection, that carries a request only when the policy allows it.
//!
//! The rules it keeps:
//! - **By name and port.** A request names a host (`CONNECT host:port`, or
//!   an absolute-form `GET http://host[:port]/...`); the [`Policy`] must list
//!   that host and port (see [`policy`] for the rule syntax). IP literals
//!   pass only an IP or CIDR rule.
//! - **The broker resolves.** The sandbox has no DNS; the broker resolves
//!   the name ([`Resolve`]) and connects to exactly the address it checked,
//!   never resolving twice (no DNS rebinding). Addresses that are not public
//!   (loopback, RFC 1918, CGNAT, link-local and the metadata range, ULA,
//!   multicast, unspecified, and their IPv4-mapped, IPv4-compatible, NAT64
//!   and 6to4 spellings; see [`addr`]) are skipped unless the policy names
//!   them or sets `allow_private`. Each permitted address is tried in turn.
//! - **The tunnel must be what it says.** After `CONNECT` to a *name* the
//!   first bytes must be a TLS ClientHello (read across as many segments as
//!   it takes, up to [`BrokerConfig::max_hello_bytes`]) whose SNI equals the
//!   name; no SNI, another name, or no TLS closes the tunnel. A `CONNECT` to
//!   an IP literal (which needed an explicit IP rule) is not inspected.
//! - **Plain HTTP** is forwarded to the origin-form path, with `Host` set
//!   to the checked host and hop-by-hop and `Proxy-*` headers removed. A
//!   sandbox connection's upstream connection is kept for its next request
//!   to the same host and port, once the policy allows that request too
//!   and the connection is idle (hyper frames each response); any other
//!   request ends it. `https://` in absolute form and `Upgrade` are
//!   refused: use CONNECT.
//! - **Bounded.** Request heads are capped ([`BrokerConfig::max_header_bytes`]),
//!   header reads, connects, the ClientHello and idle tunnels are timed,
//!   data flows through fixed buffers with backpressure, and at most
//!   [`BrokerConfig::max_connections`] streams are served at once; past that
//!   a stream gets `503` and is closed.
//! - **Everything is reported.** Each CONNECT and each plain upstream
//!   connection (its requests to one host) ends in one [`NetEvent`] (decision, closed [`Reason`], bytes, duration, and a
//!   line for the model). A refusal before the tunnel opens answers `403`
//!   with that line: `network: HOST:PORT refused by policy (allowed: ...)`.
//! - **Secrets stay outside.** With an [`Intercept`], tunnels to a secret's
//!   hosts are terminated with a per-sandbox CA and their request heads get
//!   the real value in place of the placeholder ([`secrets`]).
//! - **Live policy.** [`PolicyHandle`] swaps the policy; new connections see
//!   the new one at once and open tunnels it no longer allows are closed.

pub mod addr;
pub mod events;
pub mod fetch;
mod io;
pub mod policy;
pub mod preset_table;
pub mod presets;
mod proxy;
pub mod resolve;
pub mod secrets;
pub mod sni;

pub use events::{Decision, EventSink, NetEvent, Reason};
pub use policy::{Entry, Host, Policy, PolicyError, PolicyHandle, PolicySpec, Ports, Rule, Target};
pub use preset_table::{ConfigStamp, PresetTable};
pub use presets::{Expansion, PresetEnv};
pub use proxy::{
    BROKER_HEADER, Broker, BrokerConfig, is_websocket_upgrade, keep_list_items,
    mark_websocket_upgrade, strip_hop_by_hop,
};
pub use resolve::{Resolve, StaticResolver, SystemResolver};
pub use secrets::{Intercept, Secret, SecretError, SecretSpec};

/// The modules from the bottom up: each may use only those before it
/// (checked by `layout.rs`).
pub const LAYERS: &[&str] = &[
    "addr",
    "events",
    "fetch",
    "io",
    "resolve",
    "sni",
    "policy",
    "presets",
    "secrets",
    "preset_table",
    "proxy",
];

#[cfg(test)]
mod layout;
