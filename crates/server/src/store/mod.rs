//! The server's database: jobs (the queue itself), their events, and the
//! tenants' tokens. SQLite by default, PostgreSQL with a `postgres://` URL,
//! through one set of portable SQL statements over `sqlx::Any`.
//!
//! Every state change is one conditional `UPDATE` (`... WHERE state =
//! 'running'`), so a job cannot be claimed twice or finished twice, however
//! requests, workers and restarts interleave.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;
use sqlx::any::{AnyPoolOptions, AnyRow};
use sqlx::{AnyPool, Row};

use crate::job::{JobEvent, JobKind, JobRequest, JobResult, JobState};

mod git_credentials;
mod images;
mod sandboxes;
mod sealed;
mod sessions;
mod tokens;
pub use git_credentials::{ForgeApi, GitCredential, GitSecret};
pub use images::{ImageOrigin, OwnImage};
pub use leases::{ClaimTerms, Claimed, Held};
pub use sandboxes::SandboxRow;
pub use sealed::{KEY_MIN, Keyring, SealError, SecretsKey, strong_key};
pub use sessions::SessionRow;
pub use tokens::{
    Caller, E2B_PREFIX, NewToken, Role, TOKEN_ID_CHARS, TOKEN_PREFIX, TokenRow, check_tenant,
};

/// Errors of the store.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database: {0}")]
    Db(#[from] sqlx::Error),
    #[error("database migration: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    /// The store's own data is not what it should be.
    #[error("{0}")]
    Invalid(String),
    /// The caller asked for something the store cannot do, as said.
    #[error("{0}")]
    Refused(String),
    /// A worker wrote for a job it no longer holds: the job was settled
    /// by another process after its lease lapsed.
    #[error("job {0} is no longer this worker's (its lease lapsed)")]
    LeaseLost(String),
    /// A secret did not seal or open.
    #[error(transparent)]
    Sealed(#[from] SealError),
}

pub type Result<T> = std::result::Result<T, StoreError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Sqlite,
    Postgres,
}

/// A job as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct JobRow {
    pub seq: i64,
    pub id: String,
    pub tenant: String,
    pub kind: JobKind,
    /// The request as stored; an error if it no longer reads (a stored
    /// job from an incompatible version).
    pub request: std::result::Result<JobRequest, String>,
    pub state: JobState,
    pub created_ms: i64,
    pub started_ms: Option<i64>,
    pub finished_ms: Option<i64>,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub result: Option<JobResult>,
    /// When the job's workspace was removed (`--keep-workspaces`).
    pub workspace_removed_ms: Option<i64>,
    /// When the job's workspace and log went up to the archive
    /// (`--archive`): every process serves its files from there since.
    pub archived_ms: Option<i64>,
    /// Times the job has been claimed: with the worker, what names one
    /// run of it (see [`Lease`]).
    pub attempts: i64,
    /// The worker that runs it, or ran it last; none while queued, or once
    /// settled without one.
    pub worker: Option<String>,
}

/// One run of a job: the worker that claimed it and the claim's number.
/// A worker that claims a job again after losing it holds a new lease,
/// and the old run's writes are refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub worker: String,
    pub attempt: i64,
}

/// One event of a job, as served on its SSE stream.
#[derive(Debug, Clone, PartialEq)]
pub struct StoredEvent {
    pub seq: i64,
    pub ts_ms: i64,
    pub kind: String,
    pub data: Value,
}

/// An event to append; its `seq` is given by the store.
#[derive(Debug, Clone, PartialEq)]
pub struct NewEvent {
    pub kind: String,
    pub data: Value,
}

impl From<JobEvent> for NewEvent {
    fn from(e: JobEvent) -> Self {
        let (kind, data) = e.parts();
        NewEvent::new(kind, data)
    }
}

impl NewEvent {
    pub fn new(kind: &str, data: Value) -> Self {
        NewEvent {
            kind: kind.to_string(),
            data,
        }
    }
}

/// How a job ends.
#[derive(Debug, Clone, PartialEq)]
pub struct Outcome {
    pub state: JobState,
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    pub result: Option<JobResult>,
}

impl Outcome {
    /// Ran to its end and succeeded: exit status 0.
    pub fn succeeded() -> Outcome {
        Outcome {
            state: JobState::Succeeded,
            exit_code: Some(0),
            error: None,
            result: None,
        }
    }

