//! The fault matrix of `cordon exec`: the real binary against the scripted
//! model server over HTTP, once per fault the server can inject, for both
//! providers. Each fault is either survived (the task completes) or reported
//! in one clear line, and in every case the session log stays whole.

use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use cordon_testkit::{Fault, Scenario, ScriptedServer, Turn};
use serde_json::{Value, json};
use tempfile::TempDir;

use crate::support;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Api {
    Anthropic,
    OpenAi,
}

impl Api {
    fn key_variable(self) -> &'static str {
        match self {
            Api::Anthropic => "ANTHROPIC_API_KEY",
            Api::OpenAi => "OPENAI_API_KEY",
        }
    }
}

/// Runs the same case once per provider, as separate tests so they run in
/// parallel.
macro_rules! both_providers {
    ($($name:ident),* $(,)?) => {$(
        mod $name {
            #[test]
            fn anthropic() {
                super::$name(super::Api::Anthropic);
            }
            #[test]
            fn openai() {
                super::$name(super::Api::OpenAi);
            }
        }
    )*};
}

/// A workspace and a home (config, data, sessions) of the test's own.
struct Case {
    ws: TempDir,
    home: TempDir,
}

struct Out {
    code: Option<i32>,
    stdout: String,
    stderr: String,
    took: Duration,
}

impl std::fmt::Display for Out {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {:?} after {:?}\n--- stdout\n{}\n--- stderr\n{}",
            self.code, self.took, self.stdout, self.stderr
        )
    }
}

impl Case {
    fn new() -> Self {
        Case {
            ws: tempfile::tempdir().unwrap(),
            home: tempfile::tempdir().unwrap(),
        }
    }

    /// `cordon exec ARGS` talking to `base` (a server's URL for `api`).
    fn command(&self, api: Api, base: &str, args: &[&str]) -> Command {
        let mut cmd = support::cordon_as_user(self.home.path(), self.ws.path());
        cmd.arg("exec").stdin(Stdio::null());
        match api {
            Api::Anthropic => {
                cmd.env("ANTHROPIC_BASE_URL", base)
                    .env("ANTHROPIC_API_KEY", "sk-test-key-0000000000");
            }
            Api::OpenAi => {
                cmd.args(["--provider", "openai"])
                    .env("OPENAI_BASE_URL", base)
                    .env("OPENAI_API_KEY", "sk-test-key-0000000000");
            }
        }
        cmd.args(args);
        cmd
    }

