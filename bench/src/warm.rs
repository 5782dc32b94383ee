//! Warm exec latency and throughput in one live session, and the phases of
//! a library cold start.

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use cordon_sandbox::{ExecRequest, Sandbox, SandboxConfig};

use crate::Args;
use crate::stats::{Json, Summary, ms};

const GOAL_P50_US: f64 = 2000.0;

async fn exec_true(sb: &Sandbox) -> Result<Duration, String> {
    let out = sb
        .exec(ExecRequest::argv(["/bin/true"]))
        .await
        .map_err(|e| format!("exec /bin/true in the sandbox: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "/bin/true in the sandbox exited with {:?}",
            out.status
        ));
    }
    Ok(out.duration)
}

async fn host_true() -> Result<(), String> {
    let out = tokio::process::Command::new("/bin/true")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .map_err(|e| format!("spawn /bin/true on the host: {e}"))?;
    if !out.status.success() {
        return Err("/bin/true on the host failed".into());
    }
    Ok(())
}

/// Which runner a measurement uses.
#[derive(Clone)]
enum Runner {
    Sandbox(Sandbox),
    Host,
}

impl Runner {
    /// Runs `/bin/true` once; returns the wall time seen by the caller and,
    /// for the sandbox, the time the supervisor measured (fork to reap).
    async fn once(&self) -> Result<(Duration, Option<Duration>), String> {
        let t = Instant::now();
        let inner = match self {
            Runner::Sandbox(sb) => Some(exec_true(sb).await?),
            Runner::Host => {
                host_true().await?;
                None
            }
        };
        Ok((t.elapsed(), inner))
    }
}

struct Sequential {
    wall: Summary,
    inner: Option<Summary>,
}

async fn sequential(r: &Runner, warmup: usize, n: usize) -> Result<Sequential, String> {
    for _ in 0..warmup {
        r.once().await?;
    }
    let mut wall = Vec::with_capacity(n);
    let mut inner = Vec::with_capacity(n);
    for _ in 0..n {
        let (w, i) = r.once().await?;
        wall.push(w);
        inner.extend(i);
    }
    Ok(Sequential {
        wall: Summary::of(&wall),
        inner: (!inner.is_empty()).then(|| Summary::of(&inner)),
    })
}

struct Concurrent {
    execs: usize,
    elapsed: Duration,
    latency: Summary,
}

impl Concurrent {
    fn rate(&self) -> f64 {
        self.execs as f64 / self.elapsed.as_secs_f64()
    }
}

/// `concurrency` tasks share `total` execs; returns the wall time for all.
async fn concurrent(r: &Runner, concurrency: usize, total: usize) -> Result<Concurrent, String> {
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..concurrency {
        let (r, next) = (r.clone(), next.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while next.fetch_add(1, Ordering::Relaxed) < total {
                lat.push(r.once().await?.0);
            }
            Ok::<_, String>(lat)
        }));
    }
    let mut all = Vec::with_capacity(total);
    for t in tasks {
        all.extend(t.await.map_err(|e| format!("task: {e}"))??);
    }
    Ok(Concurrent {
        execs: all.len(),
        elapsed: start.elapsed(),
        latency: Summary::of(&all),
    })
}

