//! The archive's bookkeeping: which finished jobs went up, and which
//! still have to.

use sqlx::Row;

use super::{Result, Store, ids, now_ms};

impl Store {
    /// Records that finished job `id`'s workspace and log are in the
    /// archive; false if that was recorded already, or its workspace was
    /// removed meanwhile.
    pub async fn archived(&self, id: &str) -> Result<bool> {
        let changed = sqlx::query(
            "UPDATE jobs SET archived_ms = $1 WHERE id = $2 AND archived_ms IS NULL \
             AND workspace_removed_ms IS NULL AND finished_ms IS NOT NULL",
        )
        .bind(now_ms())
        .bind(id)
        .execute(&self.pool)
        .await?
        .rows_affected();
        Ok(changed > 0)
    }

    /// Finished jobs `worker` ran whose workspaces are neither archived nor
    /// removed, oldest first: what it still has to send up.
    pub async fn unarchived(&self, worker: &str, limit: i64) -> Result<Vec<String>> {
        let rows = sqlx::query(
            "SELECT id FROM jobs WHERE worker = $1 AND finished_ms IS NOT NULL \
             AND state <> 'queued' AND state <> 'running' \
             AND archived_ms IS NULL AND workspace_removed_ms IS NULL \
             ORDER BY finished_ms LIMIT $2",
        )
        .bind(worker)
        .bind(limit)
        .fetch_all(&self.pool)
        .await?;
        ids(&rows)
    }

    /// Whether job `id` is recorded as archived (false too if it is gone).
    pub async fn is_archived(&self, id: &str) -> Result<bool> {
        let row = sqlx::query("SELECT archived_ms FROM jobs WHERE id = $1")
            .bind(id)
            .fetch_optional(&self.pool)
            .await?;
        Ok(match row {
            Some(r) => r.try_get::<Option<i64>, _>("archived_ms")?.is_some(),
            None => false,
        })
    }
}
