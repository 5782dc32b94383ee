//! Tools from other MCP servers, offered to cordon's model as
//! `mcp__SERVER__TOOL`. Each configured server is started (a command) or
//! connected to (a URL) when the agent starts; a server that fails to start
//! is reported once and left out, and one that dies mid-session is reported
//! once and its tools are no longer offered.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use cordon_tools::{Tool, ToolContext, ToolFuture, ToolOutput};
use rmcp::model::{
    CallToolRequestParams, ClientCapabilities, ClientConfig, ContentBlock, Implementation,
    ProtocolVersion,
};
use rmcp::service::{Peer, RunningService};
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::transport::{StreamableHttpClientTransport, TokioChildProcess};
use rmcp::{ClientHandler, RoleClient, ServiceError, ServiceExt};
use serde_json::Value;
use tokio::io::AsyncBufReadExt;

use crate::config::ServerSpec;

/// What a front end is told when a server fails: once per server.
pub type Report = Arc<dyn Fn(String) + Send + Sync>;

#[derive(Clone)]
struct Client;

impl ClientHandler for Client {
    fn get_info(&self) -> ClientConfig {
        ClientConfig::new(
            ClientCapabilities::default(),
            Implementation::new("cordon", env!("CARGO_PKG_VERSION")),
        )
        // Third-party servers mostly speak the initialize handshake.
        .with_protocol_version(ProtocolVersion::V_2025_11_25)
    }
}

/// One connected server.
struct Conn {
    name: String,
    peer: Peer<RoleClient>,
    alive: AtomicBool,
    reported: AtomicBool,
    report: Report,
    timeout: Duration,
}

impl Conn {
    /// Marks the server dead and tells the front end, the first time only.
    fn died(&self, why: &str) {
        self.alive.store(false, Ordering::SeqCst);
        if !self.reported.swap(true, Ordering::SeqCst) {
            tracing::warn!(server = %self.name, "MCP server stopped: {why}");
            (self.report)(format!(
                "MCP server {} stopped ({why}); the session goes on without its tools",
                self.name
            ));
        }
    }
}

/// The running servers; dropping this stops them.
pub struct McpClients {
    /// Per server: the way to stop it and the task watching it.
    services: Vec<(
        rmcp::service::RunningServiceCancellationToken,
        tokio::task::JoinHandle<()>,
    )>,
    pub tools: Vec<Arc<dyn Tool>>,
    /// Servers that failed to start, with why (already reported).
    pub failed: Vec<(String, String)>,
    /// Every server's tools as `(server, tool, description)`, for listings.
    pub listing: Vec<(String, String, String)>,
}

impl McpClients {
    /// Starts every server of `specs`, at most `startup` each, all at once.
    pub async fn start(specs: &BTreeMap<String, ServerSpec>, report: Report) -> McpClients {
        let starts = specs
            .iter()
            .filter(|(_, s)| s.enabled)
            .map(|(name, spec)| async move { (name.clone(), connect(name, spec).await) });
        let mut out = McpClients {
            services: Vec::new(),
            tools: Vec::new(),
            failed: Vec::new(),
            listing: Vec::new(),
        };
        for (name, result) in futures_util::future::join_all(starts).await {
            let spec = &specs[&name];
            match result {
                Ok((service, tools)) => {
                    let conn = Arc::new(Conn {
                        name: name.clone(),
                        peer: service.peer().clone(),
                        alive: AtomicBool::new(true),
                        reported: AtomicBool::new(false),
                        report: report.clone(),
                        timeout: Duration::from_secs(spec.tool_timeout_secs.unwrap_or(300)),
                    });
                    for t in tools {
                        out.listing.push((
                            name.clone(),
                            t.name.to_string(),
                            t.description.as_deref().unwrap_or("").to_string(),
                        ));
                        out.tools.push(Arc::new(McpTool::new(conn.clone(), &t)));
                    }
                    // Watched from here on: a server that exits is
                    // reported at once, not at its next call.
                    let stop = service.cancellation_token();
                    let watched = conn.clone();
                    let watcher = tokio::spawn(async move {
                        match service.waiting().await {
                            Ok(rmcp::service::QuitReason::Cancelled) => {}
                            Ok(_) => watched.died("it exited"),
                            Err(e) => watched.died(&e.to_string()),
                        }
                    });
                    out.services.push((stop, watcher));
                }
                Err(why) => {
                    report(format!("MCP server {name} did not start: {why}"));
                    out.failed.push((name, why));
                }
            }
        }
        out
    }

    /// Stops every server (a child gets EOF, then SIGTERM, then SIGKILL).
    pub async fn shutdown(self) {
        for (stop, watcher) in self.services {
            stop.cancel();
            let _ = tokio::time::timeout(Duration::from_secs(5), watcher).await;
        }
    }
}

type Connected = (RunningService<RoleClient, Client>, Vec<rmcp::model::Tool>);

