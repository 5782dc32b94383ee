//! The provider-neutral scenario: what the scripted model answers, turn by turn,
//! what it expects to receive, and which faults it injects.
//!
//! One scenario drives both wire protocols, so a test of the agent loop can run
//! unchanged against the Anthropic and the OpenAI provider.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::Error;

/// An ordered list of turns; each model request consumes the next turn once it
/// has been served without a fault.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Scenario {
    /// The turns, in the order requests are expected.
    #[serde(default)]
    pub turns: Vec<Turn>,
    /// Check that every tool call in a request's history is answered by tool
    /// results in the message right after it. On by default: both real APIs
    /// reject a history with a dangling tool call, so an agent that produces
    /// one is broken.
    #[serde(default = "default_true")]
    pub check_tool_results: bool,
    /// Longest piece of text or tool JSON sent in one delta. Small values make the
    /// client's reassembly work harder.
    #[serde(default = "default_chunk_chars")]
    pub chunk_chars: usize,
    /// Report each request's size (characters / 4) as its input tokens when a
    /// turn scripts no input figure, as a real server counts the prompt, so
    /// a client's context tracking sees growing figures.
    #[serde(default)]
    pub count_input_tokens: bool,
    /// What `GET /v1/models` lists, as an OpenAI-compatible server says
    /// which models it serves (one, `scripted`, by default).
    #[serde(default = "default_models")]
    pub models: Vec<String>,
}

fn default_models() -> Vec<String> {
    vec!["scripted".into()]
}

fn default_true() -> bool {
    true
}

fn default_chunk_chars() -> usize {
    8
}

/// One model response, with the checks made on the request that asks for it and
/// the faults served before it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// The reply's content blocks, in order.
    #[serde(default)]
    pub content: Vec<Block>,
    /// Why the reply stops; when absent, `tool_use` if the reply calls a tool and
    /// `end_turn` otherwise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stop_reason: Option<StopReason>,
    /// Token figures reported for the reply.
    #[serde(default)]
    pub usage: Usage,
    /// The request's last user turn must carry tool results for these ids.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expect_tool_results: Vec<String>,
    /// Each string must occur somewhere in the request body.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expect_contains: Vec<String>,
    /// No string may occur anywhere in the request body.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub expect_lacks: Vec<String>,
    /// The request body must be at most this many characters long: a proxy for
    /// the context budget that compaction must keep to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expect_max_input_chars: Option<usize>,
    /// Faults served, in order, before the reply; each covers `times` attempts.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub faults: Vec<Fault>,
}

/// A content block of a reply.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Block {
    /// Visible text.
    Text { text: String },
    /// Extended thinking; OpenAI-style servers send it as `reasoning_content`.
    Thinking {
        thinking: String,
        #[serde(default = "default_signature")]
        signature: String,
    },
    /// A tool call.
    #[serde(alias = "tool_call")]
    ToolUse {
        id: String,
        name: String,
        input: Value,
    },
    /// A web search the provider runs itself (Anthropic's server tool):
    /// a `server_tool_use` block, then its `web_search_tool_result` with
    /// these pages (or `error_code` instead). OpenAI-style servers have no
    /// such thing and send nothing for it.
    WebSearch {
        id: String,
        query: String,
        #[serde(default)]
        results: Vec<SearchResult>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error_code: Option<String>,
    },
}

/// One page a scripted web search found.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SearchResult {
    pub url: String,
    pub title: String,
}

fn default_signature() -> String {
    // Real signatures are opaque base64; the agent must only pass them back intact.
    "c2NyaXB0ZWQtc2lnbmF0dXJl".to_owned()
}

/// Why a reply stopped, in Anthropic's terms; mapped to `finish_reason` for OpenAI.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StopReason {
    EndTurn,
    ToolUse,
    MaxTokens,
    StopSequence,
    Refusal,
    /// The provider paused its own long turn (Anthropic only).
    PauseTurn,
}

