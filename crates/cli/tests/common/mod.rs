//! Shared harness for the escape battery: a per-test host directory, a
//! `cordon run` launcher that can drop to an unprivileged user or choose the
//! microvm backend, and assertions on what the sandboxed command printed.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::fs;
use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use tempfile::TempDir;

/// Generates `mod $name { #[test] fn root(); #[test] fn unprivileged();
/// #[test] fn microvm(); }` running the attack function `$name` in each
/// mode. `attack!($name, microvm_ignore = "HOLE: …")` marks only the
/// microvm variant ignored, for a reported hole of that backend;
/// `attack!($name, native)` makes only the root and unprivileged variants.
/// A test file uses it with `#[macro_use] mod common;`.
macro_rules! attack {
    ($name:ident) => {
        attack!(@mod $name, []);
    };
    ($name:ident, microvm_ignore = $why:literal) => {
        attack!(@mod $name, [ignore = $why]);
    };
    // For a defence that lives in the native backend alone (the guest's
    // kernel is its own): root and unprivileged only.
    ($name:ident, native) => {
        mod $name {
            attack!(@test root, Root, $name, []);
            attack!(@test unprivileged, Unprivileged, $name, []);
        }
    };
    // An attack the native backend does not hold yet (none today; CONTRIBUTING.md lists the battery):
    // its variants there are kept, ignored with the reason.
    ($name:ident, native_ignore = $why:literal) => {
        mod $name {
            attack!(@test root, Root, $name, [ignore = $why]);
            attack!(@test unprivileged, Unprivileged, $name, [ignore = $why]);
            attack!(@test microvm, Microvm, $name, []);
        }
    };
    // For a defence only a privileged watcher has on the native backend:
    // root and microvm.
    ($name:ident, privileged) => {
        mod $name {
            attack!(@test root, Root, $name, []);
            attack!(@test microvm, Microvm, $name, []);
        }
    };
    (@mod $name:ident, [$($vm_attr:meta)*]) => {
        mod $name {
            attack!(@test root, Root, $name, []);
            attack!(@test unprivileged, Unprivileged, $name, []);
            attack!(@test microvm, Microvm, $name, [$($vm_attr)*]);
        }
    };
    // The battery in an image: each attack's `in_image` variant, listed
    // once in a module of its own (see escape.rs).
    (@in_image $mode:ident: $($name:ident),* $(,)?) => {
        $(
            #[test]
            fn $name() {
                if let Some(t) = crate::common::Ctx::new(crate::common::Mode::$mode) {
                    super::$name(&t);
                }
            }
        )*
    };
    // One variant: the attack function `$name` in `Mode::$mode`.
    (@test $variant:ident, $mode:ident, $name:ident, [$($attr:meta)*]) => {
        #[test]
        $(#[$attr])*
        fn $variant() {
            if let Some(t) = crate::common::Ctx::new(crate::common::Mode::$mode) {
                super::$name(&t);
            }
        }
    };
}

/// The user unprivileged variants run as when the test process is root.
pub const NOBODY: u32 = 65534;

/// How long any single `cordon run` may take before the harness kills it
/// and fails the test (a hang is a finding too).
pub const RUN_DEADLINE: Duration = Duration::from_secs(60);
/// [`RUN_DEADLINE`] for the microvm backend (see [`Ctx::run`]).
pub const VM_RUN_DEADLINE: Duration = Duration::from_secs(150);

/// Extra time a microvm run may take: the guest boots (about 2 s under TCG,
/// several when the battery's VMs share two cores) and emulated programs
/// start slower.
pub const VM_SLACK: Duration = Duration::from_secs(20);

/// Which identity `cordon run` is started with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// As root: limits through cgroups, sandbox uid 0 is a host uid of its
    /// own (idmapped mounts make its files root's).
    Root,
    /// As uid/gid 65534 (or as the invoking user when that is not root).
    Unprivileged,
    /// As root, with the microvm backend (QEMU under TCG, chosen explicitly
    /// so that no warning joins stderr): commands run as the guest's root,
    /// with every capability, on the guest's own kernel.
    Microvm,
    /// As root, with the native backend and an image as the root (the
    /// seeds environment of deploy/environments/): commands run as root
    /// inside, with the capabilities a package manager needs in the
    /// sandbox's own user namespace, over a writable layer of their own.
    Image,
    /// [`Mode::Image`] with cordon started as uid/gid 65534, its ids
    /// inside from its range in `/etc/subuid` (scripts/test gives one).
    ImageUnprivileged,
    /// As root, with the microvm backend and the image of [`Mode::Image`]
    /// as the guest's root: the guest kernel's root, with every capability
    /// of its own kernel, over a writable disk of its own.
    ImageMicrovm,
}