    fn run_at(&self, api: Api, base: &str, args: &[&str]) -> Out {
        let started = Instant::now();
        let out = self.command(api, base, args).output().unwrap();
        Out {
            code: out.status.code(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
            took: started.elapsed(),
        }
    }

    fn run(&self, api: Api, server: &ScriptedServer, args: &[&str]) -> Out {
        self.run_at(api, &base_url(api, server), args)
    }

    fn sessions_dir(&self) -> PathBuf {
        self.home.path().join("data/cordon/sessions")
    }

    /// The session log, checked whole: exactly one file, every line a JSON
    /// record, `seq` increasing, `session_started` first. Returns the records.
    fn session_log(&self) -> Vec<Value> {
        // Beside each log, its checkpoints (`<id>.checkpoints/`).
        let logs: Vec<PathBuf> = std::fs::read_dir(self.sessions_dir())
            .unwrap()
            .map(|e| e.unwrap().path())
            .filter(|p| !p.is_dir())
            .collect();
        assert_eq!(logs.len(), 1, "one session log: {logs:?}");
        assert_eq!(logs[0].extension().and_then(|e| e.to_str()), Some("jsonl"));
        let text = std::fs::read_to_string(&logs[0]).unwrap();
        assert!(text.ends_with('\n'), "the last line is whole:\n{text}");
        let records: Vec<Value> = text
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
            .collect();
        let seqs: Vec<u64> = records
            .iter()
            .map(|r| r["seq"].as_u64().expect("every record has a seq"))
            .collect();
        assert!(
            seqs.windows(2).all(|w| w[0] < w[1]),
            "seq must increase: {seqs:?}"
        );
        assert_eq!(records[0]["type"], "session_started", "{text}");
        records
    }

    fn session_id(&self) -> String {
        self.session_log()[0]["session_id"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

fn base_url(api: Api, server: &ScriptedServer) -> String {
    match api {
        Api::Anthropic => server.url(),
        Api::OpenAi => server.openai_url(),
    }
}

fn count(records: &[Value], kind: &str) -> usize {
    records.iter().filter(|r| r["type"] == kind).count()
}

/// The log of a task that completed despite its fault.
fn assert_log_of_success(case: &Case) -> Vec<Value> {
    let records = case.session_log();
    for kind in ["user_message", "message", "turn_completed"] {
        assert!(count(&records, kind) >= 1, "no {kind} record: {records:#?}");
    }
    assert_eq!(count(&records, "error"), 0, "{records:#?}");
    records
}

/// The log of a task that failed: still whole, and it says why.
fn assert_log_of_failure(case: &Case, words: &str) -> Vec<Value> {
    let records = case.session_log();
    assert_eq!(count(&records, "user_message"), 1, "{records:#?}");
    let errors: Vec<&Value> = records.iter().filter(|r| r["type"] == "error").collect();
    assert_eq!(errors.len(), 1, "{records:#?}");
    let message = errors[0]["message"].as_str().unwrap();
    assert!(message.contains(words), "{message}");
    assert_eq!(count(&records, "turn_completed"), 0, "{records:#?}");
    records
}

/// Exit 1 and exactly one `cordon: ` line saying what went wrong; every other
/// stderr line is a retry notice, never a panic or a log dump.
fn assert_reported(out: &Out, words: &[&str]) {
    assert_eq!(out.code, Some(1), "{out}");
    let reports: Vec<&str> = out
        .stderr
        .lines()
        .filter(|l| l.starts_with("cordon: "))
        .collect();
    assert_eq!(reports.len(), 1, "{out}");
    for w in words {
        assert!(reports[0].contains(w), "{w:?} missing: {out}");
    }
    for line in out.stderr.lines() {
        assert!(
            line.starts_with("cordon: ") || line.starts_with("  retrying (attempt "),
            "unexpected stderr line {line:?}: {out}"
        );
    }
}

/// stderr of a task that completed: progress lines only (tool calls, their
/// abbreviated results, retry notices, the closing tally), no warnings or
/// log lines.
fn assert_progress_only(stderr: &str) {
    for line in stderr.lines() {
        assert!(
            ["▸ ", "  ✓ ", "  ✗ ", "  retrying (attempt ", "    ", "· "]
                .iter()
                .any(|p| line.starts_with(p)),
            "unexpected stderr line {line:?} in:\n{stderr}"
        );
    }
}

fn retry_lines(out: &Out) -> usize {
    out.stderr
        .lines()
        .filter(|l| l.starts_with("  retrying (attempt "))
        .count()
}

/// A task of two model requests: a file written through a tool, then the
/// final answer, which must carry the tool's result.
fn write_then_answer(first: Turn, second: Turn) -> Scenario {
    Scenario::new()
        .turn(first.with_tool_call(
            "t1",
            "write_file",
            json!({"path": "note.txt", "content": "written once\n"}),
        ))
        .turn(second.expect_tool_results(["t1"]))
}

/// The task of `write_then_answer` finished: file, answer, final message.
fn assert_write_task_done(case: &Case, out: &Out) {
    assert_eq!(out.code, Some(0), "{out}");
    assert_progress_only(&out.stderr);
    assert_eq!(
        std::fs::read_to_string(case.ws.path().join("note.txt")).unwrap(),
        "written once\n"
    );
    assert_eq!(
        std::fs::read_to_string(case.ws.path().join("last.txt")).unwrap(),
        "The note is written."
    );
    assert!(out.stdout.contains("The note is written."), "{out}");
}

// 429 with `retry-after: 1`: waited out, with a progress line saying so.
fn rate_limit_is_waited_out(api: Api) {
    let case = Case::new();
    let server = ScriptedServer::start(write_then_answer(
        Turn::text("Writing the note.").fault(Fault::http(429).retry_after(1)),
        Turn::text("The note is written."),
    ));
    let out = case.run(api, &server, &["write the note", "-o", "last.txt"]);
    assert_write_task_done(&case, &out);
    server.assert_finished();
    assert!(
        out.stderr
            .contains("retrying (attempt 2) in 1000 ms: HTTP 429"),
        "{out}"
    );
    assert_eq!(retry_lines(&out), 1, "{out}");
    // The wait is the server's second, not a backoff of the client's own.
    assert!(
        out.took >= Duration::from_secs(1),
        "retry-after ignored: {out}"
    );
    assert!(out.took < Duration::from_secs(6), "{out}");
    assert_eq!(server.requests().len(), 3);
    assert_log_of_success(&case);
}

// 529, 500 and 503 without retry-after: retried after the client's own backoff.
fn overload_and_server_errors_are_retried(api: Api) {
    let case = Case::new();
    let server = ScriptedServer::start(write_then_answer(
        Turn::text("Writing the note.").fault(Fault::http(529)),
        Turn::text("The note is written.")
            .fault(Fault::http(500))
            .fault(Fault::http(503)),
    ));
    let out = case.run(api, &server, &["write the note", "-o", "last.txt"]);
    assert_write_task_done(&case, &out);
    server.assert_finished();
    for status in ["HTTP 529", "HTTP 500", "HTTP 503"] {
        assert!(out.stderr.contains(status), "{status}: {out}");
    }
    assert_eq!(retry_lines(&out), 3, "{out}");
    let statuses: Vec<u16> = server.requests().iter().map(|r| r.status).collect();
    assert_eq!(statuses, [529, 200, 500, 503, 200]);
    assert_log_of_success(&case);
}

// More failures than attempts: one line naming the last reason, exit 1.
fn a_fault_past_the_retry_budget_is_reported(api: Api) {
    let case = Case::new();
    let status = match api {
        Api::Anthropic => 529,
        Api::OpenAi => 503,
    };
    // retry-after 0 keeps the five attempts quick.
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("never").fault(Fault::http(status).retry_after(0).times(9))),
    );
    let out = case.run(api, &server, &["hi"]);
    assert_reported(&out, &["after 5 attempts", &format!("HTTP {status}")]);
    assert_eq!(retry_lines(&out), 4, "{out}");
    assert_eq!(server.requests().len(), 5);
    assert!(out.stdout.trim().is_empty(), "{out}");
    assert_log_of_failure(&case, "after 5 attempts");
}

// An `overloaded_error` inside a 200 stream, after part of the answer.
fn an_in_stream_overload_is_retried(api: Api) {
    let case = Case::new();
    let server = ScriptedServer::start(write_then_answer(
        Turn::text("Writing the note.").fault(Fault::stream_error(4)),
        Turn::text("The note is written.").fault(Fault::stream_error(2)),
    ));
    let out = case.run(api, &server, &["write the note", "-o", "last.txt"]);
    assert_write_task_done(&case, &out);
    server.assert_finished();
    assert_eq!(retry_lines(&out), 2, "{out}");
    assert!(out.stderr.contains("overload"), "{out}");
    assert_eq!(server.requests().len(), 4);
    assert_log_of_success(&case);
}

/// How many stream events carry a reply of one text block and one tool call,
/// up to and including the tool call's last argument piece, with the
/// scenario's `chunk_chars` large enough for one piece per text. Cutting the
/// stream there leaves a complete tool call in an incomplete answer.
fn events_through_the_tool_call(api: Api) -> usize {
    match api {
        // message_start, ping, text start/delta/stop, tool start, three
        // argument pieces (the server always sends at least three), tool stop.
        Api::Anthropic => 10,
        // role, text, tool call start, three argument pieces.
        Api::OpenAi => 6,
    }
}

// A dropped connection: before any tool ran the request is sent again; once
// a tool has run for an answer, that answer is never asked for again.
fn a_disconnect_is_retried_and_no_tool_runs_twice(api: Api) {
    let case = Case::new();
    let mut scenario = Scenario::new()
        .turn(
            Turn::text("Counting.")
                .with_tool_call("t1", "bash", json!({"command": "echo ran >> runs.txt"}))
                .fault(Fault::disconnect_after(events_through_the_tool_call(api))),
        )
        .turn(
            Turn::text("Counted once.")
                .expect_tool_results(["t1"])
                .fault(Fault::disconnect_after(3)),
        );
    scenario.chunk_chars = 10_000;
    let server = ScriptedServer::start(scenario);
    let out = case.run(api, &server, &["count a run"]);
    assert_eq!(out.code, Some(0), "{out}");
    assert_progress_only(&out.stderr);
    server.assert_finished();
    assert_eq!(
        std::fs::read_to_string(case.ws.path().join("runs.txt")).unwrap(),
        "ran\n",
        "the tool ran more or less than once: {out}"
    );
    assert_eq!(retry_lines(&out), 2, "{out}");
    assert_eq!(out.stderr.matches("▸ bash").count(), 1, "{out}");
    let attempts: Vec<(Option<usize>, u32)> = server
        .requests()
        .iter()
        .map(|r| (r.turn, r.attempt))
        .collect();
    assert_eq!(
        attempts,
        [(Some(0), 0), (Some(0), 1), (Some(1), 0), (Some(1), 1)]
    );
    let records = assert_log_of_success(&case);
    assert_eq!(count(&records, "tool_call_started"), 1, "{records:#?}");
    assert_eq!(count(&records, "tool_call_finished"), 1, "{records:#?}");
}

// Tool arguments that are not JSON: nothing has run, so the request is sent
// again (models slip now and then); a model that keeps slipping gets a
// clear error, no tool run with a guess, and the session continues cleanly
// on the next turn.
fn malformed_tool_json_is_retried_then_reported(api: Api) {
    let case = Case::new();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Counting.")
                    .with_tool_call("t1", "bash", json!({"command": "echo ran >> runs.txt"}))
                    .fault(Fault::malformed_tool_json()),
            )
            .turn(Turn::text("Counted.").expect_tool_results(["t1"])),
    );
    let out = case.run(api, &server, &["count a run"]);
    assert_eq!(out.code, Some(0), "{out}");
    assert_eq!(retry_lines(&out), 1, "{out}");
    server.assert_finished();
    assert_eq!(
        std::fs::read_to_string(case.ws.path().join("runs.txt")).unwrap(),
        "ran\n"
    );

