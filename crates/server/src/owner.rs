//! What owns a sandbox and a workspace in this server: a job, an API
//! session, or a sandbox of the sandbox API (which owns itself). The registries of live sandboxes and network policies are
//! keyed by it, and every answer about one names it the same way, so a new
//! kind of owner is one variant here and the compiler lists the rest.

use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    Job(String),
    Session(String),
    Sandbox(String),
}

impl Owner {
    pub fn id(&self) -> &str {
        match self {
            Owner::Job(id) | Owner::Session(id) | Owner::Sandbox(id) => id,
        }
    }

    /// The word for its kind, as answers use it ("no such job").
    pub fn noun(&self) -> &'static str {
        match self {
            Owner::Job(_) => "job",
            Owner::Session(_) => "session",
            Owner::Sandbox(_) => "sandbox",
        }
    }

    /// Its resource's path under `/v1/`, without the slashes around it.
    pub fn collection(&self) -> &'static str {
        match self {
            Owner::Job(_) => "jobs",
            Owner::Session(_) => "sessions",
            Owner::Sandbox(_) => "sandboxes",
        }
    }

    /// `jobs/ID`: where its routes are, under `/v1/`.
    pub fn path(&self) -> String {
        format!("{}/{}", self.collection(), self.id())
    }

    /// Its id as a host name's label: `job-<hex>` (a label has no `_`).
    pub fn label(&self) -> String {
        self.id().replacen('_', "-", 1)
    }

    /// The owner a host name's label (or an id) names: `job-`, `ses-` or
    /// `sbx-` and hex, either case, `_` or `-`.
    pub fn from_label(label: &str) -> Option<Owner> {
        let (kind, rest) = label.split_once(['-', '_'])?;
        if rest.is_empty() || rest.len() > 64 || !rest.bytes().all(|b| b.is_ascii_hexdigit()) {
            return None;
        }
        let kind = kind.to_ascii_lowercase();
        let id = format!("{kind}_{}", rest.to_ascii_lowercase());
        match kind.as_str() {
            "job" => Some(Owner::Job(id)),
            "ses" => Some(Owner::Session(id)),
            "sbx" => Some(Owner::Sandbox(id)),
            _ => None,
        }
    }
}

/// The kinds of owner, for what a server makes before its owner exists
/// (its warm pools). Ids and directories are per kind, so what is made
/// ahead is made for one kind and taken by one of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Kind {
    Job,
    Session,
    Sandbox,
}

impl Kind {
    pub const ALL: [Kind; 3] = [Kind::Job, Kind::Session, Kind::Sandbox];

    /// What its ids start with.
    pub fn prefix(self) -> &'static str {
        match self {
            Kind::Job => "job_",
            Kind::Session => "ses_",
            Kind::Sandbox => "sbx_",
        }
    }

    /// The kind whose ids look like `id`.
    pub fn of_id(id: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| id.starts_with(k.prefix()))
    }

    /// Its owner's noun, as answers and logs use it.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Job => "job",
            Kind::Session => "session",
            Kind::Sandbox => "sandbox",
        }
    }

    /// Its resource's path under `/v1/` (`jobs`): how an operator names it.
    pub fn collection(self) -> &'static str {
        match self {
            Kind::Job => "jobs",
            Kind::Session => "sessions",
            Kind::Sandbox => "sandboxes",
        }
    }
}

/// Where browsers reach sandboxes' ports by name (`cordon serve
/// --sandbox-domain [SCHEME://]NAME[:PORT]`): port P of owner O is
/// `P-<O's label>.NAME`. The operator owns the wildcard's DNS (and its
/// certificate, for https); `localhost` needs neither, as browsers resolve
/// its names to this machine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxDomain {
    /// Lowercase, no dot at either end.
    name: String,
    /// How browsers reach it, when it is not as this server is served (a
    /// proxy in front terminates TLS).
    scheme: Option<&'static str>,
    /// The port browsers reach it on, when it is not the default one.
    port: Option<u16>,
}

/// How this server itself is served: the defaults of a [`SandboxDomain`].
#[derive(Debug, Clone, Copy)]
pub struct Served {
    pub scheme: &'static str,
    pub port: u16,
}

impl std::str::FromStr for SandboxDomain {
    type Err = String;

    fn from_str(s: &str) -> Result<SandboxDomain, String> {
        let bad = || {
            format!(
                "{s:?} is no domain name (such as sandboxes.example.com, or https://sandboxes.example.com:8443)"
            )
        };
        let t = s.trim();
        let (scheme, rest) = match t.split_once("://") {
            Some((sch, rest)) => match sch.to_ascii_lowercase().as_str() {
                "http" => (Some("http"), rest),
                "https" => (Some("https"), rest),
                _ => return Err(bad()),
            },
            None => (None, t),
        };
        let (host, port) = match rest.rsplit_once(':') {
            Some((h, p)) => (
                h,
                Some(p.parse::<u16>().ok().filter(|p| *p > 0).ok_or_else(bad)?),
            ),
            None => (rest, None),
        };
        let name = host
            .trim_start_matches("*.")
            .trim_end_matches('.')
            .to_ascii_lowercase();
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.len() <= 63
                && l.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-')
                && !l.starts_with('-')
                && !l.ends_with('-')
        };
        // One label would be a top-level domain, but for `localhost`.
        if (name != "localhost" && name.split('.').count() < 2) || !name.split('.').all(label_ok) {
            return Err(bad());
        }
        Ok(SandboxDomain { name, scheme, port })
    }
}

impl SandboxDomain {
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether a request's `Host` is a name under the domain (one of
    /// these names or not): such a name is never the API's.
    pub fn covers(&self, host: &str) -> bool {
        self.label_of(host).is_some()
    }

