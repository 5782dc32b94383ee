//! The disk budget (`--disk`): a sandbox that writes without end into
//! /workspace is stopped near its budget, whatever shape the writing takes,
//! and the host's watcher counts nothing outside the workspace, follows no
//! link and changes nothing there.
//!
//! Each attack runs as root, unprivileged and in a microVM, with a small
//! memory and /tmp so that nothing but the disk budget can end it; the
//! assertions are on the host: what the workspace holds afterwards (`du`,
//! allocated bytes) and what cordon said.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::Ctx;

const MIB: u64 = 1 << 20;
/// The budget every attack runs under.
const BUDGET: &str = "64M";
const BUDGET_BYTES: u64 = 64 * MIB;
/// How far past the budget a sandbox writing at full speed may get before
/// it is stopped, as docs/sandbox.md states it: a watcher's precision is the
/// bytes written while it waits for a CPU, and on a 2-core CI machine
/// running three backends' tests at once it once waited ~90 ms (54 MiB).
const PRECISION: u64 = 96 * MIB;
/// What `du` counts beside the bytes written: the workspace's directory
/// and the files' extent blocks (seen: a stop at exactly the budget and
/// its precision, plus the directory's 4 KiB).
const METADATA: u64 = MIB;

/// The options of every run: the budget, and little memory and /tmp.
const LIMITS: &[&str] = &["--disk", BUDGET, "--memory", "128M", "--tmp-size", "16M"];

/// Allocated bytes beneath `dir` on the host, without following links.
fn usage(dir: &Path) -> u64 {
    let out = Command::new("du")
        .args(["-s", "-x", "-B1"])
        .arg(dir)
        .output()
        .expect("run du");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("du printed {:?}", String::from_utf8_lossy(&out.stdout)))
}

/// The run was stopped for its budget, said so, and left at most the
/// budget and the stated precision in the workspace.
#[track_caller]
fn stopped(t: &Ctx, out: &common::Out) {
    out.code(123)
        .stderr_has("cordon: disk budget exceeded: the workspace grew by ")
        .stderr_has("past its 64 MiB budget, and the sandbox was stopped");
    let used = usage(&t.workspace);
    eprintln!("{}: the workspace holds {} KiB", out.what, used / 1024);
    if used > BUDGET_BYTES + PRECISION + METADATA {
        out.fail(format_args!(
            "the workspace holds {} MiB, more than the budget and its precision ({} MiB)",
            used / MIB,
            (BUDGET_BYTES + PRECISION) / MIB
        ));
    }
}

/// One writer of 1 GiB: `dd` from /dev/zero.
fn dd_gigabyte(t: &Ctx) {
    let out = t.run(
        LIMITS,
        &[
            "dd",
            "if=/dev/zero",
            "of=/workspace/big",
            "bs=1M",
            "count=1024",
        ],
    );
    stopped(t, &out);
}
attack!(dd_gigabyte);

/// The same from python, in chunks, retrying what the kernel refuses.
fn python_gigabyte(t: &Ctx) {
    let out = t.py_with(
        LIMITS,
        r#"
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        chunk = b"x" * (1 << 20)
        n = 0
        while n < 1024:
            try:
                with open(f"/workspace/part{n % 8}", "ab") as f:
                    f.write(chunk)
            except OSError:
                pass
            n += 1
        print("wrote it all")
        "#,
    );
    stopped(t, &out);
    out.lacks("wrote it all");
}
attack!(python_gigabyte);

/// Many small files: no one file is large, the sum is.
fn many_small_files(t: &Ctx) {
    let out = t.py_with(
        LIMITS,
        r#"
        os.makedirs("/workspace/many", exist_ok=True)
        block = b"y" * 16384
        for i in range(65536):
            d = f"/workspace/many/{i % 64}"
            os.makedirs(d, exist_ok=True)
            with open(f"{d}/{i}", "wb") as f:
                f.write(block)
        print("wrote it all")
        "#,
    );
    stopped(t, &out);
    out.lacks("wrote it all");
}
attack!(many_small_files);

