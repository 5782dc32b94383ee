//! `cordon serve`: a jobs API over cordon's sandbox, with a queue that
//! lives in the database (SQLite or PostgreSQL), a bounded pool of workers
//! with a per-tenant limit, live events over SSE, and bearer-token tenants.
//!
//! Each job runs in its own sandbox over its own workspace,
//! `<data_dir>/jobs/<id>/workspace`, which the files API reads and writes
//! with the same no-escape rule as the agent's file tools.

pub mod caps;
pub mod desktop;
pub mod docs;
mod files;
pub mod http;
pub mod hub;
pub mod job;
pub mod jobs;
pub mod mcp;
pub mod network;
pub mod openapi;
pub mod routes;
pub mod runner;
pub mod server;
pub mod sessions;
pub mod store;
pub mod ui;

pub use server::{Running, ServeError, ServerConfig, Shared, start};
pub use store::Store;
