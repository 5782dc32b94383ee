//! A Lab's or a preview's own origin: one listener each, for browsers.
//!
//! JupyterLab's pages, and whatever a sandbox serves on a port, are the
//! sandbox's to shape (it can replace the server, or a notebook can carry
//! script), so they must never run in cordon's own origin, where the web UI
//! keeps its token, nor in another site's. Each is served from a port of
//! its own, which browsers treat as a separate origin. A browser gets in
//! with a one-time ticket in the
//! URL (`?cordon_ticket=`), which is exchanged at once for an `HttpOnly`,
//! `SameSite=Strict` cookie scoped to the Lab's path, and the browser is
//! sent on to the same URL without it: the ticket is spent before anything
//! could log or leak it, and no bearer token is ever in a URL.
//!
//! Cookies do not tell ports apart, and other ports of the same host are
//! the same site, so a hostile Lab's page could send requests to another
//! Lab's port with that Lab's cookie. The listener refuses them: a browser
//! request from another origin (`Sec-Fetch-Site`, `Origin`) is answered
//! 403, except a top-level GET navigation, which cannot read the answer.
//!
//! A preview also takes a signed link, good until it expires and for as
//! many browsers as it is given to (`?cordon_link=EXP.MAC`, an HMAC of the
//! expiry under a key of the site's own), and a program's bearer token, as
//! the server that made the site checks it ([`SiteOptions`]).
//!
//! The checks are a [`Gate`]; a [`Site`] is a gate with a listener of its
//! own. A server that tells sites apart by host name instead (a wildcard
//! domain, one name per sandbox's port) hands each name's requests to its
//! gate: the origin is then the name, and the cookie is the name's alone.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::response::IntoResponse;
use http::header::{self, HeaderValue};
use http::{Method, Request, Response, StatusCode};

/// The prefix of every cookie cordon sets for a Lab; a request's cookies
/// of this name are cordon's, and a response setting one is refused.
pub const COOKIE_PREFIX: &str = "cordon_lab";

/// The query parameter that carries a ticket.
pub const TICKET_PARAM: &str = "cordon_ticket";

/// The query parameter that carries a signed link.
pub const LINK_PARAM: &str = "cordon_link";

/// The longest a signed link may be good for.
pub const LINK_TTL_MAX: Duration = Duration::from_secs(7 * 24 * 3600);

type Hmac = hmac::Hmac<sha2::Sha256>;

/// What the server that made a site says of a bearer token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bearer {
    /// Its owner's: in.
    Allowed,
    /// No token the server knows: 401.
    Unknown,
    /// Another tenant's, to whom the site is as absent as a missing one:
    /// 404.
    Stranger,
}

/// The server's check of a bearer token sent to a site.
pub type BearerCheck =
    Arc<dyn Fn(String) -> Pin<Box<dyn Future<Output = Bearer> + Send>> + Send + Sync>;

/// What a [`Site`] serves and who it lets in besides a one-time ticket's
/// browser.
#[derive(Clone)]
pub struct SiteOptions {
    /// Where it is mounted: starts and ends with `/`.
    pub base: String,
    /// What it is, for the answers it gives (`this Lab`, `this preview`).
    pub name: &'static str,
    /// Whether signed links ([`Site::link`]) open it.
    pub links: bool,
    /// Programs' bearer tokens, checked by this.
    pub bearer: Option<BearerCheck>,
}

impl SiteOptions {
    /// A Lab mounted at `base`: tickets only.
    pub fn lab(base: String) -> SiteOptions {
        SiteOptions {
            base,
            name: "this Lab",
            links: false,
            bearer: None,
        }
    }
}

/// How long a ticket may wait to be used.
pub const TICKET_TTL: Duration = Duration::from_secs(60);

/// Unspent tickets kept; a caller asking for more loses its oldest.
const MAX_TICKETS: usize = 64;

/// Browsers signed in at once; the 65th logs the first out.
const MAX_SESSIONS: usize = 64;

/// An answer on its way back from the Lab.
pub type Forwarding<'a> = Pin<Box<dyn Future<Output = Response<Body>> + Send + 'a>>;

/// Where a [`Site`] sends the requests it lets in: the sandbox's Jupyter
/// ([`crate::Upstream`]), or the process of a deployment that runs the
/// sandbox. A request's path is the Lab's, its credentials are the Site's
/// to drop (see `proxy::clean_request`), and a WebSocket upgrade
/// is the implementation's to join.
pub trait Forward: Send + Sync {
    /// Jupyter's answer to `req`, or a 502 that says what failed.
    fn forward(&self, req: Request<Body>) -> Forwarding<'_>;
    /// How long since a request last came.
    fn idle(&self) -> Duration;
}

