//! JupyterLab through a running `cordon serve`: the time to its first page,
//! and a static file through the proxy next to the same file straight from
//! Jupyter's socket inside the sandbox.
//!
//! Each round holds a fresh job open (a shell job that waits for a file in
//! its workspace) and loads the Lab's page the way a browser does:
//!
//! 1. `POST /v1/jobs/{id}/lab` with the bearer token: Jupyter starts in the
//!    sandbox (the first time), the answer is a URL on the Lab's own
//!    origin with a one-time ticket;
//! 2. `GET` that URL: a 303 to the Lab's base and its cookie;
//! 3. `GET` the base with the cookie: Jupyter redirects to `…/lab`, whose
//!    HTML is the page.
//!
//! `cold` is the first load (Jupyter starts), `warm` a later one on the
//! open Lab (a new ticket: all three steps), `reload` the page alone with
//! the cookie (step 3).
//!
//! Then the first script the page loads is fetched many times over one
//! kept-alive connection by curl on both sides: on the host through the
//! Lab's origin (TCP, cordon's cookie check, the relay exec into the
//! sandbox, Jupyter), and inside the sandbox by the job itself, with
//! `curl --unix-socket` straight to Jupyter. Same client, same file, same
//! Jupyter; the difference is the proxy.

use std::process::Command;
use std::time::{Duration, Instant};

use reqwest::StatusCode;
use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use serde_json::{Value, json};

use crate::Args;
use crate::stats::{Json, Summary, ms};

/// The job: waits for `go` (`N PATH`), fetches PATH N times from Jupyter's
/// socket, writes curl's lines to `inside.txt`, then waits for `release`.
const JOB: &str = r#"while [ ! -f /workspace/go ]; do sleep 0.05; done
read n p < /workspace/go
set --
i=0
while [ "$i" -lt "$n" ]; do set -- "$@" -o /dev/null "http://lab$p"; i=$((i + 1)); done
curl -s --unix-socket /tmp/.cordon-lab/lab.sock -w '%{http_code} %{size_download} %{time_total}\n' "$@" \
    > /workspace/inside.tmp 2>&1
mv /workspace/inside.tmp /workspace/inside.txt
while [ ! -f /workspace/release ]; do sleep 0.1; done"#;

/// curl's `-w` line per transfer.
const CURL_W: &str = "%{http_code} %{size_download} %{time_total}\n";

struct Server {
    url: String,
    token: String,
    http: reqwest::Client,
}

/// One page load's steps.
struct Load {
    post: Duration,
    ticket: Duration,
    page: Duration,
    /// The page's origin and base, its cookie, and its HTML.
    home: String,
    cookie: String,
    html: String,
}

impl Server {
    async fn json(&self, req: reqwest::RequestBuilder, what: &str) -> Result<Value, String> {
        let r = req
            .bearer_auth(&self.token)
            .send()
            .await
            .map_err(|e| format!("{what}: {e}"))?;
        let status = r.status();
        let body = r.text().await.map_err(|e| format!("{what}: {e}"))?;
        if !status.is_success() {
            return Err(format!("{what} answered {status}: {body}"));
        }
        serde_json::from_str(&body).map_err(|e| format!("{what}: {e}: {body}"))
    }

    async fn job(&self, id: &str) -> Result<Value, String> {
        self.json(
            self.http.get(format!("{}/v1/jobs/{id}", self.url)),
            "GET /v1/jobs/{id}",
        )
        .await
    }

