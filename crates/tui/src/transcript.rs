//! What the conversation looks like on screen: a list of entries (the
//! user's prompts, the model's answers, tool calls with their results,
//! notices and errors), each rendered to wrapped lines for a width.
//!
//! Rendering is cached per entry and width; an entry is re-rendered only
//! when it changes (the answer being streamed, a tool call finishing), so
//! a long transcript costs nothing per frame but its visible rows.

use cordon_agent::{ContentBlock, Message};
use std::collections::HashMap;

use cordon_tools::printable;
use cordon_tools::update_plan::{self, Plan};
use ratatui::style::{Modifier, Style};
use ratatui::text::{Line, Span};
use serde_json::Value;

use crate::{markdown, theme, wrap};

/// Output lines of a finished tool call shown while collapsed.
pub const COLLAPSED_LINES: usize = 4;
/// Diff lines of an edit shown while collapsed.
pub const COLLAPSED_DIFF_LINES: usize = 12;
const SPINNER: [&str; 10] = ["⠋", "⠙", "⠹", "⠸", "⠼", "⠴", "⠦", "⠧", "⠇", "⠏"];

#[derive(Debug, Clone, PartialEq)]
pub enum ToolState {
    /// Waiting for the user's approval.
    Pending,
    Running,
    Done {
        output: String,
        is_error: bool,
        duration_ms: u64,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    pub input: Value,
    /// What the call does, on one line (`cordon_tools::label`).
    pub label: String,
    pub state: ToolState,
    /// For a `write_file` waiting for approval: the file as it is now
    /// (`None`: it does not exist), so the diff shows what it deletes.
    pub before: Option<String>,
    /// What a running call has printed so far (its end), shown until the
    /// result replaces it.
    pub live: String,
}

/// How much of a running call's output the transcript keeps.
const LIVE_KEEP: usize = 16 * 1024;
/// Lines of a running call's output shown: the last ones.
const LIVE_LINES: usize = 6;

impl ToolCall {
    /// A call of an earlier conversation, done, its result still to be
    /// attached.
    fn done(id: &str, name: &str, input: &Value, label: String) -> ToolCall {
        ToolCall {
            id: id.to_string(),
            name: name.to_string(),
            input: input.clone(),
            label,
            state: ToolState::Done {
                output: String::new(),
                is_error: false,
                duration_ms: 0,
            },
            before: None,
            live: String::new(),
        }
    }