/// A directory made unreadable to its owner hides nothing: the watcher
/// sees into it.
fn locked_directory(t: &Ctx) {
    let out = t.sh_with(
        LIMITS,
        "mkdir /workspace/h && for i in 1 2 3 4 5 6 7 8 9 10; do \
           head -c 10485760 /dev/zero > /workspace/h/$i; done; \
         chmod 000 /workspace/h; sleep 2; echo survived",
    );
    stopped(t, &out);
    out.lacks("survived");
    let _ = std::fs::set_permissions(
        t.workspace.join("h"),
        std::fs::Permissions::from_mode(0o755),
    );
}
attack!(locked_directory);

/// Files deleted while held open take space until closed, though no
/// directory shows them: they count.
fn deleted_but_open(t: &Ctx) {
    let out = t.py_with(
        LIMITS,
        r#"
        import time
        held = []
        for i in range(16):
            f = open(f"/workspace/gone{i}", "wb")
            os.unlink(f"/workspace/gone{i}")
            f.write(b"z" * (8 << 20))
            f.flush()
            held.append(f)
        time.sleep(2)
        print("survived")
        "#,
    );
    stopped(t, &out);
    out.lacks("survived");
}
attack!(deleted_but_open);

/// Writes 40 files of 8 MiB, maps `length` bytes of each through libc's
/// `mmap` (Python's own `mmap` keeps a duplicate of the descriptor, which
/// the watcher already counts), closes and deletes it: each is then held
/// by its mapping alone. Stopped for the budget, never "survived".
fn map_and_delete(t: &Ctx, length: &str) {
    let out = t.py_with(
        LIMITS,
        &format!(
            r#"
        import time
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        for i in range(40):
            p = f"/workspace/mapped{{i}}"
            with open(p, "wb") as f:
                f.write(b"m" * (8 << 20))
            fd = os.open(p, os.O_RDONLY)
            addr = libc.mmap(None, {length}, 1, 1, fd, 0)
            assert addr not in (None, ctypes.c_void_p(-1).value), ctypes.get_errno()
            os.close(fd)
            os.unlink(p)
        time.sleep(2)
        print("survived")
        "#
        ),
    );
    stopped(t, &out);
    out.lacks("survived");
}

/// Issue 31: files mapped, closed and then deleted are held by their
/// mappings alone, each mapped whole. They count (as root with each
/// file's size; unprivileged with the mappings' length).
fn deleted_but_mapped(t: &Ctx) {
    map_and_delete(t, "8 << 20");
}
attack!(deleted_but_mapped);

/// The same with one page of each file mapped: the mapping's length says
/// nothing of the file's size, which only a privileged watcher can read
/// (`/proc/PID/map_files`); in a microVM the host's QEMU holds the files.
fn deleted_but_one_page_mapped(t: &Ctx) {
    map_and_delete(t, "4096");
}
attack!(deleted_but_one_page_mapped, privileged);

/// Issue 31: files sent over a Unix socket to the sandbox itself and
/// closed before being deleted are held by the message in flight alone,
/// which no `/proc` file shows. In a microVM the host's QEMU holds them.
fn deleted_but_in_flight(t: &Ctx) {
    let out = t.py_with(
        LIMITS,
        r#"
        import time
        a, b = socket.socketpair()
        for i in range(40):
            p = f"/workspace/flying{i}"
            with open(p, "wb") as f:
                f.write(b"f" * (8 << 20))
            fd = os.open(p, os.O_RDONLY)
            socket.send_fds(a, [b"x"], [fd])
            os.close(fd)
            os.unlink(p)
        time.sleep(2)
        print("survived")
        "#,
    );
    stopped(t, &out);
    out.lacks("survived");
}
attack!(
    deleted_but_in_flight,
    native_ignore = "no /proc file shows a descriptor in flight: `cordon run` on a user's directory has no volume; a server's workspaces do (server/tests/suite/retention.rs)"
);

