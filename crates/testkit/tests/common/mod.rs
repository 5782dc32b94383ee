//! A minimal client for the scripted server: what a provider does, without one.

#![allow(dead_code)] // each test file uses a different part of it

use std::time::{Duration, Instant};

use eventsource_stream::Eventsource;
use futures_util::StreamExt;
use serde_json::{Value, json};

/// One SSE event: its `event:` name (`message` when none was given) and data.
#[derive(Debug, Clone)]
pub struct Sse {
    pub event: String,
    pub data: String,
    /// When it arrived, from the start of the request.
    pub at: Duration,
}

impl Sse {
    pub fn json(&self) -> Value {
        serde_json::from_str(&self.data).unwrap_or_else(|e| panic!("{e}: {}", self.data))
    }
}

/// A response read to its end.
#[derive(Debug)]
pub struct Reply {
    pub status: u16,
    pub headers: reqwest::header::HeaderMap,
    /// Parsed SSE events for a stream.
    pub events: Vec<Sse>,
    /// The body for a non-stream response.
    pub body: Option<Value>,
    /// Set when the stream broke before it ended cleanly.
    pub stream_error: Option<String>,
}

impl Reply {
    pub fn body(&self) -> &Value {
        self.body.as_ref().expect("a JSON body")
    }

    /// Data of events with this name (Anthropic) or `message` (OpenAI).
    pub fn data_of(&self, event: &str) -> Vec<Value> {
        self.events
            .iter()
            .filter(|e| e.event == event)
            .map(Sse::json)
            .collect()
    }
}

pub async fn post(url: &str, body: &Value) -> Reply {
    let started = Instant::now();
    let response = reqwest::Client::new()
        .post(url)
        .header("x-api-key", "test-key")
        .header("anthropic-version", "2023-06-01")
        .json(body)
        .send()
        .await
        .expect("the request is sent");
    let status = response.status().as_u16();
    let headers = response.headers().clone();
    let is_sse = headers
        .get("content-type")
        .is_some_and(|v| v.as_bytes().starts_with(b"text/event-stream"));
    if !is_sse {
        let text = response.text().await.expect("a body");
        return Reply {
            status,
            headers,
            events: Vec::new(),
            body: Some(serde_json::from_str(&text).unwrap_or(Value::String(text))),
            stream_error: None,
        };
    }
    let mut stream = response.bytes_stream().eventsource();
    let mut events = Vec::new();
    let mut stream_error = None;
    while let Some(item) = stream.next().await {
        match item {
            Ok(e) => events.push(Sse {
                event: e.event,
                data: e.data,
                at: started.elapsed(),
            }),
            Err(e) => {
                stream_error = Some(e.to_string());
                break;
            }
        }
    }
    Reply {
        status,
        headers,
        events,
        body: None,
        stream_error,
    }
}

pub fn anthropic_url(base: &str) -> String {
    format!("{base}/v1/messages")
}

pub fn openai_url(base: &str) -> String {
    format!("{base}/v1/chat/completions")
}

/// An Anthropic request whose last user message carries `tool_results`.
pub fn anthropic_request(stream: bool, tool_results: &[&str]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "list the files"})];
    if !tool_results.is_empty() {
        messages.push(json!({"role": "assistant", "content": [
            {"type": "tool_use", "id": tool_results[0], "name": "bash", "input": {}}
        ]}));
        let results: Vec<Value> = tool_results
            .iter()
            .map(|id| json!({"type": "tool_result", "tool_use_id": id, "content": "a.txt\nb.txt"}))
            .collect();
        messages.push(json!({"role": "user", "content": results}));
    }
    json!({
        "model": "claude-test",
        "max_tokens": 1024,
        "stream": stream,
        "messages": messages,
    })
}

/// An OpenAI request ending with `tool` messages for `tool_results`.
pub fn openai_request(stream: bool, tool_results: &[&str]) -> Value {
    let mut messages = vec![json!({"role": "user", "content": "list the files"})];
    if !tool_results.is_empty() {
        let calls: Vec<Value> = tool_results
            .iter()
            .map(|id| json!({"id": id, "type": "function", "function": {"name": "bash", "arguments": "{}"}}))
            .collect();
        messages.push(json!({"role": "assistant", "content": null, "tool_calls": calls}));
        for id in tool_results {
            messages.push(json!({"role": "tool", "tool_call_id": id, "content": "a.txt\nb.txt"}));
        }
    }
    json!({
        "model": "gpt-test",
        "stream": stream,
        "stream_options": {"include_usage": true},
        "messages": messages,
    })
}

/// The JSON text an Anthropic stream delivered for the tool_use block at `index`.
pub fn anthropic_tool_json(reply: &Reply, index: u64) -> (usize, String) {
    let pieces: Vec<String> = reply
        .data_of("content_block_delta")
        .into_iter()
        .filter(|d| d["index"] == index && d["delta"]["type"] == "input_json_delta")
        .map(|d| d["delta"]["partial_json"].as_str().unwrap().to_owned())
        .collect();
    (pieces.len(), pieces.concat())
}

/// The arguments an OpenAI stream delivered for the tool call at `index`.
pub fn openai_tool_arguments(reply: &Reply, index: u64) -> (usize, String) {
    let mut pieces = Vec::new();
    for event in &reply.events {
        if event.data == "[DONE]" {
            continue;
        }
        let chunk = event.json();
        let Some(calls) = chunk
            .pointer("/choices/0/delta/tool_calls")
            .and_then(Value::as_array)
        else {
            continue;
        };
        for call in calls {
            if call["index"] == index
                && let Some(args) = call.pointer("/function/arguments").and_then(Value::as_str)
                && !args.is_empty()
            {
                pieces.push(args.to_owned());
            }
        }
    }
    (pieces.len(), pieces.concat())
}
