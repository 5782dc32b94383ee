//! `bash`: a persistent shell in the sandbox.
//!
//! One long-lived `bash --noprofile --norc` per conversation reads commands
//! from a streamed stdin, so the working directory, variables and functions
//! survive between calls. Each call is wrapped so that the shell then prints
//! a fresh random sentinel with the exit status on stdout and the same
//! sentinel on stderr; seeing both tells the call is complete and that both
//! streams are drained, while the command's own output is kept apart.
//!
//! The command runs through `eval` of a single quoted word with stdin from
//! `/dev/null`, so no input can make the shell wait for more lines or eat
//! the wrapper. A command that permanently redirects the shell's own output
//! (`exec >file`) hides the sentinel and so runs into the timeout, after
//! which the shell is replaced.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use cordon_sandbox::{ExecEvent, ExecRequest, Execution, ExitStatus};

use cordon_sandbox::Stream;
use serde::Deserialize;
use serde_json::{Value, json};
use tokio::sync::Mutex;

use crate::output::HeadTail;
use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool};

pub struct Bash;

/// The conversation's shell, started on first use.
#[derive(Default)]
pub struct ShellSlot {
    shell: Mutex<Option<Shell>>,
}

struct Shell {
    exec: Execution,
    /// Set while a command runs; still set at the next call means that
    /// call's future was dropped (the turn was cancelled) mid-command, and
    /// the shell may still be running it.
    busy: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    #[serde(default)]
    command: Option<String>,
    #[serde(default)]
    timeout: Option<f64>,
    #[serde(default)]
    restart: bool,
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "command": {
                "type": "string",
                "description": "The bash command(s) to run. Multi-line scripts are fine. Runs in the persistent shell: `cd`, `export` and function definitions carry over to later calls. Stdin is /dev/null, so nothing may wait for input."
            },
            "timeout": {
                "type": "number",
                "description": "Seconds to wait before the shell is killed and restarted (default 120, at most 600)."
            },
            "restart": {
                "type": "boolean",
                "description": "Kill the shell and start a fresh one (working directory back to /workspace, variables and functions gone) before running `command`, if any."
            }
        },
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Run a command in a persistent bash shell inside the sandbox: for building, testing, git and the project's own scripts (the project is at /workspace, the starting directory; the network is as the system prompt says). State persists between calls: the current directory, exported variables and shell functions are kept. The result shows the exit code and stdout and stderr separately; very long output is cut to its beginning and end with a note of how much was dropped, so filter noisy commands (e.g. with grep, head or tail). A command that runs past its timeout is killed together with the shell, which is restarted fresh. Prefer the file tools for reading, writing and editing files.";

impl TypedTool for Bash {
    const NAME: &'static str = "bash";
    const READ_ONLY: bool = false;
    type Input = Input;
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn label(&self, input: &Input) -> String {
        match (&input.command, input.restart) {
            (Some(command), true) => format!("(restart) {command}"),
            (Some(command), false) => command.clone(),
            (None, _) => "(restart)".into(),
        }
    }
    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Input) -> ToolFuture<'a> {
        Box::pin(run(ctx, input))
    }
}

fn timeout_of(ctx: &ToolContext, secs: Option<f64>) -> Result<Duration, ToolOutput> {
    match secs {
        None => Ok(ctx.limits.default_timeout),
        Some(s) if s.is_finite() && s > 0.0 => {
            Ok(Duration::from_secs_f64(s).min(ctx.limits.max_timeout))
        }
        Some(s) => Err(ToolOutput::error(format!(
            "Invalid arguments for `bash`: timeout must be a positive number of seconds, got {s}"
        ))),
    }
}

