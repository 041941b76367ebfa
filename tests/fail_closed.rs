//! Every path of an agent run fails closed: nothing of a conversation on the user's model
//! reaches Cursor. A unique canary goes in the prompt, in a file the model reads and in a
//! subagent's prompt; the real proxy (every door, 127.0.0.1:0) serves BYOK turns on `Run` and
//! on `RunSSE` + `BidiAppend`, a model renamed in the config, unreadable input on our runs, a
//! prewarm then a resume, a restart, and children of our runs. The fake Cursor upstream must
//! never see a byte of the canary, and every answer the client gets decodes: a Connect end
//! frame (or unary error) with the code and `ErrorDetails` docs/errors.md gives. Cursor's own
//! runs still pass through unchanged.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::time::Duration;

use bytes::Bytes;
use common::agent_client::{
    chunked, connect_request, frame, play, raw_append, resume_request, run_request, Bidi, H2Run,
    Received, ServerStream, Sink, Store,
};
use common::client::Alpn;
use common::cursor_upstream::{relay_reply_bytes, AGENT_RUN, BIDI_APPEND};
use common::fake_cursor::FakeCursor;
use common::fake_provider::{text_sse, tool_sse, After, Reply};
use cursor_byok::connect::{Code, ConnectError, EndStream};
use cursor_byok::proto::agent::v1 as pb;
use cursor_byok::proto::aiserver::v1 as ai;
use harness::{Harness, CURSORS, OURS};
use http::StatusCode;
use prost::Message;

use ai::error_details::Error as Kind;
use pb::agent_client_message::Message as In;

const KEY: &str = "sk-test-fail-closed";
/// What must never reach Cursor.
const CANARY: &str = "canary-5e1f0b7d-never-at-cursor";

async fn harness(replies: Vec<Reply>) -> Harness {
    harness::harness_keyed(replies, KEY, |_| {}).await
}

fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

/// The fake Cursor upstream saw no byte of the canary, in any body or header.
fn assert_canary_unseen(h: &Harness) {
    for r in h.upstream.recorded() {
        assert!(
            !contains(&r.body, CANARY.as_bytes()),
            "{} carried the canary to Cursor",
            r.path
        );
        for v in r.headers.values() {
            assert!(!contains(v.as_bytes(), CANARY.as_bytes()), "{}", r.path);
        }
    }
}

/// An answer came from the proxy, not from Cursor's upstream.
fn assert_ours(headers: &http::HeaderMap) {
    assert!(
        headers.get("x-fake-upstream").is_none(),
        "answered by Cursor's upstream"
    );
}

/// `err` is the refusal docs/errors.md gives: `code`, `ErrorDetails` of `kind`, never
/// retryable, its words naming `needle`.
fn assert_refused(err: &ConnectError, code: Code, kind: Kind, needle: &str) {
    assert_eq!(err.code, code, "{err:?}");
    let details = err
        .decode_error_details()
        .expect("ErrorDetails decode")
        .expect("ErrorDetails present");
    assert_eq!(details.error, kind as i32, "{details:?}");
    let custom = details.details.expect("CustomErrorDetails");
    assert_eq!(custom.is_retryable, Some(false), "{custom:?}");
    assert!(err.message.contains(needle), "{}", err.message);
    assert!(custom.detail.contains(needle), "{}", custom.detail);
}

fn end_error(end: &EndStream) -> ConnectError {
    end.error.clone().expect("an error end frame")
}

/// The end frame of a stream that must carry nothing else.
async fn only_end(stream: &mut ServerStream) -> EndStream {
    match stream.next().await {
        Some(Received::End(end)) => end,
        other => panic!("an end frame first, got {other:?}"),
    }
}

