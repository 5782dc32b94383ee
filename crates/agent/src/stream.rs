//! Assembling streamed model answers: Anthropic Messages SSE events and
//! OpenAI Chat Completions chunks, each into an [`AssistantMessage`], with
//! the deltas a front end renders as they arrive. Pure: the HTTP side feeds
//! it event by event, and tests feed it transcripts.

use std::collections::BTreeMap;

use serde_json::Value;

use crate::message::{AssistantMessage, ContentBlock, StopReason, StreamDelta, Usage};

/// A stream that could not be turned into a message.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum StreamError {
    /// The API reported an error inside the stream (e.g. `overloaded_error`).
    #[error("{kind}: {message}")]
    Api { kind: String, message: String },
    #[error("malformed stream event: {0}")]
    Malformed(String),
    /// The stream ended before the message was complete.
    #[error("the stream ended before the answer was complete")]
    Incomplete,
    /// A tool call's arguments are not valid JSON.
    #[error("the arguments of tool call {name} ({id}) are not valid JSON: {error}")]
    BadToolInput {
        id: String,
        name: String,
        error: String,
    },
}

impl StreamError {
    /// Errors worth retrying the whole request for (nothing has run yet).
    pub fn is_retryable(&self) -> bool {
        match self {
            // Anthropic's transient types, and OpenAI's (servers report
            // overload mid-stream as `server_error`).
            StreamError::Api { kind, .. } => matches!(
                kind.as_str(),
                "overloaded_error"
                    | "api_error"
                    | "rate_limit_error"
                    | "server_error"
                    | "rate_limit_exceeded"
            ),
            StreamError::Incomplete => true,
            // A sampling slip, usually gone on the next try; nothing ran.
            StreamError::BadToolInput { .. } => true,
            StreamError::Malformed(_) => false,
        }
    }
}

fn parse(data: &str) -> Result<Value, StreamError> {
    serde_json::from_str(data).map_err(|e| StreamError::Malformed(format!("{e}: {data:.200}")))
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_str()
}

fn u64_at(v: &Value, path: &[&str]) -> Option<u64> {
    let mut cur = v;
    for p in path {
        cur = cur.get(p)?;
    }
    cur.as_u64()
}

fn tool_input(id: &str, name: &str, json: &str) -> Result<Value, StreamError> {
    if json.trim().is_empty() {
        return Ok(Value::Object(Default::default()));
    }
    serde_json::from_str(json).map_err(|e| StreamError::BadToolInput {
        id: id.to_string(),
        name: name.to_string(),
        error: e.to_string(),
    })
}

enum Block {
    Text(String),
    Thinking {
        thinking: String,
        signature: String,
    },
    Redacted(String),
    Tool {
        id: String,
        name: String,
        json: String,
    },
    /// A tool the provider runs itself; its input streams as a tool's.
    Server {
        id: String,
        name: String,
        json: String,
    },
    SearchResult {
        tool_use_id: String,
        content: Value,
    },
}

/// Assembles one Anthropic Messages stream.
#[derive(Default)]
pub struct AnthropicStream {
    blocks: BTreeMap<u64, Block>,
    usage: Usage,
    stop_reason: Option<StopReason>,
    done: bool,
}

