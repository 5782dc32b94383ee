//! A session's repository, cloned on the host with the host's own git
//! credentials (the credential helpers the user's configuration names,
//! and the SSH agent), none of which the sandbox ever sees: the clone
//! happens before the sandbox starts, the remote URL kept in `.git/config`
//! carries no secret (one that would is refused), and the helpers are
//! passed to that one git command, never written anywhere.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::access::{Endpoint, HostCredentials};
use crate::command::{Git, GitError};
use crate::limits::{Exceeded, Limits, disk_use};

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
    #[error("cannot clone {url}: {source}")]
    Limit { url: String, source: Exceeded },
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

impl fmt::Display for RepoSpec {
    /// `URL[#REF]`, as it was parsed from.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.reference {
            Some(r) => write!(f, "{}#{r}", self.url),
            None => f.write_str(&self.url),
        }
    }
}

impl RepoSpec {
    /// Where an `https://` or `http://` URL points; `None` for another
    /// transport.
    pub fn endpoint(&self) -> Option<Endpoint> {
        Endpoint::of_url(&self.url)
    }

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

/// What [`clone_into`] made.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
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

/// What [`clone_into`] does with files already in the workspace.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Existing {
    /// The workspace must be empty (or absent).
    Refuse,
    /// Files already there stay as they are (they show as changes to the
    /// repository's): a job's files uploaded before it ran.
    Keep,
}

/// Clones `spec` into `workspace` on the host, with `creds`, and checks
/// out a new branch `branch` at its reference (the remote's default branch
/// when it names none). `existing` says whether the workspace may hold
/// files already.
///
/// git clones into an empty directory made in the workspace; its `.git`
/// is then moved to the workspace's top and the files checked out there,
/// all but those already present.
pub fn clone_into(
    spec: &RepoSpec,
    workspace: &Path,
    branch: &str,
    creds: &HostCredentials,
    existing: Existing,
) -> Result<Cloned, RemoteError> {
    clone_within(spec, workspace, branch, creds, existing, &Limits::none())
}

