//! Serves a scenario file until interrupted, for tests that drive the real
//! binary from outside (tmux, shell scripts). Prints the base URL on stdout.

use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use cordon_testkit::{Scenario, ScriptedServer};

#[derive(Parser)]
#[command(about = "Serve a scripted model scenario over the Anthropic and OpenAI protocols")]
struct Args {
    /// The scenario: TOML if the name ends in .toml, JSON otherwise.
    #[arg(long)]
    scenario: PathBuf,
    /// The port on 127.0.0.1; a free one when absent.
    #[arg(long, default_value_t = 0)]
    port: u16,
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let scenario = match Scenario::from_file(&args.scenario) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cordon-testkit-server: {e}");
            return ExitCode::from(2);
        }
    };
    let server =
        match ScriptedServer::try_start_on(SocketAddr::from(([127, 0, 0, 1], args.port)), scenario)
        {
            Ok(s) => s,
            Err(e) => {
                eprintln!("cordon-testkit-server: {e}");
                return ExitCode::from(2);
            }
        };
    // The URL alone on its own line, flushed, so a script can read it and go on.
    println!("{}", server.url());
    let _ = std::io::stdout().flush();

    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("cordon-testkit-server: {e}");
            return ExitCode::from(2);
        }
    };
    runtime.block_on(async {
        let _ = tokio::signal::ctrl_c().await;
    });

    let failures = server.failures();
    let remaining = server.remaining_turns();
    server.shutdown();
    for failure in &failures {
        eprintln!("failed check: {failure}");
    }
    if remaining > 0 {
        eprintln!("{remaining} scripted turn(s) were never served");
    }
    if failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}
