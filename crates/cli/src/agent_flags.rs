//! What `cordon exec`, `cordon chat` and bare `cordon` share: their
//! flags, and everything done with them before a conversation opens (the
//! session to resume, the repository to clone, the settings with the
//! flags on top, the provider and the sandbox's configuration). The front
//! ends only show what is set up here.

use std::path::{Path, PathBuf};

use clap::Args;
use cordon_agent::sessions::{self, Resumed};
use cordon_agent::{AgentConfig, ProviderConfig, ProviderKind};
use cordon_sandbox::SandboxConfig;

use crate::options::config_error;
use crate::repo::SessionClone;
use crate::settings::Settings;

/// The flags of every command that talks to the model.
#[derive(Args, Debug, Clone)]
pub struct AgentFlags {
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
    /// Model requests allowed for a task (exec) or a message (chat)
    #[arg(long, default_value_t = 50)]
    pub max_steps: u32,
    /// Work on a clone of URL (at REF: a branch, tag or commit), made on the
    /// host with your git credentials into --workspace or ./NAME, on a
    /// branch cordon/SESSION
    // Parsed by cordon, not clap: clap would echo a refused URL, token and all.
    // A resumed session's repository is recorded: --repo may name it again.
    #[arg(long, value_name = "URL[#REF]")]
    pub repo: Option<String>,
    /// With --repo, or resuming a session that has one: let the model push
    /// the session's branch (git_push) and open a pull request
    /// (create_pull_request) as you, without asking (with --approval ask,
    /// each one is asked)
    #[arg(long)]
    pub allow_push: bool,
    /// The forge's API for pull requests [default: GitHub's for github.com,
    /// else Gitea's at the repository's host]; the token comes from
    /// CORDON_FORGE_TOKEN (or GITHUB_TOKEN)
    #[arg(long, value_name = "URL")]
    pub forge_api: Option<String>,
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
    /// Serve the sandbox's PORT on this machine's loopback, for what the agent builds: PORT, HOSTPORT:PORT (0: any free one) or [ADDR:]HOSTPORT:PORT (repeatable); raises network off to loopback
    #[arg(long = "publish", short = 'p', value_name = "[HOSTPORT:]PORT")]
    pub publish: Vec<cordon_sandbox::PortForward>,
    /// work, or plan: only the read-only tools, and the model answers with a plan (in the chat, /go then carries it out)
    #[arg(long, value_name = "MODE", default_value = "work")]
    pub mode: cordon_agent::Mode,
    /// Override any setting (repeatable), as `cordon config --set`
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::options::parse_setting)]
    pub set: Vec<(String, String)>,
}

/// The user's own `AGENTS.md`, beside their configuration
/// (`$XDG_CONFIG_HOME/cordon/AGENTS.md`).
pub(crate) fn user_instructions() -> Option<PathBuf> {
    crate::settings::config_home().map(|home| home.join("cordon").join("AGENTS.md"))
}

impl Setup {
    /// The `AGENTS.md` files a conversation in this setup follows.
    pub(crate) fn instructions(&self) -> cordon_agent::Instructions {
        cordon_agent::Instructions::read(
            user_instructions().as_deref(),
            &self.workspace,
            &self.sandbox.workdir,
        )
    }
}

/// A conversation's making, up to its sandbox: what the flags chose.
pub(crate) struct Prepared {
    /// The session continued (`--resume`, `--last`).
    pub resumed: Option<Resumed>,
    /// The id a new session takes: its clone's branch is named after it.
    pub new_id: String,
    /// The session's repository: cloned now, or the resumed one's.
    pub cloned: Option<SessionClone>,
    pub setup: Setup,
    /// What the user is told before anything else, in order.
    pub notices: Vec<String>,
}

