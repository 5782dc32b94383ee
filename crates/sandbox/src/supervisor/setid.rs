//! Set-id bits under an image root.
//!
//! Everywhere else the seccomp filter refuses set-uid and set-gid modes:
//! files a sandbox writes to its workspace persist on the host, where such
//! a bit would hand the sandbox's identity to whoever runs them. An image's
//! root is different: its writable layer is owned by the sandbox's own
//! host ids and goes with it, and a package manager sets these bits as a
//! matter of course (`chmod 2775 /var/lib/libuuid` in a postinst). So
//! under an image root the chmod calls with those bits are sent to the
//! supervisor (`SECCOMP_RET_USER_NOTIF`), which opens the very object the
//! caller named, checks that it lies on the image's root mount and that
//! the caller may change its mode, and changes it itself; anything else,
//! the workspace first, is refused as before.
//!
//! The supervisor is under the same filter. Its own calls carry a key the
//! filter lets through: 80 random bits in argument bits the kernel ignores
//! (the upper half of `fchmodat2`'s `int dfd`, and the bits of its mode
//! above `umode_t`), chosen per sandbox and held only in the supervisor's
//! memory, which nothing in the sandbox can read.

use std::io::Read;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};

use rustix::fs::{AtFlags, Mode, OFlags};
use rustix::io::Errno;

use super::error::{Result, SetupError};

/// `fchmodat2` (Linux 6.6); the same number on every architecture.
const SYS_FCHMODAT2: u32 = 452;
const SETID: u32 = libc::S_ISUID | libc::S_ISGID;

#[cfg(target_arch = "x86_64")]
const AUDIT_ARCH: u32 = 0xC000_003E;
#[cfg(target_arch = "aarch64")]
const AUDIT_ARCH: u32 = 0xC000_00B7;

/// The calls that set a mode, and which argument holds it.
#[cfg(target_arch = "x86_64")]
const CALLS: &[(u32, usize)] = &[
    (libc::SYS_fchmod as u32, 1),
    (libc::SYS_fchmodat as u32, 2),
    (SYS_FCHMODAT2, 2),
    (libc::SYS_chmod as u32, 1),
];
#[cfg(target_arch = "aarch64")]
const CALLS: &[(u32, usize)] = &[
    (libc::SYS_fchmod as u32, 1),
    (libc::SYS_fchmodat as u32, 2),
    (SYS_FCHMODAT2, 2),
];

const CAP_FOWNER: u32 = 3;
const CAP_FSETID: u32 = 4;

/// The supervisor's end: the listener and the key its own calls carry.
pub(crate) struct Gate {
    listener: OwnedFd,
    key: Key,
    /// The image root's mount: only objects on it may get the bits.
    root_mount: u64,
}

#[derive(Clone, Copy)]
struct Key {
    /// The upper half of `dfd`.
    dfd: u32,
    /// The upper half of the mode's register, and bits 16 to 31 of it.
    mode_hi: u32,
    mode_mid: u16,
}

impl Key {
    fn random() -> Result<Key> {
        let mut b = [0u8; 10];
        let mut filled = 0;
        while filled < b.len() {
            // SAFETY: getrandom into the unfilled part of our buffer.
            let n =
                unsafe { libc::getrandom(b[filled..].as_mut_ptr().cast(), b.len() - filled, 0) };
            if n < 0 {
                return Err(SetupError::io(
                    "random key for the set-id gate",
                    std::io::Error::last_os_error(),
                ));
            }
            filled += n as usize;
        }
        Ok(Key {
            dfd: u32::from_le_bytes([b[0], b[1], b[2], b[3]]),
            mode_hi: u32::from_le_bytes([b[4], b[5], b[6], b[7]]),
            mode_mid: u16::from_le_bytes([b[8], b[9]]),
        })
    }
}

/// A classic BPF instruction.
fn ins(code: u16, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter { code, jt, jf, k }
}

