//! The sandbox API: a sandbox as a resource, driven from code. Create one
//! (image, limits, network, environment, a timeout, metadata), run
//! commands in it (see [`commands`]), reach its files, network policy and
//! ports as a job's or session's (the `owned` routes), extend its timeout,
//! delete it. Another tenant's sandbox is as absent as a missing one.
//!
//! A sandbox lives in the process that made it and ends at its deadline,
//! when deleted, or when the process stops; its record stays, with when
//! and why it ended, and its workspace goes with it.

mod commands;
mod fork;
mod fs;
pub(crate) mod kept;
mod pty;
mod view;

pub(crate) use commands::*;
pub(crate) use fork::*;
pub(crate) use fs::*;
pub(crate) use pty::*;
pub use view::{NewSandbox, SandboxList, SandboxMetrics, SandboxView, TimeoutChange, UsageView};
pub(crate) use view::{StoredRequest, check_env};

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::{Json, Router, routing::get, routing::post};

use crate::boxes::LiveBox;
use crate::http::{ApiError, ApiResult, Tenant, plausible_id, read_json};
use crate::owner::Owner;
use crate::state::Shared;
use crate::store::{SandboxRow, now_ms};

/// Sandboxes a tenant lists at most.
const LIST_MAX: i64 = 1000;

/// Why a sandbox ended, as its record says.
pub(crate) mod ended {
    pub const KILLED: &str = "killed";
    pub const TIMEOUT: &str = "timeout";
    pub const STOPPED: &str = "the server stopped";
}

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/v1/sandboxes", post(create_sandbox).get(list_sandboxes))
        .route(
            "/v1/sandboxes/{id}",
            get(get_sandbox).delete(delete_sandbox),
        )
        .route("/v1/sandboxes/{id}/timeout", post(set_sandbox_timeout))
        .route("/v1/sandboxes/{id}/pause", post(pause_sandbox))
        .route("/v1/sandboxes/{id}/resume", post(resume_sandbox))
        .route("/v1/sandboxes/{id}/fork", post(fork_sandbox))
        .route("/v1/sandboxes/{id}/metrics", get(sandbox_metrics))
        .route("/v1/sandboxes/{id}/fs", axum::routing::delete(fs_remove))
        .route("/v1/sandboxes/{id}/fs/stat", get(fs_stat))
        .route("/v1/sandboxes/{id}/fs/list", get(fs_list))
        .route("/v1/sandboxes/{id}/fs/mkdir", post(fs_mkdir))
        .route("/v1/sandboxes/{id}/fs/move", post(fs_move))
        .route("/v1/sandboxes/{id}/fs/watch", get(fs_watch))
        .route(
            "/v1/sandboxes/{id}/fs/archive",
            get(fs_archive_get)
                .put(fs_archive_put)
                .layer(axum::extract::DefaultBodyLimit::disable()),
        )
        .route("/v1/sandboxes/{id}/pty", get(open_pty))
        .route(
            "/v1/sandboxes/{id}/commands",
            post(run_command).get(list_processes),
        )
        .route(
            "/v1/sandboxes/{id}/commands/{pid}/events",
            get(follow_process),
        )
        .route("/v1/sandboxes/{id}/commands/{pid}/stdin", post(write_stdin))
        .route(
            "/v1/sandboxes/{id}/commands/{pid}/signal",
            post(signal_process),
        )
}

/// Where sandbox `id`'s files are.
pub(crate) fn dir(shared: &Shared, id: &str) -> std::path::PathBuf {
    shared.config.sandbox_dirs().join(id)
}

/// A tenant's sandbox as recorded.
pub(crate) async fn find(shared: &Shared, tenant: &str, id: &str) -> ApiResult<SandboxRow> {
    if !plausible_id(id) {
        return Err(ApiError::not_found("such sandbox"));
    }
    shared
        .store
        .sandbox(tenant, id)
        .await?
        .ok_or_else(|| ApiError::not_found(&format!("sandbox {id}")))
}

