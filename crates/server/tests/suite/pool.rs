//! Warm pools: a job of the pool's shape runs in a sandbox made before it
//! was submitted, and one that never ran anything: nothing an earlier job
//! left (files, processes) is there.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// A counter or gauge of `/metrics`; one not yet made is 0.
fn counted(text: &str, series: &str) -> f64 {
    sample(text, series).unwrap_or(0.0)
}

/// Waits until the pools hold `n` ready sandboxes.
async fn ready(s: &TestServer, n: f64) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let text = scrape(s).await;
        if counted(&text, "cordon_pool_ready") == n {
            return;
        }
        assert!(Instant::now() < deadline, "the pool never held {n}: {text}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn pooled(db: Db, pool: &'static [&'static str]) -> Option<TestServer> {
    TestServer::start_with(db, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.workers = 2;
        c.pool = pool.iter().map(|p| p.parse().unwrap()).collect();
    })
    .await
}

/// The attack: a job leaves files in every writable place and processes
/// that outlive it (detached, and one that renamed itself); the jobs after
/// it, each in a pooled sandbox, find none of it.
async fn a_pooled_job_sees_nothing_of_the_last(db: Db) {
    let Some(s) = pooled(db, &["2"]).await else {
        return;
    };
    let t = s.token("acme").await;
    ready(&s, 2.0).await;

    let dirty = s
        .submit(
            &t,
            shell(
                "echo left > /workspace/left; echo left > /tmp/left; \
                 (echo left > /dev/shm/left) 2>/dev/null; \
                 setsid sh -c 'exec -a lurker sleep 1000' </dev/null >/dev/null 2>&1 & \
                 nohup sleep 999 </dev/null >/dev/null 2>&1 & \
                 echo $$ > /workspace/pid; sleep 0.2; echo dirty",
            ),
        )
        .await;
    let done = s.wait(&t, &dirty).await;
    assert_eq!(done["state"], "succeeded", "{done}");

    for _ in 0..3 {
        ready(&s, 2.0).await;
        let clean = s
            .submit(
                &t,
                shell(
                    "ls -A /workspace /tmp; ls /dev/shm 2>/dev/null; \
                     for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
                ),
            )
            .await;
        let done = s.wait(&t, &clean).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        let out = done["stdout"].as_str().unwrap();
        for left in ["left", "lurker", "sleep 1000", "sleep 999", "pid"] {
            assert!(!out.contains(left), "{left:?} in a pooled sandbox:\n{out}");
        }
    }
    let text = scrape(&s).await;
    // Every job took one, and the pool was filled again behind them.
    assert_eq!(counted(&text, "cordon_pool_hits_total"), 4.0, "{text}");
    assert_eq!(counted(&text, "cordon_pool_taken_total"), 4.0, "{text}");
    ready(&s, 2.0).await;
}

/// Only a job of the pool's shape takes one, and gets the shape's limits;
/// the others run as without a pool.
async fn only_the_pools_shape_takes_one(db: Db) {
    let Some(s) = pooled(db, &["1", "1,memory=256M,disk=64M"]).await else {
        return;
    };
    let t = s.token("acme").await;
    ready(&s, 2.0).await;
    for other in [
        json!({"kind": "shell", "command": "true", "memory": "128M"}),
        json!({"kind": "shell", "command": "true", "network": "loopback"}),
        json!({"kind": "shell", "command": "true", "disk": "64M"}),
    ] {
        let id = s.submit(&t, other).await;
        assert_eq!(s.wait(&t, &id).await["state"], "succeeded");
    }
    assert_eq!(counted(&scrape(&s).await, "cordon_pool_taken_total"), 0.0);

    // Its limits are the pool's: 300 MB held is past its 256M.
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "command": "head -c 300000000 /dev/zero | tail > /dev/null", "memory": "256M", "disk": "64M"}),
        )
        .await;
    let done = s.wait(&t, &id).await;
    assert_eq!(done["state"], "failed", "{done}");
    assert!(done["error"].as_str().unwrap().contains("memory"), "{done}");
    let id = s
        .submit(&t, shell("head -c 300000000 /dev/zero | tail > /dev/null"))
        .await;
    assert_eq!(s.wait(&t, &id).await["state"], "succeeded");
    assert_eq!(counted(&scrape(&s).await, "cordon_pool_hits_total"), 2.0);
}

