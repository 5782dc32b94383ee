//! An `agent` job: the model's turn in the job's sandbox, its events
//! stored with the job.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use cordon_agent::events::{BoxFuture, EventSink};
use cordon_agent::{
    AgentError, AgentEvent, Cancel, Instructions, Opening, SessionLog, SessionRecord,
};
use cordon_sandbox::Sandbox;
use tokio::sync::mpsc;

use super::sink::Sink;
use crate::config::AgentDefaults;
use crate::job::{AgentResult, JobEvent, JobResult, Problem};
use crate::store::{NewEvent, Outcome};

/// Where a job's commands start: its AGENTS.md files are read down to here.
const WORKDIR: &str = "/workspace";

pub(super) struct AgentRun {
    pub(super) prompt: String,
    pub(super) model: Option<String>,
    pub(super) max_steps: Option<u32>,
    pub(super) session: PathBuf,
    /// The job's `repo`, cloned: its git tools go to the model.
    pub(super) repository: Option<cordon_git::SessionRepository>,
    /// How the tenant opens the sandbox's ports, as the model is told.
    pub(super) previews: cordon_agent::Previews,
}

#[allow(clippy::too_many_arguments)]
pub(super) async fn run_agent(
    model: Option<&AgentDefaults>,
    mcp_servers: &std::collections::BTreeMap<String, cordon_mcp::ServerSpec>,
    sandbox: &Sandbox,
    ws: &Path,
    run: AgentRun,
    deadline: Instant,
    sink: &mut Sink,
    cancel: &Cancel,
) -> Outcome {
    let Some(model_config) = model else {
        return Outcome::failed("this server has no model configured");
    };
    let mut config = model_config.agent.clone();
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
    let log = match SessionLog::create(&run.session) {
        Ok(mut log) => {
            // Where pushes go, as the log keeps it.
            if let Some(r) = &run.repository
                && let Err(e) = log.append(&SessionRecord::Repository(r.record()))
            {
                tracing::warn!("agent job session log: {e}");
            }
            Some(log)
        }
        Err(e) => {
            tracing::warn!("agent job session log: {e}");
            None
        }
    };
    // The job's sandbox is the job's: the conversation ends, it stays.
    let opened = Opening::new(&model_config.provider, config)
        .mcp(
            mcp_servers,
            Arc::new(move |m: String| noted.lock().unwrap_or_else(|p| p.into_inner()).push(m)),
        )
        .tools(&run.repository.map(|r| r.tools()).unwrap_or_default())
        .instructions(Instructions::read(None, ws, WORKDIR))
        .previews(run.previews)
        .open(sandbox.clone(), ws, Vec::new(), log)
        .await;
    let failed = std::mem::take(&mut *failures.lock().unwrap_or_else(|p| p.into_inner()));
    for message in failed {
        sink.event(JobEvent::Error(Problem { message })).await;
    }
    let mut talk = match opened {
        Ok(t) => t,
        Err(e) => {
            return Outcome::failed(e.to_string());
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let turn_cancel = Cancel::new();
    let mut timed_out = false;
    let mut events = JobEvents {
        live_room: sink.cap(),
        sink,
    };
    let result = {
        let send = talk.agent().send(&run.prompt, &tx, &turn_cancel);
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
    // The turn's checkpoint, before the job's workspace is done with.
    let ended = talk.end().await;
    while let Some(ev) = rx.recv().await {
        events.event(ev).await;
    }
    let usage = ended.usage;
    match result {
        Ok(o) => Outcome::succeeded().with_result(JobResult::Agent(AgentResult {
            text: Some(o.text),
            stop_reason: Some(o.stop_reason),
            steps: Some(o.steps),
            usage,
            cost_usd: o.cost_usd,
        })),
        Err(AgentError::Cancelled) if timed_out => {
            Outcome::timed_out("the job ran past its timeout")
                .with_exit_code(i64::from(cordon_sandbox::exit_code::TIMEOUT))
                .with_result(JobResult::Agent(AgentResult::usage(usage)))
        }
        Err(AgentError::Cancelled) => {
            Outcome::cancelled("cancelled").with_result(JobResult::Agent(AgentResult::usage(usage)))
        }
        Err(e) => Outcome::failed(e.to_string())
            .with_exit_code(1)
            .with_result(JobResult::Agent(AgentResult::usage(usage))),
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
