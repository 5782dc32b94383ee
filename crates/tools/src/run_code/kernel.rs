//! `run_code` for Python in the conversation's kernel: one per
//! [`ToolContext`], started on first use when the sandbox has the lab
//! environment (`cordon lab setup`), so variables, imports and open files
//! persist between calls. A timeout interrupts the kernel and keeps its
//! state; images come back as images, SVG and HTML as their text.

use std::time::Duration;

use serde_json::json;

use crate::kernel::{DisplayItem, ExecutionResult, Kernel, KernelError};
use crate::{ToolContext, ToolOutput};

/// The conversation's kernel, shared by the context's clones.
#[derive(Default)]
pub struct KernelSlot(tokio::sync::Mutex<Option<Kernel>>);

/// Whether this sandbox can run the kernel: the lab environment is bound
/// where the kernel's Python is looked for.
pub(crate) fn available(ctx: &ToolContext) -> bool {
    ctx.sandbox
        .bind_targets()
        .iter()
        .any(|t| t == cordon_lab::SANDBOX_DIR)
}

/// Runs `code` in the kernel (started, or restarted first when asked).
pub(crate) async fn run(
    ctx: &ToolContext,
    code: &str,
    restart: bool,
    timeout: Duration,
) -> ToolOutput {
    let mut slot = ctx.kernel.0.lock().await;
    let mut note = String::new();
    if restart {
        if let Some(k) = slot.as_mut()
            && k.restart().await.is_err()
        {
            // Whatever failed, a fresh start below replaces it.
            *slot = None;
        }
        note.push_str("The kernel was restarted: earlier variables and imports are gone.\n");
    }
    if slot.is_none() {
        match Kernel::start(&ctx.sandbox, cordon_lab::SANDBOX_PYTHON).await {
            Ok(k) => *slot = Some(k),
            Err(e) => return failure(e),
        }
    }
    if code.trim().is_empty() {
        return if restart {
            ToolOutput::ok(note.trim_end())
                .with_structured(json!({"kernel": true, "restarted": true}))
        } else {
            ToolOutput::error(
                "Invalid arguments for `run_code`: `code` is empty; give the code to run (or `restart: true` alone to restart the Python kernel).",
            )
        };
    }
    let kernel = slot.as_mut().expect("started above");
    // Output is reported as the kernel sends it, not at the end.
    match kernel.execute_live(code, timeout, ctx.progress()).await {
        Ok(r) => render(r, note, timeout),
        Err(e) => {
            // A dead kernel restarts itself on the next call; anything else
            // (the bridge gone or silent) is replaced by a fresh start.
            if !matches!(e, KernelError::Died) {
                *slot = None;
            }
            failure(e)
        }
    }
}

fn failure(e: KernelError) -> ToolOutput {
    if let KernelError::Sandbox(cordon_sandbox::Error::DiskBudget(stop)) = &e {
        return ToolOutput::disk_stopped(stop);
    }
    ToolOutput::error(e.to_string()).with_structured(json!({"kernel": true, "failed": true}))
}

/// The model's view of one execution.
fn render(r: ExecutionResult, note: String, timeout: Duration) -> ToolOutput {
    let count = r
        .execution_count
        .map_or(String::new(), |n| format!(" [{n}]"));
    let mut text =
        format!("Ran in the Python kernel{count}; its state persists between calls.\n{note}");
    if r.restarted {
        text.push_str(
            "The kernel had to be started afresh for this call: variables and imports from earlier calls are gone.\n",
        );
    }
    if r.timed_out {
        text.push_str(&format!(
            "Timed out after {timeout:.0?}: the kernel was interrupted (KeyboardInterrupt), and what ran before is kept. Raise `timeout` or make it faster.\n"
        ));
    }
    for (name, stream) in [("stdout", &r.stdout), ("stderr", &r.stderr)] {
        if stream.is_empty() {
            continue;
        }
        let body = stream.render();
        text.push_str(&format!("{name}:\n{body}"));
        if !body.ends_with('\n') {
            text.push('\n');
        }
    }
    if let Some(result) = &r.result {
        text.push_str(&format!("result: {result}\n"));
    }
    if let Some(e) = &r.error {
        text.push_str(&format!("Error: {}: {}\n", e.ename, e.evalue));
        for line in &e.traceback {
            text.push_str(line);
            if !line.ends_with('\n') {
                text.push('\n');
            }
        }
    }
    let mut images = Vec::new();
    for item in r.outputs {
        match item {
            DisplayItem::Image(image) => {
                text.push_str(&format!(
                    "display: an image ({}), attached\n",
                    image.media_type
                ));
                images.push(image);
            }
            DisplayItem::Svg(svg) => text.push_str(&format!("display (SVG):\n{svg}\n")),
            DisplayItem::Html(html) => text.push_str(&format!("display (HTML):\n{html}\n")),
            DisplayItem::Text(t) => text.push_str(&format!("display: {t}\n")),
        }
    }
    if r.dropped_items > 0 {
        text.push_str(&format!(
            "({} more display items were not kept: display fewer)\n",
            r.dropped_items
        ));
    }
    let nothing = r.stdout.is_empty()
        && r.stderr.is_empty()
        && r.result.is_none()
        && r.error.is_none()
        && images.is_empty();
    if nothing && !r.timed_out {
        text.push_str("(no output)\n");
    }
    let structured = json!({
            "kernel": true,
            "execution_count": r.execution_count,
            "timed_out": r.timed_out,
            "restarted": r.restarted,
            "error": r.error.as_ref().map(|e| e.ename.clone()),
            "images": images.len(),
            "stdout": r.stdout.render(),
            "stderr": r.stderr.render(),
            "result": r.result,
    });
    ToolOutput {
        images,
        ..ToolOutput::new(text, r.timed_out).with_structured(structured)
    }
}