/// What a server killed with its pool full left is removed by the next
/// one, and pooled sandboxes are closed by a shutdown.
async fn leftovers_are_removed(db: Db) {
    let tmp = tempfile::tempdir().unwrap();
    let Some((url, _pg)) = database(db, tmp.path()) else {
        return;
    };
    let data = tmp.path().join("data");
    let left = data.join("jobs/job_0123456789abcdef01234567");
    std::fs::create_dir_all(left.join("workspace")).unwrap();
    std::fs::create_dir_all(data.join("pool")).unwrap();
    std::fs::write(data.join("pool/job_0123456789abcdef01234567"), "").unwrap();
    // Not listed: a job's, whatever its age.
    let kept = data.join("jobs/job_fedcba9876543210fedcba98");
    std::fs::create_dir_all(kept.join("workspace")).unwrap();

    let s = TestServer::start_at(tmp.path(), &url, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.pool = vec!["2".parse().unwrap()];
    })
    .await;
    ready(&s, 2.0).await;
    assert!(!left.exists(), "a leftover of the last run's pool is kept");
    assert!(kept.exists());
    let listed = std::fs::read_dir(data.join("pool")).unwrap().count();
    assert_eq!(listed, 2);
    s.stop().await.unwrap();
    let listed = std::fs::read_dir(data.join("pool")).unwrap().count();
    assert_eq!(listed, 0, "a stopped server's pool is not closed");
    let jobs: Vec<_> = std::fs::read_dir(data.join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        jobs,
        [std::ffi::OsString::from("job_fedcba9876543210fedcba98")]
    );
}

/// Files put into a queued job are in its pooled sandbox when it runs; a
/// job cancelled while queued gives its pooled sandbox back at once.
async fn queued_jobs_keep_their_sandbox(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.workers = 1;
        c.pool = vec!["1".parse().unwrap()];
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    ready(&s, 1.0).await;
    let held = s
        .submit(
            &t,
            shell("while [ ! -f /workspace/release ]; do sleep 0.05; done"),
        )
        .await;
    s.wait_running(&t, &held).await;
    ready(&s, 1.0).await;
    let queued = s.submit(&t, shell("cat /workspace/x.txt")).await;
    let put = s
        .client
        .put(s.url(&format!("/v1/jobs/{queued}/files/x.txt")))
        .bearer_auth(&t)
        .body("put before it ran")
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{put:?}");
    ready(&s, 1.0).await;
    let cancelled = s.submit(&t, shell("true")).await;
    let (code, body) = s
        .post(&t, &format!("/v1/jobs/{cancelled}/cancel"), json!({}))
        .await;
    assert_eq!(code, 200, "{body}");
    s.release(&t, &held).await;
    assert_eq!(s.wait(&t, &held).await["state"], "succeeded");
    let done = s.wait(&t, &queued).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    assert_eq!(done["stdout"], "put before it ran");
    assert_eq!(s.wait(&t, &cancelled).await["state"], "cancelled");
    let text = scrape(&s).await;
    assert_eq!(counted(&text, "cordon_pool_taken_total"), 3.0, "{text}");
    assert_eq!(counted(&text, "cordon_pool_hits_total"), 2.0, "{text}");
}

