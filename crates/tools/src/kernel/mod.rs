//! A persistent Jupyter kernel inside the sandbox, driven from the host.
//!
//! [`Kernel::start`] runs `bridge.py` (embedded here) with a Python that
//! has `ipykernel` and `jupyter_client`, as `<python> -c <bridge>` in the
//! sandbox. The bridge starts an ipykernel over Unix sockets in a private
//! directory under the sandbox's `/tmp` and speaks JSON lines with the host
//! ([`wire`]). State lives as long as the kernel: a variable set in one
//! [`Kernel::execute`] is there in the next.
//!
//! The bridge runs in the sandbox, so it is as hostile as anything there:
//! every line it prints is read with a length cap, parsed as a closed type
//! or dropped, and all that is kept of a call is bounded ([`KernelLimits`]);
//! the host has its own deadline, so a bridge that never answers costs the
//! timeout plus a grace, not a hang.

pub mod wire;

use std::time::Duration;

use base64::Engine;
use cordon_sandbox::{ExecEvent, ExecRequest, Execution, Sandbox};

use crate::Image;
use crate::output::HeadTail;
use wire::{MimeBundle, Reply, Request, Status};

/// The bridge's source, run as `python -c`.
pub const BRIDGE: &str = include_str!("bridge.py");

/// How long the bridge may take to start its kernel.
const START_TIMEOUT: Duration = Duration::from_secs(90);
/// Past an execute's own timeout: the bridge's interrupt grace (5 s) and a
/// kernel restart if the interrupt did not take.
const DEADLINE_SLACK: Duration = Duration::from_secs(75);
/// The bridge's stderr kept for error messages.
const STDERR_KEPT: usize = 2048;

/// Bounds on what the host keeps of one call.
#[derive(Debug, Clone)]
pub struct KernelLimits {
    /// First and last bytes kept of each of stdout and stderr.
    pub stream_head: usize,
    pub stream_tail: usize,
    /// Display items kept (images, SVG, HTML, text).
    pub max_items: usize,
    /// Characters of display data kept in all.
    pub max_display_bytes: usize,
    /// The longest line read from the bridge; longer ones are dropped.
    pub max_line: usize,
}

impl Default for KernelLimits {
    fn default() -> Self {
        KernelLimits {
            stream_head: 64 << 10,
            stream_tail: 32 << 10,
            max_items: 50,
            max_display_bytes: 16 << 20,
            max_line: 8 << 20,
        }
    }
}

/// One piece of display output, as what it is.
#[derive(Debug, Clone, PartialEq)]
pub enum DisplayItem {
    /// A PNG or JPEG, checked to be one.
    Image(Image),
    /// SVG source.
    Svg(String),
    /// HTML source.
    Html(String),
    /// Plain text (a display without a richer form, or a dropped image's note).
    Text(String),
}

/// An exception the code raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KernelException {
    pub ename: String,
    pub evalue: String,
    /// The formatted traceback, one entry per frame, without ANSI escapes.
    pub traceback: Vec<String>,
}

/// What one [`Kernel::execute`] gave.
#[derive(Debug, Clone)]
pub struct ExecutionResult {
    pub stdout: HeadTail,
    pub stderr: HeadTail,
    /// The last expression's value as text (`text/plain`).
    pub result: Option<String>,
    /// Display output in order, the last expression's rich form included.
    pub outputs: Vec<DisplayItem>,
    pub error: Option<KernelException>,
    /// The code ran past its timeout and was interrupted.
    pub timed_out: bool,
    /// A fresh kernel was started before or during this call: state from
    /// earlier calls is gone (the kernel had died, a previous call was
    /// cancelled, or an interrupt did not take).
    pub restarted: bool,
    pub execution_count: Option<u64>,
    /// Display items not kept, by the bridge or the host.
    pub dropped_items: u64,
    /// Output bytes the bridge did not forward.
    pub dropped_stream_bytes: u64,
}

