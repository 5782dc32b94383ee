//! A session brought to life for an operation: its sandbox over the
//! workspace, its agent with the history and log, within its tenant's
//! ceiling and slots as they are now; and the one-at-a-time hold on it.

use std::sync::Arc;
use std::time::Instant;

use axum::http::StatusCode;
use cordon_agent::log::LogError;
use cordon_agent::sessions::SessionError;
use cordon_agent::{AgentConfig, Instructions, Opening, SessionRecord};
use cordon_sandbox::Sandbox;
use tokio::sync::OwnedMutexGuard;

use super::network::logged_network;
use super::{dir, no_model, started_display};
use crate::http::ApiError;
use crate::live::Live;
use crate::owner::Owner;
use crate::state::Shared;
use crate::store::SessionRow;

/// Takes a session for one operation: 409 while another runs.
pub(crate) async fn take(
    shared: &Shared,
    row: &SessionRow,
) -> Result<OwnedMutexGuard<Option<Live>>, ApiError> {
    let slot = shared.sessions.slot(&row.id);
    let guard = slot.try_lock_owned().map_err(|_| {
        ApiError::new(
            StatusCode::CONFLICT,
            "busy",
            "a turn is already running in this session; wait for it or cancel it",
        )
    })?;
    woken(shared, row, guard).await
}

/// Takes a session whose slot may be held a moment (being woken, or
/// closed after idling): waits for it up to `wait`.
pub(crate) async fn take_waiting(
    shared: &Shared,
    row: &SessionRow,
    wait: std::time::Duration,
) -> Result<OwnedMutexGuard<Option<Live>>, ApiError> {
    let slot = shared.sessions.slot(&row.id);
    let guard = tokio::time::timeout(wait, slot.lock_owned())
        .await
        .map_err(|_| {
            ApiError::new(
                StatusCode::CONFLICT,
                "busy",
                "the session is busy; try again",
            )
        })?;
    woken(shared, row, guard).await
}

/// `guard`'s session, woken if it was not live.
async fn woken(
    shared: &Shared,
    row: &SessionRow,
    mut guard: OwnedMutexGuard<Option<Live>>,
) -> Result<OwnedMutexGuard<Option<Live>>, ApiError> {
    if guard.is_none() {
        // Waking makes it live: a slot first, or 429.
        let slot = shared.caps.acquire(&row.tenant)?;
        *guard = Some(wake(shared, row, slot).await?);
    }
    if let Some(live) = guard.as_ref()
        && live.talk.sandbox().is_paused()
    {
        // Taken to be used: a paused session goes on where it was.
        live.talk.sandbox().resume().await.map_err(|e| {
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                format!("session {}: cannot resume its sandbox: {e}", row.id),
            )
        })?;
        tracing::info!("session {}: resumed", row.id);
    }
    Ok(guard)
}

