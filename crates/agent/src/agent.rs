//! The agent loop: send the conversation, stream the answer, run the tools
//! it asks for in the conversation's sandbox, send their results, repeat
//! until the model ends its turn.
//!
//! Every step is reported as an [`AgentEvent`], the one stream that every
//! front end renders. Whatever happens (an error, a cancellation, the step
//! limit), the history stays valid: every tool call the model made gets a
//! result before the next request.
//!
//! With a session log attached, the agent records as it goes: the user's
//! prompt, every event but streamed deltas, each message added to the
//! history and each compaction, so a crash loses at most the line being
//! written and [`crate::sessions::resume`] rebuilds exactly what was sent.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;
use serde_json::{Value, json};
use tokio::sync::{mpsc, watch};

use crate::context;
use crate::log::SessionLog;
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
    /// Output of a running tool call, as it arrives (`bash`, `run_code`);
    /// `ToolCallFinished` then carries the whole result.
    ToolOutput {
        id: String,
        stream: cordon_tools::OutputStream,
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
        context_tokens: u64,
        context_window: u64,
    },
    Error {
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
#[derive(Debug, Clone)]
pub struct AgentConfig {
    pub model: String,
    pub system: String,
    pub max_tokens: u32,
    /// Model requests allowed per user message.
    pub max_steps: u32,
    /// Tool-result messages sent in full; older tool output is masked.
    pub keep_tool_outputs: usize,
    /// The model's context window, in tokens.
    pub context_window: u64,
    /// Compact when a request would fill more than this share of the window.
    pub compact_threshold: f64,
}

impl AgentConfig {
    /// The defaults for `model`: no system prompt, 8192 output tokens, 50
    /// steps, the last 8 tool outputs in full, a 200k window compacted at 75%.
    pub fn new(model: impl Into<String>) -> Self {
        AgentConfig {
            model: model.into(),
            system: String::new(),
            max_tokens: 8192,
            max_steps: 50,
            keep_tool_outputs: 8,
            context_window: 200_000,
            compact_threshold: 0.75,
        }
    }
}

/// The session log the agent writes to, shared by the tasks of one turn.
/// A write that fails is reported once and the session goes on: losing the
/// record is better than losing the work.
#[derive(Default)]
pub(crate) struct Recorder {
    pub(crate) log: Mutex<Option<SessionLog<Value>>>,
    warned: AtomicBool,
    /// A task records the network policy's changes in this log.
    watching_policy: AtomicBool,
}

impl Recorder {
    pub(crate) fn append(&self, record: &impl Serialize) {
        let mut guard = self.log.lock().unwrap_or_else(|p| p.into_inner());
        let Some(log) = guard.as_mut() else { return };
        let result = serde_json::to_value(record)
            .map_err(|e| e.to_string())
            .and_then(|v| log.append(&v).map_err(|e| e.to_string()));
        if let Err(e) = result
            && !self.warned.swap(true, Ordering::Relaxed)
        {
            tracing::warn!("session log: {e}; later records may be missing");
        }
    }

    fn sync(&self) {
        let guard = self.log.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(Err(e)) = guard.as_ref().map(SessionLog::sync) {
            tracing::warn!("session log: {e}");
        }
    }
}

/// Where one turn's events go: the caller's channel and the log.
struct Journal<'a> {
    events: &'a mpsc::UnboundedSender<AgentEvent>,
    log: &'a Recorder,
}

impl Journal<'_> {
    fn emit(&self, e: AgentEvent) {
        if !e.is_delta() {
            self.log.append(&e);
        }
        let _ = self.events.send(e);
    }
}

/// A user's answer to a tool call the model asked for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Approval {
    Allow,
    /// Not run; the reason goes back to the model as the call's result.
    Deny(String),
}

/// Decides whether a tool call runs: the front ends' `--approval ask`.
/// Asked once per call, in the model's order, after `ToolCallStarted`.
pub trait Approver: Send + Sync {
    fn approve<'a>(
        &'a self,
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    ) -> futures_util::future::BoxFuture<'a, Approval>;
}

