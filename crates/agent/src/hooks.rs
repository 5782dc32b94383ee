//! Hooks: the user's commands run at points of a conversation
//! (`[[hooks]]` in the configuration), inside the sandbox unless the user's
//! own file marks one `host = true`.
//!
//! A hook reads one JSON object on stdin ([`HookInput`]: the event, the
//! session, and for tool events the call and its result) and answers by
//! its exit status, as Claude Code's hooks do:
//! - 0: go on. A `session_start` hook's stdout is given to the model as
//!   context (capped).
//! - 2: `before_tool` refuses the call, and its stderr is the reason the
//!   model sees; `after_tool` adds its stderr to the result the model
//!   sees; `stop` sends its stderr to the model as a message, and the
//!   turn goes on (at most [`MAX_STOP_CONTINUATIONS`] times a turn).
//! - anything else, a timeout, or a hook that cannot run: reported to
//!   the user, and the conversation goes on as if it had said 0.
//!
//! What a hook prints is sandbox (or model) output: bounded, and made
//! printable wherever it is shown.

use std::sync::Arc;
use std::time::Duration;

use cordon_sandbox::{ExecRequest, Sandbox};
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Bytes of a hook's stdout or stderr kept.
const OUTPUT_LIMIT: u64 = 16 * 1024;
/// Characters of a hook's answer passed on to the model.
const MAX_ANSWER: usize = 4000;
/// How often a turn's stop hooks may send it on.
pub const MAX_STOP_CONTINUATIONS: u32 = 3;
/// A hook's time unless it says otherwise, and the most it may ask.
const DEFAULT_TIMEOUT_SECS: u64 = 60;
const MAX_TIMEOUT_SECS: u64 = 600;

/// When a hook runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HookEvent {
    /// A conversation opens (and again after `/clear` or `/new`).
    SessionStart,
    /// Before a tool call runs (after its approval).
    BeforeTool,
    /// After a tool call ran.
    AfterTool,
    /// The model has finished its answer to a message.
    Stop,
}

/// One `[[hooks]]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HookSpec {
    pub event: HookEvent,
    /// For tool events: the tools it is for; none, every tool.
    #[serde(default)]
    pub tools: Vec<String>,
    /// A shell command line.
    pub command: String,
    /// Seconds it may take.
    #[serde(default = "default_timeout")]
    pub timeout: u64,
    /// Runs on the host, as the user, not in the sandbox: only from the
    /// user's own configuration file.
    #[serde(default)]
    pub host: bool,
}

fn default_timeout() -> u64 {
    DEFAULT_TIMEOUT_SECS
}

/// Why a hooks table cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HookError {
    #[error("a hook's command is empty")]
    Empty,
    #[error("a hook's timeout must be 1 to {MAX_TIMEOUT_SECS} seconds, not {0}")]
    Timeout(u64),
    #[error("`tools` is for before_tool and after_tool hooks only")]
    ToolsOnNonToolEvent,
}

impl HookSpec {
    pub fn validate(&self) -> Result<(), HookError> {
        if self.command.trim().is_empty() {
            return Err(HookError::Empty);
        }
        if !(1..=MAX_TIMEOUT_SECS).contains(&self.timeout) {
            return Err(HookError::Timeout(self.timeout));
        }
        if !self.tools.is_empty()
            && !matches!(self.event, HookEvent::BeforeTool | HookEvent::AfterTool)
        {
            return Err(HookError::ToolsOnNonToolEvent);
        }
        Ok(())
    }

    fn applies(&self, event: HookEvent, tool: Option<&str>) -> bool {
        self.event == event
            && (self.tools.is_empty() || tool.is_some_and(|t| self.tools.iter().any(|n| n == t)))
    }
}

/// What a hook reads on stdin.
#[derive(Debug, Clone, Serialize)]
pub struct HookInput<'a> {
    pub event: HookEvent,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool: Option<ToolCall<'a>>,
    /// A stop hook: the model's final answer.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub answer: Option<&'a str>,
}

/// The call a tool hook is about.
#[derive(Debug, Clone, Serialize)]
pub struct ToolCall<'a> {
    pub id: &'a str,
    pub name: &'a str,
    pub input: &'a Value,
    /// After the call: what the model will see, and whether it failed.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub is_error: Option<bool>,
}

/// What the hooks of one event said.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Answer {
    /// Exit 2: the stderr of each that said so, for the model.
    pub block: Option<String>,
    /// Exit 0: their stdout (for `session_start`: the model's context).
    pub said: String,
    /// Hooks that failed, in words for the user.
    pub failures: Vec<String>,
}

/// The hooks of a conversation.
#[derive(Debug, Clone, Default)]
pub struct Hooks {
    specs: Arc<Vec<HookSpec>>,
}

