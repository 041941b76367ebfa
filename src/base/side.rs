//! Which party a failure belongs to. Errors of every room name their side with this one type,
//! so a log line, an `ErrorDetails` entry and the status page all say it the same way.

use std::fmt;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Side {
    /// The user (a cancel).
    User,
    /// Cursor's client: it left, sent something unusable, or did not answer.
    Client,
    /// The real origin, or the network and outbound proxy on the way to it.
    Upstream,
    /// The user's model provider.
    Provider,
    /// cursor-byok itself: a bug, a limit, or something it does not support.
    Proxy,
}

impl Side {
    /// The side's name as logs and `ErrorDetails.additional_info["side"]` carry it.
    pub fn as_str(self) -> &'static str {
        match self {
            Side::User => "user",
            Side::Client => "cursor-client",
            Side::Upstream => "upstream",
            Side::Provider => "provider",
            Side::Proxy => "cursor-byok",
        }
    }
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}
