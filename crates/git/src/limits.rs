//! Bounds on a clone made for someone else (a tenant's job): how long it
//! may take, how much disk it may fill, and whether it was called off.
//! The clone happens on the host before any sandbox with its own budget
//! exists, so without these a repository of 50 GB, or a remote that
//! answers one byte a minute, would hold the worker's disk or a slot.

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::command::{Git, GitError, shown_stderr};

/// How often a running clone is looked at.
const POLL: Duration = Duration::from_millis(100);

/// What a clone may take; [`Limits::none`] for the host's own user.
#[derive(Clone, Default)]
pub struct Limits {
    /// Bytes the clone may write: its objects, then its checked-out files.
    pub max_bytes: Option<u64>,
    /// When it must be done.
    pub deadline: Option<Instant>,
    /// Whether it was called off (the job was cancelled).
    pub cancelled: Option<Arc<dyn Fn() -> bool + Send + Sync>>,
}

impl std::fmt::Debug for Limits {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Limits")
            .field("max_bytes", &self.max_bytes)
            .field("deadline", &self.deadline)
            .finish_non_exhaustive()
    }
}

/// Why a bounded clone stopped.
#[derive(Debug, thiserror::Error)]
pub enum Exceeded {
    #[error(
        "the repository is larger than the {} MiB the job's disk budget allows (raise `disk`, or clone a smaller reference)",
        .0 >> 20
    )]
    TooLarge(u64),
    #[error("the clone did not finish before the job's timeout")]
    TooSlow,
    #[error("the clone was called off")]
    Cancelled,
    #[error(transparent)]
    Git(#[from] GitError),
}

impl Limits {
    pub fn none() -> Limits {
        Limits::default()
    }

    fn check(&self, used: impl FnOnce() -> u64) -> Result<(), Exceeded> {
        if self.cancelled.as_ref().is_some_and(|c| c()) {
            return Err(Exceeded::Cancelled);
        }
        if self.deadline.is_some_and(|d| Instant::now() >= d) {
            return Err(Exceeded::TooSlow);
        }
        if let Some(max) = self.max_bytes
            && used() > max
        {
            return Err(Exceeded::TooLarge(max));
        }
        Ok(())
    }

    /// Whether `bytes` more would go past the budget, `already` spent.
    pub(crate) fn admit(&self, already: u64, bytes: u64) -> Result<(), Exceeded> {
        self.check(|| already.saturating_add(bytes))
    }

    /// Runs `git ARGS`, killing it once it fills `watched` past the budget,
    /// runs past the deadline, or is called off; what it printed.
    pub(crate) fn run(
        &self,
        git: &Git,
        args: &[&std::ffi::OsStr],
        watched: &Path,
    ) -> Result<(), Exceeded> {
        let mut cmd = git.command(args);
        let name = crate::command::describe(&cmd);
        // A group of its own: git's helpers (`git-remote-https`) are
        // stopped with it.
        cmd.stdout(Stdio::null())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = git.spawn(&mut cmd)?;
        let mut stderr = child.stderr.take().expect("piped");
        // Read as it comes, so a chatty git never blocks on a full pipe.
        let reader = std::thread::spawn(move || {
            let mut buf = Vec::new();
            let _ = stderr.by_ref().take(1 << 20).read_to_end(&mut buf);
            buf
        });
        let io = |source| GitError::Io {
            command: name.clone(),
            source,
        };
        let status = loop {
            if let Some(status) = child.try_wait().map_err(io)? {
                break status;
            }
            if let Err(e) = self.check(|| disk_use(watched)) {
                if let Some(group) = rustix::process::Pid::from_raw(child.id() as i32) {
                    let _ =
                        rustix::process::kill_process_group(group, rustix::process::Signal::KILL);
                }
                let _ = child.kill();
                let _ = child.wait();
                let _ = reader.join();
                return Err(e);
            }
            std::thread::sleep(POLL);
        };
        let stderr = reader.join().unwrap_or_default();
        if status.success() {
            Ok(())
        } else {
            Err(GitError::Failed {
                command: name,
                stderr: shown_stderr(&stderr),
            }
            .into())
        }
    }
}

/// Bytes of the files beneath `dir` (a clone's own scratch directory),
/// links not followed.
pub(crate) fn disk_use(dir: &Path) -> u64 {
    let mut total = 0u64;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            match e.metadata() {
                Ok(m) if m.is_dir() => stack.push(e.path()),
                Ok(m) => total = total.saturating_add(m.len()),
                Err(_) => {}
            }
        }
    }
    total
}
