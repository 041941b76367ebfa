//! Which failures hand a request to the model's next fallback target.

use serde::Deserialize;

/// A failure, before any output, that hands a request to the model's next fallback target.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FailoverOn {
    /// The connection failed or broke before anything arrived.
    Connect,
    /// HTTP 429 or a rate-limit error.
    RateLimit,
    /// HTTP 5xx or a server error.
    Server,
    /// HTTP 529 or an `overloaded` error.
    Overloaded,
    /// No first token within `first_token_timeout_secs` (or a connect/408 timeout).
    Timeout,
}
