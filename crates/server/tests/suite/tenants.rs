//! `DELETE /v1/tenants/{tenant}`: an operator forgets a tenant. Its
//! tokens, git logins, jobs (a running one cancelled), sessions (one in
//! the middle of a turn) and MCP sessions go with their files; a tenant whose name merely
//! starts the same keeps all of its own. Only an operator may, and not
//! for the tenant of its own token.

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use common::mcp::{list, post, session as mcp_session};
use common::*;
use cordon_server::store::Role;
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::json;

async fn login(s: &TestServer, token: &str) {
    let (code, body) = s
        .put(
            token,
            "/v1/git-credentials/git.example.org",
            json!({"token": "ghp_0123456789abcdefghij"}),
        )
        .await;
    assert_eq!(code, 200, "{body}");
}

/// An MCP session of `token`'s whose workspace has a file named `mark`;
/// the session's id and its workspace.
async fn mcp_with_workspace(s: &TestServer, token: &str, mark: &str) -> (String, PathBuf) {
    let id = mcp_session(s, token).await;
    let call = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
        "params": {"name": "bash", "arguments": {"command": format!("touch {mark}")}}});
    let (code, body) = post(s, token, Some(&id), call).await;
    assert_eq!(code, 200, "{body}");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let found = std::fs::read_dir(s.dir.join("data/mcp"))
            .into_iter()
            .flatten()
            .flatten()
            .map(|d| d.path())
            .find(|p| p.join(mark).exists());
        if let Some(ws) = found {
            return (id, ws);
        }
        assert!(Instant::now() < deadline, "the MCP call never ran");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn forgetting_a_tenant_removes_all_of_it_and_nothing_else(db: Db) {
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Sleeping.").with_tool_call(
                "s1",
                "bash",
                json!({"command": "sleep 600"}),
            ))
            .turn(Turn::text("Hello, neighbour.")),
    );
    let Some(s) = TestServer::start_with(db, with_model(model.url())).await else {
        return;
    };
    let shared = s.running.as_ref().unwrap().shared.clone();
    let op = s.token_as("ops", Role::Operator).await;
    let acme = s.token("acme").await;
    let acme_too = s.token("acme").await;
    // A name that starts like acme's: nothing of it may go.
    let near = s.token("acme.2").await;
    let data = s.dir.join("data");

    // acme: a login, a finished job, a running job, and a session whose
    // turn is running a long command.
    login(&s, &acme).await;
    let finished = s.submit(&acme, shell("echo mine > /workspace/f")).await;
    assert_eq!(s.wait(&acme, &finished).await["state"], "succeeded");
    let running = s
        .submit(
            &acme,
            json!({"kind": "shell", "timeout_secs": 900,
                "command": "while [ ! -f /workspace/release ]; do sleep 0.1; done"}),
        )
        .await;
    s.wait_running(&acme, &running).await;
    let busy = s.new_session(&acme).await;
    let turn = {
        let (client, url, token) = (
            s.client.clone(),
            s.url(&format!("/v1/sessions/{busy}/messages")),
            acme.clone(),
        );
        tokio::spawn(async move {
            let r = client
                .post(url)
                .bearer_auth(token)
                .json(&json!({"text": "sleep a while"}))
                .send()
                .await
                .unwrap();
            r.text().await.unwrap()
        })
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while model.requests().is_empty() {
        assert!(Instant::now() < deadline, "the session's turn never began");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (acme_mcp, acme_mcp_ws) = mcp_with_workspace(&s, &acme, "acme-was-here").await;
    // acme.2: a login, a finished job, a session with a turn, an MCP session.
    login(&s, &near).await;
    let (near_mcp, near_mcp_ws) = mcp_with_workspace(&s, &near, "near-was-here").await;
    let near_job = s.submit(&near, shell("echo theirs > /workspace/f")).await;
    assert_eq!(s.wait(&near, &near_job).await["state"], "succeeded");
    let near_session = s.new_session(&near).await;
    s.say(&near, &near_session, "hello").await;
    for dir in [
        data.join("jobs").join(&finished),
        data.join("jobs").join(&running),
        data.join("sessions").join(&busy),
    ] {
        assert!(
            dir.exists(),
            "{} is not where the test looks",
            dir.display()
        );
    }

    // Not for a tenant's token, not a name that is none, not one's own.
    let (code, body) = s.delete(&acme, "/v1/tenants/acme").await;
    assert_eq!(code, 403, "{body}");
    let (code, body) = s.delete(&near, "/v1/tenants/acme").await;
    assert_eq!(code, 403, "{body}");
    let (code, body) = s.delete(&op, "/v1/tenants/acme%2F..").await;
    assert_eq!(code, 400, "{body}");
    let (code, body) = s.delete(&op, "/v1/tenants/ops").await;
    assert_eq!(
        (code, body["error"]["code"].as_str()),
        (409, Some("own_tenant")),
        "{body}"
    );
    assert_eq!(
        s.get(&acme, "/v1/jobs").await.0,
        200,
        "a refused forget took something"
    );

    let (code, body) = s.delete(&op, "/v1/tenants/acme").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body,
        json!({"tenant": "acme", "tokens": 2, "git_logins": 1, "jobs": 2, "sessions": 1,
            "mcp_sessions": 1, "remaining": []})
    );
    // Its tokens are refused; its turn ended; nothing of it is on disk or
    // in the database; nothing of it runs.
    for t in [&acme, &acme_too] {
        assert_eq!(s.get(t, "/v1/jobs").await.0, 401);
    }
    let streamed = tokio::time::timeout(Duration::from_secs(30), turn)
        .await
        .expect("the session's turn went on after its tenant was forgotten")
        .unwrap();
    assert!(streamed.contains("cancelled"), "{streamed}");
    for dir in [
        data.join("jobs").join(&finished),
        data.join("jobs").join(&running),
        data.join("sessions").join(&busy),
    ] {
        assert!(!dir.exists(), "{} stayed", dir.display());
    }
    // The MCP session ended: its sandbox went, and its workspace with it.
    let deadline = Instant::now() + Duration::from_secs(10);
    while acme_mcp_ws.exists() {
        assert!(
            Instant::now() < deadline,
            "MCP session {acme_mcp}'s workspace stayed"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(shared.store.job_ids("acme").await.unwrap().is_empty());
    assert!(
        shared
            .store
            .git_credentials("acme")
            .await
            .unwrap()
            .is_empty()
    );
    assert!(shared.store.sessions("acme", 10).await.unwrap().is_empty());
    assert!(shared.store.tokens(Some("acme")).await.unwrap().is_empty());
    assert!(
        shared.running.lock().unwrap().is_empty(),
        "a job still runs"
    );

    // acme.2 has everything it had.
    let (code, job) = s.get(&near, &format!("/v1/jobs/{near_job}")).await;
    assert_eq!(
        (code, job["state"].as_str()),
        (200, Some("succeeded")),
        "{job}"
    );
    let (code, file) = s.get(&near, &format!("/v1/jobs/{near_job}/files/f")).await;
    assert_eq!(code, 200, "{file}");
    let (_, logins) = s.get(&near, "/v1/git-credentials").await;
    assert_eq!(
        logins["credentials"].as_array().map(Vec::len),
        Some(1),
        "{logins}"
    );
    let (code, shown) = s.get(&near, &format!("/v1/sessions/{near_session}")).await;
    assert_eq!(code, 200, "{shown}");
    assert!(data.join("sessions").join(&near_session).exists());
    assert!(near_mcp_ws.join("near-was-here").exists());
    let (code, body) = post(&s, &near, Some(&near_mcp), list()).await;
    assert_eq!(code, 200, "{body}");

    // Forgetting again finds nothing left.
    let (code, body) = s.delete(&op, "/v1/tenants/acme").await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(
        body,
        json!({"tenant": "acme", "tokens": 0, "git_logins": 0, "jobs": 0, "sessions": 0,
            "mcp_sessions": 0, "remaining": []})
    );
    s.stop().await;
}

on_both!(forgetting_a_tenant_removes_all_of_it_and_nothing_else);