/// One conversation: the provider, the tools and their sandbox context, the
/// history sent to the model and its session log.
pub struct Agent {
    provider: Provider,
    tools: Toolbox,
    ctx: ToolContext,
    config: AgentConfig,
    approver: Option<Arc<dyn Approver>>,
    history: Vec<Message>,
    log: Arc<Recorder>,
    /// The workspace's files at the start and after each turn, when the
    /// conversation has a log to bind them to.
    checkpoints: Option<Arc<crate::checkpoints::TurnCheckpoints>>,
    /// Whether the files before this agent's first turn are recorded.
    checkpointed: bool,
    /// The checkpoint of the last turn, taken after `send` returned: the
    /// next turn, a compaction and [`Agent::settle`] wait for it.
    pending: Option<tokio::task::JoinHandle<()>>,
    /// The API's prompt tokens over our estimate for the last request: the
    /// bytes-per-token rule calibrated to this model's tokenizer.
    ratio: f64,
    usage: Usage,
}

/// Share of the window kept verbatim when compacting automatically.
const KEEP_SHARE: f64 = 0.25;

const CANCELLED: &str = "The user cancelled this tool call before it finished.";

/// A cancelled call's result, with what it had printed.
fn cancelled_with(output: &str) -> String {
    if output.is_empty() {
        CANCELLED.into()
    } else {
        format!("{CANCELLED} Its output until then (the end of it):\n{output}")
    }
}

impl Agent {
    pub fn new(provider: Provider, tools: Toolbox, ctx: ToolContext, config: AgentConfig) -> Self {
        Agent {
            provider,
            tools,
            ctx,
            config,
            approver: None,
            history: Vec::new(),
            log: Arc::default(),
            checkpoints: None,
            checkpointed: false,
            pending: None,
            ratio: 1.0,
            usage: Usage::default(),
        }
    }

    pub fn history(&self) -> &[Message] {
        &self.history
    }

    pub fn config(&self) -> &AgentConfig {
        &self.config
    }

    /// Changes take effect from the next request (e.g. another model).
    pub fn config_mut(&mut self) -> &mut AgentConfig {
        &mut self.config
    }

    /// Tokens used by every request of this agent so far.
    pub fn usage(&self) -> Usage {
        self.usage
    }

    /// Continues an earlier conversation: `history` as sent to the model.
    pub fn with_history(mut self, history: Vec<Message>) -> Self {
        self.history = history;
        self
    }

    /// Asks `approver` before every tool call from now on (`None`: run all).
    pub fn set_approver(&mut self, approver: Option<Arc<dyn Approver>>) {
        self.approver = approver;
    }

    /// Records the conversation in `log` from now on, and the workspace's
    /// files at the start and after every turn in checkpoints beside it.
    pub fn with_log(mut self, log: SessionLog<Value>) -> Self {
        self.checkpoints =
            crate::checkpoints::TurnCheckpoints::open(log.path(), &self.ctx.workspace)
                .map(Arc::new);
        self.checkpointed = false;
        *self.log.log.lock().unwrap_or_else(|p| p.into_inner()) = Some(log);
        // Changes to the sandbox's network policy, by whoever makes them,
        // go into the log too; one watcher per agent.
        if let Some(net) = self.ctx.sandbox.network()
            && !self.log.watching_policy.swap(true, Ordering::SeqCst)
        {
            crate::netlog::record_changes(&net.policy, Arc::downgrade(&self.log));
        }
        self
    }

    /// Adds a message to the history and records it.
    fn push(&mut self, m: Message) {
        self.log.append(&crate::sessions::message_record(&m));
        context::push_message(&mut self.history, m);
    }

    fn request(&self, tools: &[ToolSpec]) -> ModelRequest {
        ModelRequest {
            model: self.config.model.clone(),
            system: self.config.system.clone(),
            messages: context::view(&self.history, self.config.keep_tool_outputs),
            tools: tools.to_vec(),
            max_tokens: self.config.max_tokens,
        }
    }

