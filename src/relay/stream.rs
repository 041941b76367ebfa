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
                    frame::put_rst(&mut dest.out, id, *reason);
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
                    frame::put_headers(&mut dest.out, id, *end, &block, dest.max_frame);
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
        match &self.raw {
            Some(raw) if whole => dest.out.extend_from_slice(raw),
            _ => frame::put_data(&mut dest.out, id, self.end && whole, &self.bytes[..n]),
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
