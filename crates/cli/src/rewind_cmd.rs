//! `cordon rewind ID N` and `cordon fork ID [N]`: a session's files and
//! conversation taken back to the end of a turn, or a new session started
//! from there with a copy of its files (see `cordon_agent::checkpoints`).

use std::path::{Path, PathBuf};

use clap::Args;
use cordon_agent::checkpoints;
use cordon_agent::sessions::{self, SessionSummary};

#[derive(Args, Debug)]
pub struct RewindArgs {
    /// The session (an id, or a unique start of one; see `cordon sessions --all`)
    pub id: String,
    /// The turn whose end to go back to: 0 is before the first prompt.
    /// Turns are the conversation's as it is now, after any rewind
    #[arg(required_unless_present = "undo")]
    pub turn: Option<u64>,
    /// Take back the last rewind: the files and the conversation as they
    /// were just before it (again: redo)
    #[arg(long, conflicts_with = "turn")]
    pub undo: bool,
    /// Restore into DIR instead of the directory the session worked in
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub struct ForkArgs {
    /// The session to fork (an id, or a unique start of one)
    pub id: String,
    /// The turn whose end the new session starts from (default: the last)
    pub turn: Option<u64>,
    /// The new session's workspace: an empty or new directory (default: a
    /// new one beside cordon's sessions)
    #[arg(long, value_name = "DIR")]
    pub workspace: Option<PathBuf>,
}

/// What a session's checkpoints keep, as the user's settings say (the
/// same the session's turns kept them by, unless they changed since).
fn retention() -> Result<checkpoints::Retention, i32> {
    crate::options::load_settings(Vec::new()).map(|s| s.resolved().checkpoints)
}

fn find(id: &str) -> Result<SessionSummary, String> {
    let all = sessions::list(&sessions::sessions_dir());
    sessions::choose(&all, Some(id), None).map_err(|e| e.to_string())
}

/// What cordon prints of a path from the workspace: no control characters.
fn shown(p: &Path) -> String {
    cordon_tools::printable(&p.display().to_string())
}

pub fn rewind(args: RewindArgs) -> i32 {
    let retention = match retention() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let run = || -> Result<(), String> {
        let s = find(&args.id)?;
        let workspace = match &args.workspace {
            Some(w) => w.clone(),
            None => sessions::recorded_workspace(&s.id, &s.workspace)?,
        };
        let r = match args.turn {
            Some(turn) => checkpoints::rewind(&s.path, &workspace, turn, retention),
            None => checkpoints::undo(&s.path, &workspace, retention),
        }
        .map_err(|e| e.to_string())?;
        println!(
            "session {}: back at the end of turn {} in {}: {} file{} written, {} removed",
            s.id,
            r.to_turn,
            shown(&workspace),
            r.written,
            if r.written == 1 { "" } else { "s" },
            r.removed
        );
        for k in &r.kept {
            println!("  left as it is: {}: {}", k.path, k.why);
        }
        println!(
            "the files as they were are kept as checkpoint {}: `cordon rewind {} --undo` puts them and the conversation back; continue with `cordon chat --resume {}`",
            &r.before[..r.before.len().min(12)],
            s.id,
            s.id
        );
        Ok(())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cordon rewind: {e}");
            1
        }
    }
}

pub fn fork(args: ForkArgs) -> i32 {
    let retention = match retention() {
        Ok(r) => r,
        Err(code) => return code,
    };
    let run = || -> Result<(), String> {
        let s = find(&args.id)?;
        let new_id = sessions::new_id();
        let dir = sessions::sessions_dir();
        let workspace = args
            .workspace
            .clone()
            .unwrap_or_else(|| dir.parent().unwrap_or(&dir).join("forks").join(&new_id));
        let f = checkpoints::fork(
            &s.path,
            args.turn,
            &new_id,
            &dir.join(format!("{new_id}.jsonl")),
            &workspace,
            retention,
        )
        .map_err(|e| e.to_string())?;
        println!(
            "session {} forked at the end of turn {}: new session {} in {} ({} file{}); continue with `cordon chat --resume {}`",
            s.id,
            f.turn,
            f.session,
            shown(&f.workspace),
            f.files,
            if f.files == 1 { "" } else { "s" },
            f.session
        );
        Ok(())
    };
    match run() {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("cordon fork: {e}");
            1
        }
    }
}
