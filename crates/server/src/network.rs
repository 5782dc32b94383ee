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
//! plain rules. They are expanded when the server starts and again when
//! the tools' configuration changes, never for a request.

use std::collections::{BTreeMap, HashMap};
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};

use axum::http::StatusCode;
use cordon_net::{
    ConfigStamp, Policy, PolicyError, PolicyHandle, PolicySpec, PresetEnv, PresetTable,
};
use serde::{Deserialize, Serialize};

use crate::http::ApiError;
use crate::owner::Owner;

/// The operator's ceilings, as configured (entries as written).
#[derive(Debug, Clone, Default)]
pub struct NetworkCeilings {
    /// What every tenant without its own may reach.
    pub all: PolicySpec,
    /// Tenants with a ceiling of their own, which replaces `all`.
    pub tenants: BTreeMap<String, PolicySpec>,
}

/// The ceilings with their presets expanded, and every preset's expansion
/// for the requests that name one: both from one [`PresetTable`], made
/// when the server starts and again only when the host tools'
/// configuration changes ([`Ceilings::refresh_if_changed`]). No request
/// starts a process.
#[derive(Debug)]
pub struct Ceilings {
    spec: NetworkCeilings,
    /// What the tools are asked with; never reads under the data directory
    /// (every workspace is in it).
    env: PresetEnv,
    now: RwLock<Arc<Expanded>>,
}

#[derive(Debug)]
struct Expanded {
    all: Arc<Policy>,
    tenants: HashMap<String, Arc<Policy>>,
    presets: PresetTable,
    /// The tools' configuration the table was made from.
    stamp: ConfigStamp,
}

impl Expanded {
    /// `tenant`'s ceiling: its own, or every tenant's.
    fn ceiling(&self, tenant: &str) -> &Arc<Policy> {
        self.tenants.get(tenant).unwrap_or(&self.all)
    }

    /// The ceilings of `spec` from a table freshly asked of the tools.
    async fn resolve(
        spec: &NetworkCeilings,
        env: &PresetEnv,
    ) -> Result<(Expanded, Vec<String>), PolicyError> {
        let stamp = ConfigStamp::now(env);
        // A server whose ceilings list nothing refuses every `allow`
        // before a preset is looked at: its start asks no tool.
        let any = !spec.all.allow.is_empty() || spec.tenants.values().any(|t| !t.allow.is_empty());
        let presets = if any {
            PresetTable::resolve(env).await
        } else {
            PresetTable::default()
        };
        let (all, mut warnings) = presets.expand(&spec.all)?;
        let mut tenants = HashMap::new();
        for (tenant, spec) in &spec.tenants {
            let (p, w) = presets.expand(spec)?;
            warnings.extend(w.into_iter().map(|w| format!("tenant {tenant}: {w}")));
            tenants.insert(tenant.clone(), Arc::new(p));
        }
        Ok((
            Expanded {
                all: Arc::new(all),
                tenants,
                presets,
                stamp,
            },
            warnings,
        ))
    }
}

impl Ceilings {
    /// Expands `c`'s presets with the host tools' configuration (`env`,
    /// or this process's), trusting nothing under `data_dir`. Warnings say
    /// what a preset could not find.
    pub async fn expand(
        c: &NetworkCeilings,
        env: Option<&PresetEnv>,
        data_dir: &Path,
    ) -> Result<(Ceilings, Vec<String>), PolicyError> {
        let env = env
            .cloned()
            .unwrap_or_else(PresetEnv::from_host)
            .untrusting(data_dir);
        let (now, warnings) = Expanded::resolve(c, &env).await?;
        Ok((
            Ceilings {
                spec: c.clone(),
                env,
                now: RwLock::new(Arc::new(now)),
            },
            warnings,
        ))
    }

    fn now(&self) -> Arc<Expanded> {
        self.now.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// What `tenant`'s jobs and sessions may reach at most.
    pub fn of(&self, tenant: &str) -> Arc<Policy> {
        self.now().ceiling(tenant).clone()
    }

    /// Asks the tools again when their configuration files changed since
    /// the table was made (one task calls this; requests never do).
    /// Answers whether it did. On an error (a ceiling that no longer
    /// parses cannot happen: the spec is the same) the old table stays.
    pub async fn refresh_if_changed(&self) -> bool {
        if ConfigStamp::now(&self.env) == self.now().stamp {
            return false;
        }
        match Expanded::resolve(&self.spec, &self.env).await {
            Ok((fresh, warnings)) => {
                for w in warnings {
                    tracing::warn!("network ceiling: {w}");
                }
                tracing::info!("the host tools' configuration changed: presets expanded again");
                *self.now.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(fresh);
                true
            }
            Err(e) => {
                tracing::warn!("presets not expanded again: {e}");
                false
            }
        }
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

impl Ceilings {
    /// Whether `tenant` may reach no host at all.
    pub fn reaches_nothing(&self, tenant: &str) -> bool {
        self.now().ceiling(tenant).rules().is_empty()
    }

    /// The policy `asked` comes to for `tenant`: its presets expanded, or
    /// what `empty` says when it lists nothing; 403 naming what goes beyond
    /// the tenant's ceiling.
    pub fn settle(
        &self,
        tenant: &str,
        asked: &PolicySpec,
        empty: Empty,
    ) -> Result<Policy, ApiError> {
        let now = self.now();
        let ceiling: &Policy = now.ceiling(tenant);
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
                now.presets
                    .expand(asked)
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

/// The live policies of running jobs and live sessions in this process,
/// by [`Owner`].
#[derive(Default, Clone)]
pub struct LivePolicies(Arc<Mutex<Registry>>);

#[derive(Default)]
struct Registry {
    next: u64,
    by_key: HashMap<Owner, (u64, PolicyHandle)>,
}

/// A policy's place in the registry, removed when dropped (unless another
/// has taken the key since).
pub struct Listed {
    policies: LivePolicies,
    owner: Owner,
    id: u64,
}

impl Drop for Listed {
    fn drop(&mut self) {
        let mut r = self.policies.lock();
        if r.by_key
            .get(&self.owner)
            .is_some_and(|(id, _)| *id == self.id)
        {
            r.by_key.remove(&self.owner);
        }
    }
}

impl LivePolicies {
    fn lock(&self) -> std::sync::MutexGuard<'_, Registry> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn list(&self, owner: Owner, handle: PolicyHandle) -> Listed {
        let mut r = self.lock();
        r.next += 1;
        let id = r.next;
        r.by_key.insert(owner.clone(), (id, handle));
        Listed {
            policies: self.clone(),
            owner,
            id,
        }
    }

    pub fn get(&self, owner: &Owner) -> Option<PolicyHandle> {
        self.lock().by_key.get(owner).map(|(_, h)| h.clone())
    }
}

/// A stored job's or session's network: its mode and, with `allow`, its
/// rules (plain, as [`settle`] made them).
pub fn stored_policy(spec: &PolicySpec) -> Option<Policy> {
    Policy::parse(&spec.allow, spec.allow_private).ok()
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
