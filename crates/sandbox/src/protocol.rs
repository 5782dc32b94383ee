//! The framed protocol spoken between the host and the in-sandbox supervisor.
//!
//! Every frame is a little-endian `u32` payload length followed by a `postcard`
//! encoding of [`HostMsg`] or [`SupMsg`]. Frames are bounded by [`MAX_FRAME`]
//! so a confused or hostile peer cannot make the other side allocate without
//! limit. Output flows under a per-exec credit window (see [`WINDOW`]) so one
//! chatty command can neither flood the host nor stall other execs.

use serde::{Deserialize, Serialize};

/// Largest payload either side accepts, in bytes.
pub const MAX_FRAME: usize = 1 << 20;

/// Largest data chunk (stdout, stderr or stdin) carried by one frame.
pub const CHUNK: usize = 64 * 1024;

/// Bytes of output (per exec) or stdin (per exec) that may be in flight
/// unacknowledged. The sender pauses once this many bytes are outstanding.
pub const WINDOW: u64 = 512 * 1024;

/// Protocol version; the supervisor refuses a host that speaks another.
pub const VERSION: u32 = 17;

/// Marks the id of a connection the host asked for (`HostMsg::NetDial`), so
/// that it never meets one the guest's proxy listener numbered.
pub const DIAL: u64 = 1 << 63;

/// Which output stream a chunk belongs to: the one spelling of it, from
/// the supervisor's frames to the tools' progress and the server's events
/// (postcard numbers the variants; JSON names them in lower case).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "schema", derive(utoipa::ToSchema))]
#[serde(rename_all = "lowercase")]
pub enum Stream {
    Stdout,
    Stderr,
}

impl Stream {
    /// Its place in a pair kept per stream, `[stdout, stderr]`.
    pub fn index(self) -> usize {
        match self {
            Stream::Stdout => 0,
            Stream::Stderr => 1,
        }
    }
}

/// Which part of starting a command failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SpawnStage {
    /// The program: not found, not executable, bad format.
    Program,
    /// The working directory does not exist or is not a directory.
    WorkingDirectory,
    /// Anything else (a pseudo-terminal, a pipe, a fork).
    Setup,
}

/// How a sandboxed process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ExitStatus {
    /// Exited normally with this code.
    Code(i32),
    /// Killed by this signal number.
    Signal(i32),
}

impl ExitStatus {
    /// The shell convention: the exit code, or 128 + the signal number.
    pub fn code(self) -> i32 {
        match self {
            ExitStatus::Code(c) => c,
            ExitStatus::Signal(s) => 128 + s,
        }
    }

    pub fn success(self) -> bool {
        self == ExitStatus::Code(0)
    }
}

/// A bind mount requested in addition to the fixed layout.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Bind {
    /// Path on the host.
    pub source: String,
    /// Path inside the sandbox.
    pub target: String,
    pub writable: bool,
}

/// Everything the supervisor needs to build the sandbox. Sent once, first.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SetupSpec {
    pub version: u32,
    pub workspace: String,
    /// Files under the workspace, relative to it, that the sandbox sees as
    /// empty and read-only (secret-bearing configuration).
    pub hidden: Vec<String>,
    /// Paths under the workspace, relative to it, shown read-only; their
    /// directories below the workspace are pinned (mounted on themselves)
    /// so that they cannot be renamed away.
    pub read_only: Vec<String>,
    pub binds: Vec<Bind>,
    pub tmp_size: u64,
    pub loopback: bool,
    pub hostname: String,
    /// Outside uid/gid (the caller's) and the ids they appear as inside.
    pub outer_uid: u32,
    pub outer_gid: u32,
    pub inner_uid: u32,
    pub inner_gid: u32,
    /// Limits applied with setrlimit when no cgroup enforces them. In a
    /// microVM, `rlimit_nproc` is the guest's process limit (a cgroup there).
    pub rlimit_memory: Option<u64>,
    pub rlimit_nproc: Option<u64>,
    /// The sandbox's share of the kernel's per-user counts (native only).
    pub user_counts: Option<UserCounts>,
    /// RLIMIT_FSIZE: the largest file any process may write (the disk
    /// budget, so that one file cannot pass it between two looks).
    pub rlimit_fsize: Option<u64>,
    /// The nice value everything in the sandbox runs at (none: the
    /// default), so that a budgeted sandbox writing at full speed on a
    /// busy host does not keep the disk watcher from its next look.
    pub nice: Option<i32>,
    /// Listen on 127.0.0.1 at this port once loopback is up, and hand the
    /// listening socket to the host over the services descriptor (native
    /// only): the broker's one way in.
    pub proxy_port: Option<u16>,
    /// Stay in the host's network namespace (`Network::Full`, native only):
    /// no namespace of its own, the host's resolver configuration.
    pub host_network: bool,
    /// The broker's certificate authority for its secrets' hosts (PEM) and
    /// the host's trust bundle with it appended, written to
    /// `/etc/cordon/ca.pem` and `/etc/cordon/bundle.pem` (native; a
    /// microVM's staged `/etc` gets them from the host).
    pub trust: Option<(String, String)>,
    /// The root file system from an image's layers instead of the host's
    /// (native only; a microVM's guest gets its image on a disk, see
    /// `guest_image`).
    pub image: Option<ImageRoot>,
    /// A microVM guest's root is an image: its flat root on the disk whose
    /// serial is [`crate::layout::IMAGE_DISK`], read-only, under a writable
    /// layer on the disk [`crate::layout::UPPER_DISK`] (microvm only).
    pub guest_image: bool,
}

