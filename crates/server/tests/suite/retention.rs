//! Job workspaces on disk: each job's sandbox has a disk budget (the job
//! option `disk`, bounded by the server), and a finished job's workspace is
//! removed after `keep_workspaces` while its output and result are kept.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use serde_json::json;

/// Waits until the job says its workspace was removed.
async fn wait_removed(s: &TestServer, t: &str, id: &str) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let (_, job) = s.get(t, &format!("/v1/jobs/{id}")).await;
        if !job["workspace_removed_at"].is_null() {
            return job;
        }
        assert!(
            Instant::now() < deadline,
            "the workspace was never removed: {job}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn finished_workspaces_are_removed_and_their_files_are_gone(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| {
        c.keep_workspaces = Some(Duration::from_secs(2));
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    // A host directory the job's workspace links to: removing the
    // workspace must not follow the links into it.
    let victim = s.dir.join("victim");
    std::fs::create_dir(&victim).unwrap();
    std::fs::write(victim.join("keep.txt"), "host data").unwrap();
    let script = format!(
        "echo kept-output; echo hi > x.txt; ln -s {v} link; ln -s {v}/keep.txt filelink; \
         mkdir -p locked/deep && echo a > locked/deep/f && chmod 000 locked; \
         mkdir ro && echo b > ro/f && chmod 555 ro",
        v = victim.display()
    );
    let id = s
        .submit(&t, json!({"kind": "shell", "command": script}))
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let ws = s.dir.join("data/jobs").join(&id).join("workspace");
    // Kept for now.
    let (status, _) = s.get(&t, &format!("/v1/jobs/{id}/files/x.txt")).await;
    assert_eq!(status, 200);
    assert!(ws.join("x.txt").exists());

    let job = wait_removed(&s, &t, &id).await;
    assert!(!ws.exists(), "{} is still there", ws.display());
    // Its volume too, and no mount is left beneath the job.
    let job_dir = s.dir.join("data/jobs").join(&id);
    for gone in ["workspace.volume", "workspace.volume.img"] {
        assert!(!job_dir.join(gone).exists(), "{gone} is still there");
    }
    let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
    assert!(!mounts.contains(&id), "{mounts}");
    assert_eq!(job["stdout"], "kept-output\n", "{job}");
    assert_eq!(
        std::fs::read_to_string(victim.join("keep.txt")).unwrap(),
        "host data"
    );
    for path in ["files", "files/x.txt"] {
        let (status, body) = s.get(&t, &format!("/v1/jobs/{id}/{path}")).await;
        assert_eq!(status, 410, "{path}: {body}");
        let msg = body["error"]["message"]
            .as_str()
            .or(body["message"].as_str())
            .unwrap_or_default()
            .to_string();
        assert!(
            msg.contains("workspace was removed") && msg.contains("kept"),
            "{body}"
        );
    }
    let put = s
        .client
        .put(s.url(&format!("/v1/jobs/{id}/files/new.txt")))
        .bearer_auth(&t)
        .body("x")
        .send()
        .await
        .unwrap();
    assert_eq!(put.status().as_u16(), 410);
    assert!(!ws.exists(), "a PUT brought the workspace back");
    // Events stay.
    let (status, _) = s.get(&t, &format!("/v1/jobs/{id}")).await;
    assert_eq!(status, 200);
    s.stop().await;
}

async fn forever_keeps_workspaces(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| c.keep_workspaces = None).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s.submit(&t, shell("echo hi > x.txt")).await;
    s.wait(&t, &id).await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (status, job) = s.get(&t, &format!("/v1/jobs/{id}")).await;
    assert_eq!(status, 200);
    assert!(job["workspace_removed_at"].is_null(), "{job}");
    let (status, _) = s.get(&t, &format!("/v1/jobs/{id}/files/x.txt")).await;
    assert_eq!(status, 200);
    s.stop().await;
}

