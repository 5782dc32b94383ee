//! The inner supervisor's event loop: one thread, `poll(2)` over the control
//! socket, a signalfd for SIGCHLD and every running command's pipes.
//!
//! Single-threaded on purpose: it makes `fork` safe, keeps memory per
//! sandbox small and leaves no locks to get wrong.

use std::collections::{BTreeMap, HashMap};
use std::ffi::OsStr;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::relay::{NetTag, Relay};
use crate::protocol::{
    self, CHUNK, ExecSpec, ExitStatus, HostMsg, ReadyInfo, SpawnStage, Stream, SupMsg, WINDOW,
    WinSize,
};

/// After the command exits, how long its pipes may stay silent before the
/// exec is reported finished even though a background process holds them.
/// The user and group commands run as, where that is not the supervisor's
/// own: an image's `User`, under an image root whose supervisor is root.
static COMMAND_IDS: std::sync::OnceLock<(u32, u32)> = std::sync::OnceLock::new();

/// Runs every command as `uid` and `gid` (not root: they lose root's
/// capabilities at the switch, as anywhere).
pub(super) fn run_commands_as(uid: u32, gid: u32) {
    if (uid, gid) != (0, 0) {
        let _ = COMMAND_IDS.set((uid, gid));
    }
}

/// Under an image root, the set-id gate the loop answers (see `setid`).
static SETID_GATE: std::sync::OnceLock<super::setid::Gate> = std::sync::OnceLock::new();

pub(super) fn gate_setid(gate: super::setid::Gate) {
    let _ = SETID_GATE.set(gate);
}

const LINGER: Duration = Duration::from_millis(100);
/// Upper bound on waiting for a background writer that keeps talking.
const LINGER_MAX: Duration = Duration::from_secs(2);
/// Stop reading commands' output while this much is queued for the host.
const OUTBUF_HIGH: usize = 4 << 20;

struct Exec {
    pid: i32,
    start: Instant,
    deadline: Option<Instant>,
    /// stdout and stderr; a pty exec has only the master in slot 0.
    out: [Option<OwnedFd>; 2],
    stdin: Option<OwnedFd>,
    stdin_buf: Vec<u8>,
    stdin_eof: bool,
    pty: bool,
    unacked: u64,
    delivered: [u64; 2],
    total: [u64; 2],
    limit: Option<u64>,
    status: Option<ExitStatus>,
    exited_at: Option<Instant>,
    linger_until: Option<Instant>,
    timed_out: bool,
    /// The kernel's OOM-kill count when the command started, in a microVM
    /// guest, where the whole kernel is the sandbox's.
    oom_at_start: Option<u64>,
    /// Started for a host that has gone (see `HostMsg::Reattach`): it runs
    /// on, its output read and dropped, its end told to no one.
    orphan: bool,
}

impl Exec {
    fn streams_open(&self) -> bool {
        self.out.iter().any(Option::is_some)
    }

    fn can_read(&self) -> bool {
        self.orphan || self.unacked < WINDOW
    }
}

#[derive(Clone, Copy)]
enum Tag {
    Ctl,
    Sig,
    Setid,
    Out(u64, usize),
    In(u64),
    Net(NetTag),
    Fs,
    Watch(u64),
}

struct Server {
    /// The control channel: a socket (native) or a virtio port (microvm).
    ctl: OwnedFd,
    inbuf: Vec<u8>,
    outbuf: Vec<u8>,
    execs: BTreeMap<u64, Exec>,
    by_pid: HashMap<i32, u64>,
    sigfd: OwnedFd,
    /// Connections over the control channel: the host's dials, and a
    /// microVM guest's proxy connections with egress.
    relay: Relay,
    /// The file system operations' thread, once one is asked for.
    fs: Option<super::fs::FsWorker>,
    /// Directories watched for the host.
    watches: super::watch::Watches,
    /// While held (see `HostMsg::Hold`): how many bytes of `outbuf` may
    /// still be written, the `Held` frame last.
    hold: Option<usize>,
    /// What setup reported, told again to a host that reattaches.
    ready: ReadyInfo,
    /// The highest id any host used: a new host's start above it.
    max_id: u64,
    /// Answers to ids below this were asked by a host that has gone.
    floor: u64,
}

