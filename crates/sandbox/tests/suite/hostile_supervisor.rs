//! The host against a supervisor that breaks the protocol. Natively the
//! supervisor is out of the sandbox's reach; in a microVM it is the guest's
//! pid 1, which the guest's root can stop, trace or take over (the escape
//! battery shows `ptrace` and `/proc/1/mem` work there). So the host must
//! not trust what it says: a flood beyond the output window, an inflated
//! stdin acknowledgement, a command never reported past its timeout, output
//! beyond the requested limit.
//!
//! Each test stands in a small Python program for the supervisor, which
//! sends frames these tests encode with the real protocol.

use std::path::Path;
use std::time::{Duration, Instant};

use cordon_sandbox::protocol::{self, ExitStatus, ReadyInfo, Stream, SupMsg};
use cordon_sandbox::{Error, ExecEvent, ExecRequest, Sandbox, SandboxConfig};

/// Writes a fake supervisor into `dir` that answers setup with `Ready`,
/// waits for the first exec, sends `frames` and then reads (and ignores)
/// whatever the host sends until it is killed.
fn fake_supervisor(dir: &Path, frames: &[SupMsg]) -> std::path::PathBuf {
    let mut ready = Vec::new();
    protocol::encode(&SupMsg::Ready(ReadyInfo::default()), &mut ready);
    let mut rest = Vec::new();
    for f in frames {
        protocol::encode(f, &mut rest);
    }
    std::fs::write(dir.join("ready.bin"), ready).unwrap();
    std::fs::write(dir.join("frames.bin"), rest).unwrap();
    let script = dir.join("supervisor.py");
    std::fs::write(
        &script,
        format!(
            r#"#!/usr/bin/python3
import os, struct
here = {dir:?}
ctl = 3
def frame():
    head = b""
    while len(head) < 4:
        head += os.read(ctl, 4 - len(head))
    n = struct.unpack("<I", head)[0]
    body = b""
    while len(body) < n:
        body += os.read(ctl, n - len(body))
frame()  # Setup
os.write(ctl, open(os.path.join(here, "ready.bin"), "rb").read())
frame()  # the first Exec
data = open(os.path.join(here, "frames.bin"), "rb").read()
while data:
    data = data[os.write(ctl, data):]
while os.read(ctl, 65536):
    pass
"#,
            dir = dir.display().to_string()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    script
}

async fn hostile(frames: &[SupMsg]) -> (tempfile::TempDir, Sandbox) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = SandboxConfig::new(dir.path());
    c.supervisor = Some(fake_supervisor(dir.path(), frames));
    let sb = Sandbox::create(c)
        .await
        .expect("the fake supervisor is ready");
    (dir, sb)
}

fn output(id: u64, len: usize) -> SupMsg {
    SupMsg::Output {
        id,
        stream: Stream::Stdout,
        data: vec![b'x'; len],
    }
}

fn exited(id: u64, stdout_bytes: u64) -> SupMsg {
    SupMsg::Exited {
        id,
        status: ExitStatus::Code(0),
        duration_us: 1000,
        timed_out: false,
        stdout_bytes,
        stderr_bytes: 0,
        truncated: false,
        oom_killed: false,
    }
}

const STARTED: SupMsg = SupMsg::Started { id: 1, pid: 42 };

#[tokio::test]
async fn output_beyond_the_window_ends_the_sandbox_instead_of_filling_the_host() {
    // 8 MB, sixteen times the window, sent without waiting for an ack.
    let mut frames = vec![STARTED];
    frames.extend((0..128).map(|_| output(1, protocol::CHUNK)));
    let (_dir, sb) = hostile(&frames).await;
    let mut exec = sb.exec_stream(ExecRequest::argv(["x"])).await.unwrap();
    // A reader that does not keep up: the flood arrives meanwhile.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let mut got = 0u64;
    let end = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match exec.next().await {
                Some(Ok(ExecEvent::Stdout(d))) => got += d.len() as u64,
                Some(Ok(other)) => panic!("unexpected {other:?}"),
                Some(Err(e)) => break e,
                None => panic!("no end"),
            }
        }
    })
    .await
    .unwrap_or_else(|_| panic!("the flood was taken ({got} bytes) and the sandbox kept"));
    assert!(matches!(end, Error::Gone), "{end}");
    assert!(
        got <= protocol::WINDOW + 2 * protocol::CHUNK as u64,
        "took {got} bytes from a supervisor past its window"
    );
    let again = sb.exec(ExecRequest::argv(["x"])).await;
    assert!(matches!(again, Err(Error::Gone)), "{again:?}");
}

#[tokio::test]
async fn an_inflated_stdin_ack_neither_panics_nor_lifts_the_window() {
    let frames = [
        STARTED,
        SupMsg::StdinAck {
            id: 1,
            bytes: u64::MAX,
        },
        output(1, 5),
    ];
    let (_dir, sb) = hostile(&frames).await;
    let mut exec = sb
        .exec_stream(ExecRequest::argv(["x"]).stream_stdin())
        .await
        .unwrap();
    // What follows the ack arrives: the host's reader survived it.
    let next = tokio::time::timeout(Duration::from_secs(10), exec.next())
        .await
        .expect("output after the ack arrived");
    assert_eq!(next.unwrap().unwrap(), ExecEvent::Stdout(b"xxxxx".to_vec()));
    // The fake acknowledges nothing more, so stdin stops at the window.
    let big = vec![0u8; 2 * protocol::WINDOW as usize];
    let wrote = tokio::time::timeout(Duration::from_millis(500), exec.stdin().write(&big)).await;
    assert!(wrote.is_err(), "2 windows of stdin went out unacknowledged");
}

#[tokio::test]
async fn a_supervisor_that_never_reports_is_killed_past_the_timeout() {
    let (_dir, sb) = hostile(&[STARTED, output(1, 3)]).await;
    let start = Instant::now();
    let out = sb
        .exec(ExecRequest::argv(["x"]).timeout(Duration::from_secs(1)))
        .await
        .unwrap();
    let took = start.elapsed();
    assert!(out.timed_out, "{out:?}");
    assert_eq!(out.status, ExitStatus::Signal(libc::SIGKILL));
    assert_eq!(out.stdout, b"xxx");
    // The timeout, then 5 s in which nothing was left for the host to take.
    assert!(
        took >= Duration::from_secs(6) && took < Duration::from_secs(15),
        "{took:?}"
    );
    let again = sb.exec(ExecRequest::argv(["x"])).await;
    assert!(matches!(again, Err(Error::Gone)), "{again:?}");
}

#[tokio::test]
async fn the_output_limit_holds_even_if_the_supervisor_ignores_it() {
    let frames = [STARTED, output(1, 3000), output(1, 3000), exited(1, 6000)];
    let (_dir, sb) = hostile(&frames).await;
    let out = sb
        .exec(ExecRequest::argv(["x"]).output_limit(1000))
        .await
        .unwrap();
    assert_eq!(out.stdout.len(), 1000);
    assert!(out.truncated);
}
