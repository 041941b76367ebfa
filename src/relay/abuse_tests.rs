//! The relay under hostile peers: raw-frame clients and origins on in-memory
//! pipes, every loop bounded. Each test shows the limit holding, what the relay held at its
//! largest, and a normal request still served afterwards.

use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::conn::{BoxFuture, BoxIo, Relay, Setup};
use super::frame::{self, flag, kind, setting, Frame, FrameReader, Reason};
use super::hpack::{BlockEncoding, Decoder, Headers};
use super::limits::Limits;
use super::state::Held;
use crate::upstream::UpstreamError;

const STEP: Duration = Duration::from_secs(5);
const PIPE: usize = 64 * 1024;

/// The relay, recording the most it held after every poll.
struct Watched {
    relay: Relay,
    peak: Arc<Mutex<Held>>,
}

impl Future for Watched {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        let done = Pin::new(&mut this.relay).poll(cx);
        let now = this.relay.usage();
        let mut peak = this.peak.lock().unwrap();
        *peak = peak.max(now);
        done
    }
}

/// How a raw origin (or our stand-in server) behaves.
#[derive(Clone, Copy, Default)]
struct Behaviour {
    /// Advertises INITIAL_WINDOW_SIZE 0 and never opens a window.
    zero_window: bool,
    /// Advertises HEADER_TABLE_SIZE 0 (every field toward it is a literal).
    no_table: bool,
    /// After answering this many streams: GOAWAY(NO_ERROR) and close, as an idle origin does.
    close_after: Option<usize>,
}

/// What a raw server saw.
#[derive(Default)]
struct Seen {
    streams: AtomicUsize,
    block_bytes: AtomicUsize,
    /// `authorization` fields, and those of them sent "never indexed".
    auth: AtomicUsize,
    auth_never: AtomicUsize,
}

