//! The chat UI end to end: the real `cordon` binary in a real terminal
//! (tmux), driven by keystrokes and pastes, against the scripted model
//! server over HTTP, with the real sandbox.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::json;

use crate::support;
use support::tmux::Tmux;

/// `cordon` as a user types it in a terminal: nothing of this process's
/// environment but their home, the scripted model and the terminal's type.
fn user_shell(server: &ScriptedServer, home: &Path) -> String {
    format!(
        "env -i PATH=/usr/bin:/bin TERM=xterm-256color HOME={home} XDG_CONFIG_HOME={home}/config \
         XDG_DATA_HOME={home}/data ANTHROPIC_BASE_URL={url} ANTHROPIC_API_KEY=sk-test-key-0000 {bin}",
        home = home.display(),
        url = server.url(),
        bin = env!("CARGO_BIN_EXE_cordon"),
    )
}

/// The shell command the pane runs: cordon chat with a clean environment,
/// then what the terminal looks like after it exits.
fn chat_command(server: &ScriptedServer, ws: &Path, home: &Path, extra: &str) -> String {
    format!(
        "{cordon} chat --workspace {ws} {extra}; echo EXIT=$?; stty -a | tr ' ;' '\\n\\n' | grep -x -- '-*icanon\\|-*echo'; sleep 600",
        cordon = user_shell(server, home),
        ws = ws.display(),
    )
}

/// Runs `cordon exec` once so that an earlier session exists.
fn earlier_session(home: &Path, ws: &Path) -> String {
    let server = ScriptedServer::start(
        Scenario::new().turn(Turn::text("The earlier answer, from yesterday.")),
    );
    let out = support::user_cordon(home, ws, &server.url())
        .args(["exec", "--json", "--workspace"])
        .arg(ws)
        .arg("an earlier task")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let first: serde_json::Value =
        serde_json::from_str(String::from_utf8_lossy(&out.stdout).lines().next().unwrap()).unwrap();
    first["session_id"].as_str().unwrap().to_string()
}

#[test]
fn paste_run_cancel_load_and_quit_in_a_real_terminal() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let earlier = earlier_session(home.path(), ws.path());
    let server = ScriptedServer::start(
        Scenario::new()
            // The pasted prompt arrives as one message, both lines in it.
            .turn(
                Turn::text("I'll run it in the sandbox.")
                    .with_tool_call(
                        "b1",
                        "bash",
                        json!({"command": "echo made-in-sandbox > proof.txt; echo sandboxed-$((6*7))"}),
                    )
                    .expect_contains("first line of the paste\\nsecond line of the paste"),
            )
            .turn(
                Turn::text("It printed **sandboxed-42**.")
                    .expect_tool_results(["b1"])
                    .expect_contains("sandboxed-42"),
            )
            .turn(Turn::text("Sleeping.").with_tool_call(
                "b2",
                "bash",
                json!({"command": "sleep 60"}),
            ))
            // After Ctrl-C the sleep has a result and the next turn works.
            .turn(
                Turn::text("Back after the cancel.")
                    .expect_tool_results(["b2"])
                    .expect_contains("after cancelling"),
            ),
    );
    let tmux = Tmux::start(
        "chat",
        &chat_command(&server, ws.path(), home.path(), ""),
        100,
        30,
    );
    tmux.wait_for("sandbox ready");
    // A multi-line paste stays one message: nothing is sent until Enter.
    tmux.paste("first line of the paste\nsecond line of the paste");
    let s = tmux.wait_for("second line of the paste");
    assert!(s.contains("first line of the paste"), "{s}");
    assert_eq!(server.requests().len(), 0, "the paste alone sent nothing");
    tmux.keys(&["Enter"]);
    // The tool call shows with its command, then its result; the answer
    // is rendered Markdown (no asterisks).
    let s = tmux.wait_for("It printed sandboxed-42.");
    assert!(s.contains("✓ bash echo made-in-sandbox"), "{s}");
    assert!(s.contains("│ sandboxed-42"), "{s}");
    assert_eq!(
        std::fs::read_to_string(ws.path().join("proof.txt")).unwrap(),
        "made-in-sandbox\n"
    );

    // A long tool call, cancelled with Ctrl-C.
    tmux.type_text("now sleep");
    tmux.keys(&["Enter"]);
    tmux.wait_for("bash sleep 60");
    let started = Instant::now();
    tmux.keys(&["C-c"]);
    tmux.wait_for("Cancelled.");
    assert!(
        started.elapsed() < Duration::from_secs(20),
        "the cancel was prompt"
    );
    tmux.type_text("carry on after cancelling");
    tmux.keys(&["Enter"]);
    tmux.wait_for("Back after the cancel.");
    server.assert_finished();

    // The session picker lists the earlier session; /load continues it.
    tmux.type_text("/sessions");
    tmux.keys(&["Enter"]);
    tmux.wait_for("an earlier task");
    tmux.keys(&["Escape"]);
    tmux.type_text(&format!("/load {earlier}"));
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for(&format!("Continuing session {earlier}"));
    assert!(s.contains("The earlier answer, from yesterday."), "{s}");
    assert!(!s.contains("Back after the cancel."), "{s}");

    // Quit: the terminal is as it was (no alternate screen, no mouse
    // reporting, canonical mode and echo back on).
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("EXIT=0");
    assert!(s.contains("is saved: `cordon chat --resume"), "{s}");
    tmux.wait_until("stty output", |s| s.lines().any(|l| l.trim() == "echo"));
    let s = tmux.screen();
    assert!(s.lines().any(|l| l.trim() == "icanon"), "{s}");
    assert_eq!(tmux.display("#{alternate_on}"), "0");
    assert_eq!(tmux.display("#{mouse_any_flag}"), "0");
    assert_eq!(tmux.display("#{cursor_flag}"), "1");
}

