//! Sessions on disk: one append-only log per conversation in
//! `$XDG_DATA_HOME/cordon/sessions/<id>.jsonl`, listed and resumed from
//! their records ([`SessionRecord`]).
//!
//! The records read back here: `session_started` (id, model, provider,
//! workspace, title), `user_message` (a turn), `message` (one [`Message`]
//! appended to the history sent to the model), `compaction` (the first
//! `replaced` messages replaced by a `summary` message), `checkpoint`,
//! `rewind` and `turn_completed` (its `usage`). Everything else (tool
//! calls, errors) is kept for audit. Nothing is ever rewritten: a
//! compaction adds a record, and the full conversation stays on disk.

use std::path::{Path, PathBuf};

use crate::event::AgentEvent;
use crate::log::{LogError, Record, SessionLog, load};
use crate::message::Usage;
use crate::wire::Message;

pub use crate::record::{ForkedFrom, SessionRecord, SessionStarted};

/// The directory sessions live in.
pub fn sessions_dir() -> PathBuf {
    std::env::var_os("XDG_DATA_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".local/share")))
        .unwrap_or_else(std::env::temp_dir)
        .join("cordon/sessions")
}

/// `path` resolved for comparing workspaces (made absolute, as given,
/// when it no longer exists).
pub fn same_dir(path: &Path) -> PathBuf {
    path.canonicalize()
        .unwrap_or_else(|_| std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf()))
}

/// The workspace a resumed session continues in: the path it recorded,
/// if that path still leads where it did. Sessions record their workspace
/// resolved, so a path that now resolves elsewhere has a symbolic link on
/// the way, which a sandbox working in a directory above could have
/// planted (`sub -> /home/user/.ssh`), or was moved.
pub fn recorded_workspace(id: &str, recorded: &str) -> Result<PathBuf, String> {
    let path = PathBuf::from(recorded);
    let now = same_dir(&path);
    if now == path {
        return Ok(path);
    }
    Err(format!(
        "session {id} worked in {recorded}, which now leads to {} (through a symbolic link, \
         which a sandbox could have planted, or after a move); cordon does not follow it: \
         resume with --workspace naming the directory to continue in",
        now.display()
    ))
}

/// A new, sortable session id: seconds since the epoch and a random tail.
pub fn new_id() -> String {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    format!(
        "{}-{:05x}",
        now.as_secs(),
        (now.subsec_nanos() ^ std::process::id()) & 0xfffff
    )
}

/// What `cordon sessions` shows of one session.
#[derive(Debug, Clone, PartialEq)]
pub struct SessionSummary {
    pub id: String,
    pub path: PathBuf,
    /// Milliseconds since the epoch of the first record.
    pub started_ms: u64,
    pub title: String,
    pub workspace: String,
    /// The image its sandbox ran in, as named when it started.
    pub image: Option<String>,
    /// User prompts sent.
    pub turns: u64,
    pub usage: Usage,
}

/// A session loaded for resuming.
pub struct Resumed {
    pub summary: SessionSummary,
    pub history: Vec<Message>,
    pub log: SessionLog<SessionRecord>,
}