/// Serves the host over `ctl` until it goes; `relay`: the guest's proxy
/// listener, whose connections go to the host's broker over `ctl`.
pub fn serve(ctl: OwnedFd, relay: Option<OwnedFd>, ready: ReadyInfo) -> ! {
    let sigfd = match sigchld_fd() {
        Ok(fd) => fd,
        Err(_) => super::exit_now(1),
    };
    set_nonblocking(&ctl);
    let mut server = Server {
        ctl,
        inbuf: Vec::new(),
        outbuf: Vec::new(),
        execs: BTreeMap::new(),
        by_pid: HashMap::new(),
        sigfd,
        relay: Relay::new(relay),
        fs: None,
        watches: Default::default(),
        hold: None,
        ready,
        max_id: 0,
        floor: 0,
    };
    server.run()
}

fn sigchld_fd() -> io::Result<OwnedFd> {
    // SAFETY: plain signal-mask and signalfd calls on a local sigset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigaddset(&mut set, libc::SIGCHLD);
        if libc::sigprocmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) != 0 {
            return Err(io::Error::last_os_error());
        }
        let fd = libc::signalfd(-1, &set, libc::SFD_CLOEXEC | libc::SFD_NONBLOCK);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(OwnedFd::from_raw_fd(fd))
    }
}

fn set_nonblocking(fd: &impl AsFd) {
    let flags = rustix::fs::fcntl_getfl(fd).unwrap_or(rustix::fs::OFlags::empty());
    let _ = rustix::fs::fcntl_setfl(fd, flags | rustix::fs::OFlags::NONBLOCK);
}

fn read_fd(fd: RawFd, buf: &mut [u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for writes of its length.
    let n = unsafe { libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

fn write_fd(fd: RawFd, buf: &[u8]) -> io::Result<usize> {
    // SAFETY: buf is valid for reads of its length.
    let n = unsafe { libc::write(fd, buf.as_ptr().cast(), buf.len()) };
    if n < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(n as usize)
    }
}

/// What the sandbox's processes use: the CPU time of every process in
/// its pid namespace (this one's own with its reaped children's, which are
/// every process that ended, it being init), and the kernel's memory.
fn usage() -> crate::protocol::GuestUsage {
    // SAFETY: plain sysconf.
    let tick = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
    let ticks = |stat: &str, fields: &[usize]| -> u64 {
        // The fields after the command's name, which may hold anything.
        let Some((_, rest)) = stat.rsplit_once(')') else {
            return 0;
        };
        let f: Vec<&str> = rest.split_whitespace().collect();
        fields
            .iter()
            .filter_map(|&i| f.get(i - 3)?.parse::<u64>().ok())
            .sum()
    };
    let own = std::process::id();
    let mut total = std::fs::read_to_string("/proc/self/stat")
        .map(|s| ticks(&s, &[14, 15, 16, 17]))
        .unwrap_or(0);
    let mut processes = 0u32;
    let mut resident = 0u64;
    // SAFETY: plain sysconf.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(1) as u64;
    if let Ok(dir) = std::fs::read_dir("/proc") {
        for e in dir.flatten() {
            let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
                continue;
            };
            if pid == own {
                continue;
            }
            if let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) {
                total += ticks(&stat, &[14, 15]);
                processes += 1;
                // Field 24, rss, in pages.
                resident += ticks(&stat, &[24]) * page;
            }
        }
    }
    let (mut memory_total, mut available) = (0u64, 0u64);
    if let Ok(info) = std::fs::read_to_string("/proc/meminfo") {
        for line in info.lines() {
            let kb = |l: &str| {
                l.split_whitespace()
                    .nth(1)
                    .and_then(|v| v.parse::<u64>().ok())
                    .unwrap_or(0)
                    * 1024
            };
            if line.starts_with("MemTotal:") {
                memory_total = kb(line);
            } else if line.starts_with("MemAvailable:") {
                available = kb(line);
            }
        }
    }
    crate::protocol::GuestUsage {
        cpu_ns: total * (1_000_000_000 / tick),
        processes,
        memory_used: memory_total.saturating_sub(available),
        memory_total,
        resident,
    }
}

/// The guest kernel's OOM kills so far (`oom_kill` in /proc/vmstat); only
/// in a microVM, where the host cannot see them. Natively the host reads
/// the sandbox's cgroup instead.
fn guest_oom_kills() -> Option<u64> {
    if !super::IN_GUEST.load(std::sync::atomic::Ordering::Relaxed) {
        return None;
    }
    std::fs::read_to_string("/proc/vmstat")
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))?
        .trim()
        .parse()
        .ok()
}

