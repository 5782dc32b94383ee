//! `cordon exec --repo URL` as a user types it, against a remote on
//! loopback that needs credentials: cordon clones with the user's own git
//! credential helper, on the host; the model works on a branch of the
//! session's own; and the sandbox, searching everywhere it can read, finds
//! no credential.

use crate::support;

use std::path::{Path, PathBuf};
use std::process::Output;

use cordon_testkit::forge::ScriptedForge;
use cordon_testkit::git_remote::{GitRemote, git};
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::{Value, json};

const USER: &str = "alice";
const TOKEN: &str = "s3cret-token-5f1e";
const FORGE_TOKEN: &str = "forge-t0ken-77aa";

fn cordon(server: &ScriptedServer, cwd: &Path, home: &Path, args: &[&str]) -> Output {
    cordon_env(server, cwd, home, args, &[])
}

fn cordon_env(
    server: &ScriptedServer,
    cwd: &Path,
    home: &Path,
    args: &[&str],
    env: &[(&str, &str)],
) -> Output {
    support::user_cordon(home, cwd, &server.url())
        .args(args)
        .envs(env.iter().copied())
        .output()
        .unwrap()
}

/// A remote on loopback that needs a login, and a user whose git
/// credential helper has it: (their temporary directory, the remote, the
/// user's home, the directory they work in).
fn user_with_a_remote() -> (tempfile::TempDir, GitRemote, PathBuf, PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote::start(&tmp.path().join("remote"), USER, TOKEN);
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(
        home.join(".gitconfig"),
        "[credential]\n\thelper = store\n[user]\n\tname = Ada Host\n\temail = ada@host.example\n",
    )
    .unwrap();
    std::fs::write(
        home.join(".git-credentials"),
        format!("http://{USER}:{TOKEN}@127.0.0.1:{}\n", remote.port),
    )
    .unwrap();
    let cwd = tmp.path().join("projects");
    std::fs::create_dir(&cwd).unwrap();
    (tmp, remote, home, cwd)
}