/// With `backend = "microvm"` in the config file, the chat's tools run in
/// a virtual machine with its own kernel, and the status line says so.
#[test]
fn the_chat_runs_its_tools_in_a_microvm_when_configured() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let config = home.path().join("config/cordon");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        "[sandbox]\nbackend = \"microvm\"\n",
    )
    .unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Looking.").with_tool_call(
                "v1",
                "bash",
                json!({"command": "uname -r > kernel.txt; echo in-the-vm"}),
            ))
            .turn(
                Turn::text("It runs in its own kernel.")
                    .expect_tool_results(["v1"])
                    .expect_contains("in-the-vm"),
            ),
    );
    let tmux = Tmux::start(
        "microvm",
        &chat_command(&server, ws.path(), home.path(), ""),
        100,
        30,
    );
    // A guest under TCG on a loaded machine takes a while to boot.
    tmux.wait_until("microvm sandbox ready", |s| {
        s.contains("microvm sandbox ready") || s.contains("EXIT=")
    });
    let s = tmux.screen();
    assert!(s.contains("microvm sandbox ready"), "{s}");
    tmux.type_text("which kernel?");
    tmux.keys(&["Enter"]);
    tmux.wait_for("It runs in its own kernel.");
    server.assert_finished();
    let host = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap();
    let guest = std::fs::read_to_string(ws.path().join("kernel.txt")).unwrap();
    assert_ne!(guest, host);
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}

#[test]
fn sigterm_restores_the_terminal_and_an_approval_can_deny() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Cleaning up.").with_tool_call(
                "r1",
                "bash",
                json!({"command": "touch should-not-exist"}),
            ))
            .turn(
                Turn::text("Understood, leaving it.")
                    .expect_tool_results(["r1"])
                    .expect_contains("The user denied this tool call: not today"),
            )
            // "a": this call and every later bash call run without asking.
            .turn(Turn::text("First file.").with_tool_call(
                "m1",
                "bash",
                json!({"command": "touch first"}),
            ))
            .turn(
                Turn::text("Second file.")
                    .with_tool_call("m2", "bash", json!({"command": "touch second"}))
                    .expect_tool_results(["m1"]),
            )
            .turn(Turn::text("Both made.").expect_tool_results(["m2"])),
    );
    // An MCP server that cannot start is reported once, in red, with a hint.
    let config = home.path().join("config/cordon");
    std::fs::create_dir_all(&config).unwrap();
    std::fs::write(
        config.join("config.toml"),
        "[mcp_servers.broken]\ncommand = \"/nonexistent/mcp-server\"\n",
    )
    .unwrap();
    let tmux = Tmux::start(
        "approve",
        &chat_command(&server, ws.path(), home.path(), "--approval ask"),
        80,
        24,
    );
    tmux.wait_for("sandbox ready");
    let s = tmux.wait_for("MCP server broken did not start");
    assert!(s.contains("cordon mcp list"), "{s}");
    tmux.type_text("clean up");
    tmux.keys(&["Enter"]);
    tmux.wait_for("[n] no, say why");
    tmux.keys(&["n"]);
    tmux.wait_for("reason for denying");
    tmux.type_text("not today");
    tmux.keys(&["Enter"]);
    tmux.wait_for("Understood, leaving it.");
    assert!(!ws.path().join("should-not-exist").exists());
    tmux.type_text("make two files");
    tmux.keys(&["Enter"]);
    tmux.wait_for("[a] always bash, this session");
    tmux.keys(&["a"]);
    let s = tmux.wait_for("Both made.");
    assert!(
        s.contains("bash runs without asking for the rest of this session"),
        "{s}"
    );
    assert!(!s.contains("[a] always"), "no second prompt: {s}");
    assert!(ws.path().join("first").exists() && ws.path().join("second").exists());
    server.assert_finished();

    let pid = tmux.display("#{pane_pid}");
    // The pane runs a shell; cordon is its child.
    let out = Command::new("pgrep")
        .args(["-P", &pid, "-f", "cordon chat"])
        .output()
        .unwrap();
    let cordon = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        !cordon.is_empty(),
        "cordon is running under the pane's shell"
    );
    assert!(
        Command::new("kill")
            .args(["-TERM", &cordon])
            .status()
            .unwrap()
            .success()
    );
    tmux.wait_for("EXIT=0");
    tmux.wait_until("stty output", |s| s.lines().any(|l| l.trim() == "echo"));
    assert_eq!(tmux.display("#{alternate_on}"), "0");
    assert_eq!(tmux.display("#{mouse_any_flag}"), "0");
}

