//! The sandbox API's wire types: what a sandbox is made with, and how it
//! is shown.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use utoipa::ToSchema;

use crate::http::{ApiError, ApiResult, Timestamp};
use crate::job::{AllowEntry, Backend, ImageName, Limits, NetworkMode, RunOptions, Size};
use crate::store::SandboxRow;

/// Metadata entries a sandbox may carry, and their sizes.
const METADATA_MAX: usize = 64;
const METADATA_KEY_MAX: usize = 128;
const METADATA_VALUE_MAX: usize = 1024;

/// Environment variables a sandbox or a command may be given.
const ENV_MAX: usize = 256;

/// Checks environment variables a sandbox or a command is given: at most
/// [`ENV_MAX`], named without `=` or NUL, valued without NUL.
pub(crate) fn check_env(env: &BTreeMap<String, String>) -> ApiResult<()> {
    if env.len() > ENV_MAX {
        return Err(ApiError::bad_request(format!(
            "`env` has {} variables; at most {ENV_MAX}",
            env.len()
        )));
    }
    for (k, v) in env {
        let bad_name = k.is_empty() || k.contains(['=', '\0']);
        if bad_name || v.contains('\0') {
            return Err(ApiError::bad_request(format!(
                "`env`: {k:?} is no variable name, or its value holds a NUL byte"
            )));
        }
    }
    Ok(())
}

/// `POST /v1/sandboxes`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct NewSandbox {
    /// The image its root is made from: one of the server's catalog or
    /// this tenant's own; the server's default unless given.
    #[serde(default)]
    pub image: Option<ImageName>,
    /// Seconds it may run before it is ended, 1 up to the server's maximum
    /// (default 300); `POST …/timeout` changes it.
    #[serde(default)]
    #[schema(minimum = 1, example = 300)]
    pub timeout_secs: Option<u64>,
    /// Memory for the whole sandbox (default 512M).
    #[serde(default)]
    pub memory: Option<Size>,
    /// How much its files may grow (default 1G).
    #[serde(default)]
    pub disk: Option<Size>,
    /// `off` (the default; `allow` when `allow` is given), `loopback`, or
    /// `allow`.
    #[serde(default)]
    pub network: Option<NetworkMode>,
    /// Hosts it may reach through cordon's broker, within this tenant's
    /// ceiling (implies `network` "allow").
    #[serde(default)]
    #[schema(max_items = 256)]
    pub allow: Option<Vec<AllowEntry>>,
    #[serde(default)]
    pub allow_private: Option<bool>,
    /// Default: the server's.
    #[serde(default)]
    pub backend: Option<Backend>,
    /// Environment variables every command in it gets (at most 256).
    #[serde(default)]
    pub env: BTreeMap<String, String>,
    /// Strings to find it by (`GET /v1/sandboxes?metadata=key%3Dvalue`): at
    /// most 64 entries, keys of 128 bytes, values of 1024.
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// Whether its ports answer anyone at `{port}-{id}.{domain}` (with
    /// `cordon serve --sandbox-domain`); by default only this tenant's
    /// token (`Authorization: Bearer`) or its traffic token
    /// (`X-Traffic-Token`, E2B's `e2b-traffic-access-token` too).
    #[serde(default)]
    pub public: bool,
    /// What its timeout does: `end` it (the default), or `pause` it,
    /// its processes and memory kept until `POST …/resume`, which gives
    /// it its whole timeout again.
    #[serde(default)]
    pub on_timeout: crate::boxes::OnTimeout,
    /// Whether a request to one of its ports by name (or to its E2B
    /// envd) resumes it when it is paused; else such a request is
    /// answered 502 until it is resumed.
    #[serde(default)]
    pub auto_resume: bool,
}

impl NewSandbox {
    /// The limits every job also takes, for the server's one check.
    pub fn limits(&self) -> Limits {
        Limits {
            timeout_secs: self.timeout_secs,
            memory: self.memory,
            disk: self.disk,
            network: self.network,
            allow: self.allow.clone(),
            allow_private: self.allow_private,
            backend: self.backend,
            repo: None,
            image: self.image.clone(),
        }
    }

    /// Checks what only a sandbox takes: its environment and metadata.
    pub fn check(&self) -> ApiResult<()> {
        check_env(&self.env)?;
        if self.metadata.len() > METADATA_MAX {
            return Err(ApiError::bad_request(format!(
                "`metadata` has {} entries; at most {METADATA_MAX}",
                self.metadata.len()
            )));
        }
        for (k, v) in &self.metadata {
            if k.is_empty() || k.len() > METADATA_KEY_MAX || v.len() > METADATA_VALUE_MAX {
                return Err(ApiError::bad_request(format!(
                    "`metadata`: keys are 1 to {METADATA_KEY_MAX} bytes and values at most \
                     {METADATA_VALUE_MAX}"
                )));
            }
        }
        Ok(())
    }

    /// What the record keeps: the request with the server's defaults and
    /// the network as settled, without its environment (its values may be
    /// secrets) or metadata (kept apart). `forked_from`: the sandbox it
    /// was forked from.
    pub fn stored(&self, options: &RunOptions, forked_from: Option<&str>) -> String {
        let stored = StoredRequest {
            image: options.image.clone(),
            timeout_secs: options.timeout_secs,
            memory: options.memory,
            disk: options.disk,
            network: options.network,
            allow: options.egress.as_ref().map(|e| e.allow.clone()),
            allow_private: options.egress.as_ref().map(|e| e.allow_private),
            backend: options.backend.map(Backend::from),
            env: self.env.keys().cloned().collect(),
            forked_from: forked_from.map(String::from),
        };
        serde_json::to_string(&stored).unwrap_or_else(|_| "{}".into())
    }

