//! Network policy for jobs and sessions. The operator sets a ceiling, for
//! every tenant and per tenant (`cordon serve --allow`, `--tenant-allow`);
//! a job or a session asks for hosts within it, and gets them through the
//! sandbox's broker. A running job's or live session's policy can be
//! replaced through the API, never past the ceiling, and each change is a
//! record: a job event, a line of the session's log.
//!
//! Presets (`@python`...) are expanded here, on the host, from the host
//! tools' own configuration and never from the server's data directory
//! (every workspace is in it), so what a job stores and the view shows are
//! plain rules.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path as AxPath, State};
use axum::http::StatusCode;
use cordon_net::{Policy, PolicyError, PolicyHandle, PolicySpec, PresetEnv};
use serde::{Deserialize, Serialize};

use crate::http::{ApiError, Tenant};
use crate::server::Shared;
use crate::store::{JobRow, NewEvent};

/// The operator's ceilings, as configured (entries as written).
#[derive(Debug, Clone, Default)]
pub struct NetworkCeilings {
    /// What every tenant without its own may reach.
    pub all: PolicySpec,
    /// Tenants with a ceiling of their own, which replaces `all`.
    pub tenants: BTreeMap<String, PolicySpec>,
}

/// The ceilings with their presets expanded, once, when the server starts.
#[derive(Debug, Default)]
pub struct Ceilings {
    all: Policy,
    tenants: HashMap<String, Policy>,
}

impl Ceilings {
    /// Expands `c`'s presets with the host tools' configuration, trusting
    /// nothing under `data_dir`. Warnings say what a preset could not find.
    pub async fn expand(
        c: &NetworkCeilings,
        data_dir: &Path,
    ) -> Result<(Ceilings, Vec<String>), PolicyError> {
        let env = PresetEnv::from_host().untrusting(data_dir);
        let (all, mut warnings) = cordon_net::presets::expand(&c.all, &env).await?;
        let mut tenants = HashMap::new();
        for (tenant, spec) in &c.tenants {
            let (p, w) = cordon_net::presets::expand(spec, &env).await?;
            warnings.extend(w.into_iter().map(|w| format!("tenant {tenant}: {w}")));
            tenants.insert(tenant.clone(), p);
        }
        Ok((Ceilings { all, tenants }, warnings))
    }

    /// What `tenant`'s jobs and sessions may reach at most.
    pub fn of(&self, tenant: &str) -> &Policy {
        self.tenants.get(tenant).unwrap_or(&self.all)
    }
}

/// What an empty `allow` asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Empty {
    /// All the tenant's ceiling allows (a job's or session's `allow`).
    Ceiling,
    /// Nothing (a `PUT .../network` that takes everything away).
    Nothing,
}

/// The policy `asked` comes to for `tenant`: its presets expanded, or
/// what `empty` says when it lists nothing; 403 naming what goes beyond
/// the tenant's ceiling.
pub async fn settle(
    shared: &Shared,
    tenant: &str,
    asked: &PolicySpec,
    empty: Empty,
) -> Result<Policy, ApiError> {
    let ceiling = shared.ceilings.of(tenant);
    let policy = if asked.allow.is_empty() && empty == Empty::Nothing {
        Policy::new(Vec::new(), asked.allow_private)
    } else {
        if ceiling.rules().is_empty() {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "network_not_allowed",
                "this server lets this tenant reach no hosts: `network` may be \"off\" or \
                 \"loopback\" (the operator allows hosts with `cordon serve --allow HOST` or \
                 `--tenant-allow TENANT=HOST,...`)",
            ));
        }
        if asked.allow.is_empty() {
            Policy::new(ceiling.rules().to_vec(), asked.allow_private)
        } else {
            let env = PresetEnv::from_host().untrusting(&shared.config.data_dir);
            cordon_net::presets::expand(asked, &env)
                .await
                .map_err(|e| ApiError::bad_request(format!("`allow`: {e}")))?
                .0
        }
    };
    let beyond = policy.beyond(ceiling);
    if !beyond.is_empty() {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "beyond_ceiling",
            format!(
                "`allow` goes beyond what this tenant may reach: {}; it may reach {}{}",
                beyond.join(", "),
                ceiling.summary(),
                if ceiling.allow_private() {
                    ""
                } else {
                    " (and no private addresses)"
                }
            ),
        ));
    }
    Ok(policy)
}

/// `PUT .../network`: the policy a running job or live session gets
/// instead of its own, within the tenant's ceiling.
#[derive(Debug, Clone, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PolicyChange {
    /// HOST[:PORT], *.DOMAIN, IP or CIDR, or a preset (`@python`...);
    /// empty: nothing at all.
    pub allow: Vec<String>,
    /// Let names resolve to private addresses (if the ceiling does).
    #[serde(default)]
    pub allow_private: bool,
}

/// What a job's or session's network is.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
pub struct NetworkView {
    /// `off`, `loopback` or `allow`.
    pub network: String,
    /// With `allow`: the hosts, as the broker applies them (now, while it
    /// runs; else as it will start).
    pub allow: Vec<String>,
    pub allow_private: bool,
    /// Whether a broker is running now (a change applies at once).
    pub live: bool,
    /// What this tenant may reach at most.
    pub ceiling: Vec<String>,
}