/// `cordon` alone, as the README's front door says, typed in its project
/// directory: the same UI and defaults as `cordon chat`, and a task with
/// several tool calls runs to its answer (it once stopped after 0 model
/// requests: its step limit was a derived 0).
#[test]
fn bare_cordon_completes_a_task_with_tool_calls() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Writing it.").with_tool_call(
                "w1",
                "write_file",
                json!({"path": "hello.py", "content": "print('hello from bare cordon')\n"}),
            ))
            .turn(
                Turn::text("Running it.")
                    .with_tool_call("b1", "bash", json!({"command": "python3 hello.py"}))
                    .expect_tool_results(["w1"]),
            )
            .turn(
                Turn::text("It printed the greeting.")
                    .expect_tool_results(["b1"])
                    .expect_contains("hello from bare cordon"),
            ),
    );
    let cmd = format!(
        "cd {ws} && {cordon}; echo EXIT=$?; sleep 600",
        ws = ws.path().display(),
        cordon = user_shell(&server, home.path()),
    );
    let tmux = Tmux::start("bare", &cmd, 100, 30);
    tmux.wait_for("sandbox ready");
    tmux.type_text("write hello.py and run it");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("It printed the greeting.");
    assert!(!s.contains("model requests without finishing"), "{s}");
    server.assert_finished();
    assert_eq!(
        std::fs::read_to_string(ws.path().join("hello.py")).unwrap(),
        "print('hello from bare cordon')\n"
    );
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}

/// A running command's output shows under it while it runs, and stays
/// after Ctrl-C cancels it.
#[test]
fn tool_output_shows_while_it_runs_and_stays_after_ctrl_c() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Building.").with_tool_call(
                "b1",
                "bash",
                json!({"command": "echo live-progress-line; sleep 60"}),
            ))
            .turn(
                Turn::text("Stopped as asked.")
                    .expect_tool_results(["b1"])
                    .expect_contains("live-progress-line"),
            ),
    );
    let tmux = Tmux::start(
        "live",
        &chat_command(&server, ws.path(), home.path(), ""),
        100,
        30,
    );
    tmux.wait_for("sandbox ready");
    tmux.type_text("build it");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("live-progress-line");
    assert_eq!(
        server.requests().len(),
        1,
        "still in the first tool call: {s}"
    );
    tmux.keys(&["C-c"]);
    let s = tmux.wait_for("cancelled");
    assert!(
        s.contains("live-progress-line"),
        "the output went with the cancel: {s}"
    );
    tmux.type_text("what happened?");
    tmux.keys(&["Enter"]);
    tmux.wait_for("Stopped as asked.");
    server.assert_finished();
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}

/// With approval on, a write over an existing file is shown as a diff
/// against the file as it is: the lines it would delete are there.
#[test]
fn an_approval_for_a_write_over_a_file_shows_what_it_deletes() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join("notes.txt"),
        "keep this line\nprecious line about to go\n",
    )
    .unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Tidying.").with_tool_call(
                "w1",
                "write_file",
                json!({"path": "notes.txt", "content": "keep this line\n"}),
            ))
            .turn(Turn::text("Left it alone.").expect_tool_results(["w1"])),
    );
    let tmux = Tmux::start(
        "approve-diff",
        &chat_command(&server, ws.path(), home.path(), "--approval ask"),
        100,
        30,
    );
    tmux.wait_for("sandbox ready");
    tmux.type_text("tidy notes.txt");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("waiting for approval");
    assert!(s.contains("replaces the file"), "{s}");
    assert!(s.contains("- precious line about to go"), "{s}");
    tmux.keys(&["n"]);
    tmux.type_text("no");
    tmux.keys(&["Enter"]);
    tmux.wait_for("Left it alone.");
    assert!(
        std::fs::read_to_string(ws.path().join("notes.txt"))
            .unwrap()
            .contains("precious line")
    );
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}

