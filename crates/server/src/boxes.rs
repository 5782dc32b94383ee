//! The sandbox API's sandboxes live in this process: each one's sandbox,
//! until when it may run, and the processes started in it through the API.
//!
//! A process's output is kept (the newest [`OUTPUT_KEPT`] bytes) and sent
//! live to whoever follows it, so a client may start a command in the
//! background and attach to it later, or again after losing its
//! connection: it gets what was kept, then what comes. What a process
//! writes is the sandbox's to shape; it is carried, never interpreted.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_sandbox::{ExecEvent, ExecStdin, Execution, Sandbox};
use tokio::sync::broadcast;

/// Bytes of a process's output kept for a client that attaches later.
pub const OUTPUT_KEPT: usize = 1 << 20;

/// Events a follower may fall behind by before it is cut off.
const FOLLOW_BACKLOG: usize = 1024;

/// Processes that ended, kept to be asked about; the oldest go first.
const ENDED_KEPT: usize = 64;

/// What a process did, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum ProcEvent {
    Stdout(Vec<u8>),
    Stderr(Vec<u8>),
    Exit(Ended),
}

/// How a process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    /// Its status, or cordon's (see [`cordon_sandbox::ExecResult::exit_code`]).
    pub exit_code: i32,
    /// How it ended as the kernel says: an exit code or a signal.
    pub status: cordon_sandbox::ExitStatus,
    pub timed_out: bool,
    pub oom_killed: bool,
    /// The sandbox ended under it, killing it with everything else.
    pub lost: bool,
}

impl Ended {
    pub fn lost() -> Ended {
        let status = cordon_sandbox::ExitStatus::Signal(9);
        Ended {
            exit_code: status.code(),
            status,
            timed_out: false,
            oom_killed: false,
            lost: true,
        }
    }
}

/// What a process was started as: shown, never run again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Started {
    /// The command line, or the program.
    pub cmd: String,
    /// The program's arguments, when `cmd` is one.
    pub args: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cwd: Option<String>,
    /// A name its starter gave it, to find it by.
    pub tag: Option<String>,
    /// On a terminal: its output is the terminal's.
    pub pty: bool,
}

/// An event and its place in the process's sequence, from 1.
pub type Numbered = (u64, ProcEvent);

#[derive(Default)]
struct Kept {
    events: VecDeque<Numbered>,
    /// The number of the last event.
    last: u64,
    bytes: usize,
    /// Output bytes dropped from the front to keep within the bound.
    dropped: u64,
    ended: Option<Ended>,
}

/// A process started through the API.
pub struct Process {
    /// Its pid inside the sandbox.
    pub pid: i32,
    pub started: Started,
    pub started_ms: i64,
    control: ExecStdin,
    kept: Mutex<Kept>,
    live: broadcast::Sender<Numbered>,
}

