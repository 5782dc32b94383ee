//! Secrets: the real value reaches the secret's host, the sandbox side
//! holds only the placeholder, and other hosts get the placeholder.

use crate::common;

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

/// What the sandbox's client got for one request.
struct Seen {
    status: u16,
    reason: Option<Vec<u8>>,
    headers: http::HeaderMap,
    trailers: Option<http::HeaderMap>,
    body: String,
}

/// CONNECT, TLS trusting `roots`, then `reqs` one after another on the
/// tunnel.
async fn exchange(
    b: &TestBroker,
    host: &str,
    port: u16,
    roots: RootCertStore,
    reqs: Vec<hyper::Request<Full<Bytes>>>,
) -> std::io::Result<Vec<Seen>> {
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
    for req in reqs {
        let resp = sender
            .send_request(req)
            .await
            .map_err(std::io::Error::other)?;
        let (parts, body) = resp.into_parts();
        let body = body.collect().await.unwrap();
        out.push(Seen {
            status: parts.status.as_u16(),
            reason: parts
                .extensions
                .get::<hyper::ext::ReasonPhrase>()
                .map(|r| r.as_bytes().to_vec()),
            headers: parts.headers,
            trailers: body.trailers().cloned(),
            body: String::from_utf8(body.to_bytes().to_vec()).unwrap(),
        });
    }
    Ok(out)
}

/// GET `path` to `host` with `auth` and the placeholder as `x-api-key`.
fn get(host: &str, path: &str, auth: &str) -> hyper::Request<Full<Bytes>> {
    hyper::Request::get(path)
        .header("host", host)
        .header("authorization", auth)
        .header("x-api-key", "CORDON_SECRET_TOKEN")
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// [`exchange`] of [`get`]s; returns (status, body, x-echo-auth) per
/// request.
async fn through(
    b: &TestBroker,
    host: &str,
    port: u16,
    roots: RootCertStore,
    reqs: &[(&str, &str)],
) -> std::io::Result<Vec<(u16, String, String)>> {
    let reqs = reqs
        .iter()
        .map(|(path, auth)| get(host, path, auth))
        .collect();
    Ok(exchange(b, host, port, roots, reqs)
        .await?
        .into_iter()
        .map(|s| {
            let echo = s
                .headers
                .get("x-echo-auth")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            (s.status, s.body, echo)
        })
        .collect())
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

/// A value with characters percent-encoding changes (and whose base64
/// differs between the alphabets), for headers, and one the request
/// target can carry (a space cannot go there).
const SPACED: &str = "s3cr3t/v+al=ue&50% off?~>";
const IN_URL: &str = "k3y/v+al=ue&50%";

/// A header the mirror sends that holds no secret: it reaches the sandbox
/// byte for byte, base64 and escapes included.
const PLAIN: &str = "kept dGhpcyBpcyBmaW5l==; n=%41%2b a+b";

/// `bytes` percent-encoded, all but unreserved characters, with hex digits
/// in upper or lower case.
fn pct(bytes: &[u8], upper: bool) -> String {
    bytes
        .iter()
        .map(|&b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ if upper => format!("%{b:02X}"),
            _ => format!("%{b:02x}"),
        })
        .collect()
}

/// `text` percent-decoded, `+` read as a space.
fn unpct(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    let mut i = 0;
    while i < text.len() {
        let hex = text
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (text[i], hex) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
                continue;
            }
            (b'+', _) => out.push(b' '),
            (b, _) => out.push(b),
        }
        i += 1;
    }
    out
}

/// Whether `text` shows `value` in any way the test knows: as is,
/// percent-decoded, or in base64 (either alphabet, the value at any offset
/// in the encoded bytes) of either.
fn shows(text: &[u8], value: &str) -> bool {
    use base64::Engine;
    let mut forms = vec![value.as_bytes().to_vec()];
    for offset in 0..3 {
        let mut bytes = vec![0u8; offset];
        bytes.extend_from_slice(value.as_bytes());
        let b64 = base64::engine::general_purpose::STANDARD_NO_PAD.encode(&bytes);
        // Only the characters made of the value's bits alone.
        let core = &b64[(offset * 8).div_ceil(6)..(offset + value.len()) * 8 / 6];
        forms.push(core.as_bytes().to_vec());
        forms.push(core.replace('+', "-").replace('/', "_").into_bytes());
    }
    let decoded = unpct(text);
    [text, &decoded[..]]
        .iter()
        .any(|t| forms.iter().any(|f| t.windows(f.len()).any(|w| w == f)))
}

