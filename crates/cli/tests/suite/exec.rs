//! `cordon exec` end to end: the real binary, the scripted model server over
//! HTTP, the real sandbox and tools.

use std::path::Path;
use std::process::{Command, Output};

use crate::support;

use cordon_testkit::{Fault, Scenario, ScriptedServer, Turn};
use cordon_tools::Toolbox;
use serde_json::{Value, json};

fn hello_scenario() -> Scenario {
    Scenario::new()
        .turn(Turn::text("Writing hello.py.").with_tool_call(
            "t1",
            "write_file",
            json!({"path": "hello.py", "content": "print('hello from the sandbox')\n"}),
        ))
        .turn(
            Turn::text("Running it.")
                .with_tool_call("t2", "bash", json!({"command": "python3 hello.py"}))
                .expect_tool_results(["t1"]),
        )
        .turn(
            Turn::text("hello.py prints its greeting.")
                .expect_tool_results(["t2"])
                .expect_contains("hello from the sandbox"),
        )
}

/// Every line validates against the documented schema.
fn assert_valid(events: &[Value]) {
    let schema: Value =
        serde_json::from_str(include_str!("../../../../docs/exec-json.schema.json"))
            .expect("the schema is JSON");
    let validator = jsonschema::validator_for(&schema).expect("the schema is valid");
    for e in events {
        let errors: Vec<String> = validator.iter_errors(e).map(|e| e.to_string()).collect();
        assert!(
            errors.is_empty(),
            "{e} does not match the schema: {errors:?}"
        );
    }
}

fn assert_success(out: &Output) {
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn json_lines(out: &Output) -> Vec<Value> {
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn exec(server: &ScriptedServer, ws: &Path, home: &Path, args: &[&str]) -> Output {
    exec_command(server, ws, home, args).output().unwrap()
}

fn exec_command(server: &ScriptedServer, ws: &Path, home: &Path, args: &[&str]) -> Command {
    let mut c = support::user_cordon(home, ws, &server.url());
    c.arg("exec").args(args);
    c
}

/// Two cordons on one session: the second is told the session is open in
/// the first and writes nothing, so the log's records stay numbered once
/// each; once the first is done, the session continues.
#[test]
fn a_session_open_in_one_cordon_is_refused_to_another() {
    use std::io::BufRead;
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Waiting.").with_tool_call(
                "b1",
                "bash",
                json!({"command": "sleep 2; echo slept"}),
            ))
            .turn(Turn::text("Done waiting.").expect_tool_results(["b1"]))
            .turn(Turn::text("Continued.").expect_contains("and now?")),
    );
    let mut first = exec_command(&server, ws.path(), home.path(), &["--json", "wait a bit"])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(first.stdout.take().unwrap()).lines();
    let started: Value = serde_json::from_str(&lines.next().unwrap().unwrap()).unwrap();
    let id = started["session_id"].as_str().unwrap().to_string();
    let log = home.path().join(format!("data/cordon/sessions/{id}.jsonl"));
    let before = std::fs::read(&log).unwrap();

    let second = exec(
        &server,
        ws.path(),
        home.path(),
        &["--resume", &id, "and now?"],
    );
    let err = String::from_utf8_lossy(&second.stderr);
    assert_eq!(second.status.code(), Some(78), "{err}");
    assert!(err.contains("open in another cordon"), "{err}");
    assert!(
        std::fs::read(&log).unwrap().starts_with(&before),
        "the refused cordon changed the log"
    );
    let rest: Vec<String> = lines.map(Result::unwrap).collect();
    assert!(first.wait().unwrap().success(), "{rest:?}");

    let third = exec(
        &server,
        ws.path(),
        home.path(),
        &["--resume", &id, "and now?"],
    );
    assert_success(&third);
    server.assert_finished();
    let seqs: Vec<u64> = std::fs::read_to_string(&log)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<Value>(l).unwrap()["seq"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(seqs, (0..seqs.len() as u64).collect::<Vec<_>>());
}

#[test]
fn a_task_writes_hello_py_runs_it_and_streams_progress() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(hello_scenario());
    let out = exec(
        &server,
        ws.path(),
        home.path(),
        &["write hello.py and run it", "-o", "last.txt"],
    );
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    server.assert_finished();
    assert_eq!(
        std::fs::read_to_string(ws.path().join("hello.py")).unwrap(),
        "print('hello from the sandbox')\n"
    );
    assert!(stdout.contains("hello.py prints its greeting."), "{stdout}");
    assert!(stderr.contains("▸ bash python3 hello.py"), "{stderr}");
    assert!(stderr.contains("hello from the sandbox"), "{stderr}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("last.txt")).unwrap(),
        "hello.py prints its greeting."
    );
    // The session is on disk.
    let sessions: Vec<_> = std::fs::read_dir(home.path().join("data/cordon/sessions"))
        .unwrap()
        .flatten()
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        .collect();
    assert_eq!(sessions.len(), 1);
    let log = std::fs::read_to_string(sessions[0].path()).unwrap();
    assert!(
        log.contains("\"type\":\"session_started\"")
            && log.contains("\"type\":\"tool_call_finished\"")
    );
}

#[test]
fn json_output_is_one_documented_event_per_line() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(hello_scenario());
    let out = exec(
        &server,
        ws.path(),
        home.path(),
        &["--json", "write hello.py and run it"],
    );
    assert_success(&out);
    let events: Vec<Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    assert_valid(&events);
    let types: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    assert_eq!(types.first(), Some(&"session_started"));
    assert_eq!(types.last(), Some(&"turn_completed"));
    for t in ["text_delta", "tool_call_started", "assistant_message"] {
        assert!(types.contains(&t), "no {t} in {types:?}");
    }
    let started = &events[0];
    for k in ["session_id", "model", "provider", "workspace"] {
        assert!(started.get(k).is_some(), "session_started lacks {k}");
    }
    let finished = events
        .iter()
        .find(|e| e["type"] == "tool_call_finished" && e["name"] == "bash")
        .unwrap();
    assert!(
        finished["output"]
            .as_str()
            .unwrap()
            .contains("hello from the sandbox")
    );
    assert_eq!(finished["is_error"], false);
    let done = events.last().unwrap();
    assert_eq!(done["steps"], 3);
    assert!(done["usage"]["output_tokens"].is_u64());
}

