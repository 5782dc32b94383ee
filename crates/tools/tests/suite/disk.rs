//! What the model is told when its sandbox outgrows the disk budget: the
//! tool that wrote says what happened and what to do, and every later tool
//! call says the same instead of running (the host-side file tools too).
//!
//! Needs the `cordon-supervisor` binary, as tests/tools.rs does.

use crate::common;

use std::path::Path;

use cordon_sandbox::{Sandbox, SandboxConfig};
use cordon_tools::{ToolContext, ToolOutput, Toolbox};
use serde_json::json;

use common::supervisor;

async fn budgeted(dir: &Path) -> (ToolContext, Toolbox) {
    let mut config = SandboxConfig::new(dir);
    config.supervisor = Some(supervisor());
    config.disk = Some(16 << 20);
    let sandbox = Sandbox::create(config).await.expect("create sandbox");
    (ToolContext::new(sandbox, dir), Toolbox::standard())
}

#[track_caller]
fn says_disk_stopped(out: &ToolOutput) {
    assert!(out.is_error, "{}", out.text);
    for needle in [
        "past its disk budget of 16 MiB",
        "no command can run in this session",
        "larger disk budget",
    ] {
        assert!(
            out.text.contains(needle),
            "{needle:?} missing:\n{}",
            out.text
        );
    }
    assert_eq!(out.structured.as_ref().unwrap()["disk_exceeded"], true);
}

#[tokio::test]
async fn bash_says_the_budget_stopped_the_sandbox_and_later_calls_do_too() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, tools) = budgeted(dir.path()).await;
    let ok = tools
        .call(
            &ctx,
            "bash",
            json!({"command": "head -c 1048576 /dev/zero > small && echo fine"}),
        )
        .await;
    assert!(!ok.is_error && ok.text.contains("fine"), "{}", ok.text);
    // Many files, none past the per-file limit, written faster than a look.
    let out = tools
        .call(
            &ctx,
            "bash",
            json!({"command": "for i in $(seq 64); do head -c 1048576 /dev/zero > f$i; done; echo wrote"}),
        )
        .await;
    says_disk_stopped(&out);
    let again = tools
        .call(&ctx, "bash", json!({"command": "rm -f f*"}))
        .await;
    says_disk_stopped(&again);
    let write = tools
        .call(
            &ctx,
            "write_file",
            json!({"path": "more.txt", "content": "x".repeat(1000)}),
        )
        .await;
    says_disk_stopped(&write);
    assert!(!dir.path().join("more.txt").exists());
}

#[tokio::test]
async fn run_code_says_so_too() {
    let dir = tempfile::tempdir().unwrap();
    let (ctx, tools) = budgeted(dir.path()).await;
    let out = tools
        .call(
            &ctx,
            "run_code",
            json!({"language": "python", "code": "for i in range(64):\n    open(f'/workspace/p{i}', 'wb').write(b'z' * (1 << 20))\nprint('wrote')"}),
        )
        .await;
    says_disk_stopped(&out);
}
