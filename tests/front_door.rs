//! The front door end to end, on real sockets: CONNECT + TLS interception, tunnels, direct
//! doors, passthrough streaming, errors, shutdown, and the leaf certificates.

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use common::client::{self, Alpn, Sender};
use common::closed_port;
use common::cursor_upstream::{self, FakeUpstream};
use cursor_byok::base::secret::Secret;
use cursor_byok::config::{Config, ProxyAuth};
use cursor_byok::proxy::Server;
use cursor_byok::tls::{CertStore, CertificateAuthority};
use http::{Method, Request, StatusCode};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use rustls::client::danger::ServerCertVerifier;
use rustls::pki_types::CertificateDer;
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const API: &str = "api2.cursor.sh";
const STEP: Duration = Duration::from_secs(10);

struct Harness {
    upstream: FakeUpstream,
    server: Server,
    our_ca: CertificateDer<'static>,
    _dir: tempfile::TempDir,
}

fn base_config(dir: &Path) -> Config {
    let mut config = Config::from_toml("listen = \"127.0.0.1:0\"\n", "front_door test").unwrap();
    config.data_dir = Some(dir.to_path_buf());
    config
}

async fn harness() -> Harness {
    harness_with(|_, _| {}).await
}

/// A fake Cursor upstream behind `api2.cursor.sh` and a bound server, `tweak`ed first.
async fn harness_with(tweak: impl FnOnce(&mut Config, &FakeUpstream)) -> Harness {
    let upstream = FakeUpstream::start(&[API, "agent.api5.cursor.sh"]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut config = base_config(dir.path());
    for host in [API, "agent.api5.cursor.sh"] {
        config.upstream.resolve.insert(host.into(), upstream.addr);
    }
    config.upstream.extra_roots = Some(upstream.ca_pem_path.clone());
    tweak(&mut config, &upstream);
    let (ca, _) = CertificateAuthority::load_or_create(&dir.path().join("ca")).unwrap();
    // The client trusts the CA as written to disk, as a user's system would.
    let pem = std::fs::read(ca.cert_path()).unwrap();
    let our_ca = rustls_pemfile::certs(&mut pem.as_slice())
        .next()
        .unwrap()
        .unwrap();
    let server = Server::builder(config, ca).bind().await.unwrap();
    Harness {
        upstream,
        server,
        our_ca,
        _dir: dir,
    }
}

impl Harness {
    fn our_roots(&self) -> rustls::RootCertStore {
        client::roots(&[&self.our_ca])
    }

    async fn client(&self, alpn: Alpn) -> Sender {
        client::via_proxy(
            self.server.proxy_addr(),
            "api2.cursor.sh:443",
            API,
            self.our_roots(),
            alpn,
        )
        .await
    }
}

fn post(path: &str, body: client::Body) -> Request<client::Body> {
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("content-type", "application/connect+proto")
        .header("connect-protocol-version", "1")
        .body(body)
        .unwrap()
}

fn get(path: &str) -> Request<client::Body> {
    Request::builder().uri(path).body(client::empty()).unwrap()
}

fn version_name(alpn: Alpn) -> &'static str {
    match alpn {
        Alpn::H1 => "HTTP/1.1",
        Alpn::H2 => "HTTP/2.0",
    }
}

/// Reads Connect envelopes off a streaming body as they arrive.
struct FrameReader {
    body: Incoming,
    buf: BytesMut,
}

impl FrameReader {
    fn new(resp: hyper::Response<Incoming>) -> Self {
        FrameReader {
            body: resp.into_body(),
            buf: BytesMut::new(),
        }
    }

