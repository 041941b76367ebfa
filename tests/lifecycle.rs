//! A run's lifecycle through the real proxy, on both agent transports: a client that leaves
//! mid-run (during streamed text, a tool round, the checkpoint's KV writes) ends its run within
//! the reader grace plus the wind-down, with nothing left active or running; a reader that
//! reconnects within the grace drains the run to its end; and runs are routed fail-closed: a
//! late deciding message is still ours, and a resume after a restart follows the conversation's
//! durable pin (ours stays ours, Cursor's is still relayed).
//!
//! The timing tests run on tokio's paused clock: time only moves when every task waits, and a
//! metronome bounds each jump so a reply in flight on loopback is never overtaken by a timer
//! that would not have fired in real time.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::time::Duration;

use common::agent_client::{
    frame, play, resume_request, run_request, text_of, Bidi, H2Run, Received, ServerStream, Sink,
    Store, RUN,
};
use common::client::{self, Alpn};
use common::cursor_upstream::{relay_reply_bytes, AGENT_RUN};
use common::fake_provider::{text_sse, tool_sse, After, Reply};
use cursor_byok::connect::Code;
use cursor_byok::proto::agent::v1 as pb;
use cursor_byok::proto::aiserver::v1 as ai;
use harness::{Harness, CURSORS, OURS};
use pb::agent_server_message::Message as Server;
use tokio::time::Instant;

const KEY: &str = "sk-test-lifecycle";
/// How long the proxy waits for a RunSSE reader to come back (`bidi::READER_GRACE`).
const READER_GRACE: Duration = Duration::from_secs(5);
/// How long a canceled run's output may wait for room (`run::WIND_DOWN`).
const WIND_DOWN: Duration = Duration::from_secs(5);

async fn harness(replies: Vec<Reply>) -> Harness {
    harness::harness_keyed(replies, KEY, |c| {
        // Long enough that only the client's leaving can end a run waiting on it.
        c.agent.kv_timeout_secs = 120;
        c.agent.provider_idle_timeout_secs = 120;
    })
    .await
}

/// A model that streams `n` text deltas (far more frames than any buffer on the way holds) and
/// then keeps its stream open, noticing when the proxy hangs up.
fn endless_text(n: usize) -> Reply {
    let mut body = String::new();
    for i in 0..n {
        let delta = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"content":format!("w{i} ")}}]});
        body += &format!("data: {delta}\n\n");
    }
    Reply::sse(body).then(After::Trickle(Duration::from_millis(500)))
}

/// A model that streams `n` reasoning deltas of about a kilobyte (more than a closed
/// connection's socket buffers swallow) and then keeps its stream open: each delta stays a
/// frame of its own on the way (only text and token deltas queued together are merged).
fn endless_thinking(n: usize) -> Reply {
    let mut body = String::new();
    for i in 0..n {
        let words = format!("t{i} ").repeat(200);
        let delta = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"reasoning_content":words}}]});
        body += &format!("data: {delta}\n\n");
    }
    Reply::sse(body).then(After::Trickle(Duration::from_millis(500)))
}

fn is_thinking(m: &pb::AgentServerMessage) -> bool {
    use pb::interaction_update::Message as Update;
    matches!(&m.message, Some(Server::InteractionUpdate(u))
        if matches!(u.message, Some(Update::ThinkingDelta(_))))
}

/// A model that streams `n` text deltas, one per write `every` apart, and finishes.
fn long_text(n: usize, every: Duration) -> (Reply, String) {
    let mut body = String::new();
    let mut text = String::new();
    let mut event_len = 0;
    for i in 0..n {
        let t = format!("w{i:05} ");
        text += &t;
        let delta = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"content":t}}]});
        let event = format!("data: {delta}\n\n");
        event_len = event.len(); // fixed-width words: every event has this length
        body += &event;
    }
    body += "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n";
    body += "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":9,\"completion_tokens\":9}}\n\ndata: [DONE]\n\n";
    (Reply::sse(body).chunked(event_len).delay(every), text)
}