/// How many ids a sandbox with an image root has inside: 0 to 65535, the
/// range every distribution's packages assume (`nobody` is 65534).
pub const IMAGE_IDS: u32 = 65536;

/// The most layers an image root may have: overlayfs takes its lower
/// directories in one option string of at most a page.
pub const MAX_IMAGE_LAYERS: usize = 128;

/// A root file system made of an image's unpacked layers, read-only and
/// shared, under a writable layer of the sandbox's own (overlayfs).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImageRoot {
    /// The layers' directories on the host, the top layer first.
    pub layers: Vec<String>,
    /// An empty directory of this sandbox's own, on a file system with
    /// user extended attributes, where its writable layer is made.
    pub scratch: String,
    /// Where the ids beyond the caller's own come from.
    pub ids: IdSource,
    /// An ext4 file in `scratch`, as big as the disk budget: the
    /// supervisor (root) mounts it over `scratch` in a mount namespace of
    /// the sandbox's own, so that the writable layer cannot outgrow it.
    pub disk: Option<String>,
    /// A build step's root: no workspace is mounted, `/tmp` is the
    /// image's own, and once the sandbox's last process is gone the outer
    /// supervisor writes the root's changes as a layer (see [`StepOutput`]).
    pub step: Option<StepOutput>,
}

/// Where a build step's changes go. The outer supervisor opens both files
/// (the host made them) before it leaves the host's namespaces, and writes
/// the layer from inside the sandbox's user namespace, where the writable
/// layer's files have the image's own ids and it may read every one of
/// them whoever the caller is; then it writes `ok` to `status`, or why not.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StepOutput {
    pub tar: String,
    pub status: String,
    /// Paths of the root (relative) that are cordon's, not the step's:
    /// left out with what is beneath them.
    pub skip: Vec<String>,
}

/// The host ids an image root's inside ids 1 to 65535 map to (0 is the
/// caller's, or for root a host uid of the sandbox's own).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum IdSource {
    /// Root: a range of [`IMAGE_IDS`] host ids far above any account's,
    /// taken by the supervisor for as long as the sandbox lives.
    Allocated,
    /// An unprivileged caller: its subordinate ids (`/etc/subuid` and
    /// `/etc/subgid`), which the setuid `newuidmap` and `newgidmap` map.
    Subordinate {
        uid: u32,
        gid: u32,
        /// How many of each, at most [`IMAGE_IDS`] - 1.
        count: u32,
    },
}

/// Kernel objects counted per user, which a sandbox's processes are charged
/// for in its own user namespace and again, up the chain, to the host uid
/// that owns that namespace. Without a bound here, one sandbox could hold
/// every inotify instance its host uid may have and starve the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UserCounts {
    /// Limits written to `/proc/sys/user/` in the sandbox's user namespace.
    pub namespace_max: Vec<(UserCount, u64)>,
    /// Rlimits of the sandbox's processes, which its commands cannot raise.
    pub sigpending: u64,
    pub msgqueue: u64,
    pub memlock: u64,
    /// A host uid of the sandbox's own to own its user namespace (root
    /// only), so that what it is charged at the host's level is not root's.
    pub owner_uid: Option<u32>,
}

