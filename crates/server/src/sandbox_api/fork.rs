//! Forks: sandboxes that start from the files of a running one.
//!
//! A fork gets its parent's request (image, limits, network as its
//! tenant's ceiling allows now, environment, metadata, timeout), its
//! root's changes and its workspace. A microVM on virtio-fs forks from
//! its memory too, its processes carried: it is saved to disk for an
//! instant and each fork is taken up from a copy of that save, of its
//! disk and of its workspace (`cordon_sandbox::Sandbox::fork_from_memory`,
//! the workspace copied on the host by `cordon_sandbox::copy`, which
//! follows nothing). Otherwise processes are not carried. A native
//! sandbox's root changes are committed as a commit reads them (the upper
//! directory is hostile: see `cordon_build::commit`) into one more layer
//! under the parent's image, shared read-only by every fork. A microVM's
//! are a file system on its own disk, which the host never reads: the
//! disk is copied whole, its file system frozen by the guest meanwhile,
//! and each fork starts on a copy of that copy. The workspace is
//! carried by `tar` inside the parent, piped into `tar` inside each fork:
//! the host only moves bytes, never reads a name or follows a link of
//! them, and each fork unpacks within its own disk budget.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use cordon_sandbox::{ExecEvent, ExecRequest, Execution};
use futures_util::future::join_all;
use serde::{Deserialize, Serialize};
use utoipa::{IntoParams, ToSchema};

use super::{
    NewSandbox, Parent, SandboxView, StoredRequest, end, ended, finish, live_with_row, prepare,
    settle, start,
};
use crate::boxes::LiveBox;
use crate::http::{ApiError, ApiResult, Tenant};
use crate::state::Shared;

/// Forks one request makes at most (each also takes a live slot).
const FORKS_MAX: u32 = 100;

/// Where a sandbox's workspace is, inside it.
const WORKSPACE: &str = "/workspace";

/// How long copying a workspace into the forks may take.
const COPY_TIMEOUT: Duration = Duration::from_secs(600);

/// Chunks of the parent's tar queued per fork.
const QUEUED_CHUNKS: usize = 16;

/// The bytes of a `tar`'s complaint kept for the answer.
const COMPLAINT_KEPT: usize = 2048;

/// `POST /v1/sandboxes/{id}/fork`'s query.
#[derive(Debug, Default, Deserialize, IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct ForkQuery {
    /// How many forks to make: 1 (the default) to 100, within this
    /// tenant's live sessions and sandboxes.
    count: Option<u32>,
    /// How long each may run (default: as long as the parent was made to).
    timeout_secs: Option<u64>,
}

/// The forks made.
#[derive(Debug, Serialize, ToSchema)]
pub struct ForkList {
    pub sandboxes: Vec<SandboxView>,
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/fork", tag = "sandboxes", summary = "Fork a running sandbox",
    description = "Makes `count` sandboxes that start from this one's files: each is made as it was (image, limits, environment, metadata, its timeout unless `timeout_secs` says; its network as this tenant's ceiling allows now), on its root's changes (an image's sandbox: natively a layer made of them; a microVM's disk copied, its file system frozen for the copy) and with a copy of its `/workspace`, made by the image's `tar` inside it and unpacked by `tar` inside each fork, within the fork's disk budget. A microVM whose shares are virtio-fs forks from its memory: it is saved for an instant and each fork goes on with its processes, memory, root and workspace as they were then (commands started through the API run on, their output no longer followed). Otherwise processes are not carried: a fork runs nothing until told, and the copy is taken while the sandbox runs, as a snapshot is: a file being written meanwhile may be copied half-written. Every fork is made or none is.",
    params(("id" = String, Path), ForkQuery),
    responses((status = 201, body = ForkList),
              (status = 400, description = "The request says what is wrong, or the files could not be copied", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Its network is now beyond this tenant's ceiling, or its image no longer offered", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended, or is paused", body = crate::http::ErrorResponse),
              (status = 429, description = "This tenant's live sessions and sandboxes leave no room for that many", body = crate::http::ErrorResponse)))]
