//! A scripted forge: the pull-request endpoint of GitHub's REST API
//! (`POST /repos/{owner}/{repo}/pulls`) and of Gitea's and Forgejo's
//! (`POST /api/v1/repos/{owner}/{repo}/pulls`), on loopback, answering as
//! they do and recording every request, for the tests of cordon's
//! `create_pull_request`.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::routing::post;
use serde_json::{Value, json};

/// One request the forge was sent.
#[derive(Debug, Clone, PartialEq)]
pub struct PullRequestCall {
    pub path: String,
    pub authorization: Option<String>,
    pub body: Value,
}

struct Shared {
    token: String,
    port: u16,
    calls: Mutex<Vec<PullRequestCall>>,
}

/// The forge, serving until dropped.
pub struct ScriptedForge {
    shared: Arc<Shared>,
    addr: SocketAddr,
    _shutdown: tokio::sync::oneshot::Sender<()>,
}

impl ScriptedForge {
    /// Answers requests that carry `token` (as `token T` or `Bearer T`).
    pub fn start(token: &str) -> ScriptedForge {
        let listener =
            std::net::TcpListener::bind(("127.0.0.1", 0)).expect("bind the scripted forge");
        listener.set_nonblocking(true).expect("nonblocking");
        let addr = listener.local_addr().expect("its address");
        let shared = Arc::new(Shared {
            token: token.to_string(),
            port: addr.port(),
            calls: Mutex::new(Vec::new()),
        });
        let app = Router::new()
            .route("/repos/{owner}/{repo}/pulls", post(pulls))
            .route("/api/v1/repos/{owner}/{repo}/pulls", post(pulls))
            .with_state(shared.clone());
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("a runtime");
            rt.block_on(async move {
                let listener = tokio::net::TcpListener::from_std(listener).expect("listener");
                let _ = axum::serve(listener, app)
                    .with_graceful_shutdown(async {
                        let _ = rx.await;
                    })
                    .await;
            });
        });
        ScriptedForge {
            shared,
            addr,
            _shutdown: tx,
        }
    }

    /// The API's base URL, GitHub's shape (Gitea's is this plus `/api/v1`).
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Every pull-request request so far.
    pub fn calls(&self) -> Vec<PullRequestCall> {
        self.shared
            .calls
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }
}

async fn pulls(
    State(shared): State<Arc<Shared>>,
    Path((owner, repo)): Path<(String, String)>,
    uri: Uri,
    headers: HeaderMap,
    body: String,
) -> (StatusCode, Json<Value>) {
    let authorization = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let body: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    let number = {
        let mut calls = shared.calls.lock().unwrap_or_else(|p| p.into_inner());
        calls.push(PullRequestCall {
            // As asked: GitHub's shape and Gitea's differ by their prefix.
            path: uri.path().to_string(),
            authorization: authorization.clone(),
            body: body.clone(),
        });
        calls.len()
    };
    let ok = authorization.as_deref().is_some_and(|a| {
        a == format!("token {}", shared.token) || a == format!("Bearer {}", shared.token)
    });
    if !ok {
        return (
            StatusCode::UNAUTHORIZED,
            Json(json!({"message": "Bad credentials"})),
        );
    }
    for field in ["title", "head", "base"] {
        if !body[field].is_string() {
            return (
                StatusCode::UNPROCESSABLE_ENTITY,
                Json(json!({"message": format!("{field} is missing")})),
            );
        }
    }
    (
        StatusCode::CREATED,
        Json(json!({
            "number": number,
            "html_url": format!("http://127.0.0.1:{}/{owner}/{repo}/pull/{number}", shared.port),
            "state": "open",
        })),
    )
}