/// Kills every process in the sandbox (pid 1 is spared by `kill(-1)`) and
/// exits, which tears the namespaces down; in a microVM, powers it off.
fn exit_all() -> ! {
    // SAFETY: signalling; we are pid 1 of our own pid namespace.
    unsafe {
        libc::kill(-1, libc::SIGKILL);
    }
    super::end_sandbox();
}

/// How long a shutdown waits for the killed processes to be reaped before
/// it exits without `SupMsg::Ended` (one stuck in the kernel): the host
/// then waits for the namespaces' own end.
const END_WAIT: Duration = Duration::from_secs(1);

fn pfd(fd: RawFd, events: i16) -> libc::pollfd {
    libc::pollfd {
        fd,
        events,
        revents: 0,
    }
}

/// Waits until `fd` has `events` or `left` has passed (at least 1 ms).
fn wait_for(fd: RawFd, events: i16, left: Duration) {
    let mut fds = [pfd(fd, events)];
    // SAFETY: a valid array of one pollfd.
    unsafe { libc::poll(fds.as_mut_ptr(), 1, left.as_millis().max(1) as i32) };
}

impl Server {
    /// `HostMsg::Shutdown`: kills every process, reaps them all (each is
    /// ours once its parent has gone), syncs a guest's file systems, tells
    /// the host, and exits.
    fn end_all(&mut self) -> ! {
        // SAFETY: signalling; we are pid 1 of our own pid namespace.
        unsafe {
            libc::kill(-1, libc::SIGKILL);
        }
        let deadline = Instant::now() + END_WAIT;
        let all_gone = loop {
            let mut status = 0;
            // SAFETY: reaping any child; we are the sandbox's init.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG | libc::__WALL) };
            if pid > 0 {
                continue;
            }
            if pid < 0 && io::Error::last_os_error().raw_os_error() != Some(libc::EINTR) {
                // ECHILD: nothing is left.
                break true;
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if pid == 0 && left.is_zero() {
                break false;
            }
            // Until a child changes state (SIGCHLD, which is blocked and
            // read from the signalfd), or the deadline.
            wait_for(self.sigfd.as_raw_fd(), libc::POLLIN, left);
            let mut info = [0u8; 128];
            while read_fd(self.sigfd.as_raw_fd(), &mut info).is_ok() {}
        };
        if all_gone {
            if super::IN_GUEST.load(std::sync::atomic::Ordering::Relaxed) {
                // What they wrote reaches the host's side of the shares.
                rustix::fs::sync();
            }
            self.hold = None;
            self.send(&SupMsg::Ended);
            self.flush_until(deadline + END_WAIT);
        }
        super::end_sandbox();
    }

    /// Writes what is queued, waiting for room until `deadline`.
    fn flush_until(&mut self, deadline: Instant) {
        loop {
            self.flush();
            let left = deadline.saturating_duration_since(Instant::now());
            if self.outbuf.is_empty() || left.is_zero() {
                return;
            }
            wait_for(self.ctl.as_raw_fd(), libc::POLLOUT, left);
        }
    }

    fn send(&mut self, msg: &SupMsg) {
        protocol::encode(msg, &mut self.outbuf);
    }

    fn drain_watches(&mut self) {
        let outbuf = &mut self.outbuf;
        self.watches
            .drain(&mut |m: &SupMsg| protocol::encode(m, outbuf));
    }

    /// Bytes of `outbuf` that may be written now.
    fn writable(&self) -> usize {
        self.hold.unwrap_or(self.outbuf.len())
    }

    fn flush(&mut self) {
        while self.writable() > 0 {
            match write_fd(self.ctl.as_raw_fd(), &self.outbuf[..self.writable()]) {
                Ok(n) => {
                    self.outbuf.drain(..n);
                    if let Some(left) = &mut self.hold {
                        *left -= n;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(_) => exit_all(),
            }
        }
    }

    fn run(&mut self) -> ! {
        let mut buf = vec![0u8; CHUNK];
        loop {
            let now = Instant::now();
            self.enforce_deadlines(now);
            self.finish_completed(now);
            self.flush();

            let mut pfds: Vec<libc::pollfd> = Vec::new();
            let mut tags: Vec<Tag> = Vec::new();
            let ctl_events = if self.writable() == 0 {
                libc::POLLIN
            } else {
                libc::POLLIN | libc::POLLOUT
            };
            pfds.push(pfd(self.ctl.as_raw_fd(), ctl_events));
            tags.push(Tag::Ctl);
            pfds.push(pfd(self.sigfd.as_raw_fd(), libc::POLLIN));
            tags.push(Tag::Sig);
            if let Some(gate) = SETID_GATE.get() {
                pfds.push(pfd(gate.fd(), libc::POLLIN));
                tags.push(Tag::Setid);
            }
            if let Some(fs) = &self.fs {
                pfds.push(pfd(fs.fd(), libc::POLLIN));
                tags.push(Tag::Fs);
            }
            for (fd, id) in self.watches.fds() {
                pfds.push(pfd(fd, libc::POLLIN));
                tags.push(Tag::Watch(id));
            }
            let mut timeout: Option<Duration> = None;
            let mut wake_at = |t: Instant| {
                let d = t.saturating_duration_since(now);
                timeout = Some(timeout.map_or(d, |x| x.min(d)));
            };
            let backlog = self.outbuf.len() >= OUTBUF_HIGH;
            for (&id, ex) in self.execs.iter_mut() {
                let readable = ex.can_read() && !backlog;
                for (i, fd) in ex.out.iter().enumerate() {
                    if let Some(fd) = fd {
                        if readable {
                            pfds.push(pfd(fd.as_raw_fd(), libc::POLLIN));
                            tags.push(Tag::Out(id, i));
                        } else if ex.status.is_some() {
                            // Blocked on the host, not idle: keep waiting.
                            ex.linger_until = Some(now + LINGER);
                        }
                    }
                }
                if let Some(fd) = &ex.stdin
                    && !ex.stdin_buf.is_empty()
                {
                    pfds.push(pfd(fd.as_raw_fd(), libc::POLLOUT));
                    tags.push(Tag::In(id));
                }
                if let Some(d) = ex.deadline
                    && ex.status.is_none()
                {
                    wake_at(d);
                }
                if let Some(l) = ex.linger_until {
                    wake_at(l);
                }
            }
            let mut net = Vec::new();
            self.relay.poll_fds(backlog, &mut net);
            for (fd, events, tag) in net {
                pfds.push(pfd(fd, events));
                tags.push(Tag::Net(tag));
            }
            let ms = timeout.map_or(-1, |d| d.as_millis().min(60_000) as i32 + 1);
            // SAFETY: pfds is a valid array of pollfd of the given length.
            let n = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, ms) };
            if n < 0 {
                continue; // EINTR
            }
            for (p, tag) in pfds.iter().zip(tags) {
                if p.revents == 0 {
                    continue;
                }
                match tag {
                    Tag::Ctl => {
                        if p.revents & libc::POLLOUT != 0 {
                            self.flush();
                        }
                        if p.revents & (libc::POLLIN | libc::POLLHUP | libc::POLLERR) != 0 {
                            self.read_control();
                        }
                    }
                    Tag::Sig => self.reap(),
                    Tag::Setid => {
                        if let Some(gate) = SETID_GATE.get() {
                            gate.handle();
                        }
                    }
                    Tag::Fs => {
                        let answers = self.fs.as_ref().map(|f| f.ready()).unwrap_or_default();
                        // What the operations changed goes first.
                        self.drain_watches();
                        for answer in answers {
                            // A host that has gone asked for it.
                            if matches!(answer, SupMsg::Fs { id, .. } if id < self.floor) {
                                continue;
                            }
                            self.send(&answer);
                        }
                    }
                    Tag::Watch(id) => {
                        let outbuf = &mut self.outbuf;
                        self.watches
                            .read(id, &mut |m: &SupMsg| protocol::encode(m, outbuf));
                    }
                    Tag::Out(id, i) => self.read_output(id, i, &mut buf),
                    Tag::In(id) => self.write_stdin(id),
                    Tag::Net(tag) => {
                        let outbuf = &mut self.outbuf;
                        let mut send = |m: &SupMsg| protocol::encode(m, outbuf);
                        let relay = &mut self.relay;
                        match tag {
                            NetTag::Listen => relay.on_listen(&mut send),
                            NetTag::Read(id) => relay.on_read(id, &mut buf, &mut send),
                            NetTag::Write(id) => relay.on_write(id, &mut send),
                        }
                    }
                }
            }
        }
    }

    fn read_control(&mut self) {
        let mut chunk = [0u8; 65536];
        loop {
            match read_fd(self.ctl.as_raw_fd(), &mut chunk) {
                Ok(0) => exit_all(),
                Ok(n) => self.inbuf.extend_from_slice(&chunk[..n]),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
                Err(_) => exit_all(),
            }
        }
        let mut used = 0;
        loop {
            match protocol::decode::<HostMsg>(&self.inbuf[used..]) {
                Ok(Some((msg, n))) => {
                    used += n;
                    self.handle(msg);
                }
                Ok(None) => break,
                // The host broke the protocol: nothing it asks can be trusted.
                Err(_) => exit_all(),
            }
        }
        self.inbuf.drain(..used);
    }

    fn handle(&mut self, msg: HostMsg) {
        if let HostMsg::Exec(ExecSpec { id, .. })
        | HostMsg::Fs { id, .. }
        | HostMsg::Watch { id, .. }
        | HostMsg::Usage { id }
        | HostMsg::FreezeLayer { id, .. } = &msg
        {
            self.max_id = self.max_id.max(*id);
        }
        match msg {
            HostMsg::Setup(_) => {}
            HostMsg::Hold => {
                // A second hold before a release: the first one stands.
                if self.hold.is_none() {
                    self.send(&SupMsg::Held);
                    self.hold = Some(self.outbuf.len());
                }
            }
            HostMsg::Release => self.hold = None,
            HostMsg::Reattach { seed } => {
                if super::IN_GUEST.load(std::sync::atomic::Ordering::Relaxed)
                    && super::guest::mix_entropy(&seed).is_err()
                {
                    // Its numbers would be another fork's: nothing it
                    // does may be trusted to be its own.
                    exit_all();
                }
                self.reattach();
            }
            HostMsg::NetDial { conn, port } => {
                let outbuf = &mut self.outbuf;
                self.relay
                    .on_dial(conn, port, &mut |m| protocol::encode(m, outbuf));
            }
            HostMsg::NetData { conn, data } => {
                let outbuf = &mut self.outbuf;
                self.relay
                    .on_host_data(conn, data, &mut |m| protocol::encode(m, outbuf));
            }
            HostMsg::NetEof { conn } => self.relay.on_host_eof(conn),
            HostMsg::NetAck { conn, bytes } => self.relay.on_host_ack(conn, bytes),
            HostMsg::NetClose { conn } => self.relay.on_host_close(conn),
            HostMsg::Exec(spec) => self.spawn(spec),
            HostMsg::Stdin { id, data } => {
                let len = data.len() as u64;
                match self.execs.get_mut(&id) {
                    Some(ex) if ex.stdin.is_some() => ex.stdin_buf.extend_from_slice(&data),
                    // Nobody to feed: acknowledge so the host never stalls.
                    _ => self.send(&SupMsg::StdinAck { id, bytes: len }),
                }
            }
            HostMsg::StdinEof { id } => {
                if let Some(ex) = self.execs.get_mut(&id) {
                    ex.stdin_eof = true;
                    if ex.stdin_buf.is_empty() {
                        ex.stdin = None;
                    }
                }
            }
            HostMsg::Ack { id, bytes } => {
                if let Some(ex) = self.execs.get_mut(&id) {
                    let was_blocked = !ex.can_read();
                    ex.unacked = ex.unacked.saturating_sub(bytes);
                    if was_blocked && ex.can_read() && ex.status.is_some() {
                        // What waited in the pipe gets its full linger.
                        ex.linger_until = Some(Instant::now() + LINGER);
                    }
                }
            }
            HostMsg::Signal { id, signal } => {
                if let Some(ex) = self.execs.get(&id)
                    && ex.status.is_none()
                {
                    // SAFETY: signalling the exec's own process group.
                    unsafe {
                        libc::kill(-ex.pid, signal);
                    }
                }
            }
            HostMsg::Resize { id, size } => {
                if let Some(ex) = self.execs.get(&id)
                    && let (true, Some(fd)) = (ex.pty, &ex.out[0])
                {
                    set_winsize(fd, size);
                }
            }
            HostMsg::Shutdown => self.end_all(),
            HostMsg::Watch {
                id,
                path,
                recursive,
            } => {
                let result = self.watches.add(id, &path, recursive);
                self.send(&SupMsg::Watching { id, result });
            }
            HostMsg::Unwatch { id } => self.watches.remove(id),
            HostMsg::Usage { id } => self.send(&SupMsg::Usage { id, usage: usage() }),
            HostMsg::FreezeLayer { id, frozen } => self.send(&SupMsg::LayerFrozen {
                id,
                result: super::guest::freeze_layer(frozen),
            }),
            HostMsg::Fs { id, op, user } => {
                if self.fs.is_none() {
                    self.fs = super::fs::FsWorker::start(COMMAND_IDS.get().copied()).ok();
                }
                match &self.fs {
                    Some(fs) => fs.submit(id, op, user),
                    None => self.send(&SupMsg::Fs {
                        id,
                        result: Err(crate::protocol::FsFailure {
                            kind: crate::protocol::FsErrorKind::Other,
                            message: "the supervisor cannot start its file system thread".into(),
                        }),
                    }),
                }
            }
            HostMsg::SetClock { realtime_ns } => {
                if super::IN_GUEST.load(std::sync::atomic::Ordering::Relaxed) {
                    let ts = libc::timespec {
                        tv_sec: (realtime_ns / 1_000_000_000) as libc::time_t,
                        tv_nsec: (realtime_ns % 1_000_000_000) as libc::c_long,
                    };
                    // Best effort: a wrong clock is no reason to fail.
                    // SAFETY: a valid timespec, read by the call only.
                    unsafe { libc::clock_settime(libc::CLOCK_REALTIME, &ts) };
                }
            }
        }
    }

    /// A new host took over (see `HostMsg::Reattach`): what the old one
    /// started is orphaned, and nothing meant for it is sent.
    fn reattach(&mut self) {
        for ex in self.execs.values_mut() {
            ex.orphan = true;
            ex.stdin = None;
            ex.stdin_buf.clear();
        }
        self.watches = Default::default();
        self.relay.drop_all();
        self.outbuf.clear();
        self.hold = None;
        self.floor = self.max_id.saturating_add(1);
        self.ready.next_id = self.floor;
        let ready = SupMsg::Ready(self.ready.clone());
        self.send(&ready);
    }

    fn spawn(&mut self, spec: ExecSpec) {
        let id = spec.id;
        match start(&spec) {
            Ok(ex) => {
                let pid = ex.pid;
                self.by_pid.insert(pid, id);
                self.execs.insert(id, ex);
                self.send(&SupMsg::Started { id, pid });
            }
            Err((stage, errno, message)) => self.send(&SupMsg::SpawnFailed {
                id,
                stage,
                errno,
                message,
            }),
        }
    }

    fn read_output(&mut self, id: u64, i: usize, buf: &mut [u8]) {
        let Some(ex) = self.execs.get_mut(&id) else {
            return;
        };
        let Some(fd) = &ex.out[i] else { return };
        match read_fd(fd.as_raw_fd(), buf) {
            Ok(0) => ex.out[i] = None,
            Ok(n) => {
                ex.total[i] += n as u64;
                let keep = match ex.limit {
                    Some(limit) => (limit.saturating_sub(ex.delivered[i]) as usize).min(n),
                    None => n,
                };
                if let Some(until) = ex.exited_at.map(|t| t + LINGER_MAX) {
                    ex.linger_until = Some((Instant::now() + LINGER).min(until));
                }
                if keep > 0 && !ex.orphan {
                    ex.delivered[i] += keep as u64;
                    ex.unacked += keep as u64;
                    let stream = if i == 0 {
                        Stream::Stdout
                    } else {
                        Stream::Stderr
                    };
                    let data = buf[..keep].to_vec();
                    self.send(&SupMsg::Output { id, stream, data });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // EIO: the pty's last slave closed. Anything else: give up too.
            Err(_) => ex.out[i] = None,
        }
    }

    fn write_stdin(&mut self, id: u64) {
        let Some(ex) = self.execs.get_mut(&id) else {
            return;
        };
        let Some(fd) = &ex.stdin else { return };
        let mut acked = 0u64;
        match write_fd(fd.as_raw_fd(), &ex.stdin_buf) {
            Ok(n) => {
                ex.stdin_buf.drain(..n);
                acked = n as u64;
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => {
                // EPIPE: the reader is gone; drop the rest but acknowledge it.
                acked = ex.stdin_buf.len() as u64;
                ex.stdin_buf.clear();
                ex.stdin = None;
            }
        }
        if ex.stdin_buf.is_empty() && ex.stdin_eof {
            ex.stdin = None;
        }
        if acked > 0 {
            self.send(&SupMsg::StdinAck { id, bytes: acked });
        }
    }

    fn reap(&mut self) {
        let mut info = [0u8; 128];
        while read_fd(self.sigfd.as_raw_fd(), &mut info).is_ok() {}
        loop {
            let mut status = 0;
            // SAFETY: reaping any child; we are the sandbox's init.
            let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
            if pid <= 0 {
                break;
            }
            let Some(id) = self.by_pid.remove(&pid) else {
                continue;
            };
            if let Some(ex) = self.execs.get_mut(&id) {
                let now = Instant::now();
                ex.status = Some(if libc::WIFSIGNALED(status) {
                    ExitStatus::Signal(libc::WTERMSIG(status))
                } else {
                    ExitStatus::Code(libc::WEXITSTATUS(status))
                });
                ex.exited_at = Some(now);
                ex.linger_until = Some(now + LINGER);
                // Nobody will read more input.
                ex.stdin = None;
                ex.stdin_buf.clear();
            }
        }
    }

    fn enforce_deadlines(&mut self, now: Instant) {
        for ex in self.execs.values_mut() {
            if let Some(d) = ex.deadline
                && ex.status.is_none()
                && !ex.timed_out
                && now >= d
            {
                ex.timed_out = true;
                // SAFETY: signalling the exec's process group and leader.
                unsafe {
                    libc::kill(-ex.pid, libc::SIGKILL);
                    libc::kill(ex.pid, libc::SIGKILL);
                }
            }
        }
    }

    fn finish_completed(&mut self, now: Instant) {
        let done: Vec<u64> = self
            .execs
            .iter()
            .filter(|(_, ex)| {
                // Lingering ends an exec whose streams a background process
                // holds open, but not while the host has yet to take what
                // is already there: a slow reader loses nothing.
                ex.status.is_some()
                    && (!ex.streams_open()
                        || (ex.can_read() && ex.linger_until.is_some_and(|l| now >= l)))
            })
            .map(|(&id, _)| id)
            .collect();
        if !done.is_empty() {
            // What the commands changed goes before their ends.
            self.drain_watches();
        }
        for id in done {
            let Some(ex) = self.execs.remove(&id) else {
                continue;
            };
            if ex.orphan {
                continue;
            }
            let exited = ex.exited_at.unwrap_or(now);
            let truncated = ex.limit.is_some_and(|l| ex.total.iter().any(|&t| t > l));
            self.send(&SupMsg::Exited {
                id,
                status: ex.status.unwrap_or(ExitStatus::Code(-1)),
                duration_us: exited.duration_since(ex.start).as_micros() as u64,
                timed_out: ex.timed_out,
                stdout_bytes: ex.total[0],
                stderr_bytes: ex.total[1],
                truncated,
                oom_killed: matches!(
                    (ex.oom_at_start, guest_oom_kills()),
                    (Some(a), Some(b)) if b > a
                ),
            });
        }
    }
}

fn set_winsize(fd: &OwnedFd, size: WinSize) {
    let ws = rustix::termios::Winsize {
        ws_row: size.rows,
        ws_col: size.cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let _ = rustix::termios::tcsetwinsize(fd, ws);
}

fn open_pty(size: WinSize) -> io::Result<(OwnedFd, OwnedFd)> {
    use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
    let master = openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC)?;
    grantpt(&master)?;
    unlockpt(&master)?;
    let name = ptsname(&master, Vec::new())?;
    let slave = rustix::fs::open(
        name.as_c_str(),
        rustix::fs::OFlags::RDWR | rustix::fs::OFlags::NOCTTY | rustix::fs::OFlags::CLOEXEC,
        rustix::fs::Mode::empty(),
    )?;
    set_winsize(&master, size);
    Ok((master, slave))
}

fn errno_of(e: &io::Error) -> i32 {
    e.raw_os_error().unwrap_or(0)
}

/// Where `program` is found in the command's `PATH` (a file someone may
/// execute), as `execvp` would look; `None` also for a name with a slash.
fn in_path(program: &OsStr, env: &[(String, String)], cwd: &str) -> Option<std::path::PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    if program.as_bytes().contains(&b'/') || program.is_empty() {
        return None;
    }
    let path = env
        .iter()
        .find(|(k, _)| k == "PATH")
        .map_or(DEFAULT_PATH, |(_, v)| v.as_str());
    path.split(':').find_map(|dir| {
        // Relative entries (an empty one too) are the command's working
        // directory's, as for execvp run there.
        let candidate = std::path::Path::new(cwd).join(dir).join(program);
        let meta = std::fs::metadata(&candidate).ok()?;
        (meta.is_file() && meta.permissions().mode() & 0o111 != 0).then_some(candidate)
    })
}

/// What `execvp` searches when the environment has no `PATH`.
const DEFAULT_PATH: &str = "/bin:/usr/bin";

/// Starts one command. Errors say which stage failed, with an errno and a
/// message for a person.
fn start(spec: &ExecSpec) -> Result<Exec, (SpawnStage, i32, String)> {
    let Some(program) = spec.argv.first() else {
        return Err((SpawnStage::Program, libc::EINVAL, "empty command".into()));
    };
    let program = OsStr::from_bytes(program);
    match std::fs::metadata(&spec.cwd) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err((
                SpawnStage::WorkingDirectory,
                libc::ENOTDIR,
                format!("working directory {} is not a directory", spec.cwd),
            ));
        }
        Err(e) => {
            return Err((
                SpawnStage::WorkingDirectory,
                errno_of(&e),
                format!("working directory {}: {e}", spec.cwd),
            ));
        }
    }
    let mut args = &spec.argv[1..];
    let mut cmd = if spec.or_sh {
        match in_path(program, &spec.env, &spec.cwd) {
            Some(found) => {
                let mut cmd = Command::new(found);
                cmd.arg0(program);
                cmd
            }
            None => {
                while let Some(rest) = args
                    .split_first()
                    .filter(|(a, _)| matches!(&a[..], b"--noprofile" | b"--norc"))
                    .map(|(_, rest)| rest)
                {
                    args = rest;
                }
                Command::new("sh")
            }
        }
    } else {
        Command::new(program)
    };
    cmd.args(args.iter().map(|a| OsStr::from_bytes(a)))
        .env_clear()
        .envs(spec.env.iter().map(|(k, v)| (k, v)))
        .current_dir(&spec.cwd);
    if let Some((uid, gid)) = spec.user.or_else(|| COMMAND_IDS.get().copied()) {
        cmd.uid(uid).gid(gid);
    }
    let mut master = None;
    if let Some(size) = spec.pty {
        let (m, slave) = open_pty(size).map_err(|e| {
            (
                SpawnStage::Setup,
                errno_of(&e),
                format!("open a pseudo-terminal: {e}"),
            )
        })?;
        let dup = |fd: &OwnedFd| {
            fd.try_clone()
                .map_err(|e| (SpawnStage::Setup, errno_of(&e), format!("dup: {e}")))
        };
        cmd.stdin(Stdio::from(dup(&slave)?))
            .stdout(Stdio::from(dup(&slave)?))
            .stderr(Stdio::from(slave));
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
        master = Some(m);
    } else {
        cmd.stdin(if spec.stdin {
            Stdio::piped()
        } else {
            Stdio::null()
        })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
        // SAFETY: only async-signal-safe calls between fork and exec.
        unsafe {
            cmd.pre_exec(|| {
                // Own session and process group: signals and timeouts reach
                // the command's whole tree, and no terminal is inherited.
                if libc::setsid() < 0 {
                    return Err(io::Error::last_os_error());
                }
                Ok(())
            });
        }
    }
    let start = Instant::now();
    let mut child = cmd.spawn().map_err(|e| {
        let name = program.to_string_lossy();
        let msg = match e.kind() {
            io::ErrorKind::NotFound => format!("{name}: command not found"),
            io::ErrorKind::PermissionDenied => format!("{name}: permission denied"),
            _ => format!("{name}: {e}"),
        };
        (SpawnStage::Program, errno_of(&e), msg)
    })?;
    let pid = child.id() as i32;
    let (out, stdin) = match master {
        Some(m) => {
            set_nonblocking(&m);
            let input = if spec.stdin { m.try_clone().ok() } else { None };
            ([Some(m), None], input)
        }
        None => {
            let fd = |o: Option<OwnedFd>| o.inspect(set_nonblocking);
            (
                [
                    fd(child.stdout.take().map(OwnedFd::from)),
                    fd(child.stderr.take().map(OwnedFd::from)),
                ],
                fd(child.stdin.take().map(OwnedFd::from)),
            )
        }
    };
    // We reap through SIGCHLD ourselves; std's handle has nothing left to own.
    drop(child);
    Ok(Exec {
        pid,
        start,
        deadline: spec
            .timeout_ms
            .and_then(|ms| start.checked_add(Duration::from_millis(ms))),
        out,
        stdin,
        stdin_buf: Vec::new(),
        stdin_eof: false,
        pty: spec.pty.is_some(),
        unacked: 0,
        delivered: [0; 2],
        total: [0; 2],
        limit: spec.output_limit,
        status: None,
        exited_at: None,
        linger_until: None,
        timed_out: false,
        oom_at_start: guest_oom_kills(),
        orphan: false,
    })
}
