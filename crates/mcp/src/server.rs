//! cordon's tools as an MCP server: one sandbox per connection (stdio) or
//! per MCP session (Streamable HTTP), created when the first tool runs and
//! torn down, with every process in it, when the connection ends.

use std::sync::Arc;

use cordon_sandbox::{Sandbox, SandboxConfig};
use cordon_tools::{ToolContext, Toolbox};
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    InitializeRequestParams, InitializeResult, ListToolsResult, PaginatedRequestParams,
    ServerCapabilities, ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler};
use serde_json::Value;
use tokio::sync::OnceCell;

use crate::owned::{McpTenant, OwnedSessions};

const INSTRUCTIONS: &str = "cordon runs every tool inside one isolated Linux sandbox for this \
connection: the workspace is mounted read-write at /workspace, there is no network, memory and \
processes are bounded, and /tmp is scratch space. `bash` keeps one shell for the connection, so \
the working directory, variables and background processes persist between calls. File tools take \
paths relative to /workspace and refuse anything outside it.";

/// The MCP handler for one connection.
pub struct SandboxServer {
    config: SandboxConfig,
    tools: Toolbox,
    ctx: OnceCell<Result<ToolContext, String>>,
    /// Over HTTP: the tenant the session belongs to, from its first request.
    owner: std::sync::OnceLock<Option<McpTenant>>,
    /// The workspace is the handler's own, made with it (a volume while
    /// fewer than this many are mounted) and removed when the connection
    /// ends (HTTP sessions).
    own_workspace: bool,
    /// The own workspace's volume, mounted while the session lives.
    in_use: std::sync::OnceLock<cordon_sandbox::volume::InUse>,
}

impl SandboxServer {
    pub fn new(config: SandboxConfig) -> Self {
        SandboxServer {
            config,
            tools: Toolbox::standard(),
            ctx: OnceCell::new(),
            owner: std::sync::OnceLock::new(),
            own_workspace: false,
            in_use: std::sync::OnceLock::new(),
        }
    }

    /// A handler whose workspace is its own, removed when it ends: a
    /// volume where this process can make one (see
    /// `cordon_sandbox::volume`).
    pub fn ephemeral(config: SandboxConfig) -> Self {
        let mut s = SandboxServer::new(config);
        s.own_workspace = true;
        s
    }

    /// Over HTTP, a session is its first caller's: another tenant's request
    /// in it is refused as if the session did not exist.
    fn check_tenant(&self, context: &RequestContext<RoleServer>) -> Result<(), ErrorData> {
        let caller = context
            .extensions
            .get::<http::request::Parts>()
            .and_then(|p| p.extensions.get::<McpTenant>())
            .cloned();
        let owner = self.owner.get_or_init(|| caller.clone());
        if *owner == caller {
            Ok(())
        } else {
            Err(ErrorData::invalid_request("no such session", None))
        }
    }

    /// The connection's sandbox, created on first use; an error is kept
    /// and reported on every call rather than retried in a loop.
    async fn context(&self) -> Result<&ToolContext, String> {
        self.ctx
            .get_or_init(|| async {
                // A scratch workspace of the server's own is a file
                // system of its own where it can be (a real disk bound).
                let (ws, disk) = (self.config.workspace.clone(), self.config.disk);
                let own = self.own_workspace;
                let in_use = tokio::task::spawn_blocking(move || {
                    if own {
                        cordon_sandbox::volume::Volumes::default()
                            .make_workspace(&ws, disk)
                            .map(Some)
                            .map_err(|e| e.to_string())
                    } else {
                        std::fs::create_dir_all(&ws)
                            .map(|()| None)
                            .map_err(|e| e.to_string())
                    }
                })
                .await
                .unwrap_or_else(|e| Err(e.to_string()))
                .map_err(|e| {
                    format!(
                        "cannot create the workspace {}: {e}",
                        self.config.workspace.display()
                    )
                })?;
                if let Some(in_use) = in_use {
                    let _ = self.in_use.set(in_use);
                }
                let sandbox = Sandbox::create(self.config.clone())
                    .await
                    .map_err(|e| format!("cannot create the sandbox: {e}"))?;
                Ok(ToolContext::new(sandbox, &self.config.workspace))
            })
            .await
            .as_ref()
            .map_err(Clone::clone)
    }

