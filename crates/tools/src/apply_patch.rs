//! `apply_patch`: several files added, changed, moved and deleted in one
//! call, all or nothing.
//!
//! Two formats are taken: a unified diff as `git diff` writes it (new,
//! deleted, renamed and copied files included; parsed by `diffy`), and
//! Codex's patch format (`*** Begin Patch` … `*** End Patch`). Hunk
//! headers are recounted first (`git apply --recount`), so a model's
//! wrong line counts do not refuse a patch, and a hunk is looked for near
//! its stated line and then anywhere, as GNU patch does.
//!
//! The rules: every path is a workspace path, opened beneath the
//! workspace (no link out of it followed, the control files refused) by
//! the same [`Workspace`] the other file tools use; the whole patch is
//! applied in memory first, and nothing is written unless every file
//! applies; a write that fails then puts back what was written before it.

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::{Value, json};

use crate::read_file::read_capped;
use crate::workspace::{Workspace, WorkspaceError, WsPath};
use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool, args};

pub struct ApplyPatch;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    patch: String,
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "patch": {"type": "string", "description": "The patch: a unified diff as `git diff` writes it (`diff --git a/x b/x`, `--- a/x`, `+++ b/x`, `@@` hunks; `/dev/null` for new and deleted files; `rename from`/`rename to`), or Codex's format (`*** Begin Patch`, `*** Add File: x`, `*** Update File: x` with `*** Move to: y`, `*** Delete File: x`, `*** End Patch`). Paths are relative to /workspace."}
        },
        "required": ["patch"],
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Apply a patch that adds, changes, moves and deletes files in the workspace, all in one call: for a change that spans several files or several places in one. Takes a unified diff as `git diff` writes it, or Codex's `*** Begin Patch` format. Hunks need enough unchanged context lines (three, as git writes) to be found; line numbers and counts may be approximate. All or nothing: if any file or hunk does not apply, nothing is changed and the error names the file and the hunk; read the file again and redo that part. Returns the files changed, each with what happened to it.";

/// The files a patch names, for its one-line summary: `a.rs, b.rs and 3 more`.
fn patched_files(patch: &str) -> String {
    const SHOWN: usize = 3;
    let mut files: Vec<&str> = Vec::new();
    let lines: Vec<&str> = patch.lines().collect();
    for (i, l) in lines.iter().enumerate() {
        let named = if let Some(p) = l.strip_prefix("+++ ") {
            (p.trim() != "/dev/null").then(|| p.trim().trim_start_matches("b/"))
        } else if let Some(p) = l.strip_prefix("--- ") {
            // A deleted file is named only here.
            lines
                .get(i + 1)
                .is_some_and(|n| n.trim() == "+++ /dev/null")
                .then(|| p.trim().trim_start_matches("a/"))
        } else {
            ["*** Add File: ", "*** Update File: ", "*** Delete File: "]
                .iter()
                .find_map(|k| l.strip_prefix(k))
                .map(str::trim)
        };
        if let Some(p) = named
            && !files.contains(&p)
        {
            files.push(p);
        }
    }
    match files.len() {
        0 => "(no files)".into(),
        n if n <= SHOWN => files.join(", "),
        n => format!("{} and {} more", files[..SHOWN].join(", "), n - SHOWN),
    }
}

impl TypedTool for ApplyPatch {
    const NAME: &'static str = "apply_patch";
    const READ_ONLY: bool = false;
    type Input = Input;
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn label(&self, input: &Input) -> String {
        patched_files(&input.patch)
    }
    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Input) -> ToolFuture<'a> {
        args::blocking(Self::NAME, ctx, input, |ctx, input| {
            match apply(ctx, &input.patch) {
                Ok(done) => done.output(),
                Err(e) => ToolOutput::error(format!("{e}. Nothing was changed.")),
            }
        })
    }
}

