//! The agent WebSocket (`GET /agent/v1/run`, upgraded) through the real proxy, with a real
//! WebSocket client on a real socket: a run on our model is served by our agent (text from the
//! fake provider, blobs stored through the client, `RunEnd` without error); Cursor's run is
//! rejected with `RunRejected`; nothing reaches the fake Cursor upstream.

mod common;
#[path = "common/harness.rs"]
mod harness;

use bytes::Bytes;
use common::agent_client::{run_request, text_of, Door, Store, STEP};
use common::fake_provider::Reply;
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
    let Door::DirectHttp { addr } = h.http_door() else {
        unreachable!("http_door is the plain door")
    };
    let tcp = TcpStream::connect(addr).await.expect("connect");
    let url = format!("ws://{addr}/agent/v1/run");
    let (ws, resp) = tokio_tungstenite::client_async(url, tcp)
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
    loop {
        let msg = tokio::time::timeout(STEP, ws.next())
            .await
            .expect("a frame within the step timeout")
            .expect("the socket is open")
            .expect("a frame");
        if let Message::Binary(b) = msg {
            return server_frame(&b);
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_run_on_the_websocket_is_rejected_never_relayed() {
    let h = harness::harness(vec![], |_| {}).await;
    let mut ws = connect(&h).await;
    send(&mut ws, hello()).await;
    let _ = next(&mut ws).await;
    send(&mut ws, run_start("r2")).await;
    let first = run_request(CURSORS, "conv-ws-cursor", "hi", true);
    send(&mut ws, client_message("r2", 0, &first)).await;
    let (kind, body) = next(&mut ws).await;
    assert_eq!(kind, 5, "RunRejected");
    let error = field(&body, 2).expect("an error");
    let mut buf = &error[..];
    let (n, _) = prost::encoding::decode_key(&mut buf).unwrap();
    assert_eq!(n, 1);
    assert_eq!(
        prost::encoding::decode_varint(&mut buf).unwrap(),
        9,
        "failed_precondition"
    );
    let text = String::from_utf8(field(&error, 2).expect("a message")).unwrap();
    assert!(text.contains("does not relay Cursor's runs"), "{text}");
    // An unreadable frame closes the socket.
    send(&mut ws, b"\xff\xff".to_vec()).await;
    let closed = tokio::time::timeout(STEP, async {
        loop {
            match ws.next().await {
                None | Some(Err(_)) | Some(Ok(Message::Close(_))) => return,
                Some(Ok(_)) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "the socket closes");
    assert!(h.upstream.recorded().is_empty(), "nothing reached Cursor");
}
