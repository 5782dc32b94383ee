//! A git remote on loopback that needs credentials: git's smart HTTP
//! (`git http-backend`) behind basic authentication, served by Python's
//! WSGI server, as a forge's HTTPS endpoint is to git. For the tests of
//! cordon's host-side git (clone, push) with the host's credentials.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

const SERVER: &str = r#"
import base64, os, subprocess, sys
from wsgiref.simple_server import make_server, WSGIRequestHandler
root, user, password = sys.argv[1], sys.argv[2], sys.argv[3]
want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
def app(environ, start):
    if environ.get("HTTP_AUTHORIZATION") != want:
        start("401 Unauthorized", [("WWW-Authenticate", 'Basic realm="git"')])
        return [b"who are you?"]
    env = {"GIT_PROJECT_ROOT": root, "GIT_HTTP_EXPORT_ALL": "1", "REMOTE_USER": user,
           "PATH": os.environ["PATH"], "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": "/dev/null"}
    for k in ["PATH_INFO", "QUERY_STRING", "REQUEST_METHOD", "CONTENT_TYPE"]:
        env[k] = environ.get(k, "")
    env["GIT_PROTOCOL"] = environ.get("HTTP_GIT_PROTOCOL", "")
    n = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(n) if n else b""
    out = subprocess.run(["git", "http-backend"], input=body, env=env, capture_output=True).stdout
    head, _, rest = out.partition(b"\r\n\r\n")
    status, headers = "200 OK", []
    for line in head.decode().split("\r\n"):
        k, _, v = line.partition(": ")
        if k.lower() == "status":
            status = v
        elif k:
            headers.append((k, v))
    start(status, headers)
    return [rest]
class Quiet(WSGIRequestHandler):
    def log_message(self, *a):
        pass
srv = make_server("127.0.0.1", 0, app, handler_class=Quiet)
print(srv.server_port, flush=True)
srv.serve_forever()
"#;

/// The server, and the directory of bare repositories it serves.
pub struct GitRemote {
    child: Child,
    pub port: u16,
    pub root: PathBuf,
}

impl Drop for GitRemote {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `git ARGS` in `dir`, as a test's own git: no system or user
/// configuration, a fixed author. Panics on failure; returns stdout.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .arg("-C")
        .arg(dir)
        .args(args)
        .env("GIT_CONFIG_NOSYSTEM", "1")
        .env("GIT_CONFIG_GLOBAL", "/dev/null")
        .env("GIT_AUTHOR_NAME", "t")
        .env("GIT_AUTHOR_EMAIL", "t@t")
        .env("GIT_COMMITTER_NAME", "t")
        .env("GIT_COMMITTER_EMAIL", "t@t")
        .output()
        .expect("run git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

impl GitRemote {
    /// Serves the bare repositories in `root` to `user` with `password`.
    /// `team/proj.git` is made there: `main` (two commits), a branch `feature`
    /// and a tag `v1`.
    pub fn start(root: &Path, user: &str, password: &str) -> GitRemote {
        let src = root.join("src");
        std::fs::create_dir_all(&src).expect("mkdir");
        git(&src, &["init", "-q", "-b", "main"]);
        std::fs::write(src.join("README"), "one\n").expect("write");
        git(&src, &["add", "-A"]);
        git(&src, &["commit", "-q", "-m", "one"]);
        git(&src, &["tag", "v1"]);
        git(&src, &["checkout", "-q", "-b", "feature"]);
        std::fs::write(src.join("feature.txt"), "f\n").expect("write");
        git(&src, &["add", "-A"]);
        git(&src, &["commit", "-q", "-m", "feature"]);
        git(&src, &["checkout", "-q", "main"]);
        std::fs::write(src.join("README"), "two\n").expect("write");
        git(&src, &["commit", "-q", "-am", "two"]);
        git(root, &["clone", "-q", "--bare", "src", "team/proj.git"]);
        let mut child = Command::new("python3")
            .args(["-c", SERVER])
            .arg(root)
            .args([user, password])
            .stdout(Stdio::piped())
            .spawn()
            .expect("python3 runs the git server");
        let mut line = String::new();
        BufReader::new(child.stdout.take().expect("piped"))
            .read_line(&mut line)
            .expect("the server's port");
        GitRemote {
            child,
            port: line.trim().parse().expect("the server's port"),
            root: root.to_path_buf(),
        }
    }

    /// `team/proj.git`'s URL: a forge's shape, owner then repository.
    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}/team/proj.git", self.port)
    }

    /// The bare repository behind [`GitRemote::url`].
    pub fn bare(&self) -> PathBuf {
        self.root.join("team/proj.git")
    }
}

/// Every byte of every file beneath `dir`, as text: what a test
/// searches for a secret that must not be there.
pub fn everything_in(dir: &Path) -> String {
    let mut all = String::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap().flatten() {
            let t = e.file_type().unwrap();
            if t.is_dir() {
                stack.push(e.path());
            } else if t.is_file() {
                all.push_str(&String::from_utf8_lossy(&std::fs::read(e.path()).unwrap()));
            }
        }
    }
    all
}
