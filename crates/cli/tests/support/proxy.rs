//! A loopback HTTP proxy that adds a bearer token to every request, for
//! clients that cannot send one (the MCP conformance suite) to reach
//! `cordon mcp --listen`. It stands in for the server: a Host or Origin
//! naming the proxy is rewritten to name the server, anything else (a
//! foreign Origin, say) passes unchanged. One request per connection.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};

/// Starts the proxy in front of `upstream`; returns its address.
pub fn start(upstream: SocketAddr, token: &str) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let own = listener.local_addr().unwrap();
    let token = token.to_string();
    std::thread::spawn(move || {
        for conn in listener.incoming().flatten() {
            let token = token.clone();
            std::thread::spawn(move || {
                let _ = forward(conn, own, upstream, &token);
            });
        }
    });
    own
}

fn forward(
    client: TcpStream,
    own: SocketAddr,
    upstream: SocketAddr,
    token: &str,
) -> std::io::Result<()> {
    let mut reader = BufReader::new(client.try_clone()?);
    let mut head = String::new();
    reader.read_line(&mut head)?;
    let (own_port, up_port) = (own.port().to_string(), upstream.port().to_string());
    let rename = |v: &str| -> String {
        for host in ["127.0.0.1", "localhost"] {
            for prefix in ["", "http://"] {
                if v.eq_ignore_ascii_case(&format!("{prefix}{host}:{own_port}")) {
                    return format!("{prefix}{host}:{up_port}");
                }
            }
        }
        v.to_string()
    };
    loop {
        let mut line = String::new();
        if reader.read_line(&mut line)? == 0 {
            return Ok(());
        }
        let trimmed = line.trim_end();
        if trimmed.is_empty() {
            break;
        }
        let Some((name, value)) = trimmed.split_once(':') else {
            continue;
        };
        let value = value.trim();
        match name.to_ascii_lowercase().as_str() {
            "authorization" | "connection" | "keep-alive" => {}
            "host" | "origin" => head.push_str(&format!("{name}: {}\r\n", rename(value))),
            _ => head.push_str(&format!("{name}: {value}\r\n")),
        }
    }
    head.push_str(&format!(
        "Authorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    ));
    let mut up = TcpStream::connect(upstream)?;
    up.write_all(head.as_bytes())?;
    // What the reader buffered past the head is the body's start.
    up.write_all(reader.buffer())?;
    let mut up_writer = up.try_clone()?;
    let mut rest = reader.into_inner();
    std::thread::spawn(move || {
        let _ = std::io::copy(&mut rest, &mut up_writer);
    });
    let mut client_writer = client;
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = up.read(&mut buf)?;
        if n == 0 {
            break;
        }
        client_writer.write_all(&buf[..n])?;
    }
    client_writer.shutdown(std::net::Shutdown::Both)
}
