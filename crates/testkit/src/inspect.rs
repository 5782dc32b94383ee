//! What a recorded request says: the tool results it carries, the tool
//! calls it leaves unanswered, and whether it meets a turn's expectations.

use serde_json::Value;

use crate::scenario::Turn;
use crate::wire::Protocol;

/// The tool-result ids the request's last user turn carries: Anthropic's
/// `tool_result` blocks in the last user message, OpenAI's `tool` messages after
/// the last assistant message.
pub(crate) fn tool_results(protocol: Protocol, request: &Value) -> Vec<String> {
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return Vec::new();
    };
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
    match protocol {
        Protocol::Anthropic => messages
            .iter()
            .rev()
            .find(|m| role(m).as_deref() == Some("user"))
            .and_then(|m| m.get("content"))
            .and_then(Value::as_array)
            .map(|blocks| {
                blocks
                    .iter()
                    .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_result"))
                    .filter_map(|b| b.get("tool_use_id").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default(),
        Protocol::OpenAi => messages
            .iter()
            .rev()
            .take_while(|m| role(m).as_deref() != Some("assistant"))
            .filter(|m| role(m).as_deref() == Some("tool"))
            .filter_map(|m| m.get("tool_call_id").and_then(Value::as_str))
            .map(str::to_owned)
            .collect(),
    }
}

/// Tool calls in the request's history that the message right after them
/// does not answer: both real APIs reject such a request. (A call left out
/// of the history altogether, as a compaction does, is fine for them too.)
pub(crate) fn dangling_tool_calls(protocol: Protocol, request: &Value) -> Vec<String> {
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return Vec::new();
    };
    let role = |m: &Value| m.get("role").and_then(Value::as_str).map(str::to_owned);
    let strings = |v: Option<&Value>, kind: Option<&str>, key: &str| -> Vec<String> {
        v.and_then(Value::as_array)
            .map(|items| {
                items
                    .iter()
                    .filter(|b| kind.is_none() || b.get("type").and_then(Value::as_str) == kind)
                    .filter_map(|b| b.get(key).and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut missing = Vec::new();
    for (i, m) in messages.iter().enumerate() {
        if role(m).as_deref() != Some("assistant") {
            continue;
        }
        let (calls, answered) = match protocol {
            Protocol::Anthropic => (
                strings(m.get("content"), Some("tool_use"), "id"),
                strings(
                    messages.get(i + 1).and_then(|n| n.get("content")),
                    Some("tool_result"),
                    "tool_use_id",
                ),
            ),
            Protocol::OpenAi => (
                strings(m.get("tool_calls"), None, "id"),
                messages[i + 1..]
                    .iter()
                    .take_while(|n| role(n).as_deref() == Some("tool"))
                    .filter_map(|n| n.get("tool_call_id").and_then(Value::as_str))
                    .map(str::to_owned)
                    .collect(),
            ),
        };
        missing.extend(calls.into_iter().filter(|c| !answered.contains(c)));
    }
    missing
}

/// The ids in `ids` that `answered` has no result for.
fn without_result<'a>(ids: &'a [String], answered: &[String]) -> Vec<&'a str> {
    ids.iter()
        .filter(|id| !answered.contains(id))
        .map(String::as_str)
        .collect()
}

pub(crate) fn check_expectations(
    turn: &Turn,
    request: &Value,
    raw_body: &str,
    answered: &[String],
) -> Vec<(String, String)> {
    let mut failures = Vec::new();
    let missing = without_result(&turn.expect_tool_results, answered);
    if !missing.is_empty() {
        failures.push((
            "expect_tool_results".into(),
            format!(
                "the last user turn lacks results for {} (it has: [{}])",
                missing.join(", "),
                answered.join(", ")
            ),
        ));
    }
    for needle in &turn.expect_contains {
        // Strings are searched after JSON unescaping, so quotes and newlines in
        // the needle match what the client meant to send.
        if !raw_body.contains(needle.as_str()) && !value_contains(request, needle) {
            failures.push((
                "expect_contains".into(),
                format!("the request does not contain {needle:?}"),
            ));
        }
    }
    for needle in &turn.expect_lacks {
        if raw_body.contains(needle.as_str()) || value_contains(request, needle) {
            failures.push((
                "expect_lacks".into(),
                format!("the request contains {needle:?}"),
            ));
        }
    }
    if let Some(max) = turn.expect_max_input_chars {
        let chars = raw_body.chars().count();
        if chars > max {
            failures.push((
                "expect_max_input_chars".into(),
                format!("the request body has {chars} characters, more than {max}"),
            ));
        }
    }
    failures
}

fn value_contains(value: &Value, needle: &str) -> bool {
    match value {
        Value::String(s) => s.contains(needle),
        Value::Array(items) => items.iter().any(|v| value_contains(v, needle)),
        Value::Object(map) => map
            .iter()
            .any(|(k, v)| k.contains(needle) || value_contains(v, needle)),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_results_are_read_per_protocol() {
        let anthropic = serde_json::json!({"messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "old"}]},
            {"role": "assistant", "content": []},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1"}, {"type": "text", "text": "hi"}]},
        ]});
        assert_eq!(
            tool_results(Protocol::Anthropic, &anthropic),
            vec!["toolu_1"]
        );
        let openai = serde_json::json!({"messages": [
            {"role": "tool", "tool_call_id": "old"},
            {"role": "assistant", "tool_calls": []},
            {"role": "tool", "tool_call_id": "call_1"},
            {"role": "tool", "tool_call_id": "call_2"},
        ]});
        let mut ids = tool_results(Protocol::OpenAi, &openai);
        ids.sort();
        assert_eq!(ids, vec!["call_1", "call_2"]);
    }
}
