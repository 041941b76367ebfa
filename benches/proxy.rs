//! Side-by-side proxy benchmarks on loopback.
//!
//! Run (pinned to one CPU so ratios from the same run are stable):
//!
//! ```sh
//! taskset -c 0 cargo bench --bench proxy
//! taskset -c 0 cargo bench --bench proxy --features bench-hudsucker   # + hudsucker
//! ```
//!
//! `mitmdump` joins when it is on `PATH` (or named by `MITMDUMP=/path/to/mitmdump`).
//!
//! Everything runs in this process except mitmdump: a local TLS upstream (HTTP/1.1 + HTTP/2,
//! its own test CA), cursor-byok's proxy (`cursor_byok::proxy::Server`, the upstream reached
//! through `upstream.resolve`), optionally hudsucker's no-op MITM proxy, `tls-relay` (a
//! reference: TLS terminated and re-opened, bytes copied, no HTTP: the ceiling of any
//! decrypting proxy here) and the clients. A
//! proxied client sends `CONNECT`, then TLS trusting the proxy's CA; the direct client does TLS
//! to the upstream itself. Targets are interleaved round by round. Output: Markdown tables.
//!
//! Knobs (environment): `BENCH_ROUNDS` (default 8), `BENCH_SECS` per unary measurement
//! (default 0.5), `BENCH_BULK_MIB` (default 256), `BENCH_QUICK=1` (a smoke run),
//! `BENCH_ONLY=cursor-byok[,hudsucker,…]` (direct plus these), `BENCH_NO_MITMDUMP=1`,
//! `BENCH_CASES=h1c16[,h2c4,…]` (these unary cases instead), `BENCH_BULK_ROUNDS` (default: `BENCH_ROUNDS`, at most 3), `BENCH_STREAM=h1|h2` (one protocol's streaming cases), `BENCH_LOG=<tracing filter>`, `BENCH_FIRST_PATH=/slow?chunks=1` (the first-chunk request).

#[path = "../tests/common/mod.rs"]
#[allow(dead_code, unused_imports)]
mod common;
#[path = "support/mod.rs"]
mod support;

use std::convert::Infallible;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use cursor_byok::config::Config;
use cursor_byok::proxy::Server;
use cursor_byok::tls::{CertStore, CertificateAuthority};
use http::{HeaderValue, Request, Response};
use http_body_util::{BodyExt, Empty, Full, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};

use common::client::read_head;
use common::cursor_upstream::TestCa;
use support::{env_or, epoch, now_ns, percentile};

type BoxError = Box<dyn StdError + Send + Sync>;
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// The name the proxy intercepts (`*.cursor.sh`) and resolves to the local upstream.
const HOST: &str = "api2.cursor.sh";
/// The name other proxies dial (they resolve it themselves).
const LOCAL: &str = "localhost";
const UNARY_BODY: &[u8] = &[b'x'; 64];
const BULK_CHUNK: usize = 64 * 1024;
const SLOW_CHUNKS: usize = 20;
const SLOW_PAUSE: Duration = Duration::from_millis(50);

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

// ---------------------------------------------------------------------------------------------
// The local upstream.

struct Upstream {
    addr: SocketAddr,
    ca: TestCa,
    ca_pem_path: PathBuf,
}

/// A TLS server for `names` (leaf from `ca`) offering HTTP/2 and HTTP/1.1.
fn acceptor(ca: &TestCa, names: &[&str]) -> tokio_rustls::TlsAcceptor {
    let (cert, key) = ca.leaf(names);
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![cert], key)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(config))
}

async fn start_upstream(dir: &std::path::Path, bulk_len: u64) -> Upstream {
    let ca = TestCa::new();
    let ca_pem_path = dir.join("upstream-ca.pem");
    std::fs::write(&ca_pem_path, &ca.cert_pem).unwrap();
    let acceptor = acceptor(&ca, &[HOST, LOCAL]);
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    support::spawn_accept_loop(listener, move |stream| {
        let acceptor = acceptor.clone();
        async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let mut builder = auto::Builder::new(TokioExecutor::new());
            builder
                .http2()
                .initial_stream_window_size(2 * 1024 * 1024)
                .initial_connection_window_size(4 * 1024 * 1024);
            let service =
                service_fn(
                    move |req| async move { Ok::<_, Infallible>(upstream_route(req, bulk_len)) },
                );
            let _ = builder.serve_connection(TokioIo::new(tls), service).await;
        }
    });
    Upstream {
        addr,
        ca,
        ca_pem_path,
    }
}