pub(crate) async fn fork_sandbox(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    q: Result<Query<ForkQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Response> {
    let Query(q) = q.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let forks = fork(&shared, &tenant, &id, q.count.unwrap_or(1), q.timeout_secs).await?;
    let sandboxes = forks
        .iter()
        .map(|(row, _)| SandboxView::of(row, true))
        .collect();
    Ok((StatusCode::CREATED, Json(ForkList { sandboxes })).into_response())
}

/// Makes `count` forks of `tenant`'s running sandbox `id`, each running
/// for `timeout_secs` (the parent's timeout unless given): all of them,
/// registered and recorded, or none. In a task of its own, so that a
/// client that hangs up half-way leaves all or none all the same.
pub(crate) async fn fork(
    shared: &Arc<Shared>,
    tenant: &str,
    id: &str,
    count: u32,
    timeout_secs: Option<u64>,
) -> ApiResult<Vec<(crate::store::SandboxRow, Arc<LiveBox>)>> {
    let (shared, tenant, id) = (shared.clone(), tenant.to_string(), id.to_string());
    tokio::spawn(async move { fork_all(&shared, &tenant, &id, count, timeout_secs).await })
        .await
        .map_err(ApiError::internal)?
}

async fn fork_all(
    shared: &Shared,
    tenant: &str,
    id: &str,
    count: u32,
    timeout_secs: Option<u64>,
) -> ApiResult<Vec<(crate::store::SandboxRow, Arc<LiveBox>)>> {
    if !(1..=FORKS_MAX).contains(&count) {
        return Err(ApiError::bad_request(format!(
            "`count` must be 1 to {FORKS_MAX}"
        )));
    }
    let (row, b) = live_with_row(shared, tenant, id).await?;
    let stored = StoredRequest::of(&row)
        .ok_or_else(|| super::unavailable(id, "read its request", "not this server's record"))?;
    let metadata = serde_json::from_str(&row.metadata).unwrap_or_default();
    let mut asked = NewSandbox::fork_of(stored, &b, metadata);
    asked.timeout_secs = timeout_secs.or(asked.timeout_secs);
    let options = settle(shared, tenant, &asked).await?;
    // Every slot first: all the forks are made, or none.
    let mut slots = Vec::with_capacity(count as usize);
    for _ in 0..count {
        slots.push(shared.caps.acquire(tenant)?);
    }
    if b.sandbox.saves_to_disk() {
        let forks = from_memory(shared, id, &b, &asked, &options, slots).await?;
        tracing::info!("sandbox {id} of {tenant}: forked {count} from its memory");
        return Ok(forks);
    }
    let (root, disk) = match (
        &options.image,
        b.sandbox.writable_layer_dir(),
        b.sandbox.writable_upper(),
    ) {
        (None, ..) => (None, None),
        (Some(_), Some(dir), Some(upper)) => (
            Some(Arc::new(
                shared
                    .images
                    .fork_root(tenant, id, dir, upper, b.account.clone())
                    .await
                    .map_err(|e| {
                        ApiError::bad_request(format!("cannot copy the sandbox's root: {e}"))
                    })?,
            )),
            None,
        ),
        // A microVM's root changes are a file system on its own disk: the
        // disk is copied once, frozen, and each fork copies that.
        (Some(_), Some(_), None) => (None, Some(Arc::new(copy_disk(shared, &b).await?))),
        (Some(_), None, _) => {
            return Err(super::unavailable(
                id,
                "copy its root",
                "it has no writable layer",
            ));
        }
    };
    let parent = Parent { id, root, disk };
    let made = join_all(slots.into_iter().map(|slot| {
        start(
            shared,
            tenant,
            asked.clone(),
            options.clone(),
            slot,
            Some(&parent),
        )
    }))
    .await;
    let (mut forks, mut failed) = (Vec::new(), None);
    for m in made {
        match m {
            Ok(f) => forks.push(f),
            Err(e) => failed = failed.or(Some(e)),
        }
    }
    let copied = match failed {
        Some(e) => Err(e),
        None => {
            let boxes: Vec<Arc<LiveBox>> = forks.iter().map(|(_, b)| b.clone()).collect();
            copy_workspace(&b, &boxes).await
        }
    };
    if let Err(e) = copied {
        for (row, _) in forks {
            if let Some(f) = shared.boxes.remove(&row.id) {
                end(shared, f, ended::KILLED).await;
            }
        }
        return Err(e);
    }
    tracing::info!("sandbox {id} of {tenant}: forked {count}");
    Ok(forks)
}

/// Forks of microVM `b` from its memory, one per slot: made at one
/// instant with its processes, memory, root and workspace (see
/// `cordon_sandbox::Sandbox::fork_from_memory`), each then resumed and
/// recorded. All of them, or none.
async fn from_memory(
    shared: &Shared,
    id: &str,
    b: &LiveBox,
    asked: &NewSandbox,
    options: &crate::job::RunOptions,
    slots: Vec<crate::caps::Slot>,
) -> ApiResult<Vec<(crate::store::SandboxRow, Arc<LiveBox>)>> {
    let (mut prepared, mut configs) = (Vec::new(), Vec::new());
    for _ in 0..slots.len() {
        match prepare(shared, &b.tenant, asked, options, None).await {
            Ok((new, sc)) => {
                prepared.push(new);
                configs.push(sc);
            }
            Err(e) => {
                for new in prepared {
                    new.discard("a fork that was not made").await;
                }
                return Err(e);
            }
        }
    }
    let made = b.sandbox.fork_from_memory(&configs).await;
    for _ in &configs {
        shared
            .metrics
            .sandbox_started(cordon_sandbox::BackendKind::Microvm, made.is_ok());
    }
    let sandboxes = match made {
        Ok(s) => s,
        Err(e) => {
            for new in prepared {
                new.discard("a fork that was not made").await;
            }
            return Err(ApiError::bad_request(format!(
                "cannot fork the sandbox from its memory: {e}"
            )));
        }
    };
    let (mut forks, mut failed) = (Vec::new(), None);
    for ((sandbox, new), slot) in sandboxes.into_iter().zip(prepared).zip(slots) {
        if failed.is_none()
            && let Err(e) = sandbox.resume().await
        {
            failed = Some(super::start_error(&new.id, e));
        }
        if failed.is_some() {
            sandbox.close().await;
            new.discard("a fork that was not made").await;
            continue;
        }
        match finish(shared, new, sandbox, asked, options.clone(), slot, Some(id)).await {
            Ok(f) => forks.push(f),
            Err(e) => failed = Some(e),
        }
    }
    if let Some(e) = failed {
        for (row, _) in forks {
            if let Some(f) = shared.boxes.remove(&row.id) {
                end(shared, f, ended::KILLED).await;
            }
        }
        return Err(e);
    }
    Ok(forks)
}

/// A copy of microVM `b`'s writable disk in the store's scratch space,
/// removed when the last fork has copied it.
async fn copy_disk(shared: &Shared, b: &LiveBox) -> ApiResult<tempfile::TempPath> {
    let tmp = shared.images.store()?.root().join("tmp");
    let path = tempfile::Builder::new()
        .prefix(".fork-disk-")
        .tempfile_in(&tmp)
        .map_err(ApiError::internal)?
        .into_temp_path();
    // The copy makes the file anew.
    std::fs::remove_file(&path).map_err(ApiError::internal)?;
    b.sandbox
        .copy_layer_disk(&path)
        .await
        .map_err(|e| ApiError::bad_request(format!("cannot copy the sandbox's root: {e}")))?;
    Ok(path)
}

/// A command in `b` that may read and write every file of its workspace:
/// root in an image's sandbox; elsewhere its only user.
fn in_workspace(b: &LiveBox, argv: &[&str]) -> ExecRequest {
    let req = ExecRequest::argv(argv.iter().copied())
        .cwd("/")
        .timeout(COPY_TIMEOUT);
    if b.image.is_some() {
        req.user(0, 0)
    } else {
        req
    }
}

/// Copies `parent`'s workspace into each of `forks`, by `tar` inside
/// each: what the parent's writes is bytes the host passes on unread.
async fn copy_workspace(parent: &LiveBox, forks: &[Arc<LiveBox>]) -> ApiResult<()> {
    let refused = |why: String| ApiError::bad_request(format!("cannot copy the workspace: {why}"));
    let mut into = Vec::with_capacity(forks.len());
    for f in forks {
        let req = in_workspace(f, &["tar", "-C", WORKSPACE, "-xpf", "-"]).stream_stdin();
        into.push(
            f.sandbox
                .exec_stream(req)
                .await
                .map_err(|e| super::start_error(&f.id, e))?,
        );
    }
    let mut from = parent
        .sandbox
        .exec_stream(in_workspace(
            parent,
            &["tar", "-C", WORKSPACE, "-cf", "-", "."],
        ))
        .await
        .map_err(|e| super::start_error(&parent.id, e))?;
    // Each fork is fed from a queue of its own, so that the slowest holds
    // the parent back only once its queue is full.
    let (mut queues, mut writers) = (Vec::new(), Vec::new());
    for stdin in into.iter().map(Execution::stdin) {
        let (tx, mut rx) = tokio::sync::mpsc::channel::<Arc<[u8]>>(QUEUED_CHUNKS);
        queues.push(tx);
        writers.push(async move {
            while let Some(d) = rx.recv().await {
                if stdin.write(&d).await.is_err() {
                    // The fork's own complaint says why.
                    break;
                }
            }
            let _ = stdin.close();
        });
    }
    let feed = async move {
        let mut complaint = Vec::new();
        loop {
            match from.next().await {
                Some(Ok(ExecEvent::Stdout(d))) => {
                    let d: Arc<[u8]> = d.into();
                    for q in &queues {
                        // A fork that stopped reading has dropped its queue.
                        let _ = q.send(d.clone()).await;
                    }
                }
                Some(Ok(ExecEvent::Stderr(d))) => keep(&mut complaint, &d),
                // GNU tar's 1: a file changed while it was read, which a
                // running sandbox's may.
                Some(Ok(ExecEvent::Exit(r))) if matches!(r.exit_code(), 0 | 1) => break Ok(()),
                Some(Ok(ExecEvent::Exit(_))) => break Err(refused(said("its tar", &complaint))),
                Some(Err(e)) => break Err(super::start_error(&parent.id, e)),
                None => break Err(super::start_error(&parent.id, cordon_sandbox::Error::Gone)),
            }
        }
        // Dropping the queues ends the writers, which close the forks' stdin.
    };
    use cordon_sandbox::exit_code::{DISK, TIMEOUT};
    let unpacked = join_all(into.iter_mut().map(|e| async move {
        let mut complaint = Vec::new();
        loop {
            match e.next().await {
                Some(Ok(ExecEvent::Stderr(d))) => keep(&mut complaint, &d),
                Some(Ok(ExecEvent::Exit(r))) => break (r.exit_code(), complaint),
                Some(Ok(_)) => {}
                // The budget's stop can end the stream before its exit.
                Some(Err(cordon_sandbox::Error::DiskBudget(_))) => break (DISK, complaint),
                Some(Err(_)) | None => break (-1, complaint),
            }
        }
    }));
    let (fed, _, unpacked) = tokio::join!(feed, join_all(writers), unpacked);
    // A fork past its budget is the answer even when the parent's side
    // failed too: its own copy could not have been whole.
    if unpacked.iter().any(|(code, _)| *code == DISK) {
        return Err(refused(
            "it does not fit in a fork's disk budget (`disk`, as the sandbox was made with)".into(),
        ));
    }
    fed?;
    match unpacked.into_iter().find(|(code, _)| *code != 0) {
        None => Ok(()),
        Some((TIMEOUT, _)) => Err(refused(format!(
            "it took longer than {}",
            humantime::format_duration(COPY_TIMEOUT)
        ))),
        Some((_, complaint)) => Err(refused(said("a fork's tar", &complaint))),
    }
}

fn keep(complaint: &mut Vec<u8>, d: &[u8]) {
    let room = COMPLAINT_KEPT.saturating_sub(complaint.len());
    complaint.extend_from_slice(&d[..d.len().min(room)]);
}

/// A `tar`'s complaint as the answer shows it: the sandbox's bytes,
/// printable.
fn said(who: &str, complaint: &[u8]) -> String {
    let text = String::from_utf8_lossy(complaint);
    match text.trim() {
        "" => format!("{who} failed"),
        t => format!("{who} failed: {}", cordon_tools::printable(t)),
    }
}
