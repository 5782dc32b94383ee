//! `cordon rewind` and `cordon fork` as a user types them, after real
//! `cordon exec` turns against the scripted model server: the workspace's
//! bytes and the conversation the model is sent next match each point.

use crate::support;

use std::path::Path;
use std::process::Output;

use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::{Value, json};

fn cordon(server: &ScriptedServer, ws: &Path, home: &Path, args: &[&str]) -> Output {
    support::user_cordon(home, ws, &server.url())
        .args(args)
        .output()
        .unwrap()
}

fn ok(out: &Output) -> String {
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr),
    );
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    stdout.into_owned()
}

fn read(ws: &Path, name: &str) -> Option<String> {
    std::fs::read_to_string(ws.join(name)).ok()
}

#[test]
fn exec_exec_rewind_then_the_model_sees_turn_one_and_a_fork_gets_its_files() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (ws, home) = (ws.path(), home.path());
    std::fs::write(ws.join("notes.txt"), "mine\n").unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            // Turn 1: `cordon exec "write a.txt"`.
            .turn(Turn::text("Writing.").with_tool_call(
                "t1",
                "write_file",
                json!({"path": "a.txt", "content": "one\n"}),
            ))
            .turn(Turn::text("Wrote a.txt.").expect_tool_results(["t1"]))
            // Turn 2: `cordon exec --last "change everything"`.
            .turn(Turn::text("Changing.").with_tool_call(
                "t2",
                "bash",
                json!({"command": "echo two > a.txt && echo new > b.txt && rm notes.txt"}),
            ))
            .turn(Turn::text("Changed TURN-TWO-MARK.").expect_tool_results(["t2"]))
            // Turn 2 again, after `cordon rewind ID 1`: the model is sent
            // turn 1 and nothing of the turn that was undone.
            .turn(
                Turn::text("Here again.")
                    .expect_contains("write a.txt")
                    .expect_contains("Wrote a.txt.")
                    .expect_contains("what now?")
                    .expect_lacks("change everything")
                    .expect_lacks("TURN-TWO-MARK"),
            ),
    );
    ok(&cordon(&server, ws, home, &["exec", "write a.txt"]));
    ok(&cordon(
        &server,
        ws,
        home,
        &["exec", "--last", "change everything"],
    ));
    assert_eq!(read(ws, "a.txt").as_deref(), Some("two\n"));
    assert_eq!(read(ws, "notes.txt"), None);

    let list = ok(&cordon(&server, ws, home, &["sessions", "--json"]));
    let session: Value = serde_json::from_str(list.lines().next().unwrap()).unwrap();
    let id = session["id"].as_str().unwrap().to_string();
    assert_eq!(session["turns"], 2);

    // Back to the end of turn 1, by a unique start of the id.
    let said = ok(&cordon(
        &server,
        ws,
        home,
        &["rewind", &id[..id.len() - 2], "1"],
    ));
    assert!(said.contains("back at the end of turn 1"), "{said}");
    assert!(said.contains("2 files written, 1 removed"), "{said}");
    assert_eq!(read(ws, "a.txt").as_deref(), Some("one\n"));
    assert_eq!(read(ws, "notes.txt").as_deref(), Some("mine\n"));
    assert_eq!(read(ws, "b.txt"), None);
    let list = ok(&cordon(&server, ws, home, &["sessions", "--json"]));
    let session: Value = serde_json::from_str(list.lines().next().unwrap()).unwrap();
    assert_eq!(session["turns"], 1);

    // The conversation goes on from turn 1.
    let out = ok(&cordon(&server, ws, home, &["exec", "--last", "what now?"]));
    assert!(out.contains("Here again."), "{out}");
    server.assert_finished();

    // A turn that does not exist, a session that does not: clear errors,
    // nothing changed.
    let out = cordon(&server, ws, home, &["rewind", &id, "9"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("turn 9 has no checkpoint"), "{err}");
    let out = cordon(&server, ws, home, &["rewind", "no-such-session", "1"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no session"));
    assert_eq!(read(ws, "a.txt").as_deref(), Some("one\n"));

    // A fork of turn 1 into a new directory: its own copy of the files.
    let fork_ws = home.join("fork");
    let fork_arg = fork_ws.to_str().unwrap();
    let said = ok(&cordon(
        &server,
        ws,
        home,
        &["fork", &id, "1", "--workspace", fork_arg],
    ));
    assert!(said.contains("forked at the end of turn 1"), "{said}");
    assert_eq!(read(&fork_ws, "a.txt").as_deref(), Some("one\n"));
    assert_eq!(read(&fork_ws, "notes.txt").as_deref(), Some("mine\n"));
    std::fs::write(ws.join("a.txt"), "changed in the original\n").unwrap();
    assert_eq!(read(&fork_ws, "a.txt").as_deref(), Some("one\n"));
    // It is a session of its own, listed with its workspace.
    let all = ok(&cordon(&server, ws, home, &["sessions", "--all", "--json"]));
    let forked: Vec<Value> = all
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .filter(|s: &Value| s["id"] != id.as_str())
        .collect();
    assert_eq!(forked.len(), 1, "{all}");
    assert_eq!(forked[0]["turns"], 1);
    // A fork into a directory that holds files is refused.
    let out = cordon(
        &server,
        ws,
        home,
        &["fork", &id, "1", "--workspace", fork_arg],
    );
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"));
}

/// `checkpoints.keep` (here from the environment) reaches the turns of
/// `cordon exec` and `cordon rewind`: three turns kept two at a time
/// leave the last two to rewind to, and an older one is refused as
/// pruned, saying which setting keeps more.
#[test]
fn exec_keeps_the_checkpoints_the_settings_say() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (ws, home) = (ws.path(), home.path());
    let mut scenario = Scenario::new();
    for n in 1..=3 {
        scenario = scenario
            .turn(Turn::text("Writing.").with_tool_call(
                format!("t{n}"),
                "write_file",
                json!({"path": "a.txt", "content": format!("{n}\n")}),
            ))
            .turn(Turn::text("Wrote it.").expect_tool_results([format!("t{n}")]));
    }
    let server = ScriptedServer::start(scenario);
    let keeping = |args: &[&str]| {
        support::user_cordon(home, ws, &server.url())
            .env("CORDON_CHECKPOINTS_KEEP", "2")
            .args(args)
            .output()
            .unwrap()
    };
    ok(&keeping(&["exec", "write 1"]));
    ok(&keeping(&["exec", "--last", "write 2"]));
    ok(&keeping(&["exec", "--last", "write 3"]));
    server.assert_finished();
    let list = ok(&cordon(&server, ws, home, &["sessions", "--json"]));
    let session: Value = serde_json::from_str(list.lines().next().unwrap()).unwrap();
    let id = session["id"].as_str().unwrap().to_string();
    assert_eq!(session["turns"], 3);

    // Before the first turn, and turn 1: pruned, with the way to keep more.
    for turn in ["0", "1"] {
        let out = keeping(&["rewind", &id, turn]);
        assert_eq!(out.status.code(), Some(1));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            err.contains("was pruned")
                && err.contains("newest 2 checkpoints")
                && err.contains("checkpoints.keep"),
            "{err}"
        );
    }
    assert_eq!(read(ws, "a.txt").as_deref(), Some("3\n"));
    let said = ok(&keeping(&["rewind", &id, "2"]));
    assert!(said.contains("back at the end of turn 2"), "{said}");
    assert_eq!(read(ws, "a.txt").as_deref(), Some("2\n"));
}

