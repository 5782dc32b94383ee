//! Conversations with the agent over HTTP, against the scripted model.

use crate::common;

use common::*;
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::json;

async fn a_conversation_streams_turns_runs_tools_and_survives_a_restart(db: Db) {
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Creating it.").with_tool_call(
                "t1",
                "write_file",
                json!({"path": "notes.txt", "content": "remember 4217\n"}),
            ))
            .turn(Turn::text("Saved the number.").expect_tool_results(["t1"]))
            .turn(
                Turn::text("The number was 4217.")
                    .expect_contains("save the number 4217")
                    .expect_contains("Saved the number.")
                    .expect_contains("which number"),
            ),
    );
    let dir = tempfile::tempdir().unwrap();
    let Some((db_url, _pg)) = database(db, dir.path()) else {
        return;
    };
    let s = TestServer::start_at(dir.path(), &db_url, with_model(model.url())).await;
    let t = s.token("acme").await;
    let (status, created) = s.post(&t, "/v1/sessions", json!({})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    // Enough files that the checkpoint taken after the turn is still
    // being recorded when the server stops: the restart must find the
    // session's log free all the same.
    let ws = dir.path().join(format!("data/sessions/{id}/workspace"));
    for i in 0..10_000 {
        std::fs::write(ws.join(format!("f{i}")), format!("{i}\n")).unwrap();
    }
    let events = s.say(&t, &id, "save the number 4217 in notes.txt").await;
    let kinds: Vec<&str> = events.iter().map(|e| e.0.as_str()).collect();
    for k in [
        "turn_started",
        "text_delta",
        "tool_call_started",
        "tool_call_finished",
        "turn_completed",
    ] {
        assert!(kinds.contains(&k), "{k} missing: {kinds:?}");
    }
    // Each event's data is exactly what `cordon exec --json` prints.
    for (kind, data) in &events {
        assert_eq!(data["type"], *kind);
    }
    assert_eq!(
        std::fs::read_to_string(
            dir.path()
                .join(format!("data/sessions/{id}/workspace/notes.txt"))
        )
        .unwrap(),
        "remember 4217\n"
    );
    let (_, list) = s.get(&t, "/v1/sessions").await;
    assert_eq!(list["sessions"][0]["id"], id.as_str());
    assert_eq!(
        list["sessions"][0]["title"],
        "save the number 4217 in notes.txt"
    );

    // A restart: the next message continues with the earlier context.
    s.stop().await;
    let s = TestServer::start_at(dir.path(), &db_url, with_model(model.url())).await;
    let events = s.say(&t, &id, "which number?").await;
    let done = events
        .iter()
        .find(|e| e.0 == "turn_completed")
        .expect("completed");
    assert_eq!(done.1["stop_reason"], "end_turn");
    model.assert_finished();
    let (status, shown) = s.get(&t, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 200);
    assert_eq!(shown["turns"], 2);
    let messages = shown["messages"].as_array().unwrap();
    assert_eq!(messages.len(), 6, "{shown}");
    assert_eq!(messages[0]["role"], "user");

    // Another tenant sees none of it.
    let other = s.token("other").await;
    let (status, _) = s.get(&other, &format!("/v1/sessions/{id}")).await;
    assert_eq!(status, 404);
    let (status, _) = s
        .post(
            &other,
            &format!("/v1/sessions/{id}/messages"),
            json!({"text": "hi"}),
        )
        .await;
    assert_eq!(status, 404);
    let (_, list) = s.get(&other, "/v1/sessions").await;
    assert_eq!(list["sessions"], json!([]));
}

