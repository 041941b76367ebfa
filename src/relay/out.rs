//! A peer's output: the frames waiting for its socket, as a queue of byte segments. DATA
//! payloads (and frames forwarded as received) join the queue as the `Bytes` they were read
//! into, and leave in vectored writes, so a payload is copied once on its way through (into
//! the TLS record), as a plain TLS relay copies it. Frame headers and control frames are
//! written into a small buffer that follows the queued segments.

use std::collections::VecDeque;
use std::io::{self, IoSlice};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::AsyncWrite;

/// Segments shorter than this are copied into the buffer: a slice of its own would cost a
/// vectored write more than the copy does, and a peer sending tiny frames cannot make the
/// queue long.
const COPY_BELOW: usize = 512;

/// Slices handed to one vectored write (well under every platform's `IOV_MAX`).
const MAX_SLICES: usize = 64;

#[derive(Default)]
pub(super) struct Out {
    /// Segments, oldest first; `tail` follows them.
    queued: VecDeque<Bytes>,
    /// Bytes in `queued`.
    queued_len: usize,
    /// Where frames are written: after everything in `queued`.
    tail: BytesMut,
}

impl Out {
    /// Where the next frame is written (after everything waiting).
    pub(super) fn buf(&mut self) -> &mut BytesMut {
        &mut self.tail
    }

    /// Append `bytes` without copying them (unless they are few).
    pub(super) fn push(&mut self, bytes: Bytes) {
        if bytes.len() < COPY_BELOW {
            self.tail.extend_from_slice(&bytes);
            return;
        }
        if !self.tail.is_empty() {
            let written = self.tail.split().freeze();
            self.queued_len += written.len();
            self.queued.push_back(written);
        }
        self.queued_len += bytes.len();
        self.queued.push_back(bytes);
    }

    pub(super) fn len(&self) -> usize {
        self.queued_len + self.tail.len()
    }

    pub(super) fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// What waits, in order, as up to `dst.len()` slices of at most `limit` bytes in all; how
    /// many were filled.
    pub(super) fn slices<'a>(&'a self, dst: &mut [IoSlice<'a>], mut limit: usize) -> usize {
        let parts = self.queued.iter().map(|b| &b[..]);
        let all = parts.chain(std::iter::once(&self.tail[..]));
        let mut n = 0;
        for (slot, part) in dst.iter_mut().zip(all.filter(|p| !p.is_empty())) {
            if limit == 0 {
                break;
            }
            let part = &part[..part.len().min(limit)];
            limit -= part.len();
            *slot = IoSlice::new(part);
            n += 1;
        }
        n
    }

    /// Everything waiting as one slice, copied together first if it is in several segments:
    /// for a writer that takes one slice at a time (a TLS stream would make a record of each
    /// frame header).
    pub(super) fn contiguous(&mut self, limit: usize) -> &[u8] {
        if !self.queued.is_empty() {
            let mut all = BytesMut::with_capacity(self.len());
            for part in self.queued.drain(..) {
                all.extend_from_slice(&part);
            }
            all.extend_from_slice(&self.tail);
            self.queued_len = 0;
            self.tail = all;
        }
        &self.tail[..self.tail.len().min(limit)]
    }

    /// One write of what waits to `io` (the caller advances by what it took): vectored where
    /// the writer takes several slices at once (TLS then fills whole records from them), else
    /// the output copied together first.
    /// At most `limit` bytes go.
    pub(super) fn poll_write<W: AsyncWrite + Unpin + ?Sized>(
        &mut self,
        io: &mut W,
        cx: &mut Context<'_>,
        limit: usize,
    ) -> Poll<io::Result<usize>> {
        if !io.is_write_vectored() {
            return Pin::new(io).poll_write(cx, self.contiguous(limit));
        }
        let mut slices = [IoSlice::new(&[]); MAX_SLICES];
        let n = self.slices(&mut slices, limit);
        Pin::new(io).poll_write_vectored(cx, &slices[..n])
    }

