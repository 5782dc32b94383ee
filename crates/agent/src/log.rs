//! The session log: an append-only JSON Lines file that is never rewritten.
//!
//! Each line is one [`Record`]: a sequence number, a timestamp and a payload
//! of the caller's type. Appends are a single `write` of a whole line on a
//! file opened with `O_APPEND`, so a crash can at worst leave a partial last
//! line. Loading skips such a line (and any other line that does not parse,
//! a record of a type a newer cordon wrote among them) and reports it;
//! reopening for append first ends a partial line with a newline, so the
//! next record starts on a line of its own, numbered after every line that
//! has a number. Nothing already written is ever changed.
//!
//! An open log holds an exclusive `flock` on its file: one writer at a time
//! numbers the records, so two cordons on one session cannot both write
//! record N. The second is told the session is open elsewhere.

use std::fs::{File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::marker::PhantomData;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};

/// One line of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record<T> {
    /// 0, 1, 2, ... in append order.
    pub seq: u64,
    /// Milliseconds since the Unix epoch when the record was appended.
    pub ts_ms: u64,
    #[serde(flatten)]
    pub data: T,
}

/// Errors from reading or writing a session log.
#[derive(Debug, thiserror::Error)]
pub enum LogError {
    #[error("session log {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("session log {0} already exists")]
    Exists(PathBuf),
    #[error("cannot encode a session record: {0}")]
    Encode(serde_json::Error),
    #[error("the session in {0} is open in another cordon: close it there first")]
    Busy(PathBuf),
}

/// Takes the log's writer lock, or says who has it.
fn lock(file: &File, path: &Path) -> Result<(), LogError> {
    use rustix::fs::{FlockOperation, flock};
    match flock(file, FlockOperation::NonBlockingLockExclusive) {
        Ok(()) => Ok(()),
        Err(rustix::io::Errno::WOULDBLOCK) => Err(LogError::Busy(path.to_path_buf())),
        Err(e) => Err(LogError::Io {
            path: path.to_path_buf(),
            source: e.into(),
        }),
    }
}

/// What loading found besides the records.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoadReport {
    /// The file ended in the middle of a line (a crash mid-append).
    pub partial_tail: bool,
    /// 1-based numbers of complete lines that did not parse and were skipped.
    pub bad_lines: Vec<usize>,
}

