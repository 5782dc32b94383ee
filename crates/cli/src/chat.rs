//! `cordon` and `cordon chat`: the full-screen terminal UI.

use std::io::IsTerminal;
use std::path::PathBuf;

use clap::{Args, ValueEnum};
use cordon_agent::{AgentConfig, sessions};
use cordon_tui::{ApprovalMode, SandboxState, Status, Worker};

use crate::exec::{Choices, config_error, setup};

#[derive(Debug, Clone, Copy, ValueEnum)]
pub enum ApprovalArg {
    /// Every tool call runs in the sandbox without asking
    Auto,
    /// Each tool call waits for you: once, always for that tool, or no
    Ask,
}

#[derive(Args, Debug)]
pub struct ChatArgs {
    /// Continue the session with this id (or a unique prefix), in its workspace
    #[arg(long, value_name = "ID", conflicts_with = "last")]
    pub resume: Option<String>,
    /// Continue the most recent session of this workspace
    #[arg(long)]
    pub last: bool,
    /// Host directory mounted at /workspace [default: SAFEDIR or the current directory]
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Model name (overrides MODEL and config files)
    #[arg(long)]
    pub model: Option<String>,
    /// anthropic or openai
    #[arg(long)]
    pub provider: Option<String>,
    /// Whether tool calls wait for your approval [default: the `approval` setting, else auto]
    #[arg(long, value_enum)]
    pub approval: Option<ApprovalArg>,
    /// Model requests allowed per message
    #[arg(long, default_value_t = 50)]
    pub max_steps: u32,
    /// Isolation backend, native or microvm (overrides `sandbox.backend`; see `cordon vm setup`)
    #[arg(long, value_name = "NAME")]
    pub backend: Option<cordon_sandbox::BackendKind>,
    /// Virtual CPUs of a microVM (overrides `sandbox.cpus`)
    #[arg(long, value_name = "N")]
    pub cpus: Option<u32>,
    /// Disk budget of the sandbox: how much the workspace may grow (overrides `sandbox.disk`)
    #[arg(long, value_name = "SIZE", value_parser = crate::options::parse_disk)]
    pub disk: Option<String>,
    /// Run the sandbox in an OCI image: a registry reference, oci:DIR[:TAG] or docker-archive:FILE (overrides `sandbox.image`; a resumed session keeps its own unless given; docs/images.md)
    #[arg(long, value_name = "REF")]
    pub image: Option<String>,
    /// Let the sandbox reach HOST[:PORT] through cordon's broker (repeatable; *.DOMAIN, IP/CIDR, or a preset: @python @node @rust @debian @git-hosting); implies --network allow (overrides `network.allow`)
    #[arg(long = "allow", value_name = "HOST")]
    pub allow: Vec<String>,
    /// Override any setting (repeatable), as `cordon config --set`
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::options::parse_setting)]
    pub set: Vec<(String, String)>,
    /// Work on a clone of URL (at REF), made on the host with your git
    /// credentials into --workspace or ./NAME, on a branch cordon/SESSION
    #[arg(long, value_name = "URL[#REF]")]
    pub repo: Option<String>,
    /// With --repo, or resuming a session that has one: let the model push
    /// and open pull requests without asking (with --approval ask each one
    /// is asked)
    #[arg(long)]
    pub allow_push: bool,
    /// The forge's API for pull requests (see `cordon exec --help`)
    #[arg(long, value_name = "URL")]
    pub forge_api: Option<String>,
}

pub async fn chat(args: ChatArgs) -> i32 {
    if !std::io::stdin().is_terminal() || !std::io::stdout().is_terminal() {
        return config_error(
            "the chat UI needs a terminal; for scripts use `cordon exec \"TASK\"`",
        );
    }
    let resume = match crate::sessions_cmd::choose_resume(
        args.resume.as_deref(),
        args.last,
        args.workspace.as_deref(),
    ) {
        Ok(r) => r,
        Err(e) => return config_error(e),
    };
    let (resumed, resume_notice, mut workspace) = (resume.resumed, resume.notice, resume.workspace);
    let (image, image_notice) =
        crate::exec::resumed_image(args.image.as_deref(), &args.set, resumed.as_ref());
    let new_id = sessions::new_id();
    let cloned = match crate::repo::for_session(
        args.repo.as_deref(),
        resumed.as_ref(),
        workspace.as_deref(),
        &new_id,
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cordon: {e}");
            return crate::exit::SANDBOX;
        }
    };
    if let Some(dir) = cloned.as_ref().and_then(|c| c.made.clone()) {
        workspace = Some(dir);
    }
    if (args.allow_push || args.forge_api.is_some()) && cloned.is_none() {
        return config_error(
            "--allow-push and --forge-api are for a session with a repository: --repo URL, or resuming one",
        );
    }
    let s = match setup(&Choices {
        model: args.model.as_deref(),
        provider: args.provider.as_deref(),
        workspace: workspace.as_deref(),
        backend: args.backend,
        cpus: args.cpus,
        disk: args.disk.as_deref(),
        image: image.as_deref(),
        allow: &args.allow,
        set: &args.set,
    })
    .await
    {
        Ok(s) => s,
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
    };
    let approval = match args.approval {
        Some(ApprovalArg::Ask) => ApprovalMode::Ask,
        Some(ApprovalArg::Auto) => ApprovalMode::Auto,
        None => match s.settings.resolved().approval {
            cordon_agent::config::ApprovalMode::Ask => ApprovalMode::Ask,
            cordon_agent::config::ApprovalMode::Auto => ApprovalMode::Auto,
        },
    };
    let mut notices: Vec<String> = s
        .notices
        .into_iter()
        .chain(resume_notice)
        .chain(image_notice)
        .collect();
    let repository = cloned.map(|clone| {
        let c = clone.cloned;
        notices.push(format!(
            "{}, on branch {}: the model commits with git_commit{}.",
            match clone.made {
                Some(_) => format!("Cloned {} into this workspace", c.url),
                None => format!("This workspace is a clone of {}", c.url),
            },
            c.branch,
            if args.allow_push || approval == ApprovalMode::Ask {
                ", pushes with git_push and opens pull requests with create_pull_request"
            } else {
                " (pushing needs --allow-push or --approval ask)"
            }
        ));
        // Asked for each call in ask mode; otherwise only if allowed.
        let repo = crate::repo::session(
            &c,
            args.allow_push || approval == ApprovalMode::Ask,
            args.forge_api.as_deref(),
        );
        // A new session takes the id its branch is named after, and its
        // log starts with the record; a resumed one has both.
        let (session_id, records) = match clone.made {
            Some(_) => (
                new_id,
                serde_json::to_value(repo.record()).into_iter().collect(),
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
        agent: AgentConfig {
            max_steps: args.max_steps,
            ..s.model.agent
        },
        sandbox: s.sandbox,
        approval,
        sessions_dir: sessions::sessions_dir(),
        resume: resumed,
        mcp,
        notices,
        config_home: cordon_agent::config::config_home(),
        repository,
        image: s.settings.resolved().sandbox.image.clone(),
        snapshot: Some(std::sync::Arc::new(|dir, upper, session, name| {
            crate::image_cmd::commit_dir(&dir, &upper, &session, name).map(|i| i.name)
        })),
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
