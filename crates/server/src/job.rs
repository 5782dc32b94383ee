//! What a job is: the request a client posts, checked field by field so a
//! typo or a wrong type gets a 400 naming it, and the states a job moves
//! through.

use serde::Serialize;
use serde_json::{Map, Value};

/// Where a job is in its life. Terminal states never change again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    Queued,
    Running,
    Succeeded,
    Failed,
    Cancelled,
    TimedOut,
}

impl JobState {
    pub const ALL: [JobState; 6] = [
        JobState::Queued,
        JobState::Running,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Cancelled,
        JobState::TimedOut,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Running => "running",
            JobState::Succeeded => "succeeded",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::TimedOut => "timed_out",
        }
    }

    pub fn parse(s: &str) -> Option<JobState> {
        Self::ALL.into_iter().find(|st| st.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }
}

/// A language `run_code`-style jobs and steps can be written in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Language {
    Python,
    Javascript,
    Typescript,
}

impl Language {
    pub fn parse(s: &str) -> Option<Language> {
        match s {
            "python" => Some(Language::Python),
            "javascript" => Some(Language::Javascript),
            "typescript" => Some(Language::Typescript),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Javascript => "javascript",
            Language::Typescript => "typescript",
        }
    }
}

/// One step of a `steps` job.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "tool", rename_all = "snake_case")]
pub enum Step {
    Shell {
        command: String,
    },
    Code {
        language: Language,
        code: String,
    },
    WriteFile {
        path: String,
        content: String,
    },
    ReadFile {
        path: String,
    },
    /// An action of the computer tool; needs a display.
    Computer {
        #[serde(flatten)]
        args: Map<String, Value>,
    },
}

impl Step {
    pub fn tool(&self) -> &'static str {
        match self {
            Step::Shell { .. } => "shell",
            Step::Code { language, .. } => language.as_str(),
            Step::WriteFile { .. } => "write_file",
            Step::ReadFile { .. } => "read_file",
            Step::Computer { .. } => "computer",
        }
    }
}

/// What to run.
#[derive(Debug, Clone, PartialEq)]
pub enum JobSpec {
    Shell {
        command: String,
    },
    Code {
        language: Language,
        code: String,
    },
    Steps {
        steps: Vec<Step>,
        continue_on_error: bool,
        /// A virtual screen (`gui` jobs).
        display: Option<cordon_sandbox::Display>,
    },
    Agent {
        prompt: String,
        model: Option<String>,
        max_steps: Option<u32>,
        /// A virtual screen, which gives the agent the computer tool.
        display: Option<cordon_sandbox::Display>,
    },
}

impl JobSpec {
    /// The virtual screen the job's sandbox gets, if any.
    pub fn display(&self) -> Option<cordon_sandbox::Display> {
        match self {
            JobSpec::Steps { display, .. } | JobSpec::Agent { display, .. } => *display,
            _ => None,
        }
    }
}

/// The optional `display` field, WIDTHxHEIGHT.
pub(crate) fn display_field(
    obj: &serde_json::Map<String, Value>,
    default: Option<cordon_sandbox::Display>,
) -> Result<Option<cordon_sandbox::Display>, String> {
    match obj.get("display") {
        None | Some(Value::Null) => Ok(default),
        Some(Value::String(d)) => d
            .parse::<cordon_sandbox::Display>()
            .map(Some)
            .map_err(|e| format!("`display`: {e}")),
        Some(other) => Err(format!(
            "`display` must be a string such as \"1280x800\", not {}",
            type_name(other)
        )),
    }
}

impl JobSpec {
    pub fn kind(&self) -> &'static str {
        match self {
            JobSpec::Shell { .. } => "shell",
            JobSpec::Code { language, .. } => language.as_str(),
            JobSpec::Steps {
                display: Some(_), ..
            } => "gui",
            JobSpec::Steps { .. } => "steps",
            JobSpec::Agent { .. } => "agent",
        }
    }
}

