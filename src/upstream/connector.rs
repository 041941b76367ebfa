//! The pooled client's connector: our dialer, then rustls with the OS trust store.

use std::future::Future;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use http::Uri;
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::pki_types::ServerName;
use rustls::{ClientConfig, RootCertStore};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;
use tokio_rustls::TlsConnector;

use super::dial::Dialer;
use super::error::UpstreamError;

/// The OS roots (corporate roots included) plus the optional extra PEM file.
pub(crate) fn root_store(extra_roots: Option<&Path>) -> Result<RootCertStore, UpstreamError> {
    let mut roots = RootCertStore::empty();
    // Individual unreadable or unparsable system certificates are skipped, not fatal.
    let native = rustls_native_certs::load_native_certs();
    for e in &native.errors {
        tracing::debug!(error = %e, "skipping part of the OS trust store");
    }
    let (added, ignored) = roots.add_parsable_certificates(native.certs);
    tracing::debug!(added, ignored, "OS trust store loaded");
    if let Some(path) = extra_roots {
        let setup = |reason: String| UpstreamError::Setup {
            reason: format!("upstream.extra_roots {}: {reason}", path.display()),
        };
        let pem = std::fs::read(path).map_err(|e| setup(e.to_string()))?;
        let mut found = 0;
        for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
            let cert = cert.map_err(|e| setup(e.to_string()))?;
            roots.add(cert).map_err(|e| setup(e.to_string()))?;
            found += 1;
        }
        if found == 0 {
            return Err(setup("no PEM certificate in the file".into()));
        }
    }
    if roots.is_empty() {
        tracing::warn!("no trusted roots: every upstream TLS handshake will fail");
    }
    Ok(roots)
}

/// A client config offering exactly `alpn`, hostname verification on.
pub(crate) fn client_config(
    roots: RootCertStore,
    alpn: &[u8],
) -> Result<ClientConfig, UpstreamError> {
    let mut config = ClientConfig::builder_with_provider(crate::tls::crypto_provider())
        .with_safe_default_protocol_versions()
        .map_err(|e| UpstreamError::Setup {
            reason: e.to_string(),
        })?
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![alpn.to_vec()];
    Ok(config)
}

/// Dials `uri`'s host and, for `https`, runs TLS with SNI = that host.
#[derive(Clone)]
pub(crate) struct Connector {
    dialer: Arc<Dialer>,
    tls: TlsConnector,
}

impl Connector {
    pub(crate) fn new(dialer: Arc<Dialer>, tls: ClientConfig) -> Self {
        Connector {
            dialer,
            tls: TlsConnector::from(Arc::new(tls)),
        }
    }

    pub(super) async fn connect(self, uri: Uri) -> Result<TokioIo<Stream>, UpstreamError> {
        let host = uri.host().unwrap_or_default().to_string();
        let https = uri.scheme_str() == Some("https");
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = self.dialer.dial(&host, port).await?;
        if !https {
            return Ok(TokioIo::new(Stream::Plain(tcp)));
        }
        let bare = crate::http::bare_host(&host);
        let name = ServerName::try_from(bare.to_string()).map_err(|e| UpstreamError::Tls {
            host: host.clone(),
            reason: e.to_string(),
        })?;
        let handshake = self.tls.connect(name, tcp);
        let tls = match tokio::time::timeout(self.dialer.timeout(), handshake).await {
            Ok(Ok(tls)) => tls,
            Ok(Err(e)) => {
                return Err(UpstreamError::Tls {
                    host,
                    reason: tls_reason(&e),
                })
            }
            Err(_) => {
                return Err(UpstreamError::Timeout {
                    host,
                    secs: self.dialer.timeout().as_secs(),
                })
            }
        };
        Ok(TokioIo::new(Stream::Tls(Box::new(Tls {
            io: tls,
            failed: None,
        }))))
    }
}

/// rustls puts the useful part (e.g. "invalid peer certificate: UnknownIssuer") in the inner error.
fn tls_reason(err: &io::Error) -> String {
    match err.get_ref() {
        Some(inner) => inner.to_string(),
        None => super::error::io_reason(err),
    }
}

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Stream>;
    type Error = UpstreamError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        Box::pin(self.clone().connect(uri))
    }
}

/// A dialled connection, plain or TLS.
pub(crate) enum Stream {
    Plain(TcpStream),
    Tls(Box<Tls>),
}

/// A TLS connection to the origin, read as far as records are ready.
pub(crate) struct Tls {
    io: TlsStream<TcpStream>,
    /// A read failed after it had brought bytes: returned by the next read.
    failed: Option<io::Error>,
}

impl Tls {
    fn poll_read_ready(
        &mut self,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        poll_read_on(&mut self.io, &mut self.failed, cx, buf)
    }
}

/// TLS hands out one record's plaintext (at most 16 KiB) per read. Read that way, a bulk
/// answer reaches hyper, and from there the client, in 16 KiB pieces: each a body chunk,
/// a hand-off between tasks and a write of its own. Reading on while records are ready
/// fills the caller's buffer (hyper's is bounded by its `max_buf_size`, the relay's by its
/// read size) in one call; it stops at the first read that would wait. A read that fails
/// after others brought bytes leaves its error in `failed`, returned by the next call.
fn poll_read_on<R: AsyncRead + Unpin>(
    io: &mut R,
    failed: &mut Option<io::Error>,
    cx: &mut Context<'_>,
    buf: &mut ReadBuf<'_>,
) -> Poll<io::Result<()>> {
    if let Some(e) = failed.take() {
        return Poll::Ready(Err(e));
    }
    let start = buf.filled().len();
    while buf.remaining() > 0 {
        let before = buf.filled().len();
        match Pin::new(&mut *io).poll_read(cx, buf) {
            // The end of the stream: the next read sees it again.
            Poll::Ready(Ok(())) if buf.filled().len() == before => break,
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(e)) if before > start => {
                *failed = Some(e);
                break;
            }
            Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
            Poll::Pending if before > start => break,
            Poll::Pending => return Poll::Pending,
        }
    }
    Poll::Ready(Ok(()))
}

