//! `cordon serve`: a jobs API over cordon's sandbox, with a queue that
//! lives in the database (SQLite or PostgreSQL), a bounded pool of workers
//! with a per-tenant limit, live events over SSE, and bearer-token tenants.
//!
//! Each job runs in its own sandbox over its own workspace,
//! `<data_dir>/jobs/<id>/workspace`, which the files API reads and writes
//! with the same no-escape rule as the agent's file tools.
//!
//! # Layout
//!
//! The modules are layered, in the order of [`LAYERS`]: each may use only
//! the ones before it, so nothing imports in a circle (a test checks it).
//!
//! - Data: `job` (the request, checked once, its states and results),
//!   `owner` (what owns a sandbox: a job or a session), `store` (the
//!   database), `hub` (live events).
//! - HTTP plumbing: `http` (the error answer, the tenant of a token, typed
//!   bodies, ids and times); `cluster` (the key the processes of one
//!   deployment sign relayed requests with).
//! - Shared parts, each with its own type: `caps` (live-session caps),
//!   `files` (the files API over a workspace), `network` (ceilings and
//!   live policies), `repos` (reaching a job's repository for its
//!   tenant), `catalog` (the images tenants may name, their own among
//!   them, made roots; their quota and garbage collection),
//!   `sandboxes` (the live sandboxes by owner, and their Labs), `desktop` (the live view's bridge), `lab` (the Lab's
//!   opening and bearer route), `preview` (a port of a sandbox on an
//!   origin of its own), `live` (the sessions live in this
//!   process), `boxes` (the sandbox API's sandboxes live in this process,
//!   and their processes).
//! - `config`: what the server is told, and the parts of it others take
//!   alone (sandbox defaults, the jobs' directories).
//! - `metrics`: this process's Prometheus metrics.
//! - `pool`: warm pools, sandboxes made ahead for the jobs of their shape.
//! - `runner`: runs one claimed job, holding only what that takes (store,
//!   hub, directories, limits, the model, the live registries).
//! - `state`: the state handlers and workers share, built from the parts
//!   above.
//! - `slot`: a claimed job in one of this process's worker slots: run,
//!   then archived.
//! - `relay`: a job's requests sent on to the worker that runs it, and a
//!   worker's check of what it is sent.
//! - Resources, one module each: `health`, `ui`, `docs`, `mcp`, `jobs`,
//!   `sessions`, `sandbox_api` (sandboxes as a resource, and commands in
//!   them), `owned` (what a job, session or sandbox owns: files, network,
//!   desktop, Lab, served once over an `owner`), `e2b` (the stock E2B SDKs' API over the sandbox API), `hosts`
//!   (a sandbox's ports by name under a wildcard domain), `tokens`,
//!   `credentials` (the tenants' git logins),
//!   `tenants`, `images` (the catalog as a tenant sees it, and the
//!   tenant's own images: pulled, snapshotted, built by `build` jobs).
//! - On top: `openapi` (the document, from the resources' types and
//!   paths), `routes` (the router), `worker` (claims, leases, heartbeats,
//!   and settling a dead worker's jobs), `server` (start and listen).

pub mod archive;
mod boxes;
mod caps;
pub mod catalog;
pub mod cluster;
pub mod config;
mod credentials;
mod desktop;
pub mod docs;
mod e2b;
mod files;
mod health;
mod hosts;
pub mod http;
mod hub;
mod images;
pub mod job;
pub mod jobs;
mod lab;
mod live;
mod mcp;
pub mod metrics;
pub mod network;
pub mod openapi;
mod owned;
pub mod owner;
mod pool;
mod preview;
mod relay;
pub mod repos;
mod routes;
mod runner;
mod sandbox_api;
mod sandboxes;
mod server;
pub mod sessions;
mod slot;
pub mod state;
pub mod store;
mod tenants;
mod tokens;
pub mod ui;
mod worker;

pub use config::{AgentDefaults, ServerConfig};
pub use e2b::e2b_key;
pub use server::{Running, ServeError, Stopped, start};
pub use state::Shared;
pub use store::Store;

/// The crate's modules, lowest first: each may use only those before it.
pub const LAYERS: &[&str] = &[
    "job",
    "owner",
    "store",
    "hub",
    "http",
    "cluster",
    "archive",
    "caps",
    "files",
    "network",
    "repos",
    "catalog",
    "config",
    "sandboxes",
    "desktop",
    "lab",
    "preview",
    "live",
    "boxes",
    "metrics",
    "pool",
    "runner",
    "state",
    "slot",
    "relay",
    "health",
    "ui",
    "docs",
    "mcp",
    "jobs",
    "sessions",
    "sandbox_api",
    "owned",
    "e2b",
    "hosts",
    "tokens",
    "credentials",
    "tenants",
    "images",
    "openapi",
    "routes",
    "worker",
    "server",
];

#[cfg(test)]
mod layout;
