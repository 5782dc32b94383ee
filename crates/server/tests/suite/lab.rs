//! JupyterLab in a running job's sandbox, through the server: the browser's
//! way in (a one-time ticket for the Lab's own origin), the programs' way
//! (the bearer token on the server's origin), kernels and terminals over
//! WebSockets, and the attacks on both: no token, another tenant's, a token
//! in the URL, a cookie of another Lab, a request from another origin, a
//! hostile server in the sandbox, and Jupyter kept off the host's network.
//!
//! Needs the lab environment (`cordon lab setup`, which scripts/test runs).

use crate::common;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Whether the lab environment is installed; under CI it must be.
fn lab_installed() -> bool {
    if cordon_lab::installed(&cordon_lab::cache_dir()).is_some() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "no lab environment in {}: run `cordon lab setup` (scripts/test does)",
        cordon_lab::cache_dir().display()
    );
    eprintln!("skipped: no lab environment (cordon lab setup)");
    false
}

/// A job that runs until the test uploads `release`.
fn held() -> Value {
    shell("while [ ! -f /workspace/release ]; do sleep 0.1; done")
}

/// `GET path` on the server with `t`'s token.
async fn bearer_get(s: &TestServer, t: &str, path: &str) -> reqwest::Response {
    client()
        .get(s.url(path))
        .bearer_auth(t)
        .send()
        .await
        .unwrap()
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// `POST /v1/jobs/{id}/lab` as `t`: the URL with its ticket.
async fn open_url(s: &TestServer, t: &str, id: &str) -> String {
    let (status, body) = s.post(t, &format!("/v1/jobs/{id}/lab"), json!({})).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["expires_in"], 60);
    body["url"].as_str().unwrap().to_string()
}

/// A browser's way in: the ticket spent for the Lab's cookie. Returns the
/// Lab's origin and base, and the cookie (`name=value`).
async fn sign_in(url: &str) -> (String, String) {
    let r = client().get(url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "{url}");
    let to = r.headers()[LOCATION].to_str().unwrap().to_string();
    assert!(!to.contains("cordon_ticket"), "{to}");
    let set = r.headers()[SET_COOKIE].to_str().unwrap().to_string();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/v1/jobs/"] {
        assert!(set.contains(attr), "{set}");
    }
    let cookie = set.split(';').next().unwrap().to_string();
    let origin = url.split("/v1/").next().unwrap().to_string();
    (format!("{origin}{to}"), cookie)
}