const LD_ABS: u16 = (libc::BPF_LD | libc::BPF_W | libc::BPF_ABS) as u16;
const JEQ: u16 = (libc::BPF_JMP | libc::BPF_JEQ | libc::BPF_K) as u16;
const AND: u16 = (libc::BPF_ALU | libc::BPF_AND | libc::BPF_K) as u16;
const RET: u16 = (libc::BPF_RET | libc::BPF_K) as u16;
const ALLOW: u32 = libc::SECCOMP_RET_ALLOW;
const NOTIFY: u32 = libc::SECCOMP_RET_USER_NOTIF;

/// Offsets in `struct seccomp_data` (little-endian halves of the args).
fn arg_lo(i: usize) -> u32 {
    16 + 8 * i as u32
}
fn arg_hi(i: usize) -> u32 {
    arg_lo(i) + 4
}

/// The filter: each call of [`CALLS`] whose mode has a set-id bit goes to
/// the listener, but for `fchmodat2` carrying `key`.
fn program(key: Key) -> Vec<libc::sock_filter> {
    let mut blocks: Vec<Vec<libc::sock_filter>> = Vec::new();
    for &(nr, m) in CALLS {
        let mut b = vec![
            ins(LD_ABS, 0, 0, arg_lo(m)),
            ins(AND, 0, 0, SETID),
            // No set-id bit: allowed (the next instruction).
            ins(JEQ, 0, 1, 0),
            ins(RET, 0, 0, ALLOW),
        ];
        if nr == SYS_FCHMODAT2 {
            // Three checks, each jumping to the NOTIFY at the end on a
            // mismatch.
            b.extend([
                ins(LD_ABS, 0, 0, arg_hi(0)),
                ins(JEQ, 0, 6, key.dfd),
                ins(LD_ABS, 0, 0, arg_hi(m)),
                ins(JEQ, 0, 4, key.mode_hi),
                ins(LD_ABS, 0, 0, arg_lo(m)),
                ins(AND, 0, 0, 0xFFFF_0000),
                ins(JEQ, 0, 1, u32::from(key.mode_mid) << 16),
                ins(RET, 0, 0, ALLOW),
            ]);
        }
        b.push(ins(RET, 0, 0, NOTIFY));
        // Enter the block on this call, else jump over it.
        let len = b.len() as u8;
        b.insert(0, ins(JEQ, 0, len, nr));
        blocks.push(b);
    }
    let body: Vec<libc::sock_filter> = blocks.into_iter().flatten().collect();
    let mut p = vec![
        ins(LD_ABS, 0, 0, 4),
        // Another architecture: the main filter's business.
        ins(JEQ, 0, (body.len() + 1) as u8, AUDIT_ARCH),
        ins(LD_ABS, 0, 0, 0),
    ];
    p.extend(body);
    p.push(ins(RET, 0, 0, ALLOW));
    p
}

