//! Fault injection through the real proxy: broken providers, silent or vanishing clients, an
//! unreachable upstream, oversized and malformed input. Every case ends with a clear Connect
//! error (or a clear HTTP error before streaming) and the proxy then serves a normal run.
//! Each case prints `OUTCOME | case | code | message` for the record.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use bytes::{BufMut, Bytes, BytesMut};
use common::agent_client::STEP;
use common::agent_client::{
    frame, play, play_until, run_request, text_of, Bidi, H2Run, Sink, Store,
};
use common::closed_port;
use common::cursor_upstream::AGENT_RUN;
use common::fake_provider::{After, Reply};
use cursor_byok::connect::{Code, ConnectError};
use cursor_byok::proto::agent::v1 as pb;
use harness::{
    end_error, h2_conn, harness, partial, run_with_headers, silent, CURSORS, OURS, TEXT, TEXT_SSE,
};
use http::StatusCode;
use tokio::io::AsyncReadExt;

fn outcome(case: &str, code: &str, message: &str) {
    eprintln!("OUTCOME | {case} | {code} | {message}");
}

fn record(case: &str, err: &ConnectError) {
    outcome(case, err.code.as_str(), &err.message);
}

fn first_text(m: &pb::AgentServerMessage) -> bool {
    !text_of(std::slice::from_ref(m)).is_empty()
}

