//! Connect protocol codec (sans-IO): streaming envelopes, end-of-stream and unary error JSON,
//! error codes, unary bodies and the BidiAppend ↔ `AgentClientMessage` mapping.
//!
//! Nothing here does IO: the HTTP layer feeds bytes in and writes the bytes it gets back, so
//! every edge case (chunking, truncation, bombs) is unit-testable.

mod bidi;
mod code;
mod compression;
mod end_stream;
mod envelope;
mod error;
mod unary;

pub use bidi::{
    bidi_append_payload, decode_agent_client_message, decode_bidi_append_request, decode_hex,
    encode_bidi_append,
};
pub use code::{Code, UnknownCode};
pub use compression::Encoding;
pub use end_stream::{ConnectError, EndStream, ErrorDetail, Metadata};
pub use envelope::{
    encode_frame, Frame, FrameDecoder, FrameEncoder, Limits, StreamKind, FLAG_COMPRESSED,
    FLAG_END_STREAM,
};
pub use error::{CodecError, HexProblem};
pub use unary::{decode_unary, encode_unary};
