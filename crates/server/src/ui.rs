//! The web UI: a handful of static files compiled into the binary, so
//! installing `cordon` installs the UI with no build step. They are served
//! without a token because they hold no data: every API call the page makes
//! carries the token the user typed. A strict Content-Security-Policy lets
//! the page run only this origin's own script and style, so text from a
//! model or a program can never become code even if it reached the DOM.

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::extract::Path;
use axum::http::{HeaderMap, HeaderName, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use sha2::{Digest, Sha256};

use crate::http::ApiError;
use crate::state::Shared;

struct Asset {
    name: &'static str,
    content_type: &'static str,
    body: &'static [u8],
}

const ASSETS: &[Asset] = &[
    Asset {
        name: "index.html",
        content_type: "text/html; charset=utf-8",
        body: include_bytes!("../ui/index.html"),
    },
    Asset {
        name: "app.js",
        content_type: "text/javascript; charset=utf-8",
        body: include_bytes!("../ui/app.js"),
    },
    Asset {
        name: "app.css",
        content_type: "text/css; charset=utf-8",
        body: include_bytes!("../ui/app.css"),
    },
    Asset {
        name: "icon.svg",
        content_type: "image/svg+xml",
        body: include_bytes!("../ui/icon.svg"),
    },
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

/// A servable file: its path under `/ui/`, type, body and strong
/// validator, computed once (the files change only with the binary).
struct Served {
    path: String,
    content_type: &'static str,
    body: &'static [u8],
    etag: HeaderValue,
}

fn served() -> &'static [Served] {
    static SERVED: OnceLock<Vec<Served>> = OnceLock::new();
    SERVED.get_or_init(|| {
        let own = ASSETS
            .iter()
            .map(|a| (a.name.to_string(), a.content_type, a.body));
        // noVNC's modules, under `/ui/novnc/`, where the page imports them.
        let vnc = novnc_files().iter().map(|(rel, body)| {
            (
                format!("novnc/{rel}"),
                "text/javascript; charset=utf-8",
                *body,
            )
        });
        own.chain(vnc)
            .map(|(path, content_type, body)| {
                let digest = Sha256::digest(body);
                let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
                Served {
                    path,
                    content_type,
                    body,
                    etag: HeaderValue::from_str(&format!("\"{hex}\""))
                        .expect("hex is a valid header"),
                }
            })
            .collect()
    })
}

fn serve(i: usize, request: &HeaderMap) -> Response {
    let a = &served()[i];
    let etag = a.etag.clone();
    // A browser revalidates every load (`no-cache`) so a new binary's UI is
    // picked up at once; an unchanged file costs a 304 and no body.
    let fresh = request
        .get(header::IF_NONE_MATCH)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.split(',').any(|t| t.trim() == etag));
    let mut r = if fresh {
        StatusCode::NOT_MODIFIED.into_response()
    } else {
        (
            [(
                header::CONTENT_TYPE,
                HeaderValue::from_static(a.content_type),
            )],
            a.body,
        )
            .into_response()
    };
    let h = r.headers_mut();
    h.insert(header::ETAG, etag);
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(CONTENT_SECURITY_POLICY),
    );
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("no-referrer"),
    );
    // For browsers that predate `frame-ancestors`.
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
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
