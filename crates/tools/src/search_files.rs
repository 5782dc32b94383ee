//! `search_files`: regex search over the workspace with ripgrep's crates.

use std::io;
use std::ops::ControlFlow;

use grep_regex::RegexMatcherBuilder;
use grep_searcher::{BinaryDetection, Searcher, SearcherBuilder, Sink, SinkContext, SinkMatch};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::walk::{Kind, MAX_WALK_DEPTH, Walk, open_file_at};
use crate::workspace::WsPath;
use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool, args};

pub struct SearchFiles;

pub const DEFAULT_MAX_RESULTS: usize = 100;
pub const MAX_RESULTS: usize = 2000;
pub const MAX_CONTEXT: usize = 10;
/// Characters of a matching line shown before it is cut.
const MAX_LINE_CHARS: usize = 300;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    pattern: String,
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    glob: Option<String>,
    #[serde(default)]
    context: Option<usize>,
    #[serde(default)]
    case_insensitive: bool,
    #[serde(default)]
    max_results: Option<usize>,
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "pattern": {"type": "string", "description": "Regular expression (Rust regex syntax, like ripgrep) to look for, line by line."},
            "path": {"type": "string", "description": "Directory (or file) to search, relative to /workspace or absolute under /workspace/. Default: the whole workspace."},
            "glob": {"type": "string", "description": "Only search files matching this glob, e.g. `*.rs` or `src/**/*.py` (relative to `path`). Prefix with `!` to exclude instead."},
            "context": {"type": "integer", "minimum": 0, "maximum": MAX_CONTEXT, "description": "Lines of context to show before and after each match. Default 0."},
            "case_insensitive": {"type": "boolean", "description": "Match regardless of case. Default false."},
            "max_results": {"type": "integer", "minimum": 1, "maximum": MAX_RESULTS, "description": "Stop after this many matching lines. Default 100."}
        },
        "required": ["pattern"],
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Search file contents in the workspace with a regular expression (ripgrep's engine): to find where something is defined or used before reading or editing it. Honours .gitignore and skips binary files. Results are `path:line:text` for matching lines and `path-line-text` for context lines, with `--` between separate groups. Narrow with `path` and `glob`; results are capped and the output says when they were.";

impl TypedTool for SearchFiles {
    const NAME: &'static str = "search_files";
    const READ_ONLY: bool = true;
    type Input = Input;
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn label(&self, input: &Input) -> String {
        match &input.path {
            Some(path) => format!("{} in {path}", input.pattern),
            None => input.pattern.clone(),
        }
    }
    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Input) -> ToolFuture<'a> {
        args::blocking(Self::NAME, ctx, input, search)
    }
}

struct Collect<'a> {
    out: &'a mut String,
    path: &'a str,
    matches: &'a mut usize,
    cap: usize,
    capped: &'a mut bool,
}

fn line_text(bytes: &[u8]) -> String {
    let s = String::from_utf8_lossy(bytes);
    let s = s.trim_end_matches(['\n', '\r']);
    match s.char_indices().nth(MAX_LINE_CHARS) {
        Some((cut, _)) => format!("{}[... cut]", &s[..cut]),
        None => s.to_string(),
    }
}

impl Sink for Collect<'_> {
    type Error = io::Error;

    fn matched(&mut self, _: &Searcher, m: &SinkMatch<'_>) -> Result<bool, io::Error> {
        if *self.matches >= self.cap {
            *self.capped = true;
            return Ok(false);
        }
        *self.matches += 1;
        let n = m.line_number().unwrap_or(0);
        self.out
            .push_str(&format!("{}:{n}:{}\n", self.path, line_text(m.bytes())));
        Ok(true)
    }

    fn context(&mut self, _: &Searcher, c: &SinkContext<'_>) -> Result<bool, io::Error> {
        let n = c.line_number().unwrap_or(0);
        self.out
            .push_str(&format!("{}-{n}-{}\n", self.path, line_text(c.bytes())));
        Ok(true)
    }

    fn context_break(&mut self, _: &Searcher) -> Result<bool, io::Error> {
        self.out.push_str("--\n");
        Ok(true)
    }
}

