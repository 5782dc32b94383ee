//! What a finished job reports beyond its output: each step's own result,
//! or the agent's answer and usage.

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use super::JobState;

/// `steps` and `gui` jobs: one per step; `agent` jobs: the answer;
/// `build` jobs: the image.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(untagged)]
pub enum JobResult {
    Steps {
        /// In order, every step, run or not.
        steps: Vec<StepResult>,
    },
    // Before `Agent`, whose fields are all optional but `usage`.
    Build(BuildResult),
    Agent(AgentResult),
}

/// A build job's image, kept as one of the tenant's own.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct BuildResult {
    /// Its name, as jobs and sessions name it.
    pub image: String,
    /// Its manifest's digest.
    pub digest: String,
    /// Bytes of its layers, unpacked.
    pub size: u64,
    /// Steps run, and taken from the cache.
    pub ran: usize,
    pub cached: usize,
}

/// How a step ended; `skipped` when a failure (or the end of time) kept it
/// from running.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum StepState {
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
    Skipped,
}

impl From<JobState> for StepState {
    fn from(s: JobState) -> Self {
        match s {
            JobState::Succeeded => StepState::Succeeded,
            JobState::Cancelled => StepState::Cancelled,
            JobState::TimedOut => StepState::TimedOut,
            JobState::Queued | JobState::Running | JobState::Failed => StepState::Failed,
        }
    }
}

/// One step's result. A skipped step has only `index`, `tool` and `state`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct StepResult {
    pub index: usize,
    #[schema(example = "shell")]
    pub tool: String,
    pub state: StepState,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The step's own output, 64 KiB of each stream at most.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stdout_truncated: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stderr_truncated: Option<bool>,
    /// A computer step's screenshot, relative to the workspace.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(example = "screenshots/step-01.png")]
    pub screenshot: Option<String>,
}

impl StepResult {
    pub fn skipped(index: usize, tool: &str) -> StepResult {
        StepResult {
            index,
            tool: tool.to_string(),
            state: StepState::Skipped,
            exit_code: None,
            error: None,
            duration_ms: None,
            stdout: None,
            stderr: None,
            stdout_truncated: None,
            stderr_truncated: None,
            screenshot: None,
        }
    }
}

/// An agent job's answer: set when it finished, `usage` always.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
pub struct AgentResult {
    /// The agent's final text.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<String>, example = "end_turn")]
    pub stop_reason: Option<cordon_agent::StopReason>,
    /// Model turns taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u32>,
    /// Tokens: `input_tokens`, `output_tokens`, `cache_read_tokens`,
    /// `cache_write_tokens`.
    #[schema(value_type = Object)]
    pub usage: cordon_agent::Usage,
    /// What the model's provider charges, when its prices are known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cost_usd: Option<f64>,
}

impl AgentResult {
    pub fn usage(usage: cordon_agent::Usage) -> AgentResult {
        AgentResult {
            text: None,
            stop_reason: None,
            steps: None,
            usage,
            cost_usd: None,
        }
    }
}
