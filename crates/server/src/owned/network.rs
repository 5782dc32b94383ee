//! An owner's network policy: what it was made with, and what its broker
//! applies now, which the API may replace within the tenant's ceiling. A
//! running job's change is a `network_policy` event; a live session's
//! agent logs it, and an idle session's log gets the record its next
//! sandbox starts from.

use std::sync::Arc;
use std::time::Instant;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use cordon_agent::{SessionLog, SessionRecord};
use cordon_net::Policy;
use cordon_sandbox::Network;

use super::{Found, find};
use crate::http::{ApiError, ApiResult, Tenant};
use crate::network::{Empty, NetworkView, parse_change, stored_policy};
use crate::owner::Owner;
use crate::state::Shared;
use crate::store::{NewEvent, SessionRow};

/// An owner's network as it was made, or (a session's) as its log last
/// left it: the mode and, with `allow`, the rules.
fn made_with(shared: &Shared, found: &Found) -> ApiResult<(Network, Option<Policy>)> {
    Ok(match found {
        Found::Job(job) => match job
            .request
            .as_ref()
            .map(|r| r.limits().check(&shared.config.bounds))
        {
            Ok(Ok(options)) => (
                options.network.into(),
                options.egress.as_ref().and_then(stored_policy),
            ),
            _ => (Network::Off, None),
        },
        Found::Session(row) => {
            let records = crate::sessions::read_log(shared, &row.id)?;
            crate::sessions::logged_network(records.iter())
        }
        Found::Sandbox(row) => crate::sandbox_api::network_of(row),
    })
}

async fn view(shared: &Shared, tenant: &str, owner: &Owner) -> ApiResult<Json<NetworkView>> {
    let found = find(shared, tenant, owner).await?;
    let (network, made) = made_with(shared, &found)?;
    let live = shared.policies.get(owner);
    let policy = live.as_ref().map(|h| (*h.load()).clone()).or(made);
    Ok(Json(NetworkView::new(
        network,
        policy.as_ref(),
        live.is_some(),
        &shared.ceilings.of(tenant),
    )))
}

async fn change(
    shared: &Shared,
    tenant: &str,
    owner: &Owner,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<NetworkView>> {
    let found = find(shared, tenant, owner).await?;
    let change = parse_change(&crate::http::within(body, shared.config.body_limit)?)?;
    let (network, made) = made_with(shared, &found)?;
    if network != Network::Allow {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "not_brokered",
            format!(
                "{owner}'s network is {network:?}, not brokered: make it with `network` \
                 \"allow\" to change what it reaches"
            ),
        ));
    }
    let policy = shared.ceilings.settle(tenant, &change, Empty::Nothing)?;
    let live = match found {
        Found::Job(job) => {
            let Some(handle) = shared.policies.get(owner) else {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "not_running",
                    format!("{owner} is not running; a job's network changes only while it runs"),
                ));
            };
            let before = handle.set(policy.clone());
            let record = cordon_agent::PolicyRecord::between(&before, &policy);
            let event = NewEvent::from(crate::job::JobEvent::NetworkPolicy(
                crate::job::PolicyChanged(record),
            ));
            match shared.store.append(&job.id, None, &[event], None).await {
                Ok(stored) => shared.hub.publish(&job.id, &stored),
                Err(e) => tracing::error!(job = %job.id, "cannot record a policy change: {e}"),
            }
            true
        }
        Found::Session(row) => change_session(shared, &row, &policy, made).await?,
        Found::Sandbox(_) => {
            let Some(handle) = shared.policies.get(owner) else {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "not_running",
                    format!("{owner} has ended"),
                ));
            };
            handle.set(policy.clone());
            true
        }
    };
    Ok(Json(NetworkView::new(
        network,
        Some(&policy),
        live,
        &shared.ceilings.of(tenant),
    )))
}

/// A session's change: at once if it is live (even mid-turn: its agent
/// records it), else a record in its log. Whether it was live.
async fn change_session(
    shared: &Shared,
    row: &SessionRow,
    policy: &Policy,
    logged: Option<Policy>,
) -> ApiResult<bool> {
    let id = &row.id;
    // Held, it cannot be reaped meanwhile; busy, a turn is running (or the
    // session is waking, and not listed yet).
    let slot = shared.sessions.slot(id);
    let guard = match slot.try_lock_owned() {
        Ok(mut guard) => {
            if let Some(live) = guard.as_mut() {
                live.last_used = Instant::now();
            }
            Some(guard)
        }
        Err(_) => None,
    };
    if let Some(handle) = shared.policies.get(&Owner::Session(id.clone())) {
        handle.set(policy.clone());
        return Ok(true);
    }
    if guard.is_none() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "busy",
            "the session is waking; try again in a moment",
        ));
    }
    // Idle: nothing else writes its log while the slot is held.
    let before = logged.unwrap_or_default();
    let record = cordon_agent::PolicyRecord::between(&before, policy);
    let path = crate::sessions::dir(shared, id).join("session.jsonl");
    let appended = crate::sessions::open_log(
        || std::future::ready(SessionLog::<SessionRecord>::open(&path)),
        |e| matches!(e, cordon_agent::log::LogError::Busy(_)),
    )
    .await
    .and_then(|(mut log, _, _)| {
        log.append(&SessionRecord::NetworkPolicy(record))?;
        log.sync()
    });
    appended.map_err(|e| {
        tracing::error!("session {id}: {e}");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            "cannot record the change in the session's log",
        )
    })?;
    Ok(false)
}

