//! The agent loop's own cost per tool round trip.
//!
//! One `Agent::send` drives a scripted model that asks for a cheap tool at
//! every step. The tool is wrapped so that its start and end are timed
//! inline, on the loop's own thread: the gap between one call's end and
//! the next call's start is everything the loop does per round trip beyond
//! the tool (the result into the history, the next request built and sent,
//! the answer streamed and decoded, the events, the dispatch). Event
//! receive times are not used: on the single-threaded runtime `cordon`
//! runs on, a receiver only runs when the loop yields.
//!
//! Measured in the same run, alternating with the loop:
//! - the bare HTTP round trip: the very request bodies the loop sent,
//!   replayed in order with reqwest against a fresh server of the same
//!   scenario and read to the end, so the server's and the transport's
//!   share is known step by step;
//! - the tool alone, called directly through `Toolbox::call` in the same
//!   sandbox session.

use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_agent::context;
use cordon_agent::wire::anthropic_body;
use cordon_agent::{
    Agent, AgentConfig, Cancel, Message, ModelRequest, Provider, ProviderConfig, ProviderKind,
    ToolSpec,
};
use cordon_sandbox::{Sandbox, SandboxConfig};
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use cordon_tools::{Tool, ToolContext, ToolFuture, Toolbox};
use futures_util::StreamExt;
use serde_json::{Value, json};
use tokio::sync::mpsc;

use crate::Args;
use crate::stats::{Json, Summary, ms};

const GOAL_P50_US: f64 = 2000.0;

/// A system prompt of the length `cordon exec` sends.
const SYSTEM: &str = "You are a coding agent working in an isolated sandbox. The project is \
mounted at /workspace, there is no network and /tmp is scratch space. Work in small steps, run \
what you write to check it, and end with a short summary of what changed.";

const SMALL_FILE: &str = "small.txt";

/// Tool results sent whole, as `cordon exec` keeps them.
const KEEP_TOOL_OUTPUTS: usize = 8;

/// The one place the bench builds an `AgentConfig`, so that new fields
/// need one change here.
fn agent_config(max_steps: u32) -> AgentConfig {
    AgentConfig {
        system: SYSTEM.into(),
        max_tokens: 8192,
        max_steps,
        keep_tool_outputs: KEEP_TOOL_OUTPUTS,
        // 200 steps stay far below the default 200k window: no compaction
        // enters the measurement.
        ..AgentConfig::new("scripted")
    }
}

/// The tool every step calls.
#[derive(Clone, Copy)]
enum Probe {
    Bash,
    ReadFile,
}

impl Probe {
    fn name(self) -> &'static str {
        match self {
            Probe::Bash => "bash",
            Probe::ReadFile => "read_file",
        }
    }

    fn input(self) -> Value {
        match self {
            Probe::Bash => json!({"command": "true"}),
            Probe::ReadFile => json!({"path": SMALL_FILE}),
        }
    }

    fn label(self) -> &'static str {
        match self {
            Probe::Bash => "bash `true`",
            Probe::ReadFile => "read_file of a 10-line file",
        }
    }
}

fn scenario(probe: Probe, steps: usize) -> Scenario {
    let mut sc = Scenario::new();
    for k in 1..=steps {
        sc = sc.turn(Turn::text("Checking the next thing.").with_tool_call(
            format!("toolu_{k}"),
            probe.name(),
            probe.input(),
        ));
    }
    sc.turn(Turn::text("All checks done."))
}

/// Start, end and failure of every call, in call order.
type Calls = Arc<Mutex<Vec<(Instant, Instant, bool)>>>;

/// A tool that records when each call starts and ends.
struct Timed {
    inner: Arc<dyn Tool>,
    calls: Calls,
}

impl Tool for Timed {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn description(&self) -> &str {
        self.inner.description()
    }

    fn input_schema(&self) -> Value {
        self.inner.input_schema()
    }

    fn read_only(&self) -> bool {
        self.inner.read_only()
    }

