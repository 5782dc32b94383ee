//! Network policy through `cordon serve`: jobs and sessions reach what
//! they ask for within their tenant's ceiling and nothing else, every
//! refusal is an event, and a running job's or a session's policy changes
//! through the API, recorded where its history is.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::{Value, json};

/// A service on the host's loopback answering every request with `body`;
/// its port.
fn service(body: &'static str) -> u16 {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in listener.incoming().flatten() {
            use std::io::{Read, Write};
            let mut buf = [0u8; 4096];
            let _ = c.read(&mut buf);
            let _ = write!(
                c,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

/// A shell command fetching `port` through the sandbox's broker.
fn fetch(port: u16) -> String {
    format!(
        "curl -fsS --max-time 10 --noproxy '' -x http://127.0.0.1:3128 http://127.0.0.1:{port}/"
    )
}

async fn events(s: &TestServer, token: &str, id: &str) -> Vec<(String, Value)> {
    s.job_events(token, id)
        .await
        .into_iter()
        .map(|(_, kind, data)| (kind, data))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn jobs_reach_what_they_ask_within_the_ceiling_and_nothing_else() {
    let a = service("service-a");
    let b = service("service-b");
    let rule_a = format!("127.0.0.1:{a}");
    let s = TestServer::start_with(Db::Sqlite, |c| {
        c.network.all.allow = vec![rule_a.clone()];
        c.network
            .tenants
            .insert("closed".into(), Default::default());
    })
    .await
    .unwrap();
    let t = s.token("t").await;

    // Within the ceiling: A answers; B, not asked for, is refused, and
    // the refusal is an event naming it.
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "allow": [rule_a],
                   "command": format!("{}; echo; {} || echo B-refused", fetch(a), fetch(b))}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let stdout = job["stdout"].as_str().unwrap();
    assert!(stdout.contains("service-a"), "{job}");
    assert!(
        stdout.contains("B-refused") && !stdout.contains("service-b"),
        "{job}"
    );
    let refused: Vec<Value> = events(&s, &t, &id)
        .await
        .into_iter()
        .filter(|(k, _)| k == "network_refused")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(refused.len(), 1, "{refused:?}");
    assert_eq!(refused[0]["port"], b);
    assert!(
        refused[0]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("127.0.0.1:{b} refused by policy")),
        "{refused:?}"
    );

    // Beyond the ceiling: refused at submission, naming what goes beyond.
    let (status, body) = s
        .post(
            &t,
            "/v1/jobs",
            json!({"kind": "shell", "command": "true", "allow": [format!("127.0.0.1:{b}")]}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "beyond_ceiling", "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&format!("127.0.0.1:{b}")),
        "{body}"
    );
    let (status, body) = s
        .post(
            &t,
            "/v1/jobs",
            json!({"kind": "shell", "command": "true", "allow": [rule_a], "allow_private": true}),
        )
        .await;
    assert_eq!(status, 403, "{body}");

    // "allow" alone: all the ceiling allows, stored as plain rules.
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "network": "allow", "command": fetch(a)}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["request"]["allow"], json!([rule_a]), "{job}");
    let (status, net) = s.get(&t, &format!("/v1/jobs/{id}/network")).await;
    assert_eq!(status, 200, "{net}");
    assert_eq!(net["network"], "allow");
    assert_eq!(net["allow"], json!([rule_a]));
    assert_eq!(net["live"], false);
    assert_eq!(net["ceiling"], json!([rule_a]));

    // A tenant whose ceiling is empty gets no network at all.
    let closed = s.token("closed").await;
    let (status, body) = s
        .post(
            &closed,
            "/v1/jobs",
            json!({"kind": "shell", "command": "true", "network": "allow"}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "network_not_allowed", "{body}");

    // Bad requests say what is wrong.
    for (job, says) in [
        (
            json!({"kind": "shell", "command": "true", "network": "full"}),
            "never",
        ),
        (
            json!({"kind": "shell", "command": "true", "allow": "x"}),
            "`allow`: invalid type: string \"x\", expected a sequence",
        ),
        (
            json!({"kind": "shell", "command": "true", "allow": ["@nope"]}),
            "unknown preset",
        ),
        (
            json!({"kind": "shell", "command": "true", "allow": [7]}),
            "allow[0]",
        ),
        (
            json!({"kind": "shell", "command": "true", "network": "loopback", "allow": [rule_a]}),
            "need `network`",
        ),
    ] {
        let (status, body) = s.post(&t, "/v1/jobs", job.clone()).await;
        assert_eq!(status, 400, "{job}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{job}: {body}"
        );
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_jobs_policy_changes_through_the_api_within_the_ceiling() {
    let a = service("service-a");
    let b = service("service-b");
    let (rule_a, rule_b) = (format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}"));
    let s = TestServer::start_with(Db::Sqlite, |c| {
        c.network.all.allow = vec![rule_a.clone(), rule_b.clone()];
    })
    .await
    .unwrap();
    let t = s.token("t").await;
    let other = s.token("other").await;

    // A job off the network cannot be given one.
    let off = s
        .submit(&t, json!({"kind": "shell", "command": "sleep 30"}))
        .await;
    s.wait_running(&t, &off).await;
    let (status, body) = s
        .put(
            &t,
            &format!("/v1/jobs/{off}/network"),
            json!({"allow": [rule_a]}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("not brokered"),
        "{body}"
    );
    s.post(&t, &format!("/v1/jobs/{off}/cancel"), json!({}))
        .await;

    // It retries B until it gets through.
    let command = format!(
        "for i in $(seq 1 300); do {} 2>/dev/null && exit 0; sleep 0.1; done; exit 1",
        fetch(b)
    );
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "allow": [rule_a], "command": command, "timeout_secs": 60}),
        )
        .await;
    s.wait_running(&t, &id).await;
    let path = format!("/v1/jobs/{id}/network");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, net) = s.get(&t, &path).await;
        if net["live"] == true {
            assert_eq!(net["allow"], json!([rule_a]), "{net}");
            break;
        }
        assert!(Instant::now() < deadline, "never live: {net}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Another tenant's job is as absent as a missing one.
    let (status, _) = s.put(&other, &path, json!({"allow": [rule_b]})).await;
    assert_eq!(status, 404);
    let (status, _) = s.get(&other, &path).await;
    assert_eq!(status, 404);
    // Beyond the ceiling, or a body that is not a change: refused.
    let (status, body) = s.put(&t, &path, json!({"allow": ["127.0.0.1:1"]})).await;
    assert_eq!(status, 403, "{body}");
    let (status, body) = s
        .put(&t, &path, json!({"allow": [rule_b], "deny": []}))
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"].as_str().unwrap().contains("deny"),
        "{body}"
    );
    let job = s.get(&t, &format!("/v1/jobs/{id}")).await.1;
    assert_eq!(
        job["state"], "running",
        "the refused changes let nothing through: {job}"
    );

    // Widened: the retry loop gets through at once.
    let (status, net) = s.put(&t, &path, json!({"allow": [rule_a, rule_b]})).await;
    assert_eq!(status, 200, "{net}");
    assert_eq!(net["live"], true);
    assert_eq!(net["allow"], json!([rule_a, rule_b]));
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        job["stdout"].as_str().unwrap().contains("service-b"),
        "{job}"
    );

    let changes: Vec<Value> = events(&s, &t, &id)
        .await
        .into_iter()
        .filter(|(k, _)| k == "network_policy")
        .map(|(_, d)| d)
        .collect();
    assert_eq!(changes.len(), 1, "{changes:?}");
    assert_eq!(changes[0]["added"], json!([rule_b]));
    assert_eq!(changes[0]["allow"], json!([rule_a, rule_b]));
    // Over: nothing live to change.
    let (status, body) = s.put(&t, &path, json!({"allow": []})).await;
    assert_eq!(status, 409, "{body}");
    s.stop().await;
}