/// A Lab served on its own port. Dropping it stops the listener.
pub struct Site {
    addr: SocketAddr,
    /// `http` or `https`, as the listener serves.
    scheme: &'static str,
    gate: Gate,
    task: tokio::task::JoinHandle<()>,
}

/// Who gets through to a site's upstream, and the way in for browsers:
/// tickets, signed links, cookies, bearer tokens, the same-origin rule.
/// Cloning it shares it.
#[derive(Clone)]
pub struct Gate {
    state: Arc<State>,
}

struct State {
    upstream: Arc<dyn Forward>,
    /// Where it is served: starts and ends with `/`.
    base: String,
    name: &'static str,
    /// Signs and checks its links (when it takes them).
    link_key: Option<[u8; 32]>,
    bearer: Option<BearerCheck>,
    /// `cordon_lab_<port>` for a site on a port, a name per Lab as cookies
    /// are shared between the ports of a host; `cordon_lab` for a gate on
    /// a host name of its own, whose cookies are that name's alone.
    cookie: String,
    /// Cookies are sent over TLS alone when the Lab is served over it.
    secure: bool,
    /// `Strict` on a port of cordon's host, where cordon's web UI is the
    /// same site and its links keep the cookie; `Lax` on a name of its
    /// own, which cordon's links reach from another site: a cross-site
    /// navigation by GET brings it (the page loads, nothing is read back
    /// by the other site), anything else does not.
    same_site: &'static str,
    /// Unspent tickets and when each expires.
    tickets: Mutex<HashMap<String, Instant>>,
    /// The cookie values handed out, oldest first.
    sessions: Mutex<VecDeque<String>>,
}

impl Drop for Site {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Site {
    /// Serves `upstream`'s Lab, mounted at `base`, on `listener`.
    pub fn serve(
        listener: cordon_listen::Listener,
        upstream: Arc<dyn Forward>,
        base: String,
    ) -> std::io::Result<Site> {
        Site::serve_with(listener, upstream, SiteOptions::lab(base))
    }

    /// Serves `upstream` on `listener` as `options` say.
    pub fn serve_with(
        listener: cordon_listen::Listener,
        upstream: Arc<dyn Forward>,
        options: SiteOptions,
    ) -> std::io::Result<Site> {
        let addr = listener.local_addr();
        let scheme = listener.scheme();
        let cookie = format!("{COOKIE_PREFIX}_{}", addr.port());
        let gate = Gate::with_cookie(upstream, options, cookie, scheme == "https", "Strict");
        let handler = gate.clone();
        let app = axum::Router::new().fallback(move |req: Request<Body>| {
            let gate = handler.clone();
            async move { gate.handle(req).await }
        });
        let task = tokio::spawn(accept(listener, app));
        Ok(Site {
            addr,
            scheme,
            gate,
            task,
        })
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn upstream(&self) -> &Arc<dyn Forward> {
        self.gate.upstream()
    }

    /// A new one-time ticket, good for [`TICKET_TTL`].
    pub fn ticket(&self) -> String {
        self.gate.ticket()
    }

    /// A link's token, good for `ttl` (at most [`LINK_TTL_MAX`]), and when
    /// it expires, in seconds since the epoch; `None` for a site that takes
    /// no links.
    pub fn link(&self, ttl: Duration) -> Option<(String, u64)> {
        self.gate.link(ttl)
    }

    /// The site's gate.
    pub fn gate(&self) -> &Gate {
        &self.gate
    }

    /// The site's address as the browser names this machine (`host`).
    pub fn origin(&self, host: &str) -> String {
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        format!("{}://{host}:{}", self.scheme, self.addr.port())
    }

    /// The URL that lets a browser in once: `http[s]://HOST:PORT/BASE?cordon_ticket=…`,
    /// `host` as the browser names this machine.
    pub fn url(&self, host: &str) -> String {
        let host = if host.contains(':') && !host.starts_with('[') {
            format!("[{host}]")
        } else {
            host.to_string()
        };
        format!(
            "{}://{host}:{}{}?{TICKET_PARAM}={}",
            self.scheme,
            self.addr.port(),
            self.gate.state.base,
            self.ticket()
        )
    }
}

impl Gate {
    /// A gate for a site that has a host name of its own, served over TLS
    /// if `secure`: its cookie is that name's alone.
    pub fn new(upstream: Arc<dyn Forward>, options: SiteOptions, secure: bool) -> Gate {
        Gate::with_cookie(upstream, options, COOKIE_PREFIX.to_string(), secure, "Lax")
    }

