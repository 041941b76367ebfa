//! HTTP/2 framing (RFC 9113 §4, §6), sans-IO: a parser fed bytes in any chunks, and writers
//! that append frames to an output buffer.

use bytes::{Buf, BufMut, Bytes, BytesMut};

pub(crate) const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
pub(crate) const HEADER_LEN: usize = 9;
/// The frame size every peer accepts (SETTINGS_MAX_FRAME_SIZE's default and minimum).
pub(crate) const DEFAULT_MAX_FRAME: u32 = 16_384;
/// Every stream and the connection start with this window (RFC 9113 §6.9.2).
pub(crate) const DEFAULT_WINDOW: u32 = 65_535;
pub(crate) const MAX_WINDOW: i64 = (1 << 31) - 1;

pub(crate) mod kind {
    pub(crate) const DATA: u8 = 0;
    pub(crate) const HEADERS: u8 = 1;
    pub(crate) const PRIORITY: u8 = 2;
    pub(crate) const RST_STREAM: u8 = 3;
    pub(crate) const SETTINGS: u8 = 4;
    pub(crate) const PUSH_PROMISE: u8 = 5;
    pub(crate) const PING: u8 = 6;
    pub(crate) const GOAWAY: u8 = 7;
    pub(crate) const WINDOW_UPDATE: u8 = 8;
    pub(crate) const CONTINUATION: u8 = 9;
}

pub(crate) mod flag {
    pub(crate) const END_STREAM: u8 = 0x1;
    pub(crate) const ACK: u8 = 0x1;
    pub(crate) const END_HEADERS: u8 = 0x4;
    pub(crate) const PADDED: u8 = 0x8;
    pub(crate) const PRIORITY: u8 = 0x20;
}

pub(crate) mod setting {
    pub(crate) const HEADER_TABLE_SIZE: u16 = 1;
    pub(crate) const ENABLE_PUSH: u16 = 2;
    pub(crate) const MAX_CONCURRENT_STREAMS: u16 = 3;
    pub(crate) const INITIAL_WINDOW_SIZE: u16 = 4;
    pub(crate) const MAX_FRAME_SIZE: u16 = 5;
    pub(crate) const MAX_HEADER_LIST_SIZE: u16 = 6;
}

/// Error codes (RFC 9113 §7).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Reason(pub(crate) u32);

impl Reason {
    pub(crate) const NO_ERROR: Reason = Reason(0);
    pub(crate) const PROTOCOL_ERROR: Reason = Reason(1);
    pub(crate) const INTERNAL_ERROR: Reason = Reason(2);
    pub(crate) const FLOW_CONTROL_ERROR: Reason = Reason(3);
    pub(crate) const STREAM_CLOSED: Reason = Reason(5);
    pub(crate) const FRAME_SIZE_ERROR: Reason = Reason(6);
    pub(crate) const REFUSED_STREAM: Reason = Reason(7);
    pub(crate) const CANCEL: Reason = Reason(8);
    pub(crate) const COMPRESSION_ERROR: Reason = Reason(9);
    pub(crate) const ENHANCE_YOUR_CALM: Reason = Reason(11);
}

impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.0 {
            0 => "NO_ERROR",
            1 => "PROTOCOL_ERROR",
            2 => "INTERNAL_ERROR",
            3 => "FLOW_CONTROL_ERROR",
            4 => "SETTINGS_TIMEOUT",
            5 => "STREAM_CLOSED",
            6 => "FRAME_SIZE_ERROR",
            7 => "REFUSED_STREAM",
            8 => "CANCEL",
            9 => "COMPRESSION_ERROR",
            10 => "CONNECT_ERROR",
            11 => "ENHANCE_YOUR_CALM",
            12 => "INADEQUATE_SECURITY",
            13 => "HTTP_1_1_REQUIRED",
            other => return write!(f, "error code {other:#x}"),
        };
        f.write_str(name)
    }
}

/// A connection error: what was wrong, and the code the GOAWAY carries.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{reason}: {what}")]
pub(crate) struct ConnError {
    pub(crate) reason: Reason,
    pub(crate) what: String,
}

impl ConnError {
    pub(crate) fn new(reason: Reason, what: impl Into<String>) -> Self {
        ConnError {
            reason,
            what: what.into(),
        }
    }