    let case = Case::new();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Counting.")
                    .with_tool_call("t1", "bash", json!({"command": "echo ran >> runs.txt"}))
                    .fault(Fault::malformed_tool_json().times(9)),
            )
            .turn(
                Turn::text("Counted.")
                    .expect_tool_results(["t1"])
                    .expect_contains("count a run")
                    .expect_contains("try again"),
            ),
    );
    let out = case.run(api, &server, &["count a run"]);
    assert_reported(&out, &["bash", "not valid JSON"]);
    assert!(!case.ws.path().join("runs.txt").exists(), "{out}");
    assert!(!out.stderr.contains("▸"), "no tool may start: {out}");
    let records = assert_log_of_failure(&case, "not valid JSON");
    assert_eq!(count(&records, "tool_call_started"), 0, "{records:#?}");
    // Nothing half-formed went into the history: the next turn's request is
    // one the server accepts, and the call it then gets runs once.
    let out = case.run(api, &server, &["--last", "try again"]);
    assert_eq!(out.code, Some(0), "{out}");
    server.assert_finished();
    assert_eq!(
        std::fs::read_to_string(case.ws.path().join("runs.txt")).unwrap(),
        "ran\n"
    );
    let records = case.session_log();
    assert_eq!(count(&records, "user_message"), 2, "{records:#?}");
    assert_eq!(count(&records, "turn_completed"), 1, "{records:#?}");
}

