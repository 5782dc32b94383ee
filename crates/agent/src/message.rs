//! The provider-neutral conversation model: what the agent keeps, logs and
//! sends, whichever wire protocol a model speaks.

use serde::{Deserialize, Serialize};
use serde_json::Value;

/// One block of an assistant message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ContentBlock {
    Text {
        text: String,
    },
    /// Extended thinking; passed back to the model intact, signature included.
    Thinking {
        thinking: String,
        #[serde(default, skip_serializing_if = "String::is_empty")]
        signature: String,
    },
    RedactedThinking {
        data: String,
    },
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    /// A tool the provider ran itself (Anthropic's web search): kept and
    /// sent back as it came, never run here.
    ServerToolUse {
        id: String,
        name: String,
        input: Value,
    },
    /// The provider's result of a [`ContentBlock::ServerToolUse`] search:
    /// opaque to cordon (its pages come encrypted), passed back intact.
    WebSearchToolResult {
        tool_use_id: String,
        content: Value,
    },
}

/// A page a web search found, as far as cordon reads the provider's
/// result: what a front end shows.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize)]
pub struct SearchHit {
    pub url: String,
    #[serde(default)]
    pub title: String,
}

/// The pages of a [`ContentBlock::WebSearchToolResult`]'s `content`, or
/// the error it reports instead.
pub fn search_hits(content: &Value) -> Result<Vec<SearchHit>, String> {
    #[derive(Deserialize)]
    struct Failure {
        error_code: String,
    }
    match Vec::<SearchHit>::deserialize(content) {
        Ok(hits) => Ok(hits),
        Err(_) => Err(Failure::deserialize(content)
            .map(|f| f.error_code)
            .unwrap_or_else(|_| "an unreadable result".into())),
    }
}

/// A search's result in lines for a person: a page to a line, or why it
/// failed.
pub fn search_summary(content: &Value) -> (String, bool) {
    match search_hits(content) {
        Ok(hits) if hits.is_empty() => ("No results.".into(), false),
        Ok(hits) => (
            hits.iter()
                .map(|h| {
                    if h.title.is_empty() {
                        h.url.clone()
                    } else {
                        format!("{} — {}", h.title, h.url)
                    }
                })
                .collect::<Vec<_>>()
                .join("\n"),
            false,
        ),
        Err(code) => (format!("The search failed: {code}."), true),
    }
}

/// Why the model stopped.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    ToolUse,
    MaxTokens,
    StopSequence,
    Refusal,
    PauseTurn,
    /// A reason this version does not know, kept so nothing is lost
    /// (read from a log, too: a newer cordon may know more).
    #[serde(other)]
    Other,
}

impl StopReason {
    pub fn from_anthropic(s: &str) -> Self {
        match s {
            "end_turn" => StopReason::EndTurn,
            "tool_use" => StopReason::ToolUse,
            "max_tokens" => StopReason::MaxTokens,
            "stop_sequence" => StopReason::StopSequence,
            "refusal" => StopReason::Refusal,
            "pause_turn" => StopReason::PauseTurn,
            _ => StopReason::Other,
        }
    }

    pub fn from_openai(s: &str) -> Self {
        match s {
            "stop" => StopReason::EndTurn,
            "tool_calls" | "function_call" => StopReason::ToolUse,
            "length" => StopReason::MaxTokens,
            "content_filter" => StopReason::Refusal,
            _ => StopReason::Other,
        }
    }
}

/// Token accounting as reported by the API.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    pub input_tokens: u64,
    pub output_tokens: u64,
    /// Prompt tokens served from the cache.
    pub cache_read_tokens: u64,
    /// Prompt tokens written to the cache.
    pub cache_write_tokens: u64,
}

/// Usage adds field by field: a turn's is its requests', a session's its
/// turns'. Saturating: the figures come from servers and logs, and a
/// wrong one must not panic.
impl std::ops::AddAssign for Usage {
    fn add_assign(&mut self, u: Usage) {
        self.input_tokens = self.input_tokens.saturating_add(u.input_tokens);
        self.output_tokens = self.output_tokens.saturating_add(u.output_tokens);
        self.cache_read_tokens = self.cache_read_tokens.saturating_add(u.cache_read_tokens);
        self.cache_write_tokens = self.cache_write_tokens.saturating_add(u.cache_write_tokens);
    }
}

impl Usage {
    /// Everything the request put in front of the model.
    pub fn prompt_tokens(&self) -> u64 {
        self.input_tokens
            .saturating_add(self.cache_read_tokens)
            .saturating_add(self.cache_write_tokens)
    }
}

/// A complete assistant message, assembled from a stream.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AssistantMessage {
    pub content: Vec<ContentBlock>,
    pub stop_reason: StopReason,
    pub usage: Usage,
}

impl AssistantMessage {
    /// The tool calls, in order.
    pub fn tool_uses(&self) -> impl Iterator<Item = (&str, &str, &Value)> {
        self.content.iter().filter_map(|b| match b {
            ContentBlock::ToolUse { id, name, input } => Some((id.as_str(), name.as_str(), input)),
            _ => None,
        })
    }

    /// All text blocks joined.
    pub fn text(&self) -> String {
        self.content
            .iter()
            .filter_map(|b| match b {
                ContentBlock::Text { text } => Some(text.as_str()),
                _ => None,
            })
            .collect()
    }
}

/// What a stream yields as it arrives, for front ends to render live.
#[derive(Debug, Clone, PartialEq)]
pub enum StreamDelta {
    Text(String),
    Thinking(String),
    /// A tool call began; its input follows as JSON fragments.
    ToolUseStart {
        id: String,
        name: String,
    },
    ToolInput(String),
    /// The request failed before its answer was complete and is being
    /// sent again: whatever was streamed so far is void.
    Retrying {
        attempt: u32,
        wait: std::time::Duration,
        reason: String,
    },
}
