//! Paused microVMs outlive the server. A sandbox of the microvm backend
//! keeps its run files in `<its directory>/vm` (the sandbox crate's state
//! directory) and what it was asked for in `<its directory>/sandbox.json`.
//! When the server stops, each paused to disk is kept, not ended
//! ([`keep`]): its record stays running, its files stay, it costs disk
//! only. The next server takes each up again under its id, paused, as any
//! paused sandbox, to be resumed by `POST …/resume`, an E2B `connect` or
//! a request that resumes it ([`recover`]); resumed, it runs what it had
//! left of its time when paused (`kept.json`). A server that died leaves
//! the same: what was paused to disk is taken up, what ran ends, as
//! before; its sandboxes resumed run their whole timeout.
//!
//! The rules:
//!
//! - `sandbox.json` is the server's, in a directory no sandbox sees; it
//!   holds the request's environment values, which the guest's saved
//!   memory beside it holds anyway. It is read back bounded, as the closed
//!   type it was written as, and checked again (the tenant's ceilings and
//!   the server's bounds now) like a new request.
//! - A sandbox that cannot be taken up (its image gone, its save from
//!   another cordon) ends, its record saying why.

use std::io::{Read, Write};
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Configured, NewSandbox, configure, dir, register, settle};
use crate::boxes::LiveBox;
use crate::config::SANDBOX_VM_STATE as VM_STATE;
use crate::state::Shared;
use crate::store::SandboxRow;
/// What it was asked for.
const REQUEST: &str = "sandbox.json";
/// How it was kept ([`Kept`]).
const KEPT: &str = "kept.json";

/// What a server that kept a sandbox knew of it that its request does not
/// say.
#[derive(Debug, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Kept {
    /// What it had left of its time when paused, in milliseconds.
    left_ms: u64,
}
/// The most bytes of it read back: a request is bounded by the server's
/// body limit, far below this.
const MAX_REQUEST: u64 = 4 << 20;

/// Writes what a microVM sandbox was asked for into its directory `d`,
/// for the server that takes it up after this one.
pub(crate) fn record(d: &Path, asked: &NewSandbox) -> std::io::Result<()> {
    write(d, REQUEST, asked)
}

/// Writes `value` as `d/name`: private (0600), and whole or absent under
/// its name.
fn write(d: &Path, name: &str, value: &impl serde::Serialize) -> std::io::Result<()> {
    let json = serde_json::to_vec(value).map_err(std::io::Error::other)?;
    let mut f = tempfile::NamedTempFile::new_in(d)?;
    f.write_all(&json)?;
    f.as_file().sync_all()?;
    f.persist(d.join(name)).map_err(|e| e.error)?;
    Ok(())
}

/// Reads `d/name`, at most [`MAX_REQUEST`] bytes of it, as a `T`.
fn read<T: serde::de::DeserializeOwned>(d: &Path, name: &str) -> std::io::Result<T> {
    let mut json = Vec::new();
    std::fs::File::open(d.join(name))?
        .take(MAX_REQUEST)
        .read_to_end(&mut json)?;
    serde_json::from_slice(&json).map_err(std::io::Error::other)
}

/// Keeps `b` for the next server if it is paused to disk, leaving its
/// registry entries, record and files; false (nothing done) otherwise.
pub(crate) async fn keep(shared: &Shared, b: &LiveBox) -> bool {
    if !b.sandbox.is_paused() || !dir(shared, &b.id).join(REQUEST).is_file() {
        return false;
    }
    let d = dir(shared, &b.id);
    let left = b.left().unwrap_or(b.timeout);
    let kept = Kept {
        left_ms: left.as_millis().try_into().unwrap_or(u64::MAX),
    };
    if let Err(e) = write(&d, KEPT, &kept) {
        tracing::warn!("sandbox {}: its time left is not kept: {e}", b.id);
    }
    match b.sandbox.keep().await {
        Ok(()) => {
            shared
                .sandboxes
                .unlist(&crate::owner::Owner::Sandbox(b.id.clone()));
            tracing::info!("sandbox {}: kept, paused, for the next start", b.id);
            true
        }
        Err(_) => false,
    }
}

