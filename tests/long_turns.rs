//! Turns that last for hours, on tokio's paused clock (no real waiting), through the real proxy
//! on both agent transports: one tool round whose shell command runs for three hours while the
//! client sends what Cursor sends meanwhile (a client heartbeat every 5 s, an exec heartbeat
//! every 3 s), then its output; the turn must finish with the tool's result reaching the model.
//!
//! Time only moves when every task waits. A metronome task ticking every few milliseconds
//! bounds each jump, so a reply in flight between two sockets on loopback is never overtaken by
//! a timer that would not have fired in real time.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::time::Duration;

use bytes::Bytes;
use common::agent_client::{
    client_heartbeat, frame, request_context_answer, run_request, Bidi, H2Run, Received,
    ServerStream, Store,
};
use common::fake_provider::Reply;
use cursor_byok::connect::EndStream;
use cursor_byok::proto::agent::v1 as pb;
use harness::{Harness, OURS};
use pb::agent_client_message::Message as In;
use pb::agent_server_message::Message as Server;
use pb::exec_client_control_message::Message as Control;
use pb::exec_server_message::Message as X;
use tokio::sync::mpsc;
use tokio::time::Instant;

const KEY: &str = "sk-test-long-turns";
const THREE_HOURS: Duration = Duration::from_secs(3 * 3600);
const TOOL_OUTPUT: &str = "build finished after three hours";

/// The proxy with the product's own timings (heartbeat 5 s, client timeout 30 s).
async fn harness(replies: Vec<Reply>) -> Harness {
    harness::harness_keyed(replies, KEY, |c| {
        c.agent.heartbeat_secs = 5;
        c.agent.kv_timeout_secs = 30;
        c.agent.provider_idle_timeout_secs = 120;
    })
    .await
}

fn shell_call(command: &str, timeout_secs: u64) -> Reply {
    let args = serde_json::json!({ "command": command, "timeout": timeout_secs }).to_string();
    let start = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_build","type":"function","function":{"name":"run_terminal_cmd","arguments":""}}]}}]});
    let body = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":args}}]}}]});
    Reply::sse(format!(
        "data: {start}\n\ndata: {body}\n\n\
         data: {{\"id\":\"c\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"tool_calls\"}}]}}\n\n\
         data: {{\"id\":\"c\",\"choices\":[],\"usage\":{{\"prompt_tokens\":50,\"completion_tokens\":10}}}}\n\ndata: [DONE]\n\n"
    ))
}

fn text_reply(text: &str) -> Reply {
    let delta = serde_json::json!({"id":"t","choices":[{"index":0,"delta":{"content":text}}]});
    Reply::sse(format!(
        "data: {delta}\n\ndata: {{\"id\":\"t\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n\
         data: {{\"id\":\"t\",\"choices\":[],\"usage\":{{\"prompt_tokens\":80,\"completion_tokens\":5}}}}\n\ndata: [DONE]\n\n"
    ))
}

/// Where the client's messages go; cheap to clone into the long command's task.
#[derive(Clone)]
enum Out {
    H2(mpsc::Sender<Bytes>),
    Bidi(Bidi),
}

impl Out {
    async fn send(&self, m: pb::AgentClientMessage) {
        match self {
            // The run may have ended already (the request body is gone then).
            Out::H2(tx) => {
                let _ = tx.send(frame(&m)).await;
            }
            Out::Bidi(b) => b.send(&m).await,
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    H2,
    Sse,
}

async fn open(
    h: &Harness,
    transport: Transport,
    first: &pb::AgentClientMessage,
) -> (ServerStream, Out) {
    let door = h.connect_door();
    match transport {
        Transport::H2 => {
            let H2Run { tx, stream } = H2Run::open(&door, "req-long-h2", first).await;
            (stream, Out::H2(tx))
        }
        Transport::Sse => {
            let bidi = Bidi::new(&door, "req-long-sse");
            // Append 0 first and answered: the run is ours before its reader asks.
            bidi.send(first).await;
            (bidi.open_sse().await, Out::Bidi(bidi))
        }
    }
}

fn exec_result(id: u32, exec_id: &str, event: pb::shell_stream::Event) -> pb::AgentClientMessage {
    pb::AgentClientMessage {
        message: Some(In::ExecClientMessage(pb::ExecClientMessage {
            id,
            exec_id: exec_id.into(),
            message: Some(pb::exec_client_message::Message::ShellStream(
                pb::ShellStream { event: Some(event) },
            )),
            ..Default::default()
        })),
    }
}

fn control(m: Control) -> pb::AgentClientMessage {
    pb::AgentClientMessage {
        message: Some(In::ExecClientControlMessage(pb::ExecClientControlMessage {
            message: Some(m),
        })),
    }
}

/// Cursor running a command for `runs_for`: its start at once, an exec heartbeat every 3 s and
/// a client heartbeat every 5 s meanwhile, then its output, exit and close.
async fn long_command(out: Out, id: u32, exec_id: String, runs_for: Duration) {
    use pb::shell_stream::Event;
    out.send(exec_result(id, &exec_id, Event::Start(Default::default())))
        .await;
    let end = Instant::now() + runs_for;
    let mut exec_beat = tokio::time::interval(Duration::from_secs(3));
    let mut client_beat = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(end) => break,
            _ = exec_beat.tick() => out.send(control(Control::Heartbeat(pb::ExecClientHeartbeat { id }))).await,
            _ = client_beat.tick() => out.send(client_heartbeat()).await,
        }
    }
    let stdout = pb::ShellStreamStdout {
        data: format!("{TOOL_OUTPUT}\n"),
    };
    out.send(exec_result(id, &exec_id, Event::Stdout(stdout)))
        .await;
    let exit = pb::ShellStreamExit {
        code: 0,
        cwd: "/tmp/inline-ws".into(),
        ..Default::default()
    };
    out.send(exec_result(id, &exec_id, Event::Exit(exit))).await;
    out.send(control(Control::StreamClose(pb::ExecClientStreamClose {
        id,
    })))
    .await;
}

