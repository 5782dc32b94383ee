//! Caps on live sessions, per tenant and in all: each holds a sandbox, so
//! without them one token could hold as many sandboxes as it asked for.
//! An API session is live while its sandbox is (from its first message
//! until it idles out or is deleted); an MCP session from its `initialize`
//! until it is deleted or idles out. Both kinds count against one budget.
//!
//! And caps on clones made while a request waits (a session's `repo`):
//! each is a git process, a download and up to a disk budget of files, so
//! a tenant's concurrent requests must not each start one.

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

impl Counts {
    /// One more for `tenant`, unless a cap is reached: then which one, and
    /// the count that reached it.
    fn take(&mut self, tenant: &str, per_tenant: usize, total: usize) -> Result<(), Full> {
        let mine = self.by_tenant.get(tenant).copied().unwrap_or(0);
        if mine >= per_tenant {
            return Err(Full::Tenant(mine));
        }
        if self.total >= total {
            return Err(Full::Total(self.total));
        }
        self.total += 1;
        *self.by_tenant.entry(tenant.to_string()).or_default() += 1;
        Ok(())
    }
}

/// Which cap refused, at what count.
enum Full {
    Tenant(usize),
    Total(usize),
}

fn lock(counts: &Mutex<Counts>) -> std::sync::MutexGuard<'_, Counts> {
    counts.lock().unwrap_or_else(|p| p.into_inner())
}

/// The live sessions' counts, and their caps.
pub struct SessionCaps {
    per_tenant: usize,
    total: usize,
    /// Only to tell a refused client when a slot frees itself.
    idle: Duration,
    counts: Arc<Mutex<Counts>>,
}

/// One place under a cap, given back when dropped.
pub struct Slot {
    counts: Arc<Mutex<Counts>>,
    tenant: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = lock(&self.counts);
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
            counts: Arc::default(),
        }
    }

    /// Live sessions: the tenant's, and in all.
    pub fn live(&self, tenant: &str) -> (usize, usize) {
        let c = lock(&self.counts);
        (c.by_tenant.get(tenant).copied().unwrap_or(0), c.total)
    }

    /// A slot for one more live session of `tenant`, or 429 saying which
    /// cap is reached and how a slot frees.
    pub fn acquire(self: &Arc<Self>, tenant: &str) -> Result<Slot, ApiError> {
        let free = format!(
            "end a session (DELETE /mcp with its Mcp-Session-Id, or DELETE \
             /v1/sessions/{{id}}) or wait until one has been idle for {}",
            humantime::format_duration(self.idle)
        );
        match lock(&self.counts).take(tenant, self.per_tenant, self.total) {
            Ok(()) => Ok(Slot {
                counts: self.counts.clone(),
                tenant: tenant.to_string(),
            }),
            Err(Full::Tenant(mine)) => Err(self.too_many(format!(
                "this tenant has {mine} live sessions, the most allowed per tenant \
                 (`cordon serve --sessions-per-tenant`); {free}"
            ))),
            Err(Full::Total(total)) => Err(self.too_many(format!(
                "the server has {total} live sessions, the most it allows (`cordon serve --sessions`); \
                 {free}, or try again later"
            ))),
        }
    }
}

/// Clones made while a request waits, per tenant and in all.
pub struct CloneCaps {
    per_tenant: usize,
    total: usize,
    counts: Arc<Mutex<Counts>>,
}

impl CloneCaps {
    pub fn new(per_tenant: usize, total: usize) -> Self {
        CloneCaps {
            per_tenant: per_tenant.max(1),
            total: total.max(1),
            counts: Arc::default(),
        }
    }

    /// A slot for one more clone of `tenant`'s, or 429.
    pub fn acquire(&self, tenant: &str) -> Result<Slot, ApiError> {
        let why = match lock(&self.counts).take(tenant, self.per_tenant, self.total) {
            Ok(()) => {
                return Ok(Slot {
                    counts: self.counts.clone(),
                    tenant: tenant.to_string(),
                });
            }
            Err(Full::Tenant(n)) => {
                format!("this tenant has {n} clones under way, the most at once")
            }
            Err(Full::Total(n)) => format!("the server has {n} clones under way, the most at once"),
        };
        Err(ApiError::new(
            StatusCode::TOO_MANY_REQUESTS,
            "too_many_clones",
            format!("{why}; try again once one has finished"),
        )
        .retry_after(Duration::from_secs(5)))
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
