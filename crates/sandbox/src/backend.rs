//! What the isolation backends share, below them: the [`Backend`] trait
//! each implements, and the pieces of launching a sandbox that do not
//! depend on how it is isolated. Which backend a configuration names is
//! decided above them, in `create.rs`.

use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;

use crate::config::SandboxConfig;
use crate::error::{Error, Result};
use crate::session::Sandbox;

/// Creates sandbox sessions: `native` (Linux namespaces) and `microvm`
/// (QEMU) plug in behind it. [`crate::BackendKind::backend`] gives the one
/// a configuration names; [`Sandbox::create`] goes through it.
pub trait Backend: Send + Sync {
    fn name(&self) -> &'static str;
    fn create<'a>(
        &'a self,
        config: &'a SandboxConfig,
    ) -> Pin<Box<dyn Future<Output = Result<Sandbox>> + Send + 'a>>;
}

/// The supervisor's executable: the configured one, `CORDON_SUPERVISOR`,
/// or this process's own.
pub(crate) fn resolve_supervisor(config: &SandboxConfig) -> Result<PathBuf> {
    if let Some(p) = &config.supervisor {
        return Ok(p.clone());
    }
    if let Some(p) = std::env::var_os("CORDON_SUPERVISOR") {
        return Ok(PathBuf::from(p));
    }
    std::env::current_exe().map_err(|e| Error::Spawn {
        path: PathBuf::from("/proc/self/exe"),
        source: e,
    })
}

/// Whether `name`, of the form `<pid>-<n>` that cordon gives the host
/// directories a process makes for its sandboxes (cgroups, microVM run
/// directories), was left by a process that no longer exists. A live pid
/// counts as alive even if it was reused: a directory left a little longer
/// costs nothing, one removed under a running sandbox breaks it.
pub(crate) fn left_by_dead_process(name: &str) -> bool {
    name.split_once('-')
        .and_then(|(pid, _)| pid.parse::<u32>().ok())
        .is_some_and(|pid| !std::path::Path::new(&format!("/proc/{pid}")).exists())
}
