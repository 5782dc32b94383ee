//! A session log as cordon writes it, pinned: `tests/fixtures/session.jsonl`
//! holds one record of every type, written by cordon's own writers (a
//! forked session with a repository, turns, tool calls, a compaction, a
//! policy change, a rewind and a fork). Logs on disk outlive the code that
//! wrote them: the writers must go on writing these bytes, and the readers
//! must go on reading them as they do here.
//!
//! Here, at the top of the log's modules, because every writer and reader
//! of records is below.
//!
//! `CORDON_BLESS_FIXTURE=1 cargo test -p cordon-agent --lib fixture`
//! writes the fixture again; only for a new record type, never to hide a
//! change.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::event::AgentEvent;
use crate::log::{SessionLog, load};
use crate::message::{AssistantMessage, ContentBlock, StopReason, Usage};
use crate::record::{Fork, ForkedFrom, PolicyRecord, Rewind, SessionRecord, SessionStarted};
use crate::recorder::Recorder;
use crate::sessions::{TurnCheckpoint, replay, summarize, timeline};
use crate::wire::{Message, ToolResult};

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/session.jsonl")
}

fn usage(input: u64, output: u64) -> Usage {
    Usage {
        input_tokens: input,
        output_tokens: output,
        cache_read_tokens: 7,
        cache_write_tokens: 3,
    }
}

fn png() -> cordon_tools::Image {
    cordon_tools::Image {
        media_type: "image/png".into(),
        data: "iVBORw0KGgo=".into(),
    }
}

fn assistant(content: Vec<ContentBlock>, stop_reason: StopReason, usage: Usage) -> Message {
    Message::Assistant(AssistantMessage {
        content,
        stop_reason,
        usage,
    })
}

fn text(t: &str) -> ContentBlock {
    ContentBlock::Text { text: t.into() }
}

fn checkpoint(id: &str) -> cordon_git::Checkpoint {
    cordon_git::Checkpoint {
        id: id.into(),
        changed: true,
        files: 3,
        bytes: 120,
        skipped: Vec::new(),
        incomplete: false,
    }
}

/// The messages the fixture's session adds to its history, by the `seq`
/// of their `message` record.
fn message(seq: u64) -> Message {
    match seq {
        2 => Message::user("fix the parser\nit fails on empty input"),
        3 => assistant(
            vec![
                ContentBlock::Thinking {
                    thinking: "Where is the parser?".into(),
                    signature: "c2ln".into(),
                },
                ContentBlock::RedactedThinking {
                    data: "cmVkYWN0ZWQ=".into(),
                },
                text("Fixed: empty input is an empty list."),
            ],
            StopReason::EndTurn,
            usage(100, 20),
        ),
        6 => Message::user_with_images("now add a test", vec![png()]),
        9 => assistant(
            vec![
                ContentBlock::Thinking {
                    thinking: "Run the tests first.".into(),
                    signature: String::new(),
                },
                text("Running the tests."),
                ContentBlock::ServerToolUse {
                    id: "srvtoolu_1".into(),
                    name: "web_search".into(),
                    input: json!({"query": "rust parser empty input"}),
                },
                ContentBlock::WebSearchToolResult {
                    tool_use_id: "srvtoolu_1".into(),
                    content: json!([{"type": "web_search_result", "url": "https://r.example/", "title": "R", "encrypted_content": "eA=="}]),
                },
                ContentBlock::ToolUse {
                    id: "toolu_1".into(),
                    name: "bash".into(),
                    input: json!({"command": "cargo test", "timeout": 600}),
                },
                ContentBlock::ToolUse {
                    id: "toolu_2".into(),
                    name: "screenshot".into(),
                    input: json!({}),
                },
            ],
            StopReason::ToolUse,
            usage(300, 40),
        ),
        15 => Message::tool_results(vec![
            ToolResult {
                tool_use_id: "toolu_1".into(),
                content: "test result: FAILED. 1 passed; 1 failed\nexit code 101".into(),
                is_error: false,
                images: Vec::new(),
            },
            ToolResult {
                tool_use_id: "toolu_2".into(),
                content: "no display".into(),
                is_error: true,
                images: vec![png()],
            },
        ]),
        20 => assistant(
            vec![text("Tests pass.")],
            StopReason::EndTurn,
            usage(50, 10),
        ),
        26 => Message::user("break it"),
        34 => Message::user("try again"),
        35 => assistant(
            vec![text("Done, gently.")],
            StopReason::MaxTokens,
            usage(60, 8),
        ),
        _ => unreachable!("no message record at {seq}"),
    }
}

