//! The UI's state and how keys, pastes, the mouse and the agent's events
//! change it. No terminal here: the run loop feeds it, the view draws it,
//! and the tests drive it directly.

use std::time::{Duration, Instant};

use cordon_agent::sessions::SessionSummary;
use cordon_agent::{AgentEvent, Approval, Usage};
use crossterm::event::{KeyCode, KeyEvent, KeyEventKind, KeyModifiers, MouseEvent, MouseEventKind};
use ratatui_textarea::TextArea;
use serde_json::Value;
use tokio::sync::oneshot;

use crate::transcript::{Entry, ToolCall, ToolState, Transcript};

/// A message for the model: the text, and the images the user attached
/// to it (paths as they gave them, read by the worker).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Prompt {
    pub text: String,
    pub attach: Vec<String>,
}

impl From<&str> for Prompt {
    fn from(text: &str) -> Prompt {
        Prompt {
            text: text.to_string(),
            attach: Vec::new(),
        }
    }
}

impl From<String> for Prompt {
    fn from(text: String) -> Prompt {
        Prompt {
            text,
            attach: Vec::new(),
        }
    }
}

/// The file names a pasted path is taken as an attachment for.
const IMAGE_EXTENSIONS: &[&str] = &["png", "jpg", "jpeg", "gif", "webp"];

/// A paste that is one image file's path, as terminals paste a dropped
/// file: quoted, with `\ ` for spaces, or as a `file://` URL.
pub fn pasted_image_path(text: &str) -> Option<String> {
    let t = text.trim();
    if t.is_empty() || t.contains('\n') {
        return None;
    }
    let t = t
        .strip_prefix('\'')
        .and_then(|t| t.strip_suffix('\''))
        .or_else(|| t.strip_prefix('"').and_then(|t| t.strip_suffix('"')))
        .unwrap_or(t);
    let t = t.strip_prefix("file://").unwrap_or(t);
    let path = t.replace("\\ ", " ");
    let ext = std::path::Path::new(&path)
        .extension()?
        .to_str()?
        .to_ascii_lowercase();
    (path.starts_with('/') || path.starts_with("./") || path.starts_with("~/"))
        .then_some(())
        .filter(|_| IMAGE_EXTENSIONS.contains(&ext.as_str()))
        .map(|_| path)
}

/// What the run loop must do for the user.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    Send(Prompt),
    Cancel,
    Quit,
    Compact,
    SetModel(String),
    /// Working, or planning with read-only tools (`/plan`, `/go`).
    SetMode(cordon_agent::Mode),
    /// A new conversation in the same sandbox.
    Clear,
    /// A new conversation in a fresh sandbox.
    New,
    /// Earlier sessions: this workspace's, or every one's.
    ListSessions {
        all: bool,
    },
    Load(String),
    /// Files and conversation back to the end of a turn (`None`: the one
    /// before the last, `/undo`).
    Rewind(Option<u64>),
    /// Let the sandbox reach this host for the rest of the session.
    AllowHost(cordon_net::Rule),
    /// Save the sandbox's root as an image (named, or after the session).
    Snapshot(Option<String>),
    /// `@path` then Tab: the workspace's entries starting with this (the
    /// text after `@`); the answer comes back to [`App::complete_path`].
    CompletePath(String),
    /// `!cmd`: run this in the sandbox's shell, as the user.
    Shell(String),
}

/// A user's answer to an approval prompt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    Once,
    /// This tool runs without asking for the rest of the session.
    Always,
    /// Commands starting with these words run without asking, from now
    /// on and in later sessions (saved in the user's own file).
    Prefix(Vec<String>),
    Deny(String),
}

impl From<Answer> for Approval {
    fn from(a: Answer) -> Approval {
        match a {
            Answer::Once | Answer::Always | Answer::Prefix(_) => Approval::Allow,
            Answer::Deny(r) => Approval::Deny(r),
        }
    }
}