/// Whether the model said `text` in a turn.
fn said(turn: &[(String, Value)], text: &str) -> bool {
    turn.iter()
        .any(|(kind, data)| kind == "assistant_message" && data["text"] == text)
}

fn network_records(s: &TestServer, id: &str) -> Vec<Value> {
    let path = s.dir.join(format!("data/sessions/{id}/session.jsonl"));
    std::fs::read_to_string(&path)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|r| r["type"] == "network_policy")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_network_is_chosen_at_creation_and_changed_live_or_idle() {
    let a = service("service-a");
    let b = service("service-b");
    let (rule_a, rule_b) = (format!("127.0.0.1:{a}"), format!("127.0.0.1:{b}"));
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Fetching B.").with_tool_call(
                "c1",
                "bash",
                json!({"command": fetch(b)}),
            ))
            .turn(
                Turn::text("B was refused.")
                    .expect_tool_results(["c1"])
                    .expect_contains(format!("network: 127.0.0.1:{b} refused by policy")),
            )
            .turn(Turn::text("Again.").with_tool_call("c2", "bash", json!({"command": fetch(b)})))
            .turn(
                Turn::text("B answered.")
                    .expect_tool_results(["c2"])
                    .expect_contains("service-b"),
            ),
    );
    let url = model.url();
    let s = TestServer::start_with(Db::Sqlite, |c| {
        c.agent = Some(agent_at(url));
        c.network.all.allow = vec![rule_a.clone(), rule_b.clone()];
        c.session_idle = Duration::from_secs(2);
    })
    .await
    .unwrap();
    let t = s.token("t").await;

    let (status, body) = s
        .post(&t, "/v1/sessions", json!({"allow": ["127.0.0.1:1"]}))
        .await;
    assert_eq!(status, 403, "{body}");
    let (status, ses) = s.post(&t, "/v1/sessions", json!({"allow": [rule_a]})).await;
    assert_eq!(status, 201, "{ses}");
    let id = ses["id"].as_str().unwrap().to_string();
    let path = format!("/v1/sessions/{id}/network");
    let (_, net) = s.get(&t, &path).await;
    assert_eq!(
        (
            net["network"].clone(),
            net["allow"].clone(),
            net["live"].clone()
        ),
        (json!("allow"), json!([rule_a]), json!(false))
    );

    let turn = s.say(&t, &id, "fetch B").await;
    assert!(
        turn.iter().any(|(kind, _)| kind == "network_refused"),
        "{turn:?}"
    );
    // Live between turns: the broker takes it at once, the agent logs it.
    let (status, net) = s.put(&t, &path, json!({"allow": [rule_a, rule_b]})).await;
    assert_eq!(status, 200, "{net}");
    assert_eq!(net["live"], true, "{net}");
    let turn = s.say(&t, &id, "again").await;
    assert!(said(&turn, "B answered."), "{turn:?}");
    model.assert_finished();
    let records = network_records(&s, &id);
    assert_eq!(records.len(), 1, "{records:?}");
    assert_eq!(records[0]["added"], json!([rule_b]));

    // Idle and closed: the change goes into the log, and the next wake
    // starts with it.
    let deadline = Instant::now() + Duration::from_secs(30);
    while s.get(&t, &path).await.1["live"] == true {
        assert!(Instant::now() < deadline, "the session never idled out");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, net) = s.put(&t, &path, json!({"allow": [rule_a]})).await;
    assert_eq!(status, 200, "{net}");
    assert_eq!(net["live"], false);
    let (_, net) = s.get(&t, &path).await;
    assert_eq!(net["allow"], json!([rule_a]), "{net}");
    let records = network_records(&s, &id);
    assert_eq!(records.len(), 2, "{records:?}");
    assert_eq!(records[1]["removed"], json!([rule_b]));
    let (_, shown) = s.get(&t, &format!("/v1/sessions/{id}")).await;
    assert_eq!(shown["allow"], json!([rule_a]), "{shown}");

    // A session off the network has nothing to change.
    let (_, plain) = s.post(&t, "/v1/sessions", json!({})).await;
    let plain = plain["id"].as_str().unwrap();
    let (status, body) = s
        .put(
            &t,
            &format!("/v1/sessions/{plain}/network"),
            json!({"allow": [rule_a]}),
        )
        .await;
    assert_eq!(status, 409, "{body}");
    s.stop().await;
}

