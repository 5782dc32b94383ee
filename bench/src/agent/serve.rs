//! End-to-end time of a trivial shell job through `cordon serve`.
//!
//! Each round posts `{"kind": "shell", "command": "true"}` to a running
//! server, follows the job's event stream (`GET /v1/jobs/{id}/events`) and
//! stops the clock when the job's `finished` event arrives; the job is then
//! read back and must have `succeeded`. The server's own timestamps (this
//! machine's clock, to the millisecond) split each round into the POST, the
//! wait in the queue, the run, and the delivery of the end to the client.
//!
//! The floor it is compared with, alternating round by round, is the same
//! command through `cordon run -- true`: a fresh sandbox, which every job
//! also needs, without the HTTP, the database or the queue.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::Args;
use crate::stats::{Json, Summary, ms};

pub async fn run(args: &Args, workspace: &Path) -> Result<Json, String> {
    let (url, token) = args.server()?;
    let rounds = args.num("rounds", 50)?;
    let warmup = args.num("warmup", 5)?;
    let cordon = args.str("cordon");

    let client = reqwest::Client::new();
    let mut e2e = Vec::with_capacity(rounds);
    let mut queued = Vec::with_capacity(rounds);
    let mut running = Vec::with_capacity(rounds);
    let mut accept = Vec::with_capacity(rounds);
    let mut deliver = Vec::with_capacity(rounds);
    let mut floor = Vec::with_capacity(rounds);
    for i in 0..warmup + rounds {
        let job = one_job(&client, &url, &token).await?;
        let run = match cordon {
            Some(path) => Some(cold_run(path, workspace)?),
            None => None,
        };
        if i < warmup {
            continue;
        }
        e2e.push(job.total);
        queued.push(job.queued_ms * 1000.0);
        running.push(job.running_ms * 1000.0);
        accept.push(job.accept_ms * 1000.0);
        deliver.push(job.deliver_ms * 1000.0);
        if let Some(d) = run {
            floor.push(d);
        }
    }

    let e2e = Summary::of(&e2e);
    let queued = Summary::of_us(queued);
    let running = Summary::of_us(running);
    let accept = Summary::of_us(accept);
    let deliver = Summary::of_us(deliver);
    println!("POST to succeeded, {rounds} trivial shell jobs one after another ({url})");
    println!(
        "  end to end       p50 {} ms  p90 {} ms  p99 {} ms",
        ms(e2e.p50),
        ms(e2e.p90),
        ms(e2e.p99)
    );
    println!(
        "  to created       p50 {} ms  p90 {} ms   (POST sent to the server's created_at)",
        ms(accept.p50),
        ms(accept.p90)
    );
    println!(
        "  queue wait       p50 {} ms  p90 {} ms   (server's created_at to started_at)",
        ms(queued.p50),
        ms(queued.p90)
    );
    println!(
        "  run              p50 {} ms  p90 {} ms   (server's started_at to finished_at)",
        ms(running.p50),
        ms(running.p90)
    );
    println!(
        "  to the client    p50 {} ms  p90 {} ms   (finished_at to the `finished` event at the client)",
        ms(deliver.p50),
        ms(deliver.p90)
    );
    let mut report = vec![
        ("url", Json::str(&url)),
        ("rounds", Json::Num(rounds as f64)),
        ("e2e", e2e.json()),
        ("queue_wait", queued.json()),
        ("run", running.json()),
        ("to_created", accept.json()),
        ("to_client", deliver.json()),
    ];
    if !floor.is_empty() {
        let floor = Summary::of(&floor);
        println!(
            "  cordon run -- true  p50 {} ms  p90 {} ms   (the sandbox alone; ratio of p50s {:.2})",
            ms(floor.p50),
            ms(floor.p90),
            e2e.p50 / floor.p50
        );
        report.push(("cordon_run_true", floor.json()));
        report.push(("ratio_p50", Json::Num(e2e.p50 / floor.p50)));
    }
    Ok(Json::obj(report))
}

