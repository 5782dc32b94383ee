//! The OpenAPI document (`/openapi.json`; docs.rs renders it at `/docs`).
//! The schemas below describe the JSON the handlers read and write; the
//! handlers check bodies themselves (to name every mistake), so these types
//! exist for the document only.

use std::sync::Arc;

use axum::routing::get;
use axum::{Json, Router};
use serde::Serialize;
use serde_json::{Value, json};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::{Modify, OpenApi, ToSchema};

use crate::server::Shared;

/// The limits every job kind takes, repeated in each kind's schema (a
/// shared `allOf` part would clash with the kinds' closed field lists).
macro_rules! job_kind {
    ($(#[$doc:meta])* $name:ident ($kinds:literal) { $($(#[$fdoc:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[derive(ToSchema, Serialize)]
        #[serde(deny_unknown_fields)]
        #[allow(dead_code)]
        pub struct $name {
            #[schema(pattern = $kinds)]
            kind: String,
            $($(#[$fdoc])* $field: $ty,)*
            /// Seconds before the job is killed (default 300).
            #[schema(minimum = 1, maximum = 3600)]
            timeout_secs: Option<u64>,
            /// Memory for the whole sandbox, 16M to 4G (default 512M).
            #[schema(example = "512M", pattern = "^[0-9]+[KMG]?$")]
            memory: Option<String>,
            /// How much the workspace may grow before the sandbox is
            /// stopped, 1M to the server's ceiling (default 1G, at most
            /// 8G unless the server says otherwise).
            #[schema(example = "1G", pattern = "^[0-9]+[KMG]?$")]
            disk: Option<String>,
            /// `off` (default), `loopback`, or `allow`: through cordon's
            /// broker to the hosts in `allow`, within this tenant's
            /// ceiling; never the host's network.
            #[schema(pattern = "^(off|loopback|allow)$")]
            network: Option<String>,
            /// Hosts the job may reach (implies `network` "allow"):
            /// HOST[:PORT], *.DOMAIN, IP or CIDR, or a preset (`@python`,
            /// `@node`, `@rust`, `@debian`, `@git-hosting`); empty or
            /// absent with "allow": all this tenant's ceiling allows.
            #[schema(max_items = 256, example = json!(["@python"]))]
            allow: Option<Vec<String>>,
            /// Let allowed names resolve to private addresses (if the
            /// ceiling does).
            allow_private: Option<bool>,
            /// `native` or `microvm` (a virtual machine with its own
            /// kernel); default: the server's.
            #[schema(pattern = "^(native|microvm)$")]
            backend: Option<String>,
        }
    };
}

job_kind!(
    /// `bash -c command` in the sandbox.
    ShellJobDoc("^shell$") {
        #[schema(min_length = 1)]
        command: String,
    }
);
job_kind!(
    /// A program run by python3 or node (TypeScript is transpiled first).
    CodeJobDoc("^(python|javascript|typescript)$") {
        #[schema(min_length = 1)]
        code: String,
    }
);
job_kind!(
    /// Steps run in order in one sandbox; the first failure stops them
    /// unless `continue_on_error`.
    StepsJobDoc("^steps$") {
        #[schema(min_items = 1, max_items = 100)]
        steps: Vec<StepDoc>,
        continue_on_error: Option<bool>,
        /// A virtual screen, WIDTHxHEIGHT (64 to 8192 each), for computer steps.
        #[schema(example = "1280x800", pattern = "^[0-9]+x[0-9]+$")]
        display: Option<String>,
    }
);
job_kind!(
    /// Steps on a virtual screen: shell steps launch programs, computer
    /// steps click, type and take screenshots, which are saved to the
    /// workspace as `screenshots/step-NN.png` and named in the result.
    GuiJobDoc("^gui$") {
        #[schema(min_items = 1, max_items = 100)]
        steps: Vec<StepDoc>,
        continue_on_error: Option<bool>,
        /// WIDTHxHEIGHT, 64 to 8192 each (default 1280x800).
        #[schema(example = "1280x800", pattern = "^[0-9]+x[0-9]+$")]
        display: Option<String>,
    }
);
job_kind!(
    /// A task for the agent, with the server's model unless `model` is set.
    AgentJobDoc("^agent$") {
        #[schema(min_length = 1)]
        prompt: String,
        model: Option<String>,
        #[schema(minimum = 1, maximum = 200)]
        max_steps: Option<u32>,
        /// A virtual screen, WIDTHxHEIGHT (64 to 8192 each): the agent then
        /// has the computer tool, and the desktop can be watched live.
        #[schema(example = "1280x800", pattern = "^[0-9]+x[0-9]+$")]
        display: Option<String>,
    }
);

/// A job to queue; `kind` decides its fields. Unknown fields are refused.
#[derive(ToSchema, Serialize)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum JobRequestDoc {
    Shell(ShellJobDoc),
    Code(CodeJobDoc),
    Steps(StepsJobDoc),
    Gui(GuiJobDoc),
    Agent(AgentJobDoc),
}

#[derive(ToSchema, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct CommandStepDoc {
    #[schema(pattern = "^shell$")]
    tool: String,
    #[schema(min_length = 1)]
    command: String,
}

#[derive(ToSchema, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct CodeStepDoc {
    #[schema(pattern = "^(python|javascript|typescript)$")]
    tool: String,
    #[schema(min_length = 1)]
    code: String,
}