/// A tenant's sandbox, live in this process.
pub(crate) async fn live(shared: &Shared, tenant: &str, id: &str) -> ApiResult<Arc<LiveBox>> {
    live_with_row(shared, tenant, id).await.map(|(_, b)| b)
}

/// As [`live`], with the record it was found by.
pub(crate) async fn live_with_row(
    shared: &Shared,
    tenant: &str,
    id: &str,
) -> ApiResult<(SandboxRow, Arc<LiveBox>)> {
    let (row, b) = live_or_paused(shared, tenant, id).await?;
    if b.sandbox.is_paused() {
        // Anything asked of it would wait for a resume nothing asked for.
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "paused",
            format!("sandbox {id} is paused: resume it first (POST /v1/sandboxes/{id}/resume)"),
        ));
    }
    Ok((row, b))
}

async fn live_or_paused(
    shared: &Shared,
    tenant: &str,
    id: &str,
) -> ApiResult<(SandboxRow, Arc<LiveBox>)> {
    let row = find(shared, tenant, id).await?;
    let b = shared.boxes.get(tenant, id).ok_or_else(|| gone(&row))?;
    Ok((row, b))
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/pause", tag = "sandboxes", summary = "Pause a sandbox",
    description = "Every process in it stops where it is, its memory kept (a native sandbox's cgroup frozen, a microVM's QEMU stopped), until `POST …/resume`; its timeout stands still meanwhile. Commands, metrics and ports answer 409 while it is paused; its files can be read and written. Pausing a paused sandbox does nothing. A microVM is paused to disk where its shares are virtio-fs: it then costs disk, not memory, and outlives the server, whose next start finds it paused under its id.",
    params(("id" = String, Path)),
    responses((status = 200, body = SandboxView),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse),
              (status = 501, description = "This server cannot freeze a sandbox (no freezer cgroup)", body = crate::http::ErrorResponse)))]
pub(crate) async fn pause_sandbox(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxView>> {
    pause_or_resume(&shared, &tenant, &id, true).await
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/resume", tag = "sandboxes", summary = "Resume a paused sandbox",
    description = "Its processes go on from where they were; its timeout runs again from where it stood. Resuming a running sandbox does nothing.",
    params(("id" = String, Path)),
    responses((status = 200, body = SandboxView),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse)))]
pub(crate) async fn resume_sandbox(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxView>> {
    pause_or_resume(&shared, &tenant, &id, false).await
}

async fn pause_or_resume(
    shared: &Shared,
    tenant: &str,
    id: &str,
    pause: bool,
) -> ApiResult<Json<SandboxView>> {
    let (_, b) = live_or_paused(shared, tenant, id).await?;
    let refused = |e| crate::http::pause_refused(e, |e| start_error(id, e));
    if pause {
        b.pause(None).await.map_err(refused)?;
    } else if b.sandbox.is_paused() {
        let left = b.resume().await.map_err(refused)?;
        run_again(shared, &b, left).await?;
    }
    let row = find(shared, tenant, id).await?;
    Ok(Json(SandboxView::of(&row, true).paused(pause)))
}

/// A resumed sandbox's time running again: `left` from now, in its
/// deadline and its record.
async fn run_again(shared: &Shared, b: &LiveBox, left: Duration) -> ApiResult<()> {
    let expires_ms = now_ms() + left.as_millis() as i64;
    shared
        .store
        .extend_sandbox(&b.tenant, &b.id, expires_ms)
        .await?;
    b.set_deadline(Instant::now() + left);
    Ok(())
}

/// Whether a request for `b` may go on: it runs, or it was paused and is
/// resumed for the request, made so (`auto_resume`). Asked only once the
/// request is let in.
pub(crate) async fn awake(shared: &Shared, b: &LiveBox) -> bool {
    if !b.sandbox.is_paused() {
        return true;
    }
    if !b.auto_resume {
        return false;
    }
    let left = match b.resume().await {
        Ok(left) => left,
        Err(_) => return !b.sandbox.is_paused(),
    };
    if let Err(e) = run_again(shared, b, left).await {
        tracing::warn!(
            "sandbox {}: its new end is not recorded: {}",
            b.id,
            e.message()
        );
        b.set_deadline(Instant::now() + left);
    }
    tracing::info!("sandbox {}: resumed by a request", b.id);
    true
}

/// What a sandbox's record says of its network: the mode, and with
/// `allow` the rules it was made with.
pub(crate) fn network_of(
    row: &SandboxRow,
) -> (cordon_sandbox::Network, Option<cordon_net::Policy>) {
    match StoredRequest::of(row) {
        Some(s) => {
            let policy = s.allow.and_then(|allow| {
                cordon_net::Policy::parse(&allow, s.allow_private.unwrap_or(false)).ok()
            });
            (s.network.into(), policy)
        }
        None => (cordon_sandbox::Network::Off, None),
    }
}

/// The answer about a sandbox that is not running here: why, as its
/// record says.
pub(crate) fn gone(row: &SandboxRow) -> ApiError {
    let why = row
        .end_reason
        .as_deref()
        .unwrap_or("it lives in another process");
    ApiError::new(
        StatusCode::CONFLICT,
        "not_running",
        format!("sandbox {} is not running: {why}", row.id),
    )
}

fn unavailable(id: &str, what: &str, e: impl std::fmt::Display) -> ApiError {
    tracing::error!("sandbox {id}: {what}: {e}");
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "unavailable",
        format!("cannot {what}"),
    )
}