pub struct PendingApproval {
    pub id: String,
    pub name: String,
    pub input: Value,
    /// What the call does, as its transcript entry says.
    pub label: String,
    /// For a shell command, the words `p` would approve for good.
    pub prefix: Option<Vec<String>>,
    pub reply: Option<oneshot::Sender<Answer>>,
    /// The user chose to deny and is typing the reason in the input box.
    pub denying: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SandboxState {
    Starting,
    Ready,
    Busy,
    Closed,
}

/// What the status line shows.
#[derive(Debug, Clone)]
pub struct Status {
    pub model: String,
    pub workspace: String,
    pub sandbox: SandboxState,
    /// The sandbox backend, shown when it is not the default `native`.
    pub backend: String,
    pub session: Option<String>,
    /// Summed over the session's requests.
    pub usage: Usage,
    pub cost_usd: Option<f64>,
    pub context_tokens: u64,
    pub context_window: u64,
    /// The project instructions (`AGENTS.md`) the model was given.
    pub instructions: Vec<cordon_agent::instructions::Source>,
}

/// The session picker: a full-screen list, narrowed by what is typed.
pub struct Picker {
    pub sessions: Vec<SessionSummary>,
    /// Typed to narrow the list: matched against titles, ids and
    /// workspaces, case aside.
    pub filter: String,
    /// An index into [`Picker::shown`].
    pub selected: usize,
    /// When it opened: what "2 h ago" is counted from.
    pub now: std::time::SystemTime,
}

impl Picker {
    /// The sessions the filter lets through, in order.
    pub fn shown(&self) -> Vec<&SessionSummary> {
        let f = self.filter.to_lowercase();
        self.sessions
            .iter()
            .filter(|s| {
                f.is_empty()
                    || s.title.to_lowercase().contains(&f)
                    || s.id.contains(&f)
                    || s.workspace.to_lowercase().contains(&f)
            })
            .collect()
    }
}

pub struct App {
    pub transcript: Transcript,
    pub input: TextArea<'static>,
    pub status: Status,
    /// A turn (or a compaction) is running.
    pub busy: bool,
    /// The first visible row when the user has scrolled up; `None`
    /// follows new output.
    pub scroll: Option<usize>,
    /// Rows above the last row that can be the top one, and the view's
    /// height: set by each draw, for scrolling.
    pub max_top: usize,
    pub view_height: usize,
    /// Earlier prompts, oldest first, for Up/Down.
    pub prompts: Vec<String>,
    recall: Option<usize>,
    draft: String,
    pub approval: Option<PendingApproval>,
    /// The sandbox broker's live policy, when its network is brokered.
    pub network: Option<cordon_net::PolicyHandle>,
    pub picker: Option<Picker>,
    /// When Ctrl-C last did nothing but arm quitting.
    quit_armed: Option<Instant>,
    pub should_quit: bool,
    pub tick: u64,
    /// Images for the next message (`/attach`, a pasted path).
    pub attachments: Vec<String>,
    /// Working, or planning (`/plan`): shown on the status line.
    pub mode: cordon_agent::Mode,
}

pub const HELP: &str = "\
Enter sends · Alt+Enter, Shift+Enter or Ctrl+J: new line · Up/Down: earlier prompts
PgUp/PgDn, mouse wheel: scroll · End: follow new output · Ctrl+O: expand tool output
Ctrl+C: cancel the turn (twice: quit) · Ctrl+D on an empty box: quit
Tab: complete a /command, or a workspace path after @ (@src/ma → @src/main.rs)
!CMD   run CMD in the sandbox's shell yourself; the model sees it and its output next turn
/help  this help                /quit      leave
/clear new conversation, same sandbox (its shell, files and processes)
/new   new conversation in a fresh sandbox
/sessions pick an earlier session of this workspace (/sessions all: any)   /load ID  continue one
/undo  take back the last turn: its file changes and its messages   /rewind N  back to the end of turn N
/compact  summarise the conversation now   /model NAME  switch model   /cost  tokens and cost
/status  model, workspace, session, and the AGENTS.md files the model follows
/allow HOST[:PORT]  let the sandbox reach a host for this session (with --allow; alone: what it may reach)
/plan [TEXT]  plan mode: read-only tools, the model answers with a plan   /go [TEXT]  carry the plan out
/attach FILE  an image (PNG, JPEG, GIF, WebP) for your next message; or paste its path   /detach  drop them
/snapshot [NAME]  save the sandbox's root (what was installed; not the workspace) as an image for --image";

/// The slash commands, for Tab to complete.
const COMMANDS: &[&str] = &[
    "/allow",
    "/attach",
    "/clear",
    "/compact",
    "/cost",
    "/detach",
    "/exit",
    "/go",
    "/help",
    "/load",
    "/model",
    "/new",
    "/plan",
    "/quit",
    "/rewind",
    "/sessions",
    "/snapshot",
    "/status",
    "/undo",
];

/// The longest start every one of `words` shares.
fn common_start<'a>(words: &[&'a str]) -> &'a str {
    let first = words.first().copied().unwrap_or_default();
    let len = words.iter().fold(first.len(), |len, w| {
        first
            .bytes()
            .zip(w.bytes())
            .take(len)
            .take_while(|(a, b)| a == b)
            .count()
    });
    &first[..len]
}

