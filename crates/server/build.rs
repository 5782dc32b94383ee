//! Build steps: rebuild on new migrations, embed noVNC for the live view,
//! and embed Swagger UI for /docs.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

fn main() {
    // sqlx::migrate! embeds the migration files, but the compiler only
    // notices edits to files it already saw: rebuild when one is added.
    println!("cargo:rerun-if-changed=migrations");
    embed_novnc();
    embed_swagger_ui();
}

/// The files of swagger-ui-dist that /docs serves (scripts/fetch-ui-assets
/// keeps exactly these, and VERSION last).
const SWAGGER_UI_FILES: [&str; 3] = ["swagger-ui-bundle.js", "swagger-ui.css", "LICENSE"];

/// Generates `$OUT_DIR/swagger_ui.rs`: Swagger UI's bundle, stylesheet and
/// licence as `(name, bytes)` pairs and its version, from
/// `CORDON_SWAGGER_UI_DIR` or cordon's cache (`/var/cache/cordon/swagger-ui`
/// as root, `~/.cache/cordon/swagger-ui` otherwise). `scripts/fetch-ui-assets`
/// puts them there from the npm registry; this runs it first (a no-op when
/// they are there) so `cargo build` alone gets them where npm works, unless
/// `CORDON_SWAGGER_UI_FETCH=0`. Without them the table is empty and /docs
/// says how to get them.
fn embed_swagger_ui() {
    println!("cargo:rerun-if-env-changed=CORDON_SWAGGER_UI_DIR");
    println!("cargo:rerun-if-env-changed=CORDON_SWAGGER_UI_FETCH");
    let dir = std::env::var_os("CORDON_SWAGGER_UI_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(default_swagger_ui_dir);
    let manifest = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").unwrap());
    let script = manifest.join("../../scripts/fetch-ui-assets");
    // A new pin in the script fetches the new version on the next build.
    println!("cargo:rerun-if-changed={}", script.display());
    // Written last by the script; while it is missing, every build looks again.
    let version_file = dir.join("VERSION");
    println!("cargo:rerun-if-changed={}", version_file.display());
    let fetch = std::env::var_os("CORDON_SWAGGER_UI_FETCH").is_none_or(|v| v != "0");
    if fetch && script.is_file() {
        match std::process::Command::new("bash")
            .arg(&script)
            .arg(&dir)
            .output()
        {
            Ok(out) if out.status.success() => {}
            Ok(out) => println!(
                "cargo:warning=scripts/fetch-ui-assets failed: {}",
                String::from_utf8_lossy(&out.stderr)
                    .trim()
                    .replace('\n', " / ")
            ),
            Err(e) => println!("cargo:warning=scripts/fetch-ui-assets did not run: {e}"),
        }
    }
    let version = std::fs::read_to_string(&version_file).unwrap_or_default();
    let version = version.trim();
    let complete = !version.is_empty() && SWAGGER_UI_FILES.iter().all(|f| dir.join(f).is_file());
    let mut out = String::from("/// Swagger UI's files: (name, contents).\n");
    out.push_str("pub const FILES: &[(&str, &[u8])] = &[\n");
    if complete {
        for f in SWAGGER_UI_FILES {
            let abs = dir.join(f);
            println!("cargo:rerun-if-changed={}", abs.display());
            writeln!(
                out,
                "    ({f:?}, include_bytes!({:?})),",
                abs.display().to_string()
            )
            .unwrap();
        }
    } else {
        println!(
            "cargo:warning=Swagger UI not found in {} (run scripts/fetch-ui-assets, or set CORDON_SWAGGER_UI_DIR): /docs will say how to get it",
            dir.display()
        );
    }
    out.push_str("];\n");
    writeln!(
        out,
        "/// Its version (empty without it).\npub const VERSION: &str = {:?};",
        if complete { version } else { "" }
    )
    .unwrap();
    let dest = Path::new(&std::env::var("OUT_DIR").unwrap()).join("swagger_ui.rs");
    std::fs::write(dest, out).unwrap();
}

/// Where scripts/fetch-ui-assets puts Swagger UI when given no directory.
fn default_swagger_ui_dir() -> PathBuf {
    use std::os::unix::fs::MetadataExt as _;
    // /proc/self belongs to the effective user: root builds share the
    // machine's cache, as scripts/test's tools do.
    if std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0) {
        return PathBuf::from("/var/cache/cordon/swagger-ui");
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .unwrap_or_else(|| PathBuf::from("/nonexistent"));
    cache.join("cordon/swagger-ui")
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
