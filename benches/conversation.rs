//! Long conversations and busy days, through the real proxy (CONNECT door, HTTP/2
//! `Run`, in process) against a fake provider:
//!
//! - **turn start**: from sending the run request to the run's `step_started` (sent just before
//!   the provider request goes out), for 10, 100 and 1,000 steps of history: after a restart
//!   (every blob fetched from the client with `get_blob_args`) and with the blob cache warm;
//! - **turn end**: from the last `text_delta` of the model's final answer to `turn_ended`, for a
//!   turn with 1, 20 and 100 tool calls (every step blob written and acked first);
//! - **append cost** on a live HTTP/1.1 run with 0 and with 4,000 other request ids held.
//!
//! ```sh
//! taskset -c 0 cargo bench --bench conversation
//! ```
//! Knobs: `BENCH_ROUNDS` (warm samples per size, default 7), `BENCH_QUICK=1` (a smoke run).

#[path = "../tests/common/mod.rs"]
#[allow(dead_code, unused_imports)]
mod common;
#[path = "../tests/common/harness.rs"]
mod harness;
#[path = "support/mod.rs"]
#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use common::agent_client::{
    client_heartbeat, prewarm_request, run_request, text_of, Bidi, H2Run, Received, Store,
};
use common::fake_cursor::FakeCursor;
use common::fake_provider::Reply;
use cursor_byok::agent::state::{encode_turn, StepRecord, TurnRecord};
use cursor_byok::connect::encode_bidi_append;
use cursor_byok::proto::agent::v1 as pb;
use harness::{Harness, OURS};
use pb::agent_server_message::Message as Server;
use pb::interaction_update::Message as Update;
use prost::Message as _;
use support::env_or;

/// Steps per turn in the crafted history (a user message, then tool calls and answers).
const STEPS_PER_TURN: usize = 10;

fn text_sse(text: &str) -> Reply {
    let delta = serde_json::json!({"id":"t","choices":[{"index":0,"delta":{"content":text}}]});
    Reply::sse(format!(
        "data: {delta}\n\ndata: {{\"id\":\"t\",\"choices\":[{{\"index\":0,\"delta\":{{}},\"finish_reason\":\"stop\"}}]}}\n\n\
         data: {{\"id\":\"t\",\"choices\":[],\"usage\":{{\"prompt_tokens\":80,\"completion_tokens\":5}}}}\n\ndata: [DONE]\n\n"
    ))
}

/// One model turn asking for `n` reads at once.
fn reads_sse(n: usize) -> Reply {
    let mut s = String::new();
    for i in 0..n {
        let args = serde_json::json!({ "path": format!("f{}.txt", i % 4) }).to_string();
        let start = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":i,"id":format!("call_{i}"),"type":"function","function":{"name":"read_file","arguments":""}}]}}]});
        let body = serde_json::json!({"id":"c","choices":[{"index":0,"delta":{"tool_calls":[{"index":i,"function":{"arguments":args}}]}}]});
        s += &format!("data: {start}\n\ndata: {body}\n\n");
    }
    s += "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"tool_calls\"}]}\n\n";
    s += "data: {\"id\":\"c\",\"choices\":[],\"usage\":{\"prompt_tokens\":50,\"completion_tokens\":10}}\n\ndata: [DONE]\n\n";
    Reply::sse(s)
}

