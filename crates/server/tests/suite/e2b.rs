//! The E2B layer (`/e2b`): the stock Python SDK from PyPI drives a
//! sandbox of the e2b-base environment; and, spoken by hand, what the SDKs
//! rely on at the edges: keys, tenants, access tokens, a dead sandbox's
//! 502, the Connect envelopes, deadlines, pages.

use crate::common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn key(token: &str) -> String {
    cordon_server::e2b_key(token).unwrap()
}

/// A control call with an E2B key: (status, headers, JSON or null).
async fn control(
    s: &TestServer,
    key: Option<&str>,
    method: reqwest::Method,
    path: &str,
    body: Option<Value>,
) -> (u16, reqwest::header::HeaderMap, Value) {
    let mut r = s.client.request(method, s.url(&format!("/e2b{path}")));
    if let Some(k) = key {
        r = r.header("X-API-KEY", k);
    }
    if let Some(b) = body {
        r = r.json(&b);
    }
    let r = r.send().await.unwrap();
    let (status, headers) = (r.status().as_u16(), r.headers().clone());
    let text = r.text().await.unwrap();
    (
        status,
        headers,
        serde_json::from_str(&text).unwrap_or(Value::Null),
    )
}

/// One Connect envelope around `message`.
fn envelope(message: &Value) -> Vec<u8> {
    let json = message.to_string().into_bytes();
    let mut out = vec![0];
    out.extend_from_slice(&(json.len() as u32).to_be_bytes());
    out.extend(json);
    out
}

/// A streamed answer's envelopes: (flags, JSON).
fn envelopes(mut body: &[u8]) -> Vec<(u8, Value)> {
    let mut out = Vec::new();
    while body.len() >= 5 {
        let len = u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize;
        out.push((body[0], serde_json::from_slice(&body[5..5 + len]).unwrap()));
        body = &body[5 + len..];
    }
    assert!(body.is_empty(), "a cut envelope");
    out
}

