//! Plain HTTP through the broker, its limits, and hostile input.

use crate::common;

use std::time::Duration;

use bytes::Bytes;
use common::*;
use cordon_net::{BrokerConfig, Decision, Reason};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

#[tokio::test]
async fn plain_get_is_forwarded_origin_form_without_proxy_headers() {
    let port = http_server().await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let (status, body) = http_get(
        b.addr,
        &format!("http://UPSTREAM.test:{port}/simple/pkg/?q=1"),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        body,
        format!("GET /simple/pkg/?q=1 host=upstream.test:{port} proxy-auth=false body=")
    );
    let ev = b.event().await;
    assert_eq!(
        (ev.decision, ev.reason, ev.method.as_str()),
        (Decision::Allowed, Reason::Listed, "GET")
    );
    assert!(ev.bytes_up > 0 && ev.bytes_down > 0, "{ev:?}");
}

#[tokio::test]
async fn keep_alive_serves_several_requests_each_checked() {
    let port = http_server().await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let s = TcpStream::connect(b.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    for (i, host) in ["upstream.test", "other.test", "upstream.test"]
        .iter()
        .enumerate()
    {
        let req = hyper::Request::post(format!("http://{host}:{port}/{i}"))
            .body(Full::new(Bytes::from(format!("body{i}"))))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let body = String::from_utf8(
            resp.into_body()
                .collect()
                .await
                .unwrap()
                .to_bytes()
                .to_vec(),
        )
        .unwrap();
        if *host == "other.test" {
            assert_eq!(status, 403);
            assert_eq!(
                body.trim_end(),
                format!(
                    "network: other.test:{port} refused by policy (allowed: upstream.test:{port})"
                )
            );
        } else {
            assert_eq!(status, 200);
            assert_eq!(
                body,
                format!("POST /{i} host=upstream.test:{port} proxy-auth=false body=body{i}")
            );
        }
    }
    let mut reasons = Vec::new();
    for _ in 0..3 {
        reasons.push(b.event().await.reason);
    }
    reasons.sort_by_key(|r| format!("{r:?}"));
    assert_eq!(
        reasons,
        vec![Reason::Listed, Reason::Listed, Reason::NotListed]
    );
}

#[tokio::test]
async fn plain_refusals_and_bad_requests() {
    let port = http_server().await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let (status, body) = http_get(b.addr, &format!("http://evil.test:{port}/")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(b.event().await.reason, Reason::NotListed);
    let (status, body) = http_get(b.addr, &format!("https://upstream.test:{port}/")).await;
    assert_eq!(status, 400);
    assert!(body.contains("CONNECT"), "{body}");
    assert_eq!(b.event().await.reason, Reason::BadRequest);
    // Origin-form to the proxy itself is not a proxy request.
    let (status, _) = http_get(b.addr, "/").await;
    assert_eq!(status, 400);
    // An IP literal needs an IP rule.
    let (status, _) = http_get(b.addr, &format!("http://127.0.0.1:{port}/")).await;
    assert_eq!(status, 403);
}

#[tokio::test]
async fn wildcards_match_below_the_name_only() {
    let port = http_server().await;
    let mut b = TestBroker::start(
        policy(&[format!("*.wild.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let (status, body) = http_get(b.addr, &format!("http://a.wild.test:{port}/")).await;
    assert_eq!(status, 200, "{body}");
    let (status, _) = http_get(b.addr, &format!("http://wild.test:{port}/")).await;
    assert_eq!(status, 403);
    let _ = b.event().await;
    assert_eq!(b.event().await.reason, Reason::NotListed);
}

/// A sandbox connection's requests to one host share one upstream
/// connection (apt's hundreds of downloads would each pay a connect), each
/// reported on its own; the policy still decides every request, and one
/// it refuses ends the kept connection.
#[tokio::test]
async fn one_upstream_connection_serves_a_streams_requests_each_checked() {
    use std::sync::atomic::Ordering;
    let (port, accepted) = http_server_counted().await;
    let allowed = policy(&[format!("upstream.test:{port}")], true);
    let mut b = TestBroker::start(allowed.clone(), BrokerConfig::default()).await;
    let s = TcpStream::connect(b.addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(s))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut get = async |path: &str| {
        let req = hyper::Request::get(format!("http://upstream.test:{port}{path}"))
            .body(Full::new(Bytes::new()))
            .unwrap();
        let resp = sender.send_request(req).await.unwrap();
        let status = resp.status().as_u16();
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        (status, String::from_utf8_lossy(&body).into_owned())
    };
    for i in 0..3 {
        let (status, body) = get(&format!("/{i}")).await;
        assert_eq!(status, 200, "{body}");
        assert!(body.starts_with(&format!("GET /{i} ")), "{body}");
        let ev = b.event().await;
        assert_eq!(
            (ev.decision, ev.reason),
            (Decision::Allowed, Reason::Listed)
        );
        assert!(ev.bytes_up > 0 && ev.bytes_down > 0, "{ev:?}");
    }
    assert_eq!(accepted.load(Ordering::SeqCst), 1);
    // Refused on the same stream, while its upstream connection is kept.
    b.broker
        .policy()
        .set(policy(&["upstream.test:1".into()], true));
    assert_eq!(get("/refused").await.0, 403);
    assert_eq!(b.event().await.reason, Reason::PortNotListed);
    // Allowed again: a new upstream connection, the old one ended.
    b.broker.policy().set(allowed);
    assert_eq!(get("/again").await.0, 200);
    assert_eq!(b.event().await.reason, Reason::Listed);
    assert_eq!(accepted.load(Ordering::SeqCst), 2);
}

#[tokio::test]
async fn a_policy_change_applies_to_the_next_request() {
    let port = http_server().await;
    let b = TestBroker::start(policy(&[], true), BrokerConfig::default()).await;
    let url = format!("http://upstream.test:{port}/");
    assert_eq!(http_get(b.addr, &url).await.0, 403);
    b.broker
        .policy()
        .set(policy(&[format!("upstream.test:{port}")], true));
    assert_eq!(http_get(b.addr, &url).await.0, 200);
    b.broker
        .policy()
        .set(policy(&["upstream.test:1".into()], true));
    let (status, body) = http_get(b.addr, &url).await;
    assert_eq!(status, 403);
    assert!(body.contains("allowed: upstream.test:1"), "{body}");
}

#[tokio::test]
async fn connections_past_the_cap_get_503_and_the_cap_frees() {
    let port = http_server().await;
    let config = BrokerConfig {
        max_connections: 2,
        ..Default::default()
    };
    let mut b = TestBroker::start(policy(&[format!("upstream.test:{port}")], true), config).await;
    let idle1 = TcpStream::connect(b.addr).await.unwrap();
    let idle2 = TcpStream::connect(b.addr).await.unwrap();
    for _ in 0..100 {
        if b.broker.active_connections() == 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(b.broker.active_connections(), 2);
    let mut third = TcpStream::connect(b.addr).await.unwrap();
    let (status, body) = read_response(&mut third).await;
    assert_eq!(status, 503);
    assert!(body.contains("limit 2"), "{body}");
    assert_eq!(b.event().await.reason, Reason::TooManyConnections);
    drop(idle1);
    for _ in 0..100 {
        if b.broker.active_connections() < 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (status, _) = http_get(b.addr, &format!("http://upstream.test:{port}/")).await;
    assert_eq!(status, 200);
    drop(idle2);
}

#[tokio::test]
async fn oversized_heads_are_refused() {
    let b = TestBroker::start(
        policy(&["upstream.test".into()], true),
        BrokerConfig {
            max_header_bytes: 8192,
            ..Default::default()
        },
    )
    .await;
    let mut s = TcpStream::connect(b.addr).await.unwrap();
    let big = format!(
        "GET http://upstream.test/ HTTP/1.1\r\nX-Big: {}\r\n\r\n",
        "a".repeat(100_000)
    );
    let _ = s.write_all(big.as_bytes()).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("closed in time");
    let out = String::from_utf8_lossy(&out);
    assert!(out.is_empty() || out.starts_with("HTTP/1.1 431"), "{out}");
}

#[tokio::test]
async fn silent_clients_are_dropped_after_the_header_timeout() {
    let b = TestBroker::start(
        policy(&[], true),
        BrokerConfig {
            header_timeout: Duration::from_millis(200),
            ..Default::default()
        },
    )
    .await;
    let mut s = TcpStream::connect(b.addr).await.unwrap();
    s.write_all(b"GET http://a.test/ HTTP/1.1\r\n")
        .await
        .unwrap();
    let mut out = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut out))
        .await
        .expect("closed in time")
        .ok();
}

#[tokio::test]
async fn serve_connection_takes_any_stream() {
    let port = http_server().await;
    let b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let (client, server) = tokio::io::duplex(4096);
    let broker = b.broker.clone();
    tokio::spawn(async move { broker.serve_connection(server).await });
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake::<_, Full<Bytes>>(TokioIo::new(client))
            .await
            .unwrap();
    tokio::spawn(conn);
    let resp = sender
        .send_request(
            hyper::Request::get(format!("http://upstream.test:{port}/x"))
                .body(Full::new(Bytes::new()))
                .unwrap(),
        )
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
}

#[tokio::test]
async fn random_bytes_never_break_the_broker() {
    let port = http_server().await;
    let b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig {
            header_timeout: Duration::from_millis(300),
            ..Default::default()
        },
    )
    .await;
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = move || {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        x
    };
    let prefixes: [&[u8]; 5] = [
        b"",
        b"CONNECT ",
        b"GET http://",
        b"CONNECT upstream.test:1 HTTP/1.1\r\n",
        b"GET http://upstream.test/ HTTP/1.1\r\nHost",
    ];
    for i in 0..200 {
        let mut bytes = prefixes[i % prefixes.len()].to_vec();
        for _ in 0..(next() % 300) {
            bytes.push(next() as u8);
        }
        if i % 7 == 0 {
            bytes.extend_from_slice(b"\r\n\r\n");
        }
        let mut s = TcpStream::connect(b.addr).await.unwrap();
        let _ = s.write_all(&bytes).await;
        let _ = s.shutdown().await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut sink)).await;
    }
    // Garbage inside an allowed tunnel, too.
    let tls = tls();
    let tport = tls_echo_server(tls.server.clone()).await;
    b.broker.policy().set(policy(
        &[
            format!("upstream.test:{port}"),
            format!("upstream.test:{tport}"),
        ],
        true,
    ));
    for _ in 0..50 {
        let (status, _, mut s) = connect(b.addr, &format!("upstream.test:{tport}")).await;
        assert_eq!(status, 200);
        let mut bytes = vec![0x16, 3, 1];
        for _ in 0..(next() % 200) {
            bytes.push(next() as u8);
        }
        let _ = s.write_all(&bytes).await;
        let _ = s.shutdown().await;
        let mut sink = Vec::new();
        let _ = tokio::time::timeout(Duration::from_secs(15), s.read_to_end(&mut sink)).await;
    }
    let (status, _) = http_get(b.addr, &format!("http://upstream.test:{port}/")).await;
    assert_eq!(status, 200, "the broker still serves");
}

#[tokio::test]
async fn the_upstream_sees_the_checked_host_not_the_host_header() {
    let port = http_server().await;
    let b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let mut s = TcpStream::connect(b.addr).await.unwrap();
    let req = format!(
        "GET http://user:pw@upstream.test:{port}/p HTTP/1.1\r\nHost: evil.test\r\nProxy-Connection: keep-alive\r\nConnection: close, X-Secret\r\nX-Secret: 1\r\n\r\n"
    );
    s.write_all(req.as_bytes()).await.unwrap();
    let (status, _) = read_response_head_only(&mut s).await;
    assert_eq!(status, 200);
    let mut rest = Vec::new();
    s.read_to_end(&mut rest).await.unwrap();
    let rest = String::from_utf8_lossy(&rest);
    assert!(
        rest.contains(&format!("GET /p host=upstream.test:{port} ")),
        "{rest}"
    );
}

/// Reads a response head (a chunked or close-delimited body stays unread).
async fn read_response_head_only(s: &mut TcpStream) -> (u16, String) {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(s.read(&mut b).await.unwrap(), 1);
        head.push(b[0]);
    }
    let head = String::from_utf8(head).unwrap();
    (head.split(' ').nth(1).unwrap().parse().unwrap(), head)
}
