//! The `microvm` backend: one QEMU `microvm` machine per sandbox, with its
//! own kernel.
//!
//! The guest boots the distribution's kernel (fetched by `cordon vm setup`)
//! with a small initramfs whose init (guest/init.rs) loads the virtio
//! drivers, mounts the host's system directories read-only over 9p and
//! execs cordon's supervisor, which then speaks the same framed protocol as
//! the native one, over a virtio serial port, so every exec feature works
//! unchanged. The workspace is a read-write 9p share; the guest has no
//! network device.
//!
//! QEMU itself runs under Landlock (it reads its own files, the kernel and
//! the read-only shares, writes only the workspace and writable binds, no
//! TCP, no signals outside itself), a seccomp filter (no chown, no setuid
//! or setgid bits: its 9p server writes the guest's files with QEMU's
//! identity), QEMU's own `-sandbox` and no new privileges, and dies with
//! its parent. cordon treats what the guest's supervisor says as untrusted
//! (see session.rs): the guest's root can take over its pid 1.

pub mod image;

use std::io::Read;
use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::time::Duration;

mod cover;

use crate::backend::{Backend, left_by_dead_process, resolve_supervisor};
use crate::config::{Accel, BackendKind, MIB, Network, SandboxConfig, VmOptions, in_workspace};
use crate::error::{Error, Result};
use crate::layout::{CONTROL_FD, ETC_ALLOW, FONT_CACHE, SYSTEM_DIRS, bind_tag};
use crate::protocol::{self, Bind, HostMsg, SetupSpec};
use crate::services::Services;
use crate::session::{ConnectParams, ExecRequest, Lifecycle, Sandbox};

/// One QEMU microVM per sandbox, with its own kernel.
#[derive(Debug, Default, Clone, Copy)]
pub struct MicrovmBackend;

impl Backend for MicrovmBackend {
    fn name(&self) -> &'static str {
        "microvm"
    }

    fn create<'a>(
        &'a self,
        config: &'a SandboxConfig,
    ) -> Pin<Box<dyn std::future::Future<Output = Result<Sandbox>> + Send + 'a>> {
        Box::pin(create(config))
    }
}

/// The guest init, built by build.rs; empty when that build failed.
const GUEST_INIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cordon-guest-init"));

/// Drivers the guest needs: the virtio transport of the `microvm` machine,
/// the serial port of the control channel and the 9p file system.
const MODULES: &[&str] = &["virtio_mmio", "virtio_console", "9pnet_virtio", "9p"];

/// Least memory a guest boots with usefully: the kernel alone takes ~60 MiB.
const MIN_MEMORY: u64 = 128 * MIB;

/// A guest boots in about 1.5 s under TCG on an idle machine; allow for a
/// loaded one.
const MIN_SETUP_TIMEOUT: Duration = Duration::from_secs(60);

struct VmLifecycle {
    pid: i32,
    reaped: Mutex<bool>,
    /// The per-sandbox directory (the guest's /etc).
    run_dir: PathBuf,
}

impl VmLifecycle {
    fn wait(&self) {
        let mut reaped = self.reaped.lock().unwrap();
        if !*reaped {
            let mut status = 0;
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(self.pid, &mut status, 0) };
            *reaped = true;
        }
    }
}

impl Lifecycle for VmLifecycle {
    fn host_pid(&self) -> i32 {
        self.pid
    }

    fn oom_kills(&self) -> Option<u64> {
        None
    }

    fn kill(&self) {
        if !*self.reaped.lock().unwrap() {
            // SAFETY: signalling our own, not yet reaped, child.
            unsafe { libc::kill(self.pid, libc::SIGKILL) };
        }
    }

