//! The escape battery: real attacks made from inside `cordon run`.
//!
//! Every attack runs four times, as `<attack>::root` (cordon started by
//! root: cgroup limits, sandbox uid 0 is a host uid of its own over
//! idmapped mounts), as `<attack>::unprivileged` (cordon started as uid/gid
//! 65534, or as the invoking user when the tests do not run as root:
//! rlimits), as `<attack>::microvm` (cordon started by root with the
//! microvm backend under TCG) and as `in_image::<attack>` (cordon started
//! by root with the seeds environment as the root: root inside, with a
//! package manager's capabilities in its own user namespace and a writable
//! layer of its own). Each asserts the precise way the attempt fails and
//! that the host (and, in an image, the store's shared layers) is
//! unchanged.
//!
//! In a microVM the command is the guest's root, with every capability and
//! no seccomp filter, on the guest's own kernel: what only touches the guest
//! (mounting in it, its namespaces, BPF, its kernel log, its clock) is
//! allowed, and the variant asserts what really happens in the guest and
//! that the host is unchanged. After every microvm run the harness also
//! checks that QEMU is gone, that the run left no set-id file, device node
//! or foreign owner in the host workspace, and that cordon removed its run
//! directory.
//!
//! When the tests do not run as root, the root and microvm variants print
//! a notice and pass, except under `CI=true`, where they fail.
//!
//! A failing test here is a sandbox hole (or a regression): fix the
//! sandbox, never the expectation. Failures that changed the host say
//! `HOST CHANGED` and, where the harness can, put the host back first. A
//! known hole of one backend is marked `#[ignore = "HOLE: …"]` on that
//! variant only, still failing when run with `--ignored`.
//!
//! Run with `cargo test -p cordon-cli --test all escape::`; as root to get every
//! variant of every attack (the microvm ones need QEMU and the guest kernel
//! of `cordon vm setup`).

use crate::common;

use std::fs;
use std::io::{ErrorKind, Read};
use std::net::{TcpListener, UdpSocket};
use std::os::unix::fs::{PermissionsExt, symlink};
use std::path::Path;
use std::process::Stdio;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::*;

/// Serialises the attacks on host-global objects (/dev/full, a procfs
/// entry), so that one variant's change is not blamed on the other.
static HOST_GLOBALS: Mutex<()> = Mutex::new(());

fn lock_host_globals() -> std::sync::MutexGuard<'static, ()> {
    HOST_GLOBALS.lock().unwrap_or_else(|e| e.into_inner())
}

/// Whether a command exists on the host; /usr, /bin and /sbin are the
/// host's own inside the sandbox, so it exists there too.
fn host_has(cmd: &str) -> bool {
    ["/usr/bin", "/usr/sbin", "/bin", "/sbin"]
        .iter()
        .any(|d| Path::new(d).join(cmd).exists())
}

/// A regular file of the host's /etc that the sandbox binds read-only.
fn bound_etc_file() -> &'static str {
    [
        "/etc/nsswitch.conf",
        "/etc/protocols",
        "/etc/services",
        "/etc/ld.so.cache",
    ]
    .into_iter()
    .find(|p| fs::symlink_metadata(p).is_ok_and(|m| m.is_file()))
    .expect("no bound /etc file found on this host")
}

/// Syscall numbers for the Python scripts, from the libc crate, so that
/// the scripts are right on every architecture.
fn nr_table() -> String {
    let mut t = vec![
        ("kexec_load", libc::SYS_kexec_load),
        ("kexec_file_load", libc::SYS_kexec_file_load),
        ("reboot", libc::SYS_reboot),
        ("init_module", libc::SYS_init_module),
        ("finit_module", libc::SYS_finit_module),
        ("delete_module", libc::SYS_delete_module),
        ("bpf", libc::SYS_bpf),
        ("perf_event_open", libc::SYS_perf_event_open),
        ("userfaultfd", libc::SYS_userfaultfd),
        ("keyctl", libc::SYS_keyctl),
        ("add_key", libc::SYS_add_key),
        ("request_key", libc::SYS_request_key),
        ("io_uring_setup", libc::SYS_io_uring_setup),
        ("io_uring_enter", libc::SYS_io_uring_enter),
        ("io_uring_register", libc::SYS_io_uring_register),
        ("clone", libc::SYS_clone),
        ("clone3", libc::SYS_clone3),
        ("unshare", libc::SYS_unshare),
        ("setns", libc::SYS_setns),
        ("mount", libc::SYS_mount),
        ("umount2", libc::SYS_umount2),
        ("pivot_root", libc::SYS_pivot_root),
        ("chroot", libc::SYS_chroot),
        ("fsopen", libc::SYS_fsopen),
        ("fsconfig", libc::SYS_fsconfig),
        ("fsmount", libc::SYS_fsmount),
        ("fspick", libc::SYS_fspick),
        ("open_tree", libc::SYS_open_tree),
        ("move_mount", libc::SYS_move_mount),
        ("mount_setattr", libc::SYS_mount_setattr),
        ("ptrace", libc::SYS_ptrace),
        ("pidfd_open", libc::SYS_pidfd_open),
        ("open_by_handle_at", libc::SYS_open_by_handle_at),
        ("name_to_handle_at", libc::SYS_name_to_handle_at),
        ("sethostname", libc::SYS_sethostname),
        ("settimeofday", libc::SYS_settimeofday),
        ("clock_settime", libc::SYS_clock_settime),
        ("adjtimex", libc::SYS_adjtimex),
        ("syslog", libc::SYS_syslog),
        ("capset", libc::SYS_capset),
        ("getpid", libc::SYS_getpid),
    ];
    #[cfg(target_arch = "x86_64")]
    t.push(("X32", 0x4000_0000));
    #[cfg(not(target_arch = "x86_64"))]
    t.push(("X32", -1));
    let body: Vec<String> = t.iter().map(|(k, v)| format!("{k}={v}")).collect();
    format!("NR = dict({})\n", body.join(", "))
}

/// Runs a Python script with the syscall table available as `NR`.
fn py_nr(t: &Ctx, opts: &[&str], code: &str) -> Out {
    t.py_with(opts, &format!("{}{}", nr_table(), dedent(code)))
}

// ───────────────────────── writing outside the workspace ─────────────────────────

/// Create files under /usr and touch a system binary.
fn write_to_usr(t: &Ctx) {
    let name = format!("cordon-escape-{}", unique());
    let before = snapshot(&["/usr/bin/env"]);
    let out = t.sh(&format!(
        "echo pwned > /usr/{name}; echo pwned > /usr/bin/{name}; echo pwned > /bin/{name}.b; \
         mkdir /usr/lib/{name}; touch -c /usr/bin/env; chmod 777 /usr/bin/env; echo done"
    ));
    if t.image() {
        // An image's root writes its own layer: every write lands there,
        // and there only.
        out.code(0).line("done").lacks("Read-only").lacks("denied");
        assert_absent(&out, &[format!("/usr/{name}"), format!("/usr/lib/{name}")]);
        assert_unchanged(&out, &before);
        t.assert_gone_with_the_sandbox(
            &out,
            &[&format!("/usr/{name}"), &format!("/usr/bin/{name}")],
        );
        return;
    }
    out.code(0)
        .line("done")
        .stderr_has(&format!("/usr/{name}: Read-only file system"))
        .stderr_has(&format!("/usr/bin/{name}: Read-only file system"))
        .stderr_has(&format!("/bin/{name}.b: Read-only file system"))
        .stderr_has(&format!(
            "mkdir: cannot create directory '/usr/lib/{name}': Read-only file system"
        ))
        .stderr_has("touch: setting times of '/usr/bin/env': Read-only file system")
        .stderr_has("chmod: changing permissions of '/usr/bin/env': Read-only file system");
    assert_absent(
        &out,
        &[
            format!("/usr/{name}"),
            format!("/usr/bin/{name}"),
            format!("/usr/bin/{name}.b"),
            format!("/usr/lib/{name}"),
        ],
    );
    assert_unchanged(&out, &before);
    if t.vm() {
        // The guest's root may remount its /usr read-write; QEMU's share
        // stays read-only.
        let out = t.sh(&format!(
            "mount -o remount,rw /usr && echo remounted; echo pwned > /usr/{name}.rw; \
             chmod 777 /usr/bin/env; echo done"
        ));
        out.code(0)
            .line("remounted")
            .line("done")
            .stderr_has(&format!("/usr/{name}.rw: Read-only file system"))
            .stderr_has("chmod: changing permissions of '/usr/bin/env': Read-only file system");
        assert_absent(&out, &[format!("/usr/{name}.rw")]);
        assert_unchanged(&out, &before);
    }
}
attack!(write_to_usr);

/// Create a file in /etc, open a bound host /etc file for writing,
/// touch it, and add a user to the sandbox's /etc/passwd.
fn write_to_etc(t: &Ctx) {
    let name = format!("cordon-escape-{}", unique());
    let etc = bound_etc_file();
    let before = snapshot(&[etc]);
    // The guest's root may also remount its /etc (a staged copy, shared
    // read-only) read-write.
    let remount = if t.vm() {
        format!("mount -o remount,rw /etc && echo remounted; echo pwned > /etc/{name}.rw; ")
    } else {
        String::new()
    };
    let out = t.sh(&format!(
        "echo pwned > /etc/{name}; printf '' >> {etc}; touch -c {etc}; \
         echo 'evil::0:0::/:/bin/sh' >> /etc/passwd; {remount}echo done"
    ));
    if t.image() {
        // The image's /etc is its own (cordon's hosts, hostname and
        // resolv.conf in it): root inside writes it, the host's stays.
        out.code(0).line("done").lacks("Read-only").lacks("denied");
        assert_absent(&out, &[format!("/etc/{name}")]);
        assert_unchanged(&out, &before);
        if fs::read_to_string("/etc/passwd").is_ok_and(|p| p.contains("evil::0:0")) {
            out.fail("HOST CHANGED: /etc/passwd has the sandbox's user");
        }
        t.assert_gone_with_the_sandbox(&out, &[&format!("/etc/{name}")]);
        return;
    }
    let append = if t.vm() {
        "Read-only file system"
    } else {
        t.pick("Read-only file system", "Permission denied")
    };
    out.code(0)
        .line("done")
        .stderr_has(&format!("/etc/{name}: Read-only file system"))
        .stderr_has(&format!("{etc}: {append}"))
        .stderr_has(&format!(
            "touch: setting times of '{etc}': Read-only file system"
        ))
        .stderr_has("/etc/passwd: Read-only file system");
    if t.vm() {
        out.line("remounted")
            .stderr_has(&format!("/etc/{name}.rw: Read-only file system"));
    }
    assert_absent(&out, &[format!("/etc/{name}"), format!("/etc/{name}.rw")]);
    assert_unchanged(&out, &before);
}
attack!(write_to_etc);

/// Create files, directories and symlinks in / and through /bin.
fn write_to_root_dir(t: &Ctx) {
    let name = format!("cordon-escape-{}", unique());
    let out = t.sh(&format!(
        "touch /{name}; mkdir /{name}.d; ln -s /etc /{name}.l; mv /workspace /{name}.w; \
         ls -d /{name}*; echo done"
    ));
    if t.own_root() {
        // The guest's / is its own initramfs, an image's its own layer,
        // writable by its root; the workspace is a mount point there.
        out.code(0)
            .line("done")
            .line(&format!("/{name}"))
            .line(&format!("/{name}.d"))
            .line(&format!("/{name}.l"))
            .only_lines(&[
                "done",
                &format!("/{name}"),
                &format!("/{name}.d"),
                &format!("/{name}.l"),
            ])
            .stderr_has(&format!(
                "mv: cannot move '/workspace' to '/{name}.w': Device or resource busy"
            ));
    } else {
        out.code(0)
            .line("done")
            .stderr_has(&format!(
                "touch: cannot touch '/{name}': Read-only file system"
            ))
            .stderr_has(&format!(
                "mkdir: cannot create directory '/{name}.d': Read-only file system"
            ))
            .stderr_has(&format!(
                "ln: failed to create symbolic link '/{name}.l': Read-only file system"
            ))
            .stderr_has(&format!(
                "mv: cannot move '/workspace' to '/{name}.w': Read-only file system"
            ))
            .stderr_has(&format!(
                "ls: cannot access '/{name}*': No such file or directory"
            ));
    }
    assert_absent(
        &out,
        &[
            format!("/{name}"),
            format!("/{name}.d"),
            format!("/{name}.l"),
            format!("/{name}.w"),
        ],
    );
    assert!(t.workspace.is_dir());
    t.assert_gone_with_the_sandbox(&out, &[&format!("/{name}"), &format!("/{name}.d")]);
}
attack!(write_to_root_dir);

/// Write to the host paths of a canary file and of the test's host
/// directory, which exist on the host but not in the sandbox.
fn write_to_host_path(t: &Ctx) {
    let name = format!("cordon-escape-{}", unique());
    let canary = t.host_file("canary", "host-original\n");
    let dir = t.dir().display().to_string();
    let outside = t.outside.display().to_string();
    let before = snapshot(&[&canary]);
    let c = canary.display();
    let out = t.sh(&format!(
        "echo pwned > {c}; echo pwned >> {c}; echo pwned > {dir}/{name}; mkdir {outside}/{name}; \
         truncate -s 0 {c}; echo done"
    ));
    out.code(0)
        .line("done")
        .stderr_has(&format!("{c}: No such file or directory"))
        .stderr_has(&format!("{dir}/{name}: No such file or directory"))
        .stderr_has(&format!(
            "mkdir: cannot create directory '{outside}/{name}': No such file or directory"
        ))
        .stderr_has(&format!(
            "truncate: cannot open '{c}' for writing: No such file or directory"
        ));
    assert_unchanged(&out, &before);
    assert_absent(&out, &[t.dir().join(&name), t.outside.join(&name)]);
}
attack!(write_to_host_path);

/// Follow symlinks the host planted in the workspace: absolute and
/// relative links to a host directory, to a host file, to /etc and to
/// the workspace's host parent.
fn symlink_planted_by_host(t: &Ctx) {
    let name = format!("cordon-escape-{}", unique());
    let canary = t.host_file("canary", "host-original\n");
    let secret = t.host_file("secret", "host-secret-token\n");
    let ws = &t.workspace;
    symlink(&t.outside, ws.join("abs")).unwrap();
    symlink("../outside", ws.join("rel")).unwrap();
    symlink(&canary, ws.join("canary-link")).unwrap();
    symlink(&secret, ws.join("secret-link")).unwrap();
    symlink("/etc", ws.join("etc")).unwrap();
    symlink(t.dir(), ws.join("up")).unwrap();
    let before = snapshot(&[&canary, &secret]);
    let out = t.sh(&format!(
        "echo pwned > abs/canary; echo pwned > rel/canary; echo pwned > canary-link; \
         cat secret-link; cat rel/secret; echo pwned > etc/{name}; echo pwned > up/{name}; \
         ls abs/; echo done"
    ));
    out.code(0)
        .line("done")
        .stderr_has("abs/canary: No such file or directory")
        .stderr_has("rel/canary: No such file or directory")
        .stderr_has("canary-link: No such file or directory")
        .stderr_has("cat: secret-link: No such file or directory")
        .stderr_has("cat: rel/secret: No such file or directory")
        .stderr_has(&format!("up/{name}: No such file or directory"))
        .stderr_has("ls: cannot access 'abs/': No such file or directory")
        .lacks("host-secret-token");
    if t.image() {
        // /etc is the image's own, writable: the link leads there.
        out.lacks(&format!("etc/{name}:"));
        t.assert_gone_with_the_sandbox(&out, &[&format!("/etc/{name}")]);
    } else {
        out.stderr_has(&format!("etc/{name}: Read-only file system"));
    }
    assert_unchanged(&out, &before);
    assert_absent(
        &out,
        &[
            format!("/etc/{name}"),
            t.dir().join(&name).display().to_string(),
        ],
    );
}
attack!(symlink_planted_by_host);