/// The image the image modes run in, as `CORDON_IMAGE` names it, and the
/// store it is kept in (root's, or one of uid 65534's own): one for every
/// test process, kept between runs (unpacking it takes seconds), beside
/// the environments' cache.
fn escape_image(unprivileged: bool) -> Option<(String, PathBuf)> {
    let layout = cordon_testkit::environments::environment("seeds")?;
    let store = layout
        .parent()
        .expect("the cache has a parent")
        .join(if unprivileged {
            ".test-store-65534"
        } else {
            ".test-store"
        });
    let image = format!("oci:{}:latest", layout.display());
    // Unpacked once per process and store before any run, not by the
    // first run against its deadline.
    static PULLED: [std::sync::Once; 2] = [std::sync::Once::new(), std::sync::Once::new()];
    PULLED[usize::from(unprivileged)].call_once(|| {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_cordon"));
        // Kept until the pull is done: the last holder removes it.
        let bin = unprivileged.then(shared_binary);
        if let Some(bin) = &bin {
            fs::create_dir_all(&store).unwrap();
            std::os::unix::fs::chown(&store, Some(NOBODY), Some(NOBODY)).unwrap();
            cmd = Command::new(&bin.path);
            cmd.uid(NOBODY).gid(NOBODY);
        }
        let out = cmd
            .args(["image", "pull", &image])
            .env("CORDON_IMAGE_STORE", &store)
            .output()
            .expect("run cordon image pull");
        assert!(
            out.status.success(),
            "cordon image pull {image}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    });
    Some((image, store))
}

pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

/// A number unique to this test process and call, usable as a marker in
/// file names, interface names and `sleep` arguments.
pub fn unique() -> u64 {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    // 9xxxxxyyy: never a plausible real sleep duration or pid.
    900_000_000 + u64::from(std::process::id() % 100_000) * 1000 + n % 1000
}

/// A world-readable copy (or hard link) of the cordon binary, shared by the
/// tests that run at the same time and removed when the last one is done.
struct BinDir {
    _dir: TempDir,
    path: PathBuf,
}

fn shared_binary() -> Arc<BinDir> {
    static SHARED: Mutex<Weak<BinDir>> = Mutex::new(Weak::new());
    let mut slot = SHARED.lock().unwrap_or_else(|e| e.into_inner());
    if let Some(b) = slot.upgrade() {
        return b;
    }
    let src = Path::new(env!("CARGO_BIN_EXE_cordon"));
    let dir = tempfile::Builder::new()
        .prefix("cordon-escape-bin-")
        .tempdir()
        .expect("create a directory for the cordon binary");
    fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.path().join("cordon");
    let world_exec =
        |p: &Path| fs::metadata(p).is_ok_and(|m| m.permissions().mode() & 0o005 == 0o005);
    // A hard link is instant; it only works on the same filesystem and is
    // only usable if the original is already world-executable.
    if fs::hard_link(src, &path).is_err() || !world_exec(&path) {
        let _ = fs::remove_file(&path);
        fs::copy(src, &path).expect("copy the cordon binary");
        fs::set_permissions(&path, fs::Permissions::from_mode(0o755)).unwrap();
    }
    let b = Arc::new(BinDir { _dir: dir, path });
    *slot = Arc::downgrade(&b);
    b
}

/// One attack's world: a private host directory holding the workspace and,
/// next to it, host-only files the sandbox must never reach.
pub struct Ctx {
    pub mode: Mode,
    /// Whether the harness switches to uid 65534 for the run.
    switch_user: bool,
    /// The host directory of this test (0755), removed on drop.
    dir: TempDir,
    /// Mounted at /workspace.
    pub workspace: PathBuf,
    /// A host directory outside the workspace, never mounted.
    pub outside: PathBuf,
    /// The uid/gid processes have inside the sandbox.
    pub uid: u32,
    pub gid: u32,
    bin: Option<Arc<BinDir>>,
    /// Injected into the environment of every `cordon run` process.
    pub env_canary: String,
    /// In [`Mode::Image`]: `CORDON_IMAGE` and `CORDON_IMAGE_STORE`.
    image: Option<(String, PathBuf)>,
}

impl Ctx {
    /// Prepares a test in `mode`, or returns None (after a notice) when the
    /// root variant cannot run here. Under CI=true it fails instead.
    pub fn new(mode: Mode) -> Option<Ctx> {
        let root = euid() == 0;
        if !matches!(mode, Mode::Unprivileged | Mode::ImageUnprivileged) && !root {
            if in_ci() {
                panic!(
                    "this {mode:?} variant needs the tests to run as root (euid is {}); CI=true, so it fails rather than skips",
                    euid()
                );
            }
            eprintln!("notice: skipping the {mode:?} variant: the tests are not running as root");
            return None;
        }
        let switch_user = matches!(mode, Mode::Unprivileged | Mode::ImageUnprivileged) && root;
        let image = match mode {
            Mode::Image | Mode::ImageMicrovm => Some(escape_image(false)?),
            Mode::ImageUnprivileged => Some(escape_image(true)?),
            _ => None,
        };
        let dir = tempfile::Builder::new()
            .prefix("cordon-escape-")
            .tempdir()
            .expect("create the test directory");
        // Traversable by the unprivileged user; secrecy must come from the
        // sandbox, not from permissions.
        fs::set_permissions(dir.path(), fs::Permissions::from_mode(0o755)).unwrap();
        let workspace = dir.path().join("workspace");
        let outside = dir.path().join("outside");
        for d in [&workspace, &outside] {
            fs::create_dir(d).unwrap();
            fs::set_permissions(d, fs::Permissions::from_mode(0o755)).unwrap();
        }
        if switch_user {
            std::os::unix::fs::chown(&workspace, Some(NOBODY), Some(NOBODY)).unwrap();
        }
        let (uid, gid) = if switch_user && mode == Mode::Unprivileged {
            (NOBODY, NOBODY)
        } else if matches!(
            mode,
            Mode::Microvm | Mode::Image | Mode::ImageUnprivileged | Mode::ImageMicrovm
        ) {
            (0, 0)
        } else {
            (euid(), rustix::process::getegid().as_raw())
        };
        Some(Ctx {
            mode,
            switch_user,
            dir,
            workspace,
            outside,
            uid,
            gid,
            bin: switch_user.then(shared_binary),
            image,
            env_canary: format!("cordon-env-canary-{}", unique()),
        })
    }

    /// The native backend started by root (on the host's root or an
    /// image).
    pub fn root(&self) -> bool {
        matches!(self.mode, Mode::Root | Mode::Image)
    }

    /// The root is an image, with root inside.
    pub fn image(&self) -> bool {
        matches!(
            self.mode,
            Mode::Image | Mode::ImageUnprivileged | Mode::ImageMicrovm
        )
    }

    /// The sandbox's `/` is its own and its root may write it: a guest's
    /// initramfs, an image's writable layer.
    pub fn own_root(&self) -> bool {
        self.vm() || self.image()
    }

    /// In [`Mode::Image`]: the unpacked layers of the store.
    fn image_layers(&self) -> Vec<PathBuf> {
        let Some((_, store)) = &self.image else {
            return Vec::new();
        };
        fs::read_dir(store.join("layers"))
            .map(|d| {
                d.flatten()
                    .map(|e| e.path())
                    .filter(|p| p.is_dir())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// In [`Mode::Image`]: the image's own copy of `path` (absolute, as
    /// the sandbox sees it), from the layer that has it.
    pub fn image_file(&self, path: &str) -> Option<Vec<u8>> {
        let rel = path.trim_start_matches('/');
        self.image_layers()
            .iter()
            .find_map(|l| fs::read(l.join(rel)).ok())
    }

    /// In [`Mode::Image`]: what a run wrote to `paths` of its root stayed
    /// in its own writable layer: no layer of the store (shared by every
    /// sandbox) has them, and the next sandbox does not see them.
    #[track_caller]
    pub fn assert_gone_with_the_sandbox(&self, out: &Out, paths: &[&str]) {
        if !self.image() {
            return;
        }
        for layer in self.image_layers() {
            for p in paths {
                if fs::symlink_metadata(layer.join(p.trim_start_matches('/'))).is_ok() {
                    out.fail(format_args!(
                        "IMAGE CHANGED: {p} reached the shared layer {}",
                        layer.display()
                    ));
                }
            }
        }
        let next = self.sh(&format!("ls -d {} 2>&1; echo done", paths.join(" ")));
        next.code(0).line("done");
        for p in paths {
            next.stdout_has(&format!("'{p}': No such file or directory"));
        }
    }

    /// The microvm backend: the command runs as root inside a guest.
    pub fn vm(&self) -> bool {
        matches!(self.mode, Mode::Microvm | Mode::ImageMicrovm)
    }

    /// A time limit for a whole run, allowing for a microVM's boot.
    pub fn within(&self, native: Duration) -> Duration {
        if self.vm() { native + VM_SLACK } else { native }
    }

    /// The host directory holding workspace/ and outside/.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Picks the expectation for this native mode; microvm variants state
    /// their own.
    #[track_caller]
    pub fn pick<'a>(&self, root: &'a str, unprivileged: &'a str) -> &'a str {
        match self.mode {
            // In an image the command is root inside whoever started it.
            Mode::Root | Mode::Image | Mode::ImageUnprivileged => root,
            Mode::Unprivileged => unprivileged,
            Mode::Microvm | Mode::ImageMicrovm => {
                panic!("pick() has no microvm expectation; branch on t.vm()")
            }
        }
    }

    pub fn cordon_path(&self) -> &Path {
        match &self.bin {
            Some(b) => &b.path,
            None => Path::new(env!("CARGO_BIN_EXE_cordon")),
        }
    }

    /// Writes a host file outside the workspace, readable by everyone.
    pub fn host_file(&self, name: &str, content: &str) -> PathBuf {
        let p = self.outside.join(name);
        fs::write(&p, content).unwrap();
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        p
    }

    /// A `cordon` command with the right identity, cwd and environment.
    pub fn cordon<I, S>(&self, args: I) -> Command
    where
        I: IntoIterator<Item = S>,
        S: AsRef<OsStr>,
    {
        let mut cmd = Command::new(self.cordon_path());
        cmd.args(args)
            .current_dir(&self.workspace)
            .env("CORDON_CANARY", &self.env_canary)
            .env_remove("CORDON_SUPERVISOR")
            .env_remove("CORDON_DEBUG_SUPERVISOR")
            .env_remove("CORDON_LOG")
            .stdin(Stdio::null());
        if self.vm() {
            cmd.env("CORDON_BACKEND", "microvm")
                .env("CORDON_VM_ACCEL", "tcg");
        } else {
            cmd.env_remove("CORDON_BACKEND")
                .env_remove("CORDON_VM_ACCEL");
        }
        match &self.image {
            Some((image, store)) => {
                cmd.env("CORDON_IMAGE", image)
                    .env("CORDON_IMAGE_STORE", store);
            }
            None => {
                cmd.env_remove("CORDON_IMAGE");
            }
        }
        if self.switch_user {
            // std clears the supplementary groups (setgroups(0)) when it
            // changes uid without an explicit group list.
            cmd.uid(NOBODY).gid(NOBODY);
        }
        cmd
    }

    /// `cordon ARGS` with `env` added, failing the test past `deadline`.
    pub fn cordon_out(&self, args: &[&str], env: &[(&str, &str)], deadline: Duration) -> Out {
        let what = format!("[{:?}] cordon {}", self.mode, args.join(" "));
        let mut cmd = self.cordon(args);
        cmd.envs(env.iter().copied());
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        run_once(&mut cmd, what, deadline, &|_| String::new())
    }

    /// `cordon run OPTS -- ARGV`.
    pub fn run(&self, opts: &[&str], argv: &[&str]) -> Out {
        // A guest under TCG runs Python several times slower than the host:
        // writing the disk tests' 64 MiB of small files took 56 s of the
        // 60 with the three backends' runs sharing 2 cores, and failed
        // twice when a build shared them too.
        let deadline = if self.vm() {
            VM_RUN_DEADLINE
        } else {
            RUN_DEADLINE
        };
        self.run_deadline(opts, argv, deadline)
    }

    /// [`Ctx::run`], failing the test if the run takes longer than `deadline`.
    pub fn run_deadline(&self, opts: &[&str], argv: &[&str], deadline: Duration) -> Out {
        self.run_env(&[], opts, argv, deadline)
    }

    /// [`Ctx::run_deadline`] with `env` added to cordon's environment.
    pub fn run_env(
        &self,
        env: &[(&str, &str)],
        opts: &[&str],
        argv: &[&str],
        deadline: Duration,
    ) -> Out {
        let mut args: Vec<String> = vec!["run".into(), "--workspace".into()];
        args.push(self.workspace.to_str().unwrap().into());
        args.extend(opts.iter().map(|s| s.to_string()));
        args.push("--".into());
        args.extend(argv.iter().map(|s| s.to_string()));
        let what = format!("[{:?}] cordon {}", self.mode, args.join(" "));
        let mut cmd = self.cordon(&args);
        cmd.envs(env.iter().copied());
        cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
        let hazards = self.vm().then(|| workspace_hazards(&self.workspace));
        let out = run_once(&mut cmd, what, deadline, &|pid| self.after_hang(pid));
        if let Some(before) = hazards {
            self.assert_vm_left_nothing(&out, &before);
        }
        out
    }

    /// After a hung `cordon` (pid) was killed: whether its QEMU went with
    /// it, and its run directory removed (a killed cordon cannot).
    fn after_hang(&self, pid: u32) -> String {
        if !self.vm() {
            return String::new();
        }
        let mut notes = String::new();
        if !eventually(Duration::from_secs(5), || self.qemu_pids().is_empty()) {
            notes += &format!("; HOST CHANGED: QEMU survived it: {:?}", self.qemu_pids());
        }
        if let Ok(entries) = fs::read_dir(vm_cache_dir().join("run")) {
            for e in entries.flatten() {
                if e.file_name()
                    .to_string_lossy()
                    .starts_with(&format!("{pid}-"))
                {
                    let _ = fs::remove_dir_all(e.path());
                    notes += &format!("; removed its run directory {}", e.path().display());
                }
            }
        }
        notes
    }

    /// The host-side trace of this test's microVMs: QEMU processes sharing
    /// the workspace (`-fsdev local,…,path=<workspace>,…`).
    pub fn qemu_pids(&self) -> Vec<u32> {
        let ws = fs::canonicalize(&self.workspace).unwrap_or_else(|_| self.workspace.clone());
        // Over 9p QEMU's command line names the workspace; over virtio-fs
        // the workspace's server's does, and QEMU is its sibling.
        let mut pids = host_pids_with_cmdline_containing(&format!("path={},", ws.display()));
        for server in host_pids_with_cmdline_containing(&format!("--shared-dir={}", ws.display())) {
            let Some(parent) = fs::read_to_string(format!("/proc/{server}/stat"))
                .ok()
                .and_then(|st| {
                    st.rsplit_once(") ")?
                        .1
                        .split(' ')
                        .nth(1)?
                        .parse::<u32>()
                        .ok()
                })
            else {
                continue;
            };
            let Ok(tasks) = fs::read_dir(format!("/proc/{parent}/task")) else {
                continue;
            };
            for task in tasks.flatten() {
                let children = fs::read_to_string(task.path().join("children")).unwrap_or_default();
                for child in children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok())
                {
                    let comm =
                        fs::read_to_string(format!("/proc/{child}/comm")).unwrap_or_default();
                    if comm.starts_with("qemu-system") && !pids.contains(&child) {
                        pids.push(child);
                    }
                }
            }
        }
        pids
    }

    /// The largest regular file outside the workspace that this test's
    /// QEMU holds open for writing: where a guest could grow something on
    /// the host at will (a serial console log once was). In bytes the host
    /// gave it, not its apparent size; an image's writable layer, a disk
    /// as big as the budget by design (counted by the disk watcher), is
    /// not one, nor is a memfd (the guest's memory).
    pub fn vm_largest_written_file(&self) -> u64 {
        use std::os::unix::fs::MetadataExt;
        let ws = fs::canonicalize(&self.workspace).unwrap_or_else(|_| self.workspace.clone());
        let layers = self.image.as_ref().map(|(_, store)| store.join("run"));
        let mut largest = 0;
        for pid in self.qemu_pids() {
            let Ok(fds) = fs::read_dir(format!("/proc/{pid}/fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                let info = fs::read_to_string(format!(
                    "/proc/{pid}/fdinfo/{}",
                    fd.file_name().to_string_lossy()
                ))
                .unwrap_or_default();
                let flags = info
                    .lines()
                    .find_map(|l| l.strip_prefix("flags:"))
                    .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                    .unwrap_or(0);
                if flags & 0o3 == 0 {
                    continue; // read-only
                }
                let Ok(target) = fs::read_link(fd.path()) else {
                    continue;
                };
                // A memfd is memory, not a file on the host's disks: the
                // guest's own (its size fixed when the guest starts) is one.
                if target.to_string_lossy().starts_with("/memfd:") {
                    continue;
                }
                if target.starts_with(&ws) || layers.as_ref().is_some_and(|l| target.starts_with(l))
                {
                    continue;
                }
                if let Ok(m) = fs::metadata(fd.path())
                    && m.is_file()
                {
                    largest = largest.max(m.blocks() * 512);
                }
            }
        }
        largest
    }

    /// After a microvm session: its QEMU is gone, and the guest left no
    /// set-id file, device node or foreign owner in the host workspace
    /// (QEMU writes the guest's files with host root's identity).
    #[track_caller]
    pub fn assert_vm_left_nothing(&self, out: &Out, hazards_before: &[String]) {
        if !eventually(Duration::from_secs(5), || self.qemu_pids().is_empty()) {
            out.fail(format_args!(
                "HOST CHANGED: QEMU outlived the session: pids {:?}",
                self.qemu_pids()
            ));
        }
        // cordon keeps the guest's /etc and console log in a run directory
        // named after its pid, removed when the session ends.
        let runs = vm_cache_dir().join("run");
        let prefix = format!("{}-", out.pid);
        if let Ok(entries) = fs::read_dir(&runs) {
            for e in entries.flatten() {
                if e.file_name().to_string_lossy().starts_with(&prefix) {
                    out.fail(format_args!(
                        "HOST CHANGED: the session's run directory {} was left behind",
                        e.path().display()
                    ));
                }
            }
        }
        let new: Vec<String> = workspace_hazards(&self.workspace)
            .into_iter()
            .filter(|h| !hazards_before.contains(h))
            .collect();
        if !new.is_empty() {
            out.fail(format_args!(
                "HOST CHANGED: the guest left in the host workspace: {}",
                new.join(", ")
            ));
        }
    }

    /// A bash script in a fresh sandbox.
    pub fn sh(&self, script: &str) -> Out {
        self.sh_with(&[], script)
    }

    pub fn sh_with(&self, opts: &[&str], script: &str) -> Out {
        self.run(opts, &["bash", "-c", script])
    }

    /// A python3 script (after [`PY_PRELUDE`]) in a fresh sandbox.
    pub fn py(&self, code: &str) -> Out {
        self.py_with(&[], code)
    }

    pub fn py_with(&self, opts: &[&str], code: &str) -> Out {
        let full = format!("{PY_PRELUDE}\n{}", dedent(code));
        self.run(opts, &["python3", "-c", &full])
    }

    /// Runs a host command as the sandbox's owner (the unprivileged user in
    /// the unprivileged variant), outside any sandbox.
    pub fn host_as_owner(&self, argv: &[&str]) -> Out {
        let mut cmd = Command::new(argv[0]);
        cmd.args(&argv[1..])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        if self.switch_user {
            cmd.uid(NOBODY).gid(NOBODY);
        }
        run_once(&mut cmd, format!("host {argv:?}"), RUN_DEADLINE, &|_| {
            String::new()
        })
    }
}

/// cordon's microVM cache for root (`CORDON_VM_DIR` overrides it).
pub fn vm_cache_dir() -> PathBuf {
    std::env::var_os("CORDON_VM_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon/vm"))
}

/// Entries of a host workspace (itself included, links not followed) that
/// would hand a host user more than the workspace's owner has: set-id
/// bits, device nodes, an owner other than root or the workspace's.
pub fn workspace_hazards(ws: &Path) -> Vec<String> {
    use std::os::unix::fs::{FileTypeExt, MetadataExt};
    let owner = fs::symlink_metadata(ws).map(|m| m.uid()).unwrap_or(0);
    let mut found = Vec::new();
    let mut stack = vec![ws.to_path_buf()];
    while let Some(p) = stack.pop() {
        let Ok(m) = fs::symlink_metadata(&p) else {
            continue;
        };
        let t = m.file_type();
        if m.mode() & 0o6000 != 0
            || t.is_char_device()
            || t.is_block_device()
            || (m.uid() != 0 && m.uid() != owner)
        {
            found.push(format!(
                "{} (mode {:o}, uid {}, gid {})",
                p.display(),
                m.mode(),
                m.uid(),
                m.gid()
            ));
        }
        if t.is_dir()
            && let Ok(entries) = fs::read_dir(&p)
        {
            stack.extend(entries.flatten().map(|e| e.path()));
        }
    }
    found.sort();
    found
}

/// Removes the indentation common to all non-blank lines (and a leading
/// newline), so that Python can be written indented in raw strings.
pub fn dedent(s: &str) -> String {
    let s = s.strip_prefix('\n').unwrap_or(s);
    let indent = s
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| l.len() - l.trim_start().len())
        .min()
        .unwrap_or(0);
    let mut out = String::new();
    for l in s.lines() {
        out.push_str(l.get(indent..).unwrap_or(""));
        out.push('\n');
    }
    out
}

/// Python helpers every script gets: `sc(name, nr, *args)` makes a raw
/// syscall and prints `name: ERRNO` or `name: OK <ret>`; `attempt(name, f)`
/// does the same for a Python call; `report(name, errno, ok)` prints the
/// error unless `ok` (the success value) is given.
pub const PY_PRELUDE: &str = r#"
import ctypes, errno, os, socket, struct, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
def _arg(a):
    if isinstance(a, bytes): return ctypes.c_char_p(a)
    if isinstance(a, int): return ctypes.c_long(a)
    return a
def report(name, err, ok=None):
    print(f"{name}: " + (errno.errorcode.get(err, str(err)) if ok is None else f"OK {ok!r}"), flush=True)
def sc(name, nr, *args):
    ctypes.set_errno(0)
    r = libc.syscall(ctypes.c_long(nr), *[_arg(a) for a in args])
    e = ctypes.get_errno()
    if r == -1: report(name, e)
    else: report(name, 0, r)
    return r
def attempt(name, fn):
    try:
        r = fn()
    except OSError as e:
        report(name, e.errno if e.errno is not None else -1)
        return None
    print(f"{name}: OK {r!r}", flush=True)
    return r
"#;

/// What a run printed and how it ended.
pub struct Out {
    pub what: String,
    /// The host pid of the process that ran (cordon, for a sandbox).
    pub pid: u32,
    pub code: Option<i32>,
    pub stdout: String,
    pub stderr: String,
    pub elapsed: Duration,
}

/// Runs `cmd` to completion within `deadline`, collecting its output; a
/// run killed at the deadline fails the test, with what `after_hang` (given
/// the pid) has to add.
fn run_once(
    cmd: &mut Command,
    what: String,
    deadline: Duration,
    after_hang: &dyn Fn(u32) -> String,
) -> Out {
    let start = Instant::now();
    let mut child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start: {e}"));
    let pid = child.id();
    let reader = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            // Some tools quote with ‘…’ in UTF-8 locales, others with '…'.
            String::from_utf8_lossy(&buf).replace(['\u{2018}', '\u{2019}'], "'")
        })
    };
    let out_t = reader(
        child
            .stdout
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let err_t = reader(
        child
            .stderr
            .take()
            .map(|s| Box::new(s) as Box<dyn Read + Send>),
    );
    let status = wait_bounded(&mut child, deadline).unwrap_or_else(|| {
        panic!(
            "{what}: still running after {deadline:?}; killed{}",
            after_hang(pid)
        )
    });
    Out {
        what,
        pid,
        code: status.code(),
        stdout: out_t.join().unwrap(),
        stderr: err_t.join().unwrap(),
        elapsed: start.elapsed(),
    }
}

