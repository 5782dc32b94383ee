//! A job's `repo`: the repository a worker clones into the job's workspace
//! before its sandbox starts, with the tenant's stored login for the host,
//! and the host-side git tools an agent job gets over it.
//!
//! The clone, pushes and pull requests are the worker's own network
//! traffic made on a tenant's behalf, so the tenant's network ceiling
//! bounds them as it bounds the job's sandbox: the host must be one the
//! ceiling lists, every address used must be one the broker would connect
//! to, and git and the forge client connect to the checked addresses only
//! and follow no redirect. Only `https://` and `http://` are taken: a path
//! or `file://` would read the worker's disk, `ssh://` would use the
//! worker's own keys, and `git://` cannot be pinned to an address.

use std::net::IpAddr;

use cordon_git::{Endpoint, HostCredentials, Ident, Login};
use cordon_net::{Host, Policy};

use axum::http::StatusCode;

use crate::http::ApiError;
use crate::job::RepoUrl;
use crate::store::{GitCredential, GitSecret, Store};

/// Why a repository or forge cannot be reached for a tenant.
#[derive(Debug, thiserror::Error)]
pub enum Unreachable {
    #[error(
        "{0} is beyond this tenant's network ceiling: the operator lists git hosts with `cordon serve --allow HOST` or `--tenant-allow TENANT=HOST`"
    )]
    BeyondCeiling(String),
    #[error(
        "{host} resolves only to addresses this tenant may not reach ({addrs}); the operator allows private addresses with `cordon serve --allow-private`, or lists the address itself"
    )]
    Private { host: String, addrs: String },
    #[error("cannot resolve {host}: {why}")]
    Resolve { host: String, why: String },
}

/// The addresses `endpoint` may be reached at for a tenant whose ceiling
/// is `ceiling`: its host must be listed there on its port, and only the
/// addresses the broker would connect to are kept.
pub async fn reach(ceiling: &Policy, endpoint: &Endpoint) -> Result<Vec<IpAddr>, Unreachable> {
    let shown = endpoint.key();
    let host = match endpoint.ip() {
        Some(ip) => Host::Ip(cordon_net::addr::canonical(ip)),
        None => Host::parse(&endpoint.host).map_err(|why| Unreachable::Resolve {
            host: shown.clone(),
            why,
        })?,
    };
    if ceiling.check(&host, endpoint.port).is_err() {
        return Err(Unreachable::BeyondCeiling(format!(
            "{}:{}",
            endpoint.host, endpoint.port
        )));
    }
    let found: Vec<IpAddr> = match host {
        Host::Ip(ip) => vec![ip],
        Host::Name(name) => tokio::net::lookup_host((name.as_str(), endpoint.port))
            .await
            .map_err(|e| Unreachable::Resolve {
                host: shown.clone(),
                why: e.to_string(),
            })?
            .map(|a| cordon_net::addr::canonical(a.ip()))
            .collect(),
    };
    let mut ok: Vec<IpAddr> = found
        .iter()
        .copied()
        .filter(|ip| ceiling.address_permitted(*ip, endpoint.port))
        .collect();
    ok.dedup();
    if ok.is_empty() {
        return Err(Unreachable::Private {
            host: shown,
            addrs: found
                .iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(", "),
        });
    }
    Ok(ok)
}

/// Refuses, as an API answer, a repository `tenant` may not reach now (the
/// worker checks again when it clones: the ceiling or the name's
/// addresses may change meanwhile).
pub(crate) async fn admit(ceiling: &Policy, repo: &RepoUrl) -> Result<(), ApiError> {
    reach(ceiling, &repo.endpoint())
        .await
        .map(|_| ())
        .map_err(|e| match e {
            Unreachable::Resolve { .. } => ApiError::bad_request(format!("`repo`: {e}")),
            _ => ApiError::new(
                StatusCode::FORBIDDEN,
                "beyond_ceiling",
                format!("`repo`: {e}"),
            ),
        })
}

/// What a job's repository comes to on the worker that runs it.
pub struct Prepared {
    pub creds: HostCredentials,
    /// Where pull requests are opened (with a stored login and a forge
    /// the tenant may reach), or why they cannot be.
    pub forge: Result<cordon_git::Forge, String>,
    pub author: Ident,
}

/// Where a tenant's clone goes, and within what.
pub struct Target {
    pub workspace: std::path::PathBuf,
    pub branch: String,
    pub existing: cordon_git::Existing,
    pub limits: cordon_git::Limits,
}

/// Clones `repo` for `tenant` as `target` says, with its login and within
/// its ceiling; with [`Existing::Keep`](cordon_git::Existing::Keep), a
/// clone already there (a job run again on this machine) is taken up
/// where the lost run left it. The repository, for the model's tools.
pub async fn clone(
    store: &Store,
    ceiling: &Policy,
    tenant: &str,
    repo: &RepoUrl,
    target: Target,
    allow_push: bool,
) -> Result<cordon_git::SessionRepository, String> {
    let prepared = prepare(store, ceiling, tenant, repo).await?;
    let (spec, creds) = (repo.spec().clone(), prepared.creds.clone());
    let cloned = tokio::task::spawn_blocking(move || {
        let Target {
            workspace,
            branch,
            existing,
            limits,
        } = target;
        if existing == cordon_git::Existing::Keep
            && std::fs::symlink_metadata(workspace.join(".git")).is_ok()
        {
            cordon_git::reopen(&spec, &workspace, &branch)
        } else {
            cordon_git::clone_within(&spec, &workspace, &branch, &creds, existing, &limits)
        }
    })
    .await
    .map_err(|e| format!("cannot clone the repository: {e}"))?
    .map_err(|e| e.to_string())?;
    Ok(cordon_git::SessionRepository {
        cloned,
        creds: prepared.creds,
        forge: prepared.forge,
        author: prepared.author,
        allow_push,
    })
}