    /// Waits until job `id`'s state is not `from`; returns it.
    async fn wait_past(&self, id: &str, from: &[&str]) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let job = self.job(id).await?;
            let state = job["state"].as_str().unwrap_or("?").to_string();
            if !from.contains(&state.as_str()) {
                return Ok(state);
            }
            if Instant::now() > deadline {
                return Err(format!("job {id} stayed {state}"));
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    async fn put(&self, id: &str, name: &str, body: String) -> Result<(), String> {
        let r = self
            .http
            .put(format!("{}/v1/jobs/{id}/files/{name}", self.url))
            .bearer_auth(&self.token)
            .body(body)
            .send()
            .await
            .map_err(|e| format!("PUT {name}: {e}"))?;
        if !r.status().is_success() {
            return Err(format!("PUT {name} answered {}", r.status()));
        }
        Ok(())
    }

    /// The file `name` of job `id`'s workspace, once it exists.
    async fn file(&self, id: &str, name: &str) -> Result<String, String> {
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let r = self
                .http
                .get(format!("{}/v1/jobs/{id}/files/{name}", self.url))
                .bearer_auth(&self.token)
                .send()
                .await
                .map_err(|e| format!("GET {name}: {e}"))?;
            if r.status() == StatusCode::OK {
                return r.text().await.map_err(|e| format!("GET {name}: {e}"));
            }
            if Instant::now() > deadline {
                return Err(format!("no {name} in job {id}'s workspace"));
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// POST, ticket, page: one load as a browser does it.
    async fn load(&self, id: &str) -> Result<Load, String> {
        let t = Instant::now();
        let opened = self
            .json(
                self.http
                    .post(format!("{}/v1/jobs/{id}/lab", self.url))
                    .json(&json!({})),
                "POST /v1/jobs/{id}/lab",
            )
            .await?;
        let post = t.elapsed();
        let url = opened["url"]
            .as_str()
            .ok_or_else(|| format!("POST …/lab gave no url: {opened}"))?;
        let origin = url.split("/v1/").next().unwrap_or_default().to_string();
        let t = Instant::now();
        let r = self
            .http
            .get(url)
            .send()
            .await
            .map_err(|e| format!("the ticket: {e}"))?;
        if r.status() != StatusCode::SEE_OTHER {
            return Err(format!("the ticket answered {}", r.status()));
        }
        let to = header(&r, LOCATION)?;
        let cookie = header(&r, SET_COOKIE)?
            .split(';')
            .next()
            .unwrap_or_default()
            .to_string();
        let ticket = t.elapsed();
        let home = format!("{origin}{to}");
        let t = Instant::now();
        let html = self.page(&origin, &home, &cookie).await?;
        let page = t.elapsed();
        Ok(Load {
            post,
            ticket,
            page,
            home,
            cookie,
            html,
        })
    }

    /// The HTML at `url` with `cookie`, following Jupyter's redirects.
    async fn page(&self, origin: &str, url: &str, cookie: &str) -> Result<String, String> {
        let mut url = url.to_string();
        for _ in 0..4 {
            let r = self
                .http
                .get(&url)
                .header(COOKIE, cookie)
                .send()
                .await
                .map_err(|e| format!("GET {url}: {e}"))?;
            if r.status().is_redirection() {
                let to = header(&r, LOCATION)?;
                url = if to.starts_with("http") {
                    to
                } else {
                    format!("{origin}{to}")
                };
                continue;
            }
            if r.status() != StatusCode::OK {
                return Err(format!("GET {url} answered {}", r.status()));
            }
            let html = r.text().await.map_err(|e| format!("GET {url}: {e}"))?;
            if !html.contains("JupyterLab") {
                return Err(format!("GET {url} is not the Lab's page: {html:.200}"));
            }
            return Ok(html);
        }
        Err(format!("too many redirects from {url}"))
    }
}

fn header(r: &reqwest::Response, name: reqwest::header::HeaderName) -> Result<String, String> {
    r.headers()
        .get(&name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string)
        .ok_or_else(|| format!("no {name} in the answer ({})", r.status()))
}

/// The first script the page loads: its path (with query) on the Lab's
/// origin.
fn first_script(html: &str) -> Option<String> {
    html.split("src=\"")
        .skip(1)
        .filter_map(|s| s.split('"').next())
        .find(|src| src.split('?').next().is_some_and(|p| p.ends_with(".js")))
        .map(str::to_string)
}

/// curl's `-w` lines: the times of 200s, with the size of the last.
fn curl_times(text: &str, n: usize) -> Result<(Vec<Duration>, u64), String> {
    let mut times = Vec::new();
    let mut size = 0;
    for line in text.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        match f.as_slice() {
            ["200", bytes, secs] => {
                size = bytes.parse().map_err(|_| format!("curl: {line}"))?;
                let s: f64 = secs.parse().map_err(|_| format!("curl: {line}"))?;
                times.push(Duration::from_secs_f64(s));
            }
            _ => return Err(format!("curl: {line:?} in {text:.400}")),
        }
    }
    if times.len() != n {
        return Err(format!(
            "curl made {} transfers of {n}: {text:.400}",
            times.len()
        ));
    }
    Ok((times, size))
}

/// `n` fetches of `url` with `cookie` on one connection, by curl on the host.
fn host_curl(url: &str, cookie: &str, n: usize) -> Result<(Vec<Duration>, u64), String> {
    let mut cmd = Command::new("curl");
    cmd.args(["-s", "-H", &format!("Cookie: {cookie}"), "-w", CURL_W]);
    for _ in 0..n {
        cmd.args(["-o", "/dev/null", url]);
    }
    let out = cmd.output().map_err(|e| format!("curl: {e}"))?;
    curl_times(&String::from_utf8_lossy(&out.stdout), n)
}

pub async fn run(args: &Args) -> Result<Json, String> {
    let (url, token) = args.server()?;
    let cold_rounds = args.num("cold", 5)?;
    let warm_rounds = args.num("warm", 10)?;
    let fetches = args.num("fetches", 50)?;
    let server = Server {
        url: url.clone(),
        token,
        http: reqwest::Client::builder()
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| e.to_string())?,
    };

    let (mut cold, mut cold_post, mut cold_ticket, mut cold_page) =
        (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    let (mut warm, mut warm_post, mut reload) = (Vec::new(), Vec::new(), Vec::new());
    let (mut proxied, mut inside) = (Vec::new(), Vec::new());
    let (mut script, mut script_size) = (String::new(), 0);
    for _ in 0..cold_rounds {
        let job = server
            .json(
                server
                    .http
                    .post(format!("{url}/v1/jobs"))
                    .json(&json!({"kind": "shell", "command": JOB, "timeout_secs": 600})),
                "POST /v1/jobs",
            )
            .await?;
        let id = job["id"]
            .as_str()
            .ok_or_else(|| format!("POST /v1/jobs gave no id: {job}"))?
            .to_string();
        let state = server.wait_past(&id, &["queued"]).await?;
        if state != "running" {
            return Err(format!("job {id} is {state}, not running"));
        }

        let first = server.load(&id).await?;
        cold.push(first.post + first.ticket + first.page);
        cold_post.push(first.post);
        cold_ticket.push(first.ticket);
        cold_page.push(first.page);
        for _ in 0..warm_rounds {
            let l = server.load(&id).await?;
            warm.push(l.post + l.ticket + l.page);
            warm_post.push(l.post);
            let origin = l.home.split("/v1/").next().unwrap_or_default();
            let t = Instant::now();
            server.page(origin, &l.home, &l.cookie).await?;
            reload.push(t.elapsed());
        }

        // The first script of the page, both ways; the first fetch of each
        // run (the connection's setup) is left out.
        let src = first_script(&first.html)
            .ok_or_else(|| format!("no script in the Lab's page: {:.400}", first.html))?;
        // Jupyter names its static files from the root; the job's shell
        // reads the path as one word.
        if !src.starts_with('/') || src.contains(char::is_whitespace) {
            return Err(format!("a script at an unexpected path: {src:?}"));
        }
        let path = src;
        let origin = first.home.split("/v1/").next().unwrap_or_default();
        let (times, size) = host_curl(&format!("{origin}{path}"), &first.cookie, fetches + 1)?;
        proxied.extend_from_slice(&times[1..]);
        server
            .put(&id, "go", format!("{} {path}\n", fetches + 1))
            .await?;
        let (times, inner_size) = curl_times(&server.file(&id, "inside.txt").await?, fetches + 1)?;
        inside.extend_from_slice(&times[1..]);
        if size != inner_size {
            return Err(format!(
                "{path}: {size} bytes through the proxy, {inner_size} straight"
            ));
        }
        (script, script_size) = (path, size);

        server.put(&id, "release", String::new()).await?;
        let end = server.wait_past(&id, &["queued", "running"]).await?;
        if end != "succeeded" {
            return Err(format!("job {id} ended {end}"));
        }
    }

    let s = |v: &[Duration]| Summary::of(v);
    let (cold, cold_post, cold_ticket, cold_page) =
        (s(&cold), s(&cold_post), s(&cold_ticket), s(&cold_page));
    let (warm, warm_post, reload) = (s(&warm), s(&warm_post), s(&reload));
    let (proxied, inside) = (s(&proxied), s(&inside));
    println!("JupyterLab through cordon serve ({url}), {cold_rounds} fresh jobs");
    let line = |label: &str, v: &Summary| {
        println!(
            "  {label:<44} p50 {:>9} ms  p90 {:>9} ms  (n {})",
            ms(v.p50),
            ms(v.p90),
            v.n
        );
    };
    line("cold: POST …/lab to the page (Jupyter starts)", &cold);
    line("  of which POST …/lab", &cold_post);
    line("  of which ticket → cookie", &cold_ticket);
    line("  of which the page", &cold_page);
    line("warm: POST …/lab to the page (Lab open)", &warm);
    line("  of which POST …/lab", &warm_post);
    line("reload: the page with the cookie", &reload);
    println!(
        "  cold/warm p50 {:.1}; cold/reload p50 {:.1}",
        cold.p50 / warm.p50,
        cold.p50 / reload.p50
    );
    let file = script.split('?').next().unwrap_or_default();
    let file = file.rsplit('/').next().unwrap_or_default();
    println!("  {file} ({script_size} bytes), {fetches} fetches per job on one connection (curl):");
    line("  through the proxy (host, Lab's origin)", &proxied);
    line("  straight to Jupyter's socket (in sandbox)", &inside);
    println!(
        "  proxy/straight p50 {:.2}, p90 {:.2}; the proxy adds {} ms at p50",
        proxied.p50 / inside.p50,
        proxied.p90 / inside.p90,
        ms(proxied.p50 - inside.p50)
    );
    Ok(Json::obj([
        ("url", Json::str(url)),
        ("cold_rounds", Json::Num(cold_rounds as f64)),
        ("cold", cold.json()),
        ("cold_post", cold_post.json()),
        ("cold_ticket", cold_ticket.json()),
        ("cold_page", cold_page.json()),
        ("warm", warm.json()),
        ("warm_post", warm_post.json()),
        ("reload", reload.json()),
        ("cold_warm_ratio_p50", Json::Num(cold.p50 / warm.p50)),
        ("script", Json::str(file)),
        ("script_bytes", Json::Num(script_size as f64)),
        ("script_proxied", proxied.json()),
        ("script_inside", inside.json()),
        ("script_ratio_p50", Json::Num(proxied.p50 / inside.p50)),
        ("script_ratio_p90", Json::Num(proxied.p90 / inside.p90)),
    ]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_the_first_script_and_reads_curl() {
        let html = r#"<link href="/x.css"><script src="/b/static/lab/main.1f.js?v=1f"></script>"#;
        assert_eq!(
            first_script(html).as_deref(),
            Some("/b/static/lab/main.1f.js?v=1f")
        );
        assert_eq!(first_script("<script>1</script>"), None);
        let (t, size) = curl_times("200 10 0.001\n200 10 0.002\n", 2).unwrap();
        assert_eq!((t.len(), size), (2, 10));
        assert!(curl_times("404 10 0.001\n", 1).is_err());
        assert!(curl_times("200 10 0.001\n", 2).is_err());
    }
}
