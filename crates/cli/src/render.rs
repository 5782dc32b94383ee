//! `cordon exec`'s two renderings of the agent's events, behind the one
//! [`EventSink`] interface: [`Human`] (the answer on stdout, progress on
//! stderr) and [`JsonLines`] (one JSON object per event on stdout, see
//! docs/exec-json.md).
//!
//! Everything shown comes from the model or the sandbox, so `Human` never
//! passes a control character to a terminal: an escape sequence in a
//! tool's output or the model's answer (a clipboard write, a cursor move)
//! is shown as `?`. An answer going to a file or a pipe is written as the
//! model gave it, for the program that reads it.

use std::io::Write;

use cordon_agent::AgentEvent;
use cordon_agent::events::{BoxFuture, EventSink};
use cordon_tools::{printable, printable_lines};

/// One JSON object per event, per line.
pub struct JsonLines<W> {
    out: W,
}

impl<W: Write + Send> JsonLines<W> {
    pub fn new(out: W) -> Self {
        JsonLines { out }
    }
}

impl<W: Write + Send> EventSink for JsonLines<W> {
    fn event(&mut self, ev: AgentEvent) -> BoxFuture<'_, ()> {
        if let Ok(line) = serde_json::to_string(&ev) {
            let _ = writeln!(self.out, "{line}");
        }
        Box::pin(async {})
    }

    fn finish(&mut self) -> BoxFuture<'_, ()> {
        let _ = self.out.flush();
        Box::pin(async {})
    }
}

/// Which of [`Human`]'s two streams are terminals.
#[derive(Debug, Clone, Copy, Default)]
pub struct Terminals {
    /// The answer's: there it is made printable.
    pub out: bool,
    /// The progress's: there it is dimmed.
    pub err: bool,
}

/// For a person: the answer as it streams on `out`; each tool call, its
/// live output and its verdict, retries, compactions and the tally,
/// dimmed on `err`.
pub struct Human<O, E> {
    out: O,
    err: E,
    /// `out` is a terminal: the answer goes through [`printable_lines`].
    answer_printable: bool,
    dim: &'static str,
    reset: &'static str,
    /// Whether the answer on `out` is at the start of a line.
    at_line_start: bool,
    /// A line of live tool output is open on `err`.
    live_open: bool,
    /// The running call printed live output.
    streamed: bool,
}

impl<O: Write + Send, E: Write + Send> Human<O, E> {
    pub fn new(out: O, err: E, terminals: Terminals) -> Self {
        let (dim, reset) = if terminals.err {
            ("\x1b[2m", "\x1b[0m")
        } else {
            ("", "")
        };
        Human {
            out,
            err,
            answer_printable: terminals.out,
            dim,
            reset,
            at_line_start: true,
            live_open: false,
            streamed: false,
        }
    }

    /// Ends the answer's current line before something else is printed:
    /// on a terminal both streams meet.
    fn end_answer_line(&mut self) {
        if !self.at_line_start {
            let _ = writeln!(self.out);
            let _ = self.out.flush();
            self.at_line_start = true;
        }
    }

    fn note(&mut self, text: &str) {
        let (dim, reset) = (self.dim, self.reset);
        let _ = writeln!(self.err, "{dim}{}{reset}", printable_lines(text));
    }

    fn live(&mut self, text: &str) {
        let mut line = String::new();
        let mut pieces = text.split('\n').peekable();
        while let Some(piece) = pieces.next() {
            let ends_line = pieces.peek().is_some();
            if (!piece.is_empty() || ends_line) && !self.live_open {
                line.push_str(self.dim);
                line.push_str("  │ ");
                self.live_open = true;
            }
            line.push_str(&printable(piece));
            if ends_line {
                line.push_str(self.reset);
                line.push('\n');
                self.live_open = false;
            }
        }
        let _ = self.err.write_all(line.as_bytes());
        let _ = self.err.flush();
    }

