//! One command in the job's sandbox, and the outcome it makes.

use std::time::Instant;

use cordon_agent::Cancel;
use cordon_sandbox::{ExecEvent, ExecRequest, ExecResult, Sandbox, Stream};

use super::sink::Sink;
use crate::job::Language;
use crate::store::Outcome;

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
            Some(Ok(ExecEvent::Stdout(d))) => sink.output(Stream::Stdout, &d).await,
            Some(Ok(ExecEvent::Stderr(d))) => sink.output(Stream::Stderr, &d).await,
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

pub(super) fn code_request(language: Language, code: &str) -> Result<ExecRequest, String> {
    cordon_tools::run_code::program_request(tools_language(language), code.to_string())
        .map_err(|e| format!("the TypeScript could not be transpiled: {e}"))
}

pub(super) fn outcome_of(r: &ExecResult) -> Outcome {
    let outcome = if r.disk_exceeded {
        Outcome::failed(DISK_STOPPED)
    } else if r.timed_out {
        Outcome::timed_out("the job ran past its timeout")
    } else if r.oom_killed {
        Outcome::failed("the job ran out of memory (raise `memory`)")
    } else if r.status.success() {
        Outcome::succeeded()
    } else {
        Outcome::failed(format!("exited with status {}", r.status.code()))
    };
    outcome.with_exit_code(i64::from(r.exit_code()))
}

pub(super) async fn single(
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
        Ran::Cancelled => Outcome::cancelled("cancelled"),
        // The budget's stop can end the stream before its result does.
        Ran::Failed(_) if sandbox.disk_stopped().is_some() => disk_outcome(),
        Ran::Failed(e) => Outcome::failed(e),
    }
}

pub(super) fn disk_outcome() -> Outcome {
    Outcome::failed(DISK_STOPPED).with_exit_code(i64::from(cordon_sandbox::exit_code::DISK))
}

pub(super) const DISK_STOPPED: &str =
    "the job's workspace grew past its disk budget and the sandbox was stopped (raise `disk`)";
