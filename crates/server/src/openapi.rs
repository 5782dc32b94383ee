//! The OpenAPI document (`/openapi.json`) and a page that renders it
//! (`/docs`). The schemas below describe the JSON the handlers read and
//! write; the handlers check bodies themselves (to name every mistake), so
//! these types exist for the document only.

use std::sync::Arc;

use axum::http::header;
use axum::response::IntoResponse;
use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::server::Shared;

/// Limits common to every job kind.
#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct RunOptionsDoc {
    /// Seconds before the job is killed (default 300).
    #[schema(minimum = 1, maximum = 3600)]
    timeout_secs: Option<u64>,
    /// Memory limit for the whole sandbox, such as "512M" or "2G".
    #[schema(example = "512M")]
    memory: Option<String>,
    /// `off` (default) or `loopback`; jobs never reach the host's network.
    #[schema(pattern = "^(off|loopback)$")]
    network: Option<String>,
}

/// A step of a `steps` job: `tool` is `shell` (with `command`), `python`,
/// `javascript` or `typescript` (with `code`), `write_file` (with `path`
/// and `content`) or `read_file` (with `path`). `kind` may stand for `tool`.
#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct StepDoc {
    #[schema(pattern = "^(shell|python|javascript|typescript|write_file|read_file)$")]
    tool: String,
    command: Option<String>,
    code: Option<String>,
    path: Option<String>,
    content: Option<String>,
}

/// A job to queue. `kind` decides the other fields: `shell` takes
/// `command`; `python`, `javascript` and `typescript` take `code`; `steps`
/// takes `steps` (and `continue_on_error`); `agent` takes `prompt` (and
/// `model`, `max_steps`). Unknown fields are refused.
#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct JobRequestDoc {
    #[schema(pattern = "^(shell|python|javascript|typescript|steps|agent)$")]
    kind: String,
    command: Option<String>,
    code: Option<String>,
    steps: Option<Vec<StepDoc>>,
    continue_on_error: Option<bool>,
    prompt: Option<String>,
    model: Option<String>,
    #[schema(minimum = 1, maximum = 200)]
    max_steps: Option<u32>,
    #[serde(flatten)]
    options: RunOptionsDoc,
}

/// A job's summary, as queued and as listed.
#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct JobSummaryDoc {
    #[schema(example = "job_4cac2a4d783dc2aec74a934e")]
    id: String,
    kind: String,
    #[schema(pattern = "^(queued|running|succeeded|failed|cancelled|timed_out)$")]
    state: String,
    /// RFC 3339.
    created_at: String,
    started_at: Option<String>,
    finished_at: Option<String>,
    exit_code: Option<i64>,
    error: Option<String>,
}

/// A job with its output. Output past the server's cap is dropped and
/// flagged.
#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct JobDoc {
    #[serde(flatten)]
    summary: JobSummaryDoc,
    stdout: String,
    stderr: String,
    stdout_truncated: bool,
    stderr_truncated: bool,
    /// `steps`: per-step results; `agent`: the final text, usage and cost.
    result: Option<serde_json::Value>,
    /// The request as stored, with defaults filled in.
    request: serde_json::Value,
}

#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct JobListDoc {
    jobs: Vec<JobSummaryDoc>,
    /// Pass as `cursor` for the next page; absent on the last.
    next_cursor: Option<String>,
}

#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct ErrorBodyDoc {
    /// A stable, machine-readable code such as `invalid_request`.
    code: String,
    /// What is wrong, for a person.
    message: String,
}

/// Every error answer.
#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct ErrorDoc {
    error: ErrorBodyDoc,
}

/// A directory of a job's workspace.
#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct ListingDoc {
    path: String,
    entries: Vec<EntryDoc>,
}

#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct EntryDoc {
    name: String,
    #[schema(pattern = "^(file|directory|symlink|other)$")]
    r#type: String,
    size: Option<u64>,
}

#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct PutFileDoc {
    path: String,
    /// False when an existing file was replaced.
    created: bool,
}

/// The seeds' `POST /schedule` answer.
#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct ScheduledDoc {
    job_id: String,
    /// The same id, under the other seed's name.
    task_id: String,
    state: String,
}

#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct SessionCreateDoc {
    /// The model (default: the server's).
    model: Option<String>,
}

#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct SessionDoc {
    #[schema(example = "ses_0f9c2a4d783dc2aec74a934e")]
    id: String,
    /// The first line of the first message.
    title: String,
    model: String,
    created_at: String,
}

#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct SessionListDoc {
    sessions: Vec<SessionDoc>,
}

/// A session with its conversation as last sent to the model.
#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct SessionDetailDoc {
    #[serde(flatten)]
    session: SessionDoc,
    turns: u64,
    usage: serde_json::Value,
    messages: Vec<serde_json::Value>,
}

#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct MessageDoc {
    text: String,
}

#[derive(ToSchema, Serialize)]
#[allow(dead_code)]
pub struct CompactionDoc {
    replaced_messages: u64,
    tokens_before: u64,
    tokens_after: u64,
    summary: String,
}

struct Bearer;

impl Modify for Bearer {
    fn modify(&self, api: &mut utoipa::openapi::OpenApi) {
        let components = api.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "bearer",
            SecurityScheme::Http(HttpBuilder::new().scheme(HttpAuthScheme::Bearer).build()),
        );
    }
}

#[derive(OpenApi)]
#[openapi(
    info(
        title = "cordon",
        description = "Jobs and agent sessions in cordon's sandbox. Every route but /health needs `Authorization: Bearer <token>` (`cordon token create --tenant NAME`)."
    ),
    modifiers(&Bearer),
    security(("bearer" = [])),
    paths(
        crate::api::health,
        crate::api::create_job,
        crate::api::list_jobs,
        crate::api::get_job,
        crate::api::cancel_job,
        crate::api::job_events,
        crate::api::list_root,
        crate::api::get_file,
        crate::api::put_file,
        crate::api::schedule,
        crate::api::status,
        crate::api::status_by_query,
        crate::sessions::create,
        crate::sessions::list,
        crate::sessions::show,
        crate::sessions::message,
        crate::sessions::cancel,
        crate::sessions::compact,
    ),
    tags(
        (name = "jobs", description = "Queued, sandboxed jobs"),
        (name = "sessions", description = "Conversations with the agent"),
        (name = "seed", description = "The routes of cordon's original sketches"),
    )
)]
pub struct ApiDoc;

const DOCS_HTML: &str = include_str!("../ui/docs.html");
const DOCS_JS: &str = include_str!("../ui/docs.js");
const CSP: &str = "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'";

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/openapi.json", get(|| async { Json(ApiDoc::openapi()) }))
        .route(
            "/docs",
            get(|| async {
                (
                    [
                        (header::CONTENT_TYPE, "text/html; charset=utf-8"),
                        (header::CONTENT_SECURITY_POLICY, CSP),
                        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                    ],
                    DOCS_HTML,
                )
                    .into_response()
            }),
        )
        .route(
            "/docs/docs.js",
            get(|| async {
                (
                    [
                        (header::CONTENT_TYPE, "text/javascript; charset=utf-8"),
                        (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
                    ],
                    DOCS_JS,
                )
                    .into_response()
            }),
        )
}
