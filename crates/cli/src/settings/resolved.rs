//! The settings as typed values, parsed and checked once, when they are
//! loaded: a front end reads `settings.resolved()` and never a string.

use std::path::PathBuf;

use cordon_git::Retention;
use cordon_sandbox::{Accel, BackendKind, Display, Network, VmOptions, VmShares};

use super::{ConfigError, Settings, Source};
use cordon_agent::ProviderKind;

/// The smallest memory limit a sandbox can start with.
const MIN_MEMORY: u64 = cordon_sandbox::Limits::MIN_MEMORY;

/// Whether tool calls wait for the user (the terminal UI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalMode {
    Auto,
    Ask,
}

/// A provider's address and key.
#[derive(Debug, Clone, PartialEq)]
pub struct Endpoint {
    /// An http or https URL with a host.
    pub base_url: String,
    pub api_key: Option<String>,
}

/// What a sandbox is given.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxSettings {
    pub memory: u64,
    pub pids: u64,
    /// The disk budget in bytes; `None`: none.
    pub disk: Option<u64>,
    pub network: Network,
    pub display: Option<Display>,
    pub backend: BackendKind,
    pub cpus: Option<u32>,
    /// The image to run in (a reference the image store parses); `None`:
    /// the host's root.
    pub image: Option<String>,
    pub vm: VmOptions,
    /// Git's, editors' and agents' control files read-only inside.
    pub protect_control_files: bool,
    /// See `cordon_sandbox::SandboxConfig::favor_cgroup_changes`.
    pub cgroup_favordynmods: bool,
    /// What the broker lets through with [`Network::Allow`]: rules and
    /// presets, each checked, presets not yet expanded.
    pub allow: Vec<String>,
    pub allow_private: bool,
    /// Secrets the broker fills in (`[[network.secrets]]`); their values
    /// stay in the host's environment until a sandbox starts.
    pub secrets: Vec<SecretSetting>,
}

/// One `[[network.secrets]]` entry: which host variable holds the value,
/// the hosts it is for, and the sandbox's variable for its placeholder.
#[derive(Debug, Clone, PartialEq, Eq, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSetting {
    pub name: String,
    pub from_env: String,
    pub hosts: Vec<String>,
    #[serde(default)]
    pub env: Option<String>,
}

/// Every setting, typed.
#[derive(Debug, Clone, PartialEq)]
pub struct Resolved {
    /// Explicit, or inferred from which keys are set.
    pub provider: ProviderKind,
    pub model: String,
    pub max_tokens: u32,
    pub context_window: u64,
    pub compact_threshold: f64,
    /// The provider's web search: the most searches per request.
    pub web_search: Option<u32>,
    pub approval: ApprovalMode,
    /// The host directory at /workspace; `None`: the current directory.
    pub workspace: Option<PathBuf>,
    pub anthropic: Endpoint,
    pub openai: Endpoint,
    pub sandbox: SandboxSettings,
    /// What a session's checkpoints keep (`checkpoints.*`).
    pub checkpoints: Retention,
    /// A setup that makes the sandbox's image once (`[environment]`).
    pub environment: Option<Environment>,
    /// The terminal UI pauses the sandbox after this long idle.
    pub pause_when_idle: Option<std::time::Duration>,
    /// `cordon serve`'s warm pools (`serve.pool`).
    pub pool: Vec<cordon_server::config::PoolSpec>,
}

/// `[environment]`: a setup run once on an image, whose result every later
/// sandbox of the workspace starts from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Environment {
    /// The image it builds on: `environment.image`, else `sandbox.image`.
    pub image: String,
    /// The shell command.
    pub setup: String,
    /// Workspace files it reads: relative, each component plain.
    pub inputs: Vec<String>,
    /// What its sandbox may reach (rules and presets, not yet expanded).
    pub allow: Vec<String>,
}

impl Resolved {
    /// The endpoint of the provider in use.
    pub fn endpoint(&self) -> &Endpoint {
        match self.provider {
            ProviderKind::Anthropic => &self.anthropic,
            ProviderKind::OpenAi => &self.openai,
        }
    }
}

