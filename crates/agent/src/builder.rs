//! One way to put a conversation together, for every front end (`exec`,
//! the terminal UI, the server's agent jobs and API sessions): a provider,
//! the tools the sandbox offers (the standard ones, the computer when it
//! has a display, the configured MCP servers' tools) and, for a resumed
//! session, its history and log.
//!
//! ```text
//! let mcp = McpClients::start(&servers, report).await;
//! let agent = AgentBuilder::new(&provider, config)
//!     .tools(&mcp.tools)
//!     .log(log)
//!     .build(&sandbox, &workspace)?;
//! ```

use std::path::Path;
use std::sync::Arc;

use cordon_sandbox::Sandbox;
use cordon_tools::{Tool, ToolContext, Toolbox};
use serde_json::Value;

use crate::agent::{Agent, AgentConfig, Approver};
use crate::log::SessionLog;
use crate::provider::{Provider, ProviderConfig, ProviderError};
use crate::wire::Message;

/// Collects what an [`Agent`] is made of; [`AgentBuilder::build`] makes it.
pub struct AgentBuilder {
    provider: ProviderConfig,
    config: AgentConfig,
    extra: Vec<Arc<dyn Tool>>,
    history: Vec<Message>,
    log: Option<SessionLog<Value>>,
    approver: Option<Arc<dyn Approver>>,
}

impl AgentBuilder {
    pub fn new(provider: &ProviderConfig, config: AgentConfig) -> AgentBuilder {
        AgentBuilder {
            provider: provider.clone(),
            config,
            extra: Vec::new(),
            history: Vec::new(),
            log: None,
            approver: None,
        }
    }

    /// Tools beyond the sandbox's own: the MCP servers'.
    pub fn tools(mut self, tools: &[Arc<dyn Tool>]) -> Self {
        self.extra.extend(tools.iter().cloned());
        self
    }

    /// The conversation so far, for a resumed session.
    pub fn history(mut self, history: Vec<Message>) -> Self {
        self.history = history;
        self
    }

    /// The session log the agent records the conversation in.
    pub fn log(mut self, log: SessionLog<Value>) -> Self {
        self.log = Some(log);
        self
    }

    /// Who decides whether each tool call runs (`--approval ask`).
    pub fn approver(mut self, approver: Option<Arc<dyn Approver>>) -> Self {
        self.approver = approver;
        self
    }

    /// The agent, acting in `sandbox` over the host directory `workspace`.
    pub fn build(self, sandbox: &Sandbox, workspace: &Path) -> Result<Agent, ProviderError> {
        let provider = Provider::new(self.provider)?;
        let mut tools = Toolbox::standard();
        // The screen is the model's only with a display to show.
        if sandbox.display().is_some() {
            tools.register(cordon_tools::computer::Computer);
        }
        for t in self.extra {
            tools.register_arc(t);
        }
        let mut agent = Agent::new(
            provider,
            tools,
            ToolContext::new(sandbox.clone(), workspace),
            self.config,
        )
        .with_history(self.history);
        if let Some(log) = self.log {
            agent = agent.with_log(log);
        }
        agent.set_approver(self.approver);
        Ok(agent)
    }
}