impl Hooks {
    pub fn new(specs: Vec<HookSpec>) -> Hooks {
        Hooks {
            specs: Arc::new(specs),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.specs.is_empty()
    }

    /// Whether any hook runs for `event` (and `tool`).
    pub fn any(&self, event: HookEvent, tool: Option<&str>) -> bool {
        self.specs.iter().any(|h| h.applies(event, tool))
    }

    /// Runs the hooks of `event`, in order, in `sandbox` (or on the host
    /// for those marked so); what they said.
    pub async fn run(
        &self,
        sandbox: &Sandbox,
        event: HookEvent,
        tool: Option<ToolCall<'_>>,
        answer: Option<&str>,
    ) -> Answer {
        let tool_name = tool.as_ref().map(|t| t.name);
        let input = HookInput {
            event,
            tool,
            answer,
        };
        let stdin = serde_json::to_vec(&input).unwrap_or_default();
        let mut out = Answer::default();
        for spec in self.specs.iter().filter(|h| h.applies(event, tool_name)) {
            let ran = if spec.host {
                run_on_host(spec, &stdin).await
            } else {
                run_in_sandbox(sandbox, spec, &stdin).await
            };
            let name = cordon_tools::printable(&first_words(&spec.command));
            match ran {
                Ok((0, stdout, _)) => {
                    if !stdout.trim().is_empty() {
                        out.said.push_str(&capped(&stdout));
                        out.said.push('\n');
                    }
                }
                Ok((2, _, stderr)) => {
                    let why = capped(stderr.trim());
                    let why = if why.is_empty() {
                        format!("the hook `{name}` said no, without a reason")
                    } else {
                        why
                    };
                    let block = out.block.get_or_insert_with(String::new);
                    if !block.is_empty() {
                        block.push('\n');
                    }
                    block.push_str(&why);
                }
                Ok((code, _, stderr)) => out.failures.push(format!(
                    "the {} hook `{name}` exited with {code}: {}",
                    event_name(event),
                    cordon_tools::printable(&first_words(stderr.trim()))
                )),
                Err(why) => out.failures.push(format!(
                    "the {} hook `{name}` did not run: {why}",
                    event_name(event)
                )),
            }
        }
        out
    }
}

fn event_name(e: HookEvent) -> &'static str {
    match e {
        HookEvent::SessionStart => "session_start",
        HookEvent::BeforeTool => "before_tool",
        HookEvent::AfterTool => "after_tool",
        HookEvent::Stop => "stop",
    }
}

/// Runs a hook in the sandbox: its status, stdout and stderr.
async fn run_in_sandbox(
    sandbox: &Sandbox,
    spec: &HookSpec,
    stdin: &[u8],
) -> Result<(i32, String, String), String> {
    let req = ExecRequest::bash(&spec.command)
        .stdin(stdin.to_vec())
        .timeout(Duration::from_secs(spec.timeout))
        .output_limit(OUTPUT_LIMIT);
    let out = sandbox.exec(req).await.map_err(|e| e.to_string())?;
    if out.timed_out {
        return Err(format!("it ran past {} s", spec.timeout));
    }
    Ok((out.status.code(), out.stdout_str(), out.stderr_str()))
}

/// Runs a hook on the host, as the user, with a bounded time and output.
async fn run_on_host(spec: &HookSpec, stdin: &[u8]) -> Result<(i32, String, String), String> {
    use tokio::io::AsyncWriteExt;
    let mut child = tokio::process::Command::new("/bin/sh")
        .arg("-c")
        .arg(&spec.command)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| e.to_string())?;
    if let Some(mut input) = child.stdin.take() {
        let _ = input.write_all(stdin).await;
    }
    let waited = tokio::time::timeout(Duration::from_secs(spec.timeout), child.wait_with_output())
        .await
        .map_err(|_| format!("it ran past {} s", spec.timeout))?
        .map_err(|e| e.to_string())?;
    let text =
        |b: &[u8]| String::from_utf8_lossy(&b[..b.len().min(OUTPUT_LIMIT as usize)]).into_owned();
    Ok((
        waited.status.code().unwrap_or(128),
        text(&waited.stdout),
        text(&waited.stderr),
    ))
}

/// At most [`MAX_ANSWER`] characters, saying so when cut.
fn capped(s: &str) -> String {
    if s.chars().count() <= MAX_ANSWER {
        return s.to_string();
    }
    let mut t: String = s.chars().take(MAX_ANSWER).collect();
    t.push_str("\n[cut]");
    t
}

fn first_words(s: &str) -> String {
    let line = s.lines().next().unwrap_or("");
    let mut t: String = line.chars().take(80).collect();
    if t.len() < line.len() {
        t.push('…');
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(toml: &str) -> Result<HookSpec, String> {
        let s: HookSpec = toml::from_str(toml).map_err(|e| e.to_string())?;
        s.validate().map_err(|e| e.to_string())?;
        Ok(s)
    }

    #[test]
    fn specs_are_read_and_checked() {
        let h = spec("event = \"before_tool\"\ntools = [\"bash\"]\ncommand = \"check\"").unwrap();
        assert!(h.applies(HookEvent::BeforeTool, Some("bash")));
        assert!(!h.applies(HookEvent::BeforeTool, Some("write_file")));
        assert!(!h.applies(HookEvent::AfterTool, Some("bash")));
        assert_eq!(h.timeout, 60);
        assert!(spec("event = \"stop\"\ncommand = \" \"").is_err());
        assert!(spec("event = \"stop\"\ncommand = \"x\"\ntimeout = 0").is_err());
        assert!(spec("event = \"stop\"\ncommand = \"x\"\ntools = [\"bash\"]").is_err());
        assert!(spec("event = \"later\"\ncommand = \"x\"").is_err());
        assert!(spec("event = \"stop\"\ncommand = \"x\"\nrun = 1").is_err());
    }
}