#[utoipa::path(post, path = "/v1/sandboxes", tag = "sandboxes", summary = "Create a sandbox",
    description = "Makes a sandbox and answers once it runs: its root from `image` (the server's default unless given), its limits, its network (off unless asked; `allow` through cordon's broker within this tenant's ceiling), environment variables every command gets, metadata to find it by, and how long it may run (`timeout_secs`, extended by `POST …/timeout`). It counts against this tenant's live sessions.",
    request_body(content = NewSandbox, example = json!({"timeout_secs": 600, "env": {"APP_ENV": "test"}, "metadata": {"user": "42"}})),
    responses((status = 201, body = SandboxView),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "A network beyond this tenant's ceiling, or an image it may not use", body = crate::http::ErrorResponse),
              (status = 429, description = "This tenant's live sessions and sandboxes are at their cap", body = crate::http::ErrorResponse),
              (status = 503, description = "The sandbox could not be made", body = crate::http::ErrorResponse)))]
pub(crate) async fn create_sandbox(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Response> {
    let body = crate::http::within(body, shared.config.body_limit)?;
    let asked: NewSandbox = read_json(&body)?;
    let (row, _) = make(&shared, &tenant, asked).await?;
    Ok((StatusCode::CREATED, Json(SandboxView::of(&row, true))).into_response())
}

/// Makes a sandbox of `tenant`'s as `asked`, running and registered,
/// with its record.
pub(crate) async fn make(
    shared: &Shared,
    tenant: &str,
    asked: NewSandbox,
) -> ApiResult<(SandboxRow, Arc<LiveBox>)> {
    let options = settle(shared, tenant, &asked).await?;
    let slot = shared.caps.acquire(tenant)?;
    start(shared, tenant, asked, options, slot, None).await
}

/// `asked` checked against the server's bounds, its network settled
/// within `tenant`'s ceiling, its image chosen: the options it runs with.
pub(crate) async fn settle(
    shared: &Shared,
    tenant: &str,
    asked: &NewSandbox,
) -> ApiResult<crate::job::RunOptions> {
    let mut options = asked
        .limits()
        .check(&shared.config.bounds)
        .map_err(ApiError::bad_request)?;
    asked.check()?;
    if let Some(spec) = &options.egress {
        let policy = shared
            .ceilings
            .settle(tenant, spec, crate::network::Empty::Ceiling)?;
        options.egress = Some(policy.into());
    }
    options.image = shared
        .images
        .choose(&shared.store, tenant, options.image.as_ref())
        .await?;
    Ok(options)
}

/// What a fork is made from (see [`fork`]).
pub(crate) struct Parent<'a> {
    pub id: &'a str,
    /// Its root's changes on its image, when it has an image: natively.
    pub root: Option<Arc<crate::catalog::ForkRoot>>,
    /// A copy of its writable disk: a microVM on an image.
    pub disk: Option<Arc<tempfile::TempPath>>,
}

