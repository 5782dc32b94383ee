//! A session's checkpoints, bound to its log: the workspace's files at the
//! start and after every turn, restored together with the conversation.
//!
//! The files go to a [`Checkpoints`] store beside the log
//! (`<id>.checkpoints/`, cordon's own repository, never the user's
//! `.git`); the log gets a `checkpoint` record naming each. A rewind to
//! the end of turn N restores that turn's files, and appends a `rewind`
//! record naming the log record the conversation goes back to; loading
//! the log ([`crate::sessions::timeline`]) then reads the conversation as
//! it was there. A fork starts a new session from turn N with a copy of
//! its files, and says so in both logs. Nothing in a log is rewritten.
//!
//! A store keeps what its [`Retention`] says (`checkpoints.keep`,
//! `checkpoints.max_size`): a rewind or fork to a turn whose checkpoint
//! was pruned says so, and how to keep more.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::log::{LogError, SessionLog};
use crate::record::SessionRecord;
use crate::sessions::{SessionStarted, timeline};
pub use cordon_git::Retention;
use cordon_git::{CheckpointError, Checkpoints};

pub use crate::record::{Fork, Rewind};

/// Where the checkpoints of the session logged at `log` are kept.
pub fn store_dir(log: &Path) -> PathBuf {
    log.with_extension("checkpoints")
}

/// What went wrong rewinding or forking.
#[derive(Debug, thiserror::Error)]
pub enum RewindError {
    #[error(transparent)]
    Log(#[from] LogError),
    #[error(transparent)]
    Checkpoint(CheckpointError),
    #[error(
        "{0}; to keep more, raise checkpoints.keep or checkpoints.max_size (CORDON_CHECKPOINTS_KEEP, CORDON_CHECKPOINTS_MAX_SIZE)"
    )]
    Pruned(CheckpointError),
    #[error(
        "turn {turn} has no checkpoint in this session (it has {turns} turn{s} now, counted since any rewind; `cordon rewind ID --undo` takes back the last rewind; sessions from before checkpoints, and turns cut short by a crash, have none)",
        s = if *turns == 1 { "" } else { "s" }
    )]
    NoCheckpoint { turn: u64, turns: u64 },
    #[error("the session log does not start with session_started")]
    NotASession,
    #[error("this session was never rewound: there is nothing to undo")]
    NothingToUndo,
    #[error("{0}")]
    Workspace(String),
}

impl From<CheckpointError> for RewindError {
    fn from(e: CheckpointError) -> RewindError {
        match e {
            e @ CheckpointError::Pruned { .. } => RewindError::Pruned(e),
            e => RewindError::Checkpoint(e),
        }
    }
}

/// The store of the session logged at `log`, keeping what `retention` says.
fn open_store(log: &Path, retention: Retention) -> Result<Checkpoints, CheckpointError> {
    Ok(Checkpoints::open(&store_dir(log))?.with_retention(retention))
}

/// A session's store, for the agent: records after each turn.
pub(crate) struct TurnCheckpoints {
    store: Arc<Checkpoints>,
    workspace: PathBuf,
}

impl TurnCheckpoints {
    /// The store beside `log`, made if needed; `None` (and a warning) when
    /// it cannot be (no git on the host): the session goes on without.
    pub(crate) fn open(
        log: &Path,
        workspace: &Path,
        retention: Retention,
    ) -> Option<TurnCheckpoints> {
        match open_store(log, retention) {
            Ok(store) => Some(TurnCheckpoints {
                store: Arc::new(store),
                workspace: workspace.to_path_buf(),
            }),
            Err(e) => {
                tracing::warn!("no checkpoints for this session: {e}");
                None
            }
        }
    }

    /// Records the files now, off the async threads.
    pub(crate) async fn record(&self, label: String) -> Option<SessionRecord> {
        let (store, ws) = (self.store.clone(), self.workspace.clone());
        match tokio::task::spawn_blocking(move || store.record(&ws, &label)).await {
            Ok(Ok(c)) => Some(SessionRecord::Checkpoint(c)),
            Ok(Err(e)) => {
                tracing::warn!("checkpoint: {e}");
                None
            }
            Err(e) => {
                tracing::warn!("checkpoint: {e}");
                None
            }
        }
    }
}

/// Takes the session logged at `log`, working in `workspace`, back to the
/// end of turn `to_turn`: its files, then its conversation (a `rewind`
/// record). No other cordon may be writing to that session meanwhile.
/// The store keeps what `retention` says, as the session's turns do.
pub fn rewind(
    log: &Path,
    workspace: &Path,
    to_turn: u64,
    retention: Retention,
) -> Result<Rewind, RewindError> {
    let (mut session, records, _) = SessionLog::<SessionRecord>::open(log)?;
    let t = timeline(&records);
    let target = t
        .checkpoints
        .iter()
        .rev()
        .find(|c| c.turn == to_turn)
        .ok_or(RewindError::NoCheckpoint {
            turn: to_turn,
            turns: t.turns,
        })?;
    let store = open_store(log, retention)?;
    let done = store.restore(workspace, &target.id)?;
    let rewind = Rewind {
        to_turn,
        to_seq: target.seq,
        checkpoint: target.id.clone(),
        before: done.before.id,
        written: done.restored.written,
        removed: done.restored.removed,
        kept: done.restored.kept,
    };
    session.append(&SessionRecord::Rewind(rewind.clone()))?;
    session.sync()?;
    Ok(rewind)
}

