//! Requests for a job that runs on another machine. An API process sends
//! a job's files, live view and Lab requests on to the worker that runs
//! the job ([`to_worker`]); a worker's listener takes only what the
//! deployment signed ([`admit`]) and answers it with the same handlers,
//! for the signed tenant. [`crate::cluster`] has the rules. A browser's
//! Lab page or preview for a job elsewhere is served on an origin of the
//! API process's, whose requests go on the same way ([`SiteRelay`]).
//!
//! Nothing is relayed twice: a worker's listener has no [`to_worker`].

use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::{FromRequestParts, Request, State};
use axum::http::header::{self, HeaderValue};
use axum::http::{StatusCode, Uri};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use cordon_net::{is_websocket_upgrade, keep_list_items, mark_websocket_upgrade, strip_hop_by_hop};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};

use crate::cluster::{self, Cluster};
use crate::http::{ApiError, Relayed, Tenant, WS_TOKEN_PROTOCOL};
use crate::state::Shared;

/// Time to connect to a worker.
const CONNECT: Duration = Duration::from_secs(5);
/// Time for a worker to answer a request's head (a Lab starting in the
/// job's sandbox takes a few seconds; a file is read from its disk).
const ANSWER: Duration = Duration::from_secs(120);

type Https = hyper_rustls::HttpsConnector<HttpConnector>;

/// One pool of connections to the workers, for the process.
fn client() -> &'static Client<Https, Body> {
    static CLIENT: OnceLock<Client<Https, Body>> = OnceLock::new();
    CLIENT.get_or_init(|| {
        let mut http = HttpConnector::new();
        http.set_connect_timeout(Some(CONNECT));
        http.set_nodelay(true);
        http.enforce_http(false);
        let provider = Arc::new(rustls::crypto::aws_lc_rs::default_provider());
        // The system's roots (`SSL_CERT_FILE` names others): a worker's
        // certificate is checked as any server's.
        let builder = match hyper_rustls::HttpsConnectorBuilder::new()
            .with_provider_and_native_roots(provider.clone())
        {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!("no trusted roots for https:// workers: {e}");
                let config = rustls::ClientConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .expect("aws-lc-rs has the default versions")
                    .with_root_certificates(rustls::RootCertStore::empty())
                    .with_no_client_auth();
                hyper_rustls::HttpsConnectorBuilder::new().with_tls_config(config)
            }
        };
        let https = builder.https_or_http().enable_http1().wrap_connector(http);
        Client::builder(TokioExecutor::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .build(https)
    })
}

/// The job id of `/v1/jobs/{id}/…`.
fn job_id(path: &str) -> Option<&str> {
    path.strip_prefix("/v1/jobs/")?.split('/').next()
}

/// The API's side: a request for a job whose worker is another process
/// goes to that worker; anything else goes on here. Only on the routes of
/// a job's files, live view and Lab, and only in a deployment of many. A
/// process that is both (`cordon serve --advertise` with workers) takes
/// signed requests here too.
pub(crate) async fn to_worker(
    State(shared): State<Arc<Shared>>,
    req: Request,
    next: Next,
) -> Response {
    let Some(cluster) = shared.config.cluster.as_ref() else {
        return next.run(req).await;
    };
    // Relayed here (a `cordon serve` that runs jobs too): served here,
    // never sent on.
    if req.headers().contains_key(cluster::SIGNATURE) {
        return admit(State(shared), req, next).await;
    }
    let (mut parts, body) = req.into_parts();
    let tenant = match Tenant::from_request_parts(&mut parts, &shared).await {
        Ok(Tenant(t)) => t,
        Err(e) => return e.into_response(),
    };
    let Some(id) = job_id(parts.uri.path()).filter(|id| crate::http::plausible_id(id)) else {
        return next.run(Request::from_parts(parts, body)).await;
    };
    let job = match shared.store.job(&tenant, id).await {
        Ok(Some(job)) => job,
        // The handler says it as it always does.
        Ok(None) => return next.run(Request::from_parts(parts, body)).await,
        Err(e) => return ApiError::from(e).into_response(),
    };
    let Some(worker) = shared.elsewhere(&job).map(str::to_string) else {
        return next.run(Request::from_parts(parts, body)).await;
    };
    let url = match shared.store.worker_url(&worker).await {
        Ok(Some(url)) => url,
        Ok(None) => {
            tracing::warn!(job = %job.id, %worker, "the job's worker advertises no address (--advertise)");
            return unreachable(&job.id).into_response();
        }
        Err(e) => return ApiError::from(e).into_response(),
    };
    forward(
        cluster,
        &tenant,
        &url,
        Request::from_parts(parts, body),
        &job.id,
    )
    .await
}

