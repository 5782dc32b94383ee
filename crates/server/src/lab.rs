//! JupyterLab in a job's or session's sandbox, reached through the server.
//!
//! A Lab starts inside the sandbox on first use and ends with it (see
//! [`cordon_lab::jupyter`]). Two ways lead in, both behind the tenant's
//! token:
//!
//! - `POST …/lab` answers a URL on the Lab's own origin (a port of its own,
//!   see [`cordon_lab::site`]) with a one-time ticket: what a browser opens.
//!   The Lab's pages are the sandbox's to shape and must never run in this
//!   server's origin, where the web UI keeps its token.
//! - `…/lab/{path}`, any method and WebSockets, with the bearer token (a
//!   header, or a WebSocket subprotocol): for programs. Its answers carry
//!   `Content-Security-Policy: sandbox`, so that a browser made to render
//!   one runs it in no origin at all.
//!
//! In a deployment of many, the browser's way in to a job that runs on
//! another worker is a port of the API process it asked ([`RemoteLabs`]),
//! whose requests go on to the worker's bearer route through the relay.

use std::collections::HashMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};

use axum::body::Body;
use axum::http::{HeaderMap, HeaderValue, Request, StatusCode, header};
use axum::response::Response;
use cordon_lab::{Forward, Site, StartError, Upstream};
use serde::Serialize;

use crate::http::ApiError;
use crate::owner::Owner;
use crate::sandboxes::{LabSlot, Sandboxes};

/// The policy the bearer route's answers carry: a browser made to render
/// one runs it in no origin at all.
pub(crate) const BEARER_POLICY: &str = "sandbox";

/// The answer to `POST …/lab`.
#[derive(Debug, Serialize, utoipa::ToSchema)]
#[schema(example = json!({
    "url": "http://127.0.0.1:41873/v1/jobs/job_0fcf835d016a42b3b239b226/lab/?cordon_ticket=9692cc8fae08533f5bd21a887c640140",
    "expires_in": 60
}))]
pub struct LabOpened {
    /// Open this in a browser: the Lab's own origin and a ticket that lets
    /// one browser in, once.
    pub url: String,
    /// Seconds the ticket may wait to be used.
    pub expires_in: u64,
}

/// Where `owner`'s Lab is served, on either origin: `/v1/jobs/ID/lab/`.
pub(crate) fn base(owner: &Owner) -> String {
    format!("/v1/{}/lab/", owner.path())
}

/// The Lab of `owner`'s listed sandbox, started now if it is not yet; its
/// listener binds `ip`.
pub(crate) async fn open(
    sandboxes: &Sandboxes,
    owner: &Owner,
    ip: IpAddr,
    tls: Option<&cordon_listen::Tls>,
    gone: impl Fn() -> ApiError,
) -> Result<Arc<Site>, ApiError> {
    let opening = sandboxes.lab(owner).ok_or_else(&gone)?;
    let sandbox = opening.sandbox.clone();
    let base = &base(owner);
    let site = opening
        .lab
        .get_or_try_init(|| async {
            cordon_lab::start(&sandbox, base).await.map_err(|e| {
                // The job may end while its Lab starts: that is the client's
                // race to lose (409), not the server failing (503).
                let exited = matches!(e, StartError::Sandbox(cordon_sandbox::Error::Gone));
                if exited || sandboxes.get(owner).is_none() {
                    gone()
                } else {
                    unavailable(e)
                }
            })?;
            let site = listen(ip, tls, Arc::new(Upstream::new(sandbox)), base).await?;
            tracing::info!("{owner}: JupyterLab at {}", site.addr());
            Ok::<_, ApiError>(site)
        })
        .await?;
    Ok(site.clone())
}

