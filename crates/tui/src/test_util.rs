//! Helpers for the crate's tests.

use ratatui::text::Line;

/// The text of each line, styles dropped.
pub fn plain(lines: &[Line<'_>]) -> Vec<String> {
    lines
        .iter()
        .map(|l| l.spans.iter().map(|s| s.content.as_ref()).collect())
        .collect()
}
