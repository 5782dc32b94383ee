//! Live views of a job's desktop: the WebSocket at `/v1/jobs/{id}/vnc`,
//! its authentication (header or subprotocol), tenants, and its life ending
//! with the job's.

use crate::common;

use std::time::{Duration, Instant};

use common::*;
use futures_util::{SinkExt, StreamExt};
use serde_json::json;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::{self, Message};

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

/// Opens the live view with these extra headers; Err is the HTTP status.
async fn open(
    s: &TestServer,
    path: &str,
    headers: &[(&'static str, String)],
) -> Result<(Ws, Option<String>), u16> {
    let url = s.url(path).replacen("http://", "ws://", 1);
    let mut req = url.into_client_request().unwrap();
    for (k, v) in headers {
        req.headers_mut().insert(*k, v.parse().unwrap());
    }
    match tokio_tungstenite::connect_async(req).await {
        Ok((ws, resp)) => {
            let proto = resp
                .headers()
                .get("sec-websocket-protocol")
                .map(|v| v.to_str().unwrap().to_string());
            Ok((ws, proto))
        }
        Err(tungstenite::Error::Http(resp)) => Err(resp.status().as_u16()),
        Err(e) => panic!("{path}: {e}"),
    }
}

/// RFB over the WebSocket: bytes arrive in messages of any size.
struct Rfb {
    ws: Ws,
    buf: Vec<u8>,
}

impl Rfb {
    async fn read(&mut self, n: usize) -> Vec<u8> {
        while self.buf.len() < n {
            let msg = tokio::time::timeout(Duration::from_secs(20), self.ws.next())
                .await
                .expect("the desktop answers within 20 s")
                .expect("the socket is open")
                .expect("no WebSocket error");
            match msg {
                Message::Binary(b) => self.buf.extend_from_slice(&b),
                Message::Close(f) => panic!("closed early: {f:?}"),
                _ => {}
            }
        }
        self.buf.drain(..n).collect()
    }

    async fn send(&mut self, data: &[u8]) {
        self.ws
            .send(Message::Binary(data.to_vec().into()))
            .await
            .unwrap();
    }

    /// Logs in (security type None) and returns the framebuffer size.
    async fn login(ws: Ws) -> (Rfb, u16, u16) {
        let mut c = Rfb {
            ws,
            buf: Vec::new(),
        };
        assert_eq!(c.read(12).await, b"RFB 003.008\n");
        c.send(b"RFB 003.008\n").await;
        let n = c.read(1).await[0] as usize;
        assert!(c.read(n).await.contains(&1));
        c.send(&[1]).await;
        assert_eq!(c.read(4).await, [0, 0, 0, 0]);
        c.send(&[1]).await;
        let init = c.read(24).await;
        let len = u32::from_be_bytes([init[20], init[21], init[22], init[23]]) as usize;
        c.read(len).await;
        (
            c,
            u16::from_be_bytes([init[0], init[1]]),
            u16::from_be_bytes([init[2], init[3]]),
        )
    }
}

async fn live(s: &TestServer, t: &str, id: &str) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (_, job) = s.get(t, &format!("/v1/jobs/{id}")).await;
        if job["live_desktop"] == true {
            return;
        }
        assert!(Instant::now() < deadline, "no live desktop: {job}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_gui_job_can_be_watched_by_its_tenant_only_until_it_ends() {
    let s = TestServer::start(Db::Sqlite).await.unwrap();
    let t = s.token("acme").await;
    let other = s.token("globex").await;
    // The job holds its desktop open until the test uploads `release`.
    let id = s
        .submit(
            &t,
            json!({"kind": "gui", "display": "1024x768", "steps": [
                {"tool": "shell", "command": "xlogo -geometry 200x200+10+10 >/dev/null 2>&1 &"},
                {"tool": "shell", "command": "while [ ! -f /workspace/release ]; do sleep 0.05; done"}
            ]}),
        )
        .await;
    live(&s, &t, &id).await;
    let path = format!("/v1/jobs/{id}/vnc");
    let bearer = |tok: &str| ("authorization", format!("Bearer {tok}"));

    // Who may open it: no token, a wrong one, another tenant's.
    assert_eq!(open(&s, &path, &[]).await.err(), Some(401));
    assert_eq!(open(&s, &path, &[bearer("nope")]).await.err(), Some(401));
    assert_eq!(open(&s, &path, &[bearer(&other)]).await.err(), Some(404));
    let sneaky = (
        "sec-websocket-protocol",
        format!("binary, cordon.bearer.{other}"),
    );
    assert_eq!(open(&s, &path, &[sneaky]).await.err(), Some(404));
    assert_eq!(
        open(&s, &format!("{path}?access=root"), &[bearer(&t)])
            .await
            .err(),
        Some(400)
    );
    // A plain GET is told it must upgrade.
    let (status, body) = s.get(&t, &path).await;
    assert_eq!(status, 400, "{body}");
    assert_eq!(body["error"]["code"], "not_websocket");

    // The browser's way: the token as a subprotocol next to `binary`,
    // which the server picks.
    let (ws, proto) = open(
        &s,
        &path,
        &[(
            "sec-websocket-protocol",
            format!("binary, cordon.bearer.{t}"),
        )],
    )
    .await
    .unwrap();
    assert_eq!(proto.as_deref(), Some("binary"));
    let (mut viewer, w, h) = Rfb::login(ws).await;
    assert_eq!((w, h), (1024, 768));
    // Ask for the whole screen: an update with at least one rectangle.
    let mut m = vec![3, 0, 0, 0, 0, 0];
    m.extend(w.to_be_bytes());
    m.extend(h.to_be_bytes());
    viewer.send(&m).await;
    let head = viewer.read(4).await;
    assert_eq!(head[0], 0, "a FramebufferUpdate");
    assert!(u16::from_be_bytes([head[2], head[3]]) >= 1);

    // A second viewer, with control, through the header.
    let (ws, _) = open(&s, &format!("{path}?access=control"), &[bearer(&t)])
        .await
        .unwrap();
    let (_controller, w2, _) = Rfb::login(ws).await;
    assert_eq!(w2, 1024);

    // A running job without a display has nothing to show.
    let plain = s
        .submit(&t, json!({"kind": "shell", "command": "sleep 30"}))
        .await;
    s.wait_running(&t, &plain).await;
    assert_eq!(
        open(&s, &format!("/v1/jobs/{plain}/vnc"), &[bearer(&t)])
            .await
            .err(),
        Some(409)
    );
    s.post(&t, &format!("/v1/jobs/{plain}/cancel"), json!({}))
        .await;

    // When the job ends, its viewers are told and the desktop is gone.
    let job = s.release(&t, &id).await;
    assert_eq!(job["state"], "succeeded", "{job}");
    assert_eq!(job["live_desktop"], false);
    let closed = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            match viewer.ws.next().await {
                Some(Ok(Message::Close(f))) => return f.map(|f| f.reason.to_string()),
                Some(Ok(_)) => {}
                Some(Err(_)) | None => return None,
            }
        }
    })
    .await
    .expect("the viewer is disconnected when the job ends");
    if let Some(reason) = closed {
        assert!(reason.contains("desktop"), "{reason}");
    }
    assert_eq!(open(&s, &path, &[bearer(&t)]).await.err(), Some(409));
    let (status, body) = s.get(&t, &path).await;
    assert_eq!(status, 409);
    assert!(
        body["error"]["message"]
            .as_str()
            .unwrap()
            .contains("finished"),
        "{body}"
    );
    s.stop().await;
}
