//! The sandbox API: sandboxes made, listed by metadata, ended by delete,
//! by their timeout and by the server's stop; commands run and waited
//! for, streamed, started in the background and followed again, written
//! to and signalled; files; and what another tenant, bad input and the
//! caps get.

use crate::common;

use std::time::{Duration, Instant};

use common::*;

use serde_json::{Value, json};

/// `GET path` as SSE, read to its end: (event, data) in order.
async fn sse(s: &TestServer, t: &str, path: &str) -> Vec<(String, Value)> {
    let r = s
        .client
        .get(s.url(path))
        .bearer_auth(t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    read_sse(r)
        .await
        .into_iter()
        .map(|(_, e, d)| (e, d))
        .collect()
}

fn stdout_of(events: &[(String, Value)]) -> String {
    events
        .iter()
        .filter(|(e, _)| e == "stdout")
        .map(|(_, d)| d["text"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn a_sandbox_runs_commands_until_it_is_deleted() {
    let Some(s) = TestServer::start(Db::Sqlite).await else {
        return;
    };
    let t = s.token("acme").await;
    let other = s.token("zeta").await;
    let id = new_sandbox(
        &s,
        &t,
        json!({"env": {"APP_ENV": "test"}, "metadata": {"user": "42", "team": "a b"}, "timeout_secs": 600}),
    )
    .await;

    // Shown, listed, found by its metadata; another tenant sees nothing.
    let (_, shown) = s.get(&t, &format!("/v1/sandboxes/{id}")).await;
    assert_eq!(shown["metadata"]["user"], "42", "{shown}");
    assert_eq!(
        shown["request"]["env"],
        json!(["APP_ENV"]),
        "values stay out"
    );
    for (query, found) in [
        ("", true),
        ("?metadata=user%3D42", true),
        ("?metadata=team%3Da%2520b%26user%3D42", true),
        ("?metadata=user%3D43", false),
    ] {
        let (status, list) = s.get(&t, &format!("/v1/sandboxes{query}")).await;
        assert_eq!(status, 200, "{list}");
        let ids: Vec<&str> = list["sandboxes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b["id"].as_str().unwrap())
            .collect();
        assert_eq!(ids.contains(&id.as_str()), found, "{query}: {list}");
    }
    let (status, _) = s.get(&other, &format!("/v1/sandboxes/{id}")).await;
    assert_eq!(status, 404);
    let (_, theirs) = s.get(&other, "/v1/sandboxes").await;
    assert_eq!(theirs["sandboxes"], json!([]));
    let (status, _) = s
        .post(
            &other,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "id"}),
        )
        .await;
    assert_eq!(status, 404);

    // A command waited for: its code, streams, the sandbox's variables and
    // its own, a working directory, stdin.
    let r = sandbox_command(
        &s,
        &t,
        &id,
        json!({"cmd": "echo $APP_ENV $MINE; pwd; echo err >&2; exit 3", "env": {"MINE": "x"}, "cwd": "/tmp"}),
    )
    .await;
    assert_eq!(r["exit_code"], 3);
    assert_eq!(r["stdout"], "test x\n/tmp\n");
    assert_eq!(r["stderr"], "err\n");
    let r = sandbox_command(&s, &t, &id, json!({"cmd": "cat; echo", "stdin": "hello"})).await;
    assert_eq!(r["stdout"], "hello\n");

    // Files written through the API are the commands' workspace.
    let put = s
        .client
        .put(s.url(&format!("/v1/sandboxes/{id}/files/data/in.txt")))
        .bearer_auth(&t)
        .body("from the API")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let r = sandbox_command(
        &s,
        &t,
        &id,
        json!({"cmd": "cat data/in.txt > out.txt && cat out.txt"}),
    )
    .await;
    assert_eq!(r["stdout"], "from the API");
    let (status, files) = s.get(&t, &format!("/v1/sandboxes/{id}/files")).await;
    assert_eq!(status, 200, "{files}");
    assert!(files.to_string().contains("out.txt"), "{files}");

    // Streamed as it runs.
    let r = s
        .client
        .post(s.url(&format!("/v1/sandboxes/{id}/commands")))
        .bearer_auth(&t)
        .header("accept", "text/event-stream")
        .json(&json!({"cmd": "echo one; sleep 0.2; echo two >&2; exit 4"}))
        .send()
        .await
        .unwrap();
    let events: Vec<(String, Value)> = read_sse(r)
        .await
        .into_iter()
        .map(|(_, e, d)| (e, d))
        .collect();
    let names: Vec<&str> = events.iter().map(|(e, _)| e.as_str()).collect();
    assert_eq!(names, ["start", "stdout", "stderr", "exit"], "{events:?}");
    assert_eq!(events[3].1["exit_code"], 4);

    // In the background: listed, followed while it runs and again after.
    let (status, p) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "for i in 1 2 3; do echo $i; sleep 0.2; done", "background": true}),
        )
        .await;
    assert_eq!(status, 202, "{p}");
    let pid = p["pid"].as_i64().unwrap();
    let (_, list) = s.get(&t, &format!("/v1/sandboxes/{id}/commands")).await;
    assert!(
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|q| q["pid"] == pid && q["state"] == "running"),
        "{list}"
    );
    let events = sse(&s, &t, &format!("/v1/sandboxes/{id}/commands/{pid}/events")).await;
    assert_eq!(stdout_of(&events), "1\n2\n3\n");
    assert_eq!(events.last().unwrap().1["exit_code"], 0);
    let again = sse(&s, &t, &format!("/v1/sandboxes/{id}/commands/{pid}/events")).await;
    assert_eq!(again, events, "the same, replayed");
    // From a given event on: what came after it.
    let r = s
        .client
        .get(s.url(&format!("/v1/sandboxes/{id}/commands/{pid}/events")))
        .bearer_auth(&t)
        .header("last-event-id", "2")
        .send()
        .await
        .unwrap();
    let rest = read_sse(r).await;
    assert_eq!(rest.first().map(|e| e.0), Some(3), "{rest:?}");

    // Stdin left open, written in pieces, closed.
    let (_, p) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "cat", "background": true, "stdin_open": true}),
        )
        .await;
    let pid = p["pid"].as_i64().unwrap();
    for (body, close) in [("abc\n", false), ("def\n", true)] {
        let r = s
            .client
            .post(s.url(&format!(
                "/v1/sandboxes/{id}/commands/{pid}/stdin?close={close}"
            )))
            .bearer_auth(&t)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 204);
    }
    let events = sse(&s, &t, &format!("/v1/sandboxes/{id}/commands/{pid}/events")).await;
    assert_eq!(stdout_of(&events), "abc\ndef\n");

    // Signalled.
    let (_, p) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "sleep 60", "background": true}),
        )
        .await;
    let pid = p["pid"].as_i64().unwrap();
    let (status, b) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands/{pid}/signal"),
            json!({"signal": "SIGTERM"}),
        )
        .await;
    assert_eq!(status, 204, "{b}");
    let events = sse(&s, &t, &format!("/v1/sandboxes/{id}/commands/{pid}/events")).await;
    assert_eq!(events.last().unwrap().1["exit_code"], 143);

    // Bad requests say what is wrong.
    for (path, body) in [
        ("commands", json!({"cmd": ""})),
        ("commands", json!({"cmd": "id", "shell": "zsh"})),
        ("commands", json!({"cmd": "id", "env": {"A=B": "c"}})),
        (
            &format!("commands/{pid}/signal"),
            json!({"signal": "SIGBOGUS"}),
        ),
        ("timeout", json!({"timeout_secs": 0})),
    ] {
        let (status, b) = s
            .post(&t, &format!("/v1/sandboxes/{id}/{path}"), body)
            .await;
        assert_eq!(status, 400, "{path}: {b}");
    }
    let (status, _) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands/999999/signal"),
            json!({"signal": 9}),
        )
        .await;
    assert_eq!(status, 404);
    let (status, b) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "true", "cwd": "/nonexistent"}),
        )
        .await;
    assert_eq!(status, 422, "{b}");

    // Deleted: ended, its files gone, nothing runs; deleting again is fine.
    let dir = s.dir.join("data/sandboxes").join(&id);
    assert!(dir.join("workspace/out.txt").exists());
    let (status, _) = s.delete(&t, &format!("/v1/sandboxes/{id}")).await;
    assert_eq!(status, 204);
    let (_, shown) = s.get(&t, &format!("/v1/sandboxes/{id}")).await;
    assert_eq!(shown["state"], "ended");
    assert_eq!(shown["end_reason"], "killed");
    assert!(!dir.exists(), "its workspace is removed");
    let (status, _) = s.get(&t, &format!("/v1/sandboxes/{id}/files")).await;
    assert_eq!(status, 410);
    let (status, _) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "id"}),
        )
        .await;
    assert_eq!(status, 409);
    let (status, _) = s.delete(&t, &format!("/v1/sandboxes/{id}")).await;
    assert_eq!(status, 204);
    let (_, list) = s.get(&t, "/v1/sandboxes").await;
    assert_eq!(list["sandboxes"], json!([]));
}

