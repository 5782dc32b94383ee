//! Leases: how processes sharing the database run each job once.
//!
//! A worker claims a queued job and holds it until `lease_until_ms`,
//! extending the lease while the job runs ([`Store::heartbeat`]). Lease
//! times are the database's clock, so workers on machines whose clocks
//! disagree still agree on when a lease lapsed. A job whose lease lapsed,
//! or whose worker restarted, is settled by whichever process sees it
//! first ([`Store::settle_lost`]): queued again while it has run fewer
//! than the allowed attempts, else failed; cancelled if a cancel was asked.
//! Every change is one conditional `UPDATE` inside a transaction that also
//! records its event, so two processes never both settle or claim a job.
//!
//! On PostgreSQL, claims pick the oldest eligible job with `FOR UPDATE
//! SKIP LOCKED` (claimers never wait on each other's rows) and then take a
//! per-tenant advisory lock to count the tenant's running jobs again, so
//! the per-tenant limit holds across processes too.

use std::time::Duration;

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{
    Backend, JobRow, NewEvent, Result, Store, StoredEvent, Tx, ids, job_from_row, now_ms,
    push_event, state_of,
};
use crate::job::{JobEvent, JobState};

/// The database's clock in ms since the epoch, per backend.
macro_rules! pg_now {
    () => {
        "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
    };
}
macro_rules! sqlite_now {
    () => {
        "CAST((julianday('now') - 2440587.5) * 86400000 AS INTEGER)"
    };
}

/// The claim's per-tenant rule, one SQL predicate: the tenant whose
/// column is `$tenant` runs fewer than `$limit` jobs. Claims, the
/// PostgreSQL pick and jobs started as stored all spell it through here.
macro_rules! runs_under {
    ($tenant:literal, $limit:literal) => {
        concat!(
            "(SELECT COUNT(*) FROM jobs r WHERE r.tenant = ",
            $tenant,
            " AND r.state = 'running') < ",
            $limit
        )
    };
}

/// The claim's rule for a job started as it is stored ([`Store::start_job`]):
/// its tenant (`$2`) runs fewer than `$9` jobs, and no queued job is one
/// a claim would take (its tenant runs fewer than `$9` too).
macro_rules! start_job_guard {
    () => {
        concat!(
            "WHERE ",
            runs_under!("$2", "$9"),
            " AND NOT EXISTS (SELECT 1 FROM jobs q WHERE q.state = 'queued' AND ",
            runs_under!("q.tenant", "$9"),
            ")"
        )
    };
}

/// A job a worker holds, as its heartbeat found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Held {
    pub id: String,
    /// The claim it is on: a run of an earlier claim has lost it.
    pub attempt: i64,
    /// A cancel was asked through some API process.
    pub cancel: bool,
}

/// Claims for one tenant, one at a time across processes (PostgreSQL): a
/// count of the tenant's running jobs after this sees every earlier claim
/// committed.
async fn lock_claims_of(tx: &mut Tx<'static>, tenant: &str) -> Result<()> {
    sqlx::query("SELECT pg_advisory_xact_lock(hashtext($1))::TEXT")
        .bind(format!("cordon-claim:{tenant}"))
        .fetch_one(&mut **tx)
        .await?;
    Ok(())
}

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

/// A job a worker has just taken, and the `state` event that records it.
#[derive(Debug, Clone)]
pub struct Claimed {
    pub job: JobRow,
    pub started: StoredEvent,
}

/// How a worker claims jobs: its settings, the same for every claim.
#[derive(Debug, Clone, Copy)]
pub struct ClaimTerms {
    /// Jobs one tenant may run at once, across every process.
    pub per_tenant: i64,
    /// How long a claim lasts unless renewed.
    pub lease: Duration,
    /// The most times the job may be started: recorded with the claim, so
    /// whichever process settles the job when its lease lapses keeps to
    /// the claiming worker's setting.
    pub max_attempts: i64,
}