fn new_input() -> TextArea<'static> {
    let mut t = TextArea::default();
    t.set_placeholder_text("Ask cordon to do something  (/help for keys and commands)");
    t.set_placeholder_style(crate::theme::dim());
    t.set_cursor_line_style(ratatui::style::Style::default());
    t.set_wrap_mode(ratatui_textarea::WrapMode::WordOrGlyph);
    t
}

impl App {
    pub fn new(status: Status) -> App {
        App {
            transcript: Transcript::default(),
            input: new_input(),
            status,
            busy: false,
            scroll: None,
            max_top: 0,
            view_height: 0,
            prompts: Vec::new(),
            recall: None,
            draft: String::new(),
            approval: None,
            network: None,
            picker: None,
            quit_armed: None,
            should_quit: false,
            tick: 0,
            attachments: Vec::new(),
            mode: cordon_agent::Mode::Work,
        }
    }

    pub fn input_text(&self) -> String {
        self.input.lines().join("\n")
    }

    fn set_input(&mut self, text: &str) {
        self.input = new_input();
        self.input.insert_str(text);
    }

    pub fn notice(&mut self, text: impl Into<String>) {
        self.transcript.push(Entry::Notice(text.into()));
    }

    pub fn error(&mut self, message: impl Into<String>) {
        let message = message.into();
        let hint = hint_for(&message);
        self.transcript.push(Entry::Error { message, hint });
    }

    // --- input ------------------------------------------------------------

    pub fn on_paste(&mut self, text: &str) {
        // Terminals send a pasted newline as CR; the prompt keeps it whole.
        let text = text.replace("\r\n", "\n").replace('\r', "\n");
        if self.picker.is_some() {
            return;
        }
        // A dropped image file arrives as its path: attach it.
        if let Some(path) = pasted_image_path(&text) {
            self.attach(&path);
            return;
        }
        self.input.insert_str(text);
    }

    pub fn on_mouse(&mut self, m: MouseEvent) {
        match m.kind {
            MouseEventKind::ScrollUp => self.scroll_up(3),
            MouseEventKind::ScrollDown => self.scroll_down(3),
            _ => {}
        }
    }

    pub fn scroll_up(&mut self, n: usize) {
        let top = self.scroll.unwrap_or(self.max_top);
        self.scroll = Some(top.saturating_sub(n));
    }

    pub fn scroll_down(&mut self, n: usize) {
        if let Some(top) = self.scroll {
            let top = top + n;
            self.scroll = if top >= self.max_top { None } else { Some(top) };
        }
    }

    pub fn on_key(&mut self, key: KeyEvent) -> Vec<Action> {
        if key.kind == KeyEventKind::Release {
            return Vec::new();
        }
        let ctrl = key.modifiers.contains(KeyModifiers::CONTROL);
        let alt = key.modifiers.contains(KeyModifiers::ALT);
        let shift = key.modifiers.contains(KeyModifiers::SHIFT);

        if ctrl && key.code == KeyCode::Char('c') {
            return self.on_ctrl_c();
        }
        self.quit_armed = None;
        if self.picker.is_some() {
            return self.picker_key(key);
        }
        if let Some(a) = &self.approval
            && !a.denying
        {
            return self.approval_key(key);
        }
        match key.code {
            KeyCode::Char('d') if ctrl && self.input.is_empty() => {
                self.should_quit = true;
                return vec![Action::Quit];
            }
            KeyCode::Char('o') if ctrl => {
                let on = !self.transcript.expanded();
                self.transcript.set_expanded(on);
            }
            KeyCode::Char('j') if ctrl => self.input.insert_newline(),
            // As in a shell, not the text area's undo.
            KeyCode::Char('u') if ctrl => {
                self.input.delete_line_by_head();
            }
            KeyCode::Enter if alt || shift => self.input.insert_newline(),
            KeyCode::Enter => return self.submit(),
            KeyCode::Tab if self.completes_a_command() => self.complete_command(),
            KeyCode::Tab if self.path_typed().is_some() => {
                let typed = self.path_typed().unwrap_or_default();
                return vec![Action::CompletePath(typed)];
            }
            KeyCode::PageUp => self.scroll_up(self.view_height.max(2) - 1),
            KeyCode::PageDown => self.scroll_down(self.view_height.max(2) - 1),
            KeyCode::End if ctrl || self.input.is_empty() => self.scroll = None,
            KeyCode::Home if ctrl => self.scroll = Some(0),
            KeyCode::Up if shift => self.scroll_up(1),
            KeyCode::Down if shift => self.scroll_down(1),
            KeyCode::Up if self.input.cursor().0 == 0 && !self.prompts.is_empty() => {
                self.recall_older()
            }
            KeyCode::Down
                if self.recall.is_some()
                    && self.input.cursor().0 + 1 >= self.input.lines().len() =>
            {
                self.recall_newer()
            }
            KeyCode::Esc => {
                if let Some(a) = &mut self.approval {
                    // Back from typing a reason to the choice.
                    a.denying = false;
                    self.set_input("");
                }
            }
            _ => {
                self.input.input(key);
            }
        }
        Vec::new()
    }

