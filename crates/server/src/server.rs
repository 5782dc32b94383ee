//! The server's life: open the store, settle what a previous run left
//! behind, start the workers, serve HTTP until told to stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use crate::config::ServerConfig;
use crate::files::remove_tree;
use crate::state::Shared;
use crate::store::{Store, StoreError};

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the network ceiling: {0}")]
    Network(#[from] cordon_net::PolicyError),
    #[error(transparent)]
    Archive(#[from] crate::archive::ArchiveError),
    #[error("the image catalog: {0}")]
    Images(String),
    #[error("the warm pools: {0}")]
    Pool(String),
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A started server; dropping it does not stop it, [`Running::shutdown`] does.
pub struct Running {
    pub addr: SocketAddr,
    /// Where `/metrics` is served, if it is.
    pub metrics_addr: Option<SocketAddr>,
    pub shared: Arc<Shared>,
    stop: tokio::sync::watch::Sender<bool>,
    serve: tokio::task::JoinHandle<()>,
    /// Keeps the warm pools; ends once it closed their sandboxes.
    pool: tokio::task::JoinHandle<()>,
}

impl Running {
    /// Stops as a rollout wants it: takes no more jobs, gives the ones
    /// running `grace` (`ServerConfig::grace`) to finish while the API
    /// still answers (their events, their files), then cancels the rest,
    /// recorded as `cancelled` with the reason, and waits for their
    /// sandboxes to close: the next start finds nothing half-done. Then
    /// it stops accepting requests and waits for open ones to end. The
    /// workspaces' volumes are unmounted (a sandbox still running keeps
    /// its own until it ends), so the data directory is plain files.
    pub async fn shutdown(self) -> Stopped {
        let shared = &self.shared;
        shared.stopping.cancel();
        let running = || {
            shared
                .running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .len()
        };
        let at_first = running();
        let grace = shared.config.grace;
        let deadline = tokio::time::Instant::now() + grace;
        while running() > 0
            && tokio::time::Instant::now() < deadline
            && !shared.hurried.is_cancelled()
        {
            tokio::time::sleep(STOP_POLL).await;
        }
        let cut = running();
        if cut > 0 {
            let _ = shared.cut_short.set(format!(
                "the server was stopped, and the job did not finish within its grace period of {}",
                humantime::format_duration(grace)
            ));
            for (id, (cancel, _)) in shared
                .running
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .iter()
            {
                tracing::info!(job = %id, "cancelled: the server is stopping");
                cancel.cancel();
            }
            let deadline = tokio::time::Instant::now() + CANCEL_WAIT;
            while running() > 0 && tokio::time::Instant::now() < deadline {
                tokio::time::sleep(STOP_POLL).await;
            }
        }
        let _ = self.stop.send(true);
        let _ = self.serve.await;
        shared
            .sessions
            .close_all(CANCEL_WAIT, &shared.sandboxes)
            .await;
        crate::sandbox_api::close_all(shared).await;
        let _ = self.pool.await;
        let data = shared.config.data_dir.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if let Err(e) = cordon_sandbox::volume::unmount_beneath(&data) {
                tracing::warn!("cannot unmount the workspaces' volumes: {e}");
            }
        })
        .await;
        Stopped {
            finished: at_first - cut,
            cancelled: cut,
        }
    }

    /// How many jobs this process runs now.
    pub fn running_jobs(&self) -> usize {
        self.shared
            .running
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

/// What a shutdown did with the jobs it found running.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stopped {
    /// Those that ended within the grace period.
    pub finished: usize,
    /// Those cancelled when it was over.
    pub cancelled: usize,
}

/// How often a shutdown looks whether the running jobs have ended.
const STOP_POLL: Duration = Duration::from_millis(50);
/// How long a shutdown waits for cancelled jobs to record their end and
/// close their sandboxes.
const CANCEL_WAIT: Duration = Duration::from_secs(15);

/// What this process seals tenants' secrets with: the operator's key, or
/// one every process of its cluster derives alike, or, for a server on its
/// own, the one it keeps in its data directory.
fn secrets_key(config: &ServerConfig) -> Result<crate::store::Keyring, StoreError> {
    let (key, whence) = match (&config.secrets_key, &config.cluster) {
        (Some(k), _) => (k.clone(), "CORDON_SECRETS_KEY".to_string()),
        (None, Some(c)) => (c.key.secrets_key(), "the cluster key".to_string()),
        (None, None) => {
            std::os::unix::fs::DirBuilderExt::mode(
                std::fs::DirBuilder::new().recursive(true),
                0o700,
            )
            .create(&config.data_dir)
            .map_err(|e| {
                StoreError::Invalid(format!("cannot make {}: {e}", config.data_dir.display()))
            })?;
            let path = config.data_dir.join("secrets.key");
            let key = crate::store::SecretsKey::load_or_create(&path)?;
            (key, path.display().to_string())
        }
    };
    tracing::info!(
        "tenants' secrets are sealed with key {} from {whence}",
        key.id()
    );
    Ok(crate::store::Keyring::new(
        key,
        config.previous_secrets_keys.clone(),
    ))
}

/// Opens the store, recovers, starts the workers and serves.
pub async fn start(mut config: ServerConfig) -> Result<Running, ServeError> {
    let secrets = secrets_key(&config)?;
    let store = Store::open(&config.db).await?.with_secrets(secrets);
    // Bound first: what the server tells of itself (a preview's address)
    // has the port it really has, `:0` asked or not.
    let at = config.listen;
    let tcp = tokio::net::TcpListener::bind(at)
        .await
        .map_err(|source| ServeError::Bind { addr: at, source })?;
    config.listen = tcp
        .local_addr()
        .map_err(|source| ServeError::Bind { addr: at, source })?;
    let (ceilings, warnings) = crate::network::Ceilings::expand(
        &config.network,
        config.preset_env.as_ref(),
        &config.data_dir,
    )
    .await?;
    for w in warnings {
        tracing::warn!("network ceiling: {w}");
    }
    let worker = crate::worker::worker_id(&config.data_dir).map_err(|e| {
        StoreError::Invalid(format!(
            "cannot keep a worker id in {}: {e}",
            config.data_dir.display()
        ))
    })?;
    let archive = match &config.archive {
        Some(url) => {
            let archive = crate::archive::Archive::open(url)?;
            archive.probe(&worker).await?;
            tracing::info!("finished jobs are kept in {url}");
            Some(Arc::new(archive))
        }
        None => None,
    };
    let images = crate::catalog::Images::open(
        config.images.clone(),
        config
            .image_store
            .clone()
            .or_else(cordon_image::store::default_root)
            .as_deref(),
    )
    .map_err(ServeError::Images)?
    .with_archive(archive.clone());
    let shared = Arc::new(
        Shared::new(config, store, ceilings, images, worker, archive).map_err(ServeError::Pool)?,
    );
    if let Some(url) = shared
        .config
        .cluster
        .as_ref()
        .and_then(|c| c.advertise.as_ref())
    {
        shared.store.advertise(&shared.worker, url).await?;
        tracing::info!("relayed requests reach worker {} at {url}", shared.worker);
    }
    let data = shared.config.data_dir.clone();
    let _ = tokio::task::spawn_blocking(move || crate::files::ready_volumes(&data)).await;
    let settled = crate::worker::recover(&shared).await?;
    if settled > 0 {
        tracing::warn!("{settled} job(s) were running when this server stopped; settled");
    }
    crate::worker::start(&shared);
    let pool = tokio::spawn(shared.pool.clone().run(shared.stopping.clone()));
    if shared.config.api && shared.config.cluster.is_none() {
        // Alone, this process made every sandbox the database calls
        // running: the last one's stop (or crash) ended them, but for
        // those paused to disk.
        crate::sandbox_api::kept::recover(&shared).await;
    }
    {
        // A sandbox ends within a second of its deadline.
        let weak = Arc::downgrade(&shared);
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(1)).await;
                let Some(shared) = weak.upgrade() else {
                    break;
                };
                crate::sandbox_api::reap(&shared).await;
            }
        });
    }
    let reaper = Arc::downgrade(&shared);
    // Often enough that a session closes close to its idle limit.
    let every =
        (shared.config.session_idle / 2).clamp(Duration::from_millis(100), Duration::from_secs(5));
    tokio::spawn(async move {
        loop {
            tokio::time::sleep(every).await;
            let Some(shared) = reaper.upgrade() else {
                break;
            };
            shared
                .sessions
                .reap(shared.config.session_idle, &shared.sandboxes)
                .await;
        }
    });
    {
        // The one place presets are expanded after the start: a request
        // never starts a tool.
        let weak = Arc::downgrade(&shared);
        let every = shared.config.preset_check;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = weak.upgrade() else {
                    break;
                };
                shared.ceilings.refresh_if_changed().await;
            }
        });
    }
    {
        let weak = Arc::downgrade(&shared);
        let after = shared.config.orphans_after;
        let every = (after / 2).clamp(Duration::from_millis(100), Duration::from_secs(60));
        tokio::spawn(async move {
            let mut cursor = None;
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = weak.upgrade() else {
                    break;
                };
                remove_orphaned_jobs(&shared, after, &mut cursor).await;
            }
        });
    }
    {
        // A tenant's deleted images, and layers nothing names, go once
        // their grace has passed.
        let weak = Arc::downgrade(&shared);
        let grace = shared
            .images
            .catalog()
            .grace
            .unwrap_or(crate::catalog::DEFAULT_GRACE);
        let every = (grace / 4).clamp(Duration::from_millis(100), Duration::from_secs(600));
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(every).await;
                let Some(shared) = weak.upgrade() else {
                    break;
                };
                match shared.images.collect(&shared.store).await {
                    Ok(0) => {}
                    Ok(freed) => tracing::info!("images: {freed} bytes no image uses removed"),
                    Err(e) => tracing::warn!("images: collection failed: {e}"),
                }
            }
        });
    }
    if let Some(keep) = shared.config.keep_workspaces {
        let weak = Arc::downgrade(&shared);
        let every = (keep / 10).clamp(Duration::from_millis(100), Duration::from_secs(60));
        tokio::spawn(async move {
            loop {
                let Some(shared) = weak.upgrade() else {
                    break;
                };
                remove_expired_workspaces(&shared, keep).await;
                drop(shared);
                tokio::time::sleep(every).await;
            }
        });
    }
    let app = if shared.config.api {
        crate::routes::router(shared.clone())
    } else {
        crate::routes::worker_router(shared.clone())
    };
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let metrics_addr = match shared.config.metrics_listen {
        Some(at) => {
            let app = metrics_router(shared.clone());
            let bind = |source| ServeError::Bind { addr: at, source };
            let tcp = tokio::net::TcpListener::bind(at).await.map_err(bind)?;
            let (addr, _) = serve_on(tcp, None, app, stopped.clone())?;
            tracing::info!("metrics on http://{addr}/metrics");
            Some(addr)
        }
        None => None,
    };
    let (addr, serve) = serve_on(tcp, shared.config.tls.clone(), app, stopped)?;
    let scheme = if shared.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    tracing::info!("listening on {scheme}://{addr}");
    Ok(Running {
        addr,
        metrics_addr,
        shared,
        stop,
        serve,
        pool,
    })
}