fn shell_call() -> Reply {
    Reply::sse(tool_sse(&[(
        "call_sleep",
        "run_terminal_cmd",
        r#"{"command":"sleep 1000"}"#,
    )]))
}

#[derive(Clone, Copy, Debug)]
enum Transport {
    H2,
    Sse,
}

/// The live tasks of this runtime.
fn tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// Wait (virtual time) until the runtime has at most `baseline` live tasks; the count reached.
async fn settle_tasks(baseline: usize, within: Duration) -> usize {
    let deadline = Instant::now() + within;
    loop {
        let n = tasks();
        if n <= baseline || Instant::now() >= deadline {
            return n;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The finished run of `request_id` (outcome, error), once the status page has it.
async fn wait_recorded(h: &Harness, request_id: &str, within: Duration) -> (String, String) {
    let deadline = Instant::now() + within;
    loop {
        let snap = h.server.status().snapshot();
        if let Some(r) = snap
            .recent
            .iter()
            .find(|r| r.run_id == cursor_byok::status::run_id(request_id))
        {
            return (
                r.outcome.clone().unwrap_or_default(),
                r.error.clone().unwrap_or_default(),
            );
        }
        assert!(
            Instant::now() < deadline,
            "{request_id} still not finished after {within:?}: active {:?}",
            snap.active
                .iter()
                .map(|a| a.run_id.clone())
                .collect::<Vec<_>>()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// One complete run on `transport`, so that every pool and background task a run leaves
/// behind by design (the provider's idle connection, the pairing sweeper) exists before the
/// baseline is taken.
async fn warm_up(h: &Harness, transport: Transport) {
    h.provider.push(Reply::sse(text_sse("warm")));
    let store = Store::default();
    let door = h.connect_door();
    let t = match transport {
        Transport::H2 => {
            let mut run = H2Run::open(
                &door,
                "req-warm",
                &run_request(OURS, "conv-warm", "hi", true),
            )
            .await;
            play(&mut run.stream, Sink::H2(&run.tx), &store).await
        }
        Transport::Sse => {
            let bidi = Bidi::new(&door, "req-warm");
            bidi.send(&run_request(OURS, "conv-warm", "hi", true)).await;
            let mut sse = bidi.open_sse().await;
            play(&mut sse, Sink::Bidi(&bidi), &store).await
        }
    };
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    wait_recorded(h, "req-warm", Duration::from_secs(10)).await;
    // Connections of the warm-up close; the grace and linger timers run out.
    tokio::time::sleep(Duration::from_secs(70)).await;
}

/// Read `stream` until `stop` accepts a message (answering nothing).
async fn read_until(
    mut stream: ServerStream,
    stop: &mut impl FnMut(&pb::AgentServerMessage) -> bool,
) -> ServerStream {
    loop {
        match stream.next().await {
            Some(Received::Message(m)) if stop(&m) => return stream,
            Some(Received::Message(_)) => {}
            other => panic!("the run ended before the client left: {other:?}"),
        }
    }
}

/// A client's hold on a run: dropping it closes its response body and connection, as a
/// closed window does.
type Held = Box<dyn std::any::Any>;

/// Start `first` on `transport` and read until `stop` accepts a message (answering nothing).
async fn open_and_read(
    h: &Harness,
    transport: Transport,
    request_id: &str,
    first: &pb::AgentClientMessage,
    mut stop: impl FnMut(&pb::AgentServerMessage) -> bool,
) -> Held {
    let door = h.connect_door();
    match transport {
        Transport::H2 => {
            let H2Run { tx, stream } = H2Run::open(&door, request_id, first).await;
            let stream = read_until(stream, &mut stop).await;
            Box::new((stream, tx))
        }
        Transport::Sse => {
            let bidi = Bidi::new(&door, request_id);
            bidi.send(first).await;
            let sse = bidi.open_sse().await;
            let sse = read_until(sse, &mut stop).await;
            Box::new((sse, bidi))
        }
    }
}

/// Start our run on `transport`, read until `stop` accepts a message, then leave. Returns
/// when the client left.
async fn run_and_leave(
    h: &Harness,
    transport: Transport,
    request_id: &str,
    stop: impl FnMut(&pb::AgentServerMessage) -> bool,
) -> Instant {
    let first = run_request(OURS, &format!("conv-{request_id}"), "go on", true);
    drop(open_and_read(h, transport, request_id, &first, stop).await);
    Instant::now()
}

/// The run of `request_id`, whose client left at `left`, ends blaming the client within the
/// grace and the wind-down; nothing stays active, and the tasks are back at `baseline`.
async fn assert_ended_cleanly(h: &Harness, request_id: &str, left: Instant, baseline: usize) {
    let bound = READER_GRACE + WIND_DOWN + Duration::from_secs(1);
    let (outcome, error) = wait_recorded(h, request_id, bound).await;
    let took = left.elapsed();
    assert!(
        took <= bound,
        "the run ended {took:?} after its client left"
    );
    assert_eq!(outcome, "error", "{error}");
    assert!(error.contains("went away"), "{error}");
    assert!(h.wait_no_active_runs(Duration::from_secs(1)).await);
    let n = settle_tasks(baseline, Duration::from_secs(30)).await;
    assert!(n <= baseline, "{n} tasks alive, {baseline} before the run");
    assert_nothing_held(h, Duration::from_secs(120)).await;
}

/// The HTTP/1.1 transport lets go of everything of the ended runs: no request id paired, no
/// append or output bytes held (after the linger for a late reader).
async fn assert_nothing_held(h: &Harness, within: Duration) {
    let deadline = Instant::now() + within;
    loop {
        let p = h.server.agent_pairing();
        if p == Default::default() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "still held after {within:?}: {p:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn leaves_during(
    transport: Transport,
    reply: Reply,
    tag: &str,
    stop: impl FnMut(&pb::AgentServerMessage) -> bool,
) -> Harness {
    let _metronome = common::metronome();
    let h = harness(vec![]).await;
    warm_up(&h, transport).await;
    let baseline = tasks();
    h.provider.push(reply);
    let request_id = format!("req-{tag}-{transport:?}");
    let left = run_and_leave(&h, transport, &request_id, stop).await;
    assert_ended_cleanly(&h, &request_id, left, baseline).await;
    h.assert_nothing_relayed();
    h
}

fn is_text(m: &pb::AgentServerMessage) -> bool {
    !text_of(std::slice::from_ref(m)).is_empty()
}

fn is_shell_exec(m: &pb::AgentServerMessage) -> bool {
    matches!(&m.message, Some(Server::ExecServerMessage(e))
        if matches!(e.message, Some(pb::exec_server_message::Message::ShellStreamArgs(_))
            | Some(pb::exec_server_message::Message::ShellArgs(_))))
}

fn is_kv(m: &pb::AgentServerMessage) -> bool {
    matches!(&m.message, Some(Server::KvServerMessage(_)))
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_leaves_during_streamed_text_ends_the_run_over_run_sse() {
    let h = leaves_during(Transport::Sse, endless_text(3000), "text", is_text).await;
    assert!(
        h.provider.wait_hangups(1, Duration::from_secs(5)).await,
        "the provider's stream was closed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_leaves_during_streamed_text_ends_the_run_over_h2_run() {
    let h = leaves_during(Transport::H2, endless_text(3000), "text", is_text).await;
    assert!(
        h.provider.wait_hangups(1, Duration::from_secs(5)).await,
        "the provider's stream was closed"
    );
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_leaves_during_a_tool_round_ends_the_run_over_run_sse() {
    leaves_during(Transport::Sse, shell_call(), "tool", is_shell_exec).await;
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_leaves_during_a_tool_round_ends_the_run_over_h2_run() {
    leaves_during(Transport::H2, shell_call(), "tool", is_shell_exec).await;
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_leaves_during_kv_writes_ends_the_run_over_run_sse() {
    leaves_during(Transport::Sse, Reply::sse(text_sse("stored?")), "kv", is_kv).await;
}

#[tokio::test(start_paused = true)]
async fn a_reader_that_leaves_during_kv_writes_ends_the_run_over_h2_run() {
    leaves_during(Transport::H2, Reply::sse(text_sse("stored?")), "kv", is_kv).await;
}

/// The parent waits on a subagent whose child run streams; the client leaves both: both runs
/// end within the grace and the wind-down, and nothing is left behind.
async fn leaves_during_a_subagent(transport: Transport) {
    let _metronome = common::metronome();
    let h = harness(vec![]).await;
    warm_up(&h, transport).await;
    let baseline = tasks();
    let call = r#"{"description":"look around","prompt":"Find it.","subagent_type":"explore"}"#;
    h.provider
        .push(Reply::sse(tool_sse(&[("call_t", "task", call)])));
    h.provider.push(endless_text(3000));
    let parent_id = format!("req-parent-{transport:?}");
    let child_id = format!("req-child-{transport:?}");
    let is_subagent = |m: &pb::AgentServerMessage| {
        matches!(&m.message, Some(Server::ExecServerMessage(e))
            if matches!(e.message, Some(pb::exec_server_message::Message::SubagentArgs(_))))
    };
    let parent_first = run_request(OURS, &format!("conv-{parent_id}"), "delegate", true);
    let parent = open_and_read(&h, transport, &parent_id, &parent_first, is_subagent).await;
    let child_first = run_request(OURS, &format!("conv-{child_id}"), "Find it.", true);
    let child = open_and_read(&h, transport, &child_id, &child_first, is_text).await;
    drop(parent);
    drop(child);
    let left = Instant::now();
    let bound = READER_GRACE + WIND_DOWN + Duration::from_secs(1);
    for id in [&parent_id, &child_id] {
        let (outcome, error) = wait_recorded(&h, id, bound).await;
        assert_eq!(outcome, "error", "{id}: {error}");
        assert!(error.contains("went away"), "{id}: {error}");
    }
    assert!(
        left.elapsed() <= bound,
        "ended {:?} after the client left",
        left.elapsed()
    );
    assert!(h.wait_no_active_runs(Duration::from_secs(1)).await);
    let n = settle_tasks(baseline, Duration::from_secs(30)).await;
    assert!(n <= baseline, "{n} tasks alive, {baseline} before the runs");
    assert_nothing_held(&h, Duration::from_secs(120)).await;
    assert!(h.provider.wait_hangups(1, Duration::from_secs(5)).await);
    h.assert_nothing_relayed();
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_during_a_subagent_ends_both_runs_over_run_sse() {
    leaves_during_a_subagent(Transport::Sse).await;
}

#[tokio::test(start_paused = true)]
async fn a_client_that_leaves_during_a_subagent_ends_both_runs_over_h2_run() {
    leaves_during_a_subagent(Transport::H2).await;
}

/// The reader drops its RunSSE mid-stream and a new one comes within the grace: the run goes
/// on and the new reader gets the rest of it, to its end (answering the checkpoint's KV
/// writes). Frames a dead connection's kernel buffers swallowed cannot be known without an
/// offset from the client (RunSSE carries none), so only a tail is asserted.
#[tokio::test(start_paused = true)]
async fn a_reader_that_reconnects_within_the_grace_drains_the_run_to_its_end() {
    let _metronome = common::metronome();
    let (reply, full) = long_text(1000, Duration::from_millis(10));
    let h = harness(vec![reply]).await;
    let store = Store::default();
    let bidi = Bidi::new(&h.connect_door(), "req-reconnect");
    bidi.send(&run_request(OURS, "conv-reconnect", "hi", true))
        .await;
    let mut sse = bidi.open_sse().await;
    let mut seen = 0;
    while seen < 20 {
        if let Some(Received::Message(m)) = sse.next().await {
            seen += usize::from(is_text(&m));
        }
    }
    drop(sse);
    // While nobody reads, the run's output fills up and its inbox with it: appends sent now
    // wait for the run, and must not keep the returning reader out.
    let heartbeats: Vec<_> = (0..80)
        .map(|_| bidi.spawn_append(bidi.seqno(), common::agent_client::client_heartbeat()))
        .collect();
    tokio::time::sleep(READER_GRACE / 2).await;
    let mut sse = bidi.open_sse().await;
    let t = play(&mut sse, Sink::Bidi(&bidi), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    let rest = t.text();
    assert!(
        !rest.is_empty() && full.ends_with(&rest) && rest.len() < full.len(),
        "the second reader got {} of {} bytes, not a tail",
        rest.len(),
        full.len()
    );
    for hb in heartbeats {
        hb.await.unwrap();
    }
    let (outcome, _) = wait_recorded(&h, "req-reconnect", Duration::from_secs(5)).await;
    assert_eq!(outcome, "ok");
    assert!(h.wait_no_active_runs(Duration::from_secs(1)).await);
    h.assert_nothing_relayed();
}

/// The reader leaves while the model streams fast: the run's output fills up, then its inbox
/// with the client's heartbeats, and appends wait on the run. A reader that comes back within
/// the grace is answered at once and drains the run, which takes the waiting appends again.
#[tokio::test(start_paused = true)]
async fn a_returning_reader_is_not_kept_out_by_appends_waiting_on_a_full_run() {
    let _metronome = common::metronome();
    let h = harness(vec![endless_thinking(3000)]).await;
    let bidi = Bidi::new(&h.connect_door(), "req-full");
    let first = run_request(OURS, "conv-full", "hi", true);
    let sse = open_and_read(&h, Transport::Sse, "req-full", &first, is_thinking).await;
    drop(sse);
    // The paused clock moves only once every task waits: the run has filled its output.
    tokio::time::sleep(READER_GRACE / 4).await;
    bidi.seqno(); // append 0 went out on the helper's own `Bidi`
    let heartbeats: Vec<_> = (0..100)
        .map(|_| bidi.spawn_append(bidi.seqno(), common::agent_client::client_heartbeat()))
        .collect();
    tokio::time::sleep(READER_GRACE / 2).await;
    assert!(
        heartbeats.iter().any(|hb| !hb.is_finished()),
        "the run is full: some appends wait on it"
    );
    // `open_sse` fails if the answer's head takes longer than a step.
    let mut sse = bidi.open_sse().await;
    let mut read = 0;
    while heartbeats.iter().any(|hb| !hb.is_finished()) {
        assert!(
            matches!(sse.next().await, Some(Received::Message(_))),
            "the run goes on"
        );
        read += 1;
        assert!(read < 6000, "the waiting appends were never taken");
    }
    for hb in heartbeats {
        hb.await.unwrap();
    }
    drop(sse);
    let (outcome, error) = wait_recorded(
        &h,
        "req-full",
        READER_GRACE + WIND_DOWN + Duration::from_secs(1),
    )
    .await;
    assert_eq!(outcome, "error", "{error}");
    assert!(h.wait_no_active_runs(Duration::from_secs(1)).await);
    h.assert_nothing_relayed();
}

/// RunSSE first, its append 0 (naming our model) `late`: the run is ours, answered by our
/// provider, and nothing reaches Cursor.
async fn late_append_0_is_ours(late: Duration, tag: &str) {
    let _metronome = common::metronome();
    let h = harness(vec![Reply::sse(harness::TEXT_SSE)]).await;
    let request_id = format!("req-late-{tag}");
    let bidi = Bidi::new(&h.connect_door(), &request_id);
    let body = frame(&ai::BidiRequestId {
        request_id: request_id.clone(),
    });
    let reader = {
        let bidi = bidi.clone();
        tokio::spawn(async move { bidi.sse_request(body).await })
    };
    tokio::time::sleep(late).await;
    assert!(!reader.is_finished(), "the RunSSE waits for its append 0");
    bidi.send(&run_request(OURS, &format!("conv-late-{tag}"), "hi", true))
        .await;
    let (resp, conn) = reader.await.unwrap();
    let mut sse = ServerStream::new(resp, Some(conn));
    let t = play(&mut sse, Sink::Bidi(&bidi), &Store::default()).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), harness::TEXT);
    assert_eq!(h.provider.requests().len(), 1);
    h.assert_nothing_relayed();
}

#[tokio::test(start_paused = true)]
async fn a_run_sse_whose_append_0_is_3s_late_is_ours() {
    late_append_0_is_ours(Duration::from_secs(3), "3s").await;
}

#[tokio::test(start_paused = true)]
async fn a_run_sse_whose_append_0_is_30s_late_is_ours() {
    late_append_0_is_ours(Duration::from_secs(30), "30s").await;
}

/// An HTTP/2 `Run` whose first frame (naming our model) comes `late`: ours.
async fn late_first_frame_is_ours(late: Duration, tag: &str) {
    let _metronome = common::metronome();
    let h = harness(vec![Reply::sse(harness::TEXT_SSE)]).await;
    let door = h.connect_door();
    let mut conn = door.connect(Alpn::H2).await;
    let (tx, body) = client::channel_body();
    let req = common::agent_client::connect_request(
        RUN,
        "application/connect+proto",
        &format!("req-late-h2-{tag}"),
        body,
    );
    let authority = door.authority();
    let answer = tokio::spawn(async move {
        let resp = conn.send(&authority, req).await.expect("answered");
        (resp, conn)
    });
    tokio::time::sleep(late).await;
    tx.send(frame(&run_request(
        OURS,
        &format!("conv-late-h2-{tag}"),
        "hi",
        true,
    )))
    .await
    .unwrap();
    let (resp, conn) = answer.await.unwrap();
    let mut stream = ServerStream::new(resp, Some(conn));
    let t = play(&mut stream, Sink::H2(&tx), &Store::default()).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), harness::TEXT);
    h.assert_nothing_relayed();
}

#[tokio::test(start_paused = true)]
async fn an_h2_run_whose_first_frame_is_3s_late_is_ours() {
    late_first_frame_is_ours(Duration::from_secs(3), "3s").await;
}

#[tokio::test(start_paused = true)]
async fn an_h2_run_whose_first_frame_is_30s_late_is_ours() {
    late_first_frame_is_ours(Duration::from_secs(30), "30s").await;
}

/// Append 1 arrives 3 s before append 0 (which names our model): both are ours, in order.
#[tokio::test(start_paused = true)]
async fn an_append_ahead_of_a_late_append_0_waits_for_it_and_is_ours() {
    let _metronome = common::metronome();
    let h = harness(vec![Reply::sse(harness::TEXT_SSE)]).await;
    let bidi = Bidi::new(&h.connect_door(), "req-ahead");
    let ahead = bidi.spawn_append(1, common::agent_client::client_heartbeat());
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(!ahead.is_finished(), "append 1 waits for append 0");
    bidi.append(0, &run_request(OURS, "conv-ahead", "hi", true))
        .await;
    ahead.await.unwrap();
    bidi.seqno();
    bidi.seqno();
    let mut sse = bidi.open_sse().await;
    let t = play(&mut sse, Sink::Bidi(&bidi), &Store::default()).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), harness::TEXT);
    h.assert_nothing_relayed();
}

/// Our run on `conversation` through `h`, played to its end; `store` keeps the checkpoint.
async fn our_turn(
    h: &Harness,
    request_id: &str,
    first: &pb::AgentClientMessage,
    store: &Store,
) -> String {
    let door = h.connect_door();
    let mut run = H2Run::open(&door, request_id, first).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    t.text()
}

/// A resume (no model) of a conversation of ours, on a new proxy over the same data dir, is
/// ours on both transports; a resume of a conversation on Cursor's model is still relayed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resumes_after_a_restart_follow_the_durable_pins() {
    let before = harness(vec![Reply::sse(text_sse("first"))]).await;
    let store = Store::default();
    let text = our_turn(
        &before,
        "req-before",
        &run_request(OURS, "conv-ours", "hello", true),
        &store,
    )
    .await;
    assert_eq!(text, "first");
    // A conversation on Cursor's model, relayed.
    let official = frame(&run_request(CURSORS, "conv-official", "hi", true));
    let H2Run { tx, stream } =
        H2Run::open_raw(&before.connect_door(), "req-official", official).await;
    drop(tx);
    assert_eq!(stream.raw_to_end().await, relay_reply_bytes());
    // The pins are written by a thread of their own: on disk before the next proxy reads them.
    before.server.agent_pins().flush();

    // The restart: a new proxy on the same data dir, nothing in memory.
    let dir = before.data_dir();
    let after = harness::harness_keyed(
        vec![
            Reply::sse(text_sse("resumed on h2")),
            Reply::sse(text_sse("resumed on sse")),
        ],
        KEY,
        |c| c.data_dir = Some(dir),
    )
    .await;
    let resumed = our_turn(
        &after,
        "req-resume-h2",
        &resume_request("conv-ours", store.conversation_state()),
        &store,
    )
    .await;
    assert_eq!(resumed, "resumed on h2");
    let bidi = Bidi::new(&after.connect_door(), "req-resume-sse");
    bidi.send(&resume_request("conv-ours", store.conversation_state()))
        .await;
    let mut sse = bidi.open_sse().await;
    let t = play(&mut sse, Sink::Bidi(&bidi), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), "resumed on sse");
    assert_eq!(after.provider.requests().len(), 2);
    after.assert_nothing_relayed();

    // Cursor's conversation, resumed after the restart: still Cursor's.
    let raw = frame(&resume_request("conv-official", Default::default()));
    let H2Run { tx, stream } =
        H2Run::open_raw(&after.connect_door(), "req-resume-official", raw.clone()).await;
    drop(tx);
    assert_eq!(stream.raw_to_end().await, relay_reply_bytes());
    let recorded = after
        .upstream
        .wait_recorded(AGENT_RUN, 1, Duration::from_secs(10))
        .await;
    assert_eq!(recorded[0].body, raw);
    assert_eq!(after.provider.requests().len(), 2);
}

/// A resume of a conversation nothing knows, over RunSSE: the reader and the append get a
/// clear error, and nothing goes to Cursor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resume_nothing_can_decide_ends_with_an_error_over_run_sse() {
    let h = harness(vec![]).await;
    let bidi = Bidi::new(&h.connect_door(), "req-unknown");
    let answer = bidi
        .append_body(bidi.append_bytes(0, &resume_request("conv-unknown", Default::default())))
        .await;
    assert_ne!(answer.status, http::StatusCode::OK);
    let body = String::from_utf8_lossy(&answer.body);
    assert!(body.contains("conv-unknown"), "{body}");
    let mut sse = bidi.open_sse().await;
    let Some(Received::End(end)) = sse.next().await else {
        panic!("an end frame")
    };
    let err = end.error.expect("an error");
    assert_eq!(err.code, Code::FailedPrecondition);
    assert!(err.message.contains("sent neither"), "{}", err.message);
    h.assert_nothing_relayed();
    assert!(h.provider.requests().is_empty());
}