fn upstream_route(req: Request<Incoming>, bulk_len: u64) -> Response<Body> {
    match req.uri().path() {
        "/bulk" => {
            static CHUNK: OnceLock<Bytes> = OnceLock::new();
            let chunk = CHUNK
                .get_or_init(|| Bytes::from((0..BULK_CHUNK).map(|i| i as u8).collect::<Vec<_>>()))
                .clone();
            let n = bulk_len.div_ceil(BULK_CHUNK as u64);
            let stream = futures_util::stream::iter(
                (0..n).map(move |_| Ok::<_, BoxError>(Frame::data(chunk.clone()))),
            );
            let mut resp = Response::new(StreamBody::new(stream).boxed_unsync());
            resp.headers_mut()
                .insert("content-length", HeaderValue::from(n * BULK_CHUNK as u64));
            resp
        }
        "/slow" => {
            // Each chunk carries the time it was handed to hyper, so the client can tell how
            // long it travelled. `?chunks=N` shortens the stream.
            let chunks = req
                .uri()
                .query()
                .and_then(|q| q.strip_prefix("chunks="))
                .and_then(|n| n.parse().ok())
                .unwrap_or(SLOW_CHUNKS);
            let stream = futures_util::stream::unfold(0usize, move |i| async move {
                if i == chunks {
                    return None;
                }
                if i > 0 {
                    tokio::time::sleep(SLOW_PAUSE).await;
                }
                let mut chunk = now_ns().to_be_bytes().to_vec();
                chunk.resize(64, b'.');
                Some((Ok::<_, BoxError>(Frame::data(Bytes::from(chunk))), i + 1))
            });
            Response::new(StreamBody::new(stream).boxed_unsync())
        }
        _ => Response::new(
            Full::new(Bytes::from_static(UNARY_BODY))
                .map_err(|e| match e {})
                .boxed_unsync(),
        ),
    }
}

// ---------------------------------------------------------------------------------------------
// Clients.

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Alpn {
    H1,
    H2,
}

impl Alpn {
    fn name(self) -> &'static str {
        match self {
            Alpn::H1 => "h1",
            Alpn::H2 => "h2",
        }
    }
}

/// How a client reaches the upstream.
#[derive(Clone)]
struct Target {
    name: &'static str,
    /// Where the client's TCP connection goes.
    addr: SocketAddr,
    /// `Some(authority)`: send `CONNECT authority` first (a proxy).
    connect: Option<String>,
    /// TLS server name.
    sni: &'static str,
    /// `Host` / `:authority` of the requests.
    authority: &'static str,
    roots: Arc<rustls::RootCertStore>,
}

fn leak(s: String) -> &'static str {
    Box::leak(s.into_boxed_str())
}

fn roots(der: &CertificateDer<'static>) -> Arc<rustls::RootCertStore> {
    let mut roots = rustls::RootCertStore::empty();
    roots.add(der.clone()).unwrap();
    Arc::new(roots)
}

fn client_config(roots: &rustls::RootCertStore, alpn: Alpn) -> Arc<rustls::ClientConfig> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots.clone())
        .with_no_client_auth();
    config.alpn_protocols = vec![match alpn {
        Alpn::H1 => b"http/1.1".to_vec(),
        Alpn::H2 => b"h2".to_vec(),
    }];
    // A fresh full handshake every time: resumption would hide the leaf's cost.
    config.resumption = rustls::client::Resumption::disabled();
    Arc::new(config)
}

