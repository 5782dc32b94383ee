//! Every tool against a real sandbox, through the public `Toolbox` API, as
//! the agent loop will call them.
//!
//! The sandbox needs the `cordon-supervisor` binary of `cordon-sandbox`.
//! Cargo does not build another package's binaries for these tests, so it is
//! looked up beside this test executable; `scripts/test` builds every
//! binary first (`cargo build --workspace --all-targets`), and by hand
//! `cargo build -p cordon-sandbox --bins` does.

use crate::common;

use std::path::PathBuf;
use std::time::{Duration, Instant};

use cordon_sandbox::{Display, Sandbox, SandboxConfig};
use cordon_tools::{Limits, ToolContext, ToolOutput, Toolbox};
use serde_json::{Value, json};

use common::supervisor;

struct Env {
    dir: tempfile::TempDir,
    ctx: ToolContext,
    tools: Toolbox,
}

impl Env {
    async fn new() -> Env {
        Self::with_limits(Limits::default()).await
    }

    async fn with_limits(limits: Limits) -> Env {
        Self::build(limits, None).await
    }

    /// A sandbox with a display of `width` x `height`, and the computer tool.
    async fn with_display(width: u32, height: u32) -> Env {
        let mut env = Self::build(Limits::default(), Some(Display { width, height })).await;
        env.tools.register(cordon_tools::computer::Computer);
        env
    }

    async fn build(limits: Limits, display: Option<Display>) -> Env {
        let dir = tempfile::tempdir().unwrap();
        let mut config = SandboxConfig::new(dir.path());
        config.supervisor = Some(supervisor());
        config.display = display;
        let sandbox = Sandbox::create(config).await.expect("create sandbox");
        let ctx = ToolContext::new(sandbox, dir.path()).with_limits(limits);
        Env {
            dir,
            ctx,
            tools: Toolbox::standard(),
        }
    }

