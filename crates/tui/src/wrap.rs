//! Word wrapping of styled lines. The transcript wraps its lines itself so
//! that it knows how many rows it has (for scrolling) without rendering.

use ratatui::text::{Line, Span};
use unicode_width::UnicodeWidthChar;

/// `line` broken into rows of at most `width` columns, at spaces where it
/// can and inside a word where it must. Continuation rows hang under the
/// text after a leading list marker, quote bar or indentation.
pub fn wrap(line: &Line<'static>, width: u16) -> Vec<Line<'static>> {
    let width = width.max(4) as usize;
    let total: usize = line.spans.iter().map(|s| text_width(&s.content)).sum();
    if total <= width {
        return vec![line.clone()];
    }
    let hang = hanging_indent(line).min(width / 2);
    // Characters with their styles, split into words (a word carries the
    // spaces after it, which may be dropped at a row's end).
    let chars: Vec<(char, ratatui::style::Style)> = line
        .spans
        .iter()
        .flat_map(|s| s.content.chars().map(move |c| (c, s.style)))
        .collect();
    let mut rows: Vec<Vec<(char, ratatui::style::Style)>> = vec![Vec::new()];
    let mut used = 0;
    let mut i = 0;
    while i < chars.len() {
        // The next word: non-spaces, then spaces.
        let mut j = i;
        while j < chars.len() && chars[j].0 != ' ' {
            j += 1;
        }
        let word_end = j;
        while j < chars.len() && chars[j].0 == ' ' {
            j += 1;
        }
        let word_w: usize = chars[i..word_end].iter().map(|(c, _)| cw(*c)).sum();
        if used + word_w > width && used > hang {
            // Start a new row, dropping the spaces that ended the last one.
            let row = rows.last_mut().expect("one row");
            while row.last().is_some_and(|(c, _)| *c == ' ') {
                row.pop();
            }
            rows.push(vec![(' ', ratatui::style::Style::default()); hang]);
            used = hang;
        }
        for &(c, st) in &chars[i..j] {
            let w = cw(c);
            if used + w > width {
                if c == ' ' {
                    continue;
                }
                rows.push(vec![(' ', ratatui::style::Style::default()); hang]);
                used = hang;
            }
            rows.last_mut().expect("one row").push((c, st));
            used += w;
        }
        i = j;
    }
    rows.into_iter().map(to_line).collect()
}

/// Wraps every line of `lines`.
pub fn wrap_all(lines: &[Line<'static>], width: u16) -> Vec<Line<'static>> {
    lines.iter().flat_map(|l| wrap(l, width)).collect()
}

fn cw(c: char) -> usize {
    c.width().unwrap_or(0)
}

fn text_width(s: &str) -> usize {
    s.chars().map(cw).sum()
}

/// Width of a leading run of indentation and markers: spaces, bullets,
/// quote and code bars, and a list number such as `12. `.
fn hanging_indent(line: &Line<'_>) -> usize {
    const LEAD: [char; 4] = [' ', '•', '▎', '│'];
    let text: String = line.spans.iter().map(|s| s.content.as_ref()).collect();
    let rest = text.trim_start_matches(LEAD);
    let mut width = text_width(&text[..text.len() - rest.len()]);
    // A list number: digits, a dot and a space.
    let digits = rest.chars().take_while(char::is_ascii_digit).count();
    if digits > 0 && rest[digits..].starts_with(". ") {
        width += digits + 2;
    }
    width
}

fn to_line(row: Vec<(char, ratatui::style::Style)>) -> Line<'static> {
    let mut spans: Vec<Span<'static>> = Vec::new();
    for (c, st) in row {
        match spans.last_mut() {
            Some(s) if s.style == st => s.content.to_mut().push(c),
            _ => spans.push(Span::styled(c.to_string(), st)),
        }
    }
    Line::from(spans)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_util::plain;

    #[test]
    fn words_wrap_and_list_items_hang() {
        let l = Line::from("• the quick brown fox jumps over the lazy dog");
        assert_eq!(
            plain(&wrap(&l, 16)),
            [
                "• the quick",
                "  brown fox",
                "  jumps over the",
                "  lazy dog"
            ]
        );
        let n = Line::from("12. alpha beta gamma delta");
        assert_eq!(
            plain(&wrap(&n, 12)),
            ["12. alpha", "    beta", "    gamma", "    delta"]
        );
    }

    #[test]
    fn a_long_word_is_broken_and_nothing_is_wider_than_the_width() {
        let l = Line::from("x".repeat(25));
        let rows = wrap(&l, 10);
        assert_eq!(
            plain(&rows),
            ["x".repeat(10), "x".repeat(10), "x".repeat(5)]
        );
        let wide = Line::from("日本語のテキストを折り返す");
        assert!(wrap(&wide, 7).iter().all(|r| r.width() <= 7));
    }

    #[test]
    fn styles_survive_wrapping() {
        let l = Line::from(vec![
            Span::raw("plain "),
            Span::styled("bold words here", ratatui::style::Style::new().bold()),
        ]);
        let rows = wrap(&l, 11);
        assert_eq!(plain(&rows), ["plain bold", "words here"]);
        assert!(
            rows[1].spans[0]
                .style
                .add_modifier
                .contains(ratatui::style::Modifier::BOLD)
        );
    }
}
