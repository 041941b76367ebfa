//! Cmd+K's HTTP side: `CmdKService`'s streams (one request envelope in, response envelopes and
//! an end-stream envelope out), its rerank calls and `AiService/ReportCmdKFate` (unary).
//!
//! A call on one of the user's models (or on Cursor's `"default"` when `[cmd_k] model` is
//! set) is served by `agent::cmdk`; a call on Cursor's model goes upstream byte for byte. A
//! call this build cannot read while the user has models of their own is refused with an
//! error saying why, never relayed: it may be the user's.

use bytes::Bytes;
use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use prost::Message;

use super::body::{error_response, read_bounded, stream_error, streaming_response};
use super::face::AgentTransports;
use crate::agent::cmdk::{self, CmdKCall, Resolved, Step, Whose};
use crate::connect::{
    ConnectError, Encoding, EndStream, Frame, FrameDecoder, FrameEncoder, StreamKind,
};
use crate::http::{boxed, full, Body, RequestContext};
use crate::proto::aiserver::v1 as pb;

/// Which Cmd+K call a request is (the router's decision, from its path).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CmdKRpc {
    /// `StreamCmdK`: the editor's inline edit.
    StreamCmdK,
    /// `StreamHypermode`: the same, on Cursor's "hyper mode".
    StreamHypermode,
    /// `StreamTerminalCmdK`: the terminal's prompt bar.
    StreamTerminalCmdK,
    /// `RerankCmdKContext` (unary).
    RerankCmdK,
    /// `RerankTerminalCmdKContext` (unary).
    RerankTerminalCmdK,
    /// `AiService/ReportCmdKFate` (unary): accepted, rejected…
    ReportFate,
}

pub(crate) const STREAM_CMD_K_PATH: &str = "/aiserver.v1.CmdKService/StreamCmdK";
pub(crate) const STREAM_HYPERMODE_PATH: &str = "/aiserver.v1.CmdKService/StreamHypermode";
pub(crate) const STREAM_TERMINAL_CMD_K_PATH: &str = "/aiserver.v1.CmdKService/StreamTerminalCmdK";
pub(crate) const RERANK_CMD_K_PATH: &str = "/aiserver.v1.CmdKService/RerankCmdKContext";
pub(crate) const RERANK_TERMINAL_CMD_K_PATH: &str =
    "/aiserver.v1.CmdKService/RerankTerminalCmdKContext";
pub(crate) const REPORT_CMD_K_FATE_PATH: &str = "/aiserver.v1.AiService/ReportCmdKFate";

/// The Cmd+K call `path` is, if any (exact matches only).
pub fn classify(path: &str) -> Option<CmdKRpc> {
    Some(match path {
        STREAM_CMD_K_PATH => CmdKRpc::StreamCmdK,
        STREAM_HYPERMODE_PATH => CmdKRpc::StreamHypermode,
        STREAM_TERMINAL_CMD_K_PATH => CmdKRpc::StreamTerminalCmdK,
        RERANK_CMD_K_PATH => CmdKRpc::RerankCmdK,
        RERANK_TERMINAL_CMD_K_PATH => CmdKRpc::RerankTerminalCmdK,
        REPORT_CMD_K_FATE_PATH => CmdKRpc::ReportFate,
        _ => return None,
    })
}

