//! `cordon mcp --listen` is its user's only: another local user (uid
//! 65534) cannot use root's instance, a request without the instance's
//! token gets 401, and one from a web page (a foreign `Origin`) gets 403.

use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::{Child, Command, Stdio};

use serde_json::{Value, json};

use crate::support;

use support::{NOBODY, Who, available};

/// `cordon mcp --listen` on a free loopback port, over a fresh workspace.
struct Listen {
    child: Child,
    url: String,
    /// The token it printed, if it printed one.
    token: Option<String>,
    ws: tempfile::TempDir,
}

impl Drop for Listen {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn listen(extra: &[&str], env: &[(&str, &str)]) -> Listen {
    let ws = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["mcp", "--listen", "127.0.0.1:0", "--workspace"])
        .arg(ws.path())
        .args(extra)
        .env_remove("CORDON_MCP_TOKEN")
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut token = None;
    let url = loop {
        let line = lines.next().expect("cordon mcp exited").unwrap();
        if let Some((_, t)) = line.split_once("Bearer …`): ") {
            token = Some(t.trim().to_string());
        }
        if let Some(u) = line.strip_prefix("cordon: MCP on ") {
            break u.trim().to_string();
        }
    };
    std::thread::spawn(move || for _ in lines {});
    Listen {
        child,
        url,
        token,
        ws,
    }
}

fn init() -> Value {
    json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}})
}

/// A POST to the instance: status, the session id it gave, the body.
fn post(
    l: &Listen,
    token: Option<&str>,
    origin: Option<&str>,
    body: Value,
) -> (u16, Option<String>, reqwest::header::HeaderMap, String) {
    let mut r = reqwest::blocking::Client::new()
        .post(&l.url)
        .header("Accept", "application/json, text/event-stream")
        .json(&body);
    if let Some(t) = token {
        r = r.bearer_auth(t);
    }
    if let Some(o) = origin {
        r = r.header("Origin", o);
    }
    let resp = r.send().unwrap();
    let status = resp.status().as_u16();
    let headers = resp.headers().clone();
    let id = headers
        .get("mcp-session-id")
        .map(|v| v.to_str().unwrap().to_string());
    (status, id, headers, resp.text().unwrap())
}

/// An HTTP POST as uid 65534 (curl under setpriv): status, session id.
fn post_as_nobody(url: &str, session: Option<&str>, body: &Value) -> (u16, Option<String>) {
    let mut c = Command::new("setpriv");
    c.args([
        &format!("--reuid={NOBODY}"),
        &format!("--regid={NOBODY}"),
        "--clear-groups",
        "/usr/bin/curl",
        "-sS",
        "--max-time",
        "60",
        "-o",
        "/dev/null",
        "-D",
        "-",
        "-w",
        "STATUS=%{http_code}\n",
        "-H",
        "Accept: application/json, text/event-stream",
        "-H",
        "Content-Type: application/json",
        "--data-binary",
        &body.to_string(),
    ]);
    if let Some(id) = session {
        c.args(["-H", &format!("Mcp-Session-Id: {id}")]);
    }
    let out = c.arg(url).env_clear().output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let status = text
        .lines()
        .find_map(|l| l.strip_prefix("STATUS="))
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("curl said: {text}{}", support::text(&out.stderr)));
    let id = text.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case("mcp-session-id")
            .then(|| v.trim().to_string())
    });
    (status, id)
}

/// The finding: any local user could connect to root's instance
/// and write into root's workspace.
#[test]
fn another_local_user_cannot_use_roots_instance() {
    if !available(Who::Root) || !support::is_root() {
        return;
    }
    let l = listen(&[], &[]);
    // The attacker's whole session: open, then write a file.
    let (opened, session) = post_as_nobody(&l.url, None, &init());
    let mut statuses = vec![opened];
    if let Some(id) = &session {
        let note = json!({"jsonrpc": "2.0", "method": "notifications/initialized"});
        statuses.push(post_as_nobody(&l.url, Some(id), &note).0);
        let write = json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "write_file",
                       "arguments": {"path": "pwned-by-nobody", "content": "x"}}});
        statuses.push(post_as_nobody(&l.url, Some(id), &write).0);
    }
    assert!(
        !l.ws.path().join("pwned-by-nobody").exists(),
        "another user wrote into root's workspace"
    );
    assert_eq!(statuses, [401], "uid {NOBODY} was let in");
    // Root, with the token, is.
    let (status, _, _, body) = post(&l, l.token.as_deref(), None, init());
    assert_eq!(status, 200, "{body}");
}

