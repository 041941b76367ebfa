//! Issue 6 through the real proxy: a Connect client plays Cursor (through the CONNECT door, over
//! TLS) and runs the server's execs against a temporary workspace ([`FakeCursor`]), while a
//! scripted fake provider asks for tools. The same scenarios as `agent_run.rs`, but on the
//! wire: HTTP/2 `Run`, and `RunSSE` + `BidiAppend` over HTTP/1.1.

mod common;
#[path = "common/harness.rs"]
mod shared;

use std::time::Duration;

use bytes::Bytes;

use common::agent_client::{
    cancel, frame, run_request, text_of, updates, Bidi, Door, H2Run, Received, ServerStream,
};
use common::fake_cursor::FakeCursor;
use common::fake_provider::{self, Reply};
use cursor_byok::config::Config;
use cursor_byok::connect::{Code, EndStream};
use cursor_byok::proto::agent::v1 as pb;
use pb::agent_server_message::Message as Out;
use pb::exec_server_message::Message as X;
use pb::interaction_update::Message as Update;
use sha2::{Digest, Sha256};
use shared::Harness;
use tokio::sync::mpsc;

/// Our configured model as Cursor names it.
const OURS: &str = "byok-fake-model";
const PROVIDER_KEY: &str = "sk-test-agent-tools-proxy";

// ---- harness: the shared one, with a quieter heartbeat ----

async fn harness(replies: Vec<Reply>) -> Harness {
    harness_with(replies, |_| {}).await
}

/// The proxy with our model on the fake provider and the fake Cursor upstream behind
/// `api2.cursor.sh`; `tweak`ed before binding. Each harness has its own (empty) data directory,
/// so a second one is a "restarted" proxy.
async fn harness_with(replies: Vec<Reply>, tweak: impl FnOnce(&mut Config)) -> Harness {
    shared::harness_keyed(replies, PROVIDER_KEY, |c| {
        c.agent.heartbeat_secs = 5;
        tweak(c)
    })
    .await
}

/// What these tests ask of the shared harness.
trait ToolsHarness {
    fn door(&self) -> Door;
    fn tool_results(&self, n: usize) -> Vec<(String, String)>;
}

impl ToolsHarness for Harness {
    fn door(&self) -> Door {
        self.connect_door()
    }

    /// The Chat `tool` messages of the provider's `n`-th request: (tool_call_id, content).
    fn tool_results(&self, n: usize) -> Vec<(String, String)> {
        self.provider.requests()[n].json()["messages"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|m| m["role"] == "tool")
            .map(|m| {
                (
                    m["tool_call_id"].as_str().unwrap_or_default().to_string(),
                    m["content"].as_str().unwrap_or_default().to_string(),
                )
            })
            .collect()
    }
}

// ---- scripted provider replies ----

/// A Chat Completions stream asking for `calls` (id, name, JSON arguments).
fn tool_sse(calls: &[(&str, &str, &str)]) -> Reply {
    Reply::sse(fake_provider::tool_sse(calls))
}

fn text_sse(text: &str) -> Reply {
    Reply::sse(fake_provider::text_sse(text))
}

// ---- the client side: Cursor over one of the two transports ----

#[derive(Clone, Copy, Debug)]
enum Transport {
    /// HTTP/2 `Run` through the CONNECT door.
    H2,
    /// `RunSSE` + `BidiAppend` over HTTP/1.1 through the CONNECT door.
    Sse,
}

/// One run as the client holds it: the server stream and where answers go.
struct Conn {
    stream: ServerStream,
    sink: SinkKind,
    /// Keep a shell exec's stream open (send its start, not its `stream_close`): the command is
    /// still running. `FakeCursor`'s `shell_gate` alone still closes the exec stream.
    hold_shell_close: bool,
}

enum SinkKind {
    /// The `Run` request body.
    H2(mpsc::Sender<Bytes>),
    Bidi(Bidi),
}

impl Conn {
    async fn open(
        h: &Harness,
        transport: Transport,
        request_id: &str,
        first: &pb::AgentClientMessage,
    ) -> Conn {
        let door = h.door();
        match transport {
            Transport::H2 => {
                let H2Run { tx, stream } = H2Run::open(&door, request_id, first).await;
                assert_eq!(stream.status, http::StatusCode::OK);
                assert_eq!(stream.headers["content-type"], "application/connect+proto");
                Conn {
                    stream,
                    sink: SinkKind::H2(tx),
                    hold_shell_close: false,
                }
            }
            Transport::Sse => {
                let bidi = Bidi::new(&door, request_id);
                let sse = {
                    let b = bidi.clone();
                    tokio::spawn(async move { b.open_sse().await })
                };
                bidi.send(first).await;
                let stream = sse.await.unwrap();
                assert_eq!(stream.status, http::StatusCode::OK);
                assert_eq!(stream.headers["content-type"], "text/event-stream");
                Conn {
                    stream,
                    sink: SinkKind::Bidi(bidi),
                    hold_shell_close: false,
                }
            }
        }
    }

    async fn send(&self, msg: &pb::AgentClientMessage) {
        match &self.sink {
            // The run may have ended already (then the request body is gone): ignore.
            SinkKind::H2(tx) => {
                let _ = tx.send(frame(msg)).await;
            }
            SinkKind::Bidi(b) => b.send(msg).await,
        }
    }

