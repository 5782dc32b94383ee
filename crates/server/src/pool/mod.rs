//! Warm pools: sandboxes made ahead, per shape, for jobs or sandboxes of
//! the API to take.
//!
//! Rules:
//! - A pooled sandbox has run nothing of anyone's (a microVM one command
//!   of cordon's own, [`warm`], that writes nothing). It is made over a fresh
//!   workspace under an id of its own kind (`<data>/jobs/<job id>`,
//!   `<data>/sandboxes/<sbx id>`); the owner that takes it takes that id,
//!   so nothing is moved and the workspace is the owner's from its first
//!   byte (files uploaded before a job runs land in the sandbox's
//!   `/workspace` as they would in any job's).
//! - An owner takes one only if the sandbox it would get is the same:
//!   equal [`Shape`] (kind, image, memory, disk, network, backend), no
//!   broker policy, no display. What an owner is given beyond its shape (a
//!   sandbox's `env`) is given as it is taken. An image's digest is
//!   compared again when the owner starts: a tag moved since the sandbox
//!   was made is not the owner's image.
//! - A job takes one when it is submitted and claims it when a worker runs
//!   it; one its job has not claimed within [`TAKEN_TTL`] is closed (the
//!   job then makes its own sandbox, as without a pool). A sandbox of the
//!   API takes one and starts at once ([`Pool::take_now`]). At most twice
//!   a shape's size exist at once, taken or not, so a queue of jobs cannot
//!   make the pool hold a sandbox per job.
//! - While pooled, an entry is listed in `<data>/pool/<id>`: what a killed
//!   server left of its pool is removed when the next one starts.
//! - Refilled once the owners that took sandboxes have ended their start
//!   (a job: ended), or [`REFILL_AFTER`] after they took them: never
//!   while a short job's command needs the CPU.
//! - With or without pools, a server whose workspaces are volumes keeps
//!   one workspace made ahead for a job and one for a sandbox of the
//!   sandbox API ([`spare`], [`Pool::workspace`]), under the same rules.

mod spare;

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_agent::Cancel;
use cordon_sandbox::volume::InUse;
use cordon_sandbox::{BackendKind, Sandbox};

use crate::catalog::Images;
use crate::config::{MAX_POOL, PoolSpec, SandboxDefaults};
use crate::job::{Bounds, ImageName, NetworkMode, RunOptions};
use crate::metrics::Metrics;
pub use spare::{Kind, Roots};

/// How long a taken sandbox waits for its job to be claimed.
pub const TAKEN_TTL: Duration = Duration::from_secs(60);
/// How often the pool looks at its entries when nothing wakes it.
const TICK: Duration = Duration::from_secs(1);
/// The first wait after a shape's sandbox failed to start, doubled each
/// time up to [`MAX_BACKOFF`]: a broken image must not make the server
/// retry in a loop.
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Sandboxes made at once: enough that a burst of jobs finds the pool
/// refilled, few enough that making them leaves the running jobs the CPU.
const MAKING_AT_ONCE: usize = 2;
/// How long a refill waits for the jobs that just took pooled sandboxes
/// to end: making one (a volume's file system, a sandbox) takes the CPU
/// their commands would have, the latency the pool is there to cut. A
/// longer job has its sandbox replaced while it runs.
const REFILL_AFTER: Duration = Duration::from_secs(1);

/// What makes two sandboxes interchangeable before either has run
/// anything: whose it is to be (a job's or a sandbox's of the API: ids and
/// directories are per kind, and nothing is moved), and how it is made.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Shape {
    pub kind: Kind,
    pub image: Option<ImageName>,
    pub memory: u64,
    pub disk: u64,
    pub network: NetworkMode,
    pub backend: BackendKind,
}

impl Shape {
    /// The shape of the sandbox an owner of `kind` with these options and
    /// display would get, if a pooled one can serve it: not with a broker
    /// policy (each owner's own) or a display.
    pub fn of(
        kind: Kind,
        options: &RunOptions,
        display: Option<cordon_sandbox::Display>,
        default_backend: BackendKind,
    ) -> Option<Shape> {
        if options.egress.is_some() || display.is_some() {
            return None;
        }
        Some(Shape {
            kind,
            image: options.image.clone(),
            memory: options.memory,
            disk: options.disk,
            network: options.network,
            backend: options.backend.unwrap_or(default_backend),
        })
    }