    pub(crate) fn protocol(what: impl Into<String>) -> Self {
        ConnError::new(Reason::PROTOCOL_ERROR, what)
    }
}

/// One frame: its header fields, and the payload (padding still in).
#[derive(Debug, Clone)]
pub(crate) struct Frame {
    pub(crate) kind: u8,
    pub(crate) flags: u8,
    pub(crate) stream: u32,
    /// The whole frame as received, header included: forwarded as is when nothing changes.
    pub(crate) raw: Bytes,
}

impl Frame {
    pub(crate) fn payload(&self) -> &[u8] {
        &self.raw[HEADER_LEN..]
    }

    pub(crate) fn payload_bytes(&self) -> Bytes {
        self.raw.slice(HEADER_LEN..)
    }

    pub(crate) fn has(&self, flag: u8) -> bool {
        self.flags & flag != 0
    }

    /// The payload of a DATA, HEADERS or PUSH_PROMISE frame without its padding.
    pub(crate) fn unpadded(&self) -> Result<Bytes, ConnError> {
        let payload = self.payload_bytes();
        if !self.has(flag::PADDED) {
            return Ok(payload);
        }
        let Some(&pad) = payload.first() else {
            return Err(ConnError::new(
                Reason::FRAME_SIZE_ERROR,
                "padded frame without a pad length",
            ));
        };
        let end = payload
            .len()
            .checked_sub(pad as usize + 1)
            .ok_or_else(|| ConnError::protocol("padding longer than the frame (RFC 9113 §6.1)"))?;
        Ok(payload.slice(1..1 + end))
    }

    /// A HEADERS frame's header block fragment: padding and priority fields removed.
    pub(crate) fn header_fragment(&self) -> Result<Bytes, ConnError> {
        let mut block = self.unpadded()?;
        if self.kind == kind::HEADERS && self.has(flag::PRIORITY) {
            if block.len() < 5 {
                return Err(ConnError::new(
                    Reason::FRAME_SIZE_ERROR,
                    "HEADERS priority fields cut short",
                ));
            }
            block.advance(5);
        }
        Ok(block)
    }
}

/// Splits a byte stream into frames. Frames over `max_frame` (what we advertised) are a
/// FRAME_SIZE_ERROR; nothing is buffered beyond one frame plus what the reads brought.
#[derive(Debug)]
pub(crate) struct FrameReader {
    pub(crate) max_frame: u32,
}

impl FrameReader {
    pub(crate) fn new(max_frame: u32) -> Self {
        FrameReader { max_frame }
    }

    /// The next whole frame at the front of `buf`, taken out of it; `None` until one is there.
    pub(crate) fn next(&self, buf: &mut BytesMut) -> Result<Option<Frame>, ConnError> {
        if buf.len() < HEADER_LEN {
            return Ok(None);
        }
        let len = u32::from_be_bytes([0, buf[0], buf[1], buf[2]]);
        if len > self.max_frame {
            return Err(ConnError::new(
                Reason::FRAME_SIZE_ERROR,
                format!("a {len}-byte frame, over the {} we allow", self.max_frame),
            ));
        }
        let total = HEADER_LEN + len as usize;
        if buf.len() < total {
            buf.reserve(total - buf.len());
            return Ok(None);
        }
        let kind = buf[3];
        let flags = buf[4];
        let stream = u32::from_be_bytes([buf[5], buf[6], buf[7], buf[8]]) & 0x7fff_ffff;
        let raw = buf.split_to(total).freeze();
        Ok(Some(Frame {
            kind,
            flags,
            stream,
            raw,
        }))
    }
}

/// Append a frame header.
pub(crate) fn put_head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    debug_assert!(len < 1 << 24);
    out.reserve(HEADER_LEN + len);
    write_head(out, len, kind, flags, stream);
}

fn write_head(out: &mut BytesMut, len: usize, kind: u8, flags: u8, stream: u32) {
    out.put_uint(len as u64, 3);
    out.put_u8(kind);
    out.put_u8(flags);
    out.put_u32(stream & 0x7fff_ffff);
}

pub(crate) fn put_settings(out: &mut BytesMut, values: &[(u16, u32)]) {
    put_head(out, values.len() * 6, kind::SETTINGS, 0, 0);
    for &(id, value) in values {
        out.put_u16(id);
        out.put_u32(value);
    }
}

