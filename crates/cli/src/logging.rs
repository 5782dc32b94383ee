//! Where `tracing`'s records go, per command.
//!
//! On a user's terminal (`run`, `exec`, `shell`, `mcp`, …) a record is a
//! message to the user: one `cordon:` line, without a timestamp, a module
//! path or colour, its control characters made visible (a record may
//! quote what a sandbox wrote). `CORDON_LOG` asks for the full log
//! instead, as a developer wants it. A server's standard error is its
//! log, in full; the chat UI's goes to a file beside its sessions.

use std::fmt;
use std::io::IsTerminal;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::EnvFilter;
use tracing_subscriber::fmt::format::Writer;
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;

/// The variable that selects records and asks for the full format.
const ENV: &str = "CORDON_LOG";

pub enum To {
    Terminal,
    ServerLog,
    File(Box<dyn std::io::Write + Send>),
}

pub fn init(to: To) {
    let asked = EnvFilter::try_from_env(ENV).ok();
    let full = asked.is_some();
    let filter = asked.unwrap_or_else(|| EnvFilter::new("warn"));
    let logs = tracing_subscriber::fmt().with_env_filter(filter);
    match to {
        To::File(file) => logs
            .with_ansi(false)
            .with_writer(std::sync::Mutex::new(file))
            .init(),
        To::ServerLog => logs
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .init(),
        To::Terminal if full => logs
            .with_ansi(std::io::stderr().is_terminal())
            .with_writer(std::io::stderr)
            .init(),
        To::Terminal => logs
            .event_format(UserLine)
            .with_writer(std::io::stderr)
            .init(),
    }
}

/// A record as a line for the user: `cordon: [error: ]message fields`.
struct UserLine;

impl<S, N> FormatEvent<S, N> for UserLine
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let mut text = String::new();
        ctx.field_format()
            .format_fields(Writer::new(&mut text), event)?;
        let error = if *event.metadata().level() == Level::ERROR {
            "error: "
        } else {
            ""
        };
        writeln!(
            writer,
            "cordon: {error}{}",
            cordon_tools::printable_lines(text.trim_end())
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::fmt::MakeWriter;

    /// A writer the test reads back.
    #[derive(Clone, Default)]
    struct Captured(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

    impl std::io::Write for Captured {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl<'a> MakeWriter<'a> for Captured {
        type Writer = Captured;
        fn make_writer(&'a self) -> Captured {
            self.clone()
        }
    }

    #[test]
    fn a_record_is_one_cordon_line_with_its_control_characters_visible() {
        let out = Captured::default();
        let subscriber = tracing_subscriber::fmt()
            .event_format(UserLine)
            .with_writer(out.clone())
            .finish();
        tracing::subscriber::with_default(subscriber, || {
            tracing::warn!("cannot read {}", "a\u{1b}[31mred\u{7}name");
            tracing::error!(code = 3, "it failed");
        });
        let text = String::from_utf8(out.0.lock().unwrap().clone()).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 2, "{text}");
        assert!(lines[0].starts_with("cordon: cannot read a"), "{text}");
        assert!(
            !text.contains('\u{1b}') && !text.contains('\u{7}'),
            "{text:?}"
        );
        assert_eq!(lines[1], "cordon: error: it failed code=3");
    }
}
