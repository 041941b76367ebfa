//! The relay's connection state, without I/O: a frame from one side goes in, and what it
//! causes comes out as frames in the peers' output buffers (and, when a new stream needs
//! one, a connection the driver is asked to make). The driver (`conn`) owns the sockets.
//!
//! The parts: the streams and the peers they flow between (`flow`), header blocks and where
//! a new stream goes (`headers`), the other frames (`control`), failures (`failure`).

use super::common::Conn;
use super::control;
use super::failure;
use super::flow::Flow;
use super::frame::{self, kind, ConnError, Frame, Reason};
use super::headers::{self, Block, Opener, Wants};
use super::limits::Limits;
use super::peer::Peer;
#[cfg(any(test, fuzzing))]
use super::stream::{Data, Item};
use crate::upstream::UpstreamError;

/// What a relay holds at one moment (largest of its peers).
#[cfg(any(test, fuzzing))]
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Held {
    /// Output waiting for one peer, in bytes.
    pub(crate) out: usize,
    /// DATA held for windows from one peer, in accounted bytes.
    pub(crate) buffered: usize,
    pub(crate) streams: usize,
    /// Items waiting in stream queues.
    pub(crate) queued_items: usize,
}

#[cfg(any(test, fuzzing))]
impl Held {
    #[cfg(test)]
    pub(crate) fn max(self, other: Held) -> Held {
        Held {
            out: self.out.max(other.out),
            buffered: self.buffered.max(other.buffered),
            streams: self.streams.max(other.streams),
            queued_items: self.queued_items.max(other.queued_items),
        }
    }
}

pub(super) struct ConnState {
    flow: Flow,
    opener: Opener,
    /// We told the client GOAWAY (shutdown): no new streams, close when the last one ends.
    draining: bool,
    /// The client said GOAWAY: close when the last stream ends.
    client_goaway: bool,
    /// A connection error: close once the GOAWAY is written.
    closing: bool,
}

impl ConnState {
    pub(super) fn new(limits: Limits, opener: Opener) -> Self {
        ConnState {
            flow: Flow::new(limits),
            opener,
            draining: false,
            client_goaway: false,
            closing: false,
        }
    }

    /// One frame from `side`.
    pub(super) fn on_frame(&mut self, side: Conn, frame: Frame) -> Result<(), ConnError> {
        let peer = self.flow.source(side)?;
        if !peer.settings_seen {
            if frame.kind != kind::SETTINGS || frame.has(frame::flag::ACK) {
                return Err(ConnError::protocol(format!(
                    "{}: the first frame is not SETTINGS (RFC 9113 §3.4)",
                    side.name()
                )));
            }
            peer.settings_seen = true;
        }
        if peer.partial.is_some() && frame.kind != kind::CONTINUATION {
            return Err(ConnError::protocol(
                "a frame inside a header block (RFC 9113 §6.10)",
            ));
        }
        if side == Conn::Client && control::costs_without_carrying(&frame) {
            self.flow.spent.control_frame()?;
        }
        let flow = &mut self.flow;
        match frame.kind {
            kind::DATA => control::on_data(flow, side, frame),
            kind::HEADERS => {
                let block = headers::on_headers(flow, side, &frame)?;
                self.on_block(side, block)
            }
            kind::CONTINUATION => {
                let block = headers::on_continuation(flow, side, &frame)?;
                self.on_block(side, block)
            }
            kind::PRIORITY => Ok(()),
            kind::RST_STREAM => control::on_rst_stream(flow, side, &frame),
            kind::SETTINGS => control::on_settings(flow, side, &frame),
            kind::PUSH_PROMISE => Err(ConnError::protocol("PUSH_PROMISE (push is disabled)")),
            kind::PING => control::on_ping(flow, side, &frame),
            kind::GOAWAY => {
                let (last, code) = control::goaway(&frame)?;
                if side == Conn::Client {
                    self.client_goaway = true;
                    tracing::debug!(%code, "client sent GOAWAY");
                } else {
                    control::target_goaway(flow, side, last, code);
                }
                Ok(())
            }
            kind::WINDOW_UPDATE => control::on_window_update(flow, side, &frame),
            // Unknown frame types are ignored (RFC 9113 §4.1).
            _ => Ok(()),
        }
    }

    /// A whole header block, if the frame ended one.
    fn on_block(&mut self, side: Conn, block: Option<Block>) -> Result<(), ConnError> {
        let Some(block) = block else {
            return Ok(());
        };
        if side == Conn::Client {
            self.opener.on_request(&mut self.flow, block, self.draining)
        } else {
            headers::on_response(&mut self.flow, side, block);
            Ok(())
        }
    }

    pub(super) fn limits(&self) -> &Limits {
        &self.flow.limits
    }

    /// Call `f` for every stream the client opens.
    pub(super) fn on_stream(&mut self, f: Box<dyn FnMut() + Send>) {
        self.opener.on_stream = Some(f);
    }

    /// A connection error was raised: nothing more is read from the client.
    pub(super) fn closing(&self) -> bool {
        self.closing
    }

    /// Connections asked for since the last call.
    pub(super) fn take_wants(&mut self) -> Wants {
        std::mem::take(&mut self.opener.wants)
    }

    /// The socket of `side` is there; `false` if the peer is gone meanwhile.
    pub(super) fn connected(&mut self, side: Conn) -> bool {
        let Some(peer) = self.flow.peers.get_mut(side) else {
            return false;
        };
        peer.connected = true;
        true
    }

    pub(super) fn peer_mut(&mut self, side: Conn) -> Option<&mut Peer> {
        self.flow.peers.get_mut(side)
    }

