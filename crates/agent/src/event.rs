//! What the loop reports and how a turn ends.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::message::{StopReason, Usage};
use crate::provider::ProviderError;

/// Whether a finished tool call failed, for a front end's mark: the tool
/// said so, or the command it ran exited non-zero (which is a result, not
/// a tool error, to the model).
pub fn tool_failed(is_error: bool, structured: Option<&Value>) -> bool {
    /// The part of a command tool's structured result this reads.
    #[derive(serde::Deserialize)]
    struct Exit {
        exit_code: Option<i64>,
    }
    is_error
        || structured
            .and_then(|v| Exit::deserialize(v).ok())
            .and_then(|e| e.exit_code)
            .is_some_and(|c| c != 0)
}

/// What the loop reports, in order. Serialised as one JSON object per
/// event with a `type` field (the `--json` output of `cordon exec`), and
/// so recorded in the session log, where a `SessionRecord` reads it back.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum AgentEvent {
    TurnStarted {
        step: u32,
    },
    TextDelta {
        text: String,
    },
    ThinkingDelta {
        text: String,
    },
    /// The request is being retried; drop what was streamed for it.
    Retrying {
        attempt: u32,
        wait_ms: u64,
        reason: String,
    },
    ToolCallStarted {
        id: String,
        name: String,
        input: serde_json::Value,
        /// What the call does, on one printable line, for the front ends
        /// to show (see `cordon_tools::label`). Absent from logs written
        /// before it was: a reader then makes one with `label::generic`.
        #[serde(default, skip_serializing_if = "String::is_empty")]
        label: String,
    },
    /// Output of a running tool call, as it arrives (`bash`, `run_code`);
    /// `ToolCallFinished` then carries the whole result.
    ToolOutput {
        id: String,
        stream: cordon_sandbox::Stream,
        text: String,
    },
    ToolCallFinished {
        id: String,
        name: String,
        output: String,
        is_error: bool,
        #[serde(skip_serializing_if = "Option::is_none")]
        structured: Option<serde_json::Value>,
        duration_ms: u64,
    },
    /// The model's plan changed (`update_plan`): the whole plan, which
    /// replaces the last. Model text: printable only where shown.
    PlanUpdated {
        #[serde(flatten)]
        plan: cordon_tools::update_plan::Plan,
    },
    /// One model answer is complete.
    AssistantMessage {
        text: String,
        stop_reason: StopReason,
        usage: Usage,
    },
    /// The older part of the conversation is being summarised.
    CompactionStarted {
        reason: String,
    },
    /// The older part of the conversation was replaced by a summary.
    Compacted {
        replaced_messages: usize,
        /// Estimated context before and after, in tokens.
        tokens_before: u64,
        tokens_after: u64,
        summary: String,
    },
    TurnCompleted {
        stop_reason: StopReason,
        steps: u32,
        usage: Usage,
        /// In US dollars at list prices; absent for models without a known price.
        #[serde(skip_serializing_if = "Option::is_none")]
        cost_usd: Option<f64>,
        /// What the next request would put in front of the model, estimated.
        /// (Logs from before compaction have neither.)
        #[serde(default)]
        context_tokens: u64,
        #[serde(default)]
        context_window: u64,
    },
    Error {
        message: String,
    },
    /// A hook of the user's failed (exited neither 0 nor 2, timed out, or
    /// could not run); the conversation went on as if it had said 0.
    HookFailed {
        event: crate::hooks::HookEvent,
        message: String,
    },
    /// The sandbox's network broker refused a connection, or could not
    /// make it, while a tool ran: each host and port once per tool call.
    /// The tool's result carries `message` too; this is its record.
    NetworkRefused {
        tool_id: String,
        host: String,
        port: u16,
        decision: cordon_net::Decision,
        reason: cordon_net::Reason,
        message: String,
    },
}

impl AgentEvent {
    /// The event as `cordon exec --json` prints it, and its `type`, which
    /// names it as a Server-Sent Event.
    pub fn to_json(&self) -> (String, Value) {
        let data = serde_json::to_value(self).unwrap_or_default();
        let kind = data["type"].as_str().unwrap_or("agent").to_string();
        (kind, data)
    }

    /// Streamed fragments: shown live, but not worth a log record each
    /// (the complete text is in `assistant_message`).
    pub fn is_delta(&self) -> bool {
        matches!(
            self,
            AgentEvent::TextDelta { .. }
                | AgentEvent::ThinkingDelta { .. }
                | AgentEvent::ToolOutput { .. }
        )
    }
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// The final answer's text.
    pub text: String,
    pub stop_reason: StopReason,
    /// Model requests made.
    pub steps: u32,
    /// Summed over the turn's requests, compaction included.
    pub usage: Usage,
    pub cost_usd: Option<f64>,
}

/// What one compaction did.
#[derive(Debug, Clone, PartialEq)]
pub struct Compaction {
    pub replaced_messages: usize,
    pub tokens_before: u64,
    pub tokens_after: u64,
    pub summary: String,
    /// The summary request's own tokens.
    pub usage: Usage,
}

/// Why a turn did not complete.
#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error(transparent)]
    Provider(#[from] ProviderError),
    #[error("cancelled")]
    Cancelled,
    #[error("stopped after {0} model requests without finishing (raise the step limit)")]
    StepLimit(u32),
    #[error("cannot compact the conversation: {0}")]
    Compaction(String),
}
