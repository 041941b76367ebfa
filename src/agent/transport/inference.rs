//! `aiserver.v1.InferenceService`: the door of Cursor's "managed-local" runtime, where the
//! agent host runs the loop itself and sends each model call (the whole prompt and tool list)
//! to `RunInference` (HTTP/2 bidi), or over HTTP/1.1 to `RunInferenceSSE` / `RunInferencePoll`
//! with its client frames in `BidiAppend`; 3.17 clients made one `Stream` per model call
//! (`../shared/protocol/inference.md` §2-4, §9).
//!
//! We do not serve this runtime, so it fails closed: a stream or append that names one of our
//! models (our id prefix, configured or not) is refused with an error that says why and is
//! never sent to Cursor; one we cannot read (another codec, an encoding we do not decode, bytes
//! that do not scan, a first message that is not the run request) is refused too. Cursor's own
//! pass through: on `RunInference` every client frame is read before it goes up, and a later
//! one that names our model or cannot be read ends the stream with the refusal, nothing more
//! of it sent to Cursor.
//!
//! Only the fields that name a model are read, by number from `inference.tsv`, with the wire
//! scanner (the rest of the message is checked to scan, not decoded):
//! - `RunInferenceClientMessage.run_request` (1): `requested_model` (3) `.model_id` (1),
//!   `selected_subagent_models` (7) `.model_id`, `subagent_model_overrides` (8) `.model` (2)
//!   `.model_id`;
//! - `.invoke_model` (2) `.request` (2), and `Stream`'s request (an `InferenceStreamRequest`):
//!   `model_id` (5), `requested_model` (7) `.model_id`.
//!
//! The HTTP/1.1 pairing: the SSE / Poll request notes its request id (see `inference_ids`),
//! and `BidiAppend` asks [`append`] before reading an append as an agent message.

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;

use super::body::{end_frame, error_response, read_bounded, stream_error, FramePeek};
use super::face::AgentTransports;
use super::inference_ids::InferenceVerdict;
use crate::config::MODEL_ID_PREFIX;
use crate::connect::{self, Code, ConnectError, Encoding};
use crate::http::{full, Body, RequestContext};
use crate::proto::aiserver::v1 as aiserver;
use crate::proto::wire::{self, WireType};

pub(crate) const RUN_INFERENCE_PATH: &str = "/aiserver.v1.InferenceService/RunInference";
pub(crate) const RUN_INFERENCE_SSE_PATH: &str = "/aiserver.v1.InferenceService/RunInferenceSSE";
pub(crate) const RUN_INFERENCE_POLL_PATH: &str = "/aiserver.v1.InferenceService/RunInferencePoll";
/// One model call per stream (the runtime's transport before `RunInference`, 3.17).
pub(crate) const INFERENCE_STREAM_PATH: &str = "/aiserver.v1.InferenceService/Stream";

/// How long a `RunInference` waits for its first frame before it is refused.
const FIRST_FRAME_WAIT: std::time::Duration = std::time::Duration::from_secs(600);

/// Why an inference message could not be read.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReadError {
    #[error("it does not scan as protobuf: {0}")]
    Wire(#[from] wire::WireError),
    #[error("a model id in it is not UTF-8")]
    NotUtf8,
}

/// Every model id one encoded `RunInferenceClientMessage` names, and whether it carries the
/// run request.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Named {
    pub run_request: bool,
    pub models: Vec<String>,
}

/// The values of every length-delimited occurrence of field `number` in `buf`.
fn each(buf: &[u8], number: u32) -> Result<Vec<&[u8]>, ReadError> {
    let mut out = Vec::new();
    for field in wire::fields(buf) {
        let field = field?;
        if field.number == number && field.wire_type == WireType::Len {
            out.push(field.value);
        }
    }
    Ok(out)
}

/// Field `number` read as a string (the last occurrence wins), if present.
fn string(buf: &[u8], number: u32) -> Result<Option<String>, ReadError> {
    match each(buf, number)?.last() {
        None => Ok(None),
        Some(v) => std::str::from_utf8(v)
            .map(|s| Some(s.to_owned()))
            .map_err(|_| ReadError::NotUtf8),
    }
}

/// The model ids of an `InferenceRequestedModel` occurrence list.
fn requested(models: Vec<&[u8]>, out: &mut Vec<String>) -> Result<(), ReadError> {
    for m in models {
        wire::validate(m)?;
        out.extend(string(m, 1)?);
    }
    Ok(())
}