/// A session's repository, for its tools: the clone as cordon made it,
/// and what `tenant` reaches it with now.
pub async fn session(
    store: &Store,
    ceiling: &Policy,
    tenant: &str,
    cloned: cordon_git::Cloned,
    allow_push: bool,
) -> Result<cordon_git::SessionRepository, String> {
    let repo = RepoUrl::try_from(cloned.url.clone())?;
    let p = prepare(store, ceiling, tenant, &repo).await?;
    Ok(cordon_git::SessionRepository {
        cloned,
        creds: p.creds,
        forge: p.forge,
        author: p.author,
        allow_push,
    })
}

/// The tenant's login for `repo`'s host, and the forge, each checked
/// against `ceiling`.
pub async fn prepare(
    store: &Store,
    ceiling: &Policy,
    tenant: &str,
    repo: &RepoUrl,
) -> Result<Prepared, String> {
    let endpoint = repo.endpoint();
    let addrs = reach(ceiling, &endpoint).await.map_err(|e| e.to_string())?;
    let stored: Option<(GitCredential, GitSecret)> = store
        .git_login(tenant, &endpoint.key())
        .await
        .map_err(|e| format!("cannot read the tenant's git credentials: {e}"))?;
    let login = stored.as_ref().map(|(c, secret)| Login {
        username: c.username.clone(),
        secret: secret.0.clone(),
    });
    let creds = HostCredentials::remote(&endpoint, login.as_ref(), &addrs);
    let mut author = Ident::cordon();
    let mut forge = Err(format!(
        "this tenant stored no login for {} (PUT /v1/git-credentials/{}), so no pull request can be opened",
        endpoint.key(),
        endpoint.key()
    ));
    if let Some((c, secret)) = &stored {
        if let (Some(name), Some(email)) = (&c.author_name, &c.author_email) {
            author = Ident {
                name: name.clone(),
                email: email.clone(),
            };
        }
        // A forge the tenant may not reach is said when a pull request is
        // asked for, not before: the clone and pushes need none.
        forge = match cordon_git::Forge::for_repository(
            &repo.spec().url,
            c.forge_api.as_deref(),
            c.forge.map(Into::into),
            secret.0.clone(),
        ) {
            Ok(f) => match Endpoint::of_url(f.api()) {
                None => Err(format!("{}: not an https:// or http:// forge API", f.api())),
                Some(api) => match reach(ceiling, &api).await {
                    Ok(addrs) => Ok(f.confined(addrs)),
                    Err(e) => Err(format!("the forge's API: {e}")),
                },
            },
            Err(e) => Err(e),
        };
    }
    Ok(Prepared {
        creds,
        forge,
        author,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ceiling(rules: &[&str], allow_private: bool) -> Policy {
        Policy::parse(rules, allow_private).unwrap()
    }

    fn endpoint(url: &str) -> Endpoint {
        Endpoint::of_url(url).unwrap()
    }

    #[tokio::test]
    async fn a_name_listed_in_the_ceiling_still_may_not_lead_to_a_private_address() {
        // `localhost` is listed, but resolves to loopback: refused unless
        // the ceiling allows private addresses or lists the address.
        let e = endpoint("http://localhost:8080/o/r.git");
        let err = reach(&ceiling(&["localhost:*"], false), &e)
            .await
            .unwrap_err();
        assert!(matches!(err, Unreachable::Private { .. }), "{err}");
        let addrs = reach(&ceiling(&["localhost:*"], true), &e).await.unwrap();
        assert!(addrs.iter().all(|a| a.is_loopback()), "{addrs:?}");
        let addrs = reach(&ceiling(&["localhost:*", "127.0.0.1:8080"], false), &e)
            .await
            .unwrap();
        assert_eq!(addrs, vec!["127.0.0.1".parse::<IpAddr>().unwrap()]);
    }

    #[tokio::test]
    async fn the_host_and_port_must_be_in_the_ceiling() {
        let c = ceiling(&["git.example", "10.0.0.0/8:*"], true);
        for url in [
            "https://other.example/o/r",
            "http://git.example:8080/o/r",
            "https://[::1]/o/r",
        ] {
            let err = reach(&c, &endpoint(url)).await.unwrap_err();
            assert!(matches!(err, Unreachable::BeyondCeiling(_)), "{url}: {err}");
        }
        let addrs = reach(&c, &endpoint("http://10.1.2.3:3000/o/r"))
            .await
            .unwrap();
        assert_eq!(addrs, vec!["10.1.2.3".parse::<IpAddr>().unwrap()]);
    }
}
