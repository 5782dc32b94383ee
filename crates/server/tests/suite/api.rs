//! The jobs API against a real server on loopback, with real sandboxes.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

async fn every_kind_runs_in_its_sandbox_with_output_and_exit_code(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let cases = [
        (
            shell("echo out; echo err >&2; exit 3"),
            "failed",
            3,
            "out\n",
            "err\n",
        ),
        (
            json!({"kind": "python", "code": "import sys\nprint(6 * 7)\nprint('warn', file=sys.stderr)"}),
            "succeeded",
            0,
            "42\n",
            "warn\n",
        ),
        (
            json!({"kind": "javascript", "code": "console.log([1,2,3].map(x => x * 2).join(','))"}),
            "succeeded",
            0,
            "2,4,6\n",
            "",
        ),
        (
            json!({"kind": "typescript", "code": "const n: number = 5;\nconsole.log(`n=${n}`)"}),
            "succeeded",
            0,
            "n=5\n",
            "",
        ),
    ];
    let mut ids = Vec::new();
    for (job, ..) in &cases {
        ids.push(s.submit(&t, job.clone()).await);
    }
    for ((_, state, code, out, err), id) in cases.iter().zip(&ids) {
        let job = s.wait(&t, id).await;
        assert_eq!(job["state"], *state, "{job}");
        assert_eq!(job["exit_code"], *code, "{job}");
        assert_eq!(job["stdout"], *out, "{job}");
        assert_eq!(job["stderr"], *err, "{job}");
        for k in ["created_at", "started_at", "finished_at"] {
            assert!(job[k].as_str().unwrap().ends_with('Z'), "{k}: {job}");
        }
    }
    // No network, no host: the sandbox is the same as `cordon run`'s.
    let id = s
        .submit(
            &t,
            shell("cat /etc/shadow; ip -o link 2>/dev/null | wc -l; hostname"),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert!(
        job["stdout"].as_str().unwrap().ends_with("cordon\n"),
        "{job}"
    );
    assert!(!job["stdout"].as_str().unwrap().contains("root:"), "{job}");
}

async fn steps_share_one_session_and_stop_at_the_first_failure(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            json!({"kind": "steps", "steps": [
                {"tool": "shell", "command": "export X=1; echo start > log.txt"},
                {"tool": "python", "code": "open('hello.txt', 'w').write('Hello from the agent!')"},
                {"tool": "write_file", "path": "sub/notes.md", "content": "# notes\n"},
                {"tool": "read_file", "path": "hello.txt"},
                {"tool": "shell", "command": "ls sub; exit 4"},
                {"tool": "shell", "command": "echo never"},
            ]}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["exit_code"], 4);
    assert_eq!(job["stdout"], "Hello from the agent!notes.md\n");
    let steps = job["result"]["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 6, "{job}");
    assert_eq!(steps[4]["exit_code"], 4);
    // Each step's own output and end; the one a failure kept from running
    // is listed as skipped.
    assert_eq!(steps[3]["stdout"], "Hello from the agent!", "{job}");
    assert_eq!(steps[4]["stdout"], "notes.md\n", "{job}");
    assert_eq!(steps[4]["state"], "failed");
    assert_eq!(steps[0]["stdout"], "", "{job}");
    assert!(steps[4]["duration_ms"].is_u64());
    assert_eq!(
        steps[5],
        json!({"index": 5, "tool": "shell", "state": "skipped"}),
        "the sixth never ran: {job}"
    );
    // continue_on_error runs them all and reports the first failure.
    let id = s
        .submit(
            &t,
            json!({"kind": "steps", "continue_on_error": true, "steps": [
                {"tool": "read_file", "path": "missing.txt"},
                {"tool": "shell", "command": "echo still"},
            ]}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "failed");
    assert_eq!(job["stdout"], "still\n");
    assert!(
        job["stderr"].as_str().unwrap().contains("missing.txt"),
        "{job}"
    );
    let steps = job["result"]["steps"].as_array().unwrap();
    assert!(
        steps[0]["stderr"].as_str().unwrap().contains("missing.txt"),
        "{job}"
    );
    assert_eq!(steps[1]["stdout"], "still\n");
    assert_eq!(steps[1]["stderr"], "");
}

async fn the_compatibility_routes_take_both_payload_shapes(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let (status, body) = s
        .post(
            &t,
            "/schedule",
            json!({"kind": "python", "code": "print(\"hello\")"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let id = body["job_id"].as_str().unwrap().to_string();
    s.wait(&t, &id).await;
    let (_, status_body) = s.get(&t, &format!("/status/{id}")).await;
    assert_eq!(status_body["state"], "succeeded");
    assert_eq!(status_body["stdout"], "hello\n");
    let (status, body) = s
        .post(
            &t,
            "/schedule",
            json!({"kind": "shell", "code": "echo from-code"}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let job = s.wait(&t, body["job_id"].as_str().unwrap()).await;
    assert_eq!(job["stdout"], "from-code\n");
    let (status, body) = s
        .post(
            &t,
            "/schedule",
            json!({"steps": [
                {"tool": "shell", "command": "ls -a"},
                {"tool": "python", "code": "with open(\"hello.txt\", \"w\") as f: f.write(\"Hello from the agent!\")"},
                {"tool": "shell", "command": "cat hello.txt"},
            ]}),
        )
        .await;
    assert_eq!(status, 202, "{body}");
    let task = body["task_id"].as_str().unwrap();
    s.wait(&t, task).await;
    let (status, job) = s.get(&t, &format!("/status?task_id={task}")).await;
    assert_eq!(status, 200);
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        job["stdout"]
            .as_str()
            .unwrap()
            .ends_with("Hello from the agent!")
    );
}

async fn every_route_needs_a_token_and_tenants_never_see_each_other(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let a = s.token("a").await;
    let b = s.token("b").await;
    let r = s.client.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let id = s.submit(&a, shell("echo mine > secret.txt")).await;
    s.wait(&a, &id).await;
    for path in [
        "/v1/jobs".to_string(),
        format!("/v1/jobs/{id}"),
        format!("/v1/jobs/{id}/events"),
        format!("/v1/jobs/{id}/files/secret.txt"),
        format!("/status/{id}"),
    ] {
        let r = s.client.get(s.url(&path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
        assert_eq!(r.headers()["www-authenticate"], "Bearer");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "unauthorized", "{path}");
        let (status, _) = s.get("cdn_not_a_token", &path).await;
        assert_eq!(status, 401, "{path}");
    }
    // Tenant b gets 404 for a's job, exactly as for a job that does not exist.
    for path in [
        format!("/v1/jobs/{id}"),
        format!("/v1/jobs/{id}/events"),
        format!("/v1/jobs/{id}/files"),
        format!("/v1/jobs/{id}/files/secret.txt"),
        format!("/status/{id}"),
        format!("/status?task_id={id}"),
    ] {
        let (status, body) = s.get(&b, &path).await;
        assert_eq!(status, 404, "{path}: {body}");
        let (missing, other) = s
            .get(&b, &path.replace(&id, "job_000000000000000000000000"))
            .await;
        assert_eq!(
            (missing, other["error"]["code"].clone()),
            (404, body["error"]["code"].clone())
        );
    }
    // An id no job could have, with bytes the store may refuse (a NUL, which
    // PostgreSQL does not take in text: that was a 503), is no such job.
    for path in [
        "/status?task_id=job_1%00%0E".to_string(),
        "/v1/jobs/job_1%00".to_string(),
        format!("/v1/jobs/{}", "a".repeat(300)),
        "/v1/sessions/ses_1%00".to_string(),
    ] {
        let (status, body) = s.get(&a, &path).await;
        assert_eq!(status, 404, "{path}: {body}");
    }
    let (status, _) = s
        .post(&b, &format!("/v1/jobs/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 404);
    let r = s
        .client
        .put(s.url(&format!("/v1/jobs/{id}/files/x.txt")))
        .bearer_auth(&b)
        .body("intrusion")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 404);
    let (_, list) = s.get(&b, "/v1/jobs").await;
    assert_eq!(list["jobs"], json!([]));
    let (_, list) = s.get(&a, "/v1/jobs").await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1);
}

async fn bad_input_gets_a_4xx_that_says_what_is_wrong(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| c.body_limit = 64 * 1024).await else {
        return;
    };
    let t = s.token("acme").await;
    let send = |body: &'static str| {
        s.client
            .post(s.url("/v1/jobs"))
            .bearer_auth(&t)
            .header("content-type", "application/json")
            .body(body)
            .send()
    };
    for (body, want) in [
        ("{not json", "not valid JSON"),
        ("[]", "the body must be a JSON object, not an array"),
        (
            r#"{"kind": "shell", "command": 7}"#,
            "`command`: invalid type: integer `7`, expected a string",
        ),
        (
            r#"{"kind": "shell", "comand": "ls"}"#,
            "unknown field `comand`",
        ),
        (
            r#"{"kind": "agent", "prompt": "hi"}"#,
            "no model configured",
        ),
        (
            r#"{"kind": "shell", "command": "ls", "timeout_secs": -1}"#,
            "`timeout_secs`: invalid value: integer `-1`",
        ),
        (
            r#"{"steps": [{"tool": "shell", "command": "ls"}, {"tool": "python"}]}"#,
            "`steps[1]`: missing field `code`",
        ),
    ] {
        let r = send(body).await.unwrap();
        assert_eq!(r.status(), 400, "{body}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_request");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(want),
            "{body}: {v}"
        );
    }
    let huge = json!({"kind": "shell", "command": "x".repeat(100 * 1024)});
    let (status, v) = s.post(&t, "/v1/jobs", huge).await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (413, Some("too_large")),
        "{v}"
    );
    // Issue 32: it says the limit.
    let message = v["error"]["message"].as_str().unwrap();
    assert!(
        message.contains("the 64 KiB this server accepts"),
        "{message}"
    );
    let (status, v) = s.get(&t, "/v1/nothing").await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (404, Some("not_found"))
    );
    let r = s
        .client
        .delete(s.url("/v1/jobs"))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 405);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "method_not_allowed");
    for q in [
        "state=sleeping",
        "limit=0",
        "limit=abc",
        "cursor=-4",
        "bogus=1",
    ] {
        let (status, v) = s.get(&t, &format!("/v1/jobs?{q}")).await;
        assert_eq!(status, 400, "{q}: {v}");
    }
    // Nothing of that was queued.
    let (_, list) = s.get(&t, "/v1/jobs").await;
    assert_eq!(list["jobs"], json!([]));
}

async fn events_resume_after_last_event_id_without_loss_or_duplicates(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            shell("for i in $(seq 1 20); do echo line-$i; sleep 0.02; done"),
        )
        .await;
    // Read the live stream for a while, then drop the connection.
    let mut resp = s
        .client
        .get(s.url(&format!("/v1/jobs/{id}/events")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-type"], "text/event-stream");
    let mut first = String::new();
    while parse_sse(&first).iter().filter(|e| e.1 == "stdout").count() < 3 {
        let chunk = resp.chunk().await.unwrap().expect("more events");
        first.push_str(&String::from_utf8_lossy(&chunk));
    }
    drop(resp);
    let seen = parse_sse(&first);
    let last = seen.last().unwrap().0;
    // Reconnect as a browser does.
    let rest = read_sse(
        s.client
            .get(s.url(&format!("/v1/jobs/{id}/events")))
            .bearer_auth(&t)
            .header("Last-Event-ID", last.to_string())
            .send()
            .await
            .unwrap(),
    )
    .await;
    let all: Vec<_> = seen.iter().chain(&rest).collect();
    let ids: Vec<i64> = all.iter().map(|e| e.0).collect();
    assert_eq!(
        ids,
        (1..=ids.len() as i64).collect::<Vec<_>>(),
        "gapless, once each"
    );
    let out: String = all
        .iter()
        .filter(|e| e.1 == "stdout")
        .map(|e| e.2["data"].as_str().unwrap())
        .collect();
    let want: String = (1..=20).map(|i| format!("line-{i}\n")).collect();
    assert_eq!(out, want);
    assert_eq!(all.last().unwrap().1, "finished");
    assert_eq!(all.last().unwrap().2["state"], "succeeded");
    // After the end, a fresh stream replays everything; `after` works too.
    let replay = read_sse(
        s.client
            .get(s.url(&format!("/v1/jobs/{id}/events?after=2")))
            .bearer_auth(&t)
            .send()
            .await
            .unwrap(),
    )
    .await;
    assert_eq!(replay.first().unwrap().0, 3);
    assert_eq!(replay.len(), ids.len() - 2);
    // Resuming at or past the end of a finished job ends the stream at
    // once instead of waiting for events that will never come.
    for after in [last_id(&all), 1_000_000] {
        let past = tokio::time::timeout(
            std::time::Duration::from_secs(10),
            read_sse(
                s.client
                    .get(s.url(&format!("/v1/jobs/{id}/events?after={after}")))
                    .bearer_auth(&t)
                    .send()
                    .await
                    .unwrap(),
            ),
        )
        .await
        .expect("the stream of a finished job ends");
        assert!(past.is_empty(), "{past:?}");
    }
}

fn last_id(events: &[&(i64, String, Value)]) -> i64 {
    events.last().map_or(0, |e| e.0)
}

async fn cancel_stops_a_queued_or_running_job(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| {
        c.workers = 1;
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    let running = s.submit(&t, shell("echo started; sleep 60")).await;
    let queued = s.submit(&t, shell("echo never")).await;
    s.wait_running(&t, &running).await;
    while s.get(&t, &format!("/v1/jobs/{running}")).await.1["stdout"] != "started\n" {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (status, job) = s
        .post(&t, &format!("/v1/jobs/{queued}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200);
    assert_eq!(job["state"], "cancelled");
    let started = std::time::Instant::now();
    let (status, job) = s
        .post(&t, &format!("/v1/jobs/{running}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200, "{job}");
    assert_eq!(job["state"], "cancelled", "{job}");
    assert!(started.elapsed() < Duration::from_secs(10));
    assert_eq!(job["stdout"], "started\n");
    let (status, v) = s
        .post(&t, &format!("/v1/jobs/{running}/cancel"), json!({}))
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("already_finished"))
    );
    // The queued job never ran.
    let job = s.wait(&t, &queued).await;
    assert_eq!(job["stdout"], "");
    let events = s.job_events(&t, &queued).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0].2["state"], "cancelled");
}

async fn timeouts_and_output_caps_are_reported(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| c.output_cap = 1000).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "command": "echo before; sleep 30", "timeout_secs": 1}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "timed_out", "{job}");
    assert_eq!(job["exit_code"], 124);
    assert_eq!(job["stdout"], "before\n");
    let id = s
        .submit(
            &t,
            shell("head -c 100000 /dev/zero | tr '\\0' x; echo tail >&2"),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["stdout"].as_str().unwrap().len(), 1000);
    assert_eq!(job["stdout_truncated"], true);
    assert_eq!(job["stderr"], "tail\n");
    assert_eq!(job["stderr_truncated"], false);
    let id = s
        .submit(
            &t,
            json!({"kind": "python", "code": "x = bytearray(400 * 1024 * 1024)", "memory": "64M"}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "failed", "{job}");
    // The CLI's convention: 122 is out of memory, not the signal's 137.
    assert_eq!(job["exit_code"], 122, "{job}");
    assert!(job["error"].as_str().unwrap().contains("memory"), "{job}");
}

async fn the_list_filters_and_pages_with_a_cursor(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let mut ids = Vec::new();
    for i in 0..7 {
        let job = if i % 2 == 0 {
            shell("true")
        } else {
            shell("false")
        };
        ids.push(s.submit(&t, job).await);
    }
    for id in &ids {
        s.wait(&t, id).await;
    }
    let mut seen = Vec::new();
    let mut path = "/v1/jobs?limit=3".to_string();
    loop {
        let (status, page) = s.get(&t, &path).await;
        assert_eq!(status, 200, "{page}");
        for j in page["jobs"].as_array().unwrap() {
            seen.push(j["id"].as_str().unwrap().to_string());
        }
        match page["next_cursor"].as_str() {
            Some(c) => path = format!("/v1/jobs?limit=3&cursor={c}"),
            None => break,
        }
    }
    let newest_first: Vec<String> = ids.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
    let (_, failed) = s.get(&t, "/v1/jobs?state=failed").await;
    assert_eq!(failed["jobs"].as_array().unwrap().len(), 3);
    let (_, shells) = s.get(&t, "/v1/jobs?kind=shell&state=succeeded").await;
    assert_eq!(shells["jobs"].as_array().unwrap().len(), 4);
}

/// The attack: a job leaves a detached writer behind that appends to a
/// file in its workspace as fast as it can. Once the job reads as ended,
/// the file no longer changes: its end is recorded after every process of
/// its sandbox has gone, not merely its command.
async fn a_job_is_ended_only_once_what_it_left_running_has_stopped(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            shell(
                "setsid sh -c 'while :; do echo tick >> /workspace/ticks; done' \
                 </dev/null >/dev/null 2>&1 & \
                 while [ ! -s /workspace/ticks ]; do sleep 0.01; done; echo started",
            ),
        )
        .await;
    let done = s.wait(&t, &id).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let size = || async {
        let (status, meta) = s.get(&t, &format!("/v1/jobs/{id}/files")).await;
        assert_eq!(status, 200, "{meta}");
        let ticks = meta["entries"]
            .as_array()
            .unwrap()
            .iter()
            .find(|e| e["name"] == "ticks")
            .cloned()
            .unwrap_or_else(|| panic!("no ticks in {meta}"));
        ticks["size"].as_u64().unwrap()
    };
    let first = size().await;
    assert!(first > 0);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        size().await,
        first,
        "the writer went on after the job ended"
    );
}

