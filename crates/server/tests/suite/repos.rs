//! Jobs with `repo`: the worker clones with the tenant's stored login, the
//! model commits, pushes the job's branch and opens a pull request through
//! host-side tools, and the sandbox, searching everywhere it can read,
//! finds no credential. Refusals: transports that would reach the
//! worker's own disk or keys, hosts beyond the tenant's ceiling, another
//! tenant's login. The database holds the token sealed: a copy of it gives
//! no one the token, and a sealed row moved to another tenant opens for no
//! one.

use crate::common;

use common::{Db, TestServer, exchange_racer, read_sse, with_model};
use cordon_testkit::forge::ScriptedForge;
use cordon_testkit::git_remote::{GitRemote, git};
use cordon_testkit::race::Race;
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::json;

const USER: &str = "alice";
const TOKEN: &str = "s3cret-token-5f1e";

/// Stores the remote's login as `token`'s tenant's.
async fn store_login(s: &TestServer, token: &str, remote: &GitRemote) {
    let path = format!("/v1/git-credentials/127.0.0.1:{}", remote.port);
    let (code, body) = s
        .put(token, &path, json!({"username": USER, "token": TOKEN}))
        .await;
    assert_eq!(code, 200, "{body}");
}

/// Loopback is the only host tenants may reach: the remote and the forge.
fn ceiling_loopback(c: &mut cordon_server::ServerConfig) {
    c.network.all = cordon_net::PolicySpec {
        allow: vec!["127.0.0.1:*".into()],
        allow_private: false,
    };
}

