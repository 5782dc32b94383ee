//! `cordon exec "PROMPT"`: one task, headless. The answer streams to
//! stdout, progress (tool calls and abbreviated results) to stderr; with
//! `--json`, every event is one JSON object per line on stdout.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use cordon_agent::config::Settings;
use cordon_agent::events::{EventSink, pump};
use cordon_agent::sessions;
use cordon_agent::{
    AgentBuilder, AgentConfig, AgentError, Cancel, ProviderConfig, ProviderKind, SessionLog,
    StopReason,
};
use cordon_sandbox::{Sandbox, SandboxConfig};
use tokio::sync::mpsc;

use crate::exit;

#[derive(Args, Debug)]
pub struct ExecArgs {
    /// The task; `-` reads it from stdin
    #[arg(value_name = "PROMPT")]
    pub prompt: String,
    /// Print every event as a JSON object per line (see docs/exec-json.md)
    #[arg(long)]
    pub json: bool,
    /// Also write the final message to FILE
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Model name (overrides MODEL and config files)
    #[arg(long)]
    pub model: Option<String>,
    /// anthropic or openai
    #[arg(long)]
    pub provider: Option<String>,
    /// Host directory mounted at /workspace [default: SAFEDIR or the current directory]
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
    /// Model requests allowed for the task
    #[arg(long, default_value_t = 50)]
    pub max_steps: u32,
    /// Continue the session with this id (or a unique prefix), in its workspace
    #[arg(long, value_name = "ID", conflicts_with = "last")]
    pub resume: Option<String>,
    /// Continue the most recent session of this workspace
    #[arg(long)]
    pub last: bool,
    /// Work on a clone of URL (at REF: a branch, tag or commit), made on the
    /// host with your git credentials into --workspace or ./NAME, on a
    /// branch cordon/SESSION
    // Parsed by cordon, not clap: clap would echo a refused URL, token and all.
    // A resumed session's repository is recorded: --repo may name it again.
    #[arg(long, value_name = "URL[#REF]")]
    pub repo: Option<String>,
    /// With --repo, or resuming a session that has one: let the model push
    /// the session's branch (git_push) and open a pull request
    /// (create_pull_request) as you, without asking
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
    /// Override any setting (repeatable), as `cordon config --set`
    #[arg(long = "set", value_name = "KEY=VALUE", value_parser = crate::options::parse_setting)]
    pub set: Vec<(String, String)>,
}

/// Exit status when the model could not complete the task.
pub const MODEL_ERROR: i32 = 1;

pub(crate) use crate::options::config_error;

pub(crate) struct Setup {
    pub settings: Settings,
    pub model: ModelSetup,
    pub workspace: PathBuf,
    pub sandbox: SandboxConfig,
    /// What the configuration ignored, for the front end to show.
    pub notices: Vec<String>,
    /// The look taken at the workspace once the sandbox has ended.
    pub after: crate::options::Aftercheck,
}

