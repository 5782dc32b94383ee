//! The tools a cordon model calls: one module per tool, each holding its
//! JSON schema beside its implementation. No model and no UI live here; the
//! agent loop hands a tool the model's JSON arguments and a [`ToolContext`]
//! for the conversation, and shows the model the [`ToolOutput`]'s text.
//!
//! Everything runs in or beneath the conversation's sandbox session:
//! commands inside the sandbox, file access on the host strictly beneath
//! the workspace directory that the sandbox sees as `/workspace`.
//!
//! ```no_run
//! # async fn demo(sandbox: cordon_sandbox::Sandbox) {
//! use cordon_tools::{ToolContext, Toolbox};
//! let ctx = ToolContext::new(sandbox, "/tmp/work");
//! let tools = Toolbox::standard();
//! let out = tools
//!     .call(&ctx, "bash", serde_json::json!({"command": "echo hi"}))
//!     .await;
//! assert!(!out.is_error);
//! # }
//! ```

pub mod apply_patch;
pub mod attach;
pub mod bash;
pub mod computer;
pub mod edit_file;
pub mod kernel;
pub mod list_dir;
pub mod read_file;
pub mod run_code;
pub mod screen;
pub mod search_files;
pub mod update_plan;
pub mod web_fetch;
pub mod write_file;

pub mod args;
pub mod label;
mod net;
mod output;
pub mod walk;
mod workspace;

pub use cordon_sandbox::{Accel, BackendKind, Display, parse_size};
pub use output::{HeadTail, plural, printable, printable_lines, unprintable};
pub use workspace::{Workspace, WorkspaceError, WsPath, beneath};

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;

use serde_json::Value;

/// What a tool returns. `text` is exactly what the model sees.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolOutput {
    pub text: String,
    /// The call failed (bad arguments, a refused path, a command that could
    /// not run). A command that ran and exited non-zero is not an error: the
    /// exit code is in the text.
    pub is_error: bool,
    /// Machine-readable details for front ends (exit codes, diffs, counts).
    pub structured: Option<Value>,
    /// Images for the model (screenshots), after `text`.
    pub images: Vec<Image>,
    /// The model's new plan (`update_plan`), for the front ends to show.
    /// Boxed: every other result carries none.
    pub plan: Option<Box<update_plan::Plan>>,
}

/// An image a tool returns to the model.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct Image {
    /// `image/png`.
    pub media_type: String,
    /// The bytes, in base64.
    pub data: String,
}

/// What the model is told when its sandbox was stopped for outgrowing its
/// disk budget.
pub fn disk_stopped(stop: &cordon_sandbox::DiskStop) -> String {
    format!(
        "{stop}. Everything running in it was killed, and no command can run in this session any more; \
         the files written so far are still in the workspace. Do not retry: tell the user, who can \
         delete large files from the workspace (build outputs, downloads, caches) and start again, \
         or allow more with a larger disk budget (`--disk`, or a job's `disk`)."
    )
}

impl ToolOutput {
    /// The result of a tool whose sandbox was stopped for its disk budget.
    pub fn disk_stopped(stop: &cordon_sandbox::DiskStop) -> Self {
        ToolOutput::error(disk_stopped(stop)).with_structured(serde_json::json!({
            "disk_exceeded": true,
            "disk_budget_bytes": stop.budget,
            "disk_growth_bytes": stop.growth,
        }))
    }

    /// A result the model reads as `text`; `is_error`: the call failed.
    pub fn new(text: impl Into<String>, is_error: bool) -> Self {
        ToolOutput {
            text: text.into(),
            is_error,
            structured: None,
            images: Vec::new(),
            plan: None,
        }
    }

    pub fn ok(text: impl Into<String>) -> Self {
        Self::new(text, false)
    }

    pub fn error(text: impl Into<String>) -> Self {
        Self::new(text, true)
    }

    pub fn with_image(mut self, image: Image) -> Self {
        self.images.push(image);
        self
    }

    pub fn with_plan(mut self, plan: update_plan::Plan) -> Self {
        self.plan = Some(Box::new(plan));
        self
    }

    pub fn with_structured(mut self, value: Value) -> Self {
        self.structured = Some(value);
        self
    }
}

/// The future a tool call returns; boxed so [`Tool`] stays dyn-compatible.
pub type ToolFuture<'a> = Pin<Box<dyn Future<Output = ToolOutput> + Send + 'a>>;

