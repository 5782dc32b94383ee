//! cordon split over one PostgreSQL: two API processes (`serve --workers
//! 0`) and three `cordon worker`s, each with a data directory of its own.
//! 200 jobs go in through both APIs; one worker is killed with SIGKILL
//! mid-job and another stalls (SIGSTOP) past its lease. Every job ends
//! exactly once and succeeds; a job lost with its worker is run again by
//! another, and nothing the lost run does after it lost the job reaches
//! the job's record; a job's events reach a client of the other API while
//! it runs. A running job's files and live view are served through an API
//! process that runs nothing, relayed to the job's worker and signed with
//! the cluster key; the workers' listeners take nothing else. Its Lab
//! page opens on a port of that API process, relayed the same way. With an
//! archive in S3 (moto's server), a finished job's files outlive its
//! worker. An API session stays with the API process that made it.

use crate::pgtest;
use crate::support;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read};
use std::time::{Duration, Instant};

use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::{Value, json};
use support::s3::S3;
use support::serve::{Started as Proc, free_port, http, job, spawn_env, submit};

/// A job's stored events, from its (ended) stream.
fn events(api: &Proc, token: &str, id: &str) -> Vec<(String, Value)> {
    let mut text = String::new();
    http()
        .get(format!("{}/v1/jobs/{id}/events", api.url))
        .bearer_auth(token)
        .send()
        .unwrap()
        .read_to_string(&mut text)
        .unwrap();
    parse_sse(&text)
}

fn parse_sse(text: &str) -> Vec<(String, Value)> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let mut name = None;
        let mut data = None;
        for line in block.lines() {
            if let Some(n) = line.strip_prefix("event: ") {
                name = Some(n.to_string());
            }
            if let Some(d) = line.strip_prefix("data: ") {
                data = Some(serde_json::from_str(d).unwrap());
            }
        }
        if let (Some(n), Some(d)) = (name, data) {
            out.push((n, d));
        }
    }
    out
}

/// The worker a running job is on, from its last `state` event.
fn worker_of(api: &Proc, token: &str, id: &str) -> Option<String> {
    let mut text = String::new();
    // A running job's stream stays open: read what is there for a moment.
    let r = reqwest::blocking::Client::builder()
        .timeout(Duration::from_millis(1500))
        .build()
        .unwrap()
        .get(format!("{}/v1/jobs/{id}/events", api.url))
        .bearer_auth(token)
        .send()
        .ok()?;
    let _ = BufReader::new(r).read_to_string(&mut text);
    parse_sse(&text)
        .iter()
        .rev()
        .find(|(n, _)| n == "state")
        .and_then(|(_, d)| d["worker"].as_str().map(str::to_string))
}

/// Every process's `CORDON_CLUSTER_KEY`.
const KEY: &str = "test-cluster-key-0123456789abcdef0123456789";

/// Jobs that sleep 6 s: what the worker that is killed or stalled runs.
const LONG: usize = 24;

