//! Pausing a microVM to disk: its devices' state and its memory saved to
//! files, its QEMU and share servers ended, and a new QEMU started on them
//! at the resume, the guest going on where it stood.
//!
//! The rules:
//!
//! - Only a guest whose shares are virtio-fs can be saved (QEMU refuses a
//!   mounted 9p share); its memory is a memfd of ours, so QEMU saves only
//!   its devices (with the virtio-fs servers' open files) and cordon
//!   copies the memory's non-zero pages, as for a snapshot (see
//!   `snapshot`). A guest that cannot be saved is paused in memory.
//! - The session's stream outlives the QEMU: cordon keeps the guest's end
//!   of the control channel and hands it to the next QEMU, so what the
//!   host sends meanwhile waits in the socket, and nothing above the
//!   backend sees the pause but its length. Because that end is held, a
//!   QEMU that exits other than by a save would never close it: a watcher
//!   drops it then, so the session hears the guest's end as before.
//! - The files live in the sandbox's run directory, which only cordon can
//!   name, and go with the sandbox or at the resume. Written under another
//!   name and renamed when complete: what is found under [`PAUSED`] is a
//!   whole save.
//! - The session holds the channel first (`HostMsg::Hold`): nothing is in
//!   flight either way when the guest is saved, so that another process,
//!   on a new channel, can go on with it (`reattach` in the module above).
//! - The guest wakes at the time it was saved; the session sets its clock
//!   again after every resume.

use std::os::fd::OwnedFd;
use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use super::qmp::Qmp;
use super::{INCOMING_FD, Launch, Ram, explain, ram, snapshot, start, virtiofs};
use crate::error::{Error, Result};

/// The run directory's entry that holds a guest saved to disk, and its
/// files: the devices' state (QEMU's migration stream) and the memory.
pub(super) const PAUSED: &str = "paused";
const PARTIAL: &str = "paused.part";
pub(super) const STATE: &str = "state";
pub(super) const RAM: &str = "ram";

/// The guest's end of the control channel, kept by cordon for a guest
/// that may be saved (see the module's rules), with the flag that says a
/// save is ending its QEMU.
pub(super) struct KeptControl {
    fd: Arc<Mutex<Option<OwnedFd>>>,
    saving: Arc<AtomicBool>,
}

impl KeptControl {
    /// Keeps `fd`, and drops it once QEMU `pid` exits other than by a save.
    pub(super) fn new(fd: OwnedFd, pid: i32) -> KeptControl {
        let kept = KeptControl {
            fd: Arc::new(Mutex::new(Some(fd))),
            saving: Arc::new(AtomicBool::new(false)),
        };
        watch(pid, &kept.fd, &kept.saving);
        kept
    }
}

/// Drops `control`'s descriptor once QEMU `pid` exits, unless `saving`.
fn watch(pid: i32, control: &Arc<Mutex<Option<OwnedFd>>>, saving: &Arc<AtomicBool>) {
    let Some(pid) = rustix::process::Pid::from_raw(pid) else {
        return;
    };
    let Ok(fd) = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()) else {
        return;
    };
    let control = control.clone();
    let saving = saving.clone();
    let _ = std::thread::Builder::new()
        .name("cordon-vm-watch".into())
        .spawn(move || {
            let mut fds = [rustix::event::PollFd::new(
                &fd,
                rustix::event::PollFlags::IN,
            )];
            while matches!(
                rustix::event::poll(&mut fds, None),
                Err(rustix::io::Errno::INTR)
            ) {}
            if !saving.load(Ordering::SeqCst) {
                drop(control.lock().unwrap_or_else(|e| e.into_inner()).take());
            }
        });
}

/// What saving a guest to disk and starting it again needs.
pub(super) struct Suspend {
    /// The options its QEMU was started with: the next one's.
    launch: Arc<Launch>,
    /// The guest's end of the control channel (see the module's rules);
    /// None once its QEMU exited by itself.
    control: Arc<Mutex<Option<OwnedFd>>>,
    /// The running QEMU's monitor and memory; None while saved.
    qmp: Mutex<Option<Qmp>>,
    ram: Mutex<Option<OwnedFd>>,
    /// Where it is saved, while it is.
    saved: Mutex<Option<PathBuf>>,
    /// Set while a save ends its QEMU on purpose.
    saving: Arc<AtomicBool>,
}

