//! `cordon serve` as a process: it starts with no configuration, and a
//! server killed with SIGKILL and started again loses nothing.

use crate::support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::serve::{Started as Server, free_port};

/// `cordon serve --listen 127.0.0.1:PORT EXTRA` with `home` as its home.
fn serve(home: &Path, port: u16, extra: &[&str]) -> Server {
    let listen = format!("127.0.0.1:{port}");
    let mut args = vec!["serve", "--listen", &listen];
    args.extend_from_slice(extra);
    support::serve::spawn(home, &args)
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

fn submit(s: &Server, token: &str, command: &str) -> String {
    let r = http()
        .post(format!("{}/v1/jobs", s.url))
        .bearer_auth(token)
        .json(&json!({"kind": "shell", "command": command}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 202);
    r.json::<Value>().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

fn job(s: &Server, token: &str, id: &str) -> Value {
    http()
        .get(format!("{}/v1/jobs/{id}", s.url))
        .bearer_auth(token)
        .send()
        .unwrap()
        .json()
        .unwrap()
}

fn wait_for(s: &Server, token: &str, id: &str, done: impl Fn(&Value) -> bool) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let j = job(s, token, id);
        if done(&j) {
            return j;
        }
        assert!(Instant::now() < deadline, "waited too long: {j}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn terminal(j: &Value) -> bool {
    !["queued", "running"].contains(&j["state"].as_str().unwrap_or(""))
}

/// What users type: `--tls-cert`/`--tls-key`, a pair that does not fit,
/// and one flag without the other.
#[test]
fn serve_over_tls_with_the_certificate_the_user_names() {
    let home = tempfile::tempdir().unwrap();
    let dir = home.path();
    let pem = |name: &str| {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
        std::fs::write(dir.join(format!("{name}.crt")), c.cert.pem()).unwrap();
        std::fs::write(
            dir.join(format!("{name}.key")),
            c.signing_key.serialize_pem(),
        )
        .unwrap();
        c.cert.pem()
    };
    let cert_pem = pem("server");
    pem("other");
    let path = |f: &str| dir.join(f).display().to_string();
    let run = |args: &[String]| {
        Command::new(env!("CARGO_BIN_EXE_cordon"))
            .arg("serve")
            .args(args)
            .env("HOME", dir)
            .env("XDG_DATA_HOME", dir.join("data"))
            .output()
            .unwrap()
    };

    // Bad options are cordon's own failure (125), before anything starts.
    let out = run(&["--tls-cert".into(), path("server.crt")]);
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--tls-key"));
    let out = run(&[
        "--tls-cert".into(),
        path("server.crt"),
        "--tls-key".into(),
        path("other.key"),
    ]);
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("do not belong together"), "{err}");
    let out = run(&[
        "--tls-cert".into(),
        path("missing.crt"),
        "--tls-key".into(),
        path("server.key"),
    ]);
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("missing.crt"));

    let port = free_port();
    let s = serve(
        dir,
        port,
        &[
            "--tls-cert",
            &path("server.crt"),
            "--tls-key",
            &path("server.key"),
        ],
    );
    assert_eq!(s.url, format!("https://127.0.0.1:{port}"));
    let client = reqwest::blocking::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(cert_pem.as_bytes()).unwrap()])
        .build()
        .unwrap();
    let r = client
        .get(format!("https://localhost:{port}/health"))
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let token = s.token.clone().unwrap();
    let r = client
        .post(format!("https://localhost:{port}/v1/jobs"))
        .bearer_auth(&token)
        .json(&json!({"kind": "shell", "command": "echo hi"}))
        .send()
        .unwrap();
    assert_eq!(r.status(), 202, "{:?}", r.text());
}

