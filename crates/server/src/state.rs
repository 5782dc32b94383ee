//! The state handlers and workers share. It holds each part by the type
//! its own module defines (store, hub, caps, sandboxes, network ceilings
//! and policies, live sessions, the runner) and knows no handler.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use cordon_agent::Cancel;
use tokio::sync::Notify;

use crate::config::ServerConfig;
use crate::hub::Hub;
use crate::network::{Ceilings, LivePolicies};
use crate::runner::{Runner, Shares};
use crate::sandboxes::Sandboxes;
use crate::store::{JobRow, Store};

/// State shared by handlers and workers.
pub struct Shared {
    pub store: Store,
    pub hub: Arc<Hub>,
    pub config: ServerConfig,
    /// Cancel handles of the jobs running in this process, with the claim
    /// each runs on.
    pub running: Mutex<HashMap<String, (Cancel, i64)>>,
    /// Agent sessions in use.
    pub sessions: crate::live::LiveSessions,
    /// Live sessions' counts under their caps (API and MCP sessions).
    pub caps: Arc<crate::caps::SessionCaps>,
    /// Clones made while a request waits (a session's `repo`), capped as
    /// running jobs are: `per_tenant` each, `workers` in all.
    pub clones: crate::caps::CloneCaps,
    /// Sandboxes of the running jobs and live sessions that have a display.
    pub sandboxes: Arc<Sandboxes>,
    /// The sandbox API's sandboxes live in this process.
    pub boxes: crate::boxes::Boxes,
    /// Wakes one idle worker slot when a job is queued; a slot that
    /// claims one wakes the next (see `worker::run_jobs`).
    pub wake: Notify,
    /// Set when the server shuts down: worker slots take no more jobs
    /// (the ones running end as they would).
    pub stopping: Cancel,
    /// Why the jobs still running are cancelled, once the shutdown's
    /// grace is over: their recorded error.
    pub cut_short: Arc<std::sync::OnceLock<String>>,
    /// Ends a shutdown's grace early (a second signal).
    pub(crate) hurried: Cancel,
    /// The operator's network ceilings, expanded.
    pub ceilings: Arc<Ceilings>,
    /// The images tenants may name, and the store they are kept in.
    pub images: Arc<crate::catalog::Images>,
    /// The brokers' policies of running jobs and live sessions.
    pub policies: LivePolicies,
    /// This process's Prometheus metrics.
    pub metrics: Arc<crate::metrics::Metrics>,
    /// This process's worker id: what its leases are held under.
    pub worker: String,
    /// Sandboxes made ahead for jobs to take.
    pub(crate) pool: Arc<crate::pool::Pool>,
    /// Runs the jobs the workers claim.
    pub(crate) runner: Runner,
    /// Claims are made one at a time in this process, so two workers never
    /// race for the same job or past a tenant's limit.
    pub(crate) claim: tokio::sync::Mutex<()>,
    /// This process's worker slots, `workers` of them: one is held by each
    /// job claimed or started here until it ends.
    pub(crate) slots: Arc<tokio::sync::Semaphore>,
    /// The relayed requests' nonces this worker has accepted lately.
    pub(crate) nonces: crate::cluster::Nonces,
    /// Where finished jobs are kept, for every process to serve.
    pub(crate) archive: Option<Arc<crate::archive::Archive>>,
    /// The Labs served here for jobs that run on other workers.
    pub(crate) remote_labs: crate::lab::RemoteLabs,
    pub(crate) remote_previews: crate::preview::RemotePreviews,
    /// The live `/mcp` sessions, once the router is made.
    pub(crate) mcp_sessions: std::sync::OnceLock<Arc<cordon_mcp::HttpSessions>>,
}

impl Shared {
    /// Ends a shutdown's grace now: the jobs still running are cancelled.
    pub fn hurry(&self) {
        self.hurried.cancel();
    }

    /// How this process claims jobs.
    pub(crate) fn claim_terms(&self) -> crate::store::ClaimTerms {
        crate::store::ClaimTerms {
            per_tenant: self.config.per_tenant,
            lease: self.config.lease,
            max_attempts: self.config.max_attempts,
        }
    }

    /// A worker slot of this process's that is free now, unless it runs
    /// no jobs or is shutting down.
    pub(crate) fn free_slot(&self) -> Option<tokio::sync::OwnedSemaphorePermit> {
        if self.stopping.is_cancelled() {
            return None;
        }
        self.slots.clone().try_acquire_owned().ok()
    }