impl StopReason {
    /// The Anthropic `stop_reason` string.
    pub fn anthropic(self) -> &'static str {
        match self {
            Self::EndTurn => "end_turn",
            Self::ToolUse => "tool_use",
            Self::MaxTokens => "max_tokens",
            Self::StopSequence => "stop_sequence",
            Self::Refusal => "refusal",
            Self::PauseTurn => "pause_turn",
        }
    }

    /// The OpenAI `finish_reason` string.
    pub fn openai(self) -> &'static str {
        match self {
            Self::EndTurn | Self::StopSequence | Self::PauseTurn => "stop",
            Self::ToolUse => "tool_calls",
            Self::MaxTokens => "length",
            Self::Refusal => "content_filter",
        }
    }
}

/// Token figures, in Anthropic's terms (`input_tokens` excludes cached tokens).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Usage {
    #[serde(default)]
    pub input_tokens: u64,
    #[serde(default)]
    pub output_tokens: u64,
    #[serde(default)]
    pub cache_read_input_tokens: u64,
    #[serde(default)]
    pub cache_creation_input_tokens: u64,
}

/// A fault injected in place of (or into) the reply for `times` attempts.
///
/// An attempt whose fault breaks the response (an error status, an in-stream
/// error, a disconnect, malformed tool JSON) does not consume the turn, so the
/// client's retry gets the next fault or the real reply. A fault that only slows
/// the stream (`chunk_delay_ms` alone) serves the full reply and consumes the turn.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Fault {
    /// How many consecutive attempts get this fault.
    #[serde(default = "default_times")]
    pub times: u32,
    /// Answer with this HTTP status and the provider's error body (429, 500, 529…).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_status: Option<u16>,
    /// With `http_status`: a `retry-after` header, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_after: Option<u64>,
    /// Send this many events, then an in-stream `overloaded_error` and end the stream.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream_error: Option<usize>,
    /// Send this many events, then drop the connection without ending the body.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub disconnect_after: Option<usize>,
    /// Tool input chunks that do not concatenate to valid JSON.
    #[serde(default, skip_serializing_if = "is_false")]
    pub malformed_tool_json: bool,
    /// Wait this long before each streamed event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub chunk_delay_ms: Option<u64>,
    /// 401 with the provider's authentication error.
    #[serde(default, skip_serializing_if = "is_false")]
    pub auth_error: bool,
    /// 404 naming the requested model.
    #[serde(default, skip_serializing_if = "is_false")]
    pub model_not_found: bool,
    /// 400 with the provider's context-length error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context_too_long: Option<ContextTooLong>,
}

fn default_times() -> u32 {
    1
}

fn is_false(b: &bool) -> bool {
    !*b
}

/// The figures quoted in a context-too-long error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ContextTooLong {
    #[serde(default = "default_too_long_tokens")]
    pub tokens: u64,
    #[serde(default = "default_too_long_maximum")]
    pub maximum: u64,
}

fn default_too_long_tokens() -> u64 {
    210_000
}

fn default_too_long_maximum() -> u64 {
    200_000
}

impl Default for ContextTooLong {
    fn default() -> Self {
        Self {
            tokens: default_too_long_tokens(),
            maximum: default_too_long_maximum(),
        }
    }
}

impl Scenario {
    /// An empty scenario with default settings.
    pub fn new() -> Self {
        Self {
            turns: Vec::new(),
            check_tool_results: true,
            chunk_chars: default_chunk_chars(),
            count_input_tokens: false,
            models: default_models(),
        }
    }

    /// Lists `models` at `GET /v1/models` (none: an empty list).
    pub fn serving_models<S: Into<String>>(mut self, models: impl IntoIterator<Item = S>) -> Self {
        self.models = models.into_iter().map(Into::into).collect();
        self
    }

    /// Reports input tokens from each request's size (see `count_input_tokens`).
    pub fn counting_input_tokens(mut self) -> Self {
        self.count_input_tokens = true;
        self
    }

    /// Appends a turn.
    pub fn turn(mut self, turn: Turn) -> Self {
        self.turns.push(turn);
        self
    }