    /// Appends output of the running call, keeping its end.
    pub fn push_live(&mut self, text: &str) {
        self.live.push_str(text);
        if self.live.len() > LIVE_KEEP {
            let mut cut = self.live.len() - LIVE_KEEP;
            while !self.live.is_char_boundary(cut) {
                cut += 1;
            }
            self.live.drain(..cut);
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    User(String),
    /// The model's answer, Markdown, possibly still streaming.
    Assistant(String),
    Thinking(String),
    Tool(ToolCall),
    /// Information from cordon itself (compaction, retries, /cost, /help).
    Notice(String),
    /// Something went wrong, and what to do about it.
    Error {
        message: String,
        hint: Option<String>,
    },
}

#[derive(Default)]
pub struct Transcript {
    entries: Vec<Entry>,
    cache: Vec<Option<Cached>>,
    /// Tool output shown whole instead of cut to a few lines.
    expanded: bool,
    /// The model's latest plan (`update_plan`): the conversation's, so it
    /// goes with it (cleared with it, rebuilt from a loaded history).
    plan: Option<Plan>,
}

struct Cached {
    width: u16,
    tick: u64,
    lines: Vec<Line<'static>>,
}

impl Transcript {
    pub fn entries(&self) -> &[Entry] {
        &self.entries
    }

    pub fn push(&mut self, e: Entry) {
        self.entries.push(e);
        self.cache.push(None);
    }

    /// The model's latest plan, if it keeps one.
    pub fn plan(&self) -> Option<&Plan> {
        self.plan.as_ref().filter(|p| !p.plan.is_empty())
    }

    pub fn set_plan(&mut self, plan: Plan) {
        self.plan = Some(plan);
    }

    pub fn clear(&mut self) {
        self.plan = None;
        self.entries.clear();
        self.cache.clear();
    }

    pub fn expanded(&self) -> bool {
        self.expanded
    }

    pub fn set_expanded(&mut self, on: bool) {
        if self.expanded != on {
            self.expanded = on;
            self.cache.iter_mut().for_each(|c| *c = None);
        }
    }

    /// The entry at `i`, to change; its rendering is redone.
    pub fn get_mut(&mut self, i: usize) -> Option<&mut Entry> {
        if let Some(c) = self.cache.get_mut(i) {
            *c = None;
        }
        self.entries.get_mut(i)
    }

    /// Appends streamed text to the answer being written, or starts one.
    pub fn append_assistant(&mut self, text: &str) {
        match self.entries.last_mut() {
            Some(Entry::Assistant(s)) => {
                s.push_str(text);
                let last = self.cache.len() - 1;
                self.cache[last] = None;
            }
            _ => self.push(Entry::Assistant(text.to_string())),
        }
    }

    pub fn append_thinking(&mut self, text: &str) {
        match self.entries.last_mut() {
            Some(Entry::Thinking(s)) => {
                s.push_str(text);
                let last = self.cache.len() - 1;
                self.cache[last] = None;
            }
            _ => self.push(Entry::Thinking(text.to_string())),
        }
    }

    /// Drops what was streamed since the last tool call or prompt: the
    /// request is being retried and its answer will come again.
    pub fn drop_streamed(&mut self) {
        while matches!(
            self.entries.last(),
            Some(Entry::Assistant(_) | Entry::Thinking(_))
        ) {
            self.entries.pop();
            self.cache.pop();
        }
    }

    pub fn tool_index(&self, id: &str) -> Option<usize> {
        self.entries
            .iter()
            .rposition(|e| matches!(e, Entry::Tool(t) if t.id == id))
    }

    /// Renders what is stale at `width` and returns the number of rows,
    /// entries one blank row apart. `tick` drives the spinners of running
    /// tools, which are redone when it changes.
    pub fn layout(&mut self, width: u16, tick: u64) -> usize {
        let mut rows = 0;
        for i in 0..self.entries.len() {
            let live = matches!(
                &self.entries[i],
                Entry::Tool(ToolCall {
                    state: ToolState::Running | ToolState::Pending,
                    ..
                })
            );
            let fresh = self.cache[i]
                .as_ref()
                .is_some_and(|c| c.width == width && (!live || c.tick == tick));
            if !fresh {
                self.cache[i] = Some(Cached {
                    width,
                    tick,
                    lines: render_entry(&self.entries[i], width, self.expanded, tick),
                });
            }
            rows += usize::from(i > 0) + self.cache[i].as_ref().map_or(0, |c| c.lines.len());
        }
        rows
    }

    /// Rows `top..top + height` of the last [`Transcript::layout`]: only
    /// what is on screen is copied, however long the conversation.
    pub fn visible(&self, top: usize, height: usize) -> Vec<Line<'static>> {
        let mut out = Vec::with_capacity(height);
        let mut row = 0;
        for (i, c) in self.cache.iter().enumerate() {
            let Some(c) = c else { continue };
            if out.len() >= height {
                break;
            }
            let block = usize::from(i > 0) + c.lines.len();
            if row + block <= top {
                row += block;
                continue;
            }
            let blank = std::iter::repeat_n(Line::default(), usize::from(i > 0));
            for line in blank.chain(c.lines.iter().cloned()) {
                if row >= top && out.len() < height {
                    out.push(line);
                }
                row += 1;
            }
        }
        out
    }

    /// Every row at `width`, for tests and small transcripts.
    pub fn lines(&mut self, width: u16, tick: u64) -> Vec<Line<'static>> {
        let rows = self.layout(width, tick);
        self.visible(0, rows)
    }

