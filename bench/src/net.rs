//! Egress through the broker (`--network allow`) next to a direct download
//! on the host: throughput of a large body and the time of a small
//! request, both measured by curl itself (`-w`), from a server on the
//! host's loopback. Three paths:
//!
//! - `direct`: curl on the host, straight to the server;
//! - `broker-forward`: curl in a sandbox, plain `http://` through the
//!   proxy variables (the broker forwards each request: hyper on both
//!   sides);
//! - `broker-tunnel`: curl in a sandbox with `--proxytunnel` (a CONNECT
//!   tunnel: the broker copies bytes, as it does for every HTTPS
//!   download), to the server's address, which the policy lists (a
//!   CONNECT to a name must carry TLS, and this server speaks none).
//!
//! The server is named `bench.test` for the broker (a resolver the
//! benchmark controls) and allowed to resolve to loopback, which real
//! policies refuse.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, TcpListener, TcpStream};
use std::path::Path;
use std::sync::Arc;

use cordon_net::{PolicySpec, StaticResolver};
use cordon_sandbox::{Egress, ExecRequest, Network, Sandbox, SandboxConfig};

use crate::Args;
use crate::stats::{Json, MIB, Summary};

/// Serves `GET /big` (`big` bytes) and anything else as one byte, one
/// request per connection.
fn serve(big: usize) -> Result<u16, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).map_err(|e| format!("bind: {e}"))?;
    let port = listener.local_addr().map_err(|e| e.to_string())?.port();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            std::thread::spawn(move || answer(conn, big));
        }
    });
    Ok(port)
}

fn answer(mut conn: TcpStream, big: usize) {
    let mut head = Vec::new();
    let mut buf = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => head.extend_from_slice(&buf[..n]),
        }
        if head.len() > 64 * 1024 {
            return;
        }
    }
    let len = if head.starts_with(b"GET /big ") {
        big
    } else {
        1
    };
    let _ = write!(
        conn,
        "HTTP/1.1 200 OK\r\nContent-Length: {len}\r\nConnection: close\r\n\r\n"
    );
    let chunk = vec![0u8; 1 << 20];
    let mut left = len;
    while left > 0 {
        let n = left.min(chunk.len());
        if conn.write_all(&chunk[..n]).is_err() {
            return;
        }
        left -= n;
    }
}

/// curl's `-w` values, one per line, from a run on the host or in the
/// sandbox.
async fn curl(sandbox: Option<&Sandbox>, args: &[String]) -> Result<Vec<f64>, String> {
    let out = match sandbox {
        Some(sb) => {
            let out = sb
                .exec(ExecRequest::argv(args.iter().map(String::as_str)))
                .await
                .map_err(|e| format!("curl in the sandbox: {e}"))?;
            (out.status.success(), out.stdout, out.stderr)
        }
        None => {
            let out = tokio::process::Command::new(&args[0])
                .args(&args[1..])
                .output()
                .await
                .map_err(|e| format!("curl on the host: {e}"))?;
            (out.status.success(), out.stdout, out.stderr)
        }
    };
    if !out.0 {
        return Err(format!(
            "curl failed: {}",
            String::from_utf8_lossy(&out.2).trim()
        ));
    }
    String::from_utf8_lossy(&out.1)
        .lines()
        .map(|l| l.trim().parse::<f64>().map_err(|e| format!("{l:?}: {e}")))
        .collect()
}

/// The curl command line of one path: `write` is the `-w` format.
fn command(path: &str, port: u16, urls: &[&str], write: &str) -> Vec<String> {
    let mut c: Vec<String> = ["curl", "-sS", "--max-time", "120", "-w", write]
        .iter()
        .map(|s| s.to_string())
        .collect();
    // A CONNECT to a name must carry TLS with that name; to an address
    // the policy lists, the broker only copies bytes, as it does inside
    // any HTTPS tunnel. 127.0.0.1 is in no_proxy, hence the explicit proxy.
    let host = match path {
        "broker-forward" => "bench.test",
        "broker-tunnel" => {
            c.extend(
                [
                    "--proxytunnel",
                    "--noproxy",
                    "",
                    "-x",
                    "http://127.0.0.1:3128",
                ]
                .map(String::from),
            );
            "127.0.0.1"
        }
        // The host's own proxy settings, if any, do not apply to loopback.
        _ => {
            c.extend(["--noproxy", "*"].map(String::from));
            "127.0.0.1"
        }
    };
    for u in urls {
        c.push("-o".into());
        c.push("/dev/null".into());
        c.push(format!("http://{host}:{port}{u}"));
    }
    c
}

pub async fn run(args: &Args, workspace: &Path) -> Result<Json, String> {
    let mib = args.num("mib", 256)?;
    let rounds = args.num("rounds", 5)?;
    let requests = args.num("requests", 200)?;
    let port = serve(mib << 20)?;

    let mut config = SandboxConfig::new(workspace);
    config.network = Network::Allow;
    config.memory = Some(1 << 30);
    let mut egress = Egress::new(PolicySpec {
        allow: vec![format!("bench.test:{port}"), format!("127.0.0.1:{port}")],
        allow_private: true,
    });
    egress.resolver =
        Arc::new(StaticResolver::new().with("bench.test", &[IpAddr::V4(Ipv4Addr::LOCALHOST)]));
    config.egress = Some(egress);
    let sandbox = Sandbox::create(config)
        .await
        .map_err(|e| format!("create a sandbox with network allow: {e}"))?;

    let paths = ["direct", "broker-forward", "broker-tunnel"];
    let mut throughput: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    let mut latency: Vec<Vec<f64>> = vec![Vec::new(); paths.len()];
    let small: Vec<&str> = vec!["/small"; requests];
    // Interleaved, so that a noisy host disturbs every path alike.
    for _ in 0..rounds {
        for (i, path) in paths.iter().enumerate() {
            let sb = (*path != "direct").then_some(&sandbox);
            let speed = curl(sb, &command(path, port, &["/big"], "%{speed_download}\n"))
                .await
                .map_err(|e| format!("{path}: {e}"))?;
            throughput[i].extend(speed.iter().map(|bps| bps / MIB));
            let times = curl(sb, &command(path, port, &small, "%{time_total}\n"))
                .await
                .map_err(|e| format!("{path}: {e}"))?;
            latency[i].extend(times.iter().map(|s| s * 1e6));
        }
    }
    sandbox.close().await;

    let median = |v: &[f64]| Summary::of_us(v.to_vec()).p50;
    let mut rows = Vec::new();
    let direct_mibs = median(&throughput[0]);
    let direct_us = median(&latency[0]);
    for (i, path) in paths.iter().enumerate() {
        let mibs = median(&throughput[i]);
        let lat = Summary::of_us(latency[i].clone());
        rows.push((
            path.to_string(),
            Json::obj([
                ("throughput_mib_s_median", Json::Num(mibs)),
                ("throughput_ratio_to_direct", Json::Num(mibs / direct_mibs)),
                ("request", lat.json()),
                ("request_added_us_median", Json::Num(lat.p50 - direct_us)),
            ]),
        ));
    }
    Ok(Json::obj([
        ("body_mib", Json::Num(mib as f64)),
        ("rounds", Json::Num(rounds as f64)),
        ("requests_per_round", Json::Num(requests as f64)),
        ("paths", Json::Obj(rows)),
    ]))
}
