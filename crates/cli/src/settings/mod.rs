//! Layered configuration, each value remembering where it came from.
//!
//! From lowest to highest precedence: built-in defaults, the user's
//! `$XDG_CONFIG_HOME/cordon/config.toml` (`~/.config/...`), the project's
//! `.cordon/config.toml`, a `.env` file in the working directory, the
//! process environment, and the command line. The environment outranks
//! `.env` as it does for every dotenv tool: a variable set on purpose in a
//! shell beats a file. The names other agents read are honoured: `ANTHROPIC_API_KEY`,
//! `MODEL`, `MAX_TOKENS`, `SAFEDIR` (the workspace).
//!
//! The project's two files may have been written by a sandbox: unless the
//! user trusted them as they are (`cordon trust`), each key's [`Guard`]
//! decides whether they may set it (see [`trust`]).

mod keys;
mod resolved;
pub mod trust;
mod ty;

pub use keys::{KEYS, Key};
pub use resolved::{ApprovalMode, Environment, Resolved};
pub use trust::{Guard, Ignored, TrustStore};
pub use ty::Ty;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Where a value came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Source {
    Default,
    UserFile(PathBuf),
    ProjectFile(PathBuf),
    DotEnv(PathBuf),
    Env(&'static str),
    CommandLine,
}

impl std::fmt::Display for Source {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Source::Default => f.write_str("default"),
            Source::UserFile(p) | Source::ProjectFile(p) => write!(f, "{}", p.display()),
            Source::DotEnv(p) => write!(f, "{}", p.display()),
            Source::Env(v) => write!(f, "environment ({v})"),
            Source::CommandLine => f.write_str("command line"),
        }
    }
}

fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// What to say after an unknown setting `name`: the known one it is
/// likely a typo of, or else every known one.
fn hint(name: &str) -> String {
    let nearest = KEYS
        .iter()
        .map(|k| (strsim::damerau_levenshtein(name, k.name), k.name, k))
        .min_by_key(|(d, known, _)| (*d, *known));
    match nearest {
        // A slip of a key or two, not a different word.
        Some((d, known, k)) if d <= 2.max(name.len() / 4) && d < name.len() => {
            format!(
                "; did you mean {known:?} ({}; {})?",
                k.doc,
                k.ty.describe().replace('`', "")
            )
        }
        _ => format!(
            " (known: {})",
            KEYS.iter().map(|k| k.name).collect::<Vec<_>>().join(", ")
        ),
    }
}

/// A configuration that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("config file {path}: unknown setting {key:?}{hint}")]
    UnknownKey {
        path: PathBuf,
        key: String,
        hint: String,
    },
    #[error("{path}: {message}")]
    DotEnv { path: PathBuf, message: String },
    #[error("unknown setting {0:?} on the command line{hint}", hint = hint(.0))]
    UnknownCliKey(String),
    #[error("setting {key} = {value:?} (from {origin}): {message}")]
    Invalid {
        key: String,
        value: String,
        origin: Source,
        message: String,
    },
}

/// The effective configuration.
#[derive(Debug, Clone, Default)]
pub struct Settings {
    values: BTreeMap<&'static str, (String, Source)>,
    /// What untrusted files set and was not taken, for the user to see.
    ignored: Vec<Ignored>,
    /// Project files holding a secret cordon read: never shown to a sandbox.
    secret_files: Vec<PathBuf>,
    /// The `[mcp_servers]` tables of the trusted files, lowest first, as
    /// read (and hashed) once.
    mcp_servers: Vec<(PathBuf, toml::Table)>,
    /// The command rules (`[rules]`): the trusted files' whole, an
    /// untrusted project file's `deny` only.
    rules: cordon_agent::rules::Rules,
    /// The hooks (`[[hooks]]`): the user's own file's, and a trusted
    /// project file's that run in the sandbox.
    hooks: Vec<cordon_agent::hooks::HookSpec>,
    /// The values, typed; set by `load`.
    resolved: Option<Resolved>,
}

