//! `cordon run` and `cordon shell`.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::time::Duration;

use clap::Args;
use cordon_sandbox::{
    DiskStop, Error, ExecEvent, ExecRequest, ExecResult, Execution, ExitStatus, Sandbox, SpawnStage,
};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::signal::unix::{SignalKind, signal};

use crate::durations::parse_timeout;
use crate::exit;
use crate::options::SandboxOpts;

#[derive(Args, Debug)]
pub struct RunArgs {
    #[command(flatten)]
    pub sandbox: SandboxOpts,
    /// Kill the command after this long (e.g. 30s, 5m) [default: none]
    #[arg(long, value_parser = parse_timeout)]
    pub timeout: Option<Duration>,
    /// The command and its arguments: everything from the first word that
    /// is not an option (`--` before it also works)
    #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

#[derive(Args, Debug)]
pub struct ShellArgs {
    #[command(flatten)]
    pub sandbox: SandboxOpts,
    /// The shell to run [default: /bin/bash -i; in an image without bash, its sh]
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub command: Vec<OsString>,
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("cordon: {msg}");
    exit::SANDBOX
}

/// The limits a finished command's message names.
#[derive(Clone, Copy)]
struct Limits {
    memory: u64,
    disk: Option<u64>,
}

/// A sandbox as `run` and `shell` start it: the session, the limits its
/// messages name, and the look taken at the workspace when it ends.
struct Started {
    sandbox: Sandbox,
    limits: Limits,
    after: crate::options::Aftercheck,
    /// Whether the root is an image's.
    image: bool,
}

/// The sandbox of `opts` and the settings, and its limits (for the
/// messages that say which one a command ran into).
async fn create(opts: &SandboxOpts) -> Result<Started, i32> {
    let (config, after) = opts.config().await?;
    let limits = Limits {
        memory: config.memory.unwrap_or(512 * cordon_sandbox::MIB),
        disk: config.disk,
    };
    let image = config.image.is_some();
    let sandbox = Sandbox::create(config)
        .await
        .map_err(|e| fail(format_args!("cannot create the sandbox: {e}")))?;
    for (addr, port) in sandbox.forwards() {
        eprintln!("cordon: {}", cordon_sandbox::forwarded(addr, port));
    }
    Ok(Started {
        sandbox,
        limits,
        after,
        image,
    })
}

/// Says that the sandbox outgrew its disk budget; the exit code.
pub(crate) fn disk_stopped(stop: Option<DiskStop>) -> i32 {
    match stop {
        Some(s) => eprintln!(
            "cordon: disk budget exceeded: the workspace grew by {} MiB, past its {} MiB budget, and the sandbox was stopped (free space, or raise it with --disk)",
            s.growth.div_ceil(cordon_sandbox::MIB),
            s.budget / cordon_sandbox::MIB
        ),
        None => eprintln!("cordon: disk budget exceeded; the sandbox was stopped"),
    }
    exit::DISK
}

fn exec_error(e: Error) -> i32 {
    match &e {
        Error::DiskBudget(stop) => disk_stopped(Some(*stop)),
        Error::Exec {
            stage: SpawnStage::Program,
            errno,
            ..
        } => {
            eprintln!("cordon: {e}");
            if *errno == libc::ENOENT {
                exit::NOT_FOUND
            } else {
                exit::NOT_EXECUTABLE
            }
        }
        _ => fail(e),
    }
}

/// Maps a finished command to cordon's exit code, explaining cordon's own.
fn finish(
    result: &ExecResult,
    limits: Limits,
    timeout: Option<Duration>,
    sandbox: &Sandbox,
) -> i32 {
    if result.disk_exceeded {
        return disk_stopped(sandbox.disk_stopped());
    }
    if result.timed_out {
        let t = timeout
            .map(|t| humantime::format_duration(t).to_string())
            .unwrap_or_default();
        eprintln!("cordon: timed out after {t}; the command was killed");
        return exit::TIMEOUT;
    }
    if result.oom_killed {
        eprintln!(
            "cordon: out of memory: the sandbox exceeded its {} MiB limit and a process was killed (raise it with --memory)",
            limits.memory / cordon_sandbox::MIB
        );
        return exit::OOM;
    }
    // The disk budget is also every file's size limit (RLIMIT_FSIZE): a
    // write past it kills the writer with SIGXFSZ while the sandbox lives
    // on. The command's own status stays (it may have lowered the limit
    // itself); the message says which limit cordon set.
    if let (ExitStatus::Signal(libc::SIGXFSZ), Some(disk)) = (result.status, limits.disk) {
        eprintln!(
            "cordon: killed by SIGXFSZ: a file reached the largest size the sandbox may write, its {} MiB disk budget (raise it with --disk)",
            disk.div_ceil(cordon_sandbox::MIB)
        );
    }
    result.status.code()
}

/// Says on stderr, as it happens, each connection the network broker
/// refused or could not make (each host and port once), so that a command
/// that fails for want of network says why. Stops when dropped.
fn report_network(sandbox: &Sandbox, eol: &'static str) -> Option<AbortOnDrop> {
    let net = sandbox.network()?;
    for w in &net.warnings {
        eprint!(
            "cordon: network policy: {}{eol}",
            cordon_tools::printable(w)
        );
    }
    let mut refusals = net.refusals(usize::MAX);
    let task = tokio::spawn(async move {
        while let Some(e) = refusals.next().await {
            eprint!("cordon: {}{eol}", cordon_tools::printable(&e.message));
        }
    });
    Some(AbortOnDrop(task))
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Forwards our stdin to the command until EOF.
fn pump_stdin(exec: &Execution) {
    let stdin = exec.stdin();
    tokio::spawn(async move {
        let mut input = tokio::io::stdin();
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match input.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if stdin.write(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
        let _ = stdin.close();
    });
}

pub async fn run(args: RunArgs) -> i32 {
    let Started {
        sandbox,
        limits,
        after,
        ..
    } = match create(&args.sandbox).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let _net = report_network(&sandbox, "\n");
    let mut req = ExecRequest::argv(args.command.clone()).stream_stdin();
    req.timeout = args.timeout;
    let code = match sandbox.exec_stream(req).await {
        Ok(exec) => forward(exec, &sandbox, limits, args.timeout, false).await,
        Err(e) => exec_error(e),
    };
    sandbox.close().await;
    after.report();
    code
}

/// Relays a running command's output and our signals until it exits.
/// With a pty everything arrives as stdout, the window size is followed, and
/// SIGTERM becomes SIGHUP (an interactive shell ignores SIGTERM).
///
/// A command may ignore the signals it is sent, and a sandbox may stop
/// serving; the user must still be able to stop cordon. So a second SIGTERM
/// or SIGHUP, or a third SIGINT, stops waiting: the caller then closes the
/// sandbox, which kills everything in it.
async fn forward(
    mut exec: Execution,
    sandbox: &Sandbox,
    limits: Limits,
    timeout: Option<Duration>,
    pty: bool,
) -> i32 {
    pump_stdin(&exec);
    let mut out = tokio::io::stdout();
    let mut err = tokio::io::stderr();
    let (Ok(mut int), Ok(mut term), Ok(mut hup), Ok(mut winch)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
        signal(SignalKind::hangup()),
        signal(SignalKind::window_change()),
    ) else {
        return fail("cannot install signal handlers");
    };
    let on_term = if pty { libc::SIGHUP } else { libc::SIGTERM };
    let (mut ints, mut terms) = (0, 0);
    let give_up = |signal: i32| {
        eprintln!("cordon: stopping the sandbox");
        128 + signal
    };
    loop {
        tokio::select! {
            ev = exec.next() => {
                let ev = match ev {
                    Some(Ok(ev)) => ev,
                    Some(Err(Error::DiskBudget(stop))) => return disk_stopped(Some(stop)),
                    Some(Err(e)) => return fail(format_args!("the sandbox failed: {e}")),
                    None => return fail("the sandbox ended without a result"),
                };
                let written = match ev {
                    ExecEvent::Stdout(d) => write_all(&mut out, &d).await,
                    ExecEvent::Stderr(d) => write_all(&mut err, &d).await,
                    ExecEvent::Exit(r) => return finish(&r, limits, timeout, sandbox),
                };
                if written.is_err() {
                    // Our reader went away (e.g. `| head`): behave as a
                    // process killed by SIGPIPE would.
                    let _ = exec.signal(libc::SIGPIPE);
                    return 128 + libc::SIGPIPE;
                }
            }
            _ = int.recv() => {
                ints += 1;
                if ints >= 3 {
                    return give_up(libc::SIGINT);
                }
                let _ = exec.signal(libc::SIGINT);
            }
            _ = term.recv() => {
                terms += 1;
                if terms >= 2 {
                    return give_up(libc::SIGTERM);
                }
                let _ = exec.signal(on_term);
            }
            _ = hup.recv() => {
                terms += 1;
                if terms >= 2 {
                    return give_up(libc::SIGHUP);
                }
                let _ = exec.signal(libc::SIGHUP);
            }
            _ = winch.recv(), if pty => {
                let (rows, cols) = terminal_size();
                let _ = exec.resize(rows, cols);
            }
        }
    }
}

async fn write_all<W: tokio::io::AsyncWrite + Unpin>(
    w: &mut W,
    data: &[u8],
) -> std::io::Result<()> {
    w.write_all(data).await?;
    w.flush().await
}

/// Puts the terminal in raw mode and restores it when dropped.
struct RawMode {
    saved: rustix::termios::Termios,
}

impl RawMode {
    fn enter() -> std::io::Result<RawMode> {
        let stdin = std::io::stdin();
        let saved = rustix::termios::tcgetattr(&stdin)?;
        let mut raw = saved.clone();
        raw.make_raw();
        rustix::termios::tcsetattr(&stdin, rustix::termios::OptionalActions::Flush, &raw)?;
        Ok(RawMode { saved })
    }
}

impl Drop for RawMode {
    fn drop(&mut self) {
        let _ = rustix::termios::tcsetattr(
            std::io::stdin(),
            rustix::termios::OptionalActions::Flush,
            &self.saved,
        );
    }
}

fn terminal_size() -> (u16, u16) {
    rustix::termios::tcgetwinsize(std::io::stdout())
        .or_else(|_| rustix::termios::tcgetwinsize(std::io::stdin()))
        .ok()
        .filter(|w| w.ws_row > 0 && w.ws_col > 0)
        .map_or((24, 80), |w| (w.ws_row, w.ws_col))
}

pub async fn shell(args: ShellArgs) -> i32 {
    if !std::io::stdin().is_terminal() {
        return fail(
            "`cordon shell` needs a terminal on stdin; use `cordon run -- CMD` for non-interactive commands",
        );
    }
    let Started {
        sandbox,
        limits,
        after,
        image,
    } = match create(&args.sandbox).await {
        Ok(s) => s,
        Err(code) => return code,
    };
    let argv = if args.command.is_empty() && image {
        // An image may have no bash (Alpine, busybox): its sh then.
        [
            "/bin/sh",
            "-c",
            "if command -v bash >/dev/null; then exec bash -i; else exec sh -i; fi",
        ]
        .map(OsString::from)
        .to_vec()
    } else if args.command.is_empty() {
        vec![OsString::from("/bin/bash"), OsString::from("-i")]
    } else {
        args.command.clone()
    };
    // The terminal is raw while the shell runs: lines end in CR LF.
    let _net = report_network(&sandbox, "\r\n");
    let (rows, cols) = terminal_size();
    let mut req = ExecRequest::argv(argv).stream_stdin().pty(rows, cols);
    let term = std::env::var("TERM")
        .ok()
        .filter(|t| !t.is_empty() && !t.contains('\0'));
    req = req.env("TERM", term.unwrap_or_else(|| "xterm-256color".into()));
    if let Ok(colorterm) = std::env::var("COLORTERM") {
        req = req.env("COLORTERM", colorterm);
    }
    req = req.env("PS1", r"\[\e[1;36m\]cordon\[\e[0m\]:\w\$ ");
    let code = match sandbox.exec_stream(req).await {
        Ok(exec) => {
            let raw = RawMode::enter();
            let code = forward(exec, &sandbox, limits, None, true).await;
            drop(raw);
            code
        }
        Err(e) => exec_error(e),
    };
    sandbox.close().await;
    after.report();
    code
}