/// A user message with the canary and an inline request context (with `custom` subagents).
fn canary_request(
    model: &str,
    conversation: &str,
    custom: Vec<pb::CustomSubagent>,
) -> pb::AgentClientMessage {
    let mut m = run_request(
        model,
        conversation,
        &format!("Read secret.txt. {CANARY}"),
        true,
    );
    if let Some(In::RunRequest(r)) = &mut m.message {
        if let Some(pb::conversation_action::Action::UserMessageAction(a)) =
            r.action.as_mut().and_then(|a| a.action.as_mut())
        {
            if let Some(ctx) = a.request_context.as_mut() {
                ctx.custom_subagents = custom;
            }
        }
    }
    m
}

#[derive(Debug, Clone, Copy)]
enum Transport {
    H2,
    Sse,
}

const BOTH: [Transport; 2] = [Transport::H2, Transport::Sse];

/// The client side of one run: its answer stream and where its messages go.
struct Conn {
    stream: ServerStream,
    h2: Option<tokio::sync::mpsc::Sender<Bytes>>,
    bidi: Option<Bidi>,
}

impl Conn {
    /// Open a run whose first message is `first`; over RunSSE the reader comes first.
    async fn open(
        h: &Harness,
        t: Transport,
        request_id: &str,
        first: &pb::AgentClientMessage,
    ) -> Conn {
        let door = h.connect_door();
        match t {
            Transport::H2 => {
                let H2Run { tx, stream } = H2Run::open(&door, request_id, first).await;
                Conn {
                    stream,
                    h2: Some(tx),
                    bidi: None,
                }
            }
            Transport::Sse => {
                let bidi = Bidi::new(&door, request_id);
                let (sse, announced) = bidi.spawn_sse_announced();
                announced.await.expect("the RunSSE is being read");
                let answer = bidi
                    .append_body(bidi.append_bytes(bidi.seqno(), first))
                    .await;
                assert_ours(&answer.headers);
                let stream = sse.await.unwrap();
                Conn {
                    stream,
                    h2: None,
                    bidi: Some(bidi),
                }
            }
        }
    }

    async fn send(&self, m: &pb::AgentClientMessage) {
        if let Some(tx) = &self.h2 {
            let _ = tx.send(frame(m)).await;
        }
        if let Some(b) = &self.bidi {
            b.send(m).await;
        }
    }

    /// Play Cursor until the run streams its answer.
    async fn under_way(&mut self) {
        let ws = tempfile::tempdir().unwrap();
        let mut client = FakeCursor::new(ws.path());
        loop {
            let m = match self.stream.next().await {
                Some(Received::Message(m)) => m,
                other => panic!("the run ended early: {other:?}"),
            };
            for answer in client.respond(&m) {
                self.send(&answer).await;
            }
            if common::agent_client::text_of(std::slice::from_ref(&*m)).contains("Working") {
                return;
            }
        }
    }

    /// Play Cursor (execs against `client`'s workspace) to the end frame.
    async fn finish(
        &mut self,
        client: &mut FakeCursor,
    ) -> (Vec<pb::AgentServerMessage>, EndStream) {
        assert_ours(&self.stream.headers);
        let mut messages = Vec::new();
        loop {
            match self.stream.next().await {
                None => panic!("the stream ended without an end frame"),
                Some(Received::End(end)) => return (messages, end),
                Some(Received::Message(m)) => {
                    for answer in client.respond(&m) {
                        self.send(&answer).await;
                    }
                    messages.push(*m);
                }
            }
        }
    }
}

/// A workspace holding a file with the canary.
fn workspace() -> tempfile::TempDir {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(
        ws.path().join("secret.txt"),
        format!("the key is {CANARY}\n"),
    )
    .unwrap();
    ws
}

