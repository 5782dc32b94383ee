//! A scripted model server for cordon's tests.
//!
//! [`ScriptedServer`] listens on a loopback port and answers model requests from
//! a [`Scenario`]: an ordered list of turns written once, without reference to a
//! provider, and spoken in both wire protocols over real HTTP:
//!
//! - Anthropic Messages at `POST /v1/messages` (give clients [`ScriptedServer::url`]),
//!   streaming (`message_start`, `ping`, `content_block_*` with `text_delta`,
//!   `thinking_delta`/`signature_delta` and `input_json_delta`, `message_delta`,
//!   `message_stop`) or as one JSON message when `stream` is false;
//! - OpenAI Chat Completions at `POST /v1/chat/completions` (give clients
//!   [`ScriptedServer::openai_url`], which ends in `/v1`), streaming `chat.completion.chunk`s with `content` and
//!   `tool_calls` deltas, a `finish_reason`, a usage chunk when
//!   `stream_options.include_usage` is set, and `data: [DONE]`.
//!
//! Each request is checked: the turn's expectations must hold and every tool call
//! served in the previous reply must have a result. A request that fails a check,
//! or arrives when no turn is left, is answered with HTTP 400 naming the check
//! (`scripted_check` in the error body) and recorded in
//! [`ScriptedServer::failures`], so a test ends with
//! [`ScriptedServer::assert_finished`]. Faults are served before a turn's reply
//! and do not consume it, so a client's retry gets the reply.
//!
//! # Scenario files
//!
//! JSON, or TOML when the file name ends in `.toml`:
//!
//! ```toml
//! [[turns]]
//! content = [
//!   { type = "thinking", thinking = "The user wants a file." },
//!   { type = "text", text = "I'll write it." },
//!   { type = "tool_use", id = "toolu_1", name = "write_file", input = { path = "hello.py", content = "print('hi')" } },
//! ]
//! usage = { input_tokens = 120, output_tokens = 30, cache_read_input_tokens = 1000 }
//! # The first attempt gets a 529 with retry-after, the second loses its stream.
//! faults = [
//!   { http_status = 529, retry_after = 1 },
//!   { stream_error = 3 },
//! ]
//!
//! [[turns]]
//! expect_tool_results = ["toolu_1"]
//! expect_contains = ["hello.py"]
//! expect_max_input_chars = 50000
//! content = [{ type = "text", text = "Done." }]
//! # stop_reason defaults to tool_use when the reply calls a tool, else end_turn.
//! stop_reason = "end_turn"
//! ```
//!
//! Fault fields (`times` attempts each, default 1): `http_status` with optional
//! `retry_after`, `stream_error` (events before an in-stream overloaded error),
//! `disconnect_after` (events before the connection is dropped),
//! `malformed_tool_json`, `chunk_delay_ms`, `auth_error`, `model_not_found`,
//! `context_too_long = { tokens, maximum }`.
//!
//! # In Rust
//!
//! ```no_run
//! use cordon_testkit::{Fault, Scenario, ScriptedServer, Turn};
//! use serde_json::json;
//!
//! let server = ScriptedServer::start(
//!     Scenario::new()
//!         .turn(
//!             Turn::text("Listing.")
//!                 .with_tool_call("toolu_1", "bash", json!({"command": "ls"}))
//!                 .fault(Fault::http(429).retry_after(2)),
//!         )
//!         .turn(Turn::text("Done.").expect_tool_results(["toolu_1"])),
//! );
//! // ... point the provider at server.url() and run the agent ...
//! server.assert_finished();
//! ```

mod anthropic;
pub mod environments;
pub mod forge;
pub mod git_remote;
mod inspect;
pub mod layout;
pub mod oci;
mod openai;
pub mod race;
pub mod registry;
mod scenario;
mod server;
mod wire;

use std::net::SocketAddr;
use std::path::PathBuf;

pub use scenario::{Block, ContextTooLong, Fault, Scenario, StopReason, Turn, Usage};
pub use server::{Failure, RecordedRequest, ScriptedServer};
pub use wire::Protocol;

/// Why a scenario could not be loaded or the server could not start.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot read scenario {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("invalid JSON scenario: {0}")]
    Json(serde_json::Error),
    #[error("invalid TOML scenario: {0}")]
    Toml(toml::de::Error),
    #[error("invalid scenario: {0}")]
    Invalid(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the server thread: {0}")]
    Runtime(std::io::Error),
}

/// The modules from the bottom up: each may use only those before it
/// (`layout`, the checker, uses none).
pub const LAYERS: &[&str] = &[
    "environments",
    "forge",
    "git_remote",
    "oci",
    "race",
    "registry",
    "scenario",
    "wire",
    "anthropic",
    "openai",
    "inspect",
    "server",
];

#[cfg(test)]
mod layering {
    crate::layering_test!(crate::LAYERS);
}
