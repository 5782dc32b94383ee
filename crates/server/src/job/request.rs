//! The job a client posts, which is also the job as stored: one serde type
//! per kind, whose derives give both the wire format and its OpenAPI
//! schema.
//!
//! Rules:
//! - Every struct refuses unknown fields: a misspelt option must not be
//!   silently ignored.
//! - A mistake is named by its path (`` `steps[2].command` ``). serde loses
//!   the path inside an internally tagged enum, so the two tagged types
//!   here ([`JobRequest`] by `kind`, [`Step`] by `tool`) read their tag
//!   first and then the variant's own struct through [`read`].
//! - What a type can check alone it checks while deserializing (a blank
//!   command, a size, a host rule); what depends on the server's bounds is
//!   checked once, by [`JobRequest::check`].

use serde::de::{DeserializeOwned, Error as _, Visitor};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{Map, Value};
use utoipa::openapi::RefOr;
use utoipa::openapi::schema::{ObjectBuilder, OneOfBuilder, Schema, Type};
use utoipa::{PartialSchema, ToSchema};

use super::{ImageName, RepoUrl};

/// Reads a `T` from JSON, naming the field at fault: `` `steps[2].command`:
/// invalid type: integer `5`, expected a string ``.
pub fn read<T: DeserializeOwned>(value: Value) -> Result<T, String> {
    serde_path_to_error::deserialize(value).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner().to_string();
        if path == "." {
            return inner;
        }
        // A tagged type's own error already starts with its inner path:
        // join the two into one.
        match inner.strip_prefix('`').and_then(|r| r.split_once("`: ")) {
            Some((rest, msg)) => format!("`{path}.{rest}`: {msg}"),
            None => format!("`{path}`: {inner}"),
        }
    })
}

pub fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn string_schema(description: &str, pattern: Option<&str>, example: &str) -> ObjectBuilder {
    ObjectBuilder::new()
        .schema_type(Type::String)
        .description(Some(description))
        .pattern(pattern)
        .examples([Value::String(example.into())])
}

/// A string with something in it besides white space.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String")]
pub struct Text(String);

impl TryFrom<String> for Text {
    type Error = &'static str;
    fn try_from(s: String) -> Result<Text, &'static str> {
        if s.trim().is_empty() {
            Err("must not be empty")
        } else {
            Ok(Text(s))
        }
    }
}

impl std::ops::Deref for Text {
    type Target = str;
    fn deref(&self) -> &str {
        &self.0
    }
}

impl From<Text> for String {
    fn from(t: Text) -> String {
        t.0
    }
}

impl PartialSchema for Text {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .min_length(Some(1))
            .description(Some("Not empty or only white space."))
            .into()
    }
}
impl ToSchema for Text {}

/// A number of bytes, written as a number or with a unit (`512M`, `2G`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Size, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Size;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str("a size such as \"512M\" or \"2G\", or a number of bytes")
            }
            fn visit_u64<E: serde::de::Error>(self, n: u64) -> Result<Size, E> {
                Ok(Size(n))
            }
            fn visit_str<E: serde::de::Error>(self, s: &str) -> Result<Size, E> {
                cordon_sandbox::parse_size(s).map(Size).map_err(E::custom)
            }
        }
        d.deserialize_any(V)
    }
}

impl PartialSchema for Size {
    fn schema() -> RefOr<Schema> {
        OneOfBuilder::new()
            .item(string_schema(
                "With a unit: K, M or G (powers of 1024).",
                Some("^[0-9]+[KMGkmg]?$"),
                "512M",
            ))
            .item(
                ObjectBuilder::new()
                    .schema_type(Type::Integer)
                    .minimum(Some(0))
                    .description(Some("Bytes.")),
            )
            .description(Some("A size: \"512M\", \"2G\", or bytes."))
            .into()
    }
}
impl ToSchema for Size {}

/// A virtual screen, `WIDTHxHEIGHT`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct Screen(pub cordon_sandbox::Display);

impl TryFrom<String> for Screen {
    type Error = String;
    fn try_from(s: String) -> Result<Screen, String> {
        s.parse().map(Screen)
    }
}

impl From<Screen> for String {
    fn from(s: Screen) -> String {
        s.0.to_string()
    }
}