    fn reap(&self, grace: Duration) {
        // The guest powers off when its control channel closes; give it
        // that long, then stop it.
        let deadline = std::time::Instant::now() + grace;
        while std::time::Instant::now() < deadline {
            let mut status = 0;
            // SAFETY: polling our own child.
            let r = unsafe { libc::waitpid(self.pid, &mut status, libc::WNOHANG) };
            if r == self.pid {
                *self.reaped.lock().unwrap() = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        self.wait();
        let _ = std::fs::remove_dir_all(&self.run_dir);
    }
}

impl Drop for VmLifecycle {
    fn drop(&mut self) {
        if !*self.reaped.lock().unwrap() {
            self.kill();
            let pid = self.pid;
            let dir = self.run_dir.clone();
            // Off the async runtime: reaping blocks.
            std::thread::spawn(move || {
                let mut status = 0;
                // SAFETY: reaping our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                let _ = std::fs::remove_dir_all(dir);
            });
        } else {
            let _ = std::fs::remove_dir_all(&self.run_dir);
        }
    }
}

/// QEMU's binary: `vm.qemu`, else `qemu-system-x86_64` on `PATH`, with
/// an error that says how to install it.
pub fn qemu_path(config: &SandboxConfig) -> Result<PathBuf> {
    if let Some(q) = &config.vm.qemu {
        return Ok(q.clone());
    }
    let name = "qemu-system-x86_64";
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .ok_or_else(|| {
            Error::Config(format!(
                "the microvm backend needs {name} (Debian: apt-get install qemu-system-x86)"
            ))
        })
}

/// The host's TSC frequency in kHz, which a TCG guest runs its clock from:
/// calibrating it against emulated timers hangs now and then.
fn tsc_khz() -> Option<u64> {
    let info = std::fs::read_to_string("/proc/cpuinfo").ok()?;
    let flags = info.lines().find(|l| l.starts_with("flags"))?;
    if !flags.contains(" constant_tsc") {
        return None;
    }
    let mhz: f64 = info
        .lines()
        .find(|l| l.starts_with("cpu MHz"))?
        .split(':')
        .nth(1)?
        .trim()
        .parse()
        .ok()?;
    Some((mhz * 1000.0) as u64)
}

/// How long a KVM guest may take to answer before the probe gives up: a
/// booting guest answers in well under a second; a /dev/kvm that cannot
/// run guests (nested virtualisation) fails at once or hangs for ever.
const KVM_PROBE_TIMEOUT: Duration = Duration::from_secs(8);

/// The accelerator to use: the configured one, or KVM if this host's
/// /dev/kvm has been seen to run a guest. The device's presence proves
/// nothing, so the first sandbox after each host boot probes by booting one
/// (see [`probe_kvm`]) and the answer is cached until the next boot.
async fn accel(config: &SandboxConfig) -> Accel {
    if let Some(a) = config.vm.accel {
        return a;
    }
    static CHOSEN: tokio::sync::OnceCell<Accel> = tokio::sync::OnceCell::const_new();
    *CHOSEN
        .get_or_init(|| async {
            let (accel, why) = match cached_probe() {
                Some(a) => (
                    a,
                    "a KVM guest did not run when probed after this host booted; `cordon doctor` says why".to_string(),
                ),
                None if !Path::new("/dev/kvm").exists() => (Accel::Tcg, "no /dev/kvm".into()),
                None => {
                    let result = probe_kvm(config).await;
                    let accel = if result.is_ok() { Accel::Kvm } else { Accel::Tcg };
                    (accel, result.err().unwrap_or_default())
                }
            };
            if accel == Accel::Tcg {
                tracing::warn!(
                    "microvm: KVM cannot run guests here ({why}); using QEMU's TCG emulation, which is slow"
                );
            }
            accel
        })
        .await
}

/// Boots a throw-away guest with KVM; Ok with the time to its first exec,
/// or why it did not run. The answer is recorded for this host boot, where
/// choosing the accelerator finds it. `cordon doctor` shows it.
pub async fn probe_kvm(config: &SandboxConfig) -> std::result::Result<Duration, String> {
    let result = try_kvm(config).await;
    save_probe(if result.is_ok() {
        Accel::Kvm
    } else {
        Accel::Tcg
    });
    result
}

async fn try_kvm(config: &SandboxConfig) -> std::result::Result<Duration, String> {
    if !Path::new("/dev/kvm").exists() {
        return Err("no /dev/kvm".into());
    }
    let dir = image::cache_dir().join("probe");
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut c = SandboxConfig::new(&dir);
    c.backend = BackendKind::Microvm;
    c.supervisor = config.supervisor.clone();
    c.vm = VmOptions {
        accel: Some(Accel::Kvm),
        ..config.vm.clone()
    };
    c.memory = Some(MIN_MEMORY);
    let start = std::time::Instant::now();
    let attempt = async {
        // Boxed: creating a microVM may itself come here to probe. No
        // display and no disk budget: the backend alone makes the sandbox.
        let sb = Box::pin(create(&c)).await.map_err(|e| e.to_string())?;
        let out = sb
            .exec(ExecRequest::argv(["/bin/true"]))
            .await
            .map_err(|e| e.to_string());
        sb.close().await;
        match out {
            Ok(o) if o.status.success() => Ok(start.elapsed()),
            Ok(o) => Err(format!("the guest's /bin/true exited {:?}", o.status)),
            Err(e) => Err(e),
        }
    };
    match tokio::time::timeout(KVM_PROBE_TIMEOUT, attempt).await {
        Ok(Ok(t)) => Ok(t),
        Ok(Err(e)) => Err(format!(
            "a KVM guest failed: {}",
            e.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("")
        )),
        Err(_) => Err(format!(
            "a KVM guest did not answer within {} s",
            KVM_PROBE_TIMEOUT.as_secs()
        )),
    }
}

/// The probe's file: this boot's id and the accelerator found.
fn probe_file() -> PathBuf {
    image::cache_dir().join("accel")
}

fn boot_id() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .ok()
        .map(|s| s.trim().to_string())
}

fn cached_probe() -> Option<Accel> {
    let text = std::fs::read_to_string(probe_file()).ok()?;
    let (id, accel) = text.trim().split_once(' ')?;
    if Some(id) != boot_id().as_deref() {
        return None;
    }
    accel.parse().ok()
}

fn save_probe(accel: Accel) {
    let Some(id) = boot_id() else { return };
    let name = match accel {
        Accel::Kvm => "kvm",
        Accel::Tcg => "tcg",
    };
    let path = probe_file();
    let tmp = path.with_extension(format!("{}", std::process::id()));
    if std::fs::write(&tmp, format!("{id} {name}\n")).is_ok() {
        let _ = std::fs::rename(&tmp, &path);
    }
}

/// Copies the allowed entries of the host's /etc into `dest`: the guest's
/// /etc is this copy, shared read-only, never the host's directory, which
/// holds secrets (shadow files, private keys) that QEMU could read.
fn stage_etc(dest: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(dest)?;
    for name in ETC_ALLOW {
        let src = Path::new("/etc").join(name);
        if std::fs::symlink_metadata(&src).is_ok() {
            copy_tree(&src, &dest.join(name))?;
        }
    }
    // The sandbox's own identity, as the native backend has: root, and
    // nobody for programs that want an unprivileged user.
    std::fs::write(
        dest.join("passwd"),
        "root:x:0:0:root:/tmp:/bin/bash\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
    )?;
    std::fs::write(dest.join("group"), "root:x:0:\nnogroup:x:65534:\n")?;
    std::fs::write(
        dest.join("hosts"),
        "127.0.0.1\tlocalhost cordon\n::1\tlocalhost\n",
    )?;
    Ok(())
}

/// Copies files, directories and symlinks (as links) below `src`; skips
/// what cannot be read rather than failing the sandbox.
fn copy_tree(src: &Path, dest: &Path) -> std::io::Result<()> {
    let meta = std::fs::symlink_metadata(src)?;
    if meta.file_type().is_symlink() {
        let target = std::fs::read_link(src)?;
        std::os::unix::fs::symlink(target, dest)?;
    } else if meta.is_dir() {
        std::fs::create_dir_all(dest)?;
        for e in std::fs::read_dir(src)?.flatten() {
            let _ = copy_tree(&e.path(), &dest.join(e.file_name()));
        }
    } else if meta.is_file() {
        std::fs::copy(src, dest)?;
    }
    Ok(())
}

/// A copy of the supervisor binary in the cache, shared with the guest
/// read-only: sharing its directory would expose whatever lies beside it.
/// Hard-linked when the cache is on the same file system.
fn stage_supervisor(cache: &Path, supervisor: &Path) -> Result<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    let meta = std::fs::metadata(supervisor).map_err(|e| Error::Spawn {
        path: supervisor.to_path_buf(),
        source: e,
    })?;
    let key = format!(
        "{:x}-{:x}-{:x}-{:x}",
        meta.dev(),
        meta.ino(),
        meta.size(),
        meta.mtime()
    );
    let dir = cache.join("bin").join(key);
    let name = supervisor
        .file_name()
        .ok_or_else(|| Error::Config(format!("supervisor {}", supervisor.display())))?;
    let staged = dir.join(name);
    if !staged.is_file() {
        std::fs::create_dir_all(&dir)?;
        // A name of its own per attempt: sandboxes start concurrently.
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let tmp = dir.join(format!(
            ".{}.{}-{n}",
            name.to_string_lossy(),
            std::process::id()
        ));
        if std::fs::hard_link(supervisor, &tmp).is_err() {
            std::fs::copy(supervisor, &tmp)?;
        }
        std::fs::rename(&tmp, &staged)?;
    }
    Ok(dir)
}

