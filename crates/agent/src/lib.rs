//! The cordon agent: the loop that streams a model's answer and runs the
//! tools it asks for in one sandbox session per conversation, and the
//! session log that keeps every conversation on disk.
//!
//! Layers, bottom up: the provider-neutral message model ([`message`]),
//! both wire protocols ([`wire`], [`stream`]) and their HTTP client
//! ([`provider`]); the loop ([`agent`]) with its context management
//! ([`context`]) and prices ([`pricing`]); the session log ([`log`],
//! [`record`], [`sessions`]) with the workspace's checkpoints bound to it
//! ([`checkpoints`]); and, on top, a live conversation from open to close
//! ([`Conversation`]), which every front end uses.

pub mod agent;
mod cancel;
pub mod checkpoints;
pub mod context;
mod conversation;
mod event;
pub mod events;
mod helpers;
pub mod hooks;
pub mod instructions;
mod live;
pub mod log;
pub mod message;
mod netlog;
pub mod pricing;
pub mod prompt;
pub mod provider;
pub mod record;
mod recorder;
pub mod rules;
pub mod sessions;
pub mod stream;
pub mod task;
pub mod wire;

pub use agent::{
    Agent, AgentConfig, AgentError, AgentEvent, Approval, Approver, Cancel, Compaction, Mode,
    Oversight, TurnOutcome, tool_failed,
};
pub use conversation::{Conversation, Ended, Opening};
pub use instructions::Instructions;
pub use log::{LoadReport, LogError, Record, SessionLog};
pub use message::{AssistantMessage, ContentBlock, StopReason, StreamDelta, Usage};
pub use prompt::Previews;
pub use provider::{Provider, ProviderConfig, ProviderError, ProviderKind};
pub use record::{PolicyRecord, SessionRecord};
pub use stream::{AnthropicStream, OpenAiStream, StreamError};
pub use wire::{ApiFailure, Message, ModelRequest, ToolResult, ToolSpec, WebSearch};

/// The modules from the bottom up: each may use only those before it
/// (checked by `layout.rs`).
pub const LAYERS: &[&str] = &[
    "message",
    "wire",
    "stream",
    "provider",
    "pricing",
    "log",
    "hooks",
    "rules",
    "instructions",
    "prompt",
    "cancel",
    "helpers",
    "context",
    "event",
    "record",
    "recorder",
    "netlog",
    "sessions",
    "checkpoints",
    "events",
    "live",
    "agent",
    "task",
    "conversation",
];

#[cfg(test)]
mod layout;
