//! The allow list: what a sandbox may reach through the broker.
//!
//! An entry is `HOST[:PORT]`:
//! - `example.org` names that host only; `*.example.org` names every name
//!   below it (`a.example.org`, `a.b.example.org`) but not `example.org`
//!   itself, which is listed separately when wanted. A bare `*` is refused:
//!   that is `--network full`, not an allow list.
//! - Names are compared normalised: lower case, one trailing dot dropped,
//!   international names in their IDNA (punycode) form. A name that the URL
//!   standard reads as an IPv4 address (`127.1`, `0x7f.0.0.1`) *is* that
//!   address, and is treated as one.
//! - `PORT` is a number or `*` (any port). Without a port an entry allows
//!   ports 80 and 443.
//! - IP addresses and CIDRs (`192.0.2.7`, `10.0.0.0/8:5432`, `[fd00::/8]:443`,
//!   `[::1]:8080`) allow connections to those addresses: a request for an IP
//!   literal needs one, and so does a *name* whose addresses fall in a
//!   restricted range (loopback, private...; see [`crate::addr`]), unless
//!   `allow_private` is set. Names never match IP rules and IPs never match
//!   name rules.
//! - `@name` is a preset, expanded on the host (`presets`).
//!
//! A bad entry is refused with an error that quotes it.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;
use std::sync::Arc;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::addr;

/// The presets an entry may name, without the `@`, each with what it
/// expands to (how is `presets`'s business; the generated reference says
/// what).
pub const PRESETS: &[(&str, &str)] = &[
    (
        "python",
        "the hosts of pip's effective indexes (its configuration files, `PIP_*` variables and built-in default, merged by pip) and the hosts each index serves its files from",
    ),
    (
        "node",
        "npm's registry (default included) and every `@scope:registry`, as `npm config list --json` gives them",
    ),
    (
        "rust",
        "cargo's registries from `$CARGO_HOME` (`[source.crates-io] replace-with`, `[registries.*] index`, `CARGO_REGISTRIES_*_INDEX`), else those its cache shows it has used, with a sparse registry's download host",
    ),
    (
        "debian",
        "the network URIs of apt's sources (`sources.list`, `sources.list.d/*.list`, deb822 `*.sources`; disabled stanzas skipped)",
    ),
    (
        "git-hosting",
        "a fixed list of public forges, port 443 (see `FORGES`)",
    ),
];

/// Why a policy entry or a host name was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("network rule {entry:?}: {why}")]
    BadEntry { entry: String, why: String },
    #[error("network rule {entry:?}: presets are expanded on the host before the policy is built")]
    UnexpandedPreset { entry: String },
}

fn bad(entry: &str, why: impl Into<String>) -> PolicyError {
    PolicyError::BadEntry {
        entry: entry.to_string(),
        why: why.into(),
    }
}

/// A destination host, normalised.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Host {
    /// A DNS name: lower case ASCII (punycode), no trailing dot.
    Name(String),
    /// An IP literal, canonical (IPv4-mapped IPv6 unmapped).
    Ip(IpAddr),
}

impl Host {
    /// Parses and normalises a host as found in a request (`[v6]` in
    /// brackets, as in a URL authority).
    pub fn parse(s: &str) -> Result<Host, String> {
        if s.is_empty() {
            return Err("empty host".into());
        }
        let s = s.strip_suffix('.').unwrap_or(s);
        if s.is_empty() || s.ends_with('.') {
            return Err("empty label".into());
        }
        match url::Host::parse(s).map_err(|e| e.to_string())? {
            url::Host::Ipv4(ip) => Ok(Host::Ip(IpAddr::V4(ip))),
            url::Host::Ipv6(ip) => Ok(Host::Ip(addr::canonical(IpAddr::V6(ip)))),
            url::Host::Domain(d) => {
                let d = d.to_ascii_lowercase();
                if d.len() > 253 {
                    return Err("name longer than 253 bytes".into());
                }
                for label in d.split('.') {
                    if label.is_empty() || label.len() > 63 {
                        return Err("empty or over-long label".into());
                    }
                    if !label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_')
                    {
                        return Err(format!("label {label:?} has characters a host name cannot"));
                    }
                }
                Ok(Host::Name(d))
            }
        }
    }
}