    /// What a `Host` under the domain has before it, lowercase.
    fn label_of(&self, host: &str) -> Option<String> {
        let host = match host.rsplit_once(':') {
            Some((h, p)) if p.bytes().all(|b| b.is_ascii_digit()) => h,
            _ => host,
        };
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        let label = host.strip_suffix(&self.name)?.strip_suffix('.')?;
        (!label.is_empty()).then(|| label.to_string())
    }

    /// The port and owner a request's `Host` names, if it is one of these
    /// names.
    pub fn parse_host(&self, host: &str) -> Option<(u16, Owner)> {
        let label = self.label_of(host)?;
        if label.contains('.') {
            return None;
        }
        let (port, owner) = label.split_once('-')?;
        let port: u16 = port.parse().ok().filter(|&p| p > 0)?;
        Some((port, Owner::from_label(owner)?))
    }

    /// `NAME[:PORT]`: what follows a port's label in its host, the port
    /// given when browsers do not assume it.
    pub fn authority(&self, served: Served) -> String {
        let scheme = self.scheme(served);
        let port = match (self.scheme, self.port) {
            (_, Some(p)) => p,
            // A proxy in front: on its scheme's port.
            (Some(_), None) => default_port(scheme),
            (None, None) => served.port,
        };
        if port == default_port(scheme) {
            self.name.clone()
        } else {
            format!("{}:{port}", self.name)
        }
    }

    pub fn scheme(&self, served: Served) -> &'static str {
        self.scheme.unwrap_or(served.scheme)
    }

    /// The origin of `owner`'s port `port`: `http[s]://P-LABEL.NAME[:PORT]`.
    pub fn origin(&self, owner: &Owner, port: impl fmt::Display, served: Served) -> String {
        format!(
            "{}://{port}-{}.{}",
            self.scheme(served),
            owner.label(),
            self.authority(served)
        )
    }
}

fn default_port(scheme: &str) -> u16 {
    if scheme == "https" { 443 } else { 80 }
}

impl fmt::Display for Owner {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.noun(), self.id())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_owner_is_named_the_same_way_everywhere() {
        let job = Owner::Job("a1".into());
        assert_eq!((job.noun(), job.path()), ("job", "jobs/a1".into()));
        assert_eq!(job.to_string(), "job a1");
        let session = Owner::Session("b2".into());
        assert_eq!(session.path(), "sessions/b2");
        assert_ne!(job, Owner::Session("a1".into()));
    }

    #[test]
    fn labels_name_owners_and_nothing_else() {
        for owner in [
            Owner::Job("job_00ff".into()),
            Owner::Session("ses_ab12".into()),
            Owner::Sandbox("sbx_9e".into()),
        ] {
            assert_eq!(Owner::from_label(&owner.label()), Some(owner.clone()));
            assert_eq!(Owner::from_label(owner.id()), Some(owner));
        }
        assert_eq!(
            Owner::from_label("JOB-00FF"),
            Some(Owner::Job("job_00ff".into()))
        );
        for no in [
            "job",
            "job-",
            "job-xyz",
            "usr-00ff",
            "job-00ff-1",
            "job--00",
        ] {
            assert_eq!(Owner::from_label(no), None, "{no}");
        }
    }

    #[test]
    fn sandbox_domains_name_ports_of_owners() {
        let d: SandboxDomain = "*.SB.Example.com.".parse().unwrap();
        assert_eq!(d.name(), "sb.example.com");
        assert!(d.covers("api.sb.example.com:8080"));
        assert!(!d.covers("sb.example.com") && !d.covers("xsb.example.com"));
        let job = Owner::Job("job_00ff".into());
        assert_eq!(
            d.parse_host("3000-job-00ff.sb.example.com"),
            Some((3000, job.clone()))
        );
        assert_eq!(
            d.parse_host("49983-SBX-00FF.SB.example.com.:443"),
            Some((49983, Owner::Sandbox("sbx_00ff".into())))
        );
        for no in [
            "sb.example.com",
            "api.sb.example.com",
            "3000-sbx-00ff.other.com",
            "a.3000-sbx-00ff.sb.example.com",
            "0-sbx-00ff.sb.example.com",
            "99999-sbx-00ff.sb.example.com",
            "3000-usr-00ff.sb.example.com",
            "3000-sbx-00ff.xsb.example.com",
        ] {
            assert_eq!(d.parse_host(no), None, "{no}");
        }
        // The port browsers use: this server's, unless said otherwise.
        let plain = Served {
            scheme: "http",
            port: 8080,
        };
        assert_eq!(
            d.origin(&job, 3000, plain),
            "http://3000-job-00ff.sb.example.com:8080"
        );
        let tls = Served {
            scheme: "https",
            port: 443,
        };
        assert_eq!(
            d.origin(&job, 5173, tls),
            "https://5173-job-00ff.sb.example.com"
        );
        let proxied: SandboxDomain = "https://sb.example.com".parse().unwrap();
        assert_eq!(
            proxied.origin(&job, 80, plain),
            "https://80-job-00ff.sb.example.com"
        );
        assert_eq!(proxied.authority(plain), "sb.example.com");
        let odd: SandboxDomain = "sb.example.com:8443".parse().unwrap();
        assert_eq!(odd.authority(tls), "sb.example.com:8443");
        let local: SandboxDomain = "localhost".parse().unwrap();
        assert_eq!(
            local.origin(&job, 3000, plain),
            "http://3000-job-00ff.localhost:8080"
        );
        for bad in [
            "com",
            "a..b",
            "-a.b",
            "a_b.c",
            "x.y/z",
            "ftp://a.b",
            "a.b:0",
            "a.b:x",
            "a-.b",
        ] {
            assert!(bad.parse::<SandboxDomain>().is_err(), "{bad}");
        }
    }
}
