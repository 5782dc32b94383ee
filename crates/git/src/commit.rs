//! `git_commit`: the workspace's changes committed by cordon, on the host,
//! to the session's branch of the workspace's repository.
//!
//! The sandbox cannot commit (`.git` is read-only there); the model asks
//! cordon to. The repository is checked first ([`checked_repository`]);
//! the files are read by cordon's own walk (beneath the workspace, never
//! through a link: a link is committed as a link) and handed to
//! `fast-import`, so git reads nothing of the work tree; the branch moves
//! by a compare-and-swap `update-ref` from the commit the snapshot started
//! at; hooks never run. What is committed: what `git add -A` would take
//! (tracked files that `.gitignore` now leaves out included), less files
//! over 100 MiB (the forges' limit), which are named.

use std::path::Path;
use std::sync::Arc;

use cordon_tools::{Tool, ToolContext, ToolFuture, ToolOutput, TypedTool};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::command::GitError;
use crate::repo::{RepoError, checked_repository};
use crate::snapshot::{self, Ident, Rules, SCRATCH, Skipped, SnapshotError, rev_parse};

/// Largest message taken.
const MAX_MESSAGE: usize = 16 << 10;

/// What went wrong committing.
#[derive(Debug, thiserror::Error)]
pub enum CommitError {
    #[error(transparent)]
    Repo(#[from] RepoError),
    #[error(transparent)]
    Git(#[from] GitError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(
        "the repository is on {now}, not on this session's branch {branch}; cordon commits only to {branch}"
    )]
    OtherBranch { now: String, branch: String },
    #[error(
        "the workspace could not be read whole (a directory changed while cordon read it, or it is very large); nothing was committed: try again"
    )]
    Incomplete,
    #[error("{0}")]
    Message(&'static str),
}

/// A commit made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Committed {
    pub commit: String,
    /// `git diff --name-status` of it, made printable.
    pub changes: Vec<String>,
    pub skipped: Vec<Skipped>,
}

/// Commits the files of `workspace` to `branch` (which its repository
/// must be on) with `message` by `author`; `None` when nothing changed.
pub fn commit(
    workspace: &Path,
    branch: &str,
    message: &str,
    author: &Ident,
) -> Result<Option<Committed>, CommitError> {
    let message = message.trim();
    if message.is_empty() {
        return Err(CommitError::Message(
            "the commit message is empty: say what changed and why",
        ));
    }
    if message.len() > MAX_MESSAGE || message.contains('\0') {
        return Err(CommitError::Message(
            "the commit message is over 16 KiB or holds a NUL byte: write a shorter one",
        ));
    }
    let git = checked_repository(workspace)?;
    let head = String::from_utf8_lossy(&git.run(["symbolic-ref", "-q", "HEAD"])?)
        .trim()
        .to_string();
    if head != format!("refs/heads/{branch}") {
        return Err(CommitError::OtherBranch {
            now: cordon_tools::printable(head.trim_start_matches("refs/heads/")),
            branch: branch.to_string(),
        });
    }
    let parent = rev_parse(&git, "HEAD")?;
    let tracked: Vec<Vec<u8>> = git
        .run(["ls-tree", "-r", "-z", "--name-only", "--full-tree", &parent])?
        .split(|b| *b == 0)
        .filter(|p| !p.is_empty())
        .map(<[u8]>::to_vec)
        .collect();
    let snap = snapshot::snapshot(
        &git,
        workspace,
        &snapshot::Options {
            parent: Some(&parent),
            target: SCRATCH,
            message,
            rules: Rules {
                max_file_bytes: 100 << 20,
                ..Rules::default()
            },
            cache: None,
            checkpoint: false,
            author: author.clone(),
            tracked: &tracked,
        },
    )?;
    let _ = git.run(["update-ref", "-d", SCRATCH]);
    if snap.incomplete {
        return Err(CommitError::Incomplete);
    }
    if !snap.changed {
        return Ok(None);
    }
    // From the commit the snapshot started at only: a branch moved since
    // is not overwritten.
    git.run([
        "update-ref",
        "-m",
        "cordon: git_commit",
        &format!("refs/heads/{branch}"),
        &snap.commit,
        &parent,
    ])?;
    // The index as the commit has it, so that `git status` in the sandbox
    // shows a clean tree; the work tree is not touched.
    git.run(["read-tree", &snap.commit])?;
    let changes = git
        .run(["diff", "--name-status", "-z", &parent, &snap.commit])
        .map(|out| name_status(&out))
        .unwrap_or_default();
    Ok(Some(Committed {
        commit: snap.commit,
        changes,
        skipped: snap.skipped,
    }))
}