/// Starts a sandbox of `tenant`'s with `options` (settled) in `slot`:
/// running, registered and recorded. A fork's root is its parent's.
pub(crate) async fn start(
    shared: &Shared,
    tenant: &str,
    asked: NewSandbox,
    options: crate::job::RunOptions,
    slot: crate::caps::Slot,
    parent: Option<&Parent<'_>>,
) -> ApiResult<(SandboxRow, Arc<LiveBox>)> {
    // A fork starts from its parent's state, never from a pool's.
    if parent.is_none()
        && let Some((new, sandbox)) = pooled(shared, tenant, &asked, &options).await?
    {
        let id = new.id.clone();
        let started = finish(shared, new, sandbox, &asked, options, slot, None).await;
        shared.pool.ended(&id);
        return started;
    }
    let (new, sc) = prepare(shared, tenant, &asked, &options, parent).await?;
    let id = new.id.clone();
    let backend = sc.backend;
    let created = cordon_sandbox::Sandbox::create(sc).await;
    shared.metrics.sandbox_started(backend, created.is_ok());
    let started = match created {
        Ok(sandbox) => {
            let parent = parent.map(|p| p.id);
            finish(shared, new, sandbox, &asked, options, slot, parent).await
        }
        Err(e) => {
            new.discard("a sandbox that did not start").await;
            Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "sandbox_error",
                format!("cannot create the sandbox: {e}"),
            ))
        }
    };
    // Its start is done: the next sandbox's workspace may be made ahead
    // now, not a second later (a client often creates the next at once).
    shared.pool.ended(&id);
    started
}

/// A sandbox of the warm pool for `tenant`'s new sandbox as `asked`, if
/// one of its shape is ready and made from the image `tenant` gets by its
/// name now: given what a sandbox made for it would have been made with
/// (its image's user and `asked.env`), with its id and workspace.
async fn pooled(
    shared: &Shared,
    tenant: &str,
    asked: &NewSandbox,
    options: &crate::job::RunOptions,
) -> ApiResult<Option<(Prepared, cordon_sandbox::Sandbox)>> {
    let kind = crate::pool::Kind::Sandbox;
    let Some(shape) = crate::pool::Shape::of(kind, options, None, shared.config.backend) else {
        return Ok(None);
    };
    let Some(taken) = shared.pool.take_now(&shape) else {
        return Ok(None);
    };
    let (account, layers) = match &options.image {
        None => (None, Vec::new()),
        Some(name) => match shared.images.ready(&shared.store, tenant, name).await {
            Ok(ready) if Some(ready.image.manifest.to_string().as_str()) == taken.digest() => {
                let layers = ready.root.layers.clone();
                (Some(ready.account), layers)
            }
            // Another image by that name now, or none: made as without
            // a pool, which says why if it cannot be.
            _ => {
                shared.pool.refuse(taken).await;
                return Ok(None);
            }
        },
    };
    let id = taken.id().to_string();
    let crate::pool::Pooled { sandbox, in_use } = shared.pool.accept(taken);
    let (account, env) = environment(account, sandbox.workdir(), asked);
    if let Err(e) = sandbox.set_env(&env) {
        // `asked.env` was checked with the request; an image user's name
        // or home the kernel cannot take is what is left.
        sandbox.close().await;
        drop(in_use);
        crate::files::remove_files(dir(shared, &id), "a pooled sandbox refused").await;
        return Err(ApiError::bad_request(e.to_string()));
    }
    let microvm = shape.backend == cordon_sandbox::BackendKind::Microvm;
    let new = Prepared {
        dir: dir(shared, &id),
        id,
        tenant: tenant.to_string(),
        in_use,
        account,
        layers,
        fork_root: None,
        microvm,
    };
    Ok(Some((new, sandbox)))
}

