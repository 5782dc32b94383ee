//! Layered configuration, each value remembering where it came from.
//!
//! From lowest to highest precedence: built-in defaults, the user's
//! `$XDG_CONFIG_HOME/cordon/config.toml` (`~/.config/...`), the project's
//! `.cordon/config.toml`, a `.env` file in the working directory, the
//! process environment, and the command line. The environment outranks
//! `.env` as it does for every dotenv tool: a variable set on purpose in a
//! shell beats a file. The seeds' names are honoured: `ANTHROPIC_API_KEY`,
//! `MODEL`, `MAX_TOKENS`, `SAFEDIR` (the workspace).

use std::collections::BTreeMap;
use std::path::PathBuf;

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

/// One setting: its name in files and on the command line, the variables
/// that set it, whether it is secret, and its default.
pub struct Key {
    pub name: &'static str,
    pub env: &'static [&'static str],
    pub secret: bool,
    pub default: Option<&'static str>,
    pub doc: &'static str,
}

/// Every setting cordon reads.
pub const KEYS: &[Key] = &[
    Key {
        name: "provider",
        env: &["CORDON_PROVIDER"],
        secret: false,
        default: None,
        doc: "anthropic or openai (default: anthropic, or openai when only OPENAI_BASE_URL is set)",
    },
    Key {
        name: "model",
        env: &["MODEL", "CORDON_MODEL"],
        secret: false,
        default: Some("claude-sonnet-4-5"),
        doc: "model name",
    },
    Key {
        name: "max_tokens",
        env: &["MAX_TOKENS"],
        secret: false,
        default: Some("8192"),
        doc: "output tokens per model answer",
    },
    Key {
        name: "workspace",
        env: &["SAFEDIR", "CORDON_WORKSPACE"],
        secret: false,
        default: None,
        doc: "host directory mounted at /workspace (default: the current directory)",
    },
    Key {
        name: "anthropic_api_key",
        env: &["ANTHROPIC_API_KEY"],
        secret: true,
        default: None,
        doc: "Anthropic API key",
    },
    Key {
        name: "anthropic_base_url",
        env: &["ANTHROPIC_BASE_URL"],
        secret: false,
        default: Some("https://api.anthropic.com"),
        doc: "Anthropic API base URL",
    },
    Key {
        name: "openai_api_key",
        env: &["OPENAI_API_KEY"],
        secret: true,
        default: None,
        doc: "key for OpenAI or a compatible server (optional for local servers)",
    },
    Key {
        name: "openai_base_url",
        env: &["OPENAI_BASE_URL"],
        secret: false,
        default: Some("https://api.openai.com/v1"),
        doc: "OpenAI-compatible base URL, with /v1",
    },
    Key {
        name: "context_window",
        env: &["CORDON_CONTEXT_WINDOW"],
        secret: false,
        default: Some("200000"),
        doc: "the model's context window in tokens",
    },
    Key {
        name: "compact_threshold",
        env: &["CORDON_COMPACT_THRESHOLD"],
        secret: false,
        default: Some("0.75"),
        doc: "compact when a request would exceed this share of the window",
    },
    Key {
        name: "approval",
        env: &["CORDON_APPROVAL"],
        secret: false,
        default: Some("auto"),
        doc: "auto (run every tool in the sandbox) or ask",
    },
    Key {
        name: "sandbox.memory",
        env: &["CORDON_MEMORY"],
        secret: false,
        default: Some("512M"),
        doc: "sandbox memory limit",
    },
    Key {
        name: "sandbox.pids",
        env: &["CORDON_PIDS"],
        secret: false,
        default: Some("256"),
        doc: "sandbox process limit",
    },
    Key {
        name: "sandbox.network",
        env: &["CORDON_NETWORK"],
        secret: false,
        default: Some("off"),
        doc: "off or loopback",
    },
    Key {
        name: "sandbox.display",
        env: &["CORDON_DISPLAY"],
        secret: false,
        default: None,
        doc: "a virtual X display in the sandbox, WIDTHxHEIGHT; gives the model the computer tool",
    },
    Key {
        name: "sandbox.backend",
        env: &["CORDON_BACKEND"],
        secret: false,
        default: Some("native"),
        doc: "native (namespaces on this kernel) or microvm (a QEMU virtual machine)",
    },
    Key {
        name: "sandbox.cpus",
        env: &["CORDON_CPUS"],
        secret: false,
        default: None,
        doc: "virtual CPUs of a microVM (default 1)",
    },
    Key {
        name: "vm.kernel",
        env: &["CORDON_VM_KERNEL"],
        secret: false,
        default: None,
        doc: "microvm guest kernel, vmlinuz or vmlinux (default: the one `cordon vm setup` fetched)",
    },
    Key {
        name: "vm.modules",
        env: &["CORDON_VM_MODULES"],
        secret: false,
        default: None,
        doc: "the guest kernel's modules directory (lib/modules/VERSION)",
    },
    Key {
        name: "vm.qemu",
        env: &["CORDON_VM_QEMU"],
        secret: false,
        default: None,
        doc: "the QEMU binary (default: qemu-system-x86_64 on PATH)",
    },
    Key {
        name: "vm.accel",
        env: &["CORDON_VM_ACCEL"],
        secret: false,
        default: None,
        doc: "kvm or tcg (default tcg: a /dev/kvm that cannot run guests hangs them)",
    },
];

