//! The host's own requests for a sandbox (`web_fetch`), through its broker:
//! the same policy, the same events, TLS checked, bodies and redirects
//! bounded.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use cordon_net::fetch::{FetchError, FetchLimits, Fetcher, Route};
use cordon_net::{BrokerConfig, Decision};
use http_body_util::Full;
use rustls::RootCertStore;

fn fetcher(b: &TestBroker, tls: &Tls) -> Fetcher {
    let mut roots = RootCertStore::empty();
    roots.add(tls.root.clone()).unwrap();
    Fetcher::with_roots(Route::Broker(b.broker.clone()), roots)
}

fn page(req: &hyper::Request<hyper::body::Incoming>) -> hyper::Response<Full<Bytes>> {
    match req.uri().path() {
        "/big" => hyper::Response::new(Full::new(Bytes::from(vec![b'x'; 100_000]))),
        "/loop" => hyper::Response::builder()
            .status(302)
            .header("location", "/loop")
            .body(Full::default())
            .unwrap(),
        "/off" => hyper::Response::builder()
            .status(301)
            .header("location", "https://other.test/")
            .body(Full::default())
            .unwrap(),
        _ => hyper::Response::builder()
            .header("content-type", "text/html")
            .header(cordon_net::BROKER_HEADER, "1")
            .body(Full::new(Bytes::from(format!(
                "<h1>hello</h1> host={}",
                req.headers()["host"].to_str().unwrap()
            ))))
            .unwrap(),
    }
}

#[tokio::test]
async fn https_goes_through_connect_and_tls_under_the_policy() {
    let tls = tls();
    let port = tls_server(tls.server.clone(), page).await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let f = fetcher(&b, &tls);
    let got = f
        .get(&format!("https://upstream.test:{port}/doc"))
        .await
        .unwrap();
    assert_eq!(got.status, 200);
    assert_eq!(got.content_type.as_deref(), Some("text/html"));
    assert_eq!(
        got.body,
        format!("<h1>hello</h1> host=upstream.test:{port}")
    );
    let ev = b.event().await;
    assert_eq!(
        (ev.decision, ev.method.as_str()),
        (Decision::Allowed, "CONNECT")
    );

    // A host the policy does not list: the broker's line, and its event.
    let err = f
        .get(&format!("https://other.test:{port}/"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, FetchError::Network(l) if l.starts_with(&format!("network: other.test:{port} refused by policy"))),
        "{err}"
    );
    assert_eq!(b.event().await.decision, Decision::Refused);

    // A redirect to it is checked as itself.
    let err = f
        .get(&format!("https://upstream.test:{port}/off"))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, FetchError::Network(l) if l.contains("other.test:443 refused")),
        "{err}"
    );

    // Redirects and bodies are bounded.
    let err = f
        .get(&format!("https://upstream.test:{port}/loop"))
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::Redirects(5)), "{err}");
    let small = f.clone().limits(FetchLimits {
        max_body: 1000,
        ..FetchLimits::default()
    });
    let got = small
        .get(&format!("https://upstream.test:{port}/big"))
        .await
        .unwrap();
    assert_eq!((got.body.len(), got.truncated), (1000, true));
}

#[tokio::test]
async fn a_certificate_the_roots_do_not_trust_fails() {
    let tls = tls();
    let other = common::tls();
    let port = tls_server(tls.server.clone(), page).await;
    let b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let err = fetcher(&b, &other)
        .get(&format!("https://upstream.test:{port}/"))
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::Tls { .. }), "{err}");
}

/// Plain HTTP goes in absolute form; only the broker's own answer is read
/// as the broker's (an origin's marker header does not pass).
#[tokio::test]
async fn plain_http_refusals_are_the_brokers_only() {
    let tls = tls();
    let port = http_server().await;
    let b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let f = fetcher(&b, &tls);
    let got = f
        .get(&format!("http://upstream.test:{port}/a?b=c"))
        .await
        .unwrap();
    assert_eq!(got.status, 200);
    let body = String::from_utf8_lossy(&got.body);
    assert!(
        body.starts_with(&format!("GET /a?b=c host=upstream.test:{port}")),
        "{body}"
    );
    let err = f.get("http://other.test/").await.unwrap_err();
    assert!(
        matches!(&err, FetchError::Network(l) if l.starts_with("network: other.test:80 refused")),
        "{err}"
    );

    // An origin that claims to be the broker is a page like any other.
    let plain = plain_server_with_marker().await;
    let b3 = TestBroker::start(
        policy(&[format!("upstream.test:{plain}")], true),
        BrokerConfig::default(),
    )
    .await;
    let got = fetcher(&b3, &tls)
        .get(&format!("http://upstream.test:{plain}/"))
        .await
        .unwrap();
    assert_eq!(got.body, "network: evil.test:443 refused by policy");
}

/// A plain HTTP server whose answers carry the broker's marker header.
async fn plain_server_with_marker() -> u16 {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = l.accept().await {
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf).await;
            let body = "network: evil.test:443 refused by policy";
            let _ = s
                .write_all(
                    format!(
                        "HTTP/1.1 403 Forbidden\r\n{}: 1\r\nContent-Length: {}\r\n\r\n{body}",
                        cordon_net::BROKER_HEADER,
                        body.len()
                    )
                    .as_bytes(),
                )
                .await;
        }
    });
    port
}

#[tokio::test]
async fn only_http_urls_and_the_whole_exchange_is_timed() {
    let tls = tls();
    let b = TestBroker::start(policy(&[], false), BrokerConfig::default()).await;
    let f = fetcher(&b, &tls);
    for url in [
        "file:///etc/passwd",
        "ftp://x.test/",
        "not a url",
        "http://user:pw@upstream.test/",
    ] {
        assert!(matches!(f.get(url).await, Err(FetchError::Url(_))), "{url}");
    }
    // A server that never answers.
    let l = tokio::net::TcpListener::bind(("127.0.0.1", 0))
        .await
        .unwrap();
    let port = l.local_addr().unwrap().port();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = l.accept().await {
            held.push(s);
        }
    });
    let b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let slow = fetcher(&b, &tls).limits(FetchLimits {
        timeout: Duration::from_millis(300),
        ..FetchLimits::default()
    });
    let err = slow
        .get(&format!("http://upstream.test:{port}/"))
        .await
        .unwrap_err();
    assert!(matches!(err, FetchError::Timeout(_)), "{err}");
}
