//! The terminal: set it up, run the event loop, and put it back as it was
//! on every way out (quit, error, panic, SIGTERM, SIGHUP).

use std::io::{self, Write};
use std::sync::Once;
use std::time::Duration;

use cordon_agent::Cancel;
use crossterm::event::{
    DisableBracketedPaste, DisableMouseCapture, EnableBracketedPaste, EnableMouseCapture, Event,
    EventStream, KeyboardEnhancementFlags, PopKeyboardEnhancementFlags,
    PushKeyboardEnhancementFlags,
};
use crossterm::terminal::{
    EnterAlternateScreen, LeaveAlternateScreen, disable_raw_mode, enable_raw_mode,
};
use crossterm::{cursor, execute};
use futures_util::StreamExt;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::mpsc;

use crate::app::{Action, App, SandboxState, Status};
use crate::transcript::Transcript;
use crate::view;
use crate::worker::{Request, Update, Worker};

/// How the UI ended.
pub struct Outcome {
    /// The session the conversation was saved as, if it was.
    pub session: Option<String>,
}

static KEYBOARD_PUSHED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Undoes everything `setup` did. Safe to call twice, and from a panic.
fn restore() {
    let mut out = io::stdout();
    if KEYBOARD_PUSHED.swap(false, std::sync::atomic::Ordering::SeqCst) {
        let _ = execute!(out, PopKeyboardEnhancementFlags);
    }
    let _ = execute!(
        out,
        DisableBracketedPaste,
        DisableMouseCapture,
        LeaveAlternateScreen,
        cursor::Show
    );
    let _ = disable_raw_mode();
    let _ = out.flush();
}

fn setup() -> io::Result<Terminal<CrosstermBackend<io::Stdout>>> {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            // The message must land on a normal screen to be read.
            restore();
            previous(info);
        }));
    });
    enable_raw_mode()?;
    let mut out = io::stdout();
    execute!(
        out,
        EnterAlternateScreen,
        EnableBracketedPaste,
        EnableMouseCapture
    )?;
    // Where the terminal supports it, Shift+Enter is told apart from Enter.
    if matches!(
        crossterm::terminal::supports_keyboard_enhancement(),
        Ok(true)
    ) {
        execute!(
            out,
            PushKeyboardEnhancementFlags(KeyboardEnhancementFlags::DISAMBIGUATE_ESCAPE_CODES)
        )?;
        KEYBOARD_PUSHED.store(true, std::sync::atomic::Ordering::SeqCst);
    }
    let terminal = Terminal::new(CrosstermBackend::new(out))?;
    Ok(terminal)
}

/// Runs the UI until the user quits. `status` is what the status line
/// starts with; `worker` owns the conversation.
pub async fn run(status: Status, worker: Worker) -> io::Result<Outcome> {
    let mut terminal = setup().inspect_err(|_| restore())?;
    let result = event_loop(&mut terminal, status, worker).await;
    restore();
    result
}

