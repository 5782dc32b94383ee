//! `cordon serve` and `cordon token create`.

use std::net::SocketAddr;
use std::path::PathBuf;

use clap::{Args, Subcommand};
use cordon_server::AgentDefaults;
use cordon_server::store::Role;
use cordon_server::{ServerConfig, Store};

use crate::exit;

#[derive(Args, Debug)]
pub struct ServeArgs {
    /// Address to listen on
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub listen: SocketAddr,
    /// `postgres://…`, or a SQLite file [default: the XDG data directory's cordon/server.db]
    #[arg(long, value_name = "URL", env = "CORDON_DB", hide_env_values = true)]
    pub db: Option<String>,
    /// Where job workspaces live, and the key tenants' git logins are
    /// sealed with unless CORDON_SECRETS_KEY (or CORDON_CLUSTER_KEY) gives
    /// one [default: the XDG data directory's cordon/server]
    #[arg(long, value_name = "DIR")]
    pub data_dir: Option<PathBuf>,
    /// Keep finished jobs' workspaces and logs where every process can
    /// serve them: `s3://BUCKET[/PREFIX]` (endpoint, region and
    /// credentials from the AWS_* environment) or `file:///DIR` (a volume
    /// every process mounts); --keep-workspaces applies there
    #[arg(long, value_name = "URL", env = "CORDON_ARCHIVE")]
    pub archive: Option<cordon_server::archive::ArchiveUrl>,
    /// Jobs run at once [default: the number of CPUs]; `serve --workers 0`
    /// runs none (an API process beside `cordon worker`s)
    #[arg(long)]
    pub workers: Option<usize>,
    /// How long a worker's claim on a job lasts unless renewed (every sixth
    /// of it): a worker silent this long loses its jobs to the others
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::durations::parse_timeout)]
    pub lease: std::time::Duration,
    /// Times a job may be started: a job whose worker died (or restarted)
    /// is queued again until then, else failed
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(i64).range(1..=100))]
    pub max_attempts: i64,
    /// Jobs run at once per tenant
    #[arg(long, default_value_t = 4)]
    pub per_tenant: i64,
    /// Close the sandbox of an API or MCP session idle this long (`90s`,
    /// `15m`, `1h`); an API session's next message starts a new one, an MCP
    /// session is gone
    #[arg(long, value_name = "DURATION", default_value = "15m", value_parser = crate::durations::parse_timeout)]
    pub session_idle: std::time::Duration,
    /// On SIGTERM (or Ctrl-C), how long running jobs may still finish
    /// before they are cancelled (`0` cancels them at once); a second
    /// signal cuts it short
    #[arg(long, value_name = "DURATION", default_value = "30s", value_parser = crate::durations::parse_grace)]
    pub grace: std::time::Duration,
    /// Live sessions (API sessions with a sandbox, and /mcp sessions) at once
    #[arg(long, value_name = "N", default_value_t = 64)]
    pub sessions: usize,
    /// Refuse previews of sandboxes' ports (`POST …/ports/{port}/preview`),
    /// and keep the loopback of a sandbox whose network is off down
    #[arg(long)]
    pub no_previews: bool,
    /// A wildcard domain (its DNS and TLS certificate the operator's) under
    /// which `{port}-{id}.DOMAIN` reaches port PORT of a job's, session's or
    /// API sandbox's sandbox, as previews and E2B's `get_host` give it
    /// (`localhost` needs no DNS; `https://DOMAIN[:PORT]` behind a proxy
    /// that terminates TLS; docs/ports.md)
    #[arg(long, value_name = "[SCHEME://]DOMAIN[:PORT]")]
    pub sandbox_domain: Option<cordon_server::owner::SandboxDomain>,
    /// Live sessions (API and /mcp) at once per tenant
    #[arg(long, value_name = "N", default_value_t = 8)]
    pub sessions_per_tenant: usize,
    /// Remove a finished job's workspace this long after it ended (`30m`,
    /// `7d`; `0` at once, `forever` never); its output, events, result and
    /// log are kept
    #[arg(long, value_name = "DURATION", default_value = "24h", value_parser = parse_keep)]
    pub keep_workspaces: Keep,
    /// Workspace volumes kept mounted while unused (as root; see
    /// docs/volumes.md); past it, the least recently used are unmounted
    /// until next used
    #[arg(long, value_name = "N", default_value_t = cordon_sandbox::volume::KEEP_IDLE)]
    pub idle_volumes: usize,
    /// Keep N sandboxes ready (a warm pool; repeatable): `N` of the
    /// default image and size for jobs, or `N,for=jobs|sessions|sandboxes,
    /// image=NAME,memory=SIZE,disk=SIZE,network=off|loopback,
    /// backend=native|microvm`. A job (an agent session, a sandbox of the
    /// API or the E2B SDK) of that shape, with no `allow` and no display,
    /// takes one (see docs/pools.md)
    #[arg(long = "pool", value_name = "N[,KEY=VALUE...]")]
    pub pool: Vec<cordon_server::config::PoolSpec>,
    /// What every tenant's jobs and sessions may reach through cordon's
    /// broker, at most (repeatable: HOST[:PORT], *.DOMAIN, IP/CIDR, or
    /// @python @node @rust @debian @git-hosting). A job asks for hosts
    /// within it (`"network": "allow"`); without any, jobs reach nothing
    #[arg(long = "allow", value_name = "HOST", value_parser = parse_entry)]
    pub allow: Vec<String>,
    /// A tenant's own ceiling instead of --allow's: TENANT=HOST[,HOST...]
    /// (repeatable; `TENANT=` alone: nothing)
    #[arg(long = "tenant-allow", value_name = "TENANT=HOSTS", value_parser = parse_tenant_allow)]
    pub tenant_allow: Vec<(String, Vec<String>)>,
    /// An image tenants' jobs and sessions may ask for (repeatable):
    /// NAME=SOURCE (SOURCE a registry reference, oci:DIR[:TAG] or
    /// docker-archive:FILE on this machine), a registry reference as its own
    /// name, or HOST/PATH/* for any image under a registry path, pulled on
    /// first use. `sandbox.image` is the default of those that name none
    #[arg(long = "image", value_name = "NAME=SOURCE", value_parser = parse_image_entry)]
    pub images: Vec<cordon_server::catalog::CatalogEntry>,
    /// A tenant's own images instead of all --image's: TENANT=NAME[,NAME...]
    /// (names or HOST/PATH/* as given to --image; `TENANT=` alone: the
    /// default only)
    #[arg(long = "tenant-images", value_name = "TENANT=NAMES", value_parser = parse_tenant_images)]
    pub tenant_images: Vec<(String, Vec<String>)>,
    /// Bytes each tenant's own images (pulled, built or snapshotted
    /// through /v1/images) may come to, such as 20G; none: no limit
    #[arg(long, value_name = "SIZE", value_parser = cordon_sandbox::parse_size)]
    pub image_quota: Option<u64>,
    /// How long a layer no image names any more is kept before it is
    /// removed (seconds; a running sandbox's layers are always kept)
    #[arg(long, value_name = "SECS", default_value_t = 3600)]
    pub image_grace: u64,
    /// Let the ceilings' names resolve to private, loopback or link-local
    /// addresses (a job must still ask for it with `allow_private`)
    #[arg(long)]
    pub allow_private: bool,
    /// Serve over TLS with this certificate chain (PEM, the server's own
    /// first); read again when the file changes
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The private key of --tls-cert (PEM)
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Serve Prometheus metrics at /metrics on this address, plain HTTP
    /// and without a token (queue depth, jobs by state, durations,
    /// sandbox starts, leases): bind it to a network only your monitoring
    /// reaches
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<SocketAddr>,
    /// Where API processes reach this worker's --listen for its jobs'
    /// files, live views and Labs (`http://worker-1.cordon:8081`). Needs
    /// CORDON_CLUSTER_KEY, the secret every process of the deployment
    /// shares (at least 32 characters), in the environment of each
    #[arg(long, value_name = "URL", value_parser = cordon_server::cluster::check_advertise)]
    pub advertise: Option<String>,
}

