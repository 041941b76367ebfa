//! Connect's error JSON: the end-of-stream message of streaming responses and the body of unary
//! error responses.

use std::collections::BTreeMap;
use std::fmt;

use base64::engine::general_purpose::{GeneralPurpose, GeneralPurposeConfig};
use base64::engine::DecodePaddingMode;
use base64::{alphabet, Engine as _};
use bytes::Bytes;
use serde::{Deserialize, Serialize};

use super::code::Code;
use super::error::CodecError;
use crate::proto::aiserver::v1::ErrorDetails;

/// Trailers carried by the end-of-stream message: header name → values. Ordered so the JSON we
/// write is deterministic.
pub type Metadata = BTreeMap<String, Vec<String>>;

/// The end-of-stream message of a streaming response. `error: None` is success.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct EndStream {
    pub error: Option<ConnectError>,
    pub metadata: Metadata,
}

/// A Connect error: a code, a human message and typed details.
#[derive(Debug, Clone, PartialEq)]
pub struct ConnectError {
    pub code: Code,
    pub message: String,
    pub details: Vec<ErrorDetail>,
}

/// One error detail: a fully-qualified protobuf type name and the encoded message. `debug` is
/// the optional JSON rendering servers add for humans; it is kept so a relayed error round
/// trips, and never interpreted.
#[derive(Debug, Clone, PartialEq)]
pub struct ErrorDetail {
    pub type_name: String,
    pub value: Bytes,
    pub debug: Option<serde_json::Value>,
}

// Connect writes detail values as standard base64 without padding; peers differ, so reading
// accepts padding either way (and the URL-safe alphabet as a fallback).
const B64_CONFIG: GeneralPurposeConfig = GeneralPurposeConfig::new()
    .with_encode_padding(false)
    .with_decode_padding_mode(DecodePaddingMode::Indifferent);
const B64_STANDARD: GeneralPurpose = GeneralPurpose::new(&alphabet::STANDARD, B64_CONFIG);
const B64_URL_SAFE: GeneralPurpose = GeneralPurpose::new(&alphabet::URL_SAFE, B64_CONFIG);

/// `google.protobuf.Any` style prefix some servers put in front of detail type names.
const TYPE_URL_PREFIX: &str = "type.googleapis.com/";

#[derive(Serialize, Deserialize)]
struct WireEndStream {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    error: Option<WireError>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    metadata: Option<Metadata>,
}

#[derive(Serialize, Deserialize)]
struct WireError {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    code: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    message: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    details: Option<Vec<WireDetail>>,
}

#[derive(Serialize, Deserialize)]
struct WireDetail {
    #[serde(rename = "type")]
    type_name: String,
    #[serde(default)]
    value: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    debug: Option<serde_json::Value>,
}

/// serde_json only fails to serialize maps with non-string keys or types whose `Serialize`
/// errors; the wire structs above have neither, so this cannot fail.
fn to_json_bytes<T: Serialize>(value: &T) -> Bytes {
    Bytes::from(serde_json::to_vec(value).expect("wire structs always serialize"))
}

impl EndStream {
    /// A successful end of stream with no trailers.
    pub fn ok() -> Self {
        EndStream::default()
    }

    /// An end of stream carrying `error`.
    pub fn from_error(error: ConnectError) -> Self {
        EndStream {
            error: Some(error),
            metadata: Metadata::new(),
        }
    }

    /// Parses an end-of-stream payload (already decompressed). An unknown or missing code is
    /// read as `unknown` rather than refused, so the peer's message still reaches the user.
    pub fn from_json(payload: &[u8]) -> Result<EndStream, CodecError> {
        let wire: WireEndStream =
            serde_json::from_slice(payload).map_err(CodecError::BadEndStreamJson)?;
        Ok(EndStream {
            error: wire.error.map(ConnectError::from_wire).transpose()?,
            metadata: wire.metadata.unwrap_or_default(),
        })
    }

    pub fn to_json(&self) -> Bytes {
        to_json_bytes(&WireEndStream {
            error: self.error.as_ref().map(ConnectError::to_wire),
            metadata: (!self.metadata.is_empty()).then(|| self.metadata.clone()),
        })
    }
}

impl ConnectError {
    pub fn new(code: Code, message: impl Into<String>) -> Self {
        ConnectError {
            code,
            message: message.into(),
            details: Vec::new(),
        }
    }

    pub fn with_detail(mut self, detail: ErrorDetail) -> Self {
        self.details.push(detail);
        self
    }

    /// The HTTP status to send this error with as a unary response.
    pub fn http_status(&self) -> u16 {
        self.code.http_status()
    }

    /// Parses a unary error body `{"code":…,"message":…,"details":[…]}`. Unlike the end-stream
    /// form the code is required: without it the body is not a Connect error.
    pub fn from_unary_json(body: &[u8]) -> Result<ConnectError, CodecError> {
        let wire: WireError =
            serde_json::from_slice(body).map_err(CodecError::BadUnaryErrorJson)?;
        if wire.code.is_none() {
            return Err(CodecError::BadUnaryErrorJson(
                serde::de::Error::missing_field("code"),
            ));
        }
        ConnectError::from_wire(wire)
    }

