//! A live sandbox session, independent of how it is isolated: it speaks the
//! framed protocol to a supervisor over a byte stream and multiplexes many
//! concurrent execs over it.

mod exec;
mod fs;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;
use tokio::sync::{Semaphore, mpsc, oneshot};

use crate::error::{DiskStop, Error, Result};
use crate::protocol::{
    self, CHUNK, ExitStatus, HostMsg, ReadyInfo, SpawnStage, Stream, SupMsg, WINDOW,
};
use crate::services::Services;

pub use exec::{ExecEvent, ExecOutput, ExecRequest, ExecResult, ExecStdin, Execution, exit_code};
pub(crate) use fs::Frozen;
pub use fs::{FsResult, Usage, WatchEvent, Watcher};

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
    /// The host processes that may hold the sandbox's files open: the
    /// disk watcher counts the deleted ones they hold.
    fn holders(&self) -> Vec<i32> {
        vec![self.host_pid()]
    }
    /// Where an image root's writable layer is on the host: the disk
    /// budget counts it with the workspace.
    fn writable_layer(&self) -> Option<std::path::PathBuf> {
        None
    }
    /// Bytes of memory the sandbox uses, and its limit, when the host
    /// can tell (a cgroup); a microVM's guest tells instead.
    fn memory(&self) -> Option<(u64, Option<u64>)> {
        None
    }
    /// Leaves a sandbox saved to disk for another process: nothing of it
    /// is removed when this ends. False (nothing done) where it is not
    /// saved so.
    fn keep(&self) -> bool {
        false
    }
    /// While it is saved to disk: makes each of `children` (their
    /// configurations) a copy of it to take up (see `Sandbox::fork`).
    /// Blocking.
    fn fork_saved(&self, _children: &[crate::config::SandboxConfig]) -> Result<()> {
        Err(Error::Config(
            "only a microVM on virtio-fs with a state directory forks from its memory".into(),
        ))
    }
    /// Whether a pause may save the sandbox to disk, to go on in another
    /// process: its channel is held at a frame's edge first (see
    /// `HostMsg::Hold`).
    fn saves(&self) -> bool {
        false
    }
    /// Freezes every process of the sandbox where it is, memory kept (or
    /// thaws them); `to_disk`, where the backend [`Lifecycle::saves`], its
    /// memory saved to disk instead. Blocking; called off the async
    /// runtime.
    fn freeze(&self, _frozen: bool, _to_disk: bool) -> std::io::Result<()> {
        Err(std::io::Error::new(
            std::io::ErrorKind::Unsupported,
            "this backend cannot pause a sandbox yet",
        ))
    }
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
    /// [`crate::config::SandboxConfig::read_only`], for the host-side tools.
    pub read_only: Vec<std::path::PathBuf>,
    /// Where the extra binds are inside, for [`Sandbox::bind_targets`].
    pub bind_targets: Vec<String>,
    /// [`crate::config::SandboxConfig::network`], for [`Sandbox::network_kind`].
    pub network: crate::config::Network,
    /// [`crate::config::RootImage::uid`], for [`Sandbox::image_user`].
    pub image_user: Option<u32>,
    pub setup_timeout: Duration,
    /// Set the supervisor's clock from the host's once it is ready (a
    /// microVM's own clock starts from its RTC).
    pub set_clock: bool,
    /// The sandbox's host-side services, which live as long as its session.
    pub services: Services,
}

