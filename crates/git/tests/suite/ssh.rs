//! A repository over SSH, as a user reaches their own: the key is in the
//! user's SSH agent, the host key in the known_hosts their
//! `core.sshCommand` names. cordon clones and pushes on the host with
//! them, and nothing the sandbox can read afterwards holds the key, the
//! agent's socket or the ssh command. Against a real sshd on loopback,
//! which needs root (its privilege separation).

use std::ffi::OsString;
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use cordon_git::{Existing, HostCredentials, RepoSpec, checked_repository, clone_into, push};
use cordon_testkit::git_remote::{GitRemote, everything_in, git};

const SSHD: &str = "/usr/sbin/sshd";

/// Kills its process when dropped.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap();
    assert!(out.status.success(), "{cmd:?}: {out:?}");
}

fn keygen(path: &Path) {
    run(Command::new("ssh-keygen")
        .args(["-q", "-t", "ed25519", "-N", "", "-C", "cordon-test", "-f"])
        .arg(path));
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn wait_for(what: &str, mut ready: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} never came up");
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// An sshd on loopback that lets this user in with `user_key` alone.
fn sshd(dir: &Path, user_key: &Path) -> (Reaped, u16) {
    keygen(&dir.join("host_key"));
    std::fs::copy(user_key.with_extension("pub"), dir.join("authorized_keys")).unwrap();
    let port = free_port();
    let config = dir.join("sshd_config");
    std::fs::write(
        &config,
        format!(
            "Port {port}\nListenAddress 127.0.0.1\nHostKey {dir}/host_key\n\
             AuthorizedKeysFile {dir}/authorized_keys\nPidFile none\nStrictModes no\nUsePAM no\n\
             PasswordAuthentication no\nKbdInteractiveAuthentication no\n\
             PermitRootLogin prohibit-password\nPubkeyAuthentication yes\n",
            dir = dir.display()
        ),
    )
    .unwrap();
    // Its privilege separation directory, as the service would make it.
    std::fs::create_dir_all("/run/sshd").unwrap();
    let child = Command::new(SSHD)
        .args(["-D", "-e", "-f"])
        .arg(&config)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let daemon = Reaped(child);
    wait_for("sshd", || TcpStream::connect(("127.0.0.1", port)).is_ok());
    (daemon, port)
}

/// An SSH agent holding `key`: the agent and its socket.
fn agent(dir: &Path, key: &Path) -> (Reaped, PathBuf) {
    let socket = dir.join("agent.sock");
    let child = Command::new("ssh-agent")
        .arg("-D")
        .arg("-a")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let agent = Reaped(child);
    wait_for("ssh-agent", || socket.exists());
    run(Command::new("ssh-add")
        .arg("-q")
        .arg(key)
        .env("SSH_AUTH_SOCK", &socket));
    (agent, socket)
}

fn user() -> String {
    let out = Command::new("id").arg("-un").output().unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

#[test]
fn a_clone_and_a_push_over_ssh_use_the_users_agent_and_leave_nothing_of_it() {
    let root = rustix::process::geteuid().is_root();
    if !root || !Path::new(SSHD).exists() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the SSH test needs root and openssh-server (scripts/packages.txt)"
        );
        eprintln!("skipped: needs root and {SSHD}");
        return;
    }
    let tmp = tempfile::tempdir().unwrap();
    let keys = tmp.path().join("keys");
    std::fs::create_dir(&keys).unwrap();
    let user_key = keys.join("user_key");
    keygen(&user_key);
    let (_sshd, port) = sshd(&keys, &user_key);
    let (_agent, socket) = agent(&keys, &user_key);
    // The repository, and the user's home: their ssh command names the
    // known hosts, where the server's key is.
    let remote = GitRemote::start(&tmp.path().join("remote"), "unused", "unused-token");
    let home = tmp.path().join("home");
    std::fs::create_dir(&home).unwrap();
    let host_key = std::fs::read_to_string(keys.join("host_key.pub")).unwrap();
    let known = keys.join("known_hosts");
    std::fs::write(&known, format!("[127.0.0.1]:{port} {host_key}")).unwrap();
    std::fs::write(
        home.join(".gitconfig"),
        format!(
            "[core]\n\tsshCommand = ssh -o BatchMode=yes -o UserKnownHostsFile={}\n",
            known.display()
        ),
    )
    .unwrap();
    let url = format!(
        "ssh://{}@127.0.0.1:{port}{}",
        user(),
        remote.bare().display()
    );
    let spec: RepoSpec = url.parse().unwrap();
    let with_agent = HostCredentials::from_env(vec![
        (OsString::from("HOME"), home.as_os_str().to_owned()),
        (
            OsString::from("SSH_AUTH_SOCK"),
            socket.as_os_str().to_owned(),
        ),
    ]);

    // Without the agent, the server lets no one in, and the error says so.
    let without =
        HostCredentials::from_env(vec![(OsString::from("HOME"), home.as_os_str().to_owned())]);
    let err = clone_into(
        &spec,
        &tmp.path().join("refused"),
        "cordon/s0",
        &without,
        Existing::Refuse,
    )
    .unwrap_err()
    .to_string();
    assert!(err.contains("Permission denied"), "{err}");

    // With it: the clone, on the session's branch from main.
    let ws = tmp.path().join("ws");
    let cloned = clone_into(&spec, &ws, "cordon/s1", &with_agent, Existing::Refuse).unwrap();
    assert_eq!(cloned.base_branch, "main");
    assert_eq!(std::fs::read_to_string(ws.join("README")).unwrap(), "two\n");
    assert_eq!(git(&ws, &["remote", "get-url", "origin"]), url);
    let seen = everything_in(&ws);
    let private = std::fs::read_to_string(&user_key).unwrap();
    for secret in [
        private.lines().nth(1).unwrap(),
        socket.to_str().unwrap(),
        "sshCommand",
        "UserKnownHostsFile",
    ] {
        assert!(!seen.contains(secret), "{secret:?} is in the workspace");
    }
    checked_repository(&ws).expect("a fresh clone passes the check");

    // A commit on the session's branch goes back the same way.
    std::fs::write(ws.join("README"), "three\n").unwrap();
    run(Command::new("git")
        .current_dir(&ws)
        .args(["-c", "user.name=T", "-c", "user.email=t@example.org"])
        .args(["commit", "-qam", "three"]));
    let pushed = push(&ws, &url, "cordon/s1", &with_agent).unwrap();
    let bare = remote.bare();
    assert_eq!(git(&bare, &["rev-parse", "cordon/s1"]), pushed);
    assert_eq!(git(&bare, &["show", "cordon/s1:README"]), "three");
    assert_eq!(git(&bare, &["show", "main:README"]), "two");
    assert!(!everything_in(&ws).contains(socket.to_str().unwrap()));
}
