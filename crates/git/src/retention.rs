//! How much of a session's history its checkpoints keep, and the pruning
//! that holds a store to it.
//!
//! After a record, a store holding more than [`Retention::keep`]
//! checkpoints, or taking more than [`Retention::max_bytes`] on disk,
//! drops its oldest until both hold. The newest is always kept, so a
//! store is bounded by its budget or by one snapshot of the workspace,
//! whichever is larger (and the workspace's own disk budget bounds that).
//!
//! Dropping does not rewrite the chain: the oldest kept checkpoint is
//! made a shallow boundary (git's `shallow` file, which every command
//! honours: history stops there), and a repack keeps only what is still
//! reachable. Commit ids never change, so the ids a session log holds go
//! on naming the same checkpoints; the ids dropped are listed in the
//! store, so that asking for one says it was pruned, and why.

use std::io::Write;
use std::path::Path;

use crate::command::{Git, GitError};

/// The oldest kept checkpoint: git reads no parent beyond it.
const SHALLOW: &str = "shallow";
/// The checkpoints dropped, one a line: `<id> keep <n>` or `<id> size <bytes>`.
const PRUNED: &str = "cordon-pruned";
/// How many checkpoints the chain holds, and its newest: `<id> <n>`.
/// Saves counting them with git at every record.
const COUNT: &str = "cordon-count";

/// What a store keeps: its newest `keep` checkpoints, within `max_bytes`
/// on disk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    keep: usize,
    max_bytes: u64,
}

impl Retention {
    /// A long session's worth of turns: a rewind goes back a few turns,
    /// rarely a hundred.
    pub const DEFAULT_KEEP: usize = 100;
    /// Room for a large source tree's snapshot (blobs are stored
    /// compressed, not delta'd against each other) and many turns of
    /// edits to it, while a server's sessions stay bounded.
    pub const DEFAULT_MAX_BYTES: u64 = 1 << 30;
    /// Below this git's own files and the stat cache would take the
    /// budget, and every record would prune.
    pub const MIN_MAX_BYTES: u64 = 1 << 20;

    /// Keeps the newest `keep` checkpoints (at least 1) within `max_bytes`
    /// (at least [`Retention::MIN_MAX_BYTES`]).
    pub fn new(keep: usize, max_bytes: u64) -> Result<Retention, RetentionError> {
        if keep == 0 {
            return Err(RetentionError::Keep);
        }
        if max_bytes < Retention::MIN_MAX_BYTES {
            return Err(RetentionError::Budget(max_bytes));
        }
        Ok(Retention { keep, max_bytes })
    }

    pub fn keep(&self) -> usize {
        self.keep
    }

    pub fn max_bytes(&self) -> u64 {
        self.max_bytes
    }
}

impl Default for Retention {
    fn default() -> Retention {
        Retention {
            keep: Retention::DEFAULT_KEEP,
            max_bytes: Retention::DEFAULT_MAX_BYTES,
        }
    }
}

/// A retention that cannot be.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum RetentionError {
    #[error("checkpoints must keep at least the newest one")]
    Keep,
    #[error(
        "a checkpoint budget of {0} bytes is too small: at least 1 MiB (git's own files take some)"
    )]
    Budget(u64),
}

/// Why a checkpoint was dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PruneReason {
    /// More than this many newer checkpoints were kept.
    Keep(usize),
    /// Keeping it would have taken the store past this many bytes.
    Size(u64),
}

impl std::fmt::Display for PruneReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PruneReason::Keep(n) => write!(
                f,
                "the session keeps only its newest {n} checkpoint{}, and this one was older",
                if *n == 1 { "" } else { "s" }
            ),
            PruneReason::Size(b) => write!(
                f,
                "the session's checkpoints may take {} on disk, and keeping this one would have gone past that",
                human(*b)
            ),
        }
    }
}

/// `bytes` as people read sizes.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["bytes", "KiB", "MiB", "GiB"];
    let mut unit = 0;
    let mut n = bytes;
    while unit + 1 < UNITS.len() && n >= 1024 && n.is_multiple_of(1024) {
        n /= 1024;
        unit += 1;
    }
    format!("{n} {}", UNITS[unit])
}

