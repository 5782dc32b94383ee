//! The web UI: its files as served, and the whole UI driven in headless
//! Chromium through Playwright against a real server and the scripted model.

use crate::common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;
use cordon_testkit::{Fault, Scenario, ScriptedServer, Turn};
use serde_json::{Value, json};

/// The UI does not depend on the database: SQLite is enough here (the
/// API's own tests run on both).
async fn sqlite_server() -> TestServer {
    TestServer::start(Db::Sqlite)
        .await
        .expect("SQLite needs nothing installed")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_page_is_served_without_a_token_under_a_strict_policy() {
    let s = sqlite_server().await;
    let r = s.client.get(s.url("/")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    let csp = h["content-security-policy"].to_str().unwrap();
    for want in [
        "default-src 'none'",
        "script-src 'self'",
        "style-src 'self'",
        "connect-src 'self'",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(want), "{want} missing from {csp}");
    }
    assert!(!csp.contains("unsafe"), "{csp}");
    assert_eq!(h["x-content-type-options"], "nosniff");
    assert_eq!(h["referrer-policy"], "no-referrer");
    assert_eq!(h["x-frame-options"], "DENY");
    let html = r.text().await.unwrap();
    assert!(html.contains(r#"<script src="ui/app.js" defer></script>"#));
    // Every script is a file: the policy would block an inline one anyway,
    // and this says so before a browser does.
    assert_eq!(
        html.matches("<script").count(),
        html.matches("<script src=").count()
    );
    assert!(!html.contains("style="), "inline styles are blocked too");

    // The API behind the page still wants a token.
    let r = s.client.get(s.url("/v1/jobs")).send().await.unwrap();
    assert_eq!(r.status(), 401);
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn assets_have_their_types_validators_and_a_json_404() {
    let s = sqlite_server().await;
    for (path, ty) in [
        ("/ui/app.js", "text/javascript; charset=utf-8"),
        ("/ui/app.css", "text/css; charset=utf-8"),
        ("/ui/icon.svg", "image/svg+xml"),
        ("/ui/index.html", "text/html; charset=utf-8"),
    ] {
        let r = s.client.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-type"], ty, "{path}");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff", "{path}");
        assert_eq!(r.headers()["cache-control"], "no-cache", "{path}");
        let etag = r.headers()["etag"].clone();
        assert!(!r.bytes().await.unwrap().is_empty(), "{path}");
        // Revalidation of an unchanged file costs no body.
        let r = s
            .client
            .get(s.url(path))
            .header("if-none-match", etag.clone())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 304, "{path}");
        assert_eq!(r.headers()["etag"], etag);
        assert!(r.bytes().await.unwrap().is_empty());
    }
    // noVNC's modules, embedded at build time, where the page imports them.
    if cordon_server::ui::has_novnc() || in_ci() {
        for path in [
            "/ui/novnc/core/rfb.js",
            "/ui/novnc/vendor/pako/lib/zlib/inflate.js",
        ] {
            let r = s.client.get(s.url(path)).send().await.unwrap();
            assert_eq!(r.status(), 200, "{path}");
            assert_eq!(
                r.headers()["content-type"],
                "text/javascript; charset=utf-8"
            );
            assert!(r.text().await.unwrap().contains("export"), "{path}");
        }
    }
    for path in [
        "/ui/nope.js",
        "/ui/../Cargo.toml",
        "/ui/app.js/x",
        "/ui/",
        "/ui/novnc/core/nope.js",
    ] {
        let r = s.client.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found", "{path}: {body}");
    }
    s.stop().await;
}

/// Text from a model or a program must reach the page as text, never as
/// markup: the script uses no HTML-parsing sink at all.
#[test]
fn the_script_never_parses_strings_as_html() {
    let js = include_str!("../../ui/app.js");
    for sink in [
        "innerHTML",
        "outerHTML",
        "insertAdjacentHTML",
        "document.write",
        "createContextualFragment",
        "DOMParser",
        "eval(",
        "new Function",
    ] {
        assert!(!js.contains(sink), "app.js uses {sink}");
    }
}

fn in_ci() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "0" && v != "false")
}

/// What the browser test needs from the machine, or why it cannot run.
struct Browser {
    node: PathBuf,
    chromium: PathBuf,
    playwright: PathBuf,
}

fn find_in_path(name: &str) -> Option<PathBuf> {
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}

/// Runs the Playwright script `tests/ui/NAME` against the server at
/// `base`, failing the test with its output if it fails.
async fn drive(b: &Browser, name: &str, base: &str, token: &str) {
    drive_with(b, name, base, token, &[]).await
}

