//! A fake "Cursor upstream" for front-door tests: a TLS (or plain) HTTP/1.1 + HTTP/2 server on
//! 127.0.0.1:0 with its own test CA.
//!
//! Routes:
//! - `POST /echo` — the request body back; request headers `authorization`, `x-cursor-*` and
//!   `connect-*` reflected as `x-echo-<name>`, plus `x-echo-version` and `x-echo-host`.
//! - `POST /stream?frames=N[&pause_ms=M]` — a Connect server stream: N message frames then an
//!   end frame. Without `pause_ms`, every frame after the first waits for [`FakeUpstream::release`]
//!   (a gate the test opens); with it, the stream sleeps M ms between frames.
//! - `POST /bidi` — echoes each request data chunk the moment it arrives.
//! - `GET /download` — [`DOWNLOAD_LEN`] deterministic bytes ([`download_bytes`]).
//! - `GET /trailers` — a small body followed by trailers `x-trailer: done`.
//! - `GET /ws` — a WebSocket-style upgrade (101), then echoes raw bytes.
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Semaphore};
use tokio::task::JoinSet;

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

pub const DOWNLOAD_LEN: usize = 8 * 1024 * 1024;

/// The bytes `/download` serves: a pattern that catches reordering and truncation.
pub fn download_bytes() -> Vec<u8> {
    (0..DOWNLOAD_LEN)
        .map(|i| ((i * 31 + i / 65_536) % 251) as u8)
        .collect()
}

/// A test CA distinct from cursor-byok's.
pub struct TestCa {
    pub cert_der: CertificateDer<'static>,
    pub cert_pem: String,
    issuer: Issuer<'static, KeyPair>,
}

impl TestCa {
    pub fn new() -> Self {
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::default();
        params
            .distinguished_name
            .push(DnType::CommonName, "front-door test CA");
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let cert = params.self_signed(&key).unwrap();
        TestCa {
            cert_der: cert.der().clone(),
            cert_pem: cert.pem(),
            issuer: Issuer::new(params, key),
        }
    }

    /// A server leaf for `names`, with its key.
    pub fn leaf(&self, names: &[&str]) -> (CertificateDer<'static>, PrivateKeyDer<'static>) {
        let key = KeyPair::generate().unwrap();
        let names: Vec<String> = names.iter().map(|n| n.to_string()).collect();
        let mut params = CertificateParams::new(names).unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        let key = PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der()));
        (cert.der().clone(), key)
    }
}

pub struct FakeUpstream {
    pub addr: SocketAddr,
    pub ca: Arc<TestCa>,
    /// The leaf this server presents (None for a plain server).
    pub cert_der: Option<CertificateDer<'static>>,
    /// The test CA as a PEM file, for `upstream.extra_roots`.
    pub ca_pem_path: PathBuf,
    gate: Arc<Semaphore>,
    /// Streams that noticed their client went away.
    cancelled: Arc<AtomicUsize>,
    _dir: tempfile::TempDir,
    _task: JoinSet<()>,
}

impl FakeUpstream {
    /// A TLS server presenting a leaf for `names` from a fresh test CA.
    pub async fn start(names: &[&str]) -> Self {
        Self::start_inner(Some(names)).await
    }

    /// A plain-HTTP server with the same routes.
    pub async fn start_plain() -> Self {
        Self::start_inner(None).await
    }

    async fn start_inner(names: Option<&[&str]>) -> Self {
        let ca = Arc::new(TestCa::new());
        let dir = tempfile::tempdir().unwrap();
        let ca_pem_path = dir.path().join("test-ca.pem");
        std::fs::write(&ca_pem_path, &ca.cert_pem).unwrap();
        let (tls, cert_der) = match names {
            Some(names) => {
                let (cert, key) = ca.leaf(names);
                let provider = Arc::new(rustls::crypto::ring::default_provider());
                let mut config = rustls::ServerConfig::builder_with_provider(provider)
                    .with_safe_default_protocol_versions()
                    .unwrap()
                    .with_no_client_auth()
                    .with_single_cert(vec![cert.clone()], key)
                    .unwrap();
                config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
                (
                    Some(tokio_rustls::TlsAcceptor::from(Arc::new(config))),
                    Some(cert),
                )
            }
            None => (None, None),
        };
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let gate = Arc::new(Semaphore::new(0));
        let cancelled = Arc::new(AtomicUsize::new(0));
        let mut task = JoinSet::new();
        let state = Routes {
            gate: gate.clone(),
            cancelled: cancelled.clone(),
        };
        task.spawn(accept_loop(listener, tls, state));
        FakeUpstream {
            addr,
            ca,
            cert_der,
            ca_pem_path,
            gate,
            cancelled,
            _dir: dir,
            _task: task,
        }
    }

