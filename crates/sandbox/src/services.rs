//! Per-sandbox host-side services: work cordon does on the host for one
//! sandbox, for as long as that sandbox lives, which the sandbox reaches
//! only through a channel its backend gives it (natively, a socket the
//! outer supervisor passes into the sandbox; in a microVM, a virtio serial
//! port). There are none yet; the network broker belongs here.
//!
//! A backend starts them in its `create`, before it launches the sandbox
//! (the channels are part of the launch), and hands them to the session in
//! [`crate::session::ConnectParams`], which holds them until it ends.

use crate::config::SandboxConfig;
use crate::error::Result;

/// The host-side services of one sandbox.
#[derive(Debug, Default)]
pub(crate) struct Services {}

impl Services {
    /// Starts the services `config` asks for.
    pub(crate) fn start(_config: &SandboxConfig) -> Result<Services> {
        Ok(Services::default())
    }
}
