//! Where a job's events and output go: the database first, then live
//! subscribers.

use std::sync::Arc;
use std::time::{Duration, Instant};

use cordon_sandbox::Stream;

use crate::hub::Hub;
use crate::job::JobEvent;
use crate::store::{NewEvent, OutputDelta, Store};

/// Output is flushed to the database at least this often while it flows.
const FLUSH_EVERY: Duration = Duration::from_millis(50);
/// ... or once this much is pending.
const FLUSH_BYTES: usize = 32 * 1024;

/// Where a job's events and output go: the database first, then live
/// subscribers.
pub(super) struct Sink {
    store: Store,
    hub: Arc<Hub>,
    id: String,
    /// The claim the job must still be on for this run to write.
    lease: crate::store::Lease,
    cap: usize,
    pending: OutputDelta,
    pending_events: Vec<NewEvent>,
    stored: [usize; 2],
    truncated: [bool; 2],
    /// Bytes of a UTF-8 character split across chunks, per stream.
    partial: [Vec<u8>; 2],
    since: Option<Instant>,
    /// The running step's own output, when a `steps` job runs one.
    step: Option<StepOutput>,
}

/// Characters of each stream kept in a step's own result; the job's
/// stdout and stderr keep more, across steps.
const STEP_OUTPUT_CAP: usize = 64 * 1024;

/// One step's stdout and stderr, capped.
#[derive(Default)]
pub(super) struct StepOutput {
    pub(super) text: [String; 2],
    pub(super) truncated: [bool; 2],
}

impl Sink {
    /// The claim its events are written under.
    pub(super) fn lease(&self) -> &crate::store::Lease {
        &self.lease
    }

    pub(super) fn new(
        store: Store,
        hub: Arc<Hub>,
        id: &str,
        lease: crate::store::Lease,
        cap: usize,
    ) -> Sink {
        Sink {
            store,
            hub,
            id: id.to_string(),
            lease,
            cap,
            pending: OutputDelta::default(),
            pending_events: Vec::new(),
            stored: [0, 0],
            truncated: [false, false],
            partial: [Vec::new(), Vec::new()],
            since: None,
            step: None,
        }
    }

    /// Bytes of each stream the job keeps.
    pub(super) fn cap(&self) -> usize {
        self.cap
    }

    /// From now on, output is also the running step's own.
    pub(super) fn begin_step(&mut self) {
        self.step = Some(StepOutput::default());
    }

    /// The step's own output, as its result shows it.
    pub(super) fn end_step(&mut self) -> StepOutput {
        self.step.take().unwrap_or_default()
    }

    pub(super) async fn event(&mut self, event: JobEvent) {
        self.push(event.into()).await;
    }

    pub(super) async fn push(&mut self, event: NewEvent) {
        self.pending_events.push(event);
        self.flush().await;
    }

    /// Adds output of `which` stream, up to the cap.
    pub(super) async fn output(&mut self, which: Stream, bytes: &[u8]) {
        let stream = which.index();
        if self.truncated[stream] {
            return;
        }
        let mut buf = std::mem::take(&mut self.partial[stream]);
        buf.extend_from_slice(bytes);
        let (text, rest) = split_utf8(&buf);
        self.partial[stream] = rest.to_vec();
        let room = self.cap.saturating_sub(self.stored[stream]);
        let mut text = text;
        if text.len() > room {
            let mut end = room;
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            text = text[..end].to_string();
            self.truncated[stream] = true;
            self.partial[stream].clear();
        }
        self.stored[stream] += text.len();
        if let Some(step) = self.step.as_mut() {
            let room = STEP_OUTPUT_CAP.saturating_sub(step.text[stream].len());
            let mut end = text.len().min(room);
            while !text.is_char_boundary(end) {
                end -= 1;
            }
            step.text[stream].push_str(&text[..end]);
            step.truncated[stream] |= end < text.len() || self.truncated[stream];
        }
        if !text.is_empty() {
            let event = match which {
                Stream::Stdout => JobEvent::Stdout { data: text.clone() },
                Stream::Stderr => JobEvent::Stderr { data: text.clone() },
            };
            self.pending_events.push(event.into());
            match which {
                Stream::Stdout => self.pending.stdout.push_str(&text),
                Stream::Stderr => self.pending.stderr.push_str(&text),
            }
        }
        if self.truncated[stream] {
            self.pending_events.push(
                JobEvent::OutputTruncated {
                    stream: which,
                    cap_bytes: self.cap,
                }
                .into(),
            );
        }
        self.since.get_or_insert_with(Instant::now);
        if self.pending.stdout.len() + self.pending.stderr.len() >= FLUSH_BYTES
            || self.truncated[stream]
        {
            self.flush().await;
        }
    }

    /// When pending output must be flushed by.
    pub(super) fn deadline(&self) -> Option<tokio::time::Instant> {
        self.since
            .map(|t| tokio::time::Instant::from_std(t + FLUSH_EVERY))
    }

    pub(super) async fn flush(&mut self) {
        if self.pending_events.is_empty() {
            return;
        }
        self.pending.stdout_truncated = self.truncated[0];
        self.pending.stderr_truncated = self.truncated[1];
        let events = std::mem::take(&mut self.pending_events);
        let output = std::mem::take(&mut self.pending);
        self.since = None;
        match self
            .store
            .append(&self.id, Some(&self.lease), &events, Some(&output))
            .await
        {
            Ok(stored) => self.hub.publish(&self.id, &stored),
            Err(e) => tracing::error!(job = %self.id, "cannot record output: {e}"),
        }
    }
}

/// The longest valid UTF-8 prefix and the bytes after it, when those are
/// the start of a character cut off by the chunk's end; invalid bytes
/// become U+FFFD.
fn split_utf8(buf: &[u8]) -> (String, &[u8]) {
    match std::str::from_utf8(buf) {
        Ok(s) => (s.to_string(), &[]),
        Err(e) if e.error_len().is_none() => {
            let (ok, rest) = buf.split_at(e.valid_up_to());
            (String::from_utf8_lossy(ok).into_owned(), rest)
        }
        Err(_) => (String::from_utf8_lossy(buf).into_owned(), &[]),
    }
}