/// Where to look, so tests need not touch the real home or environment.
pub struct Layers<'a> {
    /// `$XDG_CONFIG_HOME`, or `$HOME/.config`.
    pub config_home: Option<PathBuf>,
    /// The working directory: `.cordon/config.toml` and `.env` live here.
    pub cwd: PathBuf,
    pub env: &'a dyn Fn(&str) -> Option<String>,
    /// `--set`-style overrides and dedicated flags, by setting name.
    pub cli: Vec<(String, String)>,
}

impl Layers<'_> {
    /// The real locations and process environment.
    pub fn from_process(cli: Vec<(String, String)>) -> Layers<'static> {
        Layers {
            config_home: config_home(),
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            env: &|k| std::env::var(k).ok(),
            cli,
        }
    }
}

/// The smallest disk budget: less would stop a sandbox for a log file.
const MIN_DISK: u64 = 1 << 20;

/// A disk budget (`sandbox.disk`, `--disk`): a size such as `2G`, or
/// `none` for no budget.
pub fn parse_disk(v: &str) -> Result<Option<u64>, String> {
    match v.trim() {
        "none" | "off" | "unlimited" => Ok(None),
        v => match cordon_sandbox::parse_size(v)? {
            n if n >= MIN_DISK => Ok(Some(n)),
            _ => Err("a disk budget must be at least 1M (or none)".into()),
        },
    }
}

/// `$XDG_CONFIG_HOME`, or `$HOME/.config`.
pub fn config_home() -> Option<PathBuf> {
    std::env::var_os("XDG_CONFIG_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")))
}

/// The project's files, relative to the working directory.
pub const PROJECT_FILE: &str = ".cordon/config.toml";
pub const DOTENV_FILE: &str = ".env";

fn flatten(prefix: &str, table: &toml::Table, out: &mut Vec<(String, String)>) {
    for (k, v) in table {
        let name = if prefix.is_empty() {
            k.clone()
        } else {
            format!("{prefix}.{k}")
        };
        match v {
            toml::Value::Table(t) => flatten(&name, t, out),
            toml::Value::String(s) => out.push((name, s.clone())),
            other => out.push((name, other.to_string())),
        }
    }
}

fn parse_toml(path: &Path, text: &str) -> Result<toml::Table, ConfigError> {
    text.parse()
        .map_err(|e: toml::de::Error| ConfigError::File {
            path: path.to_path_buf(),
            message: e.to_string().trim().replace('\n', " "),
        })
}

/// The `.env` file's variables.
fn parse_dotenv(path: &Path, content: &[u8]) -> Result<BTreeMap<String, String>, ConfigError> {
    let err = |e: dotenvy::Error| ConfigError::DotEnv {
        path: path.to_path_buf(),
        message: e.to_string(),
    };
    let mut vars = BTreeMap::new();
    for item in dotenvy::from_read_iter(content) {
        let (k, v) = item.map_err(err)?;
        vars.insert(k, v);
    }
    Ok(vars)
}

/// Whether `value` for `name` is at least as strict as `current`.
fn tightens(name: &str, value: &str, current: Option<&str>) -> bool {
    let number = |v: Option<&str>| v.and_then(|v| v.trim().parse::<u64>().ok());
    match name {
        "approval" => value == "ask",
        "sandbox.network" | "web_search" => value == "off",
        "network.allow_private" => value == "false",
        "sandbox.protect_control_files" => value == "true",
        "sandbox.memory" => {
            let size = |v: Option<&str>| v.and_then(|v| cordon_tools::parse_size(v).ok());
            matches!((size(Some(value)), size(current)), (Some(new), Some(old)) if new <= old)
        }
        "sandbox.cpus" => {
            matches!(number(Some(value)), Some(n) if n >= 1 && n <= number(current).unwrap_or(1))
        }
        // A budget tightens no budget, and a smaller one a larger one.
        "sandbox.disk" => match (parse_disk(value), current.map(parse_disk)) {
            (Ok(Some(new)), None | Some(Ok(None))) => new > 0,
            (Ok(Some(new)), Some(Ok(Some(old)))) => new <= old,
            _ => false,
        },
        "sandbox.pids" => {
            matches!((number(Some(value)), number(current)), (Some(new), Some(old)) if new <= old)
        }
        _ => false,
    }
}