/// Why a call did not give a result.
#[derive(Debug, thiserror::Error)]
pub enum KernelError {
    #[error(
        "cannot start the Python kernel in the sandbox: {0}. Check that the Jupyter environment is installed (`cordon lab setup`), or run the code with another language"
    )]
    Start(String),
    #[error(
        "the Python kernel died while running the code (killed by the sandbox's memory limit, a signal, or os._exit): its variables and imports are lost. Call again to run code in a fresh kernel; if it died of memory, use less"
    )]
    Died,
    #[error(
        "the Python kernel's bridge stopped ({0}): the kernel and its state are lost. Call again to start a fresh one"
    )]
    BridgeExited(String),
    #[error(
        "the Python kernel did not answer within {0:?}: it was stopped and its state is lost. Call again to start a fresh one, and keep long work below the timeout"
    )]
    Unresponsive(Duration),
    #[error(
        "the sandbox refused to run the Python kernel: {0}. Retry once; if it fails again, tell the user"
    )]
    Sandbox(#[from] cordon_sandbox::Error),
}

/// A running kernel. Dropping it kills the bridge, and with it the kernel.
pub struct Kernel {
    sandbox: Sandbox,
    python: String,
    limits: KernelLimits,
    bridge: Option<Bridge>,
    next_id: u64,
    /// The kernel process died; restart it before the next call.
    dead: bool,
}

struct Bridge {
    exec: Execution,
    lines: Lines,
    stderr: HeadTail,
    /// A request was sent and its `done` not seen: a cancelled call.
    busy: bool,
}

impl Kernel {
    /// Starts the bridge and its kernel with `python`, an absolute path
    /// inside the sandbox to a Python with ipykernel and jupyter_client.
    pub async fn start(sandbox: &Sandbox, python: &str) -> Result<Kernel, KernelError> {
        Self::start_with(sandbox, python, KernelLimits::default()).await
    }

    pub async fn start_with(
        sandbox: &Sandbox,
        python: &str,
        limits: KernelLimits,
    ) -> Result<Kernel, KernelError> {
        let mut k = Kernel {
            sandbox: sandbox.clone(),
            python: python.to_owned(),
            limits,
            bridge: None,
            next_id: first_id(),
            dead: false,
        };
        k.bridge = Some(k.spawn().await?);
        Ok(k)
    }

    /// The bridge's pid inside the sandbox, if it runs.
    pub fn pid(&self) -> Option<i32> {
        self.bridge.as_ref().map(|b| b.exec.pid())
    }

    async fn spawn(&self) -> Result<Bridge, KernelError> {
        let req = ExecRequest::argv([self.python.as_str(), "-c", BRIDGE])
            .cwd("/workspace")
            .env("PYTHONUNBUFFERED", "1")
            .env("PYTHONDONTWRITEBYTECODE", "1")
            .stream_stdin();
        let exec = self.sandbox.exec_stream(req).await?;
        let mut bridge = Bridge {
            exec,
            lines: Lines::new(self.limits.max_line),
            stderr: HeadTail::new(0, STDERR_KEPT),
            busy: false,
        };
        let ready = tokio::time::timeout(START_TIMEOUT, async {
            loop {
                match bridge.next_reply().await {
                    Ok(Reply::Ready { protocol }) if protocol == wire::PROTOCOL => return Ok(()),
                    Ok(Reply::Ready { protocol }) => {
                        return Err(KernelError::Start(format!(
                            "the bridge speaks protocol {protocol}, not {}",
                            wire::PROTOCOL
                        )));
                    }
                    Ok(Reply::Fatal { message }) => {
                        return Err(KernelError::Start(crate::output::printable(&message)));
                    }
                    Ok(_) => continue,
                    Err(KernelError::BridgeExited(why)) => {
                        return Err(KernelError::Start(why));
                    }
                    Err(e) => return Err(e),
                }
            }
        })
        .await;
        match ready {
            Ok(Ok(())) => Ok(bridge),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(KernelError::Start(format!(
                "the kernel did not start within {START_TIMEOUT:?}"
            ))),
        }
    }

    fn id(&mut self) -> u64 {
        self.next_id = self.next_id.wrapping_add(1);
        self.next_id
    }

    /// Makes sure a bridge runs with a live kernel; says whether state was
    /// lost on the way.
    async fn ensure(&mut self) -> Result<bool, KernelError> {
        let mut fresh = false;
        if self.bridge.as_ref().is_some_and(|b| b.busy) {
            // A cancelled call may still be running: start over.
            self.bridge = None;
        }
        if self.bridge.is_none() {
            self.bridge = Some(self.spawn().await?);
            self.dead = false;
            fresh = true;
        }
        if self.dead {
            self.restart().await?;
            fresh = true;
        }
        Ok(fresh)
    }

