//! The agent loop: send the conversation, stream the answer, run the tools
//! it asks for in the conversation's sandbox, send their results, repeat
//! until the model ends its turn.
//!
//! Every step is reported as an [`AgentEvent`], the one stream that every
//! front end renders. Whatever happens (an error, a cancellation, the step
//! limit), the history stays valid: every tool call the model made gets a
//! result before the next request.

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::Serialize;
use tokio::sync::{mpsc, watch};

use crate::message::{StopReason, StreamDelta, Usage};
use crate::provider::{Provider, ProviderError};
use crate::wire::{Message, ModelRequest, ToolResult, ToolSpec};
use cordon_tools::{ToolContext, ToolOutput, Toolbox};

/// What the loop reports, in order. Serialised as one JSON object per
/// event with a `type` field (the `--json` output of `cordon exec`).
#[derive(Debug, Clone, PartialEq, Serialize)]
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
    /// One model answer is complete.
    AssistantMessage {
        text: String,
        stop_reason: StopReason,
        usage: Usage,
    },
    TurnCompleted {
        stop_reason: StopReason,
        steps: u32,
        usage: Usage,
    },
    Error {
        message: String,
    },
}

/// How a turn ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TurnOutcome {
    /// The final answer's text.
    pub text: String,
    pub stop_reason: StopReason,
    /// Model requests made.
    pub steps: u32,
    /// Summed over the turn's requests.
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
}

/// A handle that cancels a running turn; cheap to clone.
#[derive(Clone)]
pub struct Cancel {
    tx: Arc<watch::Sender<bool>>,
}

impl Default for Cancel {
    fn default() -> Self {
        Cancel {
            tx: Arc::new(watch::channel(false).0),
        }
    }
}

impl Cancel {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn cancel(&self) {
        self.tx.send_replace(true);
    }

    pub fn is_cancelled(&self) -> bool {
        *self.tx.borrow()
    }

    /// Completes once cancelled.
    pub async fn cancelled(&self) {
        let mut rx = self.tx.subscribe();
        // The sender lives in self, so the channel cannot close under us.
        let _ = rx.wait_for(|c| *c).await;
    }

    /// A fresh handle for the next turn.
    pub fn reset(&self) {
        self.tx.send_replace(false);
    }
}

/// What the loop needs besides the conversation.
pub struct AgentConfig {
    pub model: String,
    pub system: String,
    pub max_tokens: u32,
    /// Model requests allowed per user message.
    pub max_steps: u32,
    /// Tool-result messages sent in full; older tool output is masked.
    pub keep_tool_outputs: usize,
}

/// One conversation: the provider, the tools and their sandbox context, and
/// the history sent to the model.
pub struct Agent {
    provider: Provider,
    tools: Toolbox,
    ctx: ToolContext,
    config: AgentConfig,
    history: Vec<Message>,
}

const CANCELLED: &str = "The user cancelled this tool call before it finished.";

impl Agent {
    pub fn new(provider: Provider, tools: Toolbox, ctx: ToolContext, config: AgentConfig) -> Self {
        Agent {
            provider,
            tools,
            ctx,
            config,
            history: Vec::new(),
        }
    }

    pub fn history(&self) -> &[Message] {
        &self.history
    }

    /// Continues an earlier conversation: `history` as sent to the model.
    pub fn with_history(mut self, history: Vec<Message>) -> Self {
        self.history = history;
        self
    }

    fn specs(&self) -> Vec<ToolSpec> {
        self.tools
            .specs()
            .into_iter()
            .map(|s| ToolSpec {
                name: s.name.to_string(),
                description: s.description.to_string(),
                input_schema: s.input_schema,
            })
            .collect()
    }

    /// Adds user text, merging into a trailing user message (left by a
    /// cancelled turn) so roles keep alternating.
    fn push_user_text(&mut self, prompt: &str) {
        if let Some(Message::User { text, .. }) = self.history.last_mut() {
            if !text.is_empty() {
                text.push_str("\n\n");
            }
            text.push_str(prompt);
        } else {
            self.history.push(Message::User {
                text: prompt.to_string(),
                tool_results: Vec::new(),
            });
        }
    }

