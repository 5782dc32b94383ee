//! How the processes of one deployment trust each other: an API process
//! relays a request for a job that runs on another machine (its files,
//! live view and Lab) to that job's worker, which must know the request
//! comes from a process of the deployment and which tenant it is for.
//!
//! The rules:
//! - Every process is given the same cluster key (`CORDON_CLUSTER_KEY`).
//!   The key never travels: a relayed request carries an HMAC-SHA256 of
//!   its time, a nonce, its method, path and query, and the tenant the API
//!   process authenticated. The tenant's own token does not travel either.
//! - A worker takes a signed request only within [`SKEW`] of its own clock
//!   and only once (it keeps the nonces it has seen for twice that), so a
//!   request seen on the wire cannot be sent again, nor changed to name
//!   another path or tenant.
//! - Only a worker's own listener reads these headers; the public API
//!   drops them, so nothing from outside can name a tenant.
//! - The body is not signed: on a network the operator does not trust,
//!   workers advertise `https://` URLs.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use hmac::{KeyInit, Mac};

use crate::store::{KEY_MIN, strong_key};

/// The signed request's tenant.
pub const TENANT: &str = "x-cordon-relay-tenant";
/// Its time, ms since the epoch on the API process's clock.
pub const TIME: &str = "x-cordon-relay-time";
/// 32 random hex digits, never accepted twice.
pub const NONCE: &str = "x-cordon-relay-nonce";
/// The HMAC, hex.
pub const SIGNATURE: &str = "x-cordon-relay-signature";
/// Every header of the relay, which the public API drops.
pub const HEADERS: [&str; 4] = [TENANT, TIME, NONCE, SIGNATURE];

/// How far a signed request's time may be from the worker's clock.
pub const SKEW: Duration = Duration::from_secs(30);

/// Nonces remembered at most; past this, requests are refused until old
/// ones expire (a flood of valid signatures means the key has leaked).
const NONCES_MAX: usize = 100_000;

type Hmac = hmac::Hmac<sha2::Sha256>;

/// The deployment's shared secret.
#[derive(Clone)]
pub struct ClusterKey(Vec<u8>);

impl std::fmt::Debug for ClusterKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClusterKey(…)")
    }
}

impl ClusterKey {
    /// At least [`KEY_MIN`] printable ASCII characters, no spaces.
    pub fn new(key: &str) -> Result<ClusterKey, String> {
        let key = strong_key(key).ok_or_else(|| {
            format!(
                "the cluster key must be at least {KEY_MIN} printable characters without \
                 spaces (make one with `openssl rand -hex 32`)"
            )
        })?;
        Ok(ClusterKey(key.as_bytes().to_vec()))
    }

    /// The key tenants' secrets are sealed with when the operator gives
    /// none of its own: every process of the deployment derives the same,
    /// and it is unrelated to the key that signs requests.
    pub fn secrets_key(&self) -> crate::store::SecretsKey {
        crate::store::SecretsKey::derive(&self.0)
    }

    fn mac(&self, time_ms: i64, nonce: &str, method: &str, target: &str, tenant: &str) -> Hmac {
        let mut mac = Hmac::new_from_slice(&self.0).expect("HMAC takes a key of any length");
        // Newlines separate the parts; none of them may hold one (a
        // method, a URI's path and query, a tenant name and hex cannot).
        for part in [
            "cordon-relay-v1",
            &time_ms.to_string(),
            nonce,
            method,
            target,
            tenant,
        ] {
            mac.update(part.as_bytes());
            mac.update(b"\n");
        }
        mac
    }