/// Issue 35: the user's AGENTS.md, then the workspace's, reach the model
/// after cordon's prompt, each under its path, a long one cut where it
/// says so; `--json`'s first event names them. A workspace AGENTS.md that
/// is a link out of the workspace (to a host secret) is not read.
#[test]
fn project_instructions_reach_the_model_in_order_with_their_paths_and_a_cap() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let user = home.path().join("config/cordon");
    std::fs::create_dir_all(&user).unwrap();
    std::fs::write(user.join("AGENTS.md"), "USER-RULE: answer in English.\n").unwrap();
    let mut project = String::from("PROJECT-RULE: run make check before you finish.\n");
    while project.len() < 40 * 1024 {
        project.push_str("filler line of the project's long instructions\n");
    }
    project.push_str("PROJECT-TAIL\n");
    std::fs::write(ws.path().join("AGENTS.md"), &project).unwrap();
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("Noted.")));
    let out = exec(
        &server,
        ws.path(),
        home.path(),
        &["--json", "what are the rules?"],
    );
    assert_success(&out);
    let events = json_lines(&out);
    assert_valid(&events);
    let read = &events[0]["instructions"];
    assert_eq!(read[0]["path"], "~/.config/cordon/AGENTS.md", "{read}");
    assert_eq!(read[1]["path"], "/workspace/AGENTS.md");
    assert_eq!(read[1]["bytes"], project.len() as u64);
    assert_eq!(read[1]["cut_at"], 32 * 1024);
    let sent = &server.requests()[0].raw_body;
    let at = |needle: &str| {
        sent.find(needle)
            .unwrap_or_else(|| panic!("the request lacks {needle:?}"))
    };
    assert!(at("You are cordon") < at("## ~/.config/cordon/AGENTS.md"));
    assert!(at("## ~/.config/cordon/AGENTS.md") < at("USER-RULE"));
    assert!(at("USER-RULE") < at("## /workspace/AGENTS.md"));
    assert!(at("## /workspace/AGENTS.md") < at("PROJECT-RULE"));
    at("/workspace/AGENTS.md is cut here: only its first 32768 of");
    assert!(!sent.contains("PROJECT-TAIL"), "the cut part was sent");

    // The sandbox plants a link to a host file in place of the file.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "HOST-SECRET-7f3a").unwrap();
    std::fs::remove_file(ws.path().join("AGENTS.md")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), ws.path().join("AGENTS.md")).unwrap();
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("Noted.")));
    let out = exec(&server, ws.path(), home.path(), &["--json", "again"]);
    assert_success(&out);
    let events = json_lines(&out);
    let read = events[0]["instructions"].as_array().unwrap();
    assert_eq!(read.len(), 1, "only the user's file: {read:?}");
    assert!(!server.requests()[0].raw_body.contains("HOST-SECRET-7f3a"));
}

/// Issue 35: the model's multi-file patch through `cordon exec`: applied
/// whole, and a second one whose hunk does not apply changes nothing and
/// tells the model which file and hunk.
#[test]
fn a_model_s_patch_is_applied_whole_or_not_at_all() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.py"), "x = 1\ny = 2\nz = 3\n").unwrap();
    let good = "--- a/a.py\n+++ b/a.py\n@@ -1,3 +1,3 @@\n x = 1\n-y = 2\n+y = 20\n z = 3\n\
                --- /dev/null\n+++ b/pkg/b.py\n@@ -0,0 +1 @@\n+print('b')\n";
    let bad = "--- a/a.py\n+++ b/a.py\n@@ -1 +1 @@\n-x = 1\n+x = 10\n\
               --- a/pkg/b.py\n+++ b/pkg/b.py\n@@ -1 +1 @@\n-print('nope')\n+print('c')\n";
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Patching.").with_tool_call(
                "p1",
                "apply_patch",
                json!({"patch": good}),
            ))
            .turn(
                Turn::text("Again.")
                    .with_tool_call("p2", "apply_patch", json!({"patch": bad}))
                    .expect_tool_results(["p1"])
                    .expect_contains("updated /workspace/a.py"),
            )
            .turn(
                Turn::text("The second patch did not apply.")
                    .expect_tool_results(["p2"])
                    .expect_contains("/workspace/pkg/b.py: hunk 1 of 1 does not apply")
                    .expect_contains("Nothing was changed"),
            ),
    );
    let out = exec(&server, ws.path(), home.path(), &["patch the project"]);
    assert_success(&out);
    server.assert_no_failures();
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.py")).unwrap(),
        "x = 1\ny = 20\nz = 3\n",
        "the first patch landed and the second's good hunk did not"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("pkg/b.py")).unwrap(),
        "print('b')\n"
    );
}

