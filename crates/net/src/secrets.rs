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
//! In response heads (headers, the reason phrase) and trailers the value
//! is put back to the placeholder in every form the broker sends it in:
//! as it is; inside base64 (each run of either alphabet, padded or not, is
//! decoded, the value replaced wherever it sits, and the run encoded back
//! the same way); and URL-encoded (any mix of literal bytes and `%XX`
//! escapes in either case, `+` for a space). Where a form still shows
//! after that (base64 glued to other characters, percent-encoded base64;
//! looked for in values of 5 bytes or more, shorter ones would match by
//! chance) the whole header value becomes the placeholder. A header whose
//! name shows the value, in any case, is dropped.
//!
//! What it does not do, and why: request and response *bodies* are carried
//! untouched (they stream, and tokens belong in headers), and other
//! transformations of the value (hex, a changed case, JSON escapes, a
//! value split across headers) are not recognised; a host that echoes a
//! request into a response body, or reshapes it, would show the value to
//! the sandbox, so scope secrets to hosts that do not. The value goes into
//! the request target unescaped: one a URL cannot hold (a space) leaves
//! the target's placeholder as it is. Tunnels to other hosts are not
//! terminated at all: the placeholder travels there as it is. The CA is
//! name-constrained to the secrets' hosts, so even the sandbox's trust in
//! it reaches no further.

use std::collections::HashMap;
use std::fmt;
use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
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

/// Puts placeholders back in place of values in response headers (and
/// trailers), in every form the module's doc names.
pub(crate) fn scrub(headers: &mut http::HeaderMap, secrets: &[Secret]) {
    let forms: Vec<Forms> = secrets.iter().map(Forms::of).collect();
    scrub_headers(headers, &forms);
}

/// [`scrub`] for a response's head, with its reason phrase: hyper writes
/// an upstream's own phrase back out to the sandbox.
pub(crate) fn scrub_head(head: &mut http::response::Parts, secrets: &[Secret]) {
    use hyper::ext::ReasonPhrase;
    let forms: Vec<Forms> = secrets.iter().map(Forms::of).collect();
    scrub_headers(&mut head.headers, &forms);
    if let Some(r) = head.extensions.get::<ReasonPhrase>()
        && let Some(b) = hide_all(r.as_bytes(), &forms)
    {
        match ReasonPhrase::try_from(b) {
            Ok(r) => head.extensions.insert(r),
            // Without one, the status's own phrase is written.
            Err(_) => head.extensions.remove::<ReasonPhrase>(),
        };
    }
}

fn scrub_headers(headers: &mut http::HeaderMap, forms: &[Forms]) {
    // A host may reflect what it got into header names too. Names are
    // lower case, so the value is looked for in any case there, and such a
    // header goes.
    let lower: Vec<Forms> = forms.iter().map(Forms::lowercase).collect();
    let shown: Vec<http::HeaderName> = headers
        .keys()
        .filter(|n| lower.iter().any(|f| f.shows(n.as_str().as_bytes())))
        .cloned()
        .collect();
    for n in shown {
        headers.remove(n);
    }
    for v in headers.values_mut() {
        if let Some(b) = hide_all(v.as_bytes(), forms) {
            // Only ASCII is put in, so this cannot fail; if it did, the
            // value would go rather than stay.
            *v = http::HeaderValue::from_bytes(&b)
                .unwrap_or_else(|_| http::HeaderValue::from_static(""));
        }
    }
}

/// `text` with every form of every value hidden, or None if none showed.
fn hide_all(text: &[u8], forms: &[Forms]) -> Option<Vec<u8>> {
    let mut out = None;
    for f in forms {
        if let Some(t) = f.hide(out.as_deref().unwrap_or(text)) {
            out = Some(t);
        }
    }
    out
}

/// Base64 text shorter than this is not looked for on its own: a short
/// value's would turn up by chance in headers that never held it.
const MIN_CORE: usize = 6;

