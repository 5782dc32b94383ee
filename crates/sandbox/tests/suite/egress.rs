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

/// The real value of the secret the test gives the broker.
const SECRET: &str = "s3cr3t-value-the-sandbox-never-sees";

/// A TLS server for `secret.test` on the host's loopback that records the
/// `Authorization` header of each request it gets; its port, its
/// certificate, and what it recorded.
async fn tls_upstream() -> (
    u16,
    rustls::pki_types::CertificateDer<'static>,
    Arc<std::sync::Mutex<Vec<String>>>,
) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let ck = rcgen::generate_simple_self_signed(vec!["secret.test".to_string()]).unwrap();
    let der = ck.cert.der().clone();
    let key = rustls::pki_types::PrivateKeyDer::Pkcs8(ck.signing_key.serialize_der().into());
    let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![der.clone()], key)
        .unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let (acceptor, record) = (acceptor.clone(), record.clone());
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut head = Vec::new();
                let mut buf = [0u8; 4096];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match tls.read(&mut buf).await {
                        Ok(0) | Err(_) => return,
                        Ok(n) => head.extend_from_slice(&buf[..n]),
                    }
                }
                let head = String::from_utf8_lossy(&head).into_owned();
                if let Some(auth) = head.lines().find_map(|l| {
                    l.strip_prefix("authorization: ")
                        .or(l.strip_prefix("Authorization: "))
                }) {
                    record.lock().unwrap().push(auth.to_string());
                }
                let _ = tls
                    .write_all(
                        b"HTTP/1.1 200 OK\r\nContent-Length: 3\r\nConnection: close\r\n\r\nok\n",
                    )
                    .await;
                let _ = tls.shutdown().await;
            });
        }
    });
    (port, der, seen)
}

/// A secret scoped to one host: the sandbox holds only its placeholder
/// (environment, files, its own processes), trusts the broker's CA for
/// that host, and the request that reaches the host carries the real
/// value.
async fn a_secret_reaches_its_host_and_never_the_sandbox(backend: BackendKind) {
    let (port, cert, seen) = tls_upstream().await;
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path(), backend, &[format!("secret.test:{port}")]);
    let secret =
        cordon_net::Secret::new("TOKEN", SECRET, &[format!("secret.test:{port}")]).unwrap();
    let placeholder = secret.placeholder().to_string();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(cert).unwrap();
    let egress = cfg.egress.as_mut().unwrap();
    egress.resolver =
        Arc::new(StaticResolver::new().with("secret.test", &[IpAddr::V4(Ipv4Addr::LOCALHOST)]));
    egress.broker.intercept = Some(Arc::new(
        cordon_net::Intercept::with_roots(vec![secret], roots).unwrap(),
    ));
    cfg.env.push(("API_TOKEN".into(), placeholder.clone()));
    let sb = Sandbox::create(cfg).await.expect("create sandbox");
    let out = sb
        .exec(ExecRequest::shell(&format!(
            "curl -sS --max-time 20 -H \"Authorization: Bearer $API_TOKEN\" https://secret.test:{port}/"
        )))
        .await
        .unwrap();
    assert_eq!(out.stdout_str(), "ok\n", "{}", out.stderr_str());
    assert_eq!(
        seen.lock().unwrap().clone(),
        [format!("Bearer {SECRET}")],
        "the host did not get the real value"
    );
    // Nowhere inside: the environment, /etc, /tmp, the processes' memory
    // maps and environments.
    let out = sb
        .exec(ExecRequest::shell(&format!(
            "echo env=$API_TOKEN; grep -rl '{SECRET}' /etc /tmp /proc/[0-9]*/environ 2>/dev/null; echo searched"
        )))
        .await
        .unwrap();
    assert!(
        out.stdout_str().contains(&format!("env={placeholder}"))
            && out.stdout_str().ends_with("searched\n")
            && !out.stdout_str().contains("/"),
        "{}",
        out.stdout_str()
    );
    sb.close().await;
}

#[tokio::test]
async fn secrets_native() {
    a_secret_reaches_its_host_and_never_the_sandbox(BackendKind::Native).await
}

#[tokio::test]
async fn secrets_microvm() {
    a_secret_reaches_its_host_and_never_the_sandbox(BackendKind::Microvm).await
}

/// Guests started from one snapshot share what the guest that took it
/// held; each must still read its own sandbox's `/etc`: with a broker
/// that intercepts, one of its own with the broker's CA; without, the
/// host's allow-list alone, never another sandbox's CA. Both orders, each
/// on a shape of its own (the memory size), so that either kind of guest
/// has taken a snapshot the other kind starts from.
#[tokio::test]
async fn a_guest_from_a_snapshot_reads_its_own_etc() {
    for (memory, ca_first) in [(232u64, true), (240, false)] {
        for (i, with_ca) in [ca_first, !ca_first].into_iter().enumerate() {
            let dir = tempfile::tempdir().unwrap();
            let mut cfg = config(dir.path(), BackendKind::Microvm, &[]);
            cfg.memory = Some(memory << 20);
            if with_ca {
                let secret =
                    cordon_net::Secret::new("TOKEN", SECRET, &["secret.test:443".to_string()])
                        .unwrap();
                cfg.egress.as_mut().unwrap().broker.intercept = Some(Arc::new(
                    cordon_net::Intercept::with_roots(vec![secret], rustls::RootCertStore::empty())
                        .unwrap(),
                ));
            }
            let sb = Sandbox::create(cfg).await.expect("create sandbox");
            let limits = sb.info().limits.clone();
            if i == 1 {
                assert!(limits.contains("from a snapshot"), "{limits}");
            }
            let out = sb
                .exec(ExecRequest::shell(
                    "ls /etc/cordon 2>&1; test -s /etc/passwd && echo passwd",
                ))
                .await
                .unwrap();
            let seen = out.stdout_str();
            assert!(
                seen.contains("passwd"),
                "{memory} MiB, CA {with_ca}: {seen}"
            );
            assert_eq!(
                seen.contains("ca.pem"),
                with_ca,
                "{memory} MiB, CA {with_ca} ({limits}): {seen}"
            );
            sb.close().await;
        }
    }
}