    /// Runs one user turn to its end, reporting every step on `events`.
    pub async fn send(
        &mut self,
        prompt: &str,
        events: &mpsc::UnboundedSender<AgentEvent>,
        cancel: &Cancel,
    ) -> Result<TurnOutcome, AgentError> {
        let emit = |e: AgentEvent| {
            let _ = events.send(e);
        };
        self.push_user_text(prompt);
        let mut total = Usage::default();
        let tools = self.specs();
        for step in 1..=self.config.max_steps {
            emit(AgentEvent::TurnStarted { step });
            let request = ModelRequest {
                model: self.config.model.clone(),
                system: self.config.system.clone(),
                messages: crate::context::view(&self.history, self.config.keep_tool_outputs),
                tools: tools.clone(),
                max_tokens: self.config.max_tokens,
            };
            let streamed = self.provider.stream(&request, |d| {
                emit(match d {
                    StreamDelta::Text(text) => AgentEvent::TextDelta { text },
                    StreamDelta::Thinking(text) => AgentEvent::ThinkingDelta { text },
                    StreamDelta::Retrying {
                        attempt,
                        wait,
                        reason,
                    } => AgentEvent::Retrying {
                        attempt,
                        wait_ms: wait.as_millis() as u64,
                        reason,
                    },
                    // Tool calls are announced once their input is complete.
                    StreamDelta::ToolUseStart { .. } | StreamDelta::ToolInput(_) => return,
                })
            });
            let answer = tokio::select! {
                biased;
                _ = cancel.cancelled() => return Err(AgentError::Cancelled),
                r = streamed => match r {
                    Ok(a) => a,
                    Err(e) => {
                        emit(AgentEvent::Error { message: e.to_string() });
                        return Err(e.into());
                    }
                },
            };
            add_usage(&mut total, &answer.usage);
            emit(AgentEvent::AssistantMessage {
                text: answer.text(),
                stop_reason: answer.stop_reason,
                usage: answer.usage,
            });
            let calls: Vec<(String, String, serde_json::Value)> = answer
                .tool_uses()
                .map(|(id, name, input)| (id.to_string(), name.to_string(), input.clone()))
                .collect();
            let stop = answer.stop_reason;
            self.history.push(Message::Assistant(answer));
            if calls.is_empty() {
                emit(AgentEvent::TurnCompleted {
                    stop_reason: stop,
                    steps: step,
                    usage: total,
                });
                let text = match self.history.last() {
                    Some(Message::Assistant(a)) => a.text(),
                    _ => String::new(),
                };
                return Ok(TurnOutcome {
                    text,
                    stop_reason: stop,
                    steps: step,
                    usage: total,
                });
            }
            let results = if stop == StopReason::MaxTokens {
                // The answer was cut off: its calls may be incomplete.
                calls
                    .iter()
                    .map(|(id, _, _)| ToolResult {
                        tool_use_id: id.clone(),
                        content: "Not run: your answer reached max_tokens before it ended. Issue the call again.".into(),
                        is_error: true,
                    })
                    .collect()
            } else {
                self.run_tools(&calls, &emit, cancel).await
            };
            let cancelled = cancel.is_cancelled();
            self.history.push(Message::User {
                text: String::new(),
                tool_results: results,
            });
            if cancelled {
                return Err(AgentError::Cancelled);
            }
        }
        let message = AgentError::StepLimit(self.config.max_steps).to_string();
        emit(AgentEvent::Error { message });
        Err(AgentError::StepLimit(self.config.max_steps))
    }

    /// Runs the calls in order; consecutive read-only calls run together.
    /// Returns one result per call, in the calls' order, even when cancelled.
    async fn run_tools(
        &self,
        calls: &[(String, String, serde_json::Value)],
        emit: &impl Fn(AgentEvent),
        cancel: &Cancel,
    ) -> Vec<ToolResult> {
        let mut results: Vec<Option<ToolResult>> = vec![None; calls.len()];
        let mut i = 0;
        while i < calls.len() {
            let read_only = |n: &str| self.tools.get(n).is_some_and(|t| t.read_only());
            let mut j = i + 1;
            if read_only(&calls[i].1) {
                while j < calls.len() && read_only(&calls[j].1) {
                    j += 1;
                }
            }
            if cancel.is_cancelled() {
                break;
            }
            let batch = &calls[i..j];
            for (id, name, input) in batch {
                emit(AgentEvent::ToolCallStarted {
                    id: id.clone(),
                    name: name.clone(),
                    input: input.clone(),
                });
            }
            let runs = batch.iter().map(|(_, name, input)| {
                let started = Instant::now();
                async move {
                    let out = self.tools.call(&self.ctx, name, input.clone()).await;
                    (out, started.elapsed())
                }
            });
            let outputs: Option<Vec<(ToolOutput, Duration)>> = tokio::select! {
                biased;
                _ = cancel.cancelled() => None,
                outs = futures_util::future::join_all(runs) => Some(outs),
            };
            let Some(outputs) = outputs else { break };
            for (k, ((id, name, _), (out, took))) in batch.iter().zip(outputs).enumerate() {
                emit(AgentEvent::ToolCallFinished {
                    id: id.clone(),
                    name: name.clone(),
                    output: out.text.clone(),
                    is_error: out.is_error,
                    structured: out.structured.clone(),
                    duration_ms: took.as_millis() as u64,
                });
                results[i + k] = Some(ToolResult {
                    tool_use_id: id.clone(),
                    content: out.text,
                    is_error: out.is_error,
                });
            }
            i = j;
        }
        calls
            .iter()
            .zip(results)
            .map(|((id, name, _), r)| {
                r.unwrap_or_else(|| {
                    emit(AgentEvent::ToolCallFinished {
                        id: id.clone(),
                        name: name.clone(),
                        output: CANCELLED.into(),
                        is_error: true,
                        structured: None,
                        duration_ms: 0,
                    });
                    ToolResult {
                        tool_use_id: id.clone(),
                        content: CANCELLED.into(),
                        is_error: true,
                    }
                })
            })
            .collect()
    }
}

fn add_usage(total: &mut Usage, u: &Usage) {
    total.input_tokens += u.input_tokens;
    total.output_tokens += u.output_tokens;
    total.cache_read_tokens += u.cache_read_tokens;
    total.cache_write_tokens += u.cache_write_tokens;
}