/// Plant symlinks from inside (to the host directory's path, to
/// ../outside, /etc, / and /proc/1/root) and write through them.
fn symlink_created_inside(t: &Ctx) {
    let name = format!("cordon-escape-{}", unique());
    let canary = t.host_file("canary", "host-original\n");
    let before = snapshot(&[&canary]);
    let outside = t.outside.display();
    let c = canary.display();
    let out = t.sh(&format!(
        "ln -s {outside} in-abs && echo pwned > in-abs/canary; \
         ln -s ../outside in-rel && echo pwned > in-rel/canary; \
         ln -s /etc in-etc && echo pwned > in-etc/{name}; \
         ln -s / in-root && echo pwned > in-root/{name}; \
         ln -s /proc/1/root in-init && ls in-init/; \
         ln -s {c} in-file && echo pwned > in-file; echo done"
    ));
    out.code(0)
        .line("done")
        .stderr_has("in-abs/canary: No such file or directory")
        .stderr_has("in-rel/canary: No such file or directory")
        .stderr_has("in-file: No such file or directory");
    if t.image() {
        // / and /etc are the image's own: the links lead there, and pid
        // 1's root stays closed (in a guest, it is the image's root too).
        out.lacks(&format!("in-etc/{name}:"))
            .lacks(&format!("in-root/{name}:"));
        if t.vm() {
            out.line(&name).line("workspace").lacks("in-init/");
        } else {
            out.stderr_has("ls: cannot access 'in-init/': Permission denied");
        }
        t.assert_gone_with_the_sandbox(&out, &[&format!("/etc/{name}"), &format!("/{name}")]);
    } else if t.vm() {
        out.stderr_has(&format!("in-etc/{name}: Read-only file system"));
        // The guest's / is its own, writable initramfs, and its root may
        // look through pid 1's root: both lead to the guest's / only.
        out.line(&name)
            .line("workspace")
            .line("init")
            .lacks(&format!("in-root/{name}:"))
            .lacks("in-init/");
    } else {
        out.stderr_has(&format!("in-etc/{name}: Read-only file system"))
            .stderr_has(&format!("in-root/{name}: Read-only file system"))
            .stderr_has("ls: cannot access 'in-init/': Permission denied");
    }
    // The links were made (in the workspace), the writes went nowhere.
    assert!(fs::symlink_metadata(t.workspace.join("in-rel")).is_ok_and(|m| m.is_symlink()));
    assert_unchanged(&out, &before);
    assert_absent(&out, &[format!("/etc/{name}"), format!("/{name}")]);
}
attack!(symlink_created_inside);

/// Reach the host through /proc/self/root and /proc/self/cwd.
fn write_via_proc_self_root(t: &Ctx) {
    let name = format!("cordon-escape-{}", unique());
    let canary = t.host_file("canary", "host-original\n");
    let secret = t.host_file("secret", "host-secret-token\n");
    let before = snapshot(&[&canary, &secret]);
    let (c, s) = (canary.display(), secret.display());
    let out = t.sh(&format!(
        "echo pwned > /proc/self/root/usr/{name}; echo pwned > /proc/self/root{c}; \
         cat /proc/self/root{s}; echo pwned > /proc/self/root/../../{name}; \
         echo pwned > /proc/self/cwd/../{name}; echo done"
    ));
    out.code(0)
        .line("done")
        .stderr_has(&format!("/proc/self/root{c}: No such file or directory"))
        .stderr_has(&format!(
            "cat: /proc/self/root{s}: No such file or directory"
        ))
        .lacks("host-secret-token");
    if t.image() {
        // Each lands in the image's own layer.
        out.lacks(&format!("/usr/{name}:"))
            .lacks(&format!("/../{name}:"));
        t.assert_gone_with_the_sandbox(&out, &[&format!("/usr/{name}"), &format!("/{name}")]);
    } else if t.vm() {
        // Both land in the guest's own writable /.
        out.stderr_has(&format!(
            "/proc/self/root/usr/{name}: Read-only file system"
        ))
        .lacks(&format!("/../{name}:"));
    } else {
        out.stderr_has(&format!(
            "/proc/self/root/usr/{name}: Read-only file system"
        ))
        .stderr_has(&format!(
            "/proc/self/root/../../{name}: Read-only file system"
        ))
        .stderr_has(&format!("/proc/self/cwd/../{name}: Read-only file system"));
    }
    assert_unchanged(&out, &before);
    assert_absent(
        &out,
        &[
            format!("/usr/{name}"),
            format!("/{name}"),
            t.dir().join(&name).display().to_string(),
        ],
    );
}
attack!(write_via_proc_self_root);

/// Go through the supervisor's root, /proc/1/root (and its cwd).
fn write_via_proc_1_root(t: &Ctx) {
    let name = format!("cordon-escape-{}", unique());
    let secret = t.host_file("secret", "host-secret-token\n");
    let s = secret.display();
    let out = t.sh(&format!(
        "ls /proc/1/root/; cat /proc/1/root/etc/hostname; echo pwned > /proc/1/root/tmp/{name}; \
         cd /proc/1/root; cat /proc/1/root{s}; ls -l /proc/1/cwd; echo done"
    ));
    if t.vm() && t.image() {
        // Pid 1's root is the image's, the guest's own: its /etc has
        // cordon's hostname; no host path in it.
        out.code(0)
            .line("done")
            .line("workspace")
            .line("cordon")
            .stdout_has("/proc/1/cwd -> /workspace")
            .stderr_has(&format!("cat: /proc/1/root{s}: No such file or directory"))
            .lacks("Permission denied")
            .lacks("host-secret-token");
        t.assert_gone_with_the_sandbox(&out, &[&format!("/tmp/{name}")]);
    } else if t.vm() {
        // The guest's root may enter its pid 1's root: the guest's own /,
        // with its own /tmp, and no host path in it.
        out.code(0)
            .line("done")
            .line("workspace")
            .line("init")
            .stdout_has("/proc/1/cwd -> /workspace")
            .stderr_has("cat: /proc/1/root/etc/hostname: No such file or directory")
            .stderr_has(&format!("cat: /proc/1/root{s}: No such file or directory"))
            .lacks("Permission denied")
            .lacks("host-secret-token");
    } else {
        out.code(0)
            .line("done")
            .stderr_has("ls: cannot access '/proc/1/root/': Permission denied")
            .stderr_has("cat: /proc/1/root/etc/hostname: Permission denied")
            .stderr_has(&format!("/proc/1/root/tmp/{name}: Permission denied"))
            .stderr_has("cd: /proc/1/root: Permission denied")
            .stderr_has(&format!("cat: /proc/1/root{s}: Permission denied"))
            .stderr_has("ls: cannot read symbolic link '/proc/1/cwd': Permission denied")
            .lacks("host-secret-token");
    }
    assert_absent(&out, &[format!("/tmp/{name}")]);
}
attack!(write_via_proc_1_root);

/// Climb out of /workspace with `..` to the host directory around it.
fn dotdot_from_workspace(t: &Ctx) {
    let name = format!("cordon-escape-{}", unique());
    let canary = t.host_file("canary", "host-original\n");
    let secret = t.host_file("secret", "host-secret-token\n");
    let before = snapshot(&[&canary, &secret]);
    let s = secret.display();
    let out = t.sh(&format!(
        "cd /workspace/../../..; pwd; ls -a /workspace/.. | tr '\\n' ' '; echo; \
         cat /workspace/../outside/secret; echo pwned > /workspace/../{name}; \
         cd /workspace; echo pwned > ../outside/canary; cat ../../../../../..{s}; echo done"
    ));
    out.code(0)
        .line("done")
        .line("/")
        .stderr_has("cat: /workspace/../outside/secret: No such file or directory")
        .stderr_has("../outside/canary: No such file or directory")
        .stderr_has(&format!(
            "cat: ../../../../../..{s}: No such file or directory"
        ))
        .lacks("host-secret-token");
    // The parent of /workspace is the sandbox's root, not the host dir.
    let listing = out.stdout.lines().nth(1).unwrap_or("");
    if listing.split_whitespace().any(|e| e == "outside") || !listing.contains("workspace") {
        out.fail("/workspace/.. is not the sandbox root");
    }
    if t.own_root() {
        // The guest's own /, an image's own layer, is writable by its root.
        out.lacks(&format!("/workspace/../{name}:"));
        t.assert_gone_with_the_sandbox(&out, &[&format!("/{name}")]);
    } else {
        out.stderr_has(&format!("/workspace/../{name}: Read-only file system"));
    }
    assert_unchanged(&out, &before);
    assert_absent(&out, &[t.dir().join(&name)]);
}
attack!(dotdot_from_workspace);

/// Modify a host directory bound read-only with --ro, even though its
/// permissions would allow it.
fn write_to_ro_bind(t: &Ctx) {
    let data = t.outside.join("data");
    fs::create_dir(&data).unwrap();
    fs::set_permissions(&data, fs::Permissions::from_mode(0o777)).unwrap();
    let f = data.join("f");
    fs::write(&f, "host-original\n").unwrap();
    fs::set_permissions(&f, fs::Permissions::from_mode(0o666)).unwrap();
    let before = snapshot(&[&data, &f]);
    let bind = format!("{}:/data", data.display());
    // The guest's root may remount its /data read-write; the share stays
    // read-only.
    let remount = if t.vm() {
        "mount -o remount,rw /data && echo remounted; touch /data/after-remount; "
    } else {
        ""
    };
    let out = t.sh_with(
        &["--ro", &bind],
        &format!(
            "cat /data/f; echo pwned > /data/f; echo pwned >> /data/f; \
             touch /data/new; rm /data/f; mv /data/f /data/g; chmod 600 /data/f; {remount}echo done"
        ),
    );
    if t.vm() {
        out.line("remounted")
            .stderr_has("touch: cannot touch '/data/after-remount': Read-only file system");
    }
    out.code(0)
        .line("done")
        .line("host-original")
        .stderr_has("/data/f: Read-only file system")
        .stderr_has("touch: cannot touch '/data/new': Read-only file system")
        .stderr_has("rm: cannot remove '/data/f': Read-only file system")
        .stderr_has("mv: cannot move '/data/f' to '/data/g': Read-only file system")
        .stderr_has("chmod: changing permissions of '/data/f': Read-only file system");
    assert_unchanged(&out, &before);
    assert_absent(
        &out,
        &[data.join("new"), data.join("g"), data.join("after-remount")],
    );
}
attack!(write_to_ro_bind);

/// Hard-link host files into the writable workspace (and /tmp).
fn hardlink_host_file(t: &Ctx) {
    let etc = bound_etc_file();
    let out = t.sh(&format!(
        "ln /usr/bin/id /workspace/id-link; ln {etc} /workspace/etc-link; ln /usr/bin/id /tmp/id-link; echo done"
    ));
    out.code(0)
        .line("done")
        .stderr_has("ln: failed to create hard link '/workspace/id-link' => '/usr/bin/id': Invalid cross-device link")
        .stderr_has(&format!("ln: failed to create hard link '/workspace/etc-link' => '{etc}': Invalid cross-device link"))
        .stderr_has("ln: failed to create hard link '/tmp/id-link' => '/usr/bin/id': Invalid cross-device link");
    assert_absent(
        &out,
        &[t.workspace.join("id-link"), t.workspace.join("etc-link")],
    );
}
attack!(hardlink_host_file);

/// Create device nodes (/dev/mem, a disk) to reach host memory or disks.
fn mknod_device(t: &Ctx) {
    let name = format!("cordon-escape-{}", unique());
    let out = t.sh(&format!(
        "mknod /workspace/mem c 1 1; mknod /tmp/sda b 8 0; mknod /dev/{name} c 1 3; \
         python3 -c 'import os; os.mknod(\"/workspace/py-mem\", 0o20666, os.makedev(1, 1))'; echo done"
    ));
    if t.vm() {
        // The guest's root may make nodes in its own /tmp (nodev) and
        // /dev; in the workspace the host's file server (QEMU's 9p, or
        // virtiofsd) is refused them by cordon's filter.
        out.code(0)
            .line("done")
            .stderr_has("mknod: /workspace/mem: Operation not permitted")
            .stderr_has("PermissionError: [Errno 1] Operation not permitted\n")
            .lacks("/tmp/sda")
            .lacks(&format!("/dev/{name}"));
    } else {
        out.code(0)
            .line("done")
            .stderr_has("mknod: /workspace/mem: Operation not permitted")
            .stderr_has("mknod: /tmp/sda: Operation not permitted")
            .stderr_has(&format!("mknod: /dev/{name}: Read-only file system"))
            .stderr_has("PermissionError: [Errno 1] Operation not permitted\n");
    }
    assert_absent(
        &out,
        &[
            t.workspace.join("mem"),
            t.workspace.join("py-mem"),
            Path::new("/dev").join(&name),
        ],
    );
}
attack!(mknod_device);

/// Change the mode and times of a host device node the sandbox
/// binds (/dev/full is the host's own inode).
fn chmod_host_device_node(t: &Ctx) {
    use std::os::unix::fs::MetadataExt;
    let _g = lock_host_globals();
    let dev = Path::new("/dev/full");
    let meta = fs::metadata(dev).expect("/dev/full");
    let before = snapshot(&[dev]);
    let out = t.sh(
        "chmod 0600 /dev/full; chmod 4666 /dev/full; touch -d '2001-01-01 00:00:00' /dev/full; \
         stat -c 'sandbox-mode=%a' /dev/full; echo done",
    );
    let after = file_state(dev);
    if after != before[0].1 {
        // Put the host back before reporting.
        if euid() == 0 {
            let _ = std::os::unix::fs::chown(dev, Some(meta.uid()), Some(meta.gid()));
            let _ = fs::set_permissions(dev, fs::Permissions::from_mode(meta.mode() & 0o7777));
            if let Ok(f) = fs::File::options().write(true).open(dev) {
                let _ = f.set_times(
                    fs::FileTimes::new()
                        .set_accessed(meta.accessed().unwrap())
                        .set_modified(meta.modified().unwrap()),
                );
            }
        }
        out.fail(format_args!(
            "HOST CHANGED: the sandbox changed the host's /dev/full: was {:?}, became {after:?} (restored)",
            before[0].1
        ));
    }
    out.code(0).line("done");
    if t.vm() {
        // The guest's /dev/full is its own devtmpfs node.
        out.line("sandbox-mode=4666").lacks("/dev/full:");
        return;
    }
    for line in [
        "chmod: changing permissions of '/dev/full': ",
        "touch: setting times of '/dev/full': ",
    ] {
        if !["Operation not permitted", "Read-only file system"]
            .iter()
            .any(|e| out.stderr.contains(&format!("{line}{e}")))
        {
            out.fail(format_args!(
                "expected {line:?} to fail with EPERM or EROFS"
            ));
        }
    }
}
attack!(chmod_host_device_node);

/// Change the mode of a global procfs entry: procfs keeps one mode per
/// entry for every mount, so a change would be seen by the host.
fn chmod_global_proc_entry(t: &Ctx) {
    use std::os::unix::fs::MetadataExt;
    let _g = lock_host_globals();
    let entry = ["/proc/execdomains", "/proc/consoles", "/proc/buddyinfo"]
        .into_iter()
        .find(|p| fs::metadata(p).is_ok_and(|m| m.mode() & 0o777 == 0o444))
        .expect("no 0444 procfs entry to test with");
    let out = t.sh(&format!(
        "chmod 0400 {entry}; chmod 0666 {entry}; stat -c 'sandbox-mode=%a' {entry}; echo done"
    ));
    let host_mode = fs::metadata(entry).unwrap().mode() & 0o7777;
    if host_mode != 0o444 {
        let _ = fs::set_permissions(entry, fs::Permissions::from_mode(0o444));
        out.fail(format_args!(
            "HOST CHANGED: the host's {entry} became {host_mode:o} (restored to 444)"
        ));
    }
    // A fresh procfs mount (a new sandbox) shows the entry's global mode.
    let check = t.run(&[], &["stat", "-c", "%a", entry]);
    if check.stdout.trim() != "444" {
        if euid() == 0 {
            let _ = fs::set_permissions(entry, fs::Permissions::from_mode(0o444));
        }
        out.fail(format_args!(
            "HOST CHANGED: the sandbox changed the mode of the host-global {entry} to {} \
             (a fresh procfs mount shows it; restored to 444)",
            check.stdout.trim()
        ));
    }
    out.code(0).line("done");
    if t.vm() {
        // The guest's own procfs entry.
        out.line("sandbox-mode=666").lacks("chmod:");
        return;
    }
    for e in ["Operation not permitted", "Read-only file system"] {
        if out
            .stderr
            .contains(&format!("chmod: changing permissions of '{entry}': {e}"))
        {
            return;
        }
    }
    out.fail("expected chmod to fail with EPERM or EROFS");
}
attack!(chmod_global_proc_entry);