/// A raw HTTP/2 server: answers every request with `:status 200` and `x-from: <tag>` once it
/// ended, acks SETTINGS and PINGs, counts what it saw.
async fn raw_server(mut io: DuplexStream, tag: &'static str, how: Behaviour, seen: Arc<Seen>) {
    let mut out = BytesMut::new();
    let mut settings = vec![];
    if how.zero_window {
        settings.push((setting::INITIAL_WINDOW_SIZE, 0));
    }
    if how.no_table {
        settings.push((setting::HEADER_TABLE_SIZE, 0));
    }
    frame::put_settings(&mut out, &settings);
    if io.write_all(&out).await.is_err() {
        return;
    }
    let mut preface = [0u8; 24];
    if io.read_exact(&mut preface).await.is_err() {
        return;
    }
    let reader = FrameReader::new(frame::DEFAULT_MAX_FRAME);
    let mut decoder = Decoder::new();
    let mut rbuf = BytesMut::new();
    let mut block: Option<(u32, bool, BytesMut)> = None;
    let mut answered = 0;
    loop {
        let frame = match reader.next(&mut rbuf) {
            Ok(Some(f)) => f,
            Ok(None) => match io.read_buf(&mut rbuf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => continue,
            },
            Err(_) => return,
        };
        let mut out = BytesMut::new();
        let mut ended = None;
        match frame.kind {
            kind::SETTINGS if !frame.has(flag::ACK) => frame::put_settings_ack(&mut out),
            kind::PING if !frame.has(flag::ACK) => {
                frame::put_ping(&mut out, true, frame.payload().try_into().unwrap())
            }
            kind::HEADERS | kind::CONTINUATION => {
                let (id, end, mut buf) = block.take().unwrap_or_else(|| {
                    (frame.stream, frame.has(flag::END_STREAM), BytesMut::new())
                });
                let fragment = match frame.kind {
                    kind::HEADERS => frame.header_fragment().unwrap(),
                    _ => frame.payload_bytes(),
                };
                buf.extend_from_slice(&fragment);
                if !frame.has(flag::END_HEADERS) {
                    block = Some((id, end, buf));
                    continue;
                }
                seen.block_bytes.fetch_add(buf.len(), Ordering::SeqCst);
                let headers = decoder.decode(&buf).expect("the relay's blocks decode");
                if headers.get(b":path").is_some() {
                    seen.streams.fetch_add(1, Ordering::SeqCst);
                }
                for (name, _, never) in headers.iter_flagged() {
                    if name == b"authorization" {
                        seen.auth.fetch_add(1, Ordering::SeqCst);
                        seen.auth_never.fetch_add(never as usize, Ordering::SeqCst);
                    }
                }
                if end {
                    ended = Some(id);
                }
            }
            kind::DATA => {
                let len = frame.payload().len() as u32;
                if len > 0 && !how.zero_window {
                    frame::put_window_update(&mut out, 0, len);
                    frame::put_window_update(&mut out, frame.stream, len);
                }
                if frame.has(flag::END_STREAM) {
                    ended = Some(frame.stream);
                }
            }
            _ => {}
        }
        if let Some(id) = ended {
            let mut h = Headers::default();
            h.push(b":status", b"200");
            h.push(b"x-from", tag.as_bytes());
            let block = BlockEncoding::Raw.encode(&h);
            frame::put_headers(&mut out, id, true, &block, frame::DEFAULT_MAX_FRAME);
            answered += 1;
            if how.close_after == Some(answered) {
                frame::put_goaway(&mut out, id, Reason::NO_ERROR, "idle");
                let _ = io.write_all(&out).await;
                return;
            }
        }
        if !out.is_empty() && io.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// One relay with raw origins (one per dial) and a raw stand-in for our server.
struct Harness {
    client: DuplexStream,
    rbuf: BytesMut,
    decoder: Decoder,
    peak: Arc<Mutex<Held>>,
    origin: Arc<Seen>,
    dials: Arc<AtomicUsize>,
    relay: tokio::task::JoinHandle<()>,
}

#[derive(Clone, Copy)]
enum Dial {
    Serves(Behaviour),
    Fails,
}

fn harness(dial: Dial, limits: Limits) -> Harness {
    let origin = Arc::new(Seen::default());
    let dials = Arc::new(AtomicUsize::new(0));
    let (seen, count) = (origin.clone(), dials.clone());
    let dialer = Box::new(move || -> BoxFuture<Result<BoxIo, UpstreamError>> {
        count.fetch_add(1, Ordering::SeqCst);
        let seen = seen.clone();
        Box::pin(async move {
            match dial {
                Dial::Serves(how) => {
                    let (ours, theirs) = tokio::io::duplex(PIPE);
                    tokio::spawn(raw_server(theirs, "origin", how, seen));
                    Ok(Box::new(ours) as BoxIo)
                }
                Dial::Fails => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    Err(UpstreamError::Connect {
                        host: "api2.cursor.sh".into(),
                        reason: "connection refused".into(),
                    })
                }
            }
        })
    });
    let setup = Setup {
        authority: "api2.cursor.sh".into(),
        port: 443,
        host: "api2.cursor.sh".into(),
        dial: dialer,
        internal: Box::new(|io| -> BoxFuture<()> {
            let seen = Arc::new(Seen::default());
            Box::pin(raw_server(io, "internal", Behaviour::default(), seen))
        }),
        passthrough: |path| !path.starts_with("/ours"),
        stopping: Box::pin(std::future::pending()),
    };
    let (client, relay_io) = tokio::io::duplex(PIPE);
    let peak = Arc::new(Mutex::new(Held::default()));
    let relay = Relay::with_limits(Box::new(relay_io), setup, limits);
    let relay = tokio::spawn(Watched {
        relay,
        peak: peak.clone(),
    });
    Harness {
        client,
        rbuf: BytesMut::new(),
        decoder: Decoder::new(),
        peak,
        origin,
        dials,
        relay,
    }
}

fn request(path: &str) -> Headers {
    let mut h = Headers::default();
    h.push(b":method", b"POST");
    h.push(b":scheme", b"https");
    h.push(b":path", path.as_bytes());
    h.push(b":authority", b"api2.cursor.sh");
    h
}

/// A HEADERS frame carrying `block`.
fn headers_frame(out: &mut BytesMut, id: u32, end_stream: bool, block: &[u8]) {
    frame::put_headers(out, id, end_stream, block, frame::DEFAULT_MAX_FRAME);
}

impl Harness {
    /// The preface and an empty SETTINGS.
    async fn hello(&mut self) {
        let mut out = BytesMut::from(frame::PREFACE);
        frame::put_settings(&mut out, &[]);
        self.send(&out).await;
    }

    async fn send(&mut self, bytes: &[u8]) {
        tokio::time::timeout(STEP, self.client.write_all(bytes))
            .await
            .expect("the relay reads")
            .expect("the relay is there");
    }

    /// Writes `bytes` unless the relay stops reading for a while; `false` then.
    async fn try_send(&mut self, bytes: &[u8]) -> bool {
        let write = self.client.write_all(bytes);
        matches!(
            tokio::time::timeout(Duration::from_millis(300), write).await,
            Ok(Ok(()))
        )
    }

    /// The next frame from the relay; `None` at its end.
    async fn frame(&mut self) -> Option<Frame> {
        let reader = FrameReader::new(1 << 24);
        loop {
            if let Some(f) = reader.next(&mut self.rbuf).unwrap() {
                return Some(f);
            }
            let read = tokio::time::timeout(STEP, self.client.read_buf(&mut self.rbuf));
            match read.await.expect("a frame in time") {
                Ok(0) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Reads to the GOAWAY; its code and debug text.
    async fn goaway(&mut self) -> (Reason, String) {
        while let Some(f) = self.frame().await {
            if f.kind == kind::GOAWAY {
                let p = f.payload();
                let code = u32::from_be_bytes([p[4], p[5], p[6], p[7]]);
                return (Reason(code), String::from_utf8_lossy(&p[8..]).into_owned());
            }
        }
        panic!("the connection ended without GOAWAY");
    }

    /// Reads to the answer on `id`: its `x-from`, or the `:status` if it has none.
    async fn answer(&mut self, id: u32) -> String {
        while let Some(f) = self.frame().await {
            if f.kind == kind::HEADERS && f.stream == id {
                let h = self.decoder.decode(&f.header_fragment().unwrap()).unwrap();
                let from = h.get(b"x-from").or(h.get(b":status")).unwrap();
                return String::from_utf8_lossy(from).into_owned();
            }
            assert_ne!(f.kind, kind::GOAWAY, "GOAWAY before the answer");
        }
        panic!("no answer on stream {id}");
    }

    /// Stream 1 answered by the origin: its connection is up.
    async fn warm_up(&mut self) {
        self.hello().await;
        let mut out = BytesMut::new();
        headers_frame(
            &mut out,
            1,
            true,
            &BlockEncoding::Raw.encode(&request("/echo")),
        );
        self.send(&out).await;
        assert_eq!(self.answer(1).await, "origin");
    }

    /// Offers `out` (the relay may stop reading part way) and expects
    /// GOAWAY(ENHANCE_YOUR_CALM) saying `what`.
    async fn expect_calm(&mut self, out: &[u8], what: &str) {
        let _ = self.try_send(out).await;
        let (code, why) = self.goaway().await;
        assert_eq!(code, Reason::ENHANCE_YOUR_CALM, "{why}");
        assert!(why.starts_with("client") && why.contains(what), "{why}");
    }

    fn peak(&self) -> Held {
        *self.peak.lock().unwrap()
    }
}

/// A plain request on a new connection still reaches the origin and is answered.
async fn still_served(dial: Dial) {
    let mut h = harness(dial, Limits::default());
    h.hello().await;
    let mut out = BytesMut::new();
    headers_frame(
        &mut out,
        1,
        true,
        &BlockEncoding::Raw.encode(&request("/echo")),
    );
    h.send(&out).await;
    assert_eq!(h.answer(1).await, "origin");
}

fn serves() -> Dial {
    Dial::Serves(Behaviour::default())
}

#[tokio::test]
async fn rapid_reset_is_capped_then_goaway() {
    let limits = Limits::default();
    let burst = limits.premature_resets.burst as usize;
    let mut h = harness(serves(), limits);
    h.warm_up().await;
    let block = BlockEncoding::Raw.encode(&request("/echo"));
    // 20,000 HEADERS + RST_STREAM pairs (a rapid-reset flood), 100 to a write.
    let mut sent = 0;
    'flood: for batch in 0..200u32 {
        let mut out = BytesMut::new();
        for i in 0..100 {
            let id = 3 + 2 * (batch * 100 + i);
            headers_frame(&mut out, id, false, &block);
            frame::put_rst(&mut out, id, Reason::CANCEL);
        }
        if !h.try_send(&out).await {
            break 'flood;
        }
        sent += 100;
    }
    let (code, why) = h.goaway().await;
    assert_eq!(code, Reason::ENHANCE_YOUR_CALM, "{why}");
    assert!(
        why.contains("client") && why.contains("rapid reset"),
        "{why}"
    );
    tokio::time::timeout(STEP, &mut h.relay)
        .await
        .unwrap()
        .unwrap();
    let reached = h.origin.streams.load(Ordering::SeqCst) - 1;
    assert!(
        reached <= burst + 50,
        "{reached} of {sent} reached the origin"
    );
    let peak = h.peak();
    assert!(peak.out < 256 * 1024, "{peak:?}");
    eprintln!("rapid reset: {sent} pairs written, {reached} reached the origin, peak {peak:?}");
    still_served(serves()).await;
}

#[tokio::test(start_paused = true)]
async fn resets_refill_over_time() {
    let limits = Limits::default();
    let rate = limits.premature_resets;
    let mut h = harness(serves(), limits);
    h.warm_up().await;
    let block = BlockEncoding::Raw.encode(&request("/echo"));
    let mut id = 3;
    // A burst at the limit, a pause that refills it, another burst: no GOAWAY.
    for _ in 0..2 {
        let mut out = BytesMut::new();
        for _ in 0..rate.burst {
            headers_frame(&mut out, id, false, &block);
            frame::put_rst(&mut out, id, Reason::CANCEL);
            id += 2;
        }
        h.send(&out).await;
        tokio::time::sleep(super::limits::refill_time(rate, rate.burst)).await;
    }
    let mut out = BytesMut::new();
    headers_frame(&mut out, id, true, &block);
    h.send(&out).await;
    assert_eq!(h.answer(id).await, "origin");
}

#[tokio::test]
async fn continuation_flood_is_capped() {
    let limits = Limits::default();
    let cap = limits.max_continuations;
    let mut h = harness(serves(), limits);
    h.hello().await;
    let block = BlockEncoding::Raw.encode(&request("/echo"));
    let mut out = BytesMut::new();
    frame::put_head(&mut out, block.len(), kind::HEADERS, 0, 1);
    out.put_slice(&block);
    // 10,000 empty CONTINUATIONs never finish the block (nor grow it).
    for _ in 0..10_000 {
        frame::put_head(&mut out, 0, kind::CONTINUATION, 0, 1);
    }
    h.expect_calm(&out, &format!("over {cap} CONTINUATION"))
        .await;
    assert_eq!(h.origin.streams.load(Ordering::SeqCst), 0);
    still_served(serves()).await;
}

/// Appends one frame.
type Put = fn(&mut BytesMut);

/// Each flood of frames that carry nothing ends in GOAWAY(ENHANCE_YOUR_CALM).
#[tokio::test]
async fn control_frame_floods_end_in_goaway() {
    let burst = Limits::default().control_frames.burst as usize;
    let floods: [(&str, Put); 4] = [
        ("PING", |out| frame::put_ping(out, false, *b"flooding")),
        ("SETTINGS", |out| frame::put_settings(out, &[])),
        ("empty DATA", |out| frame::put_data(out, 3, false, b"")),
        ("PRIORITY", |out| {
            frame::put_head(out, 5, kind::PRIORITY, 0, 5);
            out.put_slice(&[0, 0, 0, 0, 16]);
        }),
    ];
    for (name, put) in floods {
        let mut h = harness(serves(), Limits::default());
        h.warm_up().await;
        let mut out = BytesMut::new();
        headers_frame(
            &mut out,
            3,
            false,
            &BlockEncoding::Raw.encode(&request("/echo")),
        );
        for _ in 0..burst * 5 {
            put(&mut out);
        }
        eprintln!("{name} flood");
        h.expect_calm(&out, "too many").await;
    }
    still_served(serves()).await;
}

#[tokio::test]
async fn zero_window_updates_reset_streams_until_goaway() {
    let limits = Limits::default();
    let cap = limits.max_error_resets;
    let mut h = harness(serves(), limits);
    h.warm_up().await;
    let block = BlockEncoding::Raw.encode(&request("/echo"));
    let mut out = BytesMut::new();
    for i in 0..(cap as u32 + 10) {
        let id = 3 + 2 * i;
        headers_frame(&mut out, id, false, &block);
        frame::put_window_update(&mut out, id, 0);
    }
    h.expect_calm(&out, "reset for its errors").await;
    still_served(serves()).await;
}

/// PINGs whose ACKs the client never reads: once 1 MiB of ACKs waits, the relay stops reading
/// it (the rate limit set aside, to show the bound alone).
#[tokio::test]
async fn acks_for_a_client_that_does_not_read_stay_bounded() {
    let limits = Limits {
        control_frames: super::limits::Rate::new(u32::MAX, 0),
        ..Limits::default()
    };
    let bound = limits.max_pending_out;
    // Held back, the client is still read (unparsed) up to `max_probe`, to see it leave.
    let probed_pings = limits.max_probe / 17;
    let mut h = harness(serves(), limits);
    h.warm_up().await;
    let mut chunk = BytesMut::new();
    for _ in 0..1000 {
        frame::put_ping(&mut chunk, false, *b"unread!!");
    }
    // Up to 5M PINGs; the writes stop long before.
    let mut pings = 0;
    while pings < 5_000_000 && h.try_send(&chunk).await {
        pings += 1000;
    }
    let peak = h.peak();
    assert!(pings < 200_000 + probed_pings, "{pings} PINGs written");
    assert!(peak.out <= bound + 64 * 1024, "{peak:?}");
    eprintln!("unread PINGs: {pings} written before the relay stopped reading, peak {peak:?}");
    still_served(serves()).await;
}

/// One-byte DATA frames behind an origin with a zero window count their overhead: reading
/// stops at the bound, not at the window's bytes.
#[tokio::test]
async fn tiny_data_frames_count_their_overhead() {
    let limits = Limits::default();
    let (bound, overhead) = (limits.max_buffered, limits.frame_overhead);
    // Held back, the client is still read (unparsed) up to `max_probe`, to see it leave.
    let probed_frames = limits.max_probe / 10;
    let stuck = Behaviour {
        zero_window: true,
        ..Behaviour::default()
    };
    let mut h = harness(Dial::Serves(stuck), limits);
    h.hello().await;
    let mut out = BytesMut::new();
    headers_frame(
        &mut out,
        1,
        false,
        &BlockEncoding::Raw.encode(&request("/echo")),
    );
    h.send(&out).await;
    let mut chunk = BytesMut::new();
    for _ in 0..10_000 {
        frame::put_data(&mut chunk, 1, false, b"x");
    }
    // Up to 2M frames (the stream window we grant); the writes stop long before.
    let mut frames = 0;
    while frames < 2_000_000 && h.try_send(&chunk).await {
        frames += 10_000;
    }
    let peak = h.peak();
    let read_slack = (super::conn::READ_CHUNK / 10) * (1 + overhead);
    assert!(peak.buffered <= bound + read_slack, "{peak:?}");
    assert!(
        frames <= bound / overhead + 100_000 + probed_frames,
        "{frames} frames written"
    );
    eprintln!(
        "1-byte DATA: {frames} frames written before the relay stopped reading, peak {peak:?}"
    );
    still_served(serves()).await;
}

/// The client's table holds a 4,000-byte entry; its blocks name it in one byte each.
fn big_entry_blocks(n: u32, first_id: u32) -> (BytesMut, usize) {
    let big = "v".repeat(3_900);
    let mut out = BytesMut::new();
    let mut sent = 0;
    // Stream `first_id` to our server adds it (incremental indexing) and desyncs the origin.
    let mut first = BlockEncoding::Raw.encode(&request("/ours/x"));
    first.push(0x40);
    first.push(5);
    first.extend_from_slice(b"x-big");
    first.push(0x7f);
    let mut len = Vec::new();
    let mut rest = big.len() - 127;
    while rest >= 0x80 {
        len.push((rest as u8 & 0x7f) | 0x80);
        rest >>= 7;
    }
    len.push(rest as u8);
    first.extend_from_slice(&len);
    first.extend_from_slice(big.as_bytes());
    headers_frame(&mut out, first_id, true, &first);
    for i in 1..=n {
        let mut block = BlockEncoding::Raw.encode(&request("/echo"));
        block.push(0x80 | 62);
        sent += block.len();
        headers_frame(&mut out, first_id + 2 * i, true, &block);
    }
    (out, sent)
}

#[tokio::test]
async fn reencoded_blocks_do_not_amplify() {
    let mut h = harness(serves(), Limits::default());
    h.hello().await;
    let (out, sent) = big_entry_blocks(150, 1);
    h.send(&out).await;
    assert_eq!(h.answer(301).await, "origin");
    let received = h.origin.block_bytes.load(Ordering::SeqCst);
    // Our encoder indexes the entry once, as the client's did.
    assert!(received <= 4 * sent + 8 * 1024, "{sent} in, {received} out");
    eprintln!(
        "amplification, indexing origin: {sent} B of client blocks, {received} B to the origin"
    );
}

#[tokio::test]
async fn reencoding_past_the_budget_ends_the_connection() {
    let no_table = Behaviour {
        no_table: true,
        ..Behaviour::default()
    };
    let mut h = harness(Dial::Serves(no_table), Limits::default());
    h.hello().await;
    // Let the origin's SETTINGS (no table) arrive first.
    let mut out = BytesMut::new();
    headers_frame(
        &mut out,
        1,
        true,
        &BlockEncoding::Raw.encode(&request("/echo")),
    );
    h.send(&out).await;
    assert_eq!(h.answer(1).await, "origin");
    // 99 KB of such blocks; each would be a 3,900-byte literal.
    let (out, sent) = big_entry_blocks(10_000, 3);
    h.expect_calm(&out, "header amplification").await;
    let received = h.origin.block_bytes.load(Ordering::SeqCst);
    assert!(
        received <= 4 * sent + 128 * 1024,
        "{sent} in, {received} out"
    );
    eprintln!("amplification, table-less origin: {received} B reached the origin before GOAWAY");
    still_served(serves()).await;
}

async fn protocol_error(frames: impl FnOnce(&mut BytesMut), preface: bool) -> (Reason, String) {
    let mut h = harness(serves(), Limits::default());
    let mut out = BytesMut::from(frame::PREFACE);
    if preface {
        frame::put_settings(&mut out, &[]);
    }
    frames(&mut out);
    h.send(&out).await;
    h.goaway().await
}

#[tokio::test]
async fn protocol_errors_get_their_codes() {
    let (code, why) = protocol_error(|o| frame::put_ping(o, false, *b"12345678"), false).await;
    assert_eq!(code, Reason::PROTOCOL_ERROR, "{why}");
    assert!(why.contains("first frame is not SETTINGS"), "{why}");

    let ack_with_payload = |o: &mut BytesMut| {
        frame::put_head(o, 6, kind::SETTINGS, flag::ACK, 0);
        o.put_slice(&[0, 4, 0, 0, 0, 1]);
    };
    let (code, why) = protocol_error(ack_with_payload, true).await;
    assert_eq!(code, Reason::FRAME_SIZE_ERROR, "{why}");

    let (code, why) = protocol_error(|o| frame::put_window_update(o, 5, 1), true).await;
    assert_eq!(code, Reason::PROTOCOL_ERROR, "{why}");
    assert!(why.contains("WINDOW_UPDATE on idle stream 5"), "{why}");

    let (code, why) = protocol_error(|o| frame::put_rst(o, 7, Reason::CANCEL), true).await;
    assert_eq!(code, Reason::PROTOCOL_ERROR, "{why}");
    assert!(why.contains("RST_STREAM on idle stream 7"), "{why}");

    let overflow = |o: &mut BytesMut| {
        let block = BlockEncoding::Raw.encode(&request("/echo"));
        headers_frame(o, 1, false, &block);
        // The stream's window toward the client at 2^31-1, then one more by SETTINGS.
        frame::put_window_update(o, 1, (frame::MAX_WINDOW - 65_535) as u32);
        frame::put_settings(o, &[(setting::INITIAL_WINDOW_SIZE, 65_536)]);
    };
    let (code, why) = protocol_error(overflow, true).await;
    assert_eq!(code, Reason::FLOW_CONTROL_ERROR, "{why}");
    still_served(serves()).await;
}

#[tokio::test]
async fn never_indexed_fields_stay_never_indexed() {
    let mut h = harness(serves(), Limits::default());
    h.hello().await;
    let mut out = BytesMut::new();
    // A stream to our server first: from then on blocks toward the origin are re-encoded.
    headers_frame(
        &mut out,
        1,
        true,
        &BlockEncoding::Raw.encode(&request("/ours/x")),
    );
    h.send(&out).await;
    assert_eq!(h.answer(1).await, "internal");
    for id in [3, 5] {
        let mut req = request("/echo");
        req.push_never(b"authorization", b"Bearer secret-token");
        let mut out = BytesMut::new();
        headers_frame(&mut out, id, true, &BlockEncoding::Raw.encode(&req));
        h.send(&out).await;
        assert_eq!(h.answer(id).await, "origin");
    }
    assert_eq!(h.origin.auth.load(Ordering::SeqCst), 2);
    // Both times a never-indexed literal: never in a table of ours, never an index.
    assert_eq!(h.origin.auth_never.load(Ordering::SeqCst), 2);
}

#[tokio::test(start_paused = true)]
async fn our_error_answer_resets_the_upload() {
    let mut h = harness(Dial::Fails, Limits::default());
    h.hello().await;
    let mut out = BytesMut::new();
    headers_frame(
        &mut out,
        1,
        false,
        &BlockEncoding::Raw.encode(&request("/echo")),
    );
    frame::put_data(&mut out, 1, false, &[1; 1000]);
    h.send(&out).await;
    assert_eq!(h.answer(1).await, "502");
    let mut ended = false;
    loop {
        let f = h.frame().await.expect("frames");
        if f.stream != 1 {
            continue;
        }
        if f.kind == kind::DATA && f.has(flag::END_STREAM) {
            ended = true;
        }
        if f.kind == kind::RST_STREAM {
            assert!(ended, "the reset comes after the whole answer");
            assert_eq!(f.payload(), &Reason::NO_ERROR.0.to_be_bytes());
            break;
        }
    }
}

#[tokio::test(start_paused = true)]
async fn an_origin_that_closed_while_idle_is_redialled() {
    let idles_out = Behaviour {
        close_after: Some(1),
        ..Behaviour::default()
    };
    let mut h = harness(Dial::Serves(idles_out), Limits::default());
    h.hello().await;
    for (i, id) in [1u32, 3, 5].into_iter().enumerate() {
        let mut out = BytesMut::new();
        headers_frame(
            &mut out,
            id,
            true,
            &BlockEncoding::Raw.encode(&request("/echo")),
        );
        h.send(&out).await;
        assert_eq!(h.answer(id).await, "origin", "stream {id}");
        // Each origin connection answers one stream, then closes (GOAWAY, EOF).
        let deadline = tokio::time::Instant::now() + STEP;
        while h.dials.load(Ordering::SeqCst) < i + 1 {
            assert!(tokio::time::Instant::now() < deadline);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(h.dials.load(Ordering::SeqCst), 3);
    assert_eq!(h.origin.streams.load(Ordering::SeqCst), 3);
}

#[test]
fn the_fuzz_entry_runs() {
    // A few sequences: the fuzz target's checks (no panic, limits held) on every one.
    let mut seq = vec![0u8];
    seq.extend_from_slice(frame::PREFACE);
    super::fuzz_relay(&seq);
    super::fuzz_relay(&[]);
    super::fuzz_relay(&[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12]);
}

/// The origin is dialled for the first passthrough stream, not for the connection: a client
/// that opens none (or only streams of ours) costs the origin nothing.
#[tokio::test]
async fn the_origin_is_dialled_only_when_a_stream_needs_it() {
    let mut h = harness(serves(), Limits::default());
    h.hello().await;
    let mut out = BytesMut::new();
    headers_frame(
        &mut out,
        1,
        true,
        &BlockEncoding::Raw.encode(&request("/ours")),
    );
    h.send(&out).await;
    assert_eq!(h.answer(1).await, "internal");
    assert_eq!(
        h.dials.load(Ordering::SeqCst),
        0,
        "dialled for no passthrough"
    );
    let mut out = BytesMut::new();
    headers_frame(
        &mut out,
        3,
        true,
        &BlockEncoding::Raw.encode(&request("/echo")),
    );
    h.send(&out).await;
    assert_eq!(h.answer(3).await, "origin");
    assert_eq!(h.dials.load(Ordering::SeqCst), 1);
}

/// Behind an origin with a zero window the relay stops parsing the client at its bound, yet
/// still sees it leave: the relay ends and drops what it held.
#[tokio::test]
async fn a_client_held_back_by_the_origins_window_is_seen_leaving() {
    let limits = Limits::default();
    let (bound, overhead) = (limits.max_buffered, limits.frame_overhead);
    let stuck = Behaviour {
        zero_window: true,
        ..Behaviour::default()
    };
    let mut h = harness(Dial::Serves(stuck), limits);
    h.hello().await;
    let mut out = BytesMut::new();
    headers_frame(
        &mut out,
        1,
        false,
        &BlockEncoding::Raw.encode(&request("/echo")),
    );
    h.send(&out).await;
    let mut chunk = BytesMut::new();
    for _ in 0..10_000 {
        frame::put_data(&mut chunk, 1, false, b"x");
    }
    // Past the held-DATA bound (within the stream window we grant): the relay holds back.
    let frames = bound / (1 + overhead) + 50_000;
    let mut sent = 0;
    while sent < frames && h.try_send(&chunk).await {
        sent += 10_000;
    }
    assert!(
        sent >= frames,
        "the relay stopped reading after {sent} frames"
    );
    let peak = h.peak();
    assert!(peak.buffered >= bound, "not held back: {peak:?}");
    drop(h.client);
    tokio::time::timeout(STEP, h.relay)
        .await
        .expect("the relay ends when its held-back client leaves")
        .expect("no panic");
}