/// A base URL the providers can use: http or https, with a host.
fn check_url(v: &str) -> Result<String, String> {
    let url = url::Url::parse(v).map_err(|e| format!("not a URL: {e}"))?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(format!(
            "expected an http or https URL, not {}:",
            url.scheme()
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err("the URL has no host".into());
    }
    Ok(v.to_string())
}

pub(super) fn resolve(s: &Settings) -> Result<Resolved, ConfigError> {
    // Parses `key` when set (or defaulted) with `parse`, naming the key on
    // failure.
    fn opt<T>(
        s: &Settings,
        key: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<Option<T>, ConfigError> {
        s.get(key)
            .map(|v| parse(v.trim()).map_err(|why| s.invalid(key, why)))
            .transpose()
    }
    fn req<T>(
        s: &Settings,
        key: &str,
        parse: impl Fn(&str) -> Result<T, String>,
    ) -> Result<T, ConfigError> {
        opt(s, key, parse)?.ok_or_else(|| s.invalid(key, "has no value"))
    }
    let positive = |v: &str| match v.parse::<u64>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err("expected a positive whole number".to_string()),
    };
    let allow = opt(s, "network.allow", parse_allow)?.unwrap_or_default();
    let secrets = opt(s, "network.secrets", parse_secrets)?.unwrap_or_default();
    let provider = match s.get("provider") {
        Some("anthropic") => ProviderKind::Anthropic,
        Some("openai") => ProviderKind::OpenAi,
        Some(_) => return Err(s.invalid("provider", "expected anthropic or openai")),
        None if s.get("anthropic_api_key").is_none()
            && s.source("openai_base_url") != Some(&Source::Default) =>
        {
            ProviderKind::OpenAi
        }
        None => ProviderKind::Anthropic,
    };
    let path = |key: &str| s.get(key).map(PathBuf::from);
    let keep = req(s, "checkpoints.keep", |v| {
        positive(v).and_then(|n| usize::try_from(n).map_err(|e| e.to_string()))
    })?;
    let max_size = req(
        s,
        "checkpoints.max_size",
        |v| match cordon_sandbox::parse_size(v)? {
            n if n >= Retention::MIN_MAX_BYTES => Ok(n),
            _ => Err("expected at least 1M".into()),
        },
    )?;
    let checkpoints = Retention::new(keep, max_size)
        .map_err(|e| s.invalid("checkpoints.max_size", e.to_string()))?;
    let environment = match opt(s, "environment.setup", |v| Ok(v.to_string()))? {
        None => {
            for key in ["environment.inputs", "environment.allow"] {
                if s.get(key).is_some() {
                    return Err(s.invalid(key, "is for environment.setup, which is not set"));
                }
            }
            None
        }
        Some(setup) if setup.trim().is_empty() => {
            return Err(s.invalid("environment.setup", "is empty"));
        }
        Some(setup) => {
            let image = s
                .get("environment.image")
                .or(s.get("sandbox.image"))
                .map(|v| v.trim().to_string())
                .filter(|v| !v.is_empty())
                .ok_or_else(|| {
                    s.invalid(
                        "environment.setup",
                        "needs an image to build on: set environment.image (or sandbox.image)",
                    )
                })?;
            Some(Environment {
                image,
                setup,
                inputs: opt(s, "environment.inputs", parse_inputs)?.unwrap_or_default(),
                allow: opt(s, "environment.allow", parse_allow)?.unwrap_or_default(),
            })
        }
    };
    Ok(Resolved {
        provider,
        model: req(s, "model", |v| Ok(v.to_string()))?,
        max_tokens: req(s, "max_tokens", |v| {
            positive(v).and_then(|n| u32::try_from(n).map_err(|e| e.to_string()))
        })?,
        context_window: req(s, "context_window", positive)?,
        compact_threshold: req(s, "compact_threshold", |v| match v.parse::<f64>() {
            Ok(x) if (0.1..=0.95).contains(&x) => Ok(x),
            _ => Err("expected a fraction between 0.1 and 0.95".into()),
        })?,
        web_search: req(s, "web_search", |v| match v {
            "off" | "false" | "0" => Ok(None),
            "on" | "true" => Ok(Some(5)),
            n => match n.parse::<u32>() {
                Ok(n) if n <= 100 => Ok(Some(n)),
                _ => Err("expected off, on, or the most searches per request (1 to 100)".into()),
            },
        })?,
        pool: opt(s, "serve.pool", parse_pools)?.unwrap_or_default(),
        pause_when_idle: req(s, "sandbox.pause_when_idle", |v| match v {
            "never" | "off" => Ok(None),
            v => crate::durations::parse_grace(v)
                .ok()
                .filter(|d| !d.is_zero())
                .map(Some)
                .ok_or_else(|| "expected a duration (30s, 10m, 1h) or never".to_string()),
        })?,
        approval: req(s, "approval", |v| match v {
            "auto" => Ok(ApprovalMode::Auto),
            "ask" => Ok(ApprovalMode::Ask),
            _ => Err("expected auto or ask".into()),
        })?,
        workspace: path("workspace"),
        anthropic: Endpoint {
            base_url: req(s, "anthropic_base_url", check_url)?,
            api_key: s.get("anthropic_api_key").map(str::to_string),
        },
        openai: Endpoint {
            base_url: req(s, "openai_base_url", check_url)?,
            api_key: s.get("openai_api_key").map(str::to_string),
        },
        sandbox: SandboxSettings {
            memory: req(s, "sandbox.memory", |v| {
                match cordon_sandbox::parse_size(v)? {
                    n if n >= MIN_MEMORY => Ok(n),
                    _ => Err("expected at least 16M".into()),
                }
            })?,
            pids: req(s, "sandbox.pids", positive)?,
            disk: opt(s, "sandbox.disk", super::parse_disk)?.flatten(),
            network: network(s, !allow.is_empty() || !secrets.is_empty())?,
            allow,
            secrets,
            allow_private: req(s, "network.allow_private", |v| match v {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err("expected true or false".into()),
            })?,
            display: opt(s, "sandbox.display", |v| {
                v.parse::<Display>().map_err(|_| {
                    "expected WIDTHxHEIGHT such as 1280x800, each 64 to 8192".to_string()
                })
            })?,
            backend: req(s, "sandbox.backend", |v| {
                v.parse::<BackendKind>()
                    .map_err(|_| "expected native or microvm".into())
            })?,
            protect_control_files: req(s, "sandbox.protect_control_files", |v| match v {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err("expected true or false".into()),
            })?,
            cgroup_favordynmods: req(s, "sandbox.cgroup_favordynmods", |v| match v {
                "true" => Ok(true),
                "false" => Ok(false),
                _ => Err("expected true or false".into()),
            })?,
            image: opt(s, "sandbox.image", |v| {
                let v = v.trim();
                if v.is_empty() {
                    Err("expected an image reference".to_string())
                } else {
                    Ok(v.to_string())
                }
            })?,
            cpus: opt(s, "sandbox.cpus", |v| match v.parse::<u32>() {
                Ok(n) if (1..=64).contains(&n) => Ok(n),
                _ => Err("expected a whole number from 1 to 64".into()),
            })?,
            vm: VmOptions {
                qemu: path("vm.qemu"),
                kernel: path("vm.kernel"),
                modules: path("vm.modules"),
                accel: opt(s, "vm.accel", |v| {
                    v.parse::<Accel>().map_err(|_| "expected kvm or tcg".into())
                })?,
                cold_boot: req(s, "vm.snapshots", |v| match v {
                    "on" | "true" => Ok(false),
                    "off" | "false" => Ok(true),
                    _ => Err("expected on or off".into()),
                })?,
                shares: req(s, "vm.shares", |v| v.parse::<VmShares>())?,
                virtiofsd: path("vm.virtiofsd"),
                // Set per sandbox by the server, which resumes them.
                state_dir: None,
            },
        },
        checkpoints,
        environment,
    })
}

/// `network.allow`: a TOML list (from a file) or a comma-separated list
/// (from the environment or the command line), each entry a rule or a
/// preset the broker understands.
/// `environment.inputs`: a TOML list of workspace paths, each relative and
/// plain (no `..`, not absolute).
fn parse_inputs(v: &str) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct List {
        v: Vec<String>,
    }
    let list = toml::from_str::<List>(&format!("v = {v}"))
        .map_err(|_| "expected a list of paths, such as [\"requirements.txt\"]".to_string())?
        .v;
    for p in &list {
        if p.is_empty()
            || p.starts_with('/')
            || p.split('/').any(|c| c == "..")
            || p.contains(['*', '?', '['])
        {
            return Err(format!(
                "{p:?}: an input is a file of the workspace, named by a plain relative path"
            ));
        }
    }
    Ok(list)
}