#[derive(ToSchema, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct WriteStepDoc {
    #[schema(pattern = "^write_file$")]
    tool: String,
    #[schema(min_length = 1)]
    path: String,
    content: String,
}

#[derive(ToSchema, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct ReadStepDoc {
    #[schema(pattern = "^read_file$")]
    tool: String,
    #[schema(min_length = 1)]
    path: String,
}

/// An action of the computer tool (Anthropic's computer-use action set).
#[derive(ToSchema, Serialize)]
#[serde(deny_unknown_fields)]
#[allow(dead_code)]
pub struct ComputerStepDoc {
    #[schema(pattern = "^computer$")]
    tool: String,
    #[schema(
        pattern = "^(screenshot|left_click|right_click|middle_click|double_click|triple_click|mouse_move|left_click_drag|left_mouse_down|left_mouse_up|scroll|key|type|hold_key|wait|cursor_position|zoom)$"
    )]
    action: String,
    /// [x, y] in screenshot pixels.
    #[schema(min_items = 2, max_items = 2)]
    coordinate: Option<Vec<i64>>,
    #[schema(min_items = 2, max_items = 2)]
    start_coordinate: Option<Vec<i64>>,
    /// Text to type, key names (`ctrl+s`), or modifiers held during a click.
    text: Option<String>,
    #[schema(pattern = "^(up|down|left|right)$")]
    scroll_direction: Option<String>,
    #[schema(minimum = 1, maximum = 50)]
    scroll_amount: Option<u32>,
    #[schema(minimum = 0, maximum = 60)]
    duration: Option<f64>,
    /// [x0, y0, x1, y1] for `zoom`.
    #[schema(min_items = 4, max_items = 4)]
    region: Option<Vec<i64>>,
}

