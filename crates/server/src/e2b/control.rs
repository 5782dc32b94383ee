//! E2B's control API over the sandbox API: create, look up, list (with
//! E2B's filters and pages), connect, time out and kill sandboxes.
//!
//! E2B forgets a sandbox once it ends, so an ended one is 404 here, though
//! cordon's own API still shows its record.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::Json;
use axum::body::Bytes;
use axum::extract::rejection::{BytesRejection, QueryRejection};
use axum::extract::{Path, Query, State};
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use base64::Engine;
use serde::{Deserialize, Serialize};

use super::{ApiKey, E2bError, E2bResult, cordon_id, e2b_id};
use crate::boxes::LiveBox;
use crate::http::Timestamp;
use crate::job::{AllowEntry, ImageName, NetworkMode};
use crate::sandbox_api::NewSandbox;
use crate::state::Shared;
use crate::store::{SandboxRow, now_ms};

/// The envd version reported: the one whose protocol this layer follows.
/// The SDKs gate features on it; this one enables all they have.
pub const ENVD_VERSION: &str = "0.6.13";

/// What E2B calls the server's default image.
const DEFAULT_TEMPLATE: &str = "base";

/// Sandboxes one list answers at most, and by default.
const PAGE_MAX: usize = 100;

/// `POST /sandboxes`. E2B's fields cordon has no use for (auto-pause, MCP,
/// volumes, …) are accepted and left alone, as E2B's own server does with
/// fields it does not know.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NewE2bSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    /// Seconds.
    #[serde(default)]
    timeout: Option<i64>,
    #[serde(default)]
    metadata: Option<BTreeMap<String, String>>,
    #[serde(default)]
    env_vars: Option<BTreeMap<String, String>>,
    #[serde(default, rename = "allow_internet_access")]
    allow_internet_access: Option<bool>,
    #[serde(default)]
    network: Option<NetworkRules>,
    /// Paused at its timeout rather than killed.
    #[serde(default)]
    auto_pause: Option<bool>,
    /// Whether a request for it wakes it when paused.
    #[serde(default)]
    auto_resume: Option<AutoResume>,
}

/// E2B's `SandboxAutoResumeConfig`.
#[derive(Debug, Default, Deserialize)]
struct AutoResume {
    #[serde(default)]
    enabled: bool,
}

/// E2B's egress rules, as far as cordon's allow-list can take them.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct NetworkRules {
    #[serde(default)]
    allow_out: Vec<String>,
    #[serde(default)]
    deny_out: Vec<String>,
    /// Whether its ports answer anyone by name (E2B's default), or only
    /// with its traffic token.
    #[serde(default)]
    allow_public_traffic: Option<bool>,
}

/// E2B's `Sandbox`: what create and connect answer.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct E2bSandbox {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    envd_version: &'static str,
    alias: String,
    envd_access_token: String,
    traffic_access_token: Option<String>,
    domain: Option<String>,
}

/// E2B's `SandboxDetail` and `ListedSandbox` (the second is the first
/// without the token).
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Detail {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "sandboxID")]
    sandbox_id: String,
    #[serde(rename = "clientID")]
    client_id: &'static str,
    alias: String,
    started_at: Timestamp,
    end_at: Timestamp,
    envd_version: &'static str,
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    state: &'static str,
    metadata: BTreeMap<String, String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    envd_access_token: Option<String>,
    allow_internet_access: bool,
}

fn template_of(b: &LiveBox) -> String {
    b.image.clone().unwrap_or_else(|| DEFAULT_TEMPLATE.into())
}

fn sandbox(shared: &Shared, b: &LiveBox) -> E2bSandbox {
    let template = template_of(b);
    E2bSandbox {
        template_id: template.clone(),
        sandbox_id: e2b_id(&b.id),
        client_id: "cordon",
        envd_version: ENVD_VERSION,
        alias: template,
        envd_access_token: b.access_token.clone(),
        traffic_access_token: (!b.public).then(|| b.traffic_token.clone()),
        domain: shared
            .config
            .sandbox_domain
            .as_ref()
            .map(|d| d.authority(shared.config.served())),
    }
}

/// E2B's word for a live sandbox's state.
fn state_of(b: &LiveBox) -> &'static str {
    if b.sandbox.is_paused() {
        "paused"
    } else {
        "running"
    }
}