#[tokio::test]
async fn a_sandbox_ends_at_its_timeout_unless_extended() {
    let Some(s) = TestServer::start(Db::Sqlite).await else {
        return;
    };
    let t = s.token("acme").await;
    let short = new_sandbox(&s, &t, json!({"timeout_secs": 1})).await;
    let kept = new_sandbox(&s, &t, json!({"timeout_secs": 1})).await;
    let (status, b) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{kept}/timeout"),
            json!({"timeout_secs": 60}),
        )
        .await;
    assert_eq!(status, 200, "{b}");
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let (_, b) = s.get(&t, &format!("/v1/sandboxes/{short}")).await;
        if b["state"] == "ended" {
            assert_eq!(b["end_reason"], "timeout", "{b}");
            break;
        }
        assert!(Instant::now() < deadline, "{b}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (_, b) = s.get(&t, &format!("/v1/sandboxes/{kept}")).await;
    assert_eq!(b["state"], "running", "{b}");
    let r = sandbox_command(&s, &t, &kept, json!({"cmd": "echo still here"})).await;
    assert_eq!(r["stdout"], "still here\n");
}

#[tokio::test]
async fn sandboxes_count_against_the_tenant_s_cap_and_end_with_the_server() {
    let dir = tempfile::tempdir().unwrap();
    let db = format!("sqlite://{}", dir.path().join("db.sqlite").display());
    let s = TestServer::start_at(dir.path(), &db, |c| c.sessions_per_tenant = 1).await;
    let t = s.token("acme").await;
    let id = new_sandbox(&s, &t, json!({})).await;
    let (status, b) = s.post(&t, "/v1/sandboxes", json!({})).await;
    assert_eq!(status, 429, "{b}");
    for bad in [
        json!({"timeout_secs": 0}),
        json!({"env": {"": "x"}}),
        json!({"metadata": {"k": "v".repeat(1025)}}),
        json!({"network": "full"}),
        json!({"ram": "1G"}),
    ] {
        let (status, b) = s.post(&t, "/v1/sandboxes", bad.clone()).await;
        assert_eq!(status, 400, "{bad}: {b}");
    }
    s.stop().await;
    let s = TestServer::start_at(dir.path(), &db, |_| {}).await;
    let (_, b) = s.get(&t, &format!("/v1/sandboxes/{id}")).await;
    assert_eq!(b["state"], "ended", "{b}");
    assert_eq!(b["end_reason"], "the server stopped", "{b}");
    // Its place under the cap went with it.
    new_sandbox(&s, &t, json!({})).await;
}