impl fmt::Display for Host {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Host::Name(n) => f.write_str(n),
            Host::Ip(IpAddr::V6(ip)) => write!(f, "[{ip}]"),
            Host::Ip(ip) => write!(f, "{ip}"),
        }
    }
}

/// Which ports a rule allows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ports {
    /// No port given: 80 and 443.
    Web,
    One(u16),
    Any,
}

impl Ports {
    pub fn contains(self, port: u16) -> bool {
        match self {
            Ports::Web => port == 80 || port == 443,
            Ports::One(p) => p == port,
            Ports::Any => true,
        }
    }
}

/// What a rule names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// Exactly this name.
    Name(String),
    /// Every name strictly below this one (`*.SUFFIX`).
    Below(String),
    /// These addresses.
    Net(IpNet),
}

/// One parsed allow rule.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rule {
    pub target: Target,
    pub ports: Ports,
}

impl Rule {
    /// A rule for one host name (already normalised or not) and port.
    pub fn host_port(host: &str, port: u16) -> Result<Rule, PolicyError> {
        Rule::from_str(&format!("{host}:{port}"))
    }

    /// Whether everything this rule allows, `other` allows too.
    fn within(&self, other: &Rule) -> bool {
        let ports = match (self.ports, other.ports) {
            (_, Ports::Any) => true,
            (Ports::Any, _) => false,
            (Ports::Web, Ports::Web) => true,
            (Ports::Web, Ports::One(_)) => false,
            (Ports::One(p), o) => o.contains(p),
        };
        let target = match (&self.target, &other.target) {
            (Target::Name(n), _) => other.matches_name(n),
            // *.a.b is within *.b and *.a.b, and not within any exact name.
            (Target::Below(s), Target::Below(t)) => s == t || other.matches_name(s),
            (Target::Net(a), Target::Net(b)) => b.contains(a),
            _ => false,
        };
        ports && target
    }

    pub(crate) fn matches_name(&self, name: &str) -> bool {
        match &self.target {
            Target::Name(n) => n == name,
            Target::Below(suffix) => {
                name.len() > suffix.len() + 1
                    && name.ends_with(suffix.as_str())
                    && name.as_bytes()[name.len() - suffix.len() - 1] == b'.'
            }
            Target::Net(_) => false,
        }
    }

    fn matches_ip(&self, ip: IpAddr) -> bool {
        matches!(&self.target, Target::Net(net) if net.contains(&ip))
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.target {
            Target::Name(n) => f.write_str(n)?,
            Target::Below(s) => write!(f, "*.{s}")?,
            Target::Net(net) => {
                let single = net.prefix_len() == net.max_prefix_len();
                match (net, single) {
                    (IpNet::V6(_), _) if !matches!(self.ports, Ports::Web) => {
                        if single {
                            write!(f, "[{}]", net.addr())?
                        } else {
                            write!(f, "[{net}]")?
                        }
                    }
                    (_, true) => write!(f, "{}", net.addr())?,
                    (_, false) => write!(f, "{net}")?,
                }
            }
        }
        match self.ports {
            Ports::Web => Ok(()),
            Ports::One(p) => write!(f, ":{p}"),
            Ports::Any => f.write_str(":*"),
        }
    }
}

impl FromStr for Rule {
    type Err = PolicyError;

    fn from_str(entry: &str) -> Result<Rule, PolicyError> {
        match Entry::from_str(entry)? {
            Entry::Rule(r) => Ok(r),
            Entry::Preset(_) => Err(PolicyError::UnexpandedPreset {
                entry: entry.to_string(),
            }),
        }
    }
}

/// A policy entry as a user writes it: a rule or a preset to expand.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Entry {
    Rule(Rule),
    /// A preset's name, without the `@`.
    Preset(String),
}

impl FromStr for Entry {
    type Err = PolicyError;

