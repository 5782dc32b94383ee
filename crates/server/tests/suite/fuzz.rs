//! The API fuzzed from its own OpenAPI document with schemathesis: valid
//! and invalid requests to every operation, and stateful sequences that
//! follow the document's links (create a job, then read, cancel, stream
//! and upload to it). No request may get a 5xx, and every answer must be
//! one the document describes.

use crate::common;

use std::process::Command;

use common::*;

/// The schemathesis CLI: `CORDON_SCHEMATHESIS` (set by scripts/test), or
/// `st` on PATH. `None` when missing outside CI.
fn schemathesis() -> Option<String> {
    let candidates = [
        std::env::var("CORDON_SCHEMATHESIS").ok(),
        Some("st".to_string()),
    ];
    for c in candidates.into_iter().flatten() {
        if Command::new(&c)
            .arg("--version")
            .output()
            .is_ok_and(|o| o.status.success())
        {
            return Some(c);
        }
    }
    if std::env::var_os("CI").is_some() {
        panic!("schemathesis is missing: scripts/test installs it (pip install schemathesis)");
    }
    eprintln!("skipped: schemathesis is not installed (run scripts/test)");
    None
}

/// No 5xx, and every answer as documented: its status, its content type,
/// its headers and its body's schema.
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_headers_conformance,response_schema_conformance";

async fn no_request_gets_a_5xx(db: Db) {
    let Some(st) = schemathesis() else { return };
    let Some(s) = TestServer::start_with(db, |c| c.workers = 2).await else {
        return;
    };
    // The operator's, so the token routes are fuzzed past their 403 too.
    let token = s
        .token_as("fuzz", cordon_server::store::Role::Operator)
        .await;
    let report = tempfile::tempdir().unwrap();
    let base = s.base.clone();
    let out = tokio::task::spawn_blocking(move || {
        Command::new(st)
            .args(["run", &format!("{base}/openapi.json")])
            .args(["--header", &format!("Authorization: Bearer {token}")])
            .args(["--checks", CHECKS])
            .args(["--max-examples", "25", "--request-timeout", "60"])
            // Hypothesis gave up generating a path for one route whose
            // filters reject most strings (seen once in CI): not a finding.
            .args(["--suppress-health-check", "filter_too_much"])
            .current_dir(report.path())
            .env("NO_COLOR", "1")
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    let text = format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "schemathesis found failures:\n{text}");
    assert!(text.contains("passed"), "{text}");
    // Its jobs' workspaces are unmounted once none is being made.
    s.stop().await;
}

on_both!(no_request_gets_a_5xx);
