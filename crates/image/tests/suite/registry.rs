//! Pulls from a real registry (Debian's `docker-registry`, the CNCF
//! distribution server) on loopback, with htpasswd auth, holding images
//! pushed by `skopeo`.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cordon_image::auth::{Credentials, Sources};
use cordon_image::registry::{Progress, pull};
use cordon_image::store::Store;
use cordon_image::{Digest, ImageRef};

use super::store::{diff_id, two_layers, write_layout};

const USER: &str = "puller";
const PASSWORD: &str = "s3cret-pass";

/// A registry of the test's own, on a free loopback port.
struct Registry {
    child: Child,
    addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn need(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "{tool} is missing: scripts/packages.txt installs it");
}

impl Registry {
    fn start() -> Registry {
        for tool in ["docker-registry", "skopeo", "htpasswd"] {
            need(tool);
        }
        let dir = tempfile::tempdir().unwrap();
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let addr = format!("127.0.0.1:{port}");
        let htpasswd = Command::new("htpasswd")
            .args(["-Bbn", USER, PASSWORD])
            .output()
            .unwrap();
        assert!(htpasswd.status.success());
        std::fs::write(dir.path().join("htpasswd"), &htpasswd.stdout).unwrap();
        std::fs::write(
            dir.path().join("config.yml"),
            format!(
                "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: {d}/data\n\
                 http:\n  addr: {addr}\nauth:\n  htpasswd:\n    realm: test\n    path: {d}/htpasswd\n",
                d = dir.path().display()
            ),
        )
        .unwrap();
        let child = Command::new("docker-registry")
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let started = Instant::now();
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "the registry did not start"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            child,
            addr,
            _dir: dir,
        }
    }

    /// Pushes the OCI layout `src:tag` as `repo:tag`, with `skopeo`.
    fn push(&self, src: &Path, tag: &str, repo: &str) {
        let out = Command::new("skopeo")
            .args(["copy", "--quiet", "--dest-tls-verify=false", "--dest-creds"])
            .arg(format!("{USER}:{PASSWORD}"))
            .arg(format!("oci:{}:{tag}", src.display()))
            .arg(format!("docker://{}/{repo}:{tag}", self.addr))
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

fn auth_file(dir: &Path, registry: &str) -> Sources {
    use base64::Engine as _;
    let file = dir.join("auth.json");
    let token = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
    std::fs::write(
        &file,
        format!(r#"{{"auths": {{"{registry}": {{"auth": "{token}"}}}}}}"#),
    )
    .unwrap();
    Sources { files: vec![file] }
}

fn rt() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .unwrap()
}

#[test]
fn an_image_is_pulled_with_the_users_credentials_by_tag_and_by_digest() {
    let registry = Registry::start();
    let src = tempfile::tempdir().unwrap();
    let layers = two_layers();
    write_layout(src.path(), "v1", &layers);
    registry.push(src.path(), "v1", "team/tools");
    let root = tempfile::tempdir().unwrap();
    let store = Store::open(root.path()).unwrap();
    let reference: ImageRef = format!("{}/team/tools:v1", registry.addr).parse().unwrap();
    let rt = rt();

    // Without credentials the registry says no, and nothing is stored.
    let e = rt
        .block_on(pull(&store, &reference, Credentials::Anonymous, &|_| {}))
        .unwrap_err()
        .to_string();
    assert!(e.to_lowercase().contains("not authorized"), "{e}");
    assert!(store.list().is_empty());

    let creds = auth_file(root.path(), &registry.addr).for_registry(&registry.addr, "team/tools");
    let said = Mutex::new(Vec::new());
    let image = rt
        .block_on(pull(&store, &reference, creds.clone(), &|p| {
            said.lock().unwrap().push(p)
        }))
        .unwrap();
    assert_eq!(image.layers, [diff_id(&layers[0]), diff_id(&layers[1])]);
    assert_eq!(image.working_dir.as_deref(), Some("/srv"));
    let top = store.layer_dir(&image.layers[1]);
    assert_eq!(
        std::fs::read_to_string(top.join("srv/app.py")).unwrap(),
        "print('hi')\n"
    );
    let fetched = |said: &Mutex<Vec<Progress>>| {
        said.lock()
            .unwrap()
            .iter()
            .filter(|p| matches!(p, Progress::Fetching { .. }))
            .count()
    };
    assert_eq!(fetched(&said), 2, "{:?}", said.lock().unwrap());

    // By digest, and twice at once: nothing is downloaded again.
    let by_digest: ImageRef = format!("{}/team/tools@{}", registry.addr, image.manifest)
        .parse()
        .unwrap();
    let again = Mutex::new(Vec::new());
    let note = |p| again.lock().unwrap().push(p);
    let (a, b) = rt.block_on(async {
        tokio::join!(
            pull(&store, &by_digest, creds.clone(), &note),
            pull(&store, &by_digest, creds.clone(), &note),
        )
    });
    assert_eq!(a.unwrap().layers, image.layers);
    assert_eq!(b.unwrap().manifest, image.manifest);
    assert_eq!(fetched(&again), 0, "{:?}", again.lock().unwrap());
    assert_eq!(store.list().len(), 2, "by tag and by digest");
    // A digest the registry does not hold.
    let missing: ImageRef = format!("{}/team/tools@{}", registry.addr, Digest::of(b"none"))
        .parse()
        .unwrap();
    assert!(rt.block_on(pull(&store, &missing, creds, &|_| {})).is_err());
}