    fn with_cookie(
        upstream: Arc<dyn Forward>,
        options: SiteOptions,
        cookie: String,
        secure: bool,
        same_site: &'static str,
    ) -> Gate {
        let link_key = options.links.then(|| {
            let mut key = [0u8; 32];
            getrandom::fill(&mut key).expect("the system's random source");
            key
        });
        Gate {
            state: Arc::new(State {
                upstream,
                base: options.base,
                name: options.name,
                link_key,
                bearer: options.bearer,
                cookie,
                secure,
                same_site,
                tickets: Mutex::new(HashMap::new()),
                sessions: Mutex::new(VecDeque::new()),
            }),
        }
    }

    pub fn upstream(&self) -> &Arc<dyn Forward> {
        &self.state.upstream
    }

    /// The answer to `req`: the upstream's, if it may get through.
    pub async fn handle(&self, req: Request<Body>) -> Response<Body> {
        self.state.handle(req).await
    }

    /// A new one-time ticket, good for [`TICKET_TTL`].
    pub fn ticket(&self) -> String {
        let ticket = random_hex();
        let mut tickets = lock(&self.state.tickets);
        let now = Instant::now();
        tickets.retain(|_, expires| *expires > now);
        if tickets.len() >= MAX_TICKETS {
            // Asked for faster than browsers use them: the oldest goes.
            let oldest = tickets
                .iter()
                .min_by_key(|(_, e)| **e)
                .map(|(t, _)| t.clone());
            tickets.remove(&oldest.unwrap_or_default());
        }
        tickets.insert(ticket.clone(), now + TICKET_TTL);
        ticket
    }

    /// A link's token, good for `ttl` (at most [`LINK_TTL_MAX`]), and when
    /// it expires, in seconds since the epoch; `None` for a site that takes
    /// no links.
    pub fn link(&self, ttl: Duration) -> Option<(String, u64)> {
        let key = self.state.link_key.as_ref()?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        let expires = (now + ttl.min(LINK_TTL_MAX)).as_secs();
        Some((format!("{expires}.{}", sign(key, expires)), expires))
    }
}

/// Serves each connection in a task of this one's, so that stopping it
/// (dropping the [`Site`]) closes every open connection too, not only the
/// listener: nothing is left that reaches the closed sandbox.
async fn accept(mut listener: cordon_listen::Listener, app: axum::Router) {
    let mut connections = tokio::task::JoinSet::new();
    loop {
        tokio::select! {
            (stream, _) = listener.accept() => {
                let service = hyper_util::service::TowerToHyperService::new(app.clone());
                connections.spawn(async move {
                    let io = hyper_util::rt::TokioIo::new(stream);
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(io, service)
                        .with_upgrades()
                        .await;
                });
            }
            Some(_) = connections.join_next() => {}
        }
    }
}

impl State {
    async fn handle(&self, req: Request<Body>) -> Response<Body> {
        let path = req.uri().path();
        if !path.starts_with(&self.base) {
            if format!("{path}/") == self.base {
                return redirect(&self.base, None);
            }
            return self.text(StatusCode::NOT_FOUND, "not found: this port serves");
        }
        if let Err(why) = same_origin(&req) {
            return self.text(StatusCode::FORBIDDEN, why);
        }
        let query = req.uri().query().unwrap_or("");
        let param = |name: &str| {
            form_urlencoded::parse(query.as_bytes())
                .find(|(k, _)| k == name)
                .map(|(_, v)| v.into_owned())
        };
        if let Some(ticket) = param(TICKET_PARAM) {
            let valid = lock(&self.tickets)
                .remove(&ticket)
                .is_some_and(|expires| expires > Instant::now());
            if !valid {
                return self.text(
                    StatusCode::UNAUTHORIZED,
                    "this link was used already or has expired: open it again from cordon, for",
                );
            }
            return self.exchange(path, query);
        }
        if let Some(link) = param(LINK_PARAM).filter(|_| self.link_key.is_some()) {
            if let Err(why) = self.check_link(&link) {
                return self.text(StatusCode::UNAUTHORIZED, why);
            }
            return self.exchange(path, query);
        }
        let bearer = req
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(str::to_string);
        if let (Some(check), Some(token)) = (&self.bearer, bearer) {
            match check(token).await {
                Bearer::Allowed => {}
                Bearer::Unknown => return self.text(StatusCode::UNAUTHORIZED, "unknown token for"),
                Bearer::Stranger => return text(StatusCode::NOT_FOUND, "not found"),
            }
        } else if !self.signed_in(&req) {
            return self.text(
                StatusCode::UNAUTHORIZED,
                "open it from cordon (its link in the web UI, or the API) to use",
            );
        }
        self.upstream.forward(req).await
    }

