//! A session's checkpoints: the workspace's files after each turn that
//! changed them, in a repository of cordon's own beside the session's log,
//! never in the workspace and never touching the user's `.git`.
//!
//! Checkpoints form one chain on `refs/cordon/checkpoints` in the order
//! they were taken; a restore first records the files as they are, so a
//! rewind is itself undone by restoring that checkpoint. The oldest are
//! dropped as the store's [`Retention`] says (see [`crate::retention`]);
//! the ids of those kept never change.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::command::{Git, GitError};
use crate::restore::{self, RestoreError, Restored};
use crate::retention::{self, PruneReason, Retention};
use crate::snapshot::{self, Meta, Rules, Skipped, SnapshotError, rev_parse};

/// The ref every checkpoint is reachable from.
const CHAIN: &str = "refs/cordon/checkpoints";
/// Packs a store may gather before dropping by count repacks it (each
/// record's fast-import writes one).
const MAX_PACKS: usize = 32;
/// The stat cache's file in the repository.
const CACHE: &str = "cordon-stat-cache.json";

/// A session's store of checkpoints.
#[derive(Debug)]
pub struct Checkpoints {
    git: Git,
    rules: Rules,
    retention: Retention,
}

/// One checkpoint, as the session log records it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// The commit holding the files: what a rewind names.
    pub id: String,
    /// Whether the files differ from the checkpoint before.
    pub changed: bool,
    pub files: usize,
    pub bytes: u64,
    /// Left out by the rules (too large, not a file, unreadable).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub skipped: Vec<Skipped>,
    /// Some files may be missing: the walk hit a limit or a directory
    /// changed under it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub incomplete: bool,
}

/// What a restore did, and the checkpoint of the files it replaced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Rewound {
    /// The files as they were just before: restoring it undoes the rewind.
    pub before: Checkpoint,
    #[serde(flatten)]
    pub restored: Restored,
}

