//! The agent path's cost, side by side with reading the provider directly, in one run:
//!
//! - time from the provider handing its first text event to hyper to the client decoding the
//!   first `text_delta` frame (through the proxy: Connect over HTTP/2 over TLS after CONNECT),
//!   against cursor-byok's own provider client reading the same stream directly;
//! - cost per delta over a 5,000-delta stream, the same two ways;
//! - the proxy's resident memory (a separate `cursor-byok run` process, so the client and the
//!   fake provider do not count) with 200 concurrent idle runs, and per active run.
//!
//! ```sh
//! taskset -c 0 cargo bench --bench agent
//! ```
//! Knobs: `BENCH_ROUNDS` (default 5), `BENCH_FIRST_SAMPLES` (default 100), `BENCH_IDLE_RUNS`
//! (200), `BENCH_ACTIVE_RUNS` (50), `BENCH_QUICK=1` (a smoke run).

#[path = "../tests/common/mod.rs"]
#[allow(dead_code, unused_imports)]
mod common;
#[path = "../tests/common/harness.rs"]
mod harness;

#[path = "support/mod.rs"]
mod support;

use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::agent_client::{frame, play, play_until, run_request, Door, Sink, Store};
use common::client::{Alpn, Sender};
use cursor_byok::base::secret::Secret;
use cursor_byok::provider::{
    Message, ProviderClient, ProviderEvent, ProviderKind, ProviderRequest, ProviderSettings,
};
use http::{Request, Response};
use http_body_util::{combinators::UnsyncBoxBody, BodyExt, StreamBody};
use hyper::body::{Frame, Incoming};
use hyper::service::service_fn;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use support::{env_or, epoch, now_ns, percentile};

type BoxError = Box<dyn std::error::Error + Send + Sync>;
type Body = UnsyncBoxBody<Bytes, BoxError>;

const MANY: usize = 5_000;
const SLOW_EVERY: Duration = Duration::from_millis(10);
const SLOW_FOR: Duration = Duration::from_secs(3);

// ---------------------------------------------------------------------------------------------
// The fake provider: OpenAI Chat Completions streams, picked by a marker in the prompt.

#[derive(Default)]
struct Provider {
    addr: OnceLock<SocketAddr>,
    /// Requests for idle runs that have arrived (and are being held).
    idle_arrived: AtomicUsize,
}

fn event(content: &str) -> Bytes {
    Bytes::from(format!(
        "data: {{\"id\":\"b\",\"choices\":[{{\"index\":0,\"delta\":{{\"content\":\"{content}\"}}}}]}}\n\n"
    ))
}

fn finish() -> Bytes {
    Bytes::from_static(
        b"data: {\"id\":\"b\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n\
data: {\"id\":\"b\",\"choices\":[],\"usage\":{\"prompt_tokens\":10,\"completion_tokens\":5000}}\n\n\
data: [DONE]\n\n",
    )
}

fn sse(stream: impl futures_util::Stream<Item = Bytes> + Send + 'static) -> Response<Body> {
    use futures_util::StreamExt;
    let body = StreamBody::new(stream.map(|b| Ok::<_, BoxError>(Frame::data(b))));
    let mut resp = Response::new(body.boxed_unsync());
    resp.headers_mut()
        .insert("content-type", "text/event-stream".parse().unwrap());
    resp
}

