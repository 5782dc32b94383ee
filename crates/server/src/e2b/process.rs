//! envd's `process.Process` service over a sandbox of the API: start a
//! program (argv as given, no shell of cordon's), stream its events,
//! attach to it again, list, write to, signal, resize and close it.
//!
//! A process outlives the stream that started it, as envd's do; a
//! deadline the client set on `Start` bounds the process itself. When the
//! sandbox ends, its streams are cut off rather than ended: that is how
//! the SDKs learn it was killed.

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::rejection::BytesRejection;
use axum::extract::{Path, State};
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde::{Deserialize, Serialize};
use tokio::sync::broadcast;
use tokio::time::Instant;

use super::connect::{self, Code, RpcError};
use super::envd::Envd;
use crate::boxes::{Ended, LiveBox, Numbered, ProcEvent, Process, Started};
use crate::sandbox_api::resolve;
use crate::state::Shared;

/// `POST /process.Process/{method}`.
pub async fn rpc(
    State(shared): State<Arc<Shared>>,
    Envd(b): Envd,
    Path(method): Path<String>,
    extensions: axum::http::Extensions,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let peer = super::envd::peer(&extensions);
    let body = match body {
        Ok(b) => b,
        Err(e) => return RpcError::invalid(e.body_text()).into_response(),
    };
    match method.as_str() {
        "Start" => match connect::stream_request(&headers, &body) {
            Ok(req) => start(shared, b, peer, &headers, req).await,
            Err(e) => connect::stream_error(e),
        },
        "Connect" => match connect::stream_request(&headers, &body) {
            Ok(req) => attach(shared, b, peer, &headers, req),
            Err(e) => connect::stream_error(e),
        },
        "List" => connect::unary(connect::request(&headers, &body).map(|_: Empty| list(&b))),
        "SendInput" => connect::unary(match connect::request(&headers, &body) {
            Ok(req) => send_input(&b, req).await,
            Err(e) => Err(e),
        }),
        "SendSignal" => connect::unary(match connect::request(&headers, &body) {
            Ok(r) => signal(&b, r).await,
            Err(e) => Err(e),
        }),
        "Update" => connect::unary(connect::request(&headers, &body).and_then(|r| update(&b, r))),
        "CloseStdin" => {
            connect::unary(connect::request(&headers, &body).and_then(|r| close_stdin(&b, r)))
        }
        "StreamInput" => RpcError::new(
            Code::Unimplemented,
            "StreamInput is not served here: use SendInput",
        )
        .into_response(),
        other => RpcError::new(
            Code::Unimplemented,
            format!(
                "process.Process has no method {}",
                cordon_tools::printable(other)
            ),
        )
        .into_response(),
    }
}

/// An empty message.
#[derive(Debug, Default, Deserialize, Serialize)]
pub struct Empty {}

/// `ProcessConfig`.
#[derive(Debug, Default, Deserialize, Serialize)]
struct Config {
    #[serde(default)]
    cmd: String,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    envs: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cwd: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct Pty {
    #[serde(default)]
    size: Option<PtySize>,
}

#[derive(Debug, Default, Deserialize)]
struct PtySize {
    #[serde(default)]
    cols: u32,
    #[serde(default)]
    rows: u32,
}

impl PtySize {
    /// Rows and columns, each 1 to 1000.
    fn checked(&self) -> Result<(u16, u16), RpcError> {
        let fit = |n: u32| u16::try_from(n).ok().filter(|n| (1..=1000).contains(n));
        match (fit(self.rows), fit(self.cols)) {
            (Some(r), Some(c)) => Ok((r, c)),
            _ => Err(RpcError::invalid(
                "a terminal's size is 1 to 1000 rows and columns",
            )),
        }
    }
}

#[derive(Debug, Deserialize)]
struct StartRequest {
    #[serde(default)]
    process: Config,
    #[serde(default)]
    pty: Option<Pty>,
    #[serde(default)]
    tag: Option<String>,
    /// Whether stdin stays open; envd's default is yes.
    #[serde(default)]
    stdin: Option<bool>,
}

/// `ProcessSelector`: one of a pid and a tag.
#[derive(Debug, Default, Deserialize)]
struct Selector {
    #[serde(default)]
    pid: Option<u32>,
    #[serde(default)]
    tag: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Selected {
    #[serde(default)]
    process: Selector,
}

#[derive(Debug, Default, Deserialize)]
struct Input {
    #[serde(default)]
    stdin: Option<connect::Base64>,
    #[serde(default)]
    pty: Option<connect::Base64>,
}

#[derive(Debug, Deserialize)]
struct SendInputRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    input: Input,
}

#[derive(Debug, Deserialize)]
struct SignalRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    signal: serde_json::Value,
}

