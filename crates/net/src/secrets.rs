//! Secrets the sandbox can use but never see.
//!
//! A [`Secret`] has a name, a value and the hosts it is for. Inside the
//! sandbox only its placeholder exists (`CORDON_SECRET_<NAME>`, e.g. in an
//! environment variable). When the sandbox opens a CONNECT tunnel to one of
//! the secret's hosts, the broker terminates its TLS with a certificate from
//! a certificate authority made for this sandbox ([`Intercept`]; the sandbox
//! trusts its [`Intercept::ca_pem`]), reads the HTTP/1.1 requests, puts the
//! value in place of the placeholder in the request line and headers
//! (inside `Authorization: Basic` too), and forwards them over TLS to the
//! real host, whose certificate it verifies against the system's roots.
//!
//! What it does not do, and why: request and response *bodies* are carried
//! untouched (they stream, and tokens belong in headers); the value is put
//! back to the placeholder in response headers, but a host that echoes a
//! request into a response body would show it to the sandbox, so scope
//! secrets to hosts that do not. Tunnels to other hosts are not terminated
//! at all: the placeholder travels there as it is. The CA is name-constrained
//! to the secrets' hosts, so even the sandbox's trust in it reaches no
//! further.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, GeneralSubtree, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, NameConstraints,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use serde::{Deserialize, Serialize};

use crate::policy::{Rule, Target};

/// Why a secret or the interception setup was refused.
#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("secret {name:?}: {why}")]
    Bad { name: String, why: String },
    #[error("the sandbox's certificate authority: {0}")]
    Ca(String),
}

/// The wire and configuration form of a secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SecretSpec {
    /// `[A-Z0-9_]`, up to 64: the placeholder is `CORDON_SECRET_<NAME>`.
    pub name: String,
    pub value: String,
    /// Host names (`host`, `*.host`, with `:PORT` or not, as in the policy).
    pub hosts: Vec<String>,
}

impl fmt::Debug for SecretSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SecretSpec")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

/// A checked secret.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "SecretSpec", into = "SecretSpec")]
pub struct Secret {
    name: String,
    value: String,
    hosts: Vec<Rule>,
    placeholder: String,
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Secret")
            .field("name", &self.name)
            .field("hosts", &self.hosts)
            .finish_non_exhaustive()
    }
}

impl TryFrom<SecretSpec> for Secret {
    type Error = SecretError;

    fn try_from(s: SecretSpec) -> Result<Secret, SecretError> {
        Secret::new(&s.name, &s.value, &s.hosts)
    }
}

impl From<Secret> for SecretSpec {
    fn from(s: Secret) -> SecretSpec {
        SecretSpec {
            name: s.name,
            value: s.value,
            hosts: s.hosts.iter().map(Rule::to_string).collect(),
        }
    }
}

