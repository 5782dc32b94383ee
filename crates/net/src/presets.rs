//! Presets: `@python`, `@node`, `@rust`, `@debian`, `@git-hosting`.
//!
//! Each expands, on the host and at run time, to the hosts the host's own
//! tools are configured to use, so a user behind a mirror gets the mirror:
//! - `@python` asks pip for its effective options (configuration files,
//!   `PIP_*` variables and pip's built-in default, merged by pip itself),
//!   then reads the `pip` project page of each index to learn the host its
//!   files are served from, which may differ from the index's.
//! - `@node` asks npm (`npm config list --json`): the registry, default
//!   included, and every `@scope:registry`.
//! - `@rust` reads cargo's configuration in `$CARGO_HOME` (`config.toml`,
//!   `[source.crates-io] replace-with` followed to its `registry`,
//!   `[registries.*] index`, `CARGO_REGISTRIES_*_INDEX`). Cargo's built-in
//!   index is not something cargo prints, so without a replacement the
//!   preset uses the registries cargo's cache shows it has used
//!   (`$CARGO_HOME/registry/index/HOST-HASH`). A sparse registry's download
//!   host comes from its `config.json` in that cache; one cargo has never
//!   used is known by its index only.
//! - `@debian` reads apt's sources (`sources.list`, `sources.list.d/*.list`
//!   and deb822 `*.sources`, skipping disabled stanzas and non-network URIs).
//! - `@git-hosting` is a fixed list of public forges on port 443.
//!
//! Every host comes with the port its URL implies. A preset whose tool is
//! missing or has no configuration expands to nothing, with a warning.
//! Tools run in an empty temporary directory so nothing in the caller's
//! working directory (perhaps a workspace) can configure them (an `.npmrc`)
//! or be imported by them (a `pip` package next to `python3 -c`), and
//! nothing is run or read from [`PresetEnv::untrusted`] directories (pass
//! the workspace): a workspace `.venv` on `PATH` is not the host's pip.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use serde::Deserialize;

use crate::policy::Rule;

/// Public forges; not package registries.
pub const FORGES: &[&str] = &[
    "github.com",
    "codeload.github.com",
    "gitlab.com",
    "codeberg.org",
    "bitbucket.org",
];

/// How long one tool may take to answer.
const TOOL_TIMEOUT: Duration = Duration::from_secs(30);

/// What presets read: the environment the host's tools see.
#[derive(Debug, Clone)]
pub struct PresetEnv {
    /// Environment variables for the tools (`PATH`, `HOME`, `PIP_*`,
    /// `CARGO_HOME`...); nothing else is passed to them.
    pub vars: BTreeMap<String, String>,
    /// apt's configuration directory (normally `/etc/apt`).
    pub apt_dir: PathBuf,
    /// Directories nothing may be run or read from: the workspace, which
    /// the sandbox writes. `PATH` entries inside them (and relative ones)
    /// are dropped, a program that resolves into them is not run, and a
    /// variable whose value names one is not passed on (an activated
    /// `.venv` in the workspace, a `CARGO_HOME` there...).
    pub untrusted: Vec<PathBuf>,
}

impl PresetEnv {
    /// This process's environment and the system's apt directory.
    pub fn from_host() -> PresetEnv {
        PresetEnv {
            vars: std::env::vars().collect(),
            apt_dir: PathBuf::from("/etc/apt"),
            untrusted: Vec::new(),
        }
    }

    /// The same, refusing anything from `dir` (see [`PresetEnv::untrusted`]).
    pub fn untrusting(mut self, dir: impl Into<PathBuf>) -> PresetEnv {
        self.untrusted.push(dir.into());
        self
    }

    /// The untrusted directories as given and with links resolved.
    fn untrusted_forms(&self) -> Vec<PathBuf> {
        let mut out = Vec::new();
        for u in &self.untrusted {
            out.push(u.clone());
            if let Ok(c) = std::fs::canonicalize(u) {
                out.push(c);
            }
        }
        out
    }

