//! Per-user kernel counts a sandbox could exhaust for its host uid.
//!
//! The kernel counts some objects per user: inotify instances and watches,
//! fanotify groups and marks, queued signals, POSIX message queue bytes.
//! A process in a user namespace is charged in its namespace and again to
//! the uid that owns the namespace, so a sandbox made by root held root's
//! counts: with every inotify instance taken inside, systemd, file watchers
//! and other tenants' sandboxes failed with EMFILE.
//!
//! Each attack has sandboxes take all they can of one object and hold it;
//! meanwhile a host process of the sandbox's own uid (root, or the
//! unprivileged user) takes some: it must still get them, and (natively) a
//! second sandbox must still get its share. Run in the escape battery's
//! three modes; in a microVM the guest's kernel counts for itself, and only
//! the host side is asserted.
//!
//! Checked by hand and left to other defences: keys (`add_key`, `keyctl`
//! are refused by seccomp, see escape.rs's `keyring`), processes (`--pids`),
//! locked memory (`RLIMIT_MEMLOCK`, an eighth of the host's, like the
//! signals here), and namespaces (seccomp refuses creating them).

use crate::common;

use std::fs;
use std::path::Path;
use std::time::Duration;

use common::*;

/// How long a holder keeps its objects waiting for the host to look.
const HOLD_LIMIT_S: u32 = 60;

/// The host's per-user ceiling for `name` under /proc/sys/user.
fn host_max(name: &str) -> u64 {
    fs::read_to_string(format!("/proc/sys/user/{name}"))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// A python3 holder: runs `grab` (which sets `n`, the number taken), writes
/// `n` to /workspace/<tag>.held and keeps everything until <tag>.release
/// appears.
fn holder(tag: &str, grab: &str) -> String {
    format!(
        "{grab}\n\
         open('/workspace/{tag}.tmp', 'w').write(str(n))\n\
         os.rename('/workspace/{tag}.tmp', '/workspace/{tag}.held')\n\
         import time\n\
         for _ in range({HOLD_LIMIT_S} * 20):\n\
         \x20   if os.path.exists('/workspace/{tag}.release'): break\n\
         \x20   time.sleep(0.05)\n\
         print('held', n)\n"
    )
}

/// Starts `sandboxes` holders running `grab`, waits until each holds what
/// it could, runs `probe` on the host as the sandbox's uid, releases them.
/// Returns (what each sandbox held, what the probe printed).
fn hold_and_probe(t: &Ctx, sandboxes: usize, grab: &str, probe: &str) -> (Vec<u64>, String) {
    let tags: Vec<String> = (0..sandboxes)
        .map(|i| format!("h{i}-{}", unique()))
        .collect();
    std::thread::scope(|s| {
        let runs: Vec<_> = tags
            .iter()
            .map(|tag| {
                let script = holder(tag, grab);
                s.spawn(move || t.py(&script))
            })
            .collect();
        let held_path = |tag: &str| t.workspace.join(format!("{tag}.held"));
        let ready = eventually(t.within(Duration::from_secs(40)), || {
            tags.iter().all(|tag| held_path(tag).exists())
        });
        let probe_out = ready.then(|| t.host_as_owner(&["/usr/bin/python3", "-c", probe]));
        for tag in &tags {
            fs::write(t.workspace.join(format!("{tag}.release")), "").unwrap();
        }
        let outs: Vec<Out> = runs.into_iter().map(|h| h.join().unwrap()).collect();
        for out in &outs {
            out.code(0).line_starts("held ");
        }
        let Some(probe_out) = probe_out else {
            outs[0].fail("the holders never reported what they held");
        };
        probe_out.code(0);
        let held = tags
            .iter()
            .map(|tag| read_number(&held_path(tag)))
            .collect();
        (held, probe_out.stdout.trim().to_string())
    })
}

fn read_number(p: &Path) -> u64 {
    fs::read_to_string(p).unwrap().trim().parse().unwrap()
}

/// Native sandboxes run side by side; two microVMs under TCG would only
/// slow the battery down for nothing more to learn.
fn holders(t: &Ctx) -> usize {
    if t.vm() { 1 } else { 2 }
}

const GRAB_INOTIFY: &str = "
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fds = []
while len(fds) < 100000 and libc.inotify_init1(0) >= 0:
    fds.append(1)
n = len(fds)
";

/// Every inotify instance a sandbox can take, twice over, while the host's
/// own processes of that uid make theirs.
fn inotify_instances(t: &Ctx) {
    let max = host_max("max_inotify_instances");
    let probe = format!(
        "import ctypes\nlibc = ctypes.CDLL(None)\nn = 0\n\
         while n < {max} and libc.inotify_init1(0) >= 0: n += 1\nprint(n)"
    );
    let (held, host) = hold_and_probe(t, holders(t), GRAB_INOTIFY, &probe);
    let host: u64 = host.parse().unwrap();
    if !t.vm() {
        for h in &held {
            assert_eq!(
                *h,
                max / 8,
                "each sandbox gets an eighth of the host's {max} instances, \
                 the second as much as the first: held {held:?}"
            );
        }
    }
    assert!(
        host >= max / 2,
        "HOST STARVED: with sandboxes holding {held:?} inotify instances, a host \
         process of their uid could make only {host} of {max}"
    );
}
attack!(inotify_instances);

/// The same for inotify watches: one instance, watches on every name the
/// sandbox can make (each watch is on its own file).
fn inotify_watches(t: &Ctx) {
    let max = host_max("max_inotify_watches");
    let grab = "
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
os.makedirs('/tmp/w', exist_ok=True)
n = 0
while n < 400000:
    p = b'/tmp/w/%d' % n
    open(p, 'w').close()
    if libc.inotify_add_watch(fd, p, 2) < 0:
        break
    n += 1
";
    let probe = "import ctypes, os, tempfile\nlibc = ctypes.CDLL(None)\nd = tempfile.mkdtemp()\n\
         fd = libc.inotify_init1(0)\nn = 0\n\
         while n < 2000:\n\
         \x20   p = os.path.join(d, str(n)).encode()\n\
         \x20   open(p, 'w').close()\n\
         \x20   if libc.inotify_add_watch(fd, p, 2) < 0: break\n\
         \x20   n += 1\n\
         import shutil; shutil.rmtree(d)\nprint(n)";
    // Many small files: room for them in /tmp, and memory for the watches.
    let (held, host) =
        hold_and_probe_with(t, &["--tmp-size", "512M", "--memory", "1G"], grab, probe);
    let host: u64 = host.parse().unwrap();
    if !t.vm() {
        assert_eq!(
            held[0],
            max / 8,
            "a sandbox gets an eighth of {max} watches"
        );
    }
    assert_eq!(
        host, 2000,
        "HOST STARVED: with a sandbox holding {held:?} inotify watches, a host process \
         of its uid could add only {host} of 2000"
    );
}
attack!(inotify_watches);

/// [`hold_and_probe`] with one sandbox and extra `cordon run` options.
fn hold_and_probe_with(t: &Ctx, opts: &[&str], grab: &str, probe: &str) -> (Vec<u64>, String) {
    let tag = format!("h-{}", unique());
    let script = holder(&tag, grab);
    std::thread::scope(|s| {
        let run = s.spawn(|| t.run(opts, &["python3", "-c", &script]));
        let held_path = t.workspace.join(format!("{tag}.held"));
        let ready = eventually(t.within(Duration::from_secs(50)), || held_path.exists());
        let probe_out = ready.then(|| t.host_as_owner(&["/usr/bin/python3", "-c", probe]));
        fs::write(t.workspace.join(format!("{tag}.release")), "").unwrap();
        let out = run.join().unwrap();
        out.code(0).line_starts("held ");
        let Some(probe_out) = probe_out else {
            out.fail("the holder never reported what it held");
        };
        probe_out.code(0);
        (
            vec![read_number(&held_path)],
            probe_out.stdout.trim().to_string(),
        )
    })
}

/// Queued real-time signals: `sigqueue` to itself with the signal blocked,
/// until the kernel refuses.
fn pending_signals(t: &Ctx) {
    let grab = "
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])
n = 0
while n < 400000 and libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), ctypes.c_void_p(0)) == 0:
    n += 1
