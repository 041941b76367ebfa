//! `aiserver.v1.BidiAppendRequest` ↔ `agent.v1.AgentClientMessage`: in the HTTP/1.1 fallback
//! each client message arrives as one unary BidiAppend whose `data` is the lowercase hex of the
//! message (or `data_binary` its raw bytes).

use bytes::Bytes;
use prost::Message as _;

use super::error::{CodecError, HexProblem};
use crate::proto::agent::v1::AgentClientMessage;
use crate::proto::aiserver::v1::{BidiAppendRequest, BidiRequestId};

const AGENT_CLIENT_MESSAGE: &str = "agent.v1.AgentClientMessage";
const BIDI_APPEND_REQUEST: &str = "aiserver.v1.BidiAppendRequest";

/// Decodes a BidiAppend unary body (already through [`decode_unary`](super::decode_unary)).
pub fn decode_bidi_append_request(body: &[u8]) -> Result<BidiAppendRequest, CodecError> {
    BidiAppendRequest::decode(body).map_err(|source| CodecError::BadProtobuf {
        message_type: BIDI_APPEND_REQUEST,
        source,
    })
}

/// The raw `AgentClientMessage` bytes an append carries: `data_binary` when non-empty (binary
/// mode), else the hex `data`. Useful to replay the exact bytes upstream.
pub fn bidi_append_payload(req: &BidiAppendRequest) -> Result<Bytes, CodecError> {
    if !req.data_binary.is_empty() {
        return Ok(req.data_binary.clone());
    }
    decode_hex(&req.data).map(Bytes::from)
}

/// Decodes the `AgentClientMessage` an append carries. An append with no payload decodes as
/// an empty message (`message: None`); the caller decides what that means.
pub fn decode_agent_client_message(
    req: &BidiAppendRequest,
) -> Result<AgentClientMessage, CodecError> {
    let payload = bidi_append_payload(req)?;
    AgentClientMessage::decode(payload).map_err(|source| CodecError::BadProtobuf {
        message_type: AGENT_CLIENT_MESSAGE,
        source,
    })
}

/// Wraps `msg` in an append the way Cursor's client does: lowercase hex in `data`.
pub fn encode_bidi_append(
    msg: &AgentClientMessage,
    request_id: &str,
    append_seqno: i64,
) -> BidiAppendRequest {
    BidiAppendRequest {
        data: hex::encode(msg.encode_to_vec()),
        request_id: Some(BidiRequestId {
            request_id: request_id.to_owned(),
        }),
        append_seqno,
        data_binary: Bytes::new(),
    }
}

/// Decodes hex of either case. Errors name the first bad position: an invalid character, or
/// the string's length when the digit count is odd.
pub fn decode_hex(s: &str) -> Result<Vec<u8>, CodecError> {
    let bytes = s.as_bytes();
    let even = bytes.len() - bytes.len() % 2;
    // The `hex` crate checks the length first; a bad character is the more specific problem,
    // so the even part is decoded before the odd length is reported.
    let out = hex::decode(&bytes[..even]).map_err(|e| match e {
        hex::FromHexError::InvalidHexCharacter { index, .. } => invalid_char(s, index),
        // Unreachable for an even slice; reported as the position where decoding stopped.
        hex::FromHexError::OddLength | hex::FromHexError::InvalidStringLength => {
            CodecError::BadHex {
                pos: even,
                problem: HexProblem::OddLength,
            }
        }
    })?;
    if even < bytes.len() {
        // Everything before is ASCII hex, so the last byte starts a character.
        if !bytes[even].is_ascii_hexdigit() {
            return Err(invalid_char(s, even));
        }
        return Err(CodecError::BadHex {
            pos: bytes.len(),
            problem: HexProblem::OddLength,
        });
    }
    Ok(out)
}

