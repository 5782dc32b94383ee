//! A session's repository cloned on the host from a remote that needs
//! credentials (git's smart HTTP behind basic authentication, on
//! loopback): the host's credential helper supplies them, and nothing the
//! sandbox can read holds them afterwards.

use std::ffi::OsString;
use std::path::Path;

use cordon_git::{Existing, HostCredentials, RepoSpec, checked_repository, clone_into};
use cordon_testkit::git_remote::{GitRemote, everything_in, git};

const USER: &str = "alice";
const TOKEN: &str = "s3cret-token-5f1e";

fn remote(root: &Path) -> GitRemote {
    GitRemote::start(root, USER, TOKEN)
}

/// A user whose git configuration names the `store` helper, holding the
/// token for the remote.
fn user_with_token(home: &Path, port: u16) -> HostCredentials {
    std::fs::write(home.join(".gitconfig"), "[credential]\n\thelper = store\n").unwrap();
    std::fs::write(
        home.join(".git-credentials"),
        format!("http://{USER}:{TOKEN}@127.0.0.1:{port}\n"),
    )
    .unwrap();
    HostCredentials::from_env(vec![(OsString::from("HOME"), home.as_os_str().to_owned())])
}

#[test]
fn a_clone_uses_the_hosts_credentials_and_leaves_none_behind() {
    let tmp = tempfile::tempdir().unwrap();
    let remote = remote(&tmp.path().join("remote"));
    let home = tempfile::tempdir().unwrap();
    let creds = user_with_token(home.path(), remote.port);
    let url = remote.url();
    let ws = tmp.path().join("ws");

    let spec: RepoSpec = url.parse().unwrap();
    let cloned = clone_into(&spec, &ws, "cordon/s1", &creds, Existing::Refuse).unwrap();
    assert_eq!(cloned.branch, "cordon/s1");
    assert_eq!(std::fs::read_to_string(ws.join("README")).unwrap(), "two\n");
    assert_eq!(git(&ws, &["symbolic-ref", "HEAD"]), "refs/heads/cordon/s1");
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), cloned.base);
    assert_eq!(git(&ws, &["rev-parse", "origin/main"]), cloned.base);
    assert_eq!(
        cloned.base_branch, "main",
        "pull requests go into the default branch"
    );
    // The remote URL as given, and no secret anywhere the sandbox can read.
    assert_eq!(git(&ws, &["remote", "get-url", "origin"]), url);
    let seen = everything_in(&ws);
    assert!(!seen.contains(TOKEN), "the token is in the workspace");
    assert!(
        !seen.contains("helper"),
        "a credential helper is in the workspace"
    );
    // What cordon's host-side git takes later: a plain repository.
    checked_repository(&ws).expect("a fresh clone passes the check");

    // A branch and a tag to start from.
    let ws2 = tmp.path().join("ws2");
    let spec: RepoSpec = format!("{url}#feature").parse().unwrap();
    let c2 = clone_into(&spec, &ws2, "cordon/s2", &creds, Existing::Refuse).unwrap();
    assert_eq!(c2.base_branch, "feature");
    assert_eq!(
        std::fs::read_to_string(ws2.join("feature.txt")).unwrap(),
        "f\n"
    );
    let ws3 = tmp.path().join("ws3");
    let spec: RepoSpec = format!("{url}#v1").parse().unwrap();
    let c3 = clone_into(&spec, &ws3, "cordon/s3", &creds, Existing::Refuse).unwrap();
    assert_eq!(c3.base_branch, "main", "a tag is no branch to merge into");
    assert_eq!(
        std::fs::read_to_string(ws3.join("README")).unwrap(),
        "one\n"
    );
    let spec: RepoSpec = format!("{url}#no-such-branch").parse().unwrap();
    let err = clone_into(
        &spec,
        &tmp.path().join("ws4"),
        "cordon/s4",
        &creds,
        Existing::Refuse,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("no-such-branch"), "{err}");
}

#[test]
fn without_the_hosts_credentials_the_clone_is_refused_and_says_so() {
    let tmp = tempfile::tempdir().unwrap();
    let remote = remote(&tmp.path().join("remote"));
    let url = remote.url();
    let spec: RepoSpec = url.parse().unwrap();
    let err = clone_into(
        &spec,
        &tmp.path().join("ws"),
        "cordon/s1",
        &HostCredentials::default(),
        Existing::Refuse,
    )
    .unwrap_err()
    .to_string();
    assert!(
        err.contains("cannot clone") && err.contains("127.0.0.1"),
        "{err}"
    );
}