pub async fn warm(args: &Args, workspace: &Path) -> Result<Json, String> {
    let execs = args.num("execs", 2000)?;
    let warmup = args.num("warmup", 100)?;
    let conc = args.num("concurrency", 8)?.max(1);
    let conc_execs = args.num("concurrent-execs", 2000)?;

    let t = Instant::now();
    let sb = Sandbox::create(SandboxConfig::new(workspace))
        .await
        .map_err(|e| format!("create the sandbox: {e}"))?;
    let create = t.elapsed();
    let info = sb.info().clone();
    let sandbox = Runner::Sandbox(sb.clone());
    let result = async {
        let seq = sequential(&sandbox, warmup, execs).await?;
        let par = concurrent(&sandbox, conc, conc_execs).await?;
        let host_seq = sequential(&Runner::Host, warmup, execs).await?;
        let host_par = concurrent(&Runner::Host, conc, conc_execs).await?;
        Ok::<_, String>((seq, par, host_seq, host_par))
    }
    .await;
    sb.close().await;
    let (seq, par, host_seq, host_par) = result?;

    println!(
        "== Warm exec: /bin/true in one live session ({})",
        crate::whoami()
    );
    println!(
        "   session: limits {}; landlock {}; {} seccomp filters; created in {} ms",
        info.limits,
        info.landlock,
        info.seccomp_filters,
        ms(create.as_secs_f64() * 1e6)
    );
    println!(
        "   {execs} sequential execs after {warmup} warm-up; then {conc_execs} execs over {conc} concurrent tasks"
    );
    println!();
    println!(
        "   {:<44} {:>9} {:>9} {:>9} {:>9} {:>9}",
        "latency (ms)", "min", "p50", "p90", "p99", "mean"
    );
    let row = |name: &str, s: &Summary| {
        println!(
            "   {:<44} {:>9} {:>9} {:>9} {:>9} {:>9}",
            name,
            ms(s.min),
            ms(s.p50),
            ms(s.p90),
            ms(s.p99),
            ms(s.mean)
        );
    };
    row("cordon exec, sequential (caller's view)", &seq.wall);
    if let Some(i) = &seq.inner {
        row("  of which inside the sandbox (fork..reap)", i);
    }
    row(
        "host spawn of /bin/true (tokio), sequential",
        &host_seq.wall,
    );
    row(&format!("cordon exec, {conc} concurrent"), &par.latency);
    row(&format!("host spawn, {conc} concurrent"), &host_par.latency);
    println!();
    println!(
        "   throughput: cordon {:.0} execs/s sequential, {:.0} execs/s with {conc} concurrent; host {:.0} / {:.0}",
        1e6 / seq.wall.mean,
        par.rate(),
        1e6 / host_seq.wall.mean,
        host_par.rate()
    );
    let met = seq.wall.p50 <= GOAL_P50_US;
    println!(
        "   goal p50 <= 2 ms: {} (p50 {} ms)",
        if met { "MET" } else { "NOT MET" },
        ms(seq.wall.p50)
    );
    println!();

    Ok(Json::obj([
        ("limits", Json::str(info.limits)),
        ("landlock", Json::str(info.landlock)),
        (
            "seccomp_filters",
            Json::Num(f64::from(info.seccomp_filters)),
        ),
        ("create_us", Json::Num(create.as_secs_f64() * 1e6)),
        ("warmup", Json::Num(warmup as f64)),
        (
            "sequential",
            Json::obj([
                ("cordon", seq.wall.json()),
                ("cordon_inside", seq.inner.map_or(Json::Null, |s| s.json())),
                ("host", host_seq.wall.json()),
            ]),
        ),
        (
            "concurrent",
            Json::obj([
                ("concurrency", Json::Num(conc as f64)),
                ("execs", Json::Num(par.execs as f64)),
                ("cordon_elapsed_s", Json::Num(par.elapsed.as_secs_f64())),
                ("cordon_execs_per_s", Json::Num(par.rate())),
                ("cordon_latency", par.latency.json()),
                ("host_execs_per_s", Json::Num(host_par.rate())),
                ("host_latency", host_par.latency.json()),
            ]),
        ),
        ("goal_p50_us", Json::Num(GOAL_P50_US)),
        ("goal_met", Json::Bool(met)),
    ]))
}

/// Create, first exec and close, repeated: where a library cold start goes.
pub async fn lifecycle(args: &Args, workspace: &Path) -> Result<Json, String> {
    let cycles = args.num("cycles", 100)?;
    let warmup = args.num("warmup", 10)?;
    let (mut create, mut first, mut close, mut total) = (vec![], vec![], vec![], vec![]);
    let mut limits = String::new();
    for i in 0..warmup + cycles {
        let t0 = Instant::now();
        let sb = Sandbox::create(SandboxConfig::new(workspace))
            .await
            .map_err(|e| format!("create the sandbox: {e}"))?;
        let t1 = Instant::now();
        let r = exec_true(&sb).await;
        let t2 = Instant::now();
        sb.close().await;
        let t3 = Instant::now();
        r?;
        if limits.is_empty() {
            limits = sb.info().limits.clone();
        }
        if i >= warmup {
            create.push(t1 - t0);
            first.push(t2 - t1);
            close.push(t3 - t2);
            total.push(t3 - t0);
        }
    }
    let [create, first, close, total] = [create, first, close, total].map(|v| Summary::of(&v));
    println!(
        "== Library cold start: create + first exec + close ({})",
        crate::whoami()
    );
    println!("   limits: {limits}; {cycles} cycles after {warmup} warm-up");
    println!();
    println!(
        "   {:<28} {:>9} {:>9} {:>9} {:>9}",
        "phase (ms)", "p50", "p90", "p99", "mean"
    );
    for (name, s) in [
        ("Sandbox::create", &create),
        ("first exec of /bin/true", &first),
        ("Sandbox::close", &close),
        ("total", &total),
    ] {
        println!(
            "   {:<28} {:>9} {:>9} {:>9} {:>9}",
            name,
            ms(s.p50),
            ms(s.p90),
            ms(s.p99),
            ms(s.mean)
        );
    }
    println!();
    Ok(Json::obj([
        ("limits", Json::str(limits)),
        ("cycles", Json::Num(cycles as f64)),
        ("create", create.json()),
        ("first_exec", first.json()),
        ("close", close.json()),
        ("total", total.json()),
    ]))
}
