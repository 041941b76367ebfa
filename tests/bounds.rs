//! Front-door bounds that count from the first byte to the last: silent connections, idle and
//! stalled TLS sessions, fat and stalled heads and bodies, short HTTP/2 connections, and a relay
//! stream whose origin grants no window while its client leaves. Every case ends with this
//! process's fds, live tasks and RSS back near their baseline and a normal run served after
//! it, and during it wherever the load leaves the listener room (not when it fills the
//! connection cap, which is the point of those cases).
//! Each case prints `OUTCOME | case | figures`.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use common::agent_client::{API, BIDI_APPEND};
use common::client::{self, Alpn};
use harness::harness;
use http::{Request, StatusCode};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// The cases measure this process's fds and RSS: one at a time (each has its own runtime, so
/// an async lock).
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn outcome(case: &str, figures: &str) {
    eprintln!("OUTCOME | {case} | {figures}");
}

/// Open descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current()
        .metrics()
        .num_alive_tasks()
}

/// The three gauges every case returns to.
#[derive(Debug, Clone, Copy)]
struct Gauges {
    fds: usize,
    tasks: usize,
    rss_kib: u64,
}

fn gauges() -> Gauges {
    release_free_memory();
    Gauges {
        fds: fds(),
        tasks: alive_tasks(),
        rss_kib: harness::rss_kib(),
    }
}

/// Memory the allocator still holds after the connections went: glibc keeps freed pages in its
/// arenas until asked to give them back, which would hide whether anything is still in use.
fn release_free_memory() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free pages to the OS; it has no preconditions.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// RSS a case may keep above its baseline once the allocator gave back what is free: caches
/// that live for the process (the TLS session and leaf caches, tokio's worker buffers).
const RSS_SLACK_KIB: u64 = 32 * 1024;

/// The gauges once the work before has wound down (its connections' tasks ended, their
/// descriptors closed): a baseline.
async fn settled_gauges() -> Gauges {
    common::settled(Duration::from_secs(5), || (fds(), alive_tasks())).await;
    gauges()
}

/// Wait (at most `limit`) until fds and live tasks are back within `slack` of `base` and RSS
/// (after [`release_free_memory`]) within [`RSS_SLACK_KIB`]. Returns what was seen at the end.
async fn back_to(base: Gauges, slack: usize, limit: Duration, case: &str) -> Gauges {
    let mut now = gauges();
    let back = common::wait_until(limit, || {
        now = gauges();
        now.fds <= base.fds + slack
            && now.tasks <= base.tasks + slack
            && now.rss_kib <= base.rss_kib + RSS_SLACK_KIB
    })
    .await;
    assert!(
        back,
        "{case}: not back to baseline after {limit:?}: {base:?} -> {now:?}"
    );
    now
}

/// 1,000 short HTTP/2 connections to the direct TLS door, one request each: when they close,
/// nothing of theirs is left (no task, no descriptor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_h2_connections_to_the_direct_tls_door_leave_nothing() {
    let _serial = SERIAL.lock().await;
    const CONNS: usize = 1000;
    let h = harness(vec![], |_| {}).await;
    let door = h.tls_door();
    let one = || async {
        let mut sender = door.connect(Alpn::H2).await;
        let req = Request::post("/echo").body(client::full("hi")).unwrap();
        let resp = sender.send(&door.authority(), req).await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK);
        client::collect(resp).await;
    };
    one().await;
    let base = settled_gauges().await;
    let started = Instant::now();
    let all = async {
        for _ in 0..CONNS / 50 {
            let batch: Vec<_> = (0..50).map(|_| one()).collect();
            futures_util::future::join_all(batch).await;
        }
    };
    // A normal run is served while the connections come and go.
    tokio::join!(all, h.normal_run_succeeds("during-short-h2"));
    let peak = gauges();
    let end = back_to(base, 8, Duration::from_secs(10), "short h2").await;
    outcome(
        &format!("{CONNS} short h2 connections, direct TLS door"),
        &format!("{:?}; {base:?} -> {peak:?} -> {end:?}", started.elapsed()),
    );
    h.normal_run_succeeds("after-short-h2").await;
}

/// Raise this process's open-files limit to at least `need` (up to the hard limit); fail with
/// a clear message when the hard limit is lower, rather than skip.
fn ensure_fds(need: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit/setrlimit only read/write the struct we pass.
    let got = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) };
    assert_eq!(got, 0, "getrlimit failed");
    if lim.rlim_cur >= need {
        return;
    }
    assert!(
        lim.rlim_max >= need,
        "this test holds {need} descriptors but the hard open-files limit is {}; raise it \
         (ulimit -Hn) to run it",
        lim.rlim_max
    );
    lim.rlim_cur = need;
    // SAFETY: as above.
    let set = unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    assert_eq!(set, 0, "setrlimit to {need} failed");
}