/// Limits a job runs under, like `cordon run`'s options.
#[derive(Debug, Clone, PartialEq)]
pub struct RunOptions {
    pub timeout_secs: u64,
    pub memory: u64,
    /// The disk budget: how much the workspace may grow, in bytes.
    pub disk: u64,
    /// `off` (no interface up), `loopback` (processes of the job may talk
    /// to each other) or `allow` (through the broker, to [`Self::egress`]);
    /// never the host's network.
    pub network: cordon_sandbox::Network,
    /// With `allow`, what the job asked for: entries as written (presets
    /// among them), or none for all the tenant's ceiling allows. Checked
    /// against the ceiling and expanded when the job is submitted, so a
    /// stored job holds plain rules.
    pub egress: Option<cordon_net::PolicySpec>,
    /// The isolation backend; `None` is the server's default.
    pub backend: Option<cordon_sandbox::BackendKind>,
}

/// A checked job request.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRequest {
    pub spec: JobSpec,
    pub options: RunOptions,
}

/// The server's bounds on what a job may ask for.
#[derive(Debug, Clone)]
pub struct Bounds {
    pub default_timeout_secs: u64,
    pub max_timeout_secs: u64,
    pub default_memory: u64,
    pub max_memory: u64,
    /// A job's disk budget unless it asks for another, and the most it
    /// may ask for.
    pub default_disk: u64,
    pub max_disk: u64,
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            default_timeout_secs: 300,
            max_timeout_secs: 3600,
            default_memory: 512 * 1024 * 1024,
            max_memory: 4 * 1024 * 1024 * 1024,
            default_disk: DEFAULT_DISK,
            max_disk: 8 * 1024 * 1024 * 1024,
        }
    }
}

/// A job's disk budget when neither it nor the server names one.
pub const DEFAULT_DISK: u64 = 1024 * 1024 * 1024;
const MIB: u64 = 1024 * 1024;

const KINDS: &str = "shell, python, javascript, typescript, steps, gui or agent";

/// The screen of a `gui` job that names none: WXGA, a laptop's.
pub const DEFAULT_DISPLAY: cordon_sandbox::Display = cordon_sandbox::Display {
    width: 1280,
    height: 800,
};
const OPTIONS: [&str; 7] = [
    "timeout_secs",
    "memory",
    "disk",
    "network",
    "allow",
    "allow_private",
    "backend",
];

fn field<'a>(obj: &'a Map<String, Value>, key: &str, what: &str) -> Result<&'a Value, String> {
    obj.get(key)
        .ok_or_else(|| format!("{what} needs the field `{key}`"))
}

fn string(obj: &Map<String, Value>, key: &str, what: &str) -> Result<String, String> {
    match field(obj, key, what)? {
        Value::String(s) => Ok(s.clone()),
        other => Err(format!(
            "`{key}` must be a string, not {}",
            type_name(other)
        )),
    }
}

fn nonempty(obj: &Map<String, Value>, key: &str, what: &str) -> Result<String, String> {
    let s = string(obj, key, what)?;
    if s.trim().is_empty() {
        return Err(format!("`{key}` is empty"));
    }
    Ok(s)
}

fn optional_string(obj: &Map<String, Value>, key: &str) -> Result<Option<String>, String> {
    match obj.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(format!(
            "`{key}` must be a string, not {}",
            type_name(other)
        )),
    }
}

fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// Refuses fields outside `allowed`, naming the ones that are allowed:
/// a misspelt option must not be silently ignored.
fn only(obj: &Map<String, Value>, allowed: &[&str], what: &str) -> Result<(), String> {
    if let Some(k) = obj.keys().find(|k| !allowed.contains(&k.as_str())) {
        return Err(format!(
            "unknown field `{k}` in {what} (allowed: {})",
            allowed.join(", ")
        ));
    }
    Ok(())
}