/// A BYOK turn on each transport whose prompt and file read carry the canary: served here,
/// the provider sees the canary, Cursor's upstream sees nothing at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn byok_turns_on_both_transports_send_nothing_to_cursor() {
    let read = tool_sse(&[("call_1", "read_file", r#"{"path":"secret.txt"}"#)]);
    let h = harness(vec![
        Reply::sse(read.clone()),
        Reply::sse(text_sse("read it")),
        Reply::sse(read),
        Reply::sse(text_sse("read it")),
    ])
    .await;
    let ws = workspace();
    for (i, t) in BOTH.into_iter().enumerate() {
        let mut client = FakeCursor::new(ws.path());
        let first = canary_request(OURS, &format!("conv-byok-{i}"), vec![]);
        let mut conn = Conn::open(&h, t, &format!("req-byok-{i}"), &first).await;
        let (_, end) = conn.finish(&mut client).await;
        assert!(end.error.is_none(), "{t:?}: {:?}", end.error);
        assert!(
            client.execs.iter().any(|e| matches!(
                e.message,
                Some(pb::exec_server_message::Message::ReadArgs(_))
            )),
            "{t:?}: the model read the file"
        );
    }
    let seen = h.provider.requests();
    assert_eq!(seen.len(), 4);
    assert!(
        contains(&seen[1].body, CANARY.as_bytes()),
        "the provider got the file"
    );
    h.assert_nothing_relayed();
    assert_canary_unseen(&h);
    assert_eq!(
        h.upstream.connections_accepted(),
        0,
        "not one connection to Cursor"
    );
}

/// A `byok-` model the config does not have (renamed, removed, another config) is refused on
/// both transports with `failed_precondition` naming it, never relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unconfigured_byok_model_is_refused_on_both_transports() {
    let h = harness(vec![]).await;
    let first = canary_request("byok-renamed-away:high", "conv-gone", vec![]);
    let mut run = H2Run::open(&h.connect_door(), "req-gone-h2", &first).await;
    assert_ours(&run.stream.headers);
    let end = only_end(&mut run.stream).await;
    assert_refused(
        &end_error(&end),
        Code::FailedPrecondition,
        Kind::CustomMessage,
        "byok-renamed-away",
    );

    let bidi = Bidi::new(&h.connect_door(), "req-gone-sse");
    let (sse, announced) = bidi.spawn_sse_announced();
    announced.await.unwrap();
    let answer = bidi.append_body(bidi.append_bytes(0, &first)).await;
    assert_ours(&answer.headers);
    let err = ConnectError::from_unary_response(answer.status.as_u16(), &answer.body);
    assert_refused(
        &err,
        Code::FailedPrecondition,
        Kind::CustomMessage,
        "byok-renamed-away",
    );
    let mut sse = sse.await.unwrap();
    assert_ours(&sse.headers);
    let end = only_end(&mut sse).await;
    assert_refused(
        &end_error(&end),
        Code::FailedPrecondition,
        Kind::CustomMessage,
        "byok-renamed-away",
    );
    h.assert_nothing_relayed();
    assert_canary_unseen(&h);
    assert!(h.provider.requests().is_empty());
}

/// A conversation on our model whose model is renamed in the config (the proxy restarted on
/// the new config): its resume, which names no model, and a turn naming the old id are
/// refused, naming the model; a restart with the model kept resumes it here (pins reloaded).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renamed_model_and_a_restart_keep_the_conversation_from_cursor() {
    let before = harness(vec![Reply::sse(text_sse("first"))]).await;
    let store = Store::default();
    let first = canary_request(OURS, "conv-renamed", vec![]);
    let mut run = H2Run::open(&before.connect_door(), "req-renamed-1", &first).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert!(before.server.agent_pins().had_byok_turn("conv-renamed"));
    before.server.agent_pins().flush();
    let dir = before.data_dir();

    let renamed = harness::harness_keyed(vec![], KEY, |c| {
        c.data_dir = Some(dir.clone());
        c.models[0].id = "renamed-model".into();
    })
    .await;
    let resume = resume_request("conv-renamed", store.conversation_state());
    for (i, t) in BOTH.into_iter().enumerate() {
        for m in [resume.clone(), first.clone()] {
            let mut conn = Conn::open(
                &renamed,
                t,
                &format!("req-renamed-{i}-{}", m.encoded_len()),
                &m,
            )
            .await;
            assert_ours(&conn.stream.headers);
            let end = only_end(&mut conn.stream).await;
            assert_refused(
                &end_error(&end),
                Code::FailedPrecondition,
                Kind::CustomMessage,
                OURS,
            );
        }
    }
    renamed.assert_nothing_relayed();
    assert_canary_unseen(&renamed);
    assert!(renamed.server.agent_pins().had_byok_turn("conv-renamed"));

    // The model back under its name: the resume is ours again, from the reloaded pin.
    let again = harness::harness_keyed(vec![Reply::sse(text_sse("resumed"))], KEY, |c| {
        c.data_dir = Some(dir.clone());
    })
    .await;
    let mut run = H2Run::open(&again.connect_door(), "req-renamed-back", &resume).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), "resumed");
    again.assert_nothing_relayed();
    assert_canary_unseen(&again);
}

