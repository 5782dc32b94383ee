//! `cordon exec "PROMPT"`: one task, headless. The answer streams to
//! stdout, progress (tool calls and abbreviated results) to stderr; with
//! `--json`, every event is one JSON object per line on stdout.

use std::io::{IsTerminal, Read, Write};
use std::path::{Path, PathBuf};

use clap::Args;
use cordon_agent::events::{EventSink, pump};
use cordon_agent::sessions;
use cordon_agent::{AgentError, Cancel, Opening, SessionLog, SessionRecord, StopReason};
use cordon_sandbox::Sandbox;
use tokio::sync::mpsc;

use crate::agent_flags::{AgentFlags, Prepared};
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
    /// Give the model an image with the prompt: PNG, JPEG, GIF or WebP, up to 5 MiB (repeatable)
    #[arg(long = "attach", value_name = "FILE")]
    pub attach: Vec<PathBuf>,
    #[command(flatten)]
    pub agent: AgentFlags,
}

pub(crate) use crate::options::config_error;

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
    if let Some(rel) = cordon_tools::beneath(workspace, &abs) {
        let ws = cordon_tools::Workspace::open(workspace).map_err(|e| e.to_string())?;
        let rel = cordon_tools::WsPath::parse(&rel.to_string_lossy()).map_err(|e| e.to_string())?;
        return ws.write(&rel, text.as_bytes()).map(|_| ()).map_err(|e| {
            format!("{e} (it is in the workspace, where a sandbox could have put a link)")
        });
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
    let Prepared {
        resumed,
        new_id,
        cloned,
        setup: s,
        notices,
    } = match args.agent.prepare().await {
        Ok(p) => p,
        Err(code) => return code,
    };
    for n in &notices {
        eprintln!("cordon: {n}");
    }
    if let Some(c) = &cloned
        && let Some(dir) = &c.made
    {
        eprintln!(
            "cordon: cloned {} into {} on branch {}",
            c.cloned.url,
            cordon_tools::printable(&dir.display().to_string()),
            c.cloned.branch
        );
    }
    // Before anything starts: a file that cannot be given is the user's
    // to fix.
    let cwd = std::env::current_dir().unwrap_or_else(|_| s.workspace.clone());
    let mut images = Vec::with_capacity(args.attach.len());
    for path in &args.attach {
        match cordon_tools::attach::read(path, &cwd, &s.workspace) {
            Ok(image) => images.push(image),
            Err(e) => return config_error(format_args!("--attach {e}")),
        }
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
    for (addr, port) in sandbox.forwards() {
        eprintln!("cordon: {}", cordon_sandbox::forwarded(addr, port));
    }
    let (id, history, mut log) = match resumed {
        Some(r) => (r.summary.id, r.history, Some(r.log)),
        None => {
            let id = new_id;
            let log = SessionLog::<SessionRecord>::create(
                sessions::sessions_dir().join(format!("{id}.jsonl")),
            )
            .map_err(|e| tracing::warn!("session log disabled: {e}"))
            .ok();
            (id, Vec::new(), log)
        }
    };
    let instructions = s.instructions();
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
    .reading(instructions.sources())
    .record();
    // Commits are made by cordon on the host, as the user; exec asks
    // nobody, so a push happens only if the user said so.
    let repo = cloned.as_ref().map(|c| {
        let flags = &args.agent;
        crate::repo::session(&c.cloned, flags.allow_push, flags.forge_api.as_deref())
    });
    let mut stdout = std::io::stdout();
    // Through a `Value`, as the log writes it: its keys in order.
    if args.json
        && let Ok(line) = serde_json::to_value(&started)
    {
        let _ = writeln!(stdout, "{line}");
    }
    if let Some(l) = log.as_mut()
        && l.next_seq() == 0
    {
        let _ = l.append(&started);
        if let Some(r) = &repo {
            let _ = l.append(&SessionRecord::Repository(r.record()));
        }
    }
    // A server that fails is reported once, on stderr in both modes. From
    // here on the agent records the conversation as it happens.
    let opened = Opening::new(&s.model.provider, args.agent.agent(&s.model.agent))
        .mcp(
            &mcp_specs,
            std::sync::Arc::new(|m: String| eprintln!("cordon: {m}")),
        )
        .tools(&repo.map(|r| r.tools()).unwrap_or_default())
        // Nobody to ask: a rule's `ask` is a refusal here.
        .oversight(cordon_agent::Oversight {
            rules: s.settings.rules().clone(),
            hooks: cordon_agent::hooks::Hooks::new(s.settings.hooks().to_vec()),
            ..Default::default()
        })
        .mode(args.agent.mode)
        .instructions(instructions)
        .open(sandbox, &s.workspace, history, log)
        .await;
    let mut talk = match opened {
        Ok(t) => t,
        Err(e) => return config_error(e),
    };
    talk.label(&id);
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
        let terminals = crate::render::Terminals {
            out: std::io::stdout().is_terminal(),
            err: std::io::stderr().is_terminal(),
        };
        Box::new(crate::render::Human::new(
            std::io::stdout(),
            std::io::stderr(),
            terminals,
        ))
    };
    let result = pump(
        talk.agent().send_with_images(&prompt, images, &tx, &cancel),
        &mut rx,
        sink.as_mut(),
    )
    .await;
    drop(tx);
    let ended = talk.close().await;
    s.after.report();
    // The model was told; the exit code says it too (documented: 123).
    if ended.disk_stop.is_some() && !matches!(result, Err(AgentError::Cancelled)) {
        return crate::run::disk_stopped(ended.disk_stop);
    }
    match result {
        Ok(outcome) if outcome.stop_reason == StopReason::Refusal => {
            eprintln!(
                "cordon: the model declined this request (stop reason: refusal); rephrase the task"
            );
            exit::MODEL_ERROR
        }
        Ok(outcome) => {
            if let Some(path) = &args.output
                && let Err(e) = write_output(path, &s.workspace, &outcome.text)
            {
                eprintln!("cordon: cannot write {}: {e}", path.display());
                return exit::MODEL_ERROR;
            }
            0
        }
        Err(AgentError::Cancelled) => exit::INTERRUPTED,
        Err(_) => exit::MODEL_ERROR,
    }
}
