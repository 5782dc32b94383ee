//! Every setting takes effect in every front end it applies to.
//!
//! A table: each row is one setting (written in the user's configuration
//! file, as a user would), the front ends it applies to, and what shows it
//! took effect: a probe command's output inside the sandbox, or the request
//! the model server received. Each front end is driven as a user drives it:
//! `cordon run`, `cordon shell` (on a pseudo-terminal), `cordon exec`,
//! `cordon chat` and bare `cordon` (in tmux), `cordon mcp` (JSON-RPC on
//! stdio) and `cordon serve` (an agent job). The sandbox's probe runs
//! through the front end's own path: a command for run and shell, the
//! model's bash tool for the agent front ends, the bash tool for MCP.
//!
//! Not in the table, and why: `compact_threshold` and `context_window`
//! change when compaction happens (tests/exec.rs and the agent's tests
//! drive them); `vm.accel` picks QEMU's accelerator, which the microvm
//! tests assert (`cordon doctor`, tests/run.rs); `sandbox.network`,
//! `sandbox.display` and `workspace` are job options or the server's own
//! for `cordon serve`, not settings, and a job's workspace is no repository
//! for `sandbox.protect_control_files`.

use crate::support;

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use cordon_testkit::{RecordedRequest, Scenario, ScriptedServer, Turn};
use serde_json::{Value, json};
use support::tmux::Tmux;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Front {
    Run,
    Shell,
    Exec,
    Chat,
    Bare,
    Mcp,
    Serve,
}

use Front::*;