/// One `--allow` entry, checked as the broker will read it.
fn parse_entry(s: &str) -> Result<String, String> {
    s.parse::<cordon_net::Entry>()
        .map(|_| s.trim().to_string())
        .map_err(|e| e.to_string())
}

fn parse_image_entry(s: &str) -> Result<cordon_server::catalog::CatalogEntry, String> {
    cordon_server::catalog::CatalogEntry::parse(s)
}

/// `TENANT=NAME[,NAME...]`.
fn parse_tenant_images(s: &str) -> Result<(String, Vec<String>), String> {
    let (tenant, names) = s.split_once('=').ok_or("expected TENANT=NAME[,NAME...]")?;
    let tenant = tenant.trim();
    cordon_server::store::check_tenant(tenant)?;
    let names = names
        .split(',')
        .map(str::trim)
        .filter(|n| !n.is_empty())
        .map(str::to_string)
        .collect();
    Ok((tenant.to_string(), names))
}

/// `TENANT=HOST[,HOST...]`.
fn parse_tenant_allow(s: &str) -> Result<(String, Vec<String>), String> {
    let (tenant, hosts) = s.split_once('=').ok_or("expected TENANT=HOST[,HOST...]")?;
    let tenant = tenant.trim();
    cordon_server::store::check_tenant(tenant)?;
    let hosts = hosts
        .split(',')
        .map(str::trim)
        .filter(|h| !h.is_empty())
        .map(parse_entry)
        .collect::<Result<Vec<_>, _>>()?;
    Ok((tenant.to_string(), hosts))
}