impl AgentFlags {
    /// Resolves the flags: the session to continue, its image, the
    /// repository (cloned now for `--repo`), then the settings. An error
    /// has been said; its exit status is returned.
    pub(crate) async fn prepare(&self) -> Result<Prepared, i32> {
        let resume = crate::sessions_cmd::choose_resume(
            self.resume.as_deref(),
            self.last,
            self.workspace.as_deref(),
        )
        .map_err(config_error)?;
        let mut workspace = resume.workspace;
        let resumed = resume.resumed;
        let mut notices: Vec<String> = resume.notice.into_iter().collect();
        let (image, notice) = resumed_image(self.image.as_deref(), &self.set, resumed.as_ref());
        notices.extend(notice);
        let new_id = sessions::new_id();
        let cloned = crate::repo::for_session(
            self.repo.as_deref(),
            resumed.as_ref(),
            workspace.as_deref(),
            &new_id,
        )
        .await
        .map_err(|e| {
            eprintln!("cordon: {e}");
            crate::exit::SANDBOX
        })?;
        if let Some(dir) = cloned.as_ref().and_then(|c| c.made.clone()) {
            workspace = Some(dir);
        }
        if (self.allow_push || self.forge_api.is_some()) && cloned.is_none() {
            return Err(config_error(
                "--allow-push and --forge-api are for a session with a repository: --repo URL, or resuming one",
            ));
        }
        let (setup, ignored) = setup(self, workspace.as_deref(), image.as_deref()).await?;
        notices.extend(ignored);
        Ok(Prepared {
            resumed,
            new_id,
            cloned,
            setup,
            notices,
        })
    }

    /// The agent's settings with the flags' own.
    pub(crate) fn agent(&self, base: &AgentConfig) -> AgentConfig {
        AgentConfig {
            max_steps: self.max_steps,
            ..base.clone()
        }
    }
}

pub(crate) struct Setup {
    pub settings: Settings,
    pub model: ModelSetup,
    pub workspace: PathBuf,
    pub sandbox: SandboxConfig,
    /// The look taken at the workspace once the sandbox has ended.
    pub after: crate::options::Aftercheck,
}

/// The provider and the agent's settings, shared with `cordon serve`.
pub struct ModelSetup {
    pub provider: ProviderConfig,
    pub agent: AgentConfig,
}

/// The provider and the agent's settings; an error names what is missing.
pub async fn model_setup(settings: &Settings) -> Result<ModelSetup, String> {
    let r = settings.resolved();
    let endpoint = r.endpoint();
    if r.provider == ProviderKind::Anthropic && endpoint.api_key.is_none() {
        let mut why = String::from(
            "no API key: set ANTHROPIC_API_KEY (or use an OpenAI-compatible server with OPENAI_BASE_URL)",
        );
        if settings
            .ignored()
            .iter()
            .any(|i| i.key == "ANTHROPIC_API_KEY" || i.key == "anthropic_api_key")
        {
            why.push_str(
                "; the project's key was ignored until you trust its file (`cordon trust`)",
            );
        }
        return Err(why);
    }
    let mut provider = ProviderConfig::new(r.provider, endpoint.base_url.clone());
    provider.api_key = endpoint.api_key.clone();
    // Claude's name means nothing to another server: ask it which it has.
    let model = if r.provider == ProviderKind::OpenAi
        && matches!(
            settings.source("model"),
            None | Some(crate::settings::Source::Default)
        ) {
        served_model(&provider, &r.model).await?
    } else {
        r.model.clone()
    };
    if r.web_search.is_some() && r.provider != ProviderKind::Anthropic {
        return Err(
            "web_search is the Anthropic API's own tool: an OpenAI-compatible server has none (set web_search = \"off\")"
                .into(),
        );
    }
    let agent = AgentConfig {
        max_tokens: r.max_tokens,
        context_window: r.context_window,
        compact_threshold: r.compact_threshold,
        checkpoints: r.checkpoints,
        web_search: r
            .web_search
            .map(|max_uses| cordon_agent::WebSearch { max_uses }),
        ..AgentConfig::new(model)
    };
    Ok(ModelSetup { provider, agent })
}

