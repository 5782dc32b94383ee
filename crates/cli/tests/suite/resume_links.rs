//! A resumed session continues in the workspace it recorded, not wherever
//! a link planted since leads. A session that worked in `workspace/sub`
//! is resumed after a sandbox of `workspace` replaced `sub` with a link
//! to a host directory beside it: cordon must refuse, not mount that
//! directory read-write for the model.

use crate::common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::Ctx;
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::{Value, json};

/// `cordon ARGS` in `cwd` as the test's user, with its own home and the
/// scripted model.
fn cordon(t: &Ctx, server: &ScriptedServer, home: &Path, cwd: &Path, args: &[&str]) -> Command {
    let mut c = t.cordon(args);
    c.current_dir(cwd)
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"))
        .env("ANTHROPIC_BASE_URL", server.url())
        .env("ANTHROPIC_API_KEY", "sk-test-key-0000000000")
        .env_remove("CORDON_MODEL")
        .env_remove("CORDON_PROVIDER");
    c
}

fn output(mut c: Command) -> (Option<i32>, String, String) {
    let out = c.output().expect("run cordon");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn resume_follows_no_link_planted_on_the_recorded_workspace(t: &Ctx) {
    let home = t.dir().join("home");
    let sub = t.workspace.join("sub");
    for d in [&home, &sub] {
        std::fs::create_dir(d).unwrap();
        std::os::unix::fs::chown(d, Some(t.uid), Some(t.gid)).unwrap();
    }
    // Other users' sandboxes may write the outside directory here: only the
    // link decides whether cordon mounts it.
    std::fs::set_permissions(&t.outside, std::fs::Permissions::from_mode(0o777)).unwrap();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Noted."))
            .turn(Turn::text("Writing.").with_tool_call(
                "t1",
                "write_file",
                json!({"path": "pwned.txt", "content": "written through a planted link"}),
            ))
            .turn(Turn::text("Done.")),
    );
    let (code, _, err) = output(cordon(t, &server, &home, &sub, &["exec", "remember this"]));
    assert_eq!(code, Some(0), "the first session failed: {err}");
    let (_, listed, err) = output(cordon(
        t,
        &server,
        &home,
        &t.workspace,
        &["sessions", "--all", "--json"],
    ));
    let row: Value = serde_json::from_str(listed.trim())
        .unwrap_or_else(|e| panic!("sessions --json: {e}: {listed} {err}"));
    let id = row["id"].as_str().unwrap().to_string();

    // A sandbox of the directory above swaps `sub` for a link out.
    t.run(&[], &["sh", "-c", "rm -rf sub && ln -s ../outside sub"])
        .code(0);
    assert!(sub.symlink_metadata().unwrap().file_type().is_symlink());

    let (code, out, err) = output(cordon(
        t,
        &server,
        &home,
        t.dir(),
        &["exec", "--resume", &id, "go on"],
    ));
    let pwned = t.outside.join("pwned.txt");
    assert!(
        !pwned.exists(),
        "the resumed session mounted the link's target and wrote {}:\n{out}\n{err}",
        pwned.display()
    );
    assert_eq!(code, Some(78), "{out}\n{err}");
    assert!(
        err.contains("symbolic link") && err.contains("--workspace"),
        "the refusal should say why and what to do: {err}"
    );
}

attack!(
    resume_follows_no_link_planted_on_the_recorded_workspace,
    native
);