/// One tool the model can call.
pub trait Tool: Send + Sync {
    fn name(&self) -> &str;
    /// Written for the model: what the tool does and when to use it.
    fn description(&self) -> &str;
    /// JSON Schema of the arguments object.
    fn input_schema(&self) -> Value;
    /// True when calls never change anything, so the agent may run several
    /// at once.
    fn read_only(&self) -> bool;
    /// Runs the tool. Never panics on bad input: invalid arguments give an
    /// error output that tells the model how to retry.
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: Value) -> ToolFuture<'a>;
    /// False once the tool can no longer work (an MCP server that died):
    /// it is then no longer offered to the model.
    fn available(&self) -> bool {
        true
    }
    /// What a call with `input` does, on one printable line for the front
    /// ends (the command, the path, …): [`label::generic`] unless the tool
    /// knows better.
    fn label(&self, input: &Value) -> String {
        label::generic(input)
    }
}

/// A tool whose arguments are a serde type. Its [`Tool`] comes with it:
/// the arguments parsed (a bad call answered with what to fix and the
/// schema), the future boxed, and the front ends' label made printable.
///
/// ```ignore
/// impl TypedTool for WriteFile {
///     const NAME: &'static str = "write_file";
///     const READ_ONLY: bool = false;
///     type Input = Input;
///     fn description(&self) -> &str { DESCRIPTION }
///     fn input_schema(&self) -> Value { schema() }
///     fn label(&self, input: &Input) -> String { input.path.clone() }
///     fn run<'a>(&'a self, ctx: &'a ToolContext, input: Input) -> ToolFuture<'a> {
///         args::blocking(Self::NAME, ctx, input, write)
///     }
/// }
/// ```
pub trait TypedTool: Send + Sync {
    /// The name the model calls it by.
    const NAME: &'static str;
    /// Calls never change anything the sandbox holds, so several may run
    /// at once, and in plan mode.
    const READ_ONLY: bool;
    /// The arguments, as the schema describes them.
    type Input: serde::de::DeserializeOwned + Send + 'static;
    /// Written for the model: what the tool does and when to use it.
    fn description(&self) -> &str;
    /// JSON Schema of [`TypedTool::Input`], with words for the model.
    fn input_schema(&self) -> Value;
    /// What a call does, for the front ends: made one printable line and
    /// bounded by the caller.
    fn label(&self, input: &Self::Input) -> String;
    /// Runs a call whose arguments parsed.
    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Self::Input) -> ToolFuture<'a>;
}

impl<T: TypedTool> Tool for T {
    fn name(&self) -> &str {
        T::NAME
    }
    fn description(&self) -> &str {
        TypedTool::description(self)
    }
    fn input_schema(&self) -> Value {
        TypedTool::input_schema(self)
    }
    fn read_only(&self) -> bool {
        T::READ_ONLY
    }
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: Value) -> ToolFuture<'a> {
        match args::parse::<T::Input>(T::NAME, &TypedTool::input_schema(self), input) {
            Ok(input) => self.run(ctx, input),
            Err(e) => Box::pin(std::future::ready(e)),
        }
    }
    fn label(&self, input: &Value) -> String {
        // Read in place (a file's whole content may be in it); a call the
        // tool would refuse is shown as the model sent it.
        // No arguments are an empty object, as `args::parse` takes them.
        let empty = Value::Object(Default::default());
        let args = if input.is_null() { &empty } else { input };
        match <T::Input as serde::Deserialize>::deserialize(args) {
            Ok(input) => label::line(&TypedTool::label(self, &input)),
            Err(_) => label::generic(input),
        }
    }
}

/// Limits that shape what the model sees.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Bytes kept from the start and from the end of each command output
    /// stream; the middle is dropped with a marker.
    pub output_head: usize,
    pub output_tail: usize,
    /// Default per-call timeout of `bash` and `run_code`.
    pub default_timeout: std::time::Duration,
    /// Longest timeout a call may ask for.
    pub max_timeout: std::time::Duration,
    /// Files larger than this are not read whole by `read_file`/`edit_file`.
    pub max_file_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            output_head: 10 * 1024,
            output_tail: 10 * 1024,
            default_timeout: std::time::Duration::from_secs(120),
            max_timeout: std::time::Duration::from_secs(600),
            max_file_bytes: 10 * 1024 * 1024,
        }
    }
}

/// Receives a running call's output as the sandbox produces it: raw bytes,
/// possibly split inside a character, before any cutting to head and tail.
pub type Progress = Arc<dyn Fn(cordon_sandbox::Stream, &[u8]) + Send + Sync>;