/// Decoding takes padding or none, and stray bits at the end, as servers
/// send them.
const LENIENT: GeneralPurposeConfig = GeneralPurposeConfig::new()
    .with_decode_padding_mode(DecodePaddingMode::Indifferent)
    .with_decode_allow_trailing_bits(true);

/// A base64 alphabet as scrub reads it.
struct Base64 {
    padded: GeneralPurpose,
    unpadded: GeneralPurpose,
    /// The two characters besides letters and digits.
    extra: [u8; 2],
    /// Whether text whose length needs no `=` was padded: standard base64
    /// usually is, URL-safe usually not.
    pads: bool,
}

const BASE64: [Base64; 2] = [
    Base64 {
        padded: GeneralPurpose::new(&alphabet::STANDARD, LENIENT),
        unpadded: GeneralPurpose::new(&alphabet::STANDARD, LENIENT.with_encode_padding(false)),
        extra: *b"+/",
        pads: true,
    },
    Base64 {
        padded: GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT),
        unpadded: GeneralPurpose::new(&alphabet::URL_SAFE, LENIENT.with_encode_padding(false)),
        extra: *b"-_",
        pads: false,
    },
];

/// The forms of one secret's value that scrub looks for.
struct Forms<'a> {
    value: Vec<u8>,
    placeholder: &'a [u8],
    /// For each of the three offsets the value can have in encoded bytes,
    /// the base64 characters made of its bits alone, in both alphabets:
    /// what shows of it in any base64 text holding it.
    cores: Vec<Vec<u8>>,
}

