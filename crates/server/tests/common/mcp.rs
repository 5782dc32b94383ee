//! `/mcp` from a test: one request at a time, and a session opened.

use std::time::Duration;

use serde_json::{Value, json};

use super::TestServer;

pub const ACCEPT: &str = "application/json, text/event-stream";

/// One request to /mcp: its status, the session id it gave, and its body.
pub async fn mcp(
    s: &TestServer,
    method: reqwest::Method,
    token: &str,
    session: Option<&str>,
    body: Option<Value>,
) -> (u16, Option<String>, String) {
    let mut r = s
        .client
        .request(method, s.url("/mcp"))
        .bearer_auth(token)
        .header("Accept", ACCEPT)
        .header("MCP-Protocol-Version", "2025-06-18");
    if let Some(id) = session {
        r = r.header("Mcp-Session-Id", id);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let resp = r.send().await.unwrap();
    let status = resp.status().as_u16();
    retry_after_on_429(&resp);
    let id = resp
        .headers()
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    // An event stream that stays open is read for a moment only.
    let text = tokio::time::timeout(Duration::from_millis(500), resp.text())
        .await
        .map(Result::unwrap)
        .unwrap_or_default();
    (status, id, text)
}

pub async fn post(
    s: &TestServer,
    token: &str,
    session: Option<&str>,
    body: Value,
) -> (u16, String) {
    let (status, _, text) = mcp(s, reqwest::Method::POST, token, session, Some(body)).await;
    (status, text)
}

/// Opens an MCP session for `token`: (status, session id, body).
pub async fn open(s: &TestServer, token: &str) -> (u16, Option<String>, String) {
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}
    });
    let (status, id, body) = mcp(s, reqwest::Method::POST, token, None, Some(init)).await;
    if let Some(id) = &id {
        let (st, _) = post(
            s,
            token,
            Some(id),
            json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        )
        .await;
        assert_eq!(st, 202);
    }
    (status, id, body)
}

pub async fn session(s: &TestServer, token: &str) -> String {
    let (status, id, body) = open(s, token).await;
    assert_eq!(status, 200, "{body}");
    id.expect("a session id")
}

pub fn list() -> Value {
    json!({"jsonrpc": "2.0", "id": 50, "method": "tools/list"})
}

/// Every 429 tells the client when to try again: whole seconds, no later
/// than the idle timeout and at most a minute.
pub fn retry_after_on_429(r: &reqwest::Response) {
    if r.status() != 429 {
        return;
    }
    let after = r.headers().get("retry-after").map(|v| v.to_str().unwrap());
    let secs: u64 = after
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("a 429 without a Retry-After in seconds: {after:?}"));
    assert!((1..=60).contains(&secs), "Retry-After: {secs}");
}
