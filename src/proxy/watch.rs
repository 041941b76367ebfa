//! One client connection's time bounds, from accept to close: the next request head must come
//! within the head timeout (counted from accept, and again from a CONNECT's upgrade), a
//! connection that moves no byte either way for the idle timeout is closed, and a request
//! whose body makes no progress for the body timeout, or comes slower on the whole than
//! [`MIN_BODY_RATE`] after it, is answered with an error.
//!
//! [`Watched`] wraps the accepted socket and counts the bytes moving through it; everything
//! above it (hyper, TLS, the relay, tunnels) runs on that one socket, so the counters see the
//! whole connection. [`Watch::expired`] runs beside the connection in its task and ends when
//! the connection must close; dropping the connection then closes the socket.

use std::io;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::sync::Notify;
use tokio::time::Instant;

/// The bounds one connection is held to.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Bounds {
    /// From accept (or a CONNECT's upgrade) to the first request head.
    pub(crate) head: Duration,
    /// No byte either way for this long closes the connection.
    pub(crate) idle: Duration,
    /// A request body read whole that makes no progress for this long fails.
    pub(crate) body: Duration,
}

/// Why a connection was closed by its bounds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Expired {
    /// No (complete) request head within the head timeout.
    Head,
    /// No byte either way within the idle timeout.
    Idle,
}

/// A body read whole must come at least this fast on average, after a first body timeout of
/// grace. The client is on this machine: an honest body arrives at memory speed, and even a
/// 16 MiB one at this rate is done within the grace and 256 s more.
pub(crate) const MIN_BODY_RATE: u64 = 64 * 1024;

/// How long `bytes` may take at [`MIN_BODY_RATE`].
fn at_min_rate(bytes: u64) -> Duration {
    Duration::from_millis(bytes.saturating_mul(1000) / MIN_BODY_RATE)
}

/// Why a body read whole was given up on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stalled {
    /// No byte for the body timeout.
    Gap,
    /// `bytes` in `secs`: slower than [`MIN_BODY_RATE`] on the whole.
    Slow { bytes: u64, secs: u64 },
}

/// A connection's counters and its head deadline, shared by its socket and its handlers.
#[derive(Debug)]
pub(crate) struct Watch {
    bounds: Bounds,
    /// Bumped by every read or write that moved bytes.
    activity: AtomicU64,
    /// Bumped by every read that moved bytes.
    reads: AtomicU64,
    /// Bytes read from the client.
    read_bytes: AtomicU64,
    /// A request head is awaited (`head_since` holds since when).
    awaiting: AtomicBool,
    head_since: Mutex<Option<Instant>>,
    /// Wakes [`Watch::expired`] when a head deadline is armed.
    rearmed: Notify,
}

impl Watch {
    /// A watch for a connection accepted now: its first request head is awaited from now.
    pub(crate) fn new(bounds: Bounds) -> Arc<Self> {
        Arc::new(Watch {
            bounds,
            activity: AtomicU64::new(0),
            reads: AtomicU64::new(0),
            read_bytes: AtomicU64::new(0),
            awaiting: AtomicBool::new(true),
            head_since: Mutex::new(Some(Instant::now())),
            rearmed: Notify::new(),
        })
    }

    pub(crate) fn bounds(&self) -> Bounds {
        self.bounds
    }

    /// A new request head is due within the head timeout from now (after a CONNECT upgrade).
    pub(crate) fn expect_head(&self) {
        *self.lock_head() = Some(Instant::now());
        self.awaiting.store(true, Ordering::Release);
        self.rearmed.notify_one();
    }

    /// A request head (or an HTTP/2 stream, or a tunnel's first bytes) arrived.
    pub(crate) fn got_head(&self) {
        // The common case, a connection already past its first head, costs one load.
        if self.awaiting.swap(false, Ordering::AcqRel) {
            *self.lock_head() = None;
        }
    }

