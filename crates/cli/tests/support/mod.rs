//! Helpers for tests that drive the real `cordon` binary.
#![allow(dead_code)]

pub mod proxy;
pub mod s3;
pub mod serve;
pub mod tmux;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

pub const NOBODY: u32 = 65534;

/// Whether `cordon lab setup` has run (scripts/test runs it); required
/// under CI.
pub fn lab_installed() -> bool {
    if cordon_lab::installed(&cordon_lab::cache_dir()).is_some() {
        return true;
    }
    assert!(
        std::env::var("CI").as_deref() != Ok("true"),
        "no lab environment: run `cordon lab setup` (scripts/test does)"
    );
    eprintln!("skipped: no lab environment (cordon lab setup)");
    false
}

/// Who runs `cordon`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Who {
    Root,
    Unprivileged,
    /// Root, with the microvm backend (QEMU, TCG chosen explicitly so that
    /// no warning joins the output).
    Microvm,
}

pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// Returns false (and says why) when this identity cannot be tested here.
/// Under CI nothing may be skipped, so this panics instead.
pub fn available(who: Who) -> bool {
    if is_root() {
        return true;
    }
    if who == Who::Unprivileged {
        return true;
    }
    let msg = "this test needs root (run the suite as root to cover both identities)";
    if std::env::var("CI").as_deref() == Ok("true") {
        panic!("{msg}");
    }
    eprintln!("skipped: {msg}");
    false
}

/// Removes the binaries of test processes that have ended: each holds a
/// build alive (~150 MB) and, run after run, they filled the disk.
fn remove_dead_binaries() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("cordon-test-bin-"))
            .and_then(|p| p.parse::<u32>().ok())
        else {
            continue;
        };
        if !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(e.path());
        }
    }
}

/// The cordon binary, copied where an unprivileged user can execute it
/// (the build directory may sit under a home directory of mode 0700).
pub fn public_binary() -> &'static Path {
    static BIN: OnceLock<PathBuf> = OnceLock::new();
    BIN.get_or_init(|| {
        remove_dead_binaries();
        let dir = std::env::temp_dir().join(format!("cordon-test-bin-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
        let bin = dir.join("cordon");
        // A hard link where it can be: a copy is written through a
        // descriptor that a child forked meanwhile by another test's thread
        // holds until it execs, and running the copy then fails with
        // ETXTBSY ("Text file busy").
        if std::fs::hard_link(env!("CARGO_BIN_EXE_cordon"), &bin).is_ok() {
            return bin;
        }
        let tmp = dir.join("cordon.partial");
        std::fs::copy(env!("CARGO_BIN_EXE_cordon"), &tmp).unwrap();
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::rename(&tmp, &bin).unwrap();
        bin
    })
}

/// A scratch workspace the given identity may write to.
pub fn workspace(who: Who) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("cordon-ws-")
        .tempdir()
        .unwrap();
    if who == Who::Unprivileged && is_root() {
        std::os::unix::fs::chown(dir.path(), Some(NOBODY), Some(NOBODY)).unwrap();
    }
    dir
}

/// `cordon ARGS` as `who`, in `ws`, with a host environment that carries a
/// canary (so tests can check it never reaches the sandbox).
pub fn cordon(who: Who, ws: &Path) -> Command {
    let mut cmd = match who {
        Who::Root => Command::new(env!("CARGO_BIN_EXE_cordon")),
        Who::Microvm => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_cordon"));
            c.env("CORDON_BACKEND", "microvm")
                .env("CORDON_VM_ACCEL", "tcg");
            c
        }
        Who::Unprivileged => {
            let mut c = Command::new(public_binary());
            if is_root() {
                // std clears supplementary groups when it sets the uid.
                c.uid(NOBODY).gid(NOBODY);
            }
            c
        }
    };
    cmd.current_dir(ws)
        .env("CORDON_TEST_CANARY", "canary-7f3a9c");
    cmd
}

/// `cordon` in `cwd` as a user whose home is `home` (their config and data
/// beneath it) and nothing else of this process's environment but a PATH.
pub fn cordon_as_user(home: &Path, cwd: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_cordon"));
    c.current_dir(cwd)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("XDG_CONFIG_HOME", home.join("config"))
        .env("XDG_DATA_HOME", home.join("data"));
    c
}

/// [`cordon_as_user`] with the model at `model_url` (the testkit's
/// scripted server, Anthropic's protocol).
pub fn user_cordon(home: &Path, cwd: &Path, model_url: &str) -> Command {
    let mut c = cordon_as_user(home, cwd);
    c.env("ANTHROPIC_BASE_URL", model_url)
        .env("ANTHROPIC_API_KEY", "sk-test-key-0000000000");
    c
}

/// `cordon run [OPTS] -- CMD...` as `who` in `ws`.
pub fn run(who: Who, ws: &Path, opts: &[&str], command: &[&str]) -> Command {
    let mut cmd = cordon(who, ws);
    cmd.arg("run").args(opts).arg("--").args(command);
    cmd
}

/// `cordon exec ARGS` in `ws` against the scripted model `server`, over
/// its OpenAI-compatible protocol or Anthropic's, with a clean
/// environment and a home of its own (`home`).
pub fn exec_against(
    server: &cordon_testkit::ScriptedServer,
    openai: bool,
    ws: &Path,
    home: &Path,
    args: &[&str],
) -> std::process::Output {
    let mut cmd = cordon_as_user(home, ws);
    cmd.arg("exec").args(args);
    if openai {
        cmd.env("OPENAI_BASE_URL", server.openai_url())
            .args(["--provider", "openai"]);
    } else {
        cmd.env("ANTHROPIC_BASE_URL", server.url())
            .env("ANTHROPIC_API_KEY", "sk-test-key-0000");
    }
    cmd.output().unwrap()
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Submits an agent job with `prompt` to a `cordon serve` at `base` and
/// waits for it to end (failing the test after `within`): its final view.
pub fn run_agent_job(
    base: &str,
    token: &str,
    prompt: &str,
    within: std::time::Duration,
) -> serde_json::Value {
    let client = reqwest::blocking::Client::new();
    let job: serde_json::Value = client
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(token)
        .json(&serde_json::json!({"kind": "agent", "prompt": prompt}))
        .send()
        .unwrap()
        .json()
        .unwrap();
    let id = job["id"].as_str().unwrap_or_default().to_string();
    let deadline = std::time::Instant::now() + within;
    loop {
        let j: serde_json::Value = client
            .get(format!("{base}/v1/jobs/{id}"))
            .bearer_auth(token)
            .send()
            .unwrap()
            .json()
            .unwrap();
        if j["state"] != "queued" && j["state"] != "running" {
            return j;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the job never ended: {j}"
        );
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
}
