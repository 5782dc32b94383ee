//! A tmux server of a test's own: the real `cordon` in a real terminal,
//! driven by keystrokes and pastes, its screen read back.

use std::process::Command;
use std::time::{Duration, Instant};

/// A tmux server of the test's own, one pane running `cmd`.
pub struct Tmux {
    socket: String,
}

impl Tmux {
    pub fn start(name: &str, cmd: &str, width: u16, height: u16) -> Tmux {
        let have = Command::new("tmux").arg("-V").output();
        if have.is_err() {
            panic!("tmux is missing: apt-get install tmux (scripts/test installs it)");
        }
        // Tests of one binary run in parallel: each server needs its own.
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let socket = format!("cordon-test-{name}-{}-{n}", std::process::id());
        let t = Tmux { socket };
        let ok = t
            .cmd(&[
                "new-session",
                "-d",
                "-x",
                &width.to_string(),
                "-y",
                &height.to_string(),
                cmd,
            ])
            .status
            .success();
        assert!(ok, "tmux new-session failed");
        t
    }

    pub fn cmd(&self, args: &[&str]) -> std::process::Output {
        Command::new("tmux")
            .args(["-L", &self.socket, "-f", "/dev/null"])
            .args(args)
            .output()
            .unwrap()
    }

    pub fn keys(&self, keys: &[&str]) {
        let mut args = vec!["send-keys", "-t", "0"];
        args.extend_from_slice(keys);
        assert!(self.cmd(&args).status.success());
    }

    /// Types `text` literally.
    pub fn type_text(&self, text: &str) {
        assert!(
            self.cmd(&["send-keys", "-t", "0", "-l", text])
                .status
                .success()
        );
    }

    /// Pastes `text` as a terminal paste (bracketed, when the program asked).
    pub fn paste(&self, text: &str) {
        assert!(self.cmd(&["set-buffer", "--", text]).status.success());
        assert!(
            self.cmd(&["paste-buffer", "-p", "-t", "0"])
                .status
                .success()
        );
    }

    pub fn screen(&self) -> String {
        String::from_utf8_lossy(&self.cmd(&["capture-pane", "-p", "-t", "0"]).stdout).into_owned()
    }

    pub fn display(&self, format: &str) -> String {
        let out = self.cmd(&["display-message", "-p", "-t", "0", format]);
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Waits until the screen shows `what`; the screen is in the panic.
    pub fn wait_for(&self, what: &str) -> String {
        self.wait_until(what, |s| s.contains(what))
    }

    pub fn wait_until(&self, what: &str, ok: impl Fn(&str) -> bool) -> String {
        self.wait_within(what, Duration::from_secs(30), ok)
    }

    /// [`Tmux::wait_until`] for work that takes longer (a package install).
    pub fn wait_within(&self, what: &str, limit: Duration, ok: impl Fn(&str) -> bool) -> String {
        let deadline = Instant::now() + limit;
        loop {
            let s = self.screen();
            if ok(&s) {
                return s;
            }
            if Instant::now() > deadline {
                panic!("timed out waiting for {what:?}; the screen:\n{s}");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = self.cmd(&["kill-server"]);
    }
}
