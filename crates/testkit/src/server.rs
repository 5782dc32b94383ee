//! The HTTP server: routes, request checks, fault injection, recording.

use std::fmt;
use std::net::{SocketAddr, TcpListener as StdTcpListener};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use axum::Router;
use axum::body::{Body, Bytes};
use axum::extract::State as AxumState;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::Response;
use axum::routing::post;
use axum::serve::ListenerExt;
use futures_util::StreamExt;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::inspect::{check_expectations, dangling_tool_calls, tool_results};
use crate::scenario::{Fault, Scenario, Turn};
use crate::wire::{Frame, Protocol};
use crate::{Error, anthropic, openai};

/// A request as the server received it.
#[derive(Debug, Clone)]
pub struct RecordedRequest {
    pub method: String,
    /// The path without the query string.
    pub path: String,
    /// Header names in lower case, in arrival order.
    pub headers: Vec<(String, String)>,
    /// The parsed body; `Value::Null` when it was not JSON.
    pub body: Value,
    /// The body as text, for checks on exact bytes.
    pub raw_body: String,
    /// `None` for a path neither protocol uses.
    pub protocol: Option<Protocol>,
    /// The scenario turn the request was matched to; `None` when none was left.
    pub turn: Option<usize>,
    /// How many earlier attempts that turn had had.
    pub attempt: u32,
    /// The HTTP status served.
    pub status: u16,
}

impl RecordedRequest {
    /// The first value of a header, by case-insensitive name.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

/// A check the server made on a request that did not hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    /// Index of the request in [`ScriptedServer::requests`].
    pub request: usize,
    /// The turn the request was matched to, if any.
    pub turn: Option<usize>,
    /// The check's name: `no_turns_left`, `invalid_json`, `unknown_route`,
    /// `tool_results`, `expect_tool_results`, `expect_contains` or
    /// `expect_max_input_chars`.
    pub check: String,
    pub message: String,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "request {}", self.request)?;
        if let Some(turn) = self.turn {
            write!(f, " (turn {turn})")?;
        }
        write!(f, ": {}: {}", self.check, self.message)
    }
}

struct State {
    scenario: Scenario,
    /// The turn the next request is served.
    next_turn: usize,
    /// Attempts already made on `next_turn`; selects the fault to serve.
    attempts: u32,
    requests: Vec<RecordedRequest>,
    failures: Vec<Failure>,
}

/// A scripted model server on a loopback port, running on its own thread and
/// runtime so that plain `#[test]`s and async tests can both use it.
pub struct ScriptedServer {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl ScriptedServer {
    /// Serves `scenario` on `127.0.0.1` at a free port.
    ///
    /// # Panics
    /// If the scenario is invalid or the server cannot start; a test cannot go
    /// on without it. Use [`ScriptedServer::try_start_on`] to handle that.
    pub fn start(scenario: Scenario) -> Self {
        Self::try_start_on(SocketAddr::from(([127, 0, 0, 1], 0)), scenario)
            .unwrap_or_else(|e| panic!("scripted server: {e}"))
    }

    /// Serves `scenario` at `addr` (port 0 for a free one).
    pub fn try_start_on(addr: SocketAddr, scenario: Scenario) -> Result<Self, Error> {
        scenario.validate()?;
        // Binding here, on the caller's thread, makes the port known and any
        // error visible before `start` returns.
        let listener = StdTcpListener::bind(addr).map_err(|source| Error::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| Error::Bind { addr, source })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| Error::Bind { addr, source })?;
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(Error::Runtime)?;

        let state = Arc::new(Mutex::new(State {
            scenario,
            next_turn: 0,
            attempts: 0,
            requests: Vec::new(),
            failures: Vec::new(),
        }));
        let app = Router::new()
            .route("/v1/messages", post(anthropic_handler))
            .route("/v1/chat/completions", post(openai_handler))
            .route("/v1/models", axum::routing::get(models_handler))
            .fallback(unknown_handler)
            .with_state(state.clone());
        let (shutdown, shutdown_rx) = oneshot::channel::<()>();