/// A sandbox on its way: its id, its workspace made, how it will run.
pub(crate) struct Prepared {
    pub id: String,
    pub tenant: String,
    pub in_use: cordon_sandbox::volume::InUse,
    pub account: cordon_image::root::Account,
    pub layers: Vec<std::path::PathBuf>,
    pub fork_root: Option<Arc<crate::catalog::ForkRoot>>,
    pub microvm: bool,
    dir: std::path::PathBuf,
}

impl Prepared {
    /// Its files removed: it never ran.
    pub(crate) async fn discard(self, what: &str) {
        let d = self.d();
        drop(self.in_use);
        crate::files::remove_files(d, what).await;
    }

    fn d(&self) -> std::path::PathBuf {
        self.dir.clone()
    }
}

/// A new id for a sandbox of `tenant`'s as `asked`, its (empty) workspace
/// made, and its configuration.
pub(crate) async fn prepare(
    shared: &Shared,
    tenant: &str,
    asked: &NewSandbox,
    options: &crate::job::RunOptions,
    parent: Option<&Parent<'_>>,
) -> ApiResult<(Prepared, cordon_sandbox::SandboxConfig)> {
    // Its workspace made ahead, if one is: entered below as it is.
    let (id, _) = shared
        .pool
        .workspace(crate::pool::Kind::Sandbox, options.disk);
    let d = dir(shared, &id);
    let ws = d.join("workspace");
    let in_use = {
        let (ws, defaults, disk) = (ws.clone(), shared.config.sandboxes(), options.disk);
        tokio::task::spawn_blocking(move || defaults.make_workspace(&ws, Some(disk)))
            .await
            .map_err(|e| unavailable(&id, "make its workspace", e))?
            .map_err(|e| unavailable(&id, "make its workspace", e))?
    };
    // Refused (an image that cannot be had): its workspace goes, so that
    // refusals asked for again and again leave nothing on the host.
    let Configured {
        sc,
        account,
        layers,
        fork_root,
    } = match configure(shared, tenant, &id, asked, options, parent).await {
        Ok(c) => c,
        Err(e) => {
            drop(in_use);
            crate::files::remove_files(d, "a sandbox refused").await;
            return Err(e);
        }
    };
    let microvm = sc.backend == cordon_sandbox::BackendKind::Microvm;
    Ok((
        Prepared {
            id,
            tenant: tenant.to_string(),
            in_use,
            account,
            layers,
            fork_root,
            microvm,
            dir: d,
        },
        sc,
    ))
}

/// Records and registers `sandbox`, made as `new` was prepared: its
/// label, its request (a microVM's kept beside it, see [`kept`]), its
/// row, its place in the registry.
pub(crate) async fn finish(
    shared: &Shared,
    new: Prepared,
    sandbox: cordon_sandbox::Sandbox,
    asked: &NewSandbox,
    options: crate::job::RunOptions,
    slot: crate::caps::Slot,
    forked_from: Option<&str>,
) -> ApiResult<(SandboxRow, Arc<LiveBox>)> {
    let (id, tenant) = (new.id.clone(), new.tenant.clone());
    let d = new.d();
    let _ = sandbox.set_label(&id);
    // The image as chosen now: the default may change before it is
    // taken up again.
    let to_keep = NewSandbox {
        image: options.image.clone(),
        ..asked.clone()
    };
    if new.microvm
        && let Err(e) = kept::record(&d, &to_keep)
    {
        tracing::warn!(
            "sandbox {id}: cannot record its request, so it cannot outlive this server: {e}"
        );
    }
    let timeout = Duration::from_secs(options.timeout_secs);
    let expires_ms = now_ms() + timeout.as_millis() as i64;
    let request = asked.stored(&options, forked_from);
    let metadata = serde_json::to_string(&asked.metadata).unwrap_or_else(|_| "{}".into());
    let row = match shared
        .store
        .insert_sandbox(&id, &tenant, expires_ms, &request, &metadata)
        .await
    {
        Ok(row) => row,
        Err(e) => {
            sandbox.close().await;
            new.discard("a sandbox that was not recorded").await;
            return Err(e.into());
        }
    };
    let live = register(
        shared,
        crate::boxes::Made {
            id: id.clone(),
            tenant: tenant.clone(),
            image: options.image.map(String::from),
            account: new.account,
            layers: new.layers,
            deadline: Instant::now() + timeout,
            timeout,
            on_timeout: asked.on_timeout,
            auto_resume: asked.auto_resume,
            public: asked.public,
            env: asked.env.clone(),
            fork_root: new.fork_root,
            left: None,
        },
        sandbox,
        slot,
        new.in_use,
    );
    tracing::info!("sandbox {id} of {tenant}: created");
    Ok((row, live))
}