fn detail(row: &SandboxRow, b: &LiveBox, with_token: bool) -> Detail {
    let stored = crate::sandbox_api::StoredRequest::of(row);
    let template = template_of(b);
    Detail {
        template_id: template.clone(),
        sandbox_id: e2b_id(&row.id),
        client_id: "cordon",
        alias: template,
        started_at: Timestamp::at(row.created_ms),
        end_at: Timestamp::at(row.expires_ms),
        envd_version: ENVD_VERSION,
        cpu_count: crate::boxes::cpus(),
        memory_mb: stored.as_ref().map_or(0, |s| s.memory >> 20),
        disk_size_mb: stored.as_ref().map_or(0, |s| s.disk >> 20),
        state: state_of(b),
        metadata: serde_json::from_str(&row.metadata).unwrap_or_default(),
        envd_access_token: with_token.then(|| b.access_token.clone()),
        allow_internet_access: stored.is_some_and(|s| s.network == NetworkMode::Allow),
    }
}

/// `tenant`'s live sandbox of id `id` (either spelling), with its record.
async fn running(shared: &Shared, tenant: &str, id: &str) -> E2bResult<(SandboxRow, Arc<LiveBox>)> {
    let gone = || E2bError::not_found(id);
    let cid = cordon_id(id).ok_or_else(gone)?;
    let b = shared.boxes.get(tenant, &cid).ok_or_else(gone)?;
    let row = shared
        .store
        .sandbox(tenant, &cid)
        .await?
        .filter(|r| r.ended_ms.is_none())
        .ok_or_else(gone)?;
    Ok((row, b))
}

fn json_body<T: serde::de::DeserializeOwned>(
    shared: &Shared,
    body: Result<Bytes, BytesRejection>,
) -> E2bResult<T> {
    let body = crate::http::within(body, shared.config.body_limit)?;
    serde_json::from_slice(&body)
        .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, format!("the request: {e}")))
}

/// `POST /sandboxes`: 201 and the sandbox, running.
pub async fn create(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    body: Result<Bytes, BytesRejection>,
) -> E2bResult<Response> {
    let asked: NewE2bSandbox = json_body(&shared, body)?;
    let image = template(&shared, &tenant, &asked.template_id).await?;
    let timeout = match asked.timeout {
        None => None,
        Some(t) => Some(u64::try_from(t).map_err(|_| {
            E2bError::new(StatusCode::BAD_REQUEST, "`timeout` is a number of seconds")
        })?),
    };
    let (network, allow) = network(&shared, &tenant, &asked)?;
    let public = asked
        .network
        .as_ref()
        .and_then(|n| n.allow_public_traffic)
        .unwrap_or(true);
    let new = NewSandbox {
        image,
        timeout_secs: timeout,
        network: Some(network),
        allow,
        env: asked.env_vars.unwrap_or_default(),
        metadata: asked.metadata.unwrap_or_default(),
        public,
        on_timeout: if asked.auto_pause == Some(true) {
            crate::boxes::OnTimeout::Pause
        } else {
            crate::boxes::OnTimeout::End
        },
        auto_resume: asked.auto_resume.is_some_and(|a| a.enabled),
        ..Default::default()
    };
    let (_, b) = crate::sandbox_api::make(&shared, &tenant, new).await?;
    Ok((StatusCode::CREATED, Json(sandbox(&shared, &b))).into_response())
}