/// A list setting: a TOML list of strings (from a file), or entries split
/// at `sep` (from the environment or the command line); empty entries
/// dropped.
fn string_list(v: &str, sep: char, expected: &str) -> Result<Vec<String>, String> {
    #[derive(serde::Deserialize)]
    struct List {
        v: Vec<String>,
    }
    let entries: Vec<String> = if v.starts_with('[') {
        toml::from_str::<List>(&format!("v = {v}"))
            .map_err(|_| expected.to_string())?
            .v
    } else {
        v.split(sep).map(|e| e.trim().to_string()).collect()
    };
    Ok(entries.into_iter().filter(|e| !e.is_empty()).collect())
}

/// `serve.pool`: a TOML list (from a file) or `;`-separated (from the
/// environment), each entry as `cordon serve --pool` takes it.
fn parse_pools(v: &str) -> Result<Vec<cordon_server::config::PoolSpec>, String> {
    string_list(v, ';', "expected a list of strings, such as [\"4\"]")?
        .iter()
        .map(|e| e.parse().map_err(|why| format!("{e:?}: {why}")))
        .collect()
}

fn parse_allow(v: &str) -> Result<Vec<String>, String> {
    let entries = string_list(v, ',', "expected a list of strings")?;
    for e in &entries {
        e.parse::<cordon_net::Entry>()
            .map_err(|why| format!("{e:?}: {why}"))?;
    }
    Ok(entries)
}