    /// Whether the box holds the start of a slash command and nothing else.
    fn completes_a_command(&self) -> bool {
        let text = self.input_text();
        text.starts_with('/') && !text.contains(char::is_whitespace)
    }

    /// Tab on `/co`: the one command it starts, with a space for its
    /// argument; of several, their common start, or (when that is all
    /// there is) the list of them.
    fn complete_command(&mut self) {
        let text = self.input_text();
        let matches: Vec<&str> = COMMANDS
            .iter()
            .copied()
            .filter(|c| c.starts_with(&text))
            .collect();
        match matches.as_slice() {
            [] => self.notice(format!(
                "No command starts with {}: /help lists them.",
                cordon_tools::printable(&text)
            )),
            [one] => self.set_input(&format!("{one} ")),
            many => {
                let common = common_start(many);
                if common.len() > text.len() {
                    self.set_input(common);
                } else {
                    self.notice(many.join("  "));
                }
            }
        }
    }

    /// The path typed after an `@` that starts the word before the cursor.
    fn path_typed(&self) -> Option<String> {
        let ratatui_textarea::DataCursor(row, col) = self.input.cursor();
        let line = self.input.lines().get(row)?;
        let before: String = line.chars().take(col).collect();
        let word = before.rsplit(char::is_whitespace).next()?;
        word.strip_prefix('@').map(str::to_string)
    }

    /// The workspace's entries starting with `typed` (after `@`), as the
    /// worker found them: one replaces what was typed (a file with a
    /// space after it, a directory with its `/`, to go on into); of
    /// several, their common start, or (when that is all there is) the
    /// list. Stale answers (the user typed on meanwhile) are dropped.
    pub fn complete_path(&mut self, typed: &str, found: Vec<String>) {
        if self.path_typed().as_deref() != Some(typed) {
            return;
        }
        let names: Vec<&str> = found.iter().map(String::as_str).collect();
        let replace = |app: &mut App, with: &str| {
            for _ in typed.chars() {
                app.input.delete_char();
            }
            app.input.insert_str(with);
        };
        match names.as_slice() {
            [] => self.notice(format!(
                "Nothing in the workspace starts with {}.",
                cordon_tools::printable(typed)
            )),
            [one] if one.ends_with('/') => replace(self, one),
            [one] => replace(self, &format!("{one} ")),
            many => {
                let common = common_start(many);
                if common.len() > typed.len() {
                    replace(self, common);
                } else {
                    let more = if many.len() >= crate::complete::MAX_MATCHES {
                        " …"
                    } else {
                        ""
                    };
                    self.notice(format!("{}{more}", many.join("  ")));
                }
            }
        }
    }

    fn on_ctrl_c(&mut self) -> Vec<Action> {
        if self.busy {
            // The approval prompt goes with the turn.
            if let Some(mut a) = self.approval.take()
                && let Some(tx) = a.reply.take()
            {
                let _ = tx.send(Answer::Deny("cancelled by the user".into()));
            }
            self.quit_armed = Some(Instant::now());
            return vec![Action::Cancel];
        }
        if self.picker.take().is_some() {
            return Vec::new();
        }
        if !self.input.is_empty() {
            self.set_input("");
            return Vec::new();
        }
        match self.quit_armed {
            Some(t) if t.elapsed() < Duration::from_secs(3) => {
                self.should_quit = true;
                vec![Action::Quit]
            }
            _ => {
                self.quit_armed = Some(Instant::now());
                self.notice("Press Ctrl+C again to quit.");
                Vec::new()
            }
        }
    }

    fn recall_older(&mut self) {
        let i = match self.recall {
            None => {
                self.draft = self.input_text();
                self.prompts.len() - 1
            }
            Some(0) => 0,
            Some(i) => i - 1,
        };
        self.recall = Some(i);
        let p = self.prompts[i].clone();
        self.set_input(&p);
    }

    fn recall_newer(&mut self) {
        match self.recall {
            Some(i) if i + 1 < self.prompts.len() => {
                self.recall = Some(i + 1);
                let p = self.prompts[i + 1].clone();
                self.set_input(&p);
            }
            _ => {
                self.recall = None;
                let d = std::mem::take(&mut self.draft);
                self.set_input(&d);
            }
        }
    }