/// A real host that reflects what it is sent in its response head, the
/// way debugging endpoints, login redirects and reflecting proxies do; its
/// body says what it received.
fn mirror<B>(req: &hyper::Request<B>) -> hyper::Response<Full<Bytes>> {
    use base64::Engine;
    use base64::engine::general_purpose::{STANDARD, STANDARD_NO_PAD, URL_SAFE_NO_PAD};
    let h = |k: &str| {
        req.headers()
            .get(k)
            .map(|v| v.as_bytes().to_vec())
            .unwrap_or_default()
    };
    let (auth, key) = (h("authorization"), h("x-api-key"));
    let credentials = auth
        .strip_prefix(b"Basic ")
        .and_then(|c| STANDARD.decode(c).ok())
        .unwrap_or_default();
    let target = req.uri().to_string();
    let next: String = url::form_urlencoded::byte_serialize(target.as_bytes()).collect();
    let (auth_s, key_s) = (
        String::from_utf8_lossy(&auth),
        String::from_utf8_lossy(&key),
    );
    let mut resp = hyper::Response::builder()
        .header("x-echo-auth", auth.clone())
        .header(
            "www-authenticate",
            format!("Basic realm=\"{}\"", URL_SAFE_NO_PAD.encode(&credentials)),
        )
        .header("x-debug", format!("/debug?auth={}", pct(&auth, true)))
        .header(
            "set-cookie",
            format!("k={}; Secure", STANDARD_NO_PAD.encode(&key)),
        )
        .header(
            "link",
            format!("</debug?key={}>; rel=\"debug\"", pct(&key, false)),
        )
        .header("location", format!("/login?next={next}"))
        .header("x-echo-key", key.clone())
        .header("x-plain", PLAIN)
        .body(Full::new(Bytes::from(format!(
            "{target} auth={auth_s} key={key_s}"
        ))))
        .unwrap();
    resp.extensions_mut()
        .insert(hyper::ext::ReasonPhrase::try_from(format!("Echo {key_s}")).unwrap());
    resp
}

#[tokio::test]
async fn a_host_that_reflects_the_request_shows_the_sandbox_no_form_of_the_value() {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    let tls = tls();
    let port = tls_server(tls.server.clone(), mirror).await;
    let host = format!("upstream.test:{port}");
    let secrets = vec![
        Secret::new("TOKEN", SPACED, &[&host]).unwrap(),
        Secret::new("URLKEY", IN_URL, &[&host]).unwrap(),
    ];
    let icpt = Arc::new(Intercept::with_roots(secrets, roots_with(&tls_root_der(&tls))).unwrap());
    let config = BrokerConfig {
        intercept: Some(icpt.clone()),
        ..Default::default()
    };
    let b = TestBroker::start(policy(&[host], true), config).await;

    // The value at byte offsets 0, 1 (4) and 2 of the Basic credentials.
    let users = [
        (
            "CORDON_SECRET_TOKEN:x-oauth-basic",
            format!("{SPACED}:x-oauth-basic"),
        ),
        ("git:CORDON_SECRET_TOKEN", format!("git:{SPACED}")),
        ("x:CORDON_SECRET_TOKEN", format!("x:{SPACED}")),
    ];
    let target = "/cb?key=CORDON_SECRET_URLKEY";
    let reqs = users
        .iter()
        .map(|(c, _)| get("upstream.test", target, &format!("Basic {}", b64.encode(c))))
        .collect();
    let seen = exchange(&b, "upstream.test", port, roots_with(icpt.ca_der()), reqs)
        .await
        .unwrap();
    for ((sent, real), seen) in users.iter().zip(&seen) {
        // The real host got the values...
        assert_eq!(seen.status, 200);
        assert_eq!(
            seen.body,
            format!(
                "/cb?key={IN_URL} auth=Basic {} key={SPACED}",
                b64.encode(real)
            )
        );
        // ...and the sandbox sees none of them, in any form.
        let mut heads: Vec<&[u8]> = Vec::new();
        for (name, v) in &seen.headers {
            heads.extend([name.as_str().as_bytes(), v.as_bytes()]);
        }
        heads.extend(seen.reason.as_deref());
        let leaks: Vec<_> = heads
            .iter()
            .filter(|t| shows(t, SPACED) || shows(t, IN_URL))
            .map(|t| String::from_utf8_lossy(t))
            .collect();
        assert!(leaks.is_empty(), "the values show in {leaks:#?}");
        // What the sandbox sent comes back as it sent it.
        let h = |k: &str| seen.headers[k].to_str().unwrap().to_string();
        assert_eq!(h("x-echo-auth"), format!("Basic {}", b64.encode(sent)));
        assert_eq!(h("x-echo-key"), "CORDON_SECRET_TOKEN");
        let next: String = url::form_urlencoded::byte_serialize(target.as_bytes()).collect();
        assert_eq!(h("location"), format!("/login?next={next}"));
        assert_eq!(h("link"), "</debug?key=CORDON_SECRET_TOKEN>; rel=\"debug\"");
        assert_eq!(h("x-plain"), PLAIN);
        assert_eq!(
            seen.reason.as_deref(),
            Some(&b"Echo CORDON_SECRET_TOKEN"[..])
        );
    }
}