async fn run(ctx: &ToolContext, input: Input) -> ToolOutput {
    let timeout = match timeout_of(ctx, input.timeout) {
        Ok(t) => t,
        Err(e) => return e,
    };
    if let Some(stop) = ctx.sandbox.disk_stopped() {
        return ToolOutput::disk_stopped(&stop);
    }
    let mut slot = ctx.shell.shell.lock().await;
    let mut note = String::new();
    if input.restart {
        if let Some(old) = slot.take() {
            old.kill();
        }
        note.push_str("The shell was restarted.\n");
    }
    let Some(command) = input.command.filter(|c| !c.trim().is_empty()) else {
        if input.restart {
            return match Shell::start(ctx).await {
                Ok(s) => {
                    *slot = Some(s);
                    ToolOutput::ok("The shell was restarted.")
                        .with_structured(json!({"restarted": true}))
                }
                Err(e) => ToolOutput::error(e),
            };
        }
        return ToolOutput::error(
            "Invalid arguments for `bash`: give `command` (the command to run), or `restart: true` to restart the shell.",
        );
    };
    if slot.as_ref().is_some_and(|s| s.busy) {
        if let Some(old) = slot.take() {
            old.kill();
        }
        note.push_str("The previous command was cancelled before it finished; the shell was restarted (variables and the working directory were reset).\n");
    }
    if slot.is_none() {
        match Shell::start(ctx).await {
            Ok(s) => *slot = Some(s),
            Err(e) => return ToolOutput::error(e),
        }
    }
    let shell = slot.as_mut().expect("started above");
    let net = crate::net::NetWatch::start(&ctx.sandbox);
    shell.busy = true;
    let outcome = shell.run(ctx, &command, timeout).await;
    shell.busy = false;
    // A command may have written past the disk budget between two of the
    // watcher's looks: look once more before saying it went well.
    if let Some(stop) = ctx.sandbox.check_disk().await {
        slot.take();
        let mut out = ToolOutput::disk_stopped(&stop);
        for (name, stream) in [("stdout", &outcome.stdout), ("stderr", &outcome.stderr)] {
            if !stream.is_empty() {
                out.text
                    .push_str(&format!("\n{name}:\n{}", stream.render()));
            }
        }
        return out;
    }
    let mut restarted = false;
    match &outcome.end {
        End::Done(_) => {}
        End::TimedOut | End::ShellExited(_) | End::Lost(_) => {
            // The shell is gone or unusable; start a fresh one now so the
            // next call finds a working shell and the model is told so.
            if let Some(old) = slot.take() {
                old.kill();
            }
            if let Ok(s) = Shell::start(ctx).await {
                *slot = Some(s);
                restarted = true;
            }
        }
    }
    drop(slot);
    let git_protected = ctx
        .sandbox
        .read_only()
        .iter()
        .any(|p| p.file_name().is_some_and(|n| n == ".git"));
    let mut out = outcome.render(note, timeout, restarted, git_protected);
    if let Some(net) = net {
        net.append_to(&mut out.text);
    }
    out
}

enum End {
    Done(i32),
    TimedOut,
    ShellExited(ExitStatus),
    Lost(String),
}

struct Outcome {
    stdout: HeadTail,
    stderr: HeadTail,
    end: End,
    duration: Duration,
}

