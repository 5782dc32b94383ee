//! The UI's behaviour under keys, the mouse and streamed output, on
//! ratatui's `TestBackend`: prompt recall, commands, quitting, scrolling
//! and following new output, resizing.

use cordon_agent::{AgentEvent, Usage};
use cordon_tui::app::Action;
use cordon_tui::{App, SandboxState, Status};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers, MouseEvent, MouseEventKind};
use ratatui::Terminal;
use ratatui::backend::TestBackend;

fn app() -> App {
    App::new(Status {
        model: "claude-sonnet-4-5".into(),
        workspace: "/w".into(),
        sandbox: SandboxState::Ready,
        backend: String::new(),
        session: None,
        usage: Usage::default(),
        cost_usd: None,
        context_tokens: 0,
        context_window: 200_000,
        instructions: Vec::new(),
    })
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn type_text(app: &mut App, text: &str) {
    for c in text.chars() {
        app.on_key(key(KeyCode::Char(c)));
    }
}

/// The transcript's last entry, as debug text.
fn last(a: &App) -> String {
    format!("{:?}", a.transcript.entries().last())
}

fn enter(app: &mut App) -> Vec<Action> {
    app.on_key(key(KeyCode::Enter))
}

fn screen(t: &Terminal<TestBackend>) -> Vec<String> {
    let buf = t.backend().buffer();
    (0..buf.area.height)
        .map(|y| {
            (0..buf.area.width)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>()
                .trim_end()
                .to_string()
        })
        .collect()
}

fn draw(t: &mut Terminal<TestBackend>, app: &mut App) -> Vec<String> {
    t.draw(|f| cordon_tui::view::draw(f, app)).unwrap();
    screen(t)
}

#[test]
fn up_and_down_recall_earlier_prompts_and_keep_the_draft() {
    let mut a = app();
    for p in ["first", "second"] {
        type_text(&mut a, p);
        assert_eq!(enter(&mut a), vec![Action::Send(p.into())]);
        a.turn_done(None, false);
    }
    type_text(&mut a, "draft");
    a.on_key(key(KeyCode::Up));
    assert_eq!(a.input_text(), "second");
    a.on_key(key(KeyCode::Up));
    assert_eq!(a.input_text(), "first");
    a.on_key(key(KeyCode::Up));
    assert_eq!(a.input_text(), "first");
    a.on_key(key(KeyCode::Down));
    assert_eq!(a.input_text(), "second");
    a.on_key(key(KeyCode::Down));
    assert_eq!(a.input_text(), "draft");
}

#[test]
fn commands_become_actions_and_nothing_is_sent_while_a_turn_runs() {
    let mut a = app();
    type_text(&mut a, "/model claude-opus-4-1");
    assert_eq!(
        enter(&mut a),
        vec![Action::SetModel("claude-opus-4-1".into())]
    );
    assert_eq!(a.status.model, "claude-opus-4-1");
    for (cmd, action) in [
        ("/clear", Action::Clear),
        ("/new", Action::New),
        ("/sessions", Action::ListSessions { all: false }),
        ("/sessions all", Action::ListSessions { all: true }),
        ("/load 1795382010", Action::Load("1795382010".into())),
        ("/undo", Action::Rewind(None)),
        ("/rewind 0", Action::Rewind(Some(0))),
        ("/rewind 12", Action::Rewind(Some(12))),
        ("/snapshot", Action::Snapshot(None)),
        (
            "/snapshot team/env:2",
            Action::Snapshot(Some("team/env:2".into())),
        ),
    ] {
        type_text(&mut a, cmd);
        assert_eq!(enter(&mut a), vec![action], "{cmd}");
    }
    // A turn number it cannot read is an error, not a rewind.
    type_text(&mut a, "/rewind last");
    assert_eq!(enter(&mut a), vec![]);
    type_text(&mut a, "/compact");
    assert_eq!(enter(&mut a), vec![Action::Compact]);
    assert!(a.busy);
    // While busy: prompts, /clear and /undo wait, the text stays in the box.
    type_text(&mut a, "/clear");
    assert_eq!(enter(&mut a), vec![]);
    a.on_key(KeyEvent::new(KeyCode::Char('u'), KeyModifiers::CONTROL));
    type_text(&mut a, "/undo");
    assert_eq!(enter(&mut a), vec![]);
    a.on_key(KeyEvent::new(KeyCode::Char('u'), KeyModifiers::CONTROL));
    type_text(&mut a, "another task");
    assert_eq!(enter(&mut a), vec![]);
    assert_eq!(a.input_text(), "another task");
    // Ctrl-C cancels the running turn.
    assert_eq!(
        a.on_key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL)),
        vec![Action::Cancel]
    );
    a.turn_done(None, true);
    assert!(!a.busy);
    assert_eq!(enter(&mut a), vec![Action::Send("another task".into())]);
    a.turn_done(None, false);
    // Unknown commands are errors, not prompts.
    type_text(&mut a, "/frobnicate");
    assert_eq!(enter(&mut a), vec![]);
    // /cost and /help only add to the transcript.
    type_text(&mut a, "/cost");
    assert_eq!(enter(&mut a), vec![]);
    type_text(&mut a, "/help");
    assert_eq!(enter(&mut a), vec![]);
    let mut t = Terminal::new(TestBackend::new(100, 40)).unwrap();
    let s = draw(&mut t, &mut a).join("\n");
    assert!(
        s.contains("✗ unknown command /frobnicate: /help lists them"),
        "{s}"
    );
    assert!(s.contains("· This session: 0 input tokens"), "{s}");
    assert!(
        s.contains("/compact  summarise the conversation now"),
        "{s}"
    );
}

