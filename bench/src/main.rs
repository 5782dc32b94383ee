//! `cordon-bench`: measures cordon sandboxes through the library API.
//!
//! ```text
//! cordon-bench warm      [--execs 2000] [--warmup 100] [--concurrency 8] [--concurrent-execs 2000]
//! cordon-bench lifecycle [--cycles 100] [--warmup 10]
//! cordon-bench density   [--sessions 100] [--settle-ms 3000] [--rounds 3]
//! cordon-bench cold      [--runs 300] [--warmup 20] --cmd 'LABEL=ARGV...' --cmd ...
//! common: [--json FILE] [--workspace DIR] [--runtime multi|current]
//! ```
//!
//! `warm` times `/bin/true` execs in one live session (sequential, then
//! concurrent) next to the host spawning `/bin/true` itself. `lifecycle`
//! splits a library cold start into create, first exec and close.
//! `density` opens many idle sessions and reports the memory they hold.
//! `cold` times whole commands, interleaved round-robin so that a noisy
//! host disturbs every command alike (a cross-check of hyperfine).
//!
//! The binary is its own sandbox supervisor.

mod cold;
mod density;
mod stats;
mod warm;

use std::collections::HashMap;
use std::path::PathBuf;
use std::process::ExitCode;

use stats::Json;

const USAGE: &str = "usage: cordon-bench <warm|lifecycle|density|cold> [--OPTION VALUE]...
  warm      --execs N (2000) --warmup N (100) --concurrency N (8) --concurrent-execs N (2000)
  lifecycle --cycles N (100) --warmup N (10)
  density   --sessions N (100) --settle-ms MS (3000) --rounds N (3)
  cold      --runs N (300) --warmup N (20) --cmd 'LABEL=PROGRAM ARG...' (repeatable; argv split on
            whitespace, no quoting) --ratio-to LABEL (the second command)
  common    --json FILE  --workspace DIR (a fresh temporary directory)  --runtime multi|current (multi)";

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

    pub fn num(&self, key: &str, default: usize) -> Result<usize, String> {
        match self.str(key) {
            None => Ok(default),
            Some(s) => s
                .parse()
                .map_err(|_| format!("--{key}: expected a number, got {s:?}")),
        }
    }

    fn check_known(&self, known: &[&str]) -> Result<(), String> {
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
    fn new(given: Option<&str>) -> std::io::Result<Workspace> {
        if let Some(p) = given {
            return Ok(Workspace {
                path: PathBuf::from(p),
                owned: false,
            });
        }
        let path = std::env::temp_dir().join(format!("cordon-bench-ws-{}", std::process::id()));
        std::fs::create_dir_all(&path)?;
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

fn main() -> ExitCode {
    // First, before any thread exists: this binary is also the supervisor.
    cordon_sandbox::supervisor::run_if_supervisor();

    let args = match Args::parse() {
        Ok(a) => a,
        Err(e) => {
            if !e.is_empty() {
                eprintln!("cordon-bench: {e}");
            }
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match run(&args) {
        Ok(report) => {
            if let Some(path) = args.str("json")
                && let Err(e) = std::fs::write(path, report.render())
            {
                eprintln!("cordon-bench: cannot write {path}: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("cordon-bench: {e}");
            ExitCode::FAILURE
        }
    }
}

fn run(args: &Args) -> Result<Json, String> {
    if args.command == "cold" {
        args.check_known(&["runs", "warmup", "cmd", "ratio-to"])?;
        return cold::run(args);
    }
    let known: &[&str] = match args.command.as_str() {
        "warm" => &["execs", "warmup", "concurrency", "concurrent-execs"],
        "lifecycle" => &["cycles", "warmup"],
        "density" => &["sessions", "settle-ms", "rounds"],
        other => return Err(format!("unknown subcommand {other:?}\n{USAGE}")),
    };
    args.check_known(known)?;
    let runtime = match args.str("runtime").unwrap_or("multi") {
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
    let ws = Workspace::new(args.str("workspace")).map_err(|e| format!("workspace: {e}"))?;
    let result = runtime.block_on(async {
        match args.command.as_str() {
            "warm" => warm::warm(args, &ws.path).await,
            "lifecycle" => warm::lifecycle(args, &ws.path).await,
            _ => density::run(args, &ws.path).await,
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    result.map(|mut j| {
        if let Json::Obj(items) = &mut j {
            items.insert(
                0,
                (
                    "runtime".into(),
                    Json::str(args.str("runtime").unwrap_or("multi")),
                ),
            );
            items.insert(0, ("user".into(), Json::str(whoami())));
            items.insert(0, ("benchmark".into(), Json::str(&args.command)));
        }
        j
    })
}