impl AnthropicStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// True once `message_stop` arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Feeds one SSE event's data; returns what to render now.
    pub fn feed(&mut self, data: &str) -> Result<Vec<StreamDelta>, StreamError> {
        let v = parse(data)?;
        let index = || {
            v.get("index")
                .and_then(Value::as_u64)
                .ok_or_else(|| StreamError::Malformed(format!("event without index: {data:.200}")))
        };
        let mut out = Vec::new();
        match str_at(&v, &["type"]).unwrap_or("") {
            "message_start" => {
                let u = &v["message"]["usage"];
                self.usage.input_tokens = u64_at(u, &["input_tokens"]).unwrap_or(0);
                self.usage.output_tokens = u64_at(u, &["output_tokens"]).unwrap_or(0);
                self.usage.cache_read_tokens = u64_at(u, &["cache_read_input_tokens"]).unwrap_or(0);
                self.usage.cache_write_tokens =
                    u64_at(u, &["cache_creation_input_tokens"]).unwrap_or(0);
            }
            "content_block_start" => {
                let i = index()?;
                let b = &v["content_block"];
                let block = match str_at(b, &["type"]).unwrap_or("") {
                    "text" => {
                        let t = str_at(b, &["text"]).unwrap_or("").to_string();
                        if !t.is_empty() {
                            out.push(StreamDelta::Text(t.clone()));
                        }
                        Block::Text(t)
                    }
                    "thinking" => Block::Thinking {
                        thinking: str_at(b, &["thinking"]).unwrap_or("").to_string(),
                        signature: str_at(b, &["signature"]).unwrap_or("").to_string(),
                    },
                    "redacted_thinking" => {
                        Block::Redacted(str_at(b, &["data"]).unwrap_or("").to_string())
                    }
                    "tool_use" => {
                        let id = str_at(b, &["id"]).unwrap_or("").to_string();
                        let name = str_at(b, &["name"]).unwrap_or("").to_string();
                        out.push(StreamDelta::ToolUseStart {
                            id: id.clone(),
                            name: name.clone(),
                        });
                        Block::Tool {
                            id,
                            name,
                            json: String::new(),
                        }
                    }
                    "server_tool_use" => Block::Server {
                        id: str_at(b, &["id"]).unwrap_or("").to_string(),
                        name: str_at(b, &["name"]).unwrap_or("").to_string(),
                        json: String::new(),
                    },
                    // Whole in its start: kept to be sent back as it came.
                    "web_search_tool_result" => Block::SearchResult {
                        tool_use_id: str_at(b, &["tool_use_id"]).unwrap_or("").to_string(),
                        content: b.get("content").cloned().unwrap_or(Value::Null),
                    },
                    // Future block types carry nothing the agent acts on.
                    _ => return Ok(out),
                };
                self.blocks.insert(i, block);
            }
            "content_block_delta" => {
                let i = index()?;
                let d = &v["delta"];
                let Some(block) = self.blocks.get_mut(&i) else {
                    return Ok(out);
                };
                match (str_at(d, &["type"]).unwrap_or(""), block) {
                    ("text_delta", Block::Text(t)) => {
                        let s = str_at(d, &["text"]).unwrap_or("");
                        t.push_str(s);
                        out.push(StreamDelta::Text(s.to_string()));
                    }
                    ("thinking_delta", Block::Thinking { thinking, .. }) => {
                        let s = str_at(d, &["thinking"]).unwrap_or("");
                        thinking.push_str(s);
                        out.push(StreamDelta::Thinking(s.to_string()));
                    }
                    ("signature_delta", Block::Thinking { signature, .. }) => {
                        signature.push_str(str_at(d, &["signature"]).unwrap_or(""));
                    }
                    ("input_json_delta", Block::Tool { json, .. }) => {
                        let s = str_at(d, &["partial_json"]).unwrap_or("");
                        json.push_str(s);
                        out.push(StreamDelta::ToolInput(s.to_string()));
                    }
                    ("input_json_delta", Block::Server { json, .. }) => {
                        json.push_str(str_at(d, &["partial_json"]).unwrap_or(""));
                    }
                    _ => {}
                }
            }
            "message_delta" => {
                if let Some(r) = str_at(&v, &["delta", "stop_reason"]) {
                    self.stop_reason = Some(StopReason::from_anthropic(r));
                }
                if let Some(o) = u64_at(&v, &["usage", "output_tokens"]) {
                    self.usage.output_tokens = o;
                }
            }
            "message_stop" => self.done = true,
            "error" => {
                return Err(StreamError::Api {
                    kind: str_at(&v, &["error", "type"])
                        .unwrap_or("error")
                        .to_string(),
                    message: str_at(&v, &["error", "message"]).unwrap_or("").to_string(),
                });
            }
            // ping, content_block_stop and event types added later.
            _ => {}
        }
        Ok(out)
    }

    /// The assembled message; fails if the stream was cut short or a tool
    /// call's input is not JSON.
    pub fn finish(self) -> Result<AssistantMessage, StreamError> {
        let Some(stop_reason) = self.stop_reason.filter(|_| self.done) else {
            return Err(StreamError::Incomplete);
        };
        let mut content = Vec::with_capacity(self.blocks.len());
        for block in self.blocks.into_values() {
            content.push(match block {
                Block::Text(text) => ContentBlock::Text { text },
                Block::Thinking {
                    thinking,
                    signature,
                } => ContentBlock::Thinking {
                    thinking,
                    signature,
                },
                Block::Redacted(data) => ContentBlock::RedactedThinking { data },
                Block::Tool { id, name, json } => {
                    let input = tool_input(&id, &name, &json)?;
                    ContentBlock::ToolUse { id, name, input }
                }
                Block::Server { id, name, json } => {
                    let input = tool_input(&id, &name, &json)?;
                    ContentBlock::ServerToolUse { id, name, input }
                }
                Block::SearchResult {
                    tool_use_id,
                    content,
                } => ContentBlock::WebSearchToolResult {
                    tool_use_id,
                    content,
                },
            });
        }
        Ok(AssistantMessage {
            content,
            stop_reason,
            usage: self.usage,
        })
    }
}