#[test]
fn ctrl_c_twice_or_ctrl_d_on_an_empty_box_quits() {
    let mut a = app();
    let ctrl = |c| KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL);
    type_text(&mut a, "half-typed");
    // The first Ctrl-C clears the box, the next arms, the next quits.
    assert_eq!(a.on_key(ctrl('c')), vec![]);
    assert_eq!(a.input_text(), "");
    assert_eq!(a.on_key(ctrl('c')), vec![]);
    assert!(!a.should_quit);
    assert_eq!(a.on_key(ctrl('c')), vec![Action::Quit]);
    assert!(a.should_quit);

    let mut b = app();
    type_text(&mut b, "x");
    assert_eq!(b.on_key(ctrl('d')), vec![], "not on a non-empty box");
    b.on_key(key(KeyCode::Backspace));
    assert_eq!(b.on_key(ctrl('d')), vec![Action::Quit]);
}

#[test]
fn the_view_follows_output_unless_scrolled_up() {
    let mut a = app();
    type_text(&mut a, "count");
    enter(&mut a);
    let mut t = Terminal::new(TestBackend::new(40, 12)).unwrap();
    for i in 1..=30 {
        a.on_agent_event(AgentEvent::TextDelta {
            text: format!("line {i}\n\n"),
        });
    }
    let s = draw(&mut t, &mut a);
    assert!(s.contains(&"line 30".to_string()), "follows: {s:#?}");
    // The wheel scrolls up; new output no longer moves the view.
    a.on_mouse(MouseEvent {
        kind: MouseEventKind::ScrollUp,
        column: 0,
        row: 0,
        modifiers: KeyModifiers::NONE,
    });
    let before = draw(&mut t, &mut a);
    assert!(!before.contains(&"line 30".to_string()), "{before:#?}");
    a.on_agent_event(AgentEvent::TextDelta {
        text: "line 31\n\n".into(),
    });
    let after = draw(&mut t, &mut a);
    assert_eq!(before[..6], after[..6], "the view stayed put");
    assert!(
        after.iter().any(|l| l.contains("more rows (End)")),
        "{after:#?}"
    );
    // End follows again.
    a.on_key(key(KeyCode::End));
    let s = draw(&mut t, &mut a);
    assert!(s.contains(&"line 31".to_string()), "{s:#?}");
    // PageUp, then PageDown back to the bottom, follows too.
    a.on_key(key(KeyCode::PageUp));
    draw(&mut t, &mut a);
    assert!(a.scroll.is_some());
    a.on_key(key(KeyCode::PageDown));
    draw(&mut t, &mut a);
    assert!(a.scroll.is_none());
}

