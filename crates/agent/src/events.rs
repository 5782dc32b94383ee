//! Where a conversation's events go. Every front end renders the same
//! [`AgentEvent`]s, each through one [`EventSink`]: text for a person and
//! JSON lines (`cordon exec`), Server-Sent Events (the server's jobs and
//! sessions) and the terminal UI (its channel). [`pump`] runs a turn and
//! hands its events to a sink, in order, while it runs.

use std::future::Future;

pub use futures_util::future::BoxFuture;
use tokio::sync::mpsc;

use crate::event::AgentEvent;

/// One rendering of a conversation's events.
pub trait EventSink: Send {
    /// Takes the next event; returns once it is shown, sent or stored.
    fn event(&mut self, ev: AgentEvent) -> BoxFuture<'_, ()>;

    /// The turn is over: flush or close what the rendering keeps open.
    fn finish(&mut self) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }
}

/// The terminal UI's rendering, and any consumer on another task: the
/// events go on to its channel (a receiver gone away is not an error).
impl EventSink for mpsc::UnboundedSender<AgentEvent> {
    fn event(&mut self, ev: AgentEvent) -> BoxFuture<'_, ()> {
        let _ = self.send(ev);
        Box::pin(async {})
    }
}

/// Runs `turn`, which sends its events into the channel `events` reads,
/// and passes each to `sink` as it comes; then the rest, then
/// [`EventSink::finish`]. The turn's own result is returned.
pub async fn pump<T>(
    turn: impl Future<Output = T>,
    events: &mut mpsc::UnboundedReceiver<AgentEvent>,
    sink: &mut dyn EventSink,
) -> T {
    tokio::pin!(turn);
    let result = loop {
        tokio::select! {
            // Events first: what the turn sent before it ended is shown
            // before the turn is over.
            biased;
            Some(ev) = events.recv() => sink.event(ev).await,
            r = &mut turn => break r,
        }
    };
    while let Ok(ev) = events.try_recv() {
        sink.event(ev).await;
    }
    sink.finish().await;
    result
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Collect(Vec<String>);

    impl EventSink for Collect {
        fn event(&mut self, ev: AgentEvent) -> BoxFuture<'_, ()> {
            if let AgentEvent::TextDelta { text } = ev {
                self.0.push(text);
            }
            Box::pin(async {})
        }

        fn finish(&mut self) -> BoxFuture<'_, ()> {
            self.0.push("finished".into());
            Box::pin(async {})
        }
    }

    #[tokio::test]
    async fn every_event_reaches_the_sink_in_order_before_it_finishes() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let turn = async move {
            for i in 0..100 {
                let _ = tx.send(AgentEvent::TextDelta {
                    text: i.to_string(),
                });
                if i % 10 == 0 {
                    tokio::task::yield_now().await;
                }
            }
            42
        };
        let mut sink = Collect(Vec::new());
        assert_eq!(pump(turn, &mut rx, &mut sink).await, 42);
        let want: Vec<String> = (0..100)
            .map(|i| i.to_string())
            .chain(["finished".to_string()])
            .collect();
        assert_eq!(sink.0, want);
    }
}