    fn from_str(entry: &str) -> Result<Entry, PolicyError> {
        let s = entry.trim();
        if s.is_empty() {
            return Err(bad(entry, "empty entry"));
        }
        if let Some(name) = s.strip_prefix('@') {
            if !PRESETS.iter().any(|(known, _)| *known == name) {
                return Err(bad(
                    entry,
                    format!(
                        "unknown preset; known: @{}",
                        PRESETS
                            .iter()
                            .map(|(n, _)| *n)
                            .collect::<Vec<_>>()
                            .join(", @")
                    ),
                ));
            }
            return Ok(Entry::Preset(name.to_string()));
        }
        let (host, port) = split_host_port(s).map_err(|why| bad(entry, why))?;
        let ports = match port {
            None => Ports::Web,
            Some("*") => Ports::Any,
            Some(p) => match p.parse::<u16>() {
                Ok(n) if n > 0 => Ports::One(n),
                _ => return Err(bad(entry, format!("port {p:?} is not 1-65535 or *"))),
            },
        };
        let target = parse_target(host).map_err(|why| bad(entry, why))?;
        Ok(Entry::Rule(Rule { target, ports }))
    }
}

/// Splits `HOST[:PORT]`, where an IPv6 host is in brackets or, without a
/// port, bare.
fn split_host_port(s: &str) -> Result<(&str, Option<&str>), String> {
    if let Some(rest) = s.strip_prefix('[') {
        let (inside, after) = rest.split_once(']').ok_or("unclosed [")?;
        return match after {
            "" => Ok((inside, None)),
            _ => match after.strip_prefix(':') {
                Some(p) => Ok((inside, Some(p))),
                None => Err("junk after ]".into()),
            },
        };
    }
    match s.matches(':').count() {
        0 => Ok((s, None)),
        1 => {
            let (h, p) = s.split_once(':').expect("one colon");
            Ok((h, Some(p)))
        }
        // A bare IPv6 address or CIDR: no port possible.
        _ => Ok((s, None)),
    }
}

fn parse_target(host: &str) -> Result<Target, String> {
    if host == "*" {
        return Err("a bare * would allow everything; use --network full for that".into());
    }
    if host.contains('/') {
        let net = IpNet::from_str(host).map_err(|_| format!("{host:?} is not a CIDR"))?;
        return Ok(Target::Net(canonical_net(net.trunc())));
    }
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(Target::Net(IpNet::from(addr::canonical(ip))));
    }
    if let Some(suffix) = host.strip_prefix("*.") {
        return match Host::parse(suffix)? {
            Host::Name(n) => Ok(Target::Below(n)),
            Host::Ip(_) => Err("a wildcard needs a name after *.".into()),
        };
    }
    if host.contains('*') {
        return Err("* is allowed only as a leading *. label".into());
    }
    match Host::parse(host)? {
        Host::Name(n) => Ok(Target::Name(n)),
        Host::Ip(ip) => Ok(Target::Net(IpNet::from(ip))),
    }
}

/// `::ffff:0:0/96`-style nets written for mapped addresses become IPv4.
fn canonical_net(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(v4) => ipnet::Ipv4Net::new(v4, v6.prefix_len() - 96)
                .map(IpNet::V4)
                .unwrap_or(net),
            None => net,
        },
        _ => net,
    }
}

/// Why the policy refuses a destination (before any connection).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// No rule names the host.
    NotListed,
    /// A rule names the host, but not on this port.
    PortNotListed,
}

/// The checked allow list. Build it with [`Policy::parse`] or
/// `preset_table::expand`; it cannot hold a preset or a bad rule.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "PolicySpec", into = "PolicySpec")]
pub struct Policy {
    rules: Vec<Rule>,
    allow_private: bool,
}

/// The wire and configuration form of a policy: entries as written.
/// Entries may name presets; `preset_table::expand` turns a spec into
/// a [`Policy`] on the host.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicySpec {
    #[serde(default)]
    pub allow: Vec<String>,
    /// Allow names that resolve to loopback, private, link-local...
    /// addresses (see [`crate::addr`]).
    #[serde(default)]
    pub allow_private: bool,
}

impl TryFrom<PolicySpec> for Policy {
    type Error = PolicyError;

    fn try_from(spec: PolicySpec) -> Result<Policy, PolicyError> {
        Policy::parse(&spec.allow, spec.allow_private)
    }
}

impl From<Policy> for PolicySpec {
    fn from(p: Policy) -> PolicySpec {
        PolicySpec {
            allow: p.rules.iter().map(Rule::to_string).collect(),
            allow_private: p.allow_private,
        }
    }
}

