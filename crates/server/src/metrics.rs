//! Prometheus metrics at `GET /metrics` on `--metrics-listen`: what an
//! autoscaler needs (queue depth) and what an operator watches (jobs by
//! state, their durations, sandbox starts, this process's leases).
//!
//! Counts by state come from the database at each scrape, so every
//! process answers the same queue depth; durations, sandbox starts and
//! leases are this process's own.

use std::sync::atomic::AtomicU64;

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;

use crate::job::{JobKind, JobState};
use crate::store::{Store, StoreError};

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct DurationLabels {
    kind: &'static str,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum StartResult {
    ok,
    error,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StartLabels {
    backend: &'static str,
    result: StartResult,
}

/// Job durations from a tenth of a second to an hour.
const DURATION_BUCKETS: [f64; 12] = [
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0,
];

pub struct Metrics {
    registry: Registry,
    queued: Gauge,
    jobs: Family<StateLabel, Gauge>,
    durations: Family<DurationLabels, Histogram>,
    sandbox_starts: Family<StartLabels, Counter>,
    leases: Gauge<i64, std::sync::atomic::AtomicI64>,
    leases_lost: Counter<u64, AtomicU64>,
    pool_ready: Gauge<i64, std::sync::atomic::AtomicI64>,
    pool_taken: Counter<u64, AtomicU64>,
    pool_hits: Counter<u64, AtomicU64>,
    workspaces_ahead: Gauge<i64, std::sync::atomic::AtomicI64>,
    workspaces_ahead_taken: Counter<u64, AtomicU64>,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("cordon");
        let queued = Gauge::default();
        registry.register(
            "jobs_queued",
            "Jobs waiting for a worker (the queue depth, for autoscaling)",
            queued.clone(),
        );
        let jobs = Family::<StateLabel, Gauge>::default();
        registry.register("jobs", "Jobs in the database by state", jobs.clone());
        let durations = Family::<DurationLabels, Histogram>::new_with_constructor(|| {
            Histogram::new(DURATION_BUCKETS)
        });
        registry.register(
            "job_duration_seconds",
            "Time from a job's start to its end, in this process",
            durations.clone(),
        );
        let sandbox_starts = Family::<StartLabels, Counter>::default();
        registry.register(
            "sandbox_starts",
            "Sandboxes started by this process for jobs and sessions",
            sandbox_starts.clone(),
        );
        let leases = Gauge::default();
        registry.register(
            "worker_leases",
            "Jobs this process holds a lease on (is running)",
            leases.clone(),
        );
        let leases_lost = Counter::default();
        registry.register(
            "leases_lost",
            "Leases this process found taken from it (it stopped the job)",
            leases_lost.clone(),
        );
        let pool_ready = Gauge::default();
        registry.register(
            "pool_ready",
            "Sandboxes ready in this process's warm pools",
            pool_ready.clone(),
        );
        let pool_taken = Counter::default();
        registry.register(
            "pool_taken",
            "Jobs, sessions and sandboxes created here that took a ready sandbox from a warm pool",
            pool_taken.clone(),
        );
        let workspaces_ahead = Gauge::default();
        registry.register(
            "workspaces_ahead",
            "Workspaces made ahead for the next job or sandbox, ready now",
            workspaces_ahead.clone(),
        );
        let workspaces_ahead_taken = Counter::default();
        registry.register(
            "workspaces_ahead_taken",
            "Jobs and sandboxes that took a workspace made ahead",
            workspaces_ahead_taken.clone(),
        );
        let pool_hits = Counter::default();
        registry.register(
            "pool_hits",
            "Jobs, sessions and sandboxes of the API that ran in a sandbox from a warm pool",
            pool_hits.clone(),
        );
        Metrics {
            registry,
            pool_ready,
            pool_taken,
            pool_hits,
            workspaces_ahead,
            workspaces_ahead_taken,
            queued,
            jobs,
            durations,
            sandbox_starts,
            leases,
            leases_lost,
        }
    }
}

impl Metrics {
    pub fn job_finished(&self, kind: JobKind, state: JobState, seconds: f64) {
        self.durations
            .get_or_create(&DurationLabels {
                kind: kind.as_str(),
                state: state.as_str(),
            })
            .observe(seconds);
    }

    pub fn sandbox_started(&self, backend: cordon_sandbox::BackendKind, ok: bool) {
        let backend = backend.as_str();
        let result = if ok {
            StartResult::ok
        } else {
            StartResult::error
        };
        self.sandbox_starts
            .get_or_create(&StartLabels { backend, result })
            .inc();
    }

    pub fn pool_ready(&self, n: usize) {
        self.pool_ready.set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn pool_taken(&self) {
        self.pool_taken.inc();
    }

    pub fn pool_hit(&self) {
        self.pool_hits.inc();
    }

    pub fn workspaces_ahead(&self, n: usize) {
        self.workspaces_ahead
            .set(i64::try_from(n).unwrap_or(i64::MAX));
    }

    pub fn workspace_ahead_taken(&self) {
        self.workspaces_ahead_taken.inc();
    }

    pub fn lease_taken(&self) {
        self.leases.inc();
    }

    pub fn lease_ended(&self) {
        self.leases.dec();
    }

    pub fn lease_lost(&self) {
        self.leases_lost.inc();
    }

    /// The text exposition, with the database's counts read now.
    pub async fn render(&self, store: &Store) -> Result<String, StoreError> {
        let counts = store.count_by_state().await?;
        for state in JobState::all() {
            let n = counts
                .iter()
                .find(|(s, _)| *s == state)
                .map_or(0, |(_, n)| *n);
            self.jobs
                .get_or_create(&StateLabel {
                    state: state.as_str(),
                })
                .set(n);
            if state == JobState::Queued {
                self.queued.set(n);
            }
        }
        let mut out = String::new();
        prometheus_client::encoding::text::encode(&mut out, &self.registry)
            .map_err(|e| StoreError::Invalid(format!("encoding metrics: {e}")))?;
        Ok(out)
    }
}
