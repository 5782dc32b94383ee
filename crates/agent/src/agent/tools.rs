//! The model's tool calls: asked of the approver, run in the sandbox (a
//! run of read-only calls together), their output streamed as it comes,
//! and one result per call whatever happens.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::sync::mpsc;

use super::{Agent, AgentError, AgentEvent, Cancel, Journal};
use crate::hooks::{HookEvent, ToolCall};
use crate::rules::Verdict;
use crate::wire::{ToolResult, ToolSpec};
use cordon_tools::{ToolOutput, Toolbox};

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

/// The user's say over which calls run and what happens around them:
/// who is asked, whether about every call, their command rules and their
/// hooks. One value, given to a conversation's agents and its helpers.
#[derive(Clone, Default)]
pub struct Oversight {
    /// Who answers approvals; `None`: nobody can be asked (`exec`).
    pub approver: Option<Arc<dyn Approver>>,
    /// Every call is asked about (`--approval ask`), or only those a rule
    /// says to ask about. Without an approver, nothing is.
    pub ask_all: bool,
    pub rules: crate::rules::Rules,
    pub hooks: crate::hooks::Hooks,
}

impl Oversight {
    /// Every call asked of `approver` (`None`: none asked).
    pub fn asking(approver: Option<Arc<dyn Approver>>) -> Oversight {
        Oversight {
            ask_all: approver.is_some(),
            approver,
            ..Oversight::default()
        }
    }
}

const CANCELLED: &str = "The user cancelled this tool call before it finished.";

/// A call a rule says to ask about, where nobody can be asked (`exec`).
const NO_ONE_TO_ASK: &str = "A rule of the user's says commands like this one need their approval, and nobody can be asked here: it was not run. Do without it, or tell the user it is needed.";

/// A cancelled call's result, with what it had printed.
fn cancelled_with(output: &str) -> String {
    if output.is_empty() {
        CANCELLED.into()
    } else {
        format!("{CANCELLED} Its output until then (the end of it):\n{output}")
    }
}