#[derive(Default)]
struct Call {
    id: String,
    name: String,
    args: String,
    announced: bool,
}

/// Assembles one OpenAI Chat Completions stream (OpenAI, Ollama, vLLM,
/// llama.cpp, LiteLLM).
#[derive(Default)]
pub struct OpenAiStream {
    text: String,
    reasoning: String,
    calls: BTreeMap<u64, Call>,
    finish: Option<StopReason>,
    usage: Usage,
    done: bool,
}

impl OpenAiStream {
    pub fn new() -> Self {
        Self::default()
    }

    /// True once `[DONE]` arrived.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// Feeds one `data:` payload; returns what to render now.
    pub fn feed(&mut self, data: &str) -> Result<Vec<StreamDelta>, StreamError> {
        if data.trim() == "[DONE]" {
            self.done = true;
            return Ok(Vec::new());
        }
        let v = parse(data)?;
        if let Some(e) = v.get("error") {
            return Err(StreamError::Api {
                kind: str_at(e, &["type"])
                    .or_else(|| str_at(e, &["code"]))
                    .unwrap_or("error")
                    .to_string(),
                message: str_at(e, &["message"]).unwrap_or("").to_string(),
            });
        }
        if let Some(u) = v.get("usage").filter(|u| u.is_object()) {
            let prompt = u64_at(u, &["prompt_tokens"]).unwrap_or(0);
            let cached = u64_at(u, &["prompt_tokens_details", "cached_tokens"]).unwrap_or(0);
            self.usage = Usage {
                input_tokens: prompt.saturating_sub(cached),
                output_tokens: u64_at(u, &["completion_tokens"]).unwrap_or(0),
                cache_read_tokens: cached,
                cache_write_tokens: 0,
            };
        }
        let mut out = Vec::new();
        let Some(choice) = v.get("choices").and_then(|c| c.get(0)) else {
            return Ok(out);
        };
        let d = &choice["delta"];
        if let Some(t) = d
            .get("content")
            .and_then(Value::as_str)
            .filter(|t| !t.is_empty())
        {
            self.text.push_str(t);
            out.push(StreamDelta::Text(t.to_string()));
        }
        // Reasoning models behind compatible servers stream their thoughts
        // under one of these names.
        for key in ["reasoning_content", "reasoning"] {
            if let Some(t) = d.get(key).and_then(Value::as_str).filter(|t| !t.is_empty()) {
                self.reasoning.push_str(t);
                out.push(StreamDelta::Thinking(t.to_string()));
            }
        }
        if let Some(calls) = d.get("tool_calls").and_then(Value::as_array) {
            for (pos, c) in calls.iter().enumerate() {
                let i = c.get("index").and_then(Value::as_u64).unwrap_or(pos as u64);
                let call = self.calls.entry(i).or_default();
                if let Some(id) = str_at(c, &["id"]).filter(|s| !s.is_empty()) {
                    call.id = id.to_string();
                }
                if let Some(n) = str_at(c, &["function", "name"]).filter(|s| !s.is_empty()) {
                    call.name.push_str(n);
                }
                if !call.announced && !call.name.is_empty() {
                    call.announced = true;
                    out.push(StreamDelta::ToolUseStart {
                        id: call.id.clone(),
                        name: call.name.clone(),
                    });
                }
                if let Some(a) = str_at(c, &["function", "arguments"]).filter(|s| !s.is_empty()) {
                    call.args.push_str(a);
                    out.push(StreamDelta::ToolInput(a.to_string()));
                }
            }
        }
        if let Some(r) = choice.get("finish_reason").and_then(Value::as_str) {
            self.finish = Some(StopReason::from_openai(r));
        }
        Ok(out)
    }