/// The model ids of one `InferenceStreamRequest`: `model_id` (5), `requested_model` (7).
fn stream_request_models(request: &[u8], out: &mut Vec<String>) -> Result<(), ReadError> {
    wire::validate(request)?;
    out.extend(string(request, 5)?);
    requested(each(request, 7)?, out)
}

/// Reads the model ids of one `RunInferenceClientMessage` (see the module docs).
pub(crate) fn named_models(message: &[u8]) -> Result<Named, ReadError> {
    wire::validate(message)?;
    let mut named = Named::default();
    for run in each(message, 1)? {
        named.run_request = true;
        wire::validate(run)?;
        requested(each(run, 3)?, &mut named.models)?;
        requested(each(run, 7)?, &mut named.models)?;
        for over in each(run, 8)? {
            wire::validate(over)?;
            requested(each(over, 2)?, &mut named.models)?;
        }
    }
    for invoke in each(message, 2)? {
        wire::validate(invoke)?;
        for request in each(invoke, 2)? {
            stream_request_models(request, &mut named.models)?;
        }
    }
    named.models.retain(|m| !m.is_empty());
    Ok(named)
}

/// The first model in `named` that is ours: our prefix, whether or not it is still configured
/// (a renamed model's turn is the user's all the same).
fn ours(named: &Named) -> Option<&str> {
    named
        .models
        .iter()
        .map(String::as_str)
        .find(|m| m.starts_with(MODEL_ID_PREFIX))
}

/// The refusal of a stream or append on this door, with `ErrorDetails` the client shows.
pub fn refusal(why: &str) -> ConnectError {
    let message = format!(
        "cursor-byok: {why}, so it was sent neither to your provider nor to Cursor. \
         Cursor's local agent loop (InferenceService/RunInference) is a door cursor-byok does \
         not serve; cursor-byok turns it off in Cursor's experiment settings \
         (agent_host_local_loop), which Cursor reads at start: quit Cursor fully, start it \
         again, and send the message again."
    );
    let details = aiserver::ErrorDetails {
        error: aiserver::error_details::Error::CustomMessage as i32,
        details: Some(aiserver::CustomErrorDetails {
            title: "cursor-byok refused Cursor's local agent loop".to_string(),
            detail: message.clone(),
            is_retryable: Some(false),
            ..Default::default()
        }),
        is_expected: Some(true),
    };
    ConnectError::new(Code::FailedPrecondition, message)
        .with_detail(connect::ErrorDetail::error_details(&details))
}

/// Why `message` must not go to Cursor, if it must not.
fn verdict_on(message: &[u8], first: bool) -> Option<String> {
    match named_models(message) {
        Err(e) => Some(format!(
            "a RunInference message cursor-byok cannot read ({e})"
        )),
        Ok(named) if first && !named.run_request => {
            Some("a RunInference stream that does not open with its run request".into())
        }
        Ok(named) => ours(&named)
            .map(|m| format!("Cursor's local agent loop asked for model {m}, one of yours")),
    }
}

/// `/aiserver.v1.InferenceService/RunInference` (HTTP/2 bidi): decided by its first frame,
/// and every later frame read before it goes up (see [`inspected`]).
pub(super) async fn run_inference(
    t: &AgentTransports,
    ctx: RequestContext,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, mut body) = req.into_parts();
    let encoding = match readable_encoding(&parts.headers) {
        Ok(e) => e,
        Err(why) => return stream_error(refusal(&why)),
    };
    let mut peek = FramePeek::new(encoding, t.inner.limits);
    let first = match tokio::time::timeout(FIRST_FRAME_WAIT, peek.next(&mut body, true)).await {
        Ok(Ok(Some(frame))) => frame,
        Ok(Ok(None)) => return stream_error(refusal("a RunInference stream with no message")),
        Ok(Err(e)) => return stream_error(e),
        Err(_) => {
            return stream_error(refusal(
                "a RunInference stream whose first message never came",
            ))
        }
    };
    if let Some(why) = verdict_on(&first, true) {
        tracing::warn!(reason = %why, "RunInference refused");
        return stream_error(refusal(&why));
    }
    let (refused_tx, mut refused) = tokio::sync::oneshot::channel();
    let upward = Upward {
        judged: Some(first),
        peek,
        body,
        refused: Some(refused_tx),
    };
    let req = Request::from_parts(parts, inspected(upward));
    let forward = t.upstream().forward(&ctx, req);
    tokio::pin!(forward);
    // A refusal before Cursor's answer began is the whole answer.
    let (resp, refused) = tokio::select! {
        resp = &mut forward => (resp, Some(refused)),
        got = &mut refused => match got {
            Ok(why) => return stream_error(refusal(&why)),
            // Every client frame went up: Cursor's answer is all that is left.
            Err(_) => (forward.await, None),
        },
    };
    resp.map(|body| {
        crate::http::boxed(Guarded {
            body,
            refused,
            done: false,
        })
    })
}

