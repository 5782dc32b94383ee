//! Previews of what a running job's sandbox serves on a port: the link
//! (its own origin, a cookie for that origin alone, an expiry), the
//! programs' way (the tenant's bearer token on the preview's origin),
//! WebSockets through it, and the attacks: no credentials, another
//! tenant's token or job, an expired or forged link, previews turned off,
//! a preview outliving its sandbox.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use reqwest::StatusCode;
use reqwest::header::{LOCATION, SET_COOKIE};
use serde_json::{Value, json};
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

/// A job serving a page on 8000 and a WebSocket echo on 8001 until the
/// test uploads `release`.
fn serving() -> Value {
    let server = include_str!("../common/page_and_echo.py");
    shell(&format!(
        "echo '<h1>made in the sandbox</h1>' > index.html
cat > serve.py <<'PY'
{server}PY
python3 serve.py 8000 >/dev/null 2>&1 &
python3 serve.py 8001 >/dev/null 2>&1 &
while [ ! -f /workspace/release ]; do sleep 0.1; done"
    ))
}

fn client() -> reqwest::Client {
    reqwest::Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Waits until `port` listens in job `id`'s sandbox.
async fn listening(s: &TestServer, t: &str, id: &str, port: u16) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = s.get(t, &format!("/v1/jobs/{id}/ports")).await;
        assert_eq!(status, 200, "{body}");
        let open = body["ports"].as_array().unwrap();
        if open.iter().any(|p| p["port"] == port) {
            assert!(
                open.iter()
                    .any(|p| p["port"] == port && p["previewable"] == true),
                "{body}"
            );
            return;
        }
        assert!(
            Instant::now() < deadline,
            "port {port} never listened: {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A browser's way in: the link spent for the preview's cookie. Returns
/// where it is sent on, and the cookie (`name=value`).
async fn sign_in(url: &str, origin: &str) -> (String, String) {
    let r = client().get(url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER, "{url}");
    let to = r.headers()[LOCATION].to_str().unwrap().to_string();
    assert!(!to.contains("cordon_link"), "{to}");
    let set = r.headers()[SET_COOKIE].to_str().unwrap().to_string();
    for attr in ["HttpOnly", "SameSite=Strict", "Path=/"] {
        assert!(set.contains(attr), "{set}");
    }
    (
        format!("{origin}{to}"),
        set.split(';').next().unwrap().to_string(),
    )
}

#[tokio::test]
async fn a_job_s_server_is_previewed_on_an_origin_of_its_own() {
    let Some(s) = TestServer::start(Db::Sqlite).await else {
        return;
    };
    let t = s.token("acme").await;
    let other = s.token("zeta").await;
    // The job asks for no network: with previews on, its loopback is up
    // for them, and nothing leaves.
    let id = s.submit(&t, serving()).await;
    s.wait_running(&t, &id).await;
    listening(&s, &t, &id, 8000).await;
    listening(&s, &t, &id, 8001).await;

    let (status, p) = s
        .post(&t, &format!("/v1/jobs/{id}/ports/8000/preview"), json!({}))
        .await;
    assert_eq!(status, 200, "{p}");
    assert_eq!(p["port"], 8000);
    let (url, origin) = (p["url"].as_str().unwrap(), p["origin"].as_str().unwrap());
    assert!(url.starts_with(&format!("{origin}/?cordon_link=")), "{url}");
    assert_ne!(origin, s.url(""), "a preview on the API's own origin");
    assert!(!origin.ends_with(&format!(":{}", s.url("").rsplit(':').next().unwrap())));

    // A browser: the link for a cookie of that origin, then the page.
    let (to, cookie) = sign_in(url, origin).await;
    let page = client()
        .get(&to)
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.text().await.unwrap(), "<h1>made in the sandbox</h1>\n");
    // The link works for as many browsers as it is given to, until it
    // expires; the same preview is answered a second time.
    let _ = sign_in(url, origin).await;
    let again = client()
        .post(s.url(&format!("/v1/jobs/{id}/ports/8000/preview")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(again.status(), 200, "an empty body is taken");
    let again: Value = again.json().await.unwrap();
    assert_eq!(again["origin"], p["origin"]);

    // Nothing, a forged link, another tenant's token: refused.
    let index = format!("{origin}/index.html");
    let bare = client().get(&index).send().await.unwrap();
    assert_eq!(bare.status(), StatusCode::UNAUTHORIZED);
    let (expires, mac) = url
        .split_once("cordon_link=")
        .unwrap()
        .1
        .split_once('.')
        .unwrap();
    let later: u64 = expires.parse::<u64>().unwrap() + 3600;
    for forged in [
        format!("{origin}/?cordon_link={later}.{mac}"),
        format!("{origin}/?cordon_link={expires}.{}", "0".repeat(64)),
        format!("{origin}/?cordon_link=garbage"),
    ] {
        let r = client().get(&forged).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::UNAUTHORIZED, "{forged}");
    }
    let theirs = client()
        .get(&index)
        .bearer_auth(&other)
        .send()
        .await
        .unwrap();
    assert_eq!(theirs.status(), StatusCode::NOT_FOUND, "another tenant's");
    let unknown = client()
        .get(&index)
        .bearer_auth("nope")
        .send()
        .await
        .unwrap();
    assert_eq!(unknown.status(), StatusCode::UNAUTHORIZED);
    // A program with the tenant's own token: in, and the token stays here.
    let ours = client().get(&index).bearer_auth(&t).send().await.unwrap();
    assert_eq!(ours.status(), 200);

    // Another tenant cannot see the job's ports or ask for a link.
    for path in [
        format!("/v1/jobs/{id}/ports"),
        format!("/v1/jobs/{id}/ports/8000/preview"),
    ] {
        let (status, _) = s.post(&other, &path, json!({})).await;
        assert!(status == 404 || status == 405, "{path}: {status}");
    }
    let (status, _) = s.get(&other, &format!("/v1/jobs/{id}/ports")).await;
    assert_eq!(status, 404);

    // An expired link lets nobody in.
    let (_, short) = s
        .post(
            &t,
            &format!("/v1/jobs/{id}/ports/8000/preview"),
            json!({"expires_in": 1}),
        )
        .await;
    tokio::time::sleep(Duration::from_millis(2100)).await;
    let r = client()
        .get(short["url"].as_str().unwrap())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::UNAUTHORIZED);
    assert!(r.text().await.unwrap().contains("expired"));

    // Bad requests say what is wrong.
    for (path, body) in [
        ("ports/0/preview", json!({})),
        ("ports/http/preview", json!({})),
        ("ports/8000/preview", json!({"expires_in": 0})),
        ("ports/8000/preview", json!({"expires_in": 604_801})),
        ("ports/8000/preview", json!({"ttl": 5})),
    ] {
        let (status, b) = s.post(&t, &format!("/v1/jobs/{id}/{path}"), body).await;
        assert_eq!(status, 400, "{path}: {b}");
        assert_eq!(b["error"]["code"], "invalid_request", "{b}");
    }

    // WebSockets go through, with the tenant's token.
    let (_, w) = s
        .post(&t, &format!("/v1/jobs/{id}/ports/8001/preview"), json!({}))
        .await;
    let ws_origin = w["origin"]
        .as_str()
        .unwrap()
        .replacen("http://", "ws://", 1);
    let mut req = format!("{ws_origin}/echo").into_client_request().unwrap();
    req.headers_mut()
        .insert("authorization", format!("Bearer {t}").parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    socket.send(Message::text("ping")).await.unwrap();
    let echo = tokio::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(echo, Message::text("ping"));
    drop(socket);

    // The preview ends with the sandbox.
    s.release(&t, &id).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert!(client().get(&index).bearer_auth(&t).send().await.is_err());
    let (status, b) = s
        .post(&t, &format!("/v1/jobs/{id}/ports/8000/preview"), json!({}))
        .await;
    assert_eq!(status, 409, "{b}");
}

#[tokio::test]
async fn an_operator_may_turn_previews_off() {
    let Some(s) = TestServer::start_with(Db::Sqlite, |c| c.previews = false).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            shell(
                "python3 -c \"import socket; socket.socket().bind(('127.0.0.1', 0))\" \
                 2>&1 | tail -1; while [ ! -f /workspace/release ]; do sleep 0.1; done",
            ),
        )
        .await;
    s.wait_running(&t, &id).await;
    let (status, b) = s
        .post(&t, &format!("/v1/jobs/{id}/ports/8000/preview"), json!({}))
        .await;
    assert_eq!(status, 403, "{b}");
    assert_eq!(b["error"]["code"], "previews_off");
    let (_, ports) = s.get(&t, &format!("/v1/jobs/{id}/ports")).await;
    assert_eq!(ports["previews"], false, "{ports}");
    // Without previews, a job whose network is off keeps its loopback
    // down, as before.
    let job = s.release(&t, &id).await;
    assert!(job["stdout"].as_str().unwrap().contains("Error"), "{job}");
}

/// A client that reaches `names` (host names under `localhost`) at the
/// server's own address, as a browser resolves them.
fn named_client(s: &TestServer, names: &[&str]) -> reqwest::Client {
    let addr: std::net::SocketAddr = s.base.strip_prefix("http://").unwrap().parse().unwrap();
    names
        .iter()
        .fold(reqwest::Client::builder(), |b, n| b.resolve(n, addr))
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// With `--sandbox-domain`, each port of each job's and session's sandbox
/// is a host name of its own, `{port}-{label}.{domain}`: a link, a cookie
/// of that name alone, a program's token, WebSockets; the agent is told
/// the address; nothing reaches the API or another port's preview.
#[tokio::test]
async fn previews_by_name_under_a_sandbox_domain() {
    let model = cordon_testkit::ScriptedServer::start(
        cordon_testkit::Scenario::new()
            .turn(cordon_testkit::Turn::text("Serving it.").with_tool_call(
                "t1",
                "bash",
                json!({"command": "echo '<h1>the session</h1>' > index.html; \
                    python3 -m http.server 5173 --bind 127.0.0.1 >/dev/null 2>&1 & \
                    for i in $(seq 100); do python3 -c 'import socket; socket.create_connection((\"127.0.0.1\", 5173))' 2>/dev/null && break; sleep 0.1; done"}),
            ))
            .turn(cordon_testkit::Turn::text("It is up.")),
    );
    let Some(s) = TestServer::start_with(Db::Sqlite, |c| {
        with_model(model.url())(c);
        c.sandbox_domain = Some("localhost".parse().unwrap());
    })
    .await
    else {
        return;
    };
    let api_port = s.base.rsplit(':').next().unwrap().to_string();
    let t = s.token("acme").await;
    let other = s.token("zeta").await;
    let id = s.submit(&t, serving()).await;
    s.wait_running(&t, &id).await;
    listening(&s, &t, &id, 8000).await;
    listening(&s, &t, &id, 8001).await;
    let label = id.replacen('_', "-", 1);
    let (name, name2) = (
        format!("8000-{label}.localhost"),
        format!("8001-{label}.localhost"),
    );
    let web = named_client(&s, &[&name, &name2]);

    // The link names the port's own host, on the server's port.
    let (status, p) = s
        .post(&t, &format!("/v1/jobs/{id}/ports/8000/preview"), json!({}))
        .await;
    assert_eq!(status, 200, "{p}");
    let origin = format!("http://{name}:{api_port}");
    assert_eq!(p["origin"], origin.as_str(), "{p}");
    let url = p["url"].as_str().unwrap();
    assert!(url.starts_with(&format!("{origin}/?cordon_link=")), "{url}");

    // A browser: the link for a cookie of that name alone, then the page.
    let r = web.get(url).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SEE_OTHER);
    let set = r.headers()[SET_COOKIE].to_str().unwrap().to_string();
    // Lax: cordon's links reach the name from another site.
    for attr in ["HttpOnly", "SameSite=Lax", "Path=/"] {
        assert!(set.contains(attr), "{set}");
    }
    assert!(!set.to_ascii_lowercase().contains("domain="), "{set}");
    let cookie = set.split(';').next().unwrap().to_string();
    let index = format!("{origin}/index.html");
    let page = web
        .get(&index)
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(page.status(), 200);
    assert_eq!(page.text().await.unwrap(), "<h1>made in the sandbox</h1>\n");
    // No name under the domain is cordon's own: not one that names no
    // sandbox, where the web UI would run among the previews.
    let stray = named_client(&s, &["app.localhost"])
        .get(format!("http://app.localhost:{api_port}/"))
        .send()
        .await
        .unwrap();
    assert_eq!(stray.status(), 404);
    // The API is not served on a preview's name: the sandbox answers.
    let api = web
        .get(format!("{origin}/v1/jobs"))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(api.status(), 404);
    assert!(!api.text().await.unwrap().contains(&id));

    // Refused: nothing, another port's cookie, a forged link, an unknown
    // token, another tenant's token (as if nothing were there).
    let origin2 = format!("http://{name2}:{api_port}");
    let bare = web.get(&index).send().await.unwrap();
    assert_eq!(bare.status(), StatusCode::UNAUTHORIZED);
    let borrowed = web
        .get(format!("{origin2}/index.html"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(borrowed.status(), StatusCode::UNAUTHORIZED);
    let (expires, _) = url
        .split_once("cordon_link=")
        .unwrap()
        .1
        .split_once('.')
        .unwrap();
    let forged = format!("{origin}/?cordon_link={expires}.{}", "0".repeat(64));
    assert_eq!(
        web.get(&forged).send().await.unwrap().status(),
        StatusCode::UNAUTHORIZED
    );
    for (token, want) in [
        ("nope", StatusCode::UNAUTHORIZED),
        (other.as_str(), StatusCode::NOT_FOUND),
    ] {
        for o in [&origin, &origin2] {
            let r = web
                .get(format!("{o}/index.html"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            assert_eq!(r.status(), want, "{o} {token}");
        }
    }
    // A program with the tenant's token reaches a port no link was asked
    // for, and WebSockets go through.
    let ours = web
        .get(format!("{origin2}/index.html"))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    assert_eq!(ours.status(), 200);
    let mut req = format!("ws://127.0.0.1:{api_port}/echo")
        .into_client_request()
        .unwrap();
    let h = req.headers_mut();
    h.insert("host", format!("{name2}:{api_port}").parse().unwrap());
    h.insert("authorization", format!("Bearer {t}").parse().unwrap());
    let (mut socket, _) = tokio_tungstenite::connect_async(req).await.unwrap();
    socket.send(Message::text("ping")).await.unwrap();
    let echo = tokio::time::timeout(Duration::from_secs(10), socket.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(echo, Message::text("ping"));
    drop(socket);

    // The name ends with the sandbox.
    s.release(&t, &id).await;
    tokio::time::sleep(Duration::from_millis(200)).await;
    let gone = web.get(&index).header("cookie", &cookie).send().await;
    assert!(
        gone.as_ref()
            .map_or(true, |r| r.status() == StatusCode::NOT_FOUND),
        "{gone:?}"
    );

    // A session's agent is told its ports' address, and one it serves is
    // reached there.
    let session = s.new_session(&t).await;
    s.say(&t, &session, "serve the page").await;
    let system = model.requests()[0].body["system"].to_string();
    let slabel = session.replacen('_', "-", 1);
    let want = format!("http://3000-{slabel}.localhost:{api_port}");
    assert!(system.contains(&want), "{want} not in {system}");
    let sname = format!("5173-{slabel}.localhost");
    let r = named_client(&s, &[&sname])
        .get(format!("http://{sname}:{api_port}/index.html"))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body, "<h1>the session</h1>\n");
    s.stop().await;
}