/// As [`drive`], with more of the script's environment (`env`).
async fn drive_with(b: &Browser, name: &str, base: &str, token: &str, env: &[(&str, &str)]) {
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/ui")
        .join(name);
    let run = tokio::process::Command::new(&b.node)
        .arg(&script)
        .env("BASE_URL", base)
        .env("TOKEN", token)
        .env("CHROMIUM", &b.chromium)
        .env("PLAYWRIGHT_CORE", &b.playwright)
        .envs(env.iter().copied())
        .kill_on_drop(true)
        .output();
    // A guard against a hang: JupyterLab's first load on a slow machine
    // takes minutes.
    let out = tokio::time::timeout(Duration::from_secs(600), run)
        .await
        .unwrap_or_else(|_| panic!("{name} ran past 10 minutes"))
        .unwrap();
    let log = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{name} failed:\n{log}");
    eprintln!("{log}");
}

/// The browser, when it and what the test drives (`missing`: the build
/// lacks it, and why) are here. CI installs everything, so there a missing
/// piece fails the test; elsewhere the test is skipped.
fn ready(missing: Option<&str>) -> Option<Browser> {
    let why = match (browser(), missing) {
        (Ok(b), None) => return Some(b),
        (Err(why), _) => why,
        (Ok(_), Some(why)) => why.to_string(),
    };
    assert!(!in_ci(), "the browser test cannot run: {why}");
    eprintln!("skipped: {why}");
    None
}