/// A `RunInference` of Cursor's on its way up: the first frame (judged already), then the
/// client's body, read frame by frame; `refused` learns why when a frame is refused.
struct Upward {
    judged: Option<Bytes>,
    peek: FramePeek,
    body: Incoming,
    refused: Option<tokio::sync::oneshot::Sender<String>>,
}

/// The frames that go up: each client frame once [`verdict_on`] finds nothing against it,
/// re-framed whole, so no byte of a frame goes up before the frame is read. A frame that
/// names our model or cannot be read sends its reason on `refused` and fails the body, which
/// resets the upstream stream: nothing more goes to Cursor.
fn inspected(upward: Upward) -> Body {
    let frames = futures_util::stream::unfold(upward, |mut u| async move {
        let refused = u.refused.take()?;
        let frame = match u.judged.take() {
            Some(first) => first,
            None => match u.peek.next(&mut u.body, false).await {
                Ok(Some(frame)) => match verdict_on(&frame, false) {
                    None => frame,
                    Some(why) => return Some(refuse(why, refused, u)),
                },
                Ok(None) => return None,
                // The client went away: the upstream stream ends with it.
                Err(e) if e.code == Code::Canceled => {
                    let gone: crate::http::BodyError = e.message.into();
                    return Some((Err(gone), u));
                }
                Err(e) => {
                    let why = format!(
                        "a RunInference message cursor-byok cannot read ({})",
                        e.message
                    );
                    return Some(refuse(why, refused, u));
                }
            },
        };
        match connect::FrameEncoder::new(Encoding::Identity).message(&frame) {
            Ok(bytes) => {
                u.refused = Some(refused);
                Some((Ok(http_body::Frame::data(bytes)), u))
            }
            Err(e) => Some(refuse(
                format!("a RunInference message cursor-byok cannot re-frame ({e})"),
                refused,
                u,
            )),
        }
    });
    crate::http::boxed(http_body_util::StreamBody::new(frames))
}

type Upgoing = (
    Result<http_body::Frame<Bytes>, crate::http::BodyError>,
    Upward,
);

/// Ends the upward stream on `why`, telling the answer's side first.
fn refuse(why: String, refused: tokio::sync::oneshot::Sender<String>, u: Upward) -> Upgoing {
    tracing::warn!(reason = %why, "RunInference refused mid-stream");
    let _ = refused.send(why.clone());
    (Err(why.into()), u)
}

/// Cursor's answer to a `RunInference` of its own, ended by our refusal (an end frame with the
/// error and its `ErrorDetails`) when a later client frame is refused: the client reads why,
/// not a reset.
struct Guarded {
    body: Body,
    refused: Option<tokio::sync::oneshot::Receiver<String>>,
    done: bool,
}

impl http_body::Body for Guarded {
    type Data = Bytes;
    type Error = crate::http::BodyError;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Option<Result<http_body::Frame<Bytes>, Self::Error>>> {
        use std::future::Future;
        use std::task::Poll;
        let this = &mut *self;
        if this.done {
            return Poll::Ready(None);
        }
        if let Some(rx) = this.refused.as_mut() {
            match std::pin::Pin::new(rx).poll(cx) {
                Poll::Ready(Ok(why)) => {
                    this.done = true;
                    let enc = connect::FrameEncoder::new(Encoding::Identity);
                    let end = connect::EndStream::from_error(refusal(&why));
                    return Poll::Ready(Some(Ok(http_body::Frame::data(end_frame(&enc, &end)))));
                }
                Poll::Ready(Err(_)) => this.refused = None,
                Poll::Pending => {}
            }
        }
        std::pin::Pin::new(&mut this.body).poll_frame(cx)
    }
}

