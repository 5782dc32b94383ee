//! The live view of a sandbox's display: an RFB connection carried by an
//! exec, spoken to here by a minimal RFB client.

use std::time::Duration;

use cordon_sandbox::{
    Display, Error, ExecEvent, ExecRequest, Execution, Sandbox, SandboxConfig, VncAccess,
};

async fn desktop(dir: &std::path::Path, width: u32, height: u32) -> Sandbox {
    let mut c = SandboxConfig::new(dir);
    c.supervisor = Some(env!("CARGO_BIN_EXE_cordon-supervisor").into());
    c.display = Some(Display { width, height });
    Sandbox::create(c).await.expect("a sandbox with a display")
}

/// Just enough of RFB 3.8 (RFC 6143) to log in and send input.
struct Rfb {
    exec: Execution,
    buf: Vec<u8>,
}

impl Rfb {
    async fn read(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            let ev = tokio::time::timeout(Duration::from_secs(20), self.exec.next())
                .await
                .expect("the VNC server answers within 20 s")
                .expect("the relay is running")
                .expect("no sandbox error");
            match ev {
                ExecEvent::Stdout(d) => self.buf.extend(d),
                ExecEvent::Stderr(d) => panic!("relay: {}", String::from_utf8_lossy(&d)),
                ExecEvent::Exit(r) => panic!("the relay exited: {r:?}"),
            }
        }
        self.buf.drain(..n).collect()
    }

    async fn send(&self, data: &[u8]) {
        self.exec.stdin().write(data).await.unwrap();
    }

    /// Handshake without authentication; returns the framebuffer size and
    /// the desktop's name.
    async fn login(exec: Execution) -> (Rfb, u16, u16, String) {
        let mut c = Rfb {
            exec,
            buf: Vec::new(),
        };
        assert_eq!(c.read(12).await, b"RFB 003.008\n");
        c.send(b"RFB 003.008\n").await;
        let n = c.read(1).await[0] as usize;
        let types = c.read(n).await;
        assert!(types.contains(&1), "security None is offered: {types:?}");
        c.send(&[1]).await;
        assert_eq!(c.read(4).await, [0, 0, 0, 0], "security result: OK");
        c.send(&[1]).await; // shared
        let init = c.read(24).await;
        let w = u16::from_be_bytes([init[0], init[1]]);
        let h = u16::from_be_bytes([init[2], init[3]]);
        let len = u32::from_be_bytes([init[20], init[21], init[22], init[23]]) as usize;
        let name = String::from_utf8_lossy(&c.read(len).await).into_owned();
        (c, w, h, name)
    }

    async fn pointer(&self, x: u16, y: u16) {
        let mut m = vec![5, 0];
        m.extend(x.to_be_bytes());
        m.extend(y.to_be_bytes());
        self.send(&m).await;
    }

    /// Asks for the whole screen and returns the first update's header.
    async fn update(&mut self, w: u16, h: u16) -> (u8, u16) {
        let mut m = vec![3, 0, 0, 0, 0, 0];
        m.extend(w.to_be_bytes());
        m.extend(h.to_be_bytes());
        self.send(&m).await;
        let head = self.read(4).await;
        (head[0], u16::from_be_bytes([head[2], head[3]]))
    }
}

async fn pointer_at(sb: &Sandbox) -> String {
    let out = sb
        .exec(ExecRequest::shell(
            "xdotool getmouselocation --shell | head -2 | tr '\\n' ' '",
        ))
        .await
        .unwrap();
    out.stdout_str().trim().to_string()
}

#[tokio::test]
async fn a_viewer_logs_in_sees_the_screen_and_drives_it_only_with_control() {
    let dir = tempfile::tempdir().unwrap();
    let sb = desktop(dir.path(), 800, 600).await;
    assert_eq!(
        sb.display(),
        Some(Display {
            width: 800,
            height: 600
        })
    );

    let (mut viewer, w, h, name) = Rfb::login(sb.vnc(VncAccess::ViewOnly).await.unwrap()).await;
    assert_eq!((w, h), (800, 600), "the framebuffer is the display");
    assert!(!name.is_empty());
    let (kind, rects) = viewer.update(w, h).await;
    assert_eq!(kind, 0, "a FramebufferUpdate");
    assert!(rects >= 1);

    // Input from a view-only viewer is dropped by the server.
    let before = pointer_at(&sb).await;
    viewer.pointer(123, 234).await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        pointer_at(&sb).await,
        before,
        "a view-only viewer moved the pointer"
    );

    // A second viewer, with control, shares the desktop and moves it.
    let (controller, ..) = Rfb::login(sb.vnc(VncAccess::Control).await.unwrap()).await;
    controller.pointer(123, 234).await;
    let mut moved = String::new();
    for _ in 0..50 {
        moved = pointer_at(&sb).await;
        if moved == "X=123 Y=234" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(moved, "X=123 Y=234");

    // Closing a viewer's input ends its relay; the servers stay for others.
    viewer.exec.stdin().close().unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match viewer.exec.next().await {
                Some(Ok(ExecEvent::Exit(r))) => return r,
                Some(Ok(_)) => {}
                other => panic!("{other:?}"),
            }
        }
    })
    .await
    .expect("the relay ends when the viewer leaves");
    assert!(end.status.success(), "{end:?}");
    let (_again, w2, ..) = Rfb::login(sb.vnc(VncAccess::ViewOnly).await.unwrap()).await;
    assert_eq!(w2, 800);
    let servers = sb
        .exec(ExecRequest::shell("pgrep -c -x x11vnc"))
        .await
        .unwrap();
    assert_eq!(
        servers.stdout_str().trim(),
        "2",
        "one server per access mode"
    );
    sb.close().await;
}

#[tokio::test]
async fn a_sandbox_without_a_display_has_no_live_view() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = SandboxConfig::new(dir.path());
    c.supervisor = Some(env!("CARGO_BIN_EXE_cordon-supervisor").into());
    let sb = Sandbox::create(c).await.unwrap();
    assert_eq!(sb.display(), None);
    match sb.vnc(VncAccess::ViewOnly).await {
        Err(Error::Display(m)) => assert!(m.contains("no display"), "{m}"),
        other => panic!("expected a display error, got {:?}", other.map(|_| ())),
    }
    sb.close().await;
}
