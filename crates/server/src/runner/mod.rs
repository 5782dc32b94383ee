//! Running one job: a fresh sandbox over the job's own workspace, its
//! output streamed into the job's events as it comes (in batches, so a
//! chatty program does not write the database once per line), and one
//! final state.
//!
//! [`Runner`] holds what that takes and nothing else of the server: the
//! store and the event hub, the jobs' directories, the limits and sandbox
//! defaults, the model, and the registries a running job is listed in
//! (network ceilings and policies, sandboxes).

mod agent;
mod build;
mod exec;
mod sink;
mod steps;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_agent::Cancel;
use cordon_sandbox::{ExecRequest, Sandbox, Stream};

use crate::config::{AgentDefaults, JobDirs, SandboxDefaults, ServerConfig};
use crate::hub::Hub;
use crate::job::{Bounds, Job, JobEvent, JobSpec, JobState};
use crate::network::{Ceilings, LivePolicies};
use crate::sandboxes::Sandboxes;
use crate::store::{Claimed, NewEvent, Outcome, Store};
use sink::Sink;

/// What running jobs takes.
pub struct Runner {
    store: Store,
    hub: Arc<Hub>,
    dirs: JobDirs,
    bounds: Bounds,
    /// Bytes of stdout (and of stderr) kept per job.
    output_cap: usize,
    sandboxes: SandboxDefaults,
    agent: Option<AgentDefaults>,
    mcp_servers: BTreeMap<String, cordon_mcp::ServerSpec>,
    /// The tenant's ceiling, checked again when the job starts.
    ceilings: Arc<Ceilings>,
    /// The images a job may run in, checked again when it starts.
    images: Arc<crate::catalog::Images>,
    /// Where a running job's network policy is listed for the API.
    policies: LivePolicies,
    /// Where a running job's sandbox is listed for its live view and Lab.
    live: Arc<Sandboxes>,
    metrics: Arc<crate::metrics::Metrics>,
    /// The worker id this process's leases are held under.
    worker: String,
    /// Where files written to a queued job wait for the worker that takes
    /// it, in a deployment of many machines.
    archive: Option<Arc<crate::archive::Archive>>,
    /// Why a job cancelled by a shutdown was (see `Shared::cut_short`).
    cut_short: Arc<std::sync::OnceLock<String>>,
    /// Where a job submitted here may have taken its sandbox.
    pool: Arc<crate::pool::Pool>,
}

/// The live parts a [`Runner`] shares with the rest of the server.
pub struct Shares {
    pub store: Store,
    pub hub: Arc<Hub>,
    pub ceilings: Arc<Ceilings>,
    pub images: Arc<crate::catalog::Images>,
    pub policies: LivePolicies,
    pub sandboxes: Arc<Sandboxes>,
    pub metrics: Arc<crate::metrics::Metrics>,
    pub worker: String,
    pub archive: Option<Arc<crate::archive::Archive>>,
    /// Set when a shutdown cancels the jobs still running: why.
    pub cut_short: Arc<std::sync::OnceLock<String>>,
    pub pool: Arc<crate::pool::Pool>,
}

impl Runner {
    /// Takes from `config` only what running a job reads.
    pub fn new(config: &ServerConfig, shares: Shares) -> Runner {
        Runner {
            store: shares.store,
            hub: shares.hub,
            dirs: config.job_dirs(),
            bounds: config.bounds.clone(),
            output_cap: config.output_cap,
            sandboxes: config.sandboxes(),
            agent: config.agent.clone(),
            mcp_servers: config.mcp_servers.clone(),
            ceilings: shares.ceilings,
            images: shares.images,
            policies: shares.policies,
            live: shares.sandboxes,
            metrics: shares.metrics,
            worker: shares.worker,
            archive: shares.archive,
            cut_short: shares.cut_short,
            pool: shares.pool,
        }
    }

    /// Runs a claimed job to its end and records the outcome.
    pub async fn run(&self, claimed: Claimed, cancel: Cancel) {
        let Claimed {
            job,
            started: claim,
        } = claimed;
        let id = job.id.clone();
        let started = Instant::now();
        self.hub.open(&id);
        // Recorded with the claim.
        self.hub.publish(&id, &[claim]);
        let lease = crate::store::Lease {
            worker: self.worker.clone(),
            attempt: job.attempts,
        };
        let mut sink = Sink::new(
            self.store.clone(),
            self.hub.clone(),
            &id,
            lease.clone(),
            self.output_cap,
        );
        let checked = job.request.clone().and_then(|r| r.check(&self.bounds));
        let mut leftovers = Leftovers::default();
        let mut outcome = match checked {
            Ok(req) => {
                self.run_request(&id, &job.tenant, req, &mut sink, &cancel, &mut leftovers)
                    .await
            }
            Err(e) => Outcome::failed(format!("the stored job is no longer valid here: {e}")),
        };
        if outcome.state == JobState::Cancelled
            && let Some(why) = self.cut_short.get()
        {
            outcome.error = Some(why.clone());
        }
        sink.flush().await;
        let finished = NewEvent::from(JobEvent::Finished {
            state: outcome.state,
            exit_code: outcome.exit_code,
            error: outcome.error.clone(),
        });
        match self
            .store
            .finish(&id, &[JobState::Running], Some(&lease), &outcome, &finished)
            .await
        {
            Ok(Some(e)) => {
                self.hub.publish(&id, &[e]);
                self.metrics
                    .job_finished(job.kind, outcome.state, started.elapsed().as_secs_f64());
            }
            Ok(None) => {}
            Err(e) => tracing::error!(job = %id, "cannot record the outcome: {e}"),
        }
        self.hub.close(&id);
        let recorded = started.elapsed();
        leftovers.release().await;
        // Its pool's refill, held back while it ran, may start.
        self.pool.ended(&id);
        tracing::debug!(job = %id, ?recorded, released = ?started.elapsed(), "job times");
    }

