//! Memory a burst took goes back to the OS: glibc's malloc keeps what many threads freed in
//! their arenas unless asked (`malloc_trim`), which the proxy does every few seconds. This
//! measures it on a burst shaped like the proxy's (many tasks on a multi-thread runtime, each
//! holding a megabyte of 16 KiB body chunks, a few of which outlive the burst), and prints
//! the resident memory at each step. Alone in its binary, so no other test moves the figures.
#![cfg(all(target_os = "linux", target_env = "gnu"))]

use std::time::Instant;

use cursor_byok::base::process::{give_back_memory, resident_bytes};

const TASKS: usize = 256;
const CHUNK: usize = 16 << 10;
const CHUNKS_PER_TASK: usize = 64;
/// One chunk in this many outlives the burst (a connection still open).
const KEEP_ONE_IN: usize = 64;

fn mib(bytes: u64) -> f64 {
    bytes as f64 / f64::from(1u32 << 20)
}

#[test]
fn memory_taken_in_a_burst_goes_back_after_a_trim() {
    let Some(baseline) = resident_bytes() else {
        println!("SKIPPED memory_taken_in_a_burst_goes_back_after_a_trim: no /proc/self/statm");
        return;
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .build()
        .expect("runtime");
    let (kept, peak) = runtime.block_on(async {
        let tasks: Vec<_> = (0..TASKS)
            .map(|t| {
                tokio::spawn(async move {
                    let chunks: Vec<Vec<u8>> = (0..CHUNKS_PER_TASK)
                        .map(|i| vec![(t + i) as u8; CHUNK])
                        .collect();
                    tokio::task::yield_now().await;
                    chunks
                })
            })
            .collect();
        let mut all = Vec::new();
        for t in tasks {
            all.push(t.await.expect("task"));
        }
        let peak = resident_bytes().unwrap_or(0);
        // The burst ends: all but a few chunks are freed, on the threads that hold them.
        let kept: Vec<Vec<u8>> = all
            .into_iter()
            .flat_map(|chunks| chunks.into_iter().step_by(KEEP_ONE_IN))
            .collect();
        (kept, peak)
    });
    let after_free = resident_bytes().unwrap_or(0);
    let started = Instant::now();
    assert!(give_back_memory(), "glibc has malloc_trim");
    let took = started.elapsed();
    let after_trim = resident_bytes().unwrap_or(0);
    let burst = (TASKS * CHUNKS_PER_TASK * CHUNK) as u64;
    let live = (kept.len() * CHUNK) as u64;
    println!("| step | resident MiB |\n|---|---|");
    println!("| before the burst | {:.1} |", mib(baseline));
    println!(
        "| at its peak ({:.0} MiB in 16 KiB chunks) | {:.1} |",
        mib(burst),
        mib(peak)
    );
    println!(
        "| freed, {:.1} MiB still live | {:.1} |",
        mib(live),
        mib(after_free)
    );
    println!(
        "| after `malloc_trim(0)` ({:.2} ms) | {:.1} |",
        took.as_secs_f64() * 1000.0,
        mib(after_trim)
    );
    assert!(peak >= baseline + burst / 2, "the burst was resident");
    assert!(
        after_trim.saturating_sub(baseline) < burst / 4,
        "the burst's memory went back: {:.1} MiB above the baseline",
        mib(after_trim.saturating_sub(baseline))
    );
    drop(kept);
}
