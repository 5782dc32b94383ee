//! Each fault does what it says, and a retry after it gets the reply.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use cordon_testkit::{Fault, Scenario, ScriptedServer, Turn};
use serde_json::{Value, json};

fn reply_turn() -> Turn {
    Turn::text("Running it.").with_tool_call(
        "toolu_1",
        "bash",
        json!({"command": "python3 hello.py"}),
    )
}

#[tokio::test]
async fn http_status_faults_with_retry_after_then_success() {
    let server = ScriptedServer::start(
        Scenario::new().turn(
            reply_turn()
                .fault(Fault::http(429).retry_after(7).times(2))
                .fault(Fault::http(529))
                .fault(Fault::http(500)),
        ),
    );
    let url = anthropic_url(&server.url());
    let request = anthropic_request(true, &[]);
    for _ in 0..2 {
        let reply = post(&url, &request).await;
        assert_eq!(reply.status, 429);
        assert_eq!(reply.headers["retry-after"], "7");
        assert_eq!(reply.body()["type"], "error");
        assert_eq!(reply.body()["error"]["type"], "rate_limit_error");
    }
    let reply = post(&url, &request).await;
    assert_eq!(reply.status, 529);
    assert!(reply.headers.get("retry-after").is_none());
    assert_eq!(reply.body()["error"]["type"], "overloaded_error");
    let reply = post(&url, &request).await;
    assert_eq!(reply.status, 500);
    assert_eq!(reply.body()["error"]["type"], "api_error");
    let reply = post(&url, &request).await;
    assert_eq!(reply.status, 200);
    let attempts: Vec<u32> = server.requests().iter().map(|r| r.attempt).collect();
    assert_eq!(attempts, [0, 1, 2, 3, 4]);
    server.assert_finished();
}

#[tokio::test]
async fn openai_http_faults_use_openai_error_bodies() {
    let server = ScriptedServer::start(
        Scenario::new().turn(
            Turn::text("ok")
                .fault(Fault::http(429).retry_after(1))
                .fault(Fault::http(503)),
        ),
    );
    let url = openai_url(&server.url());
    let reply = post(&url, &openai_request(true, &[])).await;
    assert_eq!(reply.status, 429);
    assert_eq!(reply.headers["retry-after"], "1");
    assert_eq!(reply.body()["error"]["code"], "rate_limit_exceeded");
    assert!(reply.body()["error"]["message"].is_string());
    let reply = post(&url, &openai_request(true, &[])).await;
    assert_eq!(reply.status, 503);
    assert_eq!(reply.body()["error"]["type"], "server_error");
    assert_eq!(post(&url, &openai_request(true, &[])).await.status, 200);
    server.assert_finished();
}

#[tokio::test]
async fn in_stream_overloaded_error() {
    let server =
        ScriptedServer::start(Scenario::new().turn(reply_turn().fault(Fault::stream_error(3))));
    let url = anthropic_url(&server.url());
    let reply = post(&url, &anthropic_request(true, &[])).await;
    assert_eq!(reply.status, 200);
    let names: Vec<&str> = reply.events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(
        names,
        ["message_start", "ping", "content_block_start", "error"]
    );
    let error = reply.data_of("error").remove(0);
    assert_eq!(
        error,
        json!({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})
    );
    assert_eq!(
        server.remaining_turns(),
        1,
        "the broken attempt must not consume the turn"
    );

    let retry = post(&url, &anthropic_request(true, &[])).await;
    assert_eq!(retry.events.last().unwrap().event, "message_stop");
    server.assert_finished();

    // OpenAI-style servers put the error object in a data line and stop.
    let server =
        ScriptedServer::start(Scenario::new().turn(reply_turn().fault(Fault::stream_error(2))));
    let reply = post(&openai_url(&server.url()), &openai_request(true, &[])).await;
    assert_eq!(reply.events.len(), 3);
    assert_eq!(reply.events[2].json()["error"]["type"], "server_error");
    assert!(reply.events.iter().all(|e| e.data != "[DONE]"));
}

#[tokio::test]
async fn disconnect_mid_stream() {
    for openai in [false, true] {
        let server = ScriptedServer::start(
            Scenario::new().turn(reply_turn().fault(Fault::disconnect_after(4))),
        );
        let (url, request) = if openai {
            (openai_url(&server.url()), openai_request(true, &[]))
        } else {
            (anthropic_url(&server.url()), anthropic_request(true, &[]))
        };
        let reply = post(&url, &request).await;
        assert_eq!(reply.status, 200);
        assert_eq!(reply.events.len(), 4, "events before the cut");
        assert!(
            reply.stream_error.is_some(),
            "the client must see a broken body"
        );
        assert_eq!(server.remaining_turns(), 1);

        let retry = post(&url, &request).await;
        assert!(retry.stream_error.is_none());
        assert!(retry.events.len() > 4);
        server.assert_finished();
    }
}

