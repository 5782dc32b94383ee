//! `cordon-bench-agent`: measures cordon's agent (issue 3).
//!
//! ```text
//! cordon-bench-agent agent-loop  [--steps 200] [--rounds 3] [--warmup 10]
//! cordon-bench-agent session-log [--events 10000] [--rounds 3] [--loads 10] [--buckets 10]
//! cordon-bench-agent exec-memory --cordon PATH [--runs 3] [--delay-ms 300] [--interval-ms 100]
//! cordon-bench-agent serve-e2e   --url URL --token T [--rounds 50] [--warmup 5] [--cordon PATH]
//! cordon-bench-agent serve-pool  --url URL --token T --pool-url URL --pool-token T [--rounds 50] [--warmup 5] [--settle 100]
//! cordon-bench-agent serve-fork  --url URL --token T [--rounds 10] [--warmup 1] [--files 1000] [--backend native]
//! cordon-bench-agent screenshot  [--cold 5] [--shots 30]
//! cordon-bench-agent backends    [--cold 10] [--execs 50]
//! cordon-bench-agent kernel      [--calls 200] [--heavy-calls 20] [--cold 5] [--warmup 10]
//! cordon-bench-agent lab-page    --url URL --token T [--cold 5] [--warm 10] [--fetches 50]
//! common: [--json FILE] [--workspace DIR] [--runtime multi|current]
//! ```
//!
//! `agent-loop` times the agent loop's tool round trips against the
//! scripted model server, next to the bare HTTP round trip and the tool
//! alone. `session-log` times session-log appends as a log grows to 10,000
//! records, and loading it. `exec-memory` samples the memory of the real
//! `cordon exec` while it waits on a slow model, next to `cordon run`.
//! `serve-e2e` times a trivial shell job through a running `cordon serve`
//! from `POST` to `succeeded`, next to `cordon run -- true`; `serve-pool`
//! the same on a server without a warm pool and one with, alternating
//! round by round; `serve-fork` forks a sandbox of 1,000 files 1 and 10
//! at once, next to creating as many and uploading its files. `screenshot`
//! times the computer tool's screenshots next to the computer-use
//! reference's way (scrot, then ImageMagick's convert). `backends` times
//! sandbox creation and warm execs on the native and microvm backends.
//! `kernel` times Python through the Jupyter kernel behind `run_code` next
//! to a fresh interpreter per call. `lab-page` times JupyterLab's first
//! page through a running `cordon serve`, and its proxy.
//!
//! The binary is the supervisor of the sandbox `agent-loop` opens.

mod agentloop;
mod backends;
mod execmem;
mod fork;
mod kernel;
mod lab;
mod screenshot;
mod serve;
mod sessionlog;

use std::process::ExitCode;

pub(crate) use cordon_bench::cli::{Args, whoami};
pub(crate) use cordon_bench::stats;

use cordon_bench::cli::{self, Workspace};
use stats::Json;