impl Gate {
    /// Installs the filter on this process (and so on everything it
    /// starts) and returns the supervisor's end. Call last: no filter may
    /// be installed after it, and `no_new_privs` must be set.
    pub fn install() -> Result<Gate> {
        let key = Key::random()?;
        let mut prog = program(key);
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_mut_ptr(),
        };
        // SAFETY: seccomp(2) with a valid program that outlives the call.
        let fd = unsafe {
            libc::syscall(
                libc::SYS_seccomp,
                libc::SECCOMP_SET_MODE_FILTER,
                libc::SECCOMP_FILTER_FLAG_NEW_LISTENER,
                &fprog as *const libc::sock_fprog,
            )
        };
        if fd < 0 {
            return Err(SetupError::io(
                "install the set-id gate's seccomp filter",
                std::io::Error::last_os_error(),
            ));
        }
        // SAFETY: seccomp returned a new descriptor we now own.
        let listener = unsafe { OwnedFd::from_raw_fd(fd as RawFd) };
        rustix::io::ioctl_fioclex(&listener)
            .map_err(|e| SetupError::new("close the set-id gate on exec", e))?;
        let root_mount = mount_id(&rustix::fs::CWD, "/")
            .map_err(|e| SetupError::new("the image root's mount", e))?;
        Ok(Gate {
            listener,
            key,
            root_mount,
        })
    }

    pub fn fd(&self) -> RawFd {
        self.listener.as_raw_fd()
    }

    /// Answers one waiting call (the listener was readable).
    pub fn handle(&self) {
        // SAFETY: zeroed plain data, as SECCOMP_IOCTL_NOTIF_RECV wants.
        let mut req: libc::seccomp_notif = unsafe { std::mem::zeroed() };
        // SAFETY: ioctl with a pointer to a struct of the size it expects.
        if unsafe { libc::ioctl(self.fd(), libc::SECCOMP_IOCTL_NOTIF_RECV, &mut req) } != 0 {
            // Gone before we looked (the caller was killed).
            return;
        }
        let error = match self.decide(&req) {
            Ok(()) => 0,
            Err(e) => e.raw_os_error(),
        };
        let mut resp = libc::seccomp_notif_resp {
            id: req.id,
            val: 0,
            error: -error,
            flags: 0,
        };
        // SAFETY: ioctl with a pointer to a struct of the size it expects;
        // a failure means the caller is gone.
        unsafe { libc::ioctl(self.fd(), libc::SECCOMP_IOCTL_NOTIF_SEND, &mut resp) };
    }

    /// Whether the call `req` describes is still waiting: checked after
    /// looking at its process through its pid, which could otherwise have
    /// been reused by another.
    fn still_waiting(&self, id: u64) -> bool {
        let mut id = id;
        // SAFETY: ioctl with a pointer to a u64.
        unsafe { libc::ioctl(self.fd(), libc::SECCOMP_IOCTL_NOTIF_ID_VALID, &mut id) == 0 }
    }

    fn decide(&self, req: &libc::seccomp_notif) -> std::result::Result<(), Errno> {
        let tid = req.pid;
        let args = req.data.args;
        let nr = req.data.nr as u32;
        let (mode, target) = match nr {
            n if n == libc::SYS_fchmod as u32 => (args[1], Target::Fd(args[0] as i32)),
            n if n == libc::SYS_fchmodat as u32 => {
                (args[2], Target::At(args[0] as i32, args[1], 0))
            }
            SYS_FCHMODAT2 => (args[2], Target::At(args[0] as i32, args[1], args[3] as u32)),
            #[cfg(target_arch = "x86_64")]
            n if n == libc::SYS_chmod as u32 => (args[1], Target::At(libc::AT_FDCWD, args[0], 0)),
            _ => return Err(Errno::PERM),
        };
        let mut mode = (mode as u32) & 0o7777;
        let obj = target.open(tid)?;
        let creds = Creds::of(tid)?;
        if !self.still_waiting(req.id) {
            return Err(Errno::SRCH);
        }
        if mount_id(&obj, "").map_err(|_| Errno::PERM)? != self.root_mount {
            // The workspace, a bind, /tmp: the bits would outlive the
            // sandbox (or mean nothing); refused as everywhere.
            return Err(Errno::PERM);
        }
        let st = rustix::fs::fstat(&obj)?;
        if creds.fsuid != st.st_uid && !creds.has(CAP_FOWNER) {
            return Err(Errno::PERM);
        }
        if creds.fsgid != st.st_gid && !creds.has(CAP_FSETID) {
            // As the kernel does: the bit is dropped, with no error.
            mode &= !libc::S_ISGID;
        }
        self.chmod(&obj, mode)
    }

    /// `fchmodat2` on `obj` with the key the filter lets through.
    fn chmod(&self, obj: &OwnedFd, mode: u32) -> std::result::Result<(), Errno> {
        let path = format!("/proc/self/fd/{}\0", obj.as_raw_fd());
        let dfd = (u64::from(self.key.dfd) << 32) | u64::from(libc::AT_FDCWD as u32);
        let mode = (u64::from(self.key.mode_hi) << 32)
            | (u64::from(self.key.mode_mid) << 16)
            | u64::from(mode);
        // SAFETY: fchmodat2 with a NUL-terminated path; the kernel reads
        // dfd as an int and the mode as a umode_t, ignoring the key's bits.
        let rc = unsafe { libc::syscall(SYS_FCHMODAT2 as i64, dfd, path.as_ptr(), mode, 0u64) };
        if rc < 0 {
            return Err(
                Errno::from_io_error(&std::io::Error::last_os_error()).unwrap_or(Errno::PERM)
            );
        }
        Ok(())
    }
}

/// What a call names.
enum Target {
    Fd(i32),
    /// A directory descriptor, the address of a path, and the flags.
    At(i32, u64, u32),
}

