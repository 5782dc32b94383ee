//! Text that came from outside (a layer, a sandbox's files, a build
//! context, a model), fit for a terminal or an error message. The lowest
//! crate that prints such text holds the rule, so every printer above it
//! shares one.

/// Whether `c` must not reach a reader as it is: a control character
/// (an escape sequence starts with one), or one of Unicode's explicit
/// bidirectional embeddings, overrides and isolates, which make a
/// terminal or a browser show text in another order than it runs
/// ("Trojan Source", CVE-2021-42574): `rm -rf ~ #` could read as a
/// harmless command in an approval prompt. The marks (U+200E, U+200F)
/// only nudge neutral characters and stay, for right-to-left text.
pub fn unprintable(c: char) -> bool {
    c.is_control() || matches!(c, '\u{202A}'..='\u{202E}' | '\u{2066}'..='\u{2069}')
}

/// `path` as text: invalid UTF-8 replaced, [`unprintable`] characters
/// shown as `?` (no escape sequence reaches a terminal, no text is
/// reordered), cut at 200 characters.
pub fn shown(path: &[u8]) -> String {
    String::from_utf8_lossy(path)
        .chars()
        .take(200)
        .map(|c| if unprintable(c) { '?' } else { c })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_control_or_reordering_character_is_shown() {
        // Each explicit bidirectional formatting character, then the
        // marks right-to-left text needs, which stay.
        let evil =
            "a\u{202A}\u{202B}\u{202C}\u{202D}\u{202E}\u{2066}\u{2067}\u{2068}\u{2069}\u{1b}[2Jb";
        assert_eq!(shown(evil.as_bytes()), "a??????????[2Jb");
        assert_eq!(shown("\u{5e9}\u{200f}x".as_bytes()), "\u{5e9}\u{200f}x");
        assert_eq!(shown(&[b'x'; 300]).len(), 200);
    }
}
