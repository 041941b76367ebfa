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
//!
//! Cursor's own services, for relay tests (every request to them is recorded: path, version,
//! headers and the whole body; see [`FakeUpstream::recorded`]). Answers carry
//! `x-fake-upstream: <route>`.
//! - `/agent.v1.AgentService/Run` — bidi: [`relay_reply`] at once, then the end frame when the
//!   request body ends (the body is recorded then).
//! - `/aiserver.v1.InferenceService/RunInference` — the same as `Run`.
//! - `/agent.v1.AgentService/RunSSE` — reads the body, then [`relay_reply`] and the end frame.
//! - `/aiserver.v1.BidiService/BidiAppend` — an empty `application/proto` 200.
//! - `/aiserver.v1.AiService/AvailableModels` — the real capture ([`capture_models_gzip`]) as
//!   gzip, or a stand-in list when `../shared` is absent.
//! - `/aiserver.v1.ServerConfigService/GetServerConfig` — [`server_config`].
//! - anything else: 404 (recorded, body unread).
#![allow(dead_code)]

use std::convert::Infallible;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use cursor_byok::proto::agent::v1 as pb;
use cursor_byok::proto::aiserver::v1 as ai;
use http::{HeaderMap, HeaderValue, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use prost::Message;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::sync::{mpsc, Notify, Semaphore};
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
    pub issuer: Issuer<'static, KeyPair>,
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
    record: Arc<Recorder>,
    conns: Arc<ConnCount>,
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
        let record = Arc::new(Recorder::default());
        let conns = Arc::new(ConnCount::default());
        let mut task = JoinSet::new();
        let state = Routes {
            gate: gate.clone(),
            cancelled: cancelled.clone(),
            record: record.clone(),
        };
        task.spawn(accept_loop(listener, tls, state, conns.clone()));
        FakeUpstream {
            addr,
            ca,
            cert_der,
            ca_pem_path,
            gate,
            cancelled,
            record,
            conns,
            _dir: dir,
            _task: task,
        }
    }

    /// Let `n` more gated stream frames go.
    pub fn release(&self, n: usize) {
        self.gate.add_permits(n);
    }

    /// Connections accepted so far.
    pub fn connections_accepted(&self) -> usize {
        self.conns.accepted.load(Ordering::SeqCst)
    }

    /// Connections open right now.
    pub fn connections_open(&self) -> usize {
        self.conns.open.load(Ordering::SeqCst)
    }

    pub fn cancelled_streams(&self) -> usize {
        self.cancelled.load(Ordering::SeqCst)
    }

    /// Every recorded request (Cursor-service routes and unknown paths), in arrival order.
    pub fn recorded(&self) -> Vec<Recorded> {
        self.record.list.lock().unwrap().clone()
    }

    /// The recorded requests for `path`.
    pub fn recorded_on(&self, path: &str) -> Vec<Recorded> {
        self.recorded()
            .into_iter()
            .filter(|r| r.path == path)
            .collect()
    }

    /// Wait until `n` requests for `path` are recorded (panics after `timeout`).
    pub async fn wait_recorded(&self, path: &str, n: usize, timeout: Duration) -> Vec<Recorded> {
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            let changed = self.record.changed.notified();
            let got = self.recorded_on(path);
            if got.len() >= n {
                return got;
            }
            if tokio::time::timeout_at(deadline, changed).await.is_err() {
                panic!(
                    "{n} requests for {path} expected upstream, got {}",
                    got.len()
                );
            }
        }
    }
}

/// One request as the fake Cursor upstream saw it.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub path: String,
    pub version: Version,
    pub headers: HeaderMap,
    pub body: Bytes,
}

#[derive(Default)]
struct ConnCount {
    accepted: AtomicUsize,
    open: AtomicUsize,
}

/// Counts a connection open while alive.
struct OpenGuard(Arc<ConnCount>);

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::SeqCst);
    }
}

#[derive(Default)]
struct Recorder {
    list: Mutex<Vec<Recorded>>,
    changed: Notify,
}

impl Recorder {
    fn push(&self, parts: &http::request::Parts, body: Bytes) {
        self.list.lock().unwrap().push(Recorded {
            path: parts.uri.path().to_string(),
            version: parts.version,
            headers: parts.headers.clone(),
            body,
        });
        self.changed.notify_waiters();
    }
}

#[derive(Clone)]
struct Routes {
    gate: Arc<Semaphore>,
    cancelled: Arc<AtomicUsize>,
    record: Arc<Recorder>,
}