async fn answer(state: Arc<Provider>, req: Request<Incoming>) -> Response<Body> {
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    let has = |marker: &str| body.windows(marker.len()).any(|w| w == marker.as_bytes());
    if has("BENCH-FIRST") {
        // The timestamp is taken when hyper asks for the first event.
        let stream = futures_util::stream::unfold(0u8, |i| async move {
            match i {
                0 => Some((event(&format!("t{}", now_ns())), 1)),
                1 => Some((finish(), 2)),
                _ => None,
            }
        });
        sse(stream)
    } else if has("BENCH-MANY") {
        let x = event("x");
        let stream =
            futures_util::stream::iter((0..MANY).map(move |_| x.clone()).chain([finish()]));
        sse(stream)
    } else if has("BENCH-IDLE") {
        state.idle_arrived.fetch_add(1, Ordering::SeqCst);
        // Never answers within the bench: the run waits on its provider.
        tokio::time::sleep(Duration::from_secs(3600)).await;
        sse(futures_util::stream::empty())
    } else {
        // BENCH-SLOW (and anything else): a delta every 10 ms for 3 s.
        let started = Instant::now();
        let stream = futures_util::stream::unfold(false, move |done| async move {
            if done {
                return None;
            }
            tokio::time::sleep(SLOW_EVERY).await;
            if started.elapsed() >= SLOW_FOR {
                return Some((finish(), true));
            }
            Some((event("s"), false))
        });
        sse(stream)
    }
}

async fn start_provider() -> Arc<Provider> {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let state = Arc::new(Provider::default());
    state.addr.set(listener.local_addr().unwrap()).unwrap();
    let st = state.clone();
    support::spawn_accept_loop(listener, move |stream| {
        let st = st.clone();
        async move {
            let service = service_fn(move |req| {
                let st = st.clone();
                async move { Ok::<_, Infallible>(answer(st, req).await) }
            });
            let _ = auto::Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(stream), service)
                .await;
        }
    });
    state
}

// ---------------------------------------------------------------------------------------------
// The proxy, as the user runs it: its own process.

/// The proxy process, with the bench's agent settings.
struct Proxy(common::proxy_process::ProxyProcess);

impl Proxy {
    async fn start(provider: SocketAddr) -> Proxy {
        let extra = "[agent]\nprovider_idle_timeout_secs = 600\nprovider_max_retries = 0\n";
        Proxy(common::proxy_process::ProxyProcess::start(provider, extra).await)
    }

    fn door(&self) -> Door {
        self.0.door()
    }

    /// The proxy process's resident set, KiB.
    fn rss_kib(&self) -> u64 {
        harness::proc_status(&self.0.pid(), "VmRSS:")
    }
}

// ---------------------------------------------------------------------------------------------
// The two ways of reading.

static RUN_SEQ: AtomicUsize = AtomicUsize::new(0);

/// Open a run through the proxy with `prompt` on the HTTP/2 connection `conn`.
async fn open_run(conn: &Sender, door: &Door, prompt: &str) -> common::agent_client::H2Run {
    let n = RUN_SEQ.fetch_add(1, Ordering::Relaxed);
    let first = frame(&run_request(
        harness::OURS,
        &format!("conv-bench-{n}"),
        prompt,
        true,
    ));
    harness::run_with_headers(conn, door, &format!("req-bench-{n}"), &[], first).await
}

fn is_text_delta(m: &cursor_byok::proto::agent::v1::AgentServerMessage) -> bool {
    !common::agent_client::text_of(std::slice::from_ref(m)).is_empty()
}

/// Through the proxy: ns from the provider's first event to the first decoded `text_delta`.
async fn first_via_proxy(conn: &Sender, door: &Door) -> u64 {
    let store = Store::default();
    let mut run = open_run(conn, door, "BENCH-FIRST").await;
    let t = play_until(&mut run.stream, Sink::H2(&run.tx), &store, is_text_delta).await;
    let at = now_ns();
    let sent: u64 = t
        .text()
        .trim_start_matches('t')
        .parse()
        .expect("a timestamp");
    let rest = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    assert!(rest.end.is_some(), "the run ends");
    at - sent
}

fn provider_request(prompt: &str) -> ProviderRequest {
    ProviderRequest {
        model: "gpt-fake".into(),
        system: String::new(),
        messages: vec![Message::user_text(prompt)],
        tools: Vec::new(),
        options: Default::default(),
    }
}