/// Waits for `child`, killing it after `limit`; None if it had to be killed.
pub fn wait_bounded(child: &mut Child, limit: Duration) -> Option<std::process::ExitStatus> {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(s) = child.try_wait().expect("wait for a child") {
            return Some(s);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

impl Out {
    fn dump(&self) -> String {
        format!(
            "{}\n  exit: {:?} after {:?}\n  --- stdout ---\n{}\n  --- stderr ---\n{}",
            self.what, self.code, self.elapsed, self.stdout, self.stderr
        )
    }

    #[track_caller]
    pub fn fail(&self, why: impl std::fmt::Display) -> ! {
        panic!("{why}\n{}", self.dump())
    }

    #[track_caller]
    pub fn code(&self, expected: i32) -> &Self {
        if self.code != Some(expected) {
            self.fail(format_args!("expected exit code {expected}"));
        }
        self
    }

    /// stdout contains this exact line.
    #[track_caller]
    pub fn line(&self, expected: &str) -> &Self {
        if !self.stdout.lines().any(|l| l == expected) {
            self.fail(format_args!("expected the stdout line {expected:?}"));
        }
        self
    }

    /// stdout contains one of these exact lines.
    #[track_caller]
    pub fn line_any(&self, expected: &[&str]) -> &Self {
        if !self.stdout.lines().any(|l| expected.contains(&l)) {
            self.fail(format_args!(
                "expected one of the stdout lines {expected:?}"
            ));
        }
        self
    }

    /// stdout has a line starting with `prefix` (for values that vary, such
    /// as descriptor numbers and key serials).
    #[track_caller]
    pub fn line_starts(&self, prefix: &str) -> &Self {
        if !self.stdout.lines().any(|l| l.starts_with(prefix)) {
            self.fail(format_args!("expected a stdout line starting {prefix:?}"));
        }
        self
    }

    /// Every stdout line is one of these.
    #[track_caller]
    pub fn only_lines(&self, allowed: &[&str]) -> &Self {
        if let Some(l) = self.stdout.lines().find(|l| !allowed.contains(l)) {
            self.fail(format_args!(
                "unexpected stdout line {l:?}; only {allowed:?} may appear"
            ));
        }
        self
    }

    #[track_caller]
    pub fn stdout_has(&self, s: &str) -> &Self {
        if !self.stdout.contains(s) {
            self.fail(format_args!("expected stdout to contain {s:?}"));
        }
        self
    }

    #[track_caller]
    pub fn stderr_has(&self, s: &str) -> &Self {
        if !self.stderr.contains(s) {
            self.fail(format_args!("expected stderr to contain {s:?}"));
        }
        self
    }

    /// Neither stream contains `s`.
    #[track_caller]
    pub fn lacks(&self, s: &str) -> &Self {
        if self.stdout.contains(s) || self.stderr.contains(s) {
            self.fail(format_args!("the output must not contain {s:?}"));
        }
        self
    }

    #[track_caller]
    pub fn faster_than(&self, limit: Duration) -> &Self {
        if self.elapsed >= limit {
            self.fail(format_args!("expected the run to end within {limit:?}"));
        }
        self
    }
}

/// A host process killed and reaped on drop.
pub struct HostProc(pub Child);

impl HostProc {
    pub fn sleep(marker: u64) -> HostProc {
        HostProc(
            Command::new("sleep")
                .arg(marker.to_string())
                .stdin(Stdio::null())
                .spawn()
                .expect("spawn a host sleep"),
        )
    }

    pub fn pid(&self) -> u32 {
        self.0.id()
    }

    pub fn alive(&mut self) -> bool {
        matches!(self.0.try_wait(), Ok(None))
    }
}

impl Drop for HostProc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Host pids whose argv is exactly `argv`.
pub fn host_pids_with_argv(argv: &[&str]) -> Vec<u32> {
    let mut want = Vec::new();
    for a in argv {
        want.extend_from_slice(a.as_bytes());
        want.push(0);
    }
    let mut found = Vec::new();
    if let Ok(entries) = fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if fs::read(e.path().join("cmdline")).is_ok_and(|c| c == want) {
                found.push(pid);
            }
        }
    }
    found
}

