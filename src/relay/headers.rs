//! Header blocks: gathered from HEADERS and CONTINUATION frames, decoded to route new
//! streams (by the router's own decision), and forwarded as received while both ends' HPACK
//! tables stay in step, else re-encoded.

use bytes::{Bytes, BytesMut};

use super::common::{Conn, Direction};
use super::flow::Flow;
use super::frame::{self, flag, ConnError, Frame, Reason};
use super::hpack::{self, BlockEncoding, Headers};
use super::limits::calm;
use super::peer::{Partial, Peer};
use super::stream::Item;
use crate::router::Route;

/// A decoded header block, with what is needed to forward it as received.
pub(super) struct Block {
    pub(super) stream: u32,
    pub(super) headers: Headers,
    pub(super) hpack: Bytes,
    /// The single HEADERS frame it came in, when it can be forwarded byte for byte.
    pub(super) raw: Option<Bytes>,
    pub(super) end: bool,
}

/// A HEADERS frame: the whole block, or the start of one that CONTINUATIONs finish.
pub(super) fn on_headers(
    flow: &mut Flow,
    side: Conn,
    frame: &Frame,
) -> Result<Option<Block>, ConnError> {
    if frame.stream == 0 {
        return Err(ConnError::protocol("HEADERS on stream 0"));
    }
    let fragment = frame.header_fragment()?;
    let end_stream = frame.has(flag::END_STREAM);
    if frame.has(flag::END_HEADERS) {
        let whole = !frame.has(flag::PADDED) && !frame.has(flag::PRIORITY);
        let raw = whole.then(|| frame.raw.clone());
        return decode(flow, side, frame.stream, end_stream, fragment, raw).map(Some);
    }
    let peer = flow.source(side)?;
    peer.partial = Some(Partial {
        stream: frame.stream,
        end_stream,
        block: BytesMut::from(&fragment[..]),
        continuations: 0,
    });
    Ok(None)
}

/// A CONTINUATION frame: the block once it ends.
pub(super) fn on_continuation(
    flow: &mut Flow,
    side: Conn,
    frame: &Frame,
) -> Result<Option<Block>, ConnError> {
    let peer = flow.source(side)?;
    let Some(mut partial) = peer.partial.take() else {
        return Err(ConnError::protocol("CONTINUATION without HEADERS"));
    };
    if partial.stream != frame.stream {
        return Err(ConnError::protocol("CONTINUATION on another stream"));
    }
    partial.block.extend_from_slice(frame.payload());
    partial.continuations += 1;
    let limits = &flow.limits;
    if partial.block.len() > limits.max_block {
        return Err(ConnError::protocol(format!(
            "{}: a header block over {} bytes",
            side.name(),
            limits.max_block
        )));
    }
    if partial.continuations > limits.max_continuations {
        return Err(calm(format!(
            "{}: a header block in over {} CONTINUATION frames",
            side.name(),
            limits.max_continuations
        )));
    }
    let peer = flow.source(side)?;
    if !frame.has(flag::END_HEADERS) {
        peer.partial = Some(partial);
        return Ok(None);
    }
    let block = partial.block.freeze();
    decode(flow, side, partial.stream, partial.end_stream, block, None).map(Some)
}

fn decode(
    flow: &mut Flow,
    side: Conn,
    stream: u32,
    end: bool,
    hpack: Bytes,
    raw: Option<Bytes>,
) -> Result<Block, ConnError> {
    let headers = flow.source(side)?.decoder.decode(&hpack)?;
    Ok(Block {
        stream,
        headers,
        hpack,
        raw,
        end,
    })
}

/// Does the client speak Connect (and so read `{"code","message"}` error bodies)?
fn is_connect_style(headers: &Headers) -> bool {
    let content_type = headers.get(b"content-type").unwrap_or_default();
    content_type.starts_with(b"application/connect+")
        || content_type.starts_with(b"application/proto")
        || headers.get(b"connect-protocol-version").is_some()
}

