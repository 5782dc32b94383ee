//! The conversation behind the UI: one task that owns the sandbox, the
//! agent and the session log, and does what the UI asks, one request at a
//! time. The UI stays responsive because nothing here runs on its task.

use std::collections::HashSet;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use cordon_agent::sessions::{self, SessionSummary};
use cordon_agent::{
    Agent, AgentConfig, AgentError, AgentEvent, Approval, Approver, Cancel, Conversation,
    Instructions, Message, Opening, ProviderConfig, SessionLog, StopReason, Usage,
};
use cordon_sandbox::{Sandbox, SandboxConfig};
use serde_json::Value;
use tokio::sync::{mpsc, oneshot};

use crate::app::Answer;
use crate::approved::Approved;

#[derive(Debug)]
pub enum Request {
    Send(crate::app::Prompt),
    Compact,
    SetModel(String),
    SetMode(cordon_agent::Mode),
    Clear,
    New,
    ListSessions {
        all: bool,
    },
    Load(String),
    Rewind(Option<u64>),
    /// `!cmd`: a command the user runs in the sandbox's shell.
    Shell(String),
    /// `/snapshot [NAME]`.
    Snapshot(Option<String>),
}

/// Saves a sandbox's root as an image: given its writable layer's
/// directory, the session's id and the name asked for; the image's name,
/// or why not. The front end's (it owns the image store).
/// Saves a sandbox's root as an image: its writable layer's directory,
/// the overlay's `upper` as the host reads it, the session's id, the name.
pub type Snapshotter =
    Arc<dyn Fn(PathBuf, PathBuf, String, Option<String>) -> Result<String, String> + Send + Sync>;

pub enum Update {
    /// The sandbox is up; `network`: its broker's live policy, when the
    /// network is brokered (`--allow`).
    Ready {
        network: Option<cordon_net::PolicyHandle>,
        /// Its forwarded ports (`-p`): where each listens on the host, and
        /// the port inside it reaches.
        ports: Vec<(std::net::SocketAddr, u16)>,
    },
    /// The sandbox could not be created; nothing can run.
    SandboxFailed(String),
    /// A turn or a compaction ended.
    Done {
        error: Option<String>,
        cancelled: bool,
    },
    Approval {
        id: String,
        name: String,
        input: Value,
        /// A `write_file` target's current text (`None`: a new file).
        before: Option<String>,
        /// For a shell command, the words the user may approve for good.
        prefix: Option<Vec<String>>,
        reply: oneshot::Sender<Answer>,
    },
    Sessions(Vec<SessionSummary>),
    /// The project instructions (`AGENTS.md`) the conversation was given.
    Instructions(Vec<cordon_agent::instructions::Source>),
    /// The conversation is now this session (a new one once it is logged,
    /// or one loaded from disk).
    Session {
        id: String,
        workspace: PathBuf,
        history: Option<Vec<Message>>,
        /// The label of each tool call in `history`, by call id.
        labels: std::collections::HashMap<String, String>,
        usage: Usage,
    },
    Notice(String),
    Error(String),
}

/// Whether tool calls wait for the user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApprovalMode {
    Auto,
    Ask,
}

/// Asks the UI about each call, except for tools the user allowed for the
/// session and shell commands a rule of theirs approves.
struct UiApprover {
    updates: mpsc::UnboundedSender<Update>,
    always: Mutex<HashSet<String>>,
    /// The user's approved command prefixes; `Err`: why their file is not
    /// used (and is not written to).
    approved: Mutex<Result<Approved, String>>,
    /// The host workspace, to show what a write would replace.
    workspace: PathBuf,
}

/// The tool whose commands prefix rules approve, and its input field.
const SHELL_TOOL: &str = "bash";
const SHELL_COMMAND: &str = "command";

/// Largest file whose replaced lines an approval shows.
const MAX_BEFORE: u64 = 1 << 20;

/// What `write_file` would replace at `path`, read beneath the workspace
/// the way the tool itself reads (no link out of it is followed).
fn current_text(workspace: &std::path::Path, path: &str) -> Option<String> {
    use std::io::Read;
    let ws = cordon_tools::Workspace::open(workspace).ok()?;
    let (file, size) = ws
        .open_read(&cordon_tools::WsPath::parse(path).ok()?)
        .ok()?;
    if size > MAX_BEFORE {
        return Some(format!("[a file of {size} bytes, too large to show]\n"));
    }
    let mut bytes = Vec::new();
    file.take(MAX_BEFORE).read_to_end(&mut bytes).ok()?;
    Some(match String::from_utf8(bytes) {
        Ok(text) => text,
        Err(e) => format!("[a binary file of {} bytes]\n", e.as_bytes().len()),
    })
}