/// Wait (at most `limit`) for the proxy to close `stream`: EOF or a reset. Bytes before it
/// (an answer) are returned.
async fn closed_within(
    stream: &mut (impl AsyncReadExt + Unpin),
    limit: Duration,
) -> Option<Vec<u8>> {
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    let deadline = tokio::time::Instant::now() + limit;
    loop {
        match tokio::time::timeout_at(deadline, stream.read(&mut buf)).await {
            Ok(Ok(0)) | Ok(Err(_)) => return Some(got),
            Ok(Ok(n)) => got.extend_from_slice(&buf[..n]),
            Err(_) => return None,
        }
    }
}

/// Open `n` connections to `addr`, 100 at a time.
async fn open_many(addr: std::net::SocketAddr, n: usize) -> Vec<TcpStream> {
    let mut held = Vec::with_capacity(n);
    while held.len() < n {
        let batch = (n - held.len()).min(100);
        let opened =
            futures_util::future::join_all((0..batch).map(|_| TcpStream::connect(addr))).await;
        held.extend(opened.into_iter().map(|s| s.expect("connect")));
    }
    held
}

/// 1,100 connections that send nothing, on each listener in turn: every one is closed by the
/// head timeout counted from accept (1 s here; those beyond the 1,024 cap at once), and then
/// the listener serves a normal run again, with fds, tasks and RSS back at baseline.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_connections_are_closed_at_the_head_timeout_on_every_listener() {
    let _serial = SERIAL.lock().await;
    const CONNS: usize = 1100;
    ensure_fds(4 * CONNS as u64 + 500);
    let h = harness(vec![], |c| c.limits.head_timeout_secs = 1).await;
    h.normal_run_succeeds("silent-warm-up").await;
    let base = settled_gauges().await;
    let doors = [
        ("proxy listener", h.server.proxy_addr()),
        ("direct TLS door", h.server.tls_addr().unwrap()),
        ("direct HTTP door", h.server.http_addr().unwrap()),
    ];
    for (name, addr) in doors {
        let started = Instant::now();
        let mut held = open_many(addr, CONNS).await;
        let peak = gauges();
        for s in &mut held {
            assert!(
                closed_within(s, Duration::from_secs(5)).await.is_some(),
                "{name}: a silent connection stayed open"
            );
        }
        let took = started.elapsed();
        drop(held);
        let end = back_to(base, 16, Duration::from_secs(10), name).await;
        outcome(
            &format!("{CONNS} silent connections, {name} (head timeout 1 s)"),
            &format!("all closed after {took:?}; {base:?} -> {peak:?} -> {end:?}"),
        );
        h.normal_run_succeeds(&format!("after-silent-{}", name.replace(' ', "-")))
            .await;
    }
}

/// CONNECT, then TLS through it: `n` sessions that finish their handshake and go silent.
async fn idle_sessions(h: &harness::Harness, n: usize) -> Vec<Option<impl AsyncReadExt + Unpin>> {
    let proxy = h.server.proxy_addr();
    let roots = client::roots(&[&h.our_ca]);
    let mut held = Vec::with_capacity(n);
    for chunk in 0..n.div_ceil(50) {
        let batch = (n - chunk * 50).min(50);
        let opened = futures_util::future::join_all((0..batch).map(|i| {
            let roots = roots.clone();
            async move {
                let mut s = TcpStream::connect(proxy).await.ok()?;
                let head = format!("CONNECT {API}:443 HTTP/1.1\r\nHost: {API}:443\r\n\r\n");
                s.write_all(head.as_bytes()).await.ok()?;
                let answer = client::read_head(&mut s).await;
                if !answer.starts_with("HTTP/1.1 200") {
                    return None;
                }
                let alpn = if i % 2 == 0 { Alpn::H2 } else { Alpn::H1 };
                client::tls(s, API, roots, alpn).await.ok()
            }
        }))
        .await;
        held.extend(opened);
    }
    held
}

