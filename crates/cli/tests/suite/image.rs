//! cordon's image (deploy/image): built by scripts/image from Debian's
//! packages without a container engine, unpacked with umoci, and its
//! entrypoint, as its OCI config gives it, run in fresh namespaces the way
//! a container runtime would: `/health` answers, the image's own `cordon
//! token create` makes a token, a shell job and a GUI job's screenshot run
//! in sandboxes, and its `cordon doctor` finds the guest kernel and
//! JupyterLab. Once as root (the runtime's usual case, the image's user
//! dropping every capability) and once from an unprivileged host user in a
//! user namespace (a rootless runtime's).
//!
//! Needs root (debootstrap and buildah's chroot builds); the image and its
//! root file system are cached in /var/cache/cordon/image (see README, "The
//! image", for what a cold and a warm run cost).

use crate::support;

use std::collections::HashMap;
use std::fs;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::{PermissionsExt, chown};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde::Deserialize;
use serde_json::{Value, json};
use support::serve::free_port;

/// The image's user (deploy/image/Dockerfile), whom the unprivileged run
/// starts as when the test runs as root.
const IMAGE_UID: u32 = 10001;

/// What a container runtime does before it runs the image's command.
const CONTAINER_SH: &str = include_str!("../image/container.sh");

// The OCI image layout's files, as far as the test reads them.
#[derive(Deserialize)]
struct Index {
    manifests: Vec<Descriptor>,
}

#[derive(Deserialize)]
struct Descriptor {
    digest: String,
    #[serde(default)]
    annotations: HashMap<String, String>,
}

#[derive(Deserialize)]
struct Manifest {
    config: Descriptor,
}

#[derive(Deserialize)]
struct ImageConfig {
    config: RunConfig,
}

/// The image's run configuration (the Dockerfile's USER, ENV, ENTRYPOINT,
/// CMD and WORKDIR).
#[derive(Deserialize, Debug)]
#[serde(rename_all = "PascalCase")]
struct RunConfig {
    #[serde(default)]
    user: String,
    #[serde(default)]
    env: Vec<String>,
    #[serde(default)]
    entrypoint: Vec<String>,
    #[serde(default)]
    cmd: Vec<String>,
    #[serde(default)]
    working_dir: String,
}

/// The built and unpacked image, shared by the tests of this binary.
struct Image {
    rootfs: PathBuf,
    config: RunConfig,
}

fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v == "true")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn cache() -> PathBuf {
    std::env::var_os("CORDON_IMAGE_CACHE")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/var/cache/cordon/image"))
}

/// Whether this machine can build the image; outside CI a test may skip.
fn can_build() -> bool {
    if rustix::process::geteuid().is_root() {
        return true;
    }
    assert!(!in_ci(), "the image test needs root under CI");
    eprintln!("skipped: building the image needs root (debootstrap, buildah)");
    false
}

fn run(cmd: &mut Command, what: &str) -> String {
    let started = Instant::now();
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed: {}; its output:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
    eprintln!("{what}: {:.0?}", started.elapsed());
    String::from_utf8(out.stdout).expect("UTF-8 output")
}

fn image() -> &'static Image {
    static IMAGE: OnceLock<Image> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let cache = cache();
        let reference = run(
            Command::new(repo().join("scripts/image"))
                .args(["--cordon", env!("CARGO_BIN_EXE_cordon")])
                .arg("--out")
                .arg(cache.join("oci")),
            "scripts/image",
        );
        let reference = reference
            .lines()
            .last()
            .expect("scripts/image names the image");
        let (layout, tag) = reference.rsplit_once(':').expect("DIR:TAG");
        let layout = Path::new(layout);
        let read = |path: PathBuf| fs::read(&path).unwrap_or_else(|e| panic!("{path:?}: {e}"));
        let blob = |digest: &str| {
            let hex = digest.strip_prefix("sha256:").expect("a sha256 digest");
            read(layout.join("blobs/sha256").join(hex))
        };
        let index: Index = serde_json::from_slice(&read(layout.join("index.json"))).unwrap();
        let manifest = index
            .manifests
            .iter()
            .find(|m| {
                m.annotations
                    .get("org.opencontainers.image.ref.name")
                    .map(String::as_str)
                    == Some(tag)
            })
            .expect("the index names the tag");
        let manifest: Manifest = serde_json::from_slice(&blob(&manifest.digest)).unwrap();
        let config: ImageConfig = serde_json::from_slice(&blob(&manifest.config.digest)).unwrap();

        // One unpacked copy, kept until the image changes: a container
        // started by root writes to a layer of its own, one started by the
        // image's user only where that user owns (its data, the microvm
        // cache).
        let unpacked = cache.join("unpacked");
        let rootfs = unpacked.join("rootfs");
        let stamp = unpacked.join("manifest");
        if fs::read_to_string(&stamp).ok().as_deref() != Some(manifest.config.digest.as_str()) {
            let _ = fs::remove_dir_all(&unpacked);
            fs::create_dir_all(&unpacked).unwrap();
            run(
                Command::new("umoci")
                    .args(["raw", "unpack", "--image", reference])
                    .arg(&rootfs),
                "umoci raw unpack",
            );
            fs::write(&stamp, &manifest.config.digest).unwrap();
        }
        // The unprivileged run's user reaches the root through these.
        for dir in [&cache, &unpacked, &rootfs] {
            fs::set_permissions(dir, fs::Permissions::from_mode(0o755)).unwrap();
        }
        Image {
            rootfs,
            config: config.config,
        }
    })
}