/// `update_plan` reaches `exec --json` as `plan_updated`, whole, after its
/// call; a plan the tool refuses is no event; both are in the session log.
#[test]
fn the_model_s_plan_is_an_event_and_a_log_record() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let plan = json!({"explanation": "two steps", "plan": [
        {"step": "write the test", "status": "in_progress"},
        {"step": "make it pass", "status": "pending"},
    ]});
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Planning.")
                    .with_tool_call("p1", "update_plan", plan.clone())
                    .with_tool_call(
                        "p2",
                        "update_plan",
                        json!({"plan": [
                            {"step": "a", "status": "in_progress"},
                            {"step": "b", "status": "in_progress"},
                        ]}),
                    ),
            )
            .turn(
                Turn::text("Planned.")
                    .expect_tool_results(["p1", "p2"])
                    .expect_contains("0 of 2 steps completed; now: write the test")
                    .expect_contains("at most one may be"),
            ),
    );
    let out = exec(&server, ws.path(), home.path(), &["--json", "plan it"]);
    assert_success(&out);
    server.assert_no_failures();
    let events = json_lines(&out);
    assert_valid(&events);
    let plans: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "plan_updated")
        .collect();
    assert_eq!(plans.len(), 1, "{events:?}");
    assert_eq!(plans[0]["plan"], plan["plan"]);
    assert_eq!(plans[0]["explanation"], "two steps");
    let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let at = kinds.iter().position(|k| *k == "plan_updated").unwrap();
    assert_eq!(
        kinds[at - 1],
        "tool_call_finished",
        "after its call: {kinds:?}"
    );
    let id = events[0]["session_id"].as_str().unwrap();
    let log = std::fs::read_to_string(home.path().join(format!("data/cordon/sessions/{id}.jsonl")))
        .unwrap();
    assert_eq!(log.matches("\"type\":\"plan_updated\"").count(), 1, "{log}");
}

/// With `web_search` on, the Anthropic request offers the provider's own
/// search; what it found is shown as a tool call that ran, sent back
/// intact (its encrypted pages too), and a paused turn goes on by itself.
/// An OpenAI-compatible server has no such tool: a clear error.
#[test]
fn the_provider_s_web_search_is_offered_shown_and_sent_back() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Searching.")
                    .with_web_search(
                        "srvtoolu_1",
                        "cordon sandbox",
                        &[("https://a.example/docs", "Cordon docs")],
                    )
                    .stop(cordon_testkit::StopReason::PauseTurn)
                    .expect_contains("web_search_20250305"),
            )
            .turn(
                Turn::text("Cordon is a sandboxed agent.")
                    .expect_contains("enc:https://a.example/docs")
                    .expect_contains("server_tool_use"),
            ),
    );
    let out = exec(
        &server,
        ws.path(),
        home.path(),
        &["--json", "--set", "web_search=3", "what is cordon?"],
    );
    assert_success(&out);
    server.assert_no_failures();
    let first = &server.requests()[0].body;
    assert_eq!(first["tools"][0]["max_uses"], 3, "{}", first["tools"]);
    let events = json_lines(&out);
    assert_valid(&events);
    let started = events
        .iter()
        .find(|e| e["type"] == "tool_call_started" && e["name"] == "web_search")
        .unwrap_or_else(|| panic!("no search shown: {events:?}"));
    assert_eq!(started["input"]["query"], "cordon sandbox");
    let finished = events
        .iter()
        .find(|e| e["type"] == "tool_call_finished" && e["name"] == "web_search")
        .unwrap();
    assert_eq!(finished["output"], "Cordon docs — https://a.example/docs");
    let done = events.last().unwrap();
    assert_eq!(done["type"], "turn_completed");
    assert_eq!(done["steps"], 2, "the paused turn went on: {done}");

    // Without the provider's tool, a configuration error before any request.
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("unused")));
    let out = exec_command(
        &server,
        ws.path(),
        home.path(),
        &["--set", "web_search=on", "hi"],
    )
    .env("OPENAI_BASE_URL", format!("{}/v1", server.url()))
    .args(["--provider", "openai", "--model", "m"])
    .output()
    .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("web_search is the Anthropic API's own tool"),
        "{err}"
    );
    assert!(server.requests().is_empty());
}

/// `task`: a helper with its own context, in the same sandbox, whose
/// answer is the call's result; its steps show as the call's output; it
/// cannot start helpers itself; its tokens count in the turn.
#[test]
fn a_task_helper_works_in_the_sandbox_and_answers_the_caller() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "").unwrap();
    std::fs::write(ws.path().join("b.txt"), "").unwrap();
    let usage = |input| cordon_testkit::Usage {
        input_tokens: input,
        output_tokens: 10,
        ..Default::default()
    };
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Delegating.")
                    .with_tool_call(
                        "t1",
                        "task",
                        json!({"description": "count text files", "prompt": "Count the .txt files in /workspace; answer with the number."}),
                    )
                    .usage(usage(100)),
            )
            // The helper: its own context, the helper's prompt, no task tool.
            .turn(
                Turn::text("Counting.")
                    .with_tool_call("h1", "bash", json!({"command": "cd /tmp; ls /workspace/*.txt | wc -l"}))
                    .expect_contains("# You are a helper")
                    .expect_contains("Count the .txt files")
                    .expect_lacks("Delegating.")
                    .expect_lacks("\"name\":\"task\"")
                    .usage(usage(1000)),
            )
            .turn(
                Turn::text("There are 2 .txt files.")
                    .expect_tool_results(["h1"])
                    .usage(usage(1000)),
            )
            .turn(
                Turn::text("Then a command of mine.")
                    .with_tool_call("b1", "bash", json!({"command": "pwd"}))
                    .expect_tool_results(["t1"])
                    .expect_contains("There are 2 .txt files.")
                    .usage(usage(100)),
            )
            .turn(
                Turn::text("Two files.")
                    .expect_tool_results(["b1"])
                    // The helper's `cd` was its own shell's.
                    .expect_contains("/workspace")
                    .expect_lacks("/tmp\n")
                    .usage(usage(100)),
            ),
    );
    let out = exec(
        &server,
        ws.path(),
        home.path(),
        &["--json", "how many text files?"],
    );
    assert_success(&out);
    server.assert_no_failures();
    let first = server.requests()[0].body["tools"].to_string();
    assert!(first.contains("\"task\""), "{first}");
    let events = json_lines(&out);
    assert_valid(&events);
    let live: String = events
        .iter()
        .filter(|e| e["type"] == "tool_output" && e["id"] == "t1")
        .map(|e| e["text"].as_str().unwrap().to_string())
        .collect();
    assert!(
        live.contains("▸ bash cd /tmp; ls /workspace/*.txt | wc -l"),
        "{live}"
    );
    assert!(live.contains("✓ Exit code: 0"), "{live}");
    let done = events
        .iter()
        .find(|e| e["type"] == "tool_call_finished" && e["id"] == "t1")
        .unwrap();
    assert_eq!(done["output"], "There are 2 .txt files.");
    assert_eq!(done["is_error"], false);
    assert_eq!(done["structured"]["tool_calls"], 1);
    let last = events.last().unwrap();
    assert_eq!(last["type"], "turn_completed");
    assert_eq!(
        last["usage"]["input_tokens"], 2300,
        "the helper's tokens count: {last}"
    );
}