    /// Restarts the kernel: all its state is lost.
    pub async fn restart(&mut self) -> Result<(), KernelError> {
        if self.bridge.as_ref().is_none_or(|b| b.busy) {
            self.bridge = Some(self.spawn().await?);
            self.dead = false;
            return Ok(());
        }
        let id = self.id();
        let mut sink = Collector::new(&self.limits);
        let end = self
            .request(Request::Restart { id }, id, START_TIMEOUT, &mut sink)
            .await?;
        match end {
            Status::Restarted => {
                self.dead = false;
                Ok(())
            }
            other => {
                self.bridge = None;
                Err(KernelError::Start(format!(
                    "the restart ended as {other:?}"
                )))
            }
        }
    }

    /// Runs `code`. Past `timeout` the kernel is interrupted and keeps its
    /// state; the result says `timed_out`.
    pub async fn execute(
        &mut self,
        code: &str,
        timeout: Duration,
    ) -> Result<ExecutionResult, KernelError> {
        self.execute_live(code, timeout, None).await
    }

    /// [`Kernel::execute`], with stdout and stderr also going to `live` as
    /// the kernel sends them (each piece already within the bridge's caps).
    pub async fn execute_live(
        &mut self,
        code: &str,
        timeout: Duration,
        live: Option<crate::Progress>,
    ) -> Result<ExecutionResult, KernelError> {
        let restarted = self.ensure().await?;
        let id = self.id();
        let mut sink = Collector::new(&self.limits);
        sink.live = live;
        let req = Request::Execute {
            id,
            code: code.to_owned(),
            timeout: timeout.as_secs_f64(),
        };
        let status = self
            .request(req, id, timeout + DEADLINE_SLACK, &mut sink)
            .await?;
        if status == Status::Dead {
            self.dead = true;
            return Err(KernelError::Died);
        }
        let mut out = sink.finish();
        out.timed_out = matches!(status, Status::Timeout | Status::TimeoutRestarted);
        out.restarted = restarted || status == Status::TimeoutRestarted;
        Ok(out)
    }

    /// Sends `req` and collects replies for `id` until its `done`.
    async fn request(
        &mut self,
        req: Request,
        id: u64,
        deadline: Duration,
        sink: &mut Collector,
    ) -> Result<Status, KernelError> {
        let bridge = self.bridge.as_mut().expect("ensured by the caller");
        let mut line = serde_json::to_vec(&req).expect("requests serialise");
        line.push(b'\n');
        bridge.busy = true;
        let outcome = tokio::time::timeout(deadline, async {
            bridge
                .exec
                .stdin()
                .write(&line)
                .await
                .map_err(|e| KernelError::BridgeExited(format!("cannot write to it: {e}")))?;
            loop {
                match bridge.next_reply().await? {
                    Reply::Done {
                        id: done,
                        status,
                        execution_count,
                        dropped_stream_bytes,
                        dropped_display_items,
                    } if done == id => {
                        sink.count = execution_count;
                        sink.dropped_stream_bytes = dropped_stream_bytes;
                        sink.dropped_items += dropped_display_items;
                        return Ok(status);
                    }
                    reply => sink.take(id, reply),
                }
            }
        })
        .await;
        match outcome {
            Ok(Ok(status)) => {
                bridge.busy = false;
                Ok(status)
            }
            Ok(Err(e)) => {
                self.bridge = None;
                Err(e)
            }
            Err(_) => {
                self.bridge = None;
                Err(KernelError::Unresponsive(deadline))
            }
        }
    }
}

impl Drop for Bridge {
    fn drop(&mut self) {
        // The process group: the bridge. The kernel, in a session of its
        // own, exits when its parent does (ipykernel's parent poller).
        let _ = self.exec.signal(libc::SIGKILL);
    }
}

impl Bridge {
    /// The next well-formed reply; malformed and overlong lines are dropped.
    async fn next_reply(&mut self) -> Result<Reply, KernelError> {
        loop {
            while let Some(line) = self.lines.pop() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                match serde_json::from_slice::<Reply>(&line) {
                    Ok(r) => return Ok(r),
                    Err(e) => tracing::debug!(error = %e, "kernel bridge: line dropped"),
                }
            }
            match self.exec.next().await {
                Some(Ok(ExecEvent::Stdout(d))) => self.lines.feed(&d),
                Some(Ok(ExecEvent::Stderr(d))) => self.stderr.push(&d),
                Some(Ok(ExecEvent::Exit(r))) => {
                    let mut why = format!("exit status {}", r.exit_code());
                    if r.oom_killed {
                        why.push_str(", the sandbox's memory limit was hit");
                    }
                    let err = self.stderr.render();
                    let err = err.trim();
                    if !err.is_empty() {
                        why.push_str(&format!(
                            "; its stderr ends: {}",
                            crate::output::printable(err)
                        ));
                    }
                    return Err(KernelError::BridgeExited(why));
                }
                Some(Err(e)) => return Err(KernelError::BridgeExited(e.to_string())),
                None => return Err(KernelError::BridgeExited("its output ended".into())),
            }
        }
    }
}