    fn lock_head(&self) -> std::sync::MutexGuard<'_, Option<Instant>> {
        // A poisoned lock only means a panic elsewhere while storing an instant.
        self.head_since.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Ends when the connection must close: its head is late or it has been idle too long.
    pub(crate) async fn expired(&self) -> Expired {
        let idle = self.bounds.idle;
        // Idle is sampled: a connection closes between `idle` and `idle` + a quarter of it
        // after its last byte.
        let sample = (idle / 4).max(Duration::from_millis(10));
        let mut seen = self.activity.load(Ordering::Relaxed);
        let mut last_change = Instant::now();
        loop {
            let now = Instant::now();
            let head_deadline = self.lock_head().map(|since| since + self.bounds.head);
            if head_deadline.is_some_and(|d| now >= d) {
                return Expired::Head;
            }
            let current = self.activity.load(Ordering::Relaxed);
            if current != seen {
                seen = current;
                last_change = now;
            }
            if now >= last_change + idle {
                return Expired::Idle;
            }
            let mut wake = (now + sample).min(last_change + idle);
            if let Some(d) = head_deadline {
                wake = wake.min(d);
            }
            tokio::select! {
                _ = tokio::time::sleep_until(wake) => {}
                _ = self.rearmed.notified() => {}
            }
        }
    }

    /// Ends once a body read whole is late: no byte has been read from the client for the
    /// body timeout (sampled, like idle), or the bytes read since the start came slower than
    /// [`MIN_BODY_RATE`] beyond a first body timeout of grace, so a body trickling a byte
    /// now and then ends too. Raced against a handler that reads a request body whole.
    pub(crate) async fn body_stalled(&self) -> Stalled {
        let limit = self.bounds.body;
        let sample = (limit / 4).max(Duration::from_millis(10));
        let started = Instant::now();
        let first_byte = self.read_bytes.load(Ordering::Relaxed);
        let mut seen = self.reads.load(Ordering::Relaxed);
        let mut last_change = started;
        loop {
            let now = Instant::now();
            let current = self.reads.load(Ordering::Relaxed);
            if current != seen {
                seen = current;
                last_change = now;
            }
            if now >= last_change + limit {
                return Stalled::Gap;
            }
            let bytes = self.read_bytes.load(Ordering::Relaxed) - first_byte;
            let whole = started + limit + at_min_rate(bytes);
            if now >= whole {
                let secs = (now - started).as_secs();
                return Stalled::Slow { bytes, secs };
            }
            let wake = (now + sample).min(last_change + limit).min(whole);
            tokio::time::sleep_until(wake).await;
        }
    }

    fn read(&self, n: usize) {
        self.reads.fetch_add(1, Ordering::Relaxed);
        self.read_bytes
            .fetch_add(u64::try_from(n).unwrap_or(u64::MAX), Ordering::Relaxed);
        self.activity.fetch_add(1, Ordering::Relaxed);
    }

    fn wrote(&self) {
        self.activity.fetch_add(1, Ordering::Relaxed);
    }
}

/// A socket whose traffic a [`Watch`] counts.
pub(crate) struct Watched<IO> {
    io: IO,
    watch: Arc<Watch>,
}

impl<IO> Watched<IO> {
    pub(crate) fn new(io: IO, watch: Arc<Watch>) -> Self {
        Watched { io, watch }
    }

    pub(crate) fn get_ref(&self) -> &IO {
        &self.io
    }
}

impl<IO: AsyncRead + Unpin> AsyncRead for Watched<IO> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let result = Pin::new(&mut self.io).poll_read(cx, buf);
        let n = buf.filled().len() - before;
        if matches!(result, Poll::Ready(Ok(()))) && n > 0 {
            self.watch.read(n);
        }
        result
    }
}

