//! Registry credentials, from the host user's own files only.
//!
//! Searched in the order containers' tools use: `$REGISTRY_AUTH_FILE`,
//! `$XDG_RUNTIME_DIR/containers/auth.json`,
//! `$XDG_CONFIG_HOME/containers/auth.json` (`~/.config`), then Docker's
//! `$DOCKER_CONFIG/config.json` (`~/.docker`). The first entry for the
//! registry wins. Credential helpers (`credsStore`, `credHelpers`) are
//! programs, and cordon runs none: an entry that only names one is
//! skipped. Credentials go to the registry and nowhere else: never into a
//! sandbox, a log line or an error message.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use base64::Engine as _;
use serde::Deserialize;

/// Largest credentials file read.
const MAX_FILE: u64 = 1 << 20;

/// What a registry is told.
#[derive(Clone, PartialEq, Eq)]
pub enum Credentials {
    Anonymous,
    Basic { user: String, password: String },
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Credentials::Anonymous => f.write_str("Anonymous"),
            Credentials::Basic { user, .. } => write!(f, "Basic({user}, <password>)"),
        }
    }
}

/// The part of an auth file cordon reads; the rest is ignored.
#[derive(Deserialize, Default)]
struct AuthFile {
    #[serde(default)]
    auths: BTreeMap<String, Entry>,
}

#[derive(Deserialize, Default)]
struct Entry {
    #[serde(default)]
    auth: Option<String>,
    #[serde(default)]
    username: Option<String>,
    #[serde(default)]
    password: Option<String>,
}

/// Where to look, so that tests need not touch the real environment.
pub struct Sources {
    pub files: Vec<PathBuf>,
}

impl Sources {
    /// The files of the process's user, in search order.
    pub fn from_env() -> Sources {
        let var = |k: &str| {
            std::env::var_os(k)
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
        };
        let home = var("HOME");
        let mut files = Vec::new();
        files.extend(var("REGISTRY_AUTH_FILE"));
        if let Some(run) = var("XDG_RUNTIME_DIR") {
            files.push(run.join("containers/auth.json"));
        }
        if let Some(config) =
            var("XDG_CONFIG_HOME").or_else(|| home.as_ref().map(|h| h.join(".config")))
        {
            files.push(config.join("containers/auth.json"));
        }
        if let Some(docker) =
            var("DOCKER_CONFIG").or_else(|| home.as_ref().map(|h| h.join(".docker")))
        {
            files.push(docker.join("config.json"));
        }
        Sources { files }
    }

    /// The credentials for `registry` (`host[:port]`), or anonymous.
    pub fn for_registry(&self, registry: &str, repository: &str) -> Credentials {
        for file in &self.files {
            let Some(parsed) = read(file) else { continue };
            // The most specific key first: `host/ns/repo`, then `host/ns`,
            // then `host` (containers' rule; Docker's keys are hosts).
            let mut best: Option<(usize, &Entry)> = None;
            for (key, entry) in &parsed.auths {
                let key = normalise(key);
                let matches = key == registry
                    || key
                        .strip_prefix(registry)
                        .and_then(|rest| rest.strip_prefix('/'))
                        .is_some_and(|ns| {
                            repository == ns || repository.starts_with(&format!("{ns}/"))
                        });
                if matches && best.is_none_or(|(len, _)| key.len() > len) {
                    best = Some((key.len(), entry));
                }
            }
            if let Some(c) = best.and_then(|(_, e)| credentials(e)) {
                return c;
            }
        }
        Credentials::Anonymous
    }
}

fn read(path: &Path) -> Option<AuthFile> {
    use std::io::Read;
    let mut text = Vec::new();
    std::fs::File::open(path)
        .ok()?
        .take(MAX_FILE)
        .read_to_end(&mut text)
        .ok()?;
    match serde_json::from_slice(&text) {
        Ok(f) => Some(f),
        Err(e) => {
            // Where, and what is wrong; never the content.
            tracing::warn!(
                "{}: not a credentials file cordon can read ({e})",
                path.display()
            );
            None
        }
    }
}

/// A key as the registry's `host[:port]` (and path, if it has one): no
/// scheme, no Docker Hub v1 suffix.
fn normalise(key: &str) -> String {
    let key = key
        .strip_prefix("https://")
        .or_else(|| key.strip_prefix("http://"))
        .unwrap_or(key);
    key.trim_end_matches('/')
        .trim_end_matches("/v1")
        .trim_end_matches("/v2")
        .to_string()
}

fn credentials(e: &Entry) -> Option<Credentials> {
    if let (Some(user), Some(password)) = (&e.username, &e.password) {
        return Some(Credentials::Basic {
            user: user.clone(),
            password: password.clone(),
        });
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(e.auth.as_deref()?.trim())
        .ok()?;
    let text = String::from_utf8(decoded).ok()?;
    let (user, password) = text.split_once(':')?;
    Some(Credentials::Basic {
        user: user.to_string(),
        password: password.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn basic(u: &str, p: &str) -> Credentials {
        Credentials::Basic {
            user: u.into(),
            password: p.into(),
        }
    }

    #[test]
    fn the_first_file_with_an_entry_wins_and_the_most_specific_key() {
        let dir = tempfile::tempdir().unwrap();
        let podman = dir.path().join("auth.json");
        let docker = dir.path().join("config.json");
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        std::fs::write(
            &podman,
            format!(
                r#"{{"auths": {{"127.0.0.1:5000": {{"auth": "{}"}}, "127.0.0.1:5000/team": {{"auth": "{}"}}}}}}"#,
                b64("alice:one"),
                b64("team:two")
            ),
        )
        .unwrap();
        std::fs::write(
            &docker,
            format!(
                r#"{{"auths": {{"https://localhost:5001/v1/": {{"auth": "{}"}}, "127.0.0.1:5000": {{"auth": "{}"}}}}, "credsStore": "desktop"}}"#,
                b64("bob:three"),
                b64("ignored:x")
            ),
        )
        .unwrap();
        let s = Sources {
            files: vec![dir.path().join("missing.json"), podman, docker],
        };
        assert_eq!(
            s.for_registry("127.0.0.1:5000", "img"),
            basic("alice", "one")
        );
        assert_eq!(
            s.for_registry("127.0.0.1:5000", "team/img"),
            basic("team", "two")
        );
        assert_eq!(
            s.for_registry("127.0.0.1:5000", "teamwork/img"),
            basic("alice", "one")
        );
        assert_eq!(s.for_registry("localhost:5001", "x"), basic("bob", "three"));
        assert_eq!(s.for_registry("other:1", "x"), Credentials::Anonymous);
        assert!(!format!("{:?}", basic("u", "hunter2")).contains("hunter2"));
    }
}