/// `/allow` widens a brokered session's network at once, and the session's
/// log records the change (what was added, and all it allows now).
#[test]
fn allow_in_the_chat_is_recorded_in_the_session_log() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("Hello there.")));
    let cmd = format!(
        "cd {ws} && {cordon} --allow 127.0.0.1:1; echo EXIT=$?; sleep 600",
        ws = ws.path().display(),
        cordon = user_shell(&server, home.path()),
    );
    let tmux = Tmux::start("allowlog", &cmd, 100, 30);
    tmux.wait_for("sandbox ready");
    tmux.type_text("hi");
    tmux.keys(&["Enter"]);
    tmux.wait_for("Hello there.");
    tmux.type_text("/allow 127.0.0.1:9");
    tmux.keys(&["Enter"]);
    tmux.wait_for("127.0.0.1:9 allowed for this session");
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");

    let sessions = home.path().join("data/cordon/sessions");
    let logs: Vec<_> = std::fs::read_dir(&sessions)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .collect();
    assert_eq!(logs.len(), 1, "{logs:?}");
    let text = std::fs::read_to_string(&logs[0]).unwrap();
    let records: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|r: &serde_json::Value| r["type"] == "network_policy")
        .collect();
    assert_eq!(records.len(), 1, "{text}");
    assert_eq!(records[0]["added"], json!(["127.0.0.1:9"]));
    assert_eq!(records[0]["allow"], json!(["127.0.0.1:1", "127.0.0.1:9"]));
}

/// `/undo` in bare `cordon`: the last turn's file changes and messages go,
/// the model is sent the conversation without them, and `/rewind 0` goes
/// back to before the first prompt.
#[test]
fn undo_takes_back_the_last_turns_files_and_messages() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("keep.txt"), "the user's\n").unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Writing one.").with_tool_call(
                "w1",
                "write_file",
                json!({"path": "one.txt", "content": "first\n"}),
            ))
            .turn(Turn::text("Wrote ONE-DONE.").expect_tool_results(["w1"]))
            .turn(Turn::text("Breaking things.").with_tool_call(
                "b1",
                "bash",
                json!({"command": "echo broken > one.txt && rm keep.txt && echo x > two.txt"}),
            ))
            .turn(Turn::text("Broke TWO-DONE.").expect_tool_results(["b1"]))
            .turn(
                Turn::text("After the undo.")
                    .expect_contains("ONE-DONE")
                    .expect_lacks("TWO-DONE")
                    .expect_lacks("break things"),
            ),
    );
    let cmd = format!(
        "cd {ws} && {cordon}; echo EXIT=$?; sleep 600",
        ws = ws.path().display(),
        cordon = user_shell(&server, home.path()),
    );
    let tmux = Tmux::start("undo", &cmd, 110, 40);
    tmux.wait_for("sandbox ready");
    tmux.type_text("write one");
    tmux.keys(&["Enter"]);
    tmux.wait_for("Wrote ONE-DONE.");
    tmux.type_text("break things");
    tmux.keys(&["Enter"]);
    tmux.wait_for("Broke TWO-DONE.");
    let read = |n: &str| std::fs::read_to_string(ws.path().join(n)).ok();
    assert_eq!(read("one.txt").as_deref(), Some("broken\n"));

    tmux.type_text("/undo");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("Back at the end of turn 1");
    assert!(s.contains("2 files written, 1 removed"), "{s}");
    assert!(s.contains("ONE-DONE") && !s.contains("TWO-DONE"), "{s}");
    assert_eq!(read("one.txt").as_deref(), Some("first\n"));
    assert_eq!(read("keep.txt").as_deref(), Some("the user's\n"));
    assert_eq!(read("two.txt"), None);

    tmux.type_text("and now?");
    tmux.keys(&["Enter"]);
    tmux.wait_for("After the undo.");
    server.assert_finished();

    tmux.type_text("/rewind 0");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("Back at the end of turn 0");
    assert!(!s.contains("ONE-DONE"), "{s}");
    assert_eq!(read("one.txt"), None);
    assert_eq!(read("keep.txt").as_deref(), Some("the user's\n"));
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}

/// Bare `cordon --repo URL`: the clone is made on the host into ./NAME
/// with the user's credential helper, the model commits through cordon,
/// and the session's log and branch share its id.
#[test]
fn bare_cordon_with_repo_clones_and_the_model_commits_on_the_sessions_branch() {
    use cordon_testkit::git_remote::{GitRemote, git};
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote::start(&tmp.path().join("remote"), "alice", "tok-9c1d");
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(
        home.join(".gitconfig"),
        "[credential]\n\thelper = store\n[user]\n\tname = Ada Host\n\temail = ada@host.example\n",
    )
    .unwrap();
    std::fs::write(
        home.join(".git-credentials"),
        format!("http://alice:tok-9c1d@127.0.0.1:{}\n", remote.port),
    )
    .unwrap();
    let cwd = tmp.path().join("projects");
    std::fs::create_dir(&cwd).unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Editing.").with_tool_call(
                "w1",
                "write_file",
                json!({"path": "README", "content": "from the chat\n"}),
            ))
            .turn(
                Turn::text("Committing.")
                    .with_tool_call(
                        "c1",
                        "git_commit",
                        json!({"message": "README from the chat"}),
                    )
                    .expect_tool_results(["w1"]),
            )
            .turn(Turn::text("COMMITTED-IT.").expect_tool_results(["c1"])),
    );
    let cmd = format!(
        "cd {cwd} && {cordon} --repo {repo}; echo EXIT=$?; sleep 600",
        cwd = cwd.display(),
        cordon = user_shell(&server, &home),
        repo = remote.url(),
    );
    let tmux = Tmux::start("repo", &cmd, 110, 40);
    let s = tmux.wait_for("sandbox ready");
    assert!(s.contains("Cloned") && s.contains("git_commit"), "{s}");
    tmux.type_text("change the readme and commit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("COMMITTED-IT.");
    server.assert_finished();
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");

    let ws = cwd.join("proj");
    let branch = git(&ws, &["branch", "--show-current"]);
    assert_eq!(
        git(&ws, &["log", "-1", "--format=%an|%s"]),
        "Ada Host|README from the chat"
    );
    // The session's log is named after the id the branch carries, and says
    // which repository it works on.
    let id = branch
        .strip_prefix("cordon/")
        .expect("the session's branch");
    let log = std::fs::read_to_string(home.join(format!("data/cordon/sessions/{id}.jsonl")))
        .expect("the session's log");
    assert!(log.contains("\"type\":\"repository\""), "{log}");
}

