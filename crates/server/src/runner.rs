//! Running one job: a fresh sandbox over the job's own workspace, its
//! output streamed into the job's events as it comes (in batches, so a
//! chatty program does not write the database once per line), and one
//! final state.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_agent::events::{BoxFuture, EventSink};
use cordon_agent::{AgentBuilder, AgentError, AgentEvent, Cancel, SessionLog};
use cordon_sandbox::{ExecEvent, ExecRequest, ExecResult, Sandbox, SandboxConfig};
use cordon_tools::{Workspace, WsPath};
use serde_json::Value;
use tokio::sync::mpsc;

use crate::job::{
    AgentResult, Job, JobEvent, JobResult, JobSpec, JobState, Language, Problem, RunOptions, Step,
    StepResult, Stream,
};
use crate::state::Shared;
use crate::store::{JobRow, NewEvent, Outcome, OutputDelta};

/// Output is flushed to the database at least this often while it flows.
const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// ... or once this much is pending.
const FLUSH_BYTES: usize = 32 * 1024;

/// Where a job's events and output go: the database first, then live
/// subscribers.
struct Sink {
    shared: Arc<Shared>,
    id: String,
    cap: usize,
    pending: OutputDelta,
    pending_events: Vec<NewEvent>,
    stored: [usize; 2],
    truncated: [bool; 2],
    /// Bytes of a UTF-8 character split across chunks, per stream.
    partial: [Vec<u8>; 2],
    since: Option<Instant>,
    /// The running step's own output, when a `steps` job runs one.
    step: Option<StepOutput>,
}

/// Characters of each stream kept in a step's own result; the job's
/// stdout and stderr keep more, across steps.
const STEP_OUTPUT_CAP: usize = 64 * 1024;

/// One step's stdout and stderr, capped.
#[derive(Default)]
struct StepOutput {
    text: [String; 2],
    truncated: [bool; 2],
}

impl Sink {
    fn new(shared: Arc<Shared>, id: &str) -> Sink {
        let cap = shared.config.output_cap;
        Sink {
            shared,
            id: id.to_string(),
            cap,
            pending: OutputDelta::default(),
            pending_events: Vec::new(),
            stored: [0, 0],
            truncated: [false, false],
            partial: [Vec::new(), Vec::new()],
            since: None,
            step: None,
        }
    }

    /// From now on, output is also the running step's own.
    fn begin_step(&mut self) {
        self.step = Some(StepOutput::default());
    }

    /// The step's own output, as its result shows it.
    fn end_step(&mut self) -> StepOutput {
        self.step.take().unwrap_or_default()
    }

    async fn event(&mut self, event: JobEvent) {
        self.push(event.into()).await;
    }

    async fn push(&mut self, event: NewEvent) {
        self.pending_events.push(event);
        self.flush().await;
    }

    /// Adds output of stream 0 (stdout) or 1 (stderr), up to the cap.
    async fn output(&mut self, stream: usize, bytes: &[u8]) {
        if self.truncated[stream] {
            return;
        }
        let mut buf = std::mem::take(&mut self.partial[stream]);
        buf.extend_from_slice(bytes);
        let (text, rest) = split_utf8(&buf);
        self.partial[stream] = rest.to_vec();
        let room = self.cap.saturating_sub(self.stored[stream]);
        let mut text = text;
        if text.len() > room {
            let mut end = room;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text = text[..end].to_string();
            self.truncated[stream] = true;
            self.partial[stream].clear();
        }
        self.stored[stream] += text.len();
        if let Some(step) = self.step.as_mut() {
            let room = STEP_OUTPUT_CAP.saturating_sub(step.text[stream].len());
            let mut end = text.len().min(room);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            step.text[stream].push_str(&text[..end]);
            step.truncated[stream] |= end < text.len() || self.truncated[stream];
        }
        let which = if stream == 0 {
            Stream::Stdout
        } else {
            Stream::Stderr
        };
        if !text.is_empty() {
            let event = match which {
                Stream::Stdout => JobEvent::Stdout { data: text.clone() },
                Stream::Stderr => JobEvent::Stderr { data: text.clone() },
            };
            self.pending_events.push(event.into());
            if stream == 0 {
                self.pending.stdout.push_str(&text);
            } else {
                self.pending.stderr.push_str(&text);
            }
        }
        if self.truncated[stream] {
            self.pending_events.push(
                JobEvent::OutputTruncated {
                    stream: which,
                    cap_bytes: self.cap,
                }
                .into(),
            );
        }
        self.since.get_or_insert_with(Instant::now);
        if self.pending.stdout.len() + self.pending.stderr.len() >= FLUSH_BYTES
            || self.truncated[stream]
        {
            self.flush().await;
        }
    }