/// The same rounds on a server without a warm pool and on one with,
/// alternating, so that both see the same machine.
///
/// Each job is posted `--settle` ms after the last one finished: what a
/// server does after a job (its sandbox's teardown, a pool's refill) then
/// falls in no one's round, as with jobs that come apart. Without it the
/// pooled server's refill ran inside the other's next job.
pub async fn pool(args: &Args) -> Result<Json, String> {
    let (url, token) = args.server()?;
    let pool_url = args.str("pool-url").ok_or("--pool-url is required")?;
    let pool_token = args.str("pool-token").ok_or("--pool-token is required")?;
    let rounds = args.num("rounds", 50)?;
    let warmup = args.num("warmup", 5)?;
    let settle = Duration::from_millis(args.num("settle", 100)? as u64);
    let client = reqwest::Client::new();
    let (mut cold, mut warm) = (Side::default(), Side::default());
    for i in 0..warmup + rounds {
        let a = one_job(&client, &url, &token).await?;
        tokio::time::sleep(settle).await;
        let b = one_job(&client, pool_url, pool_token).await?;
        tokio::time::sleep(settle).await;
        if i >= warmup {
            cold.push(&a);
            warm.push(&b);
        }
    }
    println!(
        "POST to succeeded, {rounds} trivial shell jobs on each server, alternating, {} ms apart",
        settle.as_millis()
    );
    let cold = cold.report("without a pool", &url);
    let warm = warm.report("with --pool 2", pool_url);
    let ratio = cold.0 / warm.0;
    println!("  ratio of the end-to-end p50s (without / with): {ratio:.2}");
    Ok(Json::obj(vec![
        ("rounds", Json::Num(rounds as f64)),
        ("settle_ms", Json::Num(settle.as_millis() as f64)),
        ("without_pool", cold.1),
        ("with_pool", warm.1),
        ("ratio_p50", Json::Num(ratio)),
    ]))
}

/// One server's rounds in [`pool`].
#[derive(Default)]
struct Side {
    e2e: Vec<Duration>,
    queued: Vec<f64>,
    running: Vec<f64>,
}

impl Side {
    fn push(&mut self, t: &JobTiming) {
        self.e2e.push(t.total);
        self.queued.push(t.queued_ms * 1000.0);
        self.running.push(t.running_ms * 1000.0);
    }

    /// Prints the side's times; its end-to-end p50 and its JSON.
    fn report(self, name: &str, url: &str) -> (f64, Json) {
        let e2e = Summary::of(&self.e2e);
        let queued = Summary::of_us(self.queued);
        let running = Summary::of_us(self.running);
        println!(
            "  {name:<15} end to end p50 {} ms  p90 {} ms  p99 {} ms; queue wait p50 {} ms; run p50 {} ms  ({url})",
            ms(e2e.p50),
            ms(e2e.p90),
            ms(e2e.p99),
            ms(queued.p50),
            ms(running.p50),
        );
        let json = Json::obj(vec![
            ("url", Json::str(url)),
            ("e2e", e2e.json()),
            ("queue_wait", queued.json()),
            ("run", running.json()),
        ]);
        (e2e.p50, json)
    }
}

/// One round's times; the server's clock is this machine's, so client and
/// server instants compare (to the server's millisecond).
struct JobTiming {
    total: Duration,
    accept_ms: f64,
    queued_ms: f64,
    running_ms: f64,
    deliver_ms: f64,
}

/// Seconds since midnight UTC, now.
fn now_of_day() -> f64 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
        .as_secs_f64();
    t.rem_euclid(86_400.0)
}