    /// Entries for an earlier conversation, from its history.
    /// `labels`: each tool call's, by id (one missing is made as any).
    pub fn from_history(history: &[Message], labels: &HashMap<String, String>) -> Transcript {
        let label = |id: &str, input: &Value| {
            labels
                .get(id)
                .cloned()
                .unwrap_or_else(|| cordon_tools::label::generic(input))
        };
        let mut t = Transcript::default();
        for m in history {
            match m {
                Message::User {
                    text,
                    tool_results,
                    images,
                } => {
                    for r in tool_results {
                        if let Some(i) = t.tool_index(&r.tool_use_id)
                            && let Some(Entry::Tool(call)) = t.get_mut(i)
                        {
                            call.state = ToolState::Done {
                                output: r.content.clone(),
                                is_error: r.is_error,
                                duration_ms: 0,
                            };
                        }
                    }
                    if text.starts_with("[This conversation was compacted") {
                        t.push(Entry::Notice(
                            "Earlier turns were summarised to fit the context window.".into(),
                        ));
                    } else if !text.is_empty() || !images.is_empty() {
                        t.push(Entry::User(with_attachments(text, images.len())));
                    }
                }
                Message::Assistant(a) => {
                    for block in &a.content {
                        match block {
                            ContentBlock::Text { text } if !text.trim().is_empty() => {
                                t.push(Entry::Assistant(text.clone()));
                            }
                            ContentBlock::ToolUse { id, name, input } => {
                                // The tool checked the plan as this does:
                                // one it refused is not the plan.
                                if name == update_plan::NAME
                                    && let Ok(plan) = Plan::parse(input.clone())
                                {
                                    t.plan = Some(plan);
                                }
                                let label = label(id, input);
                                t.push(Entry::Tool(ToolCall::done(id, name, input, label)));
                            }
                            // The provider's own search; what it found follows.
                            ContentBlock::ServerToolUse { id, name, input } => {
                                let label = label(id, input);
                                t.push(Entry::Tool(ToolCall::done(id, name, input, label)));
                            }
                            ContentBlock::WebSearchToolResult {
                                tool_use_id,
                                content,
                            } => {
                                if let Some(i) = t.tool_index(tool_use_id)
                                    && let Some(Entry::Tool(call)) = t.get_mut(i)
                                {
                                    let (output, is_error) =
                                        cordon_agent::message::search_summary(content);
                                    call.state = ToolState::Done {
                                        output,
                                        is_error,
                                        duration_ms: 0,
                                    };
                                }
                            }
                            _ => {}
                        }
                    }
                }
            }
        }
        t
    }
}

/// A user's message as the transcript shows it: its images counted first.
pub fn with_attachments(text: &str, images: usize) -> String {
    match images {
        0 => text.to_string(),
        n => format!("[{}] {text}", cordon_tools::plural(n as u64, "image")),
    }
}

/// One entry as wrapped lines, with no control character left in them.
///
/// Every entry holds text from the model or the sandbox (answers, tool
/// arguments, output, diffs, error messages): a raw escape sequence in it
/// would reach the terminal as one (a clipboard write, a cursor move, a
/// title), so every span passes through [`printable`] here, the one place
/// all of them go through.
pub fn render_entry(e: &Entry, width: u16, expanded: bool, tick: u64) -> Vec<Line<'static>> {
    let mut lines = render_entry_raw(e, width, expanded, tick);
    for line in &mut lines {
        for span in &mut line.spans {
            if span.content.chars().any(cordon_tools::unprintable) {
                span.content = printable(&span.content).into();
            }
        }
    }
    lines
}

fn render_entry_raw(e: &Entry, width: u16, expanded: bool, tick: u64) -> Vec<Line<'static>> {
    let lines = match e {
        Entry::User(text) => {
            let mut v = Vec::new();
            for (i, l) in text.lines().enumerate() {
                let mark = if i == 0 { "› " } else { "  " };
                v.push(Line::from(vec![
                    Span::styled(mark, theme::user()),
                    Span::styled(l.to_string(), Style::new().add_modifier(Modifier::BOLD)),
                ]));
            }
            if v.is_empty() {
                v.push(Line::from(Span::styled("› ", theme::user())));
            }
            v
        }
        Entry::Assistant(text) => markdown::render(text, width),
        Entry::Thinking(text) => {
            let style = theme::dim().add_modifier(Modifier::ITALIC);
            let all: Vec<&str> = text.trim().lines().collect();
            let shown = if expanded {
                all.len()
            } else {
                all.len().min(2)
            };
            let mut v: Vec<Line<'static>> = all[..shown]
                .iter()
                .map(|l| Line::from(Span::styled(format!("✻ {l}"), style)))
                .collect();
            if shown < all.len() {
                v.push(Line::from(Span::styled(
                    format!("  … {} more lines of thinking (ctrl+o)", all.len() - shown),
                    theme::dim(),
                )));
            }
            v
        }
        Entry::Tool(call) => render_tool(call, expanded, tick),
        Entry::Notice(text) => text
            .lines()
            .map(|l| Line::from(Span::styled(format!("· {l}"), theme::notice())))
            .collect(),
        Entry::Error { message, hint } => {
            let mut v = vec![Line::from(vec![
                Span::styled("✗ ", theme::error_bold()),
                Span::styled(message.clone(), theme::error()),
            ])];
            if let Some(h) = hint {
                v.push(Line::from(Span::styled(format!("  {h}"), theme::error())));
            }
            v
        }
    };
    wrap::wrap_all(&lines, width)
}