async fn files_are_read_and_written_beneath_the_workspace_only(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            shell(
                "mkdir -p out && echo result > out/r.txt && ln -s /etc/hostname link \
                 && ln -s loop-b loop-a && ln -s loop-a loop-b",
            ),
        )
        .await;
    s.wait(&t, &id).await;
    let get = |path: String| {
        s.client
            .get(s.url(&format!("/v1/jobs/{id}/files/{path}")))
            .bearer_auth(&t)
            .send()
    };
    let r = get("out/r.txt".into()).await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "result\n");
    let (status, root) = s.get(&t, &format!("/v1/jobs/{id}/files")).await;
    assert_eq!(status, 200);
    let names: Vec<&str> = root["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["link", "loop-a", "loop-b", "out"]);
    let r = get("out".into()).await.unwrap();
    let dir: Value = r.json().await.unwrap();
    assert_eq!(dir["entries"][0]["name"], "r.txt");
    assert_eq!(dir["entries"][0]["size"], 7);
    let put = |path: &str, body: &'static str| {
        s.client
            .put(s.url(&format!("/v1/jobs/{id}/files/{path}")))
            .bearer_auth(&t)
            .body(body)
            .send()
    };
    let r = put("in/data.csv", "a,b\n").await.unwrap();
    assert_eq!(r.status(), 201);
    let r = put("in/data.csv", "c,d\n").await.unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(
        std::fs::read_to_string(s.dir.join(format!("data/jobs/{id}/workspace/in/data.csv")))
            .unwrap(),
        "c,d\n"
    );
    // Escapes: `..` (encoded so the client sends it), a symlink out, absolute paths.
    for path in ["..%2F..%2Fserver.db", "link", "%2Fetc%2Fpasswd"] {
        let r = get(path.into()).await.unwrap();
        assert_eq!(r.status(), 400, "{path}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_request", "{path}: {v}");
    }
    let r = put("link", "overwrite").await.unwrap();
    assert_eq!(r.status(), 400);
    assert_ne!(
        std::fs::read_to_string("/etc/hostname").unwrap(),
        "overwrite"
    );
    let r = get("nope.txt".into()).await.unwrap();
    assert_eq!(r.status(), 404);
    // Names the sandbox or a client can make up are the client's error,
    // not the server's: a NUL byte, a 300-byte name, a 4800-byte path, a
    // loop of links.
    let long_name = "n".repeat(300);
    let long_path = vec!["d"; 2400].join("%2F");
    for path in ["bad%00name", &long_name, &long_path, "loop-a"] {
        let r = get(path.to_string()).await.unwrap();
        let status = r.status();
        assert_eq!(status, 400, "{}", &path[..path.len().min(40)]);
        let v: Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_request", "{v}");
    }
    let r = put("loop-a", "x").await.unwrap();
    assert_eq!(r.status(), 400);
    assert_eq!(root["truncated"], false);

    // A directory of more entries than a listing reads: a bounded answer
    // that says it is not all.
    let many = s
        .submit(
            &t,
            shell("mkdir many && cd many && seq 10100 | xargs touch && ls | wc -l"),
        )
        .await;
    let done = s.wait(&t, &many).await;
    assert_eq!(done["stdout"], "10100\n", "{done}");
    let (status, dir) = s.get(&t, &format!("/v1/jobs/{many}/files/many")).await;
    assert_eq!(status, 200);
    assert_eq!(dir["truncated"], true);
    assert_eq!(dir["entries"].as_array().unwrap().len(), 10_000);
}