/// The bytes of the store that are not pack data: indexes, the stat
/// cache, refs, loose objects, directories. A repack shrinks it a little
/// (fewer objects to index), so counting it whole errs on keeping less.
pub(crate) fn outside_packs(git_dir: &Path) -> std::io::Result<u64> {
    use std::os::unix::fs::MetadataExt;
    let total = cordon_sandbox::allocated(git_dir)?;
    let mut packs = 0;
    if let Ok(dir) = std::fs::read_dir(git_dir.join("objects/pack")) {
        for entry in dir.flatten() {
            if entry.path().extension().is_some_and(|e| e == "pack") {
                packs += entry.metadata().map_or(0, |m| m.blocks() * 512);
            }
        }
    }
    Ok(total.saturating_sub(packs))
}

/// The chain's commits from `tip`, newest first, as git sees them (up to
/// the shallow boundary).
pub(crate) fn commits(git: &Git, tip: &str) -> Result<Vec<String>, GitError> {
    let out = git.run(["rev-list", "--first-parent", tip])?;
    Ok(String::from_utf8_lossy(&out)
        .lines()
        .map(str::to_string)
        .collect())
}

/// The newest checkpoint and how many the chain held then, as [`count`]
/// left them.
pub(crate) fn counted(git_dir: &Path) -> Option<(String, usize)> {
    let text = std::fs::read_to_string(git_dir.join(COUNT)).ok()?;
    let (tip, n) = text.trim().split_once(' ')?;
    Some((tip.to_string(), n.parse().ok()?))
}

/// Notes that the chain ending at `tip` holds `n` checkpoints.
pub(crate) fn count(git_dir: &Path, tip: &str, n: usize) -> std::io::Result<()> {
    let tmp = git_dir.join("cordon-count.tmp");
    std::fs::write(&tmp, format!("{tip} {n}\n"))?;
    std::fs::rename(&tmp, git_dir.join(COUNT))
}

/// For each commit of the chain from `tip` (newest first), the bytes its
/// objects take in the packs together with those of every newer commit:
/// what the store would hold if it were the oldest kept.
pub(crate) fn kept_bytes(git: &Git, tip: &str) -> Result<Vec<(String, u64)>, GitError> {
    // Each commit, then the objects it holds that no newer one does.
    let objects = git.run([
        "rev-list",
        "--objects",
        "--in-commit-order",
        "--no-object-names",
        tip,
    ])?;
    let sizes = git.run_with(
        [
            "cat-file",
            "--batch-check=%(objectname) %(objecttype) %(objectsize:disk)",
        ],
        Some(&objects),
    )?;
    let mut out: Vec<(String, u64)> = Vec::new();
    let mut sum = 0u64;
    for line in String::from_utf8_lossy(&sizes).lines() {
        let bad = || GitError::Unexpected {
            command: "cat-file".into(),
            what: cordon_tools::printable(line),
        };
        let mut parts = line.split(' ');
        let (Some(oid), Some(kind), Some(size)) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad());
        };
        sum += size.parse::<u64>().map_err(|_| bad())?;
        if kind == "commit" {
            out.push((oid.to_string(), sum));
        } else if let Some(last) = out.last_mut() {
            last.1 = sum;
        }
    }
    Ok(out)
}

/// The index (newest first) of the oldest checkpoint to keep: at most
/// `keep` of them, and their objects plus `overhead` within `max_bytes`;
/// never past the newest. `kept` is [`kept_bytes`]'s answer.
pub(crate) fn oldest_kept(kept: &[(String, u64)], r: Retention, overhead: u64) -> usize {
    let mut last = kept.len().saturating_sub(1).min(r.keep - 1);
    while last > 0 && kept[last].1.saturating_add(overhead) > r.max_bytes {
        last -= 1;
    }
    last
}

/// Makes `oldest` the chain's first checkpoint: git reads no parent
/// beyond it from now on.
pub(crate) fn set_boundary(git_dir: &Path, oldest: &str) -> std::io::Result<()> {
    let path = git_dir.join(SHALLOW);
    let tmp = git_dir.join("shallow.cordon-tmp");
    std::fs::write(&tmp, format!("{oldest}\n"))?;
    std::fs::rename(&tmp, &path)
}

/// Notes the checkpoints about to be dropped, and why.
pub(crate) fn note_pruned(
    git_dir: &Path,
    dropped: &[(String, PruneReason)],
) -> std::io::Result<()> {
    let mut text = String::new();
    for (id, why) in dropped {
        match why {
            PruneReason::Keep(n) => text.push_str(&format!("{id} keep {n}\n")),
            PruneReason::Size(b) => text.push_str(&format!("{id} size {b}\n")),
        }
    }
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(git_dir.join(PRUNED))?;
    f.write_all(text.as_bytes())?;
    f.sync_data()
}