    /// Failed, for the reason `error` gives.
    pub fn failed(error: impl Into<String>) -> Outcome {
        Outcome::ended(JobState::Failed, error)
    }

    /// Ran past its timeout.
    pub fn timed_out(error: impl Into<String>) -> Outcome {
        Outcome::ended(JobState::TimedOut, error)
    }

    /// Cancelled; `error` says when or by what.
    pub fn cancelled(error: impl Into<String>) -> Outcome {
        Outcome::ended(JobState::Cancelled, error)
    }

    fn ended(state: JobState, error: impl Into<String>) -> Outcome {
        Outcome {
            state,
            exit_code: None,
            error: Some(error.into()),
            result: None,
        }
    }

    /// With the exit status its command (or step) ended with.
    pub fn with_exit_code(mut self, code: i64) -> Outcome {
        self.exit_code = Some(code);
        self
    }

    /// With what it made (an agent's answer, a build's image).
    pub fn with_result(mut self, result: JobResult) -> Outcome {
        self.result = Some(result);
        self
    }
}

/// `GET /v1/jobs` filters; `before` is the cursor (a job's `seq`).
#[derive(Debug, Clone, Default)]
pub struct ListQuery {
    pub state: Option<JobState>,
    pub kind: Option<JobKind>,
    /// Only jobs created at or after this time (ms since the epoch).
    pub since_ms: Option<i64>,
    pub before: Option<i64>,
    pub limit: i64,
}

pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

/// Random bytes, hex-encoded.
pub fn random_hex(bytes: usize) -> String {
    let mut buf = vec![0u8; bytes];
    getrandom::fill(&mut buf).expect("the kernel's random source");
    buf.iter().map(|b| format!("{b:02x}")).collect()
}

type Tx<'a> = sqlx::Transaction<'a, sqlx::Any>;

/// Appends `e` to job `id`'s events, numbered after its last one; the
/// caller holds the job's row (see [`Store::lock_job`]).
async fn push_event(tx: &mut Tx<'_>, id: &str, e: &NewEvent) -> Result<StoredEvent> {
    let ts = now_ms();
    let row = sqlx::query(
        "INSERT INTO job_events (job_id, seq, ts_ms, kind, data) VALUES \
         ($1, (SELECT COALESCE(MAX(seq), 0) + 1 FROM job_events WHERE job_id = $1), $2, $3, $4) \
         RETURNING seq",
    )
    .bind(id)
    .bind(ts)
    .bind(&e.kind)
    .bind(e.data.to_string())
    .fetch_one(&mut **tx)
    .await?;
    Ok(StoredEvent {
        seq: row.try_get("seq")?,
        ts_ms: ts,
        kind: e.kind.clone(),
        data: e.data.clone(),
    })
}

/// The columns of a job, in statements built with `concat!` (sqlx takes
/// only static SQL, which keeps injection out by construction).
macro_rules! job_columns {
    () => {
        "seq, id, tenant, kind, spec, state, created_ms, started_ms, finished_ms, exit_code, \
         error, stdout, stderr, stdout_truncated, stderr_truncated, result, workspace_removed_ms, \
         attempts, worker, archived_ms"
    };
}

mod archive;
mod leases;

/// A job's request as its `spec` column holds it.
fn spec_of(request: &JobRequest) -> Result<String> {
    serde_json::to_string(request)
        .map_err(|e| StoreError::Invalid(format!("a job that does not serialize: {e}")))
}

/// The `id` column of each row.
fn ids(rows: &[AnyRow]) -> Result<Vec<String>> {
    rows.iter()
        .map(|r| r.try_get("id").map_err(Into::into))
        .collect()
}

/// A row's `state` column, which must name a job state.
fn state_of(row: &AnyRow) -> Result<JobState> {
    let state: String = row.try_get("state")?;
    JobState::parse(&state)
        .ok_or_else(|| StoreError::Invalid(format!("unknown job state {state:?}")))
}