impl Target {
    /// The object itself, by an `O_PATH` handle, opened through the
    /// caller's descriptors and working directory as the caller would
    /// reach it (the supervisor shares its root).
    fn open(&self, tid: u32) -> std::result::Result<OwnedFd, Errno> {
        let proc_open = |p: String, dir: bool| {
            let mut f = OFlags::PATH | OFlags::CLOEXEC;
            if dir {
                f |= OFlags::DIRECTORY;
            }
            rustix::fs::open(p, f, Mode::empty())
        };
        match *self {
            Target::Fd(fd) => proc_open(format!("/proc/{tid}/fd/{fd}"), false),
            Target::At(dfd, addr, flags) => {
                let path = read_path(tid, addr)?;
                let base = if dfd == libc::AT_FDCWD {
                    proc_open(format!("/proc/{tid}/cwd"), true)?
                } else {
                    proc_open(format!("/proc/{tid}/fd/{dfd}"), false)?
                };
                if path.is_empty() {
                    return if flags & libc::AT_EMPTY_PATH as u32 != 0 {
                        Ok(base)
                    } else {
                        Err(Errno::NOENT)
                    };
                }
                let mut f = OFlags::PATH | OFlags::CLOEXEC;
                if flags & libc::AT_SYMLINK_NOFOLLOW as u32 != 0 {
                    f |= OFlags::NOFOLLOW;
                }
                rustix::fs::openat(&base, path.as_slice(), f, Mode::empty())
            }
        }
    }
}

/// The NUL-terminated path at `addr` in the memory of `tid`.
fn read_path(tid: u32, addr: u64) -> std::result::Result<Vec<u8>, Errno> {
    let mem = std::fs::File::open(format!("/proc/{tid}/mem")).map_err(|_| Errno::PERM)?;
    let mut buf = vec![0u8; libc::PATH_MAX as usize];
    let mut got = 0;
    while got < buf.len() {
        // SAFETY: pread into our buffer's unfilled part.
        let n = unsafe {
            libc::pread(
                mem.as_raw_fd(),
                buf[got..].as_mut_ptr().cast(),
                buf.len() - got,
                (addr + got as u64) as libc::off_t,
            )
        };
        if n <= 0 {
            break;
        }
        got += n as usize;
        if buf[..got].contains(&0) {
            break;
        }
    }
    let end = buf[..got]
        .iter()
        .position(|&b| b == 0)
        .ok_or(Errno::NAMETOOLONG)?;
    buf.truncate(end);
    Ok(buf)
}

/// The caller's file-system ids and effective capabilities.
struct Creds {
    fsuid: u32,
    fsgid: u32,
    cap_eff: u64,
}

impl Creds {
    fn of(tid: u32) -> std::result::Result<Creds, Errno> {
        let mut text = String::new();
        std::fs::File::open(format!("/proc/{tid}/status"))
            .and_then(|f| f.take(16 << 10).read_to_string(&mut text))
            .map_err(|_| Errno::SRCH)?;
        let field = |name: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().collect::<Vec<_>>())
        };
        // Uid: real effective saved fs.
        let fs_id = |name: &str| -> std::result::Result<u32, Errno> {
            field(name)
                .and_then(|v| v.get(3)?.parse().ok())
                .ok_or(Errno::SRCH)
        };
        let cap_eff = field("CapEff:")
            .and_then(|v| u64::from_str_radix(v.first()?, 16).ok())
            .ok_or(Errno::SRCH)?;
        Ok(Creds {
            fsuid: fs_id("Uid:")?,
            fsgid: fs_id("Gid:")?,
            cap_eff,
        })
    }

    fn has(&self, cap: u32) -> bool {
        self.cap_eff & (1 << cap) != 0
    }
}

