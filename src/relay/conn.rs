//! The relay's state machine: one client connection, its upstream connection, and (when a
//! stream is ours) an in-memory connection to our own HTTP/2 server, driven by one future.
//!
//! Each hop keeps its own settings, connection window and stream windows. Data read from one
//! side is granted back to it (WINDOW_UPDATE) only once it has been written to the other
//! side's socket, so what a slow reader costs us is bounded by the windows we advertise.
//!
//! The parts: the peers and their credits (`peer`), streams and their two directions
//! (`stream`), header blocks and where a new stream goes (`headers`), the other frames
//! (`control`), failures (`failure`), and here the drive loop that reads and writes.

use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::Buf;
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};
use tokio::time::{Instant, Sleep};

use super::failure::{io_fault, Fault};
use super::frame::{self, setting, ConnError, Reason};
use super::hpack::Encoding;
use super::limits::{Bucket, Limits};
use super::peer::{peer_of, Credit, Peer, Side, CONN_WINDOW, STREAM_WINDOW};
use super::stream::Stream;
use crate::cancel::WhenWoken;
use crate::upstream::UpstreamError;

/// Read buffer growth: one largest frame we accept, and its header.
pub(super) const READ_CHUNK: usize = 16 * 1024 + 9;

/// Upstream liveness: a PING when streams are open and nothing arrived for this long; no
/// answer by the next tick and the upstream connection counts as dead.
pub(super) const KEEP_ALIVE: Duration = Duration::from_secs(30);

pub(crate) trait Io: AsyncRead + AsyncWrite + Send + Unpin {}
impl<T: AsyncRead + AsyncWrite + Send + Unpin> Io for T {}
pub(crate) type BoxIo = Box<dyn Io>;

pub(crate) type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;

/// Dials the origin (TLS, ALPN h2); called again when the origin closed an idle connection.
pub(crate) type Dialer = Box<dyn FnMut() -> BoxFuture<Result<BoxIo, UpstreamError>> + Send>;

/// What the relay needs from the front door.
pub(crate) struct Setup {
    /// The `:authority` passthrough requests carry (the CONNECT target, without a default
    /// port); others go to our server.
    pub(crate) authority: String,
    /// The origin's port (`:authority` may also name it explicitly).
    pub(crate) port: u16,
    /// The origin's host, for error messages.
    pub(crate) host: String,
    /// Dials the origin (TLS, ALPN h2), at first and for redials.
    pub(crate) dial: Dialer,
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

/// What a relay holds at one moment (largest of its peers).
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Usage {
    /// Output waiting for one peer, in bytes.
    pub(crate) out: usize,
    /// DATA held for windows from one peer, in accounted bytes.
    pub(crate) buffered: usize,
    pub(crate) streams: usize,
    /// Items waiting in stream queues.
    pub(crate) queued_items: usize,
}

impl Usage {
    #[cfg(test)]
    pub(crate) fn max(self, other: Usage) -> Usage {
        Usage {
            out: self.out.max(other.out),
            buffered: self.buffered.max(other.buffered),
            streams: self.streams.max(other.streams),
            queued_items: self.queued_items.max(other.queued_items),
        }
    }
}

pub(crate) struct Relay {
    pub(super) authority: String,
    pub(super) authority_port: String,
    pub(super) host: String,
    #[cfg(test)]
    pub(super) passthrough: fn(&str) -> bool,
    pub(super) make_internal: Box<dyn FnMut(DuplexStream) -> BoxFuture<()> + Send>,
    pub(super) stopping: Option<BoxFuture<()>>,
    pub(super) dial: Option<BoxFuture<Result<BoxIo, UpstreamError>>>,
    pub(super) dialer: Dialer,
    /// The origin closed a connection with no stream on it: the next passthrough stream
    /// dials it again (at most `limits.max_redials` times).
    pub(super) may_redial: bool,
    pub(super) redials: u32,
    pub(super) limits: Limits,
    /// Streams the client reset before their answer (rapid reset).
    pub(super) premature_resets: Bucket,
    /// Frames from the client that carry nothing for a stream (PING, SETTINGS, ...).
    pub(super) control_frames: Bucket,
    /// Streams we reset because the client broke their rules.
    pub(super) error_resets: usize,
    /// A connection error found while moving frames (not while reading the client): raised
    /// toward the client by the drive loop.
    pub(super) pending_error: Option<ConnError>,
    /// Likewise, an error of the origin's.
    pub(super) upstream_fault: Option<ConnError>,
    pub(super) client: Peer,
    /// The origin; `None` once it failed or closed (new streams then go to our server, whose
    /// own upstream link redials).
    pub(super) upstream: Option<Peer>,
    /// Our own server, for the streams that are ours; started with the first one.
    pub(super) internal: Option<Peer>,
    pub(super) internal_server: Option<WhenWoken<BoxFuture<()>>>,
    pub(super) streams: HashMap<u32, Stream>,
    /// Highest stream id the client opened.
    pub(super) last_stream: u32,
    pub(super) preface_seen: bool,
    /// We told the client GOAWAY (shutdown): no new streams, close when the last one ends.
    pub(super) draining: bool,
    /// The client said GOAWAY: close when the last stream ends.
    pub(super) client_goaway: bool,
    /// A connection error: close once the GOAWAY is written.
    pub(super) closing: bool,
    pub(super) keep_alive: Pin<Box<Sleep>>,
    pub(super) released: Vec<Credit>,
    /// The origin is dialled for the first passthrough stream, not before.
    pub(super) dialled: bool,
    /// Told of every stream the client opens (the front door's head deadline).
    pub(super) on_stream: Option<Box<dyn FnMut() + Send>>,
    /// Bytes read from the client while it was held back, not yet parsed.
    pub(super) probed: bool,
}

impl Relay {
    pub(crate) fn new(client: BoxIo, setup: Setup) -> Self {
        Relay::with_limits(client, setup, Limits::default())
    }

