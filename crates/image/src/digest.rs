//! Content digests: what a blob is named by, in a manifest and in the store.
//!
//! A digest comes from a registry, a manifest or an archive, all hostile,
//! and it names a file in the store: so it is parsed once into a closed
//! type (one algorithm, lower-case hex of the right length) and only that
//! type ever becomes a path.

use std::fmt;
use std::io::{self, Write};

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use sha2::{Digest as _, Sha256};

/// The one algorithm cordon accepts; every OCI tool writes it.
const ALGORITHM: &str = "sha256";
/// Hex digits of a SHA-256.
const HEX_LEN: usize = 64;

/// A `sha256:` digest, validated.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Digest([u8; 32]);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{shown:?} is not a digest: {why}")]
pub struct BadDigest {
    /// The input, cut short and made printable.
    shown: String,
    why: &'static str,
}

impl Digest {
    /// The digest of `bytes`.
    pub fn of(bytes: &[u8]) -> Digest {
        Digest(Sha256::digest(bytes).into())
    }

    /// The 64 hex digits, which name the blob's file in the store.
    pub fn hex(&self) -> String {
        hex::encode(self.0)
    }

    pub fn parse(s: &str) -> Result<Digest, BadDigest> {
        let bad = |why| BadDigest {
            shown: s
                .chars()
                .take(80)
                .filter(|&c| !crate::text::unprintable(c))
                .collect(),
            why,
        };
        let (algorithm, hex) = s.split_once(':').ok_or_else(|| bad("no algorithm"))?;
        if algorithm != ALGORITHM {
            return Err(bad("only sha256 digests are supported"));
        }
        if hex.len() != HEX_LEN || !hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')) {
            return Err(bad("a sha256 digest is 64 lower-case hex digits"));
        }
        let mut out = [0u8; 32];
        hex::decode_to_slice(hex, &mut out).map_err(|_| bad("not hex"))?;
        Ok(Digest(out))
    }
}

impl fmt::Display for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{ALGORITHM}:{}", self.hex())
    }
}

impl fmt::Debug for Digest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl std::str::FromStr for Digest {
    type Err = BadDigest;
    fn from_str(s: &str) -> Result<Digest, BadDigest> {
        Digest::parse(s)
    }
}

impl Serialize for Digest {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Digest {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Digest, D::Error> {
        let s = String::deserialize(d)?;
        Digest::parse(&s).map_err(serde::de::Error::custom)
    }
}

/// A running SHA-256, for writers that are not `Write` (an async one).
#[derive(Default)]
pub struct Hasher(Sha256);

impl Hasher {
    pub fn update(&mut self, bytes: &[u8]) {
        self.0.update(bytes);
    }

    pub fn finish(self) -> Digest {
        Digest(self.0.finalize().into())
    }
}

/// A writer that hashes what passes through it and counts it.
pub struct Hashing<W> {
    inner: W,
    hasher: Sha256,
    pub written: u64,
}

impl<W: Write> Hashing<W> {
    pub fn new(inner: W) -> Hashing<W> {
        Hashing {
            inner,
            hasher: Sha256::new(),
            written: 0,
        }
    }

    /// The digest of everything written, and the writer.
    pub fn finish(self) -> (Digest, W) {
        (Digest(self.hasher.finalize().into()), self.inner)
    }
}

impl<W: Write> Write for Hashing<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A reader that hashes what is read through it and counts it.
pub struct HashingReader<R> {
    inner: R,
    hasher: Sha256,
    pub read: u64,
}

impl<R: io::Read> HashingReader<R> {
    pub fn new(inner: R) -> HashingReader<R> {
        HashingReader {
            inner,
            hasher: Sha256::new(),
            read: 0,
        }
    }

    /// The digest of everything read so far.
    pub fn digest(&self) -> Digest {
        Digest(self.hasher.clone().finalize().into())
    }
}

impl<R: io::Read> io::Read for HashingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.hasher.update(&buf[..n]);
        self.read += n as u64;
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_well_formed_sha256_is_a_digest() {
        let d = Digest::of(b"");
        assert_eq!(
            d.to_string(),
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
        );
        assert_eq!(Digest::parse(&d.to_string()), Ok(d));
        for bad in [
            "",
            "sha256",
            "sha512:00",
            "sha256:E3B0C44298FC1C149AFBF4C8996FB92427AE41E4649B934CA495991B7852B855",
            "sha256:../../../../etc/passwd",
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b85",
            "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855/",
        ] {
            assert!(Digest::parse(bad).is_err(), "{bad:?}");
        }
        let e = Digest::parse("md5:\x1b[2Jabc").unwrap_err().to_string();
        assert!(!e.contains('\x1b'), "{e:?}");
    }
}
