//! Tenants on `cordon serve`: an MCP session is its tenant's at the
//! transport (another tenant holding its `Mcp-Session-Id` can neither
//! cancel its calls, open its event stream, end it nor call in it), and
//! live sessions, API and MCP, are capped per tenant and in all.

use crate::common;

use std::time::{Duration, Instant};

use common::mcp::{ACCEPT, list, mcp, open, post, retry_after_on_429, session};
use common::*;
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::{Value, json};

/// Tenant A's session with a call running in it (`sleep` then an echo),
/// tenant B's token, and the task that collects A's answer.
struct Running {
    s: TestServer,
    a: String,
    b: String,
    id: String,
    call: tokio::task::JoinHandle<(u16, String)>,
}

async fn a_call_running() -> Running {
    let s = TestServer::start(Db::Sqlite).await.unwrap();
    let (a, b) = (s.token("a").await, s.token("b").await);
    let id = session(&s, &a).await;
    let call = json!({"jsonrpc": "2.0", "id": 7, "method": "tools/call",
        "params": {"name": "bash", "arguments": {"command": "touch started; sleep 3; echo done-4711"}}});
    let (client, url, token, sid) = (s.client.clone(), s.url("/mcp"), a.clone(), id.clone());
    let task = tokio::spawn(async move {
        let r = client
            .post(url)
            .bearer_auth(token)
            .header("Accept", ACCEPT)
            .header("MCP-Protocol-Version", "2025-06-18")
            .header("Mcp-Session-Id", sid)
            .json(&call)
            .send()
            .await
            .unwrap();
        let status = r.status().as_u16();
        (status, r.text().await.unwrap())
    });
    // Running once its workspace has the file.
    let deadline = Instant::now() + Duration::from_secs(30);
    let started = || {
        std::fs::read_dir(s.dir.join("data/mcp"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|d| d.path().join("started").exists())
    };
    while !started() {
        assert!(Instant::now() < deadline, "the call never started");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Running {
        s,
        a,
        b,
        id,
        call: task,
    }
}

/// A's call ended with its own output, and A's session goes on.
async fn a_is_unharmed(r: Running) {
    let (status, body) = r.call.await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert!(
        body.contains("done-4711"),
        "A's call did not finish: {body}"
    );
    assert!(!body.contains("cancelled"), "{body}");
    let (status, body) = post(&r.s, &r.a, Some(&r.id), list()).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"bash\""), "A's session is gone: {body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_cannot_cancel_a_running_call() {
    let r = a_call_running().await;
    let cancel = json!({"jsonrpc": "2.0", "method": "notifications/cancelled",
        "params": {"requestId": 7, "reason": "B says so"}});
    let (status, body) = post(&r.s, &r.b, Some(&r.id), cancel).await;
    assert_eq!(status, 404, "B's cancel was accepted: {body}");
    // Nor any other notification, request or response.
    let (status, _) = post(
        &r.s,
        &r.b,
        Some(&r.id),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    )
    .await;
    assert_eq!(status, 404);
    let (status, body) = post(&r.s, &r.b, Some(&r.id), list()).await;
    assert_eq!(status, 404, "{body}");
    assert!(!body.contains("\"bash\""), "{body}");
    let (status, _) = post(
        &r.s,
        &r.b,
        Some(&r.id),
        json!({"jsonrpc": "2.0", "id": 1, "result": {}}),
    )
    .await;
    assert_eq!(status, 404);
    a_is_unharmed(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_cannot_open_the_event_stream() {
    let r = a_call_running().await;
    let (status, _, body) = mcp(&r.s, reqwest::Method::GET, &r.b, Some(&r.id), None).await;
    assert_eq!(status, 404, "B opened A's event stream: {body}");
    a_is_unharmed(r).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_tenant_cannot_end_the_session() {
    let r = a_call_running().await;
    let (status, _, body) = mcp(&r.s, reqwest::Method::DELETE, &r.b, Some(&r.id), None).await;
    assert_eq!(status, 404, "B ended A's session: {body}");
    a_is_unharmed(r).await;
}

fn with_caps(
    per_tenant: usize,
    total: usize,
    idle: Duration,
    model: Option<String>,
) -> impl FnOnce(&mut cordon_server::ServerConfig) {
    move |c| {
        c.sessions_per_tenant = per_tenant;
        c.sessions = total;
        c.session_idle = idle;
        c.agent = model.map(agent_at);
    }
}

/// A message in an API session: its status and body.
async fn say(s: &TestServer, token: &str, id: &str) -> (u16, String) {
    let r = s
        .client
        .post(s.url(&format!("/v1/sessions/{id}/messages")))
        .bearer_auth(token)
        .json(&json!({"text": "hello"}))
        .send()
        .await
        .unwrap();
    retry_after_on_429(&r);
    (r.status().as_u16(), r.text().await.unwrap())
}

/// A 429 whose JSON error names the cap that was reached.
fn refused(status: u16, body: &str, flag: &str) {
    assert_eq!(status, 429, "{body}");
    let v: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    assert_eq!(v["error"]["code"], "too_many_sessions", "{body}");
    let m = v["error"]["message"].as_str().unwrap_or_default();
    assert!(m.contains(flag), "{body}");
    assert!(
        m.contains("DELETE /mcp") && m.contains("DELETE /v1/sessions/{id}") && m.contains("idle"),
        "{body}"
    );
}

/// The finding: one token held 10 `/mcp` sessions, each with a
/// sandbox, on a server meant to run 2 jobs per tenant.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_sessions_are_capped_per_tenant_and_in_all() {
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("one"))
            .turn(Turn::text("two"))
            .turn(Turn::text("three")),
    );
    let s = TestServer::start_with(
        Db::Sqlite,
        with_caps(2, 3, Duration::from_secs(600), Some(model.url())),
    )
    .await
    .unwrap();
    let (a, b) = (s.token("a").await, s.token("b").await);
    // A: an API session made live by a message, and an MCP session.
    let a_api = s.new_session(&a).await;
    let (status, body) = say(&s, &a, &a_api).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("one"), "{body}");
    let a_mcp = session(&s, &a).await;
    // A's third, of either kind, is over the per-tenant cap.
    let (status, _, body) = open(&s, &a).await;
    refused(status, &body, "--sessions-per-tenant");
    let a_api2 = s.new_session(&a).await;
    let (status, body) = say(&s, &a, &a_api2).await;
    refused(status, &body, "--sessions-per-tenant");
    // A live session takes no new slot for its next message.
    let (status, body) = say(&s, &a, &a_api).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("two"), "{body}");
    // B is not held back by A's cap...
    let _b_mcp = session(&s, &b).await;
    // ...but by the server's: three live sessions in all.
    let (status, _, body) = open(&s, &b).await;
    refused(status, &body, "--sessions`");
    // Ending one frees its slot.
    let (status, _, _) = mcp(&s, reqwest::Method::DELETE, &a, Some(&a_mcp), None).await;
    assert_eq!(status, 200, "a session ends as the MCP SDKs expect");
    let (status, body) = say(&s, &a, &a_api2).await;
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("three"), "{body}");
    let (status, _, body) = open(&s, &b).await;
    refused(status, &body, "--sessions`");
    // Deleting an API session frees its slot too; it is another tenant's
    // to nobody else.
    let path = format!("/v1/sessions/{a_api}");
    let del = |token: &str| {
        s.client
            .delete(s.url(&path))
            .bearer_auth(token.to_string())
            .send()
    };
    assert_eq!(del(&b).await.unwrap().status(), 404);
    assert_eq!(del(&a).await.unwrap().status(), 204);
    assert_eq!(del(&a).await.unwrap().status(), 404);
    assert_eq!(s.get(&a, &path).await.0, 404);
    assert!(!s.dir.join("data/sessions").join(&a_api).exists());
    let _b_mcp2 = session(&s, &b).await;
    model.assert_finished();
}