/// Leave setuid/setgid executables in the host workspace: a host user
/// who runs one would get the sandbox owner's identity (root's, when
/// cordon runs as root).
fn setuid_binary_planted_in_workspace(t: &Ctx) {
    // In a microVM the guest's root also tries a file capability
    // (cap_setuid+ep) and a foreign owner: QEMU writes the files as host
    // root, so either would hand host users root's powers.
    let vm_extra = if t.vm() {
        "cp /usr/bin/id planted-cap && python3 -c 'import os; os.setxattr(\"planted-cap\", \"security.capability\", \
         bytes.fromhex(\"0100000280000000000000000000000000000000\"))'; \
         chown 1234:1234 planted-cap; chown 0:1234 planted-cap; chmod g+s /workspace; chown 1234 /workspace; "
    } else {
        ""
    };
    let out = t.sh(&format!(
        "cp /usr/bin/id planted-suid && chmod 4755 planted-suid; \
         cp /usr/bin/id planted-sgid && chmod 2755 planted-sgid; \
         python3 -c 'import os; os.close(os.open(\"planted-creat\", os.O_CREAT | os.O_WRONLY, 0o6755))'; \
         cp /usr/bin/id planted-both && chmod u+s,g+s planted-both; {vm_extra}echo done",
    ));
    out.code(0).line("done");
    if t.vm() {
        // QEMU's seccomp filter refuses set-id modes and chown; its 9p
        // server (security_model=none) stores no security.* attributes.
        out.stderr_has("chmod: changing permissions of 'planted-suid': Operation not permitted")
            .stderr_has("chmod: changing permissions of 'planted-sgid': Operation not permitted")
            .stderr_has("chmod: changing permissions of 'planted-both': Operation not permitted")
            .stderr_has("PermissionError: [Errno 1] Operation not permitted: 'planted-creat'")
            .stderr_has("OSError: [Errno 95] Operation not supported: 'planted-cap'")
            .stderr_has("chown: changing ownership of 'planted-cap': Operation not permitted")
            .stderr_has("chmod: changing permissions of '/workspace': Operation not permitted")
            .stderr_has("chown: changing ownership of '/workspace': Operation not permitted");
        let cap = t.workspace.join("planted-cap");
        if let Some(v) = host_xattr(&cap, "security.capability") {
            out.fail(format_args!(
                "HOST CHANGED: planted-cap carries security.capability {v:02x?} on the host"
            ));
        }
        use std::os::unix::fs::MetadataExt;
        let m = fs::symlink_metadata(&cap).unwrap();
        if (m.uid(), m.gid()) != (0, 0) {
            out.fail(format_args!(
                "HOST CHANGED: planted-cap is owned by {}:{} on the host",
                m.uid(),
                m.gid()
            ));
        }
    }
    let mut bad = Vec::new();
    for name in [
        "planted-suid",
        "planted-sgid",
        "planted-creat",
        "planted-both",
    ] {
        let p = t.workspace.join(name);
        if let Ok(m) = fs::metadata(&p) {
            let mode = m.permissions().mode();
            if mode & 0o6000 != 0 {
                bad.push(format!("{name} {:o}", mode & 0o7777));
            }
        }
    }
    if !bad.is_empty() {
        let mut demo = String::new();
        if euid() == 0 {
            // What another host user gets by running one.
            let mut cmd = std::process::Command::new(t.workspace.join("planted-suid"));
            std::os::unix::process::CommandExt::uid(&mut cmd, 1);
            std::os::unix::process::CommandExt::gid(&mut cmd, 1);
            if let Ok(o) = cmd.output() {
                demo = format!(
                    "; host uid 1 running planted-suid gets: {}",
                    String::from_utf8_lossy(&o.stdout).trim()
                );
            }
        }
        out.fail(format_args!(
            "HOST CHANGED: setuid/setgid files planted in the host workspace: {}{demo}",
            bad.join(", ")
        ));
    }
}
attack!(setuid_binary_planted_in_workspace);

/// A host file's extended attribute, not following a final symlink.
fn host_xattr(p: &Path, name: &str) -> Option<Vec<u8>> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(p.as_os_str().as_bytes()).unwrap();
    let name = std::ffi::CString::new(name).unwrap();
    let mut buf = vec![0u8; 256];
    // SAFETY: valid C strings and a buffer of the length passed.
    let n = unsafe {
        libc::lgetxattr(
            path.as_ptr(),
            name.as_ptr(),
            buf.as_mut_ptr().cast(),
            buf.len(),
        )
    };
    (n >= 0).then(|| {
        buf.truncate(n as usize);
        buf
    })
}

// ───────────────────────── reading host files ─────────────────────────

/// Read a world-readable secret the test wrote outside the workspace.
fn read_host_secret_file(t: &Ctx) {
    let token = format!("cordon-secret-{}", unique());
    let secret = t.host_file("secret.txt", &format!("{token}\n"));
    // The sandbox's user could read it on the host: only the sandbox hides it.
    t.host_as_owner(&["cat", secret.to_str().unwrap()])
        .code(0)
        .stdout_has(&token);
    let s = secret.display();
    // The guest has no /home or /var (grep would say 2 for them), but a
    // /root of its own.
    let dirs = if t.vm() {
        "/tmp /workspace /etc /root /run /dev/shm"
    } else {
        "/tmp /workspace /etc /home /run /var /dev/shm"
    };
    let out = t.sh(&format!(
        "cat {s}; cat /proc/self/root{s}; cat /workspace/../outside/secret.txt; \
         find / \\( -path /proc -o -path /usr -o -path /sys \\) -prune -o -name secret.txt -print; \
         grep -rlsF \"$(printf %s cordon-secret-){}\" {dirs}; \
         echo grep-exit=$?",
        token.trim_start_matches("cordon-secret-")
    ));
    out.code(0)
        .line("grep-exit=1")
        .stderr_has(&format!("cat: {s}: No such file or directory"))
        .stderr_has(&format!(
            "cat: /proc/self/root{s}: No such file or directory"
        ))
        .stderr_has("cat: /workspace/../outside/secret.txt: No such file or directory");
    if out.stdout.contains(&token) || out.stdout.contains("secret.txt") {
        out.fail("the host secret was found inside the sandbox");
    }
}
attack!(read_host_secret_file);

/// Read root's home and the homes under /home.
fn read_root_home(t: &Ctx) {
    let out = t.sh(
        "ls -a /root; cat /root/.bashrc; cat /root/.ssh/id_rsa; ls -A /home | wc -l; echo done",
    );
    if t.image() {
        // The image's own /root (Debian's skeleton), none of the host's.
        out.code(0)
            .line("done")
            .line("0")
            .line(".bashrc")
            .stderr_has("cat: /root/.ssh/id_rsa: No such file or directory");
        let image_bashrc = t
            .image_file("/root/.bashrc")
            .expect("the image has /root/.bashrc");
        out.stdout_has(
            String::from_utf8_lossy(&image_bashrc)
                .lines()
                .next()
                .unwrap(),
        );
        for host in fs::read_dir("/root").into_iter().flatten().flatten() {
            let name = host.file_name().to_string_lossy().into_owned();
            if t.image_file(&format!("/root/{name}")).is_none()
                && out.stdout.lines().any(|l| l == name)
            {
                out.fail(format_args!("the host's /root/{name} is listed"));
            }
        }
        return;
    }
    out.code(0)
        .line("done")
        .line("0")
        .stderr_has("cat: /root/.bashrc: No such file or directory")
        .stderr_has("cat: /root/.ssh/id_rsa: No such file or directory");
    if t.vm() {
        // The guest's initramfs has an empty /root of its own, no /home.
        out.only_lines(&[".", "..", "0", "done"])
            .stderr_has("ls: cannot access '/home': No such file or directory");
    } else {
        out.stderr_has("ls: cannot access '/root': No such file or directory");
    }
}
attack!(read_root_home);

/// Read /etc/shadow and other host secrets under /etc.
fn read_etc_shadow(t: &Ctx) {
    let out = t.sh("cat /etc/shadow; cat /etc/gshadow; cat /etc/sudoers; ls /etc/ssh; ls /etc/ssl/private; echo done");
    if t.image() {
        // The image's own shadow file, readable by its root; no hash of
        // the host's in it.
        let image_shadow = t
            .image_file("/etc/shadow")
            .expect("the image has /etc/shadow");
        out.code(0)
            .line("done")
            .stdout_has(&String::from_utf8_lossy(&image_shadow));
        if let Ok(shadow) = fs::read_to_string("/etc/shadow") {
            for l in shadow.lines().filter(|l| l.contains('$')) {
                out.lacks(l);
            }
        }
        return;
    }
    out.code(0)
        .line("done")
        .stderr_has("cat: /etc/shadow: No such file or directory")
        .stderr_has("cat: /etc/gshadow: No such file or directory")
        .stderr_has("cat: /etc/sudoers: No such file or directory")
        .stderr_has("ls: cannot access '/etc/ssh': No such file or directory")
        .stderr_has("ls: cannot access '/etc/ssl/private': No such file or directory");
    if let Ok(shadow) = fs::read_to_string("/etc/shadow")
        && let Some(first) = shadow.lines().next()
    {
        out.lacks(first);
    }
}
attack!(read_etc_shadow);

/// Find a secret in the environment of the `cordon run` process, in
/// the command's own environment or any process's /proc/N/environ.
fn env_canary(t: &Ctx) {
    let out = t.sh("env; for f in /proc/[0-9]*/environ; do tr '\\0' '\\n' < $f; done; cat /proc/1/environ; echo done");
    out.code(0)
        .line("done")
        .line(if t.image() { "HOME=/root" } else { "HOME=/tmp" })
        .lacks(&t.env_canary)
        .lacks("CORDON_CANARY");
    if t.vm() {
        // The guest's root reads every environment, pid 1's included:
        // the guest init starts the supervisor with an empty one. A
        // process may exit between the glob and its read, and a kernel
        // thread has none (ESRCH from 6.12 on); only a refused read counts.
        if out
            .stderr
            .lines()
            .any(|l| !l.ends_with("No such file or directory") && !l.ends_with("No such process"))
        {
            out.fail("expected every environment to be readable in the guest");
        }
        let pid1 = t.sh("wc -c < /proc/1/environ");
        pid1.code(0).line("0");
    } else {
        out.stderr_has("cat: /proc/1/environ: Permission denied");
    }
}
attack!(env_canary);

/// Read the host kernel log (dmesg, /proc/kmsg, /dev/kmsg, syslog(2)).
fn read_kernel_log(t: &Ctx) {
    if t.vm() {
        return guest_kernel_log(t);
    }
    let out = t.sh("cat /proc/kmsg; cat /dev/kmsg; echo done");
    out.code(0)
        .line("done")
        // Root's sandbox runs as a host uid of its own, which procfs's
        // root-owned files refuse before any capability is asked for.
        .stderr_has("cat: /proc/kmsg: Permission denied")
        .stderr_has("cat: /dev/kmsg: No such file or directory");
    if host_has("dmesg") {
        t.sh("dmesg; echo dmesg-exit=$?")
            .line("dmesg-exit=1")
            .stderr_has("dmesg: read kernel buffer failed: Operation not permitted");
    }
    // SYSLOG_ACTION_READ_ALL and SYSLOG_ACTION_SIZE_BUFFER.
    py_nr(
        t,
        &[],
        r#"
        buf = ctypes.create_string_buffer(4096)
        sc('syslog read_all', NR['syslog'], 3, buf, 4096)
        sc('syslog size', NR['syslog'], 10, 0, 0)
    "#,
    )
    .code(0)
    .line("syslog read_all: EPERM")
    .line("syslog size: EPERM");
}
attack!(read_kernel_log);

/// In a microVM every way of reading the kernel log works, and shows the
/// guest's kernel (booted with cordon's command line), never the host's.
fn guest_kernel_log(t: &Ctx) {
    let host_version = fs::read_to_string("/proc/version").unwrap();
    let host_release = fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let host_release = host_release.trim();
    // /proc/kmsg and /dev/kmsg block at the end of the log: one read each.
    let out = t.sh(
        "uname -r; dmesg | grep -m1 'Linux version'; dmesg | grep -m1 -o 'cordon.ro=usr'; \
         dd if=/proc/kmsg bs=64k count=1 status=none | grep -c 'Linux version'; \
         dd if=/dev/kmsg iflag=nonblock bs=8k count=1 status=none | grep -c 'Linux version'; echo done",
    );
    out.code(0).line("done").line("cordon.ro=usr");
    let lines: Vec<&str> = out.stdout.lines().collect();
    let guest_release = lines.first().copied().unwrap_or("");
    if guest_release.is_empty() || guest_release == host_release {
        out.fail("expected the guest's own kernel release");
    }
    if !lines
        .get(1)
        .is_some_and(|l| l.contains(&format!("Linux version {guest_release} ")))
    {
        out.fail("expected dmesg to show the guest's kernel");
    }
    if lines.get(3) != Some(&"1") || lines.get(4) != Some(&"1") {
        out.fail("expected /proc/kmsg and /dev/kmsg to start with the guest's banner");
    }
    out.lacks(host_version.trim()).lacks(host_release);
    py_nr(
        t,
        &[],
        r#"
        buf = ctypes.create_string_buffer(1 << 16)
        n = sc('syslog read_all', NR['syslog'], 3, buf, 1 << 16)
        print('log:', buf.raw[:max(n, 0)].split(b'\n')[0].decode(errors='replace'))
        sc('syslog size', NR['syslog'], 10, 0, 0)
    "#,
    )
    .code(0)
    .line_starts("syslog read_all: OK ")
    .line_starts("syslog size: OK ")
    .line_starts("log: <5>[    0.000000] Linux version ")
    .lacks(host_version.trim())
    .lacks(host_release);
}