async fn connect(name: &str, spec: &ServerSpec) -> Result<Connected, String> {
    let startup = Duration::from_secs(spec.startup_timeout_secs.unwrap_or(20));
    let attempt = async {
        let service = if let Some(url) = &spec.url {
            let mut config = StreamableHttpClientTransportConfig::with_uri(url.as_str());
            if let Some(token) = spec.bearer_token()? {
                config = config.auth_header(token);
            }
            Client
                .serve(StreamableHttpClientTransport::from_config(config))
                .await
                .map_err(|e| format!("cannot connect to {url}: {e}"))?
        } else {
            let command = spec.command.as_deref().unwrap_or_default();
            let mut cmd = tokio::process::Command::new(command);
            cmd.args(&spec.args).envs(&spec.env).kill_on_drop(true);
            let (transport, stderr) = TokioChildProcess::builder(cmd)
                .stderr(std::process::Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot run {command}: {e}"))?;
            if let Some(stderr) = stderr {
                // Its own diagnostics go to cordon's log, not the screen.
                let server = name.to_string();
                tokio::spawn(async move {
                    let mut lines = tokio::io::BufReader::new(stderr).lines();
                    while let Ok(Some(l)) = lines.next_line().await {
                        tracing::debug!(server = %server, "{l}");
                    }
                });
            }
            Client
                .serve(transport)
                .await
                .map_err(|e| format!("{command} did not complete the MCP handshake: {e}"))?
        };
        let tools = service
            .list_all_tools()
            .await
            .map_err(|e| format!("cannot list its tools: {e}"))?;
        Ok((service, tools))
    };
    tokio::time::timeout(startup, attempt)
        .await
        .map_err(|_| format!("no answer within {} s", startup.as_secs()))?
}

/// `mcp__SERVER__TOOL`, in the characters model APIs accept, at most 64.
pub fn qualified_name(server: &str, tool: &str) -> String {
    let clean = |s: &str| {
        s.chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '_' || c == '-' {
                    c
                } else {
                    '_'
                }
            })
            .collect::<String>()
    };
    let mut n = format!("mcp__{}__{}", clean(server), clean(tool));
    n.truncate(64);
    n
}

/// One tool of a connected server.
struct McpTool {
    conn: Arc<Conn>,
    name: String,
    tool: String,
    description: String,
    schema: Value,
    read_only: bool,
}

impl McpTool {
    fn new(conn: Arc<Conn>, t: &rmcp::model::Tool) -> Self {
        let description = format!(
            "{} (from the MCP server {}; it runs outside cordon's sandbox)",
            t.description.as_deref().unwrap_or("").trim(),
            conn.name
        );
        McpTool {
            name: qualified_name(&conn.name, &t.name),
            tool: t.name.to_string(),
            description,
            schema: Value::Object((*t.input_schema).clone()),
            read_only: t
                .annotations
                .as_ref()
                .and_then(|a| a.read_only_hint)
                .unwrap_or(false),
            conn,
        }
    }
}

impl Tool for McpTool {
    fn name(&self) -> &str {
        &self.name
    }

    fn description(&self) -> &str {
        &self.description
    }

    fn input_schema(&self) -> Value {
        self.schema.clone()
    }

    fn read_only(&self) -> bool {
        self.read_only
    }

    fn available(&self) -> bool {
        self.conn.alive.load(Ordering::SeqCst)
    }

    fn call<'a>(&'a self, _ctx: &'a ToolContext, input: Value) -> ToolFuture<'a> {
        Box::pin(async move {
            if !self.available() {
                return ToolOutput::error(format!(
                    "The MCP server {} has stopped; its tools are no longer available.",
                    self.conn.name
                ));
            }
            let Value::Object(args) = input else {
                return ToolOutput::error("The arguments must be a JSON object.");
            };
            let request = CallToolRequestParams::new(self.tool.clone()).with_arguments(args);
            let result =
                tokio::time::timeout(self.conn.timeout, self.conn.peer.call_tool(request)).await;
            match result {
                Err(_) => ToolOutput::error(format!(
                    "The MCP server {} did not answer within {} s.",
                    self.conn.name,
                    self.conn.timeout.as_secs()
                )),
                Ok(Err(e @ (ServiceError::TransportClosed | ServiceError::TransportSend(_)))) => {
                    self.conn.died(&e.to_string());
                    ToolOutput::error(format!(
                        "The MCP server {} has stopped ({e}); its tools are no longer available.",
                        self.conn.name
                    ))
                }
                Ok(Err(ServiceError::McpError(e))) => ToolOutput::error(format!(
                    "The MCP server {} refused the call: {}",
                    self.conn.name, e.message
                )),
                Ok(Err(e)) => ToolOutput::error(format!(
                    "The call to the MCP server {} failed: {e}",
                    self.conn.name
                )),
                Ok(Ok(r)) => {
                    let text = r
                        .content
                        .iter()
                        .map(content_text)
                        .collect::<Vec<_>>()
                        .join("\n");
                    let text = if text.is_empty() {
                        r.structured_content
                            .as_ref()
                            .map(Value::to_string)
                            .unwrap_or_default()
                    } else {
                        text
                    };
                    let out = if r.is_error == Some(true) {
                        ToolOutput::error(text)
                    } else {
                        ToolOutput::ok(text)
                    };
                    match r.structured_content {
                        Some(v) => out.with_structured(v),
                        None => out,
                    }
                }
            }
        })
    }
}

/// What the model sees of one content block.
fn content_text(c: &ContentBlock) -> String {
    match serde_json::to_value(c) {
        Ok(v) => match v.get("type").and_then(Value::as_str) {
            Some("text") => v["text"].as_str().unwrap_or("").to_string(),
            Some(kind) => format!(
                "[{kind} content{}]",
                v.get("mimeType")
                    .and_then(Value::as_str)
                    .map(|m| format!(", {m}"))
                    .unwrap_or_default()
            ),
            None => v.to_string(),
        },
        Err(_) => "[content]".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_what_model_apis_accept() {
        assert_eq!(qualified_name("files", "read"), "mcp__files__read");
        assert_eq!(
            qualified_name("my server", "do.it/now"),
            "mcp__my_server__do_it_now"
        );
        assert_eq!(qualified_name(&"s".repeat(40), &"t".repeat(40)).len(), 64);
    }
}
