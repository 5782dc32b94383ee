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
    Chat(Lazy<chat::ChatArgs>),
    /// Run one command in a fresh sandbox.
    #[command(after_long_help = exit::run_help())]
    Run(Lazy<run::RunArgs>),
    /// Open an interactive shell in a fresh sandbox, on a pseudo-terminal.
    #[command(after_long_help = exit::run_help())]
    Shell(Lazy<run::ShellArgs>),
    /// Check which isolation features are available and in force.
    Doctor(Lazy<doctor::DoctorArgs>),
    /// Print the effective configuration, each value's source, secrets masked.
    Config(Lazy<config_cmd::ConfigArgs>),
    /// Trust the project's .cordon/config.toml and .env as they are now, so
    /// they may set MCP servers, paths, endpoints, keys and limits.
    Trust(Lazy<trust_cmd::TrustArgs>),
    /// Run one task with the agent, headless.
    #[command(after_long_help = exit::exec_help())]
    Exec(Lazy<exec::ExecArgs>),
    /// List this directory's sessions (`--all`: every one): id, start,
    /// turns, tokens, workspace, title.
    Sessions(Lazy<sessions_cmd::SessionsArgs>),
    /// Take a session's files and conversation back to the end of turn N
    /// (0: before the first prompt); the log keeps everything.
    Rewind(Lazy<rewind_cmd::RewindArgs>),
    /// Start a new session from the end of a session's turn N, with its
    /// own copy of that turn's files.
    Fork(Lazy<rewind_cmd::ForkArgs>),
    /// Serve the sandbox's tools over MCP on stdio (one sandbox per
    /// connection); `cordon mcp list` shows the MCP servers the agent uses.
    Mcp(Lazy<mcp_cmd::McpArgs>),
    /// Serve the jobs API: a persistent queue of sandboxed jobs.
    Serve(Lazy<serve_cmd::ServeArgs>),
    /// Run jobs from a `cordon serve`'s database (PostgreSQL), beside any
    /// number of API processes and other workers; takes `serve`'s options.
    Worker(Lazy<serve_cmd::ServeArgs>),
    /// Manage the server's bearer tokens.
    Token(Lazy<serve_cmd::TokenArgs>),
    /// Prepare the microvm backend: `cordon vm setup` fetches the guest kernel.
    Vm(Lazy<vm_cmd::VmArgs>),
    /// The store of OCI images: `cordon image pull REF`, `ls`, `rm`, `prune`.
    Image(Lazy<image_cmd::ImageArgs>),
    /// JupyterLab in a sandbox over the workspace, on a loopback URL;
    /// `cordon lab setup` installs it (and the Python kernel of `run_code`)
    /// into cordon's cache.
    Lab(Lazy<lab_cmd::LabArgs>),
}

/// A command's arguments, defined only when that command is the one parsed.
///
/// Clap's derive builds every argument of every command before it parses
/// one; a cold `cordon run` spent more instructions there than in creating
/// its sandbox. `Command::defer` builds a subcommand's arguments when the
/// parser (or `--help`, or `Command::build`) enters it; the help listing of
/// commands needs only their names and abouts, which stay eager.
struct Lazy<T>(T);

impl<T: clap::FromArgMatches> clap::FromArgMatches for Lazy<T> {
    fn from_arg_matches(matches: &clap::ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches(matches).map(Lazy)
    }
    fn from_arg_matches_mut(matches: &mut clap::ArgMatches) -> Result<Self, clap::Error> {
        T::from_arg_matches_mut(matches).map(Lazy)
    }
    fn update_from_arg_matches(&mut self, matches: &clap::ArgMatches) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches(matches)
    }
    fn update_from_arg_matches_mut(
        &mut self,
        matches: &mut clap::ArgMatches,
    ) -> Result<(), clap::Error> {
        self.0.update_from_arg_matches_mut(matches)
    }
}