    /// Ends the sandbox now (its processes are killed), if one was made.
    pub async fn close(&self) {
        if let Some(Ok(ctx)) = self.ctx.get() {
            ctx.sandbox.close().await;
        }
    }

    fn tool_list(&self) -> Vec<Tool> {
        self.tools
            .specs()
            .into_iter()
            .filter_map(|s| {
                let Value::Object(schema) = s.input_schema else {
                    return None;
                };
                let annotations = ToolAnnotations::new()
                    .read_only(s.read_only)
                    .destructive(!s.read_only)
                    .open_world(false);
                Some(
                    Tool::new(s.name, s.description, Arc::new(schema))
                        .with_annotations(annotations),
                )
            })
            .collect()
    }
}

impl ServerHandler for SandboxServer {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(Implementation::new("cordon", env!("CARGO_PKG_VERSION")))
            .with_instructions(INSTRUCTIONS)
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        // The session is whoever opens it: claimed here, before any other
        // request can, so a tenant holding a stolen session id gets nothing.
        self.check_tenant(&context)?;
        context.peer.set_peer_info(request.clone());
        self.negotiate_initialize(&request)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.check_tenant(&context)?;
        Ok(ListToolsResult::with_all_items(self.tool_list()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.tool_list().into_iter().find(|t| t.name == name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.check_tenant(&context)?;
        let Some(tool) = self.tools.get(&request.name).cloned() else {
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool {:?}; the tools are {}",
                    request.name,
                    self.tools.names().join(", ")
                ),
                None,
            ));
        };
        let ctx = match self.context().await {
            Ok(c) => c,
            Err(e) => return Ok(CallToolResult::error(vec![ContentBlock::text(e)]).into()),
        };
        let input = Value::Object(request.arguments.unwrap_or_default());
        // A client's cancellation stops the call; the sandbox lives on.
        let out = tokio::select! {
            _ = context.ct.cancelled() => {
                return Ok(CallToolResult::error(vec![ContentBlock::text(
                    "cancelled by the client",
                )])
                .into());
            }
            out = tool.call(ctx, input) => out,
        };
        let mut result = if out.is_error {
            CallToolResult::error(vec![ContentBlock::text(out.text)])
        } else {
            CallToolResult::success(vec![ContentBlock::text(out.text)])
        };
        // Structured results must be objects for clients before 2026-07-28.
        if let Some(v @ Value::Object(_)) = out.structured {
            result.structured_content = Some(v);
        }
        Ok(result.into())
    }
}

impl Drop for SandboxServer {
    fn drop(&mut self) {
        // The sandbox itself ends with its last handle (killing what runs
        // in it); an HTTP session's scratch workspace goes with it.
        if self.own_workspace {
            let ws = self.config.workspace.clone();
            drop(self.ctx.take());
            if let Err(e) =
                cordon_sandbox::volume::release(&ws).and_then(|()| std::fs::remove_dir_all(&ws))
                && e.kind() != std::io::ErrorKind::NotFound
            {
                tracing::warn!("cannot remove {}: {e}", ws.display());
            }
        }
    }
}

/// Who may reach an HTTP endpoint, and so what it must check itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exposure {
    /// Behind bearer tokens (`cordon serve`): any Host header, and each
    /// session's workspace is its own, removed when the session ends (a
    /// volume where the process can make one).
    Authenticated,
    /// Loopback (`cordon mcp --listen`), behind a token and an Origin
    /// check its caller makes: only localhost Host headers (no DNS
    /// rebinding), and every session works in the user's workspace, which
    /// is kept.
    Local,
}

/// The live sessions of an [`HttpService`], with their owners.
pub type HttpSessions =
    OwnedSessions<rmcp::transport::streamable_http_server::session::local::LocalSessionManager>;

/// The Streamable HTTP service as [`http_service`] makes it.
#[derive(Clone)]
pub struct HttpService(rmcp::transport::StreamableHttpService<SandboxServer, HttpSessions>);