/// Issue 32, item 14, typed in a real terminal: `!cmd` runs in the sandbox
/// and the model sees it; Tab completes `@path` from the workspace; `p`
/// approves a command prefix for good, so a second cordon does not ask
/// for it (and still asks for another); the session picker fills the
/// screen and narrows as one types.
#[test]
fn bang_commands_at_paths_saved_approvals_and_the_full_screen_picker() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir(ws.path().join("src")).unwrap();
    std::fs::write(ws.path().join("src/main.rs"), "fn main() {}\n").unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Listing it.")
                    .with_tool_call("l1", "bash", json!({"command": "ls -l src"}))
                    .expect_contains("look at @src/main.rs and list")
                    .expect_contains("$ echo from-the-user > bang.txt")
                    .expect_contains("bang-42"),
            )
            .turn(
                Turn::text("Listed.")
                    .expect_tool_results(["l1"])
                    .expect_contains("main.rs"),
            ),
    );
    let tmux = Tmux::start(
        "habits",
        &chat_command(&server, ws.path(), home.path(), "--approval ask"),
        100,
        30,
    );
    tmux.wait_for("sandbox ready");
    tmux.type_text("!echo from-the-user > bang.txt; echo bang-$((6*7))");
    tmux.keys(&["Enter"]);
    tmux.wait_for("│ bang-42");
    assert_eq!(
        server.requests().len(),
        0,
        "the user's command is no model turn"
    );
    assert_eq!(
        std::fs::read_to_string(ws.path().join("bang.txt")).unwrap(),
        "from-the-user\n"
    );
    tmux.type_text("look at @src/ma");
    tmux.keys(&["Tab"]);
    tmux.wait_for("look at @src/main.rs");
    tmux.type_text("and list");
    tmux.keys(&["Enter"]);
    tmux.wait_for("[p] always `ls …`");
    tmux.keys(&["p"]);
    let s = tmux.wait_for("Listed.");
    assert!(
        s.contains("Commands starting with `ls` run without asking"),
        "{s}"
    );
    server.assert_finished();
    let saved = home.path().join("config/cordon/approved.toml");
    let text = std::fs::read_to_string(&saved).unwrap();
    assert!(text.contains("prefix = [\"ls\"]"), "{text}");
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
    drop(tmux);

    // A second cordon, another session: `ls` runs without asking, `cat`
    // is asked.
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Again.").with_tool_call(
                "l2",
                "bash",
                json!({"command": "ls -a src"}),
            ))
            .turn(
                Turn::text("Reading.")
                    .with_tool_call("c1", "bash", json!({"command": "cat src/main.rs"}))
                    .expect_tool_results(["l2"]),
            )
            .turn(Turn::text("Read it.").expect_tool_results(["c1"])),
    );
    let tmux = Tmux::start(
        "habits2",
        &chat_command(&server, ws.path(), home.path(), "--approval ask"),
        100,
        30,
    );
    tmux.wait_for("sandbox ready");
    tmux.type_text("list again");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("[p] always `cat …`");
    assert!(s.contains("✓ bash ls -a src"), "ran unasked: {s}");
    tmux.keys(&["y"]);
    tmux.wait_for("Read it.");
    server.assert_finished();

    // The picker: the whole screen but the status line.
    tmux.type_text("/sessions");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("sessions (2 of 2)");
    let lines: Vec<&str> = s.lines().collect();
    assert!(lines[0].starts_with("┌ sessions"), "{s}");
    assert!(lines[28].starts_with('└'), "{s}");
    // A session begun with `!cmd` is titled by it.
    assert!(s.contains("!echo from-the-user"), "{s}");
    tmux.type_text("again");
    let s = tmux.wait_for("sessions (1 of 2)");
    assert!(!s.contains("!echo from-the-user"), "{s}");
    tmux.keys(&["Escape"]);
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}