    /// When pending output must be flushed by.
    fn deadline(&self) -> Option<tokio::time::Instant> {
        self.since
            .map(|t| tokio::time::Instant::from_std(t + FLUSH_EVERY))
    }

    async fn flush(&mut self) {
        if self.pending_events.is_empty() {
            return;
        }
        self.pending.stdout_truncated = self.truncated[0];
        self.pending.stderr_truncated = self.truncated[1];
        let events = std::mem::take(&mut self.pending_events);
        let output = std::mem::take(&mut self.pending);
        self.since = None;
        match self
            .shared
            .store
            .append(&self.id, &events, Some(&output))
            .await
        {
            Ok(stored) => self.shared.hub.publish(&self.id, &stored),
            Err(e) => tracing::error!(job = %self.id, "cannot record output: {e}"),
        }
    }
}

/// The longest valid UTF-8 prefix and the bytes after it, when those are
/// the start of a character cut off by the chunk's end; invalid bytes
/// become U+FFFD.
fn split_utf8(buf: &[u8]) -> (String, &[u8]) {
    match std::str::from_utf8(buf) {
        Ok(s) => (s.to_string(), &[]),
        Err(e) if e.error_len().is_none() => {
            let (ok, rest) = buf.split_at(e.valid_up_to());
            (String::from_utf8_lossy(ok).into_owned(), rest)
        }
        Err(_) => (String::from_utf8_lossy(buf).into_owned(), &[]),
    }
}

/// How one exec ended, from the job's point of view.
enum Ran {
    Exited(ExecResult),
    Cancelled,
    Failed(String),
}

async fn exec(sandbox: &Sandbox, req: ExecRequest, sink: &mut Sink, cancel: &Cancel) -> Ran {
    let mut execution = match sandbox.exec_stream(req).await {
        Ok(e) => e,
        Err(e) => return Ran::Failed(format!("cannot start the command: {e}")),
    };
    loop {
        let deadline = sink.deadline();
        let event = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Ran::Cancelled,
            _ = async { tokio::time::sleep_until(deadline.unwrap()).await }, if deadline.is_some() => {
                sink.flush().await;
                continue;
            }
            e = execution.next() => e,
        };
        match event {
            Some(Ok(ExecEvent::Stdout(d))) => sink.output(0, &d).await,
            Some(Ok(ExecEvent::Stderr(d))) => sink.output(1, &d).await,
            Some(Ok(ExecEvent::Exit(r))) => {
                sink.flush().await;
                return Ran::Exited(r);
            }
            Some(Err(e)) => return Ran::Failed(format!("the sandbox failed: {e}")),
            None => return Ran::Failed("the sandbox ended without a result".into()),
        }
    }
}

fn tools_language(l: Language) -> cordon_tools::run_code::Language {
    match l {
        Language::Python => cordon_tools::run_code::Language::Python,
        Language::Javascript => cordon_tools::run_code::Language::Javascript,
        Language::Typescript => cordon_tools::run_code::Language::Typescript,
    }
}

fn code_request(language: Language, code: &str) -> Result<ExecRequest, String> {
    cordon_tools::run_code::program_request(tools_language(language), code.to_string())
        .map_err(|e| format!("the TypeScript could not be transpiled: {e}"))
}

