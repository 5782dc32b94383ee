//! `/docs`: Swagger UI over `/openapi.json`, to read the API and try it
//! against this server. Swagger UI's files come from npm when cordon is
//! built (`scripts/fetch-ui-assets`, embedded by build.rs); a build without
//! them serves a page that says how to get them. Like the web UI's, these
//! files hold no data and need no token: the token given to "Authorize"
//! (or the web UI's, which it starts with) stays in the page and goes only
//! to this origin, as a bearer header.

use std::sync::{Arc, OnceLock};

use axum::Router;
use axum::http::HeaderMap;
use axum::routing::get;

use crate::http::Asset;
use crate::state::Shared;

mod swagger_ui {
    include!(concat!(env!("OUT_DIR"), "/swagger_ui.rs"));
}

/// Only this origin's scripts and styles, no `eval`, nothing inline:
/// Swagger UI's bundle and stylesheet and our `docs-init.js` and
/// `docs.css` (its components style through the DOM, which the policy
/// allows). Its stylesheet draws icons from `data:` images, and it shows
/// an image answer from a `blob:` URL (an image cannot run script).
/// Requests ("Try it out") go to this origin only, so neither a crafted
/// document nor a link can send the token elsewhere.
pub const CONTENT_SECURITY_POLICY: &str = "default-src 'none'; script-src 'self'; \
     style-src 'self'; img-src 'self' data: blob:; connect-src 'self'; \
     base-uri 'none'; form-action 'none'; frame-ancestors 'none'";

/// Whether this build embeds Swagger UI (else /docs says how to get it).
pub fn has_swagger_ui() -> bool {
    !swagger_ui::FILES.is_empty()
}

/// The embedded Swagger UI's version, if any.
pub fn swagger_ui_version() -> Option<&'static str> {
    has_swagger_ui().then_some(swagger_ui::VERSION)
}

const JS: &str = "text/javascript; charset=utf-8";
const CSS: &str = "text/css; charset=utf-8";
const HTML: &str = "text/html; charset=utf-8";

/// Every file under /docs, computed once (they change only with the binary).
fn served() -> &'static [Asset] {
    static SERVED: OnceLock<Vec<Asset>> = OnceLock::new();
    SERVED.get_or_init(|| {
        let page: &'static [u8] = if has_swagger_ui() {
            include_bytes!("../ui/docs.html")
        } else {
            include_bytes!("../ui/docs-missing.html")
        };
        let own = [
            ("/docs", HTML, page),
            ("/docs/docs.css", CSS, include_bytes!("../ui/docs.css")),
            (
                "/docs/docs-init.js",
                JS,
                include_bytes!("../ui/docs-init.js"),
            ),
        ];
        let theirs = swagger_ui::FILES.iter().map(|(name, body)| {
            let ty = match name.rsplit_once('.').map(|(_, ext)| ext) {
                Some("js") => JS,
                Some("css") => CSS,
                _ => "text/plain; charset=utf-8",
            };
            (format!("/docs/{name}"), ty, *body)
        });
        own.into_iter()
            .map(|(p, ty, body)| (p.to_string(), ty, body))
            .chain(theirs)
            .map(|(path, content_type, body)| Asset::new(path, content_type, body))
            .collect()
    })
}

/// One route per file; any other path under /docs gets the API's JSON 404.
pub fn routes() -> Router<Arc<Shared>> {
    served().iter().fold(Router::new(), |router, file| {
        router.route(
                &file.path,
                get(move |headers: HeaderMap| async move {
                    file.serve(&headers, CONTENT_SECURITY_POLICY)
                }),
            )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every script on either page is a file of this origin: the policy
    /// would block an inline one, and this says so before a browser does.
    #[test]
    fn the_pages_have_no_inline_script_or_remote_file() {
        for page in [
            include_str!("../ui/docs.html"),
            include_str!("../ui/docs-missing.html"),
        ] {
            assert_eq!(
                page.matches("<script").count(),
                page.matches("<script src=\"/docs/").count()
            );
            assert!(!page.contains("style="), "{page}");
            assert!(!page.contains("//"), "no other origin: {page}");
        }
        assert!(!CONTENT_SECURITY_POLICY.contains("unsafe"));
    }

    #[test]
    fn every_file_is_served_once_with_its_type() {
        let paths: Vec<_> = served().iter().map(|f| f.path.as_str()).collect();
        let mut unique = paths.clone();
        unique.sort();
        unique.dedup();
        assert_eq!(unique.len(), paths.len(), "{paths:?}");
        assert!(paths.contains(&"/docs"));
        assert_eq!(has_swagger_ui(), paths.len() == 6, "{paths:?}");
    }
}
