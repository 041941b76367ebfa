//! The agent WebSocket (`GET /agent/v1/run`, upgraded) through the real proxy, with a real
//! WebSocket client on a real socket: a run on our model is served by our agent (text from the
//! fake provider, blobs stored through the client, `RunEnd` without error) and nothing of it
//! reaches Cursor; Cursor's run on the same socket goes to a fake of Cursor's WebSocket server
//! byte for byte and its answers come back unchanged; the upstream's failures end Cursor's
//! runs only.

mod common;
#[path = "common/fake_agent_ws.rs"]
mod fake_agent_ws;
#[path = "common/harness.rs"]
mod harness;

use std::collections::HashMap;

use bytes::Bytes;
use common::agent_client::{run_request, text_of, Door, Store, API, STEP};
use common::fake_provider::Reply;
use fake_agent_ws::{FakeAgentWs, Script, CURSOR_ANSWER, GHOST_RUN, GHOST_TEXT};
use futures_util::{SinkExt, StreamExt};
use harness::{Harness, CURSORS, OURS, TEXT_SSE};
use prost::encoding::{encode_key, encode_varint, string, uint64, WireType};
use prost::Message as _;
use tokio::net::TcpStream;
use tokio_tungstenite::tungstenite::Message;
use tokio_tungstenite::WebSocketStream;

use cursor_byok::proto::agent::v1 as pb;

type Ws = WebSocketStream<TcpStream>;

