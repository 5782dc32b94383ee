//! The cordon agent: the loop that streams a model's answer and runs the
//! tools it asks for in one sandbox session per conversation, and the
//! session log that keeps every conversation on disk.
//!
//! So far this crate holds the session log, the provider-neutral message
//! model, and both providers' request bodies and stream decoding; the HTTP clients, the
//! loop and context management follow (issue 3).

pub mod agent;
pub mod config;
pub mod context;
pub mod log;
pub mod message;
pub mod provider;
pub mod sessions;
pub mod stream;
pub mod wire;

pub use agent::{Agent, AgentConfig, AgentError, AgentEvent, Cancel, TurnOutcome};
pub use log::{LoadReport, LogError, Record, SessionLog};
pub use message::{AssistantMessage, ContentBlock, StopReason, StreamDelta, Usage};
pub use provider::{Provider, ProviderConfig, ProviderError, ProviderKind};
pub use stream::{AnthropicStream, OpenAiStream, StreamError};
pub use wire::{ApiFailure, Message, ModelRequest, ToolResult, ToolSpec};