impl<T: clap::Args> clap::Args for Lazy<T> {
    fn augment_args(cmd: clap::Command) -> clap::Command {
        cmd.defer(|cmd| keep_texts(cmd, T::augment_args))
    }
    fn augment_args_for_update(cmd: clap::Command) -> clap::Command {
        cmd.defer(|cmd| keep_texts(cmd, T::augment_args_for_update))
    }
    fn group_id() -> Option<clap::Id> {
        T::group_id()
    }
}

/// Adds the arguments, keeping the texts the command itself set: eagerly
/// they came after the arguments' own (a flattened struct's doc comment
/// sets an about), so theirs must not win now that they come last.
fn keep_texts(cmd: clap::Command, augment: fn(clap::Command) -> clap::Command) -> clap::Command {
    let about = cmd.get_about().cloned();
    let long_about = cmd.get_long_about().cloned();
    let after_help = cmd.get_after_help().cloned();
    let after_long_help = cmd.get_after_long_help().cloned();
    let before_help = cmd.get_before_help().cloned();
    let before_long_help = cmd.get_before_long_help().cloned();
    let mut cmd = augment(cmd);
    if let Some(about) = about {
        // A command's doc comment sets both, clearing a long about it has none of.
        cmd = cmd.about(about);
        cmd = match long_about {
            Some(long) => cmd.long_about(long),
            None => cmd.long_about(None),
        };
    }
    if let Some(text) = after_help {
        cmd = cmd.after_help(text);
    }
    if let Some(text) = after_long_help {
        cmd = cmd.after_long_help(text);
    }
    if let Some(text) = before_help {
        cmd = cmd.before_help(text);
    }
    if let Some(text) = before_long_help {
        cmd = cmd.before_long_help(text);
    }
    cmd
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

    let command = cli.command.unwrap_or(Command::Chat(Lazy(cli.chat)));
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
            Command::Chat(Lazy(args)) => chat::chat(args).await,
            Command::Run(Lazy(args)) => run::run(args).await,
            Command::Shell(Lazy(args)) => run::shell(args).await,
            Command::Doctor(Lazy(args)) => doctor::doctor(args).await,
            Command::Config(Lazy(args)) => config_cmd::config(args),
            Command::Trust(Lazy(args)) => trust_cmd::trust(args),
            Command::Exec(Lazy(args)) => exec::exec(args).await,
            Command::Sessions(Lazy(args)) => sessions_cmd::sessions(args),
            Command::Rewind(Lazy(args)) => rewind_cmd::rewind(args),
            Command::Fork(Lazy(args)) => rewind_cmd::fork(args),
            Command::Mcp(Lazy(args)) => mcp_cmd::mcp(args).await,
            Command::Serve(Lazy(args)) => serve_cmd::serve(args).await,
            Command::Worker(Lazy(args)) => serve_cmd::worker(args).await,
            Command::Token(Lazy(args)) => serve_cmd::token(args).await,
            Command::Vm(Lazy(args)) => vm_cmd::vm(args),
            Command::Image(Lazy(args)) => image_cmd::image(args).await,
            Command::Lab(Lazy(args)) => lab_cmd::lab(args).await,
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

#[cfg(test)]
mod tests {
    use clap::CommandFactory;

    #[test]
    fn commands_define_their_arguments_only_when_entered() {
        let cmd = super::Cli::command();
        let run = cmd.find_subcommand("run").expect("a run command");
        assert_eq!(
            run.get_arguments().count(),
            0,
            "run's arguments were built eagerly"
        );
        assert_eq!(
            run.get_about().map(ToString::to_string).as_deref(),
            Some("Run one command in a fresh sandbox")
        );
        // Entering it defines them, with the command's own texts kept (the
        // reference test compares every command's whole help).
        let mut cmd = cmd;
        cmd.build();
        let run = cmd.find_subcommand("run").expect("a run command");
        assert!(run.get_arguments().any(|a| a.get_id() == "timeout"));
        assert_eq!(
            run.get_about().map(ToString::to_string).as_deref(),
            Some("Run one command in a fresh sandbox")
        );
    }
}
