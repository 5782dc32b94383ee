//! Previews: what a sandbox's programs serve on a port of its loopback
//! (the agent's dev server), opened in a browser.
//!
//! Each previewed port is a site of its own: a port of this server's
//! address ([`cordon_lab::Site`]), or, with a sandbox domain, a host name
//! of its own (`{port}-{label}.{domain}`, a [`cordon_lab::Gate`] the
//! `hosts` layer hands that name's requests to). Browsers treat either as
//! a separate origin, so that the page, which is the sandbox's to shape,
//! can read no token or cookie of cordon's, nor another preview's. It takes a signed link that
//! expires (`?cordon_link=`, exchanged for a cookie of that origin alone),
//! or the owner's tenant's bearer token from a program; requests go to the
//! port through the sandbox's supervisor, HTTP and WebSockets both. The
//! site lives as long as the sandbox is listed.
//!
//! Which ports listen is read from the sandbox's `/proc/net/tcp` by a
//! command inside it: its output is the sandbox's to shape, and is parsed
//! as hostile text (bounded, malformed lines skipped).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::sync::Arc;
use std::time::Duration;

use axum::http::StatusCode;
use cordon_lab::{BearerCheck, Gate, Site, SiteOptions, Upstream};
use serde::{Deserialize, Serialize};

use crate::http::ApiError;
use crate::owner::Owner;
use crate::sandboxes::{Opened, Sandboxes};

/// How long a link is good for unless asked otherwise.
pub const LINK_TTL: Duration = Duration::from_secs(3600);

/// Ports previewed at once per sandbox: each is a listener of this server.
pub const MAX_PREVIEWS: usize = 16;

/// Bytes of `/proc/net/tcp` read from a sandbox: thousands of sockets.
const PROC_NET_LIMIT: u64 = 1 << 20;

/// `POST …/ports/{port}/preview`'s body, which may be empty.
#[derive(Debug, Default, Deserialize, utoipa::ToSchema)]
#[serde(deny_unknown_fields)]
pub struct PreviewRequest {
    /// Seconds the link is good for: 3600 unless given, at most 604800.
    pub expires_in: Option<u64>,
}

/// A preview's link.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(example = json!({
    "port": 3000,
    "url": "http://127.0.0.1:40211/?cordon_link=1796040000.8f2c0e3b...",
    "origin": "http://127.0.0.1:40211",
    "expires_at": "2026-11-30T13:00:00.000Z"
}))]
pub struct Preview {
    /// The port inside the sandbox.
    pub port: u16,
    /// Open this in a browser, or give it to someone: it lets any browser
    /// in until it expires.
    pub url: String,
    /// The preview's own origin, where a program may send the tenant's
    /// bearer token instead.
    pub origin: String,
    pub expires_at: crate::http::Timestamp,
}

/// A port something listens on inside the sandbox.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
pub struct OpenPort {
    pub port: u16,
    /// The address it listens on (`0.0.0.0`, `127.0.0.1`, `::`, …).
    pub address: String,
    /// Whether a preview reaches it: one listening on 127.0.0.1, or on
    /// every address. One on another address alone (`::1`) is not.
    pub previewable: bool,
}

/// `GET …/ports`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
pub struct OpenPorts {
    pub ports: Vec<OpenPort>,
    /// Whether this server opens previews (its operator may turn them off).
    pub previews: bool,
}

/// Where a preview is opened.
#[derive(Clone, Copy)]
pub(crate) enum Place<'a> {
    /// On a port of its own, its listener bound to `ip` (over TLS when
    /// the server is).
    Port {
        ip: IpAddr,
        tls: Option<&'a cordon_listen::Tls>,
    },
    /// On a host name of its own under the sandbox domain, over TLS if
    /// `secure`.
    Name { secure: bool },
}

/// The preview of `owner`'s `port`, opened now `at` its place if it is not
/// yet. `bearer` checks a program's token.
pub(crate) async fn open(
    sandboxes: &Sandboxes,
    owner: &Owner,
    port: u16,
    at: Place<'_>,
    bearer: BearerCheck,
) -> Result<Opened, ApiError> {
    let (sandbox, previews) = sandboxes.previews(owner).ok_or_else(|| not_live(owner))?;
    {
        let open = lock(&previews);
        if let Some(opened) = open.get(&port) {
            return Ok(opened.clone());
        }
        if open.len() >= MAX_PREVIEWS {
            return Err(too_many(owner));
        }
    }
    let upstream = Arc::new(Upstream::port(sandbox, port));
    let opened = make(owner, port, at, upstream, bearer).await?;
    // Two requests at once: the first one's stays, the other's goes.
    Ok(lock(&previews).entry(port).or_insert(opened).clone())
}

