//! `task`: a helper agent for a sub-task. It works in the same sandbox and
//! workspace as its caller, with a context of its own (a fresh history
//! and a shell of its own, so its `cd` is not the caller's), and its final
//! answer is the call's result. What it does shows live as the call's
//! output, a line per step, so every front end shows it nested under the
//! call.
//!
//! Bounded: helpers get no `task` tool ([`MAX_DEPTH`]), a caller's turn
//! starts at most [`MAX_PER_TURN`] of them, each runs at most
//! [`HELPER_STEPS`] model requests, and their tokens count in the turn's
//! usage.

use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::agent::{Agent, AgentConfig, AgentEvent, Cancel, Oversight};
pub use crate::helpers::{Helpers, MAX_PER_TURN};
use crate::provider::{Provider, ProviderConfig};
use cordon_sandbox::Stream;
use cordon_tools::label::line;
use cordon_tools::{ToolContext, ToolFuture, ToolOutput, Toolbox, TypedTool};

pub const NAME: &str = "task";
/// How deep helpers nest: the caller's helpers have no helpers of their own.
pub const MAX_DEPTH: u32 = 1;
/// Model requests a helper may make.
pub const HELPER_STEPS: u32 = 30;

/// What the helper is told beyond the caller's own prompt.
const HELPER_PROMPT: &str = "\n\n# You are a helper\n\nAnother agent gave you one task; \
it sees only your final answer, not your steps. Do the task completely, in the same \
workspace. End with an answer that stands on its own: what you found or changed (files by \
their path), what you ran to check it, and anything left undone. Be concise: no \
preamble.";

/// The `task` tool of one conversation.
pub struct Task {
    provider: ProviderConfig,
    /// The helper's configuration: the caller's, with the helper's prompt
    /// and step bound.
    config: AgentConfig,
    /// The helper's tools: the caller's, without `task` past the depth
    /// bound and without the caller's plan.
    tools: Toolbox,
    /// The caller's: its helpers are approved and hooked as it is.
    oversight: Oversight,
    helpers: std::sync::Arc<Helpers>,
}

impl Task {
    /// The tool for a caller configured as `config` with `tools` (at depth
    /// 0); `helpers` is shared with the caller's agent.
    pub fn new(
        provider: ProviderConfig,
        config: &AgentConfig,
        tools: &Toolbox,
        oversight: Oversight,
        helpers: std::sync::Arc<Helpers>,
    ) -> Task {
        let mut tools = tools.clone();
        tools.remove(cordon_tools::update_plan::NAME);
        // Depth 1 is the helper's; with MAX_DEPTH 1 it has no helpers.
        debug_assert_eq!(MAX_DEPTH, 1);
        tools.remove(NAME);
        Task {
            provider,
            config: AgentConfig {
                system: format!("{}{HELPER_PROMPT}", config.system),
                max_steps: config.max_steps.min(HELPER_STEPS),
                ..config.clone()
            },
            tools,
            oversight,
            helpers,
        }
    }
}

/// A helper's task, as the model gives it.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    description: String,
    prompt: String,
}

fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "description": {"type": "string", "description": "The task in a few words, shown to the user."},
            "prompt": {"type": "string", "description": "The whole task for the helper: what to do, where to look, what to report. It knows nothing of this conversation but what you write here."}
        },
        "required": ["description", "prompt"],
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Hand a self-contained sub-task to a helper agent: searching a large codebase for something, investigating a failure, or a change you can describe completely. The helper works in the same sandbox and workspace with the same tools, but starts with none of this conversation: say in `prompt` everything it needs. Its steps do not fill your context; you get only its final answer, as this call's result. Use it for work that takes many steps whose details you do not need; do simple things yourself. Helpers cannot start helpers.";

impl TypedTool for Task {
    const NAME: &'static str = NAME;
    const READ_ONLY: bool = false;
    type Input = Input;
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn label(&self, input: &Input) -> String {
        input.description.clone()
    }
    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Input) -> ToolFuture<'a> {
        Box::pin(self.help(ctx, input))
    }
}