fn step(i: usize, v: &Value) -> Result<Step, String> {
    let what = format!("step {i}");
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{what} must be an object, not {}", type_name(v)))?;
    // The seeds call it `tool`; `kind` reads as naturally.
    let key = if obj.contains_key("tool") {
        "tool"
    } else {
        "kind"
    };
    let tool = string(obj, key, &what).map_err(|_| {
        format!(
            "{what} needs `tool`: shell, python, javascript, typescript, write_file, read_file or computer"
        )
    })?;
    let step = match tool.as_str() {
        "shell" => {
            only(obj, &[key, "command"], &what)?;
            Step::Shell {
                command: nonempty(obj, "command", &what)?,
            }
        }
        "write_file" => {
            only(obj, &[key, "path", "content"], &what)?;
            Step::WriteFile {
                path: nonempty(obj, "path", &what)?,
                content: string(obj, "content", &what)?,
            }
        }
        "read_file" => {
            only(obj, &[key, "path"], &what)?;
            Step::ReadFile {
                path: nonempty(obj, "path", &what)?,
            }
        }
        "computer" => {
            let mut args = obj.clone();
            args.remove(key);
            cordon_tools::computer::check(&Value::Object(args.clone()))
                .map_err(|e| format!("{what}: {e}"))?;
            Step::Computer { args }
        }
        other => match Language::parse(other) {
            Some(language) => {
                only(obj, &[key, "code"], &what)?;
                Step::Code {
                    language,
                    code: nonempty(obj, "code", &what)?,
                }
            }
            None => {
                return Err(format!(
                    "{what}: unknown tool `{other}` (expected shell, python, javascript, typescript, write_file, read_file or computer)"
                ));
            }
        },
    };
    Ok(step)
}

impl JobRequest {
    /// Checks a posted body. `kind` may be omitted when `steps` is given
    /// (the seeds' shape).
    pub fn from_json(body: &Value, bounds: &Bounds) -> Result<JobRequest, String> {
        let obj = body
            .as_object()
            .ok_or_else(|| format!("a job must be a JSON object, not {}", type_name(body)))?;
        let kind = match obj.get("kind") {
            Some(Value::String(k)) => k.as_str(),
            Some(other) => {
                return Err(format!("`kind` must be a string, not {}", type_name(other)));
            }
            None if obj.contains_key("steps") => "steps",
            None => return Err(format!("a job needs `kind`: {KINDS}")),
        };
        let what = format!("a {kind} job");
        fn with_options<'a>(fields: &[&'a str]) -> Vec<&'a str> {
            let mut v = vec!["kind"];
            v.extend_from_slice(fields);
            v.extend_from_slice(&OPTIONS);
            v
        }
        let spec = match kind {
            "shell" => {
                only(obj, &with_options(&["command"]), &what)?;
                JobSpec::Shell {
                    command: nonempty(obj, "command", &what)?,
                }
            }
            "steps" | "gui" => {
                only(
                    obj,
                    &with_options(&["steps", "continue_on_error", "display"]),
                    &what,
                )?;
                let steps = match field(obj, "steps", &what)? {
                    Value::Array(items) if items.is_empty() => {
                        return Err("`steps` is empty".into());
                    }
                    Value::Array(items) if items.len() > 100 => {
                        return Err(format!("`steps` has {} steps; at most 100", items.len()));
                    }
                    Value::Array(items) => items
                        .iter()
                        .enumerate()
                        .map(|(i, s)| step(i, s))
                        .collect::<Result<Vec<_>, _>>()?,
                    other => {
                        return Err(format!(
                            "`steps` must be an array, not {}",
                            type_name(other)
                        ));
                    }
                };
                let continue_on_error = match obj.get("continue_on_error") {
                    None | Some(Value::Null) => false,
                    Some(Value::Bool(b)) => *b,
                    Some(other) => {
                        return Err(format!(
                            "`continue_on_error` must be a boolean, not {}",
                            type_name(other)
                        ));
                    }
                };
                let default = (kind == "gui").then_some(DEFAULT_DISPLAY);
                let display = display_field(obj, default)?;
                if display.is_none() && steps.iter().any(|s| matches!(s, Step::Computer { .. })) {
                    return Err(
                        "computer steps need a display: use kind `gui`, or set `display`".into(),
                    );
                }
                JobSpec::Steps {
                    steps,
                    continue_on_error,
                    display,
                }
            }
            "agent" => {
                only(
                    obj,
                    &with_options(&["prompt", "model", "max_steps", "display"]),
                    &what,
                )?;
                let max_steps = match obj.get("max_steps") {
                    None | Some(Value::Null) => None,
                    Some(v) => match v.as_u64() {
                        Some(n @ 1..=200) => Some(n as u32),
                        _ => return Err("`max_steps` must be a whole number from 1 to 200".into()),
                    },
                };
                JobSpec::Agent {
                    prompt: nonempty(obj, "prompt", &what)?,
                    model: optional_string(obj, "model")?,
                    max_steps,
                    display: display_field(obj, None)?,
                }
            }
            other => match Language::parse(other) {
                Some(language) => {
                    only(obj, &with_options(&["code"]), &what)?;
                    JobSpec::Code {
                        language,
                        code: nonempty(obj, "code", &what)?,
                    }
                }
                None => return Err(format!("unknown kind `{other}` (expected {KINDS})")),
            },
        };
        Ok(JobRequest {
            spec,
            options: options(obj, bounds)?,
        })
    }
}