/// One file's change, parsed.
enum Change<'a> {
    Add {
        path: WsPath,
        text: String,
    },
    Delete {
        path: WsPath,
    },
    Update {
        path: WsPath,
        to: Option<WsPath>,
        edit: Edit<'a>,
    },
    Copy {
        from: WsPath,
        to: WsPath,
        edit: Edit<'a>,
    },
}

/// How an existing file's text changes.
enum Edit<'a> {
    None,
    Unified(diffy::Patch<'a, str>),
    Codex(Vec<Chunk>),
}

/// A Codex update chunk: a line to find first, then lines replaced.
struct Chunk {
    anchor: Option<String>,
    old: Vec<String>,
    new: Vec<String>,
    at_end: bool,
}

/// What was done, file by file, for the model.
struct Done {
    lines: Vec<String>,
    files: Vec<Value>,
}

impl Done {
    /// One file's line of the summary, and its entry in the structured result.
    fn add(&mut self, line: String, file: Value) {
        self.lines.push(format!("  {line}"));
        self.files.push(file);
    }

    fn output(self) -> ToolOutput {
        ToolOutput::ok(format!(
            "Applied the patch to {}:\n{}",
            crate::output::plural(self.files.len() as u64, "file"),
            self.lines.join("\n")
        ))
        .with_structured(json!({"files": self.files}))
    }
}

fn apply(ctx: &ToolContext, patch: &str) -> Result<Done, String> {
    if patch.trim().is_empty() {
        return Err("the patch is empty".into());
    }
    let recounted;
    let changes = if patch.trim_start().starts_with("*** Begin Patch") {
        parse_codex(patch)?
    } else {
        recounted = recount(patch);
        parse_unified(&recounted)?
    };
    if changes.is_empty() {
        return Err(
            "the patch changes no file: give `--- a/PATH` and `+++ b/PATH` lines before each file's hunks, or use the `*** Begin Patch` format"
                .into(),
        );
    }
    let ws = ctx.open_workspace().map_err(|e| e.to_string())?;
    let max = ctx.limits.max_file_bytes;
    // The files as the patch leaves them: `None` for a deleted one.
    let mut files = Files::new(&ws, max);
    let mut done = Done {
        lines: Vec::new(),
        files: Vec::new(),
    };
    for change in changes {
        match change {
            Change::Add { path, text } => {
                if files.text(&path)?.is_some() {
                    return Err(format!(
                        "{}: the patch adds it, but it exists; change it with an update (`--- a/PATH`) instead",
                        path.display()
                    ));
                }
                done.add(
                    format!("added {} ({})", path.display(), lines(&text)),
                    json!({"path": path.display(), "action": "added"}),
                );
                files.set(&path, Some(text));
            }
            Change::Delete { path } => {
                if files.text(&path)?.is_none() {
                    return Err(format!(
                        "{}: the patch deletes it, but there is no such file",
                        path.display()
                    ));
                }
                done.add(
                    format!("deleted {}", path.display()),
                    json!({"path": path.display(), "action": "deleted"}),
                );
                files.set(&path, None);
            }
            Change::Update { path, to, edit } => {
                let Some(old) = files.text(&path)? else {
                    return Err(format!(
                        "{}: the patch changes it, but there is no such file",
                        path.display()
                    ));
                };
                let new = edited(&path, &old, &edit)?;
                let (added, removed) = counts(&old, &new);
                match to.filter(|to| to.rel != path.rel) {
                    Some(to) => {
                        if files.text(&to)?.is_some() {
                            return Err(format!(
                                "{}: the patch moves {} there, but it exists",
                                to.display(),
                                path.display()
                            ));
                        }
                        done.add(
                            format!(
                                "moved {} to {} (+{added} -{removed})",
                                path.display(),
                                to.display()
                            ),
                            json!({"path": to.display(), "from": path.display(), "action": "moved"}),
                        );
                        files.set(&path, None);
                        files.set(&to, Some(new));
                    }
                    None => {
                        done.add(
                            format!("updated {} (+{added} -{removed})", path.display()),
                            json!({"path": path.display(), "action": "updated"}),
                        );
                        files.set(&path, Some(new));
                    }
                }
            }
            Change::Copy { from, to, edit } => {
                let Some(old) = files.text(&from)? else {
                    return Err(format!(
                        "{}: the patch copies it, but there is no such file",
                        from.display()
                    ));
                };
                if files.text(&to)?.is_some() {
                    return Err(format!(
                        "{}: the patch copies {} there, but it exists",
                        to.display(),
                        from.display()
                    ));
                }
                let new = edited(&to, &old, &edit)?;
                done.add(
                    format!("copied {} to {}", from.display(), to.display()),
                    json!({"path": to.display(), "from": from.display(), "action": "copied"}),
                );
                files.set(&to, Some(new));
            }
        }
    }
    files.write()?;
    Ok(done)
}

