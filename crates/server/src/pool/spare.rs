//! Workspaces made ahead: one per kind of owner (a job, a sandbox of the
//! sandbox API), of the default disk budget, so that a `POST` that makes
//! one does not wait for a volume's file system and loop device (4–6 ms).
//!
//! Rules (those of a pooled sandbox, [`super`]):
//! - Made fresh under an id of its own kind, in that kind's directory, and
//!   entered by nothing before its owner takes it, under that id.
//! - Wanted only once an owner of the kind has made its own: a server that
//!   never runs a job keeps no job workspace.
//! - Listed in the ledger while it waits; held from the orphan sweep until
//!   its owner is surely recorded ([`super::TAKEN_TTL`]).
//! - Made again once the owner's command is likely done (the pool's
//!   deferral), never while it needs the CPU.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use cordon_sandbox::volume::InUse;

use super::{FIRST_BACKOFF, MAX_BACKOFF, TAKEN_TTL};
pub use crate::owner::Kind;

impl Kind {
    /// A new id of this kind: the server's own, never a client's.
    pub fn new_id(self) -> String {
        format!("{}{}", self.prefix(), crate::store::random_hex(12))
    }

    /// Its owner's directory under `roots` (the workspace is `workspace`
    /// in it).
    pub(super) fn dir(self, roots: &Roots, id: &str) -> PathBuf {
        match self {
            Kind::Job => roots.jobs.job(id),
            Kind::Session => roots.sessions.join(id),
            Kind::Sandbox => roots.sandboxes.join(id),
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}

/// Where each kind's directories are.
pub struct Roots {
    pub jobs: crate::config::JobDirs,
    pub sessions: PathBuf,
    pub sandboxes: PathBuf,
}

/// A workspace made ahead, mounted until taken.
pub(super) struct Spare {
    pub id: String,
    pub in_use: InUse,
}

/// One kind's spare and what is known of making it.
#[derive(Default)]
struct One {
    ready: Option<Spare>,
    wanted: bool,
    making: bool,
    /// When it may be tried again after a failure, and the next wait.
    backoff: Option<(Instant, Duration)>,
    /// Taken in the last [`TAKEN_TTL`], with when.
    taken: Vec<(String, Instant)>,
}

/// Every kind's.
#[derive(Default)]
pub(super) struct Spares([One; Kind::ALL.len()]);

impl Spares {
    fn of(&mut self, kind: Kind) -> &mut One {
        &mut self.0[kind.index()]
    }

    /// Whether `id` is a spare, ready or taken of late.
    pub fn holds(&self, id: &str) -> bool {
        self.0.iter().any(|o| {
            o.ready.as_ref().is_some_and(|s| s.id == id) || o.taken.iter().any(|(t, _)| t == id)
        })
    }

    /// Takes `kind`'s spare if one is ready; either way one is wanted.
    pub fn take(&mut self, kind: Kind, now: Instant) -> Option<Spare> {
        let one = self.of(kind);
        one.wanted = true;
        let spare = one.ready.take()?;
        one.taken.push((spare.id.clone(), now));
        Some(spare)
    }

    /// A kind whose spare should be made now, marked as being made.
    pub fn due(&mut self, now: Instant) -> Option<Kind> {
        let kind = Kind::ALL.into_iter().find(|k| {
            let one = &self.0[k.index()];
            one.wanted
                && one.ready.is_none()
                && !one.making
                && one.backoff.is_none_or(|(until, _)| until <= now)
        })?;
        self.of(kind).making = true;
        Some(kind)
    }

    /// Records what making `kind`'s spare gave.
    pub fn made(&mut self, kind: Kind, made: Result<Spare, String>) {
        let one = self.of(kind);
        one.making = false;
        match made {
            Ok(spare) => {
                one.backoff = None;
                one.ready = Some(spare);
            }
            Err(e) => {
                let wait = one
                    .backoff
                    .map_or(FIRST_BACKOFF, |(_, w)| (w * 2).min(MAX_BACKOFF));
                tracing::warn!(
                    "cannot make a spare {} workspace (trying again in {wait:?}): {e}",
                    kind.name()
                );
                one.backoff = Some((Instant::now() + wait, wait));
            }
        }
    }

    /// Forgets the spares taken long enough ago that their owners are
    /// recorded.
    pub fn expire(&mut self, now: Instant) {
        for one in &mut self.0 {
            one.taken
                .retain(|(_, at)| now.duration_since(*at) <= TAKEN_TTL);
        }
    }

    /// How many are ready.
    pub fn ready(&self) -> usize {
        self.0.iter().filter(|o| o.ready.is_some()).count()
    }

    /// The ready ones, for a shutdown to remove.
    pub fn drain(&mut self) -> Vec<(Kind, Spare)> {
        Kind::ALL
            .into_iter()
            .filter_map(|k| Some((k, self.of(k).ready.take()?)))
            .collect()
    }
}

/// Makes a workspace with room for `disk` for a new owner of `kind`,
/// listed in `ledger` first, so that a killed server's half made one is
/// found (a pooled sandbox's starts so too, [`super::Pool`]).
pub(super) async fn make(
    kind: Kind,
    roots: &Roots,
    ledger: &Path,
    defaults: &crate::config::SandboxDefaults,
    disk: u64,
) -> Result<Spare, String> {
    let id = kind.new_id();
    let listed = ledger.join(&id);
    std::fs::create_dir_all(ledger)
        .and_then(|()| std::fs::File::create_new(&listed))
        .map_err(|e| format!("cannot list it in {}: {e}", ledger.display()))?;
    let dir = kind.dir(roots, &id);
    let (ws, defaults) = (dir.join("workspace"), defaults.clone());
    let made = tokio::task::spawn_blocking(move || defaults.make_workspace(&ws, Some(disk)))
        .await
        .map_err(|e| e.to_string())
        .and_then(|r| r.map_err(|e| format!("cannot make its workspace: {e}")));
    match made {
        Ok(in_use) => Ok(Spare { id, in_use }),
        Err(e) => {
            discard(dir, &listed, "a spare workspace").await;
            Err(e)
        }
    }
}

/// Removes what was made ahead and never taken: its directory (`what`
/// says whose, in a failure's log) and then its ledger entry.
pub(super) async fn discard(dir: PathBuf, listed: &Path, what: &str) {
    crate::files::remove_files(dir, what).await;
    let _ = std::fs::remove_file(listed);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_name_their_kind() {
        for kind in Kind::ALL {
            let id = kind.new_id();
            assert_eq!(Kind::of_id(&id), Some(kind), "{id}");
            assert!(crate::http::plausible_id(&id), "{id}");
        }
        assert_eq!(Kind::of_id("usr_0123456789abcdef01234567"), None);
    }

    #[test]
    fn a_spare_is_wanted_once_taken_for_and_made_once() {
        let mut spares = Spares::default();
        let now = Instant::now();
        assert_eq!(spares.due(now), None, "wanted before any owner");
        assert!(spares.take(Kind::Sandbox, now).is_none());
        assert_eq!(spares.due(now), Some(Kind::Sandbox));
        assert_eq!(spares.due(now), None, "made twice at once");
        spares.made(Kind::Sandbox, Err("no loop device".into()));
        assert_eq!(spares.due(now), None, "tried again at once after a failure");
        assert_eq!(spares.due(now + MAX_BACKOFF), Some(Kind::Sandbox));
    }
}
