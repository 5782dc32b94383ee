//! `cordon`: a coding agent that can act only through a sandbox.
//!
//! The modules, in the order of [`LAYERS`], each using only those before
//! it (a test checks it): shared parts first (`exit`, `durations`,
//! `logging`, `render`, `repo`, `settings`, `environment`: the sandbox's
//! root from an image, `options`, `mcp_listen`, `sessions_cmd`'s resume
//! and `agent_flags`), then one module per command; `main` on top; and,
//! for tests only, `reference`, which makes `docs/reference/` from them.

mod agent_flags;
mod chat;
mod config_cmd;
mod doctor;
mod durations;
mod environment;
mod exec;
mod exit;
mod image_cmd;
mod lab_cmd;
mod logging;
mod mcp_cmd;
mod mcp_listen;
mod options;
#[cfg(test)]
mod reference;
mod render;
mod repo;
mod rewind_cmd;
mod run;
mod serve_cmd;
mod sessions_cmd;
mod settings;
mod trust_cmd;
mod vm_cmd;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "cordon",
    version,
    about = "A coding agent whose every action runs in a sandbox",
    args_conflicts_with_subcommands = true
)]
struct Cli {
    /// With no command, `cordon` opens the chat UI.
    #[command(subcommand)]
    command: Option<Command>,
    /// `cordon` alone is `cordon chat`, with the same options and defaults:
    /// clap parses them, so no hand-written default can drift from them.
    #[command(flatten)]
    chat: chat::ChatArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Open the full-screen chat UI (what `cordon` alone does).
    Chat(chat::ChatArgs),
    /// Run one command in a fresh sandbox.
    #[command(after_long_help = exit::run_help())]
    Run(run::RunArgs),
    /// Open an interactive shell in a fresh sandbox, on a pseudo-terminal.
    #[command(after_long_help = exit::run_help())]
    Shell(run::ShellArgs),
    /// Check which isolation features are available and in force.
    Doctor(doctor::DoctorArgs),
    /// Print the effective configuration, each value's source, secrets masked.
    Config(config_cmd::ConfigArgs),
    /// Trust the project's .cordon/config.toml and .env as they are now, so
    /// they may set MCP servers, paths, endpoints, keys and limits.
    Trust(trust_cmd::TrustArgs),
    /// Run one task with the agent, headless.
    #[command(after_long_help = exit::exec_help())]
    Exec(exec::ExecArgs),
    /// List this directory's sessions (`--all`: every one): id, start,
    /// turns, tokens, workspace, title.
    Sessions(sessions_cmd::SessionsArgs),
    /// Take a session's files and conversation back to the end of turn N
    /// (0: before the first prompt); the log keeps everything.
    Rewind(rewind_cmd::RewindArgs),
    /// Start a new session from the end of a session's turn N, with its
    /// own copy of that turn's files.
    Fork(rewind_cmd::ForkArgs),
    /// Serve the sandbox's tools over MCP on stdio (one sandbox per
    /// connection); `cordon mcp list` shows the MCP servers the agent uses.
    Mcp(mcp_cmd::McpArgs),
    /// Serve the jobs API: a persistent queue of sandboxed jobs.
    Serve(serve_cmd::ServeArgs),
    /// Run jobs from a `cordon serve`'s database (PostgreSQL), beside any
    /// number of API processes and other workers; takes `serve`'s options.
    Worker(serve_cmd::ServeArgs),
    /// Manage the server's bearer tokens.
    Token(serve_cmd::TokenArgs),
    /// Prepare the microvm backend: `cordon vm setup` fetches the guest kernel.
    Vm(vm_cmd::VmArgs),
    /// The store of OCI images: `cordon image pull REF`, `ls`, `rm`, `prune`.
    Image(image_cmd::ImageArgs),
    /// JupyterLab in a sandbox over the workspace, on a loopback URL;
    /// `cordon lab setup` installs it (and the Python kernel of `run_code`)
    /// into cordon's cache.
    Lab(lab_cmd::LabArgs),
}

fn main() {
    // Must come before anything starts a thread: the supervisor enters
    // namespaces, which only a single-threaded process may do.
    cordon_sandbox::supervisor::run_if_supervisor();

    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { exit::SANDBOX } else { 0 };
            let _ = e.print();
            std::process::exit(code);
        }
    };
    logging::init(match cli.command {
        // The UI owns the screen: logs go to a file beside the sessions.
        None | Some(Command::Chat(_)) => logging::To::File(chat::log_file()),
        // A server's log is its standard error.
        Some(Command::Serve(_) | Command::Worker(_)) => logging::To::ServerLog,
        _ => logging::To::Terminal,
    });

    let command = cli.command.unwrap_or(Command::Chat(cli.chat));
    // The server runs jobs in parallel; everything else is one task at a time.
    let mut builder = match command {
        Command::Serve(_) | Command::Worker(_) => tokio::runtime::Builder::new_multi_thread(),
        _ => tokio::runtime::Builder::new_current_thread(),
    };
    let runtime = match builder.enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("cordon: cannot start the async runtime: {e}");
            std::process::exit(exit::SANDBOX);
        }
    };
    let code = runtime.block_on(async {
        match command {
            Command::Chat(args) => chat::chat(args).await,
            Command::Run(args) => run::run(args).await,
            Command::Shell(args) => run::shell(args).await,
            Command::Doctor(args) => doctor::doctor(args).await,
            Command::Config(args) => config_cmd::config(args),
            Command::Trust(args) => trust_cmd::trust(args),
            Command::Exec(args) => exec::exec(args).await,
            Command::Sessions(args) => sessions_cmd::sessions(args),
            Command::Rewind(args) => rewind_cmd::rewind(args),
            Command::Fork(args) => rewind_cmd::fork(args),
            Command::Mcp(args) => mcp_cmd::mcp(args).await,
            Command::Serve(args) => serve_cmd::serve(args).await,
            Command::Worker(args) => serve_cmd::worker(args).await,
            Command::Token(args) => serve_cmd::token(args).await,
            Command::Vm(args) => vm_cmd::vm(args),
            Command::Image(args) => image_cmd::image(args).await,
            Command::Lab(args) => lab_cmd::lab(args).await,
        }
    });
    // Exit at once: a blocking read of our stdin may still be pending.
    std::process::exit(code);
}

/// The modules from the bottom up: each may use only those before it
/// (read by the layout test only: a binary exports nothing).
#[cfg_attr(not(test), allow(dead_code))]
const LAYERS: &[&str] = &[
    "exit",
    "durations",
    "logging",
    "render",
    "repo",
    "settings",
    "environment",
    "options",
    "mcp_listen",
    "sessions_cmd",
    "agent_flags",
    "doctor",
    "vm_cmd",
    "image_cmd",
    "rewind_cmd",
    "trust_cmd",
    "config_cmd",
    "lab_cmd",
    "run",
    "mcp_cmd",
    "exec",
    "chat",
    "serve_cmd",
    "reference",
];

#[cfg(test)]
mod layout {
    cordon_testkit::layering_test!(super::LAYERS);
}
