//! The server's life: open the store, settle what a previous run left
//! behind, start the workers, serve HTTP until told to stop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use cordon_agent::Cancel;

use crate::config::ServerConfig;
use crate::files::remove_tree;
use crate::job::{JobEvent, JobState};
use crate::state::Shared;
use crate::store::{NewEvent, Outcome, Store, StoreError};

/// Errors starting the server.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("the network ceiling: {0}")]
    Network(#[from] cordon_net::PolicyError),
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
}

impl Running {
    /// Stops accepting requests and waits for open ones to end. Jobs still
    /// running are left to the next start's recovery.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        let _ = self.serve.await;
    }
}

const RESTARTED: &str = "server restarted";

/// Jobs a previous server left `running` cannot be resumed: their sandbox
/// died with it. Each is failed with a reason and a final event.
async fn recover(shared: &Shared) -> Result<usize, StoreError> {
    let ids = shared.store.running_ids().await?;
    for id in &ids {
        let outcome = Outcome {
            state: JobState::Failed,
            exit_code: None,
            error: Some(RESTARTED.into()),
            result: None,
        };
        let event = NewEvent::from(JobEvent::Finished {
            state: JobState::Failed,
            exit_code: None,
            error: Some(RESTARTED.into()),
        });
        shared
            .store
            .finish(id, &[JobState::Running], &outcome, &event)
            .await?;
    }
    if !ids.is_empty() {
        tracing::warn!(
            "{} job(s) were running when the server stopped; marked failed",
            ids.len()
        );
    }
    Ok(ids.len())
}

/// Opens the store, recovers, starts the workers and serves.
pub async fn start(config: ServerConfig) -> Result<Running, ServeError> {
    let store = Store::open(&config.db).await?;
    let listen = config.listen;
    let (ceilings, warnings) =
        crate::network::Ceilings::expand(&config.network, &config.data_dir).await?;
    for w in warnings {
        tracing::warn!("network ceiling: {w}");
    }
    let shared = Arc::new(Shared::new(config, store, ceilings));
    recover(&shared).await?;
    for _ in 0..shared.config.workers.max(1) {
        tokio::spawn(worker(shared.clone()));
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
    let tcp = tokio::net::TcpListener::bind(listen)
        .await
        .map_err(|source| ServeError::Bind {
            addr: listen,
            source,
        })?;
    // Event streams write small frames long after the last request byte:
    // the listener sets TCP_NODELAY (with Nagle each `finished` event
    // waited a measured 20 ms for the client's delayed ACK).
    let listener =
        cordon_listen::Listener::new(tcp, shared.config.tls.clone()).map_err(|source| {
            ServeError::Bind {
                addr: listen,
                source,
            }
        })?;
    let addr = listener.local_addr();
    let scheme = listener.scheme();
    let app = crate::routes::router(shared.clone());
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let metrics_addr = match shared.config.metrics_listen {
        Some(at) => Some(serve_metrics(&shared, at, stopped.clone()).await?),
        None => None,
    };
    let serve = tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!("server: {e}");
        }
    });
    tracing::info!("listening on {scheme}://{addr}");
    Ok(Running {
        addr,
        metrics_addr,
        shared,
        stop,
        serve,
    })
}

/// Serves `/metrics` on `at`, plain HTTP without a token, until `stop`.
async fn serve_metrics(
    shared: &Arc<Shared>,
    at: SocketAddr,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> Result<SocketAddr, ServeError> {
    let bind = |source| ServeError::Bind { addr: at, source };
    let tcp = tokio::net::TcpListener::bind(at).await.map_err(bind)?;
    let listener = cordon_listen::Listener::new(tcp, None).map_err(bind)?;
    let addr = listener.local_addr();
    let app = crate::metrics::router(shared.clone());
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stop.wait_for(|s| *s).await;
        };
        if let Err(e) = axum::serve(listener, app)
            .with_graceful_shutdown(shutdown)
            .await
        {
            tracing::error!("metrics: {e}");
        }
    });
    tracing::info!("metrics on http://{addr}/metrics");
    Ok(addr)
}

/// Removes the workspaces of jobs that finished more than `keep` ago, and
/// records each removal. The workspace was the sandbox's: removal never
/// follows a link in it (std's `remove_dir_all` works descriptor-relative
/// with `O_NOFOLLOW`), and directories it made unwritable to their owner
/// are given their owner's bits back first. Removed first, recorded after:
/// a server stopped in between removes (nothing) and records next time.
async fn remove_expired_workspaces(shared: &Arc<Shared>, keep: Duration) {
    let before = crate::store::now_ms().saturating_sub(keep.as_millis() as i64);
    let ids = match shared.store.expired_workspaces(before, 100).await {
        Ok(ids) => ids,
        Err(e) => {
            tracing::warn!("cannot list expired job workspaces: {e}");
            return;
        }
    };
    for id in ids {
        // Ids are the server's own; anything else is not a path to join.
        if id.is_empty()
            || !id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
        {
            continue;
        }
        let dir = shared.config.job_dirs().workspace(&id);
        let removed = tokio::task::spawn_blocking(move || remove_tree(&dir)).await;
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

/// Takes queued jobs in order and runs them, one at a time per worker.
async fn worker(shared: Arc<Shared>) {
    loop {
        // Registered before looking at the queue, so a job queued between
        // the look and the wait still wakes this worker.
        let notified = shared.wake.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        let claimed = {
            let _turn = shared.claim.lock().await;
            shared.store.claim(shared.config.per_tenant).await
        };
        match claimed {
            Ok(Some(job)) => {
                let cancel = Cancel::new();
                shared
                    .running
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(job.id.clone(), cancel.clone());
                let id = job.id.clone();
                shared.metrics.lease_taken();
                shared.runner.run(job, cancel).await;
                shared.metrics.lease_ended();
                shared
                    .running
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .remove(&id);
                // A slot freed: a job held back by its tenant's limit may go.
                shared.wake.notify_waiters();
            }
            Ok(None) => {
                // Woken by a new job, or polling for jobs queued by another
                // process sharing the database.
                let _ = tokio::time::timeout(Duration::from_secs(1), notified).await;
            }
            Err(e) => {
                tracing::error!("cannot take a job from the queue: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}
