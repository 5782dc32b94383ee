//! Caps on live sessions, per tenant and in all: each holds a sandbox, so
//! without them one token could hold as many sandboxes as it asked for.
//! An API session is live while its sandbox is (from its first message
//! until it idles out or is deleted); an MCP session from its `initialize`
//! until it is deleted or idles out. Both kinds count against one budget.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::http::StatusCode;

use crate::http::ApiError;

#[derive(Default)]
struct Counts {
    total: usize,
    by_tenant: HashMap<String, usize>,
}

/// The live sessions' counts, and their caps.
pub struct SessionCaps {
    per_tenant: usize,
    total: usize,
    /// Only to tell a refused client when a slot frees itself.
    idle: Duration,
    counts: Mutex<Counts>,
}

/// One live session's place under the caps, given back when dropped.
pub struct Slot {
    caps: Arc<SessionCaps>,
    tenant: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.caps.lock();
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_tenant.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_tenant.remove(&self.tenant);
            }
        }
    }
}

impl SessionCaps {
    pub fn new(per_tenant: usize, total: usize, idle: Duration) -> Self {
        SessionCaps {
            per_tenant: per_tenant.max(1),
            total: total.max(1),
            idle,
            counts: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Live sessions: the tenant's, and in all.
    pub fn live(&self, tenant: &str) -> (usize, usize) {
        let c = self.lock();
        (c.by_tenant.get(tenant).copied().unwrap_or(0), c.total)
    }

    /// A slot for one more live session of `tenant`, or 429 saying which
    /// cap is reached and how a slot frees.
    pub fn acquire(self: &Arc<Self>, tenant: &str) -> Result<Slot, ApiError> {
        let mut c = self.lock();
        let mine = c.by_tenant.get(tenant).copied().unwrap_or(0);
        let free = format!(
            "end a session (DELETE /mcp with its Mcp-Session-Id, or DELETE \
             /v1/sessions/{{id}}) or wait until one has been idle for {}",
            humantime::format_duration(self.idle)
        );
        if mine >= self.per_tenant {
            return Err(self.too_many(format!(
                "this tenant has {mine} live sessions, the most allowed per tenant \
                 (`cordon serve --sessions-per-tenant`); {free}"
            )));
        }
        if c.total >= self.total {
            return Err(self.too_many(format!(
                "the server has {} live sessions, the most it allows (`cordon serve --sessions`); \
                 {free}, or try again later",
                c.total
            )));
        }
        c.total += 1;
        *c.by_tenant.entry(tenant.to_string()).or_default() += 1;
        Ok(Slot {
            caps: self.clone(),
            tenant: tenant.to_string(),
        })
    }
}

impl SessionCaps {
    /// 429, with a `Retry-After` no later than when an untouched session
    /// idles out (sooner if a client ends one; a minute at most, so a
    /// client that waits is not told to wait an hour).
    fn too_many(&self, message: String) -> ApiError {
        ApiError::new(StatusCode::TOO_MANY_REQUESTS, "too_many_sessions", message)
            .retry_after(self.idle.min(Duration::from_secs(60)))
    }
}