    /// Parses a JSON scenario.
    pub fn from_json_str(text: &str) -> Result<Self, Error> {
        let scenario: Self = serde_json::from_str(text).map_err(Error::Json)?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Parses a TOML scenario.
    pub fn from_toml_str(text: &str) -> Result<Self, Error> {
        let scenario: Self = toml::from_str(text).map_err(Error::Toml)?;
        scenario.validate()?;
        Ok(scenario)
    }

    /// Loads a scenario file: TOML when the name ends in `.toml`, JSON otherwise.
    pub fn from_file(path: impl AsRef<Path>) -> Result<Self, Error> {
        let path = path.as_ref();
        let text = std::fs::read_to_string(path).map_err(|source| Error::Read {
            path: path.to_owned(),
            source,
        })?;
        if path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("toml"))
        {
            Self::from_toml_str(&text)
        } else {
            Self::from_json_str(&text)
        }
    }

    /// Rejects scenarios whose meaning would be ambiguous, so a typo in a test
    /// fails loudly instead of silently serving something else.
    pub fn validate(&self) -> Result<(), Error> {
        if self.chunk_chars == 0 {
            return Err(Error::Invalid("chunk_chars must be at least 1".into()));
        }
        for (t, turn) in self.turns.iter().enumerate() {
            for (f, fault) in turn.faults.iter().enumerate() {
                let at = format!("turn {t} fault {f}");
                if fault.times == 0 {
                    return Err(Error::Invalid(format!("{at}: times must be at least 1")));
                }
                let kinds = [
                    fault.http_status.is_some(),
                    fault.stream_error.is_some(),
                    fault.disconnect_after.is_some(),
                    fault.malformed_tool_json,
                    fault.auth_error,
                    fault.model_not_found,
                    fault.context_too_long.is_some(),
                ]
                .iter()
                .filter(|k| **k)
                .count();
                if kinds > 1 {
                    return Err(Error::Invalid(format!(
                        "{at}: give at most one of http_status, stream_error, disconnect_after, \
                         malformed_tool_json, auth_error, model_not_found, context_too_long"
                    )));
                }
                if kinds == 0 && fault.chunk_delay_ms.is_none() {
                    return Err(Error::Invalid(format!("{at}: the fault does nothing")));
                }
                if fault.retry_after.is_some() && fault.http_status.is_none() {
                    return Err(Error::Invalid(format!(
                        "{at}: retry_after needs http_status"
                    )));
                }
                if fault.malformed_tool_json
                    && !turn
                        .content
                        .iter()
                        .any(|b| matches!(b, Block::ToolUse { .. }))
                {
                    return Err(Error::Invalid(format!(
                        "{at}: malformed_tool_json on a turn without tool calls"
                    )));
                }
            }
        }
        Ok(())
    }
}

impl Turn {
    /// A turn that answers with text and ends the turn.
    pub fn text(text: impl Into<String>) -> Self {
        Self::default().with_text(text)
    }

    /// Appends a text block.
    pub fn with_text(mut self, text: impl Into<String>) -> Self {
        self.content.push(Block::Text { text: text.into() });
        self
    }

    /// Appends a thinking block with a fixed signature.
    pub fn with_thinking(mut self, thinking: impl Into<String>) -> Self {
        self.content.push(Block::Thinking {
            thinking: thinking.into(),
            signature: default_signature(),
        });
        self
    }

    /// Appends a tool call.
    pub fn with_tool_call(
        mut self,
        id: impl Into<String>,
        name: impl Into<String>,
        input: Value,
    ) -> Self {
        self.content.push(Block::ToolUse {
            id: id.into(),
            name: name.into(),
            input,
        });
        self
    }

    /// Appends a web search the provider ran, with the pages it found.
    pub fn with_web_search(
        mut self,
        id: impl Into<String>,
        query: impl Into<String>,
        results: &[(&str, &str)],
    ) -> Self {
        self.content.push(Block::WebSearch {
            id: id.into(),
            query: query.into(),
            results: results
                .iter()
                .map(|(url, title)| SearchResult {
                    url: url.to_string(),
                    title: title.to_string(),
                })
                .collect(),
            error_code: None,
        });
        self
    }

    /// Sets the stop reason explicitly.
    pub fn stop(mut self, reason: StopReason) -> Self {
        self.stop_reason = Some(reason);
        self
    }

