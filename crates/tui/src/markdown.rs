//! Markdown to styled terminal lines: headings, emphasis, inline code,
//! links, block quotes, nested lists, fenced code blocks and tables.
//!
//! The output is not wrapped: [`crate::wrap`] fits it to the width later,
//! except code blocks and tables, which are laid out here because their
//! columns matter. Unfinished markdown (a half-streamed answer) renders as
//! far as it goes: pulldown-cmark closes open blocks at the end of input.

use pulldown_cmark::{Alignment, CodeBlockKind, Event, HeadingLevel, Options, Parser, Tag, TagEnd};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use unicode_width::UnicodeWidthStr;

use crate::theme;

/// Renders `text` as lines no wider than `width` where the layout is ours
/// (tables, code); prose lines are left for the wrapper.
pub fn render(text: &str, width: u16) -> Vec<Line<'static>> {
    let mut r = Renderer {
        width: width.max(10) as usize,
        ..Renderer::default()
    };
    let opts = Options::ENABLE_TABLES | Options::ENABLE_STRIKETHROUGH | Options::ENABLE_TASKLISTS;
    for event in Parser::new_ext(text, opts) {
        r.event(event);
    }
    r.flush_line();
    // No blank line at the end: the transcript spaces its entries.
    while r
        .out
        .last()
        .is_some_and(|l| l.spans.iter().all(|s| s.content.trim().is_empty()))
    {
        r.out.pop();
    }
    r.out
}

#[derive(Default)]
struct Table {
    align: Vec<Alignment>,
    rows: Vec<Vec<Vec<Span<'static>>>>,
    header_rows: usize,
    in_header: bool,
}

#[derive(Default)]
struct Renderer {
    width: usize,
    out: Vec<Line<'static>>,
    /// The line being built.
    line: Vec<Span<'static>>,
    /// Inline styles in force (bold, italic, …), innermost last.
    styles: Vec<Style>,
    /// List nesting: `None` for bullets, `Some(n)` for the next number.
    lists: Vec<Option<u64>>,
    /// Prefix owed to the first line of the current list item.
    item_marker: Option<String>,
    quote_depth: usize,
    code: Option<(String, String)>,
    table: Option<Table>,
    /// The cell being built, when in a table.
    cell: Option<Vec<Span<'static>>>,
    link: Option<String>,
    heading: Option<HeadingLevel>,
}

impl Renderer {
    fn style(&self) -> Style {
        self.styles
            .iter()
            .fold(Style::default(), |acc, s| acc.patch(*s))
    }