    fn predict(&self, req: &ModelRequest) -> u64 {
        (context::estimate_request(req) as f64 * self.ratio) as u64
    }

    /// What the next request would put in front of the model, in tokens:
    /// our estimate, calibrated by the API's figures for the last request.
    pub fn context_tokens(&self) -> u64 {
        self.predict(&self.request(&self.specs()))
    }

    fn over_threshold(&self, req: &ModelRequest) -> bool {
        self.predict(req) as f64 > self.config.compact_threshold * self.config.context_window as f64
    }

    /// Learns the tokenizer's ratio from a request and the usage it got.
    fn calibrate(&mut self, req: &ModelRequest, usage: &Usage) {
        let estimated = context::estimate_request(req);
        let actual = usage.prompt_tokens();
        if estimated > 0 && actual > 0 {
            self.ratio = (actual as f64 / estimated as f64).clamp(0.25, 4.0);
        }
    }

    fn cost(&self, usage: &Usage) -> Option<f64> {
        crate::pricing::cost(&self.config.model, usage)
    }

    fn specs(&self) -> Vec<ToolSpec> {
        tool_specs(&self.tools)
    }

    /// Runs one user turn to its end, reporting every step on `events`.
    pub async fn send(
        &mut self,
        prompt: &str,
        events: &mpsc::UnboundedSender<AgentEvent>,
        cancel: &Cancel,
    ) -> Result<TurnOutcome, AgentError> {
        self.settle().await;
        let log = self.log.clone();
        if !self.checkpointed
            && let Some(cp) = &self.checkpoints
        {
            if let Some(record) = cp.record("before the first turn".into()).await {
                log.append(&record);
            }
            self.checkpointed = true;
        }
        let result = self
            .turn(prompt, &Journal { events, log: &log }, cancel)
            .await;
        log.sync();
        // Whatever the outcome: a failed or cancelled turn may have
        // changed files too. Taken once the turn is over, so that the
        // answer is not held up by it; nothing else is written to the log
        // before it lands (see `settle`).
        if let Some(cp) = self.checkpoints.clone() {
            let label = format!("after: {}", crate::sessions::title_of(prompt));
            self.pending = Some(tokio::spawn(async move {
                if let Some(record) = cp.record(label).await {
                    log.append(&record);
                    log.sync();
                }
            }));
        }
        result
    }

    /// Waits for the checkpoint of the last turn to be recorded: before
    /// the session's log is handed on or the process exits.
    pub async fn settle(&mut self) {
        if let Some(pending) = self.pending.take() {
            let _ = pending.await;
        }
    }

    /// Summarises the older part of the conversation now (the front ends'
    /// `/compact`), whatever the context's size.
    pub async fn compact(
        &mut self,
        events: &mpsc::UnboundedSender<AgentEvent>,
        cancel: &Cancel,
    ) -> Result<Compaction, AgentError> {
        self.settle().await;
        let log = self.log.clone();
        let journal = Journal { events, log: &log };
        let tools = self.specs();
        let result = self
            .compact_with(&journal, "requested", 0.0, &tools, cancel)
            .await;
        if let Err(e) = &result {
            journal.emit(AgentEvent::Error {
                message: e.to_string(),
            });
        }
        log.sync();
        result
    }

