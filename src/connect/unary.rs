//! Unary bodies: raw protobuf, the whole body optionally gzip (`content-encoding: gzip`).

use bytes::Bytes;

use super::compression::{gunzip_bounded, gzip_into, Encoding};
use super::envelope::Limits;
use super::error::CodecError;

/// Returns the message bytes of a unary body sent with `content_encoding`. The wire size is
/// checked against `max_frame_bytes` and inflation stops at `max_decompressed_bytes`. An
/// identity body is returned as is (no copy).
pub fn decode_unary(
    body: Bytes,
    content_encoding: Option<&str>,
    limits: Limits,
) -> Result<Bytes, CodecError> {
    let encoding = Encoding::from_header(content_encoding)?;
    let max_wire = match encoding {
        Encoding::Identity => limits.max_frame_bytes.min(limits.max_decompressed_bytes),
        Encoding::Gzip => limits.max_frame_bytes,
    };
    if body.len() > max_wire {
        return Err(CodecError::FrameTooLarge {
            len: u64::try_from(body.len()).unwrap_or(u64::MAX),
            max: u64::try_from(max_wire).unwrap_or(u64::MAX),
        });
    }
    match encoding {
        Encoding::Identity => Ok(body),
        Encoding::Gzip => gunzip_bounded(&body, limits.max_decompressed_bytes),
    }
}

/// The body to send for `message` with `encoding`; put `encoding.as_str()` in
/// `content-encoding` when it is gzip.
pub fn encode_unary(message: Bytes, encoding: Encoding) -> Result<Bytes, CodecError> {
    match encoding {
        Encoding::Identity => Ok(message),
        Encoding::Gzip => gzip_into(Vec::new(), &message).map(Bytes::from),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::connect::compression::test_support::gzip_bomb_1gib;
    use std::time::{Duration, Instant};

    #[test]
    fn identity_and_gzip_round_trip() {
        let msg = Bytes::from_static(b"\x0a\x03abc");
        for enc in [Encoding::Identity, Encoding::Gzip] {
            let body = encode_unary(msg.clone(), enc).expect("encodes");
            let header = (enc == Encoding::Gzip).then_some(enc.as_str());
            assert_eq!(
                decode_unary(body, header, Limits::default()).expect("decodes"),
                msg
            );
        }
        assert_eq!(
            decode_unary(Bytes::new(), Some("gzip"), Limits::default()).expect("empty"),
            Bytes::new()
        );
    }

    #[test]
    fn unknown_encoding_and_bad_gzip() {
        let r = decode_unary(Bytes::from_static(b"x"), Some("zstd"), Limits::default());
        assert!(matches!(r, Err(CodecError::UnsupportedEncoding(e)) if e == "zstd"));
        let r = decode_unary(Bytes::from_static(b"x"), Some("gzip"), Limits::default());
        assert!(matches!(r, Err(CodecError::BadGzip(_))));
    }

    #[test]
    fn size_limits() {
        let limits = Limits {
            max_frame_bytes: 4,
            max_decompressed_bytes: 8,
        };
        let r = decode_unary(Bytes::from_static(b"12345"), None, limits);
        assert!(matches!(
            r,
            Err(CodecError::FrameTooLarge { len: 5, max: 4 })
        ));

        let start = Instant::now();
        let r = decode_unary(
            Bytes::from_static(gzip_bomb_1gib()),
            Some("gzip"),
            Limits::default(),
        );
        assert!(matches!(r, Err(CodecError::InflationRatio { .. })));
        // Inflating the whole GiB would take far longer than stopping at the ratio bound.
        assert!(start.elapsed() < Duration::from_secs(20));
    }
}