/// The workspace's files as read, and as the patch leaves them.
struct Files<'a> {
    ws: &'a Workspace,
    max: u64,
    /// Keyed by the workspace-relative path.
    seen: BTreeMap<std::path::PathBuf, Seen>,
}

/// One file the patch touches; `None`: no such file.
struct Seen {
    path: WsPath,
    before: Option<Vec<u8>>,
    after: Option<String>,
}

impl<'a> Files<'a> {
    fn new(ws: &'a Workspace, max: u64) -> Files<'a> {
        Files {
            ws,
            max,
            seen: BTreeMap::new(),
        }
    }

    /// The file's text as the patch has left it so far.
    fn text(&mut self, path: &WsPath) -> Result<Option<String>, String> {
        if let Some(seen) = self.seen.get(&path.rel) {
            return Ok(seen.after.clone());
        }
        let before = self.read(path)?;
        let text = match &before {
            None => None,
            Some(bytes) => Some(String::from_utf8(bytes.clone()).map_err(|_| {
                format!(
                    "{}: not a UTF-8 text file; patches change text files only (use bash for this one)",
                    path.display()
                )
            })?),
        };
        self.seen.insert(
            path.rel.clone(),
            Seen {
                path: path.clone(),
                before,
                after: text.clone(),
            },
        );
        Ok(text)
    }

    /// The file's bytes; `None` when there is no such file.
    fn read(&self, path: &WsPath) -> Result<Option<Vec<u8>>, String> {
        match self.ws.open_read(path) {
            Ok((file, size)) => read_capped(path, file, size, self.max).map(Some),
            Err(WorkspaceError::NotFound { .. }) => Ok(None),
            Err(e) => Err(e.to_string()),
        }
    }

    fn set(&mut self, path: &WsPath, text: Option<String>) {
        if let Some(seen) = self.seen.get_mut(&path.rel) {
            seen.after = text;
        }
    }

    /// Writes every changed file, then removes the deleted ones; a failure
    /// puts back what was done before it.
    fn write(self) -> Result<(), String> {
        let mut undo: Vec<(&WsPath, &Option<Vec<u8>>)> = Vec::new();
        let writes = self
            .seen
            .values()
            .filter(|s| s.after.as_ref().map(|a| a.as_bytes()) != s.before.as_deref());
        // Writes first, removals last: a failed write leaves no file gone.
        let (puts, removes): (Vec<&Seen>, Vec<&Seen>) = writes.partition(|s| s.after.is_some());
        for Seen {
            path,
            before,
            after,
        } in puts.into_iter().chain(removes)
        {
            let result = match after {
                Some(text) => self.ws.write(path, text.as_bytes()).map(|_| ()),
                None => self.ws.remove_file(path),
            };
            if let Err(e) = result {
                let mut failed = Vec::new();
                for (path, before) in undo.into_iter().rev() {
                    let back = match before {
                        Some(bytes) => self.ws.write(path, bytes).map(|_| ()),
                        None => self.ws.remove_file(path),
                    };
                    if back.is_err() {
                        failed.push(path.display());
                    }
                }
                return Err(if failed.is_empty() {
                    format!("{e}; the files written before it were put back")
                } else {
                    format!(
                        "{e}; these could not be put back and are as the patch left them: {}",
                        failed.join(", ")
                    )
                });
            }
            undo.push((path, before));
        }
        Ok(())
    }
}

/// `old` with `edit` applied; an error names the file and the hunk.
fn edited(path: &WsPath, old: &str, edit: &Edit<'_>) -> Result<String, String> {
    match edit {
        Edit::None => Ok(old.to_string()),
        Edit::Unified(patch) => {
            diffy::apply(old, patch).map_err(|e| {
                let n = e.to_string();
                let n: usize = n
                    .rsplit('#')
                    .next()
                    .and_then(|d| d.trim().parse().ok())
                    .unwrap_or(1);
                let hunk = patch.hunks().get(n - 1);
                let first = hunk
                    .and_then(|h| {
                        h.lines().iter().find_map(|l| match l {
                            diffy::Line::Context(t) | diffy::Line::Delete(t) => Some(*t),
                            diffy::Line::Insert(_) => None,
                        })
                    })
                    .unwrap_or("")
                    .trim_end();
                format!(
                    "{}: hunk {n} of {} does not apply: its context and removed lines (starting `{}`) are not in the file as it is now; read the file and redo that hunk",
                    path.display(),
                    patch.hunks().len(),
                    crate::output::printable(first)
                )
            })
        }
        Edit::Codex(chunks) => apply_chunks(path, old, chunks),
    }
}

/// Lines added and removed, for the summary.
fn counts(old: &str, new: &str) -> (usize, usize) {
    let patch = diffy::create_patch(old, new);
    patch
        .hunks()
        .iter()
        .flat_map(|h| h.lines())
        .fold((0, 0), |(a, r), l| match l {
            diffy::Line::Insert(_) => (a + 1, r),
            diffy::Line::Delete(_) => (a, r + 1),
            diffy::Line::Context(_) => (a, r),
        })
}

fn lines(text: &str) -> String {
    crate::output::plural(text.lines().count() as u64, "line")
}

fn ws_path(raw: &str) -> Result<WsPath, String> {
    let raw = raw.trim();
    if raw.is_empty() {
        return Err("a file in the patch has no path".into());
    }
    WsPath::parse(raw).map_err(|e| e.to_string())
}

// --- unified diffs --------------------------------------------------------

/// The changes of a unified diff (recounted: see [`recount`]).
fn parse_unified(text: &str) -> Result<Vec<Change<'_>>, String> {
    use diffy::patch_set::{FileOperation, ParseOptions, PatchKind, PatchSet};
    let mut changes = Vec::new();
    // git's headers when there are any; a plain `diff -u` otherwise (the
    // git parser takes only files that start with `diff --git`).
    let options = if text.lines().any(|l| l.starts_with("diff --git ")) {
        ParseOptions::gitdiff()
    } else {
        ParseOptions::unidiff()
    };
    for (i, file) in PatchSet::parse(text, options).enumerate() {
        let file = file.map_err(|e| format!("file {} of the patch cannot be read: {e}", i + 1))?;
        let op = file.operation().clone();
        let hunks = match file.into_patch() {
            PatchKind::Text(p) if p.hunks().is_empty() => Edit::None,
            PatchKind::Text(p) => Edit::Unified(p),
            PatchKind::Binary(_) => {
                return Err(format!(
                    "file {} of the patch is a binary patch, which apply_patch does not apply; write that file with bash",
                    i + 1
                ));
            }
        };
        let change = match op {
            FileOperation::Create(p) => {
                let path = ws_path(strip(&p))?;
                let text = edited(&path, "", &hunks)?;
                Change::Add { path, text }
            }
            FileOperation::Delete(p) => Change::Delete {
                path: ws_path(strip(&p))?,
            },
            FileOperation::Modify { original, modified } => {
                let path = ws_path(strip(&original))?;
                let to = ws_path(strip(&modified))?;
                Change::Update {
                    path,
                    to: Some(to),
                    edit: hunks,
                }
            }
            // git writes rename and copy paths without a/ and b/.
            FileOperation::Rename { from, to } => Change::Update {
                path: ws_path(&from)?,
                to: Some(ws_path(&to)?),
                edit: hunks,
            },
            FileOperation::Copy { from, to } => Change::Copy {
                from: ws_path(&from)?,
                to: ws_path(&to)?,
                edit: hunks,
            },
        };
        changes.push(change);
    }
    Ok(changes)
}

