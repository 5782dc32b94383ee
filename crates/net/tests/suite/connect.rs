//! CONNECT tunnels through the broker, over real loopback sockets.

use crate::common;

use common::*;
use cordon_net::{BrokerConfig, Decision, Policy, Reason};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn rules(list: &[String]) -> Policy {
    policy(list, false)
}

#[tokio::test]
async fn allowed_tls_tunnel_carries_bytes_both_ways() {
    let tls = tls();
    let port = tls_echo_server(tls.server.clone()).await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let (status, _, s) = connect(b.addr, &format!("Upstream.Test.:{port}")).await;
    assert_eq!(status, 200);
    let mut t = tls_client(&tls, s, "upstream.test").await.unwrap();
    t.write_all(b"ping through the broker").await.unwrap();
    let mut got = [0u8; 23];
    t.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"ping through the broker");
    drop(t);
    let ev = b.event().await;
    assert_eq!(
        (ev.decision, ev.reason, ev.host.as_str(), ev.port),
        (Decision::Allowed, Reason::Listed, "upstream.test", port)
    );
    assert_eq!(ev.method, "CONNECT");
    assert!(ev.bytes_up > 23 && ev.bytes_down > 23, "{ev:?}");
}

#[tokio::test]
async fn host_not_listed_is_refused_with_a_readable_line() {
    let port = echo_server().await;
    let mut b = TestBroker::start(
        rules(&[format!("upstream.test:{port}")]),
        BrokerConfig::default(),
    )
    .await;
    let (status, body, _) = connect(b.addr, &format!("other.test:{port}")).await;
    assert_eq!(status, 403);
    let line =
        format!("network: other.test:{port} refused by policy (allowed: upstream.test:{port})");
    assert_eq!(body.trim_end(), line);
    let ev = b.event().await;
    assert_eq!(
        (ev.decision, ev.reason),
        (Decision::Refused, Reason::NotListed)
    );
    assert_eq!(ev.message, line);
    assert_eq!(ev.addr, None);
}

#[tokio::test]
async fn listed_host_on_another_port_is_refused() {
    let port = echo_server().await;
    let mut b = TestBroker::start(
        policy(&["upstream.test".into()], true),
        BrokerConfig::default(),
    )
    .await;
    let (status, body, _) = connect(b.addr, &format!("upstream.test:{port}")).await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(b.event().await.reason, Reason::PortNotListed);
}

#[tokio::test]
async fn sni_other_than_the_connect_host_is_refused() {
    let tls = tls();
    let port = tls_echo_server(tls.server.clone()).await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let (status, _, s) = connect(b.addr, &format!("upstream.test:{port}")).await;
    assert_eq!(status, 200);
    // The certificate is valid for other.test too: only the broker stops it.
    assert!(tls_client(&tls, s, "other.test").await.is_err());
    let ev = b.event().await;
    assert_eq!(
        (ev.decision, ev.reason),
        (Decision::Refused, Reason::SniMismatch)
    );
    assert_eq!(ev.bytes_up, 0, "nothing reached the upstream");
    assert!(ev.message.contains("\"other.test\""), "{}", ev.message);
}

#[tokio::test]
async fn client_hello_in_one_byte_segments_is_still_read() {
    let tls = tls();
    let port = tls_echo_server(tls.server.clone()).await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let (status, _, s) = connect(b.addr, &format!("upstream.test:{port}")).await;
    assert_eq!(status, 200);
    let mut t = tls_client(&tls, OneByte(s), "upstream.test").await.unwrap();
    t.write_all(b"split").await.unwrap();
    let mut got = [0u8; 5];
    t.read_exact(&mut got).await.unwrap();
    assert_eq!(&got, b"split");
    drop(t);
    assert_eq!(b.event().await.reason, Reason::Listed);
}

#[tokio::test]
async fn tunnel_to_a_name_must_be_tls_with_sni() {
    let port = echo_server().await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let (status, _, mut s) = connect(b.addr, &format!("upstream.test:{port}")).await;
    assert_eq!(status, 200);
    s.write_all(b"GET / HTTP/1.1\r\nHost: elsewhere.test\r\n\r\n")
        .await
        .unwrap();
    let mut buf = [0u8; 64];
    assert_eq!(
        s.read(&mut buf).await.unwrap_or(0),
        0,
        "no echo: the tunnel is closed"
    );
    assert_eq!(b.event().await.reason, Reason::NotTls);

    let (_, _, mut s) = connect(b.addr, &format!("upstream.test:{port}")).await;
    s.write_all(&hello_without_sni()).await.unwrap();
    assert_eq!(s.read(&mut buf).await.unwrap_or(0), 0);
    assert_eq!(b.event().await.reason, Reason::NoSni);
}