/// Message `seq`'s record.
fn message_record(seq: u64) -> SessionRecord {
    SessionRecord::Message {
        message: message(seq),
    }
}

fn summary() -> Message {
    crate::context::summary_message("The parser was fixed.", Some("now add a test"))
}

/// Writes the fixture's records with cordon's writers, as each writes its
/// records: the agent through its recorder, the rest straight to the log.
fn write(path: &Path) {
    let started = {
        let mut s = SessionStarted::new(
            "1764000000-0abcd",
            "claude-sonnet-4-5",
            "anthropic",
            Path::new("/home/user/project"),
            "fix the parser\nit fails on empty input",
            false,
        )
        .in_image(Some("ubuntu:24.04".into()))
        .reading(&[
            crate::instructions::Source {
                path: "/workspace/AGENTS.md".into(),
                bytes: 2048,
                cut_at: Some(1024),
            },
            crate::instructions::Source {
                path: "~/.config/cordon/AGENTS.md".into(),
                bytes: 10,
                cut_at: None,
            },
        ]);
        s.display = Some("1280x800".parse().unwrap());
        s.network = Some(cordon_sandbox::Network::Allow);
        s.allow = Some(vec!["example.com:443".into()]);
        s.allow_private = Some(false);
        s.forked_from = Some(ForkedFrom {
            session: "1763990000-0dcba".into(),
            turn: 1,
        });
        s
    };
    let mut log = SessionLog::create(path).unwrap();
    // What `fork`, `exec`, the TUI and the server write before the agent.
    log.append(&started.record()).unwrap();
    let repository = cordon_git::RepositoryRecord {
        url: "https://git.example/team/project.git".into(),
        branch: "cordon/1764000000-0abcd".into(),
        base: "0123456789abcdef0123456789abcdef01234567".into(),
        base_branch: "main".into(),
        allow_push: true,
    };
    log.append(&SessionRecord::Repository(repository)).unwrap();
    log.append(&message_record(2)).unwrap();
    log.append(&message_record(3)).unwrap();
    log.append(&SessionRecord::Checkpoint(checkpoint("c4")))
        .unwrap();

    // The agent's turns.
    let r = Recorder::default();
    *r.log.lock().unwrap() = Some(log);
    let user_message = |p: &str| SessionRecord::UserMessage { text: p.into() };
    let event = |e: AgentEvent| r.append(&SessionRecord::Event(e));
    r.append(&user_message("now add a test"));
    r.append(&message_record(6));
    event(AgentEvent::TurnStarted { step: 1 });
    event(AgentEvent::Retrying {
        attempt: 1,
        wait_ms: 500,
        reason: "overloaded".into(),
    });
    r.append(&message_record(9));
    event(AgentEvent::AssistantMessage {
        text: "Running the tests.".into(),
        stop_reason: StopReason::ToolUse,
        usage: usage(300, 40),
    });
    event(AgentEvent::ToolCallStarted {
        id: "toolu_1".into(),
        name: "bash".into(),
        input: json!({"command": "cargo test", "timeout": 600}),
        // As logs from before labels have it.
        label: String::new(),
    });
    event(AgentEvent::NetworkRefused {
        tool_id: "toolu_1".into(),
        host: "crates.io".into(),
        port: 443,
        decision: cordon_net::Decision::Refused,
        reason: cordon_net::Reason::NotListed,
        message: "crates.io:443 is not allowed".into(),
    });
    event(AgentEvent::HookFailed {
        event: crate::hooks::HookEvent::BeforeTool,
        message: "hook `lint` exited 1".into(),
    });
    event(AgentEvent::ToolCallFinished {
        id: "toolu_1".into(),
        name: "bash".into(),
        output: "test result: FAILED. 1 passed; 1 failed\nexit code 101".into(),
        is_error: false,
        structured: Some(json!({"exit_code": 101, "stdout": "…", "stderr": ""})),
        duration_ms: 1234,
    });
    r.append(&message_record(15));
    event(AgentEvent::PlanUpdated {
        plan: cordon_tools::update_plan::Plan::parse(json!({
            "explanation": "the test fails",
            "plan": [
                {"step": "read the failure", "status": "completed"},
                {"step": "fix it", "status": "in_progress"},
                {"step": "run the tests", "status": "pending"}
            ]
        }))
        .unwrap(),
    });
    event(AgentEvent::CompactionStarted {
        reason: "the context is 80% full".into(),
    });
    r.append(&SessionRecord::Compaction {
        replaced: 3,
        summary: summary(),
    });
    event(AgentEvent::Compacted {
        replaced_messages: 3,
        tokens_before: 150_000,
        tokens_after: 20_000,
        summary: "The parser was fixed.".into(),
    });
    r.append(&message_record(20));
    event(AgentEvent::AssistantMessage {
        text: "Tests pass.".into(),
        stop_reason: StopReason::EndTurn,
        usage: usage(50, 10),
    });
    event(AgentEvent::TurnCompleted {
        stop_reason: StopReason::EndTurn,
        steps: 2,
        usage: usage(350, 50),
        cost_usd: Some(0.0123),
        context_tokens: 21_000,
        context_window: 200_000,
    });
    r.append(&SessionRecord::Checkpoint(cordon_git::Checkpoint {
        skipped: vec![
            cordon_git::Skipped {
                path: "big.bin".into(),
                skip: cordon_git::Skip::TooLarge { bytes: 1 << 30 },
            },
            cordon_git::Skipped {
                path: "fifo".into(),
                skip: cordon_git::Skip::NotAFile,
            },
        ],
        incomplete: true,
        ..checkpoint("c23")
    }));
    // A change by the TUI's `/allow` (through the agent's recorder).
    let before = cordon_net::Policy::parse(&["example.com:443"], false).unwrap();
    let after = cordon_net::Policy::parse(&["example.com:443", "api.example.org"], false).unwrap();
    r.append(&SessionRecord::NetworkPolicy(PolicyRecord::between(
        &before, &after,
    )));

    r.append(&user_message("break it"));
    r.append(&message_record(26));
    event(AgentEvent::TurnStarted { step: 1 });
    event(AgentEvent::Error {
        message: "the model is overloaded".into(),
    });
    event(AgentEvent::TurnCompleted {
        stop_reason: StopReason::Other,
        steps: 1,
        usage: usage(10, 0),
        cost_usd: None,
        context_tokens: 21_500,
        context_window: 200_000,
    });
    r.append(&SessionRecord::Checkpoint(checkpoint("c30")));
    let mut log = r.log.lock().unwrap().take().unwrap();

    // `cordon rewind` to the end of turn 2, then `cordon fork` of it.
    log.append(&SessionRecord::Rewind(Rewind {
        to_turn: 2,
        to_seq: 23,
        checkpoint: "c23".into(),
        before: "c31".into(),
        written: 1,
        removed: 2,
        kept: vec![cordon_git::Kept {
            path: "target".into(),
            why: "a directory where the checkpoint has a file".into(),
        }],
    }))
    .unwrap();
    log.append(&SessionRecord::Fork(Fork {
        turn: 2,
        session: "1764000100-0eeee".into(),
        workspace: "/home/user/project-fork".into(),
    }))
    .unwrap();

    // And a turn after the rewind.
    *r.log.lock().unwrap() = Some(log);
    r.append(&user_message("try again"));
    r.append(&message_record(34));
    r.append(&message_record(35));
    event(AgentEvent::TurnCompleted {
        stop_reason: StopReason::MaxTokens,
        steps: 1,
        usage: usage(60, 8),
        cost_usd: Some(0.001),
        context_tokens: 22_000,
        context_window: 200_000,
    });
    r.append(&SessionRecord::Checkpoint(checkpoint("c37")));
}