";
    let probe = "import ctypes, os, signal\nlibc = ctypes.CDLL(None)\n\
         signal.pthread_sigmask(signal.SIG_BLOCK, [signal.SIGRTMIN])\nn = 0\n\
         while n < 1000 and libc.sigqueue(os.getpid(), int(signal.SIGRTMIN), ctypes.c_void_p(0)) == 0: n += 1\n\
         print(n)";
    let (held, host) = hold_and_probe(t, holders(t), grab, probe);
    let host: u64 = host.parse().unwrap();
    assert_eq!(
        host, 1000,
        "HOST STARVED: with sandboxes holding {held:?} queued signals, a host process \
         of their uid could queue only {host} of 1000"
    );
    if !t.vm() {
        assert!(
            held.iter().all(|h| *h > 0),
            "each sandbox may queue some: {held:?}"
        );
    }
}
attack!(pending_signals);

/// POSIX message queues: as many as the byte limit allows, each of ten
/// 8 KiB messages. Natively Landlock refuses `mq_open` outright (the
/// queues' file system lies outside every rule), so this held on the code
/// before the limits too; `RLIMIT_MSGQUEUE` is the second line.
fn message_queues(t: &Ctx) {
    let grab = "
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
class Attr(ctypes.Structure):
    _fields_ = [('flags', ctypes.c_long), ('maxmsg', ctypes.c_long), ('msgsize', ctypes.c_long), ('cur', ctypes.c_long), ('pad', ctypes.c_long * 4)]
a = Attr(0, 10, 8192, 0)
n = 0
while n < 1000 and libc.mq_open(b'/cordon-q%d' % n, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a)) >= 0:
    n += 1
