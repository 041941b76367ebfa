//! The HTTP types every room shares: the one body type every handler answers with, and the
//! context a request arrived in. A leaf: it imports nothing from the crate.

use std::net::SocketAddr;

use bytes::Bytes;
use http::uri::Scheme;
use http::Version;
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// HTTP/2 flow-control windows for every connection we open or accept: large enough that one
/// stream can fill a fast link, the connection's twice that so two can.
pub const H2_STREAM_WINDOW: u32 = 2 * 1024 * 1024;
pub const H2_CONN_WINDOW: u32 = 4 * 1024 * 1024;
/// HTTP/2 pings on an idle connection, so a dead peer is noticed (the relay: a PING when
/// streams are open and nothing arrived for this long; no answer by the next tick and the
/// upstream connection counts as dead).
pub const H2_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_secs(30);

/// A host as URIs and `Host` headers write it, without the brackets of an IPv6 literal
/// (`[::1]` → `::1`): the form resolvers, TLS server names and comparisons take.
pub fn bare_host(host: &str) -> &str {
    host.strip_prefix('[')
        .and_then(|h| h.strip_suffix(']'))
        .unwrap_or(host)
}

/// The host of an authority, bare and lower-case: how routing and pinning compare hosts.
pub fn host_of(authority: &http::uri::Authority) -> String {
    bare_host(authority.host()).to_ascii_lowercase()
}

/// Errors a body can end with (hyper's, a provider's, a codec's).
pub type BodyError = Box<dyn std::error::Error + Send + Sync>;

/// A streaming body: frames flow as they are produced, never buffered whole. `Send` but not
/// `Sync`, so channel- or stream-backed bodies fit without wrappers.
pub type Body = UnsyncBoxBody<Bytes, BodyError>;

/// Box any body whose error converts into [`BodyError`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BodyError>,
{
    body.map_err(Into::into).boxed_unsync()
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    boxed(Full::new(bytes.into()))
}

pub fn empty() -> Body {
    boxed(Empty::<Bytes>::new())
}

/// Which listener a request came through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Door {
    /// TLS terminated after `CONNECT` on the proxy listener.
    Connect,
    /// An absolute-form plain-HTTP request on the proxy listener.
    PlainProxy,
    /// The direct TLS listener (clients that take a backend URL).
    DirectTls,
    /// The direct plain-HTTP listener.
    DirectHttp,
}

/// Where a request is headed and how it arrived.
#[derive(Debug, Clone)]
pub struct RequestContext {
    /// Scheme of the origin (`https` for intercepted hosts and the default direct origin).
    pub scheme: Scheme,
    /// Origin host, lower-case, without brackets for IPv6.
    pub host: String,
    /// Origin port.
    pub port: u16,
    /// HTTP version on the client side of this request.
    pub client_version: Version,
    pub door: Door,
    pub peer: SocketAddr,
}

impl RequestContext {
    /// `host` or `host:port` when the port is not the scheme's default: the `Host` /
    /// `:authority` value the origin expects.
    pub fn authority(&self) -> String {
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        let default = if self.scheme == Scheme::HTTPS {
            443
        } else {
            80
        };
        if self.port == default {
            host
        } else {
            format!("{host}:{}", self.port)
        }
    }
}