/// How the image's containers are started: by root, or by `as_user` in a
/// user namespace of its own; with `data` as their volume at
/// /var/lib/cordon, and each with a writable layer of its own.
struct Containers<'a> {
    image: &'a Image,
    data: &'a Path,
    as_user: Option<u32>,
    layers: std::cell::RefCell<Vec<tempfile::TempDir>>,
}

impl Containers<'_> {
    /// A container running `argv` as the image's user.
    fn command(&self, argv: &[String]) -> Command {
        let config = &self.image.config;
        let (uid, gid) = config
            .user
            .split_once(':')
            .expect("the image names its user as UID:GID");
        let cwd = match config.working_dir.as_str() {
            "" => "/",
            dir => dir,
        };
        assert!(
            !argv[0].contains('='),
            "env(1) would take {:?} for a variable",
            argv[0]
        );
        let layer = tempfile::Builder::new()
            .prefix("cordon-image-layer-")
            .tempdir()
            .unwrap();
        let mut cmd = match self.as_user {
            Some(user) => {
                chown(layer.path(), Some(user), Some(user)).unwrap();
                let mut c = Command::new("setpriv");
                c.args(["--reuid", &user.to_string(), "--regid", &user.to_string()])
                    .args(["--clear-groups", "unshare", "--user", "--map-root-user"]);
                c
            }
            None => Command::new("unshare"),
        };
        cmd.args(["--mount", "--pid", "--ipc", "--uts", "--cgroup"])
            .args(["--fork", "--kill-child"])
            .args(["sh", "-c", CONTAINER_SH, "container.sh"])
            .arg(&self.image.rootfs)
            .arg(layer.path())
            .arg(self.data)
            .arg(if self.as_user.is_some() { "1" } else { "0" })
            .args([uid, gid, cwd])
            .args(&config.env)
            .args(argv)
            .env_clear()
            .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin");
        self.layers.borrow_mut().push(layer);
        cmd
    }
}

