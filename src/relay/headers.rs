//! Header blocks: decoded to route new streams (by the router's own decision) and forwarded
//! as received while both ends' HPACK tables stay in step, else re-encoded.

use bytes::Bytes;

use super::conn::Relay;
use super::frame::{self, ConnError, Reason};
use super::hpack::{Encoding, Headers};
use super::peer::{Peer, Side};
use super::stream::{Dir, Direction, Item, Stream};
use crate::cancel::WhenWoken;
use crate::router::Route;

/// Buffer of the in-memory connection to our own server.
pub(super) const INTERNAL_BUF: usize = 256 * 1024;

/// A decoded header block, with what is needed to forward it as received.
pub(super) struct Block {
    pub(super) headers: Headers,
    pub(super) hpack: Bytes,
    /// The single HEADERS frame it came in, when it can be forwarded byte for byte.
    pub(super) raw: Option<Bytes>,
    pub(super) end: bool,
}

/// Does the client speak Connect (and so read `{"code","message"}` error bodies)?
fn is_connect_style(headers: &Headers) -> bool {
    let content_type = headers.get(b"content-type").unwrap_or_default();
    content_type.starts_with(b"application/connect+")
        || content_type.starts_with(b"application/proto")
        || headers.get(b"connect-protocol-version").is_some()
}

impl Relay {
    pub(super) fn on_block(
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
                return self.stream_error(Side::Client, id, Reason::PROTOCOL_ERROR);
            }
            st.up.ended_in = true;
            if st.target != Side::Upstream {
                self.desync(Side::Upstream);
            }
            self.send_block(id, Direction::Up, block);
            return Ok(());
        }
        if id <= self.last_stream {
            // HEADERS on a closed stream: not forwarded.
            self.desync(Side::Upstream);
            return self.stream_error(Side::Client, id, Reason::STREAM_CLOSED);
        }
        if id % 2 == 0 {
            return Err(ConnError::protocol("an even stream id from the client"));
        }
        self.last_stream = id;
        if let Some(on_stream) = self.on_stream.as_mut() {
            on_stream();
        }
        let target = self.target_for(&block.headers);
        let room = self.streams.len() < self.limits.max_streams;
        let Some(target) = target.filter(|_| !self.draining && room) else {
            self.desync(Side::Upstream);
            if !room {
                // Over the limit we announced: the client's error.
                return self.stream_error(Side::Client, id, Reason::REFUSED_STREAM);
            }
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
        self.send_block(id, Direction::Up, block);
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
        if plain {
            self.dial_first();
            self.redial_if_idle_closed();
        }
        if plain && self.upstream.as_ref().is_some_and(Peer::usable) {
            return Some(Side::Upstream);
        }
        self.ensure_internal();
        self.internal
            .as_ref()
            .filter(|p| p.usable())
            .map(|_| Side::Internal)
    }

    /// The origin closed its connection (GOAWAY or EOF) with no stream on it, as origins do
    /// when idle: dial it again, so passthrough does not end with the first idle timeout.
    fn redial_if_idle_closed(&mut self) {
        let idle_goaway = self
            .upstream
            .as_ref()
            .is_some_and(|u| u.goaway.is_some() && u.open_streams == 0 && self.dial.is_none());
        let closed = self.upstream.is_none() && self.may_redial;
        if !(idle_goaway || closed) || self.redials >= self.limits.max_redials {
            return;
        }
        if let Some(old) = self.upstream.take() {
            for credit in old.credits {
                self.grant(credit.from, None, credit.len);
            }
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
        self.upstream = Some(Peer::client_role(
            None,
            Encoding::own(super::hpack::TABLE_SIZE),
        ));
        self.desync(Side::Client);
        self.dial = Some((self.dialer)());
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
        self.send_block(id, Direction::Down, block);
    }

    /// Forward a header block toward the stream's other side, as received when that keeps
    /// the two tables in step, else re-encoded (after any DATA queued before it).
    fn send_block(&mut self, id: u32, to: Direction, block: Block) {
        let Some((target, dir, dest)) = self.route_of(id, to) else {
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
        let input = block.hpack.len();
        dir.queue.push_back(Item::Headers {
            headers: block.headers,
            end: block.end,
            input,
        });
        self.flush_dir(id, to);
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
}