/// Play a run for our model on HTTP/2 (request context inline) to its end.
async fn h2_turn(h: &harness::Harness, tag: &str) -> common::agent_client::Transcript {
    let store = Store::default();
    let door = h.connect_door();
    let first = run_request(OURS, &format!("conv-{tag}"), "hi", true);
    let mut run = H2Run::open(&door, &format!("req-{tag}"), &first).await;
    assert_eq!(run.stream.status, StatusCode::OK);
    play(&mut run.stream, Sink::H2(&run.tx), &store).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_cut_mid_stream_ends_without_a_client_retry() {
    let h = harness(vec![Reply::sse(partial("half")).then(After::Cut)], |_| {}).await;
    let t = h2_turn(&h, "cut").await;
    assert_eq!(t.text(), "half");
    let err = end_error(&t);
    record("provider cut mid-stream", &err);
    assert_eq!(err.code, Code::Unknown, "{err:?}");
    assert!(err.message.contains("Fake Model"), "{}", err.message);
    h.normal_run_succeeds("after-cut").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_stall_hits_the_idle_timeout() {
    let h = harness(vec![Reply::sse(partial("wait")).then(After::Stall)], |c| {
        c.agent.provider_idle_timeout_secs = 1;
    })
    .await;
    let started = Instant::now();
    let t = h2_turn(&h, "stall").await;
    let err = end_error(&t);
    record("provider stall (idle 1 s)", &err);
    assert_eq!(err.code, Code::Unknown, "{err:?}");
    assert!(err.message.contains("timed out"), "{}", err.message);
    assert!(started.elapsed() < Duration::from_secs(6));
    assert!(
        h.provider.wait_hangups(1, Duration::from_secs(5)).await,
        "the stalled provider request was not closed"
    );
    h.normal_run_succeeds("after-stall").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_500_then_success_is_retried() {
    let body = r#"{"error":{"message":"boom","type":"server_error"}}"#;
    let h = harness(vec![Reply::json(500, body), Reply::sse(TEXT_SSE)], |c| {
        c.agent.provider_max_retries = 1;
    })
    .await;
    let t = h2_turn(&h, "retry").await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), TEXT);
    assert_eq!(h.provider.requests().len(), 2, "one retry");
    outcome("provider 500 then 200", "ok (retried once)", &t.text());
    h.normal_run_succeeds("after-retry").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn provider_malformed_event_ends_with_a_clear_error() {
    let body = format!("{}data: {{\"choices\": [oops not json\n\n", partial("x"));
    let h = harness(vec![Reply::sse(body).then(After::Stall)], |_| {}).await;
    let started = Instant::now();
    let t = h2_turn(&h, "malformed").await;
    let err = end_error(&t);
    record("provider malformed event", &err);
    assert!(started.elapsed() < Duration::from_secs(4), "no idle wait");
    assert!(err.message.contains("Fake Model"), "{}", err.message);
    h.normal_run_succeeds("after-malformed").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_vanishing_mid_run_cancels_the_provider_request() {
    let reply = Reply::sse(partial("going")).then(After::Trickle(Duration::from_millis(50)));
    let h = harness(vec![reply], |_| {}).await;
    let store = Store::default();
    let door = h.connect_door();
    let first = run_request(OURS, "conv-vanish", "hi", true);
    let mut run = H2Run::open(&door, "req-vanish", &first).await;
    let t = play_until(&mut run.stream, Sink::H2(&run.tx), &store, first_text).await;
    assert_eq!(t.text(), "going");
    let started = Instant::now();
    drop(run);
    assert!(
        h.provider.wait_hangups(1, Duration::from_secs(5)).await,
        "the provider request was not closed"
    );
    assert!(
        h.wait_no_active_runs(Duration::from_secs(5)).await,
        "a run was left behind: {:?}",
        h.server.status().snapshot().active
    );
    let recent = h.server.status().snapshot().recent;
    let rec = recent
        .iter()
        .find(|r| r.run_id == cursor_byok::status::run_id("req-vanish"))
        .expect("the run is recorded");
    outcome(
        "client disappears mid-run",
        rec.outcome.as_deref().unwrap_or("?"),
        &format!(
            "provider hung up after {:?}; error: {:?}",
            started.elapsed(),
            rec.error
        ),
    );
    h.normal_run_succeeds("after-vanish").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreachable_upstream_answers_502_with_the_reason() {
    let dead = closed_port();
    let h = harness(vec![], |c| {
        c.upstream
            .resolve
            .insert(common::agent_client::API.into(), dead.addr);
    })
    .await;
    let door = h.connect_door();
    let first = frame(&run_request(CURSORS, "conv-relay", "hi", true));
    let run = H2Run::open_raw(&door, "req-relay-dead", first).await;
    assert_eq!(run.stream.status, StatusCode::BAD_GATEWAY);
    let body = run.stream.raw_to_end().await;
    let err = ConnectError::from_unary_json(&body).expect("a Connect JSON error");
    record("upstream unreachable (passthrough Run)", &err);
    assert_eq!(err.code, Code::Unavailable);
    assert!(
        err.message.contains("api2.cursor.sh") || err.message.contains("refused"),
        "{}",
        err.message
    );
    h.normal_run_succeeds("after-502").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kv_ack_that_never_arrives_after_the_answer_ends_without_a_client_retry() {
    let h = harness(vec![Reply::sse(TEXT_SSE)], |c| c.agent.kv_timeout_secs = 1).await;
    let door = h.connect_door();
    let first = run_request(OURS, "conv-kv", "hi", true);
    let mut run = H2Run::open(&door, "req-kv", &first).await;
    let started = Instant::now();
    let t = silent(&mut run.stream).await;
    let err = end_error(&t);
    record("KV ack never arrives (1 s)", &err);
    assert_eq!(err.code, Code::Unknown, "{err:?}");
    assert!(started.elapsed() < Duration::from_secs(6));
    assert!(
        t.messages.iter().any(|m| matches!(
            m.message,
            Some(pb::agent_server_message::Message::KvServerMessage(_))
        )),
        "a blob write was asked for"
    );
    // No checkpoint that names blobs the client never acked.
    assert!(!t.messages.iter().any(|m| matches!(
        m.message,
        Some(pb::agent_server_message::Message::ConversationCheckpointUpdate(_))
    )));
    h.normal_run_succeeds("after-kv").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_that_never_closes_ends_deadline_exceeded() {
    let h = harness(vec![], |c| c.agent.kv_timeout_secs = 1).await;
    let door = h.connect_door();
    // No request context: the proxy asks for it with an exec nobody answers.
    let first = run_request(OURS, "conv-exec", "hi", false);
    let mut run = H2Run::open(&door, "req-exec", &first).await;
    let t = silent(&mut run.stream).await;
    assert_eq!(t.request_context_asks(), 1);
    let err = end_error(&t);
    record("exec never answered/closed (1 s)", &err);
    assert_eq!(err.code, Code::DeadlineExceeded, "{err:?}");
    assert!(h.provider.requests().is_empty());
    h.normal_run_succeeds("after-exec").await;
}

/// A frame header announcing `len` bytes, with `body` after it.
fn raw_frame(len: u32, body: &[u8]) -> Bytes {
    let mut b = BytesMut::new();
    b.put_u8(0);
    b.put_u32(len);
    b.put_slice(body);
    b.freeze()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_frames_are_refused() {
    let reply = Reply::sse(partial("long")).then(After::Trickle(Duration::from_millis(50)));
    let h = harness(vec![reply], |c| c.limits.max_frame_bytes = 64 * 1024).await;
    let door = h.connect_door();
    // As the first frame: refused before streaming.
    let big = run_request(OURS, "conv-big", &"x".repeat(100 * 1024), true);
    let run = H2Run::open(&door, "req-big-first", &big).await;
    let status = run.stream.status;
    let body = run.stream.raw_to_end().await;
    let err = ConnectError::from_unary_response(status.as_u16(), &body);
    outcome(
        "oversized first frame on Run (limit 64 KiB)",
        &format!("HTTP {} / {}", status.as_u16(), err.code.as_str()),
        &err.message,
    );
    assert!(status.is_client_error(), "{status}");
    assert_eq!(err.code, Code::ResourceExhausted, "{err:?}");
    assert!(h.provider.requests().is_empty());
    // Mid-run: the header alone announces too much; the run ends with an error end frame.
    let store = Store::default();
    let first = run_request(OURS, "conv-big-mid", "hi", true);
    let mut run = H2Run::open(&door, "req-big-mid", &first).await;
    let t = play_until(&mut run.stream, Sink::H2(&run.tx), &store, first_text).await;
    assert_eq!(t.text(), "long");
    run.tx.send(raw_frame(10 << 20, b"xx")).await.unwrap();
    let t = silent(&mut run.stream).await;
    let err = end_error(&t);
    record("oversized frame mid-run (limit 64 KiB)", &err);
    assert_eq!(err.code, Code::InvalidArgument, "{err:?}");
    assert!(err.message.contains("exceeds the limit"), "{}", err.message);
    assert!(
        h.provider.wait_hangups(1, Duration::from_secs(5)).await,
        "the provider request was not closed"
    );
    // An oversized BidiAppend body.
    let bidi = Bidi::new(&h.connect_door(), "req-big-append");
    let answer = bidi.append_body(bidi.append_bytes(0, &big)).await;
    let err = ConnectError::from_unary_response(answer.status.as_u16(), &answer.body);
    outcome(
        "oversized BidiAppend body",
        &format!("HTTP {} / {}", answer.status.as_u16(), err.code.as_str()),
        &err.message,
    );
    assert!(answer.status.is_client_error(), "{answer:?}");
    h.normal_run_succeeds("after-oversized").await;
}

/// The `side` an error's `ErrorDetails` names.
fn detail_side(err: &ConnectError) -> String {
    let details = err.decode_error_details().unwrap().expect("ErrorDetails");
    let custom = details.details.expect("custom details");
    custom
        .additional_info
        .get("side")
        .cloned()
        .unwrap_or_default()
}

/// A frame or body declaring more than the limit (here 4 GiB) is refused from its header at
/// once, on every agent door, never after waiting for bytes that cannot be taken.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn impossible_lengths_are_refused_at_once() {
    let h = harness(vec![], |_| {}).await;
    // RunSSE: its one frame announces 4 GiB.
    let bidi = Bidi::new(&h.connect_door(), "req-sse-4gib");
    let (resp, conn) = bidi.sse_request(raw_frame(u32::MAX, b"")).await;
    let mut sse = common::agent_client::ServerStream::new(resp, Some(conn));
    let err = end_error(&silent(&mut sse).await);
    record("RunSSE frame announcing 4 GiB", &err);
    assert_eq!(err.code, Code::ResourceExhausted, "{err:?}");
    assert_eq!(detail_side(&err), "cursor-client");
    // Run: the first frame announces 4 GiB.
    let run = H2Run::open_raw(&h.connect_door(), "req-run-4gib", raw_frame(u32::MAX, b"")).await;
    let status = run.stream.status;
    let err = ConnectError::from_unary_response(status.as_u16(), &run.stream.raw_to_end().await);
    record("Run frame announcing 4 GiB", &err);
    assert_eq!(err.code, Code::ResourceExhausted, "{err:?}");
    // BidiAppend: the body's declared length is 4 GiB; only the head is sent.
    let mut tcp = tokio::net::TcpStream::connect(h.server.http_addr().unwrap())
        .await
        .unwrap();
    let head = "POST /aiserver.v1.BidiService/BidiAppend HTTP/1.1\r\nhost: api2.cursor.sh\r\n\
                content-type: application/proto\r\nconnect-protocol-version: 1\r\n\
                x-request-id: req-append-4gib\r\nx-cursor-client-version: 2.0.0-test\r\n\
                content-length: 4294967295\r\n\r\n";
    tokio::io::AsyncWriteExt::write_all(&mut tcp, head.as_bytes())
        .await
        .unwrap();
    let mut answer = vec![0u8; 4096];
    let n = tokio::time::timeout(STEP, tcp.read(&mut answer))
        .await
        .expect("answered at once")
        .unwrap();
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    outcome(
        "BidiAppend declaring 4 GiB",
        "",
        answer.lines().next().unwrap_or(""),
    );
    assert!(answer.starts_with("HTTP/1.1 429"), "{answer}");
    assert!(answer.contains("resource_exhausted"), "{answer}");
    assert!(answer.contains("4294967295 bytes declared"), "{answer}");
    assert!(h.provider.requests().is_empty());
    h.normal_run_succeeds("after-4gib").await;
}

/// Appends that must wait (here for an append 0 that never comes) hold their bytes against
/// the pairing bounds: with 12 MiB already waiting for a run, another 12 MiB append for it is
/// refused at once with `resource_exhausted`, not held beside the first (an append carries its
/// message in hex: 6 MiB of prompt is 12 MiB of body).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiting_appends_are_bounded_by_their_bytes() {
    let h = harness(vec![], |_| {}).await;
    let bidi = Bidi::new(&h.connect_door(), "req-waiting-bytes");
    let big = run_request(OURS, "conv-waiting", &"x".repeat(6 << 20), true);
    // Whichever is counted second is the one refused; the other waits on.
    let answer = tokio::select! {
        a = bidi.append_body(bidi.append_bytes(1, &big)) => a,
        a = bidi.append_body(bidi.append_bytes(2, &big)) => a,
    };
    let err = ConnectError::from_unary_response(answer.status.as_u16(), &answer.body);
    record("a second 12 MiB append waiting for the same run", &err);
    assert_eq!(answer.status, StatusCode::TOO_MANY_REQUESTS, "{err:?}");
    assert_eq!(err.code, Code::ResourceExhausted, "{err:?}");
    assert!(err.message.contains("wait already"), "{}", err.message);
    assert_eq!(detail_side(&err), "cursor-client");
    assert!(h.provider.requests().is_empty());
    h.normal_run_succeeds("after-waiting-bytes").await;
}

/// A body far past the limit and the socket buffers: the client, still writing it over
/// HTTP/1.1, must read the refusal, not a reset connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_append_over_http1_gets_the_error_not_a_reset() {
    let h = harness(vec![], |c| c.limits.max_frame_bytes = 64 * 1024).await;
    let huge = run_request(OURS, "conv-huge", &"x".repeat(4 << 20), true);
    let bidi = Bidi::new(&h.connect_door(), "req-huge-append");
    let answer = bidi.append_body(bidi.append_bytes(0, &huge)).await;
    let err = ConnectError::from_unary_response(answer.status.as_u16(), &answer.body);
    record("4 MiB BidiAppend body over HTTP/1.1 (limit 64 KiB)", &err);
    assert!(answer.status.is_client_error(), "{answer:?}");
    assert_eq!(err.code, Code::ResourceExhausted, "{err:?}");
    assert!(
        err.message.contains("larger than 65536 bytes"),
        "{}",
        err.message
    );
    assert!(h.provider.requests().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_gzip_is_refused_or_relayed_without_harm() {
    let h = harness(vec![], |_| {}).await;
    let door = h.connect_door();
    // BidiAppend with `content-encoding: gzip` and garbage, on a request id no stream has
    // named: it cannot be read, and may be a run of ours, so it is refused, never relayed.
    let bidi = Bidi::new(&door, "req-bad-gzip");
    let appends_before = h
        .upstream
        .recorded_on(common::cursor_upstream::BIDI_APPEND)
        .len();
    let garbage = Bytes::from_static(b"\x1f\x8b\x08\x00garbage, not deflate");
    let mut conn = common::client::Sender::handshake(
        tokio::net::TcpStream::connect(h.server.http_addr().unwrap())
            .await
            .unwrap(),
        common::client::Alpn::H1,
    )
    .await;
    let mut req = common::agent_client::connect_request(
        common::agent_client::BIDI_APPEND,
        "application/proto",
        &bidi.request_id,
        common::client::full(garbage.clone()),
    );
    req.headers_mut()
        .insert("content-encoding", http::HeaderValue::from_static("gzip"));
    let resp = conn
        .send(&h.server.http_addr().unwrap().to_string(), req)
        .await
        .unwrap();
    let status = resp.status();
    let relayed = resp.headers().get("x-fake-upstream").is_some();
    let _ = common::client::collect(resp).await;
    outcome(
        "bad gzip BidiAppend",
        &format!("HTTP {}", status.as_u16()),
        if relayed {
            "relayed to Cursor"
        } else {
            "refused here (no stream named its request id)"
        },
    );
    assert!(!relayed && status != StatusCode::OK, "{status}");
    let recorded = h.upstream.recorded_on(common::cursor_upstream::BIDI_APPEND);
    assert_eq!(recorded.len(), appends_before);

    // Run with `connect-content-encoding: gzip` and a "compressed" first frame of garbage.
    let conn = h2_conn(&door).await;
    let mut first = BytesMut::new();
    first.put_u8(1);
    first.put_u32(16);
    first.put_slice(b"not gzip at all!");
    let run = run_with_headers(
        &conn,
        &door,
        "req-bad-gzip-run",
        &[("connect-content-encoding", "gzip")],
        first.freeze(),
    )
    .await;
    let status = run.stream.status;
    let body = run.stream.raw_to_end().await;
    let err = ConnectError::from_unary_response(status.as_u16(), &body);
    outcome(
        "bad gzip frame on Run",
        &format!("HTTP {} / {}", status.as_u16(), err.code.as_str()),
        &err.message,
    );
    assert!(status.is_client_error(), "{status}");
    h.normal_run_succeeds("after-gzip").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_content_type_on_run_is_refused_not_relayed() {
    let h = harness(vec![Reply::sse(TEXT_SSE)], |_| {}).await;
    let door = h.connect_door();
    let conn = h2_conn(&door).await;
    let first = frame(&run_request(OURS, "conv-ct", "hi", true));
    let run = run_with_headers(
        &conn,
        &door,
        "req-ct",
        &[("content-type", "application/json")],
        first.clone(),
    )
    .await;
    let H2Run { tx, stream } = run;
    drop(tx);
    let status = stream.status;
    let relayed = stream.headers.get("x-fake-upstream").is_some();
    let body = stream.raw_to_end().await;
    outcome(
        "wrong content type on Run (application/json)",
        &format!("HTTP {}", status.as_u16()),
        if relayed {
            "relayed to Cursor"
        } else {
            "refused: it cannot be read, so it is sent nowhere"
        },
    );
    assert!(!relayed, "never relayed unread");
    assert!(
        String::from_utf8_lossy(&body).contains("application/json"),
        "the error names the content type"
    );
    h.assert_nothing_relayed();
    assert!(h.provider.requests().is_empty(), "never run as ours");
    h.normal_run_succeeds("after-content-type").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn security_defaults_hold() {
    // Loopback unless configured otherwise.
    let default = cursor_byok::config::Config::embedded_default();
    assert!(default.listen.ip().is_loopback(), "{}", default.listen);

    // A host outside the intercept patterns is tunnelled even when the TLS inside names an
    // intercepted host: the client sees the far server's own certificate, never ours.
    let other = common::cursor_upstream::FakeUpstream::start(&[common::agent_client::API]).await;
    let other_addr = other.addr;
    let h = harness(vec![Reply::sse(TEXT_SSE)], |c| {
        c.upstream
            .resolve
            .insert("elsewhere.example".into(), other_addr);
    })
    .await;
    let stream = common::client::tunnel(h.server.proxy_addr(), "elsewhere.example:443").await;
    let roots = common::client::roots(&[&h.our_ca, &other.ca.cert_der]);
    let tls = common::client::tls(
        stream,
        common::agent_client::API,
        roots,
        common::client::Alpn::H2,
    )
    .await
    .unwrap();
    let presented = tls.get_ref().1.peer_certificates().unwrap()[0].clone();
    assert_eq!(Some(presented), other.cert_der.clone(), "not terminated");
    outcome(
        "CONNECT elsewhere.example with SNI api2.cursor.sh",
        "tunnelled",
        "the far server's own certificate; no TLS termination",
    );

    // After a full turn, no private key in the data dir is readable by group or others.
    h.normal_run_succeeds("security").await;
    let mut stack = vec![h.data_dir()];
    let mut keys = 0;
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            if text.contains("PRIVATE KEY") {
                keys += 1;
                use std::os::unix::fs::PermissionsExt;
                let mode = entry.metadata().unwrap().permissions().mode();
                assert_eq!(mode & 0o077, 0, "{} is mode {mode:o}", path.display());
            }
        }
    }
    assert!(keys >= 1, "the CA key is in the data dir");
}

/// Send `CONNECT target`, expect `status`, and return the answer's body text.
async fn connect_refused(proxy: std::net::SocketAddr, target: &str, status: u16) -> String {
    let (got, head, mut stream) = common::client::connect_raw(proxy, target, None).await;
    assert_eq!(got, status, "{target}: {head}");
    let mut body = vec![0u8; 300];
    let n = tokio::time::timeout(Duration::from_secs(5), stream.read(&mut body))
        .await
        .unwrap()
        .unwrap();
    String::from_utf8_lossy(&body[..n]).into_owned()
}

/// `CONNECT` to one of our own listeners, in any spelling, is a 502 naming the loop; the proxy
/// dials none of them and keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_to_ourselves_in_any_spelling_is_refused() {
    let h = harness(vec![], |_| {}).await;
    let proxy = h.server.proxy_addr();
    let ports = [proxy.port(), h.server.http_addr().unwrap().port()];
    for port in ports {
        for host in [
            "[::ffff:127.0.0.1]",
            "127.0.0.1",
            "127.0.0.2",
            "[::1]",
            "localhost",
        ] {
            let target = format!("{host}:{port}");
            let text = connect_refused(proxy, &target, 502).await;
            assert!(text.contains("loop"), "{target}: {text}");
            outcome("CONNECT to ourselves", &target, &text);
        }
    }
    h.normal_run_succeeds("after-loop").await;
}

/// A `CONNECT` with an invalid port is a 400 saying so, not a dial to port 443.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connect_with_an_invalid_port_is_a_400() {
    let h = harness(vec![], |_| {}).await;
    let proxy = h.server.proxy_addr();
    for target in ["127.0.0.1:70000", "example.com:0", "example.com:abc"] {
        let text = connect_refused(proxy, target, 400).await;
        assert!(text.contains("port must be a number"), "{target}: {text}");
        outcome("CONNECT with an invalid port", target, &text);
    }
    h.normal_run_succeeds("after-bad-port").await;
}

/// Report how long after `started` the case's connections closed; not before `at_least`.
fn closed_no_earlier(case: &str, started: Instant, at_least: Duration) {
    let took = started.elapsed();
    outcome(case, "closed", &format!("{took:?}"));
    assert!(took >= at_least, "closed too early: {took:?}");
}

/// An unfinished request head on the proxy listener or the plain-HTTP door is closed after the
/// 15 s head timeout (as the TLS door closes a silent handshake); the proxy keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_request_heads_are_closed() {
    let h = harness(vec![], |_| {}).await;
    let started = Instant::now();
    let slow = |addr| async move {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut stream, b"GET http://x/ HTTP/1.1\r\nHost: x")
            .await
            .unwrap();
        let mut buf = [0u8; 64];
        // Closed (EOF or reset), not held: within the timeout plus slack.
        let read = tokio::time::timeout(Duration::from_secs(25), stream.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    };
    tokio::join!(
        slow(h.server.proxy_addr()),
        slow(h.server.http_addr().unwrap())
    );
    closed_no_earlier("unfinished request head", started, Duration::from_secs(10));
    h.normal_run_succeeds("after-slow-head").await;
}

/// With the per-listener cap reached, a new connection is closed at once; the open ones keep
/// working, and once they close a normal run is served again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connections_beyond_the_cap_are_closed() {
    let h = harness(vec![], |c| c.limits.max_connections = 4).await;
    let proxy = h.server.proxy_addr();
    // Each accepted connection is a task of this runtime: the count shows what the proxy holds.
    let idle = common::alive_tasks();
    let mut held = Vec::new();
    for _ in 0..4 {
        let mut s = tokio::net::TcpStream::connect(proxy).await.unwrap();
        tokio::io::AsyncWriteExt::write_all(&mut s, b"CONNECT example.com:0 HTTP/1.1\r\n")
            .await
            .unwrap();
        held.push(s);
    }
    // The accept loop has taken all four before the fifth arrives.
    assert!(
        common::wait_until(Duration::from_secs(5), || common::alive_tasks() >= idle + 4).await,
        "the proxy did not take the four connections"
    );
    let mut extra = tokio::net::TcpStream::connect(proxy).await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), extra.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    // The held connections are unaffected: each finishes its head and gets its answer.
    for s in &mut held {
        tokio::io::AsyncWriteExt::write_all(s, b"\r\n")
            .await
            .unwrap();
        let head = tokio::time::timeout(Duration::from_secs(5), common::client::read_head(s))
            .await
            .unwrap();
        assert!(head.starts_with("HTTP/1.1 400"), "{head}");
    }
    outcome(
        "connections beyond the cap (4)",
        "closed",
        "held ones answered",
    );
    drop(held);
    // The permits come back as the connection tasks see the close.
    assert!(
        common::wait_until(Duration::from_secs(5), || common::alive_tasks() <= idle).await,
        "the held connections' tasks did not end"
    );
    h.normal_run_succeeds("after-cap").await;
}

/// A raw TCP peer on loopback that echoes what it reads and, at the client's FIN, keeps its
/// side open for ever (a peer that ignores FIN).
async fn echo_peer() -> std::net::SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut buf = [0u8; 1024];
                while let Ok(n @ 1..) = stream.read(&mut buf).await {
                    let _ = tokio::io::AsyncWriteExt::write_all(&mut stream, &buf[..n]).await;
                }
                std::future::pending::<()>().await;
            });
        }
    });
    addr
}