async fn accept_loop(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    routes: Routes,
    count: Arc<ConnCount>,
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
        count.accepted.fetch_add(1, Ordering::SeqCst);
        count.open.fetch_add(1, Ordering::SeqCst);
        let guard = OpenGuard(count.clone());
        conns.spawn(async move {
            let _guard = guard;
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
            "/close" => {
                // HTTP/1.1: this answer ends the connection.
                let mut resp = Response::new(body("closing"));
                resp.headers_mut()
                    .insert("connection", HeaderValue::from_static("close"));
                resp
            }
            "/stream" => self.stream(req),
            "/bidi" => bidi(req),
            "/download" => download(),
            "/trailers" => trailers(),
            "/ws" => websocket(req),
            AGENT_RUN | RUN_INFERENCE => self.agent_run(req),
            AGENT_RUN_SSE => self.agent_run_sse(req).await,
            BIDI_APPEND => self.bidi_append(req).await,
            AVAILABLE_MODELS => self.unary(req, "available-models", models_answer()).await,
            // Cmd+K on Cursor's model: the body recorded, a canned answer.
            p if p.starts_with("/aiserver.v1.CmdKService/") || p == REPORT_CMD_K_FATE => {
                self.unary(req, "cmd-k", (cmd_k_reply().to_vec(), None))
                    .await
            }
            GET_SERVER_CONFIG => {
                let answer = (server_config().encode_to_vec(), None);
                self.unary(req, "server-config", answer).await
            }
            p if SIDE_CALLS.contains(&p) => self.unary(req, "side-call", (Vec::new(), None)).await,
            _ => {
                let (parts, _) = req.into_parts();
                self.record.push(&parts, Bytes::new());
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

    /// Cursor's bidi Run: our reply at once, the end frame once the client closes its side.
    fn agent_run(&self, req: Request<Incoming>) -> Response<Body> {
        let (parts, mut incoming) = req.into_parts();
        let (tx, rx) = mpsc::channel(8);
        let record = self.record.clone();
        tokio::spawn(async move {
            for frame in relay_reply() {
                if tx.send(Frame::data(frame)).await.is_err() {
                    return;
                }
            }
            let mut received = Vec::new();
            while let Some(Ok(frame)) = incoming.frame().await {
                if let Ok(data) = frame.into_data() {
                    received.extend_from_slice(&data);
                }
            }
            record.push(&parts, received.into());
            let _ = tx.send(Frame::data(connect_frame(2, b"{}"))).await;
        });
        connect_stream(channel_body(rx), "run", "application/connect+proto")
    }

    /// Cursor's RunSSE: the request id frame in, our reply and the end frame out.
    async fn agent_run_sse(&self, req: Request<Incoming>) -> Response<Body> {
        let (parts, incoming) = req.into_parts();
        let received = incoming
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        self.record.push(&parts, received);
        let mut all = relay_reply().concat();
        all.extend_from_slice(&connect_frame(2, b"{}"));
        connect_stream(body(all), "run-sse", "text/event-stream")
    }

    async fn bidi_append(&self, req: Request<Incoming>) -> Response<Body> {
        self.unary(req, "bidi-append", (Vec::new(), None)).await
    }

    /// Record a unary request; answer `application/proto` with `answer` (body, encoding).
    async fn unary(
        &self,
        req: Request<Incoming>,
        route: &'static str,
        answer: (Vec<u8>, Option<&'static str>),
    ) -> Response<Body> {
        let (parts, incoming) = req.into_parts();
        let received = incoming
            .collect()
            .await
            .map(|c| c.to_bytes())
            .unwrap_or_default();
        self.record.push(&parts, received);
        let mut resp = Response::new(body(answer.0));
        let headers = resp.headers_mut();
        headers.insert(
            "content-type",
            HeaderValue::from_static("application/proto"),
        );
        headers.insert("x-fake-upstream", HeaderValue::from_static(route));
        if let Some(encoding) = answer.1 {
            headers.insert("content-encoding", HeaderValue::from_static(encoding));
        }
        resp
    }
}

pub const AGENT_RUN: &str = "/agent.v1.AgentService/Run";
pub const RUN_INFERENCE: &str = "/aiserver.v1.InferenceService/RunInference";
/// The calls around a conversation: recorded with their bodies and answered with an empty
/// `application/proto` message (`x-fake-upstream: side-call`).
pub const SIDE_CALLS: &[&str] = &[
    "/agent.v1.AgentService/NameAgent",
    "/aiserver.v1.AiService/NameAgent",
    "/agent.v1.AgentService/CreateTranscriptOverview",
    "/agent.v1.AgentService/UpdateConversationMetadata",
    "/agent.v1.AgentService/NotifyConversationClone",
    "/agent.v1.AgentService/UploadConversationBlobs",
    "/agent.v1.AgentService/UploadLocalAgentRunToPromptQuality",
    "/aiserver.v1.AnalyticsService/IngestConversation",
    "/aiserver.v1.AiService/NameTab",
    "/aiserver.v1.AiService/PotentiallyGenerateMemory",
];
pub const AGENT_RUN_SSE: &str = "/agent.v1.AgentService/RunSSE";
pub const BIDI_APPEND: &str = "/aiserver.v1.BidiService/BidiAppend";
pub const AVAILABLE_MODELS: &str = "/aiserver.v1.AiService/AvailableModels";
pub const REPORT_CMD_K_FATE: &str = "/aiserver.v1.AiService/ReportCmdKFate";

/// What the fake Cursor answers every Cmd+K call with: one frame, then an end frame.
pub fn cmd_k_reply() -> Bytes {
    [connect_frame(0, b"cursor's cmd-k"), connect_frame(2, b"{}")]
        .concat()
        .into()
}
pub const GET_SERVER_CONFIG: &str = "/aiserver.v1.ServerConfigService/GetServerConfig";

/// What the fake's agent routes answer before the end frame: Cursor's own run, in short.
pub fn relay_reply() -> Vec<Bytes> {
    use pb::interaction_update::Message as Update;
    let update = |u: Update| pb::AgentServerMessage {
        message: Some(pb::agent_server_message::Message::InteractionUpdate(
            pb::InteractionUpdate {
                message: Some(u),
                ..Default::default()
            },
        )),
        ..Default::default()
    };
    [
        update(Update::TextDelta(pb::TextDeltaUpdate {
            text: "answered by Cursor's own server".into(),
            is_server_notice: false,
        })),
        update(Update::TurnEnded(pb::TurnEndedUpdate {
            input_tokens: Some(11),
            output_tokens: Some(22),
            ..Default::default()
        })),
    ]
    .iter()
    .map(|m| connect_frame(0, &m.encode_to_vec()))
    .collect()
}

/// [`relay_reply`] then the end frame: every byte a relayed run answers.
pub fn relay_reply_bytes() -> Bytes {
    let mut all = relay_reply().concat();
    all.extend_from_slice(&connect_frame(2, b"{}"));
    all.into()
}

/// The fake's `GetServerConfigResponse`: HTTP/2 allowed, a recognisable version.
pub fn server_config() -> ai::GetServerConfigResponse {
    ai::GetServerConfigResponse {
        config_version: "fake-upstream-config-7".into(),
        http2_config: 0,
        ..Default::default()
    }
}

/// Path of the real `AvailableModels` answer captured from Cursor (gzip, base64).
pub fn capture_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../shared/protocol/captures/yelixir-native-cli-20260825-models.gzip.b64")
}

/// The capture's gzip bytes as Cursor sent them, or `None` when `../shared` is absent.
pub fn capture_models_gzip() -> Option<Vec<u8>> {
    use base64::Engine;
    let b64 = std::fs::read_to_string(capture_path()).ok()?;
    let gz = base64::engine::general_purpose::STANDARD
        .decode(b64.split_whitespace().collect::<String>())
        .expect("capture is base64");
    Some(gz)
}

/// The capture as a decoded protobuf body.
pub fn capture_models_raw() -> Option<Vec<u8>> {
    use std::io::Read;
    let gz = capture_models_gzip()?;
    let mut raw = Vec::new();
    flate2::read::GzDecoder::new(&gz[..])
        .read_to_end(&mut raw)
        .expect("capture is gzip");
    Some(raw)
}

fn models_answer() -> (Vec<u8>, Option<&'static str>) {
    match capture_models_gzip() {
        Some(gz) => (gz, Some("gzip")),
        None => {
            let stand_in = ai::AvailableModelsResponse {
                models: vec![ai::available_models_response::AvailableModel {
                    name: "composer-2.5".into(),
                    default_on: true,
                    ..Default::default()
                }],
                ..Default::default()
            };
            (stand_in.encode_to_vec(), None)
        }
    }
}

fn connect_stream(body: Body, route: &'static str, content_type: &'static str) -> Response<Body> {
    let mut resp = Response::new(body);
    resp.headers_mut()
        .insert("content-type", HeaderValue::from_static(content_type));
    resp.headers_mut()
        .insert("x-fake-upstream", HeaderValue::from_static(route));
    resp
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