/// Errors finding or reading sessions.
#[derive(Debug, thiserror::Error)]
pub enum SessionError {
    #[error("no session {0:?} (see `cordon sessions`)")]
    NotFound(String),
    #[error("there are no sessions yet")]
    None,
    #[error("no session has worked in {0} yet (`cordon sessions --all` lists every workspace's)")]
    NoneHere(String),
    #[error("{prefix:?} is ambiguous: it starts {} (give more of the id)", .matches.join(", "))]
    Ambiguous {
        prefix: String,
        matches: Vec<String>,
    },
    #[error(transparent)]
    Log(#[from] LogError),
}

/// What a session's records say about it; `None` unless it starts with `session_started`.
pub fn summarize(path: &Path, records: &[Record<SessionRecord>]) -> Option<SessionSummary> {
    let first = records.first()?;
    let started = first.data.started()?;
    let mut s = SessionSummary {
        id: started.session_id.clone(),
        path: path.to_path_buf(),
        started_ms: first.ts_ms,
        title: started.title.clone(),
        workspace: started.workspace.clone(),
        image: started.image.clone(),
        turns: 0,
        usage: Usage::default(),
    };
    let mut rewound = false;
    for r in records {
        match &r.data {
            SessionRecord::UserMessage { .. } => s.turns = s.turns.saturating_add(1),
            SessionRecord::Rewind(_) => rewound = true,
            SessionRecord::Event(AgentEvent::TurnCompleted { usage, .. }) => s.usage += *usage,
            _ => {}
        }
    }
    // Turns count as the conversation now stands: from a fork's turn on,
    // and back to a rewind's.
    if rewound || started.forked_from.is_some() {
        s.turns = timeline(records).turns;
    }
    Some(s)
}

/// Every readable session in `dir`, newest first. Unreadable files are
/// skipped with a warning rather than hiding the rest.
pub fn list(dir: &Path) -> Vec<SessionSummary> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out: Vec<SessionSummary> = entries
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "jsonl"))
        .filter_map(|p| match load::<SessionRecord>(&p) {
            Ok((records, _)) => summarize(&p, &records),
            Err(e) => {
                tracing::warn!("skipping {}: {e}", p.display());
                None
            }
        })
        .collect();
    out.sort_by(|a, b| b.started_ms.cmp(&a.started_ms).then(b.id.cmp(&a.id)));
    out
}

/// Opens a session to continue it: `id` exactly, or a unique prefix of it;
/// `None` takes the most recent, of those that worked in `workspace` when
/// one is given.
pub fn resume(
    dir: &Path,
    id: Option<&str>,
    workspace: Option<&Path>,
) -> Result<Resumed, SessionError> {
    let chosen = choose(&list(dir), id, workspace)?;
    open(&chosen.path)
}

/// [`resume`]'s choice among `all` (newest first).
pub fn choose(
    all: &[SessionSummary],
    id: Option<&str>,
    workspace: Option<&Path>,
) -> Result<SessionSummary, SessionError> {
    let Some(want) = id else {
        let Some(ws) = workspace else {
            return all.first().cloned().ok_or(SessionError::None);
        };
        return all
            .iter()
            .find(|s| Path::new(&s.workspace) == ws)
            .cloned()
            .ok_or_else(|| {
                if all.is_empty() {
                    SessionError::None
                } else {
                    SessionError::NoneHere(ws.display().to_string())
                }
            });
    };
    if let Some(exact) = all.iter().find(|s| s.id == want) {
        return Ok(exact.clone());
    }
    let hits: Vec<&SessionSummary> = all.iter().filter(|s| s.id.starts_with(want)).collect();
    match hits.as_slice() {
        [] => Err(SessionError::NotFound(want.to_string())),
        [one] => Ok((*one).clone()),
        many => Err(SessionError::Ambiguous {
            prefix: want.to_string(),
            matches: many.iter().map(|s| s.id.clone()).collect(),
        }),
    }
}

/// Opens the session log at `path` to continue it.
pub fn open(path: &Path) -> Result<Resumed, SessionError> {
    let (log, records, report) = SessionLog::<SessionRecord>::open(path)?;
    if report.partial_tail || !report.bad_lines.is_empty() {
        tracing::warn!(
            "{}: skipped a torn last line or unreadable lines {:?}",
            path.display(),
            report.bad_lines
        );
    }
    let summary = summarize(path, &records)
        .ok_or_else(|| SessionError::NotFound(path.display().to_string()))?;
    let history = replay(&records);
    Ok(Resumed {
        summary,
        history,
        log,
    })
}

