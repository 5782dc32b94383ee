//! Running commands in a live session: the request, the streaming handle
//! with its stdin and flow control, the collected result, and the host's
//! own enforcement of an exec's timeout.

use std::ffi::OsString;
use std::os::unix::ffi::OsStringExt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use tokio::sync::{Semaphore, mpsc};

use super::{Event, Inner, Route, Sandbox};
use crate::error::{Error, Result};
use crate::protocol::{CHUNK, ExecSpec, ExitStatus, HostMsg, Stream, SupMsg, WINDOW, WinSize};

/// One command to run in a sandbox.
#[derive(Debug, Clone, Default)]
pub struct ExecRequest {
    pub argv: Vec<std::ffi::OsString>,
    /// Working directory inside the sandbox (default: the sandbox's workdir).
    pub cwd: Option<String>,
    /// Variables added over the sandbox's environment.
    pub env: Vec<(String, String)>,
    /// Bytes fed to stdin, which is then closed. `None` with `stream_stdin`
    /// false means stdin is `/dev/null`.
    pub stdin: Option<Vec<u8>>,
    /// Keep stdin open for [`Execution::stdin`] (streaming form only).
    pub stream_stdin: bool,
    pub timeout: Option<Duration>,
    /// Bytes kept of each of stdout and stderr; the rest is counted and
    /// discarded, and the result is flagged truncated.
    pub output_limit: Option<u64>,
    /// Run on a pseudo-terminal of this size.
    pub pty: Option<WinSize>,
    /// User and group ids instead of the sandbox's default (see
    /// [`ExecRequest::user`]).
    pub user: Option<(u32, u32)>,
    /// `sh` where the root has no `argv[0]` (see [`ExecRequest::or_sh`]).
    pub or_sh: bool,
}

impl ExecRequest {
    /// A command given as argv; `argv[0]` is looked up in `PATH`.
    pub fn argv<I, S>(args: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<std::ffi::OsString>,
    {
        ExecRequest {
            argv: args.into_iter().map(Into::into).collect(),
            ..Default::default()
        }
    }

    /// A command line run by `/bin/sh -c`.
    pub fn shell(command: &str) -> Self {
        Self::argv(["/bin/sh", "-c", command])
    }

    /// A command line run by bash, or by `sh` in a root without bash (an
    /// Alpine or busybox image): what users' and models' commands get.
    pub fn bash(command: &str) -> Self {
        Self::argv(["bash", "-c", command]).or_sh()
    }

    /// A bash that reads its commands from stdin (no profile, no rc
    /// files), or `sh` in a root without bash.
    pub fn bash_reading_stdin() -> Self {
        Self::argv(["bash", "--noprofile", "--norc"]).or_sh()
    }

    /// Runs `sh` where the root has no `argv[0]` in `PATH` (see
    /// `ExecSpec::or_sh`).
    pub fn or_sh(mut self) -> Self {
        self.or_sh = true;
        self
    }

    /// Runs as user `uid` and group `gid` instead of the sandbox's
    /// default: under an image root, any (the supervisor is root in the
    /// sandbox's user namespace); elsewhere only the ids the sandbox maps.
    pub fn user(mut self, uid: u32, gid: u32) -> Self {
        self.user = Some((uid, gid));
        self
    }

    pub fn cwd(mut self, cwd: impl Into<String>) -> Self {
        self.cwd = Some(cwd.into());
        self
    }

    pub fn env(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.env.push((key.into(), value.into()));
        self
    }

    pub fn stdin(mut self, data: impl Into<Vec<u8>>) -> Self {
        self.stdin = Some(data.into());
        self
    }

    pub fn stream_stdin(mut self) -> Self {
        self.stream_stdin = true;
        self
    }

    pub fn timeout(mut self, t: Duration) -> Self {
        self.timeout = Some(t);
        self
    }

    pub fn output_limit(mut self, bytes: u64) -> Self {
        self.output_limit = Some(bytes);
        self
    }

    pub fn pty(mut self, rows: u16, cols: u16) -> Self {
        self.pty = Some(WinSize { rows, cols });
        self
    }
}

/// How long the supervisor may go without reporting an exec past its
/// timeout once the host has taken all the output it was sent. A serving
/// supervisor reports at once, or after lingering up to 2 s for output of
/// background processes; the rest is slack for a loaded microVM.
const UNREPORTED_LIMIT: Duration = Duration::from_secs(5);

/// How often the timeout watchdog looks.
const WATCH_EVERY: Duration = Duration::from_millis(200);

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

/// The exit codes cordon gives a command that one of the sandbox's limits
/// ended, the same in `cordon run`, in a job's `exit_code` and everywhere
/// else a command's end is a number; any other end is the command's own
/// ([`ExitStatus::code`]: 128 + the signal for a signal).
pub mod exit_code {
    /// The sandbox exceeded its memory limit and the kernel killed a process.
    pub const OOM: i32 = 122;
    /// The workspace outgrew the disk budget and the sandbox was stopped.
    pub const DISK: i32 = 123;
    /// The command ran past its timeout and was killed.
    pub const TIMEOUT: i32 = 124;
}

impl ExecResult {
    /// The command's end as one number, cordon's limits first (see
    /// [`exit_code`]): the disk budget, then the timeout, then memory.
    pub fn exit_code(&self) -> i32 {
        if self.disk_exceeded {
            exit_code::DISK
        } else if self.timed_out {
            exit_code::TIMEOUT
        } else if self.oom_killed {
            exit_code::OOM
        } else {
            self.status.code()
        }
    }
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
    fn build_spec(&self, req: &ExecRequest, id: u64) -> Result<ExecSpec> {
        if req.argv.is_empty() {
            return Err(Error::Config("empty command".into()));
        }
        let mut env: Vec<(String, String)> = self
            .inner
            .base_env
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if req.pty.is_some() {
            crate::config::put_env(&mut env, "TERM", "xterm-256color");
        }
        for (k, v) in &req.env {
            crate::config::check_env_var(k, v)?;
            crate::config::put_env(&mut env, k, v);
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
            or_sh: req.or_sh,
            cwd: req
                .cwd
                .clone()
                .unwrap_or_else(|| self.inner.workdir.clone()),
            env,
            stdin: req.stdin.is_some() || req.stream_stdin,
            timeout_ms: req
                .timeout
                .map(|t| u64::try_from(t.as_millis().max(1)).unwrap_or(u64::MAX)),
            output_limit: req.output_limit,
            pty: req.pty,
            user: req.user,
        })
    }