    /// Read server messages, answer each through `client`, until the end frame (`Some`) or
    /// until `stop` accepts a message (`None`, after its answers went out).
    async fn drive(
        &mut self,
        client: &mut FakeCursor,
        messages: &mut Vec<pb::AgentServerMessage>,
        mut stop: impl FnMut(&pb::AgentServerMessage) -> bool,
    ) -> Option<EndStream> {
        loop {
            match self.stream.next().await {
                None => panic!("the stream ended without an end frame after {messages:?}"),
                Some(Received::End(end)) => return Some(end),
                Some(Received::Message(m)) => {
                    let hold = self.hold_shell_close && is_shell_exec(&m);
                    for answer in client.respond(&m) {
                        if hold && is_stream_close(&answer) {
                            continue;
                        }
                        self.send(&answer).await;
                    }
                    let done = stop(&m);
                    messages.push(*m);
                    if done {
                        return None;
                    }
                }
            }
        }
    }

    /// To the end frame.
    async fn finish(
        &mut self,
        client: &mut FakeCursor,
    ) -> (Vec<pb::AgentServerMessage>, EndStream) {
        let mut messages = Vec::new();
        let end = self.drive(client, &mut messages, |_| false).await.unwrap();
        (messages, end)
    }
}

/// One whole turn on `transport`.
async fn turn(
    h: &Harness,
    transport: Transport,
    request_id: &str,
    first: &pb::AgentClientMessage,
    client: &mut FakeCursor,
) -> (Vec<pb::AgentServerMessage>, EndStream) {
    let mut conn = Conn::open(h, transport, request_id, first).await;
    conn.finish(client).await
}

fn is_shell_exec(m: &pb::AgentServerMessage) -> bool {
    matches!(&m.message, Some(Out::ExecServerMessage(e)) if matches!(e.message, Some(X::ShellStreamArgs(_))))
}

fn is_stream_close(m: &pb::AgentClientMessage) -> bool {
    matches!(&m.message, Some(pb::agent_client_message::Message::ExecClientControlMessage(c))
        if matches!(c.message, Some(pb::exec_client_control_message::Message::StreamClose(_))))
}

fn is_turn_ended(m: &pb::AgentServerMessage) -> bool {
    matches!(&m.message, Some(Out::InteractionUpdate(u)) if matches!(u.message, Some(Update::TurnEnded(_))))
}

fn tool_events(messages: &[pb::AgentServerMessage]) -> Vec<(&'static str, String)> {
    updates(messages)
        .into_iter()
        .filter_map(|u| match u {
            Update::ToolCallStarted(t) => Some(("started", t.call_id.clone())),
            Update::ToolCallCompleted(t) => Some(("completed", t.call_id.clone())),
            _ => None,
        })
        .collect()
}

fn get_blob_asks(messages: &[pb::AgentServerMessage]) -> usize {
    messages
        .iter()
        .filter(|m| matches!(&m.message, Some(Out::KvServerMessage(k)) if matches!(k.message, Some(pb::kv_server_message::Message::GetBlobArgs(_)))))
        .count()
}

/// Every `set_blob` the server sent names its data's SHA-256.
fn assert_set_blobs_are_sha256(messages: &[pb::AgentServerMessage]) -> usize {
    let mut n = 0;
    for m in messages {
        if let Some(Out::KvServerMessage(k)) = &m.message {
            if let Some(pb::kv_server_message::Message::SetBlobArgs(s)) = &k.message {
                assert_eq!(
                    Sha256::digest(&s.blob_data).as_slice(),
                    &s.blob_id[..],
                    "blob id = SHA-256(data)"
                );
                n += 1;
            }
        }
    }
    n
}

// ---- the scenarios ----

