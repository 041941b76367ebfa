//! The relay between real hyper HTTP/2 peers on in-memory connections: a client, an origin
//! and our own server, each answering with where it is and what headers it saw. On tokio's
//! paused clock: every task runs until it waits before time moves, so a sleep here orders
//! events exactly (the late answer at 200 ms comes after the client's 50 ms give-up).

use std::convert::Infallible;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::client::conn::http2::SendRequest;
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};
use tokio::sync::{mpsc, oneshot};

use super::conn::{BoxFuture, BoxIo, Dialer, Relay, Setup, TLS_RECORD};
use crate::http::{boxed, full, Body};
use crate::upstream::UpstreamError;

const STEP: Duration = Duration::from_secs(5);

/// An answer that says who gave it and echoes the `x-` request headers.
async fn answer(from: &'static str, req: Request<Incoming>, gates: Gates) -> Response<Body> {
    gates.seen.fetch_add(1, Ordering::SeqCst);
    let path = req.uri().path().to_string();
    let mut echoed = Vec::new();
    for (name, value) in req.headers() {
        if name.as_str().starts_with("x-") {
            echoed.push((format!("x-echo-{name}"), value.clone()));
        }
    }
    let body = match path.as_str() {
        // Headers only after a delay (a client may give up before).
        "/late" => {
            tokio::time::sleep(Duration::from_millis(200)).await;
            full("late")
        }
        // Never answers until the origin dies.
        "/never" => {
            std::future::pending::<()>().await;
            full("")
        }
        // One chunk, then holds the stream open until released.
        "/hold" => {
            let (tx, rx) = mpsc::channel::<Result<Frame<Bytes>, Infallible>>(4);
            let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"first")))).await;
            let release = gates.hold.lock().await.take();
            tokio::spawn(async move {
                if let Some(release) = release {
                    let _ = release.await;
                }
                let _ = tx.send(Ok(Frame::data(Bytes::from_static(b"last")))).await;
            });
            let stream = futures_util::stream::unfold(rx, |mut rx| async move {
                rx.recv().await.map(|item| (item, rx))
            });
            boxed(StreamBody::new(stream))
        }
        "/big" => full(vec![7u8; 4 * 1024 * 1024]),
        "/pattern" => full(pattern()),
        // A body larger than a small client window, then trailers.
        "/big-trailers" => {
            let mut trailers = http::HeaderMap::new();
            trailers.insert("x-trailer", "done".parse().unwrap());
            let frames: Vec<Result<Frame<Bytes>, Infallible>> = vec![
                Ok(Frame::data(Bytes::from(vec![5u8; 200 * 1024]))),
                Ok(Frame::trailers(trailers)),
            ];
            boxed(StreamBody::new(futures_util::stream::iter(frames)))
        }
        _ => {
            let bytes = req.into_body().collect().await.map(|c| c.to_bytes());
            full(bytes.unwrap_or_default())
        }
    };
    let mut resp = Response::new(body);
    resp.headers_mut().insert("x-from", from.parse().unwrap());
    resp.headers_mut().insert("x-path", path.parse().unwrap());
    for (name, value) in echoed {
        resp.headers_mut().insert(
            http::HeaderName::from_bytes(name.as_bytes()).unwrap(),
            value,
        );
    }
    resp
}