#[test]
fn a_resize_redraws_to_the_new_size() {
    let mut a = app();
    type_text(&mut a, "go");
    enter(&mut a);
    a.on_agent_event(AgentEvent::TextDelta {
        text: "A sentence long enough that it has to wrap on a narrow screen.".into(),
    });
    let mut t = Terminal::new(TestBackend::new(80, 10)).unwrap();
    let wide = draw(&mut t, &mut a);
    assert!(
        wide.iter().any(|l| l.ends_with("narrow screen.")),
        "{wide:#?}"
    );
    t.backend_mut().resize(30, 16);
    t.resize(ratatui::layout::Rect::new(0, 0, 30, 16)).unwrap();
    let narrow = draw(&mut t, &mut a);
    assert!(narrow.iter().all(|l| l.chars().count() <= 30));
    assert!(
        narrow
            .iter()
            .any(|l| l.trim() == "A sentence long enough that it"),
        "{narrow:#?}"
    );
    assert!(narrow.last().unwrap().contains("ctx 0%"), "{narrow:#?}");
}

/// Escape then `/load ID` typed at once: the terminal delivers ESC and the
/// `/` together, read as Alt+/. The picker must close and the command be
/// typed as it was, not the highlighted session loaded (seen once in the
/// tmux test under load).
#[test]
fn an_escape_read_with_the_next_key_closes_the_picker_and_types_the_key() {
    use cordon_agent::sessions::SessionSummary;
    let mut a = app();
    let session = |id: &str| SessionSummary {
        id: id.into(),
        path: format!("/s/{id}.jsonl").into(),
        started_ms: 0,
        title: "t".into(),
        workspace: "/w".into(),
        image: None,
        turns: 1,
        usage: Usage::default(),
    };
    a.show_sessions(vec![session("200-current"), session("100-earlier")]);
    assert!(a.picker.is_some());
    a.on_key(KeyEvent::new(KeyCode::Char('/'), KeyModifiers::ALT));
    assert!(a.picker.is_none(), "the picker closed");
    type_text(&mut a, "load 100-earlier");
    assert_eq!(enter(&mut a), vec![Action::Load("100-earlier".into())]);
}

/// `/allow HOST[:PORT]` lets the sandbox reach a host for the session:
/// checked here, applied at once by the loop (even mid-turn); a bad rule
/// is an error, and `/allow` alone says what the sandbox may reach.
#[test]
fn allow_widens_the_network_for_the_session() {
    let mut a = app();
    type_text(&mut a, "/allow evil.example:443");
    assert_eq!(
        enter(&mut a),
        vec![Action::AllowHost("evil.example:443".parse().unwrap())]
    );
    type_text(&mut a, "/allow *");
    assert_eq!(enter(&mut a), Vec::<Action>::new());
    assert!(last(&a).contains("/allow *"), "{}", last(&a));
    type_text(&mut a, "/allow");
    assert_eq!(enter(&mut a), Vec::<Action>::new());
    assert!(last(&a).contains("not brokered"), "{}", last(&a));
    a.network = Some(cordon_net::PolicyHandle::new(
        cordon_net::Policy::parse(&["pkg.example"], false).unwrap(),
    ));
    type_text(&mut a, "/allow");
    enter(&mut a);
    assert!(last(&a).contains("pkg.example"), "{}", last(&a));
    // A refusal says how to lift it.
    a.on_agent_event(AgentEvent::NetworkRefused {
        tool_id: "t1".into(),
        host: "evil.example".into(),
        port: 443,
        decision: cordon_net::Decision::Refused,
        reason: cordon_net::Reason::NotListed,
        message: "network: evil.example:443 refused by policy (allowed: pkg.example)".into(),
    });
    assert!(last(&a).contains("/allow evil.example:443"), "{}", last(&a));
}