/// Job directory layout: `<data>/jobs/<id>/workspace` (mounted at
/// /workspace) and, for agent jobs, `<data>/jobs/<id>/session.jsonl`.
pub fn job_dir(shared: &Shared, id: &str) -> PathBuf {
    shared.config.data_dir.join("jobs").join(id)
}

pub fn workspace_dir(shared: &Shared, id: &str) -> PathBuf {
    job_dir(shared, id).join("workspace")
}

/// Runs a claimed job to its end and records the outcome.
pub async fn run(shared: Arc<Shared>, job: JobRow, cancel: Cancel) {
    let id = job.id.clone();
    shared.hub.open(&id);
    let mut sink = Sink::new(shared.clone(), &id);
    sink.event(JobEvent::State {
        state: JobState::Running,
    })
    .await;
    let checked = job
        .request
        .clone()
        .and_then(|r| r.check(&shared.config.bounds));
    let outcome = match checked {
        Ok(req) => run_request(&shared, &id, &job.tenant, req, &mut sink, &cancel).await,
        Err(e) => Outcome {
            state: JobState::Failed,
            exit_code: None,
            error: Some(format!("the stored job is no longer valid here: {e}")),
            result: None,
        },
    };
    sink.flush().await;
    let finished = NewEvent::from(JobEvent::Finished {
        state: outcome.state,
        exit_code: outcome.exit_code,
        error: outcome.error.clone(),
    });
    match shared
        .store
        .finish(&id, &[JobState::Running], &outcome, &finished)
        .await
    {
        Ok(Some(e)) => shared.hub.publish(&id, &[e]),
        Ok(None) => {}
        Err(e) => tracing::error!(job = %id, "cannot record the outcome: {e}"),
    }
    shared.hub.close(&id);
}

async fn run_request(
    shared: &Arc<Shared>,
    id: &str,
    tenant: &str,
    req: Job,
    sink: &mut Sink,
    cancel: &Cancel,
) -> Outcome {
    let failed = |error: String| Outcome {
        state: JobState::Failed,
        exit_code: None,
        error: Some(error),
        result: None,
    };
    let ws = workspace_dir(shared, id);
    if let Err(e) = std::fs::create_dir_all(&ws) {
        return failed(format!("cannot create the workspace: {e}"));
    }
    // The ceiling may have been lowered since the job was submitted.
    if let Some(spec) = &req.options.egress {
        let ceiling = shared.ceilings.of(tenant);
        let beyond = crate::network::stored_policy(spec)
            .map(|p| p.beyond(ceiling))
            .unwrap_or_else(|| vec!["an unreadable rule".into()]);
        if !beyond.is_empty() {
            return failed(format!(
                "the job's network goes beyond what its tenant may reach now: {}",
                beyond.join(", ")
            ));
        }
    }
    let mut config = sandbox_config(shared, &ws, &req.options);
    config.display = req.spec.display();
    let sandbox = match Sandbox::create(config).await {
        Ok(s) => s,
        Err(e) => return failed(format!("cannot create the sandbox: {e}")),
    };
    // The API may change its policy while it runs; an agent reports its
    // own refusals, other jobs' are forwarded as events.
    let _policy = sandbox.network().map(|net| {
        if !matches!(req.spec, JobSpec::Agent { .. }) {
            tokio::spawn(forward_refusals(
                shared.clone(),
                id.to_string(),
                net.refusals(MAX_REFUSALS),
            ));
        }
        shared
            .policies
            .list(crate::network::job_key(id), net.policy.clone())
    });
    // Viewable live while the job runs; unlisted before the sandbox closes.
    let listed = sandbox
        .display()
        .map(|_| shared.desktops.list(format!("job/{id}"), &sandbox));
    let deadline = Instant::now() + Duration::from_secs(req.options.timeout_secs);
    let outcome = match req.spec {
        JobSpec::Shell { command } => {
            let r = ExecRequest::argv(["bash", "-c", &*command]);
            single(
                &sandbox,
                r,
                deadline,
                sink,
                cancel,
                shared.config.output_cap,
            )
            .await
        }
        JobSpec::Code { language, code } => match code_request(language, &code) {
            Ok(r) => {
                single(
                    &sandbox,
                    r,
                    deadline,
                    sink,
                    cancel,
                    shared.config.output_cap,
                )
                .await
            }
            Err(e) => {
                sink.output(1, format!("{e}\n").as_bytes()).await;
                Outcome {
                    state: JobState::Failed,
                    exit_code: Some(1),
                    error: Some(e),
                    result: None,
                }
            }
        },
        JobSpec::Steps {
            steps,
            continue_on_error,
            ..
        } => {
            run_steps(
                &sandbox,
                &ws,
                &steps,
                continue_on_error,
                deadline,
                sink,
                cancel,
                shared.config.output_cap,
            )
            .await
        }
        JobSpec::Agent {
            prompt,
            model,
            max_steps,
            ..
        } => {
            let session = job_dir(shared, id).join("session.jsonl");
            let agent = AgentRun {
                prompt: prompt.into(),
                model,
                max_steps,
                session,
                network: req.options.network.into(),
                allow: req
                    .options
                    .egress
                    .as_ref()
                    .map(|e| e.allow.clone())
                    .unwrap_or_default(),
            };
            run_agent(shared, &sandbox, &ws, agent, deadline, sink, cancel).await
        }
    };
    drop(listed);
    // Closing ends every process the job left behind.
    sandbox.close().await;
    outcome
}