/// A Lab's own origin: a new port on `ip`, served as the API is (over TLS
/// when it is), whose requests go to `upstream`.
async fn listen(
    ip: IpAddr,
    tls: Option<&cordon_listen::Tls>,
    upstream: Arc<dyn Forward>,
    base: &str,
) -> Result<Arc<Site>, ApiError> {
    let tcp = tokio::net::TcpListener::bind((ip, 0))
        .await
        .map_err(|e| unavailable(format!("cannot listen for the Lab on {ip}: {e}")))?;
    let listener = cordon_listen::Listener::new(tcp, tls.cloned())
        .map_err(|e| unavailable(format!("the Lab's listener: {e}")))?;
    let site = Site::serve(listener, upstream, base.to_string())
        .map_err(|e| unavailable(format!("the Lab's listener: {e}")))?;
    Ok(Arc::new(site))
}

/// The Labs this process serves for jobs that run on other workers, by
/// job id. One per running job at most, as on the job's own worker; each
/// is closed when its job stops running there (see `owned::lab`).
#[derive(Default)]
pub(crate) struct RemoteLabs(Mutex<HashMap<String, LabSlot>>);

impl RemoteLabs {
    /// Job `id`'s Lab, opened with what `upstream` makes if it is not open
    /// yet; two callers at once open one.
    pub(crate) async fn open<F, Fut>(
        &self,
        id: &str,
        ip: IpAddr,
        tls: Option<&cordon_listen::Tls>,
        upstream: F,
    ) -> Result<Arc<Site>, axum::response::Response>
    where
        F: FnOnce() -> Fut,
        Fut: Future<Output = Result<Arc<dyn Forward>, axum::response::Response>>,
    {
        use axum::response::IntoResponse;
        let slot = self.lock().entry(id.to_string()).or_default().clone();
        let opened = slot
            .get_or_try_init(|| async {
                let upstream = upstream().await?;
                let base = base(&Owner::Job(id.to_string()));
                let site = listen(ip, tls, upstream, &base)
                    .await
                    .map_err(IntoResponse::into_response)?;
                tracing::info!("job {id}: its worker's JupyterLab at {}", site.addr());
                Ok(site)
            })
            .await;
        if opened.is_err() {
            // Nothing is kept of a Lab that did not open.
            let mut labs = self.lock();
            if labs
                .get(id)
                .is_some_and(|s| Arc::ptr_eq(s, &slot) && s.get().is_none())
            {
                labs.remove(id);
            }
        }
        opened.cloned()
    }

    /// Closes job `id`'s Lab here: its listener and every connection.
    pub(crate) fn close(&self, id: &str) {
        if self.lock().remove(id).is_some() {
            tracing::info!("job {id}: its Lab here is closed");
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, LabSlot>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn unavailable(e: impl std::fmt::Display) -> ApiError {
    ApiError::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "lab_unavailable",
        e.to_string(),
    )
}

/// The host name the client used for this server, without its port: what
/// a site's URL on another port of it is given with.
pub(crate) fn browser_host(site: &Site, headers: &HeaderMap) -> String {
    headers
        .get(header::HOST)
        .and_then(|h| h.to_str().ok())
        .and_then(|h| h.parse::<axum::http::uri::Authority>().ok())
        .map(|a| a.host().trim_matches(['[', ']']).to_string())
        .unwrap_or_else(|| site.addr().ip().to_string())
}

/// The answer to `POST …/lab`: a URL for the host name the client used.
pub(crate) fn opened(site: &Site, headers: &HeaderMap) -> LabOpened {
    let host = browser_host(site, headers);
    LabOpened {
        url: site.url(&host),
        expires_in: cordon_lab::site::TICKET_TTL.as_secs(),
    }
}

/// Forwards a bearer-authenticated request on the server's own origin.
pub(crate) async fn forward(site: &Site, req: Request<Body>) -> Response {
    let mut resp = site.upstream().forward(req).await;
    // Added to Jupyter's own policies, not in their place: every policy
    // a response carries holds.
    resp.headers_mut().append(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(BEARER_POLICY),
    );
    resp
}