async fn one_turn_at_a_time_cancel_and_compact(db: Db) {
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Sleeping.").with_tool_call(
                "s1",
                "bash",
                json!({"command": "sleep 30"}),
            ))
            .turn(
                Turn::text("Stopped as asked.")
                    .expect_tool_results(["s1"])
                    .expect_contains("cancelled"),
            )
            .turn(
                Turn::text("SUMMARY: a sleep was cancelled.")
                    .expect_contains("about to be compacted"),
            )
            .turn(Turn::text("Fresh start.").expect_contains("SUMMARY: a sleep")),
    );
    let Some(s) = TestServer::start_with(db, with_model(model.url())).await else {
        return;
    };
    let t = s.token("acme").await;
    let (_, created) = s
        .post(&t, "/v1/sessions", json!({"model": "claude-haiku-4-5"}))
        .await;
    let id = created["id"].as_str().unwrap().to_string();
    assert_eq!(created["model"], "claude-haiku-4-5");
    let (status, v) = s
        .post(&t, &format!("/v1/sessions/{id}/cancel"), json!({}))
        .await;
    assert_eq!((status, v["error"]["code"].as_str()), (409, Some("idle")));
    // A turn that runs a long tool; a second message meanwhile is refused.
    let mut first = s
        .client
        .post(s.url(&format!("/v1/sessions/{id}/messages")))
        .bearer_auth(&t)
        .json(&json!({"text": "sleep"}))
        .send()
        .await
        .unwrap();
    let mut text = String::new();
    while !text.contains("event: tool_call_started") {
        let chunk = first.chunk().await.unwrap().expect("the turn goes on");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let (status, v) = s
        .post(
            &t,
            &format!("/v1/sessions/{id}/messages"),
            json!({"text": "again"}),
        )
        .await;
    assert_eq!(
        (status, v["error"]["code"].as_str()),
        (409, Some("busy")),
        "{v}"
    );
    let (status, _) = s
        .post(&t, &format!("/v1/sessions/{id}/cancel"), json!({}))
        .await;
    assert_eq!(status, 200);
    while let Some(chunk) = first.chunk().await.unwrap() {
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert!(text.contains("cancelled"), "{text}");
    let events = s.say(&t, &id, "stop please").await;
    assert!(events.iter().any(|e| e.0 == "turn_completed"));
    let (status, c) = s
        .post(&t, &format!("/v1/sessions/{id}/compact"), json!({}))
        .await;
    assert_eq!(status, 200, "{c}");
    assert!(c["summary"].as_str().unwrap().starts_with("SUMMARY"));
    s.say(&t, &id, "go on").await;
    model.assert_finished();
}

async fn sessions_need_a_model_and_well_formed_messages(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let (status, v) = s.post(&t, "/v1/sessions", json!({})).await;
    assert_eq!(status, 400);
    assert!(
        v["error"]["message"].as_str().unwrap().contains("no model"),
        "{v}"
    );
    let model = ScriptedServer::start(Scenario::new());
    let Some(s) = TestServer::start_with(db, with_model(model.url())).await else {
        return;
    };
    let t = s.token("acme").await;
    let (_, created) = s.post(&t, "/v1/sessions", json!({})).await;
    let id = created["id"].as_str().unwrap();
    for (body, want) in [
        (json!({}), "missing field `text`"),
        (
            json!({"text": 3}),
            "`text`: invalid type: integer `3`, expected a string",
        ),
        (json!({"text": " "}), "`text`: must not be empty"),
        (
            json!({"text": "x", "extra": 1}),
            "unknown field `extra`, expected `text`",
        ),
        (json!([]), "the body must be a JSON object, not an array"),
    ] {
        let (status, v) = s
            .post(&t, &format!("/v1/sessions/{id}/messages"), body.clone())
            .await;
        assert_eq!(status, 400, "{body}");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(want),
            "{body}: {v}"
        );
    }
    let (status, v) = s.post(&t, "/v1/sessions", json!({"model": 5})).await;
    assert_eq!(status, 400, "{v}");
    let (status, _) = s
        .post(
            &t,
            "/v1/sessions/ses_missing/messages",
            json!({"text": "hi"}),
        )
        .await;
    assert_eq!(status, 404);
}

