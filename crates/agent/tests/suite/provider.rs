//! Both providers against the scripted model server, over real HTTP.

use std::time::{Duration, Instant};

use cordon_agent::{
    ContentBlock, Message, ModelRequest, Provider, ProviderConfig, ProviderError, ProviderKind,
    StopReason, StreamDelta, ToolResult, ToolSpec,
};
use cordon_testkit::{Fault, Scenario, ScriptedServer, Turn};
use serde_json::json;

const KINDS: [ProviderKind; 2] = [ProviderKind::Anthropic, ProviderKind::OpenAi];

fn provider(server: &ScriptedServer, kind: ProviderKind) -> Provider {
    let url = match kind {
        ProviderKind::Anthropic => server.url(),
        ProviderKind::OpenAi => server.openai_url(),
    };
    let mut c = ProviderConfig::new(kind, url);
    c.api_key = Some("test-key".into());
    c.initial_backoff = Duration::from_millis(20);
    Provider::new(c).unwrap()
}

fn request(messages: Vec<Message>) -> ModelRequest {
    ModelRequest {
        model: "scripted".into(),
        system: "You are cordon.".into(),
        messages,
        tools: vec![ToolSpec {
            name: "bash".into(),
            description: "Run a command".into(),
            input_schema: json!({"type": "object", "properties": {"command": {"type": "string"}}}),
        }],
        max_tokens: 1000,
        web_search: None,
    }
}

fn user(text: &str) -> Message {
    Message::user(text)
}

