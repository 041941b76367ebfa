//! The small words every part of the relay shares: which connection (`Side`), which way
//! along a stream (`Direction`), and the windows we grant.

/// Per-stream and per-connection receive windows we grant each side (as hyper is set up).
pub(super) const STREAM_WINDOW: u32 = 2 * 1024 * 1024;

pub(super) const CONN_WINDOW: u32 = 4 * 1024 * 1024;

/// One of the connections the relay speaks on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Client,
    Upstream,
    Internal,
}

impl Side {
    pub(super) const ALL: [Side; 3] = [Side::Client, Side::Upstream, Side::Internal];

    /// Who misbehaved, as errors say it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "origin",
            Side::Internal => "our server",
        }
    }
}

/// Which way along a stream data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    /// Client → target: the request.
    Up,
    /// Target → client: the answer.
    Down,
}
