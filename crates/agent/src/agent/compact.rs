//! Compaction: the older part of the conversation replaced by a summary
//! the model writes, on request, past the threshold, or when the model's
//! server says the context is too long.

use tokio::sync::mpsc;

use super::{Agent, AgentError, AgentEvent, Cancel, Compaction, Journal};
use crate::context;
use crate::message::StreamDelta;
use crate::record::SessionRecord;
use crate::wire::{ModelRequest, ToolSpec};

/// Share of the window kept verbatim when compacting automatically.
pub(super) const KEEP_SHARE: f64 = 0.25;

impl Agent {
    /// Summarises the older part of the conversation now (the front ends'
    /// `/compact`), whatever the context's size.
    pub async fn compact(
        &mut self,
        events: &mpsc::UnboundedSender<AgentEvent>,
        cancel: &Cancel,
    ) -> Result<Compaction, AgentError> {
        self.settle().await;
        let log = self.log.clone();
        let journal = Journal { events, log: &log };
        let tools = self.specs();
        let result = self
            .compact_with(&journal, "requested", 0.0, &tools, cancel)
            .await;
        if let Err(e) = &result {
            journal.emit(AgentEvent::Error {
                message: e.to_string(),
            });
        }
        log.sync();
        result
    }

    /// A context-too-long error quotes the prompt's real size and the
    /// window (Anthropic: "prompt is too long: 210000 tokens > 200000
    /// maximum"; OpenAI: "maximum context length is 8192 tokens. However,
    /// your messages resulted in 9000 tokens"): both correct our figures.
    pub(super) fn learn_from_overflow(&mut self, req: &ModelRequest, message: &str) {
        let numbers: Vec<u64> = message
            .split(|c: char| !c.is_ascii_digit())
            .filter(|w| w.len() >= 3)
            .filter_map(|w| w.parse().ok())
            .collect();
        let (Some(&actual), Some(&maximum)) = (numbers.iter().max(), numbers.iter().min()) else {
            return;
        };
        if actual <= maximum {
            return;
        }
        let estimated = context::estimate_request(req);
        if estimated > 0 {
            self.ratio = (actual as f64 / estimated as f64).clamp(0.25, 4.0);
        }
        self.config.context_window = self.config.context_window.min(maximum);
    }

    /// Replaces the older part of the history by a summary the model
    /// writes, keeping up to `keep_share` of the window of recent messages
    /// in full. The summary request reuses the system prompt and tools, so
    /// its prefix is served from the prompt cache.
    pub(super) async fn compact_with(
        &mut self,
        journal: &Journal<'_>,
        reason: &str,
        keep_share: f64,
        tools: &[ToolSpec],
        cancel: &Cancel,
    ) -> Result<Compaction, AgentError> {
        let window = self.config.context_window as f64;
        // Budgets below are in estimated tokens, the unit of the history.
        let keep = (window * keep_share / self.ratio) as u64;
        let cut = context::choose_cut(&self.history, keep)
            .ok_or_else(|| AgentError::Compaction("there is nothing older to summarise".into()))?;
        journal.emit(AgentEvent::CompactionStarted {
            reason: reason.to_string(),
        });
        let tokens_before = self.context_tokens();
        let mut request = self.request(tools);
        let overhead = context::estimate_request(&ModelRequest {
            messages: Vec::new(),
            ..request.clone()
        });
        let budget = ((window * 0.85 / self.ratio) as u64)
            .saturating_sub(overhead)
            .saturating_sub(u64::from(self.config.max_tokens.min(8192)));
        request.messages =
            context::summary_input(&self.history, cut, budget, self.config.keep_tool_outputs);
        request.max_tokens = self.config.max_tokens.min(8192);
        // Summary text is not the assistant's answer: only retries are shown.
        let streamed = self.provider.stream(&request, |d| {
            if let StreamDelta::Retrying {
                attempt,
                wait,
                reason,
            } = d
            {
                journal.emit(AgentEvent::Retrying {
                    attempt,
                    wait_ms: wait.as_millis() as u64,
                    reason,
                });
            }
        });
        let answer = tokio::select! {
            biased;
            _ = cancel.cancelled() => return Err(AgentError::Cancelled),
            r = streamed => r?,
        };
        self.usage += answer.usage;
        let summary = answer.text();
        if summary.trim().is_empty() {
            return Err(AgentError::Compaction(
                "the model wrote an empty summary".into(),
            ));
        }
        // The task must survive even a summary that forgets it.
        let prompt = if context::latest_prompt(&self.history[cut..]).is_none() {
            context::latest_prompt(&self.history[..cut]).map(|p| clip(p, 16 * 1024))
        } else {
            None
        };
        let message = context::summary_message(&summary, prompt.as_deref());
        journal.log.append(&SessionRecord::Compaction {
            replaced: cut,
            summary: message.clone(),
        });
        context::apply_compaction(&mut self.history, cut, message);
        let c = Compaction {
            replaced_messages: cut,
            tokens_before,
            tokens_after: self.context_tokens(),
            summary,
            usage: answer.usage,
        };
        journal.emit(AgentEvent::Compacted {
            replaced_messages: c.replaced_messages,
            tokens_before: c.tokens_before,
            tokens_after: c.tokens_after,
            summary: c.summary.clone(),
        });
        Ok(c)
    }
}

/// At most `max` bytes of `text`, cut at a character boundary, marked.
fn clip(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}\n[… {} more bytes]", &text[..end], text.len() - end)
}