/// The log with each record's `ts_ms` made `1764000000000 + 1000 * seq`:
/// the rest is the writers' own bytes.
fn normalized(raw: &str) -> String {
    let mut out = String::new();
    for line in raw.lines() {
        let rest = line.strip_prefix("{\"seq\":").expect("a record");
        let digits = rest.find(',').unwrap();
        let seq: u64 = rest[..digits].parse().unwrap();
        let rest = rest[digits..]
            .strip_prefix(",\"ts_ms\":")
            .expect("ts_ms second");
        let end = rest.find(|c: char| !c.is_ascii_digit()).unwrap();
        out.push_str(&format!(
            "{{\"seq\":{seq},\"ts_ms\":{}{}\n",
            1_764_000_000_000u64 + 1000 * seq,
            &rest[end..]
        ));
    }
    out
}

#[test]
fn the_writers_write_the_fixture() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    write(&path);
    let written = normalized(&std::fs::read_to_string(&path).unwrap());
    if std::env::var_os("CORDON_BLESS_FIXTURE").is_some() {
        std::fs::write(fixture(), &written).unwrap();
    }
    let pinned = std::fs::read_to_string(fixture()).unwrap();
    for (n, (w, p)) in written.lines().zip(pinned.lines()).enumerate() {
        assert_eq!(w, p, "line {}", n + 1);
    }
    assert_eq!(written.lines().count(), pinned.lines().count());
}