    /// `n` bytes from the front reached the socket.
    pub(super) fn advance(&mut self, mut n: usize) {
        while n > 0 {
            let Some(front) = self.queued.front_mut() else {
                self.tail.advance(n.min(self.tail.len()));
                return;
            };
            let k = n.min(front.len());
            front.advance(k);
            self.queued_len -= k;
            n -= k;
            if front.is_empty() {
                self.queued.pop_front();
            }
        }
    }

    /// Tests: the queued segments, to see that a payload was not copied.
    #[cfg(test)]
    pub(super) fn segments(&self) -> impl Iterator<Item = &Bytes> {
        self.queued.iter()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gather(out: &Out) -> Vec<u8> {
        let mut slices = [IoSlice::new(&[]); MAX_SLICES];
        let n = out.slices(&mut slices, usize::MAX);
        slices[..n].iter().flat_map(|s| s.iter().copied()).collect()
    }

    /// Frames, a large payload, frames, another payload, frames: 3 segments and a tail.
    fn sample() -> (Out, Vec<u8>) {
        let mut out = Out::default();
        let mut expected = Vec::new();
        let big = Bytes::from((0..2000u32).map(|i| i as u8).collect::<Vec<_>>());
        out.buf().extend_from_slice(b"head-1");
        out.push(big.slice(..1000));
        out.buf().extend_from_slice(b"head-2");
        out.push(Bytes::from_static(b"tiny"));
        out.push(big.slice(1000..));
        out.buf().extend_from_slice(b"trailer");
        for part in [
            &b"head-1"[..],
            &big[..1000],
            b"head-2",
            b"tiny",
            &big[1000..],
        ] {
            expected.extend_from_slice(part);
        }
        expected.extend_from_slice(b"trailer");
        (out, expected)
    }

    #[test]
    fn large_segments_are_queued_as_they_are_small_ones_copied() {
        let big = Bytes::from(vec![7u8; 4096]);
        let mut out = Out::default();
        out.buf().extend_from_slice(b"header");
        out.push(big.clone());
        out.push(Bytes::from_static(b"small"));
        let queued: Vec<_> = out.segments().collect();
        assert_eq!(queued.len(), 2);
        assert_eq!(&queued[0][..], b"header");
        assert_eq!(queued[1].as_ptr(), big.as_ptr(), "the payload was copied");
        assert_eq!(out.len(), 6 + 4096 + 5);
    }

    #[test]
    fn slices_keep_the_order_at_every_advance() {
        let (whole, expected) = sample();
        assert_eq!(gather(&whole), expected);
        for split in 0..=expected.len() {
            let (mut out, _) = sample();
            out.advance(split);
            assert_eq!(out.len(), expected.len() - split, "split {split}");
            assert_eq!(gather(&out), expected[split..], "split {split}");
            assert_eq!(
                out.contiguous(usize::MAX),
                &expected[split..],
                "split {split}"
            );
        }
    }

    #[test]
    fn slices_stop_at_the_room_given() {
        let mut out = Out::default();
        for i in 0..10u8 {
            out.buf().extend_from_slice(&[i]);
            out.push(Bytes::from(vec![i; COPY_BELOW]));
        }
        let mut slices = [IoSlice::new(&[]); 5];
        assert_eq!(out.slices(&mut slices, usize::MAX), 5);
        assert_eq!(&slices[0][..], &[0]);
        assert_eq!(slices[1].len(), COPY_BELOW);
    }

    /// A limit cuts the output at that byte, inside a segment or the tail, at every limit.
    #[test]
    fn slices_and_the_contiguous_copy_stop_at_the_limit() {
        let (_, expected) = sample();
        for limit in 0..=expected.len() + 1 {
            let (mut out, _) = sample();
            let mut slices = [IoSlice::new(&[]); MAX_SLICES];
            let n = out.slices(&mut slices, limit);
            let got: Vec<u8> = slices[..n].iter().flat_map(|s| s.iter().copied()).collect();
            let want = &expected[..limit.min(expected.len())];
            assert_eq!(got, want, "limit {limit}");
            assert_eq!(out.contiguous(limit), want, "limit {limit}");
        }
    }
}
