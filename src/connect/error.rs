//! The one error type of the codec. Every variant names what was wrong with the bytes; `code()`
//! tells higher layers which Connect code to end a stream or answer a unary call with.

use super::code::{Code, UnknownCode};

/// Everything that can go wrong while encoding or decoding Connect bodies.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum CodecError {
    /// A frame's length prefix (or a unary body) is over the configured limit. Reported from the
    /// 5-byte header, before any of the payload is buffered.
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: u64, max: u64 },

    /// Inflating a gzip payload produced more than the limit; inflation stopped at the limit.
    #[error("decompressed message exceeds the limit of {max} bytes")]
    DecompressedTooLarge { max: u64 },

    /// A gzip payload inflating more than `ratio` times its input past a floor: a compression
    /// bomb, refused while inflating instead of after filling the size limit.
    #[error("gzip payload inflates more than {ratio}x its size (a compression bomb)")]
    InflationRatio { ratio: u64 },

    #[error("invalid gzip data: {0}")]
    BadGzip(#[source] std::io::Error),

    /// Compressing our own output failed (cannot happen with an in-memory buffer, kept typed
    /// rather than unwrapped).
    #[error("gzip compression failed: {0}")]
    Compress(#[source] std::io::Error),

    #[error("unsupported content encoding {0:?} (supported: identity, gzip)")]
    UnsupportedEncoding(String),

    /// Flag 0x01 on a stream whose `connect-content-encoding` is identity.
    #[error("compressed frame on a stream that negotiated no compression")]
    CompressedWithoutEncoding,

    #[error("unknown frame flags 0x{0:02x}")]
    UnknownFlags(u8),

    /// The body ended in the middle of a frame. `expected` counts the 5-byte header plus the
    /// payload length (or just the header when it was itself cut).
    #[error("truncated frame: body ended after {received} of {expected} bytes")]
    Truncated { expected: u64, received: u64 },

    #[error("body ended without an end-of-stream frame")]
    MissingEndStream,

    /// Connect requests carry no end-of-stream frame; only responses do.
    /// `finish()` was called while a whole frame was still buffered: the caller did not drain
    /// `next_frame()` first (a bug in the caller, not in the peer's bytes).
    #[error("finish() called with unread frames (drain next_frame() first)")]
    UnreadFrames,

    #[error("end-of-stream frame in a request stream")]
    UnexpectedEndStream,

    #[error("frame received after the end-of-stream frame")]
    FrameAfterEnd,

    /// The decoder already returned an error; its position in the stream is lost.
    #[error("frame decoder used after an earlier error")]
    DecoderFailed,

    #[error("invalid end-of-stream JSON: {0}")]
    BadEndStreamJson(#[source] serde_json::Error),

    #[error("invalid unary error JSON: {0}")]
    BadUnaryErrorJson(#[source] serde_json::Error),

    #[error("invalid base64 in error detail {type_name:?}: {source}")]
    BadBase64 {
        type_name: String,
        #[source]
        source: base64::DecodeError,
    },

    #[error(transparent)]
    UnknownCode(#[from] UnknownCode),

    /// `pos` is the index in the hex string (all characters before it are valid ASCII hex, so
    /// byte and character positions agree).
    #[error("invalid hex at position {pos}: {problem}")]
    BadHex { pos: usize, problem: HexProblem },

    #[error("malformed {message_type} protobuf: {source}")]
    BadProtobuf {
        message_type: &'static str,
        #[source]
        source: prost::DecodeError,
    },
}

/// What is wrong at [`CodecError::BadHex`]'s position.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HexProblem {
    /// A character that is not `0-9a-fA-F`.
    InvalidChar(char),
    /// The string has an odd number of digits; the position is the string's length.
    OddLength,
}

impl std::fmt::Display for HexProblem {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HexProblem::InvalidChar(c) => write!(f, "{c:?} is not a hex digit"),
            HexProblem::OddLength => {
                f.write_str("odd number of digits, the last byte is incomplete")
            }
        }
    }
}

impl CodecError {
    /// The Connect code to report this error with. Malformed input is `invalid_argument` (as
    /// connect-go does), size limits are `resource_exhausted`, an unknown codec is
    /// `unimplemented` (Connect's rule), and bad error envelopes or a stream cut before its end
    /// frame (only seen from a server) are `internal`.
    pub fn code(&self) -> Code {
        match self {
            CodecError::FrameTooLarge { .. }
            | CodecError::DecompressedTooLarge { .. }
            | CodecError::InflationRatio { .. } => Code::ResourceExhausted,
            CodecError::UnsupportedEncoding(_) => Code::Unimplemented,
            CodecError::BadGzip(_)
            | CodecError::CompressedWithoutEncoding
            | CodecError::UnknownFlags(_)
            | CodecError::Truncated { .. }
            | CodecError::UnexpectedEndStream
            | CodecError::FrameAfterEnd
            | CodecError::BadHex { .. }
            | CodecError::BadProtobuf { .. } => Code::InvalidArgument,
            CodecError::Compress(_)
            | CodecError::MissingEndStream
            | CodecError::DecoderFailed
            | CodecError::UnreadFrames
            | CodecError::BadEndStreamJson(_)
            | CodecError::BadUnaryErrorJson(_)
            | CodecError::BadBase64 { .. } => Code::Internal,
            CodecError::UnknownCode(_) => Code::Unknown,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_follow_the_kind_of_failure() {
        assert_eq!(
            CodecError::FrameTooLarge { len: 9, max: 1 }.code(),
            Code::ResourceExhausted
        );
        assert_eq!(
            CodecError::DecompressedTooLarge { max: 1 }.code(),
            Code::ResourceExhausted
        );
        assert_eq!(
            CodecError::UnsupportedEncoding("br".into()).code(),
            Code::Unimplemented
        );
        assert_eq!(
            CodecError::BadHex {
                pos: 3,
                problem: HexProblem::OddLength
            }
            .code(),
            Code::InvalidArgument
        );
        assert_eq!(CodecError::MissingEndStream.code(), Code::Internal);
    }

    #[test]
    fn messages_say_what_is_wrong() {
        let e = CodecError::BadHex {
            pos: 4,
            problem: HexProblem::InvalidChar('z'),
        };
        assert_eq!(
            e.to_string(),
            "invalid hex at position 4: 'z' is not a hex digit"
        );
        let e = CodecError::Truncated {
            expected: 10,
            received: 7,
        };
        assert_eq!(
            e.to_string(),
            "truncated frame: body ended after 7 of 10 bytes"
        );
        assert_eq!(
            CodecError::MissingEndStream.to_string(),
            "body ended without an end-of-stream frame"
        );
    }
}