/// 1,100 TLS sessions through CONNECT that go silent after the handshake (half HTTP/2, half
/// HTTP/1.1): none dials the origin, each is closed by the head timeout (1 s), and the proxy
/// then serves a normal run with fds, tasks and RSS back at baseline. With the cap at 100,
/// at most 100 of 150 sessions are held at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_tls_sessions_through_connect_are_capped_and_closed() {
    let _serial = SERIAL.lock().await;
    const CONNS: usize = 1100;
    ensure_fds(4 * CONNS as u64 + 500);
    let h = harness(vec![], |c| {
        c.limits.head_timeout_secs = 1;
        c.limits.max_connections = 2000;
    })
    .await;
    h.normal_run_succeeds("idle-warm-up").await;
    let base = settled_gauges().await;
    let dials_before = h.upstream.connections_accepted();
    let started = Instant::now();
    let mut held = idle_sessions(&h, CONNS).await;
    let opened = held.iter().filter(|s| s.is_some()).count();
    let peak = gauges();
    for s in held.iter_mut().flatten() {
        assert!(
            closed_within(s, Duration::from_secs(5)).await.is_some(),
            "an idle TLS session stayed open"
        );
    }
    let took = started.elapsed();
    let dials = h.upstream.connections_accepted() - dials_before;
    drop(held);
    let end = back_to(base, 16, Duration::from_secs(10), "idle TLS sessions").await;
    outcome(
        &format!("{CONNS} idle TLS sessions through CONNECT (head timeout 1 s)"),
        &format!(
            "{opened} opened, all closed after {took:?}, origin dialled {dials} times; \
             {base:?} -> {peak:?} -> {end:?}"
        ),
    );
    assert_eq!(opened, CONNS, "every session got through below the cap");
    assert_eq!(dials, 0, "idle sessions dialled the origin");
    h.normal_run_succeeds("after-idle-sessions").await;
}

/// With `max_connections = 100`, 150 sessions through CONNECT: the cap counts them for their
/// whole life, so at most 100 get their handshake done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_connection_cap_counts_sessions_after_connect() {
    let _serial = SERIAL.lock().await;
    let h = harness(vec![], |c| {
        c.limits.head_timeout_secs = 5;
        c.limits.max_connections = 100;
    })
    .await;
    let base = settled_gauges().await;
    let held = idle_sessions(&h, 150).await;
    let opened = held.iter().filter(|s| s.is_some()).count();
    outcome("150 TLS sessions, cap 100", &format!("{opened} held"));
    assert_eq!(opened, 100, "the cap let {opened} sessions through");
    drop(held);
    // Their places come back as they close: once at most 16 of their tasks and descriptors
    // are left, most places are free and the next session gets through at once.
    back_to(base, 16, Duration::from_secs(10), "sessions at the cap").await;
    let again = idle_sessions(&h, 1).await;
    assert!(again[0].is_some(), "places never came back");
    h.normal_run_succeeds("after-session-cap").await;
}

/// Inside TLS after CONNECT (HTTP/1.1): 100 unfinished 300 KiB request heads are closed by
/// the head timeout, and 100 append bodies stalled 1 KiB short of their length get a 408 at
/// the body timeout (1 s each here); then fds, tasks and RSS are back at baseline and a normal
/// run is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fat_and_stalled_heads_and_bodies_inside_tls_are_closed() {
    let _serial = SERIAL.lock().await;
    const CONNS: usize = 100;
    ensure_fds(4 * CONNS as u64 + 500);
    let h = harness(vec![], |c| {
        c.limits.head_timeout_secs = 1;
        c.limits.body_timeout_secs = 1;
    })
    .await;
    h.normal_run_succeeds("fat-warm-up").await;
    let base = settled_gauges().await;
    let proxy = h.server.proxy_addr();
    let roots = client::roots(&[&h.our_ca]);
    let session = || {
        let roots = roots.clone();
        async move {
            let s = client::tunnel(proxy, &format!("{API}:443")).await;
            client::tls(s, API, roots, Alpn::H1).await.unwrap()
        }
    };

    let mut pad = format!("POST {BIDI_APPEND} HTTP/1.1\r\nHost: {API}\r\nX-Pad: ").into_bytes();
    pad.resize(pad.len() + 300 * 1024, b'a');
    let started = Instant::now();
    let heads = futures_util::future::join_all((0..CONNS).map(|_| {
        let pad = &pad;
        let session = &session;
        async move {
            let mut tls = session().await;
            // hyper may close as soon as the head is over its size bound: the write can fail.
            let _ = tls.write_all(pad).await;
            closed_within(&mut tls, Duration::from_secs(5)).await
        }
    }));
    // A normal run is served while the heads are held.
    let (heads, ()) = tokio::join!(heads, h.normal_run_succeeds("during-fat-heads"));
    let heads_took = started.elapsed();
    assert!(
        heads.iter().all(Option::is_some),
        "an unfinished head stayed open"
    );

    const BODY: usize = 512 * 1024;
    let started = Instant::now();
    let bodies = futures_util::future::join_all((0..CONNS).map(|_| {
        let session = &session;
        async move {
            let mut tls = session().await;
            let head = format!(
                "POST {BIDI_APPEND} HTTP/1.1\r\nHost: {API}\r\nContent-Type: application/proto\r\n\
                 Connect-Protocol-Version: 1\r\nContent-Length: {BODY}\r\n\r\n"
            );
            tls.write_all(head.as_bytes()).await.unwrap();
            tls.write_all(&vec![0u8; BODY - 1024]).await.unwrap();
            let answer = closed_within(&mut tls, Duration::from_secs(5)).await;
            answer.map(|a| String::from_utf8_lossy(&a).into_owned())
        }
    }));
    let (bodies, ()) = tokio::join!(bodies, h.normal_run_succeeds("during-stalled-bodies"));
    let bodies_took = started.elapsed();
    let peak = gauges();
    for answer in &bodies {
        let answer = answer
            .as_deref()
            .expect("a stalled body's connection stayed open");
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
        assert!(answer.contains("body_timeout_secs"), "{answer}");
    }
    drop((heads, bodies));
    let end = back_to(base, 16, Duration::from_secs(10), "fat and stalled").await;
    outcome(
        &format!("{CONNS} unfinished 300 KiB heads and {CONNS} stalled 512 KiB bodies in TLS"),
        &format!(
            "heads closed after {heads_took:?}, bodies answered 408 after {bodies_took:?}; \
             {base:?} -> {peak:?} -> {end:?}"
        ),
    );
    h.normal_run_succeeds("after-fat-and-stalled").await;
}