#[test]
fn urls_with_secrets_or_transports_that_run_commands_are_refused() {
    for bad in [
        format!("http://{USER}:{TOKEN}@127.0.0.1:1/team/proj.git"),
        "https://x:ghp_abc@github.com/o/r".to_string(),
    ] {
        let err = bad.parse::<RepoSpec>().unwrap_err().to_string();
        assert!(err.contains("credential helper"), "{err}");
        assert!(
            !err.contains(TOKEN) && !err.contains("ghp_abc"),
            "the error echoes it: {err}"
        );
    }
    for bad in [
        "ext::sh -c touch% /tmp/pwned",
        "--upload-pack=touch /tmp/pwned",
        "ftp://example.com/r",
        "https://example.com/r#--orphan",
        "https://example.com/r#a..b",
        "https://example.com/r#",
        "",
    ] {
        assert!(bad.parse::<RepoSpec>().is_err(), "{bad}");
    }
    let ok: RepoSpec = "git@github.com:o/r.git#main".parse().unwrap();
    assert_eq!(ok.reference.as_deref(), Some("main"));
    assert!(!ok.is_local());
    assert!("/srv/repos/r.git".parse::<RepoSpec>().unwrap().is_local());
    assert!("file:///srv/r.git".parse::<RepoSpec>().unwrap().is_local());
}

#[test]
fn a_clone_goes_only_into_an_empty_directory() {
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("mine.txt"), "x").unwrap();
    let spec: RepoSpec = "https://example.invalid/r.git".parse().unwrap();
    let err = clone_into(
        &spec,
        tmp.path(),
        "cordon/s",
        &HostCredentials::default(),
        Existing::Refuse,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("is not empty"), "{err}");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("mine.txt")).unwrap(),
        "x"
    );
}

/// `url` cloned into `ws` on branch `cordon/s1`, with one commit there.
fn cloned_and_committed(url: &str, ws: &Path, creds: &HostCredentials) -> cordon_git::Committed {
    clone_into(
        &url.parse().unwrap(),
        ws,
        "cordon/s1",
        creds,
        Existing::Refuse,
    )
    .unwrap();
    std::fs::write(ws.join("README"), "pushed\n").unwrap();
    let who = cordon_git::Ident {
        name: "Ada".into(),
        email: "ada@example.com".into(),
    };
    cordon_git::commit(ws, "cordon/s1", "Push me", &who)
        .unwrap()
        .unwrap()
}

#[test]
fn the_sessions_branch_is_pushed_with_the_hosts_credentials_and_nothing_else() {
    let tmp = tempfile::tempdir().unwrap();
    let remote = remote(&tmp.path().join("remote"));
    let home = tempfile::tempdir().unwrap();
    let creds = user_with_token(home.path(), remote.port);
    let url = remote.url();
    let ws = tmp.path().join("ws");
    let c = cloned_and_committed(&url, &ws, &creds);
    let bare = remote.bare();
    let main_before = git(&bare, &["rev-parse", "refs/heads/main"]);

    // No credentials: refused by the remote, nothing changes there.
    let err = cordon_git::push(&ws, &url, "cordon/s1", &HostCredentials::default())
        .unwrap_err()
        .to_string();
    assert!(err.contains("cannot push cordon/s1"), "{err}");
    assert!(!git(&bare, &["for-each-ref"]).contains("cordon/s1"));

    let pushed = cordon_git::push(&ws, &url, "cordon/s1", &creds).unwrap();
    assert_eq!(pushed, c.commit);
    assert_eq!(git(&bare, &["rev-parse", "refs/heads/cordon/s1"]), c.commit);
    assert_eq!(git(&bare, &["rev-parse", "refs/heads/main"]), main_before);
    // A workspace whose configuration was made to redirect the push is
    // refused before anything is sent.
    git(
        &ws,
        &["config", "url.http://127.0.0.1:1/.pushInsteadOf", &url],
    );
    let err = cordon_git::push(&ws, &url, "cordon/s1", &creds)
        .unwrap_err()
        .to_string();
    assert!(err.contains("pushinsteadof"), "{err}");
}

/// A tenant's login, for the remote's host alone; git connects to the
/// checked address, whatever the name resolves to.
fn tenant(url: &str, pins: &[&str], with_login: bool) -> HostCredentials {
    let endpoint = cordon_git::Endpoint::of_url(url).unwrap();
    let login = cordon_git::Login {
        username: USER.into(),
        secret: TOKEN.into(),
    };
    let pins: Vec<std::net::IpAddr> = pins.iter().map(|p| p.parse().unwrap()).collect();
    HostCredentials::remote(&endpoint, with_login.then_some(&login), &pins)
}