#[test]
fn a_request_without_the_token_gets_401() {
    let l = listen(&[], &[]);
    let (status, _, headers, body) = post(&l, None, None, init());
    assert_eq!(status, 401, "no token was needed: {body}");
    assert_eq!(headers["www-authenticate"], "Bearer");
    assert!(body.contains("Authorization: Bearer"), "{body}");
    let (status, _, _, _) = post(&l, Some("cmcp_not_the_token_00000000"), None, init());
    assert_eq!(status, 401);
    let token = l.token.clone().expect("the token is printed");
    let (status, session, _, body) = post(&l, Some(&token), None, init());
    assert_eq!(status, 200, "{body}");
    assert!(session.is_some());
    assert!(body.contains("\"cordon\""), "{body}");
}

/// A web page the user visits may post to loopback: its Origin is not the
/// server's own, and that is refused even with the right token.
#[test]
fn a_foreign_origin_gets_403() {
    let l = listen(&[], &[]);
    let token = l.token.clone().unwrap_or_default();
    let port = l.url.rsplit(':').next().unwrap().trim_end_matches("/mcp");
    for origin in [
        "http://evil.example".to_string(),
        "null".to_string(),
        format!("http://localhost:{}", port.parse::<u16>().unwrap() ^ 1),
        format!("https://127.0.0.1:{port}"),
    ] {
        let (status, _, _, body) = post(&l, Some(&token), Some(&origin), init());
        assert_eq!(status, 403, "{origin} was let in: {body}");
    }
    // Its own origins, and no Origin at all (not a browser), are fine.
    for origin in [
        Some(format!("http://127.0.0.1:{port}")),
        Some(format!("http://localhost:{port}")),
        None,
    ] {
        let (status, _, _, body) = post(&l, Some(&token), origin.as_deref(), init());
        assert_eq!(status, 200, "{origin:?}: {body}");
    }
}

/// `--token-file` holds the token for clients, readable by its owner
/// only, written over (not through) whatever was at the path;
/// CORDON_MCP_TOKEN chooses the token.
#[test]
fn the_token_file_is_its_owners_and_the_token_can_be_chosen() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let file = dir.path().join("token");
    let victim = dir.path().join("victim");
    std::fs::write(&victim, "keep me\n").unwrap();
    std::os::unix::fs::symlink(&victim, &file).unwrap();
    let l = listen(&["--token-file", file.to_str().unwrap()], &[]);
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "keep me\n");
    let meta = std::fs::symlink_metadata(&file).unwrap();
    assert!(meta.is_file());
    assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    let token = std::fs::read_to_string(&file).unwrap().trim().to_string();
    assert!(token.len() >= 32, "{token}");
    assert_eq!(l.token, None, "with a file, the token is not printed");
    let (status, _, _, body) = post(&l, Some(&token), None, init());
    assert_eq!(status, 200, "{body}");
    if support::is_root() {
        let read = Command::new("setpriv")
            .args([
                &format!("--reuid={NOBODY}"),
                &format!("--regid={NOBODY}"),
                "--clear-groups",
                "cat",
            ])
            .arg(&file)
            .output()
            .unwrap();
        assert!(!read.status.success(), "uid {NOBODY} read the token");
    }
    drop(l);
    let chosen = "chosen-token-0123456789";
    let l = listen(&[], &[("CORDON_MCP_TOKEN", chosen)]);
    assert_eq!(l.token, None);
    let (status, _, _, body) = post(&l, Some(chosen), None, init());
    assert_eq!(status, 200, "{body}");
    let (status, _, _, _) = post(&l, Some("chosen-token-0123456780"), None, init());
    assert_eq!(status, 401);
    // A token too short to be one is refused at start.
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["mcp", "--listen", "127.0.0.1:0", "--workspace"])
        .arg(l.ws.path())
        .env("CORDON_MCP_TOKEN", "short")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(
        support::text(&out.stderr).contains("at least 16"),
        "{}",
        support::text(&out.stderr)
    );
}