pub(super) async fn handle(
    t: &AgentTransports,
    rpc: CmdKRpc,
    ctx: RequestContext,
    req: Request<Incoming>,
) -> Response<Body> {
    if !cmdk::could_be_ours(t.agent().config()) {
        // No model of the user's: nothing here could be theirs.
        return t.upstream().forward(&ctx, req.map(boxed)).await;
    }
    let (parts, body) = req.into_parts();
    // Room for the largest message, its envelope and a gzip that did not shrink it.
    let max = t.inner.limits.max_frame_bytes.saturating_add(64);
    let raw = match read_bounded(body, max).await {
        Ok(raw) => raw,
        Err(e) => {
            return refuse(
                rpc,
                &cmdk::refused(&format!("its body is unreadable ({})", e.message)),
            )
        }
    };
    let is_stream = matches!(
        rpc,
        CmdKRpc::StreamCmdK | CmdKRpc::StreamHypermode | CmdKRpc::StreamTerminalCmdK
    );
    let decoded = if is_stream {
        stream_message(t, &parts.headers, &raw)
    } else {
        unary_message(t, &parts.headers, &raw)
    };
    let answer = match decoded {
        Ok(message) if is_stream => stream(t, rpc, &parts.headers, &message),
        Ok(message) if rpc == CmdKRpc::ReportFate => fate(t, &message),
        Ok(message) => rerank(t, rpc, &parts.headers, &message),
        // Only an id and a verdict: answered here rather than guessed at.
        Err(_) if rpc == CmdKRpc::ReportFate => Answer::Here(unary_ok(Bytes::new())),
        Err(why) => Answer::Here(refuse(rpc, &cmdk::refused(&why))),
    };
    match answer {
        Answer::Here(resp) => resp,
        Answer::Cursor => {
            let req = Request::from_parts(parts, full(raw));
            t.upstream().forward(&ctx, req).await
        }
    }
}

/// What a readable Cmd+K call gets.
enum Answer {
    Here(Response<Body>),
    Cursor,
}

/// The error a call gets in its own framing: an end-stream frame on a stream, a JSON body on
/// a unary call.
fn refuse(rpc: CmdKRpc, e: &ConnectError) -> Response<Body> {
    tracing::warn!(?rpc, "Cmd+K refused: {}", e.message);
    match rpc {
        CmdKRpc::StreamCmdK | CmdKRpc::StreamHypermode | CmdKRpc::StreamTerminalCmdK => {
            stream_error(e.clone())
        }
        _ => error_response(e),
    }
}

/// The one message of a stream request: `application/connect+proto`, one envelope (gzip
/// when `connect-content-encoding` says so).
fn stream_message(t: &AgentTransports, headers: &HeaderMap, raw: &Bytes) -> Result<Bytes, String> {
    let content_type = header(headers, http::header::CONTENT_TYPE.as_str());
    if !content_type.eq_ignore_ascii_case("application/connect+proto") {
        return Err(format!(
            "it is in a content type cursor-byok does not read (`{content_type}`)"
        ));
    }
    let encoding = Encoding::from_header(
        Some(header(headers, "connect-content-encoding")).filter(|s| !s.is_empty()),
    )
    .map_err(|e| format!("its encoding is not one cursor-byok reads ({e})"))?;
    let mut decoder = FrameDecoder::new(StreamKind::Request, encoding, t.inner.limits);
    decoder.feed(raw.clone());
    let first = match decoder.next_frame() {
        Ok(Some(Frame::Message(m))) => m,
        Ok(_) => return Err("its request holds no message".into()),
        Err(e) => return Err(format!("its request envelope is unreadable ({e})")),
    };
    match decoder.next_frame() {
        Ok(None) if decoder.buffered_len() == 0 => Ok(first),
        _ => Err("its request holds more than one message".into()),
    }
}

/// A unary body: raw protobuf (gzip when `content-encoding` says so).
fn unary_message(t: &AgentTransports, headers: &HeaderMap, raw: &Bytes) -> Result<Bytes, String> {
    let content_type = header(headers, http::header::CONTENT_TYPE.as_str());
    if !content_type.eq_ignore_ascii_case("application/proto") {
        return Err(format!(
            "it is in a content type cursor-byok does not read (`{content_type}`)"
        ));
    }
    let encoding = Some(header(headers, "content-encoding")).filter(|s| !s.is_empty());
    crate::connect::decode_unary(raw.clone(), encoding, t.inner.limits)
        .map_err(|e| format!("its body is unreadable ({e})"))
}

fn header<'a>(headers: &'a HeaderMap, name: &str) -> &'a str {
    headers
        .get(name)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
}