/// An RPC of sandbox `id`'s process service.
async fn rpc(
    s: &TestServer,
    id: &str,
    token: &str,
    method: &str,
    message: Value,
    headers: &[(&str, &str)],
) -> reqwest::Response {
    let streaming = matches!(method, "Start" | "Connect");
    let mut r = s
        .client
        .post(s.url(&format!("/e2b/process.Process/{method}")))
        .header("E2b-Sandbox-Id", id)
        .header("X-Access-Token", token);
    r = if streaming {
        r.header("Content-Type", "application/connect+json")
            .body(envelope(&message))
    } else {
        r.json(&message)
    };
    for (k, v) in headers {
        r = r.header(*k, *v);
    }
    r.send().await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_tokens_envelopes_deadlines_and_pages() {
    let s = TestServer::start(Db::Sqlite).await.unwrap();
    let acme = key(&s.token("acme").await);
    let zeta = key(&s.token("zeta").await);
    let new = json!({"templateID": "base", "timeout": 300, "metadata": {"n": "1"},
                     "envVars": {"FROM": "create"}, "secure": true,
                     "autoPause": false, "mcp": null});

    // No key, or one cordon never made: 401 in E2B's shape.
    let (status, _, b) = control(
        &s,
        None,
        reqwest::Method::POST,
        "/sandboxes",
        Some(new.clone()),
    )
    .await;
    assert_eq!((status, &b["code"]), (401, &json!(401)), "{b}");
    let fake = Some("e2b_00000000000000000000000000000000000000000000000000");
    let (status, _, _) = control(&s, fake, reqwest::Method::GET, "/v2/sandboxes", None).await;
    assert_eq!(status, 401);

    let (status, _, made) = control(
        &s,
        Some(&acme),
        reqwest::Method::POST,
        "/sandboxes",
        Some(new.clone()),
    )
    .await;
    assert_eq!(status, 201, "{made}");
    let id = made["sandboxID"].as_str().unwrap().to_string();
    let token = made["envdAccessToken"].as_str().unwrap().to_string();
    assert!(id.starts_with("sbx-") && !id.contains('_'), "{made}");
    assert_eq!(token.len(), 64, "{made}");
    assert_eq!(made["templateID"], "base");
    assert!(made["envdVersion"].as_str().unwrap() >= "0.1.0");

    // The same key is a bearer token of cordon's own API.
    let r = s
        .client
        .get(s.url("/v1/sandboxes"))
        .bearer_auth(&acme)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);

    // Another tenant: no such sandbox, whatever it tries.
    for (method, path) in [
        (reqwest::Method::GET, format!("/sandboxes/{id}")),
        (reqwest::Method::DELETE, format!("/sandboxes/{id}")),
    ] {
        let (status, _, b) = control(&s, Some(&zeta), method, &path, None).await;
        assert_eq!((status, &b["code"]), (404, &json!(404)), "{b}");
    }
    let (status, _, b) = control(
        &s,
        Some(&zeta),
        reqwest::Method::POST,
        &format!("/sandboxes/{id}/connect"),
        Some(json!({"timeout": 60})),
    )
    .await;
    assert_eq!(status, 404, "{b}");

    // Its own API wants its token, and no other sandbox's.
    let (_, _, other) = control(
        &s,
        Some(&zeta),
        reqwest::Method::POST,
        "/sandboxes",
        Some(new.clone()),
    )
    .await;
    let other_token = other["envdAccessToken"].as_str().unwrap();
    for bad in ["", other_token, &token[..63]] {
        let r = rpc(&s, &id, bad, "List", json!({}), &[]).await;
        assert_eq!(r.status(), 401, "token {bad:?}");
    }
    let r = rpc(&s, &id, &token, "List", json!({}), &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<Value>().await.unwrap(), json!({"processes": []}));

    // A command, enveloped: start, its output, its end, the stream's end.
    let start = json!({"process": {"cmd": "/bin/sh", "args": ["-c", "echo hi $FROM; exit 4"], "envs": {}}, "stdin": false});
    let r = rpc(&s, &id, &token, "Start", start, &[]).await;
    assert_eq!(r.status(), 200);
    assert_eq!(r.headers()["content-type"], "application/connect+json");
    let got = envelopes(&r.bytes().await.unwrap());
    assert!(
        got[0].1["event"]["start"]["pid"].as_u64().unwrap() > 0,
        "{got:?}"
    );
    assert_eq!(
        got[1].1,
        json!({"event": {"data": {"stdout": "aGkgY3JlYXRlCg=="}}}),
        "{got:?}"
    );
    assert_eq!(
        got[2].1,
        json!({"event": {"end": {"exitCode": 4, "exited": true, "status": "exit status 4", "error": "exit status 4"}}})
    );
    assert_eq!(got[3], (2, json!({})));

    // A deadline bounds the process: it is killed, and the stream says so.
    let sleep = json!({"process": {"cmd": "/bin/sleep", "args": ["30"]}});
    let t0 = std::time::Instant::now();
    let r = rpc(
        &s,
        &id,
        &token,
        "Start",
        sleep,
        &[("Connect-Timeout-Ms", "500")],
    )
    .await;
    let got = envelopes(&r.bytes().await.unwrap());
    assert!(t0.elapsed() < Duration::from_secs(10));
    let (flags, end) = got.last().unwrap();
    assert_eq!(
        (*flags, &end["error"]["code"]),
        (2, &json!("deadline_exceeded")),
        "{got:?}"
    );

    // Errors before a stream's first message end it, in-band.
    let missing = json!({"process": {"cmd": "/bin/true", "cwd": "/no/such/dir"}});
    let got = envelopes(
        &rpc(&s, &id, &token, "Start", missing, &[])
            .await
            .bytes()
            .await
            .unwrap(),
    );
    assert_eq!(got.len(), 1);
    assert_eq!(got[0].1["error"]["code"], "invalid_argument", "{got:?}");
    let got = envelopes(
        &rpc(
            &s,
            &id,
            &token,
            "Connect",
            json!({"process": {"pid": 999999}}),
            &[],
        )
        .await
        .bytes()
        .await
        .unwrap(),
    );
    assert_eq!(got[0].1["error"]["code"], "not_found", "{got:?}");
    let r = rpc(
        &s,
        &id,
        &token,
        "SendSignal",
        json!({"process": {"pid": 999999}, "signal": "SIGNAL_SIGKILL"}),
        &[],
    )
    .await;
    assert_eq!(r.status(), 404);
    assert_eq!(r.json::<Value>().await.unwrap()["code"], "not_found");

    // Pages, newest first, with a token to the next while more remain.
    for n in 2..=3 {
        let mut body = new.clone();
        body["metadata"] = json!({"n": n.to_string()});
        let (status, _, _) = control(
            &s,
            Some(&acme),
            reqwest::Method::POST,
            "/sandboxes",
            Some(body),
        )
        .await;
        assert_eq!(status, 201);
    }
    let mut seen = Vec::new();
    let mut next = String::new();
    loop {
        let path = format!("/v2/sandboxes?limit=1&nextToken={next}");
        let (status, headers, page) =
            control(&s, Some(&acme), reqwest::Method::GET, &path, None).await;
        assert_eq!(status, 200, "{page}");
        seen.push(page[0]["metadata"]["n"].as_str().unwrap().to_string());
        match headers.get("x-next-token") {
            Some(t) => next = t.to_str().unwrap().to_string(),
            None => break,
        }
    }
    assert_eq!(seen, ["3", "2", "1"]);
    let (_, _, asc) = control(
        &s,
        Some(&acme),
        reqwest::Method::GET,
        "/v2/sandboxes?order=asc",
        None,
    )
    .await;
    assert_eq!(asc[0]["metadata"]["n"], "1", "{asc}");
    let (_, _, one) = control(
        &s,
        Some(&acme),
        reqwest::Method::GET,
        "/v2/sandboxes?metadata=n%3D2",
        None,
    )
    .await;
    assert_eq!(one.as_array().unwrap().len(), 1, "{one}");
    let (_, _, none) = control(
        &s,
        Some(&acme),
        reqwest::Method::GET,
        "/v2/sandboxes?state=paused",
        None,
    )
    .await;
    assert_eq!(none, json!([]));

    // Connect never shortens; a timeout does, from now.
    let (_, _, before) = control(
        &s,
        Some(&acme),
        reqwest::Method::GET,
        &format!("/sandboxes/{id}"),
        None,
    )
    .await;
    let (status, _, again) = control(
        &s,
        Some(&acme),
        reqwest::Method::POST,
        &format!("/sandboxes/{id}/connect"),
        Some(json!({"timeout": 10})),
    )
    .await;
    assert_eq!((status, &again["envdAccessToken"]), (200, &json!(token)));
    let (_, _, after) = control(
        &s,
        Some(&acme),
        reqwest::Method::GET,
        &format!("/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(before["endAt"], after["endAt"]);
    let (status, _, _) = control(
        &s,
        Some(&acme),
        reqwest::Method::POST,
        &format!("/sandboxes/{id}/timeout"),
        Some(json!({"timeout": 10})),
    )
    .await;
    assert_eq!(status, 204);
    let (_, _, after) = control(
        &s,
        Some(&acme),
        reqwest::Method::GET,
        &format!("/sandboxes/{id}"),
        None,
    )
    .await;
    assert!(
        after["endAt"].as_str() < before["endAt"].as_str(),
        "{after}"
    );

    // Files: a signed link is good for its path, operation and time only,
    // and names its sandbox by being signed with its token.
    let r = s
        .client
        .post(s.url("/e2b/files?path=f.txt"))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", &token)
        .header("Content-Type", "application/octet-stream")
        .body("signed")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let sign = |path: &str, op: &str, exp: Option<i64>| {
        use base64::Engine;
        use sha2::Digest;
        let mut m = format!("{path}:{op}::{token}");
        if let Some(e) = exp {
            m.push_str(&format!(":{e}"));
        }
        let signature = format!(
            "v1_{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(sha2::Sha256::digest(m))
        );
        form_urlencoded::byte_serialize(signature.as_bytes()).collect::<String>()
    };
    let get = |q: String| {
        let c = s.client.clone();
        let url = s.url(&format!("/files?{q}"));
        async move {
            let r = c.get(url).send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    assert_eq!(
        get(format!(
            "path=f.txt&signature={}",
            sign("f.txt", "read", None)
        ))
        .await,
        (200, "signed".into())
    );
    let later = 4_000_000_000i64;
    assert_eq!(
        get(format!(
            "path=f.txt&signature={}&signature_expiration={later}",
            sign("f.txt", "read", Some(later))
        ))
        .await
        .0,
        200
    );
    let (status, body) = get(format!(
        "path=f.txt&signature={}&signature_expiration=1",
        sign("f.txt", "read", Some(1))
    ))
    .await;
    assert_eq!(
        (status, body.as_str()),
        (
            401,
            r#"{"code":401,"message":"signature is already expired"}"#
        )
    );
    for bad in [
        format!("path=other.txt&signature={}", sign("f.txt", "read", None)),
        format!("path=f.txt&signature={}", sign("f.txt", "write", None)),
        format!(
            "path=f.txt&signature={}&signature_expiration={later}",
            sign("f.txt", "read", None)
        ),
        format!(
            "path=f.txt&username=root&signature={}",
            sign("f.txt", "read", None)
        ),
        "path=f.txt".to_string(),
    ] {
        assert_eq!(get(bad.clone()).await.0, 401, "{bad}");
    }
    // Another sandbox's token signs nothing of this one's.
    let r = s
        .client
        .get(s.url("/e2b/files?path=f.txt"))
        .header("E2b-Sandbox-Id", &id)
        .header("X-Access-Token", other_token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 401);

    // Metrics: sampled from its start, every 5 s, in E2B's shape and
    // cordon's own (the same sandbox, its id in either spelling).
    let (status, _, m) = control(
        &s,
        Some(&acme),
        reqwest::Method::GET,
        &format!("/sandboxes/{id}/metrics"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{m}");
    assert!(m[0]["memUsed"].as_u64().unwrap() > 0, "{m}");
    assert!(
        m[0]["timestampUnix"].as_i64().unwrap() > 1_700_000_000,
        "{m}"
    );
    let (status, _, none) = control(
        &s,
        Some(&acme),
        reqwest::Method::GET,
        &format!("/sandboxes/{id}/metrics?start=1&end=2"),
        None,
    )
    .await;
    assert_eq!((status, none), (200, json!([])));
    let (status, own) = s
        .get(
            &acme,
            &format!("/v1/sandboxes/{}/metrics", id.replacen('-', "_", 1)),
        )
        .await;
    assert_eq!(status, 200, "{own}");
    assert!(own["now"]["memory_bytes"].as_u64().unwrap() > 0, "{own}");
    assert_eq!(own["now"]["disk_limit"].as_u64(), Some(1 << 30), "{own}");

    // Killed: gone for E2B (404), and its own API answers 502.
    let (status, _, _) = control(
        &s,
        Some(&acme),
        reqwest::Method::DELETE,
        &format!("/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, _, _) = control(
        &s,
        Some(&acme),
        reqwest::Method::DELETE,
        &format!("/sandboxes/{id}"),
        None,
    )
    .await;
    assert_eq!(status, 404);
    let r = s
        .client
        .get(s.url("/e2b/health"))
        .header("E2b-Sandbox-Id", &id)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 502);
    let body: Value = r.json().await.unwrap();
    assert_eq!(
        (&body["code"], &body["sandboxId"]),
        (&json!(502), &json!(id))
    );
    let r = rpc(&s, &id, &token, "List", json!({}), &[]).await;
    assert_eq!(r.status(), 502);
}

/// The Python SDK, as installed from PyPI (scripts/test puts it in a venv
/// named by CORDON_E2B_PYTHON).
fn e2b_python() -> Option<std::path::PathBuf> {
    match std::env::var_os("CORDON_E2B_PYTHON") {
        Some(p) => Some(p.into()),
        None => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CORDON_E2B_PYTHON is unset (scripts/test sets it)"
            );
            eprintln!("notice: skipping: CORDON_E2B_PYTHON is unset (scripts/test sets it)");
            None
        }
    }
}

/// The JS SDK, as installed from npm (scripts/test puts it in a
/// directory of its own named by CORDON_E2B_NODE_MODULES).
fn e2b_node_modules() -> Option<std::path::PathBuf> {
    match std::env::var_os("CORDON_E2B_NODE_MODULES") {
        Some(p) => Some(p.into()),
        None => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "CORDON_E2B_NODE_MODULES is unset (scripts/test sets it)"
            );
            eprintln!("notice: skipping: CORDON_E2B_NODE_MODULES is unset (scripts/test sets it)");
            None
        }
    }
}

/// A server offering the e2b-base environment as template `base`, with
/// the warm pools `pool`, and the E2B environment for its tenant `acme`;
/// `None` to skip.
async fn e2b_server(
    pool: &[&str],
) -> Option<(TestServer, tempfile::TempDir, Vec<(&'static str, String)>)> {
    let layout = cordon_testkit::environments::environment("e2b-base")?;
    let store = tempfile::tempdir().unwrap();
    let source = format!("oci:{}:latest", layout.display());
    let s = TestServer::start_with(Db::Sqlite, |c| {
        c.images = catalog(&[format!("base={source}")]);
        c.image_store = Some(store.path().to_path_buf());
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.pool = pool.iter().map(|p| p.parse().unwrap()).collect();
    })
    .await
    .unwrap();
    let api = s.url("/e2b");
    let env = vec![
        ("E2B_API_KEY", key(&s.token("acme").await)),
        ("E2B_API_URL", api.clone()),
        ("E2B_SANDBOX_URL", api),
    ];
    Some((s, store, env))
}

/// Runs `program script` with `env`, within 4 minutes: its stdout.
async fn run_sdk(
    program: &std::path::Path,
    script: &str,
    env: &[(&str, String)],
    extra: &[(&str, String)],
) -> String {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/common")
        .join(script);
    let mut cmd = tokio::process::Command::new(program);
    cmd.arg(script)
        .env_remove("E2B_DEBUG")
        .env_remove("E2B_DOMAIN")
        .kill_on_drop(true);
    for (k, v) in env.iter().chain(extra) {
        cmd.env(k, v);
    }
    let out = tokio::time::timeout(Duration::from_secs(240), cmd.output())
        .await
        .expect("the SDK's checks took over 4 minutes")
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

/// The JS SDK's sandboxes come from a warm pool of the sandbox API's
/// (the Python SDK's are made for it): `create` takes a pooled one, made
/// before the SDK asked, and everything else works on it as on one made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stock_js_sdk_drives_a_sandbox() {
    let Some(modules) = e2b_node_modules() else {
        return;
    };
    // E2B's default network is the internet; with a tenant's ceiling
    // that reaches nothing, a sandbox's own loopback.
    let pool = ["2,for=sandboxes,image=base,network=loopback"];
    let Some((s, _store, env)) = e2b_server(&pool).await else {
        return;
    };
    // Filled (the image imported) before the SDK asks.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while sample(&scrape(&s).await, "cordon_pool_ready") != Some(2.0) {
        assert!(
            std::time::Instant::now() < deadline,
            "the pool never filled"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let extra = [("E2B_NODE_MODULES", modules.display().to_string())];
    let stdout = run_sdk(std::path::Path::new("node"), "e2b_sdk.mjs", &env, &extra).await;
    for check in [
        "create",
        "run",
        "exit code",
        "stdin",
        "files",
        "watch",
        "pty",
        "list and timeout",
        "fork",
        "kill",
    ] {
        assert!(
            stdout.contains(&format!("ok {check}\n")),
            "{check}: {stdout}"
        );
    }
    let text = scrape(&s).await;
    let hits = sample(&text, "cordon_pool_hits_total").unwrap_or(0.0);
    assert!(hits >= 1.0, "no SDK sandbox came from the pool: {text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_stock_python_sdk_drives_a_sandbox() {
    let Some(python) = e2b_python() else {
        return;
    };
    let Some((_s, _store, env)) = e2b_server(&[]).await else {
        return;
    };
    let stdout = run_sdk(&python, "e2b_sdk.py", &env, &[]).await;
    for check in [
        "create",
        "run",
        "envs and cwd",
        "users",
        "files",
        "file operations",
        "watch",
        "on_stdout and stderr",
        "exit code",
        "stdin",
        "list, connect and kill",
        "timeout",
        "list, info and timeout",
        "connect",
        "fork",
        "killed during a run",
    ] {
        assert!(
            stdout.contains(&format!("ok {check}\n")),
            "{check}: {stdout}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ports_by_name_under_the_sandbox_domain() {
    let s = TestServer::start_with(Db::Sqlite, |c| {
        c.sandbox_domain = Some("sb.test".parse().unwrap());
    })
    .await
    .unwrap();
    let acme_token = s.token("acme").await;
    let (acme, zeta) = (key(&acme_token), s.token("zeta").await);
    let made = |public: bool| {
        let s = &s;
        let acme = acme.clone();
        async move {
            let body = json!({"templateID": "base", "network": {"allowPublicTraffic": public}});
            let (status, _, b) = control(
                s,
                Some(&acme),
                reqwest::Method::POST,
                "/sandboxes",
                Some(body),
            )
            .await;
            assert_eq!(status, 201, "{b}");
            // The SDK appends it to `{port}-{id}.`: the server's port with it.
            let port = s.base.rsplit(':').next().unwrap();
            assert_eq!(b["domain"], format!("sb.test:{port}"));
            let id = b["sandboxID"].as_str().unwrap().to_string();
            let cid = id.replacen('-', "_", 1);
            let (status, r) = s
                .post(
                    &acme,
                    &format!("/v1/sandboxes/{cid}/commands"),
                    json!({"cmd": "mkdir -p /tmp/site && echo served > /tmp/site/index.html && cd /tmp/site && exec python3 -m http.server 8001 --bind 127.0.0.1", "background": true}),
                )
                .await;
            assert_eq!(status, 202, "{r}");
            (id, b["trafficAccessToken"].as_str().map(str::to_string))
        }
    };
    let get = |host: String, headers: Vec<(&'static str, String)>| {
        let s = &s;
        async move {
            let mut r = s.client.get(s.url("/")).header("Host", host);
            for (k, v) in headers {
                r = r.header(k, v);
            }
            let r = r.send().await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    let (open, none) = made(true).await;
    assert_eq!(none, None, "a public sandbox needs no traffic token");
    let host = format!("8001-{open}.sb.test");
    // The server starts in the background: asked until it answers.
    let mut answer = (0, String::new());
    for _ in 0..100 {
        answer = get(host.clone(), vec![]).await;
        if answer.0 == 200 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(answer, (200, "served\n".into()));
    // envd by name: its health, for the SDKs that reach a sandbox so.
    let r = s
        .client
        .get(s.url("/health"))
        .header("Host", format!("49983-{open}.sb.test"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);

    // A private one: its traffic token or its tenant's; nobody else.
    let (closed, traffic) = made(false).await;
    let traffic = traffic.expect("a private sandbox's traffic token");
    let host = format!("8001-{closed}.sb.test");
    for _ in 0..100 {
        if get(
            host.clone(),
            vec![("e2b-traffic-access-token", traffic.clone())],
        )
        .await
        .0 == 200
        {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        get(host.clone(), vec![("X-Traffic-Token", traffic.clone())])
            .await
            .0,
        200
    );
    assert_eq!(
        get(
            host.clone(),
            vec![("Authorization", format!("Bearer {acme_token}"))]
        )
        .await
        .0,
        200
    );
    // Without a token, E2B's 403; another tenant's finds nothing.
    for (refused, want) in [
        (vec![], 403),
        (vec![("X-Traffic-Token", "0".repeat(64))], 403),
        (vec![("Authorization", format!("Bearer {zeta}"))], 404),
        (vec![("Authorization", "Bearer nope".to_string())], 401),
    ] {
        let (status, body) = get(host.clone(), refused.clone()).await;
        assert_eq!(status, want, "{refused:?}: {body}");
    }
    // Ended: the same answer as for no sandbox at all.
    let (status, _, _) = control(
        &s,
        Some(&acme),
        reqwest::Method::DELETE,
        &format!("/sandboxes/{open}"),
        None,
    )
    .await;
    assert_eq!(status, 204);
    let (status, body) = get(format!("8001-{open}.sb.test"), vec![]).await;
    assert_eq!(status, 502);
    assert!(body.contains("The sandbox was not found"), "{body}");
    // Names outside the domain are the API's, as ever.
    let (status, _) = get("127.0.0.1".into(), vec![]).await;
    assert_ne!(status, 502);

    // With previews off, no port answers by name (envd still does).
    let off = TestServer::start_with(Db::Sqlite, |c| {
        c.sandbox_domain = Some("sb.test".parse().unwrap());
        c.previews = false;
    })
    .await
    .unwrap();
    let key_off = key(&off.token("acme").await);
    let (status, _, b) = control(
        &off,
        Some(&key_off),
        reqwest::Method::POST,
        "/sandboxes",
        Some(json!({"templateID": "base"})),
    )
    .await;
    assert_eq!(status, 201, "{b}");
    let id = b["sandboxID"].as_str().unwrap();
    let r = off
        .client
        .get(off.url("/"))
        .header("Host", format!("8001-{id}.sb.test"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403);
    let r = off
        .client
        .get(off.url("/health"))
        .header("Host", format!("49983-{id}.sb.test"))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 204);
}
