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

/// Whether a request's body has been read to its end, for the body timer of the connection it
/// came on: the door puts one in the request's extensions when that timer runs, and the timer
/// stops once it is marked, since what follows (the run, the origin's answer) is not the
/// client's to hurry. A request without one has no timer: marking is then a no-op.
#[derive(Debug, Clone, Default)]
pub struct BodyRead(tokio_util::sync::CancellationToken);

impl BodyRead {
    /// The body of the request with `extensions` has been read whole.
    pub fn mark(extensions: &http::Extensions) {
        if let Some(read) = extensions.get::<BodyRead>() {
            read.0.cancel();
        }
    }

    /// Whether the body has been read whole.
    pub fn is_done(&self) -> bool {
        self.0.is_cancelled()
    }

    /// Ends once the body has been read whole.
    pub async fn done(&self) {
        self.0.cancelled().await;
    }

    /// `body`, marking the request's [`BodyRead`] (if any) when its end is reached: for a body
    /// streamed on rather than read here.
    pub fn marking<B>(extensions: &http::Extensions, body: B) -> MarkEnd<B> {
        MarkEnd {
            body,
            read: extensions.get::<BodyRead>().cloned(),
        }
    }
}

/// A body that marks a [`BodyRead`] when its end is reached (see [`BodyRead::marking`]).
pub struct MarkEnd<B> {
    body: B,
    read: Option<BodyRead>,
}

impl<B> MarkEnd<B> {
    fn mark_if(&mut self, ended: bool) {
        if ended {
            if let Some(read) = self.read.take() {
                read.0.cancel();
            }
        }
    }
}

impl<B: http_body::Body + Unpin> http_body::Body for MarkEnd<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<B::Data>, B::Error>>> {
        let polled = std::pin::Pin::new(&mut self.body).poll_frame(cx);
        if let std::task::Poll::Ready(frame) = &polled {
            let ended = frame.is_none() || self.body.is_end_stream();
            self.mark_if(ended);
        }
        polled
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_marking_body_marks_its_end_and_only_its_end() {
        let read = BodyRead::default();
        let mut extensions = http::Extensions::new();
        extensions.insert(read.clone());
        let frames = (0..2).map(|_| Ok::<_, BodyError>(http_body::Frame::data(Bytes::new())));
        let stream = http_body_util::StreamBody::new(futures_util::stream::iter(frames));
        let mut body = BodyRead::marking(&extensions, stream);
        assert!(body.frame().await.is_some());
        assert!(!read.is_done(), "more may come");
        assert!(body.frame().await.is_some());
        assert!(body.frame().await.is_none());
        assert!(read.is_done());
        // Without a `BodyRead` on the request, nothing to mark.
        let mut plain = BodyRead::marking(&http::Extensions::new(), Full::new(Bytes::new()));
        assert!(plain.frame().await.is_none());
    }
}