impl Store {
    /// Takes the oldest queued job whose tenant runs fewer than
    /// `terms.per_tenant` jobs, marks it running on `worker`, leases it for
    /// `terms.lease`, and records its `state` event: in one transaction, so
    /// that every run of a job is in its record even when the worker stops
    /// before it writes anything.
    pub async fn claim(&self, worker: &str, terms: ClaimTerms) -> Result<Option<Claimed>> {
        let ClaimTerms {
            per_tenant,
            lease,
            max_attempts,
        } = terms;
        let _one_at_a_time = self.appending.lock().await;
        let mut tx = self.pool.begin().await?;
        let row = match self.backend {
            Backend::Sqlite => {
                // One statement: SQLite runs one writer at a time.
                sqlx::query(concat!(
                    "UPDATE jobs SET state = 'running', started_ms = $1, worker = $3, \
                     lease_until_ms = ",
                    sqlite_now!(),
                    " + $4, attempts = attempts + 1, cancel_requested = 0, max_attempts = $5 \
                     WHERE state = 'queued' AND seq = (\
                        SELECT q.seq FROM jobs q WHERE q.state = 'queued' AND ",
                    runs_under!("q.tenant", "$2"),
                    " ORDER BY q.seq LIMIT 1) RETURNING ",
                    job_columns!()
                ))
                .bind(now_ms())
                .bind(per_tenant)
                .bind(worker)
                .bind(ms(lease))
                .bind(max_attempts)
                .fetch_optional(&mut *tx)
                .await?
            }
            Backend::Postgres => {
                let pick = sqlx::query(concat!(
                    "SELECT q.seq, q.tenant FROM jobs q WHERE q.state = 'queued' AND ",
                    runs_under!("q.tenant", "$1"),
                    " ORDER BY q.seq LIMIT 1 FOR UPDATE SKIP LOCKED"
                ))
                .bind(per_tenant)
                .fetch_optional(&mut *tx)
                .await?;
                let Some(pick) = pick else {
                    return Ok(None);
                };
                let seq: i64 = pick.try_get("seq")?;
                let tenant: String = pick.try_get("tenant")?;
                lock_claims_of(&mut tx, &tenant).await?;
                // The rule again, now that every earlier claim of the
                // tenant is committed: no row when it is full.
                sqlx::query(concat!(
                    "UPDATE jobs SET state = 'running', started_ms = $1, worker = $2, \
                     lease_until_ms = ",
                    pg_now!(),
                    " + $3, attempts = attempts + 1, cancel_requested = 0, max_attempts = $5 \
                     WHERE seq = $4 AND state = 'queued' AND ",
                    runs_under!("jobs.tenant", "$6"),
                    " RETURNING ",
                    job_columns!()
                ))
                .bind(now_ms())
                .bind(worker)
                .bind(ms(lease))
                .bind(seq)
                .bind(max_attempts)
                .bind(per_tenant)
                .fetch_optional(&mut *tx)
                .await?
            }
        };
        match row {
            Some(row) => self.record_claim(tx, &row, worker).await.map(Some),
            None => Ok(None),
        }
    }

    /// Stores a new job already claimed by `worker`, as [`Store::claim`]
    /// would record it, when the claim would take it next: its tenant runs
    /// fewer than `terms.per_tenant` jobs and no queued job may run (no
    /// job jumps one that waits). `None`, nothing stored, otherwise: the
    /// caller queues it. For a job that comes with its sandbox made (a
    /// warm pool's), so that it starts without a wake and a claim.
    pub async fn start_job(
        &self,
        id: &str,
        tenant: &str,
        request: &crate::job::JobRequest,
        worker: &str,
        terms: ClaimTerms,
    ) -> Result<Option<Claimed>> {
        let spec = super::spec_of(request)?;
        let _one_at_a_time = self.appending.lock().await;
        let mut tx = self.pool.begin().await?;
        if self.backend == Backend::Postgres {
            lock_claims_of(&mut tx, tenant).await?;
        }
        // The same statement on both, but for the database's clock.
        macro_rules! start_job_sql {
            ($now:expr) => {
                concat!(
                    "INSERT INTO jobs (id, tenant, kind, spec, state, created_ms, started_ms, \
                     worker, lease_until_ms, attempts, cancel_requested, max_attempts) \
                     SELECT $1, $2, $3, $4, 'running', $5, $5, $6, ",
                    $now,
                    " + $7, 1, 0, $8 ",
                    start_job_guard!(),
                    " RETURNING ",
                    job_columns!()
                )
            };
        }
        let sql = match self.backend {
            Backend::Sqlite => start_job_sql!(sqlite_now!()),
            Backend::Postgres => start_job_sql!(pg_now!()),
        };
        let row = sqlx::query(sql)
            .bind(id)
            .bind(tenant)
            .bind(request.kind().as_str())
            .bind(spec)
            .bind(now_ms())
            .bind(worker)
            .bind(ms(terms.lease))
            .bind(terms.max_attempts)
            .bind(terms.per_tenant)
            .fetch_optional(&mut *tx)
            .await?;
        match row {
            Some(row) => self.record_claim(tx, &row, worker).await.map(Some),
            None => Ok(None),
        }
    }