/// The attack on the workspace a server makes ahead for the next
/// sandbox: a sandbox leaves files and a process; the next one takes the
/// spare (under its id) and finds neither; a stopped server removes the
/// spare still waiting.
#[tokio::test]
async fn a_sandbox_s_workspace_made_ahead_is_fresh() {
    if !volumes() {
        return;
    }
    let Some(mut s) = TestServer::start_with(Db::Sqlite, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    let first = new_sandbox(&s, &t, json!({})).await;
    let r = sandbox_command(
        &s,
        &t,
        &first,
        json!({"cmd": "echo left > /workspace/left; setsid sh -c 'exec -a lurker sleep 1000' </dev/null >/dev/null 2>&1 &"}),
    )
    .await;
    assert_eq!(r["exit_code"], 0, "{r}");
    let spare = ready_ahead(&s, "sbx_", &[]).await;
    let ws = s.dir.join("data/sandboxes").join(&spare).join("workspace");
    assert_eq!(
        std::fs::read_dir(&ws).unwrap().count(),
        0,
        "a spare with files"
    );

    let second = new_sandbox(&s, &t, json!({})).await;
    assert_eq!(second, spare, "the next sandbox did not take the spare");
    let r = sandbox_command(
        &s,
        &t,
        &second,
        json!({"cmd": "ls -A /workspace; for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done"}),
    )
    .await;
    let out = r["stdout"].as_str().unwrap();
    for left in ["left", "lurker", "sleep 1000"] {
        assert!(!out.contains(left), "{left:?} in the next sandbox:\n{out}");
    }
    let next = ready_ahead(&s, "sbx_", &[&spare]).await;
    let data = s.dir.join("data");
    // Stopped, its directory kept until the end of the test.
    s.running.take().unwrap().shutdown().await;
    assert!(
        !data.join("sandboxes").join(&next).exists(),
        "a stopped server left its spare"
    );
}

#[tokio::test]
async fn a_terminal_over_a_websocket_types_resizes_and_exits() {
    use futures_util::{SinkExt, StreamExt};
    use tokio_tungstenite::tungstenite::Message;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let Some(s) = TestServer::start(Db::Sqlite).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = new_sandbox(&s, &t, json!({})).await;
    let url = s
        .url(&format!("/v1/sandboxes/{id}/pty?rows=30&cols=100"))
        .replacen("http://", "ws://", 1);
    let mut req = url.into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {t}").parse().unwrap());
    let (mut ws, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    let mut screen = String::new();
    // Reads until `want` shows (or the terminal says how it ended).
    async fn until(
        ws: &mut (impl StreamExt<Item = Result<Message, tokio_tungstenite::tungstenite::Error>> + Unpin),
        screen: &mut String,
        want: &str,
    ) -> Option<Value> {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !screen.contains(want) {
            let left = deadline.saturating_duration_since(Instant::now());
            match tokio::time::timeout(left, ws.next()).await {
                Ok(Some(Ok(Message::Binary(b)))) => screen.push_str(&String::from_utf8_lossy(&b)),
                Ok(Some(Ok(Message::Text(t)))) => return serde_json::from_str(&t).ok(),
                Ok(Some(Ok(_))) => {}
                other => panic!("{want:?} never came: {other:?}\n{screen}"),
            }
        }
        None
    }
    ws.send(Message::binary(b"stty size; echo mark-$((6*7))\n".to_vec()))
        .await
        .unwrap();
    until(&mut ws, &mut screen, "mark-42").await;
    assert!(screen.contains("30 100"), "{screen}");
    ws.send(Message::text(r#"{"resize": {"rows": 40, "cols": 120}}"#))
        .await
        .unwrap();
    ws.send(Message::binary(b"stty size\n".to_vec()))
        .await
        .unwrap();
    until(&mut ws, &mut screen, "40 120").await;
    // It is a process like any other.
    let (_, list) = s.get(&t, &format!("/v1/sandboxes/{id}/commands")).await;
    assert!(
        list["processes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|p| p["cmd"] == "(terminal)" && p["state"] == "running"),
        "{list}"
    );
    ws.send(Message::binary(b"exit 7\n".to_vec()))
        .await
        .unwrap();
    let end = until(&mut ws, &mut screen, "\u{0}never").await;
    assert_eq!(end, Some(json!({"exit_code": 7})), "{screen}");

    // Not a WebSocket, or a size out of range: 400.
    let r = s
        .client
        .get(s.url(&format!("/v1/sandboxes/{id}/pty")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
    let r = s
        .client
        .get(s.url(&format!("/v1/sandboxes/{id}/pty?rows=0")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);
}

#[tokio::test]
async fn a_sandboxs_whole_file_system_is_reached_inside_it() {
    let Some(s) = TestServer::start(Db::Sqlite).await else {
        return;
    };
    let t = s.token("acme").await;
    let other = s.token("zeta").await;
    let id = new_sandbox(&s, &t, json!({})).await;
    let fs = |p: &str| format!("/v1/sandboxes/{id}/fs{p}");

    let (status, made) = s
        .post(&t, &fs("/mkdir"), json!({"path": "/tmp/app/src"}))
        .await;
    assert_eq!(status, 201, "{made}");
    assert_eq!(
        (&made["kind"], &made["mode"]),
        (&json!("directory"), &json!("0755"))
    );
    let (status, _) = s
        .post(&t, &fs("/mkdir"), json!({"path": "/tmp/app/src"}))
        .await;
    assert_eq!(status, 409);
    sandbox_command(
        &s,
        &t,
        &id,
        json!({"cmd": "echo 1234 > /tmp/app/src/main.rs"}),
    )
    .await;
    let (status, list) = s.get(&t, &fs("/list?path=/tmp/app&depth=2")).await;
    assert_eq!(status, 200, "{list}");
    let paths: Vec<&str> = list["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["path"].as_str().unwrap())
        .collect();
    assert_eq!(paths, ["/tmp/app/src", "/tmp/app/src/main.rs"]);
    let (_, stat) = s.get(&t, &fs("/stat?path=/tmp/app/src/main.rs")).await;
    assert_eq!(
        (&stat["size"], &stat["kind"]),
        (&json!(5), &json!("file")),
        "{stat}"
    );

    // Into the workspace (another file system): moved, there on the host's
    // side too; a relative path is the workspace's here (no image).
    let (status, moved) = s
        .post(
            &t,
            &fs("/move"),
            json!({"from": "/tmp/app/src/main.rs", "to": "kept/main.rs"}),
        )
        .await;
    assert_eq!(status, 200, "{moved}");
    assert_eq!(moved["path"], "/workspace/kept/main.rs");
    let (_, file) = s
        .get(&t, &format!("/v1/sandboxes/{id}/files/kept/main.rs"))
        .await;
    assert!(file.to_string().contains("1234"), "{file}");

    // A watch sees a change before the command that made it is answered.
    let r = s
        .client
        .get(s.url(&fs("/watch?path=/tmp/app&recursive=true")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    sandbox_command(&s, &t, &id, json!({"cmd": "touch /tmp/app/src/new"})).await;
    let mut body = r.bytes_stream();
    let mut seen = String::new();
    while !seen.contains("src/new") {
        let chunk = tokio::time::timeout(
            Duration::from_secs(10),
            futures_util::StreamExt::next(&mut body),
        )
        .await
        .expect("a change within 10 s")
        .unwrap()
        .unwrap();
        seen.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(seen.contains(r#""kind":"create""#), "{seen}");

    for (status_want, path) in [(204, fs("?path=/tmp/app")), (204, fs("?path=/tmp/app"))] {
        let r = s
            .client
            .delete(s.url(&path))
            .bearer_auth(&t)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), status_want);
    }
    let (status, _) = s.get(&t, &fs("/stat?path=/tmp/app")).await;
    assert_eq!(status, 404);
    // Many files at once, as a tar, both ways (tar runs inside).
    let mut tarball = tar::Builder::new(Vec::new());
    for (name, body) in [("a.txt", "first"), ("deep/b.txt", "second")] {
        let mut h = tar::Header::new_gnu();
        h.set_size(body.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tarball.append_data(&mut h, name, body.as_bytes()).unwrap();
    }
    let tarball = tarball.into_inner().unwrap();
    let (status, _) = s
        .post(&t, &fs("/mkdir"), json!({"path": "/tmp/many"}))
        .await;
    assert_eq!(status, 201);
    let r = s
        .client
        .put(s.url(&fs("/archive?path=/tmp/many")))
        .bearer_auth(&t)
        .body(tarball)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204, "{}", r.text().await.unwrap());
    let out = sandbox_command(
        &s,
        &t,
        &id,
        json!({"cmd": "cat /tmp/many/a.txt /tmp/many/deep/b.txt"}),
    )
    .await;
    assert_eq!(out["stdout"], "firstsecond");
    let r = s
        .client
        .get(s.url(&fs("/archive?path=/tmp/many")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let back = r.bytes().await.unwrap();
    let mut names: Vec<String> = tar::Archive::new(&back[..])
        .entries()
        .unwrap()
        .map(|e| e.unwrap().path().unwrap().display().to_string())
        .collect();
    names.sort();
    assert_eq!(names, ["./", "./a.txt", "./deep/", "./deep/b.txt"]);
    let r = s
        .client
        .put(s.url(&fs("/archive?path=/tmp/many")))
        .bearer_auth(&t)
        .body("not a tar")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 400);

    // Never the supervisor's /proc; never another tenant's sandbox.
    let (status, _) = s.get(&t, &fs("/list?path=/proc/self/fd")).await;
    assert_eq!(status, 422);
    let (status, _) = s.get(&other, &fs("/stat?path=/tmp")).await;
    assert_eq!(status, 404);
}

/// Paused, a sandbox's processes stop where they are and its time stands
/// still; what would wait on it is refused; resumed, they go on.
#[tokio::test]
async fn a_paused_sandbox_resumes_where_it_was() {
    let Some(s) = TestServer::start(Db::Sqlite).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = new_sandbox(&s, &t, json!({"timeout_secs": 3})).await;
    let (status, r) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/.count; mv /tmp/.count /tmp/count; sleep 0.1; done'", "background": true}),
        )
        .await;
    assert_eq!(status, 202, "{r}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (status, v) = s
        .post(&t, &format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "paused");
    let (_, got) = s.get(&t, &format!("/v1/sandboxes/{id}")).await;
    assert_eq!(got["state"], "paused", "{got}");
    // Asked of a paused sandbox: refused at once, not left waiting.
    let (status, v) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "true"}),
        )
        .await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "paused");
    // Its ports too (a look inside it would wait for the resume; the
    // fuzzer found that one waiting past its 60 s).
    let (status, v) = s.get(&t, &format!("/v1/sandboxes/{id}/ports")).await;
    assert_eq!(status, 409, "{v}");
    assert_eq!(v["error"]["code"], "paused");
    // Past its 3 s timeout while paused: its clock stood still.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let (status, v) = s
        .post(&t, &format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["state"], "running");
    let first = sandbox_command(&s, &t, &id, json!({"cmd": "cat /tmp/count"})).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let second = sandbox_command(&s, &t, &id, json!({"cmd": "cat /tmp/count"})).await;
    let n = |v: &Value| v["stdout"].as_str().unwrap().trim().parse::<u64>().unwrap();
    assert!(n(&first) < 30, "it counted while paused: {first}");
    assert!(n(&second) > n(&first), "it did not go on: {first} {second}");
    // Another tenant cannot pause it.
    let other = s.token("zeta").await;
    let (status, _) = s
        .post(&other, &format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(status, 404);
    s.delete(&t, &format!("/v1/sandboxes/{id}")).await;
}

/// A microVM paused to disk outlives its server: stopped, the server keeps
/// it (no QEMU of it runs); started again over the same data, it finds it
/// paused under its id, refuses its commands until it is resumed, and once
/// resumed its process goes on counting, its memory and environment as
/// they were. Stopped while it runs, it ends as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_microvm_outlives_its_server() {
    let dir = tempfile::tempdir().unwrap();
    let (db_url, _pg) = crate::common::database(Db::Sqlite, dir.path()).unwrap();
    let vm = |c: &mut cordon_server::ServerConfig| {
        c.vm.shares = cordon_sandbox::VmShares::VirtioFs;
    };
    let s = TestServer::start_at(dir.path(), &db_url, vm).await;
    let t = s.token("acme").await;
    let id = new_sandbox(
        &s,
        &t,
        json!({"backend": "microvm", "timeout_secs": 600, "env": {"APP_ENV": "kept"}}),
    )
    .await;
    let (status, r) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "sh -c 'echo $$ > /tmp/pid; i=0; while :; do i=$((i+1)); echo $i > /tmp/.count; mv /tmp/.count /tmp/count; sleep 0.1; done'", "background": true}),
        )
        .await;
    assert_eq!(status, 202, "{r}");
    sandbox_command(&s, &t, &id, json!({"cmd": "echo in-memory > /tmp/mark"})).await;
    // A minute left of its ten: what it runs once resumed by the next
    // server, not its whole timeout.
    let (status, v) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/timeout"),
            json!({"timeout_secs": 60}),
        )
        .await;
    assert_eq!(status, 200, "{v}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let (status, v) = s
        .post(&t, &format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    s.stop().await;
    let workspace = format!("sandboxes/{id}/workspace");
    assert!(
        !host_runs(&workspace),
        "a process of the kept sandbox still runs"
    );

    let s = TestServer::start_at(dir.path(), &db_url, vm).await;
    let (status, got) = s.get(&t, &format!("/v1/sandboxes/{id}")).await;
    assert_eq!(
        (status, got["state"].as_str()),
        (200, Some("paused")),
        "{got}"
    );
    let (status, v) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "true"}),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("paused")),
        "{v}"
    );
    let (status, v) = s
        .post(&t, &format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!((status, v["state"].as_str()), (200, Some("running")), "{v}");
    let ends = humantime::parse_rfc3339(v["expires_at"].as_str().unwrap()).unwrap();
    let left = ends
        .duration_since(std::time::SystemTime::now())
        .unwrap_or_default();
    assert!(
        (Duration::from_secs(30)..=Duration::from_secs(60)).contains(&left),
        "it runs {left:?} more, not what it had left: {v}"
    );
    let read = |cmd: &'static str| {
        let (s, t, id) = (&s, &t, &id);
        async move {
            let r = sandbox_command(s, t, id, json!({"cmd": cmd})).await;
            r["stdout"].as_str().unwrap().to_string()
        }
    };
    let first =
        read("cat /tmp/mark; echo $APP_ENV; kill -0 $(cat /tmp/pid) && echo alive; cat /tmp/count")
            .await;
    let mut lines = first.lines();
    assert_eq!(lines.next(), Some("in-memory"), "{first}");
    assert_eq!(lines.next(), Some("kept"), "{first}");
    assert_eq!(lines.next(), Some("alive"), "{first}");
    let at: u64 = lines.next().unwrap().parse().unwrap();
    // About 8 counted before the pause: it went on from there.
    assert!((3..40).contains(&at), "{first}");
    tokio::time::sleep(Duration::from_millis(800)).await;
    let later: u64 = read("cat /tmp/count").await.trim().parse().unwrap();
    assert!(later > at, "it did not go on counting: {at} then {later}");

    // Stopped while it runs, it ends.
    s.stop().await;
    let s = TestServer::start_at(dir.path(), &db_url, vm).await;
    let (_, got) = s.get(&t, &format!("/v1/sandboxes/{id}")).await;
    assert_eq!(got["state"], "ended", "{got}");
    assert!(!dir.path().join("data").join(&workspace).exists());
}

/// Whether a host process's command line holds `needle`.
fn host_runs(needle: &str) -> bool {
    std::fs::read_dir("/proc").unwrap().flatten().any(|e| {
        std::fs::read(e.path().join("cmdline"))
            .is_ok_and(|c| String::from_utf8_lossy(&c).contains(needle))
    })
}

/// `on_timeout: pause`: at its end it pauses instead, and a resume gives
/// it its whole timeout again.
#[tokio::test]
async fn a_sandbox_made_to_pause_at_its_timeout_does() {
    let Some(s) = TestServer::start(Db::Sqlite).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = new_sandbox(&s, &t, json!({"timeout_secs": 2, "on_timeout": "pause"})).await;
    sandbox_command(&s, &t, &id, json!({"cmd": "echo kept > /tmp/mark"})).await;
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, v) = s.get(&t, &format!("/v1/sandboxes/{id}")).await;
        if v["state"] == "paused" {
            break;
        }
        assert_eq!(v["state"], "running", "{v}");
        assert!(std::time::Instant::now() < deadline, "it never paused: {v}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (status, v) = s
        .post(&t, &format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    let out = sandbox_command(&s, &t, &id, json!({"cmd": "cat /tmp/mark"})).await;
    assert_eq!(out["stdout"], "kept\n", "{out}");
    // Bad values say what is wrong.
    let (status, v) = s
        .post(&t, "/v1/sandboxes", json!({"on_timeout": "sleep"}))
        .await;
    assert_eq!(status, 400, "{v}");
    s.delete(&t, &format!("/v1/sandboxes/{id}")).await;
}

/// `auto_resume`: a request to a port by name wakes a paused sandbox, but
/// only one that is let in: nothing unauthorized wakes a private one.
#[tokio::test]
async fn only_a_request_let_in_wakes_a_paused_sandbox() {
    let Some(s) = TestServer::start_with(Db::Sqlite, |c| {
        c.sandbox_domain = Some("sb.test".parse().unwrap());
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    let other = s.token("zeta").await;
    let id = new_sandbox(&s, &t, json!({"auto_resume": true, "network": "loopback"})).await;
    let (status, v) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "mkdir -p /tmp/site && echo awake > /tmp/site/index.html && cd /tmp/site && exec python3 -m http.server 8001 --bind 127.0.0.1", "background": true}),
        )
        .await;
    assert_eq!(status, 202, "{v}");
    let host = format!("8001-{}.sb.test", id.replacen('_', "-", 1));
    let get = |auth: Option<String>| {
        let (s, host) = (&s, host.clone());
        async move {
            let mut r = s.client.get(s.url("/index.html")).header("host", host);
            if let Some(a) = auth {
                r = r.bearer_auth(a);
            }
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while get(Some(t.clone())).await.0 != 200 {
        assert!(
            std::time::Instant::now() < deadline,
            "the server never answered"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let (status, v) = s
        .post(&t, &format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    let state = || async { s.get(&t, &format!("/v1/sandboxes/{id}")).await.1["state"].clone() };
    for (auth, want) in [
        (None, 403),
        (Some(other.clone()), 404),
        (Some("nope".to_string()), 401),
    ] {
        let (status, body) = get(auth.clone()).await;
        assert_eq!(status, want, "{auth:?}: {body}");
        assert_eq!(state().await, "paused", "{auth:?} woke it");
    }
    // The tenant's own token is let in, and wakes it.
    let (status, body) = get(Some(t.clone())).await;
    assert_eq!((status, body.as_str()), (200, "awake\n"));
    assert_eq!(state().await, "running");
    s.delete(&t, &format!("/v1/sandboxes/{id}")).await;
}

/// A server offering a busybox image as `tiny`, with its store in `store`.
async fn with_tiny_image(
    layout: &std::path::Path,
    store: &std::path::Path,
    tune: impl FnOnce(&mut cordon_server::ServerConfig),
) -> TestServer {
    use cordon_testkit::oci::{busybox_layer, layer, write_image};
    write_image(
        layout,
        "v1",
        &[busybox_layer(), layer(&[("etc/motd", "hello\n")])],
        json!({"Env": ["PATH=/bin"]}),
    );
    let source = format!("tiny=oci:{}:v1", layout.display());
    TestServer::start_with(Db::Sqlite, |c| {
        c.images.entries = vec![cordon_server::catalog::CatalogEntry::parse(&source).unwrap()];
        c.image_store = Some(store.to_path_buf());
        tune(c);
    })
    .await
    .expect("SQLite needs nothing installed")
}

fn ids_of(list: &Value) -> Vec<String> {
    list["sandboxes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|b| b["id"].as_str().unwrap().to_string())
        .collect()
}

/// Five forks of a sandbox on an image each start with its files (its
/// root's changes, a deletion among them, and its workspace, owners and
/// links kept), its environment and metadata, none of its processes; each
/// then writes its own, unseen by the parent and the others. The fork's
/// root goes from the store with the last fork.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_forks_start_from_a_sandboxs_files_and_go_their_own_ways() {
    five_forks("native").await;
}

/// The same of a microVM on 9p, which cannot be saved, whose root's
/// changes are on a disk of its own: the disk is copied, frozen
/// meanwhile, and the copy leaves the store once the forks are made.
/// (The workspace's owners are left out: QEMU's file server may not
/// chown.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_forks_of_a_microvm_start_from_its_disk_and_go_their_own_ways() {
    five_forks("microvm").await;
}

/// The same of a microVM on virtio-fs, which forks from its memory: its
/// processes come along too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_forks_of_a_microvm_start_from_its_memory_and_go_their_own_ways() {
    five_forks("memory").await;
}

/// `backend`: native, microvm (on 9p) or memory (a microVM on virtio-fs).
async fn five_forks(backend: &str) {
    let memory = backend == "memory";
    let backend = if memory { "microvm" } else { backend };
    let vm = backend == "microvm";
    let (layout, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let s = with_tiny_image(layout.path(), store.path(), |c| {
        if vm {
            c.vm.shares = if memory {
                cordon_sandbox::VmShares::VirtioFs
            } else {
                cordon_sandbox::VmShares::NineP
            };
        }
    })
    .await;
    let t = s.token("acme").await;
    let parent = new_sandbox(
        &s,
        &t,
        json!({"image": "tiny", "env": {"APP_ENV": "test"}, "metadata": {"user": "42"},
               "disk": "64M", "backend": backend}),
    )
    .await;
    let r = sandbox_command(&s, &t, &parent, json!({"cmd": "uname -r"})).await;
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    assert_eq!(r["stdout"] != host.as_str(), vm, "{r}");
    let owner = if vm {
        ""
    } else {
        "&& chown 1000:1000 /workspace/src/a.txt"
    };
    let r = sandbox_command(
        &s,
        &t,
        &parent,
        json!({"cmd": format!("mkdir -p /workspace/src && echo parent > /workspace/src/a.txt \
                {owner} && ln -s src/a.txt /workspace/link \
                && echo tool > /etc/tool && rm /etc/motd && echo ok")}),
    )
    .await;
    assert_eq!(r["stdout"], "ok\n", "{r}");
    let (status, r) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{parent}/commands"),
            json!({"cmd": "sleep 1000", "background": true}),
        )
        .await;
    assert_eq!(status, 202, "{r}");

    let (status, made) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{parent}/fork?count=5"),
            json!({}),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let forks = ids_of(&made);
    assert_eq!(forks.len(), 5, "{made}");
    for (i, f) in forks.iter().enumerate() {
        let (_, shown) = s.get(&t, &format!("/v1/sandboxes/{f}")).await;
        assert_eq!(shown["state"], "running", "{shown}");
        assert_eq!(shown["metadata"]["user"], "42", "{shown}");
        assert_eq!(shown["request"]["forked_from"], parent.as_str(), "{shown}");
        assert_eq!(shown["request"]["image"], "tiny", "{shown}");
        assert_eq!(shown["request"]["backend"], backend, "{shown}");
        let r = sandbox_command(
            &s,
            &t,
            f,
            json!({"cmd": "cat /workspace/link; stat -c %u /workspace/src/a.txt; cat /etc/tool; \
                    test -e /etc/motd || echo no-motd; echo $APP_ENV; \
                    for p in /proc/[0-9]*; do cat $p/cmdline; echo; done"}),
        )
        .await;
        let out = r["stdout"].as_str().unwrap();
        let owner = if vm { "0" } else { "1000" };
        assert!(
            out.starts_with(&format!("parent\n{owner}\ntool\nno-motd\ntest\n")),
            "{r}"
        );
        // Only a fork from memory carries the parent's processes.
        assert_eq!(out.contains("sleep"), memory, "{out}");
        sandbox_command(
            &s,
            &t,
            f,
            json!({"cmd": format!("echo {i} > /workspace/mine")}),
        )
        .await;
    }
    sandbox_command(
        &s,
        &t,
        &parent,
        json!({"cmd": "echo later > /workspace/later"}),
    )
    .await;
    for (i, f) in forks.iter().enumerate() {
        let r = sandbox_command(
            &s,
            &t,
            f,
            json!({"cmd": "cat /workspace/mine; test -e /workspace/later || echo no-later"}),
        )
        .await;
        assert_eq!(r["stdout"], format!("{i}\nno-later\n"), "{r}");
    }
    let r = sandbox_command(
        &s,
        &t,
        &parent,
        json!({"cmd": "test -e /workspace/mine || echo none; cat /workspace/src/a.txt"}),
    )
    .await;
    assert_eq!(r["stdout"], "none\nparent\n", "{r}");

    // The forks' root is in the store while one lives, and not after.
    let fork_records = || {
        cordon_image::store::Store::open(store.path())
            .unwrap()
            .list()
            .into_iter()
            .filter(|i| i.name.contains("#fork-"))
            .count()
    };
    // A microVM's forks have a disk each, and the copy they were made
    // from is gone.
    assert_eq!(fork_records(), if vm { 0 } else { 1 });
    let copies = std::fs::read_dir(store.path().join("tmp"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".fork-disk-")
        })
        .count();
    assert_eq!(copies, 0, "the forks' disk copy stayed");
    for f in &forks {
        let (status, _) = s.delete(&t, &format!("/v1/sandboxes/{f}")).await;
        assert_eq!(status, 204);
    }
    assert_eq!(fork_records(), 0);
    s.stop().await;
}

/// What forking refuses: a bad count, another tenant's sandbox, a paused
/// or ended one, more forks than the tenant's cap leaves room for (none
/// made then); a sandbox on the host's root forks its workspace.
#[tokio::test]
async fn forks_are_refused_with_the_reason_and_all_or_nothing() {
    let s = TestServer::start_with(Db::Sqlite, |c| c.sessions_per_tenant = 3)
        .await
        .expect("SQLite needs nothing installed");
    let t = s.token("acme").await;
    let other = s.token("zeta").await;
    let id = new_sandbox(&s, &t, json!({})).await;
    sandbox_command(&s, &t, &id, json!({"cmd": "echo kept > kept.txt"})).await;
    let fork = |q: &'static str| format!("/v1/sandboxes/{id}/fork{q}");
    for (q, want) in [
        ("?count=0", 400),
        ("?count=101", 400),
        ("?count=x", 400),
        ("?n=1", 400),
    ] {
        let (status, b) = s.post(&t, &fork(q), json!({})).await;
        assert_eq!(status, want, "{q}: {b}");
    }
    let (status, _) = s.post(&other, &fork(""), json!({})).await;
    assert_eq!(status, 404);
    // Three would pass the cap of three with the parent: none is made.
    let (status, b) = s.post(&t, &fork("?count=3"), json!({})).await;
    assert_eq!(status, 429, "{b}");
    let (_, list) = s.get(&t, "/v1/sandboxes").await;
    assert_eq!(ids_of(&list), std::slice::from_ref(&id));
    let (status, made) = s.post(&t, &fork("?count=2"), json!({})).await;
    assert_eq!(status, 201, "{made}");
    for f in ids_of(&made) {
        let r = sandbox_command(&s, &t, &f, json!({"cmd": "cat kept.txt"})).await;
        assert_eq!(r["stdout"], "kept\n", "{r}");
        s.delete(&t, &format!("/v1/sandboxes/{f}")).await;
    }
    let (status, b) = s
        .post(&t, &format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{b}");
    let (status, b) = s.post(&t, &fork(""), json!({})).await;
    assert_eq!(status, 409, "{b}");
    s.post(&t, &format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    s.delete(&t, &format!("/v1/sandboxes/{id}")).await;
    let (status, b) = s.post(&t, &fork(""), json!({})).await;
    assert_eq!(status, 409, "{b}");
    s.stop().await;
}

/// A client that hangs up while forks are made leaves them all made (and
/// filled) or none: the fork does not stop half-way with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fork_whose_client_hangs_up_is_made_whole() {
    let s = TestServer::start_with(Db::Sqlite, |_| {})
        .await
        .expect("SQLite needs nothing installed");
    let t = s.token("acme").await;
    let parent = new_sandbox(&s, &t, json!({})).await;
    sandbox_command(
        &s,
        &t,
        &parent,
        json!({"cmd": "mkdir d && for i in $(seq 300); do head -c 20000 /dev/urandom > d/f$i; done"}),
    )
    .await;
    let hung_up = s
        .client
        .post(s.url(&format!("/v1/sandboxes/{parent}/fork?count=3")))
        .bearer_auth(&t)
        .timeout(Duration::from_millis(20))
        .send()
        .await;
    assert!(hung_up.is_err(), "the fork answered within 20 ms");
    let deadline = Instant::now() + Duration::from_secs(60);
    let forks = loop {
        let (_, list) = s.get(&t, "/v1/sandboxes").await;
        let forks: Vec<String> = ids_of(&list)
            .into_iter()
            .filter(|id| *id != parent)
            .collect();
        if forks.len() == 3 {
            break forks;
        }
        assert!(Instant::now() < deadline, "{list}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    for f in forks {
        // Listed once recorded; filled before the fork ends: wait for it.
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let r = sandbox_command(&s, &t, &f, json!({"cmd": "ls d | wc -l"})).await;
            if r["stdout"] == "300\n" {
                break;
            }
            assert!(Instant::now() < deadline, "{r}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    s.stop().await;
}

/// The attack: a parent that is root in its image replaces its `tar` with
/// one that sends a crafted archive (a link to `/` and a file through
/// it, `..` and absolute names, a name with a terminal escape); another
/// holds 150 MiB of sparse files under a 32 MiB budget. Nothing lands on the
/// host, no escape byte reaches an answer, a fork that cannot hold the
/// files is refused and none is left, and the parents go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_parent_cannot_reach_the_host_through_its_forks() {
    let (layout, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let s = with_tiny_image(layout.path(), store.path(), |_| {}).await;
    let t = s.token("acme").await;
    let marker = format!("/tmp/cordon-fork-escape-{}", std::process::id());
    let evil = {
        let mut b = tar::Builder::new(Vec::new());
        let mut raw = |name: &[u8], kind: tar::EntryType, link: &[u8], body: &[u8]| {
            let mut h = tar::Header::new_gnu();
            h.as_old_mut().name[..name.len()].copy_from_slice(name);
            h.as_old_mut().linkname[..link.len()].copy_from_slice(link);
            h.set_entry_type(kind);
            h.set_mode(0o644);
            h.set_size(body.len() as u64);
            h.set_cksum();
            b.append(&h, body).unwrap();
        };
        let inner = marker.trim_start_matches('/');
        raw(b"evil", tar::EntryType::Symlink, b"/", b"");
        raw(
            format!("evil/{inner}-link").as_bytes(),
            tar::EntryType::Regular,
            b"",
            b"x",
        );
        raw(
            format!("../../../../../../..{marker}-dots").as_bytes(),
            tar::EntryType::Regular,
            b"",
            b"x",
        );
        raw(
            format!("{marker}-abs").as_bytes(),
            tar::EntryType::Regular,
            b"",
            b"x",
        );
        raw(b"\x1b]0;pwned\x07name/", tar::EntryType::Regular, b"", b"x");
        b.into_inner().unwrap()
    };
    let parent = new_sandbox(&s, &t, json!({"image": "tiny"})).await;
    let put = s
        .client
        .put(s.url(&format!("/v1/sandboxes/{parent}/files/evil.tar")))
        .bearer_auth(&t)
        .body(evil)
        .send()
        .await
        .unwrap();
    assert_eq!(put.status(), 201);
    let r = sandbox_command(
        &s,
        &t,
        &parent,
        json!({"cmd": "rm /bin/tar && printf '#!/bin/sh\\ncase \"$*\" in *-cf*) cat /workspace/evil.tar;; *) exec /bin/busybox tar \"$@\";; esac\\n' > /bin/tar && chmod +x /bin/tar && echo ok"}),
    )
    .await;
    assert_eq!(r["stdout"], "ok\n", "{r}");
    let (status, b) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{parent}/fork?count=2"),
            json!({}),
        )
        .await;
    assert!(status == 201 || status == 400, "{status}: {b}");
    assert!(!b.to_string().contains('\u{1b}'), "{b}");
    for suffix in ["-link", "-dots", "-abs"] {
        let host = format!("{marker}{suffix}");
        assert!(
            !std::path::Path::new(&host).exists(),
            "{host} is on the host"
        );
    }

    let bomb = new_sandbox(&s, &t, json!({"image": "tiny", "disk": "32M"})).await;
    let r = sandbox_command(
        &s,
        &t,
        &bomb,
        json!({"cmd": "for i in 1 2 3 4 5; do dd if=/dev/zero of=/workspace/sparse$i bs=1M seek=30 count=0 2>/dev/null || exit 1; done; echo ok"}),
    )
    .await;
    assert_eq!(r["stdout"], "ok\n", "{r}");
    let (status, b) = s
        .post(&t, &format!("/v1/sandboxes/{bomb}/fork"), json!({}))
        .await;
    assert_eq!(status, 400, "{b}");
    assert!(
        b["error"]["message"]
            .as_str()
            .unwrap()
            .contains("disk budget"),
        "{b}"
    );
    let (_, list) = s.get(&t, "/v1/sandboxes").await;
    let mut live = ids_of(&list);
    live.retain(|id| *id != parent);
    assert_eq!(live, std::slice::from_ref(&bomb), "a fork was left behind");
    for id in [&parent, &bomb] {
        let r = sandbox_command(&s, &t, id, json!({"cmd": "echo alive"})).await;
        assert_eq!(r["stdout"], "alive\n", "{r}");
    }
    s.stop().await;
}