/// Splits the bridge's stdout into lines of at most `max` bytes; a longer
/// line is dropped whole, without being held.
struct Lines {
    max: usize,
    buf: Vec<u8>,
    /// Inside a line already over `max`: skip to its end.
    skipping: bool,
    ready: std::collections::VecDeque<Vec<u8>>,
}

impl Lines {
    fn new(max: usize) -> Self {
        Lines {
            max,
            buf: Vec::new(),
            skipping: false,
            ready: Default::default(),
        }
    }

    fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            let nl = data.iter().position(|&b| b == b'\n');
            let (part, rest) = match nl {
                Some(i) => (&data[..i], Some(&data[i + 1..])),
                None => (data, None),
            };
            if !self.skipping {
                if self.buf.len() + part.len() > self.max {
                    tracing::debug!("kernel bridge: overlong line dropped");
                    self.buf = Vec::new();
                    self.skipping = true;
                } else {
                    self.buf.extend_from_slice(part);
                }
            }
            match rest {
                Some(r) => {
                    if !self.skipping {
                        self.ready.push_back(std::mem::take(&mut self.buf));
                    }
                    self.skipping = false;
                    data = r;
                }
                None => data = &[],
            }
        }
    }

    fn pop(&mut self) -> Option<Vec<u8>> {
        self.ready.pop_front()
    }
}

/// Gathers one call's replies within the limits.
struct Collector {
    stdout: HeadTail,
    stderr: HeadTail,
    result: Option<String>,
    outputs: Vec<DisplayItem>,
    error: Option<KernelException>,
    count: Option<u64>,
    dropped_items: u64,
    dropped_stream_bytes: u64,
    display_bytes: usize,
    max_items: usize,
    max_display_bytes: usize,
    /// Where the streams go as they come, too.
    live: Option<crate::Progress>,
}

impl Collector {
    fn new(l: &KernelLimits) -> Self {
        Collector {
            stdout: HeadTail::new(l.stream_head, l.stream_tail),
            stderr: HeadTail::new(l.stream_head, l.stream_tail),
            result: None,
            outputs: Vec::new(),
            error: None,
            count: None,
            dropped_items: 0,
            dropped_stream_bytes: 0,
            display_bytes: 0,
            max_items: l.max_items,
            max_display_bytes: l.max_display_bytes,
            live: None,
        }
    }

    fn take(&mut self, id: u64, reply: Reply) {
        match reply {
            Reply::Stream { id: i, name, text } if i == id => {
                let kept = match name {
                    cordon_sandbox::Stream::Stdout => &mut self.stdout,
                    cordon_sandbox::Stream::Stderr => &mut self.stderr,
                };
                kept.push(text.as_bytes());
                if let Some(live) = &self.live
                    && !text.is_empty()
                {
                    live(name, text.as_bytes());
                }
            }
            Reply::Display { id: i, data } if i == id => self.display(data),
            Reply::Result { id: i, mut data } if i == id => {
                self.result = data.plain.take();
                if data.size() > 0 {
                    self.display(data);
                }
            }
            Reply::Error {
                id: i,
                ename,
                evalue,
                traceback,
            } if i == id && self.error.is_none() => {
                self.error = Some(KernelException {
                    ename,
                    evalue,
                    traceback,
                })
            }
            // Another request's, a second error, or a stray ready/fatal.
            _ => {}
        }
    }

    fn display(&mut self, data: MimeBundle) {
        let item = pick(data);
        let size = match &item {
            DisplayItem::Image(i) => i.data.len(),
            DisplayItem::Svg(s) | DisplayItem::Html(s) | DisplayItem::Text(s) => s.len(),
        };
        if self.outputs.len() >= self.max_items
            || self.display_bytes + size > self.max_display_bytes
        {
            self.dropped_items += 1;
            return;
        }
        self.display_bytes += size;
        self.outputs.push(item);
    }

