//! A real registry for tests: Debian's `docker-registry` (the CNCF
//! distribution server) on a free loopback port, with htpasswd auth,
//! holding images pushed by `skopeo`.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use base64::Engine as _;

/// The one user of every test registry.
pub const USER: &str = "puller";
pub const PASSWORD: &str = "s3cret-pass";

/// A registry of the test's own; stopped when dropped.
pub struct Registry {
    child: Child,
    /// `127.0.0.1:PORT`.
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Drop for Registry {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Panics unless `tool` is on the PATH: the tests never skip for it.
pub fn need(tool: &str) {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {tool}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "{tool} is missing: scripts/packages.txt installs it");
}

impl Registry {
    pub fn start() -> Registry {
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
        let log = dir.path().join("registry.log");
        let mut server = Command::new("docker-registry");
        server
            .arg("serve")
            .arg(dir.path().join("config.yml"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap());
        // The registry reads every `REGISTRY_*` variable as a setting, and
        // a test may have set `REGISTRY_AUTH_FILE` (the containers login
        // file) for the code under test: the server would refuse to start.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("REGISTRY_") {
                server.env_remove(name);
            }
        }
        let mut child = server.spawn().unwrap();
        let started = Instant::now();
        while std::net::TcpStream::connect(&addr).is_err() {
            let exited = child.try_wait().unwrap();
            if exited.is_some() || started.elapsed() > Duration::from_secs(20) {
                let _ = child.kill();
                panic!(
                    "the registry did not start ({exited:?}):\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Registry {
            child,
            addr,
            _dir: dir,
        }
    }

    /// Pushes the OCI layout `src:tag` as `repo:tag`, with `skopeo`.
    pub fn push(&self, src: &Path, tag: &str, repo: &str) {
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

    /// Writes a containers `auth.json` in `dir` with this registry's
    /// login, as `podman login` would; returns its path.
    pub fn auth_file(&self, dir: &Path) -> PathBuf {
        let file = dir.join("auth.json");
        let token = base64::engine::general_purpose::STANDARD.encode(format!("{USER}:{PASSWORD}"));
        std::fs::write(
            &file,
            format!(r#"{{"auths": {{"{}": {{"auth": "{token}"}}}}}}"#, self.addr),
        )
        .unwrap();
        file
    }
}