/// `POST /v1/sessions/{id}/rewind`: the workspace's files and the
/// conversation back to the end of a turn; the next message goes on from
/// there.
async fn a_session_rewinds_files_and_conversation(db: Db) {
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Writing.").with_tool_call(
                "t1",
                "write_file",
                json!({"path": "plan.txt", "content": "plan A\n"}),
            ))
            .turn(Turn::text("PLAN-A-SAVED.").expect_tool_results(["t1"]))
            .turn(Turn::text("Rewriting.").with_tool_call(
                "t2",
                "bash",
                json!({"command": "echo 'plan B' > plan.txt && echo x > extra.txt"}),
            ))
            .turn(Turn::text("PLAN-B-SAVED.").expect_tool_results(["t2"]))
            .turn(
                Turn::text("Back on plan A.")
                    .expect_contains("PLAN-A-SAVED.")
                    .expect_lacks("PLAN-B-SAVED.")
                    .expect_lacks("switch to plan B"),
            ),
    );
    let Some(s) = TestServer::start_with(db, with_model(model.url())).await else {
        return;
    };
    let t = s.token("acme").await;
    let (_, created) = s.post(&t, "/v1/sessions", json!({})).await;
    let id = created["id"].as_str().unwrap().to_string();
    s.say(&t, &id, "write plan A").await;
    s.say(&t, &id, "switch to plan B").await;
    let ws = s.dir.join(format!("data/sessions/{id}/workspace"));
    assert_eq!(
        std::fs::read_to_string(ws.join("plan.txt")).unwrap(),
        "plan B\n"
    );

    // Bad requests change nothing.
    for (body, status) in [
        (json!({}), 400),
        (json!({"turn": "one"}), 400),
        (json!({"turn": 1, "extra": true}), 400),
        (json!({"turn": 7}), 400),
        (json!({"turn": 1, "undo": true}), 400),
        (json!({"undo": true}), 400),
    ] {
        let (got, answer) = s
            .post(&t, &format!("/v1/sessions/{id}/rewind"), body.clone())
            .await;
        assert_eq!(got, status, "{body}: {answer}");
    }
    let (got, answer) = s
        .post(&t, &format!("/v1/sessions/{id}/rewind"), json!({"turn": 7}))
        .await;
    assert_eq!(got, 400);
    assert_eq!(answer["error"]["code"], "no_checkpoint", "{answer}");
    let other = s.token("other").await;
    let (got, _) = s
        .post(
            &other,
            &format!("/v1/sessions/{id}/rewind"),
            json!({"turn": 1}),
        )
        .await;
    assert_eq!(got, 404);
    assert_eq!(
        std::fs::read_to_string(ws.join("plan.txt")).unwrap(),
        "plan B\n"
    );

    let (got, r) = s
        .post(&t, &format!("/v1/sessions/{id}/rewind"), json!({"turn": 1}))
        .await;
    assert_eq!(got, 200, "{r}");
    assert_eq!(
        (
            r["turn"].as_u64(),
            r["written"].as_u64(),
            r["removed"].as_u64()
        ),
        (Some(1), Some(1), Some(1)),
        "{r}"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("plan.txt")).unwrap(),
        "plan A\n"
    );
    assert!(!ws.join("extra.txt").exists());
    let (_, shown) = s.get(&t, &format!("/v1/sessions/{id}")).await;
    assert_eq!(shown["turns"], 1, "{shown}");
    assert!(!shown.to_string().contains("PLAN-B-SAVED"), "{shown}");

    // Issue 32: undone, the files and the conversation are back; undone
    // again, the rewind holds once more.
    let rewind_url = format!("/v1/sessions/{id}/rewind");
    let undo = |_: ()| s.post(&t, &rewind_url, json!({"undo": true}));
    let (got, r) = undo(()).await;
    assert_eq!((got, r["turn"].as_u64()), (200, Some(2)), "{r}");
    assert_eq!(
        std::fs::read_to_string(ws.join("plan.txt")).unwrap(),
        "plan B\n"
    );
    let (_, shown) = s.get(&t, &format!("/v1/sessions/{id}")).await;
    assert_eq!(shown["turns"], 2, "{shown}");
    let (got, r) = undo(()).await;
    assert_eq!((got, r["turn"].as_u64()), (200, Some(1)), "{r}");
    assert_eq!(
        std::fs::read_to_string(ws.join("plan.txt")).unwrap(),
        "plan A\n"
    );

    // The conversation goes on from turn 1.
    let events = s.say(&t, &id, "and now?").await;
    assert!(events.iter().any(|e| e.0 == "turn_completed"), "{events:?}");
    model.assert_finished();
    s.stop().await;
}