#[test]
fn exec_repo_clones_with_the_users_helper_and_the_sandbox_finds_no_credential() {
    let (tmp, remote, home, cwd) = user_with_a_remote();

    // The token, spelled so that the command searching for it does not
    // hold it.
    let (head, tail) = TOKEN.split_at(6);
    // Every process's environment (a grep's own command line would hold
    // the pattern), and every file where data lives (not /usr, the host's
    // read-only system files).
    let search = format!(
        "cd /workspace && git log --oneline -1 && git branch --show-current && \
         for f in $(grep -rlF \"{head}\"\"{tail}\" /workspace /tmp /etc /root /home /run /var /opt /srv /mnt 2>/dev/null); do echo HIT\"\"-$f; done; \
         for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null; done \
           | grep -F \"{head}\"\"{tail}\" >/dev/null && echo HIT\"\"-environ; \
         git config --list --show-origin; echo SEARCHED"
    );
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Looking around.").with_tool_call(
                "b1",
                "bash",
                json!({"command": search}),
            ))
            .turn(
                Turn::text("Nothing there; fixing the README.")
                    .with_tool_call(
                        "w1",
                        "write_file",
                        json!({"path": "README", "content": "three\n"}),
                    )
                    .expect_tool_results(["b1"])
                    .expect_contains("SEARCHED")
                    .expect_contains("two")
                    .expect_lacks("HIT-")
                    .expect_lacks(TOKEN)
                    .expect_lacks("credential.helper"),
            )
            // The sandbox cannot commit (.git is read-only there); the
            // model asks cordon to.
            .turn(
                Turn::text("Trying git in the sandbox.")
                    .with_tool_call(
                        "b2",
                        "bash",
                        json!({"command": "git commit -qam try; echo rc=$?"}),
                    )
                    .expect_tool_results(["w1"]),
            )
            .turn(
                Turn::text("Committing through cordon.")
                    .with_tool_call(
                        "c1",
                        "git_commit",
                        json!({"message": "README: three\n\nAsked for."}),
                    )
                    .expect_tool_results(["b2"])
                    .expect_lacks("rc=0"),
            )
            .turn(
                Turn::text("Committed; pushing.")
                    .with_tool_call("p1", "git_push", json!({}))
                    .expect_tool_results(["c1"])
                    .expect_contains("M README"),
            )
            .turn(
                Turn::text("Pushed; opening a pull request.")
                    .with_tool_call(
                        "pr1",
                        "create_pull_request",
                        json!({"title": "README: three", "body": "The README now says three."}),
                    )
                    .expect_tool_results(["p1"])
                    .expect_contains("Pushed cordon/"),
            )
            .turn(
                Turn::text("Opened.")
                    .expect_tool_results(["pr1"])
                    .expect_contains("Opened pull request #1"),
            )
            // A second session, not allowed to push: the push is refused
            // and said so; another branch cannot be named.
            .turn(Turn::text("Pushing main.").with_tool_call(
                "p2",
                "git_push",
                json!({"branch": "main"}),
            ))
            .turn(
                Turn::text("Pushing mine.")
                    .with_tool_call("p3", "git_push", json!({}))
                    .expect_tool_results(["p2"])
                    .expect_contains("takes no arguments"),
            )
            .turn(
                Turn::text("Not allowed.")
                    .expect_tool_results(["p3"])
                    .expect_contains("needs the user's approval"),
            ),
    );
    let url = remote.url();
    let forge = ScriptedForge::start(FORGE_TOKEN);
    let forge_api = forge.url();
    let out = cordon_env(
        &server,
        &cwd,
        &home,
        &[
            "exec",
            "--repo",
            &url,
            "--allow-push",
            "--forge-api",
            &forge_api,
            "look around",
        ],
        &[("CORDON_FORGE_TOKEN", FORGE_TOKEN)],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    // Cloned where git would put it, on the session's branch.
    let ws = cwd.join("proj");
    assert!(
        stderr.contains("cloned") && stderr.contains("cordon/"),
        "{stderr}"
    );
    let branch = git(&ws, &["branch", "--show-current"]);
    assert!(branch.starts_with("cordon/"), "{branch}");
    assert_eq!(
        std::fs::read_to_string(ws.join("README")).unwrap(),
        "three\n"
    );
    // The commit: on the session's branch, by the host's user, the message
    // the model gave; the remote and main untouched.
    assert_eq!(
        git(&ws, &["log", "-1", "--format=%an <%ae>|%s"]),
        "Ada Host <ada@host.example>|README: three"
    );
    assert_eq!(
        git(&ws, &["rev-parse", "HEAD^"]),
        git(&ws, &["rev-parse", "main"])
    );
    assert_eq!(git(&ws, &["status", "--porcelain"]), "");
    // Pushed: the remote has the session's branch at that commit, and its
    // main is as it was.
    let bare = remote.bare();
    assert_eq!(
        git(&bare, &["rev-parse", &format!("refs/heads/{branch}")]),
        git(&ws, &["rev-parse", "HEAD"])
    );
    assert_eq!(
        git(&bare, &["rev-parse", "main"]),
        git(&ws, &["rev-parse", "main"])
    );
    // The pull request: from the session's branch into the one it started
    // from, with the model's title and body, and the user's token.
    let calls = forge.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    // A forge that is not github.com speaks Gitea's (and Forgejo's) API.
    assert_eq!(calls[0].path, "/api/v1/repos/team/proj/pulls");
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("token {FORGE_TOKEN}").as_str())
    );
    assert_eq!(
        calls[0].body,
        json!({"title": "README: three", "body": "The README now says three.", "head": branch, "base": "main"})
    );
    // The session says which repository and branch it works on.
    let list = cordon(&server, &cwd, &home, &["sessions", "--all", "--json"]);
    let session: Value = serde_json::from_str(
        String::from_utf8_lossy(&list.stdout)
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let id = session["id"].as_str().unwrap();
    assert_eq!(branch, format!("cordon/{id}"));
    let log =
        std::fs::read_to_string(home.join(format!("data/cordon/sessions/{id}.jsonl"))).unwrap();
    let repo: Value = log
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|r| r["type"] == "repository")
        .expect("a repository record");
    assert_eq!(repo["url"], url.as_str());
    assert_eq!(repo["branch"], branch.as_str());

    // Without --allow-push, the model cannot push.
    let other = tmp.path().join("other");
    let out = cordon(
        &server,
        &cwd,
        &home,
        &[
            "exec",
            "--repo",
            &url,
            "--workspace",
            other.to_str().unwrap(),
            "push main",
        ],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.assert_finished();
    let heads = git(
        &bare,
        &["for-each-ref", "--format=%(refname)", "refs/heads"],
    );
    assert_eq!(
        heads.lines().count(),
        3,
        "main, feature and the first session's: {heads}"
    );

    // A --repo into a directory holding something else is refused, and
    // a URL with the token in it never gets as far as git.
    let full = tmp.path().join("full");
    std::fs::create_dir(&full).unwrap();
    std::fs::write(full.join("mine.txt"), "x").unwrap();
    let out = cordon(
        &server,
        &cwd,
        &home,
        &[
            "exec",
            "--repo",
            &url,
            "--workspace",
            full.to_str().unwrap(),
            "again",
        ],
    );
    assert_eq!(out.status.code(), Some(125));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is not empty"));
    let with_token = format!(
        "http://{USER}:{TOKEN}@127.0.0.1:{}/team/proj.git",
        remote.port
    );
    let out = cordon(&server, &cwd, &home, &["exec", "--repo", &with_token, "x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_ne!(out.status.code(), Some(0));
    assert!(
        err.contains("credential helper") && !err.contains(TOKEN),
        "{err}"
    );
}

#[test]
fn exec_repo_inside_a_clone_of_it_leaves_that_clone_alone_and_works_in_a_fresh_one() {
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote::start(&tmp.path().join("remote"), USER, TOKEN);
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    std::fs::write(home.join(".gitconfig"), "[credential]\n\thelper = store\n").unwrap();
    std::fs::write(
        home.join(".git-credentials"),
        format!("http://{USER}:{TOKEN}@127.0.0.1:{}\n", remote.port),
    )
    .unwrap();
    // The user's own checkout, with work of theirs in progress.
    let url = remote.url();
    let projects = tmp.path().join("projects");
    std::fs::create_dir(&projects).unwrap();
    let with_login = url.replace("http://", &format!("http://{USER}:{TOKEN}@"));
    git(&projects, &["clone", "-q", &with_login, "proj"]);
    let mine = projects.join("proj");
    git(&mine, &["remote", "set-url", "origin", &url]);
    std::fs::write(mine.join("README"), "my edit\n").unwrap();

    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Adding it.").with_tool_call(
                "w1",
                "write_file",
                json!({"path": "added.txt", "content": "fresh\n"}),
            ))
            .turn(Turn::text("Added.").expect_tool_results(["w1"])),
    );
    let out = cordon(
        &server,
        &mine,
        &home,
        &["exec", "--repo", &url, "add a file"],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stderr}");
    assert!(stderr.contains("is already a clone of"), "{stderr}");
    // Theirs: as it was.
    assert!(!mine.join("added.txt").exists());
    assert_eq!(git(&mine, &["branch", "--show-current"]), "main");
    assert_eq!(git(&mine, &["status", "--porcelain"]), "M README");
    // The session's: a clone of its own on its branch, with the change.
    let clones = home.join("data/cordon/clones");
    let ids: Vec<_> = std::fs::read_dir(&clones).unwrap().flatten().collect();
    assert_eq!(ids.len(), 1);
    let id = ids[0].file_name().to_string_lossy().into_owned();
    let fresh = clones.join(&id).join("proj");
    assert_eq!(
        std::fs::read_to_string(fresh.join("added.txt")).unwrap(),
        "fresh\n"
    );
    assert_eq!(
        std::fs::read_to_string(fresh.join("README")).unwrap(),
        "two\n"
    );
    assert_eq!(
        git(&fresh, &["branch", "--show-current"]),
        format!("cordon/{id}")
    );
}