async fn files_uploaded_before_a_job_runs_are_there_when_it_does(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| c.workers = 1).await else {
        return;
    };
    let t = s.token("acme").await;
    let blocker = s.submit(&t, shell("sleep 1")).await;
    let id = s.submit(&t, shell("cat input.txt")).await;
    let r = s
        .client
        .put(s.url(&format!("/v1/jobs/{id}/files/input.txt")))
        .bearer_auth(&t)
        .body("uploaded first\n")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201);
    s.wait(&t, &blocker).await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["stdout"], "uploaded first\n", "{job}");
}

async fn a_tenant_runs_at_most_its_limit_at_once_while_others_proceed(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| {
        c.workers = 3;
        c.per_tenant = 1;
    })
    .await
    else {
        return;
    };
    let a = s.token("a").await;
    let b = s.token("b").await;
    let a1 = s.submit(&a, shell("sleep 1")).await;
    let a2 = s.submit(&a, shell("sleep 1")).await;
    let b1 = s.submit(&b, shell("true")).await;
    s.wait_running(&a, &a1).await;
    // b's job runs while a's second waits for a's first.
    let jb = s.wait(&b, &b1).await;
    assert_eq!(jb["state"], "succeeded");
    let (_, j2) = s.get(&a, &format!("/v1/jobs/{a2}")).await;
    assert_eq!(j2["state"], "queued", "{j2}");
    let j1 = s.wait(&a, &a1).await;
    let j2 = s.wait(&a, &a2).await;
    // The claim's UPDATE only sees a1 finished, but both times are taken
    // before the database's write lock, so they may be a few milliseconds
    // out of order (seen: 1 ms). a1 runs for a second.
    let ms = |v: &Value, k: &str| {
        humantime::parse_rfc3339(v[k].as_str().unwrap())
            .unwrap()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as i64
    };
    assert!(
        ms(&j2, "started_at") >= ms(&j1, "finished_at") - 50,
        "{j1}\n{j2}"
    );
}

