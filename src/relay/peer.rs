//! The connections the relay speaks on (client, origin, our own server) and the credits
//! that give a sender's window back once its bytes left toward the other side.

use std::collections::VecDeque;

use bytes::BytesMut;

use super::conn::{BoxIo, Relay};
use super::frame::{self, setting, FrameReader};
use super::hpack::{Decoder, Encoding};

/// Per-stream and per-connection receive windows we grant each side (as hyper is set up).
pub(super) const STREAM_WINDOW: u32 = 2 * 1024 * 1024;

pub(super) const CONN_WINDOW: u32 = 4 * 1024 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Side {
    Client,
    Upstream,
    Internal,
}

impl Side {
    /// Who misbehaved, as errors say it.
    pub(super) fn name(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Upstream => "origin",
            Side::Internal => "our server",
        }
    }
}

/// Bytes of DATA that came from `from` on `stream`, granted back once written up to `end`.
pub(super) struct Credit {
    pub(super) end: u64,
    pub(super) from: Side,
    pub(super) stream: u32,
    pub(super) len: u32,
}

/// One HTTP/2 connection we speak on.
pub(super) struct Peer {
    /// `None` while the upstream is being dialled: frames wait in `out`.
    pub(super) io: Option<BoxIo>,
    pub(super) rbuf: BytesMut,
    pub(super) out: BytesMut,
    /// Bytes ever written to this peer (positions in its byte stream, for credits).
    pub(super) written: u64,
    pub(super) flush: bool,
    pub(super) credits: VecDeque<Credit>,
    pub(super) reader: FrameReader,
    /// Follows the peer's encoder.
    pub(super) decoder: Decoder,
    /// How header blocks toward the peer are made.
    pub(super) encoding: Encoding,
    /// A header block still waiting for its CONTINUATION frames.
    pub(super) partial: Option<Partial>,
    /// What we may still send (connection window), and the peer's settings.
    pub(super) send_conn: i64,
    pub(super) init_window: i64,
    pub(super) max_frame: u32,
    pub(super) max_streams: u32,
    /// What the peer may still send us, and what was released but not yet granted.
    pub(super) recv_conn: i64,
    pub(super) recv_pending: u32,
    pub(super) open_streams: u32,
    /// The peer said GOAWAY: no stream above this id is processed.
    pub(super) goaway: Option<u32>,
    /// Keep-alive (upstream): a PING is unanswered; something was read since the last tick.
    pub(super) ping_out: bool,
    pub(super) active: bool,
    /// Its first frame (a SETTINGS) arrived.
    pub(super) settings_seen: bool,
    /// DATA from this peer held in stream queues: bytes plus a per-frame overhead.
    pub(super) buffered: usize,
    /// Header blocks re-encoded toward this peer from the client's: the client's bytes in,
    /// ours out, and how many blocks.
    pub(super) reencoded_in: usize,
    pub(super) reencoded_out: usize,
    pub(super) reencoded_blocks: usize,
}

pub(super) struct Partial {
    pub(super) stream: u32,
    pub(super) end_stream: bool,
    pub(super) block: BytesMut,
    /// CONTINUATION frames so far.
    pub(super) continuations: usize,
}

impl Peer {
    pub(super) fn new(io: Option<BoxIo>, encoding: Encoding) -> Self {
        Peer {
            io,
            rbuf: BytesMut::new(),
            out: BytesMut::new(),
            written: 0,
            flush: false,
            credits: VecDeque::new(),
            reader: FrameReader::new(frame::DEFAULT_MAX_FRAME),
            decoder: Decoder::new(),
            encoding,
            partial: None,
            send_conn: frame::DEFAULT_WINDOW as i64,
            init_window: frame::DEFAULT_WINDOW as i64,
            max_frame: frame::DEFAULT_MAX_FRAME,
            max_streams: u32::MAX,
            recv_conn: CONN_WINDOW as i64,
            recv_pending: 0,
            open_streams: 0,
            goaway: None,
            ping_out: false,
            active: false,
            settings_seen: false,
            buffered: 0,
            reencoded_in: 0,
            reencoded_out: 0,
            reencoded_blocks: 0,
        }
    }

    /// A connection where we are the client: preface, settings, the larger connection window.
    pub(super) fn client_role(io: Option<BoxIo>, encoding: Encoding) -> Self {
        let mut peer = Peer::new(io, encoding);
        peer.out.extend_from_slice(frame::PREFACE);
        frame::put_settings(
            &mut peer.out,
            &[
                (setting::ENABLE_PUSH, 0),
                (setting::INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (
                    setting::MAX_HEADER_LIST_SIZE,
                    super::hpack::MAX_LIST_SIZE as u32,
                ),
            ],
        );
        frame::put_window_update(&mut peer.out, 0, CONN_WINDOW - frame::DEFAULT_WINDOW);
        peer
    }

    /// The position, in the peer's byte stream, after everything buffered so far.
    pub(super) fn end_pos(&self) -> u64 {
        self.written + self.out.len() as u64
    }

    pub(super) fn usable(&self) -> bool {
        self.goaway.is_none() && self.open_streams < self.max_streams
    }
}

/// The peer a side names, out of the relay's disjoint fields.
pub(super) fn peer_of<'a>(
    client: &'a mut Peer,
    upstream: &'a mut Option<Peer>,
    internal: &'a mut Option<Peer>,
    side: Side,
) -> Option<&'a mut Peer> {
    match side {
        Side::Client => Some(client),
        Side::Upstream => upstream.as_mut(),
        Side::Internal => internal.as_mut(),
    }
}

impl Relay {
    /// `len` bytes that `from` sent are off our hands: give the windows back, in batches.
    pub(super) fn grant(&mut self, from: Side, stream: Option<u32>, len: u32) {
        let mut stream_update = None;
        if let Some(st) = stream.and_then(|id| self.streams.get_mut(&id).map(|st| (id, st))) {
            let (id, st) = st;
            let dir = match from {
                Side::Client => Some(&mut st.up),
                side if side == st.target => Some(&mut st.down),
                _ => None,
            };
            if let Some(dir) = dir.filter(|d| !d.ended_in) {
                dir.recv_pending += len;
                if dir.recv_pending >= STREAM_WINDOW / 2 {
                    stream_update = Some((id, dir.recv_pending));
                    dir.recv_window += dir.recv_pending as i64;
                    dir.recv_pending = 0;
                }
            }
        }
        let Some(peer) = self.peer(from) else {
            return;
        };
        if let Some((id, increment)) = stream_update {
            frame::put_window_update(&mut peer.out, id, increment);
        }
        peer.recv_pending += len;
        if peer.recv_pending >= CONN_WINDOW / 2 {
            frame::put_window_update(&mut peer.out, 0, peer.recv_pending);
            peer.recv_conn += peer.recv_pending as i64;
            peer.recv_pending = 0;
        }
    }
}