#[tokio::test]
async fn a_silent_tunnel_times_out_waiting_for_tls() {
    let port = echo_server().await;
    let config = BrokerConfig {
        hello_timeout: std::time::Duration::from_millis(300),
        ..Default::default()
    };
    let mut b = TestBroker::start(policy(&[format!("upstream.test:{port}")], true), config).await;
    let (status, _, mut s) = connect(b.addr, &format!("upstream.test:{port}")).await;
    assert_eq!(status, 200);
    let mut buf = [0u8; 8];
    assert_eq!(s.read(&mut buf).await.unwrap_or(0), 0);
    let ev = b.event().await;
    assert_eq!(
        (ev.decision, ev.reason),
        (Decision::Refused, Reason::Timeout)
    );
}

/// A ClientHello with no server_name extension.
fn hello_without_sni() -> Vec<u8> {
    let mut body = vec![0x03, 0x03];
    body.extend([9u8; 32]);
    body.push(0);
    body.extend([0, 2, 0x13, 0x01, 1, 0]);
    let ext = [0u8, 13, 0, 4, 0, 2, 4, 3];
    body.extend((ext.len() as u16).to_be_bytes());
    body.extend(ext);
    let mut hs = vec![1u8, 0];
    hs.extend((body.len() as u16).to_be_bytes());
    hs.extend(body);
    let mut rec = vec![0x16, 3, 1];
    rec.extend((hs.len() as u16).to_be_bytes());
    rec.extend(hs);
    rec
}

#[tokio::test]
async fn name_resolving_to_loopback_needs_explicit_permission() {
    let tls = tls();
    let port = tls_echo_server(tls.server.clone()).await;
    // Listed by name, but it resolves to 127.0.0.1: rebinding, refused.
    let mut b = TestBroker::start(
        rules(&[format!("evil.test:{port}")]),
        BrokerConfig::default(),
    )
    .await;
    let (status, body, _) = connect(b.addr, &format!("evil.test:{port}")).await;
    assert_eq!(status, 403);
    assert!(body.contains("127.0.0.1"), "{body}");
    let ev = b.event().await;
    assert_eq!(
        (ev.decision, ev.reason),
        (Decision::Refused, Reason::RestrictedAddress)
    );

    // The same with an IPv4-mapped IPv6 answer.
    let mut b = TestBroker::start(
        rules(&[format!("mapped.test:{port}")]),
        BrokerConfig::default(),
    )
    .await;
    let (status, _, _) = connect(b.addr, &format!("mapped.test:{port}")).await;
    assert_eq!(status, 403);
    assert_eq!(b.event().await.reason, Reason::RestrictedAddress);

    // An IP rule for the address (on this port) allows it.
    let mut b = TestBroker::start(
        rules(&[format!("evil.test:{port}"), format!("127.0.0.0/8:{port}")]),
        BrokerConfig::default(),
    )
    .await;
    let (status, _, s) = connect(b.addr, &format!("evil.test:{port}")).await;
    assert_eq!(status, 200);
    let mut t = tls_client(&tls, s, "evil.test").await.unwrap();
    t.write_all(b"ok").await.unwrap();
    let mut got = [0u8; 2];
    t.read_exact(&mut got).await.unwrap();
    drop(t);
    assert_eq!(b.event().await.reason, Reason::Listed);
}

#[tokio::test]
async fn ip_literals_need_ip_rules_in_every_spelling() {
    let port = echo_server().await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    // allow_private does not open IP literals; nor do name rules.
    for auth in [
        format!("127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
        format!("127.1:{port}"),
        format!("0x7f.0.0.1:{port}"),
        format!("[::1]:{port}"),
    ] {
        let (status, body, _) = connect(b.addr, &auth).await;
        assert_eq!(status, 403, "{auth}: {body}");
        assert_eq!(b.event().await.reason, Reason::NotListed, "{auth}");
    }
    // An explicit IP rule opens it, in either spelling, without TLS.
    let mut b = TestBroker::start(
        rules(&[format!("127.0.0.1:{port}")]),
        BrokerConfig::default(),
    )
    .await;
    for auth in [
        format!("127.0.0.1:{port}"),
        format!("[::ffff:127.0.0.1]:{port}"),
    ] {
        let (status, _, mut s) = connect(b.addr, &auth).await;
        assert_eq!(status, 200, "{auth}");
        s.write_all(b"raw").await.unwrap();
        let mut got = [0u8; 3];
        s.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"raw");
        drop(s);
        let ev = b.event().await;
        assert_eq!((ev.reason, ev.host.as_str()), (Reason::Listed, "127.0.0.1"));
    }
}