impl Secret {
    pub fn new<S: AsRef<str>>(name: &str, value: &str, hosts: &[S]) -> Result<Secret, SecretError> {
        let bad = |why: &str| SecretError::Bad {
            name: name.to_string(),
            why: why.to_string(),
        };
        if name.is_empty()
            || name.len() > 64
            || !name
                .bytes()
                .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
        {
            return Err(bad("the name must be 1-64 of A-Z, 0-9 and _"));
        }
        if value.is_empty() || value.len() > 16 * 1024 {
            return Err(bad("the value must be 1 byte to 16 KiB"));
        }
        if value.bytes().any(|b| b.is_ascii_control()) {
            return Err(bad(
                "the value cannot hold control characters (it goes into HTTP headers)",
            ));
        }
        if hosts.is_empty() {
            return Err(bad("a secret needs at least one host"));
        }
        let mut rules = Vec::new();
        for h in hosts {
            let rule: Rule = h
                .as_ref()
                .parse()
                .map_err(|e: crate::PolicyError| bad(&e.to_string()))?;
            if matches!(rule.target, Target::Net(_)) {
                return Err(bad(
                    "hosts must be names: TLS to an IP cannot be checked by name",
                ));
            }
            rules.push(rule);
        }
        let placeholder = format!("CORDON_SECRET_{name}");
        if value.contains("CORDON_SECRET_") {
            return Err(bad("the value cannot hold a placeholder"));
        }
        Ok(Secret {
            name: name.to_string(),
            value: value.to_string(),
            hosts: rules,
            placeholder,
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// What the sandbox sees instead of the value.
    pub fn placeholder(&self) -> &str {
        &self.placeholder
    }

    pub fn hosts(&self) -> &[Rule] {
        &self.hosts
    }

    fn applies(&self, host: &str, port: u16) -> bool {
        self.hosts
            .iter()
            .any(|r| r.matches_name(host) && r.ports.contains(port))
    }
}

/// A sandbox's TLS interception for its secrets: the certificate authority
/// the sandbox trusts, the certificates it issues per host, and the roots
/// the broker checks the real hosts against.
pub struct Intercept {
    secrets: Vec<Secret>,
    ca_der: CertificateDer<'static>,
    ca_pem: String,
    issuer: Issuer<'static, KeyPair>,
    leaves: Mutex<HashMap<String, Arc<ServerConfig>>>,
    upstream: Arc<ClientConfig>,
}

impl fmt::Debug for Intercept {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Intercept")
            .field("secrets", &self.secrets)
            .finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::aws_lc_rs::default_provider())
}

impl Intercept {
    /// Interception for `secrets`, checking real hosts against the
    /// system's certificate store.
    pub fn new(secrets: Vec<Secret>) -> Result<Intercept, SecretError> {
        let found = rustls_native_certs::load_native_certs();
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(found.certs);
        if added == 0 {
            return Err(SecretError::Ca(
                "no usable certificate in the system's store to check real hosts with".into(),
            ));
        }
        Intercept::with_roots(secrets, roots)
    }

    /// Interception that checks real hosts against `roots`.
    pub fn with_roots(
        secrets: Vec<Secret>,
        roots: RootCertStore,
    ) -> Result<Intercept, SecretError> {
        let ca = |e: rcgen::Error| SecretError::Ca(e.to_string());
        let mut params = CertificateParams::new(Vec::<String>::new()).map_err(ca)?;
        params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        params
            .distinguished_name
            .push(DnType::CommonName, "cordon sandbox secrets CA");
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let mut permitted = Vec::new();
        for s in &secrets {
            for r in &s.hosts {
                let name = match &r.target {
                    Target::Name(n) | Target::Below(n) => n.clone(),
                    Target::Net(_) => continue,
                };
                if !permitted.contains(&GeneralSubtree::DnsName(name.clone())) {
                    permitted.push(GeneralSubtree::DnsName(name));
                }
            }
        }
        params.name_constraints = Some(NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: Vec::new(),
        });
        let key = KeyPair::generate().map_err(ca)?;
        let cert = params.self_signed(&key).map_err(ca)?;
        let mut upstream = ClientConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| SecretError::Ca(e.to_string()))?
            .with_root_certificates(roots)
            .with_no_client_auth();
        upstream.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Intercept {
            secrets,
            ca_der: cert.der().clone(),
            ca_pem: cert.pem(),
            issuer: Issuer::new(params, key),
            leaves: Mutex::default(),
            upstream: Arc::new(upstream),
        })
    }

    /// The CA certificate (PEM) the sandbox must trust.
    pub fn ca_pem(&self) -> &str {
        &self.ca_pem
    }

    /// The CA certificate (DER).
    pub fn ca_der(&self) -> &CertificateDer<'static> {
        &self.ca_der
    }

    pub fn secrets(&self) -> &[Secret] {
        &self.secrets
    }

    /// The secrets for `host:port`; empty means the tunnel is not
    /// intercepted.
    pub(crate) fn scoped(&self, host: &str, port: u16) -> Vec<Secret> {
        self.secrets
            .iter()
            .filter(|s| s.applies(host, port))
            .cloned()
            .collect()
    }

    pub(crate) fn upstream(&self) -> Arc<ClientConfig> {
        self.upstream.clone()
    }

    /// The TLS server configuration for `host`, with a certificate issued
    /// for it (made once per host).
    pub(crate) fn server_config(&self, host: &str) -> Result<Arc<ServerConfig>, SecretError> {
        let mut leaves = self.leaves.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(c) = leaves.get(host) {
            return Ok(c.clone());
        }
        let ca = |e: rcgen::Error| SecretError::Ca(e.to_string());
        let mut params = CertificateParams::new(vec![host.to_string()]).map_err(ca)?;
        params.distinguished_name.push(DnType::CommonName, host);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let key = KeyPair::generate().map_err(ca)?;
        let cert = params.signed_by(&key, &self.issuer).map_err(ca)?;
        let der_key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .map_err(|e| SecretError::Ca(e.to_string()))?
            .with_no_client_auth()
            .with_single_cert(vec![cert.der().clone(), self.ca_der.clone()], der_key)
            .map_err(|e| SecretError::Ca(e.to_string()))?;
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        let config = Arc::new(config);
        leaves.insert(host.to_string(), config.clone());
        Ok(config)
    }
}

