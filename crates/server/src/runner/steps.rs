//! A `steps` job: each step in turn, with its own result.

use std::path::Path;
use std::time::Instant;

use cordon_agent::Cancel;
use cordon_sandbox::{ExecRequest, Sandbox, Stream};
use cordon_tools::{Workspace, WsPath};
use serde_json::Value;

use super::exec::{code_request, single};
use super::sink::Sink;
use crate::config::SandboxDefaults;
use crate::job::{JobEvent, JobResult, JobState, Language, Step, StepResult};
use crate::store::Outcome;

/// What every command of a job's steps runs under.
struct Bounds<'a> {
    sandbox: &'a Sandbox,
    deadline: Instant,
    cancel: &'a Cancel,
    cap: usize,
}

/// A code step: its program, run as a command step's is.
async fn code(at: &Bounds<'_>, language: Language, source: &str, sink: &mut Sink) -> Outcome {
    match code_request(language, source) {
        Ok(r) => single(at.sandbox, r, at.deadline, sink, at.cancel, at.cap).await,
        Err(e) => file_failure(sink, e).await,
    }
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run_steps(
    sandbox: &Sandbox,
    ws: &Path,
    sandboxes: &SandboxDefaults,
    steps: &[Step],
    continue_on_error: bool,
    deadline: Instant,
    sink: &mut Sink,
    cancel: &Cancel,
    cap: usize,
) -> Outcome {
    let bounds = Bounds {
        sandbox,
        deadline,
        cancel,
        cap,
    };
    let mut results = Vec::new();
    let mut last = Outcome::succeeded();
    let mut first_failure: Option<Outcome> = None;
    for (index, step) in steps.iter().enumerate() {
        if cancel.is_cancelled() {
            return Outcome::cancelled("cancelled");
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
                let r = ExecRequest::bash(&s.command);
                single(sandbox, r, deadline, sink, cancel, cap).await
            }
            Step::Python(s) => code(&bounds, Language::Python, &s.code, sink).await,
            Step::Javascript(s) => code(&bounds, Language::Javascript, &s.code, sink).await,
            Step::Typescript(s) => code(&bounds, Language::Typescript, &s.code, sink).await,
            Step::WriteFile(s) => {
                let path = &*s.path;
                match file_op(sandboxes, ws, path, |w, p| {
                    w.write(p, s.content.as_bytes()).map(|_| ())
                }) {
                    Ok(()) => Outcome::succeeded(),
                    Err(e) => file_failure(sink, format!("write_file {path}: {e}")).await,
                }
            }
            Step::ReadFile(s) => {
                let path = &*s.path;
                let read = file_op(sandboxes, ws, path, |w, p| {
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
                        sink.output(Stream::Stdout, &bytes).await;
                        Outcome::succeeded()
                    }
                    Err(e) => file_failure(sink, format!("read_file {path}: {e}")).await,
                }
            }
            Step::Computer(action) => {
                let (outcome, shot) =
                    computer_step(sandbox, ws, sandboxes, index, &action.0, sink).await;
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
/// result), NN the step's number from 1, as the output and the web UI
/// number steps.
async fn computer_step(
    sandbox: &Sandbox,
    ws: &Path,
    sandboxes: &SandboxDefaults,
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
    sink.output(Stream::Stdout, format!("{}\n", out.text).as_bytes())
        .await;
    let Some(image) = out.images.first() else {
        return (Outcome::succeeded(), None);
    };
    let path = format!("screenshots/step-{:02}.png", index + 1);
    let saved = base64::engine::general_purpose::STANDARD
        .decode(&image.data)
        .map_err(|e| e.to_string())
        .and_then(|png| file_op(sandboxes, ws, &path, |w, p| w.write(p, &png).map(|_| ())));
    match saved {
        Ok(()) => (Outcome::succeeded(), Some(path)),
        Err(e) => (
            file_failure(sink, format!("saving {path}: {e}")).await,
            None,
        ),
    }
}

async fn file_failure(sink: &mut Sink, message: String) -> Outcome {
    sink.output(Stream::Stderr, format!("{message}\n").as_bytes())
        .await;
    Outcome::failed(message).with_exit_code(1)
}

fn file_op<T>(
    sandboxes: &SandboxDefaults,
    ws: &Path,
    path: &str,
    f: impl FnOnce(&Workspace, &WsPath) -> Result<T, cordon_tools::WorkspaceError>,
) -> Result<T, String> {
    let w = sandboxes.workspace(ws).map_err(|e| e.to_string())?;
    let p = WsPath::parse(path).map_err(|e| e.to_string())?;
    f(&w, &p).map_err(|e| e.to_string())
}
