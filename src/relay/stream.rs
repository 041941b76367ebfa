//! Streams: each has two halves (one per direction) with their own windows and queues; a
//! half moves what is queued into its destination's output as far as the windows allow.

use std::collections::VecDeque;

use bytes::{Buf, Bytes};

use super::common::{Conn, Direction, STREAM_WINDOW};
use super::frame::{self, Reason};
use super::hpack::Headers;
use super::limits::Limits;
use super::peer::{Credit, Peer};

/// A DATA frame's content waiting for a window.
pub(super) struct Data {
    pub(super) bytes: Bytes,
    pub(super) end: bool,
    /// The frame as received, when it can be forwarded as is.
    pub(super) raw: Option<Bytes>,
    /// Whose window it counts against (none for our own error bodies).
    pub(super) from: Option<Conn>,
}

/// Items waiting for a window (DATA) or behind DATA (trailers).
pub(super) enum Item {
    Data(Data),
    Headers {
        headers: Headers,
        end: bool,
        /// The size its source sent it in (for the re-encoding budget).
        input: usize,
    },
    /// RST_STREAM once what is before it was delivered (an origin that answered in full and
    /// does not want the rest of the request).
    Reset(Reason),
}

/// One direction of a stream.
pub(super) struct Half {
    /// What we may still send toward the destination on this stream.
    pub(super) send_window: i64,
    pub(super) queue: VecDeque<Item>,
    /// What the source may still send us, and what was released but not granted yet.
    pub(super) recv_window: i64,
    pub(super) recv_pending: u32,
    /// END_STREAM arrived from the source / was handed to the destination's buffer.
    pub(super) ended_in: bool,
    pub(super) ended_out: bool,
}

/// What one flush of a half did besides writing.
pub(super) struct Flushed {
    /// Held DATA that left the queue (bytes plus overhead), to unhold from its source.
    pub(super) unheld: usize,
    /// Re-encoded header blocks went over their budget: the bytes they would have taken.
    pub(super) over_budget: Option<usize>,
}

impl Half {
    pub(super) fn new(send_window: i64) -> Self {
        Half {
            send_window,
            queue: VecDeque::new(),
            recv_window: STREAM_WINDOW as i64,
            recv_pending: 0,
            ended_in: false,
            ended_out: false,
        }
    }

    /// Move queued items into `dest`'s output as far as the windows allow. `budgeted`: the
    /// header blocks re-encoded toward `dest` count against the amplification budget.
    pub(super) fn flush_into(
        &mut self,
        id: u32,
        dest: &mut Peer,
        limits: &Limits,
        budgeted: bool,
    ) -> Flushed {
        let mut flushed = Flushed {
            unheld: 0,
            over_budget: None,
        };
        while let Some(item) = self.queue.front_mut() {
            match item {
                Item::Data(data) => {
                    let counted = data.from.is_some();
                    let end = data.end;
                    let Some((n, whole)) = data.put(id, &mut self.send_window, dest) else {
                        break;
                    };
                    if !whole {
                        // The rest waits in the queue; the next round sends on or stops.
                        flushed.unheld += if counted { n } else { 0 };
                        continue;
                    }
                    flushed.unheld += if counted {
                        n + limits.frame_overhead
                    } else {
                        0
                    };
                    self.ended_out |= end;
                }
                Item::Reset(reason) => {
                    frame::put_rst(dest.out.buf(), id, *reason);
                    self.ended_out = true;
                }
                Item::Headers {
                    headers,
                    end,
                    input,
                } => {
                    let block = dest.encoding.encode(headers);
                    if budgeted {
                        if let Some(out) = reencoded(dest, *input, block.len(), limits) {
                            flushed.over_budget = Some(out);
                            break;
                        }
                    }
                    frame::put_headers(dest.out.buf(), id, *end, &block, dest.max_frame);
                    self.ended_out |= *end;
                }
            }
            self.queue.pop_front();
        }
        flushed
    }
}

