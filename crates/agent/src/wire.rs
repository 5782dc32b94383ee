//! Building request bodies for both wire protocols from the neutral
//! conversation, and classifying the errors their servers answer with.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::message::{AssistantMessage, ContentBlock};

/// A tool as offered to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    pub input_schema: Value,
}

/// The result of one tool call, sent back in the next user turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    pub tool_use_id: String,
    pub content: String,
    #[serde(default)]
    pub is_error: bool,
    /// Screenshots and other images, shown to the model after `content`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub images: Vec<cordon_tools::Image>,
}

/// One message of the conversation as sent to the model.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "role", rename_all = "snake_case")]
pub enum Message {
    User {
        #[serde(default, skip_serializing_if = "String::is_empty")]
        text: String,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        tool_results: Vec<ToolResult>,
        /// Images the user gave with the text (`--attach`, `/attach`),
        /// shown to the model before it.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        images: Vec<cordon_tools::Image>,
    },
    Assistant(AssistantMessage),
}

impl Message {
    /// A user's text.
    pub fn user(text: impl Into<String>) -> Message {
        Message::User {
            text: text.into(),
            tool_results: Vec::new(),
            images: Vec::new(),
        }
    }

    /// A user's text with images.
    pub fn user_with_images(text: impl Into<String>, images: Vec<cordon_tools::Image>) -> Message {
        Message::User {
            text: text.into(),
            tool_results: Vec::new(),
            images,
        }
    }

    /// The results of the model's last tool calls.
    pub fn tool_results(results: Vec<ToolResult>) -> Message {
        Message::User {
            text: String::new(),
            tool_results: results,
            images: Vec::new(),
        }
    }
}

/// Everything one model request carries.
#[derive(Debug, Clone, PartialEq)]
pub struct ModelRequest {
    pub model: String,
    pub system: String,
    pub messages: Vec<Message>,
    pub tools: Vec<ToolSpec>,
    pub max_tokens: u32,
    /// The provider's own web search, offered beside the tools (Anthropic
    /// only; OpenAI-compatible servers have none to offer).
    pub web_search: Option<WebSearch>,
}

/// Anthropic's server-side web search, as the user enabled it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebSearch {
    /// Searches allowed per request.
    pub max_uses: u32,
}

/// The web search tool's type, the version of it cordon speaks.
const WEB_SEARCH_TOOL: &str = "web_search_20250305";

const EPHEMERAL: &str = "ephemeral";