    /// Let `n` more gated stream frames go.
    pub fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }

    pub fn cancelled_streams(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }
}

#[derive(Clone)]
struct Routes {
    gate: Arc<Semaphore>,
    cancelled: Arc<AtomicUsize>,
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    routes: Routes,
) {
    // Connection tasks live in this set: dropping the server aborts them all.
    let mut conns = JoinSet::new();
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            continue;
        };
        let _ = stream.set_nodelay(true);
        let tls = tls.clone();
        let routes = routes.clone();
        conns.spawn(async move {
            let service = service_fn(move |req| {
                let routes = routes.clone();
                async move { Ok::<_, Infallible>(routes.handle(req).await) }
            });
            let builder = auto::Builder::new(TokioExecutor::new());
            match tls {
                Some(acceptor) => {
                    let Ok(tls) = acceptor.accept(stream).await else {
                        return;
                    };
                    let _ = builder
                        .serve_connection_with_upgrades(TokioIo::new(tls), service)
                        .await;
                }
                None => {
                    let _ = builder
                        .serve_connection_with_upgrades(TokioIo::new(stream), service)
                        .await;
                }
            }
        });
        while conns.try_join_next().is_some() {}
    }
}

fn body(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|e| match e {})
        .boxed_unsync()
}

fn channel_body(rx: mpsc::Receiver<Frame<Bytes>>) -> Body {
    let stream = futures_util::stream::unfold(rx, |mut rx| async move {
        rx.recv().await.map(|frame| (Ok::<_, BoxError>(frame), rx))
    });
    StreamBody::new(stream).boxed_unsync()
}

/// A Connect envelope: flags, big-endian length, payload.
pub fn connect_frame(flags: u8, payload: &[u8]) -> Bytes {
    let mut out = Vec::with_capacity(5 + payload.len());
    out.push(flags);
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    out.into()
}

fn query(req: &Request<Incoming>, key: &str) -> Option<u64> {
    req.uri()
        .query()?
        .split('&')
        .filter_map(|kv| kv.split_once('='))
        .find(|(k, _)| *k == key)
        .and_then(|(_, v)| v.parse().ok())
}

impl Routes {
    async fn handle(&self, req: Request<Incoming>) -> Response<Body> {
        match req.uri().path() {
            "/echo" => echo(req).await,
            "/stream" => self.stream(req),
            "/bidi" => bidi(req),
            "/download" => download(),
            "/trailers" => trailers(),
            "/ws" => websocket(req),
            _ => {
                let mut resp = Response::new(body("not found"));
                *resp.status_mut() = StatusCode::NOT_FOUND;
                resp
            }
        }
    }

    fn stream(&self, req: Request<Incoming>) -> Response<Body> {
        let frames = query(&req, "frames").unwrap_or(3);
        let pause = query(&req, "pause_ms").map(Duration::from_millis);
        let (tx, rx) = mpsc::channel(1);
        let gate = self.gate.clone();
        let cancelled = self.cancelled.clone();
        tokio::spawn(async move {
            for i in 0..=frames {
                if i > 0 {
                    match pause {
                        Some(pause) => tokio::time::sleep(pause).await,
                        None => gate.acquire().await.unwrap().forget(),
                    }
                }
                let frame = if i < frames {
                    connect_frame(0, format!("frame {i}").as_bytes())
                } else {
                    connect_frame(2, b"{}")
                };
                if tx.send(Frame::data(frame)).await.is_err() {
                    cancelled.fetch_add(1, Ordering::SeqCst);
                    return;
                }
            }
        });
        let mut resp = Response::new(channel_body(rx));
        resp.headers_mut().insert(
            "content-type",
            HeaderValue::from_static("application/connect+proto"),
        );
        resp
    }
}