/// Use a descriptor inherited from the supervisor or the host (the
/// control socket, a host directory).
fn inherited_fds(t: &Ctx) {
    let out = t.py(r#"
        import fcntl
        open_fds = []
        for fd in range(3, 4096):
            try:
                fcntl.fcntl(fd, fcntl.F_GETFD); open_fds.append(fd)
            except OSError:
                pass
        print('open fds:', open_fds)
        print('fd dir:', sorted(os.listdir('/proc/self/fd'), key=int))
    "#);
    out.code(0)
        .line("open fds: []")
        .line("fd dir: ['0', '1', '2', '3']");
}
attack!(inherited_fds);

/// Read the host's kernel command line (boot parameters: devices, hosts,
/// sometimes secrets). Natively it is masked; a microVM's is its own.
fn kernel_command_line(t: &Ctx) {
    let host = fs::read_to_string("/proc/cmdline").unwrap_or_default();
    let host = host.trim();
    let out = t.sh("cat /proc/cmdline; echo; echo end-of-cmdline");
    out.code(0).line("end-of-cmdline");
    if !host.is_empty() && out.stdout.contains(host) {
        out.fail("the host's kernel command line is readable");
    }
    if t.vm() {
        // The guest's own, set by cordon.
        out.stdout_has("console=ttyS0");
    } else {
        assert_eq!(out.stdout.trim(), "end-of-cmdline", "{}", out.stdout);
    }
}
attack!(kernel_command_line);

// ───────────────────────── network ─────────────────────────

/// Asserts that a listener accepted no connection.
#[track_caller]
fn assert_no_accept(out: &Out, l: &TcpListener) {
    l.set_nonblocking(true).unwrap();
    match l.accept() {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((_, peer)) => out.fail(format_args!(
            "HOST CHANGED: the host listener accepted a connection from {peer}"
        )),
        Err(e) => out.fail(format_args!("accept failed oddly: {e}")),
    }
}

/// Asserts that a UDP socket received nothing.
#[track_caller]
fn assert_no_datagram(out: &Out, s: &UdpSocket) {
    std::thread::sleep(Duration::from_millis(50));
    s.set_nonblocking(true).unwrap();
    let mut buf = [0u8; 64];
    match s.recv_from(&mut buf) {
        Err(e) if e.kind() == ErrorKind::WouldBlock => {}
        Ok((n, peer)) => out.fail(format_args!(
            "HOST CHANGED: the host UDP socket received {n} bytes from {peer}"
        )),
        Err(e) => out.fail(format_args!("recv failed oddly: {e}")),
    }
}

/// Python: `tcp(host, port)` connects and sends a few bytes.
const PY_TCP: &str = r#"
    def tcp(host, port):
        s = socket.socket(socket.AF_INET6 if ':' in host else socket.AF_INET)
        s.settimeout(3)
        s.connect((host, port))
        s.sendall(b'escaped')
"#;

/// Connect to a TCP listener on the host's 127.0.0.1 (and ::1) with
/// Python and with bash's /dev/tcp, network off.
fn tcp_to_host_listener(t: &Ctx) {
    let l4 = TcpListener::bind("127.0.0.1:0").unwrap();
    let p4 = l4.local_addr().unwrap().port();
    let l6 = TcpListener::bind("[::1]:0").ok();
    let mut code = format!(
        "{}attempt('tcp4', lambda: tcp('127.0.0.1', {p4}))\n",
        dedent(PY_TCP)
    );
    if let Some(l) = &l6 {
        code += &format!(
            "attempt('tcp6', lambda: tcp('::1', {}))\n",
            l.local_addr().unwrap().port()
        );
    }
    if t.vm() {
        // The guest's root may bring its loopback up: 127.0.0.1 is then the
        // guest's own, with nothing listening.
        code += &format!(
            "import fcntl\n\
             attempt('lo up', lambda: fcntl.ioctl(socket.socket(socket.AF_INET, socket.SOCK_DGRAM), \
             0x8914, struct.pack('16sH14x', b'lo', 0x41)) and None)\n\
             attempt('tcp4 after lo up', lambda: tcp('127.0.0.1', {p4}))\n"
        );
    }
    let out = t.py(&code);
    if t.vm() {
        // No network device, and the loopback down: no route anywhere
        // (and no ::1 at all).
        out.code(0)
            .line("tcp4: ENETUNREACH")
            .line("lo up: OK None")
            .line("tcp4 after lo up: ECONNREFUSED");
        if l6.is_some() {
            out.line("tcp6: EADDRNOTAVAIL");
        }
    } else {
        // EACCES: Landlock denies connect; ENETUNREACH: no interface is up.
        out.code(0).line_any(&["tcp4: EACCES", "tcp4: ENETUNREACH"]);
    }
    let landlock = out.stdout.contains("tcp4: EACCES");
    if l6.is_some() && !t.vm() {
        out.line(if landlock {
            "tcp6: EACCES"
        } else {
            "tcp6: ENETUNREACH"
        });
    }
    let why = if landlock {
        "Permission denied"
    } else {
        "Network is unreachable"
    };
    let sh = t.sh(&format!(
        "echo escaped > /dev/tcp/127.0.0.1/{p4}; echo exit=$?"
    ));
    sh.code(0)
        .line("exit=1")
        .stderr_has(&format!("/dev/tcp/127.0.0.1/{p4}: {why}"));
    assert_no_accept(&out, &l4);
    if let Some(l) = &l6 {
        assert_no_accept(&out, l);
    }
}
attack!(tcp_to_host_listener);

/// The same with --network loopback: the sandbox's 127.0.0.1 is its own.
fn tcp_to_host_listener_loopback_mode(t: &Ctx) {
    let l4 = TcpListener::bind("127.0.0.1:0").unwrap();
    let p4 = l4.local_addr().unwrap().port();
    let out = t.py_with(
        &["--network", "loopback"],
        &format!(
            "{}attempt('tcp4', lambda: tcp('127.0.0.1', {p4}))\n",
            dedent(PY_TCP)
        ),
    );
    out.code(0).line("tcp4: ECONNREFUSED");
    let sh = t.sh_with(
        &["--network", "loopback"],
        &format!("echo escaped > /dev/tcp/127.0.0.1/{p4}; echo exit=$?"),
    );
    sh.code(0)
        .line("exit=1")
        .stderr_has(&format!("/dev/tcp/127.0.0.1/{p4}: Connection refused"));
    assert_no_accept(&out, &l4);
}
attack!(tcp_to_host_listener_loopback_mode);

/// Send UDP datagrams to a socket bound on the host's 127.0.0.1.
fn udp_to_host(t: &Ctx) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = s.local_addr().unwrap().port();
    let out = t.py(&format!(
        r#"
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            attempt('udp4', lambda: u.sendto(b'escaped', ('127.0.0.1', {port})))
            attempt('udp4 broadcast', lambda: (u.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1), u.sendto(b'escaped', ('255.255.255.255', {port})))[1])
        "#
    ));
    out.code(0)
        .line("udp4: ENETUNREACH")
        .line("udp4 broadcast: ENETUNREACH");
    let sh = t.sh(&format!(
        "echo escaped > /dev/udp/127.0.0.1/{port}; echo exit=$?"
    ));
    sh.code(0).line("exit=1").stderr_has(&format!(
        "/dev/udp/127.0.0.1/{port}: Network is unreachable"
    ));
    assert_no_datagram(&out, &s);
}
attack!(udp_to_host);

/// With --network loopback a datagram to the host's port only reaches
/// the sandbox's own loopback, where the sandbox can even bind the port.
fn udp_to_host_loopback_mode(t: &Ctx) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    let port = s.local_addr().unwrap().port();
    let out = t.py_with(
        &["--network", "loopback"],
        &format!(
            r#"
            u = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            attempt('udp4', lambda: u.sendto(b'escaped', ('127.0.0.1', {port})))
            r = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            attempt('bind same port', lambda: r.bind(('127.0.0.1', {port})))
            u.sendto(b'to-self', ('127.0.0.1', {port}))
            r.settimeout(2)
            print('received:', r.recv(64))
        "#
        ),
    );
    out.code(0)
        .line("udp4: OK 7")
        .line("bind same port: OK None")
        .line("received: b'to-self'");
    assert_no_datagram(&out, &s);
}
attack!(udp_to_host_loopback_mode);

/// Resolve a public name (DNS would leak data even without TCP).
fn dns_resolution(t: &Ctx) {
    let out = t.py(r#"
            try:
                print('resolved:', socket.getaddrinfo('example.com', 80))
            except socket.gaierror as e:
                print('gaierror:', e.errno, e.strerror)
            attempt('resolv.conf', lambda: open('/etc/resolv.conf').read())
            print('localhost:', socket.gethostbyname('localhost'))
        "#);
    out.code(0)
        .line("gaierror: -3 Temporary failure in name resolution")
        .line("localhost: 127.0.0.1");
    // The guest's staged /etc has no resolv.conf at all; natively, and in
    // an image's /etc, it is an empty file.
    out.line(if t.vm() && !t.image() {
        "resolv.conf: ENOENT"
    } else {
        "resolv.conf: OK ''"
    });
    if host_has("getent") {
        t.sh("getent hosts example.com; echo exit=$?")
            .code(0)
            .line("exit=2");
    }
}
attack!(dns_resolution);

/// Open raw IP sockets (spoofing, sniffing) and ICMP sockets.
fn raw_socket(t: &Ctx) {
    let mut code = String::from(
        r#"
            attempt('raw icmp', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP))
            attempt('raw ip', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_RAW))
            attempt('raw tcp', lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_TCP))
            attempt('raw icmpv6', lambda: socket.socket(socket.AF_INET6, socket.SOCK_RAW, socket.IPPROTO_ICMPV6))
            attempt('ping socket', lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM, socket.IPPROTO_ICMP))
        "#,
    );
    if t.vm() {
        // An echo request to the host and to QEMU's usual user-network
        // gateway, with no device to send it on.
        code += r#"
            echo = struct.pack('!BBHHH', 8, 0, 0xf7ff, 0, 0)
            for dst in ['127.0.0.1', '10.0.2.2']:
                attempt('raw send ' + dst, lambda: socket.socket(socket.AF_INET, socket.SOCK_RAW, socket.IPPROTO_ICMP).sendto(echo, (dst, 0)))
        "#;
    }
    let out = t.py(&code);
    out.code(0).line("ping socket: EACCES");
    if t.vm() {
        // The guest's root may open raw sockets; they reach no network.
        out.line_starts("raw icmp: OK <socket.socket")
            .line_starts("raw ip: OK <socket.socket")
            .line_starts("raw tcp: OK <socket.socket")
            .line_starts("raw icmpv6: OK <socket.socket")
            .line("raw send 127.0.0.1: ENETUNREACH")
            .line("raw send 10.0.2.2: ENETUNREACH");
    } else {
        out.line("raw icmp: EPERM")
            .line("raw ip: EPERM")
            .line("raw tcp: EPERM")
            .line("raw icmpv6: EPERM");
    }
}
attack!(raw_socket);

/// Open AF_PACKET sockets and other exotic families (vsock to the
/// hypervisor, AF_ALG, Bluetooth, AF_KEY, XDP, CAN, TIPC, RDS).
fn packet_and_exotic_sockets(t: &Ctx) {
    let out = t.py(
        r#"
            for name, fam, typ in [('packet raw', 17, socket.SOCK_RAW), ('packet dgram', 17, socket.SOCK_DGRAM),
                                 ('vsock', 40, socket.SOCK_STREAM), ('alg', 38, socket.SOCK_SEQPACKET),
                                 ('bluetooth', 31, socket.SOCK_RAW), ('key', 15, socket.SOCK_RAW),
                                 ('xdp', 44, socket.SOCK_RAW), ('can', 29, socket.SOCK_RAW),
                                 ('tipc', 30, socket.SOCK_RDM), ('rds', 21, socket.SOCK_SEQPACKET)]:
                attempt(name, lambda: socket.socket(fam, typ, 0))
        "#,
    );
    out.code(0);
    // The guest's root may open packet and XDP sockets on its kernel (which
    // has only a loopback); no vsock device links the guest to the host,
    // and the other families are modules the guest cannot load.
    let guest_allows = ["packet raw", "packet dgram", "xdp"];
    for name in [
        "packet raw",
        "packet dgram",
        "vsock",
        "alg",
        "bluetooth",
        "key",
        "xdp",
        "can",
        "tipc",
        "rds",
    ] {
        if t.vm() && guest_allows.contains(&name) {
            out.line_starts(&format!("{name}: OK <socket.socket"));
        } else {
            out.line(&format!("{name}: EAFNOSUPPORT"));
        }
    }
}
attack!(packet_and_exotic_sockets);

/// Look for host interfaces: only the sandbox's loopback may exist.
fn netlink_sees_only_lo(t: &Ctx) {
    let out = t.py(r#"
            print('if_nameindex:', [n for _, n in socket.if_nameindex()])
            devs = [l.split(':')[0].strip() for l in open('/proc/net/dev').read().splitlines()[2:]]
            print('proc net dev:', devs)
        "#);
    out.code(0)
        .line("if_nameindex: ['lo']")
        .line("proc net dev: ['lo']");
    if host_has("ip") {
        t.sh("ip -o link show | cut -d: -f2 | tr -d ' '")
            .code(0)
            .line("lo")
            .only_lines(&["lo"]);
    }
}
attack!(netlink_sees_only_lo);

/// Create interfaces (dummy, veth) over rtnetlink and bring lo up.
fn netlink_create_interface(t: &Ctx) {
    let ifname = format!("cdn{}", unique() % 1_000_000_000);
    let out = t.py(&format!(
        r#"
            def newlink(name, kind):
                s = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 0)
                def attr(t, data):
                    l = 4 + len(data)
                    return struct.pack('HH', l, t) + data + b'\0' * ((4 - l % 4) % 4)
                body = struct.pack('BxHiII', 0, 0, 0, 0, 0) + attr(3, name.encode() + b'\0') + attr(18, attr(1, kind.encode() + b'\0'))
                s.sendto(struct.pack('IHHII', 16 + len(body), 16, 1 | 4 | 0x400 | 0x200, 1, 0) + body, (0, 0))
                resp = s.recv(65536)
                assert struct.unpack('H', resp[4:6])[0] == 2
                err = -struct.unpack('i', resp[16:20])[0]
                report('newlink ' + kind, err, None if err else 0)
            newlink('{ifname}', 'dummy')
            newlink('{ifname}v', 'veth')
            import fcntl
            s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            attempt('lo up', lambda: fcntl.ioctl(s, 0x8914, struct.pack('16sH14x', b'lo', 0x41)))
        "#
    ));
    if t.vm() {
        // The guest's root may configure its own interfaces; the dummy and
        // veth drivers are modules its kernel cannot load.
        out.code(0)
            .line("newlink dummy: ENOTSUP")
            .line("newlink veth: ENOTSUP")
            .line_starts("lo up: OK b'lo");
    } else {
        out.code(0)
            .line("newlink dummy: EPERM")
            .line("newlink veth: EPERM")
            .line("lo up: EPERM");
    }
    if host_has("ip") {
        t.sh(&format!("ip link add {ifname} type dummy; echo exit=$?"))
            .code(0)
            .line("exit=2")
            .stderr_has(if t.vm() {
                "Error: Unknown device type."
            } else {
                "RTNETLINK answers: Operation not permitted"
            });
    }
    let host_devs = fs::read_to_string("/proc/net/dev").unwrap();
    if host_devs.contains(&ifname) {
        out.fail(format_args!(
            "HOST CHANGED: interface {ifname} exists on the host"
        ));
    }
}
attack!(netlink_create_interface);