    /// The assembled message. Some servers omit `[DONE]`; a finish reason
    /// is enough to call the answer complete.
    pub fn finish(self) -> Result<AssistantMessage, StreamError> {
        let Some(mut stop_reason) = self.finish else {
            return Err(StreamError::Incomplete);
        };
        let mut content = Vec::new();
        if !self.reasoning.is_empty() {
            content.push(ContentBlock::Thinking {
                thinking: self.reasoning,
                signature: String::new(),
            });
        }
        if !self.text.is_empty() {
            content.push(ContentBlock::Text { text: self.text });
        }
        for (i, call) in self.calls {
            let id = if call.id.is_empty() {
                format!("call_{i}")
            } else {
                call.id
            };
            let input = tool_input(&id, &call.name, &call.args)?;
            content.push(ContentBlock::ToolUse {
                id,
                name: call.name,
                input,
            });
        }
        // Some servers say "stop" even when they called tools.
        if stop_reason == StopReason::EndTurn
            && content
                .iter()
                .any(|b| matches!(b, ContentBlock::ToolUse { .. }))
        {
            stop_reason = StopReason::ToolUse;
        }
        Ok(AssistantMessage {
            content,
            stop_reason,
            usage: self.usage,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn anthropic(events: &[Value]) -> (Vec<StreamDelta>, Result<AssistantMessage, StreamError>) {
        let mut s = AnthropicStream::new();
        let mut deltas = Vec::new();
        for e in events {
            match s.feed(&e.to_string()) {
                Ok(d) => deltas.extend(d),
                Err(err) => return (deltas, Err(err)),
            }
        }
        (deltas, s.finish())
    }

    fn start(usage: Value) -> Value {
        json!({"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","content":[],"model":"m","stop_reason":null,"usage":usage}})
    }

    #[test]
    fn anthropic_text_thinking_and_parallel_tool_use_assemble() {
        let (deltas, msg) = anthropic(&[
            start(
                json!({"input_tokens":10,"output_tokens":1,"cache_read_input_tokens":100,"cache_creation_input_tokens":7}),
            ),
            json!({"type":"content_block_start","index":0,"content_block":{"type":"thinking","thinking":""}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"Let me "}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"thinking_delta","thinking":"look."}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"signature_delta","signature":"sig=="}}),
            json!({"type":"content_block_stop","index":0}),
            json!({"type":"ping"}),
            json!({"type":"content_block_start","index":1,"content_block":{"type":"text","text":""}}),
            json!({"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"Run"}}),
            json!({"type":"content_block_delta","index":1,"delta":{"type":"text_delta","text":"ning."}}),
            json!({"type":"content_block_start","index":2,"content_block":{"type":"tool_use","id":"toolu_1","name":"bash","input":{}}}),
            json!({"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":""}}),
            json!({"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"{\"command\": \"l"}}),
            json!({"type":"content_block_delta","index":2,"delta":{"type":"input_json_delta","partial_json":"s -la\"}"}}),
            json!({"type":"content_block_start","index":3,"content_block":{"type":"tool_use","id":"toolu_2","name":"list_dir","input":{}}}),
            json!({"type":"some_future_event","index":3}),
            json!({"type":"message_delta","delta":{"stop_reason":"tool_use","stop_sequence":null},"usage":{"output_tokens":42}}),
            json!({"type":"message_stop"}),
        ]);
        let msg = msg.unwrap();
        assert_eq!(msg.stop_reason, StopReason::ToolUse);
        assert_eq!(
            msg.usage,
            Usage {
                input_tokens: 10,
                output_tokens: 42,
                cache_read_tokens: 100,
                cache_write_tokens: 7
            }
        );
        assert_eq!(msg.text(), "Running.");
        assert_eq!(
            msg.content[0],
            ContentBlock::Thinking {
                thinking: "Let me look.".into(),
                signature: "sig==".into()
            }
        );
        let tools: Vec<_> = msg
            .tool_uses()
            .map(|(id, n, i)| (id.to_string(), n.to_string(), i.clone()))
            .collect();
        assert_eq!(
            tools,
            vec![
                ("toolu_1".into(), "bash".into(), json!({"command":"ls -la"})),
                ("toolu_2".into(), "list_dir".into(), json!({})),
            ]
        );
        assert!(deltas.contains(&StreamDelta::ToolUseStart {
            id: "toolu_1".into(),
            name: "bash".into()
        }));
        assert_eq!(
            deltas
                .iter()
                .filter(|d| matches!(d, StreamDelta::Text(_)))
                .count(),
            2
        );
    }

