//! A tool call's label: the one line a front end shows for it (the
//! command, the path, the query). Made here once, from the model's
//! arguments, so the terminal UI, `exec`, the web page and a helper
//! agent's progress all say the same thing.
//!
//! The arguments are model text: a label is one line of printable
//! characters, at most [`MAX_CHARS`] of them.

use serde_json::Value;

use crate::output::printable;

/// Longest label, in characters: the rest of the line is the front end's.
pub const MAX_CHARS: usize = 160;

/// Marks a label cut short, or a text with more lines than its first.
const MORE: char = '…';

/// The arguments a tool of unknown shape is most likely to be about, in
/// the order they are looked for.
const LIKELY: &[&str] = &["command", "path", "pattern", "url", "query", "description"];

/// `text` as a label: its first line that is not blank, trimmed, made
/// printable and bounded, marked when anything was left out.
pub fn line(text: &str) -> String {
    let mut lines = text.lines().filter(|l| !l.trim().is_empty());
    let first = lines.next().unwrap_or("").trim();
    let more = lines.next().is_some();
    let mut out: String = printable(first).chars().take(MAX_CHARS).collect();
    if more || out.chars().count() < printable(first).chars().count() {
        out.push(MORE);
    }
    out
}

/// `given`, the label an event carried, or for an event logged before
/// labels were (an empty one), [`generic`]'s of its arguments.
pub fn or_generic(given: String, input: &Value) -> String {
    if given.is_empty() {
        generic(input)
    } else {
        given
    }
}

/// The label of a call to a tool that does not say (an MCP server's), or
/// of arguments its tool would refuse: the first likely string argument,
/// else the first string, else the arguments' JSON.
pub fn generic(input: &Value) -> String {
    let Some(object) = input.as_object() else {
        return line(&input.to_string());
    };
    LIKELY
        .iter()
        .find_map(|k| object.get(*k).and_then(Value::as_str))
        .or_else(|| object.values().find_map(Value::as_str))
        .map(line)
        .unwrap_or_else(|| line(&input.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_label_is_one_bounded_printable_line() {
        assert_eq!(line("ls -la"), "ls -la");
        assert_eq!(line("\n  cd src\nmake\n"), "cd src…");
        assert_eq!(line("echo \u{1b}[2Jgone"), "echo ?[2Jgone");
        let long = "x".repeat(MAX_CHARS + 1);
        let cut = line(&long);
        assert_eq!(cut.chars().count(), MAX_CHARS + 1);
        assert!(cut.ends_with(MORE));
        assert_eq!(line(&"é".repeat(MAX_CHARS)), "é".repeat(MAX_CHARS));
        assert_eq!(line(""), "");
    }

    #[test]
    fn an_unknown_tool_is_labelled_by_its_likeliest_argument() {
        assert_eq!(generic(&json!({"n": 3, "path": "a.txt"})), "a.txt");
        assert_eq!(generic(&json!({"n": 3, "name": "x"})), "x");
        assert_eq!(generic(&json!({"n": 3})), "{\"n\":3}");
        assert_eq!(generic(&json!(null)), "null");
        assert_eq!(generic(&json!({"command": "a\nb"})), "a…");
    }
}
