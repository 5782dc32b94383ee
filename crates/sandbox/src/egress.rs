//! Egress through cordon's broker ([`crate::Network::Allow`]): what a
//! sandbox's configuration says about it, and what the sandbox is told.
//!
//! The sandbox keeps its own network namespace with loopback only; the one
//! way out is an HTTP proxy on its loopback ([`PROXY_PORT`]) whose
//! listening socket the supervisor makes there and hands to the host, where
//! [`cordon_net::Broker`] serves it. Programs find it through the usual
//! proxy variables; a program that ignores them finds no route and no DNS.

use std::collections::HashSet;
use std::fmt;
use std::sync::Arc;

use cordon_net::{
    BrokerConfig, Decision, EventSink, NetEvent, PolicyHandle, PolicySpec, Resolve, SystemResolver,
};
use tokio::sync::broadcast;

/// The port the broker listens on inside the sandbox, on 127.0.0.1: the
/// port HTTP proxies customarily use, so it reads as one in a log.
pub const PROXY_PORT: u16 = 3128;

/// The broker of one sandbox, as configured: its rules (presets among
/// them are expanded when the sandbox is created, from the host tools' own
/// configuration and never the workspace's), how it resolves names, its
/// bounds, and an optional sink that sees every connection too. The live
/// policy, its expansion's warnings and a subscription to the events are
/// on the sandbox ([`crate::Sandbox::network`]).
#[derive(Clone)]
pub struct Egress {
    pub spec: PolicySpec,
    pub resolver: Arc<dyn Resolve>,
    pub broker: BrokerConfig,
    pub events: Option<Arc<dyn EventSink>>,
}

impl Egress {
    /// A broker allowing what `spec` lists, with names resolved by the
    /// host's resolver and the broker's default bounds.
    pub fn new(spec: PolicySpec) -> Egress {
        Egress {
            spec,
            resolver: Arc::new(SystemResolver),
            broker: BrokerConfig::default(),
            events: None,
        }
    }
}

impl fmt::Debug for Egress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Egress")
            .field("spec", &self.spec)
            .finish_non_exhaustive()
    }
}

/// A live sandbox's egress: the policy the broker applies now (widen or
/// narrow it with [`PolicyHandle::set`]), what expanding its presets had
/// to say, and its connections as they end.
#[derive(Clone)]
pub struct NetworkInfo {
    pub policy: PolicyHandle,
    pub warnings: Vec<String>,
    pub(crate) events: broadcast::Sender<NetEvent>,
    /// The broker itself, for requests the host makes on the sandbox's
    /// behalf ([`NetworkInfo::fetcher`]).
    pub(crate) broker: cordon_net::Broker,
    /// The broker's interception of secrets, whose CA the fetcher trusts.
    pub(crate) intercept: Option<Arc<cordon_net::Intercept>>,
}

impl NetworkInfo {
    /// Makes GET requests as the sandbox would: through its broker, under
    /// its live policy, reported with its own connections (`web_fetch`).
    pub fn fetcher(&self) -> cordon_net::fetch::Fetcher {
        cordon_net::fetch::Fetcher::new(
            cordon_net::fetch::Route::Broker(self.broker.clone()),
            self.intercept.as_ref().map(|i| i.ca_der()),
        )
    }

    /// Every connection from now on, allowed or refused, as it ends (a
    /// refusal at once). A receiver that lags loses the oldest.
    pub fn subscribe(&self) -> broadcast::Receiver<NetEvent> {
        self.events.subscribe()
    }

    /// The connections refused (or failed) from now on, each host and
    /// port once, at most `max` of them (see [`Refusals`]).
    pub fn refusals(&self, max: usize) -> Refusals {
        Refusals {
            rx: self.subscribe(),
            seen: HashSet::new(),
            returned: 0,
            max,
            skipped: 0,
        }
    }
}

/// Hosts and ports a [`Refusals`] remembers at most: the sandbox chooses
/// how many distinct ones it tries, and the host's memory is not its to
/// fill. Past this, repeats are no longer told apart.
const REFUSALS_SEEN: usize = 4096;

/// What a front end reports of the broker's refusals: each refused or
/// failed host and port once, the first `max` of them; the rest, and any
/// a lagging receiver lost, only counted in [`Refusals::skipped`].
pub struct Refusals {
    rx: broadcast::Receiver<NetEvent>,
    seen: HashSet<(String, u16)>,
    returned: usize,
    max: usize,
    /// Refusals not returned: past `max`, or lost while lagging.
    pub skipped: u64,
}

impl Refusals {
    /// Whether `e` is a refusal to return.
    fn admit(&mut self, e: &NetEvent) -> bool {
        if e.decision == Decision::Allowed {
            return false;
        }
        let key = (e.host.clone(), e.port);
        if self.seen.contains(&key) {
            return false;
        }
        if self.seen.len() < REFUSALS_SEEN {
            self.seen.insert(key);
        }
        if self.returned < self.max {
            self.returned += 1;
            true
        } else {
            self.skipped += 1;
            false
        }
    }

    /// The next refusal to report; `None` once the broker is gone.
    pub async fn next(&mut self) -> Option<NetEvent> {
        loop {
            match self.rx.recv().await {
                Ok(e) if self.admit(&e) => return Some(e),
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(n)) => self.skipped += n,
                Err(broadcast::error::RecvError::Closed) => return None,
            }
        }
    }

    /// The refusals to report that came since the last look, without
    /// waiting.
    pub fn ready(&mut self) -> Vec<NetEvent> {
        let mut out = Vec::new();
        loop {
            match self.rx.try_recv() {
                Ok(e) if self.admit(&e) => out.push(e),
                Ok(_) => {}
                Err(broadcast::error::TryRecvError::Lagged(n)) => self.skipped += n,
                Err(_) => return out,
            }
        }
    }
}

