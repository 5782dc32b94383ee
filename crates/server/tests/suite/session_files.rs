//! An API session's files, like a job's: list, read and write beneath its
//! workspace only, for its own tenant only.

use crate::common;

use common::*;
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::json;

async fn a_sessions_files_are_read_and_written_within_its_workspace(db: Db) {
    let model = ScriptedServer::start(Scenario::new().turn(Turn::text("unused")));
    let Some(s) = TestServer::start_with(db, with_model(model.url())).await else {
        return;
    };
    let t = s.token("acme").await;
    let other = s.token("other").await;
    let (status, ses) = s.post(&t, "/v1/sessions", json!({})).await;
    assert_eq!(status, 201, "{ses}");
    let id = ses["id"].as_str().unwrap();
    let files = format!("/v1/sessions/{id}/files");

    let put = |token: &str, path: &str, body: &'static str| {
        s.client
            .put(s.url(&format!("{files}/{path}")))
            .bearer_auth(token)
            .body(body)
            .send()
    };
    let r = put(&t, "src/app.py", "print('hi')\n").await.unwrap();
    assert_eq!(r.status(), 201);
    let r = put(&t, "src/app.py", "print('hello')\n").await.unwrap();
    assert_eq!(r.status(), 200);
    let r = s
        .client
        .get(s.url(&format!("{files}/src/app.py")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(r.text().await.unwrap(), "print('hello')\n");
    let (status, listing) = s.get(&t, &files).await;
    assert_eq!(status, 200, "{listing}");
    assert_eq!(listing["entries"][0]["name"], "src", "{listing}");
    assert_eq!(listing["entries"][0]["type"], "directory", "{listing}");
    let (_, sub) = s.get(&t, &format!("{files}/src")).await;
    assert_eq!(sub["entries"][0]["name"], "app.py", "{sub}");

    // Typed by name from an allowlist, never sniffed, never a page.
    for (name, body, want) in [
        ("a.png", "not really a png", "image/png"),
        (
            "page.html",
            "<script>alert(1)</script>",
            "text/plain; charset=utf-8",
        ),
        ("blob.bin", "x", "application/octet-stream"),
    ] {
        put(&t, name, body).await.unwrap();
        let r = s
            .client
            .get(s.url(&format!("{files}/{name}")))
            .bearer_auth(&t)
            .send()
            .await
            .unwrap();
        assert_eq!(r.headers()["content-type"], want, "{name}");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff", "{name}");
        let csp = r.headers()["content-security-policy"].to_str().unwrap();
        assert!(
            csp.contains("default-src 'none'") && csp.contains("sandbox"),
            "{csp}"
        );
    }

    // Another tenant's session is absent; paths out of it are refused,
    // and a link the sandbox planted is not followed.
    assert_eq!(s.get(&other, &files).await.0, 404);
    assert_eq!(put(&other, "x", "no").await.unwrap().status(), 404);
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "host secret").unwrap();
    let ws = s.dir.join(format!("data/sessions/{id}/workspace"));
    std::os::unix::fs::symlink(outside.path(), ws.join("out")).unwrap();
    let r = s
        .client
        .get(s.url(&format!("{files}/out/secret")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_ne!(r.status(), 200);
    assert!(!r.text().await.unwrap().contains("host secret"));
    let r = put(&t, "out/planted", "x").await.unwrap();
    assert_ne!(r.status().as_u16() / 100, 2);
    assert!(!outside.path().join("planted").exists());
    let (status, _) = s.get(&t, &format!("{files}/..%2F..%2Fetc%2Fpasswd")).await;
    assert_eq!(status / 100, 4);
    s.stop().await;
}

on_both!(a_sessions_files_are_read_and_written_within_its_workspace);