/// Issue 32: SIGTERM, as every rollout sends it. The running job finishes
/// within `--grace`, the one that cannot is cancelled with the reason,
/// the server says so in `cordon:` lines and exits 0; started again, it
/// finds nothing half-done.
#[test]
fn sigterm_lets_running_jobs_finish_within_the_grace_and_cancels_the_rest() {
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let mut first = serve(home.path(), port, &["--workers", "2", "--grace", "3s"]);
    let token = first.token.clone().expect("a first token is printed");
    let quick = submit(&first, &token, "echo begun; sleep 1; echo done");
    // A duration of this test's own: the other test here sleeps too, at
    // the same time, and pgrep looks at the whole machine.
    let slow = submit(&first, &token, "echo begun; sleep 307");
    for id in [&quick, &slow] {
        wait_for(&first, &token, id, |j| j["state"] == "running");
    }
    let started = Instant::now();
    unsafe { libc::kill(first.child.id() as i32, libc::SIGTERM) };
    let status = first.child.wait().unwrap();
    let took = started.elapsed();
    assert_eq!(status.code(), Some(0));
    assert!(
        took >= Duration::from_secs(3) && took < Duration::from_secs(20),
        "{took:?}"
    );
    std::thread::sleep(Duration::from_millis(200));
    let said = first.said.lock().unwrap().join("\n");
    assert!(
        said.contains("cordon: stopping: 2 jobs running may finish within 3s"),
        "{said}"
    );
    assert!(said.contains("cordon: stopped; 1 job cancelled"), "{said}");
    for line in said.lines() {
        assert!(
            line.starts_with("cordon: "),
            "not a cordon: line: {line:?}\n{said}"
        );
    }
    drop(first);

    let second = serve(home.path(), port, &["--workers", "1"]);
    let j = job(&second, &token, &quick);
    assert_eq!(
        (j["state"].as_str(), j["stdout"].as_str()),
        (Some("succeeded"), Some("begun\ndone\n")),
        "{j}"
    );
    let j = job(&second, &token, &slow);
    assert_eq!(j["state"], "cancelled", "{j}");
    assert!(
        j["error"].as_str().unwrap().contains("grace period of 3s"),
        "{j}"
    );
    let left = Command::new("pgrep")
        .args(["-af", "^sleep 307$"])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&left.stdout)
    );
}

#[test]
fn a_server_killed_with_sigkill_loses_nothing_when_started_again() {
    let home = tempfile::tempdir().unwrap();
    let port = free_port();
    let first = serve(home.path(), port, &["--workers", "1"]);
    let token = first.token.clone().expect("a first token is printed");
    // It is the operator's: whoever started the server manages tokens.
    let r = http()
        .get(format!("{}/v1/tokens", first.url))
        .bearer_auth(&token)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    let listed: Value = r.json().unwrap();
    assert_eq!(listed["tokens"][0]["role"], "operator", "{listed}");
    assert_eq!(listed["tokens"][0]["tenant"], "default", "{listed}");
    let running = submit(&first, &token, "echo begun; sleep 311");
    let queued: Vec<String> = (0..3)
        .map(|i| submit(&first, &token, &format!("echo queued-{i}")))
        .collect();
    wait_for(&first, &token, &running, |j| j["stdout"] == "begun\n");
    // SIGKILL: no chance to tidy up.
    let mut first = first;
    first.child.kill().unwrap();
    first.child.wait().unwrap();
    drop(first);

    let second = serve(home.path(), port, &["--workers", "1"]);
    assert!(second.token.is_none(), "tokens survive; no new one is made");
    let j = wait_for(&second, &token, &running, terminal);
    assert_eq!(j["state"], "failed", "{j}");
    assert_eq!(j["error"], "server restarted");
    assert_eq!(j["stdout"], "begun\n", "its output so far is kept");
    for (i, id) in queued.iter().enumerate() {
        let j = wait_for(&second, &token, id, terminal);
        assert_eq!(j["state"], "succeeded", "{j}");
        assert_eq!(j["stdout"], format!("queued-{i}\n"));
    }
    // The killed job's sandbox died with its server: nothing sleeps on.
    let left = Command::new("pgrep")
        .args(["-af", "^sleep 311$"])
        .output()
        .unwrap();
    assert!(
        left.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&left.stdout)
    );
    // Its event stream ends with the reason.
    let text = http()
        .get(format!("{}/v1/jobs/{running}/events", second.url))
        .bearer_auth(&token)
        .send()
        .unwrap()
        .text()
        .unwrap();
    assert!(text.contains("event: finished"), "{text}");
    assert!(text.contains("server restarted"), "{text}");
}

#[test]
fn token_create_adds_a_tenant_that_the_server_accepts() {
    let home = tempfile::tempdir().unwrap();
    let db = home.path().join("data/cordon/server.db");
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["token", "create", "--tenant", "team-a"])
        .env_clear()
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let token = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert!(token.starts_with("cdn_") && token.len() > 40, "{token}");
    assert!(db.exists());
    // The database holds a hash, never the token.
    for file in ["server.db", "server.db-wal"] {
        let raw = std::fs::read(db.with_file_name(file)).unwrap_or_default();
        assert!(
            !raw.windows(token.len()).any(|w| w == token.as_bytes()),
            "{file}"
        );
    }
    let bad = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["token", "create", "--tenant", "no spaces"])
        .env_clear()
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(78));
    let s = serve(home.path(), free_port(), &[]);
    assert!(s.token.is_none(), "a token exists already");
    let id = submit(&s, &token, "echo ok");
    let j = wait_for(&s, &token, &id, terminal);
    assert_eq!(j["stdout"], "ok\n");
}

