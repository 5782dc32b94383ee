//! Which configuration files are trusted, and how far.
//!
//! A directory cordon has ever used as a workspace may hold files a
//! sandbox wrote, so the project's files (`.cordon/config.toml` and
//! `.env` in the current directory) are untrusted by default: they may set
//! only what cannot hurt the host ([`Guard::Any`]) or tighten the sandbox
//! ([`Guard::Tighten`]). Everything else they set is ignored and reported.
//! `cordon trust` records a file's SHA-256 in the user's own configuration
//! directory; a file is trusted only while its content still has that
//! hash, so a file changed after trust is untrusted again.
//!
//! Project files are read through [`read_project_file`], which follows no
//! symbolic link, opens nothing but a regular file, and reads a bounded
//! size: a planted FIFO, device or link cannot hang or redirect cordon.

use std::os::fd::AsFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::ConfigError;

/// Largest configuration file cordon reads.
const MAX_FILE: u64 = 1 << 20;

/// The file, in the user's configuration directory, listing trusted files.
pub const STORE_FILE: &str = "cordon/trusted.toml";

/// What a setting can do to the host, and so where it may come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Harmless from anywhere: the model's name, token budgets.
    Any,
    /// From an untrusted file only when it tightens the sandbox.
    Tighten,
    /// Chooses a host path or bind.
    Path,
    /// Chooses where requests (and the API key with them) are sent.
    Endpoint,
    /// A credential.
    Credential,
    /// Chooses the isolation itself or loosens it.
    Isolation,
    /// Changes a setting of the host's kernel, for every process on it.
    Host,
    /// Chooses how much history the host keeps: less loses the rewinds
    /// past whatever the sandbox did, more takes the host's disk.
    Retention,
}

impl Guard {
    /// Why an untrusted file may not set a key with this guard.
    pub fn why(self) -> &'static str {
        match self {
            Guard::Any => "",
            Guard::Tighten => "it would loosen the sandbox",
            Guard::Path => "it chooses a host path",
            Guard::Endpoint => "it chooses where the API key is sent",
            Guard::Credential => "it is a credential",
            Guard::Isolation => "it chooses the isolation",
            Guard::Host => "it changes a setting of this host's kernel",
            Guard::Retention => {
                "it decides how far back a rewind can go and how much of the host's disk that takes"
            }
        }
    }
}

/// A setting (or MCP server) a file set and cordon did not take.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ignored {
    pub file: PathBuf,
    pub key: String,
    pub why: String,
}

impl std::fmt::Display for Ignored {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.key.is_empty() {
            write!(f, "ignored {}: {}", self.file.display(), self.why)
        } else {
            write!(
                f,
                "ignored {} from {}: {}",
                self.key,
                self.file.display(),
                self.why
            )
        }
    }
}

/// One entry of the trust store.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustedFile {
    /// The file's absolute path, as cordon reads it.
    pub path: PathBuf,
    /// Lower-case hex SHA-256 of its content when it was trusted.
    pub sha256: String,
}

/// `trusted.toml`: the files the user trusted, each with its content hash.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrustStore {
    #[serde(default, rename = "file")]
    pub files: Vec<TrustedFile>,
}