async fn a_job_past_its_disk_budget_fails_and_cannot_ask_past_the_ceiling(db: Db) {
    let Some(s) = TestServer::start(db).await else {
        return;
    };
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "disk": "16M",
                   "command": "for i in $(seq 64); do head -c 1048576 /dev/zero > f$i; done; echo wrote"}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert!(
        job["error"]
            .as_str()
            .unwrap_or_default()
            .contains("disk budget"),
        "{job}"
    );
    assert!(!job["stdout"].as_str().unwrap_or_default().contains("wrote"));
    // The CLI's code for it (`cordon run` exits 123 too).
    assert_eq!(job["exit_code"], 123, "{job}");

    // Out of memory: the CLI's 122, not the SIGKILL's 137.
    let id = s
        .submit(
            &t,
            json!({"kind": "python", "memory": "64M",
                   "code": "x = []\nwhile True:\n    x.append(bytearray(8 << 20))\n"}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["exit_code"], 122, "{job}");
    assert!(
        job["error"]
            .as_str()
            .unwrap_or_default()
            .contains("out of memory"),
        "{job}"
    );
    let (status, body) = s
        .post(
            &t,
            "/v1/jobs",
            json!({"kind": "shell", "command": "ls", "disk": "64G"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    assert!(body.to_string().contains("`disk`"), "{body}");
    s.stop().await;
}

/// An agent job's checkpoints are copies of its workspace's files: they go
/// when the workspace goes, and its conversation stays.
async fn an_agent_jobs_checkpoints_go_with_its_workspace(db: Db) {
    use cordon_testkit::{Scenario, ScriptedServer, Turn};
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Writing.").with_tool_call(
                "w1",
                "write_file",
                json!({"path": "secret-ish.txt", "content": "the job's data\n"}),
            ))
            .turn(Turn::text("Done.").expect_tool_results(["w1"])),
    );
    let Some(s) = TestServer::start_with(db, |c| {
        with_model(model.url())(c);
        c.keep_workspaces = Some(Duration::from_secs(2));
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    let id = s
        .submit(&t, json!({"kind": "agent", "prompt": "write it"}))
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    let dir = s.dir.join("data/jobs").join(&id);
    let checkpoints = dir.join("session.checkpoints");
    let log = std::fs::read_to_string(dir.join("session.jsonl")).unwrap();
    assert!(log.contains("\"type\":\"checkpoint\""), "{log}");
    assert!(checkpoints.is_dir());
    wait_removed(&s, &t, &id).await;
    assert!(!dir.join("workspace").exists());
    assert!(
        !checkpoints.exists(),
        "{} outlived the workspace",
        checkpoints.display()
    );
    assert!(dir.join("session.jsonl").exists(), "the conversation stays");
    s.stop().await;
}

/// A job deleted through another process of a deployment leaves its
/// directory on the worker that ran it: the worker removes a job directory
/// whose job is gone, once it is old enough, without following a link out
/// of it, and leaves alone the directories of jobs that exist and names
/// that are no job's.
async fn a_job_directory_whose_job_is_gone_is_removed(db: Db) {
    let Some(s) = TestServer::start_with(db, |c| {
        c.orphans_after = Duration::from_secs(1);
    })
    .await
    else {
        return;
    };
    let t = s.token("acme").await;
    let jobs = s.dir.join("data/jobs");
    let kept = s.submit(&t, shell("echo kept > /workspace/f")).await;
    let gone = s.submit(&t, shell("echo gone > /workspace/f")).await;
    for id in [&kept, &gone] {
        assert_eq!(s.wait(&t, id).await["state"], "succeeded");
    }
    // As another process's DELETE does: the record goes, the files stay.
    let shared = s.running.as_ref().unwrap().shared.clone();
    assert!(shared.store.delete_job("acme", &gone).await.unwrap());
    // A directory of no job at all, with a link out of it; and a name
    // that is no job's.
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("precious"), "keep me").unwrap();
    let stray = jobs.join("job_0123456789abcdef01234567");
    std::fs::create_dir_all(stray.join("workspace")).unwrap();
    std::os::unix::fs::symlink(outside.path(), stray.join("workspace/out")).unwrap();
    std::fs::create_dir_all(jobs.join("notes")).unwrap();

    let deadline = Instant::now() + Duration::from_secs(20);
    while jobs.join(&gone).exists() || stray.exists() {
        assert!(
            Instant::now() < deadline,
            "a job directory whose job is gone stayed"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        std::fs::read_to_string(outside.path().join("precious")).unwrap(),
        "keep me"
    );
    // Its volume may be unmounted meanwhile (the registry of volumes is
    // the process's, and another test's server keeps none idle): its file
    // is read through the files API, which mounts it again.
    assert!(jobs.join(&kept).join("workspace").exists());
    assert!(jobs.join("notes").exists());
    let (code, _) = s.get(&t, &format!("/v1/jobs/{kept}/files/f")).await;
    assert_eq!(code, 200);
    s.stop().await;
}

/// Issue 31: files deleted while a descriptor to each is in flight on a
/// Unix socket are in no directory and no `/proc` file, so no walk counts
/// them. A job's workspace is a file system of its own (the server runs as
/// root), which the watcher measures by the file system's own count: the
/// job is stopped for its budget, and the host never holds more than the
/// budget and its precision of the 320 MiB it tried to write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_s_files_in_flight_take_no_more_than_its_budget() {
    if !volumes() {
        return;
    }
    use std::os::unix::fs::MetadataExt;
    let s = TestServer::start(Db::Sqlite).await.unwrap();
    let t = s.token("acme").await;
    let code = [
        "import os, socket, time",
        "a, b = socket.socketpair()",
        "n = 0",
        "try:",
        "    for i in range(40):",
        "        p = f'/workspace/flying{i}'",
        "        with open(p, 'wb') as f:",
        "            f.write(b'f' * (8 << 20))",
        "        fd = os.open(p, os.O_RDONLY)",
        "        socket.send_fds(a, [b'x'], [fd])",
        "        os.close(fd)",
        "        os.unlink(p)",
        "        n += 1",
        "except OSError as e:",
        "    print('refused', e.errno, 'after', n, flush=True)",
        "time.sleep(3)",
    ]
    .join("\n");
    let id = s
        .submit(&t, json!({"kind": "python", "disk": "16M", "code": code}))
        .await;
    let image = s
        .dir
        .join("data/jobs")
        .join(&id)
        .join("workspace.volume.img");
    let held = || std::fs::metadata(&image).map_or(0, |m| m.blocks() * 512);
    let before = held();
    let (mut most, deadline) = (0, Instant::now() + Duration::from_secs(60));
    loop {
        most = most.max(held());
        let (_, job) = s.get(&t, &format!("/v1/jobs/{id}")).await;
        if !["queued", "running"].contains(&job["state"].as_str().unwrap_or_default()) {
            assert_eq!(job["state"], "failed", "{job}");
            let error = job["error"].as_str().unwrap_or_default();
            assert!(error.contains("disk budget"), "{job}");
            break;
        }
        assert!(Instant::now() < deadline, "{job}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let grown = most.saturating_sub(before);
    let bound = cordon_sandbox::volume::room(16 << 20) + (8 << 20);
    assert!(
        grown <= bound,
        "the image grew by {} MiB, past {} MiB",
        grown >> 20,
        bound >> 20
    );
    s.stop().await;
}

/// Each volume is two mounts, and a host has room for a bounded number:
/// a volume is mounted only while in use. With none kept mounted unused,
/// jobs that ended leave no volume mounted, yet each was one (its free
/// space the budget's room, not the host's disk), and the files API
/// reads and writes a finished job's files through its volume, mounted
/// again for the request. Unmounted, a workspace's mount point takes no
/// file: a host-side writer that forgot to mount it fails loudly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_is_mounted_only_while_in_use() {
    if !volumes() {
        return;
    }
    let s = TestServer::start_with(Db::Sqlite, |c| c.idle_volumes = 0)
        .await
        .unwrap();
    let t = s.token("acme").await;
    let mut ids = Vec::new();
    for i in 0..3 {
        let command = format!("echo {i} > x.txt && df -B1 --output=avail /workspace | tail -1");
        let id = s
            .submit(
                &t,
                json!({"kind": "shell", "command": command, "disk": "64M"}),
            )
            .await;
        let job = s.wait(&t, &id).await;
        assert_eq!(job["state"], "succeeded", "{job}");
        let free: u64 = job["stdout"].as_str().unwrap().trim().parse().unwrap();
        assert!(
            free <= cordon_sandbox::volume::room(64 << 20),
            "job {i} saw {free} bytes free: not a volume"
        );
        ids.push(id);
    }
    let mounted = mounts_beneath;
    let deadline = Instant::now() + Duration::from_secs(10);
    while mounted(&s.dir) > 0 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(mounted(&s.dir), 0, "volumes left mounted after their jobs");
    let ws = s.dir.join("data/jobs").join(&ids[0]).join("workspace");
    let stray = std::fs::write(ws.join("stray"), "past the volume").unwrap_err();
    assert_eq!(
        stray.kind(),
        std::io::ErrorKind::PermissionDenied,
        "{stray}"
    );
    let text = |path: String| {
        let r = s.client.get(s.url(&path)).bearer_auth(&t).send();
        async move {
            let r = r.await.unwrap();
            (r.status().as_u16(), r.text().await.unwrap())
        }
    };
    for (i, id) in ids.iter().enumerate() {
        let (code, body) = text(format!("/v1/jobs/{id}/files/x.txt")).await;
        assert_eq!((code, body.trim()), (200, i.to_string().as_str()));
    }
    let put = s
        .client
        .put(s.url(&format!("/v1/jobs/{}/files/added.txt", ids[1])))
        .bearer_auth(&t)
        .body("later")
        .send()
        .await
        .unwrap();
    assert!(put.status().is_success(), "{}", put.text().await.unwrap());
    let (code, body) = text(format!("/v1/jobs/{}/files/added.txt", ids[1])).await;
    assert_eq!((code, body.as_str()), (200, "later"));
    assert_eq!(
        mounted(&s.dir),
        0,
        "volumes left mounted after the requests"
    );
    assert!(!ws.join("x.txt").exists(), "read through its mount point");
    s.stop().await;
}

/// No MCP session outlives its server: the scratch workspaces an unclean
/// end left (volumes included) go when the server starts again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_run_s_mcp_workspaces_go_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let old = dir.path().join("data/mcp/mcp_0123456789ab");
    std::fs::create_dir_all(&old).unwrap();
    std::fs::write(old.join("left.txt"), "from a crash").unwrap();
    let (db_url, _) = database(Db::Sqlite, dir.path()).unwrap();
    let s = TestServer::start_at(dir.path(), &db_url, |_| {}).await;
    assert!(!old.exists());
    s.stop().await;
}

on_both!(
    a_job_directory_whose_job_is_gone_is_removed,
    finished_workspaces_are_removed_and_their_files_are_gone,
    an_agent_jobs_checkpoints_go_with_its_workspace,
    forever_keeps_workspaces,
    a_job_past_its_disk_budget_fails_and_cannot_ask_past_the_ceiling,
);
