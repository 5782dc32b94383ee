//! `edit_file`: replace an exact string in a file.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::read_file::read_text;
use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool, args};

pub struct EditFile;

/// Lines of context shown around an edit.
const SNIPPET_CONTEXT: usize = 4;
/// Match positions listed when a string matches several times.
const MAX_LISTED: usize = 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    path: String,
    old_string: String,
    new_string: String,
    #[serde(default)]
    replace_all: bool,
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to edit, relative to /workspace or absolute under /workspace/."},
            "old_string": {"type": "string", "description": "The exact text to replace, including whitespace and indentation, without read_file's line numbers. Must occur exactly once unless replace_all is true: include enough surrounding lines to make it unique."},
            "new_string": {"type": "string", "description": "The text to put in its place."},
            "replace_all": {"type": "boolean", "description": "Replace every occurrence instead of requiring exactly one. Default false."}
        },
        "required": ["path", "old_string", "new_string"],
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Edit a text file by replacing an exact string. `old_string` must match the file exactly once (whitespace included; leave out read_file's line numbers) unless `replace_all` is set; otherwise the error says how many matches there were and where, or which line came closest. Returns the edited region with line numbers. Use write_file to create new files.";

impl TypedTool for EditFile {
    const NAME: &'static str = "edit_file";
    const READ_ONLY: bool = false;
    type Input = Input;
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn label(&self, input: &Input) -> String {
        input.path.clone()
    }
    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Input) -> ToolFuture<'a> {
        args::blocking(Self::NAME, ctx, input, edit)
    }
}

fn line_of(text: &str, byte: usize) -> usize {
    text[..byte].matches('\n').count() + 1
}

fn edit(ctx: &ToolContext, input: Input) -> ToolOutput {
    if input.old_string.is_empty() {
        return ToolOutput::error(
            "old_string is empty; give the exact text to replace (to create or overwrite a whole file use write_file)",
        );
    }
    if input.old_string == input.new_string {
        return ToolOutput::error(
            "old_string and new_string are the same, so there is nothing to change",
        );
    }
    let (p, text) = match read_text(ctx, &input.path) {
        Ok(t) => t,
        Err(e) => return ToolOutput::error(e),
    };
    let starts: Vec<usize> = text
        .match_indices(&input.old_string)
        .map(|(i, _)| i)
        .collect();
    match starts.len() {
        0 => return ToolOutput::error(no_match(&p.display(), &text, &input.old_string)),
        1 => {}
        n if !input.replace_all => {
            let lines: Vec<String> = starts
                .iter()
                .take(MAX_LISTED)
                .map(|&s| line_of(&text, s).to_string())
                .collect();
            let more = if n > MAX_LISTED { ", ..." } else { "" };
            return ToolOutput::error(format!(
                "old_string occurs {n} times in {} (starting on lines {}{more}). Include more surrounding lines in old_string so it matches exactly once, or set replace_all to true to replace every occurrence.",
                p.display(),
                lines.join(", ")
            ));
        }
        _ => {}
    }
    let new_text = if input.replace_all {
        text.replace(&input.old_string, &input.new_string)
    } else {
        text.replacen(&input.old_string, &input.new_string, 1)
    };
    let ws = match ctx.open_workspace() {
        Ok(w) => w,
        Err(e) => return ToolOutput::error(e.to_string()),
    };
    if let Err(e) = ws.write(&p, new_text.as_bytes()) {
        return ToolOutput::error(e.to_string());
    }
    // The snippet covers the first replacement, located in the new text.
    let first = starts[0];
    let first_line = line_of(&new_text, first);
    let last_line = line_of(&new_text, first + input.new_string.len().max(1) - 1).max(first_line);
    let lines: Vec<&str> = new_text.lines().collect();
    let from = first_line.saturating_sub(SNIPPET_CONTEXT).max(1);
    let to = (last_line + SNIPPET_CONTEXT).min(lines.len());
    let mut snippet = String::new();
    for (i, l) in lines.iter().enumerate().take(to).skip(from - 1) {
        snippet.push_str(&format!("{:>6}\t{l}\n", i + 1));
    }
    let count = if input.replace_all { starts.len() } else { 1 };
    let patch = diffy::create_patch(&text, &new_text).to_string();
    ToolOutput::ok(format!(
        "Edited {}: replaced {count} occurrence{}. Lines {from}-{to} now read:\n{snippet}",
        p.display(),
        if count == 1 { "" } else { "s" }
    ))
    .with_structured(json!({"path": p.display(), "replacements": count, "diff": patch}))
}

/// Explains a failed match: whitespace-only differences are named, else
/// the line most like the first line of `old` is shown.
fn no_match(path: &str, text: &str, old: &str) -> String {
    let squash = |s: &str| s.split_whitespace().collect::<Vec<_>>().join(" ");
    if !squash(old).is_empty() && squash(text).contains(&squash(old)) {
        return format!(
            "old_string was not found in {path} exactly, but it matches when whitespace is ignored: the indentation or line breaks differ. Read the file again and copy the text exactly (without line numbers)."
        );
    }
    let needle = old
        .lines()
        .find(|l| !l.trim().is_empty())
        .unwrap_or(old)
        .trim();
    let best = text
        .lines()
        .enumerate()
        .map(|(i, l)| (similarity(needle, l.trim()), i + 1, l))
        .filter(|(s, _, _)| *s > 0.5)
        .max_by(|a, b| a.0.total_cmp(&b.0));
    match best {
        Some((_, n, l)) => format!(
            "old_string was not found in {path}. The closest line is {n}: {l:?}. Read the file again and copy the text exactly (without line numbers)."
        ),
        None => format!(
            "old_string was not found in {path}, and no line resembles it. Read the file to see its current content."
        ),
    }
}

/// Dice coefficient over character bigrams: cheap and good enough to point
/// at a line with a typo or a changed identifier.
fn similarity(a: &str, b: &str) -> f64 {
    let grams = |s: &str| -> Vec<(char, char)> {
        let c: Vec<char> = s.chars().collect();
        c.windows(2).map(|w| (w[0], w[1])).collect()
    };
    let (ga, mut gb) = (grams(a), grams(b));
    if ga.is_empty() || gb.is_empty() {
        return if a == b { 1.0 } else { 0.0 };
    }
    let total = ga.len() + gb.len();
    let mut common = 0;
    for g in ga {
        if let Some(i) = gb.iter().position(|x| *x == g) {
            gb.swap_remove(i);
            common += 1;
        }
    }
    2.0 * common as f64 / total as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_closest_line_is_named() {
        let msg = no_match(
            "f",
            "fn main() {\n    println!(\"hello\");\n}\n",
            "println!(\"helo\");",
        );
        assert!(msg.contains("closest line is 2"), "{msg}");
    }

    #[test]
    fn whitespace_differences_are_named() {
        let msg = no_match("f", "a  b\n  c\n", "a b\nc");
        assert!(msg.contains("whitespace"), "{msg}");
    }
}
