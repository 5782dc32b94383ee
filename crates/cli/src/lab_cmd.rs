//! `cordon lab`: JupyterLab inside a fresh sandbox over a workspace, on a
//! loopback URL with a one-time ticket; `cordon lab setup` installs the
//! pinned JupyterLab and ipykernel into cordon's cache (see `cordon_lab`),
//! which sandboxes get read-only.

use std::io::IsTerminal;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;

use clap::{Args, Subcommand};
use cordon_lab::{Site, Upstream};
use cordon_sandbox::Sandbox;
use tokio::io::AsyncBufReadExt;
use tokio::signal::unix::{SignalKind, signal};

use crate::exit;
use crate::options::SandboxOpts;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct LabArgs {
    #[command(subcommand)]
    command: Option<LabCommand>,
    #[command(flatten)]
    sandbox: SandboxOpts,
    /// Serve on this loopback port [default: a free one]
    #[arg(long)]
    port: Option<u16>,
    /// Print the URL only; do not open a browser
    #[arg(long)]
    no_browser: bool,
}

#[derive(Subcommand, Debug)]
enum LabCommand {
    /// Install the pinned JupyterLab and ipykernel from the Python
    /// registry into cordon's cache (never the system's Python); safe to
    /// run again.
    Setup,
}

/// Where the local Lab is served: the whole of its own origin.
const BASE: &str = "/";

pub async fn lab(args: LabArgs) -> i32 {
    match args.command {
        Some(LabCommand::Setup) => match install() {
            Ok(lab) => {
                println!(
                    "JupyterLab {} and ipykernel {} ready: {}",
                    lab.versions.jupyterlab,
                    lab.versions.ipykernel,
                    lab.dir.display()
                );
                0
            }
            Err(code) => code,
        },
        None => serve(args).await,
    }
}

/// Installs the environment, its progress on stderr; the exit code if it
/// failed (said on stderr).
fn install() -> Result<cordon_lab::Lab, i32> {
    let cache = cordon_lab::cache_dir();
    eprintln!("cordon lab setup: cache {}", cache.display());
    let mut progress = |line: &str| eprintln!("{line}");
    cordon_lab::setup(&cache, &mut progress).map_err(|e| {
        eprintln!("cordon: {e}");
        match e {
            cordon_lab::LabError::NoPython => exit::CONFIG,
            _ => 1,
        }
    })
}

fn fail(msg: impl std::fmt::Display) -> i32 {
    eprintln!("cordon: {msg}");
    exit::SANDBOX
}

/// Runs JupyterLab in a sandbox over the workspace until Ctrl-C.
async fn serve(args: LabArgs) -> i32 {
    // The first use installs it, as `cordon lab setup` would.
    if cordon_lab::installed(&cordon_lab::cache_dir()).is_none() {
        eprintln!("cordon: JupyterLab is not installed yet; installing it first");
        if let Err(code) = install() {
            return code;
        }
    }
    let (config, after) = match args.sandbox.config().await {
        Ok(c) => c,
        Err(code) => return code,
    };
    let workspace = config.workspace.clone();
    let sandbox = match Sandbox::create(config).await {
        Ok(s) => s,
        Err(e) => return fail(format_args!("cannot create the sandbox: {e}")),
    };
    let code = serve_in(&sandbox, &args, &workspace).await;
    sandbox.close().await;
    after.report();
    code
}

async fn serve_in(sandbox: &Sandbox, args: &LabArgs, workspace: &std::path::Path) -> i32 {
    eprintln!("cordon: starting JupyterLab in the sandbox…");
    if let Err(e) = cordon_lab::start(sandbox, BASE).await {
        return fail(e);
    }
    // Loopback only: the ticket, not the address, keeps others out, but
    // nothing beyond this machine has any business here.
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, args.port.unwrap_or(0)));
    let listener = match tokio::net::TcpListener::bind(addr)
        .await
        .and_then(|tcp| cordon_listen::Listener::new(tcp, None))
    {
        Ok(l) => l,
        Err(e) => return fail(format_args!("cannot listen on {addr}: {e}")),
    };
    let upstream = Arc::new(Upstream::new(sandbox.clone()));
    let site = match Site::serve(listener, upstream, BASE.to_string()) {
        Ok(s) => s,
        Err(e) => return fail(format_args!("cannot serve the Lab: {e}")),
    };
    let url = site.url("127.0.0.1");
    let interactive = std::io::stdin().is_terminal();
    println!("{url}");
    eprintln!(
        "cordon: JupyterLab on {} in the sandbox; the link lets one browser in, once{}. Ctrl-C stops it.",
        cordon_tools::printable(&workspace.display().to_string()),
        if interactive {
            " (Enter prints another)"
        } else {
            ""
        },
    );
    if !args.no_browser
        && wants_browser()
        && let Err(e) = open_browser(&url)
    {
        eprintln!("cordon: could not open a browser ({e}): open the link yourself");
    }
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return fail("cannot watch for Ctrl-C");
    };
    let mut lines = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    let mut reading = interactive;
    loop {
        tokio::select! {
            _ = int.recv() => break,
            _ = term.recv() => break,
            line = lines.next_line(), if reading => match line {
                Ok(Some(_)) => println!("{}", site.url("127.0.0.1")),
                _ => reading = false,
            },
        }
    }
    eprintln!("cordon: stopping JupyterLab");
    0
}

/// Opens `url` with `$BROWSER` (its first entry, as `man 1 xdg-open` and
/// Python's `webbrowser` read it) or the desktop's handler.
fn open_browser(url: &str) -> std::io::Result<()> {
    let chosen = std::env::var("BROWSER").ok();
    match chosen
        .as_deref()
        .and_then(|b| b.split(':').find(|c| !c.is_empty()))
    {
        Some(browser) => {
            let argv: Vec<String> = if browser.contains("%s") {
                browser
                    .split_whitespace()
                    .map(|w| w.replace("%s", url))
                    .collect()
            } else {
                browser
                    .split_whitespace()
                    .map(str::to_string)
                    .chain([url.to_string()])
                    .collect()
            };
            std::process::Command::new(&argv[0])
                .args(&argv[1..])
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .spawn()
                .map(drop)
        }
        None => open::that_detached(url),
    }
}

/// Whether a browser could show the page here: a graphical session, or
/// `$BROWSER` set.
fn wants_browser() -> bool {
    ["BROWSER", "DISPLAY", "WAYLAND_DISPLAY"]
        .iter()
        .any(|v| std::env::var_os(v).is_some_and(|v| !v.is_empty()))
}
