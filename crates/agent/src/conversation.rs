//! A live conversation from open to close, the same for every front end
//! (`exec`, the terminal UI, the server's agent jobs and API sessions):
//! the sandbox it acts in, the configured MCP servers' tools, and the
//! agent with its history and log; and the order they end in.
//!
//! ```text
//! let mut talk = Opening::new(&provider, config)
//!     .mcp(&servers, report)
//!     .open(sandbox, &workspace, history, log)
//!     .await?;
//! talk.agent().send(prompt, &events, &cancel).await;
//! let ended = talk.close().await;
//! ```
//!
//! The rules: the system prompt is made from the sandbox itself (its
//! network as it really is), so no front end can tell the model something
//! else; the screen is the model's only with a display to show; and a
//! conversation ends with its last turn's checkpoint recorded, then its
//! log closed, then its MCP servers stopped, then (unless the caller keeps
//! it) its sandbox closed.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use cordon_mcp::{McpClients, Report, ServerSpec};
use cordon_sandbox::{DiskStop, Sandbox};
use cordon_tools::{Tool, ToolContext, Toolbox};

use crate::agent::{Agent, AgentConfig, Approver, Oversight};
use crate::instructions::{Instructions, Source};
use crate::log::SessionLog;
use crate::message::Usage;
use crate::provider::{Provider, ProviderConfig, ProviderError};
use crate::record::SessionRecord;
use crate::wire::Message;

/// What a conversation is opened with; [`Opening::open`] opens it, and
/// the conversation keeps it for the agents [`Conversation::restart`]
/// makes.
pub struct Opening {
    provider: ProviderConfig,
    config: AgentConfig,
    servers: BTreeMap<String, ServerSpec>,
    report: Option<Report>,
    tools: Vec<Arc<dyn Tool>>,
    oversight: Oversight,
    mode: crate::agent::Mode,
    instructions: Instructions,
    previews: crate::prompt::Previews,
}

impl Opening {
    /// `config.system` is replaced when the conversation opens: the
    /// prompt is made from the sandbox.
    pub fn new(provider: &ProviderConfig, config: AgentConfig) -> Opening {
        Opening {
            provider: provider.clone(),
            config,
            servers: BTreeMap::new(),
            report: None,
            tools: Vec::new(),
            oversight: Oversight::default(),
            mode: crate::agent::Mode::Work,
            instructions: Instructions::default(),
            previews: crate::prompt::Previews::Off,
        }
    }

    /// The MCP servers to start for the conversation; one that fails is
    /// told to `report` and the conversation goes on without it.
    pub fn mcp(mut self, servers: &BTreeMap<String, ServerSpec>, report: Report) -> Self {
        self.servers = servers.clone();
        self.report = Some(report);
        self
    }

    /// Tools beyond the sandbox's own and the MCP servers' (a cloned
    /// repository's git tools).
    pub fn tools(mut self, tools: &[Arc<dyn Tool>]) -> Self {
        self.tools.extend(tools.iter().cloned());
        self
    }

    /// Who decides whether each tool call runs (`--approval ask`): every
    /// call is asked of `approver`.
    pub fn approver(mut self, approver: Option<Arc<dyn Approver>>) -> Self {
        self.oversight = Oversight::asking(approver);
        self
    }

    /// Who approves calls, the command rules and the hooks.
    pub fn oversight(mut self, oversight: Oversight) -> Self {
        self.oversight = oversight;
        self
    }

    /// Working, or planning with read-only tools (`--mode plan`).
    pub fn mode(mut self, mode: crate::agent::Mode) -> Self {
        self.mode = mode;
        self
    }

    /// How whoever drives the agent opens what its servers serve on the
    /// sandbox's loopback (`cordon serve`'s previews): the prompt says so.
    pub fn previews(mut self, previews: crate::prompt::Previews) -> Self {
        self.previews = previews;
        self
    }

    /// The project instructions (`AGENTS.md`), given to the model after
    /// cordon's own prompt.
    pub fn instructions(mut self, instructions: Instructions) -> Self {
        self.instructions = instructions;
        self
    }

    /// Opens the conversation in `sandbox`, over its host directory
    /// `workspace`: `history` and `log` for a resumed session, a log
    /// alone for a new one recorded from the start. The sandbox is the
    /// conversation's from here on: closed with it, or on an error here.
    pub async fn open(
        self,
        sandbox: Sandbox,
        workspace: &Path,
        history: Vec<Message>,
        log: Option<SessionLog<SessionRecord>>,
    ) -> Result<Conversation, ProviderError> {
        let report = self.reporter();
        let mcp = McpClients::start(&self.servers, report.clone()).await;
        let context = self.session_start(&sandbox, &report).await;
        match self.agent(&sandbox, workspace, &mcp.tools, history, log, &context) {
            Ok(agent) => Ok(Conversation {
                agent,
                sandbox,
                workspace: workspace.to_path_buf(),
                mcp,
                opening: self,
            }),
            Err(e) => {
                mcp.shutdown().await;
                sandbox.close().await;
                Err(e)
            }
        }
    }

    /// Where problems starting things (an MCP server, a hook) are told.
    fn reporter(&self) -> Report {
        self.report
            .clone()
            .unwrap_or_else(|| Arc::new(|m: String| tracing::warn!("{m}")))
    }

