//! The session log as it grows: the cost of one append from the first
//! record to the 10,000th, and of loading a log that long.
//!
//! The records mimic a long `cordon exec` session: per model step a
//! `turn_started`, an `assistant_message`, a `tool_call_started`, a
//! `tool_call_finished` with 1-4 KB of output, and the two history messages
//! (the assistant's tool call and the user's tool result, which repeats the
//! output). Next to every append, in the same loop, the same line already
//! encoded is written with one `write` to a second `O_APPEND` file: the
//! floor an append cannot go below.

use std::fs::OpenOptions;
use std::io::Write;
use std::path::Path;
use std::time::Instant;

use cordon_agent::SessionLog;
use serde_json::{Value, json};

use crate::Args;
use crate::stats::{Json, MIB, Summary, ms};

/// A small deterministic generator: the same records on every run.
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> u64 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        self.0 >> 33
    }

    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + (self.next() as usize) % (hi - lo + 1)
    }
}

/// Test-runner-like output of `len` bytes or a little more, with quotes,
/// tabs and a non-ASCII character so that encoding has escaping to do.
fn tool_output(rng: &mut Lcg, len: usize) -> String {
    let mut s = String::with_capacity(len + 64);
    let mut i = 0;
    while s.len() < len {
        i += 1;
        let ms = rng.range(0, 900);
        s.push_str(&format!(
            "test parser::tests::case_{i:04} ... ok\t({ms} ms) \"input→output\"\n"
        ));
    }
    s
}

/// The records of a session `n` records long, in append order.
fn records(n: usize) -> Vec<Value> {
    let mut rng = Lcg(0x5eed);
    let mut out = Vec::with_capacity(n + 6);
    let mut step = 0;
    while out.len() < n {
        step += 1;
        let id = format!("toolu_{step:06}");
        let command = format!("cargo test -p parser case_{}", rng.range(1, 9999));
        let len = rng.range(1024, 4096);
        let output = tool_output(&mut rng, len);
        let text = "Running the parser tests again to check the fix for empty input.";
        let usage = json!({
            "input_tokens": rng.range(50, 3000),
            "output_tokens": rng.range(20, 400),
            "cache_read_tokens": rng.range(0, 60000),
            "cache_write_tokens": rng.range(0, 2000),
        });
        out.push(json!({"type": "turn_started", "step": step}));
        out.push(json!({
            "type": "assistant_message",
            "text": text,
            "stop_reason": "tool_use",
            "usage": usage,
        }));
        out.push(json!({
            "type": "tool_call_started",
            "id": id,
            "name": "bash",
            "input": {"command": command},
        }));
        out.push(json!({
            "type": "tool_call_finished",
            "id": id,
            "name": "bash",
            "output": output,
            "is_error": false,
            "structured": {"exit_code": 0},
            "duration_ms": rng.range(5, 4000),
        }));
        out.push(json!({
            "type": "message",
            "message": {"role": "assistant", "content": [
                {"type": "text", "text": text},
                {"type": "tool_use", "id": id, "name": "bash", "input": {"command": command}},
            ], "stop_reason": "tool_use", "usage": usage},
        }));
        out.push(json!({
            "type": "message",
            "message": {"role": "user", "tool_results": [
                {"tool_use_id": id, "content": output, "is_error": false},
            ]},
        }));
    }
    out.truncate(n);
    out
}

struct Round {
    append: Vec<f64>,
    raw: Vec<f64>,
    sync: f64,
    bytes: u64,
}