/// Host top-level system entries: merged-/usr symlinks go into the
/// initramfs, real directories become read-only shares.
fn system_layout() -> (Vec<(String, String)>, Vec<String>) {
    let mut links = Vec::new();
    let mut shares = Vec::new();
    for name in SYSTEM_DIRS {
        let path = Path::new("/").join(name);
        match std::fs::symlink_metadata(&path) {
            Ok(m) if m.file_type().is_symlink() => {
                if let Ok(t) = std::fs::read_link(&path) {
                    links.push((name.to_string(), t.to_string_lossy().into_owned()));
                }
            }
            Ok(m) if m.is_dir() => shares.push(name.to_string()),
            _ => {}
        }
    }
    (links, shares)
}

/// A run directory not yet handed to a [`VmLifecycle`]: removed on drop.
struct RunDir(Option<PathBuf>);

impl RunDir {
    fn keep(mut self) -> PathBuf {
        self.0.take().expect("kept once")
    }
}

impl Drop for RunDir {
    fn drop(&mut self) {
        if let Some(dir) = self.0.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// A new per-sandbox directory, `<cache>/run/<pid>-<n>`. The first call
/// in a process also removes those of cordon processes that died without
/// removing their own (SIGKILL leaves them).
fn run_dir(cache: &Path) -> Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    let runs = cache.join("run");
    SWEPT.call_once(|| sweep_run_dirs(&runs));
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let dir = runs.join(format!("{}-{n}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// Removes the run directories of processes that no longer exist (see
/// [`left_by_dead_process`]).
fn sweep_run_dirs(runs: &Path) {
    let Ok(entries) = std::fs::read_dir(runs) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        if name.to_str().is_some_and(left_by_dead_process) {
            tracing::debug!(
                "removing {}, left by a cordon that died",
                e.path().display()
            );
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// How much of the guest's console and QEMU's stderr is kept.
const TAIL_BYTES: usize = 16 << 10;

/// The last bytes of a stream QEMU writes (the guest's serial console, its
/// own stderr), for error messages. The stream is read to its end and the
/// rest dropped: the guest writes to its console at will, and must not be
/// able to fill a host disk or memory with it.
#[derive(Default)]
struct Tail(Mutex<std::collections::VecDeque<u8>>);

impl Tail {
    /// Reads `from` on a thread of its own until end of file (QEMU exits).
    fn drain(from: OwnedFd, name: &str) -> Result<Arc<Tail>> {
        let tail = Arc::new(Tail::default());
        let keep = tail.clone();
        let mut from = std::fs::File::from(from);
        std::thread::Builder::new()
            .name(format!("cordon-vm-{name}"))
            .spawn(move || {
                let mut buf = vec![0u8; 8192];
                loop {
                    match from.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => keep.push(&buf[..n]),
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            })?;
        Ok(tail)
    }

    fn push(&self, data: &[u8]) {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let data = &data[data.len().saturating_sub(TAIL_BYTES)..];
        let excess = (q.len() + data.len()).saturating_sub(TAIL_BYTES);
        q.drain(..excess);
        q.extend(data);
    }

    fn text(&self) -> String {
        let q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b) = q.as_slices();
        String::from_utf8_lossy(&[a, b].concat()).into_owned()
    }

    /// What explains a guest's death, in non-blank lines: a kernel panic's
    /// line and the lines that led to it (not the register dump and
    /// backtrace that follow it), else the last `lines` lines.
    fn explain(&self, lines: usize) -> String {
        let text = self.text();
        let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        match all.iter().rposition(|l| l.contains("Kernel panic")) {
            Some(p) => all[p.saturating_sub(lines / 2)..=p].join("\n"),
            None => all[all.len().saturating_sub(lines)..].join("\n"),
        }
    }
}

async fn create(config: &SandboxConfig) -> Result<Sandbox> {
    let (workspace, mut binds) = config.validate()?;
    // The font cache, as the native backend binds it (see setup.rs).
    let fonts = FONT_CACHE;
    if Path::new(fonts).is_dir() && !binds.iter().any(|b| b.target == fonts) {
        binds.push(Bind {
            source: fonts.into(),
            target: fonts.into(),
            writable: false,
        });
    }
    if GUEST_INIT.is_empty() {
        return Err(Error::Config(
            "this build of cordon has no microVM guest init (it needs a static C library at build time: Debian libc6-dev)".into(),
        ));
    }
    let memory = config.memory.unwrap_or(512 * MIB);
    if memory < MIN_MEMORY {
        return Err(Error::Config(format!(
            "a microVM needs at least {} MiB of memory, not {} MiB",
            MIN_MEMORY / MIB,
            memory / MIB
        )));
    }
    let cpus = config.cpus.unwrap_or(1);
    if !(1..=64).contains(&cpus) {
        return Err(Error::Config(format!("cpus must be 1 to 64, not {cpus}")));
    }
    let qemu = qemu_path(config)?;
    let cache = image::cache_dir();
    let kernel = image::find_kernel(
        &cache,
        config.vm.kernel.as_deref(),
        config.vm.modules.as_deref(),
    )
    .map_err(|e| Error::Config(e.to_string()))?;
    let (symlinks, system_shares) = system_layout();
    let initrd = image::initramfs(
        &cache,
        &kernel,
        &image::InitramfsSpec {
            init: GUEST_INIT,
            modules: MODULES,
            symlinks: &symlinks,
        },
    )
    .map_err(|e| Error::Config(e.to_string()))?;
    let supervisor = resolve_supervisor(config)?;
    let bin_dir = stage_supervisor(&cache, &supervisor)?;
    let bin_name = supervisor
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let run = run_dir(&cache)?;
    // Until QEMU runs and its lifecycle owns the directory, any failure
    // removes it.
    let run_guard = RunDir(Some(run.clone()));
    stage_etc(&run.join("etc"))?;
    let covers = cover::Covers::prepare(
        &workspace,
        &in_workspace(&config.hidden, &workspace),
        &in_workspace(&config.read_only, &workspace),
        &run,
    )?;

    // Before the command line: a service's channel is a device on it.
    let services = Services::start(config)?;
    let accel = accel(config).await;
    let mut append = vec![
        "console=ttyS0".to_string(),
        "panic=-1".into(),
        "quiet".into(),
        "cryptomgr.notests".into(),
        format!("cordon.ro={}", system_shares.join(",")),
        format!("cordon.bin={bin_name}"),
    ];
    if accel == Accel::Tcg
        && let Some(khz) = tsc_khz()
    {
        append.push(format!("tsc_early_khz={khz}"));
        append.push("tsc=reliable".into());
    }
    let mut shares: Vec<(String, String, bool)> = system_shares
        .iter()
        .map(|s| (s.clone(), format!("/{s}"), false))
        .collect();
    shares.push((
        "etc".into(),
        run.join("etc").to_string_lossy().into_owned(),
        false,
    ));
    shares.push((
        "cordon".into(),
        bin_dir.to_string_lossy().into_owned(),
        false,
    ));
    shares.push(("workspace".into(), workspace.clone(), true));
    for (i, b) in binds.iter().enumerate() {
        shares.push((bind_tag(i), b.source.clone(), b.writable));
    }

    let mut args: Vec<String> = vec![
        "-M".into(),
        "microvm,x-option-roms=off,isa-serial=on,pic=off,pit=off".into(),
        "-accel".into(),
        match accel {
            Accel::Kvm => "kvm".into(),
            Accel::Tcg => "tcg".into(),
        },
        "-cpu".into(),
        if accel == Accel::Kvm { "host" } else { "max" }.into(),
        "-m".into(),
        format!("{}M", memory / MIB),
        "-smp".into(),
        cpus.to_string(),
        "-nodefaults".into(),
        "-no-user-config".into(),
        "-nographic".into(),
        "-no-reboot".into(),
        // QEMU's own seccomp policy on top of ours.
        "-sandbox".into(),
        "on,obsolete=deny,elevateprivileges=deny,spawn=deny,resourcecontrol=deny".into(),
        "-kernel".into(),
        kernel.vmlinux.to_string_lossy().into_owned(),
        "-initrd".into(),
        initrd.to_string_lossy().into_owned(),
        "-append".into(),
        append.join(" "),
        "-chardev".into(),
        format!("socket,id=console,fd={CONSOLE_FD}"),
        "-serial".into(),
        "chardev:console".into(),
        "-device".into(),
        "virtio-serial-device".into(),
        "-chardev".into(),
        format!("socket,id=cordon,fd={}", CONTROL_FD),
        "-device".into(),
        "virtserialport,chardev=cordon,name=cordon".into(),
    ];
    for (tag, path, writable) in &shares {
        if path.contains(',') {
            return Err(Error::Config(format!(
                "the microvm backend cannot share {path}: a comma in the path"
            )));
        }
        args.push("-fsdev".into());
        args.push(format!(
            "local,id={tag},path={path},security_model=none{}{}",
            if *writable { "" } else { ",readonly=on" },
            // A cover is a file of another file system: keep the guest's
            // inode numbers apart.
            if covers.is_some() && tag == "workspace" {
                ",multidevs=remap"
            } else {
                ""
            }
        ));
        args.push("-device".into());
        args.push(format!("virtio-9p-device,fsdev={tag},mount_tag={tag}"));
    }

    // What QEMU may touch on the host: its own files, the kernel, and the
    // shares, read-only but for the workspace and writable binds.
    let mut read: Vec<PathBuf> = ["/usr", "/bin", "/sbin", "/lib", "/lib64"]
        .iter()
        .chain(QEMU_HOST_FILES)
        .map(PathBuf::from)
        .collect();
    read.extend([qemu.clone(), kernel.vmlinux.clone(), initrd.clone()]);
    // /dev/null: harmless, and what a library falls back on.
    let mut write: Vec<PathBuf> = vec!["/dev/null".into()];
    for (_, path, writable) in &shares {
        if *writable { &mut write } else { &mut read }.push(PathBuf::from(path));
    }
    if accel == Accel::Kvm {
        write.push("/dev/kvm".into());
    }
    let ruleset = crate::supervisor::confine::vmm_ruleset(&read, &write)?;

    let (host, guest_end) = std::os::unix::net::UnixStream::pair()?;
    let (console_host, console_guest) = std::os::unix::net::UnixStream::pair()?;
    let (pid, qemu_stderr) = launch(move || {
        spawn_qemu(
            &qemu,
            &args,
            guest_end.into(),
            console_guest.into(),
            ruleset,
            covers,
        )
    })?;
    let lifecycle = VmLifecycle {
        pid,
        reaped: Mutex::new(false),
        run_dir: run_guard.keep(),
    };
    let spec = SetupSpec {
        version: protocol::VERSION,
        // QEMU's own mount namespace hides them and makes these read-only
        // (spawn_qemu): the guest's root could unmount anything its
        // supervisor mounted.
        hidden: Vec::new(),
        read_only: Vec::new(),
        workspace,
        binds,
        tmp_size: config.tmp_size,
        loopback: config.network == Network::Loopback,
        hostname: config.hostname.clone(),
        outer_uid: 0,
        outer_gid: 0,
        inner_uid: 0,
        inner_gid: 0,
        rlimit_memory: None,
        // The guest caps processes with a cgroup of its own.
        rlimit_nproc: config.pids,
        user_counts: None,
        // The guest's root could raise it: the host's watcher alone holds
        // the budget here.
        rlimit_fsize: None,
    };
    host.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(host)?;
    let limits = format!(
        "microvm: {} MiB of RAM, {cpus} vCPU, QEMU {}",
        memory / MIB,
        match accel {
            Accel::Kvm => "with KVM",
            Accel::Tcg => "TCG",
        }
    );
    // Started after the lifecycle exists: should a thread fail to start,
    // dropping it stops QEMU.
    let console = Tail::drain(console_host.into(), "console")?;
    let qemu_log = Tail::drain(qemu_stderr, "stderr")?;
    Sandbox::connect(
        stream,
        ConnectParams {
            setup: HostMsg::Setup(spec),
            lifecycle: Box::new(lifecycle),
            limits,
            backend: "microvm",
            base_env: config.base_env(),
            workdir: config.workdir.clone(),
            read_only: config.read_only.clone(),
            setup_timeout: config.setup_timeout.max(MIN_SETUP_TIMEOUT),
            set_clock: true,
            services,
        },
    )
    .await
    .map_err(|e| match e {
        Error::Setup { message, errno } if message.contains("exited during setup") => {
            Error::Setup {
                message: format!(
                    "the microVM stopped while starting; its console said:\n{}\n{}",
                    console.explain(15),
                    qemu_log.explain(5)
                ),
                errno,
            }
        }
        other => other,
    })
}

/// Runs `start` on a thread that lives as long as the process. QEMU is
/// started with PR_SET_PDEATHSIG, which fires when the *thread* that forked
/// it exits, not the process: a sandbox created from a short-lived thread
/// (`Handle::block_on` on a caller's thread) would otherwise lose its VM
/// when that thread ends.
fn launch<T: Send + 'static>(start: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    type Job = Box<dyn FnOnce() + Send>;
    static LAUNCHER: std::sync::OnceLock<Option<std::sync::mpsc::Sender<Job>>> =
        std::sync::OnceLock::new();
    let gone = || Error::Io(std::io::Error::other("cordon's VM launcher thread is gone"));
    let launcher = LAUNCHER.get_or_init(|| {
        let (tx, rx) = std::sync::mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("cordon-vm-launcher".into())
            .spawn(move || {
                for job in rx {
                    // A panicking job must not take the launcher with it;
                    // its caller sees its result channel close.
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })
            .ok()
            .map(|_| tx)
    });
    let launcher = launcher.as_ref().ok_or_else(gone)?;
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    launcher
        .send(Box::new(move || {
            let _ = tx.send(start());
        }))
        .map_err(|_| gone())?;
    rx.recv().map_err(|_| gone())?
}

/// Host files QEMU reads besides its program, libraries and the guest's
/// files (found with strace): the loader's cache, the time zone, and the
/// CPU and NUMA layout.
const QEMU_HOST_FILES: &[&str] = &[
    "/etc/ld.so.cache",
    "/etc/localtime",
    "/sys/devices/system/cpu",
    "/sys/devices/system/node",
];

/// QEMU's descriptor for the guest's serial console (the control
/// channel's is [`CONTROL_FD`]).
const CONSOLE_FD: i32 = CONTROL_FD + 1;

/// Starts QEMU with the guest's end of the control socket as fd 3 and the
/// console socket as fd 4, confined as the module says (Landlock with
/// `ruleset`, then seccomp), in its own process group (the terminal's
/// Ctrl-C belongs to the front end), dying with this process. Returns its
/// pid and the read end of its stderr.
fn spawn_qemu(
    qemu: &Path,
    args: &[String],
    control: OwnedFd,
    console: OwnedFd,
    ruleset: Option<OwnedFd>,
    covers: Option<cover::Covers>,
) -> Result<(i32, OwnedFd)> {
    let filters = crate::supervisor::confine::host_file_guard()?;
    let (control_raw, console_raw) = (control.as_raw_fd(), console.as_raw_fd());
    let ruleset_raw = ruleset.as_ref().map(|f| f.as_raw_fd());
    let mut cmd = std::process::Command::new(qemu);
    cmd.args(args)
        .env_clear()
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .process_group(0);
    // SAFETY: only async-signal-safe calls (prctl, unshare, mount calls,
    // landlock, seccomp, dup2, fcntl, close) on data prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // Mounts before Landlock, which forbids them.
            if let Some(c) = &covers {
                c.apply()?;
            }
            // Landlock first: the ruleset's descriptor may be 3 or 4, which
            // the dup2s below replace.
            if let Some(fd) = ruleset_raw
                && (libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0
                    || libc::syscall(libc::SYS_landlock_restrict_self, fd, 0) != 0)
            {
                return Err(std::io::Error::last_os_error());
            }
            // Copies above both targets first, so that neither dup2 can
            // overwrite the other source; dup2 clears close-on-exec.
            let low = CONSOLE_FD + 1;
            let a = libc::fcntl(control_raw, libc::F_DUPFD, low);
            let b = libc::fcntl(console_raw, libc::F_DUPFD, low);
            if a < 0 || b < 0 || libc::dup2(a, CONTROL_FD) < 0 || libc::dup2(b, CONSOLE_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(a);
            libc::close(b);
            for f in &filters {
                seccompiler::apply_filter(f).map_err(std::io::Error::other)?;
            }
            Ok(())
        });
    }
    let mut child = cmd.spawn().map_err(|e| Error::Spawn {
        path: qemu.to_path_buf(),
        source: e,
    })?;
    drop((control, console, ruleset));
    let stderr = child.stderr.take().expect("stderr was piped");
    Ok((child.id() as i32, stderr.into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tail_keeps_only_the_last_bytes_and_lines_of_an_endless_stream() {
        let (mut w, r) = std::os::unix::net::UnixStream::pair().unwrap();
        let tail = Tail::drain(r.into(), "test").unwrap();
        let line = b"cordon-console-flood\n";
        for _ in 0..(4 << 20) / line.len() {
            std::io::Write::write_all(&mut w, line).unwrap();
        }
        std::io::Write::write_all(&mut w, b"\nlast words\n\n").unwrap();
        drop(w);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !tail.explain(1).contains("last words") {
            assert!(std::time::Instant::now() < deadline, "never drained");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(tail.0.lock().unwrap().len() <= TAIL_BYTES);
        assert_eq!(
            tail.explain(2),
            "cordon-console-flood\nlast words",
            "blank lines are skipped"
        );
        // A single write larger than the whole tail keeps its end.
        tail.push(&vec![b'x'; 3 * TAIL_BYTES]);
        tail.push(b"\nend");
        assert_eq!(tail.0.lock().unwrap().len(), TAIL_BYTES);
        assert_eq!(tail.explain(1), "end");
    }

    #[test]
    fn a_panic_is_explained_by_the_lines_before_it_not_its_backtrace() {
        let tail = Tail::default();
        tail.push(b"[ 1.0] booting\n[ 1.1] cordon: cannot mount /usr\n");
        tail.push(b"[ 1.2] Kernel panic - not syncing: Attempted to kill init!\n");
        for i in 0..40 {
            tail.push(format!("[ 1.3]  frame {i}\n").as_bytes());
        }
        let text = tail.explain(15);
        assert!(text.ends_with("Attempted to kill init!"), "{text}");
        assert!(text.contains("cannot mount /usr"), "{text}");
        assert!(!text.contains("frame"), "{text}");
        let quiet = Tail::default();
        quiet.push(b"one\ntwo\nthree\n");
        assert_eq!(quiet.explain(2), "two\nthree");
    }
}
