//! A live sandbox session, independent of how it is isolated: it speaks the
//! framed protocol to a supervisor over a byte stream and multiplexes many
//! concurrent execs over it.

use std::collections::HashMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::disk::DiskStop;
use crate::protocol::{
    self, CHUNK, ExecSpec, ExitStatus, HostMsg, ReadyInfo, SpawnStage, Stream, SupMsg, WINDOW,
    WinSize,
};
use crate::{Error, ExecRequest, Result};

/// What a backend provides beyond the protocol stream: killing the
/// sandbox from outside and reading its out-of-memory counter.
pub(crate) trait Lifecycle: Send + Sync {
    /// Out-of-memory kills so far, when the backend can tell.
    fn oom_kills(&self) -> Option<u64>;
    /// Kills the whole sandbox immediately. Must not block.
    fn kill(&self);
    /// Waits (blocking) until the sandbox is gone and releases host
    /// resources. Called at most once, off the async runtime.
    fn reap(&self, grace: Duration);
    /// The host process every process of the sandbox descends from (the
    /// outer supervisor, or QEMU): where the disk watcher looks for files
    /// that were deleted but are still open.
    fn host_pid(&self) -> i32;
}

/// What a backend hands to [`Sandbox::connect`] besides the stream.
pub(crate) struct ConnectParams {
    pub setup: HostMsg,
    pub lifecycle: Box<dyn Lifecycle>,
    /// How limits are enforced, for [`SandboxInfo::limits`].
    pub limits: String,
    pub backend: &'static str,
    pub base_env: Vec<(String, String)>,
    pub workdir: String,
    /// [`crate::SandboxConfig::read_only`], for the host-side tools.
    pub read_only: Vec<std::path::PathBuf>,
    pub setup_timeout: Duration,
    /// Set the supervisor's clock from the host's once it is ready (a
    /// microVM's own clock starts from its RTC).
    pub set_clock: bool,
}

/// Facts about a running sandbox, for diagnostics.
#[derive(Debug, Clone)]
pub struct SandboxInfo {
    pub backend: &'static str,
    /// How memory and process limits are enforced.
    pub limits: String,
    pub landlock: String,
    pub seccomp_filters: u32,
}

enum Event {
    Started(i32),
    SpawnFailed(SpawnStage, i32, String),
    Output(Stream, Vec<u8>),
    Exited(SupMsg),
    Gone,
}

struct Route {
    events: mpsc::UnboundedSender<Event>,
    stdin_credit: Arc<Semaphore>,
    /// Output bytes received so far (stdout, stderr).
    seen: [u64; 2],
    /// Output bytes the [`Execution`] has taken (and acknowledged).
    consumed: Arc<AtomicU64>,
    started: Instant,
}

impl Route {
    /// Ends exec `id` as killed by the host, with what it had sent.
    fn end_killed(&self, id: u64, started: Instant, timed_out: bool) {
        let _ = self.events.send(Event::Exited(SupMsg::Exited {
            id,
            status: ExitStatus::Signal(libc::SIGKILL),
            duration_us: started.elapsed().as_micros() as u64,
            timed_out,
            stdout_bytes: self.seen[0],
            stderr_bytes: self.seen[1],
            truncated: false,
            oom_killed: false,
        }));
        self.stdin_credit.close();
    }

    /// Output received that the [`Execution`] has not taken yet.
    fn unconsumed(&self) -> u64 {
        self.seen
            .iter()
            .sum::<u64>()
            .saturating_sub(self.consumed.load(Ordering::SeqCst))
    }
}

/// How long the supervisor may go without reporting an exec past its
/// timeout once the host has taken all the output it was sent. A serving
/// supervisor reports at once, or after lingering up to 2 s for output of
/// background processes; the rest is slack for a loaded microVM.
const UNREPORTED_LIMIT: Duration = Duration::from_secs(5);

/// How often the timeout watchdog looks.
const WATCH_EVERY: Duration = Duration::from_millis(200);