    async fn turn(
        &mut self,
        prompt: &str,
        journal: &Journal<'_>,
        cancel: &Cancel,
    ) -> Result<TurnOutcome, AgentError> {
        let emit = |e: AgentEvent| journal.emit(e);
        journal
            .log
            .append(&json!({"type": "user_message", "text": prompt}));
        self.push(Message::User {
            text: prompt.to_string(),
            tool_results: Vec::new(),
        });
        let mut total = Usage::default();
        let mut tools = self.specs();
        for step in 1..=self.config.max_steps {
            // A tool that stopped working mid-turn (an MCP server that
            // died) is no longer offered from the next request on.
            if tools.len() != self.tools.available_count() {
                tools = self.specs();
            }
            emit(AgentEvent::TurnStarted { step });
            let mut request = self.request(&tools);
            let mut compacted = false;
            if self.over_threshold(&request) {
                match self
                    .compact_with(
                        journal,
                        "the context passed the threshold",
                        KEEP_SHARE,
                        &tools,
                        cancel,
                    )
                    .await
                {
                    Ok(c) => {
                        add_usage(&mut total, &c.usage);
                        compacted = true;
                        request = self.request(&tools);
                    }
                    // Nothing older to summarise: let the server judge.
                    Err(AgentError::Compaction(why)) => {
                        tracing::debug!("no compaction: {why}");
                    }
                    Err(e) => return Err(self.fail(journal, e)),
                }
            }
            let answer = loop {
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
                let result = tokio::select! {
                    biased;
                    _ = cancel.cancelled() => return Err(AgentError::Cancelled),
                    r = streamed => r,
                };
                match result {
                    Ok(a) => break a,
                    // The server counts differently from us: compact once
                    // and try again.
                    Err(ProviderError::ContextTooLong { message }) if !compacted => {
                        compacted = true;
                        self.learn_from_overflow(&request, &message);
                        let reason = format!("the model's server said: {message}");
                        match self
                            .compact_with(journal, &reason, KEEP_SHARE, &tools, cancel)
                            .await
                        {
                            Ok(c) => add_usage(&mut total, &c.usage),
                            Err(e) => return Err(self.fail(journal, e)),
                        }
                        request = self.request(&tools);
                    }
                    Err(e) => return Err(self.fail(journal, e.into())),
                }
            };
            self.calibrate(&request, &answer.usage);
            add_usage(&mut total, &answer.usage);
            add_usage(&mut self.usage, &answer.usage);
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
            let text = answer.text();
            if stop == StopReason::Refusal {
                // A refused answer is left out of the history: sent back,
                // it would steer the next turn towards refusing again.
                return Ok(self.complete(journal, stop, step, total, text));
            }
            self.push(Message::Assistant(answer));
            if calls.is_empty() {
                return Ok(self.complete(journal, stop, step, total, text));
            }
            let results = if stop == StopReason::MaxTokens {
                // The answer was cut off: its calls may be incomplete.
                calls
                    .iter()
                    .map(|(id, _, _)| ToolResult {
                        tool_use_id: id.clone(),
                        content: "Not run: your answer reached max_tokens before it ended. Issue the call again.".into(),
                        is_error: true,
                        images: Vec::new(),
                    })
                    .collect()
            } else {
                self.run_tools(&calls, journal, cancel).await
            };
            let cancelled = cancel.is_cancelled();
            self.push(Message::User {
                text: String::new(),
                tool_results: results,
            });
            if cancelled {
                return Err(AgentError::Cancelled);
            }
        }
        Err(self.fail(journal, AgentError::StepLimit(self.config.max_steps)))
    }

    /// Reports `e` as an error event and hands it back.
    fn fail(&self, journal: &Journal<'_>, e: AgentError) -> AgentError {
        if !matches!(e, AgentError::Cancelled) {
            journal.emit(AgentEvent::Error {
                message: e.to_string(),
            });
        }
        e
    }

    fn complete(
        &self,
        journal: &Journal<'_>,
        stop_reason: StopReason,
        steps: u32,
        usage: Usage,
        text: String,
    ) -> TurnOutcome {
        let cost_usd = self.cost(&usage);
        journal.emit(AgentEvent::TurnCompleted {
            stop_reason,
            steps,
            usage,
            cost_usd,
            context_tokens: self.context_tokens(),
            context_window: self.config.context_window,
        });
        TurnOutcome {
            text,
            stop_reason,
            steps,
            usage,
            cost_usd,
        }
    }