    /// The error for a non-200 unary response: the body's Connect error when it has one,
    /// otherwise a code from the HTTP status (Connect's fallback), so a proxy's HTML error page
    /// or an empty body still yields a sensible error.
    pub fn from_unary_response(status: u16, body: &[u8]) -> ConnectError {
        if let Ok(err) = ConnectError::from_unary_json(body) {
            return err;
        }
        let reason = http::StatusCode::from_u16(status)
            .ok()
            .and_then(|s| s.canonical_reason());
        let message = match reason {
            Some(r) => format!("HTTP status {status} {r}"),
            None => format!("HTTP status {status}"),
        };
        ConnectError::new(Code::from_http_status(status), message)
    }

    /// The unary error body; send it with [`ConnectError::http_status`] and
    /// `content-type: application/json`.
    pub fn to_unary_json(&self) -> Bytes {
        to_json_bytes(&self.to_wire())
    }

    /// Decodes the first `aiserver.v1.ErrorDetails` detail, if any (Cursor's client reads its
    /// error UI from it).
    pub fn decode_error_details(&self) -> Result<Option<ErrorDetails>, CodecError> {
        let Some(detail) = self
            .details
            .iter()
            .find(|d| d.type_name == ErrorDetail::ERROR_DETAILS_TYPE)
        else {
            return Ok(None);
        };
        prost::Message::decode(detail.value.clone())
            .map(Some)
            .map_err(|source| CodecError::BadProtobuf {
                message_type: ErrorDetail::ERROR_DETAILS_TYPE,
                source,
            })
    }

    fn from_wire(wire: WireError) -> Result<ConnectError, CodecError> {
        let code = wire
            .code
            .as_deref()
            .and_then(|c| c.parse().ok())
            .unwrap_or(Code::Unknown);
        let details = wire
            .details
            .unwrap_or_default()
            .into_iter()
            .map(ErrorDetail::from_wire)
            .collect::<Result<_, _>>()?;
        Ok(ConnectError {
            code,
            message: wire.message.unwrap_or_default(),
            details,
        })
    }

    fn to_wire(&self) -> WireError {
        WireError {
            code: Some(self.code.as_str().to_owned()),
            message: (!self.message.is_empty()).then(|| self.message.clone()),
            details: (!self.details.is_empty())
                .then(|| self.details.iter().map(ErrorDetail::to_wire).collect()),
        }
    }
}

impl fmt::Display for ConnectError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            f.write_str(self.code.as_str())
        } else {
            write!(f, "{}: {}", self.code, self.message)
        }
    }
}

impl std::error::Error for ConnectError {}

impl ErrorDetail {
    /// The detail type Cursor's servers and clients use for their error UI.
    pub(crate) const ERROR_DETAILS_TYPE: &'static str = "aiserver.v1.ErrorDetails";

    pub fn new(type_name: impl Into<String>, value: Bytes) -> Self {
        ErrorDetail {
            type_name: type_name.into(),
            value,
            debug: None,
        }
    }

    /// A detail carrying an encoded `aiserver.v1.ErrorDetails`.
    pub fn error_details(details: &ErrorDetails) -> Self {
        ErrorDetail::new(
            Self::ERROR_DETAILS_TYPE,
            Bytes::from(prost::Message::encode_to_vec(details)),
        )
    }

    fn from_wire(wire: WireDetail) -> Result<ErrorDetail, CodecError> {
        let type_name = match wire.type_name.strip_prefix(TYPE_URL_PREFIX) {
            Some(rest) => rest.to_owned(),
            None => wire.type_name,
        };
        let value = match B64_STANDARD.decode(&wire.value) {
            Ok(v) => v,
            Err(std_err) => {
                B64_URL_SAFE
                    .decode(&wire.value)
                    .map_err(|_| CodecError::BadBase64 {
                        type_name: type_name.clone(),
                        source: std_err,
                    })?
            }
        };
        Ok(ErrorDetail {
            type_name,
            value: Bytes::from(value),
            debug: wire.debug,
        })
    }

