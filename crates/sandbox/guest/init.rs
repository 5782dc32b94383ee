//! The first process of a cordon microVM guest.
//!
//! Built by the sandbox crate's build script as a small static binary (it
//! runs before any shared library is reachable) and placed in the guest's
//! initramfs as `/init`. It loads the drivers, mounts cordon's own disk
//! (the supervisor, the dynamic loader and the libraries the supervisor
//! links: see microvm/stage.rs) and execs the supervisor through that
//! loader, with the control port on fd 3. The supervisor stays pid 1,
//! holds until the host says go (the host may snapshot the machine there:
//! nothing of the host's is mounted yet, see microvm/snapshot.rs), then
//! mounts the host's shares and does the rest.
//!
//! It is one file of std and a few libc calls on purpose: build.rs compiles
//! it with `rustc` alone, without Cargo or crates.

use std::ffi::{CString, c_char, c_int, c_long, c_ulong, c_void};
use std::io::Write;
use std::os::fd::{AsRawFd, IntoRawFd};
use std::time::{Duration, Instant};

unsafe extern "C" {
    fn mount(
        source: *const c_char,
        target: *const c_char,
        fstype: *const c_char,
        flags: c_ulong,
        data: *const c_void,
    ) -> c_int;
    fn syscall(number: c_long, ...) -> c_long;
    fn reboot(cmd: c_int) -> c_int;
    fn sync();
    fn dup2(old: c_int, new: c_int) -> c_int;
    fn fcntl(fd: c_int, cmd: c_int, ...) -> c_int;
    fn execve(path: *const c_char, argv: *const *const c_char, envp: *const *const c_char) -> c_int;
}

const MS_RDONLY: c_ulong = 1;
const MS_NOSUID: c_ulong = 2;
const MS_NODEV: c_ulong = 4;
const SYS_FINIT_MODULE: c_long = 313;
const RB_POWER_OFF: c_int = 0x4321_fedc;
const EEXIST: i32 = 17;
const EBUSY: i32 = 16;
const F_SETFD: c_int = 2;
/// The control socket's descriptor number, as for the native supervisor.
const CONTROL_FD: c_int = 3;
const SUPERVISOR_GUEST_ARG: &str = "__cordon-guest";
/// cordon's disk and its files, as layout.rs names them.
const GUEST_BIN: &str = "/.cordon/bin";
const GUEST_SUPERVISOR: &str = "supervisor";
const GUEST_LOADER: &str = "ld.so";
const GUEST_LIBS: &str = "lib";
/// Modules the supervisor loads after its hold, as layout.rs names them: a
/// block device's driver reads its capacity when it binds, and each start
/// has disks of its own.
const GUEST_LATE_MODULES: &[&str] = &["virtio_blk.ko"];
/// How long the kernel may take to find cordon's disk (a SCSI scan, under
/// TCG on a loaded host).
const DISK_WAIT: Duration = Duration::from_secs(30);

fn main() {
    if let Err(e) = run() {
        // The console is the serial log the host shows when setup fails.
        let _ = writeln!(std::io::stderr(), "cordon-init: {e}");
        power_off();
    }
}

fn power_off() -> ! {
    // SAFETY: plain syscalls; as init we may power the machine off.
    unsafe {
        sync();
        reboot(RB_POWER_OFF);
    }
    // reboot only returns on failure, and init must never exit.
    loop {
        std::thread::sleep(Duration::from_secs(3600));
    }
}

fn c(s: &str) -> CString {
    CString::new(s).expect("no NUL in fixed strings")
}

fn do_mount(source: &str, target: &str, fstype: &str, flags: c_ulong, data: &str) -> Result<(), String> {
    let _ = std::fs::create_dir_all(target);
    let data = c(data);
    // SAFETY: all pointers are valid NUL-terminated strings for the call.
    let rc = unsafe {
        mount(
            c(source).as_ptr(),
            c(target).as_ptr(),
            c(fstype).as_ptr(),
            flags,
            data.as_ptr().cast(),
        )
    };
    if rc != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(EBUSY) {
            return Err(format!("mount {fstype} {source} on {target}: {e}"));
        }
    }
    Ok(())
}