/// Play the client to the end frame, running every shell exec as a command of `runs_for`.
async fn play_long(
    stream: &mut ServerStream,
    out: &Out,
    store: &Store,
    runs_for: Duration,
) -> (Vec<pb::AgentServerMessage>, EndStream) {
    let mut messages = Vec::new();
    loop {
        let m = match stream.next().await {
            Some(Received::Message(m)) => m,
            Some(Received::End(end)) => return (messages, end),
            None => panic!("the stream ended without an end frame after {messages:#?}"),
        };
        match &m.message {
            Some(Server::ExecServerMessage(e)) => match &e.message {
                Some(X::RequestContextArgs(_)) => {
                    let (result, close) = request_context_answer(e.id, &e.exec_id);
                    out.send(result).await;
                    out.send(close).await;
                }
                Some(X::ShellStreamArgs(_)) => {
                    tokio::spawn(long_command(out.clone(), e.id, e.exec_id.clone(), runs_for));
                }
                other => panic!("unexpected exec {other:?}"),
            },
            Some(Server::KvServerMessage(kv)) => {
                if let Some(answer) = store.answer(kv) {
                    out.send(answer).await;
                }
            }
            _ => {}
        }
        messages.push(*m);
    }
}

async fn three_hour_tool_round(transport: Transport) {
    let _metronome = common::metronome();
    let h = harness(vec![
        shell_call("make all", 4 * 3600),
        text_reply("The build is done."),
    ])
    .await;
    let started = Instant::now();
    let first = run_request(OURS, &format!("conv-long-{transport:?}"), "build it", true);
    let (mut stream, out) = open(&h, transport, &first).await;
    let (messages, end) = play_long(&mut stream, &out, &Store::default(), THREE_HOURS).await;
    assert!(end.error.is_none(), "{transport:?}: {:?}", end.error);
    assert!(
        started.elapsed() >= THREE_HOURS,
        "the turn lasted the command's three hours ({:?})",
        started.elapsed()
    );
    // The tool's output reached the model in its second request.
    let requests = h.provider.requests();
    assert_eq!(requests.len(), 2, "{transport:?}");
    let tool_messages: Vec<String> = requests[1].json()["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .map(|m| m["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(tool_messages.len(), 1);
    assert!(
        tool_messages[0].contains(TOOL_OUTPUT),
        "{transport:?}: {tool_messages:?}"
    );
    assert_eq!(
        common::agent_client::text_of(&messages),
        "The build is done."
    );
    // The server spoke all along (the client drops a stream silent for 30 s).
    let heartbeats = messages
        .iter()
        .filter(|m| {
            matches!(&m.message, Some(Server::InteractionUpdate(u))
                if matches!(u.message, Some(pb::interaction_update::Message::Heartbeat(_))))
        })
        .count();
    assert!(
        heartbeats as u64 >= THREE_HOURS.as_secs() / 30,
        "{heartbeats} heartbeats in three hours"
    );
    h.assert_nothing_relayed();
}

#[tokio::test(start_paused = true)]
async fn a_three_hour_tool_round_finishes_over_run_sse_and_bidi_append() {
    three_hour_tool_round(Transport::Sse).await;
}

#[tokio::test(start_paused = true)]
async fn a_three_hour_tool_round_finishes_over_h2_run() {
    three_hour_tool_round(Transport::H2).await;
}

/// The finished run of `request_id` on the status page: (outcome, error).
fn record(h: &Harness, request_id: &str) -> (String, String) {
    let recent = h.server.status().snapshot().recent;
    let rec = recent
        .iter()
        .find(|r| r.run_id == cursor_byok::status::run_id(request_id))
        .unwrap_or_else(|| panic!("{request_id} is recorded: {recent:?}"));
    (
        rec.outcome.clone().unwrap_or_default(),
        rec.error.clone().unwrap_or_default(),
    )
}

async fn wait_recorded(h: &Harness, request_id: &str) {
    for _ in 0..600 {
        let snap = h.server.status().snapshot();
        if snap
            .recent
            .iter()
            .any(|r| r.run_id == cursor_byok::status::run_id(request_id))
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{request_id} never finished");
}

fn slow_text() -> Reply {
    // A model that starts, then says nothing more: the run stays alive without the client.
    Reply::sse(harness::partial("thinking")).then(common::fake_provider::After::Stall)
}

/// Our run on RunSSE + BidiAppend (append 0 sent) whose model then goes silent.
async fn stalled_run(tag: &str) -> (Harness, Bidi) {
    let h = harness(vec![slow_text()]).await;
    let bidi = Bidi::new(&h.connect_door(), &format!("req-{tag}"));
    bidi.send(&run_request(OURS, &format!("conv-{tag}"), "hi", true))
        .await;
    (h, bidi)
}

/// A heartbeat appended after the run ended: the answer.
async fn late_heartbeat(bidi: &Bidi) -> common::agent_client::Answer {
    let seqno = bidi.seqno();
    bidi.append_body(bidi.append_bytes(seqno, &client_heartbeat()))
        .await
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_leaves_for_good_ends_the_run_blaming_the_client() {
    let _metronome = common::metronome();
    let (h, bidi) = stalled_run("leaves").await;
    let mut sse = bidi.open_sse().await;
    assert!(matches!(sse.next().await, Some(Received::Message(_))));
    drop(sse);
    wait_recorded(&h, "req-leaves").await;
    let (outcome, error) = record(&h, "req-leaves");
    assert_eq!(outcome, "error");
    assert!(
        error.contains("client went away") && error.contains("RunSSE stream closed"),
        "{error}"
    );
}

#[tokio::test(start_paused = true)]
async fn a_run_whose_reader_never_comes_ends_and_its_appends_then_get_an_error() {
    let _metronome = common::metronome();
    let (h, bidi) = stalled_run("no-reader").await;
    wait_recorded(&h, "req-no-reader").await;
    let (outcome, error) = record(&h, "req-no-reader");
    assert_eq!(outcome, "error");
    assert!(error.contains("no RunSSE stream came"), "{error}");
    // The run ended: an append is refused with a reason, not answered OK and dropped.
    let answer = late_heartbeat(&bidi).await;
    assert_ne!(answer.status, http::StatusCode::OK);
    let body = String::from_utf8_lossy(&answer.body);
    assert!(body.contains("has already ended"), "{body}");
}

#[tokio::test(start_paused = true)]
async fn appends_after_a_finished_and_forgotten_run_get_an_error() {
    let _metronome = common::metronome();
    let h = harness(vec![text_reply("done")]).await;
    let door = h.connect_door();
    let bidi = Bidi::new(&door, "req-done");
    bidi.send(&run_request(OURS, "conv-done", "hi", true)).await;
    let mut sse = bidi.open_sse().await;
    let out = Out::Bidi(bidi.clone());
    let (_, end) = play_long(&mut sse, &out, &Store::default(), Duration::ZERO).await;
    assert!(end.error.is_none(), "{:?}", end.error);
    drop(sse);
    // An hour later, a straggling append of that run.
    tokio::time::sleep(Duration::from_secs(3600)).await;
    let answer = late_heartbeat(&bidi).await;
    assert_eq!(answer.status, http::StatusCode::NOT_FOUND);
    let body = String::from_utf8_lossy(&answer.body);
    assert!(
        body.contains("not_found") && body.contains("has already ended"),
        "{body}"
    );
    // A late reader is told the same in its end frame.
    let mut late = bidi.open_sse().await;
    match late.next().await {
        Some(Received::End(end)) => {
            let err = end.error.expect("an error end frame");
            assert!(err.message.contains("has already ended"), "{}", err.message);
        }
        other => panic!("expected an end frame, got {other:?}"),
    }
    h.assert_nothing_relayed();
}