impl Agent {
    /// Runs the calls in order; consecutive read-only calls run together.
    /// Returns one result per call, in the calls' order, even when cancelled.
    pub(super) async fn run_tools(
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
                    label: self.tools.label(name, input),
                });
            }
            // Decided one by one, before any of the batch runs: by the
            // user's rules, then by asking them; a denied call is
            // answered without running.
            // `Err`: not run, and what the model is told instead.
            let mut verdicts: Vec<Result<(), String>> = Vec::with_capacity(batch.len());
            for (id, name, input) in batch {
                if !self.may_run(name) {
                    verdicts.push(Err(super::NOT_IN_PLAN_MODE.to_string()));
                    continue;
                }
                let ask = match self.oversight.rules.verdict(name, input) {
                    Some(Verdict::Deny(why)) => {
                        verdicts.push(Err(why));
                        continue;
                    }
                    Some(Verdict::Allow) => false,
                    Some(Verdict::Ask) => true,
                    None => self.oversight.ask_all,
                };
                let mut verdict = match (&self.oversight.approver, ask) {
                    (_, false) => Ok(()),
                    (None, true) => Err(NO_ONE_TO_ASK.to_string()),
                    (Some(approver), true) => tokio::select! {
                        biased;
                        _ = cancel.cancelled() => break,
                        v = approver.approve(id, name, input) => match v {
                            Approval::Allow => Ok(()),
                            Approval::Deny(reason) => Err(denied(&reason)),
                        },
                    },
                };
                // The user's before_tool hooks have the last word.
                if verdict.is_ok() && self.oversight.hooks.any(HookEvent::BeforeTool, Some(name)) {
                    let call = ToolCall {
                        id,
                        name,
                        input,
                        output: None,
                        is_error: None,
                    };
                    let said = tokio::select! {
                        biased;
                        _ = cancel.cancelled() => break,
                        s = self.oversight.hooks.run(&self.ctx.sandbox, HookEvent::BeforeTool, Some(call), None) => s,
                    };
                    super::report_failures(journal, HookEvent::BeforeTool, said.failures);
                    if let Some(reason) = said.block {
                        verdict = Err(format!(
                            "A before_tool hook of the user's refused this call: {reason}"
                        ));
                    }
                }
                verdicts.push(verdict);
            }
            if cancel.is_cancelled() {
                break;
            }
            // Each call's output reaches the front ends while it runs.
            let lives: Vec<_> = batch
                .iter()
                .map(|(id, _, _)| crate::live::Live::new(id, journal.events.clone()))
                .collect();
            let runs = batch.iter().enumerate().map(|(k, (_, name, input))| {
                let started = Instant::now();
                let verdict = verdicts.get(k).cloned().unwrap_or(Ok(()));
                let ctx = self.ctx.with_progress(lives[k].progress());
                async move {
                    let out = match verdict {
                        Err(text) => ToolOutput::error(text),
                        Ok(()) => self.tools.call(&ctx, name, input.clone()).await,
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
            let mut outputs = outputs;
            for ((id, name, input), (out, _)) in batch.iter().zip(outputs.iter_mut()) {
                if !self.oversight.hooks.any(HookEvent::AfterTool, Some(name)) {
                    continue;
                }
                let call = ToolCall {
                    id,
                    name,
                    input,
                    output: Some(&out.text),
                    is_error: Some(out.is_error),
                };
                let said = self
                    .oversight
                    .hooks
                    .run(&self.ctx.sandbox, HookEvent::AfterTool, Some(call), None)
                    .await;
                super::report_failures(journal, HookEvent::AfterTool, said.failures);
                if let Some(note) = said.block {
                    out.text.push_str(&format!(
                        "\n[An after_tool hook of the user's says:]\n{note}"
                    ));
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
                if let Some(plan) = out.plan {
                    emit(AgentEvent::PlanUpdated { plan: *plan });
                }
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

/// The tool `!cmd` runs, and what its input is called.
const USER_SHELL: &str = "bash";
const USER_SHELL_COMMAND: &str = "command";

impl Agent {
    /// Runs a command the user typed (`!cmd` in the terminal UI) in the
    /// sandbox's shell, as the `bash` tool runs the model's: the same
    /// shell, so a `cd` carries over. Reported on `events` as a tool call,
    /// logged, and put in the history as a user message, so the model
    /// sees the command and its output with the next prompt. No approver
    /// is asked: the user is the one running it.
    pub async fn run_user_command(
        &mut self,
        command: &str,
        events: &mpsc::UnboundedSender<AgentEvent>,
        cancel: &Cancel,
    ) -> Result<ToolOutput, AgentError> {
        static RUNS: AtomicU64 = AtomicU64::new(0);
        self.settle().await;
        let log = self.log.clone();
        let journal = Journal { events, log: &log };
        let id = format!("user_{}", RUNS.fetch_add(1, Ordering::Relaxed));
        let input = serde_json::json!({ USER_SHELL_COMMAND: command });
        journal.emit(AgentEvent::ToolCallStarted {
            id: id.clone(),
            name: USER_SHELL.into(),
            input: input.clone(),
            label: cordon_tools::label::line(command),
        });
        let live = crate::live::Live::new(&id, events.clone());
        let ctx = self.ctx.with_progress(live.progress());
        let started = Instant::now();
        let out = tokio::select! {
            biased;
            _ = cancel.cancelled() => None,
            out = self.tools.call(&ctx, USER_SHELL, input) => Some(out),
        };
        let printed = live.finish();
        let (out, result) = match out {
            Some(out) => (out.clone(), Ok(out)),
            None => (
                ToolOutput::error(cancelled_with(&printed)),
                Err(AgentError::Cancelled),
            ),
        };
        journal.emit(AgentEvent::ToolCallFinished {
            id,
            name: USER_SHELL.into(),
            output: out.text.clone(),
            is_error: out.is_error,
            structured: out.structured.clone(),
            duration_ms: started.elapsed().as_millis() as u64,
        });
        self.push(crate::wire::Message::user(format!(
                "[The user ran a command in the sandbox's shell themselves; it was not a tool call of yours.]\n$ {command}\n{}",
                out.text
            )));
        log.sync();
        result
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