    fn call<'a>(&'a self, ctx: &'a ToolContext, input: Value) -> ToolFuture<'a> {
        Box::pin(async move {
            let start = Instant::now();
            let out = self.inner.call(ctx, input).await;
            let end = Instant::now();
            self.calls
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .push((start, end, out.is_error));
            out
        })
    }
}

/// One step: the tool's run time and the loop's time from the tool's end
/// to the next tool's start (to the end of `send` after the last one), µs.
#[derive(Default, Clone, Copy)]
struct Step {
    tool: f64,
    gap: f64,
}

impl Step {
    fn round_trip(&self) -> f64 {
        self.tool + self.gap
    }
}

fn us(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

/// What one `Agent::send` left: each step, the request bodies the server
/// received in order, and the conversation.
struct LoopRun {
    steps: Vec<Step>,
    bodies: Vec<String>,
    history: Vec<Message>,
}

/// One `Agent::send` over `steps` tool round trips.
async fn loop_run(probe: Probe, steps: usize, ctx: &ToolContext) -> Result<LoopRun, String> {
    let server = ScriptedServer::start(scenario(probe, steps));
    let mut pc = ProviderConfig::new(ProviderKind::Anthropic, server.url());
    pc.api_key = Some("sk-bench".into());
    let provider = Provider::new(pc).map_err(|e| format!("provider: {e}"))?;
    let calls = Calls::default();
    let mut tools = Toolbox::standard();
    let inner = tools
        .get(probe.name())
        .cloned()
        .ok_or_else(|| format!("no {} tool", probe.name()))?;
    tools.register(Timed {
        inner,
        calls: calls.clone(),
    });
    let mut agent = Agent::new(provider, tools, ctx.clone(), agent_config(steps as u32 + 1));
    let (tx, mut rx) = mpsc::unbounded_channel();
    // A front end that only drains, so the loop's own work is what counts.
    let drain = tokio::spawn(async move {
        let mut n = 0usize;
        while rx.recv().await.is_some() {
            n += 1;
        }
        n
    });
    let result = agent.send("run the checks", &tx, &Cancel::new()).await;
    let done = Instant::now();
    drop(tx);
    let events = drain.await.map_err(|e| format!("drain: {e}"))?;
    let outcome = result.map_err(|e| format!("agent: {e}"))?;
    if let Some(f) = server.failures().first() {
        return Err(format!("the scripted server refused a request: {f}"));
    }
    if outcome.steps as usize != steps + 1 || events < 4 * steps {
        return Err(format!(
            "the loop made {} requests and {events} events, expected {} requests",
            outcome.steps,
            steps + 1
        ));
    }
    let bodies: Vec<String> = server.requests().into_iter().map(|r| r.raw_body).collect();
    let calls = std::mem::take(&mut *calls.lock().unwrap_or_else(|e| e.into_inner()));
    if calls.len() != steps || calls.iter().any(|c| c.2) {
        return Err(format!(
            "{} of {steps} {} calls, {} failed",
            calls.len(),
            probe.name(),
            calls.iter().filter(|c| c.2).count()
        ));
    }
    let steps = (0..steps)
        .map(|k| {
            let (start, end, _) = calls[k];
            let next = calls.get(k + 1).map_or(done, |c| c.0);
            Step {
                tool: us(end - start),
                gap: us(next - end),
            }
        })
        .collect();
    Ok(LoopRun {
        steps,
        bodies,
        history: agent.history().to_vec(),
    })
}

/// The time to turn the conversation as it stood after `k` steps into the
/// request body sent on the wire, which the loop does once per step: the
/// view with old tool output masked, the JSON value built from it, the
/// value serialised, and both dropped.
struct Encoding {
    step: usize,
    bytes: usize,
    view: f64,
    build: f64,
    serialise: f64,
    drop: f64,
}

fn encodings(history: &[Message], steps: usize) -> Vec<Encoding> {
    let tools: Vec<ToolSpec> = cordon_agent::agent::tool_specs(&Toolbox::standard());
    [steps / 4, steps / 2, 3 * steps / 4, steps]
        .into_iter()
        .filter(|&k| k > 0)
        .map(|k| {
            // The prompt, then an answer and a tool result per step.
            let prefix = &history[..(1 + 2 * k).min(history.len())];
            let (mut view, mut build, mut ser, mut dropped) = (vec![], vec![], vec![], vec![]);
            let mut bytes = 0;
            for _ in 0..21 {
                let t0 = Instant::now();
                let req = ModelRequest {
                    model: "scripted".into(),
                    system: SYSTEM.into(),
                    messages: context::view(prefix, KEEP_TOOL_OUTPUTS),
                    tools: tools.clone(),
                    max_tokens: 8192,
                    web_search: None,
                };
                let t1 = Instant::now();
                let body = anthropic_body(&req);
                let t2 = Instant::now();
                let wire = serde_json::to_vec(&body).unwrap_or_default();
                let t3 = Instant::now();
                drop(body);
                drop(req);
                let t4 = Instant::now();
                bytes = wire.len();
                view.push(us(t1 - t0));
                build.push(us(t2 - t1));
                ser.push(us(t3 - t2));
                dropped.push(us(t4 - t3));
            }
            Encoding {
                step: k,
                bytes,
                view: Summary::of_us(view).p50,
                build: Summary::of_us(build).p50,
                serialise: Summary::of_us(ser).p50,
                drop: Summary::of_us(dropped).p50,
            }
        })
        .collect()
}

/// Replays `bodies` in order against a fresh server of the same scenario,
/// each a streaming POST read to the end; returns each one's wall time (µs).
async fn http_replay(probe: Probe, steps: usize, bodies: &[String]) -> Result<Vec<f64>, String> {
    let server = ScriptedServer::start(scenario(probe, steps));
    let url = format!("{}/v1/messages", server.url());
    let client = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| format!("http client: {e}"))?;
    let mut out = Vec::with_capacity(bodies.len());
    for body in bodies {
        let t = Instant::now();
        let resp = client
            .post(&url)
            .header("content-type", "application/json")
            .header("anthropic-version", "2023-06-01")
            .header("x-api-key", "sk-bench")
            .body(body.clone())
            .send()
            .await
            .map_err(|e| format!("replay: {e}"))?;
        if !resp.status().is_success() {
            return Err(format!("replay: HTTP {}", resp.status()));
        }
        let mut stream = resp.bytes_stream();
        let mut n = 0;
        while let Some(chunk) = stream.next().await {
            n += chunk.map_err(|e| format!("replay body: {e}"))?.len();
        }
        out.push(us(t.elapsed()));
        if n == 0 {
            return Err("replay: empty body".into());
        }
    }
    if let Some(f) = server.failures().first() {
        return Err(format!(
            "the scripted server refused a replayed request: {f}"
        ));
    }
    Ok(out)
}