/// An append whose agent message does not decode, carrying the canary, at `seqno`.
fn garbled_append(request_id: &str, seqno: i64) -> Bytes {
    let mut garbage = b"\xff\xff\xff".to_vec();
    garbage.extend_from_slice(CANARY.as_bytes());
    raw_append(request_id, seqno, &garbage)
}

/// An append that does not decode, on a run of ours: refused with `invalid_argument` naming
/// the cause, the run ends with the same, and nothing goes to Cursor. Also on a request id
/// whose reader waits for its append 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_append_on_our_run_is_refused_never_relayed() {
    let h = harness(vec![
        Reply::sse(harness::partial("Working")).then(After::Trickle(Duration::from_millis(50)))
    ])
    .await;
    let first = canary_request(OURS, "conv-garbled", vec![]);
    let mut conn = Conn::open(&h, Transport::Sse, "req-garbled", &first).await;
    conn.under_way().await;
    let bidi = conn.bidi.clone().unwrap();
    let answer = bidi
        .append_body(garbled_append("req-garbled", bidi.seqno()))
        .await;
    assert_ours(&answer.headers);
    let err = ConnectError::from_unary_response(answer.status.as_u16(), &answer.body);
    assert_refused(
        &err,
        Code::InvalidArgument,
        Kind::BadRequest,
        "does not decode",
    );
    let end = loop {
        match conn.stream.next().await {
            Some(Received::End(end)) => break end,
            Some(Received::Message(_)) => {}
            None => panic!("no end frame"),
        }
    };
    assert_refused(
        &end_error(&end),
        Code::InvalidArgument,
        Kind::BadRequest,
        "does not decode",
    );

    // Append 0 itself garbled, its reader waiting: both get the refusal.
    let waiting = Bidi::new(&h.connect_door(), "req-garbled-0");
    let (sse, announced) = waiting.spawn_sse_announced();
    announced.await.unwrap();
    let answer = waiting
        .append_body(garbled_append("req-garbled-0", 0))
        .await;
    assert_ours(&answer.headers);
    let err = ConnectError::from_unary_response(answer.status.as_u16(), &answer.body);
    assert_refused(
        &err,
        Code::InvalidArgument,
        Kind::BadRequest,
        "does not decode",
    );
    let mut sse = sse.await.unwrap();
    let end = only_end(&mut sse).await;
    assert_refused(
        &end_error(&end),
        Code::InvalidArgument,
        Kind::BadRequest,
        "does not decode",
    );
    assert!(h.upstream.recorded_on(BIDI_APPEND).is_empty());
    h.assert_nothing_relayed();
    assert_canary_unseen(&h);
}

/// An append of another feature: its data is no agent message (a field 1 of the wrong type).
fn feature_append(request_id: &str, seqno: i64) -> Bytes {
    raw_append(request_id, seqno, b"\x0d\x01\x02\x03\x04")
}