    /// Runs the session_start hooks in `sandbox`: what they printed, for
    /// the model's context; a failed one is told to `report`.
    async fn session_start(&self, sandbox: &Sandbox, report: &Report) -> String {
        let hooks = &self.oversight.hooks;
        if !hooks.any(crate::hooks::HookEvent::SessionStart, None) {
            return String::new();
        }
        let said = hooks
            .run(sandbox, crate::hooks::HookEvent::SessionStart, None, None)
            .await;
        for f in said.failures {
            report(f);
        }
        said.said
    }

    fn agent(
        &self,
        sandbox: &Sandbox,
        workspace: &Path,
        mcp: &[Arc<dyn Tool>],
        history: Vec<Message>,
        log: Option<SessionLog<SessionRecord>>,
        context: &str,
    ) -> Result<Agent, ProviderError> {
        let provider = Provider::new(self.provider.clone())?;
        let mut tools = Toolbox::agent();
        // The screen is the model's only with a display to show.
        if sandbox.display().is_some() {
            tools.register(cordon_tools::computer::Computer);
        }
        // Web pages only where the sandbox has a way out to them.
        if matches!(
            sandbox.network_kind(),
            cordon_sandbox::Network::Allow | cordon_sandbox::Network::Full
        ) {
            tools.register(cordon_tools::web_fetch::WebFetch);
        }
        for t in mcp.iter().chain(&self.tools) {
            tools.register_arc(t.clone());
        }
        let config = AgentConfig {
            system: crate::prompt::for_sandbox(sandbox, &self.previews)
                + &self.instructions.prompt()
                + &hook_context(context),
            ..self.config.clone()
        };
        // Helpers get the tools as they are now: all but their own.
        let helpers = Arc::new(crate::task::Helpers::default());
        let task = crate::task::Task::new(
            self.provider.clone(),
            &config,
            &tools,
            self.oversight.clone(),
            helpers.clone(),
        );
        tools.register(task);
        let mut agent = Agent::new(
            provider,
            tools,
            ToolContext::new(sandbox.clone(), workspace),
            config,
        )
        .with_history(history);
        if let Some(log) = log {
            agent.set_log(log);
        }
        agent.set_oversight(self.oversight.clone());
        agent.set_mode(self.mode);
        agent.set_helpers(helpers);
        Ok(agent)
    }
}

/// A conversation in progress: see the module's doc.
pub struct Conversation {
    agent: Agent,
    sandbox: Sandbox,
    workspace: PathBuf,
    mcp: McpClients,
    opening: Opening,
}

/// What is left of a conversation once it has ended.
#[derive(Debug, Clone, Copy)]
pub struct Ended {
    /// Tokens used by its last agent.
    pub usage: Usage,
    /// Its sandbox was stopped for its disk budget.
    pub disk_stop: Option<DiskStop>,
}

impl Conversation {
    pub fn agent(&mut self) -> &mut Agent {
        &mut self.agent
    }

    pub fn sandbox(&self) -> &Sandbox {
        &self.sandbox
    }

    /// The host directory the sandbox's /workspace is.
    pub fn workspace(&self) -> &Path {
        &self.workspace
    }

    /// The project instructions the model was given.
    pub fn instructions(&self) -> &[Source] {
        self.opening.instructions.sources()
    }

    /// Names the sandbox after the session (for `cordon image commit`);
    /// a label that cannot be written only leaves that command without it.
    pub fn label(&self, session: &str) {
        if let Err(e) = self.sandbox.set_label(session) {
            tracing::warn!("cannot label the sandbox with its session: {e}");
        }
    }

    /// Working or planning, from the next request on, and in every
    /// conversation [`Conversation::restart`] begins.
    pub fn set_mode(&mut self, mode: crate::agent::Mode) {
        self.agent.set_mode(mode);
        self.opening.mode = mode;
    }

    /// The model from the next request on, and in every conversation
    /// [`Conversation::restart`] begins.
    pub fn set_model(&mut self, model: &str) {
        self.agent.config_mut().model = model.to_string();
        self.opening.config.model = model.to_string();
    }

    /// Begins another conversation in the same sandbox, with the same
    /// tools: `history` and `log` for a resumed session, none for a fresh
    /// one. The current one's last checkpoint is recorded and its log
    /// closed first, so that the next may open it again.
    pub async fn restart(
        &mut self,
        history: Vec<Message>,
        log: Option<SessionLog<SessionRecord>>,
    ) -> Result<(), ProviderError> {
        self.agent.settle().await;
        let report = self.opening.reporter();
        let context = self.opening.session_start(&self.sandbox, &report).await;
        let next = self.opening.agent(
            &self.sandbox,
            &self.workspace,
            &self.mcp.tools,
            history,
            log,
            &context,
        )?;
        // The old agent, and the lock on its log, go here.
        self.agent = next;
        Ok(())
    }

    /// Ends the conversation and leaves its sandbox running, for a caller
    /// that owns it beyond the conversation (a job's sandbox).
    pub async fn end(mut self) -> Ended {
        self.agent.settle().await;
        let usage = self.agent.usage();
        drop(self.agent);
        self.mcp.shutdown().await;
        Ended {
            usage,
            disk_stop: self.sandbox.disk_stopped(),
        }
    }

    /// Ends the conversation and closes its sandbox.
    pub async fn close(self) -> Ended {
        let sandbox = self.sandbox.clone();
        let ended = self.end().await;
        sandbox.close().await;
        ended
    }
}

/// What the session_start hooks printed, as a part of the system prompt.
fn hook_context(said: &str) -> String {
    if said.trim().is_empty() {
        return String::new();
    }
    format!(
        "\n\n# From the user's session_start hooks\n\nWhat their setup commands printed when this session began:\n\n{}",
        said.trim()
    )
}
