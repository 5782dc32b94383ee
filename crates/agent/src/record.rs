//! What a session's log holds: one [`SessionRecord`] a line, named by its
//! `type`. Every writer appends one and every reader matches on one, so
//! each record is spelled once, here.
//!
//! The log outlives the cordon that wrote it: a record of a type this
//! cordon does not know (a newer one wrote it), or one that does not read
//! as its type says, is skipped when the log is loaded ([`crate::log`]),
//! and the rest of the session reads on. Fields a record does not declare
//! are ignored, so records keep reading when a cordon adds one.

use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::event::AgentEvent;
use crate::wire::Message;

/// One record of a session's log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(
    tag = "type",
    rename_all = "snake_case",
    expecting = "a session record of a type this cordon knows"
)]
pub enum SessionRecord {
    /// The first record: who works where, and how the session began.
    SessionStarted(SessionStarted),
    /// The clone the session works on: where its pushes go.
    Repository(cordon_git::RepositoryRecord),
    /// A prompt of the user's: a turn begins.
    UserMessage { text: String },
    /// A message added to the history sent to the model.
    Message { message: Message },
    /// The first `replaced` messages of the history replaced by `summary`
    /// (a user message).
    Compaction { replaced: usize, summary: Message },
    /// The files at the end of a turn (or at the start).
    Checkpoint(cordon_git::Checkpoint),
    /// The files and the conversation taken back to the end of a turn.
    Rewind(Rewind),
    /// A new session started from a turn of this one.
    Fork(Fork),
    /// A change to the sandbox's network policy.
    NetworkPolicy(PolicyRecord),
    /// What the agent reported as it happened (every event but streamed
    /// deltas), under the event's own `type`: the same objects as
    /// `cordon exec --json` prints.
    #[serde(untagged)]
    Event(AgentEvent),
}

impl SessionRecord {
    /// The session's start, if this is it.
    pub fn started(&self) -> Option<&SessionStarted> {
        match self {
            SessionRecord::SessionStarted(s) => Some(s),
            _ => None,
        }
    }

    /// The clone the session works on, if this records it.
    pub fn repository(&self) -> Option<&cordon_git::RepositoryRecord> {
        match self {
            SessionRecord::Repository(r) => Some(r),
            _ => None,
        }
    }
}

impl From<AgentEvent> for SessionRecord {
    fn from(e: AgentEvent) -> SessionRecord {
        SessionRecord::Event(e)
    }
}

/// The first record of a session's log (and of `cordon exec --json`): who
/// works where, a title from the first line of the first prompt, and, for
/// the server's sessions, the screen and network they were created with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SessionStarted {
    pub session_id: String,
    #[serde(default)]
    pub model: String,
    #[serde(default)]
    pub provider: String,
    /// The host directory, resolved (so a resume can tell if a link was
    /// planted since); `/workspace` for the server's sessions.
    #[serde(default)]
    pub workspace: String,
    #[serde(default)]
    pub title: String,
    #[serde(default)]
    pub resumed: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display: Option<cordon_sandbox::Display>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<cordon_sandbox::Network>,
    /// With `network: allow`: the rules it started with, as a policy's
    /// spec writes them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub allow_private: Option<bool>,
    /// The session and turn this one was forked from (`cordon fork`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub forked_from: Option<ForkedFrom>,
    /// The image its sandbox's root is made from, by the name it was
    /// asked for; a resume runs there again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub image: Option<String>,
    /// The project instructions (`AGENTS.md`) read when it opened.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub instructions: Vec<crate::instructions::Source>,
}

/// Where a forked session came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ForkedFrom {
    pub session: String,
    /// Its turns start counting after this one.
    pub turn: u64,
}

impl SessionStarted {
    /// The same record, naming the image its sandbox runs in.
    pub fn in_image(mut self, image: Option<String>) -> Self {
        self.image = image;
        self
    }

    /// The same record, naming the instructions read.
    pub fn reading(mut self, instructions: &[crate::instructions::Source]) -> Self {
        self.instructions = instructions.to_vec();
        self
    }

    /// A local session's first record (`cordon exec`, the TUI).
    pub fn new(
        id: &str,
        model: &str,
        provider: &str,
        workspace: &Path,
        prompt: &str,
        resumed: bool,
    ) -> SessionStarted {
        SessionStarted {
            session_id: id.to_string(),
            model: model.to_string(),
            provider: provider.to_string(),
            workspace: workspace.to_string_lossy().into_owned(),
            title: title_of(prompt),
            resumed,
            display: None,
            network: None,
            allow: None,
            allow_private: None,
            forked_from: None,
            image: None,
            instructions: Vec::new(),
        }
    }