impl Data {
    /// Write as much as the windows allow toward `dest`: the bytes written and whether that
    /// was all; `None` if the windows allow nothing.
    fn put(&mut self, id: u32, send_window: &mut i64, dest: &mut Peer) -> Option<(usize, bool)> {
        let len = self.bytes.len();
        let window = (*send_window).min(dest.send_conn).max(0) as usize;
        let n = len.min(window).min(dest.max_frame as usize);
        if n == 0 && len > 0 {
            return None;
        }
        let whole = n == len;
        // The payload joins the output as it was read (no copy), as the received frame
        // when it goes whole.
        match self.raw.take() {
            Some(raw) if whole => dest.out.push(raw),
            _ => {
                frame::put_data_head(dest.out.buf(), id, self.end && whole, n);
                dest.out.push(self.bytes.slice(..n));
            }
        }
        *send_window -= n as i64;
        dest.send_conn -= n as i64;
        if let (Some(from), true) = (self.from, n > 0) {
            dest.credits.push_back(Credit {
                end: dest.end_pos(),
                from,
                stream: id,
                len: n as u32,
            });
        }
        if !whole {
            self.bytes.advance(n);
            self.raw = None;
        }
        Some((n, whole))
    }
}

/// Count a block re-encoded toward `dest` (`input` bytes from its source, `output` ours);
/// the re-encoded total if that takes it over its budget.
fn reencoded(dest: &mut Peer, input: usize, output: usize, limits: &Limits) -> Option<usize> {
    dest.reencoded_in += input;
    dest.reencoded_out += output;
    dest.reencoded_blocks += 1;
    let allowed = limits.reencode_ratio * dest.reencoded_in
        + limits.reencode_per_block * dest.reencoded_blocks
        + limits.reencode_slack;
    (dest.reencoded_out > allowed).then_some(dest.reencoded_out)
}

pub(super) struct Stream {
    /// Where the stream goes: the origin, our server, or `Client` for an answer of our own.
    pub(super) target: Conn,
    /// Client → target.
    pub(super) up: Half,
    /// Target → client.
    pub(super) down: Half,
    /// The target answered with a response head.
    pub(super) answered: bool,
    /// A Connect client (reads `{"code","message"}` error bodies).
    pub(super) connect_style: bool,
    /// The rest of the request goes nowhere: the answer is ours, or the target reset the
    /// stream after answering in full.
    pub(super) discard_up: bool,
}

impl Stream {
    /// The destination of a direction (the target for `Up`, the client for `Down`) and its
    /// half.
    pub(super) fn toward(&mut self, to: Direction) -> (Conn, &mut Half) {
        match to {
            Direction::Up => (self.target, &mut self.up),
            Direction::Down => (Conn::Client, &mut self.down),
        }
    }

    pub(super) fn half(&mut self, to: Direction) -> &mut Half {
        self.toward(to).1
    }

