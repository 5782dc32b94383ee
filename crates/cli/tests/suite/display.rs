//! A virtual display inside the sandbox (`cordon run --display`, and the
//! library's `SandboxConfig::display`): Xvfb and a window manager run in
//! the sandbox, X clients from the host's read-only system directories
//! draw on it, nothing listens on TCP, and it all ends with the sandbox.

use std::process::Command;

use crate::support;

use cordon_sandbox::{Display, ExecRequest, Sandbox, SandboxConfig};

fn run(ws: &std::path::Path, args: &[&str], script: &str) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .arg("run")
        .args(args)
        .arg("--workspace")
        .arg(ws)
        .args(["--", "sh", "-c", script])
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn cordon_run_display_gives_the_command_a_screen_of_that_size() {
    let ws = tempfile::tempdir().unwrap();
    let (code, out, err) = run(
        ws.path(),
        &["--display", "1024x768"],
        "echo \"DISPLAY=$DISPLAY\"; xdpyinfo | grep dimensions; xdotool getdisplaygeometry; \
         pgrep -x openbox >/dev/null && echo wm-running; \
         xwd -root -silent | wc -c; \
         xeyes & sleep 1; xdotool search --class xeyes | head -1 | grep -q . && echo xeyes-mapped; \
         cat /proc/net/tcp /proc/net/tcp6 | awk 'NR > 1 && $4 == \"0A\"' | wc -l",
    );
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines[0], "DISPLAY=:0", "{out}");
    assert!(lines[1].contains("1024x768 pixels"), "{out}");
    assert_eq!(lines[2], "1024 768");
    assert_eq!(lines[3], "wm-running", "{out}");
    // A screenshot of the whole screen: 1024 x 768 pixels of 4 bytes.
    let bytes: usize = lines[4].trim().parse().unwrap();
    assert!(bytes >= 1024 * 768 * 4, "{out}");
    assert_eq!(lines[5], "xeyes-mapped", "{out}");
    // Nothing listens on TCP, inside or (so) outside.
    assert_eq!(lines[6].trim(), "0", "{out}");
}

#[test]
fn a_bad_size_is_refused_in_one_line() {
    let ws = tempfile::tempdir().unwrap();
    let (code, _, err) = run(ws.path(), &["--display", "huge"], "true");
    assert_eq!(code, 125);
    assert!(err.contains("expected WIDTHxHEIGHT"), "{err}");
}

/// Host processes whose command line starts with `Xvfb :0 -screen 0 W`.
fn xvfbs(width: u32) -> usize {
    let want = ["Xvfb", ":0", "-screen", "0", &format!("{width}x")].join("\0");
    std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter(|e| {
            std::fs::read(e.path().join("cmdline"))
                .is_ok_and(|c| String::from_utf8_lossy(&c).starts_with(&want))
        })
        .count()
}

#[tokio::test]
async fn a_session_keeps_its_display_across_execs_and_takes_it_down_when_closed() {
    let ws = tempfile::tempdir().unwrap();
    let mut config = SandboxConfig::new(ws.path());
    // cordon itself serves as the sandbox's supervisor.
    config.supervisor = Some(env!("CARGO_BIN_EXE_cordon").into());
    // An unusual width, to find this session's Xvfb among the host's processes.
    config.display = Some(Display {
        width: 1031,
        height: 640,
    });
    let sb = Sandbox::create(config).await.unwrap();
    for _ in 0..2 {
        let out = sb
            .exec(ExecRequest::shell("xdotool getdisplaygeometry"))
            .await
            .unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout), "1031 640\n");
    }
    assert_eq!(xvfbs(1031), 1);
    sb.close().await;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while xvfbs(1031) > 0 {
        assert!(
            std::time::Instant::now() < deadline,
            "Xvfb outlived its sandbox"
        );
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
}

/// `cordon exec` with a display, against the scripted model: the model
/// gets the computer tool, asks for a screenshot and receives it as an
/// image (a block for Anthropic, an image part for OpenAI-compatible
/// servers), then clicks and types.
#[test]
fn the_agent_sees_the_screen_as_an_image_and_clicks_and_types() {
    use cordon_testkit::{Scenario, ScriptedServer, Turn};
    use serde_json::json;
    for openai in [false, true] {
        let image_marker = if openai {
            "data:image/png;base64,"
        } else {
            "\"media_type\":\"image/png\""
        };
        let server = ScriptedServer::start(
            Scenario::new()
                .turn(Turn::text("Looking.").with_tool_call(
                    "s1",
                    "computer",
                    json!({"action": "screenshot"}),
                ))
                .turn(
                    Turn::text("Clicking.")
                        .with_tool_call(
                            "c1",
                            "computer",
                            json!({"action": "left_click", "coordinate": [10, 10]}),
                        )
                        .expect_tool_results(["s1"])
                        .expect_contains(image_marker),
                )
                .turn(
                    Turn::text("Typing.")
                        .with_tool_call(
                            "t1",
                            "computer",
                            json!({"action": "type", "text": "hello"}),
                        )
                        .expect_tool_results(["c1"])
                        .expect_contains(image_marker),
                )
                .turn(
                    Turn::text("Done.")
                        .expect_tool_results(["t1"])
                        .expect_contains("Typed 5 characters."),
                ),
        );
        let ws = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let out = support::exec_against(
            &server,
            openai,
            ws.path(),
            home.path(),
            &[
                "--json",
                "--set",
                "sandbox.display=1024x768",
                "use the screen",
            ],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        server.assert_finished();
        assert!(
            server.requests()[0].raw_body.contains("\"computer\""),
            "the computer tool is offered"
        );
        // The screenshot is in the request as an image, not in the events.
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("iVBORw0KGgo"), "no base64 in the events");
    }
}

#[test]
fn without_a_display_the_computer_tool_is_not_offered() {
    use cordon_testkit::{Scenario, ScriptedServer, Turn};
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("Nothing to see.")));
    let ws = tempfile::tempdir().unwrap();
    let home = tempfile::tempdir().unwrap();
    let out = support::exec_against(&server, false, ws.path(), home.path(), &["look"]);
    assert_eq!(out.status.code(), Some(0));
    assert!(!server.requests()[0].raw_body.contains("\"computer\""));
}