    /// Whether `p` (or what its links lead to) is inside an untrusted
    /// directory.
    fn is_untrusted(&self, p: &Path) -> bool {
        let forms = self.untrusted_forms();
        let real = std::fs::canonicalize(p).unwrap_or_else(|_| p.to_path_buf());
        forms
            .iter()
            .any(|u| p.starts_with(u) || real.starts_with(u))
    }

    /// Whether a variable's value names an untrusted directory.
    fn mentions_untrusted(&self, value: &str) -> bool {
        self.untrusted_forms()
            .iter()
            .filter_map(|u| u.to_str())
            .any(|u| !u.is_empty() && value.contains(u))
    }

    /// `PATH` without relative entries and entries in untrusted places.
    fn trusted_path(&self) -> Option<String> {
        let path = self.vars.get("PATH")?;
        let kept: Vec<PathBuf> = std::env::split_paths(path)
            .filter(|d| d.is_absolute() && !self.is_untrusted(d))
            .collect();
        std::env::join_paths(kept).ok()?.into_string().ok()
    }

    /// The environment the tools get.
    fn tool_vars(&self) -> BTreeMap<String, String> {
        let mut out: BTreeMap<String, String> = self
            .vars
            .iter()
            .filter(|(k, v)| k.as_str() != "PATH" && !self.mentions_untrusted(v))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect();
        if let Some(p) = self.trusted_path() {
            out.insert("PATH".into(), p);
        }
        out
    }

    fn var(&self, k: &str) -> Option<&str> {
        self.vars
            .get(k)
            .map(String::as_str)
            .filter(|v| !v.is_empty() && !self.mentions_untrusted(v))
    }
}

/// A preset's rules, and what went wrong finding them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Expansion {
    pub rules: Vec<Rule>,
    pub warnings: Vec<String>,
}

impl Expansion {
    fn warn(&mut self, preset: &str, msg: impl std::fmt::Display) {
        self.warnings.push(format!("@{preset}: {msg}"));
    }

    /// Adds a rule for the host and port a URL names.
    fn add_url(&mut self, preset: &str, url: &str) {
        match url_rule(url) {
            Ok(Some(r)) => {
                if !self.rules.contains(&r) {
                    self.rules.push(r)
                }
            }
            Ok(None) => {}
            Err(e) => self.warn(preset, format!("skipping {url:?}: {e}")),
        }
    }
}

/// The rule for a URL's host and port (`sparse+`, `registry+`, `git+` and
/// `mirror+` prefixes dropped); `None` for URLs that need no network.
fn url_rule(url: &str) -> Result<Option<Rule>, String> {
    let s = url.trim();
    let s = ["sparse+", "registry+", "git+", "mirror+"]
        .iter()
        .fold(s, |s, p| s.strip_prefix(p).unwrap_or(s));
    let u = url::Url::parse(s).map_err(|e| e.to_string())?;
    if !matches!(u.scheme(), "http" | "https") {
        return Ok(None);
    }
    let host = u.host_str().ok_or("no host")?;
    let port = u.port_or_known_default().ok_or("no port")?;
    Rule::host_port(host, port)
        .map(Some)
        .map_err(|e| e.to_string())
}

/// Expands one preset (its name without the `@`).
pub async fn expand_preset(name: &str, env: &PresetEnv) -> Expansion {
    let mut x = Expansion::default();
    match name {
        "python" => python(env, &mut x).await,
        "node" => node(env, &mut x).await,
        "rust" => rust(env, &mut x),
        "debian" => debian(env, &mut x),
        "git-hosting" => {
            for h in FORGES {
                x.rules
                    .push(Rule::host_port(h, 443).expect("a valid forge name"));
            }
        }
        other => x.warn(other, "no such preset"),
    }
    if x.rules.is_empty() && x.warnings.is_empty() {
        x.warn(name, "the tool's configuration names no hosts");
    }
    x
}

