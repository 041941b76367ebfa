//! The agent through the real proxy: a Connect client plays Cursor through the CONNECT door
//! (and the direct doors) over TLS, against a fake model provider and a fake Cursor upstream
//! behind `api2.cursor.sh`. Assertions are on decoded messages and on bytes.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::agent_client::{
    cancel, chunked, client_heartbeat, connect_request, frame, play, play_until, prewarm_request,
    resume_request, run_request, shell_completion, text_of, updates, Bidi, H2Run, Received, Sink,
    Store, Transcript, API, EXEC_OS, STEP,
};
use common::client::{self, Alpn};
use common::closed_port;
use common::cursor_upstream::{
    self, capture_models_raw, relay_reply, relay_reply_bytes, AGENT_RUN, AGENT_RUN_SSE,
    AVAILABLE_MODELS, BIDI_APPEND, GET_SERVER_CONFIG,
};
use common::fake_provider::{After, Reply};
use cursor_byok::config::Config;
use cursor_byok::connect::{Code, EndStream};
use cursor_byok::proto::agent::v1 as pb;
use cursor_byok::proto::aiserver::v1 as ai;
use harness::{Harness, CURSORS, OURS};
use http::{Method, Request, StatusCode, Version};
use prost::Message;

const PROVIDER_KEY: &str = "sk-test-agent-proxy-secret";

const TEXT_SSE: &str = concat!(
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"reasoning_content\":\"Let me think.\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hello\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\", world\"}}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":120,\"completion_tokens\":7,\"prompt_tokens_details\":{\"cached_tokens\":100}}}\n\n",
    "data: [DONE]\n\n",
);

