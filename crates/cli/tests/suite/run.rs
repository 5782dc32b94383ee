//! End-to-end tests of `cordon run`, `cordon shell` and `cordon doctor`,
//! as root and as an unprivileged user.

use crate::support;

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{Who, available, cordon, run, text, workspace};

/// Declares one test per identity for a body taking `who: Who`.
macro_rules! both {
    ($($name:ident => $body:expr;)*) => {
        mod root {
            use super::*;
            $(#[test] fn $name() { if available(Who::Root) { ($body)(Who::Root) } })*
        }
        mod unprivileged {
            use super::*;
            $(#[test] fn $name() { if available(Who::Unprivileged) { ($body)(Who::Unprivileged) } })*
        }
    };
}

/// The same bodies against the microvm backend.
macro_rules! microvm {
    ($($name:ident => $body:expr;)*) => {
        mod microvm {
            use super::*;
            $(#[test] fn $name() { if available(Who::Microvm) { ($body)(Who::Microvm) } })*
        }
    };
}

fn byte_exact(who: Who) {
    let ws = workspace(who);
    let data: Vec<u8> = {
        let mut f = std::fs::File::open("/dev/urandom").unwrap();
        let mut d = vec![0u8; 5_000_000];
        f.read_exact(&mut d).unwrap();
        d
    };
    std::fs::write(ws.path().join("f"), &data).unwrap();
    let out = run(who, ws.path(), &[], &["cat", "f"]).output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        out.stdout == data,
        "stdout differs ({} bytes)",
        out.stdout.len()
    );
    assert!(out.stderr.is_empty());
}

fn streams_apart(who: Who) {
    let ws = workspace(who);
    let out = run(
        who,
        ws.path(),
        &[],
        &[
            "sh",
            "-c",
            "printf 'out\\000\\377partial'; printf 'err\\001no newline' >&2; printf more",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(out.stdout, b"out\x00\xffpartialmore");
    assert_eq!(out.stderr, b"err\x01no newline");
}

fn stdin_passes_through(who: Who) {
    let ws = workspace(who);
    let mut child = run(
        who,
        ws.path(),
        &[],
        &["sh", "-c", "tr a-z A-Z; echo done >&2"],
    )
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let input: Vec<u8> = b"hello sandbox\n".repeat(100_000);
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success());
    assert_eq!(out.stdout, b"HELLO SANDBOX\n".repeat(100_000));
    assert_eq!(out.stderr, b"done\n");
}

fn exit_codes(who: Who) {
    let ws = workspace(who);
    let code = |cmd: &[&str], opts: &[&str]| {
        let out = run(who, ws.path(), opts, cmd).output().unwrap();
        (out.status.code().unwrap(), text(&out.stderr))
    };
    assert_eq!(code(&["sh", "-c", "exit 42"], &[]).0, 42);
    assert_eq!(code(&["sh", "-c", "kill -9 $$"], &[]).0, 137);
    assert_eq!(code(&["sh", "-c", "kill -TERM $$"], &[]).0, 143);
    let (c, err) = code(&["no-such-program"], &[]);
    assert_eq!(c, 127);
    assert_eq!(err, "cordon: no-such-program: command not found\n");
    std::fs::write(ws.path().join("noexec.sh"), "#!/bin/sh\necho hi\n").unwrap();
    let (c, err) = code(&["/workspace/noexec.sh"], &[]);
    assert_eq!(c, 126, "{err}");
    assert!(err.contains("permission denied"), "{err}");
    let start = Instant::now();
    let (c, err) = code(&["sleep", "30"], &["--timeout", "500ms"]);
    assert_eq!(c, 124);
    assert_eq!(
        err,
        "cordon: timed out after 500ms; the command was killed\n"
    );
    assert!(start.elapsed() < Duration::from_secs(10));
}

/// Issue 32: a command is everything from the first word that is not an
/// option, as users type it (`--` still works); a mistyped option before
/// it is refused as an option, with clap's hint, not run as a command.
fn the_command_needs_no_double_dash(who: Who) {
    let ws = workspace(who);
    let out = cordon(who, ws.path())
        .args(["run", "--timeout", "30s", "python3", "-c", "print(6 * 7)"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "42\n");
    let out = cordon(who, ws.path())
        .args(["run", "--timout", "30s", "true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert!(err.contains("unexpected argument '--timout'"), "{err}");
}

fn sandbox_failure_is_one_line(who: Who) {
    let ws = workspace(who);
    let out = run(
        who,
        ws.path(),
        &["--workspace", "/nonexistent/dir"],
        &["true"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(125));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.starts_with("cordon: ") && err.contains("/nonexistent/dir"),
        "{err}"
    );
    let out = run(
        who,
        ws.path(),
        &["--workdir", "/workspace/missing"],
        &["true"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert_eq!(
        text(&out.stderr),
        "cordon: working directory /workspace/missing: No such file or directory (os error 2)\n"
    );
    let out = run(who, ws.path(), &["--memory", "lots"], &["true"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("invalid size"),
        "{}",
        text(&out.stderr)
    );
}

/// A workspace or bind holding the user's home would let a sandbox rewrite
/// what the user's shell and tools run (`~/.bashrc`, `~/.ssh`).
fn home_is_no_workspace(who: Who) {
    let ws = workspace(who);
    let home = ws.path().join("home");
    std::fs::create_dir_all(home.join("project")).unwrap();
    // cordon's own directories elsewhere, so that only the home is at stake.
    let xdg = workspace(who);
    for (opts, what) in [
        (vec![], "the workspace"),
        (
            vec!["--workspace", "home/project", "--rw", ".:/x"],
            "a bind",
        ),
    ] {
        let out = run(who, ws.path(), &opts, &["true"])
            .env("HOME", &home)
            .env("XDG_CONFIG_HOME", xdg.path().join("config"))
            .env("XDG_DATA_HOME", xdg.path().join("data"))
            .output()
            .unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{err}");
        assert!(
            err.starts_with(&format!("cordon: {what} "))
                && err.contains("holds your home directory"),
            "{err}"
        );
    }
    // Below the home directory is where projects live.
    let out = run(who, ws.path(), &["--workspace", "home/project"], &["true"])
        .env("HOME", &home)
        .env("XDG_CONFIG_HOME", xdg.path().join("config"))
        .env("XDG_DATA_HOME", xdg.path().join("data"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", text(&out.stderr));
}

fn options_take_effect(who: Who) {
    let ws = workspace(who);
    let extra = workspace(who);
    std::fs::write(extra.path().join("data.txt"), "bound\n").unwrap();
    std::fs::create_dir(ws.path().join("sub")).unwrap();
    let ro = format!("{}:/data", extra.path().display());
    let out = run(
        who,
        ws.path(),
        &["--env", "GREETING=hi there", "--ro", &ro, "--workdir", "/workspace/sub", "--tmp-size", "8M"],
        &[
            "sh",
            "-c",
            "echo \"$GREETING\"; pwd; cat /data/data.txt; touch /data/x 2>&1 | grep -o 'Read-only file system'; df -k /tmp | tail -1 | awk '{print $2}'; env | grep -c CORDON_TEST_CANARY",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(
        text(&out.stdout),
        "hi there\n/workspace/sub\nbound\nRead-only file system\n8192\n0\n",
        "{}",
        text(&out.stderr)
    );
    let rw = format!("{}:/scratch", extra.path().display());
    let out = run(
        who,
        ws.path(),
        &["--rw", &rw],
        &["sh", "-c", "echo written > /scratch/out"],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        std::fs::read_to_string(extra.path().join("out")).unwrap(),
        "written\n"
    );
}

fn network_modes(who: Who) {
    let ws = workspace(who);
    let probe = "import socket; s=socket.socket(); s.bind(('127.0.0.1', 0)); s.listen(); socket.create_connection(s.getsockname(), timeout=2); print('ok')";
    let off = run(who, ws.path(), &[], &["python3", "-c", probe])
        .output()
        .unwrap();
    assert!(!off.status.success());
    assert!(
        text(&off.stderr).contains("OSError") || text(&off.stderr).contains("Error"),
        "{}",
        text(&off.stderr)
    );
    let lo = run(
        who,
        ws.path(),
        &["--network", "loopback"],
        &["python3", "-c", probe],
    )
    .output()
    .unwrap();
    assert_eq!(text(&lo.stdout), "ok\n", "{}", text(&lo.stderr));
    let ifaces = run(
        who,
        ws.path(),
        &[],
        &[
            "sh",
            "-c",
            "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '",
        ],
    )
    .output()
    .unwrap();
    assert_eq!(text(&ifaces.stdout), "lo\n");
}

/// A GET of `/index.html` at `addr`, once something answers there.
fn get_when_up(addr: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let answer = std::net::TcpStream::connect(addr).and_then(|mut c| {
            c.set_read_timeout(Some(Duration::from_secs(10)))?;
            c.write_all(b"GET /index.html HTTP/1.0\r\nHost: x\r\n\r\n")?;
            let mut a = String::new();
            c.read_to_string(&mut a)?;
            Ok(a)
        });
        match answer {
            Ok(a) if a.starts_with("HTTP/") => return a,
            _ if Instant::now() > deadline => panic!("nothing answered at {addr}: {answer:?}"),
            _ => std::thread::sleep(Duration::from_millis(200)),
        }
    }
}

fn published_ports(who: Who) {
    let ws = workspace(who);
    std::fs::write(
        ws.path().join("index.html"),
        "<h1>made in the sandbox</h1>\n",
    )
    .unwrap();
    // The network stays off but for loopback: -p raises it, no further.
    let mut child = run(
        who,
        ws.path(),
        &["-p", "0:8000", "--publish", "0:8001"],
        &[
            "python3",
            "-m",
            "http.server",
            "8000",
            "--bind",
            "127.0.0.1",
        ],
    )
    .stdout(Stdio::null())
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    let mut addrs = Vec::new();
    while addrs.len() < 2 {
        let mut line = String::new();
        use std::io::BufRead;
        assert!(stderr.read_line(&mut line).unwrap() > 0, "{addrs:?}");
        if let Some(rest) = line.strip_prefix("cordon: port ") {
            let (port, url) = rest.trim().split_once(" of the sandbox: http://").unwrap();
            addrs.push((port.to_string(), url.to_string()));
        }
    }
    assert_eq!(addrs[0].0, "8000");
    assert_eq!(addrs[1].0, "8001");
    let page = get_when_up(&addrs[0].1);
    assert!(page.starts_with("HTTP/1.0 200"), "{page}");
    assert!(page.ends_with("<h1>made in the sandbox</h1>\n"), "{page}");
    // Nothing listens on 8001 inside: the connection is closed, unanswered.
    let mut c = std::net::TcpStream::connect(&addrs[1].1).unwrap();
    c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = c.write_all(b"GET / HTTP/1.0\r\n\r\n");
    let mut rest = Vec::new();
    let _ = c.read_to_end(&mut rest);
    assert!(rest.is_empty(), "{}", text(&rest));
    // The ports go with the sandbox.
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .unwrap();
    child.wait().unwrap();
    std::thread::sleep(Duration::from_millis(100));
    assert!(std::net::TcpStream::connect(&addrs[0].1).is_err());

    // Only this machine's loopback is offered, and a bad one is a usage error.
    for bad in ["0.0.0.0:8000:8000", "80:http", "70000"] {
        let out = run(who, ws.path(), &["-p", bad], &["true"])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(125), "{bad}: {}", text(&out.stderr));
        assert!(
            text(&out.stderr).contains("--publish"),
            "{}",
            text(&out.stderr)
        );
    }
}

fn python_node_gcc_git_run(who: Who) {
    let ws = workspace(who);
    std::fs::write(
        ws.path().join("hello.c"),
        "#include <stdio.h>\nint main(void){puts(\"c ok\");return 0;}\n",
    )
    .unwrap();
    let script = "python3 -c 'print(\"py ok\")' && node -e 'console.log(\"node ok\")' && gcc -o /tmp/hello hello.c && /tmp/hello && git init -q repo && git -C repo status --short && echo git ok && ls --version | head -1";
    let out = run(who, ws.path(), &[], &["sh", "-c", script])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    for want in ["py ok", "node ok", "c ok", "git ok", "ls (GNU coreutils)"] {
        assert!(
            stdout.contains(want),
            "missing {want:?} in {stdout:?}; stderr: {}",
            text(&out.stderr)
        );
    }
}

fn host_sigkill_takes_the_sandbox_down(who: Who) {
    let ws = workspace(who);
    let marker = format!("sleep 86{}", std::process::id() % 1000);
    let mut child = run(
        who,
        ws.path(),
        &[],
        &["sh", "-c", &format!("setsid {marker} & {marker}")],
    )
    .stdout(Stdio::null())
    .spawn()
    .unwrap();
    // A microVM's processes are inside QEMU, whose command line names the
    // workspace over 9p (over virtio-fs the workspace's server's does);
    // the native sandbox's are host processes.
    let ws_path = ws.path().canonicalize().unwrap();
    let vm_traces = [
        format!("path={}", ws_path.display()),
        format!("--shared-dir={}", ws_path.display()),
    ];
    let count = || match who {
        Who::Microvm => {
            vm_traces
                .iter()
                .map(|t| processes_containing(t))
                .sum::<usize>()
                * 2
        }
        _ => processes_matching(&marker),
    };
    let deadline = Instant::now() + Duration::from_secs(if who == Who::Microvm { 60 } else { 10 });
    while count() < 2 {
        assert!(Instant::now() < deadline, "sandboxed sleeps never started");
        std::thread::sleep(Duration::from_millis(10));
    }
    if who == Who::Microvm {
        // The guest has booted; give the sleeps a moment to start in it.
        std::thread::sleep(Duration::from_secs(2));
    }
    let cordon_pid = child.id();
    child.kill().unwrap(); // SIGKILL: no cleanup code runs in cordon.
    child.wait().unwrap();
    let deadline = Instant::now() + Duration::from_secs(5);
    while count() > 0 {
        assert!(
            Instant::now() < deadline,
            "sandboxed processes outlived a SIGKILLed host"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    if who == Who::Microvm {
        // The killed cordon could not remove its run directory (the guest's
        // /etc); the next microVM cordon starts removes it.
        let runs = std::env::var_os("CORDON_VM_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| "/var/cache/cordon/vm".into())
            .join("run");
        let left = || {
            std::fs::read_dir(&runs)
                .map(|d| {
                    d.flatten()
                        .filter(|e| {
                            e.file_name()
                                .to_string_lossy()
                                .starts_with(&format!("{cordon_pid}-"))
                        })
                        .count()
                })
                .unwrap_or(0)
        };
        let out = run(who, ws.path(), &[], &["true"]).output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(left(), 0, "the dead cordon's run directory is still there");
    }
}

fn processes_containing(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| text(&c).replace('\0', " ").contains(needle))
                .unwrap_or(false)
        })
        .count()
}

fn processes_matching(needle: &str) -> usize {
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .map(|c| text(&c).replace('\0', " ").trim_end() == needle)
                .unwrap_or(false)
        })
        .count()
}

/// Takes the child's stdout once the command has printed `ready`.
fn until_ready(child: &mut std::process::Child) -> std::process::ChildStdout {
    let mut stdout = child.stdout.take().unwrap();
    let mut buf = [0u8; 6];
    stdout.read_exact(&mut buf).unwrap();
    assert_eq!(&buf, b"ready\n");
    stdout
}

fn interrupt_is_forwarded(who: Who) {
    let ws = workspace(who);
    let mut child = run(
        who,
        ws.path(),
        &[],
        &[
            "sh",
            "-c",
            "trap 'echo caught; exit 5' INT; echo ready; while :; do sleep 0.05; done",
        ],
    )
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    let mut stdout = until_ready(&mut child);
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let mut rest = String::new();
    stdout.read_to_string(&mut rest).unwrap();
    assert_eq!(rest, "caught\n");
    assert_eq!(child.wait().unwrap().code(), Some(5));
}

/// A command that ignores every signal still cannot hold cordon: the first
/// SIGTERM and the first two SIGINTs are forwarded, the next one stops the
/// sandbox, and nothing of it is left running.
fn signals_repeated(who: Who) {
    for (signal, forwarded, code) in [
        (rustix::process::Signal::TERM, 1, 143),
        (rustix::process::Signal::INT, 2, 130),
    ] {
        let ws = workspace(who);
        let marker = format!("cordon-deaf-{}-{signal:?}", std::process::id());
        std::fs::write(
            ws.path().join("deaf.sh"),
            "trap 'echo got' INT TERM; echo ready; while :; do sleep 0.05; done\n",
        )
        .unwrap();
        let mut child = run(who, ws.path(), &[], &["sh", "deaf.sh", &marker])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut stdout = until_ready(&mut child);
        let pid = rustix::process::Pid::from_child(&child);
        for _ in 0..forwarded {
            rustix::process::kill_process(pid, signal).unwrap();
            let mut got = [0u8; 4];
            stdout.read_exact(&mut got).unwrap();
            assert_eq!(&got, b"got\n", "{signal:?} was not forwarded");
        }
        let start = Instant::now();
        rustix::process::kill_process(pid, signal).unwrap();
        let status = child.wait().unwrap();
        let mut stderr = String::new();
        child
            .stderr
            .take()
            .unwrap()
            .read_to_string(&mut stderr)
            .unwrap();
        assert_eq!(status.code(), Some(code), "{signal:?}: {stderr}");
        assert!(stderr.contains("cordon: stopping the sandbox"), "{stderr}");
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "{:?}",
            start.elapsed()
        );
        // A microVM's processes live inside QEMU, named by the workspace.
        let trace = match who {
            Who::Microvm => format!("path={}", ws.path().canonicalize().unwrap().display()),
            _ => marker.clone(),
        };
        let deadline = Instant::now() + Duration::from_secs(5);
        while processes_containing(&trace) > 0 && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(50));
        }
        assert_eq!(
            processes_containing(&trace),
            0,
            "the command outlived cordon"
        );
    }
}

fn doctor_reports_everything_in_force(who: Who) {
    let ws = workspace(who);
    let out = cordon(who, ws.path()).arg("doctor").output().unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("all isolation features are in force"),
        "{stdout}"
    );
    let mechanism = if who == Who::Root {
        "cgroup"
    } else {
        "rlimits"
    };
    assert!(
        stdout
            .lines()
            .any(|l| l.contains("memory and pids limits") && l.contains(mechanism)),
        "{stdout}"
    );
}

both! {
    stdout_is_byte_exact_for_5_mb_of_random_data => byte_exact;
    stdout_and_stderr_stay_apart_with_binary_and_partial_lines => streams_apart;
    stdin_is_passed_through => stdin_passes_through;
    exit_codes_follow_the_command_and_document_cordons_own => exit_codes;
    a_command_needs_no_double_dash => the_command_needs_no_double_dash;
    a_sandbox_that_cannot_be_created_gives_one_line_and_125 => sandbox_failure_is_one_line;
    a_workspace_or_bind_holding_home_is_refused => home_is_no_workspace;
    env_binds_workdir_and_tmp_size_take_effect => options_take_effect;
    network_is_off_by_default_and_loopback_on_request => network_modes;
    python_node_gcc_git_and_coreutils_work => python_node_gcc_git_run;
    killing_cordon_with_sigkill_kills_the_sandbox => host_sigkill_takes_the_sandbox_down;
    ctrl_c_reaches_the_command => interrupt_is_forwarded;
    repeated_signals_stop_a_command_that_ignores_them => signals_repeated;
    doctor_reports_every_feature_in_force => doctor_reports_everything_in_force;
    published_ports_serve_what_the_sandbox_listens_on => published_ports;
}

microvm! {
    stdout_is_byte_exact_for_5_mb_of_random_data => byte_exact;
    stdout_and_stderr_stay_apart_with_binary_and_partial_lines => streams_apart;
    stdin_is_passed_through => stdin_passes_through;
    exit_codes_follow_the_command_and_document_cordons_own => exit_codes;
    python_node_gcc_git_and_coreutils_work => python_node_gcc_git_run;
    killing_cordon_with_sigkill_kills_the_sandbox => host_sigkill_takes_the_sandbox_down;
    ctrl_c_reaches_the_command => interrupt_is_forwarded;
    repeated_signals_stop_a_command_that_ignores_them => signals_repeated;
    published_ports_serve_what_the_sandbox_listens_on => published_ports;
}

#[test]
fn out_of_memory_gives_its_own_exit_code_and_message() {
    if !available(Who::Root) {
        return;
    }
    let ws = workspace(Who::Root);
    let out = run(
        Who::Root,
        ws.path(),
        &["--memory", "64M"],
        &["python3", "-c", "x = bytearray(512 << 20)"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(122));
    let err = text(&out.stderr);
    assert!(
        err.starts_with("cordon: out of memory") && err.contains("64 MiB"),
        "{err}"
    );
}

#[test]
fn nested_cordon_explains_that_user_namespaces_are_blocked() {
    if !available(Who::Root) {
        return;
    }
    let ws = workspace(Who::Root);
    let bin = format!("{}:/opt/cordon", env!("CARGO_BIN_EXE_cordon"));
    let out = run(
        Who::Root,
        ws.path(),
        &["--ro", &bin],
        &["/opt/cordon", "run", "--", "true"],
    )
    .output()
    .unwrap();
    assert_eq!(out.status.code(), Some(125), "{}", text(&out.stderr));
    let err = text(&out.stderr);
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains("cannot create user namespaces"), "{err}");
}

#[test]
fn a_host_that_forbids_user_namespaces_is_named() {
    if !available(Who::Root) {
        return;
    }
    // user.max_user_namespaces is per user namespace: zero it in a private
    // one, so the host's own setting is untouched.
    let ws = workspace(Who::Root);
    let script = format!(
        "echo 0 > /proc/sys/user/max_user_namespaces && {bin} run -- true; echo \"run=$?\"; {bin} doctor; echo \"doctor=$?\"",
        bin = env!("CARGO_BIN_EXE_cordon")
    );
    let out = Command::new("unshare")
        .args(["--user", "--map-root-user", "sh", "-c", &script])
        .current_dir(ws.path())
        .output()
        .unwrap();
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(
        stdout.contains("run=125") && stdout.contains("doctor=1"),
        "{stdout}{stderr}"
    );
    let hint = "user.max_user_namespaces is 0; run `sysctl -w user.max_user_namespaces=15000`";
    assert_eq!(
        stderr.lines().filter(|l| l.contains(hint)).count(),
        1,
        "{stderr}"
    );
    assert!(
        stdout.contains(hint),
        "doctor must name the setting too: {stdout}"
    );
}

/// A pseudo-terminal pair for driving `cordon shell` like a person would.
struct Terminal {
    master: std::fs::File,
    seen: std::sync::Arc<std::sync::Mutex<Vec<u8>>>,
}

impl Terminal {
    fn spawn(cmd: &mut Command, rows: u16, cols: u16) -> (Terminal, std::process::Child) {
        use rustix::pty::{OpenptFlags, grantpt, openpt, ptsname, unlockpt};
        use std::os::unix::process::CommandExt;
        let master =
            openpt(OpenptFlags::RDWR | OpenptFlags::NOCTTY | OpenptFlags::CLOEXEC).unwrap();
        grantpt(&master).unwrap();
        unlockpt(&master).unwrap();
        let name = ptsname(&master, Vec::new()).unwrap();
        let slave = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(name.to_str().unwrap())
            .unwrap();
        set_size(&master, rows, cols);
        cmd.stdin(slave.try_clone().unwrap())
            .stdout(slave.try_clone().unwrap())
            .stderr(slave)
            .env("TERM", "xterm-256color");
        // SAFETY: async-signal-safe calls only.
        unsafe {
            cmd.pre_exec(|| {
                libc::setsid();
                if libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = cmd.spawn().unwrap();
        let master = std::fs::File::from(master);
        let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let mut reader = master.try_clone().unwrap();
        let sink = seen.clone();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                sink.lock().unwrap().extend_from_slice(&buf[..n]);
            }
        });
        (Terminal { master, seen }, child)
    }

    fn send(&mut self, bytes: &[u8]) {
        self.master.write_all(bytes).unwrap();
    }

    /// Waits until the screen output contains `needle` after position `from`.
    fn expect(&self, needle: &str, from: usize) -> usize {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let seen = text(&self.seen.lock().unwrap());
            if let Some(pos) = seen.get(from..).and_then(|s| s.find(needle)) {
                return from + pos + needle.len();
            }
            assert!(
                Instant::now() < deadline,
                "never saw {needle:?}; screen: {seen:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

fn set_size(fd: &impl std::os::fd::AsFd, rows: u16, cols: u16) {
    let ws = rustix::termios::Winsize {
        ws_row: rows,
        ws_col: cols,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    rustix::termios::tcsetwinsize(fd, ws).unwrap();
}

#[test]
fn shell_has_a_real_terminal_with_ctrl_c_and_resizing() {
    let who = if support::is_root() {
        Who::Root
    } else {
        Who::Unprivileged
    };
    let ws = workspace(who);
    let mut cmd = cordon(who, ws.path());
    cmd.arg("shell");
    let (mut term, mut child) = Terminal::spawn(&mut cmd, 30, 90);
    let at = term.expect("cordon", 0);
    // Arithmetic proves the shell evaluates what we type; tty proves a pty.
    term.send(b"echo $((6*7)); tty; stty size\r");
    let at = term.expect("42", at);
    let at = term.expect("/dev/pts/", at);
    let at = term.expect("30 90", at);
    // Line editing: type, erase a word with Ctrl-W, retype.
    term.send(b"echo wrong\x17right-$((1+1))\r");
    let at = term.expect("right-2", at);
    // Colours reach the terminal untouched.
    term.send(b"printf '\\033[31mred\\033[0m\\n'\r");
    let at = term.expect("\x1b[31mred\x1b[0m", at);
    // Ctrl-C interrupts the foreground child, not the shell.
    term.send(b"sleep 100; echo slept\r");
    std::thread::sleep(Duration::from_millis(300));
    term.send(b"\x03");
    term.send(b"echo after-interrupt\r");
    let at = term.expect("after-interrupt\r\n", at);
    // The typed line is echoed; its output would stand on a line of its own.
    assert!(!text(&term.seen.lock().unwrap())[..at].contains("\nslept\r\n"));
    // The window size follows the host terminal.
    set_size(&term.master, 40, 120);
    rustix::process::kill_process(
        rustix::process::Pid::from_child(&child),
        rustix::process::Signal::WINCH,
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(200));
    term.send(b"stty size\r");
    let _ = term.expect("40 120", at);
    term.send(b"exit 3\r");
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(3));
}

#[test]
fn shell_in_a_microvm_has_a_terminal_and_the_guests_kernel() {
    if !available(Who::Microvm) {
        return;
    }
    let ws = workspace(Who::Microvm);
    let mut cmd = cordon(Who::Microvm, ws.path());
    cmd.args(["shell", "--backend", "microvm"]);
    let (mut term, mut child) = Terminal::spawn(&mut cmd, 30, 90);
    let at = term.expect("cordon", 0);
    term.send(b"uname -r > kernel.txt; echo $((6*7)); tty; stty size\r");
    let at = term.expect("42", at);
    let at = term.expect("/dev/pts/", at);
    let _ = term.expect("30 90", at);
    term.send(b"exit 3\r");
    assert_eq!(child.wait().unwrap().code(), Some(3));
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let guest = std::fs::read_to_string(ws.path().join("kernel.txt")).unwrap();
    assert_ne!(guest, host);
}

#[test]
fn shell_without_a_terminal_is_refused_clearly() {
    let ws = workspace(Who::Unprivileged);
    let out = cordon(Who::Unprivileged, ws.path())
        .arg("shell")
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(125));
    assert!(
        text(&out.stderr).contains("needs a terminal"),
        "{}",
        text(&out.stderr)
    );
}

/// `cordon doctor --backend microvm` boots guests to find out what works:
/// KVM is judged by a guest actually running, not by /dev/kvm existing.
#[test]
fn doctor_probes_the_microvm_backend_by_booting_it() {
    if !available(Who::Root) {
        return;
    }
    let ws = workspace(Who::Root);
    let out = cordon(Who::Root, ws.path())
        .args(["doctor", "--backend", "microvm"])
        .output()
        .unwrap();
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let kvm = stdout
        .lines()
        .find(|l| l.contains(" kvm "))
        .unwrap_or_else(|| panic!("no kvm line: {stdout}"));
    // Either a guest ran under KVM, or the line says why not and that TCG
    // is used instead (as on this project's machines).
    assert!(
        (kvm.contains("ok") && kvm.contains("ran /bin/true"))
            || (kvm.contains("note") && kvm.ends_with("TCG is used")),
        "{kvm}"
    );
    let tcg = stdout.lines().find(|l| l.contains(" tcg ")).unwrap();
    assert!(
        tcg.contains("ok") && tcg.contains("ran its first command"),
        "{tcg}"
    );
    // The probe's answer is kept for this boot, where sandboxes find it.
    let dir = std::env::var("CORDON_VM_DIR").unwrap_or_else(|_| "/var/cache/cordon/vm".into());
    let cache = std::fs::read_to_string(format!("{dir}/accel")).unwrap();
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").unwrap();
    assert!(cache.starts_with(boot.trim()), "{cache}");
}