impl Policy {
    /// A policy from rules already parsed.
    pub fn new(rules: Vec<Rule>, allow_private: bool) -> Policy {
        let mut out = Policy {
            rules: Vec::new(),
            allow_private,
        };
        for r in rules {
            if !out.rules.contains(&r) {
                out.rules.push(r);
            }
        }
        out
    }

    /// Parses entries; presets are refused (expand them first).
    pub fn parse<S: AsRef<str>>(entries: &[S], allow_private: bool) -> Result<Policy, PolicyError> {
        let rules = entries
            .iter()
            .map(|e| Rule::from_str(e.as_ref()))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Policy::new(rules, allow_private))
    }

    /// Nothing allowed.
    pub fn deny_all() -> Policy {
        Policy::default()
    }

    pub fn rules(&self) -> &[Rule] {
        &self.rules
    }

    pub fn allow_private(&self) -> bool {
        self.allow_private
    }

    /// Whether the host (name or IP literal) and port are listed.
    pub fn check(&self, host: &Host, port: u16) -> Result<(), Refusal> {
        let mut host_seen = false;
        for r in &self.rules {
            let hit = match host {
                Host::Name(n) => r.matches_name(n),
                Host::Ip(ip) => r.matches_ip(*ip),
            };
            if hit {
                if r.ports.contains(port) {
                    return Ok(());
                }
                host_seen = true;
            }
        }
        Err(if host_seen {
            Refusal::PortNotListed
        } else {
            Refusal::NotListed
        })
    }

    /// Whether the broker may connect to `ip`, an address a listed name
    /// resolved to: public addresses yes; restricted ones only under
    /// `allow_private` or an IP rule that covers them on this port.
    pub fn address_permitted(&self, ip: IpAddr, port: u16) -> bool {
        let ip = addr::canonical(ip);
        !addr::is_restricted(ip)
            || self.allow_private
            || self
                .rules
                .iter()
                .any(|r| r.matches_ip(ip) && r.ports.contains(port))
    }

    /// This policy with `rules` added (a session widened live).
    pub fn widened(&self, rules: impl IntoIterator<Item = Rule>) -> Policy {
        Policy::new(
            self.rules.iter().cloned().chain(rules).collect(),
            self.allow_private,
        )
    }

    /// This policy without `rules` (a session narrowed live). Only rules
    /// equal to one of `rules` go; a wider rule stays.
    pub fn narrowed(&self, rules: &[Rule]) -> Policy {
        Policy::new(
            self.rules
                .iter()
                .filter(|r| !rules.contains(r))
                .cloned()
                .collect(),
            self.allow_private,
        )
    }

    /// This policy cut down to `ceiling`: the rules a ceiling rule covers,
    /// and `allow_private` only if the ceiling has it too.
    pub fn clamped_to(&self, ceiling: &Policy) -> Policy {
        Policy::new(
            self.rules
                .iter()
                .filter(|r| ceiling.rules.iter().any(|c| r.within(c)))
                .cloned()
                .collect(),
            self.allow_private && ceiling.allow_private,
        )
    }

    /// What this policy allows beyond `ceiling` (a tenant's limit): each
    /// rule no ceiling rule covers, and `allow_private` if the ceiling lacks
    /// it. Empty means the policy is within the ceiling.
    pub fn beyond(&self, ceiling: &Policy) -> Vec<String> {
        let mut out: Vec<String> = self
            .rules
            .iter()
            .filter(|r| !ceiling.rules.iter().any(|c| r.within(c)))
            .map(Rule::to_string)
            .collect();
        if self.allow_private && !ceiling.allow_private {
            out.push("allow_private".into());
        }
        out
    }

    /// The allow list in one line, for refusal messages (at most a dozen
    /// rules, then a count).
    pub fn summary(&self) -> String {
        if self.rules.is_empty() {
            return "nothing".into();
        }
        const SHOWN: usize = 12;
        let mut s = self
            .rules
            .iter()
            .take(SHOWN)
            .map(Rule::to_string)
            .collect::<Vec<_>>()
            .join(", ");
        if self.rules.len() > SHOWN {
            s.push_str(&format!(" and {} more", self.rules.len() - SHOWN));
        }
        s
    }
}