/// A sandbox's configuration, and what comes with it.
pub(crate) struct Configured {
    pub sc: cordon_sandbox::SandboxConfig,
    pub account: cordon_image::root::Account,
    pub layers: Vec<std::path::PathBuf>,
    pub fork_root: Option<Arc<crate::catalog::ForkRoot>>,
}

/// How sandbox `id` of `tenant`'s runs, as `asked` with `options`
/// (settled): its root, its user, its environment; a microVM's state in
/// its directory, so that it may outlive this process (see [`kept`]).
pub(crate) async fn configure(
    shared: &Shared,
    tenant: &str,
    id: &str,
    asked: &NewSandbox,
    options: &crate::job::RunOptions,
    parent: Option<&Parent<'_>>,
) -> ApiResult<Configured> {
    let d = dir(shared, id);
    let ws = d.join("workspace");
    let fork_root = parent.and_then(|p| p.root.clone());
    let (image, account, layers) = match (&options.image, &fork_root) {
        (None, _) => (None, None, Vec::new()),
        (Some(_), Some(root)) => (
            Some(root.ready.root.clone()),
            Some(root.ready.account.clone()),
            root.ready.root.layers.clone(),
        ),
        (Some(name), None) => {
            let ready = shared
                .images
                .ready(&shared.store, tenant, name)
                .await
                .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, "image_unavailable", e))?;
            let layers = ready.root.layers.clone();
            (Some(ready.root), Some(ready.account), layers)
        }
    };
    let mut sc = shared.config.sandboxes().for_options(&ws, image, options);
    if let (Some(image), Some(disk)) = (&mut sc.image, parent.and_then(|p| p.disk.as_ref())) {
        image.upper_from = Some(disk.to_path_buf());
    }
    if sc.backend == cordon_sandbox::BackendKind::Microvm {
        sc.vm.state_dir = Some(d.join(crate::config::SANDBOX_VM_STATE));
    }
    let (account, env) = environment(account, &sc.workdir, asked);
    sc.env.extend(env);
    Ok(Configured {
        sc,
        account,
        layers,
        fork_root,
    })
}

/// The account commands run as, and the environment a sandbox as `asked`
/// adds to its image's: on an image, its user's, at home unless told
/// otherwise; on the host's root, which has neither, in `workdir`.
fn environment(
    account: Option<cordon_image::root::Account>,
    workdir: &str,
    asked: &NewSandbox,
) -> (cordon_image::root::Account, Vec<(String, String)>) {
    let mut env = Vec::new();
    let account = match account {
        Some(a) => {
            env.extend([
                ("HOME".to_string(), a.home.clone()),
                ("USER".to_string(), a.name.clone()),
                ("LOGNAME".to_string(), a.name.clone()),
            ]);
            a
        }
        None => cordon_image::root::Account {
            name: "user".into(),
            uid: 0,
            gid: 0,
            home: workdir.to_string(),
        },
    };
    env.extend(asked.env.clone());
    (account, env)
}

