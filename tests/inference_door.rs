//! Cursor's local agent loop door (`aiserver.v1.InferenceService/RunInference`, and over
//! HTTP/1.1 `RunInferenceSSE` + `BidiAppend`) through the real proxy: a stream or append that
//! names one of our models, or that cannot be read, is refused with `ErrorDetails` and never
//! reaches the fake Cursor upstream; Cursor's own go upstream unchanged.

mod common;
#[path = "common/harness.rs"]
mod harness;

use bytes::Bytes;
use common::agent_client::{
    chunked, connect_request, frame, raw_append, Bidi, Door, Received, ServerStream, STEP,
};
use common::client::{self, Alpn};
use common::cursor_upstream::BIDI_APPEND;
use cursor_byok::connect::{Code, ConnectError};
use cursor_byok::proto::aiserver::v1 as ai;
use harness::{Harness, CURSORS, OURS};
use http::StatusCode;
use prost::encoding::{encode_key, encode_varint, string, WireType};

const RUN_INFERENCE: &str = "/aiserver.v1.InferenceService/RunInference";
const RUN_INFERENCE_SSE: &str = "/aiserver.v1.InferenceService/RunInferenceSSE";
const INFERENCE_STREAM: &str = "/aiserver.v1.InferenceService/Stream";
/// A unique string in the prompt: it must never reach the upstream.
const CANARY: &str = "canary-7f3e-inference-door";

fn len_field(number: u32, value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    encode_key(number, WireType::LengthDelimited, &mut out);
    encode_varint(value.len() as u64, &mut out);
    out.extend_from_slice(value);
    out
}

/// `RunInferenceClientMessage{run_request{conversation_id, requested_model{model_id},
/// routing_conversation[{role 1, text}]}}` (field numbers from inference.tsv).
fn run_request(model: &str) -> Vec<u8> {
    let mut run = Vec::new();
    string::encode(1, &"conv-inference".to_owned(), &mut run);
    let mut requested = Vec::new();
    string::encode(1, &model.to_owned(), &mut requested);
    run.extend(len_field(3, &requested));
    let mut routing = Vec::new();
    prost::encoding::int32::encode(1, &1, &mut routing);
    string::encode(2, &CANARY.to_owned(), &mut routing);
    run.extend(len_field(4, &routing));
    len_field(1, &run)
}

/// `RunInferenceClientMessage{client_heartbeat{}}`.
fn heartbeat() -> Vec<u8> {
    len_field(5, b"")
}

fn raw_frame(payload: &[u8]) -> Bytes {
    let mut out = vec![0u8];
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    Bytes::from(out)
}

async fn harness() -> Harness {
    harness::harness(vec![], |_| {}).await
}

/// Opens `RunInference` with `first` as its body's first bytes; the answer's stream.
async fn open(door: &Door, content_type: &str, first: Bytes) -> ServerStream {
    open_on(RUN_INFERENCE, door, content_type, first).await
}

async fn open_on(path: &str, door: &Door, content_type: &str, first: Bytes) -> ServerStream {
    let mut conn = door.connect(Alpn::H2).await;
    let (tx, body) = client::channel_body();
    tx.send(first).await.unwrap();
    // The whole request body: a server-streaming call is answered only after it ends.
    drop(tx);
    let req = connect_request(path, content_type, "req-inference", body);
    let resp = tokio::time::timeout(STEP, conn.send(&door.authority(), req))
        .await
        .expect("answered within the step timeout")
        .expect("answered");
    ServerStream::new(resp, Some(conn))
}

/// The refusal every refused stream or append carries.
fn assert_refusal(e: &ConnectError, says: &str) {
    assert_eq!(e.code, Code::FailedPrecondition, "{}", e.message);
    assert!(e.message.contains(says), "{}", e.message);
    let details = e
        .decode_error_details()
        .expect("details decode")
        .expect("ErrorDetails");
    let custom = details.details.expect("custom details");
    assert_eq!(custom.is_retryable, Some(false));
    assert!(custom.title.contains("cursor-byok"), "{}", custom.title);
}