    /// As a log record.
    pub fn record(self) -> SessionRecord {
        SessionRecord::SessionStarted(self)
    }
}

/// A session's title: the first line of its first prompt, cut.
pub(crate) fn title_of(prompt: &str) -> String {
    prompt
        .lines()
        .next()
        .unwrap_or("")
        .chars()
        .take(72)
        .collect()
}

/// What a rewind did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Rewind {
    /// The turn whose end the session went back to.
    pub to_turn: u64,
    /// The `checkpoint` record of that turn: the conversation is read up
    /// to it.
    pub to_seq: u64,
    /// The checkpoint restored.
    pub checkpoint: String,
    /// The files as they were just before: restoring it undoes this.
    pub before: String,
    pub written: usize,
    pub removed: usize,
    /// Paths left as they were, and why.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub kept: Vec<cordon_git::Kept>,
}

/// A fork, in the session it was taken from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fork {
    pub turn: u64,
    pub session: String,
    /// The new session's workspace.
    pub workspace: String,
}

/// A change to the sandbox's network policy, made by whoever holds its
/// handle (the TUI's `/allow`, the server's API): what it allows now, and
/// what the change added and took away.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PolicyRecord {
    pub allow: Vec<String>,
    pub allow_private: bool,
    pub added: Vec<String>,
    pub removed: Vec<String>,
}

impl PolicyRecord {
    /// The change from `before` to `after`.
    pub fn between(before: &cordon_net::Policy, after: &cordon_net::Policy) -> PolicyRecord {
        let names = |p: &cordon_net::Policy| -> Vec<String> {
            p.rules().iter().map(ToString::to_string).collect()
        };
        let (was, now) = (names(before), names(after));
        PolicyRecord {
            added: now.iter().filter(|r| !was.contains(r)).cloned().collect(),
            removed: was.iter().filter(|r| !now.contains(r)).cloned().collect(),
            allow: now,
            allow_private: after.allow_private(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_started_record_reads_back_as_written_and_nothing_else_does() {
        let mut s = SessionStarted::new(
            "s1",
            "m",
            "anthropic",
            Path::new("/w"),
            "fix the parser\nthen test",
            false,
        );
        assert_eq!(s.title, "fix the parser");
        s.display = Some("1280x800".parse().unwrap());
        s.network = Some(cordon_sandbox::Network::Allow);
        s.allow = Some(vec!["example.com:443".into()]);
        s.allow_private = Some(false);
        let record = serde_json::to_value(s.clone().record()).unwrap();
        assert_eq!(record["type"], "session_started");
        assert_eq!(record["display"], "1280x800");
        assert_eq!(record["network"], "allow");
        let read = |v: &serde_json::Value| {
            SessionRecord::deserialize(v)
                .ok()
                .and_then(|r| r.started().cloned())
        };
        assert_eq!(read(&record), Some(s));
        // A local session's record has no server fields at all.
        let local = serde_json::to_value(
            SessionStarted::new("s2", "m", "p", Path::new("/w"), "", true).record(),
        )
        .unwrap();
        assert!(local.get("network").is_none() && local.get("display").is_none());
        // Another record, a bad screen, a bad mode: not a start.
        for bad in [
            json!({"type": "message", "session_id": "s1"}),
            json!({"type": "session_started"}),
            json!({"type": "session_started", "session_id": "s", "display": "huge"}),
            json!({"type": "session_started", "session_id": "s", "network": "host"}),
        ] {
            assert!(read(&bad).is_none(), "{bad}");
        }
    }

    #[test]
    fn an_event_is_its_own_record_and_an_unknown_type_is_none() {
        let e = AgentEvent::Error {
            message: "m".into(),
        };
        let record = serde_json::to_value(SessionRecord::from(e.clone())).unwrap();
        assert_eq!(record, serde_json::to_value(&e).unwrap());
        assert_eq!(
            SessionRecord::deserialize(&record).unwrap(),
            SessionRecord::Event(e)
        );
        for unknown in [
            json!({"type": "from_a_newer_cordon"}),
            json!({"type": 7}),
            json!({"text": "no type"}),
            json!("not an object"),
        ] {
            assert!(SessionRecord::deserialize(&unknown).is_err(), "{unknown}");
        }
    }
}
