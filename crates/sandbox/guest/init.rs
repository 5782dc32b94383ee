//! The first process of a cordon microVM guest.
//!
//! Built by the sandbox crate's build script as a small static binary (it
//! runs before any shared library is reachable) and placed in the guest's
//! initramfs as `/init`. It loads the virtio drivers, opens the control
//! port and holds there until the host says go (the host may snapshot the
//! machine at that point: nothing of the host's is mounted yet, see
//! microvm/snapshot.rs), mixes the entropy the host sent into the kernel's
//! pool, mounts the host's system directories and cordon's own binary over
//! 9p and execs the supervisor, which stays pid 1 and does the rest.
//!
//! It is one file of std and a few libc calls on purpose: build.rs compiles
//! it with `rustc` alone, without Cargo or crates.
//!
//! Kernel command line parameters it reads (from /proc/cmdline):
//! - `cordon.ro=TAG,TAG`: 9p shares mounted read-only at `/TAG`;
//! - `cordon.bin=NAME`: the supervisor's file name in the `cordon` share.

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
    fn ioctl(fd: c_int, request: c_ulong, ...) -> c_int;
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
/// The start handshake, as microvm/snapshot.rs speaks it: init writes
/// READY, reads GO and the seed, answers ACK.
const READY: &[u8; 8] = b"cordon:R";
const GO: &[u8; 8] = b"cordon:G";
const ACK: &[u8; 8] = b"cordon:A";
const SEED_LEN: usize = 32;
/// Modules loaded after the hold: a block device's driver reads its
/// capacity when it binds, and each start has disks of its own.
const LATE_MODULES: &[&str] = &["virtio_blk.ko"];
/// `RNDADDENTROPY` and `RNDRESEEDCRNG` (linux/random.h).
const RNDADDENTROPY: c_ulong = 0x4008_5203;
const RNDRESEEDCRNG: c_ulong = 0x5207;
/// 9p options: a large message size, and the page cache for read-only
/// trees that do not change while the guest runs.
const RO_OPTS: &str = "trans=virtio,version=9p2000.L,cache=loose,msize=512000";

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

/// Loads the modules in `order`, those of [`LATE_MODULES`] only if `late`.
fn load_modules(late: bool) -> Result<(), String> {
    let dir = "/.cordon/modules";
    let order = std::fs::read_to_string(format!("{dir}/order"))
        .map_err(|e| format!("{dir}/order: {e}"))?;
    let names = order.lines().map(str::trim).filter(|l| !l.is_empty());
    for name in names.filter(|n| LATE_MODULES.contains(n) == late) {
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

/// Tells the host init is ready, waits for its go and mixes the seed that
/// comes with it into the kernel's pool, reseeding at once: every guest
/// started from one snapshot would otherwise draw the same random numbers.
fn hold(port: &mut std::fs::File) -> Result<(), String> {
    use std::io::Read;
    let io = |e: std::io::Error| format!("control port: {e}");
    port.write_all(READY).map_err(io)?;
    let mut go = [0u8; 8 + SEED_LEN];
    port.read_exact(&mut go).map_err(io)?;
    if &go[..8] != GO {
        return Err("control port: the host did not say go".into());
    }
    // struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
    let mut info = Vec::with_capacity(8 + SEED_LEN);
    info.extend_from_slice(&((SEED_LEN * 8) as i32).to_ne_bytes());
    info.extend_from_slice(&(SEED_LEN as i32).to_ne_bytes());
    info.extend_from_slice(&go[8..]);
    let random = std::fs::File::open("/dev/urandom").map_err(|e| format!("/dev/urandom: {e}"))?;
    // SAFETY: the request's argument is the rand_pool_info built above.
    let rc = unsafe {
        let rc = ioctl(random.as_raw_fd(), RNDADDENTROPY, info.as_ptr());
        if rc == 0 { ioctl(random.as_raw_fd(), RNDRESEEDCRNG) } else { rc }
    };
    if rc != 0 {
        return Err(format!("seeding the kernel's random pool: {}", std::io::Error::last_os_error()));
    }
    port.write_all(ACK).map_err(io)
}

fn run() -> Result<(), String> {
    do_mount("devtmpfs", "/dev", "devtmpfs", MS_NOSUID, "mode=0755")?;
    do_mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV, "")?;
    do_mount("sysfs", "/sys", "sysfs", MS_NOSUID | MS_NODEV | MS_RDONLY, "")?;
    load_modules(false)?;
    let port = find_port("cordon")?;
    let mut ctl = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&port)
        .map_err(|e| format!("{port}: {e}"))?;
    hold(&mut ctl)?;
    load_modules(true)?;
    let cmdline = std::fs::read_to_string("/proc/cmdline").map_err(|e| format!("/proc/cmdline: {e}"))?;
    let param = |key: &str| {
        cmdline
            .split_whitespace()
            .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
            .map(str::to_string)
    };
    for tag in param("cordon.ro").unwrap_or_default().split(',').filter(|t| !t.is_empty()) {
        do_mount(tag, &format!("/{tag}"), "9p", MS_RDONLY | MS_NODEV, RO_OPTS)?;
    }
    do_mount("cordon", "/.cordon/bin", "9p", MS_RDONLY | MS_NODEV | MS_NOSUID, RO_OPTS)?;
    let bin = param("cordon.bin").ok_or("no cordon.bin= on the kernel command line")?;
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
    let path = c(&format!("/.cordon/bin/{bin}"));
    let arg0 = c("cordon-sandbox");
    let arg1 = c(SUPERVISOR_GUEST_ARG);
    let argv = [arg0.as_ptr(), arg1.as_ptr(), std::ptr::null()];
    let envp = [std::ptr::null()];
    // SAFETY: NULL-terminated arrays of valid strings.
    unsafe { execve(path.as_ptr(), argv.as_ptr(), envp.as_ptr()) };
    Err(format!(
        "exec /.cordon/bin/{bin}: {}",
        std::io::Error::last_os_error()
    ))
}