/// The proxy with `tunnel.example` resolving to an [`echo_peer`].
async fn tunnel_harness(tweak: impl FnOnce(&mut cursor_byok::config::Config)) -> harness::Harness {
    let peer = echo_peer().await;
    harness(vec![], |c| {
        c.upstream.resolve.insert("tunnel.example".into(), peer);
        tweak(c);
    })
    .await
}

/// Wait (at most `limit`) for the proxy to close `stream`: EOF or a reset.
async fn closed_within(stream: &mut tokio::net::TcpStream, limit: Duration) -> bool {
    let mut buf = [0u8; 64];
    loop {
        match tokio::time::timeout(limit, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return true,
            Ok(Ok(_)) => continue,
            Err(_) => return false,
        }
    }
}

async fn echo_round(stream: &mut tokio::net::TcpStream) {
    tokio::io::AsyncWriteExt::write_all(stream, b"ping")
        .await
        .unwrap();
    let mut buf = [0u8; 4];
    tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buf))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(&buf, b"ping");
}

/// 50 tunnels whose far peer ignores the client's FIN are closed after the half-close timeout
/// (1 s here) instead of staying in CLOSE-WAIT; the proxy then serves a normal run.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_closed_tunnels_are_closed_after_the_timeout() {
    let h = tunnel_harness(|c| c.limits.tunnel_half_close_secs = 1).await;
    let proxy = h.server.proxy_addr();
    let mut tunnels = Vec::new();
    for _ in 0..50 {
        let mut stream = common::client::tunnel(proxy, "tunnel.example:7000").await;
        echo_round(&mut stream).await;
        tunnels.push(stream);
    }
    let started = Instant::now();
    for stream in &mut tunnels {
        tokio::io::AsyncWriteExt::shutdown(stream).await.unwrap();
    }
    for stream in &mut tunnels {
        assert!(closed_within(stream, Duration::from_secs(10)).await);
    }
    let case = "50 tunnels, peer ignores FIN";
    closed_no_earlier(case, started, Duration::from_millis(900));
    h.normal_run_succeeds("after-half-close").await;
}

