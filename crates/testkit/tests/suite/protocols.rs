//! Both wire protocols, streaming and not, from one scenario.

use crate::common;

use common::*;
use cordon_testkit::{Protocol, Scenario, ScriptedServer, StopReason, Turn, Usage};
use serde_json::{Value, json};

fn tool_input() -> Value {
    json!({"command": "ls -la /workspace", "timeout": 30, "env": {"A": "b \"quoted\""}, "list": [1, 2, 3]})
}

fn tool_turn() -> Turn {
    Turn::default()
        .with_thinking("The user wants a listing.")
        .with_text("Let me look at the files.")
        .with_tool_call("toolu_1", "bash", tool_input())
        .usage(Usage {
            input_tokens: 120,
            output_tokens: 42,
            cache_read_input_tokens: 1000,
            cache_creation_input_tokens: 50,
        })
}

#[tokio::test]
async fn anthropic_streams_thinking_text_and_tool_use() {
    let server = ScriptedServer::start(Scenario::new().turn(tool_turn()));
    let reply = post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    assert_eq!(reply.status, 200);
    assert!(reply.stream_error.is_none());

    // Every event's SSE name matches the type inside its data.
    for event in &reply.events {
        assert_eq!(event.json()["type"], event.event.as_str(), "{}", event.data);
    }
    let names: Vec<&str> = reply.events.iter().map(|e| e.event.as_str()).collect();
    assert_eq!(names.first(), Some(&"message_start"));
    assert_eq!(names.get(1), Some(&"ping"));
    assert_eq!(names[names.len() - 2], "message_delta");
    assert_eq!(names.last(), Some(&"message_stop"));

    let start = &reply.data_of("message_start")[0]["message"];
    assert_eq!(start["role"], "assistant");
    assert_eq!(start["model"], "claude-test");
    assert_eq!(start["content"], json!([]));
    assert_eq!(start["usage"]["input_tokens"], 120);
    assert_eq!(start["usage"]["cache_read_input_tokens"], 1000);

    let starts = reply.data_of("content_block_start");
    let kinds: Vec<&str> = starts
        .iter()
        .map(|s| s["content_block"]["type"].as_str().unwrap())
        .collect();
    assert_eq!(kinds, ["thinking", "text", "tool_use"]);
    assert_eq!(starts[2]["index"], 2);
    assert_eq!(starts[2]["content_block"]["id"], "toolu_1");
    assert_eq!(starts[2]["content_block"]["name"], "bash");
    assert_eq!(starts[2]["content_block"]["input"], json!({}));
    assert_eq!(reply.data_of("content_block_stop").len(), 3);

    let deltas = reply.data_of("content_block_delta");
    let text: String = deltas
        .iter()
        .filter(|d| d["delta"]["type"] == "text_delta")
        .map(|d| d["delta"]["text"].as_str().unwrap())
        .collect();
    assert_eq!(text, "Let me look at the files.");
    let thinking: String = deltas
        .iter()
        .filter(|d| d["delta"]["type"] == "thinking_delta")
        .map(|d| d["delta"]["thinking"].as_str().unwrap())
        .collect();
    assert_eq!(thinking, "The user wants a listing.");
    assert!(
        deltas
            .iter()
            .any(|d| d["index"] == 0 && d["delta"]["type"] == "signature_delta")
    );

    let (pieces, json_text) = anthropic_tool_json(&reply, 2);
    assert!(pieces >= 3, "tool JSON came in {pieces} pieces");
    assert_eq!(
        serde_json::from_str::<Value>(&json_text).unwrap(),
        tool_input()
    );

    let delta = &reply.data_of("message_delta")[0];
    assert_eq!(delta["delta"]["stop_reason"], "tool_use");
    assert_eq!(delta["usage"]["output_tokens"], 42);
    assert_eq!(delta["usage"]["cache_read_input_tokens"], 1000);
    assert_eq!(delta["usage"]["cache_creation_input_tokens"], 50);
    server.assert_finished();
}

#[tokio::test]
async fn openai_streams_text_and_tool_calls_with_usage() {
    let server = ScriptedServer::start(Scenario::new().turn(tool_turn().with_tool_call(
        "toolu_2",
        "read_file",
        json!({"path": "a.txt"}),
    )));
    let reply = post(&openai_url(&server.url()), &openai_request(true, &[])).await;
    assert_eq!(reply.status, 200);
    assert!(reply.stream_error.is_none());
    assert!(reply.events.iter().all(|e| e.event == "message"));
    assert_eq!(reply.events.last().unwrap().data, "[DONE]");

    let chunks: Vec<Value> = reply.events[..reply.events.len() - 1]
        .iter()
        .map(Sse::json)
        .collect();
    for chunk in &chunks {
        assert_eq!(chunk["object"], "chat.completion.chunk");
        assert_eq!(chunk["model"], "gpt-test");
    }
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c.pointer("/choices/0/delta/content")
                .and_then(Value::as_str)
        })
        .collect();
    assert_eq!(text, "Let me look at the files.");

    // The first delta of each call carries its id, type and name.
    let heads: Vec<&Value> = chunks
        .iter()
        .filter_map(|c| c.pointer("/choices/0/delta/tool_calls/0"))
        .filter(|call| call.get("id").is_some())
        .collect();
    assert_eq!(heads.len(), 2);
    assert_eq!(heads[0]["index"], 0);
    assert_eq!(heads[0]["id"], "toolu_1");
    assert_eq!(heads[0]["type"], "function");
    assert_eq!(heads[0]["function"]["name"], "bash");
    assert_eq!(heads[1]["index"], 1);
    assert_eq!(heads[1]["function"]["name"], "read_file");

    let (pieces, arguments) = openai_tool_arguments(&reply, 0);
    assert!(pieces >= 3, "arguments came in {pieces} pieces");
    assert_eq!(
        serde_json::from_str::<Value>(&arguments).unwrap(),
        tool_input()
    );
    let (_, second) = openai_tool_arguments(&reply, 1);
    assert_eq!(
        serde_json::from_str::<Value>(&second).unwrap(),
        json!({"path": "a.txt"})
    );

    let finish = &chunks[chunks.len() - 2];
    assert_eq!(finish["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(finish["usage"], Value::Null);
    let usage_chunk = chunks.last().unwrap();
    assert_eq!(usage_chunk["choices"], json!([]));
    assert_eq!(usage_chunk["usage"]["prompt_tokens"], 1170);
    assert_eq!(usage_chunk["usage"]["completion_tokens"], 42);
    assert_eq!(usage_chunk["usage"]["total_tokens"], 1212);
    assert_eq!(
        usage_chunk["usage"]["prompt_tokens_details"]["cached_tokens"],
        1000
    );
    server.assert_finished();
}

#[tokio::test]
async fn openai_usage_chunk_only_when_asked() {
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("hi")));
    let mut request = openai_request(true, &[]);
    request.as_object_mut().unwrap().remove("stream_options");
    let reply = post(&openai_url(&server.url()), &request).await;
    let chunks: Vec<Value> = reply.events[..reply.events.len() - 1]
        .iter()
        .map(Sse::json)
        .collect();
    assert!(chunks.iter().all(|c| c.get("usage").is_none()));
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "stop"
    );
}