/// As rmcp's, but a DELETE that ends a session is answered 200, not 202:
/// the SDKs take 200 (or 204) as a clean close, and the Python SDK logs
/// "Session termination failed: 202" otherwise. A POST's 202 (a
/// notification taken) stays.
impl<B, R> tower_service::Service<http::Request<B>> for HttpService
where
    rmcp::transport::StreamableHttpService<SandboxServer, HttpSessions>: tower_service::Service<
            http::Request<B>,
            Response = http::Response<R>,
            Error = std::convert::Infallible,
        >,
    <rmcp::transport::StreamableHttpService<SandboxServer, HttpSessions> as tower_service::Service<
        http::Request<B>,
    >>::Future: Send + 'static,
{
    type Response = http::Response<R>;
    type Error = std::convert::Infallible;
    type Future = futures_util::future::BoxFuture<'static, Result<http::Response<R>, Self::Error>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let delete = req.method() == http::Method::DELETE;
        let answer = self.0.call(req);
        Box::pin(async move {
            let mut r = answer.await?;
            if delete && r.status() == http::StatusCode::ACCEPTED {
                *r.status_mut() = http::StatusCode::OK;
            }
            Ok(r)
        })
    }
}

/// The Streamable HTTP service: a handler (and, on first use, a sandbox
/// from `config`) per MCP session, and the sessions with their owners.
/// Mount an `Authenticated` one behind authentication that puts an
/// [`McpTenant`] in each request and refuses (404) a request whose
/// `Mcp-Session-Id` is another tenant's, by
/// [`SessionOwners::belongs_to_another`].
///
/// [`SessionOwners::belongs_to_another`]: crate::owned::SessionOwners::belongs_to_another
pub fn http_service(
    config: impl Fn() -> SandboxConfig + Send + Sync + 'static,
    idle: std::time::Duration,
    exposure: Exposure,
) -> (HttpService, Arc<HttpSessions>) {
    use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
    let mut local = LocalSessionManager::default();
    local.session_config.keep_alive = Some(idle);
    let owners = Arc::new(crate::owned::SessionOwners::default());
    let sessions = Arc::new(OwnedSessions::new(local, owners));
    let http = match exposure {
        // Every request carries a bearer token, which a DNS-rebinding page
        // cannot supply: the Host allow-list would only refuse remote users.
        Exposure::Authenticated => {
            rmcp::transport::StreamableHttpServerConfig::default().disable_allowed_hosts()
        }
        Exposure::Local => rmcp::transport::StreamableHttpServerConfig::default(),
    };
    let service = rmcp::transport::StreamableHttpService::new(
        move || {
            Ok(match exposure {
                Exposure::Authenticated => SandboxServer::ephemeral(config()),
                Exposure::Local => SandboxServer::new(config()),
            })
        },
        sessions.clone(),
        http,
    );
    (HttpService(service), sessions)
}

/// Serves the sandbox tools on stdin/stdout, in a sandbox made from
/// `config` on first use, until the client closes the connection; then
/// ends the sandbox.
pub async fn serve_stdio(config: SandboxConfig) -> Result<(), String> {
    use rmcp::ServiceExt;
    let server = Arc::new(SandboxServer::new(config));
    let running = Handle(server.clone())
        .serve(rmcp::transport::stdio())
        .await
        .map_err(|e| format!("the MCP client did not start a session: {e}"))?;
    let reason = running.waiting().await;
    tracing::debug!(?reason, "MCP connection ended");
    server.close().await;
    Ok(())
}

/// A shared handler, so the connection's owner can close its sandbox.
struct Handle(Arc<SandboxServer>);

impl ServerHandler for Handle {
    fn get_info(&self) -> ServerConfig {
        self.0.get_info()
    }

    async fn initialize(
        &self,
        request: InitializeRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<InitializeResult, ErrorData> {
        self.0.initialize(request, context).await
    }

    async fn list_tools(
        &self,
        request: Option<PaginatedRequestParams>,
        context: RequestContext<RoleServer>,
    ) -> Result<ListToolsResult, ErrorData> {
        self.0.list_tools(request, context).await
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.0.get_tool(name)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> Result<CallToolResponse, ErrorData> {
        self.0.call_tool(request, context).await
    }
}
