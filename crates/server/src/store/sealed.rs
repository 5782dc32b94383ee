//! Secrets at rest: what the database holds of a tenant's git token is
//! sealed (XChaCha20-Poly1305) with a key the database never holds, so a
//! dump, a backup or a replica of it gives no one the tenants' logins.
//!
//! - The key is the operator's `CORDON_SECRETS_KEY`, or derived from the
//!   cluster key every process of a deployment shares, or, for one server
//!   alone, made at its first start in `<data dir>/secrets.key` (0600).
//! - A sealed value is `v1:<key id>:<base64 of nonce and ciphertext>`. The
//!   key id (not the key) says which key sealed it, so a process given
//!   another key says so rather than "does not open".
//! - What a value is sealed for (its tenant and host) is its associated
//!   data: a row copied to another tenant or host does not open.
//! - Keys rotate: a [`Keyring`] seals with the current key and still opens
//!   what earlier ones sealed (`CORDON_SECRETS_KEY_PREVIOUS`), and says so,
//!   for the value to be sealed again with the current one.

use std::io::Write;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::Path;

use base64::Engine;
use chacha20poly1305::aead::{Aead, KeyInit, Payload};
use chacha20poly1305::{XChaCha20Poly1305, XNonce};
use hmac::Mac;

/// The format of what this module writes; bumped if it ever changes.
const VERSION: &str = "v1";
/// Nonces are random: XChaCha's 192 bits make a collision negligible.
const NONCE_LEN: usize = 24;
/// Shortest operator key taken (the secrets key, the cluster key): 32
/// bytes, as from `openssl rand -hex 16`.
pub const KEY_MIN: usize = 32;
/// What HKDF is told the key is for, so the same passphrase or cluster
/// key yields unrelated keys for other purposes.
const PURPOSE: &[u8] = b"cordon: tenants' secrets at rest, v1";

/// An operator's key, trimmed, when it is at least [`KEY_MIN`] printable
/// ASCII characters without spaces: the one rule for every key cordon
/// takes from the environment.
pub fn strong_key(key: &str) -> Option<&str> {
    let key = key.trim();
    (key.len() >= KEY_MIN && key.bytes().all(|b| b.is_ascii_graphic())).then_some(key)
}

/// Why a secret could not be sealed or opened, or a key not had.
#[derive(Debug, thiserror::Error)]
pub enum SealError {
    #[error(
        "the secrets key must be at least {KEY_MIN} printable characters without spaces \
         (for example `openssl rand -hex 32`)"
    )]
    WeakKey,
    #[error("the secrets key file {path}: {why}")]
    KeyFile { path: String, why: String },
    #[error(
        "{what} was sealed with another secrets key (id {theirs}; this process has {ours}): give every cordon process the same CORDON_SECRETS_KEY or cluster key, or store it again"
    )]
    OtherKey {
        what: String,
        theirs: String,
        ours: String,
    },
    #[error(
        "{what} does not open: it was altered in the database, or moved to another tenant or host; store it again"
    )]
    Altered { what: String },
}

/// The key secrets are sealed with. Never printed.
#[derive(Clone)]
pub struct SecretsKey {
    cipher: XChaCha20Poly1305,
    id: String,
}

impl std::fmt::Debug for SecretsKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SecretsKey({})", self.id)
    }
}

impl SecretsKey {
    /// The key from an operator's passphrase (`CORDON_SECRETS_KEY`).
    pub fn from_passphrase(passphrase: &str) -> Result<SecretsKey, SealError> {
        let p = strong_key(passphrase).ok_or(SealError::WeakKey)?;
        Ok(SecretsKey::derive(p.as_bytes()))
    }

    /// A key derived from other key material (the cluster key), for this
    /// purpose alone.
    pub fn derive(material: &[u8]) -> SecretsKey {
        let mut key = [0u8; 32];
        hkdf::Hkdf::<sha2::Sha256>::new(None, material)
            .expand(PURPOSE, &mut key)
            .expect("32 bytes is a valid HKDF-SHA256 length");
        let mut mac = <hmac::Hmac<sha2::Sha256> as hmac::KeyInit>::new_from_slice(&key)
            .expect("HMAC takes a key of any length");
        mac.update(b"cordon: key id");
        let id = hex::encode(&mac.finalize().into_bytes()[..4]);
        SecretsKey {
            cipher: XChaCha20Poly1305::new(&key.into()),
            id,
        }
    }