/// A session that idles out, API or MCP, gives its slot back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_session_frees_its_slot() {
    let model = ScriptedServer::start(Scenario::new().turn(Turn::text("one")));
    let s = TestServer::start_with(
        Db::Sqlite,
        with_caps(1, 8, Duration::from_secs(2), Some(model.url())),
    )
    .await
    .unwrap();
    let a = s.token("a").await;
    let api = s.new_session(&a).await;
    let (status, body) = say(&s, &a, &api).await;
    assert_eq!(status, 200, "{body}");
    let (status, _, body) = open(&s, &a).await;
    refused(status, &body, "--sessions-per-tenant");
    let next = |what: &'static str| {
        let s = &s;
        let a = a.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(20);
            loop {
                let (status, id, body) = open(s, &a).await;
                if status == 200 {
                    return id.unwrap();
                }
                refused(status, &body, "--sessions-per-tenant");
                assert!(Instant::now() < deadline, "the idle {what} kept its slot");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    };
    let first = next("API session").await;
    let (status, _, body) = open(&s, &a).await;
    refused(status, &body, "--sessions-per-tenant");
    let second = next("MCP session").await;
    assert_ne!(first, second);
    // The idle one is gone, not merely uncounted.
    let (status, _) = post(&s, &a, Some(&first), list()).await;
    assert_eq!(status, 404);
    model.assert_finished();
}