fn job_from_row(row: &AnyRow) -> Result<JobRow> {
    let kind: String = row.try_get("kind")?;
    let spec: String = row.try_get("spec")?;
    let result: Option<String> = row.try_get("result")?;
    Ok(JobRow {
        seq: row.try_get("seq")?,
        id: row.try_get("id")?,
        tenant: row.try_get("tenant")?,
        kind: JobKind::parse(&kind)
            .ok_or_else(|| StoreError::Invalid(format!("unknown job kind {kind:?}")))?,
        request: serde_json::from_str(&spec).map_err(|e| e.to_string()),
        state: state_of(row)?,
        created_ms: row.try_get("created_ms")?,
        started_ms: row.try_get("started_ms")?,
        finished_ms: row.try_get("finished_ms")?,
        exit_code: row.try_get("exit_code")?,
        error: row.try_get("error")?,
        stdout: row.try_get("stdout")?,
        stderr: row.try_get("stderr")?,
        stdout_truncated: row.try_get::<i64, _>("stdout_truncated")? != 0,
        stderr_truncated: row.try_get::<i64, _>("stderr_truncated")? != 0,
        result: result.and_then(|r| serde_json::from_str(&r).ok()),
        workspace_removed_ms: row.try_get("workspace_removed_ms")?,
        attempts: row.try_get("attempts")?,
        worker: row.try_get("worker")?,
        archived_ms: row.try_get("archived_ms")?,
    })
}

/// The database, shared by every handler and worker.
#[derive(Clone, Debug)]
pub struct Store {
    pool: AnyPool,
    backend: Backend,
    /// A job's events are numbered after its last one inside the
    /// appending transaction; two at once (the runner, and a handler
    /// recording a cancel or a policy change) could take the same number,
    /// so this process appends one at a time.
    appending: std::sync::Arc<tokio::sync::Mutex<()>>,
    /// What tenants' secrets are sealed with; none: they are refused.
    secrets: Option<Keyring>,
}

impl Store {
    /// Opens (creating if needed) and migrates the database at `url`:
    /// `postgres://…`, `sqlite://PATH` or a plain file path.
    pub async fn open(url: &str) -> Result<Store> {
        sqlx::any::install_default_drivers();
        let (url, backend) = if url.starts_with("postgres://") || url.starts_with("postgresql://") {
            (url.to_string(), Backend::Postgres)
        } else {
            let path = url.strip_prefix("sqlite://").unwrap_or(url);
            if let Some(dir) = Path::new(path)
                .parent()
                .filter(|d| !d.as_os_str().is_empty())
            {
                std::os::unix::fs::DirBuilderExt::mode(
                    std::fs::DirBuilder::new().recursive(true),
                    0o700,
                )
                .create(dir)
                .map_err(|e| {
                    StoreError::Invalid(format!("cannot create {}: {e}", dir.display()))
                })?;
            }
            // The store holds token hashes and every job's output: its
            // owner's only. SQLite gives its journal files the same mode.
            std::os::unix::fs::OpenOptionsExt::mode(
                std::fs::OpenOptions::new().append(true).create(true),
                0o600,
            )
            .open(path)
            .map_err(|e| StoreError::Invalid(format!("cannot create {path}: {e}")))?;
            // sqlx percent-decodes the path of the URL.
            let encoded = path
                .replace('%', "%25")
                .replace('?', "%3F")
                .replace('#', "%23");
            (format!("sqlite://{encoded}?mode=rwc"), Backend::Sqlite)
        };
        let mut options = AnyPoolOptions::new()
            .max_connections(match backend {
                Backend::Sqlite => 8,
                Backend::Postgres => 16,
            })
            .acquire_timeout(Duration::from_secs(30))
            // A SQLite connection is a file in this process: it cannot go
            // stale, and a ping on every acquire is a round trip to its
            // thread, a dozen per job. A server's connection can.
            .test_before_acquire(backend == Backend::Postgres);
        if backend == Backend::Sqlite {
            options = options.after_connect(|conn, _| {
                Box::pin(async move {
                    // Writers wait for each other instead of failing, and
                    // readers never block the writer.
                    sqlx::query("PRAGMA busy_timeout = 10000")
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query("PRAGMA journal_mode = WAL")
                        .execute(&mut *conn)
                        .await?;
                    sqlx::query("PRAGMA synchronous = NORMAL")
                        .execute(&mut *conn)
                        .await?;
                    Ok(())
                })
            });
        }
        let pool = options.connect(&url).await?;
        let store = Store {
            pool,
            backend,
            appending: Default::default(),
            secrets: None,
        };
        store.migrate().await?;
        Ok(store)
    }

    /// This store, sealing and opening tenants' secrets with `keys`.
    pub fn with_secrets(mut self, keys: Keyring) -> Store {
        self.secrets = Some(keys);
        self
    }

