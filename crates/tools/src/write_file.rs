//! `write_file`: create or overwrite a file in the workspace.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::workspace::WsPath;
use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool, args};

pub struct WriteFile;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    path: String,
    content: String,
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "File to write, relative to /workspace or absolute under /workspace/. Missing parent directories are created."},
            "content": {"type": "string", "description": "The complete new content of the file."}
        },
        "required": ["path", "content"],
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Write a file in the workspace, replacing it whole if it exists and creating missing parent directories: for new files, or a file whose every line changes. Returns what was written (bytes, and whether the file was new). For changing part of an existing file use edit_file.";

impl TypedTool for WriteFile {
    const NAME: &'static str = "write_file";
    const READ_ONLY: bool = false;
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
        args::blocking(Self::NAME, ctx, input, write)
    }
}

fn write(ctx: &ToolContext, input: Input) -> ToolOutput {
    let result = WsPath::parse(&input.path).and_then(|p| {
        let ws = ctx.open_workspace()?;
        let created = ws.write(&p, input.content.as_bytes())?;
        Ok((p, created))
    });
    match result {
        Ok((p, created)) => {
            let n = input.content.len();
            let lines = input.content.lines().count() as u64;
            let verb = if created { "Created" } else { "Overwrote" };
            ToolOutput::ok(format!(
                "{verb} {} ({}, {}).",
                p.display(),
                crate::output::plural(n as u64, "byte"),
                crate::output::plural(lines, "line")
            ))
            .with_structured(json!({"path": p.display(), "bytes": n, "created": created}))
        }
        Err(e) => ToolOutput::error(e.to_string()),
    }
}
