//! What the attack tests share: a sandbox that swaps two names as fast as
//! it can, and a look into every object of a repository.

#![allow(dead_code)] // each test file uses a part

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

/// Exchanges `a` and `b` atomically in a loop (`renameat2(RENAME_EXCHANGE)`),
/// so each name is always there, one thing one moment and the other the
/// next, until [`Swapper::stop`].
pub struct Swapper {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Swapper {
    /// Starts swapping and returns once the first exchange is done.
    pub fn start(a: PathBuf, b: PathBuf) -> Swapper {
        let stop = Arc::new(AtomicBool::new(false));
        let swaps = Arc::new(AtomicUsize::new(0));
        let thread = {
            let (stop, swaps) = (stop.clone(), swaps.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let _ = rustix::fs::renameat_with(
                        rustix::fs::CWD,
                        &a,
                        rustix::fs::CWD,
                        &b,
                        rustix::fs::RenameFlags::EXCHANGE,
                    );
                    swaps.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        while swaps.load(Ordering::Relaxed) == 0 {
            std::thread::yield_now();
        }
        Swapper { stop, thread }
    }

    pub fn stop(self) {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.join().unwrap();
    }
}

/// Whether any object of the repository at `git_dir` holds `needle`.
pub fn objects_hold(git_dir: &Path, needle: &str) -> bool {
    let out = std::process::Command::new("git")
        .arg("--git-dir")
        .arg(git_dir)
        .args(["cat-file", "--batch-all-objects", "--batch"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).contains(needle)
}