    /// Indentation and quote bars for a new line in the current context.
    fn prefix(&mut self) -> Vec<Span<'static>> {
        let mut p = Vec::new();
        for _ in 0..self.quote_depth {
            p.push(Span::styled("▎ ", theme::quote()));
        }
        if !self.lists.is_empty() {
            let depth = self.lists.len() - 1;
            match self.item_marker.take() {
                Some(marker) => {
                    p.push(Span::raw("  ".repeat(depth)));
                    p.push(Span::styled(marker, theme::list_marker()));
                }
                None => {
                    // Continuation lines line up under the item's text.
                    let marker_width = match self.lists.last() {
                        Some(Some(n)) => format!("{n}. ").len().max(3),
                        _ => 2,
                    };
                    p.push(Span::raw(" ".repeat(depth * 2 + marker_width)));
                }
            }
        }
        p
    }

    fn push_text(&mut self, text: &str) {
        let style = self.style();
        if let Some(cell) = &mut self.cell {
            cell.push(Span::styled(text.to_string(), style));
            return;
        }
        if self.line.is_empty() {
            self.line = self.prefix();
        }
        self.line.push(Span::styled(text.to_string(), style));
    }

    fn flush_line(&mut self) {
        if !self.line.is_empty() {
            let spans = std::mem::take(&mut self.line);
            self.out.push(Line::from(spans));
        }
    }

    fn blank(&mut self) {
        self.flush_line();
        if self.out.last().is_some_and(|l| !l.spans.is_empty()) && self.quote_depth == 0 {
            self.out.push(Line::default());
        }
    }

    fn event(&mut self, event: Event<'_>) {
        if let Some((_, buf)) = &mut self.code {
            match event {
                Event::Text(t) => buf.push_str(&t),
                Event::End(TagEnd::CodeBlock) => self.end_code(),
                _ => {}
            }
            return;
        }
        match event {
            Event::Start(tag) => self.start(tag),
            Event::End(tag) => self.end(tag),
            Event::Text(t) => self.push_text(&t),
            Event::Code(t) => {
                let style = self.style().patch(theme::inline_code());
                let span = Span::styled(t.to_string(), style);
                match &mut self.cell {
                    Some(cell) => cell.push(span),
                    None => {
                        if self.line.is_empty() {
                            self.line = self.prefix();
                        }
                        self.line.push(span);
                    }
                }
            }
            Event::SoftBreak => self.push_text(" "),
            Event::HardBreak => self.flush_line(),
            Event::Rule => {
                self.blank();
                let w = self.width.min(40);
                self.out
                    .push(Line::from(Span::styled("─".repeat(w), theme::dim())));
                self.out.push(Line::default());
            }
            Event::TaskListMarker(done) => self.push_text(if done { "[x] " } else { "[ ] " }),
            Event::Html(t) | Event::InlineHtml(t) => self.push_text(&t),
            Event::FootnoteReference(t) => self.push_text(&format!("[{t}]")),
            Event::InlineMath(t) | Event::DisplayMath(t) => self.push_text(&t),
        }
    }

    fn start(&mut self, tag: Tag<'_>) {
        match tag {
            Tag::Paragraph if self.cell.is_none() && self.item_marker.is_none() => {
                self.flush_line();
            }
            Tag::Heading { level, .. } => {
                self.blank();
                self.heading = Some(level);
                self.styles.push(theme::heading(level as usize));
                let hashes = "#".repeat(level as usize);
                self.push_text(&format!("{hashes} "));
            }
            Tag::BlockQuote(_) => {
                self.blank();
                self.quote_depth += 1;
            }
            Tag::CodeBlock(kind) => {
                self.flush_line();
                let lang = match kind {
                    CodeBlockKind::Fenced(l) => {
                        l.split(',').next().unwrap_or("").trim().to_string()
                    }
                    CodeBlockKind::Indented => String::new(),
                };
                self.code = Some((lang, String::new()));
            }
            Tag::List(start) => {
                if self.lists.is_empty() {
                    self.blank();
                } else {
                    self.flush_line();
                }
                self.lists.push(start);
            }
            Tag::Item => {
                self.flush_line();
                let marker = match self.lists.last_mut() {
                    Some(Some(n)) => {
                        let m = format!("{n}. ");
                        *n += 1;
                        m
                    }
                    _ => "• ".to_string(),
                };
                self.item_marker = Some(marker);
            }
            Tag::Emphasis => self
                .styles
                .push(Style::new().add_modifier(Modifier::ITALIC)),
            Tag::Strong => self.styles.push(Style::new().add_modifier(Modifier::BOLD)),
            Tag::Strikethrough => self
                .styles
                .push(Style::new().add_modifier(Modifier::CROSSED_OUT)),
            Tag::Link { dest_url, .. } => {
                self.styles.push(theme::link());
                self.link = Some(dest_url.to_string());
            }
            Tag::Image { dest_url, .. } => {
                self.push_text("[image: ");
                self.link = Some(dest_url.to_string());
            }
            Tag::Table(align) => {
                self.blank();
                self.table = Some(Table {
                    align,
                    ..Table::default()
                });
            }
            Tag::TableHead => {
                if let Some(t) = &mut self.table {
                    t.in_header = true;
                    t.rows.push(Vec::new());
                }
            }
            Tag::TableRow => {
                if let Some(t) = &mut self.table {
                    t.rows.push(Vec::new());
                }
            }
            Tag::TableCell => self.cell = Some(Vec::new()),
            _ => {}
        }
    }

    fn end(&mut self, tag: TagEnd) {
        match tag {
            TagEnd::Paragraph if self.cell.is_none() => {
                self.flush_line();
                if self.lists.is_empty() {
                    self.blank();
                }
            }
            TagEnd::Heading(_) => {
                self.styles.pop();
                self.heading = None;
                self.flush_line();
                self.out.push(Line::default());
            }
            TagEnd::BlockQuote(_) => {
                self.flush_line();
                self.quote_depth = self.quote_depth.saturating_sub(1);
                if self.quote_depth == 0 {
                    self.blank();
                }
            }
            TagEnd::List(_) => {
                self.flush_line();
                self.lists.pop();
                if self.lists.is_empty() {
                    self.blank();
                }
            }
            TagEnd::Item => {
                // An empty item still shows its marker.
                if self.item_marker.is_some() {
                    self.line = self.prefix();
                }
                self.flush_line();
            }
            TagEnd::Emphasis | TagEnd::Strong | TagEnd::Strikethrough => {
                self.styles.pop();
            }
            TagEnd::Link => {
                self.styles.pop();
                if let Some(url) = self.link.take()
                    && !url.is_empty()
                    && !self.line_text_ends_with(&url)
                {
                    let s = format!(" ({url})");
                    let span = Span::styled(s, theme::dim());
                    match &mut self.cell {
                        Some(c) => c.push(span),
                        None => self.line.push(span),
                    }
                }
            }
            TagEnd::Image => {
                if let Some(url) = self.link.take() {
                    self.push_text(&format!(" ({url})]"));
                }
            }
            TagEnd::TableCell => {
                if let (Some(cell), Some(t)) = (self.cell.take(), &mut self.table)
                    && let Some(row) = t.rows.last_mut()
                {
                    row.push(cell);
                }
            }
            TagEnd::TableHead => {
                if let Some(t) = &mut self.table {
                    t.in_header = false;
                    t.header_rows = t.rows.len();
                }
            }
            TagEnd::Table => {
                if let Some(t) = self.table.take() {
                    let lines = layout_table(t, self.width);
                    self.out.extend(lines);
                    self.out.push(Line::default());
                }
            }
            _ => {}
        }
    }

    fn line_text_ends_with(&self, s: &str) -> bool {
        let spans = self.cell.as_ref().unwrap_or(&self.line);
        spans.last().is_some_and(|l| l.content.ends_with(s))
    }

    fn end_code(&mut self) {
        let Some((lang, body)) = self.code.take() else {
            return;
        };
        let indent = self.prefix();
        let label = if lang.is_empty() {
            "code".to_string()
        } else {
            lang
        };
        let mut head = indent.clone();
        head.push(Span::styled(format!("╭─ {label}"), theme::code_frame()));
        self.out.push(Line::from(head));
        for l in body.trim_end_matches('\n').split('\n') {
            let mut line = indent.clone();
            line.push(Span::styled("│ ", theme::code_frame()));
            line.push(Span::styled(l.replace('\t', "    "), theme::code()));
            self.out.push(Line::from(line));
        }
        let mut foot = indent;
        foot.push(Span::styled("╰─", theme::code_frame()));
        self.out.push(Line::from(foot));
        if self.lists.is_empty() {
            self.out.push(Line::default());
        }
    }
}