impl Process {
    /// Starts following `exec`, started as `started`.
    pub fn follow(started: Started, exec: Execution) -> Arc<Process> {
        let (live, _) = broadcast::channel(FOLLOW_BACKLOG);
        let p = Arc::new(Process {
            pid: exec.pid(),
            started,
            started_ms: crate::store::now_ms(),
            control: exec.stdin(),
            kept: Mutex::default(),
            live,
        });
        tokio::spawn(pump(p.clone(), exec));
        p
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Kept> {
        self.kept.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// How it ended, once it has.
    pub fn ended(&self) -> Option<Ended> {
        self.lock().ended
    }

    /// What was kept (and how many bytes before it were dropped), and a
    /// receiver of what comes after: nothing is missed or seen twice.
    pub fn attach(&self) -> (Vec<Numbered>, u64, broadcast::Receiver<Numbered>) {
        let kept = self.lock();
        let rx = self.live.subscribe();
        (kept.events.iter().cloned().collect(), kept.dropped, rx)
    }

    /// Its stdin, signals and terminal.
    pub fn control(&self) -> &ExecStdin {
        &self.control
    }

    fn record(&self, e: ProcEvent) {
        let mut kept = self.lock();
        kept.last += 1;
        let n = kept.last;
        match &e {
            ProcEvent::Stdout(d) | ProcEvent::Stderr(d) => {
                kept.bytes += d.len();
                kept.events.push_back((n, e.clone()));
                while kept.bytes > OUTPUT_KEPT {
                    match kept.events.pop_front() {
                        Some((_, ProcEvent::Stdout(d) | ProcEvent::Stderr(d))) => {
                            kept.bytes -= d.len();
                            kept.dropped += d.len() as u64;
                        }
                        Some((_, ProcEvent::Exit(_))) | None => break,
                    }
                }
            }
            ProcEvent::Exit(ended) => {
                kept.ended = Some(*ended);
                kept.events.push_back((n, e.clone()));
            }
        }
        // Under the lock, so that `attach` sees each event once.
        let _ = self.live.send((n, e));
    }
}

async fn pump(p: Arc<Process>, mut exec: Execution) {
    let ended = loop {
        match exec.next().await {
            Some(Ok(ExecEvent::Stdout(d))) => p.record(ProcEvent::Stdout(d)),
            Some(Ok(ExecEvent::Stderr(d))) => p.record(ProcEvent::Stderr(d)),
            Some(Ok(ExecEvent::Exit(r))) => {
                break Ended {
                    exit_code: r.exit_code(),
                    status: r.status,
                    timed_out: r.timed_out,
                    oom_killed: r.oom_killed,
                    lost: false,
                };
            }
            // The sandbox ended under it: killed with everything in it.
            Some(Err(_)) | None => break Ended::lost(),
        }
    };
    p.record(ProcEvent::Exit(ended));
}

/// What a sandbox of the API's was made as.
pub struct Made {
    pub id: String,
    pub tenant: String,
    /// The image it was made from, by the name the tenant gave (none: the
    /// host's root).
    pub image: Option<String>,
    /// Whom its commands run as, and where they start.
    pub account: cordon_image::root::Account,
    /// Its image's layers, top first (none: the host's root): where its
    /// other users are looked up.
    pub layers: Vec<std::path::PathBuf>,
    pub deadline: Instant,
    /// How long it runs at a time: from its start, and again from each
    /// resume after it paused at its end.
    pub timeout: Duration,
    /// What its timeout does.
    pub on_timeout: OnTimeout,
    /// Whether a request for it (envd, a port by name) resumes it when it
    /// is paused.
    pub auto_resume: bool,
    /// Whether its ports answer anyone under the sandbox domain.
    pub public: bool,
    /// The environment every command gets, values and all: its forks'.
    pub env: BTreeMap<String, String>,
    /// A fork's root, kept while it runs.
    pub fork_root: Option<Arc<crate::catalog::ForkRoot>>,
    /// For one taken up paused: what it had left of its time when paused.
    pub left: Option<Duration>,
}

/// What a sandbox's timeout does.
#[derive(
    Debug,
    Clone,
    Copy,
    Default,
    PartialEq,
    Eq,
    serde::Deserialize,
    serde::Serialize,
    utoipa::ToSchema,
)]
#[serde(rename_all = "snake_case")]
pub enum OnTimeout {
    #[default]
    End,
    Pause,
}

/// How often a sandbox's use of the machine is sampled, and how many
/// samples are kept (an hour's).
pub const SAMPLE_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
const SAMPLES_KEPT: usize = 720;

/// The machine's CPUs, which a sandbox's CPU share is of.
pub fn cpus() -> u32 {
    std::thread::available_parallelism().map_or(1, |n| n.get() as u32)
}

/// A sandbox's use of the machine at a moment.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Sample {
    pub at_ms: i64,
    pub usage: cordon_sandbox::Usage,
    /// Its share of the machine's CPUs since the sample before, 0 to 100.
    pub cpu_pct: f64,
}

/// A watch a client made to ask about later (E2B's `CreateWatcher`).
pub struct Watched {
    pub watcher: cordon_sandbox::Watcher,
    /// The watched directory, absolute.
    pub root: String,
    pub include_entry: bool,
}