    /// The key kept in `path`, made there (random, 0600) when there is
    /// none. A file others may read is refused, as ssh refuses a key.
    pub fn load_or_create(path: &Path) -> Result<SecretsKey, SealError> {
        let fail = |why: String| SealError::KeyFile {
            path: path.display().to_string(),
            why,
        };
        if !path.exists() {
            let mut raw = [0u8; 32];
            getrandom::fill(&mut raw).map_err(|e| fail(format!("no randomness: {e}")))?;
            // Written whole under a temporary name, then linked into place:
            // two processes starting at once both end up with the one that
            // got there first, never a half-written file.
            let tmp = path.with_extension(format!("tmp.{}", std::process::id()));
            let written = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&tmp)
                .and_then(|mut f| {
                    f.write_all(hex::encode(raw).as_bytes())?;
                    f.sync_all()
                });
            let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
            let _ = std::fs::remove_file(&tmp);
            match linked {
                Ok(()) => tracing::info!("made a secrets key in {}", path.display()),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
                Err(e) => return Err(fail(format!("cannot make it: {e}"))),
            }
        }
        let meta = std::fs::metadata(path).map_err(|e| fail(e.to_string()))?;
        if meta.permissions().mode() & 0o077 != 0 {
            return Err(fail(format!(
                "others may read it (mode {:o}): chmod 600 it",
                meta.permissions().mode() & 0o777
            )));
        }
        let text = std::fs::read_to_string(path).map_err(|e| fail(e.to_string()))?;
        SecretsKey::from_passphrase(&text).map_err(|e| fail(e.to_string()))
    }

    /// Which key this is, to name in errors and logs; says nothing of it.
    pub fn id(&self) -> &str {
        &self.id
    }

    /// `secret`, sealed for `context` (what it belongs to).
    pub fn seal(&self, secret: &str, context: &str) -> String {
        let mut nonce = [0u8; NONCE_LEN];
        getrandom::fill(&mut nonce).expect("the kernel's randomness");
        let sealed = self
            .cipher
            .encrypt(
                &XNonce::from(nonce),
                Payload {
                    msg: secret.as_bytes(),
                    aad: context.as_bytes(),
                },
            )
            .expect("sealing a short secret cannot fail");
        let mut bytes = nonce.to_vec();
        bytes.extend_from_slice(&sealed);
        format!(
            "{VERSION}:{}:{}",
            self.id,
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(bytes)
        )
    }

    /// What [`seal`](Self::seal) sealed for `context`; `what` names the
    /// secret in an error.
    pub fn open(&self, sealed: &str, context: &str, what: &str) -> Result<String, SealError> {
        let altered = || SealError::Altered {
            what: what.to_string(),
        };
        let Some((id, body)) = parts(sealed) else {
            return Err(altered());
        };
        if id != self.id {
            return Err(SealError::OtherKey {
                what: what.to_string(),
                theirs: cordon_tools::printable(id),
                ours: self.id.clone(),
            });
        }
        let bytes = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(body)
            .map_err(|_| altered())?;
        if bytes.len() < NONCE_LEN {
            return Err(altered());
        }
        let (nonce, ciphertext) = bytes.split_at(NONCE_LEN);
        let nonce = XNonce::try_from(nonce).map_err(|_| altered())?;
        let plain = self
            .cipher
            .decrypt(
                &nonce,
                Payload {
                    msg: ciphertext,
                    aad: context.as_bytes(),
                },
            )
            .map_err(|_| altered())?;
        String::from_utf8(plain).map_err(|_| altered())
    }
}

/// The key id a sealed value names and its body, if it is one of ours.
fn parts(sealed: &str) -> Option<(&str, &str)> {
    let mut parts = sealed.splitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(VERSION), Some(id), Some(body)) => Some((id, body)),
        _ => None,
    }
}

/// The key secrets are sealed with now, and earlier ones whose values are
/// still opened (after a rotation).
#[derive(Debug, Clone)]
pub struct Keyring {
    current: SecretsKey,
    previous: Vec<SecretsKey>,
}

/// A secret opened, and whether an earlier key sealed it.
#[derive(Debug)]
pub struct Opened {
    pub secret: String,
    /// Seal it again with the current key.
    pub stale: bool,
}

impl Keyring {
    pub fn new(current: SecretsKey, previous: Vec<SecretsKey>) -> Keyring {
        let previous = previous
            .into_iter()
            .filter(|k| k.id != current.id)
            .collect();
        Keyring { current, previous }
    }

    pub fn seal(&self, secret: &str, context: &str) -> String {
        self.current.seal(secret, context)
    }

