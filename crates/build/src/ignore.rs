//! `.dockerignore` read by Docker's rules, so that a build's context holds
//! what Docker's would: a file Docker leaves out could be a secret the
//! user meant to keep out of the image.

use globset::{GlobBuilder, GlobMatcher};

/// A pattern cordon cannot use, with its 1-based line.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(".dockerignore line {line}: `{pattern}`: {message}")]
pub struct IgnoreError {
    pub line: usize,
    pub pattern: String,
    pub message: String,
}

/// The patterns of a `.dockerignore`, in order.
#[derive(Debug, Clone)]
pub struct Ignore {
    patterns: Vec<Pattern>,
}

#[derive(Debug, Clone)]
struct Pattern {
    /// `!pattern`: brings back what an earlier pattern excluded.
    exception: bool,
    glob: GlobMatcher,
    /// One per `/`-separated part, `None` for a part with `**`: lets
    /// `may_include_beneath` rule out a directory part by part.
    parts: Vec<Option<GlobMatcher>>,
}

impl Ignore {
    /// Parses a .dockerignore's text. Lines starting with `#` are comments;
    /// blank lines skipped; each pattern is trimmed, cleaned like Go's
    /// filepath.Clean (so `./a//b/` is `a/b`), a leading `/` removed; `!`
    /// starts an exception; `**` matches any number of directories; `*` and
    /// `?` do not match `/`; `[...]` classes; last matching pattern wins.
    pub fn parse(text: &str) -> Result<Ignore, IgnoreError> {
        let text = text.strip_prefix('\u{feff}').unwrap_or(text);
        let mut patterns = Vec::new();
        for (at, line) in text.lines().enumerate() {
            // Docker takes `#` as a comment only in the first column.
            if line.starts_with('#') {
                continue;
            }
            let trimmed = line.trim();
            if trimmed.is_empty() {
                continue;
            }
            let bad = |message: String| IgnoreError {
                line: at + 1,
                pattern: trimmed.to_string(),
                message,
            };
            let (exception, pattern) = match trimmed.strip_prefix('!') {
                Some(rest) => (true, rest.trim()),
                None => (false, trimmed),
            };
            if pattern.is_empty() {
                return Err(bad("`!` needs a pattern after it".into()));
            }
            let cleaned = clean(pattern);
            let cleaned = match cleaned.strip_prefix('/') {
                Some(relative) if !relative.is_empty() => relative.to_string(),
                _ => cleaned,
            };
            let glob = compile(&cleaned).map_err(bad)?;
            // A part that cannot stand alone (a class holding `/`) could match anything.
            let parts = cleaned
                .split('/')
                .map(|part| {
                    if part.contains("**") {
                        None
                    } else {
                        compile(part).ok()
                    }
                })
                .collect();
            patterns.push(Pattern {
                exception,
                glob,
                parts,
            });
        }
        Ok(Ignore { patterns })
    }

    /// No patterns: nothing ignored.
    pub fn none() -> Ignore {
        Ignore {
            patterns: Vec::new(),
        }
    }

    /// Whether the context path `rel` (relative, `/`-separated, no leading
    /// `./`) is excluded. A pattern that matches a directory also excludes
    /// everything beneath it: as in Docker, a pattern matches a path if it
    /// matches the path or any of its parent directories, and the last
    /// pattern that matches decides.
    pub fn excludes(&self, rel: &str) -> bool {
        let rel = rel.trim_end_matches('/');
        if rel.is_empty() {
            return false;
        }
        let mut excluded = false;
        for pattern in &self.patterns {
            // Only an exception can change an excluded path, and only an
            // exclusion an included one.
            if pattern.exception != excluded {
                continue;
            }
            if pattern.matches_or_parent(rel) {
                excluded = !pattern.exception;
            }
        }
        excluded
    }

    /// Whether some exception (`!pattern`) could match a path beneath the
    /// directory `rel`, so a walker must still descend into an excluded
    /// directory.
    pub fn may_include_beneath(&self, rel: &str) -> bool {
        let rel = rel.trim_matches('/');
        let dirs: Vec<&str> = if rel.is_empty() {
            Vec::new()
        } else {
            rel.split('/').collect()
        };
        self.patterns
            .iter()
            .filter(|p| p.exception)
            .any(|p| p.may_match_beneath(&dirs))
    }
}

impl Pattern {
    fn matches_or_parent(&self, rel: &str) -> bool {
        self.glob.is_match(rel)
            || rel
                .match_indices('/')
                .any(|(at, _)| self.glob.is_match(&rel[..at]))
    }