/// `--name-status -z` output as `M path` lines, printable.
fn name_status(out: &[u8]) -> Vec<String> {
    let mut fields = out.split(|b| *b == 0).filter(|f| !f.is_empty());
    let mut lines = Vec::new();
    while let Some(status) = fields.next() {
        let status = String::from_utf8_lossy(status);
        // Renames and copies carry two paths; cordon's diffs have none.
        let Some(path) = fields.next() else { break };
        lines.push(format!(
            "{} {}",
            status,
            cordon_tools::printable(&String::from_utf8_lossy(path))
        ));
    }
    lines
}

/// The host user's git identity (`user.name`, `user.email` from their own
/// configuration, read from no repository), or cordon's.
pub fn host_ident() -> Ident {
    let get = |key: &str| {
        let out = std::process::Command::new("git")
            .args(["config", "--get", key])
            .current_dir("/")
            .env("GIT_CEILING_DIRECTORIES", "/")
            .env_remove("GIT_DIR")
            .env_remove("GIT_CONFIG")
            .env_remove("GIT_CONFIG_PARAMETERS")
            .env_remove("GIT_CONFIG_COUNT")
            .output()
            .ok()?;
        let v = String::from_utf8_lossy(&out.stdout).trim().to_string();
        (out.status.success() && !v.is_empty()).then_some(v)
    };
    let fallback = Ident::cordon();
    Ident {
        name: get("user.name").unwrap_or(fallback.name),
        email: get("user.email").unwrap_or(fallback.email),
    }
}

/// The model's `git_commit` tool, for a session working on `branch`.
pub struct GitCommitTool {
    branch: String,
    author: Ident,
}

impl GitCommitTool {
    pub fn tool(branch: impl Into<String>, author: Ident) -> Arc<dyn Tool> {
        Arc::new(GitCommitTool {
            branch: branch.into(),
            author,
        })
    }
}

/// `git_commit`'s arguments.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CommitInput {
    message: String,
}

impl TypedTool for GitCommitTool {
    const NAME: &'static str = "git_commit";
    const READ_ONLY: bool = false;
    type Input = CommitInput;

    fn description(&self) -> &str {
        "Commit every change in /workspace to this session's git branch, with your message. \
         The sandbox cannot commit itself (its .git is read-only): review with `git status` and \
         `git diff` in bash, then call this. Files .gitignore leaves out are not committed, nor \
         files over 100 MiB. Commits go to the session's branch only."
    }

    fn input_schema(&self) -> Value {
        json!({
            "type": "object",
            "properties": {
                "message": {
                    "type": "string",
                    "description": "The commit message: a short subject line, a blank line, then why."
                }
            },
            "required": ["message"],
            "additionalProperties": false
        })
    }

    fn label(&self, input: &CommitInput) -> String {
        input.message.clone()
    }

    fn run<'a>(&'a self, ctx: &'a ToolContext, input: CommitInput) -> ToolFuture<'a> {
        Box::pin(async move {
            let (ws, branch, author, message) = (
                ctx.workspace.clone(),
                self.branch.clone(),
                self.author.clone(),
                input.message,
            );
            let done =
                tokio::task::spawn_blocking(move || commit(&ws, &branch, &message, &author)).await;
            match done {
                Ok(Ok(Some(c))) => {
                    let mut text = format!(
                        "Committed {} on {}:\n{}",
                        &c.commit[..12.min(c.commit.len())],
                        self.branch,
                        c.changes.join("\n")
                    );
                    for s in &c.skipped {
                        text.push_str(&format!("\nnot committed: {} ({:?})", s.path, s.skip));
                    }
                    ToolOutput::ok(text).with_structured(json!({
                        "commit": c.commit,
                        "branch": self.branch,
                        "changes": c.changes,
                    }))
                }
                Ok(Ok(None)) => {
                    ToolOutput::ok("Nothing to commit: the files are as the last commit has them.")
                }
                Ok(Err(e)) => ToolOutput::error(e.to_string()),
                Err(e) => ToolOutput::error(format!("git_commit failed: {e}")),
            }
        })
    }
}