    fn submit(&mut self) -> Vec<Action> {
        let text = self.input_text();
        if let Some(a) = &mut self.approval
            && a.denying
        {
            self.set_input("");
            self.answer(Answer::Deny(text.trim().to_string()));
            return Vec::new();
        }
        if text.trim().is_empty() {
            return Vec::new();
        }
        self.set_input("");
        self.recall = None;
        if self.prompts.last() != Some(&text) {
            self.prompts.push(text.clone());
        }
        let trimmed = text.trim();
        if trimmed.starts_with('/') && !trimmed.contains('\n') {
            return self.command(trimmed);
        }
        if let Some(command) = trimmed.strip_prefix('!') {
            return self.shell(&text, command.trim());
        }
        if self.busy {
            self.notice("A turn is running: wait for it, or press Ctrl+C to cancel it.");
            self.set_input(&text);
            return Vec::new();
        }
        self.send(text)
    }

    /// Sends `text`, with the images attached so far.
    fn send(&mut self, text: String) -> Vec<Action> {
        let attach = std::mem::take(&mut self.attachments);
        self.transcript
            .push(Entry::User(crate::transcript::with_attachments(
                &text,
                attach.len(),
            )));
        self.scroll = None;
        self.busy = true;
        vec![Action::Send(Prompt { text, attach })]
    }

    /// Adds an image for the next message.
    fn attach(&mut self, path: &str) {
        self.attachments.push(path.to_string());
        self.notice(format!(
            "Attached {path}: it goes with your next message ({} in all; /detach drops them).",
            self.attachments.len()
        ));
    }

    /// `!cmd`: the command runs in the sandbox's shell, as a turn would.
    fn shell(&mut self, text: &str, command: &str) -> Vec<Action> {
        if command.is_empty() {
            self.error("! needs a command: `!ls -la` runs ls in the sandbox");
            return Vec::new();
        }
        if self.busy {
            self.notice("!commands wait until the turn ends (Ctrl+C cancels it).");
            self.set_input(text);
            return Vec::new();
        }
        self.transcript.push(Entry::User(text.to_string()));
        self.scroll = None;
        self.busy = true;
        vec![Action::Shell(command.to_string())]
    }

    fn command(&mut self, line: &str) -> Vec<Action> {
        let (cmd, arg) = match line.split_once(char::is_whitespace) {
            Some((c, a)) => (c, a.trim()),
            None => (line, ""),
        };
        let needs_idle = matches!(
            cmd,
            "/clear"
                | "/new"
                | "/load"
                | "/compact"
                | "/sessions"
                | "/undo"
                | "/rewind"
                | "/snapshot"
        );
        if needs_idle && self.busy {
            self.notice(format!(
                "{cmd} waits until the turn ends (Ctrl+C cancels it)."
            ));
            return Vec::new();
        }
        match cmd {
            "/help" | "/?" => {
                self.notice(HELP);
                Vec::new()
            }
            "/quit" | "/exit" | "/q" => {
                self.should_quit = true;
                vec![Action::Quit]
            }
            "/clear" => {
                self.transcript.clear();
                self.scroll = None;
                vec![Action::Clear]
            }
            "/new" => {
                self.transcript.clear();
                self.scroll = None;
                vec![Action::New]
            }
            "/attach" if arg.is_empty() => {
                if self.attachments.is_empty() {
                    self.notice("No images attached: /attach FILE adds one (PNG, JPEG, GIF or WebP, up to 5 MiB), or paste its path.");
                } else {
                    self.notice(format!(
                        "Attached for the next message: {}",
                        self.attachments.join(", ")
                    ));
                }
                Vec::new()
            }
            "/attach" => {
                self.attach(arg);
                Vec::new()
            }
            "/detach" => {
                let n = self.attachments.len();
                self.attachments.clear();
                self.notice(format!(
                    "Dropped {}.",
                    cordon_tools::plural(n as u64, "attachment")
                ));
                Vec::new()
            }
            "/sessions" => vec![Action::ListSessions { all: arg == "all" }],
            "/load" if arg.is_empty() => {
                self.error("/load needs a session id (see /sessions)");
                Vec::new()
            }
            "/load" => vec![Action::Load(arg.to_string())],
            "/undo" => vec![Action::Rewind(None)],
            "/rewind" => match arg.parse::<u64>() {
                Ok(n) => vec![Action::Rewind(Some(n))],
                Err(_) => {
                    self.error("/rewind needs a turn number: 0 is before the first prompt");
                    Vec::new()
                }
            },
            "/compact" => {
                self.busy = true;
                vec![Action::Compact]
            }
            "/snapshot" => vec![Action::Snapshot((!arg.is_empty()).then(|| arg.to_string()))],
            "/plan" | "/go" if self.busy => {
                self.notice("A turn is running: wait for it, or press Ctrl+C to cancel it.");
                Vec::new()
            }
            "/plan" => {
                self.mode = cordon_agent::Mode::Plan;
                self.notice(
                    "Plan mode: the model reads and plans, and changes nothing. /go carries the plan out.",
                );
                let mut actions = vec![Action::SetMode(cordon_agent::Mode::Plan)];
                if !arg.is_empty() {
                    actions.extend(self.send(arg.to_string()));
                }
                actions
            }
            "/go" if self.mode != cordon_agent::Mode::Plan => {
                self.notice("/go ends plan mode, and this is not plan mode: /plan starts it.");
                Vec::new()
            }
            "/go" => {
                self.mode = cordon_agent::Mode::Work;
                let mut text = "The plan is approved: carry it out now, step by step.".to_string();
                if !arg.is_empty() {
                    text.push_str(&format!("\n\n{arg}"));
                }
                let mut actions = vec![Action::SetMode(cordon_agent::Mode::Work)];
                actions.extend(self.send(text));
                actions
            }
            "/model" if arg.is_empty() => {
                self.notice(format!("The model is {}.", self.status.model));
                Vec::new()
            }
            "/model" => {
                self.status.model = arg.to_string();
                self.notice(format!("From the next request on, the model is {arg}."));
                vec![Action::SetModel(arg.to_string())]
            }
            "/allow" if arg.is_empty() => {
                self.notice(match &self.network {
                    Some(p) => format!(
                        "The sandbox may reach: {}. /allow HOST[:PORT] adds one for this session.",
                        p.load().summary()
                    ),
                    None => {
                        "This session's network is not brokered (start cordon with --allow HOST)."
                            .into()
                    }
                });
                Vec::new()
            }
            "/allow" => match arg.parse::<cordon_net::Rule>() {
                Ok(rule) => vec![Action::AllowHost(rule)],
                Err(e) => {
                    self.error(format!("/allow {arg}: {e}"));
                    Vec::new()
                }
            },
            "/status" => {
                let text = self.status_text();
                self.notice(text);
                Vec::new()
            }
            "/cost" => {
                let u = self.status.usage;
                let cost = match self.status.cost_usd {
                    Some(c) => format!("${c:.4} at list prices"),
                    None => "cost unknown for this model".into(),
                };
                self.notice(format!(
                    "This session: {} input tokens ({} read from cache, {} written to it), {} output tokens; {cost}.",
                    u.prompt_tokens(),
                    u.cache_read_tokens,
                    u.cache_write_tokens,
                    u.output_tokens
                ));
                Vec::new()
            }
            other => {
                self.error(format!("unknown command {other}: /help lists them"));
                Vec::new()
            }
        }
    }