/// The agent installs a package in its image; `/snapshot` keeps it, and so
/// does `cordon image commit` of the running session from another shell.
/// Both images start with the package there and the network off; neither
/// has the workspace in it. Under a disk budget, root's sandbox keeps its
/// root's changes on a disk of its own, mounted where no host process sees
/// it: both reach it all the same.
#[test]
fn a_snapshot_keeps_what_the_agent_installed() {
    let Some(minimal) = cordon_testkit::environments::environment("minimal") else {
        return;
    };
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.txt"), "the user's\n").unwrap();
    let home = tempfile::tempdir().unwrap();
    let store = home.path().join("store");
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Installing.").with_tool_call(
                "b1",
                "bash",
                json!({"command": "apt-get update -qq && apt-get install -y -qq hello >/dev/null && hello"}),
            ))
            .turn(
                Turn::text("Installed hello.")
                    .expect_tool_results(["b1"])
                    .expect_contains("Hello, world!"),
            ),
    );
    let cmd = format!(
        "cd {ws} && {cordon} chat --image oci:{image}:latest --allow @debian --disk 2G; \
         echo EXIT=$?; sleep 600",
        ws = ws.path().display(),
        image = minimal.display(),
        cordon = user_shell(&server, home.path()).replacen(
            "env -i ",
            &format!("env -i CORDON_IMAGE_STORE={} ", store.display()),
            1
        ),
    );
    let tmux = Tmux::start("snapshot", &cmd, 120, 40);
    tmux.wait_for("sandbox ready");
    tmux.type_text("install hello");
    tmux.keys(&["Enter"]);
    tmux.wait_within("the answer", Duration::from_secs(180), |s| {
        s.contains("Installed hello.")
    });
    server.assert_finished();

    // From another shell, while the session runs.
    let label = std::fs::read_dir(store.join("run"))
        .unwrap()
        .flatten()
        .find_map(|e| std::fs::read_to_string(e.path().join("label")).ok())
        .expect("the session's sandbox is labelled with its id");
    let committed = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .env("CORDON_IMAGE_STORE", &store)
        .args(["image", "commit", &label[..8], "test/committed:1"])
        .output()
        .unwrap();
    assert!(
        committed.status.success(),
        "{}",
        String::from_utf8_lossy(&committed.stderr)
    );

    tmux.type_text("/snapshot test/snap:1");
    tmux.keys(&["Enter"]);
    tmux.wait_within("the snapshot", Duration::from_secs(60), |s| {
        s.contains("Saved the sandbox's root as")
    });
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");

    for image in ["test/snap:1", "test/committed:1"] {
        let run = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .env("CORDON_IMAGE_STORE", &store)
            .args(["run", "--workspace"])
            .arg(home.path())
            .args(["--image", image, "--", "sh", "-c"])
            .arg("hello; ls /workspace/notes.txt 2>&1; test -e /var/lib/apt/lists/lock && echo lists")
            .output()
            .unwrap();
        let out = String::from_utf8_lossy(&run.stdout);
        assert!(
            out.contains("Hello, world!"),
            "{image}: {out}\n{}",
            String::from_utf8_lossy(&run.stderr)
        );
        // The workspace was the user's: not in the image.
        assert!(out.contains("No such file"), "{image}: {out}");
    }
}

/// The model's plan shows in a panel above the input while it works,
/// replaced whole by each update, and comes back with a resumed session.
#[test]
fn the_plan_is_shown_live_and_comes_back_on_resume() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let steps = |states: [&str; 3]| {
        let names = ["read the parser", "fix the off-by-one", "run the tests"];
        json!({"plan": names.iter().zip(states).map(|(s, st)| json!({"step": s, "status": st})).collect::<Vec<_>>()})
    };
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Planning first.")
                    .with_tool_call(
                        "p1",
                        "update_plan",
                        steps(["completed", "in_progress", "pending"]),
                    )
                    // Keeps the turn running while the panel is read.
                    .with_tool_call("b1", "bash", json!({"command": "sleep 3"})),
            )
            .turn(
                Turn::text("Fixed.")
                    .with_tool_call(
                        "p2",
                        "update_plan",
                        steps(["completed", "completed", "in_progress"]),
                    )
                    .expect_tool_results(["p1", "b1"])
                    .expect_contains("1 of 3 steps completed; now: fix the off-by-one"),
            )
            .turn(Turn::text("Stopping before the tests.").expect_tool_results(["p2"])),
    );
    let tmux = Tmux::start(
        "plan",
        &chat_command(&server, ws.path(), home.path(), ""),
        100,
        30,
    );
    tmux.wait_for("sandbox ready");
    tmux.type_text("fix the parser");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("plan 1/3");
    assert!(s.contains("✓ read the parser"), "{s}");
    assert!(s.contains("▸ fix the off-by-one"), "{s}");
    assert!(s.contains("○ run the tests"), "{s}");
    assert!(s.contains("update_plan 1 of 3 done"), "{s}");
    // The turn is over and the plan is not: it stays in view.
    let s = tmux.wait_until("the second plan", |s| {
        s.contains("Stopping before the tests.") && s.contains("plan 2/3")
    });
    assert!(s.contains("▸ run the tests"), "{s}");
    server.assert_finished();
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("EXIT=0");
    let id = s
        .split("cordon chat --resume ")
        .nth(1)
        .and_then(|r| r.split(['`', ' ', '\n']).next())
        .unwrap_or_else(|| panic!("no resume hint: {s}"))
        .to_string();

    // Resumed: the plan is rebuilt from the conversation itself.
    let again = ScriptedServer::start(Scenario::new());
    let tmux = Tmux::start(
        "plan-resumed",
        &chat_command(&again, ws.path(), home.path(), &format!("--resume {id}")),
        100,
        30,
    );
    let s = tmux.wait_for("plan 2/3");
    assert!(s.contains("▸ run the tests"), "{s}");
    assert!(s.contains("✓ fix the off-by-one"), "{s}");
    tmux.type_text("/clear");
    tmux.keys(&["Enter"]);
    tmux.wait_until("the plan gone with the conversation", |s| {
        !s.contains("plan 2/3")
    });
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}

