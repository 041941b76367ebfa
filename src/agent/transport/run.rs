//! HTTP/2 bidi `/agent.v1.AgentService/Run`: client frames in, server frames out, both at once.

use http::{HeaderMap, Request, Response};
use hyper::body::Incoming;
use prost::Message;
use tracing::{debug, Instrument};

use super::body::{
    end_frame, error_response, replay, stream_error, streaming_response, FramePeek, RunBody,
};
use super::caller::{request_id, Caller, ClientMessage};
use super::face::{unreadable, AgentTransports};
use super::routing::{never_decided, with_pinned_model, Decision, UNDECIDED_WAIT};
use crate::agent::{RunError, RunRequest};
use crate::connect::{Code, Encoding, EndStream, FrameEncoder};
use crate::http::{boxed, full, Body, RequestContext};
use crate::proto::agent::v1 as pb;

pub(super) async fn handle(
    t: &AgentTransports,
    ctx: RequestContext,
    req: Request<Incoming>,
) -> Response<Body> {
    let (parts, mut body) = req.into_parts();
    // What we cannot read may be the user's: it is refused, never passed on unread.
    let encoding = match readable_encoding(&parts.headers, "a Run") {
        Ok(e) => e,
        Err(why) => return stream_error(RunError::BadClientMessage(why).to_connect()),
    };
    let request_id = request_id(&parts.headers)
        .unwrap_or_else(|| format!("byok-{:016x}", rand::random::<u64>()));
    let mut peek = FramePeek::new(encoding, t.inner.limits);
    // The first frame decides whose run this is: wait for it as long as the client keeps the
    // stream open (bounded). A slow one is never a reason to send the run to Cursor.
    let first = match tokio::time::timeout(UNDECIDED_WAIT, peek.next(&mut body, true)).await {
        Ok(Ok(Some(frame))) => frame,
        // The client closed its side without a frame: nothing of the user's to route.
        Ok(Ok(None)) => {
            let req = Request::from_parts(parts, replay(peek.consumed.freeze(), body));
            return t.upstream().forward(&ctx, req).await;
        }
        Err(_) => return stream_error(never_decided("the run's first message did not come")),
        Ok(Err(e)) => return error_response(&unreadable(e)),
    };
    let message = match pb::AgentClientMessage::decode(first.clone()) {
        Ok(m) => m,
        Err(e) => {
            let why =
                format!("the run's first message does not decode as an AgentClientMessage ({e})");
            return stream_error(RunError::BadClientMessage(why).to_connect());
        }
    };
    let caller = Caller::of(&parts.headers);
    match t.decide(&request_id, &message, &caller.parent) {
        Err(e) => stream_error(e),
        Ok(Decision::Relay) => {
            let req = Request::from_parts(parts, replay(peek.consumed.freeze(), body));
            t.upstream().forward(&ctx, req).await
        }
        Ok(decision @ Decision::Ours { .. }) => {
            let span = tracing::info_span!("run_h2", request_id = %request_id);
            let start = RunOpening {
                first: ClientMessage {
                    message,
                    wire: first,
                },
                request_id,
                client_version: crate::status::client_version(&parts.headers),
                caller,
            };
            serve_ours(t, start, &decision, peek, body)
                .instrument(span)
                .await
        }
    }
}

/// The encoding of a bidi stream whose frames we read (`what`: "a Run", …). Only Connect's
/// binary codec carries frames we can read; anything else (JSON codec, a wrong type, an
/// encoding we cannot read) cannot be judged, so it is refused with why.
pub(super) fn readable_encoding(headers: &HeaderMap, what: &str) -> Result<Encoding, String> {
    let text = |name| {
        headers
            .get(name)
            .map(|v| String::from_utf8_lossy(v.as_bytes()))
    };
    let content_type = text(http::header::CONTENT_TYPE.as_str()).unwrap_or_default();
    if !content_type.eq_ignore_ascii_case("application/connect+proto") {
        debug!(%content_type, "Run with a content type we do not decode: refused");
        return Err(format!(
            "{what} with content type `{content_type}`, which this cursor-byok does not read \
             (it reads application/connect+proto)"
        ));
    }
    let encoding = text("connect-content-encoding");
    Encoding::from_header(encoding.as_deref()).map_err(|_| {
        format!(
            "{what} with connect-content-encoding `{}`, which this cursor-byok does not read",
            encoding.unwrap_or_default()
        )
    })
}

/// What a `Run` of ours starts from: its first message, and what its request said.
struct RunOpening {
    first: ClientMessage,
    request_id: String,
    client_version: Option<String>,
    caller: Caller,
}

async fn serve_ours(
    t: &AgentTransports,
    start: RunOpening,
    decision: &Decision,
    mut peek: FramePeek,
    mut body: Incoming,
) -> Response<Body> {
    use pb::agent_client_message::Message as In;
    let RunOpening {
        first,
        request_id,
        client_version: version,
        caller,
    } = start;
    let enc = FrameEncoder::new(Encoding::Identity);
    let run_request = match first.message.message {
        Some(In::RunRequest(r)) => caller.run_request(RunRequest::from_client_message(
            with_pinned_model(r, decision),
            &first.wire,
        )),
        _ => {
            // A prewarm for one of our models: nothing to warm beyond our pooled client.
            debug!("prewarm answered locally");
            return streaming_response(full(end_frame(&enc, &EndStream::ok())));
        }
    };
    let handle = t.agent().start_run_on(run_request, request_id, "Run");
    let input = handle.input.clone();
    let failer = handle.failer();
    if let Some(reason) = t.inspect_client(&first.wire, version.as_deref()) {
        failer.fail(reason);
    }
    let capture = t.agent().status().capture().cloned();
    let t = t.clone();
    // The client's later frames feed the run; the task ends with the request body.
    tokio::spawn(
        async move {
            loop {
                match peek.next(&mut body, false).await {
                    Ok(Some(frame)) => {
                        let m = match pb::AgentClientMessage::decode(frame.clone()) {
                            Ok(m) => m,
                            Err(e) => {
                                return failer.fail(format!("undecodable AgentClientMessage: {e}"))
                            }
                        };
                        if let Some(reason) = t.inspect_client(&frame, version.as_deref()) {
                            return failer.fail(reason);
                        }
                        if input.send(Box::new(m)).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) => return,
                    Err(e) if e.code == Code::Canceled => return,
                    Err(e) => return failer.fail(e.message),
                }
            }
        }
        .in_current_span(),
    );
    let failer = handle.failer();
    let body = RunBody::new(handle.output, enc, failer).capturing(capture);
    streaming_response(boxed(body))
}
