//! How cordon's HTTP servers accept connections: the API (`cordon serve`),
//! each Lab's own origin, and the workers' relay.
//!
//! - **No Nagle.** Every accepted socket gets `TCP_NODELAY`: event streams
//!   and kernel frames are small writes that must not wait for the peer's
//!   delayed ACK.
//! - **TLS off the accept path.** With [`Tls`], each handshake runs in a
//!   task of its own under a deadline, so a client that connects and says
//!   nothing holds up no one; only finished handshakes are handed on.
//! - **Certificates follow their files.** The certificate and key are read
//!   again when either file changes (looked at no more often than every few
//!   seconds), so a renewed certificate (cert-manager, certbot) is served
//!   without a restart; a bad pair is refused at start and, later, logged
//!   while the last good pair stays in use.
//!
//! [`Listener`] implements axum's listener trait and dropping it stops its
//! accept loop and every handshake in flight.

mod accept;
mod tls;

pub use accept::{Conn, Listener, Peer};
pub use tls::{Tls, TlsError};

/// The modules from the bottom up: each may use only those before it
/// (checked by `layout.rs`).
pub const LAYERS: &[&str] = &["accept", "tls"];

#[cfg(test)]
mod layout;