async fn an_agent_job_runs_the_model_s_tools_and_reports_its_answer_and_usage(db: Db) {
    use cordon_testkit::{Scenario, ScriptedServer, Turn, Usage};
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Writing it.")
                    .with_tool_call(
                        "t1",
                        "bash",
                        json!({"command": "echo 'print(2 + 3)' > sum.py && python3 sum.py"}),
                    )
                    .usage(Usage {
                        input_tokens: 100,
                        output_tokens: 20,
                        ..Default::default()
                    }),
            )
            .turn(
                Turn::text("sum.py prints 5.")
                    .expect_tool_results(["t1"])
                    .expect_contains("5")
                    .usage(Usage {
                        input_tokens: 150,
                        output_tokens: 10,
                        ..Default::default()
                    }),
            ),
    );
    let url = model.url();
    let Some(s) = TestServer::start_with(db, with_model(url)).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            json!({"kind": "agent", "prompt": "write sum.py and run it", "max_steps": 5}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    model.assert_finished();
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"]["text"], "sum.py prints 5.");
    assert_eq!(job["result"]["usage"]["input_tokens"], 250);
    assert_eq!(job["result"]["usage"]["output_tokens"], 30);
    assert!(job["result"]["cost_usd"].as_f64().unwrap() > 0.0);
    let r = s
        .client
        .get(s.url(&format!("/v1/jobs/{id}/files/sum.py")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.text().await.unwrap(), "print(2 + 3)\n");
    // The events are the agent's, as `cordon exec --json` prints them.
    let events = s.job_events(&t, &id).await;
    let kinds: Vec<&str> = events.iter().map(|e| e.1.as_str()).collect();
    for k in [
        "turn_started",
        "text_delta",
        "tool_call_started",
        // The command's output, live, before its result.
        "tool_output",
        "tool_call_finished",
        "turn_completed",
        "finished",
    ] {
        assert!(kinds.contains(&k), "{k} missing from {kinds:?}");
    }
    let live = events.iter().position(|e| e.1 == "tool_output").unwrap();
    let done = events
        .iter()
        .position(|e| e.1 == "tool_call_finished")
        .unwrap();
    assert!(live < done, "live output comes before the result");
    // In as many pieces as the output arrived in (seen: "5", then "\n").
    let streamed: String = events[live..done]
        .iter()
        .filter(|e| e.1 == "tool_output")
        .filter_map(|e| e.2["text"].as_str())
        .collect();
    assert_eq!(streamed, "5\n");
    let finished = events.iter().find(|e| e.1 == "tool_call_finished").unwrap();
    assert_eq!(finished.2["type"], "tool_call_finished");
    assert!(finished.2["output"].as_str().unwrap().contains('5'));
    // The conversation is kept beside the workspace.
    let log = s.dir.join(format!("data/jobs/{id}/session.jsonl"));
    assert!(
        std::fs::read_to_string(log)
            .unwrap()
            .contains("\"type\":\"turn_completed\"")
    );
}

async fn a_gui_job_clicks_types_and_keeps_its_screenshots(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            json!({"kind": "gui", "display": "1024x768", "steps": [
                // xev records what reaches its window, put at the top left.
                {"tool": "shell", "command": "xev -geometry 300x200+0+0 > /tmp/xev.log 2>&1 & \
                    w=$(xdotool search --sync --name 'Event Tester' | head -1); \
                    xdotool windowmove --sync $w 0 0; sleep 0.3"},
                {"tool": "computer", "action": "screenshot"},
                {"tool": "computer", "action": "left_click", "coordinate": [120, 100]},
                {"tool": "computer", "action": "type", "text": "gui"},
                {"tool": "shell", "command": "pgrep -x xev >/dev/null && echo xev-still-running"}
            ]}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["kind"], "gui");
    let steps = job["result"]["steps"].as_array().unwrap();
    // Numbered from 1, as the output and the web UI number steps.
    assert_eq!(steps[1]["screenshot"], "screenshots/step-02.png", "{job}");
    assert_eq!(steps[2]["screenshot"], "screenshots/step-03.png");
    // Where keys and clicks land is tested with the tool itself
    // (crates/tools/tests/suite/tools.rs); here, that the steps ran in order in
    // one session, on one screen.
    let stdout = job["stdout"].as_str().unwrap();
    assert!(stdout.contains("Typed 3 characters."), "{job}");
    assert!(stdout.ends_with("xev-still-running\n"), "{job}");
    // The screenshot is a 1024x768 PNG in the workspace.
    let png = s
        .client
        .get(s.url(&format!("/v1/jobs/{id}/files/screenshots/step-02.png")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let size = |at: usize| u32::from_be_bytes([png[at], png[at + 1], png[at + 2], png[at + 3]]);
    assert_eq!((size(16), size(20)), (1024, 768));

    // Computer steps need a display; bad actions and sizes are refused.
    for (bad, why) in [
        (
            json!({"kind": "steps", "steps": [{"tool": "computer", "action": "screenshot"}]}),
            "computer steps need a display",
        ),
        (
            json!({"kind": "gui", "steps": [{"tool": "computer", "action": "fly"}]}),
            "invalid computer action",
        ),
        (
            json!({"kind": "gui", "display": "9x9", "steps": [{"tool": "computer", "action": "screenshot"}]}),
            "`display`",
        ),
    ] {
        let (status, body) = s.post(&t, "/v1/jobs", bad).await;
        assert_eq!(status, 400, "{body}");
        assert!(body.to_string().contains(why), "{body}");
    }
}

on_both!(
    a_gui_job_clicks_types_and_keeps_its_screenshots,
    every_kind_runs_in_its_sandbox_with_output_and_exit_code,
    steps_share_one_session_and_stop_at_the_first_failure,
    the_compatibility_routes_take_both_payload_shapes,
    every_route_needs_a_token_and_tenants_never_see_each_other,
    bad_input_gets_a_4xx_that_says_what_is_wrong,
    events_resume_after_last_event_id_without_loss_or_duplicates,
    cancel_stops_a_queued_or_running_job,
    timeouts_and_output_caps_are_reported,
    the_list_filters_and_pages_with_a_cursor,
    files_are_read_and_written_beneath_the_workspace_only,
    a_job_is_ended_only_once_what_it_left_running_has_stopped,
    files_uploaded_before_a_job_runs_are_there_when_it_does,
    a_tenant_runs_at_most_its_limit_at_once_while_others_proceed,
    an_agent_job_runs_the_model_s_tools_and_reports_its_answer_and_usage,
);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_lists_every_route_and_docs_render_it() {
    let Some(s) = TestServer::start(Db::Sqlite).await else {
        return;
    };
    // Both are public, like /health: they describe, they hold no data.
    let doc: Value = s
        .client
        .get(s.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert!(doc["openapi"].as_str().unwrap().starts_with("3."));
    let paths = doc["paths"].as_object().unwrap();
    for (path, method) in [
        ("/health", "get"),
        ("/v1/jobs", "post"),
        ("/v1/jobs", "get"),
        ("/v1/jobs/{id}", "get"),
        ("/v1/jobs/{id}/cancel", "post"),
        ("/v1/jobs/{id}/events", "get"),
        ("/v1/jobs/{id}/files", "get"),
        ("/v1/jobs/{id}/files/{path}", "get"),
        ("/v1/jobs/{id}/files/{path}", "put"),
        ("/schedule", "post"),
        ("/status", "get"),
        ("/status/{id}", "get"),
        ("/v1/sessions", "post"),
        ("/v1/sessions", "get"),
        ("/v1/sessions/{id}", "get"),
        ("/v1/sessions/{id}", "delete"),
        ("/v1/sessions/{id}/messages", "post"),
        ("/v1/sessions/{id}/cancel", "post"),
        ("/v1/sessions/{id}/compact", "post"),
    ] {
        assert!(
            paths[path].get(method).is_some(),
            "{method} {path} undocumented"
        );
    }
    assert_eq!(
        doc["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    // Every documented route exists: none answers "no such route".
    let t = s.token("acme").await;
    for (path, item) in paths {
        let concrete = path.replace("{id}", "job_x").replace("{path}", "f");
        for method in item.as_object().unwrap().keys() {
            let r = s
                .client
                .request(method.to_uppercase().parse().unwrap(), s.url(&concrete))
                .bearer_auth(&t)
                .send()
                .await
                .unwrap();
            let status = r.status().as_u16();
            let body: Value = r.json().await.unwrap_or(Value::Null);
            assert!(
                !(status == 404
                    && body["error"]["message"]
                        .as_str()
                        .unwrap_or("")
                        .contains("route")),
                "{method} {concrete}: {body}"
            );
            assert!(status != 405, "{method} {concrete}");
        }
    }
    // /docs, which renders it: tests/ui.rs.
}

/// A job may ask for the microvm backend: it then runs on a kernel of its
/// own, with the same output, exit code and workspace as any other job.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_on_the_microvm_backend_runs_on_its_own_kernel() {
    let s = TestServer::start(Db::Sqlite).await.unwrap();
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "backend": "microvm",
                   "command": "uname -r; echo made > out.txt; echo oops >&2; exit 3"}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["exit_code"], 3, "{job}");
    assert_eq!(job["request"]["backend"], "microvm");
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let guest = job["stdout"]
        .as_str()
        .unwrap()
        .lines()
        .next()
        .unwrap()
        .to_string();
    assert_ne!(guest, host.trim(), "{job}");
    assert_eq!(job["stderr"], "oops\n");
    let (status, _) = s.get(&t, &format!("/v1/jobs/{id}/files/out.txt")).await;
    assert_eq!(status, 200);
    let (status, body) = s
        .post(
            &t,
            "/v1/jobs",
            json!({"kind": "shell", "command": "true", "backend": "lxc"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    s.stop().await;
}

/// Issue 32: "Try it out" at /docs sends a route's first example as it
/// stands. Every request body has examples, and each route's first one is
/// accepted by a default server (with a model for the sessions' routes,
/// and a host its tenants may reach for the network's), given the job or
/// session its path names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_request_body_s_first_example_is_accepted() {
    use cordon_testkit::{Scenario, ScriptedServer, Turn};
    let model = ScriptedServer::start(Scenario::new().turn(Turn::text("Nothing to do.")));
    let url = model.url();
    let s = TestServer::start_with(Db::Sqlite, move |c| {
        with_model(url)(c);
        c.network.all.allow = vec!["api.example.com:443".into()];
    })
    .await
    .unwrap();
    let t = s
        .token_as("docs", cordon_server::store::Role::Operator)
        .await;
    let (status, spec) = s.get(&t, "/openapi.json").await;
    assert_eq!(status, 200);
    // What the paths name: a running job whose network is brokered, and a
    // session.
    let (status, job) = s
        .post(
            &t,
            "/v1/jobs",
            json!({"kind": "shell", "command": "sleep 60", "network": "allow", "allow": []}),
        )
        .await;
    assert_eq!(status, 202, "{job}");
    let job = job["id"].as_str().unwrap().to_string();
    s.wait_running(&t, &job).await;
    let (status, session) = s
        .post(&t, "/v1/sessions", json!({"network": "allow", "allow": []}))
        .await;
    assert_eq!(status, 201, "{session}");
    let session = session["id"].as_str().unwrap().to_string();
    let (status, sandbox) = s
        .post(
            &t,
            "/v1/sandboxes",
            json!({"network": "allow", "allow": []}),
        )
        .await;
    assert_eq!(status, 201, "{sandbox}");
    let sandbox = sandbox["id"].as_str().unwrap().to_string();

    let mut routes = Vec::new();
    for (path, ops) in spec["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            let Some((content_type, content)) = op["requestBody"]["content"]
                .as_object()
                .and_then(|c| c.iter().next())
            else {
                continue;
            };
            let example = content["examples"]
                .as_object()
                .and_then(|e| e.values().next())
                .map(|e| e["value"].clone())
                .or_else(|| content.get("example").cloned())
                .unwrap_or_else(|| panic!("{method} {path} has no example"));
            routes.push((method.clone(), path.clone(), content_type.clone(), example));
        }
    }
    // A rewind goes back to a turn: after the message that makes one.
    routes.sort_by_key(|r| r.1.ends_with("/rewind"));
    assert!(routes.len() >= 10, "{routes:?}");
    for (method, path, content_type, example) in routes {
        let id = if path.starts_with("/v1/sessions/") {
            &session
        } else if path.starts_with("/v1/sandboxes/") {
            &sandbox
        } else {
            &job
        };
        let url = path
            .replace("{id}", id)
            .replace("{path}", "hello.py")
            .replace("{port}", "8000")
            .replace("{pid}", "1")
            .replace("{host}", "git.example.com");
        let mut request = s
            .client
            .request(method.to_uppercase().parse().unwrap(), s.url(&url))
            .bearer_auth(&t)
            .header("content-type", &content_type);
        request = match example {
            Value::String(text) if content_type != "application/json" => request.body(text),
            value => request.body(value.to_string()),
        };
        let r = request.send().await.unwrap();
        let status = r.status().as_u16();
        let body = r.text().await.unwrap();
        // Taken as a request, then refused for what this server lacks (the
        // images tests give them what they need): a registry its catalog
        // opens, a session on an image rather than the host's root.
        let refused_for_state = match (method.as_str(), path.as_str()) {
            ("post", "/v1/images") => Some((403, "forbidden")),
            ("post", "/v1/sessions/{id}/snapshot") => Some((400, "host's root")),
            // No process was started through the API with that pid.
            ("post", "/v1/sandboxes/{id}/commands/{pid}/stdin")
            | ("post", "/v1/sandboxes/{id}/commands/{pid}/signal") => Some((404, "process")),
            // A fresh sandbox has no draft to move.
            ("post", "/v1/sandboxes/{id}/fs/move") => Some((404, "No such file")),
            // No directory named (a query), and the example is no tar.
            ("put", "/v1/sandboxes/{id}/fs/archive") => Some((400, "path")),
            _ => None,
        };
        match refused_for_state {
            Some((want, code)) => assert!(
                status == want && body.contains(code),
                "{method} {url}: {status} {body}"
            ),
            None => assert!(
                (200..300).contains(&status),
                "{method} {url}: {status} {body}"
            ),
        }
    }
    let (status, _) = s.delete(&t, &format!("/v1/jobs/{job}")).await;
    assert!((200..300).contains(&status) || status == 409);
    s.stop().await;
}

/// Issue 32: a rollout's SIGTERM. The server takes no more jobs, lets the
/// running ones finish within its grace, then cancels the rest, each
/// recorded as `cancelled` with the reason; started again, it finds
/// nothing half-done, and runs what was queued.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_lets_running_jobs_finish_within_its_grace_then_cancels_the_rest() {
    let dir = tempfile::tempdir().unwrap();
    let (db_url, _pg) = database(Db::Sqlite, dir.path()).unwrap();
    let grace = |c: &mut cordon_server::ServerConfig| {
        c.grace = Duration::from_secs(3);
        c.workers = 2;
    };
    let s = TestServer::start_at(dir.path(), &db_url, grace).await;
    let t = s.token("acme").await;
    let quick = s.submit(&t, shell("sleep 1; echo finished")).await;
    let slow = s.submit(&t, shell("sleep 60; echo never")).await;
    s.wait_running(&t, &quick).await;
    s.wait_running(&t, &slow).await;
    let queued = s.submit(&t, shell("echo after the restart")).await;
    let started = Instant::now();
    let stopped = s.stop().await.unwrap();
    let took = started.elapsed();
    assert_eq!((stopped.finished, stopped.cancelled), (1, 1), "{stopped:?}");
    assert!(
        took >= Duration::from_secs(3),
        "the grace was not given: {took:?}"
    );
    assert!(took < Duration::from_secs(15), "{took:?}");

    let s = TestServer::start_at(dir.path(), &db_url, grace).await;
    let job = s.wait(&t, &quick).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        job["stdout"].as_str().unwrap().contains("finished"),
        "{job}"
    );
    let (_, job) = s.get(&t, &format!("/v1/jobs/{slow}")).await;
    assert_eq!(job["state"], "cancelled", "{job}");
    let error = job["error"].as_str().unwrap_or_default();
    assert!(
        error.contains("server was stopped") && error.contains("grace period of 3s"),
        "{job}"
    );
    let job = s.wait(&t, &queued).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    s.stop().await;
}