/// A preview of `upstream`, `owner`'s `port`, `at` its place.
async fn make(
    owner: &Owner,
    port: u16,
    at: Place<'_>,
    upstream: Arc<dyn cordon_lab::Forward>,
    bearer: BearerCheck,
) -> Result<Opened, ApiError> {
    let options = SiteOptions {
        base: "/".into(),
        name: "this preview",
        links: true,
        bearer: Some(bearer),
    };
    Ok(match at {
        Place::Name { secure } => Opened::Name(Gate::new(upstream, options, secure)),
        Place::Port { ip, tls } => {
            let unavailable = |e: std::io::Error| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "unavailable",
                    format!("cannot listen for a preview on {ip}: {e}"),
                )
            };
            let tcp = tokio::net::TcpListener::bind((ip, 0))
                .await
                .map_err(unavailable)?;
            let listener = cordon_listen::Listener::new(tcp, tls.cloned()).map_err(unavailable)?;
            let site = Site::serve_with(listener, upstream, options).map_err(unavailable)?;
            tracing::info!("{owner}: port {port} previewed at {}", site.addr());
            Opened::Port(Arc::new(site))
        }
    })
}

/// The previews this process serves for jobs that run on other workers,
/// by job id and port, each relayed to the job's worker; a job's are
/// closed when it stops running there.
#[derive(Default)]
pub(crate) struct RemotePreviews(std::sync::Mutex<HashMap<String, HashMap<u16, Opened>>>);

impl RemotePreviews {
    pub(crate) fn get(&self, id: &str, port: u16) -> Option<Opened> {
        lock(&self.0).get(id)?.get(&port).cloned()
    }

    /// Job `id`'s preview of `port`, opened `at` its place over `upstream`
    /// if it is not yet; and whether it was opened now.
    pub(crate) async fn open(
        &self,
        id: &str,
        port: u16,
        at: Place<'_>,
        upstream: Arc<dyn cordon_lab::Forward>,
        bearer: BearerCheck,
    ) -> Result<(Opened, bool), ApiError> {
        let owner = Owner::Job(id.to_string());
        {
            let open = lock(&self.0);
            let job = open.get(id);
            if let Some(opened) = job.and_then(|j| j.get(&port)) {
                return Ok((opened.clone(), false));
            }
            if job.is_some_and(|j| j.len() >= MAX_PREVIEWS) {
                return Err(too_many(&owner));
            }
        }
        let opened = make(&owner, port, at, upstream, bearer).await?;
        let mut open = lock(&self.0);
        let job = open.entry(id.to_string()).or_default();
        let new = !job.contains_key(&port);
        Ok((job.entry(port).or_insert(opened).clone(), new))
    }

    /// Closes job `id`'s previews here: their listeners and connections.
    pub(crate) fn close(&self, id: &str) {
        if lock(&self.0).remove(id).is_some() {
            tracing::info!("job {id}: its previews here are closed");
        }
    }
}

fn too_many(owner: &Owner) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "too_many_previews",
        format!("{owner} has {MAX_PREVIEWS} ports previewed already, the most it may"),
    )
}

/// The link to `opened`, `port`'s preview at `origin`, good for `ttl`.
pub(crate) fn link(opened: &Opened, port: u16, origin: String, ttl: Duration) -> Preview {
    let (token, expires) = opened.gate().link(ttl).expect("a preview takes links");
    Preview {
        port,
        url: format!("{origin}/?{}={token}", cordon_lab::site::LINK_PARAM),
        origin,
        expires_at: crate::http::Timestamp::at(expires.saturating_mul(1000) as i64),
    }
}

/// The link's lifetime a request asks for, checked.
pub(crate) fn ttl(req: &PreviewRequest) -> Result<Duration, ApiError> {
    match req.expires_in {
        None => Ok(LINK_TTL),
        Some(s) if s == 0 || s > cordon_lab::site::LINK_TTL_MAX.as_secs() => {
            Err(ApiError::bad_request(format!(
                "`expires_in` is seconds from 1 to {}, not {s}",
                cordon_lab::site::LINK_TTL_MAX.as_secs()
            )))
        }
        Some(s) => Ok(Duration::from_secs(s)),
    }
}

/// The ports that listen in `owner`'s sandbox.
pub(crate) async fn open_ports(
    sandboxes: &Sandboxes,
    owner: &Owner,
) -> Result<Vec<OpenPort>, ApiError> {
    let sandbox = sandboxes.get(owner).ok_or_else(|| not_live(owner))?;
    if sandbox.is_paused() {
        // A look inside it would wait for a resume nothing asked for.
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "paused",
            format!("{owner} is paused: its ports are seen once it is resumed"),
        ));
    }
    let req = cordon_sandbox::ExecRequest::argv(["cat", "/proc/net/tcp", "/proc/net/tcp6"])
        .timeout(Duration::from_secs(10))
        .output_limit(PROC_NET_LIMIT);
    let out = sandbox.exec(req).await.map_err(|e| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "unavailable",
            format!("cannot look at {owner}'s ports: {e}"),
        )
    })?;
    Ok(listening(&out.stdout_str()))
}

