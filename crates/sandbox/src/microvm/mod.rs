//! The `microvm` backend: one QEMU `microvm` machine per sandbox, with its
//! own kernel.
//!
//! The guest boots the distribution's kernel (fetched by `cordon vm setup`)
//! with a small initramfs whose init (guest/init.rs) loads the drivers and
//! execs cordon's supervisor from cordon's own read-only disk (see
//! `stage`). The supervisor mounts the host's system directories read-only
//! over 9p and then speaks the same framed protocol as the native one,
//! over a virtio serial port, so every exec feature works unchanged. The
//! workspace is a read-write 9p share; the guest has no network device.
//!
//! Only the first guest of a given shape boots its kernel: its supervisor
//! holds before it mounts anything, QEMU saves the machine there, and the
//! next guests of that shape start from the saved state, their supervisor
//! already running (see `snapshot`).
//!
//! With an image, the guest's root is the image instead (see `disks`): its
//! flat root, a read-only ext4 disk made once per image, under an overlay
//! whose writable layer is a second disk of the guest's own, as big as the
//! disk budget; the supervisor assembles it and moves it over the
//! initramfs before any command runs (supervisor/guest.rs).
//!
//! QEMU itself runs under Landlock (it reads its own files, the kernel and
//! the read-only shares, writes only the workspace and writable binds, no
//! TCP, no signals outside itself), a seccomp filter (no chown, no setuid
//! or setgid bits: its 9p server writes the guest's files with QEMU's
//! identity), QEMU's own `-sandbox` and no new privileges, and dies with
//! its parent. cordon treats what the guest's supervisor says as untrusted
//! (see the session module): the guest's root can take over its pid 1.

mod accel;
mod cover;
mod disks;
pub mod image;
mod qemu;
mod qmp;
mod ram;
mod snapshot;
mod stage;
mod suspend;
mod tail;
mod virtiofs;

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::Duration;

use crate::backend::{Backend, resolve_supervisor};
use crate::config::{Accel, MIB, Network, SandboxConfig, VmShares, in_workspace};
use crate::error::{Error, Result};
use crate::layout::{CONTROL_FD, FONT_CACHE, bind_tag};
use crate::protocol::{self, Bind, HostMsg, SetupSpec};
use crate::services::{Channel, Services};
use crate::session::{ConnectParams, Lifecycle, Sandbox};
use accel::{accel, tsc_khz};
use disks::ImageDisks;
use qemu::{
    CONSOLE_FD, INCOMING_FD, MONITOR_FD, QEMU_HOST_FILES, QemuFds, RAM_FD, SHARE_FD, launch,
    spawn_qemu,
};
use snapshot::{Shape, Snapshots};
use stage::{RunDir, run_dir, stage_etc, stage_supervisor, system_layout};
use suspend::Suspend;
use tail::Tail;

pub use accel::probe_kvm;
pub use qemu::qemu_path;

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

impl MicrovmBackend {
    /// Takes up the microVM made with `config` that another process paused
    /// to disk and kept ([`Sandbox::keep`]), from its state directory
    /// ([`crate::config::VmOptions::state_dir`]), as it was left: paused,
    /// costing nothing but its files. [`Sandbox::resume`] starts it: its
    /// processes, files and writable root go on where they were; commands
    /// the other process started run on, their output dropped, and this
    /// session's start afresh. Until then it takes no request. A resume
    /// that fails leaves the save as it was.
    pub async fn reattach(&self, config: &SandboxConfig) -> Result<Sandbox> {
        reattach(config).await
    }
}

/// The guest init, built by build.rs; empty when that build failed.
const GUEST_INIT: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/cordon-guest-init"));

/// Drivers the guest needs: the virtio transport of the `microvm` machine,
/// the serial port of the control channel, the SCSI disk that is cordon's
/// own (a SCSI disk so that no sandbox's disk is probed with it, see
/// `GUEST_LATE_MODULES`), and ext4 with the crc32c its checksums need (the
/// guest has no modprobe to ask for it).
const MODULES: &[&str] = &[
    "virtio_mmio",
    "virtio_console",
    "virtio_scsi",
    "sd_mod",
    "crc32c_generic",
    "ext4",
];

/// The file system of the shares, by their kind.
const NINE_P_MODULES: &[&str] = &["9pnet_virtio", "9p"];
const VIRTIOFS_MODULES: &[&str] = &["virtiofs"];

/// The oldest QEMU that saves a guest with a virtio-fs share (its
/// vhost-user device state): older ones refuse any snapshot of it.
const VIRTIOFS_QEMU: (u32, u32) = (8, 2);

/// The oldest guest kernel that maps an uncached virtio-fs file shared
/// (`FUSE_DIRECT_IO_ALLOW_MMAP`): older ones answer ENODEV, which breaks
/// SQLite's WAL and anything else that maps a workspace file shared.
const VIRTIOFS_KERNEL: (u32, u32) = (6, 6);

/// With an image root, also: the block devices of its flat root and
/// writable layer, and overlayfs.
const IMAGE_MODULES: &[&str] = &["virtio_blk", "overlay"];

/// Least memory a guest boots with usefully: the kernel alone takes ~60 MiB.
const MIN_MEMORY: u64 = 128 * MIB;

/// A guest boots in about 1.5 s under TCG on an idle machine; allow for a
/// loaded one.
const MIN_SETUP_TIMEOUT: Duration = Duration::from_secs(60);

struct VmLifecycle {
    /// QEMU's: another after each resume from disk.
    pid: AtomicI32,
    /// Whether that QEMU has been reaped.
    reaped: Mutex<bool>,
    /// The per-sandbox directory (the guest's /etc).
    run_dir: PathBuf,
    /// An image root's disks, kept until QEMU is gone.
    disks: Mutex<Option<ImageDisks>>,
    /// The shares' virtio-fs servers, ended with QEMU.
    servers: Mutex<Option<virtiofs::Servers>>,
    /// What pausing to disk needs (a guest on virtio-fs).
    suspend: Option<Suspend>,
    /// Its run directory is in a state directory, with a [`Record`]:
    /// once saved, another process can resume it.
    reattachable: bool,
    /// Left for another process (see `Lifecycle::keep`): its run
    /// directory and disks stay when this ends.
    kept: std::sync::atomic::AtomicBool,
}