/// Brings a session to life: a sandbox over its workspace and an agent
/// with its history and log.
async fn wake(
    shared: &Shared,
    row: &SessionRow,
    slot: crate::caps::Slot,
) -> Result<Live, ApiError> {
    let defaults = shared.config.agent.as_ref().ok_or_else(no_model)?;
    let d = dir(shared, &row.id);
    if super::lives_elsewhere(shared, &row.id) {
        // Made by another API process of the deployment, which keeps it.
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "elsewhere",
            format!(
                "session {} lives on the API process of this deployment that made it: send its \
                 requests there (see the deployment guide on sticky routing)",
                row.id
            ),
        ));
    }
    let log = d.join("session.jsonl");
    let resumed = super::open_log(
        || std::future::ready(cordon_agent::sessions::open(&log)),
        |e| matches!(e, SessionError::Log(LogError::Busy(_))),
    )
    .await
    .map_err(|e| {
        tracing::error!("session {}: {e}", row.id);
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "cannot open the session's log",
        )
    })?;
    let ws = d.join("workspace");
    // Mounted (if a volume) while the session lives.
    let in_use = shared.config.enter_workspace(&ws).await.map_err(|e| {
        tracing::error!("session {}: {e}", row.id);
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "cannot open the session's workspace",
        )
    })?;
    let records = match cordon_agent::log::load::<SessionRecord>(&log) {
        Ok((records, _)) => records,
        Err(_) => Vec::new(),
    };
    // The image it was created with, still offered to its tenant, and its
    // digest.
    let (image, digest) = match super::started(records.iter().map(|r| &r.data))
        .and_then(|s| s.image.clone())
        .map(crate::job::ImageName::try_from)
    {
        None => (None, None),
        Some(Err(e)) => {
            tracing::error!("session {}: its image: {e}", row.id);
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                "cannot read the session's image",
            ));
        }
        Some(Ok(name)) => {
            let ready = shared
                .images
                .ready(&shared.store, &row.tenant, &name)
                .await
                .map_err(|e| ApiError::new(StatusCode::BAD_GATEWAY, "image_unavailable", e))?;
            (Some(ready.root), Some(ready.image.manifest.to_string()))
        }
    };
    let mut sc = shared.config.sandbox(&ws, image);
    sc.display = started_display(records.iter().map(|r| &r.data));
    let (network, policy) = logged_network(records.iter().map(|r| &r.data));
    // Within the ceiling as it is now: the operator may have lowered it.
    let policy = policy.map(|p| {
        let ceiling = &shared.ceilings.of(&row.tenant);
        let clamped = p.clamped_to(ceiling);
        if clamped != p {
            tracing::warn!(
                "session {}: beyond its tenant's ceiling, dropped: {}",
                row.id,
                p.beyond(ceiling).join(", ")
            );
        }
        clamped
    });
    // The session's repository, reached with the tenant's login as it is
    // now, within the ceiling as it is now.
    let repository = match records.iter().find_map(|r| r.data.repository()) {
        None => None,
        Some(rec) => Some(
            crate::repos::session(
                &shared.store,
                &shared.ceilings.of(&row.tenant),
                &row.tenant,
                rec.cloned(),
                rec.allow_push,
            )
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::FORBIDDEN,
                    "beyond_ceiling",
                    format!("the session's repository: {e}"),
                )
            })?,
        ),
    };
    sc.network = shared.config.sandboxes().network(network);
    sc.egress = policy
        .as_ref()
        .map(|p| cordon_sandbox::Egress::new(p.clone().into()));
    let workdir = sc.workdir.clone();
    // Its first wake takes the sandbox the pool made with its workspace,
    // if it was made so and is still kept: the same sandbox as `sc`, as
    // its shape was this session's (no policy, no display).
    let pooled = (sc.egress.is_none() && sc.display.is_none())
        .then(|| shared.pool.claim(&row.id, digest.as_deref()))
        .flatten();
    let sandbox = match pooled {
        Some(p) => {
            // The workspace stays entered by `in_use`.
            tokio::task::spawn_blocking(move || drop(p.in_use));
            p.sandbox
        }
        None => {
            let backend = sc.backend;
            let created = Sandbox::create(sc).await;
            shared.metrics.sandbox_started(backend, created.is_ok());
            created.map_err(|e| {
                tracing::error!("session {}: {e}", row.id);
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "sandbox_error",
                    format!("cannot create the sandbox: {e}"),
                )
            })?
        }
    };
    shared
        .sandboxes
        .insert(Owner::Session(row.id.clone()), &sandbox);
    // MCP servers that fail are logged: the session goes on without them.
    let id = row.id.clone();
    let opened = Opening::new(
        &defaults.provider,
        AgentConfig {
            model: row.model.clone(),
            ..defaults.agent.clone()
        },
    )
    .mcp(
        &shared.config.mcp_servers,
        Arc::new(move |m: String| tracing::warn!("session {id}: {m}")),
    )
    .tools(&repository.map(|r| r.tools()).unwrap_or_default())
    .instructions(Instructions::read(None, &ws, &workdir))
    .previews(
        shared
            .config
            .sandboxes()
            .agent_previews(&Owner::Session(row.id.clone())),
    )
    .open(sandbox, &ws, resumed.history, Some(resumed.log))
    .await;
    let talk = match opened {
        Ok(t) => t,
        Err(e) => {
            shared.sandboxes.unlist(&Owner::Session(row.id.clone()));
            return Err(ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "unavailable",
                e.to_string(),
            ));
        }
    };
    talk.label(&row.id);
    let _policy = talk.sandbox().network().map(|net| {
        shared
            .policies
            .list(Owner::Session(row.id.clone()), net.policy.clone())
    });
    Ok(Live {
        talk,
        last_used: Instant::now(),
        _policy,
        _slot: slot,
        _in_use: in_use,
    })
}