fn render_tool(call: &ToolCall, expanded: bool, tick: u64) -> Vec<Line<'static>> {
    let (icon, icon_style) = match &call.state {
        ToolState::Pending => ("?".to_string(), theme::approval()),
        ToolState::Running => (
            SPINNER[(tick as usize) % SPINNER.len()].to_string(),
            theme::running(),
        ),
        ToolState::Done { is_error: true, .. } => ("✗".into(), theme::error_bold()),
        ToolState::Done { .. } => ("✓".into(), theme::ok()),
    };
    let mut head = vec![
        Span::styled(format!("{icon} "), icon_style),
        Span::styled(call.name.clone(), theme::tool_name()),
        Span::raw(" "),
        Span::raw(printable(&call.label)),
    ];
    if let ToolState::Done { duration_ms, .. } = &call.state
        && *duration_ms > 0
    {
        head.push(Span::styled(
            format!("  {}", duration(*duration_ms)),
            theme::dim(),
        ));
    }
    if call.state == ToolState::Pending {
        head.push(Span::styled("  waiting for approval", theme::approval()));
    }
    let mut lines = vec![Line::from(head)];

    // Edits show what they change, whatever the state.
    if call.name == "edit_file" {
        let old = call.input["old_string"].as_str().unwrap_or("");
        let new = call.input["new_string"].as_str().unwrap_or("");
        lines.extend(limit(diff_lines(old, new), expanded, COLLAPSED_DIFF_LINES));
    } else if call.name == "write_file" && call.state == ToolState::Pending {
        let content = call.input["content"].as_str().unwrap_or("");
        let before = call.before.as_deref();
        lines.push(Line::from(Span::styled(
            if before.is_some() {
                "  replaces the file:"
            } else {
                "  a new file:"
            },
            theme::approval(),
        )));
        lines.extend(limit(
            diff_lines(before.unwrap_or(""), content),
            expanded,
            COLLAPSED_DIFF_LINES,
        ));
    } else if call.name == "bash" || call.name == "run_code" {
        // A multi-line command or program is shown whole when expanded.
        let key = if call.name == "bash" {
            "command"
        } else {
            "code"
        };
        let text = call.input[key].as_str().unwrap_or("");
        if expanded && text.lines().count() > 1 {
            lines.extend(
                text.lines()
                    .map(|l| Line::from(Span::styled(format!("    {l}"), theme::dim()))),
            );
        }
    }

    if matches!(call.state, ToolState::Running) && !call.live.trim().is_empty() {
        // The last lines printed so far; a carriage return (a progress
        // bar) starts its line over, and no control character is drawn.
        let shown: Vec<String> = call
            .live
            .trim_end()
            .lines()
            .map(|l| printable(l.rsplit('\r').next().unwrap_or(l)))
            .collect();
        let from = shown.len().saturating_sub(LIVE_LINES);
        lines.extend(
            shown[from..]
                .iter()
                .map(|l| Line::from(Span::styled(format!("  ┊ {l}"), theme::dim()))),
        );
    }

    // A helper's steps stay under its call once it is done: the last
    // few, or all of them expanded.
    if call.name == "task"
        && matches!(call.state, ToolState::Done { .. })
        && !call.live.trim().is_empty()
    {
        let steps: Vec<String> = call.live.trim_end().lines().map(printable).collect();
        let from = if expanded {
            0
        } else {
            steps.len().saturating_sub(LIVE_LINES)
        };
        if from > 0 {
            lines.push(Line::from(Span::styled(
                format!("  ┊ … {from} earlier lines (Ctrl+O)"),
                theme::dim(),
            )));
        }
        lines.extend(
            steps[from..]
                .iter()
                .map(|l| Line::from(Span::styled(format!("  ┊ {l}"), theme::dim()))),
        );
    }

    if let ToolState::Done {
        output, is_error, ..
    } = &call.state
    {
        let show_output = call.name != "edit_file" || *is_error;
        if show_output && !output.trim().is_empty() {
            let style = if *is_error {
                theme::error()
            } else {
                theme::dim()
            };
            let body: Vec<Line<'static>> = output
                .trim_end()
                .lines()
                .map(|l| Line::from(Span::styled(format!("  │ {}", printable(l)), style)))
                .collect();
            lines.extend(limit(body, expanded, COLLAPSED_LINES));
        }
    }
    lines
}