/// How long finished jobs' workspaces are kept.
#[derive(Debug, Clone, Copy)]
pub struct Keep(Option<std::time::Duration>);

fn parse_keep(s: &str) -> Result<Keep, String> {
    match s.trim() {
        "forever" | "never" => Ok(Keep(None)),
        "0" => Ok(Keep(Some(std::time::Duration::ZERO))),
        s => humantime::parse_duration(s)
            .map(|d| Keep(Some(d)))
            .map_err(|e| format!("invalid duration {s:?}: {e} (or `forever`)")),
    }
}

#[derive(Args, Debug)]
pub struct TokenArgs {
    #[command(subcommand)]
    pub command: TokenCommand,
}

#[derive(Subcommand, Debug)]
pub enum TokenCommand {
    /// Create a token for a tenant and print it (only its hash is stored).
    Create {
        #[arg(long)]
        tenant: String,
        /// The operator's: it may also list, create and revoke every
        /// tenant's tokens over the API (`/v1/tokens`)
        #[arg(long)]
        operator: bool,
        /// Print it as the E2B SDKs take it in `E2B_API_KEY` (`e2b_…`; the
        /// same token: cordon's API takes either spelling)
        #[arg(long)]
        e2b: bool,
        /// The server's database, as for `cordon serve --db`
        #[arg(long, value_name = "URL", env = "CORDON_DB", hide_env_values = true)]
        db: Option<String>,
    },
    /// List tokens: their ids (the start of each hash), tenants and ages.
    List {
        /// Only this tenant's
        #[arg(long)]
        tenant: Option<String>,
        /// The server's database, as for `cordon serve --db`
        #[arg(long, value_name = "URL", env = "CORDON_DB", hide_env_values = true)]
        db: Option<String>,
    },
    /// Revoke a token by its id (from `cordon token list`), or all of a
    /// tenant's; a running server refuses it from its next request on.
    Revoke {
        /// The token's id, or at least its first 8 hex digits
        #[arg(required_unless_present = "tenant", conflicts_with = "tenant")]
        id: Option<String>,
        /// Every token of this tenant
        #[arg(long)]
        tenant: Option<String>,
        /// The server's database, as for `cordon serve --db`
        #[arg(long, value_name = "URL", env = "CORDON_DB", hide_env_values = true)]
        db: Option<String>,
    },
}

fn data_home() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(std::env::temp_dir)
        .join("cordon")
}

fn default_db() -> String {
    data_home().join("server.db").display().to_string()
}