/// The finding: on `--workers 2 --per-tenant 2` one token held 10
/// `/mcp` sessions, each with a sandbox. `--sessions-per-tenant` and
/// `--sessions` bound them.
#[test]
fn live_mcp_sessions_are_bounded_per_tenant_and_in_all() {
    let home = tempfile::tempdir().unwrap();
    let s = serve(
        home.path(),
        free_port(),
        &[
            "--workers",
            "2",
            "--per-tenant",
            "2",
            "--sessions-per-tenant",
            "2",
            "--sessions",
            "3",
        ],
    );
    let token = s.token.clone().expect("a first token is printed");
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["token", "create", "--tenant", "other"])
        .env_clear()
        .env("HOME", home.path())
        .env("XDG_DATA_HOME", home.path().join("data"))
        .output()
        .unwrap();
    let other = String::from_utf8(out.stdout).unwrap().trim().to_string();
    let open = |t: &str| {
        let r = http()
            .post(format!("{}/mcp", s.url))
            .bearer_auth(t)
            .header("Accept", "application/json, text/event-stream")
            .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                           "clientInfo": {"name": "test", "version": "1"}}}))
            .send()
            .unwrap();
        (r.status().as_u16(), r.text().unwrap())
    };
    let statuses: Vec<u16> = (0..10).map(|_| open(&token).0).collect();
    assert_eq!(statuses, [200, 200, 429, 429, 429, 429, 429, 429, 429, 429]);
    let (_, body) = open(&token);
    assert!(body.contains("--sessions-per-tenant"), "{body}");
    assert_eq!(open(&other).0, 200);
    let (status, body) = open(&other);
    assert_eq!(status, 429);
    assert!(body.contains("`cordon serve --sessions`"), "{body}");
}