/// Issue 32: a rewind is undone by `cordon rewind ID --undo`: the files and
/// the conversation as they were just before it, and undoing again redoes
/// it. Turn numbers are the conversation's as it is now: after going back
/// to turn 1, turn 2 is the one taken next, and the error for a turn past
/// them names `--undo`.
#[test]
fn a_rewind_is_undone_and_redone() {
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let (ws, home) = (ws.path(), home.path());
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Writing.").with_tool_call(
                "t1",
                "write_file",
                json!({"path": "a.txt", "content": "one\n"}),
            ))
            .turn(Turn::text("Wrote ONE-MARK.").expect_tool_results(["t1"]))
            .turn(Turn::text("Again.").with_tool_call(
                "t2",
                "write_file",
                json!({"path": "a.txt", "content": "two\n"}),
            ))
            .turn(Turn::text("Wrote TWO-MARK.").expect_tool_results(["t2"]))
            // After the rewind was undone: both turns are back.
            .turn(
                Turn::text("Both are here.")
                    .expect_contains("ONE-MARK")
                    .expect_contains("TWO-MARK"),
            ),
    );
    ok(&cordon(&server, ws, home, &["exec", "write one"]));
    ok(&cordon(&server, ws, home, &["exec", "--last", "write two"]));
    let list = ok(&cordon(&server, ws, home, &["sessions", "--json"]));
    let id = serde_json::from_str::<Value>(list.lines().next().unwrap()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();

    let said = ok(&cordon(&server, ws, home, &["rewind", &id, "1"]));
    assert!(
        said.contains(&format!("cordon rewind {id} --undo")),
        "{said}"
    );
    assert_eq!(read(ws, "a.txt").as_deref(), Some("one\n"));
    // Turn 2 is gone from the conversation as it is now.
    let out = cordon(&server, ws, home, &["rewind", &id, "2"]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("turn 2 has no checkpoint") && err.contains("--undo"),
        "{err}"
    );

    let said = ok(&cordon(&server, ws, home, &["rewind", &id, "--undo"]));
    assert!(said.contains("back at the end of turn 2"), "{said}");
    assert_eq!(read(ws, "a.txt").as_deref(), Some("two\n"));
    let list = ok(&cordon(&server, ws, home, &["sessions", "--json"]));
    let session: Value = serde_json::from_str(list.lines().next().unwrap()).unwrap();
    assert_eq!(session["turns"], 2);
    // Undoing the undo redoes the rewind; once more, and it is undone again.
    ok(&cordon(&server, ws, home, &["rewind", &id, "--undo"]));
    assert_eq!(read(ws, "a.txt").as_deref(), Some("one\n"));
    ok(&cordon(&server, ws, home, &["rewind", &id, "--undo"]));
    assert_eq!(read(ws, "a.txt").as_deref(), Some("two\n"));
    // The conversation goes on with both turns.
    let out = ok(&cordon(&server, ws, home, &["exec", "--last", "and now?"]));
    assert!(out.contains("Both are here."), "{out}");
    server.assert_finished();

    // A session never rewound has nothing to undo; --undo takes no turn.
    let other = ScriptedServer::start(Scenario::new().turn(Turn::text("Hi.")));
    let ws2 = tempfile::tempdir().unwrap();
    ok(&cordon(&other, ws2.path(), home, &["exec", "hello"]));
    let list = ok(&cordon(&other, ws2.path(), home, &["sessions", "--json"]));
    let id2 = serde_json::from_str::<Value>(list.lines().next().unwrap()).unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let out = cordon(&other, ws2.path(), home, &["rewind", &id2, "--undo"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("nothing to undo"));
    let out = cordon(&other, ws2.path(), home, &["rewind", &id2, "1", "--undo"]);
    assert_eq!(out.status.code(), Some(125));
}
