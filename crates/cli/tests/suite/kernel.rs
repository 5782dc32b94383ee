//! `run_code` for Python in the conversation's kernel, through `cordon
//! exec` against the scripted model over both protocols: a variable and an
//! import survive between calls, the last expression's value comes back, a
//! matplotlib plot reaches the model as an image, and a timeout interrupts
//! the code while the kernel keeps its state.

use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::json;

use crate::support;

use support::lab_installed;

fn run_code(code: &str) -> serde_json::Value {
    json!({"language": "python", "code": code})
}

#[test]
fn python_state_plots_and_timeouts_live_in_the_kernel() {
    if !lab_installed() {
        return;
    }
    for openai in [false, true] {
        let image_marker = if openai {
            "data:image/png;base64,"
        } else {
            "\"media_type\":\"image/png\""
        };
        let server = ScriptedServer::start(
            Scenario::new()
                .turn(Turn::text("Setting up.").with_tool_call(
                    "k1",
                    "run_code",
                    run_code("import math\nx = 21\nprint('set')"),
                ))
                .turn(
                    Turn::text("Using it.")
                        .with_tool_call("k2", "run_code", run_code("x * 2"))
                        .expect_tool_results(["k1"])
                        .expect_contains("Ran in the Python kernel")
                        .expect_contains("set"),
                )
                .turn(
                    Turn::text("Plotting.")
                        .with_tool_call(
                            "k3",
                            "run_code",
                            run_code(
                                "import matplotlib.pyplot as plt\nplt.plot([1, 4, 2])\nplt.show()",
                            ),
                        )
                        .expect_tool_results(["k2"])
                        .expect_contains("result: 42"),
                )
                .turn(
                    Turn::text("Looping.")
                        .with_tool_call(
                            "k4",
                            "run_code",
                            json!({"language": "python", "code": "while True: pass", "timeout": 2}),
                        )
                        .expect_tool_results(["k3"])
                        .expect_contains(image_marker),
                )
                .turn(
                    Turn::text("Checking.")
                        .with_tool_call("k5", "run_code", run_code("print(x, math.pi > 3)"))
                        .expect_tool_results(["k4"])
                        .expect_contains("the kernel was interrupted")
                        .expect_contains("KeyboardInterrupt"),
                )
                .turn(
                    Turn::text("Done.")
                        .expect_tool_results(["k5"])
                        .expect_contains("21 True"),
                ),
        );
        let ws = tempfile::tempdir().unwrap();
        let home = tempfile::tempdir().unwrap();
        let out = support::exec_against(
            &server,
            openai,
            ws.path(),
            home.path(),
            &["--json", "compute"],
        );
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        server.assert_finished();
        // The plot is in the request as an image, not in the events.
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(!stdout.contains("iVBORw0KGgo"), "no base64 in the events");
    }
}
