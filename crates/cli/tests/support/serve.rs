//! A real `cordon serve` on a loopback port, with a home of its own.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};

pub struct Serve {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base: String,
    /// Its home: configuration under `config/`, data under `data/`.
    pub home: tempfile::TempDir,
}

impl Drop for Serve {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Serve {
    pub fn start() -> Serve {
        Serve::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> Serve {
        Serve::start_in(tempfile::tempdir().unwrap(), extra)
    }

    /// `cordon serve EXTRA` with `home` as its home (configuration
    /// included), once it says it is serving.
    pub fn start_in(home: tempfile::TempDir, extra: &[&str]) -> Serve {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut child = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(["serve", "--listen", &format!("127.0.0.1:{port}")])
            .args(extra)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", home.path())
            .env("XDG_DATA_HOME", home.path().join("data"))
            .env("XDG_CONFIG_HOME", home.path().join("config"))
            .stderr(Stdio::piped())
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
        loop {
            let line = lines.next().expect("the server exited").unwrap();
            if line.contains("serving on") {
                break;
            }
        }
        std::thread::spawn(move || for _ in lines {});
        Serve {
            child,
            base: format!("http://127.0.0.1:{port}"),
            home,
        }
    }

    /// A new bearer token for `tenant`, from `cordon token create`.
    pub fn token(&self, tenant: &str) -> String {
        let out = Command::new(env!("CARGO_BIN_EXE_cordon"))
            .args(["token", "create", "--tenant", tenant])
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .env("HOME", self.home.path())
            .env("XDG_DATA_HOME", self.home.path().join("data"))
            .output()
            .unwrap();
        assert!(out.status.success());
        String::from_utf8(out.stdout).unwrap().trim().to_string()
    }
}