impl ConnectParams {
    /// A session of `backend` for a sandbox made with `config`, its
    /// channel's first message `setup`: what it takes from the config is
    /// taken here, once for every backend.
    pub(crate) fn new(
        config: &crate::config::SandboxConfig,
        backend: crate::config::BackendKind,
        setup: HostMsg,
        lifecycle: Box<dyn Lifecycle>,
        limits: String,
        services: Services,
    ) -> ConnectParams {
        ConnectParams {
            setup,
            lifecycle,
            limits,
            backend: backend.as_str(),
            base_env: config.base_env(),
            workdir: config.workdir.clone(),
            read_only: config.read_only.clone(),
            bind_targets: config.binds.iter().map(|b| b.target.clone()).collect(),
            network: config.network,
            image_user: config.image.as_ref().map(|i| i.uid),
            setup_timeout: config.setup_timeout,
            // A microVM's own clock starts from its RTC.
            set_clock: backend == crate::config::BackendKind::Microvm,
            services,
        }
    }
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

/// Output a supervisor may have sent that the host has not yet taken: its
/// window, and a chunk it may read on the edge of it, with room to spare.
/// A supervisor that sends more breaks the protocol; in a microVM it may
/// have been taken over by the guest's root, and must not fill the host's
/// memory.
const MAX_UNCONSUMED: u64 = WINDOW + 2 * CHUNK as u64;

/// How long a supervisor has to report that a shutdown's killed
/// processes have all gone (see [`Sandbox::end_processes`]).
const END_TIMEOUT: Duration = Duration::from_millis(2500);

/// How long a supervisor has to answer a `HostMsg::Hold`: it finishes
/// one frame of at most [`protocol::MAX_FRAME`] bytes first.
const HOLD_TIMEOUT: Duration = Duration::from_secs(10);

/// A hold asked of the session's writer (see [`Sandbox::hold`]): it writes
/// what was queued before it, then the `Hold` frame, then nothing until
/// `release` fires or is dropped.
struct HoldRequest {
    release: oneshot::Receiver<()>,
}

pub(crate) struct Inner {
    tx: mpsc::UnboundedSender<Vec<u8>>,
    /// Holds for the writer.
    holds: mpsc::UnboundedSender<HoldRequest>,
    /// Fired by the reader at the supervisor's `Held`.
    held: Mutex<Option<oneshot::Sender<()>>>,
    /// Fired by the reader at the supervisor's `Ended`.
    ended: Mutex<Option<oneshot::Sender<()>>>,
    /// Lets the writer go on after a hold.
    release: Mutex<Option<oneshot::Sender<()>>>,
    routes: Mutex<HashMap<u64, Route>>,
    /// Questions to the supervisor waiting for their answers, by id.
    asked: Mutex<HashMap<u64, tokio::sync::oneshot::Sender<fs::Answer>>>,
    /// Watches, by id.
    watching: Mutex<HashMap<u64, fs::WatchSlot>>,
    next_id: AtomicU64,
    gone: AtomicBool,
    /// Frozen by [`Sandbox::pause`].
    paused: AtomicBool,
    /// Taken up paused from another process ([`Sandbox::adopt`]): its
    /// supervisor's `Ready`, which the resume waits for, and how long.
    #[allow(clippy::type_complexity)]
    reattaching: Mutex<Option<(oneshot::Receiver<Result<ReadyInfo>>, Duration)>>,
    /// Held while it is paused or resumed.
    pausing: tokio::sync::Mutex<()>,
    pub(crate) lifecycle: Box<dyn Lifecycle>,
    closed: AtomicBool,
    /// Set once the supervisor reports ready, before the handle is returned.
    info: std::sync::OnceLock<SandboxInfo>,
    /// What every exec's environment starts from; [`Sandbox::set_env`]
    /// adds to it for an owner that takes a sandbox made before it.
    base_env: std::sync::RwLock<Vec<(String, String)>>,
    workdir: String,
    read_only: Vec<std::path::PathBuf>,
    bind_targets: Vec<String>,
    network: crate::config::Network,
    image_user: Option<u32>,
    /// The virtual screen, once it is up.
    pub(crate) display: std::sync::OnceLock<crate::config::Display>,
    /// The disk budget's watcher, when there is a budget.
    pub(crate) disk: std::sync::OnceLock<DiskWatch>,
    /// Set when the watcher stopped the sandbox.
    pub(crate) disk_stop: std::sync::OnceLock<DiskStop>,
    /// Its configuration's forwarded ports, which stop listening with it.
    pub(crate) forwards: std::sync::Mutex<Vec<Forward>>,
    /// Held, not used: they stop when the session's last handle goes.
    pub(crate) services: Services,
    /// The supervisor's clock is set from the host's (a microVM's): again
    /// after each resume, as a guest restored from disk wakes at the time
    /// it was saved.
    set_clock: bool,
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

    /// Sets the supervisor's clock from the host's, where the session
    /// does (a microVM's): its guest's own starts from its RTC, or from
    /// the moment it was saved.
    fn send_clock(&self) -> Result<()> {
        if !self.set_clock {
            return Ok(());
        }
        let Ok(now) = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH) else {
            return Ok(());
        };
        self.send(&HostMsg::SetClock {
            realtime_ns: now.as_nanos() as u64,
        })
    }