/// A pool is refilled once the job that took its sandbox has ended, not
/// while the job's command runs: making a sandbox takes the CPU the
/// command would have.
async fn a_pool_refills_after_the_job_not_during_it(db: Db) {
    let Some(s) = pooled(db, &["1"]).await else {
        return;
    };
    let t = s.token("acme").await;
    ready(&s, 1.0).await;
    let id = s.submit(&t, shell("sleep 0.8")).await;
    s.wait_running(&t, &id).await;
    // Making one takes well under this: had it begun at the take, it
    // would be ready now.
    let until = Instant::now() + Duration::from_millis(400);
    while Instant::now() < until {
        let text = scrape(&s).await;
        assert_eq!(
            counted(&text, "cordon_pool_ready"),
            0.0,
            "refilled while its job ran"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(s.wait(&t, &id).await["state"], "succeeded");
    ready(&s, 1.0).await;
}

/// A pooled job starts as it is posted when a worker slot is free (no
/// wake, no claim: the answer already says `running`); with every slot
/// busy it is queued as any other and runs in its turn, so a pool never
/// runs more jobs at once than there are workers.
async fn a_pooled_job_starts_as_posted_when_a_slot_is_free(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.workers = 1;
        c.pool = vec!["2".parse().unwrap()];
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    ready(&s, 2.0).await;
    let (code, first) = s
        .post(
            &t,
            "/v1/jobs",
            shell("while [ ! -f /workspace/release ]; do sleep 0.05; done"),
        )
        .await;
    assert_eq!(code, 202, "{first}");
    assert_eq!(first["state"], "running", "{first}");
    let first = first["id"].as_str().unwrap().to_string();
    let (code, second) = s.post(&t, "/v1/jobs", shell("echo second")).await;
    assert_eq!(code, 202, "{second}");
    assert_eq!(second["state"], "queued", "the only slot is busy: {second}");
    let second = second["id"].as_str().unwrap().to_string();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (_, waiting) = s.get(&t, &format!("/v1/jobs/{second}")).await;
    assert_eq!(waiting["state"], "queued", "{waiting}");
    s.release(&t, &first).await;
    let a = s.wait(&t, &first).await;
    let b = s.wait(&t, &second).await;
    assert_eq!(a["state"], "succeeded", "{a}");
    assert_eq!(b["state"], "succeeded", "{b}");
    assert_eq!(b["stdout"], "second\n");
    assert!(
        b["started_at"].as_str().unwrap() >= a["finished_at"].as_str().unwrap(),
        "{a} {b}"
    );
    let text = scrape(&s).await;
    assert_eq!(counted(&text, "cordon_pool_hits_total"), 2.0, "{text}");
}

/// The job workspace a server keeps made ahead, once it is ready: the one
/// listed in its ledger that is not in `not`.
async fn spare(s: &TestServer, not: &[&str]) -> String {
    ready_ahead(s, "job_", not).await
}

/// The attack, without a pool: the job workspace a server makes ahead
/// (once a job has made its own) is fresh. A job leaves files and
/// processes; the next takes the spare, under its id, and finds nothing
/// of them; a job of another disk budget makes its own; a stopped server
/// removes the spare.
async fn a_spare_workspace_is_fresh(db: Db) {
    if !volumes() {
        return;
    }
    let Some(mut s) = TestServer::start_with(db, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.workers = 2;
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    assert!(!s.dir.join("data/pool").exists(), "a spare before any job");
    let dirty = s
        .submit(
            &t,
            shell(
                "echo left > /workspace/left; echo left > /tmp/left; \
                 setsid sh -c 'exec -a lurker sleep 1000' </dev/null >/dev/null 2>&1 & \
                 echo dirty",
            ),
        )
        .await;
    assert_eq!(s.wait(&t, &dirty).await["state"], "succeeded");
    let made = spare(&s, &[]).await;
    let ws = s.dir.join("data/jobs").join(&made).join("workspace");
    assert!(ws.is_dir());
    assert_eq!(
        std::fs::read_dir(&ws).unwrap().count(),
        0,
        "a spare with files"
    );

    let clean = s
        .submit(
            &t,
            shell(
                "ls -A /workspace /tmp; \
                 for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done",
            ),
        )
        .await;
    assert_eq!(clean, made, "the next job did not take the spare");
    let done = s.wait(&t, &clean).await;
    assert_eq!(done["state"], "succeeded", "{done}");
    let out = done["stdout"].as_str().unwrap();
    for left in ["left", "lurker", "sleep 1000"] {
        assert!(
            !out.contains(left),
            "{left:?} in a spare workspace's job:\n{out}"
        );
    }
    // Another is made once the job has ended.
    let next = spare(&s, &[&made]).await;
    let other = s
        .submit(
            &t,
            json!({"kind": "shell", "command": "true", "disk": "64M"}),
        )
        .await;
    assert_ne!(other, next, "a job of another budget took the spare");
    assert_eq!(s.wait(&t, &other).await["state"], "succeeded");
    assert_eq!(spare(&s, &[]).await, next);
    let text = scrape(&s).await;
    assert_eq!(
        counted(&text, "cordon_workspaces_ahead_taken_total"),
        1.0,
        "{text}"
    );

    let data = s.dir.join("data");
    // Stopped, its directory kept until the end of the test.
    s.running.take().unwrap().shutdown().await;
    assert!(
        !data.join("jobs").join(&next).exists(),
        "a stopped server left its spare"
    );
    assert_eq!(std::fs::read_dir(data.join("pool")).unwrap().count(), 0);
}

on_both!(
    a_spare_workspace_is_fresh,
    a_pooled_job_starts_as_posted_when_a_slot_is_free,
    a_pooled_job_sees_nothing_of_the_last,
    a_pool_refills_after_the_job_not_during_it,
    only_the_pools_shape_takes_one,
    leftovers_are_removed,
    queued_jobs_keep_their_sandbox
);

/// A pooled microVM has run cordon's warm-up (`bash -c true`) before a
/// job takes it: the first job finds nothing of it, and the next finds
/// nothing of a job that left files and processes behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_microvm_holds_nothing_of_its_warm_up_or_the_last_job() {
    let Some(s) = pooled(Db::Sqlite, &["1,backend=microvm"]).await else {
        return;
    };
    let t = s.token("acme").await;
    let vm = |command: &str| json!({"kind": "shell", "backend": "microvm", "command": command});
    let look = "ls -A /workspace /tmp; echo ==; \
                for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done";
    for round in 0..2 {
        ready(&s, 1.0).await;
        let id = s.submit(&t, vm(look)).await;
        let done = s.wait(&t, &id).await;
        assert_eq!(done["state"], "succeeded", "{done}");
        let out = done["stdout"].as_str().unwrap();
        let (files, processes) = out.split_once("==\n").unwrap();
        assert_eq!(files, "/tmp:\n\n/workspace:\n", "round {round}");
        for left in ["lurker", "sleep", "bash -c true"] {
            assert!(
                !processes.contains(left),
                "round {round}: {left:?} in a pooled microVM:\n{processes}"
            );
        }
        if round == 0 {
            ready(&s, 1.0).await;
            let dirty = s
                .submit(
                    &t,
                    vm("echo left > /workspace/left; echo left > /tmp/left; \
                        setsid sh -c 'exec -a lurker sleep 1000' </dev/null >/dev/null 2>&1 & \
                        echo dirty"),
                )
                .await;
            assert_eq!(s.wait(&t, &dirty).await["state"], "succeeded");
        }
    }
    let text = scrape(&s).await;
    assert_eq!(counted(&text, "cordon_pool_hits_total"), 3.0, "{text}");
}

/// A pool of microVMs of an image without a shell fills all the same:
/// its warm-up cannot start, and nothing of it runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_of_microvms_without_a_shell_fills() {
    let layout = tempfile::tempdir().unwrap();
    cordon_testkit::oci::write_image(
        layout.path(),
        "v1",
        &[cordon_testkit::oci::layer(&[(
            "etc/os-release",
            "ID=shell-less\n",
        )])],
        json!({"Env": ["PATH=/bin"]}),
    );
    let source = format!("oci:{}:v1", layout.path().display());
    let store = tempfile::tempdir().unwrap();
    let Some(s) = TestServer::start_with(Db::Sqlite, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.images = catalog(&[format!("bare={source}")]);
        c.image_store = Some(store.path().to_path_buf());
        c.pool = vec!["1,image=bare,backend=microvm".parse().unwrap()];
    })
    .await
    else {
        return;
    };
    ready(&s, 1.0).await;
}

