//! `run_code`: run a Python, JavaScript or TypeScript snippet in the sandbox.
//!
//! Python runs in the conversation's Jupyter kernel when the sandbox has
//! the lab environment ([`kernel`]). Otherwise, and for the other
//! languages, the code is written to a file under the sandbox's `/tmp` and
//! run by `python3` or `node` from the sandbox's system directories; nothing
//! is fetched, so it works offline. TypeScript is transpiled here on the host
//! with the `oxc` crates (types, interfaces, enums and namespaces are
//! lowered to JavaScript; nothing is type-checked), then run by node.

use std::path::Path;
use std::time::Duration;

use cordon_sandbox::{ExecEvent, ExecRequest};
use serde::Deserialize;
use serde_json::{Value, json};

use crate::output::HeadTail;
use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool, label};

mod kernel;
pub use kernel::KernelSlot;

pub struct RunCode;

#[derive(Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
#[serde(rename_all = "lowercase")]
pub enum Language {
    Python,
    Javascript,
    Typescript,
}

impl Language {
    /// As the model names it.
    pub fn name(self) -> &'static str {
        match self {
            Language::Python => "python",
            Language::Javascript => "javascript",
            Language::Typescript => "typescript",
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    language: Language,
    code: String,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    restart: bool,
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "language": {"type": "string", "enum": ["python", "javascript", "typescript"], "description": "Language of `code`."},
            "code": {"type": "string", "description": "The complete program to run. Print what you want to see."},
            "timeout": {"type": "number", "description": "Seconds before the program is killed, or the Python kernel interrupted (default 120, at most 600)."},
            "restart": {"type": "boolean", "description": "Python in the kernel: start a fresh kernel first (every variable and import is lost). With empty `code`, only restart."}
        },
        "required": ["language", "code"],
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Run Python, JavaScript (node) or TypeScript in the sandbox, with /workspace as the working directory: for a quick computation, a data exploration or trying a snippet (the network is as the system prompt says). Python runs in a persistent IPython kernel when one is installed (the result says so): variables, imports and open files persist between calls, the last expression's value is shown, matplotlib plots and other images come back as images, and a timeout interrupts the code without losing the kernel's state (`restart: true` starts a fresh kernel). Otherwise, and for JavaScript and TypeScript, each call is a fresh process running a self-contained program: use files in /workspace to keep results. TypeScript is transpiled to JavaScript first (type annotations and interfaces are removed, not checked). JavaScript using `import`/`export` runs as an ES module, otherwise as CommonJS. Returns stdout and stderr (and the exit code of a fresh process); long output is cut to its beginning and end.";

impl TypedTool for RunCode {
    const NAME: &'static str = "run_code";
    const READ_ONLY: bool = false;
    type Input = Input;
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn label(&self, input: &Input) -> String {
        format!("{}: {}", input.language.name(), label::line(&input.code))
    }
    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Input) -> ToolFuture<'a> {
        Box::pin(run(ctx, input))
    }
}

/// TypeScript transpilation failed: the parser's messages with positions.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct TranspileError(pub String);

/// Strips TypeScript down to JavaScript with oxc.
pub fn transpile_typescript(source: &str) -> Result<String, TranspileError> {
    use oxc_allocator::Allocator;
    use oxc_codegen::Codegen;
    use oxc_parser::Parser;
    use oxc_semantic::SemanticBuilder;
    use oxc_span::SourceType;
    use oxc_transformer::{TransformOptions, Transformer};

    let allocator = Allocator::default();
    let parsed = Parser::new(&allocator, source, SourceType::ts()).parse();
    let describe = |errors: &[oxc_diagnostics::OxcDiagnostic]| -> String {
        errors
            .iter()
            .map(|e| {
                let at = e
                    .labels
                    .as_ref()
                    .and_then(|l| l.first())
                    .map(|l| {
                        let before = &source[..l.offset().min(source.len())];
                        let line = before.matches('\n').count() + 1;
                        let col = before.len() - before.rfind('\n').map_or(0, |i| i + 1) + 1;
                        format!("line {line}, column {col}: ")
                    })
                    .unwrap_or_default();
                format!("{at}{}", e.message)
            })
            .collect::<Vec<_>>()
            .join("\n")
    };
    if parsed.panicked || !parsed.errors.is_empty() {
        return Err(TranspileError(describe(&parsed.errors)));
    }
    let mut program = parsed.program;
    let semantic = SemanticBuilder::new().build(&program);
    let scoping = semantic.semantic.into_scoping();
    let options = TransformOptions::default();
    let ret = Transformer::new(&allocator, Path::new("main.ts"), &options)
        .build_with_scoping(scoping, &mut program);
    if !ret.errors.is_empty() {
        return Err(TranspileError(describe(&ret.errors)));
    }
    Ok(Codegen::new().build(&program).code)
}

/// Whether JavaScript must run as an ES module: node 20 runs `.js` as
/// CommonJS, where `import`/`export` are syntax errors.
fn is_es_module(js: &str) -> bool {
    js.lines().any(|l| {
        let t = l.trim_start();
        (t.starts_with("import ") || t.starts_with("import{") || t.starts_with("export "))
            && !t.starts_with("import (")
    })
}