/// An open session log, appending records of type `T`.
pub struct SessionLog<T> {
    path: PathBuf,
    file: File,
    next_seq: u64,
    buf: Vec<u8>,
    _t: PhantomData<fn(T)>,
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl<T: Serialize + DeserializeOwned> SessionLog<T> {
    /// Creates a new, empty log; fails if the file exists.
    pub fn create(path: impl Into<PathBuf>) -> Result<Self, LogError> {
        let path = path.into();
        let io_err = |source| LogError::Io {
            path: path.clone(),
            source,
        };
        // A conversation holds the user's prompts, the model's answers and
        // whatever the tools saw: readable by its owner only.
        if let Some(dir) = path.parent() {
            std::fs::DirBuilder::new()
                .recursive(true)
                .mode(0o700)
                .create(dir)
                .map_err(io_err)?;
        }
        let file = OpenOptions::new()
            .append(true)
            .create_new(true)
            .mode(0o600)
            .open(&path)
            .map_err(|e| {
                if e.kind() == io::ErrorKind::AlreadyExists {
                    LogError::Exists(path.clone())
                } else {
                    io_err(e)
                }
            })?;
        lock(&file, &path)?;
        Ok(SessionLog {
            path,
            file,
            next_seq: 0,
            buf: Vec::new(),
            _t: PhantomData,
        })
    }

    /// Opens an existing log for appending, returning the records it holds.
    pub fn open(path: impl Into<PathBuf>) -> Result<(Self, Vec<Record<T>>, LoadReport), LogError> {
        let path = path.into();
        let mut file = OpenOptions::new()
            .append(true)
            .open(&path)
            .map_err(|source| LogError::Io {
                path: path.clone(),
                source,
            })?;
        // Locked before it is read: what is read is all there is until
        // this log is dropped.
        lock(&file, &path)?;
        let (records, report, next_seq) = read::<T>(&path)?;
        if report.partial_tail {
            // Close the torn line so the next record is a line of its own;
            // the fragment stays in the file, skipped on every load.
            file.write_all(b"\n").map_err(|source| LogError::Io {
                path: path.clone(),
                source,
            })?;
        }
        Ok((
            SessionLog {
                path,
                file,
                next_seq,
                buf: Vec::new(),
                _t: PhantomData,
            },
            records,
            report,
        ))
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Sequence number the next record will get.
    pub fn next_seq(&self) -> u64 {
        self.next_seq
    }

    /// Appends one record with a single write; returns its sequence number.
    pub fn append(&mut self, data: &T) -> Result<u64, LogError> {
        let seq = self.next_seq;
        // Through a `Value`, whose keys are sorted: records have always
        // been written so, whatever order a type declares its fields in.
        let data = serde_json::to_value(data).map_err(LogError::Encode)?;
        let record = RecordRef {
            seq,
            ts_ms: now_ms(),
            data: &data,
        };
        self.buf.clear();
        serde_json::to_writer(&mut self.buf, &record).map_err(LogError::Encode)?;
        self.buf.push(b'\n');
        self.file
            .write_all(&self.buf)
            .map_err(|source| LogError::Io {
                path: self.path.clone(),
                source,
            })?;
        self.next_seq += 1;
        Ok(seq)
    }

    /// Flushes appended records to stable storage (at the end of a turn).
    pub fn sync(&self) -> Result<(), LogError> {
        self.file.sync_data().map_err(|source| LogError::Io {
            path: self.path.clone(),
            source,
        })
    }
}

/// Serialises like `Record<T>` without cloning the payload.
#[derive(Serialize)]
struct RecordRef<'a, T> {
    seq: u64,
    ts_ms: u64,
    #[serde(flatten)]
    data: &'a T,
}

/// Reads every record of a log without opening it for writing.
pub fn load<T: DeserializeOwned>(path: &Path) -> Result<(Vec<Record<T>>, LoadReport), LogError> {
    read(path).map(|(records, report, _)| (records, report))
}

/// The number of a line that does not read as a record.
#[derive(Deserialize)]
struct Numbered {
    seq: u64,
}

/// [`load`], and the number after the highest of any line, read or not.
fn read<T: DeserializeOwned>(path: &Path) -> Result<(Vec<Record<T>>, LoadReport, u64), LogError> {
    let io_err = |source| LogError::Io {
        path: path.to_path_buf(),
        source,
    };
    let file = File::open(path).map_err(io_err)?;
    let mut reader = BufReader::new(file);
    let mut records = Vec::new();
    let mut report = LoadReport::default();
    let mut line = Vec::new();
    let mut number = 0;
    let mut next_seq = 0u64;
    let mut first_error = None;
    loop {
        line.clear();
        let n = reader.read_until(b'\n', &mut line).map_err(io_err)?;
        if n == 0 {
            break;
        }
        number += 1;
        if line.last() != Some(&b'\n') {
            report.partial_tail = true;
            break;
        }
        let text = &line[..line.len() - 1];
        if text.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        match serde_json::from_slice::<Record<T>>(text) {
            Ok(r) => {
                next_seq = next_seq.max(r.seq.saturating_add(1));
                records.push(r);
            }
            Err(e) => {
                // Its number was taken all the same (by a newer cordon,
                // say): the next record must not take it again.
                if let Ok(n) = serde_json::from_slice::<Numbered>(text) {
                    next_seq = next_seq.max(n.seq.saturating_add(1));
                }
                first_error.get_or_insert(e);
                report.bad_lines.push(number);
            }
        }
    }
    if let Some(e) = first_error {
        // Once a log, not once a line: an older cordon reading a newer
        // one's log may skip many.
        const SHOWN: usize = 10;
        let lines = &report.bad_lines;
        tracing::warn!(
            path = %path.display(),
            "skipping {} unreadable session record{} (line{} {:?}{}), the first: {e}",
            lines.len(),
            if lines.len() == 1 { "" } else { "s" },
            if lines.len() == 1 { "" } else { "s" },
            &lines[..lines.len().min(SHOWN)],
            if lines.len() > SHOWN { " and more" } else { "" },
        );
    }
    Ok((records, report, next_seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    #[serde(tag = "type", rename_all = "snake_case")]
    enum Ev {
        Started { title: String },
        Text { text: String },
    }

    fn text(s: &str) -> Ev {
        Ev::Text { text: s.into() }
    }

    #[test]
    fn one_writer_at_a_time_numbers_the_records() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let mut first = SessionLog::<Ev>::create(&path).unwrap();
        first.append(&text("a")).unwrap();
        // Another open of the file (another cordon) is told, and writes
        // nothing; reading stays free.
        let busy = SessionLog::<Ev>::open(&path).err().expect("refused");
        assert!(matches!(busy, LogError::Busy(_)), "{busy}");
        assert!(
            busy.to_string().contains("open in another cordon"),
            "{busy}"
        );
        assert_eq!(load::<Ev>(&path).unwrap().0.len(), 1);
        first.append(&text("b")).unwrap();
        drop(first);
        let (mut second, records, _) = SessionLog::<Ev>::open(&path).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(second.append(&text("c")).unwrap(), 2);
    }

    #[test]
    fn records_round_trip_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let mut log = SessionLog::<Ev>::create(&path).unwrap();
        assert_eq!(log.append(&Ev::Started { title: "t".into() }).unwrap(), 0);
        assert_eq!(log.append(&text("héllo\nworld \"quoted\"")).unwrap(), 1);
        drop(log);
        let (log, records, report) = SessionLog::<Ev>::open(&path).unwrap();
        assert_eq!(report, LoadReport::default());
        assert_eq!(records.len(), 2);
        assert_eq!(records[1].data, text("héllo\nworld \"quoted\""));
        assert_eq!(log.next_seq(), 2);
        // One record per line, with the tag flattened beside seq and ts_ms.
        let raw = std::fs::read_to_string(&path).unwrap();
        assert_eq!(raw.lines().count(), 2);
        assert!(
            raw.lines()
                .next()
                .unwrap()
                .starts_with("{\"seq\":0,\"ts_ms\":")
        );
        assert!(raw.contains("\"type\":\"started\""));
    }

    #[test]
    fn create_refuses_an_existing_log() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        SessionLog::<Ev>::create(&path).unwrap();
        assert!(matches!(
            SessionLog::<Ev>::create(&path),
            Err(LogError::Exists(_))
        ));
    }

