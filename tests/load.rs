//! Load: 100 concurrent runs through the proxy against the fake provider (75 HTTP/2 `Run`s
//! multiplexed over 3 connections, 25 RunSSE + BidiAppend runs), all with the exact expected
//! output; no run left active. Memory is measured two ways: live heap bytes (a counting
//! allocator: exact, so a leak of a few KiB per run shows) must come back to its baseline, and
//! VmRSS (what the OS sees, after asking glibc to return its free pages) is printed and bounded.

mod common;
#[path = "common/harness.rs"]
mod harness;

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::agent_client::{frame, play, run_request, Bidi, Sink, Store};
use common::fake_provider::Reply;
use harness::{h2_conn, harness, rss_kib, run_with_headers, OURS, TEXT, TEXT_SSE};

/// The system allocator, counting live bytes. A test binary of its own, so nothing else pays.
struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);

// SAFETY: every call is forwarded unchanged to `System`; the counter only observes sizes.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        let p = unsafe { System.alloc_zeroed(layout) };
        if !p.is_null() {
            LIVE.fetch_add(layout.size(), Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) };
        LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        let p = unsafe { System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            LIVE.fetch_add(new_size, Ordering::Relaxed);
            LIVE.fetch_sub(layout.size(), Ordering::Relaxed);
        }
        p
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live_kib() -> u64 {
    (LIVE.load(Ordering::Relaxed) / 1024) as u64
}

/// Hand glibc's free pages back to the OS, so VmRSS shows what is in use rather than what the
/// allocator keeps cached (its arenas otherwise hold on to a burst's peak).
fn trim() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    {
        unsafe extern "C" {
            fn malloc_trim(pad: usize) -> i32;
        }
        // SAFETY: glibc's malloc_trim takes no pointers and may be called at any time.
        unsafe { malloc_trim(0) };
    }
}

/// Bytes the fake provider keeps of every request it saw (test bookkeeping, not the proxy's).
fn recorded_kib(h: &harness::Harness) -> u64 {
    let bytes: usize = h.provider.requests().iter().map(|r| r.body.len()).sum();
    (bytes / 1024) as u64
}