/// The error for the character starting at byte `pos` (a char boundary: everything before it
/// is ASCII hex; the fallback only guards against misuse).
fn invalid_char(s: &str, pos: usize) -> CodecError {
    let c = s
        .get(pos..)
        .and_then(|rest| rest.chars().next())
        .unwrap_or('\u{fffd}');
    CodecError::BadHex {
        pos,
        problem: HexProblem::InvalidChar(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::agent::v1::agent_client_message::Message;
    use crate::proto::agent::v1::AgentRunRequest;

    fn sample() -> AgentClientMessage {
        AgentClientMessage {
            message: Some(Message::RunRequest(AgentRunRequest {
                conversation_id: Some("conv-1".into()),
                ..Default::default()
            })),
        }
    }

    #[test]
    fn hex_either_case() {
        assert_eq!(
            decode_hex("00ff7fAbCd").ok(),
            Some(vec![0x00, 0xff, 0x7f, 0xab, 0xcd])
        );
        assert_eq!(decode_hex("").ok(), Some(vec![]));
    }

    #[test]
    fn bad_hex_names_the_position() {
        let e = |s| match decode_hex(s) {
            Err(CodecError::BadHex { pos, problem }) => (pos, problem),
            other => panic!("expected BadHex for {s:?}, got {other:?}"),
        };
        assert_eq!(e("0g"), (1, HexProblem::InvalidChar('g')));
        assert_eq!(e("abc"), (3, HexProblem::OddLength));
        assert_eq!(e("ab c"), (2, HexProblem::InvalidChar(' ')));
        assert_eq!(e("abé0"), (2, HexProblem::InvalidChar('é')));
        assert_eq!(e("abz"), (2, HexProblem::InvalidChar('z')));
        assert_eq!(e("ab\u{1F600}"), (2, HexProblem::InvalidChar('\u{1F600}')));
    }

    #[test]
    fn append_round_trip_hex_and_binary() {
        let msg = sample();
        let req = encode_bidi_append(&msg, "req-1", 3);
        assert_eq!(req.data, req.data.to_lowercase());
        assert_eq!(req.append_seqno, 3);
        let body = req.encode_to_vec();
        let back = decode_bidi_append_request(&body).expect("request decodes");
        assert_eq!(
            decode_agent_client_message(&back).expect("message decodes"),
            msg
        );

        // Uppercase hex is accepted too.
        let upper = BidiAppendRequest {
            data: req.data.to_uppercase(),
            ..req.clone()
        };
        assert_eq!(decode_agent_client_message(&upper).expect("upper"), msg);

        // data_binary wins when present, even next to stale hex.
        let binary = BidiAppendRequest {
            data: "zz".into(),
            data_binary: Bytes::from(msg.encode_to_vec()),
            ..req
        };
        assert_eq!(decode_agent_client_message(&binary).expect("binary"), msg);
    }

    #[test]
    fn bad_protobuf_is_reported_with_its_type() {
        // Field 1, length-delimited, claims 5 bytes but has none.
        let req = BidiAppendRequest {
            data: "0a05".into(),
            ..Default::default()
        };
        let err = decode_agent_client_message(&req).expect_err("truncated protobuf");
        assert!(matches!(
            err,
            CodecError::BadProtobuf {
                message_type: AGENT_CLIENT_MESSAGE,
                ..
            }
        ));
        assert!(err
            .to_string()
            .starts_with("malformed agent.v1.AgentClientMessage protobuf"));
        assert!(matches!(
            decode_bidi_append_request(&[0xff]),
            Err(CodecError::BadProtobuf {
                message_type: BIDI_APPEND_REQUEST,
                ..
            })
        ));
        let bad_hex = BidiAppendRequest {
            data: "0x".into(),
            ..Default::default()
        };
        assert!(matches!(
            decode_agent_client_message(&bad_hex),
            Err(CodecError::BadHex { pos: 1, .. })
        ));
    }

    #[test]
    fn empty_append_is_an_empty_message() {
        let req = BidiAppendRequest::default();
        assert_eq!(
            decode_agent_client_message(&req).expect("empty"),
            AgentClientMessage::default()
        );
    }
}