impl PartialSchema for Screen {
    fn schema() -> RefOr<Schema> {
        string_schema(
            "WIDTHxHEIGHT in pixels, 64 to 8192 each.",
            Some("^[0-9]+x[0-9]+$"),
            "1280x800",
        )
        .into()
    }
}
impl ToSchema for Screen {}

/// One entry of an `allow` list, checked as the broker will read it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct AllowEntry(String);

impl TryFrom<String> for AllowEntry {
    type Error = String;
    fn try_from(s: String) -> Result<AllowEntry, String> {
        s.parse::<cordon_net::Entry>()
            .map(|_| AllowEntry(s))
            .map_err(|e| e.to_string())
    }
}

impl AllowEntry {
    /// An entry the server wrote itself (an expanded preset's rule); it is
    /// checked again whenever the stored job is read.
    pub(crate) fn checked(rule: String) -> AllowEntry {
        AllowEntry(rule)
    }
}

impl From<AllowEntry> for String {
    fn from(e: AllowEntry) -> String {
        e.0
    }
}

impl PartialSchema for AllowEntry {
    fn schema() -> RefOr<Schema> {
        string_schema(
            "HOST[:PORT], *.DOMAIN, IP or IP/CIDR, or a preset: @python, @node, @rust, @debian, @git-hosting.",
            None,
            "@python",
        )
        .into()
    }
}
impl ToSchema for AllowEntry {}

/// A job's network.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase", try_from = "String")]
pub enum NetworkMode {
    /// No interface up (the default).
    Off,
    /// The job's processes may talk to each other.
    Loopback,
    /// Through cordon's broker to the hosts in `allow`, within the tenant's
    /// ceiling; jobs never get the host's network.
    Allow,
}

impl TryFrom<String> for NetworkMode {
    type Error = String;
    fn try_from(s: String) -> Result<NetworkMode, String> {
        match s.as_str() {
            "off" => Ok(NetworkMode::Off),
            "loopback" => Ok(NetworkMode::Loopback),
            "allow" => Ok(NetworkMode::Allow),
            "full" | "host" => Err(
                "jobs and sessions never get the host's network; use \"allow\" with the hosts in `allow`"
                    .into(),
            ),
            _ => Err(format!(
                "expected \"off\", \"loopback\" or \"allow\", not {s:?}"
            )),
        }
    }
}

impl From<NetworkMode> for cordon_sandbox::Network {
    fn from(m: NetworkMode) -> Self {
        match m {
            NetworkMode::Off => cordon_sandbox::Network::Off,
            NetworkMode::Loopback => cordon_sandbox::Network::Loopback,
            NetworkMode::Allow => cordon_sandbox::Network::Allow,
        }
    }
}

impl TryFrom<cordon_sandbox::Network> for NetworkMode {
    type Error = cordon_sandbox::Network;
    fn try_from(n: cordon_sandbox::Network) -> Result<Self, Self::Error> {
        match n {
            cordon_sandbox::Network::Off => Ok(NetworkMode::Off),
            cordon_sandbox::Network::Loopback => Ok(NetworkMode::Loopback),
            cordon_sandbox::Network::Allow => Ok(NetworkMode::Allow),
            other => Err(other),
        }
    }
}

/// The isolation backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    /// Namespaces, seccomp, Landlock and cgroups on the host's kernel.
    Native,
    /// A virtual machine with its own kernel.
    Microvm,
}

impl From<Backend> for cordon_sandbox::BackendKind {
    fn from(b: Backend) -> Self {
        match b {
            Backend::Native => cordon_sandbox::BackendKind::Native,
            Backend::Microvm => cordon_sandbox::BackendKind::Microvm,
        }
    }
}

impl From<cordon_sandbox::BackendKind> for Backend {
    fn from(b: cordon_sandbox::BackendKind) -> Self {
        match b {
            cordon_sandbox::BackendKind::Native => Backend::Native,
            cordon_sandbox::BackendKind::Microvm => Backend::Microvm,
        }
    }
}

/// What every kind takes besides its own fields, gathered.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Limits {
    pub timeout_secs: Option<u64>,
    pub memory: Option<Size>,
    pub disk: Option<Size>,
    pub network: Option<NetworkMode>,
    pub allow: Option<Vec<AllowEntry>>,
    pub allow_private: Option<bool>,
    pub backend: Option<Backend>,
    pub repo: Option<RepoUrl>,
    pub image: Option<ImageName>,
}