/// The image template `name` stands for: a name of the catalog, or the
/// server's default for E2B's own default.
async fn template(shared: &Shared, tenant: &str, name: &str) -> E2bResult<Option<ImageName>> {
    let bad = |e: String| E2bError::new(StatusCode::BAD_REQUEST, format!("template: {e}"));
    let asked = ImageName::try_from(name.to_string()).map_err(bad)?;
    match shared
        .images
        .choose(&shared.store, tenant, Some(&asked))
        .await
    {
        Ok(image) => Ok(image),
        Err(_) if name == DEFAULT_TEMPLATE => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// E2B's network choices as cordon's: the internet (E2B's default) is
/// what the tenant's ceiling allows, through the broker; `allowOut`
/// narrows it; no internet, or a tenant allowed nothing, is the
/// sandbox's own loopback (its ports can still be opened).
fn network(
    shared: &Shared,
    tenant: &str,
    asked: &NewE2bSandbox,
) -> E2bResult<(NetworkMode, Option<Vec<AllowEntry>>)> {
    let rules = asked.network.as_ref();
    let allow_out = rules.map(|r| r.allow_out.as_slice()).unwrap_or_default();
    let deny_out = rules.map(|r| r.deny_out.as_slice()).unwrap_or_default();
    let deny_all = |d: &String| d == "0.0.0.0/0" || d == "::/0";
    if !deny_out.iter().all(deny_all) {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            "cordon's network is an allow-list: name what the sandbox may reach in \
             `network.allowOut` (`denyOut` may only be 0.0.0.0/0)",
        ));
    }
    if !allow_out.is_empty() {
        let allow = allow_out
            .iter()
            .map(|a| AllowEntry::try_from(a.clone()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| E2bError::new(StatusCode::BAD_REQUEST, format!("allowOut: {e}")))?;
        return Ok((NetworkMode::Allow, Some(allow)));
    }
    let internet = asked.allow_internet_access.unwrap_or(true) && deny_out.is_empty();
    if internet && !shared.ceilings.reaches_nothing(tenant) {
        Ok((NetworkMode::Allow, None))
    } else {
        Ok((NetworkMode::Loopback, None))
    }
}

/// `GET /sandboxes/{id}`.
pub async fn info(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
) -> E2bResult<Json<Detail>> {
    let (row, b) = running(&shared, &tenant, &id).await?;
    Ok(Json(detail(&row, &b, true)))
}

/// `DELETE /sandboxes/{id}`: 204, or 404 when it is unknown or has ended.
pub async fn kill(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let (row, _) = running(&shared, &tenant, &id).await?;
    if let Some(b) = shared.boxes.remove(&row.id) {
        crate::sandbox_api::end(&shared, b, crate::sandbox_api::ended::KILLED).await;
    }
    Ok(StatusCode::NO_CONTENT)
}

#[derive(Debug, Deserialize)]
struct TimeoutBody {
    timeout: i64,
}

/// Ends `b` `secs` from now: the record first, then the reaper's deadline.
async fn end_in(shared: &Shared, tenant: &str, b: &LiveBox, secs: u64) -> E2bResult<i64> {
    let max = shared.config.bounds.max_timeout_secs;
    if secs > max {
        return Err(E2bError::new(
            StatusCode::BAD_REQUEST,
            format!("`timeout` may be at most {max} seconds on this server"),
        ));
    }
    let expires_ms = now_ms() + (secs as i64) * 1000;
    if !shared
        .store
        .extend_sandbox(tenant, &b.id, expires_ms)
        .await?
    {
        return Err(E2bError::not_found(&e2b_id(&b.id)));
    }
    b.set_deadline(Instant::now() + Duration::from_secs(secs));
    Ok(expires_ms)
}

/// `tenant`'s running sandbox `id`, kept `secs` more from now unless it
/// was to run longer already: never shortened.
async fn keep(shared: &Shared, tenant: &str, id: &str, secs: u64) -> E2bResult<Arc<LiveBox>> {
    let (row, b) = running(shared, tenant, id).await?;
    if row.expires_ms < now_ms().saturating_add((secs as i64).saturating_mul(1000)) {
        end_in(shared, tenant, &b, secs).await?;
    }
    Ok(b)
}

fn seconds(t: i64) -> E2bResult<u64> {
    u64::try_from(t).map_err(|_| {
        E2bError::new(
            StatusCode::BAD_REQUEST,
            "`timeout` is a whole number of seconds, 0 or more",
        )
    })
}

/// `POST /sandboxes/{id}/timeout`: from now, shorter or longer.
pub async fn set_timeout(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> E2bResult<StatusCode> {
    let asked: TimeoutBody = json_body(&shared, body)?;
    let secs = seconds(asked.timeout)?;
    let (_, b) = running(&shared, &tenant, &id).await?;
    end_in(&shared, &tenant, &b, secs).await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/connect`: the sandbox, resumed if it was paused
/// (201, its end `timeout` from now) or running (200, its end moved to
/// `timeout` from now unless it was later already).
pub async fn connect(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> E2bResult<(StatusCode, Json<E2bSandbox>)> {
    let asked: TimeoutBody = json_body(&shared, body)?;
    let secs = seconds(asked.timeout)?;
    let (_, b) = running(&shared, &tenant, &id).await?;
    if b.sandbox.is_paused() {
        wake(&shared, &tenant, &id, &b, secs).await?;
        return Ok((StatusCode::CREATED, Json(sandbox(&shared, &b))));
    }
    let b = keep(&shared, &tenant, &id, secs).await?;
    Ok((StatusCode::OK, Json(sandbox(&shared, &b))))
}

#[derive(Debug, Deserialize)]
struct RefreshBody {
    #[serde(default)]
    duration: Option<i64>,
}

/// `POST /sandboxes/{id}/refreshes`: keeps it alive `duration` seconds
/// more from now (60 by default), never shortening it.
pub async fn refresh(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> E2bResult<StatusCode> {
    let asked: RefreshBody = json_body(&shared, body)?;
    keep(
        &shared,
        &tenant,
        &id,
        seconds(asked.duration.unwrap_or(60))?,
    )
    .await?;
    Ok(StatusCode::NO_CONTENT)
}

/// `GET /sandboxes/{id}/metrics`'s query: unix seconds.
#[derive(Debug, Default, Deserialize)]
pub struct MetricsQuery {
    start: Option<i64>,
    end: Option<i64>,
}

/// E2B's `SandboxMetric`.
#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Metric {
    timestamp: Timestamp,
    timestamp_unix: i64,
    cpu_count: u32,
    cpu_used_pct: f64,
    mem_used: u64,
    mem_total: u64,
    mem_cache: u64,
    disk_used: u64,
    disk_total: u64,
}

/// `GET /sandboxes/{id}/metrics`: what was sampled (every 5 seconds, the
/// last hour) between `start` and `end`.
pub async fn metrics(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    query: Result<Query<MetricsQuery>, QueryRejection>,
) -> E2bResult<Json<Vec<Metric>>> {
    let Query(q) = query.map_err(|e| bad(e.body_text()))?;
    let (_, b) = running(&shared, &tenant, &id).await?;
    let from = q.start.map_or(0, |s| s.saturating_mul(1000));
    let to = q
        .end
        .map_or(i64::MAX, |e| e.saturating_mul(1000).saturating_add(999));
    let cpus = crate::boxes::cpus();
    let metrics = b
        .samples(from, to)
        .into_iter()
        .map(|s| Metric {
            timestamp: Timestamp::at(s.at_ms),
            timestamp_unix: s.at_ms / 1000,
            cpu_count: cpus,
            cpu_used_pct: (s.cpu_pct * 100.0).round() / 100.0,
            mem_used: s.usage.memory_used,
            mem_total: s.usage.memory_limit.unwrap_or(0),
            mem_cache: 0,
            disk_used: s.usage.disk_used.unwrap_or(0),
            disk_total: s.usage.disk_limit.unwrap_or(0),
        })
        .collect();
    Ok(Json(metrics))
}

/// `POST /sandboxes/{id}/pause`: 204, its processes stopped where they
/// are and its memory kept, until `connect` or `resume`; its timeout
/// stops too. 409 if it is paused already.
pub async fn pause(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
) -> E2bResult<StatusCode> {
    let (_, b) = running(&shared, &tenant, &id).await?;
    if b.sandbox.is_paused() {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already paused"),
        ));
    }
    b.pause(None).await.map_err(|e| paused_not(&id, e))?;
    Ok(StatusCode::NO_CONTENT)
}

/// `POST /sandboxes/{id}/resume`: 201 and the sandbox, going on from
/// where it was, its end `timeout` from now; 409 if it is not paused.
pub async fn resume(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> E2bResult<(StatusCode, Json<E2bSandbox>)> {
    let asked: TimeoutBody = json_body(&shared, body)?;
    let secs = seconds(asked.timeout)?;
    let (_, b) = running(&shared, &tenant, &id).await?;
    if !b.sandbox.is_paused() {
        return Err(E2bError::new(
            StatusCode::CONFLICT,
            format!("sandbox {id} is already running"),
        ));
    }
    wake(&shared, &tenant, &id, &b, secs).await?;
    Ok((StatusCode::CREATED, Json(sandbox(&shared, &b))))
}

/// `POST /sandboxes/{id}/fork`'s body.
#[derive(Debug, Deserialize)]
struct ForkBody {
    /// Seconds each fork runs (E2B's default: 15).
    #[serde(default = "fork_timeout")]
    timeout: i64,
    #[serde(default = "one")]
    count: u32,
}

fn fork_timeout() -> i64 {
    15
}

fn one() -> u32 {
    1
}

/// One fork's outcome, as E2B's `SandboxForkResult` spells it: cordon
/// makes every fork or none, so each is a sandbox.
#[derive(Debug, Serialize)]
pub struct ForkResult {
    sandbox: E2bSandbox,
}

/// `POST /sandboxes/{id}/fork`: 201 and a result per fork, each started
/// from the sandbox's files (see `sandbox_api::fork`: its processes and
/// memory are not carried, unlike E2B's).
pub async fn fork(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    Path(id): Path<String>,
    body: Result<Bytes, BytesRejection>,
) -> E2bResult<(StatusCode, Json<Vec<ForkResult>>)> {
    let asked: ForkBody = json_body(&shared, body)?;
    let secs = seconds(asked.timeout)?;
    let (row, _) = running(&shared, &tenant, &id).await?;
    let forks =
        crate::sandbox_api::fork(&shared, &tenant, &row.id, asked.count, Some(secs)).await?;
    let results = forks
        .iter()
        .map(|(_, b)| ForkResult {
            sandbox: sandbox(&shared, b),
        })
        .collect();
    Ok((StatusCode::CREATED, Json(results)))
}

/// Resumes paused `b` (E2B's `id`), its end `secs` from now.
async fn wake(shared: &Shared, tenant: &str, id: &str, b: &LiveBox, secs: u64) -> E2bResult<()> {
    // E2B's resume says how long it runs from now: what it had left is
    // not used.
    b.resume().await.map_err(|e| paused_not(id, e))?;
    end_in(shared, tenant, b, secs).await?;
    Ok(())
}

fn paused_not(id: &str, e: cordon_sandbox::Error) -> E2bError {
    match e {
        cordon_sandbox::Error::Gone => E2bError::not_found(id),
        e => E2bError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("sandbox {id}: {e}"),
        ),
    }
}

/// `GET /v2/sandboxes`'s query.
#[derive(Debug, Default, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ListQuery {
    /// `key=value&…`, each part URL-encoded, then the whole once more.
    metadata: Option<String>,
    /// `running`, `paused`, or both, comma-joined.
    state: Option<String>,
    order: Option<String>,
    started_after: Option<String>,
    template: Option<String>,
    limit: Option<i64>,
    next_token: Option<String>,
}

/// What a page of the list resumes after.
fn cursor(row: &SandboxRow) -> String {
    base64::engine::general_purpose::URL_SAFE_NO_PAD
        .encode(format!("{}:{}", row.created_ms, row.id))
}

fn read_cursor(token: &str) -> Option<(i64, String)> {
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
        .decode(token)
        .ok()?;
    let text = String::from_utf8(raw).ok()?;
    let (ms, id) = text.split_once(':')?;
    Some((ms.parse().ok()?, id.to_string()))
}

fn bad(m: impl Into<String>) -> E2bError {
    E2bError::new(StatusCode::BAD_REQUEST, m)
}

/// `GET /v2/sandboxes`: the tenant's running sandboxes, newest first
/// unless `order=asc`, filtered, in pages (`X-Next-Token` while more
/// remain).
pub async fn list(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    query: Result<Query<ListQuery>, QueryRejection>,
) -> E2bResult<Response> {
    let Query(q) = query.map_err(|e| bad(e.body_text()))?;
    let (page, next) = listing(&shared, &tenant, &q).await?;
    let mut r = Json(page).into_response();
    if let Some(next) = next.and_then(|n| HeaderValue::from_str(&n).ok()) {
        r.headers_mut().insert("x-next-token", next);
    }
    Ok(r)
}

/// `GET /sandboxes` (E2B's first version): every running one, by
/// metadata only.
pub async fn list_v1(
    State(shared): State<Arc<Shared>>,
    ApiKey(tenant): ApiKey,
    query: Result<Query<BTreeMap<String, String>>, QueryRejection>,
) -> E2bResult<Json<Vec<Detail>>> {
    let Query(q) = query.map_err(|e| bad(e.body_text()))?;
    let q = ListQuery {
        metadata: q.get("metadata").cloned(),
        limit: Some(PAGE_MAX as i64),
        ..Default::default()
    };
    Ok(Json(listing(&shared, &tenant, &q).await?.0))
}

async fn listing(
    shared: &Shared,
    tenant: &str,
    q: &ListQuery,
) -> E2bResult<(Vec<Detail>, Option<String>)> {
    let wanted: BTreeMap<String, String> = q
        .metadata
        .as_deref()
        .map(|m| {
            form_urlencoded::parse(m.as_bytes())
                .map(|(k, v)| (k.into_owned(), v.into_owned()))
                .collect()
        })
        .unwrap_or_default();
    let states: Vec<&str> = q
        .state
        .as_deref()
        .map(|s| s.split(',').map(str::trim).collect())
        .unwrap_or_else(|| vec!["running", "paused"]);
    if let Some(s) = states.iter().find(|s| !matches!(**s, "running" | "paused")) {
        return Err(bad(format!("state {s:?}: running or paused")));
    }
    let desc = match q.order.as_deref() {
        None | Some("desc") => true,
        Some("asc") => false,
        Some(o) => return Err(bad(format!("order {o:?}: asc or desc"))),
    };
    let after_ms = match &q.started_after {
        None => None,
        Some(t) => Some(
            chrono::DateTime::parse_from_rfc3339(t)
                .map_err(|e| bad(format!("startedAfter: {e}")))?
                .timestamp_millis(),
        ),
    };
    let limit = match q.limit {
        None => PAGE_MAX,
        Some(n) if (1..=PAGE_MAX as i64).contains(&n) => n as usize,
        Some(_) => return Err(bad(format!("limit: 1 to {PAGE_MAX}"))),
    };
    let from = match q.next_token.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => Some(read_cursor(t).ok_or_else(|| bad("nextToken is not one of ours"))?),
    };

    let mut rows: Vec<(SandboxRow, Arc<LiveBox>)> = shared
        .store
        .running_sandboxes(tenant, i64::MAX)
        .await?
        .into_iter()
        .filter_map(|r| shared.boxes.get(tenant, &r.id).map(|b| (r, b)))
        .filter(|(r, b)| {
            let has: BTreeMap<String, String> =
                serde_json::from_str(&r.metadata).unwrap_or_default();
            states.contains(&state_of(b))
                && wanted.iter().all(|(k, v)| has.get(k) == Some(v))
                && after_ms.is_none_or(|a| r.created_ms >= a)
                && q.template.as_ref().is_none_or(|t| *t == template_of(b))
        })
        .collect();
    rows.sort_by(|(a, _), (b, _)| (a.created_ms, &a.id).cmp(&(b.created_ms, &b.id)));
    if desc {
        rows.reverse();
    }
    if let Some((ms, id)) = &from {
        let past = |r: &SandboxRow| {
            let key = (r.created_ms, &r.id);
            if desc {
                key < (*ms, id)
            } else {
                key > (*ms, id)
            }
        };
        rows.retain(|(r, _)| past(r));
    }
    let more = rows.len() > limit;
    rows.truncate(limit);
    let next = more.then(|| rows.last().map(|(r, _)| cursor(r))).flatten();
    let page = rows.iter().map(|(r, b)| detail(r, b, false)).collect();
    Ok((page, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_read_back_and_refuse_strangers() {
        let row = SandboxRow {
            id: "sbx_00ff".into(),
            tenant: "t".into(),
            created_ms: 1_700_000_000_123,
            expires_ms: 0,
            ended_ms: None,
            end_reason: None,
            request: "{}".into(),
            metadata: "{}".into(),
        };
        assert_eq!(
            read_cursor(&cursor(&row)),
            Some((1_700_000_000_123, "sbx_00ff".into()))
        );
        assert_eq!(read_cursor("not base64!"), None);
        assert_eq!(read_cursor("bm9jb2xvbg"), None);
    }

    #[test]
    fn e2bs_requests_read_as_e2b_writes_them() {
        let body = r#"{"templateID":"base","timeout":300,"metadata":{"a":"b"},
            "envVars":{"FOO":"bar"},"secure":true,"allow_internet_access":false,
            "autoPause":false,"autoResume":{"enabled":false},"mcp":null}"#;
        let n: NewE2bSandbox = serde_json::from_str(body).unwrap();
        assert_eq!(n.template_id, "base");
        assert_eq!(n.timeout, Some(300));
        assert_eq!(n.env_vars.unwrap()["FOO"], "bar");
        assert_eq!(n.allow_internet_access, Some(false));
    }
}