/// Directly: the same, with cursor-byok's provider client and no Cursor in between.
async fn first_direct(client: &ProviderClient) -> u64 {
    let mut stream = client.stream(provider_request("BENCH-FIRST"), CancellationToken::new());
    let mut first = None;
    while let Some(event) = stream.recv().await {
        if let (None, ProviderEvent::TextDelta(text)) = (&first, &event) {
            let at = now_ns();
            let sent: u64 = text.trim_start_matches('t').parse().expect("a timestamp");
            first = Some(at - sent);
        }
    }
    first.expect("a text delta")
}

/// Through the proxy: the whole 5,000-delta run, request to end frame.
async fn many_via_proxy(conn: &Sender, door: &Door) -> Duration {
    let started = Instant::now();
    let store = Store::default();
    let mut run = open_run(conn, door, "BENCH-MANY").await;
    let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
    let took = started.elapsed();
    assert_eq!(t.text().len(), MANY, "every delta arrives");
    took
}

async fn many_direct(client: &ProviderClient) -> Duration {
    let started = Instant::now();
    let mut stream = client.stream(provider_request("BENCH-MANY"), CancellationToken::new());
    let mut text = 0;
    while let Some(event) = stream.recv().await {
        if let ProviderEvent::TextDelta(t) = event {
            text += t.len();
        }
    }
    let took = started.elapsed();
    assert_eq!(text, MANY, "every delta arrives");
    took
}

/// `n` samples of each, alternating which goes first so neither always runs warm.
async fn interleave<T>(
    n: usize,
    mut a: impl AsyncFnMut() -> T,
    mut b: impl AsyncFnMut() -> T,
) -> (Vec<T>, Vec<T>) {
    let (mut xs, mut ys) = (Vec::new(), Vec::new());
    for i in 0..n {
        if i % 2 == 0 {
            xs.push(a().await);
            ys.push(b().await);
        } else {
            ys.push(b().await);
            xs.push(a().await);
        }
    }
    (xs, ys)
}

/// `n` HTTP/2 connections through the proxy.
async fn connections(door: &Door, n: usize) -> Vec<Sender> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(door.connect(Alpn::H2).await);
    }
    v
}

/// `n` runs with `prompt` spread over `conns`, each played by its own task like Cursor would.
async fn spawn_runs(
    conns: &[Sender],
    door: &Door,
    prompt: &str,
    n: usize,
) -> Vec<tokio::task::JoinHandle<common::agent_client::Transcript>> {
    let mut tasks = Vec::new();
    for i in 0..n {
        let mut run = open_run(&conns[i % conns.len()], door, prompt).await;
        tasks.push(tokio::spawn(async move {
            let store = Store::default();
            play(&mut run.stream, Sink::H2(&run.tx), &store).await
        }));
    }
    tasks
}

fn median(values: &[Duration]) -> Duration {
    let mut v = values.to_vec();
    v.sort_unstable();
    v[v.len() / 2]
}

// ---------------------------------------------------------------------------------------------

fn main() {
    let (rt, _) = support::runtime();
    rt.block_on(run());
}

