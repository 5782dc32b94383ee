//! The jobs list: each job with a one-line preview of what it does, and
//! filters by state, kind and creation time.

use crate::common;

use common::*;
use serde_json::json;

async fn the_list_previews_jobs_and_filters_by_time(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let before = humantime::format_rfc3339_millis(std::time::SystemTime::now()).to_string();
    let a = s
        .submit(
            &t,
            json!({"kind": "shell", "command": "echo one\necho two"}),
        )
        .await;
    let b = s
        .submit(
            &t,
            json!({"kind": "python", "code": "print('\u{1b}[31mred')"}),
        )
        .await;
    s.wait(&t, &a).await;
    s.wait(&t, &b).await;

    let (status, list) = s.get(&t, &format!("/v1/jobs?since={before}")).await;
    assert_eq!(status, 200, "{list}");
    let jobs = list["jobs"].as_array().unwrap();
    assert_eq!(jobs.len(), 2, "{list}");
    assert_eq!(jobs[0]["id"], b.as_str());
    assert_eq!(jobs[0]["preview"], "print(' [31mred')");
    assert_eq!(jobs[1]["preview"], "echo one…");

    let (_, list) = s.get(&t, "/v1/jobs?since=2999-01-01T00:00:00Z").await;
    assert_eq!(list["jobs"], json!([]), "{list}");
    let (_, list) = s
        .get(&t, &format!("/v1/jobs?since={before}&kind=python"))
        .await;
    assert_eq!(list["jobs"].as_array().unwrap().len(), 1, "{list}");
    let (status, body) = s.get(&t, "/v1/jobs?since=yesterday").await;
    assert_eq!(status, 400, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("RFC 3339"),
        "{body}"
    );
    s.stop().await;
}

on_both!(the_list_previews_jobs_and_filters_by_time);