    /// The shape of an agent session's sandbox, if a pooled one can serve
    /// it: the server's default size and backend (a session asks for
    /// neither), its image and network, no broker policy, no display.
    pub fn session(
        image: Option<ImageName>,
        network: NetworkMode,
        policy: bool,
        display: Option<cordon_sandbox::Display>,
        defaults: &SandboxDefaults,
    ) -> Option<Shape> {
        if policy || display.is_some() {
            return None;
        }
        let limits = defaults.limits();
        Some(Shape {
            kind: Kind::Session,
            image,
            memory: limits.memory,
            disk: limits.disk?,
            network,
            backend: defaults.backend(),
        })
    }

    /// How the operator writes it in a pool (`image=…,memory=…,…`).
    fn describe(&self) -> String {
        let size = |bytes: u64| match bytes % (1 << 20) {
            0 => format!("{}M", bytes >> 20),
            _ => bytes.to_string(),
        };
        format!(
            "image={},memory={},disk={},network={},backend={}",
            self.image
                .as_ref()
                .map_or("(the host's root)", |i| i.as_str()),
            size(self.memory),
            size(self.disk),
            cordon_sandbox::Network::from(self.network),
            self.backend.as_str(),
        )
    }

    /// Options that make a sandbox of this shape.
    fn options(&self, bounds: &Bounds) -> RunOptions {
        RunOptions {
            timeout_secs: bounds.default_timeout_secs,
            memory: self.memory,
            disk: self.disk,
            network: self.network,
            egress: None,
            backend: Some(self.backend),
            repo: None,
            image: self.image.clone(),
        }
    }
}

/// Shapes no pool serves told of at most: each once, and not without end.
const MAX_UNSERVED: usize = 16;

/// How long a pooled microVM's warm-up may take (see [`warm`]).
const WARM_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs cordon's own `bash -c true` in a pooled microVM, once, before any
/// job owns it: a QEMU without KVM translates the guest's code the first
/// time it runs (the first command in a new guest ~140 ms, the next ~15 ms
/// here, BENCHMARKS.md §18), and the job's command takes the same path.
/// It writes nothing and leaves no process; the guest's page cache keeps
/// bash and its libraries, which KVM's guests gain from too. A root
/// without a shell warms nothing but is pooled all the same; a guest that
/// does not answer is not.
async fn warm(sandbox: &Sandbox) -> Result<(), String> {
    let warm_up = cordon_sandbox::ExecRequest::bash("true").timeout(WARM_TIMEOUT);
    match sandbox.exec(warm_up).await {
        // Ended either way: nothing of it is left to run.
        Ok(out) => {
            if !out.status.success() {
                tracing::debug!(
                    code = out.status.code(),
                    "a pooled microVM's warm-up failed"
                );
            }
            Ok(())
        }
        Err(e @ cordon_sandbox::Error::Exec { .. }) => {
            tracing::debug!("a pooled microVM's warm-up did not start: {e}");
            Ok(())
        }
        Err(e) => Err(format!("the pooled microVM's warm-up failed: {e}")),
    }
}

/// A sandbox made ahead, with the workspace it is over.
struct Entry {
    id: String,
    shape: Shape,
    sandbox: Sandbox,
    in_use: InUse,
    /// The image's manifest digest, if it has one.
    digest: Option<String>,
}

/// A pooled sandbox a job took: what its runner uses instead of making one.
pub struct Pooled {
    pub sandbox: Sandbox,
    pub in_use: InUse,
}

/// A pooled sandbox taken by an owner that starts at once (a sandbox of
/// the API), not yet its own: [`Pool::accept`] gives it, once the owner
/// found its image to be this one's, else [`Pool::refuse`] closes it.
pub struct Taken(Entry);

impl Taken {
    /// The id its owner is to have.
    pub fn id(&self) -> &str {
        &self.0.id
    }