/// What `exec` and `chat` share on their command lines.
pub(crate) struct Choices<'a> {
    pub model: Option<&'a str>,
    pub provider: Option<&'a str>,
    pub workspace: Option<&'a std::path::Path>,
    pub backend: Option<cordon_sandbox::BackendKind>,
    pub cpus: Option<u32>,
    pub disk: Option<&'a str>,
    pub image: Option<&'a str>,
    pub allow: &'a [String],
    pub set: &'a [(String, String)],
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
            None | Some(cordon_agent::config::Source::Default)
        ) {
        served_model(&provider, &r.model).await?
    } else {
        r.model.clone()
    };
    let agent = AgentConfig {
        system: cordon_agent::prompt::system(r.sandbox.network, &r.sandbox.allow),
        max_tokens: r.max_tokens,
        context_window: r.context_window,
        compact_threshold: r.compact_threshold,
        checkpoints: r.checkpoints,
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
pub(crate) fn resumed_image(
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
pub(crate) async fn setup(args: &Choices<'_>) -> Result<Setup, i32> {
    let mut cli = args.set.to_vec();
    if let Some(m) = args.model {
        cli.push(("model".into(), m.to_string()));
    }
    if let Some(p) = args.provider {
        cli.push(("provider".into(), p.to_string()));
    }
    if let Some(w) = args.workspace {
        cli.push(("workspace".into(), w.display().to_string()));
    }
    if let Some(b) = args.backend {
        cli.push(("sandbox.backend".into(), b.to_string()));
    }
    if let Some(n) = args.cpus {
        cli.push(("sandbox.cpus".into(), n.to_string()));
    }
    if let Some(d) = args.disk {
        cli.push(("sandbox.disk".into(), d.to_string()));
    }
    if let Some(i) = args.image {
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
    // The agent works in the workspace whatever the image's WorkingDir.
    crate::image_cmd::apply(&mut sandbox, &settings, None)
        .await
        .map_err(config_error)?;
    // The kernel behind run_code, when `cordon lab setup` installed it.
    cordon_lab::offer(&mut sandbox);
    crate::options::guard_cordon_dirs(&mut sandbox).map_err(config_error)?;
    Ok(Setup {
        workspace: sandbox.workspace.clone(),
        after: crate::options::Aftercheck::new(&sandbox, &settings),
        settings,
        model,
        sandbox,
        notices,
    })
}

fn read_prompt(arg: &str) -> Result<String, i32> {
    if arg != "-" {
        return Ok(arg.to_string());
    }
    let mut s = String::new();
    std::io::stdin()
        .read_to_string(&mut s)
        .map_err(|e| config_error(format_args!("cannot read the prompt from stdin: {e}")))?;
    Ok(s)
}

/// Writes `-o FILE`. A path in the workspace is one the sandbox could
/// have planted a link at (`last-message.txt -> ~/.bashrc`): it is written
/// beneath the workspace, no link out of it followed. Elsewhere the file
/// itself must not be a link.
fn write_output(path: &Path, workspace: &Path, text: &str) -> Result<(), String> {
    let abs = std::path::absolute(path).map_err(|e| e.to_string())?;
    // Lexically, so that a planted directory link cannot take the path out
    // of the workspace before it is checked.
    let roots = [
        std::path::absolute(workspace).ok(),
        workspace.canonicalize().ok(),
    ];
    for root in roots.iter().flatten() {
        if let Ok(rel) = abs.strip_prefix(root) {
            let ws = cordon_tools::Workspace::open(root).map_err(|e| e.to_string())?;
            let rel =
                cordon_tools::WsPath::parse(&rel.to_string_lossy()).map_err(|e| e.to_string())?;
            return ws.write(&rel, text.as_bytes()).map(|_| ()).map_err(|e| {
                format!("{e} (it is in the workspace, where a sandbox could have put a link)")
            });
        }
    }
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&abs)
        .map_err(|e| e.to_string())?;
    f.write_all(text.as_bytes()).map_err(|e| e.to_string())
}

pub async fn exec(args: ExecArgs) -> i32 {
    let prompt = match read_prompt(&args.prompt) {
        Ok(p) if !p.trim().is_empty() => p,
        Ok(_) => return config_error("the prompt is empty"),
        Err(code) => return code,
    };
    let resume = match crate::sessions_cmd::choose_resume(
        args.resume.as_deref(),
        args.last,
        args.workspace.as_deref(),
    ) {
        Ok(r) => r,
        Err(e) => return config_error(e),
    };
    let mut args = args;
    args.workspace = resume.workspace;
    let resumed = resume.resumed;
    if let Some(n) = resume.notice {
        eprintln!("cordon: {n}");
    }
    let (image, notice) = resumed_image(args.image.as_deref(), &args.set, resumed.as_ref());
    if let Some(n) = notice {
        eprintln!("cordon: {n}");
    }
    // A new session's id, known before its repository is cloned: the
    // clone's branch is named after it.
    let new_id = sessions::new_id();
    let cloned = match crate::repo::for_session(
        args.repo.as_deref(),
        resumed.as_ref(),
        args.workspace.as_deref(),
        &new_id,
    )
    .await
    {
        Ok(c) => c,
        Err(e) => {
            eprintln!("cordon: {e}");
            return exit::SANDBOX;
        }
    };
    if let Some(c) = &cloned
        && let Some(dir) = &c.made
    {
        eprintln!(
            "cordon: cloned {} into {} on branch {}",
            c.cloned.url,
            cordon_tools::printable(&dir.display().to_string()),
            c.cloned.branch
        );
        args.workspace = Some(dir.clone());
    }
    if (args.allow_push || args.forge_api.is_some()) && cloned.is_none() {
        return config_error(
            "--allow-push and --forge-api are for a session with a repository: --repo URL, or resuming one",
        );
    }
    let s = match setup(&Choices {
        model: args.model.as_deref(),
        provider: args.provider.as_deref(),
        workspace: args.workspace.as_deref(),
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
    for n in &s.notices {
        eprintln!("cordon: {n}");
    }
    let mcp_specs = match crate::mcp_cmd::configured(&s.settings) {
        Ok(m) => m,
        Err(e) => return config_error(e),
    };
    let sandbox = match Sandbox::create(s.sandbox.clone()).await {
        Ok(sb) => sb,
        Err(e) => {
            eprintln!("cordon: cannot create the sandbox: {e}");
            return exit::SANDBOX;
        }
    };
    // A server that fails is reported once, on stderr in both modes.
    let mcp = cordon_mcp::McpClients::start(
        &mcp_specs,
        std::sync::Arc::new(|m: String| eprintln!("cordon: {m}")),
    )
    .await;
    let (id, history, mut log) = match resumed {
        Some(r) => (r.summary.id, r.history, Some(r.log)),
        None => {
            let id = new_id;
            let log = SessionLog::<serde_json::Value>::create(
                sessions::sessions_dir().join(format!("{id}.jsonl")),
            )
            .map_err(|e| tracing::warn!("session log disabled: {e}"))
            .ok();
            (id, Vec::new(), log)
        }
    };
    if let Err(e) = sandbox.set_label(&id) {
        tracing::warn!("cannot label the sandbox with its session: {e}");
    }
    let started = sessions::SessionStarted::new(
        &id,
        &s.model.agent.model,
        &s.model.provider.kind.to_string(),
        // Resolved, so that a resume can tell if a link was planted since.
        &sessions::same_dir(&s.workspace),
        &prompt,
        !history.is_empty(),
    )
    .in_image(s.settings.resolved().sandbox.image.clone())
    .record();
    // Commits are made by cordon on the host, as the user; exec asks
    // nobody, so a push happens only if the user said so.
    let repo = cloned
        .as_ref()
        .map(|c| crate::repo::session(&c.cloned, args.allow_push, args.forge_api.as_deref()));
    let mut stdout = std::io::stdout();
    if args.json {
        let _ = writeln!(stdout, "{started}");
    }
    if let Some(l) = log.as_mut()
        && l.next_seq() == 0
    {
        let _ = l.append(&started);
        if let Some(r) = &repo
            && let Ok(record) = serde_json::to_value(r.record())
        {
            let _ = l.append(&record);
        }
    }
    let mut builder = AgentBuilder::new(
        &s.model.provider,
        AgentConfig {
            max_steps: args.max_steps,
            system: cordon_agent::prompt::system(
                s.sandbox.network,
                &cordon_agent::prompt::allowed(&sandbox),
            ),
            ..s.model.agent.clone()
        },
    )
    .tools(&mcp.tools)
    .history(history);
    if let Some(r) = &repo {
        builder = builder.tools(&r.tools());
    }
    if let Some(l) = log {
        // From here on the agent records the conversation as it happens.
        builder = builder.log(l);
    }
    let mut agent = match builder.build(&sandbox, &s.workspace) {
        Ok(a) => a,
        Err(e) => {
            mcp.shutdown().await;
            sandbox.close().await;
            return config_error(e);
        }
    };
    let (tx, mut rx) = mpsc::unbounded_channel();
    let cancel = Cancel::new();
    let on_int = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            on_int.cancel();
        }
    });
    let mut sink: Box<dyn EventSink> = if args.json {
        Box::new(crate::render::JsonLines::new(std::io::stdout()))
    } else {
        Box::new(crate::render::Human::new(
            std::io::stdout(),
            std::io::stderr(),
            std::io::stderr().is_terminal(),
        ))
    };
    let result = pump(agent.send(&prompt, &tx, &cancel), &mut rx, sink.as_mut()).await;
    drop(tx);
    agent.settle().await;
    drop(agent);
    mcp.shutdown().await;
    let disk_stop = sandbox.disk_stopped();
    sandbox.close().await;
    s.after.report();
    // The model was told; the exit code says it too (documented: 123).
    if disk_stop.is_some() && !matches!(result, Err(AgentError::Cancelled)) {
        return crate::run::disk_stopped(disk_stop);
    }
    match result {
        Ok(outcome) if outcome.stop_reason == StopReason::Refusal => {
            eprintln!(
                "cordon: the model declined this request (stop reason: refusal); rephrase the task"
            );
            MODEL_ERROR
        }
        Ok(outcome) => {
            if let Some(path) = &args.output
                && let Err(e) = write_output(path, &s.workspace, &outcome.text)
            {
                eprintln!("cordon: cannot write {}: {e}", path.display());
                return MODEL_ERROR;
            }
            0
        }
        Err(AgentError::Cancelled) => 130,
        Err(_) => MODEL_ERROR,
    }
}
