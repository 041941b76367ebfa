//! The relay's driver: one client connection, its upstream connection, and (when a stream
//! is ours) an in-memory connection to our own HTTP/2 server, driven by one future. It owns
//! the sockets, the dial and the timers; what the frames mean is the state's (`state`).
//!
//! Each hop keeps its own settings, connection window and stream windows. Data read from one
//! side is granted back to it (WINDOW_UPDATE) only once it has been written to the other
//! side's socket, so what a slow reader costs us is bounded by the windows we advertise.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BytesMut};
use tokio::io::{AsyncRead, AsyncWrite, DuplexStream};
use tokio::time::{Instant, Sleep};

use super::common::Conn;
use super::frame::{self, ConnError, FrameReader};
use super::headers::{Opener, Wants};
use super::limits::Limits;
use super::state::ConnState;
use crate::base::cancel::WhenWoken;
use crate::http::H2_KEEP_ALIVE;
use crate::upstream::UpstreamError;

/// Read buffer growth: one largest frame we accept, and its header.
pub(super) const READ_CHUNK: usize = 16 * 1024 + 9;

/// Reads from one peer per turn of the driver, before what they brought is written on.
const READS_PER_TURN: usize = 4;

/// The most plaintext one TLS record carries.
pub(super) const TLS_RECORD: usize = 16 * 1024;

/// What a TLS connection the relay writes to should accept in one write. rustls's default
/// (64 KiB) is 36 bytes short of a turn's four whole frames, so each such turn would leave in
/// two writes, the second a 36-byte record in a segment of its own.
pub(crate) const TLS_SEND_BUFFER: usize = READS_PER_TURN * READ_CHUNK + 16 * 1024;

/// Buffer of the in-memory connection to our own server.
const INTERNAL_BUF: usize = 256 * 1024;

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

/// The client's connection is over: the relay's future is done.
struct ClientGone;

/// One peer's socket and what is read from it but not yet a whole frame.
struct Socket {
    /// `None` while the upstream is dialled, or before our own server is started.
    io: Option<BoxIo>,
    rbuf: BytesMut,
    reader: FrameReader,
    /// Written since the last flush.
    flush: bool,
    /// Read from since the last keep-alive tick.
    active: bool,
}

impl Socket {
    fn new(io: Option<BoxIo>) -> Self {
        Socket {
            io,
            rbuf: BytesMut::new(),
            reader: FrameReader::new(frame::DEFAULT_MAX_FRAME),
            flush: false,
            active: false,
        }
    }
}

struct Sockets {
    client: Socket,
    upstream: Socket,
    internal: Socket,
}

impl Sockets {
    fn get_mut(&mut self, side: Conn) -> &mut Socket {
        match side {
            Conn::Client => &mut self.client,
            Conn::Upstream => &mut self.upstream,
            Conn::Internal => &mut self.internal,
        }
    }
}

pub(crate) struct Relay {
    state: ConnState,
    sockets: Sockets,
    /// The origin's host, for error messages.
    host: String,
    make_internal: Box<dyn FnMut(DuplexStream) -> BoxFuture<()> + Send>,
    internal_server: Option<WhenWoken<BoxFuture<()>>>,
    stopping: Option<BoxFuture<()>>,
    dial: Option<BoxFuture<Result<BoxIo, UpstreamError>>>,
    dialer: Dialer,
    keep_alive: Pin<Box<Sleep>>,
    preface_seen: bool,
    /// Bytes read from the client while it was held back, not yet parsed.
    probed: bool,
    /// The origin filled a whole turn of reads in this pass: more is likely ready, and the
    /// client's TLS records are filled whole (see [`Relay::write`]).
    more_ready: bool,
}

impl Relay {
    pub(crate) fn new(client: BoxIo, setup: Setup) -> Self {
        Relay::with_limits(client, setup, Limits::default())
    }

