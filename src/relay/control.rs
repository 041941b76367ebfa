//! The frames that are not header blocks: DATA, SETTINGS, WINDOW_UPDATE, GOAWAY,
//! RST_STREAM and PING, each applied to the streams and peers (`flow`).

use bytes::Bytes;

use super::common::{Conn, Direction};
use super::flow::Flow;
use super::frame::{self, flag, kind, setting, ConnError, Frame, Reason};
use super::hpack::{self, BlockEncoding};
use super::stream::{Data, Item};

/// Does this frame from the client cost us work without carrying anything for a stream?
pub(super) fn costs_without_carrying(frame: &Frame) -> bool {
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

pub(super) fn on_ping(flow: &mut Flow, side: Conn, frame: &Frame) -> Result<(), ConnError> {
    let payload: [u8; 8] = frame
        .payload()
        .try_into()
        .map_err(|_| ConnError::new(Reason::FRAME_SIZE_ERROR, "PING frame is not 8 bytes"))?;
    let peer = flow.source(side)?;
    if frame.has(flag::ACK) {
        peer.ping_out = false;
    } else {
        frame::put_ping(peer.out.buf(), true, payload);
    }
    Ok(())
}

pub(super) fn on_settings(flow: &mut Flow, side: Conn, frame: &Frame) -> Result<(), ConnError> {
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
    let peer = flow.source(side)?;
    for (id, value) in frame::settings(frame.payload())? {
        match id {
            // A peer that keeps a smaller table than every peer starts with: our own
            // encoder, sized for it, from the next block on.
            setting::HEADER_TABLE_SIZE if (value as usize) < hpack::TABLE_SIZE => {
                peer.encoding = BlockEncoding::own(value as usize);
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
    frame::put_settings_ack(peer.out.buf());
    if window_delta != 0 {
        shift_stream_windows(flow, side, window_delta)?;
    }
    Ok(())
}

/// A new INITIAL_WINDOW_SIZE from `side` moves the send window of every stream toward it.
fn shift_stream_windows(flow: &mut Flow, side: Conn, delta: i64) -> Result<(), ConnError> {
    let mut overflow = false;
    for st in flow.streams.values_mut() {
        let half = if side == Conn::Client {
            &mut st.down
        } else if st.target == side {
            &mut st.up
        } else {
            continue;
        };
        half.send_window += delta;
        overflow |= half.send_window > frame::MAX_WINDOW;
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
    flow.flush_toward(side);
    Ok(())
}

pub(super) fn on_window_update(
    flow: &mut Flow,
    side: Conn,
    frame: &Frame,
) -> Result<(), ConnError> {
    let increment = (frame::u32_payload(frame, "WINDOW_UPDATE")? & 0x7fff_ffff) as i64;
    if frame.stream == 0 {
        let peer = flow.source(side)?;
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
        flow.flush_toward(side);
        return Ok(());
    }
    idle_check(flow, side, frame.stream, "WINDOW_UPDATE")?;
    let Some(st) = flow.streams.get_mut(&frame.stream) else {
        return Ok(());
    };
    let (half, to) = match side {
        Conn::Client => (&mut st.down, Direction::Down),
        side if side == st.target => (&mut st.up, Direction::Up),
        _ => return Ok(()),
    };
    half.send_window += increment;
    if increment == 0 || half.send_window > frame::MAX_WINDOW {
        let reason = if increment == 0 {
            Reason::PROTOCOL_ERROR
        } else {
            Reason::FLOW_CONTROL_ERROR
        };
        return flow.stream_error(side, frame.stream, reason);
    }
    flow.flush_dir(frame.stream, to);
    Ok(())
}

/// A GOAWAY's last stream id and reason.
pub(super) fn goaway(frame: &Frame) -> Result<(u32, Reason), ConnError> {
    let payload = frame.payload();
    if payload.len() < 8 || frame.stream != 0 {
        return Err(ConnError::new(Reason::FRAME_SIZE_ERROR, "bad GOAWAY frame"));
    }
    let last = u32::from_be_bytes([payload[0], payload[1], payload[2], payload[3]]) & 0x7fff_ffff;
    let code = Reason(u32::from_be_bytes([
        payload[4], payload[5], payload[6], payload[7],
    ]));
    Ok((last, code))
}

/// A target said GOAWAY: streams above `last` it will not process.
pub(super) fn target_goaway(flow: &mut Flow, side: Conn, last: u32, code: Reason) {
    tracing::debug!(?side, last, %code, "GOAWAY");
    if let Some(peer) = flow.peers.get_mut(side) {
        peer.goaway = Some(last);
    }
    // Streams it will not process were not seen: the client may retry them.
    let refused: Vec<u32> = flow
        .streams
        .iter()
        .filter(|(id, st)| st.target == side && **id > last)
        .map(|(id, _)| *id)
        .collect();
    for id in refused {
        if let Some(st) = flow.remove(id) {
            if !st.down.ended_out {
                frame::put_rst(flow.peers.client.out.buf(), id, Reason::REFUSED_STREAM);
            }
        }
    }
}

pub(super) fn on_rst_stream(flow: &mut Flow, side: Conn, frame: &Frame) -> Result<(), ConnError> {
    let code = frame::u32_payload(frame, "RST_STREAM")?;
    if frame.stream == 0 {
        return Err(ConnError::protocol("RST_STREAM on stream 0"));
    }
    idle_check(flow, side, frame.stream, "RST_STREAM")?;
    on_reset(flow, side, frame.stream, Reason(code))
}

fn on_reset(flow: &mut Flow, side: Conn, id: u32, reason: Reason) -> Result<(), ConnError> {
    let Some(st) = flow.streams.get(&id) else {
        return Ok(());
    };
    if side != Conn::Client && st.target != side {
        return Ok(());
    }
    if side == Conn::Client && !st.answered {
        flow.spent.premature_reset()?;
    }
    if side != Conn::Client && reason == Reason::NO_ERROR && answer_in_flight(flow, id) {
        reset_after_answer(flow, id);
        return Ok(());
    }
    let Some(st) = flow.remove(id) else {
        return Ok(());
    };
    let other = if side == Conn::Client {
        st.target
    } else {
        Conn::Client
    };
    // Our own answer (an error): nothing behind it to tell.
    if other == side {
        return Ok(());
    }
    if let Some(peer) = flow.peers.get_mut(other) {
        frame::put_rst(peer.out.buf(), id, reason);
    }
    Ok(())
}

/// A frame that refers to a stream must not name one never opened (RFC 9113 §5.1): ids
/// above the client's last, or even ones (we allow no push).
fn idle_check(flow: &Flow, side: Conn, id: u32, what: &str) -> Result<(), ConnError> {
    let idle = (id > flow.last_stream || id % 2 == 0) && !flow.streams.contains_key(&id);
    if idle {
        return Err(ConnError::protocol(format!(
            "{}: {what} on idle stream {id}",
            side.name()
        )));
    }
    Ok(())
}

/// The target answered in full and some of it still waits for the client's window.
fn answer_in_flight(flow: &Flow, id: u32) -> bool {
    flow.streams
        .get(&id)
        .is_some_and(|st| st.down.ended_in && !st.down.queue.is_empty())
}

/// RST_STREAM(NO_ERROR) from a target that answered in full (it does not want the rest of
/// the request): the answer is delivered first, then the client is told.
fn reset_after_answer(flow: &mut Flow, id: u32) {
    let Some(st) = flow.streams.get_mut(&id) else {
        return;
    };
    st.discard_up = true;
    st.up.ended_out = true;
    let dropped: Vec<u32> = st
        .up
        .queue
        .drain(..)
        .filter_map(|item| match item {
            Item::Data(Data {
                bytes,
                from: Some(_),
                ..
            }) => Some(bytes.len() as u32),
            _ => None,
        })
        .collect();
    if !st.up.ended_in {
        st.down.queue.push_back(Item::Reset(Reason::NO_ERROR));
    }
    let overhead = flow.limits.frame_overhead;
    for len in dropped {
        flow.peers.unhold(Conn::Client, len as usize + overhead);
        flow.grant(Conn::Client, None, len);
    }
    flow.flush_dir(id, Direction::Down);
}

/// Payloads under this are copied out of the read buffer when queued.
const DETACH_BELOW: usize = 4096;

/// A DATA payload (and its frame, when it goes whole) as it is held until written. A small one
/// is copied out of the read buffer it was split from: held, it would keep that whole buffer
/// (a read's worth) alive while the limits count only its own bytes. A large one is kept as
/// read, so bulk data is not copied; what it keeps alive is at most a few times its size.
fn detach_small(data: Bytes, raw: Option<Bytes>) -> (Bytes, Option<Bytes>) {
    if data.len() >= DETACH_BELOW {
        return (data, raw);
    }
    match raw {
        Some(raw) => {
            let raw = Bytes::copy_from_slice(&raw);
            (raw.slice(frame::HEADER_LEN..), Some(raw))
        }
        None => (Bytes::copy_from_slice(&data), None),
    }
}

pub(super) fn on_data(flow: &mut Flow, side: Conn, frame: Frame) -> Result<(), ConnError> {
    let id = frame.stream;
    if id == 0 {
        return Err(ConnError::protocol("DATA on stream 0"));
    }
    let len = frame.payload().len() as u32;
    let peer = flow.source(side)?;
    peer.recv_conn -= len as i64;
    if peer.recv_conn < 0 {
        return Err(ConnError::new(
            Reason::FLOW_CONTROL_ERROR,
            "DATA beyond the connection window",
        ));
    }
    let data = frame.unpadded()?;
    let end = frame.has(flag::END_STREAM);
    let belongs = flow
        .streams
        .get(&id)
        .is_some_and(|st| side == Conn::Client || st.target == side);
    if !belongs {
        if side == Conn::Client && id > flow.last_stream {
            return Err(ConnError::protocol("DATA on a stream never opened"));
        }
        // A stream that was reset or finished: drop it, give the window back.
        flow.grant(side, None, len);
        return Ok(());
    }
    let to = if side == Conn::Client {
        Direction::Up
    } else {
        Direction::Down
    };
    let Some(st) = flow.streams.get_mut(&id) else {
        return Ok(());
    };
    if to == Direction::Up && st.discard_up {
        flow.grant(side, None, len);
        return Ok(());
    }
    let half = st.half(to);
    half.recv_window -= len as i64;
    if half.ended_in || half.recv_window < 0 {
        let reason = if half.ended_in {
            Reason::STREAM_CLOSED
        } else {
            Reason::FLOW_CONTROL_ERROR
        };
        flow.grant(side, None, len);
        return flow.stream_error(side, id, reason);
    }
    half.ended_in |= end;
    let padding = len - data.len() as u32;
    let held = data.len() + flow.limits.frame_overhead;
    let raw = (!frame.has(flag::PADDED)).then_some(frame.raw);
    let (bytes, raw) = detach_small(data, raw);
    half.queue.push_back(Item::Data(Data {
        bytes,
        end,
        raw,
        from: Some(side),
    }));
    flow.source(side)?.buffered += held;
    if padding > 0 {
        flow.grant(side, Some(id), padding);
    }
    flow.flush_dir(id, to);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A read holding one DATA frame of `len` bytes, then more of the read; the frame.
    fn read_with_frame(len: usize) -> (Bytes, Bytes) {
        let mut buf = bytes::BytesMut::new();
        frame::put_data(&mut buf, 1, false, &vec![7; len]);
        buf.extend_from_slice(&[0; 16 * 1024]);
        let read = buf.freeze();
        let raw = read.slice(..frame::HEADER_LEN + len);
        (read, raw)
    }

    #[test]
    fn a_small_payload_is_held_apart_from_its_read_and_a_large_one_as_read() {
        let (read, raw) = read_with_frame(100);
        let (bytes, kept) = detach_small(raw.slice(frame::HEADER_LEN..), Some(raw.clone()));
        let kept = kept.expect("the frame goes whole");
        assert_eq!((&kept[..], &bytes[..]), (&raw[..], &[7; 100][..]));
        let in_read = read.as_ptr_range();
        assert!(!in_read.contains(&kept.as_ptr()) && !in_read.contains(&bytes.as_ptr()));
        assert!(
            kept.as_ptr_range().contains(&bytes.as_ptr()),
            "one copy serves both"
        );
        // A padded frame's payload alone.
        let (bytes, kept) = detach_small(raw.slice(frame::HEADER_LEN..), None);
        assert!(kept.is_none() && !in_read.contains(&bytes.as_ptr()));

        let (read, raw) = read_with_frame(DETACH_BELOW);
        let (bytes, kept) = detach_small(raw.slice(frame::HEADER_LEN..), Some(raw));
        let in_read = read.as_ptr_range();
        assert!(in_read.contains(&bytes.as_ptr()), "bulk data is not copied");
        assert!(in_read.contains(&kept.expect("whole").as_ptr()));
    }
}
