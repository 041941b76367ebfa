//! The Connect codec against real and hand-made end-of-stream frames.
//!
//! - `tests/fixtures/connect/endstream-error.json` (ours): always runs.
//! - `tests/fixtures/protocol/captures/qiaozhi-phase-7m-endstream-frames.log` (real
//!   api2.cursor.sh answers, copied with its source note): always runs.
//!
//! Each `aiserver.v1.ErrorDetails` detail is decoded from its base64 `value` and compared with
//! the `debug` JSON the server put next to it. The JSON is converted to an `ErrorDetails` by a
//! small converter that refuses keys it does not know, so the whole-message comparison checks
//! every field in both directions.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use bytes::Bytes;
use cursor_byok::connect::{
    Code, ConnectError, Encoding, EndStream, Frame, FrameDecoder, FrameEncoder, Limits, StreamKind,
    FLAG_END_STREAM,
};
use cursor_byok::proto::aiserver::v1::{
    error_details, CustomErrorDetails, ErrorAnalyticsMetadata, ErrorDetails,
};
use serde_json::Value;

fn manifest_path(rel: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Puts `json` in an end-of-stream frame, decodes it with the streaming decoder fed in two
/// uneven chunks, and returns the parsed end of stream.
fn decode_end_frame(json: &[u8]) -> EndStream {
    let frame = cursor_byok::connect::encode_frame(FLAG_END_STREAM, json).expect("frame fits");
    let mut dec = FrameDecoder::new(StreamKind::Response, Encoding::Identity, Limits::default());
    let (a, b) = frame.split_at(frame.len() / 3);
    dec.push(a);
    assert_eq!(dec.next_frame().expect("partial frame is fine"), None);
    dec.push(b);
    let end = match dec.next_frame().expect("end frame decodes") {
        Some(Frame::End(end)) => end,
        other => panic!("expected an end frame, got {other:?}"),
    };
    dec.finish().expect("stream ended properly");
    end
}

fn bool_field(v: &Value, what: &str) -> bool {
    v.as_bool()
        .unwrap_or_else(|| panic!("{what}: expected a bool, got {v}"))
}

fn str_field(v: &Value, what: &str) -> String {
    v.as_str()
        .unwrap_or_else(|| panic!("{what}: expected a string, got {v}"))
        .to_owned()
}

/// protobuf-JSON of `aiserver.v1.ErrorDetails` (the subset servers put in `debug`) → message.
fn error_details_from_debug(debug: &Value) -> ErrorDetails {
    let obj = debug.as_object().expect("debug is an object");
    let mut out = ErrorDetails::default();
    for (key, v) in obj {
        match key.as_str() {
            "error" => {
                out.error = match v {
                    Value::String(name) => error_details::Error::from_str_name(name)
                        .unwrap_or_else(|| panic!("unknown ErrorDetails.Error {name}"))
                        as i32,
                    Value::Number(n) => n
                        .as_i64()
                        .and_then(|n| i32::try_from(n).ok())
                        .expect("enum number"),
                    other => panic!("error: unexpected {other}"),
                }
            }
            "isExpected" => out.is_expected = Some(bool_field(v, key)),
            "details" => out.details = Some(custom_details_from_debug(v)),
            other => panic!("debug key {other:?} not handled by this test: extend it"),
        }
    }
    out
}

fn custom_details_from_debug(v: &Value) -> CustomErrorDetails {
    let obj = v.as_object().expect("details is an object");
    let mut out = CustomErrorDetails::default();
    for (key, v) in obj {
        match key.as_str() {
            "title" => out.title = str_field(v, key),
            "detail" => out.detail = str_field(v, key),
            "isRetryable" => out.is_retryable = Some(bool_field(v, key)),
            "showRequestId" => out.show_request_id = Some(bool_field(v, key)),
            "shouldShowImmediateError" => out.should_show_immediate_error = Some(bool_field(v, key)),
            "allowCommandLinksPotentiallyUnsafePleaseOnlyUseForHandwrittenTrustedMarkdown" => {
                out.allow_command_links_potentially_unsafe_please_only_use_for_handwritten_trusted_markdown =
                    Some(bool_field(v, key))
            }
            "additionalInfo" => {
                out.additional_info = v
                    .as_object()
                    .expect("additionalInfo is an object")
                    .iter()
                    .map(|(k, v)| (k.clone(), str_field(v, k)))
                    .collect::<HashMap<_, _>>()
            }
            "analyticsMetadata" => {
                let mut meta = ErrorAnalyticsMetadata::default();
                for (k, v) in v.as_object().expect("analyticsMetadata is an object") {
                    match k.as_str() {
                        "actionRequired" => meta.action_required = Some(str_field(v, k)),
                        other => panic!("analyticsMetadata key {other:?} not handled: extend the test"),
                    }
                }
                out.analytics_metadata = Some(meta);
            }
            other => panic!("details key {other:?} not handled by this test: extend it"),
        }
    }
    out
}

/// Checks every `aiserver.v1.ErrorDetails` detail of `err` against its `debug` JSON; returns
/// how many were checked.
fn check_details_against_debug(err: &ConnectError) -> usize {
    let mut checked = 0;
    for detail in &err.details {
        assert_eq!(detail.type_name, "aiserver.v1.ErrorDetails");
        let decoded: ErrorDetails =
            prost::Message::decode(detail.value.clone()).expect("value is an ErrorDetails");
        let debug = detail.debug.as_ref().expect("detail has a debug rendering");
        assert_eq!(decoded, error_details_from_debug(debug));
        checked += 1;
    }
    checked
}

#[test]
fn own_fixture_end_stream_error() {
    let path = manifest_path("tests/fixtures/connect/endstream-error.json");
    let json = std::fs::read(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let end = decode_end_frame(json.trim_ascii_end());

    assert_eq!(
        end.metadata.get("x-cursor-byok-provider"),
        Some(&vec!["example-provider".to_owned()])
    );
    let err = end.error.as_ref().expect("fixture carries an error");
    assert_eq!(err.code, Code::Unauthenticated);
    assert_eq!(err.http_status(), 401);
    assert_eq!(err.message, "provider rejected the API key");
    assert_eq!(check_details_against_debug(err), 1);

    // The typed helper agrees, and the specific values are what the fixture says.
    let details = err
        .decode_error_details()
        .expect("decodes")
        .expect("present");
    assert_eq!(details.error(), error_details::Error::BadUserApiKey);
    assert_eq!(details.is_expected, Some(true));
    let custom = details.details.as_ref().expect("custom details");
    assert_eq!(custom.title, "Invalid API key");
    assert_eq!(custom.is_retryable, Some(false));
    assert_eq!(
        custom.additional_info.get("provider").map(String::as_str),
        Some("example-provider")
    );

    // Rebuilding the same error from the message gives the same detail bytes, and a full
    // encode → decode of the end frame is lossless.
    let rebuilt = cursor_byok::connect::ErrorDetail::error_details(&details);
    assert_eq!(rebuilt.value, err.details[0].value);
    let frame = FrameEncoder::new(Encoding::Gzip)
        .end_stream(&end)
        .expect("encodes");
    assert_eq!(decode_end_frame(&frame[5..]), end);
}

#[test]
fn real_capture_end_stream_frames() {
    let path =
        manifest_path("tests/fixtures/protocol/captures/qiaozhi-phase-7m-endstream-frames.log");
    let log = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));

    let mut ends = Vec::new();
    let mut unary = Vec::new();
    let mut status = None;
    for line in log.lines() {
        if let Some((head, json)) = line.split_once(" DATA json=") {
            assert!(
                head.contains("flags=0x02"),
                "only end frames are logged as json: {line}"
            );
            // The logged length is the frame's payload length: the JSON must be all of it.
            let len: usize = head
                .rsplit_once("len=")
                .and_then(|(_, n)| n.trim().parse().ok())
                .expect("len= in frame line");
            assert_eq!(json.len(), len, "{line}");
            ends.push(decode_end_frame(json.as_bytes()));
        } else if let Some((_, rest)) = line.split_once(" http ") {
            status = rest
                .split_whitespace()
                .next()
                .and_then(|s| s.parse::<u16>().ok());
        } else if let Some(body) = line.trim_start().strip_prefix("body:") {
            let status = status.expect("a body follows an http status line");
            unary.push((
                status,
                ConnectError::from_unary_response(status, body.trim().as_bytes()),
            ));
        }
    }

    assert_eq!(ends.len(), 2, "end frames in the capture");
    let errors: Vec<&ConnectError> = ends
        .iter()
        .map(|e| e.error.as_ref().expect("error"))
        .collect();

    // Frame 1: resource_exhausted with an ErrorDetails that matches its debug JSON.
    assert_eq!(errors[0].code, Code::ResourceExhausted);
    assert_eq!(errors[0].message, "Error");
    assert_eq!(check_details_against_debug(errors[0]), 1);
    let details = errors[0]
        .decode_error_details()
        .expect("decodes")
        .expect("present");
    assert_eq!(
        details.error(),
        error_details::Error::Gpt4VisionPreviewRateLimit
    );
    assert_eq!(details.error, 28);
    assert_eq!(details.is_expected, Some(true));
    let custom = details.details.expect("custom details");
    assert_eq!(custom.title, "Update Required");
    assert!(custom
        .detail
        .starts_with("Your version of Cursor is no longer supported."));
    assert_eq!(
        custom
            .analytics_metadata
            .and_then(|m| m.action_required)
            .as_deref(),
        Some("payment")
    );
    assert_eq!(custom.is_retryable, None);

    // Frame 2: internal, no details.
    assert_eq!(errors[1].code, Code::Internal);
    assert_eq!(
        errors[1].message,
        "parse binary: illegal tag: field no 13 wire type 7"
    );
    assert!(errors[1].details.is_empty());

    // Our own re-encoding of each real frame parses back to the same thing.
    for end in &ends {
        assert_eq!(
            &EndStream::from_json(&end.to_json()).expect("reparses"),
            end
        );
    }

    // Unary answers: HTTP 415 with an empty body, HTTP 500 with a Connect JSON error.
    assert_eq!(unary.len(), 2, "unary bodies in the capture");
    assert_eq!(unary[0].0, 415);
    assert_eq!(unary[0].1.code, Code::Unknown);
    assert_eq!(unary[1].0, 500);
    assert_eq!(
        unary[1].1,
        ConnectError::new(
            Code::Internal,
            "parse binary: illegal tag: field no 13 wire type 7"
        )
    );
    assert_eq!(unary[1].1.http_status(), 500);
    let body =
        r#"{"code":"internal","message":"parse binary: illegal tag: field no 13 wire type 7"}"#;
    assert_eq!(
        ConnectError::from_unary_json(body.as_bytes()).ok().as_ref(),
        Some(&unary[1].1)
    );
    assert_eq!(unary[1].1.to_unary_json(), Bytes::from(body));
}