#[tokio::test]
async fn narrowing_the_policy_closes_open_tunnels_and_refuses_new_ones() {
    let tls = tls();
    let port = tls_echo_server(tls.server.clone()).await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let (_, _, s) = connect(b.addr, &format!("upstream.test:{port}")).await;
    let mut t = tls_client(&tls, s, "upstream.test").await.unwrap();
    t.write_all(b"1").await.unwrap();
    let mut one = [0u8; 1];
    t.read_exact(&mut one).await.unwrap();

    // Widening keeps it open.
    b.broker.policy().set(policy(
        &[format!("upstream.test:{port}"), "more.test".into()],
        true,
    ));
    t.write_all(b"2").await.unwrap();
    t.read_exact(&mut one).await.unwrap();
    assert!(b.no_event_pending());

    b.broker.policy().set(policy(&["more.test".into()], true));
    let ev = b.event().await;
    assert_eq!(
        (ev.decision, ev.reason),
        (Decision::Refused, Reason::PolicyChanged)
    );
    assert!(
        t.read(&mut one).await.map(|n| n == 0).unwrap_or(true),
        "tunnel closed"
    );

    let (status, _, _) = connect(b.addr, &format!("upstream.test:{port}")).await;
    assert_eq!(status, 403);
    assert_eq!(b.event().await.reason, Reason::NotListed);

    b.broker
        .policy()
        .set(policy(&[format!("upstream.test:{port}")], true));
    let (status, _, _) = connect(b.addr, &format!("upstream.test:{port}")).await;
    assert_eq!(status, 200);
}

#[tokio::test]
async fn nothing_listening_is_a_failure_not_a_refusal() {
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let mut b = TestBroker::start(
        policy(
            &[
                format!("upstream.test:{port}"),
                format!("nowhere.test:{port}"),
            ],
            true,
        ),
        BrokerConfig::default(),
    )
    .await;
    let (status, body, _) = connect(b.addr, &format!("upstream.test:{port}")).await;
    assert_eq!(status, 502, "{body}");
    assert_eq!(b.event().await.reason, Reason::ConnectFailed);
    let (status, _, _) = connect(b.addr, &format!("nowhere.test:{port}")).await;
    assert_eq!(status, 502);
    assert_eq!(b.event().await.reason, Reason::ResolveFailed);
}

#[tokio::test]
async fn each_permitted_address_is_tried_and_only_those() {
    let port = echo_server().await;
    let config = BrokerConfig {
        hello_timeout: std::time::Duration::from_millis(200),
        ..Default::default()
    };
    // 127.0.0.2 refuses (the server listens on 127.0.0.1 only): next one.
    let mut b =
        TestBroker::start(policy(&[format!("two.test:{port}")], true), config.clone()).await;
    let (status, body, _) = connect(b.addr, &format!("two.test:{port}")).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        b.event().await.addr,
        Some(format!("127.0.0.1:{port}").parse().unwrap())
    );
    // 10.0.0.1 is private and not listed: never attempted (it would hang
    // until the connect timeout), 127.0.0.1 is listed by IP.
    let mut b = TestBroker::start(
        rules(&[format!("mixed.test:{port}"), format!("127.0.0.1:{port}")]),
        config,
    )
    .await;
    let started = std::time::Instant::now();
    let (status, _, _) = connect(b.addr, &format!("mixed.test:{port}")).await;
    assert_eq!(status, 200);
    assert!(started.elapsed() < std::time::Duration::from_secs(2));
    assert_eq!(
        b.event().await.addr,
        Some(format!("127.0.0.1:{port}").parse().unwrap())
    );
}

#[tokio::test]
async fn closing_the_broker_ends_tunnels_and_serving() {
    let tls = tls();
    let port = tls_echo_server(tls.server.clone()).await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{port}")], true),
        BrokerConfig::default(),
    )
    .await;
    let (_, _, s) = connect(b.addr, &format!("upstream.test:{port}")).await;
    let mut t = tls_client(&tls, s, "upstream.test").await.unwrap();
    t.write_all(b"x").await.unwrap();
    let mut one = [0u8; 1];
    t.read_exact(&mut one).await.unwrap();
    // A second client mid-request, before its head is complete.
    let mut idle = tokio::net::TcpStream::connect(b.addr).await.unwrap();
    idle.write_all(b"GET http://upstream.test/ HTTP/1.1\r\n")
        .await
        .unwrap();

    b.broker.close();
    let ev = b.event().await;
    assert_eq!(
        (ev.decision, ev.reason),
        (Decision::Allowed, Reason::BrokerClosed)
    );
    assert!(
        t.read(&mut one).await.map(|n| n == 0).unwrap_or(true),
        "tunnel closed"
    );
    let mut rest = Vec::new();
    let r = tokio::time::timeout(
        std::time::Duration::from_secs(5),
        idle.read_to_end(&mut rest),
    )
    .await;
    assert!(r.is_ok(), "the half-sent request's connection is closed");
    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    match tokio::net::TcpStream::connect(b.addr).await {
        Err(_) => {}
        Ok(mut s) => {
            let mut buf = [0u8; 1];
            let n = tokio::time::timeout(std::time::Duration::from_secs(5), s.read(&mut buf))
                .await
                .expect("closed in time")
                .unwrap_or(0);
            assert_eq!(n, 0, "nothing serves after close");
        }
    }
}