#[test]
fn the_fixture_reads_as_it_always_has() {
    let path = fixture();
    let (records, report) = load::<SessionRecord>(&path).unwrap();
    assert_eq!(report, Default::default());
    assert_eq!(records.len(), 38);

    let s = summarize(&path, &records).expect("a session");
    assert_eq!(s.id, "1764000000-0abcd");
    assert_eq!(s.path, path);
    assert_eq!(s.started_ms, 1_764_000_000_000);
    assert_eq!(s.title, "fix the parser");
    assert_eq!(s.workspace, "/home/user/project");
    assert_eq!(s.image.as_deref(), Some("ubuntu:24.04"));
    // From the fork's turn 1, one more, back to its end, one more.
    assert_eq!(s.turns, 3);
    // Every turn's usage, the ones a rewind set aside too.
    assert_eq!(
        s.usage,
        Usage {
            input_tokens: 420,
            output_tokens: 58,
            cache_read_tokens: 21,
            cache_write_tokens: 9,
        }
    );

    let t = timeline(&records);
    assert_eq!(t.turns, 3);
    assert_eq!(
        t.checkpoints,
        [(1, 4, "c4"), (2, 23, "c23"), (3, 37, "c37")].map(|(turn, seq, id)| TurnCheckpoint {
            turn,
            seq,
            id: id.into()
        })
    );
    // The compaction replaced the first three messages with its summary;
    // the rewind set aside "break it".
    let history = vec![
        summary(),
        message(9),
        message(15),
        message(20),
        message(34),
        message(35),
    ];
    assert_eq!(t.history, history);
    assert_eq!(replay(&records), history);

    // The repository, as `exec --resume` and the server's wake find it.
    let repo = records
        .iter()
        .find_map(|r| r.data.repository())
        .expect("a repository record");
    assert_eq!(repo.url, "https://git.example/team/project.git");
    assert!(repo.allow_push);
}

/// The fixture at a new path with `lines` after its own.
fn with_lines(dir: &Path, lines: &[&str]) -> PathBuf {
    let path = dir.join("s.jsonl");
    let mut raw = std::fs::read_to_string(fixture()).unwrap();
    for l in lines {
        raw.push_str(l);
        raw.push('\n');
    }
    std::fs::write(&path, raw).unwrap();
    path
}