#[test]
fn a_tenants_login_clones_keeping_the_files_already_there_and_nothing_of_the_hosts() {
    let tmp = tempfile::tempdir().unwrap();
    let remote = remote(&tmp.path().join("remote"));
    // A name that resolves nowhere: only the pinned address reaches it.
    let url = format!(
        "http://git.cordon-test.invalid:{}/team/proj.git",
        remote.port
    );
    let spec: RepoSpec = url.parse().unwrap();

    // Files uploaded before the job ran: one the repository has too, one
    // it has not, in a directory it has not.
    let ws = tmp.path().join("ws");
    std::fs::create_dir_all(ws.join("notes")).unwrap();
    std::fs::write(ws.join("README"), "mine\n").unwrap();
    std::fs::write(ws.join("notes/todo.txt"), "todo\n").unwrap();
    let cloned = clone_into(
        &spec,
        &ws,
        "cordon/job1",
        &tenant(&url, &["127.0.0.1"], true),
        Existing::Keep,
    )
    .unwrap();
    assert_eq!(
        std::fs::read_to_string(ws.join("README")).unwrap(),
        "mine\n"
    );
    assert_eq!(
        std::fs::read_to_string(ws.join("notes/todo.txt")).unwrap(),
        "todo\n"
    );
    assert_eq!(git(&ws, &["rev-parse", "HEAD"]), cloned.base);
    assert_eq!(
        git(&ws, &["status", "--porcelain"]),
        "M README\n?? notes/",
        "trimmed: the README is modified in the work tree"
    );
    let seen = everything_in(&ws);
    assert!(!seen.contains(TOKEN) && !seen.contains("helper"), "{seen}");
    // Run again on the same machine: the clone is taken up, not redone.
    let again = cordon_git::reopen(&spec, &ws, "cordon/job1").unwrap();
    assert_eq!(again, cloned);
    let other: RepoSpec = "https://elsewhere.example/o/r.git".parse().unwrap();
    assert!(cordon_git::reopen(&other, &ws, "cordon/job1").is_err());
    assert!(cordon_git::reopen(&spec, &ws, "cordon/nope").is_err());
    assert!(
        !std::fs::read_dir(tmp.path())
            .unwrap()
            .flatten()
            .any(|e| e.file_name().to_string_lossy().starts_with(".cordon-clone")),
        "the clone's scratch directory is gone"
    );

    // Without the login, or without the pin, nothing.
    let err = clone_into(
        &spec,
        &tmp.path().join("ws2"),
        "cordon/job2",
        &tenant(&url, &["127.0.0.1"], false),
        Existing::Keep,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("cannot clone"), "{err}");
    let err = clone_into(
        &spec,
        &tmp.path().join("ws3"),
        "cordon/job3",
        &tenant(&url, &[], true),
        Existing::Keep,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("resolve"), "{err}");
    // A workspace with a .git of its own is not cloned into.
    let ws4 = tmp.path().join("ws4");
    std::fs::create_dir_all(ws4.join(".git")).unwrap();
    let err = clone_into(
        &spec,
        &ws4,
        "cordon/job4",
        &tenant(&url, &["127.0.0.1"], true),
        Existing::Keep,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("already holds a .git"), "{err}");
}

#[test]
fn a_tenants_login_goes_to_its_host_alone_and_no_redirect_is_followed() {
    // A server that answers every request with a redirect to the real
    // remote: git must not follow it (nor send the login there).
    let tmp = tempfile::tempdir().unwrap();
    let remote = remote(&tmp.path().join("remote"));
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let target = remote.url();
    std::thread::spawn(move || {
        for stream in listener.incoming().flatten().take(4) {
            use std::io::{Read, Write};
            let mut s = stream;
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 302 Found\r\nLocation: {target}/info/refs?service=git-upload-pack\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            );
        }
    });
    let url = format!("http://127.0.0.1:{port}/team/proj.git");
    let err = clone_into(
        &url.parse().unwrap(),
        &tmp.path().join("ws"),
        "cordon/job1",
        &tenant(&url, &[], true),
        Existing::Keep,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("cannot clone"), "{err}");
    assert!(!tmp.path().join("ws/.git").exists());
}