#[utoipa::path(get, path = "/v1/jobs/{id}/network", tag = "jobs", summary = "A job's network policy",
    description = "What the job's sandbox may reach through cordon's broker: while it runs, the policy applied now; otherwise the one it was submitted with. `ceiling`: what this tenant may reach at most.",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::network::NetworkView), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_job_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<NetworkView>> {
    view(&shared, &tenant, &Owner::Job(id)).await
}

#[utoipa::path(put, path = "/v1/jobs/{id}/network", tag = "jobs", summary = "Change a running job's network policy",
    description = "Replaces what a running job (submitted with `network` \"allow\") may reach, at once: the broker checks every new connection against it. Within this tenant's ceiling; recorded as a `network_policy` event.",
    params(("id" = String, Path)),
    request_body(content = crate::network::PolicyChange, examples(
        ("nothing" = (summary = "Reach nothing from now on", value = json!({"allow": []}))),
        ("a host" = (summary = "One host, HTTPS only", value = json!({"allow": ["api.example.com:443"]}))))),
    responses((status = 200, body = crate::network::NetworkView), (status = 400, description = "The body says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Beyond this tenant's ceiling", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The job is not running, or its network is not brokered", body = crate::http::ErrorResponse)))]
pub(crate) async fn put_job_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<NetworkView>> {
    change(&shared, &tenant, &Owner::Job(id), body).await
}

#[utoipa::path(get, path = "/v1/sessions/{id}/network", tag = "sessions", summary = "A session's network policy",
    description = "What the session's sandbox may reach through cordon's broker: while it is live, the policy applied now; otherwise the one its next message starts with.",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::network::NetworkView), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_session_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<NetworkView>> {
    view(&shared, &tenant, &Owner::Session(id)).await
}

#[utoipa::path(put, path = "/v1/sessions/{id}/network", tag = "sessions", summary = "Change a session's network policy",
    description = "Replaces what a session created with `network` \"allow\" may reach, within this tenant's ceiling: at once if it is live (even mid-turn), else from its next message. Recorded in the session's log as a `network_policy` record.",
    params(("id" = String, Path)),
    request_body(content = crate::network::PolicyChange, examples(
        ("nothing" = (summary = "Reach nothing from now on", value = json!({"allow": []}))),
        ("a host" = (summary = "One host, HTTPS only", value = json!({"allow": ["api.example.com:443"]}))))),
    responses((status = 200, body = crate::network::NetworkView), (status = 400, description = "The body says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Beyond this tenant's ceiling", body = crate::http::ErrorResponse), (status = 404, description = "No such session (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "Its network is not brokered, or it is waking", body = crate::http::ErrorResponse)))]
pub(crate) async fn put_session_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<NetworkView>> {
    change(&shared, &tenant, &Owner::Session(id), body).await
}

#[utoipa::path(get, path = "/v1/sandboxes/{id}/network", tag = "sandboxes", summary = "A sandbox's network policy",
    description = "What the sandbox may reach through cordon's broker: while it runs, the policy applied now; otherwise the one it was made with.",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::network::NetworkView), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_sandbox_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
) -> ApiResult<Json<NetworkView>> {
    view(&shared, &tenant, &Owner::Sandbox(id)).await
}

#[utoipa::path(put, path = "/v1/sandboxes/{id}/network", tag = "sandboxes", summary = "Change a running sandbox's network policy",
    description = "Replaces what a running sandbox made with `network` \"allow\" may reach, at once, within this tenant's ceiling.",
    params(("id" = String, Path)),
    request_body(content = crate::network::PolicyChange, example = json!({"allow": ["api.example.com:443"]})),
    responses((status = 200, body = crate::network::NetworkView), (status = 400, description = "The body says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Beyond this tenant's ceiling", body = crate::http::ErrorResponse), (status = 404, description = "No such sandbox (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "It has ended, or its network is not brokered", body = crate::http::ErrorResponse)))]
pub(crate) async fn put_sandbox_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> ApiResult<Json<NetworkView>> {
    change(&shared, &tenant, &Owner::Sandbox(id), body).await
}