        let thread = std::thread::Builder::new()
            .name(format!("scripted-server-{}", addr.port()))
            .spawn(move || {
                runtime.block_on(async move {
                    let listener = match tokio::net::TcpListener::from_std(listener) {
                        Ok(l) => l,
                        Err(e) => {
                            tracing::error!("scripted server cannot listen: {e}");
                            return;
                        }
                    };
                    // Without TCP_NODELAY, small SSE events wait on delayed ACKs and
                    // every turn gains tens of milliseconds, which would swamp the
                    // loop-overhead benchmark.
                    let listener = listener.tap_io(|tcp| {
                        let _ = tcp.set_nodelay(true);
                    });
                    tokio::select! {
                        result = axum::serve(listener, app) => {
                            if let Err(e) = result {
                                tracing::error!("scripted server stopped: {e}");
                            }
                        }
                        _ = shutdown_rx => {}
                    }
                });
                // Dropping the runtime here cancels streams still in flight, so a
                // client holding a connection open cannot stall the shutdown.
            })
            .map_err(Error::Runtime)?;
        tracing::info!(%addr, "scripted model server listening");
        Ok(Self {
            addr,
            state,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// The base URL, `http://127.0.0.1:PORT`, without a trailing slash. Anthropic
    /// clients use it as is; OpenAI clients append `/v1`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The base URL OpenAI-compatible clients expect: [`Self::url`] with `/v1`.
    pub fn openai_url(&self) -> String {
        format!("{}/v1", self.url())
    }

    /// The address the server listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every request received so far, in arrival order.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.lock().requests.clone()
    }

    /// Every failed check so far.
    pub fn failures(&self) -> Vec<Failure> {
        self.lock().failures.clone()
    }

    /// Turns not yet served successfully.
    pub fn remaining_turns(&self) -> usize {
        let state = self.lock();
        state.scenario.turns.len().saturating_sub(state.next_turn)
    }

    /// Panics, listing them, if any check failed.
    pub fn assert_no_failures(&self) {
        let failures = self.failures();
        assert!(
            failures.is_empty(),
            "the scripted model server saw {} failed check(s):\n{}",
            failures.len(),
            failures
                .iter()
                .map(|f| format!("  {f}"))
                .collect::<Vec<_>>()
                .join("\n")
        );
    }

    /// Panics unless every turn was served and no check failed.
    pub fn assert_finished(&self) {
        self.assert_no_failures();
        let remaining = self.remaining_turns();
        assert_eq!(
            remaining, 0,
            "the scripted model server still has {remaining} turn(s) to serve"
        );
    }

    /// Stops the server; streams in flight are cut.
    pub fn shutdown(mut self) {
        self.stop();
    }

    fn stop(&mut self) {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        lock(&self.state)
    }
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.stop();
    }
}

impl fmt::Debug for ScriptedServer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ScriptedServer")
            .field("addr", &self.addr)
            .finish_non_exhaustive()
    }
}

/// A panicking test thread must not hide the recorded requests from the others.
fn lock(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(|e| e.into_inner())
}

type Shared = Arc<Mutex<State>>;

async fn anthropic_handler(
    AxumState(state): AxumState<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(
        &state,
        Some(Protocol::Anthropic),
        method,
        uri,
        headers,
        body,
    )
}

async fn openai_handler(
    AxumState(state): AxumState<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(&state, Some(Protocol::OpenAi), method, uri, headers, body)
}

async fn unknown_handler(
    AxumState(state): AxumState<Shared>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    handle(&state, None, method, uri, headers, body)
}

/// What to answer, decided under the lock and rendered after it.
enum Plan {
    /// A failed check: 400 (404 for an unknown route) naming it.
    Reject {
        status: u16,
        check: String,
        message: String,
    },
    /// A fault that replaces the reply with an error status.
    Error {
        status: u16,
        retry_after: Option<u64>,
        body: Value,
    },
    /// The reply, possibly altered by a stream fault.
    Reply {
        turn: Box<Turn>,
        fault: Option<Fault>,
        chunk_chars: usize,
    },
}

