//! Sessions on disk: one append-only log per conversation in
//! `$XDG_DATA_HOME/cordon/sessions/<id>.jsonl`, listed and resumed from
//! their records.
//!
//! Records are JSON objects with a `type`. The ones read back here:
//! `session_started` (id, model, provider, workspace, title), `message`
//! (one [`Message`] appended to the history sent to the model),
//! `compaction` (the first `replaced` messages replaced by a `summary`
//! message) and `turn_completed` (its `usage`). Everything else (tool
//! calls, errors) is kept for audit. Nothing is ever rewritten: a
//! compaction adds a record, and the full conversation stays on disk.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::log::{LogError, Record, SessionLog, load};
use crate::message::Usage;
use crate::wire::Message;

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
    pub fn record(&self) -> Value {
        serde_json::to_value(Started::SessionStarted(self.clone()))
            .expect("a record of strings serializes")
    }

    /// The start `record` says, if it is one.
    pub fn from_record(record: &Value) -> Option<SessionStarted> {
        match Started::deserialize(record) {
            Ok(Started::SessionStarted(s)) => Some(s),
            Err(_) => None,
        }
    }
}

/// The record's `type` names it; serde checks a tag only on an enum.
#[derive(Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
enum Started {
    SessionStarted(SessionStarted),
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
    pub log: SessionLog<Value>,
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
pub fn summarize(path: &Path, records: &[crate::log::Record<Value>]) -> Option<SessionSummary> {
    let first = records.first()?;
    let started = SessionStarted::from_record(&first.data)?;
    let mut s = SessionSummary {
        id: started.session_id,
        path: path.to_path_buf(),
        started_ms: first.ts_ms,
        title: started.title,
        workspace: started.workspace,
        image: started.image,
        turns: 0,
        usage: Usage::default(),
    };
    let mut rewound = false;
    for r in records {
        match r.data["type"].as_str() {
            Some("user_message") => s.turns += 1,
            Some("rewind") => rewound = true,
            Some("turn_completed") => {
                if let Ok(u) = serde_json::from_value::<Usage>(r.data["usage"].clone()) {
                    s.usage += u;
                }
            }
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
        .filter_map(|p| match load::<Value>(&p) {
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
    let (log, records, report) = SessionLog::<Value>::open(path)?;
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
pub fn replay(records: &[Record<Value>]) -> Vec<Message> {
    timeline(records).history
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
pub fn timeline(records: &[Record<Value>]) -> Timeline {
    let mut t = Timeline::default();
    if let Some(from) = records
        .first()
        .and_then(|r| SessionStarted::from_record(&r.data))
        .and_then(|s| s.forked_from)
    {
        t.turns = from.turn;
    }
    for (i, r) in records.iter().enumerate() {
        let r = &r.data;
        match r["type"].as_str() {
            Some("message") => match serde_json::from_value::<Message>(r["message"].clone()) {
                Ok(m) => crate::context::push_message(&mut t.history, m),
                Err(e) => tracing::warn!("skipping an unreadable message record: {e}"),
            },
            Some("compaction") => {
                let replaced = r["replaced"].as_u64().map(|n| n as usize);
                match (
                    replaced,
                    serde_json::from_value::<Message>(r["summary"].clone()),
                ) {
                    (Some(n), Ok(summary)) => {
                        crate::context::apply_compaction(&mut t.history, n, summary)
                    }
                    _ => tracing::warn!("skipping an unreadable compaction record"),
                }
            }
            Some("user_message") => t.turns += 1,
            Some("checkpoint") => {
                if let Some(id) = r["id"].as_str() {
                    t.checkpoints.push(TurnCheckpoint {
                        turn: t.turns,
                        seq: records[i].seq,
                        id: id.to_string(),
                    });
                }
            }
            Some("rewind") => match r["to_seq"].as_u64() {
                // Only backwards: a record naming itself or later is not
                // one cordon wrote.
                Some(to) if to < records[i].seq => {
                    let upto = records[..i].partition_point(|p| p.seq <= to);
                    t = timeline(&records[..upto]);
                }
                _ => tracing::warn!("skipping an unreadable rewind record"),
            },
            _ => {}
        }
    }
    t
}

/// The record that adds `message` to a session's history.
pub fn message_record(message: &Message) -> Value {
    json!({ "type": "message", "message": message })
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
        let record = s.record();
        assert_eq!(record["type"], "session_started");
        assert_eq!(record["display"], "1280x800");
        assert_eq!(record["network"], "allow");
        assert_eq!(SessionStarted::from_record(&record), Some(s));
        // A local session's record has no server fields at all.
        let local = SessionStarted::new("s2", "m", "p", Path::new("/w"), "", true).record();
        assert!(local.get("network").is_none() && local.get("display").is_none());
        // Another record, a bad screen, a bad mode: not a start.
        for bad in [
            json!({"type": "message", "session_id": "s1"}),
            json!({"type": "session_started"}),
            json!({"type": "session_started", "session_id": "s", "display": "huge"}),
            json!({"type": "session_started", "session_id": "s", "network": "host"}),
        ] {
            assert!(SessionStarted::from_record(&bad).is_none(), "{bad}");
        }
    }

    fn write(dir: &Path, id: &str, title: &str, prompts: &[&str]) {
        let mut log = SessionLog::<Value>::create(dir.join(format!("{id}.jsonl"))).unwrap();
        log.append(
            &json!({"type":"session_started","session_id":id,"title":title,"workspace":"/w"}),
        )
        .unwrap();
        for p in prompts {
            log.append(&json!({"type":"user_message","text":p}))
                .unwrap();
            log.append(&message_record(&Message::user(*p))).unwrap();
            log.append(&json!({"type":"turn_completed","usage":{"input_tokens":10,"output_tokens":5,"cache_read_tokens":0,"cache_write_tokens":0}}))
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
