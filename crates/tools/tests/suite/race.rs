//! Races the sandbox can run against the host-side file tools, and the
//! rules of the descriptor-by-descriptor walk that defeats them.
//!
//! A process in the sandbox exchanges a real directory with a symbolic
//! link out of the workspace (`renameat2(RENAME_EXCHANGE)`, as fast as it
//! can) while the host lists and searches the workspace thousands of
//! times. A walk that descends by name follows whatever is at the name
//! when it gets there; every step must instead be relative to the
//! directory descriptor it already holds, and refuse links.
//!
//! Like tests/tools.rs, this needs the `cordon-supervisor` binary built
//! beside the test executable (`cargo build -p cordon-sandbox --bins`).

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cordon_sandbox::{ExecRequest, Sandbox, SandboxConfig};
use cordon_tools::{ToolContext, Toolbox};
use serde_json::{Value, json};

use common::supervisor;

/// What must never reach the model: names and contents beside the
/// workspace, on the host.
const MARKER: &str = "HOSTMARKER";

/// Swaps `d` (a directory) and `l` (a link to `../secret`, beside the
/// workspace on the host) until `stop` appears; prints how many swaps.
const SWAPPER: &str = r#"
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
AT_FDCWD, RENAME_EXCHANGE = -100, 2
n = 0
while True:
    for _ in range(256):
        if libc.renameat2(AT_FDCWD, b"d", AT_FDCWD, b"l", RENAME_EXCHANGE) != 0:
            raise OSError(ctypes.get_errno(), "renameat2")
        n += 1
    if os.path.exists("stop"):
        break
print(n)
"#;

struct Race {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    ctx: ToolContext,
    tools: Toolbox,
}

impl Race {
    /// A workspace `ws` holding `d/inner/file.txt` and `l -> ../secret`,
    /// with `secret/` beside it holding the marker as names and content.
    async fn new() -> Race {
        let dir = tempfile::tempdir().unwrap();
        let ws = dir.path().join("ws");
        let secret = dir.path().join("secret");
        std::fs::create_dir_all(ws.join("d/inner")).unwrap();
        std::fs::write(ws.join("d/inner/file.txt"), "workspace text\n").unwrap();
        std::fs::create_dir_all(secret.join(format!("{MARKER}-dir"))).unwrap();
        std::fs::write(
            secret.join(format!("{MARKER}-dir/{MARKER}.txt")),
            format!("{MARKER} contents\n"),
        )
        .unwrap();
        std::fs::write(
            secret.join(format!("{MARKER}.txt")),
            format!("{MARKER} contents\n"),
        )
        .unwrap();
        std::os::unix::fs::symlink("../secret", ws.join("l")).unwrap();
        let mut config = SandboxConfig::new(&ws);
        config.supervisor = Some(supervisor());
        let sandbox = Sandbox::create(config).await.expect("create sandbox");
        let ctx = ToolContext::new(sandbox, &ws);
        Race {
            _dir: dir,
            ws,
            ctx,
            tools: Toolbox::standard(),
        }
    }