/// A helper's steps show under its call while it works and stay there,
/// with its answer, once it is done.
#[test]
fn a_helper_s_steps_show_nested_under_its_call() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Delegating.").with_tool_call(
                "t1",
                "task",
                json!({"description": "look around", "prompt": "List /workspace and say what is there."}),
            ))
            .turn(Turn::text("Listing.").with_tool_call(
                "h1",
                "bash",
                json!({"command": "echo helper-was-here; sleep 2"}),
            ))
            .turn(Turn::text("The workspace is empty.").expect_tool_results(["h1"]))
            .turn(Turn::text("All looked at.").expect_tool_results(["t1"])),
    );
    let tmux = Tmux::start(
        "task",
        &chat_command(&server, ws.path(), home.path(), ""),
        100,
        30,
    );
    tmux.wait_for("sandbox ready");
    tmux.type_text("look around");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("┊ ▸ bash echo helper-was-here");
    assert!(s.contains("task look around"), "{s}");
    let s = tmux.wait_for("All looked at.");
    assert!(
        s.contains("┊   ✓ Exit code: 0"),
        "the steps went with the call: {s}"
    );
    assert!(s.contains("The workspace is empty."), "{s}");
    server.assert_finished();
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}

/// `/attach` in the chat: the image goes to the model with the next
/// message, and a planted link in the workspace is refused, unsent.
#[test]
fn an_attached_image_goes_with_the_next_message() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let png = b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\0\x01\0\0\0\x01\x08\x06\0\0\0\x1f\x15\xc4\x89";
    std::fs::write(ws.path().join("shot.png"), png).unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("private.png"), png).unwrap();
    std::os::unix::fs::symlink(
        outside.path().join("private.png"),
        ws.path().join("link.png"),
    )
    .unwrap();
    let server = ScriptedServer::start(
        Scenario::new().turn(Turn::text("It is one pixel.").expect_contains("image/png")),
    );
    let tmux = Tmux::start(
        "attach",
        &chat_command(&server, ws.path(), home.path(), ""),
        120,
        30,
    );
    tmux.wait_for("sandbox ready");
    tmux.type_text(&format!("/attach {}", ws.path().join("link.png").display()));
    tmux.keys(&["Enter"]);
    tmux.type_text("what is this?");
    tmux.keys(&["Enter"]);
    tmux.wait_for("the message was not sent");
    assert!(server.requests().is_empty());
    tmux.type_text(&format!("/attach {}", ws.path().join("shot.png").display()));
    tmux.keys(&["Enter"]);
    tmux.type_text("what is this?");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("It is one pixel.");
    assert!(s.contains("[1 image] what is this?"), "{s}");
    server.assert_finished();
    let body = &server.requests()[0].body;
    let content = body["messages"].as_array().unwrap().last().unwrap()["content"].clone();
    assert_eq!(content[0]["type"], "image", "{content}");
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}

