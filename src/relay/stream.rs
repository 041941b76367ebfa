//! Streams: each has two directions with their own windows and queues, and moves what is
//! queued toward its destination as far as the windows allow.

use std::collections::VecDeque;

use bytes::{Buf, Bytes};

use super::conn::Relay;
use super::frame::{self, Reason};
use super::hpack::Headers;
use super::peer::{peer_of, Credit, Peer, Side, STREAM_WINDOW};

/// Which way along a stream data moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Direction {
    /// Client → target: the request.
    Up,
    /// Target → client: the answer.
    Down,
}

/// Items waiting for a window (DATA) or behind DATA (trailers).
pub(super) enum Item {
    Data {
        bytes: Bytes,
        end: bool,
        /// The frame as received, when it can be forwarded as is.
        raw: Option<Bytes>,
        /// Whose window it counts against (none for our own error bodies).
        from: Option<Side>,
    },
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
pub(super) struct Dir {
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

impl Dir {
    pub(super) fn new(send_window: i64) -> Self {
        Dir {
            send_window,
            queue: VecDeque::new(),
            recv_window: STREAM_WINDOW as i64,
            recv_pending: 0,
            ended_in: false,
            ended_out: false,
        }
    }
}

pub(super) struct Stream {
    /// Where the stream goes: the origin, our server, or `Client` for an answer of our own.
    pub(super) target: Side,
    /// Client → target.
    pub(super) up: Dir,
    /// Target → client.
    pub(super) down: Dir,
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
    /// state.
    fn toward(&mut self, to: Direction) -> (Side, &mut Dir) {
        match to {
            Direction::Up => (self.target, &mut self.up),
            Direction::Down => (Side::Client, &mut self.down),
        }
    }

    pub(super) fn dir(&mut self, to: Direction) -> &mut Dir {
        self.toward(to).1
    }
}

impl Relay {
    /// A stream's target, one of its directions and the peer
    /// that direction writes to.
    pub(super) fn route_of(
        &mut self,
        id: u32,
        to: Direction,
    ) -> Option<(Side, &mut Dir, &mut Peer)> {
        let st = self.streams.get_mut(&id)?;
        let target = st.target;
        let (dest_side, dir) = st.toward(to);
        let dest = peer_of(
            &mut self.client,
            &mut self.upstream,
            &mut self.internal,
            dest_side,
        )?;
        Some((target, dir, dest))
    }