    /// After a write toward `side`: grant back the data that left. `true` if any did.
    pub(super) fn release_written(&mut self, side: Conn) -> bool {
        self.flow.release_written(side)
    }

    /// An error of the client's found while moving frames.
    pub(super) fn take_client_error(&mut self) -> Option<ConnError> {
        self.flow.pending_error.take()
    }

    /// An error found while moving frames waits to be raised.
    pub(super) fn faulted(&self) -> bool {
        self.flow.pending_error.is_some() || self.flow.upstream_fault.is_some()
    }

    /// An error of the origin's found while moving frames.
    pub(super) fn take_upstream_fault(&mut self) -> Option<ConnError> {
        self.flow.upstream_fault.take()
    }

    /// Shutdown: no new streams; the connection closes when the last one ends.
    pub(super) fn drain(&mut self) {
        if self.draining {
            return;
        }
        self.draining = true;
        let client = &mut self.flow.peers.client;
        frame::put_goaway(
            client.out.buf(),
            self.flow.last_stream,
            Reason::NO_ERROR,
            "",
        );
    }

    /// The client broke the protocol: GOAWAY with the reason, and close.
    pub(super) fn client_error(&mut self, e: ConnError) {
        failure::client_error(&mut self.flow, &e);
        self.closing = true;
    }

    /// The origin failed or closed; `false` if it was gone already.
    pub(super) fn upstream_gone(&mut self, err: &UpstreamError) -> bool {
        let Some(idle) = failure::upstream_gone(&mut self.flow, err) else {
            return false;
        };
        // Closed while idle (not a failed dial): the next passthrough stream redials.
        self.opener.may_redial = idle;
        true
    }

    pub(super) fn internal_gone(&mut self) {
        failure::internal_gone(&mut self.flow);
    }

    /// Upstream liveness at a keep-alive tick: PING a connection with open streams that sent
    /// nothing (`active`) since the last tick; `false` if the last PING went unanswered.
    pub(super) fn ping_upstream(&mut self, active: bool) -> bool {
        let Some(upstream) = self.flow.peers.upstream.as_mut() else {
            return true;
        };
        if upstream.ping_out {
            return false;
        }
        if upstream.open_streams > 0 && !active {
            frame::put_ping(upstream.out.buf(), false, *b"byok-ka!");
            upstream.ping_out = true;
        }
        true
    }

    fn finished(&self) -> bool {
        let flow = &self.flow;
        self.closing || ((self.draining || self.client_goaway) && flow.streams.is_empty())
    }

    /// Over, and everything owed to the client is written: the connection may close.
    pub(super) fn closed(&self) -> bool {
        self.finished() && self.flow.peers.client.out.is_empty()
    }

    /// Backpressure: a peer is not read while output waits for it beyond the bound (it does
    /// not read what we owe it) or its DATA held for windows is over the bound; the client is
    /// not read either while a peer it feeds is that far behind.
    pub(super) fn may_read(&self, side: Conn) -> bool {
        let limits = &self.flow.limits;
        let peers = &self.flow.peers;
        let Some(peer) = peers.get(side) else {
            return true;
        };
        // What one peer sends mostly lands in another's buffer: none is read while any is
        // behind.
        let any_behind = peers.iter().any(|p| p.out.len() > limits.max_pending_out);
        !any_behind && peer.buffered <= limits.max_buffered
    }

    /// What the connection holds now, for tests and fuzzing to check against the limits.
    #[cfg(any(test, fuzzing))]
    pub(super) fn usage(&self) -> Held {
        let mut usage = Held {
            streams: self.flow.streams.len(),
            ..Held::default()
        };
        for p in self.flow.peers.iter() {
            usage.out = usage.out.max(p.out.len());
            usage.buffered = usage.buffered.max(p.buffered);
        }
        for st in self.flow.streams.values() {
            usage.queued_items += st.up.queue.len() + st.down.queue.len();
        }
        usage
    }

    /// Fuzzing and tests: the limits hold, and the held-DATA accounting matches the queues.
    #[cfg(any(test, fuzzing))]
    pub(super) fn check_limits(&self) -> Result<(), String> {
        let limits = &self.flow.limits;
        let usage = self.usage();
        // One read's worth of output on top of each bound (a read is at most a few frames
        // of 16 KiB; a block re-encoded may take `reencode_per_block` more).
        let slack = 4 * 1024 * 1024;
        if usage.out > limits.max_pending_out + limits.max_buffered + slack {
            return Err(format!("output over its bound: {usage:?}"));
        }
        if usage.buffered > limits.max_buffered + slack {
            return Err(format!("held DATA over its bound: {usage:?}"));
        }
        if usage.streams > limits.max_streams {
            return Err(format!("streams over the limit: {usage:?}"));
        }
        for side in Conn::ALL {
            let Some(peer) = self.flow.peers.get(side) else {
                continue;
            };
            let held = self.held_from(side);
            if held != peer.buffered {
                return Err(format!(
                    "{side:?}: {held} bytes held, {} accounted",
                    peer.buffered
                ));
            }
        }
        Ok(())
    }

    /// DATA from `side` in the stream queues, in accounted bytes.
    #[cfg(any(test, fuzzing))]
    fn held_from(&self, side: Conn) -> usize {
        let overhead = self.flow.limits.frame_overhead;
        let queues = self.flow.streams.values();
        let items = queues.flat_map(|st| st.up.queue.iter().chain(st.down.queue.iter()));
        items
            .filter_map(|item| match item {
                Item::Data(Data {
                    bytes,
                    from: Some(from),
                    ..
                }) if *from == side => Some(bytes.len() + overhead),
                _ => None,
            })
            .sum()
    }
}
