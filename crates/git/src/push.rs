//! `git_push`: the session's branch pushed by cordon, on the host, with
//! the host's credentials, to the URL the session was cloned from (as the
//! session log records it, never as the workspace's `.git/config` says).
//! Only that branch, never forced; the user allows pushing (`--allow-push`,
//! or an approval asked for each call).

use std::path::Path;
use std::str::FromStr;
use std::sync::Arc;

use cordon_tools::{Tool, ToolContext, ToolFuture, ToolOutput, TypedTool};
use serde_json::{Value, json};

use crate::access::HostCredentials;
use crate::command::GitError;
use crate::remote::{RemoteError, RepoSpec};
use crate::repo::{RepoError, checked_repository};
use crate::snapshot::rev_parse;

/// What went wrong pushing.
#[derive(Debug, thiserror::Error)]
pub enum PushError {
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Remote(#[from] RemoteError),
    #[error("cannot push {branch} to {url}: {source}")]
    Push {
        branch: String,
        url: String,
        source: GitError,
    },
    #[error(
        "the workspace's repository would send a push to {url} to {to} instead; cordon pushes only to the repository the session was cloned from: remove the setting that renames it from .git/config and try again"
    )]
    Redirected { url: String, to: String },
    #[error(transparent)]
    Git(#[from] GitError),
}

/// Pushes `branch` of the repository in `workspace` to the branch of the
/// same name at `url`, with `creds`; returns the commit pushed.
pub fn push(
    workspace: &Path,
    url: &str,
    branch: &str,
    creds: &HostCredentials,
) -> Result<String, PushError> {
    let spec = RepoSpec::from_str(url)?;
    let git = checked_repository(workspace)?;
    // The check refuses every setting that renames or rewrites a URL; git
    // itself must agree that `url` means `url` before it pushes there.
    let resolved = git.run(["ls-remote", "--get-url", url])?;
    let resolved = String::from_utf8_lossy(&resolved);
    if resolved.trim_end_matches('\n') != url {
        return Err(PushError::Redirected {
            url: url.to_string(),
            to: cordon_tools::printable(resolved.trim_end()),
        });
    }
    let commit = rev_parse(&git, &format!("refs/heads/{branch}"))?;
    let refspec = format!("refs/heads/{branch}:refs/heads/{branch}");
    creds
        .apply(git.allow_protocol(spec.protocol()))
        .run(["push", "--quiet", "--porcelain", "--", url, &refspec])
        .map_err(|source| PushError::Push {
            branch: branch.to_string(),
            url: url.to_string(),
            source,
        })?;
    Ok(commit)
}

/// The model's `git_push` tool: this session's branch to its repository.
pub struct GitPushTool {
    url: String,
    branch: String,
    /// The user allowed pushing for this session (or is asked each time).
    allowed: bool,
    creds: HostCredentials,
}

impl GitPushTool {
    pub fn tool(
        url: impl Into<String>,
        branch: impl Into<String>,
        allowed: bool,
        creds: HostCredentials,
    ) -> Arc<dyn Tool> {
        Arc::new(GitPushTool {
            url: url.into(),
            branch: branch.into(),
            allowed,
            creds,
        })
    }
}

impl TypedTool for GitPushTool {
    const NAME: &'static str = "git_push";
    const READ_ONLY: bool = false;
    /// None are taken: any given is answered with which branch it pushes.
    type Input = serde_json::Map<String, Value>;

    fn description(&self) -> &str {
        "Push this session's branch, as committed with git_commit, to the repository the \
         session was cloned from, with the user's credentials. It takes no arguments: only the \
         session's own branch is pushed, never forced. The user must have allowed pushing."
    }

    fn input_schema(&self) -> Value {
        json!({"type": "object", "properties": {}, "additionalProperties": false})
    }

    fn label(&self, _input: &Self::Input) -> String {
        self.branch.clone()
    }

    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Self::Input) -> ToolFuture<'a> {
        Box::pin(async move {
            if !input.is_empty() {
                return ToolOutput::error(format!(
                    "git_push takes no arguments: it pushes this session's branch {} and no other",
                    self.branch
                ));
            }
            if !self.allowed {
                return ToolOutput::error(format!(
                    "pushing needs the user's approval, and this session was not given it: \
                     the commits stay on {} in the workspace; tell the user, who can push \
                     themselves or run cordon with --allow-push",
                    self.branch
                ));
            }
            let (ws, url, branch, creds) = (
                ctx.workspace.clone(),
                self.url.clone(),
                self.branch.clone(),
                self.creds.clone(),
            );
            match tokio::task::spawn_blocking(move || push(&ws, &url, &branch, &creds)).await {
                Ok(Ok(commit)) => ToolOutput::ok(format!(
                    "Pushed {} ({}) to {}.",
                    self.branch,
                    &commit[..12.min(commit.len())],
                    self.url
                ))
                .with_structured(json!({"branch": self.branch, "commit": commit, "url": self.url})),
                Ok(Err(e)) => ToolOutput::error(e.to_string()),
                Err(e) => ToolOutput::error(format!("git_push failed: {e}")),
            }
        })
    }
}