/// Replaces every `from` in `bytes` with `to`.
fn replace(bytes: &[u8], from: &[u8], to: &[u8]) -> Option<Vec<u8>> {
    if from.is_empty() || bytes.len() < from.len() {
        return None;
    }
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    let mut hit = false;
    while i < bytes.len() {
        if bytes[i..].starts_with(from) {
            out.extend_from_slice(to);
            i += from.len();
            hit = true;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    hit.then_some(out)
}

/// Puts the values in place of placeholders in request headers (inside
/// `Basic` credentials too) and the request target.
pub(crate) fn fill(headers: &mut http::HeaderMap, uri: &mut http::Uri, secrets: &[Secret]) {
    use base64::Engine;
    let b64 = base64::engine::general_purpose::STANDARD;
    for (name, v) in headers.iter_mut() {
        let mut bytes = v.as_bytes().to_vec();
        let mut changed = false;
        if name == http::header::AUTHORIZATION
            && let Some(cred) = bytes.strip_prefix(b"Basic ")
            && let Ok(plain) = b64.decode(cred.trim_ascii())
        {
            let mut plain = plain;
            for s in secrets {
                if let Some(p) = replace(&plain, s.placeholder.as_bytes(), s.value.as_bytes()) {
                    plain = p;
                    changed = true;
                }
            }
            if changed {
                bytes = format!("Basic {}", b64.encode(&plain)).into_bytes();
            }
        }
        for s in secrets {
            if let Some(b) = replace(&bytes, s.placeholder.as_bytes(), s.value.as_bytes()) {
                bytes = b;
                changed = true;
            }
        }
        if changed && let Ok(nv) = http::HeaderValue::from_bytes(&bytes) {
            *v = nv;
        }
    }
    let mut target = uri.to_string().into_bytes();
    let mut changed = false;
    for s in secrets {
        if let Some(t) = replace(&target, s.placeholder.as_bytes(), s.value.as_bytes()) {
            target = t;
            changed = true;
        }
    }
    if changed && let Ok(u) = http::Uri::try_from(target) {
        *uri = u;
    }
}

/// Puts placeholders back in place of values in response headers.
pub(crate) fn scrub(headers: &mut http::HeaderMap, secrets: &[Secret]) {
    for v in headers.values_mut() {
        let mut bytes = v.as_bytes().to_vec();
        let mut changed = false;
        for s in secrets {
            if let Some(b) = replace(&bytes, s.value.as_bytes(), s.placeholder.as_bytes()) {
                bytes = b;
                changed = true;
            }
        }
        if changed && let Ok(nv) = http::HeaderValue::from_bytes(&bytes) {
            *v = nv;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secrets_are_checked() {
        assert!(Secret::new("TOKEN", "v", &["api.test"]).is_ok());
        for (n, v, h) in [
            ("token", "v", "a.test"),
            ("T", "", "a.test"),
            ("T", "a\r\nX: y", "a.test"),
            ("T", "v", "10.0.0.1"),
            ("T", "v", "a b"),
        ] {
            assert!(Secret::new(n, v, &[h]).is_err(), "{n} {v:?} {h}");
        }
        assert!(Secret::new::<&str>("T", "v", &[]).is_err());
        let s = Secret::new("TOKEN", "hunter2", &["*.api.test:8443"]).unwrap();
        assert!(!format!("{s:?}").contains("hunter2"));
        assert!(
            s.applies("x.api.test", 8443)
                && !s.applies("api.test", 8443)
                && !s.applies("x.api.test", 443)
        );
        let json = serde_json::to_string(&s).unwrap();
        assert_eq!(serde_json::from_str::<Secret>(&json).unwrap(), s);
    }

    #[test]
    fn fill_and_scrub() {
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let s = vec![Secret::new("TOKEN", "real-value", &["a.test"]).unwrap()];
        let mut h = http::HeaderMap::new();
        h.insert("x-api-key", "CORDON_SECRET_TOKEN".parse().unwrap());
        h.insert(
            "authorization",
            format!("Basic {}", b64.encode("git:CORDON_SECRET_TOKEN"))
                .parse()
                .unwrap(),
        );
        let mut uri: http::Uri = "/x?key=CORDON_SECRET_TOKEN".parse().unwrap();
        fill(&mut h, &mut uri, &s);
        assert_eq!(h["x-api-key"], "real-value");
        assert_eq!(
            h["authorization"],
            format!("Basic {}", b64.encode("git:real-value")).as_str()
        );
        assert_eq!(uri, "/x?key=real-value");
        scrub(&mut h, &s);
        assert_eq!(h["x-api-key"], "CORDON_SECRET_TOKEN");
    }
}