/// Where the client's new streams go, and the connections that takes: the origin is dialled
/// for the first passthrough stream (and again after it closed while idle), our own server
/// started with the first stream that is ours. The driver does both when asked (`wants`).
pub(super) struct Opener {
    /// The `:authority` passthrough requests carry, without and with the port.
    authority: String,
    authority_port: String,
    #[cfg(test)]
    passthrough: fn(&str) -> bool,
    /// Told of every stream the client opens (the front door's head deadline).
    pub(super) on_stream: Option<Box<dyn FnMut() + Send>>,
    /// The origin is dialled for the first passthrough stream, not before.
    dialled: bool,
    /// The origin closed a connection with no stream on it: the next passthrough stream
    /// dials it again (at most `limits.max_redials` times).
    pub(super) may_redial: bool,
    redials: u32,
    /// Work for the driver.
    pub(super) wants: Wants,
}

/// Connections the state asked for; the driver takes them after each read.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct Wants {
    /// Dial the origin (its `Peer` is new, without a socket).
    pub(super) dial: bool,
    /// Start our own server (its `Peer` is new, without a socket).
    pub(super) internal: bool,
}

impl Opener {
    pub(super) fn new(
        authority: String,
        authority_port: String,
        #[cfg(test)] passthrough: fn(&str) -> bool,
    ) -> Self {
        Opener {
            authority,
            authority_port,
            #[cfg(test)]
            passthrough,
            on_stream: None,
            dialled: false,
            may_redial: false,
            redials: 0,
            wants: Wants::default(),
        }
    }

    /// A request block from the client: trailers of an open stream, or a new stream.
    pub(super) fn on_request(
        &mut self,
        flow: &mut Flow,
        block: Block,
        draining: bool,
    ) -> Result<(), ConnError> {
        let id = block.stream;
        if flow.streams.contains_key(&id) {
            return on_trailers(flow, block);
        }
        if id <= flow.last_stream {
            // HEADERS on a closed stream: not forwarded.
            flow.peers.desync(Conn::Upstream);
            return flow.stream_error(Conn::Client, id, Reason::STREAM_CLOSED);
        }
        if id % 2 == 0 {
            return Err(ConnError::protocol("an even stream id from the client"));
        }
        flow.last_stream = id;
        if let Some(on_stream) = self.on_stream.as_mut() {
            on_stream();
        }
        let target = self.target_for(flow, &block.headers);
        let room = flow.streams.len() < flow.limits.max_streams;
        let Some(target) = target.filter(|_| !draining && room) else {
            flow.peers.desync(Conn::Upstream);
            if !room {
                // Over the limit we announced: the client's error.
                return flow.stream_error(Conn::Client, id, Reason::REFUSED_STREAM);
            }
            frame::put_rst(flow.peers.client.out.buf(), id, Reason::REFUSED_STREAM);
            return Ok(());
        };
        if target != Conn::Upstream {
            flow.peers.desync(Conn::Upstream);
        }
        if tracing::enabled!(tracing::Level::DEBUG) {
            // The path without its query, as the router's request span shows it.
            let path = block.headers.get(b":path").unwrap_or_default();
            let path = path.split(|b| *b == b'?').next().unwrap_or_default();
            let path = String::from_utf8_lossy(path);
            tracing::debug!(stream = id, %path, to = ?target, "stream opened");
        }
        let connect_style = is_connect_style(&block.headers);
        if flow.open(id, target, block.end, connect_style) {
            send_block(flow, Direction::Up, block);
        }
        Ok(())
    }

    /// Where a new stream goes: the origin for plain passthrough, else our own server.
    fn target_for(&mut self, flow: &mut Flow, headers: &Headers) -> Option<Conn> {
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
        if plain {
            if !self.dialled {
                self.dialled = true;
                self.wants.dial = true;
            }
            self.redial_if_idle_closed(flow);
        }
        let peers = &mut flow.peers;
        if plain && peers.upstream.as_ref().is_some_and(Peer::usable) {
            return Some(Conn::Upstream);
        }
        if peers.internal.is_none() {
            peers.internal = Some(Peer::client_role(
                false,
                BlockEncoding::own(hpack::TABLE_SIZE),
            ));
            self.wants.internal = true;
        }
        peers
            .internal
            .as_ref()
            .filter(|p| p.usable())
            .map(|_| Conn::Internal)
    }