on_both!(
    a_conversation_streams_turns_runs_tools_and_survives_a_restart,
    a_session_rewinds_files_and_conversation,
    one_turn_at_a_time_cancel_and_compact,
    sessions_need_a_model_and_well_formed_messages,
);

/// The operator's `checkpoints.keep` holds for a tenant's session: with
/// one kept, after two turns only the last is there to rewind to, and an
/// earlier one answers 410 `pruned`, saying so.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_checkpoints_keep_what_the_operator_says() {
    let mut scenario = Scenario::new();
    for n in 1..=2 {
        scenario = scenario
            .turn(Turn::text("Writing.").with_tool_call(
                format!("t{n}"),
                "write_file",
                json!({"path": "plan.txt", "content": format!("plan {n}\n")}),
            ))
            .turn(Turn::text("Saved.").expect_tool_results([format!("t{n}")]));
    }
    let model = ScriptedServer::start(scenario);
    let url = model.url();
    let Some(s) = TestServer::start_with(Db::Sqlite, move |c| {
        let mut agent = common::agent_at(url);
        agent.agent.checkpoints = cordon_agent::checkpoints::Retention::new(1, 1 << 30).unwrap();
        c.agent = Some(agent);
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    let (_, created) = s.post(&t, "/v1/sessions", json!({})).await;
    let id = created["id"].as_str().unwrap().to_string();
    s.say(&t, &id, "plan 1").await;
    s.say(&t, &id, "plan 2").await;
    model.assert_finished();
    for turn in [0, 1] {
        let (got, answer) = s
            .post(
                &t,
                &format!("/v1/sessions/{id}/rewind"),
                json!({"turn": turn}),
            )
            .await;
        assert_eq!(got, 410, "{answer}");
        assert_eq!(answer["error"]["code"], "pruned", "{answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains("newest 1 checkpoint,"), "{message}");
    }
    let (got, answer) = s
        .post(&t, &format!("/v1/sessions/{id}/rewind"), json!({"turn": 2}))
        .await;
    assert_eq!(got, 200, "{answer}");
    s.stop().await;
}

/// A session created with a display: the agent has the computer tool, its
/// screenshot reaches the model as an image, and the desktop can be
/// watched over `/v1/sessions/{id}/vnc`, which wakes an idle session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_with_a_display_gives_the_agent_a_desktop_to_watch() {
    use futures_util::StreamExt;
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;

    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Looking.").with_tool_call(
                "s1",
                "computer",
                json!({"action": "screenshot"}),
            ))
            .turn(
                Turn::text("I see an empty 800x600 desktop.")
                    .expect_tool_results(["s1"])
                    .expect_contains("\"type\":\"image\""),
            ),
    );
    let s = TestServer::start_with(Db::Sqlite, with_model(model.url()))
        .await
        .unwrap();
    let t = s.token("acme").await;

    let (status, body) = s.post(&t, "/v1/sessions", json!({"display": "tiny"})).await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("`display`"), "{body}");
    let (status, plain) = s.post(&t, "/v1/sessions", json!({})).await;
    assert_eq!(status, 201);
    let plain = plain["id"].as_str().unwrap();

    let (status, created) = s
        .post(&t, "/v1/sessions", json!({"display": "800x600"}))
        .await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap().to_string();
    let (_, shown) = s.get(&t, &format!("/v1/sessions/{id}")).await;
    assert_eq!(shown["display"], "800x600");
    assert_eq!(shown["live_desktop"], false, "asleep until used");

    // Watching wakes it.
    let open = |path: String, token: String| async move {
        let mut req = path.into_client_request().unwrap();
        req.headers_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        tokio_tungstenite::connect_async(req).await
    };
    let ws_url = |sid: &str| {
        s.url(&format!("/v1/sessions/{sid}/vnc"))
            .replacen("http", "ws", 1)
    };
    let (mut ws, _) = open(ws_url(&id), t.clone())
        .await
        .expect("the live view opens");
    let first = tokio::time::timeout(std::time::Duration::from_secs(20), ws.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(&first.into_data()[..12], b"RFB 003.008\n");
    let (_, shown) = s.get(&t, &format!("/v1/sessions/{id}")).await;
    assert_eq!(shown["live_desktop"], true);

    // The agent works on the same screen.
    let events = s.say(&t, &id, "what is on the screen?").await;
    let finished = events
        .iter()
        .find(|(k, _)| k == "tool_call_finished")
        .expect("the computer tool ran");
    assert_eq!(finished.1["is_error"], false, "{finished:?}");
    model.assert_finished();

    // No display, no desktop; another tenant sees nothing.
    match open(ws_url(plain), t.clone()).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 409),
        other => panic!("expected 409, got {:?}", other.map(|_| ())),
    }
    let other = s.token("globex").await;
    match open(ws_url(&id), other).await {
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => assert_eq!(r.status(), 404),
        other => panic!("expected 404, got {:?}", other.map(|_| ())),
    }
    s.stop().await;
}

