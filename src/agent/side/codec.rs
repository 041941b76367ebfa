//! The side calls' bodies: Connect unary with the proto or the JSON codec, read into the few
//! fields the decision needs, and answers in the codec the request came in.

use bytes::Bytes;
use http::header::{self, HeaderMap};
use prost::Message;
use serde_json::{json, Value};

use crate::proto::agent::v1 as pb;

/// The Connect unary codec of a request, from its `content-type`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Codec {
    Proto,
    Json,
}

impl Codec {
    pub(super) fn of(headers: &HeaderMap) -> Option<Codec> {
        let media = headers
            .get(header::CONTENT_TYPE)?
            .to_str()
            .ok()?
            .split(';')
            .next()?
            .trim()
            .to_ascii_lowercase();
        match media.as_str() {
            "application/proto" | "application/protobuf" => Some(Codec::Proto),
            "application/json" => Some(Codec::Json),
            _ => None,
        }
    }

    pub(super) fn content_type(self) -> &'static str {
        match self {
            Codec::Proto => "application/proto",
            Codec::Json => "application/json",
        }
    }
}

/// Which request message a side call carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum RequestKind {
    NameAgent,
    TranscriptOverview,
    ConversationMetadata,
    ConversationClone,
    ConversationBlobs,
    PromptQuality,
    /// A message this build has no schema for: only its top-level strings are read.
    Opaque,
}

/// What the decision reads from a side call.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(super) struct Ask {
    /// The text a title or an overview is made from.
    pub text: String,
    /// The conversation the call is about.
    pub conversation: String,
    /// A clone's source conversation.
    pub source: String,
    /// Every top-level string of an opaque message.
    pub strings: Vec<String>,
}

