//! `web_fetch`: a web page for the model, read on the host through the
//! sandbox's own broker (so under its live policy, refused with the
//! broker's reason) and returned as readable text: HTML as Markdown, other
//! text as it is, a window of it at a time.
//!
//! The page is hostile input to the host: its size is capped by the
//! fetcher, its HTML is parsed by html5ever (no script runs) and its tree
//! cut at [`MAX_DEPTH`] before it is walked, on a thread of its own stack,
//! so no nesting can exhaust the host's.

use std::rc::Rc;

use cordon_net::fetch::{FetchError, Fetched, Fetcher, Route};
use cordon_sandbox::Network;
use serde::Deserialize;
use serde_json::{Value, json};

use crate::{ToolContext, ToolFuture, ToolOutput, TypedTool};

pub struct WebFetch;

pub const NAME: &str = "web_fetch";
/// Characters of the page returned by default, and at most.
pub const DEFAULT_LENGTH: usize = 20_000;
pub const MAX_LENGTH: usize = 100_000;
/// Elements nested deeper than this are dropped before the page is
/// converted: real pages stay far below it.
pub const MAX_DEPTH: usize = 200;
/// The converting thread's stack: the walk recurses once per level.
const CONVERT_STACK: usize = 16 << 20;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Input {
    url: String,
    #[serde(default)]
    max_length: Option<usize>,
    #[serde(default)]
    start_index: Option<usize>,
}

pub fn schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "url": {"type": "string", "description": "The http:// or https:// URL to read."},
            "max_length": {"type": "integer", "minimum": 1, "maximum": MAX_LENGTH, "description": "Most characters to return. Default 20000."},
            "start_index": {"type": "integer", "minimum": 0, "description": "Characters of the page to skip: to read on where a cut page stopped. Default 0."}
        },
        "required": ["url"],
        "additionalProperties": false
    })
}

const DESCRIPTION: &str = "Read a web page: documentation, an issue, a changelog, an API's JSON. The URL is fetched under the sandbox's network policy (a host it does not allow is refused, with the reason; ask the user to allow it) and the page returned as text: HTML converted to Markdown, with scripts and styles left out; plain text and JSON as they are. Long pages come in windows of max_length characters: call again with the start_index the result names to read on. It cannot log in, run a page's scripts or download binary files (use curl in bash for those, under the same policy).";

impl TypedTool for WebFetch {
    const NAME: &'static str = NAME;
    const READ_ONLY: bool = true;
    type Input = Input;
    fn description(&self) -> &str {
        DESCRIPTION
    }
    fn input_schema(&self) -> Value {
        schema()
    }
    fn label(&self, input: &Input) -> String {
        input.url.clone()
    }
    fn run<'a>(&'a self, ctx: &'a ToolContext, input: Input) -> ToolFuture<'a> {
        Box::pin(fetch(ctx, input))
    }
}

/// How the sandbox's fetches leave the host, or why they cannot.
fn route(ctx: &ToolContext) -> Result<Fetcher, String> {
    match ctx.sandbox.network_kind() {
        Network::Allow => ctx
            .sandbox
            .network()
            .map(|n| n.fetcher())
            .ok_or_else(|| "the sandbox's network broker is not running".to_string()),
        Network::Full => Ok(Fetcher::new(Route::Direct, None)),
        kind => Err(format!(
            "this sandbox has no network (network: {kind}), so web_fetch cannot reach anything. \
             If the task needs the page, ask the user to start cordon with --allow HOST."
        )),
    }
}