/// Runs a tool with exactly `env.vars`, in an empty directory, and returns
/// its standard output.
async fn run(env: &PresetEnv, program: &str, args: &[&str]) -> Result<String, String> {
    // Found through the tools' PATH, not ours, and never in the workspace.
    let vars = env.tool_vars();
    let path = vars.get("PATH").ok_or("PATH is not set")?;
    let exe = std::env::split_paths(path)
        .map(|d| d.join(program))
        .find(|p| p.is_file())
        .ok_or_else(|| format!("{program} is not on PATH"))?;
    if env.is_untrusted(&exe) {
        return Err(format!(
            "{} leads into the workspace; not run",
            exe.display()
        ));
    }
    let dir = tempfile::tempdir().map_err(|e| format!("a temporary directory: {e}"))?;
    let mut cmd = tokio::process::Command::new(exe);
    cmd.args(args)
        .env_clear()
        .envs(&vars)
        .current_dir(dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd.spawn().map_err(|e| format!("{program}: {e}"))?;
    let out = tokio::time::timeout(TOOL_TIMEOUT, child.wait_with_output())
        .await
        .map_err(|_| format!("{program} did not answer in {}s", TOOL_TIMEOUT.as_secs()))?
        .map_err(|e| format!("{program}: {e}"))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("")
            .trim();
        return Err(format!(
            "{program} failed ({}): {}",
            out.status,
            last.chars().take(200).collect::<String>()
        ));
    }
    String::from_utf8(out.stdout)
        .map_err(|_| format!("{program} printed something that is not UTF-8"))
}

/// pip's own option parser merges its configuration files, `PIP_*`
/// variables and its defaults; the script then reads each index's page for
/// `pip` to see which hosts serve the files.
const PIP_SCRIPT: &str = r#"
import json, re, sys, urllib.parse, urllib.request
from pip._internal.commands import create_command
opts, _ = create_command("install").parse_args([])
indexes = [] if opts.no_index else [opts.index_url] + list(opts.extra_index_urls)
links = [u for u in opts.find_links if "://" in u]
files, errors = [], []
for ix in indexes:
    page = ix.rstrip("/") + "/pip/"
    try:
        with urllib.request.urlopen(page, timeout=10) as r:
            body = r.read(4 << 20).decode("utf-8", "replace")
        for href in re.findall(r'href="([^"]+)"', body)[:2000]:
            u = urllib.parse.urljoin(page, href)
            s = urllib.parse.urlsplit(u)
            files.append(s.scheme + "://" + s.netloc + "/")
    except Exception as e:
        errors.append(page + ": " + str(e)[:200])
print(json.dumps({"indexes": indexes, "links": links, "files": sorted(set(files)), "errors": errors}))
"#;

#[derive(Deserialize)]
struct PipAnswer {
    indexes: Vec<String>,
    links: Vec<String>,
    files: Vec<String>,
    errors: Vec<String>,
}

async fn python(env: &PresetEnv, x: &mut Expansion) {
    let out = match run(env, "python3", &["-c", PIP_SCRIPT]).await {
        Ok(o) => o,
        Err(e) => return x.warn("python", format!("could not ask pip for its index ({e})")),
    };
    let answer: PipAnswer = match serde_json::from_str(out.trim()) {
        Ok(a) => a,
        Err(e) => return x.warn("python", format!("pip's answer was not understood ({e})")),
    };
    if answer.indexes.is_empty() {
        x.warn("python", "pip is configured with no index (no-index)");
    }
    for u in answer
        .indexes
        .iter()
        .chain(&answer.links)
        .chain(&answer.files)
    {
        x.add_url("python", u);
    }
    for e in answer.errors {
        x.warn(
            "python",
            format!("could not read the index to learn its file host ({e})"),
        );
    }
}

async fn node(env: &PresetEnv, x: &mut Expansion) {
    let out = match run(env, "npm", &["config", "list", "--json"]).await {
        Ok(o) => o,
        Err(e) => return x.warn("node", format!("could not ask npm for its registry ({e})")),
    };
    let config: BTreeMap<String, serde_json::Value> = match serde_json::from_str(&out) {
        Ok(c) => c,
        Err(e) => return x.warn("node", format!("npm's answer was not understood ({e})")),
    };
    for (k, v) in &config {
        if (k == "registry" || k.ends_with(":registry"))
            && let Some(u) = v.as_str()
        {
            x.add_url("node", u);
        }
    }
}