/// As [`clone_into`], within `limits`: the clone is stopped when it runs
/// past them, and its files are not checked out when they would.
pub fn clone_within(
    spec: &RepoSpec,
    workspace: &Path,
    branch: &str,
    creds: &HostCredentials,
    existing: Existing,
    limits: &Limits,
) -> Result<Cloned, RemoteError> {
    let io = |what: String| move |source| RemoteError::Io { what, source };
    match std::fs::read_dir(workspace) {
        Ok(mut d) => {
            if existing == Existing::Refuse && d.next().is_some() {
                return Err(RemoteError::NotEmpty(workspace.to_path_buf()));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(workspace).map_err(io(workspace.display().to_string()))?
        }
        Err(e) => return Err(io(workspace.display().to_string())(e)),
    }
    let dot_git = workspace.join(".git");
    if std::fs::symlink_metadata(&dot_git).is_ok() {
        return Err(RemoteError::Spec(format!(
            "{} already holds a .git: cordon clones only where there is no repository",
            cordon_tools::printable(&workspace.display().to_string())
        )));
    }
    // Present files, read before the clone is made: none of them is
    // overwritten.
    let present = match existing {
        Existing::Refuse => BTreeSet::new(),
        Existing::Keep => present_files(workspace)?,
    };
    // Within the workspace, so that its `.git` moves by a rename: the
    // workspace may be a file system of its own (a server's volume).
    let scratch = tempfile::Builder::new()
        .prefix(".cordon-clone-")
        .tempdir_in(workspace)
        .map_err(io(format!(
            "a directory to clone in, in {}",
            workspace.display()
        )))?;
    let target = scratch.path().join("repo");
    let protocol = spec.protocol();
    let outside = creds.apply(Git::outside(scratch.path()).allow_protocol(protocol));
    let over = |source: Exceeded| match source {
        Exceeded::Git(source) => RemoteError::Clone {
            url: spec.url.clone(),
            source,
        },
        source => RemoteError::Limit {
            url: spec.url.clone(),
            source,
        },
    };
    limits
        .run(
            &outside,
            &[
                std::ffi::OsStr::new("clone"),
                std::ffi::OsStr::new("--quiet"),
                std::ffi::OsStr::new("--no-checkout"),
                std::ffi::OsStr::new("--origin"),
                std::ffi::OsStr::new("origin"),
                std::ffi::OsStr::new("--"),
                std::ffi::OsStr::new(&spec.url),
                target.as_os_str(),
            ],
            scratch.path(),
        )
        .map_err(over)?;
    // The start and the budget are settled on the clone where it was
    // made: a clone refused leaves nothing in the workspace.
    let made_git = target.join(".git");
    let made = Git::new(&made_git);
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
        .find_map(|c| crate::snapshot::rev_parse(&made, &format!("{c}^{{commit}}")).ok())
        .ok_or_else(|| RemoteError::NoReference {
            url: spec.url.clone(),
            reference: spec.reference.clone().unwrap_or_else(|| "HEAD".into()),
        })?;
    if limits.max_bytes.is_some() {
        // The files it would check out, on top of what the clone holds.
        limits
            .admit(disk_use(&made_git), tree_bytes(&made, &start)?)
            .map_err(over)?;
    }
    std::fs::rename(&made_git, &dot_git)
        .map_err(io(format!("moving the clone into {}", workspace.display())))?;
    drop(scratch);
    let git = Git::new(&dot_git).work_tree(workspace);
    let head = format!("refs/heads/{branch}");
    // The branch made (never moved: it must not exist yet), HEAD on it,
    // the index at its tree; then the files, all but the present ones.
    git.run(["update-ref", &head, &start, ""])?;
    git.run(["symbolic-ref", "HEAD", &head])?;
    git.run(["read-tree", &start])?;
    let listed = git.run(["ls-files", "-z"])?;
    let mut wanted = Vec::with_capacity(listed.len());
    for path in listed.split(|b| *b == 0).filter(|p| !p.is_empty()) {
        if !covered(&present, path) {
            wanted.extend_from_slice(path);
            wanted.push(0);
        }
    }
    git.run_with(["checkout-index", "-u", "-z", "--stdin"], Some(&wanted))?;
    Ok(Cloned {
        url: spec.url.clone(),
        branch: branch.to_string(),
        base: start,
        base_branch: base_branch(&git, spec),
    })
}

/// The remote's branch a pull request goes into: `#REF` when it names one
/// of its branches, else the remote's default branch.
fn base_branch(git: &Git, spec: &RepoSpec) -> String {
    if let Some(r) = &spec.reference
        && crate::snapshot::rev_parse(git, &format!("refs/remotes/origin/{r}")).is_ok()
    {
        return r.clone();
    }
    git.run([
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
    .unwrap_or_else(|_| "main".into())
}

/// The clone [`clone_into`] made of `spec` in `workspace` earlier (a job
/// run again after its worker was lost), on `branch`, checked as the
/// sandbox may have left it; `base` is where the branch is now.
pub fn reopen(spec: &RepoSpec, workspace: &Path, branch: &str) -> Result<Cloned, RemoteError> {
    if !is_clone_of(workspace, &spec.url) {
        return Err(RemoteError::Spec(format!(
            "{} holds a .git that is not a clone of {}",
            cordon_tools::printable(&workspace.display().to_string()),
            spec.url
        )));
    }
    let git =
        crate::repo::checked_repository(workspace).map_err(|e| RemoteError::Spec(e.to_string()))?;
    let base = crate::snapshot::rev_parse(&git, &format!("refs/heads/{branch}^{{commit}}"))?;
    Ok(Cloned {
        url: spec.url.clone(),
        branch: branch.to_string(),
        base,
        base_branch: base_branch(&git, spec),
    })
}

/// The bytes of the files of `commit`'s tree.
fn tree_bytes(git: &Git, commit: &str) -> Result<u64, GitError> {
    let out = git.run(["ls-tree", "-r", "-l", "-z", commit])?;
    Ok(out
        .split(|b| *b == 0)
        .filter_map(|entry| {
            // `MODE TYPE OBJECT SIZE\tPATH`; SIZE is `-` for a submodule.
            let meta = entry.split(|b| *b == b'\t').next()?;
            let size = std::str::from_utf8(meta).ok()?.split_whitespace().nth(3)?;
            size.parse::<u64>().ok()
        })
        .sum())
}

/// Whether `dir` holds a repository (a `.git` directory, not a link or a
/// file) whose `origin` is `url`, give or take a trailing `/` or `.git`.
pub fn is_clone_of(dir: &Path, url: &str) -> bool {
    let dot_git = dir.join(".git");
    if !std::fs::symlink_metadata(&dot_git).is_ok_and(|m| m.is_dir()) {
        return false;
    }
    let same = |a: &str| {
        let norm = |u: &str| {
            let u = u.trim().trim_end_matches('/');
            u.strip_suffix(".git").unwrap_or(u).to_string()
        };
        norm(a) == norm(url)
    };
    Git::new(&dot_git)
        .run(["config", "--get-all", "remote.origin.url"])
        .map(|out| String::from_utf8_lossy(&out).lines().any(same))
        .unwrap_or(false)
}

/// Every path in `workspace` that is not a directory, read beneath it
/// without following a link.
fn present_files(workspace: &Path) -> Result<BTreeSet<Vec<u8>>, RemoteError> {
    use std::os::unix::ffi::OsStrExt;
    let bad = |e: String| RemoteError::Io {
        what: workspace.display().to_string(),
        source: std::io::Error::other(e),
    };
    let ws = cordon_tools::Workspace::open(workspace).map_err(|e| bad(e.to_string()))?;
    let root = cordon_tools::WsPath::parse(".").expect("the root parses");
    let mut walk = cordon_tools::walk::Walk::beneath(&ws, &root).map_err(|e| bad(e.to_string()))?;
    walk.every_entry();
    let mut present = BTreeSet::new();
    walk.run(|e| {
        if e.kind != cordon_tools::walk::Kind::Dir {
            present.insert(e.rel.as_os_str().as_bytes().to_vec());
        }
        std::ops::ControlFlow::Continue(())
    });
    Ok(present)
}

/// Whether `path` (of the repository) is a present file, or beneath one.
fn covered(present: &BTreeSet<Vec<u8>>, path: &[u8]) -> bool {
    if present.contains(path) {
        return true;
    }
    path.iter()
        .enumerate()
        .filter(|(_, b)| **b == b'/')
        .any(|(i, _)| present.contains(&path[..i]))
}