/// A silent tunnel closes at the idle timeout (1 s here); one with traffic every 400 ms lives
/// on past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_tunnels_close_at_the_idle_timeout() {
    let h = tunnel_harness(|c| c.limits.tunnel_idle_secs = 1).await;
    let proxy = h.server.proxy_addr();
    let mut silent = common::client::tunnel(proxy, "tunnel.example:7000").await;
    let mut busy = common::client::tunnel(proxy, "tunnel.example:7000").await;
    let started = Instant::now();
    // The busy tunnel echoes a round every 400 ms (well within the idle timeout), paced by
    // waiting for the silent one's close: it keeps going until that comes.
    let mut closed = false;
    while !closed && started.elapsed() < Duration::from_secs(5) {
        echo_round(&mut busy).await;
        closed = closed_within(&mut silent, Duration::from_millis(400)).await;
    }
    let took = started.elapsed();
    outcome("silent tunnel (idle 1 s)", "closed", &format!("{took:?}"));
    assert!(closed, "the silent tunnel stayed open");
    assert!(took >= Duration::from_millis(900), "{took:?}");
    echo_round(&mut busy).await;
    h.normal_run_succeeds("after-idle").await;
}

/// Beyond `[limits] max_tunnels` a CONNECT is a 503 naming the limit; once a tunnel closes a
/// new one is admitted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tunnels_beyond_the_cap_are_refused_with_503() {
    let h = tunnel_harness(|c| {
        c.limits.max_tunnels = 2;
        c.limits.tunnel_half_close_secs = 1;
    })
    .await;
    let proxy = h.server.proxy_addr();
    let mut first = common::client::tunnel(proxy, "tunnel.example:7000").await;
    let mut second = common::client::tunnel(proxy, "tunnel.example:7000").await;
    let text = connect_refused(proxy, "tunnel.example:7000", 503).await;
    assert!(text.contains("max_tunnels"), "{text}");
    outcome("tunnels beyond the cap (2)", "503", &text);
    echo_round(&mut first).await;
    echo_round(&mut second).await;
    // The peer ignores the FIN: the tunnel ends at the half-close timeout and frees its place.
    // Its connection is a task of this runtime: the count shows when it is gone (taken once
    // the refused CONNECT's task has ended too).
    let holding = common::settled(Duration::from_secs(5), common::alive_tasks).await;
    drop(first);
    assert!(
        common::wait_until(Duration::from_secs(5), || common::alive_tasks() < holding).await,
        "the closed tunnel never ended"
    );
    let (status, _, mut stream) =
        common::client::connect_raw(proxy, "tunnel.example:7000", None).await;
    assert_eq!(status, 200, "the closed tunnel's place came back");
    echo_round(&mut stream).await;
    h.normal_run_succeeds("after-tunnel-cap").await;
}

