//! The sandboxes live in this process, by [`Owner`]: what the live view,
//! the Lab and previews reach while a job runs or a session is live. Each
//! one's Lab and previews, once opened, live in its entry and end with it:
//! unlisting a sandbox closes their listeners.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cordon_sandbox::Sandbox;

use crate::owner::Owner;

/// A sandbox's Lab, once opened: its own origin, and the way in.
pub type LabSlot = Arc<tokio::sync::OnceCell<Arc<cordon_lab::Site>>>;

/// A sandbox's previews once opened, by port inside: each its own origin.
pub type Previews = Arc<Mutex<HashMap<u16, Opened>>>;

/// A preview's origin: a port of this server's own, or a host name of its
/// own under the server's sandbox domain.
#[derive(Clone)]
pub enum Opened {
    Port(Arc<cordon_lab::Site>),
    Name(cordon_lab::Gate),
}

impl Opened {
    /// Its checks, and the way to its upstream.
    pub fn gate(&self) -> &cordon_lab::Gate {
        match self {
            Opened::Port(site) => site.gate(),
            Opened::Name(gate) => gate,
        }
    }
}

#[derive(Clone)]
struct Entry {
    sandbox: Sandbox,
    lab: LabSlot,
    previews: Previews,
    /// When its Lab was last opened (or the entry made).
    opened: Arc<Mutex<Instant>>,
    /// Requests opening its Lab now: starting Jupyter may take longer than
    /// a session's idle time.
    opening: Arc<AtomicUsize>,
}

/// A Lab being opened, which keeps its sandbox from counting as idle.
pub struct Opening {
    pub sandbox: Sandbox,
    pub lab: LabSlot,
    opened: Arc<Mutex<Instant>>,
    opening: Arc<AtomicUsize>,
}

impl Drop for Opening {
    fn drop(&mut self) {
        *self.opened.lock().unwrap_or_else(|p| p.into_inner()) = Instant::now();
        self.opening.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
pub struct Sandboxes {
    live: Mutex<HashMap<Owner, Entry>>,
}

/// Keeps a sandbox listed until dropped.
pub struct Listed<'a> {
    sandboxes: &'a Sandboxes,
    owner: Owner,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.sandboxes.unlist(&self.owner);
    }
}

impl Sandboxes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<Owner, Entry>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists `owner`'s `sandbox` while the returned guard lives.
    pub fn list(&self, owner: Owner, sandbox: &Sandbox) -> Listed<'_> {
        self.insert(owner.clone(), sandbox);
        Listed {
            sandboxes: self,
            owner,
        }
    }

    /// Lists `owner`'s `sandbox` until [`Sandboxes::unlist`].
    pub fn insert(&self, owner: Owner, sandbox: &Sandbox) {
        let entry = Entry {
            sandbox: sandbox.clone(),
            lab: LabSlot::default(),
            previews: Previews::default(),
            opened: Arc::new(Mutex::new(Instant::now())),
            opening: Arc::default(),
        };
        self.lock().insert(owner, entry);
    }

    /// `owner`'s sandbox and its previews.
    pub fn previews(&self, owner: &Owner) -> Option<(Sandbox, Previews)> {
        let live = self.lock();
        let e = live.get(owner)?;
        Some((e.sandbox.clone(), e.previews.clone()))
    }

    /// `owner`'s preview of `port`, if it is open.
    pub fn opened(&self, owner: &Owner, port: u16) -> Option<Opened> {
        let previews = self.lock().get(owner)?.previews.clone();
        let open = previews.lock().unwrap_or_else(|p| p.into_inner());
        open.get(&port).cloned()
    }

    /// Unlists `owner`'s sandbox; its Lab and previews, if open, stop
    /// listening.
    pub fn unlist(&self, owner: &Owner) {
        let gone = self.lock().remove(owner);
        drop(gone);
    }

    pub fn get(&self, owner: &Owner) -> Option<Sandbox> {
        self.lock().get(owner).map(|e| e.sandbox.clone())
    }

    /// `owner`'s sandbox if it has a display.
    pub fn desktop(&self, owner: &Owner) -> Option<Sandbox> {
        self.get(owner).filter(|s| s.display().is_some())
    }

    /// `owner`'s sandbox and the place of its Lab, in use until dropped.
    pub fn lab(&self, owner: &Owner) -> Option<Opening> {
        self.lock().get(owner).map(|e| {
            e.opening.fetch_add(1, Ordering::SeqCst);
            Opening {
                sandbox: e.sandbox.clone(),
                lab: e.lab.clone(),
                opened: e.opened.clone(),
                opening: e.opening.clone(),
            }
        })
    }

    /// How long since `owner`'s Lab was last opened or asked anything. An
    /// open Lab page polls, so a session in use by its Lab alone is not
    /// idle.
    pub fn lab_idle(&self, owner: &Owner) -> Option<Duration> {
        let live = self.lock();
        let e = live.get(owner)?;
        if e.opening.load(Ordering::SeqCst) > 0 {
            return Some(Duration::ZERO);
        }
        let opened = e.opened.lock().unwrap_or_else(|p| p.into_inner()).elapsed();
        let asked = e.lab.get().map_or(Duration::MAX, |l| l.upstream().idle());
        Some(opened.min(asked))
    }
}