    /// The worker that runs (or ran) `job`, if that is another process of
    /// a deployment of many: what this process cannot serve itself.
    pub(crate) fn elsewhere<'j>(&self, job: &'j JobRow) -> Option<&'j str> {
        self.config.cluster.as_ref()?;
        if self.archived(job).is_some() {
            return None;
        }
        job.worker.as_deref().filter(|w| *w != self.worker)
    }

    /// The archive that holds `job`'s workspace, if it went up there.
    pub(crate) fn archived(&self, job: &JobRow) -> Option<&crate::archive::Archive> {
        job.archived_ms?;
        self.archive.as_deref()
    }

    /// The state of a server started with `config`, over `store`, keeping
    /// finished jobs in `archive`.
    pub fn new(
        config: ServerConfig,
        store: Store,
        ceilings: Ceilings,
        images: crate::catalog::Images,
        worker: String,
        archive: Option<Arc<crate::archive::Archive>>,
    ) -> Result<Shared, String> {
        let slots = Arc::new(tokio::sync::Semaphore::new(config.workers));
        let caps = Arc::new(crate::caps::SessionCaps::new(
            config.sessions_per_tenant,
            config.sessions,
            config.session_idle,
        ));
        let clones = crate::caps::CloneCaps::new(
            usize::try_from(config.per_tenant).unwrap_or(1),
            config.workers,
        );
        let hub = Arc::new(Hub::default());
        let ceilings = Arc::new(ceilings);
        let images = Arc::new(images);
        let policies = LivePolicies::default();
        let sandboxes = Arc::new(Sandboxes::default());
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let cut_short = Arc::new(std::sync::OnceLock::new());
        let parts = crate::pool::Parts {
            roots: crate::pool::Roots {
                jobs: config.job_dirs(),
                sessions: config.session_dirs(),
                sandboxes: config.sandbox_dirs(),
            },
            data_dir: config.data_dir.clone(),
            defaults: config.sandboxes(),
            bounds: config.bounds.clone(),
            images: images.clone(),
            metrics: metrics.clone(),
        };
        // A sessions' pool's sandboxes would wait for sessions that cannot
        // be made.
        if config.agent.is_none()
            && config
                .pool
                .iter()
                .any(|p| p.owner == crate::owner::Kind::Session)
        {
            return Err(
                "a pool for sessions needs a model, and this server has none (set \
                 ANTHROPIC_API_KEY or OPENAI_BASE_URL where `cordon serve` runs)"
                    .into(),
            );
        }
        // Split across machines, a job's workspace is made by the worker
        // that claims it, after its id is chosen: no pool can serve it.
        let pool = Arc::new(match config.cluster {
            None => crate::pool::Pool::new(&config.pool, parts)?,
            Some(_) if config.pool.is_empty() => crate::pool::Pool::none(parts),
            Some(_) => {
                return Err(
                    "warm pools serve a single `cordon serve`, not a deployment split in roles"
                        .into(),
                );
            }
        });
        let runner = Runner::new(
            &config,
            Shares {
                store: store.clone(),
                hub: hub.clone(),
                ceilings: ceilings.clone(),
                images: images.clone(),
                policies: policies.clone(),
                sandboxes: sandboxes.clone(),
                metrics: metrics.clone(),
                worker: worker.clone(),
                archive: archive.clone(),
                cut_short: cut_short.clone(),
                pool: pool.clone(),
            },
        );
        Ok(Shared {
            store,
            hub,
            config,
            running: Mutex::new(HashMap::new()),
            sessions: Default::default(),
            caps,
            clones,
            sandboxes,
            boxes: Default::default(),
            wake: Notify::new(),
            stopping: Cancel::new(),
            cut_short,
            hurried: Cancel::new(),
            ceilings,
            images,
            policies,
            metrics,
            worker,
            pool,
            runner,
            claim: tokio::sync::Mutex::new(()),
            slots,
            nonces: Default::default(),
            archive,
            remote_labs: Default::default(),
            remote_previews: Default::default(),
            mcp_sessions: Default::default(),
        })
    }
}

impl AsRef<Store> for Shared {
    fn as_ref(&self) -> &Store {
        &self.store
    }
}
