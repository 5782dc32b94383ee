//! `read_file`: a text file with numbered lines, like `cat -n`.

use std::fs::File;
use std::io::Read;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::workspace::WsPath;
use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool, args};

pub struct ReadFile;

/// Lines shown when no `limit` is given.
pub const DEFAULT_LINES: usize = 2000;
/// Characters of one line shown before it is cut.
pub const MAX_LINE_CHARS: usize = 2000;
/// Bytes of numbered text returned at most, whatever the line count.
pub const MAX_OUTPUT_BYTES: usize = 100 * 1024;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    path: String,
    #[serde(default)]
    offset: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to read, relative to /workspace or absolute under /workspace/."},
            "offset": {"type": "integer", "minimum": 1, "description": "First line to show (1-based). Default 1."},
            "limit": {"type": "integer", "minimum": 1, "description": "How many lines to show. Default 2000."}
        },
        "required": ["path"],
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Read a text file from the workspace. Lines are numbered like `cat -n` (the number and a tab come before each line; they are not part of the file). Use `offset` and `limit` to read part of a long file; the result says when more lines follow. Binary files are refused. Read a file before editing it.";

/// Why bytes are not shown as text, if they are not.
pub(crate) fn binary_reason(bytes: &[u8]) -> Option<&'static str> {
    if bytes[..bytes.len().min(8192)].contains(&0) {
        Some("it contains NUL bytes")
    } else if std::str::from_utf8(bytes).is_err() {
        Some("it is not valid UTF-8 text")
    } else {
        None
    }
}

/// The bytes of `file`, opened at `p` and `size` bytes long, when it is
/// no larger than `max` (the file tools' limit); errors phrased for the
/// model.
pub(crate) fn read_capped(p: &WsPath, file: File, size: u64, max: u64) -> Result<Vec<u8>, String> {
    if size > max {
        return Err(format!(
            "{}: the file is {size} bytes, more than the {max} bytes file tools handle; use bash (e.g. head, sed -n, grep) to look at parts of it",
            p.display(),
        ));
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(max + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| format!("{}: {e}", p.display()))?;
    Ok(bytes)
}

/// Reads a whole text file beneath the workspace, for `read_file` and
/// `edit_file`, with errors phrased for the model.
pub(crate) fn read_text(ctx: &ToolContext, path: &str) -> Result<(WsPath, String), String> {
    let p = WsPath::parse(path).map_err(|e| e.to_string())?;
    let ws = ctx.open_workspace().map_err(|e| e.to_string())?;
    let (file, size) = ws.open_read(&p).map_err(|e| e.to_string())?;
    let bytes = read_capped(&p, file, size, ctx.limits.max_file_bytes)?;
    if let Some(why) = binary_reason(&bytes) {
        return Err(format!(
            "{}: this looks like a binary file ({why}, {} bytes), which read_file does not show; inspect it with bash (e.g. `file`, `xxd | head`) if needed",
            p.display(),
            bytes.len()
        ));
    }
    let text = String::from_utf8(bytes).expect("checked above");
    Ok((p, text))
}

impl TypedTool for ReadFile {
    const NAME: &'static str = "read_file";
    const READ_ONLY: bool = true;
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
        args::blocking(Self::NAME, ctx, input, read)
    }
}

fn read(ctx: &ToolContext, input: Input) -> ToolOutput {
    let (p, text) = match read_text(ctx, &input.path) {
        Ok(t) => t,
        Err(e) => return ToolOutput::error(e),
    };
    let lines: Vec<&str> = text.lines().collect();
    let total = lines.len();
    if total == 0 {
        return ToolOutput::ok(format!("{} is empty.", p.display()))
            .with_structured(json!({"total_lines": 0}));
    }
    let offset = input.offset.unwrap_or(1).max(1);
    if offset > total {
        return ToolOutput::error(format!(
            "{}: offset {offset} is past the end of the file, which has {total} lines",
            p.display()
        ));
    }
    let limit = input.limit.unwrap_or(DEFAULT_LINES).max(1);
    let mut out = String::new();
    let mut last = offset - 1;
    for (i, line) in lines.iter().enumerate().skip(offset - 1).take(limit) {
        let shown = match line.char_indices().nth(MAX_LINE_CHARS) {
            Some((cut, _)) => format!(
                "{}[... line cut at {MAX_LINE_CHARS} characters]",
                &line[..cut]
            ),
            None => line.to_string(),
        };
        let numbered = format!("{:>6}\t{shown}\n", i + 1);
        if out.len() + numbered.len() > MAX_OUTPUT_BYTES && !out.is_empty() {
            break;
        }
        out.push_str(&numbered);
        last = i + 1;
    }
    if last < total {
        out.push_str(&format!(
            "[showing lines {offset}-{last} of {total}; read on with offset {}]\n",
            last + 1
        ));
    }
    ToolOutput::ok(out).with_structured(json!({
        "path": p.display(),
        "total_lines": total,
        "first_line": offset,
        "last_line": last,
    }))
}
