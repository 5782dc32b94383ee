//! MCP for cordon: the sandbox's tools served to other agents
//! ([`server`], over stdio and Streamable HTTP), and other servers' tools
//! offered to cordon's own model ([`client`], configured in [`config`]).

pub mod client;
pub mod config;
pub mod server;

pub use client::{McpClients, Report, qualified_name};
pub use config::{McpConfigError, ServerSpec};
pub use server::{Exposure, McpTenant, SandboxServer, http_service, serve_stdio};