/// A policy that can be swapped while the broker runs. Every new
/// connection reads the current one; open tunnels watch it and close when
/// a change no longer allows them.
#[derive(Clone, Debug)]
pub struct PolicyHandle(Arc<watch::Sender<Arc<Policy>>>);

impl PolicyHandle {
    pub fn new(policy: Policy) -> PolicyHandle {
        PolicyHandle(Arc::new(watch::Sender::new(Arc::new(policy))))
    }

    /// The current policy.
    pub fn load(&self) -> Arc<Policy> {
        self.0.borrow().clone()
    }

    /// Replaces the policy; returns the previous one.
    pub fn set(&self, policy: Policy) -> Arc<Policy> {
        self.0.send_replace(Arc::new(policy))
    }

    /// A receiver that sees every later change.
    pub fn subscribe(&self) -> watch::Receiver<Arc<Policy>> {
        self.0.subscribe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(entries: &[&str]) -> Policy {
        Policy::parse(entries, false).unwrap()
    }

    fn name(s: &str) -> Host {
        Host::parse(s).unwrap()
    }

    #[test]
    fn exact_names_and_default_ports() {
        let pol = p(&["Example.ORG."]);
        assert_eq!(pol.check(&name("example.org"), 443), Ok(()));
        assert_eq!(pol.check(&name("EXAMPLE.org."), 80), Ok(()));
        assert_eq!(
            pol.check(&name("example.org"), 22),
            Err(Refusal::PortNotListed)
        );
        assert_eq!(
            pol.check(&name("www.example.org"), 443),
            Err(Refusal::NotListed)
        );
        assert_eq!(
            pol.check(&name("example.org.evil.test"), 443),
            Err(Refusal::NotListed)
        );
    }

    #[test]
    fn wildcard_is_below_only() {
        let pol = p(&["*.example.org:443"]);
        assert_eq!(pol.check(&name("a.example.org"), 443), Ok(()));
        assert_eq!(pol.check(&name("a.b.example.org"), 443), Ok(()));
        assert_eq!(
            pol.check(&name("example.org"), 443),
            Err(Refusal::NotListed)
        );
        assert_eq!(
            pol.check(&name("badexample.org"), 443),
            Err(Refusal::NotListed)
        );
        assert_eq!(
            pol.check(&name("a.example.org"), 80),
            Err(Refusal::PortNotListed)
        );
    }

    #[test]
    fn ports_any_and_one() {
        let pol = p(&["a.test:*", "b.test:8443"]);
        assert_eq!(pol.check(&name("a.test"), 1), Ok(()));
        assert_eq!(pol.check(&name("b.test"), 8443), Ok(()));
        assert_eq!(pol.check(&name("b.test"), 443), Err(Refusal::PortNotListed));
    }

    #[test]
    fn idna_names_compare_as_punycode() {
        let pol = p(&["bücher.example"]);
        assert_eq!(pol.check(&name("xn--bcher-kva.example"), 443), Ok(()));
        assert_eq!(pol.check(&name("BÜCHER.example"), 443), Ok(()));
    }

    #[test]
    fn ip_rules_only_match_ips() {
        let pol = p(&["10.0.0.0/8:5432", "[::1]:8080", "192.0.2.7"]);
        assert_eq!(
            pol.check(&Host::Ip("10.1.2.3".parse().unwrap()), 5432),
            Ok(())
        );
        assert_eq!(
            pol.check(&Host::Ip("10.1.2.3".parse().unwrap()), 80),
            Err(Refusal::PortNotListed)
        );
        assert_eq!(pol.check(&name("[::1]"), 8080), Ok(()));
        assert_eq!(pol.check(&name("192.0.2.7"), 443), Ok(()));
        assert_eq!(pol.check(&name("10.example"), 443), Err(Refusal::NotListed));
        // A numeric host the URL standard reads as IPv4 is that IP.
        assert_eq!(name("127.1"), Host::Ip("127.0.0.1".parse().unwrap()));
        assert_eq!(
            name("[::ffff:127.0.0.1]"),
            Host::Ip("127.0.0.1".parse().unwrap())
        );
        assert!(pol.address_permitted("10.9.9.9".parse().unwrap(), 5432));
        assert!(!pol.address_permitted("10.9.9.9".parse().unwrap(), 443));
        assert!(!pol.address_permitted("::ffff:10.9.9.9".parse().unwrap(), 443));
        assert!(pol.address_permitted("::ffff:10.9.9.9".parse().unwrap(), 5432));
        assert!(pol.address_permitted("1.1.1.1".parse().unwrap(), 443));
        assert!(
            Policy::parse(&["x.test"], true)
                .unwrap()
                .address_permitted("127.0.0.1".parse().unwrap(), 1)
        );
    }

    #[test]
    fn bad_entries_name_themselves() {
        for e in [
            "",
            "*",
            "a.*.test",
            "*.1.2.3.4",
            "a.test:0",
            "a.test:99999",
            "a.test:http",
            "[::1",
            "a b.test",
            "x..test",
            "10.0.0.0/40",
            "@nonesuch",
        ] {
            let err = Policy::parse(&[e], false).unwrap_err().to_string();
            assert!(err.contains(&format!("{e:?}")), "{e}: {err}");
        }
        assert!(matches!(
            Policy::parse(&["@python"], false),
            Err(PolicyError::UnexpandedPreset { .. })
        ));
    }

    #[test]
    fn serde_round_trip_and_unknown_fields() {
        let pol = p(&[
            "a.test",
            "*.b.test:8080",
            "10.0.0.0/8:*",
            "[fd00::/8]:443",
            "::1",
        ]);
        let json = serde_json::to_string(&pol).unwrap();
        let back: Policy = serde_json::from_str(&json).unwrap();
        assert_eq!(back, pol);
        assert!(
            serde_json::from_str::<Policy>(r#"{"allow":["a.test"],"allow_privat":true}"#).is_err()
        );
        let err = serde_json::from_str::<Policy>(r#"{"allow":["a b"]}"#)
            .unwrap_err()
            .to_string();
        assert!(err.contains("a b"), "{err}");
    }

    #[test]
    fn handle_swaps() {
        let h = PolicyHandle::new(p(&["a.test"]));
        let rx = h.subscribe();
        assert!(h.load().check(&name("a.test"), 443).is_ok());
        h.set(p(&["b.test"]));
        assert!(rx.has_changed().unwrap());
        assert!(h.load().check(&name("a.test"), 443).is_err());
        assert_eq!(h.load().summary(), "b.test");
    }

    #[test]
    fn ceilings_widening_and_narrowing() {
        let ceiling = p(&["*.example.org", "api.test:*", "10.0.0.0/8:5432"]);
        assert!(
            p(&[
                "a.example.org",
                "*.b.example.org:443",
                "api.test:8080",
                "10.1.0.0/16:5432"
            ])
            .beyond(&ceiling)
            .is_empty()
        );
        assert_eq!(
            p(&[
                "example.org",
                "a.example.org:22",
                "other.test",
                "10.0.0.0/8:*",
                "*.api.test"
            ])
            .beyond(&ceiling),
            [
                "example.org",
                "a.example.org:22",
                "other.test",
                "10.0.0.0/8:*",
                "*.api.test"
            ]
        );
        assert_eq!(
            Policy::parse(&["a.example.org"], true)
                .unwrap()
                .beyond(&ceiling),
            ["allow_private"]
        );
        let mixed = Policy::parse(&["a.example.org", "other.test", "api.test:8080"], true).unwrap();
        let clamped = mixed.clamped_to(&ceiling);
        assert_eq!(clamped.summary(), "a.example.org, api.test:8080");
        assert!(!clamped.allow_private());
        assert!(clamped.beyond(&ceiling).is_empty());
        let within = p(&["a.example.org"]);
        assert_eq!(within.clamped_to(&ceiling), within);
        let w = p(&["a.test"]).widened([Rule::host_port("b.test", 8080).unwrap()]);
        assert_eq!(w.summary(), "a.test, b.test:8080");
        assert_eq!(
            w.narrowed(&["a.test".parse().unwrap()]).summary(),
            "b.test:8080"
        );
    }
}