impl Stream {
    /// Did ALPN pick HTTP/2?
    pub(crate) fn is_h2(&self) -> bool {
        match self {
            Stream::Plain(_) => false,
            Stream::Tls(tls) => tls.io.get_ref().1.alpn_protocol() == Some(b"h2"),
        }
    }
}

impl Connection for Stream {
    fn connected(&self) -> Connected {
        match self {
            Stream::Plain(_) => Connected::new(),
            Stream::Tls(_) if self.is_h2() => Connected::new().negotiated_h2(),
            Stream::Tls(_) => Connected::new(),
        }
    }
}

impl AsyncRead for Stream {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Stream::Tls(s) => s.poll_read_ready(cx, buf),
        }
    }
}

impl AsyncWrite for Stream {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Stream::Tls(s) => Pin::new(&mut s.io).poll_write(cx, buf),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Stream::Tls(s) => Pin::new(&mut s.io).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Stream::Plain(s) => s.is_write_vectored(),
            Stream::Tls(s) => s.io.is_write_vectored(),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_flush(cx),
            Stream::Tls(s) => Pin::new(&mut s.io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Stream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Stream::Tls(s) => Pin::new(&mut s.io).poll_shutdown(cx),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// Hands out its script one step per read: bytes, a wait, or a failure.
    struct Script(VecDeque<Poll<io::Result<&'static [u8]>>>);

    impl AsyncRead for Script {
        fn poll_read(
            mut self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            buf: &mut ReadBuf<'_>,
        ) -> Poll<io::Result<()>> {
            match self.0.pop_front() {
                None => Poll::Ready(Ok(())),
                Some(Poll::Pending) => Poll::Pending,
                Some(Poll::Ready(Ok(bytes))) => {
                    buf.put_slice(bytes);
                    Poll::Ready(Ok(()))
                }
                Some(Poll::Ready(Err(e))) => Poll::Ready(Err(e)),
            }
        }
    }

    /// One call of [`poll_read_on`] into a buffer of `cap` bytes: what it returned and read.
    fn read_on(
        io: &mut Script,
        failed: &mut Option<io::Error>,
        cap: usize,
    ) -> Poll<io::Result<Vec<u8>>> {
        let mut storage = vec![0u8; cap];
        let mut buf = ReadBuf::new(&mut storage);
        let mut cx = Context::from_waker(std::task::Waker::noop());
        match poll_read_on(io, failed, &mut cx, &mut buf) {
            Poll::Pending => Poll::Pending,
            Poll::Ready(Ok(())) => Poll::Ready(Ok(buf.filled().to_vec())),
            Poll::Ready(Err(e)) => Poll::Ready(Err(e)),
        }
    }

    /// The bytes a read returned; anything else fails the test.
    fn read_bytes(got: Poll<io::Result<Vec<u8>>>) -> Vec<u8> {
        match got {
            Poll::Ready(Ok(bytes)) => bytes,
            other => panic!("expected bytes, got {other:?}"),
        }
    }

    fn reset() -> io::Error {
        io::Error::from(io::ErrorKind::ConnectionReset)
    }

    #[test]
    fn reads_on_until_a_read_would_wait() {
        let mut io = Script(VecDeque::from([
            Poll::Ready(Ok(&b"one"[..])),
            Poll::Ready(Ok(&b"two"[..])),
            Poll::Pending,
            Poll::Ready(Ok(&b"three"[..])),
        ]));
        let mut failed = None;
        assert_eq!(read_bytes(read_on(&mut io, &mut failed, 64)), b"onetwo");
        assert_eq!(read_bytes(read_on(&mut io, &mut failed, 64)), b"three");
    }

    #[test]
    fn waits_when_nothing_is_ready_and_stops_at_a_full_buffer() {
        let mut io = Script(VecDeque::from([
            Poll::Pending,
            Poll::Ready(Ok(&b"abcd"[..])),
            Poll::Ready(Ok(&b"ef"[..])),
        ]));
        let mut failed = None;
        assert!(read_on(&mut io, &mut failed, 4).is_pending());
        assert_eq!(read_bytes(read_on(&mut io, &mut failed, 4)), b"abcd");
        // The full buffer ended the call: the next read was left for the next call.
        assert_eq!(read_bytes(read_on(&mut io, &mut failed, 4)), b"ef");
    }

    #[test]
    fn a_failure_after_bytes_comes_with_the_next_read() {
        let mut io = Script(VecDeque::from([
            Poll::Ready(Ok(&b"data"[..])),
            Poll::Ready(Err(reset())),
        ]));
        let mut failed = None;
        assert_eq!(read_bytes(read_on(&mut io, &mut failed, 64)), b"data");
        let got = read_on(&mut io, &mut failed, 64);
        assert!(
            matches!(got, Poll::Ready(Err(ref e)) if e.kind() == io::ErrorKind::ConnectionReset),
            "{got:?}"
        );
    }

    #[test]
    fn the_end_of_the_stream_ends_the_call_and_is_seen_again() {
        let mut io = Script(VecDeque::from([Poll::Ready(Ok(&b"last"[..]))]));
        let mut failed = None;
        assert_eq!(read_bytes(read_on(&mut io, &mut failed, 64)), b"last");
        assert!(
            read_bytes(read_on(&mut io, &mut failed, 64)).is_empty(),
            "the end again"
        );
    }
}
