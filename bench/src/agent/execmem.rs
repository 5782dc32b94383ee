//! Resident memory of the real `cordon exec` while it waits on the model.
//!
//! The scripted model streams slowly (a pause before every event), so the
//! agent spends seconds waiting: first on the answer to the task, then,
//! after a `bash` call has started the sandbox's shell, on the next answer.
//! Meanwhile the cordon process and its descendants are sampled from /proc.
//! The peer, in the same run and alternating with it, is `cordon run --
//! sleep` with the same sandbox: the sandbox without the agent.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cordon_bench::procfs::{Rollup, descendants, median, mib};
use cordon_testkit::{Fault, Scenario, ScriptedServer, Turn};
use serde_json::json;

use crate::Args;
use crate::stats::{Json, MIB};

const GOAL_BYTES: f64 = 30.0 * MIB;

/// One process's memory, in bytes.
#[derive(Debug, Clone, Copy, Default)]
struct Mem {
    rss: f64,
    anon: f64,
    file: f64,
    hwm: f64,
    pss: f64,
    procs: usize,
}

impl Mem {
    fn read(pid: i32) -> Option<Mem> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let field = |k: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(k))
                .and_then(|r| r.split_whitespace().next()?.parse::<f64>().ok())
                .map_or(0.0, |kb| kb * 1024.0)
        };
        let pss = Rollup::read(pid).map_or(f64::NAN, |r| r.pss);
        Some(Mem {
            rss: field("VmRSS:"),
            anon: field("RssAnon:"),
            file: field("RssFile:"),
            hwm: field("VmHWM:"),
            pss,
            procs: 1,
        })
    }

    fn add(&mut self, o: Mem) {
        self.rss += o.rss;
        self.anon += o.anon;
        self.file += o.file;
        self.hwm += o.hwm;
        self.pss += o.pss;
        self.procs += o.procs;
    }
}

/// The cordon process, its sandbox supervisors, and what runs in the
/// sandbox, at one instant.
#[derive(Debug, Clone, Copy, Default)]
struct Snapshot {
    cordon: Mem,
    supervisors: Mem,
    workload: Mem,
}

impl Snapshot {
    fn take(pid: i32) -> Option<Snapshot> {
        let cordon = Mem::read(pid)?;
        let mut s = Snapshot {
            cordon,
            ..Snapshot::default()
        };
        for p in descendants(pid) {
            let comm = std::fs::read_to_string(format!("/proc/{p}/comm")).unwrap_or_default();
            let Some(m) = Mem::read(p) else { continue };
            // The exec'd supervisor keeps the binary's name; a forked one
            // renames itself.
            if matches!(comm.trim(), "cordon" | "cordon-sandbox") {
                s.supervisors.add(m);
            } else {
                s.workload.add(m);
            }
        }
        Some(s)
    }

    fn total(&self) -> Mem {
        let mut t = self.cordon;
        t.add(self.supervisors);
        t.add(self.workload);
        t
    }
}

struct Env {
    cordon: PathBuf,
    ws: PathBuf,
    home: PathBuf,
}