impl<IO: AsyncWrite + Unpin> AsyncWrite for Watched<IO> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write(cx, buf);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.watch.wrote();
        }
        result
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let result = Pin::new(&mut self.io).poll_write_vectored(cx, bufs);
        if matches!(result, Poll::Ready(Ok(n)) if n > 0) {
            self.watch.wrote();
        }
        result
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn bounds() -> Bounds {
        Bounds {
            head: Duration::from_secs(15),
            idle: Duration::from_secs(600),
            body: Duration::from_secs(30),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_connection_expires_at_the_head_timeout_from_accept() {
        let watch = Watch::new(bounds());
        let started = Instant::now();
        assert_eq!(watch.expired().await, Expired::Head);
        assert_eq!(started.elapsed(), Duration::from_secs(15));
    }

    #[tokio::test(start_paused = true)]
    async fn a_head_disarms_and_an_upgrade_rearms() {
        let watch = Watch::new(bounds());
        watch.got_head();
        let w = watch.clone();
        let started = Instant::now();
        let expiry = tokio::spawn(async move { w.expired().await });
        tokio::time::sleep(Duration::from_secs(100)).await;
        watch.expect_head();
        assert_eq!(expiry.await.unwrap(), Expired::Head);
        assert_eq!(started.elapsed(), Duration::from_secs(115));
    }

    #[tokio::test(start_paused = true)]
    async fn traffic_keeps_a_connection_and_silence_ends_it() {
        let watch = Watch::new(bounds());
        watch.got_head();
        let (a, mut b) = tokio::io::duplex(64);
        let mut a = Watched::new(a, watch.clone());
        let w = watch.clone();
        let started = Instant::now();
        let expiry = tokio::spawn(async move { w.expired().await });
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_secs(300)).await;
            a.write_all(b"x").await.unwrap();
            let mut byte = [0u8; 1];
            b.read_exact(&mut byte).await.unwrap();
        }
        assert!(!expiry.is_finished(), "closed while busy");
        assert_eq!(expiry.await.unwrap(), Expired::Idle);
        let took = started.elapsed();
        // Last byte at 3000 s; closed between idle and idle + a quarter after it.
        assert!(took >= Duration::from_secs(3600), "{took:?}");
        assert!(took <= Duration::from_secs(3750), "{took:?}");
    }

    /// Writes `chunk` on `b` and reads it whole from `a` (the watched side).
    async fn pass(
        a: &mut Watched<tokio::io::DuplexStream>,
        b: &mut tokio::io::DuplexStream,
        chunk: &[u8],
    ) {
        let mut got = vec![0u8; chunk.len()];
        let (w, r) = tokio::join!(b.write_all(chunk), a.read_exact(&mut got));
        w.unwrap();
        r.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_that_keeps_its_rate_stalls_only_without_reads() {
        let watch = Watch::new(bounds());
        let (a, mut b) = tokio::io::duplex(64 << 10);
        let mut a = Watched::new(a, watch.clone());
        let w = watch.clone();
        let started = Instant::now();
        let stalled = tokio::spawn(async move { w.body_stalled().await });
        // 2 MiB every 20 s: well above the minimum rate, so only the gap after it counts.
        let chunk = vec![7u8; 2 << 20];
        for _ in 0..5 {
            tokio::time::sleep(Duration::from_secs(20)).await;
            pass(&mut a, &mut b, &chunk).await;
        }
        assert_eq!(stalled.await.unwrap(), Stalled::Gap);
        let took = started.elapsed();
        assert!(took >= Duration::from_secs(130), "{took:?}");
        assert!(took <= Duration::from_secs(140), "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_body_trickling_a_byte_at_a_time_ends_at_the_whole_body_deadline() {
        let watch = Watch::new(bounds());
        let (a, mut b) = tokio::io::duplex(64);
        let mut a = Watched::new(a, watch.clone());
        let w = watch.clone();
        let started = Instant::now();
        let stalled = tokio::spawn(async move { w.body_stalled().await });
        // A byte every 20 s never leaves a 30 s gap, yet the body never comes.
        while !stalled.is_finished() {
            tokio::time::sleep(Duration::from_secs(20)).await;
            pass(&mut a, &mut b, b"x").await;
            assert!(started.elapsed() < Duration::from_secs(100), "never ended");
        }
        let Stalled::Slow { bytes, secs } = stalled.await.unwrap() else {
            panic!("ended by a gap")
        };
        assert_eq!((bytes, secs), (1, 30));
        assert_eq!(watch.read_bytes.load(Ordering::Relaxed), 2);
    }

    #[test]
    fn the_whole_body_deadline_grows_with_the_bytes_read() {
        assert_eq!(at_min_rate(0), Duration::ZERO);
        assert_eq!(at_min_rate(MIN_BODY_RATE), Duration::from_secs(1));
        assert_eq!(at_min_rate(16 << 20), Duration::from_secs(256));
        assert_eq!(at_min_rate(u64::MAX), at_min_rate(u64::MAX - 1));
    }
}
