//! A real server on loopback for each test, over SQLite or PostgreSQL.
#![allow(dead_code)]

pub mod mcp;
pub mod pgtest;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon_server::{Running, ServerConfig};
use serde_json::{Value, json};

pub fn supervisor() -> PathBuf {
    if let Some(p) = std::env::var_os("CORDON_SUPERVISOR") {
        return p.into();
    }
    let exe = std::env::current_exe().unwrap();
    let p = exe
        .parent()
        .and_then(Path::parent)
        .unwrap()
        .join("cordon-supervisor");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p cordon-sandbox --bins`",
        p.display()
    );
    p
}

/// The database a test runs against.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Db {
    Sqlite,
    Postgres,
}

/// A database URL for `db`, with what keeps it alive; `None` when
/// PostgreSQL is not installed and the test may skip (never under CI).
pub fn database(db: Db, dir: &Path) -> Option<(String, Option<pgtest::TestPostgres>)> {
    match db {
        Db::Sqlite => Some((dir.join("server.db").display().to_string(), None)),
        Db::Postgres => {
            let Some(pg) = pgtest::TestPostgres::try_start() else {
                eprintln!("skipped: PostgreSQL is not installed (apt-get install postgresql)");
                return None;
            };
            Some((pg.url(), Some(pg)))
        }
    }
}

/// Runs an `async fn(Db)` test body once per database.
macro_rules! on_both {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn sqlite() {
                    super::$name($crate::common::Db::Sqlite).await
                }
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn postgres() {
                    super::$name($crate::common::Db::Postgres).await
                }
            }
        )*
    };
}

pub struct TestServer {
    pub running: Option<Running>,
    pub base: String,
    pub client: reqwest::Client,
    /// Holds the database and the data directory.
    pub dir: PathBuf,
    _tmp: Option<tempfile::TempDir>,
    _pg: Option<pgtest::TestPostgres>,
}

/// A test's server leaves no workspace volume mounted behind it, stopped
/// or not, so that its directory can be removed.
impl Drop for TestServer {
    fn drop(&mut self) {
        // Not stopped: at least it takes no more jobs (whose workspaces
        // would be mounted after this).
        if let Some(r) = &self.running {
            r.shared.stopping.cancel();
        }
        let _ = cordon_sandbox::volume::release(&self.dir);
    }
}

/// The servers' warnings and errors go to the output of the test whose
/// threads wrote them, which the harness shows when it fails: an answer
/// such as "the server's log says why" must be explainable from CI.
/// `RUST_LOG` says more.
fn log_to_tests() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let filter = tracing_subscriber::EnvFilter::try_from_default_env()
            .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
        let _ = tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_test_writer()
            .try_init();
    });
}

impl TestServer {
    /// `None` when the test must skip (PostgreSQL missing, outside CI).
    pub async fn start(db: Db) -> Option<TestServer> {
        Self::start_with(db, |_| {}).await
    }

    pub async fn start_with(db: Db, tune: impl FnOnce(&mut ServerConfig)) -> Option<TestServer> {
        let tmp = tempfile::tempdir().unwrap();
        let (url, pg) = database(db, tmp.path())?;
        let mut s = Self::start_at(tmp.path(), &url, tune).await;
        s._tmp = Some(tmp);
        s._pg = pg;
        Some(s)
    }

    /// A server over the database at `db_url` and the data in `dir`, which
    /// both outlive it.
    pub async fn start_at(
        dir: &Path,
        db_url: &str,
        tune: impl FnOnce(&mut ServerConfig),
    ) -> TestServer {
        log_to_tests();
        let mut config = ServerConfig::new(db_url, dir.join("data"));
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.supervisor = Some(supervisor());
        config.workers = 4;
        // A test that stops its server with a job running does not wait
        // the default 30 s for it.
        config.grace = Duration::from_secs(1);
        tune(&mut config);
        let running = cordon_server::start(config).await.unwrap();
        let base = format!("http://{}", running.addr);
        TestServer {
            running: Some(running),
            base,
            client: reqwest::Client::new(),
            dir: dir.to_path_buf(),
            _tmp: None,
            _pg: None,
        }
    }

    /// A token of `tenant`'s.
    pub async fn token(&self, tenant: &str) -> String {
        self.token_as(tenant, cordon_server::store::Role::Tenant)
            .await
    }

    /// A token of `tenant`'s with `role`.
    pub async fn token_as(&self, tenant: &str, role: cordon_server::store::Role) -> String {
        self.running
            .as_ref()
            .unwrap()
            .shared
            .store
            .create_token(tenant, role)
            .await
            .unwrap()
            .token
    }

    pub fn url(&self, path: &str) -> String {
        format!("{}{}", self.base, path)
    }

    /// A JSON request with `token`: the status and the JSON answer (null
    /// if it is none).
    async fn send(
        &self,
        method: reqwest::Method,
        token: &str,
        path: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut req = self
            .client
            .request(method, self.url(path))
            .bearer_auth(token);
        if let Some(body) = body {
            req = req.json(&body);
        }
        let r = req.send().await.unwrap();
        let status = r.status().as_u16();
        (status, r.json().await.unwrap_or(Value::Null))
    }

    pub async fn post(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::POST, token, path, Some(body))
            .await
    }

    pub async fn get(&self, token: &str, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::GET, token, path, None).await
    }

    pub async fn put(&self, token: &str, path: &str, body: Value) -> (u16, Value) {
        self.send(reqwest::Method::PUT, token, path, Some(body))
            .await
    }

    pub async fn delete(&self, token: &str, path: &str) -> (u16, Value) {
        self.send(reqwest::Method::DELETE, token, path, None).await
    }

    /// Sends a message to session `id` and reads its turn to the end: the
    /// events, (type, data), in order.
    pub async fn say(&self, token: &str, id: &str, text: &str) -> Vec<(String, Value)> {
        let r = self
            .client
            .post(self.url(&format!("/v1/sessions/{id}/messages")))
            .bearer_auth(token)
            .json(&json!({"text": text}))
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200, "{}", r.text().await.unwrap());
        let text = r.text().await.unwrap();
        // Session streams carry no ids: each is one turn, not resumable.
        text.split("\n\n")
            .filter_map(|block| {
                let mut event = None;
                let mut data = None;
                for line in block.lines() {
                    if let Some(v) = line.strip_prefix("event: ") {
                        event = Some(v.to_string());
                    } else if let Some(v) = line.strip_prefix("data: ") {
                        data = serde_json::from_str(v).ok();
                    }
                }
                Some((event?, data?))
            })
            .collect()
    }

    /// A job's events so far (the whole stream of a finished job): (id,
    /// event, data) triples.
    pub async fn job_events(&self, token: &str, id: &str) -> Vec<(i64, String, Value)> {
        let r = self
            .client
            .get(self.url(&format!("/v1/jobs/{id}/events")))
            .bearer_auth(token)
            .send()
            .await
            .unwrap();
        read_sse(r).await
    }

    /// Makes an API session of `token`'s tenant and returns its id.
    pub async fn new_session(&self, token: &str) -> String {
        let (status, created) = self.post(token, "/v1/sessions", json!({})).await;
        assert_eq!(status, 201, "{created}");
        created["id"].as_str().unwrap().to_string()
    }

    /// Queues a job and returns its id.
    pub async fn submit(&self, token: &str, job: Value) -> String {
        let (status, body) = self.post(token, "/v1/jobs", job).await;
        assert_eq!(status, 202, "{body}");
        body["id"].as_str().unwrap().to_string()
    }

    /// Lets a job held by `while [ ! -f /workspace/release ]` go: uploads
    /// the file and waits for the job's end, which it returns.
    pub async fn release(&self, token: &str, id: &str) -> Value {
        let r = self
            .client
            .put(self.url(&format!("/v1/jobs/{id}/files/release")))
            .bearer_auth(token)
            .body("")
            .send()
            .await
            .unwrap();
        assert!(r.status().is_success(), "{}", r.status());
        self.wait(token, id).await
    }

    /// Waits for a job to reach a terminal state and returns it.
    pub async fn wait(&self, token: &str, id: &str) -> Value {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let (status, job) = self.get(token, &format!("/v1/jobs/{id}")).await;
            assert_eq!(status, 200, "{job}");
            let state = job["state"].as_str().unwrap();
            if !["queued", "running"].contains(&state) {
                return job;
            }
            assert!(Instant::now() < deadline, "job {id} still {state}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    pub async fn stop(mut self) -> Option<cordon_server::Stopped> {
        let r = self.running.take()?;
        Some(r.shutdown().await)
    }

    /// Waits until a job is running.
    pub async fn wait_running(&self, token: &str, id: &str) {
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let (_, job) = self.get(token, &format!("/v1/jobs/{id}")).await;
            if job["state"] == "running" {
                return;
            }
            assert!(Instant::now() < deadline, "job {id} never ran: {job}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

/// Whether this process can make workspace volumes (it runs as root);
/// if not, says the test is skipped, which CI (run as root) never is.
pub fn volumes() -> bool {
    if cordon_sandbox::volume::supported() {
        return true;
    }
    assert!(
        std::env::var("CI").is_err(),
        "volumes need root, and CI runs as root"
    );
    eprintln!("skipped: volumes need root");
    false
}

/// The id of the workspace `s` has made ahead for the next owner whose
/// ids start with `prefix` (`job_`, `sbx_`), once it is ready (its
/// metrics say so): the one its ledger lists that is not in `not`.
pub async fn ready_ahead(s: &TestServer, prefix: &str, not: &[&str]) -> String {
    let ledger = s.dir.join("data/pool");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let ready = sample(&scrape(s).await, "cordon_workspaces_ahead").unwrap_or(0.0);
        let listed: Vec<String> = std::fs::read_dir(&ledger)
            .map(|rd| {
                rd.map(|e| e.unwrap().file_name().into_string().unwrap())
                    .filter(|n| n.starts_with(prefix) && !not.contains(&n.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        assert!(listed.len() < 2, "more than one made ahead: {listed:?}");
        if let ([one], true) = (&listed[..], ready >= 1.0) {
            return one.clone();
        }
        assert!(Instant::now() < deadline, "no workspace was made ahead");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How many mounts of this process's namespace are at or beneath `path`
/// (a workspace's volume is two).
pub fn mounts_beneath(path: &Path) -> usize {
    let info = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    let path = path.canonicalize().unwrap();
    let path = path.to_str().unwrap();
    info.lines().filter(|l| l.contains(path)).count()
}

/// Reads an SSE response to its end: (id, event, data) triples.
pub async fn read_sse(resp: reqwest::Response) -> Vec<(i64, String, Value)> {
    let text = resp.text().await.unwrap();
    parse_sse(&text)
}

pub fn parse_sse(text: &str) -> Vec<(i64, String, Value)> {
    let mut out = Vec::new();
    for block in text.split("\n\n") {
        let (mut id, mut event, mut data) = (None, None, None);
        for line in block.lines() {
            if let Some(v) = line.strip_prefix("id: ") {
                id = v.parse().ok();
            } else if let Some(v) = line.strip_prefix("event: ") {
                event = Some(v.to_string());
            } else if let Some(v) = line.strip_prefix("data: ") {
                data = serde_json::from_str(v).ok();
            }
        }
        if let (Some(id), Some(event), Some(data)) = (id, event, data) {
            out.push((id, event, data));
        }
    }
    out
}

/// Python for a job's sandbox that runs `setup` (which makes a directory
/// `d` and a link `l`), then exchanges the two names
/// (`renameat2(RENAME_EXCHANGE)`) as fast as it can until the file `stop`
/// appears or a minute passes, and prints how many times it did.
pub fn exchange_racer(setup: &str) -> String {
    format!(
        r#"
import ctypes, os, sys, time
{setup}
libc = ctypes.CDLL(None, use_errno=True)
n, end = 0, time.time() + 60
while not os.path.exists("stop") and time.time() < end:
    for _ in range(256):
        if libc.renameat2(-100, b"d", -100, b"l", 2) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
        n += 1
print(n)
"#
    )
}

/// `/metrics` from the server's metrics listener, in Prometheus' text
/// format.
pub async fn scrape(s: &TestServer) -> String {
    let addr = s.running.as_ref().unwrap().metrics_addr.unwrap();
    let r = reqwest::get(format!("http://{addr}/metrics"))
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let ct = r.headers()["content-type"].to_str().unwrap().to_string();
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    r.text().await.unwrap()
}

/// The value of the sample named exactly `series` (name and labels).
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .map(|v| v.trim().parse().unwrap())
}

/// An operator's image catalog of `entries` (`NAME=SOURCE`, as
/// `--image` takes them).
pub fn catalog(entries: &[String]) -> cordon_server::catalog::ImageCatalog {
    cordon_server::catalog::ImageCatalog {
        entries: entries
            .iter()
            .map(|e| cordon_server::catalog::CatalogEntry::parse(e).unwrap())
            .collect(),
        ..Default::default()
    }
}

/// A sandbox of the sandbox API made as `body` asks, running: its id.
pub async fn new_sandbox(s: &TestServer, t: &str, body: Value) -> String {
    let (status, b) = s.post(t, "/v1/sandboxes", body).await;
    assert_eq!(status, 201, "{b}");
    assert_eq!(b["state"], "running", "{b}");
    b["id"].as_str().unwrap().to_string()
}

/// A command run in sandbox `id` as `body` asks, to its end: the answer.
pub async fn sandbox_command(s: &TestServer, t: &str, id: &str, body: Value) -> Value {
    let (status, b) = s
        .post(t, &format!("/v1/sandboxes/{id}/commands"), body)
        .await;
    assert_eq!(status, 200, "{b}");
    b
}

pub fn shell(command: &str) -> Value {
    json!({"kind": "shell", "command": command})
}

/// The agent of every agent job and API session: the scripted model server
/// at `url`, over the Anthropic protocol.
pub fn agent_at(url: String) -> cordon_server::AgentDefaults {
    let mut provider =
        cordon_agent::ProviderConfig::new(cordon_agent::ProviderKind::Anthropic, url);
    provider.api_key = Some("sk-test".into());
    cordon_server::AgentDefaults {
        provider,
        agent: cordon_agent::AgentConfig::new("claude-sonnet-4-5"),
    }
}

/// A server tuning that gives it [`agent_at`] `url`.
pub fn with_model(url: String) -> impl FnOnce(&mut ServerConfig) {
    move |c| c.agent = Some(agent_at(url))
}