impl Settings {
    /// Reads every layer. A file that does not exist is skipped; one that
    /// exists but cannot be parsed, or names an unknown setting, is an error.
    pub fn load(layers: &Layers<'_>) -> Result<Settings, ConfigError> {
        let mut s = Settings::default();
        for k in KEYS {
            if let Some(d) = k.default {
                s.values.insert(k.name, (d.to_string(), Source::Default));
            }
        }
        let store = TrustStore::load(layers.config_home.as_deref())?;
        // The user's own file: trusted with everything.
        if let Some(home) = &layers.config_home {
            let path = home.join("cordon/config.toml");
            match std::fs::read_to_string(&path) {
                Ok(text) => s.apply_file(&path, parse_toml(&path, &text)?, true, true)?,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                // Another user's HOME (`sudo -u` keeps it): logged, not
                // fatal, and not said on every run.
                Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => {
                    tracing::debug!("{} cannot be read: {e}", path.display());
                }
                Err(e) => {
                    return Err(ConfigError::File {
                        path,
                        message: e.to_string(),
                    });
                }
            }
        }
        let path = layers.cwd.join(PROJECT_FILE);
        if let Some(content) = s.read_project(&layers.cwd, PROJECT_FILE)? {
            let text = String::from_utf8(content.clone()).map_err(|_| ConfigError::File {
                path: path.clone(),
                message: "not UTF-8 text".into(),
            })?;
            let trusted = store.trusts(&path, &content);
            s.apply_file(&path, parse_toml(&path, &text)?, false, trusted)?;
        }
        let path = layers.cwd.join(DOTENV_FILE);
        if let Some(content) = s.read_project(&layers.cwd, DOTENV_FILE)? {
            let vars = parse_dotenv(&path, &content)?;
            let holds_secret = KEYS
                .iter()
                .filter(|k| k.secret)
                .any(|k| k.env.iter().any(|v| vars.contains_key(*v)));
            if holds_secret {
                s.secret_files.push(path.clone());
            }
            let trusted = store.trusts(&path, &content);
            let mut found = Vec::new();
            for k in KEYS {
                if let Some((var, v)) = k
                    .env
                    .iter()
                    .find_map(|var| vars.get(*var).filter(|v| !v.is_empty()).map(|v| (*var, v)))
                {
                    found.push((k, var, v.clone()));
                }
            }
            for (k, var, value) in found {
                if trusted || s.allowed(k, &value) {
                    s.values
                        .insert(k.name, (value, Source::DotEnv(path.clone())));
                } else {
                    s.ignore(&path, var, k.guard.why());
                }
            }
        }
        s.apply_env(layers.env, Source::Env);
        for (name, value) in &layers.cli {
            let k = key(name).ok_or_else(|| ConfigError::UnknownCliKey(name.clone()))?;
            s.values
                .insert(k.name, (value.clone(), Source::CommandLine));
        }
        s.resolved = Some(s.resolve()?);
        Ok(s)
    }

    /// A project file's content, or None; a file cordon refuses to read
    /// (a link, a FIFO) is reported as ignored.
    fn read_project(&mut self, dir: &Path, name: &str) -> Result<Option<Vec<u8>>, ConfigError> {
        match trust::read_project_file(dir, name)? {
            trust::ProjectFile::Missing => Ok(None),
            trust::ProjectFile::Refused(why) => {
                self.ignore(&dir.join(name), "", &why);
                Ok(None)
            }
            trust::ProjectFile::Content(c) => Ok(Some(c)),
        }
    }