    async fn run_request(
        &self,
        id: &str,
        tenant: &str,
        req: Job,
        sink: &mut Sink,
        cancel: &Cancel,
        leftovers: &mut Leftovers,
    ) -> Outcome {
        let ws = self.dirs.workspace(id);
        let made = {
            let (ws, defaults, disk) = (ws.clone(), self.sandboxes.clone(), req.options.disk);
            tokio::task::spawn_blocking(move || {
                defaults
                    .make_workspace(&ws, Some(disk))
                    .map_err(|e| e.to_string())
            })
            .await
            .unwrap_or_else(|e| Err(e.to_string()))
        };
        // Mounted (if a volume) from here until the job's sandbox is closed.
        match made {
            Ok(in_use) => leftovers.in_use = Some(in_use),
            Err(e) => return Outcome::failed(format!("cannot create the workspace: {e}")),
        }
        if let Some(archive) = &self.archive {
            match archive.unstage(id, &ws).await {
                Ok(0) => {}
                Ok(n) => tracing::debug!(job = %id, "{n} file(s) written before it ran"),
                Err(e) => {
                    return Outcome::failed(format!(
                        "cannot take the files written before it ran: {e}"
                    ));
                }
            }
        }
        // The ceiling may have been lowered since the job was submitted.
        if let Some(spec) = &req.options.egress {
            let ceiling = &self.ceilings.of(tenant);
            let beyond = crate::network::stored_policy(spec)
                .map(|p| p.beyond(ceiling))
                .unwrap_or_else(|| vec!["an unreadable rule".into()]);
            if !beyond.is_empty() {
                return Outcome::failed(format!(
                    "the job's network goes beyond what its tenant may reach now: {}",
                    beyond.join(", ")
                ));
            }
        }
        // The repository, cloned on the host before the sandbox exists.
        let repository = match &req.options.repo {
            None => None,
            Some(repo) => {
                let allow_push = matches!(
                    req.spec,
                    JobSpec::Agent {
                        allow_push: true,
                        ..
                    }
                );
                // The clone counts against the job's timeout, and may take
                // no more disk than its budget allows the sandbox.
                let limits = cordon_git::Limits {
                    max_bytes: Some(req.options.disk),
                    deadline: Some(Instant::now() + Duration::from_secs(req.options.timeout_secs)),
                    cancelled: Some({
                        let cancel = cancel.clone();
                        Arc::new(move || cancel.is_cancelled())
                    }),
                };
                // Files put before the job ran are kept; a clone the lost
                // run of a requeued job made is taken up.
                let target = crate::repos::Target {
                    workspace: ws.clone(),
                    branch: format!("cordon/{id}"),
                    existing: cordon_git::Existing::Keep,
                    limits,
                };
                let ceiling = &self.ceilings.of(tenant);
                match crate::repos::clone(&self.store, ceiling, tenant, repo, target, allow_push)
                    .await
                {
                    Ok(r) => {
                        let c = &r.cloned;
                        sink.event(JobEvent::Repository {
                            url: c.url.clone(),
                            branch: c.branch.clone(),
                            base: c.base.clone(),
                            base_branch: c.base_branch.clone(),
                        })
                        .await;
                        Some(r)
                    }
                    Err(e) => return Outcome::failed(e),
                }
            }
        };
        if let JobSpec::Build(spec) = &req.spec {
            let deadline = Instant::now() + Duration::from_secs(req.options.timeout_secs);
            return self
                .build(id, tenant, &ws, &req.options, spec, deadline, sink, cancel)
                .await;
        }
        // Obtained here, on the worker that runs it: pulled on first use.
        let (image, digest) = match &req.options.image {
            None => (None, None),
            Some(name) => match self.images.ready(&self.store, tenant, name).await {
                Ok(ready) => {
                    let digest = ready.image.manifest.to_string();
                    sink.event(JobEvent::Image {
                        name: name.to_string(),
                        digest: digest.clone(),
                    })
                    .await;
                    (Some(ready.root), Some(digest))
                }
                Err(e) => return Outcome::failed(format!("cannot prepare the job's image: {e}")),
            },
        };
        // Made ahead if the job took a pooled one when it was submitted.
        let began = Instant::now();
        let (sandbox, pooled) = match self.pool.claim(id, digest.as_deref()) {
            Some(pooled) => (pooled.sandbox, Some(pooled.in_use)),
            None => {
                let mut config = self.sandboxes.for_options(&ws, image, &req.options);
                config.display = req.spec.display();
                let backend = config.backend;
                let created = Sandbox::create(config).await;
                self.metrics.sandbox_started(backend, created.is_ok());
                match created {
                    Ok(s) => (s, None),
                    Err(e) => return Outcome::failed(format!("cannot create the sandbox: {e}")),
                }
            }
        };
        // The API may change its policy while it runs; an agent reports its
        // own refusals, other jobs' are forwarded as events.
        let _policy = sandbox.network().map(|net| {
            if !matches!(req.spec, JobSpec::Agent { .. }) {
                tokio::spawn(forward_refusals(
                    self.store.clone(),
                    self.hub.clone(),
                    id.to_string(),
                    sink.lease().clone(),
                    net.refusals(MAX_REFUSALS),
                ));
            }
            self.policies
                .list(crate::owner::Owner::Job(id.to_string()), net.policy.clone())
        });
        // Viewable live while the job runs; unlisted before the sandbox closes.
        let listed = self
            .live
            .list(crate::owner::Owner::Job(id.to_string()), &sandbox);
        let deadline = Instant::now() + Duration::from_secs(req.options.timeout_secs);
        let ready = began.elapsed();
        let outcome = match req.spec {
            JobSpec::Shell { command } => {
                let r = ExecRequest::bash(&command);
                exec::single(&sandbox, r, deadline, sink, cancel, self.output_cap).await
            }
            JobSpec::Code { language, code } => match exec::code_request(language, &code) {
                Ok(r) => exec::single(&sandbox, r, deadline, sink, cancel, self.output_cap).await,
                Err(e) => {
                    sink.output(Stream::Stderr, format!("{e}\n").as_bytes())
                        .await;
                    Outcome::failed(e).with_exit_code(1)
                }
            },
            JobSpec::Steps {
                steps,
                continue_on_error,
                ..
            } => {
                steps::run_steps(
                    &sandbox,
                    &ws,
                    &self.sandboxes,
                    &steps,
                    continue_on_error,
                    deadline,
                    sink,
                    cancel,
                    self.output_cap,
                )
                .await
            }
            JobSpec::Build(_) => unreachable!("a build returned before its sandbox"),
            JobSpec::Agent {
                prompt,
                model,
                max_steps,
                ..
            } => {
                let session = self.dirs.session_log(id);
                let agent = agent::AgentRun {
                    prompt: prompt.into(),
                    model,
                    max_steps,
                    session,
                    repository,
                    previews: self
                        .sandboxes
                        .agent_previews(&crate::owner::Owner::Job(id.to_string())),
                };
                agent::run_agent(
                    self.agent.as_ref(),
                    &self.mcp_servers,
                    &sandbox,
                    &ws,
                    agent,
                    deadline,
                    sink,
                    cancel,
                )
                .await
            }
        };
        drop(listed);
        let ran = began.elapsed();
        // Every process the job left behind ends before its end is
        // recorded; the sandbox's teardown waits until after.
        sandbox.end_processes().await;
        tracing::debug!(job = %id, pooled = pooled.is_some(), ?ready, ?ran, ended = ?began.elapsed(), "sandbox times");
        leftovers.sandbox = Some(sandbox);
        outcome
    }
}