/// An append we cannot read, on a request id no stream has named, waits for its stream: one of
/// Cursor's own (a chat over SSE), before or just after it, makes it Cursor's and it is relayed;
/// none, and it is refused naming why, and a RunSSE that comes for that id later ends with
/// the refusal. Nothing of the canary goes to Cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_undecodable_append_on_an_unknown_id_waits_for_its_stream() {
    const CHAT_SSE: &str = "/aiserver.v1.ChatService/StreamUnifiedChatWithToolsSSE";
    let h = harness(vec![]).await;
    let door = h.connect_door();
    let open_chat = |id: &'static str| {
        let door = door.clone();
        async move {
            let mut conn = door.connect(Alpn::H1).await;
            let body = frame(&ai::BidiRequestId {
                request_id: id.into(),
            });
            let req = connect_request(CHAT_SSE, "application/connect+proto", id, chunked(body));
            conn.send(&door.authority(), req).await.expect("answered");
        }
    };
    // The stream first, then its append.
    open_chat("chat-1").await;
    Bidi::new(&door, "chat-1")
        .append_body(feature_append("chat-1", 0))
        .await;
    // The append first, its stream just after.
    let early = Bidi::new(&door, "chat-2");
    let append = tokio::spawn(async move { early.append_body(feature_append("chat-2", 0)).await });
    open_chat("chat-2").await;
    append.await.unwrap();
    let relayed = h.upstream.recorded_on(BIDI_APPEND);
    assert_eq!(
        relayed.len(),
        2,
        "both appends of Cursor's chats are relayed"
    );

    // Nothing names it: refused, and a late reader gets the refusal as its end.
    let lost = Bidi::new(&door, "req-nobody");
    let answer = lost.append_body(garbled_append("req-nobody", 0)).await;
    assert_ours(&answer.headers);
    let err = ConnectError::from_unary_response(answer.status.as_u16(), &answer.body);
    assert_refused(&err, Code::InvalidArgument, Kind::BadRequest, "no stream");
    let mut sse = lost.open_sse().await;
    let end = only_end(&mut sse).await;
    assert_refused(
        &end_error(&end),
        Code::InvalidArgument,
        Kind::BadRequest,
        "no stream",
    );
    assert_eq!(h.upstream.recorded_on(BIDI_APPEND).len(), 2);
    assert_canary_unseen(&h);
}

/// Extra request headers.
type Headers = &'static [(&'static str, &'static str)];

/// A `Run` we cannot read (another content type, an unknown encoding, a first frame that does
/// not decode) and a RunSSE with an unknown encoding are refused, naming the cause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreadable_run_is_refused_naming_the_cause() {
    let h = harness(vec![]).await;
    let door = h.connect_door();
    let conn = harness::h2_conn(&door).await;
    let ours = frame(&canary_request(OURS, "conv-unreadable", vec![]));
    let mut garbled = vec![0u8];
    let payload = [b"\xff\xff\xff".as_slice(), CANARY.as_bytes()].concat();
    garbled.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    garbled.extend_from_slice(&payload);
    let cases: [(Headers, Bytes, &str); 3] = [
        (
            &[("content-type", "application/connect+json")],
            ours.clone(),
            "application/connect+json",
        ),
        (
            &[("connect-content-encoding", "x-unheard-of")],
            ours,
            "x-unheard-of",
        ),
        (&[], Bytes::from(garbled), "does not decode"),
    ];
    for (i, (headers, body, needle)) in cases.into_iter().enumerate() {
        let run =
            harness::run_with_headers(&conn, &door, &format!("req-unreadable-{i}"), headers, body)
                .await;
        let H2Run { tx, mut stream } = run;
        assert_ours(&stream.headers);
        let end = only_end(&mut stream).await;
        drop(tx);
        assert_refused(
            &end_error(&end),
            Code::InvalidArgument,
            Kind::BadRequest,
            needle,
        );
    }
    let bidi = Bidi::new(&door, "req-unreadable-sse")
        .sse_header("connect-content-encoding", "x-unheard-of");
    let mut sse = bidi.open_sse().await;
    assert_ours(&sse.headers);
    let end = only_end(&mut sse).await;
    assert_refused(
        &end_error(&end),
        Code::InvalidArgument,
        Kind::BadRequest,
        "x-unheard-of",
    );
    h.assert_nothing_relayed();
    assert_canary_unseen(&h);
}

