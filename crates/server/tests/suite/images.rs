//! Jobs and sessions in images on `cordon serve`: a tenant names an image
//! the operator offers (a name of the catalog, the default, or a reference
//! under a registry path the operator opened, pulled on first use from a
//! real registry on loopback), and nothing else: not a file of the
//! server's, not another registry.

use crate::common;

use std::path::Path;

use common::*;
use cordon_testkit::oci::{busybox_layer, layer, write_image};
use cordon_testkit::{Scenario, ScriptedServer, Turn};
use serde_json::json;

/// An OCI layout at `dir` of busybox with an `/etc/os-release` of `id`
/// and `FOO=from-image` in its environment; the manifest's digest.
fn tiny_image(dir: &Path, id: &str) -> String {
    write_image(
        dir,
        "v1",
        &[
            busybox_layer(),
            layer(&[("etc/os-release", &format!("ID={id}\n"))]),
        ],
        json!({"Env": ["PATH=/bin", "FOO=from-image"]}),
    )
}

/// Held by the tests that point `REGISTRY_AUTH_FILE` at their registry's
/// login: one process environment, so one such test at a time.
static AUTH_ENV: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_job_runs_in_an_image_the_operator_offers_and_in_no_other() {
    let layout = tempfile::tempdir().unwrap();
    let digest = tiny_image(layout.path(), "cordon-served");
    let store = tempfile::tempdir().unwrap();
    let source = format!("oci:{}:v1", layout.path().display());
    let s = TestServer::start_with(Db::Sqlite, |c| {
        c.images = catalog(&[format!("tiny={source}")]);
        c.images.tenants.insert("narrow".into(), vec![]);
        c.image_store = Some(store.path().to_path_buf());
    })
    .await
    .unwrap();
    let t = s.token("acme").await;

    // Offered, not yet in the store.
    let (status, list) = s.get(&t, "/v1/images").await;
    assert_eq!(status, 200);
    assert_eq!(
        list,
        json!({"images": [{"name": "tiny", "default": false}], "own": [], "quota": {"used": 0}})
    );

    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "image": "tiny", "command":
                "cat /etc/os-release; echo $FOO; id -u; echo kept > /etc/x && cat /etc/x; pwd"}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(
        job["stdout"],
        "ID=cordon-served\nfrom-image\n0\nkept\n/workspace\n"
    );
    // The stored request names it; an event says which digest ran.
    assert_eq!(job["request"]["image"], "tiny");
    let events = s.job_events(&t, &id).await;
    let image = events
        .iter()
        .find(|e| e.1 == "image")
        .expect("an image event");
    assert_eq!(image.2, json!({"name": "tiny", "digest": digest}));
    let (_, list) = s.get(&t, "/v1/images").await;
    assert_eq!(list["images"][0]["stored"]["digest"], digest.as_str());
    assert_eq!(list["images"][0]["stored"]["layers"], 2);

    // Without an image: the host's root, as before.
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "command": "cat /etc/os-release"}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert!(!job["stdout"].as_str().unwrap().contains("cordon-served"));
    assert!(job["request"].get("image").is_none(), "{job}");

    // Nothing else: the source itself (a file of the server's), any path,
    // any registry.
    for name in [
        source.as_str(),
        "oci:/etc",
        "docker-archive:/etc/shadow",
        "debian:bookworm",
        "127.0.0.1:1/x",
    ] {
        let (status, body) = s
            .post(
                &t,
                "/v1/jobs",
                json!({"kind": "shell", "command": "true", "image": name}),
            )
            .await;
        assert_eq!(status, 403, "{name}: {body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains("tiny"),
            "{body}"
        );
    }
    for (bad, why) in [
        (json!(""), "empty"),
        (json!("a b"), "space"),
        (json!(7), "string"),
    ] {
        let (status, body) = s
            .post(
                &t,
                "/v1/jobs",
                json!({"kind": "shell", "command": "true", "image": bad}),
            )
            .await;
        assert_eq!(status, 400, "{body}");
        assert!(
            body["error"]["message"].as_str().unwrap().contains(why),
            "{body}"
        );
    }
    // On the microvm backend too: the image is the guest's root.
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "image": "tiny", "backend": "microvm", "command":
                "cat /etc/os-release; echo $FOO; id -u; echo kept > /etc/x && cat /etc/x; pwd"}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(
        job["stdout"],
        "ID=cordon-served\nfrom-image\n0\nkept\n/workspace\n"
    );

    // A tenant with a list of its own sees and uses only that.
    let narrow = s.token("narrow").await;
    assert_eq!(
        s.get(&narrow, "/v1/images").await.1,
        json!({"images": [], "own": [], "quota": {"used": 0}})
    );
    let (status, body) = s
        .post(
            &narrow,
            "/v1/jobs",
            json!({"kind": "shell", "command": "true", "image": "tiny"}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
}

/// The operator's default runs every job that names none, and is stored
/// with it; a session keeps the image it was made with across a restart.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_default_image_and_a_sessions_image_across_a_restart() {
    let layout = tempfile::tempdir().unwrap();
    tiny_image(layout.path(), "cordon-default");
    let other = tempfile::tempdir().unwrap();
    tiny_image(other.path(), "cordon-other");
    let store = tempfile::tempdir().unwrap();
    let default = format!("oci:{}:v1", layout.path().display());
    let offered = vec![format!("other=oci:{}:v1", other.path().display())];
    let model = ScriptedServer::start(
        Scenario::new()
            .turn(Turn::text("Looking.").with_tool_call(
                "c1",
                "bash",
                json!({"command": "cat /etc/os-release; echo $FOO > /workspace/foo; echo tool > /etc/agent-tool"}),
            ))
            .turn(Turn::text("Done.").expect_tool_results(["c1"]))
            .turn(Turn::text("Again.").with_tool_call(
                "c2",
                "bash",
                json!({"command": "cat /etc/os-release"}),
            ))
            .turn(
                Turn::text("Same image.")
                    .expect_tool_results(["c2"])
                    .expect_contains("cordon-other"),
            ),
    );
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("server.db").display().to_string();
    let tune = |c: &mut cordon_server::ServerConfig| {
        with_model(model.url())(c);
        c.images = catalog(&offered);
        c.images.default = Some(default.clone());
        c.image_store = Some(store.path().to_path_buf());
    };
    let s = TestServer::start_at(dir.path(), &db, tune).await;
    let t = s.token("acme").await;
    let (_, list) = s.get(&t, "/v1/images").await;
    let names: Vec<&str> = list["images"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, [default.as_str(), "other"]);
    assert_eq!(list["images"][0]["default"], true);

    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "command": "cat /etc/os-release"}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["stdout"], "ID=cordon-default\n", "{job}");
    assert_eq!(job["request"]["image"], default.as_str());

    let (status, created) = s.post(&t, "/v1/sessions", json!({"image": "other"})).await;
    assert_eq!(status, 201, "{created}");
    let sid = created["id"].as_str().unwrap().to_string();
    let events = s.say(&t, &sid, "which system is this?").await;
    let result = events
        .iter()
        .find(|e| e.0 == "tool_call_finished")
        .expect("the call ran");
    assert!(result.1.to_string().contains("cordon-other"), "{result:?}");
    assert_eq!(
        std::fs::read_to_string(
            dir.path()
                .join(format!("data/sessions/{sid}/workspace/foo"))
        )
        .unwrap(),
        "from-image\n"
    );
    // Its sandbox saved as an image: the root's changes, not the workspace.
    let other_tenant = s.token("beta").await;
    let path = format!("/v1/sessions/{sid}/snapshot");
    let (status, body) = s
        .post(&other_tenant, &path, json!({"name": "agent-env"}))
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, snap) = s.post(&t, &path, json!({"name": "agent-env"})).await;
    assert_eq!(status, 201, "{snap}");
    assert_eq!(snap["origin"], json!({"snapshot": sid}));
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "image": "agent-env", "command": "cat /etc/agent-tool /etc/os-release; ls /workspace"}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["stdout"], "tool\nID=cordon-other\n", "{job}");

    // After a restart the session wakes in the same image.
    s.stop().await;
    let s = TestServer::start_at(dir.path(), &db, tune).await;
    s.say(&t, &sid, "and now?").await;
    model.assert_finished();

    // A session may not name what its tenant is not offered.
    let (status, body) = s
        .post(&t, "/v1/sessions", json!({"image": "oci:/etc"}))
        .await;
    assert_eq!(status, 403, "{body}");
}