/// `--attach`: the image reaches the model before the prompt, as an image
/// block (Anthropic) and as an image part (OpenAI); a file that is not an
/// image, or a link planted in the workspace, stops before any request.
#[test]
fn attached_images_reach_the_model_on_both_wire_formats() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    // A 1x1 PNG.
    let png = base64_decode(
        "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==",
    );
    std::fs::write(ws.path().join("shot.png"), &png).unwrap();
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("A single pixel.")));
    let out = exec(
        &server,
        ws.path(),
        home.path(),
        &["--attach", "shot.png", "what is this?"],
    );
    assert_success(&out);
    let body = &server.requests()[0].body;
    let content = &body["messages"][0]["content"];
    assert_eq!(content[0]["type"], "image", "{content}");
    assert_eq!(content[0]["source"]["media_type"], "image/png");
    assert_eq!(content[1]["text"], "what is this?");

    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("A single pixel.")));
    let out = exec_command(
        &server,
        ws.path(),
        home.path(),
        &["--attach", "shot.png", "what is this?"],
    )
    .env("OPENAI_BASE_URL", format!("{}/v1", server.url()))
    .args(["--provider", "openai", "--model", "m"])
    .output()
    .unwrap();
    assert_success(&out);
    let body = &server.requests()[0].body;
    let user = body["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .unwrap();
    let url = user["content"][0]["image_url"]["url"].as_str().unwrap();
    assert!(url.starts_with("data:image/png;base64,iVBOR"), "{url}");
    assert_eq!(user["content"][1]["text"], "what is this?");

    // Not an image; a link out of the workspace: refused before anything.
    std::fs::write(ws.path().join("notes.txt"), "hi").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("private.png"), &png).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("private.png"),
        ws.path().join("link.png"),
    )
    .unwrap();
    for (file, why) in [("notes.txt", "not a PNG"), ("link.png", "link.png")] {
        let server = ScriptedServer::start(Scenario::new());
        let out = exec(&server, ws.path(), home.path(), &["--attach", file, "look"]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{err}");
        assert!(err.contains(why), "{err}");
        assert!(server.requests().is_empty());
    }
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap()
}

/// Command rules: the user's `deny` stops a command wherever it is in the
/// line, an `ask` with nobody to ask is refused, an `allow`ed command
/// runs; a project file adds `deny` rules and no others (reported).
#[test]
fn command_rules_allow_ask_and_deny_shell_commands() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("config/cordon")).unwrap();
    std::fs::write(
        home.path().join("config/cordon/config.toml"),
        "[rules]\nallow = [\"ls\"]\nask = [\"git push\"]\ndeny = [\"curl\"]\n",
    )
    .unwrap();
    std::fs::create_dir_all(ws.path().join(".cordon")).unwrap();
    std::fs::write(
        ws.path().join(".cordon/config.toml"),
        "[rules]\ndeny = [\"rm\"]\nallow = [\"curl\"]\n",
    )
    .unwrap();
    std::fs::write(ws.path().join("keep.txt"), "kept\n").unwrap();
    let bash = |id: &str, cmd: &str| (id.to_string(), json!({ "command": cmd }));
    let calls = [
        bash("c1", "ls; curl https://x.example"),
        bash("c2", "rm -f keep.txt"),
        bash("c3", "git push origin main"),
        bash("c4", "ls keep.txt"),
    ];
    let mut first = Turn::text("Trying.");
    for (id, input) in &calls {
        first = first.with_tool_call(id, "bash", input.clone());
    }
    let server = ScriptedServer::start(
        Scenario::new().turn(first).turn(
            Turn::text("Some were refused.")
                .expect_tool_results(["c1", "c2", "c3", "c4"])
                .expect_contains("denies commands starting with `curl`")
                .expect_contains("denies commands starting with `rm`")
                .expect_contains("nobody can be asked here")
                .expect_contains("keep.txt\n"),
        ),
    );
    let out = exec(&server, ws.path(), home.path(), &["try things"]);
    assert_success(&out);
    server.assert_no_failures();
    assert_eq!(
        std::fs::read_to_string(ws.path().join("keep.txt")).unwrap(),
        "kept\n"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rules.allow"),
        "the ignored project rule is not reported: {err}"
    );
    let results = server.requests()[1].body.to_string();
    assert!(
        !results.contains("Could not resolve"),
        "curl ran: {results}"
    );
}