// A stream that trickles: nothing times out, everything arrives.
fn slow_chunks_are_waited_for(api: Api) {
    let case = Case::new();
    let server = ScriptedServer::start(write_then_answer(
        Turn::text("Writing the note.").fault(Fault::chunk_delay_ms(25)),
        Turn::text("The note is written.").fault(Fault::chunk_delay_ms(25)),
    ));
    let out = case.run(api, &server, &["write the note", "-o", "last.txt"]);
    assert_write_task_done(&case, &out);
    server.assert_finished();
    assert_eq!(retry_lines(&out), 0, "{out}");
    assert_eq!(server.requests().len(), 2);
    assert_log_of_success(&case);
}

// A rejected key: one line naming the variable to set; not retried.
fn a_bad_key_is_explained(api: Api) {
    let case = Case::new();
    let server =
        ScriptedServer::start(Scenario::new().turn(Turn::text("x").fault(Fault::auth_error())));
    let out = case.run(api, &server, &["hi"]);
    assert_reported(&out, &["rejected the key", api.key_variable()]);
    assert_eq!(out.stderr.lines().count(), 1, "{out}");
    assert_eq!(server.requests().len(), 1);
    assert_log_of_failure(&case, api.key_variable());
}

// An unknown model: one line naming it and the option to change it.
fn an_unknown_model_is_explained(api: Api) {
    let case = Case::new();
    let server = ScriptedServer::start(
        Scenario::new().turn(Turn::text("x").fault(Fault::model_not_found())),
    );
    let out = case.run(api, &server, &["--model", "no-such-model", "hi"]);
    assert_reported(&out, &["\"no-such-model\"", "--model"]);
    assert_eq!(out.stderr.lines().count(), 1, "{out}");
    assert_eq!(server.requests().len(), 1);
    assert_log_of_failure(&case, "no-such-model");
}

