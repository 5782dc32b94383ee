//! Reading the server name from the first bytes of a tunnel.
//!
//! The parsing is rustls's own ([`rustls::server::Acceptor`]): it joins a
//! ClientHello split across TLS records and across reads, and refuses
//! malformed ones. This module only feeds it bytes as they come, bounded.

/// What the bytes so far say.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Hello {
    /// A ClientHello may still come: read more.
    NeedMore,
    /// A complete ClientHello, with its SNI (lower case, no trailing dot)
    /// if it had one.
    Tls { sni: Option<String> },
    /// Not TLS, a malformed ClientHello, or one over the size bound.
    NotTls,
}

/// Feeds bytes to a ClientHello parser until it decides.
pub struct HelloReader {
    acceptor: rustls::server::Acceptor,
    seen: usize,
    limit: usize,
    done: Option<Hello>,
}

impl HelloReader {
    /// A reader that gives up (as [`Hello::NotTls`]) past `limit` bytes.
    pub fn new(limit: usize) -> HelloReader {
        HelloReader {
            acceptor: rustls::server::Acceptor::default(),
            seen: 0,
            limit,
            done: None,
        }
    }

    /// Adds the next bytes read from the tunnel. Once it has decided, the
    /// answer stays the same whatever follows.
    pub fn feed(&mut self, mut bytes: &[u8]) -> Hello {
        if let Some(d) = &self.done {
            return d.clone();
        }
        if self.seen == 0 && bytes.first().is_some_and(|&b| b != 0x16) {
            return self.decide(Hello::NotTls);
        }
        self.seen += bytes.len();
        if self.seen > self.limit {
            return self.decide(Hello::NotTls);
        }
        while !bytes.is_empty() {
            match self.acceptor.read_tls(&mut bytes) {
                Ok(0) => break,
                Ok(_) => {}
                Err(_) => return self.decide(Hello::NotTls),
            }
        }
        match self.acceptor.accept() {
            Ok(None) => Hello::NeedMore,
            Ok(Some(accepted)) => {
                let sni = accepted
                    .client_hello()
                    .server_name()
                    .map(|s| s.trim_end_matches('.').to_ascii_lowercase());
                self.decide(Hello::Tls { sni })
            }
            Err(_) => self.decide(Hello::NotTls),
        }
    }

    fn decide(&mut self, h: Hello) -> Hello {
        self.done = Some(h.clone());
        h
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A minimal TLS 1.2-style ClientHello naming `name`, built by hand so
    /// the test does not depend on a TLS client.
    pub(crate) fn client_hello(name: Option<&str>) -> Vec<u8> {
        // signature_algorithms (ecdsa_secp256r1_sha256): every real client
        // sends it, and rustls requires it.
        let mut ext = vec![0, 13, 0, 4, 0, 2, 4, 3];
        if let Some(n) = name {
            let n = n.as_bytes();
            let mut list = vec![0u8];
            list.extend((n.len() as u16).to_be_bytes());
            list.extend(n);
            let mut data = (list.len() as u16).to_be_bytes().to_vec();
            data.extend(list);
            ext.extend(0u16.to_be_bytes());
            ext.extend((data.len() as u16).to_be_bytes());
            ext.extend(data);
        }
        let mut body = vec![0x03, 0x03];
        body.extend([7u8; 32]);
        body.push(0); // session id
        body.extend([0, 2, 0x13, 0x01]); // one cipher suite
        body.extend([1, 0]); // null compression
        body.extend((ext.len() as u16).to_be_bytes());
        body.extend(ext);
        let mut hs = vec![1u8];
        hs.extend(&(body.len() as u32).to_be_bytes()[1..]);
        hs.extend(body);
        let mut rec = vec![0x16, 0x03, 0x01];
        rec.extend((hs.len() as u16).to_be_bytes());
        rec.extend(hs);
        rec
    }

    #[test]
    fn whole_and_byte_by_byte() {
        let hello = client_hello(Some("Upstream.Test."));
        assert_eq!(
            HelloReader::new(1 << 16).feed(&hello),
            Hello::Tls {
                sni: Some("upstream.test".into())
            }
        );
        let mut r = HelloReader::new(1 << 16);
        let mut last = Hello::NeedMore;
        for b in &hello {
            last = r.feed(std::slice::from_ref(b));
        }
        assert_eq!(
            last,
            Hello::Tls {
                sni: Some("upstream.test".into())
            }
        );
    }

    #[test]
    fn no_sni_and_not_tls() {
        assert_eq!(
            HelloReader::new(1 << 16).feed(&client_hello(None)),
            Hello::Tls { sni: None }
        );
        assert_eq!(
            HelloReader::new(1 << 16).feed(b"GET / HTTP/1.1\r\n"),
            Hello::NotTls
        );
        assert_eq!(
            HelloReader::new(1 << 16).feed(b"SSH-2.0-x\r\n"),
            Hello::NotTls
        );
    }

    #[test]
    fn truncated_and_over_limit() {
        let hello = client_hello(Some("a.test"));
        for cut in 0..hello.len() {
            let got = HelloReader::new(1 << 16).feed(&hello[..cut]);
            assert!(
                matches!(got, Hello::NeedMore | Hello::NotTls),
                "{cut}: {got:?}"
            );
        }
        assert_eq!(HelloReader::new(20).feed(&hello), Hello::NotTls);
    }

    #[test]
    fn garbage_never_panics() {
        // A small xorshift: deterministic, no dependency.
        let mut x: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let base = client_hello(Some("a.test"));
        for round in 0..4000 {
            let mut r = HelloReader::new(1 << 14);
            let mut buf = if round % 2 == 0 {
                base.clone()
            } else {
                vec![0x16, 0x03, 0x01]
            };
            let flips = (next() % 8) as usize;
            for _ in 0..flips {
                let i = (next() as usize) % buf.len();
                buf[i] = next() as u8;
            }
            for _ in 0..(next() % 64) {
                buf.push(next() as u8);
            }
            let mut rest = &buf[..];
            while !rest.is_empty() {
                let n = 1 + (next() as usize) % rest.len();
                let _ = r.feed(&rest[..n]);
                rest = &rest[n..];
            }
        }
    }
}