impl UiApprover {
    /// Saves a prefix rule; what to tell the user about it.
    fn remember(&self, words: Vec<String>) -> Update {
        let shown = cordon_tools::printable(&words.join(" "));
        let mut approved = self.approved.lock().unwrap_or_else(|p| p.into_inner());
        match &mut *approved {
            Ok(a) => match a.add(words) {
                Ok(()) => Update::Notice(format!(
                    "Commands starting with `{shown}` run without asking from now on, in every session ({}).",
                    a.path().display()
                )),
                Err(e) => Update::Error(format!("the rule for `{shown}` is not saved: {e}")),
            },
            Err(why) => Update::Error(format!("the rule for `{shown}` is not saved: {why}")),
        }
    }
}

impl Approver for UiApprover {
    fn approve<'a>(
        &'a self,
        id: &'a str,
        name: &'a str,
        input: &'a Value,
    ) -> futures_util::future::BoxFuture<'a, Approval> {
        Box::pin(async move {
            if self
                .always
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .contains(name)
            {
                return Approval::Allow;
            }
            let command = (name == SHELL_TOOL)
                .then(|| input[SHELL_COMMAND].as_str())
                .flatten();
            if let Some(command) = command
                && let Ok(approved) = &*self.approved.lock().unwrap_or_else(|p| p.into_inner())
                && approved.allowing(command).is_some()
            {
                return Approval::Allow;
            }
            let prefix = command.and_then(crate::approved::suggested_prefix);
            let before = match (name, input["path"].as_str()) {
                ("write_file", Some(path)) => {
                    let (ws, path) = (self.workspace.clone(), path.to_string());
                    tokio::task::spawn_blocking(move || current_text(&ws, &path))
                        .await
                        .ok()
                        .flatten()
                }
                _ => None,
            };
            let (tx, rx) = oneshot::channel();
            let asked = self.updates.send(Update::Approval {
                id: id.to_string(),
                name: name.to_string(),
                input: input.clone(),
                before,
                prefix,
                reply: tx,
            });
            if asked.is_err() {
                return Approval::Deny("the user interface has closed".into());
            }
            match rx.await {
                Ok(Answer::Always) => {
                    self.always
                        .lock()
                        .unwrap_or_else(|p| p.into_inner())
                        .insert(name.to_string());
                    Approval::Allow
                }
                Ok(Answer::Prefix(words)) => {
                    let said = self.remember(words);
                    let _ = self.updates.send(said);
                    Approval::Allow
                }
                Ok(a) => a.into(),
                Err(_) => Approval::Deny("no answer from the user".into()),
            }
        })
    }
}

pub struct Worker {
    pub provider: ProviderConfig,
    pub agent: AgentConfig,
    pub sandbox: SandboxConfig,
    pub approval: ApprovalMode,
    pub sessions_dir: PathBuf,
    /// A session to continue, from `--resume` or `--last`.
    pub resume: Option<sessions::Resumed>,
    /// MCP servers whose tools the model gets too.
    pub mcp: std::collections::BTreeMap<String, cordon_mcp::ServerSpec>,
    /// Said in the transcript before anything else (settings the
    /// configuration ignored, and why).
    pub notices: Vec<String>,
    /// The user's configuration directory (`$XDG_CONFIG_HOME`), where the
    /// commands they approve for good are kept; `None`: not kept.
    pub config_home: Option<PathBuf>,
    /// A repository cloned for this conversation (`--repo`): the id its
    /// session gets (its branch is named after it), the records its log
    /// starts with after `session_started`, and the host-side git tools.
    pub repository: Option<Repository>,
    /// The image the sandbox runs in, as named (recorded in each session
    /// so that a resume runs there too).
    pub image: Option<String>,
    /// How `/snapshot` saves the sandbox; `None` where images are not kept.
    pub snapshot: Option<Snapshotter>,
    /// The user's command rules (`[rules]`).
    pub rules: cordon_agent::rules::Rules,
    /// The user's hooks (`[[hooks]]`).
    pub hooks: cordon_agent::hooks::Hooks,
    /// Working, or planning (`--mode plan`, `/plan`).
    pub mode: cordon_agent::Mode,
    /// Pause the sandbox after this long without a request
    /// (`sandbox.pause_when_idle`); the next request resumes it.
    pub pause_when_idle: Option<std::time::Duration>,
    /// The user's own `AGENTS.md`, read before the workspace's.
    pub user_instructions: Option<PathBuf>,
}