    /// The next whole envelope `(flags, payload)`, or `None` at the end of the body.
    async fn next(&mut self) -> Option<(u8, Bytes)> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]])
                    as usize;
                if self.buf.len() >= 5 + len {
                    let flags = self.buf[0];
                    self.buf.advance(5);
                    return Some((flags, self.buf.split_to(len).freeze()));
                }
            }
            let frame = tokio::time::timeout(STEP, self.body.frame())
                .await
                .expect("a frame within the step timeout (is something buffering?)");
            match frame {
                None => return None,
                Some(frame) => {
                    if let Ok(data) = frame.expect("body frame").into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }

    async fn expect_message(&mut self, text: &str) {
        let (flags, payload) = self.next().await.expect("a frame, not the end");
        assert_eq!(flags, 0);
        assert_eq!(payload, text.as_bytes());
    }

    async fn expect_end(&mut self) {
        let (flags, _) = self.next().await.expect("the end frame");
        assert_eq!(flags, 2);
        assert!(self.next().await.is_none(), "nothing after the end frame");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unary_passes_with_headers_and_version() {
    let h = harness().await;
    for alpn in Alpn::both() {
        let mut c = h.client(alpn).await;
        for round in 0..3 {
            let mut req = post("/echo", client::full(format!("hello {round}")));
            let headers = req.headers_mut();
            headers.insert("authorization", "Bearer secret-token".parse().unwrap());
            headers.insert("x-cursor-checksum", "abc123".parse().unwrap());
            headers.insert("x-cursor-client-version", "1.2.3".parse().unwrap());
            let resp = c.send(API, req).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            let headers = resp.headers().clone();
            assert_eq!(headers["x-echo-authorization"], "Bearer secret-token");
            assert_eq!(headers["x-echo-x-cursor-checksum"], "abc123");
            assert_eq!(headers["x-echo-x-cursor-client-version"], "1.2.3");
            assert_eq!(headers["x-echo-connect-protocol-version"], "1");
            assert_eq!(
                headers["x-echo-version"],
                version_name(alpn),
                "{alpn:?} kept upstream"
            );
            assert_eq!(headers["x-echo-host"], API);
            assert_eq!(client::collect(resp).await, format!("hello {round}"));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stream_frames_arrive_one_by_one() {
    let h = harness().await;
    for alpn in Alpn::both() {
        let mut c = h.client(alpn).await;
        let resp = c
            .send(API, post("/stream?frames=3", client::empty()))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut frames = FrameReader::new(resp);
        // The upstream holds each later frame until released: seeing frame i before releasing
        // frame i+1 proves nothing in between waits for more.
        for i in 0..3 {
            frames.expect_message(&format!("frame {i}")).await;
            h.upstream.release(1);
        }
        frames.expect_end().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_stream_with_pauses_is_not_buffered() {
    let h = harness().await;
    for alpn in Alpn::both() {
        let mut c = h.client(alpn).await;
        let start = Instant::now();
        let resp = c
            .send(API, post("/stream?frames=4&pause_ms=200", client::empty()))
            .await
            .unwrap();
        let mut frames = FrameReader::new(resp);
        let mut arrivals = Vec::new();
        while let Some((flags, _)) = frames.next().await {
            arrivals.push((flags, start.elapsed()));
        }
        assert_eq!(arrivals.len(), 5, "4 messages and the end frame");
        let first = arrivals[0].1;
        let end = arrivals[4].1;
        eprintln!("{alpn:?} frame arrivals: {arrivals:?}");
        // 4 pauses of 200 ms lie between the first frame and the end: generous bound.
        assert!(end - first >= Duration::from_millis(400), "{arrivals:?}");
        for pair in arrivals.windows(2) {
            assert!(pair[1].1 > pair[0].1, "frames arrive in order, apart");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bidi_echo_answers_each_frame_before_client_closes() {
    let h = harness().await;
    for alpn in Alpn::both() {
        let mut c = h.client(alpn).await;
        let (tx, body) = client::channel_body();
        let resp = c.send(API, post("/bidi", body)).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let mut frames = FrameReader::new(resp);
        for i in 0..5 {
            let text = format!("ping {i}");
            tx.send(cursor_upstream::connect_frame(0, text.as_bytes()))
                .await
                .unwrap();
            // The request side is still open: the echo must come back now.
            frames.expect_message(&text).await;
        }
        drop(tx);
        frames.expect_end().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn download_8_mib_arrives_intact() {
    let h = harness().await;
    let expected = Sha256::digest(cursor_upstream::download_bytes());
    for alpn in Alpn::both() {
        let mut c = h.client(alpn).await;
        let resp = c.send(API, get("/download")).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(
            resp.headers()["content-length"],
            cursor_upstream::DOWNLOAD_LEN.to_string()
        );
        let body = client::collect(resp).await;
        assert_eq!(body.len(), cursor_upstream::DOWNLOAD_LEN);
        assert_eq!(Sha256::digest(&body), expected, "{alpn:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn response_trailers_pass_over_h2() {
    let h = harness().await;
    let mut c = h.client(Alpn::H2).await;
    let mut req = get("/trailers");
    req.headers_mut().insert("te", "trailers".parse().unwrap());
    let resp = c.send(API, req).await.unwrap();
    let collected = tokio::time::timeout(STEP, resp.into_body().collect())
        .await
        .unwrap()
        .unwrap();
    let trailers = collected.trailers().cloned().expect("trailers arrive");
    assert_eq!(trailers["x-trailer"], "done");
    assert_eq!(collected.to_bytes(), "body");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn websocket_upgrade_is_tunnelled() {
    let h = harness().await;
    let mut c = h.client(Alpn::H1).await;
    let req = Request::builder()
        .uri("/ws")
        .header("connection", "Upgrade")
        .header("upgrade", "websocket")
        .header("sec-websocket-version", "13")
        .header("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ==")
        .body(client::empty())
        .unwrap();
    let resp = c.send(API, req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::SWITCHING_PROTOCOLS);
    assert_eq!(resp.headers()["upgrade"], "websocket");
    let upgraded = tokio::time::timeout(STEP, hyper::upgrade::on(resp))
        .await
        .unwrap()
        .unwrap();
    let mut io = hyper_util::rt::TokioIo::new(upgraded);
    for msg in ["first", "second message"] {
        io.write_all(msg.as_bytes()).await.unwrap();
        let mut back = vec![0u8; msg.len()];
        tokio::time::timeout(STEP, io.read_exact(&mut back))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(back, msg.as_bytes());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_hosts_are_tunnelled_byte_exact() {
    let other = FakeUpstream::start(&["tunnel.example"]).await;
    let other_addr = other.addr;
    let h = harness_with(|c, _| {
        c.upstream
            .resolve
            .insert("tunnel.example".into(), other_addr);
    })
    .await;
    let stream = client::tunnel(h.server.proxy_addr(), "tunnel.example:443").await;
    // The client trusts only the other server's CA, and sees that server's own certificate.
    let roots = client::roots(&[&other.ca.cert_der]);
    let tls = client::tls(stream, "tunnel.example", roots, Alpn::H2)
        .await
        .unwrap();
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    assert_eq!(
        Some(presented),
        other.cert_der.clone(),
        "the upstream's own certificate"
    );
    let mut c = Sender::handshake(tls, Alpn::H2).await;
    let resp = c
        .send("tunnel.example", post("/echo", client::full("through")))
        .await
        .unwrap();
    assert_eq!(client::collect(resp).await, "through");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn non_tls_bytes_are_tunnelled_for_any_host() {
    let (echo_addr, _echo) = cursor_upstream::tcp_echo().await;
    let h = harness_with(|c, _| {
        c.upstream.resolve.insert("raw.cursor.sh".into(), echo_addr);
        c.upstream.resolve.insert("echo.example".into(), echo_addr);
    })
    .await;
    for target in ["raw.cursor.sh:443", "echo.example:7"] {
        let mut stream = client::tunnel(h.server.proxy_addr(), target).await;
        for msg in [&b"PING not tls\r\n"[..], &[0u8, 1, 2, 255, 22, 3]] {
            stream.write_all(msg).await.unwrap();
            let mut back = vec![0u8; msg.len()];
            tokio::time::timeout(STEP, stream.read_exact(&mut back))
                .await
                .unwrap()
                .unwrap();
            assert_eq!(back, msg, "{target}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_tls_door_reaches_the_same_upstream() {
    let h = harness_with(|c, _| {
        c.direct.tls_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let door = h.server.tls_addr().unwrap();
    // A client that maps api2.cursor.sh to 127.0.0.1, or that dials localhost / the IP.
    for name in [API, "localhost", "127.0.0.1"] {
        for alpn in Alpn::both() {
            let mut c = client::direct(door, name, h.our_roots(), alpn).await;
            let resp = c
                .send(name, post("/echo", client::full("direct")))
                .await
                .unwrap();
            assert_eq!(resp.status(), StatusCode::OK, "{name} {alpn:?}");
            assert_eq!(
                resp.headers()["x-echo-host"],
                API,
                "sent to the configured origin"
            );
            assert_eq!(resp.headers()["x-echo-version"], version_name(alpn));
            assert_eq!(client::collect(resp).await, "direct");
        }
    }
    // Names outside the patterns get no certificate at all.
    let stream = tokio::net::TcpStream::connect(door).await.unwrap();
    assert!(client::tls(stream, "example.com", h.our_roots(), Alpn::H2)
        .await
        .is_err());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_http_door_reaches_the_same_upstream() {
    let h = harness_with(|c, _| {
        c.direct.http_listen = Some("127.0.0.1:0".parse().unwrap());
    })
    .await;
    let stream = tokio::net::TcpStream::connect(h.server.http_addr().unwrap())
        .await
        .unwrap();
    let mut c = Sender::handshake(stream, Alpn::H1).await;
    let resp = c
        .send("127.0.0.1", post("/echo", client::full("plain door")))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-echo-host"], API);
    assert_eq!(client::collect(resp).await, "plain door");
    // Streams stream here too.
    let resp = c
        .send("127.0.0.1", post("/stream?frames=2", client::empty()))
        .await
        .unwrap();
    let mut frames = FrameReader::new(resp);
    frames.expect_message("frame 0").await;
    h.upstream.release(1);
    frames.expect_message("frame 1").await;
    h.upstream.release(1);
    frames.expect_end().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn absolute_form_plain_http_is_forwarded() {
    let plain = FakeUpstream::start_plain().await;
    let plain_addr = plain.addr;
    let h = harness_with(|c, _| {
        c.upstream
            .resolve
            .insert("plain.example".into(), plain_addr);
    })
    .await;
    let stream = tokio::net::TcpStream::connect(h.server.proxy_addr())
        .await
        .unwrap();
    let mut c = Sender::handshake(stream, Alpn::H1).await;
    let req = Request::builder()
        .method(Method::POST)
        .uri("http://plain.example/echo")
        .header("x-cursor-test", "kept")
        .header("proxy-connection", "keep-alive")
        .body(client::full("absolute"))
        .unwrap();
    let resp = c.send("plain.example", req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert_eq!(resp.headers()["x-echo-x-cursor-test"], "kept");
    assert_eq!(resp.headers()["x-echo-host"], "plain.example");
    assert_eq!(client::collect(resp).await, "absolute");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn proxy_auth_answers_407_without_credentials() {
    let h = harness_with(|c, _| {
        c.proxy_auth = Some(ProxyAuth {
            username: "dev".into(),
            password: Secret::new("s3cret"),
        });
    })
    .await;
    let proxy = h.server.proxy_addr();
    let (status, head, _) = client::connect_raw(proxy, "api2.cursor.sh:443", None).await;
    assert_eq!(status, 407, "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("proxy-authenticate: basic"),
        "{head}"
    );
    // base64("dev:wrong") and base64("dev:s3cret")
    let (status, _, _) =
        client::connect_raw(proxy, "api2.cursor.sh:443", Some("Basic ZGV2Ondyb25n")).await;
    assert_eq!(status, 407);
    let (status, head, stream) =
        client::connect_raw(proxy, "api2.cursor.sh:443", Some("Basic ZGV2OnMzY3JldA==")).await;
    assert_eq!(status, 200, "{head}");
    let tls = client::tls(stream, API, h.our_roots(), Alpn::H2)
        .await
        .unwrap();
    let mut c = Sender::handshake(tls, Alpn::H2).await;
    let resp = c
        .send(API, post("/echo", client::full("authed")))
        .await
        .unwrap();
    assert_eq!(client::collect(resp).await, "authed");
    // Absolute-form requests need it too.
    let stream = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let mut c = Sender::handshake(stream, Alpn::H1).await;
    let req = Request::builder()
        .uri("http://plain.example/echo")
        .body(client::empty())
        .unwrap();
    let resp = c.send("plain.example", req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::PROXY_AUTHENTICATION_REQUIRED);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_upstream_answers_502_with_the_reason_quickly() {
    let dead = closed_port();
    let h = harness_with(|c, _| {
        c.upstream.resolve.insert(API.into(), dead.addr);
        c.upstream.resolve.insert("gone.example".into(), dead.addr);
    })
    .await;
    for alpn in Alpn::both() {
        let mut c = h.client(alpn).await;
        let started = Instant::now();
        let req = Request::builder()
            .method(Method::POST)
            .uri("/echo")
            .body(client::full("x"))
            .unwrap();
        let resp = tokio::time::timeout(STEP, c.send(API, req))
            .await
            .unwrap()
            .unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        let text = String::from_utf8(client::collect(resp).await.to_vec()).unwrap();
        assert!(
            text.contains("upstream api2.cursor.sh unreachable: connection refused"),
            "{text}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(5),
            "fast, not a hang"
        );
        // Connect clients get Connect's error JSON.
        let resp = c.send(API, post("/echo", client::full("x"))).await.unwrap();
        assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
        assert_eq!(resp.headers()["content-type"], "application/json");
        let json: serde_json::Value = serde_json::from_slice(&client::collect(resp).await).unwrap();
        assert_eq!(json["code"], "unavailable");
        assert!(json["message"]
            .as_str()
            .unwrap()
            .contains("connection refused"));
    }
    // A tunnel target that is down: the CONNECT itself says so.
    let (status, head, mut stream) =
        client::connect_raw(h.server.proxy_addr(), "gone.example:443", None).await;
    assert_eq!(status, 502, "{head}");
    let mut body = vec![0u8; 200];
    let n = stream.read(&mut body).await.unwrap();
    assert!(String::from_utf8_lossy(&body[..n]).contains("connection refused"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_our_own_listener_is_refused() {
    let h = harness().await;
    let own = format!("127.0.0.1:{}", h.server.proxy_addr().port());
    let (status, head, mut stream) = client::connect_raw(h.server.proxy_addr(), &own, None).await;
    assert_eq!(status, 502, "{head}");
    let mut body = vec![0u8; 300];
    let n = stream.read(&mut body).await.unwrap();
    assert!(String::from_utf8_lossy(&body[..n]).contains("loop"));
}

/// A three-frame server stream whose later frames the upstream holds until released, read up
/// to its first frame.
async fn open_held_stream(c: &mut Sender) -> FrameReader {
    let resp = c
        .send(API, post("/stream?frames=3", client::empty()))
        .await
        .unwrap();
    let mut frames = FrameReader::new(resp);
    frames.expect_message("frame 0").await;
    frames
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn graceful_shutdown_lets_an_inflight_stream_finish() {
    let h = harness().await;
    let proxy = h.server.proxy_addr();
    let mut c = h.client(Alpn::H2).await;
    let mut frames = open_held_stream(&mut c).await;

    let Harness {
        upstream, server, ..
    } = h;
    let shutdown = tokio::spawn(server.shutdown(Duration::from_secs(20)));
    // Stops accepting at once (a loopback connect is answered or refused at once).
    let refused = common::wait_until(Duration::from_secs(1), || {
        std::net::TcpStream::connect(proxy).is_err()
    })
    .await;
    assert!(refused, "the listener closed");
    // The live stream still finishes.
    for i in 1..3 {
        upstream.release(1);
        frames.expect_message(&format!("frame {i}")).await;
    }
    upstream.release(1);
    frames.expect_end().await;
    tokio::time::timeout(Duration::from_secs(10), shutdown)
        .await
        .expect("shutdown ends once the stream is done")
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grace_period_expiry_closes_stuck_streams() {
    // Both versions: on HTTP/2 the stream's future and the upstream link run inside the
    // client connection's task, which the grace period's end must cut as a whole.
    for alpn in Alpn::both() {
        let h = harness().await;
        let mut c = h.client(alpn).await;
        let mut frames = open_held_stream(&mut c).await;
        let started = Instant::now();
        let Harness {
            server, upstream, ..
        } = h;
        server.shutdown(Duration::from_millis(300)).await;
        assert!(started.elapsed() < Duration::from_secs(5), "{alpn:?}");
        // The stream was cut: an error or an early end, never frame 1.
        let next = tokio::time::timeout(STEP, frames.body.frame())
            .await
            .unwrap();
        assert!(
            !matches!(next, Some(Ok(_))),
            "{alpn:?}: no more data after the close: {next:?}"
        );
        drop(upstream);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_disconnect_cancels_the_upstream_stream() {
    let h = harness().await;
    for (round, alpn) in Alpn::both().into_iter().enumerate() {
        let mut c = h.client(alpn).await;
        let frames = open_held_stream(&mut c).await;
        drop(frames);
        drop(c);
        // The upstream sends into a stream nobody reads any more, a frame at a time, until the
        // proxy (whenever it sees the client gone) cancels it.
        h.upstream.release(1);
        // Three steps: under a loaded machine the proxy may see the client gone late; the
        // wait still ends as soon as the upstream stream is cancelled.
        let cancelled = common::wait_until(STEP * 3, || {
            let done = h.upstream.cancelled_streams() > round;
            if !done {
                h.upstream.release(1);
            }
            done
        })
        .await;
        assert!(cancelled, "{alpn:?}: upstream stream still open");
    }
}

/// Each client connection gets its own upstream connection (HTTP/2 streams share it), it is
/// redialled when the origin closes it, and it closes when the client's does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_upstream_connection_per_client_connection() {
    let h = harness().await;
    let wait_open = |n: usize| {
        let upstream = &h.upstream;
        async move {
            let open = common::wait_until(STEP, || upstream.connections_open() == n).await;
            assert!(
                open,
                "{} upstream connections open, expected {n}",
                upstream.connections_open()
            );
        }
    };
    for alpn in Alpn::both() {
        let before = h.upstream.connections_accepted();
        let mut a = h.client(alpn).await;
        let mut b = h.client(alpn).await;
        for i in 0..4 {
            let resp = a
                .send(API, post("/echo", client::full(format!("a{i}"))))
                .await;
            assert_eq!(client::collect(resp.unwrap()).await, format!("a{i}"));
        }
        let resp = b.send(API, post("/echo", client::full("b"))).await.unwrap();
        assert_eq!(client::collect(resp).await, "b");
        assert_eq!(
            h.upstream.connections_accepted() - before,
            2,
            "{alpn:?}: one upstream connection per client connection"
        );
        if alpn == Alpn::H1 {
            // The origin closes after this answer: the next request goes out on a new one.
            let resp = a.send(API, get("/close")).await.unwrap();
            assert_eq!(client::collect(resp).await, "closing");
            let resp = a.send(API, post("/echo", client::full("again"))).await;
            assert_eq!(client::collect(resp.unwrap()).await, "again");
            assert_eq!(h.upstream.connections_accepted() - before, 3);
        }
        drop(a);
        drop(b);
        wait_open(0).await;
    }
}

/// An echoed request carrying headers the client's HPACK encoder indexes, checked on the way
/// back.
async fn echo_with_headers(c: &mut Sender, round: &str) {
    let mut req = post("/echo", client::full(format!("body {round}")));
    let headers = req.headers_mut();
    headers.insert("authorization", "Bearer secret-token".parse().unwrap());
    headers.insert("x-cursor-checksum", format!("sum-{round}").parse().unwrap());
    headers.insert("x-cursor-client-version", "1.2.3".parse().unwrap());
    let resp = c.send(API, req).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK, "{round}");
    let echoed = resp.headers().clone();
    assert_eq!(
        echoed["x-echo-authorization"], "Bearer secret-token",
        "{round}"
    );
    assert_eq!(
        echoed["x-echo-x-cursor-checksum"],
        format!("sum-{round}").as_str()
    );
    assert_eq!(echoed["x-echo-x-cursor-client-version"], "1.2.3", "{round}");
    assert_eq!(echoed["x-echo-version"], "HTTP/2.0", "{round}");
    assert_eq!(client::collect(resp).await, format!("body {round}"));
}

/// On one HTTP/2 connection, passthrough streams (relayed frame by frame), a stream that is
/// ours (peeled off to the router) and a stream the client abandons mid-answer interleave;
/// every header still arrives intact both ways afterwards. With `h2_relay = false` the same
/// holds through hyper.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_streams_of_every_kind_share_one_connection() {
    for relay in [true, false] {
        let h = harness_with(|c, _| c.upstream.h2_relay = relay).await;
        let mut c = h.client(Alpn::H2).await;
        for i in 0..3 {
            echo_with_headers(&mut c, &format!("{relay}-a{i}")).await;
        }
        // Ours: the server config is rewritten by cursor-byok.
        let mut req = post(
            "/aiserver.v1.ServerConfigService/GetServerConfig",
            client::empty(),
        );
        req.headers_mut()
            .insert("content-type", "application/proto".parse().unwrap());
        req.headers_mut()
            .insert("x-cursor-new-header", "only-here".parse().unwrap());
        let resp = c.send(API, req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "relay={relay}");
        client::collect(resp).await;
        echo_with_headers(&mut c, &format!("{relay}-b")).await;
        // A stream the client drops after its first frame; the origin answers on.
        let frames = open_held_stream(&mut c).await;
        drop(frames);
        h.upstream.release(3);
        for i in 0..3 {
            echo_with_headers(&mut c, &format!("{relay}-c{i}")).await;
        }
        // Many streams at once, each checked.
        let mut tasks = Vec::new();
        for i in 0..16 {
            let mut c = match &c {
                Sender::H2(send) => Sender::H2(send.clone()),
                Sender::H1(_) => unreachable!("an HTTP/2 client"),
            };
            tasks.push(tokio::spawn(async move {
                echo_with_headers(&mut c, &format!("{relay}-d{i}")).await;
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    }
}

/// A client with the smallest windows HTTP/2 allows: the relay holds the origin's data back
/// until the client reads, and an upload larger than every window still arrives whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_flow_control_holds_with_small_client_windows() {
    let h = harness().await;
    let mut c = client::via_proxy_h2_windows(
        h.server.proxy_addr(),
        "api2.cursor.sh:443",
        API,
        h.our_roots(),
        (65_535, 65_535),
    )
    .await;
    let resp = c.send(API, get("/download")).await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let body = client::collect(resp).await;
    assert!(
        body[..] == cursor_upstream::download_bytes()[..],
        "download intact"
    );
    let upload: Vec<u8> = (0..3 * 1024 * 1024).map(|i| (i % 253) as u8).collect();
    let resp = c
        .send(API, post("/echo", client::full(upload.clone())))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    assert!(
        client::collect(resp).await[..] == upload[..],
        "upload echoed intact"
    );
}

#[test]
fn leaf_certificates_are_well_formed() {
    use x509_parser::prelude::*;
    let dir = tempfile::tempdir().unwrap();
    let (ca, _) = CertificateAuthority::load_or_create(dir.path()).unwrap();
    let ca_der = ca.cert_der().clone();
    let store = CertStore::new(std::sync::Arc::new(ca)).unwrap();
    let hosts = [
        API,
        "agent.api5.cursor.sh",
        "agentn.api5.cursor.sh",
        "127.0.0.1",
    ];
    let mut serials = std::collections::HashSet::new();
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs() as i64;
    for host in hosts {
        let der = store.minter().mint(host).unwrap();
        let (_, cert) = X509Certificate::from_der(&der).unwrap();
        let san = cert.subject_alternative_name().unwrap().expect("SAN");
        let names = &san.value.general_names;
        assert_eq!(names.len(), 1, "{host}");
        match (&names[0], host.parse::<std::net::IpAddr>()) {
            (GeneralName::IPAddress(bytes), Ok(std::net::IpAddr::V4(ip))) => {
                assert_eq!(*bytes, &ip.octets()[..])
            }
            (GeneralName::DNSName(name), Err(_)) => assert_eq!(*name, host),
            other => panic!("unexpected SAN for {host}: {other:?}"),
        }
        let eku = cert.extended_key_usage().unwrap().expect("EKU");
        assert!(eku.value.server_auth, "{host}");
        let not_before = cert.validity().not_before.timestamp();
        let not_after = cert.validity().not_after.timestamp();
        assert!(not_before < now - 3600, "backdated");
        let days_left = (not_after - now) as f64 / 86_400.0;
        assert!((364.9..=365.1).contains(&days_left), "{days_left} days");
        assert!(serials.insert(cert.raw_serial().to_vec()), "unique serial");
        assert!(
            !cert
                .extensions()
                .iter()
                .any(|e| e.oid == x509_parser::oid_registry::OID_X509_EXT_SUBJECT_KEY_IDENTIFIER),
            "no SKI"
        );
        assert_eq!(
            cert.issuer(),
            X509Certificate::from_der(&ca_der).unwrap().1.subject()
        );
    }
    // The chain verifies against the CA (signature, SAN, EKU, validity) with webpki.
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let roots = std::sync::Arc::new(client::roots(&[&ca_der]));
    let verifier = rustls::client::WebPkiServerVerifier::builder_with_provider(roots, provider)
        .build()
        .unwrap();
    for host in hosts {
        let leaf = store.minter().mint(host).unwrap();
        let name = rustls::pki_types::ServerName::try_from(host).unwrap();
        verifier
            .verify_server_cert(&leaf, &[], &name, &[], rustls::pki_types::UnixTime::now())
            .unwrap_or_else(|e| panic!("{host}: {e}"));
        let wrong = rustls::pki_types::ServerName::try_from("example.com").unwrap();
        assert!(verifier
            .verify_server_cert(&leaf, &[], &wrong, &[], rustls::pki_types::UnixTime::now())
            .is_err());
    }
    // Ready server configs offer h2 and http/1.1.
    let config = store.server_config(API).unwrap();
    assert_eq!(
        config.alpn_protocols,
        vec![b"h2".to_vec(), b"http/1.1".to_vec()]
    );
}