    #[test]
    fn anthropic_in_stream_overload_is_a_retryable_api_error() {
        let (_, msg) = anthropic(&[
            start(json!({"input_tokens":1,"output_tokens":1})),
            json!({"type":"error","error":{"type":"overloaded_error","message":"Overloaded"}}),
        ]);
        let err = msg.unwrap_err();
        assert_eq!(
            err,
            StreamError::Api {
                kind: "overloaded_error".into(),
                message: "Overloaded".into()
            }
        );
        assert!(err.is_retryable());
    }

    #[test]
    fn anthropic_cut_short_or_bad_json_is_an_error_not_a_message() {
        let (_, msg) = anthropic(&[
            start(json!({"input_tokens":1,"output_tokens":1})),
            json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"half"}}),
        ]);
        assert_eq!(msg.unwrap_err(), StreamError::Incomplete);
        let (_, msg) = anthropic(&[
            start(json!({"input_tokens":1,"output_tokens":1})),
            json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":"t","name":"bash","input":{}}}),
            json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":"{\"command\": "}}),
            json!({"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":3}}),
            json!({"type":"message_stop"}),
        ]);
        assert!(
            matches!(msg.unwrap_err(), StreamError::BadToolInput { ref name, .. } if name == "bash")
        );
        let mut s = AnthropicStream::new();
        assert!(matches!(
            s.feed("{not json"),
            Err(StreamError::Malformed(_))
        ));
    }

    fn openai(chunks: &[&str]) -> (Vec<StreamDelta>, Result<AssistantMessage, StreamError>) {
        let mut s = OpenAiStream::new();
        let mut deltas = Vec::new();
        for c in chunks {
            match s.feed(c) {
                Ok(d) => deltas.extend(d),
                Err(e) => return (deltas, Err(e)),
            }
        }
        (deltas, s.finish())
    }

    #[test]
    fn openai_text_and_tool_call_deltas_assemble() {
        let c = |delta: Value, finish: Value| {
            json!({"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":delta,"finish_reason":finish}]}).to_string()
        };
        let chunks = [
            c(json!({"role":"assistant","content":""}), Value::Null),
            c(json!({"content":"Let me check."}), Value::Null),
            c(json!({"tool_calls":[{"index":0,"id":"call_a","type":"function","function":{"name":"bash","arguments":""}}]}), Value::Null),
            c(json!({"tool_calls":[{"index":0,"function":{"arguments":"{\"comm"}}]}), Value::Null),
            c(json!({"tool_calls":[{"index":0,"function":{"arguments":"and\":\"pwd\"}"}}]}), Value::Null),
            c(json!({"tool_calls":[{"index":1,"id":"call_b","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"a\"}"}}]}), Value::Null),
            c(json!({}), json!("tool_calls")),
            json!({"id":"c","choices":[],"usage":{"prompt_tokens":120,"completion_tokens":30,"total_tokens":150,"prompt_tokens_details":{"cached_tokens":100}}}).to_string(),
            "[DONE]".to_string(),
        ];
        let refs: Vec<&str> = chunks.iter().map(String::as_str).collect();
        let (deltas, msg) = openai(&refs);
        let msg = msg.unwrap();
        assert_eq!(msg.stop_reason, StopReason::ToolUse);
        assert_eq!(msg.text(), "Let me check.");
        let tools: Vec<_> = msg
            .tool_uses()
            .map(|(id, n, i)| (id.to_string(), n.to_string(), i.clone()))
            .collect();
        assert_eq!(
            tools,
            vec![
                ("call_a".into(), "bash".into(), json!({"command":"pwd"})),
                ("call_b".into(), "read_file".into(), json!({"path":"a"})),
            ]
        );
        assert_eq!(
            msg.usage,
            Usage {
                input_tokens: 20,
                output_tokens: 30,
                cache_read_tokens: 100,
                cache_write_tokens: 0
            }
        );
        assert_eq!(msg.usage.prompt_tokens(), 120);
        assert_eq!(
            deltas
                .iter()
                .filter(|d| matches!(d, StreamDelta::ToolUseStart { .. }))
                .count(),
            2
        );
    }

    #[test]
    fn openai_quirks_of_compatible_servers_are_handled() {
        // A whole tool call in one chunk, no ids, "stop" as the reason, no [DONE].
        let chunk = json!({"choices":[{"index":0,"delta":{"tool_calls":[{"function":{"name":"bash","arguments":"{\"command\":\"ls\"}"}}]},"finish_reason":"stop"}]}).to_string();
        let (_, msg) = openai(&[&chunk]);
        let msg = msg.unwrap();
        assert_eq!(msg.stop_reason, StopReason::ToolUse);
        assert_eq!(msg.tool_uses().next().unwrap().0, "call_0");
        // Reasoning streamed by the server is kept as thinking.
        let r = json!({"choices":[{"index":0,"delta":{"reasoning_content":"hmm"},"finish_reason":null}]}).to_string();
        let e = json!({"choices":[{"index":0,"delta":{"content":"ok"},"finish_reason":"length"}]})
            .to_string();
        let (_, msg) = openai(&[&r, &e]);
        let msg = msg.unwrap();
        assert_eq!(msg.stop_reason, StopReason::MaxTokens);
        assert!(
            matches!(&msg.content[0], ContentBlock::Thinking { thinking, .. } if thinking == "hmm")
        );
        // Errors inside the stream, truncation and bad JSON.
        let err = json!({"error":{"message":"model overloaded","type":"server_error"}}).to_string();
        assert!(matches!(openai(&[&err]).1, Err(StreamError::Api { .. })));
        let half = json!({"choices":[{"index":0,"delta":{"content":"hi"},"finish_reason":null}]})
            .to_string();
        assert_eq!(openai(&[&half]).1.unwrap_err(), StreamError::Incomplete);
        let bad = json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"x","function":{"name":"bash","arguments":"{oops"}}]},"finish_reason":"tool_calls"}]}).to_string();
        assert!(matches!(
            openai(&[&bad]).1,
            Err(StreamError::BadToolInput { .. })
        ));
    }
}
