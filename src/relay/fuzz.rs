//! The relay's fuzzing entries. `fuzz_relay` (`fuzz/fuzz_targets/h2_relay.rs`) drives the
//! relay's state machine with arbitrary bytes or frames from the client and the origin, in
//! memory, in any order, some peers never reading: after every step the relay must not have
//! panicked and its limits must hold. `fuzz_frames_and_headers` checks the frame reader and the
//! HPACK coders.

use std::future::{poll_fn, Future};
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream, ReadBuf};

use super::conn::{BoxFuture, BoxIo, Relay, Setup};
use super::{frame, hpack};
use crate::upstream::UpstreamError;

const PIPE: usize = 64 * 1024;

/// Input: a flags byte (1: the client's preface and SETTINGS first, 2: the origin's SETTINGS
/// first, 4: the client never reads, 8: the origin never reads), then steps of
/// `[head, len, len bytes]`: bit 0 of `head` picks the origin over the client; bit 4 makes
/// the bytes one frame (`kind, flags, stream, payload`); bits 5-7 are extra polls.
#[doc(hidden)]
pub fn fuzz_relay(data: &[u8]) {
    let Some((&flags, mut rest)) = data.split_first() else {
        return;
    };
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        // Building a current-thread runtime fails only without OS resources.
        .expect("a runtime");
    rt.block_on(async move {
        let (mut client, relay_io) = tokio::io::duplex(PIPE);
        let (ours, mut origin) = tokio::io::duplex(PIPE);
        let relay = Relay::new(Box::new(relay_io), setup(ours));
        tokio::pin!(relay);
        let mut first_client = BytesMut::new();
        if flags & 1 != 0 {
            first_client.extend_from_slice(frame::PREFACE);
            frame::put_settings(&mut first_client, &[]);
        }
        let mut first_origin = BytesMut::new();
        if flags & 2 != 0 {
            frame::put_settings(&mut first_origin, &[]);
        }
        let mut done = step(&mut relay, &mut client, &first_client).await;
        done |= step(&mut relay, &mut origin, &first_origin).await;
        while !done {
            let [head, len, tail @ ..] = rest else {
                break;
            };
            let len = usize::from(*len).min(tail.len());
            let (bytes, next) = tail.split_at(len);
            rest = next;
            let bytes = if head & 0x10 != 0 {
                as_frame(bytes)
            } else {
                BytesMut::from(bytes)
            };
            let pipe = if head & 1 != 0 {
                &mut origin
            } else {
                &mut client
            };
            done = step(&mut relay, pipe, &bytes).await;
            for _ in 0..(head >> 5) {
                done |= poll_once(&mut relay).await;
            }
            if flags & 4 == 0 {
                drain(&mut client).await;
            }
            if flags & 8 == 0 {
                drain(&mut origin).await;
            }
            done |= poll_once(&mut relay).await;
        }
    });
}

/// `kind, flags, stream byte, payload` as one frame.
fn as_frame(bytes: &[u8]) -> BytesMut {
    let mut out = BytesMut::new();
    if let [kind, flags, stream, payload @ ..] = bytes {
        frame::put_head(&mut out, payload.len(), *kind, *flags, u32::from(*stream));
        out.extend_from_slice(payload);
    }
    out
}

fn setup(origin: DuplexStream) -> Setup {
    let origin = Arc::new(Mutex::new(Some(origin)));
    Setup {
        authority: "api2.cursor.sh".into(),
        port: 443,
        host: "api2.cursor.sh".into(),
        // The first dial reaches the fuzzed origin; a redial fails.
        dial: Box::new(move || -> BoxFuture<Result<BoxIo, UpstreamError>> {
            let io = origin.lock().ok().and_then(|mut o| o.take());
            Box::pin(async move {
                io.map(|io| Box::new(io) as BoxIo)
                    .ok_or_else(|| UpstreamError::Connect {
                        host: "api2.cursor.sh".into(),
                        reason: "fuzzing: no second origin".into(),
                    })
            })
        }),
        // Our server reads and answers nothing.
        internal: Box::new(|mut io| -> BoxFuture<()> {
            Box::pin(async move {
                let mut sink = tokio::io::sink();
                let _ = tokio::io::copy(&mut io, &mut sink).await;
            })
        }),
        #[cfg(test)]
        passthrough: |path| !path.starts_with("/ours"),
        stopping: Box::pin(std::future::pending()),
    }
}

/// Offer `bytes` to one pipe (what does not fit now is dropped), then poll the relay.
async fn step(relay: &mut Pin<&mut Relay>, pipe: &mut DuplexStream, bytes: &[u8]) -> bool {
    if !bytes.is_empty() {
        poll_fn(|cx| {
            let _ = Pin::new(&mut *pipe).poll_write(cx, bytes);
            Poll::Ready(())
        })
        .await;
    }
    poll_once(relay).await
}

/// Poll the relay once and check its limits; `true` once it ended.
async fn poll_once(relay: &mut Pin<&mut Relay>) -> bool {
    let done =
        poll_fn(|cx: &mut Context<'_>| Poll::Ready(relay.as_mut().poll(cx).is_ready())).await;
    if let Err(e) = relay.check_limits() {
        panic!("relay limits broken: {e}");
    }
    tokio::task::yield_now().await;
    done
}

/// Read whatever the relay wrote toward a peer.
async fn drain(pipe: &mut DuplexStream) {
    let mut scratch = vec![0u8; PIPE];
    poll_fn(|cx| loop {
        let mut buf = ReadBuf::new(&mut scratch);
        match Pin::new(&mut *pipe).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) if !buf.filled().is_empty() => continue,
            _ => return Poll::Ready(()),
        }
    })
    .await;
}

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