/// What `--repo` gives a new conversation.
pub struct Repository {
    pub session_id: String,
    pub records: Vec<cordon_agent::SessionRecord>,
    pub tools: Vec<Arc<dyn cordon_tools::Tool>>,
}

struct State {
    cfg: Worker,
    /// The conversation; `None` while there is no sandbox to hold one.
    talk: Option<Conversation>,
    /// The session's id once its log exists.
    session: Option<String>,
    approver: Option<Arc<UiApprover>>,
    events: mpsc::UnboundedSender<AgentEvent>,
    updates: mpsc::UnboundedSender<Update>,
    cancel: Cancel,
}

impl Worker {
    /// Serves `requests` until the UI drops its sender, then closes the
    /// sandbox.
    pub async fn run(
        mut self,
        mut requests: mpsc::UnboundedReceiver<Request>,
        events: mpsc::UnboundedSender<AgentEvent>,
        updates: mpsc::UnboundedSender<Update>,
        cancel: Cancel,
    ) {
        let resume = self.resume.take();
        for n in std::mem::take(&mut self.notices) {
            let _ = updates.send(Update::Notice(n));
        }
        let approver = Some({
            let approved = match &self.config_home {
                Some(home) => Approved::load(home).map_err(|e| e.to_string()),
                None => Err("neither XDG_CONFIG_HOME nor HOME is set".into()),
            };
            if let Err(e) = &approved {
                let _ = updates.send(Update::Error(format!(
                    "approved commands are not used: {e}"
                )));
            }
            Arc::new(UiApprover {
                updates: updates.clone(),
                always: Mutex::default(),
                approved: Mutex::new(approved),
                workspace: self.sandbox.workspace.clone(),
            })
        });
        let mut st = State {
            cfg: self,
            talk: None,
            session: None,
            approver,
            events,
            updates,
            cancel,
        };
        // The sandbox first: the UI can say it is ready while MCP servers
        // (up to their start-up timeout) come up.
        st.open(resume).await;
        loop {
            let idle = st.cfg.pause_when_idle.filter(|_| st.can_pause());
            let req = match idle {
                Some(after) => tokio::select! {
                    r = requests.recv() => r,
                    _ = tokio::time::sleep(after) => {
                        st.pause_idle(after).await;
                        continue;
                    }
                },
                None => requests.recv().await,
            };
            let Some(req) = req else { break };
            st.resume_paused().await;
            st.handle(req).await;
        }
        // The last turn's checkpoint lands before cordon exits.
        if let Some(talk) = st.talk.take() {
            talk.close().await;
        }
    }
}

impl State {
    /// Whether there is a running sandbox to pause.
    fn can_pause(&self) -> bool {
        self.talk.as_ref().is_some_and(|t| !t.sandbox().is_paused())
    }

    /// Pauses the sandbox after `after` idle, saying so.
    async fn pause_idle(&mut self, after: std::time::Duration) {
        let Some(talk) = &self.talk else { return };
        let notice = match talk.sandbox().pause().await {
            Ok(()) => format!(
                "The sandbox is paused after {} idle (sandbox.pause_when_idle): your next message resumes it.",
                humantime::format_duration(after)
            ),
            Err(e) => {
                // Said once: the setting is off for the rest of the session.
                self.cfg.pause_when_idle = None;
                format!(
                    "The sandbox cannot be paused ({e}): sandbox.pause_when_idle is off for this session."
                )
            }
        };
        let _ = self.updates.send(Update::Notice(notice));
    }

    /// Resumes a paused sandbox before a request uses it.
    async fn resume_paused(&mut self) {
        let Some(talk) = &self.talk else { return };
        if talk.sandbox().is_paused()
            && let Err(e) = talk.sandbox().resume().await
        {
            let _ = self
                .updates
                .send(Update::Error(format!("the sandbox cannot be resumed: {e}")));
        }
    }