// Nothing listens at the base URL: one line naming it, exit 1, quickly.
fn an_unreachable_server_is_explained(api: Api) {
    let case = Case::new();
    let port = {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        listener.local_addr().unwrap().port()
        // Dropped here: the port is closed.
    };
    let base = match api {
        Api::Anthropic => format!("http://127.0.0.1:{port}"),
        Api::OpenAi => format!("http://127.0.0.1:{port}/v1"),
    };
    let out = case.run_at(api, &base, &["hi"]);
    assert_reported(
        &out,
        &[
            "cannot reach the model server",
            &format!("127.0.0.1:{port}"),
            "refused",
        ],
    );
    assert_eq!(out.stderr.lines().count(), 1, "{out}");
    assert!(out.took < Duration::from_secs(10), "{out}");
    assert_log_of_failure(&case, "cannot reach the model server");
}

// Ctrl-C while a tool runs: exit 130 at once, and the session resumes with
// a result for the interrupted call.
fn ctrl_c_during_a_tool_then_resume(api: Api) {
    interrupt_a_tool_then_resume(api, false);
}

// A terminal's Ctrl-C reaches the whole foreground process group, the
// sandbox's supervisor included; the outcome must be the same.
#[test]
fn ctrl_c_from_a_terminal_reaches_the_whole_group() {
    interrupt_a_tool_then_resume(Api::Anthropic, true);
}

fn interrupt_a_tool_then_resume(api: Api, whole_group: bool) {
    let case = Case::new();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Waiting.").with_tool_call(
                "t1",
                "bash",
                json!({"command": "sleep 30"}),
            ))
            .turn(
                Turn::text("The wait was cancelled.")
                    .expect_tool_results(["t1"])
                    .expect_contains("cancelled")
                    .expect_contains("what happened"),
            ),
    );
    let mut cmd = case.command(api, &base_url(api, &server), &["wait a while"]);
    cmd.stdout(Stdio::null()).stderr(Stdio::piped());
    if whole_group {
        cmd.process_group(0);
    }
    let mut child = cmd.spawn().unwrap();
    let (tx, rx) = mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap();
            all.push_str(&line);
            all.push('\n');
            let _ = tx.send(line);
        }
        all
    });
    // The progress line appears once the tool has started in the sandbox.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match rx.recv_timeout(left) {
            Ok(line) if line.contains("▸ bash sleep 30") => break,
            Ok(_) => {}
            Err(e) => {
                let _ = child.kill();
                panic!("the tool never started ({e}): {}", reader.join().unwrap());
            }
        }
    }
    // Let the command get going inside the sandbox.
    std::thread::sleep(Duration::from_millis(200));
    let signalled = Instant::now();
    let pid = child.id() as libc::pid_t;
    let target = if whole_group { -pid } else { pid };
    assert_eq!(unsafe { libc::kill(target, libc::SIGINT) }, 0);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if signalled.elapsed() > Duration::from_secs(10) {
            let _ = child.kill();
            panic!("cordon ignored Ctrl-C: {}", reader.join().unwrap());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = signalled.elapsed();
    let stderr = reader.join().unwrap();
    assert_eq!(status.code(), Some(130), "{stderr}");
    assert!(
        took < Duration::from_secs(5),
        "exit took {took:?}: {stderr}"
    );
    assert_progress_only(&stderr);
    assert!(stderr.contains("cancelled this tool call"), "{stderr}");
    let records = case.session_log();
    assert_eq!(count(&records, "tool_call_started"), 1, "{records:#?}");
    assert_eq!(count(&records, "tool_call_finished"), 1, "{records:#?}");
    assert_eq!(count(&records, "turn_completed"), 0, "{records:#?}");
    // The interrupted call has a result in the history the next turn sends.
    let id = case.session_id();
    let out = case.run(api, &server, &["--resume", &id, "what happened?"]);
    assert_eq!(out.code, Some(0), "{out}");
    server.assert_finished();
    assert!(out.stdout.contains("The wait was cancelled."), "{out}");
    let records = case.session_log();
    assert_eq!(count(&records, "user_message"), 2, "{records:#?}");
    assert_eq!(count(&records, "turn_completed"), 1, "{records:#?}");
}

both_providers!(
    rate_limit_is_waited_out,
    overload_and_server_errors_are_retried,
    a_fault_past_the_retry_budget_is_reported,
    an_in_stream_overload_is_retried,
    a_disconnect_is_retried_and_no_tool_runs_twice,
    malformed_tool_json_is_retried_then_reported,
    slow_chunks_are_waited_for,
    a_bad_key_is_explained,
    an_unknown_model_is_explained,
    an_unreachable_server_is_explained,
    ctrl_c_during_a_tool_then_resume,
);