fn one_log(dir: &Path, round: usize, recs: &[Value]) -> Result<Round, String> {
    let path = dir.join(format!("session-{round}.jsonl"));
    let raw_path = dir.join(format!("raw-{round}.jsonl"));
    let _ = std::fs::remove_file(&path);
    let _ = std::fs::remove_file(&raw_path);
    let mut log = SessionLog::<Value>::create(&path).map_err(|e| e.to_string())?;
    let mut raw = OpenOptions::new()
        .append(true)
        .create_new(true)
        .open(&raw_path)
        .map_err(|e| format!("{}: {e}", raw_path.display()))?;
    // Encoded up front so that the peer times the write alone.
    let lines: Vec<Vec<u8>> = recs
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let mut obj = json!({"seq": i, "ts_ms": 1_700_000_000_000u64});
            if let (Value::Object(o), Value::Object(r)) = (&mut obj, r) {
                o.extend(r.clone());
            }
            let mut v = serde_json::to_vec(&obj).unwrap_or_default();
            v.push(b'\n');
            v
        })
        .collect();
    let (mut append, mut raw_t) = (Vec::with_capacity(recs.len()), Vec::new());
    for (r, line) in recs.iter().zip(&lines) {
        let t = Instant::now();
        log.append(r).map_err(|e| e.to_string())?;
        append.push(t.elapsed().as_secs_f64() * 1e6);
        let t = Instant::now();
        raw.write_all(line)
            .map_err(|e| format!("{}: {e}", raw_path.display()))?;
        raw_t.push(t.elapsed().as_secs_f64() * 1e6);
    }
    let t = Instant::now();
    log.sync().map_err(|e| e.to_string())?;
    let sync = t.elapsed().as_secs_f64() * 1e6;
    let bytes = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
    let _ = std::fs::remove_file(&raw_path);
    Ok(Round {
        append,
        raw: raw_t,
        sync,
        bytes,
    })
}