    pub(crate) fn with_limits(client: BoxIo, setup: Setup, limits: Limits) -> Self {
        let authority_port = format!("{}:{}", setup.host_for_port(), setup.port);
        let opener = Opener::new(
            setup.authority,
            authority_port,
            #[cfg(test)]
            setup.passthrough,
        );
        Relay {
            state: ConnState::new(limits, opener),
            sockets: Sockets {
                client: Socket::new(Some(client)),
                upstream: Socket::new(None),
                internal: Socket::new(None),
            },
            host: setup.host,
            make_internal: setup.internal,
            internal_server: None,
            stopping: Some(setup.stopping),
            dial: None,
            dialer: setup.dial,
            keep_alive: Box::pin(tokio::time::sleep(H2_KEEP_ALIVE)),
            preface_seen: false,
            probed: false,
            more_ready: false,
        }
    }

    /// Call `f` for every stream the client opens.
    pub(crate) fn on_stream(mut self, f: Box<dyn FnMut() + Send>) -> Self {
        self.state.on_stream(f);
        self
    }

    /// What the connection holds now, for tests to check against the limits.
    #[cfg(test)]
    pub(crate) fn usage(&self) -> super::state::Held {
        self.state.usage()
    }

    /// Fuzzing and tests: the limits hold, and the held-DATA accounting matches the queues.
    #[cfg(any(test, fuzzing))]
    pub(crate) fn check_limits(&self) -> Result<(), String> {
        self.state.check_limits()
    }