/// What shows that a row's setting took effect.
enum Shows {
    /// The probe's output satisfies this.
    Output(fn(&str) -> bool),
    /// Every request to the model server satisfies this.
    Request(fn(&RecordedRequest) -> bool),
    /// The front end fails, naming this.
    Fails(&'static str),
    /// The terminal UI's screen shows this.
    Screen(&'static str),
}

/// The user's own configuration for a row: `{server}` is the scripted
/// model server, `{other}` a directory other than the project.
struct Row {
    config: &'static str,
    probe: &'static str,
    shows: Shows,
    fronts: &'static [Front],
}

const ALL: &[Front] = &[Run, Shell, Exec, Chat, Bare, Mcp, Serve];
const SANDBOX_ONLY: &[Front] = &[Run, Shell, Exec, Chat, Bare, Mcp];
const AGENTS: &[Front] = &[Exec, Chat, Bare, Serve];

/// Marks a probe as having run, whatever it printed.
const RAN: &str = "probe-ran";

/// One world per row and front end: a project, another directory, a home.
struct World {
    _dir: tempfile::TempDir,
    ws: PathBuf,
    other: PathBuf,
    home: PathBuf,
}

impl World {
    fn new() -> World {
        let dir = tempfile::tempdir().unwrap();
        let (ws, other, home) = (
            dir.path().join("project"),
            dir.path().join("other"),
            dir.path().join("home"),
        );
        for d in [&ws, &other, &home] {
            std::fs::create_dir(d).unwrap();
        }
        std::fs::write(other.join("other-marker"), "").unwrap();
        // A repository, as most projects are (for sandbox.protect_control_files).
        let init = Command::new("git")
            .args(["init", "-q"])
            .current_dir(&ws)
            .env("HOME", &home)
            .output()
            .unwrap();
        assert!(init.status.success(), "{init:?}");
        World {
            _dir: dir,
            ws,
            other,
            home,
        }
    }

    fn configure(&self, row: &Row, server: &str) {
        let dir = self.home.join("config/cordon");
        std::fs::create_dir_all(&dir).unwrap();
        let text = row
            .config
            .replace("{server}", server)
            .replace("{other}", &self.other.display().to_string());
        let key = if text.contains("api_key") {
            ""
        } else {
            "anthropic_api_key = \"sk-user-config-key-0000\"\n"
        };
        let base = if text.contains("base_url") {
            String::new()
        } else {
            format!("anthropic_base_url = \"{server}\"\n")
        };
        // Top-level keys first: a table header would swallow them.
        std::fs::write(dir.join("config.toml"), format!("{key}{base}{text}\n")).unwrap();
    }

    fn cordon(&self) -> Command {
        self.command(env!("CARGO_BIN_EXE_cordon"))
    }

    /// `program` in the project, with this world's home and nothing else.
    fn command(&self, program: &str) -> Command {
        let mut c = Command::new(program);
        c.current_dir(&self.ws)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", &self.home)
            .env("XDG_CONFIG_HOME", self.home.join("config"))
            .env("XDG_DATA_HOME", self.home.join("data"));
        c
    }
}

/// What a front end run showed: output (the probe's, or cordon's when it
/// failed), the model server's requests, and the screen for the UI.
struct Seen {
    output: String,
    failed: bool,
    requests: Vec<RecordedRequest>,
    screen: String,
}

fn probe_script(row: &Row) -> String {
    format!("{}; echo {RAN}", row.probe)
}

/// A model that runs the row's probe once and answers.
fn model(script: &str) -> ScriptedServer {
    ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Probing.").with_tool_call("p1", "bash", json!({ "command": script })))
            .turn(Turn::text("Probe done.").expect_tool_results(["p1"])),
    )
}

fn tool_result(requests: &[RecordedRequest]) -> String {
    requests
        .iter()
        .rev()
        .find_map(|r| {
            r.body["messages"]
                .as_array()
                .and_then(|m| m.last())
                .map(|m| m["content"].to_string())
        })
        .unwrap_or_default()
}

fn seen_process(out: std::process::Output) -> Seen {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Seen {
        failed: !out.status.success(),
        output: text,
        requests: Vec::new(),
        screen: String::new(),
    }
}

fn observe(row: &Row, front: Front) -> Seen {
    let w = World::new();
    let script = probe_script(row);
    let server = model(&script);
    w.configure(row, &server.url());
    let mut seen = match front {
        Run => seen_process(
            w.cordon()
                .args(["run", "--", "bash", "-c", &script])
                .output()
                .unwrap(),
        ),
        Shell => {
            // `cordon shell` wants a terminal: script(1) gives it one.
            let cordon = env!("CARGO_BIN_EXE_cordon");
            let quoted = script.replace('\'', r"'\''");
            seen_process(
                w.command("script")
                    .args([
                        "-qec",
                        &format!("{cordon} shell -- bash -c '{quoted}'"),
                        "/dev/null",
                    ])
                    .env("TERM", "xterm-256color")
                    .stdin(Stdio::null())
                    .output()
                    .unwrap_or_else(|e| panic!("script(1): {e}")),
            )
        }
        Exec => {
            let mut s = seen_process(
                w.cordon()
                    .args(["exec", "--json", "probe"])
                    .output()
                    .unwrap(),
            );
            if !s.failed {
                s.output = tool_result(&server.requests());
            }
            s
        }
        Chat | Bare => {
            let sub = if front == Chat { " chat" } else { "" };
            let cmd = format!(
                "cd {ws} && env -i PATH=/usr/bin:/bin TERM=xterm-256color HOME={home} \
                 XDG_CONFIG_HOME={home}/config XDG_DATA_HOME={home}/data {bin}{sub}; \
                 echo EXIT=$?; sleep 600",
                ws = w.ws.display(),
                home = w.home.display(),
                bin = env!("CARGO_BIN_EXE_cordon"),
            );
            let tmux = Tmux::start("settings", &cmd, 120, 40);
            tmux.wait_until("the sandbox", |s| {
                s.contains("sandbox ready") || s.contains("EXIT=")
            });
            tmux.type_text("probe");
            tmux.keys(&["Enter"]);
            let screen = if matches!(row.shows, Shows::Screen(_)) {
                let Shows::Screen(what) = row.shows else {
                    unreachable!()
                };
                tmux.wait_for(what)
            } else {
                tmux.wait_until("the answer", |s| {
                    s.contains("Probe done.") || s.contains("cannot") || s.contains("EXIT=")
                })
            };
            Seen {
                failed: !screen.contains("Probe done.") && !matches!(row.shows, Shows::Screen(_)),
                output: if matches!(row.shows, Shows::Fails(_)) {
                    screen.clone()
                } else {
                    tool_result(&server.requests())
                },
                requests: Vec::new(),
                screen,
            }
        }
        Mcp => mcp_probe(&w, &script),
        Serve => serve_probe(&w),
    };
    seen.requests = server.requests();
    seen
}

/// `cordon mcp` on stdio: initialize, then one bash call.
fn mcp_probe(w: &World, script: &str) -> Seen {
    let mut child = w
        .cordon()
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    for msg in [
        json!({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "settings-test", "version": "1"}}}),
        json!({"jsonrpc": "2.0", "method": "notifications/initialized"}),
        json!({"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "bash", "arguments": {"command": script}}}),
    ] {
        writeln!(stdin, "{msg}").unwrap();
    }
    let mut output = String::new();
    let mut failed = true;
    for line in BufReader::new(child.stdout.take().unwrap()).lines() {
        let Ok(line) = line else { break };
        let v: Value = serde_json::from_str(&line).unwrap_or_default();
        if v["id"] == 2 {
            failed = v["result"]["isError"] == true || v.get("error").is_some();
            output = v.to_string();
            break;
        }
    }
    drop(stdin);
    let out = child.wait_with_output().unwrap();
    if output.is_empty() {
        output = String::from_utf8_lossy(&out.stderr).into_owned();
    }
    Seen {
        output,
        failed,
        requests: Vec::new(),
        screen: String::new(),
    }
}

/// `cordon serve` with the configuration, and one agent job.
fn serve_probe(w: &World) -> Seen {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let mut child = w
        .cordon()
        .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let mut said = String::new();
    loop {
        match lines.next() {
            Some(Ok(line)) => {
                said.push_str(&line);
                said.push('\n');
                if line.contains("serving on") {
                    break;
                }
            }
            _ => {
                let _ = child.wait();
                return Seen {
                    output: said,
                    failed: true,
                    requests: Vec::new(),
                    screen: String::new(),
                };
            }
        }
    }
    std::thread::spawn(move || for _ in lines {});
    let base = format!("http://127.0.0.1:{port}");
    let token = String::from_utf8(
        w.cordon()
            .args(["token", "create", "--tenant", "t"])
            .output()
            .unwrap()
            .stdout,
    )
    .unwrap()
    .trim()
    .to_string();
    let done = support::run_agent_job(&base, &token, "probe", Duration::from_secs(90));
    let _ = child.kill();
    let _ = child.wait();
    // Killed, it left its workspaces' volumes mounted.
    let _ = cordon_sandbox::volume::release(&w.home);
    Seen {
        failed: done["state"] != "succeeded",
        output: done.to_string(),
        requests: Vec::new(),
        screen: String::new(),
    }
}

/// Runs a row through each of its front ends; a failure names both.
fn check(name: &str, row: Row) {
    for &front in row.fronts {
        let seen = observe(&row, front);
        let mut output = seen.output.clone();
        if front == Serve && !seen.failed {
            output = tool_result(&seen.requests);
        }
        let ok = match &row.shows {
            // The probe ran to its end (cordon run may still exit 122 after an OOM kill).
            Shows::Output(pred) => output.contains(RAN) && pred(&output),
            Shows::Request(pred) => !seen.requests.is_empty() && seen.requests.iter().all(pred),
            Shows::Fails(what) => seen.failed && output.contains(what),
            Shows::Screen(what) => seen.screen.contains(what),
        };
        assert!(
            ok,
            "{name} did not take effect in {front:?}: failed={} output:\n{output}\nscreen:\n{}",
            seen.failed, seen.screen
        );
    }
}

fn host_kernel() -> String {
    String::from_utf8(Command::new("uname").arg("-r").output().unwrap().stdout)
        .unwrap()
        .trim()
        .to_string()
}

/// The count a fork probe printed: `forks N`.
fn forks(out: &str) -> Option<u32> {
    let at = out.find("forks ")? + "forks ".len();
    out[at..]
        .chars()
        .take_while(char::is_ascii_digit)
        .collect::<String>()
        .parse()
        .ok()
}

const FORK_PROBE: &str = "python3 -c \"\nimport os, time\nn = 0\ntry:\n    while n < 100:\n        if os.fork() == 0:\n            time.sleep(3)\n            os._exit(0)\n        n += 1\nexcept OSError:\n    pass\nprint('forks', n)\n\"";

/// Allocates 300 MiB; the marker is split so that a shell's report of the
/// killed command line does not contain it.
const MEMORY_PROBE: &str =
    "python3 -c 'b = bytearray(300 << 20); print(\"allocated-\" + \"300M\")' 2>&1";

#[test]
fn sandbox_memory() {
    check(
        "sandbox.memory",
        Row {
            config: "[sandbox]\nmemory = \"64M\"",
            probe: MEMORY_PROBE,
            shows: Shows::Output(|o| !o.contains("allocated-300M")),
            fronts: ALL,
        },
    );
}

#[test]
fn sandbox_pids() {
    check(
        "sandbox.pids",
        Row {
            config: "[sandbox]\npids = 24",
            probe: FORK_PROBE,
            shows: Shows::Output(|o| forks(o).is_some_and(|n| n < 30)),
            fronts: ALL,
        },
    );
}

#[test]
fn sandbox_network() {
    check(
        "sandbox.network",
        Row {
            config: "[sandbox]\nnetwork = \"loopback\"",
            probe: "python3 -c \"import socket; s = socket.socket(); s.bind(('127.0.0.1', 0)); \
                    s.listen(); socket.create_connection(s.getsockname()); print('loopback-up')\" 2>&1",
            shows: Shows::Output(|o| o.contains("loopback-up")),
            fronts: SANDBOX_ONLY,
        },
    );
}

#[test]
fn sandbox_display() {
    check(
        "sandbox.display",
        Row {
            config: "[sandbox]\ndisplay = \"800x600\"",
            probe: "xdpyinfo -display \"$DISPLAY\" | grep dimensions",
            shows: Shows::Output(|o| o.contains("800x600 pixels")),
            fronts: SANDBOX_ONLY,
        },
    );
}

#[test]
fn workspace() {
    check(
        "workspace",
        Row {
            config: "workspace = \"{other}\"",
            probe: "ls /workspace",
            shows: Shows::Output(|o| o.contains("other-marker")),
            fronts: SANDBOX_ONLY,
        },
    );
}

#[test]
fn sandbox_backend_and_cpus() {
    static HOST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    HOST.get_or_init(host_kernel);
    check(
        "sandbox.backend and sandbox.cpus",
        Row {
            config: "[sandbox]\nbackend = \"microvm\"\ncpus = 2\n[vm]\naccel = \"tcg\"",
            probe: "echo kernel=$(uname -r) cpus=$(nproc)",
            shows: Shows::Output(|o| {
                !o.contains(&format!("kernel={}", HOST.get().unwrap())) && o.contains("cpus=2")
            }),
            fronts: ALL,
        },
    );
}

#[test]
fn vm_paths() {
    for (key, path) in [
        ("kernel", "/nonexistent/cordon-test-vmlinuz"),
        ("qemu", "/nonexistent/cordon-test-qemu"),
    ] {
        let config: &'static str = Box::leak(
            format!("[sandbox]\nbackend = \"microvm\"\n[vm]\n{key} = \"{path}\"").into_boxed_str(),
        );
        check(
            &format!("vm.{key}"),
            Row {
                config,
                probe: "true",
                shows: Shows::Fails(path),
                fronts: &[Run, Exec, Mcp, Serve],
            },
        );
    }
}