    fn secrets(&self) -> Result<&Keyring> {
        self.secrets.as_ref().ok_or_else(|| {
            StoreError::Refused(
                "this process was given no secrets key to seal or open secrets with".into(),
            )
        })
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// Holds job `id`'s row until the transaction ends, so that processes
    /// sharing the database number its events one at a time; with `lease`,
    /// only while that run holds it: a run that lost the job writes nothing
    /// more.
    async fn lock_job(&self, tx: &mut Tx<'_>, id: &str, lease: Option<&Lease>) -> Result<()> {
        if self.backend == Backend::Sqlite {
            // Write first: a SQLite transaction that reads before it writes
            // cannot take the writer's lock once another connection wrote
            // meanwhile (SQLITE_BUSY, whatever the busy timeout), while one
            // that writes first waits its turn for the lock.
            sqlx::query("UPDATE jobs SET attempts = attempts WHERE id = $1")
                .bind(id)
                .execute(&mut **tx)
                .await?;
        }
        let sql = match self.backend {
            Backend::Postgres => {
                "SELECT worker, state, attempts FROM jobs WHERE id = $1 FOR UPDATE"
            }
            Backend::Sqlite => "SELECT worker, state, attempts FROM jobs WHERE id = $1",
        };
        let row = sqlx::query(sql).bind(id).fetch_optional(&mut **tx).await?;
        if let Some(lease) = lease {
            let held = row.is_some_and(|r| {
                r.try_get::<Option<String>, _>("worker")
                    .ok()
                    .flatten()
                    .as_deref()
                    == Some(lease.worker.as_str())
                    && r.try_get::<String, _>("state").ok().as_deref() == Some("running")
                    && r.try_get::<i64, _>("attempts").ok() == Some(lease.attempt)
            });
            if !held {
                return Err(StoreError::LeaseLost(id.to_string()));
            }
        }
        Ok(())
    }

    async fn migrate(&self) -> Result<()> {
        let migrator = match self.backend {
            Backend::Sqlite => sqlx::migrate!("./migrations/sqlite"),
            Backend::Postgres => sqlx::migrate!("./migrations/postgres"),
        };
        migrator.run(&self.pool).await?;
        Ok(())
    }

    /// Tells every process listening (PostgreSQL) that a job may be
    /// claimed: one was queued, or a running one ended and freed a slot.
    pub async fn notify_jobs(&self) {
        if self.backend == Backend::Postgres
            && let Err(e) = sqlx::query("SELECT pg_notify('cordon_jobs', '')::TEXT")
                .fetch_one(&self.pool)
                .await
        {
            tracing::debug!("notify: {e}");
        }
    }

    /// Within `tx`: tells listening processes that job `id` has new events;
    /// delivered when the transaction commits.
    async fn notify_events(&self, tx: &mut Tx<'_>, id: &str) -> Result<()> {
        if self.backend == Backend::Postgres {
            sqlx::query("SELECT pg_notify('cordon_events', $1)::TEXT")
                .bind(id)
                .fetch_one(&mut **tx)
                .await?;
        }
        Ok(())
    }

    /// Queues a job.
    pub async fn insert_job(&self, id: &str, tenant: &str, request: &JobRequest) -> Result<JobRow> {
        let spec = spec_of(request)?;
        let row = sqlx::query(concat!(
            "INSERT INTO jobs (id, tenant, kind, spec, state, created_ms) \
             VALUES ($1, $2, $3, $4, 'queued', $5) RETURNING ",
            job_columns!()
        ))
        .bind(id)
        .bind(tenant)
        .bind(request.kind().as_str())
        .bind(spec)
        .bind(now_ms())
        .fetch_one(&self.pool)
        .await?;
        self.notify_jobs().await;
        job_from_row(&row)
    }

    /// A tenant's job; another tenant's is as absent as a missing one.
    pub async fn job(&self, tenant: &str, id: &str) -> Result<Option<JobRow>> {
        let row = sqlx::query(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE id = $1 AND tenant = $2"
        ))
        .bind(id)
        .bind(tenant)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(job_from_row).transpose()
    }