/// The history as last sent to the model, rebuilt from a log's records
/// with the same operations the agent applied when it wrote them.
pub fn replay(records: &[Record<SessionRecord>]) -> Vec<Message> {
    timeline(records).history
}

/// The label each tool call was shown with, by call id, as the log
/// recorded them (calls logged before labels were have none).
pub fn labels(records: &[Record<SessionRecord>]) -> std::collections::BTreeMap<String, String> {
    records
        .iter()
        .filter_map(|r| match &r.data {
            SessionRecord::Event(AgentEvent::ToolCallStarted { id, label, .. })
                if !label.is_empty() =>
            {
                Some((id.clone(), label.clone()))
            }
            _ => None,
        })
        .collect()
}

/// A conversation as its log now reads: after rewinds, as it was at the
/// record each went back to.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Timeline {
    /// What the model is sent next.
    pub history: Vec<Message>,
    /// User prompts sent, counting from a fork's turn.
    pub turns: u64,
    /// Every checkpoint still on the timeline, oldest first.
    pub checkpoints: Vec<TurnCheckpoint>,
}

/// A `checkpoint` record, and the turn it ends (0: before the first).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TurnCheckpoint {
    pub turn: u64,
    /// The record's sequence number.
    pub seq: u64,
    pub id: String,
}

