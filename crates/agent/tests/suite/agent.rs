//! The agent loop end to end: the scripted model server over HTTP, the real
//! tools, and a real sandbox.

use std::path::{Path, PathBuf};
use std::time::Duration;

use cordon_agent::{
    Agent, AgentConfig, AgentError, AgentEvent, Approval, Approver, Cancel, Message, Provider,
    ProviderConfig, ProviderError, ProviderKind, SessionLog, StopReason,
};
use cordon_sandbox::{Sandbox, SandboxConfig};
use cordon_testkit::{Fault, Scenario, ScriptedServer, StopReason as TurnStop, Turn};
use cordon_tools::{ToolContext, Toolbox};
use serde_json::json;
use tokio::sync::mpsc;

fn supervisor() -> PathBuf {
    if let Some(p) = std::env::var_os("CORDON_SUPERVISOR") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("cordon-supervisor");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p cordon-sandbox --bins`",
        p.display()
    );
    p
}

async fn agent(server: &ScriptedServer, kind: ProviderKind, ws: &Path) -> (Agent, Sandbox) {
    agent_with(server, kind, ws, |_| {}).await
}

async fn agent_keeping(
    server: &ScriptedServer,
    kind: ProviderKind,
    ws: &Path,
    keep: usize,
) -> (Agent, Sandbox) {
    agent_with(server, kind, ws, |c| c.keep_tool_outputs = keep).await
}

fn config() -> AgentConfig {
    AgentConfig {
        system: "You are cordon.".into(),
        max_tokens: 4096,
        max_steps: 10,
        ..AgentConfig::new("scripted")
    }
}

async fn agent_with(
    server: &ScriptedServer,
    kind: ProviderKind,
    ws: &Path,
    tune: impl FnOnce(&mut AgentConfig),
) -> (Agent, Sandbox) {
    let mut sc = SandboxConfig::new(ws);
    sc.supervisor = Some(supervisor());
    let sandbox = Sandbox::create(sc).await.unwrap();
    let url = match kind {
        ProviderKind::Anthropic => server.url(),
        ProviderKind::OpenAi => server.openai_url(),
    };
    let mut pc = ProviderConfig::new(kind, url);
    pc.initial_backoff = Duration::from_millis(10);
    let mut config = config();
    tune(&mut config);
    let agent = Agent::new(
        Provider::new(pc).unwrap(),
        Toolbox::standard(),
        ToolContext::new(sandbox.clone(), ws),
        config,
    );
    (agent, sandbox)
}

fn drain(rx: &mut mpsc::UnboundedReceiver<AgentEvent>) -> Vec<AgentEvent> {
    let mut v = Vec::new();
    while let Ok(e) = rx.try_recv() {
        v.push(e);
    }
    v
}

#[tokio::test]
async fn a_task_that_writes_hello_py_and_runs_it_works_in_both_protocols() {
    for kind in [ProviderKind::Anthropic, ProviderKind::OpenAi] {
        let ws = tempfile::tempdir().unwrap();
        let server = ScriptedServer::start(
            Scenario::new()
                .turn(Turn::text("Writing the script.").with_tool_call(
                    "t1",
                    "write_file",
                    json!({"path": "hello.py", "content": "print('hello from cordon')\n"}),
                ))
                .turn(
                    Turn::text("Running it.")
                        .with_tool_call("t2", "bash", json!({"command": "python3 hello.py"}))
                        .expect_tool_results(["t1"]),
                )
                .turn(
                    Turn::text("It printed the greeting.")
                        .expect_tool_results(["t2"])
                        .expect_contains("hello from cordon"),
                ),
        );
        let (mut agent, sandbox) = agent(&server, kind, ws.path()).await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let outcome = agent
            .send("write hello.py and run it", &tx, &Cancel::new())
            .await
            .unwrap();
        assert_eq!(outcome.text, "It printed the greeting.");
        assert_eq!(outcome.steps, 3);
        server.assert_finished();
        assert_eq!(
            std::fs::read_to_string(ws.path().join("hello.py")).unwrap(),
            "print('hello from cordon')\n"
        );
        let events = drain(&mut rx);
        let ran = events.iter().find_map(|e| match e {
            AgentEvent::ToolCallFinished {
                name,
                output,
                is_error,
                ..
            } if name == "bash" => Some((output.clone(), *is_error)),
            _ => None,
        });
        let (output, is_error) = ran.expect("bash ran");
        assert!(
            !is_error && output.contains("hello from cordon"),
            "{output}"
        );
        assert!(matches!(
            events.first(),
            Some(AgentEvent::TurnStarted { step: 1 })
        ));
        assert!(matches!(
            events.last(),
            Some(AgentEvent::TurnCompleted { steps: 3, .. })
        ));
        // The events serialise as the documented JSON objects.
        let line = serde_json::to_string(&events[0]).unwrap();
        assert_eq!(line, r#"{"type":"turn_started","step":1}"#);
        sandbox.close().await;
    }
}

#[tokio::test]
async fn read_only_calls_run_together_and_results_keep_their_order() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    std::fs::write(ws.path().join("b.txt"), "beta\n").unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Reading both.")
                    .with_tool_call("r1", "read_file", json!({"path": "a.txt"}))
                    .with_tool_call("r2", "read_file", json!({"path": "b.txt"}))
                    .with_tool_call("r3", "list_dir", json!({"path": "."})),
            )
            .turn(
                Turn::text("Done.")
                    .expect_tool_results(["r1", "r2", "r3"])
                    .expect_contains("alpha")
                    .expect_contains("beta"),
            ),
    );
    let (mut agent, sandbox) = agent(&server, ProviderKind::Anthropic, ws.path()).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    agent.send("read them", &tx, &Cancel::new()).await.unwrap();
    server.assert_finished();
    let events = drain(&mut rx);
    // All three start before the first finishes: they ran as one batch.
    let first_finish = events
        .iter()
        .position(|e| matches!(e, AgentEvent::ToolCallFinished { .. }))
        .unwrap();
    let starts = events[..first_finish]
        .iter()
        .filter(|e| matches!(e, AgentEvent::ToolCallStarted { .. }))
        .count();
    assert_eq!(starts, 3);
    sandbox.close().await;
}

#[tokio::test]
async fn cancelling_mid_tool_leaves_a_valid_history_and_the_next_turn_works() {
    let ws = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Sleeping.").with_tool_call(
                "s1",
                "bash",
                json!({"command": "sleep 30"}),
            ))
            .turn(
                Turn::text("Checking the shell.")
                    .with_tool_call("s2", "bash", json!({"command": "echo still-usable"}))
                    .expect_tool_results(["s1"])
                    .expect_contains("cancelled")
                    .expect_contains("never mind"),
            )
            .turn(
                Turn::text("Understood, I stopped.")
                    .expect_tool_results(["s2"])
                    .expect_contains("still-usable")
                    .expect_contains("the shell was restarted"),
            ),
    );
    let (mut agent, sandbox) = agent(&server, ProviderKind::Anthropic, ws.path()).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let cancel = Cancel::new();
    let trigger = cancel.clone();
    let watcher = tokio::spawn(async move {
        let mut first = true;
        while let Some(e) = rx.recv().await {
            if first && matches!(e, AgentEvent::ToolCallStarted { .. }) {
                first = false;
                tokio::time::sleep(Duration::from_millis(200)).await;
                trigger.cancel();
            }
        }
    });
    let started = std::time::Instant::now();
    let err = agent.send("sleep a while", &tx, &cancel).await.unwrap_err();
    assert!(matches!(err, AgentError::Cancelled), "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(10));
    cancel.reset();
    // The next turn's bash call must not wait for the cancelled `sleep 30`.
    let again = std::time::Instant::now();
    let outcome = agent.send("never mind", &tx, &cancel).await.unwrap();
    assert_eq!(outcome.text, "Understood, I stopped.");
    assert!(
        again.elapsed() < Duration::from_secs(10),
        "{:?}",
        again.elapsed()
    );
    server.assert_finished();
    drop(tx);
    watcher.await.unwrap();
    sandbox.close().await;
}

/// A running command's output reaches the front ends while it runs, and
/// what it printed before a cancel is shown and goes back to the model.
#[tokio::test]
async fn tool_output_streams_while_it_runs_and_survives_a_cancel() {
    let ws = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Working.").with_tool_call(
                "s1",
                "bash",
                json!({"command": "echo step-one-done; echo warming-up >&2; sleep 30; echo never"}),
            ))
            .turn(
                Turn::text("I saw step one finish before you stopped me.")
                    .expect_tool_results(["s1"])
                    .expect_contains("cancelled")
                    .expect_contains("step-one-done"),
            ),
    );
    let (mut agent, sandbox) = agent(&server, ProviderKind::Anthropic, ws.path()).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let cancel = Cancel::new();
    let trigger = cancel.clone();
    // Cancels once both lines have streamed, proving they came while the
    // command still ran (it sleeps 30 s after them).
    let watcher = tokio::spawn(async move {
        let mut seen = String::new();
        let mut events = Vec::new();
        while let Some(e) = rx.recv().await {
            if let AgentEvent::ToolOutput { text, .. } = &e {
                seen.push_str(text);
                if seen.contains("step-one-done") && seen.contains("warming-up") {
                    trigger.cancel();
                }
            }
            events.push(e);
        }
        events
    });
    let started = std::time::Instant::now();
    let err = agent.send("do the work", &tx, &cancel).await.unwrap_err();
    assert!(matches!(err, AgentError::Cancelled), "{err:?}");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the stream never came"
    );
    cancel.reset();
    let outcome = agent.send("what happened?", &tx, &cancel).await.unwrap();
    assert_eq!(outcome.text, "I saw step one finish before you stopped me.");
    server.assert_finished();
    drop(tx);
    let events = watcher.await.unwrap();
    let finished = events
        .iter()
        .find_map(|e| match e {
            AgentEvent::ToolCallFinished { id, output, .. } if id == "s1" => Some(output.clone()),
            _ => None,
        })
        .expect("the cancelled call is reported finished");
    assert!(
        finished.contains("cancelled") && finished.contains("step-one-done"),
        "{finished}"
    );
    assert!(!finished.contains("never"));
    sandbox.close().await;
}

#[tokio::test]
async fn a_provider_failure_is_reported_and_the_turn_ends_cleanly() {
    let ws = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new().turn(Turn::text("x").fault(cordon_testkit::Fault::auth_error())),
    );
    let (mut agent, sandbox) = agent(&server, ProviderKind::Anthropic, ws.path()).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let err = agent.send("hi", &tx, &Cancel::new()).await.unwrap_err();
    assert!(err.to_string().contains("rejected the key"), "{err}");
    let events = drain(&mut rx);
    assert!(events.iter().any(
        |e| matches!(e, AgentEvent::Error { message } if message.contains("ANTHROPIC_API_KEY"))
    ));
    sandbox.close().await;
}

#[tokio::test]
async fn old_tool_output_is_masked_in_requests_but_kept_in_the_history() {
    let ws = tempfile::tempdir().unwrap();
    let big = "seq 1 400";
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("one").with_tool_call("b1", "bash", json!({"command": big})))
            .turn(
                Turn::text("two")
                    .with_tool_call("b2", "bash", json!({"command": big}))
                    .expect_tool_results(["b1"]),
            )
            .turn(
                Turn::text("done")
                    .expect_tool_results(["b2"])
                    .expect_contains("output omitted to save context"),
            ),
    );
    let (mut agent, sandbox) = agent_keeping(&server, ProviderKind::Anthropic, ws.path(), 1).await;
    let (tx, _rx) = mpsc::unbounded_channel();
    agent
        .send("count twice", &tx, &Cancel::new())
        .await
        .unwrap();
    server.assert_finished();
    let last = server.requests().last().unwrap().body.to_string();
    // The newest output is whole ("399" appears only in seq's output; the
    // stub of the older one says "400 lines"), the older one a stub.
    assert!(last.contains("399"), "{last}");
    assert_eq!(last.matches("output omitted").count(), 1);
    let full = serde_json::to_string(agent.history()).unwrap();
    assert!(
        !full.contains("output omitted"),
        "the history itself keeps everything"
    );
    sandbox.close().await;
}

/// Estimated tokens of a first request: the system prompt, the standard
/// tools and a short prompt. Context sizes in the tests below are set
/// relative to it, so they hold whatever the tools' descriptions weigh.
fn base_tokens() -> u64 {
    let tools = cordon_agent::agent::tool_specs(&Toolbox::agent());
    cordon_agent::context::estimate_request(&cordon_agent::ModelRequest {
        model: "scripted".into(),
        system: config().system,
        messages: vec![Message::user("a task")],
        tools,
        max_tokens: 4096,
        web_search: None,
    })
}

fn text_of(m: &Message) -> String {
    match m {
        Message::User { text, .. } => text.clone(),
        Message::Assistant(a) => a.text(),
    }
}

#[tokio::test]
async fn a_long_session_compacts_and_every_later_request_stays_under_budget() {
    for kind in [ProviderKind::Anthropic, ProviderKind::OpenAi] {
        let ws = tempfile::tempdir().unwrap();
        let logdir = tempfile::tempdir().unwrap();
        let base = base_tokens();
        // Compaction at half the window, which the big output crosses.
        let window = 2 * (base + 2000);
        let budget_chars = (window / 2 * 4) as usize;
        let server = ScriptedServer::start(
            Scenario::new()
                .counting_input_tokens()
                .turn(Turn::text("Looking.").with_tool_call(
                    "t1",
                    "bash",
                    json!({"command": "echo small"}),
                ))
                .turn(
                    Turn::text("Printing a lot.")
                        .with_tool_call(
                            "t2",
                            "bash",
                            json!({"command": "head -c 16000 /dev/zero | tr '\\0' a"}),
                        )
                        .expect_tool_results(["t1"]),
                )
                // The summary request.
                .turn(
                    Turn::text("SUMMARY-7f3: echoed small, then printed 16000 a's.")
                        .expect_contains("about to be compacted"),
                )
                .turn(
                    Turn::text("Carrying on.")
                        .with_tool_call("t4", "bash", json!({"command": "echo after"}))
                        .expect_contains("SUMMARY-7f3")
                        .expect_contains("a long task")
                        .expect_max_input_chars(budget_chars),
                )
                .turn(
                    Turn::text("All done.")
                        .expect_tool_results(["t4"])
                        .expect_max_input_chars(budget_chars),
                ),
        );
        let (agent, sandbox) = agent_with(&server, kind, ws.path(), |c| {
            c.context_window = window;
            c.compact_threshold = 0.5;
            c.keep_tool_outputs = 100;
            c.max_tokens = 1024;
        })
        .await;
        let log_path = logdir.path().join("s.jsonl");
        let mut agent = agent.with_log(SessionLog::create(&log_path).unwrap());
        let (tx, mut rx) = mpsc::unbounded_channel();
        let outcome = agent.send("a long task", &tx, &Cancel::new()).await;
        assert_eq!(outcome.unwrap().text, "All done.", "{kind}");
        server.assert_finished();
        let events = drain(&mut rx);
        let compacted = events
            .iter()
            .find_map(|e| match e {
                AgentEvent::Compacted {
                    replaced_messages,
                    tokens_before,
                    tokens_after,
                    summary,
                } => Some((*replaced_messages, *tokens_before, *tokens_after, summary)),
                _ => None,
            })
            .expect("a compaction");
        assert_eq!(compacted.0, 5, "the whole history, the big output with it");
        assert!(compacted.2 < compacted.1 / 2, "{compacted:?}");
        assert!(compacted.3.starts_with("SUMMARY-7f3"));
        // The history sent on starts with the summary and the task.
        let history = agent.history();
        assert!(text_of(&history[0]).contains("SUMMARY-7f3"));
        assert!(text_of(&history[0]).contains("a long task"));
        assert_eq!(history.len(), 4);
        // The log rebuilds exactly that history, and still holds everything.
        let (records, _) =
            cordon_agent::log::load::<cordon_agent::SessionRecord>(&log_path).unwrap();
        let replayed = cordon_agent::sessions::replay(&records);
        assert_eq!(replayed, history);
        let raw = std::fs::read_to_string(&log_path).unwrap();
        assert!(
            raw.contains(&"a".repeat(16000)),
            "the full output stays on disk"
        );
        assert!(raw.contains("\"type\":\"compaction\""));
        drop(agent);
        sandbox.close().await;
    }
}

#[tokio::test]
async fn context_too_long_compacts_once_and_retries() {
    for kind in [ProviderKind::Anthropic, ProviderKind::OpenAi] {
        let ws = tempfile::tempdir().unwrap();
        let server = ScriptedServer::start(
            Scenario::new()
                .turn(Turn::text("Looking.").with_tool_call(
                    "t1",
                    "bash",
                    json!({"command": "echo hi"}),
                ))
                // The first attempt overflows; the summary request gets the text.
                .turn(
                    Turn::text("SUMMARY-ctl: echoed hi.")
                        .fault(Fault::context_too_long(210_000, 200_000)),
                )
                .turn(Turn::text("Done after compaction.").expect_contains("SUMMARY-ctl")),
        );
        let (mut agent, sandbox) = agent(&server, kind, ws.path()).await;
        let (tx, mut rx) = mpsc::unbounded_channel();
        let outcome = agent.send("say hi", &tx, &Cancel::new()).await.unwrap();
        assert_eq!(outcome.text, "Done after compaction.");
        server.assert_finished();
        let requests = server.requests();
        assert_eq!(requests.len(), 4);
        assert!(requests[2].raw_body.contains("about to be compacted"));
        let events = drain(&mut rx);
        let reason = events.iter().find_map(|e| match e {
            AgentEvent::CompactionStarted { reason } => Some(reason.clone()),
            _ => None,
        });
        assert!(reason.unwrap().contains("210000"), "{kind}");
        sandbox.close().await;
    }
}

#[tokio::test]
async fn context_too_long_again_after_compacting_is_reported() {
    let ws = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Looking.").with_tool_call(
                "t1",
                "bash",
                json!({"command": "echo hi"}),
            ))
            .turn(
                Turn::text("SUMMARY: echoed hi.").fault(Fault::context_too_long(210_000, 200_000)),
            )
            .turn(Turn::text("never sent").fault(Fault::context_too_long(205_000, 200_000))),
    );
    let (mut agent, sandbox) = agent(&server, ProviderKind::Anthropic, ws.path()).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    let err = agent.send("say hi", &tx, &Cancel::new()).await.unwrap_err();
    assert!(
        matches!(
            err,
            AgentError::Provider(ProviderError::ContextTooLong { .. })
        ),
        "{err}"
    );
    assert!(err.to_string().contains("no longer fits"), "{err}");
    let events = drain(&mut rx);
    assert!(matches!(events.last(), Some(AgentEvent::Error { .. })));
    // The history is still valid: the summary, then the call and its result.
    assert!(matches!(
        agent.history(),
        [Message::User { .. }, Message::Assistant(_), Message::User { tool_results, .. }] if tool_results.len() == 1
    ));
    sandbox.close().await;
}

#[tokio::test]
async fn manual_compaction_replaces_the_conversation_by_its_summary() {
    let ws = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("First answer, long and detailed."))
            .turn(
                Turn::text("SUMMARY-man: the user asked a first question.")
                    .expect_contains("about to be compacted"),
            )
            .turn(
                Turn::text("Second answer.")
                    .expect_contains("SUMMARY-man")
                    .expect_contains("second question"),
            ),
    );
    let (mut agent, sandbox) = agent(&server, ProviderKind::Anthropic, ws.path()).await;
    let (tx, mut rx) = mpsc::unbounded_channel();
    agent
        .send("first question", &tx, &Cancel::new())
        .await
        .unwrap();
    let c = agent.compact(&tx, &Cancel::new()).await.unwrap();
    assert_eq!(c.replaced_messages, 2);
    assert_eq!(agent.history().len(), 1);
    agent
        .send("second question", &tx, &Cancel::new())
        .await
        .unwrap();
    server.assert_finished();
    let last = &server.requests()[2];
    assert!(!last.raw_body.contains("First answer"), "{}", last.raw_body);
    assert!(
        drain(&mut rx)
            .iter()
            .any(|e| matches!(e, AgentEvent::Compacted { .. }))
    );
    sandbox.close().await;
}

#[tokio::test]
async fn a_refusal_ends_the_turn_and_stays_out_of_the_history() {
    let ws = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("I can't help with that.").stop(TurnStop::Refusal))
            .turn(Turn::text("Sure.").expect_contains("something else")),
    );
    let (mut agent, sandbox) = agent(&server, ProviderKind::Anthropic, ws.path()).await;
    let (tx, _rx) = mpsc::unbounded_channel();
    let out = agent
        .send("something bad", &tx, &Cancel::new())
        .await
        .unwrap();
    assert_eq!(out.stop_reason, StopReason::Refusal);
    assert_eq!(agent.history().len(), 1, "only the prompt stays");
    let out = agent
        .send("something else", &tx, &Cancel::new())
        .await
        .unwrap();
    assert_eq!(out.text, "Sure.");
    server.assert_finished();
    assert!(!server.requests()[1].raw_body.contains("can't help"));
    sandbox.close().await;
}

/// Allows `bash` calls whose command contains "allowed", denies the rest,
/// and remembers what it was asked.
struct Gate(std::sync::Mutex<Vec<String>>);

impl Approver for Gate {
    fn approve<'a>(
        &'a self,
        id: &'a str,
        _name: &'a str,
        input: &'a serde_json::Value,
    ) -> futures_util::future::BoxFuture<'a, Approval> {
        self.0.lock().unwrap().push(id.to_string());
        let command = input["command"].as_str().unwrap_or("").to_string();
        Box::pin(async move {
            if command.contains("allowed") {
                Approval::Allow
            } else {
                Approval::Deny("not on my laptop".into())
            }
        })
    }
}

#[tokio::test]
async fn an_approver_sees_every_call_and_a_denied_one_never_runs() {
    let ws = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Two commands.")
                    .with_tool_call("a1", "bash", json!({"command": "touch denied.txt"}))
                    .with_tool_call("a2", "bash", json!({"command": "echo allowed > ok.txt"})),
            )
            .turn(
                Turn::text("One was refused.")
                    .expect_tool_results(["a1", "a2"])
                    .expect_contains("The user denied this tool call: not on my laptop"),
            ),
    );
    let (mut agent, sandbox) = agent(&server, ProviderKind::Anthropic, ws.path()).await;
    let gate = std::sync::Arc::new(Gate(Default::default()));
    agent.set_approver(Some(gate.clone()));
    let (tx, mut rx) = mpsc::unbounded_channel();
    agent.send("run both", &tx, &Cancel::new()).await.unwrap();
    server.assert_finished();
    assert_eq!(*gate.0.lock().unwrap(), ["a1", "a2"]);
    assert!(!ws.path().join("denied.txt").exists());
    assert!(ws.path().join("ok.txt").exists());
    let denied = drain(&mut rx).into_iter().find_map(|e| match e {
        AgentEvent::ToolCallFinished {
            id,
            output,
            is_error,
            ..
        } if id == "a1" => Some((output, is_error)),
        _ => None,
    });
    assert_eq!(
        denied,
        Some((
            "The user denied this tool call: not on my laptop".to_string(),
            true
        ))
    );
    sandbox.close().await;
}

/// Two turns that change files, then a rewind to the end of each earlier
/// turn and a fork: the workspace's bytes and the conversation match each
/// point, and the log records every step without rewriting one.
#[tokio::test]
async fn turns_are_checkpointed_and_a_rewind_restores_files_and_conversation() {
    let ws = tempfile::tempdir().unwrap();
    let logdir = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.txt"), "before cordon\n").unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Writing.").with_tool_call(
                "t1",
                "write_file",
                json!({"path": "a.txt", "content": "one\n"}),
            ))
            .turn(Turn::text("Wrote a.txt.").expect_tool_results(["t1"]))
            .turn(Turn::text("Changing.").with_tool_call(
                "t2",
                "bash",
                json!({"command": "echo two > a.txt && echo new > b.txt && rm notes.txt"}),
            ))
            .turn(Turn::text("Changed them.").expect_tool_results(["t2"])),
    );
    let (agent, sandbox) = agent(&server, ProviderKind::Anthropic, ws.path()).await;
    let log_path = logdir.path().join("s.jsonl");
    let mut log = SessionLog::create(&log_path).unwrap();
    log.append(
        &cordon_agent::sessions::SessionStarted::new(
            "s",
            "scripted",
            "anthropic",
            ws.path(),
            "x",
            false,
        )
        .record(),
    )
    .unwrap();
    let mut agent = agent.with_log(log);
    let (tx, _rx) = mpsc::unbounded_channel();
    agent
        .send("write a.txt", &tx, &Cancel::new())
        .await
        .unwrap();
    let after_one = agent.history().to_vec();
    agent
        .send("change them", &tx, &Cancel::new())
        .await
        .unwrap();
    server.assert_finished();
    // The last turn's checkpoint is taken after `send` returns.
    agent.settle().await;
    drop(agent);
    sandbox.close().await;
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "two\n"
    );

    let (records, _) = cordon_agent::log::load::<cordon_agent::SessionRecord>(&log_path).unwrap();
    let t = cordon_agent::sessions::timeline(&records);
    assert_eq!(t.turns, 2);
    let turns: Vec<u64> = t.checkpoints.iter().map(|c| c.turn).collect();
    assert_eq!(
        turns,
        [0, 1, 2],
        "one before the first turn, one after each"
    );

    // Back to the end of turn 1.
    let r = cordon_agent::checkpoints::rewind(&log_path, ws.path(), 1, Default::default()).unwrap();
    assert_eq!((r.written, r.removed), (2, 1), "{r:?}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "one\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("notes.txt")).unwrap(),
        "before cordon\n"
    );
    assert!(!ws.path().join("b.txt").exists());
    let resumed = cordon_agent::sessions::open(&log_path).unwrap();
    assert_eq!(
        resumed.history, after_one,
        "the conversation as turn 1 left it"
    );
    assert_eq!(resumed.summary.turns, 1);
    drop(resumed);

    // Back to before the first turn: no a.txt, no conversation.
    cordon_agent::checkpoints::rewind(&log_path, ws.path(), 0, Default::default()).unwrap();
    assert!(!ws.path().join("a.txt").exists());
    assert!(
        cordon_agent::sessions::open(&log_path)
            .unwrap()
            .history
            .is_empty()
    );
    // Turn 2's end is off the timeline now.
    let err =
        cordon_agent::checkpoints::rewind(&log_path, ws.path(), 2, Default::default()).unwrap_err();
    assert!(
        err.to_string().contains("turn 2 has no checkpoint"),
        "{err}"
    );

    // A fork of turn 1, from the log as it stands (turn 1 is still on
    // the timeline: a rewind only goes back).
    cordon_agent::checkpoints::rewind(&log_path, ws.path(), 0, Default::default()).unwrap();
    let fork_ws = logdir.path().join("fork-ws");
    let err = cordon_agent::checkpoints::fork(
        &log_path,
        Some(1),
        "f",
        &logdir.path().join("f.jsonl"),
        &fork_ws,
        Default::default(),
    )
    .unwrap_err();
    assert!(
        err.to_string().contains("turn 1 has no checkpoint"),
        "{err}"
    );
    let f = cordon_agent::checkpoints::fork(
        &log_path,
        Some(0),
        "f",
        &logdir.path().join("f.jsonl"),
        &fork_ws,
        Default::default(),
    )
    .unwrap();
    assert_eq!(f.files, 1, "notes.txt");
    assert_eq!(
        std::fs::read_to_string(fork_ws.join("notes.txt")).unwrap(),
        "before cordon\n"
    );
    let forked = cordon_agent::sessions::open(&logdir.path().join("f.jsonl")).unwrap();
    assert!(forked.history.is_empty());
    assert_eq!(forked.summary.turns, 0);

    // Nothing in the log was rewritten: every record is there, in order.
    let raw = std::fs::read_to_string(&log_path).unwrap();
    for kind in [
        "\"type\":\"checkpoint\"",
        "\"type\":\"rewind\"",
        "\"type\":\"fork\"",
    ] {
        assert!(raw.contains(kind), "{kind}");
    }
    let (after, _) = cordon_agent::log::load::<cordon_agent::SessionRecord>(&log_path).unwrap();
    assert_eq!(&after[..records.len()], &records[..]);
}