    /// Names the sandbox after the session, for `cordon image commit` (a
    /// label that cannot be written only leaves that command without it).
    fn label_sandbox(&self) {
        if let (Some(talk), Some(id)) = (&self.talk, &self.session) {
            talk.label(id);
        }
    }

    async fn snapshot(&mut self, name: Option<String>) {
        let notice = match (
            &self.cfg.snapshot,
            self.talk
                .as_ref()
                .map(Conversation::sandbox)
                .and_then(|s| s.writable_layer_dir().zip(s.writable_upper())),
            &self.session,
        ) {
            (Some(save), Some((dir, upper)), Some(id)) => {
                let (save, id) = (save.clone(), id.clone());
                match tokio::task::spawn_blocking(move || save(dir, upper, id, name)).await {
                    Ok(Ok(image)) => format!(
                        "Saved the sandbox's root as {image}: `cordon --image {image}` starts \
                         from it. The workspace is not in it (it stays yours: commit it to git)."
                    ),
                    Ok(Err(e)) => format!("/snapshot: {e}"),
                    Err(e) => format!("/snapshot: {e}"),
                }
            }
            (_, None, _) => "/snapshot saves a sandbox on an image (start cordon with --image): \
                             this one runs on the host's root, which it cannot change."
                .into(),
            (_, _, None) => "/snapshot works once the conversation has begun.".into(),
            (None, _, _) => "/snapshot is not available here.".into(),
        };
        let _ = self.updates.send(Update::Notice(notice));
    }

    /// How every conversation of this UI opens: the provider, the
    /// agent's settings as they are now, the MCP servers and the
    /// repository's tools, and the approver.
    fn opening(&self) -> Opening {
        let report_to = self.updates.clone();
        Opening::new(&self.cfg.provider, self.cfg.agent.clone())
            .mcp(
                &self.cfg.mcp,
                Arc::new(move |m: String| {
                    let _ = report_to.send(Update::Error(m));
                }),
            )
            .tools(
                &self
                    .cfg
                    .repository
                    .as_ref()
                    .map(|r| r.tools.clone())
                    .unwrap_or_default(),
            )
            // The user can always be asked: about every call with
            // approval ask, about what a rule says to ask with auto.
            .oversight(cordon_agent::Oversight {
                approver: self
                    .approver
                    .as_ref()
                    .map(|a| a.clone() as Arc<dyn Approver>),
                ask_all: self.cfg.approval == ApprovalMode::Ask,
                rules: self.cfg.rules.clone(),
                hooks: self.cfg.hooks.clone(),
            })
            .mode(self.cfg.mode)
    }

    /// Opens a conversation in a new sandbox over the workspace, the one
    /// before closed first: `resume`'s, or a fresh one.
    async fn open(&mut self, resume: Option<sessions::Resumed>) {
        if let Some(talk) = self.talk.take() {
            talk.close().await;
        }
        self.session = None;
        let sandbox = match Sandbox::create(self.cfg.sandbox.clone()).await {
            Ok(sb) => sb,
            Err(e) => {
                let _ = self.updates.send(Update::SandboxFailed(format!(
                    "cannot create the sandbox: {e}"
                )));
                return;
            }
        };
        let network = sandbox.network().map(|n| n.policy.clone());
        let ports = sandbox.forwards();
        let _ = self.updates.send(Update::Ready { network, ports });
        let (history, log, shown) = match resume {
            Some(r) => (
                r.history.clone(),
                Some(r.log),
                Some((r.summary.id, r.history, r.summary.usage)),
            ),
            None => (Vec::new(), None, None),
        };
        let instructions = Instructions::read(
            self.cfg.user_instructions.as_deref(),
            &self.cfg.sandbox.workspace,
            &self.cfg.sandbox.workdir,
        );
        let _ = self
            .updates
            .send(Update::Instructions(instructions.sources().to_vec()));
        let opened = self
            .opening()
            .instructions(instructions)
            .open(sandbox, &self.cfg.sandbox.workspace, history, log)
            .await;
        match opened {
            Ok(talk) => self.talk = Some(talk),
            Err(e) => {
                let _ = self.updates.send(Update::Error(e.to_string()));
                return;
            }
        }
        if let Some((id, history, usage)) = shown {
            self.continued(id, history, usage);
        }
    }

