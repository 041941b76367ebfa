//! Connect streaming envelopes `[flags u8][len u32 BE][payload]`: an encoder and an incremental,
//! sans-IO decoder that the HTTP layer feeds with whatever chunks arrive.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use super::compression::{gunzip_bounded, gzip_into, Encoding};
use super::end_stream::EndStream;
use super::error::CodecError;

/// Flag bit: the payload is compressed with the stream's negotiated codec.
pub const FLAG_COMPRESSED: u8 = 0x01;
/// Flag bit: this is the end-of-stream message (JSON), last frame of a response.
pub const FLAG_END_STREAM: u8 = 0x02;

const HEADER_LEN: usize = 5;

/// Size limits applied to everything decoded from a peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest payload on the wire (the length prefix of a frame, or a whole unary body).
    pub max_frame_bytes: usize,
    /// Largest message after decompression.
    pub max_decompressed_bytes: usize,
}

impl Default for Limits {
    /// 16 MiB on the wire, 64 MiB inflated: far above real Agent messages (the largest seen,
    /// a model list, is ~50 KB) yet bounded.
    fn default() -> Self {
        Limits {
            max_frame_bytes: 16 << 20,
            max_decompressed_bytes: 64 << 20,
        }
    }
}

/// A decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub enum Frame {
    /// A message payload, already decompressed.
    Message(Bytes),
    /// The end-of-stream message; nothing may follow it.
    End(EndStream),
}

/// Which side of an RPC a stream is: only responses end with an end-of-stream frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StreamKind {
    Request,
    Response,
}

fn to_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

/// Encodes one frame with `flags` around `payload` as given (no compression applied here).
pub fn encode_frame(flags: u8, payload: &[u8]) -> Result<Bytes, CodecError> {
    let len = u32::try_from(payload.len()).map_err(|_| CodecError::FrameTooLarge {
        len: to_u64(payload.len()),
        max: u64::from(u32::MAX),
    })?;
    let mut buf = BytesMut::with_capacity(HEADER_LEN + payload.len());
    buf.put_u8(flags);
    buf.put_u32(len);
    buf.put_slice(payload);
    Ok(buf.freeze())
}

/// Builds the frames we send on one stream.
#[derive(Debug, Clone, Copy)]
pub struct FrameEncoder {
    encoding: Encoding,
    compress_min_bytes: usize,
}

impl FrameEncoder {
    /// Messages smaller than this are sent uncompressed even when gzip was negotiated: gzip
    /// costs more than it saves on small protobufs (connect-es uses the same default).
    pub(crate) const DEFAULT_COMPRESS_MIN_BYTES: usize = 1024;

    /// `encoding` is what the stream's `connect-content-encoding` header says we send.
    pub fn new(encoding: Encoding) -> Self {
        FrameEncoder {
            encoding,
            compress_min_bytes: Self::DEFAULT_COMPRESS_MIN_BYTES,
        }
    }

    #[cfg(test)]
    fn with_compress_min_bytes(mut self, n: usize) -> Self {
        self.compress_min_bytes = n;
        self
    }

    /// A message frame, gzip-compressed when negotiated and the payload is large enough.
    pub fn message(&self, payload: &[u8]) -> Result<Bytes, CodecError> {
        if self.encoding == Encoding::Gzip && payload.len() >= self.compress_min_bytes {
            // Compress straight behind a placeholder header to avoid a second copy.
            let mut buf = gzip_into(vec![0; HEADER_LEN], payload)?;
            let len = buf.len() - HEADER_LEN;
            let len32 = u32::try_from(len).map_err(|_| CodecError::FrameTooLarge {
                len: to_u64(len),
                max: u64::from(u32::MAX),
            })?;
            // In bounds: `buf` starts with the HEADER_LEN placeholder bytes.
            buf[0] = FLAG_COMPRESSED;
            buf[1..HEADER_LEN].copy_from_slice(&len32.to_be_bytes());
            Ok(Bytes::from(buf))
        } else {
            encode_frame(0, payload)
        }
    }