impl Forms<'_> {
    fn of(s: &Secret) -> Forms<'_> {
        let value = s.value.as_bytes();
        let mut cores = Vec::new();
        for offset in 0..3 {
            let mut bytes = vec![0; offset];
            bytes.extend_from_slice(value);
            let text = BASE64[0].unpadded.encode(&bytes);
            let core = &text[(offset * 8).div_ceil(6)..(offset + value.len()) * 8 / 6];
            if core.len() >= MIN_CORE {
                cores.push(core.as_bytes().to_vec());
                cores.push(core.replace('+', "-").replace('/', "_").into_bytes());
            }
        }
        Forms {
            value: value.to_vec(),
            placeholder: s.placeholder.as_bytes(),
            cores,
        }
    }

    /// The same forms in lower case, to look for in header names.
    fn lowercase(&self) -> Forms<'_> {
        Forms {
            value: self.value.to_ascii_lowercase(),
            placeholder: self.placeholder,
            cores: self.cores.iter().map(|c| c.to_ascii_lowercase()).collect(),
        }
    }

    /// `text` with the value hidden, or None if it did not show: first in
    /// each base64 run (decoded, hidden, encoded back the same way), then
    /// as is or percent-encoded; if some form still shows (base64 that is
    /// not a run of its own, percent-encoded base64), all of `text` becomes
    /// the placeholder.
    fn hide(&self, text: &[u8]) -> Option<Vec<u8>> {
        let mut out = None;
        for b in &BASE64 {
            if let Some(t) = self.hide_base64(out.as_deref().unwrap_or(text), b) {
                out = Some(t);
            }
        }
        if let Some(t) = self.hide_escaped(out.as_deref().unwrap_or(text)) {
            out = Some(t);
        }
        if self.shows(out.as_deref().unwrap_or(text)) {
            return Some(self.placeholder.to_vec());
        }
        out
    }

    /// `text` with each run of `b`'s characters (and up to two `=`) whose
    /// decoding holds the value decoded, hidden and encoded back with the
    /// same alphabet and padding.
    fn hide_base64(&self, text: &[u8], b: &Base64) -> Option<Vec<u8>> {
        let is_char = |c: u8| c.is_ascii_alphanumeric() || b.extra.contains(&c);
        let shortest = (self.value.len() * 8).div_ceil(6);
        let mut out = Vec::with_capacity(text.len());
        let (mut i, mut hit) = (0, false);
        while i < text.len() {
            let start = i;
            while i < text.len() && is_char(text[i]) {
                i += 1;
            }
            let chars = i - start;
            while i < text.len() && i - start - chars < 2 && text[i] == b'=' {
                i += 1;
            }
            if i == start {
                out.push(text[i]);
                i += 1;
                continue;
            }
            let run = &text[start..i];
            let padded = i - start > chars || (chars % 4 == 0 && b.pads);
            let engine = if padded { &b.padded } else { &b.unpadded };
            let hidden = (chars >= shortest)
                .then(|| engine.decode(run).ok())
                .flatten()
                .and_then(|plain| self.hide_escaped(&plain));
            match hidden {
                Some(plain) => {
                    out.extend_from_slice(engine.encode(plain).as_bytes());
                    hit = true;
                }
                None => out.extend_from_slice(run),
            }
        }
        hit.then_some(out)
    }

    /// `text` with each span that reads as the value ([`Forms::span_at`])
    /// replaced by the placeholder.
    fn hide_escaped(&self, text: &[u8]) -> Option<Vec<u8>> {
        let mut out = Vec::with_capacity(text.len());
        let (mut i, mut hit) = (0, false);
        while i < text.len() {
            match self.span_at(text, i) {
                Some(end) => {
                    out.extend_from_slice(self.placeholder);
                    i = end;
                    hit = true;
                }
                None => {
                    out.push(text[i]);
                    i += 1;
                }
            }
        }
        hit.then_some(out)
    }

    /// Where the value ends if it starts at `at` in `text`, read through
    /// URL encoding: each byte as itself or as `%XX` in either case, a
    /// space also as `+`. Of several readings (`%25` is a `%` or starts
    /// one) the longest.
    fn span_at(&self, text: &[u8], at: usize) -> Option<usize> {
        // Most places fail at the first byte: no need to set up for more.
        let first = self.value[0];
        match text.get(at) {
            Some(&c) if c == first || c == b'%' || (c == b'+' && first == b' ') => {}
            _ => return None,
        }
        let mut ends = vec![at];
        for &v in &self.value {
            let mut next = Vec::with_capacity(ends.len());
            for &i in &ends {
                let c = text.get(i).copied();
                if c == Some(v) || (v == b' ' && c == Some(b'+')) {
                    next.push(i + 1);
                }
                if c == Some(b'%') && escaped(&text[i + 1..]) == Some(v) {
                    next.push(i + 3);
                }
            }
            next.sort_unstable();
            next.dedup();
            if next.is_empty() {
                return None;
            }
            ends = next;
        }
        ends.last().copied()
    }

    /// Whether the value shows in `text` or its percent-decoding, as is,
    /// escaped or as a base64 core.
    fn shows(&self, text: &[u8]) -> bool {
        let decoded = percent_decoded(text);
        [text, &decoded].iter().any(|t| {
            (0..t.len()).any(|i| self.span_at(t, i).is_some())
                || self
                    .cores
                    .iter()
                    .any(|c| t.windows(c.len()).any(|w| w == c))
        })
    }
}

/// The byte `%XX` stands for, given what follows the `%`.
fn escaped(after: &[u8]) -> Option<u8> {
    let digit = |c: u8| (c as char).to_digit(16);
    match after {
        [h, l, ..] => Some((digit(*h)? * 16 + digit(*l)?) as u8),
        _ => None,
    }
}