/// `/aiserver.v1.InferenceService/Stream` (server-streaming): its one request message, an
/// `InferenceStreamRequest`, decides it like a `RunInference` frame.
pub(super) async fn stream(
    t: &AgentTransports,
    ctx: RequestContext,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let encoding = match readable_encoding(&parts.headers) {
        Ok(e) => e,
        Err(why) => return stream_error(refusal(&why)),
    };
    let raw = match read_bounded(body, t.inner.limits.max_frame_bytes).await {
        Ok(b) => b,
        Err(e) => return stream_error(e),
    };
    let mut decoder =
        connect::FrameDecoder::new(connect::StreamKind::Request, encoding, t.inner.limits);
    decoder.push(&raw);
    let mut models = Vec::new();
    let why = match decoder.next_frame() {
        Ok(Some(connect::Frame::Message(m))) => match stream_request_models(&m, &mut models) {
            Err(e) => Some(format!(
                "an inference Stream request cursor-byok cannot read ({e})"
            )),
            Ok(()) => models
                .iter()
                .find(|m| m.starts_with(MODEL_ID_PREFIX))
                .map(|m| format!("Cursor's local agent loop asked for model {m}, one of yours")),
        },
        _ => Some("an inference Stream request cursor-byok cannot read".to_string()),
    };
    if let Some(why) = why {
        tracing::warn!(reason = %why, "inference Stream refused");
        return stream_error(refusal(&why));
    }
    t.upstream()
        .forward(&ctx, Request::from_parts(parts, full(raw)))
        .await
}

/// The encoding of a stream we can read: Connect's binary codec, identity or gzip. Anything
/// else is refused (we could not tell whose it is), as a `Run` is.
fn readable_encoding(headers: &HeaderMap) -> Result<Encoding, String> {
    super::run::readable_encoding(headers, "a RunInference stream")
}

/// `RunInferenceSSE` / `RunInferencePoll` (HTTP/1.1): the body names the request id only; it
/// is noted so its appends are read as inference messages, then the request goes upstream
/// unchanged, unless that id was refused already.
pub(super) async fn open_stream(
    t: &AgentTransports,
    ctx: RequestContext,
    req: Request<Incoming>,
    poll: bool,
) -> Response<Body> {
    let (parts, body) = req.into_parts();
    let raw = match read_bounded(body, t.inner.limits.max_frame_bytes).await {
        Ok(b) => b,
        Err(e) => return stream_error(e),
    };
    let Some(request_id) = stream_request_id(&parts.headers, &raw, poll, t.inner.limits) else {
        return stream_error(refusal(
            "a RunInferenceSSE / RunInferencePoll request whose request id cursor-byok cannot read",
        ));
    };
    if let InferenceVerdict::Refused(why) = t.inner.inference.open(&request_id) {
        return stream_error(refusal(&why));
    }
    t.upstream()
        .forward(&ctx, Request::from_parts(parts, full(raw)))
        .await
}

/// The request id a SSE (`BidiRequestId`: 1) or Poll (`BidiPollRequest`: 1 → 1) body names.
/// The body may be one Connect frame (a server-stream request) or a bare message.
pub(super) fn stream_request_id(
    headers: &HeaderMap,
    raw: &Bytes,
    poll: bool,
    limits: connect::Limits,
) -> Option<String> {
    let named = headers
        .get("connect-content-encoding")
        .and_then(|v| v.to_str().ok());
    let encoding = Encoding::from_header(named).ok()?;
    let mut decoder = connect::FrameDecoder::new(connect::StreamKind::Request, encoding, limits);
    decoder.push(raw);
    let message = match decoder.next_frame() {
        Ok(Some(connect::Frame::Message(m))) => m,
        _ => raw.clone(),
    };
    let id_message = if poll {
        Bytes::from(each(&message, 1).ok()?.last()?.to_vec())
    } else {
        message
    };
    string(&id_message, 1).ok()?.filter(|id| !id.is_empty())
}