impl Env {
    fn command(&self) -> Command {
        let mut c = Command::new(&self.cordon);
        c.current_dir(&self.ws)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join("config"))
            .env("XDG_DATA_HOME", self.home.join("data"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        c
    }
}

fn scenario(delay_ms: u64) -> Scenario {
    Scenario::new()
        .turn(
            Turn::text("Looking around first.")
                .with_tool_call("t1", "bash", json!({"command": "echo ready"}))
                .fault(Fault::chunk_delay_ms(delay_ms)),
        )
        .turn(
            Turn::text("The workspace is ready.")
                .expect_tool_results(["t1"])
                .fault(Fault::chunk_delay_ms(delay_ms)),
        )
}

/// Waits for the child, killing it after `limit`; returns its stderr on failure.
fn finish(mut child: Child, limit: Duration, what: &str) -> Result<(), String> {
    let start = Instant::now();
    loop {
        if let Some(st) = child.try_wait().map_err(|e| format!("{what}: {e}"))? {
            if st.success() {
                return Ok(());
            }
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                use std::io::Read;
                let _ = e.read_to_string(&mut err);
            }
            return Err(format!("{what} exited with {st}: {}", err.trim()));
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("{what} did not finish within {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One `cordon exec`: samples by the number of model requests made so far
/// (1: waiting on the first answer, 2: on the second).
fn exec_once(env: &Env, delay_ms: u64, every: Duration) -> Result<[Vec<Snapshot>; 2], String> {
    let server = ScriptedServer::start(scenario(delay_ms));
    let child = env
        .command()
        .args([
            "exec",
            "look around, then say whether the workspace is ready",
        ])
        .env("ANTHROPIC_BASE_URL", server.url())
        .env("ANTHROPIC_API_KEY", "sk-bench-0000000000")
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", env.cordon.display()))?;
    let pid = child.id() as i32;
    let mut phases: [Vec<Snapshot>; 2] = [Vec::new(), Vec::new()];
    let mut child = child;
    let start = Instant::now();
    while child.try_wait().map_err(|e| e.to_string())?.is_none()
        && start.elapsed() < Duration::from_secs(120)
    {
        let n = server.requests().len();
        if (1..=2).contains(&n)
            && let Some(s) = Snapshot::take(pid)
        {
            // The request count may have moved on while sampling.
            if server.requests().len() == n {
                phases[n - 1].push(s);
            }
        }
        std::thread::sleep(every);
    }
    finish(child, Duration::from_secs(10), "cordon exec")?;
    if let Some(f) = server.failures().first() {
        return Err(format!("the scripted server refused a request: {f}"));
    }
    if server.remaining_turns() != 0 {
        return Err("cordon exec ended before the scenario did".into());
    }
    Ok(phases)
}

/// One `cordon run -- sleep`, sampled while `sleep` runs.
fn run_once(env: &Env, secs: f64, every: Duration) -> Result<Vec<Snapshot>, String> {
    let child = env
        .command()
        .args(["run", "--", "sleep", &format!("{secs}")])
        .spawn()
        .map_err(|e| format!("spawn {}: {e}", env.cordon.display()))?;
    let pid = child.id() as i32;
    let mut child = child;
    let mut out = Vec::new();
    let start = Instant::now();
    while child.try_wait().map_err(|e| e.to_string())?.is_none()
        && start.elapsed() < Duration::from_secs(60)
    {
        if let Some(s) = Snapshot::take(pid) {
            // Only once the sandbox is up and its command running.
            if s.workload.procs > 0 {
                out.push(s);
            }
        }
        std::thread::sleep(every);
    }
    finish(child, Duration::from_secs(10), "cordon run")?;
    Ok(out)
}

/// Field-wise medians over samples.
fn med(samples: &[Snapshot], f: impl Fn(&Snapshot) -> Mem) -> Mem {
    let col = |g: &dyn Fn(&Mem) -> f64| median(samples.iter().map(|s| g(&f(s))).collect());
    Mem {
        rss: col(&|m| m.rss),
        anon: col(&|m| m.anon),
        file: col(&|m| m.file),
        hwm: samples.iter().map(|s| f(s).hwm).fold(0.0, f64::max),
        pss: col(&|m| m.pss),
        procs: samples.iter().map(|s| f(s).procs).max().unwrap_or(0),
    }
}

fn mem_json(m: &Mem) -> Json {
    Json::obj([
        ("processes", Json::Num(m.procs as f64)),
        ("vmrss_bytes", Json::Num(m.rss)),
        ("rss_anon_bytes", Json::Num(m.anon)),
        ("rss_file_bytes", Json::Num(m.file)),
        ("pss_bytes", Json::Num(m.pss)),
        ("vmhwm_max_bytes", Json::Num(m.hwm)),
    ])
}

struct Group {
    name: &'static str,
    samples: Vec<Snapshot>,
}

impl Group {
    fn print(&self) {
        let s = &self.samples;
        println!("   {} ({} samples)", self.name, s.len());
        for (label, m) in [
            ("cordon process", med(s, |x| x.cordon)),
            ("sandbox supervisors", med(s, |x| x.supervisors)),
            ("command in the sandbox", med(s, |x| x.workload)),
            ("total", med(s, |x| x.total())),
        ] {
            println!(
                "     {:<26} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}",
                label,
                m.procs,
                mib(m.rss),
                mib(m.anon),
                mib(m.file),
                mib(m.pss),
                mib(m.hwm)
            );
        }
    }

    fn json(&self) -> Json {
        let s = &self.samples;
        Json::obj([
            ("name", Json::str(self.name)),
            ("samples", Json::Num(s.len() as f64)),
            ("cordon", mem_json(&med(s, |x| x.cordon))),
            ("supervisors", mem_json(&med(s, |x| x.supervisors))),
            ("workload", mem_json(&med(s, |x| x.workload))),
            ("total", mem_json(&med(s, |x| x.total()))),
        ])
    }
}

pub fn run(args: &Args, workspace: &Path) -> Result<Json, String> {
    let cordon = PathBuf::from(args.str("cordon").ok_or("--cordon PATH is required")?);
    let cordon =
        std::fs::canonicalize(&cordon).map_err(|e| format!("{}: {e}", cordon.display()))?;
    let runs = args.num("runs", 3)?.max(1);
    let delay_ms = args.num("delay-ms", 300)? as u64;
    let every = Duration::from_millis(args.num("interval-ms", 100)? as u64);
    let (ws, home) = (
        workspace.join("exec-memory-ws"),
        workspace.join("exec-memory-home"),
    );
    for d in [&ws, &home] {
        std::fs::create_dir_all(d).map_err(|e| format!("{}: {e}", d.display()))?;
    }
    let env = Env {
        cordon: cordon.clone(),
        ws: ws.clone(),
        home: home.clone(),
    };
    let (mut first, mut second, mut peer) = (Vec::new(), Vec::new(), Vec::new());
    let mut per_run = Vec::new();
    for _ in 0..runs {
        let [a, b] = exec_once(&env, delay_ms, every)?;
        let p = run_once(&env, 3.0, every)?;
        per_run.push((
            med(&a, |x| x.cordon).rss,
            med(&b, |x| x.cordon).rss,
            med(&p, |x| x.cordon).rss,
        ));
        first.extend(a);
        second.extend(b);
        peer.extend(p);
    }
    let _ = std::fs::remove_dir_all(&home);
    let _ = std::fs::remove_dir_all(&ws);
    if first.is_empty() || second.is_empty() || peer.is_empty() {
        return Err("no samples: the waits were shorter than the sampling interval".into());
    }
    let groups = [
        Group {
            name: "cordon exec, waiting on the first answer",
            samples: first,
        },
        Group {
            name: "cordon exec, waiting on the second answer (after a bash call)",
            samples: second,
        },
        Group {
            name: "peer: cordon run -- sleep 3 (same sandbox, no agent)",
            samples: peer,
        },
    ];

    println!(
        "== Memory of cordon exec while it waits on the model ({})",
        crate::whoami()
    );
    println!(
        "   {runs} runs of cordon exec against a scripted model pausing {delay_ms} ms before every streamed event, each followed by cordon run -- sleep 3; /proc sampled every {} ms; medians over samples (VmHWM: the highest)",
        every.as_millis()
    );
    println!();
    println!(
        "     {:<26} {:>5} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "MiB", "procs", "VmRSS", "RssAnon", "RssFile", "Pss", "VmHWM"
    );
    for g in &groups {
        g.print();
    }
    let exec_main = med(&groups[1].samples, |x| x.cordon);
    let exec_total = med(&groups[1].samples, |x| x.total());
    let run_main = med(&groups[2].samples, |x| x.cordon);
    let run_total = med(&groups[2].samples, |x| x.total());
    println!();
    println!(
        "   per run, cordon process VmRSS (first wait / second wait / run peer): {}",
        per_run
            .iter()
            .map(|(a, b, c)| format!("{}/{}/{}", mib(*a), mib(*b), mib(*c)))
            .collect::<Vec<_>>()
            .join("  ")
    );
    println!(
        "   the agent's own cost (second wait, VmRSS of the cordon process): exec {} - run {} = {} MiB; ratio {:.2}",
        mib(exec_main.rss),
        mib(run_main.rss),
        mib(exec_main.rss - run_main.rss),
        exec_main.rss / run_main.rss
    );
    println!(
        "   totals (Pss, cordon + supervisors + command): exec {} MiB, run {} MiB",
        mib(exec_total.pss),
        mib(run_total.pss)
    );
    let verdict = |b: f64| if b < GOAL_BYTES { "MET" } else { "NOT MET" };
    println!(
        "   goal < 30 MiB: {} for the cordon process (VmRSS {} MiB); {} for everything (VmRSS sum {} MiB, Pss sum {} MiB)",
        verdict(exec_main.rss),
        mib(exec_main.rss),
        verdict(exec_total.rss),
        mib(exec_total.rss),
        mib(exec_total.pss)
    );
    println!();

    Ok(Json::obj([
        ("cordon", Json::str(cordon.display().to_string())),
        ("runs", Json::Num(runs as f64)),
        ("delay_ms", Json::Num(delay_ms as f64)),
        ("interval_ms", Json::Num(every.as_millis() as f64)),
        (
            "groups",
            Json::Arr(groups.iter().map(Group::json).collect()),
        ),
        ("goal_bytes", Json::Num(GOAL_BYTES)),
        (
            "goal_met_cordon_process",
            Json::Bool(exec_main.rss < GOAL_BYTES),
        ),
        (
            "goal_met_total_rss",
            Json::Bool(exec_total.rss < GOAL_BYTES),
        ),
    ]))
}