/// Undoes the session's last rewind (an undo too: undoing one redoes):
/// its files back from the checkpoint that rewind kept of them, and its
/// conversation as it was just before it, which sets aside any turn taken
/// since (itself undone by the next undo). A `rewind` record, as any.
pub fn undo(log: &Path, workspace: &Path, retention: Retention) -> Result<Rewind, RewindError> {
    let (mut session, records, _) = SessionLog::<SessionRecord>::open(log)?;
    let (i, last) = records
        .iter()
        .enumerate()
        .rev()
        .find_map(|(i, r)| match &r.data {
            SessionRecord::Rewind(rw) => Some((i, rw.clone())),
            _ => None,
        })
        .ok_or(RewindError::NothingToUndo)?;
    // The conversation just before that rewind: every record before it.
    let Some(previous) = i.checked_sub(1).map(|p| &records[p]) else {
        return Err(RewindError::NotASession);
    };
    let was = timeline(&records[..i]);
    let store = open_store(log, retention)?;
    let done = store.restore(workspace, &last.before)?;
    let undone = Rewind {
        to_turn: was.turns,
        to_seq: previous.seq,
        checkpoint: last.before.clone(),
        before: done.before.id,
        written: done.restored.written,
        removed: done.restored.removed,
        kept: done.restored.kept,
    };
    session.append(&SessionRecord::Rewind(undone.clone()))?;
    session.sync()?;
    Ok(undone)
}

/// What a fork made.
#[derive(Debug, Clone, PartialEq)]
pub struct Forked {
    pub session: String,
    pub log: PathBuf,
    pub workspace: PathBuf,
    pub turn: u64,
    /// Files written into the new workspace.
    pub files: usize,
}

/// Starts the session `new_id`, logged at `new_log`, from the end of turn
/// `turn` (the newest when `None`) of the session logged at `log`: the
/// conversation up to there, and the files of that turn's checkpoint
/// written into `new_workspace`, which must be empty or absent. Both
/// stores keep what `retention` says.
pub fn fork(
    log: &Path,
    turn: Option<u64>,
    new_id: &str,
    new_log: &Path,
    new_workspace: &Path,
    retention: Retention,
) -> Result<Forked, RewindError> {
    let (mut session, records, _) = SessionLog::<SessionRecord>::open(log)?;
    let started = records
        .first()
        .and_then(|r| r.data.started())
        .ok_or(RewindError::NotASession)?;
    let t = timeline(&records);
    let turn = turn.unwrap_or(t.turns);
    let target =
        t.checkpoints
            .iter()
            .rev()
            .find(|c| c.turn == turn)
            .ok_or(RewindError::NoCheckpoint {
                turn,
                turns: t.turns,
            })?;
    match std::fs::read_dir(new_workspace) {
        Ok(mut entries) => {
            if entries.next().is_some() {
                return Err(RewindError::Workspace(format!(
                    "{} is not empty: a fork's workspace gets the checkpoint's files and nothing else; name an empty or new directory",
                    new_workspace.display()
                )));
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(new_workspace).map_err(|e| {
                RewindError::Workspace(format!("cannot make {}: {e}", new_workspace.display()))
            })?;
        }
        Err(e) => {
            return Err(RewindError::Workspace(format!(
                "{}: {e}",
                new_workspace.display()
            )));
        }
    }
    let new_workspace = crate::sessions::same_dir(new_workspace);
    let store = open_store(log, retention)?;
    let restored = store.materialize(&target.id, &new_workspace)?;

    // The conversation as it was at that checkpoint.
    let upto: Vec<_> = records
        .iter()
        .take_while(|r| r.seq <= target.seq)
        .cloned()
        .collect();
    let history = timeline(&upto).history;
    let mut first = SessionStarted::new(
        new_id,
        &started.model,
        &started.provider,
        &new_workspace,
        &started.title,
        false,
    );
    first.forked_from = Some(crate::sessions::ForkedFrom {
        session: started.session_id.clone(),
        turn,
    });
    let mut forked = SessionLog::create(new_log)?;
    forked.append(&first.record())?;
    for message in history {
        forked.append(&SessionRecord::Message { message })?;
    }
    let own = open_store(new_log, retention)?;
    let first_checkpoint = own.record(&new_workspace, "forked")?;
    forked.append(&SessionRecord::Checkpoint(first_checkpoint))?;
    forked.sync()?;

    session.append(&SessionRecord::Fork(Fork {
        turn,
        session: new_id.to_string(),
        workspace: new_workspace.display().to_string(),
    }))?;
    session.sync()?;
    Ok(Forked {
        session: new_id.to_string(),
        log: new_log.to_path_buf(),
        workspace: new_workspace,
        turn,
        files: restored.written,
    })
}

#[cfg(test)]
mod fixture;
