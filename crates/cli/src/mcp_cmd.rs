//! `cordon mcp`: the sandbox's tools as an MCP server on stdio, and
//! `cordon mcp list`: the MCP servers cordon's agent is configured to use.

use std::collections::BTreeMap;

use clap::{Args, Subcommand};
use cordon_mcp::{McpClients, ServerSpec};

use crate::exit;
use crate::options::SandboxOpts;
use crate::settings::Settings;

#[derive(Args, Debug)]
#[command(args_conflicts_with_subcommands = true)]
pub struct McpArgs {
    #[command(subcommand)]
    pub command: Option<McpCommand>,
    /// Serve Streamable HTTP at http://ADDR/mcp instead of stdio: loopback
    /// only, behind a token (random, or CORDON_MCP_TOKEN's)
    #[arg(long, value_name = "ADDR")]
    pub listen: Option<std::net::SocketAddr>,
    /// With --listen: write the token to FILE (mode 0600) for clients
    #[arg(long, value_name = "FILE", requires = "listen")]
    pub token_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub sandbox: SandboxOpts,
}

#[derive(Subcommand, Debug)]
pub enum McpCommand {
    /// Start the configured MCP servers ([mcp_servers.NAME]) and list their tools.
    List,
}

/// The `[mcp_servers.*]` of the user's configuration and of the project's
/// when the user trusts it.
pub fn configured(settings: &Settings) -> Result<BTreeMap<String, ServerSpec>, String> {
    cordon_mcp::config::from_tables(settings.mcp_servers()).map_err(|e| e.to_string())
}

pub async fn mcp(args: McpArgs) -> i32 {
    match args.command {
        Some(McpCommand::List) => list().await,
        None => serve(args.sandbox, args.listen, args.token_file).await,
    }
}

async fn serve(
    opts: SandboxOpts,
    listen: Option<std::net::SocketAddr>,
    token_file: Option<std::path::PathBuf>,
) -> i32 {
    // No look at the workspace afterwards: an MCP server's stderr is its
    // client's log, and its sandboxes come and go with connections.
    let mut config = match opts.config().await {
        Ok((c, _)) => c,
        Err(code) => return code,
    };
    // A long-lived, multi-threaded server: exec the supervisor afresh.
    config.fork_supervisor = false;
    if !config.workspace.is_dir() {
        eprintln!(
            "cordon: the workspace {} is not a directory",
            config.workspace.display()
        );
        return exit::SANDBOX;
    }
    let Some(addr) = listen else {
        return match cordon_mcp::serve_stdio(config).await {
            Ok(()) => 0,
            Err(e) => {
                eprintln!("cordon: {e}");
                1
            }
        };
    };
    crate::mcp_listen::serve(config, addr, token_file).await
}

async fn list() -> i32 {
    let settings = match crate::options::load_settings(Vec::new()) {
        Ok(s) => s,
        Err(code) => return code,
    };
    let specs = match configured(&settings) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("cordon: {e}");
            return exit::CONFIG;
        }
    };
    if specs.is_empty() {
        println!(
            "No MCP servers are configured: add [mcp_servers.NAME] to ~/.config/cordon/config.toml or .cordon/config.toml."
        );
        return 0;
    }
    // Failures are shown in the listing below, not as they happen.
    let clients = McpClients::start(&specs, std::sync::Arc::new(|_| {})).await;
    let mut code = 0;
    for (name, spec) in &specs {
        let what = match (&spec.command, &spec.url) {
            (Some(c), _) => {
                let mut line = c.clone();
                for a in &spec.args {
                    line.push(' ');
                    line.push_str(a);
                }
                line
            }
            (_, Some(u)) => u.clone(),
            _ => String::new(),
        };
        if !spec.enabled {
            println!("{name}  ({what})  disabled");
            continue;
        }
        if let Some((_, why)) = clients.failed.iter().find(|(n, _)| n == name) {
            println!("{name}  ({what})  FAILED: {why}");
            code = 1;
            continue;
        }
        let tools: Vec<_> = clients
            .listing
            .iter()
            .filter(|(s, _, _)| s == name)
            .collect();
        println!("{name}  ({what})  {} tools", tools.len());
        for (_, tool, description) in tools {
            let first = description.lines().next().unwrap_or("");
            println!("  {}  {first}", cordon_mcp::qualified_name(name, tool));
        }
    }
    clients.shutdown().await;
    code
}