fn key(name: &str) -> Option<&'static Key> {
    KEYS.iter().find(|k| k.name == name)
}

/// A configuration that could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("config file {path}: {message}")]
    File { path: PathBuf, message: String },
    #[error("config file {path}: unknown setting {key:?} (known: {known})")]
    UnknownKey {
        path: PathBuf,
        key: String,
        known: String,
    },
    #[error("{path}: {message}")]
    DotEnv { path: PathBuf, message: String },
    #[error("unknown setting {0:?} on the command line")]
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
        let config_home = std::env::var_os("XDG_CONFIG_HOME")
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".config")));
        Layers {
            config_home,
            cwd: std::env::current_dir().unwrap_or_else(|_| PathBuf::from(".")),
            env: &|k| std::env::var(k).ok(),
            cli,
        }
    }
}

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
        let files = [
            layers
                .config_home
                .as_ref()
                .map(|h| (h.join("cordon/config.toml"), true)),
            Some((layers.cwd.join(".cordon/config.toml"), false)),
        ];
        for (path, user) in files.into_iter().flatten() {
            let text = match std::fs::read_to_string(&path) {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => {
                    return Err(ConfigError::File {
                        path,
                        message: e.to_string(),
                    });
                }
            };
            let table: toml::Table =
                text.parse()
                    .map_err(|e: toml::de::Error| ConfigError::File {
                        path: path.clone(),
                        message: e.to_string().trim().replace('\n', " "),
                    })?;
            let mut flat = Vec::new();
            flatten("", &table, &mut flat);
            for (name, value) in flat {
                // Sections other tools own (MCP servers) are read elsewhere.
                if name.starts_with("mcp_servers.") {
                    continue;
                }
                let Some(k) = key(&name) else {
                    return Err(ConfigError::UnknownKey {
                        path: path.clone(),
                        key: name,
                        known: KEYS.iter().map(|k| k.name).collect::<Vec<_>>().join(", "),
                    });
                };
                let src = if user {
                    Source::UserFile(path.clone())
                } else {
                    Source::ProjectFile(path.clone())
                };
                s.values.insert(k.name, (value, src));
            }
        }
        let dotenv_path = layers.cwd.join(".env");
        if dotenv_path.is_file() {
            let iter = dotenvy::from_path_iter(&dotenv_path).map_err(|e| ConfigError::DotEnv {
                path: dotenv_path.clone(),
                message: e.to_string(),
            })?;
            let mut vars = BTreeMap::new();
            for item in iter {
                let (k, v) = item.map_err(|e| ConfigError::DotEnv {
                    path: dotenv_path.clone(),
                    message: e.to_string(),
                })?;
                vars.insert(k, v);
            }
            s.apply_env(
                |name| vars.get(name).cloned(),
                |_| Source::DotEnv(dotenv_path.clone()),
            );
        }
        s.apply_env(layers.env, Source::Env);
        for (name, value) in &layers.cli {
            let k = key(name).ok_or_else(|| ConfigError::UnknownCliKey(name.clone()))?;
            s.values
                .insert(k.name, (value.clone(), Source::CommandLine));
        }
        s.validate()?;
        Ok(s)
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

    fn validate(&self) -> Result<(), ConfigError> {
        if let Some(p) = self.get("provider")
            && !matches!(p, "anthropic" | "openai")
        {
            return Err(self.invalid("provider", "expected anthropic or openai"));
        }
        for n in ["max_tokens", "context_window", "sandbox.pids"] {
            if self
                .get(n)
                .is_some_and(|v| v.parse::<u64>().map_or(true, |x| x == 0))
            {
                return Err(self.invalid(n, "expected a positive whole number"));
            }
        }
        if self.get("compact_threshold").is_some_and(|v| {
            v.parse::<f64>()
                .map_or(true, |x| !(0.1..=0.95).contains(&x))
        }) {
            return Err(self.invalid(
                "compact_threshold",
                "expected a fraction between 0.1 and 0.95",
            ));
        }
        if self
            .get("approval")
            .is_some_and(|v| !matches!(v, "auto" | "ask"))
        {
            return Err(self.invalid("approval", "expected auto or ask"));
        }
        if self
            .get("sandbox.network")
            .is_some_and(|v| !matches!(v, "off" | "loopback"))
        {
            return Err(self.invalid("sandbox.network", "expected off or loopback"));
        }
        if self
            .get("sandbox.backend")
            .is_some_and(|v| v.parse::<cordon_tools::BackendKind>().is_err())
        {
            return Err(self.invalid("sandbox.backend", "expected native or microvm"));
        }
        if self
            .get("sandbox.cpus")
            .is_some_and(|v| v.parse::<u32>().map_or(true, |n| !(1..=64).contains(&n)))
        {
            return Err(self.invalid("sandbox.cpus", "expected a whole number from 1 to 64"));
        }
        if self
            .get("vm.accel")
            .is_some_and(|v| v.parse::<cordon_tools::Accel>().is_err())
        {
            return Err(self.invalid("vm.accel", "expected kvm or tcg"));
        }
        if self
            .get("sandbox.display")
            .is_some_and(|v| v.parse::<cordon_tools::Display>().is_err())
        {
            return Err(self.invalid(
                "sandbox.display",
                "expected WIDTHxHEIGHT such as 1280x800, each 64 to 8192",
            ));
        }
        Ok(())
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        self.values.get(name).map(|(v, _)| v.as_str())
    }

    pub fn source(&self, name: &str) -> Option<&Source> {
        self.values.get(name).map(|(_, s)| s)
    }

    /// The provider to use: explicit, or inferred from which keys are set.
    pub fn provider(&self) -> &str {
        match self.get("provider") {
            Some(p) => p,
            None if self.get("anthropic_api_key").is_none()
                && self.source("openai_base_url") != Some(&Source::Default) =>
            {
                "openai"
            }
            None => "anthropic",
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
mod tests {
    use super::*;
    use std::collections::HashMap;
    use std::path::Path;

    fn layers<'a>(
        home: &Path,
        cwd: &Path,
        env: &'a dyn Fn(&str) -> Option<String>,
        cli: &[(&str, &str)],
    ) -> Layers<'a> {
        Layers {
            config_home: Some(home.to_path_buf()),
            cwd: cwd.to_path_buf(),
            env,
            cli: cli
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        }
    }

    #[test]
    fn each_layer_overrides_the_one_below_and_says_so() {
        let home = tempfile::tempdir().unwrap();
        let cwd = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(home.path().join("cordon")).unwrap();
        std::fs::write(
            home.path().join("cordon/config.toml"),
            "model = \"user-model\"\nmax_tokens = 1000\ncontext_window = 100000\n[sandbox]\nmemory = \"1G\"\n",
        )
        .unwrap();
        std::fs::create_dir_all(cwd.path().join(".cordon")).unwrap();
        std::fs::write(
            cwd.path().join(".cordon/config.toml"),
            "max_tokens = 2000\ncompact_threshold = 0.5\n",
        )
        .unwrap();
        std::fs::write(
            cwd.path().join(".env"),
            "ANTHROPIC_API_KEY=sk-ant-from-dotenv-1234567890\nMAX_TOKENS=3000\nSAFEDIR=./work\n",
        )
        .unwrap();
        let env: HashMap<&str, &str> = [("MAX_TOKENS", "4000"), ("MODEL", "env-model")].into();
        let get = |k: &str| env.get(k).map(|v| v.to_string());
        let s = Settings::load(&layers(
            home.path(),
            cwd.path(),
            &get,
            &[("model", "cli-model")],
        ))
        .unwrap();

        assert_eq!(s.get("model"), Some("cli-model"));
        assert_eq!(s.source("model"), Some(&Source::CommandLine));
        assert_eq!(s.get("max_tokens"), Some("4000"));
        assert_eq!(s.source("max_tokens"), Some(&Source::Env("MAX_TOKENS")));
        assert_eq!(s.get("workspace"), Some("./work"));
        assert!(matches!(s.source("workspace"), Some(Source::DotEnv(_))));
        assert_eq!(s.get("compact_threshold"), Some("0.5"));
        assert!(matches!(
            s.source("compact_threshold"),
            Some(Source::ProjectFile(_))
        ));
        assert_eq!(s.get("context_window"), Some("100000"));
        assert!(matches!(
            s.source("context_window"),
            Some(Source::UserFile(_))
        ));
        assert_eq!(s.get("sandbox.memory"), Some("1G"));
        assert_eq!(s.get("sandbox.pids"), Some("256"));
        assert_eq!(s.source("sandbox.pids"), Some(&Source::Default));
        assert_eq!(s.provider(), "anthropic");

        let shown = s.describe();
        let key = shown
            .iter()
            .find(|(k, _, _)| *k == "anthropic_api_key")
            .unwrap();
        assert_eq!(key.1, "sk-ant…7890");
        assert!(
            !format!("{shown:?}").contains("from-dotenv"),
            "secrets must be masked"
        );
    }

    #[test]
    fn openai_is_inferred_from_a_base_url_alone() {
        let dir = tempfile::tempdir().unwrap();
        let get =
            |k: &str| (k == "OPENAI_BASE_URL").then(|| "http://localhost:11434/v1".to_string());
        let s = Settings::load(&layers(dir.path(), dir.path(), &get, &[])).unwrap();
        assert_eq!(s.provider(), "openai");
    }

    #[test]
    fn bad_files_and_values_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let none = |_: &str| None;
        std::fs::create_dir_all(dir.path().join(".cordon")).unwrap();
        let cfg = dir.path().join(".cordon/config.toml");
        std::fs::write(&cfg, "model = \"x\"\nmodle = \"typo\"\n").unwrap();
        let err = Settings::load(&layers(dir.path(), dir.path(), &none, &[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("unknown setting \"modle\"") && err.contains("config.toml"),
            "{err}"
        );
        std::fs::write(&cfg, "model = \n").unwrap();
        let err = Settings::load(&layers(dir.path(), dir.path(), &none, &[]))
            .unwrap_err()
            .to_string();
        assert!(err.contains("config.toml") && !err.contains('\n'), "{err}");
        std::fs::write(&cfg, "max_tokens = -5\n").unwrap();
        let err = Settings::load(&layers(dir.path(), dir.path(), &none, &[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("max_tokens") && err.contains("positive"),
            "{err}"
        );
        std::fs::remove_file(&cfg).unwrap();
        let err =
            Settings::load(&layers(dir.path(), dir.path(), &none, &[("nope", "1")])).unwrap_err();
        assert!(matches!(err, ConfigError::UnknownCliKey(_)));
        let bad_env = |k: &str| (k == "CORDON_APPROVAL").then(|| "sometimes".to_string());
        let err = Settings::load(&layers(dir.path(), dir.path(), &bad_env, &[]))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("approval") && err.contains("CORDON_APPROVAL"),
            "{err}"
        );
    }

    #[test]
    fn secrets_are_masked() {
        assert_eq!(mask("short"), "****");
        assert_eq!(mask("sk-ant-api03-abcdefghijkl"), "sk-ant…ijkl");
    }
}