impl Outcome {
    /// `git_protected`: the repository's `.git` is read-only in this
    /// sandbox, and a failed write there gets the reason added.
    fn render(
        self,
        mut text: String,
        timeout: Duration,
        restarted: bool,
        git_protected: bool,
    ) -> ToolOutput {
        let fresh = if restarted {
            " A fresh shell was started: the working directory is /workspace again and variables and functions are gone."
        } else {
            ""
        };
        let (code, is_error) = match &self.end {
            End::Done(c) => {
                text.push_str(&format!("Exit code: {c}\n"));
                (Some(*c), false)
            }
            End::TimedOut => {
                text.push_str(&format!(
                    "Timed out after {:.0?}: the command and the shell were killed.{fresh} Run long tasks in the background (`cmd > log 2>&1 &`) or raise `timeout`.\n",
                    timeout
                ));
                (None, true)
            }
            End::ShellExited(s) => {
                text.push_str(&format!(
                    "The shell itself exited (status {}), e.g. because the command ran `exit`.{fresh}\n",
                    s.code()
                ));
                (Some(s.code()), false)
            }
            End::Lost(why) => {
                text.push_str(&format!("The shell was lost: {why}.{fresh}\n"));
                (None, true)
            }
        };
        for (name, stream) in [("stdout", &self.stdout), ("stderr", &self.stderr)] {
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
        // Git's own error names the file, not why: say it once.
        if git_protected && text.contains(".git") && text.contains("Read-only file system") {
            text.push_str(GIT_READ_ONLY);
        }
        let structured = json!({
            "exit_code": code,
            "timed_out": matches!(self.end, End::TimedOut),
            "shell_restarted": restarted,
            "duration_ms": self.duration.as_millis() as u64,
            "stdout_bytes": self.stdout.total_bytes(),
            "stderr_bytes": self.stderr.total_bytes(),
            "stdout_dropped_bytes": self.stdout.dropped_bytes(),
            "stderr_dropped_bytes": self.stderr.dropped_bytes(),
        });
        ToolOutput::new(text, is_error).with_structured(structured)
    }
}

/// Added to a command's result when git failed to write the protected
/// repository.
const GIT_READ_ONLY: &str = "Note: the repository's .git is read-only in this sandbox, because git on the host runs what a repository's configuration and hooks name, and a writable .git could point it at planted ones (the user can lift this with the setting sandbox.protect_control_files = false). Reading history, logs and diffs works; leave commits, branches and staging to the user.\n";

/// A sentinel nobody's output contains by accident: per-process random
/// bits mixed with a counter.
fn sentinel() -> String {
    use std::hash::{BuildHasher, Hasher};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(COUNTER.fetch_add(1, Ordering::Relaxed));
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    format!("__CORDON_DONE_{:016x}_", h.finish())
}

/// Quotes `s` as one bash word.
fn quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// Watches one stream for the sentinel, passing everything before it on.
struct Scan {
    marker: Vec<u8>,
    pending: Vec<u8>,
    /// After the marker: the text up to the newline (the exit status on
    /// stdout, nothing on stderr).
    found: Option<String>,
}

impl Scan {
    fn new(marker: &str) -> Self {
        Scan {
            marker: marker.as_bytes().to_vec(),
            pending: Vec::new(),
            found: None,
        }
    }

    fn feed(&mut self, data: &[u8], out: &mut impl FnMut(&[u8])) {
        if self.found.is_some() {
            // Output after the sentinel comes from background jobs of this
            // call; it is dropped rather than attributed to the next call.
            return;
        }
        self.pending.extend_from_slice(data);
        if let Some(pos) = find(&self.pending, &self.marker) {
            let after = &self.pending[pos + self.marker.len()..];
            if let Some(nl) = after.iter().position(|&b| b == b'\n') {
                self.found = Some(String::from_utf8_lossy(&after[..nl]).into_owned());
                out(&self.pending[..pos]);
                self.pending.clear();
            }
            return;
        }
        // Keep back only what could be the start of a split marker, so
        // that everything else is passed on (and shown live) at once.
        let keep = (1..self.marker.len().min(self.pending.len() + 1))
            .rev()
            .find(|&k| self.pending.ends_with(&self.marker[..k]))
            .unwrap_or(0);
        let commit = self.pending.len() - keep;
        out(&self.pending[..commit]);
        self.pending.drain(..commit);
    }

