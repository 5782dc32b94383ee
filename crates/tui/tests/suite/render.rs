//! Snapshot tests of what the UI draws, on ratatui's `TestBackend`: the
//! app is driven through its public API with the agent's own events and
//! real key events, exactly as the run loop drives it.

use cordon_agent::sessions::SessionSummary;
use cordon_agent::{AgentEvent, StopReason, Usage};
use cordon_tui::app::{Action, Answer};
use cordon_tui::{App, SandboxState, Status};
use crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use ratatui::style::Color;
use serde_json::json;

fn app() -> App {
    App::new(Status {
        model: "claude-sonnet-4-5".into(),
        workspace: "/home/me/project".into(),
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

fn draw(app: &mut App, w: u16, h: u16) -> Terminal<TestBackend> {
    let mut t = Terminal::new(TestBackend::new(w, h)).unwrap();
    t.draw(|f| cordon_tui::view::draw(f, app)).unwrap();
    t
}

fn key(code: KeyCode) -> KeyEvent {
    KeyEvent::new(code, KeyModifiers::NONE)
}

fn ctrl(c: char) -> KeyEvent {
    KeyEvent::new(KeyCode::Char(c), KeyModifiers::CONTROL)
}

fn type_text(app: &mut App, text: &str) {
    for c in text.chars() {
        app.on_key(key(KeyCode::Char(c)));
    }
}

fn send(app: &mut App, prompt: &str) {
    type_text(app, prompt);
    assert_eq!(
        app.on_key(key(KeyCode::Enter)),
        vec![Action::Send(prompt.into())]
    );
}

fn text(app: &mut App, t: &str) {
    app.on_agent_event(AgentEvent::TextDelta { text: t.into() });
}

fn started(app: &mut App, id: &str, name: &str, input: serde_json::Value) {
    app.on_agent_event(AgentEvent::ToolCallStarted {
        id: id.into(),
        name: name.into(),
        label: cordon_tools::Toolbox::agent().label(name, &input),
        input,
    });
}

fn finished(app: &mut App, id: &str, name: &str, output: &str, is_error: bool) {
    app.on_agent_event(AgentEvent::ToolCallFinished {
        id: id.into(),
        name: name.into(),
        output: output.into(),
        is_error,
        structured: None,
        duration_ms: 42,
    });
}

fn turn_completed(app: &mut App) {
    app.on_agent_event(AgentEvent::AssistantMessage {
        text: String::new(),
        stop_reason: StopReason::EndTurn,
        usage: Usage {
            input_tokens: 1200,
            output_tokens: 300,
            cache_read_tokens: 0,
            cache_write_tokens: 0,
        },
    });
    app.on_agent_event(AgentEvent::TurnCompleted {
        stop_reason: StopReason::EndTurn,
        steps: 1,
        usage: Usage::default(),
        cost_usd: None,
        context_tokens: 30_000,
        context_window: 200_000,
    });
    app.turn_done(None, false);
}

const MARKDOWN: &str = "## Plan\n\nI will **write** `hello.py`, then:\n\n\
1. run it\n2. check the *output*\n   - twice\n\n\
```python\nprint(\"hello\")\n```\n\n\
| file | lines |\n|:--|--:|\n| hello.py | 1 |\n";

#[test]
fn transcript_with_markdown() {
    let mut a = app();
    send(&mut a, "write hello.py");
    // Streamed in pieces, as the model sends it.
    for chunk in MARKDOWN.as_bytes().chunks(7) {
        text(&mut a, std::str::from_utf8(chunk).unwrap());
    }
    turn_completed(&mut a);
    let t = draw(&mut a, 60, 26);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn a_running_tool_call_then_its_collapsed_and_expanded_result() {
    let mut a = app();
    send(&mut a, "count to twelve");
    started(&mut a, "t1", "bash", json!({"command": "seq 1 12"}));
    insta::assert_snapshot!("running", draw(&mut a, 60, 12).backend());
    let out: String = (1..=12).map(|i| format!("{i}\n")).collect();
    finished(&mut a, "t1", "bash", &out, false);
    insta::assert_snapshot!("collapsed", draw(&mut a, 60, 12).backend());
    a.on_key(ctrl('o'));
    insta::assert_snapshot!("expanded", draw(&mut a, 60, 20).backend());
}

#[test]
fn an_edit_shows_as_a_coloured_diff() {
    let mut a = app();
    send(&mut a, "fix the greeting");
    started(
        &mut a,
        "e1",
        "edit_file",
        json!({"path": "hello.py", "old_string": "print('hi')\nx = 1\n", "new_string": "print('hello')\nx = 1\n"}),
    );
    finished(&mut a, "e1", "edit_file", "Edited hello.py", false);
    let t = draw(&mut a, 60, 12);
    insta::assert_snapshot!(t.backend());
    // The colours are the point of a diff: check them cell by cell.
    let buf = t.backend().buffer();
    let row_of = |needle: &str| {
        (0..buf.area.height)
            .find(|&y| {
                let line: String = (0..buf.area.width)
                    .map(|x| buf[(x, y)].symbol().to_string())
                    .collect();
                line.contains(needle)
            })
            .unwrap_or_else(|| panic!("{needle} is not on screen"))
    };
    assert_eq!(buf[(2, row_of("- print('hi')"))].fg, Color::Red);
    assert_eq!(buf[(2, row_of("+ print('hello')"))].fg, Color::Green);
}

#[test]
fn an_error_says_what_to_do() {
    let mut a = app();
    send(&mut a, "hello");
    a.on_agent_event(AgentEvent::Error {
        message: "the API key was rejected (401): invalid x-api-key".into(),
    });
    a.turn_done(
        Some("the API key was rejected (401): invalid x-api-key".into()),
        false,
    );
    let t = draw(&mut a, 60, 10);
    insta::assert_snapshot!(t.backend());
    let buf = t.backend().buffer();
    let y = (0..buf.area.height)
        .find(|&y| buf[(0, y)].symbol() == "✗")
        .expect("the error is shown");
    assert_eq!(buf[(2, y)].fg, Color::Red);
}

#[test]
fn the_approval_prompt() {
    let mut a = app();
    send(&mut a, "clean up");
    started(&mut a, "b1", "bash", json!({"command": "rm -rf build/"}));
    let (tx, mut rx) = tokio::sync::oneshot::channel();
    a.ask_approval(
        "b1".into(),
        "bash".into(),
        json!({"command": "rm -rf build/"}),
        None,
        cordon_tui::approved::suggested_prefix("rm -rf build/"),
        tx,
    );
    insta::assert_snapshot!("asking", draw(&mut a, 80, 12).backend());
    // n, then a reason typed in the input box, then Enter.
    a.on_key(key(KeyCode::Char('n')));
    type_text(&mut a, "keep the build");
    insta::assert_snapshot!("denying", draw(&mut a, 80, 12).backend());
    a.on_key(key(KeyCode::Enter));
    assert_eq!(
        rx.try_recv().unwrap(),
        Answer::Deny("keep the build".into())
    );
    assert!(a.approval.is_none());
}

/// "Trojan Source": an override would make a terminal that reorders
/// (VTE, Konsole) show the tail of the command reversed, so the user
/// approves a command that reads other than it runs. Shown in run order.
#[test]
fn an_approval_shows_the_command_in_the_order_it_runs() {
    let mut a = app();
    send(&mut a, "check the disk");
    let command = "rm -rf ~ #\u{202E}\u{2066} ksid kcehc";
    started(&mut a, "b1", "bash", json!({"command": command}));
    let (tx, _rx) = tokio::sync::oneshot::channel();
    a.ask_approval(
        "b1".into(),
        "bash".into(),
        json!({"command": command}),
        None,
        cordon_tui::approved::suggested_prefix(command),
        tx,
    );
    let screen = draw(&mut a, 80, 12).backend().to_string();
    assert!(screen.contains("rm -rf ~ #?? ksid kcehc"), "{screen}");
    let drawn = |c: char| c != '\n' && cordon_tools::unprintable(c);
    assert!(!screen.chars().any(drawn), "{screen}");
}

#[test]
fn approving_a_write_over_a_file_shows_the_lines_it_deletes() {
    let mut a = app();
    send(&mut a, "tidy notes.txt");
    let input = json!({"path": "notes.txt", "content": "keep me\nnew line\n"});
    started(&mut a, "w1", "write_file", input.clone());
    let (tx, _rx) = tokio::sync::oneshot::channel();
    a.ask_approval(
        "w1".into(),
        "write_file".into(),
        input.clone(),
        Some("keep me\ndelete me\n".into()),
        None,
        tx,
    );
    let screen = draw(&mut a, 80, 16).backend().to_string();
    assert!(screen.contains("replaces the file"), "{screen}");
    assert!(screen.contains("- delete me"), "{screen}");
    assert!(screen.contains("+ new line"), "{screen}");
    assert!(screen.contains("   keep me"), "{screen}");

    // A file that does not exist yet is said to be new.
    let mut a = app();
    send(&mut a, "start notes.txt");
    started(&mut a, "w2", "write_file", input.clone());
    let (tx, _rx) = tokio::sync::oneshot::channel();
    a.ask_approval("w2".into(), "write_file".into(), input, None, None, tx);
    let screen = draw(&mut a, 80, 16).backend().to_string();
    assert!(screen.contains("a new file"), "{screen}");
    assert!(screen.contains("+ keep me"), "{screen}");
}

#[test]
fn a_narrow_terminal() {
    let mut a = app();
    send(
        &mut a,
        "write hello.py and run it, then tell me what it printed",
    );
    text(
        &mut a,
        "Writing **hello.py** with a greeting, then running it.",
    );
    started(
        &mut a,
        "t1",
        "bash",
        json!({"command": "python3 hello.py && echo a-very-long-line-of-output-that-must-wrap"}),
    );
    finished(
        &mut a,
        "t1",
        "bash",
        "hello\na-very-long-line-of-output-that-must-wrap",
        false,
    );
    turn_completed(&mut a);
    let t = draw(&mut a, 32, 20);
    insta::assert_snapshot!(t.backend());
}

#[test]
fn multi_line_input_and_the_session_picker() {
    let mut a = app();
    type_text(&mut a, "first line");
    a.on_key(KeyEvent::new(KeyCode::Enter, KeyModifiers::ALT));
    type_text(&mut a, "second line");
    a.on_paste("pasted one\r\npasted two");
    insta::assert_snapshot!("input", draw(&mut a, 50, 12).backend());
    a.show_sessions(vec![
        SessionSummary {
            id: "1795382010-2907a".into(),
            path: "/tmp/a.jsonl".into(),
            started_ms: 1_795_382_010_000,
            title: "write hello.py".into(),
            workspace: "/home/me/project".into(),
            image: None,
            turns: 3,
            usage: Usage::default(),
        },
        SessionSummary {
            id: "1795300000-11111".into(),
            path: "/tmp/b.jsonl".into(),
            started_ms: 1_795_300_000_000,
            title: "fix the tests".into(),
            workspace: "/home/me/project".into(),
            image: None,
            turns: 1,
            usage: Usage::default(),
        },
    ]);
    // Counted from a fixed moment, so that the snapshot keeps.
    a.picker.as_mut().unwrap().now =
        std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_795_390_000);
    a.on_key(key(KeyCode::Down));
    insta::assert_snapshot!("picker", draw(&mut a, 70, 12).backend());
    // Typing narrows the list; Enter loads what is highlighted in it.
    type_text(&mut a, "HELLO");
    let screen = draw(&mut a, 70, 12).backend().to_string();
    assert!(
        screen.contains("(1 of 2)") && screen.contains("filter: HELLO"),
        "{screen}"
    );
    assert!(!screen.contains("fix the tests"), "{screen}");
    a.on_key(key(KeyCode::Backspace));
    type_text(&mut a, "x");
    assert_eq!(
        a.on_key(key(KeyCode::Enter)),
        vec![],
        "nothing matches HELLX"
    );
    for _ in 0..5 {
        a.on_key(key(KeyCode::Backspace));
    }
    a.on_key(key(KeyCode::Down));
    assert_eq!(
        a.on_key(key(KeyCode::Enter)),
        vec![Action::Load("1795300000-11111".into())]
    );
}

/// A connection the network broker refused shows in the transcript as a
/// notice, its control bytes (the host name is the sandbox's to choose)
/// made harmless.
#[test]
fn a_refused_connection_is_a_notice() {
    let mut a = app();
    send(&mut a, "install flask");
    started(
        &mut a,
        "t1",
        "bash",
        json!({"command": "pip install flask"}),
    );
    a.on_agent_event(AgentEvent::NetworkRefused {
        tool_id: "t1".into(),
        host: "evil.example".into(),
        port: 443,
        decision: cordon_net::Decision::Refused,
        reason: cordon_net::Reason::NotListed,
        message: "network: evil.example:443 refused by policy (allowed: \u{1b}[2Jnothing)".into(),
    });
    let t = draw(&mut a, 80, 12);
    let buf = t.backend().buffer();
    let screen: String = (0..buf.area.height)
        .map(|y| {
            (0..buf.area.width)
                .map(|x| buf[(x, y)].symbol().to_string())
                .collect::<String>()
        })
        .collect::<Vec<_>>()
        .join("\n");
    assert!(
        screen.contains("network: evil.example:443 refused by policy"),
        "{screen}"
    );
    assert!(!screen.contains('\u{1b}'), "{screen}");
}