async fn read_edit_shell_then_answer(transport: Transport) {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("hello.txt"), "hello world\n").unwrap();
    let h = harness(vec![
        tool_sse(&[("call_1", "read_file", r#"{"path":"hello.txt"}"#)]),
        tool_sse(&[(
            "call_2",
            "search_replace",
            r#"{"path":"hello.txt","old_string":"world","new_string":"byok"}"#,
        )]),
        tool_sse(&[(
            "call_3",
            "run_terminal_cmd",
            r#"{"command":"cat hello.txt; echo done >&2"}"#,
        )]),
        text_sse("All set."),
    ])
    .await;
    let mut client = FakeCursor::new(ws.path());
    let first = run_request(OURS, "conv-tools", "fix the greeting", false);
    let (messages, end) = turn(
        &h,
        transport,
        &format!("req-tools-{transport:?}"),
        &first,
        &mut client,
    )
    .await;
    assert!(end.error.is_none(), "{transport:?}: {:?}", end.error);

    // The directory really changed.
    assert_eq!(
        std::fs::read_to_string(ws.path().join("hello.txt")).unwrap(),
        "hello byok\n"
    );
    assert!(text_of(&messages).ends_with("All set."), "{messages:?}");
    // The client was asked for read, write (the edit) and shell, in that order.
    let mut kinds: Vec<&str> = client
        .execs
        .iter()
        .filter_map(|e| match e.message {
            Some(X::ReadArgs(_)) => Some("read"),
            Some(X::WriteArgs(_)) => Some("write"),
            Some(X::ShellStreamArgs(_)) => Some("shell"),
            _ => None,
        })
        .collect();
    // (The edit reads the file before writing it back.)
    kinds.dedup();
    assert_eq!(kinds, ["read", "write", "shell"]);

    // Each call: started then completed, same call id.
    let events = tool_events(&messages);
    assert_eq!(events.len(), 6, "{events:?}");
    for pair in events.chunks(2) {
        assert_eq!((pair[0].0, pair[1].0), ("started", "completed"));
        assert_eq!(pair[0].1, pair[1].1);
    }
    // The shell's output streamed to the client as tool_call_delta.
    let deltas: Vec<String> = updates(&messages)
        .into_iter()
        .filter(|u| matches!(u, Update::ToolCallDelta(_)))
        .map(|u| format!("{u:?}"))
        .collect();
    assert!(
        deltas.iter().any(|d| d.contains("hello byok")),
        "shell stdout streamed: {deltas:?}"
    );

    // The provider received the right tool results, on the right call ids.
    assert_eq!(h.provider.requests().len(), 4);
    let r1 = h.tool_results(1);
    assert_eq!(r1.len(), 1);
    assert_eq!(r1[0].0, "call_1");
    assert!(r1[0].1.contains("hello world"), "{r1:?}");
    let r2 = h.tool_results(2);
    assert_eq!(r2[1].0, "call_2");
    assert!(!r2[1].1.to_lowercase().starts_with("error"), "{r2:?}");
    let r3 = h.tool_results(3);
    assert_eq!(r3[2].0, "call_3");
    assert!(
        r3[2].1.contains("hello byok") && r3[2].1.contains("done"),
        "{r3:?}"
    );

    // Blobs: SHA-256 ids, all held by the client; the checkpoint after the last set_blob (and
    // so after its ack, which the client sends before reading on), before turn_ended.
    assert!(assert_set_blobs_are_sha256(&messages) > 0);
    assert!(client.blob_ids_are_sha256());
    let checkpoint = client.checkpoint.clone().expect("a checkpoint");
    assert_eq!(checkpoint.turns.len(), 1);
    assert!(client.blobs.contains_key(checkpoint.turns[0].as_ref()));
    let last_kv = messages
        .iter()
        .rposition(|m| matches!(m.message, Some(Out::KvServerMessage(_))))
        .unwrap();
    let cp = messages
        .iter()
        .position(|m| matches!(m.message, Some(Out::ConversationCheckpointUpdate(_))))
        .unwrap();
    let te = messages.iter().position(is_turn_ended).unwrap();
    assert!(last_kv < cp && cp < te, "{last_kv} < {cp} < {te}");
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_edit_shell_then_answer_over_h2_run() {
    read_edit_shell_then_answer(Transport::H2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_edit_shell_then_answer_over_run_sse_and_bidi_append() {
    read_edit_shell_then_answer(Transport::Sse).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parallel_calls_a_failing_edit_and_an_unknown_tool_reach_the_model() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    std::fs::write(ws.path().join("b.txt"), "beta\n").unwrap();
    let h = harness(vec![
        tool_sse(&[
            ("p1", "Read", r#"{"file_path":"a.txt"}"#),
            ("p2", "read_file", r#"{"path":"b.txt"}"#),
            (
                "p3",
                "search_replace",
                r#"{"path":"a.txt","old_string":"missing","new_string":"x"}"#,
            ),
            ("p4", "teleport", r#"{}"#),
        ]),
        text_sse("ok"),
    ])
    .await;
    let mut client = FakeCursor::new(ws.path());
    let first = run_request(OURS, "conv-par", "look", false);
    let (messages, end) = turn(&h, Transport::H2, "req-par", &first, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(text_of(&messages).ends_with("ok"));
    let results = h.tool_results(1);
    let ids: Vec<&str> = results.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(ids, ["p1", "p2", "p3", "p4"]);
    assert!(results[0].1.contains("alpha"), "{results:?}");
    assert!(results[1].1.contains("beta"), "{results:?}");
    assert!(results[2].1.contains("not found"), "{}", results[2].1);
    assert!(results[3].1.contains("Unknown tool"), "{}", results[3].1);
    // The failing edit did not touch the file.
    assert_eq!(
        std::fs::read_to_string(ws.path().join("a.txt")).unwrap(),
        "alpha\n"
    );
    // Both reads went to the client.
    let reads = client
        .execs
        .iter()
        .filter(|e| matches!(e.message, Some(X::ReadArgs(_))))
        .count();
    assert!(reads >= 2, "{:?}", client.execs);
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_throw_from_the_client_is_a_tool_error_not_the_end() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("a.txt"), "alpha\n").unwrap();
    let h = harness(vec![
        tool_sse(&[("t1", "read_file", r#"{"path":"a.txt"}"#)]),
        text_sse("sorry"),
    ])
    .await;
    let mut client = FakeCursor::new(ws.path());
    client.throw_execs = true;
    let first = run_request(OURS, "conv-throw", "look", false);
    let (messages, end) = turn(&h, Transport::H2, "req-throw", &first, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(text_of(&messages).ends_with("sorry"));
    let results = h.tool_results(1);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "t1");
    assert!(results[0].1.contains("EACCES"), "{results:?}");
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_a_shell_exec_aborts_it_then_ends_canceled_over_h2_run() {
    cancel_during_a_shell_exec(Transport::H2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_a_shell_exec_aborts_it_then_ends_canceled_over_run_sse() {
    cancel_during_a_shell_exec(Transport::Sse).await;
}

async fn cancel_during_a_shell_exec(transport: Transport) {
    let ws = tempfile::tempdir().unwrap();
    let h = harness(vec![tool_sse(&[(
        "s1",
        "run_terminal_cmd",
        r#"{"command":"sleep 100"}"#,
    )])])
    .await;
    let mut client = FakeCursor::new(ws.path());
    client.shell_gate = Some(ws.path().join("never"));
    let first = run_request(OURS, "conv-cancel", "run it", false);
    let mut conn = Conn::open(&h, transport, &format!("req-cancel-{transport:?}"), &first).await;
    conn.hold_shell_close = true;
    let mut messages = Vec::new();
    // Answer until the shell exec went out (the client answers only its start), then cancel.
    let end = conn.drive(&mut client, &mut messages, is_shell_exec).await;
    assert!(end.is_none(), "ended before the shell exec: {messages:?}");
    conn.send(&cancel()).await;
    let seen = messages.len();
    let end = conn
        .drive(&mut client, &mut messages, |_| false)
        .await
        .unwrap();
    let err = end.error.expect("an error end frame");
    assert_eq!(err.code, Code::Canceled, "{transport:?}: {err:?}");
    let shell_id = client
        .execs
        .iter()
        .find(|e| matches!(e.message, Some(X::ShellStreamArgs(_))))
        .unwrap()
        .id;
    // The abort for that exec came before the end.
    assert_eq!(client.aborted, vec![shell_id], "{:?}", &messages[seen..]);
    assert!(messages[seen..].iter().any(|m| matches!(
        &m.message,
        Some(Out::ExecServerControlMessage(c))
            if matches!(&c.message, Some(pb::exec_server_control_message::Message::Abort(a)) if a.id == shell_id)
    )));
    assert!(!messages.iter().any(is_turn_ended));
    assert_eq!(h.provider.requests().len(), 1);
    h.assert_nothing_relayed();
}

/// What the provider must see on the second turn: the first turn's user text, tool call and
/// result, answer, then the new question.
fn assert_history(h: &Harness, n: usize) {
    let body = h.provider.requests()[n].json();
    let msgs = body["messages"].as_array().unwrap().clone();
    let text = serde_json::to_string(&msgs).unwrap();
    assert!(text.contains("what is in n.txt?"), "{text}");
    assert!(
        text.contains("forty-two\\n"),
        "tool result replayed: {text}"
    );
    assert!(text.contains("It says forty-two."), "{text}");
    assert!(
        msgs.iter().any(|m| m["role"] == "tool"
            && m["tool_call_id"] == "r1"
            && m["content"]
                .as_str()
                .unwrap_or_default()
                .contains("forty-two")),
        "{text}"
    );
    assert_eq!(msgs.last().unwrap()["content"], "are you sure?");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_turn_rebuilds_history_from_the_cache_and_after_a_restart_from_the_client() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("n.txt"), "forty-two\n").unwrap();
    let h = harness(vec![
        tool_sse(&[("r1", "read_file", r#"{"path":"n.txt"}"#)]),
        text_sse("It says forty-two."),
        text_sse("Yes."),
    ])
    .await;
    let mut client = FakeCursor::new(ws.path());
    let first = run_request(OURS, "conv-multi", "what is in n.txt?", false);
    let (messages, end) = turn(&h, Transport::H2, "req-multi-1", &first, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(text_of(&messages).ends_with("It says forty-two."));
    assert!(client.blob_ids_are_sha256());
    let checkpoint = client.checkpoint.clone().expect("a checkpoint");
    assert_eq!(checkpoint.turns.len(), 1);

    let second = |state: pb::ConversationStateStructure| {
        let mut m = run_request(OURS, "conv-multi", "are you sure?", false);
        if let Some(pb::agent_client_message::Message::RunRequest(r)) = &mut m.message {
            r.conversation_state = Some(state);
        }
        m
    };

    // Same proxy: the blobs come from its cache; the client is not asked for any.
    let gets = client.gets;
    let (messages, end) = turn(
        &h,
        Transport::H2,
        "req-multi-2",
        &second(checkpoint.clone()),
        &mut client,
    )
    .await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(text_of(&messages), "Yes.");
    assert_history(&h, 2);
    assert_eq!(client.gets, gets, "served from the cache");
    assert_eq!(get_blob_asks(&messages), 0);
    assert_eq!(client.checkpoint.as_ref().unwrap().turns.len(), 2);

    // A "restarted" proxy (empty data dir): the client serves the blobs through get_blob.
    let restarted = harness(vec![text_sse("Still yes.")]).await;
    let (messages, end) = turn(
        &restarted,
        Transport::H2,
        "req-multi-3",
        &second(checkpoint),
        &mut client,
    )
    .await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(text_of(&messages), "Still yes.");
    assert!(
        get_blob_asks(&messages) > 0,
        "the client was asked for blobs"
    );
    assert!(client.gets > gets);
    assert_history(&restarted, 0);
    assert_eq!(client.checkpoint.as_ref().unwrap().turns.len(), 2);
    h.assert_nothing_relayed();
    restarted.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_blob_ack_ends_the_run_with_a_clear_error_over_h2_run() {
    a_missing_blob_ack(Transport::H2).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_blob_ack_ends_the_run_with_a_clear_error_over_run_sse() {
    a_missing_blob_ack(Transport::Sse).await;
}

async fn a_missing_blob_ack(transport: Transport) {
    let h = harness_with(vec![text_sse("hi")], |c| c.agent.kv_timeout_secs = 1).await;
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    client.withhold_acks = true;
    let first = run_request(OURS, "conv-noack", "hi", false);
    let started = std::time::Instant::now();
    let (messages, end) = turn(
        &h,
        transport,
        &format!("req-noack-{transport:?}"),
        &first,
        &mut client,
    )
    .await;
    let err = end.error.expect("an error end frame");
    // After the answer was shown: a code Cursor's client does not retry.
    assert_eq!(err.code, Code::Unknown, "{transport:?}: {err:?}");
    assert!(err.message.contains("blobs"), "{}", err.message);
    assert!(started.elapsed() < Duration::from_secs(8));
    assert!(
        assert_set_blobs_are_sha256(&messages) > 0,
        "blobs were sent"
    );
    // No checkpoint naming unacknowledged blobs, and no turn_ended.
    assert!(client.checkpoint.is_none());
    assert!(!messages
        .iter()
        .any(|m| matches!(m.message, Some(Out::ConversationCheckpointUpdate(_)))));
    assert!(!messages.iter().any(is_turn_ended));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ask_question_round_trip_reaches_the_model() {
    let h = harness(vec![
        tool_sse(&[(
            "q1",
            "ask_question",
            r#"{"question":"Which colour?","options":["red","blue"]}"#,
        )]),
        text_sse("Blue it is."),
    ])
    .await;
    let ws = tempfile::tempdir().unwrap();
    let mut client = FakeCursor::new(ws.path());
    let first = run_request(OURS, "conv-ask", "pick", false);
    let (messages, end) = turn(&h, Transport::H2, "req-ask", &first, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let asked = messages.iter().find_map(|m| match &m.message {
        Some(Out::InteractionQuery(q)) => Some(q),
        _ => None,
    });
    let asked = format!("{:?}", asked.expect("an interaction query"));
    assert!(asked.contains("Which colour?"), "{asked}");
    assert_eq!(text_of(&messages), "Blue it is.");
    let results = h.tool_results(1);
    assert_eq!(results.len(), 1);
    assert_eq!(results[0].0, "q1");
    let answer = results[0].1.to_lowercase();
    assert!(
        answer.contains("red") || answer.contains("blue"),
        "{answer}"
    );
    h.assert_nothing_relayed();
}

// ---- Gemini native through the proxy ----

/// A Gemini `streamGenerateContent` body of these chunks.
fn gemini_sse(chunks: &[serde_json::Value]) -> Reply {
    Reply::sse(
        chunks
            .iter()
            .map(|c| format!("data: {c}\n\n"))
            .collect::<String>(),
    )
}

const CALL_SIG: &str = "Q2FsbC1zaWcrLz0=";
const THOUGHT_SIG: &str = "VGhvdWdodC1zaWc=";
const TEXT_SIG: &str = "VGV4dC1zaWc=";

/// The `contents` of the provider's `n`-th request.
fn gemini_contents(h: &Harness, n: usize) -> Vec<serde_json::Value> {
    h.provider.requests()[n].json()["contents"]
        .as_array()
        .unwrap()
        .clone()
}

/// Thinking, a tool round trip and a second turn on a Gemini provider: every request carries
/// the thought signatures exactly as Gemini sent them, on the parts they came with, also when the
/// second turn's history is rebuilt from the conversation cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gemini_thinking_tool_round_trip_and_signatures_across_turns() {
    use serde_json::json;
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("n.txt"), "forty-two\n").unwrap();
    let h = harness_with(
        vec![
            gemini_sse(&[
                json!({"responseId": "g1", "candidates": [{"content": {"role": "model", "parts": [
                    {"text": "Read n.txt first.", "thought": true, "thoughtSignature": THOUGHT_SIG}]}}]}),
                json!({"candidates": [{"content": {"role": "model", "parts": [
                    {"functionCall": {"name": "read_file", "args": {"path": "n.txt"}}, "thoughtSignature": CALL_SIG}]},
                    "finishReason": "STOP"}],
                    "usageMetadata": {"promptTokenCount": 50, "candidatesTokenCount": 10, "thoughtsTokenCount": 4}}),
            ]),
            gemini_sse(&[json!({"candidates": [{"content": {"role": "model", "parts": [
                {"text": "It says forty-two.", "thoughtSignature": TEXT_SIG}]}, "finishReason": "STOP"}],
                "usageMetadata": {"promptTokenCount": 80, "candidatesTokenCount": 5}})]),
            gemini_sse(&[json!({"candidates": [{"content": {"role": "model", "parts": [
                {"text": "Yes."}]}, "finishReason": "STOP"}]})]),
        ],
        |c| {
            let p = c.providers.get_mut("fake").unwrap();
            p.kind = cursor_byok::provider::ProviderKind::Gemini;
        },
    )
    .await;
    let mut client = FakeCursor::new(ws.path());
    let first = run_request(OURS, "conv-gemini", "what is in n.txt?", false);
    let (messages, end) = turn(&h, Transport::H2, "req-gemini-1", &first, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert!(text_of(&messages).ends_with("It says forty-two."));
    let thinking: String = updates(&messages)
        .into_iter()
        .filter_map(|u| match u {
            Update::ThinkingDelta(t) => Some(t.text.as_str()),
            _ => None,
        })
        .collect();
    assert_eq!(thinking, "Read n.txt first.");
    let usage = updates(&messages).into_iter().find_map(|u| match u {
        Update::TurnEnded(t) => Some(*t),
        _ => None,
    });
    assert!(
        usage.is_some_and(|u| u.input_tokens.is_some()),
        "usage reported"
    );

    let reqs = h.provider.requests();
    assert_eq!(
        reqs[0].path,
        "/v1beta/models/gpt-fake:streamGenerateContent?alt=sse"
    );
    assert_eq!(reqs[0].header("x-goog-api-key"), Some(PROVIDER_KEY));
    assert!(reqs[0].header("authorization").is_none());
    let tools = &reqs[0].json()["tools"][0]["functionDeclarations"];
    assert!(tools
        .as_array()
        .unwrap()
        .iter()
        .any(|t| t["name"] == "read_file"));

    let model_turn = json!({"role": "model", "parts": [
        {"text": "Read n.txt first.", "thought": true, "thoughtSignature": THOUGHT_SIG},
        {"functionCall": {"name": "read_file", "args": {"path": "n.txt"}}, "thoughtSignature": CALL_SIG},
    ]});
    let contents = gemini_contents(&h, 1);
    assert_eq!(contents[1], model_turn);
    let response = &contents[2]["parts"][0]["functionResponse"];
    assert_eq!(response["name"], "read_file");
    assert!(
        response["response"]["output"]
            .as_str()
            .unwrap()
            .contains("forty-two"),
        "{response}"
    );

    // The second turn, its history rebuilt from the proxy's cache.
    let checkpoint = client.checkpoint.clone().expect("a checkpoint");
    let mut second = run_request(OURS, "conv-gemini", "are you sure?", false);
    if let Some(pb::agent_client_message::Message::RunRequest(r)) = &mut second.message {
        r.conversation_state = Some(checkpoint);
    }
    let (messages, end) = turn(&h, Transport::H2, "req-gemini-2", &second, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(text_of(&messages), "Yes.");
    let contents = gemini_contents(&h, 2);
    assert_eq!(contents[1], model_turn);
    assert_eq!(
        contents[3],
        json!({"role": "model", "parts": [{"text": "It says forty-two.", "thoughtSignature": TEXT_SIG}]})
    );
    assert_eq!(
        contents.last().unwrap(),
        &json!({"role": "user", "parts": [{"text": "are you sure?"}]})
    );
    let raw = String::from_utf8(h.provider.requests()[2].body.clone()).unwrap();
    for sig in [THOUGHT_SIG, CALL_SIG, TEXT_SIG] {
        assert!(
            raw.contains(&format!("\"thoughtSignature\":\"{sig}\"")),
            "{sig}"
        );
    }
    h.assert_nothing_relayed();
}

// ---- Issue 21: conversation actions on both transports ----

/// A run request on `conv` with `action` and the client's checkpoint.
fn action_message(
    conv: &str,
    action: pb::conversation_action::Action,
    state: Option<pb::ConversationStateStructure>,
) -> pb::AgentClientMessage {
    let mut m = run_request(OURS, conv, "unused", false);
    if let Some(pb::agent_client_message::Message::RunRequest(r)) = &mut m.message {
        r.action = Some(pb::ConversationAction {
            action: Some(action),
            ..Default::default()
        });
        r.conversation_state = state;
    }
    m
}

fn with_state(
    mut m: pb::AgentClientMessage,
    state: Option<pb::ConversationStateStructure>,
) -> pb::AgentClientMessage {
    if let Some(pb::agent_client_message::Message::RunRequest(r)) = &mut m.message {
        r.conversation_state = state;
    }
    m
}

fn request_json(h: &Harness, n: usize) -> String {
    serde_json::to_string(&h.provider.requests()[n].json()["messages"]).unwrap()
}

/// Plan mode proposes a plan; Build makes it the instruction, in agent mode.
async fn build_a_plan_from_plan_mode(transport: Transport) {
    let ws = tempfile::tempdir().unwrap();
    let h = harness(vec![text_sse("PLAN: write hello.txt"), text_sse("Built.")]).await;
    let mut client = FakeCursor::new(ws.path());
    let mut first = run_request(OURS, "conv-build", "plan a greeting", false);
    if let Some(pb::agent_client_message::Message::RunRequest(r)) = &mut first.message {
        if let Some(pb::conversation_action::Action::UserMessageAction(a)) =
            r.action.as_mut().and_then(|a| a.action.as_mut())
        {
            if let Some(u) = a.user_message.as_mut() {
                u.mode = pb::AgentMode::Plan as i32;
            }
        }
    }
    let id = format!("req-build-1-{transport:?}");
    let (_, end) = turn(&h, transport, &id, &first, &mut client).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    let build = action_message(
        "conv-build",
        pb::conversation_action::Action::ExecutePlanAction(pb::ExecutePlanAction {
            plan: Some(pb::ConversationPlan {
                plan: "1. Write hello.txt\n2. Check it".into(),
            }),
            plan_id: Some("plan-1".into()),
            ..Default::default()
        }),
        client.checkpoint.clone(),
    );
    let id = format!("req-build-2-{transport:?}");
    let (messages, end) = turn(&h, transport, &id, &build, &mut client).await;
    assert!(end.error.is_none(), "{transport:?}: {:?}", end.error);
    assert!(text_of(&messages).ends_with("Built."));
    let system = |n: usize| {
        h.provider.requests()[n].json()["messages"][0]["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    assert!(system(0).contains("Plan mode"));
    assert!(!system(1).contains("Plan mode"), "{}", system(1));
    let second = request_json(&h, 1);
    assert!(second.contains("PLAN: write hello.txt"), "{second}");
    assert!(second.contains("Implement the plan") && second.contains("1. Write hello.txt"));
    let cp = client.checkpoint.clone().unwrap();
    assert_eq!(cp.mode, Some(pb::AgentMode::Agent as i32));
    assert!(cp.plans.contains_key("plan-1"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_a_plan_from_plan_mode_over_h2_run() {
    build_a_plan_from_plan_mode(Transport::H2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn build_a_plan_from_plan_mode_over_run_sse_and_bidi_append() {
    build_a_plan_from_plan_mode(Transport::Sse).await
}

/// Steering sent while a shell command runs is acknowledged and reaches the next model call.
async fn steering_during_a_tool_round(transport: Transport) {
    let ws = tempfile::tempdir().unwrap();
    let h = harness(vec![
        tool_sse(&[("s1", "run_terminal_cmd", r#"{"command":"echo ran"}"#)]),
        text_sse("Steered answer."),
    ])
    .await;
    let mut client = FakeCursor::new(ws.path());
    // The command keeps running (only its start is answered) until the test ends it.
    client.shell_gate = Some(ws.path().join("never"));
    let first = run_request(OURS, "conv-steer", "run it", false);
    let id = format!("req-steer-{transport:?}");
    let mut conn = Conn::open(&h, transport, &id, &first).await;
    conn.hold_shell_close = true;
    let mut messages = Vec::new();
    let end = conn.drive(&mut client, &mut messages, is_shell_exec).await;
    assert!(end.is_none());
    let steer = pb::AgentClientMessage {
        message: Some(pb::agent_client_message::Message::ConversationAction(
            pb::ConversationAction {
                action: Some(pb::conversation_action::Action::InjectContextAction(
                    pb::InjectContextAction {
                        injection_id: "inj".into(),
                        expected_run_id: String::new(),
                        payload: Some(pb::inject_context_action::Payload::UserContext(
                            pb::UserContextInjection {
                                user_message: Some(pb::UserMessage {
                                    text: "also list the files".into(),
                                    ..Default::default()
                                }),
                                request_context: None,
                            },
                        )),
                    },
                )),
                ..Default::default()
            },
        )),
    };
    conn.send(&steer).await;
    // Now the command ends: its exit, then the stream close.
    let shell = client
        .execs
        .iter()
        .rfind(|e| matches!(e.message, Some(X::ShellStreamArgs(_))))
        .unwrap()
        .id;
    conn.send(&pb::AgentClientMessage {
        message: Some(pb::agent_client_message::Message::ExecClientMessage(
            pb::ExecClientMessage {
                id: shell,
                message: Some(pb::exec_client_message::Message::ShellStream(
                    pb::ShellStream {
                        event: Some(pb::shell_stream::Event::Exit(pb::ShellStreamExit::default())),
                    },
                )),
                ..Default::default()
            },
        )),
    })
    .await;
    conn.send(&pb::AgentClientMessage {
        message: Some(pb::agent_client_message::Message::ExecClientControlMessage(
            pb::ExecClientControlMessage {
                message: Some(pb::exec_client_control_message::Message::StreamClose(
                    pb::ExecClientStreamClose { id: shell },
                )),
            },
        )),
    })
    .await;
    let end = conn
        .drive(&mut client, &mut messages, |_| false)
        .await
        .unwrap();
    assert!(end.error.is_none(), "{transport:?}: {:?}", end.error);
    let states: Vec<String> = updates(&messages)
        .into_iter()
        .filter_map(|u| match u {
            Update::ContextInjectionState(s) => {
                Some(format!("{:?}", s.state.as_ref()?.state.as_ref()?))
            }
            _ => None,
        })
        .collect();
    assert_eq!(states.len(), 2, "{states:?}");
    assert!(
        states[0].starts_with("Queued") && states[1].starts_with("Delivered"),
        "{states:?}"
    );
    let second = request_json(&h, 1);
    assert!(second.contains("also list the files"), "{second}");
    assert!(!request_json(&h, 0).contains("also list the files"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_during_a_tool_round_over_h2_run() {
    steering_during_a_tool_round(Transport::H2).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steering_during_a_tool_round_over_run_sse_and_bidi_append() {
    steering_during_a_tool_round(Transport::Sse).await
}

/// A provider kind's scripted replies and how its requests pair tool calls with results.
#[derive(Clone, Copy, Debug)]
enum Kind {
    Chat,
    Anthropic,
    Responses,
}

impl Kind {
    fn provider_kind(self) -> cursor_byok::provider::ProviderKind {
        use cursor_byok::provider::ProviderKind as P;
        match self {
            Kind::Chat => P::OpenAiChat,
            Kind::Anthropic => P::Anthropic,
            Kind::Responses => P::OpenAiResponses,
        }
    }

    /// A stream asking for one call (`id`, `name`, JSON `args`), in this kind's own format.
    fn tool_reply(self, id: &str, name: &str, args: &str) -> Reply {
        use serde_json::json;
        let events = match self {
            Kind::Chat => return tool_sse(&[(id, name, args)]),
            Kind::Anthropic => vec![
                json!({"type":"message_start","message":{"id":"m1","type":"message","role":"assistant","content":[],"usage":{"input_tokens":50,"output_tokens":1}}}),
                json!({"type":"content_block_start","index":0,"content_block":{"type":"tool_use","id":id,"name":name,"input":{}}}),
                json!({"type":"content_block_delta","index":0,"delta":{"type":"input_json_delta","partial_json":args}}),
                json!({"type":"content_block_stop","index":0}),
                json!({"type":"message_delta","delta":{"stop_reason":"tool_use"},"usage":{"output_tokens":10}}),
                json!({"type":"message_stop"}),
            ],
            Kind::Responses => vec![
                json!({"type":"response.created","response":{"id":"r1","status":"in_progress","output":[]}}),
                json!({"type":"response.output_item.added","output_index":0,"item":{"id":"fc1","type":"function_call","arguments":"","call_id":id,"name":name}}),
                json!({"type":"response.function_call_arguments.delta","item_id":"fc1","output_index":0,"delta":args}),
                json!({"type":"response.output_item.done","output_index":0,"item":{"id":"fc1","type":"function_call","status":"completed","arguments":args,"call_id":id,"name":name}}),
                json!({"type":"response.completed","response":{"id":"r1","status":"completed","usage":{"input_tokens":50,"output_tokens":10,"total_tokens":60}}}),
            ],
        };
        typed_sse(&events)
    }

    /// A stream answering `text`.
    fn text_reply(self, text: &str) -> Reply {
        use serde_json::json;
        let events = match self {
            Kind::Chat => return text_sse(text),
            Kind::Anthropic => vec![
                json!({"type":"message_start","message":{"id":"m2","type":"message","role":"assistant","content":[],"usage":{"input_tokens":80,"output_tokens":1}}}),
                json!({"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}),
                json!({"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":text}}),
                json!({"type":"content_block_stop","index":0}),
                json!({"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"output_tokens":5}}),
                json!({"type":"message_stop"}),
            ],
            Kind::Responses => vec![
                json!({"type":"response.created","response":{"id":"r2","status":"in_progress","output":[]}}),
                json!({"type":"response.output_item.added","output_index":0,"item":{"id":"msg1","type":"message","role":"assistant","content":[]}}),
                json!({"type":"response.output_text.delta","item_id":"msg1","output_index":0,"content_index":0,"delta":text}),
                json!({"type":"response.completed","response":{"id":"r2","status":"completed","usage":{"input_tokens":80,"output_tokens":5,"total_tokens":85}}}),
            ],
        };
        typed_sse(&events)
    }

    /// The tool calls of the provider's `n`-th request, each with the result that answers it
    /// (`None` when there is none where the provider requires it), in this kind's own format.
    fn calls_and_results(self, h: &Harness, n: usize) -> Vec<(String, Option<String>)> {
        let body = h.provider.requests()[n].json();
        let text = |v: &serde_json::Value| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        };
        match self {
            Kind::Chat => {
                let results = h.tool_results(n);
                body["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .flat_map(|m| m["tool_calls"].as_array().cloned().unwrap_or_default())
                    .map(|c| {
                        let id = c["id"].as_str().unwrap_or_default().to_string();
                        let result = results.iter().find(|(r, _)| *r == id).map(|r| r.1.clone());
                        (id, result)
                    })
                    .collect()
            }
            // Every `tool_use` is answered by a `tool_result` in the very next (user) message.
            Kind::Anthropic => {
                let messages = body["messages"].as_array().unwrap().clone();
                let mut out = Vec::new();
                for (i, m) in messages.iter().enumerate() {
                    let blocks = m["content"].as_array().cloned().unwrap_or_default();
                    for b in blocks.iter().filter(|b| b["type"] == "tool_use") {
                        let id = b["id"].as_str().unwrap_or_default().to_string();
                        let next = messages.get(i + 1).filter(|n| n["role"] == "user");
                        let result = next
                            .and_then(|n| n["content"].as_array().cloned())
                            .unwrap_or_default()
                            .into_iter()
                            .find(|r| r["type"] == "tool_result" && r["tool_use_id"] == id.as_str())
                            .map(|r| text(&r["content"]));
                        out.push((id, result));
                    }
                }
                out
            }
            Kind::Responses => {
                let items = body["input"].as_array().unwrap().clone();
                items
                    .iter()
                    .enumerate()
                    .filter(|(_, it)| it["type"] == "function_call")
                    .map(|(i, c)| {
                        let id = c["call_id"].as_str().unwrap_or_default().to_string();
                        let result = items[i + 1..]
                            .iter()
                            .find(|o| {
                                o["type"] == "function_call_output" && o["call_id"] == id.as_str()
                            })
                            .map(|o| text(&o["output"]));
                        (id, result)
                    })
                    .collect()
            }
        }
    }
}

/// An SSE body of `type`-tagged JSON events (`event:` lines included, as Anthropic and the
/// Responses API send them).
fn typed_sse(events: &[serde_json::Value]) -> Reply {
    Reply::sse(
        events
            .iter()
            .map(|e| format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap()))
            .collect::<String>(),
    )
}

/// A cancel with a pending shell call stores the turn; the next turn's request, in the
/// provider's own format, has a result for every tool call.
async fn cancel_with_a_pending_call_then_a_next_turn(transport: Transport, kind: Kind) {
    let ws = tempfile::tempdir().unwrap();
    let h = harness_with(
        vec![
            kind.tool_reply("s1", "run_terminal_cmd", r#"{"command":"sleep 100"}"#),
            kind.text_reply("Fine."),
        ],
        |c| c.providers.get_mut("fake").unwrap().kind = kind.provider_kind(),
    )
    .await;
    let mut client = FakeCursor::new(ws.path());
    client.shell_gate = Some(ws.path().join("never"));
    let conv = format!("conv-cxp-{kind:?}");
    let first = run_request(OURS, &conv, "run it", false);
    let id = format!("req-cxp-1-{transport:?}-{kind:?}");
    let mut conn = Conn::open(&h, transport, &id, &first).await;
    conn.hold_shell_close = true;
    let mut messages = Vec::new();
    assert!(conn
        .drive(&mut client, &mut messages, is_shell_exec)
        .await
        .is_none());
    conn.send(&cancel()).await;
    let end = conn
        .drive(&mut client, &mut messages, |_| false)
        .await
        .unwrap();
    assert_eq!(end.error.unwrap().code, Code::Canceled);
    assert!(client.checkpoint.is_some(), "the canceled turn is stored");
    let next = with_state(
        run_request(OURS, &conv, "never mind", false),
        client.checkpoint.clone(),
    );
    let id = format!("req-cxp-2-{transport:?}-{kind:?}");
    let (messages, end) = turn(&h, transport, &id, &next, &mut client).await;
    assert!(
        end.error.is_none(),
        "{transport:?} {kind:?}: {:?}",
        end.error
    );
    assert_eq!(text_of(&messages), "Fine.");
    let pairs = kind.calls_and_results(&h, 1);
    assert_eq!(pairs.len(), 1, "{kind:?}: {pairs:?}");
    assert_eq!(pairs[0].0, "s1");
    let result = pairs[0].1.as_deref().unwrap_or_else(|| {
        panic!(
            "{kind:?}: the call has no result: {}",
            h.provider.requests()[1].json()
        )
    });
    assert!(result.contains("interrupted"), "{kind:?}: {result}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_with_a_pending_call_then_a_next_turn_over_h2_run() {
    cancel_with_a_pending_call_then_a_next_turn(Transport::H2, Kind::Chat).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_with_a_pending_call_then_a_next_turn_over_run_sse_and_bidi_append() {
    cancel_with_a_pending_call_then_a_next_turn(Transport::Sse, Kind::Chat).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_with_a_pending_call_then_a_next_turn_on_anthropic_messages() {
    cancel_with_a_pending_call_then_a_next_turn(Transport::H2, Kind::Anthropic).await;
    cancel_with_a_pending_call_then_a_next_turn(Transport::Sse, Kind::Anthropic).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_with_a_pending_call_then_a_next_turn_on_openai_responses() {
    cancel_with_a_pending_call_then_a_next_turn(Transport::H2, Kind::Responses).await;
    cancel_with_a_pending_call_then_a_next_turn(Transport::Sse, Kind::Responses).await
}