impl fmt::Debug for NetworkInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NetworkInfo")
            .field("policy", &self.policy.load().summary())
            .field("warnings", &self.warnings)
            .finish_non_exhaustive()
    }
}

/// Events go to the sandbox's subscribers and to the configured sink.
pub(crate) struct Tee {
    pub(crate) events: broadcast::Sender<NetEvent>,
    pub(crate) sink: Option<Arc<dyn EventSink>>,
}

impl EventSink for Tee {
    fn emit(&self, event: NetEvent) {
        if let Some(sink) = &self.sink {
            sink.emit(event.clone());
        }
        // No subscriber is not an error: nobody is listening.
        let _ = self.events.send(event);
    }
}

/// Where the sandbox finds the broker's certificate authority, alone and
/// appended to the host's trust bundle, when secrets are filled in.
pub const CA_FILE: &str = "/etc/cordon/ca.pem";
pub const BUNDLE_FILE: &str = "/etc/cordon/bundle.pem";

/// The host's bundle of trusted certificates, which the sandbox's `/etc`
/// shows as well.
const HOST_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The CA and the bundle with it, for a broker that terminates TLS for
/// its secrets' hosts: programs in the sandbox must trust it for those
/// hosts (and only those: the CA is name-constrained to them).
///
/// Else, for an image sandbox asked to trust the host's authorities
/// ([`crate::SandboxConfig::host_certs`]), the host's bundle as both.
pub(crate) fn trust(config: &crate::SandboxConfig) -> Option<(String, String)> {
    let intercept = config
        .egress
        .as_ref()
        .filter(|_| config.network == crate::Network::Allow)
        .and_then(|e| e.broker.intercept.as_ref());
    let Some(intercept) = intercept else {
        if config.host_certs && config.image.is_some() {
            let bundle = std::fs::read_to_string(HOST_BUNDLE).ok()?;
            return Some((bundle.clone(), bundle));
        }
        return None;
    };
    let ca = intercept.ca_pem().to_string();
    let mut bundle = std::fs::read_to_string(HOST_BUNDLE).unwrap_or_default();
    if !bundle.is_empty() && !bundle.ends_with('\n') {
        bundle.push('\n');
    }
    bundle.push_str(&ca);
    Some((ca, bundle))
}

/// The variables that make programs trust [`BUNDLE_FILE`]: OpenSSL and
/// curl, Python's requests and pip, cargo, git; Node adds [`CA_FILE`] to
/// its own store.
pub(crate) fn trust_env() -> Vec<(String, String)> {
    let mut env: Vec<(String, String)> = [
        "SSL_CERT_FILE",
        "CURL_CA_BUNDLE",
        "REQUESTS_CA_BUNDLE",
        "PIP_CERT",
        "CARGO_HTTP_CAINFO",
        "GIT_SSL_CAINFO",
    ]
    .iter()
    .map(|k| (k.to_string(), BUNDLE_FILE.to_string()))
    .collect();
    env.push(("NODE_EXTRA_CA_CERTS".into(), CA_FILE.into()));
    env
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

#[cfg(test)]
mod tests {
    use super::*;
    use cordon_net::{Policy, Reason};

    fn event(host: &str, port: u16, decision: Decision) -> NetEvent {
        NetEvent {
            host: host.into(),
            port,
            method: "CONNECT".into(),
            decision,
            reason: Reason::NotListed,
            addr: None,
            bytes_up: 0,
            bytes_down: 0,
            duration_ms: 0,
            message: format!("network: {host}:{port} refused by policy"),
            intercepted: false,
        }
    }

    #[tokio::test]
    async fn refusals_come_once_each_bounded_and_the_rest_are_counted() {
        let (events, _) = broadcast::channel(64);
        let policy = PolicyHandle::new(Policy::deny_all());
        let info = NetworkInfo {
            policy: policy.clone(),
            warnings: Vec::new(),
            events: events.clone(),
            broker: cordon_net::Broker::new(
                policy,
                Arc::new(cordon_net::StaticResolver::new()),
                Arc::new(|_: NetEvent| {}),
                BrokerConfig::default(),
            ),
            intercept: None,
        };
        let mut r = info.refusals(2);
        for (host, port, decision) in [
            ("a.example", 443, Decision::Refused),
            ("a.example", 443, Decision::Refused),
            ("ok.example", 443, Decision::Allowed),
            ("a.example", 80, Decision::Failed),
            ("b.example", 443, Decision::Refused),
            ("b.example", 443, Decision::Refused),
            ("c.example", 443, Decision::Refused),
        ] {
            events.send(event(host, port, decision)).unwrap();
        }
        let got: Vec<(String, u16)> = r.ready().into_iter().map(|e| (e.host, e.port)).collect();
        assert_eq!(got, [("a.example".into(), 443), ("a.example".into(), 80)]);
        // b and c were past the two; b's repeat is still a repeat.
        assert_eq!(r.skipped, 2);
        assert!(r.ready().is_empty());

        // The host's memory of them is bounded, whatever the sandbox tries.
        let mut r = info.refusals(usize::MAX);
        let mut seen = 0;
        for i in 0..(REFUSALS_SEEN + 10) {
            events
                .send(event(&format!("h{i}.example"), 443, Decision::Refused))
                .unwrap();
            seen += r.ready().len();
        }
        assert_eq!(seen, REFUSALS_SEEN + 10);
        assert_eq!(r.seen.len(), REFUSALS_SEEN);
        drop(events);
        drop(info);
        assert!(r.next().await.is_none(), "the broker is gone");
    }
}