/// A diff path without git's `a/` or `b/`.
fn strip(path: &str) -> &str {
    path.strip_prefix("a/")
        .or_else(|| path.strip_prefix("b/"))
        .unwrap_or(path)
}

/// `patch` with every hunk header's counts made to match its lines, as
/// `git apply --recount` does; a header without numbers gets line 1. A
/// blank line inside a hunk is read as an empty context line (editors and
/// models drop its space).
fn recount(patch: &str) -> String {
    let lines: Vec<&str> = patch.lines().collect();
    let mut out = String::with_capacity(patch.len() + 64);
    let mut i = 0;
    while i < lines.len() {
        let line = lines[i];
        if !line.starts_with("@@") {
            out.push_str(line);
            out.push('\n');
            i += 1;
            continue;
        }
        let (old_start, new_start, tail) = header_numbers(line);
        let mut body = Vec::new();
        let (mut old, mut new) = (0usize, 0usize);
        let mut j = i + 1;
        while j < lines.len() {
            let l = lines[j];
            let next_is_plus = lines.get(j + 1).is_some_and(|n| n.starts_with("+++ "));
            if l.starts_with("@@")
                || l.starts_with("diff --git ")
                || (l.starts_with("--- ") && next_is_plus)
            {
                break;
            }
            match l.as_bytes().first() {
                Some(b' ') => {
                    old += 1;
                    new += 1;
                    body.push(l.to_string());
                }
                None => {
                    old += 1;
                    new += 1;
                    body.push(" ".to_string());
                }
                Some(b'-') => {
                    old += 1;
                    body.push(l.to_string());
                }
                Some(b'+') => {
                    new += 1;
                    body.push(l.to_string());
                }
                Some(b'\\') => body.push(l.to_string()),
                _ => break,
            }
            j += 1;
        }
        // Trailing blank lines belong to whatever follows the hunk.
        while body.last().is_some_and(|l| l == " ")
            && lines.get(j - 1).is_some_and(|l| l.is_empty())
        {
            body.pop();
            old -= 1;
            new -= 1;
            j -= 1;
        }
        out.push_str(&format!(
            "@@ -{old_start},{old} +{new_start},{new} @@{tail}\n"
        ));
        for l in body {
            out.push_str(&l);
            out.push('\n');
        }
        i = j;
    }
    out
}