    fn to_wire(&self) -> WireDetail {
        WireDetail {
            type_name: self.type_name.clone(),
            value: B64_STANDARD.encode(&self.value),
            debug: self.debug.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::aiserver::v1::{error_details, CustomErrorDetails};

    fn sample_details() -> ErrorDetails {
        ErrorDetails {
            error: error_details::Error::FreeUserRateLimitExceeded as i32,
            details: Some(CustomErrorDetails {
                title: "Slow down".into(),
                detail: "Too many requests".into(),
                is_retryable: Some(true),
                ..Default::default()
            }),
            is_expected: Some(true),
        }
    }

    #[test]
    fn success_end_stream_is_empty_object() {
        assert_eq!(&EndStream::ok().to_json()[..], b"{}");
        assert_eq!(EndStream::from_json(b"{}").ok(), Some(EndStream::ok()));
        assert_eq!(
            EndStream::from_json(b"{\"error\":null}").ok(),
            Some(EndStream::ok())
        );
    }

    #[test]
    fn error_end_stream_round_trips() {
        let mut end = EndStream::from_error(
            ConnectError::new(Code::ResourceExhausted, "quota")
                .with_detail(ErrorDetail::error_details(&sample_details())),
        );
        end.metadata
            .insert("x-trace".into(), vec!["a".into(), "b".into()]);
        let json = end.to_json();
        let text = std::str::from_utf8(&json).expect("json is utf-8");
        assert!(text.contains("\"code\":\"resource_exhausted\""), "{text}");
        assert!(
            !text.contains('='),
            "base64 must be emitted without padding: {text}"
        );
        let back = EndStream::from_json(&json).expect("parses");
        assert_eq!(back, end);
        let err = back.error.expect("error");
        assert_eq!(
            err.decode_error_details().expect("decodes"),
            Some(sample_details())
        );
    }

    #[test]
    fn base64_with_or_without_padding_and_url_safe() {
        // 0xfb 0xff encodes to "+/8=" (standard) or "-_8=" (URL-safe).
        for v in ["+/8", "+/8=", "-_8", "-_8="] {
            let json = format!(
                r#"{{"error":{{"code":"internal","details":[{{"type":"t","value":"{v}"}}]}}}}"#
            );
            let end = EndStream::from_json(json.as_bytes()).expect(v);
            assert_eq!(
                &end.error.expect("error").details[0].value[..],
                &[0xfb, 0xff],
                "{v}"
            );
        }
        let bad = br#"{"error":{"code":"internal","details":[{"type":"t","value":"!!"}]}}"#;
        assert!(
            matches!(EndStream::from_json(bad), Err(CodecError::BadBase64 { type_name, .. }) if type_name == "t")
        );
    }

    #[test]
    fn lenient_about_codes_and_type_prefix() {
        let json = br#"{"error":{"code":"brand_new","message":"m","details":[{"type":"type.googleapis.com/aiserver.v1.ErrorDetails","value":""}]}}"#;
        let err = EndStream::from_json(json)
            .expect("parses")
            .error
            .expect("error");
        assert_eq!(err.code, Code::Unknown);
        assert_eq!(err.message, "m");
        assert_eq!(err.details[0].type_name, ErrorDetail::ERROR_DETAILS_TYPE);
        // An empty value is an ErrorDetails with every field at its default.
        assert_eq!(
            err.decode_error_details().expect("decodes"),
            Some(ErrorDetails::default())
        );
    }

    #[test]
    fn bad_json_and_bad_detail_protobuf() {
        assert!(matches!(
            EndStream::from_json(b"{"),
            Err(CodecError::BadEndStreamJson(_))
        ));
        assert!(matches!(
            EndStream::from_json(br#"{"metadata":{"k":"not-a-list"}}"#),
            Err(CodecError::BadEndStreamJson(_))
        ));
        let err = ConnectError::new(Code::Internal, "x").with_detail(ErrorDetail::new(
            ErrorDetail::ERROR_DETAILS_TYPE,
            Bytes::from_static(&[0x0a, 0x05]),
        ));
        assert!(matches!(
            err.decode_error_details(),
            Err(CodecError::BadProtobuf {
                message_type: "aiserver.v1.ErrorDetails",
                ..
            })
        ));
        assert_eq!(
            ConnectError::new(Code::Internal, "x")
                .decode_error_details()
                .ok(),
            Some(None)
        );
    }

    #[test]
    fn unary_error_bodies() {
        let err = ConnectError::new(Code::NotFound, "nope");
        assert_eq!(
            &err.to_unary_json()[..],
            br#"{"code":"not_found","message":"nope"}"#
        );
        assert_eq!(err.http_status(), 404);
        assert_eq!(
            ConnectError::from_unary_json(&err.to_unary_json()).ok(),
            Some(err)
        );
        assert!(matches!(
            ConnectError::from_unary_json(br#"{"message":"no code"}"#),
            Err(CodecError::BadUnaryErrorJson(_))
        ));

        let from_html = ConnectError::from_unary_response(503, b"<html>busy</html>");
        assert_eq!(from_html.code, Code::Unavailable);
        assert_eq!(from_html.message, "HTTP status 503 Service Unavailable");
        let from_empty = ConnectError::from_unary_response(415, b"");
        assert_eq!(from_empty.code, Code::Unknown);
        let from_json =
            ConnectError::from_unary_response(500, br#"{"code":"internal","message":"m"}"#);
        assert_eq!(from_json, ConnectError::new(Code::Internal, "m"));
        assert_eq!(from_json.to_string(), "internal: m");
    }
}