fn browser() -> Result<Browser, String> {
    let node = find_in_path("node").ok_or("node is not installed")?;
    let chromium = std::env::var_os("CORDON_CHROMIUM")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/usr/bin/chromium".into());
    if !chromium.is_file() {
        return Err(format!(
            "{} is missing (apt-get install chromium)",
            chromium.display()
        ));
    }
    let playwright = std::env::var_os("CORDON_PLAYWRIGHT_CORE")
        .map(PathBuf::from)
        .unwrap_or_else(|| "/var/cache/cordon/ui-test/node_modules/playwright-core".into());
    if !playwright.join("index.mjs").is_file() {
        return Err(format!(
            "playwright-core is missing at {} (scripts/test installs it)",
            playwright.display()
        ));
    }
    Ok(Browser {
        node,
        chromium,
        playwright,
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_shell_job_streams_live_and_the_chat_shows_tool_calls() {
    let Some(b) = ready(None) else { return };
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(
                Turn::text("Let me look at the workspace.")
                    .with_tool_call("c1", "bash", json!({"command": "echo tool-said-$((6 * 7))"}))
                    .with_tool_call("c2", "read_file", json!({"path": "missing.txt"}))
                    // Model text, shown as text: its markup must stay text.
                    .with_tool_call("c3", "update_plan", json!({"plan": [
                        {"step": "look at the workspace", "status": "completed"},
                        {"step": "report <b onmouseover=alert(1)>back</b>", "status": "in_progress"},
                    ]})),
            )
            .turn(
                // Slowed so the page has text to show before the turn ends.
                // Markdown, with what an attacker would put in it (issue 32):
                // rendered safely, never as HTML.
                Turn::text(concat!(
                    "## Done\n\n",
                    "The command printed **tool-said-42** and `missing.txt` does not exist, so all is well.\n\n",
                    "```sh\necho tool-said-$((6 * 7))\n```\n\n",
                    "- first point\n- second point\n\n",
                    "See [the docs](https://example.com/docs) or [this](javascript:alert(1)).\n",
                    "<img src=x onerror=\"window.pwned=1\"><script>window.pwned=2</script>",
                    "[x](data:text/html,<script>window.pwned=3</script>)"
                ))
                    .expect_tool_results(["c1", "c2", "c3"])
                    .fault(Fault::chunk_delay_ms(40)),
            )
            // The agent job the page submits after the chat.
            .turn(Turn::text("Writing it.").with_tool_call(
                "a1",
                "bash",
                // The sleep keeps it running while the page shows its output.
                json!({"command": "echo agent-was-here | tee agent.txt; sleep 3"}),
            ))
            .turn(Turn::text("Left agent.txt.").expect_tool_results(["a1"])),
    );
    let s = TestServer::start_with(Db::Sqlite, with_model(model.url()))
        .await
        .expect("SQLite needs nothing installed");
    let token = s.token("ui").await;
    drive(&b, "browser.mjs", &s.base, &token).await;
    model.assert_finished();
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_gui_job_s_desktop_is_live_and_control_is_opt_in() {
    let missing = (!cordon_server::ui::has_novnc())
        .then_some("this build has no noVNC (scripts/packages.txt installs it)");
    let Some(b) = ready(missing) else { return };
    let s = sqlite_server().await;
    let token = s.token("ui").await;
    drive(&b, "desktop.mjs", &s.base, &token).await;
    s.stop().await;
}

/// Swagger UI at /docs: our page and script, its bundle and stylesheet
/// (embedded at build time), each with its type and `nosniff`, under a
/// policy with no `eval` and no other origin.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn docs_serve_swagger_ui_under_a_strict_policy() {
    let embedded = cordon_server::docs::has_swagger_ui();
    assert!(
        embedded || !in_ci(),
        "this build has no Swagger UI (scripts/test runs scripts/fetch-ui-assets)"
    );
    let s = sqlite_server().await;
    let r = s.client.get(s.url("/docs")).send().await.unwrap();
    assert_eq!(r.status(), 200);
    let h = r.headers().clone();
    assert_eq!(h["content-type"], "text/html; charset=utf-8");
    assert_eq!(h["x-content-type-options"], "nosniff");
    let csp = h["content-security-policy"].to_str().unwrap();
    for want in [
        "default-src 'none'",
        "script-src 'self';",
        "style-src 'self';",
        "connect-src 'self';",
        "frame-ancestors 'none'",
    ] {
        assert!(csp.contains(want), "{want} missing from {csp}");
    }
    // No eval and no inline script or style: Swagger UI runs without them.
    assert!(!csp.contains("unsafe"), "{csp}");
    let html = r.text().await.unwrap();
    if !embedded {
        // The page that says how to get it, and nothing to load.
        assert!(html.contains("scripts/fetch-ui-assets"), "{html}");
        assert!(!html.contains("<script"), "{html}");
        eprintln!("skipped the assets: built without Swagger UI");
        s.stop().await;
        return;
    }
    assert!(html.contains(r#"<script src="/docs/docs-init.js"></script>"#));
    let version = cordon_server::docs::swagger_ui_version().unwrap();
    assert!(version.starts_with("5."), "{version}");
    for (path, ty, has) in [
        (
            "/docs/docs-init.js",
            "text/javascript; charset=utf-8",
            "validatorUrl: null",
        ),
        ("/docs/docs.css", "text/css; charset=utf-8", "box-sizing"),
        (
            "/docs/swagger-ui-bundle.js",
            "text/javascript; charset=utf-8",
            "SwaggerUIBundle",
        ),
        (
            "/docs/swagger-ui.css",
            "text/css; charset=utf-8",
            ".swagger-ui",
        ),
        (
            "/docs/LICENSE",
            "text/plain; charset=utf-8",
            "Apache License",
        ),
    ] {
        let r = s.client.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 200, "{path}");
        assert_eq!(r.headers()["content-type"], ty, "{path}");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff", "{path}");
        let etag = r.headers()["etag"].clone();
        assert!(r.text().await.unwrap().contains(has), "{path}");
        let r = s
            .client
            .get(s.url(path))
            .header("if-none-match", etag)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 304, "{path}");
    }
    // Only those files: the rest of the package was never embedded.
    for path in [
        "/docs/index.html",
        "/docs/swagger-ui-bundle.js.map",
        "/docs/swagger-initializer.js",
        "/docs/../openapi.json/x",
        "/docs/",
    ] {
        let r = s.client.get(s.url(path)).send().await.unwrap();
        assert_eq!(r.status(), 404, "{path}");
        let body: Value = r.json().await.unwrap();
        assert_eq!(body["error"]["code"], "not_found", "{path}: {body}");
    }
    s.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_job_is_submitted_from_docs() {
    let missing = (!cordon_server::docs::has_swagger_ui())
        .then_some("this build has no Swagger UI (scripts/test runs scripts/fetch-ui-assets)");
    let Some(b) = ready(missing) else { return };
    let s = sqlite_server().await;
    let token = s.token("docs").await;
    drive(&b, "docs.mjs", &s.base, &token).await;
    s.stop().await;
}

/// A running job's and a session's JupyterLab, opened from the UI's "Open
/// Lab": a notebook cell writes a file the files API then finds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_job_s_lab_runs_a_cell_that_writes_the_workspace() {
    let installed = cordon_lab::installed(&cordon_lab::cache_dir()).is_some();
    let missing =
        (!installed).then_some("no lab environment (cordon lab setup; scripts/test runs it)");
    let Some(b) = ready(missing) else { return };
    // A session needs a model to be made; the page sends it no message.
    let model = ScriptedServer::start(Scenario::new());
    let s = TestServer::start_with(Db::Sqlite, with_model(model.url()))
        .await
        .expect("SQLite needs nothing installed");
    let token = s.token("lab").await;
    // Held open until the page is done with it.
    let id = s
        .submit(
            &token,
            json!({"kind": "shell", "timeout_secs": 900,
                "command": "while [ ! -f /workspace/release ]; do sleep 0.1; done"}),
        )
        .await;
    s.wait_running(&token, &id).await;
    drive_with(&b, "lab.mjs", &s.base, &token, &[("JOB_ID", &id)]).await;
    let r = s
        .client
        .put(s.url(&format!("/v1/jobs/{id}/files/release")))
        .bearer_auth(&token)
        .body("")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let job = s.wait(&token, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    s.stop().await;
}

/// The page a preview test serves: it tries everything a hostile page of a
/// sandbox's could against cordon, and writes what it got into `#result`.
fn hostile_page(api: &str) -> String {
    format!(
        r#"<!doctype html><meta charset="utf-8"><title>preview</title>
<h1>made in the sandbox</h1><pre id="result"></pre>
<script>
(async () => {{
  const out = {{ cookie: document.cookie }};
  try {{
    const r = await fetch("{api}/v1/jobs", {{ credentials: "include" }});
    out.api = r.status;
    out.body = await r.text();
  }} catch (e) {{ out.api = "refused: " + e.message; }}
  try {{ out.storage = JSON.stringify([{{ ...localStorage }}, {{ ...sessionStorage }}]); }}
  catch (e) {{ out.storage = "refused: " + e.message; }}
  out.ws = await new Promise((done) => {{
    const ws = new WebSocket("ws://" + location.host + "/echo");
    ws.onopen = () => ws.send("from the page");
    ws.onmessage = (m) => {{ done("echo: " + m.data); ws.close(); }};
    ws.onerror = () => done("no WebSocket");
  }});
  const r = document.getElementById("result");
  r.textContent = JSON.stringify(out);
  r.dataset.done = "1";
}})();
</script>"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_preview_is_its_own_origin_and_reads_nothing_of_cordons() {
    preview_in_chromium(false).await;
}

/// The same under `--sandbox-domain localhost`: the preview is a host name
/// of its own (`8080-job-….localhost`, which Chromium resolves to this
/// machine), on the server's port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_chromium_a_preview_by_name_is_its_own_origin_and_reads_nothing_of_cordons() {
    preview_in_chromium(true).await;
}

async fn preview_in_chromium(by_name: bool) {
    let Some(b) = ready(None) else { return };
    let s = TestServer::start_with(Db::Sqlite, |c| {
        if by_name {
            c.sandbox_domain = Some("localhost".parse().unwrap());
        }
    })
    .await
    .expect("SQLite needs nothing installed");
    let token = s.token("preview").await;
    let server = include_str!("../common/page_and_echo.py");
    let id = s
        .submit(
            &token,
            json!({"kind": "shell", "timeout_secs": 900, "command": format!(
                "cat > serve.py <<'PY'\n{server}PY\n\
                 python3 serve.py 8080 >/dev/null 2>&1 &\n\
                 while [ ! -f /workspace/release ]; do sleep 0.1; done")}),
        )
        .await;
    s.wait_running(&token, &id).await;
    let r = s
        .client
        .put(s.url(&format!("/v1/jobs/{id}/files/index.html")))
        .bearer_auth(&token)
        .body(hostile_page(&s.base))
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    let link = loop {
        let (status, p) = s
            .post(
                &token,
                &format!("/v1/jobs/{id}/ports/8080/preview"),
                json!({}),
            )
            .await;
        assert_eq!(status, 200, "{p}");
        let origin = p["origin"].as_str().unwrap();
        let index = format!("{origin}/index.html");
        // By name, reached at the server's address as Chromium resolves it.
        let get = match origin
            .strip_prefix("http://")
            .and_then(|h| h.split_once(':'))
        {
            Some((name, _)) if by_name => {
                assert!(
                    name.starts_with("8080-job-") && name.ends_with(".localhost"),
                    "{origin}"
                );
                let addr: std::net::SocketAddr = s.base[7..].parse().unwrap();
                reqwest::Client::builder()
                    .resolve(name, addr)
                    .build()
                    .unwrap()
                    .get(&index)
            }
            _ => s.client.get(&index),
        };
        let up = get
            .bearer_auth(&token)
            .send()
            .await
            .is_ok_and(|r| r.status() == 200);
        if up {
            break p["url"].as_str().unwrap().to_string();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    drive_with(
        &b,
        "preview.mjs",
        &s.base,
        &token,
        &[("PREVIEW_URL", &link), ("JOB_ID", &id)],
    )
    .await;
    s.release(&token, &id).await;
    s.stop().await;
}
