//! `DELETE /v1/jobs/{id}`: a queued or running job is cancelled first; the
//! job, its events and its files go; nothing outside them is touched, and
//! another tenant's job is as absent as a missing one.

use crate::common;

use std::os::unix::fs::PermissionsExt;

use common::*;
use serde_json::json;

async fn delete(s: &TestServer, token: &str, path: &str) -> u16 {
    s.client
        .delete(s.url(path))
        .bearer_auth(token)
        .send()
        .await
        .unwrap()
        .status()
        .as_u16()
}

async fn a_job_is_deleted_with_its_files_and_nothing_else(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let other = s.token("other").await;

    // Finished, with a link out of the workspace and a directory it locked.
    let outside = tempfile::tempdir().unwrap();
    let precious = outside.path().join("precious");
    std::fs::write(&precious, "keep me").unwrap();
    let mode_before = std::fs::metadata(outside.path())
        .unwrap()
        .permissions()
        .mode()
        & 0o777;
    let command = format!(
        "ln -s {} /workspace/out && ln -s {} /workspace/dir && mkdir -p /workspace/locked/in && \
         echo x > /workspace/locked/in/f && chmod 000 /workspace/locked",
        precious.display(),
        outside.path().display()
    );
    let id = s
        .submit(&t, json!({"kind": "shell", "command": command}))
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let dir = s.dir.join("data/jobs").join(&id);
    assert!(dir.join("workspace/out").is_symlink());

    assert_eq!(delete(&s, &other, &format!("/v1/jobs/{id}")).await, 404);
    assert!(dir.exists(), "another tenant's delete touched it");
    assert_eq!(delete(&s, &t, &format!("/v1/jobs/{id}")).await, 204);
    assert_eq!(s.get(&t, &format!("/v1/jobs/{id}")).await.0, 404);
    assert_eq!(s.get(&t, &format!("/v1/jobs/{id}/files")).await.0, 404);
    assert!(!dir.exists(), "its files stayed");
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep me");
    // The link to a directory was removed, not followed and emptied.
    assert!(outside.path().join("precious").exists());
    assert_eq!(
        std::fs::metadata(outside.path())
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        mode_before
    );
    let (_, list) = s.get(&t, "/v1/jobs").await;
    assert!(
        list["jobs"]
            .as_array()
            .unwrap()
            .iter()
            .all(|j| j["id"] != id.as_str()),
        "{list}"
    );
    assert_eq!(delete(&s, &t, &format!("/v1/jobs/{id}")).await, 404);

    // Running: cancelled, then deleted; its sandbox's processes end.
    let id = s
        .submit(&t, json!({"kind": "shell", "command": "sleep 60"}))
        .await;
    s.wait_running(&t, &id).await;
    assert_eq!(delete(&s, &t, &format!("/v1/jobs/{id}")).await, 204);
    assert_eq!(s.get(&t, &format!("/v1/jobs/{id}")).await.0, 404);
    assert!(!s.dir.join("data/jobs").join(&id).exists());

    // Implausible ids are simply absent.
    assert_eq!(delete(&s, &t, "/v1/jobs/..%2F..").await, 404);
    s.stop().await;
}

on_both!(a_job_is_deleted_with_its_files_and_nothing_else);