/// The exec that runs `code` in `language` in /workspace: one exec writes
/// the program from stdin to a fresh file in /tmp, runs it with stdin from
/// /dev/null and removes it. TypeScript is transpiled first. Shared with
/// the server's code jobs, so both run programs the same way.
pub fn program_request(language: Language, code: String) -> Result<ExecRequest, TranspileError> {
    let (program, ext, code) = match language {
        Language::Python => ("python3", "py", code),
        Language::Javascript => {
            let ext = if is_es_module(&code) { "mjs" } else { "cjs" };
            ("node", ext, code)
        }
        Language::Typescript => {
            let js = transpile_typescript(&code)?;
            let ext = if is_es_module(&js) { "mjs" } else { "cjs" };
            ("node", ext, js)
        }
    };
    let script = format!(
        "f=$(mktemp /tmp/cordon-run-XXXXXXXX.{ext}) || exit 125; cat > \"$f\"; {program} \"$f\" </dev/null; s=$?; rm -f \"$f\"; exit $s"
    );
    Ok(ExecRequest::argv(["/bin/sh", "-c", &script])
        .cwd("/workspace")
        .stdin(code.into_bytes()))
}

async fn run(ctx: &ToolContext, input: Input) -> ToolOutput {
    let timeout = match input.timeout {
        None => ctx.limits.default_timeout,
        Some(s) if s.is_finite() && s > 0.0 => {
            Duration::from_secs_f64(s).min(ctx.limits.max_timeout)
        }
        Some(s) => {
            return ToolOutput::error(format!(
                "Invalid arguments for `run_code`: timeout must be a positive number of seconds, got {s}"
            ));
        }
    };
    if input.language == Language::Python && kernel::available(ctx) {
        return kernel::run(ctx, &input.code, input.restart, timeout).await;
    }
    if input.restart {
        return ToolOutput::error(
            "Invalid arguments for `run_code`: `restart` is for Python in the kernel, and there is no kernel here: each call is already a fresh process. Call again without `restart`.",
        );
    }
    let program = match input.language {
        Language::Python => "python3",
        Language::Javascript | Language::Typescript => "node",
    };
    let req = match program_request(input.language, input.code) {
        Ok(req) => req.timeout(timeout),
        Err(e) => {
            return ToolOutput::error(format!(
                "The TypeScript could not be transpiled; nothing was run.\n{e}"
            ))
            .with_structured(
                json!({"exit_code": null, "timed_out": false, "transpile_error": e.0}),
            );
        }
    };
    let net = crate::net::NetWatch::start(&ctx.sandbox);
    let mut exec = match ctx.sandbox.exec_stream(req).await {
        Ok(e) => e,
        Err(cordon_sandbox::Error::DiskBudget(stop)) => return ToolOutput::disk_stopped(&stop),
        Err(e) => return ToolOutput::error(format!("cannot run {program} in the sandbox: {e}")),
    };
    let mut out = HeadTail::new(ctx.limits.output_head, ctx.limits.output_tail);
    let mut err = HeadTail::new(ctx.limits.output_head, ctx.limits.output_tail);
    let result = loop {
        match exec.next().await {
            Some(Ok(ExecEvent::Stdout(d))) => {
                out.push(&d);
                ctx.report(cordon_sandbox::Stream::Stdout, &d);
            }
            Some(Ok(ExecEvent::Stderr(d))) => {
                err.push(&d);
                ctx.report(cordon_sandbox::Stream::Stderr, &d);
            }
            Some(Ok(ExecEvent::Exit(r))) => break r,
            Some(Err(cordon_sandbox::Error::DiskBudget(stop))) => {
                return ToolOutput::disk_stopped(&stop);
            }
            Some(Err(e)) => {
                return ToolOutput::error(format!(
                    "the sandbox failed while running the code: {e}"
                ));
            }
            None => return ToolOutput::error("the sandbox ended the run without a result"),
        }
    };
    if result.disk_exceeded
        && let Some(stop) = ctx.sandbox.disk_stopped()
    {
        return ToolOutput::disk_stopped(&stop);
    }
    let code = result.status.code();
    let mut text = if result.timed_out {
        format!(
            "Timed out after {:.0?}: the program was killed. Raise `timeout` or make it faster.\n",
            timeout
        )
    } else if result.oom_killed {
        format!("Exit code: {code} (killed: the sandbox ran out of memory)\n")
    } else {
        format!("Exit code: {code}\n")
    };
    for (name, stream) in [("stdout", &out), ("stderr", &err)] {
        if stream.is_empty() {
            text.push_str(&format!("{name}: (empty)\n"));
        } else {
            let body = stream.render();
            text.push_str(&format!("{name}:\n{body}"));
            if !body.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    if let Some(net) = net {
        net.append_to(&mut text);
    }
    ToolOutput::new(text, result.timed_out).with_structured(json!({
            "exit_code": if result.timed_out { None } else { Some(code) },
            "timed_out": result.timed_out,
            "oom_killed": result.oom_killed,
            "duration_ms": result.duration.as_millis() as u64,
            "stdout": out.render(),
            "stderr": err.render(),
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn typescript_types_are_stripped() {
        let js = transpile_typescript(
            "interface P { x: number }\nenum C { A, B }\nconst p: P = { x: 1 };\nfunction f<T>(a: T): T { return a }\nconsole.log(f<number>(p.x), C.B as number);\n",
        )
        .unwrap();
        assert!(!js.contains("interface"), "{js}");
        assert!(!js.contains(": P"), "{js}");
        assert!(js.contains("console.log"), "{js}");
    }

    #[test]
    fn typescript_syntax_errors_name_the_line() {
        let e = transpile_typescript("const a = 1;\nlet b: = 2;\n").unwrap_err();
        assert!(e.0.contains("line 2"), "{e}");
    }

    #[test]
    fn module_syntax_is_detected() {
        assert!(is_es_module("import fs from 'fs';\n"));
        assert!(is_es_module("export const a = 1;"));
        assert!(!is_es_module("const fs = require('fs');"));
    }
}