fn len_field(number: u32, value: &[u8], out: &mut Vec<u8>) {
    encode_key(number, WireType::LengthDelimited, out);
    encode_varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

fn frame(number: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    len_field(number, body, &mut out);
    out
}

fn hello() -> Vec<u8> {
    frame(1, b"\x08\x01")
}

fn run_start(run_id: &str) -> Vec<u8> {
    let mut identity = Vec::new();
    string::encode(1, &run_id.to_owned(), &mut identity);
    string::encode(2, &format!("req-{run_id}"), &mut identity);
    let mut body = Vec::new();
    len_field(1, &identity, &mut body);
    frame(2, &body)
}

fn client_message(run_id: &str, sequence: u64, message: &pb::AgentClientMessage) -> Vec<u8> {
    let mut body = Vec::new();
    string::encode(1, &run_id.to_owned(), &mut body);
    uint64::encode(2, &sequence, &mut body);
    len_field(3, &message.encode_to_vec(), &mut body);
    frame(3, &body)
}

/// A server frame: its type and body.
fn server_frame(bytes: &[u8]) -> (u32, Vec<u8>) {
    let mut buf = bytes;
    let (number, _) = prost::encoding::decode_key(&mut buf).expect("a frame key");
    let len = prost::encoding::decode_varint(&mut buf).expect("a length") as usize;
    (number, buf[..len].to_vec())
}

/// Field `number` (length-delimited, last) of `buf`.
fn field(buf: &[u8], number: u32) -> Option<Vec<u8>> {
    let mut buf = buf;
    let mut found = None;
    while !buf.is_empty() {
        let (n, wire) = prost::encoding::decode_key(&mut buf).expect("key");
        if wire == WireType::LengthDelimited {
            let len = prost::encoding::decode_varint(&mut buf).expect("len") as usize;
            if n == number {
                found = Some(buf[..len].to_vec());
            }
            buf = &buf[len..];
        } else {
            prost::encoding::skip_field(wire, n, &mut buf, Default::default()).expect("skip");
        }
    }
    found
}

async fn connect(h: &Harness) -> Ws {
    connect_with(h, &[]).await
}

/// The upgrade with extra request headers, as Cursor's client would send them.
async fn connect_with(h: &Harness, headers: &[(&'static str, &'static str)]) -> Ws {
    use tokio_tungstenite::tungstenite::client::IntoClientRequest;
    let Door::DirectHttp { addr } = h.http_door() else {
        unreachable!("http_door is the plain door")
    };
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let mut req = format!("ws://{addr}/agent/v1/run")
        .into_client_request()
        .expect("a request");
    for (name, value) in headers {
        req.headers_mut().insert(
            http::HeaderName::from_static(name),
            http::HeaderValue::from_static(value),
        );
    }
    let (ws, resp) = tokio_tungstenite::client_async(req, tcp)
        .await
        .expect("the upgrade is accepted");
    assert_eq!(resp.status(), http::StatusCode::SWITCHING_PROTOCOLS);
    ws
}

async fn send(ws: &mut Ws, bytes: Vec<u8>) {
    ws.send(Message::Binary(Bytes::from(bytes)))
        .await
        .expect("sent");
}

async fn next(ws: &mut Ws) -> (u32, Vec<u8>) {
    server_frame(&next_raw(ws).await)
}

/// The next binary frame, as it came.
async fn next_raw(ws: &mut Ws) -> Vec<u8> {
    loop {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("a frame within the step timeout")
            .expect("the socket is open")
            .expect("a frame");
        if let Message::Binary(b) = msg {
            return b.to_vec();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_run_on_our_model_is_served_over_the_websocket() {
    let h = harness::harness(vec![Reply::sse(TEXT_SSE)], |_| {}).await;
    let mut ws = connect(&h).await;
    send(&mut ws, hello()).await;
    assert_eq!(
        next(&mut ws).await,
        (1, b"\x08\x01".to_vec()),
        "server Hello"
    );
    send(&mut ws, run_start("r1")).await;
    let first = run_request(OURS, "conv-ws", "Say hello", true);
    send(&mut ws, client_message("r1", 0, &first)).await;
    let (kind, accepted) = next(&mut ws).await;
    assert_eq!(kind, 2, "RunAccepted");
    let identity = field(&accepted, 1).expect("identity");
    assert_eq!(field(&identity, 1).as_deref(), Some(&b"r1"[..]));

    let store = Store::default();
    let mut messages = Vec::new();
    let mut sequence = 1;
    let end = loop {
        let (kind, body) = next(&mut ws).await;
        match kind {
            3 => {
                let m = pb::AgentServerMessage::decode(&field(&body, 3).expect("message")[..])
                    .expect("an AgentServerMessage");
                if let Some(pb::agent_server_message::Message::KvServerMessage(kv)) = &m.message {
                    if let Some(answer) = store.answer(kv) {
                        send(&mut ws, client_message("r1", sequence, &answer)).await;
                        sequence += 1;
                    }
                }
                messages.push(m);
            }
            4 => break body,
            other => panic!("unexpected frame type {other}"),
        }
    };
    assert!(field(&end, 3).is_none(), "RunEnd without an error");
    assert_eq!(text_of(&messages), "Hello, world");
    assert!(messages.iter().any(|m| matches!(
        &m.message,
        Some(pb::agent_server_message::Message::InteractionUpdate(u))
            if matches!(u.message, Some(pb::interaction_update::Message::TurnEnded(_)))
    )));
    h.assert_nothing_relayed();
    for r in h.upstream.recorded() {
        let body = String::from_utf8_lossy(&r.body);
        assert!(!body.contains("Say hello"), "{} carried the prompt", r.path);
    }
}

fn run_frame(number: u32, run_id: &str) -> Vec<u8> {
    let mut body = Vec::new();
    string::encode(1, &run_id.to_owned(), &mut body);
    frame(number, &body)
}

/// The run a server frame is for (empty for `Hello`).
fn run_of(kind: u32, body: &[u8]) -> String {
    let id = match kind {
        1 => return String::new(),
        3 => field(body, 1),
        _ => field(body, 1).and_then(|identity| field(&identity, 1)),
    };
    String::from_utf8(id.unwrap_or_default()).expect("a UTF-8 run id")
}

/// `(code, raw_message)` of a `RunEnd` (field 3) or `RunRejected` (field 2) body.
fn error_of(kind: u32, body: &[u8]) -> Option<(u64, String)> {
    let error = field(body, if kind == 4 { 3 } else { 2 })?;
    let mut buf = &error[..];
    let (n, _) = prost::encoding::decode_key(&mut buf).expect("a key");
    assert_eq!(n, 1, "the code first");
    let code = prost::encoding::decode_varint(&mut buf).expect("a code");
    let text = String::from_utf8(field(&error, 2).unwrap_or_default()).expect("UTF-8");
    Some((code, text))
}

/// What the client got, per run: every frame as it came.
#[derive(Default)]
struct Runs {
    frames: HashMap<String, Vec<Vec<u8>>>,
}

impl Runs {
    fn of(&self, run_id: &str) -> &[Vec<u8>] {
        self.frames.get(run_id).map_or(&[], |v| v.as_slice())
    }

    fn messages(&self, run_id: &str) -> Vec<pb::AgentServerMessage> {
        self.of(run_id)
            .iter()
            .map(|raw| server_frame(raw))
            .filter(|(kind, _)| *kind == 3)
            .map(|(_, body)| {
                pb::AgentServerMessage::decode(&field(&body, 3).expect("a message")[..])
                    .expect("an AgentServerMessage")
            })
            .collect()
    }

    /// The run's last frame, which must be its end: `(kind, body)`.
    fn end(&self, run_id: &str) -> (u32, Vec<u8>) {
        let (kind, body) = server_frame(self.of(run_id).last().expect("frames"));
        assert!(
            kind == 4 || kind == 5,
            "{run_id} ended with frame type {kind}"
        );
        (kind, body)
    }
}

/// Read frames until `ends` runs have ended (`RunEnd` / `RunRejected`), storing blobs for any
/// run that asks and sending what `react` returns for each frame.
async fn play(ws: &mut Ws, ends: usize, mut react: impl FnMut(&str, u32) -> Vec<Vec<u8>>) -> Runs {
    let store = Store::default();
    let mut sequences: HashMap<String, u64> = HashMap::new();
    let mut runs = Runs::default();
    let mut ended = 0;
    while ended < ends {
        let raw = next_raw(ws).await;
        let (kind, body) = server_frame(&raw);
        assert_ne!(kind, 1, "one Hello only, the proxy's");
        let run = run_of(kind, &body);
        if kind == 3 {
            let m = pb::AgentServerMessage::decode(&field(&body, 3).expect("a message")[..]);
            if let Ok(pb::AgentServerMessage {
                message: Some(pb::agent_server_message::Message::KvServerMessage(kv)),
                ..
            }) = &m
            {
                if let Some(answer) = store.answer(kv) {
                    let sequence = sequences.entry(run.clone()).or_insert(1);
                    send(ws, client_message(&run, *sequence, &answer)).await;
                    *sequence += 1;
                }
            }
        }
        for reply in react(&run, kind) {
            send(ws, reply).await;
        }
        ended += usize::from(kind == 4 || kind == 5);
        runs.frames.entry(run).or_default().push(raw);
    }
    runs
}

const CANARY: &str = "CANARY-ws-5c1d9e";

/// The proxy with Cursor's WebSocket server played by a fake answering by `script`.
async fn with_cursor(script: Script, replies: Vec<Reply>) -> (Harness, FakeAgentWs) {
    let fake = FakeAgentWs::start(API, script).await;
    let (addr, roots) = (fake.addr, fake.ca_pem_path.clone());
    let h = harness::harness(replies, move |c| {
        c.upstream.resolve.insert(API.into(), addr);
        c.upstream.extra_roots = Some(roots);
    })
    .await;
    (h, fake)
}

/// Hello, then both runs' `RunStart`s and first messages, interleaved; returns the frames of
/// Cursor's run as the client sent them (Hello first).
async fn open_two_runs(ws: &mut Ws) -> Vec<Vec<u8>> {
    send(ws, hello()).await;
    assert_eq!(next(ws).await, (1, b"\x08\x01".to_vec()), "our Hello");
    let cursor_start = run_start("cursor-1");
    let cursor_first = client_message(
        "cursor-1",
        0,
        &run_request(CURSORS, "conv-ws-cursor", "a question for Cursor", true),
    );
    send(ws, cursor_start.clone()).await;
    send(ws, run_start(GHOST_RUN)).await;
    send(ws, cursor_first.clone()).await;
    let ours = run_request(OURS, "conv-ws-ours", &format!("{CANARY} Say hello"), true);
    send(ws, client_message(GHOST_RUN, 0, &ours)).await;
    vec![hello(), cursor_start, cursor_first]
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_run_passes_through_unchanged_beside_ours() {
    let (h, fake) = with_cursor(Script::Serve, vec![Reply::sse(TEXT_SSE)]).await;
    let mut ws = connect_with(
        &h,
        &[
            ("authorization", "Bearer cursor-session-token"),
            ("x-cursor-client-version", "3.24.0"),
            ("sec-websocket-extensions", "permessage-deflate"),
        ],
    )
    .await;
    let mut sent_up = open_two_runs(&mut ws).await;
    // Cursor's run half-closes once its answer is in.
    let runs = play(&mut ws, 2, |run, kind| {
        if run == "cursor-1" && kind == 3 {
            vec![run_frame(4, "cursor-1")]
        } else {
            Vec::new()
        }
    })
    .await;
    sent_up.push(run_frame(4, "cursor-1"));

    // Cursor's server got Cursor's run byte for byte, and nothing else.
    let record = fake.record();
    assert_eq!(record.got, sent_up, "exactly Cursor's frames, unchanged");
    for frame in &record.got {
        assert!(!contains(frame, CANARY.as_bytes()), "our prompt went up");
        assert!(!contains(frame, GHOST_RUN.as_bytes()), "our run id went up");
    }
    // Its answers came back unchanged; the stray frame about our run and its Hello did not.
    let from_cursor: Vec<Vec<u8>> = record
        .sent
        .iter()
        .filter(|f| {
            let (kind, body) = server_frame(f);
            run_of(kind, &body) == "cursor-1"
        })
        .cloned()
        .collect();
    assert_eq!(from_cursor.len(), 3, "RunAccepted, ServerMessage, RunEnd");
    assert_eq!(runs.of("cursor-1"), &from_cursor[..]);
    assert!(contains(&runs.of("cursor-1")[1], CURSOR_ANSWER));
    assert!(error_of(4, &runs.end("cursor-1").1).is_none());

    // Ours was served here, untouched by Cursor's server.
    let (kind, end) = runs.end(GHOST_RUN);
    assert_eq!(kind, 4);
    assert!(error_of(4, &end).is_none(), "{:?}", error_of(4, &end));
    assert_eq!(text_of(&runs.messages(GHOST_RUN)), "Hello, world");
    for raw in runs.of(GHOST_RUN) {
        assert!(
            !contains(raw, GHOST_TEXT.as_bytes()),
            "Cursor's frame reached our run"
        );
    }
    h.assert_nothing_relayed();

    // The upgrade carried the client's headers, minus what belongs to one connection.
    assert_eq!(record.upgrades.len(), 1, "one upstream socket");
    let up = &record.upgrades[0];
    assert_eq!(up["authorization"], "Bearer cursor-session-token");
    assert_eq!(up["x-cursor-client-version"], "3.24.0");
    assert_eq!(up["host"], API);
    assert!(up.get("sec-websocket-extensions").is_none());
    assert_eq!(record.paths, ["/agent/v1/run"]);
    // Cursor's server's ping got its pong.
    let record = fake.wait(STEP, |r| r.pongs > 0).await;
    assert!(record.pongs > 0, "the upstream's ping was answered");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_server_dropping_ends_only_cursors_run() {
    let (h, fake) = with_cursor(Script::DropAfterAnswer, vec![Reply::sse(TEXT_SSE)]).await;
    let mut ws = connect(&h).await;
    open_two_runs(&mut ws).await;
    let runs = play(&mut ws, 2, |_, _| Vec::new()).await;

    let (kind, end) = runs.end("cursor-1");
    assert_eq!(kind, 4, "accepted, so it ends with RunEnd");
    let (code, text) = error_of(4, &end).expect("an error");
    assert_eq!(code, 14, "unavailable");
    assert!(text.contains("Cursor's server (upstream)"), "{text}");
    assert!(contains(&runs.of("cursor-1")[1], CURSOR_ANSWER));

    let (kind, end) = runs.end(GHOST_RUN);
    assert_eq!(kind, 4);
    assert!(error_of(4, &end).is_none(), "our run went on");
    assert_eq!(text_of(&runs.messages(GHOST_RUN)), "Hello, world");

    // The next run of Cursor's on the same socket opens a new upstream socket.
    send(&mut ws, run_start("cursor-2")).await;
    let first = run_request(CURSORS, "conv-ws-cursor-2", "again", true);
    send(&mut ws, client_message("cursor-2", 0, &first)).await;
    let runs = play(&mut ws, 1, |_, _| Vec::new()).await;
    assert!(contains(&runs.of("cursor-2")[1], CURSOR_ANSWER));
    assert_eq!(fake.record().upgrades.len(), 2);
    for frame in fake.record().got {
        assert!(!contains(&frame, CANARY.as_bytes()), "our prompt went up");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_upgrade_rejects_cursors_run() {
    let (h, fake) = with_cursor(Script::Refuse(403), vec![Reply::sse(TEXT_SSE)]).await;
    let mut ws = connect(&h).await;
    open_two_runs(&mut ws).await;
    let runs = play(&mut ws, 2, |_, _| Vec::new()).await;
    let (kind, body) = runs.end("cursor-1");
    assert_eq!(kind, 5, "RunRejected");
    let (code, text) = error_of(5, &body).expect("an error");
    assert_eq!(code, 7, "permission_denied, from HTTP 403");
    assert!(
        text.contains("Cursor's server") && text.contains("403"),
        "{text}"
    );
    let (_, end) = runs.end(GHOST_RUN);
    assert!(error_of(4, &end).is_none(), "our run went on");
    let record = fake.record();
    assert_eq!(record.upgrades.len(), 1);
    assert!(record.got.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_run_of_cursors_run_goes_to_cursors_server() {
    let (h, fake) = with_cursor(Script::Serve, vec![]).await;
    let mut ws = connect(&h).await;
    send(&mut ws, hello()).await;
    let _ = next(&mut ws).await;
    send(&mut ws, run_start("cursor-1")).await;
    let first = run_request(CURSORS, "conv-ws-cancel", "hi", true);
    send(&mut ws, client_message("cursor-1", 0, &first)).await;
    let cancel = run_frame(5, "cursor-1");
    let sent = cancel.clone();
    let runs = play(&mut ws, 1, move |_, kind| {
        if kind == 3 {
            vec![sent.clone()]
        } else {
            Vec::new()
        }
    })
    .await;
    let (kind, end) = runs.end("cursor-1");
    assert_eq!(kind, 4);
    assert_eq!(error_of(4, &end).expect("an error").0, 1, "canceled");
    assert_eq!(fake.record().got.last(), Some(&cancel));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_cannot_be_read_is_refused_never_relayed() {
    let h = harness::harness(vec![], |_| {}).await;
    let mut ws = connect(&h).await;
    send(&mut ws, hello()).await;
    let _ = next(&mut ws).await;
    send(&mut ws, run_start("r2")).await;
    // A first message that is not an AgentClientMessage.
    let mut body = Vec::new();
    string::encode(1, &"r2".to_owned(), &mut body);
    uint64::encode(2, &0, &mut body);
    len_field(3, b"\xff\xff\xff", &mut body);
    send(&mut ws, frame(3, &body)).await;
    let (kind, body) = next(&mut ws).await;
    assert_eq!(kind, 5, "RunRejected");
    let (code, text) = error_of(5, &body).expect("an error");
    assert_eq!(code, 3, "invalid_argument");
    assert!(text.contains("not sent to Cursor"), "{text}");
    // HalfClose and CancelRun for a run this socket does not know go nowhere.
    send(&mut ws, run_frame(4, "nobody")).await;
    send(&mut ws, run_frame(5, "nobody")).await;
    // An unreadable frame closes the socket.
    send(&mut ws, b"\xff\xff".to_vec()).await;
    let closed = tokio::time::timeout(STEP, async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(Message::Binary(b))) => panic!("unexpected frame {b:?}"),
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the socket closes");
    assert!(h.upstream.recorded().is_empty(), "nothing reached Cursor");
}

/// A `ClientMessage` frame carrying `message` as it is, decoded or not.
fn client_message_raw(run_id: &str, sequence: u64, message: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    string::encode(1, &run_id.to_owned(), &mut body);
    uint64::encode(2, &sequence, &mut body);
    len_field(3, message, &mut body);
    frame(3, &body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_server_that_stops_reading_ends_cursors_run_at_the_queue_bound() {
    let (h, fake) = with_cursor(Script::Stall, vec![]).await;
    let ws = connect(&h).await;
    let (mut tx, mut rx) = ws.split();
    let binary = |b: Vec<u8>| Message::Binary(Bytes::from(b));
    tx.send(binary(hello())).await.expect("sent");
    let first = run_request(CURSORS, "conv-ws-stall", "hi", true);
    tx.send(binary(run_start("cursor-1"))).await.expect("sent");
    tx.send(binary(client_message("cursor-1", 0, &first)))
        .await
        .expect("sent");
    // The upstream socket is open, and then stops reading.
    let record = fake.wait(STEP, |r| r.got.len() == 3).await;
    assert_eq!(record.got.len(), 3, "Hello, RunStart, the first message");
    // Far more than the queue and the sockets' buffers hold, unless the run ends first.
    let writer = tokio::spawn(async move {
        let payload = vec![b'x'; 256 << 10];
        for sequence in 1..2000 {
            let frame = client_message_raw("cursor-1", sequence, &payload);
            if tx.send(Message::Binary(Bytes::from(frame))).await.is_err() {
                return;
            }
        }
    });
    let end = tokio::time::timeout(STEP * 4, async {
        loop {
            let Some(Ok(Message::Binary(raw))) = rx.next().await else {
                panic!("the socket closed");
            };
            let (kind, body) = server_frame(&raw);
            if kind == 4 || kind == 5 {
                assert_eq!(run_of(kind, &body), "cursor-1");
                return (kind, body);
            }
        }
    })
    .await
    .expect("Cursor's run ends");
    writer.abort();
    let (kind, body) = end;
    assert_eq!(kind, 5, "never accepted, so RunRejected");
    let (code, text) = error_of(kind, &body).expect("an error");
    assert_eq!(code, 14, "unavailable");
    assert!(text.contains("not reading"), "{text}");
    assert_eq!(fake.record().upgrades.len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_runs_count_toward_the_cap_on_runs_per_socket() {
    let (h, fake) = with_cursor(Script::Serve, vec![]).await;
    let mut ws = connect(&h).await;
    send(&mut ws, hello()).await;
    let _ = next(&mut ws).await;
    // Sixteen runs of Cursor's, each accepted and left open.
    for i in 0..16 {
        let run = format!("cursor-{i}");
        send(&mut ws, run_start(&run)).await;
        let first = run_request(CURSORS, &format!("conv-ws-cap-{i}"), "hi", true);
        send(&mut ws, client_message(&run, 0, &first)).await;
        let (kind, body) = next(&mut ws).await;
        assert_eq!((kind, run_of(kind, &body)), (2, run.clone()), "RunAccepted");
        let (kind, _) = next(&mut ws).await;
        assert_eq!(kind, 3, "Cursor's answer");
    }
    send(&mut ws, run_start("one-too-many")).await;
    let (kind, body) = next(&mut ws).await;
    assert_eq!((kind, run_of(kind, &body)), (5, "one-too-many".to_string()));
    assert_eq!(
        error_of(5, &body).expect("an error").0,
        8,
        "resource_exhausted"
    );
    let got = fake.record().got;
    assert!(got.iter().all(|f| !contains(f, b"one-too-many")));
    assert_eq!(
        got.len(),
        1 + 2 * 16,
        "Hello, then each run's RunStart and message"
    );
}
