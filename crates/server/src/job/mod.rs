//! What a job is: the request a client posts and the server stores
//! ([`request`]), the same request checked against the server's bounds
//! ([`Job`], what a worker runs), and the states a job moves through.

mod event;
mod image;
mod repo;
mod request;
mod result;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use utoipa::ToSchema;

pub use request::{
    AgentJob, AllowEntry, Backend, BuildJob, CodeJob, ComputerAction, ContextArchive, JobKind,
    JobRequest, Limits, NetworkMode, Screen, ShellJob, Size, Step, StepsJob, Text, read, type_name,
};

pub use event::{JobEvent, PolicyChanged, Problem};
pub use image::{ImageName, MAX_IMAGE_NAME};
pub use repo::RepoUrl;
pub use result::{AgentResult, BuildResult, JobResult, StepResult, StepState};

/// Where a job is in its life. Terminal states never change again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema, strum::EnumIter)]
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
    /// Every state, in the order of a job's life.
    pub fn all() -> impl Iterator<Item = JobState> {
        <JobState as strum::IntoEnumIterator>::iter()
    }

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
        Self::all().find(|st| st.as_str() == s)
    }

    pub fn is_terminal(self) -> bool {
        !matches!(self, JobState::Queued | JobState::Running)
    }
}

/// The language of a code job or step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Language {
    Python,
    Javascript,
    Typescript,
}

impl Language {
    pub fn kind(self) -> JobKind {
        match self {
            Language::Python => JobKind::Python,
            Language::Javascript => JobKind::Javascript,
            Language::Typescript => JobKind::Typescript,
        }
    }
}

/// What to run, checked.
#[derive(Debug, Clone, PartialEq)]
pub enum JobSpec {
    Shell {
        command: Text,
    },
    Code {
        language: Language,
        code: Text,
    },
    Steps {
        steps: Vec<Step>,
        continue_on_error: bool,
        /// A virtual screen (`gui` jobs).
        display: Option<cordon_sandbox::Display>,
    },
    Agent {
        prompt: Text,
        model: Option<String>,
        max_steps: Option<u32>,
        /// A virtual screen, which gives the agent the computer tool.
        display: Option<cordon_sandbox::Display>,
        /// The model may push the job's branch and open a pull request.
        allow_push: bool,
    },
    Build(BuildSpec),
}

/// A build, checked: what the worker builds and keeps.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildSpec {
    pub name: ImageName,
    pub dockerfile: Option<Text>,
    pub context: Option<ContextArchive>,
    pub build_args: std::collections::BTreeMap<String, String>,
    pub target: Option<String>,
    pub no_cache: bool,
}

impl JobSpec {
    /// The virtual screen the job's sandbox gets, if any.
    pub fn display(&self) -> Option<cordon_sandbox::Display> {
        match self {
            JobSpec::Steps { display, .. } | JobSpec::Agent { display, .. } => *display,
            JobSpec::Shell { .. } | JobSpec::Code { .. } | JobSpec::Build(_) => None,
        }
    }