    /// The supervisor's `Ready`, taken up: ids from where it says, the
    /// services told it runs.
    fn take_ready(&self, info: ReadyInfo) -> Result<ReadyInfo> {
        // A reattached supervisor's orphans keep their ids.
        if info.next_id > 0 {
            self.next_id.store(info.next_id, Ordering::SeqCst);
        }
        self.services.ready()?;
        Ok(info)
    }

    /// Fails for a sandbox that takes no request yet: one taken up from
    /// another process and not resumed, whose ids are not known.
    pub(crate) fn check_adopted(&self) -> Result<()> {
        if self
            .reattaching
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_some()
        {
            return Err(Error::Config(
                "the sandbox is paused as another process left it: resume it first".into(),
            ));
        }
        Ok(())
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
        // Stop the writers first: every moment here is more bytes written.
        self.lifecycle.kill();
        // Its owner reports it (`disk_stopped`), as a job's failure or a
        // front end's exit: the log only records it.
        tracing::info!(
            "the sandbox's workspace grew by {growth} bytes, past its disk budget of {budget}; stopping it"
        );
        let routes = std::mem::take(&mut *self.routes());
        for (id, r) in routes {
            r.end_killed(id, r.started, false);
        }
        self.mark_gone();
    }

    /// The questions waiting for an answer.
    fn asked(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<u64, tokio::sync::oneshot::Sender<fs::Answer>>> {
        self.asked.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn watching(&self) -> std::sync::MutexGuard<'_, HashMap<u64, fs::WatchSlot>> {
        self.watching.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn mark_gone(&self) {
        self.gone.store(true, Ordering::SeqCst);
        // Every operation waiting fails as gone, every watch ends.
        self.asked().clear();
        self.watching().clear();
        // Every connection into it ends, and every dial waiting fails.
        self.services.relay().end();
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

impl Drop for Inner {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::SeqCst) {
            self.lifecycle.kill();
        }
    }
}

/// A host port forwarded into a sandbox by [`Sandbox::forward`]; it stops
/// listening when dropped.
#[derive(Debug)]
pub struct Forward {
    pub(crate) local: std::net::SocketAddr,
    pub(crate) port: u16,
    pub(crate) task: tokio::task::JoinHandle<()>,
}

/// A live sandbox. Cheap to clone; every clone refers to the same session,
/// which ends when [`Sandbox::close`] is called or the last clone is dropped.
#[derive(Clone)]
pub struct Sandbox {
    pub(crate) inner: Arc<Inner>,
}

impl Sandbox {
    /// Pauses the sandbox: every process in it stops where it is, its
    /// memory kept (a native sandbox's cgroup is frozen), until
    /// [`Sandbox::resume`]. Requests sent meanwhile wait for the resume.
    /// Pausing a paused sandbox does nothing.
    pub async fn pause(&self) -> Result<()> {
        self.set_paused(true).await
    }

    /// Resumes a paused sandbox: its processes go on from where they were.
    pub async fn resume(&self) -> Result<()> {
        self.set_paused(false).await
    }

    /// Whether it forks from its memory ([`crate::Sandbox::fork_from_memory`])
    /// and pauses to disk: a microVM on virtio-fs.
    pub fn saves_to_disk(&self) -> bool {
        self.inner.lifecycle.saves()
    }

    /// Whether it is paused.
    pub fn is_paused(&self) -> bool {
        self.inner.paused.load(Ordering::SeqCst)
    }

    async fn set_paused(&self, frozen: bool) -> Result<()> {
        let _changing = self.inner.pausing.lock().await;
        self.change_paused(frozen).await
    }

    /// [`Sandbox::set_paused`], its `pausing` lock held by the caller.
    async fn change_paused(&self, frozen: bool) -> Result<()> {
        if self.inner.gone.load(Ordering::SeqCst) || self.inner.closed.load(Ordering::SeqCst) {
            return Err(Error::Gone);
        }
        if self.is_paused() == frozen {
            return Ok(());
        }
        // Saved to disk only at a frame's edge both ways, so that another
        // process may go on with it (see `HostMsg::Hold`).
        let to_disk = frozen
            && self.inner.lifecycle.saves()
            && {
                match self.hold().await {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::warn!(error = %e, "the sandbox's supervisor did not hold; pausing it in memory");
                        false
                    }
                }
            };
        let inner = self.inner.clone();
        let frozen_now =
            tokio::task::spawn_blocking(move || inner.lifecycle.freeze(frozen, to_disk))
                .await
                .map_err(|e| Error::Io(std::io::Error::other(e)))
                .and_then(|r| r.map_err(Error::Io));
        if let Err(e) = frozen_now {
            if frozen {
                self.release();
            }
            return Err(e);
        }
        if !frozen {
            let reattaching = self
                .inner
                .reattaching
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .take();
            if let Some((ready, timeout)) = reattaching {
                let ready = await_ready(ready, timeout, || self.inner.gone_error()).await;
                if let Err(e) = ready.and_then(|info| self.inner.take_ready(info)) {
                    // Running, but not the sandbox it was: ended.
                    self.inner.closed.store(true, Ordering::SeqCst);
                    self.inner.lifecycle.kill();
                    self.inner.mark_gone();
                    return Err(e);
                }
            }
        }
        self.inner.paused.store(frozen, Ordering::SeqCst);
        if !frozen {
            self.release();
            self.inner.send_clock()?;
        }
        Ok(())
    }

    /// Leaves a sandbox paused to disk for another process to resume
    /// ([`crate::MicrovmBackend::reattach`]): this session ends, its
    /// sandbox's saved state, run files and writable root stay. Only a
    /// microVM with a state directory
    /// ([`crate::config::VmOptions::state_dir`]), paused to disk, can be
    /// kept; anything else is refused and goes on as it was.
    pub async fn keep(&self) -> Result<()> {
        let _changing = self.inner.pausing.lock().await;
        if self.inner.closed.load(Ordering::SeqCst) {
            return Err(Error::Gone);
        }
        if !self.is_paused() || !self.inner.lifecycle.keep() {
            return Err(Error::Config(
                "only a microVM with a state directory, paused to disk, can be kept for another \
                 process"
                    .into(),
            ));
        }
        // Nothing is killed or removed from now on; its ports stop
        // listening.
        self.inner.closed.store(true, Ordering::SeqCst);
        std::mem::take(
            &mut *self
                .inner
                .forwards
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        Ok(())
    }

    /// Saves this sandbox to disk and has its backend make each of
    /// `children` a copy of it to take up (see
    /// [`crate::Sandbox::fork_from_memory`]); it then goes on as it was.
    pub(crate) async fn fork_saved(&self, children: &[crate::config::SandboxConfig]) -> Result<()> {
        let _changing = self.inner.pausing.lock().await;
        if self.inner.gone.load(Ordering::SeqCst) || self.inner.closed.load(Ordering::SeqCst) {
            return Err(Error::Gone);
        }
        if self.is_paused() {
            return Err(Error::Config(
                "a paused sandbox does not fork: resume it first".into(),
            ));
        }
        if !self.inner.lifecycle.saves() {
            return Err(Error::Config(
                "only a microVM on virtio-fs forks from its memory".into(),
            ));
        }
        // Paused as any pause is (a guest that does not hold is paused
        // in memory, which the backend then refuses to copy).
        self.change_paused(true).await?;
        let inner = self.inner.clone();
        let kids = children.to_vec();
        let made = tokio::task::spawn_blocking(move || inner.lifecycle.fork_saved(&kids))
            .await
            .map_err(|e| Error::Io(std::io::Error::other(e)))
            .and_then(|r| r);
        // This one goes on whatever became of the copies.
        let resumed = self.change_paused(false).await;
        made.and(resumed)
    }

    /// Holds the channel (see `HostMsg::Hold`): once this returns, the
    /// supervisor has read every frame sent before and written its last,
    /// until [`Sandbox::release`].
    async fn hold(&self) -> Result<()> {
        let (held_tx, held) = oneshot::channel();
        *self.inner.held.lock().unwrap_or_else(|e| e.into_inner()) = Some(held_tx);
        let (release_tx, release) = oneshot::channel();
        *self.inner.release.lock().unwrap_or_else(|e| e.into_inner()) = Some(release_tx);
        self.inner
            .holds
            .send(HoldRequest { release })
            .map_err(|_| Error::Gone)?;
        match tokio::time::timeout(HOLD_TIMEOUT, held).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(_)) => {
                self.release();
                Err(self.inner.gone_error())
            }
            Err(_) => {
                self.release();
                Err(Error::Io(std::io::Error::other(format!(
                    "the supervisor did not answer a hold in {} s",
                    HOLD_TIMEOUT.as_secs()
                ))))
            }
        }
    }