impl VmLifecycle {
    fn pid(&self) -> i32 {
        self.pid.load(Ordering::SeqCst)
    }

    /// Whether its run directory and disks stay when this ends.
    fn set_kept(&self, kept: bool) {
        self.kept.store(kept, Ordering::SeqCst);
        if let Some(d) = self.disks.lock().unwrap().as_mut() {
            d.set_kept(kept);
        }
    }

    /// Removes its run directory, unless it is kept.
    fn remove_run_dir(&self) {
        if !self.kept.load(Ordering::SeqCst) {
            let _ = std::fs::remove_dir_all(&self.run_dir);
        }
    }

    fn wait(&self) {
        let mut reaped = self.reaped.lock().unwrap();
        if !*reaped {
            let mut status = 0;
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(self.pid(), &mut status, 0) };
            *reaped = true;
        }
    }

    /// Saves the guest to disk and ends its QEMU (see `suspend`).
    fn save(&self, s: &Suspend) -> Result<()> {
        s.save(&self.run_dir, || {
            self.kill();
            self.wait();
            drop(self.servers.lock().unwrap().take());
        })?;
        // Another process may take it up: its writable layer stays
        // through a prune meanwhile.
        if self.reattachable
            && let Some(d) = self.disks.lock().unwrap().as_ref()
            && let Err(e) = d.mark_saved(true)
        {
            tracing::warn!(error = %e, "cannot mark the saved microVM's writable layer: a prune may take it");
        }
        Ok(())
    }

    /// Starts a QEMU on the guest saved to disk.
    fn restore(&self, s: &Suspend) -> Result<()> {
        let (pid, servers) = s.restore()?;
        if let Some(d) = self.disks.lock().unwrap().as_ref() {
            let _ = d.mark_saved(false);
        }
        *self.servers.lock().unwrap() = servers;
        let mut reaped = self.reaped.lock().unwrap();
        self.pid.store(pid, Ordering::SeqCst);
        *reaped = false;
        Ok(())
    }
}

impl Lifecycle for VmLifecycle {
    fn host_pid(&self) -> i32 {
        self.pid()
    }

    fn holders(&self) -> Vec<i32> {
        // The share servers hold the guest's open workspace files.
        let mut pids = vec![self.pid()];
        if let Some(s) = self.servers.lock().unwrap().as_ref() {
            pids.extend(s.pids());
        }
        pids
    }

    fn oom_kills(&self) -> Option<u64> {
        None
    }

    fn kill(&self) {
        if !*self.reaped.lock().unwrap() {
            // SAFETY: signalling our own, not yet reaped, child.
            unsafe { libc::kill(self.pid(), libc::SIGKILL) };
        }
    }

    fn saves(&self) -> bool {
        self.suspend.is_some()
    }

    fn fork_saved(&self, children: &[SandboxConfig]) -> Result<()> {
        let saved = self.suspend.as_ref().is_some_and(Suspend::is_saved);
        if !saved || !self.reattachable {
            return Err(Error::Config(
                "only a microVM on virtio-fs with a state directory, saved to disk, forks from its \
                 memory"
                    .into(),
            ));
        }
        let state = self
            .run_dir
            .parent()
            .expect("a state directory's run directory");
        let record = Record::read(state)?;
        let upper = self
            .disks
            .lock()
            .unwrap()
            .as_ref()
            .map(|d| d.host_files().1);
        for child in children {
            fork_child(&record, &self.run_dir, upper.as_deref(), child)?;
        }
        Ok(())
    }

    fn keep(&self) -> bool {
        let saved = self.suspend.as_ref().is_some_and(Suspend::is_saved);
        if saved && self.reattachable {
            self.set_kept(true);
        }
        saved && self.reattachable
    }

    fn freeze(&self, frozen: bool, to_disk: bool) -> std::io::Result<()> {
        // A guest on virtio-fs is saved to disk and its QEMU ended: it
        // costs disk, not memory, while paused.
        if let Some(s) = &self.suspend {
            if !frozen && s.is_saved() {
                return self.restore(s).map_err(std::io::Error::other);
            }
            if frozen && to_disk {
                match self.save(s) {
                    Ok(()) => return Ok(()),
                    Err(e) => {
                        tracing::warn!(error = %e, "could not save the microVM to disk; pausing it in memory");
                    }
                }
            }
        }
        // QEMU stopped is the guest stopped: every vCPU and device thread
        // where it was, its memory kept, until it is continued.
        if *self.reaped.lock().unwrap() {
            return Err(std::io::Error::other("the microVM has exited"));
        }
        let pid = self.pid();
        let signal = if frozen { libc::SIGSTOP } else { libc::SIGCONT };
        // SAFETY: signalling our own, not yet reaped, child.
        if unsafe { libc::kill(pid, signal) } != 0 {
            return Err(std::io::Error::last_os_error());
        }
        // Stopping is asynchronous: done once every thread says so.
        let tasks = PathBuf::from(format!("/proc/{pid}/task"));
        let stopped = |c: &char| *c == 'T' || *c == 't';
        crate::backend::wait_until(
            Duration::from_secs(10),
            "QEMU's threads did not all stop or go on in 10 s",
            || {
                let states: Vec<char> = std::fs::read_dir(&tasks)?
                    .flatten()
                    .filter_map(|t| std::fs::read_to_string(t.path().join("stat")).ok())
                    .filter_map(|stat| stat.rsplit_once(") ")?.1.chars().next())
                    .collect();
                Ok(if frozen {
                    states.iter().all(stopped)
                } else {
                    !states.iter().any(stopped)
                })
            },
        )
    }