/// Serves `app` on `tcp` (over TLS with `tls`) until `stop`; answers the
/// bound address and the serving task. The listener sets
/// TCP_NODELAY: event streams write small frames long after the last
/// request byte, and with Nagle each `finished` event waited a measured
/// 20 ms for the client's delayed ACK.
fn serve_on(
    tcp: tokio::net::TcpListener,
    tls: Option<cordon_listen::Tls>,
    app: axum::Router,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<(SocketAddr, tokio::task::JoinHandle<()>), ServeError> {
    let at = tcp
        .local_addr()
        .unwrap_or_else(|_| SocketAddr::from(([0, 0, 0, 0], 0)));
    let bind = |source| ServeError::Bind { addr: at, source };
    let listener = cordon_listen::Listener::new(tcp, tls).map_err(bind)?;
    let addr = listener.local_addr();
    let task = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        let app = app.into_make_service_with_connect_info::<cordon_listen::Peer>();
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!("serving on {addr}: {e}");
        }
    });
    Ok((addr, task))
}

/// Removes the workspaces of jobs that finished more than `keep` ago (on
/// this machine and in the archive), and records each removal. The
/// workspace was the sandbox's: removal never follows a link in it (std's
/// `remove_dir_all` works descriptor-relative with `O_NOFOLLOW`), and
/// directories it made unwritable to their owner are given their owner's
/// bits back first. Removed first, recorded after:
/// a server stopped in between removes (nothing) and records next time.
async fn remove_expired_workspaces(shared: &Arc<Shared>, keep: Duration) {
    let before = crate::store::now_ms().saturating_sub(keep.as_millis() as i64);
    // Split across machines, a job's workspace is on its worker: an API
    // process recording another's removal would leave it there for ever.
    let only = shared
        .config
        .cluster
        .as_ref()
        .map(|_| shared.worker.as_str());
    let ids = match shared.store.expired_workspaces(before, 100, only).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!("cannot list expired job workspaces: {e}");
            return;
        }
    };
    for id in ids {
        // Ids are the server's own; anything else is not a path to join.
        if !crate::http::plausible_id(&id) {
            continue;
        }
        if let Some(archive) = &shared.archive
            && let Err(e) = archive.forget(&id).await
        {
            tracing::warn!("cannot remove job {id} from the archive: {e}");
            continue;
        }
        let dirs = shared.config.job_dirs();
        let (dir, checkpoints) = (dirs.workspace(&id), dirs.checkpoints(&id));
        let removed = tokio::task::spawn_blocking(move || {
            remove_tree(&checkpoints).and_then(|()| remove_tree(&dir))
        })
        .await;
        match removed {
            Ok(Ok(())) => {
                if let Err(e) = shared.store.workspace_removed(&id).await {
                    tracing::warn!("cannot record that job {id}'s workspace was removed: {e}");
                }
            }
            Ok(Err(e)) => tracing::warn!("cannot remove job {id}'s workspace: {e}"),
            Err(e) => tracing::warn!("cannot remove job {id}'s workspace: {e}"),
        }
    }
}