impl Target {
    /// TCP (+ CONNECT) + TLS, ready for HTTP.
    async fn tls(&self, alpn: Alpn) -> tokio_rustls::client::TlsStream<TcpStream> {
        let mut stream = TcpStream::connect(self.addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        if let Some(authority) = &self.connect {
            let head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n\r\n");
            stream.write_all(head.as_bytes()).await.unwrap();
            let answer = read_head(&mut stream).await;
            assert!(
                answer.starts_with("HTTP/1.1 200") || answer.starts_with("HTTP/1.0 200"),
                "{}: CONNECT answered {answer:?}",
                self.name
            );
        }
        let config = client_config(&self.roots, alpn);
        let name = ServerName::try_from(self.sni.to_string()).unwrap();
        tokio_rustls::TlsConnector::from(config)
            .connect(name, stream)
            .await
            .unwrap_or_else(|e| panic!("{}: TLS: {e}", self.name))
    }

    async fn open(&self, alpn: Alpn) -> Sender {
        let tls = self.tls(alpn).await;
        let io = TokioIo::new(tls);
        match alpn {
            Alpn::H1 => {
                let (send, conn) = hyper::client::conn::http1::handshake(io).await.unwrap();
                tokio::spawn(conn);
                Sender::H1(send, self.authority)
            }
            Alpn::H2 => {
                let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                    .initial_stream_window_size(2 * 1024 * 1024)
                    .initial_connection_window_size(4 * 1024 * 1024)
                    .handshake(io)
                    .await
                    .unwrap();
                tokio::spawn(conn);
                Sender::H2(send, self.authority)
            }
        }
    }
}

enum Sender {
    H1(hyper::client::conn::http1::SendRequest<Body>, &'static str),
    H2(hyper::client::conn::http2::SendRequest<Body>, &'static str),
}

fn empty() -> Body {
    Empty::new().map_err(|e| match e {}).boxed_unsync()
}

impl Sender {
    /// Another handle on the same HTTP/2 connection (HTTP/1.1 handles cannot be shared).
    fn share(&self) -> Option<Sender> {
        match self {
            Sender::H1(..) => None,
            Sender::H2(send, host) => Some(Sender::H2(send.clone(), host)),
        }
    }

    async fn get(&mut self, path: &str) -> Response<Incoming> {
        match self {
            Sender::H1(send, host) => {
                let req = Request::builder()
                    .uri(path)
                    .header("host", *host)
                    .body(empty())
                    .unwrap();
                send.ready().await.unwrap();
                send.send_request(req).await.unwrap()
            }
            Sender::H2(send, host) => {
                let req = Request::builder()
                    .uri(format!("https://{host}{path}"))
                    .version(http::Version::HTTP_2)
                    .body(empty())
                    .unwrap();
                send.ready().await.unwrap();
                send.send_request(req).await.unwrap()
            }
        }
    }
}

/// Read a body to its end; returns the number of bytes.
async fn drain(resp: Response<Incoming>) -> u64 {
    if !resp.status().is_success() {
        let status = resp.status();
        let body = resp.into_body().collect().await.map(|c| c.to_bytes());
        panic!("status {status}: {body:?}");
    }
    let mut body = resp.into_body();
    let mut n = 0u64;
    while let Some(frame) = body.frame().await {
        if let Ok(data) = frame.unwrap().into_data() {
            n += data.len() as u64;
        }
    }
    n
}

// ---------------------------------------------------------------------------------------------
// Comparison proxies.

#[cfg(feature = "bench-hudsucker")]
async fn start_hudsucker(upstream: &Upstream) -> Target {
    use hudsucker::certificate_authority::RcgenAuthority;
    use hyper_util::client::legacy::connect::HttpConnector;

    let ca = TestCa::new();
    let ca_der = ca.cert_der.clone();
    let authority = RcgenAuthority::new(ca.issuer, 1_000, rustls::crypto::ring::default_provider());
    let upstream_roots = roots(&upstream.ca.cert_der);
    let tls = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates((*upstream_roots).clone())
        .with_no_client_auth();
    let mut http = HttpConnector::new();
    http.set_nodelay(true);
    http.enforce_http(false);
    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(tls)
        .https_or_http()
        .enable_http1()
        .enable_http2()
        .wrap_connector(http);
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.set_nodelay(true).unwrap(); // Linux: accepted sockets inherit it
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let listener = socket.listen(1024).unwrap();
    let addr = listener.local_addr().unwrap();
    let proxy = hudsucker::Proxy::builder()
        .with_listener(listener)
        .with_ca(authority)
        .with_http_connector(https)
        .build()
        .expect("hudsucker builds");
    tokio::spawn(async move {
        if let Err(e) = proxy.start().await {
            eprintln!("hudsucker stopped: {e}");
        }
    });
    Target {
        name: "hudsucker",
        addr,
        connect: Some(format!("{LOCAL}:{}", upstream.addr.port())),
        sni: LOCAL,
        authority: leak(format!("{LOCAL}:{}", upstream.addr.port())),
        roots: roots(&ca_der),
    }
}

/// A reference, not a proxy: after CONNECT it terminates TLS with a leaf, opens TLS to the
/// upstream with the ALPN the client chose and copies bytes both ways, with no HTTP work at all.
/// Its ratio to direct is the two-TLS-hops ceiling of any decrypting proxy on this machine.
async fn start_tls_relay(upstream: &Upstream) -> Target {
    let ca = TestCa::new();
    let acceptor = acceptor(&ca, &[LOCAL]);
    let upstream_roots = roots(&upstream.ca.cert_der);
    let origin = upstream.addr;
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    support::spawn_accept_loop(listener, move |mut stream| {
        let acceptor = acceptor.clone();
        let upstream_roots = upstream_roots.clone();
        async move {
            read_head(&mut stream).await;
            if stream.write_all(b"HTTP/1.1 200 OK\r\n\r\n").await.is_err() {
                return;
            }
            let Ok(mut client) = acceptor.accept(stream).await else {
                return;
            };
            let alpn = match client.get_ref().1.alpn_protocol() {
                Some(b"h2") => Alpn::H2,
                _ => Alpn::H1,
            };
            let tcp = TcpStream::connect(origin).await.unwrap();
            tcp.set_nodelay(true).unwrap();
            let name = ServerName::try_from(LOCAL).unwrap();
            let connector = tokio_rustls::TlsConnector::from(client_config(&upstream_roots, alpn));
            let Ok(mut server) = connector.connect(name, tcp).await else {
                return;
            };
            let buf = 64 * 1024;
            let _ =
                tokio::io::copy_bidirectional_with_sizes(&mut client, &mut server, buf, buf).await;
        }
    });
    Target {
        name: "tls-relay",
        addr,
        connect: Some(format!("{LOCAL}:{}", origin.port())),
        sni: LOCAL,
        authority: leak(format!("{LOCAL}:{}", origin.port())),
        roots: roots(&ca.cert_der),
    }
}

/// mitmdump as a child process, when it is installed.
struct Mitmdump {
    child: std::process::Child,
    _dir: tempfile::TempDir,
}

impl Drop for Mitmdump {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

async fn start_mitmdump(upstream: &Upstream) -> Option<(Target, Mitmdump)> {
    let program = std::env::var("MITMDUMP").unwrap_or_else(|_| "mitmdump".into());
    let dir = tempfile::tempdir().unwrap();
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let child = std::process::Command::new(&program)
        .args(["--listen-host", "127.0.0.1", "--listen-port"])
        .arg(port.to_string())
        .arg("--set")
        .arg(format!("confdir={}", dir.path().display()))
        .args(["--ssl-insecure", "-q"])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let mitm = Mitmdump { child, _dir: dir };
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let ca_path = mitm._dir.path().join("mitmproxy-ca-cert.pem");
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if ca_path.exists() && TcpStream::connect(addr).await.is_ok() {
            break;
        }
        if Instant::now() > deadline {
            eprintln!("mitmdump did not come up within 30 s; skipping it");
            return None;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let pem = std::fs::read(&ca_path).ok()?;
    let der = rustls_pemfile::certs(&mut pem.as_slice()).next()?.ok()?;
    Some((
        Target {
            name: "mitmdump",
            addr,
            connect: Some(format!("{LOCAL}:{}", upstream.addr.port())),
            sni: LOCAL,
            authority: leak(format!("{LOCAL}:{}", upstream.addr.port())),
            roots: roots(&der),
        },
        mitm,
    ))
}

// ---------------------------------------------------------------------------------------------
// Measurements.

#[derive(Default, Clone)]
struct Unary {
    latencies_ns: Vec<u64>,
    requests: u64,
    elapsed: Duration,
}

impl Unary {
    fn rps(&self) -> f64 {
        self.requests as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }

    fn percentile_us(&self, p: f64) -> f64 {
        percentile(&self.latencies_ns, p) / 1_000.0
    }
}

/// `conc` requests in flight for `secs`: one connection per worker on HTTP/1.1, one shared
/// connection on HTTP/2.
async fn unary_round(senders: &mut Vec<Sender>, conc: usize, secs: f64) -> Unary {
    let stop = Arc::new(AtomicBool::new(false));
    let start = Instant::now();
    let mut tasks = Vec::new();
    let h2 = senders.first().and_then(Sender::share).is_some();
    let mut owned: Vec<Sender> = if h2 {
        (0..conc).map(|_| senders[0].share().unwrap()).collect()
    } else {
        std::mem::take(senders)
    };
    for mut sender in owned.drain(..) {
        let stop = stop.clone();
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::with_capacity(4096);
            while !stop.load(Ordering::Relaxed) {
                let t0 = Instant::now();
                let resp = sender.get("/unary").await;
                drain(resp).await;
                lat.push(t0.elapsed().as_nanos() as u64);
            }
            (lat, sender)
        }));
    }
    tokio::time::sleep(Duration::from_secs_f64(secs)).await;
    stop.store(true, Ordering::Relaxed);
    let mut out = Unary::default();
    for t in tasks {
        let (lat, sender) = t.await.unwrap();
        if !h2 {
            senders.push(sender);
        }
        out.requests += lat.len() as u64;
        out.latencies_ns.extend(lat);
    }
    out.elapsed = start.elapsed();
    out
}

async fn senders(target: &Target, alpn: Alpn, conc: usize) -> Vec<Sender> {
    let n = if alpn == Alpn::H1 { conc } else { 1 };
    let mut out = Vec::new();
    for _ in 0..n {
        let mut s = target.open(alpn).await;
        // Warm the path (pools upstream of a proxy included).
        for _ in 0..20 {
            let resp = s.get("/unary").await;
            drain(resp).await;
        }
        out.push(s);
    }
    out
}

struct Slow {
    /// Request sent → first chunk read.
    first_ns: Vec<u64>,
    /// Chunk handed to hyper upstream → chunk read by the client, every chunk.
    travel_ns: Vec<u64>,
}

async fn slow_once(sender: &mut Sender, path: &str, out: &mut Slow) {
    let t0 = Instant::now();
    let resp = sender.get(path).await;
    let mut body = resp.into_body();
    let mut first = true;
    let mut buf = Vec::new();
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.unwrap().into_data() else {
            continue;
        };
        let at = now_ns();
        if first {
            out.first_ns.push(t0.elapsed().as_nanos() as u64);
            first = false;
        }
        buf.extend_from_slice(&data);
        while buf.len() >= 64 {
            let sent = u64::from_be_bytes(buf[..8].try_into().unwrap());
            out.travel_ns.push(at.saturating_sub(sent));
            buf.drain(..64);
        }
    }
}

/// Whether the streaming cases run for `alpn` (`BENCH_STREAM=h1` or `h2` keeps one).
fn streamed(alpn: Alpn) -> bool {
    std::env::var("BENCH_STREAM").map_or(true, |only| only == alpn.name())
}

/// cursor-byok's bulk rate over each other proxy's in the same round: the median and the
/// quartiles of those per-round ratios.
fn print_paired_bulk(targets: &[Target], rates: &[Vec<Vec<f64>>]) {
    let ours = 1;
    let mut lines = Vec::new();
    for (ai, alpn) in [Alpn::H1, Alpn::H2].into_iter().enumerate() {
        for (ti, t) in targets.iter().enumerate().skip(2) {
            let mut ratios: Vec<f64> = rates[ai][ours]
                .iter()
                .zip(&rates[ai][ti])
                .map(|(a, b)| a / b)
                .collect();
            if ratios.is_empty() {
                continue;
            }
            ratios.sort_by(f64::total_cmp);
            let at = |q: f64| ratios[((ratios.len() - 1) as f64 * q).round() as usize];
            lines.push(format!(
                "| {} | {} | {} | {:.2}–{:.2} | {} |",
                alpn.name(),
                t.name,
                fmt_ratio(at(0.5)),
                at(0.25),
                at(0.75),
                ratios.len()
            ));
        }
    }
    if lines.is_empty() {
        return;
    }
    println!("Bulk, cursor-byok over each proxy in the same round:\n");
    println!("| proto | against | median | quartiles | rounds |");
    println!("|---|---|---:|---:|---:|");
    for line in lines {
        println!("{line}");
    }
    println!();
}

fn fmt_ratio(x: f64) -> String {
    if x.is_finite() {
        format!("{x:.2}×")
    } else {
        "–".into()
    }
}

// ---------------------------------------------------------------------------------------------

/// `h1c16` → (HTTP/1.1, 16 in flight).
fn parse_case(case: &str) -> (Alpn, usize) {
    let (alpn, conc) = case.split_at(2);
    let alpn = match alpn {
        "h1" => Alpn::H1,
        "h2" => Alpn::H2,
        _ => panic!("BENCH_CASES: {case:?} is not h1cN or h2cN"),
    };
    let conc = conc
        .strip_prefix('c')
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("BENCH_CASES: {case:?} is not h1cN or h2cN"));
    (alpn, conc)
}