/// Command rules in the chat: with `--approval ask`, a command a rule
/// allows runs without a prompt while others are asked; with `auto`, a
/// command a rule says to ask about is asked all the same.
#[test]
fn rules_decide_which_commands_are_asked_about() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("config/cordon")).unwrap();
    std::fs::write(
        home.path().join("config/cordon/config.toml"),
        "[rules]\nallow = [\"ls\"]\nask = [\"touch\"]\n",
    )
    .unwrap();
    for (mode, first, second) in [
        ("--approval ask", "ls -la", "echo asked-in-ask-mode"),
        ("--approval auto", "echo runs-unasked", "touch made.txt"),
    ] {
        let server = ScriptedServer::start(
            Scenario::new()
                .turn(Turn::text("One.").with_tool_call("c1", "bash", json!({ "command": first })))
                .turn(
                    Turn::text("Two.")
                        .with_tool_call("c2", "bash", json!({ "command": second }))
                        .expect_tool_results(["c1"]),
                )
                .turn(Turn::text("Both ran.").expect_tool_results(["c2"])),
        );
        let tmux = Tmux::start(
            "rules",
            &chat_command(&server, ws.path(), home.path(), mode),
            120,
            30,
        );
        tmux.wait_for("sandbox ready");
        tmux.type_text("go");
        tmux.keys(&["Enter"]);
        // The first runs without a prompt: the second call's is the first.
        let s = tmux.wait_for("[n] no, say why");
        assert!(s.contains(&format!("Run bash {second}?")), "{mode}: {s}");
        assert_eq!(
            server.requests().len(),
            2,
            "{mode}: the first was asked: {s}"
        );
        tmux.keys(&["y"]);
        tmux.wait_for("Both ran.");
        server.assert_finished();
        tmux.type_text("/quit");
        tmux.keys(&["Enter"]);
        tmux.wait_for("EXIT=0");
    }
    assert!(ws.path().join("made.txt").exists());
}

/// `/plan` in the chat: the status line says so, a write is refused, the
/// model answers with a plan; `/go` gives the tools back and sends the
/// model on to carry it out.
#[test]
fn plan_then_go_in_the_chat() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Trying a write.").with_tool_call(
                "w1",
                "write_file",
                json!({"path": "plan.txt", "content": "too early\n"}),
            ))
            .turn(
                Turn::text("Plan: write done.txt.")
                    .expect_tool_results(["w1"])
                    .expect_contains("Not run: this is plan mode"),
            )
            .turn(
                Turn::text("Doing it.")
                    .with_tool_call(
                        "w2",
                        "write_file",
                        json!({"path": "done.txt", "content": "done\n"}),
                    )
                    .expect_contains("The plan is approved")
                    .expect_lacks("# Plan mode"),
            )
            .turn(Turn::text("Carried out.").expect_tool_results(["w2"])),
    );
    let tmux = Tmux::start(
        "plan-mode",
        &chat_command(&server, ws.path(), home.path(), ""),
        120,
        30,
    );
    tmux.wait_for("sandbox ready");
    tmux.type_text("/plan write the file");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("Plan: write done.txt.");
    assert!(s.contains("plan mode ·"), "{s}");
    assert!(!ws.path().join("plan.txt").exists());
    tmux.type_text("/go");
    tmux.keys(&["Enter"]);
    let s = tmux.wait_for("Carried out.");
    assert!(!s.contains("plan mode ·"), "{s}");
    server.assert_finished();
    assert_eq!(
        std::fs::read_to_string(ws.path().join("done.txt")).unwrap(),
        "done\n"
    );
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}

/// `sandbox.pause_when_idle`: the chat's sandbox pauses when nothing is
/// asked of it for that long, its processes where they were, and the next
/// message resumes it.
#[test]
fn an_idle_chat_pauses_its_sandbox_and_the_next_message_resumes_it() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(home.path().join("config/cordon")).unwrap();
    std::fs::write(
        home.path().join("config/cordon/config.toml"),
        "[sandbox]\npause_when_idle = \"2s\"\n",
    )
    .unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Counting.").with_tool_call(
                "c1",
                "bash",
                json!({"command": "sh -c 'i=0; while :; do i=$((i+1)); echo $i > count; sleep 0.1; done' >/dev/null 2>&1 &"}),
            ))
            .turn(Turn::text("It counts.").expect_tool_results(["c1"]))
            .turn(Turn::text("Back again.")),
    );
    let tmux = Tmux::start(
        "idle",
        &chat_command(&server, ws.path(), home.path(), ""),
        110,
        30,
    );
    tmux.wait_for("sandbox ready");
    tmux.type_text("count");
    tmux.keys(&["Enter"]);
    tmux.wait_for("It counts.");
    let count = || {
        std::fs::read_to_string(ws.path().join("count"))
            .ok()
            .and_then(|t| t.trim().parse::<u64>().ok())
            .unwrap_or(0)
    };
    tmux.wait_for("The sandbox is paused after 2s idle");
    let at = count();
    std::thread::sleep(Duration::from_millis(800));
    assert_eq!(count(), at, "it counted while paused");
    tmux.type_text("still there?");
    tmux.keys(&["Enter"]);
    tmux.wait_for("Back again.");
    let deadline = Instant::now() + Duration::from_secs(10);
    while count() <= at {
        assert!(Instant::now() < deadline, "it did not go on counting");
        std::thread::sleep(Duration::from_millis(100));
    }
    server.assert_finished();
    tmux.type_text("/quit");
    tmux.keys(&["Enter"]);
    tmux.wait_for("EXIT=0");
}