#[test]
fn two_apis_and_three_workers_run_every_job_exactly_once() {
    let pg = pgtest::TestPostgres::start();
    let db = pg.url();
    let home = tempfile::tempdir().unwrap();
    let dir = |name: &str| home.path().join(name).display().to_string();
    // The archive every process shares, when the S3 server is installed
    // (always under CI).
    let s3 = S3::start("cordon-cluster");
    // A model for the API processes' sessions.
    let model = ScriptedServer::start(Scenario::new().turn(Turn::text("hello from the model")));
    let mut env = vec![
        ("CORDON_CLUSTER_KEY", KEY.to_string()),
        (
            "CORDON_LAB_DIR",
            cordon_lab::cache_dir().display().to_string(),
        ),
        ("ANTHROPIC_BASE_URL", model.url()),
        ("ANTHROPIC_API_KEY", "sk-test-key-0000".to_string()),
    ];
    if let Some(s3) = &s3 {
        env.extend(s3.env());
        env.push(("CORDON_ARCHIVE", "s3://cordon-cluster/c".into()));
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut workers: Vec<Proc> = (0..3)
        .map(|i| {
            let port = free_port();
            spawn_env(
                home.path(),
                &[
                    "worker",
                    "--advertise",
                    &format!("http://127.0.0.1:{port}"),
                    "--db",
                    &db,
                    "--data-dir",
                    &dir(&format!("worker-{i}")),
                    "--workers",
                    "4",
                    "--per-tenant",
                    "100",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                    "--lease",
                    "3s",
                    // One run lost to the kill, one to the stall, and one
                    // to a lease lapsed on a 2-core machine running every
                    // test at once (seen in CI): each job still succeeds.
                    "--max-attempts",
                    "4",
                ],
                &env,
            )
        })
        .collect();
    let apis: Vec<Proc> = (0..2)
        .map(|i| {
            let port = free_port().to_string();
            spawn_env(
                home.path(),
                &[
                    "serve",
                    "--db",
                    &db,
                    "--data-dir",
                    &dir(&format!("api-{i}")),
                    "--workers",
                    "0",
                    "--listen",
                    &format!("127.0.0.1:{port}"),
                ],
                &env,
            )
        })
        .collect();
    let token = apis[0].token.clone().expect("the first API makes a token");
    assert!(apis[1].token.is_none(), "one database, one first token");
    for w in &workers {
        let r = http().get(format!("{}/health", w.url)).send().unwrap();
        assert_eq!(r.status(), 200);
    }

    // 200 jobs, alternately through each API; the first 24 (two per
    // worker slot) run long enough to be caught mid-job.
    let started = Instant::now();
    let ids: Vec<String> = (0..200)
        .map(|i| {
            let api = &apis[i % 2];
            let pause = if i < LONG { "6" } else { "0.$((RANDOM % 6))" };
            let command = format!("echo start-{i}; sleep {pause}; echo done-{i}");
            submit(
                &api.url,
                &token,
                json!({"kind": "shell", "command": command}),
            )
        })
        .collect();
    eprintln!("200 jobs accepted in {:?}", started.elapsed());

    // A job submitted through API 1, followed live through API 0.
    let followed = submit(
        &apis[1].url,
        &token,
        json!({"kind": "shell", "command": "echo first; sleep 2; echo second"}),
    );
    let follower = {
        let (url, token, id) = (apis[0].url.clone(), token.clone(), followed.clone());
        std::thread::spawn(move || {
            let r = http()
                .get(format!("{url}/v1/jobs/{id}/events"))
                .bearer_auth(&token)
                .send()
                .unwrap();
            let mut seen = Vec::new();
            let mut block = String::new();
            for line in BufReader::new(r).lines() {
                let line = line.unwrap();
                if line.is_empty() {
                    seen.extend(parse_sse(&block));
                    block.clear();
                    if seen.iter().any(|(n, _)| n == "finished") {
                        break;
                    }
                } else {
                    block.push_str(&line);
                    block.push('\n');
                }
            }
            seen
        })
    };

    // Kill a worker that runs a job, mid-job.
    let by_id: HashMap<String, usize> = workers
        .iter()
        .enumerate()
        .map(|(i, w)| (w.worker.clone().unwrap(), i))
        .collect();
    let victim = find_busy(&apis[0], &token, &ids[..LONG], &by_id, None);
    eprintln!("SIGKILL to worker {victim}");
    workers[victim].child.kill().unwrap();
    workers[victim].child.wait().unwrap();

    // Stall another past its lease, then let it go on.
    let stalled = find_busy(&apis[0], &token, &ids[..LONG], &by_id, Some(victim));
    let pid = workers[stalled].child.id() as i32;
    eprintln!("SIGSTOP to worker {stalled} for 8 s");
    unsafe { libc::kill(pid, libc::SIGSTOP) };
    std::thread::sleep(Duration::from_secs(8));
    unsafe { libc::kill(pid, libc::SIGCONT) };

    // Every job ends, once, and succeeds, with one run's output.
    let deadline = Instant::now() + Duration::from_secs(300);
    let mut requeued = 0;
    for (i, id) in ids.iter().enumerate() {
        let api = &apis[(i + 1) % 2];
        let j = loop {
            let j = job(&api.url, &token, id);
            if !["queued", "running"].contains(&j["state"].as_str().unwrap()) {
                break j;
            }
            assert!(Instant::now() < deadline, "job {i} never ended: {j}");
            std::thread::sleep(Duration::from_millis(200));
        };
        assert_eq!(j["state"], "succeeded", "{j}");
        assert_eq!(j["stdout"], format!("start-{i}\ndone-{i}\n"), "{j}");
        let ev = events(api, &token, id);
        let finished = ev.iter().filter(|(n, _)| n == "finished").count();
        assert_eq!(finished, 1, "job {i}: {ev:?}");
        assert_eq!(ev.last().unwrap().0, "finished");
        // Runs never overlap in the record: after a `requeued`, nothing of
        // the lost run comes before the next run's `state`.
        let mut between = false;
        let mut runs = 0;
        for (name, data) in &ev {
            match name.as_str() {
                "state" => {
                    between = false;
                    runs += 1;
                    assert!(data["worker"].is_string(), "{data}");
                }
                "requeued" => {
                    between = true;
                    requeued += 1;
                }
                "stdout" | "stderr" => assert!(!between, "job {i}: output after requeued: {ev:?}"),
                _ => {}
            }
        }
        let again = ev.iter().filter(|(n, _)| n == "requeued").count();
        assert_eq!(runs, again + 1, "job {i}: {ev:?}");
    }
    eprintln!(
        "all 200 ended in {:?}; {requeued} run(s) lost with a worker and run again",
        started.elapsed()
    );
    assert!(
        requeued >= 2,
        "both the killed and the stalled worker lost a job"
    );

    // Idle workers are woken by PostgreSQL's NOTIFY, not their 1 s poll,
    // and the other API's stream by its NOTIFY: POST to `finished` seen
    // through the other API, one job at a time; and how long after the
    // job's record says it finished its stream says so (the workspace's
    // making and the run do not count).
    let (mut times, mut lags) = (Vec::new(), Vec::new());
    for _ in 0..7 {
        let t0 = Instant::now();
        let id = submit(
            &apis[1].url,
            &token,
            json!({"kind": "shell", "command": "true"}),
        );
        let ev = events(&apis[0], &token, &id);
        let seen = std::time::SystemTime::now();
        times.push(t0.elapsed());
        assert_eq!(ev.last().unwrap().0, "finished");
        let j = job(&apis[0].url, &token, &id);
        let finished = humantime::parse_rfc3339(j["finished_at"].as_str().unwrap()).unwrap();
        lags.push(seen.duration_since(finished).unwrap_or_default());
    }
    times.sort();
    lags.sort();
    eprintln!(
        "POST to finished across processes: median {:?}; finished to seen: median {:?}",
        times[3], lags[3]
    );
    assert!(
        // A worker that waited for its 1 s poll would take 0.5 s more on
        // average.
        times[3] < Duration::from_millis(700),
        "a job waits for the workers' polls: {times:?}"
    );
    assert!(
        // A stream that waited for its 250 ms poll, not the NOTIFY, would
        // lag 125 ms on average.
        lags[3] < Duration::from_millis(100),
        "a job's stream waits for polls: {lags:?}"
    );

    files_and_live_view_through_an_api_that_runs_nothing(&apis, &workers, &token);
    a_session_stays_with_its_api(&apis, &token);

    if s3.is_some() {
        files_outlive_their_worker(&apis, &mut workers, &by_id, &token);
    }

    let seen = follower.join().unwrap();
    let out: String = seen
        .iter()
        .filter(|(n, _)| n == "stdout")
        .map(|(_, d)| d["data"].as_str().unwrap())
        .collect();
    assert_eq!(out, "first\nsecond\n", "{seen:?}");
    assert!(
        seen.iter()
            .any(|(n, d)| n == "finished" && d["state"] == "succeeded")
    );
}

/// An API session lives in the API process that made it: the other one
/// says where it is and loses nothing of it.
fn a_session_stays_with_its_api(apis: &[Proc], token: &str) {
    let made: Value = http()
        .post(format!("{}/v1/sessions", apis[0].url))
        .bearer_auth(token)
        .json(&json!({}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let id = made["id"].as_str().expect("a session").to_string();
    let say = |api: &Proc| {
        http()
            .post(format!("{}/v1/sessions/{id}/messages", api.url))
            .bearer_auth(token)
            .json(&json!({"text": "hello"}))
            .send()
            .unwrap()
    };
    let r = say(&apis[1]);
    assert_eq!(r.status(), 409);
    let body: Value = r.json().unwrap();
    assert_eq!(body["error"]["code"], "elsewhere", "{body}");
    let r = say(&apis[0]);
    assert_eq!(r.status(), 200);
    let turn = r.text().unwrap();
    assert!(turn.contains("hello from the model"), "{turn}");
}

/// A finished job's files, in the archive, served by both API processes
/// after its worker died with SIGKILL.
fn files_outlive_their_worker(
    apis: &[Proc],
    workers: &mut [Proc],
    by_id: &HashMap<String, usize>,
    token: &str,
) {
    let id = submit(
        &apis[1].url,
        token,
        json!({"kind": "shell", "command": "mkdir -p out && echo kept > out/kept.txt"}),
    );
    let deadline = Instant::now() + Duration::from_secs(60);
    let j = loop {
        let j = job(&apis[0].url, token, &id);
        if !j["workspace_archived_at"].is_null() {
            break j;
        }
        assert!(Instant::now() < deadline, "never archived: {j}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(j["state"], "succeeded", "{j}");
    let worker = worker_of(&apis[0], token, &id).expect("the job names its worker");
    let w = &mut workers[by_id[&worker]];
    eprintln!("SIGKILL to worker {worker}, which ran {id}");
    w.child.kill().unwrap();
    w.child.wait().unwrap();
    for api in apis {
        let r = http()
            .get(format!("{}/v1/jobs/{id}/files/out/kept.txt", api.url))
            .bearer_auth(token)
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
        assert_eq!(r.text().unwrap(), "kept\n");
    }
}

/// A worker (by index, other than `not`) running one of `ids` now.
fn find_busy(
    api: &Proc,
    token: &str,
    ids: &[String],
    by_id: &HashMap<String, usize>,
    not: Option<usize>,
) -> usize {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        for id in ids {
            if job(&api.url, token, id)["state"] != "running" {
                continue;
            }
            if let Some(w) = worker_of(api, token, id).and_then(|w| by_id.get(&w).copied())
                && Some(w) != not
            {
                return w;
            }
        }
        assert!(Instant::now() < deadline, "no worker is busy");
    }
}

/// A gui job runs on some worker; its files are read and written, and its
/// desktop watched, through the API processes (which run nothing). The
/// worker's own listener refuses what is not relayed and signed.
fn files_and_live_view_through_an_api_that_runs_nothing(
    apis: &[Proc],
    workers: &[Proc],
    token: &str,
) {
    let id = submit(
        &apis[0].url,
        token,
        json!({"kind": "gui", "display": "640x480", "steps": [
            {"tool": "shell", "command": "echo from-the-sandbox > made.txt; \
                mkdir site && echo '<h1>served on a worker</h1>' > site/index.html; \
                (cd site && exec python3 -m http.server 8000 --bind 127.0.0.1 >/dev/null 2>&1) & \
                while [ ! -f go ]; do sleep 0.05; done; cat go"}
        ]}),
    );

    // Its file, through the other API, once the job has made it.
    let deadline = Instant::now() + Duration::from_secs(90);
    let made = loop {
        let r = http()
            .get(format!("{}/v1/jobs/{id}/files/made.txt", apis[1].url))
            .bearer_auth(token)
            .send()
            .unwrap();
        let status = r.status();
        let body = r.text().unwrap();
        if status == 200 {
            break body;
        }
        // Queued (409), or made but not yet written (404).
        assert!([404, 409].contains(&status.as_u16()), "{status}: {body}");
        assert!(
            Instant::now() < deadline,
            "the job never made its file: {body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(made, "from-the-sandbox\n");
    let listing: Value = http()
        .get(format!("{}/v1/jobs/{id}/files", apis[0].url))
        .bearer_auth(token)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert!(listing.to_string().contains("made.txt"), "{listing}");
    let j = job(&apis[1].url, token, &id);
    assert_eq!(j["live_desktop"], true, "{j}");

    // Another tenant's token finds nothing, through either API.
    let other: Value = http()
        .post(format!("{}/v1/tokens", apis[0].url))
        .bearer_auth(token)
        .json(&json!({"tenant": "other"}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let other = other["token"].as_str().expect("a token").to_string();
    for api in apis {
        let r = http()
            .get(format!("{}/v1/jobs/{id}/files/made.txt", api.url))
            .bearer_auth(&other)
            .send()
            .unwrap();
        assert_eq!(r.status(), 404);
    }

    // The worker's listener: no token, a tenant's token, forged relay
    // headers and a replayed request's headers are all refused.
    let worker = worker_of(&apis[0], token, &id).expect("the job runs on a worker");
    let at = &workers
        .iter()
        .find(|w| w.worker.as_deref() == Some(worker.as_str()))
        .unwrap()
        .url;
    let path = format!("/v1/jobs/{id}/files/made.txt");
    let forged = [
        ("x-cordon-relay-tenant", "default".to_string()),
        ("x-cordon-relay-time", format!("{}", now_ms())),
        ("x-cordon-relay-nonce", "0".repeat(32)),
        ("x-cordon-relay-signature", "00".repeat(32)),
    ];
    for headers in [
        vec![],
        vec![("authorization", format!("Bearer {token}"))],
        forged.to_vec(),
    ] {
        let mut r = http().get(format!("{at}{path}"));
        for (k, v) in &headers {
            r = r.header(*k, v);
        }
        let r = r.send().unwrap();
        assert_eq!(r.status(), 401, "{headers:?}");
        assert!(!r.text().unwrap().contains("from-the-sandbox"));
    }

    // The live view, through the API: RFB's greeting.
    let greeting = vnc_greeting(&apis[1], token, &id);
    assert_eq!(&greeting[..12], b"RFB 003.008\n");

    // The browser's Lab page, on a port of an API that runs nothing.
    let lab = lab_through_an_api(&apis[1], token, &other, &id);
    // A port's preview, the same way.
    let preview = preview_through_an_api(&apis[1], token, &other, &id);

    // Written through an API, read by the job in its sandbox.
    let r = http()
        .put(format!("{}/v1/jobs/{id}/files/go", apis[1].url))
        .bearer_auth(token)
        .body("from-the-api\n")
        .send()
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().unwrap());
    let deadline = Instant::now() + Duration::from_secs(60);
    let j = loop {
        let j = job(&apis[0].url, token, &id);
        if !["queued", "running"].contains(&j["state"].as_str().unwrap()) {
            break j;
        }
        assert!(Instant::now() < deadline, "the job never ended: {j}");
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(j["state"], "succeeded", "{j}");
    assert!(j.to_string().contains("from-the-api"), "{j}");
    // Its worker still serves the finished job's files.
    let r = http()
        .get(format!("{}/v1/jobs/{id}/files/go", apis[0].url))
        .bearer_auth(token)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().unwrap(), "from-the-api\n");
    // The Lab's port on the API closes once the job has ended.
    let deadline = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(&lab).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the Lab at {lab} outlived its job"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    while std::net::TcpStream::connect(&preview).is_ok() {
        assert!(
            Instant::now() < deadline,
            "the preview at {preview} outlived its job"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    eprintln!(
        "job {id} on worker {worker}: files, live view, Lab and preview served through both APIs"
    );
}

/// Opens a preview of port 8000 of job `id` through `api`, whose worker
/// runs it, as a browser and as a program do; returns its address.
fn preview_through_an_api(api: &Proc, token: &str, other: &str, id: &str) -> String {
    let browser = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(60))
        .build()
        .unwrap();
    // The worker answers which ports listen, relayed.
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let r = browser
            .get(format!("{}/v1/jobs/{id}/ports", api.url))
            .bearer_auth(token)
            .send()
            .unwrap();
        assert_eq!(r.status(), 200);
        let ports: Value = r.json().unwrap();
        if ports["ports"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["port"] == 8000)
        {
            break;
        }
        assert!(Instant::now() < deadline, "8000 never listened: {ports}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let open = |t: &str| {
        browser
            .post(format!("{}/v1/jobs/{id}/ports/8000/preview", api.url))
            .bearer_auth(t)
            .send()
            .unwrap()
    };
    assert_eq!(open(other).status(), 404, "another tenant's job");
    let r = open(token);
    assert_eq!(r.status(), 200);
    let p: Value = r.json().unwrap();
    let (url, origin) = (p["url"].as_str().unwrap(), p["origin"].as_str().unwrap());
    assert_ne!(origin, api.url, "a preview has an origin of its own");
    let r = browser.get(url).send().unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    let cookie = cookie.split(';').next().unwrap().to_string();
    let index = format!("{origin}/index.html");
    assert_eq!(browser.get(&index).send().unwrap().status(), 401);
    let page = browser
        .get(&index)
        .header("cookie", &cookie)
        .send()
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.text().unwrap(), "<h1>served on a worker</h1>\n");
    let ours = browser.get(&index).bearer_auth(token).send().unwrap();
    assert_eq!(ours.status(), 200);
    let theirs = browser.get(&index).bearer_auth(other).send().unwrap();
    assert_eq!(theirs.status(), 404);
    // The worker's relay route serves no client, not even the tenant.
    let relay = browser
        .get(format!(
            "{}/v1/jobs/{id}/ports/8000/relay/index.html",
            api.url
        ))
        .bearer_auth(token)
        .send()
        .unwrap();
    assert_ne!(relay.status(), 200);
    assert!(!relay.text().unwrap().contains("served on a worker"));
    origin.trim_start_matches("http://").to_string()
}

/// Opens job `id`'s Lab through `api`, as a browser does, and works in it:
/// a file of the job's sandbox, a terminal there over a WebSocket. Returns
/// the Lab's address (`HOST:PORT`).
fn lab_through_an_api(api: &Proc, token: &str, other: &str, id: &str) -> String {
    use tungstenite::client::IntoClientRequest;
    let browser = reqwest::blocking::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .timeout(Duration::from_secs(120))
        .build()
        .unwrap();
    let open = |t: &str| {
        browser
            .post(format!("{}/v1/jobs/{id}/lab", api.url))
            .bearer_auth(t)
            .send()
            .unwrap()
    };
    assert_eq!(open(other).status(), 404, "another tenant's job");
    let r = open(token);
    assert_eq!(r.status(), 200);
    let url = r.json::<Value>().unwrap()["url"]
        .as_str()
        .unwrap()
        .to_string();
    let origin = url.split("/v1/").next().unwrap().to_string();
    assert_ne!(origin, api.url, "the Lab has an origin of its own");
    let home = format!("{origin}/v1/jobs/{id}/lab/");

    // The ticket, spent for the cookie.
    let r = browser.get(&url).send().unwrap();
    assert_eq!(r.status(), 303);
    let cookie = r.headers()["set-cookie"].to_str().unwrap();
    let cookie = cookie.split(';').next().unwrap().to_string();
    let bare = browser.get(format!("{home}api/status")).send().unwrap();
    assert_eq!(bare.status(), 401, "no cookie");

    // The page, as Jupyter in the job's sandbox serves it: no policy of
    // the bearer route's, and Jupyter's `_xsrf` cookie.
    let page = browser
        .get(format!("{home}lab"))
        .header("cookie", &cookie)
        .send()
        .unwrap();
    assert_eq!(page.status(), 200);
    let policies: Vec<_> = page
        .headers()
        .get_all("content-security-policy")
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect();
    assert!(!policies.iter().any(|p| p == "sandbox"), "{policies:?}");
    let xsrf = page
        .headers()
        .get_all("set-cookie")
        .iter()
        .filter_map(|v| v.to_str().ok()?.strip_prefix("_xsrf="))
        .map(|v| v.split(';').next().unwrap().to_string())
        .next()
        .expect("Jupyter sets _xsrf");
    assert!(page.text().unwrap().contains("JupyterLab"));
    let both = format!("{cookie}; _xsrf={xsrf}");
    let file: Value = browser
        .get(format!("{home}api/contents/made.txt"))
        .header("cookie", &both)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(file["content"], "from-the-sandbox\n", "{file}");

    // A terminal in the job's sandbox, its WebSocket joined end to end.
    let term: Value = browser
        .post(format!("{home}api/terminals"))
        .header("cookie", &both)
        .header("x-xsrftoken", &xsrf)
        .header("origin", &origin)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let name = term["name"].as_str().expect("a terminal");
    let addr = origin.trim_start_matches("http://").to_string();
    let mut req = format!("ws://{addr}/v1/jobs/{id}/lab/terminals/websocket/{name}")
        .into_client_request()
        .unwrap();
    req.headers_mut().insert("cookie", both.parse().unwrap());
    req.headers_mut().insert("origin", origin.parse().unwrap());
    let stream = std::net::TcpStream::connect(&addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let (mut ws, _) = tungstenite::client::client(req, stream).expect("the terminal");
    ws.send(tungstenite::Message::text(
        json!(["stdin", "cat made.txt; echo END-$((6*7))\r"]).to_string(),
    ))
    .unwrap();
    let mut out = String::new();
    while !out.contains("END-42") {
        if let tungstenite::Message::Text(t) = ws.read().expect("the terminal's output") {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v[0] == "stdout" {
                out.push_str(v[1].as_str().unwrap());
            }
        }
    }
    assert!(out.contains("from-the-sandbox"), "{out}");

    // Programs' way, through the same API: the bearer route, sandboxed.
    let r = browser
        .get(format!("{}/v1/jobs/{id}/lab/api/status", api.url))
        .bearer_auth(token)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(
        r.headers()
            .get_all("content-security-policy")
            .iter()
            .any(|v| v == "sandbox")
    );
    addr
}

fn now_ms() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis()
}

/// The first bytes of job `id`'s live view through `api`, the token
/// offered as browsers do (a subprotocol); tried until its desktop is up.
fn vnc_greeting(api: &Proc, token: &str, id: &str) -> Vec<u8> {
    use tungstenite::client::IntoClientRequest;
    let ws_url = format!("{}/v1/jobs/{id}/vnc", api.url.replacen("http", "ws", 1));
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let mut req = ws_url.as_str().into_client_request().unwrap();
        req.headers_mut().insert(
            "sec-websocket-protocol",
            format!("binary, cordon.bearer.{token}").parse().unwrap(),
        );
        let stream = std::net::TcpStream::connect(api.url.trim_start_matches("http://")).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(20)))
            .unwrap();
        match tungstenite::client::client(req, stream) {
            Ok((mut ws, resp)) => {
                assert_eq!(resp.headers()["sec-websocket-protocol"], "binary");
                let mut greeting = Vec::new();
                while greeting.len() < 12 {
                    match ws.read().unwrap() {
                        tungstenite::Message::Binary(b) => greeting.extend_from_slice(&b),
                        other => panic!("{other:?}"),
                    }
                }
                return greeting;
            }
            Err(e) => {
                assert!(Instant::now() < deadline, "no live view: {e}");
                std::thread::sleep(Duration::from_millis(200));
            }
        }
    }
}
