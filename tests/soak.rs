//! A soak run, not part of CI:
//!
//! ```sh
//! cargo test --release --test soak -- --ignored --nocapture      # SOAK_MINUTES=30 by default
//! ```
//!
//! The proxy runs as its own process (`cursor-byok run`, as a user runs it), so its resident
//! memory, open file descriptors, threads and live tokio tasks can be sampled alone, every 10 s.
//! 20 conversations run at once for `SOAK_MINUTES`, each turn after the last on the same
//! conversation (history from the checkpoint), on HTTP/2 `Run` and on RunSSE + BidiAppend in
//! turn, through the CONNECT door: plain answers, tool rounds (reads run by a fake Cursor
//! client), cancels mid-turn, and provider faults (500s, streams cut mid-answer). Every turn
//! must end with an end frame within a minute; after a warm-up the samples must stay flat.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::agent_client::{cancel, frame, run_request, Bidi, Door, H2Run, Received, ServerStream};
use common::fake_cursor::FakeCursor;
use cursor_byok::proto::agent::v1 as pb;
use http_body_util::{BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::{TokioExecutor, TokioIo};

const CONVERSATIONS: usize = 20;
const TURN_LIMIT: Duration = Duration::from_secs(60);
const SAMPLE_EVERY: Duration = Duration::from_secs(10);
/// A pause between one conversation's turns (`SOAK_PAUSE_MS`, default 250): a busy day, not a
/// benchmark of throughput.
fn pause() -> Duration {
    Duration::from_millis(
        std::env::var("SOAK_PAUSE_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(250),
    )
}

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

// ---- the fake provider: decides per request, forever ----

fn chunk(delta: serde_json::Value, finish: Option<&str>) -> String {
    let c =
        serde_json::json!({"id":"s","choices":[{"index":0,"delta":delta,"finish_reason":finish}]});
    format!("data: {c}\n\n")
}

fn usage() -> String {
    "data: {\"id\":\"s\",\"choices\":[],\"usage\":{\"prompt_tokens\":300,\"completion_tokens\":20}}\n\ndata: [DONE]\n\n".into()
}

fn answer_body(n: u64) -> Vec<String> {
    let mut parts: Vec<String> = (0..20)
        .map(|i| chunk(serde_json::json!({"content": format!("word{i} ")}), None))
        .collect();
    parts.push(chunk(serde_json::json!({}), Some("stop")));
    parts.push(usage());
    let _ = n;
    parts
}

fn tool_body() -> Vec<String> {
    let call = serde_json::json!({"tool_calls":[{"index":0,"id":"call_r","type":"function","function":{"name":"read_file","arguments":"{\"path\":\"notes.txt\"}"}}]});
    vec![
        chunk(call, None),
        chunk(serde_json::json!({}), Some("tool_calls")),
        usage(),
    ]
}

async fn provider(counter: Arc<AtomicU64>, req: Request<Incoming>) -> Response<Body> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let n = counter.fetch_add(1, Ordering::Relaxed);
    let after_tool = String::from_utf8_lossy(&body).contains("\"role\":\"tool\"");
    if n % 17 == 5 {
        let mut r = Response::new(
            http_body_util::Full::new(Bytes::from_static(
                b"{\"error\":{\"message\":\"overloaded\",\"type\":\"server_error\"}}",
            ))
            .map_err(|e| match e {})
            .boxed_unsync(),
        );
        *r.status_mut() = http::StatusCode::INTERNAL_SERVER_ERROR;
        return r;
    }
    let parts = if !after_tool && n % 3 == 0 {
        tool_body()
    } else {
        answer_body(n)
    };
    let cut = n % 19 == 7;
    let stream = futures_util::stream::unfold((parts, 0usize), move |(parts, i)| async move {
        if i >= parts.len() {
            return None;
        }
        if cut && i == parts.len() / 2 {
            return Some((
                Err::<Frame<Bytes>, BoxError>("cut".into()),
                (parts, usize::MAX),
            ));
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
        let data = Bytes::from(parts[i].clone());
        Some((Ok(Frame::data(data)), (parts, i + 1)))
    });
    let mut r = Response::new(StreamBody::new(stream).boxed_unsync());
    r.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    r
}

async fn start_provider() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let counter = Arc::new(AtomicU64::new(0));
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let counter = counter.clone();
            tokio::spawn(async move {
                let service = service_fn(move |req| {
                    let counter = counter.clone();
                    async move { Ok::<_, Infallible>(provider(counter, req).await) }
                });
                let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

// ---- the proxy process ----

struct Proxy(common::proxy_process::ProxyProcess);

impl Proxy {
    async fn start(
        provider: SocketAddr,
        upstream: SocketAddr,
        upstream_ca: &std::path::Path,
    ) -> Proxy {
        let extra = format!(
            "[upstream]\nextra_roots = \"{}\"\n[upstream.resolve]\n\"api2.cursor.sh\" = \"{upstream}\"\n[agent]\nprovider_max_retries = 0\n",
            upstream_ca.display()
        );
        Proxy(common::proxy_process::ProxyProcess::start(provider, &extra).await)
    }

    fn door(&self) -> Door {
        self.0.door()
    }

    fn pid(&self) -> String {
        self.0.pid()
    }

    /// (RSS KiB, open fds, threads, tokio tasks, active runs).
    async fn sample(&self) -> [u64; 5] {
        let pid = self.pid();
        let fds = std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64);
        let status = self.status().await;
        [
            harness::proc_status(&pid, "VmRSS:"),
            fds,
            harness::proc_status(&pid, "Threads:"),
            status["tasks"].as_u64().unwrap_or(0),
            status["active"].as_array().map_or(0, |a| a.len() as u64),
        ]
    }

    async fn status(&self) -> serde_json::Value {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(self.0.addr).await.unwrap();
        s.write_all(b"GET /__cursor-byok/status.json HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
            .await
            .unwrap();
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.unwrap();
        let text = String::from_utf8_lossy(&buf);
        let body = text.split("\r\n\r\n").nth(1).unwrap_or("{}");
        // Chunked or not: the JSON object is what sits between the outer braces.
        let json = &body[body.find('{').unwrap_or(0)..=body.rfind('}').unwrap_or(0)];
        serde_json::from_str(json).unwrap_or_default()
    }
}

// ---- one conversation ----

#[derive(Default)]
struct Tally {
    turns: AtomicU64,
    ok: AtomicU64,
    errors: AtomicU64,
    canceled: AtomicU64,
}

enum Sender {
    H2(tokio::sync::mpsc::Sender<Bytes>),
    Bidi(Bidi),
}

impl Sender {
    async fn send(&self, m: &pb::AgentClientMessage) {
        match self {
            Sender::H2(tx) => {
                let _ = tx.send(frame(m)).await;
            }
            Sender::Bidi(b) => {
                let seqno = b.seqno();
                let _ = b.append_body(b.append_bytes(seqno, m)).await;
            }
        }
    }
}

async fn one_turn(
    door: &Door,
    client: &mut FakeCursor,
    conv: usize,
    turn: u64,
    cancel_it: bool,
) -> Option<bool> {
    let mut first = run_request(
        harness::OURS,
        &format!("soak-conv-{conv}"),
        "keep going",
        false,
    );
    if let Some(pb::agent_client_message::Message::RunRequest(r)) = &mut first.message {
        r.conversation_state = Some(client.checkpoint.clone().unwrap_or_default());
    }
    let request_id = format!("soak-{conv}-{turn}");
    let (mut stream, sender): (ServerStream, Sender) = if turn % 2 == 0 {
        let H2Run { tx, stream } = H2Run::open(door, &request_id, &first).await;
        (stream, Sender::H2(tx))
    } else {
        let bidi = Bidi::new(door, &request_id);
        bidi.send(&first).await;
        (bidi.open_sse().await, Sender::Bidi(bidi))
    };
    let mut seen = 0;
    loop {
        match stream.next().await? {
            Received::End(end) => return Some(end.error.is_none()),
            Received::Message(m) => {
                seen += 1;
                for answer in client.respond(&m) {
                    sender.send(&answer).await;
                }
                if cancel_it && seen == 3 {
                    sender.send(&cancel()).await;
                }
            }
        }
    }
}

async fn conversation(door: Door, conv: usize, until: Instant, tally: Arc<Tally>) {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.txt"), "status: soak\n").unwrap();
    let mut client = FakeCursor::new(ws.path());
    let mut turn = 0u64;
    while Instant::now() < until {
        turn += 1;
        let cancel_it = turn % 11 == 4;
        let outcome = tokio::time::timeout(
            TURN_LIMIT,
            one_turn(&door, &mut client, conv, turn, cancel_it),
        )
        .await
        .unwrap_or_else(|_| panic!("conversation {conv} turn {turn} hung past {TURN_LIMIT:?}"));
        tally.turns.fetch_add(1, Ordering::Relaxed);
        let counter = match outcome {
            Some(true) => &tally.ok,
            Some(false) if cancel_it => &tally.canceled,
            Some(false) => &tally.errors,
            None => {
                panic!("conversation {conv} turn {turn}: the stream ended without an end frame")
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        if client
            .checkpoint
            .as_ref()
            .is_some_and(|c| c.turns.len() > 60)
        {
            client.checkpoint = None; // a new conversation, as users start one
        }
        tokio::time::sleep(pause()).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "a soak run: SOAK_MINUTES (default 30) of load; run by hand"]
async fn soak() {
    let minutes: u64 = std::env::var("SOAK_MINUTES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(30);
    let upstream = common::cursor_upstream::FakeUpstream::start(&[common::agent_client::API]).await;
    let provider = start_provider().await;
    let proxy = Proxy::start(provider, upstream.addr, &upstream.ca_pem_path).await;
    let door = proxy.door();
    let tally = Arc::new(Tally::default());
    let until = Instant::now() + Duration::from_secs(minutes * 60);
    let mut convs = Vec::new();
    for conv in 0..CONVERSATIONS {
        convs.push(tokio::spawn(conversation(
            door.clone(),
            conv,
            until,
            tally.clone(),
        )));
    }
    println!("| t (s) | RSS KiB | fds | threads | tasks | active runs | turns so far |");
    println!("|---:|---:|---:|---:|---:|---:|---:|");
    let started = Instant::now();
    let mut samples = Vec::new();
    while Instant::now() < until {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let s = proxy.sample().await;
        println!(
            "| {} | {} | {} | {} | {} | {} | {} |",
            started.elapsed().as_secs(),
            s[0],
            s[1],
            s[2],
            s[3],
            s[4],
            tally.turns.load(Ordering::Relaxed)
        );
        samples.push(s);
    }
    for c in convs {
        c.await.expect("a conversation failed");
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let end = proxy.sample().await;
    println!(
        "turns {} (ok {}, provider faults {}, canceled {}); after the load: RSS {} KiB, {} fds, {} threads, {} tasks, {} active",
        tally.turns.load(Ordering::Relaxed),
        tally.ok.load(Ordering::Relaxed),
        tally.errors.load(Ordering::Relaxed),
        tally.canceled.load(Ordering::Relaxed),
        end[0], end[1], end[2], end[3], end[4]
    );
    // Flat after warm-up: the second half's peaks within 25 % (RSS) of the first half's.
    let warm = samples.len() / 3;
    let (early, late) = samples[warm..].split_at((samples.len() - warm) / 2);
    let peak = |v: &[[u64; 5]], i: usize| v.iter().map(|s| s[i]).max().unwrap_or(0);
    assert!(
        peak(late, 0) <= peak(early, 0) * 5 / 4 + 4096,
        "RSS grew: {} → {} KiB",
        peak(early, 0),
        peak(late, 0)
    );
    assert!(
        peak(late, 1) <= peak(early, 1) + 20,
        "fds grew: {} → {}",
        peak(early, 1),
        peak(late, 1)
    );
    assert!(
        peak(late, 3) <= peak(early, 3) * 5 / 4 + 50,
        "tasks grew: {} → {}",
        peak(early, 3),
        peak(late, 3)
    );
    assert_eq!(end[4], 0, "no run left active");
}