#[test]
fn sandbox_protect_control_files() {
    check(
        "sandbox.protect_control_files",
        Row {
            config: "[sandbox]\nprotect_control_files = false",
            probe: "git config core.fsmonitor true && echo wrote-git-config",
            shows: Shows::Output(|o| o.contains("wrote-git-config")),
            fronts: SANDBOX_ONLY,
        },
    );
}

#[test]
fn model_and_max_tokens() {
    check(
        "model and max_tokens",
        Row {
            config: "model = \"row-model\"\nmax_tokens = 1234",
            probe: "true",
            shows: Shows::Request(|r| {
                r.body["model"] == "row-model" && r.body["max_tokens"] == 1234
            }),
            fronts: AGENTS,
        },
    );
}

#[test]
fn anthropic_key_and_base_url() {
    check(
        "anthropic_api_key and anthropic_base_url",
        Row {
            config: "anthropic_api_key = \"sk-ant-from-config-9999\"\nanthropic_base_url = \"{server}\"",
            probe: "true",
            shows: Shows::Request(|r| r.header("x-api-key") == Some("sk-ant-from-config-9999")),
            fronts: AGENTS,
        },
    );
}

#[test]
fn openai_provider() {
    check(
        "provider, openai_base_url and openai_api_key",
        Row {
            config: "provider = \"openai\"\nopenai_base_url = \"{server}/v1\"\n\
                     openai_api_key = \"sk-openai-from-config\"",
            probe: "true",
            shows: Shows::Request(|r| {
                r.path.ends_with("/chat/completions")
                    && r.header("authorization") == Some("Bearer sk-openai-from-config")
            }),
            fronts: AGENTS,
        },
    );
}