    /// Starts a command and returns a handle that streams its output.
    /// Fails if the command cannot be started (e.g. not found).
    pub async fn exec_stream(&self, req: ExecRequest) -> Result<Execution> {
        if self.inner.gone.load(Ordering::SeqCst) {
            return Err(self.inner.gone_error());
        }
        self.inner.check_adopted()?;
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
        // A timeout past any clock's range is none.
        if let Some(deadline) = req
            .timeout
            .and_then(|t| tokio::time::Instant::from_std(started).checked_add(t))
        {
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
            end: None,
            look: None,
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
    /// The end, received and not yet returned: kept here so that a `next`
    /// dropped while it awaits (a `select!` whose other branch won) loses
    /// nothing, and the next call returns it.
    end: Option<Event>,
    /// The disk budget's last look, asked for and not yet answered, kept
    /// for the same reason.
    look: Option<tokio::sync::oneshot::Receiver<()>>,
    /// Output bytes taken, shared with the route (see [`watchdog`]).
    consumed: Arc<AtomicU64>,
    /// The request's output limit, enforced here too: a microVM's
    /// supervisor is within reach of the guest's root.
    limit: Option<u64>,
    /// Bytes passed on per stream, and whether the limit cut any.
    kept: [u64; 2],
    cut: bool,
}

/// A running command's handle, for whoever does not read its output: its
/// stdin (under the protocol's flow control), signals and terminal size.
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
        self.stdin().signal(signal)
    }

    /// Resizes the command's pseudo-terminal.
    pub fn resize(&self, rows: u16, cols: u16) -> Result<()> {
        self.stdin().resize(rows, cols)
    }

    /// The next output chunk or the final result; `None` after `Exit`.
    ///
    /// Cancel-safe: dropped before it returns, it has consumed nothing that
    /// the next call does not return (callers race it against timers).
    pub async fn next(&mut self) -> Option<Result<ExecEvent>> {
        loop {
            if self.finished {
                return None;
            }
            let mut event = match self.end.take() {
                Some(end) => Some(end),
                None => self.events.recv().await,
            };
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
            if let Some(end @ Event::Exited(_)) = event {
                // Held while the last look is awaited: that await may be
                // cancelled, and the next call takes it up again.
                self.end = Some(end);
                self.last_look().await;
                event = self.end.take();
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

    /// One more look at the disk budget before the result: a command that
    /// wrote past the budget and ended before the watcher looked is
    /// reported as stopped for it. Cancel-safe: the look asked for is kept
    /// until answered.
    async fn last_look(&mut self) {
        if self.look.is_none()
            && let Some(watch) = self.inner.disk.get()
            && self.inner.disk_stop.get().is_none()
        {
            self.look = watch.ask();
        }
        if let Some(look) = self.look.as_mut() {
            let _ = look.await;
        }
        self.look = None;
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
