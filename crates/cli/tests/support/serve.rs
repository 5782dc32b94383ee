//! A real `cordon serve` on a loopback port, with a home of its own.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A free loopback port: free when asked, for a server about to bind it.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A `cordon serve` or `cordon worker` process, and what it printed when
/// it was ready.
pub struct Started {
    pub child: Child,
    /// Where it serves: `cordon serve`'s URL, or a worker's `/health` one.
    pub url: String,
    /// The first token, when the server printed one.
    pub token: Option<String>,
    /// A worker's id.
    pub worker: Option<String>,
    /// Its home, whose workspace volumes it leaves mounted when killed.
    home: std::path::PathBuf,
    /// The lines of its standard error after the one saying it was ready.
    pub said: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Drop for Started {
    fn drop(&mut self) {
        // A test may have stopped it: a stopped process dies of SIGKILL
        // too, but continuing it first lets it be reaped at once.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGCONT) };
        let _ = self.child.kill();
        let _ = self.child.wait();
        // Killed, it could not unmount them; released, its home can be removed.
        let _ = cordon_sandbox::volume::release(&self.home);
    }
}

/// Runs `cordon ARGS` with `home` as its home (configuration under
/// `config/`, data under `data/`) until it says where it serves.
#[allow(dead_code)]
pub fn spawn(home: &Path, args: &[&str]) -> Started {
    spawn_env(home, args, &[])
}

/// [`spawn`], with `env` in its environment too.
pub fn spawn_env(home: &Path, args: &[&str], env: &[(&str, &str)]) -> Started {
    let mut child = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(args)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .env("XDG_CONFIG_HOME", home.join("config"))
        .envs(env.iter().copied())
        .stderr(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let (mut token, mut worker) = (None, None);
    let deadline = Instant::now() + Duration::from_secs(60);
    let url = loop {
        assert!(Instant::now() < deadline, "cordon {args:?} did not start");
        let line = lines.next().expect("it exited").unwrap();
        if line.starts_with("cdn_") {
            token = Some(line.trim().to_string());
        }
        if let Some(url) = line.strip_prefix("cordon: serving on ") {
            break url.trim().to_string();
        }
        if let Some(rest) = line.strip_prefix("cordon: worker ") {
            worker = rest.split(' ').next().map(str::to_string);
            break rest.rsplit(' ').next().unwrap().to_string();
        }
    };
    // Keep draining stderr so the process never blocks writing to it,
    // and keep what it says for a test to read.
    let said = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let keep = said.clone();
    std::thread::spawn(move || {
        for line in lines.map_while(Result::ok) {
            keep.lock().unwrap().push(line);
        }
    });
    Started {
        child,
        url,
        token,
        worker,
        home: home.to_path_buf(),
        said,
    }
}

pub struct Serve {
    pub process: Started,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its home: configuration under `config/`, data under `data/`.
    pub home: tempfile::TempDir,
}

impl Serve {
    pub fn start() -> Serve {
        Serve::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Serve {
        Serve::start_in(tempfile::tempdir().unwrap(), extra)
    }

    /// `cordon serve EXTRA` with `home` as its home (configuration
    /// included), once it says it is serving.
    pub fn start_in(home: tempfile::TempDir, extra: &[&str]) -> Serve {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut args = vec!["serve", "--listen", &listen];
        args.extend_from_slice(extra);
        let process = spawn(home.path(), &args);
        Serve {
            base: process.url.clone(),
            process,
            home,
        }
    }

    /// A new bearer token for `tenant`, from `cordon token create`.
    pub fn token(&self, tenant: &str) -> String {
        token(self.home.path(), tenant)
    }
}

/// A new bearer token for `tenant` of the server whose home is `home`,
/// from `cordon token create`.
pub fn token(home: &Path, tenant: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["token", "create", "--tenant", tenant])
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .env("HOME", home)
        .env("XDG_DATA_HOME", home.join("data"))
        .output()
        .unwrap();
    assert!(out.status.success());
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// One HTTP client for a test binary's requests to its servers.
pub fn http() -> &'static reqwest::blocking::Client {
    static CLIENT: std::sync::OnceLock<reqwest::blocking::Client> = std::sync::OnceLock::new();
    CLIENT.get_or_init(|| {
        reqwest::blocking::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap()
    })
}

/// Queues `body` at the server at `base`; the new job's id.
pub fn submit(base: &str, token: &str, body: serde_json::Value) -> String {
    let r = http()
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(token)
        .json(&body)
        .send()
        .unwrap();
    assert_eq!(r.status(), 202);
    r.json::<serde_json::Value>().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Job `id` as the server at `base` shows it.
pub fn job(base: &str, token: &str, id: &str) -> serde_json::Value {
    let r = http()
        .get(format!("{base}/v1/jobs/{id}"))
        .bearer_auth(token)
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    r.json().unwrap()
}
