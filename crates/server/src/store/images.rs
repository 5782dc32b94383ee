//! A tenant's own images: what it pulled, built or snapshotted through the
//! API, by the name it gave. The rows are the tenant's view; the blobs are
//! in the image store of the process that made each image.

use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;
use utoipa::ToSchema;

use super::{Result, Store, StoreError, now_ms};

/// Where a tenant's image came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case", deny_unknown_fields)]
pub enum ImageOrigin {
    /// Pulled from a registry by this reference.
    Pulled(String),
    /// Built by this job.
    Built(String),
    /// A snapshot of this session's (or job's) sandbox.
    Snapshot(String),
}

/// One of a tenant's images, as `GET /v1/images` lists it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, ToSchema)]
pub struct OwnImage {
    /// What jobs and sessions name it by.
    pub name: String,
    /// Its manifest's digest: jobs may name it by this too.
    pub digest: String,
    /// Bytes of its layers, unpacked.
    pub size: u64,
    pub origin: ImageOrigin,
    /// Milliseconds since the epoch.
    pub created_ms: i64,
}

fn from_row(r: &AnyRow) -> Result<OwnImage> {
    let origin: String = r.try_get("origin")?;
    let size: i64 = r.try_get("size")?;
    Ok(OwnImage {
        name: r.try_get("name")?,
        digest: r.try_get("digest")?,
        size: u64::try_from(size).unwrap_or(0),
        origin: serde_json::from_str(&origin)
            .map_err(|e| StoreError::Invalid(format!("a stored image's origin: {e}")))?,
        created_ms: r.try_get("created_ms")?,
    })
}

macro_rules! columns {
    () => {
        "name, digest, size, origin, created_ms"
    };
}

impl Store {
    /// Records `tenant`'s image `name` (replacing one of that name) if the
    /// tenant's images, with it and without the one it replaces, come to
    /// at most `quota` bytes; `Refused` saying so if not.
    pub async fn put_own_image(
        &self,
        tenant: &str,
        name: &str,
        digest: &str,
        size: u64,
        origin: &ImageOrigin,
        quota: Option<u64>,
    ) -> Result<OwnImage> {
        let created_ms = now_ms();
        let size_col = i64::try_from(size).unwrap_or(i64::MAX);
        let origin_text = serde_json::to_string(origin).expect("an origin serializes");
        // One statement, so two writers cannot both pass the check.
        let done = sqlx::query(
            "INSERT INTO images (tenant, name, digest, size, origin, created_ms) \
             SELECT $1, $2, $3, $4, $5, $6 \
             WHERE $7 < 0 OR (SELECT COALESCE(SUM(size), 0) FROM images \
                              WHERE tenant = $1 AND name <> $2) + $4 <= $7 \
             ON CONFLICT (tenant, name) DO UPDATE SET digest = excluded.digest, \
             size = excluded.size, origin = excluded.origin, created_ms = excluded.created_ms",
        )
        .bind(tenant)
        .bind(name)
        .bind(digest)
        .bind(size_col)
        .bind(&origin_text)
        .bind(created_ms)
        .bind(quota.map_or(-1, |q| i64::try_from(q).unwrap_or(i64::MAX)))
        .execute(&self.pool)
        .await?;
        if done.rows_affected() == 0 {
            let used = self.own_images_size(tenant).await?;
            return Err(StoreError::Refused(format!(
                "this image ({size} bytes) would take your images past their quota: \
                 {used} of {} bytes are in use; delete some (DELETE /v1/images/NAME)",
                quota.unwrap_or(0)
            )));
        }
        Ok(OwnImage {
            name: name.to_string(),
            digest: digest.to_string(),
            size,
            origin: origin.clone(),
            created_ms,
        })
    }

    /// Bytes of all `tenant`'s images (an image's layers counted once per
    /// image that has them).
    pub async fn own_images_size(&self, tenant: &str) -> Result<u64> {
        let row = sqlx::query(
            "SELECT CAST(COALESCE(SUM(size), 0) AS BIGINT) AS total FROM images WHERE tenant = $1",
        )
        .bind(tenant)
        .fetch_one(&self.pool)
        .await?;
        let total: i64 = row.try_get("total")?;
        Ok(u64::try_from(total).unwrap_or(0))
    }

    /// `tenant`'s images, by name.
    pub async fn own_images(&self, tenant: &str) -> Result<Vec<OwnImage>> {
        let rows = sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM images WHERE tenant = $1 ORDER BY name"
        ))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(from_row).collect()
    }

    /// `tenant`'s image named `name`, or, for `sha256:HEX`, the one with
    /// that digest. Another tenant's is as absent as a missing one.
    pub async fn own_image(&self, tenant: &str, name: &str) -> Result<Option<OwnImage>> {
        let query = if name.starts_with("sha256:") {
            concat!(
                "SELECT ",
                columns!(),
                " FROM images WHERE tenant = $1 AND digest = $2 ORDER BY created_ms DESC LIMIT 1"
            )
        } else {
            concat!(
                "SELECT ",
                columns!(),
                " FROM images WHERE tenant = $1 AND name = $2"
            )
        };
        let row = sqlx::query(query)
            .bind(tenant)
            .bind(name)
            .fetch_optional(&self.pool)
            .await?;
        row.as_ref().map(from_row).transpose()
    }

    /// Forgets `tenant`'s image `name`; whether there was one.
    pub async fn delete_own_image(&self, tenant: &str, name: &str) -> Result<bool> {
        let done = sqlx::query("DELETE FROM images WHERE tenant = $1 AND name = $2")
            .bind(tenant)
            .bind(name)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected() > 0)
    }

    /// Every tenant's image, as (tenant, name, digest): what garbage
    /// collection keeps.
    pub async fn all_own_images(&self) -> Result<Vec<(String, String, String)>> {
        let rows = sqlx::query("SELECT tenant, name, digest FROM images")
            .fetch_all(&self.pool)
            .await?;
        rows.iter()
            .map(|r| {
                Ok((
                    r.try_get("tenant")?,
                    r.try_get("name")?,
                    r.try_get("digest")?,
                ))
            })
            .collect()
    }
}
