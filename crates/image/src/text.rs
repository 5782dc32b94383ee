//! Names that came from outside (a layer, a sandbox's files, a build
//! context), fit for an error message.

/// `path` as text: invalid UTF-8 replaced, control characters shown as
/// `?` (no escape sequence reaches a terminal), cut at 200 characters.
pub fn shown(path: &[u8]) -> String {
    String::from_utf8_lossy(path)
        .chars()
        .take(200)
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}