fn assert_canary_never_upstream(h: &Harness) {
    for r in h.upstream.recorded() {
        let body = String::from_utf8_lossy(&r.body);
        assert!(!body.contains(CANARY), "{} carried the canary", r.path);
        let hex = hex::encode(CANARY);
        assert!(!body.contains(&hex), "{} carried the canary (hex)", r.path);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_inference_on_our_model_is_refused_and_never_relayed() {
    let h = harness().await;
    let door = h.connect_door();
    for first in [
        raw_frame(&run_request(OURS)),
        // Renamed or removed from the config: still ours by its prefix.
        raw_frame(&run_request("byok-no-longer-configured")),
        // Not the run request first; bytes that do not scan.
        raw_frame(&heartbeat()),
        raw_frame(b"\x0a\x7fshort"),
    ] {
        let mut stream = open(&door, "application/connect+proto", first).await;
        assert_eq!(stream.status, StatusCode::OK);
        match stream.next().await {
            Some(Received::End(end)) => {
                let e = end.error.expect("an error end");
                assert_refusal(&e, "sent neither to your provider nor to Cursor");
            }
            other => panic!("expected the refusal, got {other:?}"),
        }
    }
    // Another codec: refused too, never passed on unread.
    let mut stream = open(&door, "application/connect+json", Bytes::from_static(b"{}")).await;
    match stream.next().await {
        Some(Received::End(end)) => assert_refusal(&end.error.unwrap(), "content type"),
        other => panic!("expected the refusal, got {other:?}"),
    }
    assert!(h.upstream.recorded_on(RUN_INFERENCE).is_empty());
    assert_canary_never_upstream(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_inference_on_cursors_model_goes_upstream_unchanged() {
    let h = harness().await;
    let frames = [raw_frame(&run_request(CURSORS)), raw_frame(&heartbeat())];
    let mut stream = open(
        &h.connect_door(),
        "application/connect+proto",
        frames.concat().into(),
    )
    .await;
    assert_eq!(stream.status, StatusCode::OK);
    loop {
        match stream.next().await {
            Some(Received::Message(_)) => {}
            Some(Received::End(end)) => {
                assert!(end.error.is_none(), "{:?}", end.error);
                break;
            }
            None => panic!("no end frame"),
        }
    }
    let recorded = h.upstream.wait_recorded(RUN_INFERENCE, 1, STEP).await;
    assert_eq!(recorded[0].headers["x-request-id"], "req-inference");
    assert_eq!(
        recorded[0].body,
        frames.concat(),
        "every frame, byte for byte"
    );
}

/// A `RunInference` of Cursor's whose later frame is `later`: Cursor's answer begins, then the
/// later frame ends the stream with the refusal, and Cursor got only the first frame.
async fn later_frame_is_refused(later: Bytes, says: &str) {
    let h = harness().await;
    let door = h.connect_door();
    let first = raw_frame(&run_request(CURSORS));
    let mut conn = door.connect(Alpn::H2).await;
    let (tx, body) = client::channel_body();
    tx.send(first.clone()).await.unwrap();
    let req = connect_request(
        RUN_INFERENCE,
        "application/connect+proto",
        "req-later",
        body,
    );
    let resp = tokio::time::timeout(STEP, conn.send(&door.authority(), req))
        .await
        .expect("answered within the step timeout")
        .expect("answered");
    let mut stream = ServerStream::new(resp, Some(conn));
    assert_eq!(stream.status, StatusCode::OK);
    // Cursor's answer has begun: the stream went up.
    assert!(matches!(stream.next().await, Some(Received::Message(_))));
    tx.send(later).await.unwrap();
    let end = loop {
        match stream.next().await {
            Some(Received::Message(_)) => {}
            Some(Received::End(end)) => break end,
            None => panic!("no end frame"),
        }
    };
    assert_refusal(&end.error.expect("an error end"), says);
    let recorded = h.upstream.wait_recorded(RUN_INFERENCE, 1, STEP).await;
    // Exactly the first frame (Cursor's own turn, its canary included): not a byte of the
    // refused one.
    assert_eq!(
        recorded[0].body, first,
        "nothing after the first frame went up"
    );
    drop(tx);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_inference_later_frame_naming_our_model_ends_the_stream_unsent() {
    later_frame_is_refused(raw_frame(&run_request(OURS)), "one of yours").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_inference_later_frame_that_cannot_be_read_ends_the_stream_unsent() {
    let mut unreadable = b"\x0a\x7fshort".to_vec();
    unreadable.extend_from_slice(CANARY.as_bytes());
    later_frame_is_refused(raw_frame(&unreadable), "cannot read").await;
}

async fn open_sse(door: &Door, request_id: &str) -> StatusCode {
    let mut conn = door.connect(Alpn::H1).await;
    let body = frame(&ai::BidiRequestId {
        request_id: request_id.into(),
    });
    let req = connect_request(
        RUN_INFERENCE_SSE,
        "application/connect+proto",
        request_id,
        chunked(body),
    );
    let resp = tokio::time::timeout(STEP, conn.send(&door.authority(), req))
        .await
        .expect("answered within the step timeout")
        .expect("answered");
    resp.status()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_inference_sse_appends_on_our_model_are_refused_cursors_relayed() {
    let h = harness().await;
    let door = h.connect_door();

    // Ours: the SSE goes upstream (it carries only the request id), its appends never do.
    assert_eq!(open_sse(&door, "req-inf-ours").await, StatusCode::NOT_FOUND);
    let bidi = Bidi::new(&door, "req-inf-ours");
    let a0 = bidi
        .append_body(raw_append("req-inf-ours", 0, &run_request(OURS)))
        .await;
    assert_eq!(a0.status, StatusCode::BAD_REQUEST, "{:?}", a0.body);
    let e = ConnectError::from_unary_json(&a0.body).expect("a Connect error");
    assert_refusal(&e, OURS);
    // Every later append on that request id is refused too.
    let a1 = bidi
        .append_body(raw_append("req-inf-ours", 1, &heartbeat()))
        .await;
    assert_eq!(a1.status, StatusCode::BAD_REQUEST);
    assert!(h.upstream.recorded_on(BIDI_APPEND).is_empty());
    assert_canary_never_upstream(&h);

    // Cursor's: its appends go upstream, byte for byte.
    assert_eq!(
        open_sse(&door, "req-inf-cursor").await,
        StatusCode::NOT_FOUND
    );
    let bidi = Bidi::new(&door, "req-inf-cursor");
    let body = raw_append("req-inf-cursor", 0, &run_request(CURSORS));
    let a0 = bidi.append_body(body.clone()).await;
    assert_eq!(a0.headers["x-fake-upstream"], "bidi-append");
    let recorded = h.upstream.wait_recorded(BIDI_APPEND, 1, STEP).await;
    assert_eq!(recorded[0].body, body);
    assert_eq!(h.upstream.recorded_on(RUN_INFERENCE_SSE).len(), 2);
}

/// `InferenceStreamRequest{messages[{role 1, text}], model_id}`.
fn stream_request(model: &str) -> Vec<u8> {
    let mut message = Vec::new();
    prost::encoding::int32::encode(1, &1, &mut message);
    string::encode(2, &CANARY.to_owned(), &mut message);
    let mut request = len_field(1, &message);
    string::encode(5, &model.to_owned(), &mut request);
    request
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn inference_stream_on_our_model_is_refused_cursors_relayed() {
    let h = harness().await;
    let door = h.connect_door();
    for body in [
        raw_frame(&stream_request(OURS)),
        raw_frame(b"\x0a\x7fshort"),
    ] {
        let mut stream = open_on(INFERENCE_STREAM, &door, "application/connect+proto", body).await;
        match stream.next().await {
            Some(Received::End(end)) => assert_refusal(
                &end.error.expect("an error end"),
                "neither to your provider",
            ),
            other => panic!("expected the refusal, got {other:?}"),
        }
    }
    assert!(h.upstream.recorded_on(INFERENCE_STREAM).is_empty());
    assert_canary_never_upstream(&h);
    let body = raw_frame(&stream_request(CURSORS));
    let stream = open_on(INFERENCE_STREAM, &door, "application/connect+proto", body).await;
    assert_eq!(stream.status, StatusCode::NOT_FOUND);
    assert_eq!(
        h.upstream
            .wait_recorded(INFERENCE_STREAM, 1, STEP)
            .await
            .len(),
        1
    );
}