fn sandbox_config(shared: &Shared, ws: &std::path::Path, options: &RunOptions) -> SandboxConfig {
    let mut c = shared.config.sandbox(ws);
    c.memory = Some(options.memory);
    c.disk = Some(options.disk);
    c.network = options.network.into();
    c.egress = options.egress.clone().map(cordon_sandbox::Egress::new);
    if let Some(b) = options.backend {
        c.backend = b;
    }
    c
}

/// Refusals at most recorded per job: a retry loop must not fill the
/// events table.
const MAX_REFUSALS: usize = 100;

/// The broker's refusals while the job runs, each host and port once, as
/// `network_refused` events.
async fn forward_refusals(shared: Arc<Shared>, id: String, mut refusals: cordon_sandbox::Refusals) {
    while let Some(e) = refusals.next().await {
        let event = NewEvent::from(JobEvent::NetworkRefused {
            host: e.host,
            port: e.port,
            decision: e.decision,
            reason: e.reason,
            message: e.message,
        });
        match shared.store.append(&id, &[event], None).await {
            Ok(stored) => shared.hub.publish(&id, &stored),
            Err(err) => tracing::warn!(job = %id, "cannot record a refusal: {err}"),
        }
    }
}

fn outcome_of(r: &ExecResult) -> Outcome {
    let code = i64::from(r.status.code());
    let (state, error) = if r.disk_exceeded {
        (JobState::Failed, Some(DISK_STOPPED.into()))
    } else if r.timed_out {
        (
            JobState::TimedOut,
            Some("the job ran past its timeout".into()),
        )
    } else if r.oom_killed {
        (
            JobState::Failed,
            Some("the job ran out of memory (raise `memory`)".into()),
        )
    } else if r.status.success() {
        (JobState::Succeeded, None)
    } else {
        (JobState::Failed, Some(format!("exited with status {code}")))
    };
    Outcome {
        state,
        exit_code: Some(i64::from(r.exit_code())),
        error,
        result: None,
    }
}

fn cancelled() -> Outcome {
    Outcome {
        state: JobState::Cancelled,
        exit_code: None,
        error: Some("cancelled".into()),
        result: None,
    }
}