impl Suspend {
    pub(super) fn new(
        launch: Arc<Launch>,
        control: KeptControl,
        qmp: Option<Qmp>,
        ram: Option<OwnedFd>,
    ) -> Suspend {
        Suspend {
            launch,
            control: control.fd,
            qmp: Mutex::new(qmp),
            ram: Mutex::new(ram),
            saved: Mutex::new(None),
            saving: control.saving,
        }
    }

    /// A guest another process saved at `saved` (see `reattach`), with a
    /// new control channel: its host end is returned, its guest end kept
    /// for the QEMU [`Suspend::restore`] starts.
    pub(super) fn adopt(
        launch: Arc<Launch>,
        saved: PathBuf,
    ) -> Result<(Suspend, std::os::unix::net::UnixStream)> {
        let (host, guest) = std::os::unix::net::UnixStream::pair()?;
        let suspend = Suspend {
            launch,
            control: Arc::new(Mutex::new(Some(guest.into()))),
            qmp: Mutex::new(None),
            ram: Mutex::new(None),
            saved: Mutex::new(Some(saved)),
            saving: Arc::new(AtomicBool::new(false)),
        };
        Ok((suspend, host))
    }

    /// How its QEMU runs.
    pub(super) fn launch(&self) -> &Launch {
        &self.launch
    }

    pub(super) fn is_saved(&self) -> bool {
        self.saved.lock().unwrap().is_some()
    }

    /// Saves the guest into `run_dir` and calls `end` to end its QEMU and
    /// servers. If the save fails the guest goes on, unsaved.
    pub(super) fn save(&self, run_dir: &Path, end: impl FnOnce()) -> Result<()> {
        let mut qmp = self.qmp.lock().unwrap();
        let mut ram = self.ram.lock().unwrap();
        let (Some(q), Some(memfd)) = (qmp.as_mut(), ram.as_ref()) else {
            return Err(Error::Io(std::io::Error::other(
                "the microVM's monitor or memory is not at hand",
            )));
        };
        let part = run_dir.join(PARTIAL);
        let dir = run_dir.join(PAUSED);
        let _ = std::fs::remove_dir_all(&part);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::DirBuilder::new().mode(0o700).create(&part)?;
        let memory = self.launch.memory;
        let written = (|| {
            let state = std::fs::File::create(part.join(STATE))?;
            let copy = std::fs::File::create(part.join(RAM))?;
            copy.set_len(memory)?;
            self.saving.store(true, Ordering::SeqCst);
            snapshot::save_stopped(q, &state, memfd, &copy, memory)?;
            state.sync_all()?;
            copy.sync_all()?;
            std::fs::rename(&part, &dir)?;
            std::fs::File::open(run_dir)?.sync_all()?;
            Ok::<(), Error>(())
        })();
        if let Err(e) = written {
            let _ = snapshot::cont(q);
            self.saving.store(false, Ordering::SeqCst);
            let _ = std::fs::remove_dir_all(&part);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        end();
        *qmp = None;
        // The memory is on disk now; this was its last holder.
        *ram = None;
        *self.saved.lock().unwrap() = Some(dir);
        Ok(())
    }

    /// Starts a QEMU on the saved guest and lets it go on. Returns the
    /// QEMU's pid and its share servers. On failure it stays saved.
    pub(super) fn restore(&self) -> Result<(i32, Option<virtiofs::Servers>)> {
        let dir = self
            .saved
            .lock()
            .unwrap()
            .clone()
            .ok_or_else(|| Error::Io(std::io::Error::other("the microVM is not saved")))?;
        let control = self
            .control
            .lock()
            .unwrap()
            .as_ref()
            .ok_or(Error::Gone)?
            .try_clone()?;
        let l = &self.launch;
        let memfd = ram::fresh(l.memory)?;
        crate::sparse::copy(
            &std::fs::File::open(dir.join(RAM))?,
            &std::fs::File::from(memfd.try_clone()?),
            l.memory,
        )?;
        let state = std::fs::File::open(dir.join(STATE))?;
        self.saving.store(false, Ordering::SeqCst);
        let mut b = start(
            l,
            Some(Ram::Shared(memfd.try_clone()?)),
            Some(state.into()),
            Some(control),
        )?;
        b.qmp()
            .and_then(|q| snapshot::resume(q, INCOMING_FD))
            .map_err(|e| explain(e, &b))?;
        let pid = b.qemu.keep();
        watch(pid, &self.control, &self.saving);
        *self.qmp.lock().unwrap() = b.qmp.take();
        *self.ram.lock().unwrap() = Some(memfd);
        *self.saved.lock().unwrap() = None;
        let _ = std::fs::remove_dir_all(&dir);
        Ok((pid, b.servers.take()))
    }
}