async fn echo(req: Request<Incoming>) -> Response<Body> {
    let (parts, incoming) = req.into_parts();
    let bytes = incoming
        .collect()
        .await
        .map(|c| c.to_bytes())
        .unwrap_or_default();
    let mut resp = Response::new(body(bytes));
    let headers = resp.headers_mut();
    reflect_headers(&parts.headers, headers);
    let version = format!("{:?}", parts.version);
    headers.insert("x-echo-version", HeaderValue::from_str(&version).unwrap());
    let host = parts
        .headers
        .get("host")
        .and_then(|h| h.to_str().ok())
        .map(str::to_string)
        .or_else(|| parts.uri.authority().map(|a| a.to_string()))
        .unwrap_or_default();
    headers.insert("x-echo-host", HeaderValue::from_str(&host).unwrap());
    if let Some(ct) = parts.headers.get("content-type") {
        headers.insert("content-type", ct.clone());
    }
    resp
}

fn reflect_headers(from: &HeaderMap, to: &mut HeaderMap) {
    for (name, value) in from {
        let n = name.as_str();
        if n == "authorization" || n.starts_with("x-cursor-") || n.starts_with("connect-") {
            let echoed = http::HeaderName::from_bytes(format!("x-echo-{n}").as_bytes()).unwrap();
            to.append(echoed, value.clone());
        }
    }
}

fn bidi(req: Request<Incoming>) -> Response<Body> {
    let (tx, rx) = mpsc::channel(4);
    let mut incoming = req.into_body();
    tokio::spawn(async move {
        while let Some(Ok(frame)) = incoming.frame().await {
            if let Ok(data) = frame.into_data() {
                if tx.send(Frame::data(data)).await.is_err() {
                    return;
                }
            }
        }
        let _ = tx.send(Frame::data(connect_frame(2, b"{}"))).await;
    });
    let mut resp = Response::new(channel_body(rx));
    resp.headers_mut().insert(
        "content-type",
        HeaderValue::from_static("application/connect+proto"),
    );
    resp
}

fn download() -> Response<Body> {
    let data = Bytes::from(download_bytes());
    let chunks: Vec<Bytes> = (0..data.len())
        .step_by(64 * 1024)
        .map(|i| data.slice(i..(i + 64 * 1024).min(data.len())))
        .collect();
    let stream = futures_util::stream::iter(
        chunks
            .into_iter()
            .map(|c| Ok::<_, BoxError>(Frame::data(c))),
    );
    let mut resp = Response::new(StreamBody::new(stream).boxed_unsync());
    resp.headers_mut()
        .insert("content-length", HeaderValue::from(DOWNLOAD_LEN));
    resp
}

fn trailers() -> Response<Body> {
    let (tx, rx) = mpsc::channel(2);
    tokio::spawn(async move {
        let _ = tx.send(Frame::data(Bytes::from_static(b"body"))).await;
        let mut trailers = HeaderMap::new();
        trailers.insert("x-trailer", HeaderValue::from_static("done"));
        let _ = tx.send(Frame::trailers(trailers)).await;
    });
    Response::new(channel_body(rx))
}

fn websocket(mut req: Request<Incoming>) -> Response<Body> {
    let wants = req
        .headers()
        .get("upgrade")
        .is_some_and(|v| v.as_bytes().eq_ignore_ascii_case(b"websocket"));
    if !wants {
        let mut resp = Response::new(body("upgrade required"));
        *resp.status_mut() = StatusCode::BAD_REQUEST;
        return resp;
    }
    let on_upgrade = hyper::upgrade::on(&mut req);
    tokio::spawn(async move {
        let Ok(upgraded) = on_upgrade.await else {
            return;
        };
        let mut io = TokioIo::new(upgraded);
        let mut buf = [0u8; 1024];
        loop {
            match io.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if io.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    });
    let mut resp = Response::new(body(Bytes::new()));
    *resp.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    resp.headers_mut()
        .insert("upgrade", HeaderValue::from_static("websocket"));
    resp.headers_mut()
        .insert("connection", HeaderValue::from_static("upgrade"));
    resp
}

/// A plain TCP echo server (for non-TLS tunnels).
pub async fn tcp_echo() -> (SocketAddr, JoinSet<()>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let mut set = JoinSet::new();
    set.spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            let Ok((mut stream, _)) = listener.accept().await else {
                continue;
            };
            conns.spawn(async move {
                let (mut r, mut w) = stream.split();
                let _ = tokio::io::copy(&mut r, &mut w).await;
            });
        }
    });
    (addr, set)
}
