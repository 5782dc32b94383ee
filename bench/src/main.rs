//! `cordon-bench`: measures cordon sandboxes through the library API.
//!
//! ```text
//! cordon-bench warm      [--execs 2000] [--warmup 100] [--concurrency 8] [--concurrent-execs 2000]
//! cordon-bench lifecycle [--cycles 100] [--warmup 10]
//! cordon-bench density   [--sessions 100] [--settle-ms 3000] [--rounds 3]
//! cordon-bench cold      [--runs 300] [--warmup 20] [--space-ms 0] --cmd 'LABEL=ARGV...' --cmd ...
//! cordon-bench net       [--mib 256] [--rounds 5] [--requests 200]
//! cordon-bench checkpoint [--files 10000] [--turns 40] [--changed 10]
//! common: [--json FILE] [--workspace DIR] [--runtime multi|current]
//! ```
//!
//! `warm` times `/bin/true` execs in one live session (sequential, then
//! concurrent) next to the host spawning `/bin/true` itself. `lifecycle`
//! splits a library cold start into create, first exec and close.
//! `density` opens many idle sessions and reports the memory they hold.
//! `cold` times whole commands, interleaved round-robin so that a noisy
//! host disturbs every command alike (a cross-check of hyperfine). `net`
//! downloads through the egress broker next to a direct download.
//! `checkpoint` times a session's checkpoint per turn next to `git add -A
//! && git commit` on the same tree.
//!
//! The binary is its own sandbox supervisor. The agent's benchmarks are
//! `cordon-bench-agent`.

mod checkpoint;
mod cold;
mod density;
mod net;
mod warm;

use std::process::ExitCode;

pub(crate) use cordon_bench::cli::{Args, whoami};
pub(crate) use cordon_bench::stats;

use cordon_bench::cli::{self, Workspace};
use stats::Json;

const USAGE: &str = "usage: cordon-bench <warm|lifecycle|density|net|checkpoint|cold> [--OPTION VALUE]...
  warm      --execs N (2000) --warmup N (100) --concurrency N (8) --concurrent-execs N (2000)
  lifecycle --cycles N (100) --warmup N (10)
  density   --sessions N (100) --settle-ms MS (3000) --rounds N (3)
  net       --mib N (256) --rounds N (5) --requests N (200)
  checkpoint --files N (10000) --turns N (40) --changed N (10)
  cold      --runs N (300) --warmup N (20) --cmd 'LABEL=PROGRAM ARG...' (repeatable; argv split on
            whitespace, no quoting) --ratio-to LABEL (the second command) --space-ms MS (0: idle
            before each timed run)
  common    --json FILE  --workspace DIR (a fresh temporary directory)  --runtime multi|current (multi)";

fn main() -> ExitCode {
    // First, before any thread exists: this binary is also the supervisor.
    cordon_sandbox::supervisor::run_if_supervisor();
    cli::main("cordon-bench", USAGE, run)
}

fn run(args: &Args) -> Result<Json, String> {
    if args.command == "cold" {
        args.check_known(&["runs", "warmup", "cmd", "ratio-to", "space-ms"])?;
        return cold::run(args);
    }
    if args.command == "checkpoint" {
        args.check_known(&["files", "turns", "changed"])?;
        let ws = Workspace::new(args.str("workspace"))?;
        return checkpoint::run(args, &ws.path).map(|j| cli::labelled(args, j, None));
    }
    let known: &[&str] = match args.command.as_str() {
        "warm" => &["execs", "warmup", "concurrency", "concurrent-execs"],
        "lifecycle" => &["cycles", "warmup"],
        "density" => &["sessions", "settle-ms", "rounds"],
        "net" => &["mib", "rounds", "requests"],
        other => return Err(format!("unknown subcommand {other:?}\n{USAGE}")),
    };
    args.check_known(known)?;
    let (runtime, runtime_name) = cli::runtime(args, "multi")?;
    let ws = Workspace::new(args.str("workspace"))?;
    let result = runtime.block_on(async {
        match args.command.as_str() {
            "warm" => warm::warm(args, &ws.path).await,
            "lifecycle" => warm::lifecycle(args, &ws.path).await,
            "net" => net::run(args, &ws.path).await,
            _ => density::run(args, &ws.path).await,
        }
    });
    runtime.shutdown_timeout(std::time::Duration::from_secs(5));
    result.map(|j| cli::labelled(args, j, Some(&runtime_name)))
}

/// This binary's modules: each measures on its own, none uses another
/// (what they share is the library's).
#[cfg(test)]
mod layering {
    cordon_testkit::layering_test!(
        root "src/main.rs",
        &["checkpoint", "cold", "density", "net", "warm"]
    );
}
