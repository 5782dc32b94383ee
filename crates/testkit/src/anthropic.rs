//! The Anthropic Messages API: streaming events, the non-streaming message, errors.

use serde_json::{Value, json};

use crate::scenario::{Block, Turn, Usage};
use crate::wire::{Frame, split_chunks, tool_json};

fn usage_json(usage: &Usage) -> Value {
    json!({
        "input_tokens": usage.input_tokens,
        "cache_creation_input_tokens": usage.cache_creation_input_tokens,
        "cache_read_input_tokens": usage.cache_read_input_tokens,
        "output_tokens": usage.output_tokens,
    })
}

/// The full event sequence for a turn: `message_start`, a `ping`, each block's
/// start/deltas/stop, `message_delta` with the stop reason and usage, `message_stop`.
pub(crate) fn stream(
    turn: &Turn,
    model: &str,
    id: &str,
    chunk_chars: usize,
    malformed: bool,
) -> Vec<Frame> {
    let mut frames = Vec::new();
    // message_start carries the input figures; output is not known yet, so, like
    // the real API, it reports a token or so and the final count comes at the end.
    let mut start_usage = usage_json(&turn.usage);
    start_usage["output_tokens"] = json!(turn.usage.output_tokens.min(1));
    frames.push(Frame::named(
        "message_start",
        &json!({
            "type": "message_start",
            "message": {
                "id": id,
                "type": "message",
                "role": "assistant",
                "model": model,
                "content": [],
                "stop_reason": null,
                "stop_sequence": null,
                "usage": start_usage,
            }
        }),
    ));
    frames.push(Frame::named("ping", &json!({"type": "ping"})));

    let blocks = turn.content.iter().flat_map(anthropic_blocks);
    for (index, block) in blocks.enumerate() {
        let (start, deltas): (Value, Vec<Value>) = match &block {
            Wire::Whole(start) => (start.clone(), Vec::new()),
            Wire::Server { id, input } => (
                json!({"type": "server_tool_use", "id": id, "name": "web_search", "input": {}}),
                vec![json!({"type": "input_json_delta", "partial_json": input.to_string()})],
            ),
            Wire::Block(block) => match block {
                Block::Text { text } => (
                    json!({"type": "text", "text": ""}),
                    split_chunks(text, chunk_chars, 1)
                        .into_iter()
                        .map(|t| json!({"type": "text_delta", "text": t}))
                        .collect(),
                ),
                Block::Thinking {
                    thinking,
                    signature,
                } => {
                    let mut deltas: Vec<Value> = split_chunks(thinking, chunk_chars, 1)
                        .into_iter()
                        .map(|t| json!({"type": "thinking_delta", "thinking": t}))
                        .collect();
                    // The signature always arrives last, in one piece, just before the stop.
                    deltas.push(json!({"type": "signature_delta", "signature": signature}));
                    (
                        json!({"type": "thinking", "thinking": "", "signature": ""}),
                        deltas,
                    )
                }
                Block::ToolUse { id, name, input } => (
                    json!({"type": "tool_use", "id": id, "name": name, "input": {}}),
                    split_chunks(&tool_json(input, malformed), chunk_chars, 3)
                        .into_iter()
                        .map(|p| json!({"type": "input_json_delta", "partial_json": p}))
                        .collect(),
                ),
                Block::WebSearch { .. } => unreachable!("split by anthropic_blocks"),
            },
        };
        frames.push(Frame::named(
            "content_block_start",
            &json!({"type": "content_block_start", "index": index, "content_block": start}),
        ));
        for delta in deltas {
            frames.push(Frame::named(
                "content_block_delta",
                &json!({"type": "content_block_delta", "index": index, "delta": delta}),
            ));
        }
        frames.push(Frame::named(
            "content_block_stop",
            &json!({"type": "content_block_stop", "index": index}),
        ));
    }

    frames.push(Frame::named(
        "message_delta",
        &json!({
            "type": "message_delta",
            "delta": {"stop_reason": turn.effective_stop_reason().anthropic(), "stop_sequence": null},
            "usage": usage_json(&turn.usage),
        }),
    ));
    frames.push(Frame::named(
        "message_stop",
        &json!({"type": "message_stop"}),
    ));
    frames
}

/// A block as streamed: most as scripted, a web search as the two blocks
/// the API sends for it.
enum Wire<'a> {
    Block(&'a Block),
    Server {
        id: &'a str,
        input: Value,
    },
    /// A block that arrives whole in its start event.
    Whole(Value),
}

fn anthropic_blocks(block: &Block) -> Vec<Wire<'_>> {
    match block {
        Block::WebSearch {
            id,
            query,
            results,
            error_code,
        } => vec![
            Wire::Server {
                id,
                input: json!({ "query": query }),
            },
            Wire::Whole(json!({
                "type": "web_search_tool_result",
                "tool_use_id": id,
                "content": search_content(results, error_code.as_deref()),
            })),
        ],
        other => vec![Wire::Block(other)],
    }
}

/// A search result's `content`: its pages, or the error.
fn search_content(results: &[crate::scenario::SearchResult], error: Option<&str>) -> Value {
    match error {
        Some(code) => json!({"type": "web_search_tool_result_error", "error_code": code}),
        None => results
            .iter()
            .map(|r| {
                json!({
                    "type": "web_search_result",
                    "url": r.url,
                    "title": r.title,
                    // Opaque to clients; they pass it back as it came.
                    "encrypted_content": format!("enc:{}", r.url),
                    "page_age": null,
                })
            })
            .collect(),
    }
}

/// The in-stream error the API sends when it is overloaded mid-response.
pub(crate) fn overloaded_frame() -> Frame {
    Frame::named("error", &error_body("overloaded_error", "Overloaded"))
}

/// The non-streaming response body. With `malformed`, the body is cut short: in
/// a complete JSON document the tool input could not be anything but valid.
pub(crate) fn message(turn: &Turn, model: &str, id: &str, malformed: bool) -> String {
    let content: Vec<Value> = turn
        .content
        .iter()
        .flat_map(|block| match block {
            Block::Text { text } => vec![json!({"type": "text", "text": text})],
            Block::Thinking {
                thinking,
                signature,
            } => {
                vec![json!({"type": "thinking", "thinking": thinking, "signature": signature})]
            }
            Block::ToolUse { id, name, input } => {
                vec![json!({"type": "tool_use", "id": id, "name": name, "input": input})]
            }
            Block::WebSearch {
                id,
                query,
                results,
                error_code,
            } => vec![
                json!({"type": "server_tool_use", "id": id, "name": "web_search", "input": {"query": query}}),
                json!({
                    "type": "web_search_tool_result",
                    "tool_use_id": id,
                    "content": search_content(results, error_code.as_deref()),
                }),
            ],
        })
        .collect();
    let body = json!({
        "id": id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": turn.effective_stop_reason().anthropic(),
        "stop_sequence": null,
        "usage": usage_json(&turn.usage),
    })
    .to_string();
    if malformed {
        let mut cut = body.len() / 2;
        while !body.is_char_boundary(cut) {
            cut -= 1;
        }
        body[..cut].to_owned()
    } else {
        body
    }
}

/// `{"type":"error","error":{"type":..,"message":..}}`.
pub(crate) fn error_body(kind: &str, message: &str) -> Value {
    json!({"type": "error", "error": {"type": kind, "message": message}})
}

/// The error type the API uses for an HTTP status.
pub(crate) fn error_type(status: u16) -> &'static str {
    match status {
        400 => "invalid_request_error",
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        504 => "timeout_error",
        529 => "overloaded_error",
        _ => "api_error",
    }
}
