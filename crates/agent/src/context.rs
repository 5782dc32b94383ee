//! What is sent to the model is a view of the history, not the history:
//! tool output older than the most recent turns is masked to a one-line
//! stub, so long sessions stay small while the full record stays in the
//! session log. (Summarising older turns when the window fills is the next
//! step, and builds on this view.)

use crate::wire::Message;

/// A rough token count for text not yet seen by the API (about four bytes
/// per token for English and code). Only an estimate: the API's own usage
/// figures are authoritative once a request has been answered.
pub fn estimate_tokens(text: &str) -> u64 {
    (text.len() as u64).div_ceil(4)
}

/// Output shorter than this is kept even when old: the stub would not save
/// anything worth the lost detail.
const MASK_MIN_BYTES: usize = 256;

/// The history as it should be sent: tool results in all but the last
/// `keep_recent` tool-result messages are replaced by a stub saying what
/// was dropped. Everything else is unchanged, in order.
pub fn view(history: &[Message], keep_recent: usize) -> Vec<Message> {
    let with_results: Vec<usize> = history
        .iter()
        .enumerate()
        .filter(
            |(_, m)| matches!(m, Message::User { tool_results, .. } if !tool_results.is_empty()),
        )
        .map(|(i, _)| i)
        .collect();
    let cutoff = with_results.len().saturating_sub(keep_recent);
    let old: std::collections::HashSet<usize> = with_results[..cutoff].iter().copied().collect();
    history
        .iter()
        .enumerate()
        .map(|(i, m)| match m {
            Message::User { text, tool_results } if old.contains(&i) => Message::User {
                text: text.clone(),
                tool_results: tool_results
                    .iter()
                    .map(|r| {
                        let mut r = r.clone();
                        if r.content.len() >= MASK_MIN_BYTES {
                            r.content = format!(
                                "[output omitted to save context: {} lines, {} bytes; run the tool again if you need it]",
                                r.content.lines().count(),
                                r.content.len()
                            );
                        }
                        r
                    })
                    .collect(),
            },
            other => other.clone(),
        })
        .collect()
}

/// Estimated tokens of a whole request's messages.
pub fn estimate_messages(messages: &[Message]) -> u64 {
    messages
        .iter()
        .map(|m| estimate_tokens(&serde_json::to_string(m).unwrap_or_default()))
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ToolResult;

    fn results(id: &str, content: &str) -> Message {
        Message::User {
            text: String::new(),
            tool_results: vec![ToolResult {
                tool_use_id: id.into(),
                content: content.into(),
                is_error: false,
            }],
        }
    }

    #[test]
    fn only_old_long_tool_output_is_masked() {
        let long = "line\n".repeat(200);
        let history = vec![
            Message::User {
                text: "task".into(),
                tool_results: vec![],
            },
            results("a", &long),
            results("b", "short"),
            results("c", &long),
            results("d", &long),
        ];
        let v = view(&history, 2);
        let content = |m: &Message| match m {
            Message::User { tool_results, .. } => tool_results.first().map(|r| r.content.clone()),
            _ => None,
        };
        assert_eq!(v.len(), history.len());
        assert_eq!(content(&v[0]), None);
        assert_eq!(
            content(&v[1]).unwrap(),
            "[output omitted to save context: 200 lines, 1000 bytes; run the tool again if you need it]"
        );
        assert_eq!(content(&v[2]).unwrap(), "short");
        assert_eq!(content(&v[3]).unwrap(), long);
        assert_eq!(content(&v[4]).unwrap(), long);
        // The history itself is untouched.
        assert_eq!(content(&history[1]).unwrap(), long);
        assert!(estimate_messages(&v) < estimate_messages(&history));
    }

    #[test]
    fn estimates_round_up() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("abcde"), 2);
    }
}