    /// The origin closed its connection (GOAWAY or EOF) with no stream on it, as origins do
    /// when idle: dial it again, so passthrough does not end with the first idle timeout.
    fn redial_if_idle_closed(&mut self, flow: &mut Flow) {
        // Connected: its dial is over (a connection that said GOAWAY always is).
        let idle_goaway = flow
            .peers
            .upstream
            .as_ref()
            .is_some_and(|u| u.goaway.is_some() && u.open_streams == 0 && u.connected);
        let closed = flow.peers.upstream.is_none() && self.may_redial;
        if !(idle_goaway || closed) || self.redials >= flow.limits.max_redials {
            return;
        }
        if let Some(old) = flow.peers.upstream.take() {
            flow.release_credits(old);
        }
        self.redials += 1;
        self.may_redial = false;
        tracing::debug!(
            redials = self.redials,
            "origin closed while idle: redialling"
        );
        // A new connection starts with an empty table on both of its ends: blocks toward it
        // are ours, and so are the blocks toward the client (its table still holds what the
        // old connection's encoder put there).
        flow.peers.upstream = Some(Peer::client_role(
            false,
            BlockEncoding::own(hpack::TABLE_SIZE),
        ));
        flow.peers.desync(Conn::Client);
        self.wants.dial = true;
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
}

/// Trailers from the client on an open stream.
fn on_trailers(flow: &mut Flow, block: Block) -> Result<(), ConnError> {
    let id = block.stream;
    let Some(st) = flow.streams.get_mut(&id) else {
        return Ok(());
    };
    if st.discard_up {
        flow.peers.desync(Conn::Upstream);
        return Ok(());
    }
    if st.up.ended_in || !block.end {
        flow.peers.desync(Conn::Upstream);
        return flow.stream_error(Conn::Client, id, Reason::PROTOCOL_ERROR);
    }
    st.up.ended_in = true;
    if st.target != Conn::Upstream {
        flow.peers.desync(Conn::Upstream);
    }
    send_block(flow, Direction::Up, block);
    Ok(())
}

/// A response block from a target.
pub(super) fn on_response(flow: &mut Flow, side: Conn, block: Block) {
    let id = block.stream;
    let Some(st) = flow.streams.get_mut(&id).filter(|st| st.target == side) else {
        // The client reset it already: its table must still see what the origin's
        // encoder did, so from now on blocks toward it are ours.
        if side == Conn::Upstream {
            flow.peers.desync(Conn::Client);
        }
        return;
    };
    if st.down.ended_in {
        if side == Conn::Upstream {
            flow.peers.desync(Conn::Client);
        }
        flow.reset_stream(id, Reason::STREAM_CLOSED);
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
    send_block(flow, Direction::Down, block);
}

/// Forward a header block toward the stream's other side, as received when that keeps the
/// two tables in step, else re-encoded (after any DATA queued before it).
fn send_block(flow: &mut Flow, to: Direction, block: Block) {
    let id = block.stream;
    let Some(st) = flow.streams.get_mut(&id) else {
        return;
    };
    // Raw forwarding pairs the client with the origin only.
    let counterpart = st.target == Conn::Upstream;
    let (dest_side, half) = st.toward(to);
    let Some(dest) = flow.peers.get_mut(dest_side) else {
        return;
    };
    if counterpart && dest.encoding.is_raw() {
        if half.queue.is_empty() {
            match &block.raw {
                Some(raw) => dest.out.push(raw.clone()),
                None => {
                    frame::put_headers(dest.out.buf(), id, block.end, &block.hpack, dest.max_frame)
                }
            }
            half.ended_out |= block.end;
            flow.finish_if_done(id);
            return;
        }
        // Behind queued DATA: it would reach the peer out of its encoder's order.
        dest.encoding = BlockEncoding::own(hpack::TABLE_SIZE);
    }
    half.queue.push_back(Item::Headers {
        input: block.hpack.len(),
        headers: block.headers,
        end: block.end,
    });
    flow.flush_dir(id, to);
}