/// The Anthropic Messages body. Prompt caching: breakpoints on the last
/// tool, on the system prompt and on the last block of the two most recent
/// user turns, so each request reads the prefix the previous one wrote
/// (Anthropic allows at most four breakpoints).
pub fn anthropic_body(req: &ModelRequest) -> Value {
    let cache = json!({ "type": EPHEMERAL });
    let mut tools: Vec<Value> = req
        .tools
        .iter()
        .map(|t| json!({ "name": t.name, "description": t.description, "input_schema": t.input_schema }))
        .collect();
    if let Some(last) = tools.last_mut() {
        last["cache_control"] = cache.clone();
    }
    if let Some(w) = req.web_search {
        // First: the cache breakpoint stays on the last tool.
        tools.insert(
            0,
            json!({ "type": WEB_SEARCH_TOOL, "name": "web_search", "max_uses": w.max_uses }),
        );
    }
    let mut messages: Vec<Value> = req
        .messages
        .iter()
        .map(|m| match m {
            Message::User {
                text,
                tool_results,
                images,
            } => {
                let mut content: Vec<Value> = tool_results
                    .iter()
                    .map(|r| {
                        // With images, the content is a list of blocks.
                        let content = if r.images.is_empty() {
                            json!(r.content)
                        } else {
                            let mut blocks = vec![json!({"type": "text", "text": r.content})];
                            blocks.extend(r.images.iter().map(|i| {
                                json!({"type": "image", "source": {
                                    "type": "base64", "media_type": i.media_type, "data": i.data,
                                }})
                            }));
                            Value::Array(blocks)
                        };
                        json!({
                            "type": "tool_result",
                            "tool_use_id": r.tool_use_id,
                            "content": content,
                            "is_error": r.is_error,
                        })
                    })
                    .collect();
                // The user's images, then what they said about them.
                content.extend(images.iter().map(|i| {
                    json!({"type": "image", "source": {
                        "type": "base64", "media_type": i.media_type, "data": i.data,
                    }})
                }));
                if !text.is_empty() {
                    content.push(json!({ "type": "text", "text": text }));
                }
                json!({ "role": "user", "content": content })
            }
            Message::Assistant(a) => {
                let content: Vec<Value> = a
                    .content
                    .iter()
                    .map(|b| match b {
                        ContentBlock::Text { text } => json!({ "type": "text", "text": text }),
                        ContentBlock::Thinking { thinking, signature } => {
                            json!({ "type": "thinking", "thinking": thinking, "signature": signature })
                        }
                        ContentBlock::RedactedThinking { data } => {
                            json!({ "type": "redacted_thinking", "data": data })
                        }
                        ContentBlock::ToolUse { id, name, input } => {
                            json!({ "type": "tool_use", "id": id, "name": name, "input": input })
                        }
                        ContentBlock::ServerToolUse { id, name, input } => {
                            json!({ "type": "server_tool_use", "id": id, "name": name, "input": input })
                        }
                        ContentBlock::WebSearchToolResult {
                            tool_use_id,
                            content,
                        } => json!({
                            "type": "web_search_tool_result",
                            "tool_use_id": tool_use_id,
                            "content": content,
                        }),
                    })
                    .collect();
                json!({ "role": "assistant", "content": content })
            }
        })
        .collect();
    let mut marked = 0;
    for m in messages.iter_mut().rev() {
        if marked == 2 {
            break;
        }
        if m["role"] == "user"
            && let Some(last) = m["content"].as_array_mut().and_then(|c| c.last_mut())
        {
            last["cache_control"] = cache.clone();
            marked += 1;
        }
    }
    let mut body = json!({
        "model": req.model,
        "max_tokens": req.max_tokens,
        "messages": messages,
        "stream": true,
    });
    if !req.system.is_empty() {
        body["system"] = json!([{ "type": "text", "text": req.system, "cache_control": cache }]);
    }
    if !tools.is_empty() {
        body["tools"] = Value::Array(tools);
    }
    body
}

/// The OpenAI Chat Completions body. Thinking is not sent back: compatible
/// servers do not accept it.
pub fn openai_body(req: &ModelRequest) -> Value {
    let mut messages = Vec::new();
    if !req.system.is_empty() {
        messages.push(json!({ "role": "system", "content": req.system }));
    }
    for m in &req.messages {
        match m {
            Message::User {
                text,
                tool_results,
                images,
            } => {
                for r in tool_results {
                    let content = if r.is_error {
                        format!("Error: {}", r.content)
                    } else {
                        r.content.clone()
                    };
                    messages.push(json!({ "role": "tool", "tool_call_id": r.tool_use_id, "content": content }));
                }
                // Tool messages carry text only: their images follow in a
                // user message, each after a line saying whose it is.
                let mut parts = Vec::new();
                for r in tool_results.iter().filter(|r| !r.images.is_empty()) {
                    parts.push(json!({"type": "text", "text": format!("Image(s) from tool call {}:", r.tool_use_id)}));
                    parts.extend(r.images.iter().map(|i| {
                        json!({"type": "image_url", "image_url": {"url": format!("data:{};base64,{}", i.media_type, i.data)}})
                    }));
                }
                if !parts.is_empty() {
                    messages.push(json!({ "role": "user", "content": parts }));
                }
                if !images.is_empty() {
                    let mut parts: Vec<Value> = images
                        .iter()
                        .map(|i| {
                            json!({"type": "image_url", "image_url": {"url": format!("data:{};base64,{}", i.media_type, i.data)}})
                        })
                        .collect();
                    if !text.is_empty() {
                        parts.push(json!({"type": "text", "text": text}));
                    }
                    messages.push(json!({ "role": "user", "content": parts }));
                } else if !text.is_empty() {
                    messages.push(json!({ "role": "user", "content": text }));
                }
            }
            Message::Assistant(a) => {
                let calls: Vec<Value> = a
                    .tool_uses()
                    .map(|(id, name, input)| {
                        json!({
                            "id": id,
                            "type": "function",
                            "function": { "name": name, "arguments": input.to_string() },
                        })
                    })
                    .collect();
                let text = a.text();
                let mut msg = json!({ "role": "assistant", "content": if text.is_empty() { Value::Null } else { Value::String(text) } });
                if !calls.is_empty() {
                    msg["tool_calls"] = Value::Array(calls);
                }
                messages.push(msg);
            }
        }
    }
    let mut body = json!({
        "model": req.model,
        "messages": messages,
        "max_tokens": req.max_tokens,
        "stream": true,
        "stream_options": { "include_usage": true },
    });
    if !req.tools.is_empty() {
        body["tools"] = req
            .tools
            .iter()
            .map(|t| {
                json!({
                    "type": "function",
                    "function": { "name": t.name, "description": t.description, "parameters": t.input_schema },
                })
            })
            .collect();
    }
    body
}

