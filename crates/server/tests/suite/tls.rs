//! `cordon serve` over TLS: the API, its event streams, the web UI, `/mcp`,
//! the live view's WebSocket and a Lab's own origin, all with one
//! self-signed certificate; and nothing left in the clear.

use crate::common;

use std::sync::Arc;
use std::time::{Duration, Instant};

use common::*;
use futures_util::StreamExt;
use serde_json::json;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;

struct Cert {
    _dir: tempfile::TempDir,
    der: Vec<u8>,
    pem: String,
    tls: cordon_listen::Tls,
}

fn cert() -> Cert {
    let dir = tempfile::tempdir().unwrap();
    let c = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, c.cert.pem()).unwrap();
    std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
    Cert {
        tls: cordon_listen::Tls::load(&cert, &key).unwrap(),
        der: c.cert.der().to_vec(),
        pem: c.cert.pem(),
        _dir: dir,
    }
}

/// A server over TLS, and clients that trust its certificate alone.
async fn start(c: &Cert) -> TestServer {
    let tls = c.tls.clone();
    let mut s = TestServer::start_with(Db::Sqlite, move |cfg| cfg.tls = Some(tls))
        .await
        .unwrap();
    let port = s.running.as_ref().unwrap().addr.port();
    s.base = format!("https://localhost:{port}");
    s.client = client(c);
    s
}

fn client(c: &Cert) -> reqwest::Client {
    reqwest::Client::builder()
        .tls_certs_only([reqwest::Certificate::from_pem(c.pem.as_bytes()).unwrap()])
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// A WebSocket over TLS to `url` (`https://…`), trusting `c` alone.
async fn wss(
    c: &Cert,
    url: &str,
    headers: &[(&'static str, String)],
) -> tokio_tungstenite::WebSocketStream<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(c.der.clone().into()).unwrap();
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::aws_lc_rs::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots)
    .with_no_client_auth();
    let authority = url
        .strip_prefix("https://")
        .unwrap()
        .split('/')
        .next()
        .unwrap();
    let tcp = tokio::net::TcpStream::connect(authority.replace("localhost", "127.0.0.1"))
        .await
        .unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .unwrap();
    let mut req = url
        .replacen("https://", "wss://", 1)
        .into_client_request()
        .unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(*k, v.parse().unwrap());
    }
    tokio_tungstenite::client_async(req, tls).await.unwrap().0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_ui_mcp_and_live_view_are_served_over_tls() {
    let c = cert();
    let s = start(&c).await;
    let t = s.token("acme").await;
    let port = s.running.as_ref().unwrap().addr.port();

    // Plain HTTP to the TLS port gets no answer.
    let plain = reqwest::Client::new()
        .get(format!("http://127.0.0.1:{port}/health"))
        .timeout(Duration::from_secs(5))
        .send()
        .await;
    assert!(plain.is_err(), "{plain:?}");
    // Nor does a client that does not trust the certificate.
    let untrusting = reqwest::Client::new().get(s.url("/health")).send().await;
    assert!(untrusting.is_err(), "{untrusting:?}");

    let r = s.client.get(s.url("/health")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let r = s.client.get(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.text().await.unwrap().contains("<html"));

    // A job, and its event stream to the end.
    let id = s.submit(&t, shell("echo over-tls")).await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["stdout"], "over-tls\n");
    let events = s
        .client
        .get(s.url(&format!("/v1/jobs/{id}/events")))
        .bearer_auth(&t)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(events.contains("event: finished"), "{events}");

    // /mcp: a session opens.
    let init = json!({
        "jsonrpc": "2.0", "id": 1, "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                   "clientInfo": {"name": "test", "version": "1"}}
    });
    let r = s
        .client
        .post(s.url("/mcp"))
        .bearer_auth(&t)
        .header("accept", "application/json, text/event-stream")
        .json(&init)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(r.headers().contains_key("mcp-session-id"));

    // The live view: RFB's greeting over a WebSocket over TLS.
    let id = s
        .submit(
            &t,
            json!({"kind": "gui", "display": "640x480", "steps": [
                {"tool": "shell", "command": "while [ ! -f /workspace/release ]; do sleep 0.05; done"}
            ]}),
        )
        .await;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, job) = s.get(&t, &format!("/v1/jobs/{id}")).await;
        if job["live_desktop"] == true {
            break;
        }
        assert!(Instant::now() < deadline, "no live desktop: {job}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut ws = wss(
        &c,
        &s.url(&format!("/v1/jobs/{id}/vnc")),
        &[("authorization", format!("Bearer {t}"))],
    )
    .await;
    let mut greeting = Vec::new();
    while greeting.len() < 12 {
        match tokio::time::timeout(Duration::from_secs(20), ws.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            Message::Binary(b) => greeting.extend_from_slice(&b),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(&greeting[..12], b"RFB 003.008\n");
    drop(ws);
    assert_eq!(s.release(&t, &id).await["state"], "succeeded");
}

/// A Lab's own origin is served over TLS too: its link says `https`, its
/// cookie is `Secure`, and its pages load over TLS.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_labs_origin_is_served_over_tls() {
    if cordon_lab::installed(&cordon_lab::cache_dir()).is_none() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "no lab environment: run `cordon lab setup` (scripts/test does)"
        );
        eprintln!("skipped: no lab environment (cordon lab setup)");
        return;
    }
    let c = cert();
    let s = start(&c).await;
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            shell("while [ ! -f /workspace/release ]; do sleep 0.1; done"),
        )
        .await;
    s.wait_running(&t, &id).await;
    let (status, body) = s.post(&t, &format!("/v1/jobs/{id}/lab"), json!({})).await;
    assert_eq!(status, 200, "{body}");
    let url = body["url"].as_str().unwrap();
    assert!(url.starts_with("https://localhost:"), "{url}");
    let r = s.client.get(url).send().await.unwrap();
    assert_eq!(r.status(), 303);
    let set = r.headers()["set-cookie"].to_str().unwrap().to_string();
    assert!(set.contains("; Secure"), "{set}");
    let cookie = set.split(';').next().unwrap().to_string();
    let origin = url.split("/v1/").next().unwrap();
    let r = s
        .client
        .get(format!("{origin}/v1/jobs/{id}/lab/api/contents"))
        .header("cookie", &cookie)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    s.release(&t, &id).await;
}