/// A sandbox of the API's, live.
pub struct LiveBox {
    pub id: String,
    pub tenant: String,
    pub image: Option<String>,
    pub account: cordon_image::root::Account,
    pub layers: Vec<std::path::PathBuf>,
    /// What a client of its in-sandbox API (the E2B layer's) must show:
    /// 32 random bytes as hex, minted with it, never stored.
    pub access_token: String,
    /// Whether its ports answer anyone under the sandbox domain; else the
    /// tenant's token or this one's `traffic_token`.
    pub public: bool,
    pub traffic_token: String,
    /// Its ports as reached under the sandbox domain, by port.
    pub upstreams: Mutex<HashMap<u16, Arc<cordon_lab::Upstream>>>,
    pub sandbox: Sandbox,
    pub timeout: Duration,
    pub on_timeout: OnTimeout,
    pub auto_resume: bool,
    /// The environment it was made with (never stored): its forks get it.
    pub env: BTreeMap<String, String>,
    deadline: Mutex<Instant>,
    /// What was left of its time when it was paused.
    left: Mutex<Option<Duration>>,
    processes: Mutex<BTreeMap<i32, Arc<Process>>>,
    /// Watches kept for their clients, by id.
    pub watchers: tokio::sync::Mutex<HashMap<String, Watched>>,
    /// Its use of the machine, every [`SAMPLE_EVERY`], oldest first.
    samples: Mutex<VecDeque<Sample>>,
    /// Held while it lives: its broker's policy listed for the API, its
    /// place under the caps, its workspace's volume.
    pub(crate) _policy: Option<crate::network::Listed>,
    pub(crate) _slot: crate::caps::Slot,
    pub(crate) _in_use: cordon_sandbox::volume::InUse,
    pub(crate) _fork_root: Option<Arc<crate::catalog::ForkRoot>>,
}

impl LiveBox {
    pub fn new(
        made: Made,
        sandbox: Sandbox,
        policy: Option<crate::network::Listed>,
        slot: crate::caps::Slot,
        in_use: cordon_sandbox::volume::InUse,
    ) -> LiveBox {
        LiveBox {
            id: made.id,
            tenant: made.tenant,
            image: made.image,
            account: made.account,
            layers: made.layers,
            access_token: crate::store::random_hex(32),
            public: made.public,
            traffic_token: crate::store::random_hex(32),
            upstreams: Mutex::default(),
            sandbox,
            timeout: made.timeout,
            on_timeout: made.on_timeout,
            auto_resume: made.auto_resume,
            env: made.env,
            deadline: Mutex::new(made.deadline),
            left: Mutex::new(made.left),
            processes: Mutex::default(),
            watchers: Default::default(),
            samples: Default::default(),
            _policy: policy,
            _slot: slot,
            _in_use: in_use,
            _fork_root: made.fork_root,
        }
    }