    /// Its image's manifest digest, if it has one.
    pub fn digest(&self) -> Option<&str> {
        self.0.digest.as_deref()
    }
}

#[derive(Default)]
struct State {
    idle: Vec<Entry>,
    taken: Vec<(Entry, Instant)>,
    /// Shapes' sandboxes being made now.
    making: Vec<Shape>,
    /// When a shape may be tried again after a failure, and how long the
    /// next wait is.
    backoff: Vec<(Shape, Instant, Duration)>,
    /// Jobs that took a pooled sandbox less than [`REFILL_AFTER`] ago and
    /// have not ended, with when: no sandbox is made meanwhile.
    deferring: Vec<(String, Instant)>,
    /// The workspaces made ahead.
    spares: spare::Spares,
    /// Shapes no pool serves that [`Pool::unserved`] told of.
    unserved: Vec<Shape>,
}

impl State {
    /// Whether a refill waits now: an owner took something less than
    /// [`REFILL_AFTER`] ago and has not ended.
    fn deferred(&mut self, now: Instant) -> bool {
        self.deferring
            .retain(|(_, at)| now.duration_since(*at) < REFILL_AFTER);
        !self.deferring.is_empty()
    }

    fn count(&self, shape: &Shape) -> (usize, usize) {
        let idle = self.idle.iter().filter(|e| &e.shape == shape).count()
            + self.making.iter().filter(|s| *s == shape).count();
        let taken = self.taken.iter().filter(|(e, _)| &e.shape == shape).count();
        (idle, taken)
    }
}

/// What making a pool's sandboxes takes.
pub struct Parts {
    pub roots: Roots,
    pub data_dir: PathBuf,
    pub defaults: SandboxDefaults,
    pub bounds: Bounds,
    pub images: Arc<Images>,
    pub metrics: Arc<Metrics>,
}

/// The warm pools of this process.
pub struct Pool {
    pools: Vec<(Shape, usize)>,
    /// The disk budget of the workspaces kept made ahead, if they are.
    spare_disk: Option<u64>,
    parts: Parts,
    state: Mutex<State>,
    wake: tokio::sync::Notify,
}

impl Pool {
    /// No pool at all: every job makes its sandbox and its workspace (a
    /// deployment split in roles, whose workers make a job's workspace
    /// after its id is chosen).
    pub fn none(parts: Parts) -> Pool {
        Pool::of(Vec::new(), None, parts)
    }

    fn of(pools: Vec<(Shape, usize)>, spare_disk: Option<u64>, parts: Parts) -> Pool {
        Pool {
            pools,
            spare_disk,
            parts,
            state: Mutex::default(),
            wake: tokio::sync::Notify::new(),
        }
    }