/// Open descriptors of process `pid`.
fn fd_count(pid: &str) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

/// This process's soft limit on open files, from /proc (no libc here).
/// Raise this process's soft open-files limit to at least `need` (a child started afterwards
/// inherits it); a hard limit below `need` fails the test with what to change.
#[cfg(unix)]
fn raise_open_files_limit(need: u64) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    // `None` is "unlimited".
    let limit = getrlimit(Resource::Nofile);
    if limit.current.is_none_or(|soft| soft >= need) {
        return;
    }
    assert!(
        limit.maximum.is_none_or(|hard| hard >= need),
        "this test holds {need} descriptors but the hard open-files limit is {:?}: raise it \
         (ulimit -Hn {need}, or LimitNOFILE= in the service running the tests)",
        limit.maximum
    );
    setrlimit(
        Resource::Nofile,
        Rlimit {
            current: Some(need),
            maximum: limit.maximum,
        },
    )
    .unwrap_or_else(|e| panic!("cannot raise the open-files limit to {need}: {e}"));
}

/// 1,000 connections each sending an unfinished large header to the proxy as its own process:
/// while held its RSS and descriptors grow; after the head timeout (10 s here) both are back
/// near their baseline and a normal request is served. `HEAD_FLOOD_KIB` sets each header's
/// size (64 KiB by default). Figures go to docs/benchmarks.md.
#[cfg(unix)]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn head_flood_returns_memory_and_fds_to_baseline() {
    const CONNS: usize = 1000;
    raise_open_files_limit(2 * CONNS as u64 + 200);
    let kib: usize = std::env::var("HEAD_FLOOD_KIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    let provider = common::closed_port();
    let proxy = common::proxy_process::ProxyProcess::start(
        provider.addr,
        "[limits]\nhead_timeout_secs = 10\n",
    )
    .await;
    let pid = proxy.pid();
    let status_ok = || async {
        let mut s = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        let req = format!(
            "GET /__cursor-byok/status.json HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            proxy.addr
        );
        tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes())
            .await
            .unwrap();
        let head = common::client::read_head(&mut s).await;
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        // To the proxy's close (`Connection: close`): its descriptor is gone after this.
        let mut rest = Vec::new();
        let _ = s.read_to_end(&mut rest).await;
    };
    status_ok().await;
    let (rss0, fds0) = (harness::proc_status(&pid, "VmRSS:"), fd_count(&pid));

    let mut pad = b"GET http://x/ HTTP/1.1\r\nHost: x\r\nX-Pad: ".to_vec();
    pad.resize(pad.len() + kib * 1024, b'a');
    let pad = std::sync::Arc::new(pad);
    let started = Instant::now();
    let mut held = Vec::with_capacity(CONNS);
    let addr = proxy.addr;
    for _ in 0..CONNS / 100 {
        let mut batch = Vec::new();
        for _ in 0..100 {
            let pad = pad.clone();
            batch.push(tokio::spawn(async move {
                let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
                tokio::io::AsyncWriteExt::write_all(&mut s, &pad)
                    .await
                    .unwrap();
                s
            }));
        }
        for task in batch {
            held.push(task.await.unwrap());
        }
    }
    let sent = started.elapsed();
    // The peak while held: sampled until the proxy has taken them all (or the timeout began
    // closing them).
    let (mut rss1, mut fds1) = (0, 0);
    common::wait_until(Duration::from_secs(3), || {
        rss1 = rss1.max(harness::proc_status(&pid, "VmRSS:"));
        fds1 = fds1.max(fd_count(&pid));
        fds1 >= fds0 + CONNS
    })
    .await;
    assert!(
        fds1 >= fds0 + CONNS * 9 / 10,
        "held: {fds0} -> {fds1} (sent in {sent:?})"
    );

    // After the head timeout every one is closed.
    for s in &mut held {
        let mut buf = [0u8; 64];
        let read = tokio::time::timeout(Duration::from_secs(15), s.read(&mut buf)).await;
        assert!(matches!(read, Ok(Ok(0)) | Ok(Err(_))), "{read:?}");
    }
    let closed_after = started.elapsed();
    drop(held);
    // The proxy lets go of the descriptors as it sees the closes.
    common::wait_until(Duration::from_secs(5), || fd_count(&pid) <= fds0 + 10).await;
    let (rss2, fds2) = (harness::proc_status(&pid, "VmRSS:"), fd_count(&pid));
    outcome(
        &format!("{CONNS} unfinished {kib} KiB heads (timeout 10 s)"),
        &format!("sent in {sent:?}, all closed after {closed_after:?}"),
        &format!("RSS {rss0} -> {rss1} -> {rss2} KiB, fds {fds0} -> {fds1} -> {fds2}"),
    );
    assert!(fds2 <= fds0 + 10, "fds {fds0} -> {fds2}");
    let grown = rss1.saturating_sub(rss0);
    // What stays is the allocator keeping freed pages (glibc does not hand back every arena),
    // not buffers still held: the descriptors are all gone.
    assert!(
        rss2 <= rss0 + grown / 2,
        "RSS {rss0} -> {rss1} -> {rss2} KiB"
    );
    status_ok().await;
}