/// `text` with its escapes decoded and `+` read as a space.
fn percent_decoded(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        match (text[i], escaped(&text[i + 1..])) {
            (b'%', Some(b)) => {
                out.push(b);
                i += 3;
            }
            (c, _) => {
                out.push(if c == b'+' { b' ' } else { c });
                i += 1;
            }
        }
    }
    out
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

    /// A value with characters URL encoding changes, whose base64 differs
    /// between the alphabets.
    const V: &str = "s3cr3t/v+al=ue?~>!";

    /// `header` as the sandbox gets it back when `value` is the secret.
    fn scrubbed(value: &str, header: &[u8]) -> Vec<u8> {
        let s = [Secret::new("TOKEN", value, &["a.test"]).unwrap()];
        let mut h = http::HeaderMap::new();
        h.insert("x", http::HeaderValue::from_bytes(header).unwrap());
        scrub(&mut h, &s);
        h["x"].as_bytes().to_vec()
    }

    #[test]
    fn scrub_finds_the_value_in_base64_at_any_offset() {
        use base64::engine::general_purpose::{
            STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD,
        };
        assert_ne!(STANDARD.encode(V), URL_SAFE.encode(V));
        // The value at byte offsets 0, 4 (1 in its 3-byte group), 2 and 3.
        let around = ["@:x-oauth-basic", "git:@", "x:@", "ab:@ then", "@!"];
        for engine in [STANDARD, STANDARD_NO_PAD, URL_SAFE, URL_SAFE_NO_PAD] {
            for a in around {
                let real = engine.encode(a.replace('@', V));
                let shown = engine.encode(a.replace('@', "CORDON_SECRET_TOKEN"));
                for (header, want) in [
                    (format!("Basic {real}"), format!("Basic {shown}")),
                    (
                        format!("realm=\"{real}\", k={real}"),
                        format!("realm=\"{shown}\", k={shown}"),
                    ),
                ] {
                    assert_eq!(
                        String::from_utf8(scrubbed(V, header.as_bytes())).unwrap(),
                        want,
                        "{a}"
                    );
                }
            }
        }
        // Text whose length needs no `=` may have dropped it or not: taken
        // as padded in the standard alphabet, unpadded in the URL-safe one.
        let aligned = format!("{V}:x-oauth-basic!");
        for (engine, want) in [(STANDARD_NO_PAD, STANDARD), (URL_SAFE, URL_SAFE_NO_PAD)] {
            let real = engine.encode(&aligned);
            assert!(!real.ends_with('='));
            let shown = want.encode(aligned.replace(V, "CORDON_SECRET_TOKEN"));
            assert_eq!(scrubbed(V, real.as_bytes()), shown.as_bytes());
        }
    }

    #[test]
    fn scrub_finds_the_value_percent_encoded() {
        let v = "a/b+c=d&e% f";
        for header in [
            "a/b+c=d&e% f",
            "a%2Fb%2Bc%3Dd%26e%25%20f",
            "a%2fb%2bc%3dd%26e%25+f",
            "a/b%2Bc=d%26e%25 f",
            "%61%2F%62%2B%63%3D%64%26%65%25%20%66",
        ] {
            let got = scrubbed(v, format!("</x?next={header}>; rel=next").as_bytes());
            assert_eq!(got, b"</x?next=CORDON_SECRET_TOKEN>; rel=next", "{header}");
        }
        // A `%` the value holds, then hex digits: read either way.
        for header in ["p%41q", "p%2541q"] {
            assert_eq!(scrubbed("p%41q", header.as_bytes()), b"CORDON_SECRET_TOKEN");
        }
        // `+` is a space, and a plus.
        assert_eq!(scrubbed("a b", b"x=a+b"), b"x=CORDON_SECRET_TOKEN");
        assert_eq!(scrubbed("a+b", b"x=a+b"), b"x=CORDON_SECRET_TOKEN");
    }

    #[test]
    fn base64_that_is_not_a_run_of_its_own_costs_the_whole_header() {
        use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
        let b64 = STANDARD.encode(format!("git:{V}"));
        let escaped = b64
            .replace('+', "%2B")
            .replace('/', "%2F")
            .replace('=', "%3D");
        for header in [
            format!("x{b64}"),
            format!("xy{b64}"),
            format!("Basic%20{escaped}"),
            format!("id-{}", URL_SAFE_NO_PAD.encode(format!("{V}:x"))),
        ] {
            assert_eq!(
                scrubbed(V, header.as_bytes()),
                b"CORDON_SECRET_TOKEN",
                "{header}"
            );
        }
        // From 5 bytes on.
        for user in ["", "g", "gi"] {
            let header = format!("x{}", STANDARD.encode(format!("{user}:hunt2")));
            assert_eq!(
                scrubbed("hunt2", header.as_bytes()),
                b"CORDON_SECRET_TOKEN",
                "{header}"
            );
        }
    }

    #[test]
    fn a_header_without_the_value_is_left_byte_for_byte() {
        use base64::engine::general_purpose::STANDARD;
        let near = format!("Basic {}", STANDARD.encode("git:s3cr3t/v+al=ue?~>?"));
        for header in [
            near.as_bytes(),
            b"Basic eDp5",
            b"dGhpcyBpcyBmaW5l==; n=%41%2b a+b",
            b"s3cr3t/v+al=ue?~>",
            b"s3cr3t%2Fv%2Bal%3Due%3F~%3E",
            b"</x?q=%zz%4>; rel=\"next\"; title*=UTF-8''caf%C3%A9",
            b"caf\xe9 \tend",
        ] {
            assert_eq!(
                scrubbed(V, header),
                header,
                "{}",
                String::from_utf8_lossy(header)
            );
        }
        // A value too short for its base64 to be told from chance (under 5
        // bytes): only whole runs that decode to it are rewritten.
        assert_eq!(scrubbed("abc", b"tokenYWJjdef"), b"tokenYWJjdef");
        assert_eq!(scrubbed("abc", b"YWJj"), b"Q09SRE9OX1NFQ1JFVF9UT0tFTg==");
    }

    #[test]
    fn what_the_sandbox_sent_comes_back_as_it_sent_it() {
        use base64::engine::general_purpose::STANDARD;
        let s = vec![
            Secret::new("TOKEN", V, &["a.test"]).unwrap(),
            Secret::new("OTHER", "an other value", &["a.test"]).unwrap(),
        ];
        let mut h = http::HeaderMap::new();
        for (k, v) in [
            ("x-api-key", "CORDON_SECRET_TOKEN".to_string()),
            (
                "authorization",
                format!(
                    "Basic {}",
                    STANDARD.encode("CORDON_SECRET_OTHER:CORDON_SECRET_TOKEN")
                ),
            ),
            (
                "x-both",
                "CORDON_SECRET_TOKEN CORDON_SECRET_OTHER".to_string(),
            ),
        ] {
            h.insert(k, v.parse().unwrap());
        }
        let sent = h.clone();
        let mut uri: http::Uri = "/x".parse().unwrap();
        fill(&mut h, &mut uri, &s);
        assert_ne!(h, sent);
        scrub(&mut h, &s);
        assert_eq!(h, sent);
    }

    #[test]
    fn scrub_head_covers_names_and_the_reason_phrase() {
        use base64::engine::general_purpose::URL_SAFE_NO_PAD;
        use hyper::ext::ReasonPhrase;
        let v = "Tok3n-Value_x";
        let s = [Secret::new("TOKEN", v, &["a.test"]).unwrap()];
        let b64 = URL_SAFE_NO_PAD.encode(format!("git:{v}"));
        let resp = http::Response::builder()
            .header(format!("x-{v}"), "1")
            .header(format!("x-{b64}"), "2")
            .header("x-kept", "3")
            .extension(ReasonPhrase::try_from(format!("Echo {v}")).unwrap())
            .body(())
            .unwrap();
        let (mut head, ()) = resp.into_parts();
        scrub_head(&mut head, &s);
        // Names came in lower case, and still went.
        assert_eq!(head.headers.len(), 1);
        assert_eq!(head.headers["x-kept"], "3");
        let reason = head.extensions.get::<ReasonPhrase>().unwrap();
        assert_eq!(reason.as_bytes(), b"Echo CORDON_SECRET_TOKEN");
    }
}