/// A server with a busybox image `tiny` (run as its user `app`), its
/// store in `store`, pooled as `pool` says.
async fn with_tiny(
    layout: &std::path::Path,
    store: &std::path::Path,
    pool: &[&str],
    tune: impl FnOnce(&mut cordon_server::ServerConfig),
) -> Option<TestServer> {
    use cordon_testkit::oci::{busybox_layer, write_image};
    write_image(
        layout,
        "v1",
        &[busybox_layer()],
        json!({"Env": ["PATH=/bin"], "User": "app"}),
    );
    let source = format!("tiny=oci:{}:v1", layout.display());
    TestServer::start_with(Db::Sqlite, |c| {
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.images = catalog(&[source]);
        c.image_store = Some(store.to_path_buf());
        c.pool = pool.iter().map(|p| p.parse().unwrap()).collect();
        tune(c);
    })
    .await
}

/// `cmd` run in sandbox `id` to its end: its output.
async fn in_sandbox(s: &TestServer, t: &str, id: &str, cmd: &str) -> String {
    let b = sandbox_command(s, t, id, json!({"cmd": cmd})).await;
    assert_eq!(b["exit_code"], 0, "{b}");
    b["stdout"].as_str().unwrap().to_string()
}

/// The attack on a pool of the sandbox API's (`for=sandboxes`): a sandbox
/// taken from it leaves files in every writable place and processes that
/// outlive their command, and goes on running; the sandboxes taken after
/// it find none of it. Each runs as a sandbox made for its request would:
/// its image's user, at home, its `env` in every command (compared with
/// one of another size, made without the pool). Jobs of the same image
/// do not take the sandboxes' pool.
#[tokio::test]
async fn a_pooled_sandbox_of_the_api_is_fresh_and_as_asked() {
    let (layout, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let Some(s) = with_tiny(
        layout.path(),
        store.path(),
        &["2,for=sandboxes,image=tiny"],
        |_| {},
    )
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    ready(&s, 2.0).await;
    let dirty = new_sandbox(&s, &t, json!({"image": "tiny"})).await;
    in_sandbox(
        &s,
        &t,
        &dirty,
        "echo left > /workspace/left; echo left > /tmp/left; \
         setsid sh -c 'exec -a lurker sleep 1000' </dev/null >/dev/null 2>&1 & \
         nohup sleep 999 </dev/null >/dev/null 2>&1 &",
    )
    .await;
    let look = "ls -A /workspace /tmp; ps -o args; \
                echo \"$APP_ENV $HOME $USER $LOGNAME $(id -u) $(pwd)\"";
    let asked = json!({"image": "tiny", "env": {"APP_ENV": "pooled"}});
    let mut ids = vec![dirty.clone()];
    for _ in 0..2 {
        ready(&s, 2.0).await;
        let id = new_sandbox(&s, &t, asked.clone()).await;
        assert!(!ids.contains(&id), "{id} twice");
        let out = in_sandbox(&s, &t, &id, look).await;
        for left in ["left", "lurker", "sleep 1000", "sleep 999"] {
            assert!(!out.contains(left), "{left:?} in a pooled sandbox:\n{out}");
        }
        assert!(
            out.ends_with("pooled /home/app app app 1000 /workspace\n"),
            "{out}"
        );
        ids.push(id);
    }
    let text = scrape(&s).await;
    assert_eq!(counted(&text, "cordon_pool_hits_total"), 3.0, "{text}");

    // Made without the pool, the same environment.
    let mut unpooled = asked.clone();
    unpooled["memory"] = json!("256M");
    let id = new_sandbox(&s, &t, unpooled).await;
    let out = in_sandbox(
        &s,
        &t,
        &id,
        "echo \"$APP_ENV $HOME $USER $LOGNAME $(id -u) $(pwd)\"",
    )
    .await;
    assert_eq!(out, "pooled /home/app app app 1000 /workspace\n");
    let job = s
        .submit(
            &t,
            json!({"kind": "shell", "image": "tiny", "command": "true"}),
        )
        .await;
    assert_eq!(s.wait(&t, &job).await["state"], "succeeded");
    let text = scrape(&s).await;
    assert_eq!(counted(&text, "cordon_pool_hits_total"), 3.0, "{text}");
}

/// A tag moved since the pool was filled is not run stale: the image's
/// digest for the tenant is checked as a sandbox takes a pooled one, and a
/// sandbox of the old image is closed, its files removed, and the new
/// sandbox made from the image as it is now.
#[tokio::test]
async fn a_pooled_sandbox_of_an_image_moved_since_is_not_taken() {
    use cordon_testkit::oci::{busybox_layer, layer, write_image};
    let (layout, store) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let Some(s) = with_tiny(
        layout.path(),
        store.path(),
        &["1,for=sandboxes,image=tiny"],
        |_| {},
    )
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    ready(&s, 1.0).await;
    let sandboxes = s.dir.join("data/sandboxes");
    let pooled: Vec<_> = std::fs::read_dir(&sandboxes)
        .unwrap()
        .flatten()
        .map(|e| e.file_name())
        .collect();
    assert_eq!(pooled.len(), 1, "{pooled:?}");
    write_image(
        layout.path(),
        "v1",
        &[busybox_layer(), layer(&[("etc/motd", "moved\n")])],
        json!({"Env": ["PATH=/bin"], "User": "app"}),
    );
    let id = new_sandbox(&s, &t, json!({"image": "tiny"})).await;
    assert_ne!(std::ffi::OsStr::new(&id), pooled[0].as_os_str());
    assert_eq!(in_sandbox(&s, &t, &id, "cat /etc/motd").await, "moved\n");
    assert!(
        !sandboxes.join(&pooled[0]).exists(),
        "the stale sandbox's files stayed"
    );
    let text = scrape(&s).await;
    assert_eq!(counted(&text, "cordon_pool_hits_total"), 0.0, "{text}");
}

/// A microVM of a sandboxes' pool is one the server can keep: paused to
/// disk, it outlives the server, and resumed by the next it has its
/// files, its process and its `env`, which the pool's sandbox was given
/// when it was taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_microvm_sandbox_outlives_its_server() {
    let dir = tempfile::tempdir().unwrap();
    let (db_url, _pg) = crate::common::database(Db::Sqlite, dir.path()).unwrap();
    let tune = |c: &mut cordon_server::ServerConfig| {
        c.vm.shares = cordon_sandbox::VmShares::VirtioFs;
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.pool = vec!["1,for=sandboxes,backend=microvm".parse().unwrap()];
    };
    let s = TestServer::start_at(dir.path(), &db_url, tune).await;
    let t = s.token("acme").await;
    ready(&s, 1.0).await;
    let id = new_sandbox(
        &s,
        &t,
        json!({"backend": "microvm", "timeout_secs": 600, "env": {"APP_ENV": "kept"}}),
    )
    .await;
    let text = scrape(&s).await;
    assert_eq!(counted(&text, "cordon_pool_hits_total"), 1.0, "{text}");
    let (status, r) = s
        .post(
            &t,
            &format!("/v1/sandboxes/{id}/commands"),
            json!({"cmd": "sh -c 'echo $$ > /tmp/pid; exec sleep 1000'", "background": true}),
        )
        .await;
    assert_eq!(status, 202, "{r}");
    in_sandbox(
        &s,
        &t,
        &id,
        "echo in-memory > /tmp/mark; echo file > /workspace/f",
    )
    .await;
    let (status, v) = s
        .post(&t, &format!("/v1/sandboxes/{id}/pause"), json!({}))
        .await;
    assert_eq!(status, 200, "{v}");
    s.stop().await;

    let s = TestServer::start_at(dir.path(), &db_url, tune).await;
    let (status, v) = s
        .post(&t, &format!("/v1/sandboxes/{id}/resume"), json!({}))
        .await;
    assert_eq!((status, v["state"].as_str()), (200, Some("running")), "{v}");
    let out = in_sandbox(
        &s,
        &t,
        &id,
        "cat /tmp/mark /workspace/f; echo $APP_ENV; kill -0 $(cat /tmp/pid) && echo alive",
    )
    .await;
    assert_eq!(out, "in-memory\nfile\nkept\nalive\n");
}

