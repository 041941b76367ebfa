//! The agent WebSocket's frames (`/agent/v1/run`): one protobuf message per binary WebSocket
//! message, no Connect envelope. Layout from `../shared/protocol/agent-ws.md` §4-5 (two
//! peers' decodings of real traffic; Cursor's `.proto` is not public):
//! - client: oneof 1 Hello{protocol_version 1}, 2 RunStart{identity 1, headers 2},
//!   3 ClientMessage{run_id 1, sequence 2, message 3 = an `AgentClientMessage`},
//!   4 HalfClose{run_id 1}, 5 CancelRun{run_id 1};
//! - server: 1 Hello, 2 RunAccepted{identity 1}, 3 ServerMessage{run_id 1, sequence 2,
//!   message 3 = an `AgentServerMessage`}, 4 RunEnd{identity 1, trailers 2, error 3},
//!   5 RunRejected{identity 1, error 2}; identity = {run_id 1, request_id 2}, error =
//!   {code 1 (gRPC number), raw_message 2}.
//!
//! Pure: bytes in, values out, and back. Server frames are read too, for the frames Cursor's
//! server sends on the upstream side of Cursor's own runs (`ws_relay`).

use bytes::Bytes;
use prost::encoding::{encode_key, encode_varint, string, uint64, WireType as PW};

use crate::connect::Code;
use crate::proto::wire::{self, WireError, WireType};

/// Who a run is, as the client named it in `RunStart`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Identity {
    pub run_id: String,
    pub request_id: String,
}

/// One client frame.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum ClientFrame {
    Hello,
    RunStart(Identity),
    Message {
        run_id: String,
        sequence: u64,
        message: Bytes,
    },
    HalfClose(String),
    CancelRun(String),
}

/// Why a client frame could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    #[error("it does not scan as protobuf: {0}")]
    Wire(#[from] WireError),
    #[error("it sets none of the frame types this build knows (1-5)")]
    Unknown,
    #[error("a string in it is not UTF-8")]
    NotUtf8,
}

fn last_len(buf: &[u8], number: u32) -> Result<Option<&[u8]>, FrameError> {
    let mut found = None;
    for field in wire::fields(buf) {
        let field = field?;
        if field.number == number && field.wire_type == WireType::Len {
            found = Some(field.value);
        }
    }
    Ok(found)
}

fn text(buf: &[u8], number: u32) -> Result<String, FrameError> {
    match last_len(buf, number)? {
        None => Ok(String::new()),
        Some(v) => String::from_utf8(v.to_vec()).map_err(|_| FrameError::NotUtf8),
    }
}

fn varint(buf: &[u8], number: u32) -> Result<u64, FrameError> {
    let mut value = 0;
    for field in wire::fields(buf) {
        let field = field?;
        if field.number == number {
            value = field.as_u64().unwrap_or(0);
        }
    }
    Ok(value)
}

fn identity(buf: &[u8]) -> Result<Identity, FrameError> {
    Ok(Identity {
        run_id: text(buf, 1)?,
        request_id: text(buf, 2)?,
    })
}

/// A frame's type (1-5) and body: the last frame-type field set wins, as for a protobuf oneof.
fn frame_kind(buf: &[u8]) -> Result<(u32, &[u8]), FrameError> {
    let mut kind = None;
    for field in wire::fields(buf) {
        let field = field?;
        if (1..=5).contains(&field.number) && field.wire_type == WireType::Len {
            kind = Some((field.number, field.value));
        }
    }
    let (number, value) = kind.ok_or(FrameError::Unknown)?;
    wire::validate(value)?;
    Ok((number, value))
}

/// Reads one client frame.
pub(crate) fn decode_client(buf: &[u8]) -> Result<ClientFrame, FrameError> {
    let (number, value) = frame_kind(buf)?;
    Ok(match number {
        1 => ClientFrame::Hello,
        2 => ClientFrame::RunStart(identity(last_len(value, 1)?.unwrap_or_default())?),
        3 => ClientFrame::Message {
            run_id: text(value, 1)?,
            sequence: varint(value, 2)?,
            message: Bytes::copy_from_slice(last_len(value, 3)?.unwrap_or_default()),
        },
        4 => ClientFrame::HalfClose(text(value, 1)?),
        _ => ClientFrame::CancelRun(text(value, 1)?),
    })
}

/// What a server frame is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ServerKind {
    Hello,
    RunAccepted,
    ServerMessage,
    RunEnd,
    RunRejected,
}

/// A server frame's type and the run it is for (empty for `Hello`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct ServerFrame {
    pub kind: ServerKind,
    pub run_id: String,
}

/// Reads what a server frame is and which run it names (its body stays as it came).
pub(crate) fn decode_server(buf: &[u8]) -> Result<ServerFrame, FrameError> {
    let (number, value) = frame_kind(buf)?;
    let of_identity = || -> Result<String, FrameError> {
        Ok(identity(last_len(value, 1)?.unwrap_or_default())?.run_id)
    };
    let (kind, run_id) = match number {
        1 => (ServerKind::Hello, String::new()),
        2 => (ServerKind::RunAccepted, of_identity()?),
        3 => (ServerKind::ServerMessage, text(value, 1)?),
        4 => (ServerKind::RunEnd, of_identity()?),
        _ => (ServerKind::RunRejected, of_identity()?),
    };
    Ok(ServerFrame { kind, run_id })
}

fn len_field(number: u32, value: &[u8], out: &mut Vec<u8>) {
    encode_key(number, PW::LengthDelimited, out);
    encode_varint(value.len() as u64, out);
    out.extend_from_slice(value);
}

