//! Secrets: the real value reaches the secret's host, the sandbox side
//! holds only the placeholder, and other hosts get the placeholder.

mod common;

use std::sync::Arc;

use bytes::Bytes;
use common::*;
use cordon_net::{BrokerConfig, Decision, Intercept, Reason, Secret};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio_rustls::rustls::{self, RootCertStore};

const VALUE: &str = "s3cr3t-real-value";

fn roots_with(der: &rustls::pki_types::CertificateDer<'static>) -> RootCertStore {
    let mut r = RootCertStore::empty();
    r.add(der.clone()).unwrap();
    r
}

/// CONNECT, TLS trusting `roots`, then requests; returns (status, body,
/// x-echo-auth) per request.
async fn through(
    b: &TestBroker,
    host: &str,
    port: u16,
    roots: RootCertStore,
    reqs: &[(&str, &str)],
) -> std::io::Result<Vec<(u16, String, String)>> {
    let (status, body, s) = connect(b.addr, &format!("{host}:{port}")).await;
    assert_eq!(status, 200, "{body}");
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(
            rustls::pki_types::ServerName::try_from(host.to_string()).unwrap(),
            s,
        )
        .await?;
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(tls))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut out = Vec::new();
    for (path, auth) in reqs {
        let req = hyper::Request::get(*path)
            .header("host", host)
            .header("authorization", *auth)
            .header("x-api-key", "CORDON_SECRET_TOKEN")
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = sender
            .send_request(req)
            .await
            .map_err(std::io::Error::other)?;
        let status = resp.status().as_u16();
        let echo = resp
            .headers()
            .get("x-echo-auth")
            .map(|v| v.to_str().unwrap().to_string())
            .unwrap_or_default();
        let body = String::from_utf8(
            resp.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap();
        out.push((status, body, echo));
    }
    Ok(out)
}

#[tokio::test]
async fn the_secret_s_host_gets_the_value_the_sandbox_keeps_the_placeholder() {
    let tls = tls();
    let port = tls_http_server(tls.server.clone()).await;
    let upstream_root = roots_with(&tls_root_der(&tls));
    let secret = Secret::new("TOKEN", VALUE, &[format!("upstream.test:{port}")]).unwrap();
    let icpt = Arc::new(Intercept::with_roots(vec![secret], upstream_root.clone()).unwrap());
    let config = BrokerConfig {
        intercept: Some(icpt.clone()),
        ..Default::default()
    };
    let mut b = TestBroker::start(
        policy(
            &[
                format!("upstream.test:{port}"),
                format!("other.test:{port}"),
            ],
            true,
        ),
        config,
    )
    .await;

    use base64::Engine;
    let basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode("git:CORDON_SECRET_TOKEN")
    );
    let got = through(
        &b,
        "upstream.test",
        port,
        roots_with(icpt.ca_der()),
        &[
            ("/a?k=CORDON_SECRET_TOKEN", "Bearer CORDON_SECRET_TOKEN"),
            ("/b", &basic),
        ],
    )
    .await
    .unwrap();
    assert_eq!(got[0].0, 200);
    assert_eq!(
        got[0].1,
        format!("/a?k={VALUE} host=upstream.test:{port} auth=Bearer {VALUE} key={VALUE}")
    );
    // The response header that repeats the value reaches the sandbox as the
    // placeholder again.
    assert_eq!(got[0].2, "Bearer CORDON_SECRET_TOKEN");
    let real_basic = format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("git:{VALUE}"))
    );
    assert!(
        got[1].1.contains(&format!("auth={real_basic}")),
        "{}",
        got[1].1
    );
    let ev = b.event().await;
    assert!(ev.intercepted, "{ev:?}");
    assert_eq!(
        (ev.decision, ev.reason),
        (Decision::Allowed, Reason::Listed)
    );

    // Another host: not intercepted (the sandbox sees the real certificate)
    // and the placeholder goes out as it is.
    let got = through(
        &b,
        "other.test",
        port,
        upstream_root,
        &[("/c", "Bearer CORDON_SECRET_TOKEN")],
    )
    .await
    .unwrap();
    assert_eq!(
        got[0].1,
        format!("/c host=other.test auth=Bearer CORDON_SECRET_TOKEN key=CORDON_SECRET_TOKEN")
    );
    assert!(!b.event().await.intercepted);
}

#[tokio::test]
async fn an_unverifiable_real_host_gets_nothing() {
    let tls = tls();
    let port = tls_http_server(tls.server.clone()).await;
    let secret = Secret::new("TOKEN", VALUE, &[format!("upstream.test:{port}")]).unwrap();
    // The broker trusts no root: the upstream's certificate fails.
    let icpt = Arc::new(Intercept::with_roots(vec![secret], RootCertStore::empty()).unwrap());
    let config = BrokerConfig {
        intercept: Some(icpt.clone()),
        ..Default::default()
    };
    let mut b = TestBroker::start(policy(&[format!("upstream.test:{port}")], true), config).await;
    assert!(
        through(
            &b,
            "upstream.test",
            port,
            roots_with(icpt.ca_der()),
            &[("/", "Bearer CORDON_SECRET_TOKEN")]
        )
        .await
        .is_err()
    );
    let ev = b.event().await;
    assert_eq!(
        (ev.decision, ev.reason),
        (Decision::Failed, Reason::UpstreamUnverified)
    );
}

/// The test certificate, as the root the broker checks upstreams with.
fn tls_root_der(tls: &Tls) -> rustls::pki_types::CertificateDer<'static> {
    tls.root.clone()
}