    /// Everything that can move now; `Ready` when the client's connection is over.
    fn drive(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if let Some(stopping) = self.stopping.as_mut() {
            if stopping.as_mut().poll(cx).is_ready() {
                self.stopping = None;
                self.state.drain();
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
            match self.move_frames(cx) {
                Ok(p) => progress |= p,
                Err(ClientGone) => return Poll::Ready(()),
            }
            if self.state.closed() {
                // Best effort: the close_notify; the socket closes when we return anyway.
                if let Some(io) = self.sockets.client.io.as_mut() {
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

    /// Read, raise what went wrong meanwhile, write; `Ok(true)` if anything moved.
    fn move_frames(&mut self, cx: &mut Context<'_>) -> Result<bool, ClientGone> {
        let read = self.read_all(cx)?;
        let raised = self.raise_errors();
        let written = self.write_all(cx)?;
        Ok(read | raised | written)
    }

    /// Read every peer that may be read, and make the connections that asked for.
    fn read_all(&mut self, cx: &mut Context<'_>) -> Result<bool, ClientGone> {
        let mut progress = false;
        self.more_ready = false;
        if !self.state.closing() {
            progress |= self.read_client(cx)?;
        }
        self.make_connections();
        for side in [Conn::Upstream, Conn::Internal] {
            if !self.state.may_read(side) {
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
        Ok(progress)
    }

    fn read_client(&mut self, cx: &mut Context<'_>) -> Result<bool, ClientGone> {
        if !self.state.may_read(Conn::Client) {
            // Held back, the client is still watched for leaving.
            return self.probe_client(cx).map_err(|why| {
                tracing::debug!(%why, "client connection ended while held back");
                ClientGone
            });
        }
        match self.read(Conn::Client, cx) {
            Ok(p) => Ok(p),
            Err(Fault::Closed(why)) => {
                tracing::debug!(%why, "client connection ended");
                Err(ClientGone)
            }
            Err(Fault::Protocol(e)) => {
                self.state.client_error(e);
                Ok(true)
            }
        }
    }

    /// Errors found while moving frames: the client's ends its connection, the origin's
    /// the upstream connection. `true` if there was one.
    fn raise_errors(&mut self) -> bool {
        let mut raised = false;
        if let Some(e) = self.state.take_client_error() {
            if !self.state.closing() {
                self.state.client_error(e);
                raised = true;
            }
        }
        if let Some(e) = self.state.take_upstream_fault() {
            self.peer_gone(Conn::Upstream, Fault::Protocol(e));
            raised = true;
        }
        raised
    }

    /// Write to every peer; the client's failure ends the relay, another's ends that peer.
    fn write_all(&mut self, cx: &mut Context<'_>) -> Result<bool, ClientGone> {
        let mut progress = false;
        for side in Conn::ALL {
            match self.write(side, cx) {
                Ok(p) => progress |= p,
                Err(fault) if side == Conn::Client => {
                    tracing::debug!(why = %fault, "client connection ended");
                    return Err(ClientGone);
                }
                Err(fault) => {
                    self.peer_gone(side, fault);
                    progress = true;
                }
            }
        }
        Ok(progress)
    }

    /// The dial and our own server, if a new stream asked for them.
    fn make_connections(&mut self) {
        let Wants { dial, internal } = self.state.take_wants();
        if dial {
            // A redial replaces the old connection, if there was one.
            self.sockets.upstream = Socket::new(None);
            self.dial = Some((self.dialer)());
        }
        if internal {
            let (ours, theirs) = tokio::io::duplex(INTERNAL_BUF);
            self.internal_server = Some(WhenWoken::new((self.make_internal)(theirs)));
            self.sockets.internal = Socket::new(Some(Box::new(ours)));
            self.state.connected(Conn::Internal);
        }
    }

    fn peer_gone(&mut self, side: Conn, fault: Fault) {
        match side {
            Conn::Upstream => {
                let err = UpstreamError::Request {
                    host: self.host.clone(),
                    reason: fault.to_string(),
                };
                self.upstream_gone(err);
            }
            Conn::Internal => {
                tracing::warn!(why = %fault, "connection to our own server ended");
                self.internal_server = None;
                self.sockets.internal = Socket::new(None);
                self.state.internal_gone();
            }
            Conn::Client => {}
        }
    }

    fn upstream_gone(&mut self, err: UpstreamError) {
        if self.state.upstream_gone(&err) {
            self.dial = None;
            self.sockets.upstream = Socket::new(None);
        }
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
                if self.state.connected(Conn::Upstream) {
                    self.sockets.upstream.io = Some(io);
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
        self.keep_alive
            .as_mut()
            .reset(Instant::now() + H2_KEEP_ALIVE);
        let _ = self.keep_alive.as_mut().poll(cx);
        let upstream = &mut self.sockets.upstream;
        if upstream.io.is_none() {
            return;
        }
        if !self.state.ping_upstream(upstream.active) {
            let err = UpstreamError::Timeout {
                host: self.host.clone(),
                secs: H2_KEEP_ALIVE.as_secs(),
            };
            self.upstream_gone(err);
            return;
        }
        upstream.active = false;
    }

    /// While the client is not read (backpressure), read on into its buffer without parsing,
    /// up to `limits.max_probe` (what a client that keeps to our windows can still send), so
    /// its leaving (EOF or an error) ends the connection instead of holding it. `Ok(true)` if
    /// bytes came.
    fn probe_client(&mut self, cx: &mut Context<'_>) -> Result<bool, Fault> {
        let socket = &mut self.sockets.client;
        let Some(io) = socket.io.as_mut() else {
            return Ok(false);
        };
        if socket.rbuf.len() >= self.state.limits().max_probe {
            return Ok(false);
        }
        match read_some(io, cx, &mut socket.rbuf) {
            Poll::Pending => Ok(false),
            Poll::Ready(Ok(0)) => Err(Fault::Closed("closed by the peer".into())),
            Poll::Ready(Ok(_)) => {
                self.probed = true;
                Ok(true)
            }
            Poll::Ready(Err(e)) => Err(io_fault(&e)),
        }
    }

    /// Read from `side` up to [`READS_PER_TURN`] times, each read's frames handed to the state
    /// before the next; `Ok(true)` if anything came. A TLS connection hands out one record
    /// (at most 16 KiB) per read: what several brought leaves in one write instead of one
    /// write each. The bounds are checked between reads, as between turns.
    fn read(&mut self, side: Conn, cx: &mut Context<'_>) -> Result<bool, Fault> {
        let mut progress = false;
        for i in 0..READS_PER_TURN {
            if !self.read_once(side, cx)? {
                break;
            }
            progress = true;
            if !self.state.may_read(side) || self.state.closing() || self.state.faulted() {
                break;
            }
            if i + 1 == READS_PER_TURN && side != Conn::Client {
                self.more_ready = true;
            }
        }
        Ok(progress)
    }

    /// Read once from `side` and hand every whole frame to the state; `Ok(true)` if anything
    /// came.
    fn read_once(&mut self, side: Conn, cx: &mut Context<'_>) -> Result<bool, Fault> {
        // Bytes a probe left unparsed are handled even if the socket has nothing new.
        let probed = side == Conn::Client && std::mem::take(&mut self.probed);
        let socket = self.sockets.get_mut(side);
        let Some(io) = socket.io.as_mut() else {
            return Ok(false);
        };
        match read_some(io, cx, &mut socket.rbuf) {
            Poll::Pending if probed => {}
            Poll::Pending => return Ok(false),
            Poll::Ready(Ok(0)) => return Err(Fault::Closed("closed by the peer".into())),
            Poll::Ready(Ok(_)) => {}
            Poll::Ready(Err(e)) => return Err(io_fault(&e)),
        }
        socket.active = true;
        if side == Conn::Client && !self.preface_seen {
            let rbuf = &mut socket.rbuf;
            let have = rbuf.len().min(frame::PREFACE.len());
            if rbuf[..have] != frame::PREFACE[..have] {
                return Err(ConnError::protocol("not the HTTP/2 client preface").into());
            }
            if have < frame::PREFACE.len() {
                return Ok(true);
            }
            rbuf.advance(have);
            self.preface_seen = true;
        }
        loop {
            let socket = self.sockets.get_mut(side);
            let Some(frame) = socket.reader.next(&mut socket.rbuf)? else {
                return Ok(true);
            };
            self.state.on_frame(side, frame)?;
            if side == Conn::Client {
                if let Some(e) = self.state.take_client_error() {
                    return Err(e.into());
                }
            }
        }
    }

    /// Write what is buffered for `side`, then grant back the data that left.
    fn write(&mut self, side: Conn, cx: &mut Context<'_>) -> Result<bool, Fault> {
        let socket = self.sockets.get_mut(side);
        let Some(io) = socket.io.as_mut() else {
            return Ok(false);
        };
        let Some(peer) = self.state.peer_mut(side) else {
            return Ok(false);
        };
        let mut progress = false;
        let mut allowed = match side {
            // More follows at once: whole TLS records now, the rest with it. The loop reads
            // again before it can stop, and a pass that finds nothing new writes everything.
            Conn::Client if self.more_ready => peer.out.len() - peer.out.len() % TLS_RECORD,
            _ => usize::MAX,
        };
        while !peer.out.is_empty() && allowed > 0 {
            match peer.out.poll_write(&mut **io, cx, allowed) {
                Poll::Ready(Ok(0)) => return Err(Fault::Closed("closed while writing".into())),
                Poll::Ready(Ok(n)) => {
                    allowed = allowed.saturating_sub(n);
                    peer.sent(n);
                    socket.flush = true;
                    progress = true;
                }
                Poll::Ready(Err(e)) => return Err(io_fault(&e)),
                Poll::Pending => break,
            }
        }
        if peer.out.is_empty() && socket.flush {
            match Pin::new(&mut *io).poll_flush(cx) {
                Poll::Ready(Ok(())) => socket.flush = false,
                Poll::Ready(Err(e)) => return Err(io_fault(&e)),
                Poll::Pending => {}
            }
        }
        progress |= self.state.release_written(side);
        Ok(progress)
    }
}

/// One read into `rbuf`, of at most [`READ_CHUNK`] bytes whatever room the buffer has (a
/// buffer that grew keeps its room), so what one read brings past a bound stays small. Room
/// for a frame's worth is made first when little is left.
fn read_some(
    io: &mut BoxIo,
    cx: &mut Context<'_>,
    rbuf: &mut BytesMut,
) -> Poll<std::io::Result<usize>> {
    use bytes::BufMut;
    if rbuf.capacity() - rbuf.len() < 4096 {
        rbuf.reserve(READ_CHUNK);
    }
    tokio_util::io::poll_read_buf(Pin::new(io), cx, &mut rbuf.limit(READ_CHUNK))
}

impl Future for Relay {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        self.get_mut().drive(cx)
    }
}