    /// A fresh conversation in the same sandbox.
    async fn fresh(&mut self) {
        self.session = None;
        if let Some(talk) = &mut self.talk
            && let Err(e) = talk.restart(Vec::new(), None).await
        {
            let _ = self.updates.send(Update::Error(e.to_string()));
        }
    }

    /// Continues a session from disk in the current sandbox.
    async fn adopt(&mut self, r: sessions::Resumed) {
        let Some(talk) = &mut self.talk else {
            return;
        };
        let history = r.history.clone();
        if let Err(e) = talk.restart(r.history, Some(r.log)).await {
            let _ = self.updates.send(Update::Error(e.to_string()));
            return;
        }
        self.continued(r.summary.id, history, r.summary.usage);
    }

    /// The conversation is now session `id`, continued: the UI shows it.
    fn continued(&mut self, id: String, history: Vec<Message>, usage: Usage) {
        let labels = match &mut self.talk {
            Some(talk) => talk.agent().labels(&history),
            None => Default::default(),
        };
        let _ = self.updates.send(Update::Session {
            id: id.clone(),
            workspace: self.cfg.sandbox.workspace.clone(),
            history: Some(history),
            labels,
            usage,
        });
        self.session = Some(id);
        self.label_sandbox();
    }

    async fn handle(&mut self, req: Request) {
        match req {
            Request::Send(prompt) => self.send(prompt).await,
            Request::Compact => self.compact().await,
            Request::Snapshot(name) => self.snapshot(name).await,
            Request::SetModel(m) => {
                self.cfg.agent.model = m.clone();
                if let Some(talk) = &mut self.talk {
                    talk.set_model(&m);
                }
            }
            Request::SetMode(mode) => {
                self.cfg.mode = mode;
                if let Some(talk) = &mut self.talk {
                    talk.set_mode(mode);
                }
            }
            Request::Clear => self.fresh().await,
            Request::New => self.open(None).await,
            Request::ListSessions { all } => {
                let dir = self.cfg.sessions_dir.clone();
                let here = self.cfg.sandbox.workspace.clone();
                let list = tokio::task::spawn_blocking(move || {
                    let here = sessions::same_dir(&here);
                    sessions::list(&dir)
                        .into_iter()
                        .filter(|s| {
                            all || sessions::same_dir(std::path::Path::new(&s.workspace)) == here
                        })
                        .collect()
                })
                .await
                .unwrap_or_default();
                let _ = self.updates.send(Update::Sessions(list));
            }
            Request::Load(id) => self.load(&id).await,
            Request::Rewind(turn) => self.rewind(turn).await,
            Request::Shell(command) => self.shell(&command).await,
        }
    }