/// The per-user counts a user namespace can limit for itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum UserCount {
    InotifyInstances,
    InotifyWatches,
    FanotifyGroups,
    FanotifyMarks,
}

impl UserCount {
    pub const ALL: [UserCount; 4] = [
        UserCount::InotifyInstances,
        UserCount::InotifyWatches,
        UserCount::FanotifyGroups,
        UserCount::FanotifyMarks,
    ];

    /// Its file under `/proc/sys/user/`.
    pub fn sysctl(self) -> &'static str {
        match self {
            UserCount::InotifyInstances => "max_inotify_instances",
            UserCount::InotifyWatches => "max_inotify_watches",
            UserCount::FanotifyGroups => "max_fanotify_groups",
            UserCount::FanotifyMarks => "max_fanotify_marks",
        }
    }
}

/// What the supervisor reports once the sandbox is built.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ReadyInfo {
    /// Landlock: "fully enforced (ABI n)", "partially enforced", "not enforced".
    pub landlock: String,
    pub landlock_abi: i32,
    /// Number of seccomp filters installed.
    pub seccomp_filters: u32,
    /// The first id the host may use: above every id an earlier host
    /// used, after a `HostMsg::Reattach` (orphaned commands keep theirs);
    /// 0 after a setup.
    pub next_id: u64,
}

/// Terminal size for pseudo-terminal execs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WinSize {
    pub rows: u16,
    pub cols: u16,
}

/// One command to start.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ExecSpec {
    pub id: u64,
    /// argv; `argv[0]` is looked up in `PATH` when it has no slash.
    pub argv: Vec<serde_bytes::ByteBuf>,
    /// Where `argv[0]` is not in `PATH`, run `sh` instead, with bash's own
    /// leading `--noprofile`/`--norc` dropped (`sh` would take them for a
    /// script's name): a bash command line that still runs in a root
    /// without bash (Alpine, busybox), without a shell exec'd first to
    /// look (an exec costs ~1 ms natively, tens under TCG).
    pub or_sh: bool,
    pub cwd: String,
    /// The complete environment (nothing is inherited).
    pub env: Vec<(String, String)>,
    /// Whether the host will send stdin; otherwise stdin is /dev/null.
    pub stdin: bool,
    pub timeout_ms: Option<u64>,
    /// Bytes of each stream to deliver before discarding the rest.
    pub output_limit: Option<u64>,
    /// Run on a pseudo-terminal (stdout carries the merged output).
    pub pty: Option<WinSize>,
    /// The user and group ids to run as, instead of the sandbox's default
    /// (an image's `User`): only where the supervisor may switch to them.
    pub user: Option<(u32, u32)>,
}