/// Output a supervisor may have sent that the host has not yet taken: its
/// window, and a chunk it may read on the edge of it, with room to spare.
/// A supervisor that sends more breaks the protocol; in a microVM it may
/// have been taken over by the guest's root, and must not fill the host's
/// memory.
const MAX_UNCONSUMED: u64 = WINDOW + 2 * CHUNK as u64;

pub(crate) struct Inner {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    routes: Mutex<HashMap<u64, Route>>,
    next_id: AtomicU64,
    gone: AtomicBool,
    pub(crate) lifecycle: Box<dyn Lifecycle>,
    closed: AtomicBool,
    /// Set once the supervisor reports ready, before the handle is returned.
    info: std::sync::OnceLock<SandboxInfo>,
    base_env: Vec<(String, String)>,
    workdir: String,
    read_only: Vec<std::path::PathBuf>,
    /// The virtual screen, once it is up.
    pub(crate) display: std::sync::OnceLock<crate::Display>,
    /// The disk budget's watcher, when there is a budget.
    pub(crate) disk: std::sync::OnceLock<crate::disk::DiskWatch>,
    /// Set when the watcher stopped the sandbox.
    pub(crate) disk_stop: std::sync::OnceLock<DiskStop>,
}

impl Inner {
    /// The exec routes. A panic elsewhere while they were held must not
    /// make every later exec (and every Drop) panic too.
    fn routes(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Route>> {
        self.routes.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn send(&self, msg: &HostMsg) -> Result<()> {
        let mut buf = Vec::new();
        protocol::encode(msg, &mut buf);
        self.tx.send(buf).map_err(|_| Error::Gone)
    }

    pub(crate) fn host_pid(&self) -> i32 {
        self.lifecycle.host_pid()
    }

    pub(crate) fn is_gone(&self) -> bool {
        self.gone.load(Ordering::SeqCst)
    }

    /// The error for a sandbox that has ended: why, when cordon ended it.
    fn gone_error(&self) -> Error {
        match self.disk_stop.get() {
            Some(stop) => Error::DiskBudget(*stop),
            None => Error::Gone,
        }
    }

    /// The workspace grew by `growth` bytes, past the disk budget: the
    /// whole sandbox goes, and every running exec ends as killed by it.
    pub(crate) fn disk_exceeded(&self, growth: u64) {
        let budget = self.disk.get().map_or(0, |d| d.budget);
        if self.disk_stop.set(DiskStop { budget, growth }).is_err() {
            return;
        }
        tracing::warn!(
            "the sandbox's workspace grew by {growth} bytes, past its disk budget of {budget}; stopping it"
        );
        let routes = std::mem::take(&mut *self.routes());
        for (id, r) in routes {
            r.end_killed(id, r.started, false);
        }
        self.lifecycle.kill();
        self.mark_gone();
    }

    pub(crate) fn mark_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
        let routes = std::mem::take(&mut *self.routes());
        for (_, r) in routes {
            let _ = r.events.send(Event::Gone);
            // Wake writers waiting for stdin credit; they will see `gone`.
            r.stdin_credit.close();
        }
    }

    /// The supervisor let exec `id` run past its timeout and did not report
    /// it, with nothing left for the host to take: it may be stopped, traced
    /// or taken over from inside (a microVM's guest root can do that to its
    /// pid 1). The timeout must hold anyway, so the whole sandbox goes: the
    /// exec ends as timed out, every other one as gone.
    fn kill_unresponsive(&self, id: u64, started: Instant) {
        tracing::warn!(
            "the sandbox's supervisor did not end a command at its timeout; killing the sandbox"
        );
        if let Some(r) = self.routes().remove(&id) {
            r.end_killed(id, started, true);
        }
        self.lifecycle.kill();
        self.mark_gone();
    }

    /// The supervisor broke the protocol: nothing it sends can be trusted
    /// any more, so the sandbox goes.
    fn violation(&self, what: &str) {
        tracing::error!(
            "the sandbox's supervisor broke the protocol ({what}); killing the sandbox"
        );
        self.lifecycle.kill();
        self.mark_gone();
    }
}

/// Enforces exec `id`'s timeout from the host; the supervisor enforces it
/// first. Past the deadline, while the exec is unreported, the watchdog
/// tells a supervisor that waits for the host (output the [`Execution`] has
/// not taken yet: a slow reader) from one that does not report at all.
/// The first may wait as long as the reader takes; the second has
/// [`UNREPORTED_LIMIT`].
async fn watchdog(weak: Weak<Inner>, id: u64, started: Instant, deadline: tokio::time::Instant) {
    tokio::time::sleep_until(deadline).await;
    let mut caught_up_since: Option<tokio::time::Instant> = None;
    loop {
        {
            let Some(inner) = weak.upgrade() else {
                return;
            };
            if inner.gone.load(Ordering::SeqCst) {
                return;
            }
            let behind = match inner.routes().get(&id) {
                None => return,
                Some(r) => r.unconsumed() > 0,
            };
            if behind {
                caught_up_since = None;
            } else {
                let since = *caught_up_since.get_or_insert_with(tokio::time::Instant::now);
                if since.elapsed() >= UNREPORTED_LIMIT {
                    inner.kill_unresponsive(id, started);
                    return;
                }
            }
        }
        // Not holding the Inner while waiting: dropping the last handle
        // must still end the sandbox.
        tokio::time::sleep(WATCH_EVERY).await;
    }
}

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.lifecycle.kill();
        }
    }
}