#[tokio::test]
async fn malformed_tool_json_then_valid_on_retry() {
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(reply_turn().fault(Fault::malformed_tool_json()))
            .turn(
                reply_turn()
                    .fault(Fault::malformed_tool_json())
                    .expect_tool_results(["toolu_1"]),
            ),
    );
    let url = anthropic_url(&server.url());
    let reply = post(&url, &anthropic_request(true, &[])).await;
    let (pieces, text) = anthropic_tool_json(&reply, 1);
    assert!(pieces >= 3);
    assert!(serde_json::from_str::<Value>(&text).is_err(), "{text}");
    let reply = post(&url, &anthropic_request(true, &[])).await;
    let (_, text) = anthropic_tool_json(&reply, 1);
    assert_eq!(
        serde_json::from_str::<Value>(&text).unwrap(),
        json!({"command": "python3 hello.py"})
    );

    let url = openai_url(&server.url());
    let reply = post(&url, &openai_request(true, &["toolu_1"])).await;
    let (_, arguments) = openai_tool_arguments(&reply, 0);
    assert!(
        serde_json::from_str::<Value>(&arguments).is_err(),
        "{arguments}"
    );
    let reply = post(&url, &openai_request(true, &["toolu_1"])).await;
    let (_, arguments) = openai_tool_arguments(&reply, 0);
    assert!(serde_json::from_str::<Value>(&arguments).is_ok());
    server.assert_finished();
}

#[tokio::test]
async fn slow_chunks_are_measurably_slow() {
    let server =
        ScriptedServer::start(Scenario::new().turn(reply_turn().fault(Fault::chunk_delay_ms(40))));
    let started = Instant::now();
    let reply = post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    let elapsed = started.elapsed();
    let events = reply.events.len() as u32;
    assert!(
        elapsed >= Duration::from_millis(40) * events,
        "{events} events in {elapsed:?}"
    );
    // The events trickle in rather than arriving at once at the end.
    let first = reply.events.first().unwrap().at;
    let last = reply.events.last().unwrap().at;
    assert!(last - first >= Duration::from_millis(40) * (events - 1));
    // A delay alone is not a failure: the turn is served and consumed.
    server.assert_finished();
}

#[tokio::test]
async fn auth_model_and_context_errors_per_protocol() {
    let scenario = Scenario::new().turn(
        Turn::text("ok")
            .fault(Fault::auth_error())
            .fault(Fault::model_not_found())
            .fault(Fault::context_too_long(250_000, 200_000)),
    );

    let server = ScriptedServer::start(scenario.clone());
    let url = anthropic_url(&server.url());
    let request = anthropic_request(true, &[]);
    let reply = post(&url, &request).await;
    assert_eq!(reply.status, 401);
    assert_eq!(reply.body()["error"]["type"], "authentication_error");
    let reply = post(&url, &request).await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.body()["error"]["type"], "not_found_error");
    assert_eq!(reply.body()["error"]["message"], "model: claude-test");
    let reply = post(&url, &request).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.body()["error"]["type"], "invalid_request_error");
    assert_eq!(
        reply.body()["error"]["message"],
        "prompt is too long: 250000 tokens > 200000 maximum"
    );
    assert_eq!(post(&url, &request).await.status, 200);
    server.assert_finished();

    let server = ScriptedServer::start(scenario);
    let url = openai_url(&server.url());
    let request = openai_request(true, &[]);
    let reply = post(&url, &request).await;
    assert_eq!(reply.status, 401);
    assert_eq!(reply.body()["error"]["code"], "invalid_api_key");
    let reply = post(&url, &request).await;
    assert_eq!(reply.status, 404);
    assert_eq!(reply.body()["error"]["code"], "model_not_found");
    assert!(
        reply.body()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("gpt-test")
    );
    let reply = post(&url, &request).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.body()["error"]["code"], "context_length_exceeded");
    assert!(
        reply.body()["error"]["message"]
            .as_str()
            .unwrap()
            .contains("200000")
    );
    assert_eq!(post(&url, &request).await.status, 200);
    server.assert_finished();
}
