//! A session's repository, cloned on the host with the host's own git
//! credentials (the credential helpers the user's configuration names,
//! and the SSH agent), none of which the sandbox ever sees: the clone
//! happens before the sandbox starts, the remote URL kept in `.git/config`
//! carries no secret (one that would is refused), and the helpers are
//! passed to that one git command, never written anywhere.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::command::{Git, GitError};

/// `URL[#REF]`: a repository, and the branch, tag or commit to start from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RepoSpec {
    pub url: String,
    pub reference: Option<String>,
}

/// Why a repository cannot be used.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    #[error("{0}")]
    Spec(String),
    #[error(
        "{} is not empty: cordon clones a repository into an empty directory (name another with --workspace)",
        .0.display()
    )]
    NotEmpty(PathBuf),
    #[error("{what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("cannot clone {url}: {source}")]
    Clone { url: String, source: GitError },
    #[error("{url} has no {reference:?} to start from (a branch, a tag or a commit of it)")]
    NoReference { url: String, reference: String },
    #[error(transparent)]
    Git(#[from] GitError),
}

impl FromStr for RepoSpec {
    type Err = RemoteError;

    fn from_str(s: &str) -> Result<RepoSpec, RemoteError> {
        let bad = |why: String| RemoteError::Spec(why);
        let s = s.trim();
        let (url, reference) = match s.rsplit_once('#') {
            Some((u, r)) => (u, Some(r)),
            None => (s, None),
        };
        if url.is_empty() {
            return Err(bad("--repo needs a URL: --repo URL[#REF]".into()));
        }
        if url.chars().any(|c| c.is_control() || c == ' ') {
            return Err(bad(format!(
                "{}: a repository URL has no spaces or control characters",
                cordon_tools::printable(url)
            )));
        }
        if url.starts_with('-') || url.contains("::") {
            // `-...` would be an option; `TRANSPORT::` a remote helper
            // (`ext::` runs a command).
            return Err(bad(format!(
                "{url}: not a repository URL (https://, ssh://, git://, file://, user@host:path or a path)"
            )));
        }
        if let Some((scheme, rest)) = url.split_once("://") {
            if !matches!(scheme, "https" | "http" | "ssh" | "git" | "file") {
                return Err(bad(format!(
                    "{url}: cordon clones over https, http, ssh, git or file, not {scheme}"
                )));
            }
            let authority = rest.split('/').next().unwrap_or("");
            if let Some((userinfo, _)) = authority.rsplit_once('@')
                && userinfo.contains(':')
            {
                return Err(bad(format!(
                    "{scheme}://{}: the URL holds a password or token, which would end up in the repository's configuration where the sandbox can read it; give the URL without it and let a git credential helper supply it (git config --global credential.helper store, or your forge's helper)",
                    rest.split_once('@').map_or(rest, |(_, host)| host)
                )));
            }
        }
        let reference = match reference {
            None => None,
            Some("") => {
                return Err(bad(format!(
                    "{s}: nothing after #: give a branch, tag or commit"
                )));
            }
            Some(r) => {
                let ok = r.len() <= 255
                    && !r.starts_with('-')
                    && !r.contains("..")
                    && r.bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b"/._-".contains(&b));
                if !ok {
                    return Err(bad(format!(
                        "{}: not a branch, tag or commit name",
                        cordon_tools::printable(r)
                    )));
                }
                Some(r.to_string())
            }
        };
        Ok(RepoSpec {
            url: url.to_string(),
            reference,
        })
    }
}

impl RepoSpec {
    /// The transport git will use.
    pub(crate) fn protocol(&self) -> &'static str {
        match self.url.split_once("://").map(|(s, _)| s) {
            Some("https") => "https",
            Some("http") => "http",
            Some("git") => "git",
            Some("ssh") => "ssh",
            Some(_) => "file",
            // user@host:path is ssh; a path is a local repository.
            None if self.url.contains(':') && !self.url.starts_with('/') => "ssh",
            None => "file",
        }
    }

    /// A repository on this machine (a path or `file://`): the server
    /// refuses these for its tenants.
    pub fn is_local(&self) -> bool {
        self.protocol() == "file"
    }
}

/// The host's means to reach a repository: the credential helpers its
/// user's git configuration names, and what ssh needs (the agent, the
/// home with `~/.ssh`). Read from the host, given only to the git
/// commands that talk to a remote.
#[derive(Debug, Clone, Default)]
pub struct HostCredentials {
    helpers: Vec<String>,
    env: Vec<(OsString, OsString)>,
}

impl HostCredentials {
    /// What this process's user has: `credential.helper` from the user's
    /// and the system's git configuration (which are theirs, not the
    /// workspace's), and `HOME`, `XDG_CONFIG_HOME` and `SSH_AUTH_SOCK`.
    pub fn from_host() -> HostCredentials {
        HostCredentials::from_env(
            ["HOME", "XDG_CONFIG_HOME", "SSH_AUTH_SOCK"]
                .into_iter()
                .filter_map(|k| std::env::var_os(k).map(|v| (OsString::from(k), v)))
                .collect(),
        )
    }