/// What went wrong with checkpoints.
#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("checkpoints in {dir}: {source}")]
    Dir {
        dir: PathBuf,
        source: std::io::Error,
    },
    #[error(transparent)]
    Git(#[from] GitError),
    #[error(transparent)]
    Snapshot(#[from] SnapshotError),
    #[error(transparent)]
    Restore(#[from] RestoreError),
    #[error("{0:?} is not a checkpoint of this session")]
    Unknown(String),
    /// It was one, and the retention dropped it.
    #[error("checkpoint {id} was pruned: {why}")]
    Pruned { id: String, why: PruneReason },
}

impl Checkpoints {
    /// The store in `dir`, made (mode 0700) if it is not there.
    pub fn open(dir: &Path) -> Result<Checkpoints, CheckpointError> {
        let io = |source| CheckpointError::Dir {
            dir: dir.to_path_buf(),
            source,
        };
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(io)?;
        let git = Git::new(dir);
        if !dir.join("HEAD").exists() {
            // SHA-1 whatever git's default: snapshots compute blob ids.
            git.run(["init", "--quiet", "--bare", "--object-format=sha1"])?;
        }
        Ok(Checkpoints {
            git,
            rules: Rules::default(),
            retention: Retention::default(),
        })
    }

    /// Other bounds than [`Rules::default`].
    pub fn with_rules(mut self, rules: Rules) -> Checkpoints {
        self.rules = rules;
        self
    }

    /// Another retention than [`Retention::default`], applied from the
    /// next record on.
    pub fn with_retention(mut self, retention: Retention) -> Checkpoints {
        self.retention = retention;
        self
    }

    pub fn retention(&self) -> Retention {
        self.retention
    }

    /// The newest checkpoint's id, if there is one.
    pub fn latest(&self) -> Option<String> {
        // cordon's own repository, which nothing else writes: the chain's
        // loose ref is read as a file, sparing a git process every turn;
        // a packed one (after a `git gc`) through git.
        std::fs::read_to_string(self.git.git_dir().join(CHAIN))
            .ok()
            .map(|text| text.trim().to_string())
            .filter(|oid| oid.len() == 40 && oid.bytes().all(|b| b.is_ascii_hexdigit()))
            .or_else(|| rev_parse(&self.git, CHAIN).ok())
    }

    /// Records the files of `workspace` now. When they are the same as
    /// the newest checkpoint's, that one is returned with `changed: false`
    /// and nothing is added; one added is followed by dropping the oldest
    /// as the retention says.
    pub fn record(&self, workspace: &Path, label: &str) -> Result<Checkpoint, CheckpointError> {
        let _lock = self.lock()?;
        let parent = self.latest();
        let c = self.record_locked(workspace, label)?;
        if c.changed {
            self.retain_locked(parent.as_deref());
        }
        Ok(c)
    }

    fn record_locked(&self, workspace: &Path, label: &str) -> Result<Checkpoint, CheckpointError> {
        let parent = self.latest();
        // fast-import moves the chain itself.
        let snap = snapshot::snapshot(
            &self.git,
            workspace,
            &snapshot::Options {
                parent: parent.as_deref(),
                target: CHAIN,
                message: label,
                rules: self.rules,
                cache: Some(CACHE),
                checkpoint: true,
                author: snapshot::Ident::cordon(),
                tracked: &[],
            },
        )?;
        let id = match (snap.changed, parent) {
            (true, _) | (false, None) => snap.commit,
            (false, Some(p)) => {
                // A commit made without the cache's listing that turned
                // out to hold the same files: the chain goes back to where
                // it was (only if nothing moved it since).
                if snap.commit != p {
                    self.git.run(["update-ref", CHAIN, &p, &snap.commit])?;
                }
                p
            }
        };
        Ok(Checkpoint {
            id,
            changed: snap.changed,
            files: snap.files,
            bytes: snap.bytes,
            skipped: snap.skipped,
            incomplete: snap.incomplete,
        })
    }

    /// Makes the files of `workspace` those of checkpoint `id`, after
    /// recording them as they are.
    pub fn restore(&self, workspace: &Path, id: &str) -> Result<Rewound, CheckpointError> {
        let _lock = self.lock()?;
        let id = &self.known(id)?;
        let parent = self.latest();
        let before = self.record_locked(workspace, &format!("before restoring {id}"))?;
        let current = restore::files(&self.git, &before.id)?;
        let target = restore::files(&self.git, id)?;
        let meta = Meta::of(&self.git, id)?;
        let restored = restore::restore(&self.git, workspace, &current, &target, &meta)?;
        // Only now: the checkpoint restored may be the oldest.
        if before.changed {
            self.retain_locked(parent.as_deref());
        }
        Ok(Rewound { before, restored })
    }

    /// Writes the files of checkpoint `id` into `dir`, which must be empty
    /// (a fork's new workspace).
    pub fn materialize(&self, id: &str, dir: &Path) -> Result<Restored, CheckpointError> {
        let _lock = self.lock()?;
        let id = &self.known(id)?;
        let target = restore::files(&self.git, id)?;
        Ok(restore::restore(
            &self.git,
            dir,
            &restore::Files::new(),
            &target,
            &Meta::default(),
        )?)
    }

    /// The full id of `id`, a commit on this store's chain (up to its
    /// oldest kept checkpoint).
    fn known(&self, id: &str) -> Result<String, CheckpointError> {
        let shown = || cordon_tools::printable(id);
        if id.len() < 7 || id.len() > 64 || !id.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(CheckpointError::Unknown(shown()));
        }
        let on_chain = rev_parse(&self.git, &format!("{id}^{{commit}}")).and_then(|full| {
            self.git
                .run(["merge-base", "--is-ancestor", &full, CHAIN])
                .map(|_| full)
        });
        on_chain.map_err(|_| match retention::pruned(self.git.git_dir(), id) {
            Some(why) => CheckpointError::Pruned { id: shown(), why },
            None => CheckpointError::Unknown(shown()),
        })
    }

    /// Drops the oldest checkpoints until the retention holds. A failure
    /// is logged, not returned: the checkpoint just taken is in the store
    /// whatever becomes of the older ones. `parent`: the newest before
    /// the record that called this.
    fn retain_locked(&self, parent: Option<&str>) {
        if let Err(e) = self.retain(parent) {
            tracing::warn!("checkpoints: pruning {}: {e}", self.git.git_dir().display());
        }
    }

    fn retain(&self, parent: Option<&str>) -> Result<(), CheckpointError> {
        let dir = self.git.git_dir();
        let io = |source| CheckpointError::Dir {
            dir: dir.to_path_buf(),
            source,
        };
        let r = self.retention;
        let Some(tip) = self.latest() else {
            return Ok(());
        };
        // The count the record before left, plus this one; git counts
        // when there is none for the parent (an older store, a crash).
        let count = match (retention::counted(dir), parent) {
            (Some((at, n)), Some(p)) if at == p => n + 1,
            _ => retention::commits(&self.git, &tip)?.len(),
        };
        let size = cordon_sandbox::allocated(dir).map_err(io)?;
        if count <= r.keep() && size <= r.max_bytes() {
            return retention::count(dir, &tip, count).map_err(io);
        }
        let over = size > r.max_bytes();
        let commits = retention::commits(&self.git, &tip)?;
        // What the count drops goes first, and what stays goes into one
        // pack: each record's pack holds no deltas against the others,
        // so the store's size before a repack overstates what it keeps.
        let mut last = commits.len().min(r.keep()) - 1;
        let mut cut = commits.len();
        loop {
            let dropping = last + 1 < cut;
            if dropping {
                let dropped: Vec<(String, PruneReason)> = (last + 1..cut)
                    .map(|i| {
                        let why = match i >= r.keep() {
                            true => PruneReason::Keep(r.keep()),
                            false => PruneReason::Size(r.max_bytes()),
                        };
                        (commits[i].clone(), why)
                    })
                    .collect();
                // Listed first: a crash between the two leaves ids listed
                // as pruned that still restore, never the other way.
                retention::note_pruned(dir, &dropped).map_err(io)?;
                retention::set_boundary(dir, &commits[last]).map_err(io)?;
                cut = last + 1;
            }
            if !over && retention::packs(dir) <= MAX_PACKS {
                // Only the count asked: the dropped checkpoints are gone
                // from the chain now, and their objects at the next repack
                // (when the store passes its budget or gathers MAX_PACKS
                // packs), not at every turn: a repack rewrites the store.
                return retention::count(dir, &tip, last + 1).map_err(io);
            }
            retention::free(&self.git, dropping)?;
            if last == 0 || cordon_sandbox::allocated(dir).map_err(io)? <= r.max_bytes() {
                return retention::count(dir, &tip, last + 1).map_err(io);
            }
            // Over the budget: the oldest whose going leaves the rest
            // within it, from what each checkpoint's objects take now
            // that they are packed together. Still an estimate (a delta
            // whose base goes grows): measured again after, and at least
            // one more goes each time round.
            let kept = retention::kept_bytes(&self.git, &tip)?;
            let overhead = retention::outside_packs(dir).map_err(io)?;
            last = retention::oldest_kept(&kept, r, overhead).min(last - 1);
        }
    }

    /// One record or restore at a time on a store (two front ends on one
    /// session, or a record racing a rewind).
    fn lock(&self) -> Result<std::fs::File, CheckpointError> {
        let path = self.git.git_dir().join("cordon.lock");
        let io = |source| CheckpointError::Dir {
            dir: self.git.git_dir().to_path_buf(),
            source,
        };
        let f = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(&path)
            .map_err(io)?;
        rustix::fs::flock(&f, rustix::fs::FlockOperation::LockExclusive)
            .map_err(|e| io(e.into()))?;
        Ok(f)
    }
}