    /// Move a direction's queued items into the destination's buffer as far as the windows
    /// allow.
    pub(super) fn flush_dir(&mut self, id: u32, to: Direction) {
        let overhead = self.limits.frame_overhead;
        let budget = (
            self.limits.reencode_ratio,
            self.limits.reencode_per_block,
            self.limits.reencode_slack,
        );
        let Some((target, dir, dest)) = self.route_of(id, to) else {
            return;
        };
        let source = match to {
            Direction::Up => Side::Client,
            Direction::Down => target,
        };
        // Held DATA from `source` that left the queue (bytes plus overhead).
        let mut unheld = 0;
        let mut over_budget = None;
        // What the client and the origin send is budgeted (our own server's is not).
        let budgeted = match to {
            Direction::Up => true,
            Direction::Down => target == Side::Upstream,
        };
        while let Some(item) = dir.queue.front_mut() {
            match item {
                Item::Data {
                    bytes,
                    end,
                    raw,
                    from,
                } => {
                    let len = bytes.len();
                    let window = dir.send_window.min(dest.send_conn).max(0) as usize;
                    let n = len.min(window).min(dest.max_frame as usize);
                    if n == 0 && len > 0 {
                        break;
                    }
                    let whole = n == len;
                    match raw {
                        Some(raw) if whole => dest.out.extend_from_slice(raw),
                        _ => frame::put_data(&mut dest.out, id, *end && whole, &bytes[..n]),
                    }
                    dir.send_window -= n as i64;
                    dest.send_conn -= n as i64;
                    let end_pos = dest.end_pos();
                    if let (Some(from), true) = (*from, n > 0) {
                        dest.credits.push_back(Credit {
                            end: end_pos,
                            from,
                            stream: id,
                            len: n as u32,
                        });
                    }
                    let counted = from.is_some();
                    if whole {
                        dir.ended_out |= *end;
                        dir.queue.pop_front();
                        if counted {
                            unheld += n + overhead;
                        }
                    } else {
                        bytes.advance(n);
                        *raw = None;
                        if counted {
                            unheld += n;
                        }
                    }
                }
                Item::Reset(reason) => {
                    frame::put_rst(&mut dest.out, id, *reason);
                    dir.ended_out = true;
                    dir.queue.pop_front();
                }
                Item::Headers {
                    headers,
                    end,
                    input,
                } => {
                    let block = dest.encoding.encode(headers);
                    if budgeted {
                        dest.reencoded_in += *input;
                        dest.reencoded_out += block.len();
                        dest.reencoded_blocks += 1;
                        let (ratio, per_block, slack) = budget;
                        let allowed =
                            ratio * dest.reencoded_in + per_block * dest.reencoded_blocks + slack;
                        if dest.reencoded_out > allowed {
                            over_budget = Some(dest.reencoded_out);
                            break;
                        }
                    }
                    frame::put_headers(&mut dest.out, id, *end, &block, dest.max_frame);
                    dir.ended_out |= *end;
                    dir.queue.pop_front();
                }
            }
        }
        self.unhold(source, unheld);
        if let Some(out) = over_budget {
            let dest = if to == Direction::Up {
                target
            } else {
                Side::Client
            };
            let input = self.peer(dest).map_or(0, |p| p.reencoded_in);
            let e = super::control::calm(format!(
                "{}: its {input} bytes of header blocks would take {out} re-encoded toward \
                 the {}, over {}× (header amplification)",
                source.name(),
                dest.name(),
                budget.0
            ));
            match source {
                Side::Client => self.pending_error = Some(e),
                _ => self.upstream_fault = Some(e),
            }
            return;
        }
        self.finish_if_done(id);
    }

    /// `len` accounted bytes of DATA from `from` are no longer held.
    pub(super) fn unhold(&mut self, from: Side, len: usize) {
        if let Some(peer) = self.peer(from) {
            peer.buffered = peer.buffered.saturating_sub(len);
        }
    }

    /// Flush every stream with something queued toward `side`.
    pub(super) fn flush_toward(&mut self, side: Side) {
        let ids: Vec<(u32, Direction)> = self
            .streams
            .iter()
            .filter_map(|(id, st)| {
                if side == Side::Client && !st.down.queue.is_empty() {
                    Some((*id, Direction::Down))
                } else if side != Side::Client && st.target == side && !st.up.queue.is_empty() {
                    Some((*id, Direction::Up))
                } else {
                    None
                }
            })
            .collect();
        for (id, to) in ids {
            self.flush_dir(id, to);
        }
    }

    pub(super) fn finish_if_done(&mut self, id: u32) {
        if self
            .streams
            .get(&id)
            .is_some_and(|st| st.up.ended_out && st.down.ended_out)
        {
            self.remove(id);
        }
    }

    /// Forget a stream; what it still had queued gives its senders' connection windows back.
    pub(super) fn remove(&mut self, id: u32) -> Option<Stream> {
        let mut st = self.streams.remove(&id)?;
        let overhead = self.limits.frame_overhead;
        if let Some(peer) = self.peer(st.target).filter(|_| st.target != Side::Client) {
            peer.open_streams = peer.open_streams.saturating_sub(1);
        }
        for dir in [&mut st.up, &mut st.down] {
            for item in dir.queue.drain(..) {
                if let Item::Data {
                    bytes,
                    from: Some(from),
                    ..
                } = item
                {
                    if let Some(peer) = peer_of(
                        &mut self.client,
                        &mut self.upstream,
                        &mut self.internal,
                        from,
                    ) {
                        peer.buffered = peer.buffered.saturating_sub(bytes.len() + overhead);
                    }
                    self.released.push(Credit {
                        end: 0,
                        from,
                        stream: id,
                        len: bytes.len() as u32,
                    });
                }
            }
        }
        let released = std::mem::take(&mut self.released);
        for credit in &released {
            self.grant(credit.from, None, credit.len);
        }
        self.released = released;
        self.released.clear();
        Some(st)
    }
}