/// A prewarm pins nothing: one naming Cursor's model on a conversation of ours is answered
/// here (it carries the conversation's state), and the conversation's resume is still ours.
/// A prewarm on a new conversation on Cursor's model is relayed and pins nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prewarm_pins_nothing_and_the_resume_stays_ours() {
    let h = harness(vec![
        Reply::sse(text_sse("first")),
        Reply::sse(text_sse("resumed")),
    ])
    .await;
    let store = Store::default();
    let first = canary_request(OURS, "conv-warm", vec![]);
    let mut run = H2Run::open(&h.connect_door(), "req-warm-1", &first).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);

    let prewarm = common::agent_client::prewarm_request(CURSORS, "conv-warm");
    for (i, t) in BOTH.into_iter().enumerate() {
        let mut conn = Conn::open(&h, t, &format!("req-warm-pre-{i}"), &prewarm).await;
        assert_ours(&conn.stream.headers);
        let end = only_end(&mut conn.stream).await;
        assert!(end.error.is_none(), "{t:?}: answered here: {:?}", end.error);
    }
    let pins = h.server.agent_pins();
    assert_eq!(
        pins.get("conv-warm"),
        Some(cursor_byok::agent::transport::Decision::Ours {
            model_id: OURS.into()
        })
    );
    let resume = resume_request("conv-warm", store.conversation_state());
    let bidi = Bidi::new(&h.connect_door(), "req-warm-resume");
    bidi.send(&resume).await;
    let mut sse = bidi.open_sse().await;
    let t = play(&mut sse, Sink::Bidi(&bidi), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), "resumed");
    h.assert_nothing_relayed();
    assert_canary_unseen(&h);

    // Cursor's own prewarm on a new conversation: relayed unchanged, pinned nowhere.
    let raw = frame(&common::agent_client::prewarm_request(
        CURSORS,
        "conv-cursors-warm",
    ));
    let H2Run { tx, stream } =
        H2Run::open_raw(&h.connect_door(), "req-cursors-warm", raw.clone()).await;
    drop(tx);
    assert_eq!(stream.raw_to_end().await, relay_reply_bytes());
    let recorded = h
        .upstream
        .wait_recorded(AGENT_RUN, 1, Duration::from_secs(10))
        .await;
    assert_eq!(recorded[0].body, raw);
    assert!(!pins.knows("conv-cursors-warm"));
}

/// A request id that carries a run relayed to Cursor: a later append 0 on it that names our
/// model is refused, never relayed with the earlier run. Cursor's run itself passed unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relayed_request_id_never_relays_a_byok_append_0() {
    let h = harness(vec![]).await;
    let bidi = Bidi::new(&h.connect_door(), "req-shared");
    let cursors = bidi.append_bytes(0, &run_request(CURSORS, "conv-cursors", "hi", true));
    let answer = bidi.append_body(cursors.clone()).await;
    assert_eq!(answer.status, StatusCode::OK);
    assert_eq!(answer.headers["x-fake-upstream"], "bidi-append");
    assert_eq!(h.upstream.recorded_on(BIDI_APPEND)[0].body, cursors);

    let ours = canary_request(OURS, "conv-shared", vec![]);
    let answer = bidi.append_body(bidi.append_bytes(0, &ours)).await;
    assert_ours(&answer.headers);
    let err = ConnectError::from_unary_response(answer.status.as_u16(), &answer.body);
    assert_refused(
        &err,
        Code::FailedPrecondition,
        Kind::CustomMessage,
        "req-shared",
    );
    assert_eq!(h.upstream.recorded_on(BIDI_APPEND).len(), 1);
    assert_canary_unseen(&h);
    assert!(h.provider.requests().is_empty());
}