/// Hooks from the user's configuration: session_start's output reaches
/// the model; before_tool refuses a call with a reason the model sees;
/// after_tool adds to a result; stop sends the model on once; a failing
/// hook is reported and changes nothing; a host hook runs on the host; a
/// project file's hooks are ignored, and said so.
#[test]
fn hooks_run_around_tools_and_at_the_end_of_a_turn() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let seen = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("config/cordon")).unwrap();
    let config = format!(
        r#"
[[hooks]]
event = "session_start"
command = "echo The build command is make check"

[[hooks]]
event = "before_tool"
tools = ["bash"]
command = "if grep -q forbidden; then echo 'no forbidden things here' >&2; exit 2; fi"

[[hooks]]
event = "before_tool"
tools = ["write_file"]
command = "exit 7"

[[hooks]]
event = "after_tool"
tools = ["bash"]
command = "echo 'lint: 0 warnings' >&2; exit 2"

[[hooks]]
event = "after_tool"
tools = ["write_file"]
host = true
command = "cat > {seen}/call.json"

[[hooks]]
event = "stop"
command = "[ -e /tmp/stopped-once ] && exit 0; touch /tmp/stopped-once; echo 'run the tests first' >&2; exit 2"
"#,
        seen = seen.path().display()
    );
    std::fs::write(home.path().join("config/cordon/config.toml"), config).unwrap();
    std::fs::create_dir_all(ws.path().join(".cordon")).unwrap();
    std::fs::write(
        ws.path().join(".cordon/config.toml"),
        "[[hooks]]\nevent = \"stop\"\ncommand = \"exit 2\"\n",
    )
    .unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Working.")
                    .with_tool_call("c1", "bash", json!({"command": "echo forbidden"}))
                    .with_tool_call("c2", "bash", json!({"command": "echo fine"}))
                    .with_tool_call("c3", "write_file", json!({"path": "a.txt", "content": "a\n"}))
                    .expect_contains("The build command is make check"),
            )
            .turn(
                Turn::text("Done.")
                    .expect_tool_results(["c1", "c2", "c3"])
                    .expect_contains("A before_tool hook of the user's refused this call: no forbidden things here")
                    .expect_contains("[An after_tool hook of the user's says:]\nlint: 0 warnings"),
            )
            .turn(
                Turn::text("Tests pass.")
                    .expect_contains("did not let the turn end yet. It says:]\nrun the tests first"),
            ),
    );
    let out = exec(&server, ws.path(), home.path(), &["--json", "do it"]);
    assert_success(&out);
    server.assert_no_failures();
    let events = json_lines(&out);
    assert_valid(&events);
    let failed: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "hook_failed")
        .collect();
    assert_eq!(failed.len(), 1, "{events:?}");
    assert_eq!(failed[0]["event"], "before_tool");
    assert!(
        failed[0]["message"]
            .as_str()
            .unwrap()
            .contains("exited with 7")
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "a\n"
    );
    let call: Value =
        serde_json::from_str(&std::fs::read_to_string(seen.path().join("call.json")).unwrap())
            .unwrap();
    assert_eq!(call["event"], "after_tool");
    assert_eq!(call["tool"]["name"], "write_file");
    assert_eq!(call["tool"]["is_error"], false);
    assert_eq!(events.last().unwrap()["type"], "turn_completed");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("hooks[1]"),
        "the project's hook is not reported: {err}"
    );
}

/// `--mode plan`: only read-only tools are offered, the model is asked
/// for a plan, and a write it asks for anyway is refused.
#[test]
fn plan_mode_offers_read_only_tools_and_refuses_a_write() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("main.py"), "print(1)\n").unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Looking.")
                    .with_tool_call("r1", "read_file", json!({"path": "main.py"}))
                    .with_tool_call(
                        "w1",
                        "write_file",
                        json!({"path": "main.py", "content": "print(2)\n"}),
                    )
                    .expect_contains("# Plan mode"),
            )
            .turn(
                Turn::text("Plan: 1. change the 1 to a 2 in main.py. 2. run it.")
                    .expect_tool_results(["r1", "w1"])
                    .expect_contains("print(1)")
                    .expect_contains("Not run: this is plan mode"),
            ),
    );
    let out = exec(
        &server,
        ws.path(),
        home.path(),
        &["--mode", "plan", "make it print 2"],
    );
    assert_success(&out);
    server.assert_no_failures();
    assert_eq!(
        std::fs::read_to_string(ws.path().join("main.py")).unwrap(),
        "print(1)\n"
    );
    let tools: Vec<String> = server.requests()[0].body["tools"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap().to_string())
        .collect();
    for changes in [
        "bash",
        "write_file",
        "edit_file",
        "apply_patch",
        "run_code",
        "task",
    ] {
        assert!(
            !tools.contains(&changes.to_string()),
            "{changes} offered: {tools:?}"
        );
    }
    for reads in ["read_file", "list_dir", "search_files", "update_plan"] {
        assert!(
            tools.contains(&reads.to_string()),
            "{reads} missing: {tools:?}"
        );
    }
    let out = exec(&server, ws.path(), home.path(), &["--mode", "later", "x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(125),
        "a bad mode is a usage error: {err}"
    );
    assert!(err.contains("work or plan"), "{err}");
}

#[test]
fn exit_codes_separate_config_and_model_errors() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    // No key at all: a configuration error, before any request.
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("unused")));
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["exec", "hi"])
        .current_dir(ws.path())
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home.path())
        .env("ANTHROPIC_BASE_URL", server.url())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("ANTHROPIC_API_KEY"));
    assert!(server.requests().is_empty());
    // A key the server rejects: a model error, explained in one line.
    let server =
        ScriptedServer::start(Scenario::new().turn(Turn::text("x").fault(Fault::auth_error())));
    let out = exec(&server, ws.path(), home.path(), &["hi"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("rejected the key") && err.lines().count() == 1,
        "{err}"
    );
}

#[test]
fn the_prompt_comes_from_stdin_only_when_it_is_a_dash() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new().turn(Turn::text("Got it.").expect_contains("multi\\nline task")),
    );
    let mut child = exec_command(&server, ws.path(), home.path(), &["-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    use std::io::Write;
    child
        .stdin
        .take()
        .unwrap()
        .write_all(b"multi\nline task")
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).contains("Got it."));
    server.assert_finished();
}