#[derive(Debug, Deserialize)]
struct UpdateRequest {
    #[serde(default)]
    process: Selector,
    #[serde(default)]
    pty: Option<Pty>,
}

/// `ProcessEvent`, in a `StartResponse`/`ConnectResponse`.
#[derive(Debug, Serialize)]
struct EventMessage {
    event: Event,
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum Event {
    Start { pid: u32 },
    Data(Data),
    End(End),
    Keepalive {},
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
enum Data {
    Stdout(connect::Base64),
    Stderr(connect::Base64),
    Pty(connect::Base64),
}

#[derive(Debug, Serialize)]
#[serde(rename_all = "camelCase")]
struct End {
    exit_code: i32,
    exited: bool,
    status: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

impl End {
    /// As envd words it, after Go's `ProcessState`.
    fn of(ended: &Ended) -> End {
        match ended.status {
            cordon_sandbox::ExitStatus::Code(c) => {
                let status = format!("exit status {c}");
                End {
                    exit_code: c,
                    exited: true,
                    error: (c != 0).then(|| status.clone()),
                    status,
                }
            }
            cordon_sandbox::ExitStatus::Signal(s) => {
                let status = format!("signal: {}", signal_name(s));
                End {
                    exit_code: -1,
                    exited: false,
                    error: Some(status.clone()),
                    status,
                }
            }
        }
    }
}

/// A signal as Go names it.
fn signal_name(s: i32) -> String {
    match s {
        1 => "hangup".into(),
        2 => "interrupt".into(),
        3 => "quit".into(),
        6 => "aborted".into(),
        9 => "killed".into(),
        11 => "segmentation fault".into(),
        13 => "broken pipe".into(),
        15 => "terminated".into(),
        n => format!("signal {n}"),
    }
}

fn find(b: &LiveBox, s: &Selector) -> Result<Arc<Process>, RpcError> {
    let found = match (s.pid, &s.tag) {
        (Some(pid), _) => i32::try_from(pid).ok().and_then(|pid| b.process(pid)),
        (None, Some(tag)) => b
            .processes()
            .into_iter()
            .filter(|p| p.started.tag.as_ref() == Some(tag))
            .min_by_key(|p| p.ended().is_some()),
        (None, None) => return Err(RpcError::invalid("name the process: its pid or tag")),
    };
    found.ok_or_else(|| match (s.pid, &s.tag) {
        (Some(pid), _) => RpcError::not_found(format!("process with pid {pid} not found")),
        (_, tag) => RpcError::not_found(format!(
            "process with tag {} not found",
            cordon_tools::printable(tag.as_deref().unwrap_or(""))
        )),
    })
}

/// The process `s` selects, still running.
fn running(b: &LiveBox, s: &Selector) -> Result<Arc<Process>, RpcError> {
    let p = find(b, s)?;
    if p.ended().is_some() {
        return Err(RpcError::not_found(format!(
            "process with pid {} has exited",
            p.pid
        )));
    }
    Ok(p)
}

async fn start(
    shared: Arc<Shared>,
    b: Arc<LiveBox>,
    peer: Option<cordon_listen::Peer>,
    headers: &HeaderMap,
    req: StartRequest,
) -> Response {
    let c = &req.process;
    if c.cmd.is_empty() || c.cmd.contains('\0') || c.args.iter().any(|a| a.contains('\0')) {
        return connect::stream_error(RpcError::invalid(
            "`process.cmd` names the program, and no argument holds a NUL byte",
        ));
    }
    if let Err(e) = crate::sandbox_api::check_env(&c.envs) {
        return connect::stream_error(RpcError::invalid(e.message()));
    }
    let user = match super::envd::user(&b, headers).await {
        Ok(u) => u,
        Err(e) => return connect::stream_error(RpcError::new(Code::Unauthenticated, e)),
    };
    let cwd = resolve(&user.account.home, c.cwd.as_deref().unwrap_or("~"));
    let mut argv = vec![c.cmd.clone()];
    argv.extend(c.args.iter().cloned());
    let mut exec = cordon_sandbox::ExecRequest::argv(argv).cwd(cwd.clone());
    if let Some((uid, gid)) = user.ids {
        let a = &user.account;
        exec = exec
            .user(uid, gid)
            .env("HOME", a.home.clone())
            .env("USER", a.name.clone())
            .env("LOGNAME", a.name.clone());
    }
    for (k, v) in &c.envs {
        exec = exec.env(k.clone(), v.clone());
    }
    let pty = match req.pty.as_ref() {
        None => None,
        Some(p) => {
            let size = p.size.as_ref().map_or(Ok((24, 80)), PtySize::checked);
            match size {
                Ok(s) => Some(s),
                Err(e) => return connect::stream_error(e),
            }
        }
    };
    if let Some((rows, cols)) = pty {
        exec = exec.pty(rows, cols);
    }
    if pty.is_some() || req.stdin.unwrap_or(true) {
        exec = exec.stream_stdin();
    }
    let deadline = connect::deadline(headers);
    if let Some(d) = deadline {
        exec = exec.timeout(d);
    }
    let execution = match b.sandbox.exec_stream(exec).await {
        Ok(e) => e,
        Err(cordon_sandbox::Error::Gone) => return super::envd::not_running(&b.id),
        Err(e) => return connect::stream_error(start_error(&cwd, e)),
    };
    let started = Started {
        cmd: c.cmd.clone(),
        args: c.args.clone(),
        env: c.envs.clone(),
        cwd: c.cwd.clone(),
        tag: req.tag.clone(),
        pty: pty.is_some(),
    };
    let p = Process::follow(started, execution);
    b.add(p.clone());
    let (kept, _, rx) = p.attach();
    follow(
        Follow::new(shared, &b, p, rx, peer, connect::keepalive(headers))
            .replaying(kept)
            .bounding_the_process(deadline.is_some()),
    )
}

fn start_error(cwd: &str, e: cordon_sandbox::Error) -> RpcError {
    match &e {
        cordon_sandbox::Error::Exec {
            stage: cordon_sandbox::SpawnStage::WorkingDirectory,
            ..
        } => RpcError::invalid(format!(
            "cwd '{}' does not exist",
            cordon_tools::printable(cwd)
        )),
        cordon_sandbox::Error::Exec { .. } => {
            RpcError::new(Code::Internal, format!("error starting process: {e}"))
        }
        _ => RpcError::new(Code::Unavailable, format!("the sandbox: {e}")),
    }
}

/// `Connect`: `start`, then what the process does from now on, to its end
/// (one that has ended: `start` and `end`).
fn attach(
    shared: Arc<Shared>,
    b: Arc<LiveBox>,
    peer: Option<cordon_listen::Peer>,
    headers: &HeaderMap,
    req: Selected,
) -> Response {
    let p = match find(&b, &req.process) {
        Ok(p) => p,
        Err(e) => return connect::stream_error(e),
    };
    let (kept, _, rx) = p.attach();
    let ended: Vec<Numbered> = kept
        .into_iter()
        .filter(|(_, e)| matches!(e, ProcEvent::Exit(_)))
        .collect();
    let mut f = Follow::new(shared, &b, p, rx, peer, connect::keepalive(headers)).replaying(ended);
    f.stream_deadline = connect::deadline(headers).map(|d| Instant::now() + d);
    follow(f)
}

/// A stream of one process's events, as it goes.
struct Follow {
    shared: Arc<Shared>,
    sandbox: String,
    process: Arc<Process>,
    rx: broadcast::Receiver<Numbered>,
    /// The connection, to cut off when the sandbox is gone.
    peer: Option<cordon_listen::Peer>,
    /// Envelopes ready to go.
    queue: VecDeque<Result<Bytes, std::io::Error>>,
    done: bool,
    keepalive: Duration,
    /// The process ran under the client's deadline: past it, the stream
    /// ends with `deadline_exceeded`.
    bounded: bool,
    /// When the stream (not the process) ends with `deadline_exceeded`.
    stream_deadline: Option<Instant>,
}

impl Follow {
    fn new(
        shared: Arc<Shared>,
        b: &LiveBox,
        process: Arc<Process>,
        rx: broadcast::Receiver<Numbered>,
        peer: Option<cordon_listen::Peer>,
        keepalive: Duration,
    ) -> Follow {
        let start = EventMessage {
            event: Event::Start {
                pid: process.pid.max(0) as u32,
            },
        };
        Follow {
            shared,
            sandbox: b.id.clone(),
            process,
            rx,
            peer,
            queue: VecDeque::from([Ok(connect::envelope(&start))]),
            done: false,
            keepalive,
            bounded: false,
            stream_deadline: None,
        }
    }

    /// Sends `events` (kept before the stream began) first.
    fn replaying(mut self, events: Vec<Numbered>) -> Follow {
        for (_, e) in events {
            self.take(e);
        }
        self
    }

    fn bounding_the_process(mut self, bounded: bool) -> Follow {
        self.bounded = bounded;
        self
    }

    fn message(&mut self, event: Event) {
        self.queue
            .push_back(Ok(connect::envelope(&EventMessage { event })));
    }

    fn finish(&mut self, error: Option<RpcError>) {
        self.queue
            .push_back(Ok(connect::end_stream(error.as_ref())));
        self.done = true;
    }

    /// Ends the stream by cutting its connection off.
    fn cut(&mut self, why: &str) {
        if let Some(p) = &self.peer {
            p.reset_on_close();
        }
        self.queue
            .push_back(Err(std::io::Error::other(why.to_string())));
        self.done = true;
    }

    /// Queues what event `e` says.
    fn take(&mut self, e: ProcEvent) {
        if self.done {
            return;
        }
        let data = |d: Vec<u8>| connect::Base64(d);
        match e {
            ProcEvent::Stdout(d) if self.process.started.pty => {
                self.message(Event::Data(Data::Pty(data(d))))
            }
            ProcEvent::Stdout(d) => self.message(Event::Data(Data::Stdout(data(d)))),
            ProcEvent::Stderr(d) => self.message(Event::Data(Data::Stderr(data(d)))),
            ProcEvent::Exit(ended) => {
                if ended.lost || self.shared.boxes.by_id(&self.sandbox).is_none() {
                    // The sandbox is gone: cut the connection, as a dead
                    // sandbox's would be.
                    self.cut("the sandbox ended");
                } else if ended.timed_out && self.bounded {
                    self.finish(Some(RpcError::new(
                        Code::DeadlineExceeded,
                        "the process ran past its deadline and was killed",
                    )));
                } else {
                    self.message(Event::End(End::of(&ended)));
                    self.finish(None);
                }
            }
        }
    }

    /// The next envelope, waiting for the process as need be.
    async fn next(mut self) -> Option<(Result<Bytes, std::io::Error>, Follow)> {
        loop {
            if let Some(item) = self.queue.pop_front() {
                return Some((item, self));
            }
            if self.done {
                return None;
            }
            let wait = Instant::now() + self.keepalive;
            let until = self.stream_deadline.map_or(wait, |d| d.min(wait));
            match tokio::time::timeout_at(until, self.rx.recv()).await {
                Ok(Ok((_, e))) => self.take(e),
                Ok(Err(broadcast::error::RecvError::Lagged(n))) => self.finish(Some(RpcError::new(
                    Code::DataLoss,
                    format!("this stream fell behind the process's output by {n} chunks: connect again"),
                ))),
                Ok(Err(broadcast::error::RecvError::Closed)) => self.cut("the process is gone"),
                Err(_) if self.stream_deadline.is_some_and(|d| Instant::now() >= d) => {
                    self.finish(Some(RpcError::new(
                        Code::DeadlineExceeded,
                        "the stream's deadline passed",
                    )))
                }
                Err(_) => self.message(Event::Keepalive {}),
            }
        }
    }
}

fn follow(f: Follow) -> Response {
    connect::stream_response(futures_util::stream::unfold(f, Follow::next))
}

#[derive(Debug, Serialize)]
struct ProcessInfo {
    config: Config,
    pid: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    tag: Option<String>,
}

#[derive(Debug, Serialize)]
struct ListResponse {
    processes: Vec<ProcessInfo>,
}

/// `List`: the processes running.
fn list(b: &LiveBox) -> ListResponse {
    let processes = b
        .processes()
        .into_iter()
        .filter(|p| p.ended().is_none())
        .map(|p| ProcessInfo {
            config: Config {
                cmd: p.started.cmd.clone(),
                args: p.started.args.clone(),
                envs: p.started.env.clone(),
                cwd: p.started.cwd.clone(),
            },
            pid: p.pid.max(0) as u32,
            tag: p.started.tag.clone(),
        })
        .collect();
    ListResponse { processes }
}

async fn send_input(b: &LiveBox, req: SendInputRequest) -> Result<Empty, RpcError> {
    let p = running(b, &req.process)?;
    let bytes = match (req.input.stdin, req.input.pty) {
        (Some(d), None) | (None, Some(d)) => d.0,
        _ => return Err(RpcError::invalid("`input` is one of stdin and pty")),
    };
    // Nothing to write is no end of input.
    if !bytes.is_empty() {
        p.control().write(&bytes).await.map_err(|_| {
            RpcError::new(Code::FailedPrecondition, "the process's stdin is closed")
        })?;
    }
    Ok(Empty {})
}

async fn signal(b: &LiveBox, req: SignalRequest) -> Result<Empty, RpcError> {
    let n = match &req.signal {
        serde_json::Value::String(s) if s == "SIGNAL_SIGKILL" => 9,
        serde_json::Value::String(s) if s == "SIGNAL_SIGTERM" => 15,
        serde_json::Value::Number(n) if matches!(n.as_i64(), Some(9 | 15)) => {
            n.as_i64().unwrap_or(15) as i32
        }
        other => {
            return Err(RpcError::new(
                Code::Unimplemented,
                format!("signal {other}: SIGNAL_SIGKILL or SIGNAL_SIGTERM"),
            ));
        }
    };
    let p = running(b, &req.process)?;
    let (_, _, mut rx) = p.attach();
    p.control()
        .signal(n)
        .map_err(|e| RpcError::new(Code::NotFound, e.to_string()))?;
    // Killed is answered once it is gone (reaped): a `kill -0` of its pid
    // right after must fail, as it does under envd.
    if n == 9 {
        let gone = async {
            while p.ended().is_none() {
                if let Err(broadcast::error::RecvError::Closed) = rx.recv().await {
                    break;
                }
            }
        };
        let _ = tokio::time::timeout(Duration::from_secs(5), gone).await;
    }
    Ok(Empty {})
}

fn update(b: &LiveBox, req: UpdateRequest) -> Result<Empty, RpcError> {
    let p = running(b, &req.process)?;
    if let Some(size) = req.pty.as_ref().and_then(|p| p.size.as_ref()) {
        if !p.started.pty {
            return Err(RpcError::new(
                Code::FailedPrecondition,
                "the process has no terminal to resize",
            ));
        }
        let (rows, cols) = size.checked()?;
        p.control()
            .resize(rows, cols)
            .map_err(|e| RpcError::new(Code::NotFound, e.to_string()))?;
    }
    Ok(Empty {})
}

fn close_stdin(b: &LiveBox, req: Selected) -> Result<Empty, RpcError> {
    let p = running(b, &req.process)?;
    p.control()
        .close()
        .map_err(|e| RpcError::new(Code::NotFound, e.to_string()))?;
    Ok(Empty {})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_are_written_as_envd_writes_them() {
        let j = |e: Event| serde_json::to_string(&EventMessage { event: e }).unwrap();
        assert_eq!(
            j(Event::Start { pid: 7 }),
            r#"{"event":{"start":{"pid":7}}}"#
        );
        assert_eq!(
            j(Event::Data(Data::Stdout(connect::Base64(b"hi".to_vec())))),
            r#"{"event":{"data":{"stdout":"aGk="}}}"#
        );
        assert_eq!(j(Event::Keepalive {}), r#"{"event":{"keepalive":{}}}"#);
        let ended = |status| Ended {
            exit_code: 0,
            status,
            timed_out: false,
            oom_killed: false,
            lost: false,
        };
        assert_eq!(
            j(Event::End(End::of(&ended(
                cordon_sandbox::ExitStatus::Code(0)
            )))),
            r#"{"event":{"end":{"exitCode":0,"exited":true,"status":"exit status 0"}}}"#
        );
        assert_eq!(
            j(Event::End(End::of(&ended(
                cordon_sandbox::ExitStatus::Signal(9)
            )))),
            r#"{"event":{"end":{"exitCode":-1,"exited":false,"status":"signal: killed","error":"signal: killed"}}}"#
        );
    }

    #[test]
    fn requests_read_as_the_sdks_write_them() {
        let s: StartRequest = serde_json::from_str(
            r#"{"process":{"cmd":"/bin/bash","args":["-l","-c","echo hi"],"envs":{}},"stdin":false}"#,
        )
        .unwrap();
        assert_eq!(s.process.args[2], "echo hi");
        assert_eq!(s.stdin, Some(false));
        let i: SendInputRequest =
            serde_json::from_str(r#"{"process":{"pid":12},"input":{"stdin":""}}"#).unwrap();
        assert_eq!(i.process.pid, Some(12));
        assert_eq!(i.input.stdin.map(|b| b.0), Some(Vec::new()));
    }
}