pub async fn token(args: TokenArgs) -> i32 {
    let db = match &args.command {
        TokenCommand::Create { db, .. }
        | TokenCommand::List { db, .. }
        | TokenCommand::Revoke { db, .. } => db.clone(),
    };
    let store = match Store::open(&db.unwrap_or_else(default_db)).await {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cordon: {e}");
            return exit::CONFIG;
        }
    };
    let fail = |e: cordon_server::store::StoreError| {
        eprintln!("cordon: {e}");
        exit::CONFIG
    };
    match args.command {
        TokenCommand::Create {
            tenant,
            operator,
            e2b,
            ..
        } => {
            let role = if operator {
                Role::Operator
            } else {
                Role::Tenant
            };
            match store.create_token(&tenant, role).await {
                Ok(t) if e2b => match cordon_server::e2b_key(&t.token) {
                    Some(key) => {
                        println!("{key}");
                        0
                    }
                    None => {
                        eprintln!("cordon: this token has no E2B spelling");
                        exit::CONFIG
                    }
                },
                Ok(t) => {
                    println!("{}", t.token);
                    0
                }
                Err(e) => fail(e),
            }
        }
        TokenCommand::List { tenant, .. } => match store.tokens(tenant.as_deref()).await {
            Ok(tokens) => {
                println!("{:<14}{:<24}{:<10}CREATED", "ID", "TENANT", "ROLE");
                for t in tokens {
                    let created = std::time::UNIX_EPOCH
                        + std::time::Duration::from_millis(t.created_ms.max(0) as u64);
                    let role = match t.role {
                        Role::Tenant => "tenant",
                        Role::Operator => "operator",
                    };
                    println!(
                        "{:<14}{:<24}{role:<10}{}",
                        t.id,
                        t.tenant,
                        humantime::format_rfc3339_seconds(created)
                    );
                }
                0
            }
            Err(e) => fail(e),
        },
        TokenCommand::Revoke { id: Some(id), .. } => match store.revoke_token(&id).await {
            Ok(Some(t)) => {
                eprintln!("cordon: revoked token {} of tenant {}", t.id, t.tenant);
                0
            }
            Ok(None) => {
                eprintln!("cordon: no token's id starts with {id} (see `cordon token list`)");
                1
            }
            Err(e) => fail(e),
        },
        TokenCommand::Revoke {
            tenant: Some(tenant),
            ..
        } => match store.revoke_tenant(&tenant).await {
            Ok(n) => {
                eprintln!("cordon: revoked {n} token(s) of tenant {tenant}");
                0
            }
            Err(e) => fail(e),
        },
        TokenCommand::Revoke { .. } => {
            eprintln!("cordon: give a token id or --tenant NAME");
            exit::CONFIG
        }
    }
}

pub async fn serve(args: ServeArgs) -> i32 {
    run(args, true).await
}

/// `cordon worker`: runs jobs from the shared database, serves no API.
pub async fn worker(args: ServeArgs) -> i32 {
    run(args, false).await
}