/// `sandbox.network`; hosts in `network.allow` (or secrets' hosts) imply
/// `allow` unless the mode was chosen, and `allow` needs at least one.
fn network(s: &Settings, hosts_listed: bool) -> Result<Network, ConfigError> {
    let chosen = !matches!(s.source("sandbox.network"), None | Some(Source::Default));
    let mode = match s.get("sandbox.network").map(str::trim) {
        Some("off") | None => Network::Off,
        Some("loopback") => Network::Loopback,
        Some("allow") => Network::Allow,
        Some("full") => Network::Full,
        Some(_) => {
            return Err(s.invalid("sandbox.network", "expected off, loopback, allow or full"));
        }
    };
    match mode {
        Network::Off if !chosen && hosts_listed => Ok(Network::Allow),
        Network::Allow if !hosts_listed => Err(s.invalid(
            "sandbox.network",
            "allow needs at least one host in network.allow (--allow HOST)",
        )),
        m => Ok(m),
    }
}

/// `[[network.secrets]]`, as the settings carry it (TOML text of the
/// array), each entry checked the way the broker will take it.
fn parse_secrets(v: &str) -> Result<Vec<SecretSetting>, String> {
    #[derive(serde::Deserialize)]
    struct List {
        v: Vec<SecretSetting>,
    }
    let list = toml::from_str::<List>(&format!("v = {v}"))
        .map_err(|e| {
            format!(
                "expected [[network.secrets]] entries with name, from_env and hosts: {}",
                e.message()
            )
        })?
        .v;
    for s in &list {
        cordon_net::Secret::new(&s.name, "x", &s.hosts).map_err(|e| e.to_string())?;
        if s.from_env.is_empty() {
            return Err(format!("secret {}: from_env names no variable", s.name));
        }
    }
    Ok(list)
}