/// The tool alone, `n` times, in the loop's sandbox session.
async fn direct(probe: Probe, n: usize, ctx: &ToolContext) -> Result<Vec<f64>, String> {
    let tools = Toolbox::standard();
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        let t = Instant::now();
        let o = tools.call(ctx, probe.name(), probe.input()).await;
        out.push(us(t.elapsed()));
        if o.is_error {
            return Err(format!("{} failed: {}", probe.name(), o.text));
        }
    }
    Ok(out)
}

/// Everything measured for one tool, pooled over the rounds; the first
/// `warmup` steps of every loop run are left out.
#[derive(Default)]
struct Pool {
    steps: Vec<Step>,
    /// Step number (1-based) of each entry of `steps`.
    index: Vec<usize>,
    /// The bare HTTP time and body size of the request in each step's gap.
    http: Vec<f64>,
    body_bytes: Vec<f64>,
    direct: Vec<f64>,
    encodings: Vec<Encoding>,
}

impl Pool {
    fn series(&self, f: impl Fn(&Step) -> f64) -> Vec<f64> {
        self.steps.iter().map(f).collect()
    }

    /// The loop's own time: its gap minus the bare HTTP time of the same
    /// request body.
    fn loop_only(&self, i: usize) -> f64 {
        self.steps[i].gap - self.http[i]
    }
}

