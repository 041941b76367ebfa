//! Byte-exact copying both ways between two connections (CONNECT tunnels, upgraded
//! WebSockets), bounded in time: a splice silent both ways for `idle` ends, and so does one
//! whose second side has not finished `half_close` after the first sent its FIN — a peer that
//! ignores FIN must not hold the other connection in CLOSE-WAIT for ever.

use std::io;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::time::Instant;

/// Copy buffer for spliced WebSocket and tunnel bytes.
const SPLICE_BUF: usize = 64 * 1024;

/// How long a splice may stay silent, or half closed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SpliceLimits {
    pub idle: Duration,
    pub half_close: Duration,
}

impl Default for SpliceLimits {
    fn default() -> Self {
        SpliceLimits {
            idle: Duration::from_secs(600),
            half_close: Duration::from_secs(60),
        }
    }
}

/// How a splice ended.
#[derive(Debug, PartialEq, Eq)]
pub enum SpliceEnd {
    /// Both sides finished; bytes carried `a → b` and `b → a`.
    Done { a_to_b: u64, b_to_a: u64 },
    /// No byte either way for the idle timeout.
    Idle,
    /// One side finished and the other did not within the half-close timeout.
    HalfClosed,
    /// A read or write failed.
    Failed(io::ErrorKind),
}

/// Copy `a ↔ b` until both sides finish, one fails, or a timeout in `limits` ends it. Both
/// connections are dropped (closed) on return.
pub async fn splice<A, B>(a: A, b: B, limits: SpliceLimits) -> SpliceEnd
where
    A: AsyncRead + AsyncWrite + Unpin,
    B: AsyncRead + AsyncWrite + Unpin,
{
    let start = Instant::now();
    let last = AtomicU64::new(0);
    let (a_read, a_write) = tokio::io::split(a);
    let (b_read, b_write) = tokio::io::split(b);
    let up = pump(a_read, b_write, start, &last);
    let down = pump(b_read, a_write, start, &last);
    tokio::pin!(up, down);
    let (mut a_to_b, mut b_to_a) = (None, None);
    let mut half_deadline: Option<Instant> = None;
    loop {
        let idle_at = activity(start, &last) + limits.idle;
        let half_at = half_deadline.unwrap_or(idle_at);
        tokio::select! {
            done = &mut up, if a_to_b.is_none() => match done {
                Ok(n) => a_to_b = Some(n),
                Err(e) => return SpliceEnd::Failed(e.kind()),
            },
            done = &mut down, if b_to_a.is_none() => match done {
                Ok(n) => b_to_a = Some(n),
                Err(e) => return SpliceEnd::Failed(e.kind()),
            },
            _ = tokio::time::sleep_until(idle_at) => {
                // Bytes may have moved while this timer was armed: look again.
                if Instant::now() >= activity(start, &last) + limits.idle {
                    return SpliceEnd::Idle;
                }
            }
            _ = tokio::time::sleep_until(half_at), if half_deadline.is_some() => {
                return SpliceEnd::HalfClosed;
            }
        }
        match (a_to_b, b_to_a) {
            (Some(a_to_b), Some(b_to_a)) => return SpliceEnd::Done { a_to_b, b_to_a },
            (Some(_), None) | (None, Some(_)) if half_deadline.is_none() => {
                half_deadline = Some(Instant::now() + limits.half_close);
            }
            _ => {}
        }
    }
}

fn activity(start: Instant, last: &AtomicU64) -> Instant {
    start + Duration::from_millis(last.load(Ordering::Relaxed))
}

/// Copy `from → to` until `from` ends, then pass the FIN on. Every read marks `last`.
async fn pump<R, W>(mut from: R, mut to: W, start: Instant, last: &AtomicU64) -> io::Result<u64>
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let mut buf = vec![0u8; SPLICE_BUF];
    let mut total = 0u64;
    loop {
        let n = from.read(&mut buf).await?;
        if n == 0 {
            to.shutdown().await?;
            return Ok(total);
        }
        let millis = u64::try_from(start.elapsed().as_millis()).unwrap_or(u64::MAX);
        last.store(millis, Ordering::Relaxed);
        to.write_all(&buf[..n]).await?;
        total += n as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::DuplexStream;

    const LIMITS: SpliceLimits = SpliceLimits {
        idle: Duration::from_secs(600),
        half_close: Duration::from_secs(60),
    };

    /// `(client, server, splice)`: the splice joins the far ends of two in-memory pipes.
    fn pair() -> (
        DuplexStream,
        DuplexStream,
        tokio::task::JoinHandle<SpliceEnd>,
    ) {
        let (client, a) = tokio::io::duplex(1024);
        let (b, server) = tokio::io::duplex(1024);
        let task = tokio::spawn(splice(a, b, LIMITS));
        (client, server, task)
    }

    async fn echo_once(client: &mut DuplexStream, server: &mut DuplexStream) {
        client.write_all(b"ping").await.unwrap();
        let mut buf = [0u8; 4];
        server.read_exact(&mut buf).await.unwrap();
        assert_eq!(&buf, b"ping");
    }

    #[tokio::test(start_paused = true)]
    async fn a_tunnel_with_traffic_every_few_minutes_lives_for_hours() {
        let (mut client, mut server, task) = pair();
        let started = Instant::now();
        while started.elapsed() < Duration::from_secs(3 * 3600) {
            echo_once(&mut client, &mut server).await;
            tokio::time::sleep(Duration::from_secs(5 * 60)).await;
            assert!(!task.is_finished(), "closed after {:?}", started.elapsed());
        }
        drop((client, server));
        let end = task.await.unwrap();
        assert!(matches!(end, SpliceEnd::Done { .. }), "{end:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_silent_tunnel_closes_at_the_idle_timeout() {
        let (mut client, mut server, task) = pair();
        echo_once(&mut client, &mut server).await;
        let started = Instant::now();
        assert_eq!(task.await.unwrap(), SpliceEnd::Idle);
        assert_eq!(started.elapsed(), LIMITS.idle);
        // Both far ends see the close.
        let mut buf = [0u8; 1];
        assert_eq!(client.read(&mut buf).await.unwrap(), 0);
        assert_eq!(server.read(&mut buf).await.unwrap(), 0);
    }

    #[tokio::test(start_paused = true)]
    async fn a_peer_that_ignores_fin_is_closed_after_the_half_close_timeout() {
        let (mut client, mut server, task) = pair();
        echo_once(&mut client, &mut server).await;
        let started = Instant::now();
        client.shutdown().await.unwrap();
        // The FIN reaches the server, which never answers with its own.
        let mut buf = [0u8; 1];
        assert_eq!(server.read(&mut buf).await.unwrap(), 0);
        assert_eq!(task.await.unwrap(), SpliceEnd::HalfClosed);
        assert_eq!(started.elapsed(), LIMITS.half_close);
    }

    #[tokio::test(start_paused = true)]
    async fn a_half_closed_tunnel_still_carries_the_answer() {
        let (mut client, mut server, task) = pair();
        client.write_all(b"request").await.unwrap();
        client.shutdown().await.unwrap();
        let mut got = Vec::new();
        server.read_to_end(&mut got).await.unwrap();
        assert_eq!(got, b"request");
        tokio::time::sleep(Duration::from_secs(30)).await;
        server.write_all(b"answer").await.unwrap();
        server.shutdown().await.unwrap();
        let mut answer = Vec::new();
        client.read_to_end(&mut answer).await.unwrap();
        assert_eq!(answer, b"answer");
        assert_eq!(
            task.await.unwrap(),
            SpliceEnd::Done {
                a_to_b: 7,
                b_to_a: 6
            }
        );
    }
}