fn rust(env: &PresetEnv, x: &mut Expansion) {
    let home = match (env.var("CARGO_HOME"), env.var("HOME")) {
        (Some(c), _) => PathBuf::from(c),
        (None, Some(h)) => Path::new(h).join(".cargo"),
        (None, None) => return x.warn("rust", "neither CARGO_HOME nor HOME is set"),
    };
    let mut config = toml::Table::new();
    for name in ["config.toml", "config"] {
        let p = home.join(name);
        if let Ok(text) = std::fs::read_to_string(&p) {
            match text.parse::<toml::Table>() {
                Ok(t) => config = t,
                Err(e) => x.warn("rust", format!("{} does not parse ({e})", p.display())),
            }
            break;
        }
    }
    let table = |t: &toml::Table, k: &str| {
        t.get(k)
            .and_then(|v| v.as_table())
            .cloned()
            .unwrap_or_default()
    };
    let sources = table(&config, "source");
    let mut registries: BTreeMap<String, String> = table(&config, "registries")
        .iter()
        .filter_map(|(name, v)| Some((name.clone(), v.get("index")?.as_str()?.to_string())))
        .collect();
    for (k, v) in &env.vars {
        if let Some(name) = k
            .strip_prefix("CARGO_REGISTRIES_")
            .and_then(|r| r.strip_suffix("_INDEX"))
        {
            registries.insert(name.to_ascii_lowercase().replace('_', "-"), v.clone());
        }
    }
    let mut urls: Vec<String> = registries.values().cloned().collect();
    // Follow crates-io's replacement chain to a registry URL.
    let mut name = "crates-io".to_string();
    let mut replaced = false;
    for _ in 0..16 {
        let src = sources.get(&name).and_then(|v| v.as_table());
        match src
            .and_then(|s| s.get("replace-with"))
            .and_then(|v| v.as_str())
        {
            Some(next) => {
                replaced = true;
                name = next.to_string();
            }
            None => break,
        }
    }
    if replaced {
        let src = sources.get(&name).and_then(|v| v.as_table());
        match src.and_then(|s| s.get("registry")).and_then(|v| v.as_str()) {
            Some(u) => urls.push(u.to_string()),
            None if registries.contains_key(&name) => {}
            None => x.warn(
                "rust",
                format!("crates-io is replaced by {name:?}, which is not a network registry"),
            ),
        }
    }
    let cache = home.join("registry").join("index");
    let cached = cached_registries(&cache);
    if !replaced {
        if cached.is_empty() {
            x.warn(
                "rust",
                "cargo's default registry is built into cargo and it has not used it here yet; allow its hosts by name",
            );
        }
        urls.extend(cached.iter().map(|(host, _)| format!("https://{host}/")));
    }
    for u in &urls {
        x.add_url("rust", u);
        // A sparse registry's downloads may come from another host: its
        // config.json says, and cargo caches it.
        if let Ok(parsed) = url::Url::parse(u.trim_start_matches("sparse+"))
            && let Some(host) = parsed.host_str()
            && let Some((_, dir)) = cached.iter().find(|(h, _)| h == host)
            && let Some(dl) = read_dl(dir)
        {
            x.add_url("rust", &dl);
        }
    }
}

/// The registries in cargo's index cache, as (host, directory): cargo names
/// each `HOST-HASH`, the hash being 16 hex digits.
fn cached_registries(cache: &Path) -> Vec<(String, PathBuf)> {
    let Ok(dir) = std::fs::read_dir(cache) else {
        return Vec::new();
    };
    let mut out: Vec<(String, PathBuf)> = dir
        .filter_map(Result::ok)
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let (host, hash) = name.rsplit_once('-')?;
            (hash.len() == 16 && hash.bytes().all(|b| b.is_ascii_hexdigit()) && !host.is_empty())
                .then(|| (host.to_string(), e.path()))
        })
        .collect();
    out.sort();
    out
}

