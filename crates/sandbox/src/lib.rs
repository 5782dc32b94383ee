//! Sandboxes for cordon: isolated, persistent sessions in which commands run.
//!
//! A [`Backend`] creates [`Sandbox`] sessions. A session lives as long as a
//! conversation or a job: files, installed packages and background processes
//! persist between execs, and many execs may run in it at once. Closing or
//! dropping the session, or the host process dying, kills everything in it.
//!
//! ```no_run
//! # async fn demo() -> Result<(), cordon_sandbox::Error> {
//! use cordon_sandbox::{ExecRequest, Sandbox, SandboxConfig};
//! let sandbox = Sandbox::create(SandboxConfig::new("/tmp/work")).await?;
//! let out = sandbox.exec(ExecRequest::shell("echo hi; echo oops >&2")).await?;
//! assert_eq!(out.stdout, b"hi\n");
//! sandbox.close().await;
//! # Ok(()) }
//! ```
//!
//! The binary that embeds this crate must call
//! [`supervisor::run_if_supervisor`] first thing in `main`: the sandbox's
//! init process is that same binary, started with a hidden argument.
//!
//! The modules, in the order of [`LAYERS`], each using only those listed
//! before it (a test checks it):
//! - `layout` (what the host and the supervisor agree the sandbox looks
//!   like), `protocol` (the framed protocol between host and supervisor),
//!   `error`, `loopdev` (ext4 image files mounted through loop devices),
//!   `repos` (git repositories below the workspace's top level), `egress`
//!   (the broker's part of a configuration), `config` (how to build a
//!   sandbox, validated once), `cache`, `subids`, `tree` (a hostile tree
//!   measured and opened up, no link followed), `sparse` (files copied
//!   without their holes);
//! - `supervisor`: the sandbox's pid 1, native or in a microVM guest;
//! - `netrelay` (connections carried over the control channel),
//!   `services` (the host-side services a sandbox has while it lives),
//!   `session`: a live sandbox, whatever isolates it: its protocol stream,
//!   its execs, its services;
//! - `backend`: the [`Backend`] trait and what backends share; `cgroup`;
//! - the backends, `native` and `microvm`;
//! - `volume` (a workspace that is a file system of its own), `disk` (the
//!   disk budget's watcher, which fits a volume's room), `display` and
//!   `connect` (ports), on a live session; `leftovers`;
//! - `create`: [`Sandbox::create`], through the backend the config names.

mod backend;
mod cache;
pub mod cgroup;
mod config;
mod connect;
pub mod copy;
mod create;
mod disk;
mod display;
mod egress;
mod error;
mod fresh;
mod layout;
mod leftovers;
mod loopdev;
pub mod microvm;
mod native;
mod netrelay;
pub mod protocol;
mod repos;
mod services;
mod session;
mod sparse;
mod subids;
pub mod supervisor;
mod tree;
pub mod volume;

pub use backend::{
    Backend, DISK_FILE, IMAGE_FILE, ImageIds, LABEL_FILE, SUPERVISOR_FILE, live_upper,
};
pub use cache::cache_dir;
pub use config::{
    Accel, BackendKind, BindMount, BuildStep, CONTROL_FILES, DISPLAY, Display, Limits, LimitsError,
    MAX_CPUS, MIB, Network, PortForward, RootImage, SandboxConfig, VmOptions, VmShares,
    control_files, parse_size,
};
pub use connect::forwarded;
pub use display::VncAccess;
pub use egress::{Egress, NetworkInfo, PROXY_PORT, Refusals};
pub use error::{DiskStop, Error, Result};
pub use leftovers::{Leftover, leftovers};
pub use microvm::MicrovmBackend;
pub use native::{NativeBackend, host_report};
pub use protocol::{ExitStatus, SpawnStage, Stream, WinSize};
pub use session::Forward;
pub use session::{
    ExecEvent, ExecOutput, ExecRequest, ExecResult, ExecStdin, Execution, FsResult, Sandbox,
    SandboxInfo, Usage, WatchEvent, Watcher, exit_code,
};
pub use tree::{allocated, make_removable};

/// The modules from the bottom up: each may use only those before it.
pub const LAYERS: &[&str] = &[
    "layout",
    "protocol",
    "error",
    "loopdev",
    "repos",
    "egress",
    "config",
    "cache",
    "subids",
    "tree",
    "sparse",
    "fresh",
    "copy",
    "supervisor",
    "netrelay",
    "services",
    "session",
    "backend",
    "cgroup",
    "native",
    "microvm",
    "volume",
    "disk",
    "display",
    "connect",
    "leftovers",
    "create",
];

/// The layering of [`LAYERS`], checked on the sources by the testkit's
/// checker (here: the crate's own `layout` module takes that file name).
#[cfg(test)]
mod layering {
    cordon_testkit::layering_test!(crate::LAYERS);
}