    #[test]
    fn a_torn_last_line_is_skipped_and_never_glued_to_the_next() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let mut log = SessionLog::<Ev>::create(&path).unwrap();
        log.append(&text("one")).unwrap();
        log.append(&text("two")).unwrap();
        drop(log);
        // A crash mid-append: half of a third record, no newline.
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"{\"seq\":2,\"ts_ms\":1,\"type\":\"te")
            .unwrap();
        drop(f);
        let before = std::fs::read(&path).unwrap();

        let (mut log, records, report) = SessionLog::<Ev>::open(&path).unwrap();
        assert!(report.partial_tail);
        assert_eq!(records.iter().map(|r| r.seq).collect::<Vec<_>>(), [0, 1]);
        assert_eq!(log.append(&text("three")).unwrap(), 2);
        drop(log);

        // Nothing written before was changed; the fragment is still there.
        let after = std::fs::read(&path).unwrap();
        assert_eq!(&after[..before.len()], &before[..]);
        let (records, report) = load::<Ev>(&path).unwrap();
        assert!(!report.partial_tail);
        assert_eq!(report.bad_lines, vec![3]);
        assert_eq!(records.last().unwrap().data, text("three"));
    }

    #[test]
    fn garbage_lines_are_reported_not_fatal() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let mut log = SessionLog::<Ev>::create(&path).unwrap();
        log.append(&text("a")).unwrap();
        drop(log);
        let mut f = OpenOptions::new().append(true).open(&path).unwrap();
        f.write_all(b"not json\n\n{\"seq\":9,\"ts_ms\":1,\"type\":\"unknown\"}\n\xff\xfe\n")
            .unwrap();
        drop(f);
        let (records, report) = load::<Ev>(&path).unwrap();
        assert_eq!(records.len(), 1);
        assert_eq!(report.bad_lines, vec![2, 4, 5]);
        assert!(!report.partial_tail);
    }

    #[test]
    fn ten_thousand_appends_load_back_intact() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.jsonl");
        let mut log = SessionLog::<Ev>::create(&path).unwrap();
        for i in 0..10_000 {
            log.append(&text(&format!("event {i}"))).unwrap();
        }
        log.sync().unwrap();
        let (records, report) = load::<Ev>(&path).unwrap();
        assert_eq!(records.len(), 10_000);
        assert_eq!(records[9_999].seq, 9_999);
        assert_eq!(report, LoadReport::default());
    }
}