/// Job directories looked up per sweep (each is one lookup by key).
const ORPHANS_PER_SWEEP: usize = 256;

/// Removes the directories of jobs that are gone from the database: a job
/// deleted through another process of a deployment (its record, events
/// and archive copy go there) leaves its files on the worker that ran it,
/// and the expiry sweep goes by the record. A directory younger than
/// `after` is left alone (a job's is made a moment before its record).
/// Each sweep looks at the next few names after `cursor`, in order.
async fn remove_orphaned_jobs(shared: &Shared, after: Duration, cursor: &mut Option<String>) {
    let dirs = shared.config.job_dirs();
    let (root, from) = (dirs.root().to_path_buf(), cursor.clone());
    let listed = tokio::task::spawn_blocking(move || old_job_dirs(&root, from, after))
        .await
        .unwrap_or_else(|e| Err(std::io::Error::other(e)));
    let old = match listed {
        Ok((old, next)) => {
            *cursor = next;
            old
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
        Err(e) => {
            tracing::warn!("cannot list the job directories: {e}");
            return;
        }
    };
    for id in old {
        if shared.pool.holds(&id) {
            continue;
        }
        match shared.store.job_exists(&id).await {
            Ok(true) => {}
            Ok(false) => {
                tracing::info!(job = %id, "removing the files of a job that is gone");
                crate::files::remove_files(dirs.job(&id), &format!("job {id}")).await;
            }
            Err(e) => {
                tracing::warn!("cannot look up job {id}: {e}");
                return;
            }
        }
    }
}

/// The file system's part of a sweep: of the job directories in `root`,
/// the next [`ORPHANS_PER_SWEEP`] names after `from` in order, those at
/// least `after` old; and the last name looked at, where the next sweep
/// goes on.
fn old_job_dirs(
    root: &std::path::Path,
    from: Option<String>,
    after: Duration,
) -> std::io::Result<(Vec<String>, Option<String>)> {
    let mut names = Vec::new();
    for entry in std::fs::read_dir(root)? {
        let entry = entry?;
        // Names are the server's own job ids; anything else is not ours.
        if let Some(name) = entry
            .file_name()
            .to_str()
            .filter(|n| n.starts_with("job_") && crate::http::plausible_id(n))
        {
            names.push(name.to_string());
        }
    }
    names.sort_unstable();
    let start = from.map_or(0, |c| names.partition_point(|n| *n <= c));
    let batch = &names[start..names.len().min(start + ORPHANS_PER_SWEEP)];
    let old = batch
        .iter()
        .filter(|id| {
            std::fs::symlink_metadata(root.join(id))
                .and_then(|m| m.modified())
                .ok()
                .and_then(|t| t.elapsed().ok())
                .is_some_and(|age| age >= after)
        })
        .cloned()
        .collect();
    Ok((old, batch.last().cloned()))
}

/// The metrics listener's routes: `/metrics`, and `/health` for probes.
fn metrics_router(shared: Arc<Shared>) -> axum::Router {
    axum::Router::new()
        .route("/metrics", axum::routing::get(scrape))
        .route("/health", axum::routing::get(|| async { "ok" }))
        .with_state(shared)
}

async fn scrape(
    axum::extract::State(shared): axum::extract::State<Arc<Shared>>,
) -> axum::response::Response {
    use axum::response::IntoResponse;
    match shared.metrics.render(&shared.store).await {
        Ok(text) => (
            [(
                axum::http::header::CONTENT_TYPE,
                "application/openmetrics-text; version=1.0.0; charset=utf-8",
            )],
            text,
        )
            .into_response(),
        Err(e) => {
            tracing::warn!("metrics: {e}");
            (
                axum::http::StatusCode::SERVICE_UNAVAILABLE,
                "the database did not answer\n",
            )
                .into_response()
        }
    }
}
