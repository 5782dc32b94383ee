//! Scenarios load from TOML and JSON, bad ones are refused, and the binary serves one.

use crate::common;

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Command, Stdio};

use common::*;
use cordon_testkit::{Block, Error, Fault, Scenario, StopReason, Turn};
use serde_json::json;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

#[test]
fn the_documented_toml_example_loads() {
    let scenario = Scenario::from_file(fixture("example.toml")).unwrap();
    assert!(scenario.check_tool_results);
    assert_eq!(scenario.turns.len(), 2);
    let first = &scenario.turns[0];
    assert_eq!(
        first.content[2],
        Block::ToolUse {
            id: "toolu_1".into(),
            name: "write_file".into(),
            input: json!({"path": "hello.py", "content": "print('hi')"}),
        }
    );
    assert_eq!(first.effective_stop_reason(), StopReason::ToolUse);
    assert_eq!(first.usage.cache_read_input_tokens, 1000);
    assert_eq!(
        first.faults,
        vec![Fault::http(529).retry_after(1), Fault::stream_error(3)]
    );
    assert_eq!(scenario.turns[1].expect_tool_results, ["toolu_1"]);
    assert_eq!(scenario.turns[1].expect_max_input_chars, Some(50_000));
}

#[test]
fn json_and_rust_forms_are_the_same_scenario() {
    let loaded = Scenario::from_file(fixture("example.json")).unwrap();
    let mut built = Scenario::new()
        .turn(
            Turn::text("Listing.")
                .with_tool_call("toolu_1", "bash", json!({"command": "ls"}))
                .usage(cordon_testkit::Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    ..Default::default()
                })
                .fault(Fault::http(429).retry_after(2).times(2)),
        )
        .turn(
            Turn::text("Two files.")
                .expect_tool_results(["toolu_1"])
                .fault(Fault::chunk_delay_ms(5)),
        );
    built.chunk_chars = 4;
    assert_eq!(loaded, built);
    // And a scenario survives a round trip through its own serialisation.
    let text = serde_json::to_string(&built).unwrap();
    assert_eq!(Scenario::from_json_str(&text).unwrap(), built);
}

#[test]
fn bad_scenarios_are_refused() {
    let typo = r#"{"turns": [{"contents": []}]}"#;
    assert!(matches!(Scenario::from_json_str(typo), Err(Error::Json(_))));
    let two_kinds = r#"{"turns": [{"faults": [{"http_status": 429, "disconnect_after": 2}]}]}"#;
    assert!(matches!(
        Scenario::from_json_str(two_kinds),
        Err(Error::Invalid(_))
    ));
    let no_effect = "[[turns]]\nfaults = [{ times = 2 }]\n";
    assert!(matches!(
        Scenario::from_toml_str(no_effect),
        Err(Error::Invalid(_))
    ));
    let retry_alone = r#"{"turns": [{"faults": [{"retry_after": 2}]}]}"#;
    assert!(matches!(
        Scenario::from_json_str(retry_alone),
        Err(Error::Invalid(_))
    ));
    let missing = Scenario::from_file(fixture("absent.json"));
    assert!(matches!(missing, Err(Error::Read { .. })));
}

/// Kills the child even when an assertion fails, so no server outlives the test.
struct Child(std::process::Child);

impl Drop for Child {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[tokio::test]
async fn the_binary_serves_a_scenario_file() {
    let mut child = Child(
        Command::new(env!("CARGO_BIN_EXE_cordon-testkit-server"))
            .arg("--scenario")
            .arg(fixture("example.json"))
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("the server binary starts"),
    );
    let mut line = String::new();
    BufReader::new(child.0.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    let url = line.trim();
    assert!(url.starts_with("http://127.0.0.1:"), "{url:?}");

    let reply = post(&anthropic_url(url), &anthropic_request(true, &[])).await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.headers["retry-after"], "2");
}
