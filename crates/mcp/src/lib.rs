//! MCP for cordon: the sandbox's tools served to other agents
//! ([`server`], over stdio and Streamable HTTP), and other servers' tools
//! offered to cordon's own model ([`client`], configured in [`config`]).

pub mod client;
pub mod config;
mod owned;
pub mod server;

pub use client::{McpClients, Report, qualified_name};
pub use config::{McpConfigError, ServerSpec};
pub use owned::{OwnedSessions, SessionHold, SessionOwners};
pub use server::{
    Exposure, HttpService, HttpSessions, McpTenant, SandboxServer, http_service, serve_stdio,
};