/// A ceiling lowered while a session slept: its next sandbox gets only
/// what the ceiling allows now, whatever its log says it had.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lowered_ceiling_narrows_a_session_when_it_wakes() {
    let b = service("service-b");
    let rule_b = format!("127.0.0.1:{b}");
    let a = service("service-a");
    let rule_a = format!("127.0.0.1:{a}");
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Fetching B.").with_tool_call(
                "c1",
                "bash",
                json!({"command": fetch(b)}),
            ))
            .turn(
                Turn::text("Refused.")
                    .expect_tool_results(["c1"])
                    .expect_contains(format!("network: 127.0.0.1:{b} refused by policy")),
            ),
    );
    let tmp = tempfile::tempdir().unwrap();
    let db = tmp.path().join("server.db").display().to_string();
    let (ra, rb, url) = (rule_a.clone(), rule_b.clone(), model.url());
    let s = TestServer::start_at(tmp.path(), &db, move |c| {
        c.agent = Some(agent_at(url));
        c.network.all.allow = vec![ra, rb];
    })
    .await;
    let t = s.token("t").await;
    let (status, ses) = s
        .post(&t, "/v1/sessions", json!({"allow": [rule_a, rule_b]}))
        .await;
    assert_eq!(status, 201, "{ses}");
    let id = ses["id"].as_str().unwrap().to_string();
    s.stop().await;

    let (url, ra) = (model.url(), rule_a.clone());
    let s = TestServer::start_at(tmp.path(), &db, move |c| {
        c.agent = Some(agent_at(url));
        c.network.all.allow = vec![ra];
    })
    .await;
    let turn = s.say(&t, &id, "fetch B").await;
    assert!(said(&turn, "Refused."), "{turn:?}");
    model.assert_finished();
    let (_, net) = s.get(&t, &format!("/v1/sessions/{id}/network")).await;
    assert_eq!(net["live"], true, "{net}");
    assert_eq!(net["allow"], json!([rule_a]), "{net}");
    s.stop().await;
}

