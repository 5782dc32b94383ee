//! Keeping long command output to its head and tail, and showing it.

use std::collections::VecDeque;

pub use cordon_image::text::unprintable;

/// Text from the sandbox or the model, fit for a terminal: tabs become
/// four spaces and every other [`unprintable`] character (newlines
/// included) a `?`, so that no escape sequence in it reaches the user's
/// terminal and nothing reorders what is shown. The one sanitiser every
/// front end's printing goes through.
pub fn printable(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '\t' => out.push_str("    "),
            c if unprintable(c) => out.push('?'),
            c => out.push(c),
        }
    }
    out
}

/// [`printable`] line by line: the newlines are kept.
pub fn printable_lines(text: &str) -> String {
    text.split('\n')
        .map(printable)
        .collect::<Vec<_>>()
        .join("\n")
}

/// Collects a stream, keeping its first `head` and last `tail` bytes and
/// counting what falls between, so a command printing gigabytes costs
/// bounded memory and the model still sees how it started and ended.
#[derive(Debug, Clone)]
pub struct HeadTail {
    head_cap: usize,
    tail_cap: usize,
    head: Vec<u8>,
    tail: VecDeque<u8>,
    dropped_bytes: u64,
    dropped_lines: u64,
}

impl HeadTail {
    pub fn new(head: usize, tail: usize) -> Self {
        HeadTail {
            head_cap: head,
            tail_cap: tail,
            head: Vec::new(),
            tail: VecDeque::new(),
            dropped_bytes: 0,
            dropped_lines: 0,
        }
    }

    pub fn push(&mut self, mut data: &[u8]) {
        if self.head.len() < self.head_cap {
            let n = (self.head_cap - self.head.len()).min(data.len());
            self.head.extend_from_slice(&data[..n]);
            data = &data[n..];
        }
        // Bytes that would only pass through the tail are dropped at once.
        if data.len() > self.tail_cap {
            let skip = data.len() - self.tail_cap;
            self.drop_bytes(&data[..skip]);
            data = &data[skip..];
        }
        let overflow = (self.tail.len() + data.len()).saturating_sub(self.tail_cap);
        if overflow > 0 {
            let gone: Vec<u8> = self.tail.drain(..overflow).collect();
            self.drop_bytes(&gone);
        }
        self.tail.extend(data);
    }

    fn drop_bytes(&mut self, b: &[u8]) {
        self.dropped_bytes += b.len() as u64;
        self.dropped_lines += b.iter().filter(|&&c| c == b'\n').count() as u64;
    }

    pub fn total_bytes(&self) -> u64 {
        self.head.len() as u64 + self.tail.len() as u64 + self.dropped_bytes
    }

    pub fn dropped_bytes(&self) -> u64 {
        self.dropped_bytes
    }

    pub fn is_empty(&self) -> bool {
        self.total_bytes() == 0
    }

    /// The kept text with a marker where bytes were dropped.
    pub fn render(&self) -> String {
        let tail: Vec<u8> = self.tail.iter().copied().collect();
        if self.dropped_bytes == 0 {
            let mut all = self.head.clone();
            all.extend_from_slice(&tail);
            return String::from_utf8_lossy(&all).into_owned();
        }
        format!(
            "{}\n[... {} ({}) of output dropped; the first {} and last {} bytes are shown ...]\n{}",
            String::from_utf8_lossy(&self.head),
            plural(self.dropped_bytes, "byte"),
            plural(self.dropped_lines, "line"),
            self.head.len(),
            tail.len(),
            String::from_utf8_lossy(&tail)
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn printable_text_carries_no_control_character() {
        let evil = "a\u{1b}]52;c;eA==\u{7}b\tc\r\nd\u{9b}2K";
        assert_eq!(printable(evil), "a?]52;c;eA==?b    c??d?2K");
        assert_eq!(printable_lines(evil), "a?]52;c;eA==?b    c?\nd?2K");
        // Shown in the order it runs, not reversed by an override.
        assert_eq!(
            printable("rm -rf ~ #\u{202E}txt.eman"),
            "rm -rf ~ #?txt.eman"
        );
    }

    #[test]
    fn short_output_is_kept_whole() {
        let mut h = HeadTail::new(4, 4);
        h.push(b"abc");
        h.push(b"def");
        assert_eq!(h.render(), "abcdef");
        assert_eq!(h.dropped_bytes(), 0);
    }

    #[test]
    fn long_output_keeps_head_and_tail_and_counts_the_middle() {
        let mut h = HeadTail::new(4, 4);
        for _ in 0..10 {
            h.push(b"012\n");
        }
        assert_eq!(h.total_bytes(), 40);
        assert_eq!(h.dropped_bytes(), 32);
        let r = h.render();
        assert!(r.starts_with("012\n"), "{r}");
        assert!(r.ends_with("012\n"), "{r}");
        assert!(r.contains("32 bytes (8 lines)"), "{r}");
    }
}

/// `n` and `noun`, plural unless `n` is one: "1 line", "2 lines". For
/// nouns whose plural takes an s.
pub fn plural(n: u64, noun: &str) -> String {
    if n == 1 {
        format!("1 {noun}")
    } else {
        format!("{n} {noun}s")
    }
}

#[cfg(test)]
mod plural_tests {
    #[test]
    fn one_is_singular_and_the_rest_plural() {
        assert_eq!(super::plural(1, "line"), "1 line");
        assert_eq!(super::plural(0, "line"), "0 lines");
        assert_eq!(super::plural(2, "model request"), "2 model requests");
    }
}