/// A `BidiAppend` (already read, `raw`) on a request id an inference stream opened: refused
/// when it names our model or cannot be read, else relayed. `None` when the request id is not
/// an inference stream's: the append is the agent transport's to read.
pub(super) async fn append(
    t: &AgentTransports,
    ctx: &RequestContext,
    parts: &http::request::Parts,
    encoding: Option<&str>,
    raw: &Bytes,
) -> Option<Response<Body>> {
    let payload = connect::decode_unary(raw.clone(), encoding, t.inner.limits).ok();
    let append = payload.and_then(|p| connect::decode_bidi_append_request(&p).ok())?;
    let request_id = append.request_id.as_ref()?.request_id.clone();
    let verdict = t.inner.inference.get(&request_id)?;
    let why = match verdict {
        InferenceVerdict::Refused(why) => Some(why),
        InferenceVerdict::Open => match connect::bidi_append_payload(&append) {
            Err(e) => Some(format!(
                "a RunInference append cursor-byok cannot read ({e})"
            )),
            Ok(message) => verdict_on(&message, append.append_seqno == 0),
        },
    };
    if let Some(why) = why {
        tracing::warn!(request_id, reason = %why, "RunInference append refused");
        t.inner.inference.refuse(&request_id, &why);
        return Some(error_response(&refusal(&why)));
    }
    let req = Request::from_parts(parts.clone(), full(raw.clone()));
    Some(t.upstream().forward(ctx, req).await)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prost::encoding::{encode_key, encode_varint, string as pstr, WireType as PW};

    fn len_field(number: u32, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        encode_key(number, PW::LengthDelimited, &mut out);
        encode_varint(value.len() as u64, &mut out);
        out.extend_from_slice(value);
        out
    }

    fn requested_model(id: &str) -> Vec<u8> {
        let mut m = Vec::new();
        pstr::encode(1, &id.to_owned(), &mut m);
        m
    }

    /// `RunInferenceClientMessage{run_request{conversation_id, requested_model{model_id}}}`.
    pub(crate) fn run_request(model: &str) -> Vec<u8> {
        let mut run = Vec::new();
        pstr::encode(1, &"conv-1".to_owned(), &mut run);
        run.extend(len_field(3, &requested_model(model)));
        len_field(1, &run)
    }

    fn invoke(model_id: &str, requested: &str) -> Vec<u8> {
        let mut request = len_field(1, b"");
        pstr::encode(5, &model_id.to_owned(), &mut request);
        request.extend(len_field(7, &requested_model(requested)));
        let mut inv = Vec::new();
        pstr::encode(1, &"inv-1".to_owned(), &mut inv);
        inv.extend(len_field(2, &request));
        len_field(2, &inv)
    }

    #[test]
    fn model_ids_are_read_wherever_they_are_named() {
        let n = named_models(&run_request("byok-gpt")).unwrap();
        assert!(n.run_request);
        assert_eq!(n.models, ["byok-gpt"]);
        let n = named_models(&invoke("composer-2", "byok-x")).unwrap();
        assert!(!n.run_request);
        assert_eq!(n.models, ["composer-2", "byok-x"]);
        // A subagent override naming ours.
        let over = len_field(2, &requested_model("byok-sub"));
        let mut run = requested_model("x");
        run.extend(len_field(8, &over));
        run.extend(len_field(7, &requested_model("byok-sel")));
        let n = named_models(&len_field(1, &run)).unwrap();
        assert_eq!(n.models, ["byok-sel", "byok-sub"]);
    }

    #[test]
    fn verdicts() {
        assert_eq!(verdict_on(&run_request("composer-2"), true), None);
        assert!(verdict_on(&run_request("byok-gpt"), true)
            .unwrap()
            .contains("byok-gpt"));
        assert!(verdict_on(&run_request("byok-unconfigured:high"), true).is_some());
        assert!(verdict_on(&invoke("a", "byok-b"), false).is_some());
        assert_eq!(verdict_on(&invoke("a", "b"), false), None);
        // Not the run request first; bytes that do not scan; a model id that is not UTF-8.
        assert!(verdict_on(&invoke("a", "b"), true).is_some());
        assert!(verdict_on(b"\x0a\x09ab", false).is_some());
        let bad = len_field(1, &len_field(3, &len_field(1, b"\xff")));
        assert!(verdict_on(&bad, false).unwrap().contains("UTF-8"));
    }

    #[test]
    fn the_refusal_carries_error_details() {
        let e = refusal("why");
        assert_eq!(e.code, Code::FailedPrecondition);
        let details = e.decode_error_details().unwrap().expect("details");
        assert_eq!(details.details.unwrap().is_retryable, Some(false));
    }

    #[test]
    fn stream_ids_from_framed_and_bare_bodies() {
        let limits = connect::Limits::default();
        let mut id = Vec::new();
        pstr::encode(1, &"req-1".to_owned(), &mut id);
        let bare = Bytes::from(id.clone());
        let h = HeaderMap::new();
        assert_eq!(
            stream_request_id(&h, &bare, false, limits).as_deref(),
            Some("req-1")
        );
        let framed = connect::encode_frame(0, &id).unwrap();
        assert_eq!(
            stream_request_id(&h, &framed, false, limits).as_deref(),
            Some("req-1")
        );
        let poll = Bytes::from(len_field(1, &id));
        assert_eq!(
            stream_request_id(&h, &poll, true, limits).as_deref(),
            Some("req-1")
        );
        assert_eq!(stream_request_id(&h, &Bytes::new(), false, limits), None);
    }
}
