//! CONNECT tunnels: the ClientHello check, then a metered splice.

use super::*;

/// Buffers of a spliced tunnel. Downloads dominate: with tokio's default
/// 8 KiB each way, a tunnel moved 792 MiB/s where a direct download on the
/// same host moved 4733 (bench/run --net).
const UP_BUFFER: usize = 64 * 1024;
const DOWN_BUFFER: usize = 256 * 1024;

impl Inner {
    /// Runs a CONNECT tunnel once hyper has handed over the stream.
    pub(super) async fn tunnel(&self, t: Tunnel) {
        let Opened {
            stream,
            addr,
            host,
            port,
            method,
            started,
        } = t.opened;
        let host_s = host.to_string();
        let subject = Subject {
            host: &host_s,
            port,
            method: &method,
            started,
        };
        let mut client = match t.upgrade.await {
            Ok(u) => TokioIo::new(u),
            Err(e) => {
                self.emit(
                    &subject,
                    Decision::Failed,
                    Reason::Broken,
                    Some(addr),
                    None,
                    format!("network: {host_s}:{port} failed: {e}"),
                );
                return;
            }
        };
        let mut first = Vec::new();
        if let Host::Name(name) = &host
            && let Err((decision, reason, why)) =
                self.read_hello(&mut client, &mut first, name).await
        {
            let line = match decision {
                Decision::Refused => format!("network: {host_s}:{port} refused by policy: {why}"),
                _ => format!("network: {host_s}:{port} failed: {why}"),
            };
            self.emit(&subject, decision, reason, Some(addr), None, line);
            let _ = client.shutdown().await;
            return;
        }
        // Tunnels to a secret's hosts are terminated and filled in; every
        // other tunnel is spliced as is.
        let meter = Meter::new();
        let mut upstream = Counted::new(stream, meter.clone());
        let scoped = match (&self.config.intercept, &host) {
            (Some(i), Host::Name(n)) => i.scoped(n, port),
            _ => Vec::new(),
        };
        let intercepted = !scoped.is_empty();
        let mut rx = self.policy.subscribe();
        let reason = match (&self.config.intercept, &host) {
            (Some(icpt), Host::Name(name)) if intercepted => {
                let client = intercept::Prefixed::new(std::mem::take(&mut first), client);
                tokio::select! {
                    r = self.intercepted(icpt, scoped, client, upstream, name, port) => r,
                    _ = meter.idle(self.config.idle_timeout) => Reason::Timeout,
                    _ = revoked(&mut rx, &host, addr) => Reason::PolicyChanged,
                    _ = self.closed() => Reason::BrokerClosed,
                }
            }
            _ if upstream.write_all(&first).await.is_err() => Reason::Broken,
            _ => tokio::select! {
                r = tokio::io::copy_bidirectional_with_sizes(
                    &mut client, &mut upstream, UP_BUFFER, DOWN_BUFFER,
                ) => splice_end(r),
                _ = meter.idle(self.config.idle_timeout) => Reason::Timeout,
                _ = revoked(&mut rx, &host, addr) => Reason::PolicyChanged,
                _ = self.closed() => Reason::BrokerClosed,
            },
        };
        let (up, down) = meter.totals();
        let (decision, line) = match reason {
            Reason::PolicyChanged => (
                Decision::Refused,
                format!(
                    "network: {host_s}:{port} closed: the policy no longer allows it (allowed: {})",
                    self.policy.load().summary()
                ),
            ),
            Reason::Timeout => (
                Decision::Allowed,
                format!(
                    "network: {host_s}:{port} closed after {}s idle",
                    self.config.idle_timeout.as_secs()
                ),
            ),
            Reason::BrokerClosed => (
                Decision::Allowed,
                format!(
                    "network: {host_s}:{port} closed with the sandbox ({up} bytes up, {down} down)"
                ),
            ),
            Reason::UpstreamUnverified => (
                Decision::Failed,
                format!(
                    "network: {host_s}:{port} failed: the real host's certificate did not verify"
                ),
            ),
            _ => (
                Decision::Allowed,
                format!(
                    "network: {host_s}:{port} allowed{} ({up} bytes up, {down} down)",
                    if intercepted {
                        ", secrets filled in"
                    } else {
                        ""
                    }
                ),
            ),
        };
        let ev = self.event(
            &subject,
            decision,
            reason,
            Some(addr),
            Some(&meter),
            line,
            intercepted,
        );
        self.send(ev);
    }

    /// Reads the tunnel's first bytes into `first` until they make a
    /// ClientHello naming `name`.
    async fn read_hello<S: AsyncRead + Unpin>(
        &self,
        client: &mut S,
        first: &mut Vec<u8>,
        name: &str,
    ) -> Result<(), (Decision, Reason, String)> {
        let mut reader = HelloReader::new(self.config.max_hello_bytes);
        let deadline = Instant::now() + self.config.hello_timeout;
        let mut buf = vec![0u8; 8192];
        loop {
            let n = match tokio::time::timeout_at(deadline, client.read(&mut buf)).await {
                Err(_) => {
                    return Err((
                        Decision::Refused,
                        Reason::Timeout,
                        "no TLS ClientHello arrived in time".into(),
                    ));
                }
                Ok(Err(e)) => return Err((Decision::Failed, Reason::Broken, e.to_string())),
                Ok(Ok(0)) => {
                    return Err((
                        Decision::Failed,
                        Reason::Broken,
                        "the client closed the tunnel before TLS started".into(),
                    ));
                }
                Ok(Ok(n)) => n,
            };
            first.extend_from_slice(&buf[..n]);
            match reader.feed(&buf[..n]) {
                Hello::NeedMore => continue,
                Hello::NotTls => {
                    return Err((
                        Decision::Refused,
                        Reason::NotTls,
                        "a tunnel to a name must start with a TLS ClientHello".into(),
                    ));
                }
                Hello::Tls { sni: None } => {
                    return Err((
                        Decision::Refused,
                        Reason::NoSni,
                        "the TLS ClientHello names no server (SNI)".into(),
                    ));
                }
                Hello::Tls { sni: Some(s) } if s != name => {
                    let shown: String = s.chars().take(100).collect();
                    return Err((
                        Decision::Refused,
                        Reason::SniMismatch,
                        format!("the TLS server name {shown:?} differs from the CONNECT host"),
                    ));
                }
                Hello::Tls { .. } => return Ok(()),
            }
        }
    }
}

/// How a splice ended. Peers that reset or vanish instead of closing are
/// common (many TLS clients close that way) and are a normal end: TLS
/// itself tells its ends apart from truncation.
fn splice_end(r: io::Result<(u64, u64)>) -> Reason {
    match r {
        Ok(_) => Reason::Listed,
        Err(e)
            if matches!(
                e.kind(),
                io::ErrorKind::ConnectionReset
                    | io::ErrorKind::BrokenPipe
                    | io::ErrorKind::NotConnected
            ) =>
        {
            Reason::Listed
        }
        Err(e) => {
            tracing::debug!("broker: tunnel: {e}");
            Reason::Broken
        }
    }
}

/// Resolves when the policy changes so that it no longer allows `host` on
/// `addr` (its port included).
async fn revoked(rx: &mut watch::Receiver<Arc<Policy>>, host: &Host, addr: SocketAddr) {
    loop {
        if rx.changed().await.is_err() {
            return std::future::pending().await;
        }
        let p = rx.borrow_and_update().clone();
        let still = p.check(host, addr.port()).is_ok()
            && (matches!(host, Host::Ip(_)) || p.address_permitted(addr.ip(), addr.port()));
        if !still {
            return;
        }
    }
}