/// Host pids whose command line contains `needle`.
pub fn host_pids_with_cmdline_containing(needle: &str) -> Vec<u32> {
    let mut found = Vec::new();
    let me = std::process::id();
    if let Ok(entries) = fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
                continue;
            };
            if pid == me {
                continue;
            }
            if let Ok(c) = fs::read(e.path().join("cmdline"))
                && String::from_utf8_lossy(&c).contains(needle)
            {
                found.push(pid);
            }
        }
    }
    found
}

/// Polls `cond` until it holds or `limit` passes; returns whether it held.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Everything about a host file an attack might change.
#[derive(PartialEq, Eq)]
pub struct FileState {
    pub exists: bool,
    pub mode: u32,
    pub uid: u32,
    pub len: u64,
    pub mtime: (i64, i64),
    pub content: Option<Vec<u8>>,
}

impl std::fmt::Debug for FileState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if !self.exists {
            return write!(f, "(absent)");
        }
        write!(
            f,
            "mode {:o}, uid {}, {} bytes, mtime {}.{:09}",
            self.mode, self.uid, self.len, self.mtime.0, self.mtime.1
        )?;
        if let Some(c) = &self.content {
            write!(f, ", content {:?}", String::from_utf8_lossy(c))?;
        }
        Ok(())
    }
}