fn cell_width(cell: &[Span<'_>]) -> usize {
    cell.iter().map(|s| s.content.width()).sum()
}

/// A table with box-drawing rules; columns shrink to fit `width`, and a
/// cell too wide for its column is cut with an ellipsis.
fn layout_table(t: Table, width: usize) -> Vec<Line<'static>> {
    let cols = t.rows.iter().map(Vec::len).max().unwrap_or(0);
    if cols == 0 {
        return Vec::new();
    }
    let mut widths = vec![1usize; cols];
    for row in &t.rows {
        for (i, cell) in row.iter().enumerate() {
            widths[i] = widths[i].max(cell_width(cell));
        }
    }
    // Borders: "│ " before each column, " │" after the last, " │ " between.
    let chrome = 3 * cols + 1;
    let avail = width.saturating_sub(chrome).max(cols);
    while widths.iter().sum::<usize>() > avail {
        let (i, _) = widths
            .iter()
            .enumerate()
            .max_by_key(|(_, w)| **w)
            .expect("cols > 0");
        widths[i] -= 1;
    }
    let rule = |l: &str, m: &str, r: &str| {
        let mut s = String::from(l);
        for (i, w) in widths.iter().enumerate() {
            s.push_str(&"─".repeat(w + 2));
            s.push_str(if i + 1 == cols { r } else { m });
        }
        Line::from(Span::styled(s, theme::table_rule()))
    };
    let mut out = vec![rule("┌", "┬", "┐")];
    for (r, row) in t.rows.iter().enumerate() {
        let mut spans = vec![Span::styled("│", theme::table_rule())];
        for (i, w) in widths.iter().enumerate() {
            let empty = Vec::new();
            let cell = row.get(i).unwrap_or(&empty);
            let mut content = fit(cell, *w);
            let used = cell_width(&content);
            let pad = w - used;
            let (left, right) = match t.align.get(i) {
                Some(Alignment::Right) => (pad, 0),
                Some(Alignment::Center) => (pad / 2, pad - pad / 2),
                _ => (0, pad),
            };
            spans.push(Span::raw(" ".repeat(left + 1)));
            if r < t.header_rows {
                for s in &mut content {
                    s.style = s.style.add_modifier(Modifier::BOLD);
                }
            }
            spans.extend(content);
            spans.push(Span::raw(" ".repeat(right + 1)));
            spans.push(Span::styled("│", theme::table_rule()));
        }
        out.push(Line::from(spans));
        if r + 1 == t.header_rows {
            out.push(rule("├", "┼", "┤"));
        }
    }
    out.push(rule("└", "┴", "┘"));
    out
}