/// A conversation of `steps` steps as Cursor's client holds it: the blobs in `store`, the
/// checkpoint that references them.
fn history(steps: usize, store: &Store) -> pb::ConversationStateStructure {
    let mut state = pb::ConversationStateStructure::default();
    for t in 0..steps.div_ceil(STEPS_PER_TURN) {
        let n = STEPS_PER_TURN.min(steps - t * STEPS_PER_TURN);
        let steps = (0..n)
            .map(|i| {
                if i % 2 == 0 {
                    StepRecord::ToolCall {
                        tool_call: pb::ToolCall::default(),
                        call_id: format!("call_{t}_{i}"),
                        name: "read_file".into(),
                        arguments: serde_json::json!({ "path": format!("src/file_{t}_{i}.rs") }),
                        result: format!("fn item_{t}_{i}() {{}}\n").repeat(3),
                        is_error: false,
                        extra: None,
                    }
                } else {
                    StepRecord::Assistant {
                        text: format!("Step {i} of turn {t}: the file looks fine."),
                    }
                }
            })
            .collect();
        let turn = TurnRecord {
            user: pb::UserMessage {
                text: format!("Turn {t}: look at the next files."),
                message_id: format!("m{t}"),
                ..Default::default()
            },
            steps,
            request_id: format!("hist-{t}"),
            user_wire: None,
        };
        let encoded = encode_turn(&turn);
        for blob in &encoded.blobs {
            store.put(&blob.id, blob.data.clone());
        }
        state
            .turns
            .push(bytes::Bytes::copy_from_slice(&encoded.turn_id));
    }
    state
}

async fn bench_harness() -> Harness {
    harness::harness_keyed(Vec::new(), "sk-bench-conversation", |c| {
        c.agent.heartbeat_secs = 5;
        c.agent.kv_timeout_secs = 30;
        c.agent.provider_idle_timeout_secs = 120;
        c.limits.max_history_bytes = 256 << 20;
    })
    .await
}

/// One turn on `state`: time from the run request to `step_started`, and the transcript's end.
async fn turn_start(
    h: &Harness,
    store: &Store,
    state: &pb::ConversationStateStructure,
    n: usize,
) -> Duration {
    h.provider.push(text_sse("ok"));
    let mut first = run_request(OURS, &format!("conv-hist-{n}"), "next", true);
    if let Some(pb::agent_client_message::Message::RunRequest(r)) = &mut first.message {
        r.conversation_state = Some(state.clone());
    }
    let door = h.connect_door();
    let started = Instant::now();
    let mut run = H2Run::open(&door, &format!("req-hist-{n}-{}", rand_id()), &first).await;
    let sink = common::agent_client::Sink::H2(&run.tx);
    let mut at = None;
    loop {
        match run.stream.next().await {
            Some(Received::Message(m)) => {
                if at.is_none() && is_update(&m, |u| matches!(u, Update::StepStarted(_))) {
                    at = Some(started.elapsed());
                }
                if let Some(Server::KvServerMessage(kv)) = &m.message {
                    if let Some(answer) = store.answer(kv) {
                        sink.send(&answer).await;
                    }
                }
            }
            Some(Received::End(end)) => {
                assert!(end.error.is_none(), "{:?}", end.error);
                break;
            }
            None => panic!("no end frame"),
        }
    }
    at.expect("a step started")
}

fn is_update(m: &pb::AgentServerMessage, f: impl Fn(&Update) -> bool) -> bool {
    matches!(&m.message, Some(Server::InteractionUpdate(u)) if u.message.as_ref().is_some_and(&f))
}

