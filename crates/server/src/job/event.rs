//! A job's events, as stored and served on its SSE stream: each one's
//! name is the SSE event name and the rest its JSON data. An agent job's
//! events are the agent's own (`cordon exec --json`) and pass through.

use serde::Serialize;
use utoipa::ToSchema;

use super::{JobState, StepResult};

/// A policy change as the agent's log records it: the allow list now,
/// `added` and `removed`.
#[derive(Debug, Clone, PartialEq)]
pub struct PolicyChanged(pub cordon_agent::PolicyRecord);

/// As the log's `network_policy` record, `type` and all.
impl Serialize for PolicyChanged {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        cordon_agent::SessionRecord::NetworkPolicy(self.0.clone()).serialize(s)
    }
}

impl utoipa::PartialSchema for PolicyChanged {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        utoipa::openapi::schema::ObjectBuilder::new()
            .description(Some(
                "`type` \"network_policy\", `allow` (the rules now), `allow_private`, `added` and `removed`.",
            ))
            .into()
    }
}
impl ToSchema for PolicyChanged {}

/// A problem, with `"type": "error"` as the agent's events carry their
/// type.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "type", rename = "error")]
pub struct Problem {
    pub message: String,
}

/// An event of a job; `event` names it on the stream, `data` is what it
/// carries.
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "event", content = "data", rename_all = "snake_case")]
pub enum JobEvent {
    /// The job started running, on this worker (its id, as `cordon
    /// worker` prints it).
    State {
        state: JobState,
        #[serde(skip_serializing_if = "Option::is_none")]
        worker: Option<String>,
    },
    /// Output, as it came (UTF-8; a character split across reads waits
    /// for its end).
    Stdout {
        data: String,
    },
    Stderr {
        data: String,
    },
    /// The stream reached the job's output cap; the rest is dropped.
    OutputTruncated {
        stream: cordon_sandbox::Stream,
        cap_bytes: usize,
    },
    StepStarted {
        index: usize,
        #[schema(example = "shell")]
        tool: String,
    },
    StepFinished(StepResult),
    /// The broker refused a connection (each host and port once).
    NetworkRefused {
        host: String,
        port: u16,
        #[schema(value_type = String, example = "refused")]
        decision: cordon_net::Decision,
        #[schema(value_type = String, example = "not_allowed")]
        reason: cordon_net::Reason,
        message: String,
    },
    /// The job's policy was replaced through the API.
    NetworkPolicy(PolicyChanged),
    /// The job's `repo` was cloned into its workspace, before its sandbox
    /// started: the branch the job works on, the commit it starts from,
    /// and the remote branch a pull request goes into.
    Repository {
        url: String,
        #[schema(example = "cordon/job_0123456789abcdef")]
        branch: String,
        base: String,
        #[schema(example = "main")]
        base_branch: String,
    },
    /// The image the job's root was made from: the name it asked for (or
    /// the server's default) and the manifest digest that ran.
    Image {
        #[schema(example = "debian:bookworm")]
        name: String,
        #[schema(example = "sha256:4f1a…")]
        digest: String,
    },
    /// Something beside the job's own output went wrong (an MCP server
    /// that did not start); shaped like the agent's own events.
    Error(Problem),
    /// The worker running the job stopped answering (its lease lapsed) or
    /// restarted, and the job is queued to run again from the start, in a
    /// fresh sandbox: `attempts` runs so far, of the server's
    /// `--max-attempts`. Its stdout and stderr start again empty; the
    /// events keep what the lost run printed.
    Requeued {
        reason: String,
        attempts: i64,
    },
    /// The last event: how the job ended.
    Finished {
        state: JobState,
        exit_code: Option<i64>,
        error: Option<String>,
    },
}

impl JobEvent {
    /// The event's name and its data, as the store keeps them.
    pub fn parts(&self) -> (&'static str, serde_json::Value) {
        let name = match self {
            JobEvent::State { .. } => "state",
            JobEvent::Stdout { .. } => "stdout",
            JobEvent::Stderr { .. } => "stderr",
            JobEvent::OutputTruncated { .. } => "output_truncated",
            JobEvent::StepStarted { .. } => "step_started",
            JobEvent::StepFinished(_) => "step_finished",
            JobEvent::NetworkRefused { .. } => "network_refused",
            JobEvent::NetworkPolicy(_) => "network_policy",
            JobEvent::Repository { .. } => "repository",
            JobEvent::Image { .. } => "image",
            JobEvent::Error(_) => "error",
            JobEvent::Requeued { .. } => "requeued",
            JobEvent::Finished { .. } => "finished",
        };
        let data = serde_json::to_value(self)
            .ok()
            .and_then(|mut v| v.get_mut("data").map(serde_json::Value::take))
            .unwrap_or_default();
        (name, data)
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn an_event_is_its_name_and_its_data() {
        assert_eq!(
            JobEvent::Stdout {
                data: "hi\n".into()
            }
            .parts(),
            ("stdout", json!({"data": "hi\n"}))
        );
        assert_eq!(
            JobEvent::Finished {
                state: JobState::TimedOut,
                exit_code: Some(124),
                error: None
            }
            .parts(),
            (
                "finished",
                json!({"state": "timed_out", "exit_code": 124, "error": null})
            )
        );
        let (name, data) = JobEvent::StepFinished(StepResult::skipped(2, "shell")).parts();
        assert_eq!(name, "step_finished");
        assert_eq!(
            data,
            json!({"index": 2, "tool": "shell", "state": "skipped"})
        );
        let change = cordon_agent::PolicyRecord {
            allow: vec!["a.example".into()],
            allow_private: false,
            added: vec!["a.example".into()],
            removed: Vec::new(),
        };
        assert_eq!(
            JobEvent::NetworkPolicy(PolicyChanged(change)).parts(),
            (
                "network_policy",
                json!({"type": "network_policy", "allow": ["a.example"], "allow_private": false,
                       "added": ["a.example"], "removed": []})
            )
        );
    }
}