const RESUMED_SSE: &str = concat!(
    "data: {\"id\":\"c2\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Resumed.\"}}]}\n\n",
    "data: {\"id\":\"c2\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    "data: {\"id\":\"c2\",\"choices\":[],\"usage\":{\"prompt_tokens\":30,\"completion_tokens\":2}}\n\n",
    "data: [DONE]\n\n",
);

/// A chat stream whose events all have the same length (padded with SSE comments), so
/// `Reply::chunked(len)` writes exactly one event per write. Returns (body, event length).
fn one_event_per_write(texts: &[&str]) -> (String, usize) {
    let chunk = |delta: String, extra: &str| {
        format!("data: {{\"id\":\"s\",\"choices\":[{{\"index\":0,\"delta\":{delta}{extra}}}]}}\n\n")
    };
    let mut events = vec![chunk(r#"{"role":"assistant","content":""}"#.into(), "")];
    for t in texts {
        events.push(chunk(format!("{{\"content\":\"{t}\"}}"), ""));
    }
    events.push(chunk("{}".into(), ",\"finish_reason\":\"stop\""));
    events.push(
        "data: {\"id\":\"s\",\"choices\":[],\"usage\":{\"prompt_tokens\":40,\"completion_tokens\":4}}\n\n"
            .into(),
    );
    events.push("data: [DONE]\n\n".into());
    let len = events.iter().map(String::len).max().unwrap() + 4;
    let body = events
        .into_iter()
        .map(|e| format!(": {}\n{e}", "x".repeat(len - e.len() - 3)))
        .collect::<String>();
    (body, len)
}

async fn harness(replies: Vec<Reply>) -> Harness {
    harness_with(replies, |_| {}).await
}

/// The shared harness (every door open, the fake provider, the fake Cursor upstream), with
/// one provider retry and this file's key; `tweak`ed before binding.
async fn harness_with(replies: Vec<Reply>, tweak: impl FnOnce(&mut Config)) -> Harness {
    harness::harness_keyed(replies, PROVIDER_KEY, |c| {
        c.agent.provider_max_retries = 1;
        tweak(c);
    })
    .await
}

/// The whole `TEXT_SSE` turn, as the client decodes it, written back to the client's store.
fn assert_text_turn(t: &Transcript, store: &Store) {
    let end = t.end();
    assert!(end.error.is_none(), "{:?}", end.error);
    assert_eq!(t.text(), "Hello, world");
    assert_eq!(t.thinking(), "Let me think.");
    assert_eq!(
        delta_runs_as_one(&t.kinds()),
        [
            "step_started",
            "thinking",
            "thinking_completed",
            "text",
            "token",
            "step_completed",
            "turn_ended"
        ]
    );
    let usage = t.turn_ended().expect("turn_ended before the end frame");
    assert_eq!(usage.input_tokens, Some(120));
    assert_eq!(usage.output_tokens, Some(7));
    assert_eq!(usage.cache_read_tokens, Some(100));
    assert_checkpoint(t, store);
}

/// `kinds` with each run of text and token deltas as one text and one token: the Run body
/// merges the deltas already queued one behind the other, so how many arrive depends on timing.
fn delta_runs_as_one(kinds: &[&'static str]) -> Vec<&'static str> {
    let mut out = Vec::new();
    for &k in kinds {
        if !matches!(k, "text" | "token") {
            out.push(k);
        } else if out.last() != Some(&"token") {
            out.extend(["text", "token"]);
        }
    }
    out
}

/// The turn was checkpointed, and the checkpoint names only blobs the client holds.
fn assert_checkpoint(t: &Transcript, store: &Store) {
    let checkpoint = t.checkpoint.as_ref().expect("a conversation checkpoint");
    assert!(
        !checkpoint.turns.is_empty(),
        "the turn is in the checkpoint"
    );
    for id in &checkpoint.turns {
        assert!(
            store.get(id).is_some(),
            "turn blob {} not stored",
            hex::encode(id)
        );
    }
}

fn proto_post(path: &str, body: Vec<u8>) -> Request<client::Body> {
    Request::builder()
        .method(Method::POST)
        .uri(path)
        .header("content-type", "application/proto")
        .header("connect-protocol-version", "1")
        .header("accept-encoding", "gzip")
        .body(client::full(body))
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_run_through_the_connect_door() {
    let h = harness(vec![Reply::sse(TEXT_SSE)]).await;
    let store = Store::default();
    let door = h.connect_door();
    // No request context, as the SDK sends it: the proxy asks for it with an exec.
    let first = run_request(OURS, "conv-h2", "Say hello", false);
    let mut run = H2Run::open(&door, "req-h2", &first).await;
    assert_eq!(run.stream.status, StatusCode::OK);
    assert_eq!(
        run.stream.headers["content-type"],
        "application/connect+proto"
    );
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert_text_turn(&t, &store);
    assert_eq!(t.request_context_asks(), 1);
    let system = h.system_prompt(0);
    assert!(system.contains(EXEC_OS), "{system}");
    assert_eq!(
        h.provider.requests()[0].json()["messages"][1]["content"],
        "Say hello"
    );
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sse_with_concurrent_out_of_order_appends() {
    let h = harness(vec![Reply::sse(TEXT_SSE)]).await;
    let store = Store::default();
    let bidi = Bidi::new(&h.connect_door(), "req-bidi");
    // RunSSE first: its answer waits for the append that decides.
    let (sse, reading) = bidi.spawn_sse_announced();
    reading.await.expect("the proxy reads the RunSSE");
    // Appends 2 and 1 leave before append 0, all three in flight at once.
    let (s0, s1, s2) = (bidi.seqno(), bidi.seqno(), bidi.seqno());
    let (a2, reading2) = bidi.spawn_append_announced(s2, client_heartbeat());
    let (a1, reading1) = bidi.spawn_append_announced(s1, client_heartbeat());
    reading2.await.expect("the proxy reads append 2");
    reading1.await.expect("the proxy reads append 1");
    let a0 = bidi.spawn_append(s0, run_request(OURS, "conv-bidi", "Say hello", false));
    for a in [a0, a1, a2] {
        a.await.unwrap();
    }
    // A duplicate is accepted and dropped.
    bidi.append(s1, &client_heartbeat()).await;
    let mut stream = sse.await.unwrap();
    assert_eq!(stream.status, StatusCode::OK);
    assert_eq!(stream.headers["content-type"], "text/event-stream");
    // `play` answers the context exec with result + close, the close appended first.
    let t = play(&mut stream, Sink::Bidi(&bidi), &store).await;
    assert_text_turn(&t, &store);
    assert_eq!(t.request_context_asks(), 1);
    let system = h.system_prompt(0);
    assert!(
        system.contains(EXEC_OS),
        "the exec result must reach the run before its close (appended first): {system}"
    );
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sse_opened_after_the_first_append() {
    let h = harness(vec![Reply::sse(TEXT_SSE)]).await;
    let store = Store::default();
    let bidi = Bidi::new(&h.connect_door(), "req-late-sse");
    bidi.send(&run_request(OURS, "conv-late", "Say hello", true))
        .await;
    // The run has started (its provider call is out) before anyone reads it.
    assert!(
        common::wait_until(Duration::from_secs(5), || h.provider.requests().len() == 1).await,
        "the run did not start"
    );
    let mut stream = bidi.open_sse().await;
    let t = play(&mut stream, Sink::Bidi(&bidi), &store).await;
    assert_text_turn(&t, &store);
    assert_eq!(t.request_context_asks(), 0);
    assert!(h.system_prompt(0).contains("linux-inline"));
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn run_sse_reconnect_resumes_where_the_reader_stopped() {
    let (body, len) = one_event_per_write(&["one ", "two ", "three ", "four "]);
    let reply = Reply::sse(body)
        .chunked(len)
        .delay(Duration::from_millis(400));
    let h = harness(vec![reply]).await;
    let store = Store::default();
    let bidi = Bidi::new(&h.connect_door(), "req-reconnect");
    bidi.send(&run_request(OURS, "conv-reconnect", "Count", true))
        .await;
    let mut first = bidi.open_sse().await;
    // Read up to the first text and its token count, then go away mid-run.
    let mut text_seen = false;
    let t1 = play_until(&mut first, Sink::Bidi(&bidi), &store, |m| {
        let one = std::slice::from_ref(m);
        let stop = text_seen
            && updates(one)
                .iter()
                .any(|u| matches!(u, pb::interaction_update::Message::TokenDelta(_)));
        text_seen |= !text_of(one).is_empty();
        stop
    })
    .await;
    assert_eq!(t1.text(), "one ");
    assert!(t1.end.is_none());
    drop(first);
    // The same request id again: the rest of the run, nothing lost, nothing repeated.
    let mut second = bidi.open_sse().await;
    assert_eq!(second.status, StatusCode::OK);
    let t2 = play(&mut second, Sink::Bidi(&bidi), &store).await;
    assert_eq!(t2.text(), "two three four ");
    assert!(t2.end().error.is_none(), "{:?}", t2.end().error);
    let usage = t2.turn_ended().expect("turn_ended");
    assert_eq!(
        (usage.input_tokens, usage.output_tokens),
        (Some(40), Some(4))
    );
    assert_checkpoint(&t2, &store);
    let kinds = [t1.kinds(), t2.kinds()].concat();
    assert_eq!(kinds.iter().filter(|k| **k == "step_started").count(), 1);
    assert_eq!(kinds.iter().filter(|k| **k == "token").count(), 4);
    assert_eq!(h.provider.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_mid_stream_ends_canceled_and_stops_the_provider() {
    let partial =
        "data: {\"id\":\"c\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"partial\"}}]}\n\n";
    let trickle = || Reply::sse(partial).then(After::Trickle(Duration::from_millis(50)));
    let h = harness(vec![trickle(), trickle()]).await;
    let store = Store::default();
    let first_text = |m: &pb::AgentServerMessage| !text_of(std::slice::from_ref(m)).is_empty();

    // HTTP/2 Run: the cancel comes on the request stream.
    let door = h.connect_door();
    let mut run = H2Run::open(&door, "req-cancel-h2", &run_request(OURS, "c1", "hi", true)).await;
    let t = play_until(&mut run.stream, Sink::H2(&run.tx), &store, first_text).await;
    assert_eq!(t.text(), "partial");
    let started = Instant::now();
    run.send(&cancel()).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    let err = t.end().error.clone().expect("an error end frame");
    assert_eq!(err.code, Code::Canceled, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(3));
    assert!(
        h.provider.wait_hangups(1, Duration::from_secs(5)).await,
        "the provider request was not closed"
    );

    // BidiSse: the cancel is an append.
    let bidi = Bidi::new(&door, "req-cancel-sse");
    bidi.send(&run_request(OURS, "c2", "hi", true)).await;
    let mut stream = bidi.open_sse().await;
    let t = play_until(&mut stream, Sink::Bidi(&bidi), &store, first_text).await;
    assert_eq!(t.text(), "partial");
    bidi.send(&cancel()).await;
    let t = play(&mut stream, Sink::Bidi(&bidi), &store).await;
    let err = t.end().error.clone().expect("an error end frame");
    assert_eq!(err.code, Code::Canceled, "{err:?}");
    assert!(
        h.provider.wait_hangups(2, Duration::from_secs(5)).await,
        "the provider request was not closed"
    );
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_401_ends_unauthenticated() {
    let body = r#"{"error":{"message":"Incorrect API key provided.","type":"invalid_request_error","code":"invalid_api_key"}}"#;
    let h = harness(vec![Reply::json(401, body)]).await;
    let store = Store::default();
    let bidi = Bidi::new(&h.connect_door(), "req-401");
    bidi.send(&run_request(OURS, "conv-401", "hi", true)).await;
    let mut stream = bidi.open_sse().await;
    let t = play(&mut stream, Sink::Bidi(&bidi), &store).await;
    let err = t.end().error.clone().expect("an error end frame");
    assert_eq!(err.code, Code::Unauthenticated);
    for part in ["Fake Model", "401", "rejected the API key"] {
        assert!(err.message.contains(part), "{part}: {}", err.message);
    }
    assert!(!err.message.contains(PROVIDER_KEY));
    let details = err.decode_error_details().unwrap().expect("ErrorDetails");
    assert_eq!(details.details.unwrap().title, "Invalid API key");
    assert!(t.turn_ended().is_none());
    // A rejected key is not retried.
    assert_eq!(h.provider.requests().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_500_after_retries_ends_unavailable() {
    let body = r#"{"error":{"message":"The server had an error while processing your request.","type":"server_error"}}"#;
    let h = harness(vec![Reply::json(500, body), Reply::json(500, body)]).await;
    let store = Store::default();
    let door = h.connect_door();
    let mut run = H2Run::open(&door, "req-500", &run_request(OURS, "conv-500", "hi", true)).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    let err = t.end().error.clone().expect("an error end frame");
    assert_eq!(err.code, Code::Unavailable, "{err:?}");
    assert!(err.message.contains("Fake Model"), "{}", err.message);
    assert!(err.message.contains("500"), "{}", err.message);
    assert!(t.turn_ended().is_none());
    // The first attempt and `provider_max_retries = 1` retry.
    assert_eq!(h.provider.requests().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_model_on_h2_is_relayed_byte_for_byte() {
    let h = harness(vec![]).await;
    let first = frame(&run_request(CURSORS, "conv-cursor", "hi", true));
    let second = frame(&client_heartbeat());
    let run = H2Run::open_raw(&h.connect_door(), "req-relay-h2", first.clone()).await;
    let H2Run { tx, mut stream } = run;
    assert_eq!(stream.headers["x-fake-upstream"], "run");
    // Upstream's first frame arrives while the request stream is still open.
    match stream.next().await {
        Some(Received::Message(m)) => assert_eq!(frame(&*m), relay_reply()[0]),
        other => panic!("expected upstream's first message, got {other:?}"),
    }
    tx.send(second.clone()).await.unwrap();
    drop(tx);
    let rest = stream.raw_to_end().await;
    assert_eq!(rest, relay_reply_bytes().slice(relay_reply()[0].len()..));
    let recorded = h.upstream.wait_recorded(AGENT_RUN, 1, STEP).await;
    assert_eq!(recorded[0].body, [first, second].concat());
    assert_eq!(recorded[0].version, Version::HTTP_2);
    assert_eq!(recorded[0].headers["x-request-id"], "req-relay-h2");
    assert_eq!(
        recorded[0].headers["authorization"],
        "Bearer cursor-session-token"
    );
    assert!(h.provider.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cursors_model_on_run_sse_is_relayed_byte_for_byte() {
    let h = harness(vec![]).await;
    let bidi = Bidi::new(&h.connect_door(), "req-relay-sse");
    let (sse, reading) = bidi.spawn_sse_announced();
    reading.await.expect("the proxy reads the RunSSE");
    let b0 = bidi.append_bytes(0, &run_request(CURSORS, "conv-cursor-sse", "hi", false));
    let b1 = bidi.append_bytes(1, &client_heartbeat());
    // Append 1 first, both in flight.
    let (tx, reading1) = tokio::sync::oneshot::channel();
    let a1 = {
        let (b, body) = (bidi.clone(), b1.clone());
        tokio::spawn(async move { b.append_body_announced(body, Some(tx)).await })
    };
    reading1.await.expect("the proxy reads append 1");
    let a0 = bidi.append_body(b0.clone()).await;
    let a1 = a1.await.unwrap();
    for a in [&a0, &a1] {
        assert_eq!(a.status, StatusCode::OK);
        assert_eq!(a.headers["x-fake-upstream"], "bidi-append");
    }
    let stream = sse.await.unwrap();
    assert_eq!(stream.headers["x-fake-upstream"], "run-sse");
    assert_eq!(stream.raw_to_end().await, relay_reply_bytes());

    let recorded = h.upstream.wait_recorded(BIDI_APPEND, 2, STEP).await;
    let got: BTreeSet<Bytes> = recorded.iter().map(|r| r.body.clone()).collect();
    assert_eq!(got, BTreeSet::from([b0, b1]));
    let sse = h.upstream.recorded_on(AGENT_RUN_SSE);
    assert_eq!(sse.len(), 1);
    assert_eq!(
        sse[0].body,
        frame(&ai::BidiRequestId {
            request_id: "req-relay-sse".into()
        })
    );
    assert_eq!(sse[0].version, Version::HTTP_11);
    assert_eq!(sse[0].headers["x-request-id"], "req-relay-sse");
    assert!(h.provider.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_list_keeps_upstreams_models_and_appends_ours() {
    let Some(raw) = capture_models_raw() else {
        common::skip::skipped(
            "model_list_keeps_upstreams_models_and_appends_ours",
            &format!(
                "{} not found (no licence to keep a copy in the repository; CI has ../shared)",
                cursor_upstream::capture_path().display()
            ),
        );
        return;
    };
    let capture = ai::AvailableModelsResponse::decode(&raw[..]).unwrap();
    assert!(capture.models.len() > 1, "a real list");
    let h = harness(vec![]).await;
    for alpn in Alpn::both() {
        let mut c = h.connect_door().connect(alpn).await;
        let resp = c
            .send(API, proto_post(AVAILABLE_MODELS, Vec::new()))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        assert_eq!(resp.headers()["content-type"], "application/proto");
        assert!(resp.headers().get("content-encoding").is_none());
        let merged = ai::AvailableModelsResponse::decode(client::collect(resp).await).unwrap();
        let n = capture.models.len();
        assert_eq!(merged.models[..n], capture.models[..], "{alpn:?}");
        let ours: Vec<&str> = merged.models[n..].iter().map(|m| m.name.as_str()).collect();
        assert_eq!(ours, [OURS]);
        assert_eq!(
            merged.models[n].client_display_name.as_deref(),
            Some("Fake Model")
        );
        if !capture.model_names.is_empty() {
            assert_eq!(
                merged.model_names[..capture.model_names.len()],
                capture.model_names[..]
            );
            assert_eq!(merged.model_names.last().map(String::as_str), Some(OURS));
        }
        // Every other field is upstream's.
        let rest = ai::AvailableModelsResponse {
            models: capture.models.clone(),
            model_names: capture.model_names.clone(),
            ..merged
        };
        assert_eq!(rest, capture);
    }
    assert_eq!(h.upstream.recorded_on(AVAILABLE_MODELS).len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn model_list_with_upstream_down_is_ours_alone() {
    let dead = closed_port();
    let h = harness_with(vec![], |c| {
        c.upstream.resolve.insert(API.into(), dead.addr);
    })
    .await;
    let mut c = h.connect_door().connect(Alpn::H2).await;
    let resp = c
        .send(API, proto_post(AVAILABLE_MODELS, Vec::new()))
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let models = ai::AvailableModelsResponse::decode(client::collect(resp).await).unwrap();
    let names: Vec<&str> = models.models.iter().map(|m| m.name.as_str()).collect();
    assert_eq!(names, [OURS]);
    assert_eq!(models.model_names, [OURS]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_config_forces_http1_and_the_ws_probe_is_404() {
    let h = harness(vec![]).await;
    for alpn in Alpn::both() {
        let mut c = h.connect_door().connect(alpn).await;
        let resp = c
            .send(API, proto_post(GET_SERVER_CONFIG, Vec::new()))
            .await
            .unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        let config = ai::GetServerConfigResponse::decode(client::collect(resp).await).unwrap();
        assert_eq!(config.http2_config, 3, "FORCE_BIDI_DISABLED");
        assert_eq!(
            config,
            ai::GetServerConfigResponse {
                http2_config: 3,
                ..cursor_upstream::server_config()
            }
        );
        let probe = Request::builder()
            .uri("/ws-reachability-probe")
            .body(client::empty())
            .unwrap();
        let resp = c.send(API, probe).await.unwrap();
        assert_eq!(resp.status(), StatusCode::NOT_FOUND, "{alpn:?}");
        let _ = client::collect(resp).await;
    }
    assert_eq!(h.upstream.recorded_on(GET_SERVER_CONFIG).len(), 2);
    assert!(h.upstream.recorded_on("/ws-reachability-probe").is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_doors_reach_the_same_agent() {
    let h = harness(vec![Reply::sse(TEXT_SSE), Reply::sse(TEXT_SSE)]).await;
    let store = Store::default();
    // Direct TLS door, HTTP/2 Run.
    let door = h.tls_door();
    let first = run_request(OURS, "conv-direct-tls", "Say hello", false);
    let mut run = H2Run::open(&door, "req-direct-tls", &first).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert_text_turn(&t, &store);
    // Direct plain-HTTP door, RunSSE + BidiAppend.
    let bidi = Bidi::new(&h.http_door(), "req-direct-http");
    let sse = {
        let b = bidi.clone();
        tokio::spawn(async move { b.open_sse().await })
    };
    bidi.send(&run_request(OURS, "conv-direct-http", "Say hello", false))
        .await;
    let mut stream = sse.await.unwrap();
    let t = play(&mut stream, Sink::Bidi(&bidi), &store).await;
    assert_text_turn(&t, &store);
    assert_eq!(h.provider.requests().len(), 2);
    assert!(h.system_prompt(1).contains(EXEC_OS));
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prewarm_for_our_model_is_answered_locally() {
    let h = harness(vec![]).await;
    let door = h.connect_door();
    // HTTP/2 Run.
    let mut run = H2Run::open(&door, "req-prewarm-h2", &prewarm_request(OURS, "conv-pw")).await;
    match run.stream.next().await {
        Some(Received::End(end)) => assert_eq!(end, EndStream::ok()),
        other => panic!("expected a successful end frame, got {other:?}"),
    }
    // BidiSse.
    let bidi = Bidi::new(&door, "req-prewarm-sse");
    bidi.send(&prewarm_request(OURS, "conv-pw")).await;
    let mut stream = bidi.open_sse().await;
    match stream.next().await {
        Some(Received::End(end)) => assert_eq!(end, EndStream::ok()),
        other => panic!("expected a successful end frame, got {other:?}"),
    }
    h.assert_nothing_relayed();
    assert!(h.provider.requests().is_empty());
    // A prewarm for Cursor's model is Cursor's.
    let first = frame(&prewarm_request(CURSORS, "conv-pw-cursor"));
    let H2Run { tx, stream } = H2Run::open_raw(&door, "req-prewarm-cursor", first.clone()).await;
    drop(tx);
    assert_eq!(stream.raw_to_end().await, relay_reply_bytes());
    let recorded = h.upstream.wait_recorded(AGENT_RUN, 1, STEP).await;
    assert_eq!(recorded[0].body, first);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_without_a_model_follows_the_conversation_pin() {
    let h = harness(vec![Reply::sse(TEXT_SSE), Reply::sse(RESUMED_SSE)]).await;
    let store = Store::default();
    let door = h.connect_door();
    let first = run_request(OURS, "conv-pinned", "Say hello", true);
    let mut run = H2Run::open(&door, "req-pin-1", &first).await;
    assert_text_turn(
        &play(&mut run.stream, Sink::H2(&run.tx), &store).await,
        &store,
    );
    // Resume on that conversation: no model id, no request context. Ours.
    let resume = resume_request("conv-pinned", store.conversation_state());
    let mut run = H2Run::open(&door, "req-pin-2", &resume).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), "Resumed.");
    let usage = t.turn_ended().expect("turn_ended");
    assert_eq!(
        (usage.input_tokens, usage.output_tokens),
        (Some(30), Some(2))
    );
    assert_checkpoint(&t, &store);
    assert_eq!(h.provider.requests().len(), 2);
    // The resumed turn carries the conversation so far to the model.
    let history = h.provider.requests()[1].json()["messages"].to_string();
    assert!(
        history.contains("Say hello") && history.contains("Hello, world"),
        "{history}"
    );
    h.assert_nothing_relayed();
    // A resume on a conversation nothing says is ours or Cursor's goes nowhere: a clear error.
    let raw = frame(&resume_request("conv-never-seen", Default::default()));
    let H2Run { tx, mut stream } = H2Run::open_raw(&door, "req-pin-3", raw.clone()).await;
    drop(tx);
    let Some(Received::End(end)) = stream.next().await else {
        panic!("an end frame")
    };
    let err = end.error.expect("an error");
    assert_eq!(err.code, Code::FailedPrecondition);
    assert!(err.message.contains("conv-never-seen"), "{}", err.message);
    h.assert_nothing_relayed();
}

/// Another feature's append, on a request id its stream named, is relayed untouched, even when
/// it is no agent message or no `BidiAppendRequest` at all.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_append_that_is_not_an_agent_message_is_relayed_untouched() {
    let h = harness(vec![]).await;
    let door = h.connect_door();
    // Another feature's stream (a chat over SSE) names the request id first.
    let mut chat = door.connect(Alpn::H1).await;
    let open = connect_request(
        "/aiserver.v1.ChatService/StreamUnifiedChatWithToolsSSE",
        "application/connect+proto",
        "req-other-feature",
        chunked(frame(&ai::BidiRequestId {
            request_id: "req-other-feature".into(),
        })),
    );
    chat.send(&door.authority(), open).await.expect("answered");
    let bidi = Bidi::new(&door, "req-other-feature");
    // A BidiAppendRequest whose payload is not an AgentClientMessage…
    let not_agent = ai::BidiAppendRequest {
        data: "ffff0a".into(),
        request_id: Some(ai::BidiRequestId {
            request_id: "req-other-feature".into(),
        }),
        append_seqno: 0,
        ..Default::default()
    }
    .encode_to_vec();
    // …and a body that is not even a BidiAppendRequest.
    let not_append = b"\xff\xff\xff not protobuf".to_vec();
    for body in [Bytes::from(not_agent), Bytes::from(not_append)] {
        let answer = bidi.append_body(body.clone()).await;
        assert_eq!(answer.status, StatusCode::OK);
        assert_eq!(answer.headers["x-fake-upstream"], "bidi-append");
        let recorded = h.upstream.recorded_on(BIDI_APPEND);
        assert_eq!(recorded.last().unwrap().body, body);
        assert_eq!(
            recorded.last().unwrap().headers["x-request-id"],
            "req-other-feature"
        );
    }
    assert!(h.provider.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rate_limited_provider_falls_back_through_the_proxy() {
    let backup = common::fake_provider::FakeProvider::start(vec![Reply::sse(TEXT_SSE)]).await;
    let extra = Config::from_toml(
        &format!(
            "[providers.backup]\nkind = \"openai-chat\"\nbase_url = \"{}\"\napi_key = \"sk-test-backup\"\n\
             [[models]]\nid = \"x\"\nprovider = \"backup\"\nmodel = \"x\"\n\
             [[models.fallback]]\nprovider = \"backup\"\nmodel = \"gpt-backup\"\n",
            backup.base_url()
        ),
        "fallback",
    )
    .unwrap();
    let limited = Reply::json(429, r#"{"error":{"message":"Rate limit reached"}}"#);
    let h = harness_with(vec![limited], |c| {
        c.providers.extend(extra.providers.clone());
        c.models[0].fallback = extra.models[0].fallback.clone();
    })
    .await;
    let store = Store::default();
    let door = h.connect_door();
    let mut run = H2Run::open(&door, "req-fb", &run_request(OURS, "conv-fb", "hi", true)).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert_text_turn(&t, &store);
    // One try on the first target (no retry: another target is waiting), then the fallback.
    assert_eq!(h.provider.requests().len(), 1);
    assert_eq!(backup.requests().len(), 1);
    assert_eq!(backup.requests()[0].json()["model"], "gpt-backup");
    let snap = h.server.status().snapshot();
    let r = &snap.recent[0];
    assert_eq!(r.target.as_deref(), Some("backup/gpt-backup"));
    assert!(
        r.skipped[0].starts_with("fake/gpt-fake: ") && r.skipped[0].contains("HTTP 429"),
        "{:?}",
        r.skipped
    );
}

/// A run whose action is a background task's completion, as Cursor's SDK starts one after a
/// background subagent or shell ended.
fn completion_request(conversation: &str) -> pb::AgentClientMessage {
    let mut m = run_request(OURS, conversation, "unused", true);
    let Some(pb::agent_client_message::Message::RunRequest(run)) = &mut m.message else {
        unreachable!("run_request makes a run request")
    };
    run.action = Some(pb::ConversationAction {
        action: Some(
            pb::conversation_action::Action::BackgroundTaskCompletionAction(shell_completion()),
        ),
        ..Default::default()
    });
    m
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_may_reuse_an_ended_runs_request_id() {
    let h = harness(vec![
        Reply::sse(TEXT_SSE),
        Reply::sse(RESUMED_SSE),
        Reply::sse(RESUMED_SSE),
    ])
    .await;
    let store = Store::default();
    let first = Bidi::new(&h.connect_door(), "req-reused");
    first
        .send(&run_request(OURS, "conv-reused", "Say hello", true))
        .await;
    let t = play(&mut first.open_sse().await, Sink::Bidi(&first), &store).await;
    assert_text_turn(&t, &store);
    // A late append of the ended run, with no new run: still refused.
    let late = first
        .append_body(first.append_bytes(7, &client_heartbeat()))
        .await;
    assert_eq!(late.status, StatusCode::NOT_FOUND, "{:?}", late.body);
    assert!(String::from_utf8_lossy(&late.body).contains("has already ended"));
    // The SDK's order: a new run's RunSSE on the same request id first, then its append 0.
    let second = Bidi::new(&h.connect_door(), "req-reused");
    let (sse, reading) = second.spawn_sse_announced();
    reading.await.expect("the proxy reads the RunSSE");
    second.send(&completion_request("conv-reused")).await;
    let mut stream = sse.await.unwrap();
    assert_eq!(stream.status, StatusCode::OK);
    let t = play(&mut stream, Sink::Bidi(&second), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), "Resumed.");
    let asked = h.provider.requests()[1].json().to_string();
    assert!(
        asked.contains("1000"),
        "the completion reached the model: {asked}"
    );
    // The other order: append 0 first, RunSSE after.
    let third = Bidi::new(&h.connect_door(), "req-reused");
    third.send(&completion_request("conv-reused")).await;
    let t = play(&mut third.open_sse().await, Sink::Bidi(&third), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), "Resumed.");
    assert_eq!(h.provider.requests().len(), 3);
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reader_on_an_ended_runs_id_without_a_new_run_is_told_it_ended() {
    let h = harness(vec![Reply::sse(TEXT_SSE)]).await;
    let store = Store::default();
    let bidi = Bidi::new(&h.connect_door(), "req-ended");
    bidi.send(&run_request(OURS, "conv-ended", "Say hello", true))
        .await;
    let t = play(&mut bidi.open_sse().await, Sink::Bidi(&bidi), &store).await;
    assert_text_turn(&t, &store);
    let started = Instant::now();
    let t = play(&mut bidi.open_sse().await, Sink::Bidi(&bidi), &store).await;
    let err = harness::end_error(&t);
    assert_eq!(err.code, Code::NotFound);
    assert!(err.message.contains("has already ended"), "{}", err.message);
    assert!(
        started.elapsed() >= Duration::from_millis(1900),
        "it waited for a new run"
    );
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_replaces_an_ended_run_left_unread_and_a_resent_append_0_does_not() {
    let h = harness(vec![Reply::sse(TEXT_SSE), Reply::sse(RESUMED_SSE)]).await;
    let store = Store::default();
    let first = Bidi::new(&h.connect_door(), "req-unread");
    let run = run_request(OURS, "conv-unread", "Say hello", true);
    first.send(&run).await;
    // Read its first text, then leave: the run ends (at the latest after the reader grace), its
    // end frame unread, so its entry lingers.
    let mut reader = first.open_sse().await;
    let t = play_until(&mut reader, Sink::Bidi(&first), &store, |m| {
        !text_of(std::slice::from_ref(m)).is_empty()
    })
    .await;
    assert!(t.end.is_none());
    drop(reader);
    assert!(
        h.wait_no_active_runs(Duration::from_secs(15)).await,
        "the run ends once the reader grace has passed"
    );
    // Append 0 sent again is a duplicate, not a new run.
    first.append(0, &run).await;
    assert_eq!(h.provider.requests().len(), 1);
    // Another run request at seqno 0 is a new run on the id; the old frames go.
    let second = Bidi::new(&h.connect_door(), "req-unread");
    second.send(&completion_request("conv-unread")).await;
    let t = play(&mut second.open_sse().await, Sink::Bidi(&second), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), "Resumed.");
    assert_eq!(h.provider.requests().len(), 2);
    h.assert_nothing_relayed();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn h2_a_new_run_may_reuse_an_ended_runs_request_id() {
    // Each `Run` is its own stream: nothing of an ended run is held under its request id.
    let h = harness(vec![Reply::sse(TEXT_SSE), Reply::sse(RESUMED_SSE)]).await;
    let store = Store::default();
    let door = h.connect_door();
    let first = run_request(OURS, "conv-h2-reused", "Say hello", true);
    let mut run = H2Run::open(&door, "req-h2-reused", &first).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert_text_turn(&t, &store);
    let mut run = H2Run::open(
        &door,
        "req-h2-reused",
        &completion_request("conv-h2-reused"),
    )
    .await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), "Resumed.");
    h.assert_nothing_relayed();
}

/// A burst of deltas the provider sent in one write reaches the client whole and in order, in
/// fewer messages than deltas: the run hands on what is queued together and the body merges it.
#[tokio::test]
async fn a_burst_of_deltas_arrives_whole_in_fewer_messages() {
    const DELTAS: usize = 200;
    let piece = |i: usize| format!("{i} ");
    let mut sse: String = (0..DELTAS)
        .map(|i| {
            format!(
                "data: {{\"id\":\"c1\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{}\"}}}}]}}\n\n",
                piece(i)
            )
        })
        .collect();
    sse.push_str(concat!(
        "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
        "data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":12,\"completion_tokens\":3}}\n\n",
        "data: [DONE]\n\n",
    ));
    let h = harness(vec![Reply::sse(sse)]).await;
    let store = Store::default();
    let first = run_request(OURS, "conv-burst", "Count", true);
    let mut run = H2Run::open(&h.connect_door(), "req-burst", &first).await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), (0..DELTAS).map(piece).collect::<String>());
    let texts = t.kinds().iter().filter(|k| **k == "text").count();
    assert!(texts < DELTAS / 2, "{texts} text deltas for {DELTAS}");
}