/// Jupyter's `_xsrf` cookie value, from a page that sets it.
async fn xsrf(req: reqwest::RequestBuilder) -> String {
    let r = req.send().await.unwrap();
    assert_eq!(r.status(), 200);
    r.headers()
        .get_all(SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .find_map(|v| v.strip_prefix("_xsrf="))
        .map(|v| v.split(';').next().unwrap().to_string())
        .expect("Jupyter sets _xsrf")
}

async fn ws(url: &str, headers: &[(&'static str, String)]) -> Result<Ws, u16> {
    let mut req = url
        .replacen("http://", "ws://", 1)
        .into_client_request()
        .unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(*k, v.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, _)) => Ok(ws),
        Err(tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("{url}: {e}"),
    }
}

/// Runs `code` in the kernel behind `ws` (Jupyter's JSON protocol) and
/// returns its stdout: complete once the reply (shell) and the kernel's
/// return to idle (iopub) have both come, as the channels are not ordered.
async fn execute(ws: &mut Ws, code: &str) -> String {
    let msg = json!({
        "header": {"msg_id": "m1", "username": "test", "session": "s1",
                   "msg_type": "execute_request", "version": "5.3", "date": ""},
        "parent_header": {}, "metadata": {}, "channel": "shell", "buffers": [],
        "content": {"code": code, "silent": false, "store_history": false,
                    "user_expressions": {}, "allow_stdin": false, "stop_on_error": true},
    });
    ws.send(Message::Text(msg.to_string().into()))
        .await
        .unwrap();
    let mut out = String::new();
    let (mut replied, mut idle) = (false, false);
    let deadline = Instant::now() + Duration::from_secs(60);
    while !(replied && idle) {
        let m = tokio::time::timeout_at(deadline.into(), ws.next())
            .await
            .expect("the kernel answers within 60 s")
            .unwrap()
            .unwrap();
        let Message::Text(t) = m else { continue };
        let v: Value = serde_json::from_str(&t).unwrap();
        if v["parent_header"]["msg_id"] != "m1" {
            continue;
        }
        match v["msg_type"].as_str() {
            Some("stream") => out.push_str(v["content"]["text"].as_str().unwrap()),
            Some("error") => panic!("{code}: {}", v["content"]),
            Some("execute_reply") => replied = true,
            Some("status") => idle |= v["content"]["execution_state"] == "idle",
            _ => {}
        }
    }
    out
}

/// Types `line` into the terminal behind `ws` and returns its output up to
/// `end`.
async fn terminal(ws: &mut Ws, line: &str, end: &str) -> String {
    ws.send(Message::Text(
        json!(["stdin", format!("{line}\r")]).to_string().into(),
    ))
    .await
    .unwrap();
    let mut out = String::new();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !out.contains(end) {
        let m = tokio::time::timeout_at(deadline.into(), ws.next())
            .await
            .unwrap_or_else(|_| panic!("no {end:?} in {out:?}"))
            .unwrap()
            .unwrap();
        if let Message::Text(t) = m {
            let v: Value = serde_json::from_str(&t).unwrap();
            if v[0] == "stdout" {
                out.push_str(v[1].as_str().unwrap());
            }
        }
    }
    out
}

/// Whether a browser would render `r` in no origin: one of the policies
/// it carries (all of which hold) is a bare `sandbox`.
fn sandboxed(r: &reqwest::Response) -> bool {
    r.headers()
        .get_all("content-security-policy")
        .iter()
        .any(|v| v == "sandbox")
}

/// TCP ports listening on the host (this test's network namespace).
fn host_listeners() -> HashSet<u16> {
    let mut ports = HashSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.get(3) == Some(&"0A")
                && let Some(port) = f[1].rsplit(':').next()
            {
                ports.insert(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_jobs_lab_runs_in_its_sandbox_for_its_tenant_alone() {
    if !lab_installed() {
        return;
    }
    let s = TestServer::start(Db::Sqlite).await.unwrap();
    let t = s.token("acme").await;
    let other = s.token("globex").await;
    let id = s.submit(&t, held()).await;
    s.wait_running(&t, &id).await;
    let lab = format!("/v1/jobs/{id}/lab");
    let before = host_listeners();

    // No token, another tenant's, or a token in the URL: refused.
    let r = client().post(s.url(&lab)).send().await.unwrap();
    assert_eq!(r.status(), 401);
    assert_eq!(s.post(&other, &lab, json!({})).await.0, 404);
    for path in [
        format!("{lab}/api/contents?token={t}"),
        format!("{lab}/api/contents?access_token={t}"),
    ] {
        let r = client().get(s.url(&path)).send().await.unwrap();
        assert_eq!(r.status(), 401, "{path}");
    }

    let started = Instant::now();
    let url = open_url(&s, &t, &id).await;
    eprintln!("Lab started in {:?}", started.elapsed());
    assert!(
        url.contains(&format!("/v1/jobs/{id}/lab/?cordon_ticket=")),
        "{url}"
    );
    let lab_port: u16 = url
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert_ne!(s.url("").split(':').nth(2).unwrap(), lab_port.to_string());

    // Jupyter itself listens on no port of the host: every listener that
    // appeared with the Lab (the Lab's own origin, cordon's, and other
    // tests' servers) refuses a request without cordon's credentials.
    let new: Vec<u16> = host_listeners().difference(&before).copied().collect();
    assert!(new.contains(&lab_port), "{new:?}");
    for port in new {
        let r = client()
            .get(format!("http://127.0.0.1:{port}{lab}/api/contents"))
            .send()
            .await;
        if let Ok(r) = r {
            assert_ne!(r.status(), 200, "port {port} serves the Lab to anyone");
        }
    }

    // The browser's way: the ticket works once, the cookie after it.
    let (home, cookie) = sign_in(&url).await;
    let again = client().get(&url).send().await.unwrap();
    assert_eq!(again.status(), 401, "a spent ticket");
    let page = client()
        .get(format!("{home}lab"))
        .header(COOKIE, &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    let html = page.text().await.unwrap();
    assert!(html.contains("JupyterLab"), "{html}");
    let bare = client().get(format!("{home}lab")).send().await.unwrap();
    assert_eq!(bare.status(), 401, "no cookie");
    let bearer = client()
        .get(format!("{home}api/contents"))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(
        bearer.status(),
        401,
        "the Lab's origin takes its cookie, not tokens"
    );
    // A page of another origin (another Lab's, on another port of the same
    // host, which gets this cookie too) cannot use it.
    for (site, mode) in [("same-site", "cors"), ("cross-site", "no-cors")] {
        let r = client()
            .post(format!("{home}api/terminals"))
            .header(COOKIE, &cookie)
            .header("sec-fetch-site", site)
            .header("sec-fetch-mode", mode)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 403, "{site}");
    }
    let r = client()
        .get(format!("{home}api/contents"))
        .header(COOKIE, &cookie)
        .header("origin", "http://127.0.0.1:1")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 403, "a foreign Origin");

    // A cell writes a file in the workspace; the files API finds it.
    let token = xsrf(client().get(format!("{home}lab")).header(COOKIE, &cookie)).await;
    let both = format!("{cookie}; _xsrf={token}");
    let r = client()
        .post(format!("{home}api/kernels"))
        .header(COOKIE, &both)
        .header("x-xsrftoken", &token)
        .json(&json!({"name": "python3"}))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 201, "{}", r.text().await.unwrap());
    let kernel: Value = r.json().await.unwrap();
    let kid = kernel["id"].as_str().unwrap();
    let channels = format!("{home}api/kernels/{kid}/channels");
    let origin = home.split("/v1/").next().unwrap().to_string();
    let mut k = ws(
        &channels,
        &[("cookie", both.clone()), ("origin", origin.clone())],
    )
    .await
    .expect("the kernel's channels");
    let out = execute(
        &mut k,
        "import os\nopen('from-lab.txt', 'w').write('written in the Lab')\nprint(os.getcwd(), os.getuid())",
    )
    .await;
    assert_eq!(out.trim(), "/workspace 0", "{out}");
    let (status, _) = s.get(&t, &format!("/v1/jobs/{id}/files")).await;
    assert_eq!(status, 200);
    let r = bearer_get(&s, &t, &format!("/v1/jobs/{id}/files/from-lab.txt")).await;
    assert_eq!(r.text().await.unwrap(), "written in the Lab");

    // Another tenant reaches neither the kernel nor the contents.
    let theirs = s.url(&format!("{lab}/api/kernels/{kid}/channels"));
    assert_eq!(
        ws(&theirs, &[("authorization", format!("Bearer {other}"))])
            .await
            .err(),
        Some(404)
    );
    let proto = format!("cordon.bearer.{other}, v1.kernel.websocket.jupyter.org");
    assert_eq!(
        ws(&theirs, &[("sec-websocket-protocol", proto)])
            .await
            .err(),
        Some(404)
    );
    assert_eq!(s.get(&other, &format!("{lab}/api/contents")).await.0, 404);

    // The programs' way: the bearer token, on the server's origin, in no
    // origin if a browser renders it.
    let r = bearer_get(&s, &t, &format!("{lab}/api/contents/from-lab.txt")).await;
    assert_eq!(r.status(), 200);
    assert!(sandboxed(&r), "{:?}", r.headers());
    let file: Value = r.json().await.unwrap();
    assert_eq!(file["content"], "written in the Lab");
    let mut k2 = ws(&theirs, &[("authorization", format!("Bearer {t}"))])
        .await
        .expect("the kernel with the bearer token");
    let out = execute(&mut k2, "print(open('from-lab.txt').read())").await;
    assert_eq!(out.trim(), "written in the Lab");

    // The Lab's terminal is the sandbox's: its seccomp filter, its own
    // hostname, none of the host's files.
    let r = client()
        .post(format!("{home}api/terminals"))
        .header(COOKIE, &both)
        .header("x-xsrftoken", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let term: Value = r.json().await.unwrap();
    let name = term["name"].as_str().unwrap();
    let mut sh = ws(
        &format!("{home}terminals/websocket/{name}"),
        &[("cookie", both.clone()), ("origin", origin.clone())],
    )
    .await
    .expect("the terminal");
    let data = s.dir.display().to_string();
    let out = terminal(
        &mut sh,
        &format!("grep Seccomp: /proc/self/status; ls {data} 2>&1 | head -1; grep -c ' 0A ' /proc/net/tcp /proc/net/tcp6; echo END-$((6*7))"),
        "END-42",
    )
    .await;
    assert!(out.contains("Seccomp:\t2"), "{out}");
    assert!(
        out.contains("No such file or directory"),
        "the host's data dir is not there: {out}"
    );

    // The job ends: its Lab with it.
    drop((k, k2, sh));
    s.release(&t, &id).await;
    let deadline = Instant::now() + Duration::from_secs(10);
    while client()
        .get(format!("{home}lab"))
        .header(COOKIE, &cookie)
        .send()
        .await
        .is_ok()
    {
        assert!(Instant::now() < deadline, "the Lab outlived its job");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (status, body) = s.post(&t, &lab, json!({})).await;
    assert_eq!(status, 409, "{body}");
    s.stop().await;
}

/// The sandbox owns what answers on the Lab's socket: here it replaces
/// Jupyter with a server of its own that records every byte it is sent and
/// tries to set cordon's cookie. No credential of the user's reaches it,
/// and its cookie does not reach the browser.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attack_a_hostile_lab_server_sees_no_credential() {
    if !lab_installed() {
        return;
    }
    let s = TestServer::start(Db::Sqlite).await.unwrap();
    let t = s.token("acme").await;
    let id = s.submit(&t, held()).await;
    s.wait_running(&t, &id).await;
    let url = open_url(&s, &t, &id).await;
    let port = url
        .split(':')
        .nth(2)
        .unwrap()
        .split('/')
        .next()
        .unwrap()
        .to_string();
    let (home, cookie) = sign_in(&url).await;

    // The job's own shell takes the socket over.
    let evil = r#"
import os, signal, socket
pid = int(open('/tmp/.cordon-lab/pid').read())
os.killpg(os.getpgid(pid), signal.SIGKILL)
os.unlink('/tmp/.cordon-lab/lab.sock')
s = socket.socket(socket.AF_UNIX); s.bind('/tmp/.cordon-lab/lab.sock'); s.listen(16)
open('/workspace/listening', 'w').close()
while True:
    c, _ = s.accept()
    data = b''
    while b'\r\n\r\n' not in data:
        d = c.recv(65536)
        if not d: break
        data += d
    with open('/workspace/seen', 'ab') as f: f.write(data)
    body = b'<script>alert(1)</script>'
    c.sendall(b'HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nSet-Cookie: cordon_lab_PORT=planted; Path=/\r\nSet-Cookie: ok=1\r\nContent-Length: ' + str(len(body)).encode() + b'\r\nConnection: close\r\n\r\n' + body)
    c.close()
"#
    .replace("PORT", &port);
    let r = client()
        .put(s.url(&format!("/v1/jobs/{id}/files/evil.py")))
        .bearer_auth(&t)
        .body(evil)
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success());
    // The Lab's own terminal starts it, inside the job's sandbox.
    let token = xsrf(
        client()
            .get(s.url(&format!("/v1/jobs/{id}/lab/lab")))
            .bearer_auth(&t),
    )
    .await;
    let r = client()
        .post(s.url(&format!("/v1/jobs/{id}/lab/api/terminals")))
        .bearer_auth(&t)
        .header(COOKIE, format!("_xsrf={token}"))
        .header("x-xsrftoken", &token)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let name = r.json::<Value>().await.unwrap()["name"]
        .as_str()
        .unwrap()
        .to_string();
    let mut sh = ws(
        &s.url(&format!("/v1/jobs/{id}/lab/terminals/websocket/{name}")),
        &[("authorization", format!("Bearer {t}"))],
    )
    .await
    .unwrap();
    sh.send(Message::Text(
        json!([
            "stdin",
            "setsid python3 /workspace/evil.py </dev/null >/dev/null 2>&1 &\r"
        ])
        .to_string()
        .into(),
    ))
    .await
    .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, _) = s.get(&t, &format!("/v1/jobs/{id}/files/listening")).await;
        if status == 200 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the hostile server never listened"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // Every way in, with every credential a client holds.
    let browser = client()
        .get(format!("{home}lab"))
        .header(COOKIE, format!("{cookie}; _xsrf=x"))
        .send()
        .await
        .unwrap();
    assert_eq!(browser.status(), 200);
    let cookies: Vec<_> = browser.headers().get_all(SET_COOKIE).iter().collect();
    assert_eq!(
        cookies,
        ["ok=1"],
        "cordon's cookie is not the sandbox's to set"
    );
    let program = bearer_get(&s, &t, &format!("/v1/jobs/{id}/lab/api/contents")).await;
    assert_eq!(program.status(), 200);
    assert!(sandboxed(&program), "{:?}", program.headers());
    let proto = format!("cordon.bearer.{t}, v1.kernel.websocket.jupyter.org");
    let _ = ws(
        &s.url(&format!("/v1/jobs/{id}/lab/api/kernels/x/channels")),
        &[("sec-websocket-protocol", proto)],
    )
    .await;

    let r = bearer_get(&s, &t, &format!("/v1/jobs/{id}/files/seen")).await;
    let seen = r.text().await.unwrap();
    assert_eq!(seen.matches("GET ").count(), 3, "{seen}");
    let session = cookie.split('=').nth(1).unwrap();
    for secret in [t.as_str(), session] {
        assert!(
            !seen.contains(secret),
            "a credential reached the sandbox:\n{seen}"
        );
    }
    assert!(
        !seen.to_ascii_lowercase().contains("authorization"),
        "{seen}"
    );
    assert!(
        seen.contains("_xsrf=x"),
        "Jupyter's own cookie passes: {seen}"
    );
    s.release(&t, &id).await;
    s.stop().await;
}

/// A session's Lab wakes its sandbox, is its tenant's alone, keeps the
/// session from idling out while it is used, and closes with it after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sessions_lab_wakes_it_and_keeps_it_while_used() {
    if !lab_installed() {
        return;
    }
    let model = cordon_testkit::ScriptedServer::start(cordon_testkit::Scenario::new());
    let idle = Duration::from_secs(2);
    let s = TestServer::start_with(Db::Sqlite, |c| {
        with_model(model.url())(c);
        c.session_idle = idle;
    })
    .await
    .unwrap();
    let t = s.token("acme").await;
    let other = s.token("globex").await;
    let (status, created) = s.post(&t, "/v1/sessions", json!({})).await;
    assert_eq!(status, 201, "{created}");
    let id = created["id"].as_str().unwrap();
    let lab = format!("/v1/sessions/{id}/lab");
    assert_eq!(s.post(&other, &lab, json!({})).await.0, 404);
    assert_eq!(s.get(&other, &format!("{lab}/api/contents")).await.0, 404);

    let (status, body) = s.post(&t, &lab, json!({})).await;
    assert_eq!(status, 200, "{body}");
    let url = body["url"].as_str().unwrap();
    assert!(
        url.contains(&format!("/v1/sessions/{id}/lab/?cordon_ticket=")),
        "{url}"
    );
    let r = client().get(url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let cookie = r.headers()[SET_COOKIE]
        .to_str()
        .unwrap()
        .split(';')
        .next()
        .unwrap()
        .to_string();
    let home = format!(
        "{}{}",
        url.split("/v1/").next().unwrap(),
        r.headers()[LOCATION].to_str().unwrap()
    );
    let (status, listing) = s.get(&t, &format!("{lab}/api/contents")).await;
    assert_eq!(status, 200, "{listing}");

    // Used for three idle periods: still there.
    let until = Instant::now() + idle * 3;
    while Instant::now() < until {
        let r = client()
            .get(format!("{home}api/status"))
            .header(COOKIE, &cookie)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "the Lab closed while in use");
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Left alone: the session idles out, and its Lab with it (watched
    // without the cookie, which the Lab answers without asking Jupyter).
    let deadline = Instant::now() + idle * 5;
    while client()
        .get(format!("{home}api/status"))
        .send()
        .await
        .is_ok()
    {
        assert!(
            Instant::now() < deadline,
            "the Lab outlived its idle session"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Opening it again wakes the session again.
    let (status, body) = s.post(&t, &lab, json!({})).await;
    assert_eq!(status, 200, "{body}");
    s.stop().await;
}

/// A job that ends while its Lab starts: the client lost a race (409, and
/// the job's files named), the server did not fail (the fuzzer's 503).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_that_ends_while_its_lab_starts_is_a_conflict() {
    if !lab_installed() {
        return;
    }
    let s = TestServer::start(Db::Sqlite).await.unwrap();
    let t = s.token("acme").await;
    // The job ends the moment Jupyter's start makes its directory.
    let id = s
        .submit(
            &t,
            shell("while [ ! -d /tmp/.cordon-lab ]; do sleep 0.02; done"),
        )
        .await;
    s.wait_running(&t, &id).await;
    let (status, body) = s.post(&t, &format!("/v1/jobs/{id}/lab"), json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(body["error"]["code"], "not_running", "{body}");
    s.wait(&t, &id).await;
    // Asked again once it has ended, the answer names its files.
    let (status, body) = s.post(&t, &format!("/v1/jobs/{id}/lab"), json!({})).await;
    assert_eq!(status, 409, "{body}");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("/files"),
        "{body}"
    );
}
