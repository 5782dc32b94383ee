//! What the server checks on each request, and how a failed check is reported.

use crate::common;

use common::*;
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::json;

fn two_turns() -> Scenario {
    Scenario::new()
        .turn(Turn::text("Listing.").with_tool_call("toolu_1", "bash", json!({"command": "ls"})))
        .turn(Turn::text("Two files.").expect_tool_results(["toolu_1"]))
}

#[tokio::test]
async fn tool_result_expectation_passes_in_both_protocols() {
    let server = ScriptedServer::start(two_turns());
    let first = post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    assert_eq!(first.status, 200);
    let second = post(
        &anthropic_url(&server.url()),
        &anthropic_request(true, &["toolu_1"]),
    )
    .await;
    assert_eq!(second.status, 200);
    server.assert_finished();

    let server = ScriptedServer::start(two_turns());
    post(&openai_url(&server.url()), &openai_request(true, &[])).await;
    let second = post(
        &openai_url(&server.url()),
        &openai_request(true, &["toolu_1"]),
    )
    .await;
    assert_eq!(second.status, 200);
    server.assert_finished();
}

/// A follow-up whose history holds the call `toolu_1` but answers `answer`.
fn answering_wrong_call(
    mut request: serde_json::Value,
    openai: bool,
    answer: &str,
) -> serde_json::Value {
    let messages = request["messages"].as_array_mut().unwrap();
    if openai {
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": [
            {"id": "toolu_1", "type": "function", "function": {"name": "bash", "arguments": "{}"}}
        ]}));
        if !answer.is_empty() {
            messages.push(json!({"role": "tool", "tool_call_id": answer, "content": "x"}));
        }
    } else {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": "toolu_1", "name": "bash", "input": {}}
        ]}));
        messages.push(json!({"role": "user", "content": [
            {"type": "tool_result", "tool_use_id": answer, "content": "x"}
        ]}));
    }
    request
}

#[tokio::test]
async fn missing_tool_result_is_rejected_and_recorded() {
    let server = ScriptedServer::start(two_turns());
    post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    // The follow-up answers a different call.
    let second = post(
        &anthropic_url(&server.url()),
        &answering_wrong_call(anthropic_request(true, &[]), false, "toolu_9"),
    )
    .await;
    assert_eq!(second.status, 400);
    let body = second.body();
    assert_eq!(body["type"], "error");
    assert_eq!(body["error"]["type"], "invalid_request_error");
    assert_eq!(body["scripted_check"], "tool_results");
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("toolu_1")
    );

    let failures = server.failures();
    let checks: Vec<&str> = failures.iter().map(|f| f.check.as_str()).collect();
    assert_eq!(checks, ["tool_results", "expect_tool_results"]);
    assert_eq!(failures[0].request, 1);
    assert_eq!(failures[0].turn, Some(1));
    // A rejected request does not consume the turn.
    assert_eq!(server.remaining_turns(), 1);

    // The OpenAI side reports in its own error shape.
    let server = ScriptedServer::start(two_turns());
    post(&openai_url(&server.url()), &openai_request(true, &[])).await;
    let second = post(
        &openai_url(&server.url()),
        &answering_wrong_call(openai_request(true, &[]), true, ""),
    )
    .await;
    assert_eq!(second.status, 400);
    assert_eq!(second.body()["error"]["type"], "invalid_request_error");
    assert_eq!(second.body()["scripted_check"], "tool_results");
    assert_eq!(server.failures().len(), 2);
}

#[tokio::test]
async fn every_tool_call_needs_a_result_even_without_an_expectation() {
    let scenario = Scenario::new()
        .turn(Turn::default().with_tool_call("toolu_1", "bash", json!({})))
        .turn(Turn::text("ok"));
    let dangling = answering_wrong_call(anthropic_request(true, &[]), false, "toolu_9");
    let server = ScriptedServer::start(scenario.clone());
    post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    let second = post(&anthropic_url(&server.url()), &dangling).await;
    assert_eq!(second.status, 400);
    assert_eq!(server.failures()[0].check, "tool_results");

    // A history that leaves the call out altogether (as a compaction's
    // summary request does) is valid for the real APIs, and here.
    let server = ScriptedServer::start(scenario.clone());
    post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    let second = post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    assert_eq!(second.status, 200);

    // The general check can be turned off for tests of broken histories.
    let mut lenient = scenario;
    lenient.check_tool_results = false;
    let server = ScriptedServer::start(lenient);
    post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    let second = post(&anthropic_url(&server.url()), &dangling).await;
    assert_eq!(second.status, 200);
    server.assert_finished();
}

#[tokio::test]
async fn contains_and_size_expectations() {
    let scenario = Scenario::new().turn(
        Turn::text("ok")
            .expect_contains("list the files")
            .expect_contains("a.txt\nb.txt")
            .expect_max_input_chars(2_000),
    );
    let server = ScriptedServer::start(scenario.clone());
    let reply = post(
        &anthropic_url(&server.url()),
        &anthropic_request(true, &["toolu_1"]),
    )
    .await;
    assert_eq!(reply.status, 200);
    server.assert_finished();

    let server = ScriptedServer::start(scenario.turn(Turn::text("x").expect_contains("absent")));
    post(
        &anthropic_url(&server.url()),
        &anthropic_request(true, &["toolu_1"]),
    )
    .await;
    let reply = post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.body()["scripted_check"], "expect_contains");

    let server =
        ScriptedServer::start(Scenario::new().turn(Turn::text("x").expect_max_input_chars(10)));
    let reply = post(&openai_url(&server.url()), &openai_request(true, &[])).await;
    assert_eq!(reply.status, 400);
    assert_eq!(reply.body()["scripted_check"], "expect_max_input_chars");
    assert_eq!(server.failures()[0].check, "expect_max_input_chars");
}

#[tokio::test]
async fn an_extra_request_gets_400_and_a_failure() {
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("only one")));
    assert_eq!(
        post(&anthropic_url(&server.url()), &anthropic_request(true, &[]))
            .await
            .status,
        200
    );
    let extra = post(&anthropic_url(&server.url()), &anthropic_request(true, &[])).await;
    assert_eq!(extra.status, 400);
    assert_eq!(extra.body()["scripted_check"], "no_turns_left");
    let failures = server.failures();
    assert_eq!(failures.len(), 1);
    assert_eq!(failures[0].check, "no_turns_left");
    assert_eq!(failures[0].request, 1);
    assert_eq!(failures[0].turn, None);
    assert_eq!(server.requests()[1].status, 400);

    let result =
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| server.assert_no_failures()));
    assert!(result.is_err(), "assert_no_failures must panic");
}

#[tokio::test]
async fn unknown_paths_and_bodies_are_failures() {
    let server = ScriptedServer::start(Scenario::new().turn(Turn::text("x")));
    let reply = post(&format!("{}/v1/completions", server.url()), &json!({})).await;
    assert_eq!(reply.status, 404);
    let response = reqwest::Client::new()
        .post(anthropic_url(&server.url()))
        .body("not json")
        .send()
        .await
        .unwrap();
    assert_eq!(response.status().as_u16(), 400);
    let checks: Vec<String> = server.failures().into_iter().map(|f| f.check).collect();
    assert_eq!(checks, ["unknown_route", "invalid_json"]);
    assert_eq!(server.remaining_turns(), 1);
}