    pub fn kind(&self) -> JobKind {
        match self {
            JobSpec::Shell { .. } => JobKind::Shell,
            JobSpec::Code { language, .. } => language.kind(),
            JobSpec::Steps {
                display: Some(_), ..
            } => JobKind::Gui,
            JobSpec::Steps { .. } => JobKind::Steps,
            JobSpec::Agent { .. } => JobKind::Agent,
            JobSpec::Build(_) => JobKind::Build,
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
    /// Never the host's network: `allow` goes through the broker, to
    /// [`Self::egress`].
    pub network: NetworkMode,
    /// With `allow`, what the job asked for: entries as written (presets
    /// among them), or none for all the tenant's ceiling allows. Checked
    /// against the ceiling and expanded when the job is submitted, so a
    /// stored job holds plain rules.
    pub egress: Option<cordon_net::PolicySpec>,
    /// The isolation backend; `None` is the server's default.
    pub backend: Option<cordon_sandbox::BackendKind>,
    /// The repository cloned into the workspace before the job runs.
    pub repo: Option<RepoUrl>,
    /// The image its root is made from (the server's default filled in
    /// when the job is submitted); `None`: the host's root.
    pub image: Option<ImageName>,
}

impl RunOptions {
    /// As a request states them, every default filled in.
    fn limits(&self) -> Limits {
        Limits {
            timeout_secs: Some(self.timeout_secs),
            memory: Some(Size(self.memory)),
            disk: Some(Size(self.disk)),
            network: Some(self.network),
            allow: self
                .egress
                .as_ref()
                .map(|e| e.allow.iter().cloned().map(AllowEntry::checked).collect()),
            allow_private: self.egress.as_ref().map(|e| e.allow_private),
            backend: self.backend.map(Backend::from),
            repo: self.repo.clone(),
            image: self.image.clone(),
        }
    }
}

/// A job request checked against the server's bounds: what a worker runs.
#[derive(Debug, Clone, PartialEq)]
pub struct Job {
    pub spec: JobSpec,
    pub options: RunOptions,
}

impl Job {
    /// The request that stores this job: the same job, every default
    /// filled in, so a change of the server's defaults does not change it.
    pub fn request(&self) -> JobRequest {
        let limits = self.options.limits();
        let screen = |d: &Option<cordon_sandbox::Display>| d.map(Screen);
        match &self.spec {
            JobSpec::Shell { command } => {
                JobRequest::Shell(ShellJob::new(command.clone()).with_limits(limits))
            }
            JobSpec::Code { language, code } => {
                let j = CodeJob::new(code.clone()).with_limits(limits);
                match language {
                    Language::Python => JobRequest::Python(j),
                    Language::Javascript => JobRequest::Javascript(j),
                    Language::Typescript => JobRequest::Typescript(j),
                }
            }
            JobSpec::Steps {
                steps,
                continue_on_error,
                display,
            } => {
                let j = StepsJob::new(steps.clone(), Some(*continue_on_error), screen(display))
                    .with_limits(limits);
                if display.is_some() {
                    JobRequest::Gui(j)
                } else {
                    JobRequest::Steps(j)
                }
            }
            JobSpec::Agent {
                prompt,
                model,
                max_steps,
                display,
                allow_push,
            } => JobRequest::Agent(
                AgentJob::new(
                    prompt.clone(),
                    model.clone(),
                    *max_steps,
                    screen(display),
                    allow_push.then_some(true),
                )
                .with_limits(limits),
            ),
            JobSpec::Build(b) => JobRequest::Build(
                BuildJob::new(
                    b.name.clone(),
                    b.dockerfile.clone(),
                    b.context.clone(),
                    (!b.build_args.is_empty()).then(|| b.build_args.clone()),
                    b.target.clone(),
                    b.no_cache.then_some(true),
                )
                .with_limits(limits),
            ),
        }
    }
}

/// The server's bounds on what a job may ask for.
#[derive(Debug, Clone)]
pub struct Bounds {
    pub default_timeout_secs: u64,
    pub max_timeout_secs: u64,
    /// What a job's or session's sandbox gets unless it asks for other:
    /// its memory, processes, disk budget (always one) and CPUs.
    pub defaults: cordon_sandbox::Limits,
    pub max_memory: u64,
    /// The most disk budget a job may ask for.
    pub max_disk: u64,
}

impl Bounds {
    /// A job's disk budget unless it asks for another.
    pub fn default_disk(&self) -> u64 {
        self.defaults.disk.unwrap_or(DEFAULT_DISK)
    }
}

impl Default for Bounds {
    fn default() -> Self {
        Bounds {
            default_timeout_secs: 300,
            max_timeout_secs: 3600,
            defaults: cordon_sandbox::Limits {
                disk: Some(DEFAULT_DISK),
                ..cordon_sandbox::Limits::default()
            },
            max_memory: 4 * 1024 * MIB,
            max_disk: 8 * 1024 * MIB,
        }
    }
}

/// A job's disk budget when neither it nor the server names one.
pub const DEFAULT_DISK: u64 = 1024 * MIB;
const MIB: u64 = 1024 * 1024;

/// The screen of a `gui` job that names none: WXGA, a laptop's.
pub const DEFAULT_DISPLAY: cordon_sandbox::Display = cordon_sandbox::Display {
    width: 1280,
    height: 800,
};

/// Steps in a job, at most.
const MAX_STEPS: usize = 100;

/// Entries in a job's `allow`, at most (a preset counts one).
const MAX_ALLOW: usize = 256;

impl JobRequest {
    /// Checks the request against the server's bounds: the one place a
    /// job's values are judged.
    pub fn check(&self, bounds: &Bounds) -> Result<Job, String> {
        let options = self.limits().check(bounds)?;
        let spec = match self.clone() {
            JobRequest::Shell(j) => JobSpec::Shell { command: j.command },
            JobRequest::Python(j) => JobSpec::Code {
                language: Language::Python,
                code: j.code,
            },
            JobRequest::Javascript(j) => JobSpec::Code {
                language: Language::Javascript,
                code: j.code,
            },
            JobRequest::Typescript(j) => JobSpec::Code {
                language: Language::Typescript,
                code: j.code,
            },
            JobRequest::Steps(j) | JobRequest::Gui(j) => {
                if j.steps.is_empty() {
                    return Err("`steps` is empty".into());
                }
                if j.steps.len() > MAX_STEPS {
                    return Err(format!(
                        "`steps` has {} steps; at most {MAX_STEPS}",
                        j.steps.len()
                    ));
                }
                let default = (self.kind() == JobKind::Gui).then_some(DEFAULT_DISPLAY);
                let display = j.display.map(|s| s.0).or(default);
                if display.is_none() && j.steps.iter().any(|s| matches!(s, Step::Computer(_))) {
                    return Err(
                        "computer steps need a display: use kind `gui`, or set `display`".into(),
                    );
                }
                JobSpec::Steps {
                    steps: j.steps,
                    continue_on_error: j.continue_on_error.unwrap_or(false),
                    display,
                }
            }
            JobRequest::Agent(j) => {
                if let Some(n) = j.max_steps
                    && !(1..=200).contains(&n)
                {
                    return Err("`max_steps` must be a whole number from 1 to 200".into());
                }
                let allow_push = j.allow_push.unwrap_or(false);
                if allow_push && j.repo.is_none() {
                    return Err(
                        "`allow_push` is for a job with `repo`: there is nothing to push".into(),
                    );
                }
                JobSpec::Agent {
                    prompt: j.prompt,
                    model: j.model.filter(|m| !m.trim().is_empty()),
                    max_steps: j.max_steps,
                    display: j.display.map(|s| s.0),
                    allow_push,
                }
            }
            JobRequest::Build(j) => {
                if j.image.is_some() {
                    return Err(
                        "a build has no `image`: its Dockerfile's FROM names the base".into(),
                    );
                }
                if j.context.is_some() && j.repo.is_some() {
                    return Err("give a build `context` or `repo`, not both".into());
                }
                if j.backend == Some(Backend::Microvm) {
                    return Err(
                        "a build's steps run in native sandboxes: leave out `backend`".into(),
                    );
                }
                if let Some(args) = &j.build_args
                    && let Some(bad) = args.keys().find(|k| {
                        k.is_empty() || !k.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    })
                {
                    return Err(format!(
                        "`build_args`: {} is not an argument's name (letters, digits, _)",
                        cordon_tools::printable(bad)
                    ));
                }
                JobSpec::Build(BuildSpec {
                    name: j.name,
                    dockerfile: j.dockerfile,
                    context: j.context,
                    build_args: j.build_args.unwrap_or_default(),
                    target: j.target.filter(|t| !t.trim().is_empty()),
                    no_cache: j.no_cache.unwrap_or(false),
                })
            }
        };
        Ok(Job { spec, options })
    }

    /// What the job does, in one line for a list: its command, code or
    /// prompt (the first line, cut), or its steps' count and first step.
    pub fn preview(&self) -> String {
        let line = match self {
            JobRequest::Shell(j) => j.command.to_string(),
            JobRequest::Python(j) | JobRequest::Javascript(j) | JobRequest::Typescript(j) => {
                j.code.to_string()
            }
            JobRequest::Agent(j) => j.prompt.to_string(),
            JobRequest::Build(j) => format!("build {}", j.name),
            JobRequest::Steps(j) | JobRequest::Gui(j) => {
                let first = j.steps.first().map_or(String::new(), |s| {
                    let what = match s {
                        Step::Shell(s) => &*s.command,
                        Step::Python(s) | Step::Javascript(s) | Step::Typescript(s) => &*s.code,
                        Step::WriteFile(s) => &*s.path,
                        Step::ReadFile(s) => &*s.path,
                        Step::Computer(a) => {
                            a.0.get("action").and_then(Value::as_str).unwrap_or("")
                        }
                    };
                    format!(": {} {what}", s.tool())
                });
                let n = j.steps.len();
                format!("{n} step{}{first}", if n == 1 { "" } else { "s" })
            }
        };
        one_line(&line)
    }
}

/// Characters of a job's preview at most.
const PREVIEW_CHARS: usize = 120;

/// The first non-blank line of `text`, cut, with no control characters:
/// a list is no place for a job's terminal escapes.
fn one_line(text: &str) -> String {
    let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or("");
    let clean: String = first
        .trim()
        .chars()
        .map(|c| if cordon_tools::unprintable(c) { ' ' } else { c })
        .collect();
    let mut cut: String = clean.chars().take(PREVIEW_CHARS).collect();
    if clean.chars().count() > PREVIEW_CHARS || text.trim().lines().count() > 1 {
        cut.push('…');
    }
    cut
}

impl Limits {
    /// Checks the limits against the server's bounds, filling in its
    /// defaults.
    pub fn check(&self, bounds: &Bounds) -> Result<RunOptions, String> {
        let timeout_secs = self.timeout_secs.unwrap_or(bounds.default_timeout_secs);
        if !(1..=bounds.max_timeout_secs).contains(&timeout_secs) {
            return Err(format!(
                "`timeout_secs` must be a whole number of seconds from 1 to {}",
                bounds.max_timeout_secs
            ));
        }
        let memory = self.memory.map_or(bounds.defaults.memory, |s| s.0);
        if !(cordon_sandbox::Limits::MIN_MEMORY..=bounds.max_memory).contains(&memory) {
            return Err(format!(
                "`memory` must be from 16M to {}M",
                bounds.max_memory / MIB
            ));
        }
        let disk = self.disk.map_or(bounds.default_disk(), |s| s.0);
        if !(MIB..=bounds.max_disk).contains(&disk) {
            return Err(format!(
                "`disk` (how much the workspace may grow) must be a size from 1M to {}M",
                bounds.max_disk / MIB
            ));
        }
        let (network, egress) =
            network_choice(self.network, self.allow.as_deref(), self.allow_private)?;
        Ok(RunOptions {
            timeout_secs,
            memory,
            disk,
            network,
            egress,
            backend: self.backend.map(Into::into),
            repo: self.repo.clone(),
            image: self.image.clone(),
        })
    }
}

/// `network`, `allow` and `allow_private`, as jobs and sessions take them:
/// a list of hosts implies `allow`; `allow` alone means all the tenant's
/// ceiling allows.
pub fn network_choice(
    network: Option<NetworkMode>,
    allow: Option<&[AllowEntry]>,
    allow_private: Option<bool>,
) -> Result<(NetworkMode, Option<cordon_net::PolicySpec>), String> {
    if let Some(a) = allow
        && a.len() > MAX_ALLOW
    {
        return Err(format!(
            "`allow` has {} entries; at most {MAX_ALLOW}",
            a.len()
        ));
    }
    let mode = network.unwrap_or(if allow.is_some() {
        NetworkMode::Allow
    } else {
        NetworkMode::Off
    });
    if mode != NetworkMode::Allow && (allow.is_some() || allow_private.is_some()) {
        return Err(format!(
            "`allow` and `allow_private` need `network` \"allow\", not {:?}",
            cordon_sandbox::Network::from(mode).to_string()
        ));
    }
    let egress = (mode == NetworkMode::Allow).then(|| cordon_net::PolicySpec {
        allow: allow
            .unwrap_or_default()
            .iter()
            .map(|e| String::from(e.clone()))
            .collect(),
        allow_private: allow_private.unwrap_or(false),
    });
    Ok((mode, egress))
}

#[cfg(test)]
mod tests;