    /// What `/status` says: the model, where it works, and what it was
    /// told to follow.
    fn status_text(&self) -> String {
        let s = &self.status;
        let mut out = format!(
            "Model {} · workspace {} · sandbox {}{} · session {}",
            s.model,
            s.workspace,
            match s.sandbox {
                SandboxState::Starting => "starting",
                SandboxState::Ready => "ready",
                SandboxState::Busy => "busy",
                SandboxState::Closed => "closed",
            },
            if s.backend == "native" {
                String::new()
            } else {
                format!(" ({})", s.backend)
            },
            s.session.as_deref().unwrap_or("not saved yet"),
        );
        if s.instructions.is_empty() {
            out.push_str("\nInstructions: no AGENTS.md was found.");
        } else {
            out.push_str("\nInstructions read, in order:");
            for i in &s.instructions {
                match i.cut_at {
                    Some(n) => out.push_str(&format!(
                        "\n  {} (the first {n} of its {} bytes)",
                        i.path, i.bytes
                    )),
                    None => out.push_str(&format!("\n  {} ({} bytes)", i.path, i.bytes)),
                }
            }
        }
        out
    }

    // --- approvals ----------------------------------------------------------

    /// Asks about a tool call; `before` is a `write_file` target's current
    /// content (`None`: a new file), shown as what the write deletes.
    pub fn ask_approval(
        &mut self,
        id: String,
        name: String,
        input: Value,
        before: Option<String>,
        prefix: Option<Vec<String>>,
        reply: oneshot::Sender<Answer>,
    ) {
        let mut label = None;
        if let Some(i) = self.transcript.tool_index(&id)
            && let Some(Entry::Tool(call)) = self.transcript.get_mut(i)
        {
            call.state = ToolState::Pending;
            call.before = before;
            label = Some(call.label.clone());
        }
        self.scroll = None;
        self.approval = Some(PendingApproval {
            label: label.unwrap_or_else(|| cordon_tools::label::generic(&input)),
            id,
            name,
            input,
            prefix,
            reply: Some(reply),
            denying: false,
        });
    }

