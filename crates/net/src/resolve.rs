//! Name resolution, done by the broker on the host (the sandbox has no DNS).
//! Injectable so tests decide what a name resolves to.

use std::collections::HashMap;
use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;

/// The future a resolver returns.
pub type Resolving<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Resolves a host name to its addresses.
pub trait Resolve: Send + Sync + 'static {
    fn resolve<'a>(&'a self, name: &'a str) -> Resolving<'a>;
}

/// The host's own resolver (getaddrinfo through tokio, so `/etc/hosts`
/// and the host's DNS configuration apply).
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> Resolving<'a> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((name, 0)).await?;
            let mut out: Vec<IpAddr> = Vec::new();
            for a in addrs {
                if !out.contains(&a.ip()) {
                    out.push(a.ip());
                }
            }
            Ok(out)
        })
    }
}

/// A fixed table, for tests: unknown names fail to resolve.
#[derive(Debug, Default, Clone)]
pub struct StaticResolver(pub HashMap<String, Vec<IpAddr>>);

impl StaticResolver {
    pub fn new() -> StaticResolver {
        StaticResolver::default()
    }

    /// Adds `name` resolving to `addrs`.
    pub fn with(mut self, name: &str, addrs: &[IpAddr]) -> StaticResolver {
        self.0.insert(name.to_string(), addrs.to_vec());
        self
    }
}

impl Resolve for StaticResolver {
    fn resolve<'a>(&'a self, name: &'a str) -> Resolving<'a> {
        let r = self.0.get(name).cloned().ok_or_else(|| {
            io::Error::new(io::ErrorKind::NotFound, format!("{name}: no such name"))
        });
        Box::pin(std::future::ready(r))
    }
}