pub(crate) fn put_settings_ack(out: &mut BytesMut) {
    put_head(out, 0, kind::SETTINGS, flag::ACK, 0);
}

pub(crate) fn put_ping(out: &mut BytesMut, ack: bool, payload: [u8; 8]) {
    put_head(out, 8, kind::PING, if ack { flag::ACK } else { 0 }, 0);
    out.put_slice(&payload);
}

pub(crate) fn put_window_update(out: &mut BytesMut, stream: u32, increment: u32) {
    put_head(out, 4, kind::WINDOW_UPDATE, 0, stream);
    out.put_u32(increment & 0x7fff_ffff);
}

pub(crate) fn put_rst(out: &mut BytesMut, stream: u32, reason: Reason) {
    put_head(out, 4, kind::RST_STREAM, 0, stream);
    out.put_u32(reason.0);
}

pub(crate) fn put_goaway(out: &mut BytesMut, last_stream: u32, reason: Reason, debug: &str) {
    let debug = &debug.as_bytes()[..debug.len().min(256)];
    put_head(out, 8 + debug.len(), kind::GOAWAY, 0, 0);
    out.put_u32(last_stream & 0x7fff_ffff);
    out.put_u32(reason.0);
    out.put_slice(debug);
}

/// A whole DATA frame (the relay itself writes the header and queues the payload).
#[cfg(test)]
pub(crate) fn put_data(out: &mut BytesMut, stream: u32, end_stream: bool, data: &[u8]) {
    put_data_head(out, stream, end_stream, data.len());
    out.put_slice(data);
}

/// A DATA frame's header, for a payload of `len` bytes that follows it elsewhere.
pub(crate) fn put_data_head(out: &mut BytesMut, stream: u32, end_stream: bool, len: usize) {
    let flags = if end_stream { flag::END_STREAM } else { 0 };
    debug_assert!(len < 1 << 24);
    out.reserve(HEADER_LEN);
    write_head(out, len, kind::DATA, flags, stream);
}

/// A header block as HEADERS plus CONTINUATION frames no larger than `max_frame`.
pub(crate) fn put_headers(
    out: &mut BytesMut,
    stream: u32,
    end_stream: bool,
    block: &[u8],
    max_frame: u32,
) {
    let max = max_frame as usize;
    let mut chunks = block.chunks(max).peekable();
    let first = chunks.next().unwrap_or(&[]);
    let mut flags = if end_stream { flag::END_STREAM } else { 0 };
    if chunks.peek().is_none() {
        flags |= flag::END_HEADERS;
    }
    put_head(out, first.len(), kind::HEADERS, flags, stream);
    out.put_slice(first);
    while let Some(chunk) = chunks.next() {
        let flags = if chunks.peek().is_none() {
            flag::END_HEADERS
        } else {
            0
        };
        put_head(out, chunk.len(), kind::CONTINUATION, flags, stream);
        out.put_slice(chunk);
    }
}

/// SETTINGS payload entries.
pub(crate) fn settings(payload: &[u8]) -> Result<impl Iterator<Item = (u16, u32)> + '_, ConnError> {
    if payload.len() % 6 != 0 {
        return Err(ConnError::new(
            Reason::FRAME_SIZE_ERROR,
            "SETTINGS length not a multiple of 6",
        ));
    }
    Ok(payload.chunks_exact(6).map(|c| {
        (
            u16::from_be_bytes([c[0], c[1]]),
            u32::from_be_bytes([c[2], c[3], c[4], c[5]]),
        )
    }))
}