/// A TLS HTTP/2 origin that grants no window (stream window 0, never raised): it takes every
/// stream and never answers or reads a byte of its body.
async fn no_window_origin(
    listener: tokio::net::TcpListener,
    leaf: (
        rustls::pki_types::CertificateDer<'static>,
        rustls::pki_types::PrivateKeyDer<'static>,
    ),
) {
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_no_client_auth()
        .with_single_cert(vec![leaf.0], leaf.1)
        .unwrap();
    config.alpn_protocols = vec![b"h2".to_vec()];
    let acceptor = tokio_rustls::TlsAcceptor::from(std::sync::Arc::new(config));
    while let Ok((stream, _)) = listener.accept().await {
        let acceptor = acceptor.clone();
        tokio::spawn(async move {
            let Ok(tls) = acceptor.accept(stream).await else {
                return;
            };
            let handshake = h2::server::Builder::new()
                .initial_window_size(0)
                .handshake::<_, bytes::Bytes>(tls);
            let Ok(mut conn) = handshake.await else {
                return;
            };
            let mut held = Vec::new();
            while let Some(Ok(stream)) = conn.accept().await {
                held.push(stream);
            }
        });
    }
}

/// 50 clients through CONNECT (HTTP/2, the frame relay) each send a 4 MiB passthrough body to
/// an origin that grants no window, then leave: the relay notices each leaving, and fds, tasks
/// and RSS come back to baseline; a normal run is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_leaving_a_stream_the_origin_never_reads_leave_nothing() {
    let _serial = SERIAL.lock().await;
    const CONNS: usize = 50;
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let origin = listener.local_addr().unwrap();
    let h = harness(vec![], |c| {
        c.upstream.resolve.insert(API.into(), origin);
    })
    .await;
    let origin_task = tokio::spawn(no_window_origin(listener, h.upstream.ca.leaf(&[API])));
    h.normal_run_succeeds("no-window-warm-up").await;
    let base = settled_gauges().await;
    let proxy = h.server.proxy_addr();
    let roots = client::roots(&[&h.our_ca]);
    let started = Instant::now();
    let sent = futures_util::future::join_all((0..CONNS).map(|_| {
        let roots = roots.clone();
        async move {
            let mut sender =
                client::via_proxy(proxy, &format!("{API}:443"), API, roots, Alpn::H2).await;
            let (tx, body) = client::channel_body();
            let req = Request::post("/echo").body(body).unwrap();
            let call = sender.send(API, req);
            let feed = async {
                let mut fed = 0usize;
                // Until the windows close (the origin reads nothing), at most 4 MiB.
                while fed < 4 << 20 {
                    let chunk = bytes::Bytes::from(vec![7u8; 64 * 1024]);
                    let sent = tokio::time::timeout(Duration::from_millis(500), tx.send(chunk));
                    if !matches!(sent.await, Ok(Ok(()))) {
                        break;
                    }
                    fed += 64 * 1024;
                }
                fed
            };
            // The call never ends (no answer): stop it once the feed is stuck, then leave.
            tokio::select! {
                fed = feed => fed,
                _ = call => panic!("the origin answered"),
            }
        }
    }));
    // A normal run is served while the clients feed streams nobody reads.
    let (sent, ()) = tokio::join!(sent, h.normal_run_succeeds("during-no-window"));
    let peak = gauges();
    let end = back_to(base, 2, Duration::from_secs(10), "no-window origin").await;
    outcome(
        &format!("{CONNS} clients leaving streams an origin grants no window"),
        &format!(
            "fed {} KiB each before the windows closed, {:?}; {base:?} -> {peak:?} -> {end:?}",
            sent.iter().max().copied().unwrap_or(0) / 1024,
            started.elapsed()
        ),
    );
    h.normal_run_succeeds("after-no-window").await;
    origin_task.abort();
}