    fn path(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    fn write(&self, rel: &str, content: &str) {
        let p = self.path(rel);
        std::fs::create_dir_all(p.parent().unwrap()).unwrap();
        std::fs::write(p, content).unwrap();
    }

    async fn call(&self, tool: &str, input: Value) -> ToolOutput {
        self.tools.call(&self.ctx, tool, input).await
    }

    async fn ok(&self, tool: &str, input: Value) -> String {
        let out = self.call(tool, input.clone()).await;
        assert!(
            !out.is_error,
            "{tool} {input} failed unexpectedly:\n{}",
            out.text
        );
        out.text
    }

    async fn err(&self, tool: &str, input: Value) -> String {
        let out = self.call(tool, input.clone()).await;
        assert!(
            out.is_error,
            "{tool} {input} should have failed:\n{}",
            out.text
        );
        out.text
    }
}

// ---------------------------------------------------------------- registry

#[tokio::test]
async fn the_toolbox_lists_every_tool_with_an_object_schema() {
    let tools = Toolbox::standard();
    let specs = tools.specs();
    let names: Vec<_> = specs.iter().map(|s| s.name.as_str()).collect();
    assert_eq!(
        names,
        [
            "bash",
            "read_file",
            "write_file",
            "edit_file",
            "apply_patch",
            "list_dir",
            "search_files",
            "run_code"
        ]
    );
    for s in &specs {
        assert_eq!(s.input_schema["type"], "object", "{}", s.name);
        assert!(s.description.len() > 40, "{}", s.name);
    }
    let ro: Vec<_> = specs
        .iter()
        .filter(|s| s.read_only)
        .map(|s| s.name.as_str())
        .collect();
    assert_eq!(ro, ["read_file", "list_dir", "search_files"]);
}

#[tokio::test]
async fn malformed_arguments_are_errors_that_say_how_to_retry() {
    let env = Env::new().await;
    let t = env.err("read_file", json!({})).await;
    assert!(t.contains("missing field `path`"), "{t}");
    assert!(t.contains("schema"), "{t}");
    let t = env.err("read_file", json!({"path": 7})).await;
    assert!(t.contains("invalid type"), "{t}");
    let t = env
        .err("edit_file", json!({"path": "a", "old_string": "x"}))
        .await;
    assert!(t.contains("new_string"), "{t}");
    let t = env.err("write_file", json!("just a string")).await;
    assert!(t.contains("JSON object"), "{t}");
    let t = env
        .err("bash", json!({"command": "true", "timeout": "soon"}))
        .await;
    assert!(t.contains("invalid type"), "{t}");
    let t = env
        .err("bash", json!({"command": "true", "timeout": -1}))
        .await;
    assert!(t.contains("positive"), "{t}");
    let t = env.err("bash", json!({"cmd": "ls"})).await;
    assert!(t.contains("unknown field `cmd`"), "{t}");
    let t = env.err("bash", json!({})).await;
    assert!(t.contains("command"), "{t}");
    let t = env
        .err("run_code", json!({"language": "ruby", "code": "puts 1"}))
        .await;
    assert!(t.contains("python") && t.contains("typescript"), "{t}");
    let t = env.err("list_dir", json!({"depth": "deep"})).await;
    assert!(t.contains("invalid type"), "{t}");
    let t = env.err("no_such_tool", json!({})).await;
    assert!(t.contains("Available tools") && t.contains("bash"), "{t}");
}

// -------------------------------------------------------------------- bash

#[tokio::test]
async fn bash_keeps_stdout_stderr_and_exit_code_apart() {
    let env = Env::new().await;
    let out = env
        .call(
            "bash",
            json!({"command": "echo to-out; echo to-err >&2; exit_with() { return $1; }; exit_with 3"}),
        )
        .await;
    assert!(!out.is_error, "{}", out.text);
    assert!(out.text.contains("Exit code: 3"), "{}", out.text);
    assert!(
        out.text.contains("stdout:\nto-out\n") && out.text.contains("stderr:\nto-err\n"),
        "{}",
        out.text
    );
    let s = out.structured.unwrap();
    assert_eq!(s["exit_code"], 3);
    assert_eq!(s["timed_out"], false);

    // Output without a trailing newline is kept exactly.
    let t = env.ok("bash", json!({"command": "printf abc"})).await;
    assert!(t.contains("stdout:\nabc\nstderr: (empty)"), "{t}");
}

#[tokio::test]
async fn bash_state_persists_between_calls() {
    let env = Env::new().await;
    env.ok(
        "bash",
        json!({"command": "mkdir -p sub/dir && cd sub/dir && export GREETING=hello && greet() { echo \"$GREETING, $1\"; }"}),
    )
    .await;
    let t = env
        .ok(
            "bash",
            json!({"command": "pwd; greet world; echo $GREETING"}),
        )
        .await;
    assert!(
        t.contains("/workspace/sub/dir\nhello, world\nhello\n"),
        "{t}"
    );
    // A command reading stdin gets /dev/null and does not eat the wrapper.
    let t = env.ok("bash", json!({"command": "cat; echo after"})).await;
    assert!(t.contains("Exit code: 0") && t.contains("after"), "{t}");
    // A syntax error does not wedge the shell.
    let t = env.ok("bash", json!({"command": "if then fi '"})).await;
    assert!(t.contains("Exit code: 2"), "{t}");
    let t = env.ok("bash", json!({"command": "pwd"})).await;
    assert!(t.contains("/workspace/sub/dir"), "{t}");
}

#[tokio::test]
async fn bash_restart_resets_the_shell() {
    let env = Env::new().await;
    env.ok("bash", json!({"command": "cd /tmp; export X=1"}))
        .await;
    let t = env.ok("bash", json!({"restart": true})).await;
    assert!(t.contains("restarted"), "{t}");
    let t = env
        .ok("bash", json!({"command": "pwd; echo \"x=$X\""}))
        .await;
    assert!(t.contains("/workspace\nx=\n"), "{t}");
    // `exit` ends the shell; the next call gets a fresh one.
    let t = env.ok("bash", json!({"command": "cd /tmp; exit 4"})).await;
    assert!(t.contains("exited") && t.contains("status 4"), "{t}");
    let t = env.ok("bash", json!({"command": "pwd"})).await;
    assert!(t.contains("/workspace\n"), "{t}");
}

#[tokio::test]
async fn bash_timeout_kills_and_restarts_the_shell() {
    let env = Env::new().await;
    env.ok("bash", json!({"command": "cd /tmp; export Y=2"}))
        .await;
    let start = Instant::now();
    let out = env
        .call(
            "bash",
            json!({"command": "echo started; sleep 30 & sleep 30", "timeout": 1}),
        )
        .await;
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(out.is_error, "{}", out.text);
    assert!(out.text.contains("Timed out"), "{}", out.text);
    assert!(out.text.contains("fresh shell"), "{}", out.text);
    assert!(out.text.contains("started"), "{}", out.text);
    assert_eq!(out.structured.unwrap()["timed_out"], true);
    let t = env
        .ok(
            "bash",
            json!({"command": "pwd; echo \"y=$Y\"; pgrep -c sleep || true"}),
        )
        .await;
    assert!(t.contains("/workspace\ny=\n0\n"), "{t}");
}

#[tokio::test]
async fn bash_huge_output_is_cut_to_head_and_tail() {
    let env = Env::with_limits(Limits {
        output_head: 1000,
        output_tail: 1000,
        ..Limits::default()
    })
    .await;
    let out = env
        .call("bash", json!({"command": "seq 1 200000; seq 1 5000 >&2"}))
        .await;
    let t = &out.text;
    assert!(t.contains("stdout:\n1\n2\n3\n"), "{t}");
    assert!(t.contains("199999\n200000\n"), "{t}");
    assert!(
        t.contains("bytes (") && t.contains("lines) of output dropped"),
        "{t}"
    );
    assert!(t.len() < 6000, "{} bytes", t.len());
    let s = out.structured.unwrap();
    assert_eq!(s["stdout_bytes"], 1288895);
    assert!(s["stderr_dropped_bytes"].as_u64().unwrap() > 0);
    assert!(t.contains("Exit code: 0"), "{t}");
}

// --------------------------------------------------------------- read_file

#[tokio::test]
async fn read_file_numbers_lines_and_reads_ranges() {
    let env = Env::new().await;
    let body: String = (1..=50).map(|i| format!("line {i}\n")).collect();
    env.write("src/a.txt", &body);
    let t = env.ok("read_file", json!({"path": "src/a.txt"})).await;
    assert!(t.starts_with("     1\tline 1\n     2\tline 2\n"), "{t}");
    let t = env
        .ok(
            "read_file",
            json!({"path": "/workspace/src/a.txt", "offset": 10, "limit": 3}),
        )
        .await;
    assert_eq!(
        t,
        "    10\tline 10\n    11\tline 11\n    12\tline 12\n[showing lines 10-12 of 50; read on with offset 13]\n"
    );
    let t = env
        .err("read_file", json!({"path": "src/a.txt", "offset": 99}))
        .await;
    assert!(t.contains("50 lines"), "{t}");
    let t = env.err("read_file", json!({"path": "src/missing"})).await;
    assert!(t.contains("no such file"), "{t}");
    let t = env.err("read_file", json!({"path": "src"})).await;
    assert!(t.contains("is a directory"), "{t}");
}

#[tokio::test]
async fn read_file_refuses_binary_and_oversized_files() {
    let env = Env::with_limits(Limits {
        max_file_bytes: 1000,
        ..Limits::default()
    })
    .await;
    std::fs::write(env.path("blob.bin"), [0x7fu8, b'E', b'L', b'F', 0, 1, 2]).unwrap();
    let t = env.err("read_file", json!({"path": "blob.bin"})).await;
    assert!(t.contains("binary"), "{t}");
    std::fs::write(env.path("latin1.txt"), [b'c', b'a', b'f', 0xe9]).unwrap();
    let t = env.err("read_file", json!({"path": "latin1.txt"})).await;
    assert!(t.contains("binary") && t.contains("UTF-8"), "{t}");
    env.write("big.txt", &"x".repeat(5000));
    let t = env.err("read_file", json!({"path": "big.txt"})).await;
    assert!(t.contains("5000 bytes") && t.contains("bash"), "{t}");
}

// ------------------------------------------------------------ path escapes

#[tokio::test]
async fn file_tools_cannot_leave_the_workspace() {
    let env = Env::new().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret"), "host secret\n").unwrap();
    std::os::unix::fs::symlink("/etc", env.path("etc-link")).unwrap();
    std::os::unix::fs::symlink(outside.path(), env.path("host-link")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("secret"), env.path("secret-link")).unwrap();
    std::os::unix::fs::symlink("../..", env.path("up-link")).unwrap();
    env.write("inside/ok.txt", "fine\n");
    std::os::unix::fs::symlink("inside/ok.txt", env.path("good-link")).unwrap();

    for path in [
        "../x",
        "/etc/passwd",
        "/workspace/../etc/passwd",
        "a/../../x",
    ] {
        let t = env.err("read_file", json!({"path": path})).await;
        assert!(t.contains("workspace"), "{path}: {t}");
        let t = env
            .err("write_file", json!({"path": path, "content": "x"}))
            .await;
        assert!(t.contains("workspace"), "{path}: {t}");
    }
    for path in [
        "etc-link/passwd",
        "host-link/secret",
        "secret-link",
        "up-link/etc/passwd",
    ] {
        let t = env.err("read_file", json!({"path": path})).await;
        assert!(t.contains("outside the workspace"), "{path}: {t}");
        let t = env
            .err("write_file", json!({"path": path, "content": "pwned"}))
            .await;
        assert!(t.contains("outside the workspace"), "{path}: {t}");
        let t = env
            .err(
                "edit_file",
                json!({"path": path, "old_string": "host", "new_string": "x"}),
            )
            .await;
        assert!(t.contains("outside the workspace"), "{path}: {t}");
    }
    // Creating parent directories through a link that points out fails too.
    let t = env
        .err(
            "write_file",
            json!({"path": "host-link/new/dir/f", "content": "x"}),
        )
        .await;
    assert!(t.contains("outside the workspace"), "{t}");
    let t = env.err("list_dir", json!({"path": "host-link"})).await;
    assert!(t.contains("outside the workspace"), "{t}");
    let t = env
        .err(
            "search_files",
            json!({"pattern": "secret", "path": "host-link"}),
        )
        .await;
    assert!(t.contains("outside the workspace"), "{t}");
    // Searching the whole workspace does not follow the links out.
    let t = env
        .ok("search_files", json!({"pattern": "host secret"}))
        .await;
    assert!(t.contains("No matches"), "{t}");

    assert_eq!(
        std::fs::read_to_string(outside.path().join("secret")).unwrap(),
        "host secret\n"
    );
    assert_eq!(std::fs::read_dir(outside.path()).unwrap().count(), 1);
    // A link that stays inside is followed.
    let t = env.ok("read_file", json!({"path": "good-link"})).await;
    assert!(t.contains("fine"), "{t}");
}

// -------------------------------------------------------------- write_file

#[tokio::test]
async fn write_file_creates_parents_and_reports_bytes() {
    let env = Env::new().await;
    let t = env
        .ok(
            "write_file",
            json!({"path": "/workspace/a/b/c/hello.py", "content": "print('hi')\n"}),
        )
        .await;
    assert!(
        t.contains("Created /workspace/a/b/c/hello.py (12 bytes"),
        "{t}"
    );
    assert_eq!(
        std::fs::read_to_string(env.path("a/b/c/hello.py")).unwrap(),
        "print('hi')\n"
    );
    let t = env
        .ok(
            "write_file",
            json!({"path": "a/b/c/hello.py", "content": "x"}),
        )
        .await;
    assert!(
        t.contains("Overwrote") && t.contains("(1 byte, 1 line)"),
        "{t}"
    );
    // The sandbox sees what the host wrote.
    let t = env
        .ok("bash", json!({"command": "cat a/b/c/hello.py"}))
        .await;
    assert!(t.contains("stdout:\nx\n"), "{t}");
    let t = env
        .err("write_file", json!({"path": "a/b", "content": "x"}))
        .await;
    assert!(
        t.contains("not a regular file") || t.contains("directory"),
        "{t}"
    );
}

#[tokio::test]
async fn write_file_never_leaves_setuid_or_setgid_bits() {
    use std::os::unix::fs::PermissionsExt;
    let env = Env::new().await;
    env.write("s", "old");
    std::fs::set_permissions(env.path("s"), std::fs::Permissions::from_mode(0o6755)).unwrap();
    std::fs::create_dir(env.path("g")).unwrap();
    std::fs::set_permissions(env.path("g"), std::fs::Permissions::from_mode(0o2775)).unwrap();
    env.ok("write_file", json!({"path": "s", "content": "new"}))
        .await;
    env.ok("write_file", json!({"path": "g/sub/f", "content": "new"}))
        .await;
    for p in ["s", "g/sub", "g/sub/f"] {
        let mode = std::fs::metadata(env.path(p)).unwrap().permissions().mode();
        assert_eq!(mode & 0o6000, 0, "{p}: {mode:o}");
    }
}

// --------------------------------------------------------------- edit_file

#[tokio::test]
async fn edit_file_replaces_one_exact_match_and_shows_the_result() {
    let env = Env::new().await;
    env.write("m.py", "def f():\n    return 1\n\ndef g():\n    return 2\n");
    let out = env
        .call(
            "edit_file",
            json!({"path": "m.py", "old_string": "    return 2", "new_string": "    return 20"}),
        )
        .await;
    assert!(!out.is_error, "{}", out.text);
    assert!(out.text.contains("     5\t    return 20\n"), "{}", out.text);
    let diff = out.structured.unwrap()["diff"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(diff.contains("-    return 2\n+    return 20\n"), "{diff}");
    assert_eq!(
        std::fs::read_to_string(env.path("m.py")).unwrap(),
        "def f():\n    return 1\n\ndef g():\n    return 20\n"
    );
}

#[tokio::test]
async fn edit_file_explains_no_match_and_several_matches() {
    let env = Env::new().await;
    env.write(
        "c.rs",
        "let a = 1;\nlet b = 1;\nlet c = 1;\nfn total() {}\n",
    );
    let t = env
        .err(
            "edit_file",
            json!({"path": "c.rs", "old_string": "= 1;", "new_string": "= 2;"}),
        )
        .await;
    assert!(t.contains("3 times") && t.contains("lines 1, 2, 3"), "{t}");
    assert!(t.contains("replace_all"), "{t}");
    let t = env
        .err(
            "edit_file",
            json!({"path": "c.rs", "old_string": "fn totl() {}", "new_string": "x"}),
        )
        .await;
    assert!(
        t.contains("not found") && t.contains("closest line is 4"),
        "{t}"
    );
    let t = env
        .err(
            "edit_file",
            json!({"path": "c.rs", "old_string": "let  a = 1;", "new_string": "x"}),
        )
        .await;
    assert!(t.contains("whitespace"), "{t}");
    let t = env
        .err(
            "edit_file",
            json!({"path": "c.rs", "old_string": "", "new_string": "x"}),
        )
        .await;
    assert!(t.contains("empty"), "{t}");
    // Nothing was changed by the failed edits.
    assert_eq!(
        std::fs::read_to_string(env.path("c.rs")).unwrap(),
        "let a = 1;\nlet b = 1;\nlet c = 1;\nfn total() {}\n"
    );
    let out = env
        .call(
            "edit_file",
            json!({"path": "c.rs", "old_string": "= 1;", "new_string": "= 2;", "replace_all": true}),
        )
        .await;
    assert!(!out.is_error, "{}", out.text);
    assert!(out.text.contains("3 occurrences"), "{}", out.text);
    assert_eq!(
        std::fs::read_to_string(env.path("c.rs")).unwrap(),
        "let a = 2;\nlet b = 2;\nlet c = 2;\nfn total() {}\n"
    );
    std::fs::write(env.path("bin"), [1u8, 0, 2]).unwrap();
    let t = env
        .err(
            "edit_file",
            json!({"path": "bin", "old_string": "a", "new_string": "b"}),
        )
        .await;
    assert!(t.contains("binary"), "{t}");
}

// ---------------------------------------------------------------- list_dir

#[tokio::test]
async fn list_dir_honours_gitignore_and_depth() {
    let env = Env::new().await;
    env.write(".gitignore", "target/\n*.log\n/build\n");
    env.write("src/main.rs", "");
    env.write("src/deep/er/x.rs", "");
    env.write("src/build/keep.rs", "");
    env.write("target/debug/huge", "");
    env.write("build/out", "");
    env.write("run.log", "");
    env.write(".git/HEAD", "");
    env.write("README.md", "");
    let t = env.ok("list_dir", json!({})).await;
    assert_eq!(
        t,
        "/workspace/\n  .gitignore\n  README.md\n  src/\n    build/\n    deep/\n    main.rs\n"
    );
    let t = env.ok("list_dir", json!({"path": "src", "depth": 5})).await;
    assert!(t.contains("    er/\n      x.rs\n"), "{t}");
    // `/build` is anchored at the root: src/build stays visible from src.
    assert!(t.contains("  build/\n    keep.rs\n"), "{t}");
    let t = env.err("list_dir", json!({"path": "src/main.rs"})).await;
    assert!(t.contains("not a directory"), "{t}");
    let t = env.ok("list_dir", json!({"path": "src", "depth": 1})).await;
    assert!(!t.contains("er/"), "{t}");
    // A .gitignore above the listed directory still applies.
    env.write("src/deep/debug.log", "");
    let t = env.ok("list_dir", json!({"path": "src/deep"})).await;
    assert!(!t.contains("debug.log") && t.contains("er/"), "{t}");
}

#[tokio::test]
async fn list_dir_caps_long_listings() {
    let env = Env::new().await;
    for i in 0..30 {
        env.write(&format!("f{i:02}"), "");
    }
    let t = env.ok("list_dir", json!({"limit": 10})).await;
    assert_eq!(t.lines().filter(|l| l.starts_with("  f")).count(), 10);
    assert!(t.contains("[20 more entries not shown"), "{t}");
}

// ------------------------------------------------------------ search_files

#[tokio::test]
async fn search_files_with_glob_context_and_gitignore() {
    let env = Env::new().await;
    env.write(".gitignore", "ignored/\n");
    env.write(
        "src/a.rs",
        "fn one() {}\n// needle here\nfn two() {}\nfn three() {}\n",
    );
    env.write("src/b.py", "needle = 1\n");
    env.write("ignored/c.rs", "needle\n");
    std::fs::write(env.path("bin.dat"), b"needle\0\x01").unwrap();

    let t = env.ok("search_files", json!({"pattern": "needle"})).await;
    assert!(t.contains("src/a.rs:2:// needle here"), "{t}");
    assert!(t.contains("src/b.py:1:needle = 1"), "{t}");
    assert!(!t.contains("ignored/") && !t.contains("bin.dat"), "{t}");
    assert!(t.contains("2 matching lines in 2 files"), "{t}");

    let t = env
        .ok(
            "search_files",
            json!({"pattern": "needle", "glob": "*.rs", "context": 1}),
        )
        .await;
    assert_eq!(
        t,
        "src/a.rs-1-fn one() {}\nsrc/a.rs:2:// needle here\nsrc/a.rs-3-fn two() {}\n[1 matching line in 1 file]\n"
    );
    let t = env
        .ok(
            "search_files",
            json!({"pattern": "NEEDLE", "case_insensitive": true, "path": "src/b.py"}),
        )
        .await;
    assert!(t.starts_with("src/b.py:1:needle = 1\n"), "{t}");
    let t = env
        .ok(
            "search_files",
            json!({"pattern": "needle", "glob": "!*.py"}),
        )
        .await;
    assert!(t.contains("src/a.rs:2:") && !t.contains("b.py"), "{t}");
    let t = env.ok("search_files", json!({"pattern": "absent"})).await;
    assert!(t.contains("No matches"), "{t}");
    let t = env.err("search_files", json!({"pattern": "fn ("})).await;
    assert!(t.contains("Invalid regular expression"), "{t}");
}

#[tokio::test]
async fn search_files_caps_results_and_says_so() {
    let env = Env::new().await;
    let body: String = (0..500).map(|i| format!("match {i}\n")).collect();
    env.write("many.txt", &body);
    let out = env
        .call(
            "search_files",
            json!({"pattern": "match", "max_results": 5}),
        )
        .await;
    assert!(!out.is_error);
    assert_eq!(
        out.text
            .lines()
            .filter(|l| l.starts_with("many.txt:"))
            .count(),
        5
    );
    assert!(out.text.contains("results capped at 5"), "{}", out.text);
    assert_eq!(out.structured.unwrap()["capped"], true);
}

// ---------------------------------------------------------------- run_code

#[tokio::test]
async fn run_code_runs_python_javascript_and_typescript() {
    let env = Env::new().await;
    let out = env
        .call(
            "run_code",
            json!({"language": "python", "code": "import sys, os\nprint(os.getcwd())\nprint('oops', file=sys.stderr)\nsys.exit(3)"}),
        )
        .await;
    assert!(!out.is_error, "{}", out.text);
    assert!(out.text.contains("Exit code: 3"), "{}", out.text);
    assert!(out.text.contains("stdout:\n/workspace\n"), "{}", out.text);
    assert!(out.text.contains("stderr:\noops\n"), "{}", out.text);

    let t = env
        .ok(
            "run_code",
            json!({"language": "javascript", "code": "const fs = require('fs');\nfs.writeFileSync('from-js.txt', 'js');\nconsole.log([1,2,3].map(x => x * 2).join(','));"}),
        )
        .await;
    assert!(
        t.contains("Exit code: 0") && t.contains("stdout:\n2,4,6\n"),
        "{t}"
    );
    assert_eq!(
        std::fs::read_to_string(env.path("from-js.txt")).unwrap(),
        "js"
    );

    let t = env
        .ok(
            "run_code",
            json!({"language": "javascript", "code": "import { readFileSync } from 'node:fs';\nconsole.log(readFileSync('from-js.txt', 'utf8'));"}),
        )
        .await;
    assert!(t.contains("stdout:\njs\n"), "{t}");

    let ts = r#"
interface Shape { area(): number }
type Pair<T> = [T, T];
enum Color { Red, Green }
class Square implements Shape {
    constructor(private readonly side: number) {}
    area(): number { return this.side * this.side; }
}
function sum<T extends number>(xs: Pair<T>): number { return xs[0] + xs[1]; }
const s: Shape = new Square(3);
const c: Color = Color.Green;
console.log(s.area(), sum([2, 5] as Pair<number>), Color[c]);
"#;
    let t = env
        .ok("run_code", json!({"language": "typescript", "code": ts}))
        .await;
    assert!(t.contains("stdout:\n9 7 Green\n"), "{t}");

    let t = env
        .err(
            "run_code",
            json!({"language": "typescript", "code": "let x: = 1;"}),
        )
        .await;
    assert!(t.contains("transpiled") && t.contains("line 1"), "{t}");
}

#[tokio::test]
async fn run_code_times_out() {
    let env = Env::new().await;
    let start = Instant::now();
    let out = env
        .call(
            "run_code",
            json!({"language": "python", "code": "import time\nprint('begun', flush=True)\ntime.sleep(60)", "timeout": 1}),
        )
        .await;
    assert!(start.elapsed() < Duration::from_secs(10));
    assert!(out.is_error, "{}", out.text);
    assert!(out.text.contains("Timed out"), "{}", out.text);
    assert!(out.text.contains("begun"), "{}", out.text);
    assert_eq!(out.structured.unwrap()["timed_out"], true);
}

// ---------------------------------------------------------------- computer

/// The screenshot a computer call returned, decoded: (width, height).
fn screenshot_size(out: &ToolOutput) -> (u32, u32) {
    use base64::Engine;
    assert_eq!(out.images.len(), 1, "one image: {}", out.text);
    assert_eq!(out.images[0].media_type, "image/png");
    let data = out.images[0].data.clone();
    let png = base64::engine::general_purpose::STANDARD
        .decode(data)
        .unwrap();
    let decoder = png::Decoder::new(std::io::Cursor::new(png));
    let reader = decoder.read_info().expect("a PNG");
    let info = reader.info();
    (info.width, info.height)
}

impl Env {
    /// Where the X pointer is, in screen pixels, asked inside the sandbox.
    async fn pointer(&self) -> (u32, u32) {
        let out = self
            .ok(
                "bash",
                json!({"command": "xdotool getmouselocation --shell | head -2"}),
            )
            .await;
        let num = |k: &str| -> u32 {
            out.lines()
                .find_map(|l| l.trim().strip_prefix(k))
                .unwrap_or_else(|| panic!("no {k} in {out}"))
                .trim()
                .parse()
                .unwrap()
        };
        (num("X="), num("Y="))
    }
}

#[tokio::test]
async fn computer_screenshots_are_scaled_and_clicks_land_on_the_scaled_point() {
    // 1280x960 is 4:3, so the model works in XGA, 1024x768.
    let env = Env::with_display(1280, 960).await;
    let shot = env.call("computer", json!({"action": "screenshot"})).await;
    assert!(!shot.is_error, "{}", shot.text);
    assert_eq!(screenshot_size(&shot), (1024, 768));
    assert_eq!(
        shot.structured.as_ref().unwrap()["screen"],
        json!([1280, 960])
    );

    let click = env
        .call(
            "computer",
            json!({"action": "left_click", "coordinate": [512, 384]}),
        )
        .await;
    assert!(!click.is_error, "{}", click.text);
    assert_eq!(screenshot_size(&click), (1024, 768), "a screenshot follows");
    assert_eq!(env.pointer().await, (640, 480));
    let at = env
        .ok("computer", json!({"action": "cursor_position"}))
        .await;
    assert_eq!(at, "The mouse is at (512, 384).");

    env.ok(
        "computer",
        json!({"action": "mouse_move", "coordinate": [1023, 0]}),
    )
    .await;
    assert_eq!(env.pointer().await, (1279, 0));
    let off = env
        .err(
            "computer",
            json!({"action": "left_click", "coordinate": [1024, 10]}),
        )
        .await;
    assert!(
        off.contains("off the screen") && off.contains("0..1024"),
        "{off}"
    );
    let zoom = env
        .call(
            "computer",
            json!({"action": "zoom", "region": [0, 0, 256, 192]}),
        )
        .await;
    assert!(!zoom.is_error, "{}", zoom.text);
    // A quarter of the model's width is 320 screen pixels, shown at that size.
    assert_eq!(screenshot_size(&zoom), (320, 240));
}

/// Issue 32: a click where the pointer already is (a second click on the
/// same spot, or a first one at the screen's centre, where X starts it)
/// waited ~15 s for a motion event that never came. A click, with the
/// screenshot that follows it, takes ~0.3 s (1.3 s on a 2-core machine
/// running the server's tests too); the bound leaves room for that load.
#[tokio::test]
async fn a_click_where_the_pointer_already_is_takes_no_wait() {
    let env = Env::with_display(1024, 768).await;
    env.ok("computer", json!({"action": "screenshot"})).await;
    let start = env.pointer().await;
    for (what, at) in [
        ("where X put the pointer", [start.0 as i64, start.1 as i64]),
        ("somewhere new", [100, 100]),
        ("the same spot again", [100, 100]),
        ("the same spot, a double click", [100, 100]),
    ] {
        let action = if what.contains("double") {
            "double_click"
        } else {
            "left_click"
        };
        let t = std::time::Instant::now();
        let out = env
            .call("computer", json!({"action": action, "coordinate": at}))
            .await;
        let took = t.elapsed();
        assert!(!out.is_error, "{what}: {}", out.text);
        assert!(
            took < std::time::Duration::from_secs(3),
            "a click {what} took {took:?}"
        );
        assert_eq!(env.pointer().await, (at[0] as u32, at[1] as u32), "{what}");
    }
}

#[tokio::test]
async fn computer_at_its_own_size_types_and_presses_keys_into_a_window() {
    // XGA already: no scaling, the model's pixels are the screen's.
    let env = Env::with_display(1024, 768).await;
    // xev records what reaches its window.
    // Without the window manager, which would place and focus the window
    // in its own time (a race under load): X then gives the keyboard to the
    // window under the pointer, and the test sees only the tool's doing.
    env.ok(
        "bash",
        json!({"command": "pkill -x openbox; while pgrep -x openbox >/dev/null; do sleep 0.05; done; \
                           xev -geometry 400x300+0+0 > /tmp/xev.log 2>&1 &"}),
    )
    .await;
    // Where the window manager put it: click its middle to give it focus.
    let geometry = env
        .ok("bash", json!({"command": "w=$(xdotool search --sync --name 'Event Tester' | head -1); sleep 0.3; xdotool getwindowgeometry --shell $w | grep -E '^(X|Y|WIDTH|HEIGHT)='"}))
        .await;
    let num = |k: &str| -> i64 {
        geometry
            .lines()
            .find_map(|l| l.strip_prefix(k))
            .unwrap_or_else(|| panic!("no {k} in {geometry}"))
            .trim()
            .parse()
            .unwrap()
    };
    let (cx, cy) = (
        num("X=") + num("WIDTH=") / 2,
        num("Y=") + num("HEIGHT=") / 2,
    );
    let shot = env.call("computer", json!({"action": "screenshot"})).await;
    assert_eq!(screenshot_size(&shot), (1024, 768));
    env.ok(
        "computer",
        json!({"action": "left_click", "coordinate": [cx, cy]}),
    )
    .await;
    assert_eq!(env.pointer().await, (cx as u32, cy as u32));
    let long = "cordon types long texts in chunks, 0123456789 abcdefghij!";
    let typed = env
        .ok("computer", json!({"action": "type", "text": long}))
        .await;
    assert!(
        typed.starts_with(&format!("Typed {} characters.", long.len())),
        "{typed}"
    );
    env.ok(
        "computer",
        json!({"action": "key", "text": "ctrl+a Return"}),
    )
    .await;
    env.ok("computer", json!({"action": "scroll", "coordinate": [50, 50], "scroll_direction": "down", "scroll_amount": 2}))
        .await;
    // What reached the window, from xev's log (copied out: it is long).
    env.ok(
        "bash",
        json!({"command": "sleep 0.3; cp /tmp/xev.log /workspace/xev.log"}),
    )
    .await;
    let log = std::fs::read_to_string(env.path("xev.log")).unwrap();
    let mut pressed = String::new();
    let mut in_press = false;
    for line in log.lines() {
        if line.starts_with("KeyPress") {
            in_press = true;
        } else if line.starts_with("KeyRelease") {
            in_press = false;
        } else if in_press && let Some(rest) = line.split("XLookupString gives 1 bytes: (").nth(1) {
            let hex = rest.split(')').next().unwrap();
            pressed.push(char::from(u8::from_str_radix(hex, 16).unwrap()));
        }
    }
    // Every character arrived once, in order; then ctrl+a and Return.
    assert_eq!(pressed, format!("{long}\u{1}\r"), "{log}");
    // Wheel down is button 5, twice (each a press and a release).
    assert_eq!(log.matches("button 5,").count(), 4, "{log}");
    let bad = env.err("computer", json!({"action": "key"})).await;
    assert!(bad.contains("need `text`"), "{bad}");
    let nonsense = env.err("computer", json!({"action": "dance"})).await;
    assert!(
        nonsense.contains("Invalid arguments for `computer`"),
        "{nonsense}"
    );
}

#[tokio::test]
async fn computer_drives_an_xterm_under_the_window_manager() {
    let env = Env::with_display(1280, 800).await;
    // The window manager stays: this is the desktop a model sees. Wait
    // until it has framed the window (it sets _NET_FRAME_EXTENTS then), so
    // that a click lands on the terminal and not where it is about to be.
    env.ok(
        "bash",
        json!({"command": "xterm -geometry 80x24+40+40 -title cordon-term >/dev/null 2>&1 &\n\
                           w=$(xdotool search --sync --onlyvisible --name cordon-term | head -1)\n\
                           for i in $(seq 200); do xprop -id $w _NET_FRAME_EXTENTS | grep -q = && break; sleep 0.05; done"}),
    )
    .await;
    // 1280x800 is 16:10, so the model works in WXGA (1280x800): one to one.
    let shot = env.call("computer", json!({"action": "screenshot"})).await;
    assert_eq!(screenshot_size(&shot), (1280, 800));
    // Click inside the terminal so it has the keyboard whatever the window
    // manager decided, then type a command and run it.
    env.ok(
        "computer",
        json!({"action": "left_click", "coordinate": [200, 150]}),
    )
    .await;
    env.ok(
        "computer",
        json!({"action": "type", "text": "echo typed-in-$((6*7)) > /workspace/xterm.txt"}),
    )
    .await;
    env.ok("computer", json!({"action": "key", "text": "Return"}))
        .await;
    let path = env.path("xterm.txt");
    let deadline = Instant::now() + Duration::from_secs(20);
    while !path.exists() && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let written = std::fs::read_to_string(&path)
        .unwrap_or_else(|_| panic!("the shell in xterm never wrote {}", path.display()));
    assert_eq!(written, "typed-in-42\n");
}

#[tokio::test]
async fn computer_without_a_display_says_so() {
    let env = Env::new().await;
    let mut tools = Toolbox::standard();
    tools.register(cordon_tools::computer::Computer);
    let out = tools
        .call(&env.ctx, "computer", json!({"action": "screenshot"}))
        .await;
    assert!(out.is_error);
    assert!(out.text.contains("no usable display"), "{}", out.text);
}

// ---------------------------------------------------------------- apply_patch

/// Issue 35: one `git diff` adds, changes, renames (with a change) and
/// deletes files; the model is told what happened to each.
#[tokio::test]
async fn apply_patch_applies_a_multi_file_git_diff() {
    let env = Env::new().await;
    env.write(
        "src/lib.rs",
        "fn one() -> u32 {\n    1\n}\n\nfn two() -> u32 {\n    2\n}\n",
    );
    env.write("old_name.txt", "alpha\nbeta\ngamma\n");
    env.write("gone.txt", "bye\n");
    // Line numbers and counts as a model gets them: approximate.
    let patch = "\
diff --git a/src/lib.rs b/src/lib.rs
index 1111111..2222222 100644
--- a/src/lib.rs
+++ b/src/lib.rs
@@ -3,7 +3,7 @@
 fn two() -> u32 {
-    2
+    22
 }
diff --git a/notes/new.md b/notes/new.md
new file mode 100644
--- /dev/null
+++ b/notes/new.md
@@ -0,0 +1,2 @@
+# Notes
+written by a patch
diff --git a/old_name.txt b/new_name.txt
similarity index 80%
rename from old_name.txt
rename to new_name.txt
--- a/old_name.txt
+++ b/new_name.txt
@@ -1,3 +1,3 @@
 alpha
-beta
+BETA
 gamma
diff --git a/gone.txt b/gone.txt
deleted file mode 100644
--- a/gone.txt
+++ /dev/null
@@ -1 +0,0 @@
-bye
";
    let out = env.ok("apply_patch", json!({"patch": patch})).await;
    assert!(
        out.contains("updated /workspace/src/lib.rs (+1 -1)"),
        "{out}"
    );
    assert!(out.contains("added /workspace/notes/new.md"), "{out}");
    assert!(
        out.contains("moved /workspace/old_name.txt to /workspace/new_name.txt"),
        "{out}"
    );
    assert!(out.contains("deleted /workspace/gone.txt"), "{out}");
    let read = |p: &str| std::fs::read_to_string(env.path(p)).unwrap();
    assert_eq!(
        read("src/lib.rs"),
        "fn one() -> u32 {\n    1\n}\n\nfn two() -> u32 {\n    22\n}\n"
    );
    assert_eq!(read("notes/new.md"), "# Notes\nwritten by a patch\n");
    assert_eq!(read("new_name.txt"), "alpha\nBETA\ngamma\n");
    assert!(!env.path("old_name.txt").exists());
    assert!(!env.path("gone.txt").exists());
}

/// A hunk that does not apply changes nothing, in any file, and the error
/// names the file and the hunk.
#[tokio::test]
async fn apply_patch_is_all_or_nothing() {
    let env = Env::new().await;
    env.write("a.txt", "one\ntwo\nthree\n");
    env.write("b.txt", "four\nfive\nsix\n");
    let patch = "\
--- a/a.txt
+++ b/a.txt
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
--- a/b.txt
+++ b/b.txt
@@ -1,3 +1,3 @@
 four
-five
+FIVE
 six
@@ -8,1 +8,1 @@
-seven
+SEVEN
--- /dev/null
+++ b/c.txt
@@ -0,0 +1 @@
+new
";
    let err = env.err("apply_patch", json!({"patch": patch})).await;
    assert!(
        err.contains("/workspace/b.txt: hunk 2 of 2 does not apply"),
        "{err}"
    );
    assert!(err.contains("`seven`"), "{err}");
    assert!(err.contains("Nothing was changed"), "{err}");
    assert_eq!(
        std::fs::read_to_string(env.path("a.txt")).unwrap(),
        "one\ntwo\nthree\n"
    );
    assert_eq!(
        std::fs::read_to_string(env.path("b.txt")).unwrap(),
        "four\nfive\nsix\n"
    );
    assert!(!env.path("c.txt").exists());
}

/// Codex's format: add, update (found by its `@@` line), move, delete.
#[tokio::test]
async fn apply_patch_takes_codex_s_format() {
    let env = Env::new().await;
    env.write(
        "app.py",
        "def a():\n    return 1\n\ndef b():\n    return 1\n",
    );
    env.write("tmp.txt", "x\n");
    let patch = "\
*** Begin Patch
*** Add File: docs/readme.md
+hello
*** Update File: app.py
*** Move to: pkg/app.py
@@ def b():
-    return 1
+    return 2
*** Delete File: tmp.txt
*** End Patch
";
    let out = env.ok("apply_patch", json!({"patch": patch})).await;
    assert!(
        out.contains("moved /workspace/app.py to /workspace/pkg/app.py"),
        "{out}"
    );
    assert_eq!(
        std::fs::read_to_string(env.path("pkg/app.py")).unwrap(),
        "def a():\n    return 1\n\ndef b():\n    return 2\n"
    );
    assert_eq!(
        std::fs::read_to_string(env.path("docs/readme.md")).unwrap(),
        "hello\n"
    );
    assert!(!env.path("tmp.txt").exists() && !env.path("app.py").exists());
    let cut = env
        .err(
            "apply_patch",
            json!({"patch": "*** Begin Patch\n*** Add File: z\n+z\n"}),
        )
        .await;
    assert!(cut.contains("no `*** End Patch`"), "{cut}");
    assert!(!env.path("z").exists());
}

/// Attacks: a patch aimed out of the workspace by `..`, by an absolute
/// path, through a link the sandbox planted, or at `.git`, changes
/// nothing, inside or out.
#[tokio::test]
async fn apply_patch_stays_beneath_the_workspace() {
    let env = Env::new().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("victim.txt"), "host file\n").unwrap();
    std::os::unix::fs::symlink(outside.path(), env.path("out")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("victim.txt"), env.path("link.txt")).unwrap();
    env.write("ok.txt", "fine\n");
    let victim = outside.path().join("victim.txt");
    let host = victim.display().to_string();
    let aims = [
        "--- a/../victim.txt\n+++ b/../victim.txt\n@@ -1 +1 @@\n-host file\n+pwned\n".to_string(),
        format!("--- {host}\n+++ {host}\n@@ -1 +1 @@\n-host file\n+pwned\n"),
        "--- a/out/victim.txt\n+++ b/out/victim.txt\n@@ -1 +1 @@\n-host file\n+pwned\n".to_string(),
        "--- a/link.txt\n+++ b/link.txt\n@@ -1 +1 @@\n-host file\n+pwned\n".to_string(),
        "--- /dev/null\n+++ b/out/new.txt\n@@ -0,0 +1 @@\n+planted\n".to_string(),
        "*** Begin Patch\n*** Delete File: link.txt\n*** Update File: ok.txt\n*** Move to: out/moved.txt\n*** End Patch\n".to_string(),
    ];
    for patch in aims {
        // Each with a harmless change first: it must not land either.
        let patch = if patch.starts_with("***") {
            patch
        } else {
            format!("--- a/ok.txt\n+++ b/ok.txt\n@@ -1 +1 @@\n-fine\n+changed\n{patch}")
        };
        let out = env.call("apply_patch", json!({"patch": patch})).await;
        assert!(out.is_error, "{patch}\n{}", out.text);
        // Refused for where it points, not for its form.
        assert!(
            !out.text.contains("cannot be read"),
            "{patch}\n{}",
            out.text
        );
        eprintln!("{}", out.text);
        assert_eq!(
            std::fs::read_to_string(&victim).unwrap(),
            "host file\n",
            "{patch}"
        );
        assert!(!outside.path().join("new.txt").exists(), "{patch}");
        assert!(!outside.path().join("moved.txt").exists(), "{patch}");
        assert_eq!(
            std::fs::read_to_string(env.path("ok.txt")).unwrap(),
            "fine\n",
            "{patch}"
        );
        assert!(
            std::fs::symlink_metadata(env.path("link.txt")).is_ok(),
            "{patch}"
        );
    }
}