#[tokio::test]
async fn stop_reasons_map_to_both_protocols() {
    let cases = [
        (StopReason::EndTurn, "end_turn", "stop"),
        (StopReason::MaxTokens, "max_tokens", "length"),
        (StopReason::Refusal, "refusal", "content_filter"),
    ];
    for (reason, anthropic, openai) in cases {
        let server = ScriptedServer::start(
            Scenario::new()
                .turn(Turn::text("x").stop(reason))
                .turn(Turn::text("x").stop(reason)),
        );
        let a = post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
        assert_eq!(
            a.data_of("message_delta")[0]["delta"]["stop_reason"],
            anthropic
        );
        let o = post(&openai_url(&server.url()), &openai_request(true, &[])).await;
        let finish = o.events[o.events.len() - 3].json();
        assert_eq!(finish["choices"][0]["finish_reason"], openai);
        server.assert_finished();
    }
}

#[tokio::test]
async fn non_streaming_replies_in_both_protocols() {
    let server = ScriptedServer::start(
        Scenario::new()
            .turn(tool_turn())
            .turn(tool_turn().expect_tool_results(["toolu_1"])),
    );
    let a = post(
        &anthropic_url(&server.url()),
        &anthropic_request(false, &[]),
    )
    .await;
    assert_eq!(a.status, 200);
    let body = a.body();
    assert_eq!(body["type"], "message");
    assert_eq!(body["stop_reason"], "tool_use");
    assert_eq!(body["content"][0]["type"], "thinking");
    assert!(body["content"][0]["signature"].as_str().is_some());
    assert_eq!(body["content"][1]["text"], "Let me look at the files.");
    assert_eq!(body["content"][2]["input"], tool_input());
    assert_eq!(body["usage"]["cache_creation_input_tokens"], 50);

    let o = post(
        &openai_url(&server.url()),
        &openai_request(false, &["toolu_1"]),
    )
    .await;
    assert_eq!(o.status, 200);
    let body = o.body();
    assert_eq!(body["object"], "chat.completion");
    let message = &body["choices"][0]["message"];
    assert_eq!(message["content"], "Let me look at the files.");
    let arguments = message["tool_calls"][0]["function"]["arguments"]
        .as_str()
        .unwrap();
    assert_eq!(
        serde_json::from_str::<Value>(arguments).unwrap(),
        tool_input()
    );
    assert_eq!(body["choices"][0]["finish_reason"], "tool_calls");
    assert_eq!(body["usage"]["prompt_tokens"], 1170);
    server.assert_finished();
}

#[tokio::test]
async fn requests_are_recorded() {
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("a")).turn(Turn::text("b")));
    post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    post(&openai_url(&server.url()), &openai_request(false, &[])).await;
    let requests = server.requests();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].path, "/v1/messages");
    assert_eq!(requests[0].method, "POST");
    assert_eq!(requests[0].protocol, Some(Protocol::Anthropic));
    assert_eq!(requests[0].header("X-Api-Key"), Some("test-key"));
    assert_eq!(requests[0].header("anthropic-version"), Some("2023-06-01"));
    assert_eq!(requests[0].body["model"], "claude-test");
    assert_eq!(requests[0].turn, Some(0));
    assert_eq!(requests[0].status, 200);
    assert_eq!(requests[1].path, "/v1/chat/completions");
    assert_eq!(requests[1].protocol, Some(Protocol::OpenAi));
    assert_eq!(requests[1].body["messages"][0]["content"], "list the files");
    assert_eq!(requests[1].turn, Some(1));
    server.assert_finished();
}

#[test]
fn works_from_a_plain_test_and_shuts_down() {
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("a")));
    let addr = server.addr();
    assert!(server.url().starts_with("http://127.0.0.1:"));
    assert_eq!(server.openai_url(), format!("{}/v1", server.url()));
    std::net::TcpStream::connect(addr).expect("listening");
    server.shutdown();
    assert!(
        std::net::TcpStream::connect(addr).is_err(),
        "still listening"
    );
}
