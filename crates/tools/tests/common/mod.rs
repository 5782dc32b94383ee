//! What the tools' test files share: finding the supervisor binary.

use std::path::{Path, PathBuf};

/// The `cordon-supervisor` binary of `cordon-sandbox`. Cargo does not build
/// another package's binaries for these tests, so it is looked up beside
/// the test executable; `scripts/test` builds every binary first (`cargo
/// build --workspace --all-targets`), and by hand `cargo build -p
/// cordon-sandbox --bins` does. `CORDON_SUPERVISOR` overrides it.
pub fn supervisor() -> PathBuf {
    if let Some(p) = std::env::var_os("CORDON_SUPERVISOR") {
        return p.into();
    }
    // .../target/debug/deps/all-HASH -> .../target/debug/cordon-supervisor
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps");
    let p = dir.join("cordon-supervisor");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p cordon-sandbox --bins` (scripts/test builds it) or set CORDON_SUPERVISOR",
        p.display()
    );
    p
}