    fn show(&mut self, ev: AgentEvent) {
        match ev {
            AgentEvent::TextDelta { text } => {
                self.at_line_start = text.ends_with('\n');
                let text = if self.answer_printable {
                    printable_lines(&text)
                } else {
                    text
                };
                let _ = self.out.write_all(text.as_bytes());
                let _ = self.out.flush();
            }
            AgentEvent::ToolCallStarted {
                name, input, label, ..
            } => {
                self.end_answer_line();
                let label = cordon_tools::label::or_generic(label, &input);
                self.note(&format!("▸ {name} {label}"));
            }
            AgentEvent::ToolOutput { text, .. } => {
                self.streamed = true;
                self.live(&text);
            }
            AgentEvent::ToolCallFinished {
                output,
                is_error,
                structured,
                ..
            } => {
                if self.live_open {
                    let _ = writeln!(self.err, "{}", self.reset);
                    self.live_open = false;
                }
                let mark = if cordon_agent::tool_failed(is_error, structured.as_ref()) {
                    "✗"
                } else {
                    "✓"
                };
                // Streamed output was seen already: the verdict's first
                // line (the exit code) is enough.
                let lines = if std::mem::take(&mut self.streamed) {
                    1
                } else {
                    4
                };
                self.note(&format!("  {mark} {}", abbreviate(&output, lines)));
            }
            AgentEvent::Retrying {
                attempt,
                wait_ms,
                reason,
            } => {
                // Printed text cannot be taken back: the retried answer at
                // least starts on a line of its own.
                self.end_answer_line();
                self.note(&format!(
                    "  retrying (attempt {attempt}) in {wait_ms} ms: {reason}"
                ));
            }
            AgentEvent::CompactionStarted { reason } => {
                self.note(&format!("  compacting the conversation: {reason}"));
            }
            AgentEvent::Compacted {
                replaced_messages,
                tokens_before,
                tokens_after,
                ..
            } => self.note(&format!(
                "  compacted {replaced_messages} messages: ~{tokens_before} → ~{tokens_after} tokens"
            )),
            AgentEvent::TurnCompleted {
                steps,
                usage,
                cost_usd,
                ..
            } => {
                self.end_answer_line();
                let cost = cost_usd.map(|c| format!(", ${c:.4}")).unwrap_or_default();
                self.note(&format!(
                    "· {}, {} tokens in, {} out{cost}",
                    cordon_tools::plural(u64::from(steps), "model request"),
                    usage.prompt_tokens(),
                    usage.output_tokens
                ));
            }
            AgentEvent::Error { message } => {
                let _ = writeln!(self.err, "cordon: {}", printable_lines(&message));
            }
            AgentEvent::PlanUpdated { plan } => {
                let mut text = format!("  plan, {} of {} done:", plan.done(), plan.plan.len());
                for s in &plan.plan {
                    text.push_str(&format!("\n    {} {}", s.status.mark(), s.step));
                }
                self.note(&text);
            }
            AgentEvent::HookFailed { message, .. } => {
                self.end_answer_line();
                self.note(&format!("  {message}"));
            }
            AgentEvent::NetworkRefused { message, .. } => {
                self.end_answer_line();
                self.note(&format!("  {message}"));
            }
            _ => {}
        }
    }
}

impl<O: Write + Send, E: Write + Send> EventSink for Human<O, E> {
    fn event(&mut self, ev: AgentEvent) -> BoxFuture<'_, ()> {
        self.show(ev);
        Box::pin(async {})
    }

    fn finish(&mut self) -> BoxFuture<'_, ()> {
        self.end_answer_line();
        let _ = self.err.flush();
        Box::pin(async {})
    }
}

