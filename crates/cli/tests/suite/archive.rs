//! `cordon serve --archive s3://…` against a local S3-compatible server: a
//! finished job's workspace goes up as one tar with its index, the local
//! copy goes, and the files API serves it from the archive, read-only,
//! with links followed only within the workspace; another node (another
//! data directory over the same database) serves it too; `--keep-workspaces`
//! removes it from the archive; a bad archive stops the server with a
//! clear error.

use crate::support;

use std::path::Path;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::s3::S3;
use support::serve::{Started, free_port, http, job, spawn_env, submit, token};

/// `cordon serve` with `home`, over the archive, with `extra` flags.
fn serve(home: &Path, s3: &S3, archive: &str, extra: &[&str]) -> Started {
    let listen = format!("127.0.0.1:{}", free_port());
    let mut args = vec!["serve", "--listen", &listen, "--archive", archive];
    args.extend_from_slice(extra);
    let env = s3.env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    spawn_env(home, &args, &env)
}

fn get(base: &str, token: &str, path: &str) -> reqwest::blocking::Response {
    http()
        .get(format!("{base}{path}"))
        .bearer_auth(token)
        .send()
        .unwrap()
}

/// The job once `done(job)` holds, within `patience`.
fn job_until(
    base: &str,
    token: &str,
    id: &str,
    patience: Duration,
    done: impl Fn(&Value) -> bool,
) -> Value {
    let deadline = Instant::now() + patience;
    loop {
        let job = job(base, token, id);
        if done(&job) {
            return job;
        }
        assert!(Instant::now() < deadline, "{job}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

fn numbers() -> String {
    (1..=60_000).map(|n| format!("{n}\n")).collect()
}

#[test]
fn a_finished_job_is_served_from_the_archive_by_any_node_and_expires_there() {
    let Some(s3) = S3::start("cordon-archive") else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let archive = "s3://cordon-archive/deploy-1";
    let a = serve(home.path(), &s3, archive, &[]);
    let tok = a.token.clone().expect("the first token");
    let other = token(home.path(), "other");

    // What a hostile job leaves: a link out, a link within, a FIFO.
    let id = submit(
        &a.url,
        &tok,
        json!({"kind": "shell", "command":
            "mkdir -p src/deep && printf 'hello\\n' > README.md && seq 1 60000 > src/deep/numbers.txt \
             && ln -s ../../../../etc/passwd src/out && ln -s src/deep inside && mkfifo fifo"}),
    );
    let job = job_until(&a.url, &tok, &id, Duration::from_secs(60), |j| {
        !j["workspace_archived_at"].is_null()
    });
    assert_eq!(job["state"], "succeeded", "{job}");

    // Up as one tar and its index, under the prefix; the local copy goes.
    let key = format!("deploy-1/jobs/{id}");
    let tar = s3.object(&format!("{key}/workspace.tar"));
    assert_eq!(tar.status(), 200);
    assert!(tar.bytes().unwrap().len() > 350_000);
    assert_eq!(s3.object(&format!("{key}/index.json")).status(), 200);
    let local = home
        .path()
        .join(format!("data/cordon/server/jobs/{id}/workspace"));
    let deadline = Instant::now() + Duration::from_secs(10);
    while local.exists() {
        assert!(Instant::now() < deadline, "the local copy stays");
        std::thread::sleep(Duration::from_millis(100));
    }

    let files = |base: &str| {
        let r = get(base, &tok, &format!("/v1/jobs/{id}/files/README.md"));
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
        assert_eq!(r.text().unwrap(), "hello\n");
        // Through the link within, the same bytes as directly.
        for path in ["src/deep/numbers.txt", "inside/numbers.txt"] {
            let r = get(base, &tok, &format!("/v1/jobs/{id}/files/{path}"));
            assert_eq!(r.status(), 200, "{path}");
            assert_eq!(r.text().unwrap(), numbers(), "{path}");
        }
        // The link out is refused, not followed.
        let r = get(base, &tok, &format!("/v1/jobs/{id}/files/src/out"));
        assert_eq!(r.status(), 400);
        let body = r.text().unwrap();
        assert!(body.contains("outside the workspace"), "{body}");
        assert!(!body.contains("root:"), "{body}");
        let root: Value = get(base, &tok, &format!("/v1/jobs/{id}/files"))
            .json()
            .unwrap();
        let names: Vec<(&str, &str)> = root["entries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| (e["name"].as_str().unwrap(), e["type"].as_str().unwrap()))
            .collect();
        assert_eq!(
            names,
            [
                ("README.md", "file"),
                ("inside", "symlink"),
                ("src", "directory")
            ],
            "{root}"
        );
        let src: Value = get(base, &tok, &format!("/v1/jobs/{id}/files/src"))
            .json()
            .unwrap();
        assert_eq!(src["path"], "/workspace/src");
        assert_eq!(src["entries"].as_array().unwrap().len(), 2, "{src}");
        // Another tenant sees nothing; nobody writes an archived workspace.
        let r = get(base, &other, &format!("/v1/jobs/{id}/files/README.md"));
        assert_eq!(r.status(), 404);
        let r = http()
            .put(format!("{base}/v1/jobs/{id}/files/new.txt"))
            .bearer_auth(&tok)
            .body("x")
            .send()
            .unwrap();
        assert_eq!(r.status(), 409);
        assert_eq!(r.json::<Value>().unwrap()["error"]["code"], "archived");
    };
    files(&a.url);

    // Another node: its own data directory, the same database and archive.
    drop(a);
    let elsewhere = home.path().join("node-b");
    let b = serve(
        home.path(),
        &s3,
        archive,
        &[
            "--data-dir",
            elsewhere.to_str().unwrap(),
            "--keep-workspaces",
            "4s",
        ],
    );
    files(&b.url);
    assert!(!elsewhere.join(format!("jobs/{id}")).exists());

    // Past --keep-workspaces, gone from the archive too.
    job_until(&b.url, &tok, &id, Duration::from_secs(30), |j| {
        !j["workspace_removed_at"].is_null()
    });
    assert_eq!(s3.object(&format!("{key}/workspace.tar")).status(), 404);
    assert_eq!(s3.object(&format!("{key}/index.json")).status(), 404);
    let r = get(&b.url, &tok, &format!("/v1/jobs/{id}/files/README.md"));
    assert_eq!(r.status(), 410);
}

#[test]
fn an_archive_the_server_cannot_use_stops_it_with_a_clear_error() {
    let Some(s3) = S3::start("cordon-exists") else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let run = |archive: &str, secret: &str| {
        let mut env = s3.env();
        env.retain(|(k, _)| *k != "AWS_SECRET_ACCESS_KEY");
        std::process::Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(["serve", "--listen", "127.0.0.1:0", "--archive", archive])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", home.path())
            .env("XDG_DATA_HOME", home.path().join("data"))
            .envs(env)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .output()
            .unwrap()
    };
    // No such bucket: the start fails, naming the archive, not the secret.
    let out = run("s3://no-such-bucket/x", "hush-hush-secret");
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("s3://no-such-bucket/x"), "{err}");
    assert!(!err.contains("hush-hush"), "{err}");
    // Not an archive at all: refused before anything starts.
    for (bad, says) in [
        ("http://cordon-exists", "s3://BUCKET"),
        ("s3://key:secret@cordon-exists", "credentials"),
    ] {
        let out = run(bad, "x");
        assert_eq!(out.status.code(), Some(125), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{bad}: {err}");
    }
}

/// In a deployment of many machines no worker has a queued job's
/// workspace yet: a file written to it waits in the archive, and the
/// worker that takes the job writes it into the workspace first.
#[test]
fn files_written_to_a_queued_job_wait_in_the_archive_for_its_worker() {
    let Some(s3) = S3::start("cordon-inbox") else {
        return;
    };
    let home = tempfile::tempdir().unwrap();
    let key = "test-cluster-key-0123456789abcdef0123456789";
    let start = |workers: &str| {
        let listen = format!("127.0.0.1:{}", free_port());
        let mut env = s3.env();
        env.push(("CORDON_CLUSTER_KEY", key.into()));
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let args = [
            "serve",
            "--listen",
            &listen,
            "--archive",
            "s3://cordon-inbox",
            "--workers",
            workers,
        ];
        spawn_env(home.path(), &args, &env)
    };
    let api = start("0");
    let tok = api.token.clone().expect("the first token");
    let id = submit(
        &api.url,
        &tok,
        json!({"kind": "shell", "command": "cat in/data.txt; ls -A"}),
    );
    let put = |path: &str, body: &str| {
        http()
            .put(format!("{}/v1/jobs/{id}/files/{path}", api.url))
            .bearer_auth(&tok)
            .body(body.to_string())
            .send()
            .unwrap()
    };
    assert_eq!(put("in/data.txt", "first").status(), 201);
    let again = put("in/data.txt", "staged before it ran\n");
    assert_eq!(again.status(), 200);
    assert_eq!(again.json::<Value>().unwrap()["created"], false);
    // Paths that leave the workspace are refused as on disk.
    for bad in ["..%2Fescape", "%2Fetc%2Fpasswd", "in/..%2F..%2Fx"] {
        let r = put(bad, "x");
        assert_eq!(r.status(), 400, "{bad}");
    }
    let r = get(&api.url, &tok, &format!("/v1/jobs/{id}/files/in/data.txt"));
    assert_eq!(r.status(), 409);
    let body = r.text().unwrap();
    assert!(body.contains("wait for it in the archive"), "{body}");

    // A process that runs jobs takes it, and the file with it.
    drop(api);
    let worker = start("1");
    let job = job_until(&worker.url, &tok, &id, Duration::from_secs(60), |j| {
        !["queued", "running"].contains(&j["state"].as_str().unwrap())
    });
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["stdout"], "staged before it ran\nin\n", "{job}");
    let staged = hex(b"in/data.txt");
    assert_eq!(
        s3.object(&format!("jobs/{id}/inbox/{staged}")).status(),
        404,
        "taken out of the archive"
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
