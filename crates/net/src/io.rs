//! A stream wrapper that counts bytes and notes activity, so the broker can
//! report traffic and close what has gone idle.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::Instant;

/// Traffic on one upstream connection.
#[derive(Debug)]
pub struct Meter {
    start: Instant,
    /// Written to the upstream.
    pub up: AtomicU64,
    /// Read from the upstream.
    pub down: AtomicU64,
    /// Milliseconds since `start` of the last byte either way.
    last: AtomicU64,
}

impl Meter {
    pub fn new() -> Arc<Meter> {
        Arc::new(Meter {
            start: Instant::now(),
            up: AtomicU64::new(0),
            down: AtomicU64::new(0),
            last: AtomicU64::new(0),
        })
    }

    fn touch(&self) {
        self.last
            .store(self.start.elapsed().as_millis() as u64, Ordering::Relaxed);
    }

    /// Bytes up, bytes down.
    pub fn totals(&self) -> (u64, u64) {
        (
            self.up.load(Ordering::Relaxed),
            self.down.load(Ordering::Relaxed),
        )
    }

    /// Resolves once nothing has moved for `idle`.
    pub async fn idle(&self, idle: Duration) {
        loop {
            let last = self.start + Duration::from_millis(self.last.load(Ordering::Relaxed));
            let deadline = last + idle;
            if Instant::now() >= deadline {
                return;
            }
            tokio::time::sleep_until(deadline).await;
        }
    }
}

/// Counts what passes through `S` into a [`Meter`]: reads are "down",
/// writes "up".
pub struct Counted<S> {
    inner: S,
    meter: Arc<Meter>,
}

impl<S> Counted<S> {
    pub fn new(inner: S, meter: Arc<Meter>) -> Counted<S> {
        meter.touch();
        Counted { inner, meter }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Counted<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let r = Pin::new(&mut self.inner).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if n > 0 {
            self.meter.down.fetch_add(n as u64, Ordering::Relaxed);
            self.meter.touch();
        }
        r
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Counted<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = r
            && n > 0
        {
            self.meter.up.fetch_add(n as u64, Ordering::Relaxed);
            self.meter.touch();
        }
        r
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}
