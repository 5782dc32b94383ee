//! `cordon sessions`: the conversations on disk, newest first; and the
//! choice of a session to resume (`--resume`, `--last`).

use std::io::Write;
use std::path::{Path, PathBuf};

use clap::Args;
use cordon_agent::sessions::{self, Resumed, SessionSummary, same_dir};

#[derive(Args, Debug)]
pub struct SessionsArgs {
    /// Every workspace's sessions, not only those of this directory (or --workspace)
    #[arg(long)]
    pub all: bool,
    /// Only the sessions that worked in DIR
    #[arg(long, value_name = "DIR", conflicts_with = "all")]
    pub workspace: Option<PathBuf>,
    /// One JSON object per session, per line
    #[arg(long)]
    pub json: bool,
}

/// What `--resume ID` or `--last` chose: the session, the workspace the
/// conversation continues in (the flag's, else the session's), and what
/// the user must be told about it.
#[derive(Default)]
pub(crate) struct Resume {
    pub resumed: Option<Resumed>,
    pub workspace: Option<PathBuf>,
    pub notice: Option<String>,
}

/// The session `--resume ID` or `--last` names, and what the user must be
/// told about where it continues. `--last` takes the newest session of
/// `workspace` (the flag) or of the current directory.
pub(crate) fn choose_resume(
    id: Option<&str>,
    last: bool,
    workspace: Option<&Path>,
) -> Result<Resume, String> {
    if id.is_none() && !last {
        return Ok(Resume {
            workspace: workspace.map(Path::to_path_buf),
            ..Resume::default()
        });
    }
    let here = match workspace {
        Some(w) => same_dir(w),
        None => std::env::current_dir()
            .map(|d| same_dir(&d))
            .map_err(|e| format!("current directory: {e}"))?,
    };
    let dir = sessions::sessions_dir();
    let listed = sessions::list(&dir);
    let all: Vec<SessionSummary> = listed
        .iter()
        .cloned()
        .map(|mut s| {
            s.workspace = same_dir(Path::new(&s.workspace)).display().to_string();
            s
        })
        .collect();
    let chosen = sessions::choose(&all, id, id.is_none().then_some(here.as_path()))
        .map_err(|e| e.to_string())?;
    let resumed = sessions::open(&chosen.path).map_err(|e| e.to_string())?;
    let theirs = PathBuf::from(&chosen.workspace);
    let notice = match workspace {
        Some(w) if same_dir(w) != theirs => Some(format!(
            "session {} worked in {}; it continues in {}, as --workspace says",
            chosen.id,
            theirs.display(),
            same_dir(w).display()
        )),
        None if theirs != here => Some(format!(
            "session {} worked in {}, not in this directory: it continues there",
            chosen.id,
            theirs.display()
        )),
        _ => None,
    };
    // A resumed conversation continues in the workspace it started in, as
    // recorded: not wherever a link planted since then leads.
    let continues = match workspace {
        Some(w) => w.to_path_buf(),
        None => {
            let recorded = listed
                .iter()
                .find(|s| s.path == chosen.path)
                .map_or(chosen.workspace.as_str(), |s| s.workspace.as_str());
            sessions::recorded_workspace(&chosen.id, recorded)?
        }
    };
    Ok(Resume {
        workspace: Some(continues),
        resumed: Some(resumed),
        notice,
    })
}

fn utc(ms: u64) -> String {
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let secs = ms / 1000;
    let (days, rem) = ((secs / 86_400) as i64, secs % 86_400);
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

pub fn sessions(args: SessionsArgs) -> i32 {
    let dir = sessions::sessions_dir();
    let here = if args.all {
        None
    } else {
        match args
            .workspace
            .clone()
            .map_or_else(std::env::current_dir, Ok)
        {
            Ok(d) => Some(same_dir(&d)),
            Err(e) => return crate::options::config_error(format_args!("current directory: {e}")),
        }
    };
    let all: Vec<SessionSummary> = sessions::list(&dir)
        .into_iter()
        .filter(|s| {
            here.as_ref()
                .is_none_or(|h| same_dir(Path::new(&s.workspace)) == *h)
        })
        .collect();
    // A reader that goes away (`| head -1`) ends the listing quietly.
    let mut out = std::io::stdout().lock();
    match print(&mut out, &all, args.json, here.as_deref(), &dir) {
        Ok(()) => 0,
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => 0,
        Err(e) => {
            eprintln!("cordon: {e}");
            1
        }
    }
}

fn print(
    out: &mut impl Write,
    all: &[SessionSummary],
    json: bool,
    here: Option<&Path>,
    dir: &Path,
) -> std::io::Result<()> {
    if json {
        for s in all {
            let line = serde_json::json!({
                "id": s.id,
                "started_ms": s.started_ms,
                "title": s.title,
                "workspace": s.workspace,
                "turns": s.turns,
                "usage": s.usage,
            });
            writeln!(out, "{line}")?;
        }
        return out.flush();
    }
    if all.is_empty() {
        match here {
            Some(h) => writeln!(
                out,
                "no sessions in {} yet (`cordon sessions --all` lists every workspace's; they are kept in {})",
                h.display(),
                dir.display()
            )?,
            None => writeln!(out, "no sessions yet (they are kept in {})", dir.display())?,
        }
        return out.flush();
    }
    writeln!(
        out,
        "{:<17} {:<16} {:>5} {:>9}  {:<28}  title",
        "id", "started (UTC)", "turns", "tokens", "workspace"
    )?;
    for s in all {
        let tokens = s.usage.prompt_tokens() + s.usage.output_tokens;
        // Titles and paths come from the session log, which holds model
        // and user text: no terminal control characters reach the screen.
        writeln!(
            out,
            "{:<17} {:<16} {:>5} {:>9}  {:<28}  {}",
            s.id,
            utc(s.started_ms),
            s.turns,
            tokens,
            cordon_tools::printable(&s.workspace),
            cordon_tools::printable(&s.title)
        )?;
    }
    out.flush()
}

#[cfg(test)]
mod tests {
    #[test]
    fn utc_dates_are_right() {
        assert_eq!(super::utc(0), "1970-01-01 00:00");
        assert_eq!(super::utc(1_795_322_389_000), "2026-11-22 04:39");
        assert_eq!(super::utc(951_782_400_000), "2000-02-29 00:00");
    }
}
