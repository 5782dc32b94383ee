//! `--repo URL[#REF]`: the session works on a clone cordon makes on the
//! host before the sandbox starts, with the host's git credentials, on a
//! branch of its own (`cordon/<session>`).

use std::path::{Path, PathBuf};

use cordon_git::{Cloned, HostCredentials, RepoSpec};

/// clap's parser for `--repo`.
pub fn parse_repo(s: &str) -> Result<RepoSpec, String> {
    s.parse()
        .map_err(|e: cordon_git::RemoteError| e.to_string())
}

/// The directory `git clone URL` would make: the URL's last component
/// without `.git`.
fn default_dir(url: &str) -> Option<PathBuf> {
    let name = url
        .trim_end_matches('/')
        .rsplit(['/', ':'])
        .next()?
        .trim_end_matches(".git");
    let ok = !name.is_empty()
        && name != "."
        && name != ".."
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "._-".contains(c));
    ok.then(|| PathBuf::from(name))
}

/// Clones `spec` for session `id` into `workspace`, or a directory named
/// after the repository in the current one; returns where. When that
/// directory (or the current one) is already a clone of `spec`, the user's
/// own checkout is left as it is and the session gets a fresh clone of its
/// own, under cordon's data directory.
pub(crate) async fn clone_for(
    spec: &RepoSpec,
    workspace: Option<&Path>,
    id: &str,
) -> Result<(PathBuf, Cloned), String> {
    let name = default_dir(&spec.url);
    let (dir, also) = match workspace {
        Some(w) => (w.to_path_buf(), None),
        None => {
            let name = name.clone().ok_or_else(|| {
                format!(
                    "cannot name a directory after {}: give one with --workspace",
                    spec.url
                )
            })?;
            let cwd = std::env::current_dir().map_err(|e| format!("current directory: {e}"))?;
            (cwd.join(name), Some(cwd))
        }
    };
    let theirs = [Some(dir.clone()), also]
        .into_iter()
        .flatten()
        .find(|d| cordon_git::is_clone_of(d, &spec.url));
    let dir = match &theirs {
        None => dir,
        Some(d) => {
            let fresh = fresh_clone_dir(id, name.as_deref().unwrap_or(Path::new("repository")));
            eprintln!(
                "cordon: {} is already a clone of {}: it stays as it is, and this session works in a fresh clone at {}",
                cordon_tools::printable(&d.display().to_string()),
                spec.url,
                cordon_tools::printable(&fresh.display().to_string()),
            );
            fresh
        }
    };
    let (spec, branch, at) = (spec.clone(), format!("cordon/{id}"), dir.clone());
    let cloned = tokio::task::spawn_blocking(move || {
        cordon_git::clone_into(
            &spec,
            &at,
            &branch,
            &HostCredentials::from_host(),
            cordon_git::Existing::Refuse,
        )
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    Ok((dir, cloned))
}

/// The repository a session works on.
pub(crate) struct SessionClone {
    pub cloned: Cloned,
    /// Where it was cloned just now, for a new session; `None` for a
    /// resumed session's, which is its workspace.
    pub made: Option<PathBuf>,
}

/// The repository of a session: cloned now for `--repo` (a new session,
/// whose id `new_id` names its branch), or the one a resumed session's log
/// records, which `--repo` may name again but not change. A resumed
/// session gets its git tools back from there.
pub(crate) async fn for_session(
    repo: Option<&str>,
    resumed: Option<&cordon_agent::sessions::Resumed>,
    workspace: Option<&Path>,
    new_id: &str,
) -> Result<Option<SessionClone>, String> {
    let spec = repo
        .map(|r| parse_repo(r).map_err(|e| format!("--repo: {e}")))
        .transpose()?;
    let Some(resumed) = resumed else {
        let Some(spec) = spec else { return Ok(None) };
        let (dir, cloned) = clone_for(&spec, workspace, new_id).await?;
        return Ok(Some(SessionClone {
            cloned,
            made: Some(dir),
        }));
    };
    let id = &resumed.summary.id;
    match (recorded(&resumed.summary.path), spec) {
        (None, None) => Ok(None),
        (None, Some(spec)) => Err(format!(
            "session {id} works on no repository, and --repo {} starts a new one: leave out --resume/--last",
            spec.url
        )),
        (Some(rec), Some(spec)) if rec.url != spec.url => Err(format!(
            "session {id} works on {}, not {}: resume it without --repo, or start a new session",
            rec.url, spec.url
        )),
        (Some(rec), _) => Ok(Some(SessionClone {
            cloned: rec.cloned(),
            made: None,
        })),
    }
}

/// The repository a session's log records, if any.
fn recorded(log: &Path) -> Option<cordon_git::RepositoryRecord> {
    let (records, _) = cordon_agent::log::load::<cordon_agent::SessionRecord>(log).ok()?;
    records.iter().find_map(|r| r.data.repository()).cloned()
}

/// Where session `id` gets a clone of its own: beside its log, in cordon's
/// data directory.
fn fresh_clone_dir(id: &str, name: &Path) -> PathBuf {
    let sessions = cordon_agent::sessions::sessions_dir();
    sessions
        .parent()
        .unwrap_or(&sessions)
        .join("clones")
        .join(id)
        .join(name)
}

/// The repository of a session on `c`, for its tools: commit always;
/// push and pull requests when `allowed` (the user said so, or is asked
/// each time), with the host user's credentials and forge token.
pub(crate) fn session(
    c: &Cloned,
    allowed: bool,
    forge_api: Option<&str>,
) -> cordon_git::SessionRepository {
    let forge = forge_token()
        .ok_or_else(|| {
            "no forge token on the host (CORDON_FORGE_TOKEN, or GITHUB_TOKEN for github.com)"
                .to_string()
        })
        .and_then(|token| cordon_git::Forge::for_repository(&c.url, forge_api, None, token));
    if let Err(e) = &forge
        && forge_token().is_some()
    {
        eprintln!("cordon: {e}");
    }
    cordon_git::SessionRepository {
        cloned: c.clone(),
        creds: HostCredentials::from_host(),
        forge,
        author: cordon_git::host_ident(),
        allow_push: allowed,
    }
}

/// The user's forge token, from the host's environment (never the
/// sandbox's, which is built from nothing).
fn forge_token() -> Option<String> {
    ["CORDON_FORGE_TOKEN", "GITHUB_TOKEN", "GH_TOKEN"]
        .iter()
        .find_map(|k| std::env::var(k).ok().filter(|v| !v.trim().is_empty()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_directory_is_gits() {
        for (url, dir) in [
            ("https://github.com/o/proj.git", Some("proj")),
            ("git@github.com:o/proj.git", Some("proj")),
            ("https://example.com/o/proj/", Some("proj")),
            ("/srv/repos/x.git", Some("x")),
            ("https://example.com/..", None),
        ] {
            assert_eq!(default_dir(url), dir.map(PathBuf::from), "{url}");
        }
    }
}