/// The output of the tool call a turn's events finished with.
fn tool_output(events: &[(String, serde_json::Value)]) -> String {
    events
        .iter()
        .find(|e| e.0 == "tool_call_finished")
        .expect("the call ran")
        .1
        .to_string()
}

/// Agent sessions from a pool (`for=sessions`): a session takes a pooled
/// sandbox when it is created (its id and workspace the pool's) and its
/// first message runs in it; a file put before that message is there.
/// The attack: the first session's agent leaves files and a detached
/// process and its session goes on; the next session's agent finds none
/// of them. A session deleted before its first message closes the sandbox
/// it took, and its files go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooled_session_sees_nothing_of_the_last() {
    use cordon_testkit::{Scenario, ScriptedServer, Turn};
    let look = "ls -A /workspace /tmp; ps -eo args 2>/dev/null || \
                for p in /proc/[0-9]*; do tr '\\0' ' ' < $p/cmdline; echo; done";
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Leaving things.").with_tool_call(
                "d1",
                "bash",
                json!({"command": "echo left > /workspace/left; echo left > /tmp/left; \
                    setsid sh -c 'exec -a lurker sleep 1000' </dev/null >/dev/null 2>&1 & \
                    cat /workspace/put.txt"}),
            ))
            .turn(Turn::text("Done.").expect_tool_results(["d1"]))
            .turn(Turn::text("Looking.").with_tool_call("c1", "bash", json!({"command": look})))
            .turn(Turn::text("Clean.").expect_tool_results(["c1"])),
    );
    let Some(s) = TestServer::start_with(Db::Sqlite, |c| {
        with_model(model.url())(c);
        c.metrics_listen = Some("127.0.0.1:0".parse().unwrap());
        c.pool = vec!["1,for=sessions".parse().unwrap()];
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    ready(&s, 1.0).await;
    let dirty = s.new_session(&t).await;
    let text = scrape(&s).await;
    assert_eq!(counted(&text, "cordon_pool_taken_total"), 1.0, "{text}");
    let (status, b) = s
        .client
        .put(s.url(&format!("/v1/sessions/{dirty}/files/put.txt")))
        .bearer_auth(&t)
        .body("put before\n")
        .send()
        .await
        .map(|r| (r.status(), ()))
        .unwrap();
    assert!(status.is_success(), "{status} {b:?}");
    let out = tool_output(&s.say(&t, &dirty, "leave things").await);
    assert!(out.contains("put before"), "{out}");

    ready(&s, 1.0).await;
    let clean = s.new_session(&t).await;
    let out = tool_output(&s.say(&t, &clean, "look").await);
    for left in ["left", "lurker", "sleep 1000", "put.txt"] {
        assert!(!out.contains(left), "{left:?} in a pooled session:\n{out}");
    }
    model.assert_finished();
    let text = scrape(&s).await;
    assert_eq!(counted(&text, "cordon_pool_hits_total"), 2.0, "{text}");

    // Deleted before its first message: its sandbox closed, its files gone.
    ready(&s, 1.0).await;
    let unused = s.new_session(&t).await;
    let (status, _) = s.delete(&t, &format!("/v1/sessions/{unused}")).await;
    assert_eq!(status, 204);
    assert!(!s.dir.join("data/sessions").join(&unused).exists());
    let workspace = format!("sessions/{unused}/workspace");
    assert!(
        !std::fs::read_to_string("/proc/self/mountinfo")
            .unwrap()
            .contains(&workspace),
        "its workspace is still mounted"
    );
}

/// A session's sandbox has the server's default size and backend: a pool
/// for sessions of another could never serve one, and is refused; so is
/// one on a server without a model, which makes no sessions.
#[tokio::test]
async fn a_sessions_pool_of_another_size_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (db_url, _pg) = crate::common::database(Db::Sqlite, dir.path()).unwrap();
    let model = cordon_testkit::ScriptedServer::start(cordon_testkit::Scenario::new());
    for (spec, with_model, says) in [
        (
            "1,for=sessions,memory=1G",
            true,
            "sets only its image and network",
        ),
        (
            "1,for=sessions,disk=64M",
            true,
            "sets only its image and network",
        ),
        ("1,for=sessions", false, "needs a model"),
    ] {
        let mut config = cordon_server::ServerConfig::new(&db_url, dir.path().join("data"));
        config.listen = "127.0.0.1:0".parse().unwrap();
        config.pool = vec![spec.parse().unwrap()];
        if with_model {
            config.agent = Some(agent_at(model.url()));
        }
        let e = match cordon_server::start(config).await {
            Ok(_) => panic!("{spec} taken"),
            Err(e) => e.to_string(),
        };
        assert!(e.contains(says), "{spec}: {e}");
    }
}

