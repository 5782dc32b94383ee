//! Real clients through the broker: curl (what git and cargo use) and
//! Python's urllib (what pip uses) speak CONNECT and TLS their own way;
//! the broker must read their ClientHellos and carry their requests.

use crate::common;

use common::*;
use cordon_net::{BrokerConfig, Reason};

fn pem(tls: &Tls, dir: &std::path::Path) -> std::path::PathBuf {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD.encode(tls.root.as_ref());
    let lines: Vec<&str> = b64
        .as_bytes()
        .chunks(64)
        .map(|c| std::str::from_utf8(c).unwrap())
        .collect();
    let path = dir.join("root.pem");
    std::fs::write(
        &path,
        format!(
            "-----BEGIN CERTIFICATE-----\n{}\n-----END CERTIFICATE-----\n",
            lines.join("\n")
        ),
    )
    .unwrap();
    path
}

async fn output(cmd: &mut tokio::process::Command) -> (bool, String, String) {
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        cmd.env_clear()
            .env("PATH", std::env::var("PATH").unwrap())
            .output(),
    )
    .await
    .expect("the client finished")
    .expect("the client ran");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test]
async fn curl_https_and_http_through_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let tls = tls();
    let tport = tls_http_server(tls.server.clone()).await;
    let hport = http_server().await;
    let mut b = TestBroker::start(
        policy(
            &[
                format!("upstream.test:{tport}"),
                format!("upstream.test:{hport}"),
            ],
            true,
        ),
        BrokerConfig::default(),
    )
    .await;
    let proxy = format!("http://{}", b.addr);
    let root = pem(&tls, dir.path());
    let (ok, out, err) = output(
        tokio::process::Command::new("curl")
            .args(["-sS", "--proxy", &proxy, "--cacert"])
            .arg(&root)
            .arg(format!("https://upstream.test:{tport}/tls")),
    )
    .await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("/tls host=upstream.test:{tport}")),
        "{out}"
    );
    assert_eq!(b.event().await.reason, Reason::Listed);
    let (ok, out, err) = output(tokio::process::Command::new("curl").args([
        "-sS",
        "--proxy",
        &proxy,
        &format!("http://upstream.test:{hport}/plain"),
    ]))
    .await;
    assert!(ok, "{err}");
    assert!(
        out.starts_with(&format!("GET /plain host=upstream.test:{hport}")),
        "{out}"
    );
    // Refused: curl reports the proxy's 403.
    let (ok, _, err) = output(
        tokio::process::Command::new("curl")
            .args(["-sS", "--proxy", &proxy, "--cacert"])
            .arg(&root)
            .arg(format!("https://other.test:{tport}/")),
    )
    .await;
    assert!(!ok);
    assert!(err.contains("403"), "{err}");
}

#[tokio::test]
async fn python_urllib_https_through_the_broker() {
    let dir = tempfile::tempdir().unwrap();
    let tls = tls();
    let tport = tls_http_server(tls.server.clone()).await;
    let mut b = TestBroker::start(
        policy(&[format!("upstream.test:{tport}")], true),
        BrokerConfig::default(),
    )
    .await;
    let root = pem(&tls, dir.path());
    let script = format!(
        "import ssl, urllib.request\n\
         ctx = ssl.create_default_context(cafile={root:?})\n\
         o = urllib.request.build_opener(urllib.request.ProxyHandler({{'https': 'http://{addr}'}}), urllib.request.HTTPSHandler(context=ctx))\n\
         print(o.open('https://upstream.test:{tport}/py').read().decode())\n",
        root = root.display().to_string(),
        addr = b.addr,
    );
    let mut cmd = tokio::process::Command::new("python3");
    cmd.args(["-c", &script]);
    if let Ok(r) = std::env::var("PYENV_ROOT") {
        cmd.env("PYENV_ROOT", r);
    }
    let out = tokio::time::timeout(
        std::time::Duration::from_secs(60),
        cmd.env("PATH", std::env::var("PATH").unwrap()).output(),
    )
    .await
    .unwrap()
    .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("/py host=upstream.test:{tport}")),
        "{stdout}"
    );
    assert_eq!(b.event().await.reason, Reason::Listed);
}