    pub(crate) fn with_limits(client: BoxIo, setup: Setup, limits: Limits) -> Self {
        let mut client = Peer::new(Some(client), Encoding::Raw);
        frame::put_settings(
            &mut client.out,
            &[
                (setting::MAX_CONCURRENT_STREAMS, limits.max_streams as u32),
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
            dial: None,
            dialer: setup.dial,
            may_redial: false,
            redials: 0,
            premature_resets: Bucket::new(limits.premature_resets),
            control_frames: Bucket::new(limits.control_frames),
            limits,
            error_resets: 0,
            pending_error: None,
            upstream_fault: None,
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
            dialled: false,
            on_stream: None,
            probed: false,
        }
    }

    /// Call `f` for every stream the client opens.
    pub(crate) fn on_stream(mut self, f: Box<dyn FnMut() + Send>) -> Self {
        self.on_stream = Some(f);
        self
    }

    /// Start the first dial of the origin, once a passthrough stream needs it.
    pub(super) fn dial_first(&mut self) {
        if !self.dialled {
            self.dialled = true;
            self.dial = Some((self.dialer)());
        }
    }

    pub(super) fn peer(&mut self, side: Side) -> Option<&mut Peer> {
        peer_of(
            &mut self.client,
            &mut self.upstream,
            &mut self.internal,
            side,
        )
    }

    /// The peer a frame came from. Only `drive` removes peers, never a frame handler, so it
    /// is there; the error is for the impossible case, not a panic.
    pub(super) fn source(&mut self, side: Side) -> Result<&mut Peer, ConnError> {
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
        self.poll_keep_alive(cx);
        loop {
            // In the loop: a redial starts while frames are handled.
            let mut progress = self.poll_dial(cx);
            if let Some(server) = self.internal_server.as_mut() {
                if Pin::new(server).poll(cx).is_ready() {
                    self.internal_server = None;
                }
            }
            if !self.closing && !self.may_read(Side::Client) {
                // Held back, the client is still watched for leaving.
                match self.probe_client(cx) {
                    Ok(p) => progress |= p,
                    Err(why) => {
                        tracing::debug!(%why, "client connection ended while held back");
                        return Poll::Ready(());
                    }
                }
            }
            if !self.closing && self.may_read(Side::Client) {
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
                if !self.may_read(side) {
                    continue;
                }
                match self.read(side, cx) {
                    Ok(p) => progress |= p,
                    Err(fault) => {
                        self.peer_gone(side, fault);
                        progress = true;
                    }
                }
            }
            if let Some(e) = self.pending_error.take().filter(|_| !self.closing) {
                self.client_error(e);
                progress = true;
            }
            if let Some(e) = self.upstream_fault.take() {
                self.peer_gone(Side::Upstream, Fault::Protocol(e));
                progress = true;
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

    /// What the connection holds now, for tests and fuzzing to check against the limits.
    pub(crate) fn usage(&self) -> Usage {
        let peers = [
            Some(&self.client),
            self.upstream.as_ref(),
            self.internal.as_ref(),
        ];
        let peers = peers.into_iter().flatten();
        let mut usage = Usage {
            streams: self.streams.len(),
            ..Usage::default()
        };
        for p in peers {
            usage.out = usage.out.max(p.out.len());
            usage.buffered = usage.buffered.max(p.buffered);
        }
        for st in self.streams.values() {
            usage.queued_items += st.up.queue.len() + st.down.queue.len();
        }
        usage
    }

    /// Backpressure: a peer is not read while output waits for it beyond the bound (it does
    /// not read what we owe it) or its DATA held for windows is over the bound; the client is
    /// not read either while a peer it feeds is that far behind.
    fn may_read(&self, side: Side) -> bool {
        let limits = &self.limits;
        let behind = |p: &Peer| p.out.len() > limits.max_pending_out;
        let Some(peer) = self.peer_ref(side) else {
            return true;
        };
        // What one peer sends mostly lands in another's buffer: none is read while any is
        // behind.
        let any_behind = [Side::Client, Side::Upstream, Side::Internal]
            .into_iter()
            .filter_map(|s| self.peer_ref(s))
            .any(behind);
        !any_behind && peer.buffered <= limits.max_buffered
    }

    fn peer_ref(&self, side: Side) -> Option<&Peer> {
        match side {
            Side::Client => Some(&self.client),
            Side::Upstream => self.upstream.as_ref(),
            Side::Internal => self.internal.as_ref(),
        }
    }

    /// Fuzzing and tests: the limits hold, and the held-DATA accounting matches the queues.
    pub(crate) fn check_limits(&self) -> Result<(), String> {
        let limits = &self.limits;
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
        for side in [Side::Client, Side::Upstream, Side::Internal] {
            let Some(peer) = self.peer_ref(side) else {
                continue;
            };
            let mut held = 0;
            for st in self.streams.values() {
                for item in st.up.queue.iter().chain(st.down.queue.iter()) {
                    if let super::stream::Item::Data {
                        bytes,
                        from: Some(from),
                        ..
                    } = item
                    {
                        if *from == side {
                            held += bytes.len() + limits.frame_overhead;
                        }
                    }
                }
            }
            if held != peer.buffered {
                return Err(format!(
                    "{side:?}: {held} bytes held, {} accounted",
                    peer.buffered
                ));
            }
        }
        Ok(())
    }

    pub(super) fn finished(&self) -> bool {
        self.closing || ((self.draining || self.client_goaway) && self.streams.is_empty())
    }

    fn poll_dial(&mut self, cx: &mut Context<'_>) -> bool {
        let Some(dial) = self.dial.as_mut() else {
            return false;
        };
        let Poll::Ready(result) = dial.as_mut().poll(cx) else {
            return false;
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
        true
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

    /// While the client is not read (backpressure), read on into its buffer without parsing,
    /// up to `limits.max_probe` (what a client that keeps to our windows can still send), so
    /// its leaving (EOF or an error) ends the connection instead of holding it. `Ok(true)` if
    /// bytes came.
    fn probe_client(&mut self, cx: &mut Context<'_>) -> Result<bool, Fault> {
        let peer = &mut self.client;
        let Some(io) = peer.io.as_mut() else {
            return Ok(false);
        };
        if peer.rbuf.len() >= self.limits.max_probe {
            return Ok(false);
        }
        if peer.rbuf.capacity() - peer.rbuf.len() < 4096 {
            peer.rbuf.reserve(READ_CHUNK);
        }
        match tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut peer.rbuf) {
            Poll::Pending => Ok(false),
            Poll::Ready(Ok(0)) => Err(Fault::Closed("closed by the peer".into())),
            Poll::Ready(Ok(_)) => {
                self.probed = true;
                Ok(true)
            }
            Poll::Ready(Err(e)) => Err(io_fault(&e)),
        }
    }

    /// Read once from `side` and handle every whole frame; `Ok(true)` if anything came.
    pub(super) fn read(&mut self, side: Side, cx: &mut Context<'_>) -> Result<bool, Fault> {
        // Bytes a probe left unparsed are handled even if the socket has nothing new.
        let probed = side == Side::Client && std::mem::take(&mut self.probed);
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
            Poll::Pending if probed => {}
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
            if !peer.settings_seen {
                if frame.kind != frame::kind::SETTINGS || frame.has(frame::flag::ACK) {
                    return Err(ConnError::protocol(format!(
                        "{}: the first frame is not SETTINGS (RFC 9113 §3.4)",
                        side.name()
                    ))
                    .into());
                }
                peer.settings_seen = true;
            }
            self.on_frame(side, frame)?;
            if side == Side::Client {
                if let Some(e) = self.pending_error.take() {
                    return Err(e.into());
                }
            }
        }
    }

    /// Write what is buffered for `side`, then grant back the data that left.
    pub(super) fn write(&mut self, side: Side, cx: &mut Context<'_>) -> Result<bool, Fault> {
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
}

impl Future for Relay {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().drive(cx)
    }
}