    async fn load(&mut self, id: &str) {
        let dir = self.cfg.sessions_dir.clone();
        let wanted = id.to_string();
        let chosen = tokio::task::spawn_blocking(move || {
            sessions::choose(&sessions::list(&dir), Some(&wanted), None)
        })
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| e.to_string()));
        // This conversation's own log is held open by its agent: loading
        // it again would find it busy, and there is nothing to load.
        if let Ok(c) = &chosen
            && self.session.as_deref() == Some(c.id.as_str())
        {
            let _ = self
                .updates
                .send(Update::Notice(format!("Session {} is this one.", c.id)));
            return;
        }
        let resumed = match chosen {
            Ok(c) => tokio::task::spawn_blocking(move || sessions::open(&c.path))
                .await
                .map_err(|e| e.to_string())
                .and_then(|r| r.map_err(|e| e.to_string())),
            Err(e) => Err(e),
        };
        let r = match resumed {
            Ok(r) => r,
            Err(e) => {
                let _ = self.updates.send(Update::Error(e));
                return;
            }
        };
        // A session continues in the workspace it started in, as recorded:
        // not wherever a link planted since then leads.
        let ws = match sessions::recorded_workspace(&r.summary.id, &r.summary.workspace) {
            Ok(ws) => ws,
            Err(e) => {
                let _ = self.updates.send(Update::Error(e));
                return;
            }
        };
        if ws != self.cfg.sandbox.workspace {
            if !ws.is_dir() {
                let _ = self.updates.send(Update::Error(format!(
                    "session {id} worked in {}, which no longer exists",
                    ws.display()
                )));
                return;
            }
            self.cfg.sandbox.workspace = ws;
            self.open(Some(r)).await;
            return;
        }
        self.adopt(r).await;
    }

    /// `/undo` and `/rewind N`: the session's files and conversation back
    /// to the end of a turn, then the session continued from there.
    async fn rewind(&mut self, to: Option<u64>) {
        let Some(id) = self.session.clone() else {
            let _ = self.updates.send(Update::Notice(
                "Nothing to take back: this conversation has no turns yet.".into(),
            ));
            return;
        };
        let path = self.cfg.sessions_dir.join(format!("{id}.jsonl"));
        // The last turn's checkpoint first; then the log is closed, so that
        // nothing else writes to it while the rewind does.
        self.fresh().await;
        let turns = match sessions::open(&path) {
            Ok(r) => r.summary.turns,
            Err(e) => {
                let _ = self.updates.send(Update::Error(e.to_string()));
                return;
            }
        };
        let target = match to {
            Some(n) => n,
            None if turns == 0 => {
                let _ = self.updates.send(Update::Notice(
                    "Nothing to take back: this conversation has no turns yet.".into(),
                ));
                self.reopen(&path).await;
                return;
            }
            None => turns - 1,
        };
        let ws = self.cfg.sandbox.workspace.clone();
        let log = path.clone();
        let retention = self.cfg.agent.checkpoints;
        let done = tokio::task::spawn_blocking(move || {
            cordon_agent::checkpoints::rewind(&log, &ws, target, retention)
        })
        .await;
        // The transcript is rebuilt from the log when the session is
        // continued: what the rewind did is said after that.
        let said = match done {
            Ok(Ok(r)) => {
                let mut said = format!(
                    "Back at the end of turn {target}: {} file{} written, {} removed.",
                    r.written,
                    if r.written == 1 { "" } else { "s" },
                    r.removed
                );
                for k in &r.kept {
                    said.push_str(&format!("\nLeft as it is: {}: {}", k.path, k.why));
                }
                Update::Notice(said)
            }
            Ok(Err(e)) => Update::Error(e.to_string()),
            Err(e) => Update::Error(e.to_string()),
        };
        self.reopen(&path).await;
        let _ = self.updates.send(said);
    }

    /// Continues the session logged at `path` (after a rewind).
    async fn reopen(&mut self, path: &std::path::Path) {
        match sessions::open(path) {
            Ok(r) => self.adopt(r).await,
            Err(e) => {
                let _ = self.updates.send(Update::Error(e.to_string()));
                self.fresh().await;
            }
        }
    }

    /// Opens the session log on the conversation's first message.
    fn ensure_log(&mut self, prompt: &str) {
        if self.session.is_some() {
            return;
        }
        let Some(talk) = &mut self.talk else {
            return;
        };
        // The first conversation on a cloned repository takes the id its
        // branch is named after; later ones (/clear, /new) their own.
        let preset = self.cfg.repository.as_mut().map(|r| {
            (
                std::mem::take(&mut r.session_id),
                std::mem::take(&mut r.records),
            )
        });
        let (id, first) = match preset {
            Some((id, records)) if !id.is_empty() => (id, records),
            _ => (sessions::new_id(), Vec::new()),
        };
        let path = self.cfg.sessions_dir.join(format!("{id}.jsonl"));
        let read = talk.instructions().to_vec();
        match SessionLog::create(&path) {
            Ok(mut log) => {
                let _ = log.append(
                    &sessions::SessionStarted::new(
                        &id,
                        &self.cfg.agent.model,
                        &self.cfg.provider.kind.to_string(),
                        // Resolved, so that a resume can tell if a link was
                        // planted since.
                        &sessions::same_dir(&self.cfg.sandbox.workspace),
                        prompt,
                        false,
                    )
                    .in_image(self.cfg.image.clone())
                    .reading(&read)
                    .record(),
                );
                for r in &first {
                    let _ = log.append(r);
                }
                let _ = self.updates.send(Update::Session {
                    id: id.clone(),
                    workspace: self.cfg.sandbox.workspace.clone(),
                    history: None,
                    labels: Default::default(),
                    usage: Usage::default(),
                });
                talk.agent().set_log(log);
                talk.label(&id);
                self.session = Some(id);
            }
            Err(e) => {
                let _ = self.updates.send(Update::Notice(format!(
                    "This conversation is not saved: cannot create {}: {e}",
                    path.display()
                )));
            }
        }
    }

    /// The agent, ready for a turn whose log (if it is the first) is
    /// titled `title`; `None`, with the UI told why, when there is none.
    fn ready(&mut self, title: &str) -> Option<&mut Agent> {
        if self.talk.is_none() {
            let _ = self.updates.send(Update::Done {
                error: Some("the sandbox is not running: /new starts a fresh one".into()),
                cancelled: false,
            });
            return None;
        }
        self.ensure_log(title);
        self.cancel.reset();
        self.talk.as_mut().map(Conversation::agent)
    }

    async fn send(&mut self, prompt: crate::app::Prompt) {
        let (events, cancel) = (self.events.clone(), self.cancel.clone());
        // The images first: one that cannot be read stops the message,
        // which the user sends again once it is fixed.
        let mut images = Vec::with_capacity(prompt.attach.len());
        if let Some(talk) = &self.talk {
            let cwd = std::env::current_dir().unwrap_or_else(|_| talk.workspace().to_path_buf());
            for path in &prompt.attach {
                let path = expand_home(path);
                match cordon_tools::attach::read(&path, &cwd, talk.workspace()) {
                    Ok(image) => images.push(image),
                    Err(e) => {
                        let _ = self.updates.send(Update::Done {
                            error: Some(format!("cannot attach {e}; the message was not sent")),
                            cancelled: false,
                        });
                        return;
                    }
                }
            }
        }
        let Some(agent) = self.ready(&prompt.text) else {
            return;
        };
        let result = agent
            .send_with_images(&prompt.text, images, &events, &cancel)
            .await;
        let refused = matches!(&result, Ok(o) if o.stop_reason == StopReason::Refusal);
        let done = if refused {
            Update::Done {
                error: Some("The model declined this request: rephrase it.".into()),
                cancelled: false,
            }
        } else {
            done(result)
        };
        let _ = self.updates.send(done);
    }

    /// Runs `!cmd` in the sandbox's shell, logged, for the model to see
    /// with the next prompt.
    async fn shell(&mut self, command: &str) {
        let (events, cancel) = (self.events.clone(), self.cancel.clone());
        let Some(agent) = self.ready(&format!("!{command}")) else {
            return;
        };
        let result = agent.run_user_command(command, &events, &cancel).await;
        let _ = self.updates.send(done(result));
    }

    async fn compact(&mut self) {
        self.cancel.reset();
        let Some(agent) = self.talk.as_mut().map(Conversation::agent) else {
            let _ = self.updates.send(Update::Done {
                error: Some("nothing to compact".into()),
                cancelled: false,
            });
            return;
        };
        let result = agent.compact(&self.events, &self.cancel).await;
        let _ = self.updates.send(done(result));
    }
}