#[test]
fn a_resumed_session_continues_with_the_earlier_context() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Noted: 4217."))
            // The second request must carry the first turn, question and answer.
            .turn(
                Turn::text("You asked me to remember 4217.")
                    .expect_contains("remember the number 4217")
                    .expect_contains("Noted: 4217.")
                    .expect_contains("which number"),
            ),
    );
    let out = exec(
        &server,
        ws.path(),
        home.path(),
        &["remember the number 4217"],
    );
    assert_success(&out);
    // `--last` is this workspace's last session: from elsewhere there is
    // none, and it says so rather than taking another project's.
    let other = tempfile::tempdir().unwrap();
    let out = exec(
        &server,
        other.path(),
        home.path(),
        &["--last", "which number?"],
    );
    assert_eq!(out.status.code(), Some(78));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("no session has worked in"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Resumed by id from elsewhere: its own workspace is used, and said.
    let sessions = |cwd: &Path, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_cordon"))
            .arg("sessions")
            .args(args)
            .current_dir(cwd)
            .env_clear()
            .env("HOME", home.path())
            .env("XDG_DATA_HOME", home.path().join("data"))
            .output()
            .unwrap()
    };
    let listed = sessions(ws.path(), &["--json"]);
    let row: Value = serde_json::from_str(String::from_utf8_lossy(&listed.stdout).trim()).unwrap();
    let id = row["id"].as_str().unwrap().to_string();
    let out = exec(
        &server,
        other.path(),
        home.path(),
        &["--resume", &id, "--json", "which number?"],
    );
    assert_success(&out);
    server.assert_finished();
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("not in this directory: it continues there"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first: Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    assert_eq!(first["resumed"], true);
    assert_eq!(
        std::fs::canonicalize(first["workspace"].as_str().unwrap()).unwrap(),
        std::fs::canonicalize(ws.path()).unwrap()
    );
    // One session, two turns, listed in its workspace and under --all only.
    for (cwd, args) in [(ws.path(), &[][..]), (other.path(), &["--all"][..])] {
        let list = sessions(cwd, args);
        let text = String::from_utf8_lossy(&list.stdout);
        let rows: Vec<&str> = text.lines().skip(1).collect();
        assert_eq!(rows.len(), 1, "{text}");
        assert!(rows[0].contains("remember the number 4217"), "{text}");
        let cols: Vec<&str> = rows[0].split_whitespace().collect();
        assert_eq!(cols[3], "2", "turns: {text}");
    }
    let list = sessions(other.path(), &[]);
    assert!(
        String::from_utf8_lossy(&list.stdout).starts_with("no sessions in"),
        "{list:?}"
    );
    // An unknown id is a clear configuration error.
    let out = exec(&server, ws.path(), home.path(), &["--resume", "nope", "hi"]);
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no session \"nope\""));
}

/// Estimated tokens of `cordon exec`'s first request, bar the prompt: the
/// window in the test below is set relative to it, so the test holds
/// whatever the tools' descriptions weigh.
fn base_tokens() -> u64 {
    let tools = cordon_agent::agent::tool_specs(&Toolbox::agent());
    let request = cordon_agent::ModelRequest {
        model: "m".into(),
        // About the size of exec's system prompt.
        system: "s".repeat(600),
        messages: vec![],
        tools,
        max_tokens: 1024,
        web_search: None,
    };
    cordon_agent::context::estimate_request(&request)
}

#[test]
fn a_long_session_compacts_stays_under_budget_and_resumes_from_the_summary() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let base = base_tokens();
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
            .turn(
                Turn::text("SUMMARY-e2e: echoed small, printed 16000 a's.")
                    .expect_contains("about to be compacted"),
            )
            .turn(
                Turn::text("Done with the long task.")
                    .expect_contains("SUMMARY-e2e")
                    .expect_max_input_chars(budget_chars),
            ),
    );
    let settings = [
        "--set".to_string(),
        format!("context_window={window}"),
        "--set".into(),
        "compact_threshold=0.5".into(),
        "--set".into(),
        "max_tokens=1024".into(),
    ];
    let mut args: Vec<&str> = settings.iter().map(String::as_str).collect();
    args.extend(["--json", "a long task"]);
    let out = exec(&server, ws.path(), home.path(), &args);
    assert_success(&out);
    server.assert_finished();
    let events = json_lines(&out);
    assert_valid(&events);
    let compacted = events
        .iter()
        .find(|e| e["type"] == "compacted")
        .expect("a compaction");
    assert!(compacted["tokens_after"].as_u64() < compacted["tokens_before"].as_u64());
    let done = events.last().unwrap();
    assert!(
        done["context_tokens"].as_u64().unwrap() < window / 2,
        "{done}"
    );
    // Every request after the summary stays under the threshold, counted
    // as the server counts.
    let requests = server.requests();
    let summary_at = requests
        .iter()
        .position(|r| r.raw_body.contains("about to be compacted"))
        .unwrap();
    assert!(
        compacted["tokens_before"].as_u64().unwrap() > window / 2,
        "compaction was needed: {compacted}"
    );
    for r in &requests[summary_at + 1..] {
        assert!(r.raw_body.chars().count() <= budget_chars);
    }

    // Resumed, the conversation continues from the summary, not the output.
    let server = ScriptedServer::start(
        Scenario::new().turn(
            Turn::text("The long task printed a lot of a's.")
                .expect_contains("SUMMARY-e2e")
                .expect_contains("what did it print")
                .expect_max_input_chars(budget_chars),
        ),
    );
    let mut args: Vec<&str> = settings.iter().map(String::as_str).collect();
    args.extend(["--last", "what did it print?"]);
    let out = exec(&server, ws.path(), home.path(), &args);
    assert_success(&out);
    server.assert_finished();
    // The full output is still in the log on disk.
    let dir = home.path().join("data/cordon/sessions");
    let log = std::fs::read_dir(&dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .unwrap();
    let raw = std::fs::read_to_string(log).unwrap();
    assert!(raw.contains(&"a".repeat(16000)));
}

