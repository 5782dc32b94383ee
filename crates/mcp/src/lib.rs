//! MCP for cordon: the sandbox's tools served to other agents
//! ([`server`], over stdio and Streamable HTTP), and other servers' tools
//! offered to cordon's own model ([`client`], configured in [`config`]).

pub mod client;
pub mod config;
mod owned;
pub mod server;

pub use client::{McpClients, Report, qualified_name};
pub use config::{McpConfigError, ServerSpec};
pub use owned::{McpTenant, OwnedSessions, SessionHold, SessionOwners};
pub use server::{Exposure, HttpService, HttpSessions, SandboxServer, http_service, serve_stdio};

/// The modules from the bottom up: each may use only those before it
/// (checked by `layout.rs`).
pub const LAYERS: &[&str] = &["config", "owned", "client", "server"];

#[cfg(test)]
mod layout;