impl NetworkView {
    pub fn new(
        network: cordon_sandbox::Network,
        policy: Option<&Policy>,
        live: bool,
        ceiling: &Policy,
    ) -> Self {
        NetworkView {
            network: network.to_string(),
            allow: policy
                .map(|p| p.rules().iter().map(ToString::to_string).collect())
                .unwrap_or_default(),
            allow_private: policy.is_some_and(Policy::allow_private),
            live,
            ceiling: ceiling.rules().iter().map(ToString::to_string).collect(),
        }
    }
}

/// The live policies of running jobs (`job/ID`) and live sessions
/// (`session/ID`) in this process.
#[derive(Default, Clone)]
pub struct LivePolicies(Arc<Mutex<Registry>>);

#[derive(Default)]
struct Registry {
    next: u64,
    by_key: HashMap<String, (u64, PolicyHandle)>,
}

/// A policy's place in the registry, removed when dropped (unless another
/// has taken the key since).
pub struct Listed {
    policies: LivePolicies,
    key: String,
    id: u64,
}

impl Drop for Listed {
    fn drop(&mut self) {
        let mut r = self.policies.lock();
        if r.by_key
            .get(&self.key)
            .is_some_and(|(id, _)| *id == self.id)
        {
            r.by_key.remove(&self.key);
        }
    }
}

impl LivePolicies {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn list(&self, key: String, handle: PolicyHandle) -> Listed {
        let mut r = self.lock();
        r.next += 1;
        let id = r.next;
        r.by_key.insert(key.clone(), (id, handle));
        Listed {
            policies: self.clone(),
            key,
            id,
        }
    }

    pub fn get(&self, key: &str) -> Option<PolicyHandle> {
        self.lock().by_key.get(key).map(|(_, h)| h.clone())
    }
}

/// A stored job's or session's network: its mode and, with `allow`, its
/// rules (plain, as [`settle`] made them).
pub fn stored_policy(spec: &PolicySpec) -> Option<Policy> {
    Policy::parse(&spec.allow, spec.allow_private).ok()
}

/// The registry's key of a running job.
pub fn job_key(id: &str) -> String {
    format!("job/{id}")
}

/// The registry's key of a live session.
pub fn session_key(id: &str) -> String {
    format!("session/{id}")
}

/// A `PUT .../network` body: a JSON object with `allow` (and
/// `allow_private`), nothing else.
pub fn parse_change(body: &[u8]) -> Result<PolicySpec, ApiError> {
    let change: PolicyChange = serde_json::from_slice(body).map_err(|e| {
        ApiError::bad_request(format!(
            "the body must be {{\"allow\": [HOST, ...], \"allow_private\": false}}: {e}"
        ))
    })?;
    Ok(PolicySpec {
        allow: change.allow,
        allow_private: change.allow_private,
    })
}

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
    responses((status = 200, body = NetworkView), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse)))]
pub(crate) async fn get_job_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    AxPath(id): AxPath<String>,
) -> Result<Json<NetworkView>, ApiError> {
    let job = crate::jobs::find(&shared, &tenant, &id).await?;
    let (network, stored) = job_network(&shared, &job);
    let live = shared.policies.get(&job_key(&id));
    let policy = live.as_ref().map(|h| (*h.load()).clone()).or(stored);
    Ok(Json(NetworkView::new(
        network,
        policy.as_ref(),
        live.is_some(),
        shared.ceilings.of(&tenant),
    )))
}

#[utoipa::path(put, path = "/v1/jobs/{id}/network", tag = "jobs", summary = "Change a running job's network policy",
    description = "Replaces what a running job (submitted with `network` \"allow\") may reach, at once: the broker checks every new connection against it. Within this tenant's ceiling; recorded as a `network_policy` event.",
    params(("id" = String, Path)),
    request_body = PolicyChange,
    responses((status = 200, body = NetworkView), (status = 400, description = "The body says what is wrong", body = crate::http::ErrorResponse), (status = 401, description = "No or unknown token", body = crate::http::ErrorResponse),
              (status = 403, description = "Beyond this tenant's ceiling", body = crate::http::ErrorResponse), (status = 404, description = "No such job (or another tenant's)", body = crate::http::ErrorResponse),
              (status = 409, description = "The job is not running, or its network is not brokered", body = crate::http::ErrorResponse)))]
pub(crate) async fn put_job_network(
    State(shared): State<Arc<Shared>>,
    Tenant(tenant): Tenant,
    AxPath(id): AxPath<String>,
    body: Result<Bytes, BytesRejection>,
) -> Result<Json<NetworkView>, ApiError> {
    let job = crate::jobs::find(&shared, &tenant, &id).await?;
    let change = parse_change(&body?)?;
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
    let policy = settle(&shared, &tenant, &change, Empty::Nothing).await?;
    let before = handle.set(policy.clone());
    let record = cordon_agent::PolicyRecord::between(&before, &policy);
    let event = NewEvent::new(
        "network_policy",
        serde_json::to_value(&record).unwrap_or_default(),
    );
    match shared.store.append(&id, &[event], None).await {
        Ok(stored) => shared.hub.publish(&id, &stored),
        Err(e) => tracing::error!(job = %id, "cannot record a policy change: {e}"),
    }
    Ok(Json(NetworkView::new(
        network,
        Some(&policy),
        true,
        shared.ceilings.of(&tenant),
    )))
}