/// Connect to a host abstract-namespace and a filesystem Unix socket.
fn unix_socket_to_host(t: &Ctx) {
    use std::os::linux::net::SocketAddrExt;
    use std::os::unix::net::{SocketAddr, UnixListener};
    let name = format!("cordon-escape-{}", unique());
    let abs =
        UnixListener::bind_addr(&SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
    let path = t.outside.join("sock");
    let fsl = UnixListener::bind(&path).unwrap();
    fs::set_permissions(&path, fs::Permissions::from_mode(0o777)).unwrap();
    let out = t.py(&format!(
        r#"
            def conn(addr):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(addr)
            attempt('abstract', lambda: conn('\0{name}'))
            attempt('path', lambda: conn('{}'))
        "#,
        path.display()
    ));
    out.code(0)
        .line_any(&["abstract: ECONNREFUSED", "abstract: EPERM"])
        .line("path: ENOENT");
    for l in [&abs, &fsl] {
        l.set_nonblocking(true).unwrap();
        if let Ok((_, peer)) = l.accept() {
            out.fail(format_args!(
                "HOST CHANGED: a host Unix socket accepted {peer:?}"
            ));
        }
    }
}
attack!(unix_socket_to_host);

// ───────────────────────── processes ─────────────────────────

/// Find a host process in /proc.
fn host_process_invisible(t: &Ctx) {
    let marker = unique();
    let mut host = HostProc::sleep(marker);
    let hp = host.pid();
    let out = t.py(&format!(
        r#"
            want = b'sleep\0{marker}\0'
            pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
            hits = []
            for p in pids:
                try:
                    if open(f'/proc/{{p}}/cmdline', 'rb').read() == want: hits.append(p)
                except OSError: pass
            print('matches:', hits)
            print('host pid visible:', os.path.exists('/proc/{hp}'))
            print('process count small:', len(pids) <= 4, pids)
            users = [p for p in pids if os.path.exists(f'/proc/{{p}}/cmdline') and open(f'/proc/{{p}}/cmdline', 'rb').read()]
            print('user-space processes:', len(users))
        "#
    ));
    out.code(0)
        .line("matches: []")
        .line("host pid visible: False");
    if t.vm() {
        // The guest's /proc lists its kernel threads too; its user-space
        // processes are the supervisor and this script.
        out.line("user-space processes: 2");
    } else {
        out.stdout_has("process count small: True");
    }
    assert!(host.alive());
}
attack!(host_process_invisible);

/// Signal a host process by pid (and everything with kill -1).
fn kill_host_process(t: &Ctx) {
    let marker = unique();
    let mut host = HostProc::sleep(marker);
    let hp = host.pid();
    let out = t.sh(&format!(
        "kill -9 {hp}; kill -0 {hp}; sleep 100 & kill -9 -1; wait; \
         python3 -c 'import os; os.kill({hp}, 9)'; echo done"
    ));
    out.code(0)
        .line("done")
        .stderr_has(&format!("kill: ({hp}) - No such process"))
        .stderr_has("ProcessLookupError: [Errno 3] No such process");
    let py = py_nr(
        t,
        &[],
        &format!(
            r#"
            sc('pidfd_open host', NR['pidfd_open'], {hp}, 0)
            sc('ptrace attach host', NR['ptrace'], 16, {hp}, 0, 0)
        "#
        ),
    );
    py.code(0)
        .line("pidfd_open host: ESRCH")
        .line("ptrace attach host: ESRCH");
    std::thread::sleep(Duration::from_millis(50));
    if !host.alive() {
        out.fail("HOST CHANGED: the host process was killed");
    }
}
attack!(kill_host_process);

/// Trace the supervisor (pid 1) or read its memory.
fn ptrace_supervisor(t: &Ctx) {
    if t.vm() {
        return ptrace_guest_supervisor(t);
    }
    let out = py_nr(
        t,
        &[],
        r#"
        sc('ptrace attach 1', NR['ptrace'], 16, 1, 0, 0)
        sc('ptrace seize 1', NR['ptrace'], 0x4206, 1, 0, 0)
        class iovec(ctypes.Structure):
            _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
        buf = ctypes.create_string_buffer(64)
        local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
        maps_addr = 0x400000
        remote = iovec(maps_addr, 64)
        ctypes.set_errno(0)
        r = libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        report('process_vm_readv 1', ctypes.get_errno(), None if r < 0 else r)
        attempt('read /proc/1/mem', lambda: os.open('/proc/1/mem', os.O_RDONLY))
        attempt('write /proc/1/mem', lambda: os.open('/proc/1/mem', os.O_RDWR))
    "#,
    );
    // Reading is refused by the ptrace check (the supervisor is not
    // dumpable); writing by that or, first, the read-only /proc mount.
    out.code(0)
        .line("ptrace attach 1: EPERM")
        .line("ptrace seize 1: EPERM")
        .line("process_vm_readv 1: EPERM")
        .line("read /proc/1/mem: EACCES")
        .line_any(&["write /proc/1/mem: EROFS", "write /proc/1/mem: EACCES"]);
}
attack!(ptrace_supervisor);

/// In a microVM the guest's root may trace and read its own pid 1: the
/// supervisor is inside the boundary, which is the virtual machine. (A
/// seize does not stop it; see freeze_supervisor_past_timeout for a stop.)
fn ptrace_guest_supervisor(t: &Ctx) {
    let out = py_nr(
        t,
        &[],
        r#"
        sc('ptrace seize 1', NR['ptrace'], 0x4206, 1, 0, 0)
        class iovec(ctypes.Structure):
            _fields_ = [('base', ctypes.c_void_p), ('len', ctypes.c_size_t)]
        buf = ctypes.create_string_buffer(64)
        local = iovec(ctypes.cast(buf, ctypes.c_void_p), 64)
        # The start of the supervisor's own file (its loader's is first).
        start = next(int(l.split('-')[0], 16) for l in open('/proc/1/maps')
                     if l.split()[-1].endswith('/supervisor') and int(l.split()[2], 16) == 0)
        remote = iovec(start, 64)
        ctypes.set_errno(0)
        r = libc.process_vm_readv(1, ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
        report('process_vm_readv 1', ctypes.get_errno(), None if r < 0 else r)
        print('elf header:', buf.raw[:4])
        attempt('read /proc/1/mem', lambda: os.open('/proc/1/mem', os.O_RDONLY) and None)
        attempt('write /proc/1/mem', lambda: os.open('/proc/1/mem', os.O_RDWR) and None)
    "#,
    );
    out.code(0)
        .line("ptrace seize 1: OK 0")
        .line("process_vm_readv 1: OK 64")
        .line("elf header: b'\\x7fELF'")
        .line("read /proc/1/mem: OK None")
        .line("write /proc/1/mem: OK None");
    // The tracer's exit detached it: the supervisor still serves.
    t.sh("echo served").code(0).line("served");
}

/// Read the supervisor's memory, environment, maps, root, exe and
/// descriptors through /proc/1.
fn supervisor_proc_files(t: &Ctx) {
    let out = t.sh(
        "cat /proc/1/mem; cat /proc/1/environ; cat /proc/1/maps; cat /proc/1/auxv; \
         head -c1 /proc/1/exe; ls -l /proc/1/fd/3; ls /proc/1/root/; echo done",
    );
    if t.vm() {
        // All the guest's own: its root reads them (the memory from its
        // unmapped start fails as any process's would); pid 1 is the
        // supervisor copy cordon shares, its descriptor the virtio port.
        out.code(0)
            .line("done")
            .line("workspace")
            .stdout_has("/.cordon/bin/")
            .stdout_has("/proc/1/fd/3 -> /dev/vport")
            .stderr_has("cat: /proc/1/mem: Input/output error")
            .lacks("Permission denied")
            .lacks(&t.env_canary);
        return;
    }
    out.code(0)
        .line("done")
        .stderr_has("cat: /proc/1/mem: Permission denied")
        .stderr_has("cat: /proc/1/environ: Permission denied")
        .stderr_has("cat: /proc/1/maps: Permission denied")
        .stderr_has("cat: /proc/1/auxv: Permission denied")
        .stderr_has("head: cannot open '/proc/1/exe' for reading: Permission denied")
        // Non-dumpable, pid 1's /proc files belong to host root, which is
        // no uid of the sandbox's, in either mode.
        .stderr_has("ls: cannot access '/proc/1/fd/3': Permission denied")
        .stderr_has("ls: cannot access '/proc/1/root/': Permission denied");
}
attack!(supervisor_proc_files);

/// Kill or stop the supervisor to break out of its supervision.
fn signal_supervisor(t: &Ctx) {
    let out = t.sh("kill -KILL 1; kill -STOP 1; kill -TERM 1; kill -HUP 1; kill -SEGV 1; sleep 0.2; echo still-here");
    out.code(0)
        .line("still-here")
        .faster_than(Duration::from_secs(10));
}
attack!(signal_supervisor);

/// Freeze the supervisor (PTRACE_ATTACH stops its tracee; then SIGSTOP),
/// then spin: --timeout must still end the run.
fn freeze_supervisor_past_timeout(t: &Ctx) {
    let code = format!(
        "{PY_PRELUDE}\n{}{}",
        nr_table(),
        dedent(
            r#"
            import signal
            sc('ptrace attach 1', NR['ptrace'], 16, 1, 0, 0)
            attempt('SIGSTOP 1', lambda: os.kill(1, signal.SIGSTOP))
            while True: pass
        "#
        )
    );
    // A hang is the finding: fail well before the harness's own deadline.
    let out = t.run_deadline(
        &["--timeout", "2"],
        &["python3", "-c", &code],
        t.within(Duration::from_secs(20)),
    );
    out.code(124)
        .stderr_has("cordon: timed out after 2s; the command was killed")
        .faster_than(t.within(Duration::from_secs(6)));
    if !t.vm() {
        out.line("ptrace attach 1: EPERM")
            .line("SIGSTOP 1: OK None");
    }
}
attack!(freeze_supervisor_past_timeout);

/// Change the host's name or clock.
fn host_name_and_clock(t: &Ctx) {
    let host_name = fs::read_to_string("/proc/sys/kernel/hostname").unwrap();
    let before = std::time::SystemTime::now();
    let out = py_nr(
        t,
        &[],
        r#"
        sc('sethostname', NR['sethostname'], b'cordon-evil', 11)
        tv = struct.pack('qq', 978307200, 0)
        sc('settimeofday', NR['settimeofday'], tv, 0)
        sc('clock_settime', NR['clock_settime'], 0, tv)
        tx = ctypes.create_string_buffer(208)
        struct.pack_into('I', tx, 0, 0x0001)
        sc('adjtimex', NR['adjtimex'], tx)
    "#,
    );
    if t.vm() {
        // The guest's root may set the guest's name and clock (adjtimex
        // reports TIME_ERROR: nothing synchronises the guest's clock).
        out.code(0)
            .line("sethostname: OK 0")
            .line("settimeofday: OK 0")
            .line("clock_settime: OK 0")
            .line("adjtimex: OK 5");
        let sh = t.sh(
            "hostname cordon-evil; date -s '2001-01-01 00:00:00' >/dev/null; hostname; \
             date +guest-year=%Y",
        );
        sh.code(0).line("cordon-evil").line("guest-year=2001");
        if !sh.stderr.is_empty() {
            sh.fail("expected the guest's root to set its name and clock");
        }
    } else {
        out.code(0)
            .line("sethostname: EPERM")
            .line("settimeofday: EPERM")
            .line("clock_settime: EPERM")
            .line("adjtimex: EPERM");
        let sh = t.sh("hostname cordon-evil; date -s '2001-01-01 00:00:00' >/dev/null; hostname");
        sh.code(0)
            .line("cordon")
            .stderr_has("date: cannot set date: Operation not permitted");
    }
    if fs::read_to_string("/proc/sys/kernel/hostname").unwrap() != host_name {
        out.fail("HOST CHANGED: the host name changed");
    }
    if std::time::SystemTime::now() < before {
        out.fail("HOST CHANGED: the host clock went backwards");
    }
}
attack!(host_name_and_clock);

/// Write kernel tunables under /proc/sys (core_pattern runs a program
/// as host root on every crash).
fn sysctl_write(t: &Ctx) {
    let before = fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap();
    let aslr = fs::read_to_string("/proc/sys/kernel/randomize_va_space").unwrap();
    let out = t.sh("echo '|/workspace/evil' > /proc/sys/kernel/core_pattern; echo 1 > /proc/sys/vm/drop_caches; \
         echo 0 > /proc/sys/kernel/randomize_va_space; echo done; cat /proc/sys/kernel/core_pattern");
    if fs::read_to_string("/proc/sys/kernel/randomize_va_space").unwrap() != aslr {
        out.fail("HOST CHANGED: kernel.randomize_va_space changed");
    }
    if t.vm() {
        // The guest's own kernel takes them; sysrq 'h' only prints help to
        // the guest's console.
        out.code(0).line("done").line("|/workspace/evil");
        if !out.stderr.is_empty() {
            out.fail("expected the guest's root to set the guest's sysctls");
        }
        t.sh("echo h > /proc/sysrq-trigger; echo done")
            .code(0)
            .line("done")
            .lacks("sysrq-trigger");
    }
    if !t.vm() {
        out.code(0)
            .line("done")
            .stderr_has("/proc/sys/kernel/core_pattern: Read-only file system")
            .stderr_has("/proc/sys/vm/drop_caches: Read-only file system")
            .stderr_has("/proc/sys/kernel/randomize_va_space: Read-only file system");
    }
    if !t.vm() && Path::new("/proc/sysrq-trigger").exists() {
        t.sh("echo h > /proc/sysrq-trigger; echo done")
            .line("done")
            .stderr_has("/proc/sysrq-trigger: Read-only file system");
    }
    if fs::read_to_string("/proc/sys/kernel/core_pattern").unwrap() != before {
        out.fail("HOST CHANGED: kernel.core_pattern changed");
    }
}
attack!(sysctl_write);

// ───────────────────────── privileges ─────────────────────────

/// Gain privileges with setuid binaries: setuid-root copies of id and
/// cat made by the host, and su.
fn setuid_binaries(t: &Ctx) {
    for (src, dst) in [("/usr/bin/id", "suid-id"), ("/usr/bin/cat", "suid-cat")] {
        let p = t.workspace.join(dst);
        fs::copy(src, &p).unwrap();
        if euid() == 0 {
            std::os::unix::fs::chown(&p, Some(0), Some(0)).unwrap();
        }
        fs::set_permissions(&p, fs::Permissions::from_mode(0o6755)).unwrap();
    }
    let planted = snapshot(&[t.workspace.join("suid-id"), t.workspace.join("suid-cat")]);
    let out = t.sh("./suid-id; ./suid-cat /proc/self/status | grep -E '^(Uid|Gid|CapEff|CapPrm|NoNewPrivs):'; \
         grep -E ' /(workspace|usr|tmp) ' /proc/self/mountinfo | grep -c nosuid; \
         if command -v su >/dev/null; then su root -c 'id -u; grep CapEff /proc/self/status' </dev/null; fi; echo done");
    assert_unchanged(&out, &planted);
    if t.vm() {
        // The guest's root has nothing to gain: it holds every capability
        // of its own kernel already. /usr, the host's, is not nosuid there.
        out.code(0)
            .line("done")
            .line("Uid:\t0\t0\t0\t0")
            .line("Gid:\t0\t0\t0\t0")
            .line(&format!("CapEff:\t{GUEST_CAPS}"))
            .line(&format!("CapPrm:\t{GUEST_CAPS}"))
            .line("NoNewPrivs:\t0")
            .line("2");
        return;
    }
    if t.image() {
        // Root inside already, with the capabilities of its own namespace
        // and no more; the workspace and /tmp are nosuid. As another user
        // of the image the same binaries give nothing.
        out.code(0)
            .line("done")
            .line("Uid:\t0\t0\t0\t0")
            .line("Gid:\t0\t0\t0\t0")
            .line(&format!("CapEff:\t{IMAGE_CAPS}"))
            .line(&format!("CapPrm:\t{IMAGE_CAPS}"))
            .line("NoNewPrivs:\t1")
            .line("2");
        let nobody = t.run(
            &["--user", "nobody"],
            &[
                "sh",
                "-c",
                "./suid-id; ./suid-cat /proc/self/status | grep -E '^(Uid|CapEff):'",
            ],
        );
        nobody
            .code(0)
            .line("Uid:\t65534\t65534\t65534\t65534")
            .line("CapEff:\t0000000000000000");
        if !nobody
            .stdout
            .starts_with("uid=65534(nobody) gid=65534(nogroup)")
        {
            nobody.fail("the setuid id changed the identity of image's nobody");
        }
        return;
    }
    let (u, g) = (t.uid, t.gid);
    out.code(0)
        .line("done")
        .line(&format!("Uid:\t{u}\t{u}\t{u}\t{u}"))
        .line(&format!("Gid:\t{g}\t{g}\t{g}\t{g}"))
        .line("CapEff:\t0000000000000000")
        .line("CapPrm:\t0000000000000000")
        .line("NoNewPrivs:\t1")
        .line("3");
    let id_line = out.stdout.lines().next().unwrap_or("");
    if !id_line.starts_with(&format!("uid={u}("))
        || id_line.contains("euid=")
        || id_line.contains("egid=")
    {
        out.fail("the setuid id reported a changed identity");
    }
    for l in out.stdout.lines() {
        if l.starts_with("CapEff:") && l != "CapEff:\t0000000000000000" {
            out.fail("a process gained capabilities");
        }
        if u != 0 && l == "0" {
            out.fail("su made the unprivileged user root");
        }
    }
}
attack!(setuid_binaries);

/// Every capability of the guest kernel (6.1: CAP_LAST_CAP is 40).
const GUEST_CAPS: &str = "000001ffffffffff";

/// Root's capabilities inside an image: CHOWN, DAC_OVERRIDE, FOWNER,
/// FSETID, KILL, SETGID, SETUID, NET_BIND_SERVICE and SETFCAP.
const IMAGE_CAPS: &str = "00000000800004fb";

/// Check every capability set is empty and cannot be raised.
fn capabilities_zero(t: &Ctx) {
    let out = t.sh("grep -E '^(Cap(Inh|Prm|Eff|Bnd|Amb)|NoNewPrivs|Seccomp):' /proc/self/status");
    out.code(0);
    if t.vm() {
        // The guest's root, unconfined inside its own kernel.
        out.line("CapInh:\t0000000000000000")
            .line(&format!("CapPrm:\t{GUEST_CAPS}"))
            .line(&format!("CapEff:\t{GUEST_CAPS}"))
            .line(&format!("CapBnd:\t{GUEST_CAPS}"))
            .line("CapAmb:\t0000000000000000")
            .line("NoNewPrivs:\t0")
            .line("Seccomp:\t0");
    } else if t.image() {
        // Root inside an image keeps what a package manager needs, in the
        // sandbox's own user namespace (docs/images.md), and no more.
        out.line("CapInh:\t0000000000000000")
            .line(&format!("CapPrm:\t{IMAGE_CAPS}"))
            .line(&format!("CapEff:\t{IMAGE_CAPS}"))
            .line(&format!("CapBnd:\t{IMAGE_CAPS}"))
            .line("CapAmb:\t0000000000000000")
            .line("NoNewPrivs:\t1")
            .line("Seccomp:\t2");
    } else {
        for l in ["CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"] {
            out.line(&format!("{l}:\t0000000000000000"));
        }
        out.line("NoNewPrivs:\t1").line("Seccomp:\t2");
    }
    // capset(all) on ourselves, raising an ambient capability, and
    // re-enabling privileges through prctl.
    py_nr(
        t,
        &[],
        r#"
        hdr = struct.pack('Ii', 0x20080522, 0)
        data = struct.pack('IIIIII', 0xffffffff, 0xffffffff, 0, 0xffffffff, 0xffffffff, 0)
        sc('capset all', NR['capset'], hdr, data)
        libc.prctl.restype = ctypes.c_int
        ctypes.set_errno(0)
        r = libc.prctl(47, 2, 21, 0, 0)
        report('ambient raise sys_admin', ctypes.get_errno(), None if r < 0 else r)
        print('bounding sys_admin:', libc.prctl(23, 21, 0, 0, 0))
        ctypes.set_errno(0)
        r = libc.prctl(38, 0, 0, 0, 0)
        report('clear no_new_privs', ctypes.get_errno(), None if r < 0 else r)
    "#,
    )
    .code(0)
    // The guest's root already holds every capability (the kernel drops
    // bits past the last).
    .line(if t.vm() {
        "capset all: OK 0"
    } else {
        "capset all: EPERM"
    })
    .line("ambient raise sys_admin: EPERM")
    .line(if t.vm() {
        "bounding sys_admin: 1"
    } else {
        "bounding sys_admin: 0"
    })
    .line("clear no_new_privs: EINVAL");
}
attack!(capabilities_zero);

/// Take on groups or another identity: `setgroups` succeeds (so programs
/// that drop groups, such as xterm, run) but changes nothing, and setgid or
/// setuid to an id outside the sandbox's single mapping fails (EINVAL: the
/// id does not exist in the sandbox's user namespace).
fn setgroups_and_identity(t: &Ctx) {
    let out = t.py(r#"
import errno, os
before = os.getgroups()
os.setgroups([0, 4, 27, 65534])
print('setgroups: ok')
print('groups unchanged:', os.getgroups() == before)
print('status:', [l for l in open('/proc/self/status') if l.startswith('Groups:')][0].strip())
for name, call in (('setgid', os.setgid), ('setuid', os.setuid)):
    try:
        call(4242)
        print(name + ': allowed')
    except OSError as e:
        print(name + ': ' + errno.errorcode[e.errno])
"#);
    if t.image() && !t.vm() {
        // Root in an image takes any identity of the 65536 its namespace
        // maps, and none beyond; supplementary groups stay empty, as
        // setgroups succeeds without effect here too.
        out.code(0)
            .line("setgroups: ok")
            .line("groups unchanged: True")
            .line("status: Groups:")
            .line("setgid: allowed")
            .line("setuid: allowed");
        t.py(
            "import errno, os\nfor call in (os.setgid, os.setuid):\n    try:\n        call(65536)\n        print('allowed')\n    except OSError as e:\n        print(errno.errorcode[e.errno])\n",
        )
        .code(0)
        .only_lines(&["EINVAL", "EINVAL"]);
        return;
    }
    if t.vm() {
        // The guest's root may take any identity of the guest's (with an
        // image as without).
        out.code(0)
            .line("setgroups: ok")
            .line("groups unchanged: False")
            .line("status: Groups:\t0 4 27 65534")
            .line("setgid: allowed")
            .line("setuid: allowed");
        return;
    }
    out.code(0)
        .line("setgroups: ok")
        .line("groups unchanged: True")
        .line("status: Groups:")
        .line("setgid: EINVAL")
        .line("setuid: EINVAL");
}
attack!(setgroups_and_identity);

/// Mount things: tmpfs over /tmp, a bind over /usr, proc, sysfs, a
/// remount of /usr read-write, and the new mount API.
fn mount_filesystems(t: &Ctx) {
    let out = py_nr(
        t,
        &[],
        r#"
        sc('mount tmpfs', NR['mount'], b'none', b'/tmp', b'tmpfs', 0, 0)
        sc('mount bind', NR['mount'], b'/workspace', b'/usr', 0, 0x1000, 0)
        sc('mount proc', NR['mount'], b'proc', b'/tmp', b'proc', 0, 0)
        sc('mount sysfs', NR['mount'], b'sysfs', b'/tmp', b'sysfs', 0, 0)
        sc('remount usr rw', NR['mount'], 0, b'/usr', 0, 0x20 | 0x1000, 0)
        sc('fsopen', NR['fsopen'], b'tmpfs', 0)
        sc('fspick', NR['fspick'], -100, b'/usr', 0)
        sc('open_tree', NR['open_tree'], -100, b'/workspace', 1 | 0x80000)
        sc('move_mount', NR['move_mount'], -100, b'/workspace', -100, b'/usr', 0)
        sc('fsmount', NR['fsmount'], 3, 0, 0)
        sc('fsconfig', NR['fsconfig'], 3, 6, 0, 0, 0)
        sc('mount_setattr', NR['mount_setattr'], -100, b'/usr', 0, 0, 0)
    "#,
    );
    out.code(0);
    if t.vm() {
        return guest_mounts(t, &out);
    }
    for name in [
        "mount tmpfs",
        "mount bind",
        "mount proc",
        "mount sysfs",
        "remount usr rw",
        "fsopen",
        "fspick",
        "open_tree",
        "move_mount",
        "fsmount",
        "fsconfig",
        "mount_setattr",
    ] {
        out.line(&format!("{name}: EPERM"));
    }
    if host_has("mount") {
        let sh = t.sh("n=$(wc -l < /proc/self/mountinfo); mount -t tmpfs none /tmp; echo mount-exit=$?; \
             mount --bind /workspace /usr; mount -o remount,rw /usr; \
             [ \"$n\" = \"$(wc -l < /proc/self/mountinfo)\" ] && echo mounts-unchanged; touch /usr/x");
        sh.line("mount-exit=32")
            .line("mounts-unchanged")
            .stderr_has(t.pick(
                "mount: /tmp: permission denied.",
                "mount: /tmp: must be superuser to use mount.",
            ));
        if t.image() {
            // Its /usr is its own layer's: writable without a mount.
            sh.code(0);
        } else {
            sh.code(1)
                .stderr_has("touch: cannot touch '/usr/x': Read-only file system");
        }
    }
}
attack!(mount_filesystems);

/// In a microVM the guest's root mounts what it likes in the guest (the
/// bind puts the workspace over its /usr, which the remount then makes
/// writable; fsmount and the rest get invalid arguments from the script).
/// What matters is the host: its /usr stays read-only even after the guest
/// remounts the /usr share itself read-write.
fn guest_mounts(t: &Ctx, out: &Out) {
    out.line("mount tmpfs: OK 0")
        .line("mount bind: OK 0")
        .line("mount proc: OK 0")
        .line("mount sysfs: OK 0")
        .line("remount usr rw: OK 0")
        .line_starts("fsopen: OK ")
        .line_starts("fspick: OK ")
        .line_starts("open_tree: OK ")
        .line("move_mount: OK 0")
        .line("fsmount: EINVAL")
        // fd 3 is fsopen's context here, so creating its superblock works.
        .line("fsconfig: OK 0")
        .line("mount_setattr: EINVAL");
    let name = format!("cordon-escape-{}", unique());
    let before = snapshot(&["/usr/bin/env"]);
    let sh = t.sh(&format!(
        "mount -t tmpfs none /tmp; echo mount-exit=$?; mount -o remount,rw /usr; echo remount-exit=$?; \
         touch /usr/{name}; chmod 4777 /usr/bin/env; echo done"
    ));
    if t.image() {
        // An image's /usr is no mount but its own layer's: writable as it
        // is, and only there.
        sh.code(0)
            .line("mount-exit=0")
            .line("remount-exit=32")
            .line("done")
            .lacks("Read-only");
        assert_absent(&sh, &[format!("/usr/{name}")]);
        assert_unchanged(&sh, &before);
        t.assert_gone_with_the_sandbox(&sh, &[&format!("/usr/{name}")]);
        return;
    }
    sh.code(0)
        .line("mount-exit=0")
        .line("remount-exit=0")
        .line("done")
        .stderr_has(&format!(
            "touch: cannot touch '/usr/{name}': Read-only file system"
        ))
        .stderr_has("chmod: changing permissions of '/usr/bin/env': Read-only file system");
    assert_absent(&sh, &[format!("/usr/{name}")]);
    assert_unchanged(&sh, &before);
}

/// Unmount the read-only overlays (/proc/sys, the masked /proc files),
/// the workspace or the root.
fn umount_filesystems(t: &Ctx) {
    let out = py_nr(
        t,
        &[],
        r#"
        for p in [b'/proc/sys', b'/proc/kcore', b'/proc/keys', b'/workspace', b'/usr', b'/']:
            sc('umount2 ' + p.decode(), NR['umount2'], p, 2)
    "#,
    );
    out.code(0);
    if t.vm() {
        // The guest's root detaches what it likes in the guest; /proc/sys
        // and the others are no mounts there, and the initramfs root stays.
        // An image's /usr is no mount, and its root (the image moved over
        // the initramfs) the guest's root may detach.
        let (usr, root) = if t.image() {
            ("EINVAL", "OK 0")
        } else {
            ("OK 0", "EINVAL")
        };
        out.line("umount2 /proc/sys: EINVAL")
            .line("umount2 /proc/kcore: EINVAL")
            .line("umount2 /proc/keys: EINVAL")
            .line("umount2 /workspace: OK 0")
            .line(&format!("umount2 /usr: {usr}"))
            .line(&format!("umount2 /: {root}"));
        assert!(t.workspace.is_dir() && Path::new("/usr/bin").is_dir());
        if host_has("umount") {
            t.sh("umount /proc/sys; echo umount-exit=$?")
                .code(0)
                .line("umount-exit=32")
                .stderr_has("umount: /proc/sys: not mounted.");
        }
        return;
    }
    for p in ["/proc/sys", "/proc/keys", "/workspace", "/usr", "/"] {
        out.line(&format!("umount2 {p}: EPERM"));
    }
    if host_has("umount") {
        t.sh("umount /proc/sys; echo umount-exit=$?; grep ' /proc/sys ' /proc/self/mountinfo | grep -c ' ro,'")
            .code(0)
            .line("umount-exit=32")
            .line("1")
            .stderr_has(t.pick(
                "umount: /proc/sys: must be superuser to unmount.",
                "umount: /proc/sys: umount failed: No such file or directory.",
            ));
    }
}
attack!(umount_filesystems);

/// pivot_root into a directory of the sandbox's choosing.
fn pivot_root(t: &Ctx) {
    let out = py_nr(
        t,
        &[],
        r#"
        os.makedirs('/tmp/newroot/old', exist_ok=True)
        sc('pivot_root tmp', NR['pivot_root'], b'/tmp/newroot', b'/tmp/newroot/old')
        os.chdir('/')
        sc('pivot_root dot', NR['pivot_root'], b'.', b'.')
    "#,
    );
    // The guest's root may call it, but its / is the initramfs (rootfs),
    // which cannot be pivoted, and /tmp/newroot is no mount point. An
    // image's root is a mount moved over the initramfs: busy.
    let why = if t.vm() { "EINVAL" } else { "EPERM" };
    let dot = if t.vm() && t.image() { "EBUSY" } else { why };
    out.code(0)
        .line(&format!("pivot_root tmp: {why}"))
        .line(&format!("pivot_root dot: {dot}"));
    if t.vm() && t.image() {
        // Its /tmp is a mount of the guest's own: the guest's root may
        // make it the root, inside the guest.
        if host_has("pivot_root") {
            t.sh("mkdir -p /tmp/old; pivot_root /tmp /tmp/old; echo exit=$?")
                .code(0)
                .line("exit=0");
        }
        return;
    }
    if host_has("pivot_root") {
        t.sh("mkdir -p /tmp/old; pivot_root /tmp /tmp/old; echo exit=$?")
            .code(0)
            .line("exit=1")
            .stderr_has(&format!(
                "pivot_root: failed to change root from `/tmp' to `/tmp/old': {}",
                if t.vm() {
                    "Invalid argument"
                } else {
                    "Operation not permitted"
                }
            ));
    }
}
attack!(pivot_root);

/// Create namespaces (a new user namespace gives back a full
/// capability set) with unshare(1), unshare(2) and clone(2).
fn new_namespaces(t: &Ctx) {
    if host_has("unshare") {
        let sh = t.sh("for f in -U -r -m -n -p -i -u -C -T; do unshare $f true; echo \"unshare $f: $?\"; done");
        sh.code(0);
        // The guest's root may create namespaces in the guest's kernel.
        let rc = if t.vm() { 0 } else { 1 };
        for f in ["-U", "-r", "-m", "-n", "-p", "-i", "-u", "-C", "-T"] {
            sh.line(&format!("unshare {f}: {rc}"));
        }
        let refusals = sh
            .stderr
            .matches("unshare: unshare failed: Operation not permitted")
            .count();
        if refusals != 9 * rc {
            sh.fail(format_args!(
                "expected {} 'unshare failed: Operation not permitted'",
                9 * rc
            ));
        }
    }
    let out = py_nr(
        t,
        &[],
        r#"
        flags = dict(user=0x10000000, mnt=0x20000, pid=0x20000000, net=0x40000000,
                     ipc=0x8000000, uts=0x4000000, cgroup=0x2000000, time=0x80)
        for n, f in flags.items():
            sc('unshare ' + n, NR['unshare'], f)
        sc('unshare user high bits', NR['unshare'], 0x100000000 | 0x10000000)
        for n, f in flags.items():
            r = sc('clone ' + n, NR['clone'], f | 17, 0, 0, 0, 0)
            if r == 0: os._exit(0)
            if r > 0: os.waitpid(r, 0)
        if hasattr(os, 'unshare'):
            attempt('os.unshare user', lambda: os.unshare(os.CLONE_NEWUSER))
        else:
            ctypes.set_errno(0)
            r = libc.unshare(0x10000000)
            report('os.unshare user', ctypes.get_errno(), None if r < 0 else r)
    "#,
    );
    if t.vm() {
        // All allowed in the guest's kernel, and nested: after them this
        // process is in a user namespace without a uid map (so no further
        // user namespace: EPERM) and its children in a pid namespace whose
        // init, the first clone, has exited (so later clones: ENOMEM, and a
        // new pid namespace from there: EINVAL). A flag above 32 bits is
        // simply invalid.
        out.code(0)
            .line("unshare user high bits: EINVAL")
            .line("clone user: EPERM")
            .line_starts("clone mnt: OK ")
            .line("clone mnt: OK 0")
            .line("clone pid: EINVAL")
            .line("os.unshare user: EPERM");
        for n in ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup", "time"] {
            out.line(&format!("unshare {n}: OK 0"));
        }
        for n in ["net", "ipc", "uts", "cgroup", "time"] {
            out.line(&format!("clone {n}: ENOMEM"));
        }
        return;
    }
    out.code(0)
        .line("unshare user high bits: EPERM")
        .line("os.unshare user: EPERM");
    for n in ["user", "mnt", "pid", "net", "ipc", "uts", "cgroup", "time"] {
        out.line(&format!("unshare {n}: EPERM"))
            .line(&format!("clone {n}: EPERM"));
    }
}
attack!(new_namespaces);

/// The classic chroot escape (chroot into a subdirectory, then climb
/// out with chdir("..") and chroot(".")).
fn chroot_escape(t: &Ctx) {
    let mut code = String::from(
        r#"
        os.makedirs('/tmp/jail', exist_ok=True)
        fd = os.open('/', os.O_RDONLY)
        attempt('chroot jail', lambda: os.chroot('/tmp/jail'))
        os.fchdir(fd)
        for _ in range(64): os.chdir('..')
        attempt('chroot dot', lambda: os.chroot('.'))
        print('root now:', sorted(os.listdir('/')))
    "#,
    );
    if t.vm() {
        // The guest's real / as its pid 1 (never chrooted) sees it.
        code += r#"
        print('pid 1 root:', sorted(os.listdir('/proc/1/root')))
    "#;
    }
    let out = py_nr(t, &[], &code);
    if t.vm() {
        // The guest's root may chroot, and so climb back out of a jail,
        // but only to the guest's own / (its initramfs, not the host's).
        out.code(0)
            .line("chroot jail: OK None")
            .line("chroot dot: OK None");
        let listing = |prefix: &str| {
            out.stdout
                .lines()
                .find_map(|l| l.strip_prefix(prefix))
                .unwrap_or_else(|| out.fail(format_args!("no {prefix:?} line")))
        };
        let root = listing("root now: ");
        if root != listing("pid 1 root: ") {
            out.fail("the climb did not end at the guest's own /");
        }
        // With an image, that / is the image's: the initramfs beneath it
        // is out of reach.
        let wants: &[&str] = if t.image() {
            &["'workspace'", "'usr'", "'etc'"]
        } else {
            &["'.cordon'", "'init'", "'workspace'"]
        };
        for want in wants {
            if !root.contains(want) {
                out.fail(format_args!("expected the guest's root, with {want}"));
            }
        }
        if t.image() && (root.contains("'.cordon'") || root.contains("'init'")) {
            out.fail("the climb reached the initramfs beneath the image");
        }
        if host_has("chroot") {
            t.sh("chroot /tmp /bin/true; echo exit=$?")
                .code(0)
                .line("exit=127")
                .stderr_has("chroot: failed to run command '/bin/true': No such file or directory");
        }
        return;
    }
    out.code(0)
        .line("chroot jail: EPERM")
        .line("chroot dot: EPERM");
    if host_has("chroot") {
        t.sh("chroot /tmp /bin/true; echo exit=$?")
            .code(0)
            .line("exit=125")
            .stderr_has("chroot: cannot change root directory to '/tmp': Operation not permitted");
    }
}
attack!(chroot_escape);

/// Join the supervisor's or any other namespace with setns.
fn setns_to_supervisor(t: &Ctx) {
    let out = py_nr(
        t,
        &[],
        r#"
        for ns in ['mnt', 'user', 'net', 'pid']:
            attempt('open /proc/1/ns/' + ns, lambda: os.open('/proc/1/ns/' + ns, os.O_RDONLY))
        fd = os.open('/proc/self/ns/net', os.O_RDONLY)
        sc('setns own net', NR['setns'], fd, 0)
        pidfd = sc('pidfd_open 1', NR['pidfd_open'], 1, 0)
        sc('setns pidfd 1', NR['setns'], pidfd, 0x20000)
    "#,
    );
    if t.vm() {
        // The guest's root shares its pid 1's namespaces: the guest's.
        out.code(0)
            .line_starts("open /proc/1/ns/mnt: OK ")
            .line_starts("open /proc/1/ns/user: OK ")
            .line_starts("open /proc/1/ns/net: OK ")
            .line_starts("open /proc/1/ns/pid: OK ")
            .line("setns own net: OK 0")
            .line_starts("pidfd_open 1: OK ")
            .line("setns pidfd 1: OK 0");
        return;
    }
    out.code(0)
        .line("open /proc/1/ns/mnt: EACCES")
        .line("open /proc/1/ns/user: EACCES")
        .line("open /proc/1/ns/net: EACCES")
        .line("open /proc/1/ns/pid: EACCES")
        .line("setns own net: EPERM")
        .line("setns pidfd 1: EPERM");
}
attack!(setns_to_supervisor);

// ───────────────────────── seccomp deny list ─────────────────────────

/// Load a new kernel (kexec) or reboot.
fn kexec_load(t: &Ctx) {
    py_nr(
        t,
        &[],
        r#"
        sc('kexec_load', NR['kexec_load'], 0, 0, 0, 0)
        sc('kexec_file_load', NR['kexec_file_load'], -1, -1, 0, b'', 0)
        sc('reboot', NR['reboot'], 0xfee1dead, 672274793, 0, 0)
    "#,
    )
    .code(0)
    .line(if t.vm() {
        // In the guest: unloading no crash kernel, and turning off
        // Ctrl-Alt-Del (command 0), both the guest kernel's own business.
        "kexec_load: OK 0"
    } else {
        "kexec_load: EPERM"
    })
    .line(if t.vm() {
        "kexec_file_load: EBADF"
    } else {
        "kexec_file_load: EPERM"
    })
    .line(if t.vm() {
        "reboot: OK 0"
    } else {
        "reboot: EPERM"
    });
}
attack!(kexec_load);

/// Load or unload kernel modules.
fn kernel_modules(t: &Ctx) {
    py_nr(
        t,
        &[],
        r#"
        img = ctypes.create_string_buffer(b'\x7fELF' + b'\0' * 60)
        sc('init_module', NR['init_module'], img, 64, b'')
        fd = os.open('/usr/bin/true', os.O_RDONLY)
        sc('finit_module', NR['finit_module'], fd, b'', 0)
        sc('delete_module', NR['delete_module'], b'cordon_nonexistent', 0o4000)
    "#,
    )
    .code(0)
    .line(if t.vm() {
        // The guest kernel takes modules from its root, and rejects these.
        "init_module: ENOEXEC"
    } else {
        "init_module: EPERM"
    })
    .line(if t.vm() {
        "finit_module: ENOEXEC"
    } else {
        "finit_module: EPERM"
    })
    .line(if t.vm() {
        "delete_module: ENOENT"
    } else {
        "delete_module: EPERM"
    });
}
attack!(kernel_modules);

/// Create an eBPF map (the first step of most eBPF exploits).
fn bpf(t: &Ctx) {
    let out = py_nr(
        t,
        &[],
        r#"
        attr = ctypes.create_string_buffer(struct.pack('IIII', 1, 4, 4, 1) + b'\0' * 112)
        sc('bpf map_create', NR['bpf'], 0, attr, 128)
        sc('bpf prog_load', NR['bpf'], 5, ctypes.create_string_buffer(128), 128)
    "#,
    );
    out.code(0).line(if t.vm() {
        // The guest's kernel, the guest's maps; the empty program is
        // refused by the guest's kernel (a bad address before 6.12, too
        // big an attribute from 6.12 on).
        "bpf map_create: OK 3"
    } else {
        "bpf map_create: EPERM"
    });
    let refused = if t.vm() {
        &["bpf prog_load: EFAULT", "bpf prog_load: E2BIG"][..]
    } else {
        &["bpf prog_load: EPERM"][..]
    };
    if !out.stdout.lines().any(|l| refused.contains(&l)) {
        out.fail(format_args!("expected one of {refused:?}"));
    }
}
attack!(bpf);

/// Open a perf event on ourselves (allowed by default perf_event_paranoid).
fn perf_event_open(t: &Ctx) {
    py_nr(
        t,
        &[],
        r#"
        attr = ctypes.create_string_buffer(struct.pack('IIQ', 1, 128, 0) + b'\0' * 112)
        sc('perf_event_open', NR['perf_event_open'], attr, 0, -1, -1, 0)
    "#,
    )
    .code(0)
    .line(if t.vm() {
        "perf_event_open: OK 3"
    } else {
        "perf_event_open: EPERM"
    });
}
attack!(perf_event_open);

/// Create a userfaultfd (used to win kernel races).
fn userfaultfd(t: &Ctx) {
    py_nr(
        t,
        &[],
        r#"
        sc('userfaultfd', NR['userfaultfd'], 0o2000000)
        attempt('open /dev/userfaultfd', lambda: os.open('/dev/userfaultfd', os.O_RDWR))
    "#,
    )
    .code(0)
    .line(if t.vm() {
        "userfaultfd: OK 3"
    } else {
        "userfaultfd: EPERM"
    })
    .line(if t.vm() {
        "open /dev/userfaultfd: OK 4"
    } else {
        "open /dev/userfaultfd: ENOENT"
    });
}
attack!(userfaultfd);

/// Use the kernel keyring (shared across namespaces, holds host keys).
fn keyring(t: &Ctx) {
    let out = py_nr(
        t,
        &[],
        r#"
        sc('keyctl get session', NR['keyctl'], 0, -3, 0)
        sc('keyctl join', NR['keyctl'], 1, b'cordon')
        sc('add_key', NR['add_key'], b'user', b'cordon', b'secret', 6, -3)
        sc('request_key', NR['request_key'], b'user', b'cordon', 0, 0)
    "#,
    );
    out.code(0);
    if t.vm() {
        // The guest kernel's keyrings hold nothing of the host's; key
        // serials are random.
        out.line_starts("keyctl get session: OK ")
            .line_starts("keyctl join: OK ")
            .line_starts("add_key: OK ")
            .line_starts("request_key: OK ");
    } else {
        out.line("keyctl get session: EPERM")
            .line("keyctl join: EPERM")
            .line("add_key: EPERM")
            .line("request_key: EPERM");
    }
}
attack!(keyring);

/// Set up io_uring (which bypasses seccomp for the operations it runs).
fn io_uring(t: &Ctx) {
    let out = py_nr(
        t,
        &[],
        r#"
        params = ctypes.create_string_buffer(120)
        sc('io_uring_setup', NR['io_uring_setup'], 8, params)
        sc('io_uring_enter', NR['io_uring_enter'], 0, 1, 0, 0, 0, 0)
        sc('io_uring_register', NR['io_uring_register'], 0, 0, 0, 0)
    "#,
    );
    out.code(0);
    if t.vm() {
        // The guest's io_uring; descriptor 0 (a pipe) is no ring.
        out.line("io_uring_setup: OK 3")
            .line("io_uring_enter: ENOTSUP")
            .line("io_uring_register: ENOTSUP");
    } else {
        out.line("io_uring_setup: EPERM")
            .line("io_uring_enter: EPERM")
            .line("io_uring_register: EPERM");
    }
}
attack!(io_uring);

/// clone3, whose flags live in memory a filter cannot read, creating a
/// user namespace: refused with ENOSYS so that libc falls back to clone.
fn clone3_enosys(t: &Ctx) {
    let out = py_nr(
        t,
        &[],
        r#"
        def clone3(name, flags):
            args = ctypes.create_string_buffer(struct.pack('QQQQQQQQQQQ', flags, 0, 0, 0, 17, 0, 0, 0, 0, 0, 0))
            r = sc(name, NR['clone3'], args, 88)
            if r == 0: os._exit(0)
            if r > 0: os.waitpid(r, 0)
        clone3('clone3 newuser', 0x10000000)
        clone3('clone3 plain', 0)
        pid = os.fork()
        if pid == 0: os._exit(7)
        print('fork fallback exit:', os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]))
    "#,
    );
    out.code(0).line("fork fallback exit: 7");
    if t.vm() {
        // No filter in the guest: both clone (the child says OK 0).
        out.line_starts("clone3 newuser: OK ")
            .line("clone3 newuser: OK 0")
            .line_starts("clone3 plain: OK ")
            .line("clone3 plain: OK 0");
    } else {
        out.line("clone3 newuser: ENOSYS")
            .line("clone3 plain: ENOSYS");
    }
}
attack!(clone3_enosys);