pub(crate) fn unreachable(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::BAD_GATEWAY,
        "worker_unreachable",
        format!(
            "job {id} runs on another machine of this deployment, which did not answer; try \
             again in a moment"
        ),
    )
}

/// Sends `req` to the worker at `base`, signed for `tenant`, and its
/// answer back; a WebSocket is joined end to end.
async fn forward(
    cluster: &Cluster,
    tenant: &str,
    base: &str,
    mut req: Request,
    id: &str,
) -> Response {
    let target = req
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_string();
    let Ok(uri) = format!("{base}{target}").parse::<Uri>() else {
        tracing::warn!(job = %id, "cannot make a URL of {base:?} and the request");
        return unreachable(id).into_response();
    };
    let websocket = is_websocket_upgrade(req.headers());
    let downstream = websocket.then(|| hyper::upgrade::on(&mut req));
    let method = req.method().as_str().to_string();
    {
        let h = req.headers_mut();
        strip_hop_by_hop(h);
        // The tenant's credentials stay here: the signature speaks for it.
        // The Host stays the client's, as Jupyter checks a request's
        // Origin against it.
        h.remove(header::AUTHORIZATION);
        keep_list_items(h, header::SEC_WEBSOCKET_PROTOCOL, ',', ", ", |p| {
            !p.starts_with(WS_TOKEN_PROTOCOL)
        });
        for name in cluster::HEADERS {
            h.remove(name);
        }
        for (name, value) in cluster.key.sign(&method, &target, tenant) {
            if let Ok(v) = HeaderValue::from_str(&value) {
                h.insert(name, v);
            }
        }
        if websocket {
            mark_websocket_upgrade(h);
        }
    }
    *req.uri_mut() = uri;
    let mut resp = match tokio::time::timeout(ANSWER, client().request(req)).await {
        Ok(Ok(resp)) => resp,
        Ok(Err(e)) => {
            tracing::warn!(job = %id, "relaying to {base}: {e}");
            return unreachable(id).into_response();
        }
        Err(_) => {
            tracing::warn!(job = %id, "{base} did not answer in {}s", ANSWER.as_secs());
            return unreachable(id).into_response();
        }
    };
    let switching = websocket && resp.status() == StatusCode::SWITCHING_PROTOCOLS;
    let upstream = switching.then(|| hyper::upgrade::on(&mut resp));
    let (mut parts, body) = resp.into_parts();
    strip_hop_by_hop(&mut parts.headers);
    if let (Some(up), Some(down)) = (upstream, downstream) {
        mark_websocket_upgrade(&mut parts.headers);
        tokio::spawn(async move {
            let (Ok(up), Ok(down)) = tokio::join!(up, down) else {
                return;
            };
            let _ =
                tokio::io::copy_bidirectional(&mut TokioIo::new(down), &mut TokioIo::new(up)).await;
        });
    }
    Response::from_parts(parts, Body::new(body))
}

/// The worker's side: a request the deployment signed goes on, for the
/// tenant it names; anything else is refused with 401, and why is logged,
/// not answered.
pub(crate) async fn admit(State(shared): State<Arc<Shared>>, req: Request, next: Next) -> Response {
    match admitted(&shared, req) {
        Ok(req) => next.run(req).await,
        Err(refused) => refused.into_response(),
    }
}