    fn finish(self) -> ExecutionResult {
        ExecutionResult {
            stdout: self.stdout,
            stderr: self.stderr,
            result: self.result,
            outputs: self.outputs,
            error: self.error,
            timed_out: false,
            restarted: false,
            execution_count: self.count,
            dropped_items: self.dropped_items,
            dropped_stream_bytes: self.dropped_stream_bytes,
        }
    }
}

/// The richest form of a bundle that checks out.
fn pick(data: MimeBundle) -> DisplayItem {
    let images = [
        ("image/png", data.png, &b"\x89PNG\r\n\x1a\n"[..]),
        ("image/jpeg", data.jpeg, &b"\xff\xd8\xff"[..]),
    ];
    let mut bad = None;
    for (media_type, b64, magic) in images {
        let Some(b64) = b64 else { continue };
        // ipykernel's base64 carries newlines.
        let clean: String = b64.chars().filter(|c| !c.is_ascii_whitespace()).collect();
        match base64::engine::general_purpose::STANDARD.decode(&clean) {
            Ok(bytes) if bytes.starts_with(magic) => {
                return DisplayItem::Image(Image {
                    media_type: media_type.into(),
                    data: clean,
                });
            }
            _ => bad = Some(media_type),
        }
    }
    if let Some(svg) = data.svg {
        return DisplayItem::Svg(svg);
    }
    if let Some(html) = data.html {
        return DisplayItem::Html(html);
    }
    match (data.plain, bad) {
        (Some(t), _) => DisplayItem::Text(t),
        (None, Some(kind)) => {
            DisplayItem::Text(format!("[an {kind} that was not valid was dropped]"))
        }
        (None, None) => DisplayItem::Text(String::new()),
    }
}

/// Request ids start at a random point, so a process in the sandbox that
/// forges reply lines cannot easily guess the id of the call under way.
fn first_id() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or(0),
    );
    // Below 2^53: the bridge's JSON numbers are doubles.
    h.finish() >> 12
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(max: usize, chunks: &[&[u8]]) -> Vec<Vec<u8>> {
        let mut l = Lines::new(max);
        for c in chunks {
            l.feed(c);
        }
        std::iter::from_fn(|| l.pop()).collect()
    }

    #[test]
    fn a_kernel_can_live_in_a_shared_slot() {
        fn shared<T: Send + Sync + 'static>() {}
        shared::<tokio::sync::Mutex<Option<Kernel>>>();
    }

    #[test]
    fn lines_split_across_chunks() {
        assert_eq!(
            lines(10, &[b"ab", b"c\nde", b"\n\nf"]),
            vec![b"abc".to_vec(), b"de".to_vec(), b"".to_vec()]
        );
    }

    #[test]
    fn an_overlong_line_is_dropped_and_the_next_kept() {
        assert_eq!(
            lines(4, &[b"12", b"345", b"678", b"9\nok\n"]),
            vec![b"ok".to_vec()]
        );
        let mut l = Lines::new(4);
        l.feed(&vec![b'x'; 1000]);
        assert!(l.buf.len() <= 4, "nothing of an overlong line is held");
    }

    #[test]
    fn replies_are_closed() {
        let ok: Reply =
            serde_json::from_str(r#"{"type":"stream","id":1,"name":"stdout","text":"x"}"#).unwrap();
        assert!(matches!(ok, Reply::Stream { .. }));
        for bad in [
            r#"{"type":"stream","id":1,"name":"stdout","text":"x","extra":1}"#,
            r#"{"type":"display","id":1,"data":{"application/x-evil":"x"}}"#,
            r#"{"type":"stream","id":1,"name":"stdin","text":"x"}"#,
            r#"{"type":"nope"}"#,
        ] {
            assert!(serde_json::from_str::<Reply>(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn an_image_that_is_not_one_falls_back() {
        let b = MimeBundle {
            png: Some("aGVsbG8=".into()),
            plain: Some("<Image>".into()),
            ..Default::default()
        };
        assert_eq!(pick(b), DisplayItem::Text("<Image>".into()));
        let png = base64::engine::general_purpose::STANDARD.encode(b"\x89PNG\r\n\x1a\nrest");
        let b = MimeBundle {
            png: Some(format!("{png}\n")),
            ..Default::default()
        };
        assert!(matches!(pick(b), DisplayItem::Image(i) if i.data == png));
    }
}