/// 3 MiB, more than the stream window we grant the origin, in an order a slip would show.
fn pattern() -> Vec<u8> {
    (0..3 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect()
}

/// The relay's end of the client connection, taking at most `cap` bytes per write; the size
/// of every write it took, in order.
struct Capped {
    io: DuplexStream,
    cap: usize,
    writes: Arc<std::sync::Mutex<Vec<usize>>>,
}

impl Capped {
    fn took(
        &self,
        written: std::task::Poll<std::io::Result<usize>>,
    ) -> std::task::Poll<std::io::Result<usize>> {
        if let std::task::Poll::Ready(Ok(n)) = written {
            self.writes.lock().unwrap().push(n);
        }
        written
    }
}

impl tokio::io::AsyncRead for Capped {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Capped {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let n = buf.len().min(self.cap);
        let written = std::pin::Pin::new(&mut self.io).poll_write(cx, &buf[..n]);
        self.took(written)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        // The first slices up to `cap`, the last one cut.
        let mut room = self.cap;
        let mut capped = Vec::new();
        for buf in bufs {
            if room == 0 {
                break;
            }
            let n = buf.len().min(room);
            capped.push(std::io::IoSlice::new(&buf[..n]));
            room -= n;
        }
        let written = std::pin::Pin::new(&mut self.io).poll_write_vectored(cx, &capped);
        self.took(written)
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[derive(Clone, Default)]
struct Gates {
    hold: Arc<tokio::sync::Mutex<Option<oneshot::Receiver<()>>>>,
    /// Requests the server has seen.
    seen: Arc<AtomicUsize>,
}

/// A hyper HTTP/2 server on `io`; `shutdown` asks it for a graceful close (GOAWAY).
async fn serve(
    from: &'static str,
    io: DuplexStream,
    gates: Gates,
    shutdown: Option<oneshot::Receiver<()>>,
) {
    let service = service_fn(move |req| {
        let gates = gates.clone();
        async move { Ok::<_, Infallible>(answer(from, req, gates).await) }
    });
    let conn = hyper::server::conn::http2::Builder::new(TokioExecutor::new())
        .serve_connection(TokioIo::new(io), service);
    tokio::pin!(conn);
    match shutdown {
        Some(shutdown) => {
            tokio::select! {
                _ = conn.as_mut() => return,
                _ = shutdown => conn.as_mut().graceful_shutdown(),
            }
            let _ = conn.await;
        }
        None => {
            let _ = conn.await;
        }
    }
}

enum Origin {
    Serves,
    Refuses,
}

struct Fixture {
    client: SendRequest<Body>,
    relay: tokio::task::JoinHandle<()>,
    origin: Option<tokio::task::JoinHandle<()>>,
    goaway: Option<oneshot::Sender<()>>,
    stop: Option<oneshot::Sender<()>>,
    release: Option<oneshot::Sender<()>>,
    internal_conns: Arc<AtomicUsize>,
    /// Origin connections dialled.
    dials: Arc<AtomicUsize>,
    /// Requests the origin has seen.
    origin_seen: Arc<AtomicUsize>,
    /// The size of every write the relay made to the client.
    client_writes: Arc<std::sync::Mutex<Vec<usize>>>,
}

async fn start(origin: Origin, windows: (u32, u32)) -> Fixture {
    start_capped(origin, windows, usize::MAX).await
}

/// As [`start`], the relay writing at most `cap` bytes to the client at a time.
async fn start_capped(origin: Origin, windows: (u32, u32), cap: usize) -> Fixture {
    start_piped(origin, windows, cap, 64 * 1024).await
}

/// As [`start_capped`], every in-memory connection holding up to `pipe` bytes each way.
async fn start_piped(origin: Origin, windows: (u32, u32), cap: usize, pipe: usize) -> Fixture {
    let gates = Gates::default();
    let (release, held) = oneshot::channel();
    *gates.hold.lock().await = Some(held);
    let (goaway, goaway_rx) = oneshot::channel();
    let dials = Arc::new(AtomicUsize::new(0));
    let dialled = dials.clone();
    let (dial, origin_task): (Dialer, _) = match origin {
        Origin::Serves => {
            // The first connection (which the test may stop), then a new origin per redial.
            let (ours, theirs) = tokio::io::duplex(pipe);
            let task = tokio::spawn(serve("origin", theirs, gates.clone(), Some(goaway_rx)));
            let first = std::sync::Mutex::new(Some(ours));
            let gates = gates.clone();
            let dial: Dialer = Box::new(move || -> BoxFuture<Result<BoxIo, UpstreamError>> {
                dialled.fetch_add(1, Ordering::SeqCst);
                let io = first.lock().unwrap().take().unwrap_or_else(|| {
                    let (ours, theirs) = tokio::io::duplex(pipe);
                    tokio::spawn(serve("origin", theirs, gates.clone(), None));
                    ours
                });
                Box::pin(async move { Ok(Box::new(io) as BoxIo) })
            });
            (dial, Some(task))
        }
        // Fails once the client's first stream is waiting for it.
        Origin::Refuses => {
            let dial: Dialer = Box::new(move || -> BoxFuture<Result<BoxIo, UpstreamError>> {
                dialled.fetch_add(1, Ordering::SeqCst);
                Box::pin(async {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    Err(UpstreamError::Connect {
                        host: "api2.cursor.sh".into(),
                        reason: "connection refused".into(),
                    })
                })
            });
            (dial, None)
        }
    };
    let internal_conns = Arc::new(AtomicUsize::new(0));
    let counter = internal_conns.clone();
    let (stop, stopped) = oneshot::channel::<()>();
    let setup = Setup {
        authority: "api2.cursor.sh".into(),
        port: 443,
        host: "api2.cursor.sh".into(),
        dial,
        internal: Box::new(move |io| -> BoxFuture<()> {
            counter.fetch_add(1, Ordering::SeqCst);
            Box::pin(serve("internal", io, Gates::default(), None))
        }),
        passthrough: |path| !path.starts_with("/ours"),
        stopping: Box::pin(async move {
            let _ = stopped.await;
        }),
    };
    let (client_io, relay_io) = tokio::io::duplex(pipe);
    let client_writes = Arc::default();
    let relay_io = Capped {
        io: relay_io,
        cap,
        writes: Arc::clone(&client_writes),
    };
    let relay = tokio::spawn(Relay::new(Box::new(relay_io), setup));
    let (client, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
        .initial_stream_window_size(windows.0)
        .initial_connection_window_size(windows.1)
        .adaptive_window(false)
        .handshake(TokioIo::new(client_io))
        .await
        .unwrap();
    tokio::spawn(conn);
    Fixture {
        client,
        relay,
        origin: origin_task,
        goaway: Some(goaway),
        stop: Some(stop),
        release: Some(release),
        internal_conns,
        dials,
        origin_seen: gates.seen.clone(),
        client_writes,
    }
}

async fn wait_for(done: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + STEP;
    while !done() {
        assert!(
            tokio::time::Instant::now() < deadline,
            "condition not reached in time"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn request(path: &str, tag: &str) -> Request<Body> {
    Request::builder()
        .method("POST")
        .uri(format!("https://api2.cursor.sh{path}"))
        .header("content-type", "application/connect+proto")
        .header("x-cursor-tag", tag)
        .header("x-cursor-client-version", "1.2.3")
        .body(full(format!("body {tag}")))
        .unwrap()
}

impl Fixture {
    async fn send(&mut self, path: &str, tag: &str) -> Response<Incoming> {
        let fut = self.client.send_request(request(path, tag));
        tokio::time::timeout(STEP, fut)
            .await
            .expect("an answer in time")
            .expect("an answer")
    }

    /// A request answered by `from` with every header and the body intact.
    async fn round_trip(&mut self, path: &str, tag: &str, from: &str) {
        let resp = self.send(path, tag).await;
        assert_eq!(resp.status(), StatusCode::OK, "{path} {tag}");
        let h = resp.headers().clone();
        assert_eq!(h["x-from"], from, "{path} {tag}");
        assert_eq!(h["x-path"], path);
        assert_eq!(h["x-echo-x-cursor-tag"], tag);
        assert_eq!(h["x-echo-x-cursor-client-version"], "1.2.3");
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(body, format!("body {tag}"));
    }
}

#[tokio::test(start_paused = true)]
async fn passthrough_and_our_streams_interleave_with_headers_intact() {
    let mut f = start(Origin::Serves, (1 << 20, 1 << 20)).await;
    for round in 0..3 {
        f.round_trip("/echo", &format!("a{round}"), "origin").await;
        f.round_trip("/ours/run", &format!("b{round}"), "internal")
            .await;
        f.round_trip("/echo", &format!("c{round}"), "origin").await;
    }
    assert_eq!(
        f.internal_conns.load(Ordering::SeqCst),
        1,
        "one server, started once"
    );
    // Sixteen at once, mixed.
    let mut tasks = Vec::new();
    for i in 0..16 {
        let mut client = f.client.clone();
        tasks.push(tokio::spawn(async move {
            let path = if i % 4 == 0 { "/ours/x" } else { "/echo" };
            let resp = client
                .send_request(request(path, &format!("d{i}")))
                .await
                .unwrap();
            let from = resp.headers()["x-from"].clone();
            let tag = resp.headers()["x-echo-x-cursor-tag"].clone();
            let body = resp.into_body().collect().await.unwrap().to_bytes();
            assert_eq!(from, if i % 4 == 0 { "internal" } else { "origin" });
            assert_eq!(tag, format!("d{i}").as_str());
            assert_eq!(body, format!("body d{i}"));
        }));
    }
    for task in tasks {
        task.await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn answers_for_streams_the_client_dropped_keep_the_tables_in_step() {
    let mut f = start(Origin::Serves, (1 << 20, 1 << 20)).await;
    f.round_trip("/echo", "warm", "origin").await;
    // The client gives up before the origin's headers arrive; they come anyway.
    for i in 0..3 {
        let fut = f.client.send_request(request("/late", &format!("gone{i}")));
        let _ = tokio::time::timeout(Duration::from_millis(50), fut).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    for i in 0..3 {
        f.round_trip("/echo", &format!("after{i}"), "origin").await;
        f.round_trip("/ours/x", &format!("ours{i}"), "internal")
            .await;
    }
}

#[tokio::test(start_paused = true)]
async fn small_client_windows_hold_data_back_until_read() {
    let mut f = start(Origin::Serves, (65_535, 65_535)).await;
    // The origin answers without reading the request, then resets the stream (NO_ERROR):
    // the whole answer still arrives first.
    let resp = f.send("/big", "big").await;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert_eq!(body.len(), 4 * 1024 * 1024);
    assert!(body.iter().all(|b| *b == 7));
    let upload = vec![3u8; 3 * 1024 * 1024];
    let req = Request::builder()
        .method("POST")
        .uri("https://api2.cursor.sh/echo")
        .body(full(upload.clone()))
        .unwrap();
    let resp = f.client.send_request(req).await.unwrap();
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body[..] == upload[..]);
    // Trailers that must wait behind data the client has no window for yet: from then on
    // header blocks toward the client are re-encoded, and stay intact.
    let resp = f.send("/big-trailers", "t").await;
    let collected = resp.into_body().collect().await.unwrap();
    assert_eq!(collected.trailers().unwrap()["x-trailer"], "done");
    assert_eq!(collected.to_bytes().len(), 200 * 1024);
    for i in 0..3 {
        f.round_trip("/echo", &format!("after{i}"), "origin").await;
    }
}

/// Writes to the client that stop anywhere (inside a frame header, between a header and its
/// payload): the answer arrives whole and in order, and the data granted back to the origin
/// as it leaves keeps an answer larger than its window moving.
#[tokio::test(start_paused = true)]
async fn partial_writes_to_the_client_deliver_bulk_in_order() {
    for cap in [7, 4099, 16_393] {
        let mut f = start_capped(Origin::Serves, (1 << 20, 4 << 20), cap).await;
        let resp = f.send("/pattern", "p").await;
        let body = resp.into_body().collect().await.unwrap().to_bytes();
        assert!(body[..] == pattern()[..], "cap {cap}");
        f.round_trip("/echo", "after", "origin").await;
    }
}

/// While the origin has more ready, the client's writes are whole TLS records (a frame header
/// per frame otherwise leaves a few bytes for a record of their own at every turn); what is
/// left over goes as soon as a pass finds nothing new, so the answer still arrives whole.
#[tokio::test(start_paused = true)]
async fn bulk_leaves_in_whole_records_while_more_is_ready() {
    let mut f = start_piped(Origin::Serves, (16 << 20, 16 << 20), usize::MAX, 8 << 20).await;
    let resp = f.send("/pattern", "p").await;
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    assert!(body[..] == pattern()[..]);
    let writes = f.client_writes.lock().unwrap().clone();
    let total: usize = writes.iter().sum();
    let whole: usize = writes.iter().filter(|n| *n % TLS_RECORD == 0).sum();
    // Without the rule none is whole: a turn of four frames is 65,572 bytes.
    assert!(
        whole * 10 > total * 9,
        "{whole} of {total} bytes in whole records: {writes:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_origin_answers_502_then_our_server_takes_over() {
    let mut f = start(Origin::Refuses, (1 << 20, 1 << 20)).await;
    let resp = f.send("/echo", "first").await;
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    assert_eq!(resp.headers()["content-type"], "application/json");
    let body = resp.into_body().collect().await.unwrap().to_bytes();
    let json: serde_json::Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(json["code"], "unavailable");
    let message = json["message"].as_str().unwrap();
    assert!(
        message.contains("upstream api2.cursor.sh unreachable: connection refused"),
        "{message}"
    );
    // Later streams go to our server, whose own link would redial.
    f.round_trip("/echo", "second", "internal").await;
}

#[tokio::test(start_paused = true)]
async fn an_origin_that_dies_ends_its_streams_with_errors_not_hangs() {
    let mut f = start(Origin::Serves, (1 << 20, 1 << 20)).await;
    f.round_trip("/echo", "warm", "origin").await;
    // One stream answered and streaming, one not answered yet.
    let streaming = f.send("/hold", "held").await;
    let mut body = streaming.into_body();
    let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
    assert_eq!(first, "first");
    let mut client = f.client.clone();
    let pending = tokio::spawn(async move { client.send_request(request("/never", "x")).await });
    wait_for(|| f.origin_seen.load(Ordering::SeqCst) == 3).await;
    f.origin.take().unwrap().abort();
    // The answered stream is reset; the unanswered one gets the hyper path's 502.
    let next = tokio::time::timeout(STEP, body.frame()).await.unwrap();
    assert!(matches!(next, Some(Err(_))), "{next:?}");
    let resp = tokio::time::timeout(STEP, pending)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(resp.status(), StatusCode::BAD_GATEWAY);
    // The connection lives on: new streams go to our server.
    f.round_trip("/echo", "after", "internal").await;
}

#[tokio::test(start_paused = true)]
async fn an_origin_that_closes_while_idle_is_redialled() {
    let mut f = start(Origin::Serves, (1 << 20, 1 << 20)).await;
    f.round_trip("/echo", "before", "origin").await;
    // The origin's idle close: GOAWAY, then the connection ends.
    let _ = f.goaway.take().unwrap().send(());
    tokio::time::timeout(STEP, f.origin.take().unwrap())
        .await
        .unwrap()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    // New streams go to the origin again, over a new connection, headers intact both ways.
    for i in 0..3 {
        f.round_trip("/echo", &format!("after{i}"), "origin").await;
        f.round_trip("/ours/x", &format!("ours{i}"), "internal")
            .await;
    }
    assert_eq!(f.dials.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn graceful_stop_finishes_live_streams_then_closes() {
    let mut f = start(Origin::Serves, (1 << 20, 1 << 20)).await;
    let resp = f.send("/hold", "held").await;
    let mut body = resp.into_body();
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "first"
    );
    let _ = f.stop.take().unwrap().send(());
    tokio::time::sleep(Duration::from_millis(100)).await;
    // No new streams after GOAWAY.
    let refused = tokio::time::timeout(STEP, f.client.send_request(request("/echo", "late")))
        .await
        .unwrap();
    assert!(refused.is_err(), "a stream after GOAWAY is refused");
    assert!(
        !f.relay.is_finished(),
        "the live stream holds the connection open"
    );
    let _ = f.release.take().unwrap().send(());
    assert_eq!(
        body.frame().await.unwrap().unwrap().into_data().unwrap(),
        "last"
    );
    loop {
        match body.frame().await {
            None => break,
            Some(Ok(frame)) => assert_eq!(frame.into_data().unwrap(), "", "only the end"),
            Some(Err(e)) => panic!("the stream ends cleanly: {e}"),
        }
    }
    tokio::time::timeout(STEP, f.relay)
        .await
        .expect("the relay ends once its last stream did")
        .unwrap();
}

#[tokio::test(start_paused = true)]
async fn a_client_that_is_not_http2_gets_goaway() {
    let (mut client, relay_io) = tokio::io::duplex(64 * 1024);
    let setup = Setup {
        authority: "api2.cursor.sh".into(),
        port: 443,
        host: "api2.cursor.sh".into(),
        dial: Box::new(|| Box::pin(std::future::pending())),
        internal: Box::new(|_| Box::pin(async {})),
        passthrough: |_| true,
        stopping: Box::pin(std::future::pending()),
    };
    let relay = tokio::spawn(Relay::new(Box::new(relay_io), setup));
    client
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut got = Vec::new();
    tokio::time::timeout(STEP, client.read_to_end(&mut got))
        .await
        .unwrap()
        .unwrap();
    // SETTINGS, WINDOW_UPDATE, then GOAWAY(PROTOCOL_ERROR).
    let mut at = 0;
    let mut kinds = Vec::new();
    while at + 9 <= got.len() {
        let len = u32::from_be_bytes([0, got[at], got[at + 1], got[at + 2]]) as usize;
        kinds.push((
            got[at + 3],
            got.get(at + 9 + 4..at + 9 + 8).map(<[u8]>::to_vec),
        ));
        at += 9 + len;
    }
    let goaway = kinds.iter().find(|(k, _)| *k == 7).expect("a GOAWAY");
    assert_eq!(
        goaway.1.as_deref(),
        Some(&[0, 0, 0, 1][..]),
        "PROTOCOL_ERROR"
    );
    tokio::time::timeout(STEP, relay).await.unwrap().unwrap();
}