/// Issue 32: fix a bug in one run, commit and push it in the next. A
/// resumed session gets its repository's git tools back from its log (and
/// the push permission from the new command line); `--repo` may name the
/// same repository again, not another.
#[test]
fn a_resumed_repo_session_keeps_its_git_tools() {
    let (tmp, remote, home, cwd) = user_with_a_remote();
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Fixing.").with_tool_call(
                "w1",
                "write_file",
                json!({"path": "README", "content": "fixed\n"}),
            ))
            .turn(Turn::text("Fixed.").expect_tool_results(["w1"]))
            // Resumed with --last in the clone: the git tools are offered.
            .turn(
                Turn::text("Committing.")
                    .with_tool_call("c1", "git_commit", json!({"message": "README: fixed"}))
                    .expect_contains("\"git_push\"")
                    .expect_contains("Fixed."),
            )
            .turn(
                Turn::text("Pushing.")
                    .with_tool_call("p1", "git_push", json!({}))
                    .expect_tool_results(["c1"])
                    .expect_contains("M README"),
            )
            .turn(
                Turn::text("Pushed.")
                    .expect_tool_results(["p1"])
                    .expect_contains("Pushed cordon/"),
            )
            // Resumed by id with the same --repo: still offered.
            .turn(Turn::text("Nothing else.").expect_contains("\"git_commit\"")),
    );
    let url = remote.url();
    let out = cordon(
        &server,
        &cwd,
        &home,
        &["exec", "--repo", &url, "fix the README"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ws = cwd.join("proj");
    let branch = git(&ws, &["branch", "--show-current"]);
    let id = branch.strip_prefix("cordon/").unwrap().to_string();

    let out = cordon(
        &server,
        &ws,
        &home,
        &["exec", "--last", "--allow-push", "commit and push it"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let bare = remote.bare();
    assert_eq!(
        git(&bare, &["rev-parse", &format!("refs/heads/{branch}")]),
        git(&ws, &["rev-parse", "HEAD"])
    );
    assert_eq!(git(&ws, &["log", "-1", "--format=%s"]), "README: fixed");

    let out = cordon(
        &server,
        &cwd,
        &home,
        &["exec", "--resume", &id, "--repo", &url, "anything else?"],
    );
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    server.assert_finished();
    // The log records the repository once.
    let log =
        std::fs::read_to_string(home.join(format!("data/cordon/sessions/{id}.jsonl"))).unwrap();
    assert_eq!(log.matches("\"type\":\"repository\"").count(), 1, "{log}");

    // Another repository is refused, before any clone or model request.
    let other = format!("http://127.0.0.1:{}/team/other.git", remote.port);
    let out = cordon(
        &server,
        &cwd,
        &home,
        &["exec", "--resume", &id, "--repo", &other, "x"],
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(125), "{err}");
    assert!(
        err.contains(&format!("works on {url}, not {other}")),
        "{err}"
    );
    // --allow-push on a session without a repository says what it is for.
    let plain = tmp.path().join("plain");
    std::fs::create_dir(&plain).unwrap();
    let out = cordon(&server, &plain, &home, &["exec", "--allow-push", "x"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("--allow-push and --forge-api are for a session with a repository"),
        "{err}"
    );
}