/// A session's volume is mounted while the session lives, and after it
/// idles out only while a request uses it: its files are read through the
/// files API and by its next turn, each mounting it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_s_volume_is_mounted_again_when_used() {
    use std::time::{Duration, Instant};
    if !volumes() {
        return;
    }
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Writing.").with_tool_call(
                "w1",
                "write_file",
                json!({"path": "notes.txt", "content": "kept 9310\n"}),
            ))
            .turn(Turn::text("Written.").expect_tool_results(["w1"]))
            .turn(Turn::text("Reading.").with_tool_call(
                "r1",
                "read_file",
                json!({"path": "notes.txt"}),
            ))
            .turn(Turn::text("It says 9310.").expect_contains("kept 9310")),
    );
    let s = TestServer::start_with(Db::Sqlite, |c| {
        with_model(model.url())(c);
        c.idle_volumes = 0;
        c.session_idle = Duration::from_millis(300);
    })
    .await
    .unwrap();
    let t = s.token("acme").await;
    let id = s.new_session(&t).await;
    s.say(&t, &id, "write the note").await;
    let ws = s.dir.join(format!("data/sessions/{id}/workspace"));
    let mounted = || mounts_beneath(&ws) > 0;
    // Idled out: its sandbox closed, its volume unmounted.
    let deadline = Instant::now() + Duration::from_secs(10);
    while mounted() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!mounted(), "an idle session's volume stayed mounted");
    assert!(!ws.join("notes.txt").exists());
    let r = s
        .client
        .get(s.url(&format!("/v1/sessions/{id}/files/notes.txt")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "kept 9310\n");
    assert!(!mounted(), "a request left the volume mounted");
    let events = s.say(&t, &id, "what does the note say?").await;
    let read = events
        .iter()
        .find(|(k, _)| k == "tool_call_finished")
        .expect("read_file ran");
    assert_eq!(read.1["is_error"], false, "{read:?}");
    model.assert_finished();
    s.stop().await;
}

/// A message's images reach the model as images; one whose bytes are not
/// what it says, or too many, is refused with the reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_s_images_reach_the_model() {
    let png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
    let model = ScriptedServer::start(Scenario::new().turn(Turn::text("One pixel.")));
    let s = TestServer::start_with(Db::Sqlite, with_model(model.url()))
        .await
        .expect("SQLite needs nothing installed");
    let t = s.token("acme").await;
    let id = s.new_session(&t).await;
    let path = format!("/v1/sessions/{id}/messages");
    let image = |media_type: &str, data: &str| json!({"media_type": media_type, "data": data});
    for (images, want) in [
        (
            vec![image("image/jpeg", png)],
            "says it is image/jpeg but its bytes are image/png",
        ),
        (vec![image("image/png", "not base64!")], "not base64"),
        (
            vec![image("image/png", "aGVsbG8=")],
            "bytes are not image/png",
        ),
        (vec![image("image/bmp", png)], "unknown variant `image/bmp`"),
        (vec![image("image/png", png); 9], "at most 8 images"),
    ] {
        let (status, v) = s
            .post(&t, &path, json!({"text": "look", "images": images}))
            .await;
        assert_eq!(status, 400, "{v}");
        let message = v["error"]["message"].as_str().unwrap();
        assert!(message.contains(want), "{want}: {message}");
    }
    assert!(model.requests().is_empty());
    let r = s
        .client
        .post(s.url(&path))
        .bearer_auth(&t)
        .json(&json!({"text": "what is this?", "images": [image("image/png", png)]}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("One pixel."));
    let content = model.requests()[0].body["messages"][0]["content"].clone();
    assert_eq!(content[0]["type"], "image", "{content}");
    assert_eq!(content[0]["source"]["data"], png);
    assert_eq!(content[1]["text"], "what is this?");
    s.stop().await;
}

