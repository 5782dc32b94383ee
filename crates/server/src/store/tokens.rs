//! Bearer tokens: only each token's SHA-256 is stored, and a token is
//! named by the start of that hash (its id), so nothing the database holds
//! or a list shows can be used to sign in.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use sqlx::Row;
use sqlx::any::AnyRow;
use utoipa::ToSchema;

use super::{Result, Store, StoreError, now_ms, random_hex};

/// What every token cordon makes begins with.
pub const TOKEN_PREFIX: &str = "cdn_";

/// What the same tokens begin with as the E2B SDKs want them.
pub const E2B_PREFIX: &str = "e2b_";

/// Hex digits of a token's hash that name it in lists.
pub const TOKEN_ID_CHARS: usize = 12;

/// What a token may do beyond its tenant's jobs and sessions.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// Its tenant's jobs and sessions, nothing else.
    #[default]
    Tenant,
    /// Its tenant's jobs and sessions, and every tenant's tokens
    /// (`/v1/tokens`); never another tenant's jobs.
    Operator,
}

impl Role {
    fn column(self) -> i64 {
        match self {
            Role::Tenant => 0,
            Role::Operator => 1,
        }
    }

    fn from_column(v: i64) -> Role {
        if v == 1 { Role::Operator } else { Role::Tenant }
    }
}

/// A token as lists show it: never the token, only its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TokenRow {
    pub id: String,
    pub tenant: String,
    pub role: Role,
    pub created_ms: i64,
}

/// A token just made: the only time the token itself is known.
#[derive(Debug, Clone)]
pub struct NewToken {
    pub token: String,
    pub row: TokenRow,
}

/// Who a request's token speaks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    pub tenant: String,
    pub role: Role,
}

/// Whether `tenant` is a tenant's name: 1 to 64 letters, digits, `-`,
/// `_` or `.`.
pub fn check_tenant(tenant: &str) -> std::result::Result<(), String> {
    let ok = (1..=64).contains(&tenant.len())
        && tenant
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c));
    if ok {
        Ok(())
    } else {
        Err("a tenant name is 1 to 64 letters, digits, '-', '_' or '.'".into())
    }
}

fn hash_token(token: &str) -> String {
    Sha256::digest(token.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A token's id: the start of its hash.
fn id_of(hash: &str) -> String {
    hash.chars().take(TOKEN_ID_CHARS).collect()
}

/// A row of `hash, tenant, operator, created_ms`, named by its id.
fn token_from_row(row: &AnyRow) -> Result<TokenRow> {
    let hash: String = row.try_get("hash")?;
    Ok(TokenRow {
        id: id_of(&hash),
        tenant: row.try_get("tenant")?,
        role: Role::from_column(row.try_get("operator")?),
        created_ms: row.try_get("created_ms")?,
    })
}

impl Store {
    /// A new token for `tenant`; only its hash is stored.
    pub async fn create_token(&self, tenant: &str, role: Role) -> Result<NewToken> {
        let tenant = tenant.trim();
        check_tenant(tenant).map_err(StoreError::Refused)?;
        let token = format!("{TOKEN_PREFIX}{}", random_hex(24));
        let hash = hash_token(&token);
        let created_ms = now_ms();
        sqlx::query(
            "INSERT INTO tokens (hash, tenant, operator, created_ms) VALUES ($1, $2, $3, $4)",
        )
        .bind(&hash)
        .bind(tenant)
        .bind(role.column())
        .bind(created_ms)
        .execute(&self.pool)
        .await?;
        Ok(NewToken {
            token,
            row: TokenRow {
                id: id_of(&hash),
                tenant: tenant.to_string(),
                role,
                created_ms,
            },
        })
    }

    /// Tokens, oldest first: all, or `tenant`'s. A token is named by its
    /// id, the start of its hash (the token itself is never stored).
    pub async fn tokens(&self, tenant: Option<&str>) -> Result<Vec<TokenRow>> {
        let rows = sqlx::query(
            "SELECT hash, tenant, operator, created_ms FROM tokens \
             WHERE ($1 = '' OR tenant = $1) ORDER BY created_ms, hash",
        )
        .bind(tenant.unwrap_or(""))
        .fetch_all(&self.pool)
        .await?;
        rows.iter().map(token_from_row).collect()
    }

    /// Revokes the one token whose id starts with `id` (at least 8 hex
    /// digits); its next request is refused. `Refused` when `id` is not
    /// such a prefix or names several tokens; `None` when it names none.
    pub async fn revoke_token(&self, id: &str) -> Result<Option<TokenRow>> {
        let id = id.trim().to_ascii_lowercase();
        if !(8..=64).contains(&id.len()) || !id.chars().all(|c| c.is_ascii_hexdigit()) {
            return Err(StoreError::Refused(
                "a token id is 8 to 64 hex digits, as `cordon token list` shows it".into(),
            ));
        }
        // Few tokens exist; matching in Rust keeps LIKE's wildcards out.
        let mut hashes = Vec::new();
        for r in sqlx::query("SELECT hash FROM tokens")
            .fetch_all(&self.pool)
            .await?
        {
            let h: String = r.try_get("hash")?;
            if h.starts_with(&id) {
                hashes.push(h);
            }
        }
        match hashes.as_slice() {
            [] => Ok(None),
            [hash] => sqlx::query(
                "DELETE FROM tokens WHERE hash = $1 \
                 RETURNING hash, tenant, operator, created_ms",
            )
            .bind(hash)
            .fetch_optional(&self.pool)
            .await?
            .as_ref()
            .map(token_from_row)
            .transpose(),
            _ => Err(StoreError::Refused(format!(
                "{id} is the start of {} tokens' ids; give more of it",
                hashes.len()
            ))),
        }
    }

    /// Revokes every token of `tenant`; how many there were.
    pub async fn revoke_tenant(&self, tenant: &str) -> Result<u64> {
        let done = sqlx::query("DELETE FROM tokens WHERE tenant = $1")
            .bind(tenant)
            .execute(&self.pool)
            .await?;
        Ok(done.rows_affected())
    }

    /// Whom a token speaks for; `None` for a token no one holds.
    pub async fn caller(&self, token: &str) -> Result<Option<Caller>> {
        // E2B's spelling of a token (`cordon token create --e2b`) is the
        // same token.
        let token = match token.strip_prefix(E2B_PREFIX) {
            Some(body) => format!("{TOKEN_PREFIX}{body}"),
            None => token.to_string(),
        };
        let row = sqlx::query("SELECT tenant, operator FROM tokens WHERE hash = $1")
            .bind(hash_token(&token))
            .fetch_optional(&self.pool)
            .await?;
        row.map(|r| {
            Ok(Caller {
                tenant: r.try_get("tenant")?,
                role: Role::from_column(r.try_get("operator")?),
            })
        })
        .transpose()
    }

    pub async fn token_count(&self) -> Result<i64> {
        Ok(sqlx::query("SELECT COUNT(*) AS n FROM tokens")
            .fetch_one(&self.pool)
            .await?
            .try_get("n")?)
    }
}