fn not_live(owner: &Owner) -> ApiError {
    ApiError::new(
        StatusCode::CONFLICT,
        "not_running",
        format!("{owner} has no live sandbox: its ports are reached while it runs"),
    )
}

/// The listening sockets of `/proc/net/tcp` and `tcp6` text, each port
/// once (the most reachable address kept), in order.
fn listening(text: &str) -> Vec<OpenPort> {
    let mut found: std::collections::BTreeMap<u16, OpenPort> = Default::default();
    for line in text.lines() {
        let mut fields = line.split_whitespace();
        let (Some(_slot), Some(local), Some(_remote), Some(state)) =
            (fields.next(), fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        // 0A: TCP_LISTEN.
        if state != "0A" {
            continue;
        }
        let Some((addr, port)) = local.split_once(':') else {
            continue;
        };
        let (Some(ip), Ok(port)) = (proc_ip(addr), u16::from_str_radix(port, 16)) else {
            continue;
        };
        let previewable = match ip {
            IpAddr::V4(v4) => v4 == Ipv4Addr::LOCALHOST || v4.is_unspecified(),
            // `::` takes IPv4 too unless the socket is IPv6 only, which
            // /proc does not say: taken at its word.
            IpAddr::V6(v6) => {
                v6.is_unspecified() || v6.to_ipv4_mapped() == Some(Ipv4Addr::LOCALHOST)
            }
        };
        let open = OpenPort {
            port,
            address: ip.to_string(),
            previewable,
        };
        match found.get(&port) {
            Some(had) if had.previewable || !previewable => {}
            _ => {
                found.insert(port, open);
            }
        }
    }
    found.into_values().collect()
}

/// An address as /proc writes it: the bytes of each 32-bit word in host
/// order (little-endian here), as hex.
fn proc_ip(hex: &str) -> Option<IpAddr> {
    let word = |s: &str| u32::from_str_radix(s, 16).ok().map(u32::swap_bytes);
    match hex.len() {
        8 => Some(IpAddr::V4(Ipv4Addr::from(word(hex)?))),
        32 => {
            let mut bytes = [0u8; 16];
            for i in 0..4 {
                let w = word(hex.get(i * 8..i * 8 + 8)?)?;
                bytes[i * 4..i * 4 + 4].copy_from_slice(&w.to_be_bytes());
            }
            Some(IpAddr::V6(Ipv6Addr::from(bytes)))
        }
        _ => None,
    }
}

fn lock<T>(m: &std::sync::Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listening_ports_are_read_from_hostile_text() {
        let text = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:0BB8 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1 0 10 0
   1: 00000000:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 2 1 0 10 0
   2: 0100007F:0BB8 0100007F:9C40 01 00000000:00000000 00:00000000 00000000     0        0 3 1 0 10 0
   3: 0200007F:0050 00000000:0000 0A
   4: garbage
   5: ZZZZZZZZ:0050 00000000:0000 0A
   6: 0100007F:FFFFF 00000000:0000 0A
  sl  local_address                         remote_address                        st
   0: 00000000000000000000000001000000:1538 00000000000000000000000000000000:0000 0A
   1: 00000000000000000000000000000000:1F90 00000000000000000000000000000000:0000 0A
   2: 0000000000000000FFFF00000100007F:1389 00000000000000000000000000000000:0000 0A
";
        let ports = listening(text);
        let got: Vec<(u16, &str, bool)> = ports
            .iter()
            .map(|p| (p.port, p.address.as_str(), p.previewable))
            .collect();
        assert_eq!(
            got,
            [
                (80, "127.0.0.2", false),
                (3000, "127.0.0.1", true),
                (5001, "::ffff:127.0.0.1", true),
                (5432, "::1", false),
                (8080, "0.0.0.0", true),
            ]
        );
    }

    #[test]
    fn a_link_lives_from_one_second_to_a_week() {
        assert_eq!(ttl(&PreviewRequest::default()).unwrap(), LINK_TTL);
        assert!(
            ttl(&PreviewRequest {
                expires_in: Some(0)
            })
            .is_err()
        );
        assert!(
            ttl(&PreviewRequest {
                expires_in: Some(604_801)
            })
            .is_err()
        );
        let week = PreviewRequest {
            expires_in: Some(604_800),
        };
        assert_eq!(ttl(&week).unwrap(), Duration::from_secs(604_800));
    }
}
