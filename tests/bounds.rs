//! Front-door bounds that count from the first byte to the last: silent connections, idle and
//! stalled TLS sessions, fat and stalled heads and bodies, short HTTP/2 connections, and a relay
//! stream whose origin grants no window while its client leaves. Every case ends with this
//! process's fds, live tasks and RSS back near their baseline and a normal run served.
//! Each case prints `OUTCOME | case | figures`.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::time::{Duration, Instant};

use common::client::{self, Alpn};
use harness::harness;
use http::{Request, StatusCode};

fn outcome(case: &str, figures: &str) {
    eprintln!("OUTCOME | {case} | {figures}");
}

/// Open descriptors of this process.
fn fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

fn alive_tasks() -> usize {
    tokio::runtime::Handle::current().metrics().num_alive_tasks()
}

/// The three gauges every case returns to.
#[derive(Debug, Clone, Copy)]
struct Gauges {
    fds: usize,
    tasks: usize,
    rss_kib: u64,
}

fn gauges() -> Gauges {
    Gauges {
        fds: fds(),
        tasks: alive_tasks(),
        rss_kib: harness::rss_kib(),
    }
}

/// Wait (at most `limit`) until fds and live tasks are back within `slack` of `base`; then
/// check RSS against a generous bound. Returns what was seen at the end.
async fn back_to(base: Gauges, slack: usize, limit: Duration, case: &str) -> Gauges {
    let started = Instant::now();
    loop {
        let now = gauges();
        if now.fds <= base.fds + slack && now.tasks <= base.tasks + slack {
            assert!(
                now.rss_kib <= base.rss_kib + 256 * 1024,
                "{case}: RSS {} -> {} KiB",
                base.rss_kib,
                now.rss_kib
            );
            return now;
        }
        assert!(
            started.elapsed() < limit,
            "{case}: not back to baseline after {limit:?}: {base:?} -> {now:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// 1,000 short HTTP/2 connections to the direct TLS door, one request each: when they close,
/// nothing of theirs is left (no task, no descriptor).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn short_h2_connections_to_the_direct_tls_door_leave_nothing() {
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
    tokio::time::sleep(Duration::from_millis(300)).await;
    let base = gauges();
    let started = Instant::now();
    for _ in 0..CONNS / 50 {
        let batch: Vec<_> = (0..50).map(|_| one()).collect();
        futures_util::future::join_all(batch).await;
    }
    let peak = gauges();
    let end = back_to(base, 8, Duration::from_secs(10), "short h2").await;
    outcome(
        &format!("{CONNS} short h2 connections, direct TLS door"),
        &format!("{:?}; {base:?} -> {peak:?} -> {end:?}", started.elapsed()),
    );
    h.normal_run_succeeds("after-short-h2").await;
}