/// A live sandbox. Cheap to clone; every clone refers to the same session,
/// which ends when [`Sandbox::close`] is called or the last clone is dropped.
#[derive(Clone)]
pub struct Sandbox {
    pub(crate) inner: Arc<Inner>,
}

/// The result of a finished command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecResult {
    pub status: ExitStatus,
    pub duration: Duration,
    pub timed_out: bool,
    /// Some output beyond the exec's limit was discarded.
    pub truncated: bool,
    /// The sandbox hit its memory limit and a process was killed.
    pub oom_killed: bool,
    /// The workspace outgrew the disk budget and the whole sandbox was
    /// stopped ([`Sandbox::disk_stopped`] says by how much).
    pub disk_exceeded: bool,
    /// Bytes the command wrote, including any discarded.
    pub stdout_bytes: u64,
    pub stderr_bytes: u64,
}

/// Output and result of [`Sandbox::exec`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExecOutput {
    pub stdout: Vec<u8>,
    pub stderr: Vec<u8>,
    pub status: ExitStatus,
    pub duration: Duration,
    pub timed_out: bool,
    pub truncated: bool,
    pub oom_killed: bool,
    pub disk_exceeded: bool,
}

impl ExecOutput {
    pub fn stdout_str(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }
    pub fn stderr_str(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}

/// What a streaming exec yields, in order; `Exit` comes last.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExecEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(ExecResult),
}

impl Sandbox {
    /// Host paths in the workspace the sandbox sees read-only
    /// ([`crate::SandboxConfig::read_only`]): host-side writers refuse them
    /// too.
    pub fn read_only(&self) -> &[std::path::PathBuf] {
        &self.inner.read_only
    }

    /// Creates a sandbox with the backend `config.backend` names; with
    /// `config.display`, its X display is up when this returns.
    pub async fn create(config: crate::SandboxConfig) -> Result<Sandbox> {
        let mut config = config;
        if config.display.is_some() {
            config.env.retain(|(k, _)| k != "DISPLAY");
            config.env.push(("DISPLAY".into(), crate::DISPLAY.into()));
        }
        // What the workspace takes before the sandbox can write, measured
        // while the sandbox starts.
        let baseline = crate::disk::Baseline::start(&config)?;
        let sandbox = match config.backend {
            crate::BackendKind::Native => crate::native::create(&config).await?,
            crate::BackendKind::Microvm => crate::microvm::create(&config).await?,
        };
        if let Some(b) = baseline {
            b.watch(&sandbox).await?;
        }
        if let Some(d) = config.display
            && let Err(e) = sandbox.start_display(d).await
        {
            sandbox.close().await;
            return Err(e);
        }
        Ok(sandbox)
    }