    fn approval_key(&mut self, key: KeyEvent) -> Vec<Action> {
        match key.code {
            KeyCode::Char('y') | KeyCode::Enter => self.answer(Answer::Once),
            KeyCode::Char('a') => self.answer(Answer::Always),
            KeyCode::Char('p') => {
                if let Some(prefix) = self.approval.as_ref().and_then(|a| a.prefix.clone()) {
                    self.answer(Answer::Prefix(prefix));
                }
            }
            KeyCode::Char('n') | KeyCode::Esc => {
                if let Some(a) = &mut self.approval {
                    a.denying = true;
                    self.set_input("");
                }
            }
            KeyCode::PageUp => self.scroll_up(self.view_height.max(2) - 1),
            KeyCode::PageDown => self.scroll_down(self.view_height.max(2) - 1),
            _ => {}
        }
        Vec::new()
    }

    fn answer(&mut self, answer: Answer) {
        let Some(mut a) = self.approval.take() else {
            return;
        };
        if let Some(i) = self.transcript.tool_index(&a.id)
            && let Some(Entry::Tool(call)) = self.transcript.get_mut(i)
        {
            call.state = ToolState::Running;
        }
        if let Answer::Always = answer {
            self.notice(format!(
                "{} runs without asking for the rest of this session.",
                a.name
            ));
        }
        if let Some(tx) = a.reply.take() {
            let _ = tx.send(answer);
        }
    }

    // --- session picker -------------------------------------------------------

    pub fn show_sessions(&mut self, sessions: Vec<SessionSummary>) {
        if sessions.is_empty() {
            self.notice("No earlier sessions in this workspace (/sessions all lists every one).");
            return;
        }
        self.picker = Some(Picker {
            sessions,
            filter: String::new(),
            selected: 0,
            now: std::time::SystemTime::now(),
        });
    }

    fn picker_key(&mut self, key: KeyEvent) -> Vec<Action> {
        let Some(p) = &mut self.picker else {
            return Vec::new();
        };
        match key.code {
            // A terminal sends Escape as ESC, and ESC followed at once by a
            // character as that character with Alt: Escape typed just
            // before `/load ID` arrived as Alt+/ and left the picker open,
            // whose Enter then loaded the highlighted session. Such a key
            // closes the picker and is typed as what it was.
            KeyCode::Char(c) if key.modifiers.contains(KeyModifiers::ALT) => {
                self.picker = None;
                return self.on_key(KeyEvent::new(
                    KeyCode::Char(c),
                    key.modifiers - KeyModifiers::ALT,
                ));
            }
            KeyCode::Up => p.selected = p.selected.saturating_sub(1),
            KeyCode::Down => p.selected += 1,
            KeyCode::PageUp => p.selected = p.selected.saturating_sub(self.view_height.max(2) / 2),
            KeyCode::PageDown => p.selected += self.view_height.max(2) / 2,
            KeyCode::Home => p.selected = 0,
            KeyCode::End => p.selected = usize::MAX,
            KeyCode::Esc => {
                self.picker = None;
                return Vec::new();
            }
            KeyCode::Enter => {
                let id = p.shown().get(p.selected).map(|s| s.id.clone());
                if let Some(id) = id {
                    self.picker = None;
                    return vec![Action::Load(id)];
                }
            }
            KeyCode::Backspace => {
                p.filter.pop();
                p.selected = 0;
            }
            KeyCode::Char(c) if !key.modifiers.contains(KeyModifiers::CONTROL) => {
                p.filter.push(c);
                p.selected = 0;
            }
            _ => {}
        }
        // Within the list, however it moved or narrowed.
        let n = p.shown().len();
        p.selected = p.selected.min(n.saturating_sub(1));
        Vec::new()
    }

    // --- the agent's events ---------------------------------------------------

