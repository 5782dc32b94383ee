//! `[environment]` as a user writes it in their own configuration: a setup
//! that installs a package runs once, with the network it asks for; the
//! sandboxes after it start with the package there and the network off; a
//! change to an input runs it again; and a project file planted in the
//! workspace cannot set one.

use std::process::{Command, Output};

struct Env {
    home: tempfile::TempDir,
    ws: tempfile::TempDir,
}

impl Env {
    fn new(config: &str) -> Env {
        let env = Env {
            home: tempfile::tempdir().unwrap(),
            ws: tempfile::tempdir().unwrap(),
        };
        let dir = env.home.path().join("config/cordon");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("config.toml"), config).unwrap();
        env
    }

    /// `cordon run -- sh -c SCRIPT` in the workspace, as a user types it.
    fn run(&self, script: &str) -> Output {
        Command::new(env!("CARGO_BIN_EXE_cordon"))
            .current_dir(self.ws.path())
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", self.home.path())
            .env("XDG_CONFIG_HOME", self.home.path().join("config"))
            .env("CORDON_IMAGE_STORE", self.home.path().join("store"))
            .args(["run", "--host-certs", "--", "sh", "-c", script])
            .output()
            .unwrap()
    }
}

fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

fn minimal() -> Option<std::path::PathBuf> {
    cordon_testkit::environments::environment("minimal")
}

#[test]
fn a_setup_runs_once_and_again_when_an_input_changes() {
    let Some(image) = minimal() else { return };
    let env = Env::new(&format!(
        r#"
[environment]
image = "oci:{image}:latest"
setup = """
apt-get update -qq && apt-get install -y -qq hello >/dev/null
cp requirements.txt /opt/installed-from.txt
"""
inputs = ["requirements.txt"]
allow = ["@debian"]
"#,
        image = image.display()
    ));
    std::fs::write(env.ws.path().join("requirements.txt"), "first\n").unwrap();
    let check = "hello; cat /opt/installed-from.txt; cat /workspace/requirements.txt";

    let first = env.run(check);
    assert!(first.status.success(), "{}", text(&first.stderr));
    assert!(
        text(&first.stderr).contains("setting up the environment, once"),
        "{}",
        text(&first.stderr)
    );
    assert_eq!(text(&first.stdout), "Hello, world!\nfirst\nfirst\n");

    // Again: the setup does not run, the package is there, and the
    // sandbox's network is off (no network.allow in the configuration).
    let started = std::time::Instant::now();
    let second = env.run(&format!(
        "{check}; apt-get update -qq --error-on=any >/dev/null 2>&1 && echo NETWORK || echo OFFLINE"
    ));
    assert!(second.status.success(), "{}", text(&second.stderr));
    assert!(
        !text(&second.stderr).contains("setting up"),
        "{}",
        text(&second.stderr)
    );
    assert_eq!(
        text(&second.stdout),
        "Hello, world!\nfirst\nfirst\nOFFLINE\n"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(10));

    // A changed input runs it again; the workspace is the user's, live.
    std::fs::write(env.ws.path().join("requirements.txt"), "second\n").unwrap();
    let third = env.run(check);
    assert!(third.status.success(), "{}", text(&third.stderr));
    assert!(text(&third.stderr).contains("setting up the environment, once"));
    assert_eq!(text(&third.stdout), "Hello, world!\nsecond\nsecond\n");
}

#[test]
fn a_planted_project_file_cannot_set_a_setup() {
    let Some(image) = minimal() else { return };
    // The user's own configuration runs in the image, with no setup.
    let env = Env::new(&format!(
        "[sandbox]\nimage = \"oci:{}:latest\"\n",
        image.display()
    ));
    let planted = env.ws.path().join(".cordon");
    std::fs::create_dir_all(&planted).unwrap();
    std::fs::write(
        planted.join("config.toml"),
        "[environment]\nsetup = \"touch /opt/pwned\"\nallow = [\"@debian\"]\n",
    )
    .unwrap();
    let out = env.run("test -e /opt/pwned && echo PWNED; echo ran");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "ran\n");
    let err = text(&out.stderr);
    assert!(!err.contains("setting up"), "{err}");
    assert!(
        err.contains("environment.setup"),
        "the ignored setting is not shown: {err}"
    );
}

#[test]
fn a_setup_without_an_image_is_refused_with_the_fix() {
    let env = Env::new("[environment]\nsetup = \"true\"\n");
    let out = env.run("true");
    assert_eq!(out.status.code(), Some(78), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("environment.image"),
        "{}",
        text(&out.stderr)
    );
}
