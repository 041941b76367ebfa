//! The relay's state machine: one client connection, its upstream connection, and (when a
//! stream is ours) an in-memory connection to our own HTTP/2 server, driven by one future.
//!
//! Each hop keeps its own settings, connection window and stream windows. Data read from one
//! side is granted back to it (WINDOW_UPDATE) only once it has been written to the other
//! side's socket, so what a slow reader costs us is bounded by the windows we advertise.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};
use tokio::time::{Instant, Sleep};

use super::frame::{self, flag, kind, setting, ConnError, Frame, FrameReader, Reason};
use super::hpack::{Decoder, Encoding, Headers};
use crate::cancel::WhenWoken;
use crate::router::Route;
use crate::upstream::UpstreamError;

/// Per-stream and per-connection receive windows we grant each side (as hyper is set up).
const STREAM_WINDOW: u32 = 2 * 1024 * 1024;
const CONN_WINDOW: u32 = 4 * 1024 * 1024;
/// Streams a client may have open at once (hyper's default).
const MAX_STREAMS: usize = 200;
/// A header block (all its CONTINUATIONs) larger than this ends the connection.
const MAX_BLOCK: usize = 256 * 1024;
/// Read buffer growth: one largest frame we accept, and its header.
const READ_CHUNK: usize = 16 * 1024 + 9;
/// Upstream liveness: a PING when streams are open and nothing arrived for this long; no
/// answer by the next tick and the upstream connection counts as dead.
const KEEP_ALIVE: Duration = Duration::from_secs(30);
/// Buffer of the in-memory connection to our own server.
const INTERNAL_BUF: usize = 256 * 1024;

pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
pub(crate) type BoxIo = Box<dyn Io>;
pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// What the relay needs from the front door.
pub(crate) struct Setup {
    /// The `:authority` passthrough requests carry (the CONNECT target, without a default
    /// port); others go to our server.
    pub(crate) authority: String,
    /// The origin's port (`:authority` may also name it explicitly).
    pub(crate) port: u16,
    /// The origin's host, for error messages.
    pub(crate) host: String,
    /// Dials the origin (TLS, ALPN h2).
    pub(crate) dial: BoxFuture<Result<BoxIo, UpstreamError>>,
    /// Serves our own routes on one end of an in-memory connection.
    pub(crate) internal: Box<dyn FnMut(DuplexStream) -> BoxFuture<()> + Send>,
    /// Unit tests only: passthrough paths narrowed further, so a stand-in origin's paths and
    /// ours differ. In the proxy, the router's decision ([`crate::router::route`]) alone.
    #[cfg(test)]
    pub(crate) passthrough: fn(&str) -> bool,
    /// Ready when the server starts its graceful shutdown.
    pub(crate) stopping: BoxFuture<()>,
}

impl Setup {
    /// The host as `:authority` writes it (IPv6 in brackets).
    fn host_for_port(&self) -> String {
        if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Side {
    Client,
    Upstream,
    Internal,
}

/// Bytes of DATA that came from `from` on `stream`, granted back once written up to `end`.
struct Credit {
    end: u64,
    from: Side,
    stream: u32,
    len: u32,
}

/// One HTTP/2 connection we speak on.
struct Peer {
    /// `None` while the upstream is being dialled: frames wait in `out`.
    io: Option<BoxIo>,
    rbuf: BytesMut,
    out: BytesMut,
    /// Bytes ever written to this peer (positions in its byte stream, for credits).
    written: u64,
    flush: bool,
    credits: VecDeque<Credit>,
    reader: FrameReader,
    /// Follows the peer's encoder.
    decoder: Decoder,
    /// How header blocks toward the peer are made.
    encoding: Encoding,
    /// A header block still waiting for its CONTINUATION frames.
    partial: Option<Partial>,
    /// What we may still send (connection window), and the peer's settings.
    send_conn: i64,
    init_window: i64,
    max_frame: u32,
    max_streams: u32,
    /// What the peer may still send us, and what was released but not yet granted.
    recv_conn: i64,
    recv_pending: u32,
    open_streams: u32,
    /// The peer said GOAWAY: no stream above this id is processed.
    goaway: Option<u32>,
    /// Keep-alive (upstream): a PING is unanswered; something was read since the last tick.
    ping_out: bool,
    active: bool,
}

struct Partial {
    stream: u32,
    end_stream: bool,
    block: BytesMut,
}

impl Peer {
    fn new(io: Option<BoxIo>, encoding: Encoding) -> Self {
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
        }
    }

    /// A connection where we are the client: preface, settings, the larger connection window.
    fn client_role(io: Option<BoxIo>, encoding: Encoding) -> Self {
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
    fn end_pos(&self) -> u64 {
        self.written + self.out.len() as u64
    }

    fn usable(&self) -> bool {
        self.goaway.is_none() && self.open_streams < self.max_streams
    }
}

/// Items waiting for a window (DATA) or behind DATA (trailers).
enum Item {
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
    },
    /// RST_STREAM once what is before it was delivered (an origin that answered in full and
    /// does not want the rest of the request).
    Reset(Reason),
}

/// One direction of a stream.
struct Dir {
    /// What we may still send toward the destination on this stream.
    send_window: i64,
    queue: VecDeque<Item>,
    /// What the source may still send us, and what was released but not granted yet.
    recv_window: i64,
    recv_pending: u32,
    /// END_STREAM arrived from the source / was handed to the destination's buffer.
    ended_in: bool,
    ended_out: bool,
}

impl Dir {
    fn new(send_window: i64) -> Self {
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

struct Stream {
    /// Where the stream goes: the origin, our server, or `Client` for an answer of our own.
    target: Side,
    /// Client → target.
    up: Dir,
    /// Target → client.
    down: Dir,
    /// The target answered with a response head.
    answered: bool,
    /// A Connect client (reads `{"code","message"}` error bodies).
    connect_style: bool,
    /// The rest of the request goes nowhere: the answer is ours, or the target reset the
    /// stream after answering in full.
    discard_up: bool,
}

pub(crate) struct Relay {
    authority: String,
    authority_port: String,
    host: String,
    #[cfg(test)]
    passthrough: fn(&str) -> bool,
    make_internal: Box<dyn FnMut(DuplexStream) -> BoxFuture<()> + Send>,
    stopping: Option<BoxFuture<()>>,
    dial: Option<BoxFuture<Result<BoxIo, UpstreamError>>>,
    client: Peer,
    /// The origin; `None` once it failed or closed (new streams then go to our server, whose
    /// own upstream link redials).
    upstream: Option<Peer>,
    /// Our own server, for the streams that are ours; started with the first one.
    internal: Option<Peer>,
    internal_server: Option<WhenWoken<BoxFuture<()>>>,
    streams: HashMap<u32, Stream>,
    /// Highest stream id the client opened.
    last_stream: u32,
    preface_seen: bool,
    /// We told the client GOAWAY (shutdown): no new streams, close when the last one ends.
    draining: bool,
    /// The client said GOAWAY: close when the last stream ends.
    client_goaway: bool,
    /// A connection error: close once the GOAWAY is written.
    closing: bool,
    keep_alive: Pin<Box<Sleep>>,
    released: Vec<Credit>,
}

/// Why a peer's connection ended.
enum Fault {
    Closed(String),
    Protocol(ConnError),
}

impl From<ConnError> for Fault {
    fn from(e: ConnError) -> Self {
        Fault::Protocol(e)
    }
}

impl std::fmt::Display for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Closed(why) => f.write_str(why),
            Fault::Protocol(e) => write!(f, "protocol error: {e}"),
        }
    }
}

