//! `update_plan`: the model's list of steps and where each stands. Nothing
//! runs and nothing is written: the plan goes back to the front ends as a
//! [`Plan`] (shown live, kept in the session log) and to the model as a
//! one-line acknowledgement, so a long task's progress is visible to the
//! user while it happens.
//!
//! The plan is model text: bounded here (steps, lengths), and made
//! printable by whoever shows it.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool, args};

pub struct UpdatePlan;

/// The tool's name, as the model calls it.
pub const NAME: &str = "update_plan";
/// Most steps a plan may have: a plan longer than this is a task list, not
/// a plan, and would crowd the screen it is shown on.
pub const MAX_STEPS: usize = 40;
/// Longest step, in characters: a step is one line.
pub const MAX_STEP_CHARS: usize = 300;
/// Longest explanation, in characters.
pub const MAX_EXPLANATION_CHARS: usize = 2000;

/// Where a step stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepStatus {
    Pending,
    InProgress,
    Completed,
}

impl StepStatus {
    /// The mark a front end shows the step with: done, now, to do.
    pub fn mark(self) -> &'static str {
        match self {
            StepStatus::Completed => "✓",
            StepStatus::InProgress => "▸",
            StepStatus::Pending => "○",
        }
    }
}

/// One step of a plan.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Step {
    pub step: String,
    pub status: StepStatus,
}

/// The model's plan, whole: each call replaces the last.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Plan {
    /// Why the plan is what it is, or what changed since the last one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub explanation: Option<String>,
    pub plan: Vec<Step>,
}

impl Plan {
    /// Reads a call's arguments as a plan, checked: what is wrong, in words
    /// that tell the model how to call again.
    pub fn parse(input: Value) -> Result<Plan, String> {
        serde_json::from_value::<Plan>(input)
            .map_err(|e| e.to_string())?
            .checked()
    }

    /// The plan within its bounds, each step one line.
    pub fn checked(self) -> Result<Plan, String> {
        let mut plan = self;
        plan.explanation = plan
            .explanation
            .map(|e| e.trim().to_string())
            .filter(|e| !e.is_empty());
        if plan
            .explanation
            .as_ref()
            .is_some_and(|e| e.chars().count() > MAX_EXPLANATION_CHARS)
        {
            return Err(format!(
                "the explanation is longer than {MAX_EXPLANATION_CHARS} characters; say it in a sentence or two"
            ));
        }
        if plan.plan.len() > MAX_STEPS {
            return Err(format!(
                "the plan has {} steps, more than {MAX_STEPS}; group them into fewer, larger steps",
                plan.plan.len()
            ));
        }
        for (i, s) in plan.plan.iter_mut().enumerate() {
            // One line each: a step's own line breaks would break the
            // list it is shown in.
            s.step = s.step.split_whitespace().collect::<Vec<_>>().join(" ");
            if s.step.is_empty() {
                return Err(format!("step {} is empty; every step needs a text", i + 1));
            }
            if s.step.chars().count() > MAX_STEP_CHARS {
                return Err(format!(
                    "step {} is longer than {MAX_STEP_CHARS} characters; a step is one short line",
                    i + 1
                ));
            }
        }
        let running = plan
            .plan
            .iter()
            .filter(|s| s.status == StepStatus::InProgress)
            .count();
        if running > 1 {
            return Err(format!(
                "{running} steps are in_progress; at most one may be: mark the others pending or completed"
            ));
        }
        Ok(plan)
    }

    /// How many steps are completed.
    pub fn done(&self) -> usize {
        self.plan
            .iter()
            .filter(|s| s.status == StepStatus::Completed)
            .count()
    }

    /// The step being worked on, if any.
    pub fn current(&self) -> Option<&Step> {
        self.plan
            .iter()
            .find(|s| s.status == StepStatus::InProgress)
    }

    /// Every step is completed (an empty plan is none).
    pub fn finished(&self) -> bool {
        !self.plan.is_empty() && self.done() == self.plan.len()
    }
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "explanation": {"type": "string", "description": "Optional: why the plan changed, in a sentence."},
            "plan": {
                "type": "array",
                "maxItems": MAX_STEPS,
                "description": "Every step of the plan, in order, each time (this list replaces the last one).",
                "items": {
                    "type": "object",
                    "properties": {
                        "step": {"type": "string", "description": "What the step does, in one short line."},
                        "status": {"type": "string", "enum": ["pending", "in_progress", "completed"]}
                    },
                    "required": ["step", "status"],
                    "additionalProperties": false
                }
            }
        },
        "required": ["plan"],
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Keep a plan for a task of several steps, shown to the user as you work. Call it once you know the steps (each a short line, all `pending` but the first, `in_progress`), then again whenever a step is done or the plan changes: mark the step `completed` and the next `in_progress` in the same call. At most one step is `in_progress` at a time. Each call sends the whole list, which replaces the last. Skip it for a task of one or two steps. Returns a one-line acknowledgement; it runs nothing.";