/// The first lines of a tool's output, for progress lines.
fn abbreviate(text: &str, lines: usize) -> String {
    let mut out: Vec<&str> = text.lines().take(lines).collect();
    let total = text.lines().count();
    if total > lines {
        out.push("…");
    }
    out.join("\n    ")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn human(events: Vec<AgentEvent>) -> (String, String) {
        human_on(Terminals::default(), events)
    }

    fn human_on(terminals: Terminals, events: Vec<AgentEvent>) -> (String, String) {
        let (mut out, mut err) = (Vec::new(), Vec::new());
        {
            let mut h = Human::new(&mut out, &mut err, terminals);
            for ev in events {
                h.show(ev);
            }
            h.end_answer_line();
        }
        (
            String::from_utf8(out).unwrap(),
            String::from_utf8(err).unwrap(),
        )
    }

    #[test]
    fn sandbox_bytes_never_reach_the_terminal_as_control_sequences() {
        let (_, err) = human(vec![
            AgentEvent::ToolCallStarted {
                id: "b1".into(),
                name: "bash".into(),
                input: json!({"command": "cat \u{1b}]52;c;cHduZWQ=\u{7}notes"}),
                // As no label cordon makes: the printer is the last guard.
                label: "cat \u{1b}]52;c;cHduZWQ=\u{7}notes \u{202E}txt.eman".into(),
            },
            AgentEvent::ToolOutput {
                id: "b1".into(),
                stream: cordon_sandbox::Stream::Stdout,
                text: "\u{1b}[1A\u{1b}[2Kfaked line \u{2067}reordered\u{2069}\n".into(),
            },
            AgentEvent::ToolCallFinished {
                id: "b1".into(),
                name: "bash".into(),
                output: "Exit code: 0\n\u{1b}]0;title\u{7}".into(),
                is_error: false,
                structured: None,
                duration_ms: 1,
            },
            AgentEvent::Error {
                message: "bad \u{1b}[31mred".into(),
            },
        ]);
        let drawn = |c: char| c != '\n' && cordon_tools::unprintable(c);
        assert!(!err.chars().any(drawn), "{err:?}");
        assert!(err.contains("faked line"), "{err}");
    }

    /// The model's answer is hostile text too (a file it read can steer
    /// it): on a terminal it is made printable, lines and all; into a
    /// file or a pipe it goes as the model wrote it.
    #[test]
    fn an_answer_on_a_terminal_drives_nothing_and_reorders_nothing() {
        let answer = || {
            vec![
                AgentEvent::TextDelta {
                    text: "Done \u{1b}]52;c;cHduZWQ=\u{7}".into(),
                },
                AgentEvent::TextDelta {
                    text: "see \u{202E}txt.exe\n\tnext line".into(),
                },
            ]
        };
        let (out, _) = human_on(
            Terminals {
                out: true,
                err: false,
            },
            answer(),
        );
        assert_eq!(out, "Done ?]52;c;cHduZWQ=?see ?txt.exe\n    next line\n");
        let (piped, _) = human(answer());
        assert_eq!(
            piped,
            "Done \u{1b}]52;c;cHduZWQ=\u{7}see \u{202E}txt.exe\n\tnext line\n"
        );
    }

    #[test]
    fn the_tally_starts_on_a_line_of_its_own() {
        let (out, err) = human(vec![
            AgentEvent::TextDelta {
                text: "...and that is cordon.".into(),
            },
            AgentEvent::TurnCompleted {
                stop_reason: cordon_agent::StopReason::EndTurn,
                steps: 3,
                usage: Default::default(),
                cost_usd: None,
                context_tokens: 0,
                context_window: 1,
            },
        ]);
        assert_eq!(out, "...and that is cordon.\n");
        assert!(err.starts_with("· 3 model requests"), "{err}");
    }

    #[test]
    fn a_plan_is_listed_with_its_marks_and_no_control_bytes() {
        let plan = cordon_tools::update_plan::Plan::parse(json!({"plan": [
            {"step": "read the code", "status": "completed"},
            {"step": "fix \u{1b}[2Jit", "status": "in_progress"},
            {"step": "run the tests", "status": "pending"},
        ]}))
        .unwrap();
        let (_, err) = human(vec![AgentEvent::PlanUpdated { plan }]);
        assert_eq!(
            err,
            "  plan, 1 of 3 done:\n    ✓ read the code\n    ▸ fix ?[2Jit\n    ○ run the tests\n"
        );
    }
}
