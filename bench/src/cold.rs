//! Cold start of whole commands, timed round-robin: every round runs each
//! command once (starting from a different one each round), so that load
//! from other tenants of a shared host falls on all of them alike.

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use crate::Args;
use crate::stats::{Json, Summary, ms};

struct Cmd {
    label: String,
    argv: Vec<String>,
}

fn parse_cmd(s: &str) -> Result<Cmd, String> {
    let (label, line) = s
        .split_once('=')
        .ok_or_else(|| format!("--cmd {s:?}: expected LABEL=PROGRAM ARG..."))?;
    let argv: Vec<String> = line.split_whitespace().map(String::from).collect();
    if label.is_empty() || argv.is_empty() {
        return Err(format!("--cmd {s:?}: expected LABEL=PROGRAM ARG..."));
    }
    Ok(Cmd {
        label: label.to_string(),
        argv,
    })
}

fn time_once(c: &Cmd) -> Result<Duration, String> {
    let t = Instant::now();
    let status = Command::new(&c.argv[0])
        .args(&c.argv[1..])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("{}: cannot run {}: {e}", c.label, c.argv[0]))?;
    let d = t.elapsed();
    if !status.success() {
        return Err(format!(
            "{}: `{}` failed with {status}",
            c.label,
            c.argv.join(" ")
        ));
    }
    Ok(d)
}

pub fn run(args: &Args) -> Result<Json, String> {
    let runs = args.num("runs", 300)?;
    let warmup = args.num("warmup", 20)?;
    // Idle before each timed run: the spaced pattern, which a start that
    // waits on the kernel (an RCU grace period) pays and back to back hides.
    let space = Duration::from_millis(args.num("space-ms", 0)? as u64);
    let cmds = args
        .all("cmd")
        .iter()
        .map(|s| parse_cmd(s))
        .collect::<Result<Vec<_>, _>>()?;
    if cmds.is_empty() {
        return Err("cold needs at least one --cmd".into());
    }
    let base = match args.str("ratio-to") {
        Some(l) => cmds
            .iter()
            .position(|c| c.label == l)
            .ok_or_else(|| format!("--ratio-to {l:?} names no --cmd"))?,
        None => usize::from(cmds.len() > 1),
    };
    for _ in 0..warmup {
        for c in &cmds {
            time_once(c)?;
        }
    }
    let mut times: Vec<Vec<Duration>> = vec![Vec::with_capacity(runs); cmds.len()];
    for round in 0..runs {
        for k in 0..cmds.len() {
            let i = (round + k) % cmds.len();
            if !space.is_zero() {
                std::thread::sleep(space);
            }
            times[i].push(time_once(&cmds[i])?);
        }
    }
    let sums: Vec<Summary> = times.iter().map(|t| Summary::of(t)).collect();
    let b = sums[base];

    println!(
        "== Cold start, interleaved round-robin ({}; {runs} runs each after {warmup} warm-up{})",
        crate::whoami(),
        if space.is_zero() {
            String::new()
        } else {
            format!(", {} ms idle before each", space.as_millis())
        }
    );
    println!(
        "   {:<22} {:>9} {:>9} {:>9} {:>9} {:>9}  {:>11} {:>11}",
        "command (ms)",
        "min",
        "median",
        "p90",
        "p99",
        "mean",
        format!("med/{}", cmds[base].label),
        format!("p90/{}", cmds[base].label)
    );
    for (c, s) in cmds.iter().zip(&sums) {
        println!(
            "   {:<22} {:>9} {:>9} {:>9} {:>9} {:>9}  {:>11.2} {:>11.2}",
            c.label,
            ms(s.min),
            ms(s.p50),
            ms(s.p90),
            ms(s.p99),
            ms(s.mean),
            s.p50 / b.p50,
            s.p90 / b.p90
        );
    }
    println!();

    Ok(Json::obj([
        ("benchmark", Json::str("cold")),
        ("user", Json::str(crate::whoami())),
        ("runs", Json::Num(runs as f64)),
        ("warmup", Json::Num(warmup as f64)),
        ("space_ms", Json::Num(space.as_millis() as f64)),
        ("ratio_to", Json::str(&cmds[base].label)),
        (
            "commands",
            Json::Arr(
                cmds.iter()
                    .zip(&sums)
                    .zip(&times)
                    .map(|((c, s), t)| {
                        Json::obj([
                            ("label", Json::str(&c.label)),
                            ("argv", Json::Arr(c.argv.iter().map(Json::str).collect())),
                            ("summary", s.json()),
                            ("median_ratio", Json::Num(s.p50 / b.p50)),
                            ("p90_ratio", Json::Num(s.p90 / b.p90)),
                            (
                                "times_us",
                                Json::Arr(
                                    t.iter()
                                        .map(|d| Json::Num((d.as_secs_f64() * 1e7).round() / 10.0))
                                        .collect(),
                                ),
                            ),
                        ])
                    })
                    .collect(),
            ),
        ),
    ]))
}
