//! The sandboxes live in this process, by owner (`job/<id>` or
//! `session/<id>`): what the live view and the Lab reach while a job runs
//! or a session is live. Each one's Lab, once opened, lives in its entry
//! and ends with it: unlisting a sandbox closes its Lab's listener.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cordon_sandbox::Sandbox;

/// A sandbox's Lab, once opened: its own origin, and the way in.
pub type LabSlot = Arc<tokio::sync::OnceCell<Arc<cordon_lab::Site>>>;

#[derive(Clone)]
struct Entry {
    sandbox: Sandbox,
    lab: LabSlot,
}

#[derive(Default)]
pub struct Sandboxes {
    live: Mutex<HashMap<String, Entry>>,
}

/// Keeps a sandbox listed until dropped.
pub struct Listed<'a> {
    sandboxes: &'a Sandboxes,
    key: String,
}

impl Drop for Listed<'_> {
    fn drop(&mut self) {
        self.sandboxes.unlist(&self.key);
    }
}

impl Sandboxes {
    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<String, Entry>> {
        self.live.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Lists `sandbox` under `key` while the returned guard lives.
    pub fn list(&self, key: String, sandbox: &Sandbox) -> Listed<'_> {
        self.insert(key.clone(), sandbox);
        Listed {
            sandboxes: self,
            key,
        }
    }

    /// Lists `sandbox` under `key` until [`Sandboxes::unlist`].
    pub fn insert(&self, key: String, sandbox: &Sandbox) {
        let entry = Entry {
            sandbox: sandbox.clone(),
            lab: LabSlot::default(),
        };
        self.lock().insert(key, entry);
    }

    /// Unlists `key`'s sandbox; its Lab, if open, stops listening.
    pub fn unlist(&self, key: &str) {
        let gone = self.lock().remove(key);
        drop(gone);
    }

    pub fn get(&self, key: &str) -> Option<Sandbox> {
        self.lock().get(key).map(|e| e.sandbox.clone())
    }

    /// `key`'s sandbox if it has a display.
    pub fn desktop(&self, key: &str) -> Option<Sandbox> {
        self.get(key).filter(|s| s.display().is_some())
    }

    /// `key`'s sandbox and the place of its Lab.
    pub fn lab(&self, key: &str) -> Option<(Sandbox, LabSlot)> {
        self.lock()
            .get(key)
            .map(|e| (e.sandbox.clone(), e.lab.clone()))
    }

    /// How long since `key`'s Lab was last asked anything; `None` when it
    /// has none. An open Lab page polls, so a session in use by its Lab
    /// alone is not idle.
    pub fn lab_idle(&self, key: &str) -> Option<Duration> {
        let lab = self.lock().get(key)?.lab.get()?.clone();
        Some(lab.upstream().idle())
    }
}