/// `HOST/PATH/*` opens a registry's path: any image under it is pulled on
/// first use with the server's own login, concurrent jobs download it
/// once, and a neighbouring path stays closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn images_under_an_opened_registry_path_are_pulled_on_first_use() {
    let _env = AUTH_ENV.lock().await;
    let registry = cordon_testkit::registry::Registry::start();
    let layout = tempfile::tempdir().unwrap();
    let digest = tiny_image(layout.path(), "cordon-pulled");
    registry.push(layout.path(), "v1", "team/tiny");
    registry.push(layout.path(), "v1", "private/tiny");
    let store = tempfile::tempdir().unwrap();
    let auth = registry.auth_file(store.path());
    // SAFETY: under AUTH_ENV, before the server starts. Other tests of this
    // binary run meanwhile, but read the environment only through std
    // (`env::var`, `Command`, name lookups), which locks it against this.
    unsafe { std::env::set_var("REGISTRY_AUTH_FILE", &auth) };
    let s = TestServer::start_with(Db::Sqlite, |c| {
        c.images = catalog(&[format!("{}/team/*", registry.addr)]);
        c.image_store = Some(store.path().to_path_buf());
    })
    .await
    .unwrap();
    let t = s.token("acme").await;
    let name = format!("{}/team/tiny:v1", registry.addr);
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            s.submit(
                &t,
                json!({"kind": "shell", "image": name, "command": "cat /etc/os-release"}),
            )
            .await,
        );
    }
    for id in &ids {
        let job = s.wait(&t, id).await;
        assert_eq!(job["state"], "succeeded", "{job}");
        assert_eq!(job["stdout"], "ID=cordon-pulled\n");
        let e = s.job_events(&t, id).await;
        let image = e.iter().find(|e| e.1 == "image").unwrap();
        assert_eq!(image.2["digest"], digest.as_str());
    }
    // One image stored, its two layers once.
    let layers = std::fs::read_dir(store.path().join("layers"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .is_ok_and(|e| !e.file_name().to_string_lossy().starts_with('.'))
        })
        .count();
    assert_eq!(layers, 2);

    let (status, body) = s
        .post(
            &t,
            "/v1/jobs",
            json!({"kind": "shell", "command": "true",
                   "image": format!("{}/private/tiny:v1", registry.addr)}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    // A name under the path that the registry lacks fails the job, clearly.
    let id = s
        .submit(
            &t,
            json!({"kind": "shell", "command": "true",
                   "image": format!("{}/team/absent:v1", registry.addr)}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "failed");
    let error = job["error"].as_str().unwrap();
    assert!(error.contains("cannot prepare the job's image"), "{error}");
    assert!(error.contains("team/absent"), "{error}");

    // The attack on the disk: a sandbox asked of an image the registry
    // lacks, again and again, leaves no workspace (a volume as root)
    // behind any of its refusals.
    for _ in 0..3 {
        let (status, body) = s
            .post(
                &t,
                "/v1/sandboxes",
                json!({"image": format!("{}/team/absent:v1", registry.addr)}),
            )
            .await;
        assert_eq!(status, 502, "{body}");
        assert!(body.to_string().contains("team/absent"), "{body}");
    }
    let sandboxes = s.dir.join("data/sandboxes");
    let left: Vec<_> = std::fs::read_dir(&sandboxes)
        .map(|rd| rd.map(|e| e.unwrap().file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "refused sandboxes left {left:?}");
}

/// The seeds' job kinds in the seeds' environment (deploy/environments/
/// build seeds) as an operator offers it: Python with its kernel, a
/// TypeScript program on the image's Node, and a gui job whose steps drive
/// the image's own X tools.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_job_kinds_run_in_the_seeds_environment() {
    let Some(layout) = cordon_testkit::environments::environment("seeds") else {
        return;
    };
    let source = format!("oci:{}:latest", layout.display());
    let store = tempfile::tempdir().unwrap();
    // Warmed first, as an operator would (`cordon image pull`): some
    // 750 MB to unpack, longer than a job's wait.
    cordon_image::obtain::obtain(
        &cordon_image::store::Store::open(store.path()).unwrap(),
        &source,
        &cordon_image::auth::Sources { files: vec![] },
        &|_| {},
    )
    .await
    .unwrap();
    let s = TestServer::start_with(Db::Sqlite, |c| {
        c.images = catalog(&[format!("seeds={source}")]);
        c.image_store = Some(store.path().to_path_buf());
    })
    .await
    .unwrap();
    let t = s.token("acme").await;
    let python = s
        .submit(
            &t,
            json!({"kind": "python", "image": "seeds", "memory": "1G",
                   "code": "import ipykernel, sys\nprint('python', sys.version_info[0])"}),
        )
        .await;
    let typescript = s
        .submit(
            &t,
            json!({"kind": "typescript", "image": "seeds",
                   "code": "const n: number = 6 * 7;\nconsole.log(`ts ${n}`)"}),
        )
        .await;
    let gui = s
        .submit(
            &t,
            json!({"kind": "gui", "image": "seeds", "display": "800x600", "memory": "1G", "steps": [
                {"tool": "shell", "command": "xdotool getdisplaygeometry"},
                {"tool": "computer", "action": "screenshot"}
            ]}),
        )
        .await;
    let job = s.wait(&t, &python).await;
    assert_eq!(job["stdout"], "python 3\n", "{job}");
    let job = s.wait(&t, &typescript).await;
    assert_eq!(job["stdout"], "ts 42\n", "{job}");
    let job = s.wait(&t, &gui).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert!(
        job["stdout"].as_str().unwrap().starts_with("800 600\n"),
        "{job}"
    );
    assert_eq!(
        job["result"]["steps"][1]["screenshot"],
        "screenshots/step-02.png"
    );
}

/// A build context: a tar of `files`, in base64.
fn context(files: &[(&str, &str)]) -> String {
    use base64::Engine as _;
    let mut tar = tar::Builder::new(Vec::new());
    for (path, text) in files {
        let mut h = tar::Header::new_gnu();
        h.set_size(text.len() as u64);
        h.set_mode(0o644);
        h.set_cksum();
        tar.append_data(&mut h, path, text.as_bytes()).unwrap();
    }
    base64::engine::general_purpose::STANDARD.encode(tar.into_inner().unwrap())
}

fn own_names(list: &serde_json::Value) -> Vec<String> {
    list["own"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap().to_string())
        .collect()
}

/// A tenant's own images: pulled from a registry path the operator opened,
/// built from a Dockerfile by a `build` job (rebuilt from its cache), and
/// snapshotted from a running job; each named by name or digest by jobs of
/// its own tenant only, never by another's, and deleted.
async fn a_tenants_own_images(db: Db) {
    let _env = AUTH_ENV.lock().await;
    let registry = cordon_testkit::registry::Registry::start();
    let layout = tempfile::tempdir().unwrap();
    tiny_image(layout.path(), "cordon-own");
    registry.push(layout.path(), "v1", "team/tiny");
    registry.push(layout.path(), "v1", "private/tiny");
    let store = tempfile::tempdir().unwrap();
    let auth = registry.auth_file(store.path());
    // SAFETY: as above.
    unsafe { std::env::set_var("REGISTRY_AUTH_FILE", &auth) };
    let Some(s) = TestServer::start_with(db, |c| {
        c.images = catalog(&[
            format!("{}/team/*", registry.addr),
            format!("tiny=oci:{}:v1", layout.path().display()),
        ]);
        c.images.grace = Some(std::time::Duration::from_millis(800));
        c.image_store = Some(store.path().to_path_buf());
    })
    .await
    else {
        return;
    };
    let acme = s.token("acme").await;
    let beta = s.token("beta").await;
    let reference = format!("{}/team/tiny:v1", registry.addr);

    // Pulled as acme's own.
    let (status, mine) = s
        .post(
            &acme,
            "/v1/images",
            json!({"name": "mine", "pull": reference}),
        )
        .await;
    assert_eq!(status, 201, "{mine}");
    assert_eq!(mine["name"], "mine");
    assert_eq!(mine["origin"], json!({"pulled": reference}));
    let digest = mine["digest"].as_str().unwrap().to_string();
    let (_, list) = s.get(&acme, "/v1/images").await;
    assert_eq!(own_names(&list), ["mine"]);
    assert_eq!(list["quota"]["used"], mine["size"]);
    let (_, theirs) = s.get(&beta, "/v1/images").await;
    assert_eq!(own_names(&theirs), Vec::<String>::new());

    // Refused: a registry path not opened, a file of the server's, the
    // catalog's own name, a digest as a name, not exactly one source.
    for (body, want) in [
        (
            json!({"name": "x", "pull": format!("{}/private/tiny:v1", registry.addr)}),
            403,
        ),
        (json!({"name": "x", "pull": "oci:/etc"}), 403),
        (json!({"name": "x", "pull": "tiny"}), 400),
        (json!({"name": "tiny", "pull": reference}), 409),
        (json!({"name": digest, "pull": reference}), 400),
        (json!({"name": "x#pending-0", "pull": reference}), 400),
        (json!({"name": "x"}), 400),
        (
            json!({"name": "x", "pull": reference, "session": "ses_1"}),
            400,
        ),
        (json!({"name": "x", "pull": reference, "extra": 1}), 400),
    ] {
        let (status, answer) = s.post(&acme, "/v1/images", body.clone()).await;
        assert_eq!(status, want, "{body}: {answer}");
    }

    // Named by name and by digest by acme's jobs; by neither by beta's.
    for name in ["mine", digest.as_str()] {
        let id = s
            .submit(
                &acme,
                json!({"kind": "shell", "image": name, "command": "cat /etc/os-release"}),
            )
            .await;
        let job = s.wait(&acme, &id).await;
        assert_eq!(job["state"], "succeeded", "{job}");
        assert_eq!(job["stdout"], "ID=cordon-own\n");
        let (status, body) = s
            .post(
                &beta,
                "/v1/jobs",
                json!({"kind": "shell", "command": "true", "image": name}),
            )
            .await;
        assert_eq!(status, 403, "{body}");
    }

    // Built FROM acme's own image, with a context; every step in a sandbox.
    let dockerfile = "FROM mine\nCOPY hello.txt /hello\nRUN echo built >> /hello && id -u > /who\n";
    let build = json!({"kind": "build", "name": "built", "dockerfile": dockerfile,
                       "context": context(&[("hello.txt", "hi\n")])});
    let id = s.submit(&acme, build.clone()).await;
    let job = s.wait(&acme, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"]["image"], "built");
    assert_eq!(job["result"]["ran"], 2, "{job}");
    let out = job["stdout"].as_str().unwrap();
    assert!(out.contains("[stage 1] FROM mine"), "{out}");
    assert!(out.contains("line 3: RUN echo built"), "{out}");
    let built_digest = job["result"]["digest"].as_str().unwrap().to_string();
    let id = s
        .submit(
            &acme,
            json!({"kind": "shell", "image": "built", "command": "cat /hello /who"}),
        )
        .await;
    let job = s.wait(&acme, &id).await;
    assert_eq!(job["stdout"], "hi\nbuilt\n0\n", "{job}");
    // Again: every step from the cache, the same image.
    let id = s.submit(&acme, build.clone()).await;
    let job = s.wait(&acme, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"]["cached"], 2, "{job}");
    assert_eq!(job["result"]["ran"], 0, "{job}");
    assert_eq!(job["result"]["digest"], built_digest.as_str());
    assert!(job["stdout"].as_str().unwrap().contains("(cached)"));

    // beta may not build from acme's image; from the catalog's it builds,
    // and takes nothing from acme's cache.
    let id = s.submit(&beta, build.clone()).await;
    let job = s.wait(&beta, &id).await;
    assert_eq!(job["state"], "failed", "{job}");
    let error = job["error"].as_str().unwrap();
    assert!(
        error.contains("FROM mine") && error.contains("not an image you may build from"),
        "{error}"
    );
    let id = s
        .submit(
            &beta,
            json!({"kind": "build", "name": "theirs",
                   "dockerfile": "FROM tiny\nRUN echo built >> /hello && id -u > /who\n"}),
        )
        .await;
    let job = s.wait(&beta, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["result"]["cached"], 0, "{job}");

    // A failing step: its exit code and line; a build that names an image.
    let id = s
        .submit(
            &acme,
            json!({"kind": "build", "name": "broken", "dockerfile": "FROM mine\nRUN exit 7\n"}),
        )
        .await;
    let job = s.wait(&acme, &id).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert_eq!(job["exit_code"], 7, "{job}");
    assert!(job["error"].as_str().unwrap().contains("line 2"), "{job}");
    let (status, body) = s
        .post(
            &acme,
            "/v1/jobs",
            json!({"kind": "build", "name": "x", "image": "tiny", "dockerfile": "FROM tiny\n"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");
    let (status, body) = s
        .post(
            &acme,
            "/v1/jobs",
            json!({"kind": "build", "name": "x", "context": "not base64!"}),
        )
        .await;
    assert_eq!(status, 400, "{body}");

    // A snapshot of a running job's sandbox keeps what it wrote to its
    // root, not its workspace; beta cannot snapshot acme's job.
    let id = s
        .submit(
            &acme,
            json!({"kind": "shell", "image": "built", "timeout_secs": 60, "command":
                   "echo snapped > /etc/snapped; echo ws > /workspace/ws; touch /tmp/ready; sleep 60"}),
        )
        .await;
    s.wait_running(&acme, &id).await;
    let ready = std::time::Instant::now();
    loop {
        let (_, files) = s.get(&acme, &format!("/v1/jobs/{id}/files")).await;
        if files.to_string().contains("\"ws\"") {
            break;
        }
        assert!(
            ready.elapsed() < std::time::Duration::from_secs(20),
            "{files}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let (status, body) = s
        .post(&beta, "/v1/images", json!({"name": "stolen", "job": id}))
        .await;
    assert_eq!(status, 404, "{body}");
    let (status, snap) = s
        .post(&acme, "/v1/images", json!({"name": "snap", "job": id}))
        .await;
    assert_eq!(status, 201, "{snap}");
    assert_eq!(snap["origin"], json!({"snapshot": id}));
    s.post(&acme, &format!("/v1/jobs/{id}/cancel"), json!({}))
        .await;
    let id = s
        .submit(
            &acme,
            json!({"kind": "shell", "image": "snap", "command": "cat /etc/snapped /hello; ls /workspace"}),
        )
        .await;
    let job = s.wait(&acme, &id).await;
    assert_eq!(job["stdout"], "snapped\nhi\nbuilt\n", "{job}");

    // Deleted: beta cannot, acme can; then no job names it, and its record
    // leaves the store once the grace has passed.
    let (status, _) = s.delete(&beta, "/v1/images/mine").await;
    assert_eq!(status, 404);
    let (status, _) = s.delete(&acme, "/v1/images/mine").await;
    assert_eq!(status, 204);
    let (status, _) = s.delete(&acme, "/v1/images/mine").await;
    assert_eq!(status, 404);
    let (status, body) = s
        .post(
            &acme,
            "/v1/jobs",
            json!({"kind": "shell", "command": "true", "image": "mine"}),
        )
        .await;
    assert_eq!(status, 403, "{body}");
    let (_, list) = s.get(&acme, "/v1/images").await;
    assert_eq!(own_names(&list), ["built", "snap"]);
    // `built` still runs: its layers outlive the image it was built from.
    let id = s
        .submit(
            &acme,
            json!({"kind": "shell", "image": "built", "command": "cat /hello"}),
        )
        .await;
    assert_eq!(s.wait(&acme, &id).await["stdout"], "hi\nbuilt\n");
    let records = || {
        cordon_image::store::Store::open(store.path())
            .unwrap()
            .list()
            .into_iter()
            .map(|i| i.name)
            .filter(|n| n.starts_with('@'))
            .collect::<Vec<_>>()
    };
    assert_eq!(records(), ["@acme/built", "@acme/snap", "@beta/theirs"]);
    // A layer only `snap` had goes once it is deleted and the grace has
    // passed; `built`'s stay.
    let opened = cordon_image::store::Store::open(store.path()).unwrap();
    let snap_top = *opened.get("@acme/snap").unwrap().layers.last().unwrap();
    let built_layers = opened.get("@acme/built").unwrap().layers;
    let (status, _) = s.delete(&acme, "/v1/images/snap").await;
    assert_eq!(status, 204);
    let deleted = std::time::Instant::now();
    // Looked at without `has_layer`, which marks a layer used.
    while opened.layer_dir(&snap_top).exists() {
        assert!(
            deleted.elapsed() < std::time::Duration::from_secs(20),
            "the snapshot's layer was never collected"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    assert!(built_layers.iter().all(|l| opened.has_layer(l)));
}

on_both!(a_tenants_own_images);

/// A tenant's images may take no more than the operator's quota: an image
/// past it is refused and nothing of it is kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_past_the_quota_is_refused_and_not_kept() {
    let layout = tempfile::tempdir().unwrap();
    tiny_image(layout.path(), "cordon-quota");
    let store = tempfile::tempdir().unwrap();
    let s = TestServer::start_with(Db::Sqlite, |c| {
        c.images = catalog(&[format!("tiny=oci:{}:v1", layout.path().display())]);
        c.images.quota = Some(4096);
        c.image_store = Some(store.path().to_path_buf());
    })
    .await
    .unwrap();
    let t = s.token("acme").await;
    let id = s
        .submit(&t, json!({"kind": "build", "name": "big", "dockerfile": "FROM tiny\nRUN head -c 100000 /dev/zero > /big\n"}))
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "failed", "{job}");
    assert!(job["error"].as_str().unwrap().contains("quota"), "{job}");
    let (_, list) = s.get(&t, "/v1/images").await;
    assert_eq!(own_names(&list), Vec::<String>::new());
    assert_eq!(list["quota"], json!({"used": 0, "limit": 4096}));
    let records: Vec<String> = cordon_image::store::Store::open(store.path())
        .unwrap()
        .list()
        .into_iter()
        .map(|i| i.name)
        .filter(|n| n.starts_with('@'))
        .collect();
    assert!(records.is_empty(), "{records:?}");
}

/// In a deployment of many processes, an image one process built reaches
/// a worker that lacks it through the archive, downloaded once however
/// many of its jobs wait for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenants_image_reaches_another_worker_through_the_archive() {
    let layout = tempfile::tempdir().unwrap();
    tiny_image(layout.path(), "cordon-shared");
    let shared = tempfile::tempdir().unwrap();
    let archive: cordon_server::archive::ArchiveUrl =
        format!("file://{}", shared.path().join("archive").display())
            .parse()
            .unwrap();
    let db = shared.path().join("server.db").display().to_string();
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let tune = |dir: &Path| {
        let (archive, store) = (archive.clone(), dir.join("images"));
        let source = format!("tiny=oci:{}:v1", layout.path().display());
        move |c: &mut cordon_server::ServerConfig| {
            c.images = catalog(&[source]);
            c.image_store = Some(store);
            c.archive = Some(archive);
        }
    };
    let s = TestServer::start_at(one.path(), &db, tune(one.path())).await;
    let t = s.token("acme").await;
    let id = s
        .submit(
            &t,
            json!({"kind": "build", "name": "env", "dockerfile": "FROM tiny\nRUN echo made-once > /made\n"}),
        )
        .await;
    let job = s.wait(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    s.stop().await;

    let s = TestServer::start_at(two.path(), &db, tune(two.path())).await;
    let mut ids = Vec::new();
    for _ in 0..3 {
        ids.push(
            s.submit(
                &t,
                json!({"kind": "shell", "image": "env", "command": "cat /made"}),
            )
            .await,
        );
    }
    for id in &ids {
        let job = s.wait(&t, id).await;
        assert_eq!(job["state"], "succeeded", "{job}");
        assert_eq!(job["stdout"], "made-once\n");
    }
    let store = cordon_image::store::Store::open(&two.path().join("images")).unwrap();
    let records: Vec<String> = store.list().into_iter().map(|i| i.name).collect();
    assert!(records.contains(&"@acme/env".to_string()), "{records:?}");
}
