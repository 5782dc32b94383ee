//! `serve-fork`: forking a sandbox of the sandbox API, 1 and 10 at once,
//! next to what a client without fork does for the same result: create
//! as many sandboxes and upload the parent's workspace (its tar, taken
//! once beforehand, not timed) into each, concurrently.
//!
//! The parent's workspace is `--files` files of 20 KB of random bytes.
//! Each round times both ways for each count, alternating, and deletes
//! what it made (not timed). `--backend microvm` makes every sandbox a
//! microVM, whose fork on virtio-fs is from its memory, its processes
//! carried (the parent runs a counter, which each fork is checked to go
//! on with, untimed).

use std::time::{Duration, Instant};

use cordon_bench::cli::Args;
use cordon_bench::stats::{Json, Summary, ms};
use futures_util::future::join_all;
use serde_json::{Value, json};

/// The counts measured.
const COUNTS: [usize; 2] = [1, 10];

pub async fn run(args: &Args) -> Result<Json, String> {
    let (url, token) = args.server()?;
    let rounds = args.num("rounds", 10)?;
    let warmup = args.num("warmup", 1)?;
    let files = args.num("files", 1000)?;
    let backend = args.str("backend").unwrap_or("native").to_string();
    let api = Api {
        client: reqwest::Client::new(),
        url,
        token,
        backend,
    };
    let parent = api.create().await?;
    if api.backend == "microvm" {
        api.call(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{parent}/commands"),
            Some(json!({"cmd": "sh -c 'i=0; while :; do i=$((i+1)); echo $i > /tmp/.count; mv /tmp/.count /tmp/count; sleep 0.1; done'", "background": true})),
        )
        .await?;
    }
    let made = api
        .call(
            reqwest::Method::POST,
            &format!("/v1/sandboxes/{parent}/commands"),
            Some(json!({"cmd": format!(
                "mkdir -p data && for i in $(seq {files}); do head -c 20000 /dev/urandom > data/f$i; done; du -sk data"
            )})),
        )
        .await?;
    let size = made["stdout"].as_str().unwrap_or("").trim().to_string();
    let tar = api
        .client
        .get(api.at(&format!(
            "/v1/sandboxes/{parent}/fs/archive?path=/workspace"
        )))
        .bearer_auth(&api.token)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .map_err(|e| format!("the parent's workspace: {e}"))?
        .bytes()
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "fork of a {} sandbox whose workspace is {files} files ({size}; a {} KB tar), {rounds} rounds",
        api.backend,
        tar.len() >> 10
    );
    let mut report = vec![
        ("backend", Json::Str(api.backend.clone())),
        ("files", Json::Num(files as f64)),
        ("tar_bytes", Json::Num(tar.len() as f64)),
        ("rounds", Json::Num(rounds as f64)),
    ];
    for n in COUNTS {
        let (mut forked, mut copied) = (Vec::new(), Vec::new());
        for i in 0..warmup + rounds {
            let t = Instant::now();
            let ids = api.fork(&parent, n).await?;
            let fork_time = t.elapsed();
            if api.backend == "microvm" && i == 0 {
                api.check_carried(&ids).await?;
            }
            api.delete_all(&ids).await?;
            let t = Instant::now();
            let ids = api.create_and_upload(n, &tar).await?;
            let copy_time = t.elapsed();
            api.delete_all(&ids).await?;
            if i >= warmup {
                forked.push(fork_time);
                copied.push(copy_time);
            }
        }
        let (f, c) = (Summary::of(&forked), Summary::of(&copied));
        println!(
            "  {n:>2} at once: fork p50 {} ms (p90 {}); create + upload p50 {} ms (p90 {}); ratio {:.2}",
            ms(f.p50),
            ms(f.p90),
            ms(c.p50),
            ms(c.p90),
            c.p50 / f.p50
        );
        report.push((
            if n == 1 { "count_1" } else { "count_10" },
            Json::obj(vec![
                ("fork", f.json()),
                ("create_and_upload", c.json()),
                ("ratio_p50", Json::Num(c.p50 / f.p50)),
            ]),
        ));
    }
    api.delete_all(&[parent]).await?;
    Ok(Json::obj(report))
}

struct Api {
    client: reqwest::Client,
    url: String,
    token: String,
    backend: String,
}

impl Api {
    fn at(&self, path: &str) -> String {
        format!("{}{path}", self.url.trim_end_matches('/'))
    }

    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> Result<Value, String> {
        let mut req = self
            .client
            .request(method, self.at(path))
            .bearer_auth(&self.token)
            .timeout(Duration::from_secs(300));
        if let Some(b) = body {
            req = req.json(&b);
        }
        let r = req.send().await.map_err(|e| format!("{path}: {e}"))?;
        let status = r.status();
        let text = r.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("{path}: {status}: {text}"));
        }
        Ok(serde_json::from_str(&text).unwrap_or(Value::Null))
    }

    async fn create(&self) -> Result<String, String> {
        let made = self
            .call(
                reqwest::Method::POST,
                "/v1/sandboxes",
                Some(json!({"timeout_secs": 3600, "backend": self.backend})),
            )
            .await?;
        made["id"]
            .as_str()
            .map(String::from)
            .ok_or_else(|| format!("no id in {made}"))
    }

    /// Whether each fork goes on with the parent's counter: a fork from
    /// memory, not one of files.
    async fn check_carried(&self, ids: &[String]) -> Result<(), String> {
        for id in ids {
            let r = self
                .call(
                    reqwest::Method::POST,
                    &format!("/v1/sandboxes/{id}/commands"),
                    Some(json!({"cmd": "a=$(cat /tmp/count); sleep 0.5; b=$(cat /tmp/count); [ \"$b\" -gt \"$a\" ] && echo carried"})),
                )
                .await?;
            if r["stdout"] != "carried\n" {
                return Err(format!(
                    "fork {id} does not go on with the parent's process: {r}"
                ));
            }
        }
        Ok(())
    }

    async fn fork(&self, parent: &str, n: usize) -> Result<Vec<String>, String> {
        let made = self
            .call(
                reqwest::Method::POST,
                &format!("/v1/sandboxes/{parent}/fork?count={n}"),
                None,
            )
            .await?;
        Ok(made["sandboxes"]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|s| s["id"].as_str().map(String::from))
                    .collect()
            })
            .unwrap_or_default())
    }

    async fn create_and_upload(&self, n: usize, tar: &[u8]) -> Result<Vec<String>, String> {
        let made = join_all((0..n).map(|_| async {
            let id = self.create().await?;
            self.client
                .put(self.at(&format!("/v1/sandboxes/{id}/fs/archive?path=/workspace")))
                .bearer_auth(&self.token)
                .body(tar.to_vec())
                .send()
                .await
                .and_then(reqwest::Response::error_for_status)
                .map_err(|e| format!("upload: {e}"))?;
            Ok::<_, String>(id)
        }))
        .await;
        made.into_iter().collect()
    }

    async fn delete_all(&self, ids: &[String]) -> Result<(), String> {
        let deleted = join_all(ids.iter().map(|id| async move {
            let path = format!("/v1/sandboxes/{id}");
            self.call(reqwest::Method::DELETE, &path, None).await
        }))
        .await;
        for r in deleted {
            r?;
        }
        Ok(())
    }
}
