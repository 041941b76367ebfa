//! What can go wrong talking to the real origin, and which side is to blame.

use crate::base::Side;

#[derive(Debug, Clone, thiserror::Error)]
pub enum UpstreamError {
    #[error("upstream {host} unresolvable: {reason}")]
    Resolve { host: String, reason: String },
    #[error("upstream {host} unreachable: {reason}")]
    Connect { host: String, reason: String },
    #[error("upstream {host} did not answer within {secs}s")]
    Timeout { host: String, secs: u64 },
    #[error("outbound proxy {proxy} refused the tunnel to {host}: {reason}")]
    Proxy {
        proxy: String,
        host: String,
        reason: String,
    },
    #[error("upstream {host} TLS handshake failed: {reason}")]
    Tls { host: String, reason: String },
    #[error("refusing to dial {addr}: it is cursor-byok's own listener (a loop)")]
    Loop { addr: std::net::SocketAddr },
    #[error("upstream {host} failed: {reason}")]
    Request { host: String, reason: String },
    #[error("upstream setup: {reason}")]
    Setup { reason: String },
}

impl UpstreamError {
    /// The origin (or the network to it), or cursor-byok itself.
    pub fn side(&self) -> Side {
        match self {
            UpstreamError::Loop { .. } | UpstreamError::Setup { .. } => Side::Proxy,
            _ => Side::Upstream,
        }
    }

    /// Could the same request succeed if tried again?
    pub fn retryable(&self) -> bool {
        matches!(
            self,
            UpstreamError::Resolve { .. }
                | UpstreamError::Connect { .. }
                | UpstreamError::Timeout { .. }
                | UpstreamError::Proxy { .. }
                | UpstreamError::Request { .. }
        )
    }

    /// The text a client sees: what failed, and whether retrying may help.
    pub fn client_message(&self) -> String {
        let hint = if self.retryable() {
            " (retry may help)"
        } else {
            ""
        };
        crate::base::secret::scrub(&format!("cursor-byok: {self}{hint}")).into_owned()
    }

    /// From a legacy-client error: our own connector error if that is what failed, else the
    /// whole cause chain as the reason.
    pub(crate) fn from_client(host: &str, err: &hyper_util::client::legacy::Error) -> Self {
        let mut source: Option<&(dyn std::error::Error + 'static)> = Some(err);
        while let Some(e) = source {
            if let Some(ours) = e.downcast_ref::<UpstreamError>() {
                return ours.clone();
            }
            source = e.source();
        }
        UpstreamError::Request {
            host: host.to_string(),
            reason: cause_chain(err),
        }
    }
}

/// `a: b: c` from an error and its sources, skipping repeats.
pub(crate) fn cause_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut parts: Vec<String> = Vec::new();
    let mut source = Some(err);
    while let Some(e) = source {
        let text = e.to_string();
        if !parts.iter().any(|p| p.contains(&text)) {
            parts.push(text);
        }
        source = e.source();
    }
    parts.join(": ")
}

/// A short lower-case reason for an IO error ("connection refused"), without the OS number.
pub(crate) fn io_reason(err: &std::io::Error) -> String {
    use std::io::ErrorKind::*;
    let text = match err.kind() {
        ConnectionRefused => "connection refused",
        ConnectionReset => "connection reset",
        ConnectionAborted => "connection aborted",
        TimedOut => "timed out",
        HostUnreachable => "host unreachable",
        NetworkUnreachable => "network unreachable",
        AddrNotAvailable => "address not available",
        UnexpectedEof => "connection closed early",
        _ => return err.to_string(),
    };
    text.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_names_host_reason_and_retry() {
        let e = UpstreamError::Connect {
            host: "api2.cursor.sh".into(),
            reason: io_reason(&std::io::Error::from(std::io::ErrorKind::ConnectionRefused)),
        };
        assert_eq!(
            e.client_message(),
            "cursor-byok: upstream api2.cursor.sh unreachable: connection refused (retry may help)"
        );
        assert_eq!(e.side(), Side::Upstream);
        let l = UpstreamError::Loop {
            addr: "127.0.0.1:8787".parse().unwrap(),
        };
        assert_eq!(l.side(), Side::Proxy);
        assert!(!l.retryable());
    }
}