    fn ignore(&mut self, file: &Path, key: &str, why: &str) {
        self.ignored.push(Ignored {
            file: file.to_path_buf(),
            key: key.to_string(),
            why: why.to_string(),
        });
    }

    /// Whether an untrusted file may set `k` to `value`.
    fn allowed(&self, k: &Key, value: &str) -> bool {
        match k.guard {
            Guard::Any => true,
            Guard::Tighten => tightens(k.name, value, self.get(k.name)),
            _ => false,
        }
    }

    /// One configuration file's settings and MCP servers; an untrusted
    /// file's are filtered by their guards.
    fn apply_file(
        &mut self,
        path: &Path,
        mut table: toml::Table,
        user: bool,
        trusted: bool,
    ) -> Result<(), ConfigError> {
        let servers = match table.remove("mcp_servers") {
            Some(toml::Value::Table(t)) => t,
            Some(_) => {
                return Err(ConfigError::File {
                    path: path.to_path_buf(),
                    message: "mcp_servers must be a table of [mcp_servers.NAME] sections".into(),
                });
            }
            None => toml::Table::new(),
        };
        if let Some(rules) = table.remove("rules") {
            let rules: cordon_agent::rules::Rules =
                rules
                    .try_into()
                    .map_err(|e: toml::de::Error| ConfigError::File {
                        path: path.to_path_buf(),
                        message: format!("[rules]: {}", e.message()),
                    })?;
            rules.validate().map_err(|e| ConfigError::File {
                path: path.to_path_buf(),
                message: format!("[rules]: {e}"),
            })?;
            let rules = if trusted {
                rules
            } else {
                // A project may forbid more, never allow more.
                for (kind, list) in [("allow", &rules.allow), ("ask", &rules.ask)] {
                    if !list.is_empty() {
                        self.ignore(
                            path,
                            &format!("rules.{kind}"),
                            "only your own configuration decides what runs without asking",
                        );
                    }
                }
                cordon_agent::rules::Rules {
                    deny: rules.deny,
                    ..Default::default()
                }
            };
            self.rules = std::mem::take(&mut self.rules).merged(rules);
        }
        if let Some(hooks) = table.remove("hooks") {
            #[derive(serde::Deserialize)]
            struct List(Vec<cordon_agent::hooks::HookSpec>);
            let List(hooks) = hooks
                .try_into()
                .map_err(|e: toml::de::Error| ConfigError::File {
                    path: path.to_path_buf(),
                    message: format!("[[hooks]]: {}", e.message()),
                })?;
            for (i, h) in hooks.into_iter().enumerate() {
                h.validate().map_err(|e| ConfigError::File {
                    path: path.to_path_buf(),
                    message: format!("[[hooks]] number {}: {e}", i + 1),
                })?;
                if user || (trusted && !h.host) {
                    self.hooks.push(h);
                } else {
                    let why = if h.host {
                        "a hook that runs on the host comes from your own configuration only"
                    } else {
                        "it runs a command at every tool call: `cordon trust` the file to take it"
                    };
                    self.ignore(path, &format!("hooks[{}]", i + 1), why);
                }
            }
        }
        let mut holds_secret = servers
            .values()
            .any(|v| v.get("bearer_token").is_some() || v.get("env").is_some());
        let mut flat = Vec::new();
        flatten("", &table, &mut flat);
        for (name, value) in flat {
            let Some(k) = key(&name) else {
                return Err(ConfigError::UnknownKey {
                    path: path.to_path_buf(),
                    hint: hint(&name),
                    key: name,
                });
            };
            holds_secret |= k.secret;
            if !trusted && !self.allowed(k, &value) {
                self.ignore(path, k.name, k.guard.why());
                continue;
            }
            let src = if user {
                Source::UserFile(path.to_path_buf())
            } else {
                Source::ProjectFile(path.to_path_buf())
            };
            self.values.insert(k.name, (value, src));
        }
        // Each file is applied once: it is listed at most once.
        if !user && holds_secret {
            self.secret_files.push(path.to_path_buf());
        }
        if servers.is_empty() {
            return Ok(());
        }
        if trusted {
            self.mcp_servers.push((path.to_path_buf(), servers));
        } else {
            for (name, spec) in &servers {
                let why = if spec.get("url").is_some() {
                    "it connects the agent to a server of the file's choosing"
                } else {
                    "it runs a command on the host"
                };
                self.ignore(path, &format!("mcp_servers.{name}"), why);
            }
        }
        Ok(())
    }

