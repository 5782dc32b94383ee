//! Git on the host, against a workspace the sandbox wrote.
//!
//! - [`Checkpoints`]: a session's workspace after each turn, in a
//!   repository of cordon's own, restored on a rewind.
//! - [`clone_into`]: a session's repository, cloned on the host with the
//!   host's credentials (or a tenant's login, [`HostCredentials::remote`]),
//!   which the sandbox never sees; [`SessionRepository`] its tools.
//! - [`commit`] and [`GitCommitTool`]: the model's changes committed to
//!   the session's branch by cordon on the host.
//! - [`checked_repository`]: the workspace's own `.git`, refused when it
//!   names programs to run or places to read.
//! - [`Git`]: how git is run at all, with nothing from the user's or the
//!   system's configuration, and every setting that names a program
//!   overridden.
//!
//! The workspace's files are read and written by cordon itself, beneath
//! the workspace root and never through a link; git only ever sees a
//! repository cordon owns, fed through `fast-import` and read through
//! `cat-file`.

mod access;
mod checkpoint;
mod command;
mod commit;
mod forge;
mod limits;
mod push;
mod remote;
mod repo;
mod restore;
mod retention;
mod session;
mod snapshot;

pub use access::{Endpoint, HostCredentials, Login};
pub use checkpoint::{Checkpoint, CheckpointError, Checkpoints, Rewound};
pub use command::{Git, GitError};
pub use commit::{CommitError, Committed, GitCommitTool, commit, host_ident};
pub use forge::{CreatePullRequestTool, Forge, ForgeKind, PullRequest};
pub use limits::{Exceeded, Limits};
pub use push::{GitPushTool, PushError, push};
pub use remote::{
    Cloned, Existing, RemoteError, RepoSpec, clone_into, clone_within, is_clone_of, reopen,
};
pub use repo::{RepoError, checked_repository};
pub use restore::{Kept, RestoreError, Restored};
pub use retention::{PruneReason, Retention, RetentionError};
pub use session::{RepositoryRecord, SessionRepository};
pub use snapshot::{Ident, Rules, Skip, Skipped, SnapshotError};

/// The modules from the bottom up: each may use only those before it
/// (checked by `layout.rs`).
pub const LAYERS: &[&str] = &[
    "command",
    "access",
    "limits",
    "repo",
    "retention",
    "snapshot",
    "commit",
    "forge",
    "remote",
    "restore",
    "checkpoint",
    "push",
    "session",
];

#[cfg(test)]
mod layout;