/// The model an OpenAI-compatible server serves, when none was chosen: its
/// only one, or an error naming them, to choose from. A server out of
/// reach gets `fallback`: its first request then says it is out of reach,
/// as any model request does.
async fn served_model(provider: &ProviderConfig, fallback: &str) -> Result<String, String> {
    let choose = "choose one with --model NAME, MODEL=NAME or `model` in the config file";
    let listed = match cordon_agent::Provider::new(provider.clone())
        .map_err(|e| e.to_string())?
        .models()
        .await
    {
        Ok(listed) => listed,
        Err(cordon_agent::ProviderError::Network { .. }) => return Ok(fallback.to_string()),
        Err(e) => {
            return Err(format!(
                "no model chosen, and the server could not say which it serves ({e}); {choose}"
            ));
        }
    };
    match listed.as_slice() {
        [one] => Ok(one.clone()),
        [] => Err(format!(
            "no model chosen, and {} lists none; {choose}",
            provider.base_url
        )),
        many => {
            const SHOWN: usize = 10;
            let mut names: Vec<String> = many
                .iter()
                .take(SHOWN)
                .map(|m| cordon_tools::printable(m))
                .collect();
            if many.len() > SHOWN {
                names.push(format!("and {} more", many.len() - SHOWN));
            }
            Err(format!(
                "no model chosen, and {} serves {}: {}; {choose}",
                provider.base_url,
                cordon_tools::plural(many.len() as u64, "model"),
                names.join(", ")
            ))
        }
    }
}

/// The image a session runs in: the one given on the command line, or
/// else a resumed session's own (its files and history were made there),
/// or else what the configuration says (`None` here); with a notice when
/// a resumed session's is taken.
fn resumed_image(
    given: Option<&str>,
    set: &[(String, String)],
    resumed: Option<&sessions::Resumed>,
) -> (Option<String>, Option<String>) {
    if given.is_some() || set.iter().any(|(k, _)| k == "sandbox.image") {
        return (given.map(str::to_string), None);
    }
    match resumed.and_then(|r| r.summary.image.clone()) {
        Some(image) => {
            let notice = format!(
                "the session ran in image {}: it continues there (--image chooses another)",
                cordon_tools::printable(&image)
            );
            (Some(image), Some(notice))
        }
        None => (None, None),
    }
}

/// The settings from every layer with the command line's on top, checked.
async fn setup(
    args: &AgentFlags,
    workspace: Option<&Path>,
    image: Option<&str>,
) -> Result<(Setup, Vec<String>), i32> {
    let mut cli = args.set.to_vec();
    if let Some(m) = &args.model {
        cli.push(("model".into(), m.clone()));
    }
    if let Some(p) = &args.provider {
        cli.push(("provider".into(), p.clone()));
    }
    if let Some(w) = workspace {
        cli.push(("workspace".into(), w.display().to_string()));
    }
    if let Some(b) = args.backend {
        cli.push(("sandbox.backend".into(), b.to_string()));
    }
    if let Some(n) = args.cpus {
        cli.push(("sandbox.cpus".into(), n.to_string()));
    }
    if let Some(d) = &args.disk {
        cli.push(("sandbox.disk".into(), d.clone()));
    }
    if let Some(i) = image {
        cli.push(("sandbox.image".into(), i.to_string()));
    }
    if !args.allow.is_empty() {
        cli.push(("network.allow".into(), args.allow.join(",")));
    }
    let settings = crate::options::quiet_settings(cli)?;
    let notices = crate::options::ignored_notice(&settings);
    let model = model_setup(&settings).await.map_err(|e| {
        for n in &notices {
            eprintln!("cordon: {n}");
        }
        config_error(e)
    })?;
    let mut sandbox = crate::options::sandbox_config(&settings).map_err(config_error)?;
    crate::options::publish(&mut sandbox, &args.publish);
    // The agent works in the workspace whatever the image's WorkingDir.
    crate::environment::apply(&mut sandbox, &settings, None)
        .await
        .map_err(config_error)?;
    // The kernel behind run_code, when `cordon lab setup` installed it.
    cordon_lab::offer(&mut sandbox);
    crate::options::guard_cordon_dirs(&mut sandbox).map_err(config_error)?;
    let setup = Setup {
        workspace: sandbox.workspace.clone(),
        after: crate::options::Aftercheck::new(&sandbox, &settings),
        settings,
        model,
        sandbox,
    };
    Ok((setup, notices))
}