    /// A tenant's jobs, newest first, one page.
    pub async fn list(&self, tenant: &str, q: &ListQuery) -> Result<Vec<JobRow>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            job_columns!(),
            " FROM jobs WHERE tenant = $1 \
             AND ($2 = '' OR state = $2) AND ($3 = '' OR kind = $3) AND seq < $4 \
             AND created_ms >= $6 \
             ORDER BY seq DESC LIMIT $5"
        ))
        .bind(tenant)
        .bind(q.state.map_or("", JobState::as_str))
        .bind(q.kind.map_or("", JobKind::as_str))
        .bind(q.before.unwrap_or(i64::MAX))
        .bind(q.limit)
        .bind(q.since_ms.unwrap_or(i64::MIN))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(job_from_row).collect()
    }

    /// Appends events to a job, numbering them after its last one, and
    /// adds output to its stored stdout/stderr, all at once.
    pub async fn append(
        &self,
        id: &str,
        lease: Option<&Lease>,
        events: &[NewEvent],
        output: Option<&OutputDelta>,
    ) -> Result<Vec<StoredEvent>> {
        let _one_at_a_time = self.appending.lock().await;
        let mut tx = self.pool.begin().await?;
        self.lock_job(&mut tx, id, lease).await?;
        let mut stored = Vec::with_capacity(events.len());
        for e in events {
            stored.push(push_event(&mut tx, id, e).await?);
        }
        if !stored.is_empty() {
            self.notify_events(&mut tx, id).await?;
        }
        if let Some(o) = output {
            sqlx::query(
                "UPDATE jobs SET stdout = stdout || $1, stderr = stderr || $2, \
                 stdout_truncated = $3, stderr_truncated = $4 WHERE id = $5",
            )
            .bind(&o.stdout)
            .bind(&o.stderr)
            .bind(i64::from(o.stdout_truncated))
            .bind(i64::from(o.stderr_truncated))
            .bind(id)
            .execute(&mut *tx)
            .await?;
        }
        tx.commit().await?;
        Ok(stored)
    }

    /// Ends a job that is in one of `from` states and, with `lease`, still
    /// on that lease; None if it was not (already finished, cancelled
    /// meanwhile, or its lease lost). The final event is
    /// appended in the same transaction.
    pub async fn finish(
        &self,
        id: &str,
        from: &[JobState],
        lease: Option<&Lease>,
        outcome: &Outcome,
        event: &NewEvent,
    ) -> Result<Option<StoredEvent>> {
        let _one_at_a_time = self.appending.lock().await;
        let mut tx = self.pool.begin().await?;
        // No `lock_job`: the UPDATE comes first and takes what it would,
        // SQLite's write lock and PostgreSQL's lock on the job's row, which
        // order this against the job's other writers (its events' `seq`);
        // the UPDATE's own conditions check the state and the lease.
        let states: Vec<&str> = from.iter().map(|s| s.as_str()).collect();
        let changed = sqlx::query(
            "UPDATE jobs SET state = $1, finished_ms = $2, exit_code = $3, error = $4, result = $5, \
             lease_until_ms = NULL \
             WHERE id = $6 AND (state = $7 OR state = $8) \
             AND ($9 = '' OR (worker = $9 AND attempts = $10))",
        )
        .bind(outcome.state.as_str())
        .bind(now_ms())
        .bind(outcome.exit_code)
        .bind(outcome.error.as_deref())
        .bind(
            outcome
                .result
                .as_ref()
                .and_then(|r| serde_json::to_string(r).ok()),
        )
        .bind(id)
        .bind(states.first().copied().unwrap_or(""))
        .bind(states.get(1).copied().unwrap_or(""))
        .bind(lease.map_or("", |l| l.worker.as_str()))
        .bind(lease.map_or(0, |l| l.attempt))
        .execute(&mut *tx)
        .await?
        .rows_affected();
        if changed == 0 {
            return Ok(None);
        }
        let stored = push_event(&mut tx, id, event).await?;
        self.notify_events(&mut tx, id).await?;
        tx.commit().await?;
        // A slot of its tenant's is free.
        self.notify_jobs().await;
        Ok(Some(stored))
    }

    /// Events of a job after `after`, in order.
    pub async fn events_after(&self, id: &str, after: i64, limit: i64) -> Result<Vec<StoredEvent>> {
        let rows = sqlx::query(
            "SELECT seq, ts_ms, kind, data FROM job_events WHERE job_id = $1 AND seq > $2 \
             ORDER BY seq LIMIT $3",
        )
        .bind(id)
        .bind(after)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter()
            .map(|r| {
                let data: String = r.try_get("data")?;
                Ok(StoredEvent {
                    seq: r.try_get("seq")?,
                    ts_ms: r.try_get("ts_ms")?,
                    kind: r.try_get("kind")?,
                    data: serde_json::from_str(&data).unwrap_or(Value::Null),
                })
            })
            .collect()
    }

    /// Jobs that finished at or before `before_ms` and still have their
    /// workspace, oldest first.
    /// With `worker`, only the jobs that worker ran, archived ones and ones
    /// that never ran: in a deployment of many machines, each keeps the
    /// workspaces of its own jobs, and any process may remove what the
    /// archive keeps.
    pub async fn expired_workspaces(
        &self,
        before_ms: i64,
        limit: i64,
        worker: Option<&str>,
    ) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT id FROM jobs WHERE finished_ms IS NOT NULL AND finished_ms <= $1 \
             AND workspace_removed_ms IS NULL AND state <> 'queued' AND state <> 'running' \
             AND ($3 = '' OR worker = $3 OR worker IS NULL OR archived_ms IS NOT NULL) \
             ORDER BY finished_ms LIMIT $2",
        )
        .bind(before_ms)
        .bind(limit)
        .bind(worker.unwrap_or(""))
        .fetch_all(&self.pool)
        .await?;
        ids(&rows)
    }

    /// Records that a finished job's workspace is gone; false if it was
    /// recorded already (another reaper sharing the database).
    pub async fn workspace_removed(&self, id: &str) -> Result<bool> {
        let changed = sqlx::query(
            "UPDATE jobs SET workspace_removed_ms = $1 WHERE id = $2 \
             AND workspace_removed_ms IS NULL AND finished_ms IS NOT NULL",
        )
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(changed > 0)
    }

    /// How many jobs are in each state (states with none are left out).
    pub async fn count_by_state(&self) -> Result<Vec<(JobState, i64)>> {
        let rows = sqlx::query("SELECT state, COUNT(*) AS n FROM jobs GROUP BY state")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| Ok((state_of(r)?, r.try_get("n")?)))
            .collect()
    }

    /// Whether any tenant has a job `id`.
    pub async fn job_exists(&self, id: &str) -> Result<bool> {
        let row = sqlx::query("SELECT 1 AS one FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(row.is_some())
    }

    /// The ids of a tenant's jobs, oldest first: what forgetting the
    /// tenant goes through (the rows themselves may be large).
    pub async fn job_ids(&self, tenant: &str) -> Result<Vec<String>> {
        let rows = sqlx::query("SELECT id FROM jobs WHERE tenant = $1 ORDER BY seq")
            .bind(tenant)
            .fetch_all(&self.pool)
            .await?;
        ids(&rows)
    }

    /// Deletes a tenant's finished job and its events; false if there is
    /// no such job or it is queued or running (cancel it first).
    pub async fn delete_job(&self, tenant: &str, id: &str) -> Result<bool> {
        let _one_at_a_time = self.appending.lock().await;
        let mut tx = self.pool.begin().await?;
        let done = sqlx::query(
            "DELETE FROM jobs WHERE id = $1 AND tenant = $2 AND state <> 'queued' AND state <> 'running'",
        )
        .bind(id)
        .bind(tenant)
        .execute(&mut *tx)
        .await?;
        if done.rows_affected() == 0 {
            return Ok(false);
        }
        sqlx::query("DELETE FROM job_events WHERE job_id = $1")
            .bind(id)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        Ok(true)
    }

    /// A quick check that the database answers, for `/health`.
    pub async fn ping(&self) -> Result<()> {
        sqlx::query("SELECT 1").execute(&self.pool).await?;
        Ok(())
    }
}

/// Output to add to a job's stored stdout and stderr.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OutputDelta {
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    #[tokio::test]
    async fn a_new_sqlite_store_and_its_directory_are_the_owners_only() {
        let home = tempfile::tempdir().unwrap();
        let path = home.path().join("data/cordon/server.db");
        let store = super::Store::open(path.to_str().unwrap()).await.unwrap();
        store.create_token("t", super::Role::Tenant).await.unwrap();
        let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&path), 0o600);
        assert_eq!(mode(path.parent().unwrap()), 0o700);
        for side in ["server.db-wal", "server.db-shm"] {
            let p = path.with_file_name(side);
            if p.exists() {
                assert_eq!(mode(&p), 0o600, "{side}");
            }
        }
    }
}