/// The x32 ABI: the same syscalls under numbers offset by 0x40000000,
/// which a deny list by number would miss.
fn x32_abi(t: &Ctx) {
    if !cfg!(target_arch = "x86_64") {
        eprintln!("notice: the x32 ABI exists only on x86_64");
        return;
    }
    py_nr(
        t,
        &[],
        r#"
        X = NR['X32']
        sc('x32 getpid', X | 39, 0)
        sc('x32 mount', X | 165, b'none', b'/tmp', b'tmpfs', 0, 0)
        sc('x32 unshare', X | 272, 0x10000000)
        sc('x32 kexec_load', X | 528, 0, 0, 0, 0)
        print('native getpid works:', libc.syscall(NR['getpid']) == os.getpid())
    "#,
    )
    .code(0)
    .line("x32 getpid: ENOSYS")
    .line("x32 mount: ENOSYS")
    .line("x32 unshare: ENOSYS")
    .line("x32 kexec_load: ENOSYS")
    .line("native getpid works: True");
}
attack!(x32_abi);

/// "Shocker": open a host file by a forged file handle.
fn open_by_handle_at(t: &Ctx) {
    let out = py_nr(
        t,
        &[],
        r#"
        h = ctypes.create_string_buffer(struct.pack('Ii', 128, 0) + b'\0' * 128)
        mid = ctypes.c_int(0)
        sc('name_to_handle_at', NR['name_to_handle_at'], -100, b'/usr', h, ctypes.byref(mid), 0)
        forged = ctypes.create_string_buffer(struct.pack('Ii', 8, 1) + struct.pack('II', 2, 0))
        fd = os.open('/workspace', os.O_RDONLY)
        sc('open_by_handle_at', NR['open_by_handle_at'], fd, forged, 0)
    "#,
    );
    out.code(0).line(if t.vm() {
        // The guest's root may try, and the forged handle opens nothing.
        "open_by_handle_at: ESTALE"
    } else {
        "open_by_handle_at: EPERM"
    });
    // 9p shares (the host's files) have no file handles; over virtio-fs
    // the guest's kernel hands out handles of its own (the host's server
    // opens nothing by handle: its filter refuses it).
    let named = if t.vm() {
        &["name_to_handle_at: ENOTSUP", "name_to_handle_at: OK 0"][..]
    } else {
        &["name_to_handle_at: EPERM"][..]
    };
    if !out.stdout.lines().any(|l| named.contains(&l)) {
        out.fail(format_args!("expected one of {named:?}"));
    }
}
attack!(open_by_handle_at);

