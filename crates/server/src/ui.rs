//! The web UI: a handful of static files compiled into the binary, so
//! installing `cordon` installs the UI with no build step. They are served
//! without a token because they hold no data: every API call the page makes
//! carries the token the user typed. A strict Content-Security-Policy lets
//! the page run only this origin's own script and style, so text from a
//! model or a program can never become code even if it reached the DOM.

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;

use crate::http::{ApiError, Asset};
use crate::state::Shared;

/// The page's own files: name under `/ui/`, type, body.
const OWN: &[(&str, &str, &[u8])] = &[
    (
        "index.html",
        "text/html; charset=utf-8",
        include_bytes!("../ui/index.html"),
    ),
    (
        "app.js",
        "text/javascript; charset=utf-8",
        include_bytes!("../ui/app.js"),
    ),
    (
        "app.css",
        "text/css; charset=utf-8",
        include_bytes!("../ui/app.css"),
    ),
    (
        "icon.svg",
        "image/svg+xml",
        include_bytes!("../ui/icon.svg"),
    ),
];

/// Only this origin's files; no inline script or style, no plugins, no
/// framing, and forms cannot be submitted natively (the script sends them,
/// so a token typed before the script loaded never lands in a URL).
/// Images may also be `data:` URLs (noVNC draws the remote desktop's mouse
/// cursor as one) and `blob:` URLs (a workspace's image, fetched with the
/// token and shown). An image cannot run script, an SVG one included.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; base-uri 'none'; \
     form-action 'none'; frame-ancestors 'none'";

pub fn routes() -> Router<Arc<Shared>> {
    Router::new()
        .route("/", get(index))
        .route("/ui/{*path}", get(asset))
}

async fn index(headers: HeaderMap) -> Response {
    serve(0, &headers)
}

async fn asset(Path(path): Path<String>, headers: HeaderMap) -> Response {
    match served().iter().position(|a| a.path == path) {
        Some(i) => serve(i, &headers),
        None => ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no UI file {path:?}"),
        )
        .into_response(),
    }
}

mod novnc {
    include!(concat!(env!("OUT_DIR"), "/novnc.rs"));
}

/// Where the Debian package puts noVNC (`CORDON_NOVNC_DIR` overrides it,
/// at build time and at run time alike).
const NOVNC_DIR: &str = "/usr/share/novnc";

/// noVNC's modules, `(path under its root, contents)`: embedded at build
/// time (build.rs), or, for a binary built before the package was
/// installed, read once from the package when the server first needs them.
fn novnc_files() -> &'static [(String, &'static [u8])] {
    static FILES: OnceLock<Vec<(String, &'static [u8])>> = OnceLock::new();
    FILES.get_or_init(|| {
        if !novnc::NOVNC.is_empty() {
            return novnc::NOVNC
                .iter()
                .map(|(rel, body)| (rel.to_string(), *body))
                .collect();
        }
        let root = std::env::var_os("CORDON_NOVNC_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| NOVNC_DIR.into());
        novnc_from_disk(&root)
    })
}

/// The modules of a noVNC installed at `root`; none if it is not there.
fn novnc_from_disk(root: &std::path::Path) -> Vec<(String, &'static [u8])> {
    let mut files = Vec::new();
    if root.join("core/rfb.js").is_file() {
        for sub in ["core", "vendor/pako"] {
            read_modules(root, &root.join(sub), 0, &mut files);
        }
    }
    files.sort_by(|a, b| a.0.cmp(&b.0));
    files
}

/// Every `.js` file under `dir` (a system directory, not the workspace),
/// following the package's links, at most a few levels deep.
fn read_modules(
    root: &std::path::Path,
    dir: &std::path::Path,
    depth: usize,
    out: &mut Vec<(String, &'static [u8])>,
) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        if path.is_dir() && depth < 4 {
            read_modules(root, &path, depth + 1, out);
        } else if path.extension().is_some_and(|x| x == "js")
            && let (Ok(rel), Ok(body)) = (path.strip_prefix(root), std::fs::read(&path))
        {
            // Read once for the life of the process, as embedded ones are.
            out.push((rel.to_string_lossy().into_owned(), body.leak()));
        }
    }
}

/// Whether this server can show the live view: noVNC embedded, or found.
pub fn has_novnc() -> bool {
    !novnc_files().is_empty()
}

/// The page and its files (paths under `/ui/`), made once: they change
/// only with the binary.
fn served() -> &'static [Asset] {
    static SERVED: OnceLock<Vec<Asset>> = OnceLock::new();
    SERVED.get_or_init(|| {
        let own = OWN
            .iter()
            .map(|(name, ty, body)| Asset::new(name.to_string(), ty, body));
        // noVNC's modules, under `/ui/novnc/`, where the page imports them.
        let vnc = novnc_files().iter().map(|(rel, body)| {
            Asset::new(
                format!("novnc/{rel}"),
                "text/javascript; charset=utf-8",
                body,
            )
        });
        own.chain(vnc).collect()
    })
}

fn serve(i: usize, request: &HeaderMap) -> Response {
    let mut r = served()[i].serve(request, CONTENT_SECURITY_POLICY);
    r.headers_mut().insert(
        HeaderName::from_static("cross-origin-opener-policy"),
        HeaderValue::from_static("same-origin"),
    );
    r
}

#[cfg(test)]
mod tests {
    use super::novnc_from_disk;

    #[test]
    fn a_novnc_installed_after_the_build_is_read_at_run_time() {
        let root = tempfile::tempdir().unwrap();
        let r = root.path();
        assert!(novnc_from_disk(r).is_empty(), "nothing there yet");
        std::fs::create_dir_all(r.join("core/util")).unwrap();
        std::fs::create_dir_all(r.join("vendor/pako/lib/zlib")).unwrap();
        std::fs::write(r.join("core/rfb.js"), "export default 1;").unwrap();
        std::fs::write(r.join("core/util/events.js"), "export {};").unwrap();
        std::fs::write(r.join("core/README.md"), "not a module").unwrap();
        std::fs::write(r.join("vendor/pako/lib/zlib/inflate.js"), "x").unwrap();
        let files = novnc_from_disk(r);
        let names: Vec<&str> = files.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(
            names,
            [
                "core/rfb.js",
                "core/util/events.js",
                "vendor/pako/lib/zlib/inflate.js"
            ]
        );
        assert_eq!(files[0].1, b"export default 1;");
    }
}