/// Issue 32: Tab completes a slash command: the one it starts, the common
/// start of several, or their list; elsewhere Tab is typed as before.
#[test]
fn tab_completes_slash_commands() {
    let mut a = app();
    type_text(&mut a, "/com");
    a.on_key(key(KeyCode::Tab));
    assert_eq!(a.input_text(), "/compact ");
    let mut a = app();
    type_text(&mut a, "/c");
    a.on_key(key(KeyCode::Tab));
    // /clear, /compact and /cost share only "/c": they are listed.
    assert_eq!(a.input_text(), "/c");
    let listed = format!("{:?}", a.transcript.entries().last());
    assert!(listed.contains("/clear  /compact  /cost"), "{listed}");
    let mut a = app();
    type_text(&mut a, "/se");
    a.on_key(key(KeyCode::Tab));
    assert_eq!(a.input_text(), "/sessions ");
    assert_eq!(enter(&mut a), vec![Action::ListSessions { all: false }]);
    let mut a = app();
    type_text(&mut a, "/zz");
    a.on_key(key(KeyCode::Tab));
    assert_eq!(a.input_text(), "/zz");
    let said = format!("{:?}", a.transcript.entries().last());
    assert!(said.contains("No command starts with /zz"), "{said}");
    // Not a command: Tab goes to the text as it always did.
    let mut a = app();
    type_text(&mut a, "/load ab");
    a.on_key(key(KeyCode::Tab));
    assert_ne!(a.input_text(), "/load ab");
}

/// Issue 32: Tab after `@` asks for the workspace's paths that start with
/// what follows it; the answer completes the word (a file with a space, a
/// directory with its `/`), narrows to the common start, or lists them.
#[test]
fn tab_after_an_at_sign_completes_a_workspace_path() {
    let mut a = app();
    type_text(&mut a, "look at @src/ma");
    assert_eq!(
        a.on_key(key(KeyCode::Tab)),
        vec![Action::CompletePath("src/ma".into())]
    );
    a.complete_path("src/ma", vec!["src/main.rs".into()]);
    assert_eq!(a.input_text(), "look at @src/main.rs ");

    let mut a = app();
    type_text(&mut a, "@s");
    a.complete_path("s", vec!["src/".into()]);
    assert_eq!(a.input_text(), "@src/", "a directory: no space, to go on");
    a.complete_path("src/", vec!["src/main.rs".into(), "src/match.rs".into()]);
    assert_eq!(a.input_text(), "@src/ma", "the common start of several");
    a.complete_path("src/ma", vec!["src/main.rs".into(), "src/match.rs".into()]);
    assert_eq!(a.input_text(), "@src/ma");
    assert!(
        last(&a).contains("src/main.rs  src/match.rs"),
        "{}",
        last(&a)
    );
    a.complete_path("src/ma", Vec::new());
    assert!(last(&a).contains("Nothing in the workspace starts with src/ma"));

    // An answer to a word since changed is dropped.
    let mut a = app();
    type_text(&mut a, "@sr");
    type_text(&mut a, "c");
    a.complete_path("sr", vec!["src/".into()]);
    assert_eq!(a.input_text(), "@src");

    // A word without `@` (or an e-mail address) is not completed.
    let mut a = app();
    type_text(&mut a, "mail me@x");
    assert_eq!(a.on_key(key(KeyCode::Tab)), vec![]);
}

/// Issue 32: `!cmd` runs the command in the sandbox, shown as the user's,
/// and only between turns.
#[test]
fn a_bang_runs_a_command_in_the_sandbox() {
    let mut a = app();
    type_text(&mut a, "!ls -la");
    assert_eq!(enter(&mut a), vec![Action::Shell("ls -la".into())]);
    assert!(a.busy, "Ctrl+C cancels it as it would a turn");
    type_text(&mut a, "!pwd");
    assert_eq!(enter(&mut a), vec![]);
    assert_eq!(a.input_text(), "!pwd", "kept for after the turn");
    assert!(
        last(&a).contains("wait until the turn ends"),
        "{}",
        last(&a)
    );
    a.turn_done(None, false);
    a.on_key(KeyEvent::new(KeyCode::Char('u'), KeyModifiers::CONTROL));
    type_text(&mut a, "!");
    assert_eq!(enter(&mut a), vec![]);
    assert!(last(&a).contains("! needs a command"), "{}", last(&a));
}

