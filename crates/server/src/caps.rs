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

/// Which cap refused, at what count.
enum Full {
    Tenant(usize),
    Total(usize),
}

/// Counts of one kind of place, capped per tenant and in all.
struct Caps {
    per_tenant: usize,
    total: usize,
    counts: Arc<Mutex<Counts>>,
}

impl Caps {
    fn new(per_tenant: usize, total: usize) -> Caps {
        Caps {
            per_tenant: per_tenant.max(1),
            total: total.max(1),
            counts: Arc::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Counts> {
        self.counts.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// One more place for `tenant`, unless a cap is reached: then which
    /// one, and the count that reached it.
    fn take(&self, tenant: &str) -> Result<Slot, Full> {
        let mut c = self.lock();
        let mine = c.by_tenant.get(tenant).copied().unwrap_or(0);
        if mine >= self.per_tenant {
            return Err(Full::Tenant(mine));
        }
        if c.total >= self.total {
            return Err(Full::Total(c.total));
        }
        c.total += 1;
        *c.by_tenant.entry(tenant.to_string()).or_default() += 1;
        Ok(Slot {
            counts: self.counts.clone(),
            tenant: tenant.to_string(),
        })
    }
}

/// One place under a cap, given back when dropped.
pub struct Slot {
    counts: Arc<Mutex<Counts>>,
    tenant: String,
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut c = self.counts.lock().unwrap_or_else(|p| p.into_inner());
        c.total = c.total.saturating_sub(1);
        if let Some(n) = c.by_tenant.get_mut(&self.tenant) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                c.by_tenant.remove(&self.tenant);
            }
        }
    }
}

/// The live sessions' counts, and their caps.
pub struct SessionCaps {
    caps: Caps,
    /// Only to tell a refused client when a slot frees itself.
    idle: Duration,
}

impl SessionCaps {
    pub fn new(per_tenant: usize, total: usize, idle: Duration) -> Self {
        SessionCaps {
            caps: Caps::new(per_tenant, total),
            idle,
        }
    }

    /// Live sessions: the tenant's, and in all.
    pub fn live(&self, tenant: &str) -> (usize, usize) {
        let c = self.caps.lock();
        (c.by_tenant.get(tenant).copied().unwrap_or(0), c.total)
    }

    /// A slot for one more live session of `tenant`, or 429 saying which
    /// cap is reached and how a slot frees.
    pub fn acquire(&self, tenant: &str) -> Result<Slot, ApiError> {
        let free = format!(
            "end a session (DELETE /mcp with its Mcp-Session-Id, or DELETE \
             /v1/sessions/{{id}}) or wait until one has been idle for {}",
            humantime::format_duration(self.idle)
        );
        self.caps.take(tenant).map_err(|full| match full {
            Full::Tenant(mine) => self.too_many(format!(
                "this tenant has {mine} live sessions, the most allowed per tenant \
                 (`cordon serve --sessions-per-tenant`); {free}"
            )),
            Full::Total(total) => self.too_many(format!(
                "the server has {total} live sessions, the most it allows (`cordon serve --sessions`); \
                 {free}, or try again later"
            )),
        })
    }
}

/// Clones made while a request waits, per tenant and in all.
pub struct CloneCaps(Caps);

impl CloneCaps {
    pub fn new(per_tenant: usize, total: usize) -> Self {
        CloneCaps(Caps::new(per_tenant, total))
    }

    /// A slot for one more clone of `tenant`'s, or 429.
    pub fn acquire(&self, tenant: &str) -> Result<Slot, ApiError> {
        self.0.take(tenant).map_err(|full| {
            let why = match full {
                Full::Tenant(n) => {
                    format!("this tenant has {n} clones under way, the most at once")
                }
                Full::Total(n) => format!("the server has {n} clones under way, the most at once"),
            };
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_clones",
                format!("{why}; try again once one has finished"),
            )
            .retry_after(Duration::from_secs(5))
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