async fn an_agent_job_clones_commits_pushes_and_opens_a_pull_request(db: Db) {
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote::start(&tmp.path().join("remote"), USER, TOKEN);
    let forge = ScriptedForge::start(TOKEN);
    let (head, tail) = TOKEN.split_at(6);
    let search = format!(
        "cd /workspace && git log --oneline -1 && git branch --show-current && cat notes.txt && \
         for f in $(grep -rlF \"{head}\"\"{tail}\" /workspace /tmp /etc /root /home /run /var /opt /srv /mnt 2>/dev/null); do echo HIT\"\"-$f; done; \
         for p in /proc/[0-9]*; do tr '\\0' '\\n' < $p/environ 2>/dev/null; done \
           | grep -F \"{head}\"\"{tail}\" >/dev/null && echo HIT\"\"-environ; \
         git config --list --show-origin; echo SEARCHED"
    );
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Looking.").with_tool_call("b1", "bash", json!({"command": search})))
            .turn(
                Turn::text("Editing.")
                    .with_tool_call(
                        "w1",
                        "write_file",
                        json!({"path": "README", "content": "three\n"}),
                    )
                    .expect_tool_results(["b1"])
                    .expect_contains("SEARCHED")
                    .expect_contains("uploaded before")
                    .expect_contains("cordon/job_")
                    .expect_lacks("HIT-")
                    .expect_lacks(TOKEN)
                    .expect_lacks("credential.helper"),
            )
            .turn(
                Turn::text("Committing.")
                    .with_tool_call("c1", "git_commit", json!({"message": "README: three"}))
                    .expect_tool_results(["w1"]),
            )
            .turn(
                Turn::text("Pushing.")
                    .with_tool_call("p1", "git_push", json!({}))
                    .expect_tool_results(["c1"])
                    .expect_contains("M README"),
            )
            .turn(
                Turn::text("Opening.")
                    .with_tool_call(
                        "pr1",
                        "create_pull_request",
                        json!({"title": "README: three", "body": "Asked for."}),
                    )
                    .expect_tool_results(["p1"])
                    .expect_contains("Pushed cordon/job_"),
            )
            .turn(
                Turn::text("Done.")
                    .expect_tool_results(["pr1"])
                    .expect_contains("Opened pull request #1"),
            ),
    );
    let url = model.url();
    let Some(s) = TestServer::start_with(db, |c| {
        with_model(url)(c);
        ceiling_loopback(c);
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    let host = format!("127.0.0.1:{}", remote.port);
    let forge_api = forge.url();

    // The login, stored and listed without its secret.
    let (code, view) = s
        .put(
            &t,
            &format!("/v1/git-credentials/{host}"),
            json!({"username": USER, "token": TOKEN, "forge": "github", "forge_api": forge_api,
                   "author": {"name": "Acme Bot", "email": "bot@acme.example"}}),
        )
        .await;
    assert_eq!(code, 200, "{view}");
    assert_eq!(view["host"], host.as_str());
    let (code, list) = s.get(&t, "/v1/git-credentials").await;
    assert_eq!(code, 200);
    assert_eq!(list["credentials"][0]["username"], USER, "{list}");
    assert!(!list.to_string().contains(TOKEN), "{list}");

    // A file put before the job runs stays beside the clone.
    let (code, job) = s
        .post(
            &t,
            "/v1/jobs",
            json!({"kind": "agent", "prompt": "edit the README", "repo": remote.url(),
                   "allow_push": true, "max_steps": 10}),
        )
        .await;
    assert_eq!(code, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let _ = s
        .client
        .put(s.url(&format!("/v1/jobs/{id}/files/notes.txt")))
        .bearer_auth(&t)
        .body("uploaded before\n")
        .send()
        .await
        .unwrap();
    let job = s.wait(&t, &id).await;
    model.assert_finished();
    assert_eq!(job["state"], "succeeded", "{job}");
    let branch = format!("cordon/{id}");

    // Pushed: the remote's branch holds the commit, by the stored author;
    // main is as it was.
    let bare = remote.bare();
    assert_eq!(
        git(&bare, &["log", "-1", "--format=%an <%ae>|%s", &branch]),
        "Acme Bot <bot@acme.example>|README: three"
    );
    assert_eq!(git(&bare, &["show", &format!("{branch}:README")]), "three");
    assert_eq!(git(&bare, &["show", "main:README"]), "two");
    // The pull request, GitHub's shape, with the stored token.
    let calls = forge.calls();
    assert_eq!(calls.len(), 1, "{calls:?}");
    assert_eq!(calls[0].path, "/repos/team/proj/pulls");
    assert_eq!(
        calls[0].authorization.as_deref(),
        Some(format!("Bearer {TOKEN}").as_str())
    );
    assert_eq!(
        calls[0].body,
        json!({"title": "README: three", "body": "Asked for.", "head": branch, "base": "main"})
    );

    // The events say what was cloned; nothing of the job holds the token.
    let events = read_sse(
        s.client
            .get(s.url(&format!("/v1/jobs/{id}/events")))
            .bearer_auth(&t)
            .send()
            .await
            .unwrap(),
    )
    .await;
    let cloned = events
        .iter()
        .find(|e| e.1 == "repository")
        .expect("a repository event");
    assert_eq!(cloned.2["branch"], branch.as_str());
    assert_eq!(cloned.2["base_branch"], "main");
    assert_eq!(cloned.2["url"], remote.url().as_str());
    let everything = format!("{job}{events:?}");
    assert!(!everything.contains(TOKEN));
    let log = std::fs::read_to_string(s.dir.join(format!("data/jobs/{id}/session.jsonl"))).unwrap();
    assert!(!log.contains(TOKEN));
    assert!(log.contains("\"type\":\"repository\""), "{log}");

    // The login goes away on request; another tenant never saw it.
    let other = s.token("beta").await;
    let (_, list) = s.get(&other, "/v1/git-credentials").await;
    assert_eq!(list["credentials"], json!([]));
    let (code, _) = s
        .delete(&other, &format!("/v1/git-credentials/{host}"))
        .await;
    assert_eq!(code, 404);
    let (code, _) = s.delete(&t, &format!("/v1/git-credentials/{host}")).await;
    assert_eq!(code, 200);
    let (_, list) = s.get(&t, "/v1/git-credentials").await;
    assert_eq!(list["credentials"], json!([]));
}

async fn repositories_beyond_reach_are_refused_and_a_login_is_the_tenants_own(db: Db) {
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote::start(&tmp.path().join("remote"), USER, TOKEN);
    let Some(s) = TestServer::start_with(db, ceiling_loopback).await else {
        return;
    };
    let t = s.token("acme").await;
    for (repo, code, says) in [
        ("file:///etc", 400, "https:// or http://"),
        ("/srv/repos/x.git", 400, "https:// or http://"),
        ("ssh://git@127.0.0.1/o/r.git", 400, "its keys"),
        ("git://127.0.0.1/o/r.git", 400, "https:// or http://"),
        ("ext::sh", 400, "not a repository URL"),
        ("https://u:pw@127.0.0.1/o/r.git", 400, "password or token"),
        (
            "https://example.com/o/r.git",
            403,
            "beyond this tenant's network ceiling",
        ),
        (
            "http://localhost:9/o/r.git",
            403,
            "beyond this tenant's network ceiling",
        ),
    ] {
        let (got, body) = s
            .post(
                &t,
                "/v1/jobs",
                json!({"kind": "shell", "command": "true", "repo": repo}),
            )
            .await;
        assert_eq!(got, code, "{repo}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(says),
            "{repo}: {body}"
        );
    }
    let (got, body) = s
        .post(
            &t,
            "/v1/jobs",
            json!({"kind": "agent", "prompt": "x", "allow_push": true}),
        )
        .await;
    assert_eq!(got, 400, "{body}");
    for (host, body) in [
        ("not a host", json!({"token": "t"})),
        ("github.com", json!({"token": "two words"})),
        ("github.com", json!({"token": "t", "username": "a\nb"})),
        ("github.com", json!({"token": "t", "forge": "gitlab"})),
        (
            "github.com",
            json!({"token": "t", "forge_api": "file:///x"}),
        ),
        ("github.com", json!({"token": "t", "extra": 1})),
    ] {
        let (got, answer) = s
            .put(&t, &format!("/v1/git-credentials/{host}"), body.clone())
            .await;
        assert_eq!(got, 400, "{host} {body}: {answer}");
    }

    // A shell job with the repository: cloned with acme's login; beta,
    // with none, cannot clone it.
    store_login(&s, &t, &remote).await;
    let job = json!({"kind": "shell", "repo": format!("{}#feature", remote.url()),
                     "command": "git branch --show-current; cat README feature.txt; git status --porcelain"});
    let id = s.submit(&t, job.clone()).await;
    let done = s.wait(&t, &id).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["stdout"], format!("cordon/{id}\none\nf\n"), "{done}");
    let beta = s.token("beta").await;
    let id = s.submit(&beta, job).await;
    let done = s.wait(&beta, &id).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(
        done["error"].as_str().unwrap().contains("cannot clone"),
        "{done}"
    );
}

/// `edit` (whose last call is `w1`, a write), then a `git_commit` of it
/// with `message`, a `git_push`, and a last turn that expects the push to
/// have gone to a branch starting `branch`.
fn commit_and_push(edit: Scenario, message: &str, branch: &str) -> Scenario {
    edit.turn(
        Turn::text("Committing.")
            .with_tool_call("c1", "git_commit", json!({"message": message}))
            .expect_tool_results(["w1"]),
    )
    .turn(
        Turn::text("Pushing.")
            .with_tool_call("p1", "git_push", json!({}))
            .expect_tool_results(["c1"]),
    )
    .turn(
        Turn::text("Done.")
            .expect_tool_results(["p1"])
            .expect_contains(format!("Pushed {branch}")),
    )
}

async fn a_session_works_on_a_clone_and_pushes_its_branch(db: Db) {
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote::start(&tmp.path().join("remote"), USER, TOKEN);
    let edit = Scenario::new().turn(Turn::text("Editing.").with_tool_call(
        "w1",
        "write_file",
        json!({"path": "README", "content": "from a session\n"}),
    ));
    let model = ScriptedServer::start(commit_and_push(
        edit,
        "README from a session",
        "cordon/ses_",
    ));
    let url = model.url();
    let Some(s) = TestServer::start_with(db, |c| {
        with_model(url)(c);
        ceiling_loopback(c);
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;

    // Without a login the private remote cannot be cloned: no session.
    let (code, body) = s
        .post(&t, "/v1/sessions", json!({"repo": remote.url()}))
        .await;
    assert_eq!(code, 400, "{body}");
    assert_eq!(body["error"]["code"], "clone_failed", "{body}");
    let (_, list) = s.get(&t, "/v1/sessions").await;
    assert_eq!(list["sessions"], json!([]), "{list}");
    let (code, body) = s
        .post(
            &t,
            "/v1/sessions",
            json!({"repo": "https://example.com/o/r.git"}),
        )
        .await;
    assert_eq!(code, 403, "{body}");

    store_login(&s, &t, &remote).await;
    let (code, session) = s
        .post(
            &t,
            "/v1/sessions",
            json!({"repo": remote.url(), "allow_push": true}),
        )
        .await;
    assert_eq!(code, 201, "{session}");
    let id = session["id"].as_str().unwrap().to_string();
    let events = s.say(&t, &id, "edit the README and push it").await;
    model.assert_finished();
    assert!(
        events.iter().any(|(k, _)| k == "turn_completed"),
        "{events:?}"
    );
    let bare = remote.bare();
    let branch = format!("cordon/{id}");
    assert_eq!(
        git(&bare, &["show", &format!("{branch}:README")]),
        "from a session"
    );
    assert_eq!(
        git(&bare, &["log", "-1", "--format=%an|%s", &branch]),
        "cordon|README from a session"
    );
}

async fn a_login_is_sealed_at_rest_and_opens_only_for_its_tenant_and_key(db: Db) {
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote::start(&tmp.path().join("remote"), USER, TOKEN);
    let dir = tempfile::tempdir().unwrap();
    let Some((db_url, _pg)) = common::database(db, dir.path()) else {
        return;
    };
    let job = json!({"kind": "shell", "repo": remote.url(), "command": "cat README"});
    let s = TestServer::start_at(dir.path(), &db_url, ceiling_loopback).await;
    let (acme, mallory) = (s.token("acme").await, s.token("mallory").await);
    store_login(&s, &acme, &remote).await;
    let id = s.submit(&acme, job.clone()).await;
    assert_eq!(s.wait(&acme, &id).await["stdout"], "two\n");
    // The key the server made itself is its own to read.
    let key = dir.path().join("data/secrets.key");
    let mode =
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&key).unwrap().permissions());
    assert_eq!(mode & 0o777, 0o600);
    s.stop().await;

    // What an attacker with the database has: the row, and for SQLite its
    // files. Neither holds the token.
    sqlx::any::install_default_drivers();
    let url = if db == Db::Sqlite {
        format!("sqlite://{db_url}")
    } else {
        db_url.clone()
    };
    let pool = sqlx::AnyPool::connect(&url).await.unwrap();
    let (sealed,): (String,) = sqlx::query_as("SELECT secret FROM git_credentials")
        .fetch_one(&pool)
        .await
        .unwrap();
    assert!(
        sealed.starts_with("v1:") && !sealed.contains(TOKEN),
        "{sealed}"
    );
    if db == Db::Sqlite {
        for entry in std::fs::read_dir(dir.path()).unwrap() {
            let path = entry.unwrap().path();
            if path.is_file() {
                let bytes = std::fs::read(&path).unwrap();
                assert!(
                    !bytes.windows(TOKEN.len()).any(|w| w == TOKEN.as_bytes()),
                    "the token in {}",
                    path.display()
                );
            }
        }
    }
    // The attacker who may write the database copies acme's sealed login
    // to mallory: it opens for no one but acme.
    sqlx::query(
        "INSERT INTO git_credentials (tenant, host, username, secret, updated_ms) \
         SELECT 'mallory', host, username, secret, updated_ms FROM git_credentials",
    )
    .execute(&pool)
    .await
    .unwrap();
    pool.close().await;

    let s = TestServer::start_at(dir.path(), &db_url, ceiling_loopback).await;
    let id = s.submit(&mallory, job.clone()).await;
    let done = s.wait(&mallory, &id).await;
    assert_eq!(done["state"], "failed", "{done}");
    let error = done["error"].as_str().unwrap();
    assert!(error.contains("does not open"), "{done}");
    assert!(!error.contains(TOKEN), "{done}");
    let id = s.submit(&acme, job.clone()).await;
    assert_eq!(s.wait(&acme, &id).await["state"], "succeeded");
    s.stop().await;

    // A process given another key says so, and lists the login still; the
    // login stored again works with that key.
    let other =
        cordon_server::store::SecretsKey::from_passphrase("another-key-0123456789abcdef0123456789")
            .unwrap();
    let s = TestServer::start_at(dir.path(), &db_url, |c| {
        ceiling_loopback(c);
        c.secrets_key = Some(other.clone());
    })
    .await;
    let id = s.submit(&acme, job.clone()).await;
    let done = s.wait(&acme, &id).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(
        done["error"]
            .as_str()
            .unwrap()
            .contains("another secrets key"),
        "{done}"
    );
    let (code, list) = s.get(&acme, "/v1/git-credentials").await;
    assert_eq!(
        (code, list["credentials"][0]["username"].clone()),
        (200, json!(USER))
    );
    store_login(&s, &acme, &remote).await;
    let id = s.submit(&acme, job.clone()).await;
    let done = s.wait(&acme, &id).await;
    assert_eq!(done["stdout"], "two\n", "{done}");
    s.stop().await;

    // The key rotated, the earlier one kept as previous: the login opens,
    // and is sealed again with the new key, which alone then opens it.
    let newer =
        cordon_server::store::SecretsKey::from_passphrase("newer-key-0123456789abcdef0123456789")
            .unwrap();
    let sealed_now = || async {
        let pool = sqlx::AnyPool::connect(&url).await.unwrap();
        let (sealed,): (String,) =
            sqlx::query_as("SELECT secret FROM git_credentials WHERE tenant = 'acme'")
                .fetch_one(&pool)
                .await
                .unwrap();
        pool.close().await;
        sealed
    };
    assert!(sealed_now().await.contains(other.id()));
    for previous in [vec![other.clone()], vec![]] {
        let key = newer.clone();
        let s = TestServer::start_at(dir.path(), &db_url, |c| {
            ceiling_loopback(c);
            c.secrets_key = Some(key);
            c.previous_secrets_keys = previous;
        })
        .await;
        let id = s.submit(&acme, job.clone()).await;
        let done = s.wait(&acme, &id).await;
        assert_eq!(done["stdout"], "two\n", "{done}");
        s.stop().await;
        assert!(sealed_now().await.contains(newer.id()));
    }
}

/// PUTs a file's bytes into a job's or session's workspace; the status
/// and the answer's text.
async fn put_file(s: &TestServer, token: &str, path: &str, body: &str) -> (u16, String) {
    let r = s
        .client
        .put(s.url(path))
        .bearer_auth(token)
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    (r.status().as_u16(), r.text().await.unwrap())
}

/// Issue 31's first finding: a tenant whose ceiling allows one git server
/// wrote `.git/config` through the files API, adding a remote *named* the
/// clone URL whose `url` is another server; cordon's `git push <clone
/// URL>` went there, past the ceiling. Every host-side writer now refuses
/// the control files (by name, through a link, nested, not yet made), and
/// the push goes to the clone URL alone.
async fn a_tenant_cannot_send_the_workers_push_elsewhere(db: Db) {
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote::start(&tmp.path().join("remote"), USER, TOKEN);
    // Beyond the ceiling, and taking any push with the same login.
    let other = GitRemote::start(&tmp.path().join("other"), USER, TOKEN);
    let edit = Scenario::new()
        .turn(Turn::text("Waiting.").with_tool_call(
            "b1",
            "bash",
            json!({"command": "cd /workspace && ln -s .git gitlink && \
                   for i in $(seq 600); do [ -e go ] && break; sleep 0.1; done; echo GO"}),
        ))
        .turn(
            Turn::text("Editing.")
                .with_tool_call(
                    "w1",
                    "write_file",
                    json!({"path": "README", "content": "three\n"}),
                )
                .expect_tool_results(["b1"])
                .expect_contains("GO"),
        );
    let model = ScriptedServer::start(commit_and_push(edit, "README: three", "cordon/job_"));
    let url = model.url();
    let port = remote.port;
    let Some(s) = TestServer::start_with(db, |c| {
        with_model(url)(c);
        c.network.all = cordon_net::PolicySpec {
            allow: vec![format!("127.0.0.1:{port}")],
            allow_private: false,
        };
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    store_login(&s, &t, &remote).await;
    let (code, job) = s
        .post(
            &t,
            "/v1/jobs",
            json!({"kind": "agent", "prompt": "edit the README", "repo": remote.url(),
                   "allow_push": true, "max_steps": 10}),
        )
        .await;
    assert_eq!(code, 202, "{job}");
    let id = job["id"].as_str().unwrap().to_string();
    let files = format!("/v1/jobs/{id}/files");
    // The clone is there and the sandbox has made its link once this reads.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let (code, _) = s.get(&t, &format!("{files}/gitlink")).await;
        if code == 200 {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "the job never cloned");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let config = format!("[remote \"{}\"]\n\turl = {}\n", remote.url(), other.url());
    for path in [
        ".git/config",
        ".git/remotes/origin",
        ".git/hooks/pre-push",
        "gitlink/config",
        "./.git/config",
        "src/.git/config",
        ".vscode/tasks.json",
        ".mcp.json",
    ] {
        let (code, body) = put_file(&s, &t, &format!("{files}/{path}"), &config).await;
        assert_eq!(code, 400, "{path}: {body}");
        assert!(body.contains("read-only"), "{path}: {body}");
    }
    let (code, body) = put_file(&s, &t, &format!("{files}/go"), "").await;
    assert_eq!(code, 201, "{body}");
    let job = s.wait(&t, &id).await;
    model.assert_finished();
    assert_eq!(job["state"], "succeeded", "{job}");
    let branch = format!("cordon/{id}");
    assert_eq!(
        git(&remote.bare(), &["show", &format!("{branch}:README")]),
        "three"
    );
    assert!(
        !git(&other.bare(), &["for-each-ref"]).contains("cordon/"),
        "the push went to the other server"
    );
    let ws = s.dir.join(format!("data/jobs/{id}/workspace"));
    assert!(!ws.join(".vscode").exists() && !ws.join("src").exists());
    let written = std::fs::read_to_string(ws.join(".git/config")).unwrap();
    assert!(!written.contains(&other.url()), "{written}");

    // A session's files and a steps job's write_file refuse the same.
    let (code, session) = s
        .post(&t, "/v1/sessions", json!({"repo": remote.url()}))
        .await;
    assert_eq!(code, 201, "{session}");
    let sid = session["id"].as_str().unwrap();
    let (code, body) = put_file(
        &s,
        &t,
        &format!("/v1/sessions/{sid}/files/.git/config"),
        &config,
    )
    .await;
    assert_eq!(code, 400, "{body}");
    let steps = s
        .submit(
            &t,
            json!({"kind": "steps", "steps": [
                {"tool": "write_file", "path": ".git/config", "content": config},
            ]}),
        )
        .await;
    let done = s.wait(&t, &steps).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(done.to_string().contains("read-only"), "{done}");
}

/// A session's `repo` is cloned while its request waits: a tenant's
/// concurrent requests do not each start a clone. One at a time here
/// (`per_tenant` 1): the others are told to come back, and the one made
/// works; another tenant is not held up by the first.
async fn clones_a_request_waits_for_are_capped_per_tenant(db: Db) {
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote::start(&tmp.path().join("remote"), USER, TOKEN);
    let model = ScriptedServer::start(Scenario::new());
    let url = model.url();
    let Some(s) = TestServer::start_with(db, |c| {
        with_model(url)(c);
        ceiling_loopback(c);
        c.per_tenant = 1;
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    store_login(&s, &t, &remote).await;
    let asks = (0..6).map(|_| s.post(&t, "/v1/sessions", json!({"repo": remote.url()})));
    let answers = futures_util::future::join_all(asks).await;
    let made = answers.iter().filter(|(c, _)| *c == 201).count();
    let refused: Vec<_> = answers.iter().filter(|(c, _)| *c == 429).collect();
    assert!(made >= 1, "{answers:?}");
    assert!(!refused.is_empty(), "six at once, one slot: {answers:?}");
    assert_eq!(made + refused.len(), 6, "{answers:?}");
    assert_eq!(
        refused[0].1["error"]["code"], "too_many_clones",
        "{refused:?}"
    );
    // The slot is free again once the clones are done.
    let (code, body) = s
        .post(&t, "/v1/sessions", json!({"repo": remote.url()}))
        .await;
    assert_eq!(code, 201, "{body}");
}

/// A directory `d` and a link `l` to the clone's `.git`, for
/// [`exchange_racer`] to swap.
const SETUP: &str = r#"os.makedirs("d", exist_ok=True)
os.symlink(".git", "l")"#;

/// The files API racing a sandbox that exchanges a directory with a link
/// to the clone's `.git` as fast as it can: thousands of writes through
/// both names, and not one reaches `.git`.
async fn a_write_racing_a_link_to_git_never_reaches_it(db: Db) {
    let tmp = tempfile::tempdir().unwrap();
    let remote = GitRemote::start(&tmp.path().join("remote"), USER, TOKEN);
    let Some(s) = TestServer::start_with(db, ceiling_loopback).await else {
        return;
    };
    let t = s.token("acme").await;
    store_login(&s, &t, &remote).await;
    let id = s
        .submit(
            &t,
            json!({"kind": "python", "repo": remote.url(), "code": exchange_racer(SETUP)}),
        )
        .await;
    s.wait_running(&t, &id).await;
    let ws = s.dir.join(format!("data/jobs/{id}/workspace"));
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while ws.join("l").symlink_metadata().is_err() {
        assert!(
            std::time::Instant::now() < deadline,
            "the racer never started"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let config = std::fs::read(ws.join(".git/config")).unwrap();
    let listed = |dir: &std::path::Path| {
        // cordon's clone has no hooks directory: none is an empty list.
        let mut names: Vec<_> = std::fs::read_dir(dir)
            .map(|d| d.map(|e| e.unwrap().file_name()).collect())
            .unwrap_or_default();
        names.sort();
        names
    };
    let (top, hooks) = (listed(&ws.join(".git")), listed(&ws.join(".git/hooks")));
    // 40 s is enough on an idle machine; a loaded one (CI, or a build
    // beside) gets longer to make its tries.
    let race = Race::start(
        2000,
        std::time::Duration::from_secs(40),
        std::time::Duration::from_secs(120),
    );
    let (mut tries, mut written, mut refused) = (0usize, 0usize, 0usize);
    'race: for _ in 0..1000 {
        for path in [
            "d/config",
            "l/config",
            "d/hooks/post-checkout",
            "l/hooks/pre-push",
        ] {
            tries += 1;
            let (code, body) = put_file(
                &s,
                &t,
                &format!("/v1/jobs/{id}/files/{path}"),
                "#!/bin/sh\nevil\n",
            )
            .await;
            match code {
                200 | 201 => written += 1,
                400 => {
                    refused += 1;
                    assert!(
                        body.contains("read-only") || body.contains("symbolic"),
                        "{body}"
                    );
                }
                _ => panic!("try {tries}: {path}: {code} {body}"),
            }
            if race.done(tries) {
                break 'race;
            }
        }
    }
    std::fs::write(ws.join("stop"), "").unwrap();
    let job = s.wait(&t, &id).await;
    let swaps = job["stdout"].as_str().unwrap_or("").trim().to_string();
    eprintln!(
        "{tries} writes ({written} into the directory, {refused} refused) in {:?} against {swaps} swaps",
        race.elapsed()
    );
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(
        std::fs::read(ws.join(".git/config")).unwrap(),
        config,
        ".git/config was written"
    );
    assert_eq!(listed(&ws.join(".git")), top, "a file was made in .git");
    assert_eq!(listed(&ws.join(".git/hooks")), hooks, "a hook was planted");
    race.assert_convincing(tries, "writes");
    assert!(written > 0 && refused > 0, "the race never went both ways");
}

on_both!(
    a_write_racing_a_link_to_git_never_reaches_it,
    clones_a_request_waits_for_are_capped_per_tenant,
    a_tenant_cannot_send_the_workers_push_elsewhere,
    a_login_is_sealed_at_rest_and_opens_only_for_its_tenant_and_key,
    an_agent_job_clones_commits_pushes_and_opens_a_pull_request,
    a_session_works_on_a_clone_and_pushes_its_branch,
    repositories_beyond_reach_are_refused_and_a_login_is_the_tenants_own,
);
