//! Jobs and sessions in images on `cordon serve`: a tenant names an image
//! the operator offers (a name of the catalog, the default, or a reference
//! under a registry path the operator opened, pulled on first use from a
//! real registry on loopback), and nothing else: not a file of the
//! server's, not another registry.

mod common;

use std::path::Path;

use common::*;
use cordon_server::catalog::{CatalogEntry, ImageCatalog};
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

fn catalog(entries: &[String]) -> ImageCatalog {
    ImageCatalog {
        entries: entries
            .iter()
            .map(|e| CatalogEntry::parse(e).unwrap())
            .collect(),
        ..Default::default()
    }
}

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
        json!({"images": [{"name": "tiny", "default": false}]})
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
    assert_eq!(s.get(&narrow, "/v1/images").await.1, json!({"images": []}));
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
                json!({"command": "cat /etc/os-release; echo $FOO > /workspace/foo"}),
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
    let registry = cordon_testkit::registry::Registry::start();
    let layout = tempfile::tempdir().unwrap();
    let digest = tiny_image(layout.path(), "cordon-pulled");
    registry.push(layout.path(), "v1", "team/tiny");
    registry.push(layout.path(), "v1", "private/tiny");
    let store = tempfile::tempdir().unwrap();
    let auth = registry.auth_file(store.path());
    // SAFETY: set before the server starts, read by its pulls; no other
    // thread of this test binary reads the environment meanwhile.
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
