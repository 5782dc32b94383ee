//! `write_file`: create or overwrite a file in the workspace.

use serde::Deserialize;
use serde_json::{Value, json};

use crate::workspace::WsPath;
use crate::{Tool, ToolContext, ToolFuture, ToolOutput, args};

pub struct WriteFile;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Input {
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

impl Tool for WriteFile {
    fn name(&self) -> &str {
        "write_file"
    }
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn read_only(&self) -> bool {
        false
    }
    fn call<'a>(&'a self, ctx: &'a ToolContext, input: Value) -> ToolFuture<'a> {
        Box::pin(args::parse_then_blocking::<Input, _>(
            "write_file",
            schema(),
            ctx,
            input,
            write,
        ))
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