    /// The end-of-stream frame. Never compressed: it is small, and peers that botch codec
    /// negotiation can still read why the stream ended.
    pub fn end_stream(&self, end: &EndStream) -> Result<Bytes, CodecError> {
        encode_frame(FLAG_END_STREAM, &end.to_json())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum DecodeState {
    Open,
    Ended,
    Failed,
}

/// Incremental frame decoder. Feed it chunks with [`push`](Self::push) / [`feed`](Self::feed),
/// take frames with [`next_frame`](Self::next_frame) until it returns `Ok(None)`, and call
/// [`finish`](Self::finish) when the body ends. Any chunking yields the same frames.
///
/// Memory stays bounded by the limits as long as the caller drains frames after each chunk:
/// a length prefix over `max_frame_bytes` is refused from the 5-byte header alone, and gzip
/// payloads are inflated only up to `max_decompressed_bytes`. After an error the decoder stays
/// failed (its position in the stream is lost) and drops further input.
#[derive(Debug)]
pub struct FrameDecoder {
    buf: BytesMut,
    kind: StreamKind,
    encoding: Encoding,
    limits: Limits,
    /// `(flags, len)` of the frame whose payload is being buffered.
    header: Option<(u8, usize)>,
    state: DecodeState,
}

impl FrameDecoder {
    /// `encoding` is the stream's `connect-content-encoding` (see [`Encoding::from_header`]).
    pub fn new(kind: StreamKind, encoding: Encoding, limits: Limits) -> Self {
        FrameDecoder {
            buf: BytesMut::new(),
            kind,
            encoding,
            limits,
            header: None,
            state: DecodeState::Open,
        }
    }

    /// Appends a chunk (copied into the buffer).
    pub fn push(&mut self, chunk: &[u8]) {
        if self.state != DecodeState::Failed {
            self.buf.extend_from_slice(chunk);
        }
    }

    /// Appends a chunk, taking it over without a copy when the buffer is empty and the chunk is
    /// uniquely owned (the common case for a body chunk straight off hyper).
    pub fn feed(&mut self, chunk: Bytes) {
        if self.state == DecodeState::Failed {
            return;
        }
        if self.buf.is_empty() {
            self.buf = BytesMut::from(chunk);
        } else {
            self.buf.extend_from_slice(&chunk);
        }
    }

    /// True once the end-of-stream frame has been returned.
    #[cfg(test)]
    fn is_ended(&self) -> bool {
        self.state == DecodeState::Ended
    }

    /// Bytes received but not yet returned as frames (excluding a consumed header).
    pub fn buffered_len(&self) -> usize {
        self.buf.len()
    }

    /// The next complete frame, `Ok(None)` if more input is needed.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, CodecError> {
        if self.state == DecodeState::Failed {
            return Err(CodecError::DecoderFailed);
        }
        let result = self.decode_one();
        if result.is_err() {
            self.state = DecodeState::Failed;
            self.buf = BytesMut::new();
            self.header = None;
        }
        result
    }

    fn decode_one(&mut self) -> Result<Option<Frame>, CodecError> {
        if self.state == DecodeState::Ended {
            // Even one stray byte after the end frame is a protocol error.
            return if self.buf.is_empty() {
                Ok(None)
            } else {
                Err(CodecError::FrameAfterEnd)
            };
        }
        let (flags, len) = match self.header {
            Some(h) => h,
            None => {
                if self.buf.len() < HEADER_LEN {
                    return Ok(None);
                }
                // `get_*` cannot panic: at least HEADER_LEN bytes are buffered (checked above).
                let flags = self.buf.get_u8();
                let len = self.buf.get_u32();
                let h = (flags, self.check_header(flags, len)?);
                self.header = Some(h);
                h
            }
        };
        if self.buf.len() < len {
            return Ok(None);
        }
        self.header = None;
        let raw = self.buf.split_to(len).freeze();
        let payload = if flags & FLAG_COMPRESSED != 0 {
            gunzip_bounded(&raw, self.limits.max_decompressed_bytes)?
        } else if raw.len() > self.limits.max_decompressed_bytes {
            return Err(CodecError::DecompressedTooLarge {
                max: to_u64(self.limits.max_decompressed_bytes),
            });
        } else {
            raw
        };
        if flags & FLAG_END_STREAM != 0 {
            let end = EndStream::from_json(&payload)?;
            self.state = DecodeState::Ended;
            Ok(Some(Frame::End(end)))
        } else {
            Ok(Some(Frame::Message(payload)))
        }
    }

    /// Validates a header before any of its payload is buffered; returns the payload length.
    fn check_header(&self, flags: u8, len: u32) -> Result<usize, CodecError> {
        if flags & !(FLAG_COMPRESSED | FLAG_END_STREAM) != 0 {
            return Err(CodecError::UnknownFlags(flags));
        }
        if flags & FLAG_END_STREAM != 0 && self.kind == StreamKind::Request {
            return Err(CodecError::UnexpectedEndStream);
        }
        if flags & FLAG_COMPRESSED != 0 && self.encoding == Encoding::Identity {
            return Err(CodecError::CompressedWithoutEncoding);
        }
        let too_large = CodecError::FrameTooLarge {
            len: u64::from(len),
            max: to_u64(self.limits.max_frame_bytes),
        };
        match usize::try_from(len) {
            Ok(n) if n <= self.limits.max_frame_bytes => Ok(n),
            _ => Err(too_large),
        }
    }

    /// Declares the end of the body. Call it after `next_frame` returned `Ok(None)`. Errors if
    /// a frame was cut short, or if a response ended without its end-of-stream frame (that is a
    /// failure, not a success). A request body may simply end.
    pub fn finish(&mut self) -> Result<(), CodecError> {
        match self.state {
            DecodeState::Failed => return Err(CodecError::DecoderFailed),
            DecodeState::Ended if !self.buf.is_empty() => return Err(CodecError::FrameAfterEnd),
            _ => {}
        }
        let buffered = to_u64(self.buf.len());
        let (expected, received) = match self.header {
            Some((_, len)) => (to_u64(HEADER_LEN + len), to_u64(HEADER_LEN) + buffered),
            None => (to_u64(HEADER_LEN), buffered),
        };
        let err = if received > 0 && received < expected {
            Some(CodecError::Truncated { expected, received })
        } else if received > 0 {
            // A whole frame is still buffered: the caller did not drain `next_frame`.
            Some(CodecError::UnreadFrames)
        } else if self.kind == StreamKind::Response && self.state != DecodeState::Ended {
            Some(CodecError::MissingEndStream)
        } else {
            None
        };
        match err {
            Some(e) => {
                self.state = DecodeState::Failed;
                Err(e)
            }
            None => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::code::Code;
    use crate::connect::compression::test_support::gzip_bomb_1gib;
    use crate::connect::end_stream::{ConnectError, ErrorDetail};
    use proptest::prelude::*;
    use std::time::{Duration, Instant};

    fn response_decoder() -> FrameDecoder {
        FrameDecoder::new(StreamKind::Response, Encoding::Gzip, Limits::default())
    }

    /// Decodes `wire` delivered in `chunks` (split points), then finishes.
    fn decode_chunked(
        mut dec: FrameDecoder,
        wire: &[u8],
        cuts: &[usize],
    ) -> Result<Vec<Frame>, CodecError> {
        let mut frames = Vec::new();
        let mut start = 0;
        for &cut in cuts.iter().chain(std::iter::once(&wire.len())) {
            let cut = cut.clamp(start, wire.len());
            dec.feed(Bytes::copy_from_slice(&wire[start..cut]));
            start = cut;
            while let Some(f) = dec.next_frame()? {
                frames.push(f);
            }
        }
        dec.finish()?;
        Ok(frames)
    }

    /// Three plain messages (one empty), a gzip message and an end frame with an error.
    fn sample_stream() -> (Vec<u8>, Vec<Frame>) {
        let big = b"0123456789abcdef".repeat(200);
        let end = EndStream::from_error(
            ConnectError::new(Code::Unavailable, "later")
                .with_detail(ErrorDetail::new("x.Y", Bytes::from_static(b"\x08\x01"))),
        );
        let enc = FrameEncoder::new(Encoding::Gzip);
        let frames = [
            enc.message(b"first").expect("encodes"),
            enc.message(b"").expect("encodes"),
            enc.message(&big).expect("encodes"),
            enc.message(b"last").expect("encodes"),
            enc.end_stream(&end).expect("encodes"),
        ];
        assert_eq!(frames[2][0], FLAG_COMPRESSED, "large message is compressed");
        assert!(frames[2].len() < big.len());
        let expected = vec![
            Frame::Message(Bytes::from_static(b"first")),
            Frame::Message(Bytes::new()),
            Frame::Message(Bytes::from(big)),
            Frame::Message(Bytes::from_static(b"last")),
            Frame::End(end),
        ];
        (frames.concat(), expected)
    }

    #[test]
    fn whole_buffer_decodes() {
        let (wire, expected) = sample_stream();
        let frames = decode_chunked(response_decoder(), &wire, &[]).expect("decodes");
        assert_eq!(frames, expected);
    }

    #[test]
    fn every_split_point_gives_the_same_frames() {
        let (wire, expected) = sample_stream();
        for cut in 0..=wire.len() {
            let frames = decode_chunked(response_decoder(), &wire, &[cut]).expect("decodes");
            assert_eq!(frames, expected, "split at {cut}");
        }
    }

    #[test]
    fn one_byte_at_a_time_with_push() {
        let (wire, expected) = sample_stream();
        let mut dec = response_decoder();
        let mut frames = Vec::new();
        for b in &wire {
            dec.push(std::slice::from_ref(b));
            while let Some(f) = dec.next_frame().expect("decodes") {
                frames.push(f);
            }
        }
        dec.finish().expect("ended properly");
        assert!(dec.is_ended());
        assert_eq!(frames, expected);
    }

    #[test]
    fn oversized_length_prefix_is_refused_from_the_header() {
        let mut dec = response_decoder();
        dec.push(&[0, 0xff, 0xff, 0xff, 0xff]);
        match dec.next_frame() {
            Err(CodecError::FrameTooLarge { len, max }) => {
                assert_eq!(len, u64::from(u32::MAX));
                assert_eq!(max, 16 << 20);
            }
            other => panic!("expected FrameTooLarge, got {other:?}"),
        }
        // The decoder is failed and keeps no data.
        dec.push(&[0; 1024]);
        assert_eq!(dec.buffered_len(), 0);
        assert!(matches!(dec.next_frame(), Err(CodecError::DecoderFailed)));

        let limits = Limits {
            max_frame_bytes: 10,
            max_decompressed_bytes: 100,
        };
        let mut dec = FrameDecoder::new(StreamKind::Request, Encoding::Identity, limits);
        dec.push(&encode_frame(0, &[7; 10]).expect("encodes"));
        assert_eq!(
            dec.next_frame().ok(),
            Some(Some(Frame::Message(Bytes::from(vec![7; 10]))))
        );
        dec.push(&[0, 0, 0, 0, 11]);
        assert!(matches!(
            dec.next_frame(),
            Err(CodecError::FrameTooLarge { len: 11, max: 10 })
        ));
    }

    #[test]
    fn gzip_bomb_is_refused_without_full_inflation() {
        let bomb = gzip_bomb_1gib();
        assert!(bomb.len() < Limits::default().max_frame_bytes);
        let start = Instant::now();
        let mut dec = response_decoder();
        dec.push(&encode_frame(FLAG_COMPRESSED, bomb).expect("encodes"));
        match dec.next_frame() {
            Err(CodecError::InflationRatio { .. }) => {}
            other => panic!("expected InflationRatio, got {other:?}"),
        }
        assert!(start.elapsed() < Duration::from_secs(20));

        // With a small limit it stops almost at once.
        let limits = Limits {
            max_frame_bytes: 16 << 20,
            max_decompressed_bytes: 1 << 16,
        };
        let mut dec = FrameDecoder::new(StreamKind::Request, Encoding::Gzip, limits);
        dec.push(&encode_frame(FLAG_COMPRESSED, bomb).expect("encodes"));
        assert!(matches!(
            dec.next_frame(),
            Err(CodecError::DecompressedTooLarge { max: 65536 })
        ));
    }

    #[test]
    fn truncated_body_is_reported() {
        let (wire, _) = sample_stream();
        let r = decode_chunked(response_decoder(), &wire[..wire.len() - 1], &[]);
        match r {
            Err(CodecError::Truncated { expected, received }) => {
                assert_eq!(received + 1, expected);
            }
            other => panic!("expected Truncated, got {other:?}"),
        }
        // Cut inside a header.
        let first = encode_frame(0, b"abc").expect("encodes");
        let mut cut = first.to_vec();
        cut.extend_from_slice(&[0, 0]);
        let r = decode_chunked(response_decoder(), &cut, &[]);
        assert!(matches!(
            r,
            Err(CodecError::Truncated {
                expected: 5,
                received: 2
            })
        ));
    }

    #[test]
    fn missing_end_frame() {
        let wire = [
            encode_frame(0, b"a").expect("a"),
            encode_frame(0, b"b").expect("b"),
        ]
        .concat();
        let r = decode_chunked(response_decoder(), &wire, &[3]);
        assert!(matches!(r, Err(CodecError::MissingEndStream)));
        assert_eq!(
            r.map(|_| ()).unwrap_err().to_string(),
            "body ended without an end-of-stream frame"
        );
        assert!(matches!(
            decode_chunked(response_decoder(), &[], &[]),
            Err(CodecError::MissingEndStream)
        ));
        // Requests have no end frame: a clean end is success.
        let req = FrameDecoder::new(StreamKind::Request, Encoding::Identity, Limits::default());
        assert_eq!(decode_chunked(req, &wire, &[]).expect("ok").len(), 2);
    }

    #[test]
    fn unread_frames_at_finish() {
        let mut dec = response_decoder();
        dec.push(&encode_frame(0, b"a").expect("a"));
        assert!(matches!(dec.finish(), Err(CodecError::UnreadFrames)));
    }

    #[test]
    fn frames_after_end_are_an_error() {
        let enc = FrameEncoder::new(Encoding::Identity);
        let end = enc.end_stream(&EndStream::ok()).expect("end");
        let wire = [end.clone(), enc.message(b"late").expect("late")].concat();
        let mut dec = response_decoder();
        dec.push(&wire);
        assert_eq!(
            dec.next_frame().ok(),
            Some(Some(Frame::End(EndStream::ok())))
        );
        assert!(matches!(dec.next_frame(), Err(CodecError::FrameAfterEnd)));
        // One stray byte is enough, even if it only shows up at finish().
        let mut dec = response_decoder();
        dec.push(&end);
        assert!(matches!(dec.next_frame(), Ok(Some(Frame::End(_)))));
        dec.push(&[0]);
        assert!(matches!(dec.finish(), Err(CodecError::FrameAfterEnd)));
    }

    #[test]
    fn protocol_violations_in_headers() {
        let mut dec = FrameDecoder::new(StreamKind::Request, Encoding::Identity, Limits::default());
        dec.push(&encode_frame(FLAG_END_STREAM, b"{}").expect("end"));
        assert!(matches!(
            dec.next_frame(),
            Err(CodecError::UnexpectedEndStream)
        ));

        let mut dec =
            FrameDecoder::new(StreamKind::Response, Encoding::Identity, Limits::default());
        dec.push(&encode_frame(FLAG_COMPRESSED, b"").expect("c"));
        assert!(matches!(
            dec.next_frame(),
            Err(CodecError::CompressedWithoutEncoding)
        ));

        let mut dec = response_decoder();
        dec.push(&encode_frame(0x80, b"").expect("x"));
        assert!(matches!(
            dec.next_frame(),
            Err(CodecError::UnknownFlags(0x80))
        ));

        let mut dec = response_decoder();
        dec.push(&encode_frame(FLAG_COMPRESSED, b"not gzip").expect("x"));
        assert!(matches!(dec.next_frame(), Err(CodecError::BadGzip(_))));

        let mut dec = response_decoder();
        dec.push(&encode_frame(FLAG_END_STREAM, b"{oops").expect("x"));
        assert!(matches!(
            dec.next_frame(),
            Err(CodecError::BadEndStreamJson(_))
        ));
    }

    #[test]
    fn compressed_end_frame_is_accepted() {
        let json = EndStream::from_error(ConnectError::new(Code::Internal, "boom")).to_json();
        let z = gzip_into(Vec::new(), &json).expect("gzip");
        let mut dec = response_decoder();
        dec.push(&encode_frame(FLAG_COMPRESSED | FLAG_END_STREAM, &z).expect("x"));
        match dec.next_frame() {
            Ok(Some(Frame::End(end))) => {
                assert_eq!(end.error.map(|e| e.code), Some(Code::Internal))
            }
            other => panic!("expected end frame, got {other:?}"),
        }
        dec.finish().expect("ended");
    }

    #[test]
    fn encoder_threshold_and_identity() {
        let payload = vec![b'a'; 2000];
        let id = FrameEncoder::new(Encoding::Identity)
            .message(&payload)
            .expect("x");
        assert_eq!(id[0], 0);
        assert_eq!(&id[1..5], &2000u32.to_be_bytes());
        let small = FrameEncoder::new(Encoding::Gzip)
            .message(b"tiny")
            .expect("x");
        assert_eq!(small[0], 0);
        let always = FrameEncoder::new(Encoding::Gzip)
            .with_compress_min_bytes(0)
            .message(b"tiny")
            .expect("x");
        assert_eq!(always[0], FLAG_COMPRESSED);
    }

    fn arb_frame() -> impl Strategy<Value = (bool, Vec<u8>)> {
        (
            any::<bool>(),
            proptest::collection::vec(any::<u8>(), 0..300),
        )
    }

    proptest! {
        #[test]
        fn random_frames_random_splits(
            frames in proptest::collection::vec(arb_frame(), 0..8),
            end_message in ".{0,40}",
            cuts in proptest::collection::vec(any::<usize>(), 0..12),
        ) {
            let mut wire = Vec::new();
            let mut expected = Vec::new();
            for (compress, payload) in &frames {
                let enc = FrameEncoder::new(Encoding::Gzip)
                    .with_compress_min_bytes(if *compress { 0 } else { usize::MAX });
                wire.extend_from_slice(&enc.message(payload).expect("encodes"));
                expected.push(Frame::Message(Bytes::from(payload.clone())));
            }
            let end = EndStream::from_error(ConnectError::new(Code::Aborted, end_message));
            wire.extend_from_slice(&FrameEncoder::new(Encoding::Gzip).end_stream(&end).expect("end"));
            expected.push(Frame::End(end));

            let mut cuts: Vec<usize> = cuts.into_iter().map(|c| c % (wire.len() + 1)).collect();
            cuts.sort_unstable();
            let got = decode_chunked(response_decoder(), &wire, &cuts).expect("decodes");
            prop_assert_eq!(got, expected);
        }

        #[test]
        fn garbage_never_panics(
            data in proptest::collection::vec(any::<u8>(), 0..2000),
            cuts in proptest::collection::vec(any::<usize>(), 0..8),
            small in any::<bool>(),
        ) {
            let limits = if small {
                Limits { max_frame_bytes: 64, max_decompressed_bytes: 128 }
            } else {
                Limits::default()
            };
            for kind in [StreamKind::Request, StreamKind::Response] {
                let dec = FrameDecoder::new(kind, Encoding::Gzip, limits);
                let mut cuts: Vec<usize> = cuts.iter().map(|c| c % (data.len() + 1)).collect();
                cuts.sort_unstable();
                let _ = decode_chunked(dec, &data, &cuts);
            }
        }

        #[test]
        fn garbage_behind_valid_headers_never_panics(
            flags in 0u8..4,
            body in proptest::collection::vec(any::<u8>(), 0..500),
        ) {
            let wire = encode_frame(flags, &body).expect("encodes");
            let mut dec = response_decoder();
            dec.push(&wire);
            let _ = dec.next_frame();
            let _ = dec.finish();
        }
    }
}
