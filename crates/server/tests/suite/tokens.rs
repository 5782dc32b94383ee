//! `/v1/tokens`: an operator's token lists, makes and revokes every
//! tenant's tokens; a tenant's token, no token and a revoked token are
//! refused; a token is shown once and never stored or listed; and the
//! operator still sees no other tenant's jobs.

use crate::common;

use common::*;
use cordon_server::store::Role;
use serde_json::{Value, json};

fn ids(list: &Value) -> Vec<(String, String, String)> {
    list["tokens"]
        .as_array()
        .expect("a list of tokens")
        .iter()
        .map(|t| {
            (
                t["id"].as_str().unwrap().to_string(),
                t["tenant"].as_str().unwrap().to_string(),
                t["role"].as_str().unwrap().to_string(),
            )
        })
        .collect()
}

async fn only_an_operator_manages_tokens(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let op = s.token_as("ops", Role::Operator).await;
    let tenant = s.token("team-a").await;

    // A tenant's token, no token and a made-up one are refused, on every
    // route and method.
    for (method, path) in [
        (reqwest::Method::GET, "/v1/tokens"),
        (reqwest::Method::POST, "/v1/tokens"),
        (reqwest::Method::DELETE, "/v1/tokens/0123456789ab"),
    ] {
        let r = s
            .client
            .request(method.clone(), s.url(path))
            .bearer_auth(&tenant)
            .json(&json!({"tenant": "evil", "role": "operator"}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{method} {path} with a tenant's token");
        let body: Value = r.json().await.unwrap();
        assert!(
            body["error"]["message"]
                .as_str()
                .unwrap()
                .contains("--operator"),
            "{body}"
        );
        let r = s
            .client
            .request(method.clone(), s.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{method} {path} without a token");
        let r = s
            .client
            .request(method.clone(), s.url(path))
            .bearer_auth("cdn_0000")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 401, "{method} {path} with an unknown token");
    }
    // The tenant's attempt made nothing.
    let (status, list) = s.get(&op, "/v1/tokens").await;
    assert_eq!(status, 200, "{list}");
    let listed = ids(&list);
    assert_eq!(listed.len(), 2, "{list}");
    assert!(listed.iter().all(|(_, t, _)| t != "evil"), "{list}");
    assert!(listed.iter().any(|(_, t, r)| t == "ops" && r == "operator"));
    assert!(
        listed
            .iter()
            .any(|(_, t, r)| t == "team-a" && r == "tenant")
    );
    // No list shows a token itself.
    for token in [&op, &tenant] {
        assert!(!list.to_string().contains(token.as_str()), "{list}");
    }
}

async fn an_operator_makes_and_revokes_a_tenants_token(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let op = s.token_as("ops", Role::Operator).await;

    let (status, made) = s.post(&op, "/v1/tokens", json!({"tenant": "team-b"})).await;
    assert_eq!(status, 201, "{made}");
    let token = made["token"].as_str().unwrap().to_string();
    let id = made["id"].as_str().unwrap().to_string();
    assert!(token.starts_with("cdn_") && token.len() > 40, "{made}");
    assert_eq!(made["tenant"], "team-b");
    assert_eq!(made["role"], "tenant");
    assert!(made["created_at"].is_string(), "{made}");

    // The new token is team-b's: it runs a job, the operator cannot see it.
    let job = s
        .submit(&token, json!({"kind": "shell", "command": "echo hi"}))
        .await;
    assert_eq!(s.wait(&token, &job).await["stdout"], "hi\n");
    assert_eq!(s.get(&op, &format!("/v1/jobs/{job}")).await.0, 404);
    let (_, mine) = s.get(&op, "/v1/jobs").await;
    assert_eq!(mine["jobs"].as_array().unwrap().len(), 0, "{mine}");
    // ... nor manage tokens.
    assert_eq!(s.get(&token, "/v1/tokens").await.0, 403);

    // Filtered by tenant.
    let (status, list) = s.get(&op, "/v1/tokens?tenant=team-b").await;
    assert_eq!(status, 200);
    assert_eq!(ids(&list), [(id.clone(), "team-b".into(), "tenant".into())]);
    // The database keeps its hash, never the token.
    if let Ok(db) = std::fs::read(s.dir.join("server.db")) {
        assert!(!db.windows(token.len()).any(|w| w == token.as_bytes()));
    }

    // Revoked by its id's first 8 digits: refused from the next request.
    let (status, gone) = s.delete(&op, &format!("/v1/tokens/{}", &id[..8])).await;
    assert_eq!(status, 200, "{gone}");
    assert_eq!(gone["id"], id.as_str());
    assert_eq!(gone["tenant"], "team-b");
    assert_eq!(s.get(&token, "/v1/jobs").await.0, 401);
    assert_eq!(s.delete(&op, &format!("/v1/tokens/{id}")).await.0, 404);

    // An operator may make another operator, and that one works as such.
    let (status, made) = s
        .post(
            &op,
            "/v1/tokens",
            json!({"tenant": "ops2", "role": "operator"}),
        )
        .await;
    assert_eq!(status, 201, "{made}");
    let op2 = made["token"].as_str().unwrap();
    let (status, list) = s.get(op2, "/v1/tokens").await;
    assert_eq!(status, 200);
    assert_eq!(ids(&list).len(), 2, "{list}");
}

async fn bad_token_requests_say_what_is_wrong(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let op = s.token_as("ops", Role::Operator).await;
    for (body, field) in [
        (json!({"tenant": "no spaces"}), "tenant"),
        (json!({"tenant": ""}), "tenant"),
        (json!({"tenant": "x".repeat(65)}), "tenant"),
        (json!({"tenant": "a", "role": "root"}), "role"),
        (json!({"tenant": "a", "admin": true}), "admin"),
        (json!({}), "tenant"),
        (json!(["tenant"]), ""),
    ] {
        let (status, answer) = s.post(&op, "/v1/tokens", body.clone()).await;
        assert_eq!(status, 400, "{body}: {answer}");
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(field), "{body}: {message}");
    }
    for bad in ["short", "zzzzzzzzzzzz", "0123456g", &"a".repeat(65)] {
        let (status, answer) = s.delete(&op, &format!("/v1/tokens/{bad}")).await;
        assert_eq!(status, 400, "{bad}: {answer}");
    }
    let (status, answer) = s.get(&op, "/v1/tokens?tenant=a%20b").await;
    assert_eq!(status, 400, "{answer}");
    let (status, answer) = s.get(&op, "/v1/tokens?owner=a").await;
    assert_eq!(status, 400, "{answer}");
    // Nothing was made by any of it.
    assert_eq!(ids(&s.get(&op, "/v1/tokens").await.1).len(), 1);
}

on_both!(
    only_an_operator_manages_tokens,
    an_operator_makes_and_revokes_a_tenants_token,
    bad_token_requests_say_what_is_wrong,
);