#[test]
fn context_too_long_is_survived_once_and_then_reported_in_one_line() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Looking.").with_tool_call(
                "t1",
                "bash",
                json!({"command": "echo hi"}),
            ))
            .turn(
                Turn::text("SUMMARY-ctl: echoed hi.")
                    .fault(Fault::context_too_long(210_000, 200_000)),
            )
            .turn(Turn::text("Fine after compacting.").expect_contains("SUMMARY-ctl")),
    );
    let out = exec(&server, ws.path(), home.path(), &["say hi"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("compacting the conversation"), "{stderr}");
    assert!(String::from_utf8_lossy(&out.stdout).contains("Fine after compacting."));
    server.assert_finished();

    // Still too long after compacting: exit 1, one line saying so.
    let home = tempfile::tempdir().unwrap();
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
            .turn(Turn::text("never").fault(Fault::context_too_long(205_000, 200_000))),
    );
    let out = exec(&server, ws.path(), home.path(), &["say hi"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let errors: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("cordon:"))
        .collect();
    assert_eq!(errors.len(), 1, "{stderr}");
    assert!(
        errors[0].contains("no longer fits the model's context window"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");
}

/// `--backend microvm`, or `backend = "microvm"` under `[sandbox]` in the
/// config file, puts the agent's tools in a virtual machine with its own
/// kernel; the flag overrides the file.
#[test]
fn the_backend_comes_from_the_flag_or_the_config_file() {
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let kernel_of = |args: &[&str], config: Option<&str>| -> String {
        let ws = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        if let Some(c) = config {
            let dir = home.path().join("config/cordon");
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join("config.toml"), c).unwrap();
        }
        let server = ScriptedServer::start(
            Scenario::new()
                .turn(Turn::text("Checking.").with_tool_call(
                    "k1",
                    "bash",
                    json!({"command": "uname -r > kernel.txt"}),
                ))
                .turn(Turn::text("Done.").expect_tool_results(["k1"])),
        );
        let mut all = args.to_vec();
        all.push("which kernel is this?");
        let out = exec(&server, ws.path(), home.path(), &all);
        assert_success(&out);
        server.assert_finished();
        std::fs::read_to_string(ws.path().join("kernel.txt")).unwrap()
    };
    let microvm = "[sandbox]\nbackend = \"microvm\"\n";
    let by_flag = kernel_of(&["--backend", "microvm"], None);
    assert_ne!(by_flag, host, "--backend microvm ran on the host's kernel");
    assert_eq!(kernel_of(&[], Some(microvm)), by_flag);
    assert_eq!(kernel_of(&["--backend", "native"], Some(microvm)), host);
}

/// A command's output is on stderr while it still runs (not only when it
/// ends), free of the terminal's control sequences, and Ctrl-C keeps it:
/// the cancelled call reports what it had printed.
#[test]
fn tool_output_streams_while_the_command_runs_and_ctrl_c_keeps_it() {
    use std::io::{BufRead, BufReader};
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(Scenario::new().turn(
        Turn::text("Building.").with_tool_call(
            "b1",
            "bash",
            json!({"command": "printf 'compiling step 1\\n\\033]52;c;cHduZWQ=\\007\\033[2Kdone 1\\n'; sleep 60"}),
        ),
    ));
    let mut child = exec_command(&server, ws.path(), home.path(), &["build it"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stderr = child.stderr.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    let started = std::time::Instant::now();
    let mut lines = Vec::new();
    while !lines.iter().any(|l: &String| l.contains("done 1")) {
        match rx.recv_timeout(std::time::Duration::from_secs(30)) {
            Ok(l) => lines.push(l),
            Err(_) => panic!("no live output within 30 s: {lines:?}"),
        }
    }
    assert!(
        started.elapsed() < std::time::Duration::from_secs(30),
        "the output came only when the command ended"
    );
    let live = lines.join("\n");
    assert!(live.contains("compiling step 1"), "{live}");
    assert!(
        !live.contains('\u{1b}') && !live.contains('\u{7}'),
        "control sequences reached the terminal: {live:?}"
    );
    rustix::process::kill_process(
        rustix::process::Pid::from_raw(child.id() as i32).unwrap(),
        rustix::process::Signal::INT,
    )
    .unwrap();
    let status = child.wait().unwrap();
    assert_eq!(status.code(), Some(130));
    let rest: Vec<String> = rx.iter().collect();
    let finished = rest.join("\n");
    assert!(
        finished.contains("✗") && finished.contains("cancelled"),
        "the cancelled call was not reported: {finished}"
    );
}

/// Issue 32: a sandbox stopped for its disk budget ends `exec` with the
/// documented 123, said once in a `cordon:` line; a command that failed is
/// marked ✗, not ✓; counts are singular when one. No log line (timestamp,
/// level, module path, colour) reaches the terminal.
#[test]
fn a_disk_stop_exits_123_and_the_terminal_gets_cordon_lines_only() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Failing first.").with_tool_call(
                "t1",
                "bash",
                json!({"command": "false"}),
            ))
            .turn(
                Turn::text("Filling it.")
                    .with_tool_call(
                        "t2",
                        "bash",
                        json!({"command": "head -c 64000000 /dev/zero > big; sleep 2; echo wrote"}),
                    )
                    .expect_tool_results(["t1"]),
            )
            .turn(Turn::text("The disk filled up.").expect_tool_results(["t2"])),
    );
    let out = exec(
        &server,
        ws.path(),
        home.path(),
        &["--disk", "16M", "fill the disk"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(123), "{err}");
    assert!(err.contains("✗ Exit code: 1"), "{err}");
    assert!(!err.contains("✓ Exit code: 1"), "{err}");
    // The model's view of it (the tool's ✗), then cordon's, once.
    let stops = err
        .lines()
        .filter(|l| l.starts_with("cordon:") && l.contains("disk budget"))
        .count();
    assert_eq!(stops, 1, "the stop is said once: {err}");
    for line in err.lines() {
        assert!(!line.contains('\u{1b}'), "a colour code: {line:?}");
        assert!(
            !line.contains(" WARN ") && !line.contains(" ERROR ") && !line.contains("cordon_"),
            "a log line: {line:?}"
        );
    }
    assert!(err.contains("· 3 model requests"), "{err}");
}

