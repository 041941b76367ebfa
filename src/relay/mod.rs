//! HTTP/2 passthrough as a frame relay.
//!
//! A decrypted HTTP/2 client connection (after CONNECT) is relayed frame by frame to its own
//! upstream connection: header blocks are decoded (routing needs `:path`) but forwarded as
//! received while both ends' HPACK tables stay in step, DATA frames are forwarded as they are,
//! and each hop keeps its own settings and flow-control windows. Streams that are not plain
//! passthrough — agent runs, the Cursor services we adjust, our own paths, anything for
//! another authority — are peeled off to our hyper server (the router) over an in-memory
//! HTTP/2 connection, so they behave exactly as on the hyper path. If the origin cannot be
//! reached, streams waiting for it get the same 502 as on the hyper path, and later ones go
//! to the router, whose own upstream link redials.
//!
//! Why: hyper + h2 on both sides were most of a passthrough request's CPU; the relay skips the
//! per-stream state machines, the request/response objects and body channels (figures in
//! docs/benchmarks.md).

mod common;
mod conn;
mod control;
mod failure;
mod flow;
mod frame;
// The fuzz harnesses (fuzz/fuzz_targets), with their asserts, stay out of the binary.
#[cfg(any(test, fuzzing))]
mod fuzz;
mod headers;
mod hpack;
mod limits;
mod out;
mod peer;
mod state;
mod stream;

pub(crate) use conn::{BoxFuture, BoxIo, Dialer, Relay, Setup, TLS_SEND_BUFFER};
#[cfg(any(test, fuzzing))]
pub use fuzz::{fuzz_frames_and_headers, fuzz_relay};

#[cfg(test)]
mod abuse_tests;
#[cfg(test)]
mod tests;