async fn single(
    sandbox: &Sandbox,
    req: ExecRequest,
    deadline: Instant,
    sink: &mut Sink,
    cancel: &Cancel,
    cap: usize,
) -> Outcome {
    // One byte past the cap, so the sink sees the overflow and flags it.
    let req = req
        .timeout(deadline.saturating_duration_since(Instant::now()))
        .output_limit(cap as u64 + 1);
    match exec(sandbox, req, sink, cancel).await {
        Ran::Exited(r) => outcome_of(&r),
        Ran::Cancelled => cancelled(),
        // The budget's stop can end the stream before its result does.
        Ran::Failed(_) if sandbox.disk_stopped().is_some() => disk_outcome(),
        Ran::Failed(e) => Outcome {
            state: JobState::Failed,
            exit_code: None,
            error: Some(e),
            result: None,
        },
    }
}

fn disk_outcome() -> Outcome {
    Outcome {
        state: JobState::Failed,
        exit_code: Some(i64::from(cordon_sandbox::exit_code::DISK)),
        error: Some(DISK_STOPPED.into()),
        result: None,
    }
}

const DISK_STOPPED: &str =
    "the job's workspace grew past its disk budget and the sandbox was stopped (raise `disk`)";

#[allow(clippy::too_many_arguments)]
async fn run_steps(
    sandbox: &Sandbox,
    ws: &std::path::Path,
    steps: &[Step],
    continue_on_error: bool,
    deadline: Instant,
    sink: &mut Sink,
    cancel: &Cancel,
    cap: usize,
) -> Outcome {
    let mut results = Vec::new();
    let mut last = Outcome {
        state: JobState::Succeeded,
        exit_code: Some(0),
        error: None,
        result: None,
    };
    let mut first_failure: Option<Outcome> = None;
    for (index, step) in steps.iter().enumerate() {
        if cancel.is_cancelled() {
            return cancelled();
        }
        let started = Instant::now();
        let mut screenshot = None;
        sink.event(JobEvent::StepStarted {
            index,
            tool: step.tool().to_string(),
        })
        .await;
        sink.begin_step();
        let outcome = match step {
            Step::Shell(s) => {
                let r = ExecRequest::argv(["bash", "-c", &*s.command]);
                single(sandbox, r, deadline, sink, cancel, cap).await
            }
            Step::Python(s) | Step::Javascript(s) | Step::Typescript(s) => {
                let language = match step {
                    Step::Javascript(_) => Language::Javascript,
                    Step::Typescript(_) => Language::Typescript,
                    _ => Language::Python,
                };
                match code_request(language, &s.code) {
                    Ok(r) => single(sandbox, r, deadline, sink, cancel, cap).await,
                    Err(e) => file_failure(sink, e).await,
                }
            }
            Step::WriteFile(s) => {
                let path = &*s.path;
                match file_op(ws, path, |w, p| {
                    w.write(p, s.content.as_bytes()).map(|_| ())
                }) {
                    Ok(()) => succeeded(),
                    Err(e) => file_failure(sink, format!("write_file {path}: {e}")).await,
                }
            }
            Step::ReadFile(s) => {
                let path = &*s.path;
                let read = file_op(ws, path, |w, p| {
                    let (mut f, _) = w.open_read(p)?;
                    let mut buf = Vec::new();
                    use std::io::Read;
                    f.by_ref()
                        .take(cap as u64)
                        .read_to_end(&mut buf)
                        .map_err(|e| cordon_tools::WorkspaceError::Io {
                            path: p.display(),
                            source: e,
                        })?;
                    Ok(buf)
                });
                match read {
                    Ok(bytes) => {
                        sink.output(0, &bytes).await;
                        succeeded()
                    }
                    Err(e) => file_failure(sink, format!("read_file {path}: {e}")).await,
                }
            }
            Step::Computer(action) => {
                let (outcome, shot) = computer_step(sandbox, ws, index, &action.0, sink).await;
                screenshot = shot;
                outcome
            }
        };
        let output = sink.end_step();
        let [stdout, stderr] = output.text;
        let result = StepResult {
            index,
            tool: step.tool().to_string(),
            state: outcome.state.into(),
            exit_code: outcome.exit_code,
            error: outcome.error.clone(),
            duration_ms: Some(started.elapsed().as_millis() as u64),
            stdout: Some(stdout),
            stderr: Some(stderr),
            stdout_truncated: Some(output.truncated[0]),
            stderr_truncated: Some(output.truncated[1]),
            screenshot,
        };
        sink.event(JobEvent::StepFinished(result.clone())).await;
        results.push(result);
        let stop = match outcome.state {
            JobState::Succeeded => false,
            JobState::Cancelled | JobState::TimedOut => true,
            _ => !continue_on_error,
        };
        if outcome.state != JobState::Succeeded && first_failure.is_none() {
            first_failure = Some(outcome.clone());
        }
        last = outcome;
        if stop {
            break;
        }
    }
    // The steps a failure (or the end of time) kept from running.
    for (index, step) in steps.iter().enumerate().skip(results.len()) {
        results.push(StepResult::skipped(index, step.tool()));
    }
    let mut out = first_failure.unwrap_or(last);
    out.result = Some(JobResult::Steps { steps: results });
    out
}