/// With `[direct] token` set, every direct-door request must carry it: without it (or with a
/// wrong one) the answer is a 401, with it our runs and relayed runs work, and the token never
/// reaches Cursor. The plain door listens on every address here (allowed with a token).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_doors_with_a_token_check_every_request() {
    const TOKEN: &str = "door-token-SECRET-0123456789";
    let h = harness(vec![Reply::sse(TEXT_SSE)], |c| {
        c.direct.token = Some(cursor_byok::base::secret::Secret::new(TOKEN));
        c.direct.http_listen = Some("0.0.0.0:0".parse().unwrap());
    })
    .await;
    let http = h.server.http_addr().unwrap();
    assert!(http.ip().is_unspecified(), "{http}");
    let plain = std::net::SocketAddr::from(([127, 0, 0, 1], http.port()));
    for token in ["", "x-cursor-byok-token: door-token-SECRET-012345678X\r\n"] {
        let mut s = tokio::net::TcpStream::connect(plain).await.unwrap();
        let req = format!(
            "POST {} HTTP/1.1\r\nHost: api2.cursor.sh\r\n{token}content-length: 0\r\n\r\n",
            AGENT_RUN
        );
        tokio::io::AsyncWriteExt::write_all(&mut s, req.as_bytes())
            .await
            .unwrap();
        let head = common::client::read_head(&mut s).await;
        assert!(head.starts_with("HTTP/1.1 401"), "{head}");
        outcome(
            "direct door without the token",
            "401",
            head.lines().next().unwrap(),
        );
    }

    let door = h.tls_door();
    let conn = h2_conn(&door).await;
    let store = Store::default();
    let with_token = [("x-cursor-byok-token", TOKEN)];
    let first = frame(&run_request(OURS, "conv-door", "hi", true));
    let refused = run_with_headers(&conn, &door, "req-door-0", &[], first.clone()).await;
    assert_eq!(refused.stream.status, StatusCode::UNAUTHORIZED);
    let mut run = run_with_headers(&conn, &door, "req-door-1", &with_token, first).await;
    assert_eq!(run.stream.status, StatusCode::OK);
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert!(t.end().error.is_none(), "{:?}", t.end().error);
    assert_eq!(t.text(), TEXT);

    // A run of Cursor's model is relayed without our credential.
    let first = frame(&run_request(CURSORS, "conv-door-2", "hi", true));
    let run = run_with_headers(&conn, &door, "req-door-2", &with_token, first).await;
    let common::agent_client::H2Run { tx, stream } = run;
    drop(tx);
    let _ = stream.raw_to_end().await;
    let recorded = h.upstream.wait_recorded(AGENT_RUN, 1, STEP).await;
    assert!(recorded[0].headers.get("x-cursor-byok-token").is_none());
    assert!(recorded[0].headers.get("proxy-authorization").is_none());
}