    /// Starts sampling its use of the machine, until it is dropped.
    pub fn sample(self: &Arc<Self>) {
        let weak = Arc::downgrade(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(SAMPLE_EVERY);
            loop {
                tick.tick().await;
                let Some(b) = weak.upgrade() else { return };
                // A paused sandbox answers nothing until it is resumed.
                if b.sandbox.is_paused() {
                    continue;
                }
                let Ok(usage) = b.sandbox.usage().await else {
                    return;
                };
                b.record(crate::store::now_ms(), usage);
            }
        });
    }

    fn record(&self, at_ms: i64, usage: cordon_sandbox::Usage) {
        let mut samples = self.samples.lock().unwrap_or_else(|p| p.into_inner());
        let cpus = f64::from(cpus());
        let cpu_pct = samples.back().map_or(0.0, |last| {
            let wall_ns = ((at_ms - last.at_ms).max(1) as f64) * 1e6;
            let used = usage.cpu_ns.saturating_sub(last.usage.cpu_ns) as f64;
            (used / wall_ns / cpus * 100.0).clamp(0.0, 100.0)
        });
        samples.push_back(Sample {
            at_ms,
            usage,
            cpu_pct,
        });
        while samples.len() > SAMPLES_KEPT {
            samples.pop_front();
        }
    }

    /// The samples taken from `from_ms` to `to_ms`, oldest first.
    pub fn samples(&self, from_ms: i64, to_ms: i64) -> Vec<Sample> {
        self.samples
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter(|s| (from_ms..=to_ms).contains(&s.at_ms))
            .copied()
            .collect()
    }

    /// Pauses it: its time stands still, `left` to run once it is resumed
    /// (by default what it has left now). Pausing a paused one does
    /// nothing.
    pub async fn pause(&self, left: Option<Duration>) -> cordon_sandbox::Result<()> {
        if self.sandbox.is_paused() {
            return Ok(());
        }
        let left =
            left.unwrap_or_else(|| self.deadline().saturating_duration_since(Instant::now()));
        self.sandbox.pause().await?;
        *self.left.lock().unwrap_or_else(|p| p.into_inner()) = Some(left);
        Ok(())
    }

    /// What a paused one has left of its time (none: its whole timeout).
    pub fn left(&self) -> Option<Duration> {
        *self.left.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Resumes it, and answers the time it has to run again (what it had
    /// left when paused); its deadline is the caller's to set from it.
    pub async fn resume(&self) -> cordon_sandbox::Result<Duration> {
        self.sandbox.resume().await?;
        let left = self.left.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(left.unwrap_or(self.timeout))
    }

    pub fn deadline(&self) -> Instant {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn set_deadline(&self, at: Instant) {
        *self.deadline.lock().unwrap_or_else(|p| p.into_inner()) = at;
    }

    fn procs(&self) -> std::sync::MutexGuard<'_, BTreeMap<i32, Arc<Process>>> {
        self.processes.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Keeps `p`; the oldest ended processes go past [`ENDED_KEPT`].
    pub fn add(&self, p: Arc<Process>) {
        let mut procs = self.procs();
        let ended: Vec<i32> = procs
            .values()
            .filter(|p| p.ended().is_some())
            .map(|p| p.pid)
            .collect();
        for pid in ended
            .iter()
            .take(ended.len().saturating_sub(ENDED_KEPT - 1))
        {
            procs.remove(pid);
        }
        procs.insert(p.pid, p);
    }

    pub fn process(&self, pid: i32) -> Option<Arc<Process>> {
        self.procs().get(&pid).cloned()
    }

    pub fn processes(&self) -> Vec<Arc<Process>> {
        self.procs().values().cloned().collect()
    }
}

/// The live sandboxes of the API, by id.
#[derive(Default)]
pub struct Boxes {
    live: Mutex<HashMap<String, Arc<LiveBox>>>,
}

impl Boxes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<LiveBox>>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn insert(&self, b: Arc<LiveBox>) {
        self.lock().insert(b.id.clone(), b);
    }

    /// Sandbox `id`, whoever's: for a caller that proves its right to it
    /// otherwise (its access token).
    pub fn by_id(&self, id: &str) -> Option<Arc<LiveBox>> {
        self.lock().get(id).cloned()
    }

    /// Every one.
    pub fn all(&self) -> Vec<Arc<LiveBox>> {
        self.lock().values().cloned().collect()
    }

    /// `tenant`'s sandboxes.
    pub fn of(&self, tenant: &str) -> Vec<Arc<LiveBox>> {
        self.lock()
            .values()
            .filter(|b| b.tenant == tenant)
            .cloned()
            .collect()
    }

    /// `tenant`'s sandbox `id`; another's is as absent as a missing one.
    pub fn get(&self, tenant: &str, id: &str) -> Option<Arc<LiveBox>> {
        self.lock().get(id).filter(|b| b.tenant == tenant).cloned()
    }

    pub fn remove(&self, id: &str) -> Option<Arc<LiveBox>> {
        self.lock().remove(id)
    }

    /// Those whose deadline has passed (a paused one's clock stands
    /// still: its resume sets it again): taken out, those to end; left in,
    /// those to pause.
    pub fn take_expired(&self, now: Instant) -> (Vec<Arc<LiveBox>>, Vec<Arc<LiveBox>>) {
        let mut live = self.lock();
        let (pause, end): (Vec<_>, Vec<_>) = live
            .values()
            .filter(|b| b.deadline() <= now && !b.sandbox.is_paused())
            .cloned()
            .partition(|b| b.on_timeout == OnTimeout::Pause);
        for b in &end {
            live.remove(&b.id);
        }
        (end, pause)
    }

    /// Takes out every one (the server stops).
    pub fn take_all(&self) -> Vec<Arc<LiveBox>> {
        self.lock().drain().map(|(_, b)| b).collect()
    }
}