/// Runs one computer action; its text goes to stdout and its screenshot,
/// if any, to `screenshots/step-NN.png` in the workspace (named in the
/// result).
async fn computer_step(
    sandbox: &Sandbox,
    ws: &std::path::Path,
    index: usize,
    args: &serde_json::Map<String, Value>,
    sink: &mut Sink,
) -> (Outcome, Option<String>) {
    use base64::Engine;
    use cordon_tools::Tool;
    let ctx = cordon_tools::ToolContext::new(sandbox.clone(), ws);
    let out = cordon_tools::computer::Computer
        .call(&ctx, Value::Object(args.clone()))
        .await;
    if out.is_error {
        return (file_failure(sink, out.text).await, None);
    }
    sink.output(0, format!("{}\n", out.text).as_bytes()).await;
    let Some(image) = out.images.first() else {
        return (succeeded(), None);
    };
    let path = format!("screenshots/step-{index:02}.png");
    let saved = base64::engine::general_purpose::STANDARD
        .decode(&image.data)
        .map_err(|e| e.to_string())
        .and_then(|png| file_op(ws, &path, |w, p| w.write(p, &png).map(|_| ())));
    match saved {
        Ok(()) => (succeeded(), Some(path)),
        Err(e) => (
            file_failure(sink, format!("saving {path}: {e}")).await,
            None,
        ),
    }
}

fn succeeded() -> Outcome {
    Outcome {
        state: JobState::Succeeded,
        exit_code: Some(0),
        error: None,
        result: None,
    }
}

async fn file_failure(sink: &mut Sink, message: String) -> Outcome {
    sink.output(1, format!("{message}\n").as_bytes()).await;
    Outcome {
        state: JobState::Failed,
        exit_code: Some(1),
        error: Some(message),
        result: None,
    }
}

fn file_op<T>(
    ws: &std::path::Path,
    path: &str,
    f: impl FnOnce(&Workspace, &WsPath) -> Result<T, cordon_tools::WorkspaceError>,
) -> Result<T, String> {
    let w = Workspace::open(ws).map_err(|e| e.to_string())?;
    let p = WsPath::parse(path).map_err(|e| e.to_string())?;
    f(&w, &p).map_err(|e| e.to_string())
}

struct AgentRun {
    prompt: String,
    model: Option<String>,
    max_steps: Option<u32>,
    session: PathBuf,
    /// What the model is told of its network.
    network: cordon_sandbox::Network,
    allow: Vec<String>,
}