/// Host to supervisor.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum HostMsg {
    Setup(Box<SetupSpec>),
    Exec(ExecSpec),
    Stdin {
        id: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// Close the exec's stdin once everything sent before has been written.
    StdinEof {
        id: u64,
    },
    /// The host consumed this many output bytes of exec `id`.
    Ack {
        id: u64,
        bytes: u64,
    },
    /// Send a signal to the exec's process group.
    Signal {
        id: u64,
        signal: i32,
    },
    Resize {
        id: u64,
        size: WinSize,
    },
    /// Kill everything and exit; answered by `SupMsg::Ended` once every
    /// process has gone, if they all went within a second.
    Shutdown,
    /// A file system operation in the sandbox's root, answered by
    /// `SupMsg::Fs` with the same id (see [`FsOp`]).
    Fs {
        id: u64,
        op: FsOp,
        /// The user and group it acts as (its file system ids: what it may
        /// touch, and who owns what it makes); none: the commands' default.
        user: Option<(u32, u32)>,
    },
    /// Watch directory `path` (and, `recursive`, every directory below
    /// it, made later too) for changes: answered by `SupMsg::Watching`,
    /// then `SupMsg::Changes` until `Unwatch`. Changes made before the
    /// supervisor reports an exec's end or answers an `Fs` are sent
    /// before that report or answer.
    Watch {
        id: u64,
        path: String,
        recursive: bool,
    },
    Unwatch {
        id: u64,
    },
    /// How much of the machine the sandbox's processes use: answered by
    /// `SupMsg::Usage`.
    Usage {
        id: u64,
    },
    /// Set the clock to this many nanoseconds since the epoch: a microVM's
    /// guest starts from its RTC, half a second or so behind the host, which
    /// skews mtimes between files the host and the guest write. Sent as soon
    /// as the supervisor is ready, so the time is fresh; ignored natively.
    SetClock {
        realtime_ns: u64,
    },
    /// Connect to 127.0.0.1:`port` inside the sandbox for the host (a
    /// forwarded port): `conn` carries [`DIAL`]; answered by
    /// `SupMsg::NetOpen` once connected or `SupMsg::NetClose` if not, then
    /// carried like any other connection (see `supervisor::relay`).
    NetDial {
        conn: u64,
        port: u16,
    },
    /// Bytes for connection `conn`: from the broker (microvm egress) or
    /// from the host's end of a dial.
    NetData {
        conn: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// The broker has finished writing to `conn`.
    NetEof {
        conn: u64,
    },
    /// The host wrote this many bytes of `conn` to the broker.
    NetAck {
        conn: u64,
        bytes: u64,
    },
    /// The host ended `conn` (or refused it).
    NetClose {
        conn: u64,
    },
    /// Freeze (`frozen`) or thaw the file system of a microVM's writable
    /// layer (FIFREEZE: what was written is on its disk, and writers wait)
    /// so that the host can copy the disk whole, for forks: answered by
    /// `SupMsg::LayerFrozen`. Refused where there is no such disk.
    FreezeLayer {
        id: u64,
        frozen: bool,
    },
    /// Finish the frame being written, answer `SupMsg::Held`, and write
    /// nothing more until `Release` or `Reattach`: the channel is then
    /// empty both ways at a frame's edge, as a microVM saved to disk must
    /// be to go on with another host process (see `microvm::suspend`).
    Hold,
    /// Go on writing after a `Hold`, to the same host.
    Release,
    /// Sent first by a new host process to a supervisor held for an old
    /// one: everything the old one started is orphaned (commands go on,
    /// their output dropped; watches and connections end), and the
    /// supervisor answers `SupMsg::Ready`, with ids for the new host to
    /// start from. A microVM's guest mixes `seed` into its kernel's
    /// randomness first: forks resumed from one saved memory must not
    /// draw the same numbers.
    Reattach {
        #[serde(with = "serde_bytes")]
        seed: Vec<u8>,
    },
}

/// Entries one listing answers at most; past it, the listing fails
/// (asked again with less depth, it fits). Keeps an answer in a frame.
pub const FS_LIST_MAX: usize = 4096;

/// Bytes of `user.e2b.*` extended attributes shown per entry, at most.
pub const FS_XATTRS_MAX: usize = 4096;

/// A file system operation the supervisor does in the sandbox, on
/// absolute paths as the sandbox sees them. Never into `/proc`: what the
/// supervisor's own process shows there is not the sandbox's to see.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsOp {
    /// The entry at `path`, not following it (a link's target is told).
    Stat { path: String },
    /// What is below the directory `path` (followed if a link), `depth`
    /// levels down (1: its entries), in lexical pre-order, links not
    /// followed; paths relative to `path`.
    List { path: String, depth: u32 },
    /// Makes directory `path` and its missing parents (0755).
    MakeDir { path: String },
    /// Makes the missing directories above `path` (0755), each given to
    /// `owner` (uid, gid): what a write as that user anywhere needs made
    /// first, as root does it for them.
    MakeParents { path: String, owner: (u32, u32) },
    /// Renames `from` to `to`, making `to`'s missing parents; answers
    /// `to`'s entry.
    Move { from: String, to: String },
    /// Removes `path`, a directory with everything in it; a missing path
    /// is no error.
    Remove { path: String },
    /// Replaces `path`'s `user.e2b.*` extended attributes with `entries`
    /// (keys without the prefix); on a file system without them, nothing.
    SetMetadata {
        path: String,
        entries: Vec<(String, String)>,
    },
}

/// What a file system operation answers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsAnswer {
    Entry(FsEntry),
    Entries(Vec<FsEntry>),
    Done,
}

/// What kind of file an entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FileKind {
    File,
    Directory,
    Symlink,
    Other,
}