/// Loads the modules in `order` but [`GUEST_LATE_MODULES`].
fn load_modules() -> Result<(), String> {
    let dir = "/.cordon/modules";
    let order = std::fs::read_to_string(format!("{dir}/order"))
        .map_err(|e| format!("{dir}/order: {e}"))?;
    let names = order.lines().map(str::trim).filter(|l| !l.is_empty());
    for name in names.filter(|n| !GUEST_LATE_MODULES.contains(n)) {
        let path = format!("{dir}/{name}");
        let file = std::fs::File::open(&path).map_err(|e| format!("{path}: {e}"))?;
        let params = c("");
        // SAFETY: a valid descriptor and an empty parameter string.
        let rc = unsafe { syscall(SYS_FINIT_MODULE, file.as_raw_fd(), params.as_ptr(), 0) };
        if rc != 0 {
            let e = std::io::Error::last_os_error();
            if e.raw_os_error() != Some(EEXIST) {
                return Err(format!("load {name}: {e}"));
            }
        }
    }
    Ok(())
}

/// The device of the virtio port named `name`, which appears shortly after
/// its driver loads.
fn find_port(name: &str) -> Result<String, String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/class/virtio-ports") {
            for e in entries.flatten() {
                let found = std::fs::read_to_string(e.path().join("name"))
                    .is_ok_and(|n| n.trim() == name);
                let dev = format!("/dev/{}", e.file_name().to_string_lossy());
                if found && std::path::Path::new(&dev).exists() {
                    return Ok(dev);
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!("no virtio port named {name:?}"));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// cordon's disk: the one SCSI disk, which appears once the kernel's scan
/// finds it.
fn find_disk() -> Result<String, String> {
    let deadline = Instant::now() + DISK_WAIT;
    loop {
        if let Ok(entries) = std::fs::read_dir("/sys/block") {
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let dev = format!("/dev/{name}");
                if name.starts_with("sd") && std::path::Path::new(&dev).exists() {
                    return Ok(dev);
                }
            }
        }
        if Instant::now() > deadline {
            return Err(format!("cordon's disk did not appear in {} s", DISK_WAIT.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

fn run() -> Result<(), String> {
    do_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755")?;
    do_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV, "")?;
    do_mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "")?;
    load_modules()?;
    let port = find_port("cordon")?;
    let ctl = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&port)
        .map_err(|e| format!("{port}: {e}"))?;
    let disk = find_disk()?;
    do_mount(&disk, GUEST_BIN, "ext4", MS_RDONLY | MS_NODEV | MS_NOSUID, "")?;
    let fd = ctl.into_raw_fd();
    // The port must survive the exec as fd 3: dup2 clears close-on-exec on
    // the copy; a port that is already fd 3 has it cleared by hand.
    // SAFETY: plain descriptor calls on a descriptor we own.
    let rc = unsafe {
        if fd == CONTROL_FD {
            fcntl(fd, F_SETFD, 0)
        } else {
            dup2(fd, CONTROL_FD)
        }
    };
    if rc < 0 {
        return Err(format!("control port: {}", std::io::Error::last_os_error()));
    }
    let supervisor = format!("{GUEST_BIN}/{GUEST_SUPERVISOR}");
    let libs = format!("{GUEST_BIN}/{GUEST_LIBS}");
    // A supervisor that links libraries runs through the loader beside it:
    // the one its program header names is on a share not mounted yet.
    let linked = std::fs::read_dir(&libs).is_ok_and(|mut d| d.next().is_some());
    let (path, argv) = if linked {
        (
            format!("{GUEST_BIN}/{GUEST_LOADER}"),
            vec![
                "ld.so",
                "--argv0",
                "cordon-sandbox",
                "--library-path",
                &libs,
                &supervisor,
                SUPERVISOR_GUEST_ARG,
            ],
        )
    } else {
        (supervisor.clone(), vec!["cordon-sandbox", SUPERVISOR_GUEST_ARG])
    };
    let path = c(&path);
    let argv: Vec<CString> = argv.into_iter().map(c).collect();
    let mut argp: Vec<*const c_char> = argv.iter().map(|a| a.as_ptr()).collect();
    argp.push(std::ptr::null());
    let envp = [std::ptr::null()];
    // SAFETY: NULL-terminated arrays of valid strings.
    unsafe { execve(path.as_ptr(), argp.as_ptr(), envp.as_ptr()) };
    Err(format!("exec {supervisor}: {}", std::io::Error::last_os_error()))
}
