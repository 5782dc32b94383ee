//! `cordon` and `cordon chat`: the full-screen terminal UI.

use std::io::IsTerminal;

use clap::{Args, ValueEnum};
use cordon_agent::sessions;
use cordon_tui::{ApprovalMode, SandboxState, Status, Worker};

use crate::agent_flags::{AgentFlags, Prepared};
use crate::exec::config_error;

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ApprovalArg {
    /// Every tool call runs in the sandbox without asking
    Auto,
    /// Each tool call waits for you: once, always for that tool, or no
    Ask,
}

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Whether tool calls wait for your approval [default: the `approval` setting, else auto]
    #[arg(long, value_enum)]
    pub approval: Option<ApprovalArg>,
    #[command(flatten)]
    pub agent: AgentFlags,
}

pub async fn chat(args: ChatArgs) -> i32 {
    if !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
        return config_error(
            "the chat UI needs a terminal; for scripts use `cordon exec \"TASK\"`",
        );
    }
    let Prepared {
        resumed,
        new_id,
        cloned,
        setup: s,
        mut notices,
    } = match args.agent.prepare().await {
        Ok(p) => p,
        Err(code) => return code,
    };
    let mcp = match crate::mcp_cmd::configured(&s.settings) {
        Ok(m) => m,
        Err(e) => return config_error(e),
    };
    let status = Status {
        model: s.model.agent.model.clone(),
        workspace: s.workspace.display().to_string(),
        sandbox: SandboxState::Starting,
        backend: s.sandbox.backend.to_string(),
        session: None,
        usage: Default::default(),
        cost_usd: None,
        context_tokens: 0,
        context_window: s.model.agent.context_window,
        instructions: Vec::new(),
    };
    let approval = match args.approval {
        Some(ApprovalArg::Ask) => ApprovalMode::Ask,
        Some(ApprovalArg::Auto) => ApprovalMode::Auto,
        None => match s.settings.resolved().approval {
            crate::settings::ApprovalMode::Ask => ApprovalMode::Ask,
            crate::settings::ApprovalMode::Auto => ApprovalMode::Auto,
        },
    };
    let (allow_push, forge_api) = (args.agent.allow_push, args.agent.forge_api.as_deref());
    let repository = cloned.map(|clone| {
        let c = clone.cloned;
        notices.push(format!(
            "{}, on branch {}: the model commits with git_commit{}.",
            match clone.made {
                Some(_) => format!("Cloned {} into this workspace", c.url),
                None => format!("This workspace is a clone of {}", c.url),
            },
            c.branch,
            if allow_push || approval == ApprovalMode::Ask {
                ", pushes with git_push and opens pull requests with create_pull_request"
            } else {
                " (pushing needs --allow-push or --approval ask)"
            }
        ));
        // Asked for each call in ask mode; otherwise only if allowed.
        let repo = crate::repo::session(&c, allow_push || approval == ApprovalMode::Ask, forge_api);
        // A new session takes the id its branch is named after, and its
        // log starts with the record; a resumed one has both.
        let (session_id, records) = match clone.made {
            Some(_) => (
                new_id,
                vec![cordon_agent::SessionRecord::Repository(repo.record())],
            ),
            None => (String::new(), Vec::new()),
        };
        cordon_tui::Repository {
            session_id,
            records,
            tools: repo.tools(),
        }
    });
    let worker = Worker {
        provider: s.model.provider,
        agent: args.agent.agent(&s.model.agent),
        sandbox: s.sandbox,
        approval,
        sessions_dir: sessions::sessions_dir(),
        resume: resumed,
        mcp,
        notices,
        config_home: crate::settings::config_home(),
        repository,
        image: s.settings.resolved().sandbox.image.clone(),
        snapshot: Some(std::sync::Arc::new(|dir, upper, session, name| {
            crate::image_cmd::commit_dir(&dir, &upper, &session, name).map(|i| i.name)
        })),
        user_instructions: crate::agent_flags::user_instructions(),
        rules: s.settings.rules().clone(),
        hooks: cordon_agent::hooks::Hooks::new(s.settings.hooks().to_vec()),
        mode: args.agent.mode,
        pause_when_idle: s.settings.resolved().pause_when_idle,
    };
    let result = cordon_tui::run(status, worker).await;
    // The terminal is the user's again.
    s.after.report();
    match result {
        Ok(out) => {
            if let Some(id) = out.session {
                println!("Session {id} is saved: `cordon chat --resume {id}` continues it.");
            }
            0
        }
        Err(e) => {
            eprintln!("cordon: the terminal failed: {e}");
            1
        }
    }
}

/// Where the chat UI's logs go (`CORDON_LOG` sets the level): a file in
/// the data directory, or nowhere if it cannot be opened.
pub fn log_file() -> Box<dyn std::io::Write + Send> {
    let dir = sessions::sessions_dir();
    let path = dir.parent().unwrap_or(&dir).join("chat.log");
    let _ = std::fs::create_dir_all(path.parent().unwrap_or(&dir));
    match std::os::unix::fs::OpenOptionsExt::mode(
        std::fs::OpenOptions::new().create(true).append(true),
        0o600,
    )
    .open(&path)
    {
        Ok(f) => Box::new(f),
        Err(_) => Box::new(std::io::sink()),
    }
}