/// `cordon token`: tokens are listed by id (never shown again), and a
/// revoked one is refused by the running server from its next request.
#[test]
fn tokens_are_listed_by_id_and_revoked_at_once() {
    let home = tempfile::tempdir().unwrap();
    let token = |args: &[&str]| {
        let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .arg("token")
            .args(args)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", home.path())
            .env("XDG_DATA_HOME", home.path().join("data"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, a1, err) = token(&["create", "--tenant", "acme"]);
    assert_eq!(code, Some(0), "{err}");
    let a1 = a1.trim().to_string();
    let (_, a2, _) = token(&["create", "--tenant", "acme"]);
    let a2 = a2.trim().to_string();
    let (_, b1, _) = token(&["create", "--tenant", "beta"]);
    let b1 = b1.trim().to_string();

    let (code, list, _) = token(&["list"]);
    assert_eq!(code, Some(0));
    let rows: Vec<&str> = list.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{list}");
    for t in [&a1, &a2, &b1] {
        assert!(
            !list.contains(t.as_str()),
            "a token was shown again: {list}"
        );
    }
    let (_, acme, _) = token(&["list", "--tenant", "acme"]);
    assert_eq!(acme.lines().skip(1).count(), 2, "{acme}");
    let beta_id = rows
        .iter()
        .find(|r| r.contains("beta"))
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .to_string();

    // A running server takes a revocation from the next request on.
    let port = free_port();
    let s = serve(home.path(), port, &[]);
    assert!(s.token.is_none(), "tokens existed: no first token");
    let status = |t: &str| {
        http()
            .get(format!("{}/v1/jobs", s.url))
            .bearer_auth(t)
            .send()
            .unwrap()
            .status()
            .as_u16()
    };
    assert_eq!(status(&b1), 200);

    // An operator's token also manages tokens over the API; a tenant's
    // may not.
    let (code, op, err) = token(&["create", "--tenant", "ops", "--operator"]);
    assert_eq!(code, Some(0), "{err}");
    let op = op.trim().to_string();
    let (_, list, _) = token(&["list", "--tenant", "ops"]);
    assert!(list.lines().next().unwrap().contains("ROLE"), "{list}");
    assert!(list.lines().nth(1).unwrap().contains("operator"), "{list}");
    let (_, acme, _) = token(&["list", "--tenant", "acme"]);
    assert!(
        acme.lines().skip(1).all(|l| l.contains(" tenant ")),
        "{acme}"
    );
    let tokens = |t: &str| {
        http()
            .get(format!("{}/v1/tokens", s.url))
            .bearer_auth(t)
            .send()
            .unwrap()
    };
    let listed: Value = tokens(&op).json().unwrap();
    assert_eq!(listed["tokens"].as_array().unwrap().len(), 4, "{listed}");
    assert_eq!(tokens(&b1).status(), 403);

    let (code, _, err) = token(&["revoke", &beta_id]);
    assert_eq!(code, Some(0), "{err}");
    assert!(
        err.contains("revoked token") && err.contains("beta"),
        "{err}"
    );
    assert_eq!(status(&b1), 401);
    assert_eq!(status(&a1), 200);

    // By tenant; bad ids say what an id is; an unknown one is an error.
    let (code, _, err) = token(&["revoke", "--tenant", "acme"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(err.contains("revoked 2 token(s)"), "{err}");
    assert_eq!(status(&a1), 401);
    assert_eq!(status(&a2), 401);
    let (code, _, err) = token(&["revoke", "abc"]);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("8 to 64 hex digits"), "{err}");
    let (code, _, err) = token(&["revoke", "%%%%%%%%"]);
    assert_eq!(code, Some(78), "{err}");
    let (code, _, err) = token(&["revoke", "0123456789ab"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("no token"), "{err}");
    let (_, list, _) = token(&["list"]);
    assert_eq!(
        list.lines().count(),
        2,
        "only the operator's is left: {list}"
    );
}

/// The key the tenants' git logins are sealed with comes from the
/// environment only; a weak one is refused, unechoed, before anything
/// starts.
#[test]
fn a_weak_secrets_key_is_refused_before_anything_starts() {
    let home = tempfile::tempdir().unwrap();
    let serve = |var: &str, value: &str| {
        let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(["serve", "--listen", "127.0.0.1:0"])
            .env_remove("CORDON_SECRETS_KEY")
            .env_remove("CORDON_SECRETS_KEY_PREVIOUS")
            .env(var, value)
            .env("HOME", home.path())
            .env("XDG_DATA_HOME", home.path().join("data"))
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = serve("CORDON_SECRETS_KEY", "hunter2-hunter2");
    assert_eq!(code, Some(78), "{err}");
    assert!(
        err.contains("CORDON_SECRETS_KEY") && err.contains("at least 32"),
        "{err}"
    );
    assert!(!err.contains("hunter2"), "{err}");
    assert!(!home.path().join("data/cordon/server.db").exists());
    // An earlier key, kept to open what it sealed, is held to the same.
    let (code, err) = serve(
        "CORDON_SECRETS_KEY_PREVIOUS",
        "0123456789abcdef0123456789abcdef hunter2",
    );
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("CORDON_SECRETS_KEY_PREVIOUS, key 2"), "{err}");
    assert!(!err.contains("hunter2"), "{err}");
}

/// A worker's relay needs the cluster key, from the environment only, and
/// a base URL to advertise: each mistake is named before anything starts,
/// and the key is never echoed.
#[test]
fn a_worker_advertises_only_with_a_cluster_key_and_a_base_url() {
    let home = tempfile::tempdir().unwrap();
    let run = |args: &[&str], key: Option<&str>| {
        let mut c = Command::new(env!("CARGO_BIN_EXE_cordon"));
        c.arg("worker")
            .args(args)
            .env_remove("CORDON_CLUSTER_KEY")
            .env("HOME", home.path())
            .env("XDG_DATA_HOME", home.path().join("data"));
        if let Some(k) = key {
            c.env("CORDON_CLUSTER_KEY", k);
        }
        let out = c.output().unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, err) = run(&["--advertise", "http://127.0.0.1:8081"], None);
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("CORDON_CLUSTER_KEY"), "{err}");
    let (code, err) = run(&["--advertise", "http://127.0.0.1:8081"], Some("tooshort"));
    assert_eq!(code, Some(78), "{err}");
    assert!(err.contains("at least 32"), "{err}");
    assert!(!err.contains("tooshort"), "{err}");
    let (code, err) = run(
        &["--advertise", "http://127.0.0.1:8081/relay"],
        Some("0123456789abcdef0123456789abcdef"),
    );
    assert_eq!(code, Some(125), "{err}");
    assert!(err.contains("no path"), "{err}");
    // There is no flag for the key: `ps` would show it.
    let (code, err) = run(&["--cluster-key", "0123456789abcdef0123456789abcdef"], None);
    assert_eq!(code, Some(125), "{err}");
}