    /// Whether the pattern could match some path beneath the directory
    /// `dirs`: it could unless one of its parts fails the directory's part
    /// at the same depth.
    fn may_match_beneath(&self, dirs: &[&str]) -> bool {
        for (depth, dir) in dirs.iter().enumerate() {
            match self.parts.get(depth) {
                // The pattern names an ancestor of `dirs`, and so matches
                // all beneath it.
                None => return true,
                Some(None) => return true,
                Some(Some(part)) if !part.is_match(dir) => return false,
                Some(Some(_)) => {}
            }
        }
        true
    }
}

/// Go's `filepath.Clean` on a `/`-separated path, as Docker applies it to
/// each pattern.
fn clean(path: &str) -> String {
    let rooted = path.starts_with('/');
    let mut parts: Vec<&str> = Vec::new();
    for part in path.split('/') {
        match part {
            "" | "." => {}
            ".." if parts.last().is_some_and(|p| *p != "..") => {
                parts.pop();
            }
            // Above the root is the root.
            ".." if rooted => {}
            part => parts.push(part),
        }
    }
    let joined = parts.join("/");
    match (rooted, joined.is_empty()) {
        (true, _) => format!("/{joined}"),
        (false, true) => ".".into(),
        (false, false) => joined,
    }
}

/// A pattern as globset reads it, where globset's syntax parts from
/// Docker's: braces are literal to Docker, and a trailing backslash
/// matches itself. `[!...]` is refused rather than translated: Docker
/// takes the `!` literally where shells and globset negate.
fn compile(pattern: &str) -> Result<GlobMatcher, String> {
    let mut glob = String::new();
    let mut chars = pattern.chars().peekable();
    let mut in_class = false;
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some(next) => {
                    glob.push('\\');
                    glob.push(next);
                }
                None => glob.push_str("\\\\"),
            },
            '[' if !in_class => {
                if chars.peek() == Some(&'!') {
                    return Err("`[!...]` matches `!` in Docker but negates in shells: write `[^...]` to negate".into());
                }
                in_class = true;
                glob.push('[');
                // A `]` first in a class is one of its characters.
                if let Some(first) = chars.next_if(|c| *c == '^' || *c == ']') {
                    glob.push(first);
                    if first == '^'
                        && let Some(bracket) = chars.next_if_eq(&']')
                    {
                        glob.push(bracket);
                    }
                }
            }
            ']' if in_class => {
                in_class = false;
                glob.push(']');
            }
            '{' | '}' if !in_class => {
                glob.push('\\');
                glob.push(c);
            }
            c => glob.push(c),
        }
    }
    GlobBuilder::new(&glob)
        .literal_separator(true)
        .backslash_escape(true)
        .build()
        .map(|g| g.compile_matcher())
        .map_err(|e| e.kind().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ignore(text: &str) -> Ignore {
        match Ignore::parse(text) {
            Ok(i) => i,
            Err(e) => panic!("{text:?}: {e}"),
        }
    }

    /// Asserts which of `paths` `text` excludes.
    fn check(text: &str, excluded: &[&str], kept: &[&str]) {
        let i = ignore(text);
        for path in excluded {
            assert!(i.excludes(path), "{text:?} should exclude {path}");
        }
        for path in kept {
            assert!(!i.excludes(path), "{text:?} should keep {path}");
        }
    }

    #[test]
    fn star_stays_in_its_directory() {
        check(
            "*.log\n",
            &["a.log", ".log", "x.log/inner"],
            &["dir/a.log", "a.txt", "a.log.txt"],
        );
    }

    #[test]
    fn a_directory_and_all_beneath_it() {
        check(
            "build/\n",
            &["build", "build/x", "build/x/y"],
            &["builder", "src/build", "build.rs"],
        );
    }

    #[test]
    fn double_star_at_any_depth() {
        check(
            "**/node_modules\n",
            &["node_modules", "a/node_modules", "a/b/node_modules/x/y"],
            &["node_modules_x", "a/node_modulesx"],
        );
        check(
            "a/**/b\n",
            &["a/b", "a/x/b", "a/x/y/b", "a/b/c"],
            &["b", "a/xb", "x/a/b"],
        );
        check("**\n", &["a", "a/b"], &[]);
        check("**/*.tmp\n", &["a.tmp", "x/y/a.tmp"], &["a.tmpx"]);
    }

    #[test]
    fn question_mark_and_classes() {
        check("a?c\n", &["abc", "a.c"], &["a/c", "ac", "abbc"]);
        check("[ab].txt\n", &["a.txt", "b.txt"], &["c.txt", "ab.txt"]);
        check("[^ab].txt\n", &["c.txt"], &["a.txt", "b.txt"]);
        check("[a-c]x\n", &["bx"], &["dx"]);
        check("[]]\n", &["]"], &["a"]);
    }

    #[test]
    fn an_exception_after_a_pattern() {
        check(
            "*.log\n!important.log\n",
            &["a.log", "x.log"],
            &["important.log", "a.txt"],
        );
    }

    #[test]
    fn the_last_matching_pattern_wins() {
        check("!a.log\n*.log\n", &["a.log"], &[]);
        check("*.log\n!a.log\n*.log\n", &["a.log"], &[]);
        check(
            "*\n!keep\nkeep/secret\n",
            &["x", "keep/secret", "keep/secret/y"],
            &["keep", "keep/other"],
        );
    }

    #[test]
    fn an_exception_inside_an_excluded_directory() {
        let i = ignore("docs/**\n!docs/keep.md\n");
        assert!(!i.excludes("docs"));
        assert!(i.excludes("docs/a.md"));
        assert!(i.excludes("docs/sub/x"));
        assert!(!i.excludes("docs/keep.md"));
        assert!(i.may_include_beneath("docs"));
        assert!(!i.may_include_beneath("src"));
        assert!(!i.may_include_beneath("docs/sub"));

        let i = ignore("build\n!build/keep\n");
        assert!(i.excludes("build"));
        assert!(i.excludes("build/other"));
        assert!(!i.excludes("build/keep"));
        assert!(!i.excludes("build/keep/deeper"));
        assert!(i.may_include_beneath("build"));
        assert!(i.may_include_beneath("build/keep"));
        assert!(!i.may_include_beneath("other"));
        assert!(!i.may_include_beneath("build/other"));
    }

    #[test]
    fn may_include_beneath_through_wildcards() {
        let i = ignore("*\n!*/src/*.rs\n!**/keep\n");
        assert!(i.may_include_beneath("anything"));
        let i = ignore("*\n!*/src/*.rs\n");
        assert!(i.may_include_beneath("crate"));
        assert!(i.may_include_beneath("crate/src"));
        assert!(!i.may_include_beneath("crate/docs"));
        assert!(i.may_include_beneath(""));
        assert!(!ignore("*\n").may_include_beneath("a"));
        assert!(!Ignore::none().may_include_beneath("a"));
    }

    #[test]
    fn comments_blank_lines_and_whitespace() {
        let text = "# a comment\n\n   \n  *.tmp  \n#*.log\n  # not a comment\n";
        check(
            text,
            &["a.tmp", "# not a comment"],
            &["a.log", "# a comment"],
        );
    }

    #[test]
    fn patterns_are_cleaned() {
        check("./x\n", &["x", "x/y"], &["a/x"]);
        check("/x\n", &["x"], &["a/x"]);
        check("./a//b/\n", &["a/b", "a/b/c"], &["a"]);
        check("a/../b\n", &["b"], &["a/b"]);
        check("! ./keep \n", &[], &["keep"]);
        assert_eq!(clean("./a//b/"), "a/b");
        assert_eq!(clean("/../a/./b/.."), "/a");
        assert_eq!(clean("../a"), "../a");
        assert_eq!(clean("a/.."), ".");
        assert_eq!(clean("/"), "/");
    }

    #[test]
    fn crlf_and_a_byte_order_mark() {
        check("\u{feff}*.log\r\n!a.log\r\n", &["b.log"], &["a.log"]);
    }

    #[test]
    fn braces_and_escapes_are_literal() {
        check("{a,b}\n", &["{a,b}"], &["a", "b"]);
        check("\\*\n", &["*"], &["a"]);
        check("a\\\n", &["a\\"], &["a"]);
    }

    #[test]
    fn nothing_is_excluded_without_patterns() {
        let none = Ignore::none();
        assert!(!none.excludes("a"));
        assert!(!ignore("").excludes("a"));
        assert!(!ignore("*\n").excludes(""));
    }

    #[test]
    fn bad_patterns_name_their_line() {
        let e = Ignore::parse("ok\n\n[z-a]\n").unwrap_err();
        assert_eq!((e.line, e.pattern.as_str()), (3, "[z-a]"));
        assert!(
            e.to_string().starts_with(".dockerignore line 3: `[z-a]`: "),
            "{e}"
        );
        assert_eq!(Ignore::parse("[abc\n").unwrap_err().line, 1);
        assert_eq!(Ignore::parse("a\n!\n").unwrap_err().line, 2);
        assert!(
            Ignore::parse("[!a]\n")
                .unwrap_err()
                .message
                .contains("[^...]")
        );
    }
}