impl TrustStore {
    /// The store under `config_home` (`$XDG_CONFIG_HOME`); none if absent.
    pub fn load(config_home: Option<&Path>) -> Result<TrustStore, ConfigError> {
        let Some(home) = config_home else {
            return Ok(TrustStore::default());
        };
        let path = home.join(STORE_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            // Unreadable (cordon run by another user with this HOME):
            // nothing is trusted, which is the safe reading.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotFound | std::io::ErrorKind::PermissionDenied
                ) =>
            {
                return Ok(TrustStore::default());
            }
            Err(e) => {
                return Err(ConfigError::File {
                    path,
                    message: e.to_string(),
                });
            }
        };
        toml::from_str(&text).map_err(|e: toml::de::Error| ConfigError::File {
            path,
            message: e.to_string().trim().replace('\n', " "),
        })
    }

    /// Writes the store atomically (a temporary file renamed over it).
    pub fn save(&self, config_home: &Path) -> Result<PathBuf, ConfigError> {
        let path = config_home.join(STORE_FILE);
        let err = |e: std::io::Error| ConfigError::File {
            path: path.clone(),
            message: e.to_string(),
        };
        let dir = path.parent().expect("STORE_FILE has a directory");
        std::fs::create_dir_all(dir).map_err(err)?;
        let text = toml::to_string(self).map_err(|e| ConfigError::File {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let tmp = dir.join(format!(".trusted.toml.{}", std::process::id()));
        std::fs::write(&tmp, text).map_err(err)?;
        std::fs::rename(&tmp, &path).map_err(err)?;
        Ok(path)
    }

    /// Whether `path` is trusted with exactly this content.
    pub fn trusts(&self, path: &Path, content: &[u8]) -> bool {
        let hash = sha256(content);
        self.files
            .iter()
            .any(|f| f.path == path && f.sha256 == hash)
    }

    /// Trusts `path` with this content, replacing an earlier entry for it.
    pub fn trust(&mut self, path: &Path, content: &[u8]) {
        self.revoke(path);
        self.files.push(TrustedFile {
            path: path.to_path_buf(),
            sha256: sha256(content),
        });
    }

    /// Forgets `path`; whether it was there.
    pub fn revoke(&mut self, path: &Path) -> bool {
        let before = self.files.len();
        self.files.retain(|f| f.path != path);
        before != self.files.len()
    }
}

pub fn sha256(content: &[u8]) -> String {
    Sha256::digest(content)
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// What reading a project file found.
#[derive(Debug)]
pub enum ProjectFile {
    Missing,
    /// Not a plain file cordon can trust the name of: the reason.
    Refused(String),
    Content(Vec<u8>),
}

/// Reads `name` (relative, such as `.cordon/config.toml`) under `dir`
/// without following any symbolic link, and only if it is a regular file
/// of at most [`MAX_FILE`] bytes.
///
/// One component at a time with `O_NOFOLLOW` rather than `openat2`:
/// cordon may itself run where `openat2` is filtered (inside a sandbox).
pub fn read_project_file(dir: &Path, name: &str) -> Result<ProjectFile, ConfigError> {
    use rustix::fs::{FileType, Mode, OFlags};
    use rustix::io::Errno;
    let path = dir.join(name);
    let fail = |message: String| ConfigError::File {
        path: path.clone(),
        message,
    };
    let link = || {
        ProjectFile::Refused(
            "it is (or is reached through) a symbolic link, which a sandbox could point anywhere"
                .into(),
        )
    };
    let mut at = match rustix::fs::open(
        dir,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) {
        Ok(fd) => fd,
        Err(Errno::NOENT) | Err(Errno::NOTDIR) => return Ok(ProjectFile::Missing),
        Err(e) => return Err(fail(format!("cannot open its directory: {e}"))),
    };
    let mut parts = name.split('/').peekable();
    while let Some(part) = parts.next() {
        if parts.peek().is_some() {
            let fd = match rustix::fs::openat(
                &at,
                part,
                OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
                Mode::empty(),
            ) {
                Ok(fd) => fd,
                Err(Errno::NOENT) => return Ok(ProjectFile::Missing),
                Err(e) => return Err(fail(e.to_string())),
            };
            let st = rustix::fs::fstat(&fd).map_err(|e| fail(e.to_string()))?;
            match FileType::from_raw_mode(st.st_mode) {
                FileType::Directory => at = fd,
                FileType::Symlink => return Ok(link()),
                _ => return Ok(ProjectFile::Missing),
            }
            continue;
        }
        let fd = match rustix::fs::openat(
            &at,
            part,
            // Non-blocking: opening a planted FIFO must not wait for a writer.
            OFlags::RDONLY | OFlags::NOFOLLOW | OFlags::CLOEXEC | OFlags::NOCTTY | OFlags::NONBLOCK,
            Mode::empty(),
        ) {
            Ok(fd) => fd,
            Err(Errno::NOENT) => return Ok(ProjectFile::Missing),
            Err(Errno::LOOP) => return Ok(link()),
            Err(e) => return Err(fail(e.to_string())),
        };
        return read_regular(fd).map_err(fail);
    }
    Ok(ProjectFile::Missing)
}

/// A regular file's content, up to [`MAX_FILE`] bytes.
fn read_regular(fd: std::os::fd::OwnedFd) -> Result<ProjectFile, String> {
    let st = rustix::fs::fstat(fd.as_fd()).map_err(|e| e.to_string())?;
    if !rustix::fs::FileType::from_raw_mode(st.st_mode).is_file() {
        return Ok(ProjectFile::Refused("it is not a regular file".into()));
    }
    let too_big = || ProjectFile::Refused(format!("it is larger than {} KiB", MAX_FILE / 1024));
    if st.st_size as u64 > MAX_FILE {
        return Ok(too_big());
    }
    let mut content = Vec::with_capacity(st.st_size as usize);
    let file = std::fs::File::from(fd);
    std::io::Read::read_to_end(&mut std::io::Read::take(file, MAX_FILE + 1), &mut content)
        .map_err(|e| e.to_string())?;
    if content.len() as u64 > MAX_FILE {
        return Ok(too_big());
    }
    Ok(ProjectFile::Content(content))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_store_trusts_a_path_only_with_the_content_it_had() {
        let home = tempfile::tempdir().unwrap();
        let mut store = TrustStore::load(Some(home.path())).unwrap();
        let p = Path::new("/p/.env");
        store.trust(p, b"A=1\n");
        store.save(home.path()).unwrap();
        let store = TrustStore::load(Some(home.path())).unwrap();
        assert!(store.trusts(p, b"A=1\n"));
        assert!(!store.trusts(p, b"A=2\n"));
        assert!(!store.trusts(Path::new("/q/.env"), b"A=1\n"));
    }

    #[test]
    fn links_fifos_and_huge_files_are_refused_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let d = dir.path();
        std::fs::write(d.join("secret"), "ANTHROPIC_BASE_URL=http://evil\n").unwrap();
        std::os::unix::fs::symlink(d.join("secret"), d.join(".env")).unwrap();
        assert!(matches!(
            read_project_file(d, ".env").unwrap(),
            ProjectFile::Refused(_)
        ));
        std::fs::create_dir(d.join("real")).unwrap();
        std::fs::write(d.join("real/config.toml"), "model = \"m\"\n").unwrap();
        std::os::unix::fs::symlink(d.join("real"), d.join(".cordon")).unwrap();
        assert!(matches!(
            read_project_file(d, ".cordon/config.toml").unwrap(),
            ProjectFile::Refused(_)
        ));
        std::fs::remove_file(d.join(".env")).unwrap();
        rustix::fs::mknodat(
            rustix::fs::CWD,
            d.join(".env"),
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::from_raw_mode(0o600),
            0,
        )
        .unwrap();
        assert!(matches!(
            read_project_file(d, ".env").unwrap(),
            ProjectFile::Refused(_)
        ));
        std::fs::remove_file(d.join(".env")).unwrap();
        let f = std::fs::File::create(d.join(".env")).unwrap();
        f.set_len(MAX_FILE + 1).unwrap();
        assert!(matches!(
            read_project_file(d, ".env").unwrap(),
            ProjectFile::Refused(_)
        ));
        assert!(matches!(
            read_project_file(&d.join("nowhere"), ".env").unwrap(),
            ProjectFile::Missing
        ));
    }
}