/// A session paused between turns keeps its processes where they were;
/// the next message resumes them.
#[tokio::test]
async fn a_paused_session_goes_on_at_the_next_message() {
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Counting.").with_tool_call(
                "t1",
                "bash",
                json!({"command": "sh -c 'i=0; while :; do i=$((i+1)); echo $i > count; sleep 0.1; done' >/dev/null 2>&1 &"}),
            ))
            .turn(Turn::text("Started."))
            .turn(Turn::text("Still here.")),
    );
    let Some(s) = TestServer::start_with(Db::Sqlite, with_model(model.url())).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s.new_session(&t).await;
    s.say(&t, &id, "count").await;
    let count = || async {
        let (status, v) = s.get(&t, &format!("/v1/sessions/{id}/files/count")).await;
        assert_eq!(status, 200, "{v}");
        v.as_u64().unwrap_or_else(|| panic!("a count: {v}"))
    };
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    let (status, v) = s
        .post(&t, &format!("/v1/sessions/{id}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["paused"], true);
    // Its files are read while it is paused; nothing counts.
    let at = count().await;
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert_eq!(count().await, at, "it counted while paused");
    // The next message resumes it.
    s.say(&t, &id, "still there?").await;
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    assert!(count().await > at, "it did not go on");
    let other = s.token("zeta").await;
    let (status, _) = s
        .post(&other, &format!("/v1/sessions/{id}/pause"), json!({}))
        .await;
    assert_eq!(status, 404);
    s.stop().await;
}

/// A process forked by the server (a sandbox's supervisor, a pool's
/// next sandbox, `git`) holds a copy of every descriptor it had, a
/// session log's lock among them, until it execs: the next wake waits
/// that moment out instead of calling the session unavailable. The CI
/// met this once under load; here the lock is held for 300 ms on purpose.
/// A child the server forks holds a copy of the log's lock until it
/// execs: a rewind that finds the lock held a moment waits for it, as a
/// waking session does, and is not refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rewind_waits_past_a_log_lock_held_a_moment() {
    let model = ScriptedServer::start(Scenario::new().turn(Turn::text("Here.")));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("server.db").display().to_string();
    let s = TestServer::start_at(dir.path(), &db, with_model(model.url())).await;
    let t = s.token("acme").await;
    let id = s.new_session(&t).await;
    let events = s.say(&t, &id, "are you there?").await;
    assert!(events.iter().any(|e| e.0 == "turn_completed"), "{events:?}");
    // A server started again has the session closed, its log free.
    s.stop().await;
    let s = TestServer::start_at(dir.path(), &db, with_model(model.url())).await;
    let log =
        std::fs::File::open(dir.path().join(format!("data/sessions/{id}/session.jsonl"))).unwrap();
    log.lock().unwrap();
    let held = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(log);
    });
    let (status, body) = s
        .post(&t, &format!("/v1/sessions/{id}/rewind"), json!({"turn": 0}))
        .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["turn"], 0, "{body}");
    held.join().unwrap();
    model.assert_finished();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_session_wakes_past_a_log_lock_held_a_moment() {
    let model = ScriptedServer::start(Scenario::new().turn(Turn::text("Here.")));
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("server.db").display().to_string();
    let s = TestServer::start_at(dir.path(), &db, with_model(model.url())).await;
    let t = s.token("acme").await;
    let id = s.new_session(&t).await;
    let log =
        std::fs::File::open(dir.path().join(format!("data/sessions/{id}/session.jsonl"))).unwrap();
    log.lock().unwrap();
    let held = std::thread::spawn(move || {
        std::thread::sleep(std::time::Duration::from_millis(300));
        drop(log);
    });
    let events = s.say(&t, &id, "are you there?").await;
    assert!(events.iter().any(|e| e.0 == "turn_completed"), "{events:?}");
    held.join().unwrap();
    model.assert_finished();
    s.stop().await;
}