fn main() {
    if let Ok(filter) = std::env::var("BENCH_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(filter)
            .with_writer(std::io::stderr)
            .init();
    }
    let (rt, threads) = support::runtime();
    // On a worker like every other task: polled from `block_on` the bench client would cross
    // threads on every wake.
    rt.block_on(async move { tokio::spawn(run(threads)).await.expect("bench run") });
}

async fn run(threads: usize) {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let rounds: usize = env_or("BENCH_ROUNDS", if quick { 1 } else { 8 });
    let secs: f64 = env_or("BENCH_SECS", if quick { 0.2 } else { 0.5 });
    let bulk_mib: u64 = env_or("BENCH_BULK_MIB", if quick { 16 } else { 256 });
    let _ = epoch();

    let dir = tempfile::tempdir().unwrap();
    let upstream = start_upstream(dir.path(), bulk_mib * 1024 * 1024).await;

    // cursor-byok's proxy, in process.
    let mut config = Config::from_toml("listen = \"127.0.0.1:0\"\n", "bench").unwrap();
    config.data_dir = Some(dir.path().to_path_buf());
    config.upstream.resolve.insert(HOST.into(), upstream.addr);
    config.upstream.extra_roots = Some(upstream.ca_pem_path.clone());
    let (ca, _) = CertificateAuthority::load_or_create(&dir.path().join("ca")).unwrap();
    let ca = Arc::new(ca);
    let our_roots = roots(ca.cert_der());
    let server = Server::builder(config, ca.clone()).bind().await.unwrap();

    let direct = Target {
        name: "direct",
        addr: upstream.addr,
        connect: None,
        sni: HOST,
        authority: HOST,
        roots: roots(&upstream.ca.cert_der),
    };
    let ours = Target {
        name: "cursor-byok",
        addr: server.proxy_addr(),
        connect: Some(format!("{HOST}:443")),
        sni: HOST,
        authority: HOST,
        roots: our_roots,
    };
    let mut targets = vec![direct.clone(), ours.clone()];
    #[cfg(feature = "bench-hudsucker")]
    targets.push(start_hudsucker(&upstream).await);
    // The ceiling, for reading the others: TLS both ways and nothing else.
    targets.push(start_tls_relay(&upstream).await);
    let mut notes = Vec::new();
    if !cfg!(feature = "bench-hudsucker") {
        notes.push("hudsucker: not built (add `--features bench-hudsucker`)".to_string());
    }
    let mitm = if std::env::var("BENCH_NO_MITMDUMP").is_ok() {
        None
    } else {
        start_mitmdump(&upstream).await
    };
    let _mitm_guard = match mitm {
        Some((t, guard)) => {
            targets.push(t);
            Some(guard)
        }
        None => {
            notes.push("mitmdump: not found on PATH (set MITMDUMP=…); skipped".to_string());
            None
        }
    };
    // `BENCH_ONLY=cursor-byok` keeps direct plus the named targets (for profiling).
    if let Ok(only) = std::env::var("BENCH_ONLY") {
        let keep: Vec<&str> = only.split(',').collect();
        targets.retain(|t| t.name == "direct" || keep.contains(&t.name));
    }
    // mitmdump is two orders slower: it only takes part in the unary runs.
    let fast: Vec<Target> = targets
        .iter()
        .filter(|t| t.name != "mitmdump")
        .cloned()
        .collect();

    eprintln!(
        "bench: {threads} worker thread(s), {rounds} rounds × {secs} s, targets: {}",
        targets
            .iter()
            .map(|t| t.name)
            .collect::<Vec<_>>()
            .join(", ")
    );

    // 1. Unary passthrough.
    // `BENCH_CASES=h1c16,h2c4` runs these unary cases instead (for profiling; empty: none).
    let cases: Vec<(Alpn, usize)> = match std::env::var("BENCH_CASES") {
        Ok(list) => list
            .split(',')
            .filter(|c| !c.is_empty())
            .map(parse_case)
            .collect(),
        Err(_) => vec![(Alpn::H1, 1), (Alpn::H1, 16), (Alpn::H2, 1), (Alpn::H2, 16)],
    };
    let mut pools: Vec<Vec<Vec<Sender>>> = Vec::new(); // [case][target]
    for &(alpn, conc) in &cases {
        let mut row = Vec::new();
        for t in &targets {
            row.push(senders(t, alpn, conc).await);
        }
        pools.push(row);
    }
    let mut unary: Vec<Vec<Unary>> = vec![vec![Unary::default(); targets.len()]; cases.len()];
    for round in 0..rounds {
        for (ci, &(_, conc)) in cases.iter().enumerate() {
            // Rotate the order so no target always runs first.
            for k in 0..targets.len() {
                let ti = (k + round) % targets.len();
                let r = unary_round(&mut pools[ci][ti], conc, secs).await;
                let acc = &mut unary[ci][ti];
                acc.latencies_ns.extend(r.latencies_ns);
                acc.requests += r.requests;
                acc.elapsed += r.elapsed;
            }
        }
        eprintln!("unary round {}/{rounds} done", round + 1);
    }
    drop(pools);

    println!("### Passthrough: unary GET (64-byte answer), keep-alive\n");
    println!("| case | target | req/s | p50 µs | p99 µs | req/s vs direct | p50 vs direct |");
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (ci, &(alpn, conc)) in cases.iter().enumerate() {
        let d = &unary[ci][0];
        for (ti, t) in targets.iter().enumerate() {
            let u = &unary[ci][ti];
            println!(
                "| {} c{} | {} | {:.0} | {:.0} | {:.0} | {} | {} |",
                alpn.name(),
                conc,
                t.name,
                u.rps(),
                u.percentile_us(0.5),
                u.percentile_us(0.99),
                fmt_ratio(u.rps() / d.rps()),
                fmt_ratio(u.percentile_us(0.5) / d.percentile_us(0.5)),
            );
        }
    }
    println!();
    let ours_i = 1;
    for (ti, t) in targets.iter().enumerate().skip(2) {
        let ratios: Vec<String> = cases
            .iter()
            .enumerate()
            .map(|(ci, &(alpn, conc))| {
                format!(
                    "{} c{} {}",
                    alpn.name(),
                    conc,
                    fmt_ratio(unary[ci][ours_i].rps() / unary[ci][ti].rps())
                )
            })
            .collect();
        println!("cursor-byok req/s vs {}: {}\n", t.name, ratios.join(", "));
    }

    // 2. Streaming.
    let mut bulk = vec![vec![(0u64, Duration::ZERO); fast.len()]; 2];
    // Each round's rate per target, for ratios paired within a round (a host's slow spell
    // then moves both sides of a ratio alike).
    let mut bulk_rates = vec![vec![Vec::new(); fast.len()]; 2];
    let mut slow: Vec<Vec<Slow>> = (0..2)
        .map(|_| {
            (0..fast.len())
                .map(|_| Slow {
                    first_ns: Vec::new(),
                    travel_ns: Vec::new(),
                })
                .collect()
        })
        .collect();
    let bulk_rounds: usize = env_or("BENCH_BULK_ROUNDS", rounds.clamp(1, 3)).max(1);
    let first_samples = if quick { 5 } else { 40 };
    for (ai, alpn) in [Alpn::H1, Alpn::H2].into_iter().enumerate() {
        if !streamed(alpn) {
            continue;
        }
        let mut conns = Vec::new();
        for t in &fast {
            let mut s = t.open(alpn).await;
            drain(s.get("/unary").await).await;
            conns.push(s);
        }
        for round in 0..bulk_rounds {
            for k in 0..fast.len() {
                let ti = (k + round) % fast.len();
                let t0 = Instant::now();
                let resp = conns[ti].get("/bulk").await;
                let n = drain(resp).await;
                let took = t0.elapsed();
                bulk[ai][ti].0 += n;
                bulk[ai][ti].1 += took;
                bulk_rates[ai][ti].push(n as f64 / took.as_secs_f64());
            }
        }
        // The whole 20 × 50 ms stream for the travel times, then short streams (first chunk
        // at once, the second 50 ms later) for many first-chunk samples.
        for round in 0..rounds.clamp(1, 3) {
            for k in 0..fast.len() {
                let ti = (k + round) % fast.len();
                slow_once(&mut conns[ti], "/slow", &mut slow[ai][ti]).await;
            }
        }
        let mut firsts: Vec<Vec<u64>> = vec![Vec::new(); fast.len()];
        for round in 0..first_samples {
            for k in 0..fast.len() {
                let ti = (k + round) % fast.len();
                let mut one = Slow {
                    first_ns: Vec::new(),
                    travel_ns: Vec::new(),
                };
                let path =
                    std::env::var("BENCH_FIRST_PATH").unwrap_or_else(|_| "/slow?chunks=2".into());
                slow_once(&mut conns[ti], &path, &mut one).await;
                firsts[ti].extend(one.first_ns);
            }
        }
        for (ti, f) in firsts.into_iter().enumerate() {
            slow[ai][ti].first_ns = f;
        }
        eprintln!("streaming {} done", alpn.name());
    }
    println!("### Streaming\n");
    println!(
        "| proto | target | {bulk_mib} MiB: MiB/s | vs direct | first chunk p50 µs | later than direct µs | chunk travel p50 µs |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|");
    for (ai, alpn) in [Alpn::H1, Alpn::H2].into_iter().enumerate() {
        if !streamed(alpn) {
            continue;
        }
        let mibs = |ti: usize| {
            let (n, d) = bulk[ai][ti];
            n as f64 / (1024.0 * 1024.0) / d.as_secs_f64()
        };
        let first = |ti: usize| percentile(&slow[ai][ti].first_ns, 0.5) / 1_000.0;
        for (ti, t) in fast.iter().enumerate() {
            println!(
                "| {} | {} | {:.0} | {} | {:.0} | {:+.0} | {:.0} |",
                alpn.name(),
                t.name,
                mibs(ti),
                fmt_ratio(mibs(ti) / mibs(0)),
                first(ti),
                first(ti) - first(0),
                percentile(&slow[ai][ti].travel_ns, 0.5) / 1_000.0,
            );
        }
    }
    println!();
    print_paired_bulk(&fast, &bulk_rates);

    // 3. TLS.
    let store = CertStore::new(ca.clone()).unwrap();
    let mints = if quick { 20 } else { 200 };
    let mut mint_ns = Vec::new();
    for i in 0..mints {
        let host = format!("h{i}.cursor.sh");
        let t0 = Instant::now();
        store.server_config(&host).unwrap();
        mint_ns.push(t0.elapsed().as_nanos() as u64);
    }
    let mut hit_ns = Vec::new();
    for i in 0..mints {
        let host = format!("h{i}.cursor.sh");
        let t0 = Instant::now();
        store.server_config(&host).unwrap();
        hit_ns.push(t0.elapsed().as_nanos() as u64);
    }
    let hs_n = if quick { 20 } else { 100 };
    let mut handshakes: Vec<Vec<u64>> = vec![Vec::new(); fast.len()];
    for _ in 0..hs_n {
        for (ti, t) in fast.iter().enumerate() {
            let t0 = Instant::now();
            let tls = t.tls(Alpn::H2).await;
            handshakes[ti].push(t0.elapsed().as_nanos() as u64);
            drop(tls);
            // Let the target finish its side (tls-relay dials the upstream after the client's
            // handshake) before the next one is timed.
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    println!("### TLS\n");
    println!("| what | p50 µs | p99 µs |");
    println!("|---|---:|---:|");
    println!(
        "| cursor-byok leaf minting, cache miss ({mints} hosts) | {:.0} | {:.0} |",
        percentile(&mint_ns, 0.5) / 1e3,
        percentile(&mint_ns, 0.99) / 1e3
    );
    println!(
        "| cursor-byok cert cache hit | {:.1} | {:.1} |",
        percentile(&hit_ns, 0.5) / 1e3,
        percentile(&hit_ns, 0.99) / 1e3
    );
    for (ti, t) in fast.iter().enumerate() {
        let what = if ti == 0 {
            "TCP + TLS handshake, direct".to_string()
        } else {
            format!("TCP + CONNECT + TLS handshake (cached leaf), {}", t.name)
        };
        println!(
            "| {what} | {:.0} | {:.0} |",
            percentile(&handshakes[ti], 0.5) / 1e3,
            percentile(&handshakes[ti], 0.99) / 1e3
        );
    }
    println!();
    for note in &notes {
        println!("- {note}");
    }
    drop(server);
}