    /// A fork of a sandbox made as `stored` says (its network as settled
    /// then; checked against the ceiling again), with the environment,
    /// metadata and behaviour `parent` was given.
    pub(crate) fn fork_of(
        stored: StoredRequest,
        parent: &crate::boxes::LiveBox,
        metadata: BTreeMap<String, String>,
    ) -> NewSandbox {
        let allow = stored
            .allow
            .map(|rules| rules.into_iter().map(AllowEntry::checked).collect());
        NewSandbox {
            image: stored.image,
            timeout_secs: Some(parent.timeout.as_secs().max(1)),
            memory: Some(Size(stored.memory)),
            disk: Some(Size(stored.disk)),
            network: Some(stored.network),
            allow,
            allow_private: stored.allow_private,
            backend: stored.backend,
            env: parent.env.clone(),
            metadata,
            public: parent.public,
            on_timeout: parent.on_timeout,
            auto_resume: parent.auto_resume,
        }
    }
}

/// What a sandbox's record keeps of its request (see
/// [`NewSandbox::stored`]), shown as its `request`.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct StoredRequest {
    pub image: Option<ImageName>,
    pub timeout_secs: u64,
    pub memory: u64,
    pub disk: u64,
    pub network: NetworkMode,
    #[serde(default)]
    pub allow: Option<Vec<String>>,
    #[serde(default)]
    pub allow_private: Option<bool>,
    #[serde(default)]
    pub backend: Option<Backend>,
    /// The names of its environment variables, not their values.
    #[serde(default)]
    pub env: Vec<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<String>,
}

impl StoredRequest {
    /// A record's request; `None` for one this server did not write.
    pub fn of(row: &SandboxRow) -> Option<StoredRequest> {
        serde_json::from_str(&row.request).ok()
    }
}

/// A sandbox as the API shows it.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxView {
    #[schema(example = "sbx_4cac2a4d783dc2aec74a934e")]
    pub id: String,
    /// `running`, `paused` (`POST …/pause`), or `ended` (see `end_reason`).
    #[schema(example = "running")]
    pub state: &'static str,
    pub created_at: Timestamp,
    /// When it is ended unless its timeout is changed.
    pub expires_at: Timestamp,
    pub ended_at: Option<Timestamp>,
    /// `killed` (deleted), `timeout`, or `the server stopped`.
    pub end_reason: Option<String>,
    pub metadata: BTreeMap<String, String>,
    /// What it was made with: image, limits, network, backend, and the
    /// names (not the values) of its environment variables.
    #[schema(value_type = Object)]
    pub request: serde_json::Value,
}

impl SandboxView {
    /// `live`: whether this process has it running.
    pub fn of(row: &SandboxRow, live: bool) -> SandboxView {
        let running = row.ended_ms.is_none() && live;
        SandboxView {
            id: row.id.clone(),
            state: if running { "running" } else { "ended" },
            created_at: Timestamp::at(row.created_ms),
            expires_at: Timestamp::at(row.expires_ms),
            ended_at: row.ended_ms.map(Timestamp::at),
            end_reason: row.end_reason.clone(),
            metadata: serde_json::from_str(&row.metadata).unwrap_or_default(),
            request: serde_json::from_str(&row.request).unwrap_or_default(),
        }
    }

    /// Says `paused` of a running one that is.
    pub fn paused(mut self, paused: bool) -> SandboxView {
        if paused && self.state == "running" {
            self.state = "paused";
        }
        self
    }
}

/// `GET /v1/sandboxes`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxList {
    pub sandboxes: Vec<SandboxView>,
}

/// A sandbox's use of the machine at a moment.
#[derive(Debug, Serialize, ToSchema)]
pub struct UsageView {
    pub at: Timestamp,
    /// CPU time of every process it ran, living or ended.
    pub cpu_seconds: f64,
    /// Its share of the machine's CPUs since the sample before, 0 to 100
    /// (none for a live reading).
    pub cpu_percent: Option<f64>,
    /// Processes running.
    pub processes: u32,
    /// Memory in use: its cgroup's charge (or its microVM's kernel's).
    pub memory_bytes: u64,
    pub memory_limit: Option<u64>,
    /// What its files (workspace and image layer) have grown by, at the
    /// disk watcher's last look, against its budget.
    pub disk_bytes: Option<u64>,
    pub disk_limit: Option<u64>,
}

impl UsageView {
    pub fn of(at_ms: i64, u: &cordon_sandbox::Usage, cpu_percent: Option<f64>) -> UsageView {
        UsageView {
            at: Timestamp::at(at_ms),
            cpu_seconds: u.cpu_ns as f64 / 1e9,
            cpu_percent,
            processes: u.processes,
            memory_bytes: u.memory_used,
            memory_limit: u.memory_limit,
            disk_bytes: u.disk_used,
            disk_limit: u.disk_limit,
        }
    }
}

/// `GET /v1/sandboxes/{id}/metrics`.
#[derive(Debug, Serialize, ToSchema)]
pub struct SandboxMetrics {
    /// Now.
    pub now: UsageView,
    /// Every 5 seconds over the last hour, oldest first.
    pub samples: Vec<UsageView>,
}

/// `POST /v1/sandboxes/{id}/timeout`.
#[derive(Debug, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct TimeoutChange {
    /// Seconds from now.
    #[schema(minimum = 1, example = 900)]
    pub timeout_secs: u64,
}