/// A real host that answers one request with a chunked body whose trailers
/// hold `value`, as is and in base64, whatever the request asked for.
async fn trailing_server(config: Arc<rustls::ServerConfig>, value: &'static str) -> u16 {
    use base64::Engine;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let l = tokio::net::TcpListener::bind((LOOPBACK, 0)).await.unwrap();
    let port = l.local_addr().unwrap().port();
    let acceptor = tokio_rustls::TlsAcceptor::from(config);
    tokio::spawn(async move {
        while let Ok((s, _)) = l.accept().await {
            let Ok(mut tls) = acceptor.accept(s).await else {
                continue;
            };
            let mut head = Vec::new();
            let mut b = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && tls.read(&mut b).await.unwrap_or(0) == 1 {
                head.push(b[0]);
            }
            let b64 = base64::engine::general_purpose::STANDARD.encode(format!("git:{value}"));
            let resp = format!(
                "HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\ntrailer: x-key, x-auth\r\n\r\n\
                 2\r\nok\r\n0\r\nx-key: {value}\r\nx-auth: Basic {b64}\r\n\r\n"
            );
            let _ = tls.write_all(resp.as_bytes()).await;
            let _ = tls.shutdown().await;
        }
    });
    port
}

#[tokio::test]
async fn trailers_do_not_carry_the_value_back() {
    let tls = tls();
    let port = trailing_server(tls.server.clone(), SPACED).await;
    let host = format!("upstream.test:{port}");
    let secret = Secret::new("TOKEN", SPACED, &[&host]).unwrap();
    let icpt =
        Arc::new(Intercept::with_roots(vec![secret], roots_with(&tls_root_der(&tls))).unwrap());
    let config = BrokerConfig {
        intercept: Some(icpt.clone()),
        ..Default::default()
    };
    let b = TestBroker::start(policy(&[host], true), config).await;
    let mut req = get("upstream.test", "/", "Bearer CORDON_SECRET_TOKEN");
    req.headers_mut()
        .insert("te", http::HeaderValue::from_static("trailers"));
    let seen = exchange(
        &b,
        "upstream.test",
        port,
        roots_with(icpt.ca_der()),
        vec![req],
    )
    .await
    .unwrap();
    assert_eq!((seen[0].status, seen[0].body.as_str()), (200, "ok"));
    for (name, v) in seen[0].trailers.iter().flatten() {
        assert!(
            !shows(name.as_str().as_bytes(), SPACED) && !shows(v.as_bytes(), SPACED),
            "{name}: {v:?}"
        );
    }
}