fn options(obj: &Map<String, Value>, bounds: &Bounds) -> Result<RunOptions, String> {
    let timeout_secs = match obj.get("timeout_secs") {
        None | Some(Value::Null) => bounds.default_timeout_secs,
        Some(v) => match v.as_u64() {
            Some(n) if n >= 1 && n <= bounds.max_timeout_secs => n,
            _ => {
                return Err(format!(
                    "`timeout_secs` must be a whole number of seconds from 1 to {}",
                    bounds.max_timeout_secs
                ));
            }
        },
    };
    let memory = match obj.get("memory") {
        None | Some(Value::Null) => bounds.default_memory,
        Some(Value::String(s)) => {
            let m = cordon_sandbox::parse_size(s).map_err(|e| format!("`memory`: {e}"))?;
            if m < 16 * 1024 * 1024 || m > bounds.max_memory {
                return Err(format!(
                    "`memory` must be from 16M to {}M",
                    bounds.max_memory / (1024 * 1024)
                ));
            }
            m
        }
        Some(Value::Number(n)) => match n.as_u64() {
            Some(m) if (16 * 1024 * 1024..=bounds.max_memory).contains(&m) => m,
            _ => {
                return Err(format!(
                    "`memory` must be from 16M to {}M",
                    bounds.max_memory / (1024 * 1024)
                ));
            }
        },
        Some(other) => {
            return Err(format!(
                "`memory` must be a size such as \"512M\", not {}",
                type_name(other)
            ));
        }
    };
    let disk = match obj.get("disk") {
        None | Some(Value::Null) => bounds.default_disk,
        Some(v) => {
            let bad = || {
                format!(
                    "`disk` (how much the workspace may grow) must be a size from 1M to {}M",
                    bounds.max_disk / MIB
                )
            };
            let d = match v {
                Value::String(s) => {
                    cordon_sandbox::parse_size(s).map_err(|e| format!("`disk`: {e}"))?
                }
                Value::Number(n) => n.as_u64().ok_or_else(bad)?,
                other => {
                    return Err(format!(
                        "`disk` must be a size such as \"1G\", not {}",
                        type_name(other)
                    ));
                }
            };
            if !(MIB..=bounds.max_disk).contains(&d) {
                return Err(bad());
            }
            d
        }
    };
    let (network, egress) = network_option(obj)?;
    let backend = match obj.get("backend") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(
            s.parse()
                .map_err(|_| format!("`backend` must be \"native\" or \"microvm\", not {s:?}"))?,
        ),
        Some(other) => {
            return Err(format!(
                "`backend` must be \"native\" or \"microvm\", not {}",
                type_name(other)
            ));
        }
    };
    Ok(RunOptions {
        timeout_secs,
        memory,
        disk,
        network,
        egress,
        backend,
    })
}

