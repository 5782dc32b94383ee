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
//!
//! The loop is here; its events, cancellation, compaction and tool calls
//! are in the private modules beside it.

mod compact;
mod tools;

use std::sync::Arc;
use std::sync::atomic::Ordering;

use tokio::sync::mpsc;

use crate::context;
use crate::hooks::HookEvent;
use crate::log::SessionLog;
use crate::message::{StopReason, StreamDelta, Usage};
use crate::provider::{Provider, ProviderError};
use crate::record::SessionRecord;
use crate::recorder::Recorder;
use crate::wire::{Message, ModelRequest, ToolResult, ToolSpec};
use compact::KEEP_SHARE;
use cordon_tools::{ToolContext, Toolbox};

pub use crate::cancel::Cancel;
pub use crate::event::{AgentError, AgentEvent, Compaction, TurnOutcome, tool_failed};
pub use tools::{Approval, Approver, Oversight, tool_specs};

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
    /// What the session's checkpoints keep (`checkpoints.*`).
    pub checkpoints: cordon_git::Retention,
    /// The provider's web search, when the user enabled it (Anthropic).
    pub web_search: Option<crate::wire::WebSearch>,
}

impl AgentConfig {
    /// The defaults for `model`: no system prompt, 8192 output tokens, 50
    /// steps, the last 8 tool outputs in full, a 200k window compacted at
    /// 75%, checkpoints kept as [`cordon_git::Retention::default`].
    pub fn new(model: impl Into<String>) -> Self {
        AgentConfig {
            model: model.into(),
            system: String::new(),
            max_tokens: 8192,
            max_steps: 50,
            keep_tool_outputs: 8,
            context_window: 200_000,
            compact_threshold: 0.75,
            checkpoints: cordon_git::Retention::default(),
            web_search: None,
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
            self.log.append(&SessionRecord::Event(e.clone()));
        }
        let _ = self.events.send(e);
    }
}

/// One conversation: the provider, the tools and their sandbox context, the
/// history sent to the model and its session log.
pub struct Agent {
    provider: Provider,
    tools: Toolbox,
    ctx: ToolContext,
    config: AgentConfig,
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
    /// Its `task` helpers' shared state, when it has the tool.
    helpers: Option<Arc<crate::helpers::Helpers>>,
    /// Who approves calls, the command rules and the hooks.
    oversight: Oversight,
    /// Working, or planning with read-only tools.
    mode: Mode,
}

/// What the agent may do: change things, or only look and plan.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Mode {
    #[default]
    Work,
    /// Read-only tools only; the model is asked for a plan.
    Plan,
}

impl std::fmt::Display for Mode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Mode::Work => "work",
            Mode::Plan => "plan",
        })
    }
}

impl std::str::FromStr for Mode {
    type Err = String;
    fn from_str(s: &str) -> Result<Mode, String> {
        match s {
            "work" => Ok(Mode::Work),
            "plan" => Ok(Mode::Plan),
            _ => Err(format!("unknown mode {s:?}: work or plan")),
        }
    }
}

/// What the model is told in plan mode, after the system prompt.
const PLAN_MODE: &str = "\n\n# Plan mode\n\nThe user wants a plan before anything changes. \
Look at the project with the read-only tools you have (read, list, search), then answer with \
the plan: the steps, the files each changes and how, and how you will check the result. Keep \
it short and concrete; name what you are unsure of. Change nothing: the tools that write or \
run commands are not available until the user approves the plan (they say /go).";

/// A call of a tool that changes things, in plan mode.
const NOT_IN_PLAN_MODE: &str = "Not run: this is plan mode, where only read-only tools run. Finish the plan; the user switches to work (/go) when they approve it.";

