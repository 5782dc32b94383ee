//! The crate's errors, at the bottom of every other module.

use std::path::PathBuf;
use std::time::Duration;

use crate::protocol::SpawnStage;

/// Errors from creating or using a sandbox.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("invalid sandbox configuration: {0}")]
    Config(String),
    #[error("cannot start the sandbox supervisor ({path}): {source}")]
    Spawn {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot set up resource limits: {0}")]
    Limits(std::io::Error),
    #[error("sandbox setup failed: {message}")]
    Setup { message: String, errno: i32 },
    #[error("the sandbox did not become ready within {0:?}")]
    SetupTimeout(Duration),
    #[error("the sandbox has exited")]
    Gone,
    /// The watcher stopped the sandbox for outgrowing its disk budget.
    #[error("{0}")]
    DiskBudget(DiskStop),
    /// The display or its live view cannot be used.
    #[error("{0}")]
    Display(String),
    /// The command could not be started; `stage` says which part failed.
    #[error("{message}")]
    Exec {
        stage: SpawnStage,
        message: String,
        errno: i32,
    },
    #[error("sandbox I/O: {0}")]
    Io(#[from] std::io::Error),
    /// The image's root for a microVM could not be made.
    #[error("{0}")]
    Image(#[from] cordon_image::flat::FlatError),
}

impl Error {
    /// True for a command that could not be started because it does not
    /// exist (a shell would say 127).
    pub fn is_not_found(&self) -> bool {
        matches!(self, Error::Exec { stage: SpawnStage::Program, errno, .. } if *errno == libc::ENOENT)
    }
}

pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why a sandbox was stopped for its disk budget
/// (`SandboxConfig::disk`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskStop {
    /// The budget, in bytes.
    pub budget: u64,
    /// How much the workspace and writable binds had grown, in bytes.
    pub growth: u64,
}

impl std::fmt::Display for DiskStop {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mib = |b: u64| b.div_ceil(1 << 20);
        write!(
            f,
            "the sandbox was stopped: its workspace grew by {} MiB, past its disk budget of {} MiB",
            mib(self.growth),
            mib(self.budget)
        )
    }
}
