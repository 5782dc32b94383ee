//! The last bytes of what QEMU writes (the guest's console, its own
//! stderr), kept for error messages.

use std::io::Read;
use std::os::fd::OwnedFd;
use std::sync::{Arc, Mutex};

use crate::error::Result;

/// How much of the guest's console and QEMU's stderr is kept.
const TAIL_BYTES: usize = 16 << 10;

/// The last bytes of a stream QEMU writes (the guest's serial console, its
/// own stderr), for error messages. The stream is read to its end and the
/// rest dropped: the guest writes to its console at will, and must not be
/// able to fill a host disk or memory with it.
#[derive(Default)]
pub(super) struct Tail(Mutex<std::collections::VecDeque<u8>>);

impl Tail {
    /// Reads `from` on a thread of its own until end of file (QEMU exits).
    pub(super) fn drain(from: OwnedFd, name: &str) -> Result<Arc<Tail>> {
        Tail::drain_until_panic(from, name, None)
    }

    /// As [`Tail::drain`], for a guest's console: once the guest's kernel
    /// says it panicked, its QEMU (`qemu`, a pidfd) is killed. A panicked
    /// guest is dead, but newer kernels' reboot hangs a microvm machine
    /// instead of ending it, and the host would wait for its timeout.
    pub(super) fn drain_until_panic(
        from: OwnedFd,
        name: &str,
        qemu: Option<OwnedFd>,
    ) -> Result<Arc<Tail>> {
        const PANIC: &[u8] = b"Kernel panic - not syncing";
        let tail = Arc::new(Tail::default());
        let keep = tail.clone();
        let mut from = std::fs::File::from(from);
        std::thread::Builder::new()
            .name(format!("cordon-vm-{name}"))
            .spawn(move || {
                let mut qemu = qemu;
                let mut buf = vec![0u8; 8192];
                // The end of the last read: the words may straddle two.
                let mut carry: Vec<u8> = Vec::new();
                loop {
                    match from.read(&mut buf) {
                        Ok(0) => break,
                        Ok(n) => {
                            keep.push(&buf[..n]);
                            if qemu.is_some() {
                                carry.extend_from_slice(&buf[..n]);
                                // Once its line is whole: the reason that
                                // follows is the explanation's best part.
                                // (A line of a console that says no more
                                // is taken whole at a page.)
                                let said = carry
                                    .windows(PANIC.len())
                                    .position(|w| w == PANIC)
                                    .is_some_and(|at| {
                                        carry[at..].contains(&b'\n') || carry.len() - at > 4096
                                    });
                                if said {
                                    let pidfd = qemu.take().expect("checked");
                                    let _ = rustix::process::pidfd_send_signal(
                                        &pidfd,
                                        rustix::process::Signal::KILL,
                                    );
                                }
                                // Past a panic, its line so far; else the
                                // end that may begin one.
                                let keep_from =
                                    match carry.windows(PANIC.len()).position(|w| w == PANIC) {
                                        Some(at) => at,
                                        None => carry.len().saturating_sub(PANIC.len()),
                                    };
                                carry.drain(..keep_from);
                            }
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                        Err(_) => break,
                    }
                }
            })?;
        Ok(tail)
    }

    fn push(&self, data: &[u8]) {
        let mut q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let data = &data[data.len().saturating_sub(TAIL_BYTES)..];
        let excess = (q.len() + data.len()).saturating_sub(TAIL_BYTES);
        q.drain(..excess);
        q.extend(data);
    }

    fn text(&self) -> String {
        let q = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let (a, b) = q.as_slices();
        String::from_utf8_lossy(&[a, b].concat()).into_owned()
    }

    /// What explains a guest's death, in non-blank lines: a kernel panic's
    /// line and the lines that led to it (not the register dump and
    /// backtrace that follow it), else the last `lines` lines.
    pub(super) fn explain(&self, lines: usize) -> String {
        let text = self.text();
        let all: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
        match all.iter().rposition(|l| l.contains("Kernel panic")) {
            Some(p) => all[p.saturating_sub(lines / 2)..=p].join("\n"),
            None => all[all.len().saturating_sub(lines)..].join("\n"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_tail_keeps_only_the_last_bytes_and_lines_of_an_endless_stream() {
        let (mut w, r) = std::os::unix::net::UnixStream::pair().unwrap();
        let tail = Tail::drain(r.into(), "test").unwrap();
        let line = b"cordon-console-flood\n";
        for _ in 0..(4 << 20) / line.len() {
            std::io::Write::write_all(&mut w, line).unwrap();
        }
        std::io::Write::write_all(&mut w, b"\nlast words\n\n").unwrap();
        drop(w);
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while !tail.explain(1).contains("last words") {
            assert!(std::time::Instant::now() < deadline, "never drained");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(tail.0.lock().unwrap().len() <= TAIL_BYTES);
        assert_eq!(
            tail.explain(2),
            "cordon-console-flood\nlast words",
            "blank lines are skipped"
        );
        // A single write larger than the whole tail keeps its end.
        tail.push(&vec![b'x'; 3 * TAIL_BYTES]);
        tail.push(b"\nend");
        assert_eq!(tail.0.lock().unwrap().len(), TAIL_BYTES);
        assert_eq!(tail.explain(1), "end");
    }

    /// The guest's panic, even split across reads, ends its QEMU once its
    /// line, which says why, is whole.
    #[test]
    fn a_panicked_guest_s_qemu_is_killed() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = rustix::process::Pid::from_raw(child.id() as i32).unwrap();
        let pidfd = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).unwrap();
        let (mut w, r) = std::os::unix::net::UnixStream::pair().unwrap();
        let _tail = Tail::drain_until_panic(r.into(), "test", Some(pidfd)).unwrap();
        std::io::Write::write_all(&mut w, b"[ 1.8] booting\n[ 1.9] Kernel pan").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            child.try_wait().unwrap().is_none(),
            "killed on half the words"
        );
        std::io::Write::write_all(&mut w, b"ic - not syncing: Attempted to").unwrap();
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            child.try_wait().unwrap().is_none(),
            "killed before the panic's reason"
        );
        std::io::Write::write_all(&mut w, b" kill init!\n").unwrap();
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while child.try_wait().unwrap().is_none() {
            assert!(std::time::Instant::now() < deadline, "not killed");
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn a_panic_is_explained_by_the_lines_before_it_not_its_backtrace() {
        let tail = Tail::default();
        tail.push(b"[ 1.0] booting\n[ 1.1] cordon: cannot mount /usr\n");
        tail.push(b"[ 1.2] Kernel panic - not syncing: Attempted to kill init!\n");
        for i in 0..40 {
            tail.push(format!("[ 1.3]  frame {i}\n").as_bytes());
        }
        let text = tail.explain(15);
        assert!(text.ends_with("Attempted to kill init!"), "{text}");
        assert!(text.contains("cannot mount /usr"), "{text}");
        assert!(!text.contains("frame"), "{text}");
        let quiet = Tail::default();
        quiet.push(b"one\ntwo\nthree\n");
        assert_eq!(quiet.explain(2), "two\nthree");
    }
}