/// What a Cmd+K stream request decodes to.
fn decode_call(rpc: CmdKRpc, message: &Bytes) -> Result<CmdKCall, prost::DecodeError> {
    Ok(match rpc {
        CmdKRpc::StreamHypermode => {
            CmdKCall::from_hypermode(pb::StreamHypermodeRequest::decode(message.clone())?)
        }
        CmdKRpc::StreamTerminalCmdK => CmdKCall::Terminal(Box::new(
            pb::StreamTerminalCmdKRequest::decode(message.clone())?,
        )),
        _ => CmdKCall::Editor(Box::new(pb::StreamCmdKRequest::decode(message.clone())?)),
    })
}

const fn type_name(rpc: CmdKRpc) -> &'static str {
    match rpc {
        CmdKRpc::StreamCmdK => "aiserver.v1.StreamCmdKRequest",
        CmdKRpc::StreamHypermode => "aiserver.v1.StreamHypermodeRequest",
        CmdKRpc::StreamTerminalCmdK => "aiserver.v1.StreamTerminalCmdKRequest",
        CmdKRpc::RerankCmdK => "aiserver.v1.RerankCmdKContextRequest",
        CmdKRpc::RerankTerminalCmdK => "aiserver.v1.RerankTerminalCmdKContextRequest",
        CmdKRpc::ReportFate => "aiserver.v1.ReportCmdKFateRequest",
    }
}

/// What this build does not know in a call goes to the status registry.
fn inspect(t: &AgentTransports, rpc: CmdKRpc, headers: &HeaderMap, message: &[u8]) {
    let report = crate::proto::inspect::schema().check(type_name(rpc), message);
    let version = crate::status::client_version(headers);
    t.agent()
        .status()
        .unknown_schema("Cmd+K", version.as_deref(), &report);
}

fn stream(t: &AgentTransports, rpc: CmdKRpc, headers: &HeaderMap, message: &Bytes) -> Answer {
    let call = match decode_call(rpc, message) {
        Ok(c) => c,
        Err(e) => {
            return Answer::Here(refuse(
                rpc,
                &cmdk::refused(&format!("its request does not decode ({e})")),
            ))
        }
    };
    inspect(t, rpc, headers, message);
    let model_id = match t.cmdk().whose(call.model_name()) {
        Err(e) => return Answer::Here(refuse(rpc, &e)),
        Ok(Whose::Cursor) => return Answer::Cursor,
        Ok(Whose::Ours { model_id }) => model_id,
    };
    let request_id = header(headers, "x-request-id").to_string();
    let request_id = if request_id.is_empty() {
        format!("byok-cmdk-{:016x}", rand::random::<u64>())
    } else {
        request_id
    };
    tracing::info!(?rpc, model = %model_id, request_id, "Cmd+K served on the user's model");
    let rx = t
        .cmdk()
        .start(call, &model_id, &session_key(headers), &request_id);
    Answer::Here(streaming_response(steps_body(rx)))
}

/// The stream's steps as Connect frames; the body ends after the end frame. Dropping it (the
/// client closed the stream) drops the receiver, which ends the provider call.
fn steps_body(rx: tokio::sync::mpsc::Receiver<Step>) -> Body {
    use futures_util::StreamExt;
    let enc = FrameEncoder::new(Encoding::Identity);
    let frames = futures_util::stream::unfold(Some(rx), move |rx| async move {
        let mut rx = rx?;
        let bytes = match rx.recv().await {
            Some(Step::Frame(f)) => match enc.message(&f.encode()) {
                Ok(b) => return Some((b, Some(rx))),
                Err(e) => end_bytes(
                    &enc,
                    EndStream::from_error(ConnectError::new(e.code(), e.to_string())),
                ),
            },
            Some(Step::End(end)) => end_bytes(&enc, end),
            None => end_bytes(
                &enc,
                EndStream::from_error(ConnectError::new(
                    crate::connect::Code::Internal,
                    "cursor-byok: the Cmd+K stopped without ending its stream",
                )),
            ),
        };
        Some((bytes, None))
    });
    let body = http_body_util::StreamBody::new(
        frames.map(|b| Ok::<_, crate::http::BodyError>(http_body::Frame::data(b))),
    );
    boxed(body)
}

