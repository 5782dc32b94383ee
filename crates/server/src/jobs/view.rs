//! A job as the API shows it: a summary in lists, the whole of it alone.

use serde::Serialize;
use utoipa::ToSchema;

use crate::http::Timestamp;
use crate::job::{JobKind, JobRequest, JobResult, JobState};
use crate::store::JobRow;

/// A job's summary, as queued and as listed.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobSummary {
    #[schema(example = "job_4cac2a4d783dc2aec74a934e")]
    pub id: String,
    pub kind: JobKind,
    pub state: JobState,
    pub created_at: Timestamp,
    pub started_at: Option<Timestamp>,
    pub finished_at: Option<Timestamp>,
    /// The command's exit status (128 + N for signal N), or cordon's code
    /// for a limit that ended it, as `cordon run` gives: 122 out of
    /// memory, 123 over the disk budget, 124 past the timeout.
    pub exit_code: Option<i64>,
    pub error: Option<String>,
    /// When the finished job's workspace was removed (the server's
    /// `--keep-workspaces`); its files then answer 410.
    pub workspace_removed_at: Option<Timestamp>,
    /// When the finished job's workspace and log went up to the server's
    /// archive (`--archive`); its files are then read-only, served from
    /// there by any process of the deployment.
    pub workspace_archived_at: Option<Timestamp>,
    /// What it does, one line: its command, code or prompt (first line,
    /// at most 120 characters and an ellipsis), or its steps.
    #[schema(example = "pip install flask && python3 app.py")]
    pub preview: String,
}

impl JobSummary {
    pub fn of(job: &JobRow) -> JobSummary {
        JobSummary {
            id: job.id.clone(),
            kind: job.kind,
            state: job.state,
            created_at: Timestamp::at(job.created_ms),
            started_at: job.started_ms.and_then(Timestamp::from_ms),
            finished_at: job.finished_ms.and_then(Timestamp::from_ms),
            exit_code: job.exit_code,
            error: job.error.clone(),
            workspace_removed_at: job.workspace_removed_ms.and_then(Timestamp::from_ms),
            workspace_archived_at: job.archived_ms.and_then(Timestamp::from_ms),
            preview: job
                .request
                .as_ref()
                .map(JobRequest::preview)
                .unwrap_or_default(),
        }
    }
}

/// A job with its output. Output past the server's cap is dropped and
/// flagged.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobView {
    #[serde(flatten)]
    pub summary: JobSummary,
    pub stdout: String,
    pub stderr: String,
    pub stdout_truncated: bool,
    pub stderr_truncated: bool,
    pub result: Option<JobResult>,
    /// The request as stored, every default filled in.
    pub request: Option<JobRequest>,
    /// `true` while the job's desktop can be watched at
    /// `/v1/jobs/{id}/vnc` (a running job with a display).
    pub live_desktop: bool,
}

impl JobView {
    pub fn of(job: &JobRow, live_desktop: bool) -> JobView {
        JobView {
            summary: JobSummary::of(job),
            stdout: job.stdout.clone(),
            stderr: job.stderr.clone(),
            stdout_truncated: job.stdout_truncated,
            stderr_truncated: job.stderr_truncated,
            result: job.result.clone(),
            request: job.request.as_ref().ok().cloned(),
            live_desktop,
        }
    }
}

/// A page of jobs, newest first.
#[derive(Debug, Serialize, ToSchema)]
pub struct JobList {
    pub jobs: Vec<JobSummary>,
    /// Pass as `cursor` for the next page; absent on the last.
    pub next_cursor: Option<String>,
}

/// The answer of the compatibility route `POST /schedule`.
#[derive(Debug, Serialize, ToSchema)]
pub struct Scheduled {
    pub job_id: String,
    /// The same id, under the name some of its clients read.
    pub task_id: String,
    pub state: JobState,
}
