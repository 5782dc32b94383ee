//! The sandbox API's sandboxes: one record each, a tenant's own. The
//! sandbox itself lives in the process that made it; the record says what
//! it was made with, until when it may run, and when and why it ended.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Result, Store, now_ms};

/// A sandbox, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SandboxRow {
    pub id: String,
    pub tenant: String,
    pub created_ms: i64,
    /// When it is ended unless its timeout is extended.
    pub expires_ms: i64,
    pub ended_ms: Option<i64>,
    pub end_reason: Option<String>,
    /// The request it was made with, as JSON.
    pub request: String,
    /// A JSON object of strings.
    pub metadata: String,
}

fn from_row(row: &AnyRow) -> Result<SandboxRow> {
    Ok(SandboxRow {
        id: row.try_get("id")?,
        tenant: row.try_get("tenant")?,
        created_ms: row.try_get("created_ms")?,
        expires_ms: row.try_get("expires_ms")?,
        ended_ms: row.try_get("ended_ms")?,
        end_reason: row.try_get("end_reason")?,
        request: row.try_get("request")?,
        metadata: row.try_get("metadata")?,
    })
}

impl Store {
    /// Records a new sandbox of `tenant`'s, running until `expires_ms`.
    pub async fn insert_sandbox(
        &self,
        id: &str,
        tenant: &str,
        expires_ms: i64,
        request: &str,
        metadata: &str,
    ) -> Result<SandboxRow> {
        let created_ms = now_ms();
        sqlx::query(
            "INSERT INTO sandboxes (id, tenant, created_ms, expires_ms, request, metadata) \
             VALUES ($1, $2, $3, $4, $5, $6)",
        )
        .bind(id)
        .bind(tenant)
        .bind(created_ms)
        .bind(expires_ms)
        .bind(request)
        .bind(metadata)
        .execute(&self.pool)
        .await?;
        Ok(SandboxRow {
            id: id.to_string(),
            tenant: tenant.to_string(),
            created_ms,
            expires_ms,
            ended_ms: None,
            end_reason: None,
            request: request.to_string(),
            metadata: metadata.to_string(),
        })
    }

    /// A tenant's sandbox; another tenant's is as absent as a missing one.
    pub async fn sandbox(&self, tenant: &str, id: &str) -> Result<Option<SandboxRow>> {
        let row = sqlx::query(
            "SELECT id, tenant, created_ms, expires_ms, ended_ms, end_reason, request, metadata \
             FROM sandboxes WHERE id = $1 AND tenant = $2",
        )
        .bind(id)
        .bind(tenant)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// A tenant's sandboxes that have not ended, newest first.
    pub async fn running_sandboxes(&self, tenant: &str, limit: i64) -> Result<Vec<SandboxRow>> {
        let rows = sqlx::query(
            "SELECT id, tenant, created_ms, expires_ms, ended_ms, end_reason, request, metadata \
             FROM sandboxes WHERE tenant = $1 AND ended_ms IS NULL \
             ORDER BY created_ms DESC, id DESC LIMIT $2",
        )
        .bind(tenant)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(from_row).collect()
    }

    /// Every tenant's sandboxes that have not ended, oldest first: what a
    /// server that starts finds of the last one's.
    pub async fn all_running_sandboxes(&self) -> Result<Vec<SandboxRow>> {
        let rows = sqlx::query(
            "SELECT id, tenant, created_ms, expires_ms, ended_ms, end_reason, request, metadata \
             FROM sandboxes WHERE ended_ms IS NULL ORDER BY created_ms, id",
        )
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(from_row).collect()
    }

    /// Moves a running sandbox's end to `expires_ms`; false when it has
    /// ended (or is not the tenant's).
    pub async fn extend_sandbox(&self, tenant: &str, id: &str, expires_ms: i64) -> Result<bool> {
        let done = sqlx::query(
            "UPDATE sandboxes SET expires_ms = $1 \
             WHERE id = $2 AND tenant = $3 AND ended_ms IS NULL",
        )
        .bind(expires_ms)
        .bind(id)
        .bind(tenant)
        .execute(&self.pool)
        .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Records that a sandbox ended, and why; an end already recorded
    /// stays.
    pub async fn end_sandbox(&self, id: &str, reason: &str) -> Result<()> {
        sqlx::query(
            "UPDATE sandboxes SET ended_ms = $1, end_reason = $2 \
             WHERE id = $3 AND ended_ms IS NULL",
        )
        .bind(now_ms())
        .bind(reason)
        .bind(id)
        .execute(&self.pool)
        .await?;
        Ok(())
    }
}
