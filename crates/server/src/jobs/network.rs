//! A job's network policy: what it was submitted with, and while it runs,
//! what its broker applies now, which the API may replace within the
//! tenant's ceiling (each change a `network_policy` event).

use std::sync::Arc;

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path as AxPath, State};
use axum::http::StatusCode;
use cordon_net::Policy;

use crate::http::{ApiError, Tenant};
use crate::network::{Empty, NetworkView, job_key, parse_change, stored_policy};
use crate::state::Shared;
use crate::store::{JobRow, NewEvent};

/// A job's network as it was submitted (plain rules), from its stored
/// request.
fn job_network(shared: &Shared, job: &JobRow) -> (cordon_sandbox::Network, Option<Policy>) {
    match job
        .request
        .as_ref()
        .map(|r| r.limits().check(&shared.config.bounds))
    {
        Ok(Ok(options)) => (
            options.network.into(),
            options.egress.as_ref().and_then(stored_policy),
        ),
        _ => (cordon_sandbox::Network::Off, None),
    }
}

#[utoipa::path(get, path = "/v1/jobs/{id}/network", tag = "jobs", summary = "A job's network policy",
    description = "What the job's sandbox may reach through cordon's broker: while it runs, the policy applied now; otherwise the one it was submitted with. `ceiling`: what this tenant may reach at most.",
    params(("id" = String, Path)),
    responses((status = 200, body = crate::network::NetworkView), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_job_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    AxPath(id): AxPath<String>,
) -> Result<Json<NetworkView>, ApiError> {
    let job = super::find(&shared, &tenant, &id).await?;
    let (network, stored) = job_network(&shared, &job);
    let live = shared.policies.get(&job_key(&id));
    let policy = live.as_ref().map(|h| (*h.load()).clone()).or(stored);
    Ok(Json(NetworkView::new(
        network,
        policy.as_ref(),
        live.is_some(),
        &shared.ceilings.of(&tenant),
    )))
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
    AxPath(id): AxPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<NetworkView>, ApiError> {
    let job = super::find(&shared, &tenant, &id).await?;
    let change = parse_change(&crate::http::within(body, shared.config.body_limit)?)?;
    let (network, _) = job_network(&shared, &job);
    let Some(handle) = shared.policies.get(&job_key(&id)) else {
        let why = if network != cordon_sandbox::Network::Allow {
            format!(
                "job {id}'s network is {network:?}, not brokered: submit it with `network` \"allow\" to change what it reaches while it runs"
            )
        } else {
            format!("job {id} is not running; a job's network changes only while it runs")
        };
        return Err(ApiError::new(StatusCode::CONFLICT, "not_running", why));
    };
    let policy = shared.ceilings.settle(&tenant, &change, Empty::Nothing)?;
    let before = handle.set(policy.clone());
    let record = cordon_agent::PolicyRecord::between(&before, &policy);
    let event = NewEvent::from(crate::job::JobEvent::NetworkPolicy(
        crate::job::PolicyChanged(record),
    ));
    match shared.store.append(&id, None, &[event], None).await {
        Ok(stored) => shared.hub.publish(&id, &stored),
        Err(e) => tracing::error!(job = %id, "cannot record a policy change: {e}"),
    }
    Ok(Json(NetworkView::new(
        network,
        Some(&policy),
        true,
        &shared.ceilings.of(&tenant),
    )))
}