/// Push keystrokes into a terminal with TIOCSTI (and TIOCLINUX),
/// including with garbage in the request's upper 32 bits.
fn tiocsti(t: &Ctx) {
    let out = t.py(r#"
        import fcntl, termios
        m = os.open('/dev/ptmx', os.O_RDWR | os.O_NOCTTY)
        libc.grantpt(m); libc.unlockpt(m)
        libc.ptsname.restype = ctypes.c_char_p
        s = os.open(libc.ptsname(m), os.O_RDWR | os.O_NOCTTY)
        for name, fd, req in [('TIOCSTI slave', s, 0x5412), ('TIOCSTI master', m, 0x5412),
                              ('TIOCSTI high bits', s, 0x100005412), ('TIOCLINUX', s, 0x541C)]:
            c = ctypes.c_char(b'x')
            ctypes.set_errno(0)
            r = libc.ioctl(fd, ctypes.c_ulong(req), ctypes.byref(c))
            report(name, ctypes.get_errno(), None if r < 0 else r)
        attempt('fcntl TIOCSTI', lambda: fcntl.ioctl(s, termios.TIOCSTI, b'x'))
        attempt('open /dev/tty', lambda: os.open('/dev/tty', os.O_RDWR))
    "#);
    out.code(0).line("open /dev/tty: ENXIO");
    if t.vm() {
        // The guest's root (CAP_SYS_ADMIN) may push input into the guest's
        // own pseudo-terminals; the host's terminal is not among them.
        out.line("TIOCSTI slave: OK 0")
            .line("TIOCSTI master: OK 0")
            .line("TIOCSTI high bits: OK 0")
            .line("TIOCLINUX: ENOTTY")
            .line("fcntl TIOCSTI: OK b'x'");
    } else {
        out.line("TIOCSTI slave: EPERM")
            .line("TIOCSTI master: EPERM")
            .line("TIOCSTI high bits: EPERM")
            .line("TIOCLINUX: EPERM")
            .line("fcntl TIOCSTI: EPERM");
    }
}
attack!(tiocsti);

// ───────────────────────── resources ─────────────────────────

/// Whether `cordon doctor`, run as this test's identity, reports cgroup
/// limits (rather than per-process rlimits).
fn limits_by_cgroup(t: &Ctx) -> bool {
    let mut cmd = t.cordon(["doctor"]);
    cmd.stdout(Stdio::piped()).stderr(Stdio::null());
    let out = cmd.output().expect("cordon doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("limits mechanism"))
        .unwrap_or_else(|| panic!("no limits line in cordon doctor output:\n{text}"));
    line.split("limits mechanism")
        .nth(1)
        .is_some_and(|m| m.trim_start().starts_with("cgroup"))
}

/// Asserts the host can still create processes quickly.
#[track_caller]
fn assert_host_responsive(out: &Out) {
    let start = Instant::now();
    for _ in 0..20 {
        let s = std::process::Command::new("true")
            .status()
            .expect("host fork");
        assert!(s.success());
    }
    if start.elapsed() > Duration::from_secs(5) {
        out.fail(format_args!(
            "the host took {:?} to run 20 processes",
            start.elapsed()
        ));
    }
}

/// The classic bash fork bomb under --pids 64, watched from the host.
fn fork_bomb(t: &Ctx) {
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    let marker = format!("cordon-bomb-{}", unique());
    let cordon = fs::canonicalize(env!("CARGO_BIN_EXE_cordon")).unwrap();
    let (done, peak) = (AtomicBool::new(false), AtomicUsize::new(0));
    let out = std::thread::scope(|s| {
        // Every bomb process is a fork of the shell and so carries the
        // marker in its command line: count them on the host throughout.
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                let mut pids = host_pids_with_cmdline_containing(&marker);
                if t.vm() {
                    // The bomb runs inside QEMU: only cordon itself may
                    // carry the marker on the host. A child the front end
                    // spawns (QEMU, virtiofsd) shares its command line from
                    // the fork until its exec, and its comm is the forking
                    // thread's (a tokio worker's), not "cordon"; but until
                    // the exec it still runs cordon's binary. So a process
                    // counts only when it runs another binary and its
                    // command line, read after that, still holds the marker.
                    pids.retain(|p| {
                        let not_cordon = match fs::read_link(format!("/proc/{p}/exe")) {
                            Ok(exe) => {
                                let exe = exe.to_string_lossy();
                                exe.trim_end_matches(" (deleted)") != cordon.to_string_lossy()
                            }
                            // Unreadable (not root): the comm, as before.
                            Err(_) => fs::read_to_string(format!("/proc/{p}/comm"))
                                .is_ok_and(|c| c.trim() != "cordon"),
                        };
                        not_cordon
                            && fs::read(format!("/proc/{p}/cmdline")).is_ok_and(|c| {
                                String::from_utf8_lossy(&c).contains(marker.as_str())
                            })
                    });
                }
                peak.fetch_max(pids.len(), Ordering::Relaxed);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        // The bomb starts in a background subshell, forked before any
        // limit is near; the top-level shell then waits 1.5 s with builtins
        // only (a read from /dev/zero that never sees a newline), so it
        // never joins bash's fork-retry back-off, while the bomb runs into
        // the limit. Then it exits and the session's end takes every
        // remaining process with it.
        let out = t.sh_with(
            &["--pids", "64", "--timeout", "10"],
            &format!(
                "# {marker}\n( :(){{ :|:& }};: ) & read -t 1.5 < /dev/zero; echo top-level-rc=$?"
            ),
        );
        done.store(true, Ordering::Relaxed);
        out
    });
    out.code(0)
        .line("top-level-rc=142")
        .faster_than(t.within(Duration::from_secs(10)))
        .stderr_has("fork: retry: Resource temporarily unavailable");
    let peak = peak.into_inner();
    if t.vm() {
        if peak != 0 {
            out.fail(format_args!(
                "HOST CHANGED: the host saw {peak} bomb processes outside QEMU"
            ));
        }
    } else if !(10..=64).contains(&peak) {
        out.fail(format_args!(
            "the host saw at most {peak} bomb processes at once; expected the bomb to run and stay within 64"
        ));
    }
    if !eventually(Duration::from_secs(5), || {
        host_pids_with_cmdline_containing(&marker).is_empty()
    }) {
        out.fail(format_args!(
            "HOST CHANGED: fork bomb processes survive the session: {:?}",
            host_pids_with_cmdline_containing(&marker)
        ));
    }
    assert_host_responsive(&out);
}
attack!(fork_bomb);

/// Fork until the process limit refuses: it must come before 64.
fn fork_exhaustion(t: &Ctx) {
    let marker = unique();
    // Under TCG each fork and exec costs tens of milliseconds: 3 s for the
    // 62 children on an idle machine, over 10 s with other guests running.
    let limit = if t.vm() { 40 } else { 10 };
    let out = t.py_with(
        &["--pids", "64", "--timeout", &limit.to_string()],
        &format!(
            r#"
            import shutil
            sleep = shutil.which('sleep')
            n = 0
            try:
                while n < 1000:
                    if os.fork() == 0:
                        os.execv(sleep, ['sleep', '{marker}'])
                    n += 1
            except OSError as e:
                print('fork failed:', errno.errorcode[e.errno])
            print('children:', n)
        "#
        ),
    );
    out.code(0)
        .line("fork failed: EAGAIN")
        .faster_than(Duration::from_secs(limit));
    let n: u32 = out
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("children: "))
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| out.fail("no child count"));
    if !(1..64).contains(&n) {
        out.fail(format_args!("expected fewer than 64 children, got {n}"));
    }
    let argv = ["sleep", &marker.to_string()];
    if !eventually(Duration::from_secs(5), || {
        host_pids_with_argv(&argv).is_empty()
    }) {
        out.fail(format_args!(
            "HOST CHANGED: children survive the session: {:?}",
            host_pids_with_argv(&argv)
        ));
    }
    assert_host_responsive(&out);
}
attack!(fork_exhaustion);