/// `GET /v1/models`, as OpenAI's API answers it. Not a model request: not
/// recorded among [`ScriptedServer::requests`].
async fn models_handler(AxumState(state): AxumState<Shared>) -> Response {
    let models = lock(&state).scenario.models.clone();
    let data: Vec<serde_json::Value> = models
        .iter()
        .map(|id| serde_json::json!({"id": id, "object": "model", "owned_by": "scripted"}))
        .collect();
    axum::response::IntoResponse::into_response(axum::Json(
        serde_json::json!({"object": "list", "data": data}),
    ))
}

fn handle(
    state: &Shared,
    protocol: Option<Protocol>,
    method: Method,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let raw_body = String::from_utf8_lossy(&body).into_owned();
    let parsed: Option<Value> = serde_json::from_slice(&body).ok();
    let model = parsed
        .as_ref()
        .and_then(|b| b.get("model"))
        .and_then(Value::as_str)
        .unwrap_or("scripted-model")
        .to_owned();
    let streaming = parsed
        .as_ref()
        .and_then(|b| b.get("stream"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let include_usage = parsed
        .as_ref()
        .and_then(|b| b.pointer("/stream_options/include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);

    let mut guard = lock(state);
    let st = &mut *guard;
    let index = st.requests.len();
    let turn_index = (st.next_turn < st.scenario.turns.len()).then_some(st.next_turn);
    let attempt = if turn_index.is_some() { st.attempts } else { 0 };

    let mut failures: Vec<(String, String)> = Vec::new();
    let plan = match (protocol, &parsed, turn_index) {
        (None, _, _) => Plan::Reject {
            status: 404,
            check: "unknown_route".into(),
            message: format!("no scripted endpoint at {method} {}", uri.path()),
        },
        (Some(_), None, _) => Plan::Reject {
            status: 400,
            check: "invalid_json".into(),
            message: "the request body is not JSON".into(),
        },
        (Some(_), Some(_), None) => Plan::Reject {
            status: 400,
            check: "no_turns_left".into(),
            message: format!(
                "all {} scripted turns were already served",
                st.scenario.turns.len()
            ),
        },
        (Some(protocol), Some(request), Some(t)) => {
            let turn = &st.scenario.turns[t];
            let answered = tool_results(protocol, request);
            if st.scenario.check_tool_results {
                let missing = dangling_tool_calls(protocol, request);
                if !missing.is_empty() {
                    failures.push((
                        "tool_results".into(),
                        format!("tool calls without a result: {}", missing.join(", ")),
                    ));
                }
            }
            failures.extend(check_expectations(turn, request, &raw_body, &answered));
            if let Some((check, message)) = failures.first() {
                Plan::Reject {
                    status: 400,
                    check: check.clone(),
                    message: message.clone(),
                }
            } else {
                let fault = fault_for_attempt(&turn.faults, attempt).cloned();
                st.attempts += 1;
                let breaks = fault.as_ref().is_some_and(Fault::breaks_reply);
                if !breaks {
                    st.next_turn += 1;
                    st.attempts = 0;
                }
                match fault
                    .as_ref()
                    .and_then(|f| error_fault(protocol, f, &model))
                {
                    Some((status, retry_after, body)) => Plan::Error {
                        status,
                        retry_after,
                        body,
                    },
                    None => Plan::Reply {
                        turn: Box::new({
                            let mut turn = turn.clone();
                            if st.scenario.count_input_tokens && turn.usage.input_tokens == 0 {
                                turn.usage.input_tokens =
                                    (raw_body.chars().count() as u64).div_ceil(4);
                            }
                            turn
                        }),
                        fault,
                        chunk_chars: st.scenario.chunk_chars,
                    },
                }
            }
        }
    };
    if let Plan::Reject { check, message, .. } = &plan
        && failures.is_empty()
    {
        failures.push((check.clone(), message.clone()));
    }
    for (check, message) in failures {
        tracing::warn!(request = index, turn = ?turn_index, %check, "{message}");
        st.failures.push(Failure {
            request: index,
            turn: turn_index,
            check,
            message,
        });
    }
    let status = match &plan {
        Plan::Reject { status, .. } | Plan::Error { status, .. } => *status,
        Plan::Reply { .. } => 200,
    };
    tracing::info!(request = index, path = uri.path(), turn = ?turn_index, attempt, status, "scripted request");
    st.requests.push(RecordedRequest {
        method: method.to_string(),
        path: uri.path().to_owned(),
        headers: headers
            .iter()
            .map(|(n, v)| {
                (
                    n.as_str().to_owned(),
                    String::from_utf8_lossy(v.as_bytes()).into_owned(),
                )
            })
            .collect(),
        body: parsed.unwrap_or(Value::Null),
        raw_body,
        protocol,
        turn: turn_index,
        attempt,
        status,
    });
    drop(guard);

    let request_id = format!("req_scripted_{index}");
    match plan {
        Plan::Reject {
            status,
            check,
            message,
        } => {
            let text = format!("scripted model server: {check}: {message}");
            let mut body = match protocol {
                Some(Protocol::OpenAi) => openai::error_body(&text, "invalid_request_error", None),
                _ => anthropic::error_body(anthropic::error_type(status), &text),
            };
            body["scripted_check"] = Value::String(check);
            json_response(status, &body.to_string(), &request_id)
        }
        Plan::Error {
            status,
            retry_after,
            body,
        } => {
            let mut response = json_response(status, &body.to_string(), &request_id);
            if let Some(seconds) = retry_after {
                response
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            response
        }
        Plan::Reply {
            turn,
            fault,
            chunk_chars,
        } => {
            let protocol = protocol.unwrap_or(Protocol::Anthropic);
            let malformed = fault.as_ref().is_some_and(|f| f.malformed_tool_json);
            let created = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map_or(0, |d| d.as_secs());
            if !streaming {
                let body = match protocol {
                    Protocol::Anthropic => anthropic::message(
                        &turn,
                        &model,
                        &format!("msg_scripted_{index}"),
                        malformed,
                    ),
                    Protocol::OpenAi => openai::completion(
                        &turn,
                        &model,
                        &format!("chatcmpl-scripted-{index}"),
                        created,
                        malformed,
                    ),
                };
                return json_response(200, &body, &request_id);
            }
            let mut frames = match protocol {
                Protocol::Anthropic => anthropic::stream(
                    &turn,
                    &model,
                    &format!("msg_scripted_{index}"),
                    chunk_chars,
                    malformed,
                ),
                Protocol::OpenAi => openai::stream(
                    &turn,
                    &model,
                    &format!("chatcmpl-scripted-{index}"),
                    created,
                    chunk_chars,
                    malformed,
                    include_usage,
                ),
            };
            let fault = fault.unwrap_or_default();
            if let Some(n) = fault.stream_error {
                frames.truncate(n);
                frames.push(match protocol {
                    Protocol::Anthropic => anthropic::overloaded_frame(),
                    Protocol::OpenAi => openai::overloaded_frame(),
                });
            }
            let disconnect = fault.disconnect_after.inspect(|n| frames.truncate(*n));
            sse_response(
                frames,
                disconnect.is_some(),
                fault.chunk_delay_ms.map(Duration::from_millis),
                &request_id,
            )
        }
    }
}

/// Which fault, if any, attempt number `attempt` of a turn gets.
fn fault_for_attempt(faults: &[Fault], attempt: u32) -> Option<&Fault> {
    let mut first = 0u32;
    for fault in faults {
        let end = first.saturating_add(fault.times);
        if attempt < end {
            return Some(fault);
        }
        first = end;
    }
    None
}

/// The status, `retry-after` and body of a fault answered with an error status.
fn error_fault(
    protocol: Protocol,
    fault: &Fault,
    model: &str,
) -> Option<(u16, Option<u64>, Value)> {
    let (status, kind, message, code): (u16, &str, String, Option<&str>) = if let Some(status) =
        fault.http_status
    {
        let (kind, message, code) = match protocol {
            Protocol::Anthropic => {
                let kind = anthropic::error_type(status);
                let message = match kind {
                    "overloaded_error" => "Overloaded",
                    "rate_limit_error" => "Number of request tokens has exceeded your rate limit.",
                    "api_error" => "Internal server error",
                    _ => "Scripted error",
                };
                (kind, message.to_owned(), None)
            }
            Protocol::OpenAi => {
                let (kind, code, message) = openai::error_kind(status);
                (kind, message.to_owned(), code)
            }
        };
        (status, kind, message, code)
    } else if fault.auth_error {
        match protocol {
            Protocol::Anthropic => (
                401,
                "authentication_error",
                "invalid x-api-key".into(),
                None,
            ),
            Protocol::OpenAi => (
                401,
                "invalid_request_error",
                "Incorrect API key provided.".into(),
                Some("invalid_api_key"),
            ),
        }
    } else if fault.model_not_found {
        match protocol {
            Protocol::Anthropic => (404, "not_found_error", format!("model: {model}"), None),
            Protocol::OpenAi => (
                404,
                "invalid_request_error",
                format!("The model `{model}` does not exist or you do not have access to it."),
                Some("model_not_found"),
            ),
        }
    } else if let Some(limits) = fault.context_too_long {
        match protocol {
            Protocol::Anthropic => (
                400,
                "invalid_request_error",
                format!(
                    "prompt is too long: {} tokens > {} maximum",
                    limits.tokens, limits.maximum
                ),
                None,
            ),
            Protocol::OpenAi => (
                400,
                "invalid_request_error",
                format!(
                    "This model's maximum context length is {} tokens. However, your messages \
                     resulted in {} tokens. Please reduce the length of the messages.",
                    limits.maximum, limits.tokens
                ),
                Some("context_length_exceeded"),
            ),
        }
    } else {
        return None;
    };
    let body = match protocol {
        Protocol::Anthropic => anthropic::error_body(kind, &message),
        Protocol::OpenAi => openai::error_body(&message, kind, code),
    };
    Some((status, fault.retry_after, body))
}

fn json_response(status: u16, body: &str, request_id: &str) -> Response {
    let mut response = Response::new(Body::from(body.to_owned()));
    *response.status_mut() = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST);
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    insert_request_id(headers, request_id);
    response
}

/// Both providers return a request id; clients log it in error reports.
fn insert_request_id(headers: &mut HeaderMap, request_id: &str) {
    if let Ok(value) = HeaderValue::from_str(request_id) {
        headers.insert("request-id", value.clone());
        headers.insert("x-request-id", value);
    }
}

fn sse_response(
    frames: Vec<Frame>,
    disconnect: bool,
    delay: Option<Duration>,
    request_id: &str,
) -> Response {
    let mut items: Vec<Result<Bytes, std::io::Error>> = frames
        .into_iter()
        .map(|f| Ok(Bytes::from(f.encode())))
        .collect();
    if disconnect {
        // A body error makes the server drop the connection without the final
        // empty chunk, which the client sees as a truncated response.
        items.push(Err(std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "scripted disconnect",
        )));
    }
    let stream = futures_util::stream::iter(items).then(move |item| async move {
        if item.is_err() {
            // Without a pause the server may still hold the head and the events
            // in its write buffer when the error closes the connection, and the
            // client would see no response at all instead of a cut stream.
            tokio::time::sleep(Duration::from_millis(20)).await;
        } else if let Some(delay) = delay {
            tokio::time::sleep(delay).await;
        }
        item
    });
    let mut response = Response::new(Body::from_stream(stream));
    let headers = response.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream"),
    );
    headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    insert_request_id(headers, request_id);
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn faults_cover_consecutive_attempts() {
        let faults = [Fault::http(429).times(2), Fault::stream_error(1)];
        assert_eq!(fault_for_attempt(&faults, 0), Some(&faults[0]));
        assert_eq!(fault_for_attempt(&faults, 1), Some(&faults[0]));
        assert_eq!(fault_for_attempt(&faults, 2), Some(&faults[1]));
        assert_eq!(fault_for_attempt(&faults, 3), None);
    }
}