    pub fn on_agent_event(&mut self, ev: AgentEvent) {
        match ev {
            AgentEvent::TurnStarted { .. } => {}
            AgentEvent::TextDelta { text } => self.transcript.append_assistant(&text),
            AgentEvent::ThinkingDelta { text } => self.transcript.append_thinking(&text),
            AgentEvent::Retrying {
                attempt,
                wait_ms,
                reason,
            } => {
                self.transcript.drop_streamed();
                self.notice(format!(
                    "retrying (attempt {attempt}) in {:.1} s: {reason}",
                    wait_ms as f64 / 1000.0
                ));
            }
            AgentEvent::ToolCallStarted {
                id,
                name,
                input,
                label,
            } => {
                self.status.sandbox = SandboxState::Busy;
                let label = cordon_tools::label::or_generic(label, &input);
                self.transcript.push(Entry::Tool(ToolCall {
                    id,
                    name,
                    input,
                    label,
                    state: ToolState::Running,
                    before: None,
                    live: String::new(),
                }));
            }
            AgentEvent::ToolOutput { id, text, .. } => {
                if let Some(i) = self.transcript.tool_index(&id)
                    && let Some(Entry::Tool(call)) = self.transcript.get_mut(i)
                {
                    call.push_live(&text);
                }
            }
            AgentEvent::ToolCallFinished {
                id,
                output,
                is_error,
                structured,
                duration_ms,
                ..
            } => {
                if let Some(i) = self.transcript.tool_index(&id)
                    && let Some(Entry::Tool(call)) = self.transcript.get_mut(i)
                {
                    call.state = ToolState::Done {
                        output,
                        // A command that exited non-zero is marked failed.
                        is_error: cordon_agent::tool_failed(is_error, structured.as_ref()),
                        duration_ms,
                    };
                }
                let running = self.transcript.entries().iter().any(|e| {
                    matches!(
                        e,
                        Entry::Tool(ToolCall {
                            state: ToolState::Running | ToolState::Pending,
                            ..
                        })
                    )
                });
                if !running {
                    self.status.sandbox = SandboxState::Ready;
                }
            }
            AgentEvent::PlanUpdated { plan } => self.transcript.set_plan(plan),
            AgentEvent::HookFailed { message, .. } => self.notice(message),
            AgentEvent::AssistantMessage { usage, .. } => {
                self.status.usage += usage;
                self.status.cost_usd =
                    cordon_agent::pricing::cost(&self.status.model, &self.status.usage);
            }
            AgentEvent::CompactionStarted { reason } => {
                self.notice(format!("Compacting the conversation: {reason}"));
            }
            AgentEvent::Compacted {
                replaced_messages,
                tokens_before,
                tokens_after,
                ..
            } => {
                self.status.context_tokens = tokens_after;
                self.notice(format!(
                    "Compacted {replaced_messages} messages into a summary: ~{tokens_before} → ~{tokens_after} tokens."
                ));
            }
            AgentEvent::TurnCompleted {
                context_tokens,
                context_window,
                ..
            } => {
                self.status.context_tokens = context_tokens;
                self.status.context_window = context_window;
            }
            AgentEvent::Error { message } => self.error(message),
            // The line the broker wrote; the transcript makes it printable.
            AgentEvent::NetworkRefused {
                message,
                host,
                port,
                ..
            } => {
                self.notice(format!(
                    "{message}\n/allow {host}:{port} lets it through for this session"
                ));
            }
        }
    }

    /// The turn (or compaction) has ended; `error` says why, if it failed.
    pub fn turn_done(&mut self, error: Option<String>, cancelled: bool) {
        self.busy = false;
        self.approval = None;
        self.status.sandbox = match self.status.sandbox {
            SandboxState::Busy => SandboxState::Ready,
            s => s,
        };
        if cancelled {
            self.notice("Cancelled. The conversation is intact: send the next message when ready.");
        } else if let Some(e) = error {
            // The agent has already reported it as an event unless it is new.
            let seen =
                self.transcript.entries().last().is_some_and(
                    |last| matches!(last, Entry::Error { message, .. } if *message == e),
                );
            if !seen {
                self.error(e);
            }
        }
    }
}

/// What to do about an error, where cordon can tell.
pub fn hint_for(message: &str) -> Option<String> {
    let m = message.to_ascii_lowercase();
    let h = if m.starts_with("mcp server") {
        "Check [mcp_servers] in your configuration; `cordon mcp list` shows what each server says."
    } else if m.contains("api key") || m.contains("authentication") || m.contains("401") {
        "Check ANTHROPIC_API_KEY (or OPENAI_API_KEY) in the environment, .env or `cordon config`."
    } else if m.contains("model") && (m.contains("not found") || m.contains("unknown")) {
        "Pick another model with /model NAME (`cordon config` shows the current one)."
    } else if m.contains("context") && (m.contains("too long") || m.contains("window")) {
        "Try /compact, or /clear to start over in the same sandbox."
    } else if m.contains("connect") || m.contains("unreachable") || m.contains("connection refused")
    {
        "Is the model server running? Check ANTHROPIC_BASE_URL / OPENAI_BASE_URL, then send again."
    } else if m.contains("overloaded")
        || m.contains("rate")
        || m.contains("429")
        || m.contains("529")
    {
        "The provider is busy: wait a moment and send your message again."
    } else if m.contains("step limit") || m.contains("steps") {
        "Say \"continue\" to let it go on."
    } else if m.starts_with("unknown command") || m.starts_with("/load") {
        return None;
    } else {
        "Send your message again, or /help for what else to try."
    };
    Some(h.to_string())
}