#[test]
fn approval() {
    check(
        "approval",
        Row {
            config: "approval = \"ask\"",
            probe: "true",
            shows: Shows::Screen("waiting for approval"),
            fronts: &[Chat, Bare],
        },
    );
}

/// The project's own file (trusted or not) sets what it may: a tightening
/// of the user's limit applies to every front end too.
#[test]
fn a_project_file_tightens_the_users_memory_everywhere() {
    // Covered row by row above for the user's file; the project layer is
    // read by the same Settings::load, so one front end of each kind.
    for front in [Run, Exec, Mcp] {
        let w = World::new();
        let script = format!("{MEMORY_PROBE}; echo {RAN}");
        let server = model(&script);
        let user = Row {
            config: "[sandbox]\nmemory = \"1G\"",
            probe: "",
            shows: Shows::Fails(""),
            fronts: &[],
        };
        w.configure(&user, &server.url());
        std::fs::create_dir_all(w.ws.join(".cordon")).unwrap();
        std::fs::write(
            w.ws.join(".cordon/config.toml"),
            "[sandbox]\nmemory = \"64M\"\n",
        )
        .unwrap();
        let out = match front {
            Run => {
                seen_process(
                    w.cordon()
                        .args(["run", "--", "bash", "-c", &script])
                        .output()
                        .unwrap(),
                )
                .output
            }
            Exec => {
                let o = w.cordon().args(["exec", "probe"]).output().unwrap();
                assert!(o.status.success(), "{o:?}");
                tool_result(&server.requests())
            }
            _ => mcp_probe(&w, &script).output,
        };
        assert!(
            out.contains(RAN) && !out.contains("allocated-300M"),
            "{front:?}: {out}"
        );
    }
}
