//! The streams and the peers they flow between: windows granted back once data left,
//! queues moved as far as the windows allow, streams removed with what they still held.
//! Everything here writes frames into the peers' output buffers; no socket is touched.

use std::collections::HashMap;

use super::common::{Conn, Direction, CONN_WINDOW, STREAM_WINDOW};
use super::frame::{self, setting, ConnError, Reason};
use super::hpack::{self, BlockEncoding};
use super::limits::{calm, Limits, Spent};
use super::peer::{Credit, Peer, Peers};
use super::stream::{Data, Half, Item, Stream};

/// The stream table and the three peers, with the limits they are held to.
pub(super) struct Flow {
    pub(super) peers: Peers,
    pub(super) streams: HashMap<u32, Stream>,
    /// Highest stream id the client opened.
    pub(super) last_stream: u32,
    pub(super) limits: Limits,
    pub(super) spent: Spent,
    /// A connection error found while moving frames (not while reading the client): raised
    /// toward the client by the driver.
    pub(super) pending_error: Option<ConnError>,
    /// Likewise, an error of the origin's.
    pub(super) upstream_fault: Option<ConnError>,
    /// Scratch for credits released at once (kept to reuse its allocation).
    released: Vec<Credit>,
}

impl Flow {
    pub(super) fn new(limits: Limits) -> Self {
        let mut client = Peer::new(true, BlockEncoding::Raw);
        frame::put_settings(
            client.out.buf(),
            &[
                (setting::MAX_CONCURRENT_STREAMS, limits.max_streams as u32),
                (setting::INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (setting::MAX_HEADER_LIST_SIZE, hpack::MAX_LIST_SIZE as u32),
            ],
        );
        frame::put_window_update(client.out.buf(), 0, CONN_WINDOW - frame::DEFAULT_WINDOW);
        // Frames for the origin wait in its buffer while it is dialled.
        let upstream = Peer::client_role(false, BlockEncoding::Raw);
        Flow {
            peers: Peers {
                client,
                upstream: Some(upstream),
                internal: None,
            },
            streams: HashMap::new(),
            last_stream: 0,
            spent: Spent::new(&limits),
            limits,
            pending_error: None,
            upstream_fault: None,
            released: Vec::new(),
        }
    }

    /// The peer a frame came from. Only the driver removes peers, never a frame handler, so
    /// it is there; the error is for the impossible case, not a panic.
    pub(super) fn source(&mut self, side: Conn) -> Result<&mut Peer, ConnError> {
        self.peers
            .get_mut(side)
            .ok_or_else(|| ConnError::new(Reason::INTERNAL_ERROR, "frame from a closed peer"))
    }

    /// `len` bytes that `from` sent are off our hands: give the windows back, in batches.
    pub(super) fn grant(&mut self, from: Conn, stream: Option<u32>, len: u32) {
        let mut stream_update = None;
        if let Some((id, st)) = stream.and_then(|id| self.streams.get_mut(&id).map(|st| (id, st))) {
            let half = match from {
                Conn::Client => Some(&mut st.up),
                side if side == st.target => Some(&mut st.down),
                _ => None,
            };
            if let Some(half) = half.filter(|h| !h.ended_in) {
                half.recv_pending += len;
                if half.recv_pending >= STREAM_WINDOW / 2 {
                    stream_update = Some((id, half.recv_pending));
                    half.recv_window += half.recv_pending as i64;
                    half.recv_pending = 0;
                }
            }
        }
        self.peers.grant(from, stream_update, len);
    }

    /// The connection windows of what a peer that is gone still had in flight.
    pub(super) fn release_credits(&mut self, peer: Peer) {
        for credit in peer.credits {
            self.grant(credit.from, None, credit.len);
        }
    }

    /// After a write toward `side`: grant back the data that left. `true` if any did.
    pub(super) fn release_written(&mut self, side: Conn) -> bool {
        let Some(peer) = self.peers.get_mut(side) else {
            return false;
        };
        while peer.credits.front().is_some_and(|c| c.end <= peer.written) {
            if let Some(credit) = peer.credits.pop_front() {
                self.released.push(credit);
            }
        }
        if self.released.is_empty() {
            return false;
        }
        self.grant_released(true);
        true
    }

    /// Grant what `released` holds (to its stream too if `per_stream`), keeping the scratch.
    fn grant_released(&mut self, per_stream: bool) {
        let released = std::mem::take(&mut self.released);
        for credit in &released {
            let stream = per_stream.then_some(credit.stream);
            self.grant(credit.from, stream, credit.len);
        }
        self.released = released;
        self.released.clear();
    }

    /// Move a direction's queued items into the destination's buffer as far as the windows
    /// allow.
    pub(super) fn flush_dir(&mut self, id: u32, to: Direction) {
        let Some(st) = self.streams.get_mut(&id) else {
            return;
        };
        let source = st.source(to);
        // What the client and the origin send is budgeted (our own server's is not, nor our
        // own answers).
        let budgeted = match to {
            Direction::Up => true,
            Direction::Down => st.target == Conn::Upstream,
        };
        let (dest_side, half) = st.toward(to);
        let Some(dest) = self.peers.get_mut(dest_side) else {
            return;
        };
        let flushed = half.flush_into(id, dest, &self.limits, budgeted);
        self.peers.unhold(source, flushed.unheld);
        if let Some(out) = flushed.over_budget {
            self.over_budget(source, dest_side, out);
            return;
        }
        self.finish_if_done(id);
    }

    /// Header blocks from `source` re-encoded toward `dest` would take `out` bytes, over the
    /// budget (header amplification): the source's connection fails.
    fn over_budget(&mut self, source: Conn, dest: Conn, out: usize) {
        let input = self.peers.get(dest).map_or(0, |p| p.reencoded_in);
        let e = calm(format!(
            "{}: its {input} bytes of header blocks would take {out} re-encoded toward \
             the {}, over {}× (header amplification)",
            source.name(),
            dest.name(),
            self.limits.reencode_ratio
        ));
        match source {
            Conn::Client => self.pending_error = Some(e),
            _ => self.upstream_fault = Some(e),
        }
    }

    /// Flush every stream with something queued toward `side`.
    pub(super) fn flush_toward(&mut self, side: Conn) {
        let ids: Vec<(u32, Direction)> = self
            .streams
            .iter()
            .filter_map(|(id, st)| {
                if side == Conn::Client && !st.down.queue.is_empty() {
                    Some((*id, Direction::Down))
                } else if side != Conn::Client && st.target == side && !st.up.queue.is_empty() {
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
        if let Some(peer) = self
            .peers
            .get_mut(st.target)
            .filter(|_| st.target != Conn::Client)
        {
            peer.open_streams = peer.open_streams.saturating_sub(1);
        }
        for half in [&mut st.up, &mut st.down] {
            for item in half.queue.drain(..) {
                if let Item::Data(Data {
                    bytes,
                    from: Some(from),
                    ..
                }) = item
                {
                    self.peers.unhold(from, bytes.len() + overhead);
                    self.released.push(Credit {
                        end: 0,
                        from,
                        stream: id,
                        len: bytes.len() as u32,
                    });
                }
            }
        }
        self.grant_released(false);
        Some(st)
    }

    /// A stream error: both sides get RST_STREAM.
    pub(super) fn reset_stream(&mut self, id: u32, reason: Reason) {
        let Some(st) = self.remove(id) else {
            return;
        };
        for side in [Conn::Client, st.target] {
            if let Some(peer) = self.peers.get_mut(side) {
                frame::put_rst(peer.out.buf(), id, reason);
            }
        }
    }

    /// A stream error: both sides get RST_STREAM; one the client caused counts toward
    /// `limits.max_error_resets`.
    pub(super) fn stream_error(
        &mut self,
        side: Conn,
        id: u32,
        reason: Reason,
    ) -> Result<(), ConnError> {
        if self.streams.contains_key(&id) {
            self.reset_stream(id, reason);
        } else {
            frame::put_rst(self.peers.client.out.buf(), id, reason);
        }
        if side != Conn::Client {
            return Ok(());
        }
        self.spent.error_reset(&self.limits)
    }

    /// A new stream toward `target`, which takes one of its stream slots; `false` if the
    /// target is gone.
    pub(super) fn open(
        &mut self,
        id: u32,
        target: Conn,
        ended_in: bool,
        connect_style: bool,
    ) -> bool {
        let client_window = self.peers.client.init_window;
        let Some(dest) = self.peers.get_mut(target) else {
            return false;
        };
        dest.open_streams += 1;
        let mut up = Half::new(dest.init_window);
        up.ended_in = ended_in;
        self.streams.insert(
            id,
            Stream {
                target,
                up,
                down: Half::new(client_window),
                answered: false,
                connect_style,
                discard_up: false,
            },
        );
        true
    }
}