    /// A context-too-long error quotes the prompt's real size and the
    /// window (Anthropic: "prompt is too long: 210000 tokens > 200000
    /// maximum"; OpenAI: "maximum context length is 8192 tokens. However,
    /// your messages resulted in 9000 tokens"): both correct our figures.
    fn learn_from_overflow(&mut self, req: &ModelRequest, message: &str) {
        let numbers: Vec<u64> = message
            .split(|c: char| !c.is_ascii_digit())
            .filter(|w| w.len() >= 3)
            .filter_map(|w| w.parse().ok())
            .collect();
        let (Some(&actual), Some(&maximum)) = (numbers.iter().max(), numbers.iter().min()) else {
            return;
        };
        if actual <= maximum {
            return;
        }
        let estimated = context::estimate_request(req);
        if estimated > 0 {
            self.ratio = (actual as f64 / estimated as f64).clamp(0.25, 4.0);
        }
        self.config.context_window = self.config.context_window.min(maximum);
    }

    /// Replaces the older part of the history by a summary the model
    /// writes, keeping up to `keep_share` of the window of recent messages
    /// in full. The summary request reuses the system prompt and tools, so
    /// its prefix is served from the prompt cache.
    async fn compact_with(
        &mut self,
        journal: &Journal<'_>,
        reason: &str,
        keep_share: f64,
        tools: &[ToolSpec],
        cancel: &Cancel,
    ) -> Result<Compaction, AgentError> {
        let window = self.config.context_window as f64;
        // Budgets below are in estimated tokens, the unit of the history.
        let keep = (window * keep_share / self.ratio) as u64;
        let cut = context::choose_cut(&self.history, keep)
            .ok_or_else(|| AgentError::Compaction("there is nothing older to summarise".into()))?;
        journal.emit(AgentEvent::CompactionStarted {
            reason: reason.to_string(),
        });
        let tokens_before = self.context_tokens();
        let mut request = self.request(tools);
        let overhead = context::estimate_request(&ModelRequest {
            messages: Vec::new(),
            ..request.clone()
        });
        let budget = ((window * 0.85 / self.ratio) as u64)
            .saturating_sub(overhead)
            .saturating_sub(u64::from(self.config.max_tokens.min(8192)));
        request.messages =
            context::summary_input(&self.history, cut, budget, self.config.keep_tool_outputs);
        request.max_tokens = self.config.max_tokens.min(8192);
        // Summary text is not the assistant's answer: only retries are shown.
        let streamed = self.provider.stream(&request, |d| {
            if let StreamDelta::Retrying {
                attempt,
                wait,
                reason,
            } = d
            {
                journal.emit(AgentEvent::Retrying {
                    attempt,
                    wait_ms: wait.as_millis() as u64,
                    reason,
                });
            }
        });
        let answer = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(AgentError::Cancelled),
            r = streamed => r?,
        };
        add_usage(&mut self.usage, &answer.usage);
        let summary = answer.text();
        if summary.trim().is_empty() {
            return Err(AgentError::Compaction(
                "the model wrote an empty summary".into(),
            ));
        }
        // The task must survive even a summary that forgets it.
        let prompt = if context::latest_prompt(&self.history[cut..]).is_none() {
            context::latest_prompt(&self.history[..cut]).map(|p| clip(p, 16 * 1024))
        } else {
            None
        };
        let message = context::summary_message(&summary, prompt.as_deref());
        journal.log.append(&json!({
            "type": "compaction",
            "replaced": cut,
            "summary": message,
        }));
        context::apply_compaction(&mut self.history, cut, message);
        let c = Compaction {
            replaced_messages: cut,
            tokens_before,
            tokens_after: self.context_tokens(),
            summary,
            usage: answer.usage,
        };
        journal.emit(AgentEvent::Compacted {
            replaced_messages: c.replaced_messages,
            tokens_before: c.tokens_before,
            tokens_after: c.tokens_after,
            summary: c.summary.clone(),
        });
        Ok(c)
    }

    /// Runs the calls in order; consecutive read-only calls run together.
    /// Returns one result per call, in the calls' order, even when cancelled.
    async fn run_tools(
        &self,
        calls: &[(String, String, serde_json::Value)],
        journal: &Journal<'_>,
        cancel: &Cancel,
    ) -> Vec<ToolResult> {
        let emit = |e: AgentEvent| journal.emit(e);
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
            // Asked one by one, before any of the batch runs: a denied
            // call is answered without running.
            let mut verdicts = Vec::with_capacity(batch.len());
            if let Some(approver) = &self.approver {
                for (id, name, input) in batch {
                    let verdict = tokio::select! {
                        biased;
                        _ = cancel.cancelled() => None,
                        v = approver.approve(id, name, input) => Some(v),
                    };
                    verdicts.push(verdict);
                }
                if cancel.is_cancelled() {
                    break;
                }
            }
            // Each call's output reaches the front ends while it runs.
            let lives: Vec<_> = batch
                .iter()
                .map(|(id, _, _)| crate::live::Live::new(id, journal.events.clone()))
                .collect();
            let runs = batch.iter().enumerate().map(|(k, (_, name, input))| {
                let started = Instant::now();
                let verdict = verdicts.get(k).cloned().flatten();
                let ctx = self.ctx.with_progress(lives[k].progress());
                async move {
                    let out = match verdict {
                        Some(Approval::Deny(reason)) => ToolOutput::error(denied(&reason)),
                        _ => self.tools.call(&ctx, name, input.clone()).await,
                    };
                    (out, started.elapsed())
                }
            });
            // The broker's refusals while this batch runs, for their
            // records (the tools put the same lines in their results).
            let mut net = self
                .ctx
                .sandbox
                .network()
                .map(|n| n.refusals(crate::netlog::MAX_RECORDS));
            let outputs: Option<Vec<(ToolOutput, Duration)>> = tokio::select! {
                biased;
                _ = cancel.cancelled() => None,
                outs = futures_util::future::join_all(runs) => Some(outs),
            };
            let Some(outputs) = outputs else {
                // What the cancelled calls had printed is theirs to show,
                // and the model's to know.
                for (k, ((id, name, _), live)) in batch.iter().zip(&lives).enumerate() {
                    let text = cancelled_with(&live.finish());
                    emit(AgentEvent::ToolCallFinished {
                        id: id.clone(),
                        name: name.clone(),
                        output: text.clone(),
                        is_error: true,
                        structured: None,
                        duration_ms: 0,
                    });
                    results[i + k] = Some(ToolResult {
                        tool_use_id: id.clone(),
                        content: text,
                        is_error: true,
                        images: Vec::new(),
                    });
                }
                break;
            };
            for live in &lives {
                live.finish();
            }
            if let Some(net) = net.as_mut() {
                // A batch of several calls runs together; the refusals are
                // the batch's, filed under its first call.
                for e in net.ready() {
                    emit(AgentEvent::NetworkRefused {
                        tool_id: batch[0].0.clone(),
                        host: e.host,
                        port: e.port,
                        decision: e.decision,
                        reason: e.reason,
                        message: e.message,
                    });
                }
            }
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
                    images: out.images,
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
                        images: Vec::new(),
                    }
                })
            })
            .collect()
    }
}

/// The result of a call the user denied, as the model sees it.
fn denied(reason: &str) -> String {
    let reason = reason.trim();
    if reason.is_empty() {
        "The user denied this tool call. Ask them how to proceed, or try another way.".into()
    } else {
        format!("The user denied this tool call: {reason}")
    }
}

/// The tools of `toolbox` as offered to the model.
pub fn tool_specs(toolbox: &Toolbox) -> Vec<ToolSpec> {
    toolbox
        .specs()
        .into_iter()
        .map(|s| ToolSpec {
            name: s.name,
            description: s.description,
            input_schema: s.input_schema,
        })
        .collect()
}

/// At most `max` bytes of `text`, cut at a character boundary, marked.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[… {} more bytes]", &text[..end], text.len() - end)
}

fn add_usage(total: &mut Usage, u: &Usage) {
    total.input_tokens += u.input_tokens;
    total.output_tokens += u.output_tokens;
    total.cache_read_tokens += u.cache_read_tokens;
    total.cache_write_tokens += u.cache_write_tokens;
}