/// An ssh that runs the remote command here, as git's own tests do, and
/// records what it was given: the user's agent socket, and its arguments.
fn fake_ssh(dir: &Path) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let script = dir.join("fake-ssh");
    let log = dir.join("ssh.log");
    std::fs::write(
        &script,
        format!(
            "#!/bin/bash\necho \"agent=$SSH_AUTH_SOCK args=$*\" >> {}\neval \"exec ${{@: -1}}\"\n",
            log.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    script
}

#[test]
fn over_ssh_cordon_runs_the_users_ssh_command_with_their_agent_and_the_clone_keeps_neither() {
    let tmp = tempfile::tempdir().unwrap();
    let remote = remote(&tmp.path().join("remote"));
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let ssh = fake_ssh(tmp.path());
    std::fs::write(
        home.join(".gitconfig"),
        format!("[core]\n\tsshCommand = {}\n", ssh.display()),
    )
    .unwrap();
    let agent = tmp.path().join("agent.sock");
    let creds = HostCredentials::from_env(vec![
        (OsString::from("HOME"), home.as_os_str().to_owned()),
        (
            OsString::from("SSH_AUTH_SOCK"),
            agent.as_os_str().to_owned(),
        ),
    ]);
    let url = format!("ssh://git.example{}", remote.bare().display());
    let ws = tmp.path().join("ws");
    let cloned = clone_into(
        &url.parse().unwrap(),
        &ws,
        "cordon/s1",
        &creds,
        Existing::Refuse,
    )
    .unwrap();
    assert_eq!(std::fs::read_to_string(ws.join("README")).unwrap(), "two\n");
    assert_eq!(git(&ws, &["remote", "get-url", "origin"]), url);
    let log = std::fs::read_to_string(tmp.path().join("ssh.log")).unwrap();
    assert!(
        log.contains(&format!("agent={}", agent.display()))
            && log.contains("git.example")
            && log.contains("git-upload-pack"),
        "{log}"
    );
    // Nothing of the ssh set-up in the repository the sandbox gets.
    let seen = everything_in(&ws);
    assert!(
        !seen.contains("fake-ssh") && !seen.contains("agent.sock"),
        "{seen}"
    );

    // A push goes the same way, to the session's branch.
    std::fs::write(ws.join("README"), "three\n").unwrap();
    cordon_git::commit(&ws, "cordon/s1", "three", &cordon_git::Ident::cordon())
        .unwrap()
        .expect("a change");
    let pushed = cordon_git::push(&ws, &url, "cordon/s1", &creds).unwrap();
    assert_eq!(
        git(&remote.bare(), &["rev-parse", "refs/heads/cordon/s1"]),
        pushed
    );
    assert_ne!(pushed, cloned.base);
    let log = std::fs::read_to_string(tmp.path().join("ssh.log")).unwrap();
    assert!(log.contains("git-receive-pack"), "{log}");

    // A tenant's credentials never run ssh: cordon's git keeps its own
    // `GIT_SSH_COMMAND=false`.
    let endpoint = cordon_git::Endpoint::of_url("https://git.example/o/r").unwrap();
    let tenant = HostCredentials::remote(&endpoint, None, &[]);
    let err = clone_into(
        &url.parse().unwrap(),
        &tmp.path().join("ws2"),
        "cordon/s2",
        &tenant,
        Existing::Refuse,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("cannot clone"), "{err}");
    assert_eq!(
        std::fs::read_to_string(tmp.path().join("ssh.log"))
            .unwrap()
            .lines()
            .count(),
        log.lines().count(),
        "ssh ran for a tenant"
    );
}

#[test]
fn a_bounded_clone_stops_at_its_budget_its_deadline_or_when_called_off() {
    use std::time::{Duration, Instant};
    let tmp = tempfile::tempdir().unwrap();
    let remote = remote(&tmp.path().join("remote"));
    let url = remote.url();
    let creds = tenant(&url, &[], true);
    let clone = |ws: &str, limits: cordon_git::Limits| {
        cordon_git::clone_within(
            &url.parse().unwrap(),
            &tmp.path().join(ws),
            "cordon/job",
            &creds,
            Existing::Keep,
            &limits,
        )
    };
    let err = clone(
        "small",
        cordon_git::Limits {
            max_bytes: Some(100),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("larger than"), "{err}");
    assert!(!tmp.path().join("small/.git").exists());
    clone(
        "roomy",
        cordon_git::Limits {
            max_bytes: Some(10 << 20),
            ..Default::default()
        },
    )
    .unwrap();

    // A remote that never answers: the deadline, or the call-off, ends it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let held: Vec<_> = listener.incoming().flatten().take(8).collect();
        std::thread::sleep(Duration::from_secs(60));
        drop(held);
    });
    let stalled = format!("http://127.0.0.1:{port}/team/proj.git");
    let creds = tenant(&stalled, &[], true);
    let started = Instant::now();
    let err = cordon_git::clone_within(
        &stalled.parse().unwrap(),
        &tmp.path().join("slow"),
        "cordon/job",
        &creds,
        Existing::Keep,
        &cordon_git::Limits {
            deadline: Some(Instant::now() + Duration::from_millis(500)),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("timeout"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let err = cordon_git::clone_within(
        &stalled.parse().unwrap(),
        &tmp.path().join("off"),
        "cordon/job",
        &creds,
        Existing::Keep,
        &cordon_git::Limits {
            cancelled: Some(std::sync::Arc::new(|| true)),
            ..Default::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("called off"), "{err}");
}

/// What a sandbox with a writable `.git` (`sandbox.protect_control_files =
/// false`), or anyone who could write its files, would plant so that
/// cordon's push of the clone URL goes to another server: a remote whose
/// *name* is the clone URL (git takes it for that URL), or a legacy
/// `remotes/` file. Each is refused before anything is sent, and the
/// other server receives nothing.
#[test]
fn a_remote_named_like_the_clone_url_cannot_redirect_the_push() {
    let tmp = tempfile::tempdir().unwrap();
    let other = remote(&tmp.path().join("other"));
    let remote = remote(&tmp.path().join("remote"));
    let home = tempfile::tempdir().unwrap();
    let creds = user_with_token(home.path(), remote.port);
    // The other server takes the push (the attacker's own, say): without
    // the fix, every plant below lands there.
    let mut store = std::fs::read_to_string(home.path().join(".git-credentials")).unwrap();
    store.push_str(&format!("http://{USER}:{TOKEN}@127.0.0.1:{}\n", other.port));
    std::fs::write(home.path().join(".git-credentials"), store).unwrap();
    let url = remote.url();
    let ws = tmp.path().join("ws");
    cloned_and_committed(&url, &ws, &creds);
    let config = std::fs::read_to_string(ws.join(".git/config")).unwrap();
    let refs = |bare: &Path| git(bare, &["for-each-ref", "--format=%(refname)"]);
    let other_before = refs(&other.bare());

    let plant = |what: &str| match what {
        "a remote named the clone URL" => {
            git(&ws, &["config", &format!("remote.{url}.url"), &other.url()]);
        }
        "the same in a header written by hand" => {
            let mut c = config.clone();
            c.push_str(&format!("[remote \"{url}\"]\n\turl = {}\n", other.url()));
            std::fs::write(ws.join(".git/config"), c).unwrap();
        }
        "a second url on a remote named the clone URL" => {
            let mut c = config.clone();
            c.push_str(&format!(
                "[remote \"{url}\"]\n\turl = {url}\n\turl = {}\n",
                other.url()
            ));
            std::fs::write(ws.join(".git/config"), c).unwrap();
        }
        "a legacy remotes file" => {
            std::fs::create_dir_all(ws.join(".git/remotes")).unwrap();
            std::fs::write(
                ws.join(".git/remotes/origin"),
                format!("URL: {}\n", other.url()),
            )
            .unwrap();
        }
        _ => unreachable!(),
    };
    for what in [
        "a remote named the clone URL",
        "the same in a header written by hand",
        "a second url on a remote named the clone URL",
        "a legacy remotes file",
    ] {
        plant(what);
        let err = cordon_git::push(&ws, &url, "cordon/s1", &creds)
            .expect_err(what)
            .to_string();
        assert!(
            err.contains("remote.") || err.contains("remotes"),
            "{what}: {err}"
        );
        assert_eq!(
            refs(&other.bare()),
            other_before,
            "{what}: pushed to the other server"
        );
        assert!(!refs(&remote.bare()).contains("cordon/s1"), "{what}");
        std::fs::write(ws.join(".git/config"), &config).unwrap();
        let _ = std::fs::remove_dir_all(ws.join(".git/remotes"));
    }
    // Put back as the clone wrote it, the push goes where it says.
    cordon_git::push(&ws, &url, "cordon/s1", &creds).unwrap();
    assert!(refs(&remote.bare()).contains("cordon/s1"));
    assert_eq!(refs(&other.bare()), other_before);
}