fn end_bytes(enc: &FrameEncoder, end: EndStream) -> Bytes {
    super::body::end_frame(enc, &end)
}

/// The client session items are kept for: its Cursor credential, hashed (never kept as is).
fn session_key(headers: &HeaderMap) -> String {
    use sha2::Digest;
    let auth = header(headers, http::header::AUTHORIZATION.as_str());
    let digest = sha2::Sha256::digest(auth.as_bytes());
    digest[..8].iter().map(|b| format!("{b:02x}")).collect()
}

/// Rerank on a model of ours: keep and acknowledge the items (or ask for those whose hashes
/// are not held); nothing is ranked, every item goes to the prompt.
fn rerank(t: &AgentTransports, rpc: CmdKRpc, headers: &HeaderMap, message: &Bytes) -> Answer {
    let (items, model) = match rpc {
        CmdKRpc::RerankTerminalCmdK => {
            match pb::RerankTerminalCmdKContextRequest::decode(message.clone()) {
                Ok(r) => (
                    r.context_items,
                    r.cmd_k_options.and_then(|o| o.model_details),
                ),
                Err(e) => {
                    return Answer::Here(refuse(
                        rpc,
                        &cmdk::refused(&format!("its request does not decode ({e})")),
                    ))
                }
            }
        }
        _ => match pb::RerankCmdKContextRequest::decode(message.clone()) {
            Ok(r) => (
                r.context_items,
                r.cmd_k_options.and_then(|o| o.model_details),
            ),
            Err(e) => {
                return Answer::Here(refuse(
                    rpc,
                    &cmdk::refused(&format!("its request does not decode ({e})")),
                ))
            }
        },
    };
    inspect(t, rpc, headers, message);
    match t
        .cmdk()
        .whose(model.as_ref().and_then(|m| m.model_name.as_deref()))
    {
        Err(e) => return Answer::Here(refuse(rpc, &e)),
        Ok(Whose::Cursor) => return Answer::Cursor,
        Ok(Whose::Ours { .. }) => {}
    }
    let (update, missing, did_call) = match t.cmdk().resolve(&session_key(headers), &items) {
        Resolved::Missing(hashes) => (
            None,
            Some(pb::MissingContextItems {
                missing_context_item_hashes: hashes,
            }),
            false,
        ),
        Resolved::Items { statuses, .. } => (
            Some(pb::ContextStatusUpdate {
                context_item_statuses: statuses,
            }),
            None,
            true,
        ),
    };
    let body = match rpc {
        CmdKRpc::RerankTerminalCmdK => {
            use pb::rerank_terminal_cmd_k_context_response::Response as R;
            pb::RerankTerminalCmdKContextResponse {
                response: update
                    .map(R::ContextStatusUpdate)
                    .or(missing.map(R::MissingContextItems)),
            }
            .encode_to_vec()
        }
        _ => {
            use pb::rerank_cmd_k_context_response::Response as R;
            pb::RerankCmdKContextResponse {
                response: update
                    .map(R::ContextStatusUpdate)
                    .or(missing.map(R::MissingContextItems)),
                did_call: Some(did_call),
            }
            .encode_to_vec()
        }
    };
    Answer::Here(unary_ok(Bytes::from(body)))
}

/// `ReportCmdKFate` for a Cmd+K served here is answered here (an empty response).
fn fate(t: &AgentTransports, message: &Bytes) -> Answer {
    match pb::ReportCmdKFateRequest::decode(message.clone()) {
        Ok(r) if !t.cmdk().served(&r.request_id) => Answer::Cursor,
        _ => Answer::Here(unary_ok(Bytes::new())),
    }
}

fn unary_ok(body: Bytes) -> Response<Body> {
    let mut resp = Response::new(full(body));
    resp.headers_mut().insert(
        http::header::CONTENT_TYPE,
        http::HeaderValue::from_static("application/proto"),
    );
    resp
}
