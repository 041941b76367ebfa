//! The frames that are not header blocks: DATA, SETTINGS, WINDOW_UPDATE, GOAWAY,
//! RST_STREAM, PING, and the CONTINUATIONs of a block.

use bytes::BytesMut;

use super::conn::Relay;
use super::frame::{self, flag, kind, setting, ConnError, Frame, Reason};
use super::hpack::Encoding;
use super::peer::{Partial, Side};
use super::stream::{Direction, Item};

impl Relay {
    pub(super) fn on_frame(&mut self, side: Side, frame: Frame) -> Result<(), ConnError> {
        let peer = self.source(side)?;
        if peer.partial.is_some() && frame.kind != kind::CONTINUATION {
            return Err(ConnError::protocol(
                "a frame inside a header block (RFC 9113 §6.10)",
            ));
        }
        if side == Side::Client
            && self.costs_without_carrying(&frame)
            && !self.control_frames.take()
        {
            return Err(calm(
                "client: too many PING, SETTINGS, PRIORITY, empty DATA or unknown frames",
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
                    continuations: 0,
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
                partial.continuations += 1;
                let limits = &self.limits;
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
                let peer = self.source(side)?;
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
                self.idle_check(side, frame.stream, "RST_STREAM")?;
                self.on_reset(side, frame.stream, Reason(code))
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
            if !frame.payload().is_empty() {
                return Err(ConnError::new(
                    Reason::FRAME_SIZE_ERROR,
                    format!("{}: a SETTINGS ACK with a payload", side.name()),
                ));
            }
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
            let mut overflow = false;
            for st in self.streams.values_mut() {
                let dir = if side == Side::Client {
                    &mut st.down
                } else if st.target == side {
                    &mut st.up
                } else {
                    continue;
                };
                dir.send_window += window_delta;
                overflow |= dir.send_window > frame::MAX_WINDOW;
            }
            if overflow {
                return Err(ConnError::new(
                    Reason::FLOW_CONTROL_ERROR,
                    format!(
                        "{}: INITIAL_WINDOW_SIZE takes a stream window over 2^31-1 (RFC 9113 §6.9.2)",
                        side.name()
                    ),
                ));
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
        self.idle_check(side, frame.stream, "WINDOW_UPDATE")?;
        let Some(st) = self.streams.get_mut(&frame.stream) else {
            return Ok(());
        };
        let (dir, to) = match side {
            Side::Client => (&mut st.down, Direction::Down),
            side if side == st.target => (&mut st.up, Direction::Up),
            _ => return Ok(()),
        };
        dir.send_window += increment;
        if increment == 0 || dir.send_window > frame::MAX_WINDOW {
            let reason = if increment == 0 {
                Reason::PROTOCOL_ERROR
            } else {
                Reason::FLOW_CONTROL_ERROR
            };
            return self.stream_error(side, frame.stream, reason);
        }
        self.flush_dir(frame.stream, to);
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

    fn on_reset(&mut self, side: Side, id: u32, reason: Reason) -> Result<(), ConnError> {
        let Some(st) = self.streams.get(&id) else {
            return Ok(());
        };
        if side != Side::Client && st.target != side {
            return Ok(());
        }
        if side == Side::Client && !st.answered && !self.premature_resets.take() {
            return Err(calm(format!(
                "client: over {} streams reset before their answer (rapid reset)",
                self.limits.premature_resets.burst
            )));
        }
        if side != Side::Client && reason == Reason::NO_ERROR && self.answer_in_flight(id) {
            self.reset_after_answer(id);
            return Ok(());
        }
        let Some(st) = self.remove(id) else {
            return Ok(());
        };
        let other = if side == Side::Client {
            st.target
        } else {
            Side::Client
        };
        // Our own answer (an error): nothing behind it to tell.
        if other == side {
            return Ok(());
        }
        if let Some(peer) = self.peer(other) {
            frame::put_rst(&mut peer.out, id, reason);
        }
        Ok(())
    }

    /// A frame that refers to a stream must not name one never opened (RFC 9113 §5.1): ids
    /// above the client's last, or even ones (we allow no push).
    fn idle_check(&self, side: Side, id: u32, what: &str) -> Result<(), ConnError> {
        let idle = (id > self.last_stream || id % 2 == 0) && !self.streams.contains_key(&id);
        if idle {
            return Err(ConnError::protocol(format!(
                "{}: {what} on idle stream {id}",
                side.name()
            )));
        }
        Ok(())
    }

    /// Does this frame from the client cost us work without carrying anything for a stream?
    fn costs_without_carrying(&self, frame: &Frame) -> bool {
        match frame.kind {
            kind::PING | kind::SETTINGS | kind::PRIORITY => true,
            kind::DATA => frame.payload().is_empty() && !frame.has(flag::END_STREAM),
            kind::HEADERS
            | kind::CONTINUATION
            | kind::RST_STREAM
            | kind::PUSH_PROMISE
            | kind::GOAWAY
            | kind::WINDOW_UPDATE => false,
            _ => true,
        }
    }

    /// A stream error: both sides get RST_STREAM; one the client caused counts toward
    /// `limits.max_error_resets`.
    pub(super) fn stream_error(
        &mut self,
        side: Side,
        id: u32,
        reason: Reason,
    ) -> Result<(), ConnError> {
        if self.streams.contains_key(&id) {
            self.reset_stream(id, reason);
        } else {
            frame::put_rst(&mut self.client.out, id, reason);
        }
        if side != Side::Client {
            return Ok(());
        }
        self.error_resets += 1;
        if self.error_resets > self.limits.max_error_resets {
            return Err(calm(format!(
                "client: over {} streams reset for its errors",
                self.limits.max_error_resets
            )));
        }
        Ok(())
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
        let overhead = self.limits.frame_overhead;
        for len in dropped {
            self.unhold(Side::Client, len as usize + overhead);
            self.grant(Side::Client, None, len);
        }
        self.flush_dir(id, Direction::Down);
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
        let to = if side == Side::Client {
            Direction::Up
        } else {
            Direction::Down
        };
        let Some(st) = self.streams.get_mut(&id) else {
            return Ok(());
        };
        if to == Direction::Up && st.discard_up {
            self.grant(side, None, len);
            return Ok(());
        }
        let dir = st.dir(to);
        dir.recv_window -= len as i64;
        if dir.ended_in || dir.recv_window < 0 {
            let reason = if dir.ended_in {
                Reason::STREAM_CLOSED
            } else {
                Reason::FLOW_CONTROL_ERROR
            };
            self.grant(side, None, len);
            return self.stream_error(side, id, reason);
        }
        dir.ended_in |= end;
        let padding = len - data.len() as u32;
        let held = data.len() + self.limits.frame_overhead;
        let raw = (!frame.has(flag::PADDED)).then_some(frame.raw);
        dir.queue.push_back(Item::Data {
            bytes: data,
            end,
            raw,
            from: Some(side),
        });
        self.source(side)?.buffered += held;
        if padding > 0 {
            self.grant(side, Some(id), padding);
        }
        self.flush_dir(id, to);
        Ok(())
    }
}

/// ENHANCE_YOUR_CALM: a peer past one of our limits.
pub(super) fn calm(what: impl Into<String>) -> ConnError {
    ConnError::new(Reason::ENHANCE_YOUR_CALM, what)
}
