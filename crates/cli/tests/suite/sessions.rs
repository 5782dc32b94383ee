//! `cordon sessions`: the listing survives a reader that goes away, and
//! speaks JSON lines.

use std::process::{Command, Stdio};

use crate::support;

/// A session log as `cordon exec` starts one.
fn fake_session(dir: &std::path::Path, n: usize, workspace: &std::path::Path) {
    let id = format!("{}-{n:05x}", 1_700_000_000 + n);
    let record = serde_json::json!({
        "seq": 0,
        "ts_ms": 1_700_000_000_000u64 + n as u64,
        "type": "session_started",
        "session_id": id,
        "title": format!("task number {n}"),
        "workspace": workspace,
    });
    std::fs::write(dir.join(format!("{id}.jsonl")), format!("{record}\n")).unwrap();
}

fn sessions(home: &std::path::Path, cwd: &std::path::Path) -> Command {
    let mut c = support::cordon_as_user(home, cwd);
    c.arg("sessions");
    c
}

#[test]
fn a_closed_pipe_ends_the_listing_quietly() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let dir = home.path().join("data/cordon/sessions");
    std::fs::create_dir_all(&dir).unwrap();
    for n in 0..50 {
        fake_session(&dir, n, ws.path());
    }
    // `cordon sessions | head -0`, made certain: the reading end is closed
    // before cordon writes a byte.
    for json in [false, true] {
        let (reader, writer) = std::io::pipe().unwrap();
        drop(reader);
        let mut cmd = sessions(home.path(), ws.path());
        if json {
            cmd.arg("--json");
        }
        let out = cmd
            .stdout(Stdio::from(writer))
            .stderr(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(out.status.code(), Some(0), "{err}");
    }
}

#[test]
fn json_lists_one_object_per_session_with_its_workspace() {
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let dir = home.path().join("data/cordon/sessions");
    std::fs::create_dir_all(&dir).unwrap();
    for n in 0..3 {
        fake_session(&dir, n, ws.path());
    }
    let out = sessions(home.path(), ws.path())
        .arg("--json")
        .output()
        .unwrap();
    assert!(out.status.success());
    let rows: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(rows.len(), 3);
    assert_eq!(rows[0]["title"], "task number 2", "newest first");
    assert_eq!(
        std::path::Path::new(rows[0]["workspace"].as_str().unwrap()),
        ws.path()
    );
}

/// A conversation holds prompts, answers and what the tools saw: its log
/// and the directory of logs are readable by their owner only.
#[test]
fn session_logs_are_the_owners_only() {
    use cordon_testkit::{Scenario, ScriptedServer, Turn};
    use std::os::unix::fs::PermissionsExt;
    let home = tempfile::tempdir().unwrap();
    let ws = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("Done.")));
    let out = support::user_cordon(home.path(), ws.path(), &server.url())
        .args(["exec", "hello"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let dir = home.path().join("data/cordon/sessions");
    let mode = |p: &std::path::Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&dir), 0o700);
    let (logs, stores): (Vec<_>, Vec<_>) = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .partition(|p| p.extension().is_some_and(|x| x == "jsonl"));
    assert_eq!(logs.len(), 1);
    assert_eq!(mode(&logs[0]), 0o600);
    // Its checkpoints hold the workspace's files: its owner's alone too.
    assert_eq!(stores, [logs[0].with_extension("checkpoints")]);
    assert_eq!(mode(&stores[0]), 0o700);
}