/// At most `n` of `lines` unless expanded, with a line saying what is hidden.
fn limit(lines: Vec<Line<'static>>, expanded: bool, n: usize) -> Vec<Line<'static>> {
    if expanded || lines.len() <= n {
        return lines;
    }
    let hidden = lines.len() - n;
    let mut v: Vec<Line<'static>> = lines.into_iter().take(n).collect();
    v.push(Line::from(Span::styled(
        format!("  … {hidden} more lines (ctrl+o to expand)"),
        theme::dim(),
    )));
    v
}

/// A unified diff of `old` to `new`, coloured.
pub fn diff_lines(old: &str, new: &str) -> Vec<Line<'static>> {
    let patch = diffy::create_patch(old, new);
    let mut out = Vec::new();
    for hunk in patch.hunks() {
        out.push(Line::from(Span::styled(
            format!(
                "  @@ -{},{} +{},{} @@",
                hunk.old_range().start(),
                hunk.old_range().len(),
                hunk.new_range().start(),
                hunk.new_range().len()
            ),
            theme::hunk(),
        )));
        for l in hunk.lines() {
            let (mark, text, style) = match l {
                diffy::Line::Delete(t) => ("-", *t, theme::removed()),
                diffy::Line::Insert(t) => ("+", *t, theme::added()),
                diffy::Line::Context(t) => (" ", *t, theme::dim()),
            };
            out.push(Line::from(Span::styled(
                format!(
                    "  {mark} {}",
                    text.trim_end_matches('\n').replace('\t', "    ")
                ),
                style,
            )));
        }
    }
    out
}