async fn measure(
    probe: Probe,
    steps: usize,
    rounds: usize,
    warmup: usize,
    ctx: &ToolContext,
) -> Result<Pool, String> {
    let mut pool = Pool::default();
    // Warm the sandbox session (the bash tool's shell starts on first use).
    direct(probe, warmup.max(1), ctx).await?;
    let mut history = Vec::new();
    for _ in 0..rounds {
        let run = loop_run(probe, steps, ctx).await?;
        let http = http_replay(probe, steps, &run.bodies).await?;
        let dir = direct(probe, steps, ctx).await?;
        for k in warmup..steps {
            pool.steps.push(run.steps[k]);
            pool.index.push(k + 1);
            // Request k + 1 (0-based) is the one sent after tool call k.
            pool.http.push(http[k + 1]);
            pool.body_bytes.push(run.bodies[k + 1].len() as f64);
        }
        pool.direct.extend(&dir[warmup.min(dir.len())..]);
        history = run.history;
    }
    pool.encodings = encodings(&history, steps);
    Ok(pool)
}

fn row(name: &str, s: &Summary) {
    println!(
        "   {:<58} {:>8} {:>8} {:>8} {:>8}",
        name,
        ms(s.p50),
        ms(s.p90),
        ms(s.p99),
        ms(s.mean)
    );
}

