//! `list_dir`: a tree of the workspace to a depth, honouring `.gitignore`.

use serde::Deserialize;
use serde_json::{Value, json};

use std::ops::ControlFlow;

use crate::walk::{Kind, Walk, read_link_at};
use crate::workspace::WsPath;
use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool, args};

pub struct ListDir;

pub const DEFAULT_DEPTH: usize = 2;
pub const MAX_DEPTH: usize = 20;
pub const DEFAULT_LIMIT: usize = 500;
pub const MAX_LIMIT: usize = 5000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    #[serde(default)]
    path: Option<String>,
    #[serde(default)]
    depth: Option<usize>,
    #[serde(default)]
    limit: Option<usize>,
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "path": {"type": "string", "description": "Directory to list, relative to /workspace or absolute under /workspace/. Default: the workspace root."},
            "depth": {"type": "integer", "minimum": 1, "maximum": MAX_DEPTH, "description": "How many levels deep to go. Default 2."},
            "limit": {"type": "integer", "minimum": 1, "maximum": MAX_LIMIT, "description": "Most entries to show. Default 500."}
        },
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "List a directory of the workspace as an indented tree, to a given depth: to find your way in a project before reading or searching. Directories end with `/`, symbolic links show their target. Files ignored by .gitignore (and the .git directory) are left out. Long listings are capped; list a subdirectory or lower the depth to see the rest.";

impl TypedTool for ListDir {
    const NAME: &'static str = "list_dir";
    const READ_ONLY: bool = true;
    type Input = Input;
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn label(&self, input: &Input) -> String {
        input.path.as_deref().unwrap_or("/workspace").to_string()
    }
    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Input) -> ToolFuture<'a> {
        args::blocking(Self::NAME, ctx, input, list)
    }
}

fn list(ctx: &ToolContext, input: Input) -> ToolOutput {
    let dir = match WsPath::parse(input.path.as_deref().unwrap_or(".")) {
        Ok(d) => d,
        Err(e) => return ToolOutput::error(e.to_string()),
    };
    let depth = input.depth.unwrap_or(DEFAULT_DEPTH).clamp(1, MAX_DEPTH);
    let limit = input.limit.unwrap_or(DEFAULT_LIMIT).clamp(1, MAX_LIMIT);
    let mut walk = match Walk::new(ctx, &dir) {
        Ok(w) => w,
        Err(e) => return ToolOutput::error(e),
    };
    walk.max_depth(depth);
    let mut out = format!("{}/\n", dir.display());
    let (mut shown, mut total) = (0usize, 0usize);
    walk.run(|entry| {
        total += 1;
        if shown >= limit {
            return ControlFlow::Continue(());
        }
        shown += 1;
        let name = entry.name.to_string_lossy();
        let indent = "  ".repeat(entry.depth);
        match entry.kind {
            Kind::Dir => out.push_str(&format!("{indent}{name}/\n")),
            Kind::Symlink => {
                let target = read_link_at(entry.dir, entry.name).unwrap_or_else(|| "?".into());
                out.push_str(&format!("{indent}{name} -> {target}\n"));
            }
            Kind::File | Kind::Other => out.push_str(&format!("{indent}{name}\n")),
        }
        ControlFlow::Continue(())
    });
    if total == 0 {
        out.push_str("  (empty)\n");
    }
    if total > shown {
        out.push_str(&format!(
            "[{} more entries not shown (limit {limit}); list a subdirectory, lower depth or raise limit]\n",
            total - shown
        ));
    }
    if walk.changed > 0 {
        out.push_str(&format!(
            "[{} director{} changed while being listed (replaced by a link or a file, or removed) and {} not shown; list again once nothing is renaming them]\n",
            walk.changed,
            if walk.changed == 1 { "y" } else { "ies" },
            if walk.changed == 1 { "its contents are" } else { "their contents are" },
        ));
    }
    ToolOutput::ok(out).with_structured(
        json!({"path": dir.display(), "entries": total, "shown": shown, "changed": walk.changed}),
    )
}