fn read_dl(dir: &Path) -> Option<String> {
    #[derive(Deserialize)]
    struct IndexConfig {
        dl: String,
    }
    let text = std::fs::read_to_string(dir.join("config.json")).ok()?;
    serde_json::from_str::<IndexConfig>(&text)
        .ok()
        .map(|c| c.dl)
}

fn debian(env: &PresetEnv, x: &mut Expansion) {
    let dir = &env.apt_dir;
    let mut files: Vec<PathBuf> = vec![dir.join("sources.list")];
    if let Ok(rd) = std::fs::read_dir(dir.join("sources.list.d")) {
        let mut more: Vec<PathBuf> = rd
            .filter_map(Result::ok)
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "list" || e == "sources"))
            .collect();
        more.sort();
        files.extend(more);
    }
    let mut read_any = false;
    for f in files {
        let Ok(text) = std::fs::read_to_string(&f) else {
            continue;
        };
        read_any = true;
        let uris = if f.extension().is_some_and(|e| e == "sources") {
            deb822_uris(&text)
        } else {
            one_line_uris(&text)
        };
        for u in uris {
            x.add_url("debian", &u);
        }
    }
    if !read_any {
        x.warn("debian", format!("no apt sources in {}", dir.display()));
    }
}

/// URIs of `deb`/`deb-src` lines: `deb [options] URI suite [components]`.
fn one_line_uris(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for line in text.lines() {
        let line = line.split('#').next().unwrap_or("").trim();
        let mut rest = match line.split_once(char::is_whitespace) {
            Some(("deb" | "deb-src", rest)) => rest.trim_start(),
            _ => continue,
        };
        if rest.starts_with('[') {
            match rest.split_once(']') {
                Some((_, after)) => rest = after.trim_start(),
                None => continue,
            }
        }
        if let Some(uri) = rest.split_whitespace().next() {
            out.push(uri.to_string());
        }
    }
    out
}

/// URIs of enabled deb822 stanzas.
fn deb822_uris(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    for stanza in text.split("\n\n") {
        let mut uris = Vec::new();
        let mut enabled = true;
        let mut field = String::new();
        for line in stanza.lines() {
            if line.starts_with('#') {
                continue;
            }
            if line.starts_with([' ', '\t']) {
                if field == "uris" {
                    uris.extend(line.split_whitespace().map(str::to_string));
                }
                continue;
            }
            let Some((k, v)) = line.split_once(':') else {
                continue;
            };
            field = k.trim().to_ascii_lowercase();
            match field.as_str() {
                "uris" => uris.extend(v.split_whitespace().map(str::to_string)),
                "enabled" => enabled = !v.trim().eq_ignore_ascii_case("no"),
                _ => {}
            }
        }
        if enabled {
            out.extend(uris);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn apt_line_formats() {
        let list = "# comment\ndeb http://m.test/debian bookworm main\ndeb [arch=amd64 signed-by=/k] https://s.test:8443/d bookworm main # trailing\ndeb-src http://src.test/ x\ndeb cdrom:[x]/ y\nbogus line\n";
        assert_eq!(
            one_line_uris(list),
            [
                "http://m.test/debian",
                "https://s.test:8443/d",
                "http://src.test/",
                "cdrom:[x]/"
            ]
        );
        let sources = "Types: deb\n# a comment\nURIs: http://a.test/debian\n  http://b.test/debian\nSuites: x\n\nTypes: deb\nURIs: http://off.test/\nEnabled: no\n";
        assert_eq!(
            deb822_uris(sources),
            ["http://a.test/debian", "http://b.test/debian"]
        );
    }

    #[test]
    fn urls_to_rules() {
        let r = |u| url_rule(u).unwrap().map(|r| r.to_string());
        assert_eq!(r("sparse+https://m.test/index/"), Some("m.test:443".into()));
        assert_eq!(r("http://m.test:8080/x"), Some("m.test:8080".into()));
        assert_eq!(r("https://[::1]:9/"), Some("[::1]:9".into()));
        assert_eq!(r("file:///srv/mirror"), None);
        assert!(url_rule("not a url").is_err());
    }
}