    pub fn info(&self) -> &SandboxInfo {
        self.inner
            .info
            .get()
            .expect("a Sandbox is handed out only after its info is set")
    }

    /// Starts the protocol over `stream` and waits for the supervisor's
    /// `Ready`. Backends call this after launching their supervisor.
    pub(crate) async fn connect(stream: UnixStream, params: ConnectParams) -> Result<Sandbox> {
        let ConnectParams {
            setup,
            lifecycle,
            limits,
            backend,
            base_env,
            workdir,
            read_only,
            setup_timeout,
            set_clock,
        } = params;
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let mut first = Vec::new();
        protocol::encode(&setup, &mut first);
        tx.send(first).map_err(|_| Error::Gone)?;
        tokio::spawn(async move {
            while let Some(buf) = rx.recv().await {
                if wr.write_all(&buf).await.is_err() {
                    break;
                }
            }
            // Dropping the write half shuts our side down, which the
            // supervisor takes as the end of the session.
        });

        let (ready_tx, ready_rx) = oneshot::channel::<Result<ReadyInfo>>();
        let inner = Arc::new_cyclic(|weak: &std::sync::Weak<Inner>| {
            let weak = weak.clone();
            tokio::spawn(async move {
                let mut ready_tx = Some(ready_tx);
                let mut buf: Vec<u8> = Vec::with_capacity(CHUNK * 2);
                let mut chunk = vec![0u8; CHUNK + 64];
                'read: loop {
                    let n = match rd.read(&mut chunk).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => n,
                    };
                    buf.extend_from_slice(&chunk[..n]);
                    let mut used = 0;
                    loop {
                        let msg = match protocol::decode::<SupMsg>(&buf[used..]) {
                            Ok(Some((msg, n))) => {
                                used += n;
                                msg
                            }
                            Ok(None) => break,
                            Err(e) => {
                                tracing::error!(
                                    "malformed message from the sandbox supervisor: {e}"
                                );
                                break 'read;
                            }
                        };
                        match msg {
                            SupMsg::Ready(info) => {
                                // Queued before the handle is returned, so
                                // ahead of any exec.
                                if set_clock
                                    && let Some(inner) = weak.upgrade()
                                    && let Ok(now) = std::time::SystemTime::now()
                                        .duration_since(std::time::UNIX_EPOCH)
                                {
                                    let _ = inner.send(&HostMsg::SetClock {
                                        realtime_ns: now.as_nanos() as u64,
                                    });
                                }
                                if let Some(t) = ready_tx.take() {
                                    let _ = t.send(Ok(info));
                                }
                            }
                            SupMsg::SetupFailed { message, errno } => {
                                if let Some(t) = ready_tx.take() {
                                    let _ = t.send(Err(Error::Setup { message, errno }));
                                }
                                break 'read;
                            }
                            other => {
                                let Some(inner) = weak.upgrade() else {
                                    break 'read;
                                };
                                dispatch(&inner, other);
                            }
                        }
                    }
                    buf.drain(..used);
                }
                if let Some(t) = ready_tx.take() {
                    let _ = t.send(Err(Error::Setup {
                        message: "the supervisor exited during setup".into(),
                        errno: 0,
                    }));
                }
                if let Some(inner) = weak.upgrade() {
                    inner.mark_gone();
                }
            });
            Inner {
                tx,
                routes: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                gone: AtomicBool::new(false),
                lifecycle,
                closed: AtomicBool::new(false),
                info: std::sync::OnceLock::new(),
                display: std::sync::OnceLock::new(),
                disk: std::sync::OnceLock::new(),
                disk_stop: std::sync::OnceLock::new(),
                base_env,
                workdir,
                read_only,
            }
        });
        let ready = match tokio::time::timeout(setup_timeout, ready_rx).await {
            Ok(Ok(r)) => r,
            Ok(Err(_)) => Err(Error::Gone),
            Err(_) => Err(Error::SetupTimeout(setup_timeout)),
        };
        match ready {
            Ok(info) => {
                let _ = inner.info.set(SandboxInfo {
                    backend,
                    limits,
                    landlock: info.landlock,
                    seccomp_filters: info.seccomp_filters,
                });
                Ok(Sandbox { inner })
            }
            Err(e) => {
                inner.closed.store(true, Ordering::SeqCst);
                inner.lifecycle.kill();
                Err(e)
            }
        }
    }

    fn build_spec(&self, req: &ExecRequest, id: u64) -> Result<ExecSpec> {
        if req.argv.is_empty() {
            return Err(Error::Config("empty command".into()));
        }
        let mut env: Vec<(String, String)> = self.inner.base_env.clone();
        if req.pty.is_some() {
            env.retain(|(k, _)| k != "TERM");
            env.push(("TERM".into(), "xterm-256color".into()));
        }
        for (k, v) in &req.env {
            if k.is_empty() || k.contains('=') || k.contains('\0') || v.contains('\0') {
                return Err(Error::Config(format!("invalid environment variable {k:?}")));
            }
            env.retain(|(ek, _)| ek != k);
            env.push((k.clone(), v.clone()));
        }
        let argv = req
            .argv
            .iter()
            .map(|a| {
                let bytes = OsString::into_vec(a.clone());
                if bytes.contains(&0) {
                    Err(Error::Config("command argument contains a NUL byte".into()))
                } else {
                    Ok(serde_bytes::ByteBuf::from(bytes))
                }
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(ExecSpec {
            id,
            argv,
            cwd: req
                .cwd
                .clone()
                .unwrap_or_else(|| self.inner.workdir.clone()),
            env,
            stdin: req.stdin.is_some() || req.stream_stdin,
            timeout_ms: req.timeout.map(|t| t.as_millis().max(1) as u64),
            output_limit: req.output_limit,
            pty: req.pty,
        })
    }

    /// Starts a command and returns a handle that streams its output.
    /// Fails if the command cannot be started (e.g. not found).
    pub async fn exec_stream(&self, req: ExecRequest) -> Result<Execution> {
        if self.inner.gone.load(Ordering::SeqCst) {
            return Err(self.inner.gone_error());
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let spec = self.build_spec(&req, id)?;
        let (etx, mut erx) = mpsc::unbounded_channel();
        let credit = Arc::new(Semaphore::new(WINDOW as usize));
        let consumed = Arc::new(AtomicU64::new(0));
        self.inner.routes().insert(
            id,
            Route {
                events: etx,
                stdin_credit: credit.clone(),
                seen: [0; 2],
                consumed: consumed.clone(),
                started: Instant::now(),
            },
        );
        let oom_before = self.inner.lifecycle.oom_kills();
        let started = Instant::now();
        if let Some(r) = self.inner.routes().get_mut(&id) {
            r.started = started;
        }
        if let Err(e) = self.inner.send(&HostMsg::Exec(spec)) {
            self.inner.routes().remove(&id);
            return Err(e);
        }
        let pid = match erx.recv().await {
            Some(Event::Started(pid)) => pid,
            Some(Event::SpawnFailed(stage, errno, message)) => {
                self.inner.routes().remove(&id);
                return Err(Error::Exec {
                    stage,
                    message,
                    errno,
                });
            }
            _ => return Err(self.inner.gone_error()),
        };
        if let Some(t) = req.timeout {
            let deadline = tokio::time::Instant::from_std(started) + t;
            tokio::spawn(watchdog(Arc::downgrade(&self.inner), id, started, deadline));
        }
        let exec = Execution {
            id,
            pid,
            inner: self.inner.clone(),
            events: erx,
            credit,
            oom_before,
            finished: false,
            consumed,
            limit: req.output_limit,
            kept: [0; 2],
            cut: false,
        };
        if let Some(data) = req.stdin {
            let stdin = exec.stdin();
            tokio::spawn(async move {
                let _ = stdin.write(&data).await;
                let _ = stdin.close();
            });
        }
        Ok(exec)
    }

    /// Runs a command to completion and collects its output.
    pub async fn exec(&self, req: ExecRequest) -> Result<ExecOutput> {
        self.exec_stream(req).await?.output().await
    }

    /// Ends the session: every process in it is killed and host resources
    /// are released. Other clones of this handle see [`Error::Gone`].
    pub async fn close(&self) {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        let _ = self.inner.send(&HostMsg::Shutdown);
        let inner = self.inner.clone();
        let _ =
            tokio::task::spawn_blocking(move || inner.lifecycle.reap(Duration::from_secs(2))).await;
    }
}

fn dispatch(inner: &Inner, msg: SupMsg) {
    let (id, event) = match msg {
        SupMsg::Started { id, pid } => (id, Event::Started(pid)),
        SupMsg::SpawnFailed {
            id,
            stage,
            errno,
            message,
        } => (id, Event::SpawnFailed(stage, errno, message)),
        SupMsg::Output { id, stream, data } => (id, Event::Output(stream, data)),
        SupMsg::StdinAck { id, bytes } => {
            if let Some(r) = inner.routes().get(&id) {
                // Never more credit than the window: an inflated ack would
                // let stdin run ahead (and past the semaphore's maximum,
                // which panics).
                let room = (WINDOW as usize).saturating_sub(r.stdin_credit.available_permits());
                r.stdin_credit
                    .add_permits(usize::try_from(bytes).unwrap_or(usize::MAX).min(room));
            }
            return;
        }
        ref m @ SupMsg::Exited { id, .. } => (id, Event::Exited(m.clone())),
        SupMsg::Ready(_) | SupMsg::SetupFailed { .. } => return,
    };
    let done = matches!(event, Event::Exited(_) | Event::SpawnFailed(..));
    let mut routes = inner.routes();
    // A route is missing only when its handle was dropped, which already
    // killed the command and opened its window; the event has no reader.
    if let Some(r) = routes.get_mut(&id) {
        if let Event::Output(stream, data) = &event {
            r.seen[*stream as usize] += data.len() as u64;
            if r.unconsumed() > MAX_UNCONSUMED {
                drop(routes);
                inner.violation("output beyond its window");
                return;
            }
        }
        let _ = r.events.send(event);
    }
    if done && let Some(r) = routes.remove(&id) {
        r.stdin_credit.close();
    }
}

/// A running command in a sandbox.
pub struct Execution {
    id: u64,
    pid: i32,
    inner: Arc<Inner>,
    events: mpsc::UnboundedReceiver<Event>,
    credit: Arc<Semaphore>,
    oom_before: Option<u64>,
    finished: bool,
    /// Output bytes taken, shared with the route (see [`watchdog`]).
    consumed: Arc<AtomicU64>,
    /// The request's output limit, enforced here too: a microVM's
    /// supervisor is within reach of the guest's root.
    limit: Option<u64>,
    /// Bytes passed on per stream, and whether the limit cut any.
    kept: [u64; 2],
    cut: bool,
}

/// Writes to a running command's stdin, under the protocol's flow control.
#[derive(Clone)]
pub struct ExecStdin {
    id: u64,
    inner: Arc<Inner>,
    credit: Arc<Semaphore>,
}

impl ExecStdin {
    /// Sends `data`, waiting while too much is in flight.
    pub async fn write(&self, data: &[u8]) -> Result<()> {
        for chunk in data.chunks(CHUNK) {
            let permit = self
                .credit
                .acquire_many(chunk.len() as u32)
                .await
                .map_err(|_| Error::Gone)?;
            permit.forget();
            self.inner.send(&HostMsg::Stdin {
                id: self.id,
                data: chunk.to_vec(),
            })?;
        }
        Ok(())
    }

    /// Closes stdin once everything written so far has been delivered.
    pub fn close(&self) -> Result<()> {
        self.inner.send(&HostMsg::StdinEof { id: self.id })
    }
}

impl Execution {
    /// The command's pid inside the sandbox.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// A writer for the command's stdin (only useful if the request asked
    /// for `stream_stdin`, or for a pty).
    pub fn stdin(&self) -> ExecStdin {
        ExecStdin {
            id: self.id,
            inner: self.inner.clone(),
            credit: self.credit.clone(),
        }
    }

    /// Sends a signal to the command's process group.
    pub fn signal(&self, signal: i32) -> Result<()> {
        self.inner.send(&HostMsg::Signal {
            id: self.id,
            signal,
        })
    }

    /// Resizes the command's pseudo-terminal.
    pub fn resize(&self, rows: u16, cols: u16) -> Result<()> {
        self.inner.send(&HostMsg::Resize {
            id: self.id,
            size: WinSize { rows, cols },
        })
    }

    /// The next output chunk or the final result; `None` after `Exit`.
    pub async fn next(&mut self) -> Option<Result<ExecEvent>> {
        loop {
            if self.finished {
                return None;
            }
            let event = self.events.recv().await;
            if let Some(Event::Output(stream, mut data)) = event {
                let len = data.len() as u64;
                self.consumed.fetch_add(len, Ordering::SeqCst);
                let _ = self.inner.send(&HostMsg::Ack {
                    id: self.id,
                    bytes: len,
                });
                let i = stream as usize;
                if let Some(limit) = self.limit {
                    let room = limit.saturating_sub(self.kept[i]);
                    if len > room {
                        data.truncate(room as usize);
                        self.cut = true;
                    }
                }
                self.kept[i] += data.len() as u64;
                if data.is_empty() {
                    continue;
                }
                return Some(Ok(match stream {
                    Stream::Stdout => ExecEvent::Stdout(data),
                    Stream::Stderr => ExecEvent::Stderr(data),
                }));
            }
            self.finished = true;
            return Some(match event {
                Some(Event::Exited(SupMsg::Exited {
                    status,
                    duration_us,
                    timed_out,
                    stdout_bytes,
                    stderr_bytes,
                    truncated,
                    oom_killed: guest_oom,
                    ..
                })) => {
                    let oom_after = self.inner.lifecycle.oom_kills();
                    let oom_killed = guest_oom
                        || matches!((self.oom_before, oom_after), (Some(a), Some(b)) if b > a);
                    // One more look before the result: a command that
                    // wrote past the budget and ended before the watcher
                    // looked is reported as stopped for it.
                    if let Some(watch) = self.inner.disk.get()
                        && self.inner.disk_stop.get().is_none()
                    {
                        watch.look().await;
                    }
                    let disk_exceeded = self.inner.disk_stop.get().is_some();
                    Ok(ExecEvent::Exit(ExecResult {
                        status,
                        duration: Duration::from_micros(duration_us),
                        timed_out,
                        truncated: truncated || self.cut,
                        oom_killed: oom_killed && !disk_exceeded,
                        disk_exceeded,
                        // Never less than what arrived.
                        stdout_bytes: stdout_bytes.max(self.kept[0]),
                        stderr_bytes: stderr_bytes.max(self.kept[1]),
                    }))
                }
                _ => Err(self.inner.gone_error()),
            });
        }
    }

    /// Collects all output until the command finishes.
    pub async fn output(mut self) -> Result<ExecOutput> {
        let (mut stdout, mut stderr) = (Vec::new(), Vec::new());
        while let Some(ev) = self.next().await {
            match ev? {
                ExecEvent::Stdout(d) => stdout.extend_from_slice(&d),
                ExecEvent::Stderr(d) => stderr.extend_from_slice(&d),
                ExecEvent::Exit(r) => {
                    return Ok(ExecOutput {
                        stdout,
                        stderr,
                        status: r.status,
                        duration: r.duration,
                        timed_out: r.timed_out,
                        truncated: r.truncated,
                        oom_killed: r.oom_killed,
                        disk_exceeded: r.disk_exceeded,
                    });
                }
            }
        }
        Err(self.inner.gone_error())
    }
}

impl Drop for Execution {
    fn drop(&mut self) {
        if !self.finished {
            // Abandoned mid-run: stop the command rather than leave it
            // blocked on a full output window forever.
            let _ = self.inner.send(&HostMsg::Signal {
                id: self.id,
                signal: libc::SIGKILL,
            });
            let _ = self.inner.send(&HostMsg::Ack {
                id: self.id,
                bytes: u64::MAX / 2,
            });
            self.inner.routes().remove(&self.id);
        }
    }
}