/// Hard links count once: 40 MiB linked twenty times is 40 MiB.
fn hard_links_count_once(t: &Ctx) {
    let out = t.sh_with(
        LIMITS,
        "head -c 41943040 /dev/zero > /workspace/f && \
         for i in $(seq 20); do ln /workspace/f /workspace/l$i; done && sleep 1 && echo done",
    );
    out.code(0).line("done");
}
attack!(hard_links_count_once);

/// A sparse file counts what it holds. Natively no file may be larger than
/// the budget (RLIMIT_FSIZE), even a sparse one; in a microVM the guest's
/// root could lift that limit, and the watcher counts allocated bytes.
fn sparse_file(t: &Ctx) {
    let out = t.sh_with(
        LIMITS,
        "truncate -s 1G /workspace/sparse && echo large-sparse; \
         truncate -s 60M /workspace/small-sparse && echo small-sparse; sleep 1; echo done",
    );
    out.code(0).line("small-sparse").line("done");
    if t.vm() {
        out.line("large-sparse");
    } else {
        out.lacks("large-sparse")
            .stderr_has("File size limit exceeded");
    }
}
attack!(sparse_file);

/// A command that writes one file past the budget is killed by SIGXFSZ
/// (natively the budget is also RLIMIT_FSIZE) while the sandbox lives on:
/// cordon keeps the command's status and says which limit it ran into.
fn file_past_the_budget_says_why(t: &Ctx) {
    let out = t.run(LIMITS, &["truncate", "-s", "1G", "/workspace/sparse"]);
    out.code(128 + libc::SIGXFSZ)
        .stderr_has("cordon: killed by SIGXFSZ: a file reached the largest size the sandbox may write, its 64 MiB disk budget (raise it with --disk)");
}
attack!(file_past_the_budget_says_why, native);

/// Links to a big host directory, and to the host's root, are neither
/// counted nor followed: the sandbox is not stopped, and the watcher
/// changes nothing they point at (not even a locked directory's mode).
fn links_out_are_not_followed(t: &Ctx) {
    let big = t.outside.join("big");
    std::fs::create_dir(&big).unwrap();
    std::fs::write(big.join("data"), vec![7u8; 200 * MIB as usize]).unwrap();
    let locked = t.outside.join("locked");
    std::fs::create_dir(&locked).unwrap();
    std::fs::write(locked.join("data"), vec![7u8; 100 * MIB as usize]).unwrap();
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o000)).unwrap();
    let script = format!(
        "ln -s {big} /workspace/big && ln -s / /workspace/root && ln -s {locked} /workspace/locked \
         && mkdir /workspace/d && ln -s {big} /workspace/d/big && sleep 2 && echo done",
        big = big.display(),
        locked = locked.display()
    );
    let out = t.sh_with(LIMITS, &script);
    out.code(0).line("done");
    let mode = std::fs::metadata(&locked).unwrap().permissions().mode() & 0o7777;
    if mode != 0 {
        out.fail(format_args!(
            "HOST CHANGED: a directory outside the workspace went from mode 000 to {mode:o}"
        ));
    }
    std::fs::set_permissions(&locked, std::fs::Permissions::from_mode(0o755)).unwrap();
}
attack!(links_out_are_not_followed);

/// Under the budget nothing happens: a build that writes 20 MiB and
/// deletes 30 it found is fine, and the budget is on growth, not on what
/// the workspace held before.
fn growth_not_size_is_budgeted(t: &Ctx) {
    std::fs::write(t.workspace.join("old"), vec![1u8; 100 * MIB as usize]).unwrap();
    if !t.root() && !t.vm() {
        std::os::unix::fs::chown(t.workspace.join("old"), Some(t.uid), Some(t.gid)).unwrap();
    }
    let out = t.sh_with(
        LIMITS,
        "head -c 20971520 /dev/zero > /workspace/new && sleep 1 && echo done",
    );
    out.code(0).line("done");
}
attack!(growth_not_size_is_budgeted);

/// A bad `--disk` is a usage error, not a sandbox without a budget.
#[test]
fn bad_budgets_are_refused() {
    for bad in ["lots", "10K", "0"] {
        let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(["run", "--disk", bad, "--", "true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "--disk {bad}: {out:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("invalid value"), "--disk {bad}: {err}");
    }
}