";
    let marker = unique();
    let probe = format!(
        "import ctypes, os\nlibc = ctypes.CDLL(None)\n\
         class Attr(ctypes.Structure):\n\
         \x20   _fields_ = [('flags', ctypes.c_long), ('maxmsg', ctypes.c_long), ('msgsize', ctypes.c_long), ('cur', ctypes.c_long), ('pad', ctypes.c_long * 4)]\n\
         a = Attr(0, 10, 8192, 0)\nn = 0\n\
         while n < 4 and libc.mq_open(b'/cordon-probe-{marker}-%d' % n, os.O_CREAT | os.O_RDWR, 0o600, ctypes.byref(a)) >= 0: n += 1\n\
         for i in range(n): libc.mq_unlink(b'/cordon-probe-{marker}-%d' % i)\n\
         print(n)"
    );
    let (held, host) = hold_and_probe(t, holders(t), grab, &probe);
    let host: u64 = host.parse().unwrap();
    assert_eq!(
        host, 4,
        "HOST STARVED: with sandboxes holding {held:?} message queues, a host process \
         of their uid could open only {host} of 4"
    );
}
attack!(message_queues);

/// epoll watches are counted per host uid proper (no namespace level): a
/// 2 GiB sandbox could take every one of root's, and systemd's next
/// `epoll_ctl` failed. As root the sandbox's processes are a host uid of
/// their own, over idmapped mounts; unprivileged they are the user's, and
/// `--memory` is what bounds them (docs/sandbox.md, "What the host trusts").
fn epoll_watches(t: &Ctx) {
    let grab = "
import os, select
targets = [os.eventfd(0) for _ in range(1000)]
eps, n = [], 0
try:
    while n < 8000000:
        ep = select.epoll()
        eps.append(ep)
        for x in targets:
            ep.register(x, select.EPOLLIN)
            n += 1
except OSError:
    pass
";
    let probe = "import os, select\nep = select.epoll()\nn = 0\n\
         try:\n\
         \x20   for _ in range(1000):\n\
         \x20       ep.register(os.eventfd(0), select.EPOLLIN); n += 1\n\
         except OSError: pass\nprint(n)";
    let (held, host) = hold_and_probe_with(t, &["--memory", "2G"], grab, probe);
    assert_eq!(
        host, "1000",
        "HOST STARVED: with a sandbox holding {held:?} epoll watches, a host process \
         of root could add only {host} of 1000"
    );
}

#[test]
fn epoll_watches_root() {
    if let Some(t) = Ctx::new(Mode::Root) {
        epoll_watches(&t);
    }
}

/// What a process that left every namespace would be on the host: as root,
/// the sandbox's processes are a uid and gid of their own with no
/// supplementary group, owning nothing, while what they write in the
/// workspace is still root's.
#[test]
fn roots_sandbox_is_not_host_root() {
    let Some(t) = Ctx::new(Mode::Root) else {
        return;
    };
    let marker = unique();
    let tag = format!("id-{marker}");
    let script = holder(
        &tag,
        &format!(
            "import os, subprocess\n\
             open('/workspace/written-inside', 'w').write('x')\n\
             p = subprocess.Popen(['sleep', '{marker}'])\nn = p.pid"
        ),
    );
    std::thread::scope(|s| {
        let run = s.spawn(|| t.py(&script));
        let held = t.workspace.join(format!("{tag}.held"));
        let ready = eventually(Duration::from_secs(40), || held.exists());
        let pids = host_pids_with_argv(&["sleep", &marker.to_string()]);
        let status = pids
            .first()
            .and_then(|p| fs::read_to_string(format!("/proc/{p}/status")).ok());
        fs::write(t.workspace.join(format!("{tag}.release")), "").unwrap();
        run.join().unwrap().code(0);
        assert!(ready, "the sandbox never started its sleep");
        let status = status.expect("the sandbox's sleep is visible to the host");
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .unwrap_or_default()
                .split_whitespace()
                .map(str::to_string)
                .collect::<Vec<_>>()
        };
        let (uid, gid, groups) = (field("Uid:"), field("Gid:"), field("Groups:"));
        assert!(
            uid.iter().all(|u| u != "0") && gid.iter().all(|g| g != "0"),
            "the sandbox's process is host root: Uid {uid:?} Gid {gid:?}"
        );
        assert!(groups.is_empty(), "supplementary groups {groups:?}");
        let owner: u32 = uid[0].parse().unwrap();
        assert!(
            owner >= 0xB000_0000,
            "uid {owner} is not from cordon's range"
        );
        let written = fs::metadata(t.workspace.join("written-inside")).unwrap();
        use std::os::unix::fs::MetadataExt;
        assert_eq!(
            (written.uid(), written.gid()),
            (0, 0),
            "the sandbox's files are the caller's"
        );
    });
}