async fn fetch(ctx: &ToolContext, input: Input) -> ToolOutput {
    let fetcher = match route(ctx) {
        Ok(f) => f,
        Err(why) => return ToolOutput::error(format!("web_fetch: {why}")),
    };
    let page = match fetcher.get(&input.url).await {
        Ok(p) => p,
        Err(e) => return ToolOutput::error(failed(&input.url, e)),
    };
    let max = input
        .max_length
        .unwrap_or(DEFAULT_LENGTH)
        .clamp(1, MAX_LENGTH);
    let start = input.start_index.unwrap_or(0);
    let status = page.status;
    let kind = Kind::of(&page);
    let text = match kind {
        Kind::Html => match to_markdown(page.body.clone()).await {
            Ok(md) => md,
            Err(e) => return ToolOutput::error(format!("web_fetch: {e}")),
        },
        Kind::Text => String::from_utf8_lossy(&page.body).into_owned(),
        Kind::Binary(ref ty) => {
            return ToolOutput::error(format!(
                "web_fetch: {} is {ty} ({} bytes{}), not a page to read. Download it with curl in bash instead.",
                page.url,
                page.body.len(),
                if page.truncated { " or more" } else { "" },
            ));
        }
    };
    let total = text.chars().count();
    let window: String = text.chars().skip(start).take(max).collect();
    let end = start + window.chars().count();
    let mut out = format!(
        "URL: {}\nStatus: {status}\nContent-Type: {}\n",
        page.url,
        page.content_type.as_deref().unwrap_or("(none)"),
    );
    if page.truncated {
        out.push_str("The page was longer than web_fetch reads: only its start is here.\n");
    }
    if start > 0 || end < total {
        out.push_str(&format!("Characters {start}–{end} of {total}.\n"));
    }
    out.push('\n');
    if window.is_empty() {
        out.push_str(if total == 0 {
            "(the page has no text)\n"
        } else {
            "(nothing past start_index)\n"
        });
    } else {
        out.push_str(&window);
        if !window.ends_with('\n') {
            out.push('\n');
        }
    }
    if end < total {
        out.push_str(&format!(
            "\n[cut: call web_fetch again with start_index {end} to read on]\n"
        ));
    }
    let structured = json!({
        "url": page.url.as_str(),
        "status": status.as_u16(),
        "content_type": page.content_type,
        "chars": total,
        "start": start,
        "end": end,
        "truncated": page.truncated,
    });
    // An error page is still a page, but the call did not get what it
    // asked for.
    ToolOutput::new(out, !status.is_success()).with_structured(structured)
}

/// A failed fetch, for the model: the broker's line as it is, with what
/// to do about it.
fn failed(url: &str, e: FetchError) -> String {
    match e {
        FetchError::Network(line) if line.contains("refused by policy") => format!(
            "{line}\nweb_fetch goes through the sandbox's network policy, which does not allow this. \
             Ask the user to allow the host if the task needs it, or work without the page."
        ),
        FetchError::Network(line) => format!("{line}\nweb_fetch could not reach {url}."),
        e => format!("web_fetch: {url}: {e}"),
    }
}

/// What a response's body is, for reading.
#[derive(Debug, PartialEq)]
enum Kind {
    Html,
    Text,
    Binary(String),
}

impl Kind {
    fn of(page: &Fetched) -> Kind {
        let ty = page
            .content_type
            .as_deref()
            .and_then(|t| t.split(';').next())
            .map(|t| t.trim().to_ascii_lowercase())
            .unwrap_or_default();
        match ty.as_str() {
            "text/html" | "application/xhtml+xml" => Kind::Html,
            t if t.starts_with("text/")
                || t.ends_with("+json")
                || t.ends_with("+xml")
                || matches!(
                    t,
                    "application/json"
                        | "application/xml"
                        | "application/javascript"
                        | "application/x-javascript"
                        | "application/toml"
                        | "application/yaml"
                        | "application/x-yaml"
                ) =>
            {
                Kind::Text
            }
            // No type: sniff as a browser would, roughly.
            "" if looks_like_html(&page.body) => Kind::Html,
            "" if std::str::from_utf8(&page.body).is_ok() => Kind::Text,
            "" => Kind::Binary("data of no stated type".into()),
            t => Kind::Binary(t.to_string()),
        }
    }
}

fn looks_like_html(body: &[u8]) -> bool {
    let head = String::from_utf8_lossy(&body[..body.len().min(512)]).to_ascii_lowercase();
    let head = head.trim_start();
    head.starts_with("<!doctype html") || head.starts_with("<html")
}