pub fn run(args: &Args, workspace: &Path) -> Result<Json, String> {
    let n = args.num("events", 10_000)?.max(10);
    let rounds_n = args.num("rounds", 3)?.max(1);
    let loads = args.num("loads", 10)?.max(1);
    let buckets = args.num("buckets", 10)?.clamp(2, n);
    let dir = workspace.join("session-log-bench");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;

    let recs = records(n);
    let mut rounds = Vec::new();
    for r in 0..rounds_n {
        rounds.push(one_log(&dir, r, &recs)?);
    }
    let bytes = rounds[0].bytes;
    let per = n.div_ceil(buckets);
    let bucket = |f: &dyn Fn(&Round) -> &Vec<f64>, b: usize| {
        let mut v = Vec::new();
        for r in &rounds {
            let s = f(r);
            v.extend_from_slice(&s[(b * per).min(s.len())..((b + 1) * per).min(s.len())]);
        }
        Summary::of_us(v)
    };
    let appends: Vec<Summary> = (0..buckets).map(|b| bucket(&|r| &r.append, b)).collect();
    let raws: Vec<Summary> = (0..buckets).map(|b| bucket(&|r| &r.raw, b)).collect();
    let all_append = Summary::of_us(rounds.iter().flat_map(|r| r.append.clone()).collect());
    let all_raw = Summary::of_us(rounds.iter().flat_map(|r| r.raw.clone()).collect());
    let sync = Summary::of_us(rounds.iter().map(|r| r.sync).collect());

    // Loading, on a page cache the appends just filled.
    let path = dir.join("session-0.jsonl");
    let (mut load_t, mut open_t, mut read_t) = (Vec::new(), Vec::new(), Vec::new());
    let mut loaded = 0;
    for _ in 0..loads {
        let t = Instant::now();
        let data = std::fs::read(&path).map_err(|e| format!("{}: {e}", path.display()))?;
        read_t.push(t.elapsed().as_secs_f64() * 1e6);
        drop(data);
        let t = Instant::now();
        let (recs, report) = cordon_agent::log::load::<Value>(&path).map_err(|e| e.to_string())?;
        load_t.push(t.elapsed().as_secs_f64() * 1e6);
        if !report.bad_lines.is_empty() || report.partial_tail {
            return Err(format!("the log did not load cleanly: {report:?}"));
        }
        loaded = recs.len();
        drop(recs);
        let t = Instant::now();
        let opened = SessionLog::<Value>::open(&path).map_err(|e| e.to_string())?;
        open_t.push(t.elapsed().as_secs_f64() * 1e6);
        drop(opened);
    }
    if loaded != n {
        return Err(format!("loaded {loaded} records, appended {n}"));
    }
    let [load_s, open_s, read_s] = [load_t, open_t, read_t].map(Summary::of_us);
    let _ = std::fs::remove_dir_all(&dir);

    let fs_note = fs_type(&dir);
    println!(
        "== Session log: {n} appends of SessionLog<serde_json::Value>, {rounds_n} logs ({})",
        crate::whoami()
    );
    println!(
        "   records: 1 in 3 carries 1-4 KB of tool output; log size {:.1} MiB ({:.0} bytes a record on average); directory on {fs_note}",
        bytes as f64 / MIB,
        bytes as f64 / n as f64
    );
    println!(
        "   peer: write(2) of the same line, encoded beforehand, to a second O_APPEND file, alternating"
    );
    println!();
    println!(
        "   {:<22} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "records (µs)", "append p50", "append p90", "append p99", "write(2) p50", "write p90"
    );
    let us = |x: f64| format!("{x:.1}");
    for (b, (a, w)) in appends.iter().zip(&raws).enumerate() {
        println!(
            "   {:<22} {:>10} {:>10} {:>10} {:>12} {:>10}",
            format!("{}-{}", b * per + 1, ((b + 1) * per).min(n)),
            us(a.p50),
            us(a.p90),
            us(a.p99),
            us(w.p50),
            us(w.p90)
        );
    }
    println!(
        "   {:<22} {:>10} {:>10} {:>10} {:>12} {:>10}",
        "all",
        us(all_append.p50),
        us(all_append.p90),
        us(all_append.p99),
        us(all_raw.p50),
        us(all_raw.p90)
    );
    let (first, last) = (appends[0], appends[buckets - 1]);
    let ratio50 = last.p50 / first.p50;
    let ratio90 = last.p90 / first.p90;
    println!();
    println!(
        "   last/first bucket: append p50 {ratio50:.2}, p90 {ratio90:.2}; write(2) p50 {:.2}",
        raws[buckets - 1].p50 / raws[0].p50
    );
    println!("   sync_data at the end: p50 {} ms", ms(sync.p50));
    println!(
        "   load of the {n}-record log (warm page cache), {loads} times: log::load p50 {} ms p90 {} ms; SessionLog::open p50 {} ms; fs::read of the file p50 {} ms",
        ms(load_s.p50),
        ms(load_s.p90),
        ms(open_s.p50),
        ms(read_s.p50)
    );
    let constant = ratio50 <= 1.25 && ratio90 <= 1.5;
    println!(
        "   goal: append cost constant as the log grows: {} (p50 ratio {ratio50:.2})",
        if constant { "MET" } else { "NOT MET" }
    );
    println!();

    Ok(Json::obj([
        ("events", Json::Num(n as f64)),
        ("rounds", Json::Num(rounds_n as f64)),
        ("log_bytes", Json::Num(bytes as f64)),
        ("filesystem", Json::str(fs_note)),
        (
            "buckets",
            Json::Arr(
                appends
                    .iter()
                    .zip(&raws)
                    .enumerate()
                    .map(|(b, (a, w))| {
                        Json::obj([
                            ("first_record", Json::Num((b * per + 1) as f64)),
                            ("last_record", Json::Num(((b + 1) * per).min(n) as f64)),
                            ("append", a.json()),
                            ("write", w.json()),
                        ])
                    })
                    .collect(),
            ),
        ),
        ("append_all", all_append.json()),
        ("write_all", all_raw.json()),
        ("ratio_last_first_p50", Json::Num(ratio50)),
        ("ratio_last_first_p90", Json::Num(ratio90)),
        ("sync", sync.json()),
        ("load", load_s.json()),
        ("open", open_s.json()),
        ("read_file", read_s.json()),
        ("goal_met", Json::Bool(constant)),
    ]))
}

/// The file system type of the directory's mount, from /proc/self/mounts.
fn fs_type(dir: &Path) -> String {
    let dir = std::fs::canonicalize(dir.parent().unwrap_or(dir)).unwrap_or_default();
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap_or_default();
    mounts
        .lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (_, mnt, ty) = (f.next()?, f.next()?, f.next()?);
            dir.starts_with(mnt)
                .then(|| (mnt.len(), format!("{ty} ({mnt})")))
        })
        .max_by_key(|(n, _)| *n)
        .map_or_else(|| "?".into(), |(_, s)| s)
}
