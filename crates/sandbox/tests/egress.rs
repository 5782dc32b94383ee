//! Egress through the broker (`Network::Allow`), on both backends (a
//! microVM guest relays its connections over the control channel): the sandbox
//! reaches an allowed host only through the proxy on its loopback, with
//! nothing but the proxy variables to find it; a host the policy does not
//! list is refused with a line the model can read, and a program that
//! ignores the proxy finds no route and no DNS. The upstream is a server on
//! the host's loopback, named by a resolver the test controls.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener};
use std::path::Path;
use std::sync::Arc;

use cordon_net::{Decision, PolicySpec, Reason, Rule, StaticResolver};
use cordon_sandbox::{BackendKind, Egress, ExecRequest, Network, Sandbox, SandboxConfig};

/// A one-line HTTP server on the host's loopback; its port.
fn upstream() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let mut conn = conn;
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") && conn.read(&mut byte).unwrap_or(0) == 1 {
                head.push(byte[0]);
            }
            let body = "hello from the host\n";
            let _ = write!(
                conn,
                "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    port
}

fn config(dir: &Path, backend: BackendKind, rules: &[String]) -> SandboxConfig {
    let mut c = SandboxConfig::new(dir);
    c.supervisor = Some(env!("CARGO_BIN_EXE_cordon-supervisor").into());
    c.backend = backend;
    c.network = Network::Allow;
    // The upstream is on the host's loopback, which only an explicit
    // permission reaches.
    let mut egress = Egress::new(PolicySpec {
        allow: rules.to_vec(),
        allow_private: true,
    });
    let localhost = [IpAddr::V4(Ipv4Addr::LOCALHOST)];
    egress.resolver = Arc::new(
        StaticResolver::new()
            .with("upstream.test", &localhost)
            .with("other.test", &localhost),
    );
    c.egress = Some(egress);
    c
}

#[tokio::test]
async fn native() {
    an_allowed_host_is_reached_through_the_broker_and_nothing_else(BackendKind::Native).await
}

#[tokio::test]
async fn microvm() {
    an_allowed_host_is_reached_through_the_broker_and_nothing_else(BackendKind::Microvm).await
}

async fn an_allowed_host_is_reached_through_the_broker_and_nothing_else(backend: BackendKind) {
    let port = upstream();
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), backend, &[format!("upstream.test:{port}")]);
    let sb = Sandbox::create(cfg).await.expect("create sandbox");
    let mut events = sb.network().expect("network allow").subscribe();

    // curl finds the broker through the proxy variables alone.
    let out = sb
        .exec(ExecRequest::shell(&format!(
            "curl -sS --max-time 10 http://upstream.test:{port}/"
        )))
        .await
        .unwrap();
    assert_eq!(
        out.stdout_str(),
        "hello from the host\n",
        "{}",
        out.stderr_str()
    );
    // So does Python's urllib (pip's way).
    let out = sb
        .exec(ExecRequest::argv([
            "python3",
            "-c",
            &format!(
                "import urllib.request; print(urllib.request.urlopen('http://upstream.test:{port}/', timeout=10).read().decode(), end='')"
            ),
        ]))
        .await
        .unwrap();
    assert_eq!(
        out.stdout_str(),
        "hello from the host\n",
        "{}",
        out.stderr_str()
    );

    // A host the policy does not list: 403, with the line for the model.
    let out = sb
        .exec(ExecRequest::shell(&format!(
            "curl -sS --max-time 10 http://other.test:{port}/"
        )))
        .await
        .unwrap();
    assert!(
        out.stdout_str()
            .contains(&format!("network: other.test:{port} refused by policy")),
        "{} / {}",
        out.stdout_str(),
        out.stderr_str()
    );

    // Widened while the sandbox runs, the next connection gets through.
    let net = sb.network().unwrap();
    let rule: Rule = format!("other.test:{port}").parse().unwrap();
    net.policy.set(net.policy.load().widened([rule]));
    let out = sb
        .exec(ExecRequest::shell(&format!(
            "curl -sS --max-time 10 http://other.test:{port}/"
        )))
        .await
        .unwrap();
    assert_eq!(
        out.stdout_str(),
        "hello from the host\n",
        "{}",
        out.stderr_str()
    );

    // Around the proxy: no name resolves, and no address is reachable,
    // not even the host's loopback where the upstream listens.
    for probe in [
        format!("curl -sS --noproxy '*' --max-time 5 http://upstream.test:{port}/"),
        format!("curl -sS --noproxy '*' --max-time 5 http://127.0.0.1:{port}/"),
        "getent hosts upstream.test".to_string(),
    ] {
        let out = sb.exec(ExecRequest::shell(&probe)).await.unwrap();
        assert!(
            !out.status.success() && !out.stdout_str().contains("hello"),
            "{probe}: {} / {}",
            out.stdout_str(),
            out.stderr_str()
        );
    }
    sb.close().await;

    // Every connection is an event: the two allowed, the one refused.
    let mut seen = Vec::new();
    while let Ok(e) = events.try_recv() {
        seen.push((e.host.clone(), e.decision, e.reason));
    }
    let allowed = seen
        .iter()
        .filter(|(h, d, _)| h.ends_with(".test") && *d == Decision::Allowed)
        .count();
    assert_eq!(allowed, 3, "{seen:?}");
    assert!(
        seen.iter().any(|(h, d, r)| h == "other.test"
            && *d == Decision::Refused
            && *r == Reason::NotListed),
        "{seen:?}"
    );
}

#[tokio::test]
async fn allow_needs_a_policy_and_a_policy_needs_allow() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = SandboxConfig::new(dir.path());
    cfg.network = Network::Allow;
    let err = Sandbox::create(cfg).await.err().unwrap();
    assert!(err.to_string().contains("needs a policy"), "{err}");
    let mut cfg = config(dir.path(), BackendKind::Native, &[]);
    cfg.network = Network::Loopback;
    let err = Sandbox::create(cfg).await.err().unwrap();
    assert!(err.to_string().contains("use allow"), "{err}");
}
