//! `cordon serve`'s `/mcp` raced by its own sandbox: a tenant's MCP
//! session swaps a directory with a link to another tenant's job
//! workspace (`renameat2(RENAME_EXCHANGE)` in a loop; the data directory's
//! layout is no secret, `/proc/self/mountinfo` shows it) while the tenant
//! calls `list_dir` and `search_files` thousands of times. Nothing of the
//! other tenant's may come back.

use crate::support;

use std::time::{Duration, Instant};

use cordon_testkit::race;
use serde_json::{Value, json};
use support::serve::Serve;

/// In the other tenant's file names and contents.
const MARKER: &str = "HOSTMARKER";

/// Makes `d/inner/file.txt` and `l -> TARGET`, writes TARGET to
/// `started`, then swaps them for a minute or until `stop` appears.
const SWAPPER: &str = r#"
import ctypes, os, sys, time
os.makedirs("d/inner", exist_ok=True)
open("d/inner/file.txt", "w").write("own text\n")
os.symlink(sys.argv[1], "l")
# The test waits for this, not for a link: with the swap running, two
# readlinks can both land on the directory.
open("started", "w").write(os.readlink("l"))
libc = ctypes.CDLL(None, use_errno=True)
end = time.time() + 60
while not os.path.exists("stop") and time.time() < end:
    for _ in range(256):
        libc.renameat2(-100, b"d", -100, b"l", 2)
"#;

/// The server, and a client for its API.
struct Race {
    serve: Serve,
    http: reqwest::blocking::Client,
}

impl Race {
    fn start() -> Race {
        Race {
            serve: Serve::start(),
            http: reqwest::blocking::Client::new(),
        }
    }

    fn token(&self, tenant: &str) -> String {
        self.serve.token(tenant)
    }

    /// Runs a shell job for `token` to its end; its id.
    fn job(&self, token: &str, command: &str) -> String {
        let r: Value = self
            .http
            .post(format!("{}/v1/jobs", self.serve.base))
            .bearer_auth(token)
            .json(&json!({"kind": "shell", "command": command}))
            .send()
            .unwrap()
            .json()
            .unwrap();
        let id = r["id"].as_str().expect("a job id").to_string();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let j: Value = self
                .http
                .get(format!("{}/v1/jobs/{id}", self.serve.base))
                .bearer_auth(token)
                .send()
                .unwrap()
                .json()
                .unwrap();
            match j["state"].as_str() {
                Some("succeeded") => return id,
                Some("queued" | "running") => {}
                _ => panic!("the job failed: {j}"),
            }
            assert!(Instant::now() < deadline, "the job never ended");
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// One JSON-RPC message to /mcp: the answer's session id and body.
    fn rpc(&self, token: &str, session: Option<&str>, body: Value) -> (Option<String>, String) {
        let mut r = self
            .http
            .post(format!("{}/mcp", self.serve.base))
            .header("Accept", "application/json, text/event-stream")
            .bearer_auth(token)
            .json(&body);
        if let Some(id) = session {
            r = r.header("Mcp-Session-Id", id);
        }
        let resp = r.send().unwrap();
        let id = resp
            .headers()
            .get("mcp-session-id")
            .map(|v| v.to_str().unwrap().to_string());
        (id, resp.text().unwrap())
    }
}

fn call(name: &str, arguments: Value) -> Value {
    json!({"jsonrpc": "2.0", "id": 9, "method": "tools/call",
           "params": {"name": name, "arguments": arguments}})
}

#[test]
fn an_mcp_session_racing_its_tools_never_sees_another_tenants_files() {
    let s = Race::start();
    let other = s.token("other");
    let theirs = s.job(
        &other,
        &format!("mkdir {MARKER}-dir && echo {MARKER} > {MARKER}-dir/{MARKER}.txt"),
    );
    let t = s.token("racer");
    let (session, body) = s.rpc(
        &t,
        None,
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize",
               "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                          "clientInfo": {"name": "race", "version": "1"}}}),
    );
    let session = session.unwrap_or_else(|| panic!("no session: {body}"));
    s.rpc(
        &t,
        Some(&session),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
    );
    // From the session's workspace (data/mcp/mcp_X) to the other
    // tenant's job workspace (data/jobs/ID/workspace).
    let target = format!("../../jobs/{theirs}/workspace");
    let server_dir = s.serve.home.path().join("data/cordon/server");
    assert!(
        server_dir
            .join(format!("jobs/{theirs}/workspace/{MARKER}-dir"))
            .is_dir(),
        "the data directory is not laid out as this test assumes"
    );
    let (_, body) = s.rpc(
        &t,
        Some(&session),
        call(
            "write_file",
            json!({"path": "swapper.py", "content": SWAPPER}),
        ),
    );
    assert!(body.contains("swapper.py"), "{body}");
    let (_, body) = s.rpc(
        &t,
        Some(&session),
        call(
            "bash",
            json!({"command": format!(
                "setsid python3 swapper.py {target} </dev/null >/dev/null 2>&1 & \
                 for i in $(seq 200); do [ -s started ] && break; sleep 0.05; done; cat started; true"
            )}),
        ),
    );
    assert!(body.contains(&target), "the swapper did not start: {body}");

    let calls = [
        call("list_dir", json!({"depth": 4})),
        call("list_dir", json!({"path": "l", "depth": 3})),
        // Matches the marker without naming it.
        call("search_files", json!({"pattern": "HOST.ARKER"})),
    ];
    // 45 s on an idle machine; a loaded one gets longer for its tries.
    let race = race::Race::start(1500, Duration::from_secs(45), Duration::from_secs(120));
    let mut tries = 0;
    'race: for _ in 0..1000 {
        for c in &calls {
            tries += 1;
            let (_, body) = s.rpc(&t, Some(&session), c.clone());
            assert!(
                !body.contains(MARKER),
                "try {tries}: the session saw the other tenant's files: {body}"
            );
            if race.done(tries) {
                break 'race;
            }
        }
    }
    eprintln!("{tries} tool calls in {:?}", race.elapsed());
    s.rpc(
        &t,
        Some(&session),
        call("bash", json!({"command": "touch stop"})),
    );
    race.assert_convincing(tries, "calls");
}