/// Kills the container (its pid 1, and so everything in it) when dropped.
/// unshare's `--kill-child` is not enough: the container's pid 1 changes
/// its credentials to become the image's user, which clears the signal
/// its parent's death would send it, and the server lived on after the
/// tests (issue 32).
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let pid = self.0.id();
        let children =
            std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        for child in children
            .split_whitespace()
            .filter_map(|c| c.parse::<i32>().ok())
        {
            // The pid namespace's init: its death ends everything in it.
            unsafe { libc::kill(child, libc::SIGKILL) };
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn http() -> reqwest::blocking::Client {
    reqwest::blocking::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .unwrap()
}

/// Submits `request` and waits for the job to end; its view.
fn run_job(base: &str, token: &str, request: Value) -> Value {
    let r = http()
        .post(format!("{base}/v1/jobs"))
        .bearer_auth(token)
        .json(&request)
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 202, "{:?}", r.text());
    let id = r.json::<Value>().unwrap()["id"]
        .as_str()
        .unwrap()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        let job: Value = http()
            .get(format!("{base}/v1/jobs/{id}"))
            .bearer_auth(token)
            .send()
            .unwrap()
            .json()
            .unwrap();
        if !matches!(job["state"].as_str(), Some("queued" | "running")) {
            return job;
        }
        assert!(Instant::now() < deadline, "the job did not end: {job}");
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// Builds the image, runs its entrypoint, and sees a job succeed in it.
fn serve_a_job(as_user: Option<u32>) {
    if !can_build() {
        return;
    }
    let image = image();
    assert_eq!(image.config.user, format!("{IMAGE_UID}:{IMAGE_UID}"));
    let data = tempfile::Builder::new()
        .prefix("cordon-image-data-")
        .tempdir()
        .unwrap();
    let owner = as_user.unwrap_or(IMAGE_UID);
    chown(data.path(), Some(owner), Some(owner)).unwrap();
    let containers = Containers {
        image,
        data: data.path(),
        as_user,
        layers: Default::default(),
    };

    // The entrypoint as the image gives it, listening on a free loopback
    // port of the host's network instead of 8080 (as a runtime's port
    // mapping would make it reachable).
    let mut argv: Vec<String> = image
        .config
        .entrypoint
        .iter()
        .chain(&image.config.cmd)
        .cloned()
        .collect();
    assert_eq!(argv[..2], ["/usr/local/bin/cordon", "serve"], "{argv:?}");
    let value = |flag: &str| {
        argv.iter()
            .position(|a| a == flag)
            .unwrap_or_else(|| panic!("the entrypoint names {flag}: {argv:?}"))
            + 1
    };
    let listen = value("--listen");
    assert_eq!(argv[listen], "0.0.0.0:8080");
    // The database `cordon token create` finds by default in the image
    // (docs/deploy.md: `docker exec CONTAINER cordon token create`).
    assert_eq!(argv[value("--db")], "/var/lib/cordon/server.db");
    let port = free_port();
    argv[listen] = format!("127.0.0.1:{port}");
    let cordon = |args: &[&str]| -> Vec<String> {
        std::iter::once(argv[0].clone())
            .chain(args.iter().map(|a| a.to_string()))
            .collect()
    };

    // A token from the image's own cordon, in a container of its own over
    // the same volume (`docker run --rm IMAGE cordon token create`).
    let token = run(
        &mut containers.command(&cordon(&["token", "create", "--tenant", "ci"])),
        "cordon token create",
    );
    let token = token.trim().to_string();
    assert!(token.starts_with("cdn_"), "{token:?}");

    // What the image holds for sandboxes, as its own `cordon doctor` sees
    // it in the container: the native sandbox with every isolation
    // feature, the guest kernel and QEMU (a microVM guest boots, under TCG:
    // the container has no /dev/kvm), and JupyterLab.
    let doctor = run(
        &mut containers.command(&cordon(&["doctor"])),
        "cordon doctor",
    );
    for line in [
        "all isolation features are in force",
        "ok   guest kernel",
        "ok   qemu",
        "ok   tcg",
        "ok   lab environment",
    ] {
        assert!(
            doctor.contains(line),
            "cordon doctor says no {line:?}:\n{doctor}"
        );
    }

    let mut child = containers
        .command(&argv)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let server = Running(child);
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            eprintln!("container: {line}");
            let _ = tx.send(line);
        }
    });
    let base = format!("http://127.0.0.1:{port}");
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(r) = http().get(format!("{base}/health")).send()
            && r.status().is_success()
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "/health never answered; the container said: {:?}",
            rx.try_iter().collect::<Vec<_>>()
        );
        std::thread::sleep(Duration::from_millis(200));
    }

    let job = run_job(
        &base,
        &token,
        json!({"kind": "shell", "command": "echo hi from the image"}),
    );
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["stdout"], "hi from the image\n", "{job}");
    // The virtual display the image carries (Xvfb, openbox, xdotool): a
    // GUI job's screenshot.
    let job = run_job(
        &base,
        &token,
        json!({"kind": "gui", "display": "800x600", "steps": [
            {"tool": "shell", "command": "true"},
            {"tool": "computer", "action": "screenshot"},
        ]}),
    );
    assert_eq!(job["state"], "succeeded", "{job}");
    drop(server);
}

#[test]
fn the_image_serves_a_job_started_by_root() {
    serve_a_job(None);
}

/// A rootless runtime's case: the container's root is an unprivileged
/// host user (the image's uid, which owns the image's files, when the test
/// runs as root), and the image's user is that same host user one user
/// namespace further in.
#[test]
fn the_image_serves_a_job_started_by_an_unprivileged_user() {
    let read = |p: &str| fs::read_to_string(p).map(|v| v.trim().to_string());
    if read("/proc/sys/kernel/unprivileged_userns_clone").is_ok_and(|v| v == "0")
        || read("/proc/sys/user/max_user_namespaces").is_ok_and(|v| v == "0")
    {
        assert!(!in_ci(), "this host allows no unprivileged user namespaces");
        eprintln!("skipped: this host allows no unprivileged user namespaces");
        return;
    }
    let euid = rustix::process::geteuid();
    let user = if euid.is_root() {
        IMAGE_UID
    } else {
        euid.as_raw()
    };
    serve_a_job(Some(user));
}