/// The spans of `cell` cut to `width` columns, with `…` when cut.
fn fit(cell: &[Span<'static>], width: usize) -> Vec<Span<'static>> {
    if cell_width(cell) <= width {
        return cell.to_vec();
    }
    let mut out = Vec::new();
    let mut used = 0;
    let budget = width.saturating_sub(1);
    'outer: for span in cell {
        let mut text = String::new();
        for ch in span.content.chars() {
            let w = unicode_width::UnicodeWidthChar::width(ch).unwrap_or(0);
            if used + w > budget {
                out.push(Span::styled(text, span.style));
                break 'outer;
            }
            used += w;
            text.push(ch);
        }
        out.push(Span::styled(text, span.style));
    }
    out.push(Span::styled("…", Style::default().fg(Color::DarkGray)));
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::plain;

    #[test]
    fn headings_lists_and_inline_styles() {
        let md = "# Title\n\nSome **bold** and `code`.\n\n- one\n- two\n  1. nested\n";
        let lines = render(md, 60);
        assert_eq!(
            plain(&lines),
            [
                "# Title",
                "",
                "Some bold and code.",
                "",
                "• one",
                "• two",
                "  1. nested"
            ]
        );
        let bold = lines[2].spans.iter().find(|s| s.content == "bold").unwrap();
        assert!(bold.style.add_modifier.contains(Modifier::BOLD));
    }

    #[test]
    fn code_blocks_keep_their_lines_and_language() {
        let lines = render("```rust\nfn main() {\n    go();\n}\n```\n", 60);
        assert_eq!(
            plain(&lines),
            ["╭─ rust", "│ fn main() {", "│     go();", "│ }", "╰─"]
        );
    }

    #[test]
    fn tables_line_up_and_shrink_to_the_width() {
        let md = "| name | size |\n|:-----|-----:|\n| a | 1 |\n| bbbbbbbbbbbbbbbbbbbbbbbb | 22 |\n";
        let wide = plain(&render(md, 80));
        assert_eq!(wide[0], "┌──────────────────────────┬──────┐");
        assert_eq!(wide[1], "│ name                     │ size │");
        assert_eq!(wide[3], "│ a                        │    1 │");
        let narrow = plain(&render(md, 20));
        assert!(narrow.iter().all(|l| l.width() <= 20), "{narrow:#?}");
        assert!(narrow[4].contains('…'), "{narrow:#?}");
    }

    #[test]
    fn an_unfinished_stream_renders_what_there_is() {
        let lines = render("Here:\n\n```py\nprint(1", 40);
        assert_eq!(plain(&lines), ["Here:", "", "╭─ py", "│ print(1", "╰─"]);
    }

    #[test]
    fn quotes_and_links() {
        let lines = render("> careful\n\nSee [docs](https://example.org).", 60);
        assert_eq!(
            plain(&lines),
            ["▎ careful", "", "See docs (https://example.org)."]
        );
    }
}