async fn run(args: ServeArgs, api: bool) -> i32 {
    let mut config = ServerConfig::new(
        args.db.unwrap_or_else(default_db),
        args.data_dir.unwrap_or_else(|| data_home().join("server")),
    );
    config.listen = args.listen;
    config.metrics_listen = args.metrics_listen;
    config.archive = args.archive;
    if let (Some(cert), Some(key)) = (&args.tls_cert, &args.tls_key) {
        config.tls = match cordon_listen::Tls::load(cert, key) {
            Ok(t) => Some(t),
            Err(e) => {
                eprintln!("cordon: --tls-cert/--tls-key: {e}");
                return exit::CONFIG;
            }
        };
    }
    (config.secrets_key, config.previous_secrets_keys) = match secrets_keys() {
        Ok(k) => k,
        Err(e) => {
            eprintln!("cordon: {e}");
            return exit::CONFIG;
        }
    };
    config.cluster = match cluster(args.advertise, api) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cordon: {e}");
            return exit::CONFIG;
        }
    };
    if let Some(w) = args.workers {
        config.workers = w;
    }
    if !api && config.workers == 0 {
        eprintln!("cordon: a worker with --workers 0 would run nothing");
        return exit::CONFIG;
    }
    config.api = api;
    config.lease = args.lease;
    config.max_attempts = args.max_attempts;
    config.per_tenant = args.per_tenant.max(1);
    config.session_idle = args.session_idle;
    config.grace = args.grace;
    config.previews = !args.no_previews;
    config.sandbox_domain = args.sandbox_domain.clone();
    config.sessions = args.sessions.max(1);
    config.sessions_per_tenant = args.sessions_per_tenant.max(1);
    config.keep_workspaces = args.keep_workspaces.0;
    config.idle_volumes = args.idle_volumes;
    config.network.all = cordon_net::PolicySpec {
        allow: args.allow,
        allow_private: args.allow_private,
    };
    for (tenant, allow) in args.tenant_allow {
        config.network.tenants.insert(
            tenant,
            cordon_net::PolicySpec {
                allow,
                allow_private: args.allow_private,
            },
        );
    }
    let settings = match crate::options::load_settings(Vec::new()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    // The sandbox settings are the jobs' defaults: the backend unless a
    // job asks for another, the memory unless it asks for other (up to the
    // bound), the process limit.
    let sb = &settings.resolved().sandbox;
    // Jobs always have a disk budget: `sandbox.disk`, else 1G.
    let disk = sb.disk.unwrap_or(cordon_server::job::DEFAULT_DISK);
    config.bounds.defaults =
        match cordon_sandbox::Limits::new(sb.memory, sb.pids, Some(disk), sb.cpus.unwrap_or(1)) {
            Ok(l) => l,
            Err(e) => return crate::options::config_error(e),
        };
    config.bounds.max_memory = config.bounds.max_memory.max(sb.memory);
    config.bounds.max_disk = config.bounds.max_disk.max(disk);
    config.protect_control_files = sb.protect_control_files;
    config.favor_cgroup_changes = sb.cgroup_favordynmods;
    config.backend = sb.backend;
    // The command line's pools replace the configuration's.
    config.pool = if args.pool.is_empty() {
        settings.resolved().pool.clone()
    } else {
        args.pool.clone()
    };
    config.images = cordon_server::catalog::ImageCatalog {
        entries: args.images,
        tenants: args.tenant_images.into_iter().collect(),
        default: sb.image.clone(),
        quota: args.image_quota,
        grace: Some(std::time::Duration::from_secs(args.image_grace)),
    };
    config.vm = sb.vm.clone();
    // The operator's MCP servers reach agent jobs and API sessions too.
    config.mcp_servers = match crate::mcp_cmd::configured(&settings) {
        Ok(m) => m,
        Err(e) => return crate::options::config_error(e),
    };
    // Agent jobs need a model; without one the server still runs the rest.
    config.agent = match crate::agent_flags::model_setup(&settings).await {
        Ok(m) => Some(AgentDefaults {
            provider: m.provider,
            agent: m.agent,
        }),
        Err(why) => {
            eprintln!("cordon: agent jobs are off: {why}");
            None
        }
    };
    let running = match cordon_server::start(config).await {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cordon: {e}");
            return exit::CONFIG;
        }
    };
    if !api {
        eprintln!(
            "cordon: worker {} runs up to {} jobs at once; /health on {}://{}",
            running.shared.worker,
            running.shared.config.workers,
            if running.shared.config.tls.is_some() {
                "https"
            } else {
                "http"
            },
            running.addr
        );
        return until_stopped(running).await;
    }
    // Starting with no configuration must still give a way in.
    match running.shared.store.token_count().await {
        // The first token is the operator's: whoever started the server.
        Ok(0) => match running
            .shared
            .store
            .create_token("default", Role::Operator)
            .await
        {
            Ok(t) => eprintln!(
                "cordon: no tokens yet; created an operator's token for tenant \"default\" \
                 (shown once, keep it):\n{}",
                t.token
            ),
            Err(e) => eprintln!("cordon: cannot create a first token: {e}"),
        },
        Ok(_) => {}
        Err(e) => eprintln!("cordon: {e}"),
    }
    let scheme = if running.shared.config.tls.is_some() {
        "https"
    } else {
        "http"
    };
    eprintln!("cordon: serving on {scheme}://{}", running.addr);
    until_stopped(running).await
}

/// The key tenants' secrets are sealed with, from `CORDON_SECRETS_KEY`,
/// and the earlier ones still opened, from `CORDON_SECRETS_KEY_PREVIOUS`
/// (separated by spaces); never flags: `ps` shows those.
type SecretsKeys = (
    Option<cordon_server::store::SecretsKey>,
    Vec<cordon_server::store::SecretsKey>,
);

