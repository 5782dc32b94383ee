//! A tenant's logins for git hosts: written through the API, read by the
//! worker that clones, pushes or opens a pull request for one of the
//! tenant's jobs. The secret is never read back out through the API, and
//! never goes into a job's row, events or sandbox; the database holds it
//! sealed with the store's [`SecretsKey`](super::SecretsKey).

use serde::{Deserialize, Serialize};
use sqlx::Row;
use sqlx::any::AnyRow;
use utoipa::ToSchema;

use super::{Result, Store, StoreError, now_ms};

/// Which API a host's forge speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "lowercase")]
pub enum ForgeApi {
    /// GitHub's REST API (`Authorization: Bearer`).
    Github,
    /// Gitea's and Forgejo's (`/api/v1`, `Authorization: token`).
    Gitea,
}

impl ForgeApi {
    fn column(self) -> &'static str {
        match self {
            ForgeApi::Github => "github",
            ForgeApi::Gitea => "gitea",
        }
    }

    fn from_column(s: &str) -> Result<ForgeApi> {
        match s {
            "github" => Ok(ForgeApi::Github),
            "gitea" => Ok(ForgeApi::Gitea),
            other => Err(StoreError::Invalid(format!("a stored forge is {other:?}"))),
        }
    }
}

impl From<ForgeApi> for cordon_git::ForgeKind {
    fn from(f: ForgeApi) -> Self {
        match f {
            ForgeApi::Github => cordon_git::ForgeKind::GitHub,
            ForgeApi::Gitea => cordon_git::ForgeKind::Gitea,
        }
    }
}

/// One login, as stored, but for its secret (see
/// [`Store::git_login`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GitCredential {
    /// `host` or `host:port`, as a repository URL names it.
    pub host: String,
    pub username: String,
    pub forge: Option<ForgeApi>,
    /// The forge API's base URL, when not the host's usual one.
    pub forge_api: Option<String>,
    /// Who the job's commits are by (cordon's own ident when unset).
    pub author_name: Option<String>,
    pub author_email: Option<String>,
    pub updated_ms: i64,
}

/// A login's secret, opened. Never printed.
#[derive(Clone, PartialEq, Eq)]
pub struct GitSecret(pub String);

impl std::fmt::Debug for GitSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GitSecret(…)")
    }
}

/// What a login's secret is sealed for: a row moved to another tenant or
/// host does not open.
fn context(tenant: &str, host: &str) -> String {
    format!("git login\0{tenant}\0{host}")
}

macro_rules! columns {
    () => {
        "host, username, forge, forge_api, author_name, author_email, updated_ms"
    };
}

fn from_row(r: &AnyRow) -> Result<GitCredential> {
    let forge: Option<String> = r.try_get("forge")?;
    Ok(GitCredential {
        host: r.try_get("host")?,
        username: r.try_get("username")?,
        forge: forge.as_deref().map(ForgeApi::from_column).transpose()?,
        forge_api: r.try_get("forge_api")?,
        author_name: r.try_get("author_name")?,
        author_email: r.try_get("author_email")?,
        updated_ms: r.try_get("updated_ms")?,
    })
}

impl Store {
    /// Stores `c` with `secret` as `tenant`'s login for `c.host`,
    /// replacing the one there was.
    pub async fn put_git_credential(
        &self,
        tenant: &str,
        c: &GitCredential,
        secret: &GitSecret,
    ) -> Result<()> {
        let sealed = self.secrets()?.seal(&secret.0, &context(tenant, &c.host));
        sqlx::query(
            "INSERT INTO git_credentials \
             (tenant, host, username, secret, forge, forge_api, author_name, author_email, updated_ms) \
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9) \
             ON CONFLICT (tenant, host) DO UPDATE SET username = excluded.username, \
             secret = excluded.secret, forge = excluded.forge, forge_api = excluded.forge_api, \
             author_name = excluded.author_name, author_email = excluded.author_email, \
             updated_ms = excluded.updated_ms",
        )
        .bind(tenant)
        .bind(&c.host)
        .bind(&c.username)
        .bind(sealed)
        .bind(c.forge.map(ForgeApi::column))
        .bind(c.forge_api.as_deref())
        .bind(c.author_name.as_deref())
        .bind(c.author_email.as_deref())
        .bind(now_ms())
        .execute(&self.pool)
        .await?;
        Ok(())
    }

    /// The row of `tenant`'s login for `host`, its sealed secret with it.
    async fn login_row(&self, tenant: &str, host: &str) -> Result<Option<AnyRow>> {
        Ok(sqlx::query(concat!(
            "SELECT secret, ",
            columns!(),
            " FROM git_credentials WHERE tenant = $1 AND host = $2"
        ))
        .bind(tenant)
        .bind(host)
        .fetch_optional(&self.pool)
        .await?)
    }

    /// `tenant`'s login for `host`, if it stored one.
    pub async fn git_credential(&self, tenant: &str, host: &str) -> Result<Option<GitCredential>> {
        self.login_row(tenant, host)
            .await?
            .as_ref()
            .map(from_row)
            .transpose()
    }

    /// `tenant`'s login for `host` with its secret, opened: for the worker
    /// that clones, pushes or opens a pull request with it.
    pub async fn git_login(
        &self,
        tenant: &str,
        host: &str,
    ) -> Result<Option<(GitCredential, GitSecret)>> {
        let Some(row) = self.login_row(tenant, host).await? else {
            return Ok(None);
        };
        let sealed: String = row.try_get("secret")?;
        let keys = self.secrets()?;
        let context = context(tenant, host);
        let opened = keys.open(
            &sealed,
            &context,
            &format!("the stored login for {}", cordon_tools::printable(host)),
        )?;
        if opened.stale {
            // Sealed with an earlier key: sealed again with this one, unless
            // the row changed meanwhile (another process did it, or a PUT).
            let resealed = keys.seal(&opened.secret, &context);
            sqlx::query(
                "UPDATE git_credentials SET secret = $1 \
                 WHERE tenant = $2 AND host = $3 AND secret = $4",
            )
            .bind(resealed)
            .bind(tenant)
            .bind(host)
            .bind(&sealed)
            .execute(&self.pool)
            .await?;
            tracing::info!(
                tenant,
                host,
                "a git login sealed again with the current secrets key"
            );
        }
        Ok(Some((from_row(&row)?, GitSecret(opened.secret))))
    }

    /// `tenant`'s logins, by host.
    pub async fn git_credentials(&self, tenant: &str) -> Result<Vec<GitCredential>> {
        sqlx::query(concat!(
            "SELECT ",
            columns!(),
            " FROM git_credentials WHERE tenant = $1 ORDER BY host"
        ))
        .bind(tenant)
        .fetch_all(&self.pool)
        .await?
        .iter()
        .map(from_row)
        .collect()
    }

    /// Removes `tenant`'s login for `host`; what it was, if any.
    pub async fn delete_git_credential(
        &self,
        tenant: &str,
        host: &str,
    ) -> Result<Option<GitCredential>> {
        sqlx::query(concat!(
            "DELETE FROM git_credentials WHERE tenant = $1 AND host = $2 RETURNING ",
            columns!()
        ))
        .bind(tenant)
        .bind(host)
        .fetch_optional(&self.pool)
        .await?
        .as_ref()
        .map(from_row)
        .transpose()
    }

    /// Removes every login of `tenant`; how many there were.
    pub async fn delete_git_credentials(&self, tenant: &str) -> Result<u64> {
        let done = sqlx::query("DELETE FROM git_credentials WHERE tenant = $1")
            .bind(tenant)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }
}
