//! What `--image REF` names: an image in a registry, an OCI layout on
//! disk, or an archive `docker save` wrote.
//!
//! A registry reference is parsed by `oci-spec` (a bare name goes to the
//! default registry, as every OCI tool has it). Registries on loopback are
//! spoken to over plain HTTP, as Docker does; every other only over TLS.

use std::fmt;
use std::net::IpAddr;
use std::path::PathBuf;
use std::str::FromStr;

use oci_spec::distribution::Reference;

/// The prefix of an OCI image layout: `oci:DIR[:TAG]`.
const LAYOUT: &str = "oci:";
/// The prefix of a `docker save` archive: `docker-archive:FILE`.
const ARCHIVE: &str = "docker-archive:";
/// An explicit registry reference, as skopeo writes one.
const REGISTRY: &str = "docker://";
/// What a reference may be, for an error to say.
const FORMS: &str = "write NAME[:TAG], NAME@sha256:HEX, HOST[:PORT]/NAME[:TAG] (names in lower case), oci:DIR[:TAG] or docker-archive:FILE";

/// Where an image comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImageRef {
    Registry(Reference),
    /// An OCI image layout directory, and the tag (its
    /// `org.opencontainers.image.ref.name`) to take from it; none: the
    /// only image it holds.
    Layout {
        dir: PathBuf,
        tag: Option<String>,
    },
    DockerArchive(PathBuf),
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{shown:?} is not an image reference: {why}")]
pub struct BadReference {
    shown: String,
    why: String,
}

impl ImageRef {
    /// Whether `s` names a layout or archive on this machine rather than
    /// a registry's image: told by its prefix alone, without the parse
    /// (whose grammar takes tens of milliseconds to build).
    pub fn names_a_file(s: &str) -> bool {
        s.starts_with(LAYOUT) || s.starts_with(ARCHIVE)
    }

    /// Whether the registry is this machine's own (loopback), which is
    /// spoken to over plain HTTP.
    pub fn plain_http(&self) -> bool {
        match self {
            ImageRef::Registry(r) => is_loopback(r.registry()),
            _ => false,
        }
    }
}

/// Whether `host[:port]` is a loopback name or address.
fn is_loopback(registry: &str) -> bool {
    let host = match registry.strip_prefix('[') {
        // [::1]:5000
        Some(rest) => rest.split(']').next().unwrap_or_default(),
        None => registry.split(':').next().unwrap_or_default(),
    };
    host == "localhost" || host.parse::<IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

impl FromStr for ImageRef {
    type Err = BadReference;
    fn from_str(s: &str) -> Result<ImageRef, BadReference> {
        let bad = |why: String| BadReference {
            shown: s
                .chars()
                .take(200)
                .filter(|&c| !crate::text::unprintable(c))
                .collect(),
            why,
        };
        if let Some(rest) = s.strip_prefix(LAYOUT) {
            let (dir, tag) = match rest.split_once(':') {
                Some((dir, tag)) => (dir, Some(tag.to_string())),
                None => (rest, None),
            };
            if dir.is_empty() {
                return Err(bad("oci: needs a directory: oci:DIR[:TAG]".into()));
            }
            if tag.as_deref() == Some("") {
                return Err(bad("the tag after oci:DIR: is empty".into()));
            }
            return Ok(ImageRef::Layout {
                dir: PathBuf::from(dir),
                tag,
            });
        }
        if let Some(file) = s.strip_prefix(ARCHIVE) {
            if file.is_empty() {
                return Err(bad(
                    "docker-archive: needs a file: docker-archive:FILE".into()
                ));
            }
            return Ok(ImageRef::DockerArchive(PathBuf::from(file)));
        }
        let name = s.strip_prefix(REGISTRY).unwrap_or(s);
        if name.is_empty() {
            return Err(bad("it is empty".into()));
        }
        let r = Reference::from_str(name).map_err(|e| bad(format!("{e}; {FORMS}")))?;
        // The distribution spec's rule, which the parser leaves to servers.
        let lower = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-/".contains(c);
        if !r.repository().chars().all(lower) || r.repository().split('/').any(str::is_empty) {
            return Err(bad(
                "a repository name is lower-case letters, digits, `.`, `_`, `-` and `/`".into(),
            ));
        }
        Ok(ImageRef::Registry(r))
    }
}

impl fmt::Display for ImageRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ImageRef::Registry(r) => write!(f, "{}", r.whole()),
            ImageRef::Layout { dir, tag: Some(t) } => write!(f, "{LAYOUT}{}:{t}", dir.display()),
            ImageRef::Layout { dir, tag: None } => write!(f, "{LAYOUT}{}", dir.display()),
            ImageRef::DockerArchive(file) => write!(f, "{ARCHIVE}{}", file.display()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> ImageRef {
        s.parse().unwrap_or_else(|e| panic!("{s}: {e}"))
    }

    #[test]
    fn the_three_forms_parse() {
        let ImageRef::Registry(r) = parse("127.0.0.1:5000/team/tools:v2") else {
            panic!()
        };
        assert_eq!(
            (r.registry(), r.repository(), r.tag()),
            ("127.0.0.1:5000", "team/tools", Some("v2"))
        );
        let digest = format!("sha256:{}", "a".repeat(64));
        let ImageRef::Registry(r) = parse(&format!("localhost:5000/img@{digest}")) else {
            panic!()
        };
        assert_eq!(r.digest(), Some(digest.as_str()));
        assert_eq!(
            parse("oci:/srv/layout:latest"),
            ImageRef::Layout {
                dir: "/srv/layout".into(),
                tag: Some("latest".into())
            }
        );
        assert_eq!(
            parse("oci:layout"),
            ImageRef::Layout {
                dir: "layout".into(),
                tag: None
            }
        );
        assert_eq!(
            parse("docker-archive:/tmp/img.tar"),
            ImageRef::DockerArchive("/tmp/img.tar".into())
        );
        assert_eq!(parse("docker://localhost/a:b"), parse("localhost/a:b"));
    }

    #[test]
    fn a_bare_name_goes_to_the_default_registry_and_is_fetched_over_tls() {
        let r = parse("debian:bookworm");
        let ImageRef::Registry(inner) = &r else {
            panic!()
        };
        assert_eq!(inner.repository(), "library/debian");
        assert!(!r.plain_http());
    }

    #[test]
    fn only_loopback_registries_are_plain_http() {
        for plain in ["localhost:5000/a", "127.0.0.1:5000/a", "127.3.4.5/a"] {
            assert!(parse(plain).plain_http(), "{plain}");
        }
        for tls in [
            "registry.example/a",
            "10.0.0.1:5000/a",
            "localhost.example/a",
            "127.0.0.1.example/a",
        ] {
            assert!(!parse(tls).plain_http(), "{tls}");
        }
    }

    #[test]
    fn nonsense_is_refused_with_the_form_to_use() {
        for (bad, says) in [
            ("", "empty"),
            ("oci:", "oci:DIR"),
            ("oci:dir:", "empty"),
            ("docker-archive:", "docker-archive:FILE"),
            ("UPPER/case", "lower-case"),
            ("a:b:c:d", ""),
        ] {
            let e = bad.parse::<ImageRef>().unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }
}
