//! Build steps: rebuild on new migrations, and embed noVNC for the live view.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    // sqlx::migrate! embeds the migration files, but the compiler only
    // notices edits to files it already saw: rebuild when one is added.
    println!("cargo:rerun-if-changed=migrations");
    embed_novnc();
}

/// Generates `$OUT_DIR/novnc.rs`: noVNC's ES modules (its `core` and the
/// `vendor/pako` it imports) as `(path, bytes)` pairs, taken from
/// `CORDON_NOVNC_DIR` or the Debian `novnc` package, so the binary serves
/// the live view with no files beside it. Without noVNC the table is empty
/// and the UI says how to get it.
fn embed_novnc() {
    println!("cargo:rerun-if-env-changed=CORDON_NOVNC_DIR");
    let root = std::env::var_os("CORDON_NOVNC_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/usr/share/novnc"));
    let mut files = Vec::new();
    if root.join("core/rfb.js").is_file() {
        // Only the directories' listings, not every file: enough to notice
        // an upgrade of the package, which replaces them.
        for sub in ["core", "vendor/pako"] {
            collect(&root, &root.join(sub), &mut files);
        }
        println!("cargo:rerun-if-changed={}", root.join("core").display());
        println!(
            "cargo:rerun-if-changed={}",
            root.join("core/rfb.js").display()
        );
    } else {
        // Looked for again on the next build once the package is there;
        // meanwhile the server reads it at run time (ui.rs).
        println!(
            "cargo:rerun-if-changed={}",
            root.join("core/rfb.js").display()
        );
        println!(
            "cargo:warning=noVNC not found at {} (Debian: apt-get install novnc, or set CORDON_NOVNC_DIR): the server will look for it when it starts",
            root.display()
        );
    }
    files.sort();
    let mut out = String::from("/// noVNC's modules: (path under its root, contents).\n");
    out.push_str("pub const NOVNC: &[(&str, &[u8])] = &[\n");
    for (rel, abs) in &files {
        writeln!(out, "    ({rel:?}, include_bytes!({abs:?})),").unwrap();
    }
    out.push_str("];\n");
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("novnc.rs");
    std::fs::write(dest, out).unwrap();
}

/// Every `.js` file under `dir`, following the package's symlinks.
fn collect(root: &Path, dir: &Path, files: &mut Vec<(String, String)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() {
            collect(root, &path, files);
        } else if path.extension().is_some_and(|x| x == "js") {
            let rel = path
                .strip_prefix(root)
                .unwrap()
                .to_string_lossy()
                .into_owned();
            let abs = path.canonicalize().unwrap_or(path.clone());
            files.push((rel, abs.to_string_lossy().into_owned()));
        }
    }
}
