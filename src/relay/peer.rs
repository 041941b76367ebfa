//! The connections the relay speaks on (client, origin, our own server), as protocol state:
//! settings, windows, HPACK, and the output waiting for the socket. The sockets themselves
//! are the driver's.

use std::collections::VecDeque;

use bytes::BytesMut;

use super::common::{Conn, CONN_WINDOW, STREAM_WINDOW};
use super::frame::{self, setting};
use super::hpack::{self, BlockEncoding, Decoder};
use super::out::Out;

/// Bytes of DATA that came from `from` on `stream`, granted back once written up to `end`.
pub(super) struct Credit {
    pub(super) end: u64,
    pub(super) from: Conn,
    pub(super) stream: u32,
    pub(super) len: u32,
}

/// One HTTP/2 connection we speak on.
pub(super) struct Peer {
    /// Its socket is there (the upstream has no socket while it is dialled: frames wait in
    /// `out`).
    pub(super) connected: bool,
    /// Frames waiting for the socket.
    pub(super) out: Out,
    /// Bytes ever written to this peer (positions in its byte stream, for credits).
    pub(super) written: u64,
    pub(super) credits: VecDeque<Credit>,
    /// Follows the peer's encoder.
    pub(super) decoder: Decoder,
    /// How header blocks toward the peer are made.
    pub(super) encoding: BlockEncoding,
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
    /// Keep-alive (upstream): a PING is unanswered.
    pub(super) ping_out: bool,
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
    pub(super) fn new(connected: bool, encoding: BlockEncoding) -> Self {
        Peer {
            connected,
            out: Out::default(),
            written: 0,
            credits: VecDeque::new(),
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
            settings_seen: false,
            buffered: 0,
            reencoded_in: 0,
            reencoded_out: 0,
            reencoded_blocks: 0,
        }
    }

    /// A connection where we are the client: preface, settings, the larger connection window.
    pub(super) fn client_role(connected: bool, encoding: BlockEncoding) -> Self {
        let mut peer = Peer::new(connected, encoding);
        peer.out.buf().extend_from_slice(frame::PREFACE);
        frame::put_settings(
            peer.out.buf(),
            &[
                (setting::ENABLE_PUSH, 0),
                (setting::INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (setting::MAX_HEADER_LIST_SIZE, hpack::MAX_LIST_SIZE as u32),
            ],
        );
        frame::put_window_update(peer.out.buf(), 0, CONN_WINDOW - frame::DEFAULT_WINDOW);
        peer
    }

    /// The position, in the peer's byte stream, after everything buffered so far.
    pub(super) fn end_pos(&self) -> u64 {
        self.written + self.out.len() as u64
    }

    /// `n` bytes of `out` reached the socket.
    pub(super) fn sent(&mut self, n: usize) {
        self.out.advance(n);
        self.written += n as u64;
    }

    pub(super) fn usable(&self) -> bool {
        self.goaway.is_none() && self.open_streams < self.max_streams
    }

    /// `len` bytes it sent are off our hands: the connection window back, in batches.
    fn grant_conn(&mut self, len: u32) {
        self.recv_pending += len;
        if self.recv_pending >= CONN_WINDOW / 2 {
            frame::put_window_update(self.out.buf(), 0, self.recv_pending);
            self.recv_conn += self.recv_pending as i64;
            self.recv_pending = 0;
        }
    }
}

/// The three peers; the origin and our own server may be missing.
pub(super) struct Peers {
    pub(super) client: Peer,
    /// The origin; `None` once it failed or closed (new streams then go to our server, whose
    /// own upstream link redials).
    pub(super) upstream: Option<Peer>,
    /// Our own server, for the streams that are ours; started with the first one.
    pub(super) internal: Option<Peer>,
}

impl Peers {
    pub(super) fn get(&self, side: Conn) -> Option<&Peer> {
        match side {
            Conn::Client => Some(&self.client),
            Conn::Upstream => self.upstream.as_ref(),
            Conn::Internal => self.internal.as_ref(),
        }
    }

    pub(super) fn get_mut(&mut self, side: Conn) -> Option<&mut Peer> {
        match side {
            Conn::Client => Some(&mut self.client),
            Conn::Upstream => self.upstream.as_mut(),
            Conn::Internal => self.internal.as_mut(),
        }
    }

    pub(super) fn iter(&self) -> impl Iterator<Item = &Peer> {
        Conn::ALL.into_iter().filter_map(|s| self.get(s))
    }

    /// `len` accounted bytes of DATA from `from` are no longer held.
    pub(super) fn unhold(&mut self, from: Conn, len: usize) {
        if let Some(peer) = self.get_mut(from) {
            peer.buffered = peer.buffered.saturating_sub(len);
        }
    }

    /// `len` bytes that `from` sent are off our hands: its connection window back, and the
    /// stream's (`stream_update`: id and increment) when that one is due.
    pub(super) fn grant(&mut self, from: Conn, stream_update: Option<(u32, u32)>, len: u32) {
        let Some(peer) = self.get_mut(from) else {
            return;
        };
        if let Some((id, increment)) = stream_update {
            frame::put_window_update(peer.out.buf(), id, increment);
        }
        peer.grant_conn(len);
    }

    /// The blocks toward `side` can no longer be the counterpart's own: encode them ourselves.
    pub(super) fn desync(&mut self, side: Conn) {
        if let Some(peer) = self.get_mut(side) {
            if peer.encoding.is_raw() {
                tracing::trace!(?side, "header blocks re-encoded from now on");
                peer.encoding = BlockEncoding::own(hpack::TABLE_SIZE);
            }
        }
    }
}
