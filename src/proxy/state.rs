//! What every connection task shares, built once by the server and read by every door.

use http::uri::Scheme;

use super::auth::ProxyAuthCheck;
use super::shutdown::Shutdown;
use super::ProxyError;
use crate::router::Router;
use crate::status::Status;
use crate::tls::CertStore;

/// What every connection task shares.
pub(crate) struct State {
    pub(crate) intercept: Vec<String>,
    pub(crate) certs: CertStore,
    pub(crate) router: Router,
    pub(crate) auth: Option<ProxyAuthCheck>,
    pub(crate) origin: Origin,
    pub(crate) shutdown: Shutdown,
    /// Live runs for the status page (served by the proxy listener itself).
    pub(crate) status: Status,
    /// HTTP/2 passthrough through the frame relay (`upstream.h2_relay`).
    pub(crate) h2_relay: bool,
}

/// The Cursor origin behind the direct doors.
#[derive(Debug, Clone)]
pub(crate) struct Origin {
    pub(crate) scheme: Scheme,
    pub(crate) host: String,
    pub(crate) port: u16,
}

impl Origin {
    pub(crate) fn parse(url: &str) -> Result<Self, ProxyError> {
        let bad = |reason: &str| ProxyError::Config {
            reason: format!("direct.origin `{url}`: {reason}"),
        };
        let uri: http::Uri = url.parse().map_err(|_| bad("not a URL"))?;
        let scheme = uri.scheme().cloned().ok_or_else(|| bad("no scheme"))?;
        if scheme != Scheme::HTTPS && scheme != Scheme::HTTP {
            return Err(bad("scheme must be http or https"));
        }
        let authority = uri.authority().ok_or_else(|| bad("no host"))?;
        let default = if scheme == Scheme::HTTPS { 443 } else { 80 };
        Ok(Origin {
            host: authority
                .host()
                .trim_start_matches('[')
                .trim_end_matches(']')
                .to_ascii_lowercase(),
            port: authority.port_u16().unwrap_or(default),
            scheme,
        })
    }
}