    fn flush(&mut self, out: &mut impl FnMut(&[u8])) {
        out(&self.pending);
        self.pending.clear();
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

impl Shell {
    async fn start(ctx: &ToolContext) -> Result<Shell, String> {
        let req = ExecRequest::bash_reading_stdin()
            .cwd("/workspace")
            // Pagers and editors would wait for a terminal that is not there.
            .env("PAGER", "cat")
            .env("GIT_PAGER", "cat")
            .env("TERM", "dumb")
            .stream_stdin();
        let exec = ctx
            .sandbox
            .exec_stream(req)
            .await
            .map_err(|e| format!("cannot start bash in the sandbox: {e}"))?;
        tracing::debug!(pid = exec.pid(), "bash shell started");
        Ok(Shell { exec, busy: false })
    }

    fn kill(self) {
        let _ = self.exec.signal(libc::SIGKILL);
        // Dropping the execution also kills and forgets it.
    }

    async fn run(&mut self, ctx: &ToolContext, command: &str, timeout: Duration) -> Outcome {
        let start = Instant::now();
        let mark = sentinel();
        // `eval` of one quoted word: whatever the command is (a syntax
        // error, an unclosed quote or heredoc), the shell reads exactly
        // this line and comes back for the sentinel. Stdin is /dev/null so
        // the command cannot swallow the lines that follow.
        let script = format!(
            "{{ eval {} ; }} </dev/null\nprintf '\\n%s%d\\n' {m} \"$?\"; printf '\\n%s\\n' {m} >&2\n",
            quote(command),
            m = quote(&mark)
        );
        let mut out = HeadTail::new(ctx.limits.output_head, ctx.limits.output_tail);
        let mut err = HeadTail::new(ctx.limits.output_head, ctx.limits.output_tail);
        // The sentinel follows a newline so it is found even after output
        // without one; that newline is not the command's, so look for it too.
        let marker = format!("\n{mark}");
        let (mut so, mut se) = (Scan::new(&marker), Scan::new(&marker));
        // What the command prints is kept (head and tail) and reported live.
        let mut to_out = |b: &[u8]| {
            out.push(b);
            ctx.report(Stream::Stdout, b);
        };
        let mut to_err = |b: &[u8]| {
            err.push(b);
            ctx.report(Stream::Stderr, b);
        };
        let stdin = self.exec.stdin();
        let end = tokio::time::timeout(timeout, async {
            if let Err(e) = stdin.write(script.as_bytes()).await {
                return End::Lost(format!("cannot write to the shell: {e}"));
            }
            loop {
                if let (Some(code), Some(_)) = (&so.found, &se.found) {
                    return End::Done(code.trim().parse().unwrap_or(-1));
                }
                match self.exec.next().await {
                    Some(Ok(ExecEvent::Stdout(d))) => so.feed(&d, &mut to_out),
                    Some(Ok(ExecEvent::Stderr(d))) => se.feed(&d, &mut to_err),
                    Some(Ok(ExecEvent::Exit(r))) => {
                        so.flush(&mut to_out);
                        se.flush(&mut to_err);
                        return End::ShellExited(r.status);
                    }
                    Some(Err(e)) => return End::Lost(e.to_string()),
                    None => return End::Lost("the shell's output ended".into()),
                }
            }
        })
        .await
        .unwrap_or(End::TimedOut);
        if matches!(end, End::TimedOut) {
            so.flush(&mut to_out);
            se.flush(&mut to_err);
        }
        Outcome {
            stdout: out,
            stderr: err,
            end,
            duration: start.elapsed(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quoting_survives_single_quotes() {
        assert_eq!(quote("it's"), r"'it'\''s'");
    }

    #[test]
    fn a_split_sentinel_is_still_found() {
        let mut out = HeadTail::new(100, 100);
        let mut s = Scan::new("\n__M_");
        s.feed(b"hello\n_", &mut |b| out.push(b));
        s.feed(b"_M_0", &mut |b| out.push(b));
        assert!(s.found.is_none());
        s.feed(b"\nlate", &mut |b| out.push(b));
        assert_eq!(s.found.as_deref(), Some("0"));
        assert_eq!(out.render(), "hello");
    }

    #[test]
    fn only_a_possible_start_of_the_sentinel_is_held_back() {
        let mut seen = Vec::new();
        let mut s = Scan::new("\n__M_");
        s.feed(b"progress 10%", &mut |b| seen.extend_from_slice(b));
        assert_eq!(seen, b"progress 10%", "nothing held back");
        s.feed(b"\nnext\n_", &mut |b| seen.extend_from_slice(b));
        assert_eq!(seen, b"progress 10%\nnext", "only \\n_ held back");
        s.feed(b"x", &mut |b| seen.extend_from_slice(b));
        assert_eq!(seen, b"progress 10%\nnext\n_x");
    }
}
