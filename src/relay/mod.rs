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
mod fuzz;
mod headers;
mod hpack;
mod limits;
mod peer;
mod state;
mod stream;

pub(crate) use conn::{BoxFuture, BoxIo, Dialer, Relay, Setup};

/// Fuzzing entry (`fuzz/fuzz_targets/h2_frames.rs`): any bytes, cut at any chunk size, split
/// into the same frames as in one piece; every header block either fails to decode or, once
/// decoded, survives our encoders (own table and stateless) unchanged. Panics on a mismatch.
#[doc(hidden)]
pub fn fuzz_frames_and_headers(data: &[u8]) {
    use bytes::BytesMut;
    let Some((&ctl, body)) = data.split_first() else {
        return;
    };
    let reader = frame::FrameReader::new(frame::DEFAULT_MAX_FRAME);
    let frames = |chunk: usize| {
        let mut buf = BytesMut::new();
        let mut out = Vec::new();
        for piece in body.chunks(chunk) {
            buf.extend_from_slice(piece);
            loop {
                match reader.next(&mut buf) {
                    Ok(Some(f)) => out.push((f.kind, f.flags, f.stream, f.raw)),
                    Ok(None) => break,
                    Err(e) => {
                        out.push((0xff, 0, e.reason.0, bytes::Bytes::new()));
                        return out;
                    }
                }
            }
        }
        out
    };
    let whole = frames(body.len().max(1));
    assert_eq!(
        whole,
        frames(usize::from(ctl) + 1),
        "chunking changed the frames"
    );

    let mut decoder = hpack::Decoder::new();
    let mut own = hpack::BlockEncoding::own(hpack::TABLE_SIZE);
    let mut follower = hpack::Decoder::new();
    for (kind, flags, stream, raw) in whole {
        if kind != frame::kind::HEADERS {
            continue;
        }
        let f = frame::Frame {
            kind,
            flags,
            stream,
            raw,
        };
        let Ok(block) = f.header_fragment() else {
            continue;
        };
        let Ok(headers) = decoder.decode(&block) else {
            continue;
        };
        // Names, values, and whether each stays "never indexed".
        let pairs = |h: &hpack::Headers| -> Vec<(Vec<u8>, Vec<u8>, bool)> {
            h.iter_flagged()
                .map(|(n, v, never)| (n.to_vec(), v.to_vec(), never))
                .collect()
        };
        let own_block = own.encode(&headers);
        let again = follower.decode(&own_block).expect("our own block decodes");
        assert_eq!(
            pairs(&headers),
            pairs(&again),
            "own encoding changed the headers"
        );
        let stateless = hpack::BlockEncoding::Raw.encode(&headers);
        let again = follower
            .decode(&stateless)
            .expect("a stateless block decodes");
        assert_eq!(
            pairs(&headers),
            pairs(&again),
            "stateless encoding changed the headers"
        );
    }
}

/// Fuzzing entry (`fuzz/fuzz_targets/h2_relay.rs`): the relay's state machine driven by
/// arbitrary frames from the client and the origin; panics if a limit does not hold.
#[doc(hidden)]
pub fn fuzz_relay(data: &[u8]) {
    fuzz::run(data);
}

#[cfg(test)]
mod abuse_tests;
#[cfg(test)]
mod tests;