/// Issue 31's third finding: a preset was expanded by starting the host's
/// tools for every request, before the ceiling was checked: 30 concurrent
/// jobs asking `@python`, all refused, were 30 pip processes. The tools
/// here are stand-ins that count their runs: they run when the server
/// starts, never for a request, and once more when their configuration
/// changes, after which requests see the new hosts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn presets_are_expanded_once_not_for_every_request() {
    use std::os::unix::fs::PermissionsExt;
    let tools = tempfile::tempdir().unwrap();
    let bin = tools.path().join("bin");
    let home = tools.path().join("home");
    let runs = tools.path().join("runs");
    std::fs::create_dir_all(&bin).unwrap();
    std::fs::create_dir_all(home.join(".config/pip")).unwrap();
    // pip's stand-in names the index its configuration file gives.
    let python3 = format!(
        "#!/bin/sh\necho python3 >> {runs}\n\
         ix=$(sed -n 's/^index-url = //p' \"$HOME/.config/pip/pip.conf\")\n\
         echo \"{{\\\"indexes\\\": [\\\"$ix\\\"], \\\"links\\\": [], \\\"files\\\": [], \\\"errors\\\": []}}\"\n",
        runs = runs.display()
    );
    let npm = format!(
        "#!/bin/sh\necho npm >> {runs}\necho '{{\"registry\": \"https://npm.mirror.test/\"}}'\n",
        runs = runs.display()
    );
    for (name, text) in [("python3", python3), ("npm", npm)] {
        std::fs::write(bin.join(name), text).unwrap();
        std::fs::set_permissions(bin.join(name), std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let conf = home.join(".config/pip/pip.conf");
    std::fs::write(
        &conf,
        "[global]\nindex-url = https://pypi.mirror.test/simple\n",
    )
    .unwrap();
    let env = cordon_net::PresetEnv {
        vars: [
            (
                "PATH".to_string(),
                format!("{}:/usr/bin:/bin", bin.display()),
            ),
            ("HOME".to_string(), home.display().to_string()),
        ]
        .into(),
        apt_dir: tools.path().join("apt"),
        untrusted: Vec::new(),
    };
    let s = TestServer::start_with(Db::Sqlite, |c| {
        c.network.all.allow = vec!["pypi2.mirror.test".into(), "@node".into()];
        c.preset_env = Some(env);
        c.preset_check = Duration::from_millis(100);
    })
    .await
    .unwrap();
    let t = s.token("t").await;
    let count = || {
        std::fs::read_to_string(&runs)
            .unwrap_or_default()
            .lines()
            .count()
    };
    let at_start = count();
    assert_eq!(at_start, 2, "each tool once at the start");

    // 30 at once, each beyond the ceiling: refused, and no tool ran.
    let asks = (0..30).map(|_| {
        s.post(
            &t,
            "/v1/jobs",
            json!({"kind": "shell", "command": "true", "allow": ["@python"]}),
        )
    });
    for (code, body) in futures_util::future::join_all(asks).await {
        assert_eq!(code, 403, "{body}");
        assert!(body.to_string().contains("pypi.mirror.test"), "{body}");
    }
    // Within the ceiling, from the same table.
    let (code, body) = s
        .post(
            &t,
            "/v1/jobs",
            json!({"kind": "shell", "command": "true", "allow": ["@node"]}),
        )
        .await;
    assert_eq!(code, 202, "{body}");
    let (_, job) = s
        .get(&t, &format!("/v1/jobs/{}", body["id"].as_str().unwrap()))
        .await;
    assert_eq!(
        job["request"]["allow"],
        json!(["npm.mirror.test:443"]),
        "{job}"
    );
    assert_eq!(count(), at_start, "a request started a tool");

    // The configuration changes: the tools run once more, and requests
    // get the new index.
    std::fs::write(
        &conf,
        "[global]\nindex-url = https://pypi2.mirror.test/simple\n",
    )
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (code, body) = s
            .post(
                &t,
                "/v1/jobs",
                json!({"kind": "shell", "command": "true", "allow": ["@python"]}),
            )
            .await;
        if code == 202 {
            let (_, job) = s
                .get(&t, &format!("/v1/jobs/{}", body["id"].as_str().unwrap()))
                .await;
            assert_eq!(
                job["request"]["allow"],
                json!(["pypi2.mirror.test:443"]),
                "{job}"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the change was never seen: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(count(), at_start + 2, "each tool once more, and only once");
}