impl Agent {
    pub fn new(provider: Provider, tools: Toolbox, ctx: ToolContext, config: AgentConfig) -> Self {
        Agent {
            provider,
            tools,
            ctx,
            config,
            history: Vec::new(),
            log: Arc::default(),
            checkpoints: None,
            checkpointed: false,
            pending: None,
            ratio: 1.0,
            usage: Usage::default(),
            helpers: None,
            oversight: Oversight::default(),
            mode: Mode::Work,
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

    /// The label of each tool call in `history`, by call id: what the
    /// front ends show for a call of an earlier conversation.
    pub fn labels(&self, history: &[Message]) -> std::collections::HashMap<String, String> {
        history
            .iter()
            .filter_map(|m| match m {
                Message::Assistant(a) => Some(a),
                Message::User { .. } => None,
            })
            .flat_map(|a| a.tool_uses())
            .map(|(id, name, input)| (id.to_string(), self.tools.label(name, input)))
            .collect()
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

    /// The state this agent's `task` helpers share with it: their count
    /// per turn, and their tokens, which count in its turns.
    pub fn set_helpers(&mut self, helpers: Arc<crate::helpers::Helpers>) {
        self.helpers = Some(helpers);
    }

    /// Asks `approver` before every tool call from now on (`None`: run all).
    pub fn set_approver(&mut self, approver: Option<Arc<dyn Approver>>) {
        self.oversight = Oversight::asking(approver);
    }

    /// Who approves calls, the command rules and the hooks, from now on.
    pub fn set_oversight(&mut self, oversight: Oversight) {
        self.oversight = oversight;
    }

    /// Working or planning, from the next request on.
    pub fn set_mode(&mut self, mode: Mode) {
        self.mode = mode;
    }

    /// Records the conversation in `log` from now on, and the workspace's
    /// files at the start and after every turn in checkpoints beside it.
    pub fn with_log(mut self, log: SessionLog<SessionRecord>) -> Self {
        self.set_log(log);
        self
    }

    /// [`Agent::with_log`] on an agent in place: a conversation whose log
    /// is made with its first message.
    pub fn set_log(&mut self, log: SessionLog<SessionRecord>) {
        self.checkpoints = crate::checkpoints::TurnCheckpoints::open(
            log.path(),
            &self.ctx.workspace,
            self.config.checkpoints,
        )
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
    }

    /// Adds a message to the history and records it.
    fn push(&mut self, m: Message) {
        self.log
            .append(&SessionRecord::Message { message: m.clone() });
        context::push_message(&mut self.history, m);
    }

    fn request(&self, tools: &[ToolSpec]) -> ModelRequest {
        ModelRequest {
            model: self.config.model.clone(),
            system: match self.mode {
                Mode::Work => self.config.system.clone(),
                Mode::Plan => format!("{}{PLAN_MODE}", self.config.system),
            },
            messages: context::view(&self.history, self.config.keep_tool_outputs),
            tools: tools.to_vec(),
            max_tokens: self.config.max_tokens,
            web_search: self.config.web_search,
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

    /// The tools offered now: in plan mode, the read-only ones.
    fn specs(&self) -> Vec<ToolSpec> {
        match self.mode {
            Mode::Work => tool_specs(&self.tools),
            Mode::Plan => tool_specs(&self.tools.read_only()),
        }
    }

    /// How many tools [`Agent::specs`] would offer: cheap, to see
    /// whether they changed without making their schemas again.
    fn offered(&self) -> usize {
        match self.mode {
            Mode::Work => self.tools.available_count(),
            Mode::Plan => self.tools.read_only().available_count(),
        }
    }

    /// Whether `tool` may run now.
    pub(super) fn may_run(&self, tool: &str) -> bool {
        self.mode == Mode::Work || self.tools.get(tool).is_some_and(|t| t.read_only())
    }

    /// Runs one user turn to its end, reporting every step on `events`.
    pub async fn send(
        &mut self,
        prompt: &str,
        events: &mpsc::UnboundedSender<AgentEvent>,
        cancel: &Cancel,
    ) -> Result<TurnOutcome, AgentError> {
        self.send_with_images(prompt, Vec::new(), events, cancel)
            .await
    }

    /// [`Agent::send`], with images the user gives along (`--attach`).
    pub async fn send_with_images(
        &mut self,
        prompt: &str,
        images: Vec<cordon_tools::Image>,
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
            .turn(prompt, images, &Journal { events, log: &log }, cancel)
            .await;
        log.sync();
        // Whatever the outcome: a failed or cancelled turn may have
        // changed files too. Taken once the turn is over, so that the
        // answer is not held up by it; nothing else is written to the log
        // before it lands (see `settle`).
        if let Some(cp) = self.checkpoints.clone() {
            let label = format!("after: {}", crate::record::title_of(prompt));
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

    async fn turn(
        &mut self,
        prompt: &str,
        images: Vec<cordon_tools::Image>,
        journal: &Journal<'_>,
        cancel: &Cancel,
    ) -> Result<TurnOutcome, AgentError> {
        let emit = |e: AgentEvent| journal.emit(e);
        journal.log.append(&SessionRecord::UserMessage {
            text: prompt.to_string(),
        });
        self.push(Message::user_with_images(prompt, images));
        let mut total = Usage::default();
        let mut stop_continuations = 0;
        if let Some(h) = &self.helpers {
            h.begin_turn(&self.config.model);
        }
        let mut tools = self.specs();
        for step in 1..=self.config.max_steps {
            // A tool that stopped working mid-turn (an MCP server that
            // died) is no longer offered from the next request on.
            if tools.len() != self.offered() {
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
                        total += c.usage;
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
                            Ok(c) => total += c.usage,
                            Err(e) => return Err(self.fail(journal, e)),
                        }
                        request = self.request(&tools);
                    }
                    Err(e) => return Err(self.fail(journal, e.into())),
                }
            };
            self.calibrate(&request, &answer.usage);
            total += answer.usage;
            self.usage += answer.usage;
            emit(AgentEvent::AssistantMessage {
                text: answer.text(),
                stop_reason: answer.stop_reason,
                usage: answer.usage,
            });
            let calls: Vec<(String, String, serde_json::Value)> = answer
                .tool_uses()
                .map(|(id, name, input)| (id.to_string(), name.to_string(), input.clone()))
                .collect();
            server_tool_events(&answer, journal);
            let stop = answer.stop_reason;
            let text = answer.text();
            if stop == StopReason::Refusal {
                // A refused answer is left out of the history: sent back,
                // it would steer the next turn towards refusing again.
                return Ok(self.complete(journal, stop, step, total, text));
            }
            self.push(Message::Assistant(answer));
            if calls.is_empty() {
                if stop == StopReason::PauseTurn {
                    // The provider paused its own long turn (a web search):
                    // sent back as it is, the answer goes on.
                    continue;
                }
                // A stop hook may send the model on (`exit 2`), a few times.
                if stop_continuations < crate::hooks::MAX_STOP_CONTINUATIONS
                    && self.oversight.hooks.any(HookEvent::Stop, None)
                {
                    let said = self
                        .oversight
                        .hooks
                        .run(&self.ctx.sandbox, HookEvent::Stop, None, Some(&text))
                        .await;
                    report_failures(journal, HookEvent::Stop, said.failures);
                    if let Some(reason) = said.block {
                        stop_continuations += 1;
                        self.push(Message::user(format!(
                            "[A stop hook of the user's did not let the turn end yet. It says:]\n{reason}"
                        )));
                        continue;
                    }
                }
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
            // What its helpers used is the turn's too.
            if let Some(h) = &self.helpers {
                let used = h.take_usage();
                total += used;
                self.usage += used;
            }
            let cancelled = cancel.is_cancelled();
            self.push(Message::tool_results(results));
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
}

/// The calls the provider made itself in `answer` (web searches), shown
/// as tool calls that ran: each with what it found.
fn server_tool_events(answer: &crate::message::AssistantMessage, journal: &Journal<'_>) {
    use crate::message::{ContentBlock, search_summary};
    for block in &answer.content {
        let ContentBlock::ServerToolUse { id, name, input } = block else {
            continue;
        };
        journal.emit(AgentEvent::ToolCallStarted {
            id: id.clone(),
            name: name.clone(),
            input: input.clone(),
            label: cordon_tools::label::generic(input),
        });
        let found = answer.content.iter().find_map(|b| match b {
            ContentBlock::WebSearchToolResult {
                tool_use_id,
                content,
            } if tool_use_id == id => Some(search_summary(content)),
            _ => None,
        });
        let (output, is_error) =
            found.unwrap_or_else(|| ("The provider sent no result.".into(), true));
        journal.emit(AgentEvent::ToolCallFinished {
            id: id.clone(),
            name: name.clone(),
            output,
            is_error,
            structured: None,
            duration_ms: 0,
        });
    }
}

/// Tells the front ends of hooks that failed.
fn report_failures(journal: &Journal<'_>, event: HookEvent, failures: Vec<String>) {
    for message in failures {
        journal.emit(AgentEvent::HookFailed { event, message });
    }
}
