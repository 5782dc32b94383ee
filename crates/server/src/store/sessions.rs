//! The agent's conversations over HTTP: one record each, a tenant's own.
//! Their logs and workspaces are files of the API process that made them.

use sqlx::Row;
use sqlx::any::AnyRow;

use super::{Result, Store, now_ms};

/// A conversation with the agent, as stored.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionRow {
    pub id: String,
    pub tenant: String,
    pub created_ms: i64,
    pub title: String,
    pub model: String,
}

fn session_from_row(row: &AnyRow) -> Result<SessionRow> {
    Ok(SessionRow {
        id: row.try_get("id")?,
        tenant: row.try_get("tenant")?,
        created_ms: row.try_get("created_ms")?,
        title: row.try_get("title")?,
        model: row.try_get("model")?,
    })
}

impl Store {
    /// Records a new session of `tenant`'s, untitled.
    pub async fn insert_session(&self, id: &str, tenant: &str, model: &str) -> Result<SessionRow> {
        let created_ms = now_ms();
        sqlx::query(
            "INSERT INTO sessions (id, tenant, created_ms, title, model) VALUES ($1, $2, $3, '', $4)",
        )
        .bind(id)
        .bind(tenant)
        .bind(created_ms)
        .bind(model)
        .execute(&self.pool)
        .await?;
        Ok(SessionRow {
            id: id.to_string(),
            tenant: tenant.to_string(),
            created_ms,
            title: String::new(),
            model: model.to_string(),
        })
    }

    /// A tenant's session; another tenant's is as absent as a missing one.
    pub async fn session(&self, tenant: &str, id: &str) -> Result<Option<SessionRow>> {
        let row = sqlx::query(
            "SELECT id, tenant, created_ms, title, model FROM sessions WHERE id = $1 AND tenant = $2",
        )
        .bind(id)
        .bind(tenant)
        .fetch_optional(&self.pool)
        .await?;
        row.as_ref().map(session_from_row).transpose()
    }

    /// A tenant's sessions, newest first.
    pub async fn sessions(&self, tenant: &str, limit: i64) -> Result<Vec<SessionRow>> {
        let rows = sqlx::query(
            "SELECT id, tenant, created_ms, title, model FROM sessions WHERE tenant = $1 \
             ORDER BY created_ms DESC, id DESC LIMIT $2",
        )
        .bind(tenant)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(session_from_row).collect()
    }

    /// Deletes a tenant's session; false when it had none by that id.
    pub async fn delete_session(&self, tenant: &str, id: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM sessions WHERE id = $1 AND tenant = $2")
            .bind(id)
            .bind(tenant)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Sets a session's title if it has none yet.
    pub async fn title_session(&self, id: &str, title: &str) -> Result<()> {
        sqlx::query("UPDATE sessions SET title = $1 WHERE id = $2 AND title = ''")
            .bind(title)
            .bind(id)
            .execute(&self.pool)
            .await?;
        Ok(())
    }
}