/// Everything a tool call needs about its conversation. Cheap to clone;
/// clones share the persistent shell and the Python kernel.
#[derive(Clone)]
pub struct ToolContext {
    pub sandbox: cordon_sandbox::Sandbox,
    /// Host path of the directory the sandbox sees as `/workspace`.
    pub workspace: PathBuf,
    pub limits: Limits,
    pub(crate) shell: Arc<bash::ShellSlot>,
    /// The Python kernel behind `run_code`, when the sandbox has one.
    pub(crate) kernel: Arc<run_code::KernelSlot>,
    /// Where `bash` and `run_code` report output while they run.
    progress: Option<Progress>,
}

impl ToolContext {
    pub fn new(sandbox: cordon_sandbox::Sandbox, workspace: impl Into<PathBuf>) -> Self {
        ToolContext {
            sandbox,
            workspace: workspace.into(),
            limits: Limits::default(),
            shell: Arc::default(),
            kernel: Arc::default(),
            progress: None,
        }
    }

    /// This context for one call whose output goes to `progress` as it
    /// arrives.
    pub fn with_progress(&self, progress: Progress) -> ToolContext {
        ToolContext {
            progress: Some(progress),
            ..self.clone()
        }
    }

    /// Where the running call's output goes, if anyone listens.
    pub(crate) fn progress(&self) -> Option<Progress> {
        self.progress.clone()
    }

    /// This context with a shell and a Python kernel of its own, started
    /// when first used: for a helper working beside the caller, whose `cd`
    /// and variables are not the caller's.
    pub fn fresh_session(&self) -> ToolContext {
        ToolContext {
            shell: Arc::default(),
            kernel: Arc::default(),
            progress: None,
            ..self.clone()
        }
    }

    /// Reports output of the running call, if anyone listens.
    pub fn report(&self, stream: cordon_sandbox::Stream, data: &[u8]) {
        if let Some(p) = &self.progress
            && !data.is_empty()
        {
            p(stream, data);
        }
    }

    pub fn with_limits(mut self, limits: Limits) -> Self {
        self.limits = limits;
        self
    }

    /// Opens the workspace root for host-side file access beneath it.
    pub(crate) fn open_workspace(&self) -> Result<Workspace, WorkspaceError> {
        Ok(Workspace::open(&self.workspace)?.with_read_only(self.sandbox.read_only()))
    }
}

/// A tool's advertisement to the model.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
    pub read_only: bool,
}

/// The registry of tools offered to a model.
#[derive(Clone, Default)]
pub struct Toolbox {
    tools: Vec<Arc<dyn Tool>>,
}

impl Toolbox {
    pub fn new() -> Self {
        Self::default()
    }

    /// The tools of a cordon agent: the sandbox's, and those that only
    /// make sense to cordon's own loop (its plan).
    pub fn agent() -> Self {
        let mut t = Toolbox::standard();
        t.register(update_plan::UpdatePlan);
        t
    }

    /// The sandbox's tools: what an outside agent gets too (`cordon mcp`).
    pub fn standard() -> Self {
        let mut t = Toolbox::new();
        t.register(bash::Bash);
        t.register(read_file::ReadFile);
        t.register(write_file::WriteFile);
        t.register(edit_file::EditFile);
        t.register(apply_patch::ApplyPatch);
        t.register(list_dir::ListDir);
        t.register(search_files::SearchFiles);
        t.register(run_code::RunCode);
        t
    }

    /// Adds a tool, replacing one of the same name.
    pub fn register(&mut self, tool: impl Tool + 'static) {
        self.register_arc(Arc::new(tool));
    }

    /// Adds a shared tool, replacing one of the same name.
    pub fn register_arc(&mut self, tool: Arc<dyn Tool>) {
        self.tools.retain(|t| t.name() != tool.name());
        self.tools.push(tool);
    }

    /// The tools that never change anything (plan mode's).
    pub fn read_only(&self) -> Toolbox {
        Toolbox {
            tools: self
                .tools
                .iter()
                .filter(|t| t.read_only())
                .cloned()
                .collect(),
        }
    }

    /// Takes a tool out, if there is one of that name.
    pub fn remove(&mut self, name: &str) {
        self.tools.retain(|t| t.name() != name);
    }

    pub fn get(&self, name: &str) -> Option<&Arc<dyn Tool>> {
        self.tools.iter().find(|t| t.name() == name)
    }

