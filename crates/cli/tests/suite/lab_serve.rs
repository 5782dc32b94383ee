//! `cordon lab`: JupyterLab in a sandbox over the current directory (or
//! `--workspace`), on a loopback URL with a one-time ticket, opened with
//! `$BROWSER`, stopped by Ctrl-C.
//!
//! Needs the lab environment (`cordon lab setup`, which scripts/test runs).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use reqwest::blocking::Client;

use crate::support;

use reqwest::header::{COOKIE, LOCATION, SET_COOKIE};
use support::lab_installed;

fn client() -> Client {
    Client::builder()
        .redirect(reqwest::redirect::Policy::none())
        .build()
        .unwrap()
}

/// Starts `cordon ARGS` in `cwd` and returns it with the first line it
/// prints (the URL).
fn start(cwd: &Path, args: &[&str], browser: Option<&Path>) -> (Child, String) {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_cordon"));
    cmd.args(args)
        .current_dir(cwd)
        .env_remove("DISPLAY")
        .env_remove("WAYLAND_DISPLAY")
        .env_remove("BROWSER")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    if let Some(b) = browser {
        cmd.env("BROWSER", b);
    }
    let mut child = cmd.spawn().unwrap();
    let stdout = child.stdout.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = BufReader::new(stdout).read_line(&mut line);
        let _ = tx.send(line);
    });
    let line = rx
        .recv_timeout(Duration::from_secs(120))
        .unwrap_or_default();
    if line.is_empty() {
        let _ = child.kill();
        let out = child.wait_with_output().unwrap();
        panic!("no URL: {}", String::from_utf8_lossy(&out.stderr));
    }
    (child, line.trim().to_string())
}

/// Spends the ticket: the cookie, and where the browser goes next.
fn sign_in(url: &str) -> (String, String) {
    let r = client().get(url).send().unwrap();
    assert_eq!(r.status(), 303, "{url}");
    let cookie = r.headers()[SET_COOKIE].to_str().unwrap();
    assert!(
        cookie.contains("HttpOnly") && cookie.contains("SameSite=Strict"),
        "{cookie}"
    );
    let cookie = cookie.split(';').next().unwrap().to_string();
    let to = r.headers()[LOCATION].to_str().unwrap().to_string();
    assert_eq!(to, "/");
    (cookie, url.split("/?").next().unwrap().to_string())
}

fn stop(mut child: Child, origin: &str) {
    let pid = child.id() as i32;
    unsafe { libc::kill(pid, libc::SIGINT) };
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "cordon lab did not stop on Ctrl-C"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert_eq!(status.code(), Some(0));
    assert!(client().get(origin).send().is_err(), "still listening");
}

#[test]
fn bare_cordon_lab_serves_the_current_directory_and_opens_the_browser() {
    if !lab_installed() {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.txt"), "from the host").unwrap();
    // A "browser" that writes down what it was asked to open, whole: the
    // file appears by a rename, or the test could read it half-written.
    let bin = tempfile::tempdir().unwrap();
    let opened = bin.path().join("opened");
    let browser = bin.path().join("browser");
    std::fs::write(
        &browser,
        format!(
            "#!/bin/sh\nprintf %s \"$1\" > {0}.part && mv {0}.part {0}\n",
            opened.display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(
        &browser,
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();

    let (child, url) = start(ws.path(), &["lab"], Some(&browser));
    assert!(url.starts_with("http://127.0.0.1:"), "{url}");
    assert!(url.contains("/?cordon_ticket="), "{url}");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !opened.exists() {
        assert!(Instant::now() < deadline, "$BROWSER was not run");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(std::fs::read_to_string(&opened).unwrap(), url);

    let (cookie, origin) = sign_in(&url);
    assert_eq!(client().get(&url).send().unwrap().status(), 401, "spent");
    assert_eq!(
        client()
            .get(format!("{origin}/api/contents"))
            .send()
            .unwrap()
            .status(),
        401,
        "no cookie"
    );
    let page = client()
        .get(format!("{origin}/lab"))
        .header(COOKIE, &cookie)
        .send()
        .unwrap();
    assert_eq!(page.status(), 200);
    assert!(page.text().unwrap().contains("JupyterLab"));
    let file: serde_json::Value = client()
        .get(format!("{origin}/api/contents/notes.txt"))
        .header(COOKIE, &cookie)
        .send()
        .unwrap()
        .json()
        .unwrap();
    assert_eq!(file["content"], "from the host");
    stop(child, &origin);
}

#[test]
fn cordon_lab_workspace_takes_the_directory_given_and_no_browser_opens_nothing() {
    if !lab_installed() {
        return;
    }
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("given.txt"), "given").unwrap();
    let elsewhere = tempfile::tempdir().unwrap();
    let marker = elsewhere.path().join("opened");
    let browser = format!("touch {}", marker.display());
    let (child, url) = start(
        elsewhere.path(),
        &[
            "lab",
            "--workspace",
            ws.path().to_str().unwrap(),
            "--no-browser",
        ],
        Some(Path::new(&browser)),
    );
    let (cookie, origin) = sign_in(&url);
    let listing: serde_json::Value = client()
        .get(format!("{origin}/api/contents"))
        .header(COOKIE, &cookie)
        .send()
        .unwrap()
        .json()
        .unwrap();
    let names: Vec<&str> = listing["content"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["given.txt"]);
    assert!(!marker.exists(), "--no-browser opened one");
    stop(child, &origin);
}

#[test]
fn cordon_lab_help_and_a_bad_flag() {
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["lab", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    for want in ["setup", "--workspace", "--port", "--no-browser"] {
        assert!(help.contains(want), "{want}: {help}");
    }
    let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
        .args(["lab", "setup", "--port", "1"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
}