async fn run_agent(
    shared: &Arc<Shared>,
    sandbox: &Sandbox,
    ws: &std::path::Path,
    run: AgentRun,
    deadline: Instant,
    sink: &mut Sink,
    cancel: &Cancel,
) -> Outcome {
    let Some(model_config) = shared.config.agent.as_ref() else {
        return Outcome {
            state: JobState::Failed,
            exit_code: None,
            error: Some("this server has no model configured".into()),
            result: None,
        };
    };
    let mut config = model_config.agent.clone();
    config.system = cordon_agent::prompt::system(run.network, &run.allow);
    if let Some(m) = run.model {
        config.model = m;
    }
    if let Some(n) = run.max_steps {
        config.max_steps = n;
    }
    // The operator's MCP servers, started for this job alone; one that
    // fails is said in the job's events and the job goes on without it.
    let failures = Arc::new(std::sync::Mutex::new(Vec::new()));
    let noted = failures.clone();
    let mcp = cordon_mcp::McpClients::start(
        &shared.config.mcp_servers,
        Arc::new(move |m: String| noted.lock().unwrap_or_else(|p| p.into_inner()).push(m)),
    )
    .await;
    let failed = std::mem::take(&mut *failures.lock().unwrap_or_else(|p| p.into_inner()));
    for message in failed {
        sink.event(JobEvent::Error(Problem { message })).await;
    }
    let mut builder = AgentBuilder::new(&model_config.provider, config).tools(&mcp.tools);
    match SessionLog::<Value>::create(&run.session) {
        Ok(log) => builder = builder.log(log),
        Err(e) => tracing::warn!("agent job session log: {e}"),
    }
    let mut agent = match builder.build(sandbox, ws) {
        Ok(a) => a,
        Err(e) => {
            mcp.shutdown().await;
            return Outcome {
                state: JobState::Failed,
                exit_code: None,
                error: Some(e.to_string()),
                result: None,
            };
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let turn_cancel = Cancel::new();
    let mut timed_out = false;
    let mut events = JobEvents {
        live_room: shared.config.output_cap,
        sink,
    };
    let result = {
        let send = agent.send(&run.prompt, &tx, &turn_cancel);
        tokio::pin!(send);
        loop {
            tokio::select! {
                r = &mut send => break r,
                Some(ev) = rx.recv() => events.event(ev).await,
                _ = cancel.cancelled(), if !turn_cancel.is_cancelled() => turn_cancel.cancel(),
                _ = tokio::time::sleep_until(tokio::time::Instant::from_std(deadline)), if !turn_cancel.is_cancelled() => {
                    timed_out = true;
                    turn_cancel.cancel();
                }
            }
        }
    };
    drop(tx);
    while let Some(ev) = rx.recv().await {
        events.event(ev).await;
    }
    let usage = agent.usage();
    drop(agent);
    mcp.shutdown().await;
    match result {
        Ok(o) => Outcome {
            state: JobState::Succeeded,
            exit_code: Some(0),
            error: None,
            result: Some(JobResult::Agent(AgentResult {
                text: Some(o.text),
                stop_reason: Some(o.stop_reason),
                steps: Some(o.steps),
                usage,
                cost_usd: o.cost_usd,
            })),
        },
        Err(AgentError::Cancelled) if timed_out => Outcome {
            state: JobState::TimedOut,
            exit_code: Some(i64::from(cordon_sandbox::exit_code::TIMEOUT)),
            error: Some("the job ran past its timeout".into()),
            result: Some(JobResult::Agent(AgentResult::usage(usage))),
        },
        Err(AgentError::Cancelled) => Outcome {
            result: Some(JobResult::Agent(AgentResult::usage(usage))),
            ..cancelled()
        },
        Err(e) => Outcome {
            state: JobState::Failed,
            exit_code: Some(1),
            error: Some(e.to_string()),
            result: Some(JobResult::Agent(AgentResult::usage(usage))),
        },
    }
}

/// An agent job's rendering of its events: stored with the job (and so
/// served as Server-Sent Events, live and later), named by their type.
/// Live tool output is kept up to the job's output cap; each call's result
/// (its head and tail) whatever the cap.
struct JobEvents<'a> {
    sink: &'a mut Sink,
    live_room: usize,
}

impl EventSink for JobEvents<'_> {
    fn event(&mut self, ev: AgentEvent) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            if let AgentEvent::ToolOutput { text, .. } = &ev {
                if text.len() > self.live_room {
                    return;
                }
                self.live_room -= text.len();
            }
            // The agent's own events, as `cordon exec --json` writes them.
            let (kind, data) = ev.to_json();
            self.sink.push(NewEvent::new(&kind, data)).await;
        })
    }
}