    /// The headers that relay `method target` for `tenant` now.
    pub fn sign(&self, method: &str, target: &str, tenant: &str) -> [(&'static str, String); 4] {
        let time = crate::store::now_ms();
        let nonce = crate::store::random_hex(16);
        let sig = self
            .mac(time, &nonce, method, target, tenant)
            .finalize()
            .into_bytes();
        [
            (TENANT, tenant.to_string()),
            (TIME, time.to_string()),
            (NONCE, nonce),
            (SIGNATURE, hex(&sig)),
        ]
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|b| b.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

/// A process's place in a deployment of many.
#[derive(Debug, Clone)]
pub struct Cluster {
    pub key: ClusterKey,
    /// Where API processes reach this worker (`--advertise`): a base URL
    /// on the cluster's network. None: an API process, which only relays.
    pub advertise: Option<String>,
}

/// Checks an `--advertise` URL: `http` or `https`, a host, maybe a port,
/// nothing else.
pub fn check_advertise(url: &str) -> Result<String, String> {
    let uri: axum::http::Uri = url
        .parse()
        .map_err(|e| format!("{url:?} is not a URL: {e}"))?;
    let scheme_ok = matches!(uri.scheme_str(), Some("http" | "https"));
    let path_ok = matches!(uri.path(), "" | "/") && uri.query().is_none();
    match uri.authority() {
        Some(a) if scheme_ok && path_ok && !a.as_str().contains('@') => Ok(format!(
            "{}://{}",
            uri.scheme_str().unwrap_or("http"),
            a.as_str()
        )),
        _ => Err(format!(
            "{url:?} is not a base URL such as http://worker-1.cordon:8081 (http or https, a \
             host and a port, no path)"
        )),
    }
}

/// Why a relayed request was refused; the worker logs it, and answers
/// only that it was.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum Refused {
    #[error("no relay headers")]
    Missing,
    #[error("a relay header is malformed")]
    Malformed,
    #[error("the signed time is more than {}s off this worker's clock", SKEW.as_secs())]
    Stale,
    #[error("the signature does not match (another cluster key?)")]
    BadSignature,
    #[error("this nonce was used already (a replay)")]
    Replayed,
    #[error("too many recent relayed requests to remember")]
    Full,
}

/// The nonces a worker has accepted lately, until they are too old to be
/// accepted anyway.
#[derive(Default)]
pub struct Nonces(Mutex<HashMap<String, i64>>);

impl Nonces {
    /// Admits `nonce` once, if it is not too many.
    fn admit(&self, nonce: &str, now_ms: i64) -> Result<(), Refused> {
        let mut seen = self.0.lock().unwrap_or_else(|p| p.into_inner());
        if seen.len() >= NONCES_MAX / 2 {
            seen.retain(|_, expiry| *expiry > now_ms);
        }
        if seen.contains_key(nonce) {
            return Err(Refused::Replayed);
        }
        if seen.len() >= NONCES_MAX {
            return Err(Refused::Full);
        }
        seen.insert(nonce.to_string(), now_ms + 2 * SKEW.as_millis() as i64);
        Ok(())
    }
}

/// The tenant a signed request speaks for, if `key` signed it, in time,
/// and for the first time.
pub fn verify(
    key: &ClusterKey,
    nonces: &Nonces,
    method: &str,
    target: &str,
    get: impl Fn(&str) -> Option<String>,
) -> Result<String, Refused> {
    let (Some(tenant), Some(time), Some(nonce), Some(sig)) =
        (get(TENANT), get(TIME), get(NONCE), get(SIGNATURE))
    else {
        return Err(Refused::Missing);
    };
    let time: i64 = time.parse().map_err(|_| Refused::Malformed)?;
    let sig = unhex(&sig).ok_or(Refused::Malformed)?;
    if nonce.len() != 32 || !nonce.bytes().all(|b| b.is_ascii_hexdigit()) {
        return Err(Refused::Malformed);
    }
    crate::store::check_tenant(&tenant).map_err(|_| Refused::Malformed)?;
    let now = crate::store::now_ms();
    if (now - time).unsigned_abs() > SKEW.as_millis() as u64 {
        return Err(Refused::Stale);
    }
    key.mac(time, &nonce, method, target, &tenant)
        .verify_slice(&sig)
        .map_err(|_| Refused::BadSignature)?;
    // Remembered only once it is known to be ours: forged requests cannot
    // fill the table.
    nonces.admit(&nonce, now)?;
    Ok(tenant)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(k: &str) -> ClusterKey {
        ClusterKey::new(k).unwrap()
    }

    fn check(
        k: &ClusterKey,
        nonces: &Nonces,
        method: &str,
        target: &str,
        headers: &[(&'static str, String)],
    ) -> Result<String, Refused> {
        verify(k, nonces, method, target, |name| {
            headers
                .iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| v.clone())
        })
    }

    const K: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn short_or_spaced_keys_are_refused_and_never_printed() {
        assert!(ClusterKey::new("short").is_err());
        assert!(ClusterKey::new("0123456789abcdef 0123456789abcdef").is_err());
        let k = key(K);
        assert!(!format!("{k:?}").contains("0123"));
    }

    #[test]
    fn every_process_of_a_cluster_derives_the_same_secrets_key() {
        let sealed = key(K).secrets_key().seal("token", "acme");
        assert_eq!(
            key(K).secrets_key().open(&sealed, "acme", "it").unwrap(),
            "token"
        );
        let other = key("fedcba9876543210fedcba9876543210").secrets_key();
        assert!(other.open(&sealed, "acme", "it").is_err());
    }

    #[test]
    fn a_signed_request_names_its_tenant_once() {
        let k = key(K);
        let nonces = Nonces::default();
        let h = k.sign("GET", "/v1/jobs/job_1/files/a.txt", "acme");
        assert_eq!(
            check(&k, &nonces, "GET", "/v1/jobs/job_1/files/a.txt", &h),
            Ok("acme".into())
        );
        assert_eq!(
            check(&k, &nonces, "GET", "/v1/jobs/job_1/files/a.txt", &h),
            Err(Refused::Replayed)
        );
    }

    #[test]
    fn nothing_signed_can_be_changed() {
        let k = key(K);
        let nonces = Nonces::default();
        let h = k.sign("GET", "/v1/jobs/job_1/files/a.txt", "acme");
        let with = |name: &str, value: &str| {
            let mut h = h.clone();
            h.iter_mut().find(|(n, _)| *n == name).unwrap().1 = value.to_string();
            h
        };
        let path = "/v1/jobs/job_1/files/a.txt";
        assert_eq!(
            check(&k, &nonces, "PUT", path, &h),
            Err(Refused::BadSignature)
        );
        assert_eq!(
            check(&k, &nonces, "GET", "/v1/jobs/job_2/files/a.txt", &h),
            Err(Refused::BadSignature)
        );
        assert_eq!(
            check(&k, &nonces, "GET", path, &with(TENANT, "other")),
            Err(Refused::BadSignature)
        );
        assert_eq!(
            check(&k, &nonces, "GET", path, &with(NONCE, &"0".repeat(32))),
            Err(Refused::BadSignature)
        );
        let other = key("fedcba9876543210fedcba9876543210");
        assert_eq!(
            check(&other, &nonces, "GET", path, &h),
            Err(Refused::BadSignature)
        );
        let old = (crate::store::now_ms() - 60_000).to_string();
        assert_eq!(
            check(&k, &nonces, "GET", path, &with(TIME, &old)),
            Err(Refused::Stale)
        );
        assert_eq!(
            check(&k, &nonces, "GET", path, &with(TENANT, "a\nb")),
            Err(Refused::Malformed)
        );
        assert_eq!(check(&k, &nonces, "GET", path, &[]), Err(Refused::Missing));
        // None of the failures spent the nonce.
        assert_eq!(check(&k, &nonces, "GET", path, &h), Ok("acme".into()));
    }

    #[test]
    fn advertised_urls_are_bases() {
        assert_eq!(
            check_advertise("http://worker-1.cordon:8081/").unwrap(),
            "http://worker-1.cordon:8081"
        );
        assert_eq!(
            check_advertise("https://10.0.0.7:8081").unwrap(),
            "https://10.0.0.7:8081"
        );
        for bad in [
            "worker-1:8081",
            "ftp://w:1",
            "http://w:1/api",
            "http://user:pw@w:1",
            "http://w:1/?q",
        ] {
            assert!(check_advertise(bad).is_err(), "{bad}");
        }
    }
}