/// `html` as Markdown, on a thread of its own with a stack for the walk.
async fn to_markdown(html: bytes::Bytes) -> Result<String, String> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    std::thread::Builder::new()
        .name("web_fetch-html".into())
        .stack_size(CONVERT_STACK)
        .spawn(move || {
            let _ = tx.send(convert(&String::from_utf8_lossy(&html)));
        })
        .map_err(|e| format!("cannot start converting the page: {e}"))?;
    rx.await
        .map_err(|_| "converting the page failed".to_string())?
}

/// Converts on the calling thread: see [`to_markdown`].
fn convert(html: &str) -> Result<String, String> {
    let md = htmd::HtmlToMarkdown::builder()
        .skip_tags(vec![
            "script", "style", "noscript", "template", "svg", "canvas", "iframe", "object",
            "embed", "head",
        ])
        .build();
    let tree = md
        .html_to_tree(bounded(html, MAX_SCAN_DEPTH))
        .map_err(|e| format!("the page's HTML cannot be read: {e}"))?;
    prune(&tree, MAX_DEPTH);
    let text = md.tree_to_markdown(&tree);
    Ok(tidy(&text))
}

/// Elements a page may open before the rest of it is dropped unparsed:
/// an HTML tree builder checks the open elements at every tag, so a page
/// nested without end costs it the square of its depth.
const MAX_SCAN_DEPTH: usize = 1000;

/// Elements that open nothing to close: void, or closed by the next of
/// their kind (a list of `<li>` without `</li>` is not nested).
const FLAT: &[&str] = &[
    "area", "base", "br", "col", "embed", "hr", "img", "input", "link", "meta", "param", "source",
    "track", "wbr", "p", "li", "dt", "dd", "tr", "td", "th", "option", "optgroup", "rb", "rt",
    "rp", "thead", "tbody", "tfoot", "colgroup", "caption",
];

/// `html` up to the first tag that opens more than `max` elements, by a
/// linear scan that over-counts rather than under-counts (it does not
/// know every rule of the tree builder): a real page is left whole.
fn bounded(html: &str, max: usize) -> &str {
    let b = html.as_bytes();
    let mut depth = 0usize;
    let mut i = 0;
    while let Some(off) = b[i..].iter().position(|&c| c == b'<') {
        let at = i + off;
        let rest = &b[at + 1..];
        if rest.starts_with(b"!--") {
            // A comment opens nothing; skip to its end.
            match html[at..].find("-->") {
                Some(end) => i = at + end + 3,
                None => return html,
            }
            continue;
        }
        let closing = rest.first() == Some(&b'/');
        let name_start = if closing { 1 } else { 0 };
        let name: Vec<u8> = rest[name_start..]
            .iter()
            .take_while(|c| c.is_ascii_alphanumeric())
            .map(u8::to_ascii_lowercase)
            .collect();
        i = at + 1;
        if name.is_empty() || !name[0].is_ascii_alphabetic() {
            continue;
        }
        if closing {
            depth = depth.saturating_sub(1);
            continue;
        }
        let tag_end = rest.iter().position(|&c| c == b'>');
        let self_closing = tag_end.is_some_and(|e| e > 0 && rest[e - 1] == b'/');
        let flat = FLAT.iter().any(|f| f.as_bytes() == name.as_slice());
        if !self_closing && !flat {
            depth += 1;
            if depth > max {
                return &html[..at];
            }
        }
    }
    html
}

/// Drops what is nested deeper than `max` below `root`, without
/// recursing (the tree may be as deep as the page is long).
fn prune(root: &Rc<htmd::Node>, max: usize) {
    let mut stack = vec![(root.clone(), 0usize)];
    while let Some((node, depth)) = stack.pop() {
        if depth >= max {
            // The node's own drop of a deep subtree is iterative
            // (markup5ever's `Node`).
            node.children.borrow_mut().clear();
            continue;
        }
        for child in node.children.borrow().iter() {
            stack.push((child.clone(), depth + 1));
        }
    }
}