    /// What `sealed` holds, opened with whichever of these keys sealed it.
    pub fn open(&self, sealed: &str, context: &str, what: &str) -> Result<Opened, SealError> {
        let earlier = parts(sealed).and_then(|(id, _)| self.previous.iter().find(|k| k.id == id));
        match earlier {
            Some(key) => Ok(Opened {
                secret: key.open(sealed, context, what)?,
                stale: true,
            }),
            None => Ok(Opened {
                secret: self.current.open(sealed, context, what)?,
                stale: false,
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const PASS: &str = "0123456789abcdef0123456789abcdef";

    #[test]
    fn a_secret_opens_with_its_key_and_context_only() {
        let key = SecretsKey::from_passphrase(PASS).unwrap();
        let sealed = key.seal("ghp_token", "acme\0github.com");
        assert!(!sealed.contains("ghp_token"), "{sealed}");
        assert_ne!(
            sealed,
            key.seal("ghp_token", "acme\0github.com"),
            "a fresh nonce each time"
        );
        assert_eq!(
            key.open(&sealed, "acme\0github.com", "it").unwrap(),
            "ghp_token"
        );

        let moved = key.open(&sealed, "mallory\0github.com", "it").unwrap_err();
        assert!(matches!(moved, SealError::Altered { .. }), "{moved}");

        let other = SecretsKey::from_passphrase(&PASS.replace('0', "x")).unwrap();
        let e = other
            .open(&sealed, "acme\0github.com", "the login")
            .unwrap_err();
        assert!(
            e.to_string().contains(key.id()) && e.to_string().contains(other.id()),
            "{e}"
        );

        // A flipped bit anywhere in the body, and text that was never sealed.
        let (head, body) = sealed.rsplit_once(':').unwrap();
        let mut b = base64::engine::general_purpose::STANDARD_NO_PAD
            .decode(body)
            .unwrap();
        *b.last_mut().unwrap() ^= 1;
        let flipped = format!(
            "{head}:{}",
            base64::engine::general_purpose::STANDARD_NO_PAD.encode(b)
        );
        for bad in [flipped.as_str(), "ghp_token", "v1:", ""] {
            let e = key.open(bad, "acme\0github.com", "it").unwrap_err();
            assert!(!e.to_string().contains("ghp_token"), "{e}");
        }
    }

    #[test]
    fn a_keyring_opens_what_an_earlier_key_sealed_and_says_to_seal_it_again() {
        let old = SecretsKey::from_passphrase(PASS).unwrap();
        let new = SecretsKey::from_passphrase(&PASS.replace('0', "n")).unwrap();
        let sealed_old = old.seal("t", "c");
        let ring = Keyring::new(new.clone(), vec![old.clone()]);
        let opened = ring.open(&sealed_old, "c", "it").unwrap();
        assert_eq!((opened.secret.as_str(), opened.stale), ("t", true));
        let resealed = ring.seal(&opened.secret, "c");
        assert!(resealed.contains(new.id()));
        let opened = ring.open(&resealed, "c", "it").unwrap();
        assert_eq!((opened.secret.as_str(), opened.stale), ("t", false));
        // Without the earlier key it is named, not guessed at.
        let e = Keyring::new(new, vec![])
            .open(&sealed_old, "c", "it")
            .unwrap_err();
        assert!(e.to_string().contains(old.id()), "{e}");
        // An earlier key still binds the value to its context.
        assert!(ring.open(&sealed_old, "other", "it").is_err());
    }

    #[test]
    fn weak_passphrases_are_refused_and_keys_never_printed() {
        assert!(SecretsKey::from_passphrase("short").is_err());
        assert!(SecretsKey::from_passphrase("0123456789abcdef 0123456789abcdef").is_err());
        let key = SecretsKey::from_passphrase(PASS).unwrap();
        assert!(!format!("{key:?}").contains(PASS));
        assert_eq!(
            key.id(),
            SecretsKey::from_passphrase(&format!("  {PASS}\n"))
                .unwrap()
                .id()
        );
    }

    #[test]
    fn a_key_file_is_made_once_private_and_refused_when_others_may_read_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("secrets.key");
        let made = SecretsKey::load_or_create(&path).unwrap();
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(SecretsKey::load_or_create(&path).unwrap().id(), made.id());
        let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(left.len(), 1, "no temporary file left");

        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = SecretsKey::load_or_create(&path).unwrap_err();
        assert!(e.to_string().contains("chmod 600"), "{e}");
    }
}