async fn event_loop(
    terminal: &mut Terminal<CrosstermBackend<io::Stdout>>,
    status: Status,
    worker: Worker,
) -> io::Result<Outcome> {
    let mut app = App::new(status);
    app.mode = worker.mode;
    if let Some(r) = &worker.resume {
        app.prompts = r
            .history
            .iter()
            .filter_map(|m| match m {
                cordon_agent::Message::User { text, .. } if !text.is_empty() => Some(text.clone()),
                _ => None,
            })
            .collect();
    }
    // Where `@` completes from: the sandbox's workspace, followed through
    // a /load to another.
    let mut workspace = worker.sandbox.workspace.clone();
    let (req_tx, req_rx) = mpsc::unbounded_channel();
    let (ev_tx, mut ev_rx) = mpsc::unbounded_channel();
    let (up_tx, mut up_rx) = mpsc::unbounded_channel();
    let cancel = Cancel::new();
    let worker_task = tokio::spawn(worker.run(req_rx, ev_tx, up_tx, cancel.clone()));

    let (paths_tx, mut paths_rx) = mpsc::unbounded_channel::<(String, Vec<String>)>();
    let mut input = EventStream::new();
    let mut spinner = tokio::time::interval(Duration::from_millis(100));
    spinner.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut sigterm = signal(SignalKind::terminate())?;
    let mut sighup = signal(SignalKind::hangup())?;
    let mut session = None;
    let mut dirty = true;

    loop {
        if dirty {
            terminal.draw(|f| view::draw(f, &mut app))?;
            dirty = false;
        }
        if app.should_quit {
            break;
        }
        let mut actions = Vec::new();
        tokio::select! {
            Some(ev) = ev_rx.recv() => {
                app.on_agent_event(ev);
                // Take whatever else has arrived before drawing once.
                while let Ok(ev) = ev_rx.try_recv() {
                    app.on_agent_event(ev);
                }
                dirty = true;
            }
            Some(u) = up_rx.recv() => {
                // Events sent before this update are already queued.
                while let Ok(ev) = ev_rx.try_recv() {
                    app.on_agent_event(ev);
                }
                if let Update::Session { workspace: w, .. } = &u {
                    workspace = w.clone();
                }
                if let Some(id) = on_update(&mut app, u) {
                    session = Some(id);
                }
                dirty = true;
            }
            Some((typed, found)) = paths_rx.recv() => {
                app.complete_path(&typed, found);
                dirty = true;
            }
            ev = input.next() => match ev {
                Some(Ok(Event::Key(k))) => { actions = app.on_key(k); dirty = true; }
                Some(Ok(Event::Paste(s))) => { app.on_paste(&s); dirty = true; }
                Some(Ok(Event::Mouse(m))) => { app.on_mouse(m); dirty = true; }
                Some(Ok(Event::Resize(..))) => {
                    // ratatui resizes its buffers on the next draw.
                    dirty = true;
                }
                Some(Ok(_)) => {}
                Some(Err(e)) => return Err(e),
                None => break,
            },
            _ = spinner.tick(), if app.busy => {
                app.tick += 1;
                dirty = true;
            }
            _ = sigterm.recv() => break,
            _ = sighup.recv() => break,
        }
        for a in actions {
            let req = match a {
                Action::Send(prompt) => Request::Send(prompt),
                Action::Cancel => {
                    cancel.cancel();
                    continue;
                }
                Action::Quit => {
                    app.should_quit = true;
                    continue;
                }
                Action::Compact => Request::Compact,
                Action::Snapshot(name) => Request::Snapshot(name),
                Action::SetModel(m) => Request::SetModel(m),
                Action::SetMode(m) => Request::SetMode(m),
                Action::Clear => Request::Clear,
                Action::New => {
                    app.status.sandbox = SandboxState::Starting;
                    Request::New
                }
                Action::ListSessions { all } => Request::ListSessions { all },
                Action::Load(id) => Request::Load(id),
                Action::Rewind(turn) => Request::Rewind(turn),
                Action::Shell(command) => Request::Shell(command),
                // Off the UI's task: the workspace may be large, or busy.
                Action::CompletePath(typed) => {
                    let (ws, tx) = (workspace.clone(), paths_tx.clone());
                    tokio::task::spawn_blocking(move || {
                        let found = crate::complete::paths(&ws, &typed);
                        let _ = tx.send((typed, found));
                    });
                    continue;
                }
                // At once, even mid-turn: the broker reads the policy for
                // each new connection.
                Action::AllowHost(rule) => {
                    match &app.network {
                        Some(policy) => {
                            let line = format!("network: {rule} allowed for this session");
                            policy.set(policy.load().widened([rule]));
                            app.notice(line);
                        }
                        None => app.error(
                            "this session's network is not brokered: start cordon with --allow HOST to let hosts through",
                        ),
                    }
                    continue;
                }
            };
            if req_tx.send(req).is_err() {
                app.error("the conversation has stopped; restart cordon");
            }
        }
    }

    // Leave: stop the turn, let the worker close the sandbox.
    cancel.cancel();
    drop(req_tx);
    drop(up_rx);
    let _ = tokio::time::timeout(Duration::from_secs(10), worker_task).await;
    Ok(Outcome { session })
}

/// Applies a worker update; returns the session id when it changes.
fn on_update(app: &mut App, u: Update) -> Option<String> {
    match u {
        Update::Ready { network, ports } => {
            app.status.sandbox = SandboxState::Ready;
            app.network = network;
            for (addr, port) in ports {
                app.notice(cordon_sandbox::forwarded(addr, port));
            }
        }
        Update::Instructions(read) => app.status.instructions = read,
        Update::SandboxFailed(e) => {
            app.status.sandbox = SandboxState::Closed;
            app.error(e);
        }
        Update::Done { error, cancelled } => app.turn_done(error, cancelled),
        Update::Approval {
            id,
            name,
            input,
            before,
            prefix,
            reply,
        } => app.ask_approval(id, name, input, before, prefix, reply),
        Update::Sessions(list) => app.show_sessions(list),
        Update::Session {
            id,
            workspace,
            history,
            labels,
            usage,
        } => {
            app.status.session = Some(id.clone());
            app.status.workspace = workspace.display().to_string();
            if let Some(h) = history {
                app.transcript = Transcript::from_history(&h, &labels);
                app.status.usage = usage;
                app.status.cost_usd = cordon_agent::pricing::cost(&app.status.model, &usage);
                app.notice(format!("Continuing session {id}."));
                app.scroll = None;
            }
            return Some(id);
        }
        Update::Notice(n) => app.notice(n),
        Update::Error(e) => app.error(e),
    }
    None
}