    /// Runs `calls` (tool, input) in turn, `rounds` times, while the
    /// sandbox swaps; fails on the first output holding the marker.
    async fn run(&self, calls: &[(&str, Value)], rounds: usize, limit: Duration) {
        let swapper = self
            .ctx
            .sandbox
            .exec_stream(
                ExecRequest::argv(["python3", "-c", SWAPPER])
                    .cwd("/workspace")
                    .timeout(limit + Duration::from_secs(60)),
            )
            .await
            .expect("start the swapper");
        // Let it get going.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let started = Instant::now();
        let (mut tries, mut errors, mut partial) = (0usize, 0usize, 0usize);
        let mut leak = None;
        'outer: for _ in 0..rounds {
            for (tool, input) in calls {
                tries += 1;
                let out = self.tools.call(&self.ctx, tool, input.clone()).await;
                if out.text.contains(MARKER) {
                    leak = Some(format!("{tool} {input} (try {tries}):\n{}", out.text));
                    break 'outer;
                }
                if out.text.contains("changed while") {
                    partial += 1;
                    assert!(out.text.contains("again"), "{}", out.text);
                }
                if out.is_error {
                    errors += 1;
                    assert!(
                        out.text.contains("again") || out.text.contains("workspace"),
                        "{tool}'s error should say what to do:\n{}",
                        out.text
                    );
                }
            }
            if started.elapsed() > limit {
                break;
            }
        }
        let elapsed = started.elapsed();
        std::fs::write(self.ws.join("stop"), "").unwrap();
        let out = swapper.output().await.expect("the swapper ends");
        let swaps = out.stdout_str();
        assert!(
            out.status == cordon_sandbox::ExitStatus::Code(0),
            "the swapper failed: {}",
            out.stderr_str()
        );
        eprintln!(
            "{tries} calls ({errors} refused, {partial} met a swap mid-walk) in {elapsed:?} against {} swaps",
            swaps.trim()
        );
        if let Some(leak) = leak {
            panic!("the host followed the sandbox's link: {leak}");
        }
        assert!(
            tries >= 1000,
            "only {tries} calls in {elapsed:?}: not a convincing race"
        );
        assert!(partial > 0, "no walk met a swap: the race was not run");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn list_dir_never_follows_a_directory_swapped_for_a_link() {
    let race = Race::new().await;
    race.run(
        &[
            ("list_dir", json!({"depth": 4})),
            ("list_dir", json!({"path": "d", "depth": 3})),
            ("list_dir", json!({"path": "l", "depth": 3})),
        ],
        10_000,
        Duration::from_secs(60),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn search_files_never_reads_through_a_directory_swapped_for_a_link() {
    let race = Race::new().await;
    race.run(
        &[
            ("search_files", json!({"pattern": "contents"})),
            (
                "search_files",
                json!({"pattern": "contents|text", "path": "d"}),
            ),
            ("search_files", json!({"pattern": ".", "glob": "**/*.txt"})),
        ],
        4_000,
        Duration::from_secs(60),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walks_stop_at_a_depth_and_say_so() {
    let race = Race::new().await;
    // A file 70 levels down: deeper than a walk holds descriptors for.
    let mut deep = race.ws.join("deep");
    for i in 0..70 {
        deep.push(format!("{i}"));
    }
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(deep.join("needle.txt"), "needle\n").unwrap();
    let out = race
        .tools
        .call(&race.ctx, "search_files", json!({"pattern": "needle"}))
        .await;
    assert!(!out.is_error, "{}", out.text);
    assert!(
        out.text.contains("deeper than 64 levels not searched"),
        "{}",
        out.text
    );
}

/// The walk's ignore rules, read through its own descriptors: `.gitignore`
/// with a re-include, `.ignore`, a nested repository that the outer rules
/// stop at, and a `.gitignore` that is a link, which is not read.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn walks_honour_ignore_files_without_following_links() {
    let race = Race::new().await;
    let ws = &race.ws;
    let put = |rel: &str, text: &str| {
        let p = ws.join(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, text).unwrap();
    };
    put("rules/.gitignore", "*.log\n!keep.log\n");
    put("rules/a.log", "");
    put("rules/keep.log", "");
    put("rules/.ignore", "private/\n");
    put("rules/private/x", "");
    put("rules/nested/.git/HEAD", "");
    put("rules/nested/b.log", "");
    put("rules/linked/c.txt", "");
    std::fs::write(ws.join("../everything"), "*\n").unwrap();
    std::os::unix::fs::symlink("../../../everything", ws.join("rules/linked/.gitignore")).unwrap();
    let out = race
        .tools
        .call(&race.ctx, "list_dir", json!({"path": "rules", "depth": 3}))
        .await;
    let t = out.text;
    assert!(t.contains("  keep.log\n") && !t.contains("a.log"), "{t}");
    assert!(!t.contains("private"), "{t}");
    assert!(t.contains("  nested/\n    b.log\n"), "{t}");
    assert!(t.contains("    c.txt\n"), "{t}");
    assert!(t.contains(".gitignore -> ../../../everything"), "{t}");
}