/// Allocate 2 GiB under --memory 64M.
fn memory_hog(t: &Ctx) {
    if t.vm() {
        return guest_memory_hog(t);
    }
    let cgroup = limits_by_cgroup(t);
    let out = t.py_with(
        &["--memory", "64M", "--timeout", "30"],
        r#"
            chunks = []
            for i in range(2048):
                b = bytearray(1 << 20)
                b[::4096] = b'x' * 256
                chunks.append(b)
            print('allocated 2 GiB')
        "#,
    );
    out.lacks("allocated 2 GiB");
    if cgroup {
        out.code(122)
            .stderr_has("cordon: out of memory: the sandbox exceeded its 64 MiB limit");
    } else {
        // Per-process RLIMIT_DATA: the allocation fails instead.
        out.code(1).stderr_has("MemoryError");
    }
}
attack!(memory_hog);

/// In a microVM --memory is the guest's RAM, of which 64M is too little to
/// boot: the attack runs at the least, 128M, while the host watches QEMU's
/// resident memory. It allocates 16 MiB at a time: with 1 MiB, the guest
/// under TCG thrashes its page cache for tens of seconds before its OOM
/// killer acts.
fn guest_memory_hog(t: &Ctx) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    t.py_with(&["--memory", "64M"], "print('booted')")
        .code(125)
        .lacks("booted")
        .stderr_has("a microVM needs at least 128 MiB of memory, not 64 MiB");
    let (done, peak_kib) = (AtomicBool::new(false), AtomicU64::new(0));
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                for pid in t.qemu_pids() {
                    let rss = fs::read_to_string(format!("/proc/{pid}/status"))
                        .ok()
                        .and_then(|st| {
                            st.lines()
                                .find_map(|l| l.strip_prefix("VmRSS:"))
                                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
                        });
                    if let Some(kib) = rss {
                        peak_kib.fetch_max(kib, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(50));
            }
        });
        let out = t.py_with(
            &["--memory", "128M", "--timeout", "40"],
            r#"
                chunks = []
                for i in range(128):
                    b = bytearray(16 << 20)
                    b[::4096] = b'x' * 4096
                    chunks.append(b)
                print('allocated 2 GiB')
            "#,
        );
        done.store(true, Ordering::Relaxed);
        out
    });
    out.lacks("allocated 2 GiB")
        .code(122)
        .stderr_has("cordon: out of memory: the sandbox exceeded its 128 MiB limit");
    // The guest's RAM plus QEMU's own needs (TCG's code cache, 9p buffers):
    // never the 2 GiB asked for.
    let peak_mib = peak_kib.into_inner() / 1024;
    if peak_mib == 0 || peak_mib > 128 + 512 {
        out.fail(format_args!(
            "QEMU's resident memory peaked at {peak_mib} MiB for a 128 MiB guest"
        ));
    }
}

/// Endless output (`yes`) under --timeout 2, read with a fixed buffer.
fn endless_output(t: &Ctx) {
    let mut args = vec![
        "run".to_string(),
        "--workspace".into(),
        t.workspace.display().to_string(),
    ];
    args.extend(["--timeout", "2", "--", "yes"].map(String::from));
    let mut cmd = t.cordon(&args);
    cmd.stdout(Stdio::piped()).stderr(Stdio::piped());
    let run = |cmd: &mut std::process::Command| {
        let start = Instant::now();
        let mut child = cmd.spawn().unwrap();
        let mut stdout = child.stdout.take().unwrap();
        let mut stderr = child.stderr.take().unwrap();
        // Count the bytes through a fixed buffer: memory stays flat
        // however much the command writes.
        let counter = std::thread::spawn(move || {
            let mut buf = vec![0u8; 64 * 1024];
            let mut total = 0u64;
            while let Ok(n) = stdout.read(&mut buf) {
                if n == 0 {
                    break;
                }
                total += n as u64;
            }
            total
        });
        let pid = child.id();
        let status = wait_bounded(&mut child, Duration::from_secs(30));
        let elapsed = start.elapsed();
        let mut err = String::new();
        let _ = stderr.read_to_string(&mut err);
        let total = counter.join().unwrap();
        (
            Out {
                what: format!("[{:?}] cordon run --timeout 2 -- yes", t.mode),
                pid,
                code: status.and_then(|s| s.code()),
                stdout: format!("({total} bytes)"),
                stderr: err,
                elapsed,
            },
            total,
        )
    };
    let hazards = workspace_hazards(&t.workspace);
    let (out, total) = run(&mut cmd);
    if t.vm() {
        t.assert_vm_left_nothing(&out, &hazards);
    }
    out.code(124)
        .stderr_has("cordon: timed out after 2s; the command was killed")
        .faster_than(t.within(Duration::from_secs(10)));
    if total == 0 {
        out.fail("yes produced no output at all");
    }
}
attack!(endless_output);

/// A busy loop that ignores the polite signals, under --timeout 1.
fn endless_loop(t: &Ctx) {
    let out = t.run(
        &["--timeout", "1"],
        &["sh", "-c", "trap '' TERM INT HUP; while :; do :; done"],
    );
    out.code(124)
        .stderr_has("cordon: timed out after 1s; the command was killed")
        .faster_than(t.within(Duration::from_secs(6)));
}
attack!(endless_loop);

/// Fill /tmp and /dev/shm (--tmp-size 16M) with 1 GiB each.
fn fill_tmp(t: &Ctx) {
    let host_tmp = std::env::temp_dir();
    let free_before = free_bytes(&host_tmp);
    let out = t.sh_with(&["--tmp-size", "16M"],
        "df -k /tmp | tail -1 | awk '{print \"tmp-size=\" $2}'; \
         dd if=/dev/zero of=/tmp/fill bs=1M count=1024; echo dd-exit=$?; stat -c size=%s /tmp/fill; \
         dd if=/dev/zero of=/dev/shm/fill bs=1M count=1024; echo shm-exit=$?");
    out.code(0)
        .line("tmp-size=16384")
        .line("dd-exit=1")
        .line("size=16777216")
        .line("shm-exit=1")
        .stderr_has("dd: error writing '/tmp/fill': No space left on device")
        .stderr_has("dd: error writing '/dev/shm/fill': No space left on device");
    let free_after = free_bytes(&host_tmp);
    if free_after + (512 << 20) < free_before {
        out.fail(format_args!(
            "HOST CHANGED: free space on the host's {} fell from {free_before} to {free_after}",
            host_tmp.display()
        ));
    }
}
attack!(fill_tmp);

/// Flood the consoles (/dev/console, the serial port) for a second each:
/// natively there are none; a microVM's serial console is read by cordon,
/// which keeps only its tail, so no host file grows at the guest's will.
fn console_flood(t: &Ctx) {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    let (done, peak) = (AtomicBool::new(false), AtomicU64::new(0));
    let out = std::thread::scope(|s| {
        s.spawn(|| {
            while !done.load(Ordering::Relaxed) {
                if t.vm() {
                    peak.fetch_max(t.vm_largest_written_file(), Ordering::Relaxed);
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let out = t.sh_with(
            &["--timeout", "20"],
            "for d in /dev/console /dev/ttyS0; do \
             timeout 1 sh -c \"yes cordon-console-flood > $d\"; echo \"$d: $?\"; done",
        );
        done.store(true, Ordering::Relaxed);
        out
    });
    if t.vm() {
        // yes runs until timeout stops it.
        out.code(0)
            .line("/dev/console: 124")
            .line("/dev/ttyS0: 124");
        let peak = peak.into_inner();
        if peak > 256 << 10 {
            out.fail(format_args!(
                "HOST CHANGED: flooding its consoles, the guest grew a host file QEMU writes to {peak} bytes"
            ));
        }
    } else {
        out.code(0)
            .line("/dev/console: 2")
            .line("/dev/ttyS0: 2")
            .stderr_has("cannot create /dev/console: Read-only file system")
            .stderr_has("cannot create /dev/ttyS0: Read-only file system");
    }
}
attack!(console_flood);

/// Leave daemons behind: `setsid nohup sleep &` and a double-forked,
/// setsid'd Python daemon, then end the session.
fn background_process_outlives_session(t: &Ctx) {
    let (m1, m2) = (unique(), unique());
    let launch = if host_has("setsid") {
        format!("setsid nohup sleep {m1} >/dev/null 2>&1 &")
    } else {
        format!("nohup sleep {m1} >/dev/null 2>&1 &")
    };
    // A double-forked daemon in its own session, stdio on /dev/null.
    let daemon = t.workspace.join("daemon.py");
    fs::write(
        &daemon,
        dedent(&format!(
            r#"
            import os
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    fd = os.open("/dev/null", os.O_RDWR)
                    for i in (0, 1, 2):
                        os.dup2(fd, i)
                    os.execvp("sleep", ["sleep", "{m2}"])
                os._exit(0)
            "#
        )),
    )
    .unwrap();
    fs::set_permissions(&daemon, fs::Permissions::from_mode(0o644)).unwrap();
    // Both must be running before the session ends.
    let out = t.sh(&format!(
        "{launch} python3 daemon.py; sleep 0.2; \
         for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline 2>/dev/null; echo; done \
         | grep -c '^sleep {m1} \\|^sleep {m2} '"
    ));
    out.code(0)
        .line("2")
        .faster_than(t.within(Duration::from_secs(10)));
    for m in [m1, m2] {
        let argv = ["sleep", &m.to_string()];
        if !eventually(Duration::from_secs(3), || {
            host_pids_with_argv(&argv).is_empty()
        }) {
            out.fail(format_args!(
                "HOST CHANGED: `sleep {m}` outlived the session: pids {:?}",
                host_pids_with_argv(&argv)
            ));
        }
    }
}
attack!(background_process_outlives_session);

/// The battery again with an image as the root (the seeds environment)
/// and root inside, cordon started by root (`in_image::<attack>`), as
/// uid 65534 (`in_image_unprivileged::<attack>`) and with the image as a
/// microVM guest's root (`in_image_microvm::<attack>`). What root inside may do
/// differently (write its own root, chown in it) each attack says; what it
/// must not (reach the host, keep a capability outside its namespaces,
/// leave a set-id file the host would honour) holds the same.
macro_rules! in_images {
    ($($name:ident),* $(,)?) => {
        mod in_image {
            attack!(@in_image Image: $($name),*);
        }
        /// Cordon started as uid 65534, with its subordinate ids.
        mod in_image_unprivileged {
            attack!(@in_image ImageUnprivileged: $($name),*);
        }
        /// The image as a microVM guest's root.
        mod in_image_microvm {
            attack!(@in_image ImageMicrovm: $($name),*);
        }
    };
}

in_images!(
    write_to_usr,
    write_to_etc,
    write_to_root_dir,
    write_to_host_path,
    symlink_planted_by_host,
    symlink_created_inside,
    write_via_proc_self_root,
    write_via_proc_1_root,
    dotdot_from_workspace,
    write_to_ro_bind,
    hardlink_host_file,
    mknod_device,
    chmod_host_device_node,
    chmod_global_proc_entry,
    setuid_binary_planted_in_workspace,
    read_host_secret_file,
    read_root_home,
    read_etc_shadow,
    env_canary,
    read_kernel_log,
    inherited_fds,
    kernel_command_line,
    tcp_to_host_listener,
    tcp_to_host_listener_loopback_mode,
    udp_to_host,
    udp_to_host_loopback_mode,
    dns_resolution,
    raw_socket,
    packet_and_exotic_sockets,
    netlink_sees_only_lo,
    netlink_create_interface,
    unix_socket_to_host,
    host_process_invisible,
    kill_host_process,
    ptrace_supervisor,
    supervisor_proc_files,
    signal_supervisor,
    freeze_supervisor_past_timeout,
    host_name_and_clock,
    sysctl_write,
    setuid_binaries,
    capabilities_zero,
    setgroups_and_identity,
    mount_filesystems,
    umount_filesystems,
    pivot_root,
    new_namespaces,
    chroot_escape,
    setns_to_supervisor,
    kexec_load,
    kernel_modules,
    bpf,
    perf_event_open,
    userfaultfd,
    keyring,
    io_uring,
    clone3_enosys,
    x32_abi,
    open_by_handle_at,
    tiocsti,
    fork_bomb,
    fork_exhaustion,
    memory_hog,
    endless_output,
    endless_loop,
    fill_tmp,
    console_flood,
    background_process_outlives_session,
);