/// How a turn or a compaction ended, for the UI.
fn done<T>(result: Result<T, AgentError>) -> Update {
    match result {
        Ok(_) => Update::Done {
            error: None,
            cancelled: false,
        },
        Err(AgentError::Cancelled) => Update::Done {
            error: None,
            cancelled: true,
        },
        Err(e) => Update::Done {
            error: Some(e.to_string()),
            cancelled: false,
        },
    }
}

/// `~/x` as the user's home directory's `x`, as a shell would.
fn expand_home(path: &str) -> std::path::PathBuf {
    match (path.strip_prefix("~/"), std::env::var_os("HOME")) {
        (Some(rest), Some(home)) => std::path::Path::new(&home).join(rest),
        _ => std::path::PathBuf::from(path),
    }
}

#[cfg(test)]
mod tests {
    use super::current_text;

    #[test]
    fn what_a_write_would_replace_is_read_beneath_the_workspace() {
        let ws = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(ws.path().join("notes.txt"), "old line\n").unwrap();
        std::fs::write(outside.path().join("secret"), "host secret\n").unwrap();
        std::os::unix::fs::symlink(outside.path().join("secret"), ws.path().join("link")).unwrap();
        std::fs::write(ws.path().join("blob"), [0xff, 0xfe, 0]).unwrap();
        assert_eq!(
            current_text(ws.path(), "notes.txt").as_deref(),
            Some("old line\n")
        );
        assert_eq!(current_text(ws.path(), "/workspace/new.txt"), None);
        // A link out of the workspace is not followed: the host file
        // never reaches the screen.
        assert!(current_text(ws.path(), "link").is_none_or(|t| !t.contains("host secret")));
        assert_eq!(
            current_text(ws.path(), "blob").as_deref(),
            Some("[a binary file of 3 bytes]\n")
        );
    }
}