/// A 4-byte big-endian field (RST_STREAM's code, WINDOW_UPDATE's increment).
pub(crate) fn u32_payload(frame: &Frame, what: &str) -> Result<u32, ConnError> {
    match frame.payload() {
        [a, b, c, d] => Ok(u32::from_be_bytes([*a, *b, *c, *d])),
        _ => Err(ConnError::new(
            Reason::FRAME_SIZE_ERROR,
            format!("{what} frame is not 4 bytes"),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> BytesMut {
        let mut out = BytesMut::new();
        put_settings(&mut out, &[(setting::INITIAL_WINDOW_SIZE, 1 << 20)]);
        put_headers(&mut out, 1, false, &[0x82; 40], 16);
        put_data(&mut out, 1, true, b"hello");
        put_window_update(&mut out, 0, 99);
        put_ping(&mut out, true, *b"12345678");
        put_rst(&mut out, 3, Reason::CANCEL);
        put_goaway(&mut out, 3, Reason::NO_ERROR, "bye");
        out
    }

    fn parse_all(chunks: &[&[u8]]) -> Vec<Frame> {
        let reader = FrameReader::new(DEFAULT_MAX_FRAME);
        let mut buf = BytesMut::new();
        let mut frames = Vec::new();
        for chunk in chunks {
            buf.extend_from_slice(chunk);
            while let Some(frame) = reader.next(&mut buf).unwrap() {
                frames.push(frame);
            }
        }
        assert!(buf.is_empty());
        frames
    }

    #[test]
    fn every_split_point_gives_the_same_frames() {
        let bytes = sample();
        let whole: Vec<_> = parse_all(&[&bytes])
            .into_iter()
            .map(|f| (f.kind, f.flags, f.stream, f.raw))
            .collect();
        // SETTINGS, HEADERS + 2 CONTINUATION, DATA, WINDOW_UPDATE, PING, RST, GOAWAY.
        assert_eq!(whole.len(), 9);
        for a in 0..=bytes.len() {
            for b in a..=bytes.len() {
                let split: Vec<_> = parse_all(&[&bytes[..a], &bytes[a..b], &bytes[b..]])
                    .into_iter()
                    .map(|f| (f.kind, f.flags, f.stream, f.raw))
                    .collect();
                assert_eq!(split, whole, "split at {a}/{b}");
            }
        }
    }

    #[test]
    fn header_blocks_split_into_continuations_and_back() {
        let frames = parse_all(&[&sample()]);
        let block: Vec<u8> = frames[1..4]
            .iter()
            .flat_map(|f| f.header_fragment().unwrap().to_vec())
            .collect();
        assert_eq!(block, vec![0x82; 40]);
        assert_eq!(frames[1].kind, kind::HEADERS);
        assert!(!frames[1].has(flag::END_HEADERS));
        assert_eq!(frames[3].kind, kind::CONTINUATION);
        assert!(frames[3].has(flag::END_HEADERS));
    }

    #[test]
    fn padding_and_priority_are_removed() {
        let mut out = BytesMut::new();
        // HEADERS, PADDED | PRIORITY | END_HEADERS: pad length 2, 5 priority bytes, block, pad.
        let payload = [2, 0, 0, 0, 0, 16, 0x82, 0x84, 0, 0];
        put_head(&mut out, payload.len(), kind::HEADERS, 0x2c, 1);
        out.put_slice(&payload);
        let frame = FrameReader::new(DEFAULT_MAX_FRAME)
            .next(&mut out)
            .unwrap()
            .unwrap();
        assert_eq!(&frame.header_fragment().unwrap()[..], &[0x82, 0x84]);
        // Padding that claims more than the frame holds.
        let mut out = BytesMut::new();
        put_head(&mut out, 2, kind::DATA, flag::PADDED, 1);
        out.put_slice(&[5, 0]);
        let frame = FrameReader::new(DEFAULT_MAX_FRAME)
            .next(&mut out)
            .unwrap()
            .unwrap();
        assert_eq!(frame.unpadded().unwrap_err().reason, Reason::PROTOCOL_ERROR);
    }

    #[test]
    fn oversized_frames_are_refused_before_buffering() {
        let mut out = BytesMut::new();
        put_head(&mut out, 20_000, kind::DATA, 0, 1);
        let err = FrameReader::new(DEFAULT_MAX_FRAME)
            .next(&mut out)
            .unwrap_err();
        assert_eq!(err.reason, Reason::FRAME_SIZE_ERROR);
    }

    #[test]
    fn arbitrary_bytes_never_panic() {
        use proptest::prelude::*;
        proptest!(|(bytes in proptest::collection::vec(any::<u8>(), 0..300))| {
            let reader = FrameReader::new(64);
            let mut buf = BytesMut::from(&bytes[..]);
            while let Ok(Some(frame)) = reader.next(&mut buf) {
                let _ = frame.header_fragment();
                let _ = settings(frame.payload()).map(|s| s.count());
                let _ = u32_payload(&frame, "x");
            }
        });
    }
}