    /// Sets the usage figures.
    pub fn usage(mut self, usage: Usage) -> Self {
        self.usage = usage;
        self
    }

    /// Requires tool results for these ids in the request's last user turn.
    pub fn expect_tool_results<I, S>(mut self, ids: I) -> Self
    where
        I: IntoIterator<Item = S>,
        S: Into<String>,
    {
        self.expect_tool_results
            .extend(ids.into_iter().map(Into::into));
        self
    }

    /// Requires a string somewhere in the request body.
    pub fn expect_contains(mut self, text: impl Into<String>) -> Self {
        self.expect_contains.push(text.into());
        self
    }

    /// Requires a string nowhere in the request body (a conversation
    /// rewound past it).
    pub fn expect_lacks(mut self, text: impl Into<String>) -> Self {
        self.expect_lacks.push(text.into());
        self
    }

    /// Caps the request body's length in characters.
    pub fn expect_max_input_chars(mut self, max: usize) -> Self {
        self.expect_max_input_chars = Some(max);
        self
    }

    /// Adds a fault served before the reply.
    pub fn fault(mut self, fault: Fault) -> Self {
        self.faults.push(fault);
        self
    }

    /// The stop reason the reply is served with.
    pub fn effective_stop_reason(&self) -> StopReason {
        self.stop_reason.unwrap_or_else(|| {
            if self.tool_call_ids().next().is_some() {
                StopReason::ToolUse
            } else {
                StopReason::EndTurn
            }
        })
    }

    /// The ids of the tool calls in the reply.
    pub fn tool_call_ids(&self) -> impl Iterator<Item = &str> {
        self.content.iter().filter_map(|b| match b {
            Block::ToolUse { id, .. } => Some(id.as_str()),
            _ => None,
        })
    }
}

impl Fault {
    /// An error status with the provider's error body.
    pub fn http(status: u16) -> Self {
        Self {
            times: 1,
            http_status: Some(status),
            ..Self::default()
        }
    }

    /// An in-stream `overloaded_error` after `events` events.
    pub fn stream_error(events: usize) -> Self {
        Self {
            times: 1,
            stream_error: Some(events),
            ..Self::default()
        }
    }

    /// A dropped connection after `events` events.
    pub fn disconnect_after(events: usize) -> Self {
        Self {
            times: 1,
            disconnect_after: Some(events),
            ..Self::default()
        }
    }

    /// Tool input that is not valid JSON.
    pub fn malformed_tool_json() -> Self {
        Self {
            times: 1,
            malformed_tool_json: true,
            ..Self::default()
        }
    }

    /// A slow stream that still delivers the full reply.
    pub fn chunk_delay_ms(ms: u64) -> Self {
        Self {
            times: 1,
            chunk_delay_ms: Some(ms),
            ..Self::default()
        }
    }

    /// A 401 authentication error.
    pub fn auth_error() -> Self {
        Self {
            times: 1,
            auth_error: true,
            ..Self::default()
        }
    }

    /// A 404 for the requested model.
    pub fn model_not_found() -> Self {
        Self {
            times: 1,
            model_not_found: true,
            ..Self::default()
        }
    }

    /// A 400 context-length error quoting these figures.
    pub fn context_too_long(tokens: u64, maximum: u64) -> Self {
        Self {
            times: 1,
            context_too_long: Some(ContextTooLong { tokens, maximum }),
            ..Self::default()
        }
    }

    /// Adds a `retry-after` header to an `http_status` fault.
    pub fn retry_after(mut self, seconds: u64) -> Self {
        self.retry_after = Some(seconds);
        self
    }

    /// Serves this fault on this many consecutive attempts.
    pub fn times(mut self, times: u32) -> Self {
        self.times = times;
        self
    }

    /// Whether the attempt fails, leaving the turn to be served again.
    pub fn breaks_reply(&self) -> bool {
        self.http_status.is_some()
            || self.stream_error.is_some()
            || self.disconnect_after.is_some()
            || self.malformed_tool_json
            || self.auth_error
            || self.model_not_found
            || self.context_too_long.is_some()
    }
}