/// A custom subagent whose `model:` matches none of ours (nor one the client offered): the
/// task call is a tool error the parent's model reads, no subagent is started, nothing of the
/// parent's files goes to Cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_task_naming_an_unknown_model_is_a_tool_error_the_parent_sees() {
    let task = serde_json::json!({
        "subagent_type": "reviewer",
        "prompt": format!("Review secret.txt {CANARY}"),
    })
    .to_string();
    let h = harness(vec![
        Reply::sse(tool_sse(&[("call_t", "task", &task)])),
        Reply::sse(text_sse("could not delegate")),
    ])
    .await;
    let ws = workspace();
    let reviewer = pb::CustomSubagent {
        name: "reviewer".into(),
        description: "Reviews".into(),
        model: "claude-sonnet-4".into(),
        ..Default::default()
    };
    let mut client = FakeCursor::new(ws.path());
    let first = canary_request(OURS, "conv-task", vec![reviewer]);
    let mut conn = Conn::open(&h, Transport::H2, "req-task", &first).await;
    let (_, end) = conn.finish(&mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let started = client.execs.iter().any(|e| {
        matches!(
            e.message,
            Some(pb::exec_server_message::Message::SubagentArgs(_))
        )
    });
    assert!(!started, "no subagent was started");
    let seen = h.provider.requests();
    assert_eq!(seen.len(), 2);
    let second = String::from_utf8_lossy(&seen[1].body);
    assert!(
        second.contains("claude-sonnet-4"),
        "the parent's model reads why: {second}"
    );
    h.assert_nothing_relayed();
    assert_canary_unseen(&h);
}

/// A child of one of our runs (its requests name the parent run) that names a model neither
/// ours nor asked for, or no model, is refused on both transports; a run naming a parent that
/// is not ours is Cursor's and passes unchanged.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_child_of_our_run_on_an_unknown_model_is_refused() {
    let h = harness(vec![Reply::sse(text_sse("parent done"))]).await;
    let store = Store::default();
    let parent = canary_request(OURS, "conv-parent", vec![]);
    let mut run = H2Run::open(&h.connect_door(), "req-parent", &parent).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);

    let prompt = format!("Subagent task: {CANARY}");
    let unknown = run_request("claude-sonnet-4", "conv-child", &prompt, true);
    let no_model = {
        let mut m = unknown.clone();
        if let Some(In::RunRequest(r)) = &mut m.message {
            r.requested_model = None;
        }
        m
    };
    let door = h.connect_door();
    let conn = harness::h2_conn(&door).await;
    for (i, child) in [&unknown, &no_model].into_iter().enumerate() {
        let headers = [("x-parent-request-id", "req-parent")];
        let run = harness::run_with_headers(
            &conn,
            &door,
            &format!("req-child-h2-{i}"),
            &headers,
            frame(child),
        )
        .await;
        let H2Run { tx, mut stream } = run;
        assert_ours(&stream.headers);
        let end = only_end(&mut stream).await;
        drop(tx);
        assert_refused(
            &end_error(&end),
            Code::FailedPrecondition,
            Kind::CustomMessage,
            "subagent",
        );

        // Over RunSSE, on the reader and the append.
        let bidi = Bidi::new(&door, &format!("req-child-sse-{i}"))
            .sse_header("x-parent-request-id", "req-parent")
            .append_header("x-parent-request-id", "req-parent");
        let (sse, announced) = bidi.spawn_sse_announced();
        announced.await.unwrap();
        let answer = bidi.append_body(bidi.append_bytes(0, child)).await;
        assert_ours(&answer.headers);
        let mut sse = sse.await.unwrap();
        let end = only_end(&mut sse).await;
        assert_refused(
            &end_error(&end),
            Code::FailedPrecondition,
            Kind::CustomMessage,
            "subagent",
        );
    }
    h.assert_nothing_relayed();
    assert_canary_unseen(&h);

    // A run whose parent is Cursor's own: Cursor's, relayed unchanged.
    let cursors = frame(&run_request(CURSORS, "conv-cursors-child", "hi", true));
    let headers = [("x-parent-request-id", "req-someone-else")];
    let run =
        harness::run_with_headers(&conn, &door, "req-cursors-child", &headers, cursors.clone())
            .await;
    let H2Run { tx, stream } = run;
    drop(tx);
    assert_eq!(stream.raw_to_end().await, relay_reply_bytes());
    let recorded = h
        .upstream
        .wait_recorded(AGENT_RUN, 1, Duration::from_secs(10))
        .await;
    assert_eq!(recorded[0].body, cursors);
}