/// An entry of the sandbox's file system, as `lstat` sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsEntry {
    /// Absolute (`Stat`, `MakeDir`, `Move`) or relative to the listed
    /// directory (`List`).
    pub path: String,
    pub kind: FileKind,
    /// `st_mode`: type and permission bits.
    pub mode: u32,
    pub size: u64,
    pub uid: u32,
    pub gid: u32,
    pub mtime_ns: i64,
    /// A link's target, resolved to an absolute path, and what is there
    /// (none when it leads nowhere).
    pub link: Option<LinkTarget>,
    /// Its `user.e2b.*` extended attributes, the prefix taken off.
    pub metadata: Vec<(String, String)>,
}

/// Where a symbolic link leads.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LinkTarget {
    pub path: String,
    pub kind: FileKind,
    pub mode: u32,
}

/// What the supervisor sees of its sandbox's use of the machine.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct GuestUsage {
    /// CPU time of every process the sandbox ran, living or ended, in
    /// nanoseconds.
    pub cpu_ns: u64,
    /// Processes running.
    pub processes: u32,
    /// The kernel's memory in use and in all (`MemTotal` less
    /// `MemAvailable`, and `MemTotal`): a microVM's own; natively the
    /// host's, which the host replaces with the sandbox's cgroup.
    pub memory_used: u64,
    pub memory_total: u64,
    /// The resident memory of the processes running, summed (pages they
    /// share counted once each): what is known where nothing better is.
    pub resident: u64,
}

/// Directories one watch (all its subdirectories) and one sandbox (all
/// its watches) follow at most: inotify's watches count against a limit
/// of the host user's.
pub const WATCH_DIRS_MAX: usize = 1024;

/// Watches a sandbox holds at once, at most.
pub const WATCHES_MAX: usize = 64;

/// What happened to an entry under a watch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ChangeKind {
    Create,
    Write,
    Remove,
    Rename,
    Chmod,
}

/// One change under a watch.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsChange {
    /// Relative to the watched directory.
    pub path: String,
    pub kind: ChangeKind,
}

/// Why a file system operation failed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum FsErrorKind {
    NotFound,
    AlreadyExists,
    NotADirectory,
    PermissionDenied,
    /// A listing past [`FS_LIST_MAX`], or a path into `/proc`.
    Refused,
    Other,
}

/// A failed file system operation: its kind, and the kernel's words.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FsFailure {
    pub kind: FsErrorKind,
    pub message: String,
}

/// Supervisor to host.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub enum SupMsg {
    Ready(ReadyInfo),
    /// The last frame before a hold (see `HostMsg::Hold`).
    Held,
    /// The last frame of all, after a `HostMsg::Shutdown`: every process
    /// in the sandbox has been killed and reaped, and in a microVM what
    /// they wrote is synced; the sandbox's own end follows.
    Ended,
    SetupFailed {
        message: String,
        /// errno of the failing call, when there was one.
        errno: i32,
    },
    Started {
        id: u64,
        pid: i32,
    },
    SpawnFailed {
        id: u64,
        stage: SpawnStage,
        errno: i32,
        message: String,
    },
    Output {
        id: u64,
        stream: Stream,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// This many stdin bytes of exec `id` were written to the process.
    StdinAck {
        id: u64,
        bytes: u64,
    },
    Exited {
        id: u64,
        status: ExitStatus,
        duration_us: u64,
        timed_out: bool,
        /// Bytes produced on stdout and stderr, including any discarded.
        stdout_bytes: u64,
        stderr_bytes: u64,
        truncated: bool,
        /// The kernel killed a process for want of memory while this ran;
        /// reported by a microVM guest (natively the host's cgroup tells).
        oom_killed: bool,
    },
    /// A program in the guest connected to the broker's port: proxy
    /// connection `conn` (microvm egress); or the host's dial `conn` is
    /// connected.
    NetOpen {
        conn: u64,
    },
    /// Bytes the program sent on `conn`.
    NetData {
        conn: u64,
        #[serde(with = "serde_bytes")]
        data: Vec<u8>,
    },
    /// The program has finished writing to `conn`.
    NetEof {
        conn: u64,
    },
    /// The guest wrote this many bytes of `conn` to the program.
    NetAck {
        conn: u64,
        bytes: u64,
    },
    /// `conn` ended on the guest's side.
    NetClose {
        conn: u64,
    },
    /// The answer to `HostMsg::Fs` `id`.
    Fs {
        id: u64,
        result: Result<FsAnswer, FsFailure>,
    },
    /// The answer to `HostMsg::Usage` `id`.
    Usage {
        id: u64,
        usage: GuestUsage,
    },
    /// The answer to `HostMsg::Watch` `id`.
    Watching {
        id: u64,
        result: Result<(), FsFailure>,
    },
    /// What changed under watch `id`, in order. A watch the kernel could
    /// not keep up with ends with `overflowed`.
    Changes {
        id: u64,
        changes: Vec<FsChange>,
        overflowed: bool,
    },
    /// The answer to `HostMsg::FreezeLayer` `id`: why not, if it failed.
    LayerFrozen {
        id: u64,
        result: Result<(), String>,
    },
}