/// A job kind's struct: its own fields, then the limits every kind takes.
/// They are repeated in each struct rather than flattened in, because
/// serde can neither refuse unknown fields nor name a wrong field's path
/// through `flatten`.
macro_rules! job_kind {
    ($(#[$doc:meta])* $name:ident { $($(#[$fdoc:meta])* $field:ident : $ty:ty),* $(,)? }) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
        #[serde(deny_unknown_fields)]
        pub struct $name {
            $($(#[$fdoc])* pub $field: $ty,)*
            /// Seconds before the job is killed: 1 up to the server's
            /// maximum (default 300, at most 3600 unless the server says
            /// otherwise).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(minimum = 1, example = 60)]
            pub timeout_secs: Option<u64>,
            /// Memory for the whole sandbox, 16M up to the server's maximum
            /// (default 512M, at most 4G unless the server says otherwise).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub memory: Option<Size>,
            /// How much the workspace may grow before the sandbox is
            /// stopped, 1M up to the server's maximum (default 1G, at most
            /// 8G unless the server says otherwise).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub disk: Option<Size>,
            /// `off` (the default; `allow` when `allow` is given),
            /// `loopback`, or `allow`.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub network: Option<NetworkMode>,
            /// Hosts the job may reach (implies `network` "allow"), within
            /// the tenant's ceiling; empty or absent with "allow": all the
            /// ceiling allows. At most 256 entries.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            #[schema(max_items = 256)]
            pub allow: Option<Vec<AllowEntry>>,
            /// Let allowed names resolve to private addresses (if the
            /// ceiling does).
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub allow_private: Option<bool>,
            /// Default: the server's.
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub backend: Option<Backend>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub repo: Option<RepoUrl>,
            #[serde(default, skip_serializing_if = "Option::is_none")]
            pub image: Option<ImageName>,
        }

        impl $name {
            #[allow(clippy::too_many_arguments)]
            pub fn new($($field: $ty),*) -> Self {
                $name {
                    $($field,)*
                    timeout_secs: None,
                    memory: None,
                    disk: None,
                    network: None,
                    allow: None,
                    allow_private: None,
                    backend: None,
                    repo: None,
                    image: None,
                }
            }

            pub fn limits(&self) -> Limits {
                Limits {
                    timeout_secs: self.timeout_secs,
                    memory: self.memory,
                    disk: self.disk,
                    network: self.network,
                    allow: self.allow.clone(),
                    allow_private: self.allow_private,
                    backend: self.backend,
                    repo: self.repo.clone(),
                    image: self.image.clone(),
                }
            }

            pub fn with_limits(mut self, l: Limits) -> Self {
                self.timeout_secs = l.timeout_secs;
                self.memory = l.memory;
                self.disk = l.disk;
                self.network = l.network;
                self.allow = l.allow;
                self.allow_private = l.allow_private;
                self.backend = l.backend;
                self.repo = l.repo;
                self.image = l.image;
                self
            }
        }
    };
}

job_kind!(
    /// `bash -c command` in the sandbox.
    ShellJob {
        #[schema(example = "python3 --version")]
        command: Text,
    }
);

job_kind!(
    /// A program run by python3 or node (TypeScript is transpiled first).
    CodeJob {
        #[schema(example = "print(sum(range(10)))")]
        code: Text,
    }
);

job_kind!(
    /// Steps run in order in one sandbox; the first failure stops them
    /// unless `continue_on_error`. A `gui` job's steps run on a virtual
    /// screen: shell steps launch programs, computer steps click, type and
    /// take screenshots (saved as `screenshots/step-NN.png`).
    StepsJob {
        /// 1 to 100 steps.
        #[schema(min_items = 1, max_items = 100)]
        steps: Vec<Step>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        continue_on_error: Option<bool>,
        /// A virtual screen, for computer steps; a `gui` job's default is
        /// 1280x800.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        display: Option<Screen>,
    }
);

job_kind!(
    /// A task for the agent, with the server's model unless `model` is set.
    AgentJob {
        #[schema(example = "Write fizzbuzz.py and run it for 1 to 15")]
        prompt: Text,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        model: Option<String>,
        /// Model turns at most, 1 to 200.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        #[schema(minimum = 1, maximum = 200)]
        max_steps: Option<u32>,
        /// A virtual screen: the agent then has the computer tool, and the
        /// desktop can be watched live.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        display: Option<Screen>,
        /// With `repo`: the model may push the job's branch (`git_push`)
        /// and open a pull request (`create_pull_request`) with the
        /// tenant's stored login. Without it, both refuse; `git_commit`
        /// is always there.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        allow_push: Option<bool>,
    }
);

job_kind!(
    /// An image built from a Dockerfile and kept as one of the tenant's
    /// own under `name` (`GET /v1/images`). Every `RUN` runs in a sandbox
    /// with the job's memory and network (none unless `allow`); `disk`
    /// bounds what one step may add. `FROM` names an image as a job would
    /// (the catalog's, or the tenant's own), or `scratch`. The context is
    /// `context`, or the repository of `repo`, or nothing.
    BuildJob {
        /// What the image is kept as; an image of the tenant's of that
        /// name is replaced.
        #[schema(example = "my-env:1")]
        name: ImageName,
        /// The Dockerfile's text; default: `Dockerfile` in the context.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dockerfile: Option<Text>,
        /// The build context: a tar archive (plain or gzip), in base64.
        /// Its size is bounded by the server's largest request; a larger
        /// one can come from `repo`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        context: Option<ContextArchive>,
        /// Values for the Dockerfile's `ARG`s.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        build_args: Option<std::collections::BTreeMap<String, String>>,
        /// The stage to build; default: the last.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        target: Option<String>,
        /// Run every step again rather than take it from the cache.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        no_cache: Option<bool>,
    }
);

/// A build's context as a request carries it: a tar archive in base64,
/// checked to decode when the request is read.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct ContextArchive(String);

impl TryFrom<String> for ContextArchive {
    type Error = String;
    fn try_from(s: String) -> Result<ContextArchive, String> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(s.as_bytes())
            .map_err(|e| format!("not base64: {e}"))?;
        Ok(ContextArchive(s))
    }
}

impl From<ContextArchive> for String {
    fn from(c: ContextArchive) -> String {
        c.0
    }
}

impl ContextArchive {
    /// The archive's bytes.
    pub fn bytes(&self) -> Vec<u8> {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD
            .decode(self.0.as_bytes())
            .unwrap_or_default()
    }
}

impl PartialSchema for ContextArchive {
    fn schema() -> RefOr<Schema> {
        ObjectBuilder::new()
            .schema_type(Type::String)
            .content_encoding("base64")
            .description(Some(
                "A tar archive (plain or gzip) of the build context, in base64 \
                 (`tar -cz -C DIR . | base64 -w0`).",
            ))
            .into()
    }
}
impl ToSchema for ContextArchive {}

/// A job to run; `kind` decides its fields. Unknown fields are refused.
/// `kind` may be left out when `steps` is given (the shape of the compatibility route `POST /schedule`).
///
/// The one declaration of the job kinds: [`JobKind`] is derived from it,
/// and every `match` on either names each kind, so the compiler lists what
/// a new one must add (here, in `super`'s check and `JobSpec`, and in the
/// runner).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema, strum::EnumDiscriminants)]
#[serde(tag = "kind", rename_all = "snake_case")]
#[strum_discriminants(
    name(JobKind),
    derive(
        Hash,
        Serialize,
        Deserialize,
        ToSchema,
        strum::EnumIter,
        strum::IntoStaticStr,
        strum::EnumString
    ),
    serde(rename_all = "snake_case"),
    strum(serialize_all = "snake_case"),
    doc = "What a job does, by kind: `kind` of a [`JobRequest`]."
)]
pub enum JobRequest {
    Shell(#[schema(inline)] ShellJob),
    Python(#[schema(inline)] CodeJob),
    Javascript(#[schema(inline)] CodeJob),
    Typescript(#[schema(inline)] CodeJob),
    Steps(#[schema(inline)] StepsJob),
    Gui(#[schema(inline)] StepsJob),
    Agent(#[schema(inline)] AgentJob),
    Build(#[schema(inline)] BuildJob),
}

impl<'de> Deserialize<'de> for JobRequest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        JobRequest::from_json(Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

impl JobKind {
    /// Every kind, in the order the API lists them.
    pub fn all() -> impl Iterator<Item = JobKind> {
        <JobKind as strum::IntoEnumIterator>::iter()
    }

    pub fn as_str(self) -> &'static str {
        self.into()
    }

    pub fn parse(s: &str) -> Option<JobKind> {
        s.parse().ok()
    }

    /// The kinds as a sentence lists them: `shell, python, … or build`.
    pub fn listed() -> String {
        let names: Vec<&str> = Self::all().map(Self::as_str).collect();
        match names.split_last() {
            Some((last, rest)) if !rest.is_empty() => format!("{} or {last}", rest.join(", ")),
            _ => names.concat(),
        }
    }

    /// The example `/docs` offers for this kind: a summary and a job.
    pub fn example(self) -> (&'static str, Value) {
        use serde_json::json;
        match self {
            JobKind::Shell => (
                "A shell command",
                json!({"kind": "shell", "command": "echo hello from the sandbox && uname -a", "timeout_secs": 60}),
            ),
            JobKind::Python => (
                "Python code",
                json!({"kind": "python", "code": "import sys\nprint(sys.version)", "memory": "256M"}),
            ),
            JobKind::Javascript => (
                "JavaScript on node",
                json!({"kind": "javascript", "code": "console.log([1, 2, 3].map(x => x * 2))"}),
            ),
            JobKind::Typescript => (
                "TypeScript, transpiled",
                json!({"kind": "typescript", "code": "const n: number = 6 * 7;\nconsole.log(n)"}),
            ),
            JobKind::Steps => (
                "Steps in one sandbox",
                json!({"kind": "steps", "steps": [
                    {"tool": "write_file", "path": "hello.py", "content": "print('hi')\n"},
                    {"tool": "shell", "command": "python3 hello.py"},
                    {"tool": "read_file", "path": "hello.py"}]}),
            ),
            JobKind::Gui => (
                "A program on a virtual screen",
                json!({"kind": "gui", "display": "1024x768", "steps": [
                    {"tool": "shell", "command": "xterm &"},
                    {"tool": "computer", "action": "wait", "duration": 1},
                    {"tool": "computer", "action": "screenshot"}]}),
            ),
            JobKind::Agent => (
                "A task for the agent",
                json!({"kind": "agent", "prompt": "Write fizzbuzz.py, run it for 1 to 15 and show the output", "max_steps": 20}),
            ),
            JobKind::Build => (
                "An image built from a Dockerfile, kept as one of yours",
                json!({"kind": "build", "name": "py-tools:1", "dockerfile": "FROM debian:bookworm\nRUN apt-get update && apt-get install -y --no-install-recommends python3-pip\nWORKDIR /workspace", "allow": ["@debian"], "timeout_secs": 900}),
            ),
        }
    }
}

impl JobRequest {
    /// Reads a posted body, naming what is wrong.
    pub fn from_json(value: Value) -> Result<JobRequest, String> {
        let Value::Object(mut fields) = value else {
            return Err(format!(
                "a job must be a JSON object, not {}",
                type_name(&value)
            ));
        };
        let kind = match fields.remove("kind") {
            Some(k) => read::<JobKind>(k).map_err(|e| format!("`kind`: {e}"))?,
            None if fields.contains_key("steps") => JobKind::Steps,
            None => return Err(format!("a job needs `kind`: {}", JobKind::listed())),
        };
        let fields = Value::Object(fields);
        Ok(match kind {
            JobKind::Shell => JobRequest::Shell(read(fields)?),
            JobKind::Python => JobRequest::Python(read(fields)?),
            JobKind::Javascript => JobRequest::Javascript(read(fields)?),
            JobKind::Typescript => JobRequest::Typescript(read(fields)?),
            JobKind::Steps => JobRequest::Steps(read(fields)?),
            JobKind::Gui => JobRequest::Gui(read(fields)?),
            JobKind::Agent => JobRequest::Agent(read(fields)?),
            JobKind::Build => JobRequest::Build(read(fields)?),
        })
    }

    pub fn kind(&self) -> JobKind {
        self.into()
    }

    /// Whether the job's sandbox gets a virtual screen (a `gui` job's by
    /// default).
    pub fn has_display(&self) -> bool {
        match self {
            JobRequest::Gui(_) => true,
            JobRequest::Steps(j) => j.display.is_some(),
            JobRequest::Agent(j) => j.display.is_some(),
            JobRequest::Shell(_)
            | JobRequest::Python(_)
            | JobRequest::Javascript(_)
            | JobRequest::Typescript(_)
            | JobRequest::Build(_) => false,
        }
    }

    pub fn limits(&self) -> Limits {
        match self {
            JobRequest::Shell(j) => j.limits(),
            JobRequest::Python(j) | JobRequest::Javascript(j) | JobRequest::Typescript(j) => {
                j.limits()
            }
            JobRequest::Steps(j) | JobRequest::Gui(j) => j.limits(),
            JobRequest::Agent(j) => j.limits(),
            JobRequest::Build(j) => j.limits(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ShellStep {
    #[schema(example = "ls -la")]
    pub command: Text,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct CodeStep {
    #[schema(example = "print('hi')")]
    pub code: Text,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct WriteStep {
    /// Relative to the workspace; parents are created.
    #[schema(example = "notes/todo.txt")]
    pub path: Text,
    pub content: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct ReadStep {
    /// Relative to the workspace; its bytes go to the step's stdout.
    #[schema(example = "notes/todo.txt")]
    pub path: Text,
}

/// An action of the computer tool (Anthropic's computer-use action set),
/// checked by the tool itself; its schema is the tool's own.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(transparent)]
pub struct ComputerAction(pub Map<String, Value>);

impl<'de> Deserialize<'de> for ComputerAction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let args = Map::deserialize(d)?;
        cordon_tools::computer::check(&Value::Object(args.clone())).map_err(D::Error::custom)?;
        Ok(ComputerAction(args))
    }
}

impl PartialSchema for ComputerAction {
    fn schema() -> RefOr<Schema> {
        // The tool's schema is a JSON Schema object written by hand for
        // the model; it is also a valid OpenAPI schema.
        serde_json::from_value(cordon_tools::computer::schema()).unwrap_or_default()
    }
}
impl ToSchema for ComputerAction {}

/// One step; `tool` decides its fields (`kind` may stand for `tool`).
#[derive(Debug, Clone, PartialEq, Serialize, ToSchema)]
#[serde(tag = "tool", rename_all = "snake_case")]
pub enum Step {
    Shell(#[schema(inline)] ShellStep),
    Python(#[schema(inline)] CodeStep),
    Javascript(#[schema(inline)] CodeStep),
    Typescript(#[schema(inline)] CodeStep),
    WriteFile(#[schema(inline)] WriteStep),
    ReadFile(#[schema(inline)] ReadStep),
    Computer(ComputerAction),
}

/// A step's `tool`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
enum StepTool {
    Shell,
    Python,
    Javascript,
    Typescript,
    WriteFile,
    ReadFile,
    Computer,
}

const TOOLS: &str = "shell, python, javascript, typescript, write_file, read_file or computer";

impl<'de> Deserialize<'de> for Step {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Step::from_json(Value::deserialize(d)?).map_err(D::Error::custom)
    }
}

impl Step {
    fn from_json(value: Value) -> Result<Step, String> {
        let Value::Object(mut fields) = value else {
            return Err(format!(
                "a step must be a JSON object, not {}",
                type_name(&value)
            ));
        };
        let tool = match (fields.remove("tool"), fields.remove("kind")) {
            (Some(t), None) => read::<StepTool>(t).map_err(|e| format!("`tool`: {e}"))?,
            (None, Some(t)) => read::<StepTool>(t).map_err(|e| format!("`kind`: {e}"))?,
            (Some(_), Some(_)) => return Err("a step takes `tool` or `kind`, not both".into()),
            (None, None) => return Err(format!("a step needs `tool`: {TOOLS}")),
        };
        let fields = Value::Object(fields);
        Ok(match tool {
            StepTool::Shell => Step::Shell(read(fields)?),
            StepTool::Python => Step::Python(read(fields)?),
            StepTool::Javascript => Step::Javascript(read(fields)?),
            StepTool::Typescript => Step::Typescript(read(fields)?),
            StepTool::WriteFile => Step::WriteFile(read(fields)?),
            StepTool::ReadFile => Step::ReadFile(read(fields)?),
            StepTool::Computer => Step::Computer(read(fields)?),
        })
    }

    /// The tool's name, as results and events show it.
    pub fn tool(&self) -> &'static str {
        match self {
            Step::Shell(_) => "shell",
            Step::Python(_) => "python",
            Step::Javascript(_) => "javascript",
            Step::Typescript(_) => "typescript",
            Step::WriteFile(_) => "write_file",
            Step::ReadFile(_) => "read_file",
            Step::Computer(_) => "computer",
        }
    }
}
