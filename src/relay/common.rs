//! The small words every part of the relay shares: which connection (`Conn`), which way
//! along a stream (`Direction`), and the windows we grant.

/// Per-stream and per-connection receive windows we grant each side (as hyper is set up).
pub(super) const STREAM_WINDOW: u32 = 2 * 1024 * 1024;

pub(super) const CONN_WINDOW: u32 = 4 * 1024 * 1024;

/// One of the connections the relay speaks on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Conn {
    Client,
    Upstream,
    Internal,
}

impl Conn {
    pub(super) const ALL: [Conn; 3] = [Conn::Client, Conn::Upstream, Conn::Internal];

    /// Who misbehaved, as errors say it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Conn::Client => "client",
            Conn::Upstream => "origin",
            Conn::Internal => "our server",
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