    /// Records a claim's row, just marked running on `worker`: its `state`
    /// event, in the same transaction, then commits.
    async fn record_claim(
        &self,
        mut tx: Tx<'static>,
        row: &AnyRow,
        worker: &str,
    ) -> Result<Claimed> {
        let job = job_from_row(row)?;
        let event = NewEvent::from(JobEvent::State {
            state: JobState::Running,
            worker: Some(worker.to_string()),
        });
        let started = push_event(&mut tx, &job.id, &event).await?;
        self.notify_events(&mut tx, &job.id).await?;
        tx.commit().await?;
        Ok(Claimed { job, started })
    }

    /// Extends `worker`'s leases by `lease` from now and answers the jobs
    /// it holds: a job it runs that is missing was taken from it.
    pub async fn heartbeat(&self, worker: &str, lease: Duration) -> Result<Vec<Held>> {
        let sql = match self.backend {
            Backend::Sqlite => concat!(
                "UPDATE jobs SET lease_until_ms = ",
                sqlite_now!(),
                " + $1 WHERE worker = $2 AND state = 'running' \
                 RETURNING id, attempts, cancel_requested"
            ),
            Backend::Postgres => concat!(
                "UPDATE jobs SET lease_until_ms = ",
                pg_now!(),
                " + $1 WHERE worker = $2 AND state = 'running' \
                 RETURNING id, attempts, cancel_requested"
            ),
        };
        let rows = sqlx::query(sql)
            .bind(ms(lease))
            .bind(worker)
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok(Held {
                    id: r.try_get("id")?,
                    attempt: r.try_get("attempts")?,
                    cancel: r.try_get::<i64, _>("cancel_requested")? != 0,
                })
            })
            .collect()
    }

    /// `worker`'s running jobs that some API process asked to cancel.
    pub async fn cancels_for(&self, worker: &str) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT id FROM jobs WHERE worker = $1 AND state = 'running' AND cancel_requested <> 0",
        )
        .bind(worker)
        .fetch_all(&self.pool)
        .await?;
        ids(&rows)
    }

    /// Asks the worker running `id` to cancel it; false if it is not
    /// running.
    pub async fn request_cancel(&self, id: &str) -> Result<bool> {
        let changed =
            sqlx::query("UPDATE jobs SET cancel_requested = 1 WHERE id = $1 AND state = 'running'")
                .bind(id)
                .execute(&self.pool)
                .await?
                .rows_affected();
        Ok(changed > 0)
    }

    /// Running jobs whose lease has lapsed (or that never had one: rows
    /// from before leases), oldest first.
    pub async fn lapsed(&self, limit: i64) -> Result<Vec<String>> {
        let sql = match self.backend {
            Backend::Sqlite => concat!(
                "SELECT id FROM jobs WHERE state = 'running' AND \
                 (lease_until_ms IS NULL OR lease_until_ms < ",
                sqlite_now!(),
                ") ORDER BY seq LIMIT $1"
            ),
            Backend::Postgres => concat!(
                "SELECT id FROM jobs WHERE state = 'running' AND \
                 (lease_until_ms IS NULL OR lease_until_ms < ",
                pg_now!(),
                ") ORDER BY seq LIMIT $1"
            ),
        };
        let rows = sqlx::query(sql).bind(limit).fetch_all(&self.pool).await?;
        ids(&rows)
    }

    /// Job `id`'s state and the lease it is on (None once settled
    /// without one).
    pub async fn holder(&self, id: &str) -> Result<Option<(JobState, Option<super::Lease>)>> {
        let row = sqlx::query("SELECT state, worker, attempts FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        let Some(row) = row else { return Ok(None) };
        let state = state_of(&row)?;
        let worker: Option<String> = row.try_get("worker")?;
        let attempt: i64 = row.try_get("attempts")?;
        Ok(Some((
            state,
            worker.map(|worker| super::Lease { worker, attempt }),
        )))
    }

    /// Running jobs `worker` holds: at its start, what it held before it
    /// stopped.
    pub async fn held_by(&self, worker: &str) -> Result<Vec<String>> {
        let rows =
            sqlx::query("SELECT id FROM jobs WHERE worker = $1 AND state = 'running' ORDER BY seq")
                .bind(worker)
                .fetch_all(&self.pool)
                .await?;
        ids(&rows)
    }

    /// Settles job `id`, lost by its worker: if it is still running and
    /// its lease lapsed (or, with `worker`, it is that worker's), it is
    /// cancelled when a cancel was asked, queued again when it has run
    /// fewer times than the worker that claimed it allows (its
    /// [`ClaimTerms::max_attempts`], not the settling process's), else
    /// failed with `reason`. Returns the state it went to and its event;
    /// None if another process settled it first or its worker came back.
    pub async fn settle_lost(
        &self,
        id: &str,
        worker: Option<&str>,
        reason: &str,
    ) -> Result<Option<(JobState, StoredEvent)>> {
        let _one_at_a_time = self.appending.lock().await;
        let mut tx = self.pool.begin().await?;
        // The row stays locked until the end: a heartbeat or another
        // settler waits, then finds it changed.
        self.lock_job(&mut tx, id, None).await?;
        let sql = match (self.backend, worker.is_some()) {
            (_, true) => concat!(
                "SELECT attempts, COALESCE(max_attempts, 1) AS most, cancel_requested FROM jobs ",
                "WHERE id = $1 AND state = 'running' AND worker = $2"
            ),
            (Backend::Sqlite, false) => concat!(
                "SELECT attempts, COALESCE(max_attempts, 1) AS most, cancel_requested FROM jobs WHERE id = $1 AND $2 = '' ",
                "AND state = 'running' AND (lease_until_ms IS NULL OR lease_until_ms < ",
                sqlite_now!(),
                ")"
            ),
            (Backend::Postgres, false) => concat!(
                "SELECT attempts, COALESCE(max_attempts, 1) AS most, cancel_requested FROM jobs WHERE id = $1 AND $2 = '' ",
                "AND state = 'running' AND (lease_until_ms IS NULL OR lease_until_ms < ",
                pg_now!(),
                ")"
            ),
        };
        let Some(row) = sqlx::query(sql)
            .bind(id)
            .bind(worker.unwrap_or(""))
            .fetch_optional(&mut *tx)
            .await?
        else {
            return Ok(None);
        };
        let attempts: i64 = row.try_get("attempts")?;
        let max_attempts: i64 = row.try_get("most")?;
        let cancel = row.try_get::<i64, _>("cancel_requested")? != 0;
        let (state, error) = if cancel {
            (JobState::Cancelled, format!("cancelled; {reason}"))
        } else if attempts < max_attempts {
            (JobState::Queued, String::new())
        } else if max_attempts > 1 {
            let why = format!("{reason} (it ran {attempts} times, the most allowed)");
            (JobState::Failed, why)
        } else {
            (JobState::Failed, reason.to_string())
        };
        let event = if state == JobState::Queued {
            sqlx::query(
                "UPDATE jobs SET state = 'queued', worker = NULL, lease_until_ms = NULL, \
                 started_ms = NULL, stdout = '', stderr = '', stdout_truncated = 0, \
                 stderr_truncated = 0 WHERE id = $1 AND state = 'running'",
            )
            .bind(id)
            .execute(&mut *tx)
            .await?;
            JobEvent::Requeued {
                reason: reason.to_string(),
                attempts,
            }
        } else {
            finish_row(&mut tx, id, state, &error).await?;
            JobEvent::Finished {
                state,
                exit_code: None,
                error: Some(error),
            }
        };
        let stored = push_event(&mut tx, id, &NewEvent::from(event)).await?;
        self.notify_events(&mut tx, id).await?;
        tx.commit().await?;
        self.notify_jobs().await;
        Ok(Some((state, stored)))
    }

    /// Records where `worker` takes relayed requests (its `--advertise`).
    pub async fn advertise(&self, worker: &str, url: &str) -> Result<()> {
        sqlx::query(
            "INSERT INTO workers (id, url, advertised_ms) VALUES ($1, $2, $3) \
             ON CONFLICT (id) DO UPDATE SET url = excluded.url, \
             advertised_ms = excluded.advertised_ms",
        )
        .bind(worker)
        .bind(url)
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// Where `worker` said it takes relayed requests, if it did.
    pub async fn worker_url(&self, worker: &str) -> Result<Option<String>> {
        let row = sqlx::query("SELECT url FROM workers WHERE id = $1")
            .bind(worker)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.map(|r| r.try_get("url")).transpose()?)
    }
}

async fn finish_row(tx: &mut super::Tx<'_>, id: &str, state: JobState, error: &str) -> Result<()> {
    sqlx::query(
        "UPDATE jobs SET state = $1, finished_ms = $2, error = $3, lease_until_ms = NULL, \
         worker = NULL WHERE id = $4 AND state = 'running'",
    )
    .bind(state.as_str())
    .bind(now_ms())
    .bind(error)
    .bind(id)
    .execute(&mut **tx)
    .await?;
    Ok(())
}