fn rand_id() -> u64 {
    static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    N.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

/// A turn with `calls` parallel reads then an answer: last `text_delta` → `turn_ended`.
async fn turn_end(h: &Harness, client: &mut FakeCursor, calls: usize) -> Duration {
    h.provider.push(reads_sse(calls));
    h.provider.push(text_sse("All read."));
    // No inline context: the client's own (its workspace) comes through `request_context_args`.
    let first = run_request(
        OURS,
        &format!("conv-end-{calls}-{}", rand_id()),
        "read",
        false,
    );
    let door = h.connect_door();
    let mut run = H2Run::open(&door, &format!("req-end-{calls}-{}", rand_id()), &first).await;
    let mut last_text = None;
    let mut took = None;
    loop {
        match run.stream.next().await {
            Some(Received::Message(m)) => {
                if !text_of(std::slice::from_ref(&m)).is_empty() {
                    last_text = Some(Instant::now());
                }
                if is_update(&m, |u| matches!(u, Update::TurnEnded(_))) {
                    took = last_text.map(|t| t.elapsed());
                }
                for answer in client.respond(&m) {
                    let _ = run.tx.send(common::agent_client::frame(&answer)).await;
                }
            }
            Some(Received::End(end)) => {
                assert!(end.error.is_none(), "{:?}", end.error);
                break;
            }
            None => panic!("no end frame"),
        }
    }
    took.expect("turn_ended after the text")
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> String {
    format!("{:.2} ms", d.as_secs_f64() * 1e3)
}

/// Heartbeat appends on a live BidiSse run, with `others` prewarmed request ids held.
async fn append_cost(others: usize, samples: usize) -> Duration {
    let h = bench_harness().await;
    let door = h.connect_door();
    // Prewarms: each leaves an entry whose end frame nobody reads (kept for a minute).
    let opener = Bidi::new(&door, "req-opener");
    for i in 0..others {
        let body = encode_bidi_append(
            &prewarm_request(OURS, &format!("conv-held-{i}")),
            &format!("req-held-{i}"),
            0,
        );
        let answer = opener.append_body(body.encode_to_vec().into()).await;
        assert_eq!(answer.status, http::StatusCode::OK);
    }
    // A run that waits on its provider while the client appends heartbeats.
    h.provider
        .push(Reply::sse(harness::partial("thinking")).then(common::fake_provider::After::Stall));
    let bidi = Bidi::new(&door, "req-live");
    bidi.send(&run_request(OURS, "conv-live", "hi", true)).await;
    let _reader = bidi.open_sse().await;
    let mut times = Vec::with_capacity(samples);
    for _ in 0..samples {
        let started = Instant::now();
        bidi.send(&client_heartbeat()).await;
        times.push(started.elapsed());
    }
    median(times)
}

fn main() {
    let (rt, _) = support::runtime();
    rt.block_on(run());
}

async fn run() {
    let quick = std::env::var_os("BENCH_QUICK").is_some();
    let rounds: usize = env_or("BENCH_ROUNDS", if quick { 2 } else { 7 });
    let sizes: &[usize] = if quick { &[10, 100] } else { &[10, 100, 1000] };
    println!("turn start: run request → provider request (step_started), median of {rounds} warm");
    println!("| steps of history | after a restart (get_blob) | cache warm | blobs fetched |");
    println!("|---:|---:|---:|---:|");
    for &n in sizes {
        let h = bench_harness().await;
        let store = Store::default();
        let state = history(n, &store);
        let blobs = store.len();
        let cold = turn_start(&h, &store, &state, n).await;
        let mut warm = Vec::new();
        for _ in 0..rounds {
            warm.push(turn_start(&h, &store, &state, n).await);
        }
        println!("| {n} | {} | {} | {blobs} |", ms(cold), ms(median(warm)));
    }

    println!();
    println!("turn end: last text_delta → turn_ended, median of {rounds}");
    println!("| tool calls in the turn | time |");
    println!("|---:|---:|");
    let calls: &[usize] = if quick { &[1, 20] } else { &[1, 20, 100] };
    for &n in calls {
        let h = bench_harness().await;
        let ws = tempfile::tempdir().unwrap();
        for i in 0..4 {
            std::fs::write(ws.path().join(format!("f{i}.txt")), "hello\n").unwrap();
        }
        let mut client = FakeCursor::new(ws.path());
        let mut times = Vec::new();
        for _ in 0..rounds {
            times.push(turn_end(&h, &mut client, n).await);
        }
        println!("| {n} | {} |", ms(median(times)));
    }

    println!();
    let samples = if quick { 50 } else { 500 };
    // Below the registry's cap of 4,096 request ids (a prewarm's entry lingers a minute).
    let held: usize = env_or("BENCH_HELD_IDS", if quick { 1000 } else { 4000 });
    let base = append_cost(0, samples).await;
    let loaded = append_cost(held, samples).await;
    println!(
        "append (heartbeat) on a live RunSSE run, median of {samples}: {} with no other ids held, {} with {held} held",
        ms(base),
        ms(loaded)
    );
}
