//! OpenAI Chat Completions: streaming chunks, the non-streaming completion, errors.

use serde_json::{Value, json};

use crate::scenario::{Block, Turn, Usage};
use crate::wire::{Frame, split_chunks, tool_json};

/// OpenAI's `prompt_tokens` includes cached tokens, Anthropic's `input_tokens`
/// does not; the scenario is in Anthropic's terms, so add them back.
fn usage_json(usage: &Usage) -> Value {
    let prompt =
        usage.input_tokens + usage.cache_read_input_tokens + usage.cache_creation_input_tokens;
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": usage.output_tokens,
        "total_tokens": prompt + usage.output_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cache_read_input_tokens},
    })
}

/// Wraps a delta into a `chat.completion.chunk`.
struct Chunker<'a> {
    id: &'a str,
    model: &'a str,
    created: u64,
    include_usage: bool,
}

impl Chunker<'_> {
    fn chunk(&self, delta: Value, finish_reason: Option<&str>) -> Frame {
        let mut chunk = json!({
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "system_fingerprint": null,
            "choices": [{
                "index": 0,
                "delta": delta,
                "logprobs": null,
                "finish_reason": finish_reason,
            }],
        });
        // With include_usage every chunk carries `usage: null` until the last one.
        if self.include_usage {
            chunk["usage"] = Value::Null;
        }
        Frame::data(chunk.to_string())
    }
}

/// The chunk sequence for a turn: a role chunk, content and tool-call deltas, a
/// chunk with `finish_reason`, a usage chunk if asked for, then `[DONE]`.
pub(crate) fn stream(
    turn: &Turn,
    model: &str,
    id: &str,
    created: u64,
    chunk_chars: usize,
    malformed: bool,
    include_usage: bool,
) -> Vec<Frame> {
    let chunker = Chunker {
        id,
        model,
        created,
        include_usage,
    };
    let mut frames = vec![chunker.chunk(json!({"role": "assistant", "content": ""}), None)];
    let mut tool_index = 0;
    for block in &turn.content {
        match block {
            Block::Text { text } => {
                for piece in split_chunks(text, chunk_chars, 1) {
                    frames.push(chunker.chunk(json!({"content": piece}), None));
                }
            }
            // Reasoning servers (vLLM, DeepSeek, llama.cpp) stream thinking as
            // `reasoning_content`; plain clients ignore it.
            Block::Thinking { thinking, .. } => {
                for piece in split_chunks(thinking, chunk_chars, 1) {
                    frames.push(chunker.chunk(json!({"reasoning_content": piece}), None));
                }
            }
            Block::ToolUse { id, name, input } => {
                // The first delta of a call names it; later ones only carry the
                // index and a piece of the arguments.
                frames.push(chunker.chunk(
                    json!({"tool_calls": [{
                        "index": tool_index,
                        "id": id,
                        "type": "function",
                        "function": {"name": name, "arguments": ""},
                    }]}),
                    None,
                ));
                for piece in split_chunks(&tool_json(input, malformed), chunk_chars, 3) {
                    frames.push(chunker.chunk(
                        json!({"tool_calls": [{"index": tool_index, "function": {"arguments": piece}}]}),
                        None,
                    ));
                }
                tool_index += 1;
            }
            // No such thing on this protocol.
            Block::WebSearch { .. } => {}
        }
    }
    frames.push(chunker.chunk(json!({}), Some(turn.effective_stop_reason().openai())));
    if include_usage {
        frames.push(Frame::data(
            json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "system_fingerprint": null,
                "choices": [],
                "usage": usage_json(&turn.usage),
            })
            .to_string(),
        ));
    }
    frames.push(Frame::data("[DONE]"));
    frames
}

/// What OpenAI-compatible servers send when a stream fails part-way: an error
/// object in a data line, after which the stream ends without `[DONE]`.
pub(crate) fn overloaded_frame() -> Frame {
    Frame::data(
        error_body(
            "The server is overloaded. Please retry.",
            "server_error",
            Some("overloaded"),
        )
        .to_string(),
    )
}

/// The non-streaming completion.
pub(crate) fn completion(
    turn: &Turn,
    model: &str,
    id: &str,
    created: u64,
    malformed: bool,
) -> String {
    let mut text = String::new();
    let mut reasoning = String::new();
    let mut calls = Vec::new();
    for block in &turn.content {
        match block {
            Block::Text { text: t } => text.push_str(t),
            Block::Thinking { thinking, .. } => reasoning.push_str(thinking),
            Block::ToolUse { id, name, input } => calls.push(json!({
                "id": id,
                "type": "function",
                "function": {"name": name, "arguments": tool_json(input, malformed)},
            })),
            // No such thing on this protocol.
            Block::WebSearch { .. } => {}
        }
    }
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { Value::String(text) },
    });
    if !reasoning.is_empty() {
        message["reasoning_content"] = json!(reasoning);
    }
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": model,
        "system_fingerprint": null,
        "choices": [{
            "index": 0,
            "message": message,
            "logprobs": null,
            "finish_reason": turn.effective_stop_reason().openai(),
        }],
        "usage": usage_json(&turn.usage),
    })
    .to_string()
}

/// `{"error":{"message":..,"type":..,"param":null,"code":..}}`.
pub(crate) fn error_body(message: &str, kind: &str, code: Option<&str>) -> Value {
    json!({"error": {"message": message, "type": kind, "param": null, "code": code}})
}

/// The error type and code OpenAI uses for an HTTP status.
pub(crate) fn error_kind(status: u16) -> (&'static str, Option<&'static str>, &'static str) {
    match status {
        401 => (
            "invalid_request_error",
            Some("invalid_api_key"),
            "Incorrect API key provided.",
        ),
        404 => (
            "invalid_request_error",
            Some("model_not_found"),
            "The model does not exist.",
        ),
        429 => (
            "requests",
            Some("rate_limit_exceeded"),
            "Rate limit reached for requests.",
        ),
        400..=499 => ("invalid_request_error", None, "Invalid request."),
        503 | 529 => (
            "server_error",
            Some("overloaded"),
            "The server is overloaded. Please retry.",
        ),
        _ => (
            "server_error",
            None,
            "The server had an error while processing your request.",
        ),
    }
}