/// `network`, `allow` and `allow_private`: a list of hosts implies
/// `allow`; `allow` alone means all the tenant's ceiling allows.
pub(crate) fn network_option(
    obj: &Map<String, Value>,
) -> Result<(cordon_sandbox::Network, Option<cordon_net::PolicySpec>), String> {
    use cordon_sandbox::Network;
    const MODES: &str = "\"off\", \"loopback\" or \"allow\" (with `allow`: the hosts)";
    let allow = match obj.get("allow") {
        None | Some(Value::Null) => None,
        Some(Value::Array(items)) => {
            if items.len() > MAX_ALLOW {
                return Err(format!(
                    "`allow` has {} entries; at most {MAX_ALLOW}",
                    items.len()
                ));
            }
            let mut entries = Vec::with_capacity(items.len());
            for (i, item) in items.iter().enumerate() {
                let Value::String(e) = item else {
                    return Err(format!(
                        "`allow[{i}]` must be a string (HOST[:PORT], *.DOMAIN, IP/CIDR or @preset), not {}",
                        type_name(item)
                    ));
                };
                e.parse::<cordon_net::Entry>()
                    .map_err(|err| format!("`allow[{i}]`: {err}"))?;
                entries.push(e.clone());
            }
            Some(entries)
        }
        Some(other) => {
            return Err(format!(
                "`allow` must be an array of hosts, not {}",
                type_name(other)
            ));
        }
    };
    let allow_private = match obj.get("allow_private") {
        None | Some(Value::Null) => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(other) => {
            return Err(format!(
                "`allow_private` must be a boolean, not {}",
                type_name(other)
            ));
        }
    };
    let network = match obj.get("network") {
        None | Some(Value::Null) if allow.is_some() => Network::Allow,
        None | Some(Value::Null) | Some(Value::Bool(false)) => Network::Off,
        Some(Value::String(s)) => match s.parse() {
            Ok(Network::Full) => {
                return Err(
                    "jobs never get the host's network; `network` may be \"allow\" with the hosts in `allow`"
                        .into(),
                );
            }
            Ok(n) => n,
            Err(_) => return Err(format!("`network` must be {MODES}, not {s:?}")),
        },
        Some(Value::Bool(true)) => {
            return Err(format!(
                "`network` must be {MODES}; `true` would be the host's network, which jobs never get"
            ));
        }
        Some(other) => {
            return Err(format!(
                "`network` must be {MODES}, not {}",
                type_name(other)
            ));
        }
    };
    if network != Network::Allow && (allow.is_some() || allow_private.is_some()) {
        return Err(format!(
            "`allow` and `allow_private` need `network` \"allow\", not {:?}",
            network.to_string()
        ));
    }
    let egress = (network == Network::Allow).then(|| cordon_net::PolicySpec {
        allow: allow.unwrap_or_default(),
        allow_private: allow_private.unwrap_or(false),
    });
    Ok((network, egress))
}

/// Entries in a job's `allow`, at most (a preset counts one).
const MAX_ALLOW: usize = 256;

/// Characters of a job's preview at most.
const PREVIEW_CHARS: usize = 120;

/// What a job does, in one line for a list: its command, code or prompt
/// (the first line, cut), or its steps' count and first step.
pub fn preview(spec: &Value) -> String {
    let text = |v: &Value| v.as_str().unwrap_or_default().to_string();
    let line = match spec["kind"].as_str() {
        Some("shell") => text(&spec["command"]),
        Some("agent") => text(&spec["prompt"]),
        Some("python" | "javascript" | "typescript") => text(&spec["code"]),
        _ => match spec["steps"].as_array() {
            Some(steps) => {
                let first = steps.first().map_or(String::new(), |s| {
                    let what = ["command", "code", "path", "action"]
                        .iter()
                        .find_map(|k| s[*k].as_str())
                        .unwrap_or_default();
                    format!(": {} {what}", s["tool"].as_str().unwrap_or("?"))
                });
                let n = steps.len();
                format!("{n} step{}{first}", if n == 1 { "" } else { "s" })
            }
            None => String::new(),
        },
    };
    // One line, no control characters: a list is no place for a
    // job's terminal escapes.
    let first = line.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let clean: String = first
        .trim()
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let mut cut: String = clean.chars().take(PREVIEW_CHARS).collect();
    if clean.chars().count() > PREVIEW_CHARS || line.trim().lines().count() > 1 {
        cut.push('…');
    }
    cut
}

