//! Saying that a test did not run, where the run's output shows it.
//!
//! Cargo's test harness captures `print!` / `eprint!` of a passing test and shows only its name,
//! so a test that returns early for want of a tool (Node, Chromium) looks like one that ran.
//! [`skipped`] writes straight to the process's stderr handle, which the harness does not
//! capture: every `cargo test` shows a `SKIPPED <test>: <reason>` line, no `--nocapture` needed.
//! Files without `mod common;` include it with `#[path = "common/skip.rs"] mod skip;`.
#![allow(dead_code)]

use std::io::Write;

/// Report that `test` did not run and why (the caller then returns).
pub fn skipped(test: &str, reason: &str) {
    // One write, starting on a line of its own: the harness writes a test's name and its
    // result separately, and this may land between them.
    let line = format!("\nSKIPPED {test}: {reason}\n");
    // A failed write to stderr leaves nothing better to report it to.
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}
