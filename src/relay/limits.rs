//! Every bound the relay holds a peer to, in one place. Where the `h2` crate (hyper's HTTP/2)
//! has the same limit, the value mirrors its default.

use tokio::time::Instant;

use super::frame::{ConnError, Reason};

/// What one connection may cost us.
#[derive(Debug, Clone)]
pub(crate) struct Limits {
    /// Streams a client may have open at once: 200 (hyper's server default).
    pub(crate) max_streams: usize,
    /// A header block (HEADERS and all its CONTINUATIONs) larger than this ends the
    /// connection: 256 KiB, as the header list size we advertise.
    pub(crate) max_block: usize,
    /// CONTINUATION frames in one header block: 32, twice what a block at `max_block` needs in
    /// full 16 KiB frames, so a flood of tiny or empty ones (CVE-2024-27316) ends early.
    pub(crate) max_continuations: usize,
    /// Streams the client may reset before their answer (rapid reset, CVE-2023-44487): a
    /// burst of 200, refilled at 10 a second. Each such stream was already sent to the
    /// origin, so this bounds what a client makes the origin start and drop. `h2` bounds the
    /// same with `max_pending_accept_reset_streams` (20 pending at once); we forward at once,
    /// so ours counts over time instead.
    pub(crate) premature_resets: Rate,
    /// Streams we reset because the client broke the stream's rules (`h2`'s
    /// `local_max_error_reset_streams`): 1024 per connection.
    pub(crate) max_error_resets: usize,
    /// Frames from the client that cost us work but carry nothing for a stream — PING,
    /// SETTINGS, PRIORITY, unknown types, empty DATA without END_STREAM (CVE-2019-9512,
    /// -9515, -9518): a burst of 1000, refilled at 100 a second. Keep-alive PINGs and the odd
    /// SETTINGS stay far below.
    pub(crate) control_frames: Rate,
    /// Output waiting for one peer: while more than 1 MiB waits (a peer that does not read),
    /// nothing more is read from it, nor from the client that feeds it, so answers we owe
    /// (PING and SETTINGS ACKs) cannot pile up. `h2` does the same by reading no further
    /// frame while its answer is unsent.
    pub(crate) max_pending_out: usize,
    /// DATA held for a window, from one peer, counted as its bytes plus `frame_overhead` per
    /// frame: over 8 MiB (the 4 MiB window we grant, plus room for 64 Ki frames of
    /// bookkeeping), nothing more is read from it.
    pub(crate) max_buffered: usize,
    /// What one held DATA frame costs besides its bytes (its queue entry and share of the
    /// read buffer): 64 bytes, so 4M one-byte frames count as 260 MB, not 4 MB.
    pub(crate) frame_overhead: usize,
    /// Header blocks we re-encode toward a stream's target may be at most this many times
    /// the size the client sent them in, plus `reencode_per_block` per block and
    /// `reencode_slack` per connection: 4 × input + 256 B + 64 KiB. A block that references a
    /// large entry of the client's own table costs the client one byte; literals from us
    /// would cost the origin thousands.
    pub(crate) reencode_ratio: usize,
    pub(crate) reencode_per_block: usize,
    pub(crate) reencode_slack: usize,
    /// Times one client connection redials the origin after it closed an idle connection:
    /// 16 (an origin that idles out every few minutes; one that closes at once is not
    /// redialled forever).
    pub(crate) max_redials: u32,
    /// Unparsed bytes read from a client while it is held back, only to see it leave:
    /// 4 MiB + 64 KiB, the connection window we grant plus room for its control frames, so a
    /// client that keeps to our windows has sent its EOF by then.
    pub(crate) max_probe: usize,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_streams: 200,
            max_block: 256 * 1024,
            max_continuations: 32,
            premature_resets: Rate::new(200, 10),
            max_error_resets: 1024,
            control_frames: Rate::new(1000, 100),
            max_pending_out: 1024 * 1024,
            max_buffered: 8 * 1024 * 1024,
            frame_overhead: 64,
            reencode_ratio: 4,
            reencode_per_block: 256,
            reencode_slack: 64 * 1024,
            max_redials: 16,
            max_probe: 4 * 1024 * 1024 + 64 * 1024,
        }
    }
}

/// A burst, refilled at a steady rate (events per second).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Rate {
    pub(crate) burst: u32,
    pub(crate) per_sec: u32,
}

impl Rate {
    pub(crate) const fn new(burst: u32, per_sec: u32) -> Self {
        Rate { burst, per_sec }
    }
}

/// A token bucket for one [`Rate`].
#[derive(Debug)]
pub(crate) struct Bucket {
    rate: Rate,
    tokens: f64,
    at: Instant,
}

impl Bucket {
    pub(crate) fn new(rate: Rate) -> Self {
        Bucket {
            rate,
            tokens: rate.burst as f64,
            at: Instant::now(),
        }
    }

    /// Take one token; `false` when the bucket is empty (the rate was exceeded).
    pub(crate) fn take(&mut self) -> bool {
        let now = Instant::now();
        let elapsed = now.saturating_duration_since(self.at);
        self.at = now;
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate.per_sec as f64)
            .min(self.rate.burst as f64);
        if self.tokens < 1.0 {
            return false;
        }
        self.tokens -= 1.0;
        true
    }
}

/// ENHANCE_YOUR_CALM: a peer past one of our limits.
pub(super) fn calm(what: impl Into<String>) -> ConnError {
    ConnError::new(Reason::ENHANCE_YOUR_CALM, what)
}

/// What the client has spent of the budgets [`Limits`] gives it.
#[derive(Debug)]
pub(super) struct Spent {
    /// Streams the client reset before their answer (rapid reset).
    premature_resets: Bucket,
    /// Frames from the client that carry nothing for a stream (PING, SETTINGS, ...).
    control_frames: Bucket,
    /// Streams we reset because the client broke their rules.
    error_resets: usize,
}

impl Spent {
    pub(super) fn new(limits: &Limits) -> Self {
        Spent {
            premature_resets: Bucket::new(limits.premature_resets),
            control_frames: Bucket::new(limits.control_frames),
            error_resets: 0,
        }
    }

    /// A frame that costs us work without carrying anything for a stream.
    pub(super) fn control_frame(&mut self) -> Result<(), ConnError> {
        if self.control_frames.take() {
            return Ok(());
        }
        Err(calm(
            "client: too many PING, SETTINGS, PRIORITY, empty DATA or unknown frames",
        ))
    }

    /// A stream reset by the client before its answer.
    pub(super) fn premature_reset(&mut self) -> Result<(), ConnError> {
        if self.premature_resets.take() {
            return Ok(());
        }
        Err(calm(format!(
            "client: over {} streams reset before their answer (rapid reset)",
            self.premature_resets.rate.burst
        )))
    }

    /// A stream we reset for the client's error.
    pub(super) fn error_reset(&mut self, limits: &Limits) -> Result<(), ConnError> {
        self.error_resets += 1;
        if self.error_resets > limits.max_error_resets {
            return Err(calm(format!(
                "client: over {} streams reset for its errors",
                limits.max_error_resets
            )));
        }
        Ok(())
    }
}

/// For tests: how long a bucket needs to refill `n` tokens.
#[cfg(test)]
pub(crate) fn refill_time(rate: Rate, n: u32) -> std::time::Duration {
    std::time::Duration::from_secs_f64(n as f64 / rate.per_sec as f64)
}