fn duration(ms: u64) -> String {
    if ms < 1000 {
        format!("{ms} ms")
    } else if ms < 60_000 {
        format!("{:.1} s", ms as f64 / 1000.0)
    } else {
        format!("{}m{:02}s", ms / 60_000, (ms / 1000) % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::plain;
    use serde_json::json;

    fn done(name: &str, input: Value, output: &str, is_error: bool) -> Entry {
        Entry::Tool(ToolCall {
            id: "t1".into(),
            name: name.into(),
            label: cordon_tools::Toolbox::agent().label(name, &input),
            input,
            state: ToolState::Done {
                output: output.into(),
                is_error,
                duration_ms: 1500,
            },
            before: None,
            live: String::new(),
        })
    }

    #[test]
    fn tool_output_is_collapsed_until_expanded() {
        let out: String = (1..=10).map(|i| format!("line {i}\n")).collect();
        let e = done("bash", json!({"command": "seq 10"}), &out, false);
        let collapsed = plain(&render_entry(&e, 60, false, 0));
        assert_eq!(collapsed[0], "✓ bash seq 10  1.5 s");
        assert_eq!(collapsed.len(), 1 + COLLAPSED_LINES + 1);
        assert_eq!(collapsed[5], "  … 6 more lines (ctrl+o to expand)");
        let expanded = plain(&render_entry(&e, 60, true, 0));
        assert_eq!(expanded.len(), 11);
        assert_eq!(expanded[10], "  │ line 10");
    }

    #[test]
    fn no_control_character_from_the_model_or_the_sandbox_is_drawn() {
        let evil = "\u{1b}]52;c;cHduZWQ=\u{7}\u{1b}[2K\u{1b}[1A \u{202E}desrever\u{202C}";
        let entries = [
            Entry::User(format!("pasted {evil}")),
            Entry::Assistant(format!("**bold** {evil} `code {evil}`")),
            Entry::Thinking(format!("thinking {evil}")),
            Entry::Notice(format!("notice {evil}")),
            Entry::Error {
                message: format!("error {evil}"),
                hint: Some(format!("hint {evil}")),
            },
            done(
                "bash",
                json!({"command": format!("echo {evil}")}),
                evil,
                false,
            ),
            done(
                "edit_file",
                json!({"path": "a", "old_string": evil, "new_string": format!("x{evil}")}),
                "ok",
                false,
            ),
        ];
        for e in &entries {
            for expanded in [false, true] {
                for line in render_entry(e, 80, expanded, 0) {
                    for span in &line.spans {
                        assert!(
                            !span.content.chars().any(cordon_tools::unprintable),
                            "{e:?} drew {:?}",
                            span.content
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn an_edit_shows_a_coloured_diff() {
        let e = done(
            "edit_file",
            json!({"path": "a.py", "old_string": "x = 1\n", "new_string": "x = 2\n"}),
            "ok",
            false,
        );
        let lines = render_entry(&e, 60, false, 0);
        let text = plain(&lines);
        assert_eq!(text[0], "✓ edit_file a.py  1.5 s");
        let minus = text.iter().position(|l| l == "  - x = 1").unwrap();
        let plus = text.iter().position(|l| l == "  + x = 2").unwrap();
        assert_eq!(lines[minus].spans[0].style, theme::removed());
        assert_eq!(lines[plus].spans[0].style, theme::added());
    }

    #[test]
    fn visible_rows_are_the_same_slice_as_all_rows() {
        let mut t = Transcript::default();
        for i in 0..50 {
            t.push(Entry::User(format!("prompt {i}")));
            t.push(Entry::Assistant(format!("answer {i}\n\nsecond paragraph")));
        }
        let all = plain(&t.lines(40, 0));
        let rows = t.layout(40, 0);
        assert_eq!(rows, all.len());
        for (top, h) in [(0, 10), (7, 13), (rows - 5, 10), (rows, 3)] {
            let want: Vec<String> = all.iter().skip(top).take(h).cloned().collect();
            assert_eq!(plain(&t.visible(top, h)), want, "top {top} height {h}");
        }
    }

    #[test]
    fn history_becomes_entries_with_results_attached() {
        let history = vec![
            Message::user("list files"),
            Message::Assistant(cordon_agent::AssistantMessage {
                content: vec![
                    ContentBlock::Text {
                        text: "Listing.".into(),
                    },
                    ContentBlock::ToolUse {
                        id: "c1".into(),
                        name: "bash".into(),
                        input: json!({"command": "ls"}),
                    },
                ],
                stop_reason: cordon_agent::StopReason::ToolUse,
                usage: Default::default(),
            }),
            Message::tool_results(vec![cordon_agent::ToolResult {
                tool_use_id: "c1".into(),
                content: "a.txt".into(),
                is_error: false,
                images: Vec::new(),
            }]),
        ];
        let t = Transcript::from_history(&history, &HashMap::new());
        assert_eq!(t.entries().len(), 3);
        assert!(
            matches!(&t.entries()[2], Entry::Tool(ToolCall { state: ToolState::Done { output, .. }, .. }) if output == "a.txt")
        );
    }

    #[test]
    fn a_loaded_history_keeps_the_providers_searches_and_the_last_plan() {
        let history = vec![Message::Assistant(cordon_agent::AssistantMessage {
            content: vec![
                ContentBlock::ServerToolUse {
                    id: "s1".into(),
                    name: "web_search".into(),
                    input: serde_json::json!({"query": "ratatui"}),
                },
                ContentBlock::WebSearchToolResult {
                    tool_use_id: "s1".into(),
                    content: serde_json::json!([{"type": "web_search_result", "url": "https://r.example/", "title": "R"}]),
                },
                ContentBlock::ToolUse {
                    id: "p1".into(),
                    name: "update_plan".into(),
                    input: serde_json::json!({"plan": [{"step": "a", "status": "in_progress"}]}),
                },
            ],
            stop_reason: cordon_agent::StopReason::ToolUse,
            usage: Default::default(),
        })];
        let labels = HashMap::from([("p1".to_string(), "1 of 1 done".to_string())]);
        let t = Transcript::from_history(&history, &labels);
        assert!(
            matches!(&t.entries()[0], Entry::Tool(ToolCall { state: ToolState::Done { output, .. }, .. }) if output == "R — https://r.example/"),
            "{:?}",
            t.entries()
        );
        assert_eq!(t.plan().unwrap().plan[0].step, "a");
        // The provider's search has no label given: its query is one.
        let labels: Vec<&str> = t
            .entries()
            .iter()
            .filter_map(|e| match e {
                Entry::Tool(call) => Some(call.label.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(labels, ["ratatui", "1 of 1 done"]);
    }
}