async fn one_job(client: &reqwest::Client, url: &str, token: &str) -> Result<JobTiming, String> {
    let start = Instant::now();
    let sent_at = now_of_day();
    let resp = client
        .post(format!("{url}/v1/jobs"))
        .bearer_auth(token)
        .json(&serde_json::json!({"kind": "shell", "command": "true"}))
        .send()
        .await
        .map_err(|e| format!("POST /v1/jobs: {e}"))?;
    if resp.status() != reqwest::StatusCode::ACCEPTED {
        let status = resp.status();
        let body = resp.text().await.unwrap_or_default();
        return Err(format!("POST /v1/jobs answered {status}: {body}"));
    }
    let created: Value = resp
        .json()
        .await
        .map_err(|e| format!("POST /v1/jobs: {e}"))?;
    let id = created["id"]
        .as_str()
        .ok_or_else(|| format!("POST /v1/jobs gave no id: {created}"))?
        .to_string();
    // The job has succeeded, as far as a client can know, when its
    // `finished` event arrives (the stream closes after it).
    let mut resp = client
        .get(format!("{url}/v1/jobs/{id}/events"))
        .bearer_auth(token)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("GET /v1/jobs/{id}/events: {e}"))?;
    let mut events = String::new();
    loop {
        match resp.chunk().await {
            Ok(Some(bytes)) => events.push_str(&String::from_utf8_lossy(&bytes)),
            Ok(None) => break,
            Err(e) => return Err(format!("GET /v1/jobs/{id}/events: {e}")),
        }
        if let Some(at) = events.find("event: finished\n")
            && events[at..].contains("\n\n")
        {
            break;
        }
    }
    let total = start.elapsed();
    let ended_at = now_of_day();
    drop(resp);
    if !events.contains("event: finished") {
        return Err(format!(
            "the event stream of {id} ended without `finished`: {events}"
        ));
    }
    let job: Value = client
        .get(format!("{url}/v1/jobs/{id}"))
        .bearer_auth(token)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("GET /v1/jobs/{id}: {e}"))?
        .json()
        .await
        .map_err(|e| format!("GET /v1/jobs/{id}: {e}"))?;
    if job["state"] != "succeeded" {
        return Err(format!("job {id} did not succeed: {job}"));
    }
    let at = |k: &str| {
        job[k]
            .as_str()
            .and_then(seconds_of_day)
            .ok_or_else(|| format!("job {id} has no usable {k}: {job}"))
    };
    let (created, started, finished) = (at("created_at")?, at("started_at")?, at("finished_at")?);
    // Signed: the server's times are cut to the millisecond.
    let signed = |a: f64, b: f64| {
        let d = day_diff(a, b);
        if d > 43_200.0 { d - 86_400.0 } else { d }
    };
    Ok(JobTiming {
        total,
        accept_ms: signed(sent_at, created) * 1000.0,
        queued_ms: day_diff(created, started) * 1000.0,
        running_ms: day_diff(started, finished) * 1000.0,
        deliver_ms: signed(finished, ended_at) * 1000.0,
    })
}

/// Seconds since midnight of an RFC 3339 UTC time (`…T12:34:56.789Z`).
fn seconds_of_day(t: &str) -> Option<f64> {
    let clock = t.split_once('T')?.1.strip_suffix('Z')?;
    let mut parts = clock.split(':');
    let h: f64 = parts.next()?.parse().ok()?;
    let m: f64 = parts.next()?.parse().ok()?;
    let s: f64 = parts.next()?.parse().ok()?;
    Some(h * 3600.0 + m * 60.0 + s)
}

/// `b - a` for two times of day less than a day apart, across midnight too.
fn day_diff(a: f64, b: f64) -> f64 {
    (b - a).rem_euclid(86_400.0)
}

/// One `cordon run -- true` in `workspace`, timed from spawn to exit.
fn cold_run(cordon: &str, workspace: &Path) -> Result<Duration, String> {
    let start = Instant::now();
    let status = Command::new(cordon)
        .args(["run", "--workspace"])
        .arg(workspace)
        .args(["--", "true"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .status()
        .map_err(|e| format!("{cordon}: {e}"))?;
    let took = start.elapsed();
    if !status.success() {
        return Err(format!("{cordon} run -- true failed: {status}"));
    }
    Ok(took)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_of_day() {
        assert_eq!(seconds_of_day("2026-11-22T01:02:03.500Z"), Some(3723.5));
        assert_eq!(seconds_of_day("2026-11-22 01:02:03Z"), None);
        assert!((day_diff(86_399.5, 0.25) - 0.75).abs() < 1e-9);
        assert!((day_diff(10.0, 10.5) - 0.5).abs() < 1e-9);
    }
}