/// The stored form of a request, from which a worker rebuilds it.
pub fn spec_json(req: &JobRequest) -> Value {
    let mut v = match &req.spec {
        JobSpec::Shell { command } => serde_json::json!({"kind": "shell", "command": command}),
        JobSpec::Code { language, code } => {
            serde_json::json!({"kind": language.as_str(), "code": code})
        }
        JobSpec::Steps {
            steps,
            continue_on_error,
            display,
        } => {
            let mut v = serde_json::json!({
                "kind": req.spec.kind(),
                "steps": steps,
                "continue_on_error": continue_on_error,
            });
            if let Some(d) = display {
                v["display"] = format!("{}x{}", d.width, d.height).into();
            }
            v
        }
        JobSpec::Agent {
            prompt,
            model,
            max_steps,
            display,
        } => {
            let mut v = serde_json::json!({
                "kind": "agent", "prompt": prompt, "model": model, "max_steps": max_steps,
            });
            if let Some(d) = display {
                v["display"] = format!("{}x{}", d.width, d.height).into();
            }
            v
        }
    };
    // Steps serialise as {tool: python, language: python, code}; store the
    // shape the parser reads.
    if let Some(steps) = v.get_mut("steps").and_then(Value::as_array_mut) {
        for s in steps {
            if let Some(o) = s.as_object_mut()
                && let Some(Value::String(lang)) = o.remove("language")
            {
                o.insert("tool".into(), Value::String(lang));
            }
        }
    }
    v["timeout_secs"] = req.options.timeout_secs.into();
    v["memory"] = req.options.memory.into();
    v["disk"] = req.options.disk.into();
    v["network"] = req.options.network.to_string().into();
    if let Some(e) = &req.options.egress {
        v["allow"] = e.allow.clone().into();
        v["allow_private"] = e.allow_private.into();
    }
    if let Some(b) = req.options.backend {
        v["backend"] = b.to_string().into();
    }
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn parse(v: Value) -> Result<JobRequest, String> {
        JobRequest::from_json(&v, &Bounds::default())
    }

    #[test]
    fn a_preview_is_one_clean_line() {
        assert_eq!(
            preview(&json!({"kind": "shell", "command": "ls -la"})),
            "ls -la"
        );
        assert_eq!(
            preview(&json!({"kind": "python", "code": "\nimport os\nprint(os.getcwd())\n"})),
            "import os…"
        );
        assert_eq!(
            preview(&json!({"kind": "agent", "prompt": "fix \u{1b}[2Jthe tests"})),
            "fix  [2Jthe tests"
        );
        let long = "x".repeat(500);
        assert_eq!(
            preview(&json!({"kind": "shell", "command": long}))
                .chars()
                .count(),
            PREVIEW_CHARS + 1
        );
        assert_eq!(
            preview(
                &json!({"kind": "steps", "steps": [{"tool": "shell", "command": "make"}, {"tool": "read_file", "path": "out"}]})
            ),
            "2 steps: shell make"
        );
    }

    #[test]
    fn every_kind_parses_and_round_trips_through_its_stored_form() {
        for body in [
            json!({"kind": "shell", "command": "echo hi", "timeout_secs": 5}),
            json!({"kind": "python", "code": "print(1)", "memory": "256M", "network": "loopback"}),
            json!({"kind": "shell", "command": "ls", "disk": "100M"}),
            json!({"kind": "typescript", "code": "let x: number = 1"}),
            json!({"steps": [
                {"tool": "shell", "command": "ls"},
                {"tool": "python", "code": "print(2)"},
                {"kind": "write_file", "path": "a.txt", "content": "x"},
                {"tool": "read_file", "path": "a.txt"},
            ]}),
            json!({"kind": "agent", "prompt": "do it", "max_steps": 5}),
            json!({"kind": "gui", "display": "1024x768", "steps": [
                {"tool": "shell", "command": "xeyes &"},
                {"tool": "computer", "action": "left_click", "coordinate": [10, 20], "text": "shift"},
            ]}),
            json!({"kind": "gui", "steps": [{"tool": "computer", "action": "screenshot"}]}),
            json!({"kind": "agent", "prompt": "use the screen", "display": "800x600"}),
            json!({"kind": "shell", "command": "uname -r", "backend": "microvm"}),
        ] {
            let req = parse(body.clone()).unwrap_or_else(|e| panic!("{body}: {e}"));
            let again = parse(spec_json(&req)).unwrap();
            assert_eq!(again, req, "{body}");
        }
    }

    #[test]
    fn mistakes_are_named() {
        let cases = [
            (json!([1]), "must be a JSON object"),
            (json!({}), "needs `kind`"),
            (json!({"kind": 3}), "`kind` must be a string"),
            (
                json!({"kind": "cobol", "code": "x"}),
                "unknown kind `cobol`",
            ),
            (json!({"kind": "shell"}), "needs the field `command`"),
            (
                json!({"kind": "shell", "command": 5}),
                "`command` must be a string, not a number",
            ),
            (
                json!({"kind": "shell", "comand": "ls"}),
                "unknown field `comand`",
            ),
            (
                json!({"kind": "shell", "command": " "}),
                "`command` is empty",
            ),
            (
                json!({"kind": "agent", "prompt": "x", "display": 1280}),
                "`display` must be a string",
            ),
            (
                json!({"kind": "shell", "command": "ls", "display": "800x600"}),
                "unknown field `display`",
            ),
            (
                json!({"kind": "shell", "command": "ls", "backend": "docker"}),
                "`backend` must be \"native\" or \"microvm\"",
            ),
            (
                json!({"kind": "shell", "command": "ls", "timeout_secs": 0}),
                "`timeout_secs`",
            ),
            (
                json!({"kind": "shell", "command": "ls", "timeout_secs": "9"}),
                "`timeout_secs`",
            ),
            (
                json!({"kind": "shell", "command": "ls", "memory": "lots"}),
                "`memory`",
            ),
            (
                json!({"kind": "shell", "command": "ls", "memory": "64G"}),
                "`memory` must be from",
            ),
            (
                json!({"kind": "shell", "command": "ls", "disk": "64G"}),
                "`disk` (how much the workspace may grow) must be a size from 1M to 8192M",
            ),
            (
                json!({"kind": "shell", "command": "ls", "disk": true}),
                "`disk` must be a size",
            ),
            (
                json!({"kind": "shell", "command": "ls", "network": true}),
                "which jobs never get",
            ),
            (
                json!({"kind": "shell", "command": "ls", "network": "host"}),
                "\"off\", \"loopback\" or \"allow\"",
            ),
            // Jobs reach hosts through the broker only.
            (
                json!({"kind": "shell", "command": "ls", "network": "full"}),
                "never get the host's network",
            ),
            (
                json!({"kind": "shell", "command": "ls", "allow": ["a.example"], "network": "off"}),
                "need `network` \"allow\"",
            ),
            (json!({"steps": []}), "`steps` is empty"),
            (json!({"steps": {}}), "`steps` must be an array"),
            (json!({"steps": [{"tool": "rm"}]}), "unknown tool `rm`"),
            (json!({"steps": [{"command": "ls"}]}), "step 0 needs `tool`"),
            (
                json!({"steps": [{"tool": "shell", "code": "ls"}]}),
                "unknown field `code` in step 0",
            ),
            (
                json!({"kind": "agent", "prompt": "x", "max_steps": 0}),
                "`max_steps`",
            ),
        ];
        for (body, want) in cases {
            let err = parse(body.clone()).unwrap_err();
            assert!(err.contains(want), "{body}: {err:?} lacks {want:?}");
        }
    }
}