/// Registers a sandbox that runs (or was taken up paused): its network
/// policy listed, found by its id, sampled.
pub(crate) fn register(
    shared: &Shared,
    made: crate::boxes::Made,
    sandbox: cordon_sandbox::Sandbox,
    slot: crate::caps::Slot,
    in_use: cordon_sandbox::volume::InUse,
) -> Arc<LiveBox> {
    let id = made.id.clone();
    let policy = sandbox.network().map(|net| {
        shared
            .policies
            .list(Owner::Sandbox(id.clone()), net.policy.clone())
    });
    shared
        .sandboxes
        .insert(Owner::Sandbox(id.clone()), &sandbox);
    let live = Arc::new(LiveBox::new(made, sandbox, policy, slot, in_use));
    shared.boxes.insert(live.clone());
    live.sample();
    live
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}", tag = "sandboxes", summary = "A sandbox",
    params(("id" = String, Path)),
    responses((status = 200, body = SandboxView),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_sandbox(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxView>> {
    let row = find(&shared, &tenant, &id).await?;
    let live = shared.boxes.get(&tenant, &id);
    let paused = live.as_ref().is_some_and(|b| b.sandbox.is_paused());
    Ok(Json(SandboxView::of(&row, live.is_some()).paused(paused)))
}

/// `GET /v1/sandboxes`'s query: `metadata=key=value&…`, URL-encoded once
/// more, as the E2B API takes it.
#[derive(Debug, Default, serde::Deserialize, utoipa::IntoParams)]
#[serde(deny_unknown_fields)]
pub(crate) struct ListQuery {
    /// Only sandboxes whose metadata has every one of these `key=value`
    /// pairs, joined by `&` (and URL-encoded as one parameter).
    metadata: Option<String>,
}

#[utoipa::path(get, path = "/v1/sandboxes", tag = "sandboxes", summary = "This tenant's running sandboxes",
    params(ListQuery),
    responses((status = 200, body = SandboxList),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse)))]