    /// An answer naming the site: `"{message} {name}"`.
    fn text(&self, status: StatusCode, message: &str) -> Response<Body> {
        text(status, &format!("{message} {}", self.name))
    }

    /// Checks a signed link: well formed, not expired, signed by this
    /// site.
    fn check_link(&self, link: &str) -> Result<(), &'static str> {
        let key = self.link_key.as_ref().ok_or("links do not open")?;
        let (expires, mac) = link.split_once('.').ok_or("this is no link of")?;
        let expires: u64 = expires.parse().map_err(|_| "this is no link of")?;
        let mac = hex(mac).ok_or("this is no link of")?;
        let mut m = <Hmac as hmac::KeyInit>::new_from_slice(key).expect("any key length");
        hmac::Mac::update(&mut m, expires.to_string().as_bytes());
        hmac::Mac::verify_slice(m, &mac).map_err(|_| "this is no link of")?;
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default()
            .as_secs();
        if now >= expires {
            return Err("this link has expired: ask cordon for a new one, for");
        }
        Ok(())
    }

    /// Lets the browser in with a cookie, and sends it on to the same URL
    /// without the ticket or link.
    fn exchange(&self, path: &str, query: &str) -> Response<Body> {
        let session = random_hex();
        let mut sessions = lock(&self.sessions);
        if sessions.len() >= MAX_SESSIONS {
            sessions.pop_front();
        }
        sessions.push_back(session.clone());
        drop(sessions);
        let rest: String = form_urlencoded::Serializer::new(String::new())
            .extend_pairs(
                form_urlencoded::parse(query.as_bytes())
                    .filter(|(k, _)| k != TICKET_PARAM && k != LINK_PARAM),
            )
            .finish();
        // `//host` would be another site's address: go to the Lab's root.
        let path = if path.starts_with("//") {
            &self.base
        } else {
            path
        };
        let to = if rest.is_empty() {
            path.to_string()
        } else {
            format!("{path}?{rest}")
        };
        let secure = if self.secure { "; Secure" } else { "" };
        let cookie = format!(
            "{}={session}; Path={}; HttpOnly; SameSite={}{secure}",
            self.cookie, self.base, self.same_site
        );
        redirect(&to, Some(cookie))
    }

    fn signed_in(&self, req: &Request<Body>) -> bool {
        let sessions = lock(&self.sessions);
        req.headers()
            .get_all(header::COOKIE)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(';'))
            .filter_map(|c| c.trim().split_once('='))
            .any(|(name, value)| name == self.cookie && sessions.iter().any(|s| s == value))
    }
}

/// Refuses a browser's request from another origin, but for a top-level
/// navigation by GET (a link from cordon's web UI is one).
fn same_origin(req: &Request<Body>) -> Result<(), &'static str> {
    let h = req.headers();
    let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    let navigation = req.method() == Method::GET && get("sec-fetch-mode") == Some("navigate");
    if let Some(site) = get("sec-fetch-site")
        && !matches!(site, "same-origin" | "none")
        && !navigation
    {
        return Err("a request from another site or origin may not use");
    }
    if let Some(origin) = get("origin") {
        let host = get("host").unwrap_or("");
        let own = ["http://", "https://"]
            .iter()
            .any(|s| origin.strip_prefix(s) == Some(host));
        if !own && !navigation {
            return Err("a request from another origin may not use");
        }
    }
    Ok(())
}

fn redirect(to: &str, cookie: Option<String>) -> Response<Body> {
    let mut resp = StatusCode::SEE_OTHER.into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(to) {
        h.insert(header::LOCATION, v);
    }
    if let Some(c) = cookie.and_then(|c| HeaderValue::from_str(&c).ok()) {
        h.insert(header::SET_COOKIE, c);
    }
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    resp
}

fn text(status: StatusCode, message: &str) -> Response<Body> {
    let mut resp = (status, format!("{message}\n")).into_response();
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/plain; charset=utf-8"),
    );
    resp
}