/// What a job holds on the host past its end, released once the end is
/// recorded: its sandbox (every process in it ended) and its workspace's
/// volume.
#[derive(Default)]
struct Leftovers {
    sandbox: Option<Sandbox>,
    in_use: Option<cordon_sandbox::volume::InUse>,
}

impl Leftovers {
    async fn release(self) {
        if let Some(sandbox) = self.sandbox {
            sandbox.close().await;
        }
        // Unmounted (a volume) only after its sandbox is gone.
        drop(self.in_use);
    }
}

/// Refusals at most recorded per job: a retry loop must not fill the
/// events table.
const MAX_REFUSALS: usize = 100;

/// The broker's refusals while the job runs, each host and port once, as
/// `network_refused` events.
async fn forward_refusals(
    store: Store,
    hub: Arc<Hub>,
    id: String,
    lease: crate::store::Lease,
    mut refusals: cordon_sandbox::Refusals,
) {
    while let Some(e) = refusals.next().await {
        let event = NewEvent::from(JobEvent::NetworkRefused {
            host: e.host,
            port: e.port,
            decision: e.decision,
            reason: e.reason,
            message: e.message,
        });
        match store.append(&id, Some(&lease), &[event], None).await {
            Ok(stored) => hub.publish(&id, &stored),
            Err(err) => tracing::warn!(job = %id, "cannot record a refusal: {err}"),
        }
    }
}