impl Task {
    async fn help(&self, ctx: &ToolContext, input: Input) -> ToolOutput {
        if input.prompt.trim().is_empty() {
            return ToolOutput::error("The helper needs a prompt: say what it is to do.");
        }
        if let Err(why) = self.helpers.claim() {
            return ToolOutput::error(why);
        }
        let provider = match Provider::new(self.provider.clone()) {
            Ok(p) => p,
            Err(e) => return ToolOutput::error(format!("The helper could not start: {e}")),
        };
        let mut config = self.config.clone();
        config.model = self.helpers.model();
        let mut agent = Agent::new(provider, self.tools.clone(), ctx.fresh_session(), config);
        agent.set_oversight(self.oversight.clone());
        // The helper's steps, as lines of the call's live output. The
        // future is dropped with the call when the caller is cancelled,
        // and the helper with it.
        let (tx, mut rx) = mpsc::unbounded_channel();
        let cancel = Cancel::new();
        let mut shown = Shown {
            ctx,
            steps: 0,
            calls: 0,
        };
        let result = {
            let turn = agent.send(&input.prompt, &tx, &cancel);
            crate::events::pump(turn, &mut rx, &mut shown).await
        };
        let used = agent.usage();
        self.helpers.add_usage(used);
        let structured = json!({
            "helper": input.description,
            "steps": shown.steps,
            "tool_calls": shown.calls,
            "input_tokens": used.prompt_tokens(),
            "output_tokens": used.output_tokens,
        });
        match result {
            Ok(outcome) if !outcome.text.trim().is_empty() => {
                ToolOutput::ok(outcome.text).with_structured(structured)
            }
            Ok(_) => ToolOutput::error(
                "The helper ended without an answer. Its work, if any, is in the workspace.",
            )
            .with_structured(structured),
            Err(e) => ToolOutput::error(format!(
                "The helper did not finish: {e}. What it changed before that is in the workspace."
            ))
            .with_structured(structured),
        }
    }
}

/// The helper's events as lines for the caller's live output.
struct Shown<'a> {
    ctx: &'a ToolContext,
    steps: u32,
    calls: u32,
}

impl crate::events::EventSink for Shown<'_> {
    fn event(&mut self, ev: AgentEvent) -> crate::events::BoxFuture<'_, ()> {
        self.show(ev);
        Box::pin(async {})
    }
}

impl Shown<'_> {
    fn show(&mut self, ev: AgentEvent) {
        let line = match ev {
            AgentEvent::TurnStarted { step } => {
                self.steps = step;
                return;
            }
            AgentEvent::ToolCallStarted { name, label, .. } => {
                self.calls += 1;
                format!("▸ {name} {label}")
            }
            AgentEvent::ToolCallFinished {
                output,
                is_error,
                structured,
                ..
            } => {
                let mark = if crate::event::tool_failed(is_error, structured.as_ref()) {
                    "✗"
                } else {
                    "✓"
                };
                format!("  {mark} {}", line(&output))
            }
            // What it says between calls; its last answer is the result.
            AgentEvent::AssistantMessage {
                text,
                stop_reason: crate::message::StopReason::ToolUse,
                ..
            } if !text.trim().is_empty() => format!("· {}", line(&text)),
            AgentEvent::Error { message } => format!("✗ {}", line(&message)),
            _ => return,
        };
        self.ctx
            .report(Stream::Stdout, format!("{line}\n").as_bytes());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_turn_starts_a_bounded_number_of_helpers_and_the_next_turn_more() {
        let h = Helpers::default();
        h.begin_turn("m");
        for _ in 0..MAX_PER_TURN {
            h.claim().unwrap();
        }
        assert!(h.claim().unwrap_err().contains("the most it may"));
        h.begin_turn("m");
        assert!(h.claim().is_ok());
    }
}