#[tokio::test]
async fn a_tool_call_and_its_result_make_a_round_trip_in_both_protocols() {
    for kind in KINDS {
        let server = ScriptedServer::start(
            Scenario::new()
                .turn(Turn::text("Listing.").with_tool_call(
                    "toolu_1",
                    "bash",
                    json!({"command": "ls -la"}),
                ))
                .turn(Turn::text("There are two files.").expect_tool_results(["toolu_1"])),
        );
        let p = provider(&server, kind);
        let mut deltas = Vec::new();
        let first = p
            .stream(&request(vec![user("list files")]), |d| deltas.push(d))
            .await
            .unwrap();
        assert_eq!(first.stop_reason, StopReason::ToolUse, "{kind}");
        assert_eq!(first.text(), "Listing.");
        let (id, name, input) = first.tool_uses().next().unwrap();
        assert_eq!(
            (id, name, input),
            ("toolu_1", "bash", &json!({"command": "ls -la"}))
        );
        assert!(
            deltas
                .iter()
                .any(|d| matches!(d, StreamDelta::ToolUseStart { name, .. } if name == "bash"))
        );
        let streamed: String = deltas
            .iter()
            .filter_map(|d| match d {
                StreamDelta::Text(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(streamed, "Listing.");

        let second = p
            .stream(
                &request(vec![
                    user("list files"),
                    Message::Assistant(first),
                    Message::tool_results(vec![ToolResult {
                        tool_use_id: "toolu_1".into(),
                        content: "a\nb".into(),
                        is_error: false,
                        images: Vec::new(),
                    }]),
                ]),
                |_| {},
            )
            .await
            .unwrap();
        assert_eq!(second.text(), "There are two files.");
        assert_eq!(second.stop_reason, StopReason::EndTurn);
        server.assert_finished();
        let reqs = server.requests();
        match kind {
            ProviderKind::Anthropic => {
                assert_eq!(reqs[0].header("x-api-key"), Some("test-key"));
                assert_eq!(reqs[0].header("anthropic-version"), Some("2023-06-01"));
            }
            ProviderKind::OpenAi => {
                assert_eq!(reqs[0].header("authorization"), Some("Bearer test-key"))
            }
        }
    }
}

#[tokio::test]
async fn thinking_blocks_come_back_intact() {
    let server = ScriptedServer::start(
        Scenario::new().turn(Turn::text("Answer.").with_thinking("Reasoning here.")),
    );
    let msg = provider(&server, ProviderKind::Anthropic)
        .stream(&request(vec![user("q")]), |_| {})
        .await
        .unwrap();
    assert!(
        msg.content.iter().any(
            |b| matches!(b, ContentBlock::Thinking { thinking, signature }
            if thinking == "Reasoning here." && !signature.is_empty())
        ),
        "{:?}",
        msg.content
    );
}

#[tokio::test]
async fn overload_and_rate_limits_are_retried_honouring_retry_after() {
    for kind in KINDS {
        let server = ScriptedServer::start(
            Scenario::new().turn(
                Turn::text("Finally.")
                    .fault(Fault::http(529))
                    .fault(Fault::http(429).retry_after(1))
                    .fault(Fault::stream_error(2))
                    .fault(Fault::disconnect_after(3)),
            ),
        );
        let start = Instant::now();
        let mut retries = Vec::new();
        let msg = provider(&server, kind)
            .stream(&request(vec![user("hi")]), |d| {
                if let StreamDelta::Retrying { attempt, wait, .. } = d {
                    retries.push((attempt, wait));
                }
            })
            .await
            .unwrap();
        assert_eq!(msg.text(), "Finally.", "{kind}");
        assert_eq!(retries.len(), 4, "{kind}: {retries:?}");
        assert_eq!(
            retries[1].1,
            Duration::from_secs(1),
            "retry-after must be honoured"
        );
        assert!(start.elapsed() >= Duration::from_secs(1));
        assert_eq!(server.requests().len(), 5);
        server.assert_finished();
    }
}

#[tokio::test]
async fn persistent_failure_gives_up_with_the_last_reason() {
    let server = ScriptedServer::start(
        Scenario::new().turn(Turn::text("never").fault(Fault::http(500).times(10))),
    );
    let mut c = ProviderConfig::new(ProviderKind::Anthropic, server.url());
    c.max_attempts = 3;
    c.initial_backoff = Duration::from_millis(5);
    let err = Provider::new(c)
        .unwrap()
        .stream(&request(vec![user("hi")]), |_| {})
        .await
        .unwrap_err();
    assert!(
        matches!(err, ProviderError::Exhausted { attempts: 3, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("HTTP 500"), "{err}");
    assert_eq!(server.requests().len(), 3);
}

#[tokio::test]
async fn bad_key_unknown_model_and_context_too_long_are_explained_not_retried() {
    for kind in KINDS {
        let cases = [
            (Fault::auth_error(), "rejected the key"),
            (Fault::model_not_found(), "not known to the server"),
            (Fault::context_too_long(250_000, 200_000), "context window"),
        ];
        for (fault, words) in cases {
            let server = ScriptedServer::start(Scenario::new().turn(Turn::text("x").fault(fault)));
            let err = provider(&server, kind)
                .stream(&request(vec![user("hi")]), |_| {})
                .await
                .unwrap_err();
            let text = err.to_string();
            assert!(text.contains(words), "{kind}: {text}");
            assert!(!text.contains('\n'), "one line: {text}");
            assert_eq!(
                server.requests().len(),
                1,
                "{kind}: {text} must not be retried"
            );
        }
    }
}

#[tokio::test]
async fn malformed_tool_arguments_are_retried_then_an_error_not_a_guess() {
    for kind in KINDS {
        // Once: the request is sent again and the good answer is used.
        let server = ScriptedServer::start(
            Scenario::new().turn(
                Turn::text("x")
                    .with_tool_call("t", "bash", json!({"command": "ls"}))
                    .fault(Fault::malformed_tool_json()),
            ),
        );
        let msg = provider(&server, kind)
            .stream(&request(vec![user("hi")]), |_| {})
            .await
            .unwrap();
        let calls: Vec<_> = msg.tool_uses().collect();
        assert_eq!(calls[0].2, &json!({"command": "ls"}), "{kind}");
        // Every time: an error naming the call, never arguments guessed.
        let server = ScriptedServer::start(
            Scenario::new().turn(
                Turn::text("x")
                    .with_tool_call("t", "bash", json!({"command": "ls"}))
                    .fault(Fault::malformed_tool_json().times(10)),
            ),
        );
        let err = provider(&server, kind)
            .stream(&request(vec![user("hi")]), |_| {})
            .await
            .unwrap_err();
        assert!(
            matches!(err, ProviderError::Exhausted { .. }),
            "{kind}: {err:?}"
        );
        assert!(err.to_string().contains("not valid JSON"), "{err}");
    }
}

#[tokio::test]
async fn slow_chunks_still_stream_in_order() {
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("slow but sure, every word arrives").fault(Fault::chunk_delay_ms(15))),
    );
    let mut pieces = Vec::new();
    let msg = provider(&server, ProviderKind::OpenAi)
        .stream(&request(vec![user("hi")]), |d| {
            if let StreamDelta::Text(t) = d {
                pieces.push(t);
            }
        })
        .await
        .unwrap();
    assert!(pieces.len() > 1);
    assert_eq!(pieces.concat(), msg.text());
}

#[tokio::test]
async fn an_unreachable_server_is_a_network_error_naming_it() {
    let p = Provider::new(ProviderConfig::new(
        ProviderKind::Anthropic,
        "http://127.0.0.1:9",
    ))
    .unwrap();
    let err = p
        .stream(&request(vec![user("hi")]), |_| {})
        .await
        .unwrap_err();
    assert!(matches!(err, ProviderError::Network { .. }), "{err:?}");
    let text = err.to_string();
    assert!(text.contains("127.0.0.1:9"), "{text}");
    // The reason, not reqwest's generic wording that only repeats the URL.
    assert!(text.contains("refused"), "{text}");
    assert!(!text.contains("error sending request"), "{text}");
}
