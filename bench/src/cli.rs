//! The benchmarks' command line, workspace and report plumbing.

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use crate::stats::Json;

/// Parsed command line: the subcommand and `--key value` pairs (`--cmd`
/// may repeat).
pub struct Args {
    pub command: String,
    opts: HashMap<String, Vec<String>>,
}

impl Args {
    fn parse() -> Result<Args, String> {
        let mut it = std::env::args().skip(1);
        let command = it.next().ok_or("missing subcommand")?;
        if command == "-h" || command == "--help" {
            return Err(String::new());
        }
        let mut opts: HashMap<String, Vec<String>> = HashMap::new();
        while let Some(k) = it.next() {
            let key = k
                .strip_prefix("--")
                .ok_or_else(|| format!("unexpected argument {k:?}"))?
                .to_string();
            let v = it.next().ok_or_else(|| format!("--{key} needs a value"))?;
            opts.entry(key).or_default().push(v);
        }
        Ok(Args { command, opts })
    }

    pub fn str(&self, key: &str) -> Option<&str> {
        self.opts
            .get(key)
            .and_then(|v| v.last())
            .map(String::as_str)
    }

    pub fn all(&self, key: &str) -> &[String] {
        self.opts.get(key).map_or(&[], Vec::as_slice)
    }

    /// `--url` (without a trailing slash) and `--token`: the server a
    /// benchmark of `cordon serve` talks to.
    pub fn server(&self) -> Result<(String, String), String> {
        let url = self
            .str("url")
            .ok_or("--url is required (the server, e.g. http://127.0.0.1:8080)")?
            .trim_end_matches('/')
            .to_string();
        let token = self.str("token").ok_or("--token is required")?.to_string();
        Ok((url, token))
    }

    pub fn num(&self, key: &str, default: usize) -> Result<usize, String> {
        match self.str(key) {
            None => Ok(default),
            Some(s) => s
                .parse()
                .map_err(|_| format!("--{key}: expected a number, got {s:?}")),
        }
    }

    pub fn check_known(&self, known: &[&str]) -> Result<(), String> {
        for k in self.opts.keys() {
            if !known.contains(&k.as_str())
                && !["json", "workspace", "runtime"].contains(&k.as_str())
            {
                return Err(format!("unknown option --{k} for {}", self.command));
            }
        }
        Ok(())
    }
}

/// A workspace directory: the one given, or a fresh one removed on drop.
pub struct Workspace {
    pub path: PathBuf,
    owned: bool,
}

impl Workspace {
    pub fn new(given: Option<&str>) -> Result<Workspace, String> {
        if let Some(p) = given {
            return Ok(Workspace {
                path: PathBuf::from(p),
                owned: false,
            });
        }
        let path = std::env::temp_dir().join(format!("cordon-bench-ws-{}", std::process::id()));
        std::fs::create_dir_all(&path).map_err(|e| format!("workspace: {e}"))?;
        Ok(Workspace { path, owned: true })
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        if self.owned {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// Who runs the benchmark, for the reports.
pub fn whoami() -> String {
    let uid = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                l.strip_prefix("Uid:")
                    .map(|r| r.split_whitespace().nth(1).unwrap_or("?").to_string())
            })
        })
        .unwrap_or_else(|| "?".into());
    if uid == "0" {
        "root (uid 0)".into()
    } else {
        format!("unprivileged (uid {uid})")
    }
}

/// The tokio runtime `--runtime` asks for, `default` when absent.
pub fn runtime(args: &Args, default: &str) -> Result<(tokio::runtime::Runtime, String), String> {
    let name = args.str("runtime").unwrap_or(default).to_string();
    let rt = match name.as_str() {
        "multi" => tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build(),
        "current" => tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build(),
        other => {
            return Err(format!(
                "--runtime: expected multi or current, got {other:?}"
            ));
        }
    }
    .map_err(|e| format!("cannot start the async runtime: {e}"))?;
    Ok((rt, name))
}

/// Puts the benchmark's name, the user and the runtime first in a report.
pub fn labelled(args: &Args, mut j: Json, runtime: Option<&str>) -> Json {
    if let Json::Obj(items) = &mut j {
        if let Some(rt) = runtime {
            items.insert(0, ("runtime".into(), Json::str(rt)));
        }
        items.insert(0, ("user".into(), Json::str(whoami())));
        items.insert(0, ("benchmark".into(), Json::str(&args.command)));
    }
    j
}

/// Parses the command line, runs `run` and writes its report to `--json`;
/// `usage` is printed on a bad command line.
pub fn main(name: &str, usage: &str, run: impl FnOnce(&Args) -> Result<Json, String>) -> ExitCode {
    let args = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("{name}: {e}");
            }
            eprintln!("{usage}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(report) => {
            if let Some(path) = args.str("json")
                && let Err(e) = std::fs::write(path, report.render())
            {
                eprintln!("{name}: cannot write {path}: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{name}: {e}");
            ExitCode::FAILURE
        }
    }
}
