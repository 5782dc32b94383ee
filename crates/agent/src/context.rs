//! What is sent to the model is a view of the history, not the history:
//! tool output older than the most recent turns is masked to a one-line
//! stub, so long sessions stay small while the full record stays in the
//! session log. When even that view would fill too much of the window, the
//! older part of the history is replaced by a summary the model writes
//! (compaction); the pure parts of that live here, the model call in
//! the `agent` module.

use crate::wire::{Message, ModelRequest};

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
    let masked = mask_old_output(history, keep_recent);
    drop_old_images(masked, KEEP_IMAGES)
}

/// Screenshots sent in full: older ones are replaced by a line (each is
/// about 1,600 tokens, and the model needs only the latest few).
const KEEP_IMAGES: usize = 3;

/// Tokens counted for one image, whatever its bytes: about what the APIs
/// charge for a screenshot of XGA to WXGA size.
const IMAGE_TOKENS: u64 = 1600;

fn drop_old_images(mut history: Vec<Message>, keep: usize) -> Vec<Message> {
    let mut seen = 0;
    for m in history.iter_mut().rev() {
        if let Message::User { tool_results, .. } = m {
            for r in tool_results.iter_mut().rev() {
                if r.images.is_empty() {
                    continue;
                }
                if seen >= keep {
                    r.content.push_str(&format!(
                        "\n[{} image(s) omitted to save context; take a new screenshot to see the screen]",
                        r.images.len()
                    ));
                    r.images.clear();
                } else {
                    seen += r.images.len();
                }
            }
        }
    }
    history
}