    /// As [`HostCredentials::from_host`], for a user whose `HOME` (and
    /// `XDG_CONFIG_HOME`, `SSH_AUTH_SOCK`) are `env`.
    pub fn from_env(env: Vec<(OsString, OsString)>) -> HostCredentials {
        let mut cmd = std::process::Command::new("git");
        cmd.env_clear()
            .envs(env.iter().map(|(k, v)| (k, v)))
            .env("PATH", std::env::var_os("PATH").unwrap_or_default())
            // From no repository: only the user's and the system's files.
            .current_dir("/")
            .env("GIT_CEILING_DIRECTORIES", "/")
            .args(["config", "--get-all", "credential.helper"]);
        let helpers = cmd
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| {
                String::from_utf8_lossy(&o.stdout)
                    .lines()
                    .map(str::to_string)
                    .collect::<Vec<_>>()
            })
            .unwrap_or_default();
        // An empty entry resets the list: only what follows the last one counts.
        let helpers = match helpers.iter().rposition(String::is_empty) {
            Some(i) => helpers[i + 1..].to_vec(),
            None => helpers,
        };
        HostCredentials { helpers, env }
    }

    /// `git` with these credentials, for a command that talks to a remote.
    pub(crate) fn apply(&self, mut git: Git) -> Git {
        for (k, v) in &self.env {
            git = git.env(k.clone(), v.clone());
        }
        git = git.env("GIT_SSH_COMMAND", "ssh -o BatchMode=yes");
        for h in &self.helpers {
            git = git.setting("credential.helper", h);
        }
        git
    }
}

/// What [`clone_into`] made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cloned {
    pub url: String,
    /// The session's branch, checked out.
    pub branch: String,
    /// The commit it starts from.
    pub base: String,
    /// The remote's branch a pull request goes into: `#REF` when it names
    /// a branch, else the remote's default branch.
    pub base_branch: String,
}

/// Clones `spec` into `workspace` (empty or absent) on the host, with
/// `creds`, and checks out a new branch `branch` at its reference (the
/// remote's default branch when it names none).
pub fn clone_into(
    spec: &RepoSpec,
    workspace: &Path,
    branch: &str,
    creds: &HostCredentials,
) -> Result<Cloned, RemoteError> {
    let io = |what: String| move |source| RemoteError::Io { what, source };
    match std::fs::read_dir(workspace) {
        Ok(mut d) => {
            if d.next().is_some() {
                return Err(RemoteError::NotEmpty(workspace.to_path_buf()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(workspace).map_err(io(workspace.display().to_string()))?
        }
        Err(e) => return Err(io(workspace.display().to_string())(e)),
    }
    let parent = workspace
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."))
        .to_path_buf();
    let protocol = spec.protocol();
    let outside = creds.apply(Git::outside(&parent).allow_protocol(protocol));
    outside
        .run([
            std::ffi::OsStr::new("clone"),
            std::ffi::OsStr::new("--quiet"),
            std::ffi::OsStr::new("--no-checkout"),
            std::ffi::OsStr::new("--origin"),
            std::ffi::OsStr::new("origin"),
            std::ffi::OsStr::new("--"),
            std::ffi::OsStr::new(&spec.url),
            workspace.as_os_str(),
        ])
        .map_err(|source| RemoteError::Clone {
            url: spec.url.clone(),
            source,
        })?;
    let git = Git::new(workspace.join(".git")).work_tree(workspace);
    let candidates = match &spec.reference {
        // The remote's default branch; the clone's own HEAD names it too.
        None => vec!["refs/remotes/origin/HEAD".to_string(), "HEAD".to_string()],
        Some(r) => vec![
            format!("refs/remotes/origin/{r}"),
            format!("refs/tags/{r}"),
            r.clone(),
        ],
    };
    // A commit id, so that nothing in the name can be taken for a path.
    let start = candidates
        .iter()
        .find_map(|c| crate::snapshot::rev_parse(&git, &format!("{c}^{{commit}}")).ok())
        .ok_or_else(|| RemoteError::NoReference {
            url: spec.url.clone(),
            reference: spec.reference.clone().unwrap_or_else(|| "HEAD".into()),
        })?;
    git.run(["checkout", "--quiet", "-b", branch, &start])?;
    let default_branch = git
        .run([
            "symbolic-ref",
            "--quiet",
            "--short",
            "refs/remotes/origin/HEAD",
        ])
        .map(|o| {
            String::from_utf8_lossy(&o)
                .trim()
                .trim_start_matches("origin/")
                .to_string()
        })
        .unwrap_or_else(|_| "main".into());
    let base_branch = match &spec.reference {
        Some(r)
            if crate::snapshot::rev_parse(&git, &format!("refs/remotes/origin/{r}")).is_ok() =>
        {
            r.clone()
        }
        _ => default_branch,
    };
    let base = crate::snapshot::rev_parse(&git, "HEAD")?;
    Ok(Cloned {
        url: spec.url.clone(),
        branch: branch.to_string(),
        base,
        base_branch,
    })
}