    /// Ends a hold: the supervisor and the session's writer go on.
    fn release(&self) {
        let release = self
            .inner
            .release
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        if let Some(release) = release {
            let _ = self.inner.send(&HostMsg::Release);
            let _ = release.send(());
        }
    }

    /// Host paths in the workspace the sandbox sees read-only
    /// ([`crate::config::SandboxConfig::read_only`]): host-side writers refuse them
    /// too.
    pub fn read_only(&self) -> &[std::path::PathBuf] {
        &self.inner.read_only
    }

    /// Where commands run unless told otherwise
    /// ([`crate::config::SandboxConfig::workdir`]).
    pub fn workdir(&self) -> &str {
        &self.inner.workdir
    }

    /// Where the extra binds ([`crate::config::SandboxConfig::binds`]) are
    /// inside: what a tool may expect to find there.
    pub fn bind_targets(&self) -> &[String] {
        &self.inner.bind_targets
    }

    /// Sets `vars` in the environment every later exec starts from, as if
    /// the sandbox had been made with them ([`crate::config::SandboxConfig::env`]):
    /// for an owner that takes a sandbox made ahead of it (a warm pool's).
    /// What runs already keeps its environment. A name that is empty or
    /// holds `=` or NUL, or a value with NUL, is refused, and nothing set.
    pub fn set_env(&self, vars: &[(String, String)]) -> Result<()> {
        for (k, v) in vars {
            crate::config::check_env_var(k, v)?;
        }
        let mut env = self
            .inner
            .base_env
            .write()
            .unwrap_or_else(|e| e.into_inner());
        for (k, v) in vars {
            crate::config::put_env(&mut env, k, v);
        }
        Ok(())
    }