const USAGE: &str =
    "usage: cordon-bench-agent <agent-loop|session-log|exec-memory|serve-e2e|serve-pool|serve-fork|screenshot|backends|kernel|lab-page> [--OPTION VALUE]...
  agent-loop  --steps N (200) --rounds N (3) --warmup N (10 steps left out of each run)
  session-log --events N (10000) --rounds N (3) --loads N (10) --buckets N (10)
  exec-memory --cordon PATH (the release cordon) --runs N (3) --delay-ms MS (300, before every
              streamed event) --interval-ms MS (100, between samples)
  serve-e2e   --url URL (a running cordon serve) --token TOKEN --rounds N (50) --warmup N (5)
              --cordon PATH (also time `cordon run -- true`, alternating)
  serve-pool  --url URL --token TOKEN (a server without a pool) --pool-url URL --pool-token TOKEN
              (one with a pool) --rounds N (50, on each) --warmup N (5)
              --settle MS (100, idle after each job)
  serve-fork  --url URL --token TOKEN (sessions per tenant at least 21) --rounds N (10) --warmup N (1)
              --files N (1000, of 20 KB, in the parent's workspace)
  screenshot  --cold N (5, sandboxes started) --shots N (30, warm screenshots each way)
  backends    --cold N (10, sandboxes started each way) --execs N (50, warm execs each way)
  kernel      --calls N (200, trivial calls each way) --heavy-calls N (20, numpy + pyplot each way)
              --cold N (5, kernels started) --warmup N (10)
  lab-page    --url URL (a running cordon serve with the lab environment) --token TOKEN
              --cold N (5, fresh jobs) --warm N (10, loads per job) --fetches N (50, per side)
  common      --json FILE  --workspace DIR (a fresh temporary directory)
              --runtime multi|current (agent-loop only; current, as in cordon)";

fn main() -> ExitCode {
    // First, before any thread exists: this binary is also the supervisor.
    cordon_sandbox::supervisor::run_if_supervisor();
    cli::main("cordon-bench-agent", USAGE, run)
}

fn run(args: &Args) -> Result<Json, String> {
    let known: &[&str] = match args.command.as_str() {
        "agent-loop" => &["steps", "rounds", "warmup"],
        "session-log" => &["events", "rounds", "loads", "buckets"],
        "exec-memory" => &["cordon", "runs", "delay-ms", "interval-ms"],
        "serve-e2e" => &["url", "token", "rounds", "warmup", "cordon"],
        "serve-pool" => &[
            "url",
            "token",
            "pool-url",
            "pool-token",
            "rounds",
            "warmup",
            "settle",
        ],
        "serve-fork" => &["url", "token", "rounds", "warmup", "files", "backend"],
        "screenshot" => &["cold", "shots"],
        "backends" => &["cold", "execs"],
        "kernel" => &["calls", "heavy-calls", "cold", "warmup"],
        "lab-page" => &["url", "token", "cold", "warm", "fetches"],
        other => return Err(format!("unknown subcommand {other:?}\n{USAGE}")),
    };
    args.check_known(known)?;
    let ws = Workspace::new(args.str("workspace"))?;
    match args.command.as_str() {
        // Plain blocking code, timed without a runtime around it.
        "session-log" => sessionlog::run(args, &ws.path).map(|j| cli::labelled(args, j, None)),
        "exec-memory" => execmem::run(args, &ws.path).map(|j| cli::labelled(args, j, None)),
        "screenshot" => {
            let (runtime, _) = cli::runtime(args, "current")?;
            let result = runtime.block_on(screenshot::run(args, &ws.path));
            result.map(|j| cli::labelled(args, j, None))
        }
        "backends" => {
            let (runtime, _) = cli::runtime(args, "current")?;
            let result = runtime.block_on(backends::run(args, &ws.path));
            result.map(|j| cli::labelled(args, j, None))
        }
        "kernel" => {
            let (runtime, _) = cli::runtime(args, "current")?;
            let result = runtime.block_on(kernel::run(args, &ws.path));
            result.map(|j| cli::labelled(args, j, None))
        }
        "lab-page" => {
            let (runtime, _) = cli::runtime(args, "current")?;
            let result = runtime.block_on(lab::run(args));
            result.map(|j| cli::labelled(args, j, None))
        }
        "serve-e2e" => {
            let (runtime, _) = cli::runtime(args, "current")?;
            let result = runtime.block_on(serve::run(args, &ws.path));
            result.map(|j| cli::labelled(args, j, None))
        }
        "serve-pool" => {
            let (runtime, _) = cli::runtime(args, "current")?;
            let result = runtime.block_on(serve::pool(args));
            result.map(|j| cli::labelled(args, j, None))
        }
        "serve-fork" => {
            let (runtime, _) = cli::runtime(args, "current")?;
            let result = runtime.block_on(fork::run(args));
            result.map(|j| cli::labelled(args, j, None))
        }
        _ => {
            // The single-threaded runtime, as `cordon` runs the loop.
            let (runtime, name) = cli::runtime(args, "current")?;
            let result = runtime.block_on(agentloop::run(args, &ws.path));
            runtime.shutdown_timeout(std::time::Duration::from_secs(5));
            result.map(|j| cli::labelled(args, j, Some(&name)))
        }
    }
}

/// This binary's modules: each measures on its own, none uses another
/// (what they share is the library's).
#[cfg(test)]
mod layering {
    cordon_testkit::layering_test!(
        root "src/agent/main.rs",
        &[
                "agentloop",
                "backends",
                "execmem",
                "fork",
                "kernel",
                "lab",
                "screenshot",
                "serve",
                "sessionlog",
            ]
    );
}