#[derive(Debug, thiserror::Error)]
pub(super) enum AskError {
    #[error("not a valid {message}: {source}")]
    Proto {
        message: &'static str,
        #[source]
        source: prost::DecodeError,
    },
    #[error("not a JSON object: {0}")]
    Json(#[source] serde_json::Error),
    #[error("does not scan as protobuf: {0}")]
    Wire(#[source] crate::proto::wire::WireError),
}

/// Read `message` (the unary body, decompressed) as `shape` in `codec`.
pub(super) fn read(shape: RequestKind, codec: Codec, message: &[u8]) -> Result<Ask, AskError> {
    match codec {
        Codec::Proto => read_proto(shape, message),
        Codec::Json => read_json(shape, message),
    }
}

fn proto<M: Message + Default>(message: &'static str, bytes: &[u8]) -> Result<M, AskError> {
    M::decode(bytes).map_err(|source| AskError::Proto { message, source })
}

fn read_proto(shape: RequestKind, b: &[u8]) -> Result<Ask, AskError> {
    let ask = match shape {
        RequestKind::NameAgent => Ask {
            text: proto::<pb::NameAgentRequest>("NameAgentRequest", b)?.user_message,
            ..Ask::default()
        },
        RequestKind::TranscriptOverview => Ask {
            text: proto::<pb::CreateTranscriptOverviewRequest>(
                "CreateTranscriptOverviewRequest",
                b,
            )?
            .formatted_conversation,
            ..Ask::default()
        },
        RequestKind::ConversationMetadata => Ask {
            conversation: proto::<pb::UpdateConversationMetadataRequest>(
                "UpdateConversationMetadataRequest",
                b,
            )?
            .conversation_id,
            ..Ask::default()
        },
        RequestKind::ConversationClone => {
            let m: pb::NotifyConversationCloneRequest = proto("NotifyConversationCloneRequest", b)?;
            Ask {
                conversation: m.conversation_id,
                source: m.source_conversation_id,
                ..Ask::default()
            }
        }
        RequestKind::ConversationBlobs => Ask {
            conversation: proto::<pb::UploadConversationBlobsRequest>(
                "UploadConversationBlobsRequest",
                b,
            )?
            .conversation_id,
            ..Ask::default()
        },
        RequestKind::PromptQuality => Ask {
            conversation: proto::<pb::UploadLocalAgentRunToPromptQualityRequest>(
                "UploadLocalAgentRunToPromptQualityRequest",
                b,
            )?
            .conversation_id,
            ..Ask::default()
        },
        RequestKind::Opaque => Ask {
            strings: wire_strings(b)?,
            ..Ask::default()
        },
    };
    Ok(ask)
}

/// The top-level length-delimited fields of `b` that are UTF-8 text.
fn wire_strings(b: &[u8]) -> Result<Vec<String>, AskError> {
    let mut out = Vec::new();
    for field in crate::proto::wire::fields(b) {
        let field = field.map_err(AskError::Wire)?;
        if field.wire_type == crate::proto::wire::WireType::Len {
            if let Ok(s) = std::str::from_utf8(field.value) {
                out.push(s.to_string());
            }
        }
    }
    Ok(out)
}

fn read_json(shape: RequestKind, b: &[u8]) -> Result<Ask, AskError> {
    // An empty body is the empty message, as in the proto codec.
    let v: Value = if b.is_empty() {
        json!({})
    } else {
        serde_json::from_slice(b).map_err(AskError::Json)?
    };
    let text = |name: &str, alt: &str| {
        v.get(name)
            .or_else(|| v.get(alt))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    let conversation = text("conversationId", "conversation_id");
    let ask = match shape {
        RequestKind::NameAgent => Ask {
            text: text("userMessage", "user_message"),
            ..Ask::default()
        },
        RequestKind::TranscriptOverview => Ask {
            text: text("formattedConversation", "formatted_conversation"),
            ..Ask::default()
        },
        RequestKind::ConversationMetadata
        | RequestKind::ConversationBlobs
        | RequestKind::PromptQuality => Ask {
            conversation,
            ..Ask::default()
        },
        RequestKind::ConversationClone => Ask {
            conversation,
            source: text("sourceConversationId", "source_conversation_id"),
            ..Ask::default()
        },
        RequestKind::Opaque => Ask {
            strings: v
                .as_object()
                .map(|o| {
                    o.values()
                        .filter_map(Value::as_str)
                        .map(str::to_string)
                        .collect()
                })
                .unwrap_or_default(),
            ..Ask::default()
        },
    };
    Ok(ask)
}

/// The answer's body for `shape`: `text` goes in the field the UI shows (`name` of
/// `NameAgentResponse`, `overview` of `CreateTranscriptOverviewResponse`); every other answer
/// is the empty message.
pub(super) fn answer(shape: RequestKind, codec: Codec, text: String) -> Bytes {
    match (codec, shape) {
        (Codec::Proto, RequestKind::NameAgent) => {
            pb::NameAgentResponse { name: text }.encode_to_vec().into()
        }
        (Codec::Proto, RequestKind::TranscriptOverview) => {
            pb::CreateTranscriptOverviewResponse { overview: text }
                .encode_to_vec()
                .into()
        }
        (Codec::Proto, _) => Bytes::new(),
        (Codec::Json, RequestKind::NameAgent) => json!({ "name": text }).to_string().into(),
        (Codec::Json, RequestKind::TranscriptOverview) => {
            json!({ "overview": text }).to_string().into()
        }
        (Codec::Json, _) => Bytes::from_static(b"{}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn both_codecs_read_the_same_fields() {
        let m = pb::NotifyConversationCloneRequest {
            conversation_id: "fork".into(),
            source_conversation_id: "src".into(),
            source_request_id: "r".into(),
        };
        let from_proto = read(
            RequestKind::ConversationClone,
            Codec::Proto,
            &m.encode_to_vec(),
        )
        .unwrap();
        let from_json = read(
            RequestKind::ConversationClone,
            Codec::Json,
            br#"{"conversationId":"fork","sourceConversationId":"src","sourceRequestId":"r"}"#,
        )
        .unwrap();
        assert_eq!(from_proto, from_json);
        assert_eq!(
            (from_proto.conversation.as_str(), from_proto.source.as_str()),
            ("fork", "src")
        );
    }

    #[test]
    fn opaque_messages_yield_their_top_level_strings() {
        let mut b = Vec::new();
        prost::encoding::string::encode(1, &"conv-1".to_string(), &mut b);
        prost::encoding::int32::encode(2, &7, &mut b);
        prost::encoding::string::encode(5, &"byok-m".to_string(), &mut b);
        let ask = read(RequestKind::Opaque, Codec::Proto, &b).unwrap();
        assert_eq!(ask.strings, ["conv-1", "byok-m"]);
        let ask = read(
            RequestKind::Opaque,
            Codec::Json,
            br#"{"conversationId":"c","n":3}"#,
        )
        .unwrap();
        assert_eq!(ask.strings, ["c"]);
    }

    #[test]
    fn bad_bodies_are_errors_not_panics() {
        assert!(read(RequestKind::NameAgent, Codec::Proto, b"\x0a\xff").is_err());
        assert!(read(RequestKind::NameAgent, Codec::Json, b"{nope").is_err());
        assert!(read(RequestKind::Opaque, Codec::Proto, b"\x0a\x05ab").is_err());
    }

    #[test]
    fn answers_decode_in_their_codec() {
        let b = answer(RequestKind::NameAgent, Codec::Proto, "Title".into());
        assert_eq!(pb::NameAgentResponse::decode(b).unwrap().name, "Title");
        let b = answer(RequestKind::TranscriptOverview, Codec::Json, "Sum".into());
        let v: Value = serde_json::from_slice(&b).unwrap();
        assert_eq!(v["overview"], "Sum");
        let b = answer(RequestKind::ConversationBlobs, Codec::Proto, String::new());
        assert!(pb::UploadConversationBlobsResponse::decode(b).is_ok());
        assert_eq!(
            &answer(RequestKind::Opaque, Codec::Json, String::new())[..],
            b"{}"
        );
    }
}