/// The start lines of a hunk header (`@@ -12,3 +12,4 @@ fn x`) and what
/// follows it; 1 where a number is missing.
fn header_numbers(line: &str) -> (usize, usize, String) {
    let rest = line.trim_start_matches('@').trim_start();
    let (ranges, tail) = match rest.find("@@") {
        Some(end) => (&rest[..end], rest[end + 2..].to_string()),
        None => (rest, String::new()),
    };
    let start = |sign: char| {
        ranges
            .split_whitespace()
            .find_map(|r| r.strip_prefix(sign))
            .and_then(|r| r.split(',').next())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(1)
    };
    // A new file's header says -0,0: its start stays 0.
    (start('-'), start('+').max(1), tail)
}

// --- Codex's format ---------------------------------------------------------

fn parse_codex(patch: &str) -> Result<Vec<Change<'static>>, String> {
    let mut lines = patch.lines().map(|l| l.trim_end_matches('\r')).peekable();
    while lines.peek().is_some_and(|l| l.trim().is_empty()) {
        lines.next();
    }
    if lines.next().map(str::trim) != Some("*** Begin Patch") {
        return Err("a patch in Codex's format starts with `*** Begin Patch`".into());
    }
    let mut changes = Vec::new();
    let mut ended = false;
    while let Some(line) = lines.next() {
        let line = line.trim_end();
        if line == "*** End Patch" {
            ended = true;
            break;
        }
        if let Some(p) = line.strip_prefix("*** Add File: ") {
            let path = ws_path(p)?;
            let mut text = String::new();
            while let Some(l) = lines.next_if(|l| !l.starts_with("*** ")) {
                let Some(content) = l.strip_prefix('+') else {
                    return Err(format!(
                        "{}: every line of an added file starts with `+`; this one does not: `{}`",
                        path.display(),
                        crate::output::printable(l)
                    ));
                };
                text.push_str(content);
                text.push('\n');
            }
            changes.push(Change::Add { path, text });
        } else if let Some(p) = line.strip_prefix("*** Delete File: ") {
            changes.push(Change::Delete { path: ws_path(p)? });
        } else if let Some(p) = line.strip_prefix("*** Update File: ") {
            let path = ws_path(p)?;
            let to = match lines.next_if(|l| l.starts_with("*** Move to: ")) {
                Some(l) => Some(ws_path(&l["*** Move to: ".len()..])?),
                None => None,
            };
            let mut chunks: Vec<Chunk> = Vec::new();
            while let Some(l) =
                lines.next_if(|l| !l.starts_with("*** ") || l.trim_end() == "*** End of File")
            {
                if l.trim_end() == "*** End of File" {
                    if let Some(c) = chunks.last_mut() {
                        c.at_end = true;
                    }
                    continue;
                }
                if let Some(anchor) = l.strip_prefix("@@") {
                    let anchor = anchor.trim();
                    chunks.push(Chunk {
                        anchor: (!anchor.is_empty()).then(|| anchor.to_string()),
                        old: Vec::new(),
                        new: Vec::new(),
                        at_end: false,
                    });
                    continue;
                }
                if chunks.is_empty() {
                    chunks.push(Chunk {
                        anchor: None,
                        old: Vec::new(),
                        new: Vec::new(),
                        at_end: false,
                    });
                }
                let c = chunks.last_mut().expect("pushed above");
                match l.as_bytes().first() {
                    Some(b' ') => {
                        c.old.push(l[1..].to_string());
                        c.new.push(l[1..].to_string());
                    }
                    None => {
                        c.old.push(String::new());
                        c.new.push(String::new());
                    }
                    Some(b'-') => c.old.push(l[1..].to_string()),
                    Some(b'+') => c.new.push(l[1..].to_string()),
                    _ => {
                        return Err(format!(
                            "{}: a changed line starts with ` `, `-` or `+`; this one does not: `{}`",
                            path.display(),
                            crate::output::printable(l)
                        ));
                    }
                }
            }
            let edit = if chunks.is_empty() {
                Edit::None
            } else {
                Edit::Codex(chunks)
            };
            changes.push(Change::Update { path, to, edit });
        } else if line.trim().is_empty() {
            continue;
        } else {
            return Err(format!(
                "`{}` is not a line of Codex's patch format: expected `*** Add File: `, `*** Update File: `, `*** Delete File: ` or `*** End Patch`",
                crate::output::printable(line)
            ));
        }
    }
    if !ended {
        return Err("the patch has no `*** End Patch` line: it may have been cut off".into());
    }
    Ok(changes)
}