/// Issue 32: with an OpenAI-compatible server and no model chosen, cordon
/// asks the server which it serves and uses its only one, unpriced (its
/// price is not known); with several, it names them and exits 78, having
/// sent no model request.
#[test]
fn an_openai_compatible_server_s_only_model_is_used_and_not_priced() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .serving_models(["qwen2.5-coder:7b"])
            .turn(Turn::text("Hello.")),
    );
    let out = support::exec_against(&server, true, ws.path(), home.path(), &["say hello"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{err}");
    let asked = &server.requests()[0].body;
    assert_eq!(asked["model"], "qwen2.5-coder:7b", "{asked}");
    assert!(err.contains("· 1 model request,"), "{err}");
    assert!(
        !err.contains('$'),
        "an unknown model's price was guessed: {err}"
    );

    let server = ScriptedServer::start(
        Scenario::new()
            .serving_models(["llama3.1:8b", "qwen2.5-coder:7b"])
            .turn(Turn::text("unused")),
    );
    let out = support::exec_against(&server, true, ws.path(), home.path(), &["say hello"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("serves 2 models: llama3.1:8b, qwen2.5-coder:7b") && err.contains("--model"),
        "{err}"
    );
    assert!(server.requests().is_empty());
    // Chosen, it is used as given.
    let server = ScriptedServer::start(
        Scenario::new()
            .serving_models(["llama3.1:8b", "qwen2.5-coder:7b"])
            .turn(Turn::text("Hi.")),
    );
    let out = support::exec_against(
        &server,
        true,
        ws.path(),
        home.path(),
        &["--model", "llama3.1:8b", "say hello"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(server.requests()[0].body["model"], "llama3.1:8b");
}

/// Issue 32: the README's quick start, its lines as written. `cargo
/// install --path crates/cli` installs the package whose binary this test
/// runs (a release build per test run would take minutes: the test checks
/// the package makes `cordon`); `cordon` alone is typed in tmux by
/// chat.rs's `bare_cordon_completes_a_task_with_tool_calls`; the `export`
/// and `cd` lines and the `cordon exec` task run verbatim, in `sh`, with
/// the scripted model behind the key.
#[test]
fn the_readme_quick_start_runs_as_written() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("../..");
    let readme = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let section = readme
        .split("\n## Quick start\n")
        .nth(1)
        .expect("the README has a quick start");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("```").next())
        .expect("its first block is a shell block");
    // Each line without its comment.
    let lines: Vec<&str> = block
        .lines()
        .map(|l| l.split("  #").next().unwrap().trim())
        .filter(|l| !l.is_empty())
        .collect();
    assert_eq!(lines[0], "cargo install --path crates/cli", "{block}");
    let manifest = std::fs::read_to_string(repo.join("crates/cli/Cargo.toml")).unwrap();
    assert!(
        manifest.contains("[[bin]]\nname = \"cordon\""),
        "{manifest}"
    );
    assert!(lines.contains(&"cordon"), "{block}");
    let exec = lines
        .iter()
        .find(|l| l.starts_with("cordon exec "))
        .expect("a cordon exec line");
    let export = lines
        .iter()
        .find(|l| l.starts_with("export ANTHROPIC_API_KEY="))
        .expect("the key's line");
    let cd = lines
        .iter()
        .find(|l| l.starts_with("cd "))
        .expect("a cd line");

    let home = tempfile::tempdir().unwrap();
    let project = home.path().join(cd.trim_start_matches("cd ~/"));
    std::fs::create_dir_all(&project).unwrap();
    let server = ScriptedServer::start(hello_scenario());
    let bin = Path::new(env!("CARGO_BIN_EXE_cordon")).parent().unwrap();
    let script = format!("{export}\n{cd}\n{exec}\n");
    let out = Command::new("sh")
        .args(["-euc", &script])
        .env_clear()
        .env("PATH", format!("{}:/usr/bin:/bin", bin.display()))
        .env("HOME", home.path())
        .env("XDG_CONFIG_HOME", home.path().join("config"))
        .env("XDG_DATA_HOME", home.path().join("data"))
        .env("ANTHROPIC_BASE_URL", server.url())
        .output()
        .unwrap();
    assert_success(&out);
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("hello.py prints its greeting."),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(project.join("hello.py").exists());
    server.assert_finished();
}

/// A session started with `--image` runs there, and resumed without it
/// runs there again (its files and history were made there), saying so;
/// `--image` on the resume chooses another.
#[test]
fn a_session_in_an_image_resumes_in_it() {
    if rustix::process::geteuid().as_raw() != 0 {
        // Unprivileged, an image needs a subordinate id range this user
        // may not have; CI runs as root.
        assert!(std::env::var("CI").is_err(), "CI runs as root");
        eprintln!("notice: skipping: images as root only here");
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let layout = tempfile::tempdir().unwrap();
    cordon_testkit::oci::write_image(
        layout.path(),
        "v1",
        &[cordon_testkit::oci::busybox_layer()],
        json!({"Env": ["PATH=/bin"]}),
    );
    let image = format!("oci:{}:v1", layout.path().display());
    let look = |id: &str| {
        Turn::text("Looking.").with_tool_call(id, "bash", json!({"command": "cat /etc/os-release"}))
    };
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(look("a"))
            .turn(
                Turn::text("Busybox.")
                    .expect_tool_results(["a"])
                    .expect_contains("ID=cordon-busybox"),
            )
            .turn(look("b"))
            .turn(
                Turn::text("Still busybox.")
                    .expect_tool_results(["b"])
                    .expect_contains("ID=cordon-busybox"),
            ),
    );
    let store = home.path().join("images");
    let run = |args: &[&str]| {
        let mut c = exec_command(&server, ws.path(), home.path(), args);
        c.env("CORDON_IMAGE_STORE", &store);
        c.output().unwrap()
    };
    let out = run(&["--image", &image, "--json", "which system?"]);
    assert_success(&out);
    assert_valid(&json_lines(&out));
    let first = &json_lines(&out)[0];
    assert_eq!(first["image"], image.as_str(), "{first}");
    let id = first["session_id"].as_str().unwrap().to_string();

    let out = run(&["--resume", &id, "and now?"]);
    assert_success(&out);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("the session ran in image") && stderr.contains("it continues there"),
        "{stderr}"
    );
    server.assert_finished();
}