    /// The hooks, in the order the files list them.
    pub fn hooks(&self) -> &[cordon_agent::hooks::HookSpec] {
        &self.hooks
    }

    /// The command rules, every file's merged.
    pub fn rules(&self) -> &cordon_agent::rules::Rules {
        &self.rules
    }

    /// What untrusted files set that was not taken.
    pub fn ignored(&self) -> &[Ignored] {
        &self.ignored
    }

    /// Project files holding a secret cordon read (an API key, a token),
    /// which a sandbox whose workspace holds them must not see.
    pub fn secret_files(&self) -> &[PathBuf] {
        &self.secret_files
    }

    /// The trusted files' `[mcp_servers]` tables, lowest precedence first.
    pub fn mcp_servers(&self) -> &[(PathBuf, toml::Table)] {
        &self.mcp_servers
    }

    fn apply_env(
        &mut self,
        get: impl Fn(&str) -> Option<String>,
        source: impl Fn(&'static str) -> Source,
    ) {
        for k in KEYS {
            // The first listed variable wins over its aliases.
            if let Some((var, v)) = k
                .env
                .iter()
                .find_map(|var| get(var).filter(|v| !v.is_empty()).map(|v| (*var, v)))
            {
                self.values.insert(k.name, (v, source(var)));
            }
        }
    }

    fn invalid(&self, name: &str, message: impl Into<String>) -> ConfigError {
        let (value, origin) = self
            .values
            .get(name)
            .cloned()
            .unwrap_or((String::new(), Source::Default));
        ConfigError::Invalid {
            key: name.to_string(),
            value,
            origin,
            message: message.into(),
        }
    }

    /// Parses every value into its type, once; the first bad one is an
    /// error naming the key, its value and where it came from.
    fn resolve(&self) -> Result<Resolved, ConfigError> {
        resolved::resolve(self)
    }

    /// The settings as typed values (what every front end uses).
    pub fn resolved(&self) -> &Resolved {
        self.resolved
            .as_ref()
            .expect("Settings::load resolves the settings")
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(|(v, _)| v.as_str())
    }

    pub fn source(&self, name: &str) -> Option<&Source> {
        self.values.get(name).map(|(_, s)| s)
    }

    /// The provider to use: explicit, or inferred from which keys are set.
    pub fn provider(&self) -> &'static str {
        match self.resolved().provider {
            cordon_agent::ProviderKind::Anthropic => "anthropic",
            cordon_agent::ProviderKind::OpenAi => "openai",
        }
    }

    /// Every setting with its shown value (secrets masked) and source.
    pub fn describe(&self) -> Vec<(&'static str, String, String)> {
        KEYS.iter()
            .map(|k| match self.values.get(k.name) {
                Some((v, src)) => {
                    let shown = if k.secret { mask(v) } else { v.clone() };
                    (k.name, shown, src.to_string())
                }
                None if k.name == "provider" => {
                    (k.name, self.provider().to_string(), "inferred".into())
                }
                None => (k.name, "(unset)".into(), "-".into()),
            })
            .collect()
    }
}

/// Shows enough of a secret to recognise it, never enough to use it.
pub fn mask(secret: &str) -> String {
    let n = secret.chars().count();
    if n <= 12 {
        return "****".into();
    }
    let head: String = secret.chars().take(6).collect();
    let tail: String = secret.chars().skip(n - 4).collect();
    format!("{head}…{tail}")
}

#[cfg(test)]
mod tests;