/// `old` with Codex `chunks` applied in order, each found after the one
/// before: exactly, then ignoring trailing spaces, then ignoring
/// surrounding spaces.
fn apply_chunks(path: &WsPath, old: &str, chunks: &[Chunk]) -> Result<String, String> {
    let mut lines: Vec<String> = old.lines().map(str::to_string).collect();
    let mut cursor = 0;
    for (n, chunk) in chunks.iter().enumerate() {
        if let Some(anchor) = &chunk.anchor {
            match find(&lines, std::slice::from_ref(anchor), cursor, false) {
                Some(at) => cursor = at + 1,
                None => {
                    return Err(format!(
                        "{}: chunk {} of {}: its `@@ {}` line is not in the file; read the file and redo that chunk",
                        path.display(),
                        n + 1,
                        chunks.len(),
                        crate::output::printable(anchor)
                    ));
                }
            }
        }
        if chunk.old.is_empty() {
            // Only additions: at the end, or after the anchor.
            let at = if chunk.anchor.is_some() {
                cursor
            } else {
                lines.len()
            };
            lines.splice(at..at, chunk.new.iter().cloned());
            cursor = at + chunk.new.len();
            continue;
        }
        let Some(at) = find(&lines, &chunk.old, cursor, chunk.at_end) else {
            return Err(format!(
                "{}: chunk {} of {} does not apply: its context and removed lines (starting `{}`) are not in the file as it is now; read the file and redo that chunk",
                path.display(),
                n + 1,
                chunks.len(),
                crate::output::printable(chunk.old[0].trim_end())
            ));
        };
        lines.splice(at..at + chunk.old.len(), chunk.new.iter().cloned());
        cursor = at + chunk.new.len();
    }
    let mut text = lines.join("\n");
    if !lines.is_empty() && (old.ends_with('\n') || old.is_empty()) {
        text.push('\n');
    }
    Ok(text)
}