/// Why a frame could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {0} bytes exceeds the {MAX_FRAME}-byte limit")]
    TooLarge(usize),
    #[error("malformed frame: {0}")]
    Decode(#[from] postcard::Error),
}

/// Encodes `msg` as one frame appended to `out`.
pub fn encode<T: Serialize>(msg: &T, out: &mut Vec<u8>) {
    let start = out.len();
    out.extend_from_slice(&[0; 4]);
    // Writing into a Vec cannot fail for these plain data types.
    let mut buf = std::mem::take(out);
    buf = postcard::to_extend(msg, buf).expect("postcard encoding into a Vec");
    *out = buf;
    let len = (out.len() - start - 4) as u32;
    out[start..start + 4].copy_from_slice(&len.to_le_bytes());
}

/// Tries to take one complete frame off the front of `buf`.
/// Returns the message and how many bytes it used, or `None` if incomplete.
pub fn decode<'a, T: Deserialize<'a>>(buf: &'a [u8]) -> Result<Option<(T, usize)>, FrameError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = u32::from_le_bytes([buf[0], buf[1], buf[2], buf[3]]) as usize;
    if len > MAX_FRAME {
        return Err(FrameError::TooLarge(len));
    }
    if buf.len() < 4 + len {
        return Ok(None);
    }
    let msg = postcard::from_bytes(&buf[4..4 + len])?;
    Ok(Some((msg, 4 + len)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_preserves_binary_data() {
        let data: Vec<u8> = (0..=255u8).cycle().take(70_000).collect();
        let msg = SupMsg::Output {
            id: 7,
            stream: Stream::Stderr,
            data: data.clone(),
        };
        let mut buf = Vec::new();
        encode(&msg, &mut buf);
        encode(&SupMsg::StdinAck { id: 1, bytes: 2 }, &mut buf);
        let (got, used): (SupMsg, usize) = decode(&buf).unwrap().unwrap();
        match got {
            SupMsg::Output {
                id,
                stream,
                data: d,
            } => {
                assert_eq!((id, stream), (7, Stream::Stderr));
                assert_eq!(d, data);
            }
            other => panic!("unexpected {other:?}"),
        }
        let (next, _): (SupMsg, usize) = decode(&buf[used..]).unwrap().unwrap();
        assert!(matches!(next, SupMsg::StdinAck { id: 1, bytes: 2 }));
    }

    #[test]
    fn partial_frames_wait_for_more() {
        let mut buf = Vec::new();
        encode(&HostMsg::Shutdown, &mut buf);
        for cut in 0..buf.len() {
            assert!(decode::<HostMsg>(&buf[..cut]).unwrap().is_none());
        }
    }

    #[test]
    fn oversized_and_garbage_frames_are_errors() {
        let huge = ((MAX_FRAME + 1) as u32).to_le_bytes();
        assert!(matches!(
            decode::<HostMsg>(&huge),
            Err(FrameError::TooLarge(_))
        ));
        let garbage = [3, 0, 0, 0, 0xff, 0xff, 0xff];
        assert!(matches!(
            decode::<HostMsg>(&garbage),
            Err(FrameError::Decode(_))
        ));
    }

    #[test]
    fn exit_status_follows_shell_convention() {
        assert_eq!(ExitStatus::Code(3).code(), 3);
        assert_eq!(ExitStatus::Signal(9).code(), 137);
        assert!(ExitStatus::Code(0).success());
    }
}