/// What an error answer from a model server means for the agent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ApiFailure {
    /// Try again later (429, 5xx, 529, overloaded).
    Retryable,
    /// The key is missing, wrong or lacks permission.
    Auth,
    /// The model name is unknown to the server.
    UnknownModel,
    /// The prompt does not fit the model's window: compact, then retry once.
    ContextTooLong,
    /// Anything else the request got wrong; not worth retrying.
    Invalid,
}

/// Classifies an HTTP error status and body from either protocol.
pub fn classify(status: u16, body: &str) -> ApiFailure {
    let lower = body.to_ascii_lowercase();
    let context = [
        "prompt is too long",
        "context_length_exceeded",
        "maximum context length",
        "context window",
        "too many tokens",
    ];
    if context.iter().any(|c| lower.contains(c)) {
        return ApiFailure::ContextTooLong;
    }
    match status {
        401 | 403 => ApiFailure::Auth,
        404 => ApiFailure::UnknownModel,
        408 | 409 | 425 | 429 | 500..=599 => ApiFailure::Retryable,
        400 if lower.contains("model")
            && (lower.contains("not found") || lower.contains("does not exist")) =>
        {
            ApiFailure::UnknownModel
        }
        _ => ApiFailure::Invalid,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::{StopReason, Usage};

    fn conversation() -> ModelRequest {
        let assistant = AssistantMessage {
            content: vec![
                ContentBlock::Thinking {
                    thinking: "plan".into(),
                    signature: "sig".into(),
                },
                ContentBlock::Text {
                    text: "Running it.".into(),
                },
                ContentBlock::ToolUse {
                    id: "t1".into(),
                    name: "bash".into(),
                    input: json!({"command": "ls"}),
                },
            ],
            stop_reason: StopReason::ToolUse,
            usage: Usage::default(),
        };
        ModelRequest {
            model: "m".into(),
            system: "You are cordon.".into(),
            messages: vec![
                Message::user("list files"),
                Message::Assistant(assistant),
                Message::tool_results(vec![ToolResult {
                    tool_use_id: "t1".into(),
                    content: "a\nb".into(),
                    is_error: false,
                    images: Vec::new(),
                }]),
            ],
            tools: vec![
                ToolSpec {
                    name: "bash".into(),
                    description: "run".into(),
                    input_schema: json!({"type":"object"}),
                },
                ToolSpec {
                    name: "read_file".into(),
                    description: "read".into(),
                    input_schema: json!({"type":"object"}),
                },
            ],
            max_tokens: 1024,
            web_search: None,
        }
    }

    #[test]
    fn images_go_as_blocks_to_anthropic_and_as_a_user_message_to_openai() {
        let req = ModelRequest {
            model: "m".into(),
            system: String::new(),
            messages: vec![Message::tool_results(vec![ToolResult {
                tool_use_id: "c1".into(),
                content: "Screenshot.".into(),
                is_error: false,
                images: vec![cordon_tools::Image {
                    media_type: "image/png".into(),
                    data: "iVBORw0KGgo=".into(),
                }],
            }])],
            tools: vec![],
            max_tokens: 10,
            web_search: None,
        };
        let a = anthropic_body(&req);
        let result = &a["messages"][0]["content"][0];
        assert_eq!(
            result["content"][0],
            json!({"type": "text", "text": "Screenshot."})
        );
        assert_eq!(
            result["content"][1]["source"],
            json!({"type": "base64", "media_type": "image/png", "data": "iVBORw0KGgo="})
        );
        let o = openai_body(&req);
        assert_eq!(o["messages"][0]["role"], "tool");
        assert_eq!(o["messages"][0]["content"], "Screenshot.");
        assert_eq!(o["messages"][1]["role"], "user");
        assert_eq!(
            o["messages"][1]["content"][1]["image_url"]["url"],
            "data:image/png;base64,iVBORw0KGgo="
        );
    }

    #[test]
    fn anthropic_body_passes_thinking_back_and_marks_cache_breakpoints() {
        let b = anthropic_body(&conversation());
        assert_eq!(b["stream"], true);
        assert_eq!(b["system"][0]["cache_control"]["type"], "ephemeral");
        assert!(b["tools"][0].get("cache_control").is_none());
        assert_eq!(b["tools"][1]["cache_control"]["type"], "ephemeral");
        let msgs = b["messages"].as_array().unwrap();
        assert_eq!(
            msgs[1]["content"][0],
            json!({"type":"thinking","thinking":"plan","signature":"sig"})
        );
        assert_eq!(msgs[1]["content"][2]["input"], json!({"command":"ls"}));
        assert_eq!(msgs[2]["content"][0]["type"], "tool_result");
        assert_eq!(msgs[2]["content"][0]["tool_use_id"], "t1");
        // Both user turns carry a breakpoint; at most four in all.
        assert_eq!(msgs[0]["content"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(msgs[2]["content"][0]["cache_control"]["type"], "ephemeral");
        assert_eq!(b.to_string().matches("cache_control").count(), 4);
    }

    #[test]
    fn openai_body_uses_tool_messages_and_string_arguments() {
        let b = openai_body(&conversation());
        let msgs = b["messages"].as_array().unwrap();
        assert_eq!(
            msgs[0],
            json!({"role":"system","content":"You are cordon."})
        );
        assert_eq!(
            msgs[2]["tool_calls"][0]["function"]["arguments"],
            "{\"command\":\"ls\"}"
        );
        assert_eq!(msgs[2]["content"], "Running it.");
        assert_eq!(
            msgs[3],
            json!({"role":"tool","tool_call_id":"t1","content":"a\nb"})
        );
        assert_eq!(b["tools"][1]["function"]["name"], "read_file");
        assert_eq!(b["stream_options"]["include_usage"], true);
        assert!(
            !b.to_string().contains("plan"),
            "thinking is not sent to compatible servers"
        );
    }

    #[test]
    fn errors_are_classified_for_both_protocols() {
        let anth =
            |t: &str, m: &str| json!({"type":"error","error":{"type":t,"message":m}}).to_string();
        assert_eq!(
            classify(401, &anth("authentication_error", "invalid x-api-key")),
            ApiFailure::Auth
        );
        assert_eq!(
            classify(404, &anth("not_found_error", "model: nope")),
            ApiFailure::UnknownModel
        );
        assert_eq!(
            classify(
                400,
                &anth(
                    "invalid_request_error",
                    "prompt is too long: 250000 tokens > 200000 maximum"
                )
            ),
            ApiFailure::ContextTooLong
        );
        assert_eq!(
            classify(529, &anth("overloaded_error", "Overloaded")),
            ApiFailure::Retryable
        );
        assert_eq!(
            classify(429, &anth("rate_limit_error", "slow down")),
            ApiFailure::Retryable
        );
        let oai = |code: &str, m: &str| {
            json!({"error":{"message":m,"type":"invalid_request_error","code":code}}).to_string()
        };
        assert_eq!(
            classify(
                400,
                &oai(
                    "context_length_exceeded",
                    "This model's maximum context length is 8192 tokens"
                )
            ),
            ApiFailure::ContextTooLong
        );
        assert_eq!(
            classify(400, &oai("model_not_found", "The model `x` does not exist")),
            ApiFailure::UnknownModel
        );
        assert_eq!(
            classify(400, &oai("invalid_value", "bad temperature")),
            ApiFailure::Invalid
        );
        assert_eq!(classify(503, "upstream unavailable"), ApiFailure::Retryable);
    }
}