fn report(
    probe: Probe,
    (steps, rounds, warmup): (usize, usize, usize),
    runtime: &str,
    pool: &Pool,
) -> Json {
    let n = pool.steps.len();
    let rt = Summary::of_us(pool.series(Step::round_trip));
    let tool = Summary::of_us(pool.series(|s| s.tool));
    let overhead = Summary::of_us(pool.series(|s| s.gap));
    let http = Summary::of_us(pool.http.clone());
    let loop_only = Summary::of_us((0..n).map(|i| pool.loop_only(i)).collect());
    let direct = Summary::of_us(pool.direct.clone());
    let conservative = Summary::of_us(pool.series(|s| s.round_trip() - direct.p50));

    println!(
        "== Agent loop: {} per step, {steps} steps per Agent::send, {rounds} rounds ({}, {runtime} runtime)",
        probe.label(),
        crate::whoami()
    );
    println!(
        "   scripted server over HTTP on 127.0.0.1, no delay; first {warmup} steps of each run left out; {n} steps pooled"
    );
    println!();
    println!(
        "   {:<58} {:>8} {:>8} {:>8} {:>8}",
        "per tool round trip (ms)", "p50", "p90", "p99", "mean"
    );
    row("loop round trip (one tool call's start to the next's)", &rt);
    row("  the tool call, timed inside the loop", &tool);
    row(
        "  OVERHEAD: the rest (tool end to the next tool start)",
        &overhead,
    );
    row(
        "bare HTTP round trip, same bodies (reqwest, read to end)",
        &http,
    );
    row(
        "overhead - bare HTTP, paired by step (the loop's own)",
        &loop_only,
    );
    row(
        "tool called directly (Toolbox::call), same session",
        &direct,
    );
    row(
        "round trip - direct tool p50 (a stricter overhead)",
        &conservative,
    );
    println!();
    println!(
        "   ratios of p50: overhead / bare HTTP {:.2}; in-loop tool / direct tool {:.2}",
        overhead.p50 / http.p50,
        tool.p50 / direct.p50
    );
    // The history grows every step, and with it each request.
    let span = steps - warmup;
    let quarters: Vec<Json> = (0..4)
        .map(|q| {
            let idx: Vec<usize> = (0..n)
                .filter(|&i| (pool.index[i] - warmup - 1) * 4 / span == q)
                .collect();
            let pick = |v: &dyn Fn(usize) -> f64| {
                Summary::of_us(idx.iter().map(|&i| v(i)).collect())
            };
            let o = pick(&|i| pool.steps[i].gap);
            let h = pick(&|i| pool.http[i]);
            let l = pick(&|i| pool.loop_only(i));
            let b = pick(&|i| pool.body_bytes[i]);
            let lo = idx.iter().map(|&i| pool.index[i]).min().unwrap_or(0);
            let hi = idx.iter().map(|&i| pool.index[i]).max().unwrap_or(0);
            println!(
                "   steps {lo:>3}-{hi:<3}: request {:>5.1} KB; p50 overhead {} ms, bare HTTP {} ms, loop's own {} ms",
                b.p50 / 1000.0,
                ms(o.p50),
                ms(h.p50),
                ms(l.p50)
            );
            Json::obj([
                ("first_step", Json::Num(lo as f64)),
                ("last_step", Json::Num(hi as f64)),
                ("body_bytes_p50", Json::Num(b.p50)),
                ("overhead", o.json()),
                ("bare_http", h.json()),
                ("loop_only", l.json()),
            ])
        })
        .collect();
    for e in &pool.encodings {
        println!(
            "   encoding the request after {:>3} steps ({:>5.1} KB): {} ms = view {} + JSON value {} + serialise {} + drop {}",
            e.step,
            e.bytes as f64 / 1000.0,
            ms(e.view + e.build + e.serialise + e.drop),
            ms(e.view),
            ms(e.build),
            ms(e.serialise),
            ms(e.drop)
        );
    }
    let met = overhead.p50 < GOAL_P50_US;
    println!(
        "   goal: overhead p50 < 2 ms beyond the tool: {} (p50 {} ms, p90 {} ms)",
        if met { "MET" } else { "NOT MET" },
        ms(overhead.p50),
        ms(overhead.p90)
    );
    println!();
    Json::obj([
        ("tool", Json::str(probe.name())),
        ("input", Json::str(probe.input().to_string())),
        ("steps", Json::Num(steps as f64)),
        ("rounds", Json::Num(rounds as f64)),
        ("warmup_steps", Json::Num(warmup as f64)),
        ("round_trip", rt.json()),
        ("tool_in_loop", tool.json()),
        ("overhead", overhead.json()),
        ("bare_http", http.json()),
        ("loop_only", loop_only.json()),
        ("tool_direct", direct.json()),
        ("round_trip_minus_direct_tool", conservative.json()),
        ("quarters", Json::Arr(quarters)),
        (
            "encoding",
            Json::Arr(
                pool.encodings
                    .iter()
                    .map(|e| {
                        Json::obj([
                            ("after_steps", Json::Num(e.step as f64)),
                            ("bytes", Json::Num(e.bytes as f64)),
                            ("view_us", Json::Num(e.view)),
                            ("build_us", Json::Num(e.build)),
                            ("serialise_us", Json::Num(e.serialise)),
                            ("drop_us", Json::Num(e.drop)),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("goal_p50_us", Json::Num(GOAL_P50_US)),
        ("goal_met", Json::Bool(met)),
    ])
}

pub async fn run(args: &Args, workspace: &Path) -> Result<Json, String> {
    let steps = args.num("steps", 200)?.max(2);
    let rounds = args.num("rounds", 3)?.max(1);
    let warmup = args.num("warmup", 10)?.min(steps - 1);
    let runtime = args.str("runtime").unwrap_or("current");
    let text: String = (1..=10)
        .map(|i| format!("line {i} of a small file\n"))
        .collect();
    std::fs::write(workspace.join(SMALL_FILE), text)
        .map_err(|e| format!("write {SMALL_FILE}: {e}"))?;
    let sandbox = Sandbox::create(SandboxConfig::new(workspace))
        .await
        .map_err(|e| format!("create the sandbox: {e}"))?;
    let ctx = ToolContext::new(sandbox.clone(), workspace);
    let result = async {
        let mut out = Vec::new();
        for probe in [Probe::Bash, Probe::ReadFile] {
            let pool = measure(probe, steps, rounds, warmup, &ctx).await?;
            out.push(report(probe, (steps, rounds, warmup), runtime, &pool));
        }
        Ok::<_, String>(out)
    }
    .await;
    sandbox.close().await;
    Ok(Json::obj([("tools", Json::Arr(result?))]))
}