/// A link's MAC of `expires` under `key`, as hex.
fn sign(key: &[u8; 32], expires: u64) -> String {
    let mut m = <Hmac as hmac::KeyInit>::new_from_slice(key).expect("any key length");
    hmac::Mac::update(&mut m, expires.to_string().as_bytes());
    let mac = hmac::Mac::finalize(m).into_bytes();
    mac.iter().map(|b| format!("{b:02x}")).collect()
}

fn hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.is_ascii() {
        return None;
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok())
        .collect()
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// 128 bits from the system's generator, as hex.
fn random_hex() -> String {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).expect("the system's random source");
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::fd::BorrowedFd;

    use super::*;

    fn req(method: &str, headers: &[(&str, &str)]) -> Request<Body> {
        let mut b = Request::builder().method(method).uri("/lab");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(Body::empty()).unwrap()
    }

    #[test]
    fn only_this_origin_or_a_navigation_gets_in() {
        let host = ("host", "127.0.0.1:4000");
        // Programs and the Lab's own pages.
        assert!(same_origin(&req("POST", &[host])).is_ok());
        assert!(same_origin(&req("POST", &[host, ("sec-fetch-site", "same-origin")])).is_ok());
        assert!(same_origin(&req("POST", &[host, ("origin", "http://127.0.0.1:4000")])).is_ok());
        assert!(same_origin(&req("GET", &[host, ("sec-fetch-site", "none")])).is_ok());
        // A link from cordon's web UI, on another port of the same host.
        let link = [
            host,
            ("sec-fetch-site", "same-site"),
            ("sec-fetch-mode", "navigate"),
        ];
        assert!(same_origin(&req("GET", &link)).is_ok());
        // Another Lab's page: scripts, forms, and a navigation that posts.
        for site in ["same-site", "cross-site"] {
            for mode in ["cors", "no-cors", "websocket"] {
                let h = [host, ("sec-fetch-site", site), ("sec-fetch-mode", mode)];
                assert!(same_origin(&req("GET", &h)).is_err(), "{site} {mode}");
            }
            let h = [
                host,
                ("sec-fetch-site", site),
                ("sec-fetch-mode", "navigate"),
            ];
            assert!(same_origin(&req("POST", &h)).is_err(), "{site} form");
        }
        // A browser without fetch metadata still sends Origin.
        for origin in [
            "http://127.0.0.1:4001",
            "null",
            "http://127.0.0.1:4000.evil",
        ] {
            let h = [host, ("origin", origin)];
            assert!(same_origin(&req("POST", &h)).is_err(), "{origin}");
        }
    }

    /// The server's end of the connection whose peer is `client`: found
    /// among this process's descriptors, since the listener runs here.
    fn nodelay_of_peer(client: SocketAddr) -> Option<bool> {
        for entry in std::fs::read_dir("/proc/self/fd").ok()?.flatten() {
            let Ok(fd) = entry.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let is_socket = std::fs::read_link(entry.path())
                .is_ok_and(|l| l.to_string_lossy().starts_with("socket:"));
            if !is_socket {
                continue;
            }
            // SAFETY: only used while the test's server holds the socket
            // open (the client's connection is still open).
            let fd = unsafe { BorrowedFd::borrow_raw(fd) };
            let peer = rustix::net::getpeername(fd).ok().flatten();
            if peer.and_then(|p| SocketAddr::try_from(p).ok()) == Some(client) {
                return rustix::net::sockopt::tcp_nodelay(fd).ok();
            }
        }
        None
    }

    #[tokio::test]
    async fn accepted_connections_do_not_wait_for_delayed_acks() {
        let tcp = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let listener = cordon_listen::Listener::new(tcp, None).unwrap();
        let addr = listener.local_addr();
        let app = axum::Router::new().fallback(|| async { "ok" });
        let server = tokio::spawn(async move { accept(listener, app).await });
        let client = tokio::task::spawn_blocking(move || {
            let mut c = std::net::TcpStream::connect(addr).unwrap();
            c.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
            let mut buf = [0u8; 512];
            let n = c.read(&mut buf).unwrap();
            assert!(buf[..n].starts_with(b"HTTP/1.1 200"), "{:?}", &buf[..n]);
            // Still open: the server's end is there to look at.
            let me = c.local_addr().unwrap();
            (c, me)
        })
        .await
        .unwrap();
        assert_eq!(nodelay_of_peer(client.1), Some(true));
        server.abort();
    }
}