/// Settles the sandboxes the last server left running: those paused to
/// disk are taken up, paused; the rest end, as the last server's stop (or
/// death) ended them.
pub(crate) async fn recover(shared: &Arc<Shared>) {
    let rows = match shared.store.all_running_sandboxes().await {
        Ok(rows) => rows,
        Err(e) => {
            tracing::warn!("cannot read the last run's sandboxes: {e}");
            return;
        }
    };
    let (mut kept, mut ended) = (0, 0);
    for row in rows {
        let d = dir(shared, &row.id);
        let saved = d.join(VM_STATE).join("run").join("paused").is_dir();
        let why = if saved {
            match take_up(shared, &row).await {
                Ok(()) => {
                    kept += 1;
                    continue;
                }
                Err(e) => {
                    tracing::warn!("sandbox {}: cannot be taken up again: {e}", row.id);
                    format!(
                        "{}; it could not be taken up again: {e}",
                        super::ended::STOPPED
                    )
                }
            }
        } else {
            super::ended::STOPPED.to_string()
        };
        ended += 1;
        if let Err(e) = shared.store.end_sandbox(&row.id, &why).await {
            tracing::warn!("sandbox {}: cannot record its end: {e}", row.id);
        }
        crate::files::remove_files(d, "a sandbox of the last run").await;
    }
    if kept > 0 {
        tracing::info!("{kept} paused sandboxes of the last run taken up");
    }
    if ended > 0 {
        tracing::info!("{ended} sandboxes of the last run recorded as ended");
    }
}

/// Takes up sandbox `row`, paused to disk by the last server, paused.
async fn take_up(shared: &Arc<Shared>, row: &SandboxRow) -> Result<(), String> {
    let d = dir(shared, &row.id);
    let asked: NewSandbox =
        read(&d, REQUEST).map_err(|e| format!("its request does not read: {e}"))?;
    // Read once: a sandbox taken up, resumed and paused again by a server
    // that then dies has no time left on record and runs its whole
    // timeout, rather than what an earlier server recorded.
    let kept: Option<Kept> = read(&d, KEPT).ok();
    let _ = std::fs::remove_file(d.join(KEPT));
    let tenant = &row.tenant;
    let options = settle(shared, tenant, &asked)
        .await
        .map_err(|e| e.message().to_string())?;
    let slot = shared
        .caps
        .acquire(tenant)
        .map_err(|e| e.message().to_string())?;
    let in_use = {
        let (ws, defaults, disk) = (d.join("workspace"), shared.config.sandboxes(), options.disk);
        tokio::task::spawn_blocking(move || defaults.make_workspace(&ws, Some(disk)))
            .await
            .map_err(|e| e.to_string())?
            .map_err(|e| format!("its workspace: {e}"))?
    };
    let Configured {
        sc,
        account,
        layers,
        fork_root,
    } = configure(shared, tenant, &row.id, &asked, &options, None)
        .await
        .map_err(|e| e.message().to_string())?;
    if sc.backend != cordon_sandbox::BackendKind::Microvm {
        return Err("this server's sandboxes are not microVMs now".into());
    }
    let sandbox = cordon_sandbox::MicrovmBackend
        .reattach(&sc)
        .await
        .map_err(|e| e.to_string())?;
    let timeout = Duration::from_secs(options.timeout_secs);
    register(
        shared,
        crate::boxes::Made {
            id: row.id.clone(),
            tenant: tenant.clone(),
            image: options.image.map(String::from),
            account,
            layers,
            // Its clock stands while paused; resumed, it runs what it had
            // left.
            deadline: Instant::now() + timeout,
            timeout,
            on_timeout: asked.on_timeout,
            auto_resume: asked.auto_resume,
            public: asked.public,
            env: asked.env,
            fork_root,
            left: kept.map(|k| Duration::from_millis(k.left_ms).min(timeout)),
        },
        sandbox,
        slot,
        in_use,
    );
    tracing::info!("sandbox {} of {tenant}: taken up, paused", row.id);
    Ok(())
}