/// Issue 32: `p` at a shell command's approval approves its prefix for
/// good; with no prefix offered (another tool), `p` does nothing.
#[test]
fn p_approves_a_command_prefix() {
    use cordon_tui::app::Answer;
    let mut a = app();
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    a.ask_approval(
        "b1".into(),
        "bash".into(),
        serde_json::json!({"command": "cargo test --all"}),
        None,
        Some(vec!["cargo".into(), "test".into()]),
        tx,
    );
    a.on_key(key(KeyCode::Char('p')));
    assert_eq!(
        rx.try_recv().unwrap(),
        Answer::Prefix(vec!["cargo".into(), "test".into()])
    );
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    a.ask_approval(
        "w1".into(),
        "write_file".into(),
        serde_json::json!({"path": "a", "content": ""}),
        None,
        None,
        tx,
    );
    a.on_key(key(KeyCode::Char('p')));
    assert!(rx.try_recv().is_err(), "still asking");
    assert!(a.approval.is_some());
}

/// Issue 35: `/status` says which AGENTS.md files the model follows, in
/// order, and how much of a cut one it was given.
#[test]
fn status_lists_the_instructions_read() {
    let mut a = app();
    type_text(&mut a, "/status");
    assert_eq!(enter(&mut a), vec![]);
    assert!(last(&a).contains("no AGENTS.md was found"), "{}", last(&a));
    a.status.instructions = vec![
        cordon_agent::instructions::Source {
            path: "~/.config/cordon/AGENTS.md".into(),
            bytes: 120,
            cut_at: None,
        },
        cordon_agent::instructions::Source {
            path: "/workspace/AGENTS.md".into(),
            bytes: 90_000,
            cut_at: Some(32_768),
        },
    ];
    type_text(&mut a, "/status");
    enter(&mut a);
    let said = last(&a);
    assert!(said.contains("Model claude-sonnet-4-5"), "{said}");
    let (user, project) = (
        said.find("~/.config/cordon/AGENTS.md (120 bytes)").unwrap(),
        said.find("/workspace/AGENTS.md (the first 32768 of its 90000 bytes)")
            .unwrap(),
    );
    assert!(user < project, "{said}");
}

#[test]
fn attached_and_pasted_images_go_with_the_next_message_only() {
    use cordon_tui::app::Prompt;
    let mut a = app();
    type_text(&mut a, "/attach /tmp/shot.png");
    assert!(enter(&mut a).is_empty());
    assert!(last(&a).contains("Attached /tmp/shot.png"), "{}", last(&a));
    // A dropped file arrives as a pasted, quoted path with escapes.
    a.on_paste("'/home/me/My\\ Pictures/plot.PNG'");
    assert_eq!(a.input_text(), "", "the path was not typed into the prompt");
    // Pasted text that is not an image path is text.
    a.on_paste("/etc/hosts");
    assert_eq!(a.input_text(), "/etc/hosts");
    a.input = Default::default();
    type_text(&mut a, "what do these show?");
    assert_eq!(
        enter(&mut a),
        vec![Action::Send(Prompt {
            text: "what do these show?".into(),
            attach: vec![
                "/tmp/shot.png".into(),
                "/home/me/My Pictures/plot.PNG".into()
            ],
        })]
    );
    assert!(
        last(&a).contains("[2 images] what do these show?"),
        "{}",
        last(&a)
    );
    a.turn_done(None, false);
    type_text(&mut a, "and now?");
    assert_eq!(enter(&mut a), vec![Action::Send("and now?".into())]);
    a.turn_done(None, false);
    type_text(&mut a, "/attach x.gif");
    enter(&mut a);
    type_text(&mut a, "/detach");
    enter(&mut a);
    assert!(a.attachments.is_empty());
}