fn io_fault(e: &std::io::Error) -> Fault {
    Fault::Closed(format!("connection failed: {e}"))
}

/// The peer a side names, out of the relay's disjoint fields.
fn peer_of<'a>(
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
    pub(crate) fn new(client: BoxIo, setup: Setup) -> Self {
        let mut client = Peer::new(Some(client), Encoding::Raw);
        frame::put_settings(
            &mut client.out,
            &[
                (setting::MAX_CONCURRENT_STREAMS, MAX_STREAMS as u32),
                (setting::INITIAL_WINDOW_SIZE, STREAM_WINDOW),
                (
                    setting::MAX_HEADER_LIST_SIZE,
                    super::hpack::MAX_LIST_SIZE as u32,
                ),
            ],
        );
        frame::put_window_update(&mut client.out, 0, CONN_WINDOW - frame::DEFAULT_WINDOW);
        // Frames for the origin wait in its buffer while it is dialled.
        let upstream = Peer::client_role(None, Encoding::Raw);
        Relay {
            authority_port: format!("{}:{}", setup.host_for_port(), setup.port),
            authority: setup.authority,
            host: setup.host,
            #[cfg(test)]
            passthrough: setup.passthrough,
            make_internal: setup.internal,
            stopping: Some(setup.stopping),
            dial: Some(setup.dial),
            client,
            upstream: Some(upstream),
            internal: None,
            internal_server: None,
            streams: HashMap::new(),
            last_stream: 0,
            preface_seen: false,
            draining: false,
            client_goaway: false,
            closing: false,
            keep_alive: Box::pin(tokio::time::sleep(KEEP_ALIVE)),
            released: Vec::new(),
        }
    }

    fn peer(&mut self, side: Side) -> Option<&mut Peer> {
        peer_of(
            &mut self.client,
            &mut self.upstream,
            &mut self.internal,
            side,
        )
    }

    /// The peer a frame came from. Only `drive` removes peers, never a frame handler, so it
    /// is there; the error is for the impossible case, not a panic.
    fn source(&mut self, side: Side) -> Result<&mut Peer, ConnError> {
        self.peer(side)
            .ok_or_else(|| ConnError::new(Reason::INTERNAL_ERROR, "frame from a closed peer"))
    }

    /// Everything that can move now; `Ready` when the client's connection is over.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(stopping) = self.stopping.as_mut() {
            if stopping.as_mut().poll(cx).is_ready() {
                self.stopping = None;
                self.drain();
            }
        }
        self.poll_dial(cx);
        self.poll_keep_alive(cx);
        loop {
            let mut progress = false;
            if let Some(server) = self.internal_server.as_mut() {
                if Pin::new(server).poll(cx).is_ready() {
                    self.internal_server = None;
                }
            }
            if !self.closing {
                match self.read(Side::Client, cx) {
                    Ok(p) => progress |= p,
                    Err(Fault::Closed(why)) => {
                        tracing::debug!(%why, "client connection ended");
                        return Poll::Ready(());
                    }
                    Err(Fault::Protocol(e)) => {
                        self.client_error(e);
                        progress = true;
                    }
                }
            }
            for side in [Side::Upstream, Side::Internal] {
                match self.read(side, cx) {
                    Ok(p) => progress |= p,
                    Err(fault) => {
                        self.peer_gone(side, fault);
                        progress = true;
                    }
                }
            }
            for side in [Side::Client, Side::Upstream, Side::Internal] {
                match self.write(side, cx) {
                    Ok(p) => progress |= p,
                    Err(fault) if side == Side::Client => {
                        tracing::debug!(why = %fault, "client connection ended");
                        return Poll::Ready(());
                    }
                    Err(fault) => {
                        self.peer_gone(side, fault);
                        progress = true;
                    }
                }
            }
            if self.finished() && self.client.out.is_empty() {
                // Best effort: the close_notify; the socket closes when we return anyway.
                if let Some(io) = self.client.io.as_mut() {
                    if Pin::new(io).poll_shutdown(cx).is_pending() {
                        return Poll::Pending;
                    }
                }
                return Poll::Ready(());
            }
            if !progress {
                return Poll::Pending;
            }
        }
    }

    fn finished(&self) -> bool {
        self.closing || ((self.draining || self.client_goaway) && self.streams.is_empty())
    }

    fn poll_dial(&mut self, cx: &mut Context<'_>) {
        let Some(dial) = self.dial.as_mut() else {
            return;
        };
        let Poll::Ready(result) = dial.as_mut().poll(cx) else {
            return;
        };
        self.dial = None;
        match result {
            Ok(io) => {
                if let Some(upstream) = self.upstream.as_mut() {
                    upstream.io = Some(io);
                }
            }
            Err(e) => self.upstream_gone(e),
        }
    }

    /// Upstream liveness, as hyper's keep-alive does it.
    fn poll_keep_alive(&mut self, cx: &mut Context<'_>) {
        if self.keep_alive.as_mut().poll(cx).is_pending() {
            return;
        }
        self.keep_alive.as_mut().reset(Instant::now() + KEEP_ALIVE);
        let _ = self.keep_alive.as_mut().poll(cx);
        let Some(upstream) = self.upstream.as_mut().filter(|u| u.io.is_some()) else {
            return;
        };
        if upstream.ping_out {
            let err = UpstreamError::Timeout {
                host: self.host.clone(),
                secs: KEEP_ALIVE.as_secs(),
            };
            self.upstream_gone(err);
            return;
        }
        if upstream.open_streams > 0 && !upstream.active {
            frame::put_ping(&mut upstream.out, false, *b"byok-ka!");
            upstream.ping_out = true;
        }
        upstream.active = false;
    }

    /// Read once from `side` and handle every whole frame; `Ok(true)` if anything came.
    fn read(&mut self, side: Side, cx: &mut Context<'_>) -> Result<bool, Fault> {
        let Some(peer) = self.peer(side) else {
            return Ok(false);
        };
        let Some(io) = peer.io.as_mut() else {
            return Ok(false);
        };
        if peer.rbuf.capacity() - peer.rbuf.len() < 4096 {
            peer.rbuf.reserve(READ_CHUNK);
        }
        match tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut peer.rbuf) {
            Poll::Pending => return Ok(false),
            Poll::Ready(Ok(0)) => return Err(Fault::Closed("closed by the peer".into())),
            Poll::Ready(Ok(_)) => {}
            Poll::Ready(Err(e)) => return Err(io_fault(&e)),
        }
        peer.active = true;
        if side == Side::Client && !self.preface_seen {
            let have = self.client.rbuf.len().min(frame::PREFACE.len());
            if self.client.rbuf[..have] != frame::PREFACE[..have] {
                return Err(ConnError::protocol("not the HTTP/2 client preface").into());
            }
            if have < frame::PREFACE.len() {
                return Ok(true);
            }
            self.client.rbuf.advance(have);
            self.preface_seen = true;
        }
        loop {
            let Some(peer) = self.peer(side) else {
                return Ok(true);
            };
            let Some(frame) = peer.reader.next(&mut peer.rbuf)? else {
                return Ok(true);
            };
            self.on_frame(side, frame)?;
        }
    }

    /// Write what is buffered for `side`, then grant back the data that left.
    fn write(&mut self, side: Side, cx: &mut Context<'_>) -> Result<bool, Fault> {
        let Some(peer) = peer_of(
            &mut self.client,
            &mut self.upstream,
            &mut self.internal,
            side,
        ) else {
            return Ok(false);
        };
        let Some(io) = peer.io.as_mut() else {
            return Ok(false);
        };
        let mut progress = false;
        while !peer.out.is_empty() {
            match Pin::new(&mut *io).poll_write(cx, &peer.out) {
                Poll::Ready(Ok(0)) => return Err(Fault::Closed("closed while writing".into())),
                Poll::Ready(Ok(n)) => {
                    peer.out.advance(n);
                    peer.written += n as u64;
                    peer.flush = true;
                    progress = true;
                }
                Poll::Ready(Err(e)) => return Err(io_fault(&e)),
                Poll::Pending => break,
            }
        }
        if peer.out.is_empty() && peer.flush {
            match Pin::new(&mut *io).poll_flush(cx) {
                Poll::Ready(Ok(())) => peer.flush = false,
                Poll::Ready(Err(e)) => return Err(io_fault(&e)),
                Poll::Pending => {}
            }
        }
        while peer.credits.front().is_some_and(|c| c.end <= peer.written) {
            if let Some(credit) = peer.credits.pop_front() {
                self.released.push(credit);
            }
        }
        if !self.released.is_empty() {
            let released = std::mem::take(&mut self.released);
            for credit in &released {
                self.grant(credit.from, Some(credit.stream), credit.len);
            }
            self.released = released;
            self.released.clear();
            progress = true;
        }
        Ok(progress)
    }

    /// `len` bytes that `from` sent are off our hands: give the windows back, in batches.
    fn grant(&mut self, from: Side, stream: Option<u32>, len: u32) {
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

    fn on_frame(&mut self, side: Side, frame: Frame) -> Result<(), ConnError> {
        let peer = self.source(side)?;
        if peer.partial.is_some() && frame.kind != kind::CONTINUATION {
            return Err(ConnError::protocol(
                "a frame inside a header block (RFC 9113 §6.10)",
            ));
        }
        match frame.kind {
            kind::DATA => self.on_data(side, frame),
            kind::HEADERS => {
                if frame.stream == 0 {
                    return Err(ConnError::protocol("HEADERS on stream 0"));
                }
                let fragment = frame.header_fragment()?;
                let end_stream = frame.has(flag::END_STREAM);
                if frame.has(flag::END_HEADERS) {
                    let whole = !frame.has(flag::PADDED) && !frame.has(flag::PRIORITY);
                    let raw = whole.then(|| frame.raw.clone());
                    return self.on_block(side, frame.stream, end_stream, fragment, raw);
                }
                let peer = self.source(side)?;
                peer.partial = Some(Partial {
                    stream: frame.stream,
                    end_stream,
                    block: BytesMut::from(&fragment[..]),
                });
                Ok(())
            }
            kind::CONTINUATION => {
                let peer = self.source(side)?;
                let Some(mut partial) = peer.partial.take() else {
                    return Err(ConnError::protocol("CONTINUATION without HEADERS"));
                };
                if partial.stream != frame.stream {
                    return Err(ConnError::protocol("CONTINUATION on another stream"));
                }
                partial.block.extend_from_slice(frame.payload());
                if partial.block.len() > MAX_BLOCK {
                    return Err(ConnError::protocol(format!(
                        "a header block over {MAX_BLOCK} bytes"
                    )));
                }
                if !frame.has(flag::END_HEADERS) {
                    peer.partial = Some(partial);
                    return Ok(());
                }
                let block = partial.block.freeze();
                self.on_block(side, partial.stream, partial.end_stream, block, None)
            }
            kind::PRIORITY => Ok(()),
            kind::RST_STREAM => {
                let code = frame::u32_payload(&frame, "RST_STREAM")?;
                if frame.stream == 0 {
                    return Err(ConnError::protocol("RST_STREAM on stream 0"));
                }
                self.on_reset(side, frame.stream, Reason(code));
                Ok(())
            }
            kind::SETTINGS => self.on_settings(side, &frame),
            kind::PUSH_PROMISE => Err(ConnError::protocol("PUSH_PROMISE (push is disabled)")),
            kind::PING => {
                let payload: [u8; 8] = frame.payload().try_into().map_err(|_| {
                    ConnError::new(Reason::FRAME_SIZE_ERROR, "PING frame is not 8 bytes")
                })?;
                let peer = self.source(side)?;
                if frame.has(flag::ACK) {
                    peer.ping_out = false;
                } else {
                    frame::put_ping(&mut peer.out, true, payload);
                }
                Ok(())
            }
            kind::GOAWAY => self.on_goaway(side, &frame),
            kind::WINDOW_UPDATE => self.on_window_update(side, &frame),
            // Unknown frame types are ignored (RFC 9113 §4.1).
            _ => Ok(()),
        }
    }

    fn on_settings(&mut self, side: Side, frame: &Frame) -> Result<(), ConnError> {
        if frame.stream != 0 {
            return Err(ConnError::protocol("SETTINGS on a stream"));
        }
        if frame.has(flag::ACK) {
            return Ok(());
        }
        let mut window_delta = 0i64;
        let peer = self.source(side)?;
        for (id, value) in frame::settings(frame.payload())? {
            match id {
                // A peer that keeps a smaller table than every peer starts with: our own
                // encoder, sized for it, from the next block on.
                setting::HEADER_TABLE_SIZE if (value as usize) < super::hpack::TABLE_SIZE => {
                    peer.encoding = Encoding::own(value as usize);
                }
                setting::MAX_CONCURRENT_STREAMS => peer.max_streams = value,
                setting::INITIAL_WINDOW_SIZE => {
                    if value as i64 > frame::MAX_WINDOW {
                        return Err(ConnError::new(
                            Reason::FLOW_CONTROL_ERROR,
                            "INITIAL_WINDOW_SIZE over 2^31-1",
                        ));
                    }
                    window_delta += value as i64 - peer.init_window;
                    peer.init_window = value as i64;
                }
                setting::MAX_FRAME_SIZE => {
                    if !(frame::DEFAULT_MAX_FRAME..=0xff_ffff).contains(&value) {
                        return Err(ConnError::protocol("MAX_FRAME_SIZE out of range"));
                    }
                    peer.max_frame = value;
                }
                _ => {}
            }
        }
        frame::put_settings_ack(&mut peer.out);
        if window_delta != 0 {
            for st in self.streams.values_mut() {
                if side == Side::Client {
                    st.down.send_window += window_delta;
                } else if st.target == side {
                    st.up.send_window += window_delta;
                }
            }
            self.flush_toward(side);
        }
        Ok(())
    }

    fn on_window_update(&mut self, side: Side, frame: &Frame) -> Result<(), ConnError> {
        let increment = (frame::u32_payload(frame, "WINDOW_UPDATE")? & 0x7fff_ffff) as i64;
        if frame.stream == 0 {
            let peer = self.source(side)?;
            if increment == 0 {
                return Err(ConnError::protocol("WINDOW_UPDATE of 0"));
            }
            peer.send_conn += increment;
            if peer.send_conn > frame::MAX_WINDOW {
                return Err(ConnError::new(
                    Reason::FLOW_CONTROL_ERROR,
                    "connection window over 2^31-1",
                ));
            }
            self.flush_toward(side);
            return Ok(());
        }
        let Some(st) = self.streams.get_mut(&frame.stream) else {
            return Ok(());
        };
        let (dir, up) = match side {
            Side::Client => (&mut st.down, false),
            side if side == st.target => (&mut st.up, true),
            _ => return Ok(()),
        };
        dir.send_window += increment;
        if increment == 0 || dir.send_window > frame::MAX_WINDOW {
            let reason = if increment == 0 {
                Reason::PROTOCOL_ERROR
            } else {
                Reason::FLOW_CONTROL_ERROR
            };
            self.reset_stream(frame.stream, reason);
            return Ok(());
        }
        self.flush_dir(frame.stream, up);
        Ok(())
    }

    fn on_goaway(&mut self, side: Side, frame: &Frame) -> Result<(), ConnError> {
        let payload = frame.payload();
        if payload.len() < 8 || frame.stream != 0 {
            return Err(ConnError::new(Reason::FRAME_SIZE_ERROR, "bad GOAWAY frame"));
        }
        let last =
            u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
        let code = Reason(u32::from_be_bytes([
            payload[4], payload[5], payload[6], payload[7],
        ]));
        if side == Side::Client {
            self.client_goaway = true;
            tracing::debug!(%code, "client sent GOAWAY");
            return Ok(());
        }
        tracing::debug!(?side, last, %code, "GOAWAY");
        if let Some(peer) = self.peer(side) {
            peer.goaway = Some(last);
        }
        // Streams it will not process were not seen: the client may retry them.
        let refused: Vec<u32> = self
            .streams
            .iter()
            .filter(|(id, st)| st.target == side && **id > last)
            .map(|(id, _)| *id)
            .collect();
        for id in refused {
            if let Some(st) = self.remove(id) {
                if !st.down.ended_out {
                    frame::put_rst(&mut self.client.out, id, Reason::REFUSED_STREAM);
                }
            }
        }
        Ok(())
    }

    fn on_reset(&mut self, side: Side, id: u32, reason: Reason) {
        let belongs = self
            .streams
            .get(&id)
            .is_some_and(|st| side == Side::Client || st.target == side);
        if !belongs {
            return;
        }
        if side != Side::Client && reason == Reason::NO_ERROR && self.answer_in_flight(id) {
            self.reset_after_answer(id);
            return;
        }
        let Some(st) = self.remove(id) else {
            return;
        };
        let other = if side == Side::Client {
            st.target
        } else {
            Side::Client
        };
        // Our own answer (an error): nothing behind it to tell.
        if other == side {
            return;
        }
        if let Some(peer) = self.peer(other) {
            frame::put_rst(&mut peer.out, id, reason);
        }
    }

    /// The target answered in full and some of it still waits for the client's window.
    fn answer_in_flight(&self, id: u32) -> bool {
        self.streams
            .get(&id)
            .is_some_and(|st| st.down.ended_in && !st.down.queue.is_empty())
    }

    /// RST_STREAM(NO_ERROR) from a target that answered in full (it does not want the rest of
    /// the request): the answer is delivered first, then the client is told.
    fn reset_after_answer(&mut self, id: u32) {
        let Some(st) = self.streams.get_mut(&id) else {
            return;
        };
        st.discard_up = true;
        st.up.ended_out = true;
        let dropped: Vec<u32> = st
            .up
            .queue
            .drain(..)
            .filter_map(|item| match item {
                Item::Data {
                    bytes,
                    from: Some(_),
                    ..
                } => Some(bytes.len() as u32),
                _ => None,
            })
            .collect();
        if !st.up.ended_in {
            st.down.queue.push_back(Item::Reset(Reason::NO_ERROR));
        }
        for len in dropped {
            self.grant(Side::Client, None, len);
        }
        self.flush_dir(id, false);
    }

    fn on_data(&mut self, side: Side, frame: Frame) -> Result<(), ConnError> {
        let id = frame.stream;
        if id == 0 {
            return Err(ConnError::protocol("DATA on stream 0"));
        }
        let len = frame.payload().len() as u32;
        let peer = self.source(side)?;
        peer.recv_conn -= len as i64;
        if peer.recv_conn < 0 {
            return Err(ConnError::new(
                Reason::FLOW_CONTROL_ERROR,
                "DATA beyond the connection window",
            ));
        }
        let data = frame.unpadded()?;
        let end = frame.has(flag::END_STREAM);
        let belongs = self
            .streams
            .get(&id)
            .is_some_and(|st| side == Side::Client || st.target == side);
        if !belongs {
            if side == Side::Client && id > self.last_stream {
                return Err(ConnError::protocol("DATA on a stream never opened"));
            }
            // A stream that was reset or finished: drop it, give the window back.
            self.grant(side, None, len);
            return Ok(());
        }
        let up = side == Side::Client;
        let Some(st) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        if up && st.discard_up {
            self.grant(side, None, len);
            return Ok(());
        }
        let dir = if up { &mut st.up } else { &mut st.down };
        dir.recv_window -= len as i64;
        if dir.ended_in || dir.recv_window < 0 {
            let reason = if dir.ended_in {
                Reason::STREAM_CLOSED
            } else {
                Reason::FLOW_CONTROL_ERROR
            };
            self.reset_stream(id, reason);
            self.grant(side, None, len);
            return Ok(());
        }
        dir.ended_in |= end;
        let padding = len - data.len() as u32;
        let raw = (!frame.has(flag::PADDED)).then_some(frame.raw);
        dir.queue.push_back(Item::Data {
            bytes: data,
            end,
            raw,
            from: Some(side),
        });
        if padding > 0 {
            self.grant(side, Some(id), padding);
        }
        self.flush_dir(id, up);
        Ok(())
    }

    fn on_block(
        &mut self,
        side: Side,
        id: u32,
        end: bool,
        block: Bytes,
        raw: Option<Bytes>,
    ) -> Result<(), ConnError> {
        let peer = self.source(side)?;
        let headers = peer.decoder.decode(&block)?;
        let block = Block {
            headers,
            hpack: block,
            raw,
            end,
        };
        if side == Side::Client {
            self.on_request_block(id, block)
        } else {
            self.on_response_block(side, id, block);
            Ok(())
        }
    }

    fn on_request_block(&mut self, id: u32, block: Block) -> Result<(), ConnError> {
        if let Some(st) = self.streams.get_mut(&id) {
            // Trailers.
            if st.discard_up {
                self.desync(Side::Upstream);
                return Ok(());
            }
            if st.up.ended_in || !block.end {
                self.desync(Side::Upstream);
                self.reset_stream(id, Reason::PROTOCOL_ERROR);
                return Ok(());
            }
            st.up.ended_in = true;
            if st.target != Side::Upstream {
                self.desync(Side::Upstream);
            }
            self.send_block(id, true, block);
            return Ok(());
        }
        if id <= self.last_stream {
            // HEADERS on a closed stream: not forwarded.
            self.desync(Side::Upstream);
            frame::put_rst(&mut self.client.out, id, Reason::STREAM_CLOSED);
            return Ok(());
        }
        if id % 2 == 0 {
            return Err(ConnError::protocol("an even stream id from the client"));
        }
        self.last_stream = id;
        let target = self.target_for(&block.headers);
        let Some(target) = target.filter(|_| !self.draining && self.streams.len() < MAX_STREAMS)
        else {
            self.desync(Side::Upstream);
            frame::put_rst(&mut self.client.out, id, Reason::REFUSED_STREAM);
            return Ok(());
        };
        if target != Side::Upstream {
            self.desync(Side::Upstream);
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            // The path without its query, as the router's request span shows it.
            let path = block.headers.get(b":path").unwrap_or_default();
            let path = path.split(|b| *b == b'?').next().unwrap_or_default();
            let path = String::from_utf8_lossy(path);
            tracing::debug!(stream = id, %path, to = ?target, "stream opened");
        }
        let connect_style = is_connect_style(&block.headers);
        let client_window = self.client.init_window;
        let Some(dest) = self.peer(target) else {
            return Ok(());
        };
        dest.open_streams += 1;
        let mut up = Dir::new(dest.init_window);
        up.ended_in = block.end;
        self.streams.insert(
            id,
            Stream {
                target,
                up,
                down: Dir::new(client_window),
                answered: false,
                connect_style,
                discard_up: false,
            },
        );
        self.send_block(id, true, block);
        Ok(())
    }

    /// Where a new stream goes: the origin for plain passthrough, else our own server.
    fn target_for(&mut self, headers: &Headers) -> Option<Side> {
        let path = headers
            .get(b":path")
            .and_then(|p| std::str::from_utf8(p).ok())
            .map(|p| p.split('?').next().unwrap_or(p));
        let plain = headers.get(b":method") != Some(b"CONNECT")
            && headers.get(b":authority").is_some_and(|a| {
                a.eq_ignore_ascii_case(self.authority.as_bytes())
                    || a.eq_ignore_ascii_case(self.authority_port.as_bytes())
            })
            && path.is_some_and(|p| self.passes_through(p));
        if plain && self.upstream.as_ref().is_some_and(Peer::usable) {
            return Some(Side::Upstream);
        }
        self.ensure_internal();
        self.internal
            .as_ref()
            .filter(|p| p.usable())
            .map(|_| Side::Internal)
    }

    /// Does a stream for `path` go to the origin untouched? The router's decision, so the
    /// relay cannot disagree with it.
    fn passes_through(&self, path: &str) -> bool {
        #[cfg(test)]
        let narrowed = (self.passthrough)(path);
        #[cfg(not(test))]
        let narrowed = true;
        narrowed && crate::router::route(path) == Route::Upstream
    }

    fn ensure_internal(&mut self) {
        if self.internal.is_some() {
            return;
        }
        let (ours, theirs) = tokio::io::duplex(INTERNAL_BUF);
        self.internal_server = Some(WhenWoken::new((self.make_internal)(theirs)));
        let peer = Peer::client_role(
            Some(Box::new(ours)),
            Encoding::own(super::hpack::TABLE_SIZE),
        );
        self.internal = Some(peer);
    }

    fn on_response_block(&mut self, side: Side, id: u32, block: Block) {
        let Some(st) = self.streams.get_mut(&id).filter(|st| st.target == side) else {
            // The client reset it already: its table must still see what the origin's
            // encoder did, so from now on blocks toward it are ours.
            if side == Side::Upstream {
                self.desync(Side::Client);
            }
            return;
        };
        if st.down.ended_in {
            if side == Side::Upstream {
                self.desync(Side::Client);
            }
            self.reset_stream(id, Reason::STREAM_CLOSED);
            return;
        }
        let informational = block
            .headers
            .get(b":status")
            .is_some_and(|s| s.first() == Some(&b'1'));
        if !st.answered && !informational {
            st.answered = true;
        }
        st.down.ended_in = block.end;
        self.send_block(id, false, block);
    }

    /// Forward a header block toward the stream's other side, as received when that keeps
    /// the two tables in step, else re-encoded (after any DATA queued before it).
    fn send_block(&mut self, id: u32, up: bool, block: Block) {
        let Some((target, dir, dest)) = self.route_of(id, up) else {
            return;
        };
        // Raw forwarding pairs the client with the origin only.
        let counterpart = target == Side::Upstream;
        if counterpart && dest.encoding.is_raw() {
            if dir.queue.is_empty() {
                match &block.raw {
                    Some(raw) => {
                        dest.out.extend_from_slice(raw);
                    }
                    None => frame::put_headers(
                        &mut dest.out,
                        id,
                        block.end,
                        &block.hpack,
                        dest.max_frame,
                    ),
                }
                dir.ended_out |= block.end;
                self.finish_if_done(id);
                return;
            }
            // Behind queued DATA: it would reach the peer out of its encoder's order.
            dest.encoding = Encoding::own(super::hpack::TABLE_SIZE);
        }
        dir.queue.push_back(Item::Headers {
            headers: block.headers,
            end: block.end,
        });
        self.flush_dir(id, up);
    }

    /// The blocks toward `side` can no longer be the counterpart's own: encode them ourselves.
    fn desync(&mut self, side: Side) {
        if let Some(peer) = self.peer(side) {
            if peer.encoding.is_raw() {
                tracing::trace!(?side, "header blocks re-encoded from now on");
                peer.encoding = Encoding::own(super::hpack::TABLE_SIZE);
            }
        }
    }

    /// A stream's target, one of its directions (toward the target when `up`) and the peer
    /// that direction writes to.
    fn route_of(&mut self, id: u32, up: bool) -> Option<(Side, &mut Dir, &mut Peer)> {
        let st = self.streams.get_mut(&id)?;
        let target = st.target;
        let (dest_side, dir) = st.toward(up);
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
    fn flush_dir(&mut self, id: u32, up: bool) {
        let Some((_, dir, dest)) = self.route_of(id, up) else {
            return;
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
                    if whole {
                        dir.ended_out |= *end;
                        dir.queue.pop_front();
                    } else {
                        bytes.advance(n);
                        *raw = None;
                    }
                }
                Item::Reset(reason) => {
                    frame::put_rst(&mut dest.out, id, *reason);
                    dir.ended_out = true;
                    dir.queue.pop_front();
                }
                Item::Headers { headers, end } => {
                    let block = dest.encoding.encode(headers);
                    frame::put_headers(&mut dest.out, id, *end, &block, dest.max_frame);
                    dir.ended_out |= *end;
                    dir.queue.pop_front();
                }
            }
        }
        self.finish_if_done(id);
    }

    /// Flush every stream with something queued toward `side`.
    fn flush_toward(&mut self, side: Side) {
        let ids: Vec<(u32, bool)> = self
            .streams
            .iter()
            .filter_map(|(id, st)| {
                if side == Side::Client && !st.down.queue.is_empty() {
                    Some((*id, false))
                } else if side != Side::Client && st.target == side && !st.up.queue.is_empty() {
                    Some((*id, true))
                } else {
                    None
                }
            })
            .collect();
        for (id, up) in ids {
            self.flush_dir(id, up);
        }
    }

    fn finish_if_done(&mut self, id: u32) {
        if self
            .streams
            .get(&id)
            .is_some_and(|st| st.up.ended_out && st.down.ended_out)
        {
            self.remove(id);
        }
    }

    /// Forget a stream; what it still had queued gives its senders' connection windows back.
    fn remove(&mut self, id: u32) -> Option<Stream> {
        let mut st = self.streams.remove(&id)?;
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

    /// A stream error: both sides get RST_STREAM.
    fn reset_stream(&mut self, id: u32, reason: Reason) {
        let Some(st) = self.remove(id) else {
            return;
        };
        for side in [Side::Client, st.target] {
            if let Some(peer) = self.peer(side) {
                frame::put_rst(&mut peer.out, id, reason);
            }
        }
    }

    /// Shutdown: no new streams; the connection closes when the last one ends.
    fn drain(&mut self) {
        if self.draining {
            return;
        }
        self.draining = true;
        frame::put_goaway(&mut self.client.out, self.last_stream, Reason::NO_ERROR, "");
    }

    /// The client broke the protocol: GOAWAY with the reason, and close.
    fn client_error(&mut self, e: ConnError) {
        tracing::debug!(error = %e, "client connection error");
        frame::put_goaway(&mut self.client.out, self.last_stream, e.reason, &e.what);
        let ids: Vec<u32> = self.streams.keys().copied().collect();
        for id in ids {
            if let Some(st) = self.remove(id) {
                if let Some(peer) = self.peer(st.target).filter(|_| st.target != Side::Client) {
                    frame::put_rst(&mut peer.out, id, Reason::CANCEL);
                }
            }
        }
        self.closing = true;
    }

    fn peer_gone(&mut self, side: Side, fault: Fault) {
        match side {
            Side::Upstream => {
                let err = UpstreamError::Request {
                    host: self.host.clone(),
                    reason: fault.to_string(),
                };
                self.upstream_gone(err);
            }
            Side::Internal => {
                tracing::warn!(why = %fault, "connection to our own server ended");
                self.internal_server = None;
                if let Some(peer) = self.internal.take() {
                    for credit in peer.credits {
                        self.grant(credit.from, None, credit.len);
                    }
                }
                self.streams_lost(Side::Internal, None);
            }
            Side::Client => {}
        }
    }

    /// The origin failed (dial, I/O, protocol): streams it had not answered get the same
    /// 502 the hyper path gives; answered ones are reset. New streams go to our server.
    fn upstream_gone(&mut self, err: UpstreamError) {
        let Some(peer) = self.upstream.take() else {
            return;
        };
        self.dial = None;
        let affected = self
            .streams
            .values()
            .filter(|st| st.target == Side::Upstream)
            .count();
        if affected > 0 {
            tracing::warn!(side = ?err.side(), error = %err, streams = affected, "upstream connection failed");
        } else {
            tracing::debug!(error = %err, "upstream connection ended");
        }
        for credit in peer.credits {
            self.grant(credit.from, None, credit.len);
        }
        self.streams_lost(Side::Upstream, Some(&err));
    }

    fn streams_lost(&mut self, side: Side, err: Option<&UpstreamError>) {
        let ids: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, st)| st.target == side)
            .map(|(id, _)| *id)
            .collect();
        for id in ids {
            let Some(st) = self.remove(id) else {
                continue;
            };
            match err {
                Some(err) if !st.answered => self.answer_error(id, st, err),
                _ => {
                    frame::put_rst(&mut self.client.out, id, Reason::INTERNAL_ERROR);
                }
            }
        }
    }

    /// Answer a stream ourselves with the error the hyper path would give.
    fn answer_error(&mut self, id: u32, old: Stream, err: &UpstreamError) {
        let (status, content_type, body) = crate::upstream::error_parts(err, old.connect_style);
        let mut headers = Headers::default();
        headers.push(b":status", status.as_str().as_bytes());
        headers.push(b"content-type", content_type.as_bytes());
        headers.push(b"content-length", body.len().to_string().as_bytes());
        let mut down = Dir::new(old.down.send_window);
        down.ended_in = true;
        down.queue.push_back(Item::Headers {
            headers,
            end: false,
        });
        down.queue.push_back(Item::Data {
            bytes: Bytes::from(body),
            end: true,
            raw: None,
            from: None,
        });
        let mut up = Dir::new(0);
        up.ended_in = true;
        up.ended_out = true;
        self.streams.insert(
            id,
            Stream {
                target: Side::Client,
                up,
                down,
                answered: true,
                connect_style: old.connect_style,
                discard_up: true,
            },
        );
        self.flush_dir(id, false);
    }
}

impl Stream {
    /// The destination and the direction toward it: the target (`up`) or the client.
    fn toward(&mut self, up: bool) -> (Side, &mut Dir) {
        if up {
            (self.target, &mut self.up)
        } else {
            (Side::Client, &mut self.down)
        }
    }
}

/// A decoded header block, with what is needed to forward it as received.
struct Block {
    headers: Headers,
    hpack: Bytes,
    /// The single HEADERS frame it came in, when it can be forwarded byte for byte.
    raw: Option<Bytes>,
    end: bool,
}

/// Does the client speak Connect (and so read `{"code","message"}` error bodies)?
fn is_connect_style(headers: &Headers) -> bool {
    let content_type = headers.get(b"content-type").unwrap_or_default();
    content_type.starts_with(b"application/connect+")
        || content_type.starts_with(b"application/proto")
        || headers.get(b"connect-protocol-version").is_some()
}

impl Future for Relay {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().drive(cx)
    }
}
