//! The server's certificate and key, from PEM files the operator names,
//! read again when they change.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime};

use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;

/// How often the files are looked at for a change, at most: a renewal is
/// picked up within this long, and a busy server stats twice per period.
const RECHECK: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}: no PEM certificate in it ({reason})", path.display())]
    NoCertificate { path: PathBuf, reason: String },
    #[error("{}: no PEM private key in it ({reason})", path.display())]
    NoKey { path: PathBuf, reason: String },
    #[error("{}: the private key cannot be used: {source}", path.display())]
    Key {
        path: PathBuf,
        source: rustls::Error,
    },
    #[error("{} and {} do not belong together: {source}", cert.display(), key.display())]
    Mismatch {
        cert: PathBuf,
        key: PathBuf,
        source: rustls::Error,
    },
    #[error("TLS settings: {0}")]
    Config(rustls::Error),
}

/// A TLS server configuration over a certificate chain and key that are
/// read again when their files change.
#[derive(Clone)]
pub struct Tls {
    config: Arc<rustls::ServerConfig>,
}

impl std::fmt::Debug for Tls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tls").finish_non_exhaustive()
    }
}

impl Tls {
    /// Reads `cert` (a PEM chain, the server's certificate first) and `key`
    /// (PEM: PKCS#8, PKCS#1 or SEC1), and checks that they belong together.
    pub fn load(cert: &Path, key: &Path) -> Result<Tls, TlsError> {
        Self::load_rechecked(cert, key, RECHECK)
    }

    fn load_rechecked(cert: &Path, key: &Path, recheck: Duration) -> Result<Tls, TlsError> {
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        let files = Files {
            cert: cert.to_path_buf(),
            key: key.to_path_buf(),
        };
        let stamp = files.stamp();
        let first = files.read(&provider)?;
        warn_if_readable_by_others(key);
        let resolver = Reloading {
            files,
            recheck,
            provider: provider.clone(),
            current: Mutex::new(Current {
                key: Arc::new(first),
                stamp,
                checked: Instant::now(),
            }),
        };
        let mut config = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(TlsError::Config)?
            .with_no_client_auth()
            .with_cert_resolver(Arc::new(resolver));
        // cordon's servers speak HTTP/1.1 (WebSockets upgrade over it).
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(Tls {
            config: Arc::new(config),
        })
    }

    pub(crate) fn acceptor(&self) -> tokio_rustls::TlsAcceptor {
        tokio_rustls::TlsAcceptor::from(self.config.clone())
    }
}

fn warn_if_readable_by_others(key: &Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(key)
        && m.permissions().mode() & 0o007 != 0
    {
        tracing::warn!(
            "{} can be read by every user of this machine: chmod o-rwx it",
            key.display()
        );
    }
}

#[derive(Debug)]
struct Files {
    cert: PathBuf,
    key: PathBuf,
}

/// What tells a changed file: Kubernetes swaps a secret's files by
/// renaming a directory, certbot by writing anew; both change one of these.
type Stamp = [(Option<SystemTime>, u64, u64); 2];

impl Files {
    fn stamp(&self) -> Stamp {
        use std::os::unix::fs::MetadataExt;
        let one = |p: &Path| {
            std::fs::metadata(p).map_or((None, 0, 0), |m| (m.modified().ok(), m.ino(), m.len()))
        };
        [one(&self.cert), one(&self.key)]
    }

    fn read(&self, provider: &CryptoProvider) -> Result<CertifiedKey, TlsError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|source| TlsError::Read {
                path: path.to_path_buf(),
                source,
            })
        };
        let pem = read(&self.cert)?;
        let chain = CertificateDer::pem_slice_iter(&pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| TlsError::NoCertificate {
                path: self.cert.clone(),
                reason: e.to_string(),
            })?;
        if chain.is_empty() {
            return Err(TlsError::NoCertificate {
                path: self.cert.clone(),
                reason: "no CERTIFICATE block".into(),
            });
        }
        let pem = read(&self.key)?;
        let key = PrivateKeyDer::from_pem_slice(&pem).map_err(|e| TlsError::NoKey {
            path: self.key.clone(),
            reason: e.to_string(),
        })?;
        let signing = provider
            .key_provider
            .load_private_key(key)
            .map_err(|source| TlsError::Key {
                path: self.key.clone(),
                source,
            })?;
        let certified = CertifiedKey::new(chain, signing);
        match certified.keys_match() {
            Ok(()) | Err(rustls::Error::InconsistentKeys(rustls::InconsistentKeys::Unknown)) => {
                Ok(certified)
            }
            Err(source) => Err(TlsError::Mismatch {
                cert: self.cert.clone(),
                key: self.key.clone(),
                source,
            }),
        }
    }
}