const H2_RUNS: usize = 75;
const SSE_RUNS: usize = 25;
const H2_CONNS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_concurrent_runs_complete_and_memory_returns() {
    let replies = vec![Reply::sse(TEXT_SSE); 20 * (H2_RUNS + SSE_RUNS) + 1];
    let h = harness(replies, |c| c.agent.kv_timeout_secs = 20).await;
    let door = h.connect_door();

    // Warm up (TLS, pools, lazy statics) before the baseline.
    let conns = {
        let mut v = Vec::new();
        for _ in 0..H2_CONNS {
            v.push(h2_conn(&door).await);
        }
        v
    };
    let store = Store::default();
    let mut warm = run_with_headers(
        &conns[0],
        &door,
        "req-warm",
        &[],
        frame(&run_request(OURS, "conv-warm", "hi", true)),
    )
    .await;
    let t = play(&mut warm.stream, Sink::H2(&warm.tx), &store).await;
    assert_eq!(t.text(), TEXT);
    drop(warm);
    tokio::time::sleep(Duration::from_millis(200)).await;
    trim();
    let baseline = rss_kib();
    let live_baseline = live_kib();
    let recorded_baseline = recorded_kib(&h);

    let peak = Arc::new(AtomicU64::new(baseline));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        tokio::spawn(async move {
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(rss_kib(), Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        })
    };

    let (elapsed1, after1) = wave(&h, &conns, &door, 1).await;
    let (mut elapsed2, mut after2) = wave(&h, &conns, &door, 2).await;
    // LOAD_WAVES=n runs more waves (to tell allocator retention from a per-run leak).
    let waves: usize = std::env::var("LOAD_WAVES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2)
        .max(2);
    for tag in 3..=waves {
        (elapsed2, after2) = wave(&h, &conns, &door, tag).await;
        eprintln!("LOAD | after wave {tag}: {after2} KiB");
    }
    let total = waves * (H2_RUNS + sse_runs());
    assert_eq!(h.provider.requests().len(), total + 1);
    let totals = h.server.status().snapshot().totals;
    assert_eq!(totals.ok, total as u64 + 1, "{totals:?}");

    sampling.store(false, Ordering::Relaxed);
    sampler.await.unwrap();
    drop(conns);
    tokio::time::sleep(Duration::from_millis(500)).await;
    trim();
    let after = rss_kib();
    let live_after = live_kib();
    let recorded = recorded_kib(&h) - recorded_baseline;
    // What the proxy (and the client side of this test) still holds, net of the fake
    // provider's own records.
    let retained = live_after.saturating_sub(live_baseline + recorded);
    eprintln!(
        "LOAD | live heap KiB: baseline {live_baseline}, after {live_after}; the fake provider's records {recorded}; retained by the proxy {retained} KiB over {total} runs ({} bytes per run)",
        retained * 1024 / total as u64
    );
    let peak = peak.load(Ordering::Relaxed);
    eprintln!(
        "LOAD | waves of {} runs in {elapsed1:?} (first) / {elapsed2:?} (last) | RSS KiB (client and proxy in one process): baseline {baseline}, peak {peak} (+{}), after wave 1 {after1} (+{}), after the last wave {after2} (+{}), after closing {after} (+{})",
        H2_RUNS + sse_runs(),
        peak.saturating_sub(baseline),
        after1.saturating_sub(baseline),
        after2.saturating_sub(baseline),
        after.saturating_sub(baseline)
    );
    // Every run's task, bodies, provider stream and transport entry are gone: the live heap is
    // back at its baseline but for the routing pins (two small entries per run, bounded at
    // 10,000) and the status page's ring of recent runs (bounded at 100).
    assert!(
        retained <= 2 * total as u64,
        "live heap did not come back: baseline {live_baseline} KiB, after {live_after} KiB, of which {recorded} KiB are the fake provider's records"
    );
    if baseline > 0 {
        // RSS also counts glibc's per-thread arenas and fragmentation: looser bounds.
        assert!(
            after2 <= after1 + 32 * 1024,
            "memory grew run over run: after wave 1 {after1} KiB, after the last wave {after2} KiB"
        );
        assert!(
            after <= baseline + 96 * 1024,
            "memory did not come back: baseline {baseline} KiB, after {after} KiB"
        );
    }
}

/// One wave of concurrent runs, every one checked; (how long it took, VmRSS after).
async fn wave(
    h: &harness::Harness,
    conns: &[common::client::Sender],
    door: &common::agent_client::Door,
    tag: usize,
) -> (Duration, u64) {
    let total = H2_RUNS + sse_runs();
    let started = Instant::now();
    let mut tasks = Vec::new();
    for i in 0..H2_RUNS {
        let conn = harness::h2_clone(&conns[i % conns.len()]);
        let door = door.clone();
        tasks.push(tokio::spawn(async move {
            let store = Store::default();
            let first = frame(&run_request(
                OURS,
                &format!("conv-load-{tag}-{i}"),
                "hi",
                true,
            ));
            let mut run =
                run_with_headers(&conn, &door, &format!("req-load-{tag}-{i}"), &[], first).await;
            let t = play(&mut run.stream, Sink::H2(&run.tx), &store).await;
            (t.end.clone(), t.text(), t.turn_ended().is_some())
        }));
    }
    for i in 0..sse_runs() {
        let door = door.clone();
        tasks.push(tokio::spawn(async move {
            let store = Store::default();
            let bidi = Bidi::new(&door, &format!("req-load-sse-{tag}-{i}"));
            bidi.send(&run_request(
                OURS,
                &format!("conv-load-sse-{tag}-{i}"),
                "hi",
                true,
            ))
            .await;
            let mut stream = bidi.open_sse().await;
            let t = play(&mut stream, Sink::Bidi(&bidi), &store).await;
            (t.end.clone(), t.text(), t.turn_ended().is_some())
        }));
    }
    let mut ok = 0;
    for (i, task) in tasks.into_iter().enumerate() {
        let (end, text, turn_ended) = tokio::time::timeout(Duration::from_secs(25), task)
            .await
            .expect("every run ends in time")
            .expect("the client task did not panic");
        let end = end.unwrap_or_else(|| panic!("run {i} ended without an end frame"));
        assert!(end.error.is_none(), "run {i}: {:?}", end.error);
        assert_eq!(text, TEXT, "run {i}");
        assert!(turn_ended, "run {i}");
        ok += 1;
    }
    let elapsed = started.elapsed();
    assert_eq!(ok, total);
    assert_eq!(h.provider.requests().len(), total * tag + 1);
    assert!(
        h.wait_no_active_runs(Duration::from_secs(5)).await,
        "runs left active: {}",
        h.server.status().snapshot().active.len()
    );

    tokio::time::sleep(Duration::from_millis(300)).await;
    trim();
    eprintln!(
        "LOAD | after wave {tag}: live heap {} KiB (fake provider records {} KiB), VmRSS {} KiB, {} threads",
        live_kib(),
        recorded_kib(h),
        rss_kib(),
        harness::threads()
    );
    (elapsed, rss_kib())
}

/// LOAD_SSE_RUNS overrides how many runs of a wave use RunSSE + BidiAppend (diagnosis).
fn sse_runs() -> usize {
    std::env::var("LOAD_SSE_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(SSE_RUNS)
}