async fn run() {
    let quick = std::env::var("BENCH_QUICK").is_ok_and(|v| v == "1");
    let rounds: usize = env_or("BENCH_ROUNDS", if quick { 1 } else { 5 });
    let first_samples: usize = env_or("BENCH_FIRST_SAMPLES", if quick { 10 } else { 100 });
    let idle_runs: usize = env_or("BENCH_IDLE_RUNS", if quick { 20 } else { 200 });
    let active_runs: usize = env_or("BENCH_ACTIVE_RUNS", if quick { 10 } else { 50 });
    let _ = epoch();

    let provider = start_provider().await;
    let provider_addr = *provider.addr.get().unwrap();
    let proxy = Proxy::start(provider_addr).await;
    let door = proxy.door();
    let direct = ProviderClient::new(ProviderSettings::new(
        ProviderKind::OpenAiChat,
        format!("http://{provider_addr}"),
        Secret::new("sk-bench-not-a-secret"),
    ))
    .expect("a provider client");
    let conn = door.connect(Alpn::H2).await;

    // Warm up both paths (TLS, pools, lazy statics).
    for _ in 0..3 {
        first_via_proxy(&conn, &door).await;
        first_direct(&direct).await;
    }

    // 1. First delta, interleaved.
    let (via, dir) = interleave(
        first_samples,
        async || first_via_proxy(&conn, &door).await,
        async || first_direct(&direct).await,
    )
    .await;
    eprintln!("first delta done");

    // 2. 5,000 deltas, interleaved.
    let (many_via, many_dir) = interleave(
        rounds,
        async || many_via_proxy(&conn, &door).await,
        async || many_direct(&direct).await,
    )
    .await;
    eprintln!("5,000 deltas done");

    // 3. Memory of the proxy process.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let baseline = proxy.rss_kib();
    let active_conns = connections(&door, 2).await;
    let active = spawn_runs(&active_conns, &door, "BENCH-SLOW", active_runs).await;
    tokio::time::sleep(SLOW_FOR / 2).await;
    let with_active = proxy.rss_kib();
    for task in active {
        let t = task.await.unwrap();
        assert!(
            t.end.is_some() && !t.text().is_empty(),
            "an active run ends"
        );
    }
    drop(active_conns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    // Idle runs are measured from here: what the active runs freed is reused first.
    let before_idle = proxy.rss_kib();
    let conns = connections(&door, 4).await;
    let idle = spawn_runs(&conns, &door, "BENCH-IDLE", idle_runs).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while provider.idle_arrived.load(Ordering::SeqCst) < idle_runs {
        assert!(
            Instant::now() < deadline,
            "idle runs did not all reach the provider"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let with_idle = proxy.rss_kib();
    for task in &idle {
        task.abort();
    }
    drop(idle);
    drop(conns);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after_idle = proxy.rss_kib();

    eprintln!("memory done");

    // Report.
    let us = |ns: f64| ns / 1_000.0;
    println!("### Agent path\n");
    println!("| what | through cursor-byok | provider read directly | difference |");
    println!("|---|---:|---:|---:|");
    let (v50, d50) = (percentile(&via, 0.5), percentile(&dir, 0.5));
    let (v99, d99) = (percentile(&via, 0.99), percentile(&dir, 0.99));
    println!(
        "| provider's first event → first `text_delta`, p50 ({} samples) | {:.0} µs | {:.0} µs | +{:.0} µs |",
        via.len(),
        us(v50),
        us(d50),
        us(v50 - d50)
    );
    println!(
        "| the same, p99 | {:.0} µs | {:.0} µs | +{:.0} µs |",
        us(v99),
        us(d99),
        us(v99 - d99)
    );
    let (mv, md) = (median(&many_via), median(&many_dir));
    let per = |d: Duration| d.as_nanos() as f64 / MANY as f64 / 1_000.0;
    println!(
        "| {MANY}-delta stream, request to end (median of {rounds}) | {:.1} ms | {:.1} ms | {:.2}× |",
        mv.as_secs_f64() * 1e3,
        md.as_secs_f64() * 1e3,
        mv.as_secs_f64() / md.as_secs_f64()
    );
    println!(
        "| cost per delta | {:.2} µs | {:.2} µs | {:+.2} µs |",
        per(mv),
        per(md),
        per(mv) - per(md)
    );
    println!("\n### Proxy memory (VmRSS of the `cursor-byok run` process)\n");
    println!("| state | RSS KiB | per run KiB |");
    println!("|---|---:|---:|");
    println!("| after warm-up (baseline) | {baseline} | |");
    println!(
        "| {active_runs} concurrent active runs (a delta every 10 ms) | {with_active} | {:.1} |",
        with_active.saturating_sub(baseline) as f64 / active_runs as f64
    );
    println!("| after they finished | {before_idle} | |");
    println!(
        "| {idle_runs} concurrent idle runs (waiting on the provider) | {with_idle} | {:.1} |",
        with_idle.saturating_sub(before_idle) as f64 / idle_runs as f64
    );
    println!("| after they were cancelled | {after_idle} | |");
}