/// Records a newer cordon may write, and records no cordon wrote: each is
/// passed over, and the session reads as it does without them.
#[test]
fn unknown_and_unreadable_records_are_passed_over() {
    let dir = tempfile::tempdir().unwrap();
    let path = with_lines(
        dir.path(),
        &[
            r#"{"seq":38,"ts_ms":1,"type":"from_a_newer_cordon","text":"hi"}"#,
            r#"{"seq":39,"ts_ms":1,"type":"message","message":42}"#,
            r#"{"seq":40,"ts_ms":1,"type":"compaction","replaced":"all","summary":{"role":"user","text":"x"}}"#,
            r#"{"seq":41,"ts_ms":1,"type":"checkpoint","files":1}"#,
            // A rewind forwards is not one cordon wrote.
            r#"{"seq":42,"ts_ms":1,"type":"rewind","to_turn":0,"to_seq":42,"checkpoint":"c","before":"b","written":0,"removed":0}"#,
            r#"{"seq":43,"ts_ms":1,"type":"turn_completed","usage":"lots"}"#,
            r#"{"seq":44,"ts_ms":1,"type":"network_policy","allow":"everything"}"#,
            r#"{"seq":45,"ts_ms":1,"type":"session_started","session_id":7}"#,
            r#"{"seq":46,"ts_ms":1}"#,
            "not json",
            r#"{"seq":47,"ts_ms":1,"type":"user_message"}"#,
            r#"{"seq":48,"ts_ms":1,"type":"turn_completed","stop_reason":"a_newer_reason","steps":1,"usage":{"input_tokens":1,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0}}"#,
            r#"{"seq":49,"ts_ms":1,"type":"from_a_newer_cordon"}"#,
        ],
    );
    let (clean, _) = load::<SessionRecord>(&fixture()).unwrap();
    let (records, report) = load::<SessionRecord>(&path).unwrap();
    // Each skipped, and said; the forward rewind and the turn of a newer
    // cordon's stop reason read.
    assert_eq!(
        report.bad_lines,
        [39, 40, 41, 42, 44, 45, 46, 47, 48, 49, 51]
    );
    assert_eq!(records.len(), clean.len() + 2);
    let mut expected = summarize(&path, &clean).unwrap();
    expected.usage.input_tokens += 1;
    assert_eq!(summarize(&path, &records).unwrap(), expected);
    assert_eq!(timeline(&records), timeline(&clean));
    // The next record is numbered after the last line, read or not.
    let (log, _, _) = SessionLog::<SessionRecord>::open(&path).unwrap();
    assert_eq!(log.next_seq(), 50);
}

/// Token counts no server sends add up without a panic.
#[test]
fn usage_past_the_largest_number_stays_there() {
    let dir = tempfile::tempdir().unwrap();
    let huge = r#"{"seq":38,"ts_ms":1,"type":"turn_completed","stop_reason":"end_turn","steps":1,"usage":{"input_tokens":18446744073709551615,"output_tokens":0,"cache_read_tokens":0,"cache_write_tokens":0},"context_tokens":0,"context_window":0}"#;
    let path = with_lines(dir.path(), &[huge]);
    let (records, _) = load::<SessionRecord>(&path).unwrap();
    assert_eq!(
        summarize(&path, &records).unwrap().usage.input_tokens,
        u64::MAX
    );
}

/// A fork's turn no cordon wrote counts on without a panic.
#[test]
fn a_turn_past_the_largest_number_stays_there() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    std::fs::write(
        &path,
        concat!(
            r#"{"seq":0,"ts_ms":1,"type":"session_started","session_id":"s","forked_from":{"session":"f","turn":18446744073709551615}}"#,
            "\n",
            r#"{"seq":1,"ts_ms":1,"type":"user_message","text":"a"}"#,
            "\n",
        ),
    )
    .unwrap();
    let (records, _) = load::<SessionRecord>(&path).unwrap();
    assert_eq!(summarize(&path, &records).unwrap().turns, u64::MAX);
}

/// Every field of every record made wrong in a few ways, one at a time:
/// the log is read without a panic.
#[test]
fn no_record_makes_a_reader_panic() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("s.jsonl");
    let raw = std::fs::read_to_string(fixture()).unwrap();
    let lines: Vec<&str> = raw.lines().collect();
    let wrong = [
        json!(null),
        json!(-1),
        json!(u64::MAX),
        json!("x"),
        json!([]),
        json!({}),
        json!({"role": "user"}),
    ];
    for (i, line) in lines.iter().enumerate() {
        let record: serde_json::Map<String, Value> = serde_json::from_str(line).unwrap();
        for key in record.keys() {
            for w in &wrong {
                let mut bad = record.clone();
                bad.insert(key.clone(), w.clone());
                let mut text = String::new();
                for (j, l) in lines.iter().enumerate() {
                    if i == j {
                        text.push_str(&Value::Object(bad.clone()).to_string());
                    } else {
                        text.push_str(l);
                    }
                    text.push('\n');
                }
                std::fs::write(&path, text).unwrap();
                let (records, _) = load::<SessionRecord>(&path).unwrap();
                let _ = summarize(&path, &records);
                let _ = timeline(&records);
            }
        }
    }
}
