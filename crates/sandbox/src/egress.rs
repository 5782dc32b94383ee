//! Egress through cordon's broker ([`crate::Network::Allow`]): what a
//! sandbox's configuration says about it, and what the sandbox is told.
//!
//! The sandbox keeps its own network namespace with loopback only; the one
//! way out is an HTTP proxy on its loopback ([`PROXY_PORT`]) whose
//! listening socket the supervisor makes there and hands to the host, where
//! [`cordon_net::Broker`] serves it. Programs find it through the usual
//! proxy variables; a program that ignores them finds no route and no DNS.

use std::fmt;
use std::sync::Arc;

use cordon_net::{BrokerConfig, EventSink, PolicyHandle, Resolve, SystemResolver};

/// The port the broker listens on inside the sandbox, on 127.0.0.1: the
/// port HTTP proxies customarily use, so it reads as one in a log.
pub const PROXY_PORT: u16 = 3128;

/// The broker of one sandbox: its policy (which the caller may widen or
/// narrow while the sandbox runs), where its connection events go, and how
/// it resolves names.
#[derive(Clone)]
pub struct Egress {
    pub policy: PolicyHandle,
    pub events: Arc<dyn EventSink>,
    pub resolver: Arc<dyn Resolve>,
    pub broker: BrokerConfig,
}

impl Egress {
    /// A broker with `policy`, events to `events`, names resolved by the
    /// host's resolver, and the broker's default bounds.
    pub fn new(policy: PolicyHandle, events: Arc<dyn EventSink>) -> Egress {
        Egress {
            policy,
            events,
            resolver: Arc::new(SystemResolver),
            broker: BrokerConfig::default(),
        }
    }
}

impl fmt::Debug for Egress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Egress")
            .field("policy", &self.policy.load().summary())
            .finish_non_exhaustive()
    }
}

/// The variables that point programs at the broker: curl, pip, git and
/// Python's urllib read the lower- and upper-case proxy variables, npm its
/// own, cargo its own. Loopback stays direct, for servers the sandbox runs.
pub(crate) fn proxy_env() -> Vec<(String, String)> {
    let url = format!("http://127.0.0.1:{PROXY_PORT}");
    let direct = "localhost,127.0.0.1,::1";
    let mut env = Vec::new();
    for name in ["http_proxy", "https_proxy", "all_proxy"] {
        env.push((name.to_string(), url.clone()));
        env.push((name.to_ascii_uppercase(), url.clone()));
    }
    env.push(("no_proxy".into(), direct.into()));
    env.push(("NO_PROXY".into(), direct.into()));
    env.push(("npm_config_proxy".into(), url.clone()));
    env.push(("npm_config_https_proxy".into(), url.clone()));
    env.push(("CARGO_HTTP_PROXY".into(), url));
    env
}