#[test]
fn pool_specs_are_checked() {
    use cordon_server::config::PoolSpec;
    let p: PoolSpec = "3,image=debian:bookworm,memory=1G,disk=2G,backend=microvm"
        .parse()
        .unwrap();
    assert_eq!(p.size, 3);
    assert_eq!(p.owner, cordon_server::owner::Kind::Job);
    assert_eq!(p.limits.memory.unwrap().0, 1 << 30);
    let p: PoolSpec = "2,for=sandboxes,network=loopback".parse().unwrap();
    assert_eq!(p.owner, cordon_server::owner::Kind::Sandbox);
    assert_eq!(
        p.limits.network,
        Some(cordon_server::job::NetworkMode::Loopback)
    );
    for (bad, says) in [
        ("0", "from 1 to"),
        ("x", "starts with its size"),
        ("65", "from 1 to 64"),
        ("2,memory", "KEY=VALUE"),
        ("2,cpus=2", "for, image, memory, disk, network and backend"),
        ("2,network=allow", "off or loopback"),
        ("2,for=users", "jobs, sessions or sandboxes"),
        ("2,backend=kvm", "native or microvm"),
        ("2,memory=lots", "memory"),
    ] {
        let e = bad.parse::<PoolSpec>().unwrap_err();
        assert!(e.contains(says), "{bad}: {e}");
    }
}