/// The mount id of `path` under `dir` (`""`: `dir` itself).
fn mount_id(dir: &impl AsFd, path: &str) -> rustix::io::Result<u64> {
    let flags = if path.is_empty() {
        AtFlags::EMPTY_PATH
    } else {
        AtFlags::empty()
    };
    let stx = rustix::fs::statx(dir, path, flags, rustix::fs::StatxFlags::MNT_ID)?;
    Ok(stx.stx_mnt_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs `prog` over a `seccomp_data` of `nr`, `args`, as the kernel
    /// would (the few instructions the program uses).
    fn run(prog: &[libc::sock_filter], arch: u32, nr: u32, args: [u64; 6]) -> u32 {
        let mut data = Vec::new();
        data.extend(nr.to_le_bytes());
        data.extend(arch.to_le_bytes());
        data.extend(0u64.to_le_bytes());
        for a in args {
            data.extend(a.to_le_bytes());
        }
        let (mut pc, mut acc) = (0usize, 0u32);
        loop {
            let i = prog[pc];
            pc += 1;
            match i.code {
                LD_ABS => {
                    let k = i.k as usize;
                    acc = u32::from_le_bytes(data[k..k + 4].try_into().unwrap());
                }
                AND => acc &= i.k,
                JEQ => pc += usize::from(if acc == i.k { i.jt } else { i.jf }),
                RET => return i.k,
                c => panic!("unexpected instruction {c:#x}"),
            }
        }
    }

    #[test]
    fn set_id_modes_go_to_the_supervisor_unless_keyed() {
        let key = Key {
            dfd: 0xDEAD_BEEF,
            mode_hi: 0x1234_5678,
            mode_mid: 0x9ABC,
        };
        let p = program(key);
        let fchmod = libc::SYS_fchmod as u32;
        let at = libc::AT_FDCWD as u32 as u64;
        let keyed_dfd = (u64::from(key.dfd) << 32) | at;
        let keyed_mode =
            |m: u64| (u64::from(key.mode_hi) << 32) | (u64::from(key.mode_mid) << 16) | m;
        assert_eq!(run(&p, AUDIT_ARCH, fchmod, [3, 0o755, 0, 0, 0, 0]), ALLOW);
        assert_eq!(run(&p, AUDIT_ARCH, fchmod, [3, 0o4755, 0, 0, 0, 0]), NOTIFY);
        assert_eq!(run(&p, AUDIT_ARCH, fchmod, [3, 0o2775, 0, 0, 0, 0]), NOTIFY);
        let fchmodat = libc::SYS_fchmodat as u32;
        assert_eq!(
            run(&p, AUDIT_ARCH, fchmodat, [at, 0, 0o2775, 0, 0, 0]),
            NOTIFY
        );
        assert_eq!(
            run(&p, AUDIT_ARCH, fchmodat, [at, 0, 0o775, 0, 0, 0]),
            ALLOW
        );
        // fchmodat2: the key, whole, lets the supervisor's own call by.
        let f2 = SYS_FCHMODAT2;
        assert_eq!(
            run(
                &p,
                AUDIT_ARCH,
                f2,
                [keyed_dfd, 0, keyed_mode(0o4755), 0, 0, 0]
            ),
            ALLOW
        );
        assert_eq!(
            run(&p, AUDIT_ARCH, f2, [at, 0, keyed_mode(0o4755), 0, 0, 0]),
            NOTIFY
        );
        assert_eq!(
            run(&p, AUDIT_ARCH, f2, [keyed_dfd, 0, 0o4755, 0, 0, 0]),
            NOTIFY
        );
        let wrong_mid = keyed_mode(0o4755) ^ (1 << 20);
        assert_eq!(
            run(&p, AUDIT_ARCH, f2, [keyed_dfd, 0, wrong_mid, 0, 0, 0]),
            NOTIFY
        );
        let wrong_hi = keyed_mode(0o4755) ^ (1 << 40);
        assert_eq!(
            run(&p, AUDIT_ARCH, f2, [keyed_dfd, 0, wrong_hi, 0, 0, 0]),
            NOTIFY
        );
        assert_eq!(run(&p, AUDIT_ARCH, f2, [at, 0, 0o644, 0, 0, 0]), ALLOW);
        // Other calls and architectures are the main filter's business.
        assert_eq!(run(&p, AUDIT_ARCH, libc::SYS_getpid as u32, [0; 6]), ALLOW);
        assert_eq!(run(&p, 0x4000_0003, fchmod, [3, 0o4755, 0, 0, 0, 0]), ALLOW);
    }
}