    /// Where a direction's items come from: the client for `Up`, the target for `Down`.
    pub(super) fn source(&self, to: Direction) -> Conn {
        match to {
            Direction::Up => Conn::Client,
            Direction::Down => self.target,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io;
    use std::pin::Pin;
    use std::task::{Context, Poll, Waker};

    use bytes::BytesMut;
    use tokio::io::AsyncWrite;

    use super::*;
    use crate::relay::hpack::BlockEncoding;

    /// A socket that takes at most `take` bytes per write (first `first`, if set).
    struct Trickle {
        got: Vec<u8>,
        first: Option<usize>,
        take: usize,
        vectored: bool,
    }

    impl AsyncWrite for Trickle {
        fn poll_write(
            self: Pin<&mut Self>,
            cx: &mut Context<'_>,
            buf: &[u8],
        ) -> Poll<io::Result<usize>> {
            self.poll_write_vectored(cx, &[io::IoSlice::new(buf)])
        }

        fn poll_write_vectored(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
            bufs: &[io::IoSlice<'_>],
        ) -> Poll<io::Result<usize>> {
            let mut room = self.first.take().unwrap_or(self.take);
            let before = self.got.len();
            for buf in bufs {
                let n = room.min(buf.len());
                self.got.extend_from_slice(&buf[..n]);
                room -= n;
            }
            Poll::Ready(Ok(self.got.len() - before))
        }

        fn is_write_vectored(&self) -> bool {
            self.vectored
        }

        fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }

        fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    /// DATA as the reader hands it over: a slice of the received frame.
    fn received(id: u32, payload: &[u8]) -> Data {
        let mut raw = BytesMut::new();
        frame::put_data(&mut raw, id, false, payload);
        let raw = raw.freeze();
        Data {
            bytes: raw.slice(frame::HEADER_LEN..),
            end: false,
            raw: Some(raw),
            from: Some(Conn::Upstream),
        }
    }

    /// A WINDOW_UPDATE waiting, then a DATA frame forwarded whole and one larger than the
    /// destination's frame size (sent in two): the peer, the bytes it must write, the payload
    /// pointers that must reach its output uncopied, and where each DATA frame ends.
    fn flushed() -> (Peer, Vec<u8>, Vec<*const u8>, Vec<u64>) {
        let mut dest = Peer::new(true, BlockEncoding::Raw);
        dest.send_conn = 1 << 20;
        frame::put_window_update(dest.out.buf(), 0, 1000);
        let small: Vec<u8> = (0..3000u32).map(|i| (i % 251) as u8).collect();
        let large: Vec<u8> = (0..20_000u32).map(|i| (i % 241) as u8).collect();
        let mut half = Half::new(1 << 20);
        let (a, b) = (received(1, &small), received(1, &large));
        let pointers = vec![
            a.raw.as_ref().map_or(std::ptr::null(), |r| r.as_ptr()),
            b.bytes.as_ptr(),
            b.bytes[16_384..].as_ptr(),
        ];
        half.queue.push_back(Item::Data(a));
        half.queue.push_back(Item::Data(b));
        half.flush_into(1, &mut dest, &Limits::default(), false);
        assert!(half.queue.is_empty());
        let mut expected = BytesMut::new();
        frame::put_window_update(&mut expected, 0, 1000);
        let mut ends = Vec::new();
        for part in [&small[..], &large[..16_384], &large[16_384..]] {
            frame::put_data(&mut expected, 1, false, part);
            ends.push(expected.len() as u64);
        }
        (dest, expected.to_vec(), pointers, ends)
    }

    #[test]
    fn data_payloads_reach_the_output_uncopied() {
        let (dest, expected, pointers, ends) = flushed();
        let queued: Vec<*const u8> = dest.out.segments().map(|s| s.as_ptr()).collect();
        for p in pointers {
            assert!(queued.contains(&p), "a payload was copied into the output");
        }
        let credits: Vec<u64> = dest.credits.iter().map(|c| c.end).collect();
        assert_eq!(credits, ends);
        assert_eq!(dest.out.len(), expected.len());
    }

    /// Writes that stop at every byte keep `written` (and so the credits granted back) equal
    /// to what the socket took, vectored or not.
    #[test]
    fn partial_writes_keep_credits_exact_at_every_split() {
        let cx = &mut Context::from_waker(Waker::noop());
        let total = flushed().1.len();
        for vectored in [true, false] {
            for split in 0..=total {
                let (mut dest, expected, _, ends) = flushed();
                let mut io = Trickle {
                    got: Vec::new(),
                    first: Some(split),
                    take: 4099,
                    vectored,
                };
                while !dest.out.is_empty() {
                    let Poll::Ready(Ok(n)) = dest.out.poll_write(&mut io, cx, usize::MAX) else {
                        panic!("the writer is always ready");
                    };
                    dest.sent(n);
                    assert_eq!(dest.written, io.got.len() as u64, "split {split}");
                    let done = dest.credits.iter().filter(|c| c.end <= dest.written);
                    let whole = ends.iter().filter(|end| **end <= io.got.len() as u64);
                    assert_eq!(done.count(), whole.count(), "split {split}");
                }
                assert!(io.got == expected, "split {split} (vectored: {vectored})");
            }
        }
    }
}
