//! The images of `deploy/environments/`, made here for tests by its
//! `build` script (which keeps each in its cache and makes it again only
//! when its recipe changed).

use std::path::{Path, PathBuf};
use std::sync::Mutex;

/// The OCI layout of environment `name`, made first if need be (once per
/// test process); `None` where it cannot be made (not root), which CI
/// never accepts.
pub fn environment(name: &'static str) -> Option<PathBuf> {
    // One build at a time: tests of one binary asking for the same
    // environment wait for the first to make it.
    static MADE: Mutex<Vec<(&'static str, Option<PathBuf>)>> = Mutex::new(Vec::new());
    let mut made = MADE.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((_, dir)) = made.iter().find(|(n, _)| *n == name) {
        return dir.clone();
    }
    let dir = make(name);
    made.push((name, dir.clone()));
    dir
}

fn make(name: &str) -> Option<PathBuf> {
    if !rustix::process::geteuid().is_root() {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "the {name} environment needs root to make; CI=true, so this fails"
        );
        eprintln!("notice: skipping: making the {name} environment needs root");
        return None;
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/environments/build");
    let out = std::process::Command::new(script)
        .arg(name)
        .output()
        .expect("run deploy/environments/build");
    assert!(
        out.status.success(),
        "deploy/environments/build {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let dir = std::env::var("CORDON_ENV_CACHE")
        .unwrap_or_else(|_| "/var/cache/cordon/environments".into());
    Some(Path::new(&dir).join(name))
}