/// `req`, marked with the tenant it was signed for, if it was.
fn admitted(shared: &Shared, mut req: Request) -> Result<Request, ApiError> {
    let refused = |why: &dyn std::fmt::Display| {
        tracing::warn!("a relayed request was refused: {why}");
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "this is a worker's listener: it takes only requests relayed by this deployment's API processes",
        )
    };
    let Some(cluster) = shared.config.cluster.as_ref() else {
        return Err(refused(&"this process has no cluster key"));
    };
    let target = req
        .uri()
        .path_and_query()
        .map_or("/", |pq| pq.as_str())
        .to_string();
    let headers = req.headers();
    let tenant = cluster::verify(
        &cluster.key,
        &shared.nonces,
        req.method().as_str(),
        &target,
        |name| headers.get(name)?.to_str().ok().map(str::to_string),
    )
    .map_err(|e| refused(&e))?;
    let h = req.headers_mut();
    for name in cluster::HEADERS {
        h.remove(name);
    }
    h.remove(header::AUTHORIZATION);
    req.extensions_mut().insert(Relayed(tenant));
    Ok(req)
}

/// A Lab's or a preview's requests, from the API process's own origin for
/// it (see [`crate::lab::RemoteLabs`], [`crate::preview::RemotePreviews`])
/// to the worker that runs the job, signed for the job's tenant: a Lab's
/// to its bearer route, a preview's to the worker's relay route of that
/// port (`/v1/jobs/{id}/ports/{port}/relay/…`).
pub(crate) struct SiteRelay {
    cluster: Cluster,
    tenant: String,
    /// The worker's base URL.
    worker: String,
    id: String,
    /// Put before each request's path: a preview's relay route.
    prefix: Option<String>,
    used: Mutex<Instant>,
}

impl SiteRelay {
    /// A Lab's: its paths are the bearer route's already.
    pub(crate) fn lab(cluster: Cluster, tenant: &str, worker: String, id: &str) -> SiteRelay {
        SiteRelay {
            cluster,
            tenant: tenant.to_string(),
            worker,
            id: id.to_string(),
            prefix: None,
            used: Mutex::new(Instant::now()),
        }
    }

    /// Port `port`'s preview's.
    pub(crate) fn port(
        cluster: Cluster,
        tenant: &str,
        worker: String,
        id: &str,
        port: u16,
    ) -> SiteRelay {
        SiteRelay {
            prefix: Some(port_relay_path(id, port)),
            ..SiteRelay::lab(cluster, tenant, worker, id)
        }
    }

    async fn send(&self, mut req: Request) -> Response {
        *self.used.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        if let Some(prefix) = &self.prefix {
            let rest = req.uri().path_and_query().map_or("/", |p| p.as_str());
            match format!("{prefix}{rest}").parse::<Uri>() {
                Ok(uri) => *req.uri_mut() = uri,
                Err(_) => return StatusCode::BAD_REQUEST.into_response(),
            }
        }
        let websocket = is_websocket_upgrade(req.headers());
        // The browser's cookie for this port is this process's business.
        cordon_lab::proxy::clean_request(req.headers_mut(), websocket);
        let mut resp = forward(&self.cluster, &self.tenant, &self.worker, req, &self.id).await;
        let switching = resp.status() == StatusCode::SWITCHING_PROTOCOLS;
        let h = resp.headers_mut();
        // The bearer route's policy is for its own origin; this port is the
        // Lab's origin, where its pages are meant to run.
        let kept: Vec<HeaderValue> = h
            .get_all(header::CONTENT_SECURITY_POLICY)
            .iter()
            .filter(|v| v.as_bytes().trim_ascii() != crate::lab::BEARER_POLICY.as_bytes())
            .cloned()
            .collect();
        h.remove(header::CONTENT_SECURITY_POLICY);
        for v in kept {
            h.append(header::CONTENT_SECURITY_POLICY, v);
        }
        cordon_lab::proxy::clean_response(h, switching);
        resp
    }
}

/// The worker's route that relays to port `port` of job `id`'s sandbox,
/// without its trailing slash.
pub(crate) fn port_relay_path(id: &str, port: u16) -> String {
    format!("/v1/jobs/{id}/ports/{port}/relay")
}

impl cordon_lab::Forward for SiteRelay {
    fn forward(&self, req: Request) -> cordon_lab::Forwarding<'_> {
        Box::pin(self.send(req))
    }

    fn idle(&self) -> Duration {
        self.used
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .elapsed()
    }
}