/// At most one blank line in a row, and no trailing spaces: what a
/// converted page wastes most of its characters on.
fn tidy(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut blank = 0;
    for line in text.lines() {
        let line = line.trim_end();
        if line.is_empty() {
            blank += 1;
            if blank > 1 {
                continue;
            }
        } else {
            blank = 0;
        }
        out.push_str(line);
        out.push('\n');
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn html_becomes_markdown_without_its_scripts() {
        let md = convert(
            "<html><head><title>t</title><style>p{}</style></head><body>\
             <h1>Guide</h1><p>Use <code>cordon</code> and <a href=\"https://x.example/\">this</a>.</p>\
             <script>steal()</script><ul><li>one</li><li>two</li></ul>\n\n\n\n<p>end</p></body></html>",
        )
        .unwrap();
        assert!(md.starts_with("# Guide"), "{md}");
        assert!(
            md.contains("Use `cordon` and [this](https://x.example/)."),
            "{md}"
        );
        assert!(md.contains("one") && md.contains("two"), "{md}");
        assert!(!md.contains("steal") && !md.contains("p{}"), "{md}");
        assert!(!md.contains("\n\n\n"), "{md}");
    }

    #[tokio::test]
    async fn a_page_nested_without_end_does_not_exhaust_the_stack() {
        let deep = format!(
            "<html><body><p>top</p>{}bottom</body></html>",
            "<div>".repeat(300_000)
        );
        let started = std::time::Instant::now();
        let md = to_markdown(deep.into()).await.unwrap();
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert!(md.starts_with("top"), "{}", &md[..md.len().min(200)]);
        assert!(!md.contains("bottom"), "cut below the depth");
        // The other ways a tree builder is made to work per tag.
        for piece in [
            "<b>",
            "<li>",
            "<p>",
            "<a href=x>",
            "<table><tr><td>",
            "<option>",
            "<i><b>",
        ] {
            let page = piece.repeat(1_000_000 / piece.len());
            let started = std::time::Instant::now();
            to_markdown(page.into()).await.unwrap();
            let took = started.elapsed();
            assert!(
                took < std::time::Duration::from_secs(10),
                "{piece}: {took:?}"
            );
        }
    }

    #[test]
    fn the_scan_leaves_real_pages_whole_and_cuts_endless_nesting() {
        let page = "<html><body><ul><li>a<li>b</ul><p>x<p>y<br><img src=x/><!-- <div><div> --></body></html>";
        assert_eq!(bounded(page, 3), page);
        let deep = format!("<p>top</p>{}", "<div>".repeat(10));
        assert_eq!(
            bounded(&deep, 4),
            format!("<p>top</p>{}", "<div>".repeat(4))
        );
        assert_eq!(bounded("<div></div>".repeat(100).as_str(), 1).len(), 1100);
    }

    #[test]
    fn content_types_decide_how_a_body_is_read() {
        let page = |ty: Option<&str>, body: &'static [u8]| Fetched {
            url: "http://x.example/".parse().unwrap(),
            status: http::StatusCode::OK,
            content_type: ty.map(str::to_string),
            body: bytes::Bytes::from_static(body),
            truncated: false,
        };
        assert_eq!(
            Kind::of(&page(Some("text/html; charset=utf-8"), b"")),
            Kind::Html
        );
        assert_eq!(
            Kind::of(&page(Some("application/vnd.api+json"), b"{}")),
            Kind::Text
        );
        assert_eq!(Kind::of(&page(None, b"<!DOCTYPE html><p>x")), Kind::Html);
        assert_eq!(Kind::of(&page(None, b"plain")), Kind::Text);
        assert_eq!(
            Kind::of(&page(Some("image/png"), b"\x89PNG")),
            Kind::Binary("image/png".into())
        );
        assert!(matches!(
            Kind::of(&page(None, b"\xff\xfe\x00")),
            Kind::Binary(_)
        ));
    }
}