    /// The network the sandbox was made with: what its processes can reach.
    pub fn network_kind(&self) -> crate::config::Network {
        self.inner.network
    }

    /// The uid commands run as when the sandbox's root is an image's;
    /// `None` on the host's own (read-only) system.
    pub fn image_user(&self) -> Option<u32> {
        self.inner.image_user
    }

    /// The broker's policy, warnings and events, with
    /// [`crate::Network::Allow`].
    pub fn network(&self) -> Option<&crate::egress::NetworkInfo> {
        self.inner.services.network()
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
        let (backend, limits, setup_timeout) =
            (params.backend, params.limits.clone(), params.setup_timeout);
        let (inner, ready_rx) = Self::open(stream, params, false)?;
        let ready = await_ready(ready_rx, setup_timeout, || Error::Gone).await;
        match ready.and_then(|info| inner.take_ready(info)) {
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

    /// A sandbox another process left paused (see [`Sandbox::keep`]),
    /// taken up paused: `params.setup` (a `Reattach`) waits in the channel
    /// for its resume, which waits for the supervisor's answer. `info` is
    /// what it is known to say. Until then it takes no request.
    pub(crate) fn adopt(
        stream: UnixStream,
        params: ConnectParams,
        info: ReadyInfo,
    ) -> Result<Sandbox> {
        let (backend, limits, setup_timeout) =
            (params.backend, params.limits.clone(), params.setup_timeout);
        let (inner, ready_rx) = Self::open(stream, params, true)?;
        let _ = inner.info.set(SandboxInfo {
            backend,
            limits,
            landlock: info.landlock,
            seccomp_filters: info.seccomp_filters,
        });
        *inner.reattaching.lock().unwrap_or_else(|e| e.into_inner()) =
            Some((ready_rx, setup_timeout));
        Ok(Sandbox { inner })
    }

    /// Starts the session's reader and writer over `stream`, `params.setup`
    /// first; the receiver hears the supervisor's `Ready`.
    #[allow(clippy::type_complexity)]
    fn open(
        stream: UnixStream,
        params: ConnectParams,
        paused: bool,
    ) -> Result<(Arc<Inner>, oneshot::Receiver<Result<ReadyInfo>>)> {
        let ConnectParams {
            setup,
            lifecycle,
            limits: _,
            backend: _,
            base_env,
            workdir,
            read_only,
            bind_targets,
            network,
            image_user,
            setup_timeout: _,
            set_clock,
            services,
        } = params;
        let (mut rd, mut wr) = stream.into_split();
        let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
        let (holds, mut hold_rx) = mpsc::unbounded_channel::<HoldRequest>();
        services.relay().bind(tx.clone());
        let mut first = Vec::new();
        protocol::encode(&setup, &mut first);
        tx.send(first).map_err(|_| Error::Gone)?;
        tokio::spawn(async move {
            let mut hold_frame = Vec::new();
            protocol::encode(&HostMsg::Hold, &mut hold_frame);
            loop {
                tokio::select! {
                    biased;
                    Some(hold) = hold_rx.recv() => {
                        // What was queued before the hold goes before it;
                        // what comes after waits for the release.
                        while let Ok(buf) = rx.try_recv() {
                            if wr.write_all(&buf).await.is_err() {
                                return;
                            }
                        }
                        if wr.write_all(&hold_frame).await.is_err() {
                            return;
                        }
                        let _ = hold.release.await;
                    }
                    buf = rx.recv() => {
                        let Some(buf) = buf else { break };
                        if wr.write_all(&buf).await.is_err() {
                            break;
                        }
                    }
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
                                if let Some(inner) = weak.upgrade() {
                                    let _ = inner.send_clock();
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
                holds,
                held: Mutex::new(None),
                ended: Mutex::new(None),
                release: Mutex::new(None),
                routes: Mutex::new(HashMap::new()),
                asked: Mutex::new(HashMap::new()),
                watching: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                gone: AtomicBool::new(false),
                paused: AtomicBool::new(paused),
                pausing: tokio::sync::Mutex::new(()),
                reattaching: Mutex::new(None),
                lifecycle,
                closed: AtomicBool::new(false),
                info: std::sync::OnceLock::new(),
                display: std::sync::OnceLock::new(),
                disk: std::sync::OnceLock::new(),
                disk_stop: std::sync::OnceLock::new(),
                forwards: Default::default(),
                base_env: std::sync::RwLock::new(base_env),
                workdir,
                read_only,
                bind_targets,
                network,
                image_user,
                services,
                set_clock,
            }
        });
        Ok((inner, ready_rx))
    }

    /// The directory of an image sandbox's writable layer on the host (its
    /// overlay's `upper` and `work`, natively; a microVM's disk), beside
    /// the files cordon keeps there ([`crate::IMAGE_FILE`]).
    pub fn writable_layer_dir(&self) -> Option<std::path::PathBuf> {
        self.inner.lifecycle.writable_layer()
    }

    /// Closes a build step's sandbox (one made with a
    /// [`crate::RootImage::step`]): its processes are killed, then its
    /// outer supervisor writes the root's changes, which may take a while
    /// for a large layer; this waits for it (up to `grace`).
    pub async fn close_step(&self, grace: Duration) {
        if self.inner.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        // Its ports stop listening now, free for the next sandbox to take.
        std::mem::take(
            &mut *self
                .inner
                .forwards
                .lock()
                .unwrap_or_else(|p| p.into_inner()),
        );
        let _ = self.inner.send(&HostMsg::Shutdown);
        let inner = self.inner.clone();
        let _ = tokio::task::spawn_blocking(move || inner.lifecycle.reap(grace)).await;
    }

    /// Ends every process in the sandbox and returns once all have gone
    /// (a microVM's with what they wrote synced to the host's side of its
    /// shares): it runs nothing more, and what it holds on the host is
    /// released by [`Sandbox::close`], which then takes less. A caller
    /// with a result to report can report it in between: a job's end is
    /// recorded before its sandbox's namespaces and cgroups are torn down
    /// (~2 ms natively).
    ///
    /// The supervisor says when all have gone; one the sandbox's code
    /// took over can say so early, which only the sandbox's own files
    /// could show (for the moment until the close kills what is left).
    /// One that says nothing in time, a paused sandbox, or one whose
    /// supervisor is gone is closed instead.
    pub async fn end_processes(&self) {
        if self.inner.closed.load(Ordering::SeqCst)
            || self.inner.gone.load(Ordering::SeqCst)
            || self.is_paused()
        {
            return self.close().await;
        }
        let (tx, rx) = oneshot::channel();
        *self.inner.ended.lock().unwrap_or_else(|e| e.into_inner()) = Some(tx);
        if self.inner.send(&HostMsg::Shutdown).is_err() {
            return self.close().await;
        }
        // The supervisor waits a second for the killed processes, then as
        // long again to write its answer.
        if !matches!(tokio::time::timeout(END_TIMEOUT, rx).await, Ok(Ok(()))) {
            self.close().await;
        }
    }

    /// Ends the session: every process in it is killed and host resources
    /// are released. Other clones of this handle see [`Error::Gone`].
    pub async fn close(&self) {
        self.close_step(Duration::from_secs(2)).await;
    }
}

/// The supervisor's `Ready` (or why not) within `timeout`; `gone` if the
/// session's reader ended without a word.
async fn await_ready(
    ready: oneshot::Receiver<Result<ReadyInfo>>,
    timeout: Duration,
    gone: impl FnOnce() -> Error,
) -> Result<ReadyInfo> {
    match tokio::time::timeout(timeout, ready).await {
        Ok(Ok(r)) => r,
        Ok(Err(_)) => Err(gone()),
        Err(_) => Err(Error::SetupTimeout(timeout)),
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
        SupMsg::Held => {
            let held = inner.held.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(held) = held {
                let _ = held.send(());
            }
            return;
        }
        SupMsg::Ended => {
            // Nothing runs there any more: every exec ends, nothing starts.
            inner.mark_gone();
            let ended = inner.ended.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(ended) = ended {
                let _ = ended.send(());
            }
            return;
        }
        m @ (SupMsg::Watching { id, .. } | SupMsg::Changes { id, .. }) => {
            let mut watching = inner.watching();
            // A watch dropped meanwhile takes nothing.
            if let Some(slot) = watching.get_mut(&id)
                && !slot.take(m)
            {
                watching.remove(&id);
            }
            return;
        }
        SupMsg::Fs { id, result } => {
            // An answer to nothing asked is dropped.
            if let Some(waiter) = inner.asked().remove(&id) {
                let _ = waiter.send(fs::Answer::Fs(result));
            }
            return;
        }
        SupMsg::Usage { id, usage } => {
            if let Some(waiter) = inner.asked().remove(&id) {
                let _ = waiter.send(fs::Answer::Usage(usage));
            }
            return;
        }
        SupMsg::LayerFrozen { id, result } => {
            if let Some(waiter) = inner.asked().remove(&id) {
                let _ = waiter.send(fs::Answer::LayerFrozen(result));
            }
            return;
        }
        m @ (SupMsg::NetOpen { .. }
        | SupMsg::NetData { .. }
        | SupMsg::NetEof { .. }
        | SupMsg::NetAck { .. }
        | SupMsg::NetClose { .. }) => {
            // The relay takes only what it expects: a guest's connection
            // without egress, or an answer to no dial, is refused there.
            inner.services.relay().on_frame(m);
            return;
        }
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

/// A request for a fresh look at the disk budget; answered once a walk
/// that started after it has finished.
pub(crate) type LookRequest = oneshot::Sender<()>;

/// The session's handle on its disk budget's watcher (see the `disk` module).
pub(crate) struct DiskWatch {
    pub budget: u64,
    /// What the budget's roots have grown by, at the watcher's last look.
    pub used: std::sync::atomic::AtomicU64,
    pub looks: std::sync::Mutex<std::sync::mpsc::Sender<LookRequest>>,
}

impl DiskWatch {
    /// Waits for a look that starts after now. Returns at once if the
    /// watcher has ended (the sandbox stopped or closed).
    pub async fn look(&self) {
        if let Some(rx) = self.ask() {
            let _ = rx.await;
        }
    }

    /// Asks for a look that starts after now: the answer comes on the
    /// receiver (none if the watcher has ended). Held across awaits that
    /// may be cancelled, it is still the same look when awaited again.
    pub fn ask(&self) -> Option<oneshot::Receiver<()>> {
        let (tx, rx) = oneshot::channel();
        self.looks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .send(tx)
            .is_ok()
            .then_some(rx)
    }
}