pub(crate) async fn list_sandboxes(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> ApiResult<Json<SandboxList>> {
    let Query(q) = query.map_err(|e| ApiError::bad_request(e.body_text()))?;
    let wanted: BTreeMap<String, String> = match &q.metadata {
        None => BTreeMap::new(),
        Some(m) => form_urlencoded::parse(m.as_bytes())
            .map(|(k, v)| (k.into_owned(), v.into_owned()))
            .collect(),
    };
    let rows = shared.store.running_sandboxes(&tenant, LIST_MAX).await?;
    let sandboxes = rows
        .iter()
        .filter(|r| {
            let has: BTreeMap<String, String> =
                serde_json::from_str(&r.metadata).unwrap_or_default();
            wanted.iter().all(|(k, v)| has.get(k) == Some(v))
        })
        .map(|r| {
            let live = shared.boxes.get(&tenant, &r.id);
            let paused = live.as_ref().is_some_and(|b| b.sandbox.is_paused());
            SandboxView::of(r, live.is_some()).paused(paused)
        })
        .collect();
    Ok(Json(SandboxList { sandboxes }))
}

#[utoipa::path(delete, path = "/v1/sandboxes/{id}", tag = "sandboxes", summary = "End a sandbox",
    description = "Kills everything in it and removes its workspace; its record stays, ended. Deleting one that has ended already is no error.",
    params(("id" = String, Path)),
    responses((status = 204, description = "Ended"),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn delete_sandbox(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<StatusCode> {
    find(&shared, &tenant, &id).await?;
    if shared.boxes.get(&tenant, &id).is_some()
        && let Some(b) = shared.boxes.remove(&id)
    {
        end(&shared, b, ended::KILLED).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

#[utoipa::path(post, path = "/v1/sandboxes/{id}/timeout", tag = "sandboxes", summary = "Set how long a sandbox may still run",
    description = "From now: `timeout_secs` more seconds (1 up to the server's maximum), shorter or longer than what was left.",
    params(("id" = String, Path)),
    request_body(content = TimeoutChange, example = json!({"timeout_secs": 900})),
    responses((status = 200, body = SandboxView),
              (status = 400, description = "The request says what is wrong", body = crate::http::ErrorResponse),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse)))]
pub(crate) async fn set_sandbox_timeout(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<SandboxView>> {
    let body = crate::http::within(body, shared.config.body_limit)?;
    let change: TimeoutChange = read_json(&body)?;
    let max = shared.config.bounds.max_timeout_secs;
    if !(1..=max).contains(&change.timeout_secs) {
        return Err(ApiError::bad_request(format!(
            "`timeout_secs` must be a whole number of seconds from 1 to {max}"
        )));
    }
    let b = live(&shared, &tenant, &id).await?;
    let timeout = Duration::from_secs(change.timeout_secs);
    let expires_ms = now_ms() + timeout.as_millis() as i64;
    if !shared
        .store
        .extend_sandbox(&tenant, &id, expires_ms)
        .await?
    {
        return Err(gone(&find(&shared, &tenant, &id).await?));
    }
    b.set_deadline(Instant::now() + timeout);
    let row = find(&shared, &tenant, &id).await?;
    Ok(Json(SandboxView::of(&row, true)))
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/metrics", tag = "sandboxes", summary = "A sandbox's use of CPU, memory and disk",
    description = "Now, and every 5 seconds over the last hour: the CPU time of everything it ran (and its share of the machine's CPUs between samples), its processes, its memory (its cgroup's charge, or its microVM's kernel's) against its limit, and what its files grew by against its disk budget.",
    params(("id" = String, Path)),
    responses((status = 200, body = SandboxMetrics),
              (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended", body = crate::http::ErrorResponse)))]
pub(crate) async fn sandbox_metrics(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<SandboxMetrics>> {
    let b = live(&shared, &tenant, &id).await?;
    let now = b.sandbox.usage().await.map_err(|e| start_error(&id, e))?;
    let samples = b
        .samples(0, i64::MAX)
        .iter()
        .map(|s| UsageView::of(s.at_ms, &s.usage, Some(s.cpu_pct)))
        .collect();
    Ok(Json(SandboxMetrics {
        now: UsageView::of(now_ms(), &now, None),
        samples,
    }))
}

/// Ends a sandbox taken out of the registry: everything in it killed, its
/// workspace removed, its record ended with `reason`.
pub(crate) async fn end(shared: &Shared, b: Arc<LiveBox>, reason: &str) {
    let id = b.id.clone();
    shared.sandboxes.unlist(&Owner::Sandbox(id.clone()));
    // Recorded first: out of the registry it already reads as ended, and
    // its record must say why from that moment, not once it is closed.
    if let Err(e) = shared.store.end_sandbox(&id, reason).await {
        tracing::error!("sandbox {id}: cannot record its end: {e}");
    }
    b.sandbox.close().await;
    // Its processes' followers hold it a moment longer; the workspace's
    // volume is given back when the last one lets go.
    drop(b);
    crate::files::remove_files(dir(shared, &id), "an ended sandbox").await;
    tracing::info!("sandbox {id}: ended ({reason})");
}

/// Ends the sandboxes whose deadline has passed, or pauses those made
/// to pause then (ending one that cannot be paused).
pub async fn reap(shared: &Shared) {
    let (to_end, to_pause) = shared.boxes.take_expired(Instant::now());
    for b in to_end {
        end(shared, b, ended::TIMEOUT).await;
    }
    for b in to_pause {
        // Resumed, it runs its whole timeout again.
        match b.pause(Some(b.timeout)).await {
            Ok(()) => tracing::info!("sandbox {}: paused at its timeout", b.id),
            Err(e) => {
                tracing::warn!(
                    "sandbox {}: cannot pause at its timeout, so it ends: {e}",
                    b.id
                );
                if let Some(b) = shared.boxes.remove(&b.id) {
                    end(shared, b, ended::TIMEOUT).await;
                }
            }
        }
    }
}

/// Ends every sandbox (the server stops), but for those paused to disk,
/// which are kept for the next server (see [`kept`]).
pub async fn close_all(shared: &Shared) {
    for b in shared.boxes.take_all() {
        if kept::keep(shared, &b).await {
            continue;
        }
        end(shared, b, ended::STOPPED).await;
    }
}