/// Where `want` starts in `lines` at or after `from` (at the very end
/// when `at_end`), matched ever more loosely.
fn find(lines: &[String], want: &[String], from: usize, at_end: bool) -> Option<usize> {
    if want.len() > lines.len() {
        return None;
    }
    let last = lines.len() - want.len();
    let starts: Vec<usize> = if at_end {
        vec![last]
    } else {
        (from.min(last + 1)..=last).collect()
    };
    fn exact(s: &str) -> &str {
        s
    }
    let loosen: [fn(&str) -> &str; 3] = [exact, str::trim_end, str::trim];
    loosen.iter().find_map(|f| {
        starts.iter().copied().find(|&s| {
            lines[s..s + want.len()]
                .iter()
                .zip(want)
                .all(|(a, b)| f(a) == f(b))
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Tool;

    #[test]
    fn a_patch_is_summed_up_by_its_files() {
        let git = "diff --git a/a.rs b/a.rs\n--- a/a.rs\n+++ b/a.rs\n@@ -1 +1 @@\n-x\n+y\n\
                   --- a/gone.rs\n+++ /dev/null\n@@ -1 +0,0 @@\n-z\n";
        assert_eq!(
            Tool::label(&ApplyPatch, &json!({"patch": git})),
            "a.rs, gone.rs"
        );
        let codex = "*** Begin Patch\n*** Add File: n1\n+a\n*** Update File: n2\n*** Delete File: n3\n*** Delete File: n4\n*** End Patch";
        assert_eq!(
            Tool::label(&ApplyPatch, &json!({"patch": codex})),
            "n1, n2, n3 and 1 more"
        );
    }

    #[test]
    fn recount_fixes_wrong_counts_and_missing_numbers() {
        let fixed = recount("--- a/f\n+++ b/f\n@@ -1,9 +1,9 @@ fn\n a\n-b\n+c\n+d\n\n e\n");
        assert!(fixed.contains("@@ -1,4 +1,5 @@ fn\n"), "{fixed}");
        let bare = recount("--- a/f\n+++ b/f\n@@\n a\n-b\n+c\n");
        assert!(bare.contains("@@ -1,2 +1,2 @@\n"), "{bare}");
    }

    #[test]
    fn codex_chunks_find_their_place_after_the_anchor() {
        let p = WsPath::parse("f.py").unwrap();
        let old = "def a():\n    return 1\n\ndef b():\n    return 1\n";
        let chunks = vec![Chunk {
            anchor: Some("def b():".into()),
            old: vec!["    return 1".into()],
            new: vec!["    return 2".into()],
            at_end: false,
        }];
        assert_eq!(
            apply_chunks(&p, old, &chunks).unwrap(),
            "def a():\n    return 1\n\ndef b():\n    return 2\n"
        );
    }
}