/// Reads a session's records into its [`Timeline`]. A `rewind` record
/// takes the timeline back to what the records up to its `to_seq` make.
pub fn timeline(records: &[Record<SessionRecord>]) -> Timeline {
    let mut t = Timeline::default();
    if let Some(from) = records
        .first()
        .and_then(|r| r.data.started())
        .and_then(|s| s.forked_from.as_ref())
    {
        t.turns = from.turn;
    }
    for (i, r) in records.iter().enumerate() {
        match &r.data {
            SessionRecord::Message { message } => {
                crate::context::push_message(&mut t.history, message.clone())
            }
            SessionRecord::Compaction { replaced, summary } => {
                crate::context::apply_compaction(&mut t.history, *replaced, summary.clone())
            }
            // Saturating: a fork's turn is read from the log.
            SessionRecord::UserMessage { .. } => t.turns = t.turns.saturating_add(1),
            SessionRecord::Checkpoint(c) => t.checkpoints.push(TurnCheckpoint {
                turn: t.turns,
                seq: r.seq,
                id: c.id.clone(),
            }),
            // Only backwards: a record naming itself or later is not one
            // cordon wrote.
            SessionRecord::Rewind(rw) if rw.to_seq < r.seq => {
                let upto = records[..i].partition_point(|p| p.seq <= rw.to_seq);
                t = timeline(&records[..upto]);
            }
            SessionRecord::Rewind(_) => {
                tracing::warn!("skipping a rewind record that does not go back")
            }
            _ => {}
        }
    }
    t
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_recorded_workspace_that_now_leads_elsewhere_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let root = same_dir(d.path());
        let sub = root.join("sub");
        std::fs::create_dir(&sub).unwrap();
        let recorded = sub.display().to_string();
        assert_eq!(recorded_workspace("s1", &recorded).unwrap(), sub);
        // What a sandbox of `root` can do to `sub`.
        std::fs::create_dir(root.join("elsewhere")).unwrap();
        std::fs::remove_dir(&sub).unwrap();
        std::os::unix::fs::symlink("elsewhere", &sub).unwrap();
        let e = recorded_workspace("s1", &recorded).unwrap_err();
        assert!(
            e.contains("symbolic link") && e.contains("--workspace"),
            "{e}"
        );
        // Gone altogether: left to the sandbox to report.
        std::fs::remove_file(&sub).unwrap();
        assert_eq!(recorded_workspace("s1", &recorded).unwrap(), sub);
    }

    fn write(dir: &Path, id: &str, title: &str, prompts: &[&str]) {
        let mut log = SessionLog::create(dir.join(format!("{id}.jsonl"))).unwrap();
        let mut started = SessionStarted::new(id, "", "", Path::new("/w"), "", false);
        started.title = title.into();
        log.append(&started.record()).unwrap();
        for p in prompts {
            log.append(&SessionRecord::UserMessage {
                text: p.to_string(),
            })
            .unwrap();
            log.append(&SessionRecord::Message {
                message: Message::user(*p),
            })
            .unwrap();
            log.append(&SessionRecord::Event(AgentEvent::TurnCompleted {
                stop_reason: crate::message::StopReason::EndTurn,
                steps: 1,
                usage: Usage {
                    input_tokens: 10,
                    output_tokens: 5,
                    ..Usage::default()
                },
                cost_usd: None,
                context_tokens: 0,
                context_window: 0,
            }))
            .unwrap();
        }
    }

    #[test]
    fn sessions_are_listed_newest_first_with_turns_and_tokens() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "100-aaaaa", "first", &["a"]);
        std::thread::sleep(std::time::Duration::from_millis(5));
        write(dir.path(), "200-bbbbb", "second", &["b", "c"]);
        std::fs::write(dir.path().join("junk.jsonl"), "not a session\n").unwrap();
        let all = list(dir.path());
        assert_eq!(
            all.iter().map(|s| s.id.as_str()).collect::<Vec<_>>(),
            ["200-bbbbb", "100-aaaaa"]
        );
        assert_eq!(
            (
                all[0].turns,
                all[0].usage.input_tokens,
                all[0].usage.output_tokens
            ),
            (2, 20, 10)
        );
        assert_eq!(all[0].title, "second");
    }

    #[test]
    fn resume_by_id_prefix_or_latest_rebuilds_the_history() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "100-aaaaa", "first", &["a"]);
        std::thread::sleep(std::time::Duration::from_millis(5));
        write(dir.path(), "200-bbbbb", "second", &["b", "c"]);
        let r = resume(dir.path(), Some("100"), None).unwrap();
        assert_eq!(r.summary.id, "100-aaaaa");
        assert_eq!(r.history.len(), 1);
        let r = resume(dir.path(), None, None).unwrap();
        assert_eq!(r.summary.id, "200-bbbbb");
        // Two user messages in a row (no answer between) merge, as they did
        // when they were sent.
        assert_eq!(r.history, [Message::user("b\n\nc")]);
        assert!(matches!(
            resume(dir.path(), Some("999"), None),
            Err(SessionError::NotFound(_))
        ));
        let empty = tempfile::tempdir().unwrap();
        assert!(matches!(
            resume(empty.path(), None, None),
            Err(SessionError::None)
        ));
    }

    #[test]
    fn last_is_per_workspace_and_a_shared_prefix_is_ambiguous() {
        let dir = tempfile::tempdir().unwrap();
        write(dir.path(), "100-aaaaa", "first", &["a"]);
        std::thread::sleep(std::time::Duration::from_millis(5));
        write(dir.path(), "100-abbbb", "second", &["b"]);
        let all = list(dir.path());
        let e = choose(&all, Some("100-a"), None).unwrap_err();
        match &e {
            SessionError::Ambiguous { matches, .. } => {
                assert_eq!(matches.len(), 2);
            }
            other => panic!("expected ambiguous, got {other:?}"),
        }
        assert!(e.to_string().contains("100-aaaaa") && e.to_string().contains("ambiguous"));
        assert_eq!(choose(&all, Some("100-ab"), None).unwrap().id, "100-abbbb");
        // An exact id wins over the longer ids it prefixes.
        assert_eq!(
            choose(&all, Some("100-aaaaa"), None).unwrap().id,
            "100-aaaaa"
        );
        assert_eq!(
            choose(&all, None, Some(Path::new("/w"))).unwrap().id,
            "100-abbbb"
        );
        assert!(matches!(
            choose(&all, None, Some(Path::new("/elsewhere"))),
            Err(SessionError::NoneHere(_))
        ));
    }
}
