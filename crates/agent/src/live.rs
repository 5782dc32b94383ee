//! A running tool call's output as it arrives: passed on to the front ends
//! as [`AgentEvent::ToolOutput`] in pieces of whole characters, batched to
//! at most one event per [`EVERY`] unless [`CHUNK`] bytes wait, and its end
//! kept, so that a call the user cancels still shows, and tells the model,
//! what it had printed.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_sandbox::Stream;
use cordon_tools::Progress;
use tokio::sync::mpsc;

use crate::event::AgentEvent;

/// Longest wait before waiting output is passed on.
const EVERY: Duration = Duration::from_millis(100);
/// Output passed on at once when this much waits.
const CHUNK: usize = 16 * 1024;
/// How much of the end of the output is kept for a cancelled call.
const KEEP: usize = 8 * 1024;

pub(crate) struct Live {
    id: String,
    events: mpsc::UnboundedSender<AgentEvent>,
    state: Mutex<State>,
}

struct State {
    /// Bytes not yet passed on, per stream (stdout, stderr).
    pending: [Vec<u8>; 2],
    last: Instant,
    /// The end of everything passed on, in arrival order.
    kept: String,
}

impl Live {
    pub(crate) fn new(id: &str, events: mpsc::UnboundedSender<AgentEvent>) -> Arc<Live> {
        let live = Arc::new(Live {
            id: id.to_string(),
            events,
            state: Mutex::new(State {
                pending: [Vec::new(), Vec::new()],
                last: Instant::now(),
                kept: String::new(),
            }),
        });
        // Output that waits is passed on within EVERY even when nothing
        // more comes (a command that prints, then works quietly). The
        // ticker ends with the call, when the last holder lets go.
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let weak = Arc::downgrade(&live);
            rt.spawn(async move {
                let mut tick = tokio::time::interval(EVERY);
                tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
                loop {
                    tick.tick().await;
                    let Some(live) = weak.upgrade() else { break };
                    let mut st = live.state.lock().unwrap_or_else(|p| p.into_inner());
                    if st.pending.iter().any(|p| !p.is_empty()) && st.last.elapsed() >= EVERY {
                        live.pass_on(&mut st, false);
                    }
                }
            });
        }
        live
    }

    /// The sink a tool reports to.
    pub(crate) fn progress(self: &Arc<Live>) -> Progress {
        let live = self.clone();
        Arc::new(move |stream, data| live.report(stream, data))
    }

    fn report(&self, stream: Stream, data: &[u8]) {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.pending[stream.index()].extend_from_slice(data);
        let waiting: usize = st.pending.iter().map(Vec::len).sum();
        if waiting >= CHUNK || st.last.elapsed() >= EVERY {
            self.pass_on(&mut st, false);
        }
    }

    /// Passes on what waits; an incomplete character at the end waits for
    /// the rest unless `all`.
    fn pass_on(&self, st: &mut State, all: bool) {
        for stream in [Stream::Stdout, Stream::Stderr] {
            let buf = &mut st.pending[stream.index()];
            let upto = if all { buf.len() } else { complete_prefix(buf) };
            if upto == 0 {
                continue;
            }
            let text = String::from_utf8_lossy(&buf[..upto]).into_owned();
            buf.drain(..upto);
            keep_end(&mut st.kept, &text);
            let _ = self.events.send(AgentEvent::ToolOutput {
                id: self.id.clone(),
                stream,
                text,
            });
        }
        st.last = Instant::now();
    }

    /// Everything not yet passed on is, and the end of the output returned.
    pub(crate) fn finish(&self) -> String {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        self.pass_on(&mut st, true);
        st.kept.clone()
    }
}

/// The length of `buf` without an incomplete UTF-8 sequence at its end.
fn complete_prefix(buf: &[u8]) -> usize {
    match std::str::from_utf8(buf) {
        Ok(_) => buf.len(),
        // error_len None: the input ended inside a character.
        Err(e) if e.error_len().is_none() => e.valid_up_to(),
        Err(_) => buf.len(),
    }
}

fn keep_end(kept: &mut String, text: &str) {
    kept.push_str(text);
    if kept.len() > KEEP {
        let mut cut = kept.len() - KEEP;
        while !kept.is_char_boundary(cut) {
            cut += 1;
        }
        kept.drain(..cut);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn output_is_passed_on_in_whole_characters_and_its_end_kept() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let live = Live::new("t1", tx);
        let p = live.progress();
        // "é" split across two reports, both large enough to pass on at once.
        let mut first = vec![b'a'; CHUNK - 1];
        first.push(0xc3);
        p(Stream::Stdout, &first);
        p(Stream::Stdout, &[0xa9, b'\n']);
        p(Stream::Stderr, b"warn");
        let kept = live.finish();
        let mut texts = Vec::new();
        while let Ok(AgentEvent::ToolOutput { text, stream, .. }) = rx.try_recv() {
            texts.push((stream, text));
        }
        let stdout: String = texts
            .iter()
            .filter(|(s, _)| *s == Stream::Stdout)
            .map(|(_, t)| t.as_str())
            .collect();
        assert!(stdout.ends_with("aé\n"), "no character was split");
        assert!(!stdout.contains('\u{fffd}'));
        assert!(texts.contains(&(Stream::Stderr, "warn".into())));
        assert!(kept.ends_with("é\nwarn") && kept.len() <= KEEP);
    }
}