    /// The pools `specs` ask for, their shapes checked against the
    /// server's bounds and defaults as a job's would be.
    pub fn new(specs: &[PoolSpec], parts: Parts) -> Result<Pool, String> {
        let mut pools: Vec<(Shape, usize)> = Vec::new();
        for spec in specs {
            let mut options = spec
                .limits
                .check(&parts.bounds)
                .map_err(|e| format!("pool `{}`: {e}", spec.size))?;
            if options.image.is_none() {
                options.image = parts.images.default_image();
            }
            if let Some(name) = &options.image {
                parts
                    .images
                    .pooled_source(name)
                    .map_err(|e| format!("pool of {name}: {e}"))?;
            }
            let shape = Shape::of(spec.owner, &options, None, parts.defaults.backend())
                .expect("a pool's options have no policy");
            if spec.owner == Kind::Session {
                let session = Shape::session(
                    shape.image.clone(),
                    shape.network,
                    false,
                    None,
                    &parts.defaults,
                );
                if session.as_ref() != Some(&shape) {
                    return Err(format!(
                        "pool `{}`: a session's sandbox has the server's default memory, disk \
                         and backend; a pool for sessions sets only its image and network",
                        spec.size
                    ));
                }
            }
            match pools.iter_mut().find(|(s, _)| *s == shape) {
                Some((_, n)) => *n = (*n + spec.size).min(MAX_POOL),
                None => pools.push((shape, spec.size)),
            }
        }
        // Only a volume takes long enough to make to be worth one ahead.
        let spare_disk = cordon_sandbox::volume::supported().then(|| parts.bounds.default_disk());
        Ok(Pool::of(pools, spare_disk, parts))
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn ledger(&self) -> PathBuf {
        self.parts.data_dir.join("pool")
    }

    /// Whether job `id`'s directory is a pooled sandbox's, not yet (or
    /// only just) a job's with a record.
    pub fn holds(&self, id: &str) -> bool {
        let state = self.state();
        state.idle.iter().any(|e| e.id == id)
            || state.taken.iter().any(|(e, _)| e.id == id)
            || state.spares.holds(id)
    }

    /// The id of a new owner of `kind` (a job that took no pooled
    /// sandbox, a sandbox of the API), and whether its workspace is made:
    /// the spare's if one of budget `disk` is ready, else a new id whose
    /// workspace the caller makes. Either way a spare is made (again) once
    /// the owner's start is done.
    pub fn workspace(&self, kind: Kind, disk: u64) -> (String, bool) {
        if self.spare_disk != Some(disk) {
            return (kind.new_id(), false);
        }
        let now = Instant::now();
        let mut state = self.state();
        let taken = state.spares.take(kind, now);
        let id = taken
            .as_ref()
            .map_or_else(|| kind.new_id(), |s| s.id.clone());
        // Its job's end (`ended`) or a second lets the refill start.
        state.deferring.push((id.clone(), now));
        let ready = state.spares.ready();
        drop(state);
        let Some(taken) = taken else {
            return (id, false);
        };
        self.parts.metrics.workspaces_ahead(ready);
        self.parts.metrics.workspace_ahead_taken();
        // Off the ledger: from here the directory is its owner's, who
        // enters it. Left off the runtime: leaving may unmount another.
        let _ = std::fs::remove_file(self.ledger().join(&id));
        tokio::task::spawn_blocking(move || drop(taken.in_use));
        (id, true)
    }

    /// Takes a ready sandbox for a job of `shape`, if one is: the id the
    /// job is to have, its workspace made and the sandbox over it, kept
    /// until the job claims it ([`Pool::claim`]) when it runs.
    pub fn take(&self, shape: &Shape) -> Option<String> {
        if self.pools.is_empty() {
            return None;
        }
        let mut state = self.state();
        let Some(at) = state.idle.iter().position(|e| &e.shape == shape) else {
            self.unserved(&mut state, shape);
            return None;
        };
        let entry = state.idle.swap_remove(at);
        let id = entry.id.clone();
        let now = Instant::now();
        state.taken.push((entry, now));
        // Refilled once the job has ended (see `ended`), not while it runs.
        state.deferring.push((id.clone(), now));
        self.parts.metrics.pool_ready(state.idle.len());
        drop(state);
        // Off the ledger: from here the directory is the job's.
        let _ = std::fs::remove_file(self.ledger().join(&id));
        self.parts.metrics.pool_taken();
        Some(id)
    }

    /// Tells the operator, once per shape, of an owner whose kind has
    /// pools but none of its shape: a pool that never serves is easy to
    /// keep unknowingly (E2B's sandboxes have a loopback, a pool's
    /// network is off unless it says).
    fn unserved(&self, state: &mut State, shape: &Shape) {
        if self.pools.iter().any(|(s, _)| s == shape)
            || !self.pools.iter().any(|(s, _)| s.kind == shape.kind)
            || state.unserved.len() >= MAX_UNSERVED
            || state.unserved.contains(shape)
        {
            return;
        }
        let kinds: Vec<String> = self
            .pools
            .iter()
            .filter(|(s, _)| s.kind == shape.kind)
            .map(|(s, _)| s.describe())
            .collect();
        tracing::info!(
            "a {} of {} took no pooled sandbox: the pools for {} are of {}",
            shape.kind.name(),
            shape.describe(),
            shape.kind.collection(),
            kinds.join("; ")
        );
        state.unserved.push(shape.clone());
    }

    /// Takes a ready sandbox of `shape` for an owner that starts now, if
    /// one is. The refill waits for the owner's `ended`.
    pub fn take_now(&self, shape: &Shape) -> Option<Taken> {
        let id = self.take(shape)?;
        self.untake(&id).map(Taken)
    }

    /// The sandbox of `taken`, its owner's from here.
    pub fn accept(&self, taken: Taken) -> Pooled {
        self.parts.metrics.pool_hit();
        let Entry {
            sandbox, in_use, ..
        } = taken.0;
        Pooled { sandbox, in_use }
    }

    /// Closes the sandbox of `taken`, which its owner does not run on (its
    /// image is not the owner's now), and removes its files: nothing
    /// else owns them.
    pub async fn refuse(&self, taken: Taken) {
        let entry = taken.0;
        let id = entry.id.clone();
        tracing::info!(owner = %id, "the pooled sandbox's image is not its owner's now; closed");
        let dir = entry.shape.kind.dir(&self.parts.roots, &id);
        close(entry, Some((self.ledger().join(&id), dir))).await;
        self.ended(&id);
    }

    /// Job `id` has ended (its runner calls this for every job), or
    /// sandbox `id` of the API has started: a refill that what it took
    /// held back may start.
    pub fn ended(&self, id: &str) {
        let mut state = self.state();
        let before = state.deferring.len();
        state.deferring.retain(|(d, _)| d != id);
        if state.deferring.len() != before {
            drop(state);
            self.wake.notify_one();
        }
    }

    /// Removes the sandbox taken for job `id` from those kept, if it is.
    fn untake(&self, id: &str) -> Option<Entry> {
        let entry = {
            let mut state = self.state();
            let at = state.taken.iter().position(|(e, _)| e.id == id)?;
            state.taken.swap_remove(at).0
        };
        self.wake.notify_one();
        Some(entry)
    }

    /// The sandbox taken for owner `id` (a job when it runs, a session
    /// when it first wakes), if it is still kept and is what the owner
    /// runs on: `digest` the manifest of the owner's image now.
    pub fn claim(&self, id: &str, digest: Option<&str>) -> Option<Pooled> {
        let entry = self.untake(id)?;
        if entry.digest.as_deref() != digest {
            tracing::info!(owner = %id, "the pooled sandbox's image is not its owner's now; making one");
            tokio::spawn(close(entry, None));
            return None;
        }
        self.parts.metrics.pool_hit();
        Some(Pooled {
            sandbox: entry.sandbox,
            in_use: entry.in_use,
        })
    }

    /// Closes the sandbox taken for owner `id` (a job cancelled before it
    /// ran, a session deleted before it woke, either never recorded),
    /// before its files can be removed.
    pub async fn forget(&self, id: &str) {
        if let Some(entry) = self.untake(id) {
            close(entry, None).await;
        }
        self.ended(id);
    }

    /// Keeps the pools full until `stopping`, then closes every sandbox
    /// still pooled or taken.
    pub async fn run(self: Arc<Self>, stopping: Cancel) {
        if self.pools.is_empty() && self.spare_disk.is_none() {
            return;
        }
        self.remove_leftovers().await;
        let mut making = tokio::task::JoinSet::new();
        while !stopping.is_cancelled() {
            self.expire();
            while making.len() < MAKING_AT_ONCE
                && let Some(shape) = self.wanted()
            {
                let this = self.clone();
                making.spawn(async move {
                    let made = this.make(&shape).await;
                    this.made(shape, made);
                });
            }
            while making.len() < MAKING_AT_ONCE
                && let Some((kind, disk)) = self.spare_wanted()
            {
                let this = self.clone();
                making.spawn(async move {
                    let (parts, ledger) = (&this.parts, this.ledger());
                    let made =
                        spare::make(kind, &parts.roots, &ledger, &parts.defaults, disk).await;
                    let mut state = this.state();
                    state.spares.made(kind, made);
                    parts.metrics.workspaces_ahead(state.spares.ready());
                });
            }
            tokio::select! {
                _ = stopping.cancelled() => {}
                _ = self.wake.notified() => {}
                Some(_) = making.join_next(), if !making.is_empty() => {}
                _ = tokio::time::sleep(self.next_look()) => {}
            }
        }
        // What is being made is closed with the rest.
        while making.join_next().await.is_some() {}
        let (idle, taken, spares) = {
            let mut state = self.state();
            (
                std::mem::take(&mut state.idle),
                std::mem::take(&mut state.taken),
                state.spares.drain(),
            )
        };
        let ledger = self.ledger();
        self.parts.metrics.workspaces_ahead(0);
        for (kind, spare) in spares {
            drop(spare.in_use);
            let dir = kind.dir(&self.parts.roots, &spare.id);
            spare::discard(dir, &ledger.join(&spare.id), "a spare workspace").await;
        }
        let closing = idle
            .into_iter()
            .map(|e| {
                let unlisted = (
                    ledger.join(&e.id),
                    e.shape.kind.dir(&self.parts.roots, &e.id),
                );
                close(e, Some(unlisted))
            })
            .chain(taken.into_iter().map(|(e, _)| close(e, None)));
        futures_util::future::join_all(closing).await;
        self.parts.metrics.pool_ready(0);
    }

    /// Records what making a sandbox of `shape` gave.
    fn made(&self, shape: Shape, made: Result<Entry, String>) {
        let mut state = self.state();
        if let Some(at) = state.making.iter().position(|s| *s == shape) {
            state.making.swap_remove(at);
        }
        match made {
            Ok(entry) => {
                state.backoff.retain(|(s, _, _)| *s != shape);
                state.idle.push(entry);
            }
            Err(e) => {
                let wait = state
                    .backoff
                    .iter()
                    .find(|(s, _, _)| *s == shape)
                    .map_or(FIRST_BACKOFF, |(_, _, w)| (*w * 2).min(MAX_BACKOFF));
                tracing::warn!("cannot make a pooled sandbox (trying again in {wait:?}): {e}");
                state.backoff.retain(|(s, _, _)| *s != shape);
                state.backoff.push((shape, Instant::now() + wait, wait));
            }
        }
        self.parts.metrics.pool_ready(state.idle.len());
    }

    /// How long the pool may sleep before it looks again: a tick, or less
    /// when a deferred refill falls due sooner.
    fn next_look(&self) -> Duration {
        let now = Instant::now();
        self.state()
            .deferring
            .iter()
            .map(|(_, at)| (*at + REFILL_AFTER).saturating_duration_since(now))
            .fold(TICK, Duration::min)
            .max(Duration::from_millis(1))
    }

    /// A shape short of sandboxes that may be made now, marked as being
    /// made; none while a job that took one may still be running its
    /// command (see [`REFILL_AFTER`]).
    fn wanted(&self) -> Option<Shape> {
        let mut state = self.state();
        let now = Instant::now();
        if state.deferred(now) {
            return None;
        }
        let shape = self
            .pools
            .iter()
            .find(|(shape, size)| {
                let (idle, taken) = state.count(shape);
                idle < *size
                    && idle + taken < 2 * size
                    && !state
                        .backoff
                        .iter()
                        .any(|(s, until, _)| s == shape && *until > now)
            })
            .map(|(s, _)| s.clone())?;
        state.making.push(shape.clone());
        Some(shape)
    }

    /// A kind whose workspace made ahead is wanted now, with its budget,
    /// marked as being made; none while an owner that just took one (or
    /// a pooled sandbox) may still be starting or running its command.
    fn spare_wanted(&self) -> Option<(Kind, u64)> {
        let disk = self.spare_disk?;
        let mut state = self.state();
        let now = Instant::now();
        if state.deferred(now) {
            return None;
        }
        Some((state.spares.due(now)?, disk))
    }

    /// Closes the taken sandboxes whose jobs did not claim them in time.
    fn expire(&self) {
        let mut state = self.state();
        let now = Instant::now();
        state.spares.expire(now);
        let (old, kept): (Vec<_>, Vec<_>) = std::mem::take(&mut state.taken)
            .into_iter()
            .partition(|(_, at)| now.duration_since(*at) > TAKEN_TTL);
        state.taken = kept;
        drop(state);
        for (entry, _) in old {
            tracing::info!(job = %entry.id, "its pooled sandbox waited too long for it; closed");
            tokio::spawn(close(entry, None));
        }
    }

    /// Makes one sandbox of `shape` over a new workspace of its kind.
    async fn make(&self, shape: &Shape) -> Result<Entry, String> {
        let (parts, ledger) = (&self.parts, self.ledger());
        let spare::Spare { id, in_use } = spare::make(
            shape.kind,
            &parts.roots,
            &ledger,
            &parts.defaults,
            shape.disk,
        )
        .await?;
        let dir = shape.kind.dir(&parts.roots, &id);
        let made = async {
            let (root, digest) = match &shape.image {
                None => (None, None),
                Some(name) => {
                    let ready = parts.images.ready_pooled(name).await?;
                    (Some(ready.root), Some(ready.image.manifest.to_string()))
                }
            };
            let mut config = parts.defaults.for_options(
                dir.join("workspace"),
                root,
                &shape.options(&parts.bounds),
            );
            // A sandbox of the API is saved there when paused to disk, as
            // one made for it would be.
            if shape.kind == Kind::Sandbox && shape.backend == BackendKind::Microvm {
                config.vm.state_dir = Some(dir.join(crate::config::SANDBOX_VM_STATE));
            }
            let created = Sandbox::create(config).await;
            parts
                .metrics
                .sandbox_started(shape.backend, created.is_ok());
            let sandbox = created.map_err(|e| format!("cannot create the sandbox: {e}"))?;
            let _ = sandbox.set_label(&id);
            if shape.backend == BackendKind::Microvm
                && let Err(e) = warm(&sandbox).await
            {
                sandbox.close().await;
                return Err(e);
            }
            Ok((sandbox, digest))
        }
        .await;
        match made {
            Ok((sandbox, digest)) => Ok(Entry {
                id,
                shape: shape.clone(),
                sandbox,
                in_use,
                digest,
            }),
            Err(e) => {
                drop(in_use);
                spare::discard(
                    dir,
                    &ledger.join(&id),
                    "a pooled sandbox that did not start",
                )
                .await;
                Err(e)
            }
        }
    }

    /// Removes what a server killed before it closed its pool left: each
    /// entry listed in the ledger, by id (anything else there is not a
    /// name to join to a path).
    async fn remove_leftovers(&self) {
        let ledger = self.ledger();
        let names = match std::fs::read_dir(&ledger) {
            Ok(rd) => rd
                .filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect::<Vec<_>>(),
            Err(_) => return,
        };
        for name in names {
            if let Some(kind) = Kind::of_id(&name).filter(|_| crate::http::plausible_id(&name)) {
                let dir = kind.dir(&self.parts.roots, &name);
                crate::files::remove_files(dir, "a pooled sandbox or spare left over").await;
            }
            let _ = std::fs::remove_file(ledger.join(&name));
        }
    }
}

/// Closes a pooled sandbox; given `unlisted` (its ledger entry and
/// directory, for one still pooled: nothing of a job's is in it), removes
/// its files too. A taken one's workspace is its job's, removed when the
/// job expires.
async fn close(entry: Entry, unlisted: Option<(PathBuf, PathBuf)>) {
    let Entry {
        sandbox, in_use, ..
    } = entry;
    sandbox.close().await;
    drop(in_use);
    if let Some((listed, dir)) = unlisted {
        spare::discard(dir, &listed, "a pooled sandbox").await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A shape is told as a pool of it is written, so that an operator
    /// can copy it into `--pool`.
    #[test]
    fn a_shape_is_told_as_a_pool_is_written() {
        let shape = Shape {
            kind: Kind::Sandbox,
            image: Some(ImageName::try_from("base".to_string()).unwrap()),
            memory: 512 << 20,
            disk: (1 << 30) + 1,
            network: NetworkMode::Loopback,
            backend: BackendKind::Native,
        };
        let told = shape.describe();
        assert_eq!(
            told,
            "image=base,memory=512M,disk=1073741825,network=loopback,backend=native"
        );
        let spec: PoolSpec = format!("1,for=sandboxes,{}", told.replace("disk=1073741825,", ""))
            .parse()
            .unwrap();
        assert_eq!(spec.limits.memory.map(|m| m.0), Some(512 << 20));
    }
}