/// Snapshots a host path without following a final symlink; content is
/// read only for regular files up to 1 MiB.
pub fn file_state(p: &Path) -> FileState {
    use std::os::unix::fs::MetadataExt;
    match fs::symlink_metadata(p) {
        Ok(m) => FileState {
            exists: true,
            mode: m.mode(),
            uid: m.uid(),
            len: m.len(),
            mtime: (m.mtime(), m.mtime_nsec()),
            content: (m.is_file() && m.len() <= 1 << 20)
                .then(|| fs::read(p).ok())
                .flatten(),
        },
        Err(_) => FileState {
            exists: false,
            mode: 0,
            uid: 0,
            len: 0,
            mtime: (0, 0),
            content: None,
        },
    }
}

/// Asserts that host paths an attack targeted are exactly as before.
#[track_caller]
pub fn assert_unchanged(out: &Out, before: &[(PathBuf, FileState)]) {
    for (p, state) in before {
        let now = file_state(p);
        if &now != state {
            out.fail(format_args!(
                "HOST CHANGED: {} was {state:?}, is now {now:?}",
                p.display()
            ));
        }
    }
}

/// Snapshots several host paths for [`assert_unchanged`].
pub fn snapshot<P: AsRef<Path>>(paths: &[P]) -> Vec<(PathBuf, FileState)> {
    paths
        .iter()
        .map(|p| (p.as_ref().to_path_buf(), file_state(p.as_ref())))
        .collect()
}

/// Asserts that none of these host paths exists.
#[track_caller]
pub fn assert_absent<P: AsRef<Path>>(out: &Out, paths: &[P]) {
    for p in paths {
        let p = p.as_ref();
        if fs::symlink_metadata(p).is_ok() {
            out.fail(format_args!("HOST CHANGED: {} was created", p.display()));
        }
    }
}

/// Free bytes on the filesystem holding `p`.
pub fn free_bytes(p: &Path) -> u64 {
    let s = rustix::fs::statvfs(p).expect("statvfs");
    s.f_bavail * s.f_frsize
}