fn encode_identity(id: &Identity) -> Vec<u8> {
    let mut out = Vec::new();
    string::encode(1, &id.run_id, &mut out);
    string::encode(2, &id.request_id, &mut out);
    out
}

fn encode_error(code: Code, message: &str) -> Vec<u8> {
    let number = Code::ALL
        .iter()
        .position(|c| *c == code)
        .map_or(2, |i| i + 1) as u64;
    let mut out = Vec::new();
    uint64::encode(1, &number, &mut out);
    string::encode(2, &message.to_owned(), &mut out);
    out
}

fn server_frame(number: u32, body: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + 6);
    len_field(number, body, &mut out);
    out
}

/// `Hello{protocol_version: 1}`.
pub(crate) fn server_hello() -> Vec<u8> {
    let mut hello = Vec::new();
    uint64::encode(1, &1, &mut hello);
    server_frame(1, &hello)
}

pub fn run_accepted(id: &Identity) -> Vec<u8> {
    let mut body = Vec::new();
    len_field(1, &encode_identity(id), &mut body);
    server_frame(2, &body)
}

/// A `ServerMessage` carrying an encoded `AgentServerMessage`.
pub fn server_message(run_id: &str, sequence: u64, message: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(message.len() + run_id.len() + 16);
    string::encode(1, &run_id.to_owned(), &mut body);
    uint64::encode(2, &sequence, &mut body);
    len_field(3, message, &mut body);
    server_frame(3, &body)
}

/// `RunEnd`, with `error` when the run failed.
pub fn run_end(id: &Identity, error: Option<(Code, &str)>) -> Vec<u8> {
    let mut body = Vec::new();
    len_field(1, &encode_identity(id), &mut body);
    if let Some((code, message)) = error {
        len_field(3, &encode_error(code, message), &mut body);
    }
    server_frame(4, &body)
}

/// `RunRejected`: the run is refused before it starts.
pub(crate) fn run_rejected(id: &Identity, code: Code, message: &str) -> Vec<u8> {
    let mut body = Vec::new();
    len_field(1, &encode_identity(id), &mut body);
    len_field(2, &encode_error(code, message), &mut body);
    server_frame(5, &body)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn client(number: u32, body: &[u8]) -> Vec<u8> {
        server_frame(number, body)
    }

    #[test]
    fn client_frames_decode() {
        let id = Identity {
            run_id: "r1".into(),
            request_id: "q1".into(),
        };
        assert_eq!(
            decode_client(&client(1, b"\x08\x01")).unwrap(),
            ClientFrame::Hello
        );
        let mut start = Vec::new();
        len_field(1, &encode_identity(&id), &mut start);
        assert_eq!(
            decode_client(&client(2, &start)).unwrap(),
            ClientFrame::RunStart(id.clone())
        );
        let message = server_message("r1", 7, b"\x0a\x00");
        // A server message has the client message's layout.
        assert_eq!(
            decode_client(&message).unwrap(),
            ClientFrame::Message {
                run_id: "r1".into(),
                sequence: 7,
                message: Bytes::from_static(b"\x0a\x00"),
            }
        );
        let mut run = Vec::new();
        string::encode(1, &"r1".to_owned(), &mut run);
        assert_eq!(
            decode_client(&client(4, &run)).unwrap(),
            ClientFrame::HalfClose("r1".into())
        );
        assert_eq!(
            decode_client(&client(5, &run)).unwrap(),
            ClientFrame::CancelRun("r1".into())
        );
        assert!(matches!(
            decode_client(&client(9, b"")),
            Err(FrameError::Unknown)
        ));
        assert!(matches!(
            decode_client(b"\x1a\x05ab"),
            Err(FrameError::Wire(_))
        ));
    }

    #[test]
    fn server_frames_decode_to_their_run() {
        let id = Identity {
            run_id: "r9".into(),
            request_id: "q9".into(),
        };
        let of = |bytes: &[u8]| decode_server(bytes).unwrap();
        assert_eq!(of(&server_hello()).kind, ServerKind::Hello);
        let cases = [
            (run_accepted(&id), ServerKind::RunAccepted),
            (
                server_message("r9", 3, b"\x0a\x00"),
                ServerKind::ServerMessage,
            ),
            (run_end(&id, None), ServerKind::RunEnd),
            (
                run_rejected(&id, Code::Unavailable, "x"),
                ServerKind::RunRejected,
            ),
        ];
        for (bytes, kind) in cases {
            assert_eq!(
                of(&bytes),
                ServerFrame {
                    kind,
                    run_id: "r9".into()
                }
            );
        }
        assert!(decode_server(b"\x1a\x05ab").is_err());
        assert!(matches!(decode_server(b""), Err(FrameError::Unknown)));
    }

    #[test]
    fn server_frames_match_the_peers_bytes() {
        // S2 (agent-ws.md §5) sends its Hello as exactly these bytes.
        assert_eq!(server_hello(), b"\x0a\x02\x08\x01");
        let id = Identity {
            run_id: "r".into(),
            request_id: "r".into(),
        };
        let end = run_end(&id, Some((Code::Unavailable, "x")));
        // RunEnd(4){identity(1){r, r}, error(3){code 14, "x"}}.
        assert_eq!(
            end,
            b"\x22\x0f\x0a\x06\x0a\x01r\x12\x01r\x1a\x05\x08\x0e\x12\x01x"
        );
        let rejected = run_rejected(&id, Code::FailedPrecondition, "no");
        assert_eq!(rejected[0], 0x2a);
        assert!(rejected.ends_with(b"\x08\x09\x12\x02no"));
    }
}
