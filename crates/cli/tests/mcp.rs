//! `cordon mcp` driven by the official Python MCP SDK (the `mcp` package,
//! which scripts/test installs into a venv and names in CORDON_MCP_PYTHON):
//! the tools and their schemas, a persistent shell, files in and out, a
//! path escape refused with `isError`, a timeout, and nothing of the
//! sandbox left once the client disconnects.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::Value;

/// The Python with the MCP SDK; under CI its absence is a failure.
fn python() -> Option<String> {
    if let Ok(p) = std::env::var("CORDON_MCP_PYTHON") {
        return Some(p);
    }
    let ok = Command::new("python3")
        .args(["-c", "import mcp"])
        .output()
        .is_ok_and(|o| o.status.success());
    if ok {
        return Some("python3".into());
    }
    assert!(
        std::env::var("CI").is_err(),
        "the Python MCP SDK is missing: run scripts/test, which installs it"
    );
    eprintln!("skipped: the Python MCP SDK is not installed (run scripts/test)");
    None
}

fn client_script() -> String {
    format!("{}/tests/mcp/client.py", env!("CARGO_MANIFEST_DIR"))
}

/// Host processes whose command line is exactly `sleep MARKER`.
fn sleepers(marker: &str) -> usize {
    let want = format!("sleep\0{marker}\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| std::fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want.as_bytes()))
        .count()
}

fn wait_gone(marker: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while sleepers(marker) > 0 {
        assert!(
            Instant::now() < deadline,
            "the background process outlived the MCP connection"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Checks the observations client.py printed.
pub fn check_scenario(out: &Value, ws: &Path) {
    assert_eq!(out["server"], "cordon");
    assert!(out["instructions"].as_str().unwrap().contains("/workspace"));
    let tools: Vec<&str> = out["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_str().unwrap())
        .collect();
    assert_eq!(
        tools,
        [
            "bash",
            "edit_file",
            "list_dir",
            "read_file",
            "run_code",
            "search_files",
            "write_file"
        ]
    );
    assert_eq!(
        out["read_only"],
        serde_json::json!(["list_dir", "read_file", "search_files"])
    );
    assert_eq!(out["schemas_are_objects"], true);
    let second = out["second_bash"].as_str().unwrap();
    assert!(second.contains("hello from /workspace/sub"), "{second}");
    assert_eq!(out["second_bash_error"], false);
    assert_eq!(out["structured"]["exit_code"], 0, "{}", out["structured"]);
    assert_eq!(out["write_error"], false);
    assert!(out["read"].as_str().unwrap().contains("written over mcp"));
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/a.txt")).unwrap(),
        "written over mcp\n"
    );
    assert_eq!(out["escape_error"], true, "{}", out["escape"]);
    assert_eq!(out["absolute_error"], true);
    assert!(!Path::new("/etc/cordon-mcp-test").exists());
    assert!(
        out["timeout"]
            .as_str()
            .unwrap()
            .starts_with("Timed out after 1s"),
        "{}",
        out["timeout"]
    );
    assert_eq!(out["bad_args_error"], true);
    let unknown = out["unknown_tool"].as_str().unwrap();
    assert!(unknown.contains("no_such_tool"), "{unknown}");
    assert!(out["background"].as_str().unwrap().contains("started"));
}

#[test]
fn the_python_sdk_drives_cordon_mcp_over_stdio() {
    let Some(py) = python() else { return };
    let ws = tempfile::tempdir().unwrap();
    let marker = format!("{}.{}", 900 + std::process::id() % 99, 17);
    let out = Command::new(&py)
        .arg(client_script())
        .args(["stdio", env!("CARGO_BIN_EXE_cordon")])
        .arg(ws.path())
        .arg(&marker)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "client.py failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("client.py prints JSON");
    check_scenario(&v, ws.path());
    assert!(v["background"].as_str().unwrap().contains("started"));
    // The client has disconnected: the sandbox and the process started
    // in the background inside it are gone.
    wait_gone(&marker);
}