/// One step of a `steps` job (`kind` may stand for `tool`).
#[derive(ToSchema, Serialize)]
#[serde(untagged)]
#[allow(dead_code)]
pub enum StepDoc {
    Shell(CommandStepDoc),
    Code(CodeStepDoc),
    WriteFile(WriteStepDoc),
    ReadFile(ReadStepDoc),
    Computer(ComputerStepDoc),
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
    /// RFC 3339: when the finished job's workspace was removed (the
    /// server's `--keep-workspaces`); its files then answer 410.
    workspace_removed_at: Option<String>,
    /// What it does, one line: its command, code or prompt (first line,
    /// at most 120 characters and an ellipsis), or its steps.
    #[schema(example = "pip install flask && python3 app.py")]
    preview: String,
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
    /// `steps` and `gui`: `{"steps": [...]}`, one per step in order, each
    /// with `index`, `tool`, `state` (`skipped` for a step a failure kept
    /// from running), `exit_code`, `error`, `duration_ms`, its own
    /// `stdout` and `stderr` (64 KiB each at most, with truncation flags)
    /// and, for a computer step, `screenshot`. `agent`: the final text,
    /// usage and cost.
    result: Option<serde_json::Value>,
    /// The request as stored, with defaults filled in.
    request: serde_json::Value,
    /// `true` while the job's desktop can be watched at
    /// `/v1/jobs/{id}/vnc` (a running job with a display).
    live_desktop: bool,
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
    /// A virtual screen, WIDTHxHEIGHT (64 to 8192 each): the agent then has
    /// the computer tool, and `/v1/sessions/{id}/vnc` shows the desktop.
    #[schema(example = "1280x800", pattern = "^[0-9]+x[0-9]+$")]
    display: Option<String>,
    /// As a job's: `off` (default), `loopback` or `allow`.
    #[schema(pattern = "^(off|loopback|allow)$")]
    network: Option<String>,
    /// As a job's: the hosts, within this tenant's ceiling.
    #[schema(max_items = 256, example = json!(["@python"]))]
    allow: Option<Vec<String>>,
    allow_private: Option<bool>,
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
    /// The session's virtual screen, if it was created with one.
    display: Option<String>,
    /// `true` while its desktop is up (the session is awake).
    live_desktop: bool,
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
        crate::api::delete_job,
        crate::api::job_events,
        crate::network::get_job_network,
        crate::network::put_job_network,
        crate::desktop::job_vnc,
        crate::api::list_root,
        crate::api::get_file,
        crate::api::put_file,
        crate::api::schedule,
        crate::api::status,
        crate::api::status_by_query,
        crate::sessions::create,
        crate::sessions::list,
        crate::sessions::show,
        crate::sessions::delete,
        crate::sessions::message,
        crate::sessions::cancel,
        crate::sessions::compact,
        crate::sessions::vnc,
        crate::sessions::network::get_network,
        crate::sessions::files::list_files,
        crate::sessions::files::get_file,
        crate::sessions::files::put_file,
        crate::sessions::network::put_network,
    ),
    tags(
        (name = "jobs", description = "Queued, sandboxed jobs"),
        (name = "sessions", description = "Conversations with the agent"),
        (name = "seed", description = "The routes of cordon's original sketches"),
    )
)]
pub struct ApiDoc;

/// Links from an operation's answer to the operations that take the id it
/// returns: how a client (or a fuzzer) follows a job from creation on.
fn add_links(doc: &mut Value) {
    let links = |ops: &[(&str, &str, &str)]| -> Value {
        ops.iter()
            .map(|(op, param, from)| {
                (
                    op.to_string(),
                    json!({"operationId": op, "parameters": {*param: from}}),
                )
            })
            .collect::<serde_json::Map<_, _>>()
            .into()
    };
    let job = "$response.body#/id";
    let job_links = links(&[
        ("get_job", "id", job),
        ("cancel_job", "id", job),
        ("job_events", "id", job),
        ("list_root", "id", job),
        ("get_file", "id", job),
        ("put_file", "id", job),
        ("status", "id", job),
        ("status_by_query", "task_id", job),
    ]);
    let scheduled = links(&[
        ("status", "id", "$response.body#/job_id"),
        ("get_job", "id", "$response.body#/job_id"),
    ]);
    let session = "$response.body#/id";
    let session_links = links(&[
        ("show", "id", session),
        ("message", "id", session),
        ("cancel", "id", session),
        ("compact", "id", session),
    ]);
    for (path, method, status, l) in [
        ("/v1/jobs", "post", "202", job_links),
        ("/schedule", "post", "202", scheduled),
        ("/v1/sessions", "post", "201", session_links),
    ] {
        if let Some(r) = doc
            .pointer_mut(&format!(
                "/paths/{}/{method}/responses/{status}",
                path.replace('/', "~1")
            ))
            .and_then(Value::as_object_mut)
        {
            r.insert("links".into(), l);
        }
    }
}

/// The document served at /openapi.json.
pub fn document() -> Value {
    let mut doc = serde_json::to_value(ApiDoc::openapi()).unwrap_or_default();
    add_links(&mut doc);
    doc
}

pub fn routes() -> Router<Arc<Shared>> {
    Router::new().route("/openapi.json", get(|| async { Json(document()) }))
}