fn mask_old_output(history: &[Message], keep_recent: usize) -> Vec<Message> {
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
            Message::User {
                text,
                tool_results,
                images,
            } if old.contains(&i) => Message::User {
                text: text.clone(),
                images: images.clone(),
                tool_results: tool_results
                    .iter()
                    .map(|r| {
                        let mut r = r.clone();
                        if r.content.len() >= MASK_MIN_BYTES {
                            r.content = format!(
                                "[output omitted to save context: {}, {}; run the tool again if you need it]",
                                cordon_tools::plural(r.content.lines().count() as u64, "line"),
                                cordon_tools::plural(r.content.len() as u64, "byte")
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
    messages.iter().map(estimate_message).sum()
}

fn estimate_message(m: &Message) -> u64 {
    // Images count by what they cost, not by their base64 length.
    if let Message::User { tool_results, .. } = m
        && tool_results.iter().any(|r| !r.images.is_empty())
    {
        let mut bare = m.clone();
        let mut images = 0;
        if let Message::User { tool_results, .. } = &mut bare {
            for r in tool_results {
                images += r.images.len() as u64;
                r.images.clear();
            }
        }
        return estimate_tokens(&serde_json::to_string(&bare).unwrap_or_default())
            + images * IMAGE_TOKENS;
    }
    estimate_tokens(&serde_json::to_string(m).unwrap_or_default())
}

/// Estimated tokens of everything a request puts in front of the model.
pub fn estimate_request(req: &ModelRequest) -> u64 {
    estimate_tokens(&req.system)
        + estimate_tokens(&serde_json::to_string(&req.tools).unwrap_or_default())
        + estimate_messages(&req.messages)
}

/// Appends `m`, merging it into a trailing user message when both are user
/// messages (a cancelled turn leaves one; a compaction summary precedes
/// one) so roles keep alternating. Tool results stay first, as both APIs
/// want them right after the call. Replaying a session log goes through
/// this same function, so the history rebuilt is the one that was sent.
pub fn push_message(history: &mut Vec<Message>, m: Message) {
    match (history.last_mut(), m) {
        (
            Some(Message::User {
                text,
                tool_results,
                images,
            }),
            Message::User {
                text: more,
                tool_results: more_results,
                images: more_images,
            },
        ) => {
            tool_results.extend(more_results);
            images.extend(more_images);
            if !more.is_empty() {
                if !text.is_empty() {
                    text.push_str("\n\n");
                }
                text.push_str(&more);
            }
        }
        (_, m) => history.push(m),
    }
}

/// Replaces the first `replaced` messages by `summary` (a user message).
/// Shared by the live agent and by replay from the log.
pub fn apply_compaction(history: &mut Vec<Message>, replaced: usize, summary: Message) {
    let kept = history.split_off(replaced.min(history.len()));
    history.clear();
    history.push(summary);
    for m in kept {
        push_message(history, m);
    }
}

/// Where a history may be cut so that the part kept, preceded by a user
/// summary, is still a valid conversation: before an assistant message, or
/// before a user message that carries no tool results (results must follow
/// the call they answer, which would be gone).
fn valid_cut(history: &[Message], i: usize) -> bool {
    match history.get(i) {
        Some(Message::Assistant(_)) => true,
        Some(Message::User { tool_results, .. }) => tool_results.is_empty(),
        None => i == history.len(),
    }
}

/// How many leading messages to summarise: the smallest valid cut that
/// leaves at most `keep_tokens` (estimated) of recent history in full.
/// Always at least one message; `None` when the history is too short for
/// a summary to help.
pub fn choose_cut(history: &[Message], keep_tokens: u64) -> Option<usize> {
    if history.len() < 2 {
        return None;
    }
    let mut kept = 0u64;
    let mut best = history.len();
    for i in (1..history.len()).rev() {
        kept += estimate_message(&history[i]);
        if kept > keep_tokens {
            break;
        }
        if valid_cut(history, i) {
            best = i;
        }
    }
    Some(best)
}

/// The most recent thing the user typed, if any.
pub fn latest_prompt(history: &[Message]) -> Option<&str> {
    history.iter().rev().find_map(|m| match m {
        Message::User { text, .. } if !text.is_empty() => Some(text.as_str()),
        _ => None,
    })
}

/// What the model is asked, after the part of the history it summarises.
pub const SUMMARY_REQUEST: &str = "The conversation so far is about to be compacted to fit \
the context window: everything above will be replaced by the summary you write now, and the \
work will continue from it. Do not call any tool. Write a summary that lets you carry on \
without the earlier messages: the user's requests and constraints (quote them when they are \
short); what has been done, and what was found; files created or changed, with paths and the \
key details of their content; commands that worked, errors met and how they were resolved; \
decisions taken and why; and what remains to do next. Be specific and complete, but concise.";

/// The user message that replaces a summarised stretch of history.
pub fn summary_message(summary: &str, latest_prompt: Option<&str>) -> Message {
    let mut text = format!(
        "[This conversation was compacted to fit the context window. Summary of the earlier \
         part, written by you:]\n\n{}",
        summary.trim()
    );
    if let Some(p) = latest_prompt {
        text.push_str("\n\n[The user's latest request before this summary, verbatim:]\n");
        text.push_str(p);
    }
    Message::user(text)
}

/// The messages sent to have `history[..cut]` summarised: that part as
/// [`view`] shows it, the instruction last. If that exceeds `budget`, all
/// long tool output is masked; if it still does, the oldest messages are
/// dropped (at valid cuts), so the summary request itself fits.
pub fn summary_input(
    history: &[Message],
    cut: usize,
    budget: u64,
    keep_tool_outputs: usize,
) -> Vec<Message> {
    let mut part = view(&history[..cut], keep_tool_outputs);
    if estimate_messages(&part) > budget {
        part = view(&history[..cut], 0);
    }
    let mut start = 0;
    while estimate_messages(&part[start..]) > budget {
        match (start + 1..part.len()).find(|&i| valid_cut(&part, i)) {
            Some(next) => start = next,
            None => break,
        }
    }
    let mut out = Vec::new();
    if start > 0 {
        out.push(Message::user(format!(
            "[{start} earlier messages are omitted here because they no longer fit.]"
        )));
    }
    for m in part[start..].iter().cloned() {
        push_message(&mut out, m);
    }
    push_message(&mut out, Message::user(SUMMARY_REQUEST));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wire::ToolResult;

    fn screenshot(id: &str) -> Message {
        Message::tool_results(vec![ToolResult {
            tool_use_id: id.into(),
            content: "Screenshot.".into(),
            is_error: false,
            images: vec![cordon_tools::Image {
                media_type: "image/png".into(),
                data: "A".repeat(400_000),
            }],
        }])
    }

    #[test]
    fn only_the_latest_screenshots_are_sent_and_images_count_by_cost() {
        let history: Vec<Message> = (0..5).map(|i| screenshot(&format!("s{i}"))).collect();
        let sent = view(&history, 100);
        let kept: Vec<usize> = sent
            .iter()
            .map(|m| match m {
                Message::User { tool_results, .. } => tool_results[0].images.len(),
                _ => 0,
            })
            .collect();
        assert_eq!(kept, [0, 0, 1, 1, 1]);
        let Message::User { tool_results, .. } = &sent[0] else {
            panic!()
        };
        assert!(tool_results[0].content.contains("1 image(s) omitted"));
        // 400 KB of base64 is not 100k tokens: one image is IMAGE_TOKENS.
        let one = estimate_messages(&history[..1]);
        assert!((IMAGE_TOKENS..IMAGE_TOKENS + 100).contains(&one), "{one}");
    }

    fn results(id: &str, content: &str) -> Message {
        Message::tool_results(vec![ToolResult {
            tool_use_id: id.into(),
            content: content.into(),
            is_error: false,
            images: Vec::new(),
        }])
    }

    #[test]
    fn only_old_long_tool_output_is_masked() {
        let long = "line\n".repeat(200);
        let history = vec![
            Message::user("task"),
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

    fn user(text: &str) -> Message {
        Message::user(text)
    }

    fn assistant(text: &str) -> Message {
        Message::Assistant(crate::message::AssistantMessage {
            content: vec![crate::message::ContentBlock::Text { text: text.into() }],
            stop_reason: crate::message::StopReason::EndTurn,
            usage: Default::default(),
        })
    }

    #[test]
    fn consecutive_user_messages_merge_with_results_first() {
        let mut h = vec![assistant("calling")];
        push_message(&mut h, results("a", "out"));
        push_message(&mut h, user("and then"));
        push_message(&mut h, user("more"));
        assert_eq!(h.len(), 2);
        match &h[1] {
            Message::User {
                text, tool_results, ..
            } => {
                assert_eq!(text, "and then\n\nmore");
                assert_eq!(tool_results.len(), 1);
            }
            m => panic!("{m:?}"),
        }
    }

    #[test]
    fn a_cut_never_separates_a_result_from_its_call() {
        let big = "x".repeat(4000);
        let h = vec![
            user("task"),
            assistant("a1"),
            results("r1", &big),
            assistant("a2"),
            results("r2", "small"),
            assistant("done"),
            user("next"),
        ];
        // Everything after index 3 fits in 300 tokens; index 4 is a result
        // message, so the cut is at 3, not 4.
        assert_eq!(choose_cut(&h, 300), Some(3));
        // A budget too small for even the last message summarises it all.
        assert_eq!(choose_cut(&h, 0), Some(h.len()));
        // A generous budget still summarises at least the first message.
        assert_eq!(choose_cut(&h, u64::MAX), Some(1));
        assert_eq!(choose_cut(&h[..1], 100), None);
    }

    #[test]
    fn compaction_keeps_roles_alternating() {
        let mut h = vec![
            user("task"),
            assistant("a1"),
            results("r1", "out"),
            assistant("done"),
            user("next"),
        ];
        apply_compaction(&mut h, 4, summary_message("did a1", None));
        assert_eq!(h.len(), 1, "the summary and the kept prompt merge");
        match &h[0] {
            Message::User { text, .. } => {
                assert!(text.contains("did a1") && text.ends_with("next"), "{text}")
            }
            m => panic!("{m:?}"),
        }
        let mut h = vec![user("task"), assistant("a1"), results("r1", "out")];
        apply_compaction(&mut h, 1, summary_message("s", Some("task")));
        assert!(matches!(
            &h[..],
            [
                Message::User { .. },
                Message::Assistant(_),
                Message::User { .. }
            ]
        ));
    }

    #[test]
    fn the_summary_request_fits_its_budget_and_asks_last() {
        let big = "y".repeat(40_000);
        let h = vec![
            user("task"),
            assistant("a1"),
            results("r1", &big),
            assistant("a2"),
            results("r2", "small result"),
        ];
        let all = summary_input(&h, h.len(), u64::MAX, 8);
        assert_eq!(all.len(), 5);
        match all.last().unwrap() {
            Message::User {
                text, tool_results, ..
            } => {
                assert_eq!(tool_results.len(), 1);
                assert!(text.ends_with(SUMMARY_REQUEST));
            }
            m => panic!("{m:?}"),
        }
        // Masking the big output is enough for a middling budget...
        let masked = summary_input(&h, h.len(), 1000, 8);
        assert_eq!(masked.len(), 5);
        assert!(estimate_messages(&masked) < 1000);
        // ...and a tiny one drops the oldest messages too.
        let trimmed = summary_input(&h, h.len(), 150, 8);
        assert!(estimate_messages(&trimmed) < 350, "{trimmed:?}");
        match &trimmed[0] {
            Message::User { text, .. } => assert!(text.contains("3 earlier messages"), "{text}"),
            m => panic!("{m:?}"),
        }
        assert!(matches!(trimmed[1], Message::Assistant(_)));
    }

    #[test]
    fn estimates_round_up() {
        assert_eq!(estimate_tokens(""), 0);
        assert_eq!(estimate_tokens("abcde"), 2);
    }
}
