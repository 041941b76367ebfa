//! A test client for the front door: CONNECT through the proxy, TLS trusting given roots, then
//! an HTTP/1.1 or HTTP/2 hyper client connection.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper_util::rt::{TokioExecutor, TokioIo};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::client::TlsStream;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
pub type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Alpn {
    H1,
    H2,
}

impl Alpn {
    pub fn both() -> [Alpn; 2] {
        [Alpn::H1, Alpn::H2]
    }
}

pub fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed_unsync()
}

pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

/// A request body fed from a channel, one data frame per message.
pub fn channel_body() -> (mpsc::Sender<Bytes>, Body) {
    let (tx, rx) = mpsc::channel::<Bytes>(4);
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv()
            .await
            .map(|b| (Ok::<_, BoxError>(Frame::data(b)), rx))
    });
    (tx, StreamBody::new(stream).boxed_unsync())
}

/// Send `CONNECT target` (with an optional `Proxy-Authorization` value) and read the answer's
/// head. Returns the status code, the head text, and the stream positioned after the head.
pub async fn connect_raw(
    proxy: SocketAddr,
    target: &str,
    auth: Option<&str>,
) -> (u16, String, TcpStream) {
    let mut stream = TcpStream::connect(proxy).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut head = format!("CONNECT {target} HTTP/1.1\r\nHost: {target}\r\n");
    if let Some(auth) = auth {
        head.push_str(&format!("Proxy-Authorization: {auth}\r\n"));
    }
    head.push_str("\r\n");
    stream.write_all(head.as_bytes()).await.unwrap();
    let answer = read_head(&mut stream).await;
    let status = answer
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, answer, stream)
}

/// Read an HTTP/1.1 head byte by byte; a body after it, if any, stays unread.
pub async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> String {
    let mut head = Vec::new();
    while !head.ends_with(b"\r\n\r\n") {
        match stream.read_u8().await {
            Ok(b) => head.push(b),
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&head).into_owned()
}

/// A tunnel through the proxy; panics unless the proxy answered 200.
pub async fn tunnel(proxy: SocketAddr, target: &str) -> TcpStream {
    let (status, head, stream) = connect_raw(proxy, target, None).await;
    assert_eq!(status, 200, "CONNECT {target}: {head}");
    stream
}

pub fn roots(certs: &[&CertificateDer<'static>]) -> rustls::RootCertStore {
    let mut roots = rustls::RootCertStore::empty();
    for cert in certs {
        roots.add((*cert).clone()).unwrap();
    }
    roots
}

/// TLS over `io` to `server_name`, trusting only `roots`, offering one ALPN protocol.
pub async fn tls<IO>(
    io: IO,
    server_name: &str,
    roots: rustls::RootCertStore,
    alpn: Alpn,
) -> std::io::Result<TlsStream<IO>>
where
    IO: AsyncRead + AsyncWrite + Unpin,
{
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    config.alpn_protocols = vec![match alpn {
        Alpn::H1 => b"http/1.1".to_vec(),
        Alpn::H2 => b"h2".to_vec(),
    }];
    let name = ServerName::try_from(server_name.to_string()).unwrap();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, io)
        .await
}

/// A hyper client connection, HTTP/1.1 (with upgrades) or HTTP/2.
pub enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Body>),
    H2(hyper::client::conn::http2::SendRequest<Body>),
}

impl Sender {
    pub async fn handshake<IO>(io: IO, alpn: Alpn) -> Sender
    where
        IO: AsyncRead + AsyncWrite + Unpin + Send + 'static,
    {
        let io = TokioIo::new(io);
        match alpn {
            Alpn::H1 => {
                let (send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
                tokio::spawn(conn.with_upgrades());
                Sender::H1(send)
            }
            Alpn::H2 => {
                let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                    .initial_stream_window_size(2 * 1024 * 1024)
                    .initial_connection_window_size(4 * 1024 * 1024)
                    .handshake(io)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                Sender::H2(send)
            }
        }
    }

    /// Send `req` (a path-only URI is fine; `Host` is filled in for HTTP/1.1 and `:authority`
    /// for HTTP/2 from `authority`).
    pub async fn send(
        &mut self,
        authority: &str,
        mut req: Request<Body>,
    ) -> hyper::Result<Response<Incoming>> {
        match self {
            Sender::H1(send) => {
                req.headers_mut()
                    .entry("host")
                    .or_insert_with(|| authority.parse().unwrap());
                send.ready().await?;
                send.send_request(req).await
            }
            Sender::H2(send) => {
                let path = req
                    .uri()
                    .path_and_query()
                    .map(|p| p.as_str().to_string())
                    .unwrap_or_else(|| "/".into());
                *req.uri_mut() = format!("https://{authority}{path}").parse().unwrap();
                *req.version_mut() = http::Version::HTTP_2;
                send.ready().await?;
                send.send_request(req).await
            }
        }
    }
}

/// CONNECT to `target`, TLS as `server_name` trusting `roots`, then an HTTP connection.
pub async fn via_proxy(
    proxy: SocketAddr,
    target: &str,
    server_name: &str,
    roots: rustls::RootCertStore,
    alpn: Alpn,
) -> Sender {
    via_proxy_auth(proxy, target, server_name, roots, alpn, None).await
}

/// [`via_proxy`], sending `auth` as `Proxy-Authorization` on the CONNECT.
pub async fn via_proxy_auth(
    proxy: SocketAddr,
    target: &str,
    server_name: &str,
    roots: rustls::RootCertStore,
    alpn: Alpn,
    auth: Option<&str>,
) -> Sender {
    let (status, head, stream) = connect_raw(proxy, target, auth).await;
    assert_eq!(status, 200, "CONNECT {target}: {head}");
    let tls = tls(stream, server_name, roots, alpn).await.unwrap();
    assert_eq!(
        tls.get_ref().1.alpn_protocol(),
        Some(match alpn {
            Alpn::H1 => &b"http/1.1"[..],
            Alpn::H2 => &b"h2"[..],
        }),
        "the proxy serves the protocol the client picked"
    );
    Sender::handshake(tls, alpn).await
}

/// [`via_proxy`] over HTTP/2 with the given receive windows (stream, connection): small ones
/// make the proxy hold data back until the client reads.
pub async fn via_proxy_h2_windows(
    proxy: SocketAddr,
    target: &str,
    server_name: &str,
    roots: rustls::RootCertStore,
    windows: (u32, u32),
) -> Sender {
    let stream = tunnel(proxy, target).await;
    let tls = tls(stream, server_name, roots, Alpn::H2).await.unwrap();
    let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(windows.0)
        .initial_connection_window_size(windows.1)
        .adaptive_window(false)
        .handshake(TokioIo::new(tls))
        .await
        .unwrap();
    tokio::spawn(conn);
    Sender::H2(send)
}

/// Directly to a TLS server at `addr` as `server_name`.
pub async fn direct(
    addr: SocketAddr,
    server_name: &str,
    roots: rustls::RootCertStore,
    alpn: Alpn,
) -> Sender {
    let stream = TcpStream::connect(addr).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let tls = tls(stream, server_name, roots, alpn).await.unwrap();
    Sender::handshake(tls, alpn).await
}

/// The whole body, with a timeout so a stuck stream fails the test instead of hanging it.
pub async fn collect(resp: Response<Incoming>) -> Bytes {
    tokio::time::timeout(
        std::time::Duration::from_secs(30),
        resp.into_body().collect(),
    )
    .await
    .expect("body within 30 s")
    .expect("body completes")
    .to_bytes()
}