impl TypedTool for UpdatePlan {
    const NAME: &'static str = NAME;
    // It changes nothing the sandbox holds: it may run beside other
    // read-only calls, and in plan mode.
    const READ_ONLY: bool = true;
    type Input = Plan;
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn label(&self, plan: &Plan) -> String {
        match plan.plan.len() {
            0 => "(cleared)".into(),
            n => format!("{} of {n} done", plan.done()),
        }
    }
    fn run<'a>(&'a self, _ctx: &'a ToolContext, plan: Plan) -> ToolFuture<'a> {
        Box::pin(std::future::ready(update(plan)))
    }
}

/// A plan whose shape parsed (serde's message names a wrong field):
/// its bounds, each error with the schema to call again with.
fn update(plan: Plan) -> ToolOutput {
    let plan = match plan.checked() {
        Ok(p) => p,
        Err(why) => return args::invalid(NAME, &schema(), &why),
    };
    let text = match (plan.plan.len(), plan.current()) {
        (0, _) => "Plan cleared.".to_string(),
        (n, Some(s)) => format!(
            "Plan updated: {} of {n} steps completed; now: {}.",
            plan.done(),
            s.step
        ),
        (n, None) => format!("Plan updated: {} of {n} steps completed.", plan.done()),
    };
    ToolOutput::ok(text).with_plan(plan)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(s: &str, status: &str) -> Value {
        json!({"step": s, "status": status})
    }

    #[test]
    fn a_plan_is_read_trimmed_to_one_line_per_step() {
        let p = Plan::parse(json!({
            "explanation": "  first look  ",
            "plan": [step("read\nthe   code", "completed"), step("fix it", "in_progress"), step("test", "pending")]
        }))
        .unwrap();
        assert_eq!(p.explanation.as_deref(), Some("first look"));
        assert_eq!(p.plan[0].step, "read the code");
        assert_eq!(p.done(), 1);
        assert_eq!(p.current().unwrap().step, "fix it");
        assert!(!p.finished());
    }

    #[test]
    fn bad_plans_are_refused_with_what_to_fix() {
        let two =
            Plan::parse(json!({"plan": [step("a", "in_progress"), step("b", "in_progress")]}));
        assert!(two.unwrap_err().contains("at most one"));
        let empty = Plan::parse(json!({"plan": [step("  ", "pending")]}));
        assert!(empty.unwrap_err().contains("step 1 is empty"));
        let long = Plan::parse(json!({"plan": [step(&"x".repeat(MAX_STEP_CHARS + 1), "pending")]}));
        assert!(long.unwrap_err().contains("one short line"));
        let many: Vec<Value> = (0..=MAX_STEPS)
            .map(|i| step(&i.to_string(), "pending"))
            .collect();
        assert!(
            Plan::parse(json!({ "plan": many }))
                .unwrap_err()
                .contains("fewer")
        );
        let status = Plan::parse(json!({"plan": [step("a", "done")]}));
        assert!(status.unwrap_err().contains("unknown variant"));
        let extra = Plan::parse(json!({"plan": [], "steps": []}));
        assert!(extra.unwrap_err().contains("unknown field"));
    }

    /// As a call reaches it: the shape parsed first.
    fn update(input: Value) -> ToolOutput {
        match args::parse::<Plan>(NAME, &schema(), input) {
            Ok(plan) => super::update(plan),
            Err(e) => e,
        }
    }

    #[test]
    fn the_model_is_told_where_the_plan_stands() {
        let out = update(json!({"plan": [step("a", "completed"), step("b", "in_progress")]}));
        assert!(!out.is_error);
        assert_eq!(out.text, "Plan updated: 1 of 2 steps completed; now: b.");
        assert_eq!(out.plan.unwrap().plan.len(), 2);
        let bad = update(json!({"plan": "do it"}));
        assert!(bad.is_error && bad.text.contains("schema") && bad.plan.is_none());
        assert_eq!(update(json!({"plan": []})).text, "Plan cleared.");
    }
}
