//! A session's repository, as every front end hands it to the agent: the
//! host-side git tools over the clone, and the record the session log
//! keeps of it.

use std::sync::Arc;

use cordon_tools::Tool;
use serde::{Deserialize, Serialize};

use crate::access::HostCredentials;
use crate::commit::GitCommitTool;
use crate::forge::{CreatePullRequestTool, Forge};
use crate::push::GitPushTool;
use crate::remote::Cloned;
use crate::snapshot::Ident;

/// A clone a session works on, and what its tools may do with it.
#[derive(Debug, Clone)]
pub struct SessionRepository {
    pub cloned: Cloned,
    /// How pushes reach the remote.
    pub creds: HostCredentials,
    /// Where pull requests are opened, or why they cannot be (no token).
    pub forge: Result<Forge, String>,
    /// Who commits.
    pub author: Ident,
    /// Pushing and opening pull requests were allowed (or an approver
    /// asks before each).
    pub allow_push: bool,
}

/// The session log's record of the clone (its `repository` record, as
/// the agent's log names it): where pushes go is read from here, never
/// from the repository's configuration, which the workspace holds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RepositoryRecord {
    pub url: String,
    pub branch: String,
    pub base: String,
    pub base_branch: String,
    /// Pushing and pull requests were allowed when the session began
    /// (what the server's sessions take up again when they wake).
    #[serde(default)]
    pub allow_push: bool,
}

impl RepositoryRecord {
    /// The clone it records.
    pub fn cloned(&self) -> Cloned {
        Cloned {
            url: self.url.clone(),
            branch: self.branch.clone(),
            base: self.base.clone(),
            base_branch: self.base_branch.clone(),
        }
    }
}

impl SessionRepository {
    /// `git_commit` always; `git_push` and `create_pull_request`, which
    /// refuse unless allowed.
    pub fn tools(&self) -> Vec<Arc<dyn Tool>> {
        let c = &self.cloned;
        vec![
            GitCommitTool::tool(&c.branch, self.author.clone()),
            GitPushTool::tool(&c.url, &c.branch, self.allow_push, self.creds.clone()),
            CreatePullRequestTool::tool(
                self.forge.clone(),
                &c.branch,
                &c.base_branch,
                self.allow_push,
            ),
        ]
    }

    pub fn record(&self) -> RepositoryRecord {
        RepositoryRecord {
            url: self.cloned.url.clone(),
            branch: self.cloned.branch.clone(),
            base: self.cloned.base.clone(),
            base_branch: self.cloned.base_branch.clone(),
            allow_push: self.allow_push,
        }
    }
}