fn secrets_keys() -> Result<SecretsKeys, String> {
    use cordon_server::store::SecretsKey;
    let current = std::env::var("CORDON_SECRETS_KEY")
        .ok()
        .filter(|k| !k.trim().is_empty())
        .map(|k| SecretsKey::from_passphrase(&k))
        .transpose()
        .map_err(|e| format!("CORDON_SECRETS_KEY: {e}"))?;
    let previous = std::env::var("CORDON_SECRETS_KEY_PREVIOUS")
        .unwrap_or_default()
        .split_whitespace()
        .enumerate()
        .map(|(i, k)| {
            SecretsKey::from_passphrase(k)
                .map_err(|e| format!("CORDON_SECRETS_KEY_PREVIOUS, key {}: {e}", i + 1))
        })
        .collect::<Result<_, _>>()?;
    Ok((current, previous))
}

/// The cluster key, from `CORDON_CLUSTER_KEY` (never a flag: `ps` shows
/// those), and where this process is reached.
fn cluster(
    advertise: Option<String>,
    api: bool,
) -> Result<Option<cordon_server::cluster::Cluster>, String> {
    let key = std::env::var("CORDON_CLUSTER_KEY")
        .ok()
        .filter(|k| !k.trim().is_empty());
    let Some(key) = key else {
        return match advertise {
            Some(_) => Err(
                "--advertise needs CORDON_CLUSTER_KEY in the environment: the secret every \
                 process of the deployment shares (make one with `openssl rand -hex 32`)"
                    .into(),
            ),
            None => Ok(None),
        };
    };
    let key = cordon_server::cluster::ClusterKey::new(&key)
        .map_err(|e| format!("CORDON_CLUSTER_KEY: {e}"))?;
    if !api && advertise.is_none() {
        eprintln!(
            "cordon: without --advertise, API processes cannot reach this worker's jobs' files, \
             live views and Labs"
        );
    }
    Ok(Some(cordon_server::cluster::Cluster { key, advertise }))
}

async fn until_stopped(running: cordon_server::Running) -> i32 {
    let mut term = match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cordon: {e}");
            return exit::SANDBOX;
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    let jobs = running.running_jobs();
    if jobs == 0 {
        eprintln!("cordon: stopping");
    } else {
        eprintln!(
            "cordon: stopping: {} running may finish within {} (a second signal cancels {})",
            cordon_tools::plural(jobs as u64, "job"),
            humantime::format_duration(running.shared.config.grace),
            if jobs == 1 { "it" } else { "them" },
        );
    }
    let shared = running.shared.clone();
    let stopping = running.shutdown();
    tokio::pin!(stopping);
    let stopped = tokio::select! {
        s = &mut stopping => s,
        _ = async {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        } => {
            eprintln!("cordon: cancelling the running jobs");
            shared.hurry();
            stopping.await
        }
    };
    if stopped.cancelled > 0 {
        eprintln!(
            "cordon: stopped; {} cancelled (recorded as cancelled, with the reason)",
            cordon_tools::plural(stopped.cancelled as u64, "job")
        );
    } else {
        eprintln!("cordon: stopped");
    }
    0
}

/// A domain for `--sandbox-domain`: lowercase labels of letters, digits
/// and `-`, at least two, without the leading `*.`.
#[cfg(test)]
mod tests {
    use super::{parse_keep, parse_tenant_allow};
    use std::time::Duration;

    #[test]
    fn tenant_ceilings_are_checked_as_the_broker_reads_them() {
        assert_eq!(
            parse_tenant_allow("acme=@python, *.acme.example:8443").unwrap(),
            (
                "acme".to_string(),
                vec!["@python".to_string(), "*.acme.example:8443".to_string()]
            )
        );
        assert_eq!(
            parse_tenant_allow("closed=").unwrap(),
            ("closed".to_string(), vec![])
        );
        for (bad, says) in [
            ("acme", "TENANT=HOST"),
            ("=a.example", "tenant name"),
            ("a b=a.example", "tenant name"),
            ("acme=@pyhton", "unknown preset"),
            ("acme=a.example:0", "port"),
        ] {
            let e = parse_tenant_allow(bad).unwrap_err();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn keep_workspaces_takes_durations_zero_and_forever() {
        assert_eq!(
            parse_keep("24h").unwrap().0,
            Some(Duration::from_secs(86400))
        );
        assert_eq!(parse_keep("0").unwrap().0, Some(Duration::ZERO));
        assert_eq!(parse_keep("forever").unwrap().0, None);
        let e = parse_keep("a while").unwrap_err();
        assert!(e.contains("forever"), "{e}");
    }
}