#[derive(Debug)]
struct Current {
    key: Arc<CertifiedKey>,
    stamp: Stamp,
    checked: Instant,
}

#[derive(Debug)]
struct Reloading {
    files: Files,
    recheck: Duration,
    provider: Arc<CryptoProvider>,
    current: Mutex<Current>,
}

impl ResolvesServerCert for Reloading {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        let mut current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        if current.checked.elapsed() >= self.recheck {
            current.checked = Instant::now();
            let stamp = self.files.stamp();
            if stamp != current.stamp {
                // Written in two steps, the pair can be caught half new: it
                // is then tried again at the next look, not given up on.
                match self.files.read(&self.provider) {
                    Ok(key) => {
                        tracing::info!("TLS: {} read again", self.files.cert.display());
                        current.key = Arc::new(key);
                        current.stamp = stamp;
                    }
                    Err(e) => tracing::warn!("TLS: keeping the certificate in use: {e}"),
                }
            }
        }
        Some(current.key.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
        let c = rcgen::generate_simple_self_signed(vec!["localhost".to_string()]).unwrap();
        let cert = dir.join(format!("{name}.crt"));
        let key = dir.join(format!("{name}.key"));
        std::fs::write(&cert, c.cert.pem()).unwrap();
        std::fs::write(&key, c.signing_key.serialize_pem()).unwrap();
        (cert, key)
    }

    fn der(pem: &Path) -> CertificateDer<'static> {
        CertificateDer::from_pem_file(pem).unwrap()
    }

    /// The certificate `tls` shows a client that trusts `roots`.
    fn served(tls: &Tls, roots: &[CertificateDer<'static>]) -> Vec<u8> {
        let mut store = rustls::RootCertStore::empty();
        for r in roots {
            store.add(r.clone()).unwrap();
        }
        let client = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::aws_lc_rs::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        let mut c = rustls::ClientConnection::new(Arc::new(client), name).unwrap();
        let mut s = rustls::ServerConnection::new(tls.config.clone()).unwrap();
        let mut wire = Vec::new();
        c.write_tls(&mut wire).unwrap();
        s.read_tls(&mut wire.as_slice()).unwrap();
        s.process_new_packets().unwrap();
        wire.clear();
        while s.wants_write() {
            s.write_tls(&mut wire).unwrap();
        }
        let mut rest = wire.as_slice();
        while !rest.is_empty() {
            c.read_tls(&mut rest).unwrap();
            c.process_new_packets().unwrap();
        }
        c.peer_certificates().unwrap()[0].to_vec()
    }

    /// A renewed pair is served without a restart; a broken one is not,
    /// and the last good pair stays.
    #[test]
    fn a_renewed_certificate_is_served_and_a_broken_one_is_not() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair(dir.path(), "a");
        let (cert2, key2) = pair(dir.path(), "b");
        let (first, renewed) = (der(&cert), der(&cert2));
        let roots = [first.clone(), renewed.clone()];
        let tls = Tls::load_rechecked(&cert, &key, Duration::ZERO).unwrap();
        assert_eq!(served(&tls, &roots), first.to_vec());

        std::fs::write(&key, "not a key").unwrap();
        assert_eq!(
            served(&tls, &roots),
            first.to_vec(),
            "a broken key replaced a good pair"
        );

        std::fs::rename(&cert2, &cert).unwrap();
        std::fs::rename(&key2, &key).unwrap();
        assert_eq!(served(&tls, &roots), renewed.to_vec());
    }

    #[test]
    fn bad_files_are_refused_with_the_file_named() {
        let dir = tempfile::tempdir().unwrap();
        let (cert, key) = pair(dir.path(), "a");
        let (_, other_key) = pair(dir.path(), "b");
        let missing = dir.path().join("missing.pem");
        let e = Tls::load(&missing, &key).unwrap_err().to_string();
        assert!(e.contains("missing.pem"), "{e}");
        let e = Tls::load(&key, &key).unwrap_err().to_string();
        assert!(e.contains("no PEM certificate"), "{e}");
        let e = Tls::load(&cert, &cert).unwrap_err().to_string();
        assert!(e.contains("no PEM private key"), "{e}");
        let e = Tls::load(&cert, &other_key).unwrap_err().to_string();
        assert!(e.contains("do not belong together"), "{e}");
        Tls::load(&cert, &key).unwrap();
    }
}