    /// What a call of `name` with `input` does, for the front ends (see
    /// [`Tool::label`]); a tool not here is labelled as any.
    pub fn label(&self, name: &str, input: &Value) -> String {
        match self.get(name) {
            Some(tool) => tool.label(input),
            None => label::generic(input),
        }
    }

    pub fn names(&self) -> Vec<&str> {
        self.tools.iter().map(|t| t.name()).collect()
    }

    /// How many tools can be offered now: cheap, to see whether
    /// [`Toolbox::specs`] would change.
    pub fn available_count(&self) -> usize {
        self.tools.iter().filter(|t| t.available()).count()
    }

    /// The tools that can be offered now (see [`Tool::available`]).
    pub fn specs(&self) -> Vec<ToolSpec> {
        self.tools
            .iter()
            .filter(|t| t.available())
            .map(|t| ToolSpec {
                name: t.name().to_string(),
                description: t.description().to_string(),
                input_schema: t.input_schema(),
                read_only: t.read_only(),
            })
            .collect()
    }

    /// Calls a tool by name; an unknown name is an error output listing the
    /// tools that exist, so the model can correct itself.
    pub async fn call(&self, ctx: &ToolContext, name: &str, input: Value) -> ToolOutput {
        match self.get(name) {
            // The host-side file tools too: what a stopped sandbox's
            // session writes must not grow the workspace further.
            Some(_) if let Some(stop) = ctx.sandbox.disk_stopped() => {
                ToolOutput::disk_stopped(&stop)
            }
            Some(tool) => {
                tracing::debug!(tool = name, "tool call");
                tool.call(ctx, input).await
            }
            None => ToolOutput::error(format!(
                "There is no tool named {name:?}. Available tools: {}.",
                self.names().join(", ")
            )),
        }
    }
}

/// The modules from the bottom up: each may use only those before it
/// (checked by `layout.rs`).
pub const LAYERS: &[&str] = &[
    "output",
    "label",
    "args",
    "net",
    "screen",
    "workspace",
    "attach",
    "bash",
    "computer",
    "kernel",
    "read_file",
    "update_plan",
    "walk",
    "web_fetch",
    "write_file",
    "apply_patch",
    "edit_file",
    "list_dir",
    "run_code",
    "search_files",
];

#[cfg(test)]
mod layout;

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn each_tool_labels_its_calls_and_a_call_it_would_refuse_as_sent() {
        let t = Toolbox::agent();
        let label = |name: &str, input: Value| t.label(name, &input);
        assert_eq!(
            label("bash", json!({"command": "cargo test\nmore"})),
            "cargo test…"
        );
        assert_eq!(label("bash", json!({"restart": true})), "(restart)");
        assert_eq!(
            label("write_file", json!({"path": "a.txt", "content": "x"})),
            "a.txt"
        );
        assert_eq!(label("list_dir", json!(null)), "/workspace");
        assert_eq!(
            label("search_files", json!({"pattern": "fn main", "path": "src"})),
            "fn main in src"
        );
        assert_eq!(
            label(
                "run_code",
                json!({"language": "python", "code": "\nprint(1)\n"})
            ),
            "python: print(1)"
        );
        let plan = json!({"plan": [{"step": "a", "status": "completed"}, {"step": "b", "status": "pending"}]});
        assert_eq!(label("update_plan", plan), "1 of 2 done");
        assert_eq!(
            Tool::label(
                &computer::Computer,
                &json!({"action": "left_click", "coordinate": [10, 20]})
            ),
            "left_click at (10, 20)"
        );
        assert_eq!(
            Tool::label(
                &computer::Computer,
                &json!({"action": "scroll", "coordinate": [1, 2], "scroll_direction": "down"})
            ),
            "scroll at (1, 2) down"
        );
        assert_eq!(
            Tool::label(
                &web_fetch::WebFetch,
                &json!({"url": "https://example.com/"})
            ),
            "https://example.com/"
        );
        // Arguments the tool would refuse: the likeliest one, as sent.
        assert_eq!(
            label("write_file", json!({"path": "a.txt", "colour": 1})),
            "a.txt"
        );
        // Model text never reaches a terminal raw, nor at any length.
        assert_eq!(
            label("bash", json!({"command": "echo \u{1b}[2J"})),
            "echo ?[2J"
        );
        let long = label("read_file", json!({"path": "x".repeat(10_000)}));
        assert_eq!(long.chars().count(), label::MAX_CHARS + 1);
        // A tool this box does not have.
        assert_eq!(label("nonesuch", json!({"query": "q"})), "q");
    }
}