/// A RunSSE reader that leaves mid-run and comes back after the grace reads Cursor's cancel
/// (`canceled`, `ERROR_USER_ABORTED_REQUEST`) as the stream's end, not silence.
#[tokio::test(start_paused = true)]
async fn an_abandoned_run_ends_canceled_for_a_reader_that_returns_late() {
    let _metronome = common::metronome();
    let h =
        harness(vec![Reply::sse(harness::partial("Working"))
            .then(After::Trickle(Duration::from_millis(500)))])
        .await;
    let first = canary_request(OURS, "conv-abandoned", vec![]);
    let mut conn = Conn::open(&h, Transport::Sse, "req-abandoned", &first).await;
    conn.under_way().await;
    let bidi = conn.bidi.clone().unwrap();
    drop(conn);
    // Past the reader grace (5 s): the run is ended as abandoned.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let mut again = bidi.open_sse().await;
    assert_ours(&again.headers);
    let end = loop {
        match again.next().await {
            Some(Received::End(end)) => break end,
            Some(Received::Message(_)) => {}
            None => panic!("silence instead of an end frame"),
        }
    };
    let err = end_error(&end);
    assert_eq!(err.code, Code::Canceled, "{err:?}");
    let details = err.decode_error_details().unwrap().expect("ErrorDetails");
    assert_eq!(details.error, Kind::UserAbortedRequest as i32);
    h.assert_nothing_relayed();
    assert_canary_unseen(&h);
}

/// Cursor's own runs pass through unchanged on both transports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_own_runs_pass_unchanged() {
    let h = harness(vec![]).await;
    let raw = frame(&run_request(CURSORS, "conv-cursors-run", "hi", true));
    let H2Run { tx, stream } =
        H2Run::open_raw(&h.connect_door(), "req-cursors-run", raw.clone()).await;
    drop(tx);
    assert_eq!(stream.raw_to_end().await, relay_reply_bytes());
    let recorded = h
        .upstream
        .wait_recorded(AGENT_RUN, 1, Duration::from_secs(10))
        .await;
    assert_eq!(recorded[0].body, raw);

    let bidi = Bidi::new(&h.connect_door(), "req-cursors-sse");
    let append = bidi.append_bytes(0, &run_request(CURSORS, "conv-cursors-sse", "hi", true));
    let answer = bidi.append_body(append.clone()).await;
    assert_eq!(answer.headers["x-fake-upstream"], "bidi-append");
    assert_eq!(h.upstream.recorded_on(BIDI_APPEND)[0].body, append);
    let (resp, _conn) = bidi
        .sse_request(frame(&ai::BidiRequestId {
            request_id: "req-cursors-sse".into(),
        }))
        .await;
    assert_eq!(resp.headers()["x-fake-upstream"], "run-sse");
    assert!(h.provider.requests().is_empty());
    assert!(!h.server.agent_pins().had_byok_turn("conv-cursors-run"));
}
