//! Pieces shared by both protocols: which one a request used, and what
//! both renderers frame.

use serde_json::Value;

/// Which wire protocol a request used.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    /// `POST /v1/messages`.
    Anthropic,
    /// `POST /v1/chat/completions`.
    OpenAi,
}

/// One server-sent event, before framing.
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    /// The SSE `event:` name; OpenAI streams send none.
    pub event: Option<&'static str>,
    pub data: String,
}

impl Frame {
    pub fn named(event: &'static str, data: &Value) -> Self {
        Self {
            event: Some(event),
            data: data.to_string(),
        }
    }

    pub fn data(data: impl Into<String>) -> Self {
        Self {
            event: None,
            data: data.into(),
        }
    }

    /// The bytes on the wire, ending with the blank line that closes an event.
    pub fn encode(&self) -> String {
        match self.event {
            Some(event) => format!("event: {event}\ndata: {}\n\n", self.data),
            None => format!("data: {}\n\n", self.data),
        }
    }
}

/// Splits `text` into pieces of at most `max_chars` characters, and into at least
/// `min_parts` pieces when it is long enough, so clients must really reassemble.
pub(crate) fn split_chunks(text: &str, max_chars: usize, min_parts: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    let parts = chars
        .len()
        .div_ceil(max_chars.max(1))
        .max(min_parts)
        .min(chars.len());
    let size = chars.len().div_ceil(parts);
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// The tool input as the JSON text that is streamed. When `malformed`, the closing
/// bracket is replaced by `,"`, which no JSON parser accepts whatever the input.
pub(crate) fn tool_json(input: &Value, malformed: bool) -> String {
    let json = input.to_string();
    if malformed {
        let mut broken = json;
        broken.pop();
        broken.push_str(",\"");
        broken
    } else {
        json
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_keeps_text_and_makes_several_parts() {
        let parts = split_chunks(r#"{"command":"ls -la"}"#, 8, 3);
        assert!(parts.len() >= 3);
        assert_eq!(parts.concat(), r#"{"command":"ls -la"}"#);
        assert_eq!(split_chunks("ab", 8, 3), vec!["a", "b"]);
        assert_eq!(split_chunks("", 8, 3), vec![""]);
        assert_eq!(split_chunks("héllo wörld", 4, 1).concat(), "héllo wörld");
    }

    #[test]
    fn malformed_json_never_parses() {
        for input in [serde_json::json!({}), serde_json::json!({"a": [1, 2]})] {
            let broken = tool_json(&input, true);
            assert!(serde_json::from_str::<Value>(&broken).is_err(), "{broken}");
        }
    }
}