fn search(ctx: &ToolContext, input: Input) -> ToolOutput {
    let dir = match WsPath::parse(input.path.as_deref().unwrap_or(".")) {
        Ok(d) => d,
        Err(e) => return ToolOutput::error(e.to_string()),
    };
    let matcher = match RegexMatcherBuilder::new()
        .case_insensitive(input.case_insensitive)
        .build(&input.pattern)
    {
        Ok(m) => m,
        Err(e) => {
            return ToolOutput::error(format!(
                "Invalid regular expression {:?}: {e}. Escape special characters such as ( [ {{ . * + ? with a backslash to match them literally.",
                input.pattern
            ));
        }
    };
    let context = input.context.unwrap_or(0).min(MAX_CONTEXT);
    let cap = input
        .max_results
        .unwrap_or(DEFAULT_MAX_RESULTS)
        .clamp(1, MAX_RESULTS);
    let mut searcher = SearcherBuilder::new()
        .line_number(true)
        .before_context(context)
        .after_context(context)
        .binary_detection(BinaryDetection::quit(0))
        .build();

    // A file as `path`: search just it.
    let ws = match ctx.open_workspace() {
        Ok(w) => w,
        Err(e) => return ToolOutput::error(e.to_string()),
    };
    let single = match ws.open_read(&dir) {
        Ok((f, _)) => Some(f),
        Err(crate::WorkspaceError::IsDirectory { .. }) => None,
        Err(e) => return ToolOutput::error(e.to_string()),
    };
    let (mut out, mut matches, mut capped, mut files) = (String::new(), 0usize, false, 0usize);
    let (mut changed, mut too_deep) = (0usize, 0usize);
    let mut search_one = |file: std::fs::File, shown: &str, out: &mut String| {
        let before = matches;
        let mut sink = Collect {
            out,
            path: shown,
            matches: &mut matches,
            cap,
            capped: &mut capped,
        };
        if let Err(e) = searcher.search_file(&matcher, &file, &mut sink) {
            tracing::debug!(path = shown, error = %e, "search skipped a file");
        }
        let stop = *sink.capped;
        (before != *sink.matches, stop)
    };
    if let Some(f) = single {
        // Shown like walk results: relative to the workspace root.
        if search_one(f, &dir.rel.display().to_string(), &mut out).0 {
            files += 1;
        }
    } else {
        let mut walk = match Walk::new(ctx, &dir) {
            Ok(w) => w,
            Err(e) => return ToolOutput::error(e),
        };
        if let Some(glob) = input.glob.as_deref().filter(|g| !g.is_empty())
            && let Err(e) = walk.glob(glob)
        {
            return ToolOutput::error(format!("Invalid glob {glob:?}: {e}"));
        }
        walk.run(|entry| {
            if entry.kind != Kind::File {
                return ControlFlow::Continue(());
            }
            // Opened in the directory the walk holds, never through a link.
            let Ok((f, _)) = open_file_at(entry.dir, entry.name) else {
                return ControlFlow::Continue(());
            };
            let shown = dir.rel.join(entry.rel);
            let shown = shown.strip_prefix(".").unwrap_or(&shown);
            let (found, stop) = search_one(f, &shown.display().to_string(), &mut out);
            if found {
                files += 1;
                if context > 0 {
                    out.push_str("--\n");
                }
            }
            if stop {
                ControlFlow::Break(())
            } else {
                ControlFlow::Continue(())
            }
        });
        changed = walk.changed;
        too_deep = walk.too_deep;
    }
    let note = if changed > 0 {
        format!(
            "[{changed} director{} changed while being searched (replaced by a link or a file, or removed) and {} not searched; search again once nothing is renaming them]\n",
            if changed == 1 { "y" } else { "ies" },
            if changed == 1 { "was" } else { "were" },
        )
    } else {
        String::new()
    };
    let note = if too_deep > 0 {
        format!(
            "{note}[{too_deep} director{} deeper than {MAX_WALK_DEPTH} levels not searched; search there with path]\n",
            if too_deep == 1 { "y" } else { "ies" },
        )
    } else {
        note
    };
    if matches == 0 {
        return ToolOutput::ok(format!(
            "No matches for {:?} in {}{}.{}",
            input.pattern,
            dir.display(),
            input
                .glob
                .as_deref()
                .map(|g| format!(" (files matching {g:?})"))
                .unwrap_or_default(),
            if note.is_empty() {
                String::new()
            } else {
                format!("\n{note}")
            }
        ))
        .with_structured(json!({"matches": 0, "files": 0, "capped": false, "changed": changed}));
    }
    if out.ends_with("--\n") {
        out.truncate(out.len() - 3);
    }
    if capped {
        out.push_str(&format!(
            "[results capped at {cap} matching lines; there are more. Narrow the pattern, path or glob, or raise max_results]\n"
        ));
    } else {
        out.push_str(&format!(
            "[{matches} matching line{} in {files} file{}]\n",
            if matches == 1 { "" } else { "s" },
            if files == 1 { "" } else { "s" }
        ));
    }
    out.push_str(&note);
    ToolOutput::ok(out).with_structured(
        json!({"matches": matches, "files": files, "capped": capped, "changed": changed}),
    )
}