/// Why the checkpoint `id` (all of one, or a unique start) was dropped,
/// if it was.
pub(crate) fn pruned(git_dir: &Path, id: &str) -> Option<PruneReason> {
    let text = std::fs::read_to_string(git_dir.join(PRUNED)).ok()?;
    let id = id.to_ascii_lowercase();
    let mut found = text.lines().filter(|l| l.starts_with(&id)).filter_map(|l| {
        let mut parts = l.split(' ');
        let (_, why, n) = (parts.next()?, parts.next()?, parts.next()?);
        match why {
            "keep" => n.parse().ok().map(PruneReason::Keep),
            "size" => n.parse().ok().map(PruneReason::Size),
            _ => None,
        }
    });
    let first = found.next()?;
    // An abbreviation that fits several names none of them.
    found.next().is_none().then_some(first)
}

/// Frees what no kept checkpoint reaches, once the boundary has moved
/// (`dropped`), and gathers the store into one pack. One repack of
/// everything reachable (the boundary honoured) drops the rest: cheaper
/// than `git gc --prune=now`, which also packs refs and prunes, and
/// measured so. Fast-import leaves a small import's objects loose; the
/// repack takes those it reaches, and a prune the others, if any. A bare
/// repository keeps no reflogs, so none hold anything back.
pub(crate) fn free(git: &Git, dropped: bool) -> Result<(), GitError> {
    let loose = has_loose_objects(git.git_dir());
    if !dropped && !loose && packs(git.git_dir()) <= 1 {
        return Ok(());
    }
    git.run(["repack", "-a", "-d", "-q", "--no-write-bitmap-index"])?;
    if has_loose_objects(git.git_dir()) {
        git.run(["prune", "--expire=now"])?;
    }
    Ok(())
}

pub(crate) fn packs(git_dir: &Path) -> usize {
    std::fs::read_dir(git_dir.join("objects/pack")).map_or(0, |d| {
        d.flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "pack"))
            .count()
    })
}

fn has_loose_objects(git_dir: &Path) -> bool {
    let Ok(dir) = std::fs::read_dir(git_dir.join("objects")) else {
        return false;
    };
    dir.flatten().any(|e| {
        let name = e.file_name();
        let name = name.to_string_lossy();
        name.len() == 2
            && name.bytes().all(|b| b.is_ascii_hexdigit())
            && std::fs::read_dir(e.path()).is_ok_and(|mut d| d.next().is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retention_keeps_one_within_a_mebibyte_at_least() {
        assert_eq!(Retention::new(0, 1 << 30), Err(RetentionError::Keep));
        assert_eq!(Retention::new(1, 1000), Err(RetentionError::Budget(1000)));
        let r = Retention::new(1, 1 << 20).unwrap();
        assert_eq!((r.keep(), r.max_bytes()), (1, 1 << 20));
        assert_eq!(Retention::default().keep(), 100);
    }

    fn chain(sizes: &[u64]) -> Vec<(String, u64)> {
        sizes
            .iter()
            .enumerate()
            .map(|(i, s)| (format!("c{i}"), *s))
            .collect()
    }

    #[test]
    fn the_oldest_go_first_and_the_newest_stays() {
        let r = |keep, max| Retention::new(keep, max).unwrap();
        const M: u64 = 1 << 20;
        // Cumulative: each 30 MiB.
        let c = chain(&[30 * M, 60 * M, 90 * M]);
        assert_eq!(oldest_kept(&c, r(100, 40 * M), 0), 0);
        assert_eq!(oldest_kept(&c, r(100, 70 * M), 0), 1);
        assert_eq!(oldest_kept(&c, r(100, 70 * M), 20 * M), 0);
        assert_eq!(oldest_kept(&c, r(2, 1 << 30), 0), 1);
        assert_eq!(oldest_kept(&c, r(100, 1 << 30), 0), 2);
        // One checkpoint over the budget alone is kept.
        assert_eq!(oldest_kept(&chain(&[90 * M]), r(5, 2 * M), 0), 0);
    }

    #[test]
    fn sizes_are_said_as_people_read_them() {
        assert_eq!(human(1 << 30), "1 GiB");
        assert_eq!(human(40 << 20), "40 MiB");
        assert_eq!(human(1500), "1500 bytes");
    }
}