    fn reap(&self, grace: Duration) {
        // A paused guest is continued, to hear its end (one saved to disk
        // has no QEMU left).
        let running = !*self.reaped.lock().unwrap();
        if running {
            // SAFETY: signalling our own, not yet reaped, child.
            unsafe { libc::kill(self.pid(), libc::SIGCONT) };
        }
        // The guest powers off when its control channel closes; give it
        // that long, then stop it.
        let deadline = std::time::Instant::now() + grace;
        while running && std::time::Instant::now() < deadline {
            let mut status = 0;
            let pid = self.pid();
            // SAFETY: polling our own child.
            let r = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
            if r == pid {
                *self.reaped.lock().unwrap() = true;
                break;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        self.kill();
        self.wait();
        drop(self.servers.lock().unwrap().take());
        self.remove_run_dir();
        drop(self.disks.lock().unwrap().take());
    }

    fn writable_layer(&self) -> Option<PathBuf> {
        Some(
            self.disks
                .lock()
                .unwrap()
                .as_ref()?
                .writable_layer()
                .to_path_buf(),
        )
    }
}

impl Drop for VmLifecycle {
    fn drop(&mut self) {
        if !*self.reaped.lock().unwrap() {
            self.kill();
            let pid = self.pid();
            let dir = self.run_dir.clone();
            let disks = self.disks.lock().unwrap().take();
            let servers = self.servers.lock().unwrap().take();
            // Off the async runtime: reaping blocks.
            std::thread::spawn(move || {
                let mut status = 0;
                // SAFETY: reaping our own child.
                unsafe { libc::waitpid(pid, &mut status, 0) };
                drop(servers);
                let _ = std::fs::remove_dir_all(dir);
                drop(disks);
            });
        } else {
            drop(self.servers.lock().unwrap().take());
            self.remove_run_dir();
        }
    }
}

async fn create(config: &SandboxConfig) -> Result<Sandbox> {
    // Phases are logged at debug level with their times: where a start's
    // time goes (docs/microvm.md).
    let began = std::time::Instant::now();
    let (workspace, mut binds) = config.validate()?;
    if config.network == Network::Full {
        return Err(Error::Config(
            "network mode full is for the native backend: a microVM has no network device; \
             use allow with the hosts it needs"
                .into(),
        ));
    }

    if let Some(image) = &config.image {
        // 9p shows the guest the workspace's owner on the host, which is
        // root's inside, and maps no ids.
        image.warn_workspace_unwritable(
            "in a microVM (it is root's inside)",
            "on the native backend",
        );
    }
    // The font cache, as the native backend binds it (see supervisor/setup.rs);
    // an image has its own fonts, if any.
    let fonts = FONT_CACHE;
    if config.image.is_none()
        && Path::new(fonts).is_dir()
        && !binds.iter().any(|b| b.target == fonts)
    {
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
    let virtiofsd = share_server(config, &qemu, &cache, &kernel.version)?;
    let (symlinks, system_shares) = system_layout();
    let mut modules: Vec<&str> = MODULES.to_vec();
    modules.extend(match virtiofsd {
        Some(_) => VIRTIOFS_MODULES,
        None => NINE_P_MODULES,
    });
    if config.image.is_some() {
        modules.extend(IMAGE_MODULES);
    }
    let initrd = image::initramfs(
        &cache,
        &kernel,
        &image::InitramfsSpec {
            init: GUEST_INIT,
            modules: &modules,
            symlinks: &symlinks,
        },
    )
    .map_err(|e| Error::Config(e.to_string()))?;
    let supervisor = resolve_supervisor(config)?;
    // Seconds once per supervisor binary (mke2fs), nothing after.
    let bin_cache = cache.clone();
    let bin_disk = tokio::task::spawn_blocking(move || stage_supervisor(&bin_cache, &supervisor))
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))??;
    let run = match &config.vm.state_dir {
        Some(state) => state_run_dir(state)?,
        None => run_dir(&cache)?,
    };
    // Until QEMU runs and its lifecycle owns the directory, any failure
    // removes it.
    let run_guard = RunDir(Some(run.clone()));
    let disks = match &config.image {
        Some(image) if image.step.is_some() => {
            return Err(Error::Config(
                "build steps run on the native backend only".into(),
            ));
        }
        Some(image) => Some(ImageDisks::prepare(image, config.disk).await?),
        None => None,
    };
    // The broker's CA, for a guest whose secrets' hosts it intercepts: in
    // the staged /etc, or written by the guest into an image's.
    let trust = crate::egress::trust(config);
    let etc = match (&disks, &trust) {
        (Some(_), _) => None,
        (None, None) => {
            let cache = cache.clone();
            Some(
                tokio::task::spawn_blocking(move || stage::shared_etc(&cache))
                    .await
                    .map_err(|e| Error::Io(std::io::Error::other(e)))??,
            )
        }
        // The CA is this sandbox's own: its /etc too.
        (None, Some((ca, bundle))) => {
            let etc = run.join("etc");
            stage_etc(&etc)?;
            let dir = etc.join("cordon");
            std::fs::create_dir_all(&dir)?;
            std::fs::write(dir.join("ca.pem"), ca)?;
            std::fs::write(dir.join("bundle.pem"), bundle)?;
            Some(etc)
        }
    };
    let covers = cover::Covers::prepare(
        &workspace,
        &in_workspace(&config.hidden, &workspace),
        &in_workspace(&config.read_only, &workspace),
        &run,
    )?;

    tracing::debug!(took = ?began.elapsed(), "microVM: kernel, disks and /etc found");
    // Before the command line: a service's channel is a device on it.
    let services = Services::start(config, &workspace, Channel::Relay).await?;
    let accel = accel(config).await;
    let mut append = vec![
        "console=ttyS0".to_string(),
        "panic=-1".into(),
        "quiet".into(),
        "cryptomgr.notests".into(),
        format!("cordon.ro={}", system_shares.join(",")),
    ];
    if virtiofsd.is_some() {
        append.push("cordon.fs=virtiofs".into());
    }
    if accel == Accel::Tcg
        && let Some(khz) = tsc_khz()
    {
        append.push(format!("tsc_early_khz={khz}"));
        append.push("tsc=reliable".into());
    }
    let share = |tag: String, path: &str, writable: bool| virtiofs::Share {
        tag,
        path: PathBuf::from(path),
        writable,
    };
    let mut shares: Vec<virtiofs::Share> = system_shares
        .iter()
        .map(|s| share(s.clone(), &format!("/{s}"), false))
        .collect();
    if let Some(etc) = &etc {
        shares.push(share("etc".into(), &etc.to_string_lossy(), false));
    }
    shares.push(share("workspace".into(), &workspace, true));
    for (i, b) in binds.iter().enumerate() {
        shares.push(share(bind_tag(i), &b.source, b.writable));
    }

    let mut args: Vec<String> = vec![
        "-M".into(),
        "microvm,x-option-roms=off,isa-serial=on,pic=off,pit=off".into(),
        // qboot loads the kernel itself; QEMU 8.2 and newer default to a
        // SeaBIOS that needs the option ROMs turned off above.
        "-bios".into(),
        "qboot.rom".into(),
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
    for (
        i,
        virtiofs::Share {
            tag,
            path,
            writable,
        },
    ) in shares.iter().enumerate()
    {
        if virtiofsd.is_some() {
            // The server is found on a descriptor (see `virtiofs`): no
            // path goes on QEMU's command line.
            args.extend([
                "-chardev".into(),
                format!("socket,id=fs{i},fd={}", SHARE_FD + i as i32),
                "-device".into(),
                format!("vhost-user-fs-device,chardev=fs{i},tag={tag}"),
            ]);
            continue;
        }
        let path = path.to_string_lossy();
        if path.contains(',') {
            return Err(Error::Config(format!(
                "the microvm backend cannot share {path} over 9p: a comma in the path"
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

    let bin_path = disks::drive_path(&bin_disk)?;
    args.extend([
        "-device".into(),
        "virtio-scsi-device,id=cordon-scsi".into(),
        "-drive".into(),
        format!("file={bin_path},if=none,id=cordon-bin,format=raw,readonly=on"),
        "-device".into(),
        "scsi-hd,drive=cordon-bin,bus=cordon-scsi.0".into(),
    ]);
    if let Some(d) = &disks {
        args.extend(d.qemu_args()?);
    }

    // What QEMU may touch on the host: its own files, the kernel, and the
    // shares if its 9p server serves them, read-only but for the workspace
    // and writable binds (and an image's flat root, read-only, and the
    // guest's writable layer).
    let mut read: Vec<PathBuf> = ["/usr", "/bin", "/sbin", "/lib", "/lib64"]
        .iter()
        .chain(QEMU_HOST_FILES)
        .map(PathBuf::from)
        .collect();
    read.extend([
        qemu.clone(),
        kernel.vmlinux.clone(),
        initrd.clone(),
        bin_disk.clone(),
    ]);
    // /dev/null: harmless, and what a library falls back on.
    let mut write: Vec<PathBuf> = vec!["/dev/null".into()];
    if virtiofsd.is_none() {
        for s in &shares {
            if s.writable { &mut write } else { &mut read }.push(s.path.clone());
        }
    }
    if accel == Accel::Kvm {
        write.push("/dev/kvm".into());
    }
    if let Some(d) = &disks {
        let (flat, upper) = d.host_files();
        read.push(flat);
        write.push(upper);
    }

    let setup_timeout = config.setup_timeout.max(MIN_SETUP_TIMEOUT);
    let shape = if config.vm.cold_boot {
        None
    } else {
        Some(Shape::new(
            &qemu,
            &kernel.vmlinux,
            &initrd,
            &bin_disk,
            crate::layout::GUEST_WARM,
            &args,
        )?)
    };
    // The covers go where the workspace is served from.
    let (covers, servers) = match virtiofsd {
        Some(program) => (
            None,
            Some(ShareServers {
                program,
                shares,
                workspace: PathBuf::from(&workspace),
                covers,
                run: run.clone(),
            }),
        ),
        None => (covers, None),
    };
    let launch_spec = Launch {
        qemu,
        args,
        read,
        write,
        covers,
        servers,
        timeout: setup_timeout,
        snapshots: Snapshots::new(&cache),
        shape,
        memory: memory / MIB * MIB,
    };
    let launch_spec = std::sync::Arc::new(launch_spec);
    let booting = launch_spec.clone();
    tracing::debug!(took = ?began.elapsed(), "microVM: services started");
    let mut booted = tokio::task::spawn_blocking(move || boot(&booting))
        .await
        .map_err(|e| Error::Io(std::io::Error::other(e)))??;
    tracing::debug!(took = ?began.elapsed(), restored = booted.restored, "microVM: guest running");
    // A guest on virtio-fs may be paused to disk: its monitor, spoken to.
    let suspend = match booted.control.take() {
        Some(control) => {
            booted.qmp()?;
            Some(Suspend::new(
                launch_spec,
                control,
                booted.qmp.take(),
                booted.ram.take(),
            ))
        }
        None => None,
    };
    let Booted {
        qemu: started,
        host,
        console,
        log: qemu_log,
        restored,
        servers,
        ..
    } = booted;
    let host = host.expect("a new guest's channel");
    let pid = started.keep();
    let reattachable = suspend.is_some() && config.vm.state_dir.is_some();
    let lifecycle = VmLifecycle {
        pid: AtomicI32::new(pid),
        reaped: Mutex::new(false),
        run_dir: run_guard.keep(),
        disks: Mutex::new(disks),
        servers: Mutex::new(servers),
        suspend,
        reattachable,
        kept: Default::default(),
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
        loopback: matches!(config.network, Network::Loopback | Network::Allow),
        hostname: config.hostname.clone(),
        outer_uid: 0,
        outer_gid: 0,
        inner_uid: config.image.as_ref().map_or(0, |i| i.uid),
        inner_gid: config.image.as_ref().map_or(0, |i| i.gid),
        rlimit_memory: None,
        // The guest caps processes with a cgroup of its own.
        rlimit_nproc: config.pids,
        user_counts: None,
        // The guest's root could raise it: the host's watcher alone holds
        // the budget here.
        rlimit_fsize: None,
        nice: None,
        proxy_port: services.proxy_port(),
        host_network: false,
        // Written by the guest into an image's /etc; the staged /etc has it
        // otherwise.
        trust: if config.image.is_some() { trust } else { None },
        image: None,
        guest_image: config.image.is_some(),
    };
    host.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(host)?;
    let machine = format!(
        "microvm: {} MiB of RAM, {cpus} vCPU, QEMU {}, shares over {}",
        memory / MIB,
        match accel {
            Accel::Kvm => "with KVM",
            Accel::Tcg => "TCG",
        },
        if lifecycle.servers.lock().unwrap().is_some() {
            "virtio-fs"
        } else {
            "9p"
        },
    );
    let limits = format!(
        "{machine}, {}",
        if restored {
            "started from a snapshot"
        } else {
            "booted cold"
        }
    );
    if let (true, Some(state), Some(suspend)) = (
        lifecycle.reattachable,
        &config.vm.state_dir,
        &lifecycle.suspend,
    ) {
        Record::new(
            suspend.launch(),
            lifecycle.disks.lock().unwrap().as_ref(),
            machine,
        )
        .write(state)?;
    }
    let params = connect_params(
        config,
        HostMsg::Setup(Box::new(spec)),
        Box::new(lifecycle),
        limits,
        services,
    );
    let connected = Sandbox::connect(stream, params).await;
    tracing::debug!(took = ?began.elapsed(), "microVM: sandbox ready in the guest");
    connected.map_err(|e| match e {
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

/// What the session of a microVM made with `config` needs, its channel's
/// first message `setup`: a guest gets at least [`MIN_SETUP_TIMEOUT`].
fn connect_params(
    config: &SandboxConfig,
    setup: HostMsg,
    lifecycle: Box<VmLifecycle>,
    limits: String,
    services: Services,
) -> ConnectParams {
    ConnectParams {
        setup_timeout: config.setup_timeout.max(MIN_SETUP_TIMEOUT),
        ..ConnectParams::new(
            config,
            crate::config::BackendKind::Microvm,
            setup,
            lifecycle,
            limits,
            services,
        )
    }
}

/// The run directory in a sandbox's state directory (see
/// [`crate::config::VmOptions::state_dir`]), made afresh.
fn state_run_dir(state: &Path) -> Result<PathBuf> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(state)?;
    let run = state.join(STATE_RUN);
    let _ = std::fs::remove_dir_all(&run);
    std::fs::DirBuilder::new().mode(0o700).create(&run)?;
    Ok(run)
}

/// A state directory's entries: the run directory, and the record of how
/// its guest runs.
const STATE_RUN: &str = "run";
const STATE_RECORD: &str = "microvm.json";

/// The most bytes of a record read: a command line and a few paths.
const MAX_RECORD: u64 = 1 << 20;

/// How a guest that may be saved to disk runs, written to its state
/// directory when it starts: what another process needs to start it again
/// from its save (see [`reattach`]). Written and read by cordon only; the
/// guest reaches no part of the state directory.
#[derive(serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields)]
struct Record {
    /// [`protocol::VERSION`] of the supervisor in the guest's memory.
    protocol: u32,
    qemu: PathBuf,
    args: Vec<String>,
    read: Vec<PathBuf>,
    write: Vec<PathBuf>,
    memory: u64,
    virtiofsd: PathBuf,
    shares: Vec<virtiofs::Share>,
    workspace: PathBuf,
    /// An image root's writable layer (its directory).
    layer: Option<PathBuf>,
    /// [`crate::SandboxInfo::limits`], less how it started.
    machine: String,
}

impl Record {
    fn new(l: &Launch, disks: Option<&ImageDisks>, machine: String) -> Record {
        let servers = l
            .servers
            .as_ref()
            .expect("a guest that may be saved has share servers");
        Record {
            protocol: protocol::VERSION,
            qemu: l.qemu.clone(),
            args: l.args.clone(),
            read: l.read.clone(),
            write: l.write.clone(),
            memory: l.memory,
            virtiofsd: servers.program.clone(),
            shares: servers.shares.clone(),
            workspace: servers.workspace.clone(),
            layer: disks.map(|d| d.writable_layer().to_path_buf()),
            machine,
        }
    }

    fn write(&self, state: &Path) -> Result<()> {
        let json = serde_json::to_vec_pretty(self).map_err(std::io::Error::other)?;
        // Private (0600), and whole or absent under its name.
        let mut f = tempfile::NamedTempFile::new_in(state)?;
        std::io::Write::write_all(&mut f, &json)?;
        f.as_file().sync_all()?;
        f.persist(state.join(STATE_RECORD))
            .map_err(|e| Error::Io(e.error))?;
        Ok(())
    }

    fn read(state: &Path) -> Result<Record> {
        use std::io::Read;
        let path = state.join(STATE_RECORD);
        let mut json = Vec::new();
        std::fs::File::open(&path)
            .map_err(|e| {
                Error::Config(format!(
                    "{} has no microVM to resume ({}: {e})",
                    state.display(),
                    path.display()
                ))
            })?
            .take(MAX_RECORD)
            .read_to_end(&mut json)?;
        serde_json::from_slice(&json).map_err(|e| {
            Error::Config(format!(
                "{}: not a record of a paused microVM: {e}",
                path.display()
            ))
        })
    }
}

/// Makes `child`'s state directory a copy of a guest saved in `run` (its
/// `record`, its writable disk `upper`): the save linked (its files are
/// only read, then removed), the writable disk copied into a layer of the
/// child's own, the workspace copied into the child's (empty) one, and a
/// record of the child's paths. Blocking.
fn fork_child(
    record: &Record,
    run: &Path,
    upper: Option<&Path>,
    child: &SandboxConfig,
) -> Result<()> {
    let state = child.vm.state_dir.as_deref().ok_or_else(|| {
        Error::Config("a fork from memory needs its own state directory (vm.state_dir)".into())
    })?;
    let (workspace, _) = child.validate()?;
    let child_run = state_run_dir(state)?;
    let paused = child_run.join(suspend::PAUSED);
    std::fs::DirBuilder::new().mode(0o700).create(&paused)?;
    for name in [suspend::STATE, suspend::RAM] {
        let from = run.join(suspend::PAUSED).join(name);
        let to = paused.join(name);
        if std::fs::hard_link(&from, &to).is_err() {
            crate::sparse::copy_file(&from, &to)?;
        }
    }
    // Shares cordon staged in the run directory (a sandbox's own /etc).
    let mut shares = record.shares.clone();
    for share in &mut shares {
        if let Ok(rel) = share.path.strip_prefix(run) {
            let to = child_run.join(rel);
            std::fs::create_dir_all(&to)?;
            crate::copy::copy_tree(&share.path, &to, None)?;
            share.path = to;
        } else if share.path == record.workspace {
            share.path = PathBuf::from(&workspace);
        }
    }
    let layer = match (&child.image, upper) {
        (Some(image), Some(upper)) => {
            let mut layer = crate::backend::WritableLayer::new(image)?;
            let disk = layer.copy_disk(upper)?;
            layer.mark_saved(true)?;
            layer.set_kept(true);
            Some((layer.dir().to_path_buf(), disk))
        }
        (None, None) => None,
        _ => {
            return Err(Error::Config(
                "a fork from memory has its parent's root: an image's, or the host's".into(),
            ));
        }
    };
    crate::copy::copy_tree(&record.workspace, Path::new(&workspace), child.disk)
        .map_err(|e| Error::Config(format!("cannot copy the workspace into the fork: {e}")))?;
    let (mut args, mut write) = (record.args.clone(), record.write.clone());
    if let (Some(upper), Some((_, disk))) = (upper, &layer) {
        let (from, to) = (disks::drive_path(upper)?, disks::drive_path(disk)?);
        for a in &mut args {
            if let Some(rest) = a.strip_prefix(&format!("file={from},")) {
                *a = format!("file={to},{rest}");
            }
        }
        for w in &mut write {
            if w == upper {
                *w = disk.clone();
            }
        }
    }
    Record {
        protocol: record.protocol,
        qemu: record.qemu.clone(),
        args,
        read: record.read.clone(),
        write,
        memory: record.memory,
        virtiofsd: record.virtiofsd.clone(),
        shares,
        workspace: PathBuf::from(&workspace),
        layer: layer.map(|(dir, _)| dir),
        machine: record.machine.clone(),
    }
    .write(state)
}

impl Sandbox {
    /// Forks this microVM from its memory: each of `children` (their
    /// configurations, as this one's but for an empty workspace and a
    /// state directory of their own) starts from this one's state at one
    /// instant, its processes and memory, devices, root disk and
    /// workspace. This one is saved to disk meanwhile and goes on as it
    /// was. The children come back as [`MicrovmBackend::reattach`] gives
    /// them: paused, each to be resumed (its kernel's randomness reseeded
    /// then); commands this one had started run on in each, their output
    /// dropped. Only a running microVM on virtio-fs with a state
    /// directory forks so. On failure none is returned, their directories
    /// the caller's to remove.
    pub async fn fork_from_memory(&self, children: &[SandboxConfig]) -> Result<Vec<Sandbox>> {
        self.fork_saved(children).await?;
        let mut forks = Vec::with_capacity(children.len());
        for child in children {
            forks.push(reattach(child).await?);
        }
        Ok(forks)
    }
}

/// See [`MicrovmBackend::reattach`].
async fn reattach(config: &SandboxConfig) -> Result<Sandbox> {
    let state = config.vm.state_dir.as_deref().ok_or_else(|| {
        Error::Config("resuming a microVM needs its state directory (vm.state_dir)".into())
    })?;
    let (workspace, _) = config.validate()?;
    let record = Record::read(state)?;
    if record.protocol != protocol::VERSION {
        return Err(Error::Config(format!(
            "the microVM in {} was paused by a cordon whose guest speaks protocol {}; this one \
             speaks {}: resume it with that cordon",
            state.display(),
            record.protocol,
            protocol::VERSION
        )));
    }
    if record.workspace != Path::new(&workspace) {
        return Err(Error::Config(format!(
            "the microVM in {} was made with the workspace {}, not {workspace}",
            state.display(),
            record.workspace.display()
        )));
    }
    let run = state.join(STATE_RUN);
    let saved = run.join(suspend::PAUSED);
    if !saved.is_dir() {
        return Err(Error::Config(format!(
            "the microVM in {} is not paused to disk",
            state.display()
        )));
    }
    let disks = match (&config.image, &record.layer) {
        (Some(image), Some(layer)) => Some(ImageDisks::adopt(image, layer).await?),
        (None, None) => None,
        _ => {
            return Err(Error::Config(format!(
                "the microVM in {} was made {} an image root, its configuration now says otherwise",
                state.display(),
                if record.layer.is_some() {
                    "with"
                } else {
                    "without"
                }
            )));
        }
    };
    let covers = cover::Covers::prepare(
        &workspace,
        &in_workspace(&config.hidden, &workspace),
        &in_workspace(&config.read_only, &workspace),
        &run,
    )?;
    let services = Services::start(config, &workspace, Channel::Relay).await?;
    let setup_timeout = config.setup_timeout.max(MIN_SETUP_TIMEOUT);
    let launch = std::sync::Arc::new(Launch {
        qemu: record.qemu,
        args: record.args,
        read: record.read,
        write: record.write,
        covers: None,
        servers: Some(ShareServers {
            program: record.virtiofsd,
            shares: record.shares,
            workspace: record.workspace,
            covers,
            run: run.clone(),
        }),
        timeout: setup_timeout,
        snapshots: Snapshots::new(&image::cache_dir()),
        shape: None,
        memory: record.memory,
    });
    let (suspend, host) = Suspend::adopt(launch, saved)?;
    let lifecycle = VmLifecycle {
        pid: AtomicI32::new(0),
        // No QEMU yet: nothing to kill or reap.
        reaped: Mutex::new(true),
        run_dir: run,
        disks: Mutex::new(disks),
        servers: Mutex::new(None),
        suspend: Some(suspend),
        reattachable: true,
        kept: Default::default(),
    };
    host.set_nonblocking(true)?;
    let stream = tokio::net::UnixStream::from_std(host)?;
    let limits = format!("{}, resumed from disk", record.machine);
    let mut seed = vec![0u8; crate::layout::HOLD_SEED_LEN];
    rustix::rand::getrandom(&mut seed, rustix::rand::GetRandomFlags::empty())
        .map_err(std::io::Error::from)?;
    let params = connect_params(
        config,
        HostMsg::Reattach { seed },
        Box::new(lifecycle),
        limits,
        services,
    );
    Sandbox::adopt(stream, params, guest_ready_info())
}

/// What a guest's supervisor reports once ready: nothing of the host's
/// confinement applies inside a virtual machine.
fn guest_ready_info() -> protocol::ReadyInfo {
    protocol::ReadyInfo {
        landlock: "not used: the sandbox is a virtual machine".into(),
        landlock_abi: 0,
        seccomp_filters: 0,
        next_id: 0,
    }
}

/// The virtio-fs server, chosen by `vm.shares` (see [`VmShares`]), or
/// None for 9p. `auto` takes virtio-fs only where it costs nothing that
/// 9p gives: QEMU can save it, and the guest's kernel maps its files
/// shared.
fn share_server(
    config: &SandboxConfig,
    qemu: &Path,
    cache: &Path,
    kernel: &str,
) -> Result<Option<PathBuf>> {
    let found = || virtiofs::find(config.vm.virtiofsd.as_deref());
    match config.vm.shares {
        VmShares::NineP => Ok(None),
        VmShares::VirtioFs => found().map(Some).ok_or_else(|| {
            Error::Config(
                "vm.shares is virtiofs, but no virtiofsd was found on PATH or in /usr/libexec: \
                 install it (cargo install virtiofsd) or set vm.virtiofsd"
                    .into(),
            )
        }),
        VmShares::Auto => Ok(found().filter(|_| {
            kernel_version(kernel).is_some_and(|v| v >= VIRTIOFS_KERNEL)
                && qemu::version(qemu, cache).is_some_and(|v| v >= VIRTIOFS_QEMU)
        })),
    }
}

/// (major, minor) of a kernel release such as `6.1.0-57-amd64`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    Some((parts.next()?.parse().ok()?, parts.next()?.parse().ok()?))
}

/// The virtio-fs servers a start runs for its guest (see `virtiofs`).
struct ShareServers {
    program: PathBuf,
    shares: Vec<virtiofs::Share>,
    /// The share the covers apply to.
    workspace: PathBuf,
    covers: Option<cover::Covers>,
    /// Where their sockets are made.
    run: PathBuf,
}

/// How to start QEMU for one sandbox, from a snapshot or cold.
struct Launch {
    qemu: PathBuf,
    args: Vec<String>,
    /// What QEMU may read and write on the host (its Landlock ruleset).
    read: Vec<PathBuf>,
    write: Vec<PathBuf>,
    /// Workspace files QEMU's 9p server must not serve.
    covers: Option<cover::Covers>,
    /// The shares' servers when they are virtio-fs; their guest's memory
    /// must then be a file they can map.
    servers: Option<ShareServers>,
    timeout: Duration,
    snapshots: Snapshots,
    /// None: boot cold, take no snapshot.
    shape: Option<Shape>,
    /// The guest's memory in bytes, as `-m` gives it.
    memory: u64,
}

/// The guest's memory when it is a file (see `ram`): a memfd QEMU maps
/// shared, for a guest that will be saved, or a snapshot's, mapped
/// privately.
enum Ram {
    Shared(std::os::fd::OwnedFd),
    Private(std::os::fd::OwnedFd),
}

/// A QEMU started and its guest past the start handshake.
struct Booted {
    qemu: Started,
    /// The control channel's host end, the supervisor's next (none for a
    /// guest resumed from disk, whose session has it).
    host: Option<std::os::unix::net::UnixStream>,
    /// QEMU's monitor (QMP).
    monitor: std::os::unix::net::UnixStream,
    console: std::sync::Arc<Tail>,
    log: std::sync::Arc<Tail>,
    restored: bool,
    servers: Option<virtiofs::Servers>,
    /// The monitor, once spoken to (its greeting is read once).
    qmp: Option<qmp::Qmp>,
    /// For a guest that may be paused to disk: the guest's end of the
    /// control channel, and its memory.
    control: Option<suspend::KeptControl>,
    ram: Option<std::os::fd::OwnedFd>,
}

impl Booted {
    fn host(&mut self) -> &mut std::os::unix::net::UnixStream {
        self.host.as_mut().expect("a new guest's channel")
    }

    /// Its monitor, spoken to.
    fn qmp(&mut self) -> Result<&mut qmp::Qmp> {
        if self.qmp.is_none() {
            self.qmp = Some(qmp::Qmp::connect(
                self.monitor.try_clone()?,
                RESTORE_TIMEOUT,
            )?);
        }
        Ok(self.qmp.as_mut().expect("just set"))
    }
}

/// A QEMU process not yet owned by a lifecycle: killed and reaped if
/// dropped (a start that failed, or whose caller went away).
struct Started(Option<i32>);

impl Started {
    fn keep(mut self) -> i32 {
        self.0.take().expect("kept once")
    }
}

impl Drop for Started {
    fn drop(&mut self) {
        if let Some(pid) = self.0.take() {
            // SAFETY: killing and reaping our own child, which no one else
            // reaps.
            unsafe {
                libc::kill(pid, libc::SIGKILL);
                libc::waitpid(pid, std::ptr::null_mut(), 0);
            }
        }
    }
}

/// A restored guest acknowledges its go at once; one that does not in
/// this long is taken for a snapshot that does not work.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(30);

/// Starts the guest from its snapshot if there is one that works, else
/// cold, taking the snapshot on the way (see `snapshot`). Blocking.
fn boot(l: &Launch) -> Result<Booted> {
    if let Some(shape) = &l.shape
        && let Some(saved) = l.snapshots.open(shape, l.memory)
    {
        // A guest whose memory its share servers map too runs on a copy
        // of its own.
        let t = std::time::Instant::now();
        // A guest whose memory its share servers map too runs on a copy
        // of its own, made while QEMU starts.
        let (ram, filling) = if l.servers.is_some() {
            match saved.ram.copy_for_sharing(l.memory) {
                Ok(f) => (f.fd.try_clone().map(Ram::Shared), Some(f)),
                Err(e) => (Err(e), None),
            }
        } else {
            (saved.ram.for_qemu().map(Ram::Private), None)
        };
        let restored = ram
            .map_err(Error::from)
            .and_then(|ram| start(l, Some(ram), Some(saved.state.into()), None))
            .and_then(|mut b| {
                tracing::debug!(took = ?t.elapsed(), "microVM: QEMU started");
                let copied = filling.map_or(Ok(()), |f| f.done().map_err(Error::from));
                b.qmp()
                    .map(|_| ())
                    .and(copied)
                    .map_err(|e| explain(e, &b))?;
                tracing::debug!(took = ?t.elapsed(), "microVM: QEMU and its memory ready");
                b.qmp()
                    .and_then(|q| snapshot::resume(q, INCOMING_FD))
                    .map_err(|e| explain(e, &b))?;
                tracing::debug!(took = ?t.elapsed(), "microVM: devices loaded");
                snapshot::go(b.host(), RESTORE_TIMEOUT.min(l.timeout))
                    .map_err(|e| explain(e, &b))?;
                tracing::debug!(took = ?t.elapsed(), "microVM: guest acknowledged its go");
                Ok(b)
            });
        match restored {
            Ok(b) => {
                return Ok(Booted {
                    restored: true,
                    ..b
                });
            }
            Err(e) => {
                tracing::warn!(error = %e, "the microVM did not start from its snapshot; booting it cold");
                l.snapshots.forget(shape);
            }
        }
    }
    // A guest to be saved runs on a memfd of ours, which the snapshot
    // copies; so does one whose share servers map its memory.
    let fresh = match (&l.shape, &l.servers) {
        (None, None) => None,
        _ => Some(ram::fresh(l.memory)?),
    };
    let shared = fresh
        .as_ref()
        .map(|f| f.try_clone().map(Ram::Shared))
        .transpose()?;
    let mut b = start(l, shared, None, None)?;
    snapshot::ready(b.host(), l.timeout).map_err(|e| explain(e, &b))?;
    if let (Some(shape), Some(fresh)) = (&l.shape, &fresh) {
        let taken = b
            .qmp()
            .and_then(|q| l.snapshots.take(shape, q, fresh, l.memory));
        if let Err(e) = taken {
            tracing::warn!(error = %e, "could not snapshot the microVM's boot; the next starts cold too");
        }
    }
    snapshot::go(b.host(), l.timeout).map_err(|e| explain(e, &b))?;
    Ok(b)
}

/// Starts QEMU with `l`'s options, its memory `ram` if a file, restoring
/// `incoming` if given, on a new control channel (a guest resumed from
/// disk: on `control`, the guest's end of the one its session speaks on).
fn start(
    l: &Launch,
    ram: Option<Ram>,
    incoming: Option<std::os::fd::OwnedFd>,
    control: Option<std::os::fd::OwnedFd>,
) -> Result<Booted> {
    let ruleset = crate::supervisor::confine::vmm_ruleset(&l.read, &l.write)?;
    let (host, guest_end) = match control {
        Some(end) => (None, end),
        None => {
            let (host, guest) = std::os::unix::net::UnixStream::pair()?;
            (Some(host), guest.into())
        }
    };
    // Ours too, for a guest that may be paused to disk (see `Suspend`).
    let kept = match (&l.servers, &host) {
        (Some(_), Some(_)) => Some(guest_end.try_clone()?),
        _ => None,
    };
    let kept_ram = match (&l.servers, &ram) {
        (Some(_), Some(Ram::Shared(fd))) => Some(fd.try_clone()?),
        _ => None,
    };
    let (console_host, console_guest) = std::os::unix::net::UnixStream::pair()?;
    let (monitor, monitor_qemu) = std::os::unix::net::UnixStream::pair()?;
    let mut args = l.args.clone();
    args.extend([
        "-chardev".to_string(),
        format!("socket,id=monitor,fd={MONITOR_FD}"),
        "-mon".into(),
        "chardev=monitor,mode=control".into(),
    ]);
    if incoming.is_some() {
        // Loaded over QMP, once told to leave the memory out (`resume`).
        args.extend(["-incoming".to_string(), "defer".into()]);
    }
    let ram = ram.map(|ram| {
        let (fd, share) = match ram {
            Ram::Shared(fd) => (fd, "on"),
            Ram::Private(fd) => (fd, "off"),
        };
        args.extend([
            "-object".to_string(),
            format!(
                "memory-backend-file,id=cordon-ram,size={}M,mem-path=/proc/self/fd/{RAM_FD},share={share}",
                l.memory / MIB
            ),
            "-machine".into(),
            "memory-backend=cordon-ram".into(),
        ]);
        fd
    });
    let qemu = l.qemu.clone();
    let covers = l.covers.clone();
    let servers = l.servers.as_ref().map(|s| {
        (
            s.program.clone(),
            s.shares.clone(),
            s.workspace.clone(),
            s.covers.clone(),
            s.run.clone(),
        )
    });
    let fds = QemuFds {
        control: guest_end,
        console: console_guest.into(),
        monitor: monitor_qemu.into(),
        incoming,
        ram,
        shares: Vec::new(),
    };
    // The servers first, from the launcher thread too (they die with it):
    // QEMU asks them for their features as it starts.
    let (pid, stderr, servers) = launch(move || {
        let mut fds = fds;
        let servers = match servers {
            Some((program, shares, workspace, covers, run)) => {
                let (servers, ends) =
                    virtiofs::start(&program, &shares, &workspace, covers.as_ref(), &run)?;
                fds.shares = ends;
                Some(servers)
            }
            None => None,
        };
        let (pid, stderr) = spawn_qemu(&qemu, &args, fds, ruleset, covers)?;
        Ok((pid, stderr, servers))
    })?;
    let qemu = Started(Some(pid));
    // Watched from now on: a guest that dies while starting must close
    // the channel its start waits on.
    let kept = kept.map(|fd| suspend::KeptControl::new(fd, pid));
    Ok(Booted {
        console: Tail::drain_until_panic(
            console_host.into(),
            "console",
            rustix::process::Pid::from_raw(pid).and_then(|p| {
                rustix::process::pidfd_open(p, rustix::process::PidfdFlags::empty()).ok()
            }),
        )?,
        log: Tail::drain(stderr, "stderr")?,
        qemu,
        host,
        monitor,
        restored: false,
        servers,
        qmp: None,
        control: kept,
        ram: kept_ram,
    })
}

/// `e` with what the guest's console, QEMU and the share servers last
/// said.
fn explain(e: Error, b: &Booted) -> Error {
    let servers = b.servers.as_ref().map(|s| s.explain()).unwrap_or_default();
    Error::Setup {
        message: format!(
            "the microVM did not start: {e}; its console said:\n{}\n{}{}",
            b.console.explain(15),
            b.log.explain(5),
            if servers.is_empty() {
                String::new()
            } else {
                format!("\nvirtiofsd said:\n{servers}")
            }
        ),
        errno: 0,
    }
}
